/* Row template: one block per row (grid-stride over rows) for rms_norm, layer_norm, softmax and
 * argmax, with block reductions, one thread per element for scale_rows, the fused elementwise prologue re-evaluated on each pass and the
 * epilogue applied before the stores (fusion rule 7: a per-head rms_norm's rope and the kv_scatter
 * of that rope); and rope alone, one thread per rotated pair. Must not handle matmuls or attention. */
#include "codegen/lower.h"

#include <math.h>
#include <string.h>

#define ROW_BLOCK 256

static uint32_t reduce(kiln_kir *k, uint32_t v, enum kiln_kred op)
{
    return kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, v, KILN_IDX_NONE, KILN_IDX_NONE,
                       (int32_t)((op << 16) | ROW_BLOCK));
}

/* Value of the anchor's input x at flat element idx (prologue evaluated). */
static uint32_t input_at(kiln_kir *k, const kiln_graph *g, const kiln_region *r, uint32_t anchor, uint32_t idx,
                         kl_eval *e)
{
    kl_eval_init(e, k, g, r, g->nodes[anchor].src[0], idx);
    return kl_eval_node(e, g->nodes[anchor].src[0]);
}

/* Stores every region output at flat element idx, with the anchor's value preset (epilogue). */
static void store_outs(kiln_kir *k, const kiln_graph *g, const kiln_region *r, uint32_t anchor, uint32_t idx,
                       uint32_t y, kl_eval *pro, kl_eval *e)
{
    kl_eval_init(e, k, g, r, anchor, idx);
    for (int i = 0; i < pro->n_memo; i++) kl_eval_set(e, pro->memo_node[i], pro->memo_val[i]);
    kl_eval_set(e, anchor, y);
    for (uint32_t o = 0; o < r->n_outs; o++) kl_store_node(k, g, r->outs[o], idx, kl_eval_node(e, r->outs[o]));
}

