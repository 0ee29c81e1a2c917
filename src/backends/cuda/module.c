/* Kernels of the CUDA backend: a region is lowered to kir, printed as PTX for the device's sm and
 * JIT'ed with cuModuleLoadDataEx (its log kept in the error), its constant tables uploaded once;
 * a launch binds each buffer slot to a device address and enqueues cuLaunchKernel on the
 * backend's stream. Must not synchronize: completion is the executor's sync. */
#include "backends/cuda/cuda.h"
#include "ptx/ptx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kiln_kernel {
    CUmodule    mod;                          /* the loaded module (one kernel each) */
    CUfunction  fn;                           /* its entry */
    uint32_t    grid[3];                      /* blocks, fixed at compile */
    uint32_t    block;                        /* threads per block */
    kiln_kbuf   bufs[KILN_KIR_MAX_BUFS];      /* what each parameter is bound to */
    uint32_t    n_bufs;                       /* parameters */
    CUdeviceptr tables[KILN_KIR_MAX_TABLES];  /* uploaded constant tables */
    char        name[48];                     /* entry name, for errors */
};

kiln_status kiln_cuda_load_ptx(kiln_cuda *c, const char *ptx, const char *name, CUmodule *mod, CUfunction *fn,
                               char *err, size_t n)
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

/* Lowers and prints region r; the caller frees *ptx and the kir. */
static kiln_status lower_and_print(int sm, const kiln_graph *g, const kiln_region *r, kiln_kir *kir, char **ptx,
                                   char *err, size_t n)
{
    *ptx = NULL;
    kiln_status s = kiln_lower_region(g, r, kir, err, n);
    if (s != KILN_OK) return s;
    s = kiln_ptx_print(kir, sm, ptx, err, n);
    if (s != KILN_OK) kiln_kir_free(kir);
    return s;
}

bool kiln_cuda_supports(void *state, const kiln_graph *g, const kiln_region *r)
{
    kiln_cuda *c = state;
    kiln_kir kir;
    char *ptx, err[256];
    if (c->dead || lower_and_print(c->ptx_sm, g, r, &kir, &ptx, err, sizeof err) != KILN_OK) return false;
    free(ptx);
    kiln_kir_free(&kir);
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

kiln_status kiln_cuda_compile(void *state, const kiln_graph *g, const kiln_region *r, kiln_kernel **out, char *err,
                              size_t n)
{
    kiln_cuda *c = state;
    *out = NULL;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    kiln_kir kir;
    char *ptx;
    if ((s = lower_and_print(c->ptx_sm, g, r, &kir, &ptx, err, n)) != KILN_OK) return s;
    dump(kir.name, ptx);
    kiln_kernel *k = calloc(1, sizeof *k);
    if (!k) s = KILN_ERR_NOMEM;
    else s = kiln_cuda_load_ptx(c, ptx, kir.name, &k->mod, &k->fn, err, n);
    if (s == KILN_OK) {
        memcpy(k->grid, kir.grid, sizeof k->grid);
        k->block = kir.block;
        k->n_bufs = kir.n_bufs;
        memcpy(k->bufs, kir.bufs, sizeof k->bufs);
        snprintf(k->name, sizeof k->name, "%s", kir.name);
    }
    for (uint32_t t = 0; s == KILN_OK && t < kir.n_tables; t++) {
        size_t bytes = (size_t)kir.tables[t].n * 4;
        s = kiln_cuda_alloc(c, bytes, &k->tables[t], err, n);
        if (s == KILN_OK && bytes) {
            CUresult rr = c->d.htod(k->tables[t], kir.tables[t].words, bytes, c->stream);
            if (rr == KILN_CU_SUCCESS) rr = c->d.stream_sync(c->stream); /* kir's copy is freed below */
            if (rr != KILN_CU_SUCCESS) s = kiln_cuda_fail(c, rr, "uploading a constant table", err, n);
        }
    }
    free(ptx);
    kiln_kir_free(&kir);
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
    for (int t = 0; t < KILN_KIR_MAX_TABLES; t++) kiln_cuda_free(c, k->tables[t]);
    if (k->mod && !c->dead && c->d.ctx_set_current(c->ctx) == KILN_CU_SUCCESS) c->d.module_unload(k->mod);
    free(k);
}

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
    CUdeviceptr ptr[KILN_KIR_MAX_BUFS];
    void *args[KILN_KIR_MAX_BUFS];
    for (uint32_t i = 0; i < k->n_bufs; i++) {
        const kiln_kbuf *b = &k->bufs[i];
        void *p = b->kind == KILN_KBUF_PARAMS ? v->params
                  : b->kind == KILN_KBUF_NODE ? v->bufs[b->node]
                                              : (void *)(uintptr_t)k->tables[b->node];
        if (!p) {
            snprintf(err, n, "kernel %s: buffer slot %u (%s %u) has no device address", k->name, i,
                     b->kind == KILN_KBUF_PARAMS ? "parameter buffer" : b->kind == KILN_KBUF_NODE ? "node" : "table",
                     b->node);
            return KILN_ERR_INTERNAL;
        }
        ptr[i] = (CUdeviceptr)(uintptr_t)p;
        args[i] = &ptr[i];
    }
    CUresult rr = c->d.launch(k->fn, k->grid[0], k->grid[1], k->grid[2], k->block, 1, 1, 0, c->stream, args, NULL);
    if (rr != KILN_CU_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cuLaunchKernel of %s (grid %u x %u x %u, block %u)", k->name, k->grid[0], k->grid[1],
                 k->grid[2], k->block);
        return kiln_cuda_fail(c, rr, what, err, n);
    }
    return KILN_OK;
}
