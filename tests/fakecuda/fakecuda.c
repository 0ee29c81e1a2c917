/* A stand-in for libcuda.so.1 (loaded through $KILN_LIBCUDA) so the CUDA backend's host side runs
 * on machines with no GPU: device memory is host memory, copies happen at once, modules keep
 * their PTX text (cuLink* makes a "cubin" that is the PTX behind a magic line), launches and graph replays are counted but run nothing. Failures are injected
 * with FAKECUDA_DEVICES, FAKECUDA_MEM (bytes), FAKECUDA_JIT_FAIL, FAKECUDA_EX_FAIL, FAKECUDA_GRAPH_NO_PDL,
 * FAKECUDA_DRIVER (the version it reports) and fakecuda_fault_next_sync();
 * memory comes zeroed, or filled with 0xFF bytes (NaN) under FAKECUDA_POISON=1.
 * Must not be linked into kiln: only the tests load it (tests/support/fakecuda_use.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define EXPORT __attribute__((visibility("default")))

/* What the fake saw, for the tests (read through dlsym; the struct is in fakecuda.h). */
EXPORT fakecuda_log fakecuda;

static int ctx_refs; /* cuDevicePrimaryCtxRetain minus releases */

static int env_int(const char *n, int d)
{
    const char *v = getenv(n);
    return v && v[0] ? atoi(v) : d;
}

static size_t mem_limit(void)
{
    const char *v = getenv("FAKECUDA_MEM");
    return v && v[0] ? (size_t)strtoull(v, NULL, 10) : (size_t)80 << 30;
}

EXPORT CUresult cuInit(unsigned f) { return env_int("FAKECUDA_DEVICES", 1) ? 0 : 100; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = env_int("FAKECUDA_DRIVER", 13000); return 0; }
EXPORT CUresult cuDeviceGetCount(int *n) { *n = env_int("FAKECUDA_DEVICES", 1); return 0; }
EXPORT CUresult cuDeviceGet(int *d, int o) { *d = o; return o < env_int("FAKECUDA_DEVICES", 1) ? 0 : 101; }
EXPORT CUresult cuDeviceGetAttribute(int *v, int a, int d)
{
    switch (a) {
    case 13: *v = 1980000; return 0;
    case 16: *v = 132; return 0;
    case 36: *v = 2619000; return 0;
    case 37: *v = 5120; return 0;
    case 38: *v = 50 << 20; return 0;
    case 75: *v = env_int("FAKECUDA_CC", 90) / 10; return 0;
    case 76: *v = env_int("FAKECUDA_CC", 90) % 10; return 0;
    default: return 1;
    }
}
EXPORT CUresult cuDeviceGetName(char *s, int n, int d) { snprintf(s, (size_t)n, "NVIDIA H100 80GB HBM3 (fake)"); return 0; }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, int d) { *b = mem_limit(); return 0; }
EXPORT CUresult cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)0x1234; ctx_refs++; return 0; }
static void mod_free_all(void);
/* The last release destroys the context and every module still loaded in it (a backend stopped by
 * a sticky error cannot unload its modules: the driver frees them here). */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int d)
{
    if (ctx_refs > 0 && --ctx_refs == 0) mod_free_all();
    return 0;
}
EXPORT CUresult cuCtxSetCurrent(void *c) { return 0; }
EXPORT CUresult cuStreamCreate(void **s, unsigned f) { *s = malloc(1); return 0; }
EXPORT CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }

/* Streams between cuStreamBeginCapture and cuStreamEndCapture (several at once: a split plan's
 * GPUs record together), with the launches each captured. */
#define FC_CAPTURES 8
static void *cap_stream[FC_CAPTURES];
static int   cap_kernels[FC_CAPTURES];
/* Streams that joined a capture by waiting for an event recorded on a capturing stream (the graph's
 * branches), each with launches not yet joined back (an event recorded on it after them, which a
 * stream of the capture waited for). */
