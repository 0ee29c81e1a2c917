/* The lowering target: what the lowering needs to know about the device a kernel is written for
 * (filled by each GPU backend at probe, or kiln_lower_target_default for listings), plus the
 * code-generation choices of the compile options. Backend-neutral lowering reads device facts only
 * from here. Must not name any backend or driver. */
#pragma once

#include "kiln/kiln.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_lower_target {
    uint32_t sm_count;   /* multiprocessors / compute units: the GEMM takes 128-token blocks with at
                            least 2 blocks on each, attention splits keys until ~8 one-warp blocks
                            run on each (H100: 132) */
    uint32_t busy_warps; /* warps that keep a GPU's memory streaming: gemv splits K inside a block until
                            a matrix has this many (4096; an H100 holds 8448) */
    uint32_t grid_max;   /* most blocks of a grid-stride kernel's grid: its loop covers the rest (4096) */
    uint32_t smem_bytes; /* static shared memory one kernel may use (32768: every Vulkan device has it) */
    uint32_t warp;       /* threads of a warp / subgroup the kernels are written for: 32 */
    bool     mma;        /* KILN_KOP_MMA is worth using (printers emulate it where the device lacks it) */
    bool     mma_native; /* MMA runs on the device's tensor cores (cuda): the printer takes no shared memory
                            for it and a kernel may declare up to 48 KiB of static shared memory (else the
                            GLSL emulation takes 24 bytes a thread of smem_bytes) */
    bool     dp4a;       /* KILN_KOP_DP4A is worth using (likewise) */
    bool     wgmma;      /* Hopper warpgroup MMA (sm_90a) */
    bool     griddep;    /* programmatic dependent launch (PTX griddepcontrol, sm_90): kernels take part
                            when the options ask for it (kiln_lower_target_pdl) */
    kiln_codegen_options opts; /* the compile's choices (gemm, gemm_rows; zero: defaults) */
} kiln_lower_target;

/* The target kiln_ptx / kiln spirv listings and the golden test use: an H100's numbers, every
 * instruction worth using but wgmma, default choices. GPU backends start from it at probe. */
kiln_lower_target kiln_lower_target_default(void);
/* The default target for PTX of sm (80..90): warpgroup MMA on sm_90 (sm_90a PTX). */
kiln_lower_target kiln_lower_target_for_sm(int sm);
/* Blocks a backend launches for a grid-stride kernel (kir.grid_stride) over n virtual blocks: cap
 * (kiln_codegen_options.grid_cap) N > 0 caps them at N, -1 launches every virtual block (for
 * comparisons); 0: as many as the device holds at once (resident; 0 when unknown). Never more than
 * limit (the device's grid bound). Launch policy of the kernels the lowering writes. */
uint32_t kiln_stride_blocks(uint32_t n, uint64_t resident, uint32_t limit, int32_t cap);
/* Whether kernels for t are lowered for programmatic dependent launch: the device has it and the
 * options turn it on (codegen.pdl = KILN_GEMM_ON; opt-in until measured on the H100). */
bool kiln_lower_target_pdl(const kiln_lower_target *t);
/* Shared bytes a kernel of `threads` threads may declare: smem_bytes less what a printer adds beside
 * the kernel's own arrays (the GLSL printer's REDUCE scratch, 4 bytes a thread, where the device
 * has no native MMA: vulkan; the vulkan backend refuses a kernel past the device's limit). */
uint32_t kiln_lower_smem_for(const kiln_lower_target *t, uint32_t threads);
/* t with the code-generation choices of o (NULL: defaults). */
kiln_lower_target kiln_lower_target_with(const kiln_lower_target *t, const kiln_codegen_options *o);
