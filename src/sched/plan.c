/* kiln_compile and kiln_run: copies the graph, fuses it, chooses backends, lays out memory
 * (liveness-shared arena for intermediates; weights borrowed from the graph copy; states owned),
 * then each run binds symbols/inputs/outputs, resolves shapes and launches the regions in order.
 * Must not contain kernels. */
#include "sched/plan.h"
#include "sched/cost.h"
#include "sched/group.h"
#include "graph/paged.h"
#include "util/env.h"
#include "util/progress.h"

#include <math.h>
#include <pthread.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


/* Milliseconds on a monotonic clock (compile time; seconds for the run statistics: now_ms() / 1e3). */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char *node_label(const kiln_graph *g, uint32_t i, char *buf, size_t n)
{
    const kiln_node_rec *r = &g->nodes[i];
    if (r->name) snprintf(buf, n, "%s '%s'", kiln_op_name((enum kiln_op)r->op), r->name);
    else snprintf(buf, n, "%s #%u", kiln_op_name((enum kiln_op)r->op), i);
    return buf;
}

/* ------------------------------------------------------------------ backend choice */

/* The forced backend (*out >= 0), or -1 for "auto" (placement decides per region). */
static kiln_status pick_backend(kiln_ctx *ctx, const char *name, int *out)
{
    *out = -1;
    if (!name || !*name || strcmp(name, "auto") == 0) return KILN_OK;
    for (int i = 0; i < KILN_BACKEND_COUNT; i++)
        if (strcmp(name, kiln_backends[i]->name) == 0) {
            if (!ctx->be_ok[i])
                return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "backend '%s' is not available: %s", name, ctx->be_detail[i]);
            *out = i;
            return KILN_OK;
        }
    return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "unknown backend '%s' (known: ref, cpu, cuda, vulkan, auto)", name);
}

/* ------------------------------------------------------------------ compile */

KILN_API void kiln_plan_free(kiln_plan *p)
{
    if (!p) return;
    if (p->group) {
        kiln_sched_group_free(p->group);
        free(p);
        return;
    }
    kiln_sched_lock(p, true); /* device memory and kernels go back to backends other threads use */
    kiln_sched_devices_free(p);
    kiln_sched_cache_release(p); /* shared parts: the table frees them */
    if (p->kernels)
        for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
            const kiln_backend_i *b = kiln_backends[p->region_be[r]];
            if (p->kernels[r] && b->kernel_free) b->kernel_free(p->ctx->be_state[p->region_be[r]], p->kernels[r]);
        }
    kiln_sched_lock(p, false);
    if (p->state_mem && p->g)
        for (uint32_t i = 0; i < p->g->n_nodes; i++) kiln_sched_state_free(p->state_mem[i]);
    free(p->pred_s); free(p->xfer_s); free(p->meas_s); free(p->n_meas);
    free(p->arena); free(p->state_mem); free(p->kernels); free(p->region_be);
    free(p->root); free(p->offset); free(p->arena_off); free(p->bufs); free(p->dims); free(p->sym_vals);
    free(p->max_dims); free(p->bound_dev); free(p->bound_dev_be);
    free(p->finite_buf);
    kiln_sched_memo_free(p->memo);
    kiln_fusion_free(&p->fusion);
    kiln_graph_free(p->g);
    free(p);
}

/* A growing edge list; on OOM it frees itself and stays NULL. */
typedef struct edge_list {
    kiln_place_edge *e;   /* edges */
    uint32_t         n;   /* used */
    uint32_t         cap; /* allocated */
} edge_list;

static void push_edge(edge_list *l, kiln_place_edge e)
{
    if (!l->e) return;
    if (l->n == l->cap) {
        kiln_place_edge *grown = realloc(l->e, (size_t)(l->cap *= 2) * sizeof *grown);
        if (!grown) {
            free(l->e);
            l->e = NULL;
            return;
        }
        l->e = grown;
    }
    l->e[l->n++] = e;
}

/* Edges of the placement problem: each value a region reads from another region or from a run
 * input (once per region, however many of its nodes read it), and each graph output going back
 * to the host. Weights and states are resident. */
