/* Kernels of the CUDA backend: a region is lowered to kir, printed as PTX for the device's sm and
 * JIT'ed with cuModuleLoadDataEx (its log kept in the error), its constant tables uploaded once;
 * a launch binds each buffer slot to a device address and enqueues cuLaunchKernel on the
 * backend's stream. Must not synchronize: completion is the executor's sync. */
#include "backends/cuda/cuda.h"
#include "ptx/ptx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One kernel of a region. */
typedef struct cuda_fn {
    CUmodule    mod;                          /* the loaded module (one kernel each) */
    CUfunction  fn;                           /* its entry */
    uint32_t    grid[3];                      /* blocks, fixed at compile */
    uint32_t    block;                        /* threads per block */
    kiln_kbuf   bufs[KILN_KIR_MAX_BUFS];      /* what each parameter is bound to */
    uint32_t    n_bufs;                       /* parameters */
    CUdeviceptr tables[KILN_KIR_MAX_TABLES];  /* uploaded constant tables */
    char        name[48];                     /* entry name, for errors */
} cuda_fn;

struct kiln_kernel {
    cuda_fn     fns[KILN_LOWER_MAX]; /* the region's kernels, launched in order */
    uint32_t    n_fns;               /* used */
    CUdeviceptr scratch;             /* the region's scratch buffer (largest scratch_bytes), or 0 */
};

/* Spill bytes the JIT's info log reports ("N bytes spill stores, M bytes spill loads"), -1 when it
 * says nothing about them. */
static int log_spills(const char *log)
{
    const char *p = strstr(log, " bytes spill stores");
    if (!p) return -1;
    const char *d = p;
    while (d > log && d[-1] >= '0' && d[-1] <= '9') d--;
    int stores = atoi(d), loads = 0;
    const char *q = strstr(p, " bytes spill loads");
    if (q) {
        while (q > p && q[-1] >= '0' && q[-1] <= '9') q--;
        loads = atoi(q);
    }
    return stores + loads;
}

kiln_status kiln_cuda_load_ptx(kiln_cuda *c, const char *ptx, const char *name, CUmodule *mod, CUfunction *fn,
                               int *spills, char *err, size_t n)
{
    enum { LOG = 16384 };
    char *elog = calloc(1, LOG), *ilog = calloc(1, LOG);
    if (!elog || !ilog) {
        free(elog), free(ilog);
        snprintf(err, n, "out of host memory for the JIT log");
        return KILN_ERR_NOMEM;
    }
    int opts[] = {KILN_CU_JIT_ERROR_LOG_BUFFER, KILN_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, KILN_CU_JIT_INFO_LOG_BUFFER,
                  KILN_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, KILN_CU_JIT_LOG_VERBOSE};
    void *vals[] = {elog, (void *)(uintptr_t)LOG, ilog, (void *)(uintptr_t)LOG, (void *)(uintptr_t)1};
    *mod = NULL;
    CUresult r = c->d.module_load(mod, ptx, 5, opts, vals);
    kiln_status s = KILN_OK;
    if (spills) *spills = r == KILN_CU_SUCCESS ? log_spills(ilog) : -1;
    if (r != KILN_CU_SUCCESS) {
        char what[LOG + 128];
        snprintf(what, sizeof what, "cuModuleLoadDataEx of kernel %s (JIT log: %s%s%s)", name, elog[0] ? elog : "empty",
                 ilog[0] ? "; " : "", ilog);
        s = kiln_cuda_fail(c, r, what, err, n);
    } else if ((r = c->d.module_function(fn, *mod, name)) != KILN_CU_SUCCESS) {
        s = kiln_cuda_fail(c, r, "cuModuleGetFunction", err, n);
        c->d.module_unload(*mod);
        *mod = NULL;
    }
    free(elog);
    free(ilog);
    return s;
}

/* Lowers region r into its kernels and prints each; on success the caller frees kir[0..*n) and
 * ptx[0..*n). */
static kiln_status lower_and_print(int sm, const kiln_graph *g, const kiln_region *r, kiln_kir kir[KILN_LOWER_MAX],
                                   char *ptx[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err)
{
    memset(ptx, 0, KILN_LOWER_MAX * sizeof *ptx);
    kiln_status s = kiln_lower_region_seq(g, r, kir, n, err, n_err);
    for (uint32_t i = 0; s == KILN_OK && i < *n; i++) s = kiln_ptx_print(&kir[i], sm, &ptx[i], err, n_err);
    if (s != KILN_OK) {
        for (uint32_t i = 0; i < *n; i++) {
            free(ptx[i]);
            kiln_kir_free(&kir[i]);
        }
        *n = 0;
    }
    return s;
}

static void free_printed(kiln_kir kir[KILN_LOWER_MAX], char *ptx[KILN_LOWER_MAX], uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        free(ptx[i]);
        kiln_kir_free(&kir[i]);
    }
}