static void *join_stream[FC_CAPTURES];
static int   join_slot[FC_CAPTURES], join_pending[FC_CAPTURES];
static int   joined(const void *s)
{
    for (int i = 0; s && i < FC_CAPTURES; i++)
        if (join_stream[i] == s) return i;
    return -1;
}
static int   cap_slot(const void *s)
{
    for (int i = 0; s && i < FC_CAPTURES; i++)
        if (cap_stream[i] == s) return i;
    int j = joined(s);
    return j >= 0 ? join_slot[j] : -1;
}
static int capture_pdl_start; /* pdl_captured when the capture began */

EXPORT CUresult cuStreamSynchronize(void *s)
{
    fakecuda.syncs++;
    if (fakecuda.fault_next_sync) {
        fakecuda.fault_next_sync = 0;
        return 700;
    }
    return 0;
}

/* Blocks carry their size 256 bytes before the address handed out. */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    if (fakecuda.allocated + n > mem_limit()) return 2;
    char *m = aligned_alloc(256, 256 + ((n + 255) & ~(size_t)255));
    if (!m) return 2;
    memcpy(m, &n, sizeof n);
    memset(m + 256, env_int("FAKECUDA_POISON", 0) ? 0xFF : 0, n); /* poisoned: NaN floats, as if a kernel wrote them */
    *p = (CUdeviceptr)(uintptr_t)(m + 256);
    fakecuda.live_allocs++;
    fakecuda.allocated += n;
    return 0;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    char *m = (char *)(uintptr_t)p - 256;
    size_t n;
    memcpy(&n, m, sizeof n);
    fakecuda.allocated -= n;
    free(m);
    fakecuda.live_allocs--;
    fakecuda.frees++;
    return 0;
}
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *t = mem_limit(); *f = *t - fakecuda.allocated; return 0; }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return 0; }

typedef struct ffunc {
    char name[48]; /* the entry */
    int n_params; /* .param count of the entry */
    int waits;    /* its module's PTX has griddepcontrol.wait */
} ffunc;
typedef struct fmod {
    char  *ptx;              /* the text */
    ffunc *funcs[8];         /* entries looked up (freed with the module) */
    int    n_funcs;          /* used */
    struct fmod *prev, *next; /* the live modules, freed with the primary context as the driver does */
} fmod;

static fmod *live_mods; /* modules not unloaded */

static fmod *mod_new(const char *ptx)
{
    fmod *f = calloc(1, sizeof *f);
    f->ptx = strdup(ptx);
    f->next = live_mods;
    if (live_mods) live_mods->prev = f;
    live_mods = f;
    snprintf(fakecuda.last_ptx, sizeof fakecuda.last_ptx, "%s", f->ptx);
    fakecuda.modules++;
    return f;
}

static void mod_free(fmod *f)
{
    if (f->prev) f->prev->next = f->next;
    else live_mods = f->next;
    if (f->next) f->next->prev = f->prev;
    for (int i = 0; i < f->n_funcs; i++) free(f->funcs[i]);
    free(f->ptx);
    free(f);
}

/* The fake's "cubin": a magic line, then the PTX it was made from (so modules still find their
 * entries); the real driver's image is ELF. */
static const char cubin_magic[] = "FAKECUBIN sm_90\n";

typedef struct flink {
    char *ptx;         /* the PTX added */
    char *image;       /* the cubin made by cuLinkComplete */
    char *elog, *ilog; /* log buffers given at create (64 and 256 bytes are written at most) */
} flink;

