/* A run's bindings (kiln_run, kiln_run_async): names matched to symbols, inputs and outputs, every
 * node's dims and data pointer for the run, and the checks of bound metadata (indices, paged steps)
 * before any kernel runs. What does not change between runs is kept in the plan's run memo (the
 * lists of nodes each step visits, each binding's last match, dims per symbol values), so an engine's
 * step costs the host a few microseconds whatever the graph's size. Must not launch or copy anything. */
#include "sched/plan.h"
#include "graph/paged.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *node_label(const kiln_graph *g, uint32_t i, char *buf, size_t n)
{
    const kiln_node_rec *r = &g->nodes[i];
    if (r->name) snprintf(buf, n, "%s '%s'", kiln_op_name((enum kiln_op)r->op), r->name);
    else snprintf(buf, n, "%s #%u", kiln_op_name((enum kiln_op)r->op), i);
    return buf;
}

/* The device space that reads input `input`, which caller device memory may then be bound to:
 * -1 when the host reads it, nothing reads it, or two devices do (then it must be host memory). */
static int device_input_space(const kiln_plan *p, uint32_t input)
{
    int sp = -1;
    for (uint32_t x = 0; x < p->n_xfers; x++) {
        if (p->xfers[x].node != input) continue;
        if (p->xfers[x].to == KILN_SPACE_HOST || (sp >= 0 && sp != p->xfers[x].to)) return -1;
        sp = p->xfers[x].to;
    }
    return sp;
}

/* Run-time index checks for kernels on devices (the host kernels check their own): positions
 * and ids given as bound host inputs are checked before they are uploaded. */
static kiln_status check_indices(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    const int32_t *last = NULL; /* the values checked last: the layers of a model share their positions */
    int64_t last_cnt = 0, last_hi = 0;
    for (uint32_t a = 0; a < p->memo->n_checked; a++) {
        uint32_t i = p->memo->checked[a];
        const kiln_node_rec *n = &g->nodes[i];
        uint32_t src;
        int64_t hi;
        if (n->op == KILN_OP_KV_SCATTER) src = n->src[2], hi = p->dims[n->src[0]][1];
        else if (n->op == KILN_OP_GET_ROWS) src = n->src[1], hi = p->dims[n->src[0]][0];
        else if (n->op == KILN_OP_ATTENTION) {
            int64_t n_kv = kiln_dim_is_sym(n->dim) ? p->sym_vals[kiln_sym_index(n->dim)] : n->dim;
            int64_t max_ctx = p->dims[n->src[1]][1], n_tok = p->dims[n->src[0]][0];
            if (n_kv < 1 || n_kv > max_ctx || n_tok > n_kv) {
                char lab[300];
                return kiln_ctx_fail(p->ctx, KILN_ERR_SHAPE, "%s: n_kv = %lld must be in [n_tok = %lld, max_ctx = %lld]",
                                     node_label(g, i, lab, sizeof lab), (long long)n_kv, (long long)n_tok, (long long)max_ctx);
            }
            kiln_status ps = kiln_sched_check_attention_pos(p, i, false);
            if (ps != KILN_OK) return ps;
            continue;
        } else continue;
        uint32_t root = p->root[src];
        if (g->nodes[root].op != KILN_OP_INPUT || !p->bufs[root]) continue;
        int64_t cnt = 1;
        for (int d = 0; d < g->nodes[src].rank; d++) cnt *= p->dims[src][d];
        const int32_t *v = (const int32_t *)((const unsigned char *)p->bufs[root] + p->offset[src]);
        if (v == last && cnt == last_cnt && hi == last_hi) continue;
        for (int64_t t = 0; t < cnt; t++)
            if (v[t] < 0 || v[t] >= hi) {
                char lab[300];
                return kiln_ctx_fail(p->ctx, KILN_ERR_SHAPE, "%s: %s %d (index %lld) is outside [0, %lld)", node_label(g, i, lab, sizeof lab),
                                     n->op == KILN_OP_GET_ROWS ? "id" : "position", v[t], (long long)t, (long long)hi);
            }
        last = v, last_cnt = cnt, last_hi = hi;
    }
    return KILN_OK;
}

/* An i32 input's values this run when they are bound in host memory, else NULL (device-bound or
 * computed: the engine vouches for them). */
static const int32_t *host_i32(const kiln_plan *p, uint32_t node)
{
    uint32_t root = p->root[node];
    if (p->g->nodes[root].op != KILN_OP_INPUT || !p->bufs[root]) return NULL;
    return (const int32_t *)((const unsigned char *)p->bufs[root] + p->offset[node]);
}

/* Paged attention's step metadata, on every backend, before any kernel runs: a bad step is refused
 * whole and the caches stay untouched (kiln_paged_check), slots of the kv_scatter feeding k or v
 * included. */
