/* The Vulkan backend's kernels: a kir kernel printed to GLSL, compiled by glslang, made a compute
 * pipeline (one storage buffer binding per slot, slot offsets in push constants), its constant
 * tables uploaded once; launches bind whole allocations through cached descriptor sets (never
 * updated once made, so recorded command buffers stay valid). Must not submit work. */
#include "backends/vulkan/vk.h"
#include "codegen/kir_blob.h"
#include "util/fault.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SETS_PER_POOL 32

typedef struct vk_set {
    uint32_t        ids[KILN_KIR_MAX_BUFS];    /* allocation bound at each slot */
    VkDeviceSize    window[KILN_KIR_MAX_BUFS]; /* byte offset the binding starts at */
    VkDescriptorSet set;                       /* the descriptor set */
} vk_set;

/* One kir kernel; the kernels one region lowers to are chained through next. */
struct kiln_kernel {
    struct kiln_kernel   *next;                      /* the region's next kernel, or NULL */
    void                 *scratch;                   /* the region's scratch buffer (shared), or NULL */
    bool                  owns_scratch;              /* the first kernel of a region frees it */
    uint32_t              n_bufs;                    /* buffer slots */
    kiln_kbuf             bufs[KILN_KIR_MAX_BUFS];   /* what each slot is bound to */
    uint32_t              grid[3];                   /* dispatch size */
    void                 *tables[KILN_KIR_MAX_TABLES]; /* device copies of the kir tables */
    uint32_t              n_tables;                  /* used */
    char                 *glsl;                      /* source, for listings */
    VkShaderModule        module;                    /* SPIR-V */
    VkDescriptorSetLayout set_layout;                /* n_bufs storage buffers */
    VkPipelineLayout      layout;                    /* set 0 + KILN_SPV_PUSH_WORDS words of push constants */
    VkPipeline            pipeline;                  /* the compute pipeline */
    VkDescriptorPool     *pools;                     /* descriptor pools, SETS_PER_POOL sets each */
    uint32_t              n_pools;                   /* used */
    uint32_t              pool_left;                 /* sets left in the last pool */
    vk_set               *sets;                      /* cached sets, one per distinct binding */
    uint32_t              n_sets, cap_sets;          /* used / allocated */
    kiln_blob_w           entry;                     /* first kernel of a compiled region: its cache entry */
};

#define VK_ENTRY_MAGIC 0x324b564bu /* "KVK2": launch metadata through codegen/kir_blob.h */

const char *kiln_vk_kernel_glsl(const kiln_vk_kernel *k) { return k->glsl; }

void kiln_vk_kernel_free(kiln_vk *s, kiln_vk_kernel *k)
{
    if (!k) return;
    kiln_vk_kernel_free(s, k->next);
    if (k->owns_scratch) kiln_vk_free_mem(s, k->scratch);
    if (s->submitted || s->cur.n_cmds) { /* it may be in flight */
        char err[256];
        kiln_vk_queue_sync(s, err, sizeof err);
    }
    for (uint32_t i = 0; i < k->n_tables; i++) kiln_vk_free_mem(s, k->tables[i]);
    for (uint32_t i = 0; i < k->n_pools; i++) vkDestroyDescriptorPool(s->dev, k->pools[i], NULL);
    if (k->pipeline) vkDestroyPipeline(s->dev, k->pipeline, NULL);
    if (k->layout) vkDestroyPipelineLayout(s->dev, k->layout, NULL);
    if (k->set_layout) vkDestroyDescriptorSetLayout(s->dev, k->set_layout, NULL);
    if (k->module) vkDestroyShaderModule(s->dev, k->module, NULL);
    free(k->pools);
    free(k->sets);
    free(k->glsl);
    free(k->entry.p);
    free(k);
}

static bool uses_reduce(const kiln_kir *k)
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_REDUCE) return true;
    return false;
}

/* What a pipeline is made from besides the SPIR-V: buffer slots, block size, whether it reduces
 * (kept in cache entries, so a loaded kernel makes the same pipeline). */
