/* dtypes: the one-row-per-dtype table (names, block sizes, one-block conversion routines), row
 * bytes, kiln_quantize / kiln_dequantize, and ggml's reference quantizers for q8_0, q4_K, q5_K,
 * q6_K (and q8_K for activations; the other block formats live in dtype_q.c), followed
 * step by step (same float operations in the same order) so the bytes match GGUF files.
 * Scalar code only; must not allocate, must not abort on a caller's mistake. */
#include "graph/dtype.h"

#include <math.h>
#include <strings.h>

#define GROUP_MAX_EPS 1e-15f /* ggml: below this a group counts as all zero */

/* ---------------------------------------------------------------- table */

/* One block's conversions (the block is ggml's struct of that dtype; x and y hold `block` floats). */
typedef void (*quant_fn)(const float *x, void *blk);
typedef void (*dequant_fn)(const void *blk, float *y);

typedef struct dtype_info {
    const char *name;    /* canonical lower-case name */
    int64_t     block;   /* values per block */
    size_t      bytes;   /* bytes per block */
    quant_fn    quant;   /* block formats: f32 -> block (NULL for plain dtypes) */
    dequant_fn  dequant; /* block formats: block -> f32 (NULL for plain dtypes) */
    bool        gpu;     /* the GPU templates (src/codegen) read it; false: cuda/vulkan refuse it */
} dtype_info;

/* Typed one-block routines behind the table's untyped members (no function-pointer casts). */
#define BLOCK_FNS(NAME, T)                                                                           \
    static void quant_##NAME(const float *x, void *b) { kiln_dtype_quant_##NAME(x, (T *)b); }         \
    static void dequant_##NAME(const void *b, float *y) { kiln_dtype_dequant_##NAME((const T *)b, y); }
BLOCK_FNS(q8_0, kiln_block_q8_0)
BLOCK_FNS(q4_k, kiln_block_q4_k)
BLOCK_FNS(q5_k, kiln_block_q5_k)
BLOCK_FNS(q6_k, kiln_block_q6_k)
BLOCK_FNS(q4_0, kiln_block_q4_0)
BLOCK_FNS(q4_1, kiln_block_q4_1)
BLOCK_FNS(q5_0, kiln_block_q5_0)
BLOCK_FNS(q5_1, kiln_block_q5_1)
BLOCK_FNS(iq4_nl, kiln_block_iq4_nl)
BLOCK_FNS(q2_k, kiln_block_q2_k)
BLOCK_FNS(q3_k, kiln_block_q3_k)
BLOCK_FNS(iq4_xs, kiln_block_iq4_xs)
#undef BLOCK_FNS
#define DEQUANT_FN(NAME, T) \
    static void dequant_##NAME(const void *b, float *y) { kiln_dtype_dequant_##NAME((const T *)b, y); }
DEQUANT_FN(iq2_xxs, kiln_block_iq2_xxs)
DEQUANT_FN(iq2_xs, kiln_block_iq2_xs)
DEQUANT_FN(iq2_s, kiln_block_iq2_s)
DEQUANT_FN(iq3_xxs, kiln_block_iq3_xxs)
DEQUANT_FN(iq3_s, kiln_block_iq3_s)
DEQUANT_FN(iq1_s, kiln_block_iq1_s)
DEQUANT_FN(iq1_m, kiln_block_iq1_m)
#undef DEQUANT_FN

#define BLOCK_ROW(NAME, QK, T, GPU) {#NAME, QK, sizeof(T), quant_##NAME, dequant_##NAME, GPU}
/* Read-only formats (the i-quants): no quantizer, no GPU row. */
#define READ_ROW(NAME, QK, T) {#NAME, QK, sizeof(T), NULL, dequant_##NAME, false}

/* One row per dtype (ggml's type_traits idea): adding a block format is its struct and routines
 * in dtype.h / dtype_q.c and a row here. */
