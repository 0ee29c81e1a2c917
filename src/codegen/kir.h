/* kir: the backend-neutral lowered kernel form that both GPU emitters print (PTX in src/ptx,
 * GLSL in src/spirv). A kernel is a flat list of instructions over typed values, with structured
 * control flow (loop/if), buffers addressed in 32-bit words, shared memory and block reductions.
 * Lowering (src/codegen/lower_*.c) writes it from a fused region; printers only print it: every
 * target fix-up is done here, never in a printer. Must not know about any backend or driver. */
#pragma once

#include "codegen/target.h"
#include "fuse/fuse.h"
#include "graph/graph.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Value types. Pointers never appear: buffers are addressed by (buffer slot, word index). */
enum kiln_kt {
    KILN_KT_NONE = 0, /* instructions that produce no value (stores, control flow) */
    KILN_KT_PRED,     /* a predicate (comparison result) */
    KILN_KT_I32,      /* signed 32-bit integer */
    KILN_KT_U32,      /* unsigned 32-bit integer / raw 32 bits of memory */
    KILN_KT_F32,      /* IEEE binary32 */
    KILN_KT_V4,       /* four U32 (a 16-byte load); read its lanes with KILN_KOP_LANE */
    KILN_KT_F4,       /* four F32 (an mma accumulator fragment); read its lanes with KILN_KOP_LANE */
    KILN_KT_W64,      /* 64 F32: a thread's part of a warpgroup MMA accumulator (wgmma m64n128, see
                         KILN_KOP_WGMMA); a CONST or VAR; read its lanes (0..63) with KILN_KOP_LANE */
    KILN_KT_COUNT
};

/* Instructions. a/b/c name earlier values (instruction indices); imm is a constant operand. The
 * operand types an op takes are stated; the kernel verifier (kiln_kir_verify) checks them. */
