/* AVX2 integer dot products for quantized weights against int8 activations: q8_0 x q8 blocks of
 * 32, q4_K and q6_K x q8_K (ggml's scheme: maddubs of unsigned weight quants with signed
 * activations, per-sub-block int16 scales through madd, mins / the q6 offset through the q8_K
 * block sums). One weight unpack serves up to 4 activation rows. Built with -mavx2 -mfma -mf16c;
 * called only when cpuid says so. */
#include <immintrin.h>
#include <string.h>

#include "backends/cpu/kern.h"

#define INL static inline __attribute__((always_inline))

/* Software prefetch this far ahead of the weight stream: the hardware prefetcher alone leaves
 * these compute-heavy loops waiting on DRAM (q8_0 GEMV, one thread, 71 MB of weights: 12.6 GB/s
 * without, 16.6 GB/s with a 4 KiB lead on this machine). Rows of a chunk are contiguous, so
 * running past a row's end fetches the next row. */
#define PF_AHEAD 4096
INL void prefetch_block(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + PF_AHEAD + o, _MM_HINT_T0);
}

/* The 4-row GEMVs read four rows side by side, which neither the hardware prefetcher nor a
 * per-row lead follows well (q8_0, K = 896, one thread, cold: 22 -> 14 GB/s). Instead the group's
 * bytes are prefetched as one sequential stream running one group (4 rows) plus 2 KiB ahead:
 * pos is how far the group is consumed, counted as if its rows were one stream (4 x block bytes
 * per block step). */
INL void prefetch_group(const char *w, size_t ws, size_t pos, size_t bytes)
{
    const char *p = w + 4 * ws + 2048 + pos;
    for (size_t c = 0; c < bytes; c += 64) _mm_prefetch(p + c, _MM_HINT_T0);
}

/* Lanes [r0 r1 r2 r3 | r0 r1 r2 r3] of v0..v3's 8-lane sums: one cvt and one fma then serve
 * four weight rows (the two halves are added at the end). */
INL __m256i hsum4_i32(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
    return _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
}

/* y[0..3] = the two 128-bit halves of acc added. */
INL void store4_halves(__m256 acc, float *y)
{
    _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
}

/* Four f16 scales (one per weight row) as floats in both 128-bit halves, times c. */
INL __m256 scales4_f16(uint16_t d0, uint16_t d1, uint16_t d2, uint16_t d3, float c)
{
    __m128 v = _mm_mul_ps(_mm_cvtph_ps(_mm_setr_epi16((short)d0, (short)d1, (short)d2, (short)d3, 0, 0, 0, 0)),
                          _mm_set1_ps(c));
    return _mm256_set_m128(v, v);
}

static inline float hsum(__m256 v)
{
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* m == 1: GEMV4 over groups of 4 weight rows, DOT1 for the rest. 2 <= m <= 8: tiles of NRM weight
 * rows x 4 activation rows, weight tiles outer, so each weight row streams from memory once; full
 * tiles call TILE with constant sizes. More rows: the packed-panel GEMM of gemm_avx2.c. */
#define DEF_QMM(NAME, TILE, NRM, QK, DOT1, GEMV4, GEMM)                                                \
    void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,  \
              float *y, int64_t ldy)                                                                   \
    {                                                                                                  \
        if (m == 1) {                                                                                  \
            int64_t j = 0;                                                                             \
            for (; j + 4 <= nw; j += 4)                                                                \
                GEMV4(k / (QK), (const char *)w + (size_t)j * ws, ws, xa, y + j);                      \
            for (; j < nw; j++)                                                                        \
                y[j] = DOT1(k / (QK), (const char *)w + (size_t)j * ws, xa);                           \
            return;                                                                                    \
        }                                                                                              \
        if (m > 8) {                                                                                   \
            GEMM(k, w, ws, nw, xa, xs, m, y, ldy);                                                     \
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
                    TILE(k / (QK), wp, ws, (NRM), xp, xs, 4, yp, ldy);                                 \
                else if (mr == 1 && nr == (NRM))                                                       \
                    TILE(k / (QK), wp, ws, (NRM), xp, xs, 1, yp, ldy);                                 \
                else                                                                                   \
                    TILE(k / (QK), wp, ws, nr, xp, xs, mr, yp, ldy);                                   \
            }                                                                                          \
    }

