/* Model presets and the llama-style stack builder (see presets.h). Uses only the public builder
 * API, so the graphs it makes are exactly what a user could write. Must not compile, run, or
 * reach into graph internals. */
#include "model/presets.h"
#include "model/layer.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const kiln_preset presets[] = {
    {.name = "qwen2-0.5b", .hidden = 896, .n_head = 14, .n_kv_head = 2, .head_dim = 64, .ffn = 4864,
     .rope = KILN_ROPE_NEOX, .theta = 1e6f, .eps = 1e-6f, .qkv_bias = true},
    {.name = "llama-7b", .hidden = 4096, .n_head = 32, .n_kv_head = 32, .head_dim = 128, .ffn = 11008,
     .rope = KILN_ROPE_NORMAL, .theta = 1e4f, .eps = 1e-5f},
    {.name = "qwen2-7b", .hidden = 3584, .n_head = 28, .n_kv_head = 4, .head_dim = 128, .ffn = 18944,
     .rope = KILN_ROPE_NEOX, .theta = 1e6f, .eps = 1e-6f, .qkv_bias = true},
};

/* Shapes found by name but not listed by kiln_preset_at (the per-preset sweeps of the tests, PTX
 * assembly and goldens, skip them): llama-2/3 70B's layer (GQA 64 over 8), the shape of issue #24's
 * tensor-parallel measurements (kiln bench --preset llama-70b --gpus 2). */
static const kiln_preset unlisted[] = {
    {.name = "llama-70b", .hidden = 8192, .n_head = 64, .n_kv_head = 8, .head_dim = 128, .ffn = 28672,
     .rope = KILN_ROPE_NORMAL, .theta = 5e5f, .eps = 1e-5f},
};

int kiln_preset_count(void) { return (int)(sizeof presets / sizeof presets[0]); }

const kiln_preset *kiln_preset_at(int i)
{
    return i >= 0 && i < kiln_preset_count() ? &presets[i] : NULL;
}

const kiln_preset *kiln_preset_find(const char *name)
{
    for (int i = 0; name && i < kiln_preset_count(); i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    for (size_t i = 0; name && i < sizeof unlisted / sizeof unlisted[0]; i++)
        if (strcmp(unlisted[i].name, name) == 0)
            return &unlisted[i];
    return NULL;
}

uint64_t kiln_preset_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float kiln_preset_rngf(uint64_t *s)
{
    return (float)((double)(kiln_preset_rng(s) >> 40) * 0x1p-23 - 1.0);
}

kiln_dtype kiln_preset_wdtype_for(kiln_dtype t, int64_t k)
{
    if (k % kiln_dtype_block(t) == 0)
        return t;
    return k % kiln_dtype_block(KILN_DTYPE_Q8_0) == 0 ? KILN_DTYPE_Q8_0 : KILN_DTYPE_F16;
}

/* Matmul shapes of one layer, [out, in] each: q, k, v, o, gate, up, down. */
static void layer_mats(const kiln_preset *p, int64_t mats[7][2])
{
    int64_t qd = p->n_head * p->head_dim, kvd = p->n_kv_head * p->head_dim;
    int64_t m[7][2] = {{qd, p->hidden}, {kvd, p->hidden}, {kvd, p->hidden}, {p->hidden, qd},
                       {p->ffn, p->hidden}, {p->ffn, p->hidden}, {p->hidden, p->ffn}};
    memcpy(mats, m, sizeof m);
}

size_t kiln_preset_layer_weight_bytes(const kiln_preset *p, kiln_dtype wdtype)
{
    int64_t mats[7][2];
    layer_mats(p, mats);
    size_t total = 2 * (size_t)p->hidden * sizeof(float);
    if (p->qkv_bias)
        total += (size_t)(mats[0][0] + 2 * mats[1][0]) * sizeof(float);
    for (int j = 0; j < 7; j++)
        total += (size_t)mats[j][0] * kiln_row_bytes(kiln_preset_wdtype_for(wdtype, mats[j][1]), mats[j][1]);
    return total;
}

size_t kiln_preset_layer_kv_bytes(const kiln_preset *p, kiln_dtype kvdtype, int64_t n_kv)
{
    return 2 * (size_t)p->n_kv_head * (size_t)n_kv * kiln_row_bytes(kvdtype, p->head_dim);
}

double kiln_preset_layer_flops(const kiln_preset *p, int64_t n_tok, int64_t n_kv)
{
    int64_t mats[7][2];
    layer_mats(p, mats);
    double f = 0, rows = 0;
    for (int j = 0; j < 7; j++)
        f += 2.0 * (double)n_tok * (double)mats[j][0] * (double)mats[j][1];
    for (int64_t t = 0; t < n_tok; t++)
        rows += (double)(n_kv - n_tok + t + 1);
    return f + 4.0 * (double)p->n_head * (double)p->head_dim * rows;
}

/* f32 vector offset + u * scale (u uniform in [-1, 1)), reproducible from its seed: norm weights
 * (1 + u/8) and biases (u/2). */
static kiln_node vec_weight(kiln_graph *g, const char *name, int64_t d, uint64_t seed, float offset, float scale)
{
    float *w = malloc((size_t)d * sizeof *w);
    if (!w)
        return KILN_NODE_NONE; /* the next builder call on NONE records the error */
    uint64_t s = seed;
    for (int64_t i = 0; i < d; i++)
        w[i] = offset + kiln_preset_rngf(&s) * scale;
    kiln_dim dims[1] = {d};
    kiln_node n = kiln_weight(g, name, KILN_DTYPE_F32, 1, dims, w, KILN_WEIGHT_COPY);
    free(w);
    return n;
}

/* Shape-only graphs borrow one read-only mapping of zero pages for every matmul weight (never
 * unmapped, costs no memory); NULL when bytes exceed it. */
#define SHAPE_ONLY_BYTES ((size_t)1 << 30)
static void *shape_only_map;
static void map_zeros(void)
{
    void *p = mmap(NULL, SHAPE_ONLY_BYTES, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    shape_only_map = p == MAP_FAILED ? NULL : p;
}
static const void *shape_only_zeros(size_t bytes)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, map_zeros);
    return bytes <= SHAPE_ONLY_BYTES ? shape_only_map : NULL;
}

