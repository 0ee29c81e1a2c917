/* Kernel launches of the CUDA backend: plain cuLaunchKernel, or, for kernels lowered for
 * programmatic dependent launch (kiln_kir.pdl: each waits for its predecessor with griddepcontrol),
 * cuLaunchKernelEx with programmatic stream serialization, so the next kernel may start while the
 * previous one ends; stream capture keeps it as a programmatic edge of the CUDA graph (driver 12.3+).
 * Where the driver cannot or will not, launches stay plain (correct: the wait then returns at once)
 * and that is said once per backend on stderr, the only thing this backend prints. */
#include "backends/cuda/cuda.h"

#include <stdio.h>

/* Turns programmatic launches off for this backend and says why, once. */
static void pdl_off(kiln_cuda *c, const char *why)
{
    c->pdl_off = true;
    if (c->pdl_said) return;
    c->pdl_said = true;
    fprintf(stderr, "kiln: warning: cuda: programmatic dependent launch (codegen.pdl, KILN_PDL=1) is off: %s; kernels launch "
                    "plainly (same results; their grid waits return at once)\n", why);
}

bool kiln_cuda_pdl_usable(kiln_cuda *c)
{
    if (c->pdl_off) return false;
    int v = 0;
    char why[160];
    if (!c->d.launch_ex) {
        pdl_off(c, "the driver has no cuLaunchKernelEx");
        return false;
    }
    if (c->d.driver_version(&v) != KILN_CU_SUCCESS || v < KILN_CU_PDL_DRIVER) {
        snprintf(why, sizeof why, "driver API %d.%d captures programmatic launches into CUDA graphs only from 12.3", v / 1000,
                 v % 1000 / 10);
        pdl_off(c, why);
        return false;
    }
    return true;
}

void kiln_cuda_pdl_refused(kiln_cuda *c, CUresult r, const char *what)
{
    const char *name = NULL;
    if (c->d.error_name) c->d.error_name(r, &name);
    char why[200];
    snprintf(why, sizeof why, "%s refused it (%s)", what, name ? name : "unknown CUresult");
    pdl_off(c, why);
}

CUresult kiln_cuda_launch_fn(kiln_cuda *c, CUstream st, CUfunction fn, const uint32_t grid[3], uint32_t block, uint32_t shared, void **args,
                             bool pdl)
{
    if (pdl && kiln_cuda_pdl_usable(c)) {
        kiln_cu_launch_attr attr = {.id = KILN_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
        attr.val.value = 1;
        kiln_cu_launch_config cfg = {.grid = {grid[0], grid[1], grid[2]}, .block = {block, 1, 1}, .shared = shared, .stream = st,
                                     .attrs = &attr, .n_attrs = 1};
        CUresult r = c->d.launch_ex(&cfg, fn, args, NULL);
        if (r == KILN_CU_SUCCESS) {
            c->pdl_captured += c->capturing;
            return r;
        }
        if (kiln_cuda_sticky(r)) return r; /* the context is gone: no launch would do */
        kiln_cuda_pdl_refused(c, r, "cuLaunchKernelEx with programmatic stream serialization");
    }
    return c->d.launch(fn, grid[0], grid[1], grid[2], block, 1, 1, shared, st, args, NULL);
}