typedef struct vk_shape {
    uint32_t n_bufs; /* storage buffer bindings */
    uint32_t block;  /* threads per workgroup */
    bool     reduce; /* uses REDUCE (subgroup size pinned) */
    uint32_t subgroup; /* subgroup size the GLSL was printed for (0: shared-memory reductions) */
} vk_shape;

static kiln_status make_pipeline(kiln_vk *s, const vk_shape *kir, kiln_vk_kernel *k, const uint32_t *words, size_t n_words,
                                 char *err, size_t n)
{
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = n_words * 4, .pCode = words};
    VkResult r = vkCreateShaderModule(s->dev, &mi, NULL, &k->module);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkCreateShaderModule", err, n);
    VkDescriptorSetLayoutBinding b[KILN_KIR_MAX_BUFS];
    for (uint32_t i = 0; i < kir->n_bufs; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, .bindingCount = kir->n_bufs, .pBindings = b};
    r = vkCreateDescriptorSetLayout(s->dev, &li, NULL, &k->set_layout);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkCreateDescriptorSetLayout", err, n);
    VkPushConstantRange pc = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = KILN_SPV_PUSH_WORDS * 4};
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                      .pSetLayouts = &k->set_layout, .pushConstantRangeCount = 1, .pPushConstantRanges = &pc};
    r = vkCreatePipelineLayout(s->dev, &pli, NULL, &k->layout);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkCreatePipelineLayout", err, n);
    /* subgroup reductions were printed for feat.subgroup_size: make the dispatch use exactly it */
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT req = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT, .requiredSubgroupSize = kir->subgroup};
    bool pin = s->size_control && kir->subgroup && kir->block % kir->subgroup == 0 && kir->reduce;
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .pNext = pin ? &req : NULL,
                  .flags = pin ? VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT : 0,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT, .module = k->module, .pName = "main"},
        .layout = k->layout};
    r = vkCreateComputePipelines(s->dev, VK_NULL_HANDLE, 1, &ci, NULL, &k->pipeline);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkCreateComputePipelines", err, n);
    return KILN_OK;
}

/* Device limits a kernel must fit (checked again for kernels loaded from cache entries). */
static kiln_status check_limits(kiln_vk *s, const char *name, uint32_t block, const uint32_t grid[3], bool stride, char *err,
                                size_t n)
{
    const VkPhysicalDeviceLimits *lim = &s->props.limits;
    if (block > lim->maxComputeWorkGroupInvocations || block > lim->maxComputeWorkGroupSize[0]) {
        snprintf(err, n, "vulkan: kernel %s has %u threads per block, %s takes %u", name, block, s->props.deviceName,
                 lim->maxComputeWorkGroupInvocations);
        return KILN_ERR_UNSUPPORTED;
    }
    for (int d = 0; d < 3; d++)
        if ((grid[d] > lim->maxComputeWorkGroupCount[d] && !(d == 0 && stride)) || !grid[d]) {
            snprintf(err, n, "vulkan: kernel %s grid[%d] = %u, %s takes 1..%u", name, d, grid[d], s->props.deviceName,
                     lim->maxComputeWorkGroupCount[d]);
            return KILN_ERR_UNSUPPORTED;
        }
    return KILN_OK;
}

/* Blocks a grid-stride kernel launches over its n virtual ones: the device's limit, or the options' grid_cap. */
static uint32_t stride_blocks(kiln_vk *s, uint32_t n)
{
    return kiln_stride_blocks(n, 0, s->props.limits.maxComputeWorkGroupCount[0], s->cg.grid_cap);
}

kiln_spv_features kiln_vk_features(const kiln_vk *s, int32_t disable)
{
    kiln_spv_features f = s->feat;
    if (disable & KILN_VK_NO_16BIT) f.storage16 = false;
    if (disable & KILN_VK_NO_DOT) f.int_dot = false;
    if (disable & KILN_VK_NO_SUBGROUP) f.subgroup_size = 0, f.subgroup_arith = f.subgroup_clustered = false;
    return f;
}

static kiln_status kernel_new(kiln_vk *s, const kiln_kir *kir, kiln_vk_kernel **out, kiln_blob_w *entry, char *err, size_t n);

