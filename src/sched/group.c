/* Split plans (kiln_compile_options.devices): the graph split over N parts (split.c), one ordinary
 * plan per part, run in lock step: every part runs up to its next all_reduce region, then the
 * partial sums are added (in part order, so runs are deterministic) and every part gets the total.
 * Virtual devices share one backend (ref/cpu in one process, or one GPU): the sum goes through the
 * host. Must not contain kernels or change the parts' placement. */
#include "sched/group.h"
#include "sched/group_epi.h"
#include "sched/split.h"
#include "util/env.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GROUP_RECS 4 /* recordings kept per split plan, by the collectives' sizes (decode, prefill, ...) */

/* One recording of every part (distinct GPUs): its kernels and NCCL calls as a CUDA graph per GPU.
 * NCCL's counts are fixed in it, so it serves runs whose collectives move the same bytes. */
typedef struct group_rec {
    size_t *bytes;   /* per collective: bytes of its result */
    void   *rec[64]; /* per part: the backend's recording */
} group_rec;

struct kiln_group {
    int         n;        /* parts */
    kiln_plan **parts;    /* one ordinary plan per part */
    kiln_ctx  **child;    /* distinct GPUs: part p's own context (its device, stream, memory), else NULL */
    int         devs[64]; /* the device numbers named */
    int         coll_be;  /* distinct GPUs: the backend whose collectives join the parts, else -1 */
    void       *comm;     /* its communicators */
    bool        dead;     /* a part failed at run: the plan is unusable (dead_why says why) */
    char        dead_why[600];
    kiln_split  split;    /* the split (per source node kind, the part graphs) */
    kiln_graph *src;      /* the source graph (names of states, for reads and writes) */
    uint32_t    n_coll;   /* all_reduce regions per part */
    uint32_t  **coll;     /* coll[p][k]: part p's k-th all_reduce region */
    bool       *epi;      /* epi[k]: the region after it is computed with the host sum (group_epi.c) */
    float      *sum;      /* host buffer of one all-reduce's total */
    float      *tmp;      /* one part's partial sum */
    size_t      cap;      /* bytes of each */
    char        summary[16384]; /* the split described (kiln plan) */
    group_rec   recs[GROUP_RECS]; /* distinct GPUs: recordings, oldest replaced first */
    int         n_recs, next_rec;
    size_t     *bytes_now; /* this run's bytes per collective */
};

/* "cuda:0,1" / "cpu:0,1,2,3" / "4": the backend named (or NULL) and the number of parts. */
static kiln_status parse_devices(kiln_ctx *ctx, const char *s, char *be, size_t n_be, int *n, bool *same_id, int *ids)
{
    const char *colon = strchr(s, ':');
    *same_id = true;
    be[0] = 0;
    if (!colon) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || *end || v < 1 || v > 64)
            return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "devices '%s': give a count (1..64) or BACKEND:ID,ID,... (\"cuda:0,1\")", s);
        *n = (int)v;
        for (int k = 0; k < *n; k++) ids[k] = k;
        return KILN_OK;
    }
    if ((size_t)(colon - s) >= n_be || colon == s)
        return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "devices '%s': the backend name is missing or too long", s);
    memcpy(be, s, (size_t)(colon - s));
    be[colon - s] = 0;
    long first = -1;
    *n = 0;
    for (const char *p = colon + 1;;) {
        char *end;
        if (!isdigit((unsigned char)*p)) return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "devices '%s': expected a device number at '%s'", s, p);
        long v = strtol(p, &end, 10);
        if (v > 1024 || ++*n > 64) return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "devices '%s': at most 64 devices, numbered 0..1024", s);
        for (int k = 0; k + 1 < *n; k++)
            if (ids[k] == v && !(*same_id && v == first))
                return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "devices '%s': device %ld named twice among others", s, v);
        ids[*n - 1] = (int)v;
        if (first < 0) first = v;
        *same_id = *same_id && v == first;
        if (!*end) break;
        if (*end != ',') return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "devices '%s': unexpected '%c'", s, *end);
        p = end + 1;
    }
    return KILN_OK;
}