/* A matmul weight [out, in] for layer l, tensor j. */
static kiln_node mat_weight(kiln_graph *g, const kiln_preset_build_opts *o, int l, int j, const char *tag,
                            int64_t out_dim, int64_t in_dim)
{
    char name[64];
    snprintf(name, sizeof name, "%s%d", tag, l);
    kiln_dim dims[2] = {out_dim, in_dim};
    kiln_dtype t = kiln_preset_wdtype_for(o->wdtype, in_dim);
    const void *zeros = o->shape_only ? shape_only_zeros((size_t)out_dim * kiln_row_bytes(t, in_dim)) : NULL;
    if (zeros) return kiln_weight(g, name, t, 2, dims, zeros, KILN_WEIGHT_BORROW);
    return kiln_weight_random(g, name, kiln_preset_wdtype_for(o->wdtype, in_dim), 2, dims,
                              o->seed + 16u * (uint64_t)l + (uint64_t)j, 1.0f / sqrtf((float)in_dim));
}

/* Layer l's weights: f32 norms near 1 and random matmul weights (seed rule in presets.h). */
static kiln_layer_weights layer_weights(kiln_graph *g, const kiln_preset *p, const kiln_preset_build_opts *o, int l)
{
    char name[64];
    int64_t qd = p->n_head * p->head_dim, kvd = p->n_kv_head * p->head_dim;
    kiln_layer_weights w = {.bq = KILN_NODE_NONE, .bk = KILN_NODE_NONE, .bv = KILN_NODE_NONE};
    snprintf(name, sizeof name, "attn_norm%d", l);
    w.attn_norm = vec_weight(g, name, p->hidden, o->seed + 16u * (uint64_t)l + 7u, 1.0f, 0.125f);
    w.wq = mat_weight(g, o, l, 0, "wq", qd, p->hidden);
    w.wk = mat_weight(g, o, l, 1, "wk", kvd, p->hidden);
    w.wv = mat_weight(g, o, l, 2, "wv", kvd, p->hidden);
    w.wo = mat_weight(g, o, l, 3, "wo", p->hidden, qd);
    snprintf(name, sizeof name, "ffn_norm%d", l);
    w.ffn_norm = vec_weight(g, name, p->hidden, o->seed + 16u * (uint64_t)l + 8u, 1.0f, 0.125f);
    if (p->qkv_bias) {
        kiln_node *b[3] = {&w.bq, &w.bk, &w.bv};
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "b%c%d", "qkv"[j], l);
            *b[j] = vec_weight(g, name, j ? kvd : qd, o->seed + 16u * (uint64_t)l + 9u + (uint64_t)j, 0.0f, 0.5f);
        }
    }
    w.wg = mat_weight(g, o, l, 4, "wg", p->ffn, p->hidden);
    w.wu = mat_weight(g, o, l, 5, "wu", p->ffn, p->hidden);
    w.wd = mat_weight(g, o, l, 6, "wd", p->hidden, p->ffn);
    return w;
}

