/* Kernels of the CUDA backend: a region is lowered to kir, printed as PTX for the device's sm and
 * JIT'ed with cuModuleLoadDataEx (its log kept in the error), its constant tables uploaded once;
 * a launch binds each buffer slot to a device address and enqueues cuLaunchKernel on the
 * backend's stream. Must not synchronize: completion is the executor's sync. */
#include "util/env.h"
#include "backends/cuda/cuda.h"
#include "codegen/kir_blob.h"
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
    bool        pdl;                          /* lowered for programmatic dependent launch (kiln_kir.pdl) */
    bool        side;                         /* launched on the side stream beside the others (kiln_kir.side) */
    kiln_ktmap  tmaps[KILN_KIR_MAX_TMAPS];    /* TMA tensor maps, encoded at each launch from their slot's address */
    uint32_t    n_tmaps;                      /* used */
    uint32_t    dyn_shared;                   /* dynamic shared bytes the launch asks for */
    kiln_krows  rows;                         /* its row guard: launches whose guard fails are skipped */
} cuda_fn;

struct kiln_kernel {
    cuda_fn     fns[KILN_LOWER_MAX]; /* the region's kernels, launched in order */
    uint32_t    n_fns;               /* used */
    CUdeviceptr scratch;             /* the region's scratch buffer (largest scratch_bytes), or 0 */
    kiln_blob_w entry;               /* the cache entry made at compile (metadata, PTX, cubin), or empty */
};

#define ENTRY_MAGIC 0x3255434bu /* "KCU2": launch metadata through codegen/kir_blob.h */

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

/* The JIT's error and info logs and the option arrays that hand them to the driver. */
enum { JIT_LOG = 16384 };
typedef struct jit_logs {
    char *elog, *ilog;
    int   opts[5];
    void *vals[5];
} jit_logs;

static bool jit_logs_new(jit_logs *j, char *err, size_t n)
{
    j->elog = calloc(1, JIT_LOG), j->ilog = calloc(1, JIT_LOG);
    if (!j->elog || !j->ilog) {
        free(j->elog), free(j->ilog);
        snprintf(err, n, "out of host memory for the JIT log");
        return false;
    }
    int opts[] = {KILN_CU_JIT_ERROR_LOG_BUFFER, KILN_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, KILN_CU_JIT_INFO_LOG_BUFFER,
                  KILN_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, KILN_CU_JIT_LOG_VERBOSE};
    void *vals[] = {j->elog, (void *)(uintptr_t)JIT_LOG, j->ilog, (void *)(uintptr_t)JIT_LOG, (void *)(uintptr_t)1};
    memcpy(j->opts, opts, sizeof opts);
    memcpy(j->vals, vals, sizeof vals);
    return true;
}

static void jit_logs_free(jit_logs *j) { free(j->elog), free(j->ilog); }

/* "WHAT of kernel NAME (JIT log: ...)" through kiln_cuda_fail. */
static kiln_status jit_fail(kiln_cuda *c, CUresult r, const char *what, const char *name, const jit_logs *j, char *err, size_t n)
{
    char whatlog[JIT_LOG + 128];
    snprintf(whatlog, sizeof whatlog, "%s of kernel %s (JIT log: %s%s%s)", what, name, j->elog[0] ? j->elog : "empty",
             j->ilog[0] ? "; " : "", j->ilog);
    return kiln_cuda_fail(c, r, whatlog, err, n);
}

/* $KILN_PTX_DUMP: each printed kernel as DIR/NAME.N.ptx (N counts the prints of the process: kernels
 * of one name do not overwrite each other) and the JIT's info log of its link as DIR/NAME.N.log
 * (registers, spills: what the driver's JIT made of it, which can differ from a ptxas run).
 * Compiles of one backend hold its lock, so the count needs no atomics. */
static unsigned dump_n;

