/* Fusion rules (DESIGN.md, Fusion), applied in one topological pass over a const graph:
 *  1. an elementwise op joins the region of its operand when it is that operand's only reader
 *     and has its shape (chains merge; epilogues of matmuls, maps, norm/softmax row kernels and
 *     get_rows lookups);
 *  2. rms_norm read only by matmuls (as x) becomes their prologue;
 *  3. matmuls reading the same x merge into one multi-output region (Q/K/V, gate/up), up to 4;
 *  4. matmul epilogues: bias add, residual add and swiglu (via 1), rope on a reshaped (biased)
 *     Q/K, kv_scatter of the roped K or the reshaped (biased) V;
 *  5. softmax(scale(q . k^T) [+ mask]) . v written as ops (v given as transpose(v) or as [d, S])
 *     becomes one attention region: the [T, S] scores never reach memory;
 *  6. an rms_norm of adds after an all_reduce anchors those adds' region (the all-reduce's epilogue);
 *  7. a rope whose input is an rms_norm it alone reads (qwen3's and gemma3's per-head q/k norms)
 *     joins the norm's row kernel, and a kv_scatter of that rope joins it too (rule 4's chain).
 * Every merge keeps regions convex: all operands from outside a region are ready before it. */
#include "fuse/fuse.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SIBLINGS 4

typedef struct fuse_state {
    const kiln_graph *g;      /* graph */
    uint32_t         *group;  /* group id of each node (KILN_IDX_NONE: no kernel) */
    uint32_t         *anchor; /* anchor_of[gid] */
    uint32_t         *first;  /* first[gid]: smallest member index */
    uint32_t         *last;   /* last[gid]: largest member index */
    uint32_t         *n_mm;   /* n_mm[gid]: matmuls in the group */
    uint32_t         *readers;/* readers[i]: how many operand slots (and outputs) read node i */
    uint8_t          *kind;   /* kind_of[gid]: region kind decided by a rule (0: the anchor's) */
} fuse_state;

static bool is_map(uint8_t op)
{
    return kiln_fuse_kind_of((enum kiln_op)op) == KILN_REGION_MAP;
}

/* Follows reshape/view to the node that produced the data. */
static uint32_t producer(const kiln_graph *g, uint32_t s)
{
    while (s != KILN_IDX_NONE && (g->nodes[s].op == KILN_OP_RESHAPE || g->nodes[s].op == KILN_OP_VIEW))
        s = g->nodes[s].src[0];
    return s;
}

/* True when s is available before group G starts: a leaf, or from a group entirely before G. */
static bool ready_before(const fuse_state *f, uint32_t s, uint32_t gid)
{
    s = producer(f->g, s);
    if (s == KILN_IDX_NONE || f->group[s] == KILN_IDX_NONE) return true;
    uint32_t h = f->group[s];
    return h != gid && f->last[h] < f->first[gid];
}

static void merge(fuse_state *f, uint32_t from, uint32_t into)
{
    if (from == into) return;
    for (uint32_t i = 0; i < f->g->n_nodes; i++)
        if (f->group[i] == from) f->group[i] = into;
    if (f->first[from] < f->first[into]) f->first[into] = f->first[from];
    if (f->last[from] > f->last[into]) f->last[into] = f->last[from];
    f->n_mm[into] += f->n_mm[from];
    /* The anchor stays the one of `into` unless `into` is a map and `from` has a stronger anchor. */
    if (is_map(f->g->nodes[f->anchor[into]].op) && !is_map(f->g->nodes[f->anchor[from]].op))
        f->anchor[into] = f->anchor[from];
}

/* Adds node i (its own singleton group) to group gid when all its other operands are ready. */
static bool join(fuse_state *f, uint32_t i, uint32_t gid)
{
    const kiln_node_rec *n = &f->g->nodes[i];
    for (int s = 0; s < n->n_src; s++) {
        uint32_t src = n->src[s];
        if (src == KILN_IDX_NONE) continue;
        uint32_t p = producer(f->g, src);
        if (p != KILN_IDX_NONE && f->group[p] == gid) continue;
        if (!ready_before(f, src, gid)) return false;
    }
    f->last[gid] = i > f->last[gid] ? i : f->last[gid];
    merge(f, f->group[i], gid);
    return true;
}

