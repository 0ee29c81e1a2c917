/* Internal dtype support: the GGUF block layouts (bit-exact with ggml's block_q8_0, block_q4_K,
 * block_q5_K, block_q6_K, block_q8_K), scalar f16/bf16 conversions, the k-quant 6-bit scale
 * unpacking, and one-block quantize/dequantize routines that SIMD kernels may reuse.
 * Scalar reference code only: no ISA intrinsics here, and nothing that allocates.
 * Byte order: blocks hold host-order halves; kiln targets little-endian hosts, as GGUF files are. */
#pragma once

#include <stdint.h>
#include <string.h>

#include "kiln/kiln.h"

#define KILN_QK8_0 32  /* values per q8_0 block */
#define KILN_QK_K 256  /* values per k-quant super-block */
#define KILN_K_SCALE_SIZE 12 /* bytes of packed 6-bit scales/mins in q4_K/q5_K */

/* q8_0: y[i] = d * qs[i]. */
typedef struct kiln_block_q8_0 {
    uint16_t d;                /* f16 scale */
    int8_t   qs[KILN_QK8_0];   /* signed quants */
} kiln_block_q8_0;

/* q4_K: 8 sub-blocks of 32; sub-block j has 6-bit scale sc_j and min m_j (kiln_get_scale_min_k4);
 * y = d*sc_j*q - dmin*m_j with q a 4-bit quant. qs[32*c + l] holds value 64*c + l in its low nibble
 * and value 64*c + 32 + l in its high nibble (c = 0..3, l = 0..31). */
typedef struct kiln_block_q4_k {
    uint16_t d;                         /* f16 super-scale of the 6-bit scales */
    uint16_t dmin;                      /* f16 super-scale of the 6-bit mins */
    uint8_t  scales[KILN_K_SCALE_SIZE]; /* 8 scales + 8 mins, 6 bits each, packed */
    uint8_t  qs[KILN_QK_K / 2];         /* 4-bit quants, layout above */
} kiln_block_q4_k;

/* q5_K: as q4_K with a fifth bit: value 64*c + l takes bit (2c) of qh[l], value 64*c + 32 + l
 * takes bit (2c + 1) of qh[l], each worth 16. */
typedef struct kiln_block_q5_k {
    uint16_t d;                         /* f16 super-scale of the 6-bit scales */
    uint16_t dmin;                      /* f16 super-scale of the 6-bit mins */
    uint8_t  scales[KILN_K_SCALE_SIZE]; /* 8 scales + 8 mins, 6 bits each, packed */
    uint8_t  qh[KILN_QK_K / 8];         /* high (5th) bits, layout above */
    uint8_t  qs[KILN_QK_K / 2];         /* low 4 bits, same layout as q4_K */
} kiln_block_q5_k;

/* q6_K: 16 sub-blocks of 16 with int8 scales; y = d * scales[v/16] * (q - 32), q 6 bits.
 * For half h (values 128h..128h+127) and l = 0..31: ql[64h + l] low/high nibble = values
 * 128h + l / 128h + 64 + l; ql[64h + 32 + l] low/high = 128h + 32 + l / 128h + 96 + l;
 * qh[32h + l] bits 0-1, 2-3, 4-5, 6-7 = top 2 bits of 128h + l, +32, +64, +96. */
typedef struct kiln_block_q6_k {
    uint8_t  ql[KILN_QK_K / 2];   /* low 4 bits of the quants */
    uint8_t  qh[KILN_QK_K / 4];   /* high 2 bits of the quants */
    int8_t   scales[KILN_QK_K / 16]; /* 8-bit sub-block scales */
    uint16_t d;                   /* f16 super-scale */
} kiln_block_q6_k;

/* q8_K: ggml's activation format for k-quant dot products (not a kiln_dtype, never in files):
 * y = d * qs[i]; bsums[g] = sum of qs[16g .. 16g+15]. */
typedef struct kiln_block_q8_k {
    float   d;                    /* f32 scale */
    int8_t  qs[KILN_QK_K];        /* signed quants in [-127, 127] */
    int16_t bsums[KILN_QK_K / 16]; /* sums of groups of 16 quants */
} kiln_block_q8_k;

