/* AVX2+FMA+F16C kernels for float weights (f32, f16, bf16): GEMV for one activation row (4
 * weight rows x 2-way unrolled K, 8 accumulators), register-tiled GEMM (4 activation rows x 3
 * weight rows, dot-product form, weights converted on load) for more; attention vector ops; the
 * FMA-peak loop. Built with -mavx2 -mfma -mf16c: called only when cpuid says so.
 * Quantized weights are in quant_avx2.c. */
#include <immintrin.h>
#include <math.h>

#include "backends/cpu/avx2_math.h"
#include "backends/cpu/kern.h"

#define ROWB(base, i, stride) ((const char *)(base) + (size_t)(i) * (stride))

static inline float hsum(__m256 v)
{
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

#define LD_F32(p, i) _mm256_loadu_ps((const float *)(p) + (i))
#define LD_F16(p, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (i))))
#define LD_BF16(p, i)                                                                                  \
    _mm256_castsi256_ps(                                                                               \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (i)))), 16))
#define SC_F32(p, i) (((const float *)(p))[i])
#define SC_F16(p, i) _cvtsh_ss(((const uint16_t *)(p))[i])
#define SC_BF16(p, i) kiln_bf16_to_f32(((const uint16_t *)(p))[i])

/* One activation row against weight rows: 4 rows at a time, K unrolled by 16. The next group of
 * 4 rows is prefetched while this one streams (ES: bytes per weight element). */
#define DEF_GEMV1(NAME, LD, SC, ES)                                                                    \
    static void NAME(int64_t k, const char *w, size_t ws, int64_t nw, const float *x, float *y)       \
    {                                                                                                  \
        int64_t j = 0;                                                                                 \
        for (; j + 4 <= nw; j += 4) {                                                                  \
            const char *w0 = w + j * ws, *w1 = w0 + ws, *w2 = w1 + ws, *w3 = w2 + ws;                  \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0; \
            int64_t t = 0;                                                                             \
            for (; t + 16 <= k; t += 16) {                                                             \
                if (((t * (ES)) & 63) == 0 && j + 8 <= nw)                                             \
                    _Pragma("GCC unroll 4") for (int r = 4; r < 8; r++)                                \
                        _mm_prefetch(w0 + r * ws + t * (ES), _MM_HINT_T0);                             \
                __m256 x0 = _mm256_loadu_ps(x + t), x1 = _mm256_loadu_ps(x + t + 8);                   \
                a0 = _mm256_fmadd_ps(x0, LD(w0, t), a0);                                               \
                a1 = _mm256_fmadd_ps(x0, LD(w1, t), a1);                                               \
                a2 = _mm256_fmadd_ps(x0, LD(w2, t), a2);                                               \
                a3 = _mm256_fmadd_ps(x0, LD(w3, t), a3);                                               \
                b0 = _mm256_fmadd_ps(x1, LD(w0, t + 8), b0);                                           \
                b1 = _mm256_fmadd_ps(x1, LD(w1, t + 8), b1);                                           \
                b2 = _mm256_fmadd_ps(x1, LD(w2, t + 8), b2);                                           \
                b3 = _mm256_fmadd_ps(x1, LD(w3, t + 8), b3);                                           \
            }                                                                                          \
            for (; t + 8 <= k; t += 8) {                                                               \
                __m256 x0 = _mm256_loadu_ps(x + t);                                                    \
                a0 = _mm256_fmadd_ps(x0, LD(w0, t), a0);                                               \
                a1 = _mm256_fmadd_ps(x0, LD(w1, t), a1);                                               \
                a2 = _mm256_fmadd_ps(x0, LD(w2, t), a2);                                               \
                a3 = _mm256_fmadd_ps(x0, LD(w3, t), a3);                                               \
            }                                                                                          \
            float s0 = hsum(_mm256_add_ps(a0, b0)), s1 = hsum(_mm256_add_ps(a1, b1));                  \
            float s2 = hsum(_mm256_add_ps(a2, b2)), s3 = hsum(_mm256_add_ps(a3, b3));                  \
            for (; t < k; t++) {                                                                       \
                s0 += x[t] * SC(w0, t);                                                                \
                s1 += x[t] * SC(w1, t);                                                                \
                s2 += x[t] * SC(w2, t);                                                                \
                s3 += x[t] * SC(w3, t);                                                                \
            }                                                                                          \
            y[j] = s0, y[j + 1] = s1, y[j + 2] = s2, y[j + 3] = s3;                                    \
        }                                                                                              \
        for (; j < nw; j++) {                                                                          \
            const char *w0 = w + j * ws;                                                               \
            __m256 a0 = _mm256_setzero_ps();                                                           \
            int64_t t = 0;                                                                             \
            for (; t + 8 <= k; t += 8)                                                                 \
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + t), LD(w0, t), a0);                           \
            float s0 = hsum(a0);                                                                       \
            for (; t < k; t++)                                                                         \
                s0 += x[t] * SC(w0, t);                                                                \
            y[j] = s0;                                                                                 \
        }                                                                                              \
    }

