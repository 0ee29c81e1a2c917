/* The llama-style decoder layer, shared by the model presets (random weights) and the GGUF model
 * builder (weights borrowed from a file): attention half and feed-forward half from given weight
 * nodes. Builds through the public API only; must not create weights, compile or run. */
#pragma once

#include "kiln/kiln.h"

/* Sizes and options of one layer. */
typedef struct kiln_layer_dims {
    int64_t        hidden;    /* model width */
    int64_t        n_head;    /* query heads */
    int64_t        n_kv_head; /* key/value heads; divides n_head */
    int64_t        head_dim;  /* per-head width (even) */
    kiln_rope_mode rope;      /* rotary mode */
    int64_t        n_rot;     /* rotary dims of each head (kiln_rope_partial); 0: head_dim */
    float          theta;     /* rotary base */
    const float   *rope_mult; /* [n_rot/2] per-pair frequency multipliers (kiln_rope_partial) or NULL */
    float          eps;       /* rms_norm epsilon */
    int64_t        max_ctx;   /* KV-cache rows (states k<L>, v<L> [n_kv_head, max_ctx, head_dim]); paged:
                                 the pool's slots */
    kiln_dtype     kvdtype;   /* KV-cache dtype */
    int64_t        block;     /* paged attention's block size (kiln_paged_attention); 0: a contiguous cache */
    float          attn_scale; /* score scale; 0: 1/sqrt(head_dim) */
    float          softcap;   /* attention logit soft-cap (kiln_attention_ext); 0: none */
    int64_t        window;    /* this layer's sliding window (kiln_attention_ext); 0: none */
    bool           gelu_gate; /* gelu(gate) * up (gemma) instead of swiglu */
    int64_t        n_expert;  /* > 0: the feed-forward is a mixture of this many experts (kiln_layer_weights' exps) */
    int            n_expert_used; /* experts routed per token */
    bool           expert_norm;   /* routed weights over their sum (kiln_moe_route's norm) */
} kiln_layer_dims;

/* Leaves shared by all layers. */
typedef struct kiln_layer_io {
    kiln_dim  n_tok; /* symbol: tokens this run */
    kiln_dim  n_kv;  /* symbol: valid cache rows this run */
    kiln_node pos;   /* i32 [n_tok] positions */
    kiln_node slots, seqs, blocks; /* paged only: slot mapping [n_tok], (start, KV length) [n_seq, 2],
                                      block table [n_seq, max_blocks] */
} kiln_layer_io;

/* Weight nodes of one layer; matmul weights are [out, in]. Biases are KILN_NODE_NONE (0, so a
 * designated initializer that leaves them out means "absent") when absent. */
typedef struct kiln_layer_weights {
    kiln_node attn_norm;      /* [hidden] */
    kiln_node wq, wk, wv;     /* [n_head*hd, hidden], [n_kv_head*hd, hidden] x2 */
    kiln_node bq, bk, bv;     /* optional [n_head*hd], [n_kv_head*hd] x2 (qwen2) */
    kiln_node q_norm, k_norm; /* optional [hd]: rms norm of every q / k head before rope (qwen3) */
    kiln_node wo;             /* [hidden, n_head*hd] */
    kiln_node bo;             /* optional [hidden] */
    kiln_node ffn_norm;       /* [hidden] */
    kiln_node wg, wu, wd;     /* [ffn, hidden] x2, [hidden, ffn] */
    kiln_node bg, bu, bd;     /* optional [ffn] x2, [hidden] */
    kiln_node attn_post_norm, ffn_post_norm; /* optional [hidden]: rms norms of each half's output (gemma 2/3) */
    kiln_node q_mult;         /* optional [hd]: the roped q times it (phi3's rope attn_factor^2 on the
                                 rotated dims with partial rotary, 1 on the rest) */
    /* mixture of experts (d->n_expert > 0; wg/wu/wd and their biases unused) */
    kiln_node        gate_inp;   /* [n_expert, hidden]: the router */
    kiln_node        gate_stack, up_stack; /* [n_expert, ffn_exp, hidden]: every expert's gate / up, run only
                                              for the routed experts (kiln_moe_matmul) */
    kiln_node        down_stack; /* [n_expert, hidden, ffn_exp]; with these three absent, the dense form: */
    const kiln_node *gate_exps;  /* n_expert nodes [ffn_exp, hidden]: expert e's gate */
    const kiln_node *up_exps;    /* n_expert nodes [ffn_exp, hidden] */
    const kiln_node *down_exps;  /* n_expert nodes [hidden, ffn_exp] */
    kiln_node gate_inp_shexp;    /* optional [1, hidden]: the shared expert's gate (qwen2moe) */
    kiln_node gate_shexp, up_shexp, down_shexp; /* optional [ffn_shexp, hidden] x2, [hidden, ffn_shexp] */
} kiln_layer_weights;

/* Layer l on x f32 [n_tok, hidden]: x += o(attention(rope(qn(q + bq)), kv_scatter(rope(kn(k + bk))),
 * kv_scatter(v + bv))) + bo with q/k/v of rms_norm(x); then x += down(swiglu(gate(h) + bg,
 * up(h) + bu)) + bd with h = rms_norm(x); qn/kn: per-head rms_norm with q_norm/k_norm when given
 * (identity otherwise). Each bias is added right after its matmul (an
 * epilogue). Options of d: the attention's scale, soft-cap and window; gelu(gate) * up for the gate;
 * with attn_post_norm / ffn_post_norm, each half's output is rms-normed before its residual add. Creates states k<l>, v<l>. Returns the new x (KILN_NODE_NONE after an error, which
 * sticks to g). With d->block, the caches are paged pools written through io->slots and read by
 * kiln_paged_attention (io->pos, io->seqs, io->blocks) instead. With d->n_expert, the feed-forward is
 * llama.cpp's build_moe_ffn: r = moe_route(h . gate_inp, n_expert_used, expert_norm); with the
 * stacks, x += moe_matmul(swiglu(moe_matmul(h, gate_stack, r), moe_matmul(h, up_stack, r)),
 * down_stack, r, sum) (only the routed experts run, added in routing order as llama.cpp); without,
 * densely: x += sum_e scale_rows(down_e(swiglu(gate_e(h), up_e(h))), r, e) (every expert on every
 * token, the ones not routed weighted 0); either way [+ scale_rows(shared expert of h,
 * sigmoid(h . gate_inp_shexp), 0)]. */
kiln_node kiln_layer_build(kiln_graph *g, const kiln_layer_dims *d, const kiln_layer_io *io,
                           const kiln_layer_weights *w, int l, kiln_node x);