/* Test-only (KILN_FAULT_INJECT=vk_glsl_error): a statement glslang rejects, at the end of main. */
static kiln_status inject_glsl_error(char **glsl, char *err, size_t n)
{
    char *end = strrchr(*glsl, '}');
    size_t at = end ? (size_t)(end - *glsl) : strlen(*glsl);
    static const char bad[] = "    kiln_fault_injected = 1;\n";
    char *g = malloc(strlen(*glsl) + sizeof bad);
    if (!g) return KILN_ERR_NOMEM;
    memcpy(g, *glsl, at);
    memcpy(g + at, bad, sizeof bad - 1);
    strcpy(g + at + sizeof bad - 1, *glsl + at);
    free(*glsl);
    *glsl = g;
    return KILN_OK;
}

kiln_status kiln_vk_kernel_new(kiln_vk *s, const kiln_kir *kir, kiln_vk_kernel **out, char *err, size_t n)
{
    return kernel_new(s, kir, out, NULL, err, n);
}

/* Makes kernel k from kir; when entry is given, appends k's part of the region's cache entry. */
static kiln_status kernel_new(kiln_vk *s, const kiln_kir *kir, kiln_vk_kernel **out, kiln_blob_w *entry, char *err, size_t n)
{
    *out = NULL;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "compile", err, n);
    if (!s->fma_checked && !s->recording) {
        kiln_status st = kiln_vk_check_fma(s, err, n);
        if (st != KILN_OK) return st;
    }
    const VkPhysicalDeviceLimits *lim = &s->props.limits;
    kiln_status lst = check_limits(s, kir->name, kir->block, kir->grid, kir->grid_stride, err, n);
    if (lst != KILN_OK) return lst;
    uint32_t shared = 0;
    for (uint32_t i = 0; i < kir->n_shared; i++) shared += 4 * kir->shared[i];
    if (uses_reduce(kir)) shared += 4 * kir->block;
    if (shared > lim->maxComputeSharedMemorySize) {
        snprintf(err, n, "vulkan: kernel %s needs %u bytes of shared memory, %s has %u", kir->name, shared, s->props.deviceName,
                 lim->maxComputeSharedMemorySize);
        return KILN_ERR_UNSUPPORTED;
    }
    kiln_vk_kernel *k = calloc(1, sizeof *k);
    if (!k) return KILN_ERR_NOMEM;
    k->n_bufs = kir->n_bufs;
    memcpy(k->bufs, kir->bufs, sizeof k->bufs);
    memcpy(k->grid, kir->grid, sizeof k->grid);
    if (kir->grid_stride) k->grid[0] = stride_blocks(s, k->grid[0]);
    kiln_spv_features feat = kiln_vk_features(s, s->cg.vk_disable);
    kiln_status st = kiln_spv_glsl(kir, &feat, &k->glsl, err, n);
    if (st == KILN_OK && kiln_fault("vk_glsl_error")) st = inject_glsl_error(&k->glsl, err, n); /* test-only */
    uint32_t *words = NULL;
    size_t n_words = 0;
    if (st == KILN_OK) st = kiln_spv_compile(k->glsl, &words, &n_words, err, n);
    vk_shape shape = {.n_bufs = kir->n_bufs, .block = kir->block, .reduce = uses_reduce(kir), .subgroup = feat.subgroup_size};
    if (st == KILN_OK) st = make_pipeline(s, &shape, k, words, n_words, err, n);
    if (st == KILN_OK && entry) {
        kiln_kir_blob_put(entry, kir); /* launch metadata (codegen/kir_blob.h) */
        kiln_blob_bytes(entry, k->glsl, strlen(k->glsl) + 1);
        kiln_blob_bytes(entry, words, n_words * 4);
    }
    free(words);
    for (uint32_t i = 0; st == KILN_OK && i < kir->n_tables; i++) {
        size_t bytes = (size_t)kir->tables[i].n * 4;
        st = kiln_vk_alloc_mem(s, bytes, &k->tables[i], err, n);
        if (st == KILN_OK) k->n_tables++;
        if (st == KILN_OK) st = kiln_vk_upload(s, k->tables[i], kir->tables[i].words, bytes, err, n);
    }
    if (st != KILN_OK) {
        kiln_vk_kernel_free(s, k);
        return st;
    }
    *out = k;
    return KILN_OK;
}

