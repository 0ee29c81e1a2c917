/* Models from GGUF files: builds the decoder graph (embedding [times sqrt(hidden)], the shared layer
 * of layer.c with the architecture's per-layer window, rotary base and soft-cap, final norm, output
 * head [soft-capped], argmax) of a file load.c has checked, with weights borrowed from the mapping
 * (a fused q/k/v or gate/up matrix as row ranges of it, an expert stack as one [E, N, K] weight, or
 * one weight per expert for the dense form).
 * Must not copy weight data or compile, and must not read a tensor load.c did not check. */
#include "graph/graph.h"
#include "model/layer.h"
#include "model/model.h"
#include "sched/ctx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A borrowed weight node from tensor name (shape already checked by kiln_model_info_get). */
static kiln_node borrow(kiln_graph *g, const kiln_gguf *f, const char *name)
{
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(f, name, &t) != KILN_OK) return KILN_NODE_NONE;
    kiln_dim dims[KILN_MAX_RANK];
    for (int d = 0; d < t.rank; d++) dims[d] = t.dims[d];
    return kiln_weight(g, name, t.t, t.rank, dims, t.data, KILN_WEIGHT_BORROW);
}

/* Rows [r0, r0 + rows) of a fused matrix (phi3's attn_qkv, ffn_up) as a borrowed weight of its
 * own: rows are whole blocks in every format, so the range is a byte range of the tensor. */
static kiln_node borrow_rows(kiln_graph *g, const kiln_gguf *f, const char *name, const char *part, int64_t r0,
                             int64_t rows)
{
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(f, name, &t) != KILN_OK) return KILN_NODE_NONE;
    char sub[128];
    snprintf(sub, sizeof sub, "%s.%s", name, part); /* "blk.0.attn_qkv.weight.q" */
    size_t rb = kiln_row_bytes(t.t, t.dims[1]);
    return kiln_weight(g, sub, t.t, 2, (kiln_dim[]){rows, t.dims[1]}, (const char *)t.data + (size_t)r0 * rb,
                       KILN_WEIGHT_BORROW);
}

/* Expert e of a stack [n_expert, rows, cols] as a borrowed [rows, cols] weight of its own ("<name>.<e>"):
 * each expert's matrix is a contiguous byte range of the tensor. */
static kiln_node borrow_expert(kiln_graph *g, const kiln_gguf *f, const char *name, int64_t e)
{
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(f, name, &t) != KILN_OK) return KILN_NODE_NONE;
    char sub[128];
    snprintf(sub, sizeof sub, "%s.%lld", name, (long long)e);
    size_t mb = (size_t)t.dims[1] * kiln_row_bytes(t.t, t.dims[2]);
    return kiln_weight(g, sub, t.t, 2, (kiln_dim[]){t.dims[1], t.dims[2]}, (const char *)t.data + (size_t)e * mb,
                       KILN_WEIGHT_BORROW);
}

/* A [n] tensor as a borrowed [1, n] matrix (qwen2moe's shared-expert gate: one logit per token). */
static kiln_node borrow_row(kiln_graph *g, const kiln_gguf *f, const char *name)
{
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(f, name, &t) != KILN_OK) return KILN_NODE_NONE;
    return kiln_weight(g, name, t.t, 2, (kiln_dim[]){1, t.dims[0]}, t.data, KILN_WEIGHT_BORROW);
}

/* Layer l's weight nodes: every role the file carries (load.c checked them all); fused matrices
 * split into the q/k/v and gate/up weights the shared layer takes (the same graph as separate ones);
 * expert stacks borrowed whole, or with dense into one weight per expert, written into exps (3
 * n_expert nodes: gates, ups, downs). */
