/* AVX-512 kernel table. Entries left NULL fall back to the AVX2 kernels (every AVX-512 CPU has
 * AVX2), so this file only holds kernels that gain from 512-bit vectors or VNNI.
 * Built with the AVX-512 flags: called only when cpuid says so. */
#include "backends/cpu/kern.h"

const kiln_cpu_kern kiln_cpu_kern_avx512 = {
    .mm = {NULL},
};