static kiln_status new_set(kiln_vk *s, kiln_vk_kernel *k, VkDescriptorSet *set, char *err, size_t n)
{
    if (!k->pool_left) {
        VkDescriptorPool *g = realloc(k->pools, (k->n_pools + 1) * sizeof *g);
        if (!g) return KILN_ERR_NOMEM;
        k->pools = g;
        VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = SETS_PER_POOL * k->n_bufs};
        VkDescriptorPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = SETS_PER_POOL,
                                         .poolSizeCount = 1, .pPoolSizes = &ps};
        VkResult r = vkCreateDescriptorPool(s->dev, &pi, NULL, &k->pools[k->n_pools]);
        if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkCreateDescriptorPool", err, n);
        k->n_pools++;
        k->pool_left = SETS_PER_POOL;
    }
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = k->pools[k->n_pools - 1],
                                      .descriptorSetCount = 1, .pSetLayouts = &k->set_layout};
    VkResult r = vkAllocateDescriptorSets(s->dev, &ai, set);
    if (r != VK_SUCCESS) return kiln_vk_fail(s, r, "vkAllocateDescriptorSets", err, n);
    k->pool_left--;
    return KILN_OK;
}

/* The descriptor set binding ids[] at window[] (made once per distinct binding). */
static kiln_status get_set(kiln_vk *s, kiln_vk_kernel *k, const uint32_t *ids, const VkDeviceSize *window, VkDescriptorSet *out,
                           char *err, size_t n)
{
    size_t nb = k->n_bufs;
    for (uint32_t i = 0; i < k->n_sets; i++)
        if (!memcmp(k->sets[i].ids, ids, nb * sizeof *ids) && !memcmp(k->sets[i].window, window, nb * sizeof *window)) {
            *out = k->sets[i].set;
            return KILN_OK;
        }
    if (k->n_sets == k->cap_sets) {
        uint32_t cap = k->cap_sets ? 2 * k->cap_sets : 4;
        vk_set *g = realloc(k->sets, cap * sizeof *g);
        if (!g) return KILN_ERR_NOMEM;
        k->sets = g;
        k->cap_sets = cap;
    }
    vk_set *e = &k->sets[k->n_sets];
    memset(e, 0, sizeof *e);
    kiln_status st = new_set(s, k, &e->set, err, n);
    if (st != KILN_OK) return st;
    memcpy(e->ids, ids, nb * sizeof *ids);
    memcpy(e->window, window, nb * sizeof *window);
    VkDescriptorBufferInfo bi[KILN_KIR_MAX_BUFS];
    VkWriteDescriptorSet w[KILN_KIR_MAX_BUFS];
    VkDeviceSize max_range = s->props.limits.maxStorageBufferRange;
    for (uint32_t i = 0; i < nb; i++) {
        VkDeviceSize size = (s->allocs[ids[i]].size + 3) & ~3ull;
        if (size < 4) size = 4;
        VkDeviceSize left = size - window[i];
        bi[i] = (VkDescriptorBufferInfo){.buffer = s->allocs[ids[i]].buf, .offset = window[i], .range = left > max_range ? max_range & ~3ull : left};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = e->set, .dstBinding = i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[i]};
    }
    vkUpdateDescriptorSets(s->dev, (uint32_t)nb, w, 0, NULL);
    k->n_sets++;
    *out = e->set;
    return KILN_OK;
}

