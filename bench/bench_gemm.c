/* kiln's own large GEMM: y = x . W^T on a backend (default cuda), the region's kernel time from
 * kiln_plan_profile (no upload of x, no download of y), median over the steps, as TFLOP/s. The
 * f16-x cases run the tensor cores at one part per product (the highest rate kiln's GEMM reaches:
 * the reference against which prefill's fraction is stated); f32 x takes two f16 parts (exact to
 * the f32 contract) at half that rate. JSON, one object per line.
 * Usage: bench_gemm [backend] [steps] */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct shape {
    int64_t m, n, k;
    kiln_dtype xt, wt;
} shape;

static int run_case(kiln_ctx *ctx, const char *backend, const shape *s, int steps)
{
    kiln_graph *g = NULL;
    if (kiln_graph_new(&g) != KILN_OK) return 1;
    kiln_node x = kiln_input(g, "x", s->xt, 2, (kiln_dim[]){s->m, s->k});
    kiln_node w = kiln_weight_random(g, "w", s->wt, 2, (kiln_dim[]){s->n, s->k}, 7, 0.05f);
    kiln_output(g, kiln_matmul(g, x, w), "y");
    size_t xb = (size_t)(s->m * s->k) * (s->xt == KILN_DTYPE_F32 ? 4 : 2), yb = (size_t)(s->m * s->n) * 4;
    unsigned char *xd = calloc(xb, 1);
    float *y = malloc(yb);
    double med = 0;
    int rc = 1;
    if (xd && y) {
        for (size_t i = 0; i < xb; i++) { /* x of varied values (tensor-core rates depend on the data): f16 0.5..1, f32 0.5..1 */
            if (s->xt == KILN_DTYPE_F32) xd[i] = (unsigned char)(i % 4 == 3 ? 0x3f : i % 4 == 2 ? 0x00 | (i * 7 % 128) : i * 13);
            else xd[i] = (unsigned char)(i % 2 ? 0x38 : i * 13);
        }
        kiln_binding b[] = {{.name = "x", .data = xd, .bytes = xb}, {.name = "y", .data = y, .bytes = yb}};
        rc = bench_kernel_median(ctx, g, backend, b, 2, steps, NULL, &med);
    }
    if (!rc) {
        double fl = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        printf("{\"backend\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"x\": \"%s\", \"w\": \"%s\", \"ms\": %.4f, \"tflop_per_s\": %.1f}\n",
               backend, (long long)s->m, (long long)s->n, (long long)s->k, kiln_dtype_name(s->xt), kiln_dtype_name(s->wt), med * 1e3,
               fl / med * 1e-12);
    }
    free(xd), free(y);
    kiln_graph_free(g);
    return rc;
}

int main(int argc, char **argv)
{
    const char *backend = argc > 1 ? argv[1] : "cuda";
    int steps = argc > 2 ? atoi(argv[2]) : 10;
    if (steps < 1 || steps > 10000) {
        fprintf(stderr, "usage: bench_gemm [backend] [steps]\n");
        return 2;
    }
    kiln_ctx *ctx;
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    const shape shapes[] = {
        {4096, 4096, 4096, KILN_DTYPE_F16, KILN_DTYPE_F16},
        {8192, 8192, 4096, KILN_DTYPE_F16, KILN_DTYPE_F16},
        {4096, 4096, 4096, KILN_DTYPE_F32, KILN_DTYPE_F16},
        {512, 12288, 4096, KILN_DTYPE_F16, KILN_DTYPE_F16},
        {512, 12288, 4096, KILN_DTYPE_F32, KILN_DTYPE_F16},
        {512, 12288, 4096, KILN_DTYPE_F32, KILN_DTYPE_Q4_K},
        {512, 4096, 4096, KILN_DTYPE_F16, KILN_DTYPE_F16},
        {512, 22016, 4096, KILN_DTYPE_F16, KILN_DTYPE_F16},
        {512, 4096, 11008, KILN_DTYPE_F16, KILN_DTYPE_F16},
        {128, 4096, 4096, KILN_DTYPE_F16, KILN_DTYPE_F16},
        {64, 4096, 4096, KILN_DTYPE_F16, KILN_DTYPE_F16},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) rc |= run_case(ctx, backend, &shapes[i], steps);
    kiln_ctx_free(ctx);
    return rc;
}
