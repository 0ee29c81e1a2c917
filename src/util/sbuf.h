/* A growing NUL-terminated string for kiln's printers (PTX, GLSL, .kg text, plan explain). After a
 * failed allocation `oom` stays set and appends do nothing: the printer reports out of memory. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct kiln_sbuf {
    char  *s;   /* text, NUL-terminated once anything was appended or reserved (NULL before) */
    size_t n;   /* length, without the NUL */
    size_t cap; /* bytes allocated */
    bool   oom; /* an allocation failed; the text is incomplete */
} kiln_sbuf;

/* Room for `extra` more bytes and the NUL; false (oom set) when memory runs out. */
bool kiln_sbuf_reserve(kiln_sbuf *b, size_t extra);
/* Appends printf-formatted text. The subset %s %u %d %c %X %08X %% is formatted here (printers
 * spend most of their time in it); any other conversion goes through vsnprintf. */
void kiln_sbuf_printf(kiln_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
