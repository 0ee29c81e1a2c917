/* The executor: runs a compiled plan's regions in order over memory that lives where each region
 * runs. Host backends (ref, cpu) share the host arena; each device backend that runs regions has
 * its own arena (liveness reuse), resident weights (uploaded and repacked once at compile),
 * resident states (on the backend that writes them), a per-run parameter buffer, explicit
 * transfers where a value crosses memories, and a recording of its launches replayed each run.
 * Must not contain kernels or know any backend's internals. */
#include "graph/dtype.h"
#include "sched/plan.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEV_ALIGN 256

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int space_of_be(int be) { return kiln_backend_is_device(kiln_backends[be]) ? be : KILN_SPACE_HOST; }

static kiln_status dev_fail(kiln_plan *p, int be, kiln_status s, const char *what, const char *err)
{
    return kiln_ctx_fail(p->ctx, s, "%s: %s: %s", kiln_backends[be]->name, what, err);
}

/* Root of node i's memory, following aliases. */
static uint32_t root_of(const kiln_plan *p, uint32_t i) { return p->root[i]; }

void kiln_sched_lock(const kiln_plan *p, bool lock)
{
    bool use[KILN_BACKEND_COUNT] = {false};
    for (uint32_t r = 0; p->region_be && r < p->fusion.n_regions; r++) use[p->region_be[r]] = true;
    for (int i = 0; i < KILN_BACKEND_COUNT; i++) {
        int b = lock ? i : KILN_BACKEND_COUNT - 1 - i;
        if (!use[b] || !kiln_backend_is_device(kiln_backends[b])) continue;
        if (lock) pthread_mutex_lock(&p->ctx->be_mu[b]);
        else pthread_mutex_unlock(&p->ctx->be_mu[b]);
    }
}

/* ------------------------------------------------------------------ compile-time setup */

/* Home memory of every root: where its producer runs (inputs: host; states: where they are
 * written, else where first read; weights: every space that reads them has its own copy). */
static void assign_homes(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    for (uint32_t i = 0; i < g->n_nodes; i++) p->home[i] = KILN_SPACE_HOST;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        uint32_t r = p->fusion.region_of[i];
        if (r != KILN_IDX_NONE && p->root[i] == i) p->home[i] = (int8_t)space_of_be(p->region_be[r]);
    }
    /* states: the space of the region holding their kv_scatter, else of their first reader */
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != KILN_OP_STATE) continue;
        int home = -1;
        for (uint32_t j = 0; j < g->n_nodes && home < 0; j++)
            if (g->nodes[j].op == KILN_OP_KV_SCATTER && root_of(p, g->nodes[j].src[0]) == i && p->fusion.region_of[j] != KILN_IDX_NONE)
                home = space_of_be(p->region_be[p->fusion.region_of[j]]);
        for (uint32_t r = 0; r < p->fusion.n_regions && home < 0; r++) {
            const kiln_region *reg = &p->fusion.regions[r];
            for (uint32_t a = 0; a < reg->n_nodes && home < 0; a++)
                for (int s = 0; s < g->nodes[reg->nodes[a]].n_src; s++) {
                    uint32_t src = g->nodes[reg->nodes[a]].src[s];
                    if (src != KILN_IDX_NONE && root_of(p, src) == i) home = space_of_be(p->region_be[r]);
                }
        }
        p->home[i] = (int8_t)(home < 0 ? KILN_SPACE_HOST : home);
    }
}

static bool push_xfer(kiln_plan *p, uint32_t region, uint32_t node, int from, int to)
{
    for (uint32_t x = 0; x < p->n_xfers; x++)
        if (p->xfers[x].node == node && p->xfers[x].to == to) return true; /* copied once per run */
    if (p->n_xfers == p->cap_xfers) {
        uint32_t cap = p->cap_xfers ? 2 * p->cap_xfers : 16;
        kiln_xfer *grown = realloc(p->xfers, cap * sizeof *grown);
        if (!grown) return false;
        p->xfers = grown;
        p->cap_xfers = cap;
    }
    p->xfers[p->n_xfers++] = (kiln_xfer){.region = region, .node = node, .from = (int8_t)from, .to = (int8_t)to};
    return true;
}

/* Transfers: a value read by a region in a memory other than its home is copied there before the
 * region, once per run (weights are resident everywhere they are read). */
