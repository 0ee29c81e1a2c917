/* PTX for NVIDIA GPUs: the printer of kir kernels (print.c), a static summary of what a kernel
 * touches, and a helper that finds and runs ptxas to assemble printed PTX and read its register,
 * spill and shared-memory report (ptxas.c, for tests and `kiln ptx`). Must not call the CUDA
 * driver: src/backends/cuda loads what is printed here. */
#pragma once

#include "codegen/kir.h"
#include "kiln/kiln.h"

#include <stddef.h>
#include <stdint.h>

/* Static counts of one printed kernel (instructions in the text, not executions). */
typedef struct kiln_ptx_stats {
    uint32_t ld32;         /* 4-byte global loads (ld.global.u32) */
    uint32_t ld128;        /* 16-byte global loads (ld.global.v4.u32) */
    uint32_t ld_nc;        /* global loads through the read-only path (.nc), of ld32 + ld128 */
    uint32_t st32;         /* 4-byte global stores */
    uint32_t st16;         /* 2-byte global stores */
    uint32_t st128;        /* 16-byte global stores (st.global.v4.u32) */
    uint32_t loop_loads;   /* global loads inside at least one loop */
    uint32_t lds, sts;     /* shared-memory loads and stores (reductions' own included) */
    uint32_t barriers;     /* bar.sync (reductions' own included) */
    uint32_t shuffles;     /* shfl.sync (reductions) */
    uint32_t reduces;      /* REDUCE instructions */
    uint32_t mmas;         /* mma.sync instructions */
    uint32_t loops;        /* LOOP instructions */
    uint32_t max_depth;    /* deepest loop/if nesting */
    uint32_t ifs;          /* IF instructions */
    uint32_t f32_ops;      /* f32 arithmetic and math instructions (fma counted once) */
    uint32_t int_ops;      /* integer arithmetic and bit instructions (dp4a counted once) */
    uint32_t params;       /* distinct parameter-buffer slots read */
    uint32_t shared_bytes; /* static shared memory: the kernel's arrays plus reduction scratch */
    uint32_t dyn_shared_bytes; /* dynamic shared memory (kiln_kir.dyn_shared): the launch asks for it */
} kiln_ptx_stats;

/* Static shared memory a kernel may declare (sm_80 and sm_90 without the dynamic opt-in). */
#define KILN_PTX_MAX_STATIC_SHARED 49152
#define KILN_PTX_MAX_DYN_SHARED 232448 /* sm_90: 227 KB a block (opt-in above 48 KB) */

/* Register policy of a printed entry. By default it says only `.maxntid block`: ptxas then caps
 * registers so that several blocks share an SM (a decode gemv: about 60 registers, 4 blocks),
 * which can spill a heavy kernel. KILN_PTX_ALL_REGISTERS adds `.minnctapersm 1` (up to 255, or
 * 65536 / block): for kernels that spilled under the default (print, assemble, look, reprint).
 * A kernel's own min_blocks (kir) adds `.minnctapersm min_blocks` when the flag is not given (1:
 * a kernel whose setmaxnreg needs the entry's register count known, else the JIT ignores it). */
enum { KILN_PTX_ALL_REGISTERS = 1 };

/* Prints kernel k as one PTX module for sm (80 or 90): `.version 8.0`, one `.entry` named k->name
 * with one `.param .u64` per buffer slot (in slot order). *out_text is malloc'd (caller frees).
 * The same kernel, sm and flags always give the same bytes. Verifies k first;
 * KILN_ERR_UNSUPPORTED with err naming the reason for what the printer cannot express (an unknown
 * op, too much shared memory). stats may be NULL. */
kiln_status kiln_ptx_print_ex(const kiln_kir *k, int sm, unsigned flags, char **out_text, kiln_ptx_stats *stats,
                              char *err, size_t n);
kiln_status kiln_ptx_print(const kiln_kir *k, int sm, char **out_text, char *err, size_t n);

/* ------------------------------------------------------------------ ptxas (ptxas.c) */

/* What ptxas -v says about one entry. */
typedef struct kiln_ptxas_report {
    int  regs;         /* registers per thread */
    int  spill_stores; /* bytes of spill stores */
    int  spill_loads;  /* bytes of spill loads */
    int  stack;        /* stack frame bytes */
    int  smem;         /* shared memory bytes */
    int  cmem;         /* constant bank 0 bytes */
    char log[8192];    /* ptxas's whole output (warnings and errors), truncated */
} kiln_ptxas_report;

/* Finds ptxas: $KILN_PTXAS, then PATH, then /usr/local/cuda/bin. Returns false (and path = "")
 * when there is none. */
bool kiln_ptx_find_ptxas(char *path, size_t n);
/* Assembles ptx for sm_<sm> with `ptxas -v` (output discarded) and parses its report. On an
 * assembler error returns KILN_ERR_BACKEND with err holding ptxas's messages. */
kiln_status kiln_ptx_assemble(const char *ptxas, const char *ptx, int sm, kiln_ptxas_report *rep, char *err,
                              size_t n);
/* Prints k with the default register policy and assembles it; when that spills (or needs a
 * stack), prints it again with KILN_PTX_ALL_REGISTERS and assembles that (*flags says which
 * one *text and *rep are). The CUDA backend makes the same choice from the driver's JIT log. */
kiln_status kiln_ptx_print_assembled(const char *ptxas, const kiln_kir *k, int sm, char **text, unsigned *flags,
                                     kiln_ptx_stats *stats, kiln_ptxas_report *rep, char *err, size_t n);
