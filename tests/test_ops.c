/* Op conformance: every op x dtype on the backend named by $KILN_TEST_BACKEND (default "ref")
 * against the f64 oracle ref64, on fresh random data, several shapes (1, 3, 17, 4097 where they
 * mean something) and symbolic dims bound below and at their max, outputs poisoned and guarded,
 * every element checked against the contract's NMSE bound. No case may skip a check. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/plan.h"
#include "support/ref64.h"
#include "support/testutil.h"

static const kiln_dtype ACT[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
static const kiln_dtype PLAIN[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32};
static const kiln_dtype WTS[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                                 KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
/* The block formats added after the first four (their GPU rows in codegen/wfmt_more.c). */
static const kiln_dtype MORE_WTS[] = {KILN_DTYPE_Q4_0,   KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1,
                                      KILN_DTYPE_IQ4_NL, KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K, KILN_DTYPE_IQ4_XS};
static const int64_t ODD[] = {1, 3, 17, 4097};

static bool gpu_backend(void) { return strcmp(tu_backend(), "ref") != 0 && strcmp(tu_backend(), "cpu") != 0; }
#define N_OF(a) (sizeof(a) / sizeof *(a))

static const char *lab(const char *fmt, ...)
{
    static char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

static kiln_graph *graph(void)
{
    kiln_graph *g = NULL;
    cr_assert(kiln_graph_new(&g) == KILN_OK && g);
    return g;
}

static void out(kiln_graph *g, kiln_node y, const char *name)
{
    cr_assert(y != KILN_NODE_NONE, "builder failed: %s", kiln_graph_error(g));
    kiln_status st = kiln_output(g, y, name);
    cr_assert(st == KILN_OK, "kiln_output: %s: %s", kiln_status_str(st), kiln_graph_error(g));
}

static const char *dn(kiln_dtype t)
{
    return kiln_dtype_name(t);
}

/* ---------------------------------------------------------------- matmul */

/* The scale and the bound of a matmul check. mag[r * N + n] = sum_k |x[r, k] w[n, k]|, the
 * magnitude of the terms output (r, n) sums: contracts/matmul.yaml takes the NMSE against it, as
 * f32 rounding errors scale with the terms, not with a sum that cancels (a K = 3 output that summed
 * to 1e-3 gave NMSE 1.4e-9 against itself, 1e-15 against its terms: seed 1798798666125147223).
 * The bound: the contract's, or for block weights, when larger, 25 times the expected NMSE of x's
 * int8 rounding in fast kernels (cpu per 32 or 256, GPU gemv per 32): step D = amax/127 (taken over
 * groups of 256, the larger), uniform error of variance D^2/12 per value, and the f16 rounding of
 * each 32-group's stored step (relative 2^-12 of that group's partial sum P, variance P^2 2^-24/3),
 * over the same magnitude. A deviation past 25x its expectation has odds under 1e-5 for a correct
 * kernel, and a wrong scale or nibble (1e-2) fails. x: m rows of K as the kernels read them; wd: w
 * dequantized. */
static double matmul_tol(kiln_dtype wt, const double *x, int64_t m, int64_t K, const float *wd, int64_t N, double *mag)
{
    double tol = tu_tol("matmul", wt), err2 = 0, mag2 = 0;
    double *var = malloc(sizeof(double) * (size_t)K);
    for (int64_t t = 0; t < m; t++) {
        const double *xr = x + t * K;
        for (int64_t g = 0; g < K; g += 256) {
            double amax = 0;
            for (int64_t k = g; k < K && k < g + 256; k++) amax = fmax(amax, fabs(xr[k]));
            for (int64_t k = g; k < K && k < g + 256; k++) var[k] = amax * amax / (127.0 * 127.0 * 12);
        }
        for (int64_t n = 0; n < N; n++) {
            double a = 0, e = 0, p = 0;
            for (int64_t k = 0; k < K; k++) {
                double w = wd[n * K + k];
                a += fabs(xr[k] * w), p += xr[k] * w, e += w * w * var[k];
                if (k % 32 == 31 || k == K - 1) e += p * p * 0x1p-24 / 3, p = 0;
            }
            mag[t * N + n] = a;
            err2 += e, mag2 += a * a;
        }
    }
    free(var);
    if (kiln_dtype_block(wt) == 1) return tol;
    return mag2 > 0 && 25 * err2 / mag2 > tol ? 25 * err2 / mag2 : tol;
}

static void matmul_case(kiln_dtype xt, kiln_dtype wt, int64_t K, int64_t N, int64_t tmax, const int64_t *tv, int ntv, bool rank3)
{
    kiln_graph *g = graph();
    kiln_dim T = kiln_sym(g, "t", tmax);
    kiln_node x = rank3 ? kiln_input(g, "x", xt, 3, (kiln_dim[]){2, T, K}) : kiln_input(g, "x", xt, 2, (kiln_dim[]){T, K});
    float *wv = malloc(sizeof(float) * (size_t)(N * K)), *wd = malloc(sizeof(float) * (size_t)(N * K));
    tu_fill(wv, N * K, -0.5f, 1.5f); /* mean 0.5: outputs seldom cancel (where one does, mag keeps the check's scale) */
    size_t wb;
    void *wq = tu_to_dtype(wt, wv, N * K, &wb);
    cr_assert_eq(kiln_dequantize(wt, wq, wd, N * K), KILN_OK);
    kiln_node w = kiln_weight(g, "w", wt, 2, (kiln_dim[]){N, K}, wq, KILN_WEIGHT_COPY);
    out(g, kiln_matmul(g, x, w), "y");
    tu_sess *s = tu_sess_new(g, lab("matmul x %s%s [t<=%lld, %lld] w %s [%lld, %lld]", dn(xt), rank3 ? " rank3" : "",
                                    (long long)tmax, (long long)K, dn(wt), (long long)N, (long long)K));
    for (int i = 0; i < ntv; i++) {
        int64_t m = (rank3 ? 2 : 1) * tv[i];
        float *xv = malloc(sizeof(float) * (size_t)(m * K));
        double *x64 = malloc(sizeof(double) * (size_t)(m * K));
        tu_fill(xv, m * K, -0.5f, 1.5f);
        void *xq = tu_to_dtype(xt, xv, m * K, &wb);
        tu_to_f64(xt, xq, m * K, x64);
        tu_sym(s, "t", tv[i]);
        tu_input(s, "x", xq, wb);
        double *mag = malloc(sizeof(double) * (size_t)(m * N));
        double tol = matmul_tol(wt, x64, m, K, wd, N, mag);
        tu_run(s);
        tu_check_mag(s, "y", mag, tol);
        free(xv), free(xq), free(x64), free(mag);
    }
    tu_sess_free(s);
    free(wv), free(wd), free(wq);
    kiln_graph_free(g);
}

Test(ops, matmul)
{
    const int64_t gemv[] = {1, 3, 4}, gemm[] = {33, 40};
    for (size_t w = 0; w < N_OF(WTS); w++) {
        kiln_dtype wt = WTS[w];
        int64_t blk = kiln_dtype_block(wt);
        const int64_t plain_k[] = {1, 3, 17, 4097}, blk_k[] = {256, 512, 4096}, q8_k[] = {32, 96, 4096};
        const int64_t *ks = blk == 1 ? plain_k : blk == 32 ? q8_k : blk_k;
        int nk = blk == 1 ? 4 : 3;
        const int64_t ns[] = {1, 3, 17};
        for (int k = 0; k < nk; k++)
            for (int n = 0; n < 3; n++)
                matmul_case(KILN_DTYPE_F32, wt, ks[k], ns[n], 4, gemv, 3, false);
        matmul_case(KILN_DTYPE_F32, wt, 256, 64, 40, gemm, 2, false);
        matmul_case(KILN_DTYPE_F32, wt, blk == 1 ? 17 : ks[0], 3, 4, gemv + 1, 2, true);
        if (wt == KILN_DTYPE_F32 || wt == KILN_DTYPE_Q4_K)
            for (int xt = 1; xt < 3; xt++) {
                matmul_case(ACT[xt], wt, blk == 1 ? 17 : 512, 17, 4, gemv, 3, false);
                matmul_case(ACT[xt], wt, 256, 64, 40, gemm, 2, false);
            }
    }
}

/* rms_norm + matmul with 8 tokens of K 1024 f32 x in one gemv pass: the normalized x staged in
 * shared memory is 32 KiB, all a Vulkan device may have, and the GLSL printer's reduction scratch
 * (4 bytes a thread) comes beside it, so the lowering must not stage it there (lavapipe refused the
 * kernel: "needs 33792 bytes of shared memory, llvmpipe has 32768"). Against ref64, every backend. */
Test(ops, rms_norm_matmul_staged_x_fits_shared_memory)
{
    const int64_t K = 1024, N = 40;
    kiln_graph *g = graph();
    kiln_dim T = kiln_sym(g, "t", 8);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, K});
    kiln_node h = kiln_rms_norm(g, x, tu_weight(g, "nw", KILN_DTYPE_F32, 1, &K, 0.8f, 1.2f), 1e-6f);
    out(g, kiln_matmul(g, h, tu_weight(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){N, K}, -0.5f, 1.5f)), "y");
    tu_sess *s = tu_sess_new(g, "rms_norm + matmul, x [t<=8, 1024] f32, w [40, 1024] f32");
    for (int64_t t = 1; t <= 8; t += 7) {
        tu_sym(s, "t", t);
        tu_input_random(s, "x", -1.0f, 1.0f);
        tu_run(s);
        tu_check(s, "y", "matmul", KILN_DTYPE_F32);
    }
    tu_sess_free(s);
    kiln_graph_free(g);
}

/* Block weights on few shapes (kept small: this one also runs on lavapipe in CI): every sub-block
 * position of the integer-dot GEMV, x quantized in several passes (t up to 40), K = 4096 (more x
 * words than threads per block), f16 x. */
Test(ops, matmul_blocks)
{
    const int64_t gemv[] = {1, 3, 4}, gemm[] = {9, 40};
    for (size_t w = 3; w < N_OF(WTS); w++) {
        kiln_dtype wt = WTS[w];
        int64_t k0 = kiln_dtype_block(wt) == 32 ? 96 : 256;
        for (int n = 1; n <= 17; n += 16) matmul_case(KILN_DTYPE_F32, wt, k0, n, 4, gemv, 3, false);
        matmul_case(KILN_DTYPE_F32, wt, 512, 5, 40, gemm, 2, false);
        matmul_case(KILN_DTYPE_F32, wt, 4096, 3, 1, gemv, 1, false);
        matmul_case(KILN_DTYPE_F16, wt, 512, 3, 4, gemv + 1, 2, false);
    }
}

