/* Error sink setters (see err.h). Must stay free of any kiln layer above util. */
#include "util/err.h"

#include <stdio.h>

kiln_status kiln_err_vset(kiln_err *e, kiln_status s, const char *fmt, va_list ap)
{
    if (e) vsnprintf(e->text, sizeof e->text, fmt, ap);
    return s;
}

kiln_status kiln_err_set(kiln_err *e, kiln_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln_err_vset(e, s, fmt, ap);
    va_end(ap);
    return s;
}
