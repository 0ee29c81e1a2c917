/* The Vulkan backend's device: instance (Vulkan 1.1+), device choice (discrete GPU first, or
 * KILN_VK_DEVICE=index|name), optional features probed for the GLSL printer, the default profile,
 * and the backend table. Must not record commands (vk_queue.c) nor manage buffers (vk_memory.c),
 * pipelines (vk_kernel.c) or word errors (vk_error.c). */
#include "util/env.h"
#include "backends/vulkan/vk.h"
#include "sched/ctx.h"
#include "util/fault.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One instance per process, never destroyed: destroying it unloads the driver, and drivers keep
 * allocations in their globals (lavapipe does) that then show as leaks to LeakSanitizer. Devices
 * are per context. */
static pthread_once_t instance_once = PTHREAD_ONCE_INIT;
static VkInstance     instance;        /* the process's instance, or VK_NULL_HANDLE */
static VkResult       instance_result; /* why not */
static uint32_t       instance_api;    /* the Vulkan version the instance was made for */

static void create_instance(void)
{
    uint32_t loader = VK_API_VERSION_1_0;
    vkEnumerateInstanceVersion(&loader);
    if (loader < VK_API_VERSION_1_1) {
        instance_result = VK_ERROR_INCOMPATIBLE_DRIVER;
        return;
    }
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "kiln", .pEngineName = "kiln",
                             .apiVersion = loader >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : loader};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    instance_api = app.apiVersion;
    instance_result = vkCreateInstance(&ici, NULL, &instance);
    if (instance_result != VK_SUCCESS) instance = VK_NULL_HANDLE;
}

static const char *type_name(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

static int type_rank(VkPhysicalDeviceType t) /* lower is preferred */
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
    }
}

