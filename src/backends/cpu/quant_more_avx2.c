/* AVX2 integer dot products for the weight formats beyond q8_0/q4_K/q5_K/q6_K: q4_0, q4_1, q5_0,
 * q5_1, iq4_nl against q8 activation blocks of 32, and q2_K, q3_K, iq4_xs against q8_K. Each
 * weight block is unpacked in registers to int8 quants (ggml's nibble split, fifth-bit spread and
 * iq4 codebook shuffle), then multiplied as q8_0 is (maddubs of |w| with x carrying w's sign; per
 * sub-block int16 scales through madd). The integer sums equal kern_scalar.c's exactly; only the
 * order of the float additions differs. Built with -mavx2 -mfma -mf16c; called only when cpuid
 * says so (the AVX-512 table falls back to these). */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/kern.h"

#define INL static inline __attribute__((always_inline))
#define PF_AHEAD 4096 /* software prefetch lead of the weight stream (see quant_avx2.c) */

INL float hsum8(__m256 v)
{
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

INL int32_t hsum8_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* 16 int16 pair sums of w * x: |w| (unsigned) times x carrying w's sign. */
INL __m256i pairs_i8(__m256i w, __m256i x) { return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }

/* 8 int32 sums of w * x over 32 int8 lanes. */
INL __m256i dot_i8(__m256i w, __m256i x) { return _mm256_madd_epi16(pairs_i8(w, x), _mm256_set1_epi16(1)); }

/* 32 nibbles of 16 bytes: low nibbles are values 0..15, high nibbles values 16..31. */
INL __m256i nibbles32(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* 0xff in byte l where bit l of the little-endian u32 at qh is set (ggml's bytes_from_bits_32). */
INL __m256i bits32(const uint8_t *qh)
{
    uint32_t x;
    memcpy(&x, qh, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* The iq4_nl codebook lookup of 32 nibbles. */
INL __m256i iq4_values(__m256i nib)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)kiln_iq4nl_values);
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nib);
}

/* ---------------------------------------------------------------- the 32-value formats */

/* Block b's quants as int8 (q - 8, q - 16, the codebook level; q4_1/q5_1: q itself, 0..31). */
INL __m256i quants_q4_0(const kiln_block_q4_0 *b) { return _mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8)); }
INL __m256i quants_q4_1(const kiln_block_q4_1 *b) { return nibbles32(b->qs); }
INL __m256i quants_q5_0(const kiln_block_q5_0 *b) /* nibble | 0xf0 is nibble - 16 where the bit is clear */
{
    return _mm256_or_si256(nibbles32(b->qs), _mm256_andnot_si256(bits32(b->qh), _mm256_set1_epi8((char)0xf0)));
}
INL __m256i quants_q5_1(const kiln_block_q5_1 *b)
{
    return _mm256_or_si256(nibbles32(b->qs), _mm256_and_si256(bits32(b->qh), _mm256_set1_epi8(0x10)));
}
INL __m256i quants_iq4_nl(const kiln_block_iq4_nl *b) { return iq4_values(nibbles32(b->qs)); }

/* One weight row against mr <= 4 activation rows (x rows xs bytes apart): the block is unpacked
 * once for all of them. HAS_MIN adds m * s per block (q4_1, q5_1; s = f16(d sum q) as ggml's q8_1). */
#define DEF_ROW32(NAME, BT, QUANTS, HAS_MIN)                                                            \
    INL void NAME(int64_t nb, const BT *w, const char *x, size_t xs, int mr, float *y, int64_t ldy)     \
    {                                                                                                   \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
        for (int64_t b = 0; b < nb; b++) {                                                              \
            if (!(b & 3)) _mm_prefetch((const char *)&w[b] + PF_AHEAD, _MM_HINT_T0);                    \
            const __m256i q = QUANTS(&w[b]);                                                            \
            const float dw = _cvtsh_ss(w[b].d);                                                         \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)                            \
            {                                                                                           \
                const kiln_cpu_q8a *xb = (const kiln_cpu_q8a *)(x + (size_t)i * xs) + b;                \
                const __m256i xq = _mm256_loadu_si256((const __m256i *)xb->qs);                         \
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_i8(q, xq)), _mm256_set1_ps(dw * xb->d), acc[i]); \
                if (HAS_MIN) { /* m times the block's s (ggml's q8_1 term), into lane 0 */              \
                    const float mw = _cvtsh_ss(((const uint16_t *)&w[b])[1]); /* m follows d */         \
                    acc[i] = _mm256_add_ps(acc[i], _mm256_setr_ps(mw * xb->s, 0, 0, 0, 0, 0, 0, 0));  \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < mr; i++) y[i * ldy] = hsum8(acc[i]);                                        \
    }

