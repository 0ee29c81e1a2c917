/* Move template: kv_scatter (rows written into a state at run-time positions; a q8_0 pool's rows
 * quantized a block of 32 per thread) and get_rows (embedding lookup, any weight dtype, with an
 * elementwise epilogue); one element (or one block value) per thread. Positions
 * and ids out of range are skipped, never written out of bounds (the executor checks bound inputs
 * on the host first and reports them). Must not compute anything but copies, (de)quantization and a
 * lookup's fused elementwise epilogue. */
#include "codegen/lower.h"
#include "codegen/wfmt.h"

/* F32 value of element `col` (0..k-1) of row `row` of a weight of dtype t in its device layout
 * (block formats: their row of the weight-format table). */
static uint32_t load_block_elem(kiln_kir *k, uint32_t slot, kiln_dtype t, int64_t kdim, int64_t rows, uint32_t row,
                                uint32_t col)
{
    if (kiln_dtype_block(t) == 1)
        return kl_load(k, slot, t,
                       kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)kdim)), col));
    return kl_wfmt_of(t)->elem(k, slot, kdim, rows, row, col);
}

static kiln_status lower_get_rows(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                                  char *err, size_t n_err)
{
    uint32_t node = r->anchor;
    const kiln_node_rec *n = &g->nodes[node], *tab = &g->nodes[n->src[0]];
    kiln_dtype t = (kiln_dtype)tab->dtype;
    for (uint32_t j = 0; j < r->n_nodes; j++)
        if (r->nodes[j] != node && !kl_is_elementwise((enum kiln_op)g->nodes[r->nodes[j]].op))
            return kl_unsupported(err, n_err, "get_rows with %s fused", kiln_op_name((enum kiln_op)g->nodes[r->nodes[j]].op));
    const kl_wfmt *wf = kl_wfmt_of(t);
    if (t == KILN_DTYPE_I32 || (kiln_dtype_block(t) != 1 && (!wf || !wf->elem)))
        return kl_unsupported(err, n_err, "get_rows of %s", kiln_dtype_name(t));
    /* a float table may have symbolic rows (picking rows of activations, e.g. the last token's
     * hidden state before the head); block tables are weights, their layout needs V */
    bool plain = kiln_dtype_block(t) == 1;
    if (tab->rank != 2 || (kiln_dim_is_sym(tab->dims[0]) && !plain) || kiln_dim_is_sym(tab->dims[1]))
        return kl_unsupported(err, n_err,
                              "get_rows: table must be [V, D] with D constant (and V constant for block dtypes)");
    int64_t V = kl_dim_max(g, tab->dims[0]), D = tab->dims[1];
    kiln_kir_init(k, "kiln_get_rows", 256);
    snprintf(k->what, sizeof k->what, "get_rows %s", kiln_dtype_name(t));
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, n), 256);
    uint32_t total = kl_numel_from(k, n, 0);
    uint32_t slot = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], false);
    uint32_t i = kl_grid_loop(k, total);
    uint32_t row = kiln_k2(k, KILN_KOP_DIV, i, kiln_ki(k, (int32_t)D)),
             col = kiln_k2(k, KILN_KOP_REM, i, kiln_ki(k, (int32_t)D));
    uint32_t id = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32,
                              kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, row, KILN_IDX_NONE, KILN_IDX_NONE,
                                          (int32_t)kiln_kir_buf(k, KILN_KBUF_NODE, n->src[1], false)),
                              KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t ok = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), id),
                          kiln_k2(k, KILN_KOP_LT, id, kl_dim(k, tab->dims[0])));
    kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, ok, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t v = load_block_elem(k, slot, t, D, V, id, col);
    kl_eval ev = {.failed = false};
    if (r->n_nodes == 1) {
        kl_store_node(k, g, node, i, v);
    } else { /* an elementwise epilogue (fusion rule 1: gemma's embedding scale) on the looked-up value */
        kiln_node_rec cast = {.op = KILN_OP_CAST, .dtype = n->dtype};
        kl_eval_init(&ev, k, g, r, node, i);
        kl_eval_set(&ev, node, kl_apply(k, &cast, v, KILN_IDX_NONE));
        for (uint32_t o = 0; o < r->n_outs; o++) kl_store_node(k, g, r->outs[o], i, kl_eval_node(&ev, r->outs[o]));
    }
    kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kl_loop_end(k);
    if (ev.failed) {
        kiln_kir_free(k);
        return kl_unsupported(err, n_err, "get_rows kernel: %s", ev.err);
    }
    return KILN_OK;
}