static const dtype_info dtype_table[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_F32] = {"f32", 1, 4, NULL, NULL, true},
    [KILN_DTYPE_F16] = {"f16", 1, 2, NULL, NULL, true},
    [KILN_DTYPE_BF16] = {"bf16", 1, 2, NULL, NULL, true},
    [KILN_DTYPE_I32] = {"i32", 1, 4, NULL, NULL, true},
    [KILN_DTYPE_Q8_0] = BLOCK_ROW(q8_0, KILN_QK8_0, kiln_block_q8_0, true),
    [KILN_DTYPE_Q4_K] = BLOCK_ROW(q4_k, KILN_QK_K, kiln_block_q4_k, true),
    [KILN_DTYPE_Q5_K] = BLOCK_ROW(q5_k, KILN_QK_K, kiln_block_q5_k, true),
    [KILN_DTYPE_Q6_K] = BLOCK_ROW(q6_k, KILN_QK_K, kiln_block_q6_k, true),
    [KILN_DTYPE_Q4_0] = BLOCK_ROW(q4_0, KILN_QK8_0, kiln_block_q4_0, true),
    [KILN_DTYPE_Q4_1] = BLOCK_ROW(q4_1, KILN_QK8_0, kiln_block_q4_1, true),
    [KILN_DTYPE_Q5_0] = BLOCK_ROW(q5_0, KILN_QK8_0, kiln_block_q5_0, true),
    [KILN_DTYPE_Q5_1] = BLOCK_ROW(q5_1, KILN_QK8_0, kiln_block_q5_1, true),
    [KILN_DTYPE_IQ4_NL] = BLOCK_ROW(iq4_nl, KILN_QK8_0, kiln_block_iq4_nl, true),
    [KILN_DTYPE_Q2_K] = BLOCK_ROW(q2_k, KILN_QK_K, kiln_block_q2_k, true),
    [KILN_DTYPE_Q3_K] = BLOCK_ROW(q3_k, KILN_QK_K, kiln_block_q3_k, true),
    [KILN_DTYPE_IQ4_XS] = BLOCK_ROW(iq4_xs, KILN_QK_K, kiln_block_iq4_xs, true),
    [KILN_DTYPE_IQ2_XXS] = READ_ROW(iq2_xxs, KILN_QK_K, kiln_block_iq2_xxs),
    [KILN_DTYPE_IQ2_XS] = READ_ROW(iq2_xs, KILN_QK_K, kiln_block_iq2_xs),
    [KILN_DTYPE_IQ2_S] = READ_ROW(iq2_s, KILN_QK_K, kiln_block_iq2_s),
    [KILN_DTYPE_IQ3_XXS] = READ_ROW(iq3_xxs, KILN_QK_K, kiln_block_iq3_xxs),
    [KILN_DTYPE_IQ3_S] = READ_ROW(iq3_s, KILN_QK_K, kiln_block_iq3_s),
    [KILN_DTYPE_IQ1_S] = READ_ROW(iq1_s, KILN_QK_K, kiln_block_iq1_s),
    [KILN_DTYPE_IQ1_M] = READ_ROW(iq1_m, KILN_QK_K, kiln_block_iq1_m),
};
#undef BLOCK_ROW
#undef READ_ROW

static bool dtype_valid(kiln_dtype t)
{
    return (int)t >= 0 && (int)t < KILN_DTYPE_COUNT;
}

KILN_API const char *kiln_dtype_name(kiln_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].name : "?";
}

KILN_API bool kiln_dtype_parse(const char *name, kiln_dtype *out)
{
    if (!name || !out)
        return false;
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) {
        if (strcasecmp(name, dtype_table[t].name) == 0) {
            *out = (kiln_dtype)t;
            return true;
        }
    }
    return false;
}

bool kiln_dtype_on_gpu(kiln_dtype t)
{
    return dtype_valid(t) && dtype_table[t].gpu;
}

KILN_API int64_t kiln_dtype_block(kiln_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].block : 0;
}

