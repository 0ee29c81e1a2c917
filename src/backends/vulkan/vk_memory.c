/* The Vulkan backend's memory: one VkBuffer per allocation (device-local where the device has
 * it), opaque addresses (id << 40 | offset), host-visible staging buffers for upload/download
 * (copied in command order; downloads reach the host at sync, or when a kiln_run_async step that
 * holds them retires), spare staging buffers of retired steps. Must not create pipelines nor
 * submit work except through vk_queue.c. */
#include "backends/vulkan/vk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGING_MIN (16u << 20)       /* smallest staging buffer */
#define STAGING_FLUSH (256ull << 20)  /* staging bytes in one batch before uploads sync by themselves */
#define STEP_STAGING (64u << 10)      /* smallest staging buffer of a kiln_run_async step, and its granule */

static int find_type(const kiln_vk *s, uint32_t bits, VkMemoryPropertyFlags want)
{
    for (uint32_t i = 0; i < s->mem_props.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (s->mem_props.memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

/* Room for one more allocation id. */
static kiln_status table_room(kiln_vk *s, char *err, size_t n)
{
    if (s->n_allocs == s->cap_allocs) {
        uint32_t cap = s->cap_allocs ? 2 * s->cap_allocs : 64;
        kiln_vk_alloc *g = cap < (1u << 23) ? realloc(s->allocs, cap * sizeof *g) : NULL;
        if (!g) {
            snprintf(err, n, "vulkan: allocation table full (ids are never reused)");
            return KILN_ERR_NOMEM;
        }
        s->allocs = g;
        s->cap_allocs = cap;
    }
    return KILN_OK;
}

kiln_status kiln_vk_buffer_borrow(kiln_vk *s, VkBuffer buf, VkDeviceSize bytes, uint32_t *id, char *err, size_t n)
{
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "registering a buffer", err, n);
    if (!buf || !bytes || bytes >> KILN_VK_ADDR_SHIFT) {
        snprintf(err, n, "vulkan: a buffer to register must be a VkBuffer of 1 byte to 1 TiB (got %s, %llu bytes)",
                 buf ? "a handle" : "VK_NULL_HANDLE", (unsigned long long)bytes);
        return KILN_ERR_INVALID_ARG;
    }
    kiln_status st = table_room(s, err, n);
    if (st != KILN_OK) return st;
    *id = s->n_allocs;
    s->allocs[s->n_allocs++] = (kiln_vk_alloc){.buf = buf, .size = bytes, .borrowed = true};
    return KILN_OK;
}

kiln_status kiln_vk_buffer_new(kiln_vk *s, VkDeviceSize bytes, bool host, uint32_t *id, char *err, size_t n)
{
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "allocation", err, n);
    if (bytes >> KILN_VK_ADDR_SHIFT) {
        snprintf(err, n, "vulkan: allocation of %llu bytes is over kiln's 1 TiB per allocation", (unsigned long long)bytes);
        return KILN_ERR_NOMEM;
    }
    kiln_status st0 = table_room(s, err, n);
    if (st0 != KILN_OK) return st0;
    kiln_vk_alloc a = {.size = bytes};
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes ? (bytes + 3) & ~3ull : 4,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vkCreateBuffer(s->dev, &bi, NULL, &a.buf);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkCreateBuffer", err, n);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(s->dev, a.buf, &req);
    int t = host ? find_type(s, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
                 : find_type(s, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (t < 0) t = host ? find_type(s, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
                        : find_type(s, req.memoryTypeBits, 0);
    if (t < 0) {
        vkDestroyBuffer(s->dev, a.buf, NULL);
        snprintf(err, n, "vulkan: no memory type for a %s buffer", host ? "host-visible" : "device");
        return KILN_ERR_BACKEND;
    }
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = (uint32_t)t};
    r = vkAllocateMemory(s->dev, &ai, NULL, &a.mem);
    if (r == VK_SUCCESS) r = vkBindBufferMemory(s->dev, a.buf, a.mem, 0);
    if (r == VK_SUCCESS && host) r = vkMapMemory(s->dev, a.mem, 0, VK_WHOLE_SIZE, 0, &a.map);
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(s->dev, a.buf, NULL);
        if (a.mem) vkFreeMemory(s->dev, a.mem, NULL);
        char what[64];
        snprintf(what, sizeof what, "allocating %llu bytes", (unsigned long long)bytes);
        return kiln_vk_fail(s, r, what, err, n);
    }
    *id = s->n_allocs;
    s->allocs[s->n_allocs++] = a;
    return KILN_OK;
}

void kiln_vk_buffer_free(kiln_vk *s, uint32_t id)
{
    if (id >= s->n_allocs || !s->allocs[id].buf) return;
    kiln_vk_alloc *a = &s->allocs[id];
    if (a->borrowed) { /* the caller's */
        *a = (kiln_vk_alloc){0};
        return;
    }
    vkDestroyBuffer(s->dev, a->buf, NULL);
    vkFreeMemory(s->dev, a->mem, NULL); /* unmaps too */
    *a = (kiln_vk_alloc){0};
}

bool kiln_vk_decode(const kiln_vk *s, const void *addr, uint32_t *id, VkDeviceSize *off)
{
    uint64_t v = (uint64_t)(uintptr_t)addr;
    uint64_t i = v >> KILN_VK_ADDR_SHIFT;
    if (i == 0 || i > s->n_allocs || !s->allocs[i - 1].buf) return false;
    *id = (uint32_t)(i - 1);
    *off = v & ((1ull << KILN_VK_ADDR_SHIFT) - 1);
    return *off <= s->allocs[i - 1].size;
}

/* Decodes addr and checks that [off, off + bytes) lies inside its allocation. */
static kiln_status range(const kiln_vk *s, const void *addr, size_t bytes, const char *what, uint32_t *id, VkDeviceSize *off,
                         char *err, size_t n)
{
    if (!kiln_vk_decode(s, addr, id, off)) {
        snprintf(err, n, "vulkan: %s: %p is not a live vulkan address", what, addr);
        return KILN_ERR_INVALID_ARG;
    }
    if (bytes > s->allocs[*id].size - *off) {
        snprintf(err, n, "vulkan: %s of %zu bytes at offset %llu overruns its allocation of %llu bytes", what, bytes,
                 (unsigned long long)*off, (unsigned long long)s->allocs[*id].size);
        return KILN_ERR_INVALID_ARG;
    }
    return KILN_OK;
}

kiln_status kiln_vk_alloc_mem(void *state, size_t bytes, void **out, char *err, size_t n)
{
    kiln_vk *s = state;
    uint32_t id;
    *out = NULL;
    kiln_status st = kiln_vk_buffer_new(s, bytes, false, &id, err, n);
    if (st == KILN_OK) *out = kiln_vk_encode(id, 0);
    return st;
}

/* The largest device-local heap, less the device buffers kiln holds there (core Vulkan has no
 * free-memory query; other processes' use is not seen). */
bool kiln_vk_mem_info(void *state, uint64_t *free_bytes, uint64_t *total_bytes)
{
    kiln_vk *s = state;
    VkDeviceSize heap = 0, held = 0;
    for (uint32_t i = 0; i < s->mem_props.memoryHeapCount; i++)
        if (s->mem_props.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT && s->mem_props.memoryHeaps[i].size > heap)
            heap = s->mem_props.memoryHeaps[i].size;
    if (!heap || s->lost) return false;
    for (uint32_t i = 0; i < s->n_allocs; i++)
        if (s->allocs[i].buf && !s->allocs[i].map && !s->allocs[i].borrowed) held += s->allocs[i].size;
    *total_bytes = heap;
    *free_bytes = held < heap ? heap - held : 0;
    return true;
}

void kiln_vk_free_mem(void *state, void *buf)
{
    kiln_vk *s = state;
    uint32_t id;
    VkDeviceSize off;
    if (!buf || !kiln_vk_decode(s, buf, &id, &off)) return;
    if (s->cur.n_cmds || s->submitted) { /* it may still be in use */
        char err[256];
        kiln_vk_queue_sync(s, err, sizeof err);
    }
    kiln_vk_buffer_free(s, id);
}

/* Staging space of `bytes` for this batch: its buffer id and offset. */
static kiln_status staging(kiln_vk *s, size_t bytes, uint32_t *id, VkDeviceSize *off, char *err, size_t n)
{
    VkDeviceSize need = (bytes + 15) & ~(VkDeviceSize)15;
    if (s->staging != UINT32_MAX && s->staging_used + need <= s->allocs[s->staging].size) {
        *id = s->staging;
        *off = s->staging_used;
        s->staging_used += need;
        return KILN_OK;
    }
    if (s->staging != UINT32_MAX) { /* full: retire it until the sync */
        if (s->n_old_staging == s->cap_old_staging) {
            uint32_t cap = s->cap_old_staging ? 2 * s->cap_old_staging : 8;
            uint32_t *g = realloc(s->old_staging, cap * sizeof *g);
            if (!g) {
                snprintf(err, n, "vulkan: out of host memory");
                return KILN_ERR_NOMEM;
            }
            s->old_staging = g;
            s->cap_old_staging = cap;
        }
        s->old_staging[s->n_old_staging++] = s->staging;
        s->staging = UINT32_MAX;
    }
    /* A step's buffers: the larger of the granule, the need and what the step has so far (it at most
     * doubles), in granules; a spare of exactly that size is reused (steps of one plan stage alike).
     * A step of U staged bytes then holds at most 4 U + 2 granules. Synchronous runs: 16 MiB or more. */
    VkDeviceSize size = need > STAGING_MIN ? need : STAGING_MIN;
    if (s->step) {
        size = need > s->step_staged ? need : s->step_staged;
        size = size > STEP_STAGING ? (size + STEP_STAGING - 1) / STEP_STAGING * STEP_STAGING : STEP_STAGING;
    }
    uint32_t nid = UINT32_MAX;
    for (uint32_t i = 0; i < s->n_spare_staging && nid == UINT32_MAX; i++) /* a retired step's */
        if (s->step ? s->allocs[s->spare_staging[i]].size == size : s->allocs[s->spare_staging[i]].size >= need) {
            nid = s->spare_staging[i];
            s->spare_staging[i] = s->spare_staging[--s->n_spare_staging];
        }
    kiln_status st = nid != UINT32_MAX ? KILN_OK : kiln_vk_buffer_new(s, size, true, &nid, err, n);
    if (st != KILN_OK) return st;
    if (s->step) s->step_staged += s->allocs[nid].size;
    s->staging = nid;
    s->staging_used = need;
    *id = nid;
    *off = 0;
    return KILN_OK;
}

static VkDeviceSize staging_total(const kiln_vk *s)
{
    VkDeviceSize t = s->staging_used;
    for (uint32_t i = 0; i < s->n_old_staging; i++) t += s->allocs[s->old_staging[i]].size;
    return t;
}

static kiln_status record_copy(kiln_vk *s, uint32_t src, VkDeviceSize so, uint32_t dst, VkDeviceSize dof, size_t bytes, char *err, size_t n)
{
    VkCommandBuffer cb = kiln_vk_cmd_next(s, true, err, n);
    if (!cb) return KILN_ERR_BACKEND;
    VkBufferCopy c = {.srcOffset = so, .dstOffset = dof, .size = bytes};
    vkCmdCopyBuffer(cb, s->allocs[src].buf, s->allocs[dst].buf, 1, &c);
    return KILN_OK;
}

kiln_status kiln_vk_upload(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    kiln_vk *s = state;
    uint32_t id, sid;
    VkDeviceSize off, soff;
    kiln_status st = range(s, dst, bytes, "upload", &id, &off, err, n);
    if (st != KILN_OK || !bytes) return st;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "upload", err, n);
    if (staging_total(s) + bytes > STAGING_FLUSH && (s->cur.n_cmds || s->submitted)) { /* weights: bounded staging */
        st = kiln_vk_queue_sync(s, err, n);
        if (st != KILN_OK) return st;
    }
    st = staging(s, bytes, &sid, &soff, err, n);
    if (st != KILN_OK) return st;
    memcpy((char *)s->allocs[sid].map + soff, src, bytes);
    return record_copy(s, sid, soff, id, off, bytes, err, n);
}

kiln_status kiln_vk_download_mem(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    kiln_vk *s = state;
    uint32_t id, sid;
    VkDeviceSize off, soff;
    kiln_status st = range(s, src, bytes, "download", &id, &off, err, n);
    if (st != KILN_OK || !bytes) return st;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "download", err, n);
    if (s->n_downloads == s->cap_downloads) {
        uint32_t cap = s->cap_downloads ? 2 * s->cap_downloads : 16;
        kiln_vk_download *g = realloc(s->downloads, cap * sizeof *g);
        if (!g) {
            snprintf(err, n, "vulkan: out of host memory");
            return KILN_ERR_NOMEM;
        }
        s->downloads = g;
        s->cap_downloads = cap;
    }
    st = staging(s, bytes, &sid, &soff, err, n);
    if (st != KILN_OK) return st;
    st = record_copy(s, id, off, sid, soff, bytes, err, n);
    if (st != KILN_OK) return st;
    s->downloads[s->n_downloads++] = (kiln_vk_download){.dst = dst, .src = (char *)s->allocs[sid].map + soff, .bytes = bytes};
    return KILN_OK;
}