DEF_ROW32(row_q4_0, kiln_block_q4_0, quants_q4_0, 0)
DEF_ROW32(row_q4_1, kiln_block_q4_1, quants_q4_1, 1)
DEF_ROW32(row_q5_0, kiln_block_q5_0, quants_q5_0, 0)
DEF_ROW32(row_q5_1, kiln_block_q5_1, quants_q5_1, 1)
DEF_ROW32(row_iq4_nl, kiln_block_iq4_nl, quants_iq4_nl, 0)

/* ---------------------------------------------------------------- q2_K, q3_K, iq4_xs */

/* Sub-blocks 2g and 2g + 1 of a 256-value block as the int16 scale vector of group g (32 values):
 * lanes 0..7 of a maddubs result cover values 0..15 of the group, lanes 8..15 values 16..31. */
INL __m256i scale_pair(int s0, int s1) { return _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0)); }

/* Group g's 2-bit quants (q2_K/q3_K layout: bits 2c..2c+1 of qs[32h + l], g = 4h + c). */
INL __m256i q2_bits(const uint8_t *qs, int g)
{
    __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * (g / 4)));
    return _mm256_and_si256(_mm256_srl_epi16(b, _mm_cvtsi32_si128(2 * (g % 4))), _mm256_set1_epi8(3));
}

/* sum over sub-blocks s of min_s * bsums_s (q2_K's min term). */
INL int32_t q2_min_sum(const kiln_block_q2_k *w, const kiln_block_q8_k *x)
{
    __m128i sc = _mm_loadu_si128((const __m128i *)w->scales);
    __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0f)));
    return hsum8_i32(_mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)x->bsums)));
}

/* One weight row of 256-value blocks against mr <= 4 q8_K rows; each group of 32 is unpacked once.
 * QUANTS(w, g, &q, &sc) gives group g's int8 quants and int16 scale pair. */
#define DEF_ROWK(NAME, BT, QUANTS, MIN_TERM)                                                            \
    INL void NAME(int64_t nb, const BT *w, const char *x, size_t xs, int mr, float *y, int64_t ldy)     \
    {                                                                                                   \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
        for (int64_t b = 0; b < nb; b++) {                                                              \
            _mm_prefetch((const char *)&w[b] + PF_AHEAD, _MM_HINT_T0);                                  \
            _mm_prefetch((const char *)&w[b] + PF_AHEAD + 64, _MM_HINT_T0);                             \
            __m256i isum[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),  \
                               _mm256_setzero_si256()};                                                 \
            int8_t sc8[16];                                                                             \
            (void)sc8;                                                                                  \
            for (int g = 0; g < 8; g++) {                                                               \
                __m256i q, sc;                                                                          \
                QUANTS(&w[b], g, sc8, &q, &sc);                                                         \
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)                        \
                {                                                                                       \
                    const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + (size_t)i * xs) + b;      \
                    __m256i xq = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * g));                \
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(pairs_i8(q, xq), sc));        \
                }                                                                                       \
            }                                                                                           \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)                            \
            {                                                                                           \
                const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + (size_t)i * xs) + b;          \
                __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_set1_ps(xb->d * _cvtsh_ss(w[b].d))); \
                MIN_TERM(&w[b], xb, s);                                                                 \
                acc[i] = _mm256_add_ps(acc[i], s);                                                      \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < mr; i++) y[i * ldy] = hsum8(acc[i]);                                        \
    }

