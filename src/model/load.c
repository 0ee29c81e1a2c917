/* The GGUF model loader's checks: every metadata key under "<arch>." is honoured or refused, every
 * tensor the architecture needs is there with its shape and a kiln dtype, and every tensor of the
 * file is used by the graph (a file kiln would run approximately is refused, naming the key or
 * tensor). Reads the parsed file only; must not build graphs or touch weight bytes. */
#include "model/model.h"
#include "sched/ctx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads {arch}.<key> as an integer in [1, 2^31] into *out; required unless *out holds a default. */
static kiln_status arch_int(const kiln_gguf *f, const char *arch, const char *key, bool required, int64_t *out)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int64_t v;
    kiln_status s = kiln_gguf_get_i64(f, full, &v);
    if (s == KILN_ERR_NAME && !required) return KILN_OK;
    if (s != KILN_OK) return s;
    if (v < 1 || v > (1ll << 31))
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s' = %lld is out of range", f->path, full, (long long)v);
    *out = v;
    return KILN_OK;
}

/* Reads {arch}.<key> as a positive finite float; required unless *out holds a default. */
static kiln_status arch_float(const kiln_gguf *f, const char *arch, const char *key, bool required, float *out)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    kiln_status s = kiln_gguf_get_f32(f, full, out);
    if (s == KILN_ERR_NAME && required)
        return kiln_ctx_fail(f->ctx, KILN_ERR_NAME, "%s: no metadata key '%s' (llama.cpp refuses such a file too)",
                             f->path, full);
    if (s == KILN_ERR_NAME) return KILN_OK; /* keep the default */
    if (s == KILN_OK && !(isfinite(*out) && *out > 0))
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s' = %g must be positive", f->path, full, *out);
    return s;
}

/* The value of a numeric or bool scalar key as a double; false for strings and arrays. */
static bool key_number(const kiln_gguf *f, const char *key, double *v)
{
    int64_t i;
    uint64_t u;
    bool b;
    if (kiln_gguf_get_f64(f, key, v) == KILN_OK) return true;
    if (kiln_gguf_get_i64(f, key, &i) == KILN_OK) return *v = (double)i, true;
    if (kiln_gguf_get_u64(f, key, &u) == KILN_OK) return *v = (double)u, true;
    if (kiln_gguf_get_bool(f, key, &b) == KILN_OK) return *v = b, true;
    return false;
}

/* One metadata key: "<arch>." keys must be in the architecture's table (NEUTRAL ones at their
 * neutral value); general/tokenizer/quantize keys do not change the arithmetic; anything else is
 * refused, since kiln cannot tell what it would change. */
static kiln_status check_key(const kiln_gguf *f, const kiln_arch *a, const char *key)
{
    size_t al = strlen(a->name);
    /* split.*: how the file is cut into parts, which kiln_gguf_open joined and checked */
    if (strncmp(key, "general.", 8) == 0 || strncmp(key, "tokenizer.", 10) == 0 || strncmp(key, "quantize.", 9) == 0 ||
        strncmp(key, "split.", 6) == 0)
        return KILN_OK;
    const kiln_arch_key *k = strncmp(key, a->name, al) == 0 && key[al] == '.' ? kiln_arch_key_find(a, key + al + 1) : NULL;
    if (!k)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata key '%s' is not one kiln's %s loader knows; "
                             "it may change what the model computes, so the file is refused", f->path, key, a->name);
    double v;
    if (k->use != KILN_KEY_NEUTRAL) return KILN_OK;
    if (!key_number(f, key, &v))
        return kiln_ctx_fail(f->ctx, KILN_ERR_DTYPE, "%s: metadata '%s' is not a number", f->path, key);
    if (v != k->neutral)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata '%s' = %g turns on a feature kiln does not "
                             "build (only %g is accepted)", f->path, key, v, k->neutral);
    return KILN_OK;
}

