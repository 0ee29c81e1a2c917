/* The Vulkan backend's command stream: immediate command buffers (launches, uploads, downloads)
 * submitted at sync or before a replay, recorded command buffers that replay submits, a memory
 * barrier before every command, the fence of sync, timestamp queries, and kiln_run_async's steps
 * (submitted with the caller's semaphores and a fence each, retired when done). Must not allocate
 * buffers (vk_memory.c, but for the 4-byte gate of a step's wait semaphores) nor build pipelines
 * (vk_kernel.c). */
#include "backends/vulkan/vk.h"
#include "util/fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void drop_pending(kiln_vk *s);

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
    drop_pending(s); /* the device is idle */
    for (uint32_t i = 0; i < s->n_spare_fence; i++) vkDestroyFence(s->dev, s->spare_fence[i], NULL);
    s->n_spare_fence = 0;
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

/* Semaphores of a submission (kiln_run_async's joins). */
typedef struct vk_sems {
    uint32_t           n_wait;     /* wait semaphores */
    const VkSemaphore *wait;       /* them */
    const uint64_t    *wait_value; /* timeline values (0: binary), NULL: all binary */
    VkSemaphore        signal;     /* or VK_NULL_HANDLE */
    uint64_t           signal_value; /* timeline value, 0: binary */
} vk_sems;

/* Ends the immediate buffer (if open) and submits it, with the fence and semaphores when given. */
static kiln_status submit_immediate(kiln_vk *s, VkCommandBuffer extra, VkFence fence, const vk_sems *sem, char *err, size_t n)
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
    if (!k && !fence && !sem) return KILN_OK;
    VkPipelineStageFlags stages[KILN_VK_SYNC_MAX_WAIT];
    uint64_t zero[KILN_VK_SYNC_MAX_WAIT] = {0};
    uint32_t nw = sem ? sem->n_wait : 0;
    for (uint32_t i = 0; i < nw; i++) stages[i] = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    VkTimelineSemaphoreSubmitInfo tl = {.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                        .waitSemaphoreValueCount = nw, .pWaitSemaphoreValues = sem && sem->wait_value ? sem->wait_value : zero,
                                        .signalSemaphoreValueCount = sem && sem->signal ? 1 : 0,
                                        .pSignalSemaphoreValues = sem ? &sem->signal_value : NULL};
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .pNext = sem && s->timeline ? &tl : NULL,
                       .waitSemaphoreCount = nw, .pWaitSemaphores = sem ? sem->wait : NULL, .pWaitDstStageMask = stages,
                       .commandBufferCount = k, .pCommandBuffers = cbs,
                       .signalSemaphoreCount = sem && sem->signal ? 1 : 0, .pSignalSemaphores = sem ? &sem->signal : NULL};
    bool one = k || sem;
    /* test-only: a lost device runs nothing more, so the injected loss first lets what was submitted
     * (kiln_run_async steps) finish: kiln then frees their memory without waiting, as after a real loss */
    bool lose = kiln_fault("vk_device_lost");
    if (lose) vkQueueWaitIdle(s->queue);
    VkResult r = lose ? VK_ERROR_DEVICE_LOST : vkQueueSubmit(s->queue, one ? 1 : 0, one ? &si : NULL, fence);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkQueueSubmit", err, n);
    s->submitted = true;
    return KILN_OK;
}

/* Frees what pending step b holds (the queue is idle or the step done); deliver: its downloads reach
 * the host. Its fence goes back to the spares. */
static void batch_free(kiln_vk *s, kiln_vk_batch *b, bool deliver)
{
    if (b->n_cbs) vkFreeCommandBuffers(s->dev, s->pool, b->n_cbs, b->cbs);
    free(b->cbs);
    kiln_vk_memory_retired(s, b, deliver);
    if (b->fence && s->n_spare_fence < KILN_VK_MAX_PENDING && vkResetFences(s->dev, 1, &b->fence) == VK_SUCCESS)
        s->spare_fence[s->n_spare_fence++] = b->fence;
    else if (b->fence)
        vkDestroyFence(s->dev, b->fence, NULL);
    *b = (kiln_vk_batch){0};
}

/* Every pending step dropped undelivered (the queue idle, or the device lost). */
static void drop_pending(kiln_vk *s)
{
    for (uint32_t i = 0; i < s->n_pending; i++) batch_free(s, &s->pending[i], false);
    s->n_pending = 0;
}