static bool has_ext(VkPhysicalDevice p, const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(p, NULL, &n, NULL) != VK_SUCCESS || !n) return false;
    VkExtensionProperties *e = calloc(n, sizeof *e);
    bool found = false;
    if (e && vkEnumerateDeviceExtensionProperties(p, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

static int compute_family(VkPhysicalDevice p)
{
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(p, &n, NULL);
    VkQueueFamilyProperties q[16];
    if (n > 16) n = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(p, &n, q);
    for (uint32_t i = 0; i < n; i++)
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return (int)i;
    return -1;
}

/* Picks the device: KILN_VK_DEVICE (index or name substring), else the best type with Vulkan 1.1
 * and a compute queue. Writes the device list into detail. */
static int choose(VkPhysicalDevice *devs, uint32_t n, char *list, size_t n_list, char *why, size_t n_why)
{
    const char *want = kiln_env(KILN_ENV_VK_DEVICE);
    int best = -1, best_rank = 99;
    size_t l = 0;
    list[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(devs[i], &p);
        int w = snprintf(list + l, n_list - l, "%s%u %s (%s)", i ? ", " : "", i, p.deviceName, type_name(p.deviceType));
        if (w > 0 && (size_t)w < n_list - l) l += (size_t)w;
        bool usable = p.apiVersion >= VK_API_VERSION_1_1 && compute_family(devs[i]) >= 0;
        if (want && *want) {
            char *end;
            long idx = strtol(want, &end, 10);
            bool match = *end == 0 ? idx == (long)i : strstr(p.deviceName, want) != NULL;
            if (match && best < 0) {
                if (!usable) snprintf(why, n_why, "KILN_VK_DEVICE=%s names %.64s, which lacks Vulkan 1.1 or a compute queue", want, p.deviceName);
                else best = (int)i;
            }
            continue;
        }
        if (usable && type_rank(p.deviceType) < best_rank) {
            best = (int)i;
            best_rank = type_rank(p.deviceType);
        }
    }
    if (best < 0 && !why[0])
        snprintf(why, n_why, want && *want ? "KILN_VK_DEVICE=%s matches no device" : "no device has Vulkan 1.1 and a compute queue%s",
                 want && *want ? want : "");
    return best;
}

/* Probes the optional features and creates the device with them enabled. */
static VkResult create_device(kiln_vk *s)
{
    bool ext_dot = has_ext(s->phys, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME) ;
    bool v13 = s->props.apiVersion >= VK_API_VERSION_1_3;
    bool ext_sc = (v13 || has_ext(s->phys, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME)) ;
    bool v12 = s->props.apiVersion >= VK_API_VERSION_1_2 && instance_api >= VK_API_VERSION_1_2 && /* timeline semaphores are core */
               !kiln_fault("vk_no_timeline"); /* test-only */
    VkPhysicalDeviceTimelineSemaphoreFeatures tl = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES};
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT sc = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
    VkPhysicalDevice16BitStorageFeatures st16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &st16};
    void **tail = &st16.pNext;
    if (ext_dot) *tail = &dot, tail = &dot.pNext;
    if (ext_sc) *tail = &sc, tail = &sc.pNext;
    if (v12) *tail = &tl, tail = &tl.pNext;
    vkGetPhysicalDeviceFeatures2(s->phys, &f2);

    VkPhysicalDeviceSubgroupSizeControlPropertiesEXT scp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, .pNext = ext_sc ? &scp : NULL};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(s->phys, &p2);

    /* what is enabled: only what is used */
    VkPhysicalDevice16BitStorageFeatures en16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
                                                .storageBuffer16BitAccess = st16.storageBuffer16BitAccess};
    s->feat.storage16 = en16.storageBuffer16BitAccess;
    s->target = kiln_lower_target_default(); /* Vulkan does not say how many compute units: the H100's numbers */
    VkPhysicalDeviceFeatures2 en_f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &en16};
    en_f2.features.shaderFloat64 = f2.features.shaderFloat64; /* for FMA where fma() rounds twice */
    s->has_f64 = f2.features.shaderFloat64;
    void *chain = &en_f2;
    const char *exts[2];
    uint32_t n_ext = 0;
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR en_dot = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
    if (ext_dot && dot.shaderIntegerDotProduct) {
        en_dot.shaderIntegerDotProduct = VK_TRUE;
        en_dot.pNext = chain;
        chain = &en_dot;
        exts[n_ext++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
        s->feat.int_dot = true;
    }
    bool sg_ok = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                 (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT en_sc = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
    if (sg_ok && ext_sc && sc.subgroupSizeControl && sc.computeFullSubgroups &&
        (scp.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) && sg.subgroupSize >= scp.minSubgroupSize &&
        sg.subgroupSize <= scp.maxSubgroupSize) {
        en_sc.subgroupSizeControl = en_sc.computeFullSubgroups = VK_TRUE;
        en_sc.pNext = chain;
        chain = &en_sc;
        if (!v13) exts[n_ext++] = VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME;
        s->size_control = true;
    }
    /* the subgroup size of a dispatch is known when pipelines can require it, or when it cannot vary */
    if (sg_ok && (s->size_control || (ext_sc && scp.minSubgroupSize == scp.maxSubgroupSize))) {
        s->feat.subgroup_size = sg.subgroupSize;
        s->feat.subgroup_arith = true;
        s->feat.subgroup_clustered = (sg.supportedOperations & VK_SUBGROUP_FEATURE_CLUSTERED_BIT) != 0;
    }
    VkPhysicalDeviceTimelineSemaphoreFeatures en_tl = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES};
    if (v12 && tl.timelineSemaphore) { /* kiln_run_async's kiln_vk_sync may name timeline values */
        en_tl.timelineSemaphore = VK_TRUE;
        en_tl.pNext = chain;
        chain = &en_tl;
        s->timeline = true;
    }
    float prio = 1.0f;
    VkDeviceQueueCreateInfo q = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = s->queue_family,
                                 .queueCount = 1, .pQueuePriorities = &prio};
    VkDeviceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = chain, .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &q, .enabledExtensionCount = n_ext, .ppEnabledExtensionNames = exts};
    return vkCreateDevice(s->phys, &ci, NULL, &s->dev);
}

