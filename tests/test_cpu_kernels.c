/* Tests of the CPU backend's kernel layer (src/backends/cpu): every matmul dtype x every ISA path
 * this machine has (forced through the API) x odd sizes x misaligned buffers x 1/2/3 threads,
 * fused prologue/epilogues, attention (decode with KV splits, prefill, GQA, f32/f16 caches), row
 * kernels and the pool. References are f64 loops over the dequantized weights on fresh random
 * data; outputs are poisoned first and every element is checked against an error bound. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cpu/cpu.h"
#include "graph/dtype.h"
#include "support/testutil.h"

/* ---------------------------------------------------------------- helpers */

static kiln_cpu_pool *pools[4]; /* pools[t]: t threads */

static void setup_pools(void)
{
    for (int t = 1; t <= 3; t++)
        cr_assert_eq(kiln_cpu_pool_new(t, &pools[t]), KILN_OK);
}

static void teardown_pools(void)
{
    for (int t = 1; t <= 3; t++)
        kiln_cpu_pool_free(pools[t]);
}

/* A buffer of n bytes starting 4 bytes past a 64-byte boundary (misaligned for SIMD). */
typedef struct mis_buf {
    char *base; /* allocation */
    void *p;    /* base + 4 */
} mis_buf;

static mis_buf mis_alloc(size_t n)
{
    mis_buf b;
    cr_assert_eq(posix_memalign((void **)&b.base, 64, n + 68), 0);
    b.p = b.base + 4;
    return b;
}

/* Weight rows [n, k] of dtype t with fresh random values; wd gets the dequantized values. Each
 * row has its own spread and offset, so block scales and mins differ from row to row and a
 * kernel that mixes up rows' scales (multi-row tiles) is caught. */
static bool g_raw_q8; /* make_weight: q8_0 blocks of raw random bytes, -128 quants included */

static mis_buf make_weight(kiln_dtype t, int64_t n, int64_t k, double *wd)
{
    if (g_raw_q8 && t == KILN_DTYPE_Q8_0) {
        mis_buf b = mis_alloc(kiln_row_bytes(t, k) * (size_t)n);
        float *f = malloc(sizeof(float) * (size_t)(n * k));
        kiln_block_q8_0 *q = (kiln_block_q8_0 *)b.p;
        for (int64_t i = 0; i < n * k / KILN_QK8_0; i++) {
            q[i].d = kiln_f32_to_f16(0.002f * (float)tu_randint(1, 8));
            for (int u = 0; u < KILN_QK8_0; u++)
                q[i].qs[u] = (int8_t)(tu_randint(0, 7) == 0 ? -128 : tu_randint(-128, 127));
        }
        cr_assert_eq(kiln_dequantize(t, b.p, f, n * k), KILN_OK);
        for (int64_t i = 0; i < n * k; i++)
            wd[i] = f[i];
        free(f);
        return b;
    }
    float *f = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t j = 0; j < n; j++) {
        float a = 0.25f + (float)tu_randint(0, 15) * 0.25f, c = (float)tu_randint(-4, 4) * 0.25f * a;
        tu_fill(f + j * k, k, c - a, c + a);
    }
    mis_buf b = mis_alloc(kiln_row_bytes(t, k) * (size_t)n);
    cr_assert_eq(kiln_quantize(t, f, b.p, n * k), KILN_OK);
    cr_assert_eq(kiln_dequantize(t, b.p, f, n * k), KILN_OK);
    for (int64_t i = 0; i < n * k; i++)
        wd[i] = f[i];
    free(f);
    return b;
}

/* Per-activation-row normalized x̂ in f64 (the reference prologue). */
static void ref_xhat(const float *x, int64_t m, int64_t k, bool norm, const float *nw, float eps, double *xh)
{
    for (int64_t i = 0; i < m; i++) {
        double ss = 0;
        for (int64_t t = 0; t < k; t++)
            ss += (double)x[i * k + t] * x[i * k + t];
        double r = norm ? 1.0 / sqrt(ss / (double)k + eps) : 1.0;
        for (int64_t t = 0; t < k; t++)
            xh[i * k + t] = x[i * k + t] * r * (norm && nw ? nw[t] : 1.0);
    }
}

/* ref[i, j] = x̂_i · w_j; bound[i, j] = the kernel's allowed error: f32 rounding (2e-5 of
 * sum |x̂ w|) plus, for int8 activations, half a quantization step of each activation block
 * times that block's sum |w|. */
static void ref_mm(const double *xh, const double *wd, int64_t m, int64_t n, int64_t k, kiln_dtype t, double *ref,
                   double *bound)
{
    int64_t qb = kiln_dtype_block(t) == 1 ? 0 : kiln_dtype_block(t); /* activation blocks: 32 or 256 */
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, a = 0, q = 0;
            for (int64_t u = 0; u < k; u++) {
                s += xh[i * k + u] * wd[j * k + u];
                a += fabs(xh[i * k + u] * wd[j * k + u]);
            }
            for (int64_t b0 = 0; qb && b0 < k; b0 += qb) {
                double amax = 0, sw = 0;
                for (int64_t u = b0; u < b0 + qb; u++) {
                    amax = fmax(amax, fabs(xh[i * k + u]));
                    sw += fabs(wd[j * k + u]);
                }
                q += 0.5 * amax / 127.0 * sw * 1.01;
            }
            ref[i * n + j] = s;
            bound[i * n + j] = 2e-5 * a + q + 1e-30;
        }
}