enum kiln_kop {
    KILN_KOP_NONE = 0,
    /* leaves */
    KILN_KOP_CONST,   /* type I32/U32/F32: value imm (f32 as its bits in imm.u); F4: every lane imm's f32 */
    KILN_KOP_TID,     /* I32: thread index in the block, 0 .. block-1 */
    KILN_KOP_BID,     /* I32: block index along grid axis imm (0, 1, 2) */
    KILN_KOP_NBID,    /* I32: number of blocks launched along grid axis imm (grid-stride kernels) */
    KILN_KOP_PARAM,   /* I32: slot imm of the per-run parameter buffer (symbol values) */
    KILN_KOP_VAR,     /* a mutable variable of the instruction's type (I32/U32/F32/F4), initialized to a */
    KILN_KOP_ASSIGN,  /* NONE: variable a = b (same type) */
    /* arithmetic: a, b (c) and the result of one type: I32, U32 or F32 */
    KILN_KOP_ADD, KILN_KOP_SUB, KILN_KOP_MUL,
    KILN_KOP_DIV,     /* F32: IEEE-rounded a / b; I32/U32: truncating (b != 0 is the lowering's job) */
    KILN_KOP_REM,     /* I32/U32 only */
    KILN_KOP_MIN, KILN_KOP_MAX,
    KILN_KOP_FMA,     /* F32: a * b + c rounded once */
    KILN_KOP_NEG, KILN_KOP_ABS,
    /* bits (I32/U32): shr is arithmetic on I32, logical on U32; b is the shift count (same type) */
    KILN_KOP_AND, KILN_KOP_OR, KILN_KOP_XOR, KILN_KOP_SHL, KILN_KOP_SHR,
    /* F32 math: ex2 = 2^a, lg2 = log2(a) (approximate to ~2 ulp); rsqrt, sqrt; sin/cos only for
     * |a| <= pi (lowering reduces the range first); floor; rint = round half to even */
    KILN_KOP_EX2, KILN_KOP_LG2, KILN_KOP_RSQRT, KILN_KOP_SQRT, KILN_KOP_SIN, KILN_KOP_COS,
    KILN_KOP_FLOOR, KILN_KOP_RINT,
    /* comparisons: a, b of one type -> PRED; predicate logic on PRED */
    KILN_KOP_LT, KILN_KOP_LE, KILN_KOP_EQ, KILN_KOP_NE,
    KILN_KOP_PAND, KILN_KOP_POR, KILN_KOP_PNOT,
    KILN_KOP_SELECT,  /* a: PRED; b, c: same type as the result: a ? b : c */
    /* conversions: result type from the instruction, source type from a */
    KILN_KOP_CVT,     /* I32 <-> F32 (F32 -> I32 truncates toward zero), I32 <-> U32 (same bits) */
    KILN_KOP_BITCAST, /* F32 <-> U32/I32, same bits */
    KILN_KOP_H2F,     /* F32 from the f16 in bits [16*imm, 16*imm+16) of U32 a */
    KILN_KOP_B2F,     /* F32 from the bf16 in bits [16*imm, 16*imm+16) of U32 a */
    KILN_KOP_F2H,     /* U32 holding in its low 16 bits the f16 of F32 a, round to nearest even */
    KILN_KOP_F2B,     /* U32 holding in its low 16 bits the bf16 of F32 a, round to nearest even */
    KILN_KOP_BFE,     /* field of U32 a at bit imm & 31, width imm >> 8: result U32 (zero-extended)
                         or I32 (sign-extended) */
    KILN_KOP_DP4A,    /* I32: c + sum of the four signed-byte products of U32 a and U32 b */
    KILN_KOP_LANE,    /* U32: lane imm (0..3) of V4 a; F32: lane imm of F4 a */
    KILN_KOP_SETLANE, /* V4 (F4): a copy of V4 (F4) a with lane imm (0..3) replaced by U32 (F32) b; a may
                         be KILN_IDX_NONE: the other lanes are then 0 */
    /* global memory: buffer slot imm (kiln_kir.bufs), word index a (I32) */
    KILN_KOP_LD,      /* U32: one word */
    KILN_KOP_LD4,     /* V4: four words from a word index that is a multiple of 4 */
    KILN_KOP_ST,      /* NONE: word a = U32 b */
    KILN_KOP_ST16,    /* NONE: 16-bit half a (index in halves) = low 16 bits of U32 b */
    /* shared memory: array imm (kiln_kir.shared), element index a (I32); elements are 32-bit */
    KILN_KOP_LDS,     /* U32 or F32 */
    KILN_KOP_STS,     /* NONE: element a = b (U32 or F32) */
    KILN_KOP_LDS4,    /* V4: elements a .. a+3 (a a multiple of 4: one 16-byte shared load) */
    KILN_KOP_BARRIER, /* NONE: every thread of the block waits; shared memory is then visible */
    /* F32 reduction over aligned groups of imm & 0xffff consecutive threads (a power of two that
     * divides the block), op imm >> 16 (enum kiln_kred); every thread of a group gets the result.
     * Must be reached by every thread of the block (uniform control flow). */
    KILN_KOP_REDUCE,
    /* Warp matrix multiply-accumulate, PTX mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: F4
     * result D = A . B + C over the 32 threads of each warp (lane l = thread & 31, g = l >> 2,
     * q = l & 3). A is 16x16 (row-major), B is 16x8 (k x n), C and D are 16x8, products summed in f32.
     * Operand a (V4) is this lane's A fragment: lane j of a holds, low half first, the two
     * elements A[g + 8 (j & 1)][2q + 8 (j >> 1) + {0, 1}]. Operand b (V4): lanes 2h, 2h+1
     * (h = imm bit 1) are the B fragment: lane 2h + j holds B[2q + 8j + {0, 1}][g] (low half first);
     * the other two lanes are ignored. Operand c (F4) is C: lane j is C[g + 8 (j >> 1)][2q + (j & 1)],
     * and D has the same layout. imm bit 0: elements are bf16 (else f16). Must be reached by every
     * thread of the block in uniform control flow (printers may exchange fragments through shared
     * memory with barriers). */
    KILN_KOP_MMA,
    /* structured control flow */
    KILN_KOP_LOOP,    /* NONE: for (var a = a's value; a < b; a += c) — a is a VAR of I32 */
    KILN_KOP_ENDLOOP, /* NONE */
    KILN_KOP_IF,      /* NONE: if (PRED a) */
    KILN_KOP_ELSE,    /* NONE */
    KILN_KOP_ENDIF,   /* NONE */
    /* Hopper (sm_90a) warpgroup MMA; kernels that use these print only for sm_90 (kiln_lower_target.wgmma) */
    KILN_KOP_STS4,    /* NONE: shared array imm, elements a .. a+3 (a a multiple of 4) = V4 b (one 16-byte store) */
    KILN_KOP_SADDR,   /* U32: byte address in the shared window of element a (I32) of shared array imm */
    KILN_KOP_FENCE_ASYNC, /* NONE: this thread's shared-memory stores become visible to the async proxy
                         (WGMMA's operand reads); put before the barrier that precedes the WGMMA */
    KILN_KOP_WG_FENCE,/* NONE: orders this warpgroup's register accesses before the WGMMAs that follow */
    /* NONE: W64 variable a += A . B over k = 16, issued asynchronously by the 128 threads of a
     * warpgroup (threads 128 w .. 128 w + 127); a must not be read or assigned until a WG_WAIT
     * retires it. A is 64 x 16 (rows x k), B is 128 x 16 (columns x k), both K-major in shared
     * memory without swizzle, as 8 x 8 core matrices of 128 contiguous bytes (row r of a core
     * at byte 16 r): element (i, kk) of A is at byte address b + (i >> 3) * SBO + (kk >> 3) * 128 +
     * (i & 7) * 16 + (kk & 7) * 2, B's (n, kk) the same from byte address c (U32 values from
     * SADDR, multiples of 16); SBO = 16 * (imm >> 8 & 0xff). imm bit 0: bf16 elements (else f16).
     * Lane j of a (thread t of the warpgroup: warp w = t >> 5, g = (t & 31) >> 2, q = t & 3) is
     * D[16 w + g + 8 ((j >> 1) & 1)][8 (j >> 2) + 2 q + (j & 1)]. Must be reached by all 128
     * threads in uniform control flow. imm bit 1: both tiles are 128-byte swizzled instead (TMA's
     * layout, atoms of 8 rows x 128 bytes 1024-aligned): element (i, kk) is at the byte address
     * L ^ (((L >> 7) & 7) << 4), L = b + (i >> 3) * SBO + (i & 7) * 128 + kk * 2 (b advances by
     * 32 bytes per k16 step inside the 64-half rows). Further flags (flash attention's second
     * product): imm bits 4-7: N / 16 (0: N = 128); with N < 128 only lanes j < N / 2 are written.
     * imm bit 2: A comes from registers: b is a V4 holding, as mma.sync's A fragment of warp w's
     * rows 16 w .. 16 w + 15, lane j = A[16 w + g + 8 (j & 1)][2 q + 8 (j >> 1) + {0, 1}] (low half
     * first); the four threads of a quad read each other's fragments. imm bit 3 (swizzled only): B
     * is MN-major ("transposed", as a [k][n] tile lands from a row-major matrix): element (n, kk) at
     * L ^ (((L >> 7) & 7) << 4), L = c + (n >> 6) * LBO + (kk >> 3) * SBO + (kk & 7) * 128 + (n & 63) * 2,
     * LBO = 16 * (imm >> 16 & 0x3fff) (c advances by 16 rows = 2048 bytes per k16 step). */
    KILN_KOP_WGMMA,
    KILN_KOP_WG_COMMIT, /* NONE: closes the group of this thread's WGMMAs issued since the last commit */
    KILN_KOP_WG_WAIT, /* NONE: waits until at most imm of this thread's committed groups are pending */
    /* Hopper asynchronous pipelines: mbarriers (64-bit objects in shared memory, addressed by U32
     * byte addresses from SADDR, 8-byte aligned) and the TMA engine. A phase of an mbarrier completes
     * when its pending arrivals reach 0 and every byte it expects has landed; its parity then flips. */
    KILN_KOP_MBAR_INIT,   /* NONE: mbarrier at a: phase 0, imm arrivals expected per phase */
    KILN_KOP_MBAR_ARRIVE, /* NONE: one arrival at mbarrier a (release: this thread's earlier shared
                             stores are visible to whoever waits); imm > 0: it also expects imm more bytes (TMA) */
    KILN_KOP_MBAR_WAIT,   /* NONE: waits until the phase of mbarrier a with parity b (I32 0/1) has completed */
    /* NONE: TMA tile load of tensor map imm (kiln_kir.tmaps): a is a V4 {U32 destination byte address
     * in shared memory (1024-aligned), U32 mbarrier address, I32 inner coordinate (elements),
     * I32 outer coordinate (rows)}; the box lands as rows of 128 bytes with the 128-byte swizzle
     * (16-byte chunk c of row r at chunk c ^ (r & 7)), rows past the map's end as zeros, and its
     * bytes complete-tx on the mbarrier. b: KILN_IDX_NONE, or (kernels with cluster > 1) a U32 mask
     * of the cluster's CTAs (bit r: rank r): the box lands in each of them at the same shared
     * address and completes-tx on the mbarrier at the same address in each (multicast) */
    KILN_KOP_TMA_LOAD,
    /* Thread block clusters (kernels with kiln_kir.cluster > 1: that many consecutive blocks along x
     * run together, each its own shared memory; a block's rank is its x index mod cluster) */
    KILN_KOP_MBAR_ARRIVE_CL, /* NONE: one arrival at the mbarrier at shared address a (U32) of the
                                cluster's block of rank b (U32); releases at the CTA's scope only (as
                                CUTLASS's consumer release: cluster scope made every stage on the H100
                                cm times slower), so it orders the thread's WGMMA reads retired before it,
                                not its global stores */
    KILN_KOP_CLUSTER_SYNC,   /* NONE: every thread of every block of the cluster waits here (their shared
                                memory accesses before it visible after it); uniform control flow */
    KILN_KOP_SETMAXNREG,  /* NONE: this warpgroup's registers per thread become imm & 0xffff (imm bit 16:
                             increase, else decrease); uniform per warpgroup */
    /* Hopper programmatic dependent launch (sm_90, kernels with kiln_kir.pdl; see codegen/lower_pdl.c) */
    KILN_KOP_GRID_WAIT,   /* NONE: waits until the grids this one depends on have completed and their memory
                             is visible (PTX griddepcontrol.wait); a no-op when launched without the attribute */
    KILN_KOP_GRID_LAUNCH, /* NONE: lets the next grid launch early (griddepcontrol.launch_dependents); carries no
                             memory fence: that grid still waits with GRID_WAIT for this one's completion */
    KILN_KOP_PREFETCH,    /* NONE: hint to bring word a (I32) of buffer slot imm into L2 (prefetch.global.L2);
                             changes no value */
    KILN_KOP_WSET,        /* NONE: lane imm (0..63) of W64 variable a = F32 b (a must not be in flight: WG_WAIT first) */
    /* Named barriers (PTX bar.sync / bar.arrive with an id and a thread count; CUDA only, the GLSL
     * printer refuses them): id imm & 0xff in 1..15 (0 is BARRIER's), or I32 value a where a is not
     * KILN_IDX_NONE (imm & 0xff 0 then); count imm >> 8 threads, whole warps, the same at every use
     * of a phase. A phase completes when count threads have synced or arrived; warp-uniform.
     * Warp specialization's hand-offs: one warpgroup's turn at the tensor cores */
    KILN_KOP_NBAR_SYNC,   /* NONE: arrives at named barrier imm and waits until its phase completes
                             (earlier shared memory accesses of the threads arriving are then visible) */
    KILN_KOP_NBAR_ARRIVE, /* NONE: arrives at named barrier imm without waiting */
    KILN_KOP_PACK2,       /* U32: F2H (imm 1: F2B) of F32 a in the low half, of F32 b in the high half, in one
                             instruction (cvt.rn.f16x2.f32: half the conversions of two F2H); CUDA only */
    KILN_KOP_FENCE_CTA,   /* NONE: this thread's memory accesses before it are ordered before those after it, at the
                             block's scope (PTX fence.acq_rel.cta; GLSL: nothing). The gemv puts one after a step's
                             loads so that ptxas issues them together instead of next to each use (codegen.gemv_fence) */
    KILN_KOP_LDS_CL,      /* U32 or F32: the word at shared byte address a (U32, from SADDR) in the block of the cluster
                             of rank b (U32) (PTX mapa + ld.shared::cluster; kernels with cluster > 1): another block's
                             shared stores before a CLUSTER_SYNC are visible after it. Attention's split-combine */
    KILN_KOP_ST4,         /* NONE: global words a .. a+3 of buffer slot imm (a a multiple of 4) = V4 b, one 16-byte store;
                             CUDA only (flash_wg's epilogue: rows staged in shared memory leave as whole sectors) */
    KILN_KOP_HFMA2,       /* U32: per 16-bit half, the f16 a * b + c of U32 a, b, c rounded once (fma.rn.f16x2);
                             CUDA only (the Hopper GEMM's block-weight decoders: values made in f16 pairs) */
    KILN_KOP_PRMT,        /* U32: bytes of U32 a (bytes 0-3) and U32 b (4-7) picked by the selector's nibbles (U32 c):
                             result byte i is byte (c >> 4 i) & 7, replicated sign bit where nibble bit 3 is set
                             (PTX prmt.b32, default mode); CUDA only */
    KILN_KOP_COUNT
};