static void rec_free(kiln_group *gr, group_rec *r)
{
    for (int p = 0; p < gr->n; p++)
        if (r->rec[p]) kiln_backends[gr->coll_be]->record_free(gr->parts[p]->ctx->be_state[gr->coll_be], r->rec[p]);
    free(r->bytes);
    memset(r, 0, sizeof *r);
}

void kiln_sched_group_free(kiln_group *gr)
{
    if (!gr) return;
    for (int k = 0; k < gr->n_recs; k++) rec_free(gr, &gr->recs[k]);
    for (int p = 0; gr->parts && p < gr->n; p++) kiln_plan_free(gr->parts[p]);
    if (gr->comm) kiln_backends[gr->coll_be]->coll_free(gr->comm);
    for (int p = 0; gr->child && p < gr->n; p++) kiln_ctx_free(gr->child[p]);
    free(gr->child);
    for (int p = 0; gr->coll && p < gr->n; p++) free(gr->coll[p]);
    free(gr->epi);
    free(gr->bytes_now);
    free(gr->parts);
    free(gr->coll);
    free(gr->sum);
    free(gr->tmp);
    kiln_split_free(&gr->split);
    kiln_graph_free(gr->src);
    free(gr);
}

/* The all_reduce regions of every part, in order; the parts must agree on their number. */
static kiln_status find_collectives(kiln_ctx *ctx, kiln_group *gr)
{
    if (!(gr->coll = calloc((size_t)gr->n, sizeof *gr->coll))) return KILN_ERR_NOMEM;
    for (int p = 0; p < gr->n; p++) {
        const kiln_plan *pp = gr->parts[p];
        uint32_t k = 0;
        if (!(gr->coll[p] = malloc((pp->fusion.n_regions + 1) * sizeof **gr->coll))) return KILN_ERR_NOMEM;
        for (uint32_t r = 0; r < pp->fusion.n_regions; r++)
            if (pp->fusion.regions[r].kind == KILN_REGION_COLLECTIVE) gr->coll[p][k++] = r;
        if (p && k != gr->n_coll)
            return kiln_ctx_fail(ctx, KILN_ERR_INTERNAL, "split plan: part %d has %u all_reduce regions, part 0 %u", p, k, gr->n_coll);
        gr->n_coll = k;
    }
    gr->bytes_now = malloc((gr->n_coll + 1) * sizeof *gr->bytes_now);
    if (!(gr->epi = calloc(gr->n_coll + 1, sizeof *gr->epi)) || !gr->bytes_now) return KILN_ERR_NOMEM;
    for (uint32_t k = 0; k < gr->n_coll; k++) {
        gr->epi[k] = !gr->comm;
        for (int p = 0; p < gr->n; p++) gr->epi[k] = gr->epi[k] && kiln_sched_epi_ok(gr->parts[p], gr->coll[p][k]);
    }
    return KILN_OK;
}

/* Distinct GPUs: a context per device (its own stream and memory; weights go to each at bind),
 * and the backend's communicators (NCCL) joining them. Without NCCL the compile fails saying why. */
static kiln_status open_devices(kiln_ctx *ctx, kiln_group *gr, const char *devices)
{
    const int be = KILN_BACKEND_CUDA;
    const kiln_backend_i *b = kiln_backends[be];
    char why[512] = "";
    int count = 0;
    if (!ctx->be_ok[be]) return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "devices '%s': cuda is not available: %s", devices, ctx->be_detail[be]);
    if (!b->coll_probe || !b->coll_probe(ctx->be_state[be], &count, why, sizeof why))
        return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "devices '%s': multi-GPU is off: %s", devices, why);
    if (!(gr->child = calloc((size_t)gr->n, sizeof *gr->child))) return KILN_ERR_NOMEM;
    void *states[64];
    for (int p = 0; p < gr->n; p++) {
        if (gr->devs[p] >= count)
            return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "devices '%s': there is no GPU %d (%d GPUs)", devices, gr->devs[p], count);
        kiln_status s = kiln_ctx_new_device(ctx, gr->devs[p], &gr->child[p]);
        if (s != KILN_OK) return kiln_ctx_fail(ctx, s, "devices '%s': a context for GPU %d: %s", devices, gr->devs[p], kiln_status_str(s));
        if (!gr->child[p]->be_ok[be])
            return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "devices '%s': GPU %d: %s", devices, gr->devs[p], gr->child[p]->be_detail[be]);
        states[p] = gr->child[p]->be_state[be];
    }
    kiln_status s = b->coll_init(states, gr->devs, gr->n, &gr->comm, why, sizeof why);
    if (s != KILN_OK) return kiln_ctx_fail(ctx, s, "devices '%s': multi-GPU communicators: %s", devices, why);
    gr->coll_be = be;
    return KILN_OK;
}

