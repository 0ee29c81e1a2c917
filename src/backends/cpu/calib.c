/* Roofline calibration of the CPU: streaming read bandwidth over a buffer much larger than the
 * LLC and the f32 FMA peak, both with every pool thread. Must not be called on a hot path (each
 * takes tens to hundreds of milliseconds). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cpu/kern.h"

#define BW_BYTES ((size_t)256 << 20) /* 256 MiB: well past any LLC here */
#define BW_PASSES 4

typedef struct bw_job {
    const kiln_cpu_kern *kt;       /* table (read_sum of the detected ISA) */
    const char          *buf;      /* the buffer */
    size_t               n;        /* its bytes */
    uint64_t             sink[256]; /* per-thread results (kept so the reads are not elided) */
} bw_job;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Each thread streams its contiguous share (128-byte aligned). */
static void bw_fn(void *arg, int tid, int nth)
{
    bw_job *j = arg;
    size_t lo = j->n * (size_t)tid / (size_t)nth & ~(size_t)127;
    size_t hi = j->n * (size_t)(tid + 1) / (size_t)nth & ~(size_t)127;
    j->sink[tid & 255] = j->kt->read_sum(j->buf + lo, hi - lo);
}

double kiln_cpu_measure_read_bw(kiln_cpu_pool *pool)
{
    bw_job j;
    memset(&j, 0, sizeof j);
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, BW_BYTES) != 0)
        return 0;
    memset(buf, 1, BW_BYTES); /* touch every page before timing */
    j.kt = kiln_cpu_kern_get(kiln_cpu_isa_detect());
    j.n = BW_BYTES;
    j.buf = buf;
    double best = 0;
    for (int p = 0; p < BW_PASSES; p++) {
        double t0 = now_s();
        kiln_cpu_pool_run(pool, bw_fn, &j);
        double dt = now_s() - t0;
        double gbs = (double)BW_BYTES / dt * 1e-9;
        best = gbs > best ? gbs : best;
    }
    free(buf);
    return best;
}

typedef struct fma_job {
    const kiln_cpu_kern *kt;       /* table */
    int64_t              iters;    /* loop count per thread */
    double               flops[256]; /* per thread */
} fma_job;

static void fma_fn(void *arg, int tid, int nth)
{
    (void)nth;
    fma_job *j = arg;
    j->flops[tid & 255] = j->kt->fma_loop(j->iters);
}

double kiln_cpu_measure_fma_peak(kiln_cpu_pool *pool, enum kiln_cpu_isa isa)
{
    fma_job j;
    memset(&j, 0, sizeof j);
    j.kt = kiln_cpu_kern_get(isa);
    j.iters = 2000000;
    double best = 0;
    for (int p = 0; p < 3; p++) {
        double t0 = now_s();
        kiln_cpu_pool_run(pool, fma_fn, &j);
        double dt = now_s() - t0, f = 0;
        for (int t = 0; t < kiln_cpu_pool_threads(pool) && t < 256; t++)
            f += j.flops[t];
        best = f / dt * 1e-9 > best ? f / dt * 1e-9 : best;
    }
    return best;
}