static kiln_place_edge *place_edges(const kiln_plan *p, uint32_t *n_out)
{
    const kiln_graph *g = p->g;
    edge_list l = {.e = malloc(16 * sizeof *l.e), .cap = 16};
    uint32_t *seen = malloc((g->n_nodes + 1) * sizeof *seen); /* seen[root] = last region that took it */
    for (uint32_t i = 0; seen && i < g->n_nodes; i++) seen[i] = KILN_IDX_NONE;
    for (uint32_t r = 0; seen && l.e && r < p->fusion.n_regions; r++) {
        const kiln_region *reg = &p->fusion.regions[r];
        for (uint32_t j = 0; j < reg->n_nodes; j++) {
            const kiln_node_rec *nd = &g->nodes[reg->nodes[j]];
            for (int k = 0; k < nd->n_src; k++) {
                if (nd->src[k] == KILN_IDX_NONE) continue;
                uint32_t root = p->root[nd->src[k]];
                uint8_t op = g->nodes[root].op;
                uint32_t from = op == KILN_OP_INPUT ? KILN_IDX_NONE : p->fusion.region_of[root];
                if (op == KILN_OP_WEIGHT || op == KILN_OP_STATE || from == r || seen[root] == r) continue;
                seen[root] = r;
                push_edge(&l, (kiln_place_edge){.from = from, .to = r,
                                                .bytes = (double)kiln_node_bytes(&g->nodes[nd->src[k]], p->dims[nd->src[k]])});
            }
        }
    }
    for (uint32_t o = 0; seen && o < g->n_outs; o++) {
        uint32_t root = p->root[g->outs[o].node];
        if (p->fusion.region_of[root] == KILN_IDX_NONE) continue;
        push_edge(&l, (kiln_place_edge){.from = p->fusion.region_of[root], .to = KILN_IDX_NONE,
                                        .bytes = (double)kiln_node_bytes(&g->nodes[root], p->dims[root])});
    }
    if (!seen) {
        free(l.e);
        l.e = NULL;
    }
    free(seen);
    *n_out = l.n;
    return l.e;
}

/* Whether the cpu backend has a kernel for every op of region reg (its supports() needs no lock). */
static bool cpu_runs(const kiln_plan *p, const kiln_region *reg)
{
    const kiln_backend_i *cpu = kiln_backends[KILN_BACKEND_CPU];
    char why[256];
    return !cpu->supports || cpu->supports(p->ctx->be_state[KILN_BACKEND_CPU], p->g, reg, &p->opts, why, sizeof why);
}

/* The rules of candidate() that need no device call: pins, the forced backend, ref only as the
 * oracle, the backend present (or profiled, what-if). A placement read from disk must obey them. */
static bool allowed(const kiln_plan *p, int forced, const kiln_region *reg, int b)
{
    const kiln_ctx *ctx = p->ctx;
    int pinned = -1;
    for (uint32_t i = 0; i < reg->n_nodes && pinned < 0; i++) pinned = p->g->nodes[reg->nodes[i]].pin - 1;
    if (pinned >= 0 && b != pinned) return false;
    if (pinned < 0 && forced >= 0 && b != forced) return false;
    /* The reference backend is the oracle: used when asked for (forced or pinned), when the cpu
     * backend is missing, or for a region with an op the cpu has no kernel for (its supports()
     * says so); never picked by the cost model over a real backend. A pin is honoured only where
     * its backend is present (check_pins names the node otherwise): an absent backend has no state
     * to call (issue #17). */
    if (b == KILN_BACKEND_REF && pinned < 0 && forced < 0 && ctx->be_ok[KILN_BACKEND_CPU] && cpu_runs(p, reg)) return false;
    return ctx->be_ok[b] || (p->what_if && ctx->has_profile[b]);
}

/* Which backends may take region r: the forced one, a pin of any of its nodes, else every usable
 * backend (in what-if mode: every backend with a profile) whose supports() accepts it. */
static bool candidate(const kiln_plan *p, int forced, const kiln_region *reg, int b)
{
    const kiln_ctx *ctx = p->ctx;
    if (!allowed(p, forced, reg, b)) return false;
    if (!ctx->be_ok[b]) return true; /* what-if: a profile only */
    const kiln_backend_i *bi = kiln_backends[b];
    if (!bi->supports) return true;
    bool dev = kiln_backend_is_device(bi); /* its state (lost, features) changes under other threads */
    if (dev) pthread_mutex_lock((pthread_mutex_t *)&ctx->be_mu[b]);
    char why[256];
    bool ok = bi->supports(ctx->be_state[b], p->g, reg, &p->opts, why, sizeof why);
    if (dev) pthread_mutex_unlock((pthread_mutex_t *)&ctx->be_mu[b]);
    return ok;
}

