/* PTX generation alone (no JIT): fusion, lowering to kir and printing PTX for sm_90 of every region
 * of a preset's decode layer, median over reps. JSON out. Usage: bench_ptxgen [preset] [reps] [wtype]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "codegen/lower.h"
#include "fuse/fuse.h"
#include "kiln/kiln.h"
#include "ptx/ptx.h"
#include "model/presets.h"

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "llama-7b", *wt = argc > 3 ? argv[3] : "f16";
    int reps = argc > 2 ? atoi(argv[2]) : 21;
    const kiln_preset *pr = kiln_preset_find(name);
    kiln_dtype t = !strcmp(wt, "q4_k") ? KILN_DTYPE_Q4_K : !strcmp(wt, "q8_0") ? KILN_DTYPE_Q8_0 : KILN_DTYPE_F16;
    kiln_graph *g = NULL;
    if (!pr || reps < 1 || reps > 1000 || kiln_preset_build(pr, t, 1, 4096, 1, &g) != KILN_OK) {
        fprintf(stderr, "usage: bench_ptxgen [preset] [reps] [f16|q8_0|q4_k]\n");
        return 2;
    }
    double *ms = malloc(sizeof(double) * (size_t)reps);
    size_t bytes = 0;
    int kernels = 0;
    for (int i = 0; ms && i < reps; i++) {
        double t0 = (bench_now_s() * 1e3);
        kiln_fusion f;
        if (kiln_fuse(g, true, &f) != KILN_OK) return 1;
        bytes = 0, kernels = 0;
        for (uint32_t r = 0; r < f.n_regions; r++) {
            kiln_kir ks[KILN_LOWER_MAX];
            uint32_t nk = 0;
            char err[512];
            if (kiln_lower_region_seq(g, &f.regions[r], ks, &nk, err, sizeof err) != KILN_OK) continue;
            for (uint32_t j = 0; j < nk; j++) {
                char *txt = NULL;
                if (kiln_ptx_print(&ks[j], 90, &txt, err, sizeof err) == KILN_OK) bytes += strlen(txt), kernels++;
                free(txt);
                kiln_kir_free(&ks[j]);
            }
        }
        kiln_fusion_free(&f);
        ms[i] = (bench_now_s() * 1e3) - t0;
    }
    qsort(ms, (size_t)reps, sizeof *ms, bench_cmp_double);
    printf("{\"preset\": \"%s\", \"wtype\": \"%s\", \"layers\": 1, \"kernels\": %d, \"ptx_bytes\": %zu, \"median_ms\": %.3f, \"min_ms\": %.3f}\n",
           name, wt, kernels, bytes, ms[reps / 2], ms[0]);
    free(ms);
    kiln_graph_free(g);
    return 0;
}