static kiln_status compile_parts(kiln_ctx *ctx, kiln_group *gr, const kiln_compile_options *opts, const char *be)
{
    kiln_compile_options po = opts ? *opts : (kiln_compile_options){0};
    po.devices = NULL;
    po.backend = be[0] ? be : po.backend;
    /* no_record as asked: parts on distinct GPUs are recorded together (group.c), never alone */
    if (!(gr->parts = calloc((size_t)gr->n, sizeof *gr->parts))) return KILN_ERR_NOMEM;
    for (int p = 0; p < gr->n; p++) {
        kiln_ctx *pc = gr->child ? gr->child[p] : ctx;
        kiln_status s = kiln_compile(pc, gr->split.parts[p], &po, &gr->parts[p]);
        if (s != KILN_OK) {
            char msg[768];
            snprintf(msg, sizeof msg, "%s", kiln_ctx_error(pc));
            return kiln_ctx_fail(ctx, s, "split plan, part %d of %d (%s %d): %s", p, gr->n, be[0] ? be : "device", gr->devs[p], msg);
        }
    }
    return find_collectives(ctx, gr);
}

/* The profile the split's cost model weighs with: the parts' backend's (auto: cuda when present,
 * else cpu). NULL (split whatever divides) with $KILN_SPLIT=all, for experiments and tests. */
static const kiln_device_profile *split_profile(kiln_ctx *ctx, const kiln_compile_options *opts, const char *be,
                                                kiln_device_profile *out)
{
    const char *env = kiln_env(KILN_ENV_SPLIT);
    if (env && !strcmp(env, "all")) return NULL;
    const char *name = be[0] ? be : opts->backend && strcmp(opts->backend, "auto") ? opts->backend
                     : ctx->be_ok[KILN_BACKEND_CUDA] ? "cuda" : "cpu";
    for (int b = 0; b < KILN_BACKEND_COUNT; b++)
        if (!strcmp(kiln_backends[b]->name, name) && ctx->has_profile[b]) {
            *out = ctx->profile[b];
            return out;
        }
    return NULL;
}

kiln_status kiln_sched_group_compile(kiln_ctx *ctx, const kiln_graph *g, const kiln_compile_options *opts, kiln_group **out,
                                     int *n_out)
{
    char be[32], err[512] = "";
    int n = 1;
    bool same_id = true;
    *out = NULL;
    *n_out = 1;
    int ids[64] = {0};
    kiln_status s = parse_devices(ctx, opts->devices, be, sizeof be, &n, &same_id, ids);
    if (s != KILN_OK) return s;
    if (be[0] && opts->backend && strcmp(opts->backend, "auto") && strcmp(opts->backend, be))
        return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "devices '%s' name backend %s but backend is '%s'", opts->devices, be, opts->backend);
    if (be[0] && strcmp(be, "ref") && strcmp(be, "cpu") && strcmp(be, "cuda"))
        return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "devices '%s': a split runs on ref, cpu (virtual devices) or cuda", opts->devices);
    *n_out = n;
    if (n == 1) return KILN_OK; /* one device: an ordinary plan */
    kiln_group *gr = calloc(1, sizeof *gr);
    if (!gr) return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "out of memory");
    gr->n = n;
    gr->coll_be = -1;
    memcpy(gr->devs, ids, sizeof gr->devs);
    if (!strcmp(be, "cuda") && !same_id && (s = open_devices(ctx, gr, opts->devices)) != KILN_OK) {
        kiln_sched_group_free(gr);
        return s;
    }
    /* The split reads weight bytes: random weights are generated once here and shared by the parts. */
    if (!(gr->src = kiln_graph_clone(g)) || kiln_graph_materialize_weights(gr->src) != KILN_OK) {
        kiln_sched_group_free(gr);
        return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "out of memory copying the graph to split");
    }
    kiln_device_profile prof;
    const kiln_device_profile *pp = split_profile(ctx, opts, be, &prof);
    if ((s = kiln_sched_split(gr->src, n, pp, &gr->split, err, sizeof err)) != KILN_OK) {
        kiln_sched_group_free(gr);
        return kiln_ctx_fail(ctx, s, "%s", err);
    }
    kiln_split_describe(&gr->split, gr->src, gr->summary, sizeof gr->summary);
    if ((s = compile_parts(ctx, gr, opts, be)) != KILN_OK) {
        kiln_sched_group_free(gr);
        return s == KILN_ERR_NOMEM ? kiln_ctx_fail(ctx, s, "out of memory") : s;
    }
    *out = gr;
    return KILN_OK;
}

