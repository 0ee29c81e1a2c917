/* The backend registry: every backend kiln knows, indexed by enum kiln_backend_id. Each backend's
 * probe says what was found, or why it cannot run, so `kiln info` tells the truth. */
#include "sched/backend.h"

#include <stdlib.h>

const kiln_backend_i *const kiln_backends[KILN_BACKEND_COUNT] = {
    [KILN_BACKEND_REF] = &kiln_backend_ref,
    [KILN_BACKEND_CPU] = &kiln_backend_cpu,
    [KILN_BACKEND_CUDA] = &kiln_backend_cuda,
    [KILN_BACKEND_VULKAN] = &kiln_backend_vulkan,
};

uint32_t kiln_stride_blocks(uint32_t n, uint64_t resident, uint32_t limit, int32_t cap)
{
    if (cap > 0) {
        if ((uint32_t)cap < n) n = (uint32_t)cap;
    } else if (cap == 0 && resident > 0 && resident < n) {
        n = (uint32_t)resident;
    }
    return n < limit ? n : limit;
}