static kiln_status plan_transfers(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        const kiln_region *reg = &p->fusion.regions[r];
        int sp = space_of_be(p->region_be[r]);
        for (uint32_t a = 0; a < reg->n_nodes; a++)
            for (int s = 0; s < g->nodes[reg->nodes[a]].n_src; s++) {
                uint32_t src = g->nodes[reg->nodes[a]].src[s];
                if (src == KILN_IDX_NONE) continue;
                uint32_t root = root_of(p, src);
                uint8_t op = g->nodes[root].op;
                if (op == KILN_OP_WEIGHT || p->home[root] == sp) continue;
                if (p->fusion.region_of[root] == r) continue;
                if (!push_xfer(p, r, root, p->home[root], sp)) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
                if (op == KILN_OP_STATE) {
                    p->state_shared = true; /* a state read in two memories: copied every run */
                }
            }
    }
    return KILN_OK;
}

/* Lays out space sp's arena: every computed root or input that lives there or is copied there. */
static kiln_status plan_space(kiln_plan *p, int sp)
{
    const kiln_graph *g = p->g;
    uint32_t n = g->n_nodes;
    kiln_dev_space *d = &p->dev[sp];
    uint32_t *first = malloc((n + 1) * sizeof *first), *last = malloc((n + 1) * sizeof *last);
    uint32_t *order = malloc((n + 1) * sizeof *order);
    size_t *size = calloc(n + 1, sizeof *size);
    bool *in = calloc(n + 1, sizeof *in);
    kiln_status st = KILN_OK;
    if (!first || !last || !order || !size || !in || !(d->off = malloc(n * sizeof *d->off)) ||
        !(d->bufs = calloc(n, sizeof *d->bufs)) || !(d->wbuf = calloc(n, sizeof *d->wbuf))) {
        st = kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    kiln_sched_lifetimes(p, first, last);
    for (uint32_t i = 0; i < n; i++) {
        d->off[i] = SIZE_MAX;
        uint8_t op = g->nodes[i].op;
        if (p->root[i] != i || op == KILN_OP_WEIGHT || op == KILN_OP_STATE) continue;
        in[i] = p->home[i] == sp && op != KILN_OP_INPUT;
    }
    for (uint32_t x = 0; x < p->n_xfers; x++)
        if (p->xfers[x].to == sp && g->nodes[p->xfers[x].node].op != KILN_OP_STATE && g->nodes[p->xfers[x].node].op != KILN_OP_WEIGHT)
            in[p->xfers[x].node] = true;
    uint32_t n_order = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!in[i]) continue;
        if (g->nodes[i].op == KILN_OP_INPUT || first[i] == KILN_IDX_NONE) first[i] = 0;
        size[i] = (kiln_node_bytes(&g->nodes[i], p->max_dims[i]) + DEV_ALIGN - 1) / DEV_ALIGN * DEV_ALIGN;
        order[n_order++] = i;
    }
    d->arena_bytes = kiln_sched_pack(order, n_order, size, first, last, d->off);
out:
    free(first); free(last); free(order); free(size); free(in);
    return st;
}

static kiln_status dev_alloc(kiln_plan *p, int be, size_t bytes, void **out)
{
    char err[512] = "";
    kiln_status s = kiln_backends[be]->alloc(p->ctx->be_state[be], bytes ? bytes : DEV_ALIGN, out, err, sizeof err);
    if (s != KILN_OK) return dev_fail(p, be, s, "allocating device memory", err);
    return KILN_OK;
}

/* Bytes weight w takes in space sp's memory: its device layout (the backend's weight_bytes, e.g.
 * GGUF blocks split into aligned words) or the host bytes; *repack: the layouts differ. */
static size_t weight_dev_bytes(const kiln_plan *p, int sp, uint32_t w, bool *repack)
{
    const kiln_node_rec *n = &p->g->nodes[w];
    kiln_dtype t = (kiln_dtype)n->dtype;
    int64_t k = n->rank ? p->max_dims[w][n->rank - 1] : 1, rows = 1;
    for (int i = 0; i + 1 < n->rank; i++) rows *= p->max_dims[w][i];
    const kiln_backend_i *b = kiln_backends[sp];
    size_t dev = b->weight_bytes ? b->weight_bytes(p->ctx->be_state[sp], t, rows, k) : 0;
    if (repack) *repack = dev != 0;
    return dev ? dev : (size_t)rows * kiln_row_bytes(t, k);
}