static kiln_status lower_rope(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, uint32_t anchor,
                              kiln_kir *k, char *err, size_t n_err)
{
    const kiln_node_rec *n = &g->nodes[anchor];
    int64_t hd = n->dims[n->rank - 1];
    if (kiln_dim_is_sym(hd) || hd % 2 || hd > 8192)
        return kl_unsupported(err, n_err, "rope: head_dim must be a constant even number");
    kiln_kir_init(k, "kiln_rope", 256);
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, n) / 2, 256);
    snprintf(k->what, sizeof k->what, "rope %s, %u ops", n->i[0] == KILN_ROPE_NEOX ? "neox" : "normal", r->n_nodes);
    uint32_t tab = kl_rope_table(k, n, hd);
    uint32_t pairs = kiln_k2(k, KILN_KOP_DIV, kl_numel_from(k, n, 0), kiln_ki(k, 2));
    uint32_t per_tok = kiln_ki(k, 1);
    for (int d = 1; d < n->rank; d++) per_tok = kiln_k2(k, KILN_KOP_MUL, per_tok, kl_dim(k, n->dims[d]));
    uint32_t p = kl_grid_loop(k, pairs);
    int32_t half = (int32_t)(hd / 2);
    uint32_t row = kiln_k2(k, KILN_KOP_DIV, p, kiln_ki(k, half)), i = kiln_k2(k, KILN_KOP_REM, p, kiln_ki(k, half));
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)hd));
    uint32_t e0, e1, rotated = KILN_IDX_NONE;
    int64_t rot = kiln_rope_dims(n, hd);
    if (rot < hd) /* partial: pairs i < rot/2 turn, the others (2i, 2i+1) pass through in either mode */
        rotated = kiln_k2(k, KILN_KOP_LT, i, kiln_ki(k, (int32_t)(rot / 2)));
    if (n->i[0] == KILN_ROPE_NEOX && rotated != KILN_IDX_NONE) {
        e0 = kiln_k2(k, KILN_KOP_ADD, base, kiln_ksel(k, KILN_KT_I32, rotated, i, kiln_k2(k, KILN_KOP_ADD, i, i)));
        e1 = kiln_k2(k, KILN_KOP_ADD, e0, kiln_ksel(k, KILN_KT_I32, rotated, kiln_ki(k, (int32_t)(rot / 2)), kiln_ki(k, 1)));
    } else if (n->i[0] == KILN_ROPE_NEOX) {
        e0 = kiln_k2(k, KILN_KOP_ADD, base, i);
        e1 = kiln_k2(k, KILN_KOP_ADD, e0, kiln_ki(k, half));
    } else {
        e0 = kiln_k2(k, KILN_KOP_ADD, base, kiln_k2(k, KILN_KOP_ADD, i, i));
        e1 = kiln_k2(k, KILN_KOP_ADD, e0, kiln_ki(k, 1));
    }
    uint32_t tok = kiln_k2(k, KILN_KOP_DIV, e0, per_tok);
    uint32_t pos = kl_load_node(k, g, n->src[1], tok);
    uint32_t freq = kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32,
                                kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, i, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)tab),
                                KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t sn, cs;
    kl_sincos(k, kiln_k2(k, KILN_KOP_MUL, pos, freq), &sn, &cs);
    kl_eval pa, pb, ea, eb;
    uint32_t a = input_at(k, g, r, anchor, e0, &pa), b = input_at(k, g, r, anchor, e1, &pb);
    uint32_t y0 =
        kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, a, cs, kiln_k1(k, KILN_KOP_NEG, kiln_k2(k, KILN_KOP_MUL, b, sn)), 0);
    uint32_t y1 = kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, a, sn, kiln_k2(k, KILN_KOP_MUL, b, cs), 0);
    if (rotated != KILN_IDX_NONE) { /* exactly the input, whatever sin(0) and cos(0) round to */
        y0 = kiln_ksel(k, KILN_KT_F32, rotated, y0, a);
        y1 = kiln_ksel(k, KILN_KT_F32, rotated, y1, b);
    }
    kiln_dtype t = (kiln_dtype)n->dtype;
    if (t != KILN_DTYPE_F32) { /* the rope result is rounded to its dtype before any epilogue */
        kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = (uint8_t)t};
        y0 = kl_apply(k, &tmp, y0, KILN_IDX_NONE);
        y1 = kl_apply(k, &tmp, y1, KILN_IDX_NONE);
    }
    store_outs(k, g, r, anchor, e0, y0, &pa, &ea);
    store_outs(k, g, r, anchor, e1, y1, &pb, &eb);
    kl_loop_end(k);
    const kl_eval *ev[] = {&pa, &pb, &ea, &eb};
    for (int j = 0; j < 4; j++)
        if (ev[j]->failed) {
            kiln_kir_free(k);
            return kl_unsupported(err, n_err, "rope kernel: %s", ev[j]->err);
        }
    return KILN_OK;
}

/* One row kernel being written: the loop over rows is open; each pass walks the row's d elements. */
typedef struct rows_ctx {
    kiln_kir *k;
    const kiln_graph *g;
    const kiln_region *r;
    uint32_t anchor;                /* the row op's node */
    uint32_t rope, kv;              /* rule 7: a rope of the (rms_norm) anchor and a kv_scatter of it, or NONE */
    uint32_t tid, d, base, df, row; /* I32 thread, row length, first element, F32 d, the row */
    kl_eval pe, ee;                 /* prologue and epilogue evaluation */
    bool failed;                    /* a fused op could not be evaluated (why) */
    char why[160];
} rows_ctx;

#define PASS_BEGIN()                                                                                                   \
    uint32_t j = kiln_kvar(k, c->tid);                                                                                 \
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, c->d, kiln_ki(k, ROW_BLOCK), 0);                                    \
    uint32_t idx = kiln_k2(k, KILN_KOP_ADD, c->base, j);                                                               \
    uint32_t xv = input_at(k, c->g, c->r, c->anchor, idx, &c->pe);                                                     \
    if (c->pe.failed) c->failed = true, memcpy(c->why, c->pe.err, sizeof c->why);