/* ggml's roundf of F32 v to an int8 (half away from zero, saturated) as I32: from the truncation t
 * by comparisons only (v - t could be contracted into an fma by a shader compiler, changing ties). */
static uint32_t q8_round(kiln_kir *k, uint32_t v)
{
    uint32_t t = kiln_kcvt(k, KILN_KT_I32, v), tf = kiln_kcvt(k, KILN_KT_F32, t);
    uint32_t up = kiln_k2(k, KILN_KOP_LE, kiln_k2(k, KILN_KOP_ADD, tf, kiln_kf(k, 0.5f)), v);
    uint32_t dn = kiln_k2(k, KILN_KOP_LE, v, kiln_k2(k, KILN_KOP_SUB, tf, kiln_kf(k, 0.5f)));
    t = kiln_ksel(k, KILN_KT_I32, up, kiln_kaddi(k, t, 1), kiln_ksel(k, KILN_KT_I32, dn, kiln_kaddi(k, t, -1), t));
    return kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, t, kiln_ki(k, -128)), kiln_ki(k, 127));
}

/* kv_scatter into a q8_0 pool: a thread per block of 32 values of a row (token, kv head), as ggml's
 * quantize_row_q8_0 (kiln_dtype_quant_q8_0, bit for bit): d = max |x| / 127, q = roundf(x * (1 / d));
 * the block's 34 bytes (f16 d, then the int8 q) stored as 17 halves (blocks are 2-byte aligned).
 * The rows' element expression is evaluated twice (the maximum, then the quants). */
