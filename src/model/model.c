/* Models from GGUF files: reads a llama/qwen2 file's metadata, checks every tensor's shape and
 * type, and builds the decoder graph (embedding, the shared layer of layer.c, final norm, output
 * head, argmax) with weights borrowed from the mapping. Must not copy weight data or compile. */
#include "gguf/gguf.h"
#include "model/layer.h"
#include "sched/ctx.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Reads {arch}.<key> as an integer >= 1 into *out; required unless *out already holds a default. */
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

static kiln_status arch_float(const kiln_gguf *f, const char *arch, const char *key, float *out)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    kiln_status s = kiln_gguf_get_f32(f, full, out);
    if (s == KILN_ERR_NAME) return KILN_OK; /* keep the default */
    if (s == KILN_OK && !(isfinite(*out) && *out > 0))
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: metadata '%s' = %g must be positive", f->path, full, *out);
    return s;
}

/* Checks tensor name has dims (rank 1: d0; rank 2: d0 x d1) and a kiln dtype; adds its bytes. */
static kiln_status want_tensor(const kiln_gguf *f, const char *name, int rank, int64_t d0, int64_t d1,
                               kiln_gguf_tensor *t, size_t *total)
{
    kiln_status s = kiln_gguf_tensor_get(f, name, t);
    if (s != KILN_OK) return s;
    if (t->rank != rank || t->dims[0] != d0 || (rank == 2 && t->dims[1] != d1))
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE, "%s: tensor '%s' has dims [%lld%s%lld], expected [%lld%s%lld]",
                             f->path, name, (long long)t->dims[0], t->rank > 1 ? ", " : "",
                             t->rank > 1 ? (long long)t->dims[1] : 0ll, (long long)d0, rank > 1 ? ", " : "",
                             rank > 1 ? (long long)d1 : 0ll);
    if (total) *total += t->bytes;
    return KILN_OK;
}

/* The tensor names of layer l (NULL entries: absent biases). */
static void layer_names(int l, char names[12][64])
{
    static const char *const suffix[12] = {"attn_norm.weight", "attn_q.weight",   "attn_k.weight",  "attn_v.weight",
                                           "attn_q.bias",      "attn_k.bias",     "attn_v.bias",    "attn_output.weight",
                                           "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight",  "ffn_down.weight"};
    for (int i = 0; i < 12; i++) snprintf(names[i], 64, "blk.%d.%s", l, suffix[i]);
}

/* Expected dims of the 12 layer tensors (rank 1 when [1] is 0). */
static void layer_shapes(const kiln_model_info *m, int64_t shapes[12][2])
{
    int64_t qd = m->n_head * m->head_dim, kvd = m->n_kv_head * m->head_dim;
    const int64_t s[12][2] = {{m->hidden, 0}, {qd, m->hidden}, {kvd, m->hidden}, {kvd, m->hidden},
                              {qd, 0},        {kvd, 0},        {kvd, 0},         {m->hidden, qd},
                              {m->hidden, 0}, {m->ffn, m->hidden}, {m->ffn, m->hidden}, {m->hidden, m->ffn}};
    memcpy(shapes, s, sizeof s);
}

/* Features of the file that would change what the graph must compute, which kiln does not build:
 * refusing them beats generating wrong tokens. */
static kiln_status unsupported_features(const kiln_gguf *f, const char *arch)
{
    char key[128];
    const char *v;
    int64_t experts = 0;
    snprintf(key, sizeof key, "%s.expert_count", arch);
    if (kiln_gguf_kv_find(f, key) >= 0 && kiln_gguf_get_i64(f, key, &experts) == KILN_OK && experts > 0)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: '%s' = %lld: mixture-of-experts layers are not supported",
                             f->path, key, (long long)experts);
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (kiln_gguf_kv_find(f, key) >= 0 && (kiln_gguf_get_str(f, key, &v, NULL) != KILN_OK || strcmp(v, "none") != 0))
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: '%s' is set: rotary scaling is not supported", f->path, key);
    float scale = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scale_linear", arch);
    if (kiln_gguf_kv_find(f, key) >= 0 && (kiln_gguf_get_f32(f, key, &scale) != KILN_OK || scale != 1.0f))
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: '%s' is set: rotary scaling is not supported", f->path, key);
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(f, "rope_freqs.weight", &t) != KILN_ERR_NAME)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED,
                             "%s: tensor 'rope_freqs.weight' (rotary frequency factors, llama 3.1 style) is not supported",
                             f->path);
    kiln_ctx_set_error(f->ctx, "%s", "");
    return KILN_OK;
}

