/* Cost-model experiment: how placement of a qwen2-0.5b decode layer changes as the host<->device
 * link of a hypothetical GPU gets faster. Uses what-if plans (placed, explained, never run), so
 * it needs no GPU. Uses only kiln/kiln.h (the layer is the public qwen2-0.5b preset).
 * Usage: example_cost_model_experiment [layers]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

int main(int argc, char **argv)
{
    int layers = argc > 1 ? atoi(argv[1]) : 2;
    kiln_ctx *ctx;
    kiln_graph *g;
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    kiln_preset_options po = {.wdtype = KILN_DTYPE_Q8_0, .n_layers = layers, .max_ctx = 1024, .max_tok = 1};
    if (kiln_preset_graph(ctx, "qwen2-0.5b", &po, &g) != KILN_OK) {
        fprintf(stderr, "cannot build the graph: %s\n", kiln_ctx_error(ctx));
        return 1;
    }
    kiln_device_profile cpu, gpu = {.mem_bw = 3.0e12, .launch_s = 4e-6, .xfer_latency_s = 1e-5};
    kiln_ctx_profile(ctx, "cpu", &cpu);
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) gpu.peak_flops[t] = 4e14;
    printf("qwen2-0.5b decode, %d layer(s), q8_0 weights; cpu: %.1f GB/s; gpu: %.0f GB/s, launch %.0f us\n", layers,
           cpu.mem_bw / 1e9, gpu.mem_bw / 1e9, gpu.launch_s * 1e6);
    int cpu_i = -1, cuda = -1; /* index of each backend in kiln_region_info.predicted_s */
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info bi;
        kiln_backend_get(ctx, i, &bi);
        if (strcmp(bi.name, "cpu") == 0) cpu_i = i;
        if (strcmp(bi.name, "cuda") == 0) cuda = i;
    }
    if (cpu_i < 0 || cuda < 0) return 1;
    printf("%14s  %8s  %8s  %14s\n", "link GB/s", "on cpu", "on gpu", "predicted ms");
    for (double link = 1e6; link <= 1e12; link *= 10) {
        gpu.h2d_bw = gpu.d2h_bw = link;
        kiln_ctx_set_profile(ctx, "cuda", &gpu);
        kiln_plan *p;
        if (kiln_compile(ctx, g, &(kiln_compile_options){.what_if = true}, &p) != KILN_OK) {
            fprintf(stderr, "compile: %s\n", kiln_ctx_error(ctx));
            return 1;
        }
        int n = kiln_plan_kernel_count(p), on_gpu = 0;
        double total = 0;
        for (int i = 0; i < n; i++) {
            kiln_region_info ri;
            kiln_plan_region(p, i, &ri);
            int b = strcmp(ri.backend, "cuda") == 0 ? cuda : cpu_i;
            on_gpu += b == cuda;
            total += ri.predicted_s[b] + ri.transfer_s;
        }
        printf("%14.3f  %8d  %8d  %14.4f\n", link / 1e9, n - on_gpu, on_gpu, total * 1e3);
        kiln_plan_free(p);
    }
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return 0;
}