static kiln_status place(kiln_plan *p, int forced)
{
    uint32_t nr = p->fusion.n_regions;
    double *time = p->pred_s;
    for (uint32_t r = 0; r < nr; r++) {
        kiln_region_cost c;
        kiln_sched_region_cost(p->g, &p->fusion.regions[r], (const int64_t(*)[KILN_MAX_RANK])p->dims, p->sym_vals, &c);
        for (int b = 0; b < KILN_BACKEND_COUNT; b++)
            time[(size_t)r * KILN_BACKEND_COUNT + b] =
                candidate(p, forced, &p->fusion.regions[r], b) ? kiln_sched_time(&c, &p->ctx->profile[b], NULL) : -1;
    }
    uint32_t ne = 0;
    kiln_place_edge *edges = place_edges(p, &ne);
    if (!edges) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "out of memory placing regions");
    kiln_place_problem pp = {.n_regions = nr, .n_backends = KILN_BACKEND_COUNT, .time = time, .edges = edges,
                             .n_edges = ne, .profiles = p->ctx->profile};
    double total = kiln_sched_place(&pp, 1u << 16, p->region_be);
    for (uint32_t r = 0; r < nr; r++) p->xfer_s[r] = 0;
    for (uint32_t e = 0; e < ne; e++)
        if (edges[e].to != KILN_IDX_NONE)
            p->xfer_s[edges[e].to] += kiln_sched_edge_time(&pp, &edges[e],
                                                           edges[e].from == KILN_IDX_NONE ? -1 : p->region_be[edges[e].from],
                                                           p->region_be[edges[e].to]);
    free(edges);
    uint32_t bad = 0; /* the first region no candidate backend can run, to name it */
    for (uint32_t r = 0; r < nr; r++) {
        bool any = false;
        for (int b = 0; b < KILN_BACKEND_COUNT; b++) any |= time[(size_t)r * KILN_BACKEND_COUNT + b] >= 0;
        if (!any) {
            bad = r;
            break;
        }
    }
    for (uint32_t r = bad; r < nr; r++)
        if (time[(size_t)r * KILN_BACKEND_COUNT + p->region_be[r]] < 0 || !(total < INFINITY)) {
            char lab[300], why[600] = "";
            const kiln_backend_i *fb = forced >= 0 ? kiln_backends[forced] : NULL;
            if (fb && fb->supports && p->ctx->be_ok[forced]) { /* the backend says why (templates, a lost device) */
                char e[512] = "";
                pthread_mutex_lock(&p->ctx->be_mu[forced]);
                if (!fb->supports(p->ctx->be_state[forced], p->g, &p->fusion.regions[r], &p->opts, e, sizeof e))
                    snprintf(why, sizeof why, ": %s", e);
                pthread_mutex_unlock(&p->ctx->be_mu[forced]);
            }
            return kiln_ctx_fail(p->ctx, KILN_ERR_UNSUPPORTED, "no backend can run region %u (%s)%s%s", r,
                                 node_label(p->g, p->fusion.regions[r].anchor, lab, sizeof lab),
                                 forced >= 0 ? " on the backend asked for" : "", why);
        }
    return KILN_OK;
}

/* A node pinned to a backend this context does not have is the caller's error, named before
 * placement (which would otherwise report only "no backend can run region N"). */
static kiln_status check_pins(kiln_plan *p)
{
    const kiln_ctx *ctx = p->ctx;
    for (uint32_t i = 0; i < p->g->n_nodes; i++) {
        int b = p->g->nodes[i].pin - 1;
        if (b < 0 || ctx->be_ok[b] || (p->what_if && ctx->has_profile[b])) continue;
        char lab[300];
        return kiln_ctx_fail(p->ctx, KILN_ERR_UNSUPPORTED, "%s is pinned to backend '%s', which is not available here (%s)",
                             node_label(p->g, i, lab, sizeof lab), kiln_backends[b]->name,
                             ctx->be_detail[b][0] ? ctx->be_detail[b] : "its probe failed");
    }
    return KILN_OK;
}