/* The formats added after the first four (codegen/wfmt_more.c on the GPUs): every K shape class of
 * their block size, the GEMV (few rows) and GEMM (more than 8 rows) paths, rank-3 and f16 x. The
 * GPU rows of the 32-blocks take pairs (K a multiple of 64): there K = 96 must be refused naming
 * the format, never run. */
Test(ops, matmul_more_formats)
{
    const int64_t gemv[] = {1, 3, 4}, gemm[] = {9, 40};
    for (size_t w = 0; w < N_OF(MORE_WTS); w++) {
        kiln_dtype wt = MORE_WTS[w];
        const int64_t k32[] = {32, 96, 4096}, k64[] = {64, 192, 4096}, k256[] = {256, 512, 4096};
        const int64_t *ks = kiln_dtype_block(wt) == 32 ? (gpu_backend() ? k64 : k32) : k256;
        if (gpu_backend()) { /* lavapipe compiles a plan for tens of seconds: every gemv, the GEMM of each chunk map once
                                (tests/test_gemm_wg.c runs every format's GEMM decoders in the interpreter) */
            matmul_case(KILN_DTYPE_F32, wt, ks[1], 17, 4, gemv, 3, false);
            if (wt == KILN_DTYPE_Q4_1 || wt == KILN_DTYPE_Q3_K || wt == KILN_DTYPE_IQ4_XS) matmul_case(KILN_DTYPE_F32, wt, 512, 64, 40, gemm, 2, false);
        } else {
            /* N >= 5: the NMSE of a single output of K = 32 can reach 1e-3 when its sum cancels to a
             * few percent of its typical size (x's int8 rounding, seen at 2.5 sigma); 5 outputs do not. */
            for (int k = 0; k < 3; k++)
                for (int n = 5; n <= 17; n += 12) matmul_case(KILN_DTYPE_F32, wt, ks[k], n, 4, gemv, 3, false);
            matmul_case(KILN_DTYPE_F32, wt, 512, 64, 40, gemm, 2, false);
            matmul_case(KILN_DTYPE_F32, wt, ks[0], 3, 4, gemv + 1, 2, true);
            matmul_case(KILN_DTYPE_F16, wt, 512, 3, 4, gemv + 1, 2, false);
        }
        if (!gpu_backend() || kiln_dtype_block(wt) != 32) continue;
        kiln_graph *g = graph();
        kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 96});
        out(g, kiln_matmul(g, x, tu_weight(g, "w", wt, 2, (kiln_dim[]){8, 96}, -1, 1)), "y");
        kiln_ctx *ctx = NULL;
        kiln_plan *p = NULL;
        cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
        kiln_status st = kiln_compile(ctx, g, &(kiln_compile_options){.backend = tu_backend()}, &p);
        cr_assert(st == KILN_ERR_UNSUPPORTED && !p && strstr(kiln_ctx_error(ctx), dn(wt)), "%s K = 96 on %s: %s: %s", dn(wt), tu_backend(),
                  kiln_status_str(st), kiln_ctx_error(ctx));
        kiln_ctx_free(ctx);
        kiln_graph_free(g);
    }
}

/* Float weights in decode shapes (one pass over the tokens: x normalized once per block into
 * shared memory), small enough for lavapipe too. */
Test(ops, matmul_float_decode)
{
    const int64_t gemv[] = {1, 3, 4};
    for (size_t w = 0; w < 3; w++) {
        matmul_case(KILN_DTYPE_F32, WTS[w], 512, 17, 4, gemv, 3, false);
        matmul_case(KILN_DTYPE_F32, WTS[w], 4096, 3, 1, gemv, 1, false);
        matmul_case(KILN_DTYPE_BF16, WTS[w], 256, 5, 2, gemv, 1, false);
    }
}

/* The prefill GEMM (tensor-core template on the GPU backends: more than 8 rows, K a multiple of
 * 32): every weight dtype (f32 weights in two f16 parts), a column tail (N = 72) and a row tail (64- or 128-row tiles,
 * the last partial), x in f16/bf16 (the mma then takes x as it is), and a run of 5 rows through
 * the same plan (its guarded gemv kernel takes it). Small enough for lavapipe. */
Test(ops, matmul_gemm)
{
    const int64_t t[] = {80, 9, 5};
    for (size_t w = 0; w < N_OF(WTS); w++)
        matmul_case(KILN_DTYPE_F32, WTS[w], 256, 72, 80, t, 1, false);
    matmul_case(KILN_DTYPE_F16, KILN_DTYPE_F16, 64, 72, 80, t, 3, false);
    matmul_case(KILN_DTYPE_F16, KILN_DTYPE_F32, 64, 72, 80, t, 2, false); /* x exact: one x part, two weight parts */
    matmul_case(KILN_DTYPE_BF16, KILN_DTYPE_Q4_K, 256, 16, 40, t + 1, 1, true);
}

/* The layer-sized cases run on GPUs only (KILN_TEST_BACKEND cuda): the host reference takes seconds. */
#define GPU_ONLY()                                                      \
    do {                                                                \
        const char *b_ = getenv("KILN_TEST_BACKEND");                   \
        if (!b_ || strcmp(b_, "cuda")) cr_skip_test("GPU only");        \
    } while (0)

/* Layer-sized GEMMs (K = 4096: the Hopper template's ring wraps many times; rows over 128: two
 * accumulators per warpgroup; more column blocks than SMs; rms_norm + gate/up siblings + swiglu
 * at llama-7b's size): on GPUs only (KILN_TEST_BACKEND cuda), the host reference takes seconds.
 * Bound 1e-8: sums of K mean-0.5 terms (not the contract's random-sign case) round to NMSE
 * 1.5e-10 at K = 4096 and 1.4e-9 at K = 11008 on the H100 (mma.sync and wgmma alike); a wrong
 * or missing tile gives 1e-3 or more (a launch that skipped part of x gave 0.1 .. 0.5). Under
 * $KILN_PRECISION=f16 (x in one f16 part) the contract's tolerance_f16_act (layer_tol). */
static double layer_tol(void) { return fmax(1e-8, tu_tol("matmul", KILN_DTYPE_F16)); }

static void layer_gemm(kiln_dtype xt, int64_t K, int64_t N, int64_t T, bool mlp)
{
    kiln_graph *g = graph();
    kiln_dim Td = kiln_sym(g, "t", T);
    kiln_node x = kiln_input(g, "x", xt, 2, (kiln_dim[]){Td, K});
    kiln_node w = tu_weight(g, "w", KILN_DTYPE_F16, 2, (kiln_dim[]){N, K}, -0.5f, 1.5f);
    if (mlp) {
        kiln_node nw = tu_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){K}, 0.5f, 1.5f);
        kiln_node h = kiln_rms_norm(g, x, nw, 1e-5f);
        kiln_node u = tu_weight(g, "u", KILN_DTYPE_F16, 2, (kiln_dim[]){N, K}, -0.5f, 1.5f);
        out(g, kiln_swiglu(g, kiln_matmul(g, h, w), kiln_matmul(g, h, u)), "y");
    } else {
        out(g, kiln_matmul(g, x, w), "y");
    }
    tu_sess *s = tu_sess_new(g, lab("layer-sized %s x %s [%lld, %lld] w f16 [%lld, %lld]", mlp ? "rms_norm + gate/up + swiglu" : "matmul",
                                    dn(xt), (long long)T, (long long)K, (long long)N, (long long)K));
    tu_sym(s, "t", T);
    tu_input_random(s, "x", -0.5f, 1.5f);
    tu_run(s);
    tu_check_tol(s, "y", layer_tol());
    tu_sess_free(s);
    kiln_graph_free(g);
}

/* llama-7b's QKV region: rms_norm, three groups, normal rope on q and k, both caches written. */
static void layer_qkv(int64_t D, int64_t H, int64_t T)
{
    kiln_graph *g = graph();
    const int64_t HD = D / H, CTX = 128;
    kiln_dim M = kiln_sym(g, "t", T);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){M, D});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){M});
    kiln_node nw = tu_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){D}, 0.5f, 1.5f);
    kiln_node h = kiln_rms_norm(g, x, nw, 1e-5f);
    kiln_dim hd3[3] = {M, H, HD}, sd[3] = {H, CTX, HD};
    kiln_node w[3], y[3];
    for (int i = 0; i < 3; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "w%d", i);
        w[i] = tu_weight(g, nm, KILN_DTYPE_F16, 2, (kiln_dim[]){D, D}, -1.0f, 1.0f);
        y[i] = kiln_reshape(g, kiln_matmul(g, h, w[i]), 3, hd3);
        if (i < 2) y[i] = kiln_rope(g, y[i], pos, KILN_ROPE_NORMAL, 1e4f);
    }
    out(g, kiln_kv_scatter(g, kiln_state(g, "kc", KILN_DTYPE_F16, 3, sd), y[1], pos), "kc_out");
    out(g, kiln_kv_scatter(g, kiln_state(g, "vc", KILN_DTYPE_F16, 3, sd), y[2], pos), "vc_out");
    out(g, y[0], "q");
    tu_sess *s = tu_sess_new(g, lab("layer-sized qkv + rope + kv_scatter [%lld, %lld] x3", (long long)T, (long long)D));
    tu_sym(s, "t", T);
    tu_input_random(s, "x", -1.0f, 1.0f);
    int32_t *p = malloc((size_t)T * 4);
    for (int64_t i = 0; i < T; i++) p[i] = (int32_t)((i * 7 + 3) % CTX); /* distinct slots (7 and 128 coprime) */
    tu_input(s, "pos", p, (size_t)T * 4);
    free(p);
    tu_run(s);
    tu_check_tol(s, "q", layer_tol());
    tu_check_state(s, "kc", "kv_scatter", KILN_DTYPE_F16);
    tu_check_state(s, "vc", "kv_scatter", KILN_DTYPE_F16);
    tu_sess_free(s);
    kiln_graph_free(g);
}

Test(ops, matmul_gemm_layer_qkv, .timeout = 300)
{
    GPU_ONLY();
    layer_qkv(4096, 32, 100);
}

