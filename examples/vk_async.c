/* Example: how an engine that drives its own Vulkan work hands kiln its steps. It shares kiln's
 * device (kiln_ctx_vulkan), keeps its activations in its own VkBuffers (registered with
 * kiln_vk_buffer_register and bound as device memory, so no step copies through the host), and
 * orders each step with two timeline semaphores: `ready` (the engine says step n's input is in
 * place: here from the host, after kiln_run_async has returned) and `done` (kiln says step n's
 * output is in place). The host never waits inside kiln: it waits on `done` like on any of its own
 * work. Each step's output is checked against kiln_run of the same plan. Usage: example_vk_async
 * (skips, exit 0, without a Vulkan device). Uses kiln/kiln.h and vulkan.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#ifdef KILN_HAVE_VULKAN
#include <vulkan/vulkan.h>

enum { ROWS = 4, D = 256, STEPS = 8 };

static VkSemaphore timeline(VkDevice d)
{
    VkSemaphoreTypeCreateInfo t = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO, .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE};
    VkSemaphoreCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, .pNext = &t};
    VkSemaphore s = VK_NULL_HANDLE;
    return vkCreateSemaphore(d, &ci, NULL, &s) == VK_SUCCESS ? s : VK_NULL_HANDLE;
}

/* A host-visible buffer of the engine's, mapped (a real engine's would be device-local, filled by its
 * own shaders). */
typedef struct ebuf {
    VkBuffer       buf;
    VkDeviceMemory mem;
    float         *map;
} ebuf;

static int ebuf_new(const kiln_vk_device *k, VkDeviceSize bytes, ebuf *b)
{
    VkDevice d = k->device;
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes,
                             .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT};
    if (vkCreateBuffer(d, &bi, NULL, &b->buf) != VK_SUCCESS) return 1;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d, b->buf, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(k->physical_device, &mp);
    VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t t = 0;
    while (t < mp.memoryTypeCount && !((req.memoryTypeBits >> t & 1) && (mp.memoryTypes[t].propertyFlags & want) == want)) t++;
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = t};
    if (t == mp.memoryTypeCount || vkAllocateMemory(d, &ai, NULL, &b->mem) != VK_SUCCESS) return 1;
    if (vkBindBufferMemory(d, b->buf, b->mem, 0) != VK_SUCCESS) return 1;
    return vkMapMemory(d, b->mem, 0, VK_WHOLE_SIZE, 0, (void **)&b->map) != VK_SUCCESS;
}

static void ebuf_free(VkDevice d, ebuf *b)
{
    vkDestroyBuffer(d, b->buf, NULL);
    vkFreeMemory(d, b->mem, NULL);
}

/* y = silu(rms_norm(x) · Wᵀ), x [ROWS, D]: a small stand-in for a layer. */
static kiln_graph *model(void)
{
    kiln_graph *g;
    if (kiln_graph_new(&g) != KILN_OK) return NULL;
    static float w[D * D], nw[D];
    uint64_t s = 7;
    for (int i = 0; i < D * D; i++) s = s * 6364136223846793005ull + 1442695040888963407ull, w[i] = ((int)(s >> 40) % 2001 - 1000) * 1e-4f;
    for (int i = 0; i < D; i++) nw[i] = 1.0f + (float)(i % 5) * 0.01f;
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){ROWS, D});
    kiln_node n = kiln_rms_norm(g, x, kiln_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){D}, nw, KILN_WEIGHT_BORROW), 1e-6f);
    kiln_output(g, kiln_silu(g, kiln_matmul(g, n, kiln_weight(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){D, D}, w, KILN_WEIGHT_BORROW))), "y");
    return g;
}

int main(void)
{
    kiln_ctx *ctx = NULL;
    kiln_vk_device k;
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    if (kiln_ctx_vulkan(ctx, &k) != KILN_OK || !k.timeline) {
        printf("skipped: %s\n", k.device ? "no timeline semaphores" : kiln_ctx_error(ctx));
        kiln_ctx_free(ctx);
        return 0;
    }
    kiln_graph *g = model();
    kiln_plan *p = NULL;
    kiln_status s = g ? kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p) : KILN_ERR_NOMEM;
    kiln_graph_free(g);
    if (s != KILN_OK) {
        fprintf(stderr, "compile: %s\n", kiln_ctx_error(ctx));
        return 1;
    }
    VkDevice d = k.device;
    const size_t bytes = sizeof(float) * ROWS * D;
    ebuf bx, by;
    void *ax = NULL, *ay = NULL;
    VkSemaphore ready = timeline(d), done = timeline(d);
    int rc = ebuf_new(&k, bytes, &bx) || ebuf_new(&k, bytes, &by) || !ready || !done;
    if (!rc) rc = kiln_vk_buffer_register(ctx, (uint64_t)(uintptr_t)bx.buf, bytes, &ax) != KILN_OK ||
                  kiln_vk_buffer_register(ctx, (uint64_t)(uintptr_t)by.buf, bytes, &ay) != KILN_OK;
    static float x[ROWS * D], want[ROWS * D];
    for (int step = 1; !rc && step <= STEPS; step++) {
        for (int i = 0; i < ROWS * D; i++) x[i] = (float)((i * 37 + step * 11) % 101 - 50) * 0.02f;
        /* the step, queued before its input exists: it starts when `ready` reaches step */
        uint64_t r = (uint64_t)(uintptr_t)ready, rv = (uint64_t)step;
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1, .wait = &r, .wait_value = &rv,
                           .signal = (uint64_t)(uintptr_t)done, .signal_value = (uint64_t)step};
        kiln_binding b[] = {{.name = "x", .data = ax, .bytes = bytes, .device = true},
                            {.name = "y", .data = ay, .bytes = bytes, .device = true}};
        if ((s = kiln_run_async(p, b, 2, &sy)) != KILN_OK) {
            fprintf(stderr, "step %d: %s\n", step, kiln_ctx_error(ctx));
            rc = 1;
            break;
        }
        memcpy(bx.map, x, bytes); /* the engine's input arrives; then it says so */
        VkSemaphoreSignalInfo si = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = ready, .value = (uint64_t)step};
        VkSemaphoreWaitInfo wi = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, .semaphoreCount = 1, .pSemaphores = &done, .pValues = &rv};
        if (vkSignalSemaphore(d, &si) != VK_SUCCESS || vkWaitSemaphores(d, &wi, UINT64_MAX) != VK_SUCCESS) {
            rc = 1;
            break;
        }
        kiln_binding h[] = {{.name = "x", .data = x, .bytes = bytes}, {.name = "y", .data = want, .bytes = bytes}};
        if (kiln_run(p, h, 2) != KILN_OK || memcmp(by.map, want, bytes) != 0) {
            fprintf(stderr, "step %d: the queued step's output differs from kiln_run's\n", step);
            rc = 1;
        }
    }
    if (ax) kiln_vk_buffer_unregister(ctx, ax);
    if (ay) kiln_vk_buffer_unregister(ctx, ay);
    ebuf_free(d, &bx);
    ebuf_free(d, &by);
    vkDestroySemaphore(d, ready, NULL);
    vkDestroySemaphore(d, done, NULL);
    printf("%s\n", rc ? "FAILED" : "ok: 8 steps queued on semaphores, each equal to kiln_run's output");
    kiln_plan_free(p);
    kiln_ctx_free(ctx);
    return rc;
}
#else
int main(void)
{
    printf("skipped: built without Vulkan\n");
    return 0;
}
#endif