static double check_elems(const char *what, const float *y, int64_t ldy, const double *ref, const double *bound,
                          int64_t m, int64_t n)
{
    double e2 = 0, r2 = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double g = y[i * ldy + j], r = ref[i * n + j];
            cr_assert(isfinite(g) && fabs(g - r) <= bound[i * n + j],
                      "%s: y[%ld,%ld] = %.9g, want %.9g (bound %.3g, seed %llu)", what, (long)i, (long)j, g, r,
                      bound[i * n + j], (unsigned long long)tu_seed());
            e2 += (g - r) * (g - r);
            r2 += r * r;
        }
    return e2 / (r2 > 1e-300 ? r2 : 1e-300);
}

static const kiln_dtype mm_types[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16,   KILN_DTYPE_Q8_0,
                                      KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K,   KILN_DTYPE_Q4_0,
                                      KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1,   KILN_DTYPE_IQ4_NL,
                                      KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K, KILN_DTYPE_IQ4_XS};

/* K for dtype t: odd for float types, a multiple of the block otherwise. */
static int64_t pick_k(kiln_dtype t, bool big)
{
    switch (kiln_dtype_block(t)) {
    case 32: return big ? 320 : 96;
    case 256: return big ? 768 : 512;
    default: return big ? 301 : 67;
    }
}

/* One plain matmul (optionally normalized) of dtype t, checked on every ISA and thread count. */
static void run_mm_case(kiln_dtype t, int64_t m, int64_t n, int64_t k, bool norm)
{
    double *wd = malloc(sizeof(double) * (size_t)(n * k));
    mis_buf w = make_weight(t, n, k, wd);
    mis_buf x = mis_alloc(sizeof(float) * (size_t)(m * k)), nw = mis_alloc(sizeof(float) * (size_t)k);
    mis_buf y = mis_alloc(sizeof(float) * (size_t)(m * n));
    tu_fill(x.p, m * k, -2.0f, 2.0f);
    tu_fill(nw.p, k, 0.5f, 1.5f);
    double *xh = malloc(sizeof(double) * (size_t)(m * k)), *ref = malloc(sizeof(double) * (size_t)(m * n));
    double *bound = malloc(sizeof(double) * (size_t)(m * n));
    ref_xhat(x.p, m, k, norm, nw.p, 1e-5f, xh);
    ref_mm(xh, wd, m, n, k, t, ref, bound);
    for (int isa = 0; isa <= (int)kiln_cpu_isa_max(); isa++)
        for (int th = 1; th <= 3; th++) {
            kiln_cpu_mm mm = {.x = x.p, .m = m, .k = k, .norm = norm, .norm_w = nw.p, .eps = 1e-5f, .n_out = 1};
            mm.out[0] = (kiln_cpu_mm_out){.w = w.p, .wt = t, .n = n, .y = y.p};
            tu_poison(y.p, sizeof(float) * (size_t)(m * n));
            cr_assert_eq(kiln_cpu_matmul(pools[th], (enum kiln_cpu_isa)isa, &mm), KILN_OK);
            char what[128];
            snprintf(what, sizeof what, "%s %s m=%ld n=%ld k=%ld norm=%d th=%d", kiln_dtype_name(t),
                     kiln_cpu_isa_name((enum kiln_cpu_isa)isa), (long)m, (long)n, (long)k, norm, th);
            double e = check_elems(what, y.p, n, ref, bound, m, n);
            if (getenv("KILN_TEST_VERBOSE"))
                fprintf(stderr, "%s: nmse %.3g\n", what, e);
        }
    free(wd), free(xh), free(ref), free(bound);
    free(w.base), free(x.base), free(nw.base), free(y.base);
}

/* ---------------------------------------------------------------- matmul */

TestSuite(cpu_kernels, .init = setup_pools, .fini = teardown_pools, .timeout = 600);

Test(cpu_kernels, matmul_gemv_every_dtype)
{
    static const int64_t ms[] = {1, 2, 3, 8};
    for (size_t d = 0; d < sizeof mm_types / sizeof *mm_types; d++)
        for (size_t mi = 0; mi < 4; mi++)
            run_mm_case(mm_types[d], ms[mi], 37, pick_k(mm_types[d], mi == 0), mi % 2 == 1);
}

Test(cpu_kernels, matmul_gemm_every_dtype)
{
    for (size_t d = 0; d < sizeof mm_types / sizeof *mm_types; d++) {
        run_mm_case(mm_types[d], 17, 29, pick_k(mm_types[d], false), true);
        run_mm_case(mm_types[d], 128, 26, pick_k(mm_types[d], false), false);
    }
}

/* Q/K/V-style siblings of different dtypes with a residual on one, normalized x. */
/* Long rows: the GEMMs split k into blocks (256 values for float panels, 1024 for the integer
 * panels) and accumulate across them; partial row panels (n not a multiple of 16) and odd m. */