Test(ops, matmul_gemm_layer_sized, .timeout = 300)
{
    GPU_ONLY();
    layer_gemm(KILN_DTYPE_F32, 4096, 520, 100, false);
    layer_gemm(KILN_DTYPE_F16, 4096, 520, 300, false);
    layer_gemm(KILN_DTYPE_F32, 4096, 20480, 100, false);
    layer_gemm(KILN_DTYPE_F32, 4096, 11008, 100, true);
    layer_gemm(KILN_DTYPE_F32, 11008, 4096, 100, false);
}

/* codegen.precision f16, on every backend: a swiglu read only by the down matmul is stored as the
 * matmul's x type (f16, bf16 for bf16 weights, f16 for block weights: kiln_graph_narrow_gemm_inputs),
 * a gelu too; a swiglu that is also an output keeps f32. Within tolerance_f16_act of f64. On cpu the
 * swiglu is the fused gate/up pass's store (f32 written into the f16 node overran its buffer). */
static void narrowed_mlp(kiln_dtype wt, bool act_out)
{
    kiln_graph *g = graph();
    const int64_t D = 256, F = 320, T = 40;
    kiln_dim Td = kiln_sym(g, "t", T);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){Td, D});
    kiln_node nw = tu_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){D}, 0.5f, 1.5f);
    kiln_node h = kiln_rms_norm(g, x, nw, 1e-5f);
    kiln_node wg = tu_weight(g, "wg", wt, 2, (kiln_dim[]){F, D}, -0.5f, 0.5f);
    kiln_node wu = tu_weight(g, "wu", wt, 2, (kiln_dim[]){F, D}, -0.5f, 0.5f);
    kiln_node wd = tu_weight(g, "wd", wt, 2, (kiln_dim[]){D, F}, -0.5f, 0.5f);
    kiln_node act = kiln_swiglu(g, kiln_matmul(g, h, wg), kiln_matmul(g, h, wu));
    kiln_node y = kiln_add(g, x, kiln_matmul(g, act, wd));
    kiln_node z = kiln_matmul(g, kiln_gelu(g, y), wg); /* a gelu read by one matmul */
    out(g, y, "y");
    out(g, z, "z");
    if (act_out) out(g, act, "act");
    setenv("KILN_PRECISION", "f16", 1);
    tu_sess *s = tu_sess_new(g, lab("precision f16 mlp, weights %s%s", dn(wt), act_out ? ", swiglu an output" : ""));
    unsetenv("KILN_PRECISION");
    tu_sym(s, "t", T);
    tu_input_random(s, "x", -1.0f, 1.0f);
    tu_run(s);
    /* y and z pass through two and three matmuls: with q8_0 the cpu quantizes x per 32 at each
       (measured NMSE 1.1e-4 against one matmul's 1e-4), so 5x the bound of one */
    const double tol = fmax(1e-8, tu_tol_prec("matmul", wt, KILN_PREC_F16)) * (kiln_dtype_block(wt) > 1 ? 5 : 1);
    tu_check_tol(s, "y", tol);
    tu_check_tol(s, "z", tol);
    const kiln_graph *pg = tu_plan(s)->g; /* the compile's copy: the swiglu and the gelu narrowed */
    int narrowed = 0, want = wt == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16;
    for (uint32_t i = 0; i < pg->n_nodes; i++)
        if (pg->nodes[i].op == KILN_OP_SWIGLU || pg->nodes[i].op == KILN_OP_GELU) narrowed += pg->nodes[i].dtype == want;
    int expect = act_out ? 1 : 2;
    cr_assert_eq(narrowed, expect, "%d of the swiglu and gelu stored as %s", narrowed, dn((kiln_dtype)want));
    if (act_out) tu_check_tol(s, "act", tol);
    tu_sess_free(s);
    kiln_graph_free(g);
}

Test(ops, precision_f16_narrowed_gemm_inputs)
{
    narrowed_mlp(KILN_DTYPE_F16, false);
    narrowed_mlp(KILN_DTYPE_BF16, false);
    narrowed_mlp(KILN_DTYPE_Q8_0, false);
    narrowed_mlp(KILN_DTYPE_F16, true);
}

/* 512 rows: under $KILN_PRECISION=f16 on sm_90 the 256-row tiles, gate/up on 256 x 176 ones (wide:
 * four accumulators a consumer, setmaxnreg) and the O / down shapes */
Test(ops, gemm_layer_512_rows, .timeout = 300)
{
    GPU_ONLY();
    layer_gemm(KILN_DTYPE_F32, 4096, 11008, 512, true);
    layer_gemm(KILN_DTYPE_F32, 4096, 4096, 512, false);
    layer_gemm(KILN_DTYPE_F32, 11008, 4096, 512, false);
}

Test(ops, gemm_long_k_f16x) { GPU_ONLY(); layer_gemm(KILN_DTYPE_F16, 11008, 520, 100, false); }
Test(ops, gemm_long_k_8192) { GPU_ONLY(); layer_gemm(KILN_DTYPE_F32, 8192, 520, 100, false); }
Test(ops, gemm_long_k_narrow) { GPU_ONLY(); layer_gemm(KILN_DTYPE_F32, 11008, 520, 100, false); }
Test(ops, gemm_long_k_6144) { GPU_ONLY(); layer_gemm(KILN_DTYPE_F32, 6144, 520, 100, false); }
Test(ops, gemm_long_k_f16x_4096n) { GPU_ONLY(); layer_gemm(KILN_DTYPE_F16, 11008, 4096, 100, false); }

/* ---------------------------------------------------------------- elementwise */

typedef kiln_node (*unary_fn)(kiln_graph *, kiln_node);
static float g_scale; /* factor for scale_fn */
static kiln_node scale_fn(kiln_graph *g, kiln_node x)
{
    return kiln_scale(g, x, g_scale);
}

/* x [t, D] for every activation dtype and odd D, t bound to 2 and to its max 5. */
static void unary_cases(const char *op, unary_fn f, float lo, float hi)
{
    for (size_t d = 0; d < N_OF(ACT); d++)
        for (size_t k = 0; k < N_OF(ODD); k++) {
            kiln_graph *g = graph();
            kiln_dim T = kiln_sym(g, "t", 5);
            out(g, f(g, kiln_input(g, "x", ACT[d], 2, (kiln_dim[]){T, ODD[k]})), "y");
            tu_sess *s = tu_sess_new(g, lab("%s %s [t<=5, %lld]", op, dn(ACT[d]), (long long)ODD[k]));
            for (int64_t t = 2; t <= 5; t += 3) {
                int64_t n = t * ODD[k];
                float *v = malloc((size_t)n * sizeof *v);
                tu_fill(v, n, lo, hi);
                for (int64_t r = 0; r < t; r++) /* a moderate first element per row keeps the norm non-degenerate */
                    v[r * ODD[k]] = (float)tu_uniform(0.5, 2.0);
                tu_sym(s, "t", t);
                tu_input_f32(s, "x", v, n);
                free(v);
                tu_run(s);
                tu_check(s, "y", op, ACT[d]);
            }
            tu_sess_free(s);
            kiln_graph_free(g);
        }
}

/* Values of +-80 mixed with ordinary ones must give finite results (no inf/inf). */
static void large_inputs(const char *op, unary_fn f)
{
    for (size_t d = 0; d < N_OF(ACT); d++) {
        kiln_graph *g = graph();
        out(g, f(g, kiln_input(g, "x", ACT[d], 1, (kiln_dim[]){64})), "y");
        tu_sess *s = tu_sess_new(g, lab("%s %s large |x|", op, dn(ACT[d])));
        float v[64];
        tu_fill(v, 64, -3, 3);
        for (int i = 0; i < 64; i += 4) {
            v[i] = 80.0f + (float)i;
            v[i + 1] = -80.0f - (float)i;
        }
        tu_input_f32(s, "x", v, 64);
        tu_run(s);
        tu_check(s, "y", op, ACT[d]);
        tu_sess_free(s);
        kiln_graph_free(g);
    }
}

Test(ops, scale)
{
    g_scale = 0.37f;
    unary_cases("scale", scale_fn, -1, 1);
    g_scale = -2.5f;
    unary_cases("scale", scale_fn, -1, 1);
}

Test(ops, silu)
{
    unary_cases("silu", kiln_silu, -6, 6);
    large_inputs("silu", kiln_silu);
}

Test(ops, gelu)
{
    unary_cases("gelu", kiln_gelu, -6, 6);
    large_inputs("gelu", kiln_gelu);
}

Test(ops, sigmoid)
{
    unary_cases("sigmoid", kiln_sigmoid, -6, 6);
    large_inputs("sigmoid", kiln_sigmoid);
}

Test(ops, tanh)
{
    unary_cases("tanh", kiln_tanh, -3, 3); /* both branches of the GPU formula (|x| < 0.625 and above) */
    unary_cases("tanh", kiln_tanh, -0.05f, 0.05f); /* near 0: relative accuracy, not only absolute */
    large_inputs("tanh", kiln_tanh);
}

typedef kiln_node (*binary_fn)(kiln_graph *, kiln_node, kiln_node);

/* a [t, D] with b [D] (broadcast) or b [t, D]; and a [2, 3, 17] with b [3, 17]. */
static void binary_cases(const char *op, binary_fn f, float lo, float hi, bool bcast)
{
    for (size_t d = 0; d < N_OF(ACT); d++)
        for (size_t k = 0; k <= N_OF(ODD); k++)
            for (int same = bcast ? 0 : 1; same < 2; same++) {
                kiln_graph *g = graph();
                kiln_dim T = kiln_sym(g, "t", 5), D = k < N_OF(ODD) ? ODD[k] : 17;
                bool r3 = k == N_OF(ODD);
                kiln_node a = r3 ? kiln_input(g, "a", ACT[d], 3, (kiln_dim[]){2, 3, D}) : kiln_input(g, "a", ACT[d], 2, (kiln_dim[]){T, D});
                kiln_node b = r3 ? (same ? kiln_input(g, "b", ACT[d], 3, (kiln_dim[]){2, 3, D}) : kiln_input(g, "b", ACT[d], 2, (kiln_dim[]){3, D}))
                              : same ? kiln_input(g, "b", ACT[d], 2, (kiln_dim[]){T, D}) : kiln_input(g, "b", ACT[d], 1, &D);
                out(g, f(g, a, b), "y");
                tu_sess *s = tu_sess_new(g, lab("%s %s a %s D=%lld b %s", op, dn(ACT[d]), r3 ? "[2,3,D]" : "[t<=5,D]",
                                                (long long)D, same ? "same" : r3 ? "[3,D]" : "[D]"));
                for (int64_t t = 2; t <= 5; t += 3) {
                    tu_sym(s, "t", t);
                    tu_input_random(s, "a", lo, hi);
                    tu_input_random(s, "b", -1, 1);
                    tu_run(s);
                    tu_check(s, "y", op, ACT[d]);
                }
                tu_sess_free(s);
                kiln_graph_free(g);
            }
}

