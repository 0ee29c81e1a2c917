/* The Vulkan backend's error words: VkResult names and kiln_vk_fail, the one translation of a failed
 * Vulkan call into a kiln_status and its message (a lost device marks the backend's state lost).
 * Every vk_*.c file reports through it; it calls no other file of the backend, so that none of them
 * needs the device file just to fail. Must not do anything but word and classify. */
#include "backends/vulkan/vk.h"

#include <stdio.h>

const char *kiln_vk_result_name(VkResult r)
{
    switch (r) {
#define N(x) case x: return #x;
    N(VK_SUCCESS) N(VK_NOT_READY) N(VK_TIMEOUT) N(VK_EVENT_SET) N(VK_EVENT_RESET) N(VK_INCOMPLETE)
    N(VK_ERROR_OUT_OF_HOST_MEMORY) N(VK_ERROR_OUT_OF_DEVICE_MEMORY) N(VK_ERROR_INITIALIZATION_FAILED)
    N(VK_ERROR_DEVICE_LOST) N(VK_ERROR_MEMORY_MAP_FAILED) N(VK_ERROR_LAYER_NOT_PRESENT)
    N(VK_ERROR_EXTENSION_NOT_PRESENT) N(VK_ERROR_FEATURE_NOT_PRESENT) N(VK_ERROR_INCOMPATIBLE_DRIVER)
    N(VK_ERROR_TOO_MANY_OBJECTS) N(VK_ERROR_FORMAT_NOT_SUPPORTED) N(VK_ERROR_FRAGMENTED_POOL) N(VK_ERROR_UNKNOWN)
    N(VK_ERROR_OUT_OF_POOL_MEMORY) N(VK_ERROR_INVALID_EXTERNAL_HANDLE) N(VK_ERROR_FRAGMENTATION)
    N(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS) N(VK_PIPELINE_COMPILE_REQUIRED) N(VK_ERROR_INVALID_SHADER_NV)
#undef N
    default: return "VK_ERROR_(unknown)";
    }
}

kiln_status kiln_vk_fail(kiln_vk *s, VkResult r, const char *what, char *err, size_t n)
{
    if (r == VK_ERROR_DEVICE_LOST) s->lost = true;
    snprintf(err, n, "vulkan: %s: %s (%d)%s", what, kiln_vk_result_name(r), (int)r,
             r == VK_ERROR_DEVICE_LOST ? "; the device is lost: recreate the context to use it again" : "");
    return r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? KILN_ERR_NOMEM : KILN_ERR_BACKEND;
}
