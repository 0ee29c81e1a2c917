/* The stand-in CUDA driver from a test (fakecuda_use.h). KILN_FAKECUDA, the driver's path, comes
 * from the build (CMakeLists.txt). Must not start a context of its own beyond tu_fakecuda_ctx. */
#include "support/fakecuda_use.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>

fakecuda_log *tu_fakecuda(void)
{
    /* never closed: the log must outlive every context, and kiln's dlopen shares this handle */
    void *h = dlopen(KILN_FAKECUDA, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "%s: %s", KILN_FAKECUDA, dlerror());
    fakecuda_log *l = dlsym(h, "fakecuda");
    cr_assert(l, "%s has no fakecuda log", KILN_FAKECUDA);
    return l;
}

void tu_fakecuda_use(void) { setenv("KILN_LIBCUDA", KILN_FAKECUDA, 1); }

kiln_ctx *tu_fakecuda_ctx(int n_threads)
{
    tu_fakecuda_use();
    kiln_ctx *ctx = NULL;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = n_threads}, &ctx), KILN_OK, "%s",
                 ctx ? kiln_ctx_error(ctx) : "no context");
    return ctx;
}
