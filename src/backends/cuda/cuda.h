/* The CUDA backend's inside: the few driver types and constants it uses (declared here, so kiln
 * builds without the CUDA toolkit), the table of driver entry points loaded from libcuda.so.1 with
 * dlopen, the backend state (device, context, stream, memory pool, timers) and the error
 * translation every driver call goes through. Must not include <cuda.h> or link libcuda. */
#pragma once

#include "codegen/lower_memo.h"
#include "codegen/target.h"
#include "kiln/kiln.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ driver types (cuda.h) */

typedef int                       CUresult;
typedef int                       CUdevice;
typedef unsigned long long        CUdeviceptr;
typedef struct CUctx_st          *CUcontext;
typedef struct CUmod_st          *CUmodule;
typedef struct CUfunc_st         *CUfunction;
typedef struct CUstream_st       *CUstream;
typedef struct CUevent_st        *CUevent;
typedef struct CUgraph_st        *CUgraph;
typedef struct CUgraphExec_st    *CUgraphExec;
typedef struct CUlinkState_st    *CUlinkState;

enum {
    KILN_CU_SUCCESS = 0,
    KILN_CU_ERROR_OUT_OF_MEMORY = 2,
    KILN_CU_ERROR_NO_DEVICE = 100,
    KILN_CU_ERROR_ILLEGAL_ADDRESS = 700,
    KILN_CU_ERROR_LAUNCH_TIMEOUT = 702,
    KILN_CU_ERROR_HARDWARE_STACK_ERROR = 714,
    KILN_CU_ERROR_LAUNCH_FAILED = 719,
    /* device attributes */
    KILN_CU_ATTR_CLOCK_RATE = 13,          /* kHz */
    KILN_CU_ATTR_SM_COUNT = 16,
    KILN_CU_ATTR_MEMORY_CLOCK_RATE = 36,   /* kHz */
    KILN_CU_ATTR_MEMORY_BUS_WIDTH = 37,    /* bits */
    KILN_CU_ATTR_L2_CACHE_SIZE = 38,       /* bytes */
    KILN_CU_ATTR_CC_MAJOR = 75,
    KILN_CU_ATTR_CC_MINOR = 76,
    /* JIT options of cuModuleLoadDataEx */
    KILN_CU_JIT_INFO_LOG_BUFFER = 3,
    KILN_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    KILN_CU_JIT_ERROR_LOG_BUFFER = 5,
    KILN_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
    KILN_CU_JIT_LOG_VERBOSE = 12,
    KILN_CU_JIT_INPUT_PTX = 1,             /* CUjitInputType of cuLinkAddData */
    KILN_CU_STREAM_NON_BLOCKING = 1,
    KILN_CU_STREAM_CAPTURE_MODE_RELAXED = 2,
    KILN_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6, /* CUlaunchAttributeID */
    KILN_CU_PDL_DRIVER = 12030, /* cuDriverGetVersion from which CUDA graphs capture programmatic launches (12.3) */
};

/* cuLaunchKernelEx's configuration (cuda.h's CUlaunchAttribute and CUlaunchConfig, same layout). */
typedef struct kiln_cu_launch_attr {
    int  id;     /* CUlaunchAttributeID */
    char pad[4]; /* to 8 bytes, as cuda.h */
    union {
        char raw[64];     /* CUlaunchAttributeValue is 64 bytes */
        int  value;       /* programmaticStreamSerializationAllowed, cooperative, ... */
        void *align;      /* its pointer members align it to 8 */
    } val;
} kiln_cu_launch_attr;
typedef struct kiln_cu_launch_config {
    unsigned             grid[3];  /* gridDimX, Y, Z */
    unsigned             block[3]; /* blockDimX, Y, Z */
    unsigned             shared;   /* sharedMemBytes (dynamic) */
    CUstream             stream;   /* hStream */
    kiln_cu_launch_attr *attrs;    /* attrs */
    unsigned             n_attrs;  /* numAttrs */
} kiln_cu_launch_config;
/* cuda.h's sizes and offsets on LP64 (the driver reads these bytes) */
_Static_assert(sizeof(kiln_cu_launch_attr) == 72 && offsetof(kiln_cu_launch_attr, val) == 8, "CUlaunchAttribute layout");
_Static_assert(offsetof(kiln_cu_launch_config, stream) == 32 && offsetof(kiln_cu_launch_config, attrs) == 40 &&
               offsetof(kiln_cu_launch_config, n_attrs) == 48 && sizeof(kiln_cu_launch_config) == 56, "CUlaunchConfig layout");