enum kiln_kred { KILN_KRED_SUM = 0, KILN_KRED_MAX, KILN_KRED_COUNT };

/* What a buffer slot of a kernel is bound to at launch. */
enum kiln_kbuf_kind {
    KILN_KBUF_PARAMS = 0, /* the plan's per-run parameter buffer (always slot 0) */
    KILN_KBUF_NODE,       /* the memory of a graph node (its root, plus the node's offset) */
    KILN_KBUF_TABLE,      /* a constant table the lowering made (kiln_kir.tables) */
    KILN_KBUF_SCRATCH,    /* the region's scratch buffer (kiln_kir.scratch_bytes), shared by the
                             kernels of one region (e.g. attention's partial results) */
    KILN_KBUF_KIND_COUNT
};

/* Device layouts of weights: GGUF blocks whose size is not a multiple of 4 bytes are split so
 * every kernel reads aligned words. Applied once, when a weight is uploaded. */
enum kiln_klayout {
    KILN_KLAYOUT_RAW = 0,  /* the bytes as they are */
    KILN_KLAYOUT_Q8_0_SPLIT, /* all quants (rows x k bytes), then the f16 scales (rows x k/32), each 16-byte aligned */
    KILN_KLAYOUT_Q6_K_SPLIT, /* per block ql[128] qh[64] scales[16] (208 bytes), then the f16 d of every block */
    KILN_KLAYOUT_PAIR32,     /* q4_0, q4_1, q5_0, q5_1, iq4_nl: blocks of 32 paired, nibbles of chunk h of a pair
                                interleaved, then fifth bits, scales, mins as words (codegen/wfmt_more.c) */
    KILN_KLAYOUT_Q2_K_SPLIT, /* per block qs[64] scales[16], then d | dmin << 16 of every block */
    KILN_KLAYOUT_Q3_K_SPLIT, /* per block qs[64] hmask[32] scales as 16 int8, then the f16 d of every block */
    KILN_KLAYOUT_IQ4_XS_SPLIT, /* per block qs[128] (sub-block pairs interleaved), then 8 int8 scales, then f16 d */
    KILN_KLAYOUT_COUNT
};

