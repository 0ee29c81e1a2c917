/* The backend interface: one static const table per backend (ref, cpu, cuda, vulkan), the
 * backend's state behind void *. The plan executor drives backends only through this table.
 * Must not contain any backend's code. */
#pragma once

#include "fuse/fuse.h"
#include "kiln/kiln.h"

enum kiln_backend_id {
    KILN_BACKEND_REF = 0, /* reference C, one op at a time: the oracle */
    KILN_BACKEND_CPU,     /* SIMD kernels, thread pool, fused regions */
    KILN_BACKEND_CUDA,    /* PTX through the CUDA Driver API */
    KILN_BACKEND_VULKAN,  /* SPIR-V through Vulkan */
    KILN_BACKEND_COUNT
};
_Static_assert(KILN_BACKEND_COUNT <= KILN_MAX_BACKENDS, "backend table larger than KILN_MAX_BACKENDS");

typedef struct kiln_kernel kiln_kernel; /* a backend's compiled form of one region (opaque) */

/* What a region's kernel sees at run time. bufs[] are addresses in the memory of the backend that
 * runs the region: host pointers for host backends (ref, cpu), device addresses (or the device
 * backend's own handles, as returned by its alloc) for device backends. */
typedef struct kiln_exec_view {
    const kiln_graph *g;                   /* the plan's graph (shape-checked at build) */
    void *const      *bufs;                /* bufs[i]: data of node i (aliases already resolved) */
    const int64_t   (*dims)[KILN_MAX_RANK];/* dims[i]: concrete dims of node i for this run */
    const int64_t    *sym_vals;            /* value of each symbol for this run */
    void             *params;              /* device backends: the per-run parameter buffer
                                              (int32 slot i = symbol i), already written */
} kiln_exec_view;