KILN_API size_t kiln_dtype_block_bytes(kiln_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].bytes : 0;
}

KILN_API size_t kiln_row_bytes(kiln_dtype t, int64_t n)
{
    if (!dtype_valid(t) || n < 0 || n % dtype_table[t].block != 0)
        return 0;
    uint64_t blocks = (uint64_t)(n / dtype_table[t].block);
    if (blocks > SIZE_MAX / dtype_table[t].bytes)
        return 0;
    return (size_t)blocks * dtype_table[t].bytes;
}

/* ---------------------------------------------------------------- ggml search helpers */

/* ggml's make_qx_quants with rmse_type 1 and no weights (w = x^2): symmetric quants in
 * [-nmax, nmax-1], stored as L = q + nmax; returns the scale. Tries 18 scales around nmax/max. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i)
            L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = kiln_nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = kiln_nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = kiln_nearest_int(iscale * x[i]);
                l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
                L[i] = (int8_t)(nmax + l);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Error of one candidate of make_qkx2_quants (use_mad false: weighted squared error). */
static float qkx2_error(int n, const float *x, const float *w, const uint8_t *L, float scale, float min)
{
    float err = 0;
    for (int i = 0; i < n; ++i) {
        float diff = scale * L[i] + min - x[i];
        err += w[i] * (diff * diff);
    }
    return err;
}

/* ggml's make_qkx2_quants with use_mad = false: asymmetric quants L in [0, nmax] with
 * x ~ scale*L - the_min; searches nstep+1 scales (rmin + rdelta*is + nmax)/(max - min) and a
 * weighted least-squares fit for each. Returns the scale; *the_min >= 0. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i)
            L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    for (int i = 0; i < n; ++i) {
        int l = kiln_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
    }
    float best_error = qkx2_error(n, x, weights, L, scale, min);
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = kiln_nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = qkx2_error(n, x, weights, Laux, this_scale, this_min);
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ---------------------------------------------------------------- q8_0 */

/* roundf result to int8 without undefined behaviour for nan (finite inputs are in range). */
static int8_t round_i8(float v)
{
    float r = roundf(v);
    if (!(r >= -128.f && r <= 127.f))
        return r > 0 ? 127 : r < 0 ? -128 : 0;
    return (int8_t)r;
}

