/* The Vulkan backend's command stream: immediate command buffers (launches, uploads, downloads)
 * submitted at sync or before a replay, recorded command buffers that replay submits, a memory
 * barrier before every command, the fence of sync, and timestamp queries. Must not allocate
 * buffers (vk_memory.c) nor build pipelines (vk_kernel.c). */
#include "backends/vulkan/vk.h"
#include "util/fault.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct vk_recording {
    VkCommandBuffer cb; /* from rec_pool, begun with SIMULTANEOUS_USE */
} vk_recording;

kiln_status kiln_vk_queue_init(kiln_vk *s, char *err, size_t n)
{
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                                  .queueFamilyIndex = s->queue_family};
    VkResult r = vkCreateCommandPool(s->dev, &pi, NULL, &s->pool);
    if (r == VK_SUCCESS) {
        pi.flags = 0;
        r = vkCreateCommandPool(s->dev, &pi, NULL, &s->rec_pool);
    }
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (r == VK_SUCCESS) r = vkCreateFence(s->dev, &fi, NULL, &s->fence);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "creating command pools", err, n);
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(s->phys, &nq, NULL);
    VkQueueFamilyProperties q[16];
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(s->phys, &nq, q);
    if (s->queue_family < nq && q[s->queue_family].timestampValidBits && s->props.limits.timestampPeriod > 0) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                    .queryCount = KILN_VK_TIMERS};
        if (vkCreateQueryPool(s->dev, &qi, NULL, &s->timers) == VK_SUCCESS) s->ts_period_ns = s->props.limits.timestampPeriod;
        else s->timers = VK_NULL_HANDLE;
    }
    return KILN_OK;
}

void kiln_vk_queue_release(kiln_vk *s)
{
    if (s->timers) vkDestroyQueryPool(s->dev, s->timers, NULL);
    if (s->fence) vkDestroyFence(s->dev, s->fence, NULL);
    if (s->rec_pool) vkDestroyCommandPool(s->dev, s->rec_pool, NULL);
    if (s->pool) vkDestroyCommandPool(s->dev, s->pool, NULL);
    free(s->cbs);
}

/* Every write before it (shaders, transfers) is visible to every access after it. Dependent
 * dispatches need it; independent ones pay for it (tracking written ranges is the next step). */
static void barrier(VkCommandBuffer cb, bool to_host)
{
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = to_host ? VK_ACCESS_HOST_READ_BIT
                                                   : VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                                         VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    VkPipelineStageFlags src = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(cb, src, to_host ? VK_PIPELINE_STAGE_HOST_BIT : src, 0, 1, &mb, 0, NULL, 0, NULL);
}

static kiln_status open_immediate(kiln_vk *s, char *err, size_t n)
{
    if (s->used_cbs == s->n_cbs) {
        if (s->n_cbs == s->cap_cbs) {
            uint32_t cap = s->cap_cbs ? 2 * s->cap_cbs : 4;
            VkCommandBuffer *g = realloc(s->cbs, cap * sizeof *g);
            if (!g) {
                snprintf(err, n, "vulkan: out of host memory");
                return KILN_ERR_NOMEM;
            }
            s->cbs = g;
            s->cap_cbs = cap;
        }
        VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->pool,
                                          .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
        VkResult r = vkAllocateCommandBuffers(s->dev, &ai, &s->cbs[s->n_cbs]);
        if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkAllocateCommandBuffers", err, n);
        s->n_cbs++;
    }
    VkCommandBuffer cb = s->cbs[s->used_cbs];
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VkResult r = vkBeginCommandBuffer(cb, &bi);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkBeginCommandBuffer", err, n);
    s->used_cbs++;
    s->cur = (kiln_vk_cmd){.cb = cb, .open = true};
    return KILN_OK;
}

VkCommandBuffer kiln_vk_cmd_next(kiln_vk *s, bool transfer, char *err, size_t n)
{
    if (s->lost) {
        kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "recording a command", err, n);
        return VK_NULL_HANDLE;
    }
    kiln_vk_cmd *c = s->recording && !transfer ? &s->rec : &s->cur;
    if (!c->open && open_immediate(s, err, n) != KILN_OK) return VK_NULL_HANDLE;
    /* the first command of a buffer also waits for earlier submissions: barriers order the whole queue */
    barrier(c->cb, false);
    c->n_cmds++;
    return c->cb;
}

/* Ends the immediate buffer (if open) and submits it, with the fence when given. */
static kiln_status submit_immediate(kiln_vk *s, VkCommandBuffer extra, VkFence fence, char *err, size_t n)
{
    VkCommandBuffer cbs[2];
    uint32_t k = 0;
    if (s->cur.open) {
        barrier(s->cur.cb, true);
        VkResult r = vkEndCommandBuffer(s->cur.cb);
        s->cur = (kiln_vk_cmd){0};
        if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkEndCommandBuffer", err, n);
        cbs[k++] = s->cbs[s->used_cbs - 1];
    }
    if (extra) cbs[k++] = extra;
    if (!k && !fence) return KILN_OK;
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = k, .pCommandBuffers = cbs};
    VkResult r = kiln_fault("vk_device_lost") ? VK_ERROR_DEVICE_LOST /* test-only */
                                              : vkQueueSubmit(s->queue, k ? 1 : 0, k ? &si : NULL, fence);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkQueueSubmit", err, n);
    s->submitted = true;
    return KILN_OK;
}