/* A placement read from disk passed its checksums; it is used only if every region's backend is
 * one placement could have chosen (pins, forced backend, present) and its costs are numbers
 * placement could have written (issue #17: a forged entry must not move work). */
static bool placement_sane(const kiln_plan *p, int forced)
{
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        int be = p->region_be[r];
        if (!allowed(p, forced, &p->fusion.regions[r], be) || !(p->pred_s[(size_t)r * KILN_BACKEND_COUNT + be] >= 0) ||
            !isfinite(p->xfer_s[r]) || p->xfer_s[r] < 0)
            return false;
        for (int b = 0; b < KILN_BACKEND_COUNT; b++) {
            double t = p->pred_s[(size_t)r * KILN_BACKEND_COUNT + b];
            if (!(t == -1 || (t >= 0 && isfinite(t)))) return false;
        }
    }
    return true;
}

/* Placement from its disk entry (*from_disk), else computed (and written there). */
static kiln_status place_cached(kiln_plan *p, int forced, bool *from_disk)
{
    *from_disk = false;
    kiln_status ps = check_pins(p);
    if (ps != KILN_OK) return ps;
    if (kiln_sched_cache_load_placement(p, forced) && placement_sane(p, forced)) return *from_disk = true, KILN_OK;
    kiln_status s = place(p, forced);
    if (s == KILN_OK) kiln_sched_cache_save_placement(p, forced);
    return s;
}

static void free_kernels(kiln_plan *p)
{
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        const kiln_backend_i *b = kiln_backends[p->region_be[r]];
        if (p->kernels[r] && b->kernel_free) b->kernel_free(p->ctx->be_state[p->region_be[r]], p->kernels[r]);
        p->kernels[r] = NULL;
    }
}


static kiln_status compile_regions(kiln_plan *p, kiln_progress *prog)
{
    char err[KILN_ERR_CAP] = ""; /* the sink's capacity: a JIT or glslang log is not cut short here */
    if (p->what_if) return KILN_OK;
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        const kiln_region *reg = &p->fusion.regions[r];
        int be = p->region_be[r];
        const kiln_backend_i *b = kiln_backends[be];
        kiln_progress_set(prog, r, b->name);
        if (!b->compile) continue;
        bool dev = kiln_backend_is_device(b); /* device backends' state is shared by the context's threads */
        if (dev) pthread_mutex_lock(&p->ctx->be_mu[be]);
        kiln_status s = kiln_sched_compile_region(p, r, err, sizeof err); /* a disk entry's load included */
        if (dev) pthread_mutex_unlock(&p->ctx->be_mu[be]);
        if (s != KILN_OK) {
            char lab[300];
            return kiln_ctx_fail(p->ctx, s, "%s: compiling region %u (%s): %s", b->name, r,
                                 node_label(p->g, reg->anchor, lab, sizeof lab), err);
        }
    }
    return KILN_OK;
}

/* Placement, then every region's kernel. A placement from disk whose kernels do not compile (a
 * region on a backend that cannot run it) is replaced by a fresh one, written back: one bad entry
 * must not make every later compile of the graph fail. */
static kiln_status place_and_compile(kiln_plan *p, int forced)
{
    /* A cold GPU compile can take a minute (lavapipe's LLVM): a line on a terminal past 2 s. */
    kiln_progress *prog = kiln_progress_start(p->ctx->opts.quiet, "compiling kernels", p->fusion.n_regions, "");
    kiln_progress_set(prog, 0, "placing");
    bool from_disk;
    kiln_status s = place_cached(p, forced, &from_disk);
    if (s == KILN_OK) s = compile_regions(p, prog);
    if (s != KILN_OK && from_disk) {
        free_kernels(p);
        p->disk_hits = p->disk_misses = 0;
        kiln_progress_set(prog, 0, "placing");
        if ((s = place(p, forced)) == KILN_OK) {
            kiln_sched_cache_save_placement(p, forced);
            s = compile_regions(p, prog);
        }
    }
    kiln_progress_set(prog, p->fusion.n_regions, p->what_if ? "what-if" : "");
    kiln_progress_end(prog);
    return s;
}

