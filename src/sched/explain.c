/* Plan reports: per-region info (fused ops, backend, roofline prediction per backend, measured
 * time), and the whole plan as a text table, JSON or Graphviz dot. Reads a plan; changes nothing
 * but the profiling switch. */
#include "sched/cost.h"
#include "sched/plan.h"
#include "sched/group.h"
#include "sched/split.h"
#include "util/sbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef kiln_sbuf sbuf;

/* "rms_norm + matmul x3 + rope x2 + kv_scatter x2": ops in order of first appearance with counts. */
static void ops_string(const kiln_graph *g, const kiln_region *r, char *out, size_t n)
{
    uint8_t ops[KILN_OP_COUNT];
    int cnt[KILN_OP_COUNT] = {0}, k = 0;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        uint8_t op = g->nodes[r->nodes[i]].op;
        if (cnt[op]++ == 0) ops[k++] = op;
    }
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < k && o < n; i++) {
        o += (size_t)snprintf(out + o, n - o, "%s%s", i ? " + " : "", kiln_op_name((enum kiln_op)ops[i]));
        if (cnt[ops[i]] > 1 && o < n) o += (size_t)snprintf(out + o, n - o, " x%d", cnt[ops[i]]);
    }
}

KILN_API kiln_status kiln_plan_region(const kiln_plan *p, int i, kiln_region_info *out)
{
    if (p && p->group) p = kiln_sched_group_part(p->group, 0); /* a split plan: part 0's kernels */
    if (!p || !out || i < 0 || (uint32_t)i >= p->fusion.n_regions) return KILN_ERR_INVALID_ARG;
    const kiln_region *r = &p->fusion.regions[i];
    const kiln_graph *g = p->g;
    memset(out, 0, sizeof *out);
    out->kind = kiln_region_kind_name((enum kiln_region_kind)r->kind);
    out->backend = kiln_backends[p->region_be[i]]->name;
    ops_string(g, r, out->ops, sizeof out->ops);
    const kiln_node_rec *a = &g->nodes[r->anchor];
    if (a->name) snprintf(out->anchor, sizeof out->anchor, "%s", a->name);
    else snprintf(out->anchor, sizeof out->anchor, "#%u", r->anchor);
    kiln_region_cost c;
    kiln_sched_region_cost(g, r, (const int64_t(*)[KILN_MAX_RANK])p->dims, p->sym_vals, &c);
    out->flops = c.flops;
    out->bytes = c.bytes;
    for (int b = 0; b < KILN_MAX_BACKENDS; b++) {
        out->predicted_s[b] = -1;
        if (b < KILN_BACKEND_COUNT && p->pred_s[(size_t)i * KILN_BACKEND_COUNT + b] >= 0)
            out->predicted_s[b] = kiln_sched_time(&c, &p->ctx->profile[b], b == p->region_be[i] ? &out->compute_bound : NULL);
    }
    out->transfer_s = p->xfer_s[i];
    out->n_measured = p->n_meas[i];
    out->measured_s = p->n_meas[i] ? p->meas_s[i] / p->n_meas[i] : 0;
    return KILN_OK;
}

KILN_API kiln_status kiln_plan_profile(kiln_plan *p, bool on)
{
    if (!p) return KILN_ERR_INVALID_ARG;
    for (int k = 0; p->group && k < kiln_sched_group_size(p->group); k++) kiln_plan_profile(kiln_sched_group_part(p->group, k), on);
    if (p->group) return KILN_OK;
    p->profiling = on;
    if (on)
        for (uint32_t r = 0; r < p->fusion.n_regions; r++) p->meas_s[r] = 0, p->n_meas[r] = 0;
    return KILN_OK;
}

KILN_API double kiln_plan_compile_ms(const kiln_plan *p) { return p ? p->compile_ms : 0; }
/* A split plan: one part's (each part holds its own). */
KILN_API size_t kiln_plan_peak_bytes(const kiln_plan *p)
{
    if (p && p->group) p = kiln_sched_group_part(p->group, 0);
    return p ? p->arena_bytes : 0;
}

KILN_API kiln_status kiln_plan_stats_get(const kiln_plan *p, kiln_plan_stats *out)
{
    if (!p || !out) return KILN_ERR_INVALID_ARG;
    *out = p->stats;
    out->staging_bytes = 0;
    if (p->group) return KILN_OK;
    kiln_sched_lock(p, true);
    for (int sp = 0; sp < KILN_BACKEND_COUNT; sp++)
        if (p->dev[sp].used && kiln_backends[sp]->staging_bytes) out->staging_bytes += kiln_backends[sp]->staging_bytes(p->ctx->be_state[sp]);
    kiln_sched_lock(p, false);
    return KILN_OK;
}

