/* AVX2+FMA+F16C GEMM for many activation rows (prefill): y = x · Wᵀ over one driver chunk of
 * weight rows. Each block of the chunk's weights is packed once into a panel laid out for an
 * outer-product micro-kernel (f32: 16 weight rows side by side, f16/bf16 converted; q8_0, q4_K,
 * q6_K: int8 quads of 8 weight rows side by side, 4- and 6-bit quants unpacked), and all
 * activation rows then sweep the panel while it sits in L1, broadcasting their values straight
 * from the prepared formats (f32 rows, q8 blocks, q8_K blocks): activations are never re-packed.
 * The mm entries of gemv_avx2.c / quant_avx2.c call these for m > 8; the matmul driver's swiglu
 * epilogue is here too. Built with -mavx2 -mfma -mf16c; must not hold the m <= 8 paths. */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/avx2_math.h"
#include "backends/cpu/kern.h"

#define INL static inline __attribute__((always_inline))

/* In-place 8x8 transpose of 32-bit lanes: afterwards v[u] holds lane u of the old v[0..7]. */
INL void transpose8(__m256 v[8])
{
    __m256 t[8], s[8];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
        v[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
    }
}

/* Broadcasts the 4 bytes at p (an int8 quad) to all 8 lanes. */
INL __m256i bcast_quad(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* Length of the k-blocks that split `units` into as few blocks of at most max as possible, evened
 * out and rounded up to align. */
static int64_t split_k(int64_t units, int64_t max, int64_t align)
{
    int64_t nk = (units + max - 1) / max;
    int64_t kc = (units + nk - 1) / nk;
    kc = (kc + align - 1) / align * align;
    return kc < max ? kc : max;
}

/* Where the pack after the current one reads: the next panel of this k-block, else the first panel
 * of the next k-block. The current k-block is units [u0, u0 + un) of ub bytes each (values or
 * blocks), of kc per k-block and `units` in all. Returns its rows (0: none left in this chunk) and
 * sets *p and *bytes to its first row's range. */
static int next_panel(const char *w, size_t ws, int64_t nw, int64_t j0, int nr_max, int64_t u0, int64_t un,
                      int64_t kc, int64_t units, size_t ub, const char **p, size_t *bytes)
{
    *p = w, *bytes = 0;
    if (j0 + nr_max < nw) {
        *p = w + (size_t)(j0 + nr_max) * ws + (size_t)u0 * ub, *bytes = (size_t)un * ub;
        return nw - j0 - nr_max < nr_max ? (int)(nw - j0 - nr_max) : nr_max;
    }
    if (u0 + un < units) {
        const int64_t n1 = units - u0 - un < kc ? units - u0 - un : kc;
        *p = w + (size_t)(u0 + un) * ub, *bytes = (size_t)n1 * ub;
        return nw < nr_max ? (int)nw : nr_max;
    }
    return 0;
}

/* Fetches [p, p + bytes) into cache: one row of the next panel per micro-tile of the current sweep,
 * so the next pack reads cache instead of waiting on memory (f32, 4864 x 896 weights, one thread:
 * 7% slower without). */
INL void prefetch_range(const char *p, size_t bytes)
{
    for (const char *a = p - ((uintptr_t)p & 63); a < p + bytes; a += 64)
        _mm_prefetch(a, _MM_HINT_T0);
}

/* ---------------------------------------------------------------- float weights */

#define F_NR 16  /* weight rows per panel (two vectors) */
#define F_MR 6   /* activation rows per micro-tile: 12 accumulators */
#define F_KC 256 /* k per panel: 16 KB, stays in L1 while every activation row passes */

#define LD_F32(p, i) _mm256_loadu_ps((const float *)(p) + (i))
#define LD_F16(p, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (i))))
#define LD_BF16(p, i)                                                                                  \
    _mm256_castsi256_ps(                                                                               \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (i)))), 16))
#define SC_F32(p, i) (((const float *)(p))[i])
#define SC_F16(p, i) _cvtsh_ss(((const uint16_t *)(p))[i])
#define SC_BF16(p, i) kiln_bf16_to_f32(((const uint16_t *)(p))[i])

/* p[t * 16 + r] = W[r][t0 + t] as f32 for t < kc: nr (<= 16) weight rows ws bytes apart, the
 * missing rows zero. Full groups of 8 rows go through 8x8 transposes. */