static void dump_text(const char *name, const char *ext, const char *text)
{
    const char *dir = kiln_env(KILN_ENV_PTX_DUMP);
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%u.%s", dir, name, dump_n, ext);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void dump(const char *name, const char *ptx)
{
    dump_n++;
    dump_text(name, "ptx", ptx);
}

kiln_status kiln_cuda_load_ptx(kiln_cuda *c, const char *ptx, const char *name, CUmodule *mod, CUfunction *fn,
                               int *spills, char *err, size_t n)
{
    jit_logs j;
    if (!jit_logs_new(&j, err, n)) return KILN_ERR_NOMEM;
    *mod = NULL;
    CUresult r = c->d.module_load(mod, ptx, 5, j.opts, j.vals);
    kiln_status s = KILN_OK;
    if (spills) *spills = r == KILN_CU_SUCCESS ? log_spills(j.ilog) : -1;
    dump_text(name, "log", j.ilog);
    if (r != KILN_CU_SUCCESS) {
        s = jit_fail(c, r, "cuModuleLoadDataEx", name, &j, err, n);
    } else if ((r = c->d.module_function(fn, *mod, name)) != KILN_CU_SUCCESS) {
        s = kiln_cuda_fail(c, r, "cuModuleGetFunction", err, n);
        c->d.module_unload(*mod);
        *mod = NULL;
    }
    jit_logs_free(&j);
    return s;
}

/* PTX to cubin through the driver's linker (its JIT; logs as cuModuleLoadDataEx gives them), then
 * the cubin loaded: the cubin is what a cache entry keeps, so a warm start loads it without the JIT.
 * *cubin is malloc'ed. */
static kiln_status link_ptx(kiln_cuda *c, const char *ptx, const char *name, CUmodule *mod, CUfunction *fn,
                            unsigned char **cubin, size_t *cubin_n, int *spills, char *err, size_t n)
{
    *cubin = NULL;
    *cubin_n = 0;
    *mod = NULL;
    jit_logs j;
    if (!jit_logs_new(&j, err, n)) return KILN_ERR_NOMEM;
    CUlinkState ls = NULL;
    const char *what = "cuLinkCreate";
    void *image = NULL;
    size_t image_n = 0;
    CUresult r = c->d.link_create(5, j.opts, j.vals, &ls);
    if (r == KILN_CU_SUCCESS) {
        what = "cuLinkAddData";
        r = c->d.link_add(ls, KILN_CU_JIT_INPUT_PTX, (void *)ptx, strlen(ptx) + 1, name, 0, NULL, NULL);
    }
    if (r == KILN_CU_SUCCESS) {
        what = "cuLinkComplete";
        r = c->d.link_complete(ls, &image, &image_n);
    }
    kiln_status s = KILN_OK;
    if (spills) *spills = r == KILN_CU_SUCCESS ? log_spills(j.ilog) : -1;
    dump_text(name, "log", j.ilog);
    if (r != KILN_CU_SUCCESS) {
        s = jit_fail(c, r, what, name, &j, err, n);
    } else if (!image || !image_n || !(*cubin = malloc(image_n))) {
        snprintf(err, n, "cuLinkComplete of kernel %s gave no image", name);
        s = image && image_n ? KILN_ERR_NOMEM : KILN_ERR_BACKEND;
    } else {
        memcpy(*cubin, image, image_n); /* the image belongs to the link state */
        *cubin_n = image_n;
    }
    if (ls) c->d.link_destroy(ls);
    jit_logs_free(&j);
    if (s == KILN_OK && (r = c->d.module_load(mod, *cubin, 0, NULL, NULL)) != KILN_CU_SUCCESS) s = kiln_cuda_fail(c, r, "cuModuleLoadDataEx of a cubin", err, n);
    if (s == KILN_OK && (r = c->d.module_function(fn, *mod, name)) != KILN_CU_SUCCESS) {
        s = kiln_cuda_fail(c, r, "cuModuleGetFunction", err, n);
        c->d.module_unload(*mod);
        *mod = NULL;
    }
    if (s != KILN_OK) {
        free(*cubin);
        *cubin = NULL;
        *cubin_n = 0;
    }
    return s;
}

/* Lowers region r into its kernels and prints each; on success the caller frees kir[0..*n) and
 * ptx[0..*n). */
static kiln_status lower_and_print(const kiln_cuda *c, const kiln_codegen_options *o, const kiln_graph *g, const kiln_region *r,
                                   kiln_kir kir[KILN_LOWER_MAX], char *ptx[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err)
{
    memset(ptx, 0, KILN_LOWER_MAX * sizeof *ptx);
    kiln_lower_target t = kiln_lower_target_with(&c->target, o);
    kiln_status s = kiln_lower_region_for(g, r, &t, kir, n, err, n_err);
    for (uint32_t i = 0; s == KILN_OK && i < *n; i++) s = kiln_ptx_print(&kir[i], c->ptx_sm, &ptx[i], err, n_err);
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

/* Lowers and prints region r; what it made is kept for compile() of the same region (a cold compile
 * then lowers and prints each region once). */
bool kiln_cuda_supports(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o, char *why,
                        size_t n_why)
{
    kiln_cuda *c = state;
    kiln_kir kir[KILN_LOWER_MAX];
    char *ptx[KILN_LOWER_MAX];
    uint32_t n = 0;
    if (c->dead) {
        kiln_cuda_enter(c, why, n_why); /* writes the sticky error */
        return false;
    }
    if (lower_and_print(c, &o->codegen, g, r, kir, ptx, &n, why, n_why) != KILN_OK) return false;
    kiln_lower_memo_put(&c->memo, g, r, &o->codegen, kir, ptx, n); /* compile() takes it: lowered and printed once */
    return true;
}

/* Blocks to launch for a grid-stride kernel: as many as are resident on the whole GPU at once
 * (the driver's occupancy for this function times the SM count), through kiln_stride_blocks. */
static uint32_t stride_grid(kiln_cuda *c, CUfunction fn, uint32_t n, uint32_t block)
{
    int per_sm = 0;
    if (c->d.occupancy(&per_sm, fn, (int)block, 0) != KILN_CU_SUCCESS || per_sm <= 0 || c->n_sm <= 0) per_sm = 0;
    return kiln_stride_blocks(n, (uint64_t)per_sm * (uint64_t)(c->n_sm > 0 ? c->n_sm : 0), UINT32_MAX, c->cg.grid_cap);
}

/* Copies a kernel's launch metadata and uploads its constant tables. */
static kiln_status setup_fn(kiln_cuda *c, const uint32_t grid[3], uint32_t block, const kiln_kbuf *bufs, uint32_t n_bufs,
                            const char *name, const kiln_ktable *tables, uint32_t n_tables, cuda_fn *f, char *err, size_t n)
{
    memcpy(f->grid, grid, sizeof f->grid);
    f->block = block;
    f->n_bufs = n_bufs;
    memcpy(f->bufs, bufs, n_bufs * sizeof *bufs);
    snprintf(f->name, sizeof f->name, "%s", name);
    kiln_status s = KILN_OK;
    for (uint32_t t = 0; s == KILN_OK && t < n_tables; t++) {
        size_t bytes = (size_t)tables[t].n * 4;
        s = kiln_cuda_alloc(c, bytes, &f->tables[t], err, n);
        if (s != KILN_OK || !bytes) continue;
        CUresult r = c->d.htod(f->tables[t], tables[t].words, bytes, c->stream);
        if (r == KILN_CU_SUCCESS) r = c->d.stream_sync(c->stream); /* the caller's copy is freed after */
        if (r != KILN_CU_SUCCESS) s = kiln_cuda_fail(c, r, "uploading a constant table", err, n);
    }
    return s;
}

/* The tensor maps and dynamic shared memory of kir (an sm_90a kernel) into f: the function may use
 * more than 48 KB of shared memory once the attribute says so. */
static kiln_status setup_async(kiln_cuda *c, const kiln_kir *kir, cuda_fn *f, char *err, size_t n)
{
    f->n_tmaps = kir->n_tmaps;
    memcpy(f->tmaps, kir->tmaps, sizeof f->tmaps);
    f->dyn_shared = kir->dyn_shared ? (uint32_t)kiln_kir_shared_bytes(kir) : 0;
    if ((f->n_tmaps || f->dyn_shared > 49152) && (!c->d.tmap_encode || !c->d.func_set_attr)) {
        snprintf(err, n, "kernel %s needs TMA and large shared memory: the driver has no cuTensorMapEncodeTiled", f->name);
        return KILN_ERR_UNSUPPORTED;
    }
    if (f->dyn_shared > 49152) {
        CUresult r = c->d.func_set_attr(f->fn, 8 /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */, (int)f->dyn_shared);
        if (r != KILN_CU_SUCCESS) return kiln_cuda_fail(c, r, "cuFuncSetAttribute (dynamic shared memory)", err, n);
    }
    return KILN_OK;
}

/* Appends kernel f's part of the cache entry: launch metadata, tables, PTX and cubin. */
static void entry_fn(kiln_blob_w *w, const kiln_kir *kir, const char *ptx, const unsigned char *cubin, size_t cubin_n)
{
    kiln_kir_blob_put(w, kir); /* launch metadata (codegen/kir_blob.h) */
    kiln_blob_bytes(w, ptx, strlen(ptx) + 1);
    kiln_blob_bytes(w, cubin, cubin_n);
}

/* The JIT of one printed kernel into f->mod / f->fn: kernels with setmaxnreg whole-program
 * (cuModuleLoadDataEx: no cubin to keep), the others through the linker, whose cubin the cache
 * entry keeps. The linker compiles a module as one of several compilation units: on the H100
 * (driver 580) it ignored setmaxnreg ("to maintain compatibility across compilation units",
 * C7504) and serialized WGMMAs (C7509): the flash kernel spilled 232 bytes and the 256 x 176 GEMM
 * 1248 (7x slower), where the whole-program JIT and ptxas spill nothing (flash_wg at 4096 tokens
 * 370 -> 303 us). The other warpgroup GEMMs measured slower whole-program (512-token down 90 ->
 * 97 us, O 39 -> 41), so they keep the linker. */
static kiln_status jit_fn(kiln_cuda *c, const kiln_kir *kir, const char *ptx, cuda_fn *f, unsigned char **cubin, size_t *cubin_n,
                          int *spills, char *err, size_t n)
{
    *cubin = NULL;
    *cubin_n = 0;
    bool setmaxnreg = false;
    for (uint32_t i = 0; i < kir->n_ins && !setmaxnreg; i++) setmaxnreg = kir->ins[i].op == KILN_KOP_SETMAXNREG;
    if (!setmaxnreg) return link_ptx(c, ptx, kir->name, &f->mod, &f->fn, cubin, cubin_n, spills, err, n);
    return kiln_cuda_load_ptx(c, ptx, kir->name, &f->mod, &f->fn, spills, err, n);
}

/* Links and loads one printed kernel into f, uploads its tables and appends its entry part. A
 * kernel the JIT reports spilling under the default register cap is printed again with every
 * register allowed (KILN_PTX_ALL_REGISTERS). */
static kiln_status load_fn(kiln_cuda *c, const kiln_kir *kir, const char *ptx, cuda_fn *f, kiln_blob_w *entry, char *err,
                           size_t n)
{
    dump(kir->name, ptx);
    int spills = -1;
    unsigned char *cubin = NULL;
    size_t cubin_n = 0;
    const char *used = ptx;
    char *again = NULL;
    kiln_status s = jit_fn(c, kir, ptx, f, &cubin, &cubin_n, &spills, err, n);
    if (s == KILN_OK && spills > 0) {
        if (kiln_ptx_print_ex(kir, c->ptx_sm, KILN_PTX_ALL_REGISTERS, &again, NULL, err, n) == KILN_OK) {
            cuda_fn g = {0};
            unsigned char *cubin2 = NULL;
            size_t cubin2_n = 0;
            dump(kir->name, again);
            if (jit_fn(c, kir, again, &g, &cubin2, &cubin2_n, NULL, err, n) == KILN_OK) {
                c->d.module_unload(f->mod);
                f->mod = g.mod, f->fn = g.fn;
                free(cubin);
                cubin = cubin2, cubin_n = cubin2_n;
                used = again;
            }
            err[0] = 0; /* the first module still works */
        }
    }
    if (s == KILN_OK) s = setup_fn(c, kir->grid, kir->block, kir->bufs, kir->n_bufs, kir->name, kir->tables, kir->n_tables, f, err, n);
    if (s == KILN_OK) s = setup_async(c, kir, f, err, n);
    if (s == KILN_OK && kir->grid_stride) f->grid[0] = stride_grid(c, f->fn, kir->grid[0], kir->block);
    f->pdl = kir->pdl;
    f->side = kir->side;
    f->rows = kir->rows;
    if (s == KILN_OK) entry_fn(entry, kir, used, cubin, cubin_n);
    free(cubin);
    free(again);
    return s;
}

kiln_status kiln_cuda_compile(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                              kiln_kernel **out, char *err, size_t n)
{
    kiln_cuda *c = state;
    *out = NULL;
    c->cg = o->codegen;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    kiln_kir kir[KILN_LOWER_MAX];
    char *ptx[KILN_LOWER_MAX];
    uint32_t nk = 0;
    if (!kiln_lower_memo_take(&c->memo, g, r, &o->codegen, kir, ptx, &nk) &&
        (s = lower_and_print(c, &o->codegen, g, r, kir, ptx, &nk, err, n)) != KILN_OK)
        return s;
    kiln_kernel *k = calloc(1, sizeof *k);
    if (!k) s = KILN_ERR_NOMEM;
    uint64_t scratch = 0;
    for (uint32_t i = 0; s == KILN_OK && i < nk; i++)
        if (kir[i].scratch_bytes > scratch) scratch = kir[i].scratch_bytes;
    if (k) kiln_kir_blob_head(&k->entry, ENTRY_MAGIC, kir, nk);
    for (uint32_t i = 0; s == KILN_OK && i < nk; i++) {
        s = load_fn(c, &kir[i], ptx[i], &k->fns[i], &k->entry, err, n);
        k->n_fns = i + 1;
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
    free(k->entry.p);
    free(k);
}

/* ------------------------------------------------------------------ cache entries */

void kiln_cuda_identity(void *state, char *buf, size_t n)
{
    kiln_cuda *c = state;
    int drv = 0;
    c->d.driver_version(&drv);
    snprintf(buf, n, "cuda %s sm_%d ptx sm_%d driver %d", c->name, c->sm, c->ptx_sm, drv);
}

kiln_status kiln_cuda_kernel_save(void *state, const kiln_kernel *k, void **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!k->entry.n || k->entry.oom) return KILN_ERR_NOMEM;
    if (!(*out = malloc(k->entry.n))) return KILN_ERR_NOMEM;
    memcpy(*out, k->entry.p, k->entry.n);
    *len = k->entry.n;
    return KILN_OK;
}

/* Reads one kernel of an entry into f: the launch metadata through the shared checked reader
 * (codegen/kir_blob.h), then the PTX and the cubin, which is loaded as it is (the JIT does not run);
 * an entry of a kernel with setmaxnreg has no cubin (jit_fn): its PTX goes through the whole-program JIT
 * again (the driver's own cache keeps what it made). */
static kiln_status load_entry_fn(kiln_cuda *c, const kiln_graph *g, const kiln_kir *want, kiln_blob_r *rd, cuda_fn *f, char *err,
                                 size_t n)
{
    kiln_kir_meta m;
    kiln_status s = kiln_kir_blob_get(rd, g, want, "cuda", &m, err, n);
    if (s != KILN_OK) return s;
    size_t ptx_n, cubin_n;
    const char *ptx = kiln_blob_get_bytes(rd, &ptx_n);
    const unsigned char *cubin = kiln_blob_get_bytes(rd, &cubin_n);
    if (rd->bad || !ptx_n || ptx[ptx_n - 1]) {
        snprintf(err, n, "cuda: cache entry does not fit the region");
        return KILN_ERR_INVALID_ARG;
    }
    /* The tables are uploaded from the entry's bytes, which may be unaligned: copy them first. */
    uint32_t *copies[KILN_KIR_MAX_TABLES] = {0};
    for (uint32_t t = 0; s == KILN_OK && t < m.n_tables; t++) {
        if (!(copies[t] = malloc((size_t)m.tables[t].n * 4 + 4))) s = KILN_ERR_NOMEM;
        else memcpy(copies[t], m.tables[t].words, (size_t)m.tables[t].n * 4), m.tables[t].words = copies[t];
    }
    unsigned char *image = s == KILN_OK && cubin_n ? malloc(cubin_n) : NULL; /* the driver reads an aligned image */
    if (s == KILN_OK && cubin_n && !image) s = KILN_ERR_NOMEM;
    if (s == KILN_OK && !cubin_n) { /* a kernel with setmaxnreg: its PTX, whole-program (jit_fn) */
        s = kiln_cuda_load_ptx(c, ptx, m.name, &f->mod, &f->fn, NULL, err, n);
    } else if (s == KILN_OK) {
        memcpy(image, cubin, cubin_n);
        CUresult r = c->d.module_load(&f->mod, image, 0, NULL, NULL);
        if (r != KILN_CU_SUCCESS) s = kiln_cuda_fail(c, r, "cuModuleLoadDataEx of a cached cubin", err, n), f->mod = NULL;
        else if ((r = c->d.module_function(&f->fn, f->mod, m.name)) != KILN_CU_SUCCESS) s = kiln_cuda_fail(c, r, "cuModuleGetFunction", err, n);
    }
    if (s == KILN_OK) s = setup_fn(c, m.grid, m.block, m.bufs, m.n_bufs, m.name, m.tables, m.n_tables, f, err, n);
    if (s == KILN_OK) s = setup_async(c, want, f, err, n); /* tensor maps and dynamic shared memory: want's (the metadata matched) */
    if (s == KILN_OK && m.grid_stride) f->grid[0] = stride_grid(c, f->fn, m.grid[0], m.block);
    f->pdl = want->pdl; /* the entry's key holds the options that made it so */
    f->side = want->side;
    f->rows = want->rows; /* this build's lowering of the region, as the entry's metadata */
    free(image);
    for (uint32_t t = 0; t < m.n_tables; t++) free(copies[t]);
    return s;
}

kiln_status kiln_cuda_kernel_load(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                                  const void *buf, size_t len, kiln_kernel **out, char *err, size_t n)
{
    kiln_cuda *c = state;
    *out = NULL;
    c->cg = o->codegen;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    kiln_kir kir[KILN_LOWER_MAX]; /* the region's lowering, to check the entry against (no PTX printing) */
    uint32_t n_kir = 0;
    kiln_lower_target t = kiln_lower_target_with(&c->target, &o->codegen); /* as kiln_cuda_compile lowers */
    if ((s = kiln_lower_region_for(g, r, &t, kir, &n_kir, err, n)) != KILN_OK) return s;
    kiln_blob_r rd = {.p = buf, .n = len};
    uint64_t scratch = 0;
    for (uint32_t i = 0; i < n_kir; i++)
        if (kir[i].scratch_bytes > scratch) scratch = kir[i].scratch_bytes;
    kiln_kernel *k = NULL;
    if (!kiln_kir_blob_head_ok(&rd, ENTRY_MAGIC, kir, n_kir)) {
        snprintf(err, n, "cuda: cache entry does not fit the region");
        s = KILN_ERR_INVALID_ARG;
    } else if (!(k = calloc(1, sizeof *k))) {
        s = KILN_ERR_NOMEM;
    }
    for (uint32_t i = 0; k && s == KILN_OK && i < n_kir; i++) {
        s = load_entry_fn(c, g, &kir[i], &rd, &k->fns[i], err, n);
        k->n_fns = i + 1;
    }
    for (uint32_t i = 0; i < n_kir; i++) kiln_kir_free(&kir[i]);
    if (!k) return s;
    if (s == KILN_OK && rd.at != rd.n) {
        snprintf(err, n, "cuda: cache entry has trailing bytes");
        s = KILN_ERR_INVALID_ARG;
    }
    if (s == KILN_OK && scratch) s = kiln_cuda_alloc(c, (size_t)scratch, &k->scratch, err, n);
    if (s != KILN_OK) {
        kiln_cuda_kernel_free(c, k);
        return s;
    }
    *out = k;
    return KILN_OK;
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

/* Tensor map m of f over its slot's device address (ptr: the launch's slot addresses): 16-bit
 * elements, 128-byte swizzle, rows past the end read as zeros. */
static kiln_status encode_tmap(kiln_cuda *c, const cuda_fn *f, const kiln_ktmap *m, const CUdeviceptr *ptr, void *map, char *err,
                               size_t n)
{
    CUdeviceptr base = ptr[m->slot] + 4ull * m->word;
    unsigned long long dims[2] = {m->inner, m->outer}, strides[1] = {m->stride};
    unsigned box[2] = {m->box_inner, m->box_outer}, es[2] = {1, 1};
    CUresult r = c->d.tmap_encode(map, 1 /* UINT16 */, 2, (void *)(uintptr_t)base, dims, strides, box, es, 0 /* no interleave */,
                                  3 /* 128-byte swizzle */, 3 /* L2 promotion 256 B */, 0 /* zeros out of bounds */);
    if (r != KILN_CU_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cuTensorMapEncodeTiled for %s (%u x %u, stride %u, box %u x %u)", f->name, m->inner, m->outer, m->stride,
                 m->box_inner, m->box_outer);
        return kiln_cuda_fail(c, r, what, err, n);
    }
    return KILN_OK;
}

uint64_t kiln_cuda_active(void *state, const kiln_kernel *k, const kiln_exec_view *v)
{
    (void)state;
    uint64_t m = 0;
    for (uint32_t i = 0; k && i < k->n_fns; i++)
        if (kiln_krows_pass(&k->fns[i].rows, v->g, v->dims)) m |= 1ull << i;
    return m;
}

/* One kernel of a region on queue st. */
static kiln_status launch_fn(kiln_cuda *c, const kiln_kernel *k, const cuda_fn *f, const kiln_exec_view *v, CUstream st, bool pdl,
                             char *err, size_t n)
{
    kiln_status s;
    CUdeviceptr ptr[KILN_KIR_MAX_BUFS];
    void *args[KILN_KIR_MAX_BUFS + KILN_KIR_MAX_TMAPS];
    _Alignas(64) unsigned char maps[KILN_KIR_MAX_TMAPS][128];
    for (uint32_t j = 0; j < f->n_bufs; j++) {
        const kiln_kbuf *b = &f->bufs[j];
        if (!(ptr[j] = slot_addr(k, f, b, v))) {
            snprintf(err, n, "kernel %s: buffer slot %u (%s %u) has no device address", f->name, j,
                     b->kind < KILN_KBUF_KIND_COUNT ? slot_kind[b->kind] : "?", b->node);
            return KILN_ERR_INTERNAL;
        }
        args[j] = &ptr[j];
    }
    for (uint32_t t = 0; t < f->n_tmaps; t++) {
        if ((s = encode_tmap(c, f, &f->tmaps[t], ptr, maps[t], err, n)) != KILN_OK) return s;
        args[f->n_bufs + t] = maps[t];
    }
    CUresult rr = kiln_cuda_launch_fn(c, st, f->fn, f->grid, f->block, f->dyn_shared, args, pdl);
    if (rr != KILN_CU_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cuLaunchKernel of %s (grid %u x %u x %u, block %u)", f->name, f->grid[0],
                 f->grid[1], f->grid[2], f->block);
        return kiln_cuda_fail(c, rr, what, err, n);
    }
    return KILN_OK;
}

/* The side stream's fork (join = false: it waits for what stream has so far) or join (stream waits for
 * what was enqueued on it); stream and events made on first use. Inside a capture the events make the
 * side stream's kernels a branch of the recorded graph. */
static kiln_status side_sync(kiln_cuda *c, bool join, char *err, size_t n)
{
    if (!c->side) KILN_CUDA_TRY(c, stream_create(&c->side, KILN_CU_STREAM_NON_BLOCKING), "cuStreamCreate (side stream)", err, n);
    CUevent *e = &c->side_ev[join];
    if (!*e) KILN_CUDA_TRY(c, event_create(e, 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate", err, n);
    KILN_CUDA_TRY(c, event_record(*e, join ? c->side : c->stream), "cuEventRecord", err, n);
    KILN_CUDA_TRY(c, stream_wait_event(join ? c->stream : c->side, *e, 0), "cuStreamWaitEvent", err, n);
    return KILN_OK;
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
    /* side kernels first, on the side stream (forked after everything before the region), then the
     * others on the stream; the stream waits for the side stream before the next region */
    uint64_t run = 0, side = 0;
    for (uint32_t i = 0; i < k->n_fns; i++) /* a kernel whose row guard fails would do nothing */
        if (kiln_krows_pass(&k->fns[i].rows, v->g, v->dims)) run |= 1ull << i, side |= (uint64_t)k->fns[i].side << i;
    if (side == run) side = 0; /* alone in the step: nothing to run beside */
    if (side && (s = side_sync(c, false, err, n)) != KILN_OK) return s;
    for (int round = side ? 0 : 1; round < 2; round++)
        for (uint32_t i = 0; i < k->n_fns; i++) {
            if (!(run >> i & 1) || (side >> i & 1) != (round == 0)) continue;
            const cuda_fn *f = &k->fns[i];
            if ((s = launch_fn(c, k, f, v, round ? c->stream : c->side, round && f->pdl, err, n)) != KILN_OK) return s;
        }
    return side ? side_sync(c, true, err, n) : KILN_OK;
}
