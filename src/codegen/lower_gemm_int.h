/* What the GEMM templates share (lower_gemm.c: mma.sync template, rms and split kernels, entry;
 * lower_gemm_wg.c: the Hopper TMA + warpgroup MMA template): the kernel state gm and its
 * kir shorthands. Private to those two files; must not know any target's syntax. */
#ifndef KILN_LOWER_GEMM_INT_H
#define KILN_LOWER_GEMM_INT_H
#include "codegen/lower_mm.h"

#define GM_BMAX 128     /* tokens per block: 128, or 64 for short x or three x parts (bm) */
#define GM_BN 128       /* columns per block (all siblings together) */
#define GM_BK 32        /* k per staged tile */
#define GM_THREADS 256  /* 8 warps: 2 along M x 4 along N, 32 x 32 each */
#define GM_CS 132       /* words per row of the C tile in shared memory */
#define GM_MT (GM_BMAX / 32) /* m-tiles per warp at most (a warp owns bm / 2 rows) */
#define GM_BWORDS 2048  /* words of the B tile (128 x 32 halves) */

typedef struct gm {
    gv        *s;         /* the shared analysis and groups (lower_mm.h); the epilogue's unit is gm_drain's */
    kiln_kir  *k;         /* the GEMM kernel */
    uint32_t   sh;        /* its shared array */
    uint32_t   tid, lane, wm, wn; /* I32: thread, lane, warp row (0..1), warp column (0..3) */
    uint32_t   m, m0, n0; /* I32: rows of x, first row and first column (per sibling) of the block */
    uint32_t   scr;       /* scratch slot holding the rms scales, or NONE */
    uint32_t   xs, nws;   /* x's slot, the norm weight's slot (or NONE) */
    int        parts;     /* x as 1..3 f16/bf16 parts */
    bool       bf;        /* the group multiplies bf16 (else f16) */
    kiln_dtype wt;        /* the group's weight dtype */
    int        bn;        /* columns per block, all siblings together: GM_BN, or with wg 192 / 256 (gw_shape) */
    int        cs;        /* words per row of the C tile in shared memory (bn + 4) */
    int        bns;       /* columns per sibling per block */
    int        wparts;    /* f16 parts of the weights in the B tile: 2 for f32 weights (hi, lo), else 1 */
    int        U;         /* tiles per k-period of the weight format (the decoders' sub-steps) */
    int        bm;        /* tokens per block (64 or 128): a warp owns bm / 2 rows, bm / 32 m-tiles */
    bool       xp;        /* x prepared by the rms kernel: normalized, split into parts, in the
                             mma's element type, in the scratch (xp_word: part q of row r at word
                             xp_word + (q * m_max + r) * K / 2) */
    int32_t    xp_word;   /* word of the first part in the scratch */
    int32_t    xp_part;   /* words of one part (m_max * K / 2) */
    int        apart;     /* words of one part of the A tile (bm x 32 halves) */
    bool       wg;        /* Hopper: TMA + warpgroup MMA, producer and consumer warpgroups (gw_*) */
    bool       wide;      /* wg with rc 128 and bn > 128: the consumers' accumulators pass the 168
                             registers a thread of 384 gets, so setmaxnreg gives them 232 and the
                             producer 40, and the consumers drain the C tile alone (kl_gw_group) */
    int        nreg_c, nreg_p; /* wg: setmaxnreg of the consumer warpgroups and the producer's, 0: none
                             (wide: 240 and 24; block weights with rc 128: GW_BLOCK_NREG_C / _P); with
                             it the consumers drain the C tile alone */
    int        threads;   /* threads of the GEMM kernel */
    int        rc;        /* wg: rows per consumer warpgroup (64, 128); bm = 2 rc */
    int        stages;    /* wg: stages of the ring */
    uint32_t   sb;        /* wg: bytes of a stage (x parts, then 128 weight rows; 128 bytes a row) */
    uint32_t   ring, bars;/* wg: U32 shared addresses of the ring and of its mbarriers (full[stages], empty[stages]) */
    uint32_t   xmap;      /* wg: x's tensor map */
    bool       wblock;    /* wg: block weights, decoded into the stages by the producer warpgroup */
    int        cm;        /* wg: blocks of consecutive token rows per thread block cluster (1: none); each
                             brings 1/cm of every weight tile into all of them (TMA multicast) */
    uint32_t   crank;     /* wg with cm > 1: I32 rank of the block in its cluster */
    gv_unit    st;        /* wg: what the epilogue reads from shared memory (n_st, st_arr, st_node/kind/off) */
    bool       pp;        /* wg persistent (codegen.gemm_persist, kl_gw_persist): grid blocks each walk tiles
                             pb, pb + grid, ...; consumer warpgroup c takes the block's tiles c, c + 2, ...
                             (rc rows x bn columns each, bm = rc rows a stage) and runs the register epilogue
                             on them while the other one multiplies */
    uint32_t   pb;        /* pp: I32 block index */
    int32_t    grid;      /* pp: blocks of the grid */
    int        ks;        /* pp: splits of K (1: none); > 1 for grids of few tiles (few rows): each tile's
                             splits write f32 partial sums into the scratch and kiln_gemm_reduce adds
                             them up and runs the epilogue */
    int32_t    nks;       /* pp: stages of a split */
    int32_t    rt_max;    /* pp: row tiles at the rows' bound (the partials' layout) */
    int32_t    part_word; /* pp with ks > 1: scratch word of the partial sums (tile-major, rc x bn each) */
} gm;