#define DEF_PACK_F(NAME, LD, SC)                                                                       \
    static void NAME(const char *w, size_t ws, int nr, int64_t t0, int64_t kc, float *p)              \
    {                                                                                                  \
        for (int r0 = 0; r0 < F_NR; r0 += 8) {                                                         \
            int64_t t = 0;                                                                             \
            if (nr >= r0 + 8)                                                                          \
                for (; t + 8 <= kc; t += 8) {                                                          \
                    __m256 v[8];                                                                       \
                    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) v[r] = LD(w + (r0 + r) * ws, t0 + t); \
                    transpose8(v);                                                                     \
                    _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++)                                \
                        _mm256_store_ps(p + (t + u) * F_NR + r0, v[u]);                                \
                }                                                                                      \
            for (; t < kc; t++)                                                                        \
                for (int r = r0; r < r0 + 8; r++)                                                      \
                    p[t * F_NR + r] = r < nr ? SC(w + r * ws, t0 + t) : 0.0f;                          \
        }                                                                                              \
    }

DEF_PACK_F(pack_f32, LD_F32, SC_F32)
DEF_PACK_F(pack_f16, LD_F16, SC_F16)
DEF_PACK_F(pack_bf16, LD_BF16, SC_BF16)

/* c[r][0..15] (+)= sum_t x[r][t] * p[t][0..15] for r < MR: two panel loads and MR broadcasts
 * feed 2*MR FMAs per step. acc: add to c (later k-blocks) instead of overwriting it. */
INL void ukr_f(const int MR, int64_t kc, const float *p, const float *x, int64_t ldx, float *c, int64_t ldc,
               bool acc)
{
    __m256 c0[F_MR], c1[F_MR];
    _Pragma("GCC unroll 6") for (int r = 0; r < F_MR; r++)
    {
        c0[r] = r < MR && acc ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
        c1[r] = r < MR && acc ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
    }
    _Pragma("GCC unroll 2") for (int64_t t = 0; t < kc; t++)
    {
        const __m256 b0 = _mm256_load_ps(p + t * F_NR), b1 = _mm256_load_ps(p + t * F_NR + 8);
        _Pragma("GCC unroll 6") for (int r = 0; r < F_MR; r++) if (r < MR)
        {
            const __m256 a = _mm256_broadcast_ss(x + r * ldx + t);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < F_MR; r++) if (r < MR)
    {
        _mm256_storeu_ps(c + r * ldc, c0[r]);
        _mm256_storeu_ps(c + r * ldc + 8, c1[r]);
    }
}

/* One micro-tile of mr rows; nr < 16 weight rows go through a full-width scratch tile. */
static void tile_f(int mr, int nr, int64_t kc, const float *p, const float *x, int64_t ldx, float *y,
                   int64_t ldy, bool acc)
{
    float tmp[F_MR * F_NR];
    float *c = y;
    int64_t ldc = ldy;
    if (nr < F_NR) {
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < nr; j++)
                tmp[r * F_NR + j] = acc ? y[r * ldy + j] : 0.0f;
        c = tmp, ldc = F_NR;
    }
    switch (mr) {
    case 6: ukr_f(6, kc, p, x, ldx, c, ldc, acc); break;
    case 5: ukr_f(5, kc, p, x, ldx, c, ldc, acc); break;
    case 4: ukr_f(4, kc, p, x, ldx, c, ldc, acc); break;
    case 3: ukr_f(3, kc, p, x, ldx, c, ldc, acc); break;
    case 2: ukr_f(2, kc, p, x, ldx, c, ldc, acc); break;
    default: ukr_f(1, kc, p, x, ldx, c, ldc, acc); break;
    }
    if (nr < F_NR)
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < nr; j++)
                y[r * ldy + j] = tmp[r * F_NR + j];
}

/* Rows of the next micro-tile when left rows remain: 6, except that a remainder of 1 or 2 rows
 * (2 or 4 accumulator chains: too few to cover the FMA latency) is merged with the tile before it
 * into two tiles of 3 to 4 rows. */
static int tile_rows(int64_t left)
{
    if (left > 2 * F_MR || left == F_MR || left % F_MR > 2)
        return left < F_MR ? (int)left : F_MR;
    return left < F_MR ? (int)left : (int)(left + 1) / 2;
}

