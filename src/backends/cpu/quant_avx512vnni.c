/* AVX-512 VNNI integer dot products for quantized weights against int8 activations: q8_0 x q8
 * blocks of 32 (vpdpbusd, two blocks per 512-bit vector), q4_K and q6_K x q8_K (vpmaddubsw of
 * unsigned weight quants with signed activations, then vpdpwssd against per-sub-block int16
 * scales; mins / the q6 offset through the q8_K block sums). One tile routine per dtype serves
 * decode (4 weight rows x 1 activation row) and GEMM (weight rows x 4 activation rows).
 * Built with -mavx512vnni on top of the AVX-512 flags: isa.c installs these kernels only when
 * cpuid reports AVX512_VNNI. q5_K stays on the AVX2 kernel. */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/kern.h"

#define INL static inline __attribute__((always_inline))

/* Software prefetch of each row this far ahead of its stream, and the group-sequential prefetch
 * of the 4-row decode: see quant_avx2.c for the measurements behind both. */
#define PF_AHEAD 4096
INL void prefetch_block(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + PF_AHEAD + o, _MM_HINT_T0);
}

/* The group of 4 rows at w is read as if it were one stream, pos bytes consumed: fetch the next
 * group's bytes one group plus 2 KiB ahead. */
INL void prefetch_group(const char *w, size_t ws, size_t pos, size_t bytes)
{
    const char *p = w + 4 * ws + 2048 + pos;
    for (size_t c = 0; c < bytes; c += 64) _mm_prefetch(p + c, _MM_HINT_T0);
}

