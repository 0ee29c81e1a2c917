/* Portable scalar kernels: the KILN_CPU_ISA_SCALAR table (every entry filled, so it is also the
 * fallback of the SIMD tables), and activation quantization (q8 blocks of 32 / q8_K of 256).
 * Integer dot products compute exactly what the SIMD versions compute; only the order of the
 * final float sums differs. Must not use vector intrinsics. */
#include <math.h>
#include <string.h>

#include "backends/cpu/kern.h"

#define ROW(base, i, stride) ((const void *)((const char *)(base) + (size_t)(i) * (stride)))

/* ---------------------------------------------------------------- activation quantization */

/* f to the nearest f16 when a normal f16 (magnitude in [2^-14, 65504]) or 0, else f itself. */
static float round_f16_normal(float f)
{
    float a = fabsf(f);
    return a >= 0x1p-14f && a <= 65504.0f ? kiln_f16_to_f32(kiln_f32_to_f16(f)) : f;
}

static void quant_q8a(const float *x, kiln_cpu_q8a *b)
{
    float amax = 0.0f;
    for (int j = 0; j < KILN_QK8_0; j++) {
        float a = fabsf(x[j]);
        amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    /* ggml's block_q8_0 keeps the scale as an f16 (the quants come from the f32 d): rounding it the
     * same way makes the q8_0, q4_0, q5_0 and iq4_nl dot products llama.cpp's on the cpu, bit for bit
     * up to the order of float sums (python/tests/test_llama_cpp.py measured 5e-5 NMSE of a model's
     * logits from this alone). Outside f16's normal range the f32 d stays: ggml's would overflow to
     * inf or lose bits as a subnormal there. */
    b->d = round_f16_normal(d);
    int32_t sum = 0;
    for (int j = 0; j < KILN_QK8_0; j++) {
        b->qs[j] = (int8_t)kiln_nearest_int(x[j] * id);
        sum += b->qs[j];
    }
    b->s = round_f16_normal(d * (float)sum); /* ggml's q8_1: f16(d * sum) with the f32 d */
}

size_t kiln_cpu_act_row_bytes(enum kiln_cpu_act a, int64_t k)
{
    switch (a) {
    case KILN_CPU_ACT_Q8_0: return (size_t)(k / KILN_QK8_0) * sizeof(kiln_cpu_q8a);
    case KILN_CPU_ACT_Q8_K: return (size_t)(k / KILN_QK_K) * sizeof(kiln_block_q8_k);
    default: return (size_t)k * sizeof(float);
    }
}

void kiln_cpu_quant_row(enum kiln_cpu_act a, const float *x, int64_t k, void *dst)
{
    if (a == KILN_CPU_ACT_Q8_0) {
        kiln_cpu_q8a *b = dst;
        for (int64_t i = 0; i < k / KILN_QK8_0; i++)
            quant_q8a(x + i * KILN_QK8_0, b + i);
    } else if (a == KILN_CPU_ACT_Q8_K) {
        kiln_block_q8_k *b = dst;
        for (int64_t i = 0; i < k / KILN_QK_K; i++)
            kiln_dtype_quant_q8_k(x + i * KILN_QK_K, b + i);
    } else {
        memcpy(dst, x, (size_t)k * sizeof(float));
    }
}

/* ---------------------------------------------------------------- float weights */

static inline float load_f32(const void *w, int64_t i) { return ((const float *)w)[i]; }
static inline float load_f16(const void *w, int64_t i) { return kiln_f16_to_f32(((const uint16_t *)w)[i]); }
static inline float load_bf16(const void *w, int64_t i) { return kiln_bf16_to_f32(((const uint16_t *)w)[i]); }

#define DEF_MM_FLOAT(NAME, LOAD)                                                                       \
    static void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs,      \
                     int64_t m, float *y, int64_t ldy)                                                 \
    {                                                                                                  \
        for (int64_t j = 0; j < nw; j++) {                                                             \
            const void *wr = ROW(w, j, ws);                                                            \
            for (int64_t i = 0; i < m; i++) {                                                          \
                const float *xr = ROW(xa, i, xs);                                                      \
                float s[4] = {0, 0, 0, 0};                                                             \
                int64_t t = 0;                                                                         \
                for (; t + 4 <= k; t += 4)                                                             \
                    for (int u = 0; u < 4; u++)                                                        \
                        s[u] += xr[t + u] * LOAD(wr, t + u);                                           \
                for (; t < k; t++)                                                                     \
                    s[0] += xr[t] * LOAD(wr, t);                                                       \
                y[i * ldy + j] = (s[0] + s[1]) + (s[2] + s[3]);                                        \
            }                                                                                          \
        }                                                                                              \
    }