/* argmax: the first index of the row's largest value (NaN only when every value is NaN: index 0). */
static void rows_argmax(rows_ctx *c)
{
    kiln_kir *k = c->k;
    const kiln_graph *g = c->g;
    const kiln_region *r = c->r;
    uint32_t anchor = c->anchor, tid = c->tid, row = c->row;
    uint32_t best = kiln_kvar(k, kiln_kf(k, -INFINITY)), bi = kiln_kvar(k, kiln_ki(k, -1));
    {
        PASS_BEGIN();
        uint32_t take = kiln_k2(
            k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_LT, best, xv),
            kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LT, bi, kiln_ki(k, 0)), kiln_k2(k, KILN_KOP_EQ, xv, xv)));
        kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, take, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        kiln_kset(k, best, xv);
        kiln_kset(k, bi, j);
        kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        kl_loop_end(k);
    }
    uint32_t m = reduce(k, best, KILN_KRED_MAX);
    uint32_t cand =
        kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_EQ, best, m), kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), bi));
    uint32_t negi =
        kiln_k1(k, KILN_KOP_NEG, kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_F32, bi, KILN_IDX_NONE, KILN_IDX_NONE, 0));
    uint32_t prop = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, cand, negi, kiln_kf(k, -INFINITY), 0);
    uint32_t win = kiln_k1(k, KILN_KOP_NEG, reduce(k, prop, KILN_KRED_MAX)); /* +inf when every value is NaN */
    win = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, kiln_k2(k, KILN_KOP_LT, win, kiln_kf(k, 16777216.0f)), win,
                      kiln_kf(k, 0.0f), 0);
    kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(k, KILN_KOP_EQ, tid, kiln_ki(k, 0)), KILN_IDX_NONE, KILN_IDX_NONE,
                0);
    kl_store_node(k, g, anchor, row, win);
    kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    if (r->n_outs != 1 || r->outs[0] != anchor)
        c->failed = true, snprintf(c->why, sizeof c->why, "argmax with an epilogue");
}

/* moe_route (kiln.h): the row's max and sum of exp (as softmax), then k passes each finding the next
 * value in the order (larger first, lower index first on ties) below the last one found: a block
 * argmax over the candidates; after them (lv, li) is the k-th kept, and element j is kept when
 * x_j > lv or (x_j == lv and j <= li). Kept elements get exp(x - max) / sum (over the kept ones' sum
 * with norm), the others 0. NaN elements are never kept (rows of fewer than k numbers: undefined). */
static void rows_moe_route(rows_ctx *c, const kiln_node_rec *n)
{
    kiln_kir *k = c->k;
    uint32_t mx, sum, ksum = kiln_kf(k, 1.0f);
    {
        uint32_t acc = kiln_kvar(k, kiln_kf(k, -INFINITY));
        PASS_BEGIN();
        kiln_kset(k, acc, kiln_k2(k, KILN_KOP_MAX, acc, xv));
        kl_loop_end(k);
        mx = reduce(k, acc, KILN_KRED_MAX);
    }
    {
        uint32_t acc = kiln_kvar(k, kiln_kf(k, 0.0f));
        PASS_BEGIN();
        kiln_kset(k, acc, kiln_k2(k, KILN_KOP_ADD, acc, kl_exp(k, kiln_k2(k, KILN_KOP_SUB, xv, mx))));
        kl_loop_end(k);
        sum = reduce(k, acc, KILN_KRED_SUM);
    }
    uint32_t lv = kiln_kvar(k, kiln_kf(k, INFINITY)), li = kiln_kvar(k, kiln_kf(k, -1.0f)); /* F32: index < 2^24 */
    uint32_t t = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kloop(k, t, kiln_ki(k, n->i[0]), kiln_ki(k, 1));
    {
        uint32_t best = kiln_kvar(k, kiln_kf(k, -INFINITY)), bi = kiln_kvar(k, kiln_kf(k, -1.0f));
        {
            PASS_BEGIN();
            uint32_t jf = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_F32, j, KILN_IDX_NONE, KILN_IDX_NONE, 0);
            uint32_t below = kiln_k2(k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_LT, xv, lv),
                                     kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_EQ, xv, lv), kiln_k2(k, KILN_KOP_LT, li, jf)));
            uint32_t take = kiln_k2(k, KILN_KOP_PAND, below,
                                    kiln_k2(k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_LT, best, xv),
                                            kiln_k2(k, KILN_KOP_LT, bi, kiln_kf(k, 0.0f))));
            kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, take, KILN_IDX_NONE, KILN_IDX_NONE, 0);
            kiln_kset(k, best, xv);
            kiln_kset(k, bi, jf);
            kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
            kl_loop_end(k);
        }
        uint32_t m = reduce(k, best, KILN_KRED_MAX);
        uint32_t cand = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_EQ, best, m),
                                kiln_k2(k, KILN_KOP_LE, kiln_kf(k, 0.0f), bi));
        uint32_t prop = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, cand, kiln_k1(k, KILN_KOP_NEG, bi),
                                    kiln_kf(k, -INFINITY), 0);
        kiln_kset(k, li, kiln_k1(k, KILN_KOP_NEG, reduce(k, prop, KILN_KRED_MAX)));
        kiln_kset(k, lv, m);
    }
    kl_loop_end(k);
