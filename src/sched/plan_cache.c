/* The plan cache: a compiled plan's graph-determined parts (fusion, placement, predicted costs,
 * kernels) kept in the context's memory table under a key of the canonical graph hash and every
 * compile input, and shared by each later plan of an equal graph; and the per-region disk entries
 * through the backends' save/load. Weights, states and memory stay per plan: a hit never reuses
 * anything that depends on a weight's bytes or a name. */
#include "cache/blob.h"
#include "sched/plan.h"
#include "sched/group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shared parts of a plan. */
typedef struct kiln_plan_tmpl {
    kiln_cache_obj obj;       /* first: the table's header (key, refs) */
    kiln_ctx      *ctx;       /* whose backends own the kernels */
    kiln_fusion    fusion;    /* regions */
    uint8_t       *region_be; /* backend of each region */
    kiln_kernel  **kernels;   /* compiled kernel per region, or NULL */
    double        *pred_s;    /* predicted times (see kiln_plan) */
    double        *xfer_s;    /* predicted transfers (see kiln_plan) */
} kiln_plan_tmpl;

static void tmpl_destroy(kiln_cache_obj *o, void *arg)
{
    kiln_plan_tmpl *t = (kiln_plan_tmpl *)o;
    for (uint32_t r = 0; t->kernels && r < t->fusion.n_regions; r++) {
        const kiln_backend_i *b = kiln_backends[t->region_be[r]];
        if (t->kernels[r] && b->kernel_free) b->kernel_free(t->ctx->be_state[t->region_be[r]], t->kernels[r]);
    }
    kiln_fusion_free(&t->fusion);
    free(t->region_be);
    free(t->kernels);
    free(t->pred_s);
    free(t->xfer_s);
    free(t);
}

_Static_assert(sizeof(kiln_codegen_options) % sizeof(int32_t) == 0, "kiln_codegen_options is hashed whole: int32_t fields only");

void kiln_sched_cache_lookup(kiln_plan *p, int forced)
{
    const kiln_ctx *ctx = p->ctx;
    kiln_cache_keyer k;
    kiln_cache_key_begin(&k, "plan");
    kiln_cache_key_add(&k, p->ghash, sizeof p->ghash);
    uint8_t o[3] = {(uint8_t)(forced + 1), p->opts.no_fuse, p->opts.what_if};
    kiln_cache_key_add(&k, o, sizeof o);
    kiln_cache_key_add(&k, &p->opts.codegen, sizeof p->opts.codegen); /* every code-generation choice, by construction */
    for (int b = 0; b < KILN_BACKEND_COUNT; b++) { /* placement reads which backends run and their profiles */
        uint8_t f[2] = {ctx->be_ok[b], ctx->has_profile[b]};
        kiln_cache_key_add(&k, f, sizeof f);
        if (ctx->has_profile[b]) kiln_cache_key_add(&k, &ctx->profile[b], sizeof ctx->profile[b]);
    }
    p->key = kiln_cache_key_end(&k);
    kiln_cache_obj *hit = kiln_cache_mem_find(ctx->cache, &p->key);
    kiln_cache_count(ctx->cache, true, hit != NULL);
    if (!hit) return;
    kiln_plan_tmpl *t = (kiln_plan_tmpl *)hit;
    p->tmpl = t;
    p->mem_hit = true;
    p->fusion = t->fusion;
    p->region_be = t->region_be;
    p->kernels = t->kernels;
    p->pred_s = t->pred_s;
    p->xfer_s = t->xfer_s;
}

void kiln_sched_cache_keep(kiln_plan *p)
{
    if (p->tmpl) return;
    kiln_plan_tmpl *t = calloc(1, sizeof *t);
    if (!t) return; /* the plan keeps its parts; nothing is shared */
    t->obj.key = p->key;
    atomic_init(&t->obj.refs, 1); /* the plan's */
    t->obj.destroy = tmpl_destroy;
    t->ctx = p->ctx;
    t->fusion = p->fusion;
    t->region_be = p->region_be;
    t->kernels = p->kernels;
    t->pred_s = p->pred_s;
    t->xfer_s = p->xfer_s;
    p->tmpl = t;
    kiln_cache_mem_add(p->ctx->cache, &t->obj); /* an equal plan compiled meanwhile: this one stays private */
}