typedef struct kiln_backend_i {
    const char *name; /* "ref", "cpu", ... */
    /* Probes the device: on success *state is the backend's state and detail describes the device;
     * on failure detail says why the backend is absent. Required. */
    kiln_status (*probe)(kiln_ctx *ctx, void **state, char *detail, size_t n);
    void (*release)(void *state);                                     /* frees the state; required */
    /* Can run region r with the compile's options o (environment defaults filled in); when not, why
     * says why (what the kernel templates lack, a lost device). */
    bool (*supports)(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o, char *why,
                     size_t n_why);
    void (*profile)(void *state, kiln_device_profile *out);           /* default device profile */
    kiln_status (*calibrate)(void *state, kiln_device_profile *out);  /* measures it (optional) */
    /* Compiles region r into a kernel under options o (optional: NULL means launch works from the
     * region itself). */
    kiln_status (*compile)(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                           kiln_kernel **out, char *err, size_t n_err);
    void (*kernel_free)(void *state, kiln_kernel *k);                 /* optional with compile */
    /* Runs region r (with its kernel, or NULL) over buffers in the backend's memory. Device
     * backends only enqueue: the work completes by the next sync. Required. */
    kiln_status (*launch)(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                          char *err, size_t n_err);
    /* Which of kernel k's launches run at v's sizes (optional; bit i: its i-th launch; NULL: all):
     * launch skips the others (a row guard that fails: the prefill GEMM in a decode step, the
     * decode gemv in a prefill). The executor keeps a recording per distinct answer. */
    uint64_t (*active)(void *state, const kiln_kernel *k, const kiln_exec_view *v);
    /* Device memory. All NULL for backends that run on host memory (ref, cpu); all set for device
     * backends. Addresses from alloc may be offset by plain arithmetic inside their allocation.
     * upload/download/copy are ordered with launches (one queue); host memory given to upload
     * and download must stay valid until the next sync. Errors carry the driver's text in err. */
    kiln_status (*alloc)(void *state, size_t bytes, void **out, char *err, size_t n_err);
    /* Device memory (optional with alloc): bytes free now and in all, for the plan's size check
     * before any allocation (sched/exec.c); false when the device does not say. */
    bool        (*mem_info)(void *state, uint64_t *free_bytes, uint64_t *total_bytes);
    void        (*free)(void *state, void *buf);
    kiln_status (*upload)(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n_err);
    kiln_status (*download)(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n_err);
    kiln_status (*copy)(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n_err);
    kiln_status (*sync)(void *state, char *err, size_t n_err);
    /* Recording (optional): between record_begin and record_end, launches are captured, not run;
     * replay runs the recording (ordered like a launch). The executor records a plan's launches
     * once and replays them every run; addresses and grids are fixed, per-run values come from
     * the parameter buffer. */
    kiln_status (*record_begin)(void *state, char *err, size_t n_err);
    kiln_status (*record_end)(void *state, void **rec, char *err, size_t n_err);
    kiln_status (*replay)(void *state, void *rec, char *err, size_t n_err);
    void        (*record_free)(void *state, void *rec);
    /* Per-kernel timing (optional): elapsed seconds of the launches between the last two
     * timer marks, measured on the device. */
    kiln_status (*timer_mark)(void *state, int slot, char *err, size_t n_err);
    kiln_status (*timer_read)(void *state, int slot_a, int slot_b, double *seconds, char *err, size_t n_err);
    /* A caller's queue (optional, both or none; kiln_run_async): join_wait makes the backend's queue
     * wait for the work enqueued on the caller's queue q (a CUstream) so far; join_signal makes q
     * wait for the work enqueued on the backend's queue so far. Neither blocks the host. join_wait
     * may refuse (a bad q, KILN_ERR_BUSY) before anything is enqueued. */
    kiln_status (*join_wait)(void *state, void *q, char *err, size_t n_err);
    kiln_status (*join_signal)(void *state, void *q, const void *owner, char *err, size_t n_err);
    /* q is a kiln_vk_sync (semaphores), not a stream: a NULL q runs the step as kiln_run does;
     * host-bound outputs of an async step are written when it retires (a later sync), not before
     * kiln_run_async returns; a plan mixing host kernels with this backend's joins q too, running
     * synchronously (join_wait before it, join_signal after, then a sync). */
    bool join_semaphores;
    /* With join_semaphores (optional): waits until the steps join_signal submitted for owner (a plan)
     * are done, and those queued before the last of them (one queue, in order), delivering their
     * host-bound outputs; steps queued after it (another plan's, perhaps still gated) are not waited
     * for. NULL: kiln_plan_wait syncs the whole queue. */
    kiln_status (*wait_steps)(void *state, const void *owner, char *err, size_t n_err);
    /* Host-visible staging memory the backend holds now, in bytes (optional; kiln_plan_stats). */
    uint64_t (*staging_bytes)(void *state);
    /* Kernel cache (optional, all three or none): identity writes what a compiled kernel depends
     * on besides the region (device name and capability, driver version, ISA) into buf; save
     * serializes a compiled kernel (*out malloc'ed); load rebuilds one from such bytes, already
     * checksummed, for region r of g. load fails on anything inconsistent (the caller compiles
     * instead) and must never trust a count or offset it has not checked against len. */
    void        (*identity)(void *state, char *buf, size_t n);
    kiln_status (*kernel_save)(void *state, const kiln_kernel *k, void **out, size_t *len);
    kiln_status (*kernel_load)(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                               const void *buf, size_t len, kiln_kernel **out, char *err, size_t n_err);
    /* Device layout of weights (optional, both or none; NULL: the host bytes as they are).
     * weight_bytes: bytes a [rows, k] weight of dtype t takes in the backend's memory, 0 when that
     * is the host layout; weight_repack writes those bytes from the host's (dst holds them). */
    size_t (*weight_bytes)(void *state, kiln_dtype t, int64_t rows, int64_t k);
    void   (*weight_repack)(void *state, kiln_dtype t, int64_t rows, int64_t k, const void *src, void *dst);
    /* Collectives over distinct devices, each driven by a state of this backend (optional, all four
     * or none; split plans, sched/group.c). coll_probe: how many devices a split can use and through
     * what (detail "NCCL 2.21.5 from PATH"), or false and why not. coll_init: a communicator for the
     * devices of states[0..n) (their ordinals devs[]). all_reduce: enqueues y[i] = sum over j of x[j]
     * (count f32 values) on every state's queue as one group, ordered after what each queue holds.
     * coll_free: frees the communicators (the queues idle). */
    bool        (*coll_probe)(void *state, int *n_devices, char *detail, size_t n);
    kiln_status (*coll_init)(void *const *states, const int *devs, int n, void **comm, char *err, size_t n_err);
    kiln_status (*all_reduce)(void *comm, void *const *states, void *const *x, void *const *y, size_t count, char *err,
                              size_t n_err);
    /* all_gather (with the four): enqueues y[i][j * count ..] = x[j] (count f32 values) likewise. */
    kiln_status (*all_gather)(void *comm, void *const *states, void *const *x, void *const *y, size_t count, char *err,
                              size_t n_err);
    void        (*coll_free)(void *comm);
} kiln_backend_i;

/* The per-run parameter buffer of device backends: int32 slot i holds symbol i's value; at least
 * this many slots (kernels may read a slot of a symbol the graph lacks as 0). */
#define KILN_PARAM_SLOTS_MIN 8

/* A device backend runs on its own memory (alloc is set). */
static inline bool kiln_backend_is_device(const kiln_backend_i *b) { return b->alloc != NULL; }

/* The table of every backend kiln knows, indexed by enum kiln_backend_id (backends/registry.c). */
extern const kiln_backend_i *const kiln_backends[KILN_BACKEND_COUNT];
extern const kiln_backend_i kiln_backend_ref;
extern const kiln_backend_i kiln_backend_cpu;
extern const kiln_backend_i kiln_backend_cuda;
extern const kiln_backend_i kiln_backend_vulkan;