static kiln_layer_weights layer_weights(kiln_graph *g, const kiln_gguf *f, const kiln_model_desc *d, int l,
                                        kiln_node *exps, bool dense)
{
    const kiln_role_info *roles = kiln_arch_roles();
    const kiln_model_info *m = &d->info;
    kiln_node n[KILN_ROLE_COUNT] = {0};
    char name[96];
    for (int r = 0; r < KILN_ROLE_COUNT; r++) {
        if (!(d->roles & KILN_ROLE_BIT(r))) continue;
        snprintf(name, sizeof name, "blk.%d.%s", l, roles[r].suffix);
        if (r == KILN_ROLE_WQKV) {
            int64_t qd = m->n_head * m->head_dim, kvd = m->n_kv_head * m->head_dim;
            n[KILN_ROLE_WQ] = borrow_rows(g, f, name, "q", 0, qd);
            n[KILN_ROLE_WK] = borrow_rows(g, f, name, "k", qd, kvd);
            n[KILN_ROLE_WV] = borrow_rows(g, f, name, "v", qd + kvd, kvd);
        } else if (r == KILN_ROLE_WGU) { /* gate rows first: llama.cpp's swiglu of the fused up */
            n[KILN_ROLE_WG] = borrow_rows(g, f, name, "gate", 0, m->ffn);
            n[KILN_ROLE_WU] = borrow_rows(g, f, name, "up", m->ffn, m->ffn);
        } else if (!dense && (r == KILN_ROLE_GATE_EXPS || r == KILN_ROLE_UP_EXPS || r == KILN_ROLE_DOWN_EXPS)) {
            n[r] = borrow(g, f, name); /* [n_expert, rows, cols]: moe_matmul reads the routed ones */
        } else if (r == KILN_ROLE_GATE_EXPS || r == KILN_ROLE_UP_EXPS || r == KILN_ROLE_DOWN_EXPS) {
            kiln_node *out = exps + (r - KILN_ROLE_GATE_EXPS) * m->n_expert;
            for (int64_t e = 0; e < m->n_expert; e++) out[e] = borrow_expert(g, f, name, e);
        } else if (r == KILN_ROLE_GATE_INP_SHEXP) {
            n[r] = borrow_row(g, f, name);
        } else {
            n[r] = borrow(g, f, name);
        }
    }
    return (kiln_layer_weights){
        .attn_norm = n[KILN_ROLE_ATTN_NORM], .wq = n[KILN_ROLE_WQ], .wk = n[KILN_ROLE_WK], .wv = n[KILN_ROLE_WV],
        .bq = n[KILN_ROLE_BQ], .bk = n[KILN_ROLE_BK], .bv = n[KILN_ROLE_BV], .q_norm = n[KILN_ROLE_Q_NORM],
        .k_norm = n[KILN_ROLE_K_NORM], .wo = n[KILN_ROLE_WO],
        .bo = n[KILN_ROLE_BO], .ffn_norm = n[KILN_ROLE_FFN_NORM], .wg = n[KILN_ROLE_WG], .wu = n[KILN_ROLE_WU],
        .wd = n[KILN_ROLE_WD], .bg = n[KILN_ROLE_BG], .bu = n[KILN_ROLE_BU], .bd = n[KILN_ROLE_BD],
        .attn_post_norm = n[KILN_ROLE_ATTN_POST_NORM], .ffn_post_norm = n[KILN_ROLE_FFN_POST_NORM],
        .gate_inp = n[KILN_ROLE_GATE_INP], .gate_stack = n[KILN_ROLE_GATE_EXPS], .up_stack = n[KILN_ROLE_UP_EXPS],
        .down_stack = n[KILN_ROLE_DOWN_EXPS], .gate_exps = exps, .up_exps = exps + m->n_expert,
        .down_exps = exps + 2 * m->n_expert, .gate_inp_shexp = n[KILN_ROLE_GATE_INP_SHEXP],
        .gate_shexp = n[KILN_ROLE_GATE_SHEXP], .up_shexp = n[KILN_ROLE_UP_SHEXP], .down_shexp = n[KILN_ROLE_DOWN_SHEXP]};
}