/* Rotary scaling: type absent (llama.cpp reads that as linear), "none", "linear" or "yarn" (where the
 * architecture builds it: a->yarn); the factor (rope.scaling.factor, else rope.scale_linear; 0:
 * unset) divides every angle (llama.cpp's freq_scale = 1 / factor), and yarn mixes it per pair with
 * the unscaled angle (read_yarn). Other types (longrope as a type) are refused by name. */
static kiln_status read_rope_scaling(const kiln_gguf *f, const kiln_arch *a, float *scale, bool *yarn)
{
    char key[128];
    const char *type = "linear", *arch = a->name;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (kiln_gguf_kv_find(f, key) >= 0 && kiln_gguf_get_str(f, key, &type, NULL) != KILN_OK) return KILN_ERR_DTYPE;
    *yarn = strcmp(type, "yarn") == 0;
    if (*yarn && !a->yarn)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata '%s' = 'yarn': yarn rotary scaling is built for "
                             "llama, qwen2 and qwen3, not for %s (whose layers rotate otherwise)", f->path, key, arch);
    if (strcmp(type, "none") != 0 && strcmp(type, "linear") != 0 && !*yarn)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata '%s' = '%.32s': rotary scaling of that type "
                             "is not supported (kiln builds none, linear, yarn, and llama 3's rope_freqs tensor)",
                             f->path, key, type);
    if (strcmp(type, "none") == 0) return KILN_OK; /* llama.cpp ignores the factor then */
    const char *names[2] = {"rope.scaling.factor", "rope.scale_linear"};
    for (int i = 0; i < 2; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, names[i]);
        float factor = 0;
        if (kiln_gguf_kv_find(f, key) < 0) continue;
        kiln_status s = kiln_gguf_get_f32(f, key, &factor);
        if (s != KILN_OK) return s;
        if (factor != 0 && !(isfinite(factor) && factor > 0))
            return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s' = %g: a rotary scaling factor must "
                                 "be positive", f->path, key, factor);
        *scale = factor != 0 ? factor : 1;
        return KILN_OK; /* the first key found wins, as in llama.cpp */
    }
    return KILN_OK;
}

/* {arch}.attention.sliding_window: a query sees the keys less than this many positions back
 * (llama.cpp's standard window); 0 or absent: no window. */
static kiln_status read_window(const kiln_gguf *f, const char *arch, int64_t *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    double v = 0;
    if (kiln_gguf_kv_find(f, key) >= 0 && !key_number(f, key, &v))
        return kiln_ctx_fail(f->ctx, KILN_ERR_DTYPE, "%s: metadata '%s' is not a number", f->path, key);
    if (!(v >= 0 && v <= (double)(1ll << 31)) || v != (double)(int64_t)v)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s' = %g is not a window length", f->path, key, v);
    *out = (int64_t)v;
    return KILN_OK;
}

/* {arch}.<key>, a soft-cap: absent gives dflt; present it must be finite and > 0 (a file asking for
 * "no cap" leaves the key out). */
static kiln_status read_cap(const kiln_gguf *f, const char *arch, const char *key, float dflt, float *out)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    *out = dflt;
    if (kiln_gguf_kv_find(f, full) < 0) return KILN_OK;
    kiln_status s = kiln_gguf_get_f32(f, full, out);
    if (s != KILN_OK) return s;
    if (!(isfinite(*out) && *out > 0))
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s' = %g: a soft-cap must be finite and > 0",
                             f->path, full, *out);
    return KILN_OK;
}

/* What the architecture's table row decides beyond the sizes: soft-caps, the window's layers and
 * rotary base, the score scale, embedding scale, post-norms, gate activation (see kiln_model_info). */