DEF_MM_FLOAT(mm_f32, load_f32)
DEF_MM_FLOAT(mm_f16, load_f16)
DEF_MM_FLOAT(mm_bf16, load_bf16)

/* ---------------------------------------------------------------- quantized weights */

static float dot_q8_0(int64_t nb, const kiln_block_q8_0 *w, const kiln_cpu_q8a *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int l = 0; l < KILN_QK8_0; l++)
            s += (int32_t)w[b].qs[l] * x[b].qs[l];
        acc += kiln_f16_to_f32(w[b].d) * x[b].d * (float)s;
    }
    return acc;
}

static float dot_q4_k(int64_t nb, const kiln_block_q4_k *w, const kiln_block_q8_k *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            kiln_get_scale_min_k4(j, w[b].scales, &sc, &mn);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int8_t *a = x[b].qs + 32 * j;
            int shift = (j & 1) * 4;
            int32_t s = 0;
            for (int l = 0; l < 32; l++)
                s += ((q[l] >> shift) & 15) * a[l];
            sumi += sc * s;
            summ += mn * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        }
        acc += x[b].d * (kiln_f16_to_f32(w[b].d) * (float)sumi - kiln_f16_to_f32(w[b].dmin) * (float)summ);
    }
    return acc;
}

static float dot_q5_k(int64_t nb, const kiln_block_q5_k *w, const kiln_block_q8_k *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            kiln_get_scale_min_k4(j, w[b].scales, &sc, &mn);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int8_t *a = x[b].qs + 32 * j;
            int shift = (j & 1) * 4;
            int32_t s = 0;
            for (int l = 0; l < 32; l++)
                s += (((q[l] >> shift) & 15) | (((w[b].qh[l] >> j) & 1) << 4)) * a[l];
            sumi += sc * s;
            summ += mn * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        }
        acc += x[b].d * (kiln_f16_to_f32(w[b].d) * (float)sumi - kiln_f16_to_f32(w[b].dmin) * (float)summ);
    }
    return acc;
}