typedef union kiln_kimm {
    int32_t  i; /* integer constant / slot / axis */
    uint32_t u; /* raw bits (f32 constants are stored as bits) */
} kiln_kimm;

typedef struct kiln_kinst {
    uint8_t   op;   /* enum kiln_kop */
    uint8_t   type; /* enum kiln_kt of the result */
    uint32_t  a, b, c; /* operand values (instruction indices), KILN_IDX_NONE when unused */
    kiln_kimm imm;  /* constant operand */
} kiln_kinst;

typedef struct kiln_kbuf {
    uint8_t  kind;     /* enum kiln_kbuf_kind */
    bool     written;  /* the kernel stores to it */
    uint32_t node;     /* KILN_KBUF_NODE: graph node index; KILN_KBUF_TABLE: table index */
} kiln_kbuf;

/* A TMA tensor map the launcher encodes (cuTensorMapEncodeTiled) from the buffer slot's address
 * and passes by value: a 2-D tensor of 16-bit elements, rows of `stride` bytes, 128-byte swizzle. */
typedef struct kiln_ktmap {
    uint32_t slot;      /* buffer slot */
    uint32_t word;      /* first word of the tensor in the buffer (16-byte aligned: a multiple of 4) */
    uint32_t inner;     /* elements per row (the contiguous dimension) */
    uint32_t outer;     /* rows */
    uint32_t stride;    /* bytes from one row to the next (a multiple of 16) */
    uint16_t box_inner; /* box elements along a row (64: 128 bytes) */
    uint16_t box_outer; /* box rows (at most 256) */
} kiln_ktmap;

