/* src/spirv: GLSL 450 compute source printed from kir kernels (glsl.c) and its compilation to
 * SPIR-V 1.3 words for Vulkan 1.1 through glslang's C interface (compile.c). Knows nothing about
 * Vulkan objects: the backend probes the device and says which optional features may be used. */
#pragma once

#include "codegen/kir.h"
#include "kiln/kiln.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Optional device features the printer may use; each has a fallback when false/0. */
typedef struct kiln_spv_features {
    bool     storage16;          /* storageBuffer16BitAccess: ST16 stores halves (else atomics on the word) */
    bool     int_dot;            /* VK_KHR_shader_integer_dot_product: DP4A by dotPacked4x8EXT (else bytes) */
    uint32_t subgroup_size;      /* fixed subgroup size of compute dispatches, 0 when not known */
    bool     subgroup_arith;     /* subgroupAdd/Max in compute (with subgroup_size: REDUCE uses them) */
    bool     subgroup_clustered; /* subgroupClusteredAdd/Max: REDUCE over groups smaller than a subgroup */
    bool     fma_f64;            /* the device's fma() rounds twice (lavapipe): FMA goes through doubles */
} kiln_spv_features;

/* Words of the push-constant block every kernel takes: the base word offset of each buffer slot. */
#define KILN_SPV_PUSH_WORDS KILN_KIR_MAX_BUFS

/* Prints kernel k as GLSL 450 compute source (malloc'ed into *out, NUL-terminated). The same
 * kernel and features always give the same text. Buffer slot i is set 0 binding i (a uint array);
 * push constant word i is added to every word index into slot i. KILN_ERR_UNSUPPORTED naming the
 * op for an instruction the printer does not take; KILN_ERR_INVALID_ARG when k fails kir's verifier. */
kiln_status kiln_spv_glsl(const kiln_kir *k, const kiln_spv_features *f, char **out, char *err, size_t n);

/* Compiles GLSL compute source to SPIR-V 1.3 (Vulkan 1.1 target); *words is malloc'ed. On failure
 * err holds glslang's log and the offending source line. KILN_ERR_UNSUPPORTED when kiln was built
 * without glslang. Thread-safe. */
kiln_status kiln_spv_compile(const char *glsl, uint32_t **words, size_t *n_words, char *err, size_t n);