INL void quants_q2_k(const kiln_block_q2_k *w, int g, int8_t *sc8, __m256i *q, __m256i *sc)
{
    (void)sc8;
    *q = q2_bits(w->qs, g);
    *sc = scale_pair(w->scales[2 * g] & 0xf, w->scales[2 * g + 1] & 0xf);
}

/* q3_K: the scales are unpacked once per block (group 0), the third bit of group g is bit g of
 * hmask[l]; a clear bit subtracts 4. */
INL void quants_q3_k(const kiln_block_q3_k *w, int g, int8_t *sc8, __m256i *q, __m256i *sc)
{
    if (g == 0) kiln_q3_k_scales(w, sc8);
    __m256i hm = _mm256_loadu_si256((const __m256i *)w->hmask), bit = _mm256_set1_epi8((char)(1 << g));
    __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
    *q = _mm256_sub_epi8(q2_bits(w->qs, g), _mm256_and_si256(clear, _mm256_set1_epi8(4)));
    *sc = scale_pair(sc8[2 * g], sc8[2 * g + 1]);
}

INL void quants_iq4_xs(const kiln_block_iq4_xs *w, int g, int8_t *sc8, __m256i *q, __m256i *sc)
{
    (void)sc8;
    int ls = ((w->scales_l[g / 2] >> 4 * (g % 2)) & 0xf) | (((w->scales_h >> 2 * g) & 3) << 4);
    *q = iq4_values(nibbles32(w->qs + 16 * g));
    *sc = _mm256_set1_epi16((short)(ls - 32));
}

#define NO_MIN(w, xb, s) ((void)0)
#define Q2_MIN(w, xb, s)                                                                                \
    s = _mm256_sub_ps(s, _mm256_mul_ps(_mm256_setr_ps((float)q2_min_sum(w, xb), 0, 0, 0, 0, 0, 0, 0),   \
                                       _mm256_set1_ps((xb)->d * _cvtsh_ss((w)->dmin))))

DEF_ROWK(row_q2_k, kiln_block_q2_k, quants_q2_k, Q2_MIN)
DEF_ROWK(row_q3_k, kiln_block_q3_k, quants_q3_k, NO_MIN)
DEF_ROWK(row_iq4_xs, kiln_block_iq4_xs, quants_iq4_xs, NO_MIN)

/* ---------------------------------------------------------------- the table's entries */

/* Weight rows outer (each streams from memory once per 4 activation rows), activation rows in
 * groups of 4 inner. */
#define DEF_MM(NAME, ROW, BT, QK)                                                                       \
    void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,   \
              float *y, int64_t ldy)                                                                    \
    {                                                                                                   \
        for (int64_t j = 0; j < nw; j++)                                                                \
            for (int64_t i0 = 0; i0 < m; i0 += 4)                                                       \
                ROW(k / (QK), (const BT *)((const char *)w + (size_t)j * ws), (const char *)xa + (size_t)i0 * xs, \
                    xs, m - i0 < 4 ? (int)(m - i0) : 4, y + i0 * ldy + j, ldy);                         \
    }

DEF_MM(kiln_cpu_mm_q4_0_avx2, row_q4_0, kiln_block_q4_0, KILN_QK8_0)
DEF_MM(kiln_cpu_mm_q4_1_avx2, row_q4_1, kiln_block_q4_1, KILN_QK8_0)
DEF_MM(kiln_cpu_mm_q5_0_avx2, row_q5_0, kiln_block_q5_0, KILN_QK8_0)
DEF_MM(kiln_cpu_mm_q5_1_avx2, row_q5_1, kiln_block_q5_1, KILN_QK8_0)
DEF_MM(kiln_cpu_mm_iq4_nl_avx2, row_iq4_nl, kiln_block_iq4_nl, KILN_QK8_0)
DEF_MM(kiln_cpu_mm_q2_k_avx2, row_q2_k, kiln_block_q2_k, KILN_QK_K)
DEF_MM(kiln_cpu_mm_q3_k_avx2, row_q3_k, kiln_block_q3_k, KILN_QK_K)
DEF_MM(kiln_cpu_mm_iq4_xs_avx2, row_iq4_xs, kiln_block_iq4_xs, KILN_QK_K)