/* k-blocks outer (the activation rows of one block stay in L2), then panels of 16 weight rows,
 * each packed once and swept by all m rows in micro-tiles of (mostly) 6 (ES: bytes per weight
 * value). */
#define DEF_GEMM_F(NAME, PACK, ES)                                                                     \
    void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,  \
              float *y, int64_t ldy)                                                                   \
    {                                                                                                  \
        _Alignas(32) float panel[F_KC * F_NR];                                                         \
        const float *x = xa;                                                                           \
        const int64_t ldx = (int64_t)(xs / sizeof(float)), kc = split_k(k, F_KC, 8);                   \
        for (int64_t t0 = 0; t0 < k; t0 += kc) {                                                       \
            const int64_t kn = k - t0 < kc ? k - t0 : kc;                                              \
            for (int64_t j0 = 0; j0 < nw; j0 += F_NR) {                                                \
                const int nr = nw - j0 < F_NR ? (int)(nw - j0) : F_NR;                                 \
                const char *np;                                                                        \
                size_t nb;                                                                             \
                const int nn = next_panel(w, ws, nw, j0, F_NR, t0, kn, kc, k, (ES), &np, &nb);         \
                PACK((const char *)w + (size_t)j0 * ws, ws, nr, t0, kn, panel);                        \
                for (int64_t i0 = 0, it = 0; i0 < m; it++) {                                           \
                    const int mr = tile_rows(m - i0);                                                  \
                    if (it < nn)                                                                       \
                        prefetch_range(np + it * ws, nb);                                              \
                    tile_f(mr, nr, kn, panel, x + i0 * ldx + t0, ldx, y + i0 * ldy + j0, ldy, t0 > 0); \
                    i0 += mr;                                                                          \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

DEF_GEMM_F(kiln_cpu_gemm_f32_avx2, pack_f32, 4)
DEF_GEMM_F(kiln_cpu_gemm_f16_avx2, pack_f16, 2)
DEF_GEMM_F(kiln_cpu_gemm_bf16_avx2, pack_bf16, 2)

/* ---------------------------------------------------------------- int8 micro-kernels */

#define Q_NR 8 /* weight rows per quantized panel: one int32 lane each */
#define Q_MR 4 /* activation rows per micro-tile */

/* Stores the 8 lanes of v (one per weight row) to c[0..nr). */
INL void store_lanes(float *c, __m256 v, int nr)
{
    if (nr == Q_NR) {
        _mm256_storeu_ps(c, v);
        return;
    }
    float t[Q_NR];
    _mm256_storeu_ps(t, v);
    memcpy(c, t, (size_t)nr * sizeof(float));
}

/* The 8 lanes of c[0..nr), zero past nr. */
INL __m256 load_lanes(const float *c, int nr)
{
    if (nr == Q_NR)
        return _mm256_loadu_ps(c);
    float t[Q_NR] = {0};
    memcpy(t, c, (size_t)nr * sizeof(float));
    return _mm256_loadu_ps(t);
}

/* ---------------------------------------------------------------- q8_0 */

#define Q8_KB 32 /* q8_0 blocks per panel: 9 KB */

/* One block of 32 values of 8 weight rows: q[u] lane r = the quad w[r][4u .. 4u+3]. */
typedef struct q8_panel {
    __m256i q[8]; /* int8 quads, weight rows across lanes */
    __m256  d;    /* the rows' block scales */
} q8_panel;

static void pack_q8_0(const char *w, size_t ws, int nr, int64_t b0, int64_t nb, q8_panel *p)
{
    for (int64_t b = 0; b < nb; b++) {
        __m256 v[8];
        float d[8];
        for (int r = 0; r < 8; r++) {
            v[r] = _mm256_setzero_ps(), d[r] = 0.0f;
            if (r < nr) {
                const kiln_block_q8_0 *blk = (const kiln_block_q8_0 *)(w + (size_t)r * ws) + b0 + b;
                v[r] = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)blk->qs));
                d[r] = _cvtsh_ss(blk->d);
            }
        }
        transpose8(v);
        for (int u = 0; u < 8; u++)
            p[b].q[u] = _mm256_castps_si256(v[u]);
        p[b].d = _mm256_loadu_ps(d);
    }
}

/* c[r][0..nr) (+)= dot(x row r, weight rows) over nb blocks: per quad step one weight vector
 * (|w| formed once) serves MR rows, each a broadcast, sign, maddubs and madd; per block one cvt
 * and fma per row apply the two scales. */
INL void ukr_q8_0(const int MR, int64_t nb, const q8_panel *p, const char *x, size_t xs, float *c, int64_t ldc,
                  int nr, bool acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[Q_MR];
    _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) f[r] =
        r < MR && acc ? load_lanes(c + r * ldc, nr) : _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i s[Q_MR];
        _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) s[r] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int u = 0; u < 8; u++)
        {
            const __m256i wq = _mm256_load_si256(&p[b].q[u]), aw = _mm256_abs_epi8(wq);
            _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR)
            {
                const kiln_cpu_q8a *xb = (const kiln_cpu_q8a *)(x + r * xs) + b;
                const __m256i xq = _mm256_sign_epi8(bcast_quad(xb->qs + 4 * u), wq);
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xq), ones));
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR)
        {
            const kiln_cpu_q8a *xb = (const kiln_cpu_q8a *)(x + r * xs) + b;
            const __m256 sc = _mm256_mul_ps(p[b].d, _mm256_set1_ps(xb->d));
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), sc, f[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR) store_lanes(c + r * ldc, f[r], nr);
}