static bool same_dims(const kiln_node_rec *a, const kiln_node_rec *b)
{
    return a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0;
}

/* A norm or softmax anchoring a plain row region of its own (not one rule 6 made): its row kernel
 * applies elementwise epilogues before its stores. */
static bool is_row_anchor(const fuse_state *f, uint32_t src)
{
    uint8_t op = f->g->nodes[src].op;
    uint32_t gid = f->group[src];
    return (op == KILN_OP_RMS_NORM || op == KILN_OP_LAYER_NORM || op == KILN_OP_SOFTMAX) && f->anchor[gid] == src &&
           !f->kind[gid];
}

/* A get_rows anchoring a region of its own: the lookup kernel applies elementwise epilogues before
 * its stores (gemma's embedding scale). */
static bool is_lookup_anchor(const fuse_state *f, uint32_t src)
{
    uint32_t gid = f->group[src];
    return f->g->nodes[src].op == KILN_OP_GET_ROWS && f->anchor[gid] == src && !f->kind[gid];
}

/* Rule 1/4: elementwise op i joins the group of an operand it alone reads (a matmul's, a map's, a
 * norm's row kernel: gemma's post-norm and its residual add are one kernel; or an embedding lookup). */
static void rule_epilogue(fuse_state *f, uint32_t i)
{
    const kiln_node_rec *n = &f->g->nodes[i];
    for (int s = 0; s < n->n_src; s++) {
        uint32_t src = n->src[s];
        if (src == KILN_IDX_NONE || f->group[src] == KILN_IDX_NONE || f->readers[src] != 1) continue;
        const kiln_node_rec *m = &f->g->nodes[src];
        if (!same_dims(m, n)) continue;
        if (m->op != KILN_OP_MATMUL && !is_map(m->op) && !is_row_anchor(f, src) && !is_lookup_anchor(f, src))
            continue; /* attention: not yet */
        uint32_t gid = f->group[src];
        if (f->kind[gid] == KILN_REGION_ATTENTION) continue; /* rule 5's kernel writes only its anchor */
        if (n->op == KILN_OP_SWIGLU) { /* both halves must come from the same group */
            uint32_t other = n->src[1 - s];
            if (f->group[other] != gid || f->readers[other] != 1) continue;
        }
        if (join(f, i, gid)) return;
    }
}

/* Rule 2/3: matmul i merges with an earlier sibling reading the same x, and absorbs an rms_norm x. */
static void rule_matmul(fuse_state *f, uint32_t i)
{
    const kiln_graph *g = f->g;
    const kiln_node_rec *n = &g->nodes[i];
    if (g->nodes[n->src[1]].op != KILN_OP_WEIGHT) return;
    uint32_t x = n->src[0];
    for (uint32_t j = 0; j < i; j++) {
        const kiln_node_rec *m = &g->nodes[j];
        if (m->op != KILN_OP_MATMUL || m->src[0] != x || f->group[j] == i) continue;
        uint32_t gid = f->group[j];
        if (g->nodes[m->src[1]].op != KILN_OP_WEIGHT || f->n_mm[gid] >= MAX_SIBLINGS) continue;
        if (join(f, i, gid)) return;
    }
    /* No sibling: an rms_norm x read only by matmuls becomes the prologue. */
    const kiln_node_rec *xn = &g->nodes[x];
    if (xn->op != KILN_OP_RMS_NORM || f->group[x] != x) return;
    uint32_t mm_readers = 0;
    for (uint32_t j = x + 1; j < g->n_nodes; j++)
        for (int s = 0; s < g->nodes[j].n_src; s++)
            if (g->nodes[j].src[s] == x) mm_readers += g->nodes[j].op == KILN_OP_MATMUL && s == 0;
    if (mm_readers != f->readers[x]) return;
    uint32_t gid = f->group[i];
    if (join(f, x, gid)) f->anchor[gid] = i;
}

/* A bias add: a [.., N] value plus a rank-1 [N] operand broadcast over its rows. */
static bool is_bias_add(const kiln_graph *g, const kiln_node_rec *m)
{
    return m->op == KILN_OP_ADD && m->src[1] != KILN_IDX_NONE && g->nodes[m->src[1]].rank == 1 &&
           g->nodes[m->src[0]].rank > 1;
}