static uint32_t n_ops(const kiln_plan *p)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) n += p->fusion.regions[r].n_nodes;
    return n;
}

static void human(double v, const char *unit, char *out, size_t n)
{
    const char *pre[] = {"", "K", "M", "G", "T", "P"};
    int k = 0;
    while (v >= 1000 && k < 5) v /= 1000, k++;
    snprintf(out, n, "%.3g %s%s", v, pre[k], unit);
}

/* The capacity of each paged attention (kiln_paged_attention): block size, pool, sequences, keys
 * per sequence and new tokens per step, as bounds of the plan, and whether steps carry draft trees. */
static void paged_capacity(const kiln_plan *p, sbuf *b, bool json)
{
    const kiln_graph *g = p->g;
    bool first = true;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        if (n->op != KILN_OP_PAGED_ATTENTION) continue;
        const int64_t *kd = p->max_dims[n->src[1]];
        long long blk = n->i[0], pool = kd[1] / n->i[0], seqs = p->max_dims[n->src[4]][0], mb = p->max_dims[n->src[5]][1];
        long long tok = p->max_dims[n->src[0]][0];
        const char *dt = kiln_dtype_name((kiln_dtype)g->nodes[n->src[1]].dtype);
        bool tree = n->n_src > 6 && n->src[6] != KILN_IDX_NONE; /* kiln_paged_attention_tree */
        char lab[64];
        if (n->name) snprintf(lab, sizeof lab, "%s", n->name);
        else snprintf(lab, sizeof lab, "#%u", i);
        if (json)
            kiln_sbuf_printf(b, "%s{\"node\": \"%s\", \"block\": %lld, \"pool_blocks\": %lld, \"kv_dtype\": \"%s\", "
                                "\"max_seqs\": %lld, \"max_blocks_per_seq\": %lld, \"max_tokens\": %lld, \"draft_trees\": %s}",
                             first ? "" : ", ", lab, blk, pool, dt, seqs, mb, tok, tree ? "true" : "false");
        else
            kiln_sbuf_printf(b, "paged attention %s: blocks of %lld tokens, pool of %lld blocks per kv head (%s), up to %lld "
                                "sequences x %lld blocks (%lld keys each), %lld new tokens per step%s\n",
                             lab, blk, pool, dt, seqs, mb, mb * blk, tok, tree ? " (trees of drafts: parents)" : "");
        first = false;
    }
}

