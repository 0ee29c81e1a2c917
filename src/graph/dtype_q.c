/* The GGUF block formats beyond q8_0 and q4_K..q6_K: q4_0, q4_1, q5_0, q5_1, iq4_nl (blocks of 32)
 * and q2_K, q3_K, iq4_xs (blocks of 256). Dequantization does ggml's float operations in ggml's
 * order (bit-exact, tested against the gguf package's numpy dequantizers); q4_0..q5_1 quantize as
 * ggml's quantize_row_*_ref; iq4_nl, iq4_xs, q2_K, q3_K quantize with a plain rounding (valid
 * blocks, not ggml's search). Scalar code only; must not allocate or abort. */
#include "graph/dtype.h"

#include <float.h>
#include <math.h>

const int8_t kiln_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* C's float -> integer truncation for the in-range values ggml converts; out-of-range and nan
 * (non-finite inputs) clamp instead of being undefined behaviour. */
static int trunc_int(float v, int lo, int hi)
{
    if (!(v > (float)lo - 1.0f)) return lo;
    if (!(v < (float)hi + 1.0f)) return hi;
    return (int)v;
}

/* ---------------------------------------------------------------- q4_0 / q4_1 */

/* The value of largest magnitude (the first on ties), as ggml's q4_0/q5_0 quantizers pick it. */
static float signed_absmax(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < KILN_QK8_0; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

void kiln_dtype_quant_q4_0(const float *x, kiln_block_q4_0 *b)
{
    const float d = signed_absmax(x) / -8;
    const float id = d ? 1.0f / d : 0.0f;
    b->d = kiln_f32_to_f16(d);
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const float x0 = x[j] * id, x1 = x[KILN_QK8_0 / 2 + j] * id;
        int xi0 = trunc_int(x0 + 8.5f, -128, 127), xi1 = trunc_int(x1 + 8.5f, -128, 127); /* (int8_t) casts */
        xi0 = xi0 < 15 ? xi0 : 15;
        xi1 = xi1 < 15 ? xi1 : 15;
        b->qs[j] = (uint8_t)((xi0 & 0xff) | (xi1 << 4));
    }
}

void kiln_dtype_dequant_q4_0(const kiln_block_q4_0 *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const int x0 = (b->qs[j] & 0x0F) - 8, x1 = (b->qs[j] >> 4) - 8;
        y[j] = x0 * d;
        y[j + KILN_QK8_0 / 2] = x1 * d;
    }
}

/* min and max over a block of 32 (ggml starts from FLT_MAX / -FLT_MAX). */
static void min_max(const float *x, float *mn, float *mx)
{
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < KILN_QK8_0; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo, *mx = hi;
}

void kiln_dtype_quant_q4_1(const float *x, kiln_block_q4_1 *b)
{
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    b->d = kiln_f32_to_f16(d);
    b->m = kiln_f32_to_f16(min);
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const float x0 = (x[j] - min) * id, x1 = (x[KILN_QK8_0 / 2 + j] - min) * id;
        int xi0 = trunc_int(x0 + 0.5f, -128, 127), xi1 = trunc_int(x1 + 0.5f, -128, 127);
        xi0 = xi0 < 15 ? xi0 : 15;
        xi1 = xi1 < 15 ? xi1 : 15;
        b->qs[j] = (uint8_t)((xi0 & 0xff) | (xi1 << 4));
    }
}

void kiln_dtype_dequant_q4_1(const kiln_block_q4_1 *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d), m = kiln_f16_to_f32(b->m);
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const int x0 = b->qs[j] & 0x0F, x1 = b->qs[j] >> 4;
        y[j] = x0 * d + m;
        y[j + KILN_QK8_0 / 2] = x1 * d + m;
    }
}

/* ---------------------------------------------------------------- q5_0 / q5_1 */

static uint32_t load_qh(const uint8_t *qh)
{
    uint32_t v;
    memcpy(&v, qh, 4);
    return v;
}

void kiln_dtype_quant_q5_0(const float *x, kiln_block_q5_0 *b)
{
    const float d = signed_absmax(x) / -16;
    const float id = d ? 1.0f / d : 0.0f;
    b->d = kiln_f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const float x0 = x[j] * id, x1 = x[KILN_QK8_0 / 2 + j] * id;
        int xi0 = trunc_int(x0 + 16.5f, -128, 127), xi1 = trunc_int(x1 + 16.5f, -128, 127);
        xi0 = (xi0 < 31 ? xi0 : 31) & 0xff;
        xi1 = (xi1 < 31 ? xi1 : 31) & 0xff;
        b->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((uint32_t)(xi0 & 0x10) >> 4) << j;
        qh |= ((uint32_t)(xi1 & 0x10) >> 4) << (j + KILN_QK8_0 / 2);
    }
    memcpy(b->qh, &qh, 4);
}

void kiln_dtype_dequant_q5_0(const kiln_block_q5_0 *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    const uint32_t qh = load_qh(b->qh);
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10), xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        const int x0 = ((b->qs[j] & 0x0F) | xh0) - 16, x1 = ((b->qs[j] >> 4) | xh1) - 16;
        y[j] = x0 * d;
        y[j + KILN_QK8_0 / 2] = x1 * d;
    }
}