EXPORT CUresult cuLinkCreate_v2(unsigned n, int *opts, void **vals, void **st)
{
    flink *l = calloc(1, sizeof *l);
    for (unsigned i = 0; i < n; i++) {
        if (opts[i] == 5) l->elog = vals[i];
        if (opts[i] == 3) l->ilog = vals[i];
    }
    *st = l;
    return 0;
}
EXPORT CUresult cuLinkAddData_v2(void *st, int type, void *data, size_t size, const char *name, unsigned n, int *opts, void **vals)
{
    flink *l = st;
    if (type != 1 || !data || !size || ((const char *)data)[size - 1]) return 1; /* PTX, NUL-terminated */
    if (env_int("FAKECUDA_JIT_FAIL", 0)) {
        if (l->elog) snprintf(l->elog, 64, "ptxas fatal   : fake JIT failure");
        return 218;
    }
    if (l->ilog) /* the JIT's info log, as ptxas -v writes it */
        snprintf(l->ilog, 256, "ptxas info    : Function properties for k\n    0 bytes stack frame, %d bytes spill stores, %d bytes spill loads\n",
                 env_int("FAKECUDA_SPILL", 0) && !strstr(data, ".minnctapersm 1") ? 8 : 0, 0);
    l->ptx = strdup(data);
    return 0;
}
EXPORT CUresult cuLinkComplete(void *st, void **cubin, size_t *size)
{
    flink *l = st;
    if (!l->ptx) return 1;
    size_t n = strlen(cubin_magic) + strlen(l->ptx) + 1;
    l->image = malloc(n);
    snprintf(l->image, n, "%s%s", cubin_magic, l->ptx);
    *cubin = l->image;
    *size = n;
    fakecuda.links++;
    return 0;
}
EXPORT CUresult cuLinkDestroy(void *st)
{
    flink *l = st;
    free(l->ptx);
    free(l->image);
    free(l);
    return 0;
}

EXPORT CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *opts, void **vals)
{
    const char *ptx = image;
    if (strncmp(ptx, cubin_magic, strlen(cubin_magic)) == 0) { /* a cubin: no JIT, no log */
        fakecuda.cubin_loads++;
        *m = mod_new(ptx + strlen(cubin_magic));
        return 0;
    }
    if (env_int("FAKECUDA_JIT_FAIL", 0)) {
        for (unsigned i = 0; i < n; i++)
            if (opts[i] == 5) snprintf(vals[i], 64, "ptxas fatal   : fake JIT failure");
        return 218;
    }
    for (unsigned i = 0; i < n; i++) /* the JIT's info log, as ptxas -v writes it */
        if (opts[i] == 3)
            snprintf(vals[i], 256, "ptxas info    : Function properties for k\n    0 bytes stack frame, %d bytes spill stores, %d bytes spill loads\n",
                     env_int("FAKECUDA_SPILL", 0) && !strstr(ptx, ".minnctapersm 1") ? 8 : 0, 0);
    *m = mod_new(ptx);
    return 0;
}
EXPORT CUresult cuModuleUnload(void *m)
{
    mod_free(m);
    return 0;
}

static void exec_free_all(void);
static void mod_free_all(void)
{
    while (live_mods) mod_free(live_mods);
    exec_free_all();
}
EXPORT CUresult cuModuleGetFunction(void **fn, void *m, const char *name)
{
    fmod *f = m;
    char entry[128];
    snprintf(entry, sizeof entry, ".entry %s(", name);
    const char *e = strstr(f->ptx, entry);
    if (!e) return 500; /* CUDA_ERROR_NOT_FOUND */
    ffunc *fu = calloc(1, sizeof *fu);
    snprintf(fu->name, sizeof fu->name, "%s", name);
    for (const char *p = e; (p = strstr(p, ".param .u64")) && p < strchr(e, ')'); p++) fu->n_params++;
    fu->waits = strstr(f->ptx, "\tgriddepcontrol.wait;\n") != NULL;
    if (f->n_funcs < 8) f->funcs[f->n_funcs++] = fu; /* else leaked: tests look up one entry per module */
    *fn = fu;
    return 0;
}
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *fn, int block_size, size_t dynamic_shared)
{
    (void)fn, (void)dynamic_shared;
    if (block_size <= 0 || block_size > 1024) return 1;
    *blocks = 2048 / block_size;
    return 0;
}
EXPORT CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned sh, void *s, void **params, void **extra)
{
    ffunc *fu = fn;
    if (!gx || !gy || !gz || !bx || bx > 1024) return 1;
    fakecuda.last_grid[0] = gx, fakecuda.last_grid[1] = gy, fakecuda.last_grid[2] = gz, fakecuda.last_block = bx;
    fakecuda.last_n_params = fu->n_params;
    for (int i = 0; i < fu->n_params && i < 16; i++) fakecuda.last_params[i] = *(CUdeviceptr *)params[i];
    for (int i = 0; i < fu->n_params; i++)
        if (!*(CUdeviceptr *)params[i]) {
            fakecuda.null_params++;
            break;
        }
    int k = cap_slot(s), j = joined(s);
    if (k >= 0) fakecuda.captured++, cap_kernels[k]++;
    else fakecuda.launches++;
    if (j >= 0) fakecuda.joined_launches++, join_pending[j] = 1;
    int l = fakecuda.n_launch_log++ % 64;
    snprintf(fakecuda.launch_log[l].name, sizeof fakecuda.launch_log[l].name, "%s", fu->name);
    fakecuda.launch_log[l].stream = s;
    return 0;
}

