/* Faults of the Vulkan backend through the public API (lavapipe in CI): device out of memory
 * (a real one: a weight larger than any allocation), a GLSL compile failure (glslang's log in the
 * message), a lost device (also with kiln_run_async steps queued), a device without timeline
 * semaphores, and a missing driver (by injection where a fault cannot be caused on
 * demand: KILN_FAULT_INJECT, src/util/fault.h). Each returns a clear error and leaves the context
 * usable: a cpu plan in the same context still computes the right result, and, where the fault
 * passes, vulkan too. The cuda counterparts are in test_cuda_backend (a stand-in driver). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kiln/kiln.h"
#include "support/testutil.h"

enum { D = 64 };

static kiln_ctx *context(bool need_vulkan)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_backend_info bi;
    for (int i = 0; need_vulkan && i < kiln_backend_count(ctx); i++)
        if (kiln_backend_get(ctx, i, &bi) == KILN_OK && !strcmp(bi.name, "vulkan") && !bi.available) {
            kiln_ctx_free(ctx);
            cr_skip("no Vulkan device: %s", bi.detail);
        }
    return ctx;
}

/* y = silu(x) * 2 over [D]: compiles quickly anywhere. */
static kiln_graph *small_graph(void)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){D});
    cr_assert_eq(kiln_output(g, kiln_scale(g, kiln_silu(g, x), 2.0f), "y"), KILN_OK, "%s", kiln_graph_error(g));
    return g;
}

/* Compiles small_graph on backend and checks one run against the f64 formula. */
static void still_works(kiln_ctx *ctx, const char *backend)
{
    kiln_graph *g = small_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = backend}, &p), KILN_OK, "%s after the fault: %s",
                 backend, kiln_ctx_error(ctx));
    float x[D], y[D];
    double ref[D], got[D];
    tu_fill(x, D, -4, 4);
    tu_poison(y, sizeof y);
    kiln_binding b[] = {{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = y, .bytes = sizeof y}};
    cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s after the fault: %s", backend, kiln_ctx_error(ctx));
    for (int i = 0; i < D; i++) {
        ref[i] = 2.0 * x[i] / (1.0 + exp(-(double)x[i]));
        got[i] = y[i];
    }
    tu_compare("silu * 2 after a fault", got, ref, D, tu_tol("silu", KILN_DTYPE_F32));
    kiln_plan_free(p);
    kiln_graph_free(g);
}

/* A matmul whose f32 weight [2^20, 2^14] is 64 GiB: borrowed from an untouched read-only mapping,
 * so the host spends nothing; refused at compile against the device's memory, before any Vulkan
 * allocation (an allocation that fails: test_vulkan out_of_memory_leaves_it_usable). */
Test(faults, vulkan_out_of_memory)
{
    kiln_ctx *ctx = context(true);
    const size_t rows = (size_t)1 << 20, k = (size_t)1 << 14, bytes = rows * k * 4;
    void *w = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (w == MAP_FAILED) cr_skip("cannot reserve %zu bytes of address space", bytes);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){1, (kiln_dim)k});
    kiln_node wn = kiln_weight(g, "w_huge", KILN_DTYPE_F32, 2, (kiln_dim[]){(kiln_dim)rows, (kiln_dim)k}, w, KILN_WEIGHT_BORROW);
    cr_assert_eq(kiln_output(g, kiln_matmul(g, x, wn), "y"), KILN_OK, "%s", kiln_graph_error(g));
    kiln_plan *p = NULL;
    kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p);
    cr_assert_eq(s, KILN_ERR_NOMEM, "%s: %s", kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert_null(p);
    cr_assert(strstr(kiln_ctx_error(ctx), "the plan needs 64 GiB of vulkan device memory (weights 64 GiB, the largest 'w_huge' 64 GiB") &&
                  strstr(kiln_ctx_error(ctx), "GiB free of "),
              "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    munmap(w, bytes);
    still_works(ctx, "vulkan");
    still_works(ctx, "cpu");
    kiln_ctx_free(ctx);
}

/* Every shader gets a line glslang rejects: compile fails with glslang's log (the line, its text). */
Test(faults, vulkan_glsl_compile_error)
{
    /* no disk entries: still_works saves this graph's kernel, and a second run of the suite over
     * the same folder would load it instead of printing (and faulting) */
    setenv("KILN_CACHE", "off", 1);
    kiln_ctx *ctx = context(true);
    unsetenv("KILN_CACHE");
    kiln_graph *g = small_graph();
    kiln_plan *p = NULL;
    setenv("KILN_FAULT_INJECT", "vk_glsl_error", 1);
    kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p);
    unsetenv("KILN_FAULT_INJECT");
    cr_assert_neq(s, KILN_OK);
    cr_assert_null(p);
    const char *e = kiln_ctx_error(ctx);
    cr_assert(strstr(e, "vulkan: compiling region 0") && strstr(e, "kiln_fault_injected") && strstr(e, "GLSL line "), "%s", e);
    kiln_graph_free(g);
    still_works(ctx, "vulkan");
    still_works(ctx, "cpu");
    kiln_ctx_free(ctx);
}

/* The device is lost at a run: that run and every later vulkan call fail saying so; the cpu
 * backend of the same context goes on. */
