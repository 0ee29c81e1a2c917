/* Map template: a fused chain of elementwise ops, one element per thread in a grid-stride loop;
 * operands outside the region are loaded with broadcasting, every region output is stored.
 * Must not handle row ops (lower_rows.c) or matmul epilogues (lower_gemv.c). */
#include "codegen/lower.h"

kiln_status kiln_lower_map(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                           char *err, size_t n_err)
{
    uint32_t space = r->nodes[r->n_nodes - 1];
    const kiln_node_rec *a = &g->nodes[r->anchor];
    if (r->n_nodes == 1 && a->op == KILN_OP_CAST && a->dtype == g->nodes[a->src[0]].dtype)
        return kiln_lower_copy(g, r, tg, k);
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[r->nodes[i]];
        if (!kl_is_elementwise((enum kiln_op)n->op))
            return kl_unsupported(err, n_err, "map kernel: %s is not elementwise", kiln_op_name((enum kiln_op)n->op));
        if (!kl_same_numel(n, &g->nodes[space]))
            return kl_unsupported(err, n_err, "map kernel: %s #%u has another element count than the region's last op",
                                  kiln_op_name((enum kiln_op)n->op), r->nodes[i]);
        if (kiln_dtype_block((kiln_dtype)n->dtype) != 1)
            return kl_unsupported(err, n_err, "map kernel: %s result", kiln_dtype_name((kiln_dtype)n->dtype));
    }
    kiln_kir_init(k, "kiln_map", 256);
    k->grid[0] = kl_grid_for(tg, kl_numel_max(g, &g->nodes[space]), 256);
    snprintf(k->what, sizeof k->what, "map: %u ops", r->n_nodes);
    uint32_t n = kl_numel_from(k, &g->nodes[space], 0);
    uint32_t i = kl_grid_loop(k, n);
    kl_eval e;
    kl_eval_init(&e, k, g, r, space, i);
    for (uint32_t o = 0; o < r->n_outs; o++) {
        uint32_t v = kl_eval_node(&e, r->outs[o]);
        kl_store_node(k, g, r->outs[o], i, v);
    }
    kl_loop_end(k);
    if (e.failed) {
        kiln_kir_free(k);
        return kl_unsupported(err, n_err, "map kernel: %s", e.err);
    }
    return KILN_OK;
}
