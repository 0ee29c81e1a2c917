/* Move template: kv_scatter (rows written into a state at run-time positions) and get_rows
 * (embedding lookup, any weight dtype); one element (or one block value) per thread. Positions
 * and ids out of range are skipped, never written out of bounds (the executor checks bound inputs
 * on the host first and reports them). Must not compute anything but copies and dequantization. */
#include "codegen/lower.h"

/* F32 value of element `col` (0..k-1) of row `row` of a weight of dtype t in its device layout. */
static uint32_t load_block_elem(kiln_kir *k, uint32_t slot, kiln_dtype t, int64_t kdim, int64_t rows, uint32_t row, uint32_t col)
{
    if (kiln_dtype_block(t) == 1)
        return kl_load(k, slot, t, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)kdim)), col));
    int64_t nb_row = kdim / kiln_dtype_block(t);
    uint32_t e = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)kdim)), col); /* flat value index */
    if (t == KILN_DTYPE_Q8_0) {
        uint32_t w = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_k2(k, KILN_KOP_SHR, e, kiln_ki(k, 2)), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
        uint32_t sh = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_U32, kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_AND, e, kiln_ki(k, 3)), kiln_ki(k, 3)), KILN_IDX_NONE, KILN_IDX_NONE, 0);
        uint32_t q = kiln_kir_op(k, KILN_KOP_BFE, KILN_KT_I32, kiln_k2(k, KILN_KOP_SHR, w, sh), KILN_IDX_NONE, KILN_IDX_NONE, 8 << 8);
        int64_t qbytes = (rows * kdim + 15) / 16 * 16;
        uint32_t b = kiln_k2(k, KILN_KOP_SHR, e, kiln_ki(k, 5)); /* block index = flat / 32 */
        uint32_t d = kl_load(k, slot, KILN_DTYPE_F16, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, (int32_t)(qbytes / 2)), b));
        return kiln_k2(k, KILN_KOP_MUL, d, kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_F32, q, KILN_IDX_NONE, KILN_IDX_NONE, 0));
    }
    (void)nb_row;
    return KILN_IDX_NONE; /* k-quants: see the gemv dequantizers (get_rows of k-quants is not lowered) */
}

static kiln_status lower_get_rows(const kiln_graph *g, const kiln_region *r, kiln_kir *k, char *err, size_t n_err)
{
    uint32_t node = r->anchor;
    const kiln_node_rec *n = &g->nodes[node], *tab = &g->nodes[n->src[0]];
    kiln_dtype t = (kiln_dtype)tab->dtype;
    if (r->n_nodes != 1) return kl_unsupported(err, n_err, "get_rows with fused ops");
    if (kiln_dtype_block(t) != 1 && t != KILN_DTYPE_Q8_0) return kl_unsupported(err, n_err, "get_rows of %s", kiln_dtype_name(t));
    if (tab->rank != 2 || kiln_dim_is_sym(tab->dims[0]) || kiln_dim_is_sym(tab->dims[1])) return kl_unsupported(err, n_err, "get_rows: table must be a constant [V, D]");
    int64_t V = tab->dims[0], D = tab->dims[1];
    kiln_kir_init(k, "kiln_get_rows", 256);
    snprintf(k->what, sizeof k->what, "get_rows %s", kiln_dtype_name(t));
    k->grid[0] = kl_grid_for(kl_numel_max(g, n), 256);
    uint32_t total = kl_numel_from(k, n, 0);
    uint32_t slot = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], false);
    uint32_t i = kl_grid_loop(k, total);
    uint32_t row = kiln_k2(k, KILN_KOP_DIV, i, kiln_ki(k, (int32_t)D)), col = kiln_k2(k, KILN_KOP_REM, i, kiln_ki(k, (int32_t)D));
    uint32_t id = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32,
                              kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, row, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)kiln_kir_buf(k, KILN_KBUF_NODE, n->src[1], false)),
                              KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t ok = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), id), kiln_k2(k, KILN_KOP_LT, id, kiln_ki(k, (int32_t)V)));
    kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, ok, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kl_store_node(k, g, node, i, load_block_elem(k, slot, t, D, V, id, col));
    kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kl_loop_end(k);
    return KILN_OK;
}

/* kv_scatter: state[h, pos[t], :] = rows[t, h, :]. The region may carry elementwise ops that
 * produce the rows (evaluated per element). */
static kiln_status lower_scatter(const kiln_graph *g, const kiln_region *r, kiln_kir *k, char *err, size_t n_err)
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
    if (kiln_dtype_block((kiln_dtype)st->dtype) != 1 || st->rank != 3 || rows->rank != 3)
        return kl_unsupported(err, n_err, "kv_scatter into a %s state", kiln_dtype_name((kiln_dtype)st->dtype));
    for (int d = 0; d < 3; d++)
        if (kiln_dim_is_sym(st->dims[d])) return kl_unsupported(err, n_err, "kv_scatter: state dims must be constants");
    int64_t n_kvh = st->dims[0], max_ctx = st->dims[1], hd = st->dims[2];
    kiln_kir_init(k, "kiln_kv_scatter", 256);
    snprintf(k->what, sizeof k->what, "kv_scatter %s", kiln_dtype_name((kiln_dtype)st->dtype));
    k->grid[0] = kl_grid_for(kl_numel_max(g, rows), 256);
    uint32_t total = kl_numel_from(k, rows, 0);
    uint32_t i = kl_grid_loop(k, total);
    uint32_t per_tok = kiln_ki(k, (int32_t)(n_kvh * hd));
    uint32_t t = kiln_k2(k, KILN_KOP_DIV, i, per_tok), rem = kiln_k2(k, KILN_KOP_REM, i, per_tok);
    uint32_t h = kiln_k2(k, KILN_KOP_DIV, rem, kiln_ki(k, (int32_t)hd)), e = kiln_k2(k, KILN_KOP_REM, rem, kiln_ki(k, (int32_t)hd));
    uint32_t pos = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32,
                               kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, t, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false)),
                               KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t ok = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), pos), kiln_k2(k, KILN_KOP_LT, pos, kiln_ki(k, (int32_t)max_ctx)));
    kl_eval ev;
    kl_eval_init(&ev, k, g, r, n->src[1], i);
    uint32_t v = kl_eval_node(&ev, n->src[1]);
    kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, ok, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t dst = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, h, kiln_ki(k, (int32_t)max_ctx)), pos), kiln_ki(k, (int32_t)hd)), e);
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

kiln_status kiln_lower_move(const kiln_graph *g, const kiln_region *r, kiln_kir *k, char *err, size_t n_err)
{
    enum kiln_op op = (enum kiln_op)g->nodes[r->anchor].op;
    if (op == KILN_OP_GET_ROWS) return lower_get_rows(g, r, k, err, n_err);
    if (op == KILN_OP_KV_SCATTER || r->kind == KILN_REGION_SCATTER) return lower_scatter(g, r, k, err, n_err);
    return kl_unsupported(err, n_err, "no GPU kernel for %s yet", kiln_op_name(op));
}