static kiln_status lower_scatter_q8_0(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                                      uint32_t node, kiln_kir *k, char *err, size_t n_err)
{
    const kiln_node_rec *n = &g->nodes[node], *st = &g->nodes[n->src[0]], *rows = &g->nodes[n->src[1]];
    int64_t n_kvh = st->dims[0], max_ctx = st->dims[1], hd = st->dims[2], nb = hd / 32;
    if (hd % 32 || r->n_outs != 1) return kl_unsupported(err, n_err, "q8_0 kv_scatter with other outputs or head_dim %lld", (long long)hd);
    kiln_kir_init(k, "kiln_kv_scatter_q8_0", 128);
    snprintf(k->what, sizeof k->what, "kv_scatter q8_0 (a block of 32 values a thread)");
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, rows) / 32, 128);
    uint32_t ib = kl_grid_loop(k, kiln_k2(k, KILN_KOP_DIV, kl_numel_from(k, rows, 0), kiln_ki(k, 32)));
    uint32_t per_tok = kiln_ki(k, (int32_t)(n_kvh * nb));
    uint32_t t = kiln_k2(k, KILN_KOP_DIV, ib, per_tok), rem = kiln_k2(k, KILN_KOP_REM, ib, per_tok);
    uint32_t h = kiln_k2(k, KILN_KOP_DIV, rem, kiln_ki(k, (int32_t)nb)), b = kiln_k2(k, KILN_KOP_REM, rem, kiln_ki(k, (int32_t)nb));
    uint32_t pos = kl_ld_i32(k, kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false), t);
    uint32_t ok = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), pos),
                          kiln_k2(k, KILN_KOP_LT, pos, kiln_ki(k, (int32_t)max_ctx)));
    uint32_t e0 = kiln_kmuli(k, ib, 32); /* the block's first element of rows */
    bool failed = false;
    char why[160] = "";
    kiln_kif(k, ok);
    uint32_t amax = kiln_kvar(k, kiln_kf(k, 0)), j = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kloop(k, j, kiln_ki(k, 32), kiln_ki(k, 1));
    {
        kl_eval ev;
        kl_eval_init(&ev, k, g, r, n->src[1], kiln_k2(k, KILN_KOP_ADD, e0, j));
        uint32_t a = kiln_k1(k, KILN_KOP_ABS, kl_eval_node(&ev, n->src[1]));
        kiln_kset(k, amax, kiln_ksel(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_LT, a, amax), amax, a)); /* ggml's MAX(amax, a) */
        if (ev.failed) failed = true, snprintf(why, sizeof why, "%s", ev.err);
    }
    kl_loop_end(k);
    uint32_t d = kiln_k2(k, KILN_KOP_DIV, amax, kiln_kf(k, 127.0f));
    uint32_t id = kiln_ksel(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_EQ, d, kiln_kf(k, 0)), kiln_kf(k, 0),
                            kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f), d));
    uint32_t slot = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], true); /* the result aliases its state */
    uint32_t row = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, h, (int32_t)max_ctx), pos);
    uint32_t half0 = kiln_kmuli(k, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, (int32_t)nb), b), 17);
    kiln_kir_op(k, KILN_KOP_ST16, KILN_KT_NONE, half0, kiln_kir_op(k, KILN_KOP_F2H, KILN_KT_U32, d, KILN_IDX_NONE, KILN_IDX_NONE, 0),
                KILN_IDX_NONE, (int32_t)slot);
    uint32_t p = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kloop(k, p, kiln_ki(k, 16), kiln_ki(k, 1));
    {
        uint32_t q[2];
        for (int e = 0; e < 2; e++) {
            kl_eval ev;
            kl_eval_init(&ev, k, g, r, n->src[1], kiln_k2(k, KILN_KOP_ADD, e0, kiln_kaddi(k, kiln_kmuli(k, p, 2), e)));
            q[e] = kiln_k2(k, KILN_KOP_AND, kiln_kcvt(k, KILN_KT_U32, q8_round(k, kiln_k2(k, KILN_KOP_MUL, kl_eval_node(&ev, n->src[1]), id))),
                           kiln_ku(k, 0xffu));
            if (ev.failed) failed = true, snprintf(why, sizeof why, "%s", ev.err);
        }
        uint32_t w = kiln_k2(k, KILN_KOP_OR, q[0], kiln_k2(k, KILN_KOP_SHL, q[1], kiln_ku(k, 8)));
        kiln_kir_op(k, KILN_KOP_ST16, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, half0, kiln_kaddi(k, p, 1)), w, KILN_IDX_NONE, (int32_t)slot);
    }
    kl_loop_end(k);
    kiln_kendif(k);
    kl_loop_end(k);
    if (failed) {
        kiln_kir_free(k);
        return kl_unsupported(err, n_err, "kv_scatter kernel: %s", why);
    }
    return KILN_OK;
}

/* kv_scatter: state[h, pos[t], :] = rows[t, h, :]. The region may carry elementwise ops that
 * produce the rows (evaluated per element). */