typedef struct kiln_ktable {
    uint32_t *words; /* contents (owned) */
    uint32_t  n;     /* word count */
} kiln_ktable;

#define KILN_KIR_MAX_BUFS 24
#define KILN_KIR_MAX_SHARED 4
#define KILN_KIR_MAX_TABLES 4
#define KILN_KIR_MAX_TMAPS 8

/* The row guard a kernel is wrapped in (kl_guard_rows), kept for launchers: a kernel whose guard
 * fails at a run's sizes does nothing, so a launcher may skip it (kiln_krows_pass). */
typedef struct kiln_krows {
    bool     set;     /* the kernel has one */
    bool     small;   /* runs for few rows (rows <= cap, or not "many rows per sequence"), else many */
    uint32_t node;    /* rows = numel(node) / per_row */
    uint32_t seqs;    /* KILN_IDX_NONE, or the node whose dim 0 counts sequences (per_seq rows each) */
    int64_t  per_row, cap, per_seq;
    int64_t  lo;      /* small without seqs: also lo < rows (kl_guard_rows_range; 0: no lower bound) */
    int64_t  mix;     /* with seqs, > 0: runs when rows - n_seq >= mix (a sequence may have more than mix
                         rows: kl_guard_rows_mixed); small, cap and per_seq unused */
} kiln_krows;