int         kiln_sched_group_size(const kiln_group *gr) { return gr ? gr->n : 1; }
kiln_plan  *kiln_sched_group_part(const kiln_group *gr, int p) { return gr->parts[p]; }
const char *kiln_sched_group_summary(const kiln_group *gr) { return gr->summary; }
const kiln_split *kiln_sched_group_split(const kiln_group *gr) { return &gr->split; }

/* Distinct GPUs: the backend's collective (NCCL) on every part's queue, device to device. */
static kiln_status device_collective(kiln_group *gr, uint32_t k, bool gather, size_t count)
{
    void *states[64], *x[64], *y[64];
    for (int p = 0; p < gr->n; p++) {
        kiln_plan *pp = gr->parts[p];
        uint32_t yn = pp->fusion.regions[gr->coll[p][k]].anchor;
        states[p] = pp->ctx->be_state[gr->coll_be];
        x[p] = kiln_sched_dev_addr(pp, pp->g->nodes[yn].src[0]);
        y[p] = kiln_sched_dev_addr(pp, yn);
        if (!x[p] || !y[p])
            return kiln_ctx_fail(pp->ctx, KILN_ERR_INTERNAL, "split plan: part %d's collective %u is not in device memory", p, k);
    }
    char err[512] = "";
    const kiln_backend_i *b = kiln_backends[gr->coll_be];
    if (gather && !b->all_gather)
        return kiln_ctx_fail(gr->parts[0]->ctx, KILN_ERR_UNSUPPORTED, "all-gather %u: the %s backend has none", k, b->name);
    kiln_status s = gather ? b->all_gather(gr->comm, states, x, y, count, err, sizeof err)
                           : b->all_reduce(gr->comm, states, x, y, count, err, sizeof err);
    return s == KILN_OK ? s : kiln_ctx_fail(gr->parts[0]->ctx, s, "%s %u of %zu values: %s", gather ? "all-gather" : "all-reduce",
                                            k, count, err);
}

/* The k-th collective. all_reduce: every part's x summed in part order into the host buffer;
 * all_gather: part p's x at slice p; the result written to every part's y. */