/* ggml_rope_yarn_corr_dim and _dims, in ggml's float arithmetic (where floor and ceil land decides
 * which pairs are interpolated, so it is computed as llama.cpp computes it): the pairs below dims[0]
 * keep their angle, those above dims[1] take the scaled one, a linear ramp between. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * (float)3.14159265358979323846)) / (2 * logf(base));
}

static void yarn_corr_dims(const kiln_model_info *m, float dims[2])
{
    int n_dims = (int)m->n_rot, n_ctx = (int)m->n_ctx_orig;
    float start = floorf(yarn_corr_dim(n_dims, n_ctx, m->yarn_beta_fast, m->theta));
    float end = ceilf(yarn_corr_dim(n_dims, n_ctx, m->yarn_beta_slow, m->theta));
    dims[0] = fmaxf(0.0f, start);
    dims[1] = fminf((float)(n_dims - 1), end);
}

/* The rotary multipliers of a file (kiln_rope_partial): s / factor[i], as llama.cpp divides each angle
 * by factor[i] and multiplies it by freq_scale s = 1 / rope_scale; factor: rope_freqs, or longrope's
 * long factors when the plan holds more than the original context (max_ctx > n_ctx_orig, llama.cpp's
 * test on n_ctx), else its short ones. yarn: s becomes s (1 - r_i) + r_i with r_i ggml's rope_yarn_ramp
 * of pair i (ext_factor 1), which is rope_yarn's mix of the scaled and unscaled angle, linear in the
 * position. NULL when the file scales nothing; else mult (n_rot / 2 values). */
static const float *rope_mult(const kiln_gguf *f, const kiln_model_info *m, int64_t max_ctx, float *mult)
{
    if (!m->rope_freqs && !m->longrope && m->rope_scale == 1.0f) return NULL;
    float corr[2] = {0, 0};
    if (m->yarn) yarn_corr_dims(m, corr);
    const char *name = m->rope_freqs                 ? "rope_freqs.weight"
                       : !m->longrope                ? NULL
                       : max_ctx > m->n_ctx_orig     ? "rope_factors_long.weight"
                                                     : "rope_factors_short.weight";
    kiln_gguf_tensor t = {0};
    if (name && kiln_gguf_tensor_get(f, name, &t) != KILN_OK) return NULL; /* checked by load.c */
    for (int64_t i = 0; i < m->n_rot / 2; i++) {
        float ff = 1.0f;
        if (name) memcpy(&ff, (const char *)t.data + 4 * i, 4);
        double scaled = 1.0 / (double)m->rope_scale;
        if (m->yarn) {
            float y = ((float)i - corr[0]) / fmaxf(0.001f, corr[1] - corr[0]);
            double ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
            scaled = scaled * (1.0 - ramp) + ramp;
        }
        mult[i] = (float)(scaled / (double)ff);
    }
    return mult;
}

/* llama.cpp's rope mscale (phi3's rope.scaling.attn_factor a): the rotated dims of q and k times a,
 * so their part of each score times a^2. With every dim rotated that is the score scale times a^2
 * (no kernel); with partial rotary, q times a^2 on its rotated dims: the [head_dim] weight returned
 * for the layers' q_mult (KILN_NODE_NONE otherwise). The KV cache holds k unscaled either way. */
static kiln_node rope_attn_factor(kiln_graph *g, const kiln_model_info *m, kiln_layer_dims *ld)
{
    double a2 = (double)m->rope_attn_factor * (double)m->rope_attn_factor;
    if (m->rope_attn_factor == 1.0f) return KILN_NODE_NONE;
    if (m->n_rot == m->head_dim) {
        ld->attn_scale = (float)((double)m->attn_scale * a2);
        return KILN_NODE_NONE;
    }
    float *v = malloc((size_t)m->head_dim * sizeof *v);
    if (!v) return kiln_graph_fail(g, KILN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < m->head_dim; i++) v[i] = i < m->n_rot ? (float)a2 : 1.0f;
    kiln_node w = kiln_weight(g, "rope_attn_factor.q", KILN_DTYPE_F32, 1, (kiln_dim[]){m->head_dim}, v, KILN_WEIGHT_COPY);
    free(v);
    return w;
}

