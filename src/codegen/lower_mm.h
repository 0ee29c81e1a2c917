/* Shared by the matmul templates (lower_gemv.c, lower_gemm.c): the region analysis (siblings,
 * groups joined by epilogue ops, rope, the rms_norm prologue), the chunk loads and decoders of
 * weight rows (through the format rows of wfmt.h), and the per-element epilogue. Internal to
 * src/codegen. */
#pragma once

#include "codegen/lower.h"
#include "codegen/wfmt.h"

#define WARPS 8       /* warps per block */
#define MC_MAX 8      /* tokens per pass */
#define SLOTS 4       /* output rows per warp */
#define XL_MAX 64     /* codegen.gemv_xload: 16-byte words of x a thread at most (K <= 65536) */
#define XL_BATCH 8    /* and at most this many loaded at once (registers); the norm's words are kept for
                         the quantization when they are one batch (K <= 8192) */
_Static_assert(SLOTS == KILN_SPEC_MM, "gemv's matmul slots are the region spec's siblings");
#define MEMO 512

typedef struct gv_group {
    int      n_sib;          /* siblings in the group (share columns) */
    int      sib[SLOTS];     /* their matmul indices */
    int      cols;           /* columns per unit per sibling */
    int64_t  n;              /* output columns (each sibling) */
    int      rope;           /* 0 none, 1 normal, 2 neox */
    int64_t  hd;             /* rope head dim */
    int64_t  rot;            /* rope's rotary dims (kiln_rope_dims: hd unless partial); the rest pass through */
    int64_t  units;          /* units of the group */
    int      wpu;            /* warps per unit (split-K inside the block: 1, 2, 4 or 8) */
    uint32_t warp0;          /* first global warp (a multiple of WARPS) */
} gv_group;

/* The unit being stored, as the shared epilogue (kl_gv_epilogue) reads it: its slots and the
 * pass's tokens. Each template keeps its own (gemv one in its gv, the GEMM one per drain of its C
 * tile), so no template writes another's state. */
typedef struct gv_unit {
    int       mc;               /* tokens of the pass */
    int       n_slots;
    int       slot_sib[SLOTS];  /* matmul index of slot */
    int       slot_delta[SLOTS];/* column offset from the unit base */
    uint32_t  col[SLOTS];       /* I32 column of slot */
    uint32_t  ok[SLOTS];        /* PRED column exists */
    uint32_t  acc[SLOTS][MC_MAX]; /* F32 result of slot for each token */
    uint32_t  t0;               /* I32 first token of the pass */
    uint32_t  memo_key[MEMO], memo_val[MEMO]; /* epilogue values already emitted in the current IF block */
    int       n_memo;
    /* Values a template staged in shared memory for its epilogue (the TMA GEMM's drain: a tile's
     * positions and rope frequencies, read with a shared load instead of a global one inside the
     * loop); n_st 0: none, the epilogue loads from global memory. */
    int       n_st;
    uint32_t  st_arr;           /* the shared array */
    uint32_t  st_row;           /* I32 staged row of token t0 */
    uint32_t  st_node[4];       /* kind 0: a per-token node's f32 value, 1: its i32 value; 2: a rope node's frequencies */
    int       st_kind[4];
    int32_t   st_off[4];        /* first element */
} gv_unit;

typedef struct gv {
    kiln_kir          *k;
    const kiln_graph  *g;
    const kiln_region *r;
    const kiln_lower_target *tgt; /* the device and the compile's choices */
    int       n_mm;
    uint32_t  mm[SLOTS];        /* matmul nodes */
    uint32_t  x, norm, nw;      /* activation node, rms_norm node (or NONE), its weight (or NONE) */
    float     eps;
    int64_t   K;
    int64_t   m_max;
    int64_t   m_cap;     /* > 0: rows are at most this at run time (a guard says so): m_max capped */
    int       mc;               /* tokens per pass */
    bool      scalar;           /* float weights with K not a multiple of the vector width: one value per chunk */
    kiln_dtype xdt;             /* dtype of x (f32 loads 16 bytes at a time; f16/bf16 one value at a time) */
    bool      dp4a;             /* block weights only: x quantized per 32 to int8 in shared memory, integer dot products */
    uint32_t  sh_xq, sh_dx, sh_xs; /* shared arrays: int8 x (K/4 words per token), scale and sum of x per 32 */
    uint32_t  sh_red;           /* shared array: the warps' totals of every accumulator (gemv's split K), if red_made */
    bool      red_made;         /* the totals' array was considered (the first unit's reduction) */
    bool      red_ok;           /* and made: reduce_split sums through it, else REDUCE per accumulator */
    bool      pair_ok;          /* the template takes the pair path (gemv; the GEMM leaves it false) */
    bool      pair;             /* integer dots over pairs of chunks (codegen.gemv_pair, wfmt.h pair_*): a
                                   lane's step is two adjacent chunks, K groups of x per dot */
    bool      pre;              /* codegen.pdl = KILN_PDL_REGS or codegen.gemv_preload (decode): the first step
                                   of the block's first virtual block is loaded into the pre_* variables
                                   before x's prologue (and the grid wait) */
    bool      pipe;             /* codegen.gemv_pipeline (decode, without pre): the chunk loop loads a lane's
                                   next step into the pre_* variables before the arithmetic of the current one */
    bool      pre_made;         /* the pre_* variables exist (make_pre_vars) */
    int       xl_n;             /* codegen.gemv_xload (decode, one token, f32 x): words of x a thread loads
                                   (tid + 256 i, i < xl_n) in batches of XL_BATCH issued together; 0: the loops
                                   over x load one at a time */
    uint32_t  xl_v[XL_MAX];     /* V4 x words the norm's pass loaded (quantize_x reuses them), or NONE */
    uint32_t  vb, bid;          /* I32 virtual block (the hoisted loop's variable) and block index */
    uint32_t  pre_v[2][SLOTS][4][4]; /* U32 variables: lane l of V4 i of slot r's chunk h of that step (pre),
                                   or of the next step (pipe) */
    uint32_t  pre_d[2][SLOTS];  /* F32 variables: its scale word (U32 ones bitcast) */
    uint8_t   pre_vmask[SLOTS][SLOTS]; /* per group, slot: which V4 of a chunk its format's load sets */
    uint8_t   pre_dtype[SLOTS][SLOTS]; /* per group, slot: the type of its d (KILN_KT_NONE: unset) */
    bool      xstage;           /* float weights in one pass: normalized x staged in shared memory (sh_x) */
    uint32_t  sh_x;
    int       xv;               /* values per chunk of the staged layout: value i of chunk c at i * K / xv + c */
    gv_group  grp[SLOTS];
    int       n_grp;
    gv_unit   u;                /* gemv's unit while emitting one group (the GEMM keeps its own) */
    uint32_t  tt[MC_MAX];       /* I32 row of x of each token of the pass (clamped) */
    bool      hoisted;          /* one pass covers every token: the prologue runs once per block, before
                                   a grid-stride loop over the virtual blocks (kir.grid_stride) */
    uint32_t  nsc[MC_MAX];      /* F32 norm scale per token of the pass */
    bool      failed;
    char      why[160];
} gv;