static kiln_status all_reduce(kiln_group *gr, uint32_t k)
{
    const kiln_plan *p0 = gr->parts[0];
    uint32_t y0 = p0->fusion.regions[gr->coll[0][k]].anchor;
    bool gather = p0->g->nodes[y0].op == KILN_OP_ALL_GATHER;
    size_t bytes = kiln_node_bytes(&p0->g->nodes[y0], p0->dims[y0]), xb = gather ? bytes / (size_t)gr->n : bytes;
    if (gr->comm) return device_collective(gr, k, gather, xb / sizeof(float));
    if (bytes > gr->cap) {
        free(gr->sum), free(gr->tmp);
        gr->sum = malloc(bytes), gr->tmp = malloc(bytes);
        gr->cap = gr->sum && gr->tmp ? bytes : 0;
        if (!gr->cap) return kiln_ctx_fail(p0->ctx, KILN_ERR_NOMEM, "out of memory for an all-reduce of %zu bytes", bytes);
    }
    size_t n = xb / sizeof(float);
    for (int p = 0; p < gr->n; p++) {
        kiln_plan *pp = gr->parts[p];
        uint32_t y = pp->fusion.regions[gr->coll[p][k]].anchor, x = pp->g->nodes[y].src[0];
        float *dst = gather ? gr->sum + (size_t)p * n : p ? gr->tmp : gr->sum;
        kiln_status s = kiln_sched_fetch(pp, x, dst, xb);
        if (s != KILN_OK) return s;
        for (size_t i = 0; !gather && p && i < n; i++) gr->sum[i] += gr->tmp[i];
    }
    if (gr->epi[k]) return kiln_sched_epi_run(gr->parts, gr->n, gr->coll[0][k], gr->sum, n); /* nothing else reads y */
    for (int p = 0; p < gr->n; p++) {
        kiln_plan *pp = gr->parts[p];
        kiln_status s = kiln_sched_put(pp, pp->fusion.regions[gr->coll[p][k]].anchor, gr->sum, bytes);
        if (s != KILN_OK) return s;
    }
    return KILN_OK;
}

/* Part p's regions of segment k: after collective k - 1 (and its host epilogue) up to collective k. */
static void seg_bounds(const kiln_group *gr, int p, uint32_t k, uint32_t *r0, uint32_t *r1)
{
    *r0 = k ? gr->coll[p][k - 1] + 1 + gr->epi[k - 1] : 0;
    *r1 = k < gr->n_coll ? gr->coll[p][k] : gr->parts[p]->fusion.n_regions;
}

/* Every part's regions of segment k, then the k-th collective (k == n_coll: the last regions). */
static kiln_status run_segment(kiln_group *gr, uint32_t k)
{
    for (int p = 0; p < gr->n; p++) {
        uint32_t r0, r1;
        seg_bounds(gr, p, k, &r0, &r1);
        kiln_status s = kiln_sched_execute_range(gr->parts[p], r0, r1);
        if (s != KILN_OK) return s;
    }
    return k < gr->n_coll ? all_reduce(gr, k) : KILN_OK;
}

/* Distinct GPUs whose parts each record whole (every region on the GPU, no timing or scans). */
static bool use_graphs(const kiln_group *gr)
{
    for (int p = 0; gr->comm && p < gr->n; p++) {
        const kiln_plan *pp = gr->parts[p];
        if (pp->record_space != gr->coll_be || pp->profiling || pp->check_finite) return false;
    }
    return gr->comm != NULL;
}

/* Captures every part's launches and the NCCL calls between them, all GPUs' streams at once (NCCL
 * groups span them), into one recording per GPU. */
static kiln_status record(kiln_group *gr, group_rec *r)
{
    const kiln_backend_i *b = kiln_backends[gr->coll_be];
    char err[512] = "";
    kiln_status s = KILN_OK;
    int open = 0;
    for (; s == KILN_OK && open < gr->n; open++)
        if ((s = b->record_begin(gr->parts[open]->ctx->be_state[gr->coll_be], err, sizeof err)) != KILN_OK)
            s = kiln_ctx_fail(gr->parts[open]->ctx, s, "recording the split plan: %s", err);
    if (s != KILN_OK) open--;
    for (uint32_t k = 0; s == KILN_OK && k <= gr->n_coll; k++) {
        for (int p = 0; s == KILN_OK && p < gr->n; p++) {
            uint32_t r0, r1;
            seg_bounds(gr, p, k, &r0, &r1);
            s = kiln_sched_launch_range(gr->parts[p], r0, r1);
        }
        if (s == KILN_OK && k < gr->n_coll) s = all_reduce(gr, k);
    }
    for (int p = 0; p < open; p++) { /* every capture ends, failed or not, so the streams work again */
        kiln_status e = b->record_end(gr->parts[p]->ctx->be_state[gr->coll_be], &r->rec[p], err, sizeof err);
        if (e != KILN_OK && s == KILN_OK) s = kiln_ctx_fail(gr->parts[p]->ctx, e, "recording the split plan: %s", err);
    }
    return s;
}