void kiln_sched_cache_release(kiln_plan *p)
{
    if (!p->tmpl) return;
    kiln_cache_obj_unref(&p->tmpl->obj);
    p->tmpl = NULL;
    memset(&p->fusion, 0, sizeof p->fusion);
    p->region_be = NULL;
    p->kernels = NULL;
    p->pred_s = p->xfer_s = NULL;
}

/* ------------------------------------------------------------------ disk entries per region */

static enum kiln_cache_kind kind_of(int be)
{
    switch (be) {
    case KILN_BACKEND_CPU: return KILN_CACHE_KIND_CPU;
    case KILN_BACKEND_CUDA: return KILN_CACHE_KIND_CUDA;
    case KILN_BACKEND_VULKAN: return KILN_CACHE_KIND_VULKAN;
    default: return KILN_CACHE_KIND_NONE;
    }
}

/* A region's kernel depends on the canonical graph, the region (its nodes: fusion options show
 * there), the backend and its device, and the code-generation options (hashed whole). */
static kiln_cache_key region_key(const kiln_plan *p, uint32_t r, int be)
{
    const kiln_region *reg = &p->fusion.regions[r];
    const kiln_backend_i *b = kiln_backends[be];
    char ident[512] = "";
    b->identity(p->ctx->be_state[be], ident, sizeof ident);
    kiln_cache_keyer k;
    kiln_cache_key_begin(&k, "region");
    kiln_cache_key_add(&k, p->ghash, sizeof p->ghash);
    uint32_t head[5] = {r, reg->kind, reg->anchor, reg->n_nodes, reg->n_outs};
    kiln_cache_key_add(&k, head, sizeof head);
    kiln_cache_key_add(&k, reg->nodes, reg->n_nodes * sizeof *reg->nodes);
    kiln_cache_key_add(&k, reg->outs, reg->n_outs * sizeof *reg->outs);
    kiln_cache_key_str(&k, b->name);
    kiln_cache_key_str(&k, ident);
    kiln_cache_key_add(&k, &p->opts.codegen, sizeof p->opts.codegen);
    return kiln_cache_key_end(&k);
}

kiln_status kiln_sched_compile_region(kiln_plan *p, uint32_t r, char *err, size_t n)
{
    int be = p->region_be[r];
    const kiln_backend_i *b = kiln_backends[be];
    void *st = p->ctx->be_state[be];
    const kiln_region *reg = &p->fusion.regions[r];
    kiln_cache *c = p->ctx->cache;
    enum kiln_cache_kind kind = kind_of(be);
    bool disk = b->identity && b->kernel_save && b->kernel_load && kiln_cache_disk_for(c, kind);
    kiln_cache_key key = {{0, 0}};
    if (disk) {
        key = region_key(p, r, be);
        void *buf = NULL;
        size_t len = 0;
        if (kiln_cache_disk_get(c, kind, &key, &buf, &len)) {
            char lerr[256] = "";
            kiln_status s = b->kernel_load(st, p->g, reg, &p->opts, buf, len, &p->kernels[r], lerr, sizeof lerr);
            free(buf);
            if (s == KILN_OK) {
                p->disk_hits++;
                return KILN_OK;
            }
            p->kernels[r] = NULL; /* checksummed but not loadable (a driver that refuses the cubin): rebuilt */
        }
        p->disk_misses++;
    }
    kiln_status s = b->compile(st, p->g, reg, &p->opts, &p->kernels[r], err, n);
    if (s != KILN_OK || !disk) return s;
    void *out = NULL;
    size_t len = 0;
    if (b->kernel_save(st, p->kernels[r], &out, &len) == KILN_OK) kiln_cache_disk_put(c, kind, &key, out, len);
    free(out);
    return KILN_OK;
}

/* ------------------------------------------------------------------ placement on disk */

#define PLACE_MAGIC 0x314c504bu /* "KPL1" */

/* Placement runs every GPU backend's supports(), which prints the kernels: a warm start reads the
 * placement instead, so it prints nothing. Read when a GPU backend may take regions, written when
 * one did (KILN_CACHE=all: always, to test the path on CPU-only machines). */
