/* One row per weight format on the GPU side (ggml's type_traits idea): the device layout a weight
 * is repacked into at upload, the block geometry, and the kir that loads, decodes and dots a
 * format's 16-byte chunks, for gemv (lower_gemv.c), the GEMM (lower_gemm.c) and get_rows
 * (lower_move.c). A dtype without a row has no GPU kernel and is refused by name. Adding a format
 * is a row, its functions and its tests (docs/kernels.md). Must not know any target's syntax. */
#pragma once

#include "codegen/kir.h"

/* Loaded 16-byte chunk(s) of one weight row. */
typedef struct gv_chunk {
    uint32_t v[4]; /* V4 loads */
    uint32_t d;    /* scale word(s), or the value itself for scalar loads */
} gv_chunk;

/* One decoded sub-step of a chunk: value i = a * q[i] + b (a NONE: q[i]; b NONE: 0), so that its
 * contribution to a dot product is a * dot(q, x) + b * sum(x). */
typedef struct gv_sub {
    uint32_t q[16]; /* F32 values (dequantized, or quants to scale) */
    int      v;     /* how many */
    uint32_t a, b;  /* scale and offset, or NONE */
} gv_sub;

/* Where a chunk's sub-steps meet x quantized per 32 (gemv's integer dot products): word w0 of the
 * x quants and group g0 of their scales for sub-step 0, the steps per sub-step, and for the
 * k-quants the chunk's half h0 (the one that subtracts the mins) and the qh shift hsh. */
typedef struct kl_dp4a_at {
    uint32_t w0, g0, h0, hsh; /* I32 (hsh U32); h0 and hsh NONE where the format has none */
    int      wstep, gstep;
} kl_dp4a_at;

/* Weight scales of a chunk for the integer dot products: wa[sub] multiplies the dot of sub-step
 * sub; k-quants also subtract dmin * (mn[0] * sum(x of sub 0) + mn[1] * sum(x of sub 1)). */
typedef struct kl_dp4a_scales {
    uint32_t wa[4];   /* F32 per sub-step */
    uint32_t dmin;    /* F32, or 0 */
    uint32_t mn[2];   /* F32 mins of the two sub-blocks, or 0 */
} kl_dp4a_scales;

enum { KL_GV_FENCE = 1, KL_GV_PAIR = 2 }; /* kl_wfmt.gemv_auto bits */