static void explain_text(const kiln_plan *p, sbuf *b)
{
    const kiln_graph *g = p->g;
    kiln_sbuf_printf(b, "plan: %u kernels from %u ops, main backend %s, compiled in %.2f ms, intermediates %.2f MiB\n",
              p->fusion.n_regions, n_ops(p), kiln_backends[p->backend]->name, p->compile_ms, p->arena_bytes / 1048576.0);
    kiln_sbuf_printf(b, "cache: %s", kiln_plan_cache(p));
    if (p->disk_hits + p->disk_misses) kiln_sbuf_printf(b, " (kernels: %u from disk, %u compiled)", p->disk_hits, p->disk_misses);
    kiln_sbuf_printf(b, "\n");
    if (g->n_syms) {
        kiln_sbuf_printf(b, "sizes: ");
        for (uint32_t i = 0; i < g->n_syms; i++)
            kiln_sbuf_printf(b, "%s%s = %lld%s", i ? ", " : "", g->syms[i].name, (long long)p->sym_vals[i],
                      p->ran ? "" : " (its bound)");
        kiln_sbuf_printf(b, "\n");
    }
    paged_capacity(p, b, false);
    kiln_sbuf_printf(b, "predicted time = max(flops / peak, bytes / bandwidth) + launch, per backend; * = chosen;\n"
                 "roof = predicted / measured on the chosen backend (100%% = at the roofline)\n\n");
    kiln_sbuf_printf(b, "%3s  %-9s %-7s %-10s %-10s %-7s", "#", "kind", "runs on", "flops", "bytes", "bound");
    for (int be = 0; be < KILN_BACKEND_COUNT; be++) kiln_sbuf_printf(b, " %11s", kiln_backends[be]->name);
    kiln_sbuf_printf(b, " %11s %8s %8s %6s  %s\n", "measured", "GB/s", "GFLOP/s", "roof", "fused ops");
    double tot_pred = 0, tot_meas = 0;
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        kiln_region_info ri;
        kiln_plan_region(p, (int)r, &ri);
        char fl[32], by[32];
        human(ri.flops, "", fl, sizeof fl);
        human(ri.bytes, "B", by, sizeof by);
        kiln_sbuf_printf(b, "%3u  %-9s %-7s %-10s %-10s %-7s", r, ri.kind, ri.backend, fl, by,
                  ri.compute_bound ? "compute" : "memory");
        for (int be = 0; be < KILN_BACKEND_COUNT; be++) {
            if (ri.predicted_s[be] < 0) kiln_sbuf_printf(b, " %11s", "-");
            else kiln_sbuf_printf(b, " %9.1fus%s", ri.predicted_s[be] * 1e6, be == p->region_be[r] ? "*" : " ");
        }
        tot_pred += ri.predicted_s[p->region_be[r]] + ri.transfer_s;
        tot_meas += ri.measured_s;
        if (ri.n_measured && ri.measured_s > 0) /* roof = predicted (the roofline) / measured */
            kiln_sbuf_printf(b, " %9.1fus %8.2f %8.2f %5.0f%%", ri.measured_s * 1e6, ri.bytes / ri.measured_s / 1e9,
                      ri.flops / ri.measured_s / 1e9, 100 * ri.predicted_s[p->region_be[r]] / ri.measured_s);
        else
            kiln_sbuf_printf(b, " %11s %8s %8s %6s", "-", "-", "-", "-");
        kiln_sbuf_printf(b, "  %s", ri.ops);
        if (ri.transfer_s > 0) kiln_sbuf_printf(b, "  (+%.1fus transfers in)", ri.transfer_s * 1e6);
        kiln_sbuf_printf(b, "\n");
    }
    kiln_sbuf_printf(b, "\ntotal predicted %.3f ms", tot_pred * 1e3);
    if (tot_meas > 0) kiln_sbuf_printf(b, ", measured %.3f ms (%.2fx the prediction)", tot_meas * 1e3, tot_meas / tot_pred);
    kiln_sbuf_printf(b, "\n");
}

static void explain_json(const kiln_plan *p, sbuf *b)
{
    kiln_sbuf_printf(b, "{\"backend\": \"%s\", \"kernels\": %u, \"ops\": %u, \"compile_ms\": %.4f, \"cache\": \"%s\", "
                 "\"cache_disk_hits\": %u, \"cache_disk_misses\": %u, \"peak_bytes\": %zu,",
              kiln_backends[p->backend]->name, p->fusion.n_regions, n_ops(p), p->compile_ms, kiln_plan_cache(p), p->disk_hits,
              p->disk_misses, p->arena_bytes);
    kiln_sbuf_printf(b, "\n \"paged\": [");
    paged_capacity(p, b, true);
    kiln_sbuf_printf(b, "], \"regions\": [");
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        kiln_region_info ri;
        kiln_plan_region(p, (int)r, &ri);
        kiln_sbuf_printf(b, "%s\n  {\"kind\": \"%s\", \"backend\": \"%s\", \"anchor\": \"%s\", \"ops\": \"%s\", \"flops\": %.6g, "
                     "\"bytes\": %.6g, \"bound\": \"%s\", \"predicted_s\": {",
                  r ? "," : "", ri.kind, ri.backend, ri.anchor, ri.ops, ri.flops, ri.bytes,
                  ri.compute_bound ? "compute" : "memory");
        bool first = true;
        for (int be = 0; be < KILN_BACKEND_COUNT; be++)
            if (ri.predicted_s[be] >= 0) {
                kiln_sbuf_printf(b, "%s\"%s\": %.6g", first ? "" : ", ", kiln_backends[be]->name, ri.predicted_s[be]);
                first = false;
            }
        double m = ri.measured_s > 0 ? ri.measured_s : 0;
        kiln_sbuf_printf(b, "}, \"transfer_s\": %.6g, \"measured_s\": %.6g, \"runs_measured\": %d, \"achieved_gb_s\": %.6g, "
                     "\"achieved_gflop_s\": %.6g, \"fraction_of_roof\": %.4f}",
                  ri.transfer_s, ri.measured_s, ri.n_measured, m ? ri.bytes / m / 1e9 : 0, m ? ri.flops / m / 1e9 : 0,
                  m ? ri.predicted_s[p->region_be[r]] / m : 0);
    }
    kiln_sbuf_printf(b, "\n]}\n");
}