/* cuda.h's CUlaunchAttribute and CUlaunchConfig (CUDA 12), written from the driver API reference. */
typedef struct fattr {
    int  id;    /* CUlaunchAttributeID: 6 = programmatic stream serialization */
    char pad[4];
    union {
        char  raw[64];
        int   programmatic; /* programmaticStreamSerializationAllowed */
        void *align;
    } val;
} fattr;
typedef struct fconfig {
    unsigned gx, gy, gz, bx, by, bz, shared;
    void    *stream;
    fattr   *attrs;
    unsigned n_attrs;
} fconfig;

/* FAKECUDA_EX_FAIL=1: refuses programmatic launches (CUDA_ERROR_NOT_SUPPORTED), as a driver might. */
EXPORT CUresult cuLaunchKernelEx(const fconfig *cfg, void *fn, void **params, void **extra)
{
    if (!cfg || cfg->n_attrs > 8 || (cfg->n_attrs && !cfg->attrs)) return 1;
    int pdl = 0;
    for (unsigned i = 0; i < cfg->n_attrs; i++) {
        if (cfg->attrs[i].id < 0 || cfg->attrs[i].id > 14) return 1;
        if (cfg->attrs[i].id == 6) pdl = cfg->attrs[i].val.programmatic != 0;
    }
    if (pdl && env_int("FAKECUDA_EX_FAIL", 0)) return 801;
    CUresult r = cuLaunchKernel(fn, cfg->gx, cfg->gy, cfg->gz, cfg->bx, cfg->by, cfg->bz, cfg->shared, cfg->stream, params, extra);
    if (r) return r;
    fakecuda.ex_launches++;
    fakecuda.pdl_launches += pdl;
    fakecuda.pdl_captured += pdl && cap_slot(cfg->stream) >= 0;
    if (pdl && !((ffunc *)fn)->waits) fakecuda.pdl_without_wait++;
    return 0;
}

typedef struct fgraph {
    int            kernels; /* launches captured */
    struct fgraph *next;    /* executable graphs: the next one not destroyed */
} fgraph;
static fgraph *live_execs; /* executable graphs not destroyed (freed with the context, as modules) */
EXPORT CUresult cuStreamBeginCapture_v2(void *s, int mode)
{
    if (cap_slot(s) >= 0) return 900;
    int k;
    for (k = 0; k < FC_CAPTURES && cap_stream[k]; k++) {}
    if (k == FC_CAPTURES) return 900;
    cap_stream[k] = s, cap_kernels[k] = 0;
    capture_pdl_start = fakecuda.pdl_captured;
    return 0;
}
/* FAKECUDA_GRAPH_NO_PDL=1: a capture with programmatic launches ends invalidated, as a driver
 * before 12.3 would. */