static void build(kiln_graph *g, const kiln_gguf *f, const kiln_model_desc *d, const kiln_model_options *o)
{
    const kiln_model_info *m = &d->info;
    float *mult = malloc((size_t)(m->head_dim / 2 + 1) * sizeof *mult);
    kiln_node *exps = malloc((size_t)(3 * m->n_expert + 1) * sizeof *exps);
    if (!mult || !exps) {
        free(mult), free(exps);
        kiln_graph_fail(g, KILN_ERR_NOMEM, "out of memory");
        return;
    }
    kiln_layer_io io = {.n_tok = kiln_sym(g, "n_tok", o->max_tok), .n_kv = kiln_sym(g, "n_kv", o->max_ctx)};
    kiln_layer_dims ld = {.hidden = m->hidden, .n_head = m->n_head, .n_kv_head = m->n_kv_head, .head_dim = m->head_dim,
                          .rope = m->rope, .n_rot = m->n_rot, .theta = m->theta, .rope_mult = rope_mult(f, m, o->max_ctx, mult),
                          .eps = m->eps, .max_ctx = o->max_ctx, .kvdtype = o->kv_dtype, .attn_scale = m->attn_scale,
                          .softcap = m->attn_softcap, .gelu_gate = m->gelu_gate, .n_expert = m->n_expert,
                          .n_expert_used = (int)m->n_expert_used, .expert_norm = m->expert_norm};
    kiln_node q_mult = rope_attn_factor(g, m, &ld);
    kiln_dim td[1] = {io.n_tok};
    kiln_node ids = kiln_input(g, "ids", KILN_DTYPE_I32, 1, td);
    io.pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, td);
    kiln_node embd = borrow(g, f, "token_embd.weight");
    kiln_node x = kiln_get_rows(g, embd, ids);
    if (m->embd_scale) x = kiln_scale(g, x, sqrtf((float)m->hidden)); /* llama.cpp: sqrtf(n_embd), in f32 */
    for (int l = 0; l < o->n_layers && kiln_graph_status(g) == KILN_OK; l++) {
        kiln_layer_weights w = layer_weights(g, f, d, l, exps, o->moe_dense);
        w.q_mult = q_mult;
        kiln_layer_dims dl = ld;
        if (m->sliding_window && kiln_arch_layer_windowed(d->arch, l)) {
            dl.window = m->sliding_window;
            if (m->swa_theta > 0) dl.theta = m->swa_theta; /* gemma's local layers */
            if (d->arch->swa_unscaled) dl.rope_mult = NULL;
        }
        x = kiln_layer_build(g, &dl, &io, &w, l, x);
    }
    if (o->last_only) /* the head reads only the row of token `last` */
        x = kiln_get_rows(g, x, kiln_input(g, "last", KILN_DTYPE_I32, 1, (kiln_dim[]){1}));
    x = kiln_rms_norm(g, x, borrow(g, f, "output_norm.weight"), m->eps);
    kiln_node logits = kiln_matmul(g, x, m->tied_output ? embd : borrow(g, f, "output.weight"));
    if (m->final_softcap > 0) /* llama.cpp's order: scale by 1/cap, tanh, scale by cap */
        logits = kiln_scale(g, kiln_tanh(g, kiln_scale(g, logits, 1.0f / m->final_softcap)), m->final_softcap);
    kiln_output(g, kiln_argmax(g, logits), "next");
    if (o->logits) kiln_output(g, logits, "logits");
    free(mult);
    free(exps);
}

KILN_API kiln_status kiln_model_build(const kiln_gguf *f, const kiln_model_options *opts, kiln_graph **out)
{
    if (out) *out = NULL;
    if (!f || !out) return KILN_ERR_INVALID_ARG;
    kiln_model_desc d;
    kiln_status s = kiln_model_desc_read(f, &d);
    if (s != KILN_OK) return s;
    const kiln_model_info m = d.info;
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
    build(g, f, &d, &o);
    if ((s = kiln_graph_status(g)) != KILN_OK) {
        kiln_ctx_set_error(f->ctx, "%s: building the %s graph: %s", f->path, m.arch, kiln_graph_error(g));
        kiln_graph_free(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}