void kiln_dtype_quant_q5_1(const float *x, kiln_block_q5_1 *b)
{
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    b->d = kiln_f32_to_f16(d);
    b->m = kiln_f32_to_f16(min);
    uint32_t qh = 0;
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const float x0 = (x[j] - min) * id, x1 = (x[KILN_QK8_0 / 2 + j] - min) * id;
        const int xi0 = trunc_int(x0 + 0.5f, 0, 255), xi1 = trunc_int(x1 + 0.5f, 0, 255); /* (uint8_t) casts */
        b->qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((uint32_t)(xi0 & 0x10) >> 4) << j;
        qh |= ((uint32_t)(xi1 & 0x10) >> 4) << (j + KILN_QK8_0 / 2);
    }
    memcpy(b->qh, &qh, 4);
}

void kiln_dtype_dequant_q5_1(const kiln_block_q5_1 *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d), m = kiln_f16_to_f32(b->m);
    const uint32_t qh = load_qh(b->qh);
    for (int j = 0; j < KILN_QK8_0 / 2; ++j) {
        const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10), xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        const int x0 = (b->qs[j] & 0x0F) | xh0, x1 = (b->qs[j] >> 4) | xh1;
        y[j] = x0 * d + m;
        y[j + KILN_QK8_0 / 2] = x1 * d + m;
    }
}

/* ---------------------------------------------------------------- iq4_nl / iq4_xs */

/* Index of the codebook level nearest to v (ggml's best_index_int8: the lower on ties). */
static int best_index(float v)
{
    if (!(v > kiln_iq4nl_values[0])) return 0;
    if (v >= kiln_iq4nl_values[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < kiln_iq4nl_values[mid]) hi = mid;
        else lo = mid;
    }
    return v - kiln_iq4nl_values[lo] < kiln_iq4nl_values[hi] - v ? lo : hi;
}

/* 32 values as codebook nibbles of scale d (layout of iq4_nl's qs). */
static void iq4_pack(const float *x, float d, uint8_t *qs)
{
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; ++j)
        qs[j] = (uint8_t)(best_index(x[j] * id) | (best_index(x[j + 16] * id) << 4));
}

void kiln_dtype_quant_iq4_nl(const float *x, kiln_block_iq4_nl *b)
{
    const float d = signed_absmax(x) / kiln_iq4nl_values[0];
    b->d = kiln_f32_to_f16(d);
    iq4_pack(x, kiln_f16_to_f32(b->d), b->qs);
}

void kiln_dtype_dequant_iq4_nl(const kiln_block_iq4_nl *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    for (int j = 0; j < 16; ++j) {
        y[j] = d * kiln_iq4nl_values[b->qs[j] & 0xf];
        y[j + 16] = d * kiln_iq4nl_values[b->qs[j] >> 4];
    }
}

void kiln_dtype_quant_iq4_xs(const float *x, kiln_block_iq4_xs *b)
{
    float sub[KILN_QK_K / 32], amax = 0.0f, max = 0.0f;
    for (int ib = 0; ib < KILN_QK_K / 32; ++ib) {
        sub[ib] = signed_absmax(x + 32 * ib) / kiln_iq4nl_values[0];
        if (fabsf(sub[ib]) > amax) amax = fabsf(sub[ib]), max = sub[ib];
    }
    const float d = -max / 32; /* ls - 32 in [-32, 31]: the largest sub-scale maps to -32 */
    b->d = kiln_f32_to_f16(d);
    const float dd = kiln_f16_to_f32(b->d), id = dd ? 1.0f / dd : 0.0f;
    b->scales_h = 0;
    memset(b->scales_l, 0, sizeof b->scales_l);
    for (int ib = 0; ib < KILN_QK_K / 32; ++ib) {
        int l = kiln_nearest_int(id * sub[ib]);
        l = (l < -32 ? -32 : l > 31 ? 31 : l) + 32;
        b->scales_l[ib / 2] |= (uint8_t)((l & 0xf) << (4 * (ib % 2)));
        b->scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        iq4_pack(x + 32 * ib, dd * (float)(l - 32), b->qs + 16 * ib);
    }
}

void kiln_dtype_dequant_iq4_xs(const kiln_block_iq4_xs *b, float *y)
{
    const uint8_t *qs = b->qs;
    const float d = kiln_f16_to_f32(b->d);
    for (int ib = 0; ib < KILN_QK_K / 32; ++ib) {
        const int ls = ((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b->scales_h >> 2 * ib) & 3) << 4);
        const float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; ++j) {
            y[j + 0] = dl * kiln_iq4nl_values[qs[j] & 0xf];
            y[j + 16] = dl * kiln_iq4nl_values[qs[j] >> 4];
        }
        y += 32;
        qs += 16;
    }
}

/* ---------------------------------------------------------------- q2_K */