kiln_status kiln_vk_copy(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    kiln_vk *s = state;
    uint32_t di, si;
    VkDeviceSize dof, sof;
    kiln_status st = range(s, dst, bytes, "copy destination", &di, &dof, err, n);
    if (st == KILN_OK) st = range(s, src, bytes, "copy source", &si, &sof, err, n);
    if (st != KILN_OK || !bytes || (di == si && dof == sof)) return st;
    if (di == si && dof < sof + bytes && sof < dof + bytes) {
        snprintf(err, n, "vulkan: copy between overlapping ranges of one allocation");
        return KILN_ERR_INVALID_ARG;
    }
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "copy", err, n);
    return record_copy(s, si, sof, di, dof, bytes, err, n);
}

/* A staging buffer no step holds any more: kept for reuse, or freed. */
static void spare_or_free(kiln_vk *s, uint32_t id)
{
    if (s->n_spare_staging < KILN_VK_SPARE_STAGING) s->spare_staging[s->n_spare_staging++] = id;
    else kiln_vk_buffer_free(s, id);
}

void kiln_vk_memory_step(kiln_vk *s, bool begin)
{
    if (begin) {
        if (s->step) return;
        s->step = true;
        s->step_staged = 0;
        if (s->staging != UINT32_MAX && !s->staging_used) s->parked = s->staging, s->staging = UINT32_MAX;
        return;
    }
    if (!s->step) return;
    s->step = false;
    if (s->parked == UINT32_MAX) return;
    /* after the detach or a sync: the current buffer, if any, is unused */
    if (s->staging != UINT32_MAX) spare_or_free(s, s->staging);
    s->staging = s->parked;
    s->staging_used = 0;
    s->parked = UINT32_MAX;
}

