/* Payload building and reading for backends' cache entries: a growing byte buffer and a bounded
 * reader whose every get fails (and stays failed) past the end, so a loader checks once at the
 * end instead of before each field. Must not allocate on read. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct kiln_blob_w {
    unsigned char *p;   /* bytes */
    size_t         n;   /* used */
    size_t         cap; /* allocated */
    bool           oom; /* an append failed: the blob is unusable */
} kiln_blob_w;

static inline void kiln_blob_put(kiln_blob_w *w, const void *src, size_t n)
{
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t cap = (w->cap + n) * 2;
        unsigned char *g = realloc(w->p, cap);
        if (!g) {
            w->oom = true;
            return;
        }
        w->p = g;
        w->cap = cap;
    }
    if (n) memcpy(w->p + w->n, src, n);
    w->n += n;
}
static inline void kiln_blob_u32(kiln_blob_w *w, uint32_t v) { kiln_blob_put(w, &v, sizeof v); }
static inline void kiln_blob_u64(kiln_blob_w *w, uint64_t v) { kiln_blob_put(w, &v, sizeof v); }
/* A length-prefixed byte string. */
static inline void kiln_blob_bytes(kiln_blob_w *w, const void *src, size_t n)
{
    kiln_blob_u64(w, n);
    kiln_blob_put(w, src, n);
}

typedef struct kiln_blob_r {
    const unsigned char *p; /* bytes */
    size_t               n; /* size */
    size_t               at;/* next byte */
    bool                 bad; /* a read went past the end */
} kiln_blob_r;

static inline const void *kiln_blob_get(kiln_blob_r *r, size_t n)
{
    if (r->bad || n > r->n - r->at) {
        r->bad = true;
        return NULL;
    }
    const void *q = r->p + r->at;
    r->at += n;
    return q;
}
static inline uint32_t kiln_blob_get_u32(kiln_blob_r *r)
{
    uint32_t v = 0;
    const void *q = kiln_blob_get(r, sizeof v);
    if (q) memcpy(&v, q, sizeof v);
    return v;
}
static inline uint64_t kiln_blob_get_u64(kiln_blob_r *r)
{
    uint64_t v = 0;
    const void *q = kiln_blob_get(r, sizeof v);
    if (q) memcpy(&v, q, sizeof v);
    return v;
}
/* A length-prefixed byte string: a pointer into the payload (NULL when bad), its length in *n. */
static inline const void *kiln_blob_get_bytes(kiln_blob_r *r, size_t *n)
{
    uint64_t len = kiln_blob_get_u64(r);
    if (r->bad || len > r->n - r->at) {
        r->bad = true;
        *n = 0;
        return NULL;
    }
    *n = (size_t)len;
    return kiln_blob_get(r, (size_t)len);
}