/* opts->devices: one device is an ordinary plan on the backend named; more, a split plan whose
 * parts are ordinary plans (group.c) and whose own fields only route the public calls. */
static kiln_status compile_split(kiln_ctx *ctx, const kiln_graph *g, const kiln_compile_options *opts, kiln_plan **out,
                                 double t0)
{
    kiln_group *gr;
    int n;
    kiln_status s = kiln_sched_group_compile(ctx, g, opts, &gr, &n);
    if (s != KILN_OK) return s;
    if (!gr) {
        kiln_compile_options one = *opts;
        const char *colon = strchr(opts->devices, ':');
        char be[32] = "";
        if (colon && (size_t)(colon - opts->devices) < sizeof be) memcpy(be, opts->devices, (size_t)(colon - opts->devices));
        one.devices = NULL;
        if (be[0]) one.backend = be;
        return kiln_compile(ctx, g, &one, out);
    }
    kiln_plan *p = calloc(1, sizeof *p);
    if (!p) {
        kiln_sched_group_free(gr);
        return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "out of memory");
    }
    const kiln_plan *p0 = kiln_sched_group_part(gr, 0);
    p->ctx = ctx;
    p->group = gr;
    p->backend = p0->backend;
    p->opts = p0->opts;
    p->compile_ms = now_ms() - t0;
    kiln_err_clear(&ctx->err);
    *out = p;
    return KILN_OK;
}

KILN_API kiln_status kiln_compile(kiln_ctx *ctx, const kiln_graph *g, const kiln_compile_options *opts,
                                  kiln_plan **out)
{
    if (!ctx || !g || !out) return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_compile: NULL argument");
    *out = NULL;
    double t0 = now_ms();
    if (g->status != KILN_OK) return kiln_ctx_fail(ctx, g->status, "graph has an error: %s", g->error);
    if (g->n_outs == 0) return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "graph has no outputs: nothing to compute (mark some with kiln_output; in .kg text, `output NAME NODE` lines)");
    if (opts && opts->devices && *opts->devices) return compile_split(ctx, g, opts, out, t0);
    int forced = -1;
    kiln_status s = pick_backend(ctx, opts ? opts->backend : NULL, &forced);
    if (s != KILN_OK) return s;
    kiln_plan *p = calloc(1, sizeof *p);
    if (!p) return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "out of memory");
    p->ctx = ctx;
    kiln_env_options(opts, &p->opts);
    p->opts.backend = NULL; /* the caller's string: used above only */
    p->what_if = p->opts.what_if;
    p->check_finite = p->opts.check_finite;
    /* The canonical copy: equal graphs get equal node ids, so their compiled parts are shared. */
    if (!(p->g = kiln_graph_canonical(g, p->ghash))) goto oom;
    if ((s = kiln_graph_materialize_weights(p->g)) != KILN_OK) goto fail; /* random weights: bytes now */
    if (p->opts.codegen.precision == KILN_PREC_F16) kiln_graph_narrow_gemm_inputs(p->g);
    uint32_t n = g->n_nodes ? g->n_nodes : 1;
    kiln_sched_cache_lookup(p, forced);
    if (!p->mem_hit && (s = kiln_fuse(p->g, !p->opts.no_fuse, &p->fusion)) != KILN_OK) goto fail;
    uint32_t nr = p->fusion.n_regions ? p->fusion.n_regions : 1;
    if (!p->mem_hit) {
        p->region_be = calloc(nr, 1);
        p->kernels = calloc(nr, sizeof *p->kernels);
        p->pred_s = calloc((size_t)nr * KILN_BACKEND_COUNT, sizeof *p->pred_s);
        p->xfer_s = calloc(nr, sizeof *p->xfer_s);
    }
    p->root = malloc(n * sizeof *p->root);
    p->offset = malloc(n * sizeof *p->offset);
    p->arena_off = malloc(n * sizeof *p->arena_off);
    p->state_mem = calloc(n, sizeof *p->state_mem);
    p->bufs = calloc(n, sizeof *p->bufs);
    p->dims = calloc(n, sizeof *p->dims);
    p->sym_vals = calloc(g->n_syms ? g->n_syms : 1, sizeof *p->sym_vals);
    p->meas_s = calloc(nr, sizeof *p->meas_s);
    p->n_meas = calloc(nr, sizeof *p->n_meas);
    if (!p->pred_s || !p->xfer_s || !p->meas_s || !p->n_meas) goto oom;
    if (!p->region_be || !p->kernels || !p->root || !p->offset || !p->arena_off || !p->state_mem || !p->bufs ||
        !p->dims || !p->sym_vals)
        goto oom;
    if ((s = kiln_sched_plan_memory(p)) != KILN_OK) { /* the message names the sizes */
        kiln_plan_free(p);
        return s;
    }
    for (uint32_t i = 0; i < p->g->n_syms; i++) p->sym_vals[i] = p->g->syms[i].max; /* canonical numbering */
    for (uint32_t i = 0; i < g->n_nodes; i++) kiln_node_numel(&p->g->nodes[i], p->sym_vals, p->dims[i]);
    p->record_space = -1;
    if (!(p->max_dims = malloc(n * sizeof *p->max_dims)) || !(p->bound_dev = calloc(n, sizeof *p->bound_dev)) ||
        !(p->bound_dev_be = calloc(n, 1)))
        goto oom;
    memcpy(p->max_dims, p->dims, g->n_nodes * sizeof *p->max_dims);
    if ((!p->mem_hit && (s = place_and_compile(p, forced)) != KILN_OK) ||
        (!p->what_if && (s = kiln_sched_devices_setup(p)) != KILN_OK)) {
        kiln_plan_free(p);
        return s;
    }
    int count[KILN_BACKEND_COUNT] = {0};
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) count[p->region_be[r]]++;
    p->backend = forced >= 0 ? forced : KILN_BACKEND_REF;
    for (int b = 0; b < KILN_BACKEND_COUNT; b++)
        if (count[b] > count[p->backend]) p->backend = b;
    kiln_sched_cache_keep(p);
    p->compile_ms = now_ms() - t0;
    kiln_err_clear(&ctx->err);
    *out = p;
    return KILN_OK;