/* An mr x nr tile (mr <= 4 activation rows, nr <= 3 weight rows); inlined with constant sizes for
 * full tiles so the 12 accumulators stay in registers. */
#define DEF_TILE(NAME, LD, SC)                                                                         \
    static inline __attribute__((always_inline)) void NAME(int64_t k, const char *w, size_t ws, int nr, \
                                                           const char *x, size_t xs, int mr, float *y,  \
                                                           int64_t ldy)                                 \
    {                                                                                                  \
        __m256 acc[4][3];                                                                              \
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)                                            \
            _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) acc[i][j] = _mm256_setzero_ps();       \
        int64_t t = 0;                                                                                 \
        for (; t + 8 <= k; t += 8) {                                                                   \
            __m256 wv[3];                                                                              \
            _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) if (j < nr) wv[j] = LD(w + j * ws, t); \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)                            \
            {                                                                                          \
                __m256 xv = _mm256_loadu_ps((const float *)(x + i * xs) + t);                          \
                _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) if (j < nr)                        \
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);                                 \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < mr; i++)                                                                   \
            for (int j = 0; j < nr; j++) {                                                             \
                const float *xr = (const float *)(x + i * xs);                                         \
                float s = hsum(acc[i][j]);                                                             \
                for (int64_t u = t; u < k; u++)                                                        \
                    s += xr[u] * SC(w + j * ws, u);                                                    \
                y[i * ldy + j] = s;                                                                    \
            }                                                                                          \
    }

/* m == 1: GEMV. 2 <= m <= 8: 4x3 tiles, weight tiles outer (each weight row read from memory
 * once). More rows: the packed-panel GEMM of gemm_avx2.c. */
#define DEF_MM(NAME, GEMV1, TILE, GEMM)                                                                \
    static void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs,      \
                     int64_t m, float *y, int64_t ldy)                                                 \
    {                                                                                                  \
        if (m == 1) {                                                                                  \
            GEMV1(k, w, ws, nw, xa, y);                                                                \
            return;                                                                                    \
        }                                                                                              \
        if (m > 8) {                                                                                   \
            GEMM(k, w, ws, nw, xa, xs, m, y, ldy);                                                     \
            return;                                                                                    \
        }                                                                                              \
        for (int64_t j0 = 0; j0 < nw; j0 += 3)                                                         \
            for (int64_t i0 = 0; i0 < m; i0 += 4) {                                                    \
                int mr = m - i0 < 4 ? (int)(m - i0) : 4, nr = nw - j0 < 3 ? (int)(nw - j0) : 3;        \
                const char *wp = ROWB(w, j0, ws), *xp = ROWB(xa, i0, xs);                              \
                float *yp = y + i0 * ldy + j0;                                                         \
                if (mr == 4 && nr == 3)                                                                \
                    TILE(k, wp, ws, 3, xp, xs, 4, yp, ldy);                                            \
                else                                                                                   \
                    TILE(k, wp, ws, nr, xp, xs, mr, yp, ldy);                                          \
            }                                                                                          \
    }

DEF_GEMV1(gemv1_f32, LD_F32, SC_F32, 4)
DEF_GEMV1(gemv1_f16, LD_F16, SC_F16, 2)
DEF_GEMV1(gemv1_bf16, LD_BF16, SC_BF16, 2)
DEF_TILE(tile_f32, LD_F32, SC_F32)
DEF_TILE(tile_f16, LD_F16, SC_F16)
DEF_TILE(tile_bf16, LD_BF16, SC_BF16)
DEF_MM(mm_f32, gemv1_f32, tile_f32, kiln_cpu_gemm_f32_avx2)
DEF_MM(mm_f16, gemv1_f16, tile_f16, kiln_cpu_gemm_f16_avx2)
DEF_MM(mm_bf16, gemv1_bf16, tile_bf16, kiln_cpu_gemm_bf16_avx2)

