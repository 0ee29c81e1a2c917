/* The one low-level home of error reporting: an error sink (a fixed buffer holding the detail of
 * the last failure) and printf-style setters that return the status, for `return kiln_err_set(e,
 * KILN_ERR_X, "...")`. graph, fuse and sched all report through it, so no layer reaches up:
 * a kiln_ctx begins with its sink (sched/ctx.h asserts it), and kiln_err_of gives that sink
 * from an opaque context. Must not depend on anything but kiln.h. */
#pragma once

#include <stdarg.h>

#include "kiln/kiln.h"

#define KILN_ERR_CAP 4096 /* bytes of an error text, NUL included */

typedef struct kiln_err {
    char text[KILN_ERR_CAP]; /* detail of the last failure; "" when none */
} kiln_err;

/* The sink of a context (NULL for NULL). Valid because struct kiln_ctx starts with a kiln_err. */
static inline kiln_err *kiln_err_of(kiln_ctx *ctx) { return (kiln_err *)(void *)ctx; }

/* Sets e's text (printf-style, truncated) when e is not NULL; returns s. */
kiln_status kiln_err_set(kiln_err *e, kiln_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
kiln_status kiln_err_vset(kiln_err *e, kiln_status s, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
/* Clears the text. */
static inline void kiln_err_clear(kiln_err *e)
{
    if (e) e->text[0] = 0;
}