typedef struct kiln_kir {
    char        name[48];                       /* kernel entry name, a C identifier */
    uint32_t    block;                          /* threads per block (1-D), a multiple of 32 */
    uint32_t    grid[3];                        /* blocks along x, y, z: fixed at compile (from symbol bounds) */
    uint32_t    min_blocks;                     /* blocks per SM the kernel is written for (0: the
                                                   assembler's choice): caps its registers (PTX
                                                   .minnctapersm) so that many resident blocks hide
                                                   latency, as the GEMM's barriers need */
    bool        grid_stride;                    /* grid[0] counts virtual blocks the kernel strides over by
                                                   NBID: a launcher may run fewer blocks along x (at least 1) */
    kiln_kbuf   bufs[KILN_KIR_MAX_BUFS];        /* buffer slots; slot 0 is the parameter buffer */
    uint32_t    n_bufs;                         /* used */
    uint32_t    shared[KILN_KIR_MAX_SHARED];    /* 32-bit elements of each shared array */
    uint32_t    n_shared;                       /* used */
    kiln_ktable tables[KILN_KIR_MAX_TABLES];    /* constant tables (e.g. rope frequencies) */
    uint32_t    n_tables;                       /* used */
    kiln_kinst *ins;                            /* instructions, in program order */
    uint32_t    n_ins;                          /* used */
    uint32_t    cap_ins;                        /* allocated */
    kiln_ktmap  tmaps[KILN_KIR_MAX_TMAPS];      /* TMA tensor maps (sm_90a kernels) */
    uint32_t    n_tmaps;                        /* used */
    uint32_t    cluster;                        /* blocks per thread block cluster along x (sm_90: 2, 4 or 8;
                                                   grid[0] a multiple of it); 0 or 1: no cluster */
    bool        dyn_shared;                     /* shared arrays live in dynamic shared memory (up to the
                                                   target's limit, each 1024-aligned) instead of static */
    uint64_t    scratch_bytes;                  /* size of the region's scratch buffer (0: none) */
    bool        oom;                            /* an append failed: the kernel is unusable */
    char        what[96];                       /* what it computes, for listings ("gemv q4_k x3 + rope") */
    bool        side;                           /* independent of the region's other kernels (reads nothing
                                                   they write; writes nothing they read or write): a launcher
                                                   may run it on a second queue beside them, joined before the
                                                   next region (a mixed paged step's flash kernel) */
    bool        pdl;                            /* programmatic dependent launch: launched with programmatic
                                                   stream serialization; the verifier checks that a top-level
                                                   GRID_WAIT comes before every store and every read of a slot
                                                   not in pdl_const (codegen/lower_pdl.c) */
    uint32_t    pdl_const;                      /* with pdl: bit s set when no kernel writes slot s (weights,
                                                   tables, the host-written parameter buffer): read before the wait */
    kiln_krows  rows;                           /* its row guard, if any */
} kiln_kir;

