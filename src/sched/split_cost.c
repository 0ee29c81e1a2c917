/* The cost model's side of the tensor-parallel split (split.h): a node's predicted time on one
 * device (roofline: FLOPs / peak against bytes / bandwidth, as cost.c does for regions) and the link
 * time of the all-reduce and all-gather that join its parts. split.c sums these over a group of
 * divided nodes to choose split or replicated. Pure arithmetic: must not touch plans or devices. */
#include "sched/split.h"
#include "fuse/fuse.h"

static double bytes_at(const kiln_graph *g, uint32_t i, const int64_t *sym)
{
    int64_t d[KILN_MAX_RANK];
    kiln_node_numel(&g->nodes[i], sym, d);
    return (double)kiln_node_bytes(&g->nodes[i], d);
}

static double sym_val(const kiln_graph *g, int64_t d, const int64_t *sym)
{
    (void)g;
    return (double)(kiln_dim_is_sym(d) ? sym[kiln_sym_index(d)] : d);
}

/* FLOPs and bytes of node i at symbol values sym (operands read whole, result written). */
static void node_work(const kiln_graph *g, uint32_t i, const int64_t *sym, double *flops, double *bytes)
{
    const kiln_node_rec *n = &g->nodes[i];
    int64_t d[KILN_MAX_RANK];
    double ne = (double)kiln_node_numel(n, sym, d);
    *bytes = bytes_at(g, i, sym);
    *flops = kiln_op_flops((enum kiln_op)n->op) * ne;
    for (int k = 0; k < n->n_src; k++) {
        uint32_t s = n->src[k];
        if (s == KILN_IDX_NONE) continue;
        double b = bytes_at(g, s, sym);
        if (n->op == KILN_OP_KV_SCATTER && k == 0) b = 0; /* writes rows, reads none of the cache */
        if (n->op == KILN_OP_ATTENTION && (k == 1 || k == 2)) /* the n_kv valid rows of each cache */
            b *= sym_val(g, n->dim, sym) / (double)g->nodes[s].dims[1];
        if (n->op == KILN_OP_PAGED_ATTENTION && (k == 1 || k == 2)) b /= 2; /* half the pool, as cost.c */
        if (n->op == KILN_OP_GET_ROWS && k == 0) b *= sym_val(g, g->nodes[n->src[1]].dims[0], sym) / (double)g->nodes[s].dims[0];
        *bytes += b;
    }
    if (n->op == KILN_OP_MATMUL) {
        const kiln_node_rec *x = &g->nodes[n->src[0]];
        *flops = 2.0 * ne * sym_val(g, x->dims[x->rank - 1], sym);
    } else if (n->op == KILN_OP_ATTENTION) {
        *flops = 4.0 * (double)d[0] * (double)d[1] * sym_val(g, n->dim, sym) * (double)d[2];
    }
}

double kiln_split_node_time(const kiln_graph *g, uint32_t i, const int64_t *sym, const kiln_device_profile *p)
{
    const kiln_node_rec *n = &g->nodes[i];
    if (n->op == KILN_OP_INPUT || n->op == KILN_OP_WEIGHT || n->op == KILN_OP_STATE || kiln_op_is_alias((enum kiln_op)n->op))
        return 0;
    double flops, bytes;
    node_work(g, i, sym, &flops, &bytes);
    int t = n->op == KILN_OP_MATMUL ? g->nodes[n->src[1]].dtype : KILN_DTYPE_F32;
    double peak = p->peak_flops[t] > 0 ? p->peak_flops[t] : p->peak_flops[KILN_DTYPE_F32];
    double tc = peak > 0 ? flops / peak : 0, tm = p->mem_bw > 0 ? bytes / p->mem_bw : 0;
    return tc > tm ? tc : tm;
}

/* Bus bandwidth of the links: NCCL's busbw, or (0) the device's own memory (virtual devices). */
static double link_bw(const kiln_device_profile *p) { return p->link_bw > 0 ? p->link_bw : p->mem_bw > 0 ? p->mem_bw : 1e12; }

double kiln_split_reduce_time(double bytes, int n, const kiln_device_profile *p)
{
    return p->link_latency_s + 2.0 * (n - 1) / n * bytes / link_bw(p); /* a ring: reduce-scatter, all-gather */
}

double kiln_split_gather_time(double slice_bytes, int n, const kiln_device_profile *p)
{
    return p->link_latency_s + (double)(n - 1) * slice_bytes / link_bw(p); /* every other device's slice comes in */
}
