/* AVX-512 (F/BW/VL/DQ) kernels for float weights (f32, f16, bf16): GEMV for one activation row
 * (4 weight rows x 2-way unrolled K, 8 accumulators of 16 lanes), register-tiled GEMM (4
 * activation rows x 4 weight rows) for more; attention vector ops; exp; the FMA-peak and
 * read-bandwidth loops. Odd lengths end in one masked step (masked loads do not fault past the
 * end). Built without VNNI/BF16: called only when cpuid reports AVX-512. Quantized weights take
 * the AVX2 kernels, or quant_avx512vnni.c's where the CPU has VNNI (isa.c decides). */
#include <immintrin.h>
#include <math.h>

#include "backends/cpu/kern.h"

#define ROWB(base, i, stride) ((const char *)(base) + (size_t)(i) * (stride))

/* Lanes [0, n) of 16 set; 0 <= n <= 16. */
static inline __mmask16 tail_mask(int64_t n)
{
    return (__mmask16)((1u << (unsigned)n) - 1u);
}

/* 16 weights from element i of row p as f32: full (LD) and masked, zero outside mk (LDM). */
#define LD_F32(p, i) _mm512_loadu_ps((const float *)(p) + (i))
#define LD_F16(p, i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)(p) + (i))))
#define LD_BF16(p, i)                                                                                  \
    _mm512_castsi512_ps(                                                                               \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)(p) + (i)))), 16))
#define LDM_F32(p, i, mk) _mm512_maskz_loadu_ps((mk), (const float *)(p) + (i))
#define LDM_F16(p, i, mk) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((mk), (const uint16_t *)(p) + (i)))
#define LDM_BF16(p, i, mk)                                                                             \
    _mm512_castsi512_ps(                                                                               \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((mk), (const uint16_t *)(p) + (i))), 16))

/* One activation row against weight rows: 4 rows at a time, K unrolled by 32, then at most one
 * full and one masked step of 16. The next group of 4 rows is prefetched while this one streams
 * (ES: bytes per weight element; one prefetch per 64 bytes of each row, as in gemv_avx2.c). */