/* Uploads weight w for space sp in the device layout its kernels read (weight_dev_bytes). */
static kiln_status upload_weight(kiln_plan *p, int sp, uint32_t w)
{
    kiln_dev_space *d = &p->dev[sp];
    if (d->wbuf[w]) return KILN_OK;
    const kiln_node_rec *n = &p->g->nodes[w];
    bool repack;
    size_t bytes = weight_dev_bytes(p, sp, w, &repack);
    kiln_status s;
    void *host = (void *)n->data, *tmp = NULL;
    if (repack) {
        int64_t k = n->rank ? p->max_dims[w][n->rank - 1] : 1, rows = 1;
        for (int i = 0; i + 1 < n->rank; i++) rows *= p->max_dims[w][i];
        if (!(tmp = malloc(bytes))) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory repacking weight '%s'", n->name);
        kiln_backends[sp]->weight_repack(p->ctx->be_state[sp], (kiln_dtype)n->dtype, rows, k, n->data, tmp);
        host = tmp;
    }
    char err[512] = "";
    if ((s = dev_alloc(p, sp, bytes, &d->wbuf[w])) == KILN_OK) {
        s = kiln_backends[sp]->upload(p->ctx->be_state[sp], d->wbuf[w], host, bytes, err, sizeof err);
        if (s == KILN_OK) s = kiln_backends[sp]->sync(p->ctx->be_state[sp], err, sizeof err);
        if (s != KILN_OK) s = dev_fail(p, sp, s, "uploading a weight", err);
    }
    free(tmp);
    return s;
}

/* Device memory the plan will hold in space sp at the symbols' bounds (its arena, parameters, and
 * every weight and state homed or read there) against what the device has free: a plan too large
 * is refused before anything is allocated there, with the sizes named, instead of the one
 * allocation that happened to fail (issue #17). No check where the backend does not say. */
static kiln_status check_device_memory(kiln_plan *p, int sp)
{
    const kiln_backend_i *b = kiln_backends[sp];
    uint64_t free_b = 0, total = 0;
    if (!b->mem_info || !b->mem_info(p->ctx->be_state[sp], &free_b, &total)) return KILN_OK;
    const kiln_graph *g = p->g;
    bool *seen = calloc(g->n_nodes + 1, 1);
    if (!seen) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    unsigned __int128 weights = 0, states = 0, big = 0;
    uint32_t big_w = KILN_IDX_NONE;
    for (uint32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == KILN_OP_STATE && p->home[i] == sp) seen[i] = true, states += kiln_node_bytes(&g->nodes[i], p->max_dims[i]);
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        if (space_of_be(p->region_be[r]) != sp) continue;
        const kiln_region *reg = &p->fusion.regions[r];
        for (uint32_t a = 0; a < reg->n_nodes; a++)
            for (int k = 0; k < g->nodes[reg->nodes[a]].n_src; k++) {
                uint32_t src = g->nodes[reg->nodes[a]].src[k];
                uint32_t root = src == KILN_IDX_NONE ? KILN_IDX_NONE : root_of(p, src);
                if (root == KILN_IDX_NONE || seen[root]) continue;
                seen[root] = true;
                if (g->nodes[root].op == KILN_OP_STATE) states += kiln_node_bytes(&g->nodes[root], p->max_dims[root]);
                if (g->nodes[root].op != KILN_OP_WEIGHT) continue;
                size_t wb = weight_dev_bytes(p, sp, root, NULL);
                weights += wb;
                if (wb > big) big = wb, big_w = root;
            }
    }
    free(seen);
    const kiln_dev_space *d = &p->dev[sp];
    unsigned __int128 need = weights + states + d->arena_bytes + (unsigned __int128)d->n_params * sizeof(int32_t);
    if (need <= free_b) return KILN_OK;
    char lab[300] = "";
    if (big_w != KILN_IDX_NONE && g->nodes[big_w].name)
        snprintf(lab, sizeof lab, ", the largest '%s' %.4g GiB", g->nodes[big_w].name, (double)big / 1073741824.0);
    const double gib = 1073741824.0;
    return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM,
                         "kiln_compile: the plan needs %.4g GiB of %s device memory (weights %.4g GiB%s, states %.4g GiB, "
                         "intermediates %.4g GiB at the symbols' bounds); the device has %.4g GiB free of %.4g GiB",
                         (double)need / gib, b->name, (double)weights / gib, lab, (double)states / gib,
                         (double)d->arena_bytes / gib, (double)free_b / gib, (double)total / gib);
}