void kiln_dtype_quant_q2_k(const float *x, kiln_block_q2_k *b)
{
    float sc[16], mn[16], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 16; ++j) {
        float lo = x[16 * j], hi = x[16 * j];
        for (int l = 1; l < 16; ++l) lo = x[16 * j + l] < lo ? x[16 * j + l] : lo, hi = x[16 * j + l] > hi ? x[16 * j + l] : hi;
        lo = lo < 0 ? lo : 0; /* y = d*q - m with m >= 0 */
        sc[j] = (hi - lo) / 3, mn[j] = -lo;
        max_sc = sc[j] > max_sc ? sc[j] : max_sc;
        max_mn = mn[j] > max_mn ? mn[j] : max_mn;
    }
    b->d = kiln_f32_to_f16(max_sc / 15), b->dmin = kiln_f32_to_f16(max_mn / 15);
    const float d = kiln_f16_to_f32(b->d), dmin = kiln_f16_to_f32(b->dmin);
    uint8_t L[KILN_QK_K];
    for (int j = 0; j < 16; ++j) {
        int ls = d ? kiln_nearest_int(sc[j] / d) : 0, lm = dmin ? kiln_nearest_int(mn[j] / dmin) : 0;
        ls = ls < 0 ? 0 : ls > 15 ? 15 : ls;
        lm = lm < 0 ? 0 : lm > 15 ? 15 : lm;
        b->scales[j] = (uint8_t)(ls | (lm << 4));
        const float dl = d * (float)ls, ml = dmin * (float)lm;
        for (int l = 0; l < 16; ++l) {
            int q = dl ? kiln_nearest_int((x[16 * j + l] + ml) / dl) : 0;
            L[16 * j + l] = (uint8_t)(q < 0 ? 0 : q > 3 ? 3 : q);
        }
    }
    for (int j = 0; j < KILN_QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            b->qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

void kiln_dtype_dequant_q2_k(const kiln_block_q2_k *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d), min = kiln_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    int is = 0;
    for (int n = 0; n < KILN_QK_K; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            uint8_t sc = b->scales[is++];
            float dl = d * (sc & 0xF), ml = min * (sc >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
            sc = b->scales[is++];
            dl = d * (sc & 0xF), ml = min * (sc >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3)) - ml;
            shift += 2;
        }
        q += 32;
    }
}

/* ---------------------------------------------------------------- q3_K */

void kiln_q3_k_scales(const kiln_block_q3_k *b, int8_t out[16])
{
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[4];
    memcpy(aux, b->scales, 12);
    uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(out, aux, 16);
    for (int i = 0; i < 16; i++) out[i] = (int8_t)(out[i] - 32);
}

void kiln_dtype_quant_q3_k(const float *x, kiln_block_q3_k *b)
{
    float sc[16], amax = 0, max = 0;
    for (int j = 0; j < 16; ++j) {
        float a = 0, m = 0;
        for (int l = 0; l < 16; ++l)
            if (fabsf(x[16 * j + l]) > a) a = fabsf(x[16 * j + l]), m = x[16 * j + l];
        sc[j] = m / -4; /* q in [-4, 3]: the largest magnitude maps to -4 */
        if (fabsf(sc[j]) > amax) amax = fabsf(sc[j]), max = sc[j];
    }
    b->d = kiln_f32_to_f16(max / -32);
    const float d = kiln_f16_to_f32(b->d);
    uint8_t ls[16], L[KILN_QK_K];
    for (int j = 0; j < 16; ++j) {
        int l = d ? kiln_nearest_int(sc[j] / d) : 0;
        ls[j] = (uint8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
        const float dl = d * (float)(ls[j] - 32);
        for (int i = 0; i < 16; ++i) {
            int q = dl ? kiln_nearest_int(x[16 * j + i] / dl) : 0;
            L[16 * j + i] = (uint8_t)((q < -4 ? -4 : q > 3 ? 3 : q) + 4);
        }
    }
    memset(b->scales, 0, 12);
    for (int j = 0; j < 16; ++j) { /* ggml's packing: low nibbles in bytes 0-7, high 2 bits in 8-11 */
        b->scales[j % 8] |= (uint8_t)((ls[j] & 0xf) << (4 * (j / 8)));
        b->scales[8 + j % 4] |= (uint8_t)((ls[j] >> 4) << (2 * (j / 4)));
    }
    memset(b->hmask, 0, sizeof b->hmask);
    for (int j = 0, m = 0, hm = 1; j < KILN_QK_K; ++j) {
        if (L[j] > 3) b->hmask[m] |= (uint8_t)hm, L[j] -= 4;
        if (++m == KILN_QK_K / 8) m = 0, hm <<= 1;
    }
    for (int j = 0; j < KILN_QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            b->qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

void kiln_dtype_dequant_q3_k(const kiln_block_q3_k *b, float *y)
{
    int8_t scales[16];
    kiln_q3_k_scales(b, scales);
    const float d_all = kiln_f16_to_f32(b->d);
    const uint8_t *q = b->qs, *hm = b->hmask;
    uint8_t m = 1;
    int is = 0;
    for (int n = 0; n < KILN_QK_K; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            float dl = d_all * scales[is++];
            for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
            dl = d_all * scales[is++];
            for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
            shift += 2;
            m <<= 1;
        }
        q += 32;
    }
}