static bool place_disk(const kiln_plan *p, int forced, bool writing)
{
    const kiln_ctx *ctx = p->ctx;
    if (p->what_if || !kiln_cache_disk_on(ctx->cache)) return false;
    if (kiln_cache_disk_for(ctx->cache, KILN_CACHE_KIND_CPU)) return true;
    bool gpu = false;
    if (writing)
        for (uint32_t r = 0; r < p->fusion.n_regions; r++) gpu |= kind_of(p->region_be[r]) > KILN_CACHE_KIND_CPU;
    else
        gpu = (forced < 0 || kind_of(forced) > KILN_CACHE_KIND_CPU) && (ctx->be_ok[KILN_BACKEND_CUDA] || ctx->be_ok[KILN_BACKEND_VULKAN]);
    return gpu;
}

/* The plan's key (options, profiles) with the region count and every present device as its probe
 * described it (not the backends' identity(): that may cost a device check the plan never needs). */
static kiln_cache_key place_key(const kiln_plan *p)
{
    kiln_cache_keyer k;
    kiln_cache_key_begin(&k, "placement");
    kiln_cache_key_add(&k, &p->key, sizeof p->key);
    kiln_cache_key_add(&k, &p->fusion.n_regions, sizeof p->fusion.n_regions);
    for (int b = 0; b < KILN_BACKEND_COUNT; b++) kiln_cache_key_str(&k, p->ctx->be_ok[b] ? p->ctx->be_detail[b] : "");
    return kiln_cache_key_end(&k);
}

bool kiln_sched_cache_load_placement(kiln_plan *p, int forced)
{
    if (!place_disk(p, forced, false)) return false;
    kiln_cache_key key = place_key(p);
    void *buf = NULL;
    size_t len = 0;
    if (!kiln_cache_disk_get(p->ctx->cache, KILN_CACHE_KIND_PLAN, &key, &buf, &len)) return false;
    uint32_t nr = p->fusion.n_regions;
    kiln_blob_r rd = {.p = buf, .n = len};
    bool ok = kiln_blob_get_u32(&rd) == PLACE_MAGIC && kiln_blob_get_u32(&rd) == nr &&
              kiln_blob_get_u32(&rd) == KILN_BACKEND_COUNT;
    const uint8_t *be = kiln_blob_get(&rd, nr);
    const void *pred = kiln_blob_get(&rd, (size_t)nr * KILN_BACKEND_COUNT * sizeof(double));
    const void *xfer = kiln_blob_get(&rd, (size_t)nr * sizeof(double));
    ok = ok && !rd.bad && rd.at == rd.n;
    for (uint32_t r = 0; ok && r < nr; r++) ok = be[r] < KILN_BACKEND_COUNT && p->ctx->be_ok[be[r]];
    if (ok) {
        memcpy(p->region_be, be, nr);
        memcpy(p->pred_s, pred, (size_t)nr * KILN_BACKEND_COUNT * sizeof(double));
        memcpy(p->xfer_s, xfer, (size_t)nr * sizeof(double));
    }
    free(buf);
    return ok;
}

void kiln_sched_cache_save_placement(const kiln_plan *p, int forced)
{
    if (!place_disk(p, forced, true)) return;
    uint32_t nr = p->fusion.n_regions;
    kiln_blob_w w = {0};
    kiln_blob_u32(&w, PLACE_MAGIC);
    kiln_blob_u32(&w, nr);
    kiln_blob_u32(&w, KILN_BACKEND_COUNT);
    kiln_blob_put(&w, p->region_be, nr);
    kiln_blob_put(&w, p->pred_s, (size_t)nr * KILN_BACKEND_COUNT * sizeof(double));
    kiln_blob_put(&w, p->xfer_s, (size_t)nr * sizeof(double));
    kiln_cache_key key = place_key(p);
    if (!w.oom) kiln_cache_disk_put(p->ctx->cache, KILN_CACHE_KIND_PLAN, &key, w.p, w.n);
    free(w.p);
}

KILN_API const char *kiln_plan_cache(const kiln_plan *p)
{
    if (p && p->group) p = kiln_sched_group_part(p->group, 0);
    if (!p) return "?";
    if (p->mem_hit) return "memory";
    if (p->disk_hits && !p->disk_misses) return "disk";
    if (p->disk_hits) return "partial";
    return "miss";
}