static float dot_q6_k(int64_t nb, const kiln_block_q6_k *w, const kiln_block_q8_k *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *ql = w[b].ql, *qh = w[b].qh;
        int32_t sumi = 0;
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++) {
                int base = 128 * h + l;
                int q1 = ((ql[64 * h + l] & 0xf) | (((qh[32 * h + l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[64 * h + 32 + l] & 0xf) | (((qh[32 * h + l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[64 * h + l] >> 4) | (((qh[32 * h + l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[64 * h + 32 + l] >> 4) | (((qh[32 * h + l] >> 6) & 3) << 4)) - 32;
                sumi += w[b].scales[base / 16] * q1 * x[b].qs[base];
                sumi += w[b].scales[(base + 32) / 16] * q2 * x[b].qs[base + 32];
                sumi += w[b].scales[(base + 64) / 16] * q3 * x[b].qs[base + 64];
                sumi += w[b].scales[(base + 96) / 16] * q4 * x[b].qs[base + 96];
            }
        }
        acc += x[b].d * kiln_f16_to_f32(w[b].d) * (float)sumi;
    }
    return acc;
}

/* The 32-value formats against q8 activations: sum_l w_l * x_l with w = d * q (+ m: m * s). */

/* The int dot product of a nibble-packed block (value l < 16: low nibble of qs[l], value l + 16:
 * its high nibble) against 32 int8 activations, with offset `off` subtracted from every quant and
 * the fifth bits of qh (q5 formats; 0 for q4) added as 16. Two straight loops of 16 the compiler
 * vectorizes at the baseline ISA (a per-value branch on l made these ~10x slower than q8_0). */
static int32_t dot_nib(const uint8_t *qs, uint32_t qh, int off, const int8_t *a)
{
    int32_t s = 0;
    for (int l = 0; l < 16; l++) s += ((qs[l] & 0xf) + (int)(((qh >> l) & 1) << 4) - off) * a[l];
    for (int l = 0; l < 16; l++) s += ((qs[l] >> 4) + (int)(((qh >> (l + 16)) & 1) << 4) - off) * a[l + 16];
    return s;
}

static uint32_t load_qh(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    return h;
}

static float dot_q4_0(int64_t nb, const kiln_block_q4_0 *w, const kiln_cpu_q8a *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++)
        acc += kiln_f16_to_f32(w[b].d) * x[b].d * (float)dot_nib(w[b].qs, 0, 8, x[b].qs);
    return acc;
}

static float dot_q4_1(int64_t nb, const kiln_block_q4_1 *w, const kiln_cpu_q8a *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        float s = (float)dot_nib(w[b].qs, 0, 0, x[b].qs);
        acc += x[b].d * kiln_f16_to_f32(w[b].d) * s + kiln_f16_to_f32(w[b].m) * x[b].s;
    }
    return acc;
}

static float dot_q5_0(int64_t nb, const kiln_block_q5_0 *w, const kiln_cpu_q8a *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++)
        acc += kiln_f16_to_f32(w[b].d) * x[b].d * (float)dot_nib(w[b].qs, load_qh(w[b].qh), 16, x[b].qs);
    return acc;
}

static float dot_q5_1(int64_t nb, const kiln_block_q5_1 *w, const kiln_cpu_q8a *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        float s = (float)dot_nib(w[b].qs, load_qh(w[b].qh), 0, x[b].qs);
        acc += x[b].d * kiln_f16_to_f32(w[b].d) * s + kiln_f16_to_f32(w[b].m) * x[b].s;
    }
    return acc;
}

static float dot_iq4_nl(int64_t nb, const kiln_block_iq4_nl *w, const kiln_cpu_q8a *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int l = 0; l < 16; l++) s += kiln_iq4nl_values[w[b].qs[l] & 0xf] * x[b].qs[l];
        for (int l = 0; l < 16; l++) s += kiln_iq4nl_values[w[b].qs[l] >> 4] * x[b].qs[l + 16];
        acc += kiln_f16_to_f32(w[b].d) * x[b].d * (float)s;
    }
    return acc;
}

/* The 256-value formats against q8_K activations. Value v = 128h + 32c + l of q2_K/q3_K takes
 * bits 2c..2c+1 of qs[32h + l]; sub-block s = v / 16. */
static float dot_q2_k(int64_t nb, const kiln_block_q2_k *w, const kiln_block_q8_k *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0, summ = 0;
        for (int s = 0; s < 16; s++) {
            int32_t t = 0;
            for (int i = 0; i < 16; i++) {
                int v = 16 * s + i, h = v / 128, c = (v % 128) / 32, l = v % 32;
                t += ((w[b].qs[32 * h + l] >> (2 * c)) & 3) * x[b].qs[v];
            }
            sumi += (w[b].scales[s] & 0xf) * t;
            summ += (w[b].scales[s] >> 4) * x[b].bsums[s];
        }
        acc += x[b].d * (kiln_f16_to_f32(w[b].d) * (float)sumi - kiln_f16_to_f32(w[b].dmin) * (float)summ);
    }
    return acc;
}

static float dot_q3_k(int64_t nb, const kiln_block_q3_k *w, const kiln_block_q8_k *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int8_t sc[16];
        kiln_q3_k_scales(&w[b], sc);
        int32_t sumi = 0;
        for (int s = 0; s < 16; s++) {
            int32_t t = 0;
            for (int i = 0; i < 16; i++) {
                int v = 16 * s + i, h = v / 128, c = (v % 128) / 32, l = v % 32;
                int q = ((w[b].qs[32 * h + l] >> (2 * c)) & 3) - ((w[b].hmask[l] >> (v / 32)) & 1 ? 0 : 4);
                t += q * x[b].qs[v];
            }
            sumi += sc[s] * t;
        }
        acc += x[b].d * kiln_f16_to_f32(w[b].d) * (float)sumi;
    }
    return acc;
}

static float dot_iq4_xs(int64_t nb, const kiln_block_iq4_xs *w, const kiln_block_q8_k *x)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            int ls = ((w[b].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((w[b].scales_h >> 2 * ib) & 3) << 4);
            int32_t t = 0;
            const uint8_t *q = w[b].qs + 16 * ib;
            const int8_t *a = x[b].qs + 32 * ib;
            for (int l = 0; l < 16; l++) t += kiln_iq4nl_values[q[l] & 0xf] * a[l] + kiln_iq4nl_values[q[l] >> 4] * a[l + 16];
            sumi += (ls - 32) * t;
        }
        acc += x[b].d * kiln_f16_to_f32(w[b].d) * (float)sumi;
    }
    return acc;
}