typedef struct kl_wfmt {
    kiln_dtype        t;        /* the dtype this row is for */
    enum kiln_klayout layout;   /* device layout (kiln_lower_weight_layout) */
    bool              block;    /* a GGUF block format: x quantized for integer dot products in
                                   gemv, dequantized to f16 in the GEMM */
    int               vec;      /* values per sub-step of a 16-byte chunk (4 f32, 8 f16/bf16, 16 blocks) */
    int               subs;     /* sub-steps per chunk (GEMM: tiles of 32 k per k-period) */
    int               k_align;  /* K a multiple of it (else float formats load one value at a time) */
    int               mc_cap;   /* tokens per gemv pass at most (decoders' registers) */
    bool              two;      /* gemv loads two chunks per step (both in flight before the first is used) */
    bool              two_dp4a; /* the same with integer dot products */
    uint8_t           gemv_auto; /* what the gemv knobs left at KILN_GEMM_AUTO mean for this format (KL_GV_*
                                    bits; the one place the per-format decode defaults live, chosen on the
                                    H100 by scripts/device-decode.sh's repeated A B A B runs): KL_GV_FENCE
                                    codegen.gemv_fence on, KL_GV_PAIR codegen.gemv_pair on (a kernel takes
                                    the pair path when every weight's format asks for it). 0: both off */
    /* device bytes of a [rows, k] weight, and the repack into them (dst holds that many bytes) */
    size_t (*dev_bytes)(int64_t rows, int64_t k);
    void   (*repack)(int64_t rows, int64_t k, const void *src, void *dst);
    /* chunk c (I32) of row `row` (I32) of a [rows, K] weight in buffer slot `slot` */
    void (*load)(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o);
    /* I32 first element (within the row) of sub-step `sub` of chunk c */
    uint32_t (*sub_elem)(kiln_kir *k, uint32_t c, int sub);
    /* the values of sub-step `sub` of a loaded chunk */
    void (*decode)(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o);
    /* block formats: U32 of 4 int8 values (word l of sub-step sub), hsh from dp4a_at */
    uint32_t (*dp4a_bytes)(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh);
    void (*dp4a_at)(kiln_kir *k, uint32_t c, kl_dp4a_at *o);
    void (*dp4a_scales)(kiln_kir *k, const gv_chunk *ch, uint32_t c, kl_dp4a_scales *o);
    int  dp4a_offset;           /* values stored + this (q6_K 32, q3_K 4, q4_0 8, q5_0 16): the dot
                                   subtracts it times the sum of the x quants */
    bool dp4a_mins;             /* dp4a_at's h0 chunks subtract mins (k-quants, q4_1, q5_1): x's group
                                   sums must be of its quants (lower_gemv.c quantize_x) */
    /* gemv's pair path (codegen.gemv_pair, integer dot products only): a lane takes chunks 2p and 2p+1
     * of a row together, pair p, whose x groups of 32 are pair_subs p .. pair_subs p + pair_subs - 1
     * (x quant words 8 g .. 8 g + 7 of group g): the scales are loaded and decoded once per 32 bytes
     * of quants and every dot product is a whole group. pm is p mod 8, computed where it is loop
     * invariant (a lane's pairs step by multiples of 8), so shift amounts and selects hoist. */
    int  pair_subs;             /* x groups of 32 per pair (q8_0 1, q4_K 2); 0: no pair path */
    void (*pair_load)(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t p, uint32_t pm, int64_t K, int64_t rows, gv_chunk *o);
    /* U32 of 4 int8 values: word l (0..7) of group `sub` of a loaded pair */
    uint32_t (*pair_bytes)(kiln_kir *k, const gv_chunk *ch, int sub, int l);
    /* wa[sub] per group (and the k-quants' dmin, mn[sub]) */
    void (*pair_scales)(kiln_kir *k, const gv_chunk *ch, uint32_t pm, kl_dp4a_scales *o);
    /* block formats: I32 chunk of piece h (0, 1) of the GEMM's 32-k tile at k0 */
    uint32_t (*gemm_chunk)(kiln_kir *k, uint32_t k0, uint32_t h);
    /* block formats, the Hopper GEMM's producer (CUDA only): the 16 values of sub-step `sub` of a
     * loaded chunk (c its I32 index) rounded to f16 as 8 words, values 2p and 2p + 1 in word p (low
     * half first), made in f16 pairs (PRMT, HFMA2) where the f32 decode takes an int->float and a
     * float->half conversion a value; NULL: decode, then PACK2 (kl_gm_chunk_words) */
    void (*gemm_h2)(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, uint32_t w[8]);
    /* block formats: F32 element col of row `row` (get_rows of a quantized table) */
    uint32_t (*elem)(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col);
} kl_wfmt;

/* f16 pairs for gemm_h2 (U32 words of two f16, CUDA only): a * b + c per half rounded once; the
 * F32 f in both halves; half h (0, 1) of w in both halves; bytes 2 p and 2 p + 1 of V4 v4 (values
 * 2 p, 2 p + 1 of a chunk of byte quants) in the low bytes of the two halves, high bytes 0; and q (0 .. 2047 in each half's low
 * bits, nothing above) to q a + b rounded once (a, b pairs) */
uint32_t kl_h2_fma(kiln_kir *k, uint32_t a, uint32_t b, uint32_t c);
uint32_t kl_h2_splat(kiln_kir *k, uint32_t f);
uint32_t kl_h2_half(kiln_kir *k, uint32_t w, int h);
uint32_t kl_h2_pair(kiln_kir *k, uint32_t v4, int p);
uint32_t kl_h2_scale(kiln_kir *k, uint32_t q, uint32_t a, uint32_t b);

/* The row of dtype t, or NULL: the GPU lowering has no kernel for that weight format. */
const kl_wfmt *kl_wfmt_of(kiln_dtype t);
/* The rows of the formats in wfmt_more.c (q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_K, q3_K, iq4_xs),
 * indexed by dtype (rows without a load are absent); kl_wfmt_of reads both tables. */
extern const kl_wfmt kl_wfmt_more[KILN_DTYPE_COUNT];
/* 16-byte chunks per row of K values (K / (vec * subs)). */
int64_t kl_wfmt_chunks(const kl_wfmt *f, int64_t K);
