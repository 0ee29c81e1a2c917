/* The Vulkan backend's kernels: a kir kernel printed to GLSL, compiled by glslang, made a compute
 * pipeline (one storage buffer binding per slot, slot offsets in push constants), its constant
 * tables uploaded once; launches bind whole allocations through cached descriptor sets (never
 * updated once made, so recorded command buffers stay valid). Must not submit work. */
#include "backends/vulkan/vk.h"
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
};

const char *kiln_vk_kernel_glsl(const kiln_vk_kernel *k) { return k->glsl; }

void kiln_vk_kernel_free(kiln_vk *s, kiln_vk_kernel *k)
{
    if (!k) return;
    kiln_vk_kernel_free(s, k->next);
    if (k->owns_scratch) kiln_vk_free_mem(s, k->scratch);
    if (s->submitted || s->cur.n_cmds) { /* it may be in flight */
        char err[256];
        kiln_vk_sync(s, err, sizeof err);
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
    free(k);
}

static bool uses_reduce(const kiln_kir *k)
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_REDUCE) return true;
    return false;
}

static kiln_status make_pipeline(kiln_vk *s, const kiln_kir *kir, kiln_vk_kernel *k, const uint32_t *words, size_t n_words,
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
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT, .requiredSubgroupSize = s->feat.subgroup_size};
    bool pin = s->size_control && s->feat.subgroup_size && kir->block % s->feat.subgroup_size == 0 && uses_reduce(kir);
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
    *out = NULL;
    if (s->lost) return kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "compile", err, n);
    if (!s->fma_checked && !s->recording) {
        kiln_status st = kiln_vk_check_fma(s, err, n);
        if (st != KILN_OK) return st;
    }
    const VkPhysicalDeviceLimits *lim = &s->props.limits;
    if (kir->block > lim->maxComputeWorkGroupInvocations || kir->block > lim->maxComputeWorkGroupSize[0]) {
        snprintf(err, n, "vulkan: kernel %s has %u threads per block, %s takes %u", kir->name, kir->block, s->props.deviceName,
                 lim->maxComputeWorkGroupInvocations);
        return KILN_ERR_UNSUPPORTED;
    }
    for (int d = 0; d < 3; d++)
        if (kir->grid[d] > lim->maxComputeWorkGroupCount[d] || !kir->grid[d]) {
            snprintf(err, n, "vulkan: kernel %s grid[%d] = %u, %s takes 1..%u", kir->name, d, kir->grid[d], s->props.deviceName,
                     lim->maxComputeWorkGroupCount[d]);
            return KILN_ERR_UNSUPPORTED;
        }
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
    kiln_status st = kiln_spv_glsl(kir, &s->feat, &k->glsl, err, n);
    if (st == KILN_OK && kiln_fault("vk_glsl_error")) st = inject_glsl_error(&k->glsl, err, n); /* test-only */
    uint32_t *words = NULL;
    size_t n_words = 0;
    if (st == KILN_OK) st = kiln_spv_compile(k->glsl, &words, &n_words, err, n);
    if (st == KILN_OK) st = make_pipeline(s, kir, k, words, n_words, err, n);
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
    for (uint32_t i = 0; st == KILN_OK && i < n_kirs; i++) {
        st = kiln_vk_kernel_new(s, &kirs[i], tail, err, n);
        if (st != KILN_OK) break;
        (*tail)->scratch = mem;
        tail = &(*tail)->next;
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
    if (st == KILN_OK) st = kiln_vk_sync(s, err, n);
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