/* A run as recordings: a size of the collectives seen for the first time runs launch by launch (NCCL
 * connects outside any capture, and a size used once, a prompt's prefill, is never recorded); its
 * second run records every GPU's graph, later runs replay them. *done: replayed. */
static kiln_status run_graphs(kiln_group *gr, bool *done)
{
    const kiln_plan *p0 = gr->parts[0];
    size_t *bytes = gr->bytes_now;
    *done = false;
    for (uint32_t k = 0; k < gr->n_coll; k++) {
        uint32_t y = p0->fusion.regions[gr->coll[0][k]].anchor;
        bytes[k] = kiln_node_bytes(&p0->g->nodes[y], p0->dims[y]);
    }
    bytes[gr->n_coll] = (size_t)kiln_sched_run_sig(p0, gr->coll_be); /* and the kernels this run launches */
    group_rec *r = NULL;
    for (int k = 0; k < gr->n_recs && !r; k++)
        if (gr->recs[k].bytes && !memcmp(gr->recs[k].bytes, bytes, (gr->n_coll + 1) * sizeof *bytes)) r = &gr->recs[k];
    if (!r) { /* first seen: remembered, run as launches */
        r = &gr->recs[gr->n_recs < GROUP_RECS ? gr->n_recs++ : gr->next_rec++ % GROUP_RECS];
        rec_free(gr, r);
        if (!(r->bytes = malloc((gr->n_coll + 1) * sizeof *bytes))) return KILN_ERR_NOMEM;
        memcpy(r->bytes, bytes, (gr->n_coll + 1) * sizeof *bytes);
        return KILN_OK;
    }
    kiln_status s = KILN_OK;
    for (int p = 0; s == KILN_OK && p < gr->n; p++) s = kiln_sched_prepare_all(gr->parts[p]);
    if (s == KILN_OK && !r->rec[0] && (s = record(gr, r)) != KILN_OK) {
        rec_free(gr, r); /* an empty slot: found by no run */
        return s;
    }
    char err[512] = "";
    for (int p = 0; s == KILN_OK && p < gr->n; p++) {
        void *st = gr->parts[p]->ctx->be_state[gr->coll_be];
        if ((s = kiln_backends[gr->coll_be]->replay(st, r->rec[p], err, sizeof err)) != KILN_OK)
            s = kiln_ctx_fail(gr->parts[p]->ctx, s, "replaying the split plan on GPU %d: %s", gr->devs[p], err);
    }
    *done = s == KILN_OK;
    return s;
}

/* A part's failure told in the split plan's context (parts on their own GPUs have their own). */
static kiln_status tell(kiln_plan *gp, kiln_group *gr, kiln_status s)
{
    for (int p = 0; s != KILN_OK && gr->child && p < gr->n; p++) {
        const char *e = kiln_ctx_error(gr->child[p]);
        if (*e) return kiln_ctx_fail(gp->ctx, s, "split plan, part %d (GPU %d): %s", p, gr->devs[p], e);
    }
    return s;
}

kiln_status kiln_sched_group_run(kiln_plan *gp, kiln_group *gr, const kiln_binding *b, size_t nb)
{
    const kiln_binding **ob[64] = {0};
    kiln_status s = KILN_OK;
    if (gr->dead) return kiln_ctx_fail(gp->ctx, KILN_ERR_BACKEND, "this multi-GPU plan stopped after an error: %s", gr->dead_why);
    for (int p = 0; gr->child && p < gr->n; p++) kiln_err_clear(&gr->child[p]->err);
    gp->ran = false;
    for (size_t i = 0; b && i < nb; i++) /* each part reads its inputs on its own device */
        if (b[i].device)
            return kiln_ctx_fail(gp->ctx, KILN_ERR_BINDING, "'%s' is bound as device memory: a split plan's inputs and "
                                 "outputs are host memory", b[i].name ? b[i].name : "?");
    for (int p = 0; p < gr->n; p++) gr->parts[p]->ran = false;
    for (int p = 0; s == KILN_OK && p < gr->n; p++) s = kiln_sched_run_begin(gr->parts[p], b, nb, &ob[p]);
    for (int p = 0; p < gr->n; p++) kiln_sched_lock(gr->parts[p], true);
    bool replayed = false;
    if (s == KILN_OK && use_graphs(gr)) s = run_graphs(gr, &replayed);
    for (uint32_t k = 0; s == KILN_OK && !replayed && k <= gr->n_coll; k++) s = run_segment(gr, k);
    if (s == KILN_OK) s = kiln_sched_run_outputs(gr->parts[0], ob[0], false); /* outputs are whole: part 0's */
    for (int p = 0; s == KILN_OK && p < gr->n; p++) s = kiln_sched_sync_all(gr->parts[p]);
    for (int p = gr->n - 1; p >= 0; p--) kiln_sched_lock(gr->parts[p], false);
    for (int p = 0; p < gr->n; p++) {
        free(ob[p]);
        gr->parts[p]->ran = s == KILN_OK;
    }
    gp->ran = s == KILN_OK;
    s = tell(gp, gr, s);
    if (s == KILN_ERR_BACKEND && gr->child) { /* a device fault: the parts are out of step for good */
        gr->dead = true;
        snprintf(gr->dead_why, sizeof gr->dead_why, "%s", kiln_ctx_error(gp->ctx));
    }
    return s;
}

