/* The architecture table (see arch.h): one row per architecture kiln builds, the layer tensor
 * names and shapes, and the metadata keys each architecture's loader knows. Adding an
 * architecture is a row here plus what its layer needs in layer.c; must not hold logic beyond lookups. */
#include "model/arch.h"

#include <string.h>

#define B KILN_ROLE_BIT

static const kiln_role_info roles[KILN_ROLE_COUNT] = {
    [KILN_ROLE_ATTN_NORM] = {"attn_norm.weight", {KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WQ] = {"attn_q.weight", {KILN_SIZE_QD, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WK] = {"attn_k.weight", {KILN_SIZE_KVD, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WV] = {"attn_v.weight", {KILN_SIZE_KVD, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_BQ] = {"attn_q.bias", {KILN_SIZE_QD}},
    [KILN_ROLE_BK] = {"attn_k.bias", {KILN_SIZE_KVD}},
    [KILN_ROLE_BV] = {"attn_v.bias", {KILN_SIZE_KVD}},
    [KILN_ROLE_Q_NORM] = {"attn_q_norm.weight", {KILN_SIZE_HEAD}},
    [KILN_ROLE_K_NORM] = {"attn_k_norm.weight", {KILN_SIZE_HEAD}},
    [KILN_ROLE_WO] = {"attn_output.weight", {KILN_SIZE_HIDDEN, KILN_SIZE_QD}},
    [KILN_ROLE_BO] = {"attn_output.bias", {KILN_SIZE_HIDDEN}},
    [KILN_ROLE_FFN_NORM] = {"ffn_norm.weight", {KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WG] = {"ffn_gate.weight", {KILN_SIZE_FFN, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WU] = {"ffn_up.weight", {KILN_SIZE_FFN, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WD] = {"ffn_down.weight", {KILN_SIZE_HIDDEN, KILN_SIZE_FFN}},
    [KILN_ROLE_BG] = {"ffn_gate.bias", {KILN_SIZE_FFN}},
    [KILN_ROLE_BU] = {"ffn_up.bias", {KILN_SIZE_FFN}},
    [KILN_ROLE_BD] = {"ffn_down.bias", {KILN_SIZE_HIDDEN}},
    [KILN_ROLE_ATTN_POST_NORM] = {"post_attention_norm.weight", {KILN_SIZE_HIDDEN}},
    [KILN_ROLE_FFN_POST_NORM] = {"post_ffw_norm.weight", {KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WQKV] = {"attn_qkv.weight", {KILN_SIZE_QKV, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_WGU] = {"ffn_up.weight", {KILN_SIZE_FFN2, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_GATE_INP] = {"ffn_gate_inp.weight", {KILN_SIZE_EXPERTS, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_GATE_EXPS] = {"ffn_gate_exps.weight", {KILN_SIZE_EXPERTS, KILN_SIZE_FFN_EXP, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_UP_EXPS] = {"ffn_up_exps.weight", {KILN_SIZE_EXPERTS, KILN_SIZE_FFN_EXP, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_DOWN_EXPS] = {"ffn_down_exps.weight", {KILN_SIZE_EXPERTS, KILN_SIZE_HIDDEN, KILN_SIZE_FFN_EXP}},
    [KILN_ROLE_GATE_INP_SHEXP] = {"ffn_gate_inp_shexp.weight", {KILN_SIZE_HIDDEN}},
    [KILN_ROLE_GATE_SHEXP] = {"ffn_gate_shexp.weight", {KILN_SIZE_FFN_SHEXP, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_UP_SHEXP] = {"ffn_up_shexp.weight", {KILN_SIZE_FFN_SHEXP, KILN_SIZE_HIDDEN}},
    [KILN_ROLE_DOWN_SHEXP] = {"ffn_down_shexp.weight", {KILN_SIZE_HIDDEN, KILN_SIZE_FFN_SHEXP}},
};

/* The keys of the llama family (llama.cpp's LLM_KV names). READ keys are honoured in model.c;
 * NEUTRAL ones name features kiln does not build, accepted only at the value that turns them off.
 * A key under "<arch>." that is not listed makes the loader refuse the file. */
static const kiln_arch_key llama_keys[] = {
    {"block_count", KILN_KEY_READ, 0},
    {"context_length", KILN_KEY_READ, 0},
    {"embedding_length", KILN_KEY_READ, 0},
    {"feed_forward_length", KILN_KEY_READ, 0},
    {"vocab_size", KILN_KEY_READ, 0},
    {"attention.head_count", KILN_KEY_READ, 0},
    {"attention.head_count_kv", KILN_KEY_READ, 0},
    {"attention.key_length", KILN_KEY_READ, 0},
    {"attention.value_length", KILN_KEY_READ, 0},
    {"attention.layer_norm_rms_epsilon", KILN_KEY_READ, 0},
    {"rope.dimension_count", KILN_KEY_READ, 0},
    {"rope.freq_base", KILN_KEY_READ, 0},
    {"rope.scaling.type", KILN_KEY_READ, 0},
    {"rope.scaling.factor", KILN_KEY_READ, 0},
    {"rope.scale_linear", KILN_KEY_READ, 0},
    {"rope.scaling.original_context_length", KILN_KEY_READ, 0}, /* yarn's correction dims */
    {"rope.scaling.finetuned", KILN_KEY_INFO, 0},
    {"tensor_data_layout", KILN_KEY_INFO, 0},
    {"expert_count", KILN_KEY_READ, 0},      /* read_moe: > 0 only where the architecture builds experts */
    {"expert_used_count", KILN_KEY_READ, 0}, /* read_moe */
    {"expert_shared_count", KILN_KEY_NEUTRAL, 0},
    {"rope.scaling.attn_factor", KILN_KEY_READ, 0}, /* rope mscale (llama.cpp: every arch) */
    {"attention.causal", KILN_KEY_NEUTRAL, 1},
    {"attention.clamp_kqv", KILN_KEY_NEUTRAL, 0},
    {"attention.max_alibi_bias", KILN_KEY_NEUTRAL, 0},
    {"attention.sliding_window", KILN_KEY_READ, 0}, /* honoured by capping max_ctx (model.c) */
    {"attn_logit_softcapping", KILN_KEY_NEUTRAL, 0},
    {"final_logit_softcapping", KILN_KEY_NEUTRAL, 0},
    {"use_parallel_residual", KILN_KEY_NEUTRAL, 0},
    {"logit_scale", KILN_KEY_NEUTRAL, 1},
    {"embedding_scale", KILN_KEY_NEUTRAL, 1},
    {"residual_scale", KILN_KEY_NEUTRAL, 1},
    {NULL, KILN_KEY_READ, 0},
};

/* qwen2moe / qwen3moe (llama.cpp's LLM_ARCH_QWEN2MOE/QWEN3MOE): the llama family's keys (their
 * kiln_arch.keys), then each expert's width and the shared expert's (read_moe). */
static const kiln_arch_key qwen_moe_keys[] = {
    {"expert_feed_forward_length", KILN_KEY_READ, 0},        /* read_moe: each expert's width */
    {"expert_shared_feed_forward_length", KILN_KEY_READ, 0}, /* read_moe: the shared expert's (qwen2moe) */
    {NULL, KILN_KEY_READ, 0},
};

/* gemma 2/3 (llama.cpp's LLM_ARCH_GEMMA2/3 loaders): the soft-caps are read (gemma 2 defaults 50 and
 * 30 when absent; gemma 3 none), the window is read and applied per layer (gemma 2 default 4096). */
static const kiln_arch_key gemma_keys[] = {
    {"block_count", KILN_KEY_READ, 0},
    {"context_length", KILN_KEY_READ, 0},
    {"embedding_length", KILN_KEY_READ, 0},
    {"feed_forward_length", KILN_KEY_READ, 0},
    {"vocab_size", KILN_KEY_READ, 0},
    {"attention.head_count", KILN_KEY_READ, 0},
    {"attention.head_count_kv", KILN_KEY_READ, 0},
    {"attention.key_length", KILN_KEY_READ, 0},
    {"attention.value_length", KILN_KEY_READ, 0},
    {"attention.layer_norm_rms_epsilon", KILN_KEY_READ, 0},
    {"attention.sliding_window", KILN_KEY_READ, 0},
    {"attn_logit_softcapping", KILN_KEY_READ, 0},
    {"final_logit_softcapping", KILN_KEY_READ, 0},
    {"rope.dimension_count", KILN_KEY_READ, 0},
    {"rope.freq_base", KILN_KEY_READ, 0},
    {"rope.freq_base_swa", KILN_KEY_READ, 0},
    {"rope.scaling.type", KILN_KEY_READ, 0},
    {"rope.scaling.factor", KILN_KEY_READ, 0},
    {"rope.scale_linear", KILN_KEY_READ, 0},
    {"rope.scaling.original_context_length", KILN_KEY_INFO, 0},
    {"rope.scaling.finetuned", KILN_KEY_INFO, 0},
    {"tensor_data_layout", KILN_KEY_INFO, 0},
    {"expert_count", KILN_KEY_NEUTRAL, 0},
    {"expert_used_count", KILN_KEY_NEUTRAL, 0},
    {"rope.scaling.attn_factor", KILN_KEY_NEUTRAL, 1},
    {"attention.causal", KILN_KEY_NEUTRAL, 1},
    {"logit_scale", KILN_KEY_NEUTRAL, 1},
    {"embedding_scale", KILN_KEY_NEUTRAL, 1},
    {"residual_scale", KILN_KEY_NEUTRAL, 1},
    {NULL, KILN_KEY_READ, 0},
};

/* gemma 1 (llama.cpp's LLM_ARCH_GEMMA): reads no window and no soft-cap (keys for them are accepted
 * only at the value that turns them off). */
static const kiln_arch_key gemma1_keys[] = {
    {"block_count", KILN_KEY_READ, 0},
    {"context_length", KILN_KEY_READ, 0},
    {"embedding_length", KILN_KEY_READ, 0},
    {"feed_forward_length", KILN_KEY_READ, 0},
    {"vocab_size", KILN_KEY_READ, 0},
    {"attention.head_count", KILN_KEY_READ, 0},
    {"attention.head_count_kv", KILN_KEY_READ, 0},
    {"attention.key_length", KILN_KEY_READ, 0},
    {"attention.value_length", KILN_KEY_READ, 0},
    {"attention.layer_norm_rms_epsilon", KILN_KEY_READ, 0},
    {"rope.dimension_count", KILN_KEY_READ, 0},
    {"rope.freq_base", KILN_KEY_READ, 0},
    {"rope.scaling.type", KILN_KEY_READ, 0},
    {"rope.scaling.factor", KILN_KEY_READ, 0},
    {"rope.scale_linear", KILN_KEY_READ, 0},
    {"rope.scaling.original_context_length", KILN_KEY_INFO, 0},
    {"rope.scaling.finetuned", KILN_KEY_INFO, 0},
    {"tensor_data_layout", KILN_KEY_INFO, 0},
    {"expert_count", KILN_KEY_NEUTRAL, 0},
    {"expert_used_count", KILN_KEY_NEUTRAL, 0},
    {"rope.scaling.attn_factor", KILN_KEY_NEUTRAL, 1},
    {"attention.causal", KILN_KEY_NEUTRAL, 1},
    {"attention.sliding_window", KILN_KEY_NEUTRAL, 0},
    {"attn_logit_softcapping", KILN_KEY_NEUTRAL, 0},
    {"final_logit_softcapping", KILN_KEY_NEUTRAL, 0},
    {"logit_scale", KILN_KEY_NEUTRAL, 1},
    {"embedding_scale", KILN_KEY_NEUTRAL, 1},
    {"residual_scale", KILN_KEY_NEUTRAL, 1},
    {NULL, KILN_KEY_READ, 0},
};

/* phi3 (llama.cpp's LLM_ARCH_PHI3): longrope files carry rope_factors_long/short tensors, the
 * original context that picks between them and rope.scaling.attn_factor (load.c reads all three). */
static const kiln_arch_key phi3_keys[] = {
    {"block_count", KILN_KEY_READ, 0},
    {"context_length", KILN_KEY_READ, 0},
    {"embedding_length", KILN_KEY_READ, 0},
    {"feed_forward_length", KILN_KEY_READ, 0},
    {"vocab_size", KILN_KEY_READ, 0},
    {"attention.head_count", KILN_KEY_READ, 0},
    {"attention.head_count_kv", KILN_KEY_READ, 0},
    {"attention.key_length", KILN_KEY_READ, 0},
    {"attention.value_length", KILN_KEY_READ, 0},
    {"attention.layer_norm_rms_epsilon", KILN_KEY_READ, 0},
    {"attention.sliding_window", KILN_KEY_READ, 0},
    {"rope.dimension_count", KILN_KEY_READ, 0},
    {"rope.freq_base", KILN_KEY_READ, 0},
    {"rope.scaling.type", KILN_KEY_READ, 0},
    {"rope.scaling.factor", KILN_KEY_READ, 0},
    {"rope.scale_linear", KILN_KEY_READ, 0},
    {"rope.scaling.original_context_length", KILN_KEY_READ, 0}, /* longrope: short or long factors */
    {"rope.scaling.finetuned", KILN_KEY_INFO, 0},
    {"tensor_data_layout", KILN_KEY_INFO, 0},
    {"rope.scaling.attn_factor", KILN_KEY_READ, 0},
    {"attention.causal", KILN_KEY_NEUTRAL, 1},
    {"logit_scale", KILN_KEY_NEUTRAL, 1},
    {"embedding_scale", KILN_KEY_NEUTRAL, 1},
    {"residual_scale", KILN_KEY_NEUTRAL, 1},
    {"attn_logit_softcapping", KILN_KEY_NEUTRAL, 0},
    {"final_logit_softcapping", KILN_KEY_NEUTRAL, 0},
    {NULL, KILN_KEY_READ, 0},
};

#define NORMS (B(KILN_ROLE_ATTN_NORM) | B(KILN_ROLE_FFN_NORM))
#define MATS (B(KILN_ROLE_WQ) | B(KILN_ROLE_WK) | B(KILN_ROLE_WV) | B(KILN_ROLE_WO) | B(KILN_ROLE_WG) | \
              B(KILN_ROLE_WU) | B(KILN_ROLE_WD))
#define QKV_BIAS (B(KILN_ROLE_BQ) | B(KILN_ROLE_BK) | B(KILN_ROLE_BV))
#define OUT_FFN_BIAS (B(KILN_ROLE_BO) | B(KILN_ROLE_BG) | B(KILN_ROLE_BU) | B(KILN_ROLE_BD))
#define POST_NORMS (B(KILN_ROLE_ATTN_POST_NORM) | B(KILN_ROLE_FFN_POST_NORM))

/* Which tensors are required follows llama.cpp's loader for each architecture: a file it would
 * refuse for a missing tensor, kiln refuses too; an optional one is used when present. */
static const kiln_arch archs[] = {
    {.name = "llama", .rope = KILN_ROPE_NORMAL, .required = NORMS | MATS, .optional = QKV_BIAS | OUT_FFN_BIAS,
     .keys = llama_keys, .yarn = true, .moe = KILN_MOE_OPTIONAL, .moe_norm = true},
    {.name = "qwen2", .rope = KILN_ROPE_NEOX, .required = NORMS | MATS | QKV_BIAS, .optional = 0, .keys = llama_keys,
     .yarn = true},
    {.name = "qwen3", .rope = KILN_ROPE_NEOX, .required = NORMS | MATS | B(KILN_ROLE_Q_NORM) | B(KILN_ROLE_K_NORM),
     .optional = 0, .keys = llama_keys, .yarn = true},
    {.name = "gemma", .rope = KILN_ROPE_NEOX, .required = NORMS | MATS, .optional = 0, .keys = gemma1_keys,
     .gate = KILN_GATE_GELU, .embd_scale = true, .tied_head = true},
    {.name = "gemma2", .rope = KILN_ROPE_NEOX, .required = NORMS | MATS | POST_NORMS, .optional = 0, .keys = gemma_keys,
     .gate = KILN_GATE_GELU, .embd_scale = true, .tied_head = true, .swa_pattern = 2, .window_default = 4096,
     .attn_softcap_default = 50.0f, .final_softcap_default = 30.0f, .wide_scale_layers = {46}},
    {.name = "gemma3", .rope = KILN_ROPE_NEOX, .required = NORMS | MATS | POST_NORMS | B(KILN_ROLE_Q_NORM) | B(KILN_ROLE_K_NORM),
     .optional = 0, .keys = gemma_keys, .gate = KILN_GATE_GELU, .embd_scale = true, .tied_head = true, .swa_pattern = 6,
     .swa_theta = 10000.0f, .swa_unscaled = true, .wide_scale_layers = {62}},
    {.name = "qwen2moe", .rope = KILN_ROPE_NEOX, .required = NORMS | MATS | QKV_BIAS, .optional = 0, .keys = llama_keys, .keys_more = qwen_moe_keys,
     .yarn = true, .moe = KILN_MOE_REQUIRED, .moe_shared = true},
    {.name = "qwen3moe", .rope = KILN_ROPE_NEOX, .required = NORMS | MATS | B(KILN_ROLE_Q_NORM) | B(KILN_ROLE_K_NORM),
     .optional = 0, .keys = llama_keys, .keys_more = qwen_moe_keys, .yarn = true, .moe = KILN_MOE_REQUIRED, .moe_norm = true},
    {.name = "phi3", .rope = KILN_ROPE_NEOX,
     .required = NORMS | B(KILN_ROLE_WQKV) | B(KILN_ROLE_WO) | B(KILN_ROLE_WGU) | B(KILN_ROLE_WD), .optional = 0,
     .keys = phi3_keys, .longrope = true},
};

const kiln_arch *kiln_arch_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i].name, name) == 0) return &archs[i];
    return NULL;
}

const char *kiln_arch_names(void) { return "llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma, gemma2, gemma3, phi3"; }

bool kiln_arch_layer_windowed(const kiln_arch *a, int l)
{
    return a->swa_pattern <= 0 || l % a->swa_pattern < a->swa_pattern - 1; /* llama.cpp's set_swa_pattern */
}

const kiln_role_info *kiln_arch_roles(void) { return roles; }

const kiln_arch_key *kiln_arch_key_find(const kiln_arch *a, const char *suffix)
{
    for (const kiln_arch_key *t = a->keys; t; t = t == a->keys ? a->keys_more : NULL)
        for (const kiln_arch_key *k = t; k->suffix; k++)
            if (strcmp(k->suffix, suffix) == 0) return k;
    return NULL;
}
