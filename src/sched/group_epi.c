/* The host path's all-reduce epilogue (fusion rule 6): when the region after a split plan's
 * all_reduce is its adds (bias, residual) and the next rms_norm, and the parts run on host backends,
 * group.c computes that region in the same pass as the sum: per row, the total through the adds,
 * the sum of squares, then the norm, and writes the region's outputs to every part (the region is
 * then not launched). Everything else runs the region as compiled. Must not touch devices. */
#include "sched/group_epi.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool host_backend(const kiln_plan *p, uint32_t r)
{
    const char *be = kiln_backends[p->region_be[r]]->name;
    return !strcmp(be, "ref") || !strcmp(be, "cpu");
}

/* The add chain from the all_reduce y to the norm: every add reads the previous value once and one
 * f32 operand from outside; the norm reads the last add (its weight f32 or none). */
bool kiln_sched_epi_ok(const kiln_plan *p, uint32_t coll)
{
    const kiln_graph *g = p->g;
    if (coll + 1 >= p->fusion.n_regions || !host_backend(p, coll) || !host_backend(p, coll + 1)) return false;
    const kiln_region *reg = &p->fusion.regions[coll + 1];
    uint32_t prev = p->fusion.regions[coll].anchor;
    if (reg->kind != KILN_REGION_ROWS || g->nodes[reg->anchor].op != KILN_OP_RMS_NORM || reg->n_nodes < 2 ||
        reg->n_nodes > KILN_EPI_MAX || g->nodes[prev].op != KILN_OP_ALL_REDUCE)
        return false;
    for (uint32_t j = 0; j < reg->n_nodes; j++) {
        const kiln_node_rec *n = &g->nodes[reg->nodes[j]];
        bool last = j + 1 == reg->n_nodes;
        if (n->dtype != KILN_DTYPE_F32 || n->op != (last ? KILN_OP_RMS_NORM : KILN_OP_ADD) || n->src[0] == n->src[1]) return false;
        uint32_t other = n->src[0] == prev ? n->src[1] : n->src[1] == prev ? n->src[0] : KILN_IDX_NONE;
        if (last && n->src[0] != prev) return false;
        if (!last && (other == KILN_IDX_NONE || g->nodes[other].dtype != KILN_DTYPE_F32)) return false;
        if (last && n->n_src > 1 && n->src[1] != KILN_IDX_NONE && g->nodes[n->src[1]].dtype != KILN_DTYPE_F32) return false;
        prev = reg->nodes[j];
    }
    uint32_t y = p->fusion.regions[coll].anchor; /* the host pass does not write y: only the region reads it */
    for (uint32_t i = 0; i < g->n_nodes; i++)
        for (int s = 0; s < g->nodes[i].n_src; s++)
            if (g->nodes[i].src[s] == y && p->fusion.region_of[i] != coll + 1) return false;
    for (uint32_t o = 0; o < g->n_outs; o++)
        if (g->outs[o].node == y) return false;
    return true;
}

static size_t numel(const kiln_plan *p, uint32_t i)
{
    return kiln_node_bytes(&p->g->nodes[i], p->dims[i]) / sizeof(float);
}

/* sum: the all-reduced total (n values). Fetches the outside operands from part 0 (every part holds
 * them whole), computes every node of the region and writes its outputs to every part. */
kiln_status kiln_sched_epi_run(kiln_plan *const *parts, int n_parts, uint32_t coll, const float *sum, size_t n)
{
    const kiln_plan *p0 = parts[0];
    const kiln_graph *g = p0->g;
    const kiln_region *reg = &p0->fusion.regions[coll + 1];
    const kiln_node_rec *norm = &g->nodes[reg->anchor];
    uint32_t m = reg->n_nodes, prev = p0->fusion.regions[coll].anchor;
    float *ext[KILN_EPI_MAX] = {0}, *val[KILN_EPI_MAX] = {0};
    size_t n_ext[KILN_EPI_MAX] = {0}, H = (size_t)p0->dims[reg->anchor][norm->rank - 1];
    kiln_status s = H && n % H == 0 ? KILN_OK : KILN_ERR_INTERNAL;
    for (uint32_t j = 0; s == KILN_OK && j < m; j++) { /* outside operands: the adds' other side, the norm's weight */
        const kiln_node_rec *a = &g->nodes[reg->nodes[j]];
        uint32_t o = j + 1 < m ? (a->src[0] == prev ? a->src[1] : a->src[0]) : a->n_src > 1 ? a->src[1] : KILN_IDX_NONE;
        prev = reg->nodes[j];
        if (!(val[j] = malloc(n * sizeof(float)))) s = KILN_ERR_NOMEM;
        if (o == KILN_IDX_NONE || s != KILN_OK) continue;
        n_ext[j] = numel(p0, o);
        if (!n_ext[j] || n % n_ext[j] || (j + 1 == m && n_ext[j] != H)) s = KILN_ERR_INTERNAL;
        else if (!(ext[j] = malloc(n_ext[j] * sizeof(float)))) s = KILN_ERR_NOMEM;
        else s = kiln_sched_fetch(p0, o, ext[j], n_ext[j] * sizeof(float));
    }
    for (size_t r0 = 0; s == KILN_OK && r0 < n; r0 += H) { /* one pass per row */
        double ss = 0;
        for (size_t i = r0; i < r0 + H; i++) {
            float v = sum[i];
            for (uint32_t j = 0; j + 1 < m; j++) val[j][i] = v = v + ext[j][i % n_ext[j]];
            ss += (double)v * v;
        }
        float scale = (float)(1.0 / sqrt(ss / (double)H + (double)norm->f[0]));
        const float *last = m > 1 ? val[m - 2] : sum;
        for (size_t i = r0; i < r0 + H; i++) val[m - 1][i] = last[i] * scale * (ext[m - 1] ? ext[m - 1][i - r0] : 1.0f);
    }
    for (int p = 0; s == KILN_OK && p < n_parts; p++)
        for (uint32_t j = 0; s == KILN_OK && j < m; j++)
            for (uint32_t o = 0; o < reg->n_outs; o++)
                if (reg->outs[o] == reg->nodes[j] && (s = kiln_sched_put(parts[p], reg->nodes[j], val[j], n * sizeof(float))) != KILN_OK) break;
    for (uint32_t j = 0; j < m; j++) free(ext[j]), free(val[j]);
    return s;
}
