/* Hand-built kir kernels for the printers' and device backends' tests, and a reference
 * interpreter of kir written from kir.h's contract (one thread at a time, so only kernels without
 * shared memory, barriers or reductions). Must not use any printer or backend. */
#pragma once

#include "codegen/kir.h"

#include <stdbool.h>
#include <stdint.h>

#define KT_BLOCK 64       /* threads per block of the ALU kernel */
#define KT_GRID_X 2       /* its grid: 2 x 2 blocks */
#define KT_GRID_Y 2
#define KT_THREADS (KT_BLOCK * KT_GRID_X * KT_GRID_Y)
#define KT_IN_WORDS (4 * KT_THREADS) /* words of each input buffer (slots 1, 2) */

/* The ALU kernel: every value op of kir on every type it takes, loops, ifs, variables, every
 * memory op but shared memory. Slots: 0 parameters (slot 0 = loop count), 1 f32 inputs, 2 u32
 * inputs, 3 output words (KT_THREADS * *n_out), 4 output halves (KT_THREADS halves, ST16).
 * out_ops[j] (if given, *n_out entries up to 256) is the op whose result output word j holds. */
void kt_build_alu(kiln_kir *k, uint32_t *n_out, uint8_t out_ops[256]);

/* The reduction kernel: block 128, grid 2. Slot 1: f32 inputs (256), slot 2: output, per thread
 * KT_RED_OUT words: REDUCE sum and max over groups 1, 4, 8, 32, 128, then the neighbour's input
 * read back through shared memory after a barrier. */
#define KT_RED_BLOCK 128
#define KT_RED_OUT 11
void kt_build_reduce(kiln_kir *k);
/* The reference of the reduction kernel (sums in double, rounded to float). */
void kt_ref_reduce(const float *in, float *out);

/* The tensor-core kernel: block KT_MMA_BLOCK (2 warps), grid 1. Slots: 1 A words, 2 B words (4
 * per thread each: a thread's MMA operands a and b), 3 output (KT_MMA_OUT words per thread):
 * D1 = A.B (f16, B from lanes 0, 1), D2 = A.B' + D1 (f16, B' from lanes 2, 3), the same two with
 * bf16 elements, then the V4 that LDS4 reads at the next thread's A words after STS and a barrier
 * with its lanes reversed by SETLANE (words 16..19), then the last bf16 D with its lanes reversed
 * by SETLANE (words 20..23). kt_ref_mma computes the outputs from kir.h's fragment layouts (f64
 * sums, rounded once). Words 16..19 are exact, the others f32 sums. */
#define KT_MMA_BLOCK 64
#define KT_MMA_OUT 24
#define KT_MMA_EXACT(w) ((w) >= 16 && (w) < 20)
void kt_build_mma(kiln_kir *k);
void kt_ref_mma(const uint32_t *a, const uint32_t *b, uint32_t *out);
/* Words whose two halves are values in +-[1, 4) as bf16 and also as f16 (for kt_build_mma). */
uint32_t kt_mma_word(void);

/* Runs kernel k over its whole grid in C, threads one after the other. bufs[slot] are the
 * buffers' words (slot 0: the parameters). False, with err, for an op the interpreter does not
 * run (LDS, STS, BARRIER, REDUCE). GRID_WAIT, GRID_LAUNCH and PREFETCH do nothing here (kernels run
 * one after another), in kt_interp_block too. */
bool kt_interp(const kiln_kir *k, uint32_t *const *bufs, char *err, size_t n_err);

/* Runs kernel k over its whole grid a block at a time, every thread with its own state: shared
 * arrays, BARRIER and REDUCE (the block's threads meet there), LDS/STS/LDS4/STS4, SADDR, and the
 * warpgroup MMA of kir.h: a WGMMA runs when the WG_WAIT that retires it is reached (the latest
 * moment the hardware may read its tiles), so a kernel that overwrites a tile before waiting, or
 * reads an accumulator in flight, fails or computes wrong here as on the GPU. An MMA (mma.sync)
 * is a meeting of the whole block (kir.h: uniform control flow): each warp's product from its
 * lanes' fragments. Sums of an MMA or a WGMMA are taken in f64 and added to the f32 accumulator. */
bool kt_interp_block(const kiln_kir *k, uint32_t *const *bufs, char *err, size_t n_err);