/* ------------------------------------------------------------------ building (kir.c) */

void     kiln_kir_init(kiln_kir *k, const char *name, uint32_t block);
void     kiln_kir_free(kiln_kir *k);
/* Appends an instruction; returns its index (the value it defines). Sets k->oom on failure. */
uint32_t kiln_kir_op(kiln_kir *k, enum kiln_kop op, enum kiln_kt t, uint32_t a, uint32_t b, uint32_t c, int32_t imm);
/* Adds a buffer slot for node (deduplicated by kind+node; `written` accumulates); returns the slot. */
uint32_t kiln_kir_buf(kiln_kir *k, enum kiln_kbuf_kind kind, uint32_t node, bool written);
/* Adds a shared array of n 32-bit elements; returns its index. */
uint32_t kiln_kir_shared(kiln_kir *k, uint32_t n);
/* Adds a TMA tensor map; returns its index (KILN_IDX_NONE and k->oom when full). */
uint32_t kiln_kir_tmap(kiln_kir *k, const kiln_ktmap *m);
/* Shared bytes of k's arrays: static (each 16-aligned) or dynamic (each 1024-aligned), as printed. */
uint64_t kiln_kir_shared_bytes(const kiln_kir *k);
/* Adds a constant table of n words (copied) and its buffer slot; returns the slot. */
uint32_t kiln_kir_table(kiln_kir *k, const uint32_t *words, uint32_t n);
/* Wraps k's whole body in `if (pred)`: cond holds the instructions that compute PRED pred (leaves
 * and arithmetic only: no buffers, shared arrays or tables); they are put first, k's instructions
 * after them (operands renumbered), and an ENDIF last. A kernel whose condition is false for a run
 * does nothing (its blocks exit at once). Sets k->oom on failure. */
void     kiln_kir_guard(kiln_kir *k, const kiln_kir *cond, uint32_t pred);
/* Whether row guard r passes at a run's dims (dims[i]: node i's; g: the graph), computed as the
 * kernel computes it (32-bit products and division); true without a guard. */
bool     kiln_krows_pass(const kiln_krows *r, const kiln_graph *g, const int64_t (*dims)[KILN_MAX_RANK]);
/* Checks operand types, control-flow nesting and slot ranges; returns false and a message. */
bool     kiln_kir_verify(const kiln_kir *k, char *err, size_t n_err);
/* Name of an op / type for listings and printers' errors. */
const char *kiln_kop_name(enum kiln_kop op);
const char *kiln_kt_name(enum kiln_kt t);
/* Writes a readable listing of k (debugging, `kiln ptx --kir`). */
void kiln_kir_dump(const kiln_kir *k, FILE *f);

