/* The Vulkan backend's shared state: instance/device/queue (vk_device.c), memory with opaque
 * addresses (vk_memory.c), command buffers, barriers, recordings and timers (vk_queue.c), kernels
 * as pipelines with descriptor sets (vk_kernel.c), failed calls worded (vk_error.c). Internal to src/backends/vulkan; nothing here
 * may be used outside it except through kiln_backend_vulkan. */
#pragma once

#include "codegen/kir.h"
#include "codegen/lower_memo.h"
#include "sched/backend.h"
#include "spirv/spirv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <vulkan/vulkan.h>

/* Device addresses handed to the executor: (allocation id + 1) << KILN_VK_ADDR_SHIFT | byte offset,
 * so NULL is never an address and plain arithmetic inside one allocation stays valid. */
#define KILN_VK_ADDR_SHIFT 40
#define KILN_VK_TIMERS 1024 /* timestamp query slots */

typedef struct kiln_vk_alloc {
    VkBuffer       buf;  /* VK_NULL_HANDLE: freed (ids are never reused) */
    VkDeviceMemory mem;  /* its memory */
    VkDeviceSize   size; /* bytes asked for */
    void          *map;  /* persistent mapping (staging buffers only), else NULL */
    bool           borrowed; /* the caller's buffer (kiln_vk_buffer_register): never destroyed here */
} kiln_vk_alloc;

typedef struct kiln_vk_download {
    void       *dst;   /* host destination, written at sync */
    const void *src;   /* staging bytes */
    size_t      bytes; /* size */
} kiln_vk_download;

typedef struct kiln_vk_cmd {
    VkCommandBuffer cb;        /* the command buffer being recorded */
    bool            open;      /* begun and not ended */
    uint32_t        n_cmds;    /* commands recorded (a barrier goes before every one after the first) */
} kiln_vk_cmd;

/* A step kiln_run_async submitted that nothing has waited for yet: what it holds until it is done. */
typedef struct kiln_vk_batch {
    VkFence           fence;       /* signalled when the step's last submission (and all before it) is done */
    const void       *owner;       /* the plan that queued it (kiln_vk_wait_steps) */
    VkCommandBuffer  *cbs;         /* its immediate command buffers, freed when it retires */
    uint32_t          n_cbs;       /* how many */
    uint32_t         *staging;     /* its staging buffers, spares (or freed) when it retires */
    uint32_t          n_staging;   /* how many */
    kiln_vk_download *downloads;   /* host copies made when it retires */
    uint32_t          n_downloads; /* how many */
} kiln_vk_batch;

#define KILN_VK_SPARE_STAGING 4 /* staging buffers kept for reuse when their step retires */

typedef struct kiln_vk {
    VkInstance        instance;       /* the process-wide instance (never destroyed) */
    VkPhysicalDevice  phys;           /* the chosen device */
    VkDevice          dev;            /* its logical device */
    VkQueue           queue;          /* a compute queue */
    uint32_t          queue_family;   /* its family */
    VkPhysicalDeviceProperties props; /* name, type, limits, vendor */
    VkPhysicalDeviceMemoryProperties mem_props; /* heaps and types */
    char              driver[128];    /* driver name and info */
    kiln_spv_features feat;           /* what the device offers the printer (kiln_vk_features masks it) */
    kiln_codegen_options cg;          /* options of the compile or load in progress (set under the
                                         context's device lock; zero: defaults) */
    kiln_lower_target target;         /* what the lowering knows of this device (set at probe) */
    kiln_lower_memo   memo;           /* what supports() lowered, for compile() (codegen/lower_memo.h) */
    bool              has_f64;        /* shaderFloat64 is enabled */
    bool              fma_checked;    /* kiln_vk_check_fma ran (or is running) */
    bool              size_control;   /* pipelines may require the subgroup size (feat.subgroup_size) */
    double            ts_period_ns;   /* timestamp tick, 0: no timestamps on this queue */
    bool              lost;           /* VK_ERROR_DEVICE_LOST seen: every later call fails */

    kiln_vk_alloc    *allocs;         /* allocation table, indexed by id */
    uint32_t          n_allocs, cap_allocs; /* used / allocated */

    VkCommandPool     pool;           /* immediate command buffers (reset at sync) */
    VkCommandPool     rec_pool;       /* recorded command buffers (freed with their recording) */
    VkCommandBuffer  *cbs;            /* immediate command buffers of this batch, reused after sync */
    uint32_t          n_cbs, cap_cbs, used_cbs; /* allocated / capacity / used in this batch */
    kiln_vk_cmd       cur;            /* immediate commands being recorded */
    kiln_vk_cmd       rec;            /* between record_begin and record_end: the recording */
    bool              recording;      /* launches go to rec */
    bool              submitted;      /* work was submitted since the last sync */
    VkFence           fence;          /* signalled by the last submission of a sync */
    VkQueryPool       timers;         /* KILN_VK_TIMERS timestamp queries, or VK_NULL_HANDLE */

    uint32_t          staging;        /* allocation id of the current staging buffer, UINT32_MAX: none */
    VkDeviceSize      staging_used;   /* bytes of it used in this batch */
    uint32_t         *old_staging;    /* staging buffers filled in this batch, freed at sync */
    uint32_t          n_old_staging, cap_old_staging; /* used / allocated */
    kiln_vk_download *downloads;      /* copies to the host done at sync */
    uint32_t          n_downloads, cap_downloads; /* used / allocated */

    /* kiln_run_async (vk_queue.c): steps submitted and not yet waited for, oldest first */
    bool              timeline;       /* timeline semaphores are enabled on the device */
    kiln_vk_batch     pending[KILN_VK_MAX_PENDING]; /* submitted steps in submission order */
    uint32_t          n_pending;      /* how many */
    VkFence           spare_fence[KILN_VK_MAX_PENDING]; /* reset fences for the next steps */
    uint32_t          n_spare_fence;  /* how many */
    uint32_t          spare_staging[KILN_VK_SPARE_STAGING]; /* staging buffers of retired steps */
    uint32_t          n_spare_staging; /* how many */
    bool              step;           /* between a kiln_run_async step's join_wait and join_signal (or a
                                         sync): staging buffers sized to the step (vk_memory.c) */
    VkDeviceSize      step_staged;    /* bytes of the staging buffers made or reused for this step */
    uint32_t          parked;         /* the unused staging buffer of synchronous runs, set aside during
                                         a step, UINT32_MAX: none */
    uint32_t          gate;           /* allocation id of the 4-byte buffer a step's first command
                                         fills (the command the caller's wait semaphores gate),
                                         UINT32_MAX: not made yet */
} kiln_vk;

