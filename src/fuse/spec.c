/* Region specs: the structure of each region (a matmul region's siblings, shared input, rms_norm
 * prologue and per-output epilogues; an attention anchor's operands, keys and grouping; a rows
 * region's op), computed once
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

/* Operand slots inside region r that read node (aliases are outside any region, so a reshape
 * reading node counts as a reader only through kiln_region_is_out). */
static int readers_in(const kiln_graph *g, const kiln_region *r, uint32_t node)
{
    int c = 0;
    for (uint32_t i = 0; i < r->n_nodes; i++)
        for (int s = 0; s < g->nodes[r->nodes[i]].n_src; s++) c += g->nodes[r->nodes[i]].src[s] == node;
    return c;
}

/* node, seen through reshapes (which live outside regions). */
static uint32_t through_reshapes(const kiln_graph *g, uint32_t node)
{
    for (int d = 0; d < 8 && node != KILN_IDX_NONE && g->nodes[node].op == KILN_OP_RESHAPE; d++) node = g->nodes[node].src[0];
    return node;
}

/* Region node n as an add of out j's value that the matmul pass can take: a bias right after the
 * matmul (an [N] operand from outside, the matmul read by nothing else), else one residual add. */
static bool take_add(const kiln_graph *g, const kiln_region *r, uint32_t mm, kiln_spec_out *o, uint32_t i)
{
    const kiln_node_rec *n = &g->nodes[i];
    if (n->op != KILN_OP_ADD) return false;
    uint32_t b = n->src[1];
    const kiln_node_rec *m = &g->nodes[mm];
    if (n->src[0] == mm && o->dst == mm && !kiln_region_is_out(r, mm) && readers_in(g, r, mm) == 1 &&
        g->nodes[b].rank == 1 && g->nodes[b].dims[0] == m->dims[m->rank - 1] && !kiln_region_has(r, b)) {
        o->bias = b, o->bias_add = o->dst = i;
        return true;
    }
    if (o->resid != KILN_IDX_NONE || kiln_region_is_out(r, o->dst) || readers_in(g, r, o->dst) != 1 ||
        (n->src[0] == o->dst) == (n->src[1] == o->dst) || g->nodes[n->src[0]].rank != g->nodes[n->src[1]].rank)
        return false;
    uint32_t other = n->src[0] == o->dst ? n->src[1] : n->src[0];
    if (kiln_region_has(r, other)) return false;
    o->resid = other, o->resid_add = o->dst = i;
    return true;
}

/* Region node i as the swiglu of outs 0 and 1 (plain matmuls read by nothing else). */
static bool take_swiglu(const kiln_graph *g, const kiln_region *r, kiln_region_spec *s, uint32_t i)
{
    const kiln_node_rec *n = &g->nodes[i];
    if (n->op != KILN_OP_SWIGLU || s->n_mm != 2 || s->swiglu || n->src[0] != s->out[0].dst || n->src[1] != s->out[1].dst)
        return false;
    for (int j = 0; j < 2; j++)
        if (s->out[j].dst != s->mm[j] || kiln_region_is_out(r, s->mm[j]) || readers_in(g, r, s->mm[j]) != 1) return false;
    s->out[0].dst = i;
    return s->swiglu = true;
}

/* Per output: the add/swiglu chain the matmul pass stores, then a rope of that value and a KV write. */
static void matmul_epilogues(const kiln_graph *g, const kiln_region *r, kiln_region_spec *s)
{
    for (uint32_t j = 0; j < s->n_mm; j++)
        s->out[j] = (kiln_spec_out){.dst = s->mm[j], .bias = KILN_IDX_NONE, .bias_add = KILN_IDX_NONE,
                                    .resid = KILN_IDX_NONE, .resid_add = KILN_IDX_NONE, .rope = KILN_IDX_NONE, .kv = KILN_IDX_NONE};
    for (uint32_t k = 0; k < r->n_nodes; k++) {
        uint32_t i = r->nodes[k];
        if (g->nodes[i].op == KILN_OP_MATMUL || i == s->norm) continue;
        for (uint32_t j = 0; j < s->n_mm; j++)
            if (take_add(g, r, s->mm[j], &s->out[j], i) || (j == 0 && take_swiglu(g, r, s, i))) break;
    }
    for (uint32_t k = 0; k < r->n_nodes; k++) {
        uint32_t i = r->nodes[k];
        const kiln_node_rec *n = &g->nodes[i];
        for (uint32_t j = 0; j < s->n_mm; j++) {
            kiln_spec_out *o = &s->out[j];
            if (n->op == KILN_OP_ROPE && through_reshapes(g, n->src[0]) == o->dst && o->rope == KILN_IDX_NONE) o->rope = i;
            uint32_t from = n->op == KILN_OP_KV_SCATTER ? through_reshapes(g, n->src[1]) : KILN_IDX_NONE;
            if (from != KILN_IDX_NONE && (from == o->rope || from == o->dst) && o->kv == KILN_IDX_NONE) o->kv = i;
        }
    }
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
    matmul_epilogues(g, r, s);
}

static void attention_spec(const kiln_graph *g, const kiln_region *r, kiln_region_spec *s)
{
    const kiln_node_rec *n = &g->nodes[r->anchor];
    if (n->op != KILN_OP_ATTENTION && n->op != KILN_OP_PAGED_ATTENTION) return; /* attention written as ops: no spec */
    s->q = n->src[0], s->k = n->src[1], s->v = n->src[2];
    s->n_kv = n->op == KILN_OP_ATTENTION ? n->dim : 0;
    if (n->op == KILN_OP_PAGED_ATTENTION) {
        s->pos = n->src[3], s->seqs = n->src[4], s->blocks = n->src[5], s->block = n->i[0];
        s->parents = n->n_src > 6 ? n->src[6] : KILN_IDX_NONE;
    }
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
    s->x_in = s->x = s->norm = s->norm_w = s->q = s->k = s->v = s->pos = s->seqs = s->blocks = s->parents = KILN_IDX_NONE;
    switch ((enum kiln_region_kind)r->kind) {
    case KILN_REGION_MATMUL: matmul_spec(g, r, s); break;
    case KILN_REGION_ATTENTION: attention_spec(g, r, s); break;
    case KILN_REGION_ROWS: s->row_op = g->nodes[r->anchor].op; break;
    default: break;
    }
}