static kiln_status read_arch_math(const kiln_gguf *f, const kiln_arch *a, kiln_model_info *m)
{
    kiln_status s;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window", a->name);
    if (kiln_gguf_kv_find(f, key) < 0) m->sliding_window = a->window_default;
    if ((s = read_cap(f, a->name, "attn_logit_softcapping", a->attn_softcap_default, &m->attn_softcap)) != KILN_OK ||
        (s = read_cap(f, a->name, "final_logit_softcapping", a->final_softcap_default, &m->final_softcap)) != KILN_OK)
        return s;
    /* llama.cpp applies a softcapping key only where the architecture reads it (gemma's table):
     * elsewhere the key is NEUTRAL at 0 and check_key refused any other value */
    m->swa_pattern = a->swa_pattern;
    /* llama.cpp: gemma 2's window layers rotate as its global ones (base and scale of the file), gemma 3's
     * with base 10000 unscaled; rope.freq_base_swa (recent converters write it for gemma 3) sets the base */
    m->swa_theta = a->swa_theta;
    if ((s = arch_float(f, a->name, "rope.freq_base_swa", false, &m->swa_theta)) != KILN_OK) return s;
    if (!m->sliding_window) m->swa_theta = 0.0f;
    bool wide = m->n_layer == a->wide_scale_layers[0] || m->n_layer == a->wide_scale_layers[1];
    if (wide && a->wide_scale_layers[0] && m->hidden % m->n_head)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: embedding_length %lld is not a multiple of head_count %lld",
                             f->path, (long long)m->hidden, (long long)m->n_head);
    m->attn_scale = 1.0f / sqrtf((float)(wide && a->wide_scale_layers[0] ? m->hidden / m->n_head : m->head_dim));
    m->embd_scale = a->embd_scale;
    m->gelu_gate = a->gate == KILN_GATE_GELU;
    m->post_norms = a->required & KILN_ROLE_BIT(KILN_ROLE_ATTN_POST_NORM);
    m->fused_qkv = a->required & KILN_ROLE_BIT(KILN_ROLE_WQKV);
    m->rope_attn_factor = 1.0f;
    m->n_ctx_orig = m->n_ctx_train;
    /* llama.cpp reads both for every architecture; where a table has them NEUTRAL (gemma) check_key
     * let only 1 / nothing through */
    if ((s = arch_float(f, a->name, "rope.scaling.attn_factor", false, &m->rope_attn_factor)) != KILN_OK ||
        (s = arch_int(f, a->name, "rope.scaling.original_context_length", false, &m->n_ctx_orig)) != KILN_OK)
        return s;
    if (!(isfinite(m->rope_attn_factor) && m->rope_attn_factor > 0) || m->n_ctx_orig < 1)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s.rope.scaling.attn_factor' = %g, "
                             "'%s.rope.scaling.original_context_length' = %lld: need a finite factor > 0 and a "
                             "context of at least 1", f->path, a->name, m->rope_attn_factor, a->name,
                             (long long)m->n_ctx_orig);
    if (m->yarn) { /* llama.cpp's defaults (these architectures read no beta key) and its total mscale */
        m->yarn_beta_fast = 32.0f, m->yarn_beta_slow = 1.0f;
        if (m->rope_scale > 1.0f) m->rope_attn_factor *= 1.0f + 0.1f * logf(m->rope_scale);
    }
    return KILN_OK;
}

/* Mixture of experts ({arch}.expert_count > 0; llama.cpp's build_moe_ffn): expert_count experts,
 * expert_used_count of them routed per token, each expert's width (expert_feed_forward_length where
 * the architecture reads it, else llama.cpp's default: ffn for llama, ffn / expert_used_count for the
 * qwen MoE files) and the shared expert's (qwen2moe: expert_shared_feed_forward_length, default ffn). */