/* Device copies of every state homed on sp, zeroed like the host ones. */
static kiln_status upload_state(kiln_plan *p, int sp, uint32_t i)
{
    kiln_dev_space *d = &p->dev[sp];
    if (d->wbuf[i]) return KILN_OK;
    size_t bytes = kiln_node_bytes(&p->g->nodes[i], p->max_dims[i]);
    kiln_status s = dev_alloc(p, sp, bytes, &d->wbuf[i]);
    char err[512] = "";
    if (s == KILN_OK) s = kiln_backends[sp]->upload(p->ctx->be_state[sp], d->wbuf[i], p->state_mem[i], bytes, err, sizeof err);
    if (s == KILN_OK) s = kiln_backends[sp]->sync(p->ctx->be_state[sp], err, sizeof err);
    return s == KILN_OK || err[0] == 0 ? s : dev_fail(p, sp, s, "uploading a state", err);
}

static kiln_status devices_setup(kiln_plan *p);

kiln_status kiln_sched_devices_setup(kiln_plan *p)
{
    kiln_sched_lock(p, true);
    kiln_status s = devices_setup(p);
    kiln_sched_lock(p, false);
    return s;
}

static kiln_status devices_setup(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    if (!(p->home = malloc((g->n_nodes + 1) * sizeof *p->home))) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
    assign_homes(p);
    kiln_status s = plan_transfers(p);
    if (s != KILN_OK) return s;
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        int sp = space_of_be(p->region_be[r]);
        if (sp != KILN_SPACE_HOST) p->dev[sp].used = true;
    }
    int n_spaces = 0;
    for (int sp = 0; sp < KILN_BACKEND_COUNT; sp++) {
        kiln_dev_space *d = &p->dev[sp];
        if (!d->used) continue;
        n_spaces++;
        if ((s = plan_space(p, sp)) != KILN_OK) return s;
        d->n_params = g->n_syms > KILN_PARAM_SLOTS_MIN ? g->n_syms : KILN_PARAM_SLOTS_MIN;
        if ((s = check_device_memory(p, sp)) != KILN_OK) return s;
        if ((s = dev_alloc(p, sp, d->arena_bytes, &d->arena)) != KILN_OK) return s;
        if (!(d->params_host = calloc(d->n_params, sizeof *d->params_host))) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory");
        if ((s = dev_alloc(p, sp, d->n_params * sizeof(int32_t), &d->params)) != KILN_OK) return s;
        for (uint32_t i = 0; i < g->n_nodes; i++)
            if (g->nodes[i].op == KILN_OP_STATE && p->home[i] == sp && (s = upload_state(p, sp, i)) != KILN_OK) return s;
    }
    /* weights read by device regions (and states read there but homed elsewhere: a copy slot) */
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        int sp = space_of_be(p->region_be[r]);
        if (sp == KILN_SPACE_HOST) continue;
        const kiln_region *reg = &p->fusion.regions[r];
        for (uint32_t a = 0; a < reg->n_nodes; a++)
            for (int k = 0; k < g->nodes[reg->nodes[a]].n_src; k++) {
                uint32_t src = g->nodes[reg->nodes[a]].src[k];
                if (src == KILN_IDX_NONE) continue;
                uint32_t root = root_of(p, src);
                if (g->nodes[root].op == KILN_OP_WEIGHT && (s = upload_weight(p, sp, root)) != KILN_OK) return s;
                if (g->nodes[root].op == KILN_OP_STATE && !p->dev[sp].wbuf[root] && (s = upload_state(p, sp, root)) != KILN_OK) return s;
            }
    }
    /* One device memory, every region there, and a backend that records: replay each run. */
    p->record_space = -1;
    if (n_spaces == 1 && !p->state_shared) {
        int sp = -1;
        bool all = true;
        for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
            int s2 = space_of_be(p->region_be[r]);
            if (s2 == KILN_SPACE_HOST) all = false;
            else sp = s2;
        }
        if (all && sp >= 0 && kiln_backends[sp]->record_begin && !p->opts.no_record) p->record_space = sp;
    }
    return KILN_OK;
}

void kiln_sched_devices_free(kiln_plan *p) /* the caller (kiln_plan_free) holds the device locks */
{
    for (int sp = 0; sp < KILN_BACKEND_COUNT; sp++) {
        kiln_dev_space *d = &p->dev[sp];
        if (!d->used) continue;
        const kiln_backend_i *b = kiln_backends[sp];
        void *st = p->ctx->be_state[sp];
        for (int i = 0; i < d->n_rec; i++)
            if (d->rec[i] && b->record_free) b->record_free(st, d->rec[i]);
        for (uint32_t i = 0; d->wbuf && i < p->g->n_nodes; i++)
            if (d->wbuf[i]) b->free(st, d->wbuf[i]);
        if (d->arena) b->free(st, d->arena);
        if (d->params) b->free(st, d->params);
        free(d->off); free(d->bufs); free(d->wbuf); free(d->params_host);
    }
    free(p->xfers);
    free(p->home);
}