static inline float hsum128(__m128 v)
{
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

static inline float hsum256(__m256 v)
{
    return hsum128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* m == 1: groups of 4 weight rows through the decode tile (group prefetch), then single rows.
 * 1 < m <= 8: tiles of NRM weight rows x 4 activation rows, weight tiles outer, so each weight
 * row streams from memory once. m > 8: the packed-panel GEMM WIDE of gemm_avx2.c, which beat
 * these tiles on a 16-core Sapphire Rapids host (qwen2-0.5b prefill, 128 tokens: q8_0 877 vs
 * 731 GFLOP/s, q4_K 946 vs 789). Full tiles call TILE with constant sizes. */
#define DEF_QMM(NAME, TILE, NRM, QK, WIDE)                                                             \
    static void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs,      \
                     int64_t m, float *y, int64_t ldy)                                                 \
    {                                                                                                  \
        const int64_t nb = k / (QK);                                                                   \
        if (m == 1) {                                                                                  \
            int64_t j = 0;                                                                             \
            for (; j + 4 <= nw; j += 4)                                                                \
                TILE(nb, (const char *)w + (size_t)j * ws, ws, 4, xa, xs, 1, y + j, ldy, true);        \
            for (; j < nw; j++)                                                                        \
                TILE(nb, (const char *)w + (size_t)j * ws, ws, 1, xa, xs, 1, y + j, ldy, false);       \
            return;                                                                                    \
        }                                                                                              \
        if (m > 8) {                                                                                   \
            WIDE(k, w, ws, nw, xa, xs, m, y, ldy);                                                     \
            return;                                                                                    \
        }                                                                                              \
        for (int64_t j0 = 0; j0 < nw; j0 += (NRM))                                                     \
            for (int64_t i0 = 0; i0 < m; i0 += 4) {                                                    \
                int mr = m - i0 < 4 ? (int)(m - i0) : 4;                                               \
                int nr = nw - j0 < (NRM) ? (int)(nw - j0) : (NRM);                                     \
                const char *wp = (const char *)w + (size_t)j0 * ws;                                    \
                const char *xp = (const char *)xa + (size_t)i0 * xs;                                   \
                float *yp = y + i0 * ldy + j0;                                                         \
                if (mr == 4 && nr == (NRM))                                                            \
                    TILE(nb, wp, ws, (NRM), xp, xs, 4, yp, ldy, false);                                \
                else                                                                                   \
                    TILE(nb, wp, ws, nr, xp, xs, mr, yp, ldy, false);                                  \
            }                                                                                          \
    }

/* ---------------------------------------------------------------- q8_0 */

/* The 32 quants at p0 in the low half, the 32 at p1 in the high half. */
INL __m512i load_pair(const int8_t *p0, const int8_t *p1)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* nr <= 4 weight rows x mr <= 4 activation rows, two blocks (b, b + 1) per step in one 512-bit
 * vector. vpdpbusd multiplies unsigned by signed bytes, so the weights go in as w + 128 (w XOR
 * 0x80, exact for all of [-128, 127]) and each lane starts from -128 * (its sum of x). A last odd
 * block is paired with itself and its high half given weight scale 0. Lanes 0-7 of every product
 * belong to block b, lanes 8-15 to block b + 1, so the scale vectors are [s_b x8 | s_b+1 x8]. */
INL void tile_q8_0(int64_t nb, const char *w, size_t ws, int nr, const char *x, size_t xs, int mr, float *y,
                   int64_t ldy, bool group_pf)
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const bool two = b + 1 < nb;
        const int64_t b1 = two ? b + 1 : b;
        if (group_pf)
            prefetch_group(w, ws, (size_t)b * 4 * sizeof(kiln_block_q8_0), 8 * sizeof(kiln_block_q8_0) + 63);
        else
            for (int j = 0; j < nr; j++)
                prefetch_block((const kiln_block_q8_0 *)(w + j * ws) + b, 2 * sizeof(kiln_block_q8_0));
        __m512i wu[4];
        __m512 dw[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
        {
            if (j < nr) {
                const kiln_block_q8_0 *r = (const kiln_block_q8_0 *)(w + j * ws);
                wu[j] = _mm512_xor_si512(load_pair(r[b].qs, r[b1].qs), off);
                const __m256i d16 = _mm256_mask_blend_epi16((__mmask16)0xff00, _mm256_set1_epi16((short)r[b].d),
                                                            _mm256_set1_epi16(two ? (short)r[b1].d : 0));
                dw[j] = _mm512_cvtph_ps(d16);
            } else {
                wu[j] = _mm512_setzero_si512();
                dw[j] = _mm512_setzero_ps();
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        {
            const kiln_cpu_q8a *xr = (const kiln_cpu_q8a *)(x + i * xs);
            const __m512i xq = load_pair(xr[b].qs, xr[b1].qs);
            const __m512i base = _mm512_sub_epi32(_mm512_setzero_si512(),
                                                  _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, xq));
            const __m512 dx = _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(xr[b].d), _mm512_set1_ps(xr[b1].d));
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            {
                const __m512i p = _mm512_dpbusd_epi32(base, wu[j], xq);
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[j], dx), acc[i][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

DEF_QMM(mm_q8_0, tile_q8_0, 3, KILN_QK8_0, kiln_cpu_gemm_q8_0_avx2)

/* ---------------------------------------------------------------- q4_K */

/* Unpacks the 12 packed bytes into 8 scales (bytes 0-7) and 8 mins (bytes 8-15), as ggml does. */
static inline void unpack_q4_scales(const uint8_t *s12, uint32_t utmp[4])
{
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, s12, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

/* Byte indices that spread int16 scale a over the low 256 bits and int16 scale b over the high
 * 256 bits of a vector holding the 8 int16 scales in every 128-bit lane (vpshufb is per lane). */
INL __m512i scale_pair_mask(int a, int b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)((2 * a) | ((2 * a + 1) << 8)))),
                              _mm256_set1_epi16((short)((2 * b) | ((2 * b + 1) << 8))), 1);
}

/* nr <= 4 weight rows x mr <= 4 activation rows. For 64-value chunk c the weight vector is
 * [low nibbles of qs[32c..32c+31] | high nibbles] = sub-blocks 2c and 2c + 1, which matches the
 * 64 activation quants 64c..64c+63 as they lie; vpmaddubsw gives int16 pair sums (<= 2*15*128),
 * vpdpwssd weighs them by the sub-block's 6-bit scale into int32 lanes. */
INL void tile_q4_k(int64_t nb, const char *w, size_t ws, int nr, const char *x, size_t xs, int mr, float *y,
                   int64_t ldy, bool group_pf)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[4][4];
    __m128 accm[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps(),
                                                            accm[i][j] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (group_pf)
            prefetch_group(w, ws, (size_t)b * 4 * sizeof(kiln_block_q4_k), 4 * sizeof(kiln_block_q4_k));
        else
            for (int j = 0; j < nr; j++) prefetch_block((const kiln_block_q4_k *)(w + j * ws) + b, sizeof(kiln_block_q4_k));
        const kiln_block_q4_k *wb[4];
        __m512i scb[4], sum[4][4];
        __m128i mins[4];
        float d[4], dmin[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
        {
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) sum[i][j] = _mm512_setzero_si512();
            if (j < nr) {
                wb[j] = (const kiln_block_q4_k *)(w + j * ws) + b;
                uint32_t utmp[4];
                unpack_q4_scales(wb[j]->scales, utmp);
                scb[j] = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)utmp[1], (int)utmp[0])));
                mins[j] = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)utmp[3], (int)utmp[2]));
                d[j] = _cvtsh_ss(wb[j]->d), dmin[j] = _cvtsh_ss(wb[j]->dmin);
            } else { /* unused row slot */
                wb[j] = wb[0], scb[j] = _mm512_setzero_si512(), mins[j] = _mm_setzero_si128(), d[j] = dmin[j] = 0;
            }
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
        {
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            {
                const __m512i qq = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb[j]->qs + 32 * c)));
                const __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(qq, (__mmask32)0xffff0000u, qq, 4), m4);
                const __m512i s = _mm512_shuffle_epi8(scb[j], scale_pair_mask(2 * c, 2 * c + 1));
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
                {
                    const int8_t *q8 = ((const kiln_block_q8_k *)(x + i * xs))[b].qs + 64 * c;
                    sum[i][j] = _mm512_dpwssd_epi32(sum[i][j], _mm512_maddubs_epi16(q, _mm512_loadu_si512(q8)), s);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        {
            const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + i * xs) + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
            const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            {
                acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(d[j] * xb->d), _mm512_cvtepi32_ps(sum[i][j]), acc[i][j]);
                accm[i][j] = _mm_fmadd_ps(_mm_set1_ps(dmin[j] * xb->d), _mm_cvtepi32_ps(_mm_madd_epi16(mins[j], s32)),
                                          accm[i][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]) - hsum128(accm[i][j]);
}