/* Retires pending steps oldest first: the first n_wait waited for, the rest only when done. */
static kiln_status retire(kiln_vk *s, uint32_t n_wait, char *err, size_t n)
{
    while (s->n_pending) {
        kiln_vk_batch *b = &s->pending[0];
        bool wait = n_wait > 0;
        if (n_wait) n_wait--;
        VkResult r = wait ? vkWaitForFences(s->dev, 1, &b->fence, VK_TRUE, UINT64_MAX) : vkGetFenceStatus(s->dev, b->fence);
        if (r == VK_NOT_READY || r == VK_TIMEOUT) return KILN_OK; /* later steps are not done either */
        if (r != VK_SUCCESS) {
            if (r != VK_ERROR_DEVICE_LOST) vkQueueWaitIdle(s->queue);
            drop_pending(s);
            return kiln_vk_fail(s, r, "waiting for a kiln_run_async step", err, n);
        }
        batch_free(s, b, true);
        memmove(&s->pending[0], &s->pending[1], (s->n_pending - 1) * sizeof *s->pending);
        s->n_pending--;
    }
    return KILN_OK;
}

kiln_status kiln_vk_retire(kiln_vk *s, bool wait, char *err, size_t n) { return retire(s, wait ? UINT32_MAX : 0, err, n); }

kiln_status kiln_vk_wait_steps(void *state, const void *owner, char *err, size_t n)
{
    kiln_vk *s = state;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "kiln_plan_wait", err, n);
    uint32_t k = s->n_pending;
    while (k && s->pending[k - 1].owner != owner) k--;
    return retire(s, k, err, n); /* the owner's last step and all before it */
}

kiln_status kiln_vk_queue_sync(void *state, char *err, size_t n)
{
    kiln_vk *s = state;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "sync", err, n);
    kiln_status st = KILN_OK;
    if (s->cur.open || s->submitted) {
        st = submit_immediate(s, VK_NULL_HANDLE, s->fence, NULL, err, n);
        if (st == KILN_OK) {
            VkResult r = vkWaitForFences(s->dev, 1, &s->fence, VK_TRUE, UINT64_MAX);
            if (r == VK_SUCCESS) r = vkResetFences(s->dev, 1, &s->fence);
            if (r != VK_SUCCESS) st = kiln_vk_fail(s, r, "waiting for the queue", err, n);
        }
    }
    if (st == KILN_OK) st = kiln_vk_retire(s, true, err, n); /* done (the fence is after them): older downloads first */
    if (st != KILN_OK) { /* the batch is gone: drop what it would have delivered */
        s->n_downloads = 0;
        if (!s->lost) vkQueueWaitIdle(s->queue);
        drop_pending(s);
    }
    if (!s->lost) vkResetCommandPool(s->dev, s->pool, 0);
    s->used_cbs = 0;
    s->cur = (kiln_vk_cmd){0};
    s->submitted = false;
    kiln_vk_memory_synced(s);
    return st;
}

/* ------------------------------------------------------------------ kiln_run_async */

#if VK_USE_64_BIT_PTR_DEFINES
#define VK_SEM(h) ((VkSemaphore)(uintptr_t)(h))
#else
#define VK_SEM(h) ((VkSemaphore)(h))
#endif

/* A kiln_vk_sync this device can honour, or why not. */
static kiln_status check_sync(const kiln_vk *s, const kiln_vk_sync *y, char *err, size_t n)
{
    if (!y) {
        snprintf(err, n, "vulkan: no kiln_vk_sync");
        return KILN_ERR_INVALID_ARG;
    }
    if (y->magic != KILN_VK_SYNC_MAGIC) {
        snprintf(err, n, "vulkan: stream is not a kiln_vk_sync (magic 0x%08x, want KILN_VK_SYNC_MAGIC 0x%08x)", (unsigned)y->magic,
                 (unsigned)KILN_VK_SYNC_MAGIC);
        return KILN_ERR_INVALID_ARG;
    }
    if (y->n_wait > KILN_VK_SYNC_MAX_WAIT || (y->n_wait && !y->wait)) {
        snprintf(err, n, "vulkan: kiln_vk_sync: %u wait semaphores%s (at most %d)", (unsigned)y->n_wait,
                 y->n_wait && !y->wait ? " and a NULL wait array" : "", KILN_VK_SYNC_MAX_WAIT);
        return KILN_ERR_INVALID_ARG;
    }
    for (uint32_t i = 0; i < y->n_wait; i++) {
        if (!y->wait[i]) {
            snprintf(err, n, "vulkan: kiln_vk_sync: wait semaphore %u is VK_NULL_HANDLE", (unsigned)i);
            return KILN_ERR_INVALID_ARG;
        }
        if (y->wait_value && y->wait_value[i] && !s->timeline) {
            snprintf(err, n, "vulkan: kiln_vk_sync: wait semaphore %u has a timeline value, but %s has no timeline semaphores", (unsigned)i,
                     s->props.deviceName);
            return KILN_ERR_UNSUPPORTED;
        }
    }
    if (y->signal_value && !y->signal) {
        snprintf(err, n, "vulkan: kiln_vk_sync: signal_value %llu without a signal semaphore", (unsigned long long)y->signal_value);
        return KILN_ERR_INVALID_ARG;
    }
    if (y->signal_value && !s->timeline) {
        snprintf(err, n, "vulkan: kiln_vk_sync: a timeline signal value, but %s has no timeline semaphores", s->props.deviceName);
        return KILN_ERR_UNSUPPORTED;
    }
    return KILN_OK;
}