/* A state by name: each part holds slice p along axis 0 (KV heads), or the whole state. */
kiln_status kiln_sched_group_state(kiln_plan *gp, kiln_group *gr, const char *name, void *dst, const void *src, size_t bytes)
{
    uint32_t i = kiln_graph_find_leaf(gr->src, name);
    if (i == KILN_IDX_NONE || gr->src->nodes[i].op != KILN_OP_STATE)
        return kiln_ctx_fail(gp->ctx, KILN_ERR_NAME, "no state named '%s'", name);
    bool split = gr->split.kind[i] == KILN_SPLIT_AXIS;
    int64_t d[KILN_MAX_RANK];
    kiln_node_numel(&gr->src->nodes[i], NULL, d);
    size_t whole = kiln_node_bytes(&gr->src->nodes[i], d), part = split ? whole / (size_t)gr->n : whole;
    if (bytes != whole) return kiln_ctx_fail(gp->ctx, KILN_ERR_BINDING, "state '%s' has %zu bytes, got %zu", name, whole, bytes);
    for (int p = 0; p < gr->n; p++) {
        size_t off = split ? (size_t)p * part : 0;
        kiln_status s = dst ? (p && !split ? KILN_OK : kiln_plan_state_read(gr->parts[p], name, (char *)dst + off, part))
                            : kiln_plan_state_write(gr->parts[p], name, (const char *)src + off, part);
        if (s != KILN_OK) return tell(gp, gr, s);
    }
    return KILN_OK;
}

/* Shape of a name: a divided state's whole shape; anything else as part 0 has it. */
kiln_status kiln_sched_group_tensor(const kiln_group *gr, const char *name, kiln_tensor_info *out)
{
    kiln_status s = kiln_plan_tensor(gr->parts[0], name, out);
    uint32_t i = kiln_graph_find_leaf(gr->src, name);
    if (s == KILN_OK && i != KILN_IDX_NONE && gr->split.kind[i] == KILN_SPLIT_AXIS) {
        out->dims[gr->split.axis[i]] *= gr->n;
        out->bytes *= (size_t)gr->n;
    }
    return s;
}


KILN_API kiln_status kiln_multi_gpu(const kiln_ctx *ctx, int *n_gpus, char *detail, size_t n)
{
    if (!ctx || !n_gpus || !detail || !n) return KILN_ERR_INVALID_ARG;
    const int be = KILN_BACKEND_CUDA;
    *n_gpus = 0;
    if (!ctx->be_ok[be]) {
        snprintf(detail, n, "cuda is not available: %s", ctx->be_detail[be]);
        return KILN_ERR_UNSUPPORTED;
    }
    const kiln_backend_i *b = kiln_backends[be];
    if (!b->coll_probe) {
        snprintf(detail, n, "the cuda backend has no collectives");
        return KILN_ERR_UNSUPPORTED;
    }
    return b->coll_probe(ctx->be_state[be], n_gpus, detail, n) ? KILN_OK : KILN_ERR_UNSUPPORTED;
}
