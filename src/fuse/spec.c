/* Region specs: the structure of each region (a matmul region's siblings, shared input and rms_norm
 * prologue; an attention anchor's operands, keys and grouping; a rows region's op), computed once
 * when fusion makes the region, and read by every consumer (GPU lowering, the cpu backend, the
 * cost model). Must not decide what fuses (rules.c does) nor know any backend. */
#include "fuse/fuse.h"

#include <string.h>

bool kiln_region_has(const kiln_region *r, uint32_t node)
{
    for (uint32_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i] == node) return true;
    return false;
}

bool kiln_region_is_out(const kiln_region *r, uint32_t node)
{
    for (uint32_t i = 0; i < r->n_outs; i++)
        if (r->outs[i] == node) return true;
    return false;
}

static void matmul_spec(const kiln_graph *g, const kiln_region *r, kiln_region_spec *s)
{
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[r->nodes[i]];
        if (n->op != KILN_OP_MATMUL) continue;
        if (s->n_mm == KILN_SPEC_MM || (s->x_in != KILN_IDX_NONE && n->src[0] != s->x_in)) {
            s->mm_mixed = true;
            s->n_mm = 0;
            return;
        }
        s->x_in = n->src[0];
        s->mm[s->n_mm++] = r->nodes[i];
    }
    if (!s->n_mm) return;
    s->x = s->x_in;
    const kiln_node_rec *xn = &g->nodes[s->x_in];
    if (xn->op == KILN_OP_RMS_NORM && kiln_region_has(r, s->x_in)) {
        s->norm = s->x_in;
        s->norm_w = xn->src[1];
        s->eps = xn->f[0];
        s->x = xn->src[0];
    }
}

static void attention_spec(const kiln_graph *g, const kiln_region *r, kiln_region_spec *s)
{
    const kiln_node_rec *n = &g->nodes[r->anchor];
    if (n->op != KILN_OP_ATTENTION) return; /* attention written as ops: no spec */
    s->q = n->src[0], s->k = n->src[1], s->v = n->src[2];
    s->n_kv = n->dim;
    s->scale = n->f[0];
    const kiln_node_rec *q = &g->nodes[s->q], *kc = &g->nodes[s->k];
    int64_t n_head = q->dims[1], n_kvh = kc->dims[0];
    if (!kiln_dim_is_sym(n_head) && !kiln_dim_is_sym(n_kvh) && n_kvh > 0 && n_head % n_kvh == 0)
        s->heads_per_group = n_head / n_kvh;
}

void kiln_fuse_spec(const kiln_graph *g, kiln_region *r)
{
    kiln_region_spec *s = &r->spec;
    memset(s, 0, sizeof *s);
    s->x_in = s->x = s->norm = s->norm_w = s->q = s->k = s->v = KILN_IDX_NONE;
    switch ((enum kiln_region_kind)r->kind) {
    case KILN_REGION_MATMUL: matmul_spec(g, r, s); break;
    case KILN_REGION_ATTENTION: attention_spec(g, r, s); break;
    case KILN_REGION_ROWS: s->row_op = g->nodes[r->anchor].op; break;
    default: break;
    }
}