/* ---------------------------------------------------------------- q8_0 */

/* 16 int16 pair sums of w*x: |w| (unsigned) times x carrying w's sign (signed). */
INL __m256i row_dot_i8(__m256i w, __m256i x)
{
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* Sum over 32 lanes of w*x as 8 int32: |w| (unsigned) times x carrying w's sign (signed). */
static inline __m256i dot_i8(__m256i aw, __m256i w, __m256i x)
{
    __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

INL void tile_q8_0(int64_t nb, const char *w, size_t ws, int nr, const char *x, size_t xs, int mr, float *y,
                   int64_t ldy)
{
    __m256 acc[4][2];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (!(b & 1))
            for (int j = 0; j < nr; j++) prefetch_block((const kiln_block_q8_0 *)(w + j * ws) + b, 64);
        __m256i wq[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, aw[2] = {wq[0], wq[0]};
        float dw[2] = {0, 0};
        _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) if (j < nr)
        {
            const kiln_block_q8_0 *wb = (const kiln_block_q8_0 *)(w + j * ws) + b;
            wq[j] = _mm256_loadu_si256((const __m256i *)wb->qs);
            aw[j] = _mm256_sign_epi8(wq[j], wq[j]);
            dw[j] = _cvtsh_ss(wb->d);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        {
            const kiln_cpu_q8a *xb = (const kiln_cpu_q8a *)(x + i * xs) + b;
            __m256i xq = _mm256_loadu_si256((const __m256i *)xb->qs);
            _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) if (j < nr)
            {
                __m256 p = _mm256_cvtepi32_ps(dot_i8(aw[j], wq[j], xq));
                acc[i][j] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw[j] * xb->d), acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            y[i * ldy + j] = hsum(acc[i][j]);
}

/* One weight row x one activation row (decode): two blocks per step, two accumulators. */
static float dot1_q8_0(int64_t nb, const void *wv, const void *xv)
{
    const kiln_block_q8_0 *w = wv;
    const kiln_cpu_q8a *x = xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        prefetch_block(&w[b], 64);
        __m256i w0 = _mm256_loadu_si256((const __m256i *)w[b].qs), w1 = _mm256_loadu_si256((const __m256i *)w[b + 1].qs);
        __m256i p0 = dot_i8(_mm256_sign_epi8(w0, w0), w0, _mm256_loadu_si256((const __m256i *)x[b].qs));
        __m256i p1 = dot_i8(_mm256_sign_epi8(w1, w1), w1, _mm256_loadu_si256((const __m256i *)x[b + 1].qs));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(_cvtsh_ss(w[b + 1].d) * x[b + 1].d), a1);
    }
    for (; b < nb; b++) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)w[b].qs);
        __m256i p0 = dot_i8(_mm256_sign_epi8(w0, w0), w0, _mm256_loadu_si256((const __m256i *)x[b].qs));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d), a0);
    }
    return hsum(_mm256_add_ps(a0, a1));
}

/* Four weight rows x one activation row (decode): the rows' sums are reduced across rows so one
 * cvt and one fma per block serve all four. maddubs takes |w| (unsigned: exact for a -128 quant)
 * times x carrying w's sign; |x| with w carrying x's sign would save an op per row but turns a
 * -128 weight into -128 again when x < 0. */
INL void gemv4_q8_0(int64_t nb, const char *w, size_t ws, const void *xv, float *y)
{
    const kiln_block_q8_0 *r0 = (const kiln_block_q8_0 *)w, *r1 = (const kiln_block_q8_0 *)(w + ws),
                          *r2 = (const kiln_block_q8_0 *)(w + 2 * ws), *r3 = (const kiln_block_q8_0 *)(w + 3 * ws);
    const kiln_cpu_q8a *x = xv;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_group(w, ws, (size_t)b * 4 * sizeof *r0, 4 * sizeof *r0 + 63);
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
#define ROWDOT(r) _mm256_madd_epi16(row_dot_i8(_mm256_loadu_si256((const __m256i *)(r)[b].qs), xq), ones)
        const __m256i s = hsum4_i32(ROWDOT(r0), ROWDOT(r1), ROWDOT(r2), ROWDOT(r3));
#undef ROWDOT
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scales4_f16(r0[b].d, r1[b].d, r2[b].d, r3[b].d, x[b].d), acc);
    }
    store4_halves(acc, y);
}