Test(cpu_kernels, matmul_gemm_long_k)
{
    for (size_t d = 0; d < sizeof mm_types / sizeof *mm_types; d++) {
        int64_t k = kiln_dtype_block(mm_types[d]) > 1 ? 2304 : 1031;
        run_mm_case(mm_types[d], 19, 45, k, d % 2 == 0);
    }
}

/* q8_0 files from other quantizers may hold -128 quants (ggml's never does): every kernel must
 * take them exactly, decode and GEMM. */
Test(cpu_kernels, matmul_q8_0_raw_quants)
{
    g_raw_q8 = true;
    static const int64_t ms[] = {1, 3, 19};
    for (int mi = 0; mi < 3; mi++)
        run_mm_case(KILN_DTYPE_Q8_0, ms[mi], 23, 320, false);
    g_raw_q8 = false;
}

/* llama.cpp's cpu arithmetic for q8_0 and q4_1 weights: x quantized per 32 with id = 1/d from the
 * f32 d = amax / 127, the block product taken with d rounded to f16 (ggml's block_q8_0 stores it so),
 * and q4_1's min term m * s with s = f16(d * sum q) from the f32 d (ggml's block_q8_1); kiln keeps f32
 * values only outside f16's normal range (block 1 of each row: amax 1e-4). Every ISA, decode and GEMM
 * rows: the f64 sum of those exact block terms within f32 summation error (kiln's f32 d and d * sum q
 * instead: NMSE ~5e-9, the f16 roundings). */