/* vk_error.c */
const char *kiln_vk_result_name(VkResult r);
/* Translates a failed VkResult: err = "vulkan: WHAT: VK_ERROR_...", marks the device lost, and
 * returns KILN_ERR_NOMEM for out-of-memory, KILN_ERR_BACKEND otherwise. */
kiln_status kiln_vk_fail(kiln_vk *s, VkResult r, const char *what, char *err, size_t n);

/* vk_memory.c */
kiln_status kiln_vk_buffer_new(kiln_vk *s, VkDeviceSize bytes, bool host, uint32_t *id, char *err, size_t n);
void        kiln_vk_buffer_free(kiln_vk *s, uint32_t id);
/* A caller's buffer in the allocation table (borrowed: freeing the entry leaves the buffer alone). */
kiln_status kiln_vk_buffer_borrow(kiln_vk *s, VkBuffer buf, VkDeviceSize bytes, uint32_t *id, char *err, size_t n);
/* Decodes an address: allocation and byte offset; false for an address of no live allocation. */
bool        kiln_vk_decode(const kiln_vk *s, const void *addr, uint32_t *id, VkDeviceSize *off);
static inline void *kiln_vk_encode(uint32_t id, VkDeviceSize off)
{
    return (void *)(uintptr_t)(((uint64_t)(id + 1) << KILN_VK_ADDR_SHIFT) | off);
}
kiln_status kiln_vk_alloc_mem(void *state, size_t bytes, void **out, char *err, size_t n);
bool        kiln_vk_mem_info(void *state, uint64_t *free_bytes, uint64_t *total_bytes);
void        kiln_vk_free_mem(void *state, void *buf);
kiln_status kiln_vk_upload(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n);
kiln_status kiln_vk_download_mem(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n);
kiln_status kiln_vk_copy(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n);
void        kiln_vk_memory_release(kiln_vk *s);
/* Called by sync after the fence: host copies of downloads, staging reset. */
void        kiln_vk_memory_synced(kiln_vk *s);
/* Hands this batch's staging buffers and downloads to step b (kiln_run_async's submission) and
 * starts an empty batch; kiln_vk_memory_retired does b's host copies and takes its staging back. */
kiln_status kiln_vk_memory_detach(kiln_vk *s, kiln_vk_batch *b, char *err, size_t n);
void        kiln_vk_memory_retired(kiln_vk *s, kiln_vk_batch *b, bool deliver);
/* A kiln_run_async step starts (begin: join_wait) or ends (join_signal after the detach, or a sync):
 * staging buffers of a step are sized to what it copies (at most 4 x its staged bytes + 128 KiB),
 * the synchronous runs' buffer set aside meanwhile. */
void        kiln_vk_memory_step(kiln_vk *s, bool begin);
/* Bytes of host-visible staging memory held (every staging buffer: current, queued steps', spares). */
uint64_t    kiln_vk_staging_bytes(void *state);