#define KEPT()                                                                                                          \
    kiln_k2(k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_LT, lv, xv),                                                          \
            kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_EQ, xv, lv),                                                 \
                    kiln_k2(k, KILN_KOP_LE, kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_F32, j, KILN_IDX_NONE, KILN_IDX_NONE, 0), \
                            li)))
    if (n->i[1]) { /* the kept probabilities' sum */
        uint32_t acc = kiln_kvar(k, kiln_kf(k, 0.0f));
        PASS_BEGIN();
        uint32_t p = kiln_k2(k, KILN_KOP_DIV, kl_exp(k, kiln_k2(k, KILN_KOP_SUB, xv, mx)), sum);
        kiln_kset(k, acc, kiln_k2(k, KILN_KOP_ADD, acc, kiln_ksel(k, KILN_KT_F32, KEPT(), p, kiln_kf(k, 0.0f))));
        kl_loop_end(k);
        ksum = reduce(k, acc, KILN_KRED_SUM);
    }
    {
        PASS_BEGIN();
        uint32_t p = kiln_k2(k, KILN_KOP_DIV, kl_exp(k, kiln_k2(k, KILN_KOP_SUB, xv, mx)), sum);
        if (n->i[1]) p = kiln_k2(k, KILN_KOP_DIV, p, ksum);
        uint32_t y = kiln_ksel(k, KILN_KT_F32, KEPT(), p, kiln_kf(k, 0.0f));
        store_outs(k, c->g, c->r, c->anchor, idx, y, &c->pe, &c->ee);
        if (c->ee.failed) c->failed = true, memcpy(c->why, c->ee.err, sizeof c->why);
        kl_loop_end(k);
    }
#undef KEPT
}

/* Element j of the row, prologue evaluated (kl_row.at for the norms' scaled passes). */
static uint32_t rows_at(void *p, uint32_t j)
{
    rows_ctx *c = p;
    uint32_t xv = input_at(c->k, c->g, c->r, c->anchor, kiln_k2(c->k, KILN_KOP_ADD, c->base, j), &c->pe);
    if (c->pe.failed) c->failed = true, memcpy(c->why, c->pe.err, sizeof c->why);
    return xv;
}

/* Stores kv_scatter node kv's element (row element j of flat element idx of its rows) of value v:
 * state[h, pos[t], j] as lower_move's scatter kernel writes it (positions outside the state skipped). */
static void rows_kv_store(rows_ctx *c, uint32_t idx, uint32_t j, uint32_t v)
{
    kiln_kir *k = c->k;
    const kiln_node_rec *n = &c->g->nodes[c->kv], *st = &c->g->nodes[n->src[0]];
    int64_t n_kvh = st->dims[0], max_ctx = st->dims[1], hd = st->dims[2];
    uint32_t t = kiln_k2(k, KILN_KOP_DIV, idx, kiln_ki(k, (int32_t)(n_kvh * hd)));
    uint32_t h = kiln_k2(k, KILN_KOP_REM, kiln_k2(k, KILN_KOP_DIV, idx, kiln_ki(k, (int32_t)hd)), kiln_ki(k, (int32_t)n_kvh));
    uint32_t pos = kiln_kcvt(k, KILN_KT_I32, kiln_kld(k, kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false), t));
    kiln_kif(k, kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), pos),
                        kiln_k2(k, KILN_KOP_LT, pos, kiln_ki(k, (int32_t)max_ctx))));
    uint32_t dst = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, h, (int32_t)max_ctx), pos),
                                                          (int32_t)hd), j);
    kl_store(k, kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], true), (kiln_dtype)st->dtype, dst, v);
    kiln_kendif(k);
}