static double ggml_block32(kiln_dtype t, const void *wrow, const float *x, int64_t k)
{
    double s = 0;
    for (int64_t b0 = 0; b0 < k; b0 += 32) {
        float amax = 0;
        for (int u = 0; u < 32; u++) amax = fmaxf(amax, fabsf(x[b0 + u]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        float dx = d >= 0x1p-14f ? kiln_f16_to_f32(kiln_f32_to_f16(d)) : d;
        int32_t dot = 0, sum = 0;
        for (int u = 0; u < 32; u++) {
            int32_t qx = (int32_t)rintf(x[b0 + u] * id), qw;
            if (t == KILN_DTYPE_Q8_0) {
                qw = ((const kiln_block_q8_0 *)wrow)[b0 / 32].qs[u];
            } else {
                uint8_t byte = ((const kiln_block_q4_1 *)wrow)[b0 / 32].qs[u % 16];
                qw = u < 16 ? byte & 15 : byte >> 4;
            }
            dot += qx * qw, sum += qx;
        }
        if (t == KILN_DTYPE_Q8_0) {
            s += (double)dx * kiln_f16_to_f32(((const kiln_block_q8_0 *)wrow)[b0 / 32].d) * dot;
        } else {
            const kiln_block_q4_1 *bw = (const kiln_block_q4_1 *)wrow + b0 / 32;
            float sx = d * (float)sum;
            sx = fabsf(sx) >= 0x1p-14f ? kiln_f16_to_f32(kiln_f32_to_f16(sx)) : sx;
            s += (double)dx * kiln_f16_to_f32(bw->d) * dot + (double)kiln_f16_to_f32(bw->m) * sx;
        }
    }
    return s;
}

Test(cpu_kernels, matmul_block32_activations_as_ggml)
{
    const int64_t n = 9, k = 320;
    static const int64_t ms[] = {1, 3, 12};
    static const kiln_dtype ts[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_1};
    for (int ti = 0; ti < 2; ti++) {
        double *wd = malloc(sizeof(double) * (size_t)(n * k));
        mis_buf w = make_weight(ts[ti], n, k, wd);
        size_t ws = kiln_row_bytes(ts[ti], k);
        for (int mi = 0; mi < 3; mi++) {
            int64_t m = ms[mi];
            mis_buf x = mis_alloc(sizeof(float) * (size_t)(m * k)), y = mis_alloc(sizeof(float) * (size_t)(m * n));
            float *xf = x.p;
            tu_fill(xf, m * k, -2.0f, 2.0f);
            for (int64_t i = 0; i < m; i++)
                for (int64_t u = 32; u < 64; u++) xf[i * k + u] *= 5e-5f; /* d below 2^-14 */
            double *ref = malloc(sizeof(double) * (size_t)(m * n));
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++)
                    ref[i * n + j] = ggml_block32(ts[ti], (const char *)w.p + (size_t)j * ws, xf + i * k, k);
            for (int isa = 0; isa <= (int)kiln_cpu_isa_max(); isa++) {
                kiln_cpu_mm mm = {.x = x.p, .m = m, .k = k, .n_out = 1};
                mm.out[0] = (kiln_cpu_mm_out){.w = w.p, .wt = ts[ti], .n = n, .y = y.p};
                tu_poison(y.p, sizeof(float) * (size_t)(m * n));
                cr_assert_eq(kiln_cpu_matmul(pools[1], (enum kiln_cpu_isa)isa, &mm), KILN_OK);
                double e2 = 0, r2 = 0;
                for (int64_t i = 0; i < m * n; i++) {
                    double g = ((float *)y.p)[i];
                    cr_assert(isfinite(g));
                    e2 += (g - ref[i]) * (g - ref[i]), r2 += ref[i] * ref[i];
                }
                cr_assert(e2 <= 1e-11 * r2, "%s %s m=%ld: NMSE %.3g against ggml's block terms (seed %llu)",
                          kiln_dtype_name(ts[ti]), kiln_cpu_isa_name((enum kiln_cpu_isa)isa), (long)m, e2 / r2,
                          (unsigned long long)tu_seed());
            }
            free(ref), free(x.base), free(y.base);
        }
        free(wd), free(w.base);
    }
}

Test(cpu_kernels, matmul_fused_siblings_residual)
{
    const int64_t k = 512, ns[3] = {40, 13, 27};
    const kiln_dtype ts[3] = {KILN_DTYPE_Q4_K, KILN_DTYPE_F16, KILN_DTYPE_Q8_0};
    static const int64_t ms[] = {1, 3, 20};
    for (int mi = 0; mi < 3; mi++) {
        int64_t m = ms[mi];
        mis_buf x = mis_alloc(sizeof(float) * (size_t)(m * k));
        tu_fill(x.p, m * k, -1.0f, 1.0f);
        double *xh = malloc(sizeof(double) * (size_t)(m * k));
        ref_xhat(x.p, m, k, true, NULL, 1e-6f, xh);
        mis_buf w[3], y[3], r[3];
        double *ref[3], *bound[3];
        for (int o = 0; o < 3; o++) {
            double *wd = malloc(sizeof(double) * (size_t)(ns[o] * k));
            w[o] = make_weight(ts[o], ns[o], k, wd);
            y[o] = mis_alloc(sizeof(float) * (size_t)(m * ns[o]));
            r[o] = mis_alloc(sizeof(float) * (size_t)(m * ns[o]));
            tu_fill(r[o].p, m * ns[o], -3.0f, 3.0f);
            ref[o] = malloc(sizeof(double) * (size_t)(m * ns[o]));
            bound[o] = malloc(sizeof(double) * (size_t)(m * ns[o]));
            ref_mm(xh, wd, m, ns[o], k, ts[o], ref[o], bound[o]);
            if (o == 1)
                for (int64_t i = 0; i < m * ns[o]; i++)
                    ref[o][i] += ((float *)r[o].p)[i], bound[o][i] += 1e-6 * 3;
            free(wd);
        }
        for (int isa = 0; isa <= (int)kiln_cpu_isa_max(); isa++)
            for (int th = 1; th <= 3; th++) {
                kiln_cpu_mm mm = {.x = x.p, .m = m, .k = k, .norm = true, .eps = 1e-6f, .n_out = 3};
                for (int o = 0; o < 3; o++) {
                    mm.out[o] = (kiln_cpu_mm_out){.w = w[o].p, .wt = ts[o], .n = ns[o], .y = y[o].p,
                                                  .residual = o == 1 ? r[o].p : NULL};
                    tu_poison(y[o].p, sizeof(float) * (size_t)(m * ns[o]));
                }
                cr_assert_eq(kiln_cpu_matmul(pools[th], (enum kiln_cpu_isa)isa, &mm), KILN_OK);
                for (int o = 0; o < 3; o++) {
                    char what[96];
                    snprintf(what, sizeof what, "siblings out %d %s m=%ld th=%d", o,
                             kiln_cpu_isa_name((enum kiln_cpu_isa)isa), (long)m, th);
                    check_elems(what, y[o].p, ns[o], ref[o], bound[o], m, ns[o]);
                }
            }
        for (int o = 0; o < 3; o++) {
            free(w[o].base), free(y[o].base), free(r[o].base), free(ref[o]), free(bound[o]);
        }
        free(x.base), free(xh);
    }
}

/* gate/up with the swiglu epilogue and a residual: y = silu(g) * u + r. */
Test(cpu_kernels, matmul_swiglu_residual)
{
    const int64_t k = 256, n = 53;
    static const int64_t ms[] = {1, 5, 33};
    for (int mi = 0; mi < 3; mi++) {
        int64_t m = ms[mi];
        double *wg = malloc(sizeof(double) * (size_t)(n * k)), *wu = malloc(sizeof(double) * (size_t)(n * k));
        mis_buf g = make_weight(KILN_DTYPE_Q6_K, n, k, wg), u = make_weight(KILN_DTYPE_BF16, n, k, wu);
        mis_buf x = mis_alloc(sizeof(float) * (size_t)(m * k)), r = mis_alloc(sizeof(float) * (size_t)(m * n));
        mis_buf y = mis_alloc(sizeof(float) * (size_t)(m * n));
        tu_fill(x.p, m * k, -1.0f, 1.0f);
        tu_fill(r.p, m * n, -1.0f, 1.0f);
        double *xh = malloc(sizeof(double) * (size_t)(m * k)), *rg = malloc(sizeof(double) * (size_t)(m * n));
        double *ru = malloc(sizeof(double) * (size_t)(m * n)), *bg = malloc(sizeof(double) * (size_t)(m * n));
        double *bu = malloc(sizeof(double) * (size_t)(m * n));
        ref_xhat(x.p, m, k, false, NULL, 0, xh);
        ref_mm(xh, wg, m, n, k, KILN_DTYPE_Q6_K, rg, bg);
        ref_mm(xh, wu, m, n, k, KILN_DTYPE_BF16, ru, bu);
        for (int64_t i = 0; i < m * n; i++) {
            /* silu is 1.0998-Lipschitz: a gate error e moves silu by at most 1.1 e wherever the
             * gate is (the slope at the reference gate alone vanishes near g = -1.28, where a
             * linearized bound would allow no error at all). */
            double s = 1 / (1 + exp(-rg[i]));
            double val = rg[i] * s * ru[i] + ((float *)r.p)[i];
            bg[i] = 1.1 * bg[i] * (fabs(ru[i]) + bu[i]) + fabs(rg[i] * s) * bu[i] + 1e-6 * (1 + fabs(val));
            rg[i] = val;
        }
        for (int isa = 0; isa <= (int)kiln_cpu_isa_max(); isa++)
            for (int th = 1; th <= 3; th++) {
                kiln_cpu_mm mm = {.x = x.p, .m = m, .k = k, .n_out = 2, .swiglu = true};
                mm.out[0] = (kiln_cpu_mm_out){.w = g.p, .wt = KILN_DTYPE_Q6_K, .n = n, .y = y.p, .residual = r.p};
                mm.out[1] = (kiln_cpu_mm_out){.w = u.p, .wt = KILN_DTYPE_BF16, .n = n};
                tu_poison(y.p, sizeof(float) * (size_t)(m * n));
                cr_assert_eq(kiln_cpu_matmul(pools[th], (enum kiln_cpu_isa)isa, &mm), KILN_OK);
                char what[96];
                snprintf(what, sizeof what, "swiglu %s m=%ld th=%d", kiln_cpu_isa_name((enum kiln_cpu_isa)isa),
                         (long)m, th);
                check_elems(what, y.p, n, rg, bg, m, n);
            }
        free(wg), free(wu), free(xh), free(rg), free(ru), free(bg), free(bu);
        free(g.base), free(u.base), free(x.base), free(r.base), free(y.base);
    }
}

Test(cpu_kernels, matmul_rejects_bad_regions)
{
    float x[64], y[64];
    uint8_t w[4096] = {0};
    kiln_cpu_mm mm = {.x = x, .m = 1, .k = 48, .n_out = 1};
    mm.out[0] = (kiln_cpu_mm_out){.w = w, .wt = KILN_DTYPE_Q4_K, .n = 1, .y = y};
    cr_assert_eq(kiln_cpu_matmul(pools[1], KILN_CPU_ISA_SCALAR, &mm), KILN_ERR_SHAPE);
    mm.out[0].wt = KILN_DTYPE_I32;
    cr_assert_eq(kiln_cpu_matmul(pools[1], KILN_CPU_ISA_SCALAR, &mm), KILN_ERR_DTYPE);
    mm.out[0].wt = KILN_DTYPE_F32;
    mm.n_out = 0;
    cr_assert_eq(kiln_cpu_matmul(pools[1], KILN_CPU_ISA_SCALAR, &mm), KILN_ERR_INVALID_ARG);
    mm.n_out = 2;
    mm.swiglu = true;
    mm.out[1] = (kiln_cpu_mm_out){.w = w, .wt = KILN_DTYPE_F32, .n = 2};
    cr_assert_eq(kiln_cpu_matmul(pools[1], KILN_CPU_ISA_SCALAR, &mm), KILN_ERR_SHAPE);
    cr_assert_eq(kiln_cpu_matmul(NULL, KILN_CPU_ISA_SCALAR, &mm), KILN_ERR_INVALID_ARG);
}

/* kiln_cpu_matmul_batch (moe_matmul's routed experts in one pass): regions of different dtypes, rows
 * (1: the gemv tiles; 12: the GEMM's compact tiles) and widths, on 1..3 threads, give exactly what
 * kiln_cpu_matmul gives each alone; one invalid region fails the batch with nothing written. */
Test(cpu_kernels, matmul_batch_matches_single_regions)
{
    const kiln_dtype ts[3] = {KILN_DTYPE_Q8_0, KILN_DTYPE_F32, KILN_DTYPE_Q4_K};
    const int64_t ms[3] = {1, 12, 3}, ns[3] = {40, 17, 64}, K = 256;
    mis_buf w[3];
    float *x[3], *y1[3], *yb[3];
    kiln_cpu_mm mm[3];
    for (int i = 0; i < 3; i++) {
        double *wd = malloc(sizeof(double) * (size_t)(ns[i] * K));
        w[i] = make_weight(ts[i], ns[i], K, wd);
        free(wd);
        x[i] = malloc(sizeof(float) * (size_t)(ms[i] * K));
        tu_fill(x[i], ms[i] * K, -1, 1);
        y1[i] = malloc(sizeof(float) * (size_t)(ms[i] * ns[i]));
        yb[i] = malloc(sizeof(float) * (size_t)(ms[i] * ns[i]));
    }
    for (int th = 1; th <= 3; th++) {
        for (int i = 0; i < 3; i++) {
            mm[i] = (kiln_cpu_mm){.x = x[i], .m = ms[i], .k = K, .n_out = 1};
            mm[i].out[0] = (kiln_cpu_mm_out){.w = w[i].p, .wt = ts[i], .n = ns[i], .y = y1[i]};
            tu_poison(y1[i], sizeof(float) * (size_t)(ms[i] * ns[i]));
            cr_assert_eq(kiln_cpu_matmul(pools[th], kiln_cpu_isa_detect(), &mm[i]), KILN_OK);
            mm[i].out[0].y = yb[i];
            tu_poison(yb[i], sizeof(float) * (size_t)(ms[i] * ns[i]));
        }
        cr_assert_eq(kiln_cpu_matmul_batch(pools[th], kiln_cpu_isa_detect(), mm, 3), KILN_OK);
        for (int i = 0; i < 3; i++)
            cr_assert(memcmp(y1[i], yb[i], sizeof(float) * (size_t)(ms[i] * ns[i])) == 0, "region %d (%s, %lld rows), %d threads",
                      i, kiln_dtype_name(ts[i]), (long long)ms[i], th);
    }
    mm[1].k = 48; /* not a multiple of q4_k's block in region 2: nothing written anywhere */
    mm[2].k = 48;
    tu_poison(yb[0], sizeof(float) * (size_t)(ms[0] * ns[0]));
    cr_assert_eq(kiln_cpu_matmul_batch(pools[2], KILN_CPU_ISA_SCALAR, mm, 3), KILN_ERR_SHAPE);
    for (int64_t j = 0; j < ms[0] * ns[0]; j++) cr_assert(isnan(yb[0][j]), "region 0 written by a failed batch");
    for (int i = 0; i < 3; i++) free(w[i].base), free(x[i]), free(y1[i]), free(yb[i]);
}

/* ---------------------------------------------------------------- attention */

/* The soft-cap and window of the next run_attn_case (0: none), read by the reference too. */
static float g_softcap;
static int64_t g_window;

static void ref_attention(const float *q, const double *kd, const double *vd, int64_t n_tok, int64_t n_head,
                          int64_t hd, int64_t n_kv_head, int64_t max_ctx, int64_t n_kv, double scale, double *y)
{
    double *s = malloc(sizeof(double) * (size_t)n_kv);
    int64_t grp = n_head / n_kv_head;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t h = 0; h < n_head; h++) {
            int64_t hk = h / grp, lim = n_kv - n_tok + t + 1, j0 = g_window && lim > g_window ? lim - g_window : 0;
            double mx = -INFINITY, l = 0;
            for (int64_t j = j0; j < lim; j++) {
                double a = 0;
                for (int64_t d = 0; d < hd; d++)
                    a += q[(t * n_head + h) * hd + d] * kd[(hk * max_ctx + j) * hd + d];
                s[j] = a * scale;
                if (g_softcap) s[j] = g_softcap * tanh(s[j] / g_softcap);
                mx = fmax(mx, s[j]);
            }
            for (int64_t j = j0; j < lim; j++)
                l += (s[j] = exp(s[j] - mx));
            for (int64_t d = 0; d < hd; d++) {
                double a = 0;
                for (int64_t j = j0; j < lim; j++)
                    a += s[j] * vd[(hk * max_ctx + j) * hd + d];
                y[(t * n_head + h) * hd + d] = a / l;
            }
        }
    free(s);
}

