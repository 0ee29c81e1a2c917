/* Loading the CUDA driver at run time (dlopen of libcuda.so.1, every entry point by its versioned
 * name) and translating its results once, at this boundary: the driver's error name and text, out
 * of memory as KILN_ERR_NOMEM, sticky errors marking the backend dead. Must not be linked against
 * libcuda: a build without the NVIDIA driver or toolkit must run everywhere. */
#include "util/env.h"
#include "backends/cuda/cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kiln_cuda_load(kiln_cuda_driver *d, char *msg, size_t n)
{
    memset(d, 0, sizeof *d);
    const char *path = kiln_env(KILN_ENV_LIBCUDA);
    if (!path) path = "libcuda.so.1";
    d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!d->lib) {
        if (!strcmp(path, "libcuda.so.1")) snprintf(msg, n, "libcuda.so.1 not found (no NVIDIA driver)");
        else snprintf(msg, n, "%s could not be loaded: %s", path, dlerror());
        return false;
    }
    void *fn;
#define KILN_CUDA_RESOLVE(field, sym, alt, ret, params)                                         \
    fn = dlsym(d->lib, sym);                                                                    \
    if (!fn && alt) fn = dlsym(d->lib, alt ? alt : sym);                                        \
    if (!fn) {                                                                                  \
        snprintf(msg, n, "%s has no %s: the NVIDIA driver is too old (kiln needs driver 525 or newer)", path, sym); \
        kiln_cuda_unload(d);                                                                    \
        return false;                                                                           \
    }                                                                                           \
    memcpy(&d->field, &fn, sizeof fn);
    KILN_CUDA_ENTRY_POINTS(KILN_CUDA_RESOLVE)
#undef KILN_CUDA_RESOLVE
    fn = dlsym(d->lib, "cuLaunchKernelEx"); /* optional: programmatic dependent launch */
    memcpy(&d->launch_ex, &fn, sizeof fn);
#define KILN_CUDA_OPTIONAL(field, sym, alt, ret, params) \
    fn = dlsym(d->lib, sym);                             \
    memcpy(&d->field, &fn, sizeof fn);
    KILN_CUDA_OPTIONAL_ENTRY_POINTS(KILN_CUDA_OPTIONAL)
#undef KILN_CUDA_OPTIONAL
    return true;
}

void kiln_cuda_unload(kiln_cuda_driver *d)
{
    if (d->lib) dlclose(d->lib);
    memset(d, 0, sizeof *d);
}

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory" for r (the driver's name and text). */
static void error_text(const kiln_cuda_driver *d, CUresult r, char *buf, size_t n)
{
    const char *name = NULL, *text = NULL;
    if (d->error_name) d->error_name(r, &name);
    if (d->error_string) d->error_string(r, &text);
    if (name) snprintf(buf, n, "%s: %s", name, text ? text : "(no description)");
    else snprintf(buf, n, "CUresult %d (unknown to the driver)", r);
}

/* Errors after which the context is unusable until the process exits. */
bool kiln_cuda_sticky(CUresult r)
{
    return r == KILN_CU_ERROR_ILLEGAL_ADDRESS || r == KILN_CU_ERROR_LAUNCH_TIMEOUT ||
           (r >= KILN_CU_ERROR_HARDWARE_STACK_ERROR && r <= KILN_CU_ERROR_LAUNCH_FAILED);
}

kiln_status kiln_cuda_fail(kiln_cuda *c, CUresult r, const char *what, char *err, size_t n)
{
    char text[256];
    error_text(&c->d, r, text, sizeof text);
    if (kiln_cuda_sticky(r) && !c->dead) {
        c->dead = true;
        snprintf(c->dead_why, sizeof c->dead_why, "%s: %s", what, text);
    }
    if (r == KILN_CU_ERROR_OUT_OF_MEMORY) {
        size_t free_b = 0, total = 0;
        if (c->d.mem_info && c->d.mem_info(&free_b, &total) == KILN_CU_SUCCESS)
            snprintf(err, n, "%s: %s (device has %.1f of %.1f MiB free)", what, text, free_b / 1048576.0, total / 1048576.0);
        else snprintf(err, n, "%s: %s", what, text);
        return KILN_ERR_NOMEM;
    }
    snprintf(err, n, "%s: %s%s", what, text, c->dead ? " (the CUDA context is now unusable)" : "");
    return KILN_ERR_BACKEND;
}

kiln_status kiln_cuda_enter(kiln_cuda *c, char *err, size_t n)
{
    if (c->dead) {
        snprintf(err, n, "the CUDA backend stopped after an earlier error (%s); the device needs a new process", c->dead_why);
        return KILN_ERR_BACKEND;
    }
    KILN_CUDA_TRY(c, ctx_set_current(c->ctx), "cuCtxSetCurrent", err, n);
    return KILN_OK;
}