/* vk_queue.c */
kiln_status kiln_vk_queue_init(kiln_vk *s, char *err, size_t n);
void        kiln_vk_queue_release(kiln_vk *s);
/* The command buffer launches go to now (begun; a memory barrier recorded before this command
 * when commands precede it), or NULL with err. transfer: the command is a transfer (uploads and
 * downloads always go to the immediate buffer, even while recording). */
VkCommandBuffer kiln_vk_cmd_next(kiln_vk *s, bool transfer, char *err, size_t n);
kiln_status kiln_vk_queue_sync(void *state, char *err, size_t n);
kiln_status kiln_vk_record_begin(void *state, char *err, size_t n);
kiln_status kiln_vk_record_end(void *state, void **rec, char *err, size_t n);
kiln_status kiln_vk_replay(void *state, void *rec, char *err, size_t n);
void        kiln_vk_record_free(void *state, void *rec);
kiln_status kiln_vk_timer_mark(void *state, int slot, char *err, size_t n);
kiln_status kiln_vk_timer_read(void *state, int a, int b, double *seconds, char *err, size_t n);
/* kiln_run_async's joins (q: a kiln_vk_sync): join_wait checks the sync and submits a first command
 * gated by its wait semaphores; join_signal submits what the step enqueued with its signal semaphore
 * and a fence, and keeps it pending (no host wait). Retire: the pending steps that are done (all of
 * them, waiting, when wait is true) deliver their downloads and give back their memory. */
kiln_status kiln_vk_join_wait(void *state, void *q, char *err, size_t n);
kiln_status kiln_vk_join_signal(void *state, void *q, const void *owner, char *err, size_t n);
kiln_status kiln_vk_retire(kiln_vk *s, bool wait, char *err, size_t n);
/* kiln_plan_wait: retires, waiting, the pending steps up to owner's last one; later ones stay pending. */
kiln_status kiln_vk_wait_steps(void *state, const void *owner, char *err, size_t n);

/* vk_kernel.c */
typedef struct kiln_kernel kiln_vk_kernel; /* the backend's kiln_kernel */
/* Compiles a kir kernel into a pipeline (tables uploaded). Used by compile and by tests. */
kiln_status kiln_vk_kernel_new(kiln_vk *s, const kiln_kir *k, kiln_vk_kernel **out, char *err, size_t n);
void        kiln_vk_kernel_free(kiln_vk *s, kiln_vk_kernel *k);
/* The kernels one region lowered to (run in order, sharing one scratch buffer) as one kernel. */
kiln_status kiln_vk_kernel_new_seq(kiln_vk *s, const kiln_kir *kirs, uint32_t n_kirs, kiln_vk_kernel **out, char *err, size_t n);
/* Records one dispatch of kernel k (the first of a sequence only) with slot i bound to address addrs[i] (tables: NULL, the
 * kernel's own copy is used). */
kiln_status kiln_vk_kernel_launch(kiln_vk *s, const kiln_vk_kernel *k, void *const *addrs, char *err, size_t n);
/* The same with the slots resolved from an executor's view (parameters, node buffers, tables). */
kiln_status kiln_vk_kernel_launch_view(kiln_vk *s, const kiln_vk_kernel *k, const kiln_exec_view *v, char *err, size_t n);
/* Runs fma(1 + 2^-12, 1 + 2^-12, -(1 + 2^-11)) on the device: where the result shows fma() rounds
 * twice, FMA is printed through doubles (feat.fma_f64) when the device has them. Runs once per
 * device and process, before the first kernel is printed (it syncs: never while recording). */
kiln_status kiln_vk_check_fma(kiln_vk *s, char *err, size_t n);
/* The features the printer uses under options' vk_disable bits (KILN_VK_NO_*). */
kiln_spv_features kiln_vk_features(const kiln_vk *s, int32_t disable);
/* GLSL of the kernel as compiled (for listings). */
const char *kiln_vk_kernel_glsl(const kiln_vk_kernel *k);
/* Cache entries: a compiled region's kernels (buffer slots, grid, tables, GLSL, SPIR-V), and
 * kernels rebuilt from such an entry (pipelines made from the SPIR-V: no printing, no glslang).
 * load takes the region's lowering (kirs): the entry's kernel count, scratch size, buffer slots,
 * grid, block and tables must equal what it says, or the entry is refused. */
kiln_status kiln_vk_kernel_save(kiln_vk *s, const kiln_vk_kernel *k, void **out, size_t *len);
kiln_status kiln_vk_kernel_load(kiln_vk *s, const kiln_graph *g, const kiln_kir *kirs, uint32_t n_kirs, const void *buf, size_t len,
                                kiln_vk_kernel **out, char *err, size_t n);