Test(ops, add)
{
    binary_cases("add", kiln_add, -1, 1, true);
}

Test(ops, mul)
{
    binary_cases("mul", kiln_mul, -1, 1, true);
}

Test(ops, swiglu)
{
    binary_cases("swiglu", kiln_swiglu, -6, 6, false);
}

/* ---------------------------------------------------------------- row ops */

/* rms_norm (nb = 0) or layer_norm over x [t, D]; w/b weights of x's dtype when with_w. */
static void norm_case(const char *op, kiln_dtype dt, int64_t D, bool with_w, float eps, float off)
{
    kiln_graph *g = graph();
    kiln_dim T = kiln_sym(g, "t", 5);
    kiln_node x = kiln_input(g, "x", dt, 2, (kiln_dim[]){T, D});
    kiln_node w = with_w ? tu_weight(g, "w", dt, 1, &D, 0.5f, 1.5f) : KILN_NODE_NONE;
    kiln_node b = with_w ? tu_weight(g, "b", dt, 1, &D, -1, 1) : KILN_NODE_NONE;
    bool rms = strcmp(op, "rms_norm") == 0;
    out(g, rms ? kiln_rms_norm(g, x, w, eps) : kiln_layer_norm(g, x, w, b, eps), "y");
    tu_sess *s = tu_sess_new(g, lab("%s %s [t<=5, %lld]%s eps %g offset %g", op, dn(dt), (long long)D, with_w ? " weighted" : "",
                                    (double)eps, (double)off));
    for (int64_t t = 2; t <= 5; t += 3) {
        tu_sym(s, "t", t);
        tu_input_random(s, "x", off - 1, off + 1);
        tu_run(s);
        tu_check(s, "y", op, dt);
    }
    tu_sess_free(s);
    kiln_graph_free(g);
}

Test(ops, rms_norm)
{
    for (size_t d = 0; d < N_OF(ACT); d++)
        for (size_t k = 0; k < N_OF(ODD); k++) {
            norm_case("rms_norm", ACT[d], ODD[k], true, 1e-5f, 0);
            norm_case("rms_norm", ACT[d], ODD[k], false, 1e-6f, 0);
        }
}

Test(ops, layer_norm)
{
    for (size_t d = 0; d < N_OF(ACT); d++)
        for (size_t k = 0; k < N_OF(ODD); k++) {
            norm_case("layer_norm", ACT[d], ODD[k], true, 1e-5f, 0);
            norm_case("layer_norm", ACT[d], ODD[k], false, 1e-6f, 0);
        }
    for (size_t d = 0; d < N_OF(ACT); d++)
        norm_case("layer_norm", ACT[d], 4097, true, 1e-5f, 8);
}

Test(ops, softmax)
{
    unary_cases("softmax", kiln_softmax, -4, 4);
    unary_cases("softmax", kiln_softmax, -100, 100); /* large logits: needs the max subtraction */
    for (size_t d = 0; d < N_OF(ACT); d++) {         /* masked (-inf) entries, never a whole row */
        kiln_graph *g = graph();
        out(g, kiln_softmax(g, kiln_input(g, "x", ACT[d], 2, (kiln_dim[]){4, 17})), "y");
        tu_sess *s = tu_sess_new(g, lab("softmax %s [4, 17] with -inf", dn(ACT[d])));
        float v[68];
        tu_fill(v, 68, -4, 4);
        for (int i = 0; i < 68; i++)
            if (i % 17 > 17 - (i / 17) * 4 - 2)
                v[i] = -INFINITY;
        tu_input_f32(s, "x", v, 68);
        tu_run(s);
        tu_check(s, "y", "softmax", ACT[d]);
        tu_sess_free(s);
        kiln_graph_free(g);
    }
}

/* ---------------------------------------------------------------- rope */

/* The rotary dims of the next rope_case (kiln_rope_partial; 0: the whole head). */
static int64_t g_rot;

static void rope_case(kiln_dtype dt, kiln_rope_mode mode, int64_t H, int64_t hd, float theta)
{
    kiln_graph *g = graph();
    kiln_dim T = kiln_sym(g, "t", 4);
    kiln_node x = kiln_input(g, "x", dt, 3, (kiln_dim[]){T, H, hd});
    kiln_node pn = kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T);
    out(g, g_rot ? kiln_rope_partial(g, x, pn, mode, theta, NULL, g_rot) : kiln_rope(g, x, pn, mode, theta), "y");
    tu_sess *s = tu_sess_new(g, lab("rope %s %s [t<=4, %lld, %lld] theta %g rot %lld", dn(dt),
                                    mode == KILN_ROPE_NEOX ? "neox" : "normal", (long long)H, (long long)hd,
                                    (double)theta, (long long)(g_rot ? g_rot : hd)));
    for (int64_t t = 2; t <= 4; t += 2) {
        float pos[4];
        for (int i = 0; i < 4; i++)
            pos[i] = (float)tu_randint(0, 4096);
        pos[0] = 0;
        tu_sym(s, "t", t);
        tu_input_random(s, "x", -1, 1);
        tu_input_f32(s, "pos", pos, t);
        tu_run(s);
        tu_check(s, "y", "rope", dt);
    }
    tu_sess_free(s);
    kiln_graph_free(g);
}

Test(ops, rope)
{
    const int64_t hds[] = {2, 8, 64, 128};
    for (size_t d = 0; d < N_OF(ACT); d++)
        for (int m = 0; m < KILN_ROPE_MODE_COUNT; m++)
            for (size_t h = 0; h < N_OF(hds); h++) {
                rope_case(ACT[d], (kiln_rope_mode)m, hds[h] < 64 ? 3 : 1, hds[h], 10000.0f);
                if (hds[h] == 64)
                    rope_case(ACT[d], (kiln_rope_mode)m, 3, hds[h], 1000000.0f);
            }
}

/* Partial rotary (Phi-4-mini 96 of 128, stablelm 16 of 64, an odd pair count 6 of 10): the first rot
 * dims turn with theta^(-2i/rot), the rest pass through exactly (the f64 reference checks both). */
Test(ops, rope_partial)
{
    const int64_t hr[][2] = {{128, 96}, {64, 16}, {10, 6}, {8, 2}};
    for (size_t d = 0; d < N_OF(ACT); d++) /* f32 every shape; f16, bf16 two (lavapipe compiles each case) */
        for (int m = 0; m < KILN_ROPE_MODE_COUNT; m++)
            for (size_t h = d ? (size_t)m : 0; h < N_OF(hr); h += d ? 2 : 1) {
                g_rot = hr[h][1];
                rope_case(ACT[d], (kiln_rope_mode)m, 3, hr[h][0], h % 2 ? 10000.0f : 1000000.0f);
            }
    g_rot = 0;
}

/* q and k of a layer with partial rotary fused into their matmuls' epilogue (gemv for one token,
 * the GEMM for 40 on GPUs): rms_norm, q/k/v, rope on the first rot dims of q and k, both caches
 * written; neox with rot 32 of 64, normal with 18 of 64 (an odd pair count). */
static void qkv_partial(kiln_rope_mode mode, int64_t rot, int64_t T)
{
    kiln_graph *g = graph();
    const int64_t D = 256, H = 4, HD = 64, CTX = 64;
    kiln_dim M = kiln_sym(g, "t", T);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){M, D});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){M});
    kiln_node h = kiln_rms_norm(g, x, tu_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){D}, 0.5f, 1.5f), 1e-5f);
    kiln_dim hd3[3] = {M, H, HD}, sd[3] = {H, CTX, HD};
    kiln_node y[3];
    float mult[32];
    for (int i = 0; i < 32; i++) mult[i] = 1.0f / (float)(1 + i % 5);
    for (int i = 0; i < 3; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "w%d", i);
        kiln_node w = tu_weight(g, nm, KILN_DTYPE_F16, 2, (kiln_dim[]){D, D}, -1.0f, 1.0f);
        y[i] = kiln_reshape(g, kiln_matmul(g, h, w), 3, hd3);
        if (i < 2) y[i] = kiln_rope_partial(g, y[i], pos, mode, 1e4f, i ? mult : NULL, rot);
    }
    out(g, kiln_kv_scatter(g, kiln_state(g, "kc", KILN_DTYPE_F16, 3, sd), y[1], pos), "kc_out");
    out(g, kiln_kv_scatter(g, kiln_state(g, "vc", KILN_DTYPE_F16, 3, sd), y[2], pos), "vc_out");
    out(g, y[0], "q");
    tu_sess *s = tu_sess_new(g, lab("qkv + partial rope %s rot %lld of %lld + kv_scatter, %lld tokens",
                                    mode == KILN_ROPE_NEOX ? "neox" : "normal", (long long)rot, (long long)HD, (long long)T));
    tu_sym(s, "t", T);
    tu_input_random(s, "x", -1.0f, 1.0f);
    int32_t p[40];
    for (int64_t i = 0; i < T; i++) p[i] = (int32_t)((i * 7 + 3) % CTX); /* distinct slots (7 and 64 coprime) */
    tu_input(s, "pos", p, (size_t)T * 4);
    tu_run(s);
    tu_check_tol(s, "q", layer_tol());
    tu_check_state(s, "kc", "kv_scatter", KILN_DTYPE_F16);
    tu_check_state(s, "vc", "kv_scatter", KILN_DTYPE_F16);
    tu_sess_free(s);
    kiln_graph_free(g);
}

Test(ops, rope_partial_fused_into_qkv)
{
    for (int64_t T = 1; T <= 40; T += 39) {
        qkv_partial(KILN_ROPE_NEOX, 32, T);
        qkv_partial(KILN_ROPE_NORMAL, 18, T);
    }
}

/* ---------------------------------------------------------------- attention, kv_scatter */

/* The soft-cap and window of the next attention_runs (kiln_attention_ext; 0: none). */
static float g_softcap;
static int64_t g_window;