/* ---------------------------------------------------------------- q4_K */

#define Q4_KB 4 /* q4_K super-blocks per panel: 10 KB */

/* One super-block of 8 weight rows. q[8s + u] lane r = the quad of values 32s + 4u .. +3 of
 * row r, unpacked to bytes 0..15. */
typedef struct q4_panel {
    __m256i q[64];  /* unsigned quads, weight rows across lanes */
    __m256i sc[8];  /* sub-block s: the rows' 6-bit scale in both int16 halves of their lane */
    __m256i mn[4];  /* pair p: the rows' mins of sub-blocks 2p, 2p+1 as two int16 */
    __m256  d;      /* the rows' super-scales */
    __m256  dmin;   /* the rows' min super-scales */
} q4_panel;

static void pack_q4_k(const char *w, size_t ws, int nr, int64_t b0, int64_t nb, q4_panel *p)
{
    const __m256i m4 = _mm256_set1_epi8(0xf);
    for (int64_t b = 0; b < nb; b++) {
        int16_t sc[8][8][2] = {{{0}}}, mn[4][8][2] = {{{0}}};
        float d[8] = {0}, dmin[8] = {0};
        for (int r = 0; r < nr; r++) {
            const kiln_block_q4_k *blk = (const kiln_block_q4_k *)(w + (size_t)r * ws) + b0 + b;
            d[r] = _cvtsh_ss(blk->d), dmin[r] = _cvtsh_ss(blk->dmin);
            for (int s = 0; s < 8; s++) {
                uint8_t s6, m6;
                kiln_get_scale_min_k4(s, blk->scales, &s6, &m6);
                sc[s][r][0] = sc[s][r][1] = s6;
                mn[s / 2][r][s % 2] = m6;
            }
        }
        /* qs[32c + l]: value 64c + l in the low nibble (sub-block 2c), 64c + 32 + l in the high. */
        for (int c = 0; c < 4; c++) {
            __m256 lo[8], hi[8];
            for (int r = 0; r < 8; r++) {
                __m256i q = _mm256_setzero_si256();
                if (r < nr) {
                    const kiln_block_q4_k *blk = (const kiln_block_q4_k *)(w + (size_t)r * ws) + b0 + b;
                    q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * c));
                }
                lo[r] = _mm256_castsi256_ps(_mm256_and_si256(q, m4));
                hi[r] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            }
            transpose8(lo);
            transpose8(hi);
            for (int u = 0; u < 8; u++) {
                p[b].q[8 * (2 * c) + u] = _mm256_castps_si256(lo[u]);
                p[b].q[8 * (2 * c + 1) + u] = _mm256_castps_si256(hi[u]);
            }
        }
        for (int s = 0; s < 8; s++)
            p[b].sc[s] = _mm256_loadu_si256((const __m256i *)sc[s]);
        for (int q = 0; q < 4; q++)
            p[b].mn[q] = _mm256_loadu_si256((const __m256i *)mn[q]);
        p[b].d = _mm256_loadu_ps(d);
        p[b].dmin = _mm256_loadu_ps(dmin);
    }
}