kiln_status kiln_vk_kernel_launch(kiln_vk *s, const kiln_vk_kernel *kc, void *const *addrs, char *err, size_t n)
{
    kiln_vk_kernel *k = (kiln_vk_kernel *)kc; /* the set cache grows; the kernel's meaning does not change */
    uint32_t ids[KILN_KIR_MAX_BUFS] = {0}, push[KILN_SPV_PUSH_WORDS] = {0};
    VkDeviceSize window[KILN_KIR_MAX_BUFS] = {0};
    VkDeviceSize max_range = s->props.limits.maxStorageBufferRange, align = s->props.limits.minStorageBufferOffsetAlignment;
    if (!align) align = 4;
    for (uint32_t i = 0; i < k->n_bufs; i++) {
        void *a = k->bufs[i].kind == KILN_KBUF_TABLE && k->bufs[i].node < k->n_tables ? k->tables[k->bufs[i].node]
                : k->bufs[i].kind == KILN_KBUF_SCRATCH ? k->scratch : addrs[i];
        VkDeviceSize off;
        if (!kiln_vk_decode(s, a, &ids[i], &off) || off % 4) {
            snprintf(err, n, "vulkan: slot %u of a launch: %p is not a 4-byte aligned vulkan address", i, a);
            return KILN_ERR_INVALID_ARG;
        }
        /* bind whole allocations; one over the largest binding is bound from an aligned window */
        if (s->allocs[ids[i]].size > max_range) window[i] = off / align * align;
        if ((off - window[i]) / 4 > UINT32_MAX) {
            snprintf(err, n, "vulkan: slot %u offset too large", i);
            return KILN_ERR_UNSUPPORTED;
        }
        push[i] = (uint32_t)((off - window[i]) / 4);
    }
    VkDescriptorSet set;
    kiln_status st = get_set(s, k, ids, window, &set, err, n);
    if (st != KILN_OK) return st;
    VkCommandBuffer cb = kiln_vk_cmd_next(s, false, err, n);
    if (!cb) return s->lost ? KILN_ERR_BACKEND : KILN_ERR_NOMEM;
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipeline);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k->layout, 0, 1, &set, 0, NULL);
    vkCmdPushConstants(cb, k->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof push, push);
    vkCmdDispatch(cb, k->grid[0], k->grid[1], k->grid[2]);
    return KILN_OK;
}