static void run_attn_case(kiln_dtype kt, int64_t n_tok, int64_t n_head, int64_t n_kv_head, int64_t hd,
                          int64_t max_ctx, int64_t n_kv, float scale)
{
    int64_t nc = n_kv_head * max_ctx * hd, nq = n_tok * n_head * hd;
    float *f = malloc(sizeof(float) * (size_t)nc);
    double *kd = malloc(sizeof(double) * (size_t)nc), *vd = malloc(sizeof(double) * (size_t)nc);
    size_t es = kt == KILN_DTYPE_F16 ? 2 : 4;
    mis_buf k = mis_alloc(es * (size_t)nc), v = mis_alloc(es * (size_t)nc);
    mis_buf q = mis_alloc(sizeof(float) * (size_t)nq), y = mis_alloc(sizeof(float) * (size_t)nq);
    mis_buf *kv[2] = {&k, &v};
    double *kvd[2] = {kd, vd};
    for (int c = 0; c < 2; c++) {
        tu_fill(f, nc, -1.0f, 1.0f);
        cr_assert_eq(kiln_quantize(kt, f, kv[c]->p, nc), KILN_OK);
        cr_assert_eq(kiln_dequantize(kt, kv[c]->p, f, nc), KILN_OK);
        for (int64_t i = 0; i < nc; i++)
            kvd[c][i] = f[i];
    }
    tu_fill(q.p, nq, -2.0f, 2.0f);
    double *ref = malloc(sizeof(double) * (size_t)nq);
    ref_attention(q.p, kd, vd, n_tok, n_head, hd, n_kv_head, max_ctx, n_kv, scale ? scale : 1 / sqrt((double)hd),
                  ref);
    for (int isa = 0; isa <= (int)kiln_cpu_isa_max(); isa++)
        for (int th = 1; th <= 3; th++) {
            tu_poison(y.p, sizeof(float) * (size_t)nq);
            cr_assert_eq(kiln_cpu_attention(pools[th], (enum kiln_cpu_isa)isa, q.p, n_tok, n_head, hd, k.p, v.p, kt,
                                            n_kv_head, max_ctx, n_kv,
                                            &(kiln_cpu_attn_mask){.scale = scale, .softcap = g_softcap, .window = g_window},
                                            y.p),
                         KILN_OK);
            for (int64_t i = 0; i < nq; i++) {
                double g = ((float *)y.p)[i];
                cr_assert(isfinite(g) && fabs(g - ref[i]) <= 2e-5,
                          "attention %s %s n_tok=%ld n_kv=%ld th=%d: y[%ld] = %.8g want %.8g (seed %llu)",
                          kiln_dtype_name(kt), kiln_cpu_isa_name((enum kiln_cpu_isa)isa), (long)n_tok, (long)n_kv, th,
                          (long)i, g, ref[i], (unsigned long long)tu_seed());
            }
        }
    free(f), free(kd), free(vd), free(ref);
    free(k.base), free(v.base), free(q.base), free(y.base);
}