/* q4_0: y[j] = d * (q_j - 8), q_j 4 bits: qs[l] low nibble = value l, high nibble = value l + 16. */
typedef struct kiln_block_q4_0 {
    uint16_t d;                  /* f16 scale */
    uint8_t  qs[KILN_QK8_0 / 2]; /* nibbles, layout above */
} kiln_block_q4_0;

/* q4_1: y[j] = d * q_j + m, q_j 4 bits (nibbles as q4_0). */
typedef struct kiln_block_q4_1 {
    uint16_t d;                  /* f16 scale */
    uint16_t m;                  /* f16 min */
    uint8_t  qs[KILN_QK8_0 / 2]; /* nibbles as q4_0 */
} kiln_block_q4_1;

/* q5_0: y[j] = d * (q_j - 16), q_j 5 bits: low 4 as q4_0, bit 4 of value j is bit j of qh (a
 * little-endian u32). */
typedef struct kiln_block_q5_0 {
    uint16_t d;                  /* f16 scale */
    uint8_t  qh[4];              /* fifth bits, u32 little-endian */
    uint8_t  qs[KILN_QK8_0 / 2]; /* low nibbles as q4_0 */
} kiln_block_q5_0;

/* q5_1: y[j] = d * q_j + m, q_j 5 bits laid out as q5_0. */
typedef struct kiln_block_q5_1 {
    uint16_t d;                  /* f16 scale */
    uint16_t m;                  /* f16 min */
    uint8_t  qh[4];              /* fifth bits, u32 little-endian */
    uint8_t  qs[KILN_QK8_0 / 2]; /* low nibbles as q4_0 */
} kiln_block_q5_1;

/* iq4_nl: y[j] = d * kiln_iq4nl_values[q_j], q_j 4 bits laid out as q4_0. */
typedef struct kiln_block_iq4_nl {
    uint16_t d;                  /* f16 scale */
    uint8_t  qs[KILN_QK8_0 / 2]; /* codebook indices, layout as q4_0 */
} kiln_block_iq4_nl;

/* ggml's kvalues_iq4nl: the 16 levels of iq4_nl and iq4_xs. */
extern const int8_t kiln_iq4nl_values[16];

/* q2_K: 16 sub-blocks of 16; scales[s] low nibble = scale, high nibble = min of sub-block s;
 * y = d * sc * q - dmin * mn, q 2 bits: for half h (128 values) and shift 2c (c = 0..3), qs[32h + l]
 * bits 2c..2c+1 hold value 128h + 32c + l. */
typedef struct kiln_block_q2_k {
    uint8_t  scales[KILN_QK_K / 16]; /* 4-bit scale and min per sub-block */
    uint8_t  qs[KILN_QK_K / 4];      /* 2-bit quants, layout above */
    uint16_t d;                      /* f16 super-scale of the scales */
    uint16_t dmin;                   /* f16 super-scale of the mins */
} kiln_block_q2_k;

/* q3_K: 16 sub-blocks of 16 with 6-bit signed scales (stored + 32, packed in 12 bytes); q 3 bits:
 * low 2 bits as q2_K's qs, the third bit of value 32c' + l (c' = 0..7) is bit c' of hmask[l], and
 * a clear bit subtracts 4: y = d * (sc - 32) * (q2 - (bit ? 0 : 4)). */
typedef struct kiln_block_q3_k {
    uint8_t  hmask[KILN_QK_K / 8]; /* high bits (inverted) */
    uint8_t  qs[KILN_QK_K / 4];    /* low 2 bits */
    uint8_t  scales[12];           /* 16 x 6-bit scales, packed */
    uint16_t d;                    /* f16 super-scale */
} kiln_block_q3_k;

/* iq4_xs: 8 sub-blocks of 32 with 6-bit scales ls (low nibble in scales_l, high 2 bits in
 * scales_h); y = d * (ls - 32) * kiln_iq4nl_values[q], nibbles per sub-block as iq4_nl. */
typedef struct kiln_block_iq4_xs {
    uint16_t d;                    /* f16 super-scale */
    uint16_t scales_h;             /* high 2 bits of the 8 scales */
    uint8_t  scales_l[KILN_QK_K / 64]; /* low 4 bits of the 8 scales */
    uint8_t  qs[KILN_QK_K / 2];    /* codebook indices */
} kiln_block_iq4_xs;

