/* The reference backend's table: every region runs its nodes one at a time through
 * kiln_ref_exec. It supports everything; it is slow on purpose. */
#include "backends/ref/ref.h"
#include "sched/backend.h"

#include <stdio.h>

static kiln_status ref_probe(kiln_ctx *ctx, void **state, char *detail, size_t n)
{
    *state = NULL;
    snprintf(detail, n, "portable C reference, one op at a time, f32 accumulation");
    return KILN_OK;
}

static void ref_release(void *state) {}

static bool ref_supports(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o, char *why,
                         size_t n_why)
{
    return true;
}

static void ref_profile(void *state, kiln_device_profile *out)
{
    *out = (kiln_device_profile){.mem_bw = 2e9, .launch_s = 1e-7};
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) out->peak_flops[t] = 1e9;
}

static kiln_status ref_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                              char *err, size_t n_err)
{
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        kiln_status s = kiln_ref_exec(v, r->nodes[i], err, n_err);
        if (s != KILN_OK) return s;
    }
    return KILN_OK;
}

const kiln_backend_i kiln_backend_ref = {
    .name = "ref",
    .probe = ref_probe,
    .release = ref_release,
    .supports = ref_supports,
    .profile = ref_profile,
    .launch = ref_launch,
};