oom:
    s = KILN_ERR_NOMEM;
fail:
    kiln_plan_free(p);
    return kiln_ctx_fail(ctx, s, "kiln_compile: %s", s == KILN_ERR_NOMEM ? "out of memory" : kiln_status_str(s));
}

/* ------------------------------------------------------------------ run */

/* Copies an output into caller device memory of the backend that holds it. */
static kiln_status copy_out_device(kiln_plan *p, uint32_t node, void *dst, size_t bytes)
{
    int sp = p->home[p->root[node]];
    if (sp == KILN_SPACE_HOST)
        return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "an output bound as device memory is computed on the host");
    char err[512] = "";
    void *src = p->dev[sp].bufs[node];
    kiln_status s = kiln_backends[sp]->copy(p->ctx->be_state[sp], dst, src, bytes, err, sizeof err);
    return s == KILN_OK ? s : kiln_ctx_fail(p->ctx, s, "%s: copying an output to device memory: %s", kiln_backends[sp]->name, err);
}

/* How kiln_run_async runs a plan: as kiln_run; enqueued and joined with the caller's queue; or
 * joined with it but run synchronously (host kernels beside a backend joined by semaphores, or
 * profiling / check_finite there). */
enum { JOIN_NONE, JOIN_ASYNC, JOIN_SYNC };

/* The join mode for stream; *be: the device backend joined. */
static int join_mode(const kiln_plan *p, void *stream, int *be)
{
    int dev = -1;
    bool host = false;
    for (uint32_t r = 0; r < p->fusion.n_regions; r++) {
        int b = p->region_be[r];
        if (!kiln_backend_is_device(kiln_backends[b])) host = true;
        else if (dev >= 0 && dev != b) return JOIN_NONE;
        else dev = b;
    }
    *be = dev;
    if (dev < 0 || !kiln_backends[dev]->join_wait) return JOIN_NONE;
    bool sems = kiln_backends[dev]->join_semaphores;
    if (sems && !stream) return JOIN_NONE; /* no kiln_vk_sync: as kiln_run */
    if (host || p->profiling || p->check_finite) return sems ? JOIN_SYNC : JOIN_NONE;
    return JOIN_ASYNC;
}

static kiln_status run(kiln_plan *p, const kiln_binding *b, size_t nb, int mode, int be, void *stream);