#define DEF_GEMV1(NAME, LD, LDM, ES)                                                                   \
    static void NAME(int64_t k, const char *w, size_t ws, int64_t nw, const float *x, float *y)       \
    {                                                                                                  \
        const __mmask16 mt = tail_mask(k & 15);                                                        \
        int64_t j = 0;                                                                                 \
        for (; j + 4 <= nw; j += 4) {                                                                  \
            const char *w0 = w + j * ws, *w1 = w0 + ws, *w2 = w1 + ws, *w3 = w2 + ws;                  \
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0; \
            int64_t t = 0;                                                                             \
            for (; t + 32 <= k; t += 32) {                                                             \
                if (j + 8 <= nw)                                                                       \
                    _Pragma("GCC unroll 4") for (int r = 4; r < 8; r++)                                \
                        _Pragma("GCC unroll 2") for (int o = 0; o < 32 * (ES); o += 64)                \
                            _mm_prefetch(w0 + r * ws + t * (ES) + o, _MM_HINT_T0);                     \
                const __m512 x0 = _mm512_loadu_ps(x + t), x1 = _mm512_loadu_ps(x + t + 16);            \
                a0 = _mm512_fmadd_ps(x0, LD(w0, t), a0);                                               \
                a1 = _mm512_fmadd_ps(x0, LD(w1, t), a1);                                               \
                a2 = _mm512_fmadd_ps(x0, LD(w2, t), a2);                                               \
                a3 = _mm512_fmadd_ps(x0, LD(w3, t), a3);                                               \
                b0 = _mm512_fmadd_ps(x1, LD(w0, t + 16), b0);                                          \
                b1 = _mm512_fmadd_ps(x1, LD(w1, t + 16), b1);                                          \
                b2 = _mm512_fmadd_ps(x1, LD(w2, t + 16), b2);                                          \
                b3 = _mm512_fmadd_ps(x1, LD(w3, t + 16), b3);                                          \
            }                                                                                          \
            if (t + 16 <= k) {                                                                         \
                const __m512 x0 = _mm512_loadu_ps(x + t);                                              \
                a0 = _mm512_fmadd_ps(x0, LD(w0, t), a0);                                               \
                a1 = _mm512_fmadd_ps(x0, LD(w1, t), a1);                                               \
                a2 = _mm512_fmadd_ps(x0, LD(w2, t), a2);                                               \
                a3 = _mm512_fmadd_ps(x0, LD(w3, t), a3);                                               \
                t += 16;                                                                               \
            }                                                                                          \
            if (t < k) { /* the last k % 16 values */                                                 \
                const __m512 x0 = _mm512_maskz_loadu_ps(mt, x + t);                                    \
                b0 = _mm512_fmadd_ps(x0, LDM(w0, t, mt), b0);                                          \
                b1 = _mm512_fmadd_ps(x0, LDM(w1, t, mt), b1);                                          \
                b2 = _mm512_fmadd_ps(x0, LDM(w2, t, mt), b2);                                          \
                b3 = _mm512_fmadd_ps(x0, LDM(w3, t, mt), b3);                                          \
            }                                                                                          \
            y[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, b0));                                        \
            y[j + 1] = _mm512_reduce_add_ps(_mm512_add_ps(a1, b1));                                    \
            y[j + 2] = _mm512_reduce_add_ps(_mm512_add_ps(a2, b2));                                    \
            y[j + 3] = _mm512_reduce_add_ps(_mm512_add_ps(a3, b3));                                    \
        }                                                                                              \
        for (; j < nw; j++) {                                                                          \
            const char *w0 = w + j * ws;                                                               \
            __m512 a0 = _mm512_setzero_ps();                                                           \
            int64_t t = 0;                                                                             \
            for (; t + 16 <= k; t += 16)                                                               \
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + t), LD(w0, t), a0);                           \
            if (t < k)                                                                                 \
                a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, x + t), LDM(w0, t, mt), a0);            \
            y[j] = _mm512_reduce_add_ps(a0);                                                           \
        }                                                                                              \
    }

#define TM 4 /* activation rows per GEMM tile */
#define TN 4 /* weight rows per GEMM tile */

/* An mr x nr tile (mr <= TM activation rows, nr <= TN weight rows); inlined with constant sizes
 * for full tiles so the 16 accumulators stay in registers. Every step loads under a mask (all
 * ones but for the last k % 16 values): each load feeds 4 FMAs, so nothing is lost by not
 * folding it into one. */
#define DEF_TILE(NAME, LDM)                                                                            \
    static inline __attribute__((always_inline)) void NAME(int64_t k, const char *w, size_t ws, int nr, \
                                                           const char *x, size_t xs, int mr, float *y,  \
                                                           int64_t ldy)                                 \
    {                                                                                                  \
        const int64_t kv = k & ~(int64_t)15;                                                           \
        const __mmask16 mt = tail_mask(k - kv);                                                        \
        __m512 acc[TM][TN];                                                                            \
        _Pragma("GCC unroll 4") for (int i = 0; i < TM; i++)                                           \
            _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++) acc[i][j] = _mm512_setzero_ps();      \
        for (int64_t t = 0; t < k; t += 16) {                                                          \
            const __mmask16 mk = t < kv ? (__mmask16)0xffff : mt;                                      \
            __m512 wv[TN];                                                                             \
            _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++) wv[j] =                               \
                j < nr ? LDM(w + j * ws, t, mk) : _mm512_setzero_ps();                                 \
            _Pragma("GCC unroll 4") for (int i = 0; i < TM; i++) if (i < mr)                           \
            {                                                                                          \
                const __m512 xv = _mm512_maskz_loadu_ps(mk, (const float *)(x + i * xs) + t);          \
                _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++) if (j < nr)                       \
                    acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);                                 \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 4") for (int i = 0; i < TM; i++) if (i < mr)                               \
            _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++) if (j < nr)                           \
                y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);                                      \
    }