/* c[r][0..nr) (+)= dot(x row r, weight rows) over nb super-blocks. Quants are 0..15, so the
 * maddubs pairs (<= 2 * 15 * 127) of a whole sub-block sum in int16; one madd per sub-block and
 * row applies the 6-bit scales; the mins meet the q8_K block sums once per super-block. */
INL void ukr_q4_k(const int MR, int64_t nb, const q4_panel *p, const char *x, size_t xs, float *c, int64_t ldc,
                  int nr, bool acc)
{
    __m256 f[Q_MR];
    _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) f[r] =
        r < MR && acc ? load_lanes(c + r * ldc, nr) : _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i si[Q_MR];
        _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) si[r] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            __m256i a[Q_MR];
            _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) a[r] = _mm256_setzero_si256();
            _Pragma("GCC unroll 2") for (int u = 0; u < 8; u++)
            {
                const __m256i wq = _mm256_load_si256(&p[b].q[8 * s + u]);
                _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR)
                {
                    const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + r * xs) + b;
                    a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(wq, bcast_quad(xb->qs + 32 * s + 4 * u)));
                }
            }
            const __m256i sc = _mm256_load_si256(&p[b].sc[s]);
            _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR) si[r] =
                _mm256_add_epi32(si[r], _mm256_madd_epi16(a[r], sc));
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR)
        {
            const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + r * xs) + b;
            /* int32 lanes of h: 0 = (bsub0, bsub1), 1 = (bsub2, bsub3), 4 = (bsub4, bsub5), 5 = (bsub6, bsub7),
             * bsub_s being the q8_K sum over sub-block s. */
            const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums), h = _mm256_hadd_epi16(bs, bs);
            __m256i mins = _mm256_madd_epi16(p[b].mn[0], _mm256_permutevar8x32_epi32(h, _mm256_set1_epi32(0)));
            mins = _mm256_add_epi32(mins, _mm256_madd_epi16(p[b].mn[1], _mm256_permutevar8x32_epi32(h, _mm256_set1_epi32(1))));
            mins = _mm256_add_epi32(mins, _mm256_madd_epi16(p[b].mn[2], _mm256_permutevar8x32_epi32(h, _mm256_set1_epi32(4))));
            mins = _mm256_add_epi32(mins, _mm256_madd_epi16(p[b].mn[3], _mm256_permutevar8x32_epi32(h, _mm256_set1_epi32(5))));
            const __m256 dx = _mm256_set1_ps(xb->d);
            f[r] = _mm256_fmadd_ps(_mm256_mul_ps(p[b].d, dx), _mm256_cvtepi32_ps(si[r]), f[r]);
            f[r] = _mm256_fnmadd_ps(_mm256_mul_ps(p[b].dmin, dx), _mm256_cvtepi32_ps(mins), f[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR) store_lanes(c + r * ldc, f[r], nr);
}

/* ---------------------------------------------------------------- q6_K */

#define Q6_KB 4 /* q6_K super-blocks per panel: 11 KB */

/* One super-block of 8 weight rows. q[4g + u] lane r = the quad of values 16g + 4u .. +3 of
 * row r, unpacked to bytes 0..63 (the stored q + 32). */
typedef struct q6_panel {
    __m256i q[64];  /* unsigned quads, weight rows across lanes */
    __m256i sc[16]; /* group g of 16 values: the rows' int8 scale in both int16 halves of their lane */
    __m256i scp[8]; /* pair p: the rows' scales of groups 2p, 2p+1 as two int16 */
    __m256  d;      /* the rows' super-scales */
} q6_panel;