/* ---------------------------------------------------------------- attention vectors */

/* Four sums of 8 lanes each -> one vector of the 4 totals. */
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 t = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Scores four keys per pass (q chunk loaded once, one combined horizontal sum). */
#define DEF_KV(SUFFIX, LD, SC)                                                                         \
    static void kv_dot_##SUFFIX(int64_t hd, const float *q, const void *k, size_t ks, int64_t nk,     \
                                float *s)                                                              \
    {                                                                                                  \
        int64_t j = 0, hv = hd & ~(int64_t)7;                                                          \
        for (; j + 4 <= nk; j += 4) {                                                                  \
            const char *k0 = ROWB(k, j, ks), *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;              \
            for (size_t o = 0; j + 12 <= nk && o < 4 * ks; o += 64) /* keys two passes ahead */       \
                _mm_prefetch(k0 + 8 * ks + o, _MM_HINT_T0);                                            \
            /* Two accumulators per key: eight FMA chains hide the FMA latency (four chains left \
             * the dot latency-bound at about twice the cycles per key). */                         \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0; \
            int64_t t = 0;                                                                             \
            for (; t + 16 <= hv; t += 16) {                                                            \
                __m256 qv = _mm256_loadu_ps(q + t), qw = _mm256_loadu_ps(q + t + 8);                   \
                a0 = _mm256_fmadd_ps(qv, LD(k0, t), a0);                                               \
                a1 = _mm256_fmadd_ps(qv, LD(k1, t), a1);                                               \
                a2 = _mm256_fmadd_ps(qv, LD(k2, t), a2);                                               \
                a3 = _mm256_fmadd_ps(qv, LD(k3, t), a3);                                               \
                b0 = _mm256_fmadd_ps(qw, LD(k0, t + 8), b0);                                           \
                b1 = _mm256_fmadd_ps(qw, LD(k1, t + 8), b1);                                           \
                b2 = _mm256_fmadd_ps(qw, LD(k2, t + 8), b2);                                           \
                b3 = _mm256_fmadd_ps(qw, LD(k3, t + 8), b3);                                           \
            }                                                                                          \
            if (t < hv) {                                                                              \
                __m256 qv = _mm256_loadu_ps(q + t);                                                    \
                a0 = _mm256_fmadd_ps(qv, LD(k0, t), a0);                                               \
                a1 = _mm256_fmadd_ps(qv, LD(k1, t), a1);                                               \
                a2 = _mm256_fmadd_ps(qv, LD(k2, t), a2);                                               \
                a3 = _mm256_fmadd_ps(qv, LD(k3, t), a3);                                               \
            }                                                                                          \
            _mm_storeu_ps(s + j, hsum4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2), \
                                       _mm256_add_ps(a3, b3)));                                        \
            for (t = hv; t < hd; t++) {                                                                \
                s[j] += q[t] * SC(k0, t);                                                              \
                s[j + 1] += q[t] * SC(k1, t);                                                          \
                s[j + 2] += q[t] * SC(k2, t);                                                          \
                s[j + 3] += q[t] * SC(k3, t);                                                          \
            }                                                                                          \
        }                                                                                              \
        for (; j < nk; j++) {                                                                          \
            const char *kr = ROWB(k, j, ks);                                                           \
            __m256 a0 = _mm256_setzero_ps();                                                           \
            for (int64_t t = 0; t < hv; t += 8)                                                        \
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + t), LD(kr, t), a0);                           \
            float a = hsum(a0);                                                                        \
            for (int64_t t = hv; t < hd; t++)                                                          \
                a += q[t] * SC(kr, t);                                                                 \
            s[j] = a;                                                                                  \
        }                                                                                              \
    }                                                                                                  \
    /* acc columns in blocks of 64 stay in 8 registers while all nk values stream past. */         \
    static void kv_axpy_##SUFFIX(int64_t hd, float c, const float *p, const void *v, size_t vs,       \
                                 int64_t nk, float *acc)                                               \
    {                                                                                                  \
        const __m256 cv = _mm256_set1_ps(c);                                                           \
        int64_t t0 = 0;                                                                                \
        for (; t0 + 64 <= hd; t0 += 64) {                                                              \
            __m256 a[8];                                                                               \
            _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) a[u] =                                 \
                _mm256_mul_ps(cv, _mm256_loadu_ps(acc + t0 + 8 * u));                                 \
            for (int64_t j = 0; j < nk; j++) {                                                         \
                const char *vr = ROWB(v, j, vs);                                                       \
                __m256 pv = _mm256_set1_ps(p[j]);                                                      \
                _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) a[u] =                             \
                    _mm256_fmadd_ps(pv, LD(vr, t0 + 8 * u), a[u]);                                     \
            }                                                                                          \
            _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) _mm256_storeu_ps(acc + t0 + 8 * u, a[u]); \
        }                                                                                              \
        int64_t t = t0;                                                                                \
        for (; t + 8 <= hd; t += 8)                                                                    \
            _mm256_storeu_ps(acc + t, _mm256_mul_ps(cv, _mm256_loadu_ps(acc + t)));                    \
        for (; t < hd; t++)                                                                            \
            acc[t] *= c;                                                                               \
        for (int64_t j = 0; j < nk; j++) {                                                             \
            const char *vr = ROWB(v, j, vs);                                                           \
            __m256 pv = _mm256_set1_ps(p[j]);                                                          \
            for (t = t0; t + 8 <= hd; t += 8)                                                          \
                _mm256_storeu_ps(acc + t, _mm256_fmadd_ps(pv, LD(vr, t), _mm256_loadu_ps(acc + t)));   \
            for (; t < hd; t++)                                                                        \
                acc[t] += p[j] * SC(vr, t);                                                            \
        }                                                                                              \
    }