/* Rule 7: rope i of a per-head rms_norm that only it reads joins the norm's row region (the row
 * kernel normalizes a head, then turns its pairs: the normalized head never reaches memory). */
static bool rule_rope_after_norm(fuse_state *f, uint32_t i)
{
    const kiln_graph *g = f->g;
    uint32_t src = g->nodes[i].src[0];
    if (g->nodes[src].op != KILN_OP_RMS_NORM || f->readers[src] != 1 || !is_row_anchor(f, src) ||
        !same_dims(&g->nodes[src], &g->nodes[i]))
        return false;
    return join(f, i, f->group[src]);
}

/* Rule 4: rope of a reshaped (and biased) matmul output, and kv_scatter of such a rope or reshaped matmul. */
static void rule_rope_scatter(fuse_state *f, uint32_t i)
{
    const kiln_graph *g = f->g;
    const kiln_node_rec *n = &g->nodes[i];
    if (n->op == KILN_OP_ROPE && rule_rope_after_norm(f, i)) return;
    /* a q8_0 pool's rows are quantized in blocks of 32 values by a scatter kernel of its own (a
     * matmul epilogue stores elements one by one) */
    if (n->op == KILN_OP_KV_SCATTER && kiln_dtype_block((kiln_dtype)g->nodes[n->src[0]].dtype) > 1) return;
    uint32_t src = n->op == KILN_OP_ROPE ? n->src[0] : n->src[1];
    /* Each link of the chain (matmul -> reshape -> [rope] -> here) must have this node as only reader. */
    for (uint32_t s = src; s != KILN_IDX_NONE;) {
        if (f->readers[s] != 1) return;
        const kiln_node_rec *m = &g->nodes[s];
        if (m->op == KILN_OP_RESHAPE) { s = m->src[0]; continue; }
        if (is_bias_add(g, m)) { s = m->src[0]; continue; } /* q/k/v biases (qwen2) sit between */
        if (m->op == KILN_OP_ROPE && n->op == KILN_OP_KV_SCATTER && f->group[s] != s) {
            join(f, i, f->group[s]);
            return;
        }
        if (m->op == KILN_OP_MATMUL) join(f, i, f->group[s]);
        return;
    }
}

/* Rule 6: the rms_norm of a residual sum after an all_reduce (a split plan's row-parallel output, its
 * bias and residual adds: one map region) becomes that region's anchor: one row kernel right after
 * the collective (the add, the norm, both stored) instead of a map kernel and a norm prologue
 * re-evaluated inside the next matmul. The host path of a split plan does it in one pass (group.c). */
static void rule_norm_after_reduce(fuse_state *f, uint32_t i)
{
    const kiln_graph *g = f->g;
    uint32_t x = g->nodes[i].src[0], gid = x == KILN_IDX_NONE ? KILN_IDX_NONE : f->group[x];
    if (gid == KILN_IDX_NONE || f->kind[gid] || !is_map(g->nodes[f->anchor[gid]].op) || !same_dims(&g->nodes[x], &g->nodes[i]))
        return;
    bool after_reduce = false;
    for (uint32_t j = f->first[gid]; j <= f->last[gid]; j++)
        for (int s = 0; f->group[j] == gid && s < g->nodes[j].n_src; s++)
            after_reduce |= g->nodes[j].src[s] != KILN_IDX_NONE && g->nodes[g->nodes[j].src[s]].op == KILN_OP_ALL_REDUCE;
    if (after_reduce && join(f, i, gid)) {
        f->anchor[gid] = i;
        f->kind[gid] = KILN_REGION_ROWS;
    }
}

/* Rule 5: matmul i = softmax(...) . v; walks back softmax <- [add mask] <- [scale] <- matmul(q, k).
 * Every link must be f32, read only by the next one, and alone in its group (or with earlier links). */