static kiln_status read_moe(const kiln_gguf *f, const kiln_arch *a, kiln_model_info *m)
{
    char key[128];
    double v = 0;
    snprintf(key, sizeof key, "%s.expert_count", a->name);
    if (kiln_gguf_kv_find(f, key) >= 0 && !key_number(f, key, &v))
        return kiln_ctx_fail(f->ctx, KILN_ERR_DTYPE, "%s: metadata '%s' is not a number", f->path, key);
    if (v != 0 && a->moe == KILN_MOE_NONE)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata '%s' = %g: %s builds no mixture of experts "
                             "(llama.cpp's %s graph has none), so the file is refused", f->path, key, v, a->name, a->name);
    if (v == 0 && a->moe != KILN_MOE_REQUIRED) return KILN_OK;
    kiln_status s;
    snprintf(key, sizeof key, "%s.expert_used_count", a->name);
    if (v == 0 || kiln_gguf_kv_find(f, key) < 0)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata '%s.expert_count' = %g: a mixture-of-experts "
                             "model needs expert_count > 0 and '%s' (llama.cpp refuses such a file too)", f->path,
                             a->name, v, key);
    if ((s = arch_int(f, a->name, "expert_count", true, &m->n_expert)) != KILN_OK ||
        (s = arch_int(f, a->name, "expert_used_count", true, &m->n_expert_used)) != KILN_OK)
        return s;
    if (m->n_expert_used > m->n_expert || m->n_expert > 4096)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s.expert_used_count' = %lld of %lld experts: need "
                             "1 <= used <= expert_count <= 4096", f->path, a->name, (long long)m->n_expert_used,
                             (long long)m->n_expert);
    m->ffn_exp = a->moe == KILN_MOE_OPTIONAL ? m->ffn : m->ffn / m->n_expert_used;
    if (a->moe == KILN_MOE_REQUIRED &&
        (s = arch_int(f, a->name, "expert_feed_forward_length", false, &m->ffn_exp)) != KILN_OK)
        return s;
    m->ffn_shexp = a->moe_shared ? m->ffn : 0;
    if (a->moe_shared && (s = arch_int(f, a->name, "expert_shared_feed_forward_length", false, &m->ffn_shexp)) != KILN_OK)
        return s;
    if (m->ffn_exp < 1)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: an expert's feed-forward width is 0", f->path);
    m->expert_norm = a->moe_norm;
    return KILN_OK;
}

/* Sizes from the metadata into m (see kiln_model_info). */
static kiln_status read_dims(const kiln_gguf *f, const kiln_arch *a, kiln_model_info *m)
{
    const char *arch = a->name;
    int64_t n_layer = 0, n_ctx = 0, rot = 0, key_len = 0, val_len = 0;
    kiln_status s;
    if ((s = arch_int(f, arch, "block_count", true, &n_layer)) != KILN_OK ||
        (s = arch_int(f, arch, "embedding_length", true, &m->hidden)) != KILN_OK ||
        (s = arch_int(f, arch, "feed_forward_length", true, &m->ffn)) != KILN_OK ||
        (s = arch_int(f, arch, "attention.head_count", true, &m->n_head)) != KILN_OK ||
        (s = arch_int(f, arch, "context_length", true, &n_ctx)) != KILN_OK ||
        (s = arch_float(f, arch, "attention.layer_norm_rms_epsilon", true, &m->eps)) != KILN_OK)
        return s;
    m->n_layer = (int)n_layer;
    m->n_ctx_train = n_ctx;
    m->n_kv_head = m->n_head;
    m->theta = 10000.0f;
    m->rope_scale = 1.0f;
    if ((s = arch_int(f, arch, "attention.head_count_kv", false, &m->n_kv_head)) != KILN_OK ||
        (s = arch_int(f, arch, "rope.dimension_count", false, &rot)) != KILN_OK ||
        (s = arch_int(f, arch, "attention.key_length", false, &key_len)) != KILN_OK ||
        (s = arch_int(f, arch, "attention.value_length", false, &val_len)) != KILN_OK ||
        (s = arch_float(f, arch, "rope.freq_base", false, &m->theta)) != KILN_OK ||
        (s = read_rope_scaling(f, a, &m->rope_scale, &m->yarn)) != KILN_OK ||
        (s = read_window(f, arch, &m->sliding_window)) != KILN_OK)
        return s;
    m->head_dim = key_len ? key_len : m->hidden / m->n_head;
    if ((!key_len && m->hidden % m->n_head) || m->n_head % m->n_kv_head || m->head_dim % 2)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE,
                             "%s: embedding_length %lld, head_count %lld, head_count_kv %lld, key_length %lld do not "
                             "give an even head size shared by the KV heads", f->path, (long long)m->hidden,
                             (long long)m->n_head, (long long)m->n_kv_head, (long long)key_len);
    if (val_len && val_len != m->head_dim)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED,
                             "%s: value length %lld differs from the head size %lld (not supported)", f->path,
                             (long long)val_len, (long long)m->head_dim);
    /* partial rotary (Phi-4-mini: 96 of 128): the first rot dims of each head turn, the rest pass */
    if (rot && (rot % 2 || rot > m->head_dim))
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata '%s.rope.dimension_count' = %lld: rotary "
                             "dims must be even and at most the head size %lld", f->path, arch, (long long)rot,
                             (long long)m->head_dim);
    m->n_rot = rot ? rot : m->head_dim;
    m->rope = a->rope;
    if ((s = read_moe(f, a, m)) != KILN_OK) return s;
    return read_arch_math(f, a, m);
}