/* m == 1: GEMV. m <= 8: weight tiles outer (each weight row read from memory once). More rows:
 * the packed-panel GEMM WIDE of gemm_avx2.c, which beat 512-bit tiles on a 16-core Sapphire
 * Rapids host (qwen2-0.5b prefill, 128 tokens, f32: 795 vs 781 GFLOP/s). */
#define DEF_MM(NAME, GEMV1, TILE, WIDE)                                                                \
    static void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs,      \
                     int64_t m, float *y, int64_t ldy)                                                 \
    {                                                                                                  \
        if (m == 1) {                                                                                  \
            GEMV1(k, w, ws, nw, xa, y);                                                                \
            return;                                                                                    \
        }                                                                                              \
        if (m > 8) {                                                                                   \
            WIDE(k, w, ws, nw, xa, xs, m, y, ldy);                                                     \
            return;                                                                                    \
        }                                                                                              \
        for (int64_t j0 = 0; j0 < nw; j0 += TN)                                                        \
            for (int64_t i0 = 0; i0 < m; i0 += TM) {                                                   \
                int mr = m - i0 < TM ? (int)(m - i0) : TM, nr = nw - j0 < TN ? (int)(nw - j0) : TN;    \
                const char *wp = ROWB(w, j0, ws), *xp = ROWB(xa, i0, xs);                              \
                float *yp = y + i0 * ldy + j0;                                                         \
                if (mr == TM && nr == TN)                                                              \
                    TILE(k, wp, ws, TN, xp, xs, TM, yp, ldy);                                          \
                else                                                                                   \
                    TILE(k, wp, ws, nr, xp, xs, mr, yp, ldy);                                          \
            }                                                                                          \
    }

DEF_GEMV1(gemv1_f32, LD_F32, LDM_F32, 4)
DEF_GEMV1(gemv1_f16, LD_F16, LDM_F16, 2)
DEF_GEMV1(gemv1_bf16, LD_BF16, LDM_BF16, 2)
DEF_TILE(tile_f32, LDM_F32)
DEF_TILE(tile_f16, LDM_F16)
DEF_TILE(tile_bf16, LDM_BF16)
DEF_MM(mm_f32, gemv1_f32, tile_f32, kiln_cpu_gemm_f32_avx2)
DEF_MM(mm_f16, gemv1_f16, tile_f16, kiln_cpu_gemm_f16_avx2)
DEF_MM(mm_bf16, gemv1_bf16, tile_bf16, kiln_cpu_gemm_bf16_avx2)

/* ---------------------------------------------------------------- attention vectors */

/* Four sums of 16 lanes each -> one vector of the 4 totals (halves added, then hadd trees). */
static inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
#define HALVES(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps((v), 1))
    __m256 ab = _mm256_hadd_ps(HALVES(a), HALVES(b)), cd = _mm256_hadd_ps(HALVES(c), HALVES(d));
#undef HALVES
    __m256 t = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Scores four keys per pass (q chunk loaded once, one combined horizontal sum); the last
 * hd % 16 values of every key in one masked step. */
