/* The backend interface: one static const table per backend (ref, cpu, cuda, vulkan), the
 * backend's state behind void *. The plan executor drives backends only through this table.
 * Must not contain any backend's code. */
#pragma once

#include "backends/ref/ref.h"
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

typedef struct kiln_backend_i {
    const char *name; /* "ref", "cpu", ... */
    /* Probes the device: on success *state is the backend's state and detail describes the device;
     * on failure detail says why the backend is absent. Required. */
    kiln_status (*probe)(kiln_ctx *ctx, void **state, char *detail, size_t n);
    void (*release)(void *state);                                     /* frees the state; required */
    bool (*supports)(void *state, const kiln_graph *g, const kiln_region *r); /* can run region r */
    void (*profile)(void *state, kiln_device_profile *out);           /* default device profile */
    kiln_status (*calibrate)(void *state, kiln_device_profile *out);  /* measures it (optional) */
    /* Compiles region r into a kernel (optional: NULL means launch works from the region itself). */
    kiln_status (*compile)(void *state, const kiln_graph *g, const kiln_region *r, kiln_kernel **out,
                           char *err, size_t n_err);
    void (*kernel_free)(void *state, kiln_kernel *k);                 /* optional with compile */
    /* Runs region r (with its kernel, or NULL) over host-visible buffers. Required. */
    kiln_status (*launch)(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                          char *err, size_t n_err);
    /* Device memory (optional: NULL for backends that run on host memory). */
    kiln_status (*alloc)(void *state, size_t bytes, void **out);
    void        (*free)(void *state, void *buf);
    kiln_status (*upload)(void *state, void *dst, const void *src, size_t bytes);
    kiln_status (*download)(void *state, void *dst, const void *src, size_t bytes);
    kiln_status (*sync)(void *state);
} kiln_backend_i;

/* The table of every backend kiln knows, indexed by enum kiln_backend_id. */
extern const kiln_backend_i *const kiln_backends[KILN_BACKEND_COUNT];
extern const kiln_backend_i kiln_backend_ref;
extern const kiln_backend_i kiln_backend_cpu;
extern const kiln_backend_i kiln_backend_cuda;
extern const kiln_backend_i kiln_backend_vulkan;
