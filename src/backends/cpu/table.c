/* The CPU backend's table (owned by the lead; the kernels it calls live beside it). */
#include "sched/backend.h"

#include <stdio.h>

static kiln_status cpu_probe(kiln_ctx *ctx, void **state, char *detail, size_t n)
{
    *state = NULL;
    snprintf(detail, n, "SIMD backend not wired yet");
    return KILN_ERR_UNSUPPORTED;
}

static void cpu_release(void *state) {}

static kiln_status cpu_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                              char *err, size_t n_err)
{
    snprintf(err, n_err, "cpu backend not available");
    return KILN_ERR_UNSUPPORTED;
}

const kiln_backend_i kiln_backend_cpu = {
    .name = "cpu", .probe = cpu_probe, .release = cpu_release, .launch = cpu_launch,
};

KILN_API const char *kiln_cpu_isa(const kiln_ctx *ctx) { return "scalar"; }