/* attention of q [t, H, hd] over K/V caches [Hkv, C, hd] for each (t, n_kv) of tv, fresh q per run. */
static void attention_runs(kiln_dtype dt, int64_t H, int64_t Hkv, int64_t hd, float scale, int64_t C, const int64_t (*tv)[2], size_t n_tv,
                           const char *what)
{
    kiln_graph *g = graph();
    int64_t tmax = 0;
    for (size_t i = 0; i < n_tv; i++) tmax = tv[i][0] > tmax ? tv[i][0] : tmax;
    kiln_dim T = kiln_sym(g, "t", tmax), NKV = kiln_sym(g, "n_kv", C);
    kiln_node q = kiln_input(g, "q", dt, 3, (kiln_dim[]){T, H, hd});
    kiln_node k = kiln_state(g, "k", dt, 3, (kiln_dim[]){Hkv, C, hd}), v = kiln_state(g, "v", dt, 3, (kiln_dim[]){Hkv, C, hd});
    out(g, kiln_attention_ext(g, q, k, v, NKV, scale, g_softcap, g_window), "y");
    tu_sess *s = tu_sess_new(g, lab("%s %s H %lld Hkv %lld hd %lld scale %g softcap %g window %lld", what, dn(dt),
                                    (long long)H, (long long)Hkv, (long long)hd, (double)scale, (double)g_softcap,
                                    (long long)g_window));
    tu_state_random(s, "k", -1, 1);
    tu_state_random(s, "v", -0.5f, 1.5f); /* mean 0.5: outputs (averages of v) are never all ~0 */
    for (size_t i = 0; i < n_tv; i++) {
        tu_sym(s, "t", tv[i][0]);
        tu_sym(s, "n_kv", tv[i][1]);
        tu_input_random(s, "q", -2, 2);
        tu_run(s);
        tu_check(s, "y", "attention", dt);
    }
    tu_sess_free(s);
    kiln_graph_free(g);
}

static void attention_case(kiln_dtype dt, int64_t H, int64_t Hkv, int64_t hd, float scale)
{
    static const int64_t tv[][2] = {{1, 1}, {1, 23}, {4, 17}, {4, 40}, {1, 40}, {3, 3}};
    attention_runs(dt, H, Hkv, hd, scale, 40, tv, N_OF(tv), "attention");
}

Test(ops, attention)
{
    for (size_t d = 0; d < N_OF(ACT); d++) {
        attention_case(ACT[d], 2, 2, 64, 0);
        attention_case(ACT[d], 4, 2, 17, 0);
        attention_case(ACT[d], 3, 1, 1, 0.3f);
        attention_case(ACT[d], 4, 2, 128, 0);
    }
}

/* Prefill: many query rows at once (the GPU backends' tensor-core flash kernel takes f16 and f32
 * caches with head_dim 32..128; bf16 keeps the split kernel), grouped-query ratios 1, 4 and 7,
 * n_tok not a multiple of the 64-row tile, and keys before the first query (n_kv > n_tok). On
 * cuda also 512 and 1000 tokens (lavapipe's MMA emulation is too slow for them). */
Test(ops, attention_prefill)
{
    static const int64_t small[][2] = {{9, 9}, {17, 40}, {70, 70}, {127, 150}, {3, 20}};
    static const int64_t big[][2] = {{512, 512}, {1000, 1000}, {300, 1000}};
    bool gpu = strcmp(tu_backend(), "cuda") == 0;
    for (size_t d = 0; d < N_OF(ACT); d++) {
        attention_runs(ACT[d], 2, 2, 64, 0, 160, small, N_OF(small), "attention prefill");
        attention_runs(ACT[d], 8, 2, 128, 0, 160, small, 3, "attention prefill");
        attention_runs(ACT[d], 7, 1, 32, 0, 160, small + 1, 2, "attention prefill");
        if (gpu) attention_runs(ACT[d], 28, 4, 128, 0, 1024, big, N_OF(big), "attention prefill");
        if (gpu) attention_runs(ACT[d], 8, 4, 256, 0, 1024, big, N_OF(big), "attention prefill"); /* gemma's head_dim */
    }
}

/* Soft-capped scores (gemma 2: cap 50 on scores ~ +-10 here; cap 1.5 deep in tanh's bend) and
 * sliding windows (gemma 2/3, phi3): decode over long caches (the GPU's key splits begin before,
 * inside and after the window), prefill runs (the flash kernel on GPUs: windows ending inside a
 * 64-key tile and across tiles), window 1 and a window longer than the cache. On cuda also long
 * prefills at head_dim 256 and 128 over f16/bf16 caches (gemma's; the warpgroup kernel on sm_90
 * under precision f16). */
Test(ops, attention_softcap_and_window)
{
    static const int64_t dec[][2] = {{1, 1}, {1, 300}, {2, 999}, {1, 1000}};
    static const int64_t pre[][2] = {{9, 9}, {70, 150}, {127, 160}};
    static const struct { float cap; int64_t win; } m[] = {{50.0f, 0}, {1.5f, 33}, {0, 100}, {5.0f, 1}, {2.0f, 5000}};
    static const int64_t big[][2] = {{512, 512}, {1000, 1100}, {300, 1000}};
    bool gpu = strcmp(tu_backend(), "cuda") == 0;
    for (size_t i = 0; i < N_OF(m); i++) {
        g_softcap = m[i].cap, g_window = m[i].win;
        attention_runs(KILN_DTYPE_F32, 4, 2, 64, 0, 1000, dec, N_OF(dec), "attention decode masked");
        attention_runs(i % 2 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16, 4, 2, 64, 0, 1000, dec, N_OF(dec), "attention decode masked");
        attention_runs(i % 2 ? KILN_DTYPE_F32 : KILN_DTYPE_F16, 4, 1, 32, 2.0f, 160, pre, N_OF(pre), "attention prefill masked");
        if (gpu) { /* gemma's shapes: on sm_90 under precision f16 the warpgroup kernel (its tiles before a window skipped) */
            attention_runs(i % 2 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16, 8, 4, 256, 0, 1200, big, N_OF(big), "attention prefill masked");
            attention_runs(i % 2 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16, 8, 2, 128, 0, 1200, big, N_OF(big), "attention prefill masked");
        }
    }
    g_softcap = 0, g_window = 0;
}

/* codegen.precision f16: an attention read only (through the reshape of its heads into
 * rows) as an O matmul's x is stored as that x's 16-bit type (kiln_graph_narrow_gemm_inputs: f16,
 * bf16 for bf16 weights, f16 for block weights), written so by every attention kernel (the
 * warpgroup flash kernel's packed pairs, the decode kernels at a few rows) and read by the O GEMM
 * without its split kernel; plus a residual add. An attention that is also an output keeps f32.
 * On every backend (ref, cpu and vulkan store it through f32 staging or as their kernels' type; the
 * cpu attention wrote f32 into the f16 node before). Within the matmul's tolerance_f16_act of f64. */
static void narrowed_attention(kiln_dtype wt, kiln_dtype cd, int64_t hd, bool att_out)
{
    kiln_graph *g = graph();
    const int64_t H = 8, Hkv = 4, C = 300, D = H * hd, Tm = 200;
    kiln_dim T = kiln_sym(g, "t", Tm), NKV = kiln_sym(g, "n_kv", C);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, H, hd});
    kiln_node k = kiln_state(g, "k", cd, 3, (kiln_dim[]){Hkv, C, hd}), v = kiln_state(g, "v", cd, 3, (kiln_dim[]){Hkv, C, hd});
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, D});
    kiln_node a = kiln_attention(g, q, k, v, NKV, 0);
    kiln_node wo = tu_weight(g, "wo", wt, 2, (kiln_dim[]){D, D}, -0.1f, 0.1f);
    out(g, kiln_add(g, x, kiln_matmul(g, kiln_reshape(g, a, 2, (kiln_dim[]){T, D}), wo)), "y");
    if (att_out) out(g, a, "a");
    setenv("KILN_PRECISION", "f16", 1);
    tu_sess *s = tu_sess_new(g, lab("precision f16 attention + O, weights %s, cache %s, hd %lld%s", dn(wt), dn(cd), (long long)hd,
                                    att_out ? ", attention an output" : ""));
    unsetenv("KILN_PRECISION");
    tu_state_random(s, "k", -1, 1);
    tu_state_random(s, "v", -0.5f, 1.5f);
    static const int64_t tv[][2] = {{200, 260}, {130, 130}, {3, 290}, {1, 17}}, small[][2] = {{40, 60}, {2, 30}};
    bool gpu = strcmp(tu_backend(), "cuda") == 0; /* the shapes the GPU kernels split; elsewhere (lavapipe: minutes) small ones */
    const double tol = fmax(1e-8, tu_tol_prec("matmul", wt, KILN_PREC_F16)) * (kiln_dtype_block(wt) > 1 ? 5 : 1);
    for (size_t i = 0; i < (gpu ? N_OF(tv) : N_OF(small)); i++) {
        tu_sym(s, "t", gpu ? tv[i][0] : small[i][0]);
        tu_sym(s, "n_kv", gpu ? tv[i][1] : small[i][1]);
        tu_input_random(s, "q", -2, 2);
        tu_input_random(s, "x", -1, 1);
        tu_run(s);
        tu_check_tol(s, "y", tol);
        if (att_out) tu_check_tol(s, "a", tu_tol_prec("attention", cd, KILN_PREC_F16)); /* f16 precision's attention */
    }
    const kiln_graph *pg = tu_plan(s)->g;
    int want = wt == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16, narrowed = 0;
    for (uint32_t i = 0; i < pg->n_nodes; i++) narrowed += pg->nodes[i].op == KILN_OP_ATTENTION && pg->nodes[i].dtype == want;
    cr_assert_eq(narrowed, !att_out, "attention stored as %s: %d", dn((kiln_dtype)want), narrowed);
    tu_sess_free(s);
    kiln_graph_free(g);
}

Test(ops, precision_f16_narrowed_attention)
{
    bool gpu = strcmp(tu_backend(), "cuda") == 0;
    narrowed_attention(KILN_DTYPE_F16, KILN_DTYPE_F16, 128, false);
    narrowed_attention(KILN_DTYPE_BF16, KILN_DTYPE_BF16, 64, false);
    if (!gpu) return;
    narrowed_attention(KILN_DTYPE_Q8_0, KILN_DTYPE_F16, 64, false);
    narrowed_attention(KILN_DTYPE_F16, KILN_DTYPE_F32, 64, false); /* f32 cache: the mma.sync flash kernel */
    narrowed_attention(KILN_DTYPE_F16, KILN_DTYPE_F16, 128, true);
}