/* ------------------------------------------------------------------ run time */

/* Device address of node i in space sp for this run (aliases resolved through root + offset). */
static void *dev_addr(const kiln_plan *p, int sp, uint32_t i)
{
    const kiln_dev_space *d = &p->dev[sp];
    uint32_t root = p->root[i];
    unsigned char *base;
    if (d->wbuf[root]) base = d->wbuf[root];
    else if (d->off[root] != SIZE_MAX) base = (unsigned char *)d->arena + d->off[root];
    else return NULL;
    return base + p->offset[i];
}

/* Host address of root's value in the host memory (arena, state, weight or bound input). */
static void *host_addr(const kiln_plan *p, uint32_t root) { return p->bufs[root]; }

static kiln_status do_xfer(kiln_plan *p, const kiln_xfer *x)
{
    uint32_t node = x->node;
    size_t bytes = kiln_node_bytes(&p->g->nodes[node], p->dims[node]);
    if (p->g->nodes[node].op == KILN_OP_STATE) bytes = kiln_node_bytes(&p->g->nodes[node], p->max_dims[node]);
    if (bytes == 0) return KILN_OK;
    char err[512] = "";
    kiln_status s = KILN_OK;
    void *host = host_addr(p, node);
    if (x->from != KILN_SPACE_HOST) { /* device -> host (then maybe -> another device) */
        const kiln_backend_i *b = kiln_backends[x->from];
        void *st = p->ctx->be_state[x->from];
        if (p->bound_dev[node] && x->to == x->from) return KILN_OK;
        s = b->download(st, host, dev_addr(p, x->from, node), bytes, err, sizeof err);
        if (s == KILN_OK) s = b->sync(st, err, sizeof err);
        if (s != KILN_OK) return dev_fail(p, x->from, s, "copying a value to the host", err);
    }
    if (x->to != KILN_SPACE_HOST) {
        const kiln_backend_i *b = kiln_backends[x->to];
        void *st = p->ctx->be_state[x->to];
        if (p->bound_dev[node] && p->bound_dev_be[node] == x->to)
            s = b->copy(st, dev_addr(p, x->to, node), p->bound_dev[node], bytes, err, sizeof err);
        else
            s = b->upload(st, dev_addr(p, x->to, node), host, bytes, err, sizeof err);
        if (s != KILN_OK) return dev_fail(p, x->to, s, "copying a value to the device", err);
    }
    return KILN_OK;
}

/* The queries of attention i sit at n_kv - n_tok + t; a kv_scatter feeding its k or v that wrote
 * token t elsewhere disagrees, and the run fails naming both. Checked once here for every backend:
 * for a device region at bind, from positions bound as a host input (check_indices); for a host
 * region by the executor right before its launch (host_ran: the positions are then in p->bufs,
 * wherever on the host they were computed). */
kiln_status kiln_sched_check_attention_pos(kiln_plan *p, uint32_t i, bool host_ran)
{
    const kiln_graph *g = p->g;
    const kiln_node_rec *n = &g->nodes[i];
    int64_t n_kv = kiln_dim_is_sym(n->dim) ? p->sym_vals[kiln_sym_index(n->dim)] : n->dim, n_tok = p->dims[n->src[0]][0];
    for (int k = 1; k <= 2; k++) {
        const kiln_node_rec *w = &g->nodes[n->src[k]];
        if (w->op != KILN_OP_KV_SCATTER || p->dims[w->src[2]][0] != n_tok) continue;
        uint32_t root = p->root[w->src[2]];
        const int32_t *pos = host_ran ? p->bufs[w->src[2]]
                             : g->nodes[root].op == KILN_OP_INPUT && p->bufs[root]
                                 ? (const int32_t *)((const unsigned char *)p->bufs[root] + p->offset[w->src[2]])
                                 : NULL; /* not known on the host before the run */
        for (int64_t t = 0; pos && t < n_tok; t++)
            if (pos[t] != n_kv - n_tok + t) {
                const char *op = kiln_op_name((enum kiln_op)n->op);
                char lab[300];
                if (n->name) snprintf(lab, sizeof lab, "%s '%s'", op, n->name);
                else snprintf(lab, sizeof lab, "%s #%u", op, i);
                return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING,
                                     "%s: its queries sit at positions n_kv - n_tok + t = %lld.. (n_kv = %lld, n_tok = %lld) "
                                     "but the kv_scatter writing %s used pos[%lld] = %d: bind n_kv = pos + n_tok",
                                     lab, (long long)(n_kv - n_tok), (long long)n_kv,
                                     (long long)n_tok, k == 1 ? "k" : "v", (long long)t, pos[t]);
            }
    }
    return KILN_OK;
}