Test(cpu_kernels, attention_decode)
{
    for (int c = 0; c < 2; c++) {
        kiln_dtype kt = c ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        run_attn_case(kt, 1, 4, 1, 36, 1100, 1031, 0);  /* one KV head: KV splits + merge, GQA 4 */
        run_attn_case(kt, 1, 6, 3, 64, 300, 1, 0.3f);   /* a single key */
        run_attn_case(kt, 2, 8, 8, 40, 200, 133, 0);    /* two queries, no GQA */
        run_attn_case(kt, 1, 4, 2, 136, 600, 517, 0);   /* head dim 2 x 64 + 8 */
    }
}

Test(cpu_kernels, attention_prefill)
{
    for (int c = 0; c < 2; c++) {
        kiln_dtype kt = c ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        run_attn_case(kt, 37, 4, 2, 24, 100, 37, 0);    /* from empty cache */
        run_attn_case(kt, 21, 6, 2, 33, 300, 150, 0);   /* after 129 cached keys, odd head dim */
    }
}

/* Soft-capped scores and sliding windows: windows shorter and longer than a KV split (decode splits
 * KV over threads in multiples of 64 keys) and than the prefill's query tile, window 1 (a query sees
 * only itself), and a window longer than the cache (no key hidden). */
Test(cpu_kernels, attention_softcap_and_window)
{
    for (int c = 0; c < 2; c++) {
        kiln_dtype kt = c ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        g_softcap = 3.0f, g_window = 100;
        run_attn_case(kt, 1, 4, 1, 36, 1100, 1031, 0);   /* decode: most splits wholly outside the window */
        g_softcap = 0, g_window = 700;
        run_attn_case(kt, 2, 4, 2, 64, 1100, 1031, 0.3f); /* the window's edge inside a split */
        g_softcap = 1.5f, g_window = 5;
        run_attn_case(kt, 37, 4, 2, 24, 100, 37, 0);     /* prefill from empty: edges inside tiles */
        g_softcap = 2.0f, g_window = 1;
        run_attn_case(kt, 21, 6, 2, 33, 300, 150, 0);
        g_softcap = 0.5f, g_window = 4096;
        run_attn_case(kt, 21, 6, 3, 16, 300, 150, 0);
        g_softcap = 0, g_window = 0;
    }
}

