/* The architectures kiln builds from GGUF files, one table row each: the layer's tensors (which are
 * required, which optional), the rotary mode, and which metadata keys the model code honours. The
 * loader (model.c) walks these tables; nothing here reads a file or builds a graph. */
#pragma once

#include "kiln/kiln.h"

/* One tensor of a decoder layer ("blk.<l>.<suffix>"). */
typedef enum kiln_role {
    KILN_ROLE_ATTN_NORM = 0, /* attn_norm.weight [hidden] */
    KILN_ROLE_WQ,            /* attn_q.weight [qd, hidden] */
    KILN_ROLE_WK,            /* attn_k.weight [kvd, hidden] */
    KILN_ROLE_WV,            /* attn_v.weight [kvd, hidden] */
    KILN_ROLE_BQ,            /* attn_q.bias [qd] */
    KILN_ROLE_BK,            /* attn_k.bias [kvd] */
    KILN_ROLE_BV,            /* attn_v.bias [kvd] */
    KILN_ROLE_Q_NORM,        /* attn_q_norm.weight [head_dim]: per-head rms norm of q (qwen3) */
    KILN_ROLE_K_NORM,        /* attn_k_norm.weight [head_dim] */
    KILN_ROLE_WO,            /* attn_output.weight [hidden, qd] */
    KILN_ROLE_BO,            /* attn_output.bias [hidden] */
    KILN_ROLE_FFN_NORM,      /* ffn_norm.weight [hidden] */
    KILN_ROLE_WG,            /* ffn_gate.weight [ffn, hidden] */
    KILN_ROLE_WU,            /* ffn_up.weight [ffn, hidden] */
    KILN_ROLE_WD,            /* ffn_down.weight [hidden, ffn] */
    KILN_ROLE_BG,            /* ffn_gate.bias [ffn] */
    KILN_ROLE_BU,            /* ffn_up.bias [ffn] */
    KILN_ROLE_BD,            /* ffn_down.bias [hidden] */
    KILN_ROLE_ATTN_POST_NORM, /* post_attention_norm.weight [hidden]: rms norm of the attention output (gemma 2/3) */
    KILN_ROLE_FFN_POST_NORM,  /* post_ffw_norm.weight [hidden]: rms norm of the feed-forward output (gemma 2/3) */
    KILN_ROLE_WQKV,          /* attn_qkv.weight [qd + 2 kvd, hidden]: q, k and v rows stacked (phi3) */
    KILN_ROLE_WGU,           /* ffn_up.weight [2 ffn, hidden]: gate rows, then up rows (phi3) */
    KILN_ROLE_GATE_INP,      /* ffn_gate_inp.weight [n_expert, hidden]: the MoE router */
    KILN_ROLE_GATE_EXPS,     /* ffn_gate_exps.weight [n_expert, ffn_exp, hidden]: every expert's gate */
    KILN_ROLE_UP_EXPS,       /* ffn_up_exps.weight [n_expert, ffn_exp, hidden] */
    KILN_ROLE_DOWN_EXPS,     /* ffn_down_exps.weight [n_expert, hidden, ffn_exp] */
    KILN_ROLE_GATE_INP_SHEXP, /* ffn_gate_inp_shexp.weight [hidden]: the shared expert's sigmoid gate (qwen2moe) */
    KILN_ROLE_GATE_SHEXP,    /* ffn_gate_shexp.weight [ffn_shexp, hidden]: the shared expert (qwen2moe) */
    KILN_ROLE_UP_SHEXP,      /* ffn_up_shexp.weight [ffn_shexp, hidden] */
    KILN_ROLE_DOWN_SHEXP,    /* ffn_down_shexp.weight [hidden, ffn_shexp] */
    KILN_ROLE_COUNT
} kiln_role;

#define KILN_ROLE_BIT(r) (1u << (r))

/* The sizes a tensor's dims are written in. */
typedef enum kiln_size {
    KILN_SIZE_NONE = 0, /* no dim (rank-1 tensors leave dim 1 at NONE) */
    KILN_SIZE_HIDDEN,   /* embedding_length */
    KILN_SIZE_QD,       /* n_head * head_dim */
    KILN_SIZE_KVD,      /* n_kv_head * head_dim */
    KILN_SIZE_FFN,      /* feed_forward_length */
    KILN_SIZE_HEAD,     /* head_dim */
    KILN_SIZE_QKV,      /* qd + 2 kvd (a fused q/k/v matrix) */
    KILN_SIZE_FFN2,     /* 2 ffn (a fused gate/up matrix) */
    KILN_SIZE_EXPERTS,  /* expert_count */
    KILN_SIZE_FFN_EXP,  /* one expert's feed-forward width */
    KILN_SIZE_FFN_SHEXP, /* the shared expert's feed-forward width */
} kiln_size;

typedef struct kiln_role_info {
    const char *suffix;  /* name after "blk.<l>." */
    kiln_size   dims[3]; /* [out, in] for matrices; [n, NONE] for vectors; [experts, out, in] for expert stacks */
} kiln_role_info;