static void explain_dot(const kiln_plan *p, sbuf *b)
{
    const kiln_graph *g = p->g;
    kiln_sbuf_printf(b, "digraph kiln {\n  rankdir=TB;\n  node [fontname=\"monospace\" fontsize=10];\n");
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        uint8_t op = g->nodes[i].op;
        if (op == KILN_OP_INPUT || op == KILN_OP_STATE)
            kiln_sbuf_printf(b, "  n%u [shape=ellipse label=\"%s %s\"];\n", i, kiln_op_name((enum kiln_op)op), g->nodes[i].name);
    }
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        char ops[256];
        ops_string(g, &p->fusion.regions[r], ops, sizeof ops);
        kiln_sbuf_printf(b, "  r%u [shape=box style=rounded label=\"#%u %s on %s\\n%s\"];\n", r, r,
                  kiln_region_kind_name((enum kiln_region_kind)p->fusion.regions[r].kind),
                  kiln_backends[p->region_be[r]]->name, ops);
    }
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        uint32_t r = p->fusion.region_of[i];
        if (r == KILN_IDX_NONE) continue;
        for (int s = 0; s < g->nodes[i].n_src; s++) {
            uint32_t src = g->nodes[i].src[s];
            if (src == KILN_IDX_NONE) continue;
            uint32_t root = src;
            while (p->fusion.region_of[root] == KILN_IDX_NONE && (g->nodes[root].op == KILN_OP_RESHAPE || g->nodes[root].op == KILN_OP_VIEW))
                root = g->nodes[root].src[0];
            uint8_t op = g->nodes[root].op;
            if (op == KILN_OP_INPUT || op == KILN_OP_STATE) kiln_sbuf_printf(b, "  n%u -> r%u;\n", root, r);
            else if (p->fusion.region_of[root] != KILN_IDX_NONE && p->fusion.region_of[root] != r)
                kiln_sbuf_printf(b, "  r%u -> r%u;\n", p->fusion.region_of[root], r);
        }
    }
    for (uint32_t o = 0; o < g->n_outs; o++) {
        uint32_t r = p->fusion.region_of[p->root[g->outs[o].node]];
        kiln_sbuf_printf(b, "  out%u [shape=ellipse label=\"output %s\"];\n", o, g->outs[o].name);
        if (r != KILN_IDX_NONE) kiln_sbuf_printf(b, "  r%u -> out%u;\n", r, o);
    }
    kiln_sbuf_printf(b, "}\n");
}

KILN_API kiln_status kiln_plan_explain(const kiln_plan *p, const char *format, char **out)
{
    if (!p || !out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    sbuf b = {0};
    if (p->group) { /* the split, then one part (every part runs the same kernels on its slices) */
        const char *sum = kiln_sched_group_summary(p->group);
        size_t n = strcspn(sum, "\n"); /* JSON: the first line; the cost model's verdicts as objects */
        if (format && !strcmp(format, "json")) {
            const kiln_split *sp = kiln_sched_group_split(p->group);
            kiln_sbuf_printf(&b, "{\"split\": {\"devices\": %d, \"summary\": \"%.*s\", \"cost_model\": [",
                             kiln_sched_group_size(p->group), (int)n, sum);
            for (uint32_t k = 0; k < sp->n_choices; k++)
                kiln_sbuf_printf(&b, "%s{\"matmuls\": \"%s\", \"split_s\": %.6g, \"replicated_s\": %.6g, \"split\": %s}",
                                 k ? ", " : "", sp->choices[k].what, sp->choices[k].split_s, sp->choices[k].whole_s,
                                 sp->choices[k].split ? "true" : "false");
            kiln_sbuf_printf(&b, "]}, \"part0\": ");
        } else if (!format || !strcmp(format, "text")) kiln_sbuf_printf(&b, "%sone part of %d:\n", sum, kiln_sched_group_size(p->group));
        p = kiln_sched_group_part(p->group, 0);
    }
    bool split_json = b.s && format && !strcmp(format, "json");
    if (!format || !strcmp(format, "text")) explain_text(p, &b);
    else if (!strcmp(format, "json")) explain_json(p, &b);
    else if (!strcmp(format, "dot")) explain_dot(p, &b);
    else return kiln_ctx_fail(p->ctx, KILN_ERR_INVALID_ARG, "unknown explain format '%s' (text, json, dot)", format);
    if (split_json) kiln_sbuf_printf(&b, "}\n");
    if (b.oom || !b.s) {
        free(b.s);
        return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory explaining the plan");
    }
    *out = b.s;
    return KILN_OK;
}