static void pack_q6_k(const char *w, size_t ws, int nr, int64_t b0, int64_t nb, q6_panel *p)
{
    const __m256i m4 = _mm256_set1_epi8(0xf), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++) {
        int16_t sc[16][8][2] = {{{0}}};
        float d[8] = {0};
        for (int r = 0; r < nr; r++) {
            const kiln_block_q6_k *blk = (const kiln_block_q6_k *)(w + (size_t)r * ws) + b0 + b;
            d[r] = _cvtsh_ss(blk->d);
            for (int g = 0; g < 16; g++)
                sc[g][r][0] = sc[g][r][1] = blk->scales[g];
        }
        /* Half h holds values 128h + 32c + l (c = 0..3, l = 0..31): low/high nibbles of ql[64h + l]
         * and ql[64h + 32 + l], the top two bits from bit pair c of qh[32h + l]. */
        for (int h = 0; h < 2; h++) {
            __m256 v[4][8];
            for (int r = 0; r < 8; r++) {
                __m256i b1 = _mm256_setzero_si256(), b2 = b1, bh = b1;
                if (r < nr) {
                    const kiln_block_q6_k *blk = (const kiln_block_q6_k *)(w + (size_t)r * ws) + b0 + b;
                    b1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
                    b2 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
                    bh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
                }
                const __m256i lo[4] = {_mm256_and_si256(b1, m4), _mm256_and_si256(b2, m4),
                                       _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4)};
                for (int c = 0; c < 4; c++) {
                    const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(bh, 2 * c), m2);
                    v[c][r] = _mm256_castsi256_ps(_mm256_or_si256(lo[c], _mm256_slli_epi16(hb, 4)));
                }
            }
            for (int c = 0; c < 4; c++) {
                transpose8(v[c]);
                for (int u = 0; u < 8; u++)
                    p[b].q[8 * (4 * h + c) + u] = _mm256_castps_si256(v[c][u]);
            }
        }
        for (int g = 0; g < 16; g++)
            p[b].sc[g] = _mm256_loadu_si256((const __m256i *)sc[g]);
        for (int q = 0; q < 8; q++) {
            int16_t pr[8][2];
            for (int r = 0; r < 8; r++)
                pr[r][0] = sc[2 * q][r][0], pr[r][1] = sc[2 * q + 1][r][0];
            p[b].scp[q] = _mm256_loadu_si256((const __m256i *)pr);
        }
        p[b].d = _mm256_loadu_ps(d);
    }
}

/* As ukr_q4_k, with groups of 16 values: maddubs pairs reach 2 * 63 * 127, so two quads sum in
 * int16 before each madd with the group scale. The stored quants are q + 32: 32 * sum_g scale_g *
 * bsum_g comes off once per super-block. */
