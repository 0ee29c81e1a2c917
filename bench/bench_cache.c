/* Compile-cache benchmark: one decode layer of a preset compiled cold (empty cache folder), warm in
 * the same context (memory hit: fusion, placement and kernels shared; weights still bound or
 * uploaded), warm from disk in the same process (memory table dropped), and warm from disk in a new
 * process (this program run again). JSON out. Matmul weights are borrowed zeros (the preset's
 * shape_only mode): weight generation is not compile time.
 * Usage: bench_cache [--preset NAME] [--backend B] [--wtype T] [--reps N] [--ctx N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kiln/kiln.h"
#include "sched/ctx.h"
#include "model/presets.h"

static const char *preset = "llama-7b", *backend = "cpu", *wtype = "q8_0";
static int reps = 50, kernels;
static long max_ctx = 1024;

static kiln_graph *build(void)
{
    const kiln_preset *pr = kiln_preset_find(preset);
    kiln_dtype t;
    if (!pr || !kiln_dtype_parse(wtype, &t)) return NULL;
    kiln_preset_build_opts o = {.wdtype = t, .kvdtype = t == KILN_DTYPE_F32 ? KILN_DTYPE_F32 : KILN_DTYPE_F16, .n_layers = 1,
                                .max_ctx = max_ctx, .max_tok = 1, .seed = 1, .shape_only = true};
    kiln_graph *g = NULL;
    char err[512];
    if (kiln_preset_build_ex(pr, &o, &g, err, sizeof err) != KILN_OK) fprintf(stderr, "bench_cache: %s\n", err);
    return g;
}

/* One compile: microseconds, and the plan's cache answer. */
static double compile_once(kiln_ctx *ctx, kiln_graph *g, char cache[16])
{
    kiln_plan *p = NULL;
    double t0 = (bench_now_s() * 1e6);
    kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = backend}, &p);
    double t = (bench_now_s() * 1e6) - t0;
    if (s != KILN_OK) {
        fprintf(stderr, "bench_cache: compile: %s: %s\n", kiln_status_str(s), kiln_ctx_error(ctx));
        exit(1);
    }
    snprintf(cache, 16, "%s", kiln_plan_cache(p));
    kernels = kiln_plan_kernel_count(p);
    kiln_plan_free(p);
    return t;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return t[n / 2];
}

int main(int argc, char **argv)
{
    bool child = false;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--child") == 0) child = true;
        else if (strcmp(argv[i], "--preset") == 0 && v) preset = v, i++;
        else if (strcmp(argv[i], "--backend") == 0 && v) backend = v, i++;
        else if (strcmp(argv[i], "--wtype") == 0 && v) wtype = v, i++;
        else if (strcmp(argv[i], "--reps") == 0 && v) reps = atoi(v), i++;
        else if (strcmp(argv[i], "--ctx") == 0 && v) max_ctx = atol(v), i++;
        else {
            fprintf(stderr, "usage: bench_cache [--preset NAME] [--backend B] [--wtype T] [--reps N] [--ctx N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 10000) reps = 50;
    char dir[] = "/tmp/kiln-bench-cache-XXXXXX";
    if (!child) {
        if (!mkdtemp(dir)) return 1;
        setenv("KILN_CACHE_DIR", dir, 1);
        if (strcmp(backend, "cpu") == 0 || strcmp(backend, "ref") == 0) setenv("KILN_CACHE", "all", 1);
    }
    double t_ctx = (bench_now_s() * 1e6);
    kiln_ctx *ctx;
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    t_ctx = (bench_now_s() * 1e6) - t_ctx;
    kiln_graph *g = build();
    if (!g) return 1;
    char c0[16], c1[16], c2[16];
    double first = compile_once(ctx, g, c0);
    if (child) { /* a new process on a warm folder */
        double *t = malloc((size_t)reps * sizeof *t);
        t[0] = first;
        for (int r = 1; r < reps; r++) t[r] = compile_once(ctx, g, c1);
        printf("%.3f %.3f %s %.3f\n", first, t_ctx, c0, median(t + (reps > 1), reps > 1 ? reps - 1 : 1));
        free(t);
        kiln_graph_free(g);
        kiln_ctx_free(ctx);
        return 0;
    }
    double *warm = malloc((size_t)reps * sizeof *warm), *disk = malloc((size_t)reps * sizeof *disk);
    for (int r = 0; r < reps; r++) warm[r] = compile_once(ctx, g, c1);
    for (int r = 0; r < reps; r++) {
        kiln_cache_mem_clear(ctx->cache);
        disk[r] = compile_once(ctx, g, c2);
    }
    /* the new process */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' --child --preset '%s' --backend '%s' --wtype '%s' --reps 5 --ctx %ld", argv[0], preset,
             backend, wtype, max_ctx);
    FILE *f = popen(cmd, "r");
    double np_first = -1, np_ctx = -1, np_mem = -1;
    char np_cache[16] = "?";
    if (!f || fscanf(f, "%lf %lf %15s %lf", &np_first, &np_ctx, np_cache, &np_mem) != 4) fprintf(stderr, "bench_cache: the new process failed\n");
    if (f) pclose(f);
    double warm_med = median(warm, reps), warm_min = warm[0], disk_med = median(disk, reps);
    printf("{\"bench\": \"cache\", \"preset\": \"%s\", \"layers\": 1, \"wtype\": \"%s\", \"backend\": \"%s\", \"kernels\": %d, "
           "\"reps\": %d, \"cold_us\": %.1f, \"cold_cache\": \"%s\", \"warm_memory_us_median\": %.2f, \"warm_memory_us_min\": %.2f, "
           "\"warm_memory_cache\": \"%s\", \"warm_disk_same_process_us_median\": %.1f, \"warm_disk_cache\": \"%s\", "
           "\"new_process_compile_us\": %.1f, \"new_process_cache\": \"%s\", \"new_process_ctx_new_us\": %.1f, "
           "\"targets\": {\"warm_memory_us\": 50, \"new_process_us\": 5000}}\n",
           preset, wtype, backend, kernels, reps, first, c0, warm_med, warm_min, c1, disk_med, c2, np_first,
           np_cache, np_ctx);
    free(warm);
    free(disk);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    size_t removed;
    kiln_cache_clear(dir, &removed);
    rmdir(dir);
    return 0;
}