DEF_QMM(kiln_cpu_mm_q8_0_avx2, tile_q8_0, 2, KILN_QK8_0, dot1_q8_0, gemv4_q8_0, kiln_cpu_gemm_q8_0_avx2)

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

INL void tile_q4_k(int64_t nb, const char *w, size_t ws, int nr, const char *x, size_t xs, int mr, float *y,
                   int64_t ldy)
{
    (void)nr; /* always one weight row */
    const __m256i m4 = _mm256_set1_epi8(0xf);
    __m256 acc[4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
    const kiln_block_q4_k *wb = (const kiln_block_q4_k *)w;
    for (int64_t b = 0; b < nb; b++) {
        prefetch_block(&wb[b], sizeof wb[b]);
        uint32_t utmp[4];
        unpack_q4_scales(wb[b].scales, utmp);
        const uint8_t *sc = (const uint8_t *)utmp;
        const __m128i mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)utmp[3], (int)utmp[2]));
        const float d = _cvtsh_ss(wb[b].d), dmin = _cvtsh_ss(wb[b].dmin);
        __m256i sumi[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) sumi[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
        {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(wb[b].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(q4, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i sl = _mm256_set1_epi16(sc[2 * c]), sh = _mm256_set1_epi16(sc[2 * c + 1]);
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
            {
                const int8_t *q8 = ((const kiln_block_q8_k *)(x + i * xs))[b].qs + 64 * c;
                __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
                __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                pl = _mm256_madd_epi16(sl, pl);
                ph = _mm256_madd_epi16(sh, ph);
                sumi[i] = _mm256_add_epi32(sumi[i], _mm256_add_epi32(pl, ph));
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        {
            const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + i * xs) + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
            const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            const __m128i pm = _mm_madd_epi16(mins, s32);
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(sumi[i]), acc[i]);
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * xb->d), _mm256_zextps128_ps256(_mm_cvtepi32_ps(pm)),
                                     acc[i]);
        }
    }
    for (int i = 0; i < mr; i++)
        y[i * ldy] = hsum(acc[i]);
}

/* Byte masks that broadcast the int16 at index i over a 256-bit vector. */
static inline __m256i i16_bcast_mask(int i)
{
    return _mm256_set1_epi16((short)((2 * i) | ((2 * i + 1) << 8)));
}

/* One weight row x one activation row (decode), ggml's AVX2 q4_K x q8_K scheme. */
static float dot1_q4_k(int64_t nb, const void *wv, const void *xv)
{
    const kiln_block_q4_k *w = wv;
    const kiln_block_q8_k *x = xv;
    const __m256i m4 = _mm256_set1_epi8(0xf);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_block(&w[b], sizeof w[b]);
        uint32_t utmp[4];
        unpack_q4_scales(w[b].scales, utmp);
        const float d = x[b].d * _cvtsh_ss(w[b].d), dmin = x[b].d * _cvtsh_ss(w[b].dmin);
        const __m256i ms = _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)x[b].bsums);
        const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        const __m128i pm = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), s32);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(pm), accm);
        const __m128i sc128 = _mm256_castsi256_si128(ms);
        const __m256i scales = _mm256_set_m128i(sc128, sc128);
        const uint8_t *q4 = w[b].qs;
        const int8_t *q8 = x[b].qs;
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
        {
            const __m256i sl = _mm256_shuffle_epi8(scales, i16_bcast_mask(2 * c));
            const __m256i sh = _mm256_shuffle_epi8(scales, i16_bcast_mask(2 * c + 1));
            const __m256i q4b = _mm256_loadu_si256((const __m256i *)(q4 + 32 * c));
            const __m256i lo = _mm256_and_si256(q4b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4b, 4), m4);
            __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c)));
            __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(sl, pl), _mm256_madd_epi16(sh, ph)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return hsum(acc) - _mm_cvtss_f32(accm);
}

/* Four weight rows x one activation row (decode): the activation loads and the q8_K block sums
 * are shared by the rows; their sums meet in one cvt/fma per block. */