/* The i-quants (ggml's block_iq*): groups of 8 (or 4) values are rows of a codebook grid
 * (dtype_iq_grids.c, generated), with signs and per-32 (or per-16) scales; dtype_iq.c decodes them in
 * ggml's float operations. */
typedef struct kiln_block_iq2_xxs {
    uint16_t d;                 /* f16 scale */
    uint16_t qs[KILN_QK_K / 8]; /* per 32: 4 grid indices (bytes), then 4 x 7 sign bits and a 4-bit scale */
} kiln_block_iq2_xxs;

typedef struct kiln_block_iq2_xs {
    uint16_t d;                     /* f16 scale */
    uint16_t qs[KILN_QK_K / 8];     /* per 8: 9-bit grid index, 7-bit sign index */
    uint8_t  scales[KILN_QK_K / 32]; /* 4-bit scales, two per 32 */
} kiln_block_iq2_xs;

typedef struct kiln_block_iq2_s {
    uint16_t d;                      /* f16 scale */
    uint8_t  qs[KILN_QK_K / 4];      /* 32 low bytes of the 10-bit grid indices, then 32 bytes of signs */
    uint8_t  qh[KILN_QK_K / 32];     /* high 2 bits of the indices, four per byte */
    uint8_t  scales[KILN_QK_K / 32]; /* 4-bit scales, two per 32 */
} kiln_block_iq2_s;

typedef struct kiln_block_iq3_xxs {
    uint16_t d;                      /* f16 scale */
    uint8_t  qs[3 * KILN_QK_K / 8];  /* 64 grid indices (4 values each), then per 32 a u32: 4 x 7 sign bits, 4-bit scale */
} kiln_block_iq3_xxs;

typedef struct kiln_block_iq3_s {
    uint16_t d;                      /* f16 scale */
    uint8_t  qs[KILN_QK_K / 4];      /* low bytes of the 9-bit grid indices */
    uint8_t  qh[KILN_QK_K / 32];     /* their high bits, one per index */
    uint8_t  signs[KILN_QK_K / 8];   /* one sign bit per value */
    uint8_t  scales[KILN_QK_K / 64]; /* 4-bit scales, two per 64 */
} kiln_block_iq3_s;

typedef struct kiln_block_iq1_s {
    uint16_t d;                      /* f16 scale */
    uint8_t  qs[KILN_QK_K / 8];      /* low bytes of the 11-bit grid indices */
    uint16_t qh[KILN_QK_K / 32];     /* per 32: 4 x 3 high index bits, 3-bit scale, the delta's sign */
} kiln_block_iq1_s;

typedef struct kiln_block_iq1_m {
    uint8_t  qs[KILN_QK_K / 8];      /* low bytes of the 11-bit grid indices */
    uint8_t  qh[KILN_QK_K / 16];     /* per index pair: 3 high bits and the delta's sign each */
    uint8_t  scales[KILN_QK_K / 32]; /* 3-bit scales (4 per u16) and the f16 scale in the u16s' top nibbles */
} kiln_block_iq1_m;

extern const uint8_t  kiln_ksigns_iq2xs[128];   /* 7 sign bits -> 8 (the eighth makes the parity even) */
extern const uint64_t kiln_iq2xxs_grid[256];    /* 8 bytes each: values 8, 25, 43 */
extern const uint64_t kiln_iq2xs_grid[512];
extern const uint64_t kiln_iq2s_grid[1024];
extern const uint32_t kiln_iq3xxs_grid[256];    /* 4 bytes each: values 4 .. 62 */
extern const uint32_t kiln_iq3s_grid[512];      /* 4 bytes each: values 1 .. 15 */
extern const uint64_t kiln_iq1s_grid[2048];     /* 8 int8 each: -1, 0, 1 */

_Static_assert(sizeof(kiln_block_iq2_xxs) == 66, "iq2_xxs block must be 66 bytes");
_Static_assert(sizeof(kiln_block_iq2_xs) == 74, "iq2_xs block must be 74 bytes");
_Static_assert(sizeof(kiln_block_iq2_s) == 82, "iq2_s block must be 82 bytes");
_Static_assert(sizeof(kiln_block_iq3_xxs) == 98, "iq3_xxs block must be 98 bytes");
_Static_assert(sizeof(kiln_block_iq3_s) == 110, "iq3_s block must be 110 bytes");
_Static_assert(sizeof(kiln_block_iq1_s) == 50, "iq1_s block must be 50 bytes");
_Static_assert(sizeof(kiln_block_iq1_m) == 56, "iq1_m block must be 56 bytes");