/* Decode: each run writes one K/V row at pos = step and attends over n_kv = step + 1. */
Test(ops, attention_decode_sequence)
{
    for (size_t d = 0; d < N_OF(ACT); d++) {
        kiln_dtype dt = ACT[d];
        const int64_t H = 4, Hkv = 2, hd = 64, C = 16;
        kiln_graph *g = graph();
        kiln_dim NKV = kiln_sym(g, "n_kv", C);
        kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){1});
        kiln_node k = kiln_state(g, "k", dt, 3, (kiln_dim[]){Hkv, C, hd}), v = kiln_state(g, "v", dt, 3, (kiln_dim[]){Hkv, C, hd});
        kiln_node ks = kiln_kv_scatter(g, k, kiln_input(g, "kn", dt, 3, (kiln_dim[]){1, Hkv, hd}), pos);
        kiln_node vs = kiln_kv_scatter(g, v, kiln_input(g, "vn", dt, 3, (kiln_dim[]){1, Hkv, hd}), pos);
        out(g, kiln_attention(g, kiln_input(g, "q", dt, 3, (kiln_dim[]){1, H, hd}), ks, vs, NKV, 0), "y");
        tu_sess *s = tu_sess_new(g, lab("decode sequence %s", dn(dt)));
        for (int step = 0; step < 3; step++) {
            float p = (float)step;
            tu_sym(s, "n_kv", step + 1);
            tu_input_f32(s, "pos", &p, 1);
            tu_input_random(s, "q", -2, 2);
            tu_input_random(s, "kn", -1, 1);
            tu_input_random(s, "vn", -1, 1);
            tu_run(s);
            tu_check(s, "y", "attention", dt);
        }
        tu_check_state(s, "k", "kv_scatter", dt);
        tu_check_state(s, "v", "kv_scatter", dt);
        tu_sess_free(s);
        kiln_graph_free(g);
    }
}

/* Random distinct positions in [0, C), including 0 and C - 1. */
static void distinct_positions(float *p, int n, int64_t C)
{
    for (int i = 0; i < n; i++) {
        bool dup;
        do {
            p[i] = i == 0 ? 0.0f : i == 1 ? (float)(C - 1) : (float)tu_randint(0, C);
            dup = false;
            for (int j = 0; j < i; j++)
                dup |= p[j] == p[i];
        } while (dup);
    }
}

Test(ops, kv_scatter)
{
    const int64_t Hkv = 2, C = 16, hd = 8;
    for (size_t d = 0; d < N_OF(ACT); d++)
        for (int same = 0; same < 2; same++) {
            kiln_dtype st = ACT[d], rt = same ? st : KILN_DTYPE_F32;
            kiln_graph *g = graph();
            kiln_dim T = kiln_sym(g, "t", 4);
            kiln_node k = kiln_state(g, "k", st, 3, (kiln_dim[]){Hkv, C, hd});
            kiln_node rows = kiln_input(g, "rows", rt, 3, (kiln_dim[]){T, Hkv, hd});
            out(g, kiln_kv_scatter(g, k, rows, kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T)), "y");
            tu_sess *s = tu_sess_new(g, lab("kv_scatter state %s rows %s", dn(st), dn(rt)));
            double tol = same ? 0.0 : tu_tol("kv_scatter", st); /* rows of the state's dtype copy exactly */
            tu_state_random(s, "k", -1, 1);
            for (int64_t t = 3; t <= 4; t++) {
                float p[4];
                distinct_positions(p, (int)t, C);
                tu_sym(s, "t", t);
                tu_input_random(s, "rows", -1, 1);
                tu_input_f32(s, "pos", p, t);
                tu_run(s);
                tu_check_tol(s, "y", tol);
                tu_check_state(s, "k", "kv_scatter", same ? KILN_DTYPE_F32 : st);
            }
            float bad[3] = {1, (float)C, 2}; /* out of range: the run fails, the plan stays usable */
            tu_sym(s, "t", 3);
            tu_input_f32(s, "pos", bad, 3);
            cr_assert(tu_run_status(s) != KILN_OK, "kv_scatter %s: position %lld accepted", dn(st), (long long)C);
            tu_sess_free(s);
            kiln_graph_free(g);
        }
}

/* ---------------------------------------------------------------- get_rows, argmax, cast */

static void get_rows_case(kiln_dtype wt)
{
    const int64_t V = 50;
    int64_t blk = kiln_dtype_block(wt);
    const int64_t plain_d[] = {1, 3, 17}, q8_d[] = {32, 96, 256}, k_d[] = {256, 512, 256};
    const int64_t *ds = blk == 1 ? plain_d : blk == 32 ? q8_d : k_d;
    for (int k = 0; k < (blk == 256 ? 2 : 3); k++) {
        kiln_graph *g = graph();
        kiln_dim n = kiln_sym(g, "n", 6);
        kiln_node tab = tu_weight(g, "table", wt, 2, (kiln_dim[]){V, ds[k]}, -1, 1);
        out(g, kiln_get_rows(g, tab, kiln_input(g, "ids", KILN_DTYPE_I32, 1, &n)), "y");
        tu_sess *s = tu_sess_new(g, lab("get_rows %s [%lld, %lld]", dn(wt), (long long)V, (long long)ds[k]));
        for (int64_t t = 3; t <= 6; t += 3) {
            float ids[6] = {0, (float)(V - 1), 0, (float)tu_randint(0, V), (float)tu_randint(0, V), (float)(V - 1)};
            tu_sym(s, "n", t);
            tu_input_f32(s, "ids", ids, t);
            tu_run(s);
            tu_check(s, "y", "get_rows", wt);
        }
        float bad[3] = {1, (float)V, 2};
        tu_sym(s, "n", 3);
        tu_input_f32(s, "ids", bad, 3);
        cr_assert(tu_run_status(s) != KILN_OK, "get_rows %s: id %lld accepted", dn(wt), (long long)V);
        tu_sess_free(s);
        kiln_graph_free(g);
    }
}

Test(ops, get_rows)
{
    for (size_t w = 0; w < N_OF(WTS); w++) get_rows_case(WTS[w]);
}

Test(ops, get_rows_more_formats)
{
    for (size_t w = 0; w < N_OF(MORE_WTS); w++) get_rows_case(MORE_WTS[w]);
}

/* Rows of activations (a table with symbolic rows, as a model's last-token pick before its head). */
Test(ops, get_rows_of_activations)
{
    for (size_t d = 0; d < N_OF(ACT); d++) {
        kiln_graph *g = graph();
        kiln_dim T = kiln_sym(g, "t", 9), n = kiln_sym(g, "n", 3);
        kiln_node x = kiln_input(g, "x", ACT[d], 2, (kiln_dim[]){T, 40});
        out(g, kiln_get_rows(g, x, kiln_input(g, "ids", KILN_DTYPE_I32, 1, &n)), "y");
        tu_sess *s = tu_sess_new(g, lab("get_rows of activations %s", dn(ACT[d])));
        const int64_t tv[] = {9, 4};
        for (int i = 0; i < 2; i++) {
            float ids[3] = {(float)(tv[i] - 1), 0, (float)tu_randint(0, tv[i] - 1)};
            tu_sym(s, "t", tv[i]);
            tu_sym(s, "n", 3);
            tu_input_random(s, "x", -1, 1);
            tu_input_f32(s, "ids", ids, 3);
            tu_run(s);
            tu_check(s, "y", "get_rows", ACT[d]);
        }
        float bad[3] = {0, 4, 1}; /* row 4 of 4 */
        tu_input_f32(s, "ids", bad, 3);
        cr_assert(tu_run_status(s) != KILN_OK, "get_rows of activations %s: id 4 of 4 rows accepted", dn(ACT[d]));
        tu_sess_free(s);
        kiln_graph_free(g);
    }
}

Test(ops, argmax)
{
    for (size_t d = 0; d < N_OF(ACT); d++)
        for (size_t k = 0; k < N_OF(ODD); k++) {
            int64_t N = ODD[k];
            kiln_graph *g = graph();
            kiln_dim T = kiln_sym(g, "t", 6);
            out(g, kiln_argmax(g, kiln_input(g, "x", ACT[d], 2, (kiln_dim[]){T, N})), "y");
            tu_sess *s = tu_sess_new(g, lab("argmax %s [t<=6, %lld]", dn(ACT[d]), (long long)N));
            for (int64_t t = 3; t <= 6; t += 3) {
                float *v = malloc((size_t)(t * N) * sizeof *v);
                tu_fill(v, t * N, -1, 1);
                v[0 * N + 0] = 5;                           /* row 0: max at index 0 */
                v[1 * N + N - 1] = 5;                       /* row 1: max at the last index */
                for (int64_t i = 0; i < N; i++)             /* row 2: all negative, tie at N/3 and 2N/3 */
                    v[2 * N + i] = -2.0f - (float)(i % 7) * 0.25f;
                v[2 * N + N / 3] = v[2 * N + 2 * N / 3] = -0.5f;
                tu_sym(s, "t", t);
                tu_input_f32(s, "x", v, t * N);
                free(v);
                tu_run(s);
                tu_check(s, "y", "argmax", ACT[d]);
            }
            tu_sess_free(s);
            kiln_graph_free(g);
        }
    kiln_graph *g = graph(); /* rank 1 gives [1] */
    out(g, kiln_argmax(g, kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){17})), "y");
    tu_sess *s = tu_sess_new(g, "argmax f32 rank 1");
    tu_input_random(s, "x", -1, 1);
    tu_run(s);
    tu_check(s, "y", "argmax", KILN_DTYPE_F32);
    tu_sess_free(s);
    kiln_graph_free(g);
}