/* Shorthands used by the lowerings (the `k` argument is the kernel being written). */
uint32_t kiln_ki(kiln_kir *k, int32_t v);                 /* I32 constant */
uint32_t kiln_ku(kiln_kir *k, uint32_t v);                /* U32 constant */
uint32_t kiln_kf(kiln_kir *k, float v);                   /* F32 constant */
uint32_t kiln_k2(kiln_kir *k, enum kiln_kop op, uint32_t a, uint32_t b); /* binary op, type of a */
uint32_t kiln_k1(kiln_kir *k, enum kiln_kop op, uint32_t a);             /* unary op, type of a */
uint32_t kiln_kvar(kiln_kir *k, uint32_t init);          /* variable initialized to init (its type) */
void     kiln_kset(kiln_kir *k, uint32_t var, uint32_t v);
enum kiln_kt kiln_ktype(const kiln_kir *k, uint32_t v);  /* type of value v */
/* The rest of the vocabulary: every lowering writes kir through these (no private wrappers). */
uint32_t kiln_kaddi(kiln_kir *k, uint32_t a, int32_t b);  /* a + b (a itself for b = 0) */
uint32_t kiln_kmuli(kiln_kir *k, uint32_t a, int32_t b);  /* a * b (a itself for b = 1) */
uint32_t kiln_kshri(kiln_kir *k, uint32_t a, int32_t b);  /* a >> b */
uint32_t kiln_kandi(kiln_kir *k, uint32_t a, int32_t b);  /* a & b */
/* (the k*i forms make their constant after a: a nested call's order is kept) */
uint32_t kiln_kfma(kiln_kir *k, uint32_t a, uint32_t b, uint32_t c);        /* F32 a * b + c */
uint32_t kiln_kcvt(kiln_kir *k, enum kiln_kt t, uint32_t v);                /* CVT to t */
uint32_t kiln_kbitcast(kiln_kir *k, enum kiln_kt t, uint32_t v);            /* BITCAST to t */
uint32_t kiln_kbfe(kiln_kir *k, enum kiln_kt t, uint32_t v, int off, int width); /* bit field */
uint32_t kiln_kh2f(kiln_kir *k, uint32_t w, int half);                       /* F32 of f16 half 0/1 of w */
uint32_t kiln_klane(kiln_kir *k, uint32_t v4, int i);                        /* U32 lane i of a V4 */
uint32_t kiln_ksel(kiln_kir *k, enum kiln_kt t, uint32_t p, uint32_t a, uint32_t b); /* p ? a : b */
uint32_t kiln_kld(kiln_kir *k, uint32_t slot, uint32_t word);               /* U32 word of a buffer slot */
uint32_t kiln_kld4(kiln_kir *k, uint32_t slot, uint32_t word);              /* V4 from word (multiple of 4) */
uint32_t kiln_klds(kiln_kir *k, uint32_t arr, enum kiln_kt t, uint32_t idx); /* shared element */
void     kiln_ksts(kiln_kir *k, uint32_t arr, uint32_t idx, uint32_t v);
void     kiln_kif(kiln_kir *k, uint32_t pred);
void     kiln_kelse(kiln_kir *k);
void     kiln_kendif(kiln_kir *k);
void     kiln_kloop(kiln_kir *k, uint32_t var, uint32_t end, uint32_t step); /* for (var; var < end; var += step) */
void     kiln_kendloop(kiln_kir *k);
void     kiln_kbarrier(kiln_kir *k);

/* ------------------------------------------------------------------ lowering (lower_*.c) */

/* KILN_KOP_PARAM slot i holds symbol i's value (the executor's parameter buffer: sched/backend.h). */

/* Lowers region r of g into 1..KILN_LOWER_MAX kernels that run in order (out[0..*n_out)); kernels of
 * one region share one scratch buffer (slot kind KILN_KBUF_SCRATCH) of the largest scratch_bytes
 * among them. KILN_ERR_UNSUPPORTED (with err naming the op/dtype) when the region has a shape no
 * template takes; placement then runs it elsewhere. t: the device and the compile's choices (codegen/target.h;
 * NULL: the default target).
 * On any failure every out[i] is zeroed: kiln_kir_free on it does nothing. */
#define KILN_LOWER_MAX 8
kiln_status kiln_lower_region_for(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *t,
                                  kiln_kir out[KILN_LOWER_MAX], uint32_t *n_out, char *err, size_t n_err);
/* The same for the default target (kiln_lower_target_default: the portable kernels listings and
 * the golden test print). */
kiln_status kiln_lower_region_seq(const kiln_graph *g, const kiln_region *r, kiln_kir out[KILN_LOWER_MAX], uint32_t *n_out,
                                  char *err, size_t n_err);
/* Whether kernel k uses sm_90a-only instructions (WGMMA, mbarriers, TMA and their fences). */
bool kiln_kir_needs_sm90a(const kiln_kir *k);
/* Whether kernel k uses sm_90 instructions (griddepcontrol, for programmatic dependent launch). */
bool kiln_kir_needs_sm90(const kiln_kir *k);

/* The device layout kernels expect for a weight of dtype t, and its repacking (dst holds
 * kiln_lower_weight_bytes bytes). Weights are [rows, k] in their GGUF row layout on the host. */
enum kiln_klayout kiln_lower_weight_layout(kiln_dtype t);
size_t            kiln_lower_weight_bytes(kiln_dtype t, int64_t rows, int64_t k);
/* The same shaped for a backend table's weight_bytes / weight_repack members (0: the host layout). */
size_t            kiln_lower_weight_dev_bytes(void *state, kiln_dtype t, int64_t rows, int64_t k);
void              kiln_lower_weight_dev_repack(void *state, kiln_dtype t, int64_t rows, int64_t k, const void *src, void *dst);
void              kiln_lower_weight_repack(kiln_dtype t, int64_t rows, int64_t k, const void *src, void *dst);
