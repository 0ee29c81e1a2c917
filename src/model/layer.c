/* The shared llama-style decoder layer (see layer.h). The op order matters to fusion: q/k/v read
 * the same rms_norm (one kernel with biases, rope and KV writes as epilogues), gate/up likewise
 * with swiglu, and the residual adds follow their matmuls. Must not create weights. */
#include "model/layer.h"

#include <stdio.h>

static kiln_node add_bias(kiln_graph *g, kiln_node y, kiln_node b)
{
    return b == KILN_NODE_NONE ? y : kiln_add(g, y, b);
}

static kiln_node attn_half(kiln_graph *g, const kiln_layer_dims *d, const kiln_layer_io *io,
                           const kiln_layer_weights *w, int l, kiln_node x)
{
    kiln_node h = kiln_rms_norm(g, x, w->attn_norm, d->eps);
    int64_t qd = d->n_head * d->head_dim;
    kiln_node q = add_bias(g, kiln_matmul(g, h, w->wq), w->bq);
    kiln_node k = add_bias(g, kiln_matmul(g, h, w->wk), w->bk);
    kiln_node v = add_bias(g, kiln_matmul(g, h, w->wv), w->bv);
    kiln_dim qh[3] = {io->n_tok, d->n_head, d->head_dim}, kh[3] = {io->n_tok, d->n_kv_head, d->head_dim};
    /* q then k, each reshape -> [norm] -> rope: the node order fusion and the golden kernels expect */
    q = kiln_reshape(g, q, 3, qh);
    if (w->q_norm != KILN_NODE_NONE) q = kiln_rms_norm(g, q, w->q_norm, d->eps); /* per head: the last dim */
    int64_t rot = d->n_rot ? d->n_rot : d->head_dim;
    q = kiln_rope_partial(g, q, io->pos, d->rope, d->theta, d->rope_mult, rot);
    if (w->q_mult != KILN_NODE_NONE) q = kiln_mul(g, q, w->q_mult);
    k = kiln_reshape(g, k, 3, kh);
    if (w->k_norm != KILN_NODE_NONE) k = kiln_rms_norm(g, k, w->k_norm, d->eps);
    k = kiln_rope_partial(g, k, io->pos, d->rope, d->theta, d->rope_mult, rot);
    v = kiln_reshape(g, v, 3, kh);
    kiln_dim sd[3] = {d->n_kv_head, d->max_ctx, d->head_dim};
    char name[64];
    snprintf(name, sizeof name, "k%d", l);
    kiln_node at = d->block ? io->slots : io->pos; /* where the new rows go: slots of a paged pool */
    kiln_node kc = kiln_kv_scatter(g, kiln_state(g, name, d->kvdtype, 3, sd), k, at);
    snprintf(name, sizeof name, "v%d", l);
    kiln_node vc = kiln_kv_scatter(g, kiln_state(g, name, d->kvdtype, 3, sd), v, at);
    kiln_node a = d->block ? kiln_paged_attention_ext(g, q, kc, vc, io->pos, io->seqs, io->blocks, (int)d->block,
                                                      d->attn_scale, d->softcap, d->window)
                           : kiln_attention_ext(g, q, kc, vc, io->n_kv, d->attn_scale, d->softcap, d->window);
    kiln_dim ad[2] = {io->n_tok, qd};
    a = add_bias(g, kiln_matmul(g, kiln_reshape(g, a, 2, ad), w->wo), w->bo);
    if (w->attn_post_norm != KILN_NODE_NONE) a = kiln_rms_norm(g, a, w->attn_post_norm, d->eps);
    return kiln_add(g, x, a);
}

static kiln_node ffn_half(kiln_graph *g, const kiln_layer_dims *d, const kiln_layer_weights *w, kiln_node x)
{
    kiln_node h = kiln_rms_norm(g, x, w->ffn_norm, d->eps);
    kiln_node gt = add_bias(g, kiln_matmul(g, h, w->wg), w->bg);
    kiln_node up = add_bias(g, kiln_matmul(g, h, w->wu), w->bu);
    kiln_node act = d->gelu_gate ? kiln_mul(g, kiln_gelu(g, gt), up) : kiln_swiglu(g, gt, up);
    kiln_node y = add_bias(g, kiln_matmul(g, act, w->wd), w->bd);
    if (w->ffn_post_norm != KILN_NODE_NONE) y = kiln_rms_norm(g, y, w->ffn_post_norm, d->eps);
    return kiln_add(g, x, y);
}

/* The mixture-of-experts feed-forward (layer.h). With the stacks, only the routed experts run: each
 * token's k slots of gate and up ([n_tok, k, ffn_exp]), their swiglu, and the down matmul summed over
 * the slots weighted by the route, in routing order as llama.cpp. Without, densely: the experts' sum
 * runs in expert order and adds exact zeros for those not routed (the same up to f32 rounding). */
static kiln_node moe_half(kiln_graph *g, const kiln_layer_dims *d, const kiln_layer_weights *w, kiln_node x)
{
    kiln_node h = kiln_rms_norm(g, x, w->ffn_norm, d->eps);
    kiln_node route = kiln_moe_route(g, kiln_matmul(g, h, w->gate_inp), d->n_expert_used, d->expert_norm);
    kiln_node y = KILN_NODE_NONE;
    int k = d->n_expert_used;
    bool dense = w->gate_stack == KILN_NODE_NONE;
    if (!dense) {
        kiln_node a = kiln_swiglu(g, kiln_moe_matmul(g, h, w->gate_stack, route, k, false),
                                  kiln_moe_matmul(g, h, w->up_stack, route, k, false));
        y = kiln_moe_matmul(g, a, w->down_stack, route, k, true);
    }
    for (int64_t e = 0; dense && e < d->n_expert && kiln_graph_status(g) == KILN_OK; e++) {
        kiln_node a = kiln_swiglu(g, kiln_matmul(g, h, w->gate_exps[e]), kiln_matmul(g, h, w->up_exps[e]));
        kiln_node o = kiln_scale_rows(g, kiln_matmul(g, a, w->down_exps[e]), route, (int)e);
        y = y == KILN_NODE_NONE ? o : kiln_add(g, y, o);
    }
    if (w->gate_shexp != KILN_NODE_NONE) { /* qwen2moe: sigmoid-gated shared expert */
        kiln_node a = kiln_swiglu(g, kiln_matmul(g, h, w->gate_shexp), kiln_matmul(g, h, w->up_shexp));
        kiln_node gate = kiln_sigmoid(g, kiln_matmul(g, h, w->gate_inp_shexp));
        y = kiln_add(g, y, kiln_scale_rows(g, kiln_matmul(g, a, w->down_shexp), gate, 0));
    }
    return kiln_add(g, x, y);
}

kiln_node kiln_layer_build(kiln_graph *g, const kiln_layer_dims *d, const kiln_layer_io *io,
                           const kiln_layer_weights *w, int l, kiln_node x)
{
    x = attn_half(g, d, io, w, l, x);
    return d->n_expert > 0 ? moe_half(g, d, w, x) : ffn_half(g, d, w, x);
}