static kiln_status lower_scatter(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                                 char *err, size_t n_err)
{
    uint32_t node = KILN_IDX_NONE;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        enum kiln_op op = (enum kiln_op)g->nodes[r->nodes[i]].op;
        if (op == KILN_OP_KV_SCATTER) {
            if (node != KILN_IDX_NONE) return kl_unsupported(err, n_err, "two kv_scatter in one region");
            node = r->nodes[i];
        } else if (!kl_is_elementwise(op)) {
            return kl_unsupported(err, n_err, "scatter region with %s", kiln_op_name(op));
        }
    }
    if (node == KILN_IDX_NONE) return kl_unsupported(err, n_err, "scatter region without kv_scatter");
    const kiln_node_rec *n = &g->nodes[node], *st = &g->nodes[n->src[0]], *rows = &g->nodes[n->src[1]];
    bool q8 = st->dtype == KILN_DTYPE_Q8_0;
    if ((kiln_dtype_block((kiln_dtype)st->dtype) != 1 && !q8) || st->rank != 3 || rows->rank != 3)
        return kl_unsupported(err, n_err, "kv_scatter into a %s state", kiln_dtype_name((kiln_dtype)st->dtype));
    for (int d = 0; d < 3; d++)
        if (kiln_dim_is_sym(st->dims[d])) return kl_unsupported(err, n_err, "kv_scatter: state dims must be constants");
    if (q8) return lower_scatter_q8_0(g, r, tg, node, k, err, n_err);
    int64_t n_kvh = st->dims[0], max_ctx = st->dims[1], hd = st->dims[2];
    kiln_kir_init(k, "kiln_kv_scatter", 256);
    snprintf(k->what, sizeof k->what, "kv_scatter %s", kiln_dtype_name((kiln_dtype)st->dtype));
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, rows), 256);
    uint32_t total = kl_numel_from(k, rows, 0);
    uint32_t i = kl_grid_loop(k, total);
    uint32_t per_tok = kiln_ki(k, (int32_t)(n_kvh * hd));
    uint32_t t = kiln_k2(k, KILN_KOP_DIV, i, per_tok), rem = kiln_k2(k, KILN_KOP_REM, i, per_tok);
    uint32_t h = kiln_k2(k, KILN_KOP_DIV, rem, kiln_ki(k, (int32_t)hd)),
             e = kiln_k2(k, KILN_KOP_REM, rem, kiln_ki(k, (int32_t)hd));
    uint32_t pos = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32,
                               kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, t, KILN_IDX_NONE, KILN_IDX_NONE,
                                           (int32_t)kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false)),
                               KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t ok = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), pos),
                          kiln_k2(k, KILN_KOP_LT, pos, kiln_ki(k, (int32_t)max_ctx)));
    kl_eval ev;
    kl_eval_init(&ev, k, g, r, n->src[1], i);
    uint32_t v = kl_eval_node(&ev, n->src[1]);
    kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, ok, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t dst =
        kiln_k2(k, KILN_KOP_ADD,
                kiln_k2(k, KILN_KOP_MUL,
                        kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, h, kiln_ki(k, (int32_t)max_ctx)), pos),
                        kiln_ki(k, (int32_t)hd)),
                e);
    /* the scatter's result aliases its state: store through the state's own slot */
    kl_store(k, kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], true), (kiln_dtype)st->dtype, dst, v);
    kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    for (uint32_t o = 0; o < r->n_outs; o++)
        if (r->outs[o] != node) kl_store_node(k, g, r->outs[o], i, kl_eval_node(&ev, r->outs[o]));
    kl_loop_end(k);
    if (ev.failed) {
        kiln_kir_free(k);
        return kl_unsupported(err, n_err, "kv_scatter kernel: %s", ev.err);
    }
    return KILN_OK;
}

/* Copies element si of node src to element di of node dst, bit-exactly (same plain dtype). */
static void copy_elem(kiln_kir *k, const kiln_graph *g, uint32_t src, uint32_t si, uint32_t dst, uint32_t di)
{
    kiln_dtype t = (kiln_dtype)g->nodes[dst].dtype;
    uint32_t ss = kiln_kir_buf(k, KILN_KBUF_NODE, src, false), ds = kiln_kir_buf(k, KILN_KBUF_NODE, dst, true);
    if (kiln_dtype_block_bytes(t) == 4) {
        kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, di,
                    kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, si, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)ss),
                    KILN_IDX_NONE, (int32_t)ds);
    } else {
        uint32_t w = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_k2(k, KILN_KOP_SHR, si, kiln_ki(k, 1)),
                                 KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)ss);
        uint32_t sh = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_U32,
                                  kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_AND, si, kiln_ki(k, 1)), kiln_ki(k, 16)),
                                  KILN_IDX_NONE, KILN_IDX_NONE, 0);
        kiln_kir_op(k, KILN_KOP_ST16, KILN_KT_NONE, di, kiln_k2(k, KILN_KOP_SHR, w, sh), KILN_IDX_NONE, (int32_t)ds);
    }
}