Test(cpu_kernels, attention_rejects_bad_args)
{
    float q[8] = {0}, y[8], kc[64] = {0};
    const kiln_cpu_attn_mask mk = {0};
    cr_assert_eq(kiln_cpu_attention(pools[1], KILN_CPU_ISA_SCALAR, q, 1, 3, 2, kc, kc, KILN_DTYPE_F32, 2, 4, 2, &mk, y),
                 KILN_ERR_SHAPE);
    cr_assert_eq(kiln_cpu_attention(pools[1], KILN_CPU_ISA_SCALAR, q, 1, 2, 2, kc, kc, KILN_DTYPE_Q8_0, 1, 4, 2, &mk, y),
                 KILN_ERR_DTYPE);
    cr_assert_eq(kiln_cpu_attention(pools[1], KILN_CPU_ISA_SCALAR, q, 3, 2, 2, kc, kc, KILN_DTYPE_F32, 1, 4, 2, &mk, y),
                 KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cpu_attention(pools[1], KILN_CPU_ISA_SCALAR, q, 1, 2, 2, kc, kc, KILN_DTYPE_F32, 1, 4, 2,
                                    &(kiln_cpu_attn_mask){.window = -1}, y),
                 KILN_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------- rows, pool, ISA */

Test(cpu_kernels, rows_rms_norm_softmax_rope)
{
    const int64_t rows = 3, d = 70;
    float x[3 * 70], y[3 * 70], w[70];
    tu_fill(x, rows * d, -3.0f, 3.0f);
    tu_fill(w, d, 0.5f, 1.5f);
    tu_poison(y, sizeof y);
    kiln_cpu_rms_norm(x, w, 1e-5f, rows, d, y);
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0, mx = -INFINITY, se = 0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)x[r * d + i] * x[r * d + i], mx = fmax(mx, x[r * d + i]);
        for (int64_t i = 0; i < d; i++) {
            double want = x[r * d + i] / sqrt(ss / d + 1e-5) * w[i];
            cr_assert(fabs(y[r * d + i] - want) <= 1e-5 * (1 + fabs(want)), "rms_norm [%ld,%ld]", (long)r, (long)i);
            se += exp(x[r * d + i] - mx);
        }
        float sm[70];
        tu_poison(sm, sizeof sm);
        kiln_cpu_softmax(x + r * d, 1, d, sm);
        for (int64_t i = 0; i < d; i++)
            cr_assert(fabs(sm[i] - exp(x[r * d + i] - mx) / se) <= 1e-6, "softmax [%ld,%ld]", (long)r, (long)i);
    }
    const int64_t n_tok = 3, n_head = 2, hd = 10;
    int32_t pos[3] = {0, 7, 4099};
    float mult[5];
    tu_fill(mult, 5, 0.1f, 1.0f);
    for (int mode = 0; mode < 8; mode++) { /* 2, 3: with per-pair multipliers; 4..7: partial (first 6 of 10 dims) */
        int64_t rot = mode >= 4 ? 6 : hd;
        memcpy(y, x, sizeof(float) * (size_t)(n_tok * n_head * hd));
        kiln_cpu_rope(y, pos, n_tok, n_head, hd, rot, mode % 2, 10000.0f, mode % 4 >= 2 ? mult : NULL);
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t h = 0; h < n_head; h++) {
                int64_t o = (t * n_head + h) * hd;
                for (int64_t i = rot; i < hd; i++) cr_assert(y[o + i] == x[o + i], "rope mode %d passes dim %ld", mode, (long)i);
                for (int64_t i = 0; i < rot / 2; i++) {
                    double ang = pos[t] * pow(10000.0, -2.0 * i / rot) * (mode % 4 >= 2 ? mult[i] : 1.0);
                    double c = cos(ang), s = sin(ang);
                    int64_t a = mode % 2 ? i : 2 * i, b = mode % 2 ? i + rot / 2 : 2 * i + 1;
                    double wa = x[o + a] * c - x[o + b] * s, wb = x[o + a] * s + x[o + b] * c;
                    cr_assert(fabs(y[o + a] - wa) <= 1e-5 && fabs(y[o + b] - wb) <= 1e-5, "rope mode %d", mode);
                }
            }
    }
}