/* Tensor bookkeeping while checking: which of the file's tensors the graph reads. */
typedef struct tensor_use {
    const kiln_gguf *f;     /* file */
    bool            *used;  /* [tensor count] */
    size_t           bytes; /* of the used tensors */
} tensor_use;

/* "[a]", "[a, b]", "[a, b, c]" for messages. */
static void dims_text(char *buf, size_t n, int rank, const int64_t *d)
{
    int k = snprintf(buf, n, "[");
    for (int i = 0; i < rank && k > 0 && (size_t)k < n; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "]");
}

/* Checks tensor name has dims (rank 1: d0; rank 2: d0 x d1; rank 3: d0 x d1 x d2) and a kiln dtype;
 * marks it used. */
static kiln_status want_tensor3(tensor_use *u, const char *name, int rank, int64_t d0, int64_t d1, int64_t d2)
{
    const kiln_gguf *f = u->f;
    kiln_gguf_tensor t;
    kiln_status s = kiln_gguf_tensor_get(f, name, &t);
    if (s != KILN_OK) return s;
    const int64_t want_d[3] = {d0, d1, d2};
    bool ok = t.rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t.dims[i] == want_d[i];
    if (!ok) {
        char have[80] = "", want[80] = "";
        dims_text(have, sizeof have, t.rank < 3 ? t.rank : 3, t.dims);
        dims_text(want, sizeof want, rank, want_d);
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: tensor '%s' has dims %s, expected %s", f->path, name, have,
                             want);
    }
    int64_t i = kiln_gguf_tensor_index(f, name);
    if (!u->used[i]) u->bytes += t.bytes;
    u->used[i] = true;
    return KILN_OK;
}

static kiln_status want_tensor(tensor_use *u, const char *name, int rank, int64_t d0, int64_t d1)
{
    return want_tensor3(u, name, rank, d0, d1, 0);
}

static int64_t size_of(const kiln_model_info *m, kiln_size z)
{
    switch (z) {
    case KILN_SIZE_HIDDEN: return m->hidden;
    case KILN_SIZE_QD: return m->n_head * m->head_dim;
    case KILN_SIZE_KVD: return m->n_kv_head * m->head_dim;
    case KILN_SIZE_FFN: return m->ffn;
    case KILN_SIZE_HEAD: return m->head_dim;
    case KILN_SIZE_QKV: return (m->n_head + 2 * m->n_kv_head) * m->head_dim;
    case KILN_SIZE_FFN2: return 2 * m->ffn;
    case KILN_SIZE_EXPERTS: return m->n_expert;
    case KILN_SIZE_FFN_EXP: return m->ffn_exp;
    case KILN_SIZE_FFN_SHEXP: return m->ffn_shexp;
    default: return 0;
    }
}

