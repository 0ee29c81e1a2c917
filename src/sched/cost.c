/* Roofline costs of regions and the placement search over backends (see cost.h). Must not run
 * kernels or touch plans: it reads a graph, regions, dims and profiles, and returns numbers. */
#include "sched/cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double numel(const kiln_node_rec *n, const int64_t *d)
{
    double e = 1;
    for (int i = 0; i < n->rank; i++) e *= (double)d[i];
    return e;
}

static double node_bytes(const kiln_node_rec *n, const int64_t *d)
{
    return (double)kiln_node_bytes(n, d);
}

/* Keys one sequence of a paged attention can hold: its block table's width times the block. */
static double paged_keys(const kiln_graph *g, const kiln_node_rec *n, const int64_t (*dims)[KILN_MAX_RANK])
{
    (void)g;
    return (double)dims[n->src[5]][1] * (double)n->i[0];
}

static double op_flops(const kiln_graph *g, uint32_t i, const int64_t (*dims)[KILN_MAX_RANK], const int64_t *sym)
{
    const kiln_node_rec *n = &g->nodes[i];
    const int64_t *d = dims[i];
    switch (n->op) {
    case KILN_OP_MATMUL: {
        const int64_t *xd = dims[n->src[0]];
        int xr = g->nodes[n->src[0]].rank;
        return 2.0 * numel(n, d) * (double)xd[xr - 1];
    }
    case KILN_OP_MOE_MATMUL: /* k experts' [N, K] per token */
        return 2.0 * (double)dims[n->src[2]][0] * n->i[0] * (double)dims[n->src[1]][1] * (double)dims[n->src[1]][2];
    case KILN_OP_ATTENTION: {
        double n_kv = (double)(kiln_dim_is_sym(n->dim) ? sym[kiln_sym_index(n->dim)] : n->dim);
        return 4.0 * (double)d[0] * (double)d[1] * n_kv * (double)d[2];
    }
    case KILN_OP_PAGED_ATTENTION: /* KV lengths are data: half of each sequence's block table */
        return 2.0 * (double)d[0] * (double)d[1] * paged_keys(g, n, dims) * (double)d[2];
    default:
        return kiln_op_flops((enum kiln_op)n->op) * numel(n, d); /* the op table's flops per element */
    }
}

/* Bytes an op reads of an operand from outside the region: caches only their n_kv valid rows;
 * kv_scatter reads nothing of the state it writes. */
static double read_bytes(const kiln_graph *g, uint32_t reader, int slot, const int64_t (*dims)[KILN_MAX_RANK],
                         const int64_t *sym)
{
    const kiln_node_rec *n = &g->nodes[reader];
    uint32_t s = n->src[slot];
    const kiln_node_rec *src = &g->nodes[s];
    if (n->op == KILN_OP_KV_SCATTER && slot == 0) return 0;
    if (n->op == KILN_OP_ATTENTION && slot > 0) {
        double n_kv = (double)(kiln_dim_is_sym(n->dim) ? sym[kiln_sym_index(n->dim)] : n->dim);
        return node_bytes(src, dims[s]) * n_kv / (double)dims[s][1];
    }
    if (n->op == KILN_OP_PAGED_ATTENTION && (slot == 1 || slot == 2)) { /* the keys of every sequence, at most the pool */
        double keys = paged_keys(g, n, dims) * (double)dims[n->src[4]][0];
        return node_bytes(src, dims[s]) * (keys < (double)dims[s][1] ? keys / (double)dims[s][1] : 1.0) / 2;
    }
    if (n->op == KILN_OP_MOE_MATMUL && slot == 1) { /* only the routed experts: at most tokens x k of E */
        double used = (double)dims[n->src[2]][0] * n->i[0], e = (double)dims[s][0];
        return node_bytes(src, dims[s]) * (used < e ? used / e : 1.0);
    }
    if (n->op == KILN_OP_GET_ROWS && slot == 0) /* only the rows asked for */
        return node_bytes(src, dims[s]) * (double)dims[n->src[1]][0] / (double)dims[s][0];
    return node_bytes(src, dims[s]);
}

void kiln_sched_region_cost(const kiln_graph *g, const kiln_region *r, const int64_t (*dims)[KILN_MAX_RANK],
                            const int64_t *sym_vals, kiln_region_cost *out)
{
    memset(out, 0, sizeof *out);
    const kiln_region_spec *sp = &r->spec; /* a matmul region's siblings, found by fusion */
    out->peak_dtype = sp->n_mm ? g->nodes[g->nodes[sp->mm[sp->n_mm - 1]].src[1]].dtype : KILN_DTYPE_F32;
    uint32_t seen[64];
    uint32_t n_seen = 0;
    for (uint32_t k = 0; k < r->n_nodes; k++) {
        uint32_t i = r->nodes[k];
        const kiln_node_rec *n = &g->nodes[i];
        out->flops += op_flops(g, i, dims, sym_vals);
        if (n->op == KILN_OP_MATMUL && !r->spec.n_mm) out->peak_dtype = g->nodes[n->src[1]].dtype; /* mixed inputs */
        for (int s = 0; s < n->n_src; s++) {
            uint32_t src = n->src[s];
            if (src == KILN_IDX_NONE || kiln_region_has(r, src)) continue;
            bool dup = false;
            for (uint32_t j = 0; j < n_seen && !dup; j++) dup = seen[j] == src;
            if (dup) continue;
            if (n_seen < 64) seen[n_seen++] = src;
            out->bytes += read_bytes(g, i, s, dims, sym_vals);
        }
    }
    if (r->kind == KILN_REGION_COLLECTIVE) { /* all_reduce over i[0] devices: N - 1 adds, a ring's traffic */
        const kiln_node_rec *n = &g->nodes[r->anchor];
        double devs = n->i[0] > 1 ? n->i[0] : 1;
        out->flops = (devs - 1) * numel(n, dims[r->anchor]);
        out->link_bytes = 2 * (devs - 1) / devs * node_bytes(n, dims[r->anchor]);
    }
    for (uint32_t k = 0; k < r->n_outs; k++) {
        uint32_t i = r->outs[k];
        const kiln_node_rec *n = &g->nodes[i];
        if (n->op == KILN_OP_KV_SCATTER) out->bytes += node_bytes(&g->nodes[n->src[1]], dims[n->src[1]]);
        else out->bytes += node_bytes(n, dims[i]);
    }
}