static void driver_info(kiln_vk *s)
{
    snprintf(s->driver, sizeof s->driver, "driver %u.%u.%u", VK_API_VERSION_MAJOR(s->props.driverVersion),
             VK_API_VERSION_MINOR(s->props.driverVersion), VK_API_VERSION_PATCH(s->props.driverVersion));
    if (s->props.apiVersion < VK_API_VERSION_1_2 && !has_ext(s->phys, VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME)) return;
    VkPhysicalDeviceDriverProperties d = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &d};
    vkGetPhysicalDeviceProperties2(s->phys, &p2);
    snprintf(s->driver, sizeof s->driver, "%.60s %.60s", d.driverName, d.driverInfo);
}

static void vk_release(void *state)
{
    kiln_vk *s = state;
    if (!s) return;
    if (s->dev) {
        vkDeviceWaitIdle(s->dev);
        kiln_vk_queue_release(s);
        kiln_vk_memory_release(s);
        vkDestroyDevice(s->dev, NULL);
    }
    kiln_lower_memo_clear(&s->memo);
    free(s);
}

static kiln_status vk_probe(kiln_ctx *ctx, void **state, char *detail, size_t n)
{
    (void)ctx;
    *state = NULL;
    pthread_once(&instance_once, create_instance);
    if (!instance) {
        snprintf(detail, n, "no Vulkan 1.1 driver (vkCreateInstance: %s)", kiln_vk_result_name(instance_result));
        return KILN_ERR_UNSUPPORTED;
    }
    kiln_vk *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->staging = s->gate = s->parked = UINT32_MAX;
    s->instance = instance;
    VkResult r;
    uint32_t nd = 0;
    VkPhysicalDevice devs[16];
    r = vkEnumeratePhysicalDevices(s->instance, &nd, NULL);
    if (nd > 16) nd = 16;
    if (r == VK_SUCCESS && nd) r = vkEnumeratePhysicalDevices(s->instance, &nd, devs);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || !nd) {
        snprintf(detail, n, "no Vulkan device%s%s", r != VK_SUCCESS ? ": " : "", r != VK_SUCCESS ? kiln_vk_result_name(r) : "");
        vk_release(s);
        return KILN_ERR_UNSUPPORTED;
    }
    char list[160], why[160] = "";
    int pick = choose(devs, nd, list, sizeof list, why, sizeof why);
    if (pick < 0) {
        snprintf(detail, n, "%s; devices: %s", why, list);
        vk_release(s);
        return KILN_ERR_UNSUPPORTED;
    }
    s->phys = devs[pick];
    vkGetPhysicalDeviceProperties(s->phys, &s->props);
    vkGetPhysicalDeviceMemoryProperties(s->phys, &s->mem_props);
    s->queue_family = (uint32_t)compute_family(s->phys);
    driver_info(s);
    r = create_device(s);
    if (r != VK_SUCCESS) {
        snprintf(detail, n, "%s: vkCreateDevice: %s", s->props.deviceName, kiln_vk_result_name(r));
        s->dev = VK_NULL_HANDLE;
        vk_release(s);
        return KILN_ERR_UNSUPPORTED;
    }
    vkGetDeviceQueue(s->dev, s->queue_family, 0, &s->queue);
    char err[256];
    if (kiln_vk_queue_init(s, err, sizeof err) != KILN_OK) {
        snprintf(detail, n, "%s: %s", s->props.deviceName, err);
        vk_release(s);
        return KILN_ERR_UNSUPPORTED;
    }
    char feats[128];
    snprintf(feats, sizeof feats, "%s%s subgroup %u%s", s->feat.storage16 ? "16-bit storage, " : "",
             s->feat.int_dot ? "int dot," : "", s->feat.subgroup_size, s->feat.subgroup_size ? "" : " (unknown: shared-memory reductions)");
    snprintf(detail, n, "%s (%s, %s, Vulkan %u.%u; %s) of devices: %s", s->props.deviceName, type_name(s->props.deviceType),
             s->driver, VK_API_VERSION_MAJOR(s->props.apiVersion), VK_API_VERSION_MINOR(s->props.apiVersion), feats, list);
    *state = s;
    return KILN_OK;
}