static bool has_tensor(const kiln_gguf *f, const char *name) { return kiln_gguf_tensor_index(f, name) >= 0; }

#define FFN_DENSE (KILN_ROLE_BIT(KILN_ROLE_WG) | KILN_ROLE_BIT(KILN_ROLE_WU) | KILN_ROLE_BIT(KILN_ROLE_WD))
#define FFN_BIAS (KILN_ROLE_BIT(KILN_ROLE_BG) | KILN_ROLE_BIT(KILN_ROLE_BU) | KILN_ROLE_BIT(KILN_ROLE_BD))
#define FFN_EXPERTS (KILN_ROLE_BIT(KILN_ROLE_GATE_INP) | KILN_ROLE_BIT(KILN_ROLE_GATE_EXPS) | \
                     KILN_ROLE_BIT(KILN_ROLE_UP_EXPS) | KILN_ROLE_BIT(KILN_ROLE_DOWN_EXPS))
#define FFN_SHARED (KILN_ROLE_BIT(KILN_ROLE_GATE_INP_SHEXP) | KILN_ROLE_BIT(KILN_ROLE_GATE_SHEXP) | \
                    KILN_ROLE_BIT(KILN_ROLE_UP_SHEXP) | KILN_ROLE_BIT(KILN_ROLE_DOWN_SHEXP))

/* Every layer's tensors: the required roles, and the optional ones blk.0 carries (then every layer
 * must carry them). A mixture-of-experts file (n_expert > 0) has the router and the expert stacks
 * (and the shared expert where the architecture has one) in place of the dense gate/up/down, and
 * no feed-forward biases (llama.cpp's MoE layers read none). */
static kiln_status check_layers(tensor_use *u, kiln_model_desc *d)
{
    const kiln_role_info *roles = kiln_arch_roles();
    const kiln_model_info *m = &d->info;
    char name[96];
    uint32_t required = d->arch->required, optional = d->arch->optional;
    if (m->n_expert > 0) {
        required = (required & ~FFN_DENSE) | FFN_EXPERTS | (d->arch->moe_shared ? FFN_SHARED : 0);
        optional &= ~FFN_BIAS;
        if (!has_tensor(u->f, "blk.0.ffn_gate_inp.weight"))
            return kiln_ctx_fail(u->f->ctx, KILN_ERR_UNSUPPORTED, "%s: metadata '%s.expert_count' = %lld: a "
                                 "mixture-of-experts model, but blk.0 has no router (ffn_gate_inp.weight) and expert "
                                 "stacks (ffn_*_exps.weight)", u->f->path, d->arch->name, (long long)m->n_expert);
        if (!has_tensor(u->f, "blk.0.ffn_gate_exps.weight") && has_tensor(u->f, "blk.0.ffn_gate.0.weight"))
            return kiln_ctx_fail(u->f->ctx, KILN_ERR_UNSUPPORTED, "%s: tensor 'blk.0.ffn_gate.0.weight': one tensor per "
                                 "expert, the layout of GGUF files converted before llama.cpp stacked each layer's "
                                 "experts into ffn_{gate,up,down}_exps.weight (2024); kiln reads the stacks: convert the "
                                 "model again with a current llama.cpp", u->f->path);
    }
    d->roles = required;
    for (int r = 0; r < KILN_ROLE_COUNT; r++) {
        snprintf(name, sizeof name, "blk.0.%s", roles[r].suffix);
        if ((optional & KILN_ROLE_BIT(r)) && has_tensor(u->f, name)) d->roles |= KILN_ROLE_BIT(r);
    }
    for (int l = 0; l < m->n_layer; l++)
        for (int r = 0; r < KILN_ROLE_COUNT; r++) {
            if (!(d->roles & KILN_ROLE_BIT(r))) continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, roles[r].suffix);
            int64_t d0 = size_of(m, roles[r].dims[0]), d1 = size_of(m, roles[r].dims[1]),
                    d2 = size_of(m, roles[r].dims[2]);
            kiln_status s = want_tensor3(u, name, d2 ? 3 : d1 ? 2 : 1, d0, d1, d2);
            if (s != KILN_OK) return s;
        }
    return KILN_OK;
}