kiln_status kiln_vk_kernel_launch_view(kiln_vk *s, const kiln_vk_kernel *k, const kiln_exec_view *v, char *err, size_t n)
{
    for (; k; k = k->next) { /* a region's kernels in order; a barrier goes between them */
        void *addrs[KILN_KIR_MAX_BUFS] = {NULL};
        for (uint32_t i = 0; i < k->n_bufs; i++) {
            const kiln_kbuf *b = &k->bufs[i];
            if (b->kind == KILN_KBUF_PARAMS) addrs[i] = v->params;
            else if (b->kind == KILN_KBUF_NODE) addrs[i] = v->bufs[b->node];
        }
        kiln_status st = kiln_vk_kernel_launch(s, k, addrs, err, n);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

kiln_status kiln_vk_kernel_new_seq(kiln_vk *s, const kiln_kir *kirs, uint32_t n_kirs, kiln_vk_kernel **out, char *err, size_t n)
{
    *out = NULL;
    uint64_t scratch = 0;
    for (uint32_t i = 0; i < n_kirs; i++)
        if (kirs[i].scratch_bytes > scratch) scratch = kirs[i].scratch_bytes;
    void *mem = NULL;
    kiln_status st = scratch ? kiln_vk_alloc_mem(s, scratch, &mem, err, n) : KILN_OK;
    kiln_vk_kernel *first = NULL, **tail = &first;
    kiln_blob_w entry = {0};
    kiln_kir_blob_head(&entry, VK_ENTRY_MAGIC, kirs, n_kirs);
    for (uint32_t i = 0; st == KILN_OK && i < n_kirs; i++) {
        st = kernel_new(s, &kirs[i], tail, &entry, err, n);
        if (st != KILN_OK) break;
        (*tail)->scratch = mem;
        tail = &(*tail)->next;
    }
    if (first) first->owns_scratch = true;
    else kiln_vk_free_mem(s, mem);
    if (st != KILN_OK) {
        free(entry.p);
        kiln_vk_kernel_free(s, first);
        return st;
    }
    first->entry = entry;
    *out = first;
    return KILN_OK;
}

/* ------------------------------------------------------------------ cache entries */

kiln_status kiln_vk_kernel_save(kiln_vk *s, const kiln_vk_kernel *k, void **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!k->entry.n || k->entry.oom || !(*out = malloc(k->entry.n))) return KILN_ERR_NOMEM;
    memcpy(*out, k->entry.p, k->entry.n);
    *len = k->entry.n;
    return KILN_OK;
}

/* One kernel of an entry: the launch metadata through the shared checked reader
 * (codegen/kir_blob.h); the SPIR-V goes straight to the pipeline (no GLSL printing, no glslang). */
static kiln_status load_one(kiln_vk *s, const kiln_graph *g, const kiln_kir *want, kiln_blob_r *rd, kiln_vk_kernel **out,
                            char *err, size_t n)
{
    kiln_kir_meta m;
    kiln_status st = kiln_kir_blob_get(rd, g, want, "vulkan", &m, err, n);
    if (st != KILN_OK) return st;
    kiln_vk_kernel *k = calloc(1, sizeof *k);
    if (!k) return KILN_ERR_NOMEM;
    *out = k;
    k->n_bufs = m.n_bufs;
    memcpy(k->bufs, m.bufs, sizeof k->bufs);
    memcpy(k->grid, m.grid, sizeof k->grid);
    /* the region key holds vk_disable; the reduction is the lowering's (the metadata matched it) */
    vk_shape shape = {.n_bufs = m.n_bufs, .block = m.block, .reduce = uses_reduce(want),
                      .subgroup = kiln_vk_features(s, s->cg.vk_disable).subgroup_size};
    if ((st = check_limits(s, "from the cache", m.block, k->grid, m.grid_stride, err, n)) != KILN_OK) return st;
    if (m.grid_stride) k->grid[0] = stride_blocks(s, k->grid[0]);
    for (uint32_t t = 0; t < m.n_tables; t++) {
        size_t bytes = (size_t)m.tables[t].n * 4;
        if ((st = kiln_vk_alloc_mem(s, bytes, &k->tables[t], err, n)) != KILN_OK) return st;
        k->n_tables++;
        if ((st = kiln_vk_upload(s, k->tables[t], m.tables[t].words, bytes, err, n)) != KILN_OK) return st;
    }
    size_t glsl_n, spv_n;
    const char *glsl = kiln_blob_get_bytes(rd, &glsl_n);
    const void *spv = kiln_blob_get_bytes(rd, &spv_n);
    if (rd->bad || !glsl_n || glsl[glsl_n - 1] || !spv_n || spv_n % 4) {
        snprintf(err, n, "vulkan: cache entry does not fit the region");
        return KILN_ERR_INVALID_ARG;
    }
    uint32_t *words = malloc(spv_n); /* aligned for the driver */
    if (!(k->glsl = strdup(glsl)) || !words) {
        free(words);
        return KILN_ERR_NOMEM;
    }
    memcpy(words, spv, spv_n);
    st = make_pipeline(s, &shape, k, words, spv_n / 4, err, n);
    free(words);
    return st;
}

kiln_status kiln_vk_kernel_load(kiln_vk *s, const kiln_graph *g, const kiln_kir *kirs, uint32_t n_kirs, const void *buf, size_t len,
                                kiln_vk_kernel **out, char *err, size_t n)
{
    *out = NULL;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "load", err, n);
    kiln_blob_r rd = {.p = buf, .n = len};
    uint64_t scratch = 0;
    for (uint32_t i = 0; i < n_kirs; i++)
        if (kirs[i].scratch_bytes > scratch) scratch = kirs[i].scratch_bytes;
    if (!kiln_kir_blob_head_ok(&rd, VK_ENTRY_MAGIC, kirs, n_kirs)) {
        snprintf(err, n, "vulkan: cache entry does not fit the region");
        return KILN_ERR_INVALID_ARG;
    }
    void *mem = NULL;
    kiln_status st = scratch ? kiln_vk_alloc_mem(s, scratch, &mem, err, n) : KILN_OK;
    kiln_vk_kernel *first = NULL, **tail = &first;
    for (uint32_t i = 0; st == KILN_OK && i < n_kirs; i++) {
        st = load_one(s, g, &kirs[i], &rd, tail, err, n);
        if (*tail) (*tail)->scratch = mem, tail = &(*tail)->next;
    }
    if (st == KILN_OK && rd.at != rd.n) {
        snprintf(err, n, "vulkan: cache entry has trailing bytes");
        st = KILN_ERR_INVALID_ARG;
    }
    if (first) first->owns_scratch = true;
    else kiln_vk_free_mem(s, mem);
    if (st != KILN_OK) {
        kiln_vk_kernel_free(s, first);
        return st;
    }
    *out = first;
    return KILN_OK;
}