uint64_t kiln_sched_run_sig(const kiln_plan *p, int sp)
{
    const kiln_backend_i *b = kiln_backends[sp];
    if (!b->active) return 0;
    kiln_exec_view v = {.g = p->g, .bufs = p->dev[sp].bufs, .dims = (const int64_t(*)[KILN_MAX_RANK])p->dims,
                        .sym_vals = p->sym_vals, .params = p->dev[sp].params};
    uint64_t h = 1469598103934665603ull; /* FNV-1a over (region, mask) */
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        if (space_of_be(p->region_be[r]) != sp) continue;
        uint64_t m = b->active(p->ctx->be_state[sp], p->kernels[r], &v);
        for (int k = 0; k < 8; k++) h = (h ^ ((m >> (8 * k)) & 0xff)) * 1099511628211ull;
        h = (h ^ (r & 0xff)) * 1099511628211ull;
    }
    return h;
}

static kiln_status launch_region(kiln_plan *p, uint32_t r)
{
    int be = p->region_be[r];
    int sp = space_of_be(be);
    char err[KILN_ERR_CAP] = ""; /* the sink's capacity */
    const kiln_region *reg = &p->fusion.regions[r];
    for (uint32_t a = 0; sp == KILN_SPACE_HOST && a < reg->n_nodes; a++) /* devices': at bind (plan.c) */
        if (p->g->nodes[reg->nodes[a]].op == KILN_OP_ATTENTION) {
            kiln_status s = kiln_sched_check_attention_pos(p, reg->nodes[a], true);
            if (s != KILN_OK) return s;
        }
    kiln_exec_view v = {.g = p->g, .bufs = sp == KILN_SPACE_HOST ? p->bufs : p->dev[sp].bufs,
                        .dims = (const int64_t(*)[KILN_MAX_RANK])p->dims, .sym_vals = p->sym_vals,
                        .params = sp == KILN_SPACE_HOST ? NULL : p->dev[sp].params};
    kiln_status s = kiln_backends[be]->launch(p->ctx->be_state[be], p->kernels[r], reg, &v, err, sizeof err);
    if (s != KILN_OK) return kiln_ctx_fail(p->ctx, s, "%s kernel %u: %s", kiln_backends[be]->name, r, err);
    p->stats.launches++; /* while recording: taken back by kiln_sched_execute */
    return KILN_OK;
}

static kiln_status sync_be(kiln_plan *p, int be)
{
    char err[512] = "";
    const kiln_backend_i *b = kiln_backends[be];
    if (!b->sync) return KILN_OK;
    kiln_status s = b->sync(p->ctx->be_state[be], err, sizeof err);
    return s == KILN_OK ? s : dev_fail(p, be, s, "running the plan", err);
}

/* Writes every used device's parameter buffer and resolves its node addresses for this run. */
static kiln_status prepare_devices(kiln_plan *p)
{
    for (int sp = 0; sp < KILN_BACKEND_COUNT; sp++) {
        kiln_dev_space *d = &p->dev[sp];
        if (!d->used) continue;
        for (uint32_t i = 0; i < p->g->n_syms; i++) d->params_host[i] = (int32_t)p->sym_vals[i];
        char err[512] = "";
        kiln_status s = kiln_backends[sp]->upload(p->ctx->be_state[sp], d->params, d->params_host, d->n_params * sizeof(int32_t), err, sizeof err);
        if (s != KILN_OK) return dev_fail(p, sp, s, "writing the parameter buffer", err);
        for (uint32_t i = 0; !d->bufs_set && i < p->g->n_nodes; i++) d->bufs[i] = dev_addr(p, sp, i);
        d->bufs_set = true;
    }
    return KILN_OK;
}

/* Profiling: a device backend with timers times region r's kernels on the device (slots 0 and 1
 * around its launches): the host's clock would add the launch and the sync's round trip, which
 * hide a small kernel's time. False when the backend has none or the mark fails. */
static bool timer_mark(kiln_plan *p, uint32_t r, int slot)
{
    const kiln_backend_i *b = kiln_backends[p->region_be[r]];
    char err[256];
    return b->timer_mark && b->timer_read && b->timer_mark(p->ctx->be_state[p->region_be[r]], slot, err, sizeof err) == KILN_OK;
}

