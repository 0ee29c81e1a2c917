/* The backend registry and the backends that are not built yet (vulkan): their probes say what
 * was found and why they cannot run, so `kiln info` tells the truth. */
#include "sched/backend.h"

#include <stdio.h>

const kiln_backend_i *const kiln_backends[KILN_BACKEND_COUNT] = {
    [KILN_BACKEND_REF] = &kiln_backend_ref,
    [KILN_BACKEND_CPU] = &kiln_backend_cpu,
    [KILN_BACKEND_CUDA] = &kiln_backend_cuda,
    [KILN_BACKEND_VULKAN] = &kiln_backend_vulkan,
};

static kiln_status vulkan_probe(kiln_ctx *ctx, void **state, char *detail, size_t n)
{
    *state = NULL;
    snprintf(detail, n, "the Vulkan (SPIR-V) backend is not built yet");
    return KILN_ERR_UNSUPPORTED;
}

static void absent_release(void *state) {}

static kiln_status absent_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                                 char *err, size_t n_err)
{
    snprintf(err, n_err, "backend not available");
    return KILN_ERR_UNSUPPORTED;
}

const kiln_backend_i kiln_backend_vulkan = {
    .name = "vulkan", .probe = vulkan_probe, .release = absent_release, .launch = absent_launch,
};
