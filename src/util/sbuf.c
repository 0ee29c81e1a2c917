/* The printers' growing string (sbuf.h). */
#include "util/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kiln_sbuf_reserve(kiln_sbuf *b, size_t extra)
{
    if (b->oom) return false;
    if (b->s && b->n + extra < b->cap) return true;
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->n + extra + 1) cap *= 2;
    char *grown = realloc(b->s, cap);
    if (!grown) return b->oom = true, false;
    if (!b->s) grown[0] = 0;
    b->s = grown;
    b->cap = cap;
    return true;
}

/* kiln_sbuf_reserve's common case inline: the room is there. */
static inline bool room(kiln_sbuf *b, size_t extra) { return (b->s && b->n + extra < b->cap) || kiln_sbuf_reserve(b, extra); }

/* The subset of printf the printers use, without vsnprintf; false, with nothing kept, on any other
 * conversion. True also when memory ran out (oom set). */
static bool printf_fast(kiln_sbuf *b, const char *fmt, va_list ap)
{
    size_t n0 = b->n;
    for (const char *p = fmt; *p;) {
        const char *q = p;
        while (*q && *q != '%') q++;
        if (q > p) {
            if (!room(b, (size_t)(q - p))) return true;
            memcpy(b->s + b->n, p, (size_t)(q - p));
            b->n += (size_t)(q - p);
        }
        if (!*q) break;
        char num[16];
        const char *t = num;
        size_t len = 0;
        switch (q[1]) {
        case 's':
            t = va_arg(ap, const char *);
            if (!t) t = "(null)";
            len = strlen(t), p = q + 2;
            break;
        case 'c': num[0] = (char)va_arg(ap, int), len = 1, p = q + 2; break;
        case '%': num[0] = '%', len = 1, p = q + 2; break;
        case 'u': case 'd': case 'X': {
            unsigned v;
            bool neg = false;
            if (q[1] == 'd') {
                int i = va_arg(ap, int);
                neg = i < 0, v = neg ? 0u - (unsigned)i : (unsigned)i;
            } else {
                v = va_arg(ap, unsigned);
            }
            unsigned base = q[1] == 'X' ? 16 : 10;
            char rev[12];
            int k = 0;
            do rev[k++] = "0123456789ABCDEF"[v % base], v /= base; while (v);
            if (neg) num[len++] = '-';
            while (k) num[len++] = rev[--k];
            p = q + 2;
            break;
        }
        case '0':
            if (q[2] == '8' && q[3] == 'X') {
                unsigned v = va_arg(ap, unsigned);
                for (int k = 0; k < 8; k++) num[k] = "0123456789ABCDEF"[(v >> (28 - 4 * k)) & 15];
                len = 8, p = q + 4;
                break;
            }
            b->n = n0;
            return false;
        default: b->n = n0; return false;
        }
        if (!room(b, len)) return true;
        memcpy(b->s + b->n, t, len);
        b->n += len;
    }
    if (room(b, 0)) b->s[b->n] = 0;
    return true;
}

void kiln_sbuf_printf(kiln_sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    bool done = printf_fast(b, fmt, ap);
    va_end(ap);
    if (done) return;
    for (;;) {
        va_start(ap, fmt);
        int len = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (len < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->n + (size_t)len < b->cap) {
            b->n += (size_t)len;
            return;
        }
        if (!kiln_sbuf_reserve(b, (size_t)len)) return;
    }
}