/* lower_gemv_x.c: the start of a pass over tokens t0 .. t0 + mc - 1 (x's rows, rms_norm scales,
 * x quantized or staged in shared memory; every thread of the block runs it), and the normalized x
 * as a region output (block 0 of the first group writes it). */
void kl_gv_pass_prologue(gv *s, uint32_t tid, uint32_t m);
void kl_gv_store_normed_x(gv *s, uint32_t gw, uint32_t u, uint32_t lane, uint32_t m);
/* A lane's steps per row of dtype t: chunks, or pairs of chunks on the pair path. */
int64_t  kl_gv_steps_per_row(const gv *s, kiln_dtype t);
/* 16-byte chunks per row of K values of dtype t (one value each when scalar), and the first element
 * (I32, within the row) of sub-step `sub` of chunk c. */
int64_t  kl_gv_chunks_per_row(kiln_dtype t, int64_t K, bool scalar);
uint32_t kl_gv_sub_elem(gv *s, kiln_dtype t, uint32_t c, int sub);
/* I32 token u->t0 + t of unit u's pass. */
uint32_t kl_gv_tok(gv *s, const gv_unit *u, int t);
/* Finds x, the rms_norm prologue, the matmuls and their groups; sets k->grid[0] for the GEMV. */
bool kl_gv_analyze(gv *s, char *err, size_t n_err);
/* Loads chunk c (I32) of weight row `row` (I32) of a [rows, K] weight of dtype t in buffer slot `slot`. */
void kl_gv_load_chunk(gv *s, kiln_dtype t, uint32_t slot, uint32_t row, uint32_t c, int64_t rows, gv_chunk *o);
/* Decodes sub-step `sub` of a loaded chunk (16 values for block dtypes, at kl_gv_sub_elem). */
void kl_gv_decode(gv *s, kiln_dtype t, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o);
/* The epilogue of unit u (its slots, accumulators, t0 and mc set) for tokens t0 .. t0 + mc - 1 < m.
 * Reads the analysis in s; writes only u (its memo) and the kernel. */
void kl_gv_epilogue(gv *s, const gv_group *G, gv_unit *u, uint32_t m);
/* What a template stages for token_value (kind 0 / as_int 1 of gv_unit.st_kind): node's value for
 * token tok, F32, or its I32 bits as U32. */
uint32_t kl_gv_token_raw(gv *s, uint32_t node, uint32_t tok, bool as_int);
/* First column of unit u of group G (I32) and each slot's column offset from it (rope partners and
 * swiglu pairs in one unit). */
uint32_t kl_gv_unit_base(gv *s, const gv_group *G, uint32_t u, int deltas[SLOTS]);
/* Column (I32) of slot position c of the unit whose base and deltas kl_gv_unit_base gave: base +
 * deltas[c], except in the pass-through units of a partial neox rope (kl_gv_partial), base + c. */
uint32_t kl_gv_slot_col(gv *s, const gv_group *G, uint32_t base, const int deltas[SLOTS], int c);
/* Whether G's rope is a partial neox one: its units hold either two rotated pairs or 4 pass-through
 * columns, so a slot's column is not base + a constant (kl_gv_slot_col). */
static inline bool kl_gv_partial(const gv_group *G) { return G->rope == 2 && G->rot < G->hd; }
