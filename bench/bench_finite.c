/* Cost of the NaN/Inf guard (kiln_compile_options.check_finite) on a preset's decode layer: the
 * same layer compiled with and without it, decode steps interleaved (so machine noise hits both
 * alike), and the guard's own work timed directly (every region's scan after a run), which does
 * not depend on the noise. Prints one JSON object. Usage:
 *   bench_finite [PRESET] [BACKEND] [STEPS] [WTYPE]   (llama-7b cpu 32 q8_0) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "sched/plan.h"
#include "model/presets.h"

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const char *preset = argc > 1 ? argv[1] : "llama-7b", *backend = argc > 2 ? argv[2] : "cpu";
    int steps = argc > 3 ? atoi(argv[3]) : 32;
    kiln_dtype wt = KILN_DTYPE_Q8_0;
    if (argc > 4 && !kiln_dtype_parse(argv[4], &wt)) return fprintf(stderr, "unknown dtype %s\n", argv[4]), 2;
    const kiln_preset *pr = kiln_preset_find(preset);
    if (!pr || steps < 1) return fprintf(stderr, "usage: bench_finite [PRESET] [BACKEND] [STEPS] [WTYPE]\n"), 2;
    const int64_t ctx0 = 1024, max_ctx = ctx0 + steps + 1;
    kiln_ctx *ctx;
    kiln_graph *g;
    kiln_plan *p[2];
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    if (kiln_preset_build(pr, wt, 1, max_ctx, 1, &g) != KILN_OK) return fprintf(stderr, "build failed\n"), 1;
    for (int i = 0; i < 2; i++)
        if (kiln_compile(ctx, g, &(kiln_compile_options){.backend = backend, .check_finite = i == 1}, &p[i]) != KILN_OK)
            return fprintf(stderr, "compile: %s\n", kiln_ctx_error(ctx)), 1;
    kiln_graph_free(g);
    float *x = malloc(sizeof(float) * (size_t)pr->hidden), *y = malloc(sizeof(float) * (size_t)pr->hidden);
    uint64_t rs = 7;
    for (int64_t i = 0; i < pr->hidden; i++) x[i] = kiln_preset_rngf(&rs);
    double *t[2] = {malloc(sizeof(double) * (size_t)steps), malloc(sizeof(double) * (size_t)steps)};
    double *scan = malloc(sizeof(double) * (size_t)steps);
    for (int s = -2; s < steps; s++) { /* two warm-up steps */
        int32_t pos = (int32_t)(ctx0 + (s < 0 ? 0 : s));
        kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = pos + 1},
                            {.name = "x", .data = x, .bytes = sizeof(float) * (size_t)pr->hidden},
                            {.name = "pos", .data = &pos, .bytes = 4},
                            {.name = "y", .data = y, .bytes = sizeof(float) * (size_t)pr->hidden}};
        for (int i = 0; i < 2; i++) {
            int k = (s & 1) ? 1 - i : i; /* alternate which goes first */
            double t0 = bench_now_s();
            if (kiln_run(p[k], b, 5) != KILN_OK) return fprintf(stderr, "run: %s\n", kiln_ctx_error(ctx)), 1;
            if (s >= 0) t[k][s] = bench_now_s() - t0;
        }
        double t0 = bench_now_s(); /* the guard's own work on the guarded plan's last run */
        for (uint32_t r = 0; r < p[1]->fusion.n_regions; r++)
            if (kiln_sched_check_finite(p[1], r) != KILN_OK) return fprintf(stderr, "scan: %s\n", kiln_ctx_error(ctx)), 1;
        if (s >= 0) scan[s] = bench_now_s() - t0;
    }
    double off = median(t[0], steps), on = median(t[1], steps), sc = median(scan, steps);
    printf("{\"preset\": \"%s\", \"backend\": \"%s\", \"wtype\": \"%s\", \"n_kv\": %lld, \"steps\": %d, \"kernels\": %d, "
           "\"median_ms_off\": %.4f, \"median_ms_on\": %.4f, \"scan_us\": %.2f, \"scan_fraction\": %.5f}\n",
           preset, backend, kiln_dtype_name(wt), (long long)ctx0, steps, kiln_plan_kernel_count(p[0]), off * 1e3, on * 1e3,
           sc * 1e6, sc / off);
    kiln_plan_free(p[0]);
    kiln_plan_free(p[1]);
    kiln_ctx_free(ctx);
    free(x), free(y), free(t[0]), free(t[1]), free(scan);
    return 0;
}