DEF_KV(f32, LD_F32, SC_F32)
DEF_KV(f16, LD_F16, SC_F16)


static float exp_sum(float *s, int64_t n, float m)
{
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = kiln_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float l = hsum(acc);
    for (; j < n; j++)
        l += (s[j] = expf(s[j] - m));
    return l;
}

/* ---------------------------------------------------------------- calibration */

static volatile float g_sink; /* keeps the loop's result alive */

static double fma_loop(int64_t iters)
{
    __m256 a[12];
    const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int u = 0; u < 12; u++)
        a[u] = _mm256_set1_ps((float)u);
    for (int64_t i = 0; i < iters; i++) {
        _Pragma("GCC unroll 12") for (int u = 0; u < 12; u++) a[u] = _mm256_fmadd_ps(a[u], b, c);
    }
    __m256 s = a[0];
    for (int u = 1; u < 12; u++)
        s = _mm256_add_ps(s, a[u]);
    g_sink = hsum(s);
    return (double)iters * 12 * 8 * 2;
}

/* Streams bytes with 4 independent 256-bit loads per step (XOR keeps them live, 1 uop each). */
static uint64_t read_sum(const void *p, size_t bytes)
{
    const __m256i *v = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes / 32; i += 4) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + i + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + i + 3));
    }
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

const kiln_cpu_kern kiln_cpu_kern_avx2 = {
    .mm = {
        [KILN_DTYPE_F32] = mm_f32,
        [KILN_DTYPE_F16] = mm_f16,
        [KILN_DTYPE_BF16] = mm_bf16,
        [KILN_DTYPE_Q8_0] = kiln_cpu_mm_q8_0_avx2,
        [KILN_DTYPE_Q4_K] = kiln_cpu_mm_q4_k_avx2,
        [KILN_DTYPE_Q5_K] = kiln_cpu_mm_q5_k_avx2,
        [KILN_DTYPE_Q6_K] = kiln_cpu_mm_q6_k_avx2,
        [KILN_DTYPE_Q4_0] = kiln_cpu_mm_q4_0_avx2,
        [KILN_DTYPE_Q4_1] = kiln_cpu_mm_q4_1_avx2,
        [KILN_DTYPE_Q5_0] = kiln_cpu_mm_q5_0_avx2,
        [KILN_DTYPE_Q5_1] = kiln_cpu_mm_q5_1_avx2,
        [KILN_DTYPE_IQ4_NL] = kiln_cpu_mm_iq4_nl_avx2,
        [KILN_DTYPE_Q2_K] = kiln_cpu_mm_q2_k_avx2,
        [KILN_DTYPE_Q3_K] = kiln_cpu_mm_q3_k_avx2,
        [KILN_DTYPE_IQ4_XS] = kiln_cpu_mm_iq4_xs_avx2,
    },
    .kv_dot = {kv_dot_f32, kv_dot_f16},
    .kv_axpy = {kv_axpy_f32, kv_axpy_f16},
    .exp_sum = exp_sum,
    .fma_loop = fma_loop,
    .read_sum = read_sum,
    .swiglu = kiln_cpu_swiglu_avx2,
};