static inline uint32_t ci(gm *g, int32_t v) { return kiln_ki(g->k, v); }
static inline uint32_t o2(gm *g, enum kiln_kop op, uint32_t a, uint32_t b) { return kiln_k2(g->k, op, a, b); }
static inline uint32_t add(gm *g, uint32_t a, uint32_t b) { return o2(g, KILN_KOP_ADD, a, b); }
static inline uint32_t mul(gm *g, uint32_t a, uint32_t b) { return o2(g, KILN_KOP_MUL, a, b); }
static inline uint32_t addi(gm *g, uint32_t a, int32_t b) { return b ? add(g, a, ci(g, b)) : a; }
static inline uint32_t muli(gm *g, uint32_t a, int32_t b) { return b == 1 ? a : mul(g, a, ci(g, b)); }
static inline uint32_t shri(gm *g, uint32_t a, int32_t b) { return o2(g, KILN_KOP_SHR, a, ci(g, b)); }
static inline uint32_t andi(gm *g, uint32_t a, int32_t b) { return o2(g, KILN_KOP_AND, a, ci(g, b)); }
static inline uint32_t op1(gm *g, enum kiln_kop op, enum kiln_kt t, uint32_t a, int32_t imm)
{
    return kiln_kir_op(g->k, op, t, a, KILN_IDX_NONE, KILN_IDX_NONE, imm);
}
static inline uint32_t ld4(gm *g, uint32_t slot, uint32_t word) { return op1(g, KILN_KOP_LD4, KILN_KT_V4, word, (int32_t)slot); }
static inline uint32_t lanef(gm *g, uint32_t v4, int i) { return kl_lanef(g->k, v4, i); }
static inline void sts(gm *g, uint32_t idx, uint32_t v) { kiln_kir_op(g->k, KILN_KOP_STS, KILN_KT_NONE, idx, v, KILN_IDX_NONE, (int32_t)g->sh); }
static inline void barrier(gm *g) { kiln_kir_op(g->k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static inline void kif(gm *g, uint32_t p) { kiln_kir_op(g->k, KILN_KOP_IF, KILN_KT_NONE, p, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static inline void kendif(gm *g) { kiln_kir_op(g->k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static inline uint32_t xori(gm *g, uint32_t a, int32_t b) { return b ? o2(g, KILN_KOP_XOR, a, ci(g, b)) : a; }
static inline uint32_t cu(gm *g, uint32_t v) { return kiln_ku(g->k, v); }
static inline void sts4(gm *g, uint32_t idx, uint32_t v4) { kiln_kir_op(g->k, KILN_KOP_STS4, KILN_KT_NONE, idx, v4, KILN_IDX_NONE, (int32_t)g->sh); }
static inline uint32_t addu(gm *g, uint32_t a, uint32_t b) { return o2(g, KILN_KOP_ADD, a, b); }
static inline uint32_t to_u(gm *g, uint32_t i32) { return kiln_kcvt(g->k, KILN_KT_U32, i32); }
static inline kiln_dtype wdtype(const gv *s, int j) { return (kiln_dtype)s->g->nodes[s->g->nodes[s->mm[j]].src[1]].dtype; }
static inline bool is_float_w(kiln_dtype t) { return t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16; }

/* lower_gemm.c */
void kl_gm_chunk_values(gm *g, const gv_chunk *ch, uint32_t bc, int sub, uint32_t val[16]);
void kl_gm_drain(gm *g, const gv_group *G, int r0, int rows);
int kl_gm_x_parts(const gv *s, kiln_dtype t, bool x_exact);
void kl_gm_prepare(gm *G);
/* lower_gemm_wg.c */
void kl_gw_group(gm *g, const gv_group *G);
bool kl_gw_choose(gm *G, const kiln_lower_target *tg);
int64_t kl_gw_col_blocks(const gv *s, int bn);
void kl_gw_shape(gm *G, const kiln_lower_target *tg);
void kl_gw_cluster(gm *G, const kiln_lower_target *tg);
bool kl_gw_persist(gm *G, const kiln_lower_target *tg);
void kl_gw_pp(gm *g);
void kl_gw_reduce(const gm *G, kiln_kir *k);
void kl_gw_setup(gm *G, kiln_kir *k);
void kl_gw_sync(gm *g, enum kiln_kop op, uint32_t a, uint32_t b, int32_t imm);

#endif