/* rms_norm's value at row element jj (its prologue evaluated by e): x sc w, in the norm's dtype. */
static uint32_t rms_at(rows_ctx *c, const kiln_node_rec *n, uint32_t sc, uint32_t jj, kl_eval *e)
{
    kiln_kir *k = c->k;
    uint32_t y = kiln_k2(k, KILN_KOP_MUL, input_at(k, c->g, c->r, c->anchor, kiln_k2(k, KILN_KOP_ADD, c->base, jj), e), sc);
    if (e->failed) c->failed = true, memcpy(c->why, e->err, sizeof c->why);
    if (n->n_src > 1 && n->src[1] != KILN_IDX_NONE) y = kiln_k2(k, KILN_KOP_MUL, y, kl_load_node(k, c->g, n->src[1], jj));
    kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = n->dtype};
    return kl_apply(k, &tmp, y, KILN_IDX_NONE);
}

/* Rule 7's store: element j of the normalized head (y, at flat idx) turned with its rope partner,
 * which this thread normalizes itself: the same f32 operations as the norm kernel then lower_rope's
 * (bit for bit the unfused result). Stores the rope and/or the KV row. */
static void rows_rope_store(rows_ctx *c, const kiln_node_rec *n, uint32_t sc, uint32_t j, uint32_t idx, uint32_t y)
{
    kiln_kir *k = c->k;
    const kiln_node_rec *rp = &c->g->nodes[c->rope];
    int64_t hd = rp->dims[rp->rank - 1], rot = kiln_rope_dims(rp, hd), hr = rot / 2;
    uint32_t rotated = kiln_k2(k, KILN_KOP_LT, j, kiln_ki(k, (int32_t)rot)), first, i, partner;
    if (rp->i[0] == KILN_ROPE_NEOX) { /* pairs (i, i + rot/2) */
        first = kiln_k2(k, KILN_KOP_LT, j, kiln_ki(k, (int32_t)hr));
        i = kiln_ksel(k, KILN_KT_I32, first, j, kiln_kaddi(k, j, (int32_t)-hr));
        partner = kiln_ksel(k, KILN_KT_I32, first, kiln_kaddi(k, j, (int32_t)hr), i);
    } else { /* pairs (2i, 2i + 1) */
        first = kiln_k2(k, KILN_KOP_EQ, kiln_kandi(k, j, 1), kiln_ki(k, 0));
        i = kiln_kshri(k, j, 1);
        partner = kiln_ksel(k, KILN_KT_I32, first, kiln_kaddi(k, j, 1), kiln_kaddi(k, j, -1));
    }
    i = kiln_ksel(k, KILN_KT_I32, rotated, i, kiln_ki(k, 0)); /* pass-through dims: any pair in the table */
    partner = kiln_ksel(k, KILN_KT_I32, rotated, partner, j);
    kl_eval pe;
    uint32_t yp = rms_at(c, n, sc, partner, &pe);
    uint32_t a = kiln_ksel(k, KILN_KT_F32, first, y, yp), b = kiln_ksel(k, KILN_KT_F32, first, yp, y);
    uint32_t per_tok = kiln_ki(k, 1);
    for (int d = 1; d < rp->rank; d++) per_tok = kiln_k2(k, KILN_KOP_MUL, per_tok, kl_dim(k, rp->dims[d]));
    uint32_t pos = kl_load_node(k, c->g, rp->src[1], kiln_k2(k, KILN_KOP_DIV, idx, per_tok));
    uint32_t tab = kl_rope_table(k, rp, hd);
    uint32_t freq = kiln_kbitcast(k, KILN_KT_F32, kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, i, KILN_IDX_NONE, KILN_IDX_NONE,
                                                                 (int32_t)tab));
    uint32_t sn, cs;
    kl_sincos(k, kiln_k2(k, KILN_KOP_MUL, pos, freq), &sn, &cs);
    uint32_t y0 = kiln_kfma(k, a, cs, kiln_k1(k, KILN_KOP_NEG, kiln_k2(k, KILN_KOP_MUL, b, sn)));
    uint32_t y1 = kiln_kfma(k, a, sn, kiln_k2(k, KILN_KOP_MUL, b, cs));
    uint32_t yr = kiln_ksel(k, KILN_KT_F32, rotated, kiln_ksel(k, KILN_KT_F32, first, y0, y1), y);
    kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = rp->dtype};
    yr = kl_apply(k, &tmp, yr, KILN_IDX_NONE);
    for (uint32_t o = 0; o < c->r->n_outs; o++) {
        uint32_t node = c->r->outs[o];
        if (node == c->kv) rows_kv_store(c, idx, j, yr);
        else kl_store_node(k, c->g, node, idx, node == c->rope ? yr : y); /* the rope or the norm itself */
    }
}