/* The device time between the marks (after the sync), or host_s when it cannot be read. */
static double timer_seconds(kiln_plan *p, uint32_t r, double host_s)
{
    const kiln_backend_i *b = kiln_backends[p->region_be[r]];
    char err[256];
    double t = 0;
    return b->timer_read(p->ctx->be_state[p->region_be[r]], 0, 1, &t, err, sizeof err) == KILN_OK && t > 0 ? t : host_s;
}

/* Regions [r0, r1) one by one, transfers first (x: the first transfer of region r0 or later). */
static kiln_status run_regions(kiln_plan *p, uint32_t r0, uint32_t r1, uint32_t x)
{
    kiln_status s = KILN_OK;
    for (uint32_t r = r0; s == KILN_OK && r < r1; r++) {
        for (; s == KILN_OK && x < p->n_xfers && p->xfers[x].region == r; x++) s = do_xfer(p, &p->xfers[x]);
        if (s != KILN_OK) break;
        double t0 = p->profiling ? now_s() : 0;
        bool dev_t = p->profiling && timer_mark(p, r, 0);
        s = launch_region(p, r);
        dev_t = dev_t && s == KILN_OK && timer_mark(p, r, 1);
        if (s == KILN_OK && p->profiling) {
            s = sync_be(p, p->region_be[r]);
            double t = now_s() - t0;
            p->meas_s[r] += dev_t && s == KILN_OK ? timer_seconds(p, r, t) : t;
            p->n_meas[r]++;
        }
        if (s == KILN_OK && p->check_finite) s = kiln_sched_check_finite(p, r);
    }
    return s;
}

kiln_status kiln_sched_execute_range(kiln_plan *p, uint32_t r0, uint32_t r1)
{
    kiln_status s = r0 == 0 ? prepare_devices(p) : KILN_OK;
    uint32_t x = 0;
    while (x < p->n_xfers && p->xfers[x].region < r0) x++;
    return s == KILN_OK ? run_regions(p, r0, r1, x) : s;
}

kiln_status kiln_sched_prepare_all(kiln_plan *p)
{
    kiln_status s = prepare_devices(p);
    for (uint32_t x = 0; s == KILN_OK && x < p->n_xfers; x++) s = do_xfer(p, &p->xfers[x]);
    return s;
}

kiln_status kiln_sched_launch_range(kiln_plan *p, uint32_t r0, uint32_t r1)
{
    kiln_status s = KILN_OK;
    for (uint32_t r = r0; s == KILN_OK && r < r1; r++) s = launch_region(p, r);
    return s;
}

void *kiln_sched_dev_addr(const kiln_plan *p, uint32_t node)
{
    int sp = p->home[p->root[node]];
    return sp == KILN_SPACE_HOST ? NULL : dev_addr(p, sp, node);
}

kiln_status kiln_sched_put(kiln_plan *p, uint32_t node, const void *src, size_t bytes)
{
    uint32_t root = p->root[node];
    int sp = p->home[root];
    if (sp == KILN_SPACE_HOST) {
        memcpy((unsigned char *)p->bufs[root] + p->offset[node], src, bytes);
        return KILN_OK;
    }
    char err[512] = "";
    kiln_status s = kiln_backends[sp]->upload(p->ctx->be_state[sp], dev_addr(p, sp, node), src, bytes, err, sizeof err);
    return s == KILN_OK ? s : dev_fail(p, sp, s, "writing an all-reduce result", err);
}

kiln_status kiln_sched_execute(kiln_plan *p)
{
    kiln_status s = prepare_devices(p);
    uint32_t x = 0;
    int rs = p->record_space;
    if (s == KILN_OK && rs >= 0 && !p->profiling && !p->check_finite) {
        /* every transfer here is an input upload (nothing runs on the host) */
        for (; s == KILN_OK && x < p->n_xfers; x++) s = do_xfer(p, &p->xfers[x]);
        const kiln_backend_i *b = kiln_backends[rs];
        void *st = p->ctx->be_state[rs];
        kiln_dev_space *d = &p->dev[rs];
        char err[512] = "";
        uint64_t sig = kiln_sched_run_sig(p, rs);
        int i = 0;
        while (i < d->n_rec && (d->rec_sig[i] != sig || !d->rec[i])) i++;
        if (s == KILN_OK && i == d->n_rec) { /* kernels not launched together before: a recording of them */
            i = d->n_rec < KILN_RECS ? d->n_rec++ : d->next_rec++ % KILN_RECS;
            if (d->rec[i] && b->record_free) b->record_free(st, d->rec[i]);
            d->rec[i] = NULL;
            d->rec_sig[i] = sig;
            int64_t launched = p->stats.launches;
            s = b->record_begin(st, err, sizeof err);
            for (uint32_t r = 0; s == KILN_OK && r < p->fusion.n_regions; r++) s = launch_region(p, r);
            kiln_status e = b->record_end(st, &d->rec[i], err, sizeof err);
            if (s == KILN_OK && e != KILN_OK) s = dev_fail(p, rs, e, "recording the plan", err);
            p->stats.recordings++;
            p->stats.launches = launched; /* recorded, not launched */
        }
        if (s == KILN_OK && (s = b->replay(st, d->rec[i], err, sizeof err)) != KILN_OK) s = dev_fail(p, rs, s, "replaying the plan", err);
        if (s == KILN_OK) p->stats.replays++;
        return s;
    }
    return s == KILN_OK ? run_regions(p, 0, p->fusion.n_regions, x) : s;
}