static void vk_profile(void *state, kiln_device_profile *out)
{
    kiln_vk *s = state;
    VkDeviceSize heap = 0;
    for (uint32_t i = 0; i < s->mem_props.memoryHeapCount; i++)
        if (s->mem_props.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT && s->mem_props.memoryHeaps[i].size > heap)
            heap = s->mem_props.memoryHeaps[i].size;
    double peak;
    switch (s->props.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: /* scaled by memory: small boards are slow boards */
        *out = (kiln_device_profile){.mem_bw = heap >= (16ull << 30) ? 800e9 : 300e9, .launch_s = 4e-6, .h2d_bw = 12e9,
                                     .d2h_bw = 12e9, .xfer_latency_s = 10e-6};
        peak = heap >= (16ull << 30) ? 30e12 : 8e12;
        break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
        *out = (kiln_device_profile){.mem_bw = 50e9, .launch_s = 8e-6, .h2d_bw = 20e9, .d2h_bw = 20e9, .xfer_latency_s = 10e-6};
        peak = 1e12;
        break;
    default: /* lavapipe and other CPU devices: slower than kiln's own CPU kernels in every respect, so
                automatic placement never picks them; they run only when pinned or forced */
        *out = (kiln_device_profile){.mem_bw = 2e9, .launch_s = 50e-6, .h2d_bw = 2e9, .d2h_bw = 2e9, .xfer_latency_s = 50e-6};
        peak = 5e9;
    }
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) out->peak_flops[t] = peak;
}

/* A region runs here when the lowering has a template for it; the lowering is kept for compile()
 * of the same region (a cold compile then lowers each region once). */
static bool vk_supports(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o, char *why,
                        size_t n_why)
{
    kiln_vk *s = state;
    if (s->lost) {
        kiln_vk_fail(s, VK_ERROR_DEVICE_LOST, "compile", why, n_why); /* the lost device's text */
        return false;
    }
    kiln_kir k[KILN_LOWER_MAX];
    uint32_t nk = 0;
    kiln_lower_target t = kiln_lower_target_with(&s->target, &o->codegen);
    bool ok = kiln_lower_region_for(g, r, &t, k, &nk, why, n_why) == KILN_OK;
    if (ok) kiln_lower_memo_put(&s->memo, g, r, &o->codegen, k, NULL, nk);
    return ok;
}

static kiln_status vk_compile(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                              kiln_kernel **out, char *err, size_t n)
{
    kiln_vk *s = state;
    *out = NULL;
    kiln_kir k[KILN_LOWER_MAX];
    uint32_t nk = 0;
    kiln_lower_target t = kiln_lower_target_with(&s->target, &o->codegen);
    kiln_status st = kiln_lower_memo_take(&s->memo, g, r, &o->codegen, k, NULL, &nk) ? KILN_OK
                                                                                     : kiln_lower_region_for(g, r, &t, k, &nk, err, n);
    if (st != KILN_OK) return st;
    s->cg = o->codegen;
    st = kiln_vk_kernel_new_seq(s, k, nk, (kiln_vk_kernel **)out, err, n);
    s->cg = (kiln_codegen_options){0};
    for (uint32_t i = 0; i < nk; i++) kiln_kir_free(&k[i]);
    return st;
}

static void vk_kernel_free(void *state, kiln_kernel *k) { kiln_vk_kernel_free(state, (kiln_vk_kernel *)k); }

/* The device, its driver, and what the GLSL printer may use on it (after the FMA check, which
 * changes the printed code). */