/* moe_route and scale_rows run on every backend (GPUs: the row template, src/codegen/lower_rows.c). */
Test(ops, moe_route)
{
    const int64_t E[] = {1, 8, 60, 128};
    for (size_t e = 0; e < N_OF(E); e++)
        for (int norm = 0; norm < 2; norm++) {
            const int ks[] = {1, 2, 8, (int)E[e]};
            for (size_t ki = 0; ki < N_OF(ks); ki++) {
                if (ks[ki] > E[e] || (ki < 3 && ks[ki] >= E[e])) continue; /* k = E once */
                kiln_graph *g = graph();
                kiln_dim T = kiln_sym(g, "t", 6);
                out(g, kiln_moe_route(g, kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, E[e]}), ks[ki], norm), "y");
                tu_sess *s = tu_sess_new(g, lab("moe_route [t<=6, %lld] k %d norm %d", (long long)E[e], ks[ki], norm));
                for (int64_t t = 3; t <= 6; t += 3) {
                    float *v = malloc((size_t)(t * E[e]) * sizeof *v);
                    tu_fill(v, t * E[e], -4, 4);
                    for (int64_t i = 0; i < E[e]; i++) v[E[e] + i] = 1.5f; /* row 1: all tied, the first k kept */
                    for (int64_t i = 0; i < E[e]; i++) v[2 * E[e] + i] *= 100; /* row 2: large logits */
                    tu_sym(s, "t", t);
                    tu_input_f32(s, "x", v, t * E[e]);
                    free(v);
                    tu_run(s);
                    tu_check(s, "y", "moe_route", KILN_DTYPE_F32);
                }
                tu_sess_free(s);
                kiln_graph_free(g);
            }
        }
}

Test(ops, scale_rows)
{
    const int64_t D[] = {1, 17, 4097};
    for (size_t d = 0; d < N_OF(D); d++)
        for (int col = 0; col < 8; col += 7) {
            kiln_graph *g = graph();
            kiln_dim T = kiln_sym(g, "t", 6);
            kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, D[d]});
            out(g, kiln_scale_rows(g, x, kiln_input(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){T, 8}), col), "y");
            tu_sess *s = tu_sess_new(g, lab("scale_rows [t<=6, %lld] w [t, 8] col %d", (long long)D[d], col));
            for (int64_t t = 3; t <= 6; t += 3) {
                float w[48];
                tu_fill(w, 48, -2, 2);
                w[8 + col] = 0; /* row 1: an expert not routed gives a row of 0 */
                tu_sym(s, "t", t);
                tu_input_random(s, "x", -1, 1);
                tu_input_f32(s, "w", w, t * 8);
                tu_run(s);
                tu_check(s, "y", "scale_rows", KILN_DTYPE_F32);
            }
            tu_sess_free(s);
            kiln_graph_free(g);
        }
}

/* A router's weights for moe_matmul, T rows of E: k experts drawn at random get weights in
 * [0.05, 1], the rest 0. Row 1: the first k tied at 0.5 (the lower index first); row 2 (when
 * k > 1): one expert only, the other slots taken by zeros (the lowest free indices, weight 0). */
static void route_rows(float *r, int64_t T, int64_t E, int k)
{
    for (int64_t t = 0; t < T; t++) {
        float *rt = r + t * E;
        for (int64_t j = 0; j < E; j++) rt[j] = 0;
        for (int s = 0; s < k; s++) {
            int64_t j;
            do j = tu_randint(0, E); while (rt[j] != 0);
            rt[j] = (float)tu_uniform(0.05, 1.0);
        }
        if (t == 1) for (int64_t j = 0; j < E; j++) rt[j] = j < k ? 0.5f : 0;
        if (t == 2 && k > 1) for (int64_t j = 0; j < E; j++) rt[j] = j == E - 1 ? 1.0f : 0;
    }
}

/* moe_matmul over w [E, N, K] of dtype wt and r [t, E]: per slot (x [t, K] shared, or [t, k, K]
 * with per_slot) or summed (sum). x and w in [-0.5, 1.5] (outputs do not cancel), r an input so the
 * f64 reference picks the same experts. */
static void moe_case(kiln_dtype xt, kiln_dtype wt, int64_t E, int k, int64_t N, int64_t K, int64_t tmax, bool per_slot,
                     bool sum)
{
    kiln_graph *g = graph();
    kiln_dim T = kiln_sym(g, "t", tmax);
    kiln_node x = per_slot ? kiln_input(g, "x", xt, 3, (kiln_dim[]){T, k, K}) : kiln_input(g, "x", xt, 2, (kiln_dim[]){T, K});
    kiln_node w = tu_weight(g, "w", wt, 3, (kiln_dim[]){E, N, K}, -0.5f, 1.5f);
    out(g, kiln_moe_matmul(g, x, w, kiln_input(g, "r", KILN_DTYPE_F32, 2, (kiln_dim[]){T, E}), k, sum), "y");
    tu_sess *s = tu_sess_new(g, lab("moe_matmul x %s%s w %s [%lld, %lld, %lld] k %d sum %d t<=%lld", dn(xt),
                                    per_slot ? " per slot" : "", dn(wt), (long long)E, (long long)N, (long long)K, k, sum,
                                    (long long)tmax));
    const int64_t tv[] = {1, 3, tmax};
    for (size_t i = 0; i < N_OF(tv); i++) {
        if (tv[i] > tmax || (i == 2 && tmax <= 3)) continue;
        float *r = malloc(sizeof(float) * (size_t)(tv[i] * E));
        route_rows(r, tv[i], E, k);
        tu_sym(s, "t", tv[i]);
        tu_input_random(s, "x", -0.5f, 1.5f);
        tu_input_f32(s, "r", r, tv[i] * E);
        free(r);
        tu_run(s);
        tu_check(s, "y", "moe_matmul", wt);
    }
    tu_sess_free(s);
    kiln_graph_free(g);
}

/* The GPU kernel (lower_moe.c) on fewer shapes (lavapipe compiles each plan for seconds): both x
 * forms, sum 0/1, E up to 128, block formats, bf16 x; a K its format's chunks do not divide (f32: 4)
 * is refused naming the op, never run. */
static void moe_gpu_cases(void)
{
    for (int mode = 0; mode < 3; mode++) moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 8, 2, 17, 64, 6, mode == 1, mode > 0);
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 128, 8, 17, 64, 6, false, true);
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 8, 2, 100, 64, 6, false, false); /* several column blocks, a partial one */
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 8, 2, 100, 64, 6, true, true);
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 60, 60, 9, 64, 3, true, true); /* k = E */
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_Q8_0, 8, 2, 17, 96, 6, true, true);
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_Q4_K, 16, 4, 17, 256, 6, false, false);
    moe_case(KILN_DTYPE_BF16, KILN_DTYPE_F16, 16, 4, 17, 64, 6, true, false);
    kiln_graph *g = graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 33});
    kiln_node w = tu_weight(g, "w", KILN_DTYPE_F32, 3, (kiln_dim[]){4, 8, 33}, -1, 1);
    out(g, kiln_moe_matmul(g, x, w, kiln_input(g, "r", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 4}), 2, true), "y");
    kiln_ctx *ctx = NULL;
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_status st = kiln_compile(ctx, g, &(kiln_compile_options){.backend = tu_backend()}, &p);
    cr_assert(st == KILN_ERR_UNSUPPORTED && !p && strstr(kiln_ctx_error(ctx), "moe_matmul"), "moe_matmul K = 33 on %s: %s: %s",
              tu_backend(), kiln_status_str(st), kiln_ctx_error(ctx));
    kiln_ctx_free(ctx);
    kiln_graph_free(g);
}

Test(ops, moe_matmul)
{
    if (gpu_backend()) return moe_gpu_cases();
    const int64_t E[] = {1, 8, 60, 128};
    for (size_t e = 0; e < N_OF(E); e++) {
        const int ks[] = {1, 2, 8, (int)E[e]};
        for (size_t ki = 0; ki < N_OF(ks); ki++) {
            if (ks[ki] > E[e] || (ki < 3 && ks[ki] >= E[e])) continue; /* k = E once */
            for (int mode = 0; mode < 3; mode++) /* shared x per slot, per-slot x summed, shared x summed */
                moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, E[e], ks[ki], 17, 33, 6, mode == 1, mode > 0);
        }
    }
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 8, 2, 64, 256, 40, false, false); /* several rows per expert: a GEMM */
    moe_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 8, 2, 64, 256, 40, true, true);
    for (size_t w = 1; w < N_OF(WTS); w++) {
        int64_t K = kiln_dtype_block(WTS[w]) == 256 ? 256 : 96;
        moe_case(KILN_DTYPE_F32, WTS[w], 8, 2, 17, K, 6, false, false);
        moe_case(KILN_DTYPE_F32, WTS[w], 8, 2, 17, K, 40, true, true);
    }
    moe_case(KILN_DTYPE_F16, KILN_DTYPE_Q4_K, 16, 4, 17, 512, 6, false, true);
    moe_case(KILN_DTYPE_BF16, KILN_DTYPE_F32, 16, 4, 17, 33, 6, true, false);
}

/* Experts no token routes to are never read: their weights are NaN here, and the dense form (every
 * expert times its weight 0) would give NaN. */
Test(ops, moe_matmul_reads_only_routed_experts)
{
    const int64_t E = 8, N = 17, K = 64;
    float *wv = malloc(sizeof(float) * (size_t)(E * N * K));
    tu_fill(wv, E * N * K, -1, 1);
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; e != 2 && e != 5 && i < N * K; i++) wv[e * N * K + i] = NAN;
    kiln_graph *g = graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){1, K});
    kiln_node w = kiln_weight(g, "w", KILN_DTYPE_F32, 3, (kiln_dim[]){E, N, K}, wv, KILN_WEIGHT_COPY);
    out(g, kiln_moe_matmul(g, x, w, kiln_input(g, "r", KILN_DTYPE_F32, 2, (kiln_dim[]){1, E}), 2, true), "y");
    tu_sess *s = tu_sess_new(g, "moe_matmul: NaN in the experts not routed");
    const float r[8] = {0, 0, 0.7f, 0, 0, 0.3f, 0, 0};
    tu_input_random(s, "x", -1, 1);
    tu_input_f32(s, "r", r, E);
    tu_run(s);
    tu_check(s, "y", "moe_matmul", KILN_DTYPE_F32);
    tu_sess_free(s);
    kiln_graph_free(g);
    free(wv);
}

Test(ops, cast)
{
    for (size_t a = 0; a < N_OF(PLAIN); a++)
        for (size_t b = 0; b < N_OF(PLAIN); b++) {
            kiln_dtype from = PLAIN[a], to = PLAIN[b];
            kiln_graph *g = graph();
            kiln_dim T = kiln_sym(g, "t", 5);
            out(g, kiln_cast(g, kiln_input(g, "x", from, 2, (kiln_dim[]){T, 17}), to), "y");
            tu_sess *s = tu_sess_new(g, lab("cast %s -> %s", dn(from), dn(to)));
            for (int64_t t = 2; t <= 5; t += 3) {
                tu_sym(s, "t", t);
                tu_input_random(s, "x", from == KILN_DTYPE_I32 ? -3000 : -100, from == KILN_DTYPE_I32 ? 3000 : 100);
                tu_run(s);
                tu_check(s, "y", "cast", to);
            }
            float halves[34]; /* halves round to even when going to i32 */
            for (int i = 0; i < 34; i++)
                halves[i] = (float)(i - 17) + 0.5f;
            tu_sym(s, "t", 2);
            tu_input_f32(s, "x", halves, 34);
            tu_run(s);
            tu_check(s, "y", "cast", to);
            tu_sess_free(s);
            kiln_graph_free(g);
        }
}