_Static_assert(sizeof(kiln_block_q4_0) == 18, "q4_0 block must be 18 bytes");
_Static_assert(sizeof(kiln_block_q4_1) == 20, "q4_1 block must be 20 bytes");
_Static_assert(sizeof(kiln_block_q5_0) == 22, "q5_0 block must be 22 bytes");
_Static_assert(sizeof(kiln_block_q5_1) == 24, "q5_1 block must be 24 bytes");
_Static_assert(sizeof(kiln_block_iq4_nl) == 18, "iq4_nl block must be 18 bytes");
_Static_assert(sizeof(kiln_block_q2_k) == 84, "q2_K block must be 84 bytes");
_Static_assert(sizeof(kiln_block_q3_k) == 110, "q3_K block must be 110 bytes");
_Static_assert(sizeof(kiln_block_iq4_xs) == 136, "iq4_xs block must be 136 bytes");
_Static_assert(sizeof(kiln_block_q8_0) == 34, "q8_0 block must be 34 bytes");
_Static_assert(sizeof(kiln_block_q4_k) == 144, "q4_K block must be 144 bytes");
_Static_assert(sizeof(kiln_block_q5_k) == 176, "q5_K block must be 176 bytes");
_Static_assert(sizeof(kiln_block_q6_k) == 210, "q6_K block must be 210 bytes");
_Static_assert(sizeof(kiln_block_q8_k) == 292, "q8_K block must be 292 bytes");

/* The dtype table's GPU member: true when the GPU templates (src/codegen) read t (every dtype has
 * a row in codegen/wfmt.c or wfmt_more.c today). A format without one would be refused by
 * cuda/vulkan by name, so placement keeps its regions on the cpu. */
bool kiln_dtype_on_gpu(kiln_dtype t);

/* ---------------------------------------------------------------- scalar conversions */