static kiln_status check_paged(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    kiln_paged_meta done = {0}; /* the last metadata checked: the layers of a model share theirs */
    const int32_t *done_slots[2] = {NULL, NULL};
    for (uint32_t a = 0; a < p->memo->n_paged; a++) {
        uint32_t i = p->memo->paged[a];
        const kiln_node_rec *n = &g->nodes[i];
        kiln_paged_meta m = {.pos = host_i32(p, n->src[3]), .seqs = host_i32(p, n->src[4]), .blocks = host_i32(p, n->src[5]),
                             .n_tok = p->dims[n->src[0]][0], .n_seq = p->dims[n->src[4]][0],
                             .max_blocks = p->dims[n->src[5]][1], .block = n->i[0], .n_slots = p->dims[n->src[1]][1]};
        bool tree = n->n_src > 6 && n->src[6] != KILN_IDX_NONE;
        if (tree) m.parents = host_i32(p, n->src[6]);
        if (!m.pos || !m.seqs || !m.blocks || (tree && !m.parents)) continue; /* device-bound: the kernels clamp */
        bool same = !memcmp(&m, &done, sizeof m); /* no padding: pointers and int64s */
        const int32_t *slots[2] = {NULL, NULL};
        for (int k = 1; k <= 2; k++) {
            const kiln_node_rec *w = &g->nodes[n->src[k]];
            slots[k - 1] = w->op == KILN_OP_KV_SCATTER && p->dims[w->src[2]][0] == m.n_tok ? host_i32(p, w->src[2]) : NULL;
        }
        if (same && slots[0] == done_slots[0] && slots[1] == done_slots[1]) continue;
        char why[400], lab[300];
        if (!kiln_paged_check(&m, NULL, why, sizeof why))
            return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "%s: %s", node_label(g, i, lab, sizeof lab), why);
        for (int k = 1; k <= 2; k++)
            if (slots[k - 1] && !kiln_paged_check(&m, slots[k - 1], why, sizeof why))
                return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "%s: %s (the kv_scatter writing %s)", node_label(g, i, lab, sizeof lab), why,
                                     k == 1 ? "k" : "v");
        done = m, done_slots[0] = slots[0], done_slots[1] = slots[1];
    }
    return KILN_OK;
}

void kiln_sched_memo_free(kiln_run_memo *m)
{
    if (!m) return;
    free(m->inputs), free(m->views), free(m->symbolic), free(m->paged), free(m->checked);
    free(m->space), free(m->in_bytes), free(m->syms), free(m->match), free(m->kind);
    free(m);
}

static bool has_sym_dim(const kiln_node_rec *r)
{
    for (int d = 0; d < r->rank; d++)
        if (kiln_dim_is_sym(r->dims[d])) return true;
    return false;
}

/* The node lists of p's runs (each in node order). */
static kiln_status memo_build(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    uint32_t n = g->n_nodes ? g->n_nodes : 1;
    kiln_run_memo *m = calloc(1, sizeof *m);
    if (!m) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    p->memo = m;
    m->inputs = malloc(n * sizeof *m->inputs), m->views = malloc(n * sizeof *m->views);
    m->symbolic = malloc(n * sizeof *m->symbolic), m->paged = malloc(n * sizeof *m->paged);
    m->checked = malloc(n * sizeof *m->checked), m->space = malloc(n), m->in_bytes = calloc(n, sizeof *m->in_bytes);
    m->syms = calloc(g->n_syms + 1, sizeof *m->syms);
    if (!m->inputs || !m->views || !m->symbolic || !m->paged || !m->checked || !m->space || !m->in_bytes || !m->syms) {
        kiln_sched_memo_free(m);
        p->memo = NULL;
        return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *r = &g->nodes[i];
        m->space[i] = -1;
        if (r->op == KILN_OP_INPUT) m->inputs[m->n_inputs++] = i, m->space[i] = (int8_t)device_input_space(p, i);
        else if (p->root[i] != i && g->nodes[p->root[i]].op == KILN_OP_INPUT) m->views[m->n_views++] = i;
        if (has_sym_dim(r)) m->symbolic[m->n_symbolic++] = i;
        if (r->op == KILN_OP_PAGED_ATTENTION) m->paged[m->n_paged++] = i;
    }
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        if (!kiln_backend_is_device(kiln_backends[p->region_be[r]])) continue;
        const kiln_region *reg = &p->fusion.regions[r];
        for (uint32_t a = 0; a < reg->n_nodes; a++) {
            enum kiln_op op = (enum kiln_op)g->nodes[reg->nodes[a]].op;
            if (op == KILN_OP_KV_SCATTER || op == KILN_OP_GET_ROWS || op == KILN_OP_ATTENTION)
                m->checked[m->n_checked++] = reg->nodes[a];
        }
    }
    return KILN_OK;
}