#define DEF_KV(SUFFIX, LD, LDM)                                                                        \
    static void kv_dot_##SUFFIX(int64_t hd, const float *q, const void *k, size_t ks, int64_t nk,     \
                                float *s)                                                              \
    {                                                                                                  \
        const int64_t hv = hd & ~(int64_t)15;                                                          \
        const __mmask16 mt = tail_mask(hd - hv);                                                       \
        int64_t j = 0;                                                                                 \
        for (; j + 4 <= nk; j += 4) {                                                                  \
            const char *k0 = ROWB(k, j, ks), *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;              \
            for (size_t o = 0; j + 12 <= nk && o < 4 * ks; o += 64) /* keys two passes ahead */       \
                _mm_prefetch(k0 + 8 * ks + o, _MM_HINT_T0);                                            \
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
            for (int64_t t = 0; t < hv; t += 16) {                                                     \
                const __m512 qv = _mm512_loadu_ps(q + t);                                              \
                a0 = _mm512_fmadd_ps(qv, LD(k0, t), a0);                                               \
                a1 = _mm512_fmadd_ps(qv, LD(k1, t), a1);                                               \
                a2 = _mm512_fmadd_ps(qv, LD(k2, t), a2);                                               \
                a3 = _mm512_fmadd_ps(qv, LD(k3, t), a3);                                               \
            }                                                                                          \
            if (hv < hd) {                                                                             \
                const __m512 qv = _mm512_maskz_loadu_ps(mt, q + hv);                                   \
                a0 = _mm512_fmadd_ps(qv, LDM(k0, hv, mt), a0);                                         \
                a1 = _mm512_fmadd_ps(qv, LDM(k1, hv, mt), a1);                                         \
                a2 = _mm512_fmadd_ps(qv, LDM(k2, hv, mt), a2);                                         \
                a3 = _mm512_fmadd_ps(qv, LDM(k3, hv, mt), a3);                                         \
            }                                                                                          \
            _mm_storeu_ps(s + j, hsum4(a0, a1, a2, a3));                                               \
        }                                                                                              \
        for (; j < nk; j++) {                                                                          \
            const char *kr = ROWB(k, j, ks);                                                           \
            __m512 a0 = _mm512_setzero_ps();                                                           \
            for (int64_t t = 0; t < hv; t += 16)                                                       \
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + t), LD(kr, t), a0);                           \
            if (hv < hd)                                                                               \
                a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, q + hv), LDM(kr, hv, mt), a0);          \
            s[j] = _mm512_reduce_add_ps(a0);                                                           \
        }                                                                                              \
    }                                                                                                  \
    /* Columns [t0, t0 + 16 nu) of acc, in nu <= 8 registers (the last under mask ml), scaled by c \
     * and then swept by all nk values. Inlined with nu = 8, ml = all ones for full blocks. */      \
    static inline __attribute__((always_inline)) void axpy_block_##SUFFIX(                             \
        int64_t t0, int nu, __mmask16 ml, float c, const float *p, const void *v, size_t vs, int64_t nk, \
        float *acc)                                                                                    \
    {                                                                                                  \
        const __m512 cv = _mm512_set1_ps(c);                                                           \
        __m512 a[8];                                                                                   \
        __mmask16 mk[8];                                                                               \
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++)                                            \
        {                                                                                              \
            mk[u] = u + 1 < nu ? (__mmask16)0xffff : u + 1 == nu ? ml : (__mmask16)0;                  \
            a[u] = _mm512_mul_ps(cv, _mm512_maskz_loadu_ps(mk[u], acc + t0 + 16 * u));                 \
        }                                                                                              \
        for (int64_t j = 0; j < nk; j++) {                                                             \
            const char *vr = ROWB(v, j, vs);                                                           \
            const __m512 pv = _mm512_set1_ps(p[j]);                                                    \
            _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) if (u < nu)                            \
                a[u] = _mm512_fmadd_ps(pv, LDM(vr, t0 + 16 * u, mk[u]), a[u]);                         \
        }                                                                                              \
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) if (u < nu)                                \
            _mm512_mask_storeu_ps(acc + t0 + 16 * u, mk[u], a[u]);                                     \
    }                                                                                                  \
    /* acc columns in blocks of 128 stay in 8 registers while all nk values stream past. */        \
    static void kv_axpy_##SUFFIX(int64_t hd, float c, const float *p, const void *v, size_t vs,       \
                                 int64_t nk, float *acc)                                               \
    {                                                                                                  \
        int64_t t0 = 0;                                                                                \
        for (; t0 + 128 <= hd; t0 += 128)                                                              \
            axpy_block_##SUFFIX(t0, 8, (__mmask16)0xffff, c, p, v, vs, nk, acc);                       \
        if (t0 < hd) {                                                                                 \
            int nu = (int)((hd - t0 + 15) / 16);                                                       \
            axpy_block_##SUFFIX(t0, nu, tail_mask(hd - t0 - 16 * (nu - 1)), c, p, v, vs, nk, acc);     \
        }                                                                                              \
    }