static kiln_status read_dims(const kiln_gguf *f, kiln_model_info *m)
{
    const char *arch;
    kiln_status s = kiln_gguf_get_str(f, "general.architecture", &arch, NULL);
    if (s != KILN_OK) return s;
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen2") != 0)
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED, "%s: architecture '%.64s' (kiln builds llama and qwen2)", f->path,
                             arch);
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    int64_t n_layer = 0, n_ctx = 0, rot = 0, key_len = 0;
    if ((s = arch_int(f, arch, "block_count", true, &n_layer)) != KILN_OK ||
        (s = arch_int(f, arch, "embedding_length", true, &m->hidden)) != KILN_OK ||
        (s = arch_int(f, arch, "feed_forward_length", true, &m->ffn)) != KILN_OK ||
        (s = arch_int(f, arch, "attention.head_count", true, &m->n_head)) != KILN_OK ||
        (s = arch_int(f, arch, "context_length", true, &n_ctx)) != KILN_OK)
        return s;
    m->n_layer = (int)n_layer;
    m->n_ctx_train = n_ctx;
    m->n_kv_head = m->n_head;
    m->theta = 10000.0f;
    m->eps = 1e-5f;
    if ((s = arch_int(f, arch, "attention.head_count_kv", false, &m->n_kv_head)) != KILN_OK ||
        (s = arch_int(f, arch, "rope.dimension_count", false, &rot)) != KILN_OK ||
        (s = arch_int(f, arch, "attention.key_length", false, &key_len)) != KILN_OK ||
        (s = arch_float(f, arch, "rope.freq_base", &m->theta)) != KILN_OK ||
        (s = arch_float(f, arch, "attention.layer_norm_rms_epsilon", &m->eps)) != KILN_OK)
        return s;
    if (m->hidden % m->n_head || m->n_head % m->n_kv_head || (m->hidden / m->n_head) % 2)
        return kiln_ctx_fail(f->ctx, KILN_ERR_SHAPE,
                             "%s: embedding_length %lld, head_count %lld, head_count_kv %lld do not give an even head "
                             "size shared by the KV heads", f->path, (long long)m->hidden, (long long)m->n_head,
                             (long long)m->n_kv_head);
    m->head_dim = m->hidden / m->n_head;
    if ((rot && rot != m->head_dim) || (key_len && key_len != m->head_dim))
        return kiln_ctx_fail(f->ctx, KILN_ERR_UNSUPPORTED,
                             "%s: rotary dims %lld / key length %lld differ from the head size %lld (not supported)",
                             f->path, (long long)rot, (long long)key_len, (long long)m->head_dim);
    m->rope = strcmp(arch, "qwen2") == 0 ? KILN_ROPE_NEOX : KILN_ROPE_NORMAL;
    return unsupported_features(f, arch);
}

KILN_API kiln_status kiln_model_info_get(const kiln_gguf *f, kiln_model_info *out)
{
    if (!f || !out) return KILN_ERR_INVALID_ARG;
    kiln_model_info m = {0};
    kiln_status s = read_dims(f, &m);
    if (s != KILN_OK) return s;
    kiln_gguf_tensor t;
    size_t total = 0;
    if ((s = kiln_gguf_tensor_get(f, "token_embd.weight", &t)) != KILN_OK) return s;
    m.n_vocab = t.dims[0];
    if ((s = want_tensor(f, "token_embd.weight", 2, m.n_vocab, m.hidden, &t, &total)) != KILN_OK) return s;
    if ((s = want_tensor(f, "output_norm.weight", 1, m.hidden, 0, &t, &total)) != KILN_OK) return s;
    m.tied_output = kiln_gguf_tensor_get(f, "output.weight", &t) == KILN_ERR_NAME;
    if (!m.tied_output && (s = want_tensor(f, "output.weight", 2, m.n_vocab, m.hidden, &t, &total)) != KILN_OK) return s;
    int64_t shapes[12][2];
    layer_shapes(&m, shapes);
    char names[12][64];
    layer_names(0, names);
    m.qkv_bias = kiln_gguf_tensor_get(f, names[4], &t) != KILN_ERR_NAME;
    for (int l = 0; l < m.n_layer; l++) {
        layer_names(l, names);
        for (int i = 0; i < 12; i++) {
            if (i >= 4 && i <= 6 && !m.qkv_bias) continue;
            if ((s = want_tensor(f, names[i], shapes[i][1] ? 2 : 1, shapes[i][0], shapes[i][1], &t, &total)) != KILN_OK)
                return s;
        }
    }
    m.weight_bytes = total;
    *out = m;
    return KILN_OK;
}

/* A borrowed weight node from tensor name (shape already checked by kiln_model_info_get). */
static kiln_node borrow(kiln_graph *g, const kiln_gguf *f, const char *name)
{
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(f, name, &t) != KILN_OK) return KILN_NODE_NONE;
    kiln_dim dims[KILN_MAX_RANK];
    for (int d = 0; d < t.rank; d++) dims[d] = t.dims[d];
    return kiln_weight(g, name, t.t, t.rank, dims, t.data, KILN_WEIGHT_BORROW);
}