INL void gemv4_q4_k(int64_t nb, const char *w, size_t ws, const void *xv, float *y)
{
    const kiln_block_q8_k *x = xv;
    const __m256i m4 = _mm256_set1_epi8(0xf);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_group(w, ws, (size_t)b * 4 * sizeof(kiln_block_q4_k), 4 * sizeof(kiln_block_q4_k));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)x[b].bsums);
        const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        __m256i sumi[4], pmin[4];
        uint16_t dd[4], dm[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)
        {
            const kiln_block_q4_k *wb = (const kiln_block_q4_k *)(w + r * ws) + b;
            uint32_t utmp[4];
            unpack_q4_scales(wb->scales, utmp);
            dd[r] = wb->d, dm[r] = wb->dmin;
            const __m256i ms =
                _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]));
            pmin[r] = _mm256_castsi128_si256(_mm_madd_epi16(_mm256_extracti128_si256(ms, 1), s32));
            const __m128i sc128 = _mm256_castsi256_si128(ms);
            const __m256i scales = _mm256_set_m128i(sc128, sc128);
            __m256i si = _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
            {
                const __m256i q4b = _mm256_loadu_si256((const __m256i *)(wb->qs + 32 * c));
                const __m256i lo = _mm256_and_si256(q4b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4b, 4), m4);
                __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * c)));
                __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * c + 32)));
                pl = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, i16_bcast_mask(2 * c)), pl);
                ph = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, i16_bcast_mask(2 * c + 1)), ph);
                si = _mm256_add_epi32(si, _mm256_add_epi32(pl, ph));
            }
            sumi[r] = si;
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum4_i32(sumi[0], sumi[1], sumi[2], sumi[3])),
                              scales4_f16(dd[0], dd[1], dd[2], dd[3], x[b].d), acc);
        /* pmin: 4 lanes per row in the low half; the hadd tree leaves [r0 r1 r2 r3 | 0 0 0 0]. */
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum4_i32(pmin[0], pmin[1], pmin[2], pmin[3])),
                               scales4_f16(dm[0], dm[1], dm[2], dm[3], x[b].d), accm);
    }
    store4_halves(_mm256_sub_ps(acc, accm), y);
}

DEF_QMM(kiln_cpu_mm_q4_k_avx2, tile_q4_k, 1, KILN_QK_K, dot1_q4_k, gemv4_q4_k, kiln_cpu_gemm_q4_k_avx2)

/* ---------------------------------------------------------------- q5_K */

/* One weight row x one activation row: q4_K's scheme with the fifth bit from qh. */
static float dot1_q5_k(int64_t nb, const void *wv, const void *xv)
{
    const kiln_block_q5_k *w = wv;
    const kiln_block_q8_k *x = xv;
    const __m256i m4 = _mm256_set1_epi8(0xf), m1 = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_block(&w[b], sizeof w[b]);
        uint32_t utmp[4];
        unpack_q4_scales(w[b].scales, utmp);
        const float d = x[b].d * _cvtsh_ss(w[b].d), dmin = x[b].d * _cvtsh_ss(w[b].dmin);
        const __m256i ms = _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)x[b].bsums);
        const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(_mm256_extracti128_si256(ms, 1), s32)),
                            accm);
        const __m128i sc128 = _mm256_castsi256_si128(ms);
        const __m256i scales = _mm256_set_m128i(sc128, sc128);
        const __m256i hb = _mm256_loadu_si256((const __m256i *)w[b].qh);
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
        {
            const __m256i q4b = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * c));
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), m1), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), m1), 4);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q4b, m4), h0);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4b, 4), m4), h1);
            __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * c)));
            __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * c + 32)));
            pl = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, i16_bcast_mask(2 * c)), pl);
            ph = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, i16_bcast_mask(2 * c + 1)), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return hsum(acc) - _mm_cvtss_f32(accm);
}

/* Every (weight row, activation row) pair through the one-row dot (q5_K is rarer: no tiles). */
void kiln_cpu_mm_q5_k_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                           float *y, int64_t ldy)
{
    for (int64_t j = 0; j < nw; j++)
        for (int64_t i = 0; i < m; i++)
            y[i * ldy + j] = dot1_q5_k(k / KILN_QK_K, (const char *)w + (size_t)j * ws, (const char *)xa + (size_t)i * xs);
}

