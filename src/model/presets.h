/* Model presets: the dimensions of a few well-known llama-style models and a builder that makes
 * an N-layer decoder stack from them with random weights (the CLI's bench, examples and tests
 * share it). Builds graphs through the public API only; must not compile or run anything. */
#pragma once

#include "kiln/kiln.h"

typedef struct kiln_preset {
    const char    *name;      /* "qwen2-0.5b", "llama-7b", ... */
    int64_t        hidden;    /* model width */
    int64_t        n_head;    /* query heads */
    int64_t        n_kv_head; /* key/value heads (GQA); divides n_head */
    int64_t        head_dim;  /* per-head width (even) */
    int64_t        ffn;       /* feed-forward width */
    kiln_rope_mode rope;      /* rotary mode */
    float          theta;     /* rotary base */
    float          eps;       /* rms_norm epsilon */
    bool           qkv_bias;  /* q/k/v matmuls add an f32 bias (qwen2) */
    bool           rope_mult; /* per-pair rotary multipliers 1 / (1 + i % 7), llama-3.1 style (tests) */
} kiln_preset;

/* Options of kiln_preset_build_ex beyond the preset's dims. */
typedef struct kiln_preset_build_opts {
    kiln_dtype wdtype;   /* matmul weight dtype (norm weights stay f32) */
    kiln_dtype kvdtype;  /* KV-cache state dtype: f32 or f16 */
    int        n_layers; /* decoder layers, >= 1 */
    int64_t    max_ctx;  /* KV-cache rows; bound of symbol n_kv */
    int64_t    max_tok;  /* bound of symbol n_tok */
    uint64_t   seed;     /* base seed of the random weights */
    bool       shape_only; /* matmul weights are zeros borrowed from one shared mapping: fast to
                              build, for code generation and listings (kiln ptx, test_ptx) */
    int64_t    block;    /* > 0: paged attention over pools of max_ctx slots in blocks of this size
                            (a serving step): symbol n_seq (<= max_seqs) instead of n_kv, inputs
                            slots i32 [n_tok], seqs i32 [n_seq, 2], blocks i32 [n_seq, max_blocks] */
    int64_t    max_seqs; /* paged: bound of n_seq */
    int64_t    max_blocks; /* paged: block table width (keys per sequence / block) */
} kiln_preset_build_opts;

/* The built-in presets; NULL past the end / for an unknown name. find also knows shapes that are
 * not listed (llama-70b: the sweeps over every preset skip it). */
int                kiln_preset_count(void);
const kiln_preset *kiln_preset_at(int i);
const kiln_preset *kiln_preset_find(const char *name);

/* Builds a llama-style stack. Graph interface: input `x` f32 [n_tok, hidden], input `pos` i32
 * [n_tok], symbols `n_tok` (<= max_tok) and `n_kv` (<= max_ctx), states `k<L>`/`v<L>`
 * [n_kv_head, max_ctx, head_dim], output `y` f32 [n_tok, hidden]. Per layer: rms_norm -> q,k,v
 * (+ biases when qkv_bias: f32, u/2 with seeds seed + 16 L + 9..11) -> rope(q,k) -> kv_scatter -> attention over n_kv -> o -> +residual -> rms_norm -> gate/up ->
 * swiglu -> down -> +residual. Weight tensor w (layer L, index j) has seed seed + 16 L + j and
 * scale 1/sqrt(in); norm weights are f32 1 + u/8, u uniform in [-1, 1] from the same rule.
 * A block dtype whose block does not divide a matmul's input width falls back to q8_0 (or f16)
 * for that matmul, as GGUF converters do. On error *out is NULL, the status says why and err (may
 * be NULL) gets the builder's message. */
kiln_status kiln_preset_build_ex(const kiln_preset *p, const kiln_preset_build_opts *o, kiln_graph **out,
                                 char *err, size_t n_err);
/* The KV-cache dtype that goes with matmul weights of dtype w: f32 for f32, else f16. */
kiln_dtype kiln_preset_kv_dtype(kiln_dtype w);
/* kiln_preset_build_ex with kvdtype kiln_preset_kv_dtype(wdtype), seed 1. */
kiln_status kiln_preset_build(const kiln_preset *p, kiln_dtype wdtype, int n_layers, int64_t max_ctx,
                              int64_t max_tok, kiln_graph **out);

/* The dtype a matmul with input width k gets for requested weight dtype t (the fallback above). */
kiln_dtype kiln_preset_wdtype_for(kiln_dtype t, int64_t k);
/* Bytes of all weights of one layer (matmul weights in their effective dtypes + f32 norms and biases). */
size_t kiln_preset_layer_weight_bytes(const kiln_preset *p, kiln_dtype wdtype);
/* Bytes of K and V cache rows one layer reads when attending over n_kv rows. */
size_t kiln_preset_layer_kv_bytes(const kiln_preset *p, kiln_dtype kvdtype, int64_t n_kv);

/* FLOPs of one layer for n_tok tokens attending over up to n_kv rows: 2 per multiply-add of the
 * matmuls, plus q.k and p.v of attention (causal: token t sees n_kv - n_tok + t + 1 rows). */
double kiln_preset_layer_flops(const kiln_preset *p, int64_t n_tok, int64_t n_kv);

/* splitmix64: the reproducible generator of presets, the CLI's input filler and the examples. */
uint64_t kiln_preset_rng(uint64_t *state);
/* Uniform in [-1, 1). */
float kiln_preset_rngf(uint64_t *state);
