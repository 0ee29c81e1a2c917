/* The backend registry: every backend kiln knows, indexed by enum kiln_backend_id (declared in
 * the interface, sched/backend.h). Each backend's probe says what was found, or why it cannot
 * run, so `kiln info` tells the truth. Must hold nothing but the table. */
#include "sched/backend.h"

const kiln_backend_i *const kiln_backends[KILN_BACKEND_COUNT] = {
    [KILN_BACKEND_REF] = &kiln_backend_ref,
    [KILN_BACKEND_CPU] = &kiln_backend_cpu,
    [KILN_BACKEND_CUDA] = &kiln_backend_cuda,
    [KILN_BACKEND_VULKAN] = &kiln_backend_vulkan,
};