static void build(kiln_graph *g, const kiln_gguf *f, const kiln_model_info *m, const kiln_model_options *o)
{
    kiln_layer_io io = {.n_tok = kiln_sym(g, "n_tok", o->max_tok), .n_kv = kiln_sym(g, "n_kv", o->max_ctx)};
    kiln_layer_dims ld = {.hidden = m->hidden, .n_head = m->n_head, .n_kv_head = m->n_kv_head, .head_dim = m->head_dim,
                          .rope = m->rope, .theta = m->theta, .eps = m->eps, .max_ctx = o->max_ctx, .kvdtype = o->kv_dtype};
    kiln_dim td[1] = {io.n_tok};
    kiln_node ids = kiln_input(g, "ids", KILN_DTYPE_I32, 1, td);
    io.pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, td);
    kiln_node embd = borrow(g, f, "token_embd.weight");
    kiln_node x = kiln_get_rows(g, embd, ids);
    for (int l = 0; l < o->n_layers && kiln_graph_status(g) == KILN_OK; l++) {
        char n[12][64];
        layer_names(l, n);
        kiln_layer_weights w = {.attn_norm = borrow(g, f, n[0]), .wq = borrow(g, f, n[1]), .wk = borrow(g, f, n[2]),
                                .wv = borrow(g, f, n[3]), .bq = KILN_NODE_NONE, .bk = KILN_NODE_NONE, .bv = KILN_NODE_NONE,
                                .wo = borrow(g, f, n[7]), .ffn_norm = borrow(g, f, n[8]), .wg = borrow(g, f, n[9]),
                                .wu = borrow(g, f, n[10]), .wd = borrow(g, f, n[11])};
        if (m->qkv_bias) w.bq = borrow(g, f, n[4]), w.bk = borrow(g, f, n[5]), w.bv = borrow(g, f, n[6]);
        x = kiln_layer_build(g, &ld, &io, &w, l, x);
    }
    if (o->last_only) /* the head reads only the row of token `last` */
        x = kiln_get_rows(g, x, kiln_input(g, "last", KILN_DTYPE_I32, 1, (kiln_dim[]){1}));
    x = kiln_rms_norm(g, x, borrow(g, f, "output_norm.weight"), m->eps);
    kiln_node logits = kiln_matmul(g, x, m->tied_output ? embd : borrow(g, f, "output.weight"));
    kiln_output(g, kiln_argmax(g, logits), "next");
    if (o->logits) kiln_output(g, logits, "logits");
}

KILN_API kiln_status kiln_model_build(const kiln_gguf *f, const kiln_model_options *opts, kiln_graph **out)
{
    if (out) *out = NULL;
    if (!f || !out) return KILN_ERR_INVALID_ARG;
    kiln_model_info m;
    kiln_status s = kiln_model_info_get(f, &m);
    if (s != KILN_OK) return s;
    kiln_model_options o = opts ? *opts : (kiln_model_options){0};
    if (o.max_ctx == 0) o.max_ctx = m.n_ctx_train < 4096 ? m.n_ctx_train : 4096;
    if (o.max_tok == 0) o.max_tok = o.max_ctx < 512 ? o.max_ctx : 512;
    if (o.n_layers == 0) o.n_layers = m.n_layer;
    if (o.max_ctx < 1 || o.max_tok < 1 || o.max_tok > o.max_ctx || o.n_layers < 1 || o.n_layers > m.n_layer ||
        (o.kv_dtype != KILN_DTYPE_F32 && o.kv_dtype != KILN_DTYPE_F16))
        return kiln_ctx_fail(f->ctx, KILN_ERR_INVALID_ARG,
                             "kiln_model_build: options max_ctx %lld, max_tok %lld, n_layers %d (file has %d), kv_dtype "
                             "%s: need 1 <= max_tok <= max_ctx, 1 <= n_layers <= the file's, kv f32 or f16",
                             (long long)o.max_ctx, (long long)o.max_tok, o.n_layers, m.n_layer,
                             kiln_dtype_name(o.kv_dtype));
    kiln_graph *g;
    if ((s = kiln_graph_new(&g)) != KILN_OK) return kiln_ctx_fail(f->ctx, s, "kiln_model_build: out of memory");
    build(g, f, &m, &o);
    if ((s = kiln_graph_status(g)) != KILN_OK) {
        kiln_ctx_set_error(f->ctx, "%s: building the %s graph: %s", f->path, m.arch, kiln_graph_error(g));
        kiln_graph_free(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}