static bool dims_ok(const kiln_preset *p)
{
    return p->hidden > 0 && p->n_head > 0 && p->n_kv_head > 0 && p->n_head % p->n_kv_head == 0 &&
           p->head_dim > 0 && p->head_dim % 2 == 0 && p->ffn > 0;
}

kiln_status kiln_preset_build_ex(const kiln_preset *p, const kiln_preset_build_opts *o, kiln_graph **out,
                                 char *err, size_t n_err)
{
    if (err && n_err)
        snprintf(err, n_err, "invalid preset dims or build options");
    if (!out)
        return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (!p || !o || !dims_ok(p) || o->n_layers < 1 || o->max_ctx < 1 || o->max_tok < 1 ||
        o->max_tok > o->max_ctx || (unsigned)o->wdtype >= KILN_DTYPE_COUNT || o->wdtype == KILN_DTYPE_I32 ||
        (o->kvdtype != KILN_DTYPE_F32 && o->kvdtype != KILN_DTYPE_F16 &&
         !(o->kvdtype == KILN_DTYPE_Q8_0 && o->block && p->head_dim % 32 == 0)) || /* q8_0: paged pools only */
        (o->block && (o->block < 1 || o->max_ctx % o->block || o->max_seqs < 1 || o->max_blocks < 1)))
        return KILN_ERR_INVALID_ARG;
    kiln_graph *g;
    kiln_status s = kiln_graph_new(&g);
    if (s != KILN_OK)
        return s;
    kiln_layer_io io = {.n_tok = kiln_sym(g, "n_tok", o->max_tok)};
    if (!o->block) io.n_kv = kiln_sym(g, "n_kv", o->max_ctx);
    float mult[4096];
    for (int64_t i = 0; i < p->head_dim / 2 && i < 4096; i++) mult[i] = 1.0f / (float)(1 + i % 7);
    kiln_layer_dims ld = {.hidden = p->hidden, .n_head = p->n_head, .n_kv_head = p->n_kv_head, .head_dim = p->head_dim,
                          .rope = p->rope, .theta = p->theta, .rope_mult = p->rope_mult && p->head_dim <= 8192 ? mult : NULL,
                          .eps = p->eps, .max_ctx = o->max_ctx, .kvdtype = o->kvdtype, .block = o->block};
    kiln_dim xd[2] = {io.n_tok, p->hidden}, pd[1] = {io.n_tok};
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, xd);
    io.pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, pd);
    if (o->block) {
        kiln_dim ns = kiln_sym(g, "n_seq", o->max_seqs);
        io.slots = kiln_input(g, "slots", KILN_DTYPE_I32, 1, pd);
        io.seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){ns, 2});
        io.blocks = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){ns, o->max_blocks});
    }
    for (int l = 0; l < o->n_layers && kiln_graph_status(g) == KILN_OK; l++) {
        kiln_layer_weights w = layer_weights(g, p, o, l);
        x = kiln_layer_build(g, &ld, &io, &w, l, x);
    }
    if (kiln_graph_status(g) == KILN_OK)
        kiln_output(g, x, "y");
    s = kiln_graph_status(g);
    if (err && n_err)
        snprintf(err, n_err, "%s", s == KILN_OK ? "" : kiln_graph_error(g));
    if (s != KILN_OK) {
        kiln_graph_free(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}

kiln_dtype kiln_preset_kv_dtype(kiln_dtype w) { return w == KILN_DTYPE_F32 ? KILN_DTYPE_F32 : KILN_DTYPE_F16; }

kiln_status kiln_preset_build(const kiln_preset *p, kiln_dtype wdtype, int n_layers, int64_t max_ctx,
                              int64_t max_tok, kiln_graph **out)
{
    kiln_preset_build_opts o = {.wdtype = wdtype, .kvdtype = kiln_preset_kv_dtype(wdtype),
                                .n_layers = n_layers, .max_ctx = max_ctx, .max_tok = max_tok, .seed = 1};
    return kiln_preset_build_ex(p, &o, out, NULL, 0);
}