double kiln_sched_time(const kiln_region_cost *c, const kiln_device_profile *p, bool *compute_bound)
{
    double peak = p->peak_flops[c->peak_dtype] > 0 ? p->peak_flops[c->peak_dtype] : p->peak_flops[KILN_DTYPE_F32];
    double tc = peak > 0 ? c->flops / peak : 0, tm = p->mem_bw > 0 ? c->bytes / p->mem_bw : 0;
    if (compute_bound) *compute_bound = tc > tm;
    double link = 0; /* an all-reduce: its link traffic after the local read (no overlap assumed) */
    if (c->link_bytes > 0) link = p->link_latency_s + c->link_bytes / (p->link_bw > 0 ? p->link_bw : p->mem_bw > 0 ? p->mem_bw : 1e12);
    return (tc > tm ? tc : tm) + p->launch_s + link;
}

static bool on_host(const kiln_place_problem *pp, int b) { return b < 0 || pp->profiles[b].h2d_bw <= 0; }

double kiln_sched_edge_time(const kiln_place_problem *pp, const kiln_place_edge *e, int from_b, int to_b)
{
    if (from_b == to_b || (on_host(pp, from_b) && on_host(pp, to_b))) return 0;
    double t = 0;
    if (!on_host(pp, from_b)) /* device -> host */
        t += pp->profiles[from_b].xfer_latency_s + e->bytes / pp->profiles[from_b].d2h_bw;
    if (!on_host(pp, to_b)) /* host -> device */
        t += pp->profiles[to_b].xfer_latency_s + e->bytes / pp->profiles[to_b].h2d_bw;
    return t;
}

double kiln_sched_total(const kiln_place_problem *pp, const uint8_t *assign)
{
    double t = 0;
    for (uint32_t r = 0; r < pp->n_regions; r++) {
        double x = pp->time[(size_t)r * pp->n_backends + assign[r]];
        if (x < 0) return INFINITY;
        t += x;
    }
    for (uint32_t e = 0; e < pp->n_edges; e++) {
        const kiln_place_edge *ed = &pp->edges[e];
        int fb = ed->from == KILN_IDX_NONE ? -1 : assign[ed->from];
        int tb = ed->to == KILN_IDX_NONE ? -1 : assign[ed->to];
        t += kiln_sched_edge_time(pp, ed, fb, tb);
    }
    return t;
}

static double exhaustive(const kiln_place_problem *pp, uint8_t *assign)
{
    uint32_t n = pp->n_regions;
    uint8_t *cur = calloc(n + 1, 1);
    double best = INFINITY;
    if (!cur) return INFINITY;
    for (;;) {
        double t = kiln_sched_total(pp, cur);
        if (t < best) {
            best = t;
            memcpy(assign, cur, n);
        }
        uint32_t i = 0; /* odometer increment */
        while (i < n && ++cur[i] == pp->n_backends) cur[i++] = 0;
        if (i == n) break;
    }
    free(cur);
    return best;
}

/* Greedy: each region in order on its cheapest backend; then repeat single-region and block moves
 * (a contiguous range of regions to one backend) while they lower the total. */
static double local_search(const kiln_place_problem *pp, uint8_t *assign)
{
    uint32_t n = pp->n_regions;
    int nb = pp->n_backends;
    for (uint32_t r = 0; r < n; r++) {
        int best = 0;
        for (int b = 0; b < nb; b++) {
            double t = pp->time[(size_t)r * nb + b], tb = pp->time[(size_t)r * nb + best];
            if (t >= 0 && (tb < 0 || t < tb)) best = b;
        }
        assign[r] = (uint8_t)best;
    }
    double total = kiln_sched_total(pp, assign);
    bool all_host = true;
    for (int b = 0; b < nb; b++) all_host &= on_host(pp, b);
    uint8_t *trial = all_host ? NULL : malloc(n + 1);
    if (!trial) return total;
    for (int sweep = 0; sweep < 20; sweep++) {
        bool improved = false;
        for (uint32_t a = 0; a < n; a++)
            for (uint32_t z = a; z < n && z < a + 64; z++)
                for (int b = 0; b < nb; b++) {
                    memcpy(trial, assign, n);
                    for (uint32_t k = a; k <= z; k++) trial[k] = (uint8_t)b;
                    double t = kiln_sched_total(pp, trial);
                    if (t < total - 1e-15) {
                        total = t;
                        memcpy(assign, trial, n);
                        improved = true;
                    }
                }
        if (!improved) break;
    }
    free(trial);
    return total;
}

double kiln_sched_place(const kiln_place_problem *pp, uint64_t max_exhaustive, uint8_t *assign)
{
    double space = pow((double)pp->n_backends, (double)pp->n_regions);
    if (pp->n_regions == 0) return 0;
    bool all_host = true; /* no transfers anywhere: the cheapest backend per region is optimal */
    for (int b = 0; b < pp->n_backends; b++) all_host &= on_host(pp, b);
    if (space <= (double)max_exhaustive && !all_host) return exhaustive(pp, assign);
    return local_search(pp, assign);
}