typedef struct count_job {
    int hits[8];  /* per tid */
    int nth_seen; /* nth passed */
} count_job;

static void count_fn(void *arg, int tid, int nth)
{
    count_job *j = arg;
    j->hits[tid]++;
    j->nth_seen = nth;
}

Test(cpu_kernels, pool_runs_every_thread_every_time)
{
    for (int th = 1; th <= 3; th++) {
        count_job j;
        memset(&j, 0, sizeof j);
        for (int r = 0; r < 2000; r++) {
            kiln_cpu_pool_run(pools[th], count_fn, &j);
            if (r % 500 == 0) { /* let workers fall asleep, then wake them */
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
            }
        }
        cr_assert_eq(j.nth_seen, th);
        cr_assert_eq(kiln_cpu_pool_threads(pools[th]), th);
        for (int t = 0; t < th; t++)
            cr_assert_eq(j.hits[t], 2000, "thread %d of %d ran %d times", t, th, j.hits[t]);
        for (int t = th; t < 8; t++)
            cr_assert_eq(j.hits[t], 0);
    }
}

Test(cpu_kernels, isa_detect_and_env_override)
{
    enum kiln_cpu_isa m = kiln_cpu_isa_max();
    cr_assert(m < KILN_CPU_ISA_COUNT);
    setenv("KILN_CPU_ISA", "scalar", 1);
    cr_assert_eq(kiln_cpu_isa_detect(), KILN_CPU_ISA_SCALAR);
    setenv("KILN_CPU_ISA", "avx512", 1);
    cr_assert_eq(kiln_cpu_isa_detect(), m); /* never above what the CPU has */
    unsetenv("KILN_CPU_ISA");
    cr_assert_eq(kiln_cpu_isa_detect(), m);
    cr_assert_str_eq(kiln_cpu_isa_name(KILN_CPU_ISA_AVX2), "avx2");
    cr_assert_str_eq(kiln_cpu_isa_name(KILN_CPU_ISA_COUNT), "?");
}

Test(cpu_kernels, calibration_is_positive)
{
    double p = kiln_cpu_measure_fma_peak(pools[1], kiln_cpu_isa_max());
    /* wall-clock rate: under ASan (-O0 kernels) on 2 cores shared by ~25 runnable processes it
     * measured 0.17 GFLOP/s, so the floor is 1 MFLOP/s (a broken count gives 0 or NaN) */
    cr_assert(p > 1e-3 && p < 1e5, "fma peak %g GFLOP/s", p);
}