/* ---------------------------------------------------------------- q6_K */

/* Byte masks that spread scales 2i, 2i+1 over 8 bytes each (16 values per scale). */
static inline __m128i scale_shuffle(int i)
{
    return _mm_set_epi8((char)(2 * i + 1), (char)(2 * i + 1), (char)(2 * i + 1), (char)(2 * i + 1),
                        (char)(2 * i + 1), (char)(2 * i + 1), (char)(2 * i + 1), (char)(2 * i + 1),
                        (char)(2 * i), (char)(2 * i), (char)(2 * i), (char)(2 * i), (char)(2 * i),
                        (char)(2 * i), (char)(2 * i), (char)(2 * i));
}

INL void tile_q6_k(int64_t nb, const char *w, size_t ws, int nr, const char *x, size_t xs, int mr, float *y,
                   int64_t ldy)
{
    (void)nr; /* always one weight row */
    const __m256i m4 = _mm256_set1_epi8(0xf), m2 = _mm256_set1_epi8(3);
    __m256 acc[4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
    const kiln_block_q6_k *wb = (const kiln_block_q6_k *)w;
    for (int64_t b = 0; b < nb; b++) {
        prefetch_block(&wb[b], sizeof wb[b]);
        const __m128i scales = _mm_loadu_si128((const __m128i *)wb[b].scales);
        const float d = _cvtsh_ss(wb[b].d);
        __m256i sumi[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) sumi[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(wb[b].ql + 64 * h));
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(wb[b].ql + 64 * h + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)(wb[b].qh + 32 * h));
            __m256i q[4], s[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4));
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) s[c] =
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, scale_shuffle(4 * h + c)));
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
            {
                const int8_t *q8 = ((const kiln_block_q8_k *)(x + i * xs))[b].qs + 128 * h;
                _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
                {
                    __m256i p = _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)(q8 + 32 * c)));
                    sumi[i] = _mm256_add_epi32(sumi[i], _mm256_madd_epi16(s[c], p));
                }
            }
        }
        /* The stored quants are q + 32: subtract 32 * sum_g scale_g * bsum_g. */
        const __m256i sc16 = _mm256_cvtepi8_epi16(scales);
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) if (i < mr)
        {
            const kiln_block_q8_k *xb = (const kiln_block_q8_k *)(x + i * xs) + b;
            const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)xb->bsums));
            const __m256i t = _mm256_sub_epi32(sumi[i], _mm256_slli_epi32(corr, 5));
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(t), acc[i]);
        }
    }
    for (int i = 0; i < mr; i++)
        y[i * ldy] = hsum(acc[i]);
}

/* One weight row x one activation row (decode). */
static float dot1_q6_k(int64_t nb, const void *wv, const void *xv)
{
    const kiln_block_q6_k *w = wv;
    const kiln_block_q8_k *x = xv;
    const __m256i m4 = _mm256_set1_epi8(0xf), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        prefetch_block(&w[b], sizeof w[b]);
        const __m128i scales = _mm_loadu_si128((const __m128i *)w[b].scales);
        const int8_t *q8 = x[b].qs;
        __m256i sumi = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(w[b].ql + 64 * h));
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(w[b].ql + 64 * h + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)(w[b].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4));
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
            {
                const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, scale_shuffle(4 * h + c)));
                __m256i p = _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)(q8 + 128 * h + 32 * c)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p));
            }
        }
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), _mm256_loadu_si256((const __m256i *)x[b].bsums));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[b].d * _cvtsh_ss(w[b].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc);
}

/* q6_K decode keeps one row at a time. */
INL void gemv4_q6_k(int64_t nb, const char *w, size_t ws, const void *xv, float *y)
{
    for (int r = 0; r < 4; r++)
        y[r] = dot1_q6_k(nb, w + r * ws, xv);
}

DEF_QMM(kiln_cpu_mm_q6_k_avx2, tile_q6_k, 1, KILN_QK_K, dot1_q6_k, gemv4_q6_k, kiln_cpu_gemm_q6_k_avx2)
