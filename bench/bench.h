/* Shared by the benchmark programs (each bench source file is a program of its own, so the shared
 * code lives here as static functions): a monotonic clock, the order qsort takes to find medians,
 * and the kernel-time harness of bench_gemm and bench_attn. Must not assert speed. */
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kiln/kiln.h>

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Compiles g on backend and times its kernels: a warm-up run, then `steps` runs with
 * kiln_plan_profile on; per run, the measured time of the regions of kind `kind` (NULL: all of
 * them: no upload, no download); *median_s gets the median over the runs. On failure prints
 * {"error": ...} (a JSON line like the results) and returns 1; else 0. */
static inline int bench_kernel_median(kiln_ctx *ctx, kiln_graph *g, const char *backend, const kiln_binding *b, size_t nb,
                                      int steps, const char *kind, double *median_s)
{
    kiln_plan *p = NULL;
    double *t = calloc((size_t)steps, sizeof *t);
    int rc = 1;
    if (!t) return 1;
    if (kiln_compile(ctx, g, &(kiln_compile_options){.backend = backend}, &p) != KILN_OK) {
        printf("{\"error\": \"compile on %s: %s\"}\n", backend, kiln_ctx_error(ctx));
        goto done;
    }
    if (kiln_run(p, b, nb) != KILN_OK) goto fail; /* warm-up */
    kiln_plan_profile(p, true);
    for (int i = 0; i < steps; i++) {
        double sum = 0;
        if (kiln_run(p, b, nb) != KILN_OK) goto fail;
        kiln_region_info ri;
        for (int r = 0; kiln_plan_region(p, r, &ri) == KILN_OK; r++)
            if (!kind || !strcmp(ri.kind, kind)) sum += ri.measured_s * ri.n_measured;
        t[i] = sum;
    }
    for (int i = steps - 1; i > 0; i--) t[i] -= t[i - 1]; /* the regions' sums are cumulative */
    qsort(t, (size_t)steps, sizeof *t, bench_cmp_double);
    *median_s = t[steps / 2];
    rc = 0;
    goto done;
fail:
    printf("{\"error\": \"run on %s: %s\"}\n", backend, kiln_ctx_error(ctx));
done:
    free(t);
    kiln_plan_free(p);
    return rc;
}