bool kiln_cuda_supports(void *state, const kiln_graph *g, const kiln_region *r)
{
    kiln_cuda *c = state;
    kiln_kir kir[KILN_LOWER_MAX];
    char *ptx[KILN_LOWER_MAX], err[256];
    uint32_t n = 0;
    if (c->dead || lower_and_print(c->ptx_sm, g, r, kir, ptx, &n, err, sizeof err) != KILN_OK) return false;
    free_printed(kir, ptx, n);
    return true;
}

/* $KILN_PTX_DUMP=DIR: every compiled kernel's PTX is also written to DIR/<name>.ptx. */
static void dump(const char *name, const char *ptx)
{
    const char *dir = getenv("KILN_PTX_DUMP");
    if (!dir || !dir[0]) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.ptx", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(ptx, f);
    fclose(f);
}

/* Blocks to launch for a grid-stride kernel: as many as are resident on the whole GPU at once
 * (the driver's occupancy for this function times the SM count), at most the virtual blocks.
 * $KILN_GRID_CAP=N caps it at N instead (0: launch every virtual block, for comparisons). */
static uint32_t stride_grid(kiln_cuda *c, CUfunction fn, const kiln_kir *kir)
{
    uint32_t n = kir->grid[0];
    const char *cap = getenv("KILN_GRID_CAP");
    if (cap && *cap) {
        long v = strtol(cap, NULL, 10);
        return v > 0 && (uint32_t)v < n ? (uint32_t)v : n;
    }
    int per_sm = 0;
    if (c->d.occupancy(&per_sm, fn, (int)kir->block, 0) != KILN_CU_SUCCESS || per_sm <= 0 || c->n_sm <= 0) return n;
    uint64_t resident = (uint64_t)per_sm * (uint64_t)c->n_sm;
    return resident < n ? (uint32_t)resident : n;
}

/* Loads one printed kernel into f and uploads its tables. A kernel the JIT reports spilling under
 * the default register cap is printed again with every register allowed (KILN_PTX_ALL_REGISTERS). */
static kiln_status load_fn(kiln_cuda *c, const kiln_kir *kir, const char *ptx, cuda_fn *f, char *err, size_t n)
{
    dump(kir->name, ptx);
    int spills = -1;
    kiln_status s = kiln_cuda_load_ptx(c, ptx, kir->name, &f->mod, &f->fn, &spills, err, n);
    if (s == KILN_OK && spills > 0) {
        char *again = NULL;
        if (kiln_ptx_print_ex(kir, c->ptx_sm, KILN_PTX_ALL_REGISTERS, &again, NULL, err, n) == KILN_OK) {
            CUmodule mod = NULL;
            CUfunction fn = NULL;
            if (kiln_cuda_load_ptx(c, again, kir->name, &mod, &fn, NULL, err, n) == KILN_OK) {
                c->d.module_unload(f->mod);
                f->mod = mod, f->fn = fn;
                dump(kir->name, again);
            }
            err[0] = 0; /* the first module still works */
        }
        free(again);
    }
    if (s != KILN_OK) return s;
    memcpy(f->grid, kir->grid, sizeof f->grid);
    f->block = kir->block;
    if (kir->grid_stride) f->grid[0] = stride_grid(c, f->fn, kir);
    f->n_bufs = kir->n_bufs;
    memcpy(f->bufs, kir->bufs, sizeof f->bufs);
    memcpy(f->name, kir->name, sizeof f->name);
    f->name[sizeof f->name - 1] = 0;
    for (uint32_t t = 0; s == KILN_OK && t < kir->n_tables; t++) {
        size_t bytes = (size_t)kir->tables[t].n * 4;
        s = kiln_cuda_alloc(c, bytes, &f->tables[t], err, n);
        if (s != KILN_OK || !bytes) continue;
        CUresult r = c->d.htod(f->tables[t], kir->tables[t].words, bytes, c->stream);
        if (r == KILN_CU_SUCCESS) r = c->d.stream_sync(c->stream); /* the kir's copy is freed after compile */
        if (r != KILN_CU_SUCCESS) s = kiln_cuda_fail(c, r, "uploading a constant table", err, n);
    }
    return s;
}

