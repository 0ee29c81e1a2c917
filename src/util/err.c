/* Error sink (see err.h): a short list of per-thread texts under a mutex, with the last slot a
 * thread used cached in thread-local storage (keyed by the sink's serial), so clearing on every
 * successful run takes no lock. Must stay free of any kiln layer above util. */
#include "util/err.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

struct kiln_err_slot {
    pthread_t      tid;                /* owner thread (a later thread with the same id inherits it) */
    kiln_err_slot *next;               /* list */
    char           text[KILN_ERR_CAP]; /* its last failure; "" when none */
};

static atomic_uint_fast64_t next_serial = 1;

static _Thread_local struct {
    uint64_t       serial; /* sink the slot belongs to */
    kiln_err_slot *slot;   /* this thread's slot there */
} cached;

void kiln_err_init(kiln_err *e)
{
    pthread_mutex_init(&e->mu, NULL);
    e->slots = NULL;
    e->serial = atomic_fetch_add(&next_serial, 1);
    e->oom[0] = 0;
}

void kiln_err_destroy(kiln_err *e)
{
    if (!e) return;
    for (kiln_err_slot *s = e->slots, *n; s; s = n) {
        n = s->next;
        free(s);
    }
    e->slots = NULL;
    pthread_mutex_destroy(&e->mu);
}

/* This thread's slot, made when `make` (NULL when there is none and make is false, or on OOM). */
static kiln_err_slot *slot_of(kiln_err *e, int make)
{
    if (cached.serial == e->serial && (cached.slot || !make)) return cached.slot; /* NULL: none made yet */
    pthread_t me = pthread_self();
    pthread_mutex_lock(&e->mu);
    kiln_err_slot *s = e->slots;
    while (s && !pthread_equal(s->tid, me)) s = s->next;
    if (!s && make && (s = malloc(sizeof *s))) {
        s->tid = me;
        s->text[0] = 0;
        s->next = e->slots;
        e->slots = s;
    }
    pthread_mutex_unlock(&e->mu);
    if (s || !make) { /* only this thread makes its slot, so "none" stays true until it does */
        cached.serial = e->serial;
        cached.slot = s;
    }
    return s;
}

kiln_status kiln_err_vset(kiln_err *e, kiln_status s, const char *fmt, va_list ap)
{
    if (!e) return s;
    kiln_err_slot *sl = slot_of(e, 1);
    if (sl) {
        vsnprintf(sl->text, sizeof sl->text, fmt, ap);
    } else { /* no memory for a slot: the shared text, under the lock */
        pthread_mutex_lock(&e->mu);
        vsnprintf(e->oom, sizeof e->oom, fmt, ap);
        pthread_mutex_unlock(&e->mu);
    }
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

const char *kiln_err_text(kiln_err *e)
{
    if (!e) return "";
    kiln_err_slot *sl = slot_of(e, 0);
    return sl ? sl->text : e->oom;
}

void kiln_err_clear(kiln_err *e)
{
    if (!e) return;
    kiln_err_slot *sl = slot_of(e, 0);
    if (sl) sl->text[0] = 0;
}