/* ------------------------------------------------------------------ entry points */

/* X(field, symbol, fallback symbol or NULL, return type, parameters): the versioned names are the
 * ones cuda.h maps the plain names to (driver 580: *_v2, cuGraphInstantiateWithFlags). */
#define KILN_CUDA_ENTRY_POINTS(X)                                                                       \
    X(init, "cuInit", NULL, CUresult, (unsigned flags))                                                 \
    X(driver_version, "cuDriverGetVersion", NULL, CUresult, (int *v))                                   \
    X(device_count, "cuDeviceGetCount", NULL, CUresult, (int *n))                                       \
    X(device_get, "cuDeviceGet", NULL, CUresult, (CUdevice * d, int ordinal))                           \
    X(device_attr, "cuDeviceGetAttribute", NULL, CUresult, (int *v, int attr, CUdevice d))              \
    X(device_name, "cuDeviceGetName", NULL, CUresult, (char *name, int len, CUdevice d))                \
    X(device_total_mem, "cuDeviceTotalMem_v2", NULL, CUresult, (size_t * bytes, CUdevice d))            \
    X(primary_retain, "cuDevicePrimaryCtxRetain", NULL, CUresult, (CUcontext * c, CUdevice d))          \
    X(primary_release, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", CUresult, (CUdevice d)) \
    X(ctx_set_current, "cuCtxSetCurrent", NULL, CUresult, (CUcontext c))                                \
    X(stream_create, "cuStreamCreate", NULL, CUresult, (CUstream * s, unsigned flags))                  \
    X(stream_destroy, "cuStreamDestroy_v2", NULL, CUresult, (CUstream s))                               \
    X(stream_sync, "cuStreamSynchronize", NULL, CUresult, (CUstream s))                                 \
    X(mem_alloc, "cuMemAlloc_v2", NULL, CUresult, (CUdeviceptr * p, size_t bytes))                      \
    X(mem_free, "cuMemFree_v2", NULL, CUresult, (CUdeviceptr p))                                        \
    X(mem_info, "cuMemGetInfo_v2", NULL, CUresult, (size_t * free_bytes, size_t * total))               \
    X(htod, "cuMemcpyHtoDAsync_v2", NULL, CUresult, (CUdeviceptr dst, const void *src, size_t n, CUstream s)) \
    X(dtoh, "cuMemcpyDtoHAsync_v2", NULL, CUresult, (void *dst, CUdeviceptr src, size_t n, CUstream s)) \
    X(dtod, "cuMemcpyDtoDAsync_v2", NULL, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)) \
    X(module_load, "cuModuleLoadDataEx", NULL, CUresult,                                                \
      (CUmodule * m, const void *image, unsigned n_opt, int *opts, void **vals))                        \
    X(module_unload, "cuModuleUnload", NULL, CUresult, (CUmodule m))                                    \
    X(link_create, "cuLinkCreate_v2", "cuLinkCreate", CUresult,                                         \
      (unsigned n_opt, int *opts, void **vals, CUlinkState *st))                                        \
    X(link_add, "cuLinkAddData_v2", "cuLinkAddData", CUresult,                                          \
      (CUlinkState st, int type, void *data, size_t size, const char *name, unsigned n_opt, int *opts, void **vals)) \
    X(link_complete, "cuLinkComplete", NULL, CUresult, (CUlinkState st, void **cubin, size_t *size))     \
    X(link_destroy, "cuLinkDestroy", NULL, CUresult, (CUlinkState st))                                  \
    X(module_function, "cuModuleGetFunction", NULL, CUresult, (CUfunction * f, CUmodule m, const char *name)) \
    X(launch, "cuLaunchKernel", NULL, CUresult,                                                         \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,      \
       unsigned shared, CUstream s, void **params, void **extra))                                       \
    X(occupancy, "cuOccupancyMaxActiveBlocksPerMultiprocessor", NULL, CUresult,                         \
      (int *blocks, CUfunction f, int block_size, size_t dynamic_shared))                               \
    X(capture_begin, "cuStreamBeginCapture_v2", NULL, CUresult, (CUstream s, int mode))                 \
    X(capture_end, "cuStreamEndCapture", NULL, CUresult, (CUstream s, CUgraph * g))                     \
    X(graph_instantiate, "cuGraphInstantiateWithFlags", NULL, CUresult,                                 \
      (CUgraphExec * e, CUgraph g, unsigned long long flags))                                           \
    X(graph_launch, "cuGraphLaunch", NULL, CUresult, (CUgraphExec e, CUstream s))                       \
    X(graph_exec_destroy, "cuGraphExecDestroy", NULL, CUresult, (CUgraphExec e))                        \
    X(graph_destroy, "cuGraphDestroy", NULL, CUresult, (CUgraph g))                                     \
    X(event_create, "cuEventCreate", NULL, CUresult, (CUevent * e, unsigned flags))                     \
    X(event_record, "cuEventRecord", NULL, CUresult, (CUevent e, CUstream s))                           \
    X(event_sync, "cuEventSynchronize", NULL, CUresult, (CUevent e))                                    \
    X(event_elapsed, "cuEventElapsedTime_v2", "cuEventElapsedTime", CUresult, (float *ms, CUevent a, CUevent b)) \
    X(event_destroy, "cuEventDestroy_v2", NULL, CUresult, (CUevent e))                                  \
    X(stream_wait_event, "cuStreamWaitEvent", NULL, CUresult, (CUstream s, CUevent e, unsigned flags))  \
    X(error_name, "cuGetErrorName", NULL, CUresult, (CUresult r, const char **s))                       \
    X(error_string, "cuGetErrorString", NULL, CUresult, (CUresult r, const char **s))

/* Entry points kiln uses only where the driver has them (NULL otherwise): dynamic shared memory
 * above 48 KB and TMA tensor maps (CUDA 12.0+), needed by the sm_90a GEMM only. */
#define KILN_CUDA_OPTIONAL_ENTRY_POINTS(X)                                                              \
    X(func_set_attr, "cuFuncSetAttribute", NULL, CUresult, (CUfunction f, int attr, int value))         \
    X(tmap_encode, "cuTensorMapEncodeTiled", NULL, CUresult,                                            \
      (void *map, int dtype, unsigned rank, void *addr, const unsigned long long *dims,                 \
       const unsigned long long *strides, const unsigned *box, const unsigned *elem_strides, int interleave, \
       int swizzle, int l2promo, int oob))

#define KILN_CUDA_FIELD(field, sym, alt, ret, params) ret(*field) params;
typedef struct kiln_cuda_driver {
    void *lib; /* dlopen handle of libcuda.so.1 */
    KILN_CUDA_ENTRY_POINTS(KILN_CUDA_FIELD)
    /* optional (CUDA 12.0+): NULL when the driver lacks it; programmatic dependent launch needs it */
    CUresult (*launch_ex)(const kiln_cu_launch_config *cfg, CUfunction f, void **params, void **extra);
    KILN_CUDA_OPTIONAL_ENTRY_POINTS(KILN_CUDA_FIELD)
} kiln_cuda_driver;
#undef KILN_CUDA_FIELD

/* ------------------------------------------------------------------ state */

/* A device allocation, live or cached for reuse (size already rounded to 256 bytes). */
typedef struct kiln_cuda_block {
    CUdeviceptr ptr;   /* device address */
    size_t      bytes; /* rounded size */
    bool        live;  /* handed out (else in the cache) */
} kiln_cuda_block;

typedef struct kiln_cuda {
    kiln_cuda_driver d;          /* driver entry points */
    CUdevice         dev;        /* the device */
    CUcontext        ctx;        /* its primary context (retained) */
    CUstream         stream;     /* the one queue every launch and copy goes to */
    int              sm;         /* compute capability, major * 10 + minor */
    int              ptx_sm;     /* target of printed PTX: min(sm, 90) (the driver JITs forward) */
    int              n_sm;       /* multiprocessors */
    kiln_lower_target target;    /* what the lowering knows of this device (set at probe) */
    kiln_lower_memo  memo;       /* what supports() lowered and printed, for compile() (codegen/lower_memo.h) */
    kiln_codegen_options cg;     /* options of the compile or load in progress (set at its start,
                                    under the context's device lock) */
    int              clock_khz;  /* SM clock, 0 when unknown */
    int              mem_khz;    /* memory clock, 0 when unknown */
    int              bus_bits;   /* memory bus width, 0 when unknown */
    size_t           mem_total;  /* device memory bytes */
    char             name[128];  /* device name */
    bool             dead;       /* a sticky error happened: every call fails fast */
    char             dead_why[512]; /* that error */
    bool             capturing;  /* between record_begin and record_end */
    kiln_cuda_block *blocks;     /* every allocation (live and cached) */
    size_t           n_blocks;   /* used */
    size_t           cap_blocks; /* allocated */
    size_t           cached;     /* bytes held in the cache */
    CUevent         *timers;     /* timer slots (created on first mark) */
    int              n_timers;   /* slots allocated */
    bool             pdl_off;    /* programmatic dependent launch unusable here (no cuLaunchKernelEx, a
                                    driver before 12.3, or the driver refused it once): plain launches */
    bool             pdl_said;   /* that was reported (once per backend) */
    int              pdl_captured; /* programmatic launches in the recording being captured */
    CUevent          join[2];    /* kiln_run_async: [0] marks the caller's stream, [1] kiln's (created on first use) */
    CUstream         side;       /* a region's side kernels (kiln_kir.side) run here beside its others, forked from
                                    and joined back into stream by events (created on first use) */
    CUevent          side_ev[2]; /* [0] the fork (recorded on stream), [1] the join (recorded on side) */
} kiln_cuda;

/* ------------------------------------------------------------------ coll.c (backend.h coll_*) */

bool        kiln_cuda_coll_probe(void *state, int *n_devices, char *detail, size_t n);
kiln_status kiln_cuda_coll_init(void *const *states, const int *devs, int n, void **comm, char *err, size_t n_err);
kiln_status kiln_cuda_all_reduce(void *comm, void *const *states, void *const *x, void *const *y, size_t count, char *err,
                                 size_t n_err);
kiln_status kiln_cuda_all_gather(void *comm, void *const *states, void *const *x, void *const *y, size_t count, char *err,
                                 size_t n_err);
void        kiln_cuda_coll_free(void *comm);

/* ------------------------------------------------------------------ driver.c */

/* Loads libcuda ($KILN_LIBCUDA, else libcuda.so.1) and resolves every entry point. On failure
 * returns false with why in msg ("libcuda.so.1 not found (no NVIDIA driver)"). */
bool kiln_cuda_load(kiln_cuda_driver *d, char *msg, size_t n);
void kiln_cuda_unload(kiln_cuda_driver *d);
/* Translates a failed call: err = "<what>: <name>: <text>"; a sticky error (illegal address,
 * launch failure, ...) marks the backend dead. Returns KILN_ERR_NOMEM for out of memory, else
 * KILN_ERR_BACKEND. r must not be success. */
kiln_status kiln_cuda_fail(kiln_cuda *c, CUresult r, const char *what, char *err, size_t n);
/* Whether r is an error after which the context is unusable (illegal address, launch failure...). */
bool        kiln_cuda_sticky(CUresult r);
/* Makes the context current; fails fast (KILN_ERR_BACKEND, the first error in err) when dead. */
kiln_status kiln_cuda_enter(kiln_cuda *c, char *err, size_t n);

/* ------------------------------------------------------------------ mem.c */

kiln_status kiln_cuda_alloc(kiln_cuda *c, size_t bytes, CUdeviceptr *out, char *err, size_t n);
void        kiln_cuda_free(kiln_cuda *c, CUdeviceptr p);
/* Returns every cached (freed) block to the driver. */
void        kiln_cuda_pool_trim(kiln_cuda *c);
/* Frees every block (live ones too): at release. */
void        kiln_cuda_pool_destroy(kiln_cuda *c);

/* ------------------------------------------------------------------ module.c */

/* Loads PTX text and finds entry `name`; the JIT log goes into err on failure. spills (may be
 * NULL) gets the spill bytes the JIT reported, -1 when its log does not say. */
kiln_status kiln_cuda_load_ptx(kiln_cuda *c, const char *ptx, const char *name, CUmodule *mod, CUfunction *fn,
                               int *spills, char *err, size_t n);

/* ------------------------------------------------------------------ launch.c */

/* Enqueues fn on the backend's stream: with pdl (a kernel lowered for programmatic dependent
 * launch, kiln_kir.pdl) through cuLaunchKernelEx with programmatic stream serialization where the
 * driver takes it, else (and after any refusal, said once on stderr) with cuLaunchKernel. */
CUresult kiln_cuda_launch_fn(kiln_cuda *c, CUstream st, CUfunction fn, const uint32_t grid[3], uint32_t block, uint32_t shared, void **args,
                             bool pdl);
/* Whether launches of pdl kernels use the attribute now (the driver can; nothing refused it yet). */
bool     kiln_cuda_pdl_usable(kiln_cuda *c);
/* After a failed capture that held programmatic launches: they are off from now on (said once). */
void     kiln_cuda_pdl_refused(kiln_cuda *c, CUresult r, const char *what);

/* ------------------------------------------------------------------ calib.c */

void        kiln_cuda_profile_defaults(const kiln_cuda *c, kiln_device_profile *out);
kiln_status kiln_cuda_measure(kiln_cuda *c, kiln_device_profile *out, char *err, size_t n);

/* Calls a driver entry point; on failure translates the result and returns the status. */
#define KILN_CUDA_TRY(c, call, what, err, n)                                  \
    do {                                                                      \
        CUresult r_ = (c)->d.call;                                            \
        if (r_ != KILN_CU_SUCCESS) return kiln_cuda_fail((c), r_, (what), (err), (n)); \
    } while (0)

/* ------------------------------------------------------------------ kernels (module.c) */

#include "sched/backend.h"

bool        kiln_cuda_supports(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                               char *why, size_t n_why);
kiln_status kiln_cuda_compile(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                              kiln_kernel **out, char *err, size_t n);
void        kiln_cuda_kernel_free(void *state, kiln_kernel *k);
/* Cache entries (module.c): the device and driver a cubin is for; a compiled kernel's metadata,
 * PTX and cubin; a kernel rebuilt from them by loading the cubin (no PTX printing, no JIT). */
void        kiln_cuda_identity(void *state, char *buf, size_t n);
kiln_status kiln_cuda_kernel_save(void *state, const kiln_kernel *k, void **out, size_t *len);
kiln_status kiln_cuda_kernel_load(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                                  const void *buf, size_t len, kiln_kernel **out, char *err, size_t n);
/* Bit i set when region kernel i runs at v's sizes (its row guard passes); launches skip the others. */
uint64_t kiln_cuda_active(void *state, const kiln_kernel *k, const kiln_exec_view *v);
kiln_status kiln_cuda_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                             char *err, size_t n);