/* transpose and concat: one output element per thread, its source found from its coordinates. */
static kiln_status lower_layout(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                                char *err, size_t n_err)
{
    uint32_t node = r->anchor;
    const kiln_node_rec *n = &g->nodes[node];
    if (r->n_nodes != 1 || kiln_dtype_block((kiln_dtype)n->dtype) != 1)
        return kl_unsupported(err, n_err, "%s with fused ops", kiln_op_name((enum kiln_op)n->op));
    bool tr = n->op == KILN_OP_TRANSPOSE;
    kiln_kir_init(k, tr ? "kiln_transpose" : "kiln_concat", 256);
    snprintf(k->what, sizeof k->what, "%s %s", kiln_op_name((enum kiln_op)n->op),
             kiln_dtype_name((kiln_dtype)n->dtype));
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, n), 256);
    int rank = n->rank;
    uint32_t total = kl_numel_from(k, n, 0);
    uint32_t i = kl_grid_loop(k, total);
    uint32_t c[KILN_MAX_RANK], rem = i;
    for (int d = rank - 1; d >= 0; d--) { /* coordinates of output element i */
        uint32_t dd = kl_dim(k, n->dims[d]);
        c[d] = kiln_k2(k, KILN_KOP_REM, rem, dd);
        rem = kiln_k2(k, KILN_KOP_DIV, rem, dd);
    }
    if (tr) {
        const kiln_node_rec *x = &g->nodes[n->src[0]];
        int a = n->i[0], b = n->i[1];
        uint32_t t = c[a];
        c[a] = c[b];
        c[b] = t;
        uint32_t si = kiln_ki(k, 0);
        for (int d = 0; d < rank; d++)
            si = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, si, kl_dim(k, x->dims[d])), c[d]);
        copy_elem(k, g, n->src[0], si, node, i);
    } else {
        int ax = n->i[0];
        const kiln_node_rec *a = &g->nodes[n->src[0]], *b = &g->nodes[n->src[1]];
        uint32_t na = kl_dim(k, a->dims[ax]);
        uint32_t in_a = kiln_k2(k, KILN_KOP_LT, c[ax], na);
        uint32_t ia = kiln_ki(k, 0), ib = kiln_ki(k, 0);
        for (int d = 0; d < rank; d++) {
            ia = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, ia, kl_dim(k, a->dims[d])), c[d]);
            uint32_t cb = d == ax ? kiln_k2(k, KILN_KOP_SUB, c[d], na) : c[d];
            ib = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, ib, kl_dim(k, b->dims[d])), cb);
        }
        kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, in_a, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        copy_elem(k, g, n->src[0], ia, node, i);
        kiln_kir_op(k, KILN_KOP_ELSE, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        copy_elem(k, g, n->src[1], ib, node, i);
        kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    }
    kl_loop_end(k);
    return KILN_OK;
}

/* A cast to the dtype it already has (i32 -> i32 cannot go through f32): a bit copy. */
kiln_status kiln_lower_copy(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k)
{
    uint32_t node = r->anchor;
    const kiln_node_rec *n = &g->nodes[node];
    kiln_kir_init(k, "kiln_copy", 256);
    snprintf(k->what, sizeof k->what, "copy %s", kiln_dtype_name((kiln_dtype)n->dtype));
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, n), 256);
    uint32_t i = kl_grid_loop(k, kl_numel_from(k, n, 0));
    copy_elem(k, g, n->src[0], i, node, i);
    kl_loop_end(k);
    return KILN_OK;
}

kiln_status kiln_lower_move(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                            char *err, size_t n_err)
{
    enum kiln_op op = (enum kiln_op)g->nodes[r->anchor].op;
    if (op == KILN_OP_TRANSPOSE || op == KILN_OP_CONCAT) return lower_layout(g, r, tg, k, err, n_err);
    if (op == KILN_OP_GET_ROWS) return lower_get_rows(g, r, tg, k, err, n_err);
    if (op == KILN_OP_MOE_MATMUL) return kiln_lower_moe_matmul(g, r, tg, k, err, n_err);
    if (op == KILN_OP_KV_SCATTER || r->kind == KILN_REGION_SCATTER) return lower_scatter(g, r, tg, k, err, n_err);
    return kl_unsupported(err, n_err, "no GPU kernel for %s yet", kiln_op_name(op));
}
