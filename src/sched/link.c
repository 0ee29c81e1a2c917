/* The links between the GPUs of a split plan, measured for kiln_calibrate: one f32 sum all-reduce
 * over every GPU (at most 8) through the backend's collectives (NCCL), its latency at one token's
 * hidden state (8 KB) and its bus bandwidth at 16 MiB (NCCL's busbw: 2 (N - 1) / N * bytes / time),
 * into the profile's link_latency_s and link_bw. Must not run when multi-GPU is off: it says why. */
#include "sched/group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct link_bench {
    const kiln_backend_i *b;
    int                   n;          /* devices */
    kiln_ctx             *child[8];   /* a context per GPU */
    void                 *states[8];  /* their backend states */
    void                 *x[8], *y[8]; /* buffers on each */
    void                 *comm;       /* communicators */
} link_bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds per all-reduce of count values: reps of them enqueued, then every queue drained. */
static kiln_status time_reduce(link_bench *lb, size_t count, int reps, double *secs, char *err, size_t n_err)
{
    kiln_status s = KILN_OK;
    double t0 = 0;
    for (int r = -2; r < reps && s == KILN_OK; r++) { /* two warm-ups, each drained */
        if (r == 0) t0 = now_s();
        s = lb->b->all_reduce(lb->comm, lb->states, lb->x, lb->y, count, err, n_err);
        for (int p = 0; s == KILN_OK && r < 0 && p < lb->n; p++) s = lb->b->sync(lb->states[p], err, n_err);
    }
    for (int p = 0; s == KILN_OK && p < lb->n; p++) s = lb->b->sync(lb->states[p], err, n_err);
    *secs = (now_s() - t0) / reps;
    return s;
}

static void link_free(link_bench *lb)
{
    for (int p = 0; p < lb->n; p++) {
        if (lb->x[p]) lb->b->free(lb->states[p], lb->x[p]);
        if (lb->y[p]) lb->b->free(lb->states[p], lb->y[p]);
    }
    if (lb->comm) lb->b->coll_free(lb->comm);
    for (int p = 0; p < lb->n; p++) kiln_ctx_free(lb->child[p]);
}

static kiln_status link_open(kiln_ctx *ctx, link_bench *lb, size_t bytes, char *why, size_t n)
{
    const int be = KILN_BACKEND_CUDA;
    int count = 0, devs[8];
    lb->b = kiln_backends[be];
    if (!ctx->be_ok[be]) return snprintf(why, n, "cuda is not available: %s", ctx->be_detail[be]), KILN_ERR_UNSUPPORTED;
    if (!lb->b->coll_probe || !lb->b->coll_probe(ctx->be_state[be], &count, why, n)) return KILN_ERR_UNSUPPORTED;
    lb->n = count < 8 ? count : 8;
    for (int p = 0; p < lb->n; p++) {
        devs[p] = p;
        kiln_status s = kiln_ctx_new_device(ctx, p, &lb->child[p]);
        if (s != KILN_OK) return snprintf(why, n, "a context for GPU %d: %s", p, kiln_status_str(s)), s;
        if (!lb->child[p]->be_ok[be]) return snprintf(why, n, "GPU %d: %s", p, lb->child[p]->be_detail[be]), KILN_ERR_UNSUPPORTED;
        lb->states[p] = lb->child[p]->be_state[be];
        if ((s = lb->b->alloc(lb->states[p], bytes, &lb->x[p], why, n)) != KILN_OK) return s;
        if ((s = lb->b->alloc(lb->states[p], bytes, &lb->y[p], why, n)) != KILN_OK) return s;
    }
    return lb->b->coll_init(lb->states, devs, lb->n, &lb->comm, why, n);
}

kiln_status kiln_sched_calibrate_link(kiln_ctx *ctx, kiln_device_profile *p, char *why, size_t n)
{
    const size_t small = 2048, big = (size_t)4 << 20; /* f32 values: 8 KB and 16 MiB */
    link_bench lb = {0};
    double t_small = 0, t_big = 0;
    kiln_status s = link_open(ctx, &lb, big * sizeof(float), why, n);
    if (s == KILN_OK) s = time_reduce(&lb, small, 50, &t_small, why, n);
    if (s == KILN_OK) s = time_reduce(&lb, big, 10, &t_big, why, n);
    if (s == KILN_OK) {
        p->link_latency_s = t_small;
        double t = t_big > t_small ? t_big - t_small : t_big; /* the bandwidth past the fixed cost */
        p->link_bw = 2.0 * (lb.n - 1) / lb.n * (double)(big * sizeof(float)) / t;
        snprintf(why, n, "%d GPUs", lb.n);
    }
    link_free(&lb);
    return s;
}