KILN_API kiln_status kiln_run(kiln_plan *p, const kiln_binding *b, size_t nb) { return run(p, b, nb, JOIN_NONE, -1, NULL); }

KILN_API kiln_status kiln_run_async(kiln_plan *p, const kiln_binding *b, size_t nb, void *stream)
{
    if (!p) return KILN_ERR_INVALID_ARG;
    if (p->group) return run(p, b, nb, JOIN_NONE, -1, NULL); /* a split plan runs as kiln_run does */
    int be = -1;
    int mode = join_mode(p, stream, &be);
    return run(p, b, nb, mode, be, stream);
}

KILN_API kiln_status kiln_plan_wait(kiln_plan *p)
{
    if (!p) return KILN_ERR_INVALID_ARG;
    if (p->group) return KILN_OK; /* its runs were synchronous */
    kiln_sched_lock(p, true);
    kiln_status s = kiln_sched_wait_steps(p);
    kiln_sched_lock(p, false);
    return s;
}

/* Joins the async run's device queue with the caller's: wait (before the step) or signal (after). */
static kiln_status join_caller(kiln_plan *p, int be, void *stream, bool after)
{
    const kiln_backend_i *bi = kiln_backends[be];
    char err[512] = "";
    kiln_status s = after ? bi->join_signal(p->ctx->be_state[be], stream, p, err, sizeof err) : bi->join_wait(p->ctx->be_state[be], stream, err, sizeof err);
    return s == KILN_OK ? s : kiln_ctx_fail(p->ctx, s, "%s: joining the caller's %s: %s", bi->name, bi->join_semaphores ? "semaphores" : "stream", err);
}

kiln_status kiln_sched_run_outputs(kiln_plan *p, const kiln_binding **out_bind, bool later)
{
    const kiln_graph *g = p->g;
    kiln_status s = KILN_OK;
    for (uint32_t o = 0; s == KILN_OK && o < g->n_outs; o++) {
        uint32_t i = g->outs[o].node;
        if (!out_bind[o]) continue;
        size_t bytes = kiln_node_bytes(&g->nodes[i], p->dims[i]);
        if (out_bind[o]->device) s = copy_out_device(p, i, out_bind[o]->data, bytes);
        else if (later) s = kiln_sched_fetch_later(p, i, out_bind[o]->data, bytes);
        else s = kiln_sched_fetch(p, i, out_bind[o]->data, bytes);
    }
    return s;
}

static kiln_status run(kiln_plan *p, const kiln_binding *b, size_t nb, int mode, int be, void *stream)
{
    if (!p) return KILN_ERR_INVALID_ARG;
    if (p->group) {
        double t = now_ms() / 1e3;
        kiln_status s = kiln_sched_group_run(p, p->group, b, nb);
        if (s == KILN_OK) kiln_err_clear(&p->ctx->err), p->stats.runs++, p->stats.wait_s += now_ms() / 1e3 - t;
        return s;
    }
    const kiln_binding **out_bind = NULL;
    double t0 = now_ms() / 1e3;
    kiln_status s = kiln_sched_run_begin(p, b, nb, &out_bind);
    kiln_sched_lock(p, true); /* device backends: this run's work stays together */
    double t1 = now_ms() / 1e3;
    if (s == KILN_OK && mode != JOIN_NONE) s = join_caller(p, be, stream, false);
    if (s == KILN_OK) s = kiln_sched_execute(p);
    double t2 = now_ms() / 1e3;
    if (s == KILN_OK) s = kiln_sched_run_outputs(p, out_bind, mode == JOIN_ASYNC && kiln_backends[be]->join_semaphores);
    if (s == KILN_OK && mode != JOIN_NONE) s = join_caller(p, be, stream, true); /* the caller's queue waits; the host does not */
    if (s == KILN_OK && mode != JOIN_ASYNC) s = kiln_sched_sync_all(p);
    kiln_sched_lock(p, false);
    free(out_bind);
    if (s == KILN_OK) {
        p->stats.runs++;
        p->stats.bind_s += t1 - t0, p->stats.submit_s += t2 - t1, p->stats.wait_s += now_ms() / 1e3 - t2;
        p->ran = true;
        kiln_err_clear(&p->ctx->err);
    }
    return s;
}