static void rule_attention(fuse_state *f, uint32_t i)
{
    const kiln_graph *g = f->g;
    uint32_t chain[6], n = 0, p = g->nodes[i].src[0], w = g->nodes[i].src[1];
    if (g->nodes[p].op != KILN_OP_SOFTMAX || f->readers[p] != 1) return;
    if (g->nodes[w].op == KILN_OP_TRANSPOSE && f->readers[w] == 1 && g->nodes[w].rank == 2) chain[n++] = w;
    chain[n++] = p;
    uint32_t s = g->nodes[p].src[0];
    if (g->nodes[s].op == KILN_OP_ADD && f->readers[s] == 1) chain[n++] = s, s = g->nodes[s].src[0];
    if (g->nodes[s].op == KILN_OP_SCALE && f->readers[s] == 1) chain[n++] = s, s = g->nodes[s].src[0];
    if (g->nodes[s].op != KILN_OP_MATMUL || f->readers[s] != 1 || g->nodes[g->nodes[s].src[1]].rank != 2) return;
    chain[n++] = s;
    const kiln_node_rec *q = &g->nodes[g->nodes[s].src[0]];
    if (q->rank != 2 || q->dtype != KILN_DTYPE_F32 || g->nodes[p].rank != 2) return;
    /* Links must not share a group with anything outside the chain. */
    uint32_t lo = i;
    for (uint32_t k = 0; k < n; k++) lo = chain[k] < lo ? chain[k] : lo;
    for (uint32_t j = lo; j <= i; j++) {
        bool in_chain = j == i;
        for (uint32_t k = 0; k < n; k++) in_chain |= chain[k] == j;
        for (uint32_t k = 0; k < n && !in_chain && f->group[j] != KILN_IDX_NONE; k++)
            if (f->group[j] == f->group[chain[k]]) return;
    }
    /* External operands (q, k, mask, v) must be ready before the first link. */
    for (uint32_t k = 0; k <= n; k++) {
        const kiln_node_rec *m = &g->nodes[k < n ? chain[k] : i];
        for (int o = 0; o < m->n_src; o++) {
            uint32_t src = producer(g, m->src[o]), h;
            bool inside = src == i;
            for (uint32_t c = 0; c < n; c++) inside |= chain[c] == src;
            if (inside || src == KILN_IDX_NONE || (h = f->group[src]) == KILN_IDX_NONE) continue;
            if (f->last[h] >= lo) return;
        }
    }
    uint32_t gid = f->group[i];
    for (uint32_t k = 0; k < n; k++) merge(f, f->group[chain[k]], gid);
    f->anchor[gid] = i;
    f->kind[gid] = KILN_REGION_ATTENTION;
}

void kiln_fuse_apply_rules(const kiln_graph *g, uint32_t *group, uint32_t *anchor_of, uint8_t *kind_of)
{
    uint32_t n = g->n_nodes;
    fuse_state f = {.g = g, .group = group, .anchor = anchor_of, .kind = kind_of};
    f.first = malloc((n + 1) * sizeof *f.first);
    f.last = malloc((n + 1) * sizeof *f.last);
    f.n_mm = malloc((n + 1) * sizeof *f.n_mm);
    f.readers = calloc(n + 1, sizeof *f.readers);
    if (!f.first || !f.last || !f.n_mm || !f.readers) goto out; /* out of memory: leave it unfused */
    for (uint32_t i = 0; i < n; i++) {
        f.first[i] = f.last[i] = i;
        f.n_mm[i] = g->nodes[i].op == KILN_OP_MATMUL;
        for (int s = 0; s < g->nodes[i].n_src; s++)
            if (g->nodes[i].src[s] != KILN_IDX_NONE) f.readers[g->nodes[i].src[s]]++;
    }
    for (uint32_t o = 0; o < g->n_outs; o++) f.readers[g->outs[o].node]++;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t op = g->nodes[i].op;
        if (group[i] == KILN_IDX_NONE) continue;
        if (op == KILN_OP_MATMUL) {
            rule_attention(&f, i);
            if (f.kind[group[i]] != KILN_REGION_ATTENTION) rule_matmul(&f, i);
        }
        else if (is_map(op)) rule_epilogue(&f, i);
        else if (op == KILN_OP_ROPE || op == KILN_OP_KV_SCATTER) rule_rope_scatter(&f, i);
        else if (op == KILN_OP_RMS_NORM) rule_norm_after_reduce(&f, i);
    }
out:
    free(f.first);
    free(f.last);
    free(f.n_mm);
    free(f.readers);
}