/* What binding position k names (kind 1 symbol, 2 input, 3 output; its index), from the memo when
 * the name there still matches (one strcmp instead of a search of the graph's nodes). */
static int match(kiln_plan *p, size_t k, const char *name, uint32_t *idx)
{
    const kiln_graph *g = p->g;
    kiln_run_memo *m = p->memo;
    if (k < m->n_match && m->kind[k]) {
        uint32_t i = m->match[k];
        const char *was = m->kind[k] == 1 ? g->syms[i].name : m->kind[k] == 2 ? g->nodes[i].name : g->outs[i].name;
        if (!strcmp(was, name)) return *idx = i, m->kind[k];
    }
    int kind = 0;
    if ((*idx = kiln_graph_find_sym(g, name)) != KILN_IDX_NONE) kind = 1;
    else if ((*idx = kiln_graph_find_leaf(g, name)) != KILN_IDX_NONE && g->nodes[*idx].op == KILN_OP_INPUT) kind = 2;
    else if ((*idx = kiln_graph_find_output(g, name)) != KILN_IDX_NONE) kind = 3;
    if (!kind) return 0;
    if (k >= m->n_match && k < 256) { /* positions kept: engines bind a few dozen things */
        size_t cap = k + 8;
        uint32_t *mt = realloc(m->match, cap * sizeof *mt);
        if (mt) m->match = mt;
        int8_t *kd = mt ? realloc(m->kind, cap) : NULL;
        if (kd) {
            m->kind = kd;
            memset(kd + m->n_match, 0, cap - m->n_match);
            m->n_match = (uint32_t)cap;
        }
    }
    if (k < m->n_match) m->match[k] = *idx, m->kind[k] = (int8_t)kind;
    return kind;
}

/* Matches bindings to symbols, inputs and outputs; checks kinds, sizes, duplicates, completeness.
 * A device-bound input must only be read by kernels on one device. */
static kiln_status bind(kiln_plan *p, const kiln_binding *b, size_t nb, const kiln_binding **out_bind)
{
    const kiln_graph *g = p->g;
    kiln_ctx *ctx = p->ctx;
    kiln_run_memo *m = p->memo;
    bool *sym_set = calloc(g->n_syms + 1, 1);
    if (!sym_set) return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "out of memory");
    kiln_status s = KILN_OK;
    for (uint32_t a = 0; a < m->n_inputs; a++) p->bufs[m->inputs[a]] = p->bound_dev[m->inputs[a]] = NULL;
    for (size_t k = 0; k < nb && s == KILN_OK; k++) {
        const char *name = b[k].name;
        uint32_t idx;
        if (!name) { s = kiln_ctx_fail(ctx, KILN_ERR_BINDING, "binding %zu has no name", k); break; }
        int kind = match(p, k, name, &idx);
        if (kind == 1) {
            if (sym_set[idx]) s = kiln_ctx_fail(ctx, KILN_ERR_BINDING, "symbol '%s' bound twice", name);
            else if (b[k].value < 1 || b[k].value > g->syms[idx].max)
                s = kiln_ctx_fail(ctx, KILN_ERR_SYMBOL, "symbol '%s' = %lld is out of its bounds [1, %lld]", name,
                                  (long long)b[k].value, (long long)g->syms[idx].max);
            sym_set[idx] = true;
            p->sym_vals[idx] = b[k].value;
        } else if (kind == 2) {
            if (p->bufs[idx] || p->bound_dev[idx]) s = kiln_ctx_fail(ctx, KILN_ERR_BINDING, "input '%s' bound twice", name);
            else if (!b[k].data) s = kiln_ctx_fail(ctx, KILN_ERR_BINDING, "input '%s' bound with NULL data", name);
            int dsp = b[k].device ? m->space[idx] : -1;
            if (s == KILN_OK && b[k].device && dsp < 0)
                s = kiln_ctx_fail(ctx, KILN_ERR_BINDING,
                                  "input '%s' is bound as device memory, but the host (or more than one device) reads it", name);
            if (b[k].device) {
                p->bound_dev[idx] = b[k].data;
                p->bound_dev_be[idx] = (int8_t)dsp;
            } else {
                p->bufs[idx] = b[k].data;
            }
            m->in_bytes[idx] = b[k].bytes;
        } else if (kind == 3) {
            if (out_bind[idx]) s = kiln_ctx_fail(ctx, KILN_ERR_BINDING, "output '%s' bound twice", name);
            else if (!b[k].data) s = kiln_ctx_fail(ctx, KILN_ERR_BINDING, "output '%s' bound with NULL data", name);
            out_bind[idx] = &b[k];
        } else if (kiln_graph_find_leaf(g, name) != KILN_IDX_NONE) {
            s = kiln_ctx_fail(ctx, KILN_ERR_BINDING, "'%s' is a %s, not an input: it cannot be bound at run", name,
                              kiln_op_name((enum kiln_op)g->nodes[kiln_graph_find_leaf(g, name)].op));
        } else {
            s = kiln_ctx_fail(ctx, KILN_ERR_NAME, "binding '%s' names no input, output or symbol of the graph", name);
        }
    }
    for (uint32_t i = 0; s == KILN_OK && i < g->n_syms; i++)
        if (!sym_set[i]) s = kiln_ctx_fail(ctx, KILN_ERR_SYMBOL, "symbol '%s' is not bound", g->syms[i].name);
    free(sym_set);
    return s;
}