DEF_KV(f32, LD_F32, LDM_F32)
DEF_KV(f16, LD_F16, LDM_F16)

/* exp(x) for x <= 0 (Cephes polynomial, ~1 ulp; below -87.3 it flushes to 0), as in gemv_avx2.c. */
static inline __m512 exp_neg(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* The last n % 16 scores load as m (exp 1) in the lanes past the end, which are neither summed
 * nor stored. */
static float exp_sum(float *s, int64_t n, float m)
{
    const __m512 mv = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
        _mm512_storeu_ps(s + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < n) {
        const __mmask16 mt = tail_mask(n - j);
        __m512 e = exp_neg(_mm512_sub_ps(_mm512_mask_loadu_ps(mv, mt, s + j), mv));
        _mm512_mask_storeu_ps(s + j, mt, e);
        acc = _mm512_mask_add_ps(acc, mt, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* ---------------------------------------------------------------- calibration */

static volatile float g_sink; /* keeps the loop's result alive */

/* 12 independent chains cover 2 FMA pipes x 4-6 cycles of latency. */
static double fma_loop(int64_t iters)
{
    __m512 a[12];
    const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int u = 0; u < 12; u++)
        a[u] = _mm512_set1_ps((float)u);
    for (int64_t i = 0; i < iters; i++) {
        _Pragma("GCC unroll 12") for (int u = 0; u < 12; u++) a[u] = _mm512_fmadd_ps(a[u], b, c);
    }
    __m512 s = a[0];
    for (int u = 1; u < 12; u++)
        s = _mm512_add_ps(s, a[u]);
    g_sink = _mm512_reduce_add_ps(s);
    return (double)iters * 12 * 16 * 2;
}

/* Streams bytes with 4 independent 512-bit loads per step (XOR keeps them live, 1 uop each);
 * bytes is a multiple of 128, so an odd count of 128-byte halves ends in one 2-load step. */
static uint64_t read_sum(const void *p, size_t bytes)
{
    const char *c = p;
    const size_t n = bytes / 64;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 = _mm512_xor_si512(a0, _mm512_loadu_si512(c + 64 * i));
        a1 = _mm512_xor_si512(a1, _mm512_loadu_si512(c + 64 * (i + 1)));
        a2 = _mm512_xor_si512(a2, _mm512_loadu_si512(c + 64 * (i + 2)));
        a3 = _mm512_xor_si512(a3, _mm512_loadu_si512(c + 64 * (i + 3)));
    }
    if (i < n) {
        a0 = _mm512_xor_si512(a0, _mm512_loadu_si512(c + 64 * i));
        a1 = _mm512_xor_si512(a1, _mm512_loadu_si512(c + 64 * (i + 1)));
    }
    __m512i a = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    __m256i h = _mm256_xor_si256(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    return (uint64_t)_mm256_extract_epi64(h, 0) ^ (uint64_t)_mm256_extract_epi64(h, 3);
}

/* Quantized entries stay NULL: they fall back to the AVX2 kernels (isa.c lays the VNNI table of
 * quant_avx512vnni.c over this one when the CPU has VNNI). */
const kiln_cpu_kern kiln_cpu_kern_avx512 = {
    .mm = {
        [KILN_DTYPE_F32] = mm_f32,
        [KILN_DTYPE_F16] = mm_f16,
        [KILN_DTYPE_BF16] = mm_bf16,
    },
    .kv_dot = {kv_dot_f32, kv_dot_f16},
    .kv_axpy = {kv_axpy_f32, kv_axpy_f16},
    .exp_sum = exp_sum,
    .fma_loop = fma_loop,
    .read_sum = read_sum,
};