/* Results of the check per device (name and driver version) in this process. */
static pthread_mutex_t fma_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE]; uint32_t driver; bool twice; } fma_seen[8];
static int n_fma_seen;

kiln_status kiln_vk_check_fma(kiln_vk *s, char *err, size_t n)
{
    s->fma_checked = true;
    pthread_mutex_lock(&fma_lock);
    for (int i = 0; i < n_fma_seen; i++)
        if (!strcmp(fma_seen[i].name, s->props.deviceName) && fma_seen[i].driver == s->props.driverVersion) {
            s->feat.fma_f64 = fma_seen[i].twice && s->has_f64;
            pthread_mutex_unlock(&fma_lock);
            return KILN_OK;
        }
    pthread_mutex_unlock(&fma_lock);
    kiln_kir k;
    kiln_kir_init(&k, "kiln_fma_check", 32);
    uint32_t slot = kiln_kir_buf(&k, KILN_KBUF_NODE, 0, true), w[3];
    for (int i = 0; i < 3; i++)
        w[i] = kiln_kir_op(&k, KILN_KOP_BITCAST, KILN_KT_F32, kiln_kir_op(&k, KILN_KOP_LD, KILN_KT_U32, kiln_ki(&k, i), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot),
                           KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t r = kiln_kir_op(&k, KILN_KOP_FMA, KILN_KT_F32, w[0], w[1], w[2], 0);
    kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, kiln_ki(&k, 3), kiln_kir_op(&k, KILN_KOP_BITCAST, KILN_KT_U32, r, KILN_IDX_NONE, KILN_IDX_NONE, 0),
                KILN_IDX_NONE, (int32_t)slot);
    float in[4] = {1.0f + 0x1p-12f, 1.0f + 0x1p-12f, -(1.0f + 0x1p-11f), 1.0f}, out[4] = {0};
    void *mem = NULL;
    kiln_vk_kernel *kern = NULL;
    kiln_status st = kiln_vk_kernel_new(s, &k, &kern, err, n);
    if (st == KILN_OK) st = kiln_vk_alloc_mem(s, sizeof in, &mem, err, n);
    if (st == KILN_OK) st = kiln_vk_upload(s, mem, in, sizeof in, err, n);
    void *addrs[2] = {mem, mem};
    if (st == KILN_OK) st = kiln_vk_kernel_launch(s, kern, addrs, err, n);
    if (st == KILN_OK) st = kiln_vk_download_mem(s, out, mem, sizeof out, err, n);
    if (st == KILN_OK) st = kiln_vk_queue_sync(s, err, n);
    if (st == KILN_OK) {
        bool twice = out[3] != 0x1p-24f; /* 0: the product was rounded */
        s->feat.fma_f64 = twice && s->has_f64;
        pthread_mutex_lock(&fma_lock);
        if (n_fma_seen < 8) {
            snprintf(fma_seen[n_fma_seen].name, sizeof fma_seen[0].name, "%s", s->props.deviceName);
            fma_seen[n_fma_seen].driver = s->props.driverVersion;
            fma_seen[n_fma_seen++].twice = twice;
        }
        pthread_mutex_unlock(&fma_lock);
    }
    kiln_vk_kernel_free(s, kern);
    kiln_vk_free_mem(s, mem);
    kiln_kir_free(&k);
    return st;
}
