/* Test-only fault injection: kernels and backends ask kiln_fault("name") and, when the environment
 * variable KILN_FAULT_INJECT lists that name (comma-separated), compute a deliberately wrong result
 * or fail as the driver would, so the conformance harness (kiln check, tests/test_check.c) can
 * prove that it catches a wrong kernel and the fault tests that errors stay clear and contained.
 * Unset (always, outside those tests) it costs one getenv (util/env.c). Must not be used for anything else. */
#pragma once

#include "util/env.h"

#include <stdbool.h>
#include <string.h>

/* Faults kernels know: "cpu_softmax_off_by_one" (the last element of each row left out of the
 * sum), "cpu_rms_norm_scale" (the result scaled by 1.001), "cpu_rms_norm_nan_late" (every call after the
 * process's first stores a NaN at element 0), "cpu_attn_window_wide" (attention windows one key wider). Faults of the Vulkan backend that a test
 * cannot cause on demand (tests/test_faults.c): "vk_glsl_error" (every generated shader gets a line
 * glslang rejects), "vk_device_lost" (queue submissions fail with VK_ERROR_DEVICE_LOST),
 * "vk_no_timeline" (the device is made without timeline semaphores, as a Vulkan 1.1 device is). */
static inline bool kiln_fault(const char *name)
{
    const char *e = kiln_env(KILN_ENV_FAULT_INJECT);
    if (!e) return false;
    size_t n = strlen(name);
    for (const char *p = strstr(e, name); p; p = strstr(p + 1, name))
        if ((p == e || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}