/* The first tensor of the file the graph would not read is an error naming it. */
static kiln_status check_all_used(const tensor_use *u, const kiln_arch *a)
{
    for (int64_t i = 0; i < kiln_gguf_tensor_count(u->f); i++) {
        kiln_gguf_tensor t;
        if (u->used[i] || kiln_gguf_tensor_at(u->f, i, &t) != KILN_OK) continue;
        return kiln_ctx_fail(u->f->ctx, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' is not used by kiln's %s graph; running "
                             "without it would compute something else, so the file is refused", u->f->path, t.name,
                             a->name);
    }
    return KILN_OK;
}

/* A rotary factor tensor (one factor per rotated pair, shared by every layer; pair i's angle is
 * divided by it): f32 [n_rot / 2], each finite and > 0. */
static kiln_status check_factors(tensor_use *u, const kiln_model_info *m, const char *name)
{
    const kiln_gguf *f = u->f;
    kiln_status s = want_tensor(u, name, 1, m->n_rot / 2, 0);
    if (s != KILN_OK) return s;
    kiln_gguf_tensor t;
    kiln_gguf_tensor_get(f, name, &t);
    if (t.t != KILN_DTYPE_F32)
        return kiln_ctx_fail(f->ctx, KILN_ERR_DTYPE, "%s: tensor '%s' is %s; it must be f32", f->path, name,
                             kiln_dtype_name(t.t));
    for (int64_t i = 0; i < m->n_rot / 2; i++) {
        float v;
        memcpy(&v, (const char *)t.data + 4 * i, 4);
        if (!(isfinite(v) && v > 0))
            return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: tensor '%s' value %lld is %g; rotary frequency factors "
                                 "must be finite and > 0", f->path, name, (long long)i, v);
    }
    return KILN_OK;
}

/* rope_freqs.weight (llama 3.1+: the converter's llama3 rotary scaling), or longrope's
 * rope_factors_long/short.weight (phi3 128k files; both or neither, and never with rope_freqs). */
static kiln_status check_rope_factors(tensor_use *u, const kiln_arch *a, kiln_model_info *m)
{
    const kiln_gguf *f = u->f;
    static const char *const lr[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    bool has[2] = {has_tensor(f, lr[0]), has_tensor(f, lr[1])};
    kiln_status s;
    if (has_tensor(f, "rope_freqs.weight")) {
        if ((s = check_factors(u, m, "rope_freqs.weight")) != KILN_OK) return s;
        m->rope_freqs = true;
    }
    if (!has[0] && !has[1]) return KILN_OK;
    const char *name = lr[has[0] ? 0 : 1];
    if (!a->longrope)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: tensor '%s': longrope rotary scaling is read for phi3 "
                             "only (as in llama.cpp), not for %s", f->path, name, a->name);
    if (has[0] != has[1] || m->rope_freqs)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' %s: longrope needs both factor tensors and "
                             "no rope_freqs.weight", f->path, name, m->rope_freqs ? "beside rope_freqs.weight" : "alone");
    if ((s = check_factors(u, m, lr[0])) != KILN_OK || (s = check_factors(u, m, lr[1])) != KILN_OK) return s;
    m->longrope = true;
    return KILN_OK;
}