#define DEF_MM_QUANT(NAME, DOT, WT, XT, QK)                                                            \
    static void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs,      \
                     int64_t m, float *y, int64_t ldy)                                                 \
    {                                                                                                  \
        for (int64_t j = 0; j < nw; j++)                                                               \
            for (int64_t i = 0; i < m; i++)                                                            \
                y[i * ldy + j] = DOT(k / (QK), (const WT *)ROW(w, j, ws), (const XT *)ROW(xa, i, xs)); \
    }

DEF_MM_QUANT(mm_q8_0, dot_q8_0, kiln_block_q8_0, kiln_cpu_q8a, KILN_QK8_0)
DEF_MM_QUANT(mm_q4_k, dot_q4_k, kiln_block_q4_k, kiln_block_q8_k, KILN_QK_K)
DEF_MM_QUANT(mm_q5_k, dot_q5_k, kiln_block_q5_k, kiln_block_q8_k, KILN_QK_K)
DEF_MM_QUANT(mm_q6_k, dot_q6_k, kiln_block_q6_k, kiln_block_q8_k, KILN_QK_K)
DEF_MM_QUANT(mm_q4_0, dot_q4_0, kiln_block_q4_0, kiln_cpu_q8a, KILN_QK8_0)
DEF_MM_QUANT(mm_q4_1, dot_q4_1, kiln_block_q4_1, kiln_cpu_q8a, KILN_QK8_0)
DEF_MM_QUANT(mm_q5_0, dot_q5_0, kiln_block_q5_0, kiln_cpu_q8a, KILN_QK8_0)
DEF_MM_QUANT(mm_q5_1, dot_q5_1, kiln_block_q5_1, kiln_cpu_q8a, KILN_QK8_0)
DEF_MM_QUANT(mm_iq4_nl, dot_iq4_nl, kiln_block_iq4_nl, kiln_cpu_q8a, KILN_QK8_0)
DEF_MM_QUANT(mm_q2_k, dot_q2_k, kiln_block_q2_k, kiln_block_q8_k, KILN_QK_K)
DEF_MM_QUANT(mm_q3_k, dot_q3_k, kiln_block_q3_k, kiln_block_q8_k, KILN_QK_K)
DEF_MM_QUANT(mm_iq4_xs, dot_iq4_xs, kiln_block_iq4_xs, kiln_block_q8_k, KILN_QK_K)

/* The i-quants (no int8 dot product yet): each weight block dequantized as kiln_dequantize does,
 * then dotted with the f32 activation rows. */