static void vk_identity(void *state, char *buf, size_t n)
{
    kiln_vk *s = state;
    char err[256];
    if (!s->fma_checked && !s->recording && !s->lost) kiln_vk_check_fma(s, err, sizeof err);
    const uint8_t *u = s->props.pipelineCacheUUID;
    const kiln_spv_features *f = &s->feat;
    snprintf(buf, n,
             "vulkan %s %04x:%04x driver %u api %u uuid %02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x "
             "feat %d%d%u%d%d%d size_control %d",
             s->props.deviceName, s->props.vendorID, s->props.deviceID, s->props.driverVersion, s->props.apiVersion, u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15], f->storage16, f->int_dot,
             f->subgroup_size, f->subgroup_arith, f->subgroup_clustered, f->fma_f64, s->size_control);
}

static kiln_status vk_kernel_save(void *state, const kiln_kernel *k, void **out, size_t *len)
{
    return kiln_vk_kernel_save(state, (const kiln_vk_kernel *)k, out, len);
}

static kiln_status vk_kernel_load(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                                  const void *buf, size_t len, kiln_kernel **out, char *err, size_t n)
{
    kiln_vk *s = state;
    kiln_kir k[KILN_LOWER_MAX]; /* the region's lowering, to check the entry against: cheap next to GLSL and glslang */
    uint32_t nk = 0;
    kiln_lower_target t = kiln_lower_target_with(&s->target, &o->codegen); /* as vk_compile lowers */
    kiln_status st = kiln_lower_region_for(g, r, &t, k, &nk, err, n);
    s->cg = o->codegen;
    if (st == KILN_OK) st = kiln_vk_kernel_load(s, g, k, nk, buf, len, (kiln_vk_kernel **)out, err, n);
    s->cg = (kiln_codegen_options){0};
    for (uint32_t i = 0; i < nk; i++) kiln_kir_free(&k[i]);
    return st;
}

static kiln_status vk_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v, char *err, size_t n)
{
    (void)r;
    if (!k) {
        snprintf(err, n, "vulkan: launch without a compiled kernel");
        return KILN_ERR_INTERNAL;
    }
    return kiln_vk_kernel_launch_view(state, (const kiln_vk_kernel *)k, v, err, n);
}

const kiln_backend_i kiln_backend_vulkan = {
    .name = "vulkan",
    .probe = vk_probe,
    .release = vk_release,
    .supports = vk_supports,
    .profile = vk_profile,
    .compile = vk_compile,
    .kernel_free = vk_kernel_free,
    .identity = vk_identity,
    .kernel_save = vk_kernel_save,
    .kernel_load = vk_kernel_load,
    .weight_bytes = kiln_lower_weight_dev_bytes,
    .weight_repack = kiln_lower_weight_dev_repack,
    .launch = vk_launch,
    .alloc = kiln_vk_alloc_mem,
    .mem_info = kiln_vk_mem_info,
    .free = kiln_vk_free_mem,
    .upload = kiln_vk_upload,
    .download = kiln_vk_download_mem,
    .copy = kiln_vk_copy,
    .sync = kiln_vk_queue_sync,
    .record_begin = kiln_vk_record_begin,
    .record_end = kiln_vk_record_end,
    .replay = kiln_vk_replay,
    .record_free = kiln_vk_record_free,
    .timer_mark = kiln_vk_timer_mark,
    .timer_read = kiln_vk_timer_read,
    .join_wait = kiln_vk_join_wait,
    .join_signal = kiln_vk_join_signal,
    .join_semaphores = true,
    .wait_steps = kiln_vk_wait_steps,
    .staging_bytes = kiln_vk_staging_bytes,
};