void kiln_dtype_quant_q8_0(const float *x, kiln_block_q8_0 *b)
{
    float amax = 0.0f;
    for (int j = 0; j < KILN_QK8_0; j++) {
        float a = fabsf(x[j]);
        amax = amax > a ? amax : a; /* ggml's MAX(amax, a) */
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    b->d = kiln_f32_to_f16(d);
    for (int j = 0; j < KILN_QK8_0; ++j)
        b->qs[j] = round_i8(x[j] * id);
}

void kiln_dtype_dequant_q8_0(const kiln_block_q8_0 *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    for (int j = 0; j < KILN_QK8_0; ++j)
        y[j] = b->qs[j] * d;
}

/* ---------------------------------------------------------------- q4_K / q5_K */

/* The part q4_K and q5_K share: per sub-block of 32, make_qkx2_quants with weights
 * av_x + |x|; 6-bit scales and mins packed into scales12 with f16 super-scales *d, *dmin; then
 * every value requantized in [0, nmax] against the stored scales (L keeps make_qkx2_quants'
 * choice for a sub-block whose stored scale is 0, as ggml does). */
static void kquant_scales(const float *x, int nmax, float rmin, float rdelta, int nstep, uint8_t *L,
                          uint8_t *scales12, uint16_t *d, uint16_t *dmin)
{
    uint8_t Laux[32];
    float weights[32], mins[KILN_QK_K / 32], scales[KILN_QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < KILN_QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l)
            weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                                     rdelta, nstep);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < KILN_QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)kiln_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)kiln_nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            scales12[j] = ls;
            scales12[j + 4] = lm;
        } else {
            scales12[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            scales12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales12[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = kiln_f32_to_f16(max_scale / 63.f);
    *dmin = kiln_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < KILN_QK_K / 32; ++j) {
        uint8_t sc, m;
        kiln_get_scale_min_k4(j, scales12, &sc, &m);
        const float dj = kiln_f16_to_f32(*d) * sc;
        if (!dj)
            continue;
        const float dm = kiln_f16_to_f32(*dmin) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = kiln_nearest_int((x[32 * j + ii] + dm) / dj);
            L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

void kiln_dtype_quant_q4_k(const float *x, kiln_block_q4_k *b)
{
    uint8_t L[KILN_QK_K];
    kquant_scales(x, 15, -1.f, 0.1f, 20, L, b->scales, &b->d, &b->dmin);
    uint8_t *q = b->qs;
    for (int j = 0; j < KILN_QK_K; j += 64) {
        for (int l = 0; l < 32; ++l)
            q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        q += 32;
    }
}

void kiln_dtype_quant_q5_k(const float *x, kiln_block_q5_k *b)
{
    uint8_t L[KILN_QK_K];
    kquant_scales(x, 31, -0.5f, 0.1f, 15, L, b->scales, &b->d, &b->dmin);
    uint8_t *qh = b->qh, *ql = b->qs;
    memset(qh, 0, KILN_QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < KILN_QK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= m1;
            }
            int l2 = L[n + j + 32];
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 <<= 2;
        m2 <<= 2;
        ql += 32;
    }
}

void kiln_dtype_dequant_q4_k(const kiln_block_q4_k *b, float *y)
{
    const uint8_t *q = b->qs;
    const float d = kiln_f16_to_f32(b->d);
    const float min = kiln_f16_to_f32(b->dmin);
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < KILN_QK_K; j += 64) {
        kiln_get_scale_min_k4(is + 0, b->scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        kiln_get_scale_min_k4(is + 1, b->scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l)
            *y++ = d1 * (q[l] & 0xf) - m1;
        for (int l = 0; l < 32; ++l)
            *y++ = d2 * (q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

void kiln_dtype_dequant_q5_k(const kiln_block_q5_k *b, float *y)
{
    const uint8_t *ql = b->qs, *qh = b->qh;
    const float d = kiln_f16_to_f32(b->d);
    const float min = kiln_f16_to_f32(b->dmin);
    int is = 0;
    uint8_t sc, m, u1 = 1, u2 = 2;
    for (int j = 0; j < KILN_QK_K; j += 64) {
        kiln_get_scale_min_k4(is + 0, b->scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        kiln_get_scale_min_k4(is + 1, b->scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l)
            *y++ = d1 * ((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l)
            *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 <<= 2;
        u2 <<= 2;
    }
}

/* ---------------------------------------------------------------- q6_K */

static void q6_k_pack(const int8_t *L, kiln_block_q6_k *b)
{
    uint8_t *ql = b->ql, *qh = b->qh;
    for (int j = 0; j < KILN_QK_K; j += 128) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l + 0] & 0xf;
            const uint8_t q2 = L[j + l + 32] & 0xf;
            const uint8_t q3 = L[j + l + 64] & 0xf;
            const uint8_t q4 = L[j + l + 96] & 0xf;
            ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                              ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
        ql += 64;
        qh += 32;
    }
}

void kiln_dtype_quant_q6_k(const float *x, kiln_block_q6_k *b)
{
    int8_t L[KILN_QK_K];
    float scales[KILN_QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < KILN_QK_K / 16; ++ib) {
        const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(b, 0, sizeof *b);
        return;
    }
    float iscale = -128.f / max_scale;
    b->d = kiln_f32_to_f16(1 / iscale);
    for (int ib = 0; ib < KILN_QK_K / 16; ++ib) {
        int s = kiln_nearest_int(iscale * scales[ib]);
        b->scales[ib] = (int8_t)(s < 127 ? s : 127);
    }
    for (int j = 0; j < KILN_QK_K / 16; ++j) {
        float d = kiln_f16_to_f32(b->d) * b->scales[j];
        if (!d)
            continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = kiln_nearest_int(x[16 * j + ii] / d);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            L[16 * j + ii] = (int8_t)(l + 32);
        }
    }
    q6_k_pack(L, b);
}

void kiln_dtype_dequant_q6_k(const kiln_block_q6_k *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    for (int n = 0; n < KILN_QK_K; n += 128) {
        for (int l = 0; l < 32; ++l) {
            int is = l / 16;
            const int8_t q1 = (int8_t)((ql[l + 0] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int8_t q2 = (int8_t)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* ---------------------------------------------------------------- q8_K (activations) */

void kiln_dtype_quant_q8_k(const float *x, kiln_block_q8_k *b)
{
    float max = 0, amax = 0;
    for (int j = 0; j < KILN_QK_K; ++j) {
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (!amax) {
        memset(b, 0, sizeof *b);
        return;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < KILN_QK_K; ++j) {
        int v = kiln_nearest_int(iscale * x[j]);
        b->qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < KILN_QK_K / 16; ++j) {
        int sum = 0;
        for (int ii = 0; ii < 16; ++ii)
            sum += b->qs[j * 16 + ii];
        b->bsums[j] = (int16_t)sum;
    }
    b->d = 1 / iscale;
}

void kiln_dtype_dequant_q8_k(const kiln_block_q8_k *b, float *y)
{
    for (int j = 0; j < KILN_QK_K; ++j)
        y[j] = b->d * b->qs[j];
}

/* ---------------------------------------------------------------- rows */

/* Common argument checks: bad dtype / NULL -> INVALID_ARG; n < 0 -> INVALID_ARG; n not a
 * multiple of the block, or a byte size that overflows -> SHAPE. */
static kiln_status check_args(kiln_dtype t, const void *a, const void *b, int64_t n)
{
    if (!dtype_valid(t) || !a || !b || n < 0)
        return KILN_ERR_INVALID_ARG;
    if (n % dtype_table[t].block != 0 || (n > 0 && kiln_row_bytes(t, n) == 0))
        return KILN_ERR_SHAPE;
    return KILN_OK;
}

KILN_API kiln_status kiln_quantize(kiln_dtype t, const float *src, void *dst, int64_t n)
{
    kiln_status s = check_args(t, src, dst, n);
    if (s != KILN_OK)
        return s;
    int64_t nb = n / dtype_table[t].block;
    switch (t) {
    case KILN_DTYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case KILN_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = kiln_f32_to_f16(src[i]);
        break;
    case KILN_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = kiln_f32_to_bf16(src[i]);
        break;
    default:
        if (!dtype_table[t].quant) /* i32: not a quantization target; the i-quants: read-only formats */
            return dtype_table[t].dequant ? KILN_ERR_UNSUPPORTED : KILN_ERR_DTYPE;
        for (int64_t i = 0; i < nb; i++)
            dtype_table[t].quant(src + i * dtype_table[t].block, (char *)dst + (size_t)i * dtype_table[t].bytes);
    }
    return KILN_OK;
}

KILN_API kiln_status kiln_dequantize(kiln_dtype t, const void *src, float *dst, int64_t n)
{
    kiln_status s = check_args(t, src, dst, n);
    if (s != KILN_OK)
        return s;
    int64_t nb = n / dtype_table[t].block;
    switch (t) {
    case KILN_DTYPE_F32: memmove(dst, src, (size_t)n * sizeof(float)); break;
    case KILN_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = kiln_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case KILN_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = kiln_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case KILN_DTYPE_I32:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const int32_t *)src)[i];
        break;
    default:
        if (!dtype_table[t].dequant)
            return KILN_ERR_INTERNAL;
        for (int64_t i = 0; i < nb; i++)
            dtype_table[t].dequant((const char *)src + (size_t)i * dtype_table[t].bytes, dst + i * dtype_table[t].block);
    }
    return KILN_OK;
}