/* rms_norm, layer_norm, softmax: one or two reduction passes, then the pass that stores. The
 * norms' f32 statistics are redone on the row scaled by a power of two when they over- or
 * underflowed (kl_norm_stats); the store pass then computes (x s - ms) sc, s = 1 otherwise. */
static void rows_norm(rows_ctx *c, const kiln_node_rec *n, enum kiln_op op)
{
    kiln_kir *k = c->k;
    const kiln_graph *g = c->g;
    const kiln_region *r = c->r;
    uint32_t anchor = c->anchor, df = c->df;
    uint32_t mean = kiln_kf(k, 0.0f), mx = KILN_IDX_NONE;
    if (op == KILN_OP_LAYER_NORM || op == KILN_OP_SOFTMAX) {
        uint32_t acc = kiln_kvar(k, kiln_kf(k, op == KILN_OP_SOFTMAX ? -INFINITY : 0.0f));
        {
            PASS_BEGIN();
            kiln_kset(k, acc, kiln_k2(k, op == KILN_OP_SOFTMAX ? KILN_KOP_MAX : KILN_KOP_ADD, acc, xv));
            kl_loop_end(k);
        }
        if (op == KILN_OP_SOFTMAX)
            mx = reduce(k, acc, KILN_KRED_MAX);
        else
            mean = kiln_k2(k, KILN_KOP_DIV, reduce(k, acc, KILN_KRED_SUM), df);
    }
    uint32_t acc = kiln_kvar(k, kiln_kf(k, 0.0f));
    {
        PASS_BEGIN();
        if (op == KILN_OP_SOFTMAX) {
            kiln_kset(k, acc, kiln_k2(k, KILN_KOP_ADD, acc, kl_exp(k, kiln_k2(k, KILN_KOP_SUB, xv, mx))));
        } else {
            uint32_t cx = kiln_k2(k, KILN_KOP_SUB, xv, mean);
            kiln_kset(k, acc, kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, cx, cx, acc, 0));
        }
        kl_loop_end(k);
    }
    uint32_t sum = reduce(k, acc, KILN_KRED_SUM);
    kl_norm nm = {KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE};
    uint32_t nms = KILN_IDX_NONE;
    if (op == KILN_OP_SOFTMAX) {
        nm.sc = kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f), sum);
    } else {
        kl_row row = {.at = rows_at, .ctx = c, .tid = c->tid, .n = c->d, .nf = df, .step = ROW_BLOCK};
        uint32_t q = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_DIV, sum, df), kiln_kf(k, n->f[0]));
        if (op == KILN_OP_LAYER_NORM)
            nm = kl_norm_stats(k, &row, mean, q, n->f[0]), nms = kiln_k1(k, KILN_KOP_NEG, nm.ms);
        else
            nm.sc = kl_rms_scale(k, &row, q, n->f[0]);
    }
    if (c->rope != KILN_IDX_NONE) { /* rule 7 (an rms_norm): the norm's value, then the rope's */
        PASS_BEGIN();
        (void)xv;
        rows_rope_store(c, n, nm.sc, j, idx, rms_at(c, n, nm.sc, j, &c->ee));
        kl_loop_end(k);
        return;
    }
    {
        PASS_BEGIN();
        uint32_t y;
        if (op == KILN_OP_SOFTMAX) {
            y = kiln_k2(k, KILN_KOP_MUL, kl_exp(k, kiln_k2(k, KILN_KOP_SUB, xv, mx)), nm.sc);
        } else {
            if (op == KILN_OP_LAYER_NORM) xv = kiln_kfma(k, xv, nm.s, nms); /* x - mean exactly rounded when s = 1 */
            y = kiln_k2(k, KILN_KOP_MUL, xv, nm.sc);
            if (n->n_src > 1 && n->src[1] != KILN_IDX_NONE)
                y = kiln_k2(k, KILN_KOP_MUL, y, kl_load_node(k, g, n->src[1], j));
            if (n->n_src > 2 && n->src[2] != KILN_IDX_NONE)
                y = kiln_k2(k, KILN_KOP_ADD, y, kl_load_node(k, g, n->src[2], j));
        }
        kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = n->dtype};
        y = kl_apply(k, &tmp, y, KILN_IDX_NONE);
        store_outs(k, g, r, anchor, idx, y, &c->pe, &c->ee);
        if (c->ee.failed) c->failed = true, memcpy(c->why, c->ee.err, sizeof c->why);
        kl_loop_end(k);
    }
}
#undef PASS_BEGIN