static kiln_status fetch(const kiln_plan *p, uint32_t node, void *dst, size_t bytes, bool wait);

kiln_status kiln_sched_fetch(const kiln_plan *p, uint32_t node, void *dst, size_t bytes) { return fetch(p, node, dst, bytes, true); }

kiln_status kiln_sched_fetch_later(const kiln_plan *p, uint32_t node, void *dst, size_t bytes)
{
    return fetch(p, node, dst, bytes, false);
}

static kiln_status fetch(const kiln_plan *p, uint32_t node, void *dst, size_t bytes, bool wait)
{
    uint32_t root = p->root[node];
    int sp = p->home[root];
    if (sp == KILN_SPACE_HOST) {
        const unsigned char *base = p->g->nodes[root].op == KILN_OP_STATE ? p->state_mem[root] : p->bufs[root];
        memcpy(dst, base + p->offset[node], bytes);
        return KILN_OK;
    }
    char err[512] = "";
    kiln_plan *mp = (kiln_plan *)p;
    kiln_sched_lock(p, true);
    kiln_status s = kiln_backends[sp]->download(p->ctx->be_state[sp], dst, dev_addr(p, sp, node), bytes, err, sizeof err);
    if (s == KILN_OK && wait) s = kiln_backends[sp]->sync(p->ctx->be_state[sp], err, sizeof err);
    kiln_sched_lock(p, false);
    return s == KILN_OK ? s : dev_fail(mp, sp, s, "reading a value back", err);
}

kiln_status kiln_sched_sync_all(kiln_plan *p)
{
    kiln_status s = KILN_OK;
    for (int sp = 0; s == KILN_OK && sp < KILN_BACKEND_COUNT; sp++)
        if (p->dev[sp].used) s = sync_be(p, sp);
    return s;
}

kiln_status kiln_sched_wait_steps(kiln_plan *p)
{
    kiln_status s = KILN_OK;
    for (int sp = 0; s == KILN_OK && sp < KILN_BACKEND_COUNT; sp++) {
        if (!p->dev[sp].used) continue;
        const kiln_backend_i *b = kiln_backends[sp];
        if (!b->wait_steps) {
            s = sync_be(p, sp);
            continue;
        }
        char err[512] = "";
        s = b->wait_steps(p->ctx->be_state[sp], p, err, sizeof err);
        if (s != KILN_OK) s = dev_fail(p, sp, s, "waiting for the plan's steps", err);
    }
    return s;
}

static kiln_status state_put(kiln_plan *p, uint32_t i, const void *src, size_t bytes);

kiln_status kiln_sched_state_put(kiln_plan *p, uint32_t i, const void *src, size_t bytes)
{
    kiln_sched_lock(p, true);
    kiln_status s = state_put(p, i, src, bytes);
    kiln_sched_lock(p, false);
    return s;
}

static kiln_status state_put(kiln_plan *p, uint32_t i, const void *src, size_t bytes)
{
    memcpy(p->state_mem[i], src, bytes);
    for (int sp = 0; sp < KILN_BACKEND_COUNT; sp++) {
        kiln_dev_space *d = &p->dev[sp];
        if (!d->used || !d->wbuf[i]) continue;
        char err[512] = "";
        kiln_status s = kiln_backends[sp]->upload(p->ctx->be_state[sp], d->wbuf[i], p->state_mem[i], bytes, err, sizeof err);
        if (s == KILN_OK) s = kiln_backends[sp]->sync(p->ctx->be_state[sp], err, sizeof err);
        if (s != KILN_OK) return dev_fail(p, sp, s, "writing a state", err);
    }
    return KILN_OK;
}