DEF_QMM(mm_q4_k, tile_q4_k, 1, KILN_QK_K, kiln_cpu_gemm_q4_k_avx2)

/* ---------------------------------------------------------------- q6_K */

/* vpermw indices that spread int16 scales 4g .. 4g + 3 over the four 128-bit lanes. */
INL __m512i scale_quad_idx(int g)
{
    const long long s = 0x0001000100010001LL;
    return _mm512_set_epi64((4 * g + 3) * s, (4 * g + 3) * s, (4 * g + 2) * s, (4 * g + 2) * s, (4 * g + 1) * s,
                            (4 * g + 1) * s, (4 * g) * s, (4 * g) * s);
}

/* nr <= 4 weight rows x mr <= 4 activation rows. For half h, one vector holds the 64 quants
 * 128h .. 128h + 63 (low nibbles of ql[64h..64h+63], top bits from qh[32h..] bits 0-1 | 2-3) and
 * one the next 64 (high nibbles, qh bits 4-5 | 6-7), each matching 64 activation quants as they
 * lie; every 128-bit lane of vpmaddubsw's int16 sums is one sub-block of 16, weighed by its int8
 * scale through vpdpwssd. The stored quants are q + 32: 32 * sum_g scale_g * bsum_g comes off. */
INL void tile_q6_k(int64_t nb, const char *w, size_t ws, int nr, const char *x, size_t xs, int mr, float *y,
                   int64_t ldy, bool group_pf)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3);
    __m256 acc[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (group_pf)
            prefetch_group(w, ws, (size_t)b * 4 * sizeof(kiln_block_q6_k), 4 * sizeof(kiln_block_q6_k) + 63);
        else
            for (int j = 0; j < nr; j++) prefetch_block((const kiln_block_q6_k *)(w + j * ws) + b, sizeof(kiln_block_q6_k));
        const kiln_block_q6_k *wb[4];
        __m512i sum[4][4];
        __m256i sc16[4];
        float d[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
        {
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) sum[i][j] = _mm512_setzero_si512();
            if (j < nr) {
                wb[j] = (const kiln_block_q6_k *)(w + j * ws) + b;
                sc16[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb[j]->scales));
                d[j] = _cvtsh_ss(wb[j]->d);
            } else { /* unused row slot */
                wb[j] = wb[0], sc16[j] = _mm256_setzero_si256(), d[j] = 0;
            }
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            {
                const __m512i l = _mm512_loadu_si512(wb[j]->ql + 64 * h);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb[j]->qh + 32 * h)));
                /* High half shifted by 2: its bits 0-1 / 4-5 are qh's bits 2-3 / 6-7. */
                const __m512i hs = _mm512_mask_srli_epi16(hb, (__mmask32)0xffff0000u, hb, 2);
                const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                                    _mm512_slli_epi16(_mm512_and_si512(hs, m2), 4));
                const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hs, 4), m2), 4));
                const __m512i sz = _mm512_castsi256_si512(sc16[j]); /* vpermw reads int16 0-15 only */
                const __m512i s01 = _mm512_permutexvar_epi16(scale_quad_idx(2 * h), sz);
                const __m512i s23 = _mm512_permutexvar_epi16(scale_quad_idx(2 * h + 1), sz);
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
                {
                    const int8_t *q8 = ((const kiln_block_q8_k *)(x + i * xs))[b].qs + 128 * h;
                    sum[i][j] = _mm512_dpwssd_epi32(sum[i][j], _mm512_maddubs_epi16(q01, _mm512_loadu_si512(q8)), s01);
                    sum[i][j] = _mm512_dpwssd_epi32(sum[i][j], _mm512_maddubs_epi16(q23, _mm512_loadu_si512(q8 + 64)), s23);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        {
            const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + i * xs) + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            {
                const __m256i corr = _mm256_madd_epi16(sc16[j], bs);
                __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(sum[i][j]), _mm512_extracti64x4_epi64(sum[i][j], 1));
                t = _mm256_sub_epi32(t, _mm256_slli_epi32(corr, 5));
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(d[j] * xb->d), _mm256_cvtepi32_ps(t), acc[i][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nr)
            y[i * ldy + j] = hsum256(acc[i][j]);
}

DEF_QMM(mm_q6_k, tile_q6_k, 1, KILN_QK_K, kiln_cpu_gemm_q6_k_avx2)

const kiln_cpu_kern kiln_cpu_kern_avx512vnni = {
    .mm = {
        [KILN_DTYPE_Q8_0] = mm_q8_0,
        [KILN_DTYPE_Q4_K] = mm_q4_k,
        [KILN_DTYPE_Q6_K] = mm_q6_k,
    },
};