/* Data pointers of every node but the inputs (bound) and their views: weights, states, the arena. */
static void fixed_bufs(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *r = &g->nodes[i];
        if (r->op == KILN_OP_INPUT || (p->root[i] != i && g->nodes[p->root[i]].op == KILN_OP_INPUT)) continue;
        if (r->op == KILN_OP_WEIGHT) p->bufs[i] = (void *)r->data;
        else if (r->op == KILN_OP_STATE) p->bufs[i] = p->state_mem[i];
        else if (p->root[i] != i) p->bufs[i] = (unsigned char *)p->bufs[p->root[i]] + p->offset[i];
        else p->bufs[i] = p->arena + p->arena_off[i];
    }
}

/* Resolves dims (of the nodes with symbols, when their values changed) and data pointers of every
 * node for this run and checks input/output sizes. */
static kiln_status resolve(kiln_plan *p, const kiln_binding *const *out_bind)
{
    const kiln_graph *g = p->g;
    kiln_run_memo *m = p->memo;
    if (!m->fixed || memcmp(m->syms, p->sym_vals, g->n_syms * sizeof *m->syms)) {
        for (uint32_t a = 0; a < m->n_symbolic; a++) kiln_node_numel(&g->nodes[m->symbolic[a]], p->sym_vals, p->dims[m->symbolic[a]]);
        if (!m->fixed) { /* the others' dims: their constants (compile time left them at the bounds) */
            for (uint32_t i = 0; i < g->n_nodes; i++) kiln_node_numel(&g->nodes[i], p->sym_vals, p->dims[i]);
            fixed_bufs(p);
            m->fixed = true;
        }
        memcpy(m->syms, p->sym_vals, g->n_syms * sizeof *m->syms);
    }
    for (uint32_t a = 0; a < m->n_inputs; a++) {
        uint32_t i = m->inputs[a];
        const kiln_node_rec *r = &g->nodes[i];
        if (!p->bufs[i] && !p->bound_dev[i]) return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "input '%s' is not bound", r->name);
        size_t want = kiln_node_bytes(r, p->dims[i]);
        if (m->in_bytes[i] != want) {
            char ds[160];
            return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "input '%s' %s %s needs %zu bytes, got %zu", r->name,
                                 kiln_dtype_name((kiln_dtype)r->dtype), kiln_graph_dims_str(g, r->rank, r->dims, ds, sizeof ds),
                                 want, m->in_bytes[i]);
        }
    }
    for (uint32_t a = 0; a < m->n_views; a++) {
        uint32_t i = m->views[a];
        p->bufs[i] = (unsigned char *)p->bufs[p->root[i]] + p->offset[i];
    }
    for (uint32_t o = 0; o < g->n_outs; o++) {
        uint32_t i = g->outs[o].node;
        size_t want = kiln_node_bytes(&g->nodes[i], p->dims[i]);
        if (out_bind[o] && out_bind[o]->bytes < want)
            return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "output '%s' needs %zu bytes, the binding holds %zu",
                                 g->outs[o].name, want, out_bind[o]->bytes);
    }
    return KILN_OK;
}

kiln_status kiln_sched_run_begin(kiln_plan *p, const kiln_binding *b, size_t nb, const kiln_binding ***out_bind)
{
    if (nb && !b) return kiln_ctx_fail(p->ctx, KILN_ERR_INVALID_ARG, "kiln_run: bindings is NULL but n = %zu", nb);
    *out_bind = calloc(p->g->n_outs + 1, sizeof **out_bind);
    if (!*out_bind) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    p->ran = false;
    if (p->what_if) return kiln_ctx_fail(p->ctx, KILN_ERR_UNSUPPORTED, "a what-if plan can be explained, not run");
    kiln_status s = p->memo ? KILN_OK : memo_build(p);
    if (s == KILN_OK) s = bind(p, b, nb, *out_bind);
    if (s == KILN_OK) s = resolve(p, *out_bind);
    if (s == KILN_OK) s = check_paged(p);
    if (s == KILN_OK) s = check_indices(p);
    return s;
}