/* The region's nodes besides its anchor: elementwise ones (a prologue, or an epilogue without a
 * rope), or rule 7's rope of the rms_norm anchor and a kv_scatter of that rope into a plain-dtype
 * state of constant dims (after the anchor, nothing else). False for any other mix. */
static bool rule7_nodes(const kiln_graph *g, const kiln_region *r, uint32_t *rope, uint32_t *kv)
{
    uint32_t anchor = r->anchor;
    bool after = false; /* an elementwise node after the anchor */
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        uint32_t id = r->nodes[i];
        const kiln_node_rec *m = &g->nodes[id];
        if (id == anchor) continue;
        if (kl_is_elementwise((enum kiln_op)m->op)) {
            after |= id > anchor;
        } else if (m->op == KILN_OP_ROPE && *rope == KILN_IDX_NONE && m->src[0] == anchor &&
                   g->nodes[anchor].op == KILN_OP_RMS_NORM && kl_same_numel(m, &g->nodes[anchor])) {
            *rope = id;
        } else if (m->op == KILN_OP_KV_SCATTER && *rope != KILN_IDX_NONE && *kv == KILN_IDX_NONE && m->src[1] == *rope) {
            const kiln_node_rec *st = &g->nodes[m->src[0]];
            if (st->rank != 3 || kiln_dtype_block((kiln_dtype)st->dtype) != 1 || g->nodes[*rope].rank != 3) return false;
            for (int d = 0; d < 3; d++)
                if (kiln_dim_is_sym(st->dims[d])) return false;
            *kv = id;
        } else {
            return false;
        }
    }
    return *rope == KILN_IDX_NONE || !after;
}

/* scale_rows: one thread per element, y = x * w[row, col] (x through the fused prologue, the epilogue
 * after it); w is read where the region's input lies (a routed weight, a gate). */
