/* The Vulkan backend of a build without the Vulkan loader or glslang: its probe says what is
 * missing, so `kiln info` tells the truth. Must not reference any Vulkan or glslang symbol. */
#include "sched/backend.h"
#include "sched/ctx.h"

#include <stdio.h>

#ifndef KILN_NO_VULKAN_WHY
#define KILN_NO_VULKAN_WHY "built without Vulkan"
#endif

static kiln_status vk_absent_probe(kiln_ctx *ctx, void **state, char *detail, size_t n)
{
    (void)ctx;
    *state = NULL;
    snprintf(detail, n, "%s", KILN_NO_VULKAN_WHY);
    return KILN_ERR_UNSUPPORTED;
}

static void vk_absent_release(void *state) { (void)state; }

static kiln_status vk_absent_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                                    char *err, size_t n_err)
{
    snprintf(err, n_err, "vulkan: %s", KILN_NO_VULKAN_WHY);
    return KILN_ERR_UNSUPPORTED;
}

const kiln_backend_i kiln_backend_vulkan = {
    .name = "vulkan", .probe = vk_absent_probe, .release = vk_absent_release, .launch = vk_absent_launch,
};

KILN_API kiln_status kiln_ctx_vulkan(kiln_ctx *ctx, kiln_vk_device *out)
{
    if (out) *out = (kiln_vk_device){0};
    return ctx ? kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "kiln_ctx_vulkan: %s", KILN_NO_VULKAN_WHY) : KILN_ERR_INVALID_ARG;
}

KILN_API kiln_status kiln_vk_buffer_register(kiln_ctx *ctx, uint64_t buffer, uint64_t bytes, void **addr)
{
    (void)buffer, (void)bytes;
    if (addr) *addr = NULL;
    return ctx ? kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "kiln_vk_buffer_register: %s", KILN_NO_VULKAN_WHY) : KILN_ERR_INVALID_ARG;
}

KILN_API kiln_status kiln_vk_buffer_unregister(kiln_ctx *ctx, void *addr)
{
    (void)addr;
    return ctx ? kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "kiln_vk_buffer_unregister: %s", KILN_NO_VULKAN_WHY) : KILN_ERR_INVALID_ARG;
}

KILN_API void kiln_vk_queue_lock(kiln_ctx *ctx, bool lock) { (void)ctx, (void)lock; }