KILN_API kiln_status kiln_ctx_vulkan(kiln_ctx *ctx, kiln_vk_device *out)
{
    if (!ctx || !out) return ctx ? kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_ctx_vulkan: NULL argument") : KILN_ERR_INVALID_ARG;
    *out = (kiln_vk_device){0};
    const kiln_vk *s = ctx->be_state[KILN_BACKEND_VULKAN];
    if (!ctx->be_ok[KILN_BACKEND_VULKAN] || !s)
        return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "kiln_ctx_vulkan: no vulkan backend: %s", ctx->be_detail[KILN_BACKEND_VULKAN]);
    *out = (kiln_vk_device){.instance = s->instance, .physical_device = s->phys, .device = s->dev, .queue = s->queue,
                            .queue_family = s->queue_family, .api_version = s->props.apiVersion, .timeline = s->timeline};
    return KILN_OK;
}

KILN_API void kiln_vk_queue_lock(kiln_ctx *ctx, bool lock)
{
    if (!ctx || !ctx->be_ok[KILN_BACKEND_VULKAN] || !ctx->be_state[KILN_BACKEND_VULKAN]) return;
    if (lock) pthread_mutex_lock(&ctx->be_mu[KILN_BACKEND_VULKAN]);
    else pthread_mutex_unlock(&ctx->be_mu[KILN_BACKEND_VULKAN]);
}

/* The context's vulkan state with its device lock taken, or NULL with the error set. */
static kiln_vk *locked_vk(kiln_ctx *ctx, const char *call)
{
    if (!ctx->be_ok[KILN_BACKEND_VULKAN] || !ctx->be_state[KILN_BACKEND_VULKAN]) {
        kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "%s: no vulkan backend: %s", call, ctx->be_detail[KILN_BACKEND_VULKAN]);
        return NULL;
    }
    pthread_mutex_lock(&ctx->be_mu[KILN_BACKEND_VULKAN]);
    return ctx->be_state[KILN_BACKEND_VULKAN];
}

KILN_API kiln_status kiln_vk_buffer_register(kiln_ctx *ctx, uint64_t buffer, uint64_t bytes, void **addr)
{
    if (!ctx || !addr) return ctx ? kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_vk_buffer_register: NULL argument") : KILN_ERR_INVALID_ARG;
    *addr = NULL;
    kiln_vk *s = locked_vk(ctx, "kiln_vk_buffer_register");
    if (!s) return KILN_ERR_UNSUPPORTED;
#if VK_USE_64_BIT_PTR_DEFINES
    VkBuffer buf = (VkBuffer)(uintptr_t)buffer;
#else
    VkBuffer buf = (VkBuffer)buffer;
#endif
    char err[256] = "";
    uint32_t id;
    kiln_status st = kiln_vk_buffer_borrow(s, buf, bytes, &id, err, sizeof err);
    if (st == KILN_OK) *addr = kiln_vk_encode(id, 0);
    pthread_mutex_unlock(&ctx->be_mu[KILN_BACKEND_VULKAN]);
    return st == KILN_OK ? st : kiln_ctx_fail(ctx, st, "kiln_vk_buffer_register: %s", err);
}

KILN_API kiln_status kiln_vk_buffer_unregister(kiln_ctx *ctx, void *addr)
{
    if (!ctx) return KILN_ERR_INVALID_ARG;
    kiln_vk *s = locked_vk(ctx, "kiln_vk_buffer_unregister");
    if (!s) return KILN_ERR_UNSUPPORTED;
    uint32_t id;
    VkDeviceSize off;
    char err[256] = "";
    kiln_status st = KILN_OK;
    if (!kiln_vk_decode(s, addr, &id, &off) || off || !s->allocs[id].borrowed) {
        snprintf(err, sizeof err, "%p is not the address of a registered buffer", addr);
        st = KILN_ERR_INVALID_ARG;
    } else {
        if (s->cur.n_cmds || s->submitted) st = kiln_vk_queue_sync(s, err, sizeof err); /* it may be in use */
        kiln_vk_buffer_free(s, id); /* forgotten either way: the caller destroys it next */
    }
    pthread_mutex_unlock(&ctx->be_mu[KILN_BACKEND_VULKAN]);
    return st == KILN_OK ? st : kiln_ctx_fail(ctx, st, "kiln_vk_buffer_unregister: %s", err);
}