uint64_t kiln_vk_staging_bytes(void *state)
{
    const kiln_vk *s = state;
    uint64_t t = 0;
    for (uint32_t i = 0; i < s->n_allocs; i++)
        if (s->allocs[i].buf && s->allocs[i].map) t += s->allocs[i].size;
    return t;
}

void kiln_vk_memory_synced(kiln_vk *s)
{
    for (uint32_t i = 0; i < s->n_downloads; i++) memcpy(s->downloads[i].dst, s->downloads[i].src, s->downloads[i].bytes);
    s->n_downloads = 0;
    for (uint32_t i = 0; i < s->n_old_staging; i++) kiln_vk_buffer_free(s, s->old_staging[i]);
    s->n_old_staging = 0;
    s->staging_used = 0;
    kiln_vk_memory_step(s, false); /* a step that did not reach join_signal (it failed) */
}

kiln_status kiln_vk_memory_detach(kiln_vk *s, kiln_vk_batch *b, char *err, size_t n)
{
    bool cur = s->staging != UINT32_MAX && s->staging_used; /* an unused one stays with the next batch */
    uint32_t ns = s->n_old_staging + cur;
    b->staging = ns ? malloc(ns * sizeof *b->staging) : NULL;
    if (ns && !b->staging) {
        snprintf(err, n, "vulkan: out of host memory");
        return KILN_ERR_NOMEM;
    }
    if (s->n_old_staging) memcpy(b->staging, s->old_staging, s->n_old_staging * sizeof *b->staging);
    if (cur) b->staging[ns - 1] = s->staging, s->staging = UINT32_MAX;
    b->n_staging = ns;
    s->n_old_staging = 0;
    s->staging_used = 0;
    b->downloads = NULL;
    b->n_downloads = s->n_downloads;
    if (s->n_downloads) { /* the array goes with the step; the next batch grows its own */
        b->downloads = s->downloads;
        s->downloads = NULL;
        s->n_downloads = s->cap_downloads = 0;
    }
    return KILN_OK;
}

void kiln_vk_memory_retired(kiln_vk *s, kiln_vk_batch *b, bool deliver)
{
    for (uint32_t i = 0; deliver && i < b->n_downloads; i++) memcpy(b->downloads[i].dst, b->downloads[i].src, b->downloads[i].bytes);
    free(b->downloads);
    for (uint32_t i = 0; i < b->n_staging; i++) spare_or_free(s, b->staging[i]);
    free(b->staging);
    b->downloads = NULL, b->staging = NULL;
    b->n_downloads = b->n_staging = 0;
}

void kiln_vk_memory_release(kiln_vk *s)
{
    for (uint32_t i = 0; i < s->n_allocs; i++) kiln_vk_buffer_free(s, i);
    free(s->allocs);
    free(s->old_staging);
    free(s->downloads);
}