EXPORT CUresult cuStreamEndCapture(void *s, void **g)
{
    int k = cap_slot(s);
    if (k < 0 || joined(s) >= 0) return 901;
    cap_stream[k] = NULL;
    int unjoined = 0;
    for (int j = 0; j < FC_CAPTURES; j++)
        if (join_stream[j] && join_slot[j] == k) unjoined |= join_pending[j], join_stream[j] = NULL;
    if (unjoined) return fakecuda.unjoined_ends++, 904; /* CUDA_ERROR_STREAM_CAPTURE_UNJOINED */
    if (env_int("FAKECUDA_GRAPH_NO_PDL", 0) && fakecuda.pdl_captured > capture_pdl_start) return 901;
    fgraph *fg = calloc(1, sizeof *fg);
    fg->kernels = cap_kernels[k];
    *g = fg;
    return 0;
}
EXPORT CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f)
{
    fgraph *x = malloc(sizeof *x);
    *x = *(fgraph *)g;
    x->next = live_execs;
    live_execs = x;
    *e = x;
    return 0;
}
EXPORT CUresult cuGraphLaunch(void *e, void *s)
{
    fakecuda.graph_launches++;
    fakecuda.graph_kernels += ((fgraph *)e)->kernels;
    return 0;
}
EXPORT CUresult cuGraphExecDestroy(void *e)
{
    for (fgraph **p = &live_execs; *p; p = &(*p)->next)
        if (*p == e) {
            *p = ((fgraph *)e)->next;
            break;
        }
    free(e);
    return 0;
}
static void exec_free_all(void)
{
    while (live_execs) cuGraphExecDestroy(live_execs);
}
EXPORT CUresult cuGraphDestroy(void *g) { free(g); return 0; }

static double fake_clock;
/* An event: its time (first: cuEventElapsedTime reads it), the capture its last record joined and
 * the stream it was recorded on. */
typedef struct fevent {
    double t;
    int    slot;
    void  *stream;
} fevent;
EXPORT CUresult cuEventCreate(void **e, unsigned f) { *e = calloc(1, sizeof(fevent)); return 0; }
EXPORT CUresult cuEventRecord(void *e, void *s)
{
    fevent *ev = e;
    ev->t = (fake_clock += 0.25), ev->slot = cap_slot(s), ev->stream = s;
    return 0;
}
EXPORT CUresult cuEventSynchronize(void *e) { return 0; }
EXPORT CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = (float)(*(double *)b - *(double *)a); return 0; }
EXPORT CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
EXPORT CUresult cuStreamWaitEvent(void *s, void *e, unsigned f)
{
    fevent *ev = e;
    fakecuda.stream_waits++;
    if (ev->slot < 0) return 0;
    int j = joined(ev->stream);
    if (cap_slot(s) == ev->slot && j >= 0 && join_slot[j] == ev->slot) join_pending[j] = 0; /* joined back */
    if (cap_slot(s) < 0) { /* s joins the capture */
        int k;
        for (k = 0; k < FC_CAPTURES && join_stream[k]; k++) {}
        if (k == FC_CAPTURES) return 900;
        join_stream[k] = s, join_slot[k] = ev->slot, join_pending[k] = 0;
    }
    return 0;
}

EXPORT CUresult cuGetErrorName(CUresult r, const char **s)
{
    switch (r) {
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 218: *s = "CUDA_ERROR_INVALID_PTX"; return 0;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0;
    case 801: *s = "CUDA_ERROR_NOT_SUPPORTED"; return 0;
    case 901: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; return 0;
    default: *s = NULL; return 1;
    }
}
EXPORT CUresult cuGetErrorString(CUresult r, const char **s)
{
    switch (r) {
    case 2: *s = "out of memory"; return 0;
    case 100: *s = "no CUDA-capable device is detected"; return 0;
    case 218: *s = "a PTX JIT compilation failed"; return 0;
    case 700: *s = "an illegal memory access was encountered"; return 0;
    case 801: *s = "operation not supported"; return 0;
    case 901: *s = "operation failed due to a previous error during capture"; return 0;
    default: *s = NULL; return 1;
    }
}
