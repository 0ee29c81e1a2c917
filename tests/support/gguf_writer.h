/* A small GGUF writer for tests: metadata of every type, tensors of any ggml type id, v2 or v3,
 * any alignment; and a generator of small random llama/qwen2/qwen3/gemma2/gemma3/phi3 model files
 * (gemma: post-norms; gemma3: q/k norms; phi3: fused attn_qkv and gate/up ffn_up; mixtures of experts:
 * llama with experts, qwen2moe with its shared expert, qwen3moe). Writes exactly what is
 * asked (tests corrupt the bytes afterwards); must not be used by the library. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

typedef struct gw gw;

gw  *gw_new(uint32_t version, uint32_t alignment); /* alignment 0: no general.alignment key (32) */
void gw_free(gw *w);
/* A scalar of type t from the bytes of val (its size is the type's). */
void gw_kv(gw *w, const char *key, kiln_gguf_type t, const void *val);
void gw_kv_u32(gw *w, const char *key, uint32_t v);
void gw_kv_f32(gw *w, const char *key, float v);
void gw_kv_str(gw *w, const char *key, const char *v);
/* An array of n scalars of type t (elements packed). */
void gw_kv_arr(gw *w, const char *key, kiln_gguf_type t, uint64_t n, const void *data);
void gw_kv_arr_str(gw *w, const char *key, uint64_t n, const char *const *v);
/* A tensor: dims in kiln order (outermost first), data of `bytes` bytes copied. */
void gw_tensor(gw *w, const char *name, uint32_t ggml_type, int rank, const int64_t *dims, const void *data,
               size_t bytes);
/* The file's bytes (malloc'ed; caller frees) and their count. */
uint8_t *gw_bytes(gw *w, size_t *n);
/* Writes the bytes to path; 0 or -1. */
int gw_write(gw *w, const char *path);

/* A random model. */
typedef struct gw_model {
    const char *arch;      /* "llama", "qwen2", "qwen3", "gemma2", "gemma3" or "phi3" */
    int         n_layer;   /* blocks */
    int64_t     hidden;    /* embedding_length */
    int64_t     n_head;    /* head_count */
    int64_t     n_kv_head; /* head_count_kv */
    int64_t     ffn;       /* feed_forward_length */
    int64_t     n_vocab;   /* tokens */
    int64_t     n_ctx;     /* context_length */
    kiln_dtype  wtype;     /* matmul weights (f32/f16/bf16/q8_0/q4_k/q5_k/q6_k; falls back to q8_0/f16 per row width) */
    kiln_dtype  embtype;   /* token_embd dtype */
    bool        tied;      /* no output.weight */
    bool        tokens;    /* write tokenizer.ggml.tokens ("t0", "t1", ...) */
    uint64_t    seed;      /* weights */
    int         meta_n_layer; /* block_count written (0: n_layer), for inconsistent-file tests */
    int64_t     meta_ffn;     /* feed_forward_length written (0: ffn) */
    bool        qkv_bias;     /* write attn_q/k/v.bias (always for qwen2) */
    bool        out_bias;     /* write attn_output.bias */
    bool        ffn_bias;     /* write ffn_gate/ffn_up/ffn_down.bias */
    bool        no_eps;       /* leave out attention.layer_norm_rms_epsilon */
    int64_t     head_dim;     /* 0: hidden / n_head; else written as attention.key_length/value_length */
    bool        qk_norm;      /* write attn_q_norm/attn_k_norm.weight [head_dim] (always for qwen3) */
    float       rope_scale;   /* > 0: write rope.scaling.type "linear" (yarn: "yarn") and rope.scaling.factor */
    bool        yarn;         /* with rope_scale: the type is "yarn" */
    float       theta;        /* > 0: rope.freq_base (else 1e4 for llama, 1e6 for the others) */
    float       theta_swa;    /* > 0: write rope.freq_base_swa (gemma's local layers' base) */
    bool        rope_freqs;   /* write rope_freqs.weight [n_rot/2], random factors in [0.5, 7.5] */
    int64_t     window;       /* > 0: write attention.sliding_window */
    float       attn_softcap; /* > 0: write attn_logit_softcapping */
    float       final_softcap; /* > 0: write final_logit_softcapping */
    int64_t     n_rot;        /* > 0: write rope.dimension_count (partial rotary when below head_dim) */
    bool        q4_k_m;       /* with wtype q4_k: llama.cpp's Q4_K_M mix (attn_v and ffn_down q6_k on the
                                 layers its use_more_bits picks, output.weight q6_k) */
    bool        longrope;     /* write rope_factors_long/short.weight [n_rot/2] (phi3 128k files) */
    int64_t     n_ctx_orig;   /* > 0: write rope.scaling.original_context_length */
    float       rope_attn_factor; /* > 0: write rope.scaling.attn_factor */
    int         n_expert;     /* > 0: a mixture of experts (llama: Mixtral-style; always for qwen2moe/qwen3moe):
                                 expert_count, ffn_gate_inp and ffn_{gate,up,down}_exps in place of the dense ffn */
    int         n_expert_used; /* expert_used_count */
    int64_t     ffn_exp;      /* > 0: write expert_feed_forward_length (qwen MoE; each expert's width) */
    int64_t     ffn_shexp;    /* qwen2moe: the shared expert's width (> 0: written as
                                 expert_shared_feed_forward_length; 0: ffn) */
    float       router_scale; /* the router's weights times it (> 0; 0: 1): logits spread apart */
} gw_model;

/* Builds the model file's writer (random weights, scale 1/sqrt(in), norms near 1, biases small). */
gw *gw_model_new(const gw_model *m);
/* Writes a model file at path; 0 or -1. */
int gw_model_write(const gw_model *m, const char *path);