Test(faults, vulkan_device_lost)
{
    kiln_ctx *ctx = context(true);
    kiln_graph *g = small_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float x[D] = {1}, y[D];
    kiln_binding b[] = {{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = y, .bytes = sizeof y}};
    cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    setenv("KILN_FAULT_INJECT", "vk_device_lost", 1);
    kiln_status s = kiln_run(p, b, 2);
    unsetenv("KILN_FAULT_INJECT");
    cr_assert_eq(s, KILN_ERR_BACKEND, "%s: %s", kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "VK_ERROR_DEVICE_LOST") && strstr(kiln_ctx_error(ctx), "recreate the context"), "%s",
              kiln_ctx_error(ctx));
    s = kiln_run(p, b, 2); /* the fault is gone, the device is not back */
    cr_assert_eq(s, KILN_ERR_BACKEND, "%s", kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "device is lost"), "%s", kiln_ctx_error(ctx));
    kiln_plan *p2 = NULL;
    cr_assert_neq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p2), KILN_OK);
    cr_assert(strstr(kiln_ctx_error(ctx), "device is lost"), "%s", kiln_ctx_error(ctx));
    still_works(ctx, "cpu");
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx); /* freeing a lost device's plans and context is clean (ASan checks leaks) */
}

/* The device is lost while kiln_run_async steps are queued: the failing step and the wait say so,
 * freeing the plan and the context with steps pending is clean (ASan checks leaks), and the cpu
 * backend goes on. */
Test(faults, vulkan_device_lost_with_async_steps_queued)
{
    kiln_ctx *ctx = context(true);
    kiln_graph *g = small_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float x[D] = {1}, y[3][D];
    kiln_binding b[] = {{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = y[0], .bytes = sizeof y[0]}};
    kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
    for (int i = 0; i < 2; i++) {
        b[1].data = y[i];
        cr_assert_eq(kiln_run_async(p, b, 2, &sy), KILN_OK, "%s", kiln_ctx_error(ctx));
    }
    b[1].data = y[2];
    setenv("KILN_FAULT_INJECT", "vk_device_lost", 1);
    kiln_status s = kiln_run_async(p, b, 2, &sy);
    unsetenv("KILN_FAULT_INJECT");
    cr_assert_eq(s, KILN_ERR_BACKEND, "%s: %s", kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "VK_ERROR_DEVICE_LOST"), "%s", kiln_ctx_error(ctx));
    s = kiln_plan_wait(p);
    cr_assert_eq(s, KILN_ERR_BACKEND, "%s", kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "device is lost"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_run_async(p, b, 2, &sy), KILN_ERR_BACKEND, "%s", kiln_ctx_error(ctx));
    still_works(ctx, "cpu");
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* A device without timeline semaphores: kiln_ctx_vulkan says so, a kiln_vk_sync naming timeline
 * values is refused saying why (nothing run, the plan usable), and steps queued without them are
 * tracked by fences alone and give kiln_run's bits. */
Test(faults, vulkan_without_timeline_semaphores)
{
    setenv("KILN_FAULT_INJECT", "vk_no_timeline", 1);
    kiln_ctx *ctx = context(true);
    unsetenv("KILN_FAULT_INJECT");
    kiln_vk_device dev;
    cr_assert_eq(kiln_ctx_vulkan(ctx, &dev), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(!dev.timeline && dev.device, "the device is made without timeline semaphores");
    kiln_graph *g = small_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float x[D], want[D], y[3][D];
    tu_fill(x, D, -4, 4);
    kiln_binding b[] = {{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = want, .bytes = sizeof want}};
    cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    uint64_t sem = 0x1234, one = 1; /* never used: refused before */
    kiln_vk_sync bad[2] = {{.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1, .wait = &sem, .wait_value = &one},
                           {.magic = KILN_VK_SYNC_MAGIC, .signal = sem, .signal_value = 1}};
    for (int k = 0; k < 2; k++) {
        tu_poison(y[0], sizeof y[0]);
        b[1].data = y[0];
        kiln_status s = kiln_run_async(p, b, 2, &bad[k]);
        cr_assert_eq(s, KILN_ERR_UNSUPPORTED, "%s: %s", kiln_status_str(s), kiln_ctx_error(ctx));
        cr_assert(strstr(kiln_ctx_error(ctx), "has no timeline semaphores"), "%s", kiln_ctx_error(ctx));
    }
    kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
    for (int i = 0; i < 3; i++) {
        tu_poison(y[i], sizeof y[i]);
        b[1].data = y[i];
        cr_assert_eq(kiln_run_async(p, b, 2, &sy), KILN_OK, "%s", kiln_ctx_error(ctx));
    }
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
    for (int i = 0; i < 3; i++) cr_assert(memcmp(y[i], want, sizeof want) == 0, "step %d differs from kiln_run's", i);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* No Vulkan driver (the loader finds no ICD): the backend is absent, says why, asking for it is a
 * clear error, and the context works on cpu. Each Criterion test is its own process, so the
 * environment set here is what the loader sees first. */
Test(faults, vulkan_missing_driver)
{
    setenv("VK_ICD_FILENAMES", "/nonexistent/kiln_no_icd.json", 1);
    setenv("VK_DRIVER_FILES", "/nonexistent/kiln_no_icd.json", 1);
    kiln_ctx *ctx = context(false);
    kiln_backend_info bi = {0};
    for (int i = 0; i < kiln_backend_count(ctx); i++)
        if (kiln_backend_get(ctx, i, &bi) == KILN_OK && !strcmp(bi.name, "vulkan")) break;
    cr_assert(!bi.available && bi.detail && bi.detail[0], "vulkan available without a driver: %s", bi.detail);
    kiln_graph *g = small_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "backend 'vulkan' is not available: ") && strstr(kiln_ctx_error(ctx), bi.detail), "%s",
              kiln_ctx_error(ctx));
    kiln_graph_free(g);
    still_works(ctx, "cpu");
    kiln_ctx_free(ctx);
}