/* ---------------------------------------------------------------- layout ops */

/* x [r0, r1, r2] (r0 may be the symbol t) -> f(x); checked exactly for every plain dtype. */
typedef kiln_node (*layout_fn)(kiln_graph *, kiln_node, kiln_dim t);

static void layout_case(const char *op, const char *what, layout_fn f, int rank, const kiln_dim *dims, bool sym)
{
    for (size_t d = 0; d < N_OF(PLAIN); d++) {
        kiln_graph *g = graph();
        kiln_dim T = kiln_sym(g, "t", 5), dd[KILN_MAX_RANK];
        for (int i = 0; i < rank; i++)
            dd[i] = sym && i == 0 ? T : dims[i];
        out(g, f(g, kiln_input(g, "x", PLAIN[d], rank, dd), T), "y");
        tu_sess *s = tu_sess_new(g, lab("%s %s %s", op, what, dn(PLAIN[d])));
        for (int64_t t = 2; t <= 5; t += 3) {
            tu_sym(s, "t", t);
            tu_input_random(s, "x", -1000, 1000);
            tu_run(s);
            tu_check(s, "y", op, PLAIN[d]);
        }
        tu_sess_free(s);
        kiln_graph_free(g);
    }
}

static kiln_node rs_sym(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_reshape(g, x, 3, (kiln_dim[]){t, 2, 3}); }
static kiln_node rs_flat(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_reshape(g, x, 1, (kiln_dim[]){24}); }
static kiln_node vw_mid(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_view(g, x, 2, (kiln_dim[]){2, 17}, 17); }
static kiln_node vw_end(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_view(g, x, 1, (kiln_dim[]){34}, 34); }
static kiln_node vw_head(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_view(g, x, 1, (kiln_dim[]){3}, 0); }
static kiln_node tr01(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_transpose(g, x, 0, 1); }
static kiln_node tr12(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_transpose(g, x, 1, 2); }
static kiln_node tr02(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_transpose(g, x, 0, 2); }
static kiln_node tr11(kiln_graph *g, kiln_node x, kiln_dim t) { return kiln_transpose(g, x, 1, 1); }

Test(ops, reshape)
{
    layout_case("reshape", "[t,6]->[t,2,3]", rs_sym, 2, (kiln_dim[]){0, 6}, true);
    layout_case("reshape", "[4,6]->[24]", rs_flat, 2, (kiln_dim[]){4, 6}, false);
}

Test(ops, view)
{
    layout_case("view", "[4,17] off 17 -> [2,17]", vw_mid, 2, (kiln_dim[]){4, 17}, false);
    layout_case("view", "[4,17] off 34 -> [34]", vw_end, 2, (kiln_dim[]){4, 17}, false);
    layout_case("view", "[4,17] off 0 -> [3]", vw_head, 2, (kiln_dim[]){4, 17}, false);
}

Test(ops, transpose)
{
    const kiln_dim d[] = {3, 17, 5};
    layout_case("transpose", "[3,17,5] (0,1)", tr01, 3, d, false);
    layout_case("transpose", "[3,17,5] (1,2)", tr12, 3, d, false);
    layout_case("transpose", "[3,17,5] (0,2)", tr02, 3, d, false);
    layout_case("transpose", "[t,3,5] (0,1)", tr01, 3, (kiln_dim[]){0, 3, 5}, true);
    layout_case("transpose", "[t,3,5] (1,2)", tr12, 3, (kiln_dim[]){0, 3, 5}, true);
    layout_case("transpose", "[3,17,5] (1,1)", tr11, 3, d, false);
}

Test(ops, concat)
{
    const struct { int axis; kiln_dim a[2], b[2]; bool sym; } c[] = {
        {1, {0, 3}, {0, 5}, true}, {0, {2, 17}, {3, 17}, false}, {0, {1, 1}, {1, 1}, false}, {1, {4, 1}, {4, 16}, false}};
    for (size_t i = 0; i < N_OF(c); i++)
        for (size_t d = 0; d < N_OF(PLAIN); d++) {
            kiln_graph *g = graph();
            kiln_dim T = kiln_sym(g, "t", 5);
            kiln_dim da[2] = {c[i].sym ? T : c[i].a[0], c[i].a[1]}, db[2] = {c[i].sym ? T : c[i].b[0], c[i].b[1]};
            kiln_node a = kiln_input(g, "a", PLAIN[d], 2, da), b = kiln_input(g, "b", PLAIN[d], 2, db);
            out(g, kiln_concat(g, a, b, c[i].axis), "y");
            tu_sess *s = tu_sess_new(g, lab("concat %s case %zu axis %d", dn(PLAIN[d]), i, c[i].axis));
            for (int64_t t = 2; t <= 5; t += 3) {
                tu_sym(s, "t", t);
                tu_input_random(s, "a", -1000, 1000);
                tu_input_random(s, "b", -1000, 1000);
                tu_run(s);
                tu_check(s, "y", "concat", PLAIN[d]);
            }
            tu_sess_free(s);
            kiln_graph_free(g);
        }
}

/* ---------------------------------------------------------------- the oracle itself */

static const double *ref_eval(ref64 *r, const kiln_binding *b, size_t n, const char *name)
{
    char err[256];
    cr_assert(ref64_run(r, b, n, err, sizeof err) == 0, "ref64_run: %s", err);
    const double *y = ref64_output(r, name, NULL, NULL);
    cr_assert(y, "ref64 has no output %s", name);
    return y;
}

/* Hand-computed values: guards ref64 against sharing a mistake with the kernels it judges. */
Test(ref64, hand_computed_values)
{
    kiln_graph *g = graph();
    float xv[2] = {0.0f, 1.0986122886681098f}; /* softmax -> 1/4, 3/4 (ln 3) */
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){2});
    out(g, kiln_softmax(g, x), "sm");
    out(g, kiln_layer_norm(g, kiln_scale(g, x, 2.0f), KILN_NODE_NONE, KILN_NODE_NONE, 0.0f), "ln"); /* -> -1, 1 */
    out(g, kiln_argmax(g, kiln_input(g, "a", KILN_DTYPE_F32, 1, (kiln_dim[]){4})), "am");
    out(g, kiln_cast(g, kiln_input(g, "c", KILN_DTYPE_F32, 1, (kiln_dim[]){3}), KILN_DTYPE_I32), "ci");
    kiln_node p = kiln_input(g, "p", KILN_DTYPE_I32, 1, (kiln_dim[]){1});
    out(g, kiln_rope(g, kiln_input(g, "r", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 1, 4}), p, KILN_ROPE_NEOX, 100.0f), "rp");
    kiln_node k = kiln_state(g, "k", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 4, 1});
    kiln_node ks = kiln_kv_scatter(g, k, kiln_input(g, "kr", KILN_DTYPE_F32, 3, (kiln_dim[]){2, 1, 1}),
                                   kiln_input(g, "kp", KILN_DTYPE_I32, 1, (kiln_dim[]){2}));
    out(g, kiln_attention(g, kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){2, 1, 1}), ks, ks, 3, 1.0f), "at");
    ref64 *r = ref64_new(g);
    cr_assert(r);
    float av[4] = {1, 7, 7, -2}, cv[3] = {2.5f, -2.5f, 3.5f}, rv[4] = {1, 2, 0, 0}, kr[2] = {3, 5}, qv[2] = {0, 0};
    int32_t pv[1] = {2}, kp[2] = {1, 2};
    kiln_binding b[] = {{"x", xv, 8, 0, false}, {"a", av, 16, 0, false}, {"c", cv, 12, 0, false}, {"r", rv, 16, 0, false}, {"p", pv, 4, 0, false},
                        {"kr", kr, 8, 0, false}, {"kp", kp, 8, 0, false}, {"q", qv, 8, 0, false}};
    const double *sm = ref_eval(r, b, 8, "sm");
    cr_assert(fabs(sm[0] - 0.25) < 1e-7 && fabs(sm[1] - 0.75) < 1e-7, "softmax %g %g", sm[0], sm[1]);
    const double *ln = ref64_output(r, "ln", NULL, NULL);
    cr_assert(fabs(ln[0] + 1) < 1e-12 && fabs(ln[1] - 1) < 1e-12, "layer_norm %g %g", ln[0], ln[1]);
    cr_assert_eq(ref64_output(r, "am", NULL, NULL)[0], 1.0, "argmax takes the first of tied maxima");
    const double *ci = ref64_output(r, "ci", NULL, NULL);
    cr_assert(ci[0] == 2 && ci[1] == -2 && ci[2] == 4, "cast halves to even: %g %g %g", ci[0], ci[1], ci[2]);
    const double *rp = ref64_output(r, "rp", NULL, NULL); /* neox pairs (0,2), (1,3); angles 2, 2/10 */
    cr_assert(fabs(rp[0] - cos(2.0)) < 1e-12 && fabs(rp[2] - sin(2.0)) < 1e-12, "rope pair 0: %g %g", rp[0], rp[2]);
    cr_assert(fabs(rp[1] - 2 * cos(0.2)) < 1e-12 && fabs(rp[3] - 2 * sin(0.2)) < 1e-12, "rope pair 1: %g %g", rp[1], rp[3]);
    /* cache [0, 3, 5, 0]; n_kv 3, 2 queries at positions 1, 2 with zero scores: means of v[0..1], v[0..2] */
    const double *at = ref64_output(r, "at", NULL, NULL);
    cr_assert(fabs(at[0] - 1.5) < 1e-12 && fabs(at[1] - 8.0 / 3) < 1e-12, "attention %g %g", at[0], at[1]);
    const double *st = ref64_state(r, "k", NULL);
    cr_assert(st[0] == 0 && st[1] == 3 && st[2] == 5 && st[3] == 0, "kv_scatter wrote the state");
    ref64_free(r);
    kiln_graph_free(g);
}