static kiln_status check_tensors(tensor_use *u, kiln_model_desc *d)
{
    const kiln_gguf *f = u->f;
    kiln_model_info *m = &d->info;
    kiln_gguf_tensor t;
    kiln_status s;
    if ((s = check_rope_factors(u, d->arch, m)) != KILN_OK) return s;
    if ((s = kiln_gguf_tensor_get(f, "token_embd.weight", &t)) != KILN_OK) return s;
    m->n_vocab = t.dims[0];
    int64_t vocab = 0;
    if ((s = arch_int(f, d->arch->name, "vocab_size", false, &vocab)) != KILN_OK) return s;
    if (vocab && vocab != m->n_vocab)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s.vocab_size' = %lld but token_embd.weight has "
                             "%lld rows", f->path, d->arch->name, (long long)vocab, (long long)m->n_vocab);
    if ((s = want_tensor(u, "token_embd.weight", 2, m->n_vocab, m->hidden)) != KILN_OK ||
        (s = want_tensor(u, "output_norm.weight", 1, m->hidden, 0)) != KILN_OK)
        return s;
    m->tied_output = d->arch->tied_head || !has_tensor(f, "output.weight");
    if (!m->tied_output && (s = want_tensor(u, "output.weight", 2, m->n_vocab, m->hidden)) != KILN_OK) return s;
    if ((s = check_layers(u, d)) != KILN_OK) return s;
    m->qkv_bias = d->roles & KILN_ROLE_BIT(KILN_ROLE_BQ);
    m->out_bias = d->roles & KILN_ROLE_BIT(KILN_ROLE_BO);
    m->ffn_bias = d->roles & (KILN_ROLE_BIT(KILN_ROLE_BG) | KILN_ROLE_BIT(KILN_ROLE_BU) | KILN_ROLE_BIT(KILN_ROLE_BD));
    m->qk_norm = d->roles & KILN_ROLE_BIT(KILN_ROLE_Q_NORM);
    m->weight_bytes = u->bytes;
    return check_all_used(u, d->arch);
}

kiln_status kiln_model_desc_read(const kiln_gguf *f, kiln_model_desc *out)
{
    kiln_model_desc d = {0};
    const char *arch;
    kiln_status s = kiln_gguf_get_str(f, "general.architecture", &arch, NULL);
    if (s != KILN_OK) return s;
    size_t al = strlen(arch);
    if (!(d.arch = kiln_arch_find(arch)))
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: architecture '%.64s'%s (kiln builds %s)", f->path, arch,
                             al > 3 && strcmp(arch + al - 3, "moe") == 0 /* phimoe, ... */
                                 ? ": a mixture-of-experts architecture kiln does not build (of those it builds "
                                   "qwen2moe, qwen3moe and llama with experts)" : "",
                             kiln_arch_names());
    snprintf(d.info.arch, sizeof d.info.arch, "%s", arch);
    for (int64_t i = 0; i < kiln_gguf_kv_count(f); i++)
        if ((s = check_key(f, d.arch, kiln_gguf_kv_key(f, i))) != KILN_OK) return s;
    if ((s = read_dims(f, d.arch, &d.info)) != KILN_OK) return s;
    tensor_use u = {.f = f, .used = calloc((size_t)kiln_gguf_tensor_count(f) + 1, sizeof(bool))};
    if (!u.used) return kiln_ctx_fail(f->ctx, KILN_ERR_NOMEM, "%s: out of memory", f->path);
    s = check_tensors(&u, &d);
    free(u.used);
    if (s != KILN_OK) return s;
    kiln_ctx_set_error(f->ctx, "%s", "");
    *out = d;
    return KILN_OK;
}

KILN_API kiln_status kiln_model_info_get(const kiln_gguf *f, kiln_model_info *out)
{
    if (!f || !out) return KILN_ERR_INVALID_ARG;
    kiln_model_desc d;
    kiln_status s = kiln_model_desc_read(f, &d);
    if (s == KILN_OK) *out = d.info;
    return s;
}