/* ------------------------------------------------------------------ inspection */

static uint32_t find_named(const kiln_plan *p, const char *name)
{
    uint32_t i = kiln_graph_find_output(p->g, name);
    if (i != KILN_IDX_NONE) return p->g->outs[i].node;
    return kiln_graph_find_leaf(p->g, name);
}

KILN_API kiln_status kiln_plan_tensor(const kiln_plan *p, const char *name, kiln_tensor_info *out)
{
    if (!p || !name || !out) return KILN_ERR_INVALID_ARG;
    if (p->group) return kiln_sched_group_tensor(p->group, name, out);
    uint32_t i = find_named(p, name);
    if (i == KILN_IDX_NONE) return kiln_ctx_fail(p->ctx, KILN_ERR_NAME, "no input, output or state named '%s'", name);
    const kiln_node_rec *r = &p->g->nodes[i];
    out->t = (kiln_dtype)r->dtype;
    out->rank = r->rank;
    memcpy(out->dims, p->dims[i], sizeof out->dims);
    out->bytes = kiln_node_bytes(r, p->dims[i]);
    return KILN_OK;
}

KILN_API kiln_status kiln_plan_read(const kiln_plan *p, const char *name, void *dst, size_t bytes)
{
    if (!p || !name || !dst) return KILN_ERR_INVALID_ARG;
    if (p->group) p = kiln_sched_group_part(p->group, 0); /* outputs are whole on every part */
    uint32_t o = kiln_graph_find_output(p->g, name);
    if (o == KILN_IDX_NONE) return kiln_ctx_fail(p->ctx, KILN_ERR_NAME, "no output named '%s'", name);
    if (!p->ran) return kiln_ctx_fail(p->ctx, KILN_ERR_INVALID_ARG, "output '%s': the plan has not run successfully", name);
    uint32_t i = p->g->outs[o].node;
    size_t want = kiln_node_bytes(&p->g->nodes[i], p->dims[i]);
    if (bytes < want) return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "output '%s' needs %zu bytes, got %zu", name, want, bytes);
    return kiln_sched_fetch(p, i, dst, want);
}

static kiln_status state_of(const kiln_plan *p, const char *name, size_t bytes, uint32_t *out)
{
    uint32_t i = kiln_graph_find_leaf(p->g, name);
    if (i == KILN_IDX_NONE || p->g->nodes[i].op != KILN_OP_STATE)
        return kiln_ctx_fail(p->ctx, KILN_ERR_NAME, "no state named '%s'", name);
    size_t want = kiln_node_bytes(&p->g->nodes[i], p->dims[i]);
    if (bytes != want) return kiln_ctx_fail(p->ctx, KILN_ERR_BINDING, "state '%s' has %zu bytes, got %zu", name, want, bytes);
    *out = i;
    return KILN_OK;
}

KILN_API kiln_status kiln_plan_state_read(const kiln_plan *p, const char *name, void *dst, size_t bytes)
{
    if (!p || !name || !dst) return KILN_ERR_INVALID_ARG;
    if (p->group) return kiln_sched_group_state((kiln_plan *)p, p->group, name, dst, NULL, bytes);
    uint32_t i;
    kiln_status s = state_of(p, name, bytes, &i);
    if (s == KILN_OK) s = kiln_sched_fetch(p, i, dst, bytes);
    return s;
}

KILN_API kiln_status kiln_plan_state_write(kiln_plan *p, const char *name, const void *src, size_t bytes)
{
    if (!p || !name || !src) return KILN_ERR_INVALID_ARG;
    if (p->group) return kiln_sched_group_state(p, p->group, name, NULL, src, bytes);
    uint32_t i;
    kiln_status s = state_of(p, name, bytes, &i);
    if (s == KILN_OK) s = kiln_sched_state_put(p, i, src, bytes);
    return s;
}

KILN_API const char *kiln_plan_backend(const kiln_plan *p) { return p ? kiln_backends[p->backend]->name : "?"; }
/* A split plan: the kernels of one part (every part runs the same list). */
KILN_API int kiln_plan_kernel_count(const kiln_plan *p)
{
    if (p && p->group) p = kiln_sched_group_part(p->group, 0);
    return p ? (int)p->fusion.n_regions : 0;
}
