/* Compile-speed benchmark: time kiln_compile (clone, fuse, place, memory plan, kernel setup) of an
 * N-layer model graph, cold (the context's plan cache dropped before each compile, disk entries
 * off) and warm (an equal graph compiled before: a memory hit). JSON out.
 * Usage: bench_plan [preset] [layers] [reps]. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench.h"
#include "cache/cache.h"
#include "graph/graph.h"
#include "kiln/kiln.h"
#include "sched/ctx.h"
#include "model/presets.h"

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "qwen2-0.5b";
    int layers = argc > 2 ? atoi(argv[2]) : 32, reps = argc > 3 ? atoi(argv[3]) : 15;
    const kiln_preset *pr = kiln_preset_find(name);
    kiln_ctx *ctx;
    kiln_graph *g;
    if (!pr || layers < 1 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: bench_plan [preset] [layers] [reps]\n");
        return 2;
    }
    setenv("KILN_CACHE", "off", 1); /* cold means cold: no kernels from disk */
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    fprintf(stderr, "building %s x %d layers (q4_k weights)...\n", name, layers);
    if (kiln_preset_build(pr, KILN_DTYPE_Q4_K, layers, 2048, 512, &g) != KILN_OK) return 1;
    /* weight bytes made once, shared by every compile's copy: compile time, not weight generation */
    if (kiln_graph_materialize_weights(g) != KILN_OK) return 1;
    double t[1000], w[1000];
    int kernels = 0, ops = (int)kiln_graph_size(g);
    for (int r = 0; r < 2 * reps; r++) {
        kiln_plan *p;
        if (r < reps) kiln_cache_mem_clear(ctx->cache);
        double t0 = (bench_now_s() * 1e3);
        if (kiln_compile(ctx, g, NULL, &p) != KILN_OK) {
            fprintf(stderr, "compile: %s\n", kiln_ctx_error(ctx));
            return 1;
        }
        if (r < reps) t[r] = (bench_now_s() * 1e3) - t0;
        else w[r - reps] = (bench_now_s() * 1e3) - t0;
        kernels = kiln_plan_kernel_count(p);
        kiln_plan_free(p);
    }
    qsort(t, reps, sizeof *t, bench_cmp_double);
    qsort(w, reps, sizeof *w, bench_cmp_double);
    printf("{\"bench\": \"plan\", \"preset\": \"%s\", \"layers\": %d, \"nodes\": %d, \"kernels\": %d, "
           "\"compile_ms_median\": %.3f, \"compile_ms_min\": %.3f, \"warm_compile_ms_median\": %.3f, \"target_ms\": 20}\n",
           name, layers, ops, kernels, t[reps / 2], t[0], w[reps / 2]);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return 0;
}