static inline uint32_t kiln_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kiln_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact for every finite f16 (subnormals included) and inf; a nan keeps its sign and payload
 * and comes out quiet (bit-identical with ggml's converter). */
static inline float kiln_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f)
        return kiln_bits_f32(sign | 0x7f800000u | (m ? 0x400000u : 0u) | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* subnormal (or zero): exact */
        return sign ? -v : v;
    }
    return kiln_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Round to nearest, ties to even; overflow to inf; nan -> quiet nan 0x7e00 with its sign (as
 * ggml's portable converter does). */
static inline uint16_t kiln_f32_to_f16(float f)
{
    uint32_t u = kiln_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return sign | 0x7e00u;
    if (u >= 0x477ff000u) /* >= 65520: rounds past 65504 */
        return sign | 0x7c00u;
    if (u >= 0x38800000u) { /* >= 2^-14: a normal half */
        uint32_t r = u + 0x0fffu + ((u >> 13) & 1u) - 0x38000000u;
        return sign | (uint16_t)(r >> 13);
    }
    uint32_t e = u >> 23;
    if (e < 102) /* below 2^-25: rounds to zero */
        return sign;
    uint32_t m = (u & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* value / 2^-24 = m >> shift, shift in 14..24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return sign | (uint16_t)q;
}

static inline float kiln_bf16_to_f32(uint16_t h)
{
    return kiln_bits_f32((uint32_t)h << 16);
}

/* Round to nearest, ties to even; nan stays nan (quiet bit forced), as ggml does. */
static inline uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t u = kiln_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* ---------------------------------------------------------------- k-quant helpers */

/* Scale and min (6 bits each) of sub-block j (0..7) of a q4_K/q5_K scales[12] array. Bytes 0-3
 * hold scales 0-3 (bits 0-5), bytes 4-7 mins 0-3 (bits 0-5); bytes 8-11 hold the low nibbles of
 * scales 4-7 (bits 0-3) and mins 4-7 (bits 4-7); the top 2 bits of scales 4-7 sit in bits 6-7 of
 * bytes 0-3, those of mins 4-7 in bits 6-7 of bytes 4-7. */
static inline void kiln_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ggml's nearest_int: round to nearest, ties to even, for |f| < 2^22 (the callers' range). */
static inline int kiln_nearest_int(float f)
{
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* ---------------------------------------------------------------- one block */

/* Dequantize one block into y (32 values for q8_0, 256 for the k-quants). Same float operations,
 * in the same order, as ggml's dequantize_row_*: results are bit-identical. */
void kiln_dtype_dequant_q8_0(const kiln_block_q8_0 *b, float *y);
void kiln_dtype_dequant_q4_k(const kiln_block_q4_k *b, float *y);
void kiln_dtype_dequant_q5_k(const kiln_block_q5_k *b, float *y);
void kiln_dtype_dequant_q6_k(const kiln_block_q6_k *b, float *y);
void kiln_dtype_dequant_q8_k(const kiln_block_q8_k *b, float *y);
void kiln_dtype_dequant_q4_0(const kiln_block_q4_0 *b, float *y);
void kiln_dtype_dequant_q4_1(const kiln_block_q4_1 *b, float *y);
void kiln_dtype_dequant_q5_0(const kiln_block_q5_0 *b, float *y);
void kiln_dtype_dequant_q5_1(const kiln_block_q5_1 *b, float *y);
void kiln_dtype_dequant_iq4_nl(const kiln_block_iq4_nl *b, float *y);
void kiln_dtype_dequant_q2_k(const kiln_block_q2_k *b, float *y);
void kiln_dtype_dequant_q3_k(const kiln_block_q3_k *b, float *y);
void kiln_dtype_dequant_iq4_xs(const kiln_block_iq4_xs *b, float *y);
void kiln_dtype_dequant_iq2_xxs(const kiln_block_iq2_xxs *b, float *y);
void kiln_dtype_dequant_iq2_xs(const kiln_block_iq2_xs *b, float *y);
void kiln_dtype_dequant_iq2_s(const kiln_block_iq2_s *b, float *y);
void kiln_dtype_dequant_iq3_xxs(const kiln_block_iq3_xxs *b, float *y);
void kiln_dtype_dequant_iq3_s(const kiln_block_iq3_s *b, float *y);
void kiln_dtype_dequant_iq1_s(const kiln_block_iq1_s *b, float *y);
void kiln_dtype_dequant_iq1_m(const kiln_block_iq1_m *b, float *y);
/* The 16 signed 6-bit scales (already - 32) of a q3_K block, as ggml unpacks them. */
void kiln_q3_k_scales(const kiln_block_q3_k *b, int8_t out[16]);

/* Quantize one block from x, bit-exact with ggml's quantize_row_*_ref for finite inputs
 * (non-finite inputs give an unspecified block, never a crash). */
void kiln_dtype_quant_q8_0(const float *x, kiln_block_q8_0 *b);
void kiln_dtype_quant_q4_k(const float *x, kiln_block_q4_k *b);
void kiln_dtype_quant_q5_k(const float *x, kiln_block_q5_k *b);
void kiln_dtype_quant_q6_k(const float *x, kiln_block_q6_k *b);
void kiln_dtype_quant_q8_k(const float *x, kiln_block_q8_k *b);
void kiln_dtype_quant_q4_0(const float *x, kiln_block_q4_0 *b);
void kiln_dtype_quant_q4_1(const float *x, kiln_block_q4_1 *b);
void kiln_dtype_quant_q5_0(const float *x, kiln_block_q5_0 *b);
void kiln_dtype_quant_q5_1(const float *x, kiln_block_q5_1 *b);
/* iq4_nl: ggml's quantize_row_iq4_nl_ref algorithm (no importance weights: weights x^2, 7 tries
 * each side); iq4_xs likewise per 32 with ggml's 6-bit scale quantization. q2_K and q3_K: a plain
 * per-sub-block min/max (q2_K) or absmax (q3_K) quantizer, NOT ggml's search (their blocks are
 * valid and dequantize exactly; only the choice of quants differs). */
void kiln_dtype_quant_iq4_nl(const float *x, kiln_block_iq4_nl *b);
void kiln_dtype_quant_q2_k(const float *x, kiln_block_q2_k *b);
void kiln_dtype_quant_q3_k(const float *x, kiln_block_q3_k *b);
void kiln_dtype_quant_iq4_xs(const float *x, kiln_block_iq4_xs *b);
