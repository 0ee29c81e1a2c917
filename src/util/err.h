/* The one low-level home of error reporting: an error sink holding the detail of the last failure
 * of each thread that uses it, and printf-style setters that return the status, for `return
 * kiln_err_set(e, KILN_ERR_X, "...")`. graph, fuse and sched all report through it, so no layer
 * reaches up: a kiln_ctx begins with its sink (sched/ctx.h asserts it), and kiln_err_of gives that
 * sink from an opaque context. Texts are per thread, so plans of one context can fail on several
 * threads at once and each thread reads its own message. Must not depend on anything but kiln.h. */
#pragma once

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_ERR_CAP 4096 /* bytes of an error text, NUL included */

typedef struct kiln_err_slot kiln_err_slot; /* one thread's text (err.c) */

typedef struct kiln_err {
    pthread_mutex_t mu;       /* guards the slot list */
    kiln_err_slot  *slots;    /* one per thread that set an error here */
    uint64_t        serial;   /* process-unique, so a thread's cached slot never outlives its sink */
    char            oom[KILN_ERR_CAP]; /* the text when a slot could not be allocated (shared) */
} kiln_err;

/* The sink of a context (NULL for NULL). Valid because struct kiln_ctx starts with a kiln_err. */
static inline kiln_err *kiln_err_of(kiln_ctx *ctx) { return (kiln_err *)(void *)ctx; }

/* Sets up / frees a sink (its slots). */
void kiln_err_init(kiln_err *e);
void kiln_err_destroy(kiln_err *e);
/* Sets the calling thread's text (printf-style, truncated) when e is not NULL; returns s. */
kiln_status kiln_err_set(kiln_err *e, kiln_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
kiln_status kiln_err_vset(kiln_err *e, kiln_status s, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
/* The calling thread's text; "" when it set none. Valid until this thread's next set on e. */
const char *kiln_err_text(kiln_err *e);
/* Clears the calling thread's text (cheap when it has none: no allocation). */
void kiln_err_clear(kiln_err *e);