/* How the loader treats a metadata key under "<arch>.". */
typedef enum kiln_key_use {
    KILN_KEY_READ = 0, /* read and honoured by the loader (or checked against the tensors) */
    KILN_KEY_INFO,     /* does not change what the model computes (kept for messages) */
    KILN_KEY_NEUTRAL,  /* a feature kiln does not build: accepted only at its neutral value */
} kiln_key_use;

typedef struct kiln_arch_key {
    const char  *suffix;  /* key after "<arch>." */
    kiln_key_use use;     /* treatment */
    double       neutral; /* KILN_KEY_NEUTRAL: the value that leaves the math unchanged (bools: 0/1) */
} kiln_arch_key;

/* Whether an architecture's feed-forward halves are mixtures of experts (llama.cpp's build_moe_ffn). */
typedef enum kiln_moe {
    KILN_MOE_NONE = 0, /* dense only: expert_count must be 0 */
    KILN_MOE_OPTIONAL, /* dense, or routed experts when expert_count > 0 (llama: Mixtral) */
    KILN_MOE_REQUIRED, /* routed experts always (qwen2moe, qwen3moe) */
} kiln_moe;

/* The gate activation of the feed-forward half. */
typedef enum kiln_gate_act {
    KILN_GATE_SILU = 0, /* silu(gate) * up (swiglu): llama, qwen, phi3 */
    KILN_GATE_GELU,     /* gelu_tanh(gate) * up (geglu): gemma */
} kiln_gate_act;

/* One architecture: what its layers hold and how they compute (llama.cpp's graph for it). */
typedef struct kiln_arch {
    const char          *name;     /* general.architecture */
    kiln_rope_mode       rope;     /* rotary pairing of the file's Q/K layout */
    uint32_t             required; /* KILN_ROLE_BIT set of layer tensors every layer must have */
    uint32_t             optional; /* roles a file may carry (all layers or none, decided by blk.0) */
    const kiln_arch_key *keys;     /* keys under "<arch>." the loader knows; ends with a NULL suffix */
    const kiln_arch_key *keys_more; /* NULL, or more such keys, looked up after keys (an architecture's own beside a family's) */
    kiln_gate_act        gate;     /* feed-forward gate activation */
    bool                 embd_scale; /* token embeddings times sqrt(hidden), in f32 (gemma) */
    bool                 tied_head;  /* the head is always token_embd.weight (llama.cpp's gemma loaders): an
                                        output.weight is not read, so the file is refused */
    int                  swa_pattern; /* > 0: only layers l with l % swa_pattern < swa_pattern - 1 use the
                                         sliding window (gemma 2: 2, gemma 3: 6); 0: every layer does */
    float                swa_theta;  /* > 0: window layers rotate with this base by default (gemma 3: 10000);
                                        0: with the file's rope.freq_base (gemma 2). rope.freq_base_swa overrides
                                        both where the table lists it (llama.cpp's LLM_KV_ROPE_FREQ_BASE_SWA) */
    bool                 swa_unscaled; /* window layers drop the rope scaling (gemma 3's local layers); else they
                                          keep the file's factor as the global layers do (gemma 2) */
    int64_t              window_default;  /* window when attention.sliding_window is absent (gemma 2: 4096) */
    float                attn_softcap_default;  /* attn_logit_softcapping when absent (gemma 2: 50; 0: none) */
    float                final_softcap_default; /* final_logit_softcapping when absent (gemma 2: 30; 0: none) */
    int                  wide_scale_layers[2]; /* block counts whose score scale is 1/sqrt(hidden / n_head)
                                                  instead of 1/sqrt(head_dim) (llama.cpp's gemma 27B rule) */
    bool                 longrope; /* reads rope_factors_long/short.weight, rope.scaling.original_context_length
                                      and rope.scaling.attn_factor (phi3) */
    kiln_moe             moe;      /* mixture-of-experts feed-forward: none, optional, required */
    bool                 moe_norm; /* the k routed weights over their sum (llama.cpp's norm_w: llama, qwen3moe) */
    bool                 moe_shared; /* a shared expert beside the routed ones, gated by sigmoid(h . ffn_gate_inp_shexp)
                                        (qwen2moe) */
    bool                 yarn;     /* rope.scaling.type "yarn" is built (llama, qwen2, qwen3: every layer rotates
                                      with the file's base; gemma's unscaled local layers and phi3's longrope
                                      are not combined with it) */
} kiln_arch;

/* The row of architecture name, or NULL. */
const kiln_arch *kiln_arch_find(const char *name);
/* "llama, qwen2, ..." for messages. */
const char *kiln_arch_names(void);
/* Whether layer l of a model of this architecture attends through its sliding window (when it has one). */
bool kiln_arch_layer_windowed(const kiln_arch *a, int l);
/* The layer tensor table (KILN_ROLE_COUNT rows). */
const kiln_role_info *kiln_arch_roles(void);
/* The entry of key suffix in a's table, or NULL when the loader does not know it. */
const kiln_arch_key *kiln_arch_key_find(const kiln_arch *a, const char *suffix);