kiln_status kiln_cuda_compile(void *state, const kiln_graph *g, const kiln_region *r, kiln_kernel **out, char *err,
                              size_t n)
{
    kiln_cuda *c = state;
    *out = NULL;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    kiln_kir kir[KILN_LOWER_MAX];
    char *ptx[KILN_LOWER_MAX];
    uint32_t nk = 0;
    if ((s = lower_and_print(c->ptx_sm, g, r, kir, ptx, &nk, err, n)) != KILN_OK) return s;
    kiln_kernel *k = calloc(1, sizeof *k);
    if (!k) s = KILN_ERR_NOMEM;
    uint64_t scratch = 0;
    for (uint32_t i = 0; s == KILN_OK && i < nk; i++) {
        s = load_fn(c, &kir[i], ptx[i], &k->fns[i], err, n);
        k->n_fns = i + 1;
        if (kir[i].scratch_bytes > scratch) scratch = kir[i].scratch_bytes;
    }
    if (s == KILN_OK && scratch) s = kiln_cuda_alloc(c, (size_t)scratch, &k->scratch, err, n);
    free_printed(kir, ptx, nk);
    if (s != KILN_OK) {
        if (k) kiln_cuda_kernel_free(c, k);
        return s;
    }
    *out = k;
    return KILN_OK;
}

void kiln_cuda_kernel_free(void *state, kiln_kernel *k)
{
    kiln_cuda *c = state;
    if (!k) return;
    bool usable = !c->dead && c->d.ctx_set_current(c->ctx) == KILN_CU_SUCCESS;
    for (uint32_t i = 0; i < k->n_fns; i++) {
        for (int t = 0; t < KILN_KIR_MAX_TABLES; t++) kiln_cuda_free(c, k->fns[i].tables[t]);
        if (k->fns[i].mod && usable) c->d.module_unload(k->fns[i].mod);
    }
    kiln_cuda_free(c, k->scratch);
    free(k);
}

/* Device address of buffer slot b of f. */
static CUdeviceptr slot_addr(const kiln_kernel *k, const cuda_fn *f, const kiln_kbuf *b, const kiln_exec_view *v)
{
    switch (b->kind) {
    case KILN_KBUF_PARAMS: return (CUdeviceptr)(uintptr_t)v->params;
    case KILN_KBUF_NODE: return (CUdeviceptr)(uintptr_t)v->bufs[b->node];
    case KILN_KBUF_TABLE: return b->node < KILN_KIR_MAX_TABLES ? f->tables[b->node] : 0;
    case KILN_KBUF_SCRATCH: return k->scratch;
    default: return 0;
    }
}

static const char *const slot_kind[KILN_KBUF_KIND_COUNT] = {"parameter buffer", "node", "table", "scratch"};

kiln_status kiln_cuda_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                             char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    if (!k) {
        snprintf(err, n, "region with anchor node %u was not compiled for cuda", r->anchor);
        return KILN_ERR_INTERNAL;
    }
    for (uint32_t i = 0; i < k->n_fns; i++) {
        const cuda_fn *f = &k->fns[i];
        CUdeviceptr ptr[KILN_KIR_MAX_BUFS];
        void *args[KILN_KIR_MAX_BUFS];
        for (uint32_t j = 0; j < f->n_bufs; j++) {
            const kiln_kbuf *b = &f->bufs[j];
            if (!(ptr[j] = slot_addr(k, f, b, v))) {
                snprintf(err, n, "kernel %s: buffer slot %u (%s %u) has no device address", f->name, j,
                         b->kind < KILN_KBUF_KIND_COUNT ? slot_kind[b->kind] : "?", b->node);
                return KILN_ERR_INTERNAL;
            }
            args[j] = &ptr[j];
        }
        CUresult rr = c->d.launch(f->fn, f->grid[0], f->grid[1], f->grid[2], f->block, 1, 1, 0, c->stream, args, NULL);
        if (rr != KILN_CU_SUCCESS) {
            char what[160];
            snprintf(what, sizeof what, "cuLaunchKernel of %s (grid %u x %u x %u, block %u)", f->name, f->grid[0],
                     f->grid[1], f->grid[2], f->block);
            return kiln_cuda_fail(c, rr, what, err, n);
        }
    }
    return KILN_OK;
}
