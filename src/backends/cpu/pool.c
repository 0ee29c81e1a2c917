/* The CPU backend's persistent thread pool: n-1 pthread workers plus the caller. A job is
 * published by bumping a generation counter; workers spin on it for ~100 us, then sleep on a
 * condition variable. Completion is a counter the caller spins on. Also owns the scratch arena.
 * Must not: run nested jobs, or know anything about kernels. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/cpu/cpu.h"

#define SPIN_NS 100000 /* how long an idle worker spins before sleeping */

struct kiln_cpu_pool {
    int              n;         /* threads including the caller */
    pthread_t       *threads;   /* n - 1 workers */
    atomic_uint      gen;       /* bumped once per job; workers wait for a change */
    atomic_int       done;      /* workers finished with the current job */
    atomic_int       sleepers;  /* workers blocked (or about to block) on cond */
    atomic_bool      quit;      /* set by free: workers exit */
    void           (*fn)(void *, int, int); /* current job */
    void            *arg;       /* its argument */
    pthread_mutex_t  mu;        /* guards the sleep/wake handshake */
    pthread_cond_t   cond;      /* workers sleep here */
    void            *scratch;   /* 64-byte aligned scratch arena */
    size_t           scratch_n; /* its size in bytes */
};

typedef struct worker_arg {
    kiln_cpu_pool *pool; /* the pool */
    int            tid;  /* 1..n-1 */
} worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Waits until pool->gen differs from seen; returns the new value. */
static unsigned wait_gen(kiln_cpu_pool *p, unsigned seen)
{
    uint64_t t0 = now_ns();
    for (unsigned it = 1;; it++) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
        cpu_relax();
        if ((it & 255) == 0 && now_ns() - t0 > SPIN_NS)
            break;
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    unsigned g;
    while ((g = atomic_load(&p->gen)) == seen)
        pthread_cond_wait(&p->cond, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *a)
{
    worker_arg *wa = a;
    kiln_cpu_pool *p = wa->pool;
    int tid = wa->tid;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load(&p->quit))
            return NULL;
        p->fn(p->arg, tid, p->n);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

/* Publishes a new generation and wakes sleepers. seq_cst order between the gen bump and the
 * sleepers read pairs with the worker's sleepers++ then gen read: no wake-up is lost. */
static void publish(kiln_cpu_pool *p)
{
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->mu);
    }
}

kiln_status kiln_cpu_pool_new(int n_threads, kiln_cpu_pool **out)
{
    if (!out)
        return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 256)
        return KILN_ERR_INVALID_ARG;
    kiln_cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return KILN_ERR_NOMEM;
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        kiln_cpu_pool_free(p);
        return KILN_ERR_NOMEM;
    }
    p->n = n_threads; /* workers read n only after a job is published */
    for (int t = 1; t < n_threads; t++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->pool = p;
            wa->tid = t;
        }
        if (!wa || pthread_create(&p->threads[t - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = t; /* free joins the t - 1 started workers */
            kiln_cpu_pool_free(p);
            return KILN_ERR_NOMEM;
        }
    }
    *out = p;
    return KILN_OK;
}

void kiln_cpu_pool_free(kiln_cpu_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->quit, true);
    publish(p);
    for (int t = 1; t < p->n; t++)
        pthread_join(p->threads[t - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cond);
    free(p->threads);
    free(p->scratch);
    free(p);
}

int kiln_cpu_pool_threads(const kiln_cpu_pool *p)
{
    return p ? p->n : 1;
}

void kiln_cpu_pool_run(kiln_cpu_pool *p, void (*fn)(void *arg, int tid, int nth), void *arg)
{
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    publish(p);
    fn(arg, 0, p->n);
    /* A worker may be descheduled on a loaded machine: yield now and then instead of burning. */
    for (unsigned it = 1; atomic_load_explicit(&p->done, memory_order_acquire) != p->n - 1; it++) {
        cpu_relax();
        if ((it & 4095) == 0)
            sched_yield();
    }
}

void *kiln_cpu_pool_scratch(kiln_cpu_pool *p, size_t bytes)
{
    if (!p)
        return NULL;
    if (bytes <= p->scratch_n)
        return p->scratch;
    size_t n = bytes + bytes / 4;
    n = (n + 63) & ~(size_t)63;
    void *m = NULL;
    if (posix_memalign(&m, 64, n) != 0)
        return NULL;
    free(p->scratch);
    p->scratch = m;
    p->scratch_n = n;
    return m;
}