kiln_status kiln_vk_sync(void *state, char *err, size_t n)
{
    kiln_vk *s = state;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "sync", err, n);
    kiln_status st = KILN_OK;
    if (s->cur.open || s->submitted) {
        st = submit_immediate(s, VK_NULL_HANDLE, s->fence, err, n);
        if (st == KILN_OK) {
            VkResult r = vkWaitForFences(s->dev, 1, &s->fence, VK_TRUE, UINT64_MAX);
            if (r == VK_SUCCESS) r = vkResetFences(s->dev, 1, &s->fence);
            if (r != VK_SUCCESS) st = kiln_vk_fail(s, r, "waiting for the queue", err, n);
        }
    }
    if (st != KILN_OK) { /* the batch is gone: drop what it would have delivered */
        s->n_downloads = 0;
        if (!s->lost) vkQueueWaitIdle(s->queue);
    }
    if (!s->lost) vkResetCommandPool(s->dev, s->pool, 0);
    s->used_cbs = 0;
    s->cur = (kiln_vk_cmd){0};
    s->submitted = false;
    kiln_vk_memory_synced(s);
    return st;
}

kiln_status kiln_vk_record_begin(void *state, char *err, size_t n)
{
    kiln_vk *s = state;
    if (s->recording) {
        snprintf(err, n, "vulkan: record_begin while recording");
        return KILN_ERR_INVALID_ARG;
    }
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "record_begin", err, n);
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->rec_pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    VkResult r = vkAllocateCommandBuffers(s->dev, &ai, &cb);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkAllocateCommandBuffers", err, n);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT};
    r = vkBeginCommandBuffer(cb, &bi);
    if (r != VK_SUCCESS) {
        vkFreeCommandBuffers(s->dev, s->rec_pool, 1, &cb);
        return kiln_vk_fail(s, r, "vkBeginCommandBuffer", err, n);
    }
    s->rec = (kiln_vk_cmd){.cb = cb, .open = true};
    s->recording = true;
    return KILN_OK;
}

kiln_status kiln_vk_record_end(void *state, void **rec, char *err, size_t n)
{
    kiln_vk *s = state;
    *rec = NULL;
    if (!s->recording) {
        snprintf(err, n, "vulkan: record_end without record_begin");
        return KILN_ERR_INVALID_ARG;
    }
    s->recording = false;
    barrier(s->rec.cb, true);
    VkCommandBuffer cb = s->rec.cb;
    VkResult r = vkEndCommandBuffer(cb);
    s->rec = (kiln_vk_cmd){0};
    vk_recording *v = r == VK_SUCCESS ? malloc(sizeof *v) : NULL;
    if (!v) {
        vkFreeCommandBuffers(s->dev, s->rec_pool, 1, &cb);
        if (r == VK_SUCCESS) r = VK_ERROR_OUT_OF_HOST_MEMORY;
        return kiln_vk_fail(s, r, "vkEndCommandBuffer", err, n);
    }
    v->cb = cb;
    *rec = v;
    return KILN_OK;
}

kiln_status kiln_vk_replay(void *state, void *rec, char *err, size_t n)
{
    kiln_vk *s = state;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "replay", err, n);
    if (!rec) {
        snprintf(err, n, "vulkan: replay of no recording");
        return KILN_ERR_INVALID_ARG;
    }
    return submit_immediate(s, ((vk_recording *)rec)->cb, VK_NULL_HANDLE, err, n);
}

void kiln_vk_record_free(void *state, void *rec)
{
    kiln_vk *s = state;
    if (!rec) return;
    if (s->submitted) { /* it may be pending */
        char err[256];
        kiln_vk_sync(s, err, sizeof err);
    }
    vkFreeCommandBuffers(s->dev, s->rec_pool, 1, &((vk_recording *)rec)->cb);
    free(rec);
}

kiln_status kiln_vk_timer_mark(void *state, int slot, char *err, size_t n)
{
    kiln_vk *s = state;
    if (!s->timers) {
        snprintf(err, n, "vulkan: %s has no timestamps on its compute queue", s->props.deviceName);
        return KILN_ERR_UNSUPPORTED;
    }
    if (slot < 0 || slot >= KILN_VK_TIMERS) {
        snprintf(err, n, "vulkan: timer slot %d outside 0..%d", slot, KILN_VK_TIMERS - 1);
        return KILN_ERR_INVALID_ARG;
    }
    VkCommandBuffer cb = kiln_vk_cmd_next(s, false, err, n);
    if (!cb) return KILN_ERR_BACKEND;
    vkCmdResetQueryPool(cb, s->timers, (uint32_t)slot, 1);
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, s->timers, (uint32_t)slot);
    return KILN_OK;
}

kiln_status kiln_vk_timer_read(void *state, int a, int b, double *seconds, char *err, size_t n)
{
    kiln_vk *s = state;
    *seconds = 0;
    if (!s->timers || a < 0 || b < 0 || a >= KILN_VK_TIMERS || b >= KILN_VK_TIMERS) {
        snprintf(err, n, "vulkan: no timer slots %d, %d", a, b);
        return s->timers ? KILN_ERR_INVALID_ARG : KILN_ERR_UNSUPPORTED;
    }
    uint64_t t[2];
    VkResult r = vkGetQueryPoolResults(s->dev, s->timers, (uint32_t)a, 1, 8, &t[0], 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (r == VK_SUCCESS)
        r = vkGetQueryPoolResults(s->dev, s->timers, (uint32_t)b, 1, 8, &t[1], 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "reading timestamps", err, n);
    *seconds = (double)(int64_t)(t[1] - t[0]) * s->ts_period_ns * 1e-9;
    return KILN_OK;
}