kiln_status kiln_vk_join_wait(void *state, void *q, char *err, size_t n)
{
    kiln_vk *s = state;
    const kiln_vk_sync *y = q;
    kiln_status st = check_sync(s, y, err, n);
    if (st != KILN_OK) return st;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "kiln_run_async", err, n);
    if ((st = kiln_vk_retire(s, false, err, n)) != KILN_OK) return st;
    if (s->n_pending == KILN_VK_MAX_PENDING) {
        snprintf(err, n, "vulkan: %d steps queued by kiln_run_async are not done: wait for them (kiln_plan_wait) before queueing more",
                 KILN_VK_MAX_PENDING);
        return KILN_ERR_BUSY;
    }
    if (!y->n_wait) {
        kiln_vk_memory_step(s, true);
        return KILN_OK;
    }
    /* A semaphore wait gates only the commands of its own submission: a first command (a 4-byte
     * fill) goes with the waits, and every later command of the step has a barrier after it. */
    if (s->gate == UINT32_MAX && (st = kiln_vk_buffer_new(s, 4, false, &s->gate, err, n)) != KILN_OK) return st;
    VkCommandBuffer cb = kiln_vk_cmd_next(s, true, err, n);
    if (!cb) return KILN_ERR_BACKEND;
    vkCmdFillBuffer(cb, s->allocs[s->gate].buf, 0, 4, 0);
    VkSemaphore w[KILN_VK_SYNC_MAX_WAIT];
    for (uint32_t i = 0; i < y->n_wait; i++) w[i] = VK_SEM(y->wait[i]);
    vk_sems sem = {.n_wait = y->n_wait, .wait = w, .wait_value = y->wait_value};
    st = submit_immediate(s, VK_NULL_HANDLE, VK_NULL_HANDLE, &sem, err, n);
    if (st == KILN_OK) kiln_vk_memory_step(s, true);
    return st;
}

kiln_status kiln_vk_join_signal(void *state, void *q, const void *owner, char *err, size_t n)
{
    kiln_vk *s = state;
    const kiln_vk_sync *y = q; /* checked by join_wait */
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "kiln_run_async", err, n);
    if (s->n_pending == KILN_VK_MAX_PENDING) { /* join_wait made room; nothing but retiring ran since */
        snprintf(err, n, "vulkan: no room for a pending step");
        return KILN_ERR_INTERNAL;
    }
    kiln_vk_batch b = {.owner = owner};
    VkResult r = VK_SUCCESS;
    if (s->n_spare_fence) b.fence = s->spare_fence[--s->n_spare_fence];
    else {
        VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        r = vkCreateFence(s->dev, &fi, NULL, &b.fence);
    }
    uint32_t used = s->used_cbs; /* the step's immediate buffers, the open one included */
    if (r == VK_SUCCESS && used && !(b.cbs = malloc(used * sizeof *b.cbs))) r = VK_ERROR_OUT_OF_HOST_MEMORY;
    if (r != VK_SUCCESS) {
        if (b.fence) vkDestroyFence(s->dev, b.fence, NULL);
        return kiln_vk_fail(s, r, "preparing a kiln_run_async step", err, n);
    }
    vk_sems sem = {.signal = y->signal ? VK_SEM(y->signal) : VK_NULL_HANDLE, .signal_value = y->signal_value};
    kiln_status st = submit_immediate(s, VK_NULL_HANDLE, b.fence, y->signal ? &sem : NULL, err, n);
    if (used) memcpy(b.cbs, s->cbs, used * sizeof *b.cbs);
    memmove(s->cbs, s->cbs + used, (s->n_cbs - used) * sizeof *s->cbs); /* allocated, not in use */
    s->n_cbs -= used;
    s->used_cbs = 0;
    b.n_cbs = used;
    kiln_status sd = kiln_vk_memory_detach(s, &b, err, n);
    kiln_vk_memory_step(s, false);
    if (st != KILN_OK || sd != KILN_OK) { /* nothing of the step is pending on the device */
        if (!s->lost) vkQueueWaitIdle(s->queue);
        batch_free(s, &b, false);
        return st != KILN_OK ? st : sd;
    }
    s->pending[s->n_pending++] = b;
    return KILN_OK;
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
    return submit_immediate(s, ((vk_recording *)rec)->cb, VK_NULL_HANDLE, NULL, err, n);
}

void kiln_vk_record_free(void *state, void *rec)
{
    kiln_vk *s = state;
    if (!rec) return;
    if (s->submitted) { /* it may be pending */
        char err[256];
        kiln_vk_queue_sync(s, err, sizeof err);
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