static kiln_status lower_scale_rows(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                                    uint32_t anchor, kiln_kir *k, char *err, size_t n_err)
{
    const kiln_node_rec *n = &g->nodes[anchor], *w = &g->nodes[n->src[1]];
    int64_t d = n->dims[n->rank - 1], cw = w->dims[w->rank - 1];
    if (kiln_dim_is_sym(d) || kiln_dim_is_sym(cw) || d > INT32_MAX || cw > INT32_MAX)
        return kl_unsupported(err, n_err, "scale_rows: the rows' lengths must be constants");
    if (kiln_region_has(r, n->src[1]) || w->dtype != KILN_DTYPE_F32)
        return kl_unsupported(err, n_err, "scale_rows: w must be an f32 input of the kernel");
    kiln_kir_init(k, "kiln_scale_rows", 256);
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, n), 256);
    snprintf(k->what, sizeof k->what, "scale_rows col %d, %u ops", (int)n->i[0], r->n_nodes);
    uint32_t idx = kl_grid_loop(k, kl_numel_from(k, n, 0));
    uint32_t row = kiln_k2(k, KILN_KOP_DIV, idx, kiln_ki(k, (int32_t)d));
    uint32_t widx = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)cw)), kiln_ki(k, n->i[0]));
    kl_eval pe, ee;
    uint32_t xv = input_at(k, g, r, anchor, idx, &pe);
    uint32_t y = kiln_k2(k, KILN_KOP_MUL, xv, kl_load_node(k, g, n->src[1], widx));
    store_outs(k, g, r, anchor, idx, y, &pe, &ee);
    kl_loop_end(k);
    if (pe.failed || ee.failed) {
        kiln_kir_free(k);
        return kl_unsupported(err, n_err, "scale_rows: %s", pe.failed ? pe.err : ee.err);
    }
    return KILN_OK;
}

kiln_status kiln_lower_rows(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                            char *err, size_t n_err)
{
    uint32_t anchor = r->anchor;
    const kiln_node_rec *n = &g->nodes[anchor];
    enum kiln_op op = (enum kiln_op)n->op;
    uint32_t rope = KILN_IDX_NONE, kv = KILN_IDX_NONE;
    if (!rule7_nodes(g, r, &rope, &kv)) return kl_unsupported(err, n_err, "row kernel: two row ops in one region");
    if (op == KILN_OP_ROPE) return lower_rope(g, r, tg, anchor, k, err, n_err);
    if (op == KILN_OP_SCALE_ROWS) return lower_scale_rows(g, r, tg, anchor, k, err, n_err);
    if (op != KILN_OP_RMS_NORM && op != KILN_OP_LAYER_NORM && op != KILN_OP_SOFTMAX && op != KILN_OP_ARGMAX &&
        op != KILN_OP_MOE_ROUTE)
        return kl_unsupported(err, n_err, "row kernel: %s", kiln_op_name(op));
    const kiln_node_rec *x = &g->nodes[n->src[0]];
    int64_t d_const = x->dims[x->rank - 1];
    kiln_kir_init(k,
                  op == KILN_OP_SOFTMAX     ? "kiln_softmax"
                  : op == KILN_OP_ARGMAX    ? "kiln_argmax"
                  : op == KILN_OP_MOE_ROUTE ? "kiln_moe_route"
                                            : "kiln_norm",
                  ROW_BLOCK);
    snprintf(k->what, sizeof k->what, "%s, %u ops", kiln_op_name(op), r->n_nodes);
    int64_t rows_max = kl_numel_max(g, x) / (kl_dim_max(g, d_const) ? kl_dim_max(g, d_const) : 1);
    k->grid[0] = kl_grid_for(tg, rows_max, 1);
    uint32_t d = kl_dim(k, d_const);
    uint32_t rows = kiln_k2(k, KILN_KOP_DIV, kl_numel_from(k, x, 0), kiln_k2(k, KILN_KOP_MAX, d, kiln_ki(k, 1)));
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t row =
        kiln_kvar(k, kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, row, rows, kiln_ki(k, (int32_t)k->grid[0]), 0);
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, row, d);
    uint32_t df = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_F32, d, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    rows_ctx c = {.k = k, .g = g, .r = r, .anchor = anchor, .rope = rope, .kv = kv, .tid = tid, .d = d, .base = base,
                  .df = df, .row = row};
    if (op == KILN_OP_ARGMAX)
        rows_argmax(&c);
    else if (op == KILN_OP_MOE_ROUTE)
        rows_moe_route(&c, n);
    else
        rows_norm(&c, n, op);
    kl_loop_end(k);
    if (c.failed) {
        kiln_kir_free(k);
        return kl_unsupported(err, n_err, "row kernel: %s", c.why);
    }
    return KILN_OK;
}
