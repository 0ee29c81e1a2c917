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
} kiln_size;

typedef struct kiln_role_info {
    const char *suffix;  /* name after "blk.<l>." */
    kiln_size   dims[2]; /* [out, in] for matrices; [n, NONE] for vectors */
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

/* One architecture. */
typedef struct kiln_arch {
    const char          *name;     /* general.architecture */
    kiln_rope_mode       rope;     /* rotary pairing of the file's Q/K layout */
    uint32_t             required; /* KILN_ROLE_BIT set of layer tensors every layer must have */
    uint32_t             optional; /* roles a file may carry (all layers or none, decided by blk.0) */
    const kiln_arch_key *keys;     /* keys under "<arch>." the loader knows; ends with a NULL suffix */
} kiln_arch;

/* The row of architecture name, or NULL. */
const kiln_arch *kiln_arch_find(const char *name);
/* "llama, qwen2, ..." for messages. */
const char *kiln_arch_names(void);
/* The layer tensor table (KILN_ROLE_COUNT rows). */
const kiln_role_info *kiln_arch_roles(void);
/* The entry of key suffix in a's table, or NULL when the loader does not know it. */
const kiln_arch_key *kiln_arch_key_find(const kiln_arch *a, const char *suffix);