INL void ukr_q6_k(const int MR, int64_t nb, const q6_panel *p, const char *x, size_t xs, float *c, int64_t ldc,
                  int nr, bool acc)
{
    __m256 f[Q_MR];
    _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) f[r] =
        r < MR && acc ? load_lanes(c + r * ldc, nr) : _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i si[Q_MR];
        _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) si[r] = _mm256_setzero_si256();
        for (int g = 0; g < 16; g++) {
            const __m256i sc = _mm256_load_si256(&p[b].sc[g]);
            _Pragma("GCC unroll 2") for (int u = 0; u < 4; u += 2)
            {
                const __m256i w0 = _mm256_load_si256(&p[b].q[4 * g + u]), w1 = _mm256_load_si256(&p[b].q[4 * g + u + 1]);
                _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR)
                {
                    const int8_t *q8 = ((const kiln_block_q8_k *)(x + r * xs))[b].qs + 16 * g + 4 * u;
                    const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(w0, bcast_quad(q8)),
                                                       _mm256_maddubs_epi16(w1, bcast_quad(q8 + 4)));
                    si[r] = _mm256_add_epi32(si[r], _mm256_madd_epi16(a, sc));
                }
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR)
        {
            const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + r * xs) + b;
            __m256i corr = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++) corr =
                _mm256_add_epi32(corr, _mm256_madd_epi16(p[b].scp[q], bcast_quad((const int8_t *)(xb->bsums + 2 * q))));
            const __m256i t = _mm256_sub_epi32(si[r], _mm256_slli_epi32(corr, 5));
            f[r] = _mm256_fmadd_ps(_mm256_mul_ps(p[b].d, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(t), f[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < Q_MR; r++) if (r < MR) store_lanes(c + r * ldc, f[r], nr);
}

/* Loops of the quantized GEMMs, as DEF_GEMM_F's: k-blocks of at most KB weight blocks (BLK, QK
 * values each; activation blocks ABLK), panels of 8 weight rows, tiles of 4 activation rows. */
#define DEF_GEMM_Q(NAME, PANEL, PACK, UKR, KB, QK, BLK, ABLK)                                          \
    void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,  \
              float *y, int64_t ldy)                                                                   \
    {                                                                                                  \
        PANEL panel[KB];                                                                               \
        const int64_t nb = k / (QK), kb = split_k(nb, (KB), 1);                                        \
        for (int64_t b0 = 0; b0 < nb; b0 += kb) {                                                      \
            const int64_t bn = nb - b0 < kb ? nb - b0 : kb;                                            \
            for (int64_t j0 = 0; j0 < nw; j0 += Q_NR) {                                                \
                const int nr = nw - j0 < Q_NR ? (int)(nw - j0) : Q_NR;                                 \
                const char *np;                                                                        \
                size_t nbytes;                                                                         \
                const int nn = next_panel(w, ws, nw, j0, Q_NR, b0, bn, kb, nb, sizeof(BLK), &np, &nbytes); \
                PACK((const char *)w + (size_t)j0 * ws, ws, nr, b0, bn, panel);                        \
                for (int64_t i0 = 0, it = 0; i0 < m; i0 += Q_MR, it++) {                               \
                    if (it < nn)                                                                       \
                        prefetch_range(np + it * ws, nbytes);                                          \
                    const char *xp = (const char *)xa + (size_t)i0 * xs + (size_t)b0 * sizeof(ABLK);   \
                    float *yp = y + i0 * ldy + j0;                                                     \
                    switch (m - i0 < Q_MR ? m - i0 : Q_MR) {                                           \
                    case 4: UKR(4, bn, panel, xp, xs, yp, ldy, nr, b0 > 0); break;                     \
                    case 3: UKR(3, bn, panel, xp, xs, yp, ldy, nr, b0 > 0); break;                     \
                    case 2: UKR(2, bn, panel, xp, xs, yp, ldy, nr, b0 > 0); break;                     \
                    default: UKR(1, bn, panel, xp, xs, yp, ldy, nr, b0 > 0); break;                    \
                    }                                                                                  \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

DEF_GEMM_Q(kiln_cpu_gemm_q8_0_avx2, q8_panel, pack_q8_0, ukr_q8_0, Q8_KB, KILN_QK8_0, kiln_block_q8_0, kiln_cpu_q8a)
DEF_GEMM_Q(kiln_cpu_gemm_q4_k_avx2, q4_panel, pack_q4_k, ukr_q4_k, Q4_KB, KILN_QK_K, kiln_block_q4_k, kiln_block_q8_k)
DEF_GEMM_Q(kiln_cpu_gemm_q6_k_avx2, q6_panel, pack_q6_k, ukr_q6_k, Q6_KB, KILN_QK_K, kiln_block_q6_k, kiln_block_q8_k)

/* ---------------------------------------------------------------- swiglu epilogue */


/* silu(v) = v * sigmoid(v), with e = e^-|v| in (0, 1]: sigmoid = 1 / (1 + e) for v >= 0 and
 * e / (1 + e) below, so the exponential never overflows. */
INL __m256 silu_mul(__m256 v, __m256 u)
{
    const __m256 e = kiln_avx2_exp_neg(_mm256_or_ps(v, _mm256_set1_ps(-0.0f))), one = _mm256_set1_ps(1.0f);
    const __m256 num = _mm256_blendv_ps(one, e, v); /* v's sign bit picks e */
    return _mm256_mul_ps(_mm256_mul_ps(v, u), _mm256_div_ps(num, _mm256_add_ps(one, e)));
}

void kiln_cpu_swiglu_avx2(int64_t n, const float *g, const float *u, const float *r, float *y)
{
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = silu_mul(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j));
        if (r)
            v = _mm256_add_ps(v, _mm256_loadu_ps(r + j));
        _mm256_storeu_ps(y + j, v);
    }
    if (j < n) {
        float gt[8] = {0}, ut[8] = {0}, rt[8] = {0}, yt[8];
        memcpy(gt, g + j, (size_t)(n - j) * sizeof(float));
        memcpy(ut, u + j, (size_t)(n - j) * sizeof(float));
        __m256 v = silu_mul(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut));
        if (r) {
            memcpy(rt, r + j, (size_t)(n - j) * sizeof(float));
            v = _mm256_add_ps(v, _mm256_loadu_ps(rt));
        }
        _mm256_storeu_ps(yt, v);
        memcpy(y + j, yt, (size_t)(n - j) * sizeof(float));
    }
}