#define DEF_MM_DEQUANT(NAME, WT)                                                                       \
    static void mm_##NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, \
                          int64_t m, float *y, int64_t ldy)                                            \
    {                                                                                                  \
        float blk[KILN_QK_K];                                                                          \
        for (int64_t j = 0; j < nw; j++) {                                                             \
            for (int64_t i = 0; i < m; i++) y[i * ldy + j] = 0;                                        \
            for (int64_t b = 0; b < k / KILN_QK_K; b++) {                                              \
                kiln_dtype_dequant_##NAME((const WT *)ROW(w, j, ws) + b, blk);                         \
                for (int64_t i = 0; i < m; i++) {                                                      \
                    const float *x = (const float *)ROW(xa, i, xs) + b * KILN_QK_K;                    \
                    float acc = 0;                                                                     \
                    for (int t = 0; t < KILN_QK_K; t++) acc += blk[t] * x[t];                          \
                    y[i * ldy + j] += acc;                                                             \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }
DEF_MM_DEQUANT(iq2_xxs, kiln_block_iq2_xxs)
DEF_MM_DEQUANT(iq2_xs, kiln_block_iq2_xs)
DEF_MM_DEQUANT(iq2_s, kiln_block_iq2_s)
DEF_MM_DEQUANT(iq3_xxs, kiln_block_iq3_xxs)
DEF_MM_DEQUANT(iq3_s, kiln_block_iq3_s)
DEF_MM_DEQUANT(iq1_s, kiln_block_iq1_s)
DEF_MM_DEQUANT(iq1_m, kiln_block_iq1_m)

/* ---------------------------------------------------------------- attention vectors */

#define DEF_KV(SUFFIX, LOAD)                                                                           \
    static void kv_dot_##SUFFIX(int64_t hd, const float *q, const void *k, size_t ks, int64_t nk,     \
                                float *s)                                                              \
    {                                                                                                  \
        for (int64_t j = 0; j < nk; j++) {                                                             \
            const void *kr = ROW(k, j, ks);                                                            \
            float a = 0;                                                                               \
            for (int64_t t = 0; t < hd; t++)                                                           \
                a += q[t] * LOAD(kr, t);                                                               \
            s[j] = a;                                                                                  \
        }                                                                                              \
    }                                                                                                  \
    static void kv_axpy_##SUFFIX(int64_t hd, float c, const float *p, const void *v, size_t vs,       \
                                 int64_t nk, float *acc)                                               \
    {                                                                                                  \
        for (int64_t t = 0; t < hd; t++)                                                               \
            acc[t] *= c;                                                                               \
        for (int64_t j = 0; j < nk; j++) {                                                             \
            const void *vr = ROW(v, j, vs);                                                            \
            for (int64_t t = 0; t < hd; t++)                                                           \
                acc[t] += p[j] * LOAD(vr, t);                                                          \
        }                                                                                              \
    }

DEF_KV(f32, load_f32)
DEF_KV(f16, load_f16)

static float exp_sum(float *s, int64_t n, float m)
{
    float l = 0;
    for (int64_t j = 0; j < n; j++)
        l += (s[j] = expf(s[j] - m));
    return l;
}

/* ---------------------------------------------------------------- calibration */

static volatile float g_sink; /* keeps the FMA loop's result alive */

static double fma_loop(int64_t iters)
{
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float b = 0.999999f, c = 1e-7f;
    for (int64_t i = 0; i < iters; i++)
        for (int u = 0; u < 8; u++)
            a[u] = a[u] * b + c;
    g_sink = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    return (double)iters * 8 * 2;
}

static uint64_t read_sum(const void *p, size_t bytes)
{
    const uint64_t *u = p;
    uint64_t s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < bytes / 8; i += 4)
        for (int j = 0; j < 4; j++)
            s[j] ^= u[i + j];
    return s[0] ^ s[1] ^ s[2] ^ s[3];
}

const kiln_cpu_kern kiln_cpu_kern_scalar = {
    .mm = {
        [KILN_DTYPE_F32] = mm_f32,
        [KILN_DTYPE_F16] = mm_f16,
        [KILN_DTYPE_BF16] = mm_bf16,
        [KILN_DTYPE_Q8_0] = mm_q8_0,
        [KILN_DTYPE_Q4_K] = mm_q4_k,
        [KILN_DTYPE_Q5_K] = mm_q5_k,
        [KILN_DTYPE_Q6_K] = mm_q6_k,
        [KILN_DTYPE_Q4_0] = mm_q4_0,
        [KILN_DTYPE_Q4_1] = mm_q4_1,
        [KILN_DTYPE_Q5_0] = mm_q5_0,
        [KILN_DTYPE_Q5_1] = mm_q5_1,
        [KILN_DTYPE_IQ4_NL] = mm_iq4_nl,
        [KILN_DTYPE_Q2_K] = mm_q2_k,
        [KILN_DTYPE_Q3_K] = mm_q3_k,
        [KILN_DTYPE_IQ4_XS] = mm_iq4_xs,
        [KILN_DTYPE_IQ2_XXS] = mm_iq2_xxs,
        [KILN_DTYPE_IQ2_XS] = mm_iq2_xs,
        [KILN_DTYPE_IQ2_S] = mm_iq2_s,
        [KILN_DTYPE_IQ3_XXS] = mm_iq3_xxs,
        [KILN_DTYPE_IQ3_S] = mm_iq3_s,
        [KILN_DTYPE_IQ1_S] = mm_iq1_s,
        [KILN_DTYPE_IQ1_M] = mm_iq1_m,
    },
    .kv_dot = {kv_dot_f32, kv_dot_f16},
    .kv_axpy = {kv_axpy_f32, kv_axpy_f16},
    .exp_sum = exp_sum,
    .fma_loop = fma_loop,
    .read_sum = read_sum,
};
