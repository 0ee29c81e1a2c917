/* Prefill flash attention for Hopper (sm_90a) in the FlashAttention-3 style, under codegen.precision
 * = KILN_PREC_F16 with f16 or bf16 KV caches of head_dim 64, 128 or 256, with gemma's soft-cap and
 * sliding window: 384 threads, consumer warpgroups 0 and 1 (64 query rows each) and a producer
 * warpgroup 2. The consumers stage Q (pre-scaled to base-2 logits, one 16-bit part) once into
 * shared memory in the 128-byte-swizzled layout while the producer has the TMA engine bring each
 * K and V tile (128 keys; 64 at head_dim 256, whose O takes 128 registers) into a 2-stage mbarrier
 * ring (a 2-D tensor map over the head-major cache: rows kv_head * max_ctx + key, boxes of 64
 * dims), K and V from their own producer warps; the tile that crosses n_kv the V warps stage
 * themselves with V's keys past n_kv zeroed (P is 0 there, but 0 x a stale inf is not). A consumer
 * computes S = Q K^T by WGMMA from shared memory (both K-major), caps, masks and updates the online
 * softmax on the accumulator fragment, converts P to 16-bit register A fragments and adds P V by
 * WGMMA with V MN-major (transposed descriptor) one tile later, so the softmax of a tile runs while
 * the previous tile's P V is on the tensor cores; the two warpgroups take turns issuing (named
 * barriers), so one's softmax also runs while the other's products hold the tensor cores. Grouped
 * query heads share a block's K/V tiles (rows are (token, head) pairs); blocks run latest rows
 * first, start at the first tile their first row's window reaches and stop at the keys their last
 * row sees. Choices per shape in one place (fw_choose): the ping-pong, and for short prompts
 * 64-row blocks (one consumer warpgroup, two blocks an SM) and key splits over a thread block
 * cluster (rank 0 folds the others' partial results in). Must not know any target's syntax; the
 * mma.sync kernel (lower_flash.c) takes every other shape. */
#include "codegen/lower.h"

#include <math.h>
#include <string.h>

#define FW_KMAX 128   /* keys a tile at most (the S accumulator m64n128; f->nk) */
#define FW_STAGES 2   /* stages of the K and of the V ring */
#define FW_VTHREADS 96 /* the producer's V threads (its warps 1 .. 3) */

typedef struct fw {
    kiln_kir *k;
    const kiln_graph *g;
    int32_t hd, G, n_head, max_ctx, n_kvh;
    bool bf;                     /* bf16 cache: q and P as bf16 */
    bool q16;                    /* q's memory is 16-byte aligned (not a view at an odd offset): 16-byte loads */
    uint32_t tid, kvh, head0, R0, n_tok, n_kv, past, ntiles;
    uint32_t qsh, ring, bars;    /* shared arrays: Q, the K/V ring, the mbarriers */
    uint32_t qbase, rbase, bbase; /* their U32 byte addresses */
    uint32_t kmap, vmap, vs;     /* tensor maps of the caches; V's buffer slot (the boundary tile) */
    bool pingpong;               /* the consumer warpgroups take turns at the tensor cores (named barriers) */
    int32_t rows;                /* query rows a block: 128 (two consumer warpgroups) or 64 (one) */
    int32_t ct;                  /* consumer threads: rows * 2 (64 rows a warpgroup); the producer warpgroup follows */
    int32_t nk;                  /* keys a tile: 128, 64 at head_dim 256 and in 64-row blocks of head_dim 128 */
    float capl2;                 /* soft-cap in the base-2 units of the scores (0: none) */
    int32_t win;                 /* sliding window (0: none) */
    uint32_t t0;                 /* I32 the block's first tile (its first row's window start / nk, 0 without a window;
                                    + its rank under a key split) */
    int32_t split;               /* blocks of a cluster sharing the rows' tiles (each every split-th tile); 1: none */
    uint32_t rank, scr;          /* I32 the block's rank in its cluster; the scratch slot of the partial results */
} fw;

static uint32_t ci(fw *f, int32_t v) { return kiln_ki(f->k, v); }
static uint32_t cu(fw *f, uint32_t v) { return kiln_ku(f->k, v); }
static uint32_t o2(fw *f, enum kiln_kop op, uint32_t a, uint32_t b) { return kiln_k2(f->k, op, a, b); }
static uint32_t to_u(fw *f, uint32_t i32) { return kiln_kcvt(f->k, KILN_KT_U32, i32); }
/* The f16 (bf16 cache: bf16) pair of a (low half) and b in one conversion. */
static uint32_t pack2(fw *f, uint32_t a, uint32_t b) { return kiln_kir_op(f->k, KILN_KOP_PACK2, KILN_KT_U32, a, b, KILN_IDX_NONE, f->bf); }
static void sync_op(fw *f, enum kiln_kop op, uint32_t a, uint32_t b, int32_t imm)
{
    kiln_kir_op(f->k, op, KILN_KT_NONE, a, b, KILN_IDX_NONE, imm);
}

static int32_t tile_bytes(const fw *f) { return f->nk * f->hd * 2; } /* one K or V tile */
/* Key split: words of a consumer thread's partial result (m and l of its two rows, its O lanes). */
static int32_t fw_part_words(const fw *f) { return 4 + (f->hd == 256 ? 2 : 1) * (f->hd == 64 ? 32 : 64); }
/* Byte address of stage s's K (v = 0) or V (v = 1) tile; its hd / 64 chunks are nk rows of 128 bytes each. */
static uint32_t stage_at(fw *f, uint32_t s, int v)
{
    return o2(f, KILN_KOP_ADD, f->rbase, to_u(f, kiln_kaddi(f->k, kiln_kmuli(f->k, s, 2 * tile_bytes(f)), v * tile_bytes(f))));
}
/* mbarrier `which` (0: K full, 1: V full, 2: K empty, 3: V empty) of stage s; 4 (stage 0): Q staged. */
static uint32_t bar_at(fw *f, int which, uint32_t s)
{
    return o2(f, KILN_KOP_ADD, f->bbase, to_u(f, kiln_kmuli(f->k, kiln_kaddi(f->k, s, which * FW_STAGES), 8)));
}
/* The stage of the block's i-th tile (tile t0 + i) and the parity of its round. */
static uint32_t slot_of(fw *f, uint32_t i, uint32_t *ph)
{
    *ph = kiln_kandi(f->k, kiln_kshri(f->k, i, 1), 1);
    return kiln_kandi(f->k, i, 1);
}

/* Word index of 16-byte piece p (8 dims) of row r of a swizzled tile of `rows` rows whose hd / 64
 * chunks follow each other (piece p: chunk p / 8, 16-byte column p % 8 ^ r % 8). */
static uint32_t swz_word(fw *f, uint32_t r, uint32_t p, int32_t rows)
{
    kiln_kir *k = f->k;
    uint32_t col = o2(f, KILN_KOP_XOR, kiln_kandi(k, p, 7), kiln_kandi(k, r, 7));
    uint32_t byte = o2(f, KILN_KOP_ADD, kiln_kmuli(k, kiln_kshri(k, p, 3), rows * 128),
                       o2(f, KILN_KOP_ADD, kiln_kmuli(k, r, 128), kiln_kmuli(k, col, 16)));
    return kiln_kshri(k, byte, 2);
}

/* The 8 q values of item (row R, piece p): dims 8 p .. 8 p + 7 of row R (token R / G clamped
 * into the run, head head0 + R % G), as f32 values, loaded 16 bytes at a time where q is f32/f16/bf16. */
static void q_values(fw *f, const kiln_node_rec *q, uint32_t qs, uint32_t R, uint32_t p, uint32_t x[8])
{
    kiln_kir *k = f->k;
    kiln_dtype t = (kiln_dtype)q->dtype;
    uint32_t tok = o2(f, KILN_KOP_MIN, o2(f, KILN_KOP_DIV, R, ci(f, f->G)), kiln_kaddi(k, f->n_tok, -1));
    uint32_t head = o2(f, KILN_KOP_ADD, f->head0, o2(f, KILN_KOP_REM, R, ci(f, f->G)));
    uint32_t at = o2(f, KILN_KOP_ADD, kiln_kmuli(k, o2(f, KILN_KOP_ADD, kiln_kmuli(k, tok, f->n_head), head), f->hd), kiln_kmuli(k, p, 8));
    if (f->q16 && (t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16)) { /* element 8 p of a row of hd (a multiple of 64) */
        bool h = t != KILN_DTYPE_F32;
        for (int v = 0; v < (h ? 1 : 2); v++) {
            uint32_t w4 = kiln_kld4(k, qs, kiln_kaddi(k, h ? kiln_kshri(k, at, 1) : at, 4 * v));
            for (int j = 0; j < 4; j++) {
                uint32_t w = kiln_klane(k, w4, j);
                if (!h) x[4 * v + j] = kiln_kbitcast(k, KILN_KT_F32, w);
                else
                    for (int e = 0; e < 2; e++)
                        x[2 * j + e] = kiln_kir_op(k, t == KILN_DTYPE_F16 ? KILN_KOP_H2F : KILN_KOP_B2F, KILN_KT_F32, w, KILN_IDX_NONE,
                                                   KILN_IDX_NONE, e);
            }
        }
        return;
    }
    for (int e = 0; e < 8; e++) x[e] = kl_load(k, qs, t, kiln_kaddi(k, at, e));
}

/* The consumers (f->ct threads, after their setmaxnreg): the block's rows of q, scaled by the
 * attention's scale x log2(e), as one 16-bit part into Q's swizzled tile; straight-line code, so
 * every load is in flight at once while the producer's first TMAs run. Then every consumer arrives
 * at the Q mbarrier (its stores shown to WGMMA first) and waits for the others. */
static void stage_q(fw *f, const kiln_node_rec *n, const kiln_node_rec *q, uint32_t qs)
{
    kiln_kir *k = f->k;
    int32_t pieces = f->hd / 8, per = f->rows * pieces / f->ct;
    float qscale = n->f[0] * 1.44269504088896341f;
    for (int u = 0; u < per; u++) {
        uint32_t i = kiln_kaddi(k, f->tid, f->ct * u);
        uint32_t r = o2(f, KILN_KOP_DIV, i, ci(f, pieces)), p = o2(f, KILN_KOP_REM, i, ci(f, pieces)), x[8], v4 = KILN_IDX_NONE;
        q_values(f, q, qs, o2(f, KILN_KOP_ADD, f->R0, r), p, x);
        for (int e = 0; e < 4; e++)
            v4 = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v4,
                             pack2(f, o2(f, KILN_KOP_MUL, x[2 * e], kiln_kf(k, qscale)), o2(f, KILN_KOP_MUL, x[2 * e + 1], kiln_kf(k, qscale))),
                             KILN_IDX_NONE, e);
        kiln_kir_op(k, KILN_KOP_STS4, KILN_KT_NONE, swz_word(f, r, p, f->rows), v4, KILN_IDX_NONE, (int32_t)f->qsh);
    }
    sync_op(f, KILN_KOP_FENCE_ASYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0); /* Q's stores, visible to WGMMA */
    uint32_t qb = bar_at(f, 4, ci(f, 0));
    sync_op(f, KILN_KOP_MBAR_ARRIVE, qb, KILN_IDX_NONE, 0);
    sync_op(f, KILN_KOP_MBAR_WAIT, qb, ci(f, 0), 0);
}

/* One TMA box of map m: {dst, mbarrier, dim, row}. */
static void tma(fw *f, uint32_t m, uint32_t dst, uint32_t bar, int32_t dim, uint32_t row)
{
    kiln_kir *k = f->k;
    uint32_t v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, KILN_IDX_NONE, dst, KILN_IDX_NONE, 0);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, bar, KILN_IDX_NONE, 1);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, cu(f, (uint32_t)dim), KILN_IDX_NONE, 2);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, to_u(f, row), KILN_IDX_NONE, 3);
    kiln_kir_op(k, KILN_KOP_TMA_LOAD, KILN_KT_NONE, v, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)m);
}

/* The tile's hd / 64 boxes of map m (K or V rows kb .. kb + nk - 1 of the block's kv head) into dst. */
static void tma_tile(fw *f, uint32_t m, uint32_t dst, uint32_t bar, uint32_t kb)
{
    uint32_t row = o2(f, KILN_KOP_ADD, kiln_kmuli(f->k, f->kvh, f->max_ctx), kb);
    for (int c = 0; c < f->hd / 64; c++)
        tma(f, m, o2(f, KILN_KOP_ADD, dst, cu(f, (uint32_t)(c * f->nk * 128))), bar, 64 * c, row);
}

/* The first key of the block's i-th tile (tile t0 + i split). */
static uint32_t key0(fw *f, uint32_t i)
{
    return kiln_kmuli(f->k, o2(f, KILN_KOP_ADD, f->t0, f->split > 1 ? kiln_kmuli(f->k, i, f->split) : i), f->nk);
}

/* The producer warpgroup's K warp (its first thread alone): per tile, wait for its K stage to be
 * freed and bring K by TMA. K and V have their own producers so that a V stage freed late (P V
 * runs a tile behind) never holds back the next K. */
static void producer_k(fw *f)
{
    kiln_kir *k = f->k;
    uint32_t i = kiln_kvar(k, ci(f, 0));
    kiln_kloop(k, i, f->ntiles, ci(f, 1));
    uint32_t ph, s = slot_of(f, i, &ph);
    sync_op(f, KILN_KOP_MBAR_WAIT, bar_at(f, 2, s), o2(f, KILN_KOP_XOR, ph, ci(f, 1)), 0); /* a fresh barrier passes parity 1 */
    uint32_t fk = bar_at(f, 0, s);
    sync_op(f, KILN_KOP_MBAR_ARRIVE, fk, KILN_IDX_NONE, tile_bytes(f));
    tma_tile(f, f->kmap, stage_at(f, s, 0), fk, key0(f, i));
    kl_loop_end(k);
}

/* The producer warpgroup's V warps (its threads 32 .. 127, vt = 0 .. 95; vt 0 issues the TMAs):
 * per tile, wait for its V stage and bring V by TMA, or, for the tile that crosses n_kv, by every
 * V thread's own loads with the keys past n_kv as zeros (stored in the TMA's layout, then a proxy
 * fence). */
static void producer_v(fw *f, uint32_t vt)
{
    kiln_kir *k = f->k;
    uint32_t lead = o2(f, KILN_KOP_EQ, vt, ci(f, 0));
    uint32_t i = kiln_kvar(k, ci(f, 0));
    kiln_kloop(k, i, f->ntiles, ci(f, 1));
    uint32_t ph, s = slot_of(f, i, &ph), kb = key0(f, i);
    sync_op(f, KILN_KOP_MBAR_WAIT, bar_at(f, 3, s), o2(f, KILN_KOP_XOR, ph, ci(f, 1)), 0);
    uint32_t fv = bar_at(f, 1, s), bnd = o2(f, KILN_KOP_LT, f->n_kv, kiln_kaddi(k, kb, f->nk));
    kiln_kif(k, kiln_kir_op(k, KILN_KOP_PAND, KILN_KT_PRED, lead, kiln_k1(k, KILN_KOP_PNOT, bnd), KILN_IDX_NONE, 0));
    sync_op(f, KILN_KOP_MBAR_ARRIVE, fv, KILN_IDX_NONE, tile_bytes(f));
    tma_tile(f, f->vmap, stage_at(f, s, 1), fv, kb);
    kiln_kelse(k);
    kiln_kif(k, bnd);
    {
        int32_t pieces = f->hd / 8;
        uint32_t vword = kiln_kaddi(k, kiln_kmuli(k, s, 2 * tile_bytes(f) / 4), tile_bytes(f) / 4); /* V tile's first word in the ring */
        uint32_t it = kiln_kvar(k, vt);
        kiln_kloop(k, it, ci(f, f->nk * pieces), ci(f, FW_VTHREADS));
        uint32_t r = o2(f, KILN_KOP_DIV, it, ci(f, pieces)), p = o2(f, KILN_KOP_REM, it, ci(f, pieces));
        uint32_t key = o2(f, KILN_KOP_ADD, kb, r);
        uint32_t row = o2(f, KILN_KOP_ADD, kiln_kmuli(k, f->kvh, f->max_ctx), o2(f, KILN_KOP_MIN, key, ci(f, f->max_ctx - 1)));
        uint32_t x = kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4, o2(f, KILN_KOP_ADD, kiln_kmuli(k, row, f->hd / 2), kiln_kmuli(k, p, 4)),
                                 KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)f->vs);
        uint32_t ok = o2(f, KILN_KOP_LT, key, f->n_kv), v4 = KILN_IDX_NONE;
        for (int j = 0; j < 4; j++)
            v4 = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v4, kiln_ksel(k, KILN_KT_U32, ok, kiln_klane(k, x, j), cu(f, 0)),
                             KILN_IDX_NONE, j);
        kiln_kir_op(k, KILN_KOP_STS4, KILN_KT_NONE, o2(f, KILN_KOP_ADD, vword, swz_word(f, r, p, f->nk)), v4, KILN_IDX_NONE,
                    (int32_t)f->ring);
        kl_loop_end(k);
        sync_op(f, KILN_KOP_FENCE_ASYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    }
    kiln_kendif(k);
    sync_op(f, KILN_KOP_MBAR_ARRIVE, fv, KILN_IDX_NONE, 0);
    kiln_kendif(k);
    kl_loop_end(k);
}

/* The consumer's thread geometry and running state. */
typedef struct fwc {
    uint32_t qq, seen[2], m[2], l[2], S, O, zero, tok[2], qrow[2];
    uint32_t O2;                  /* head_dim 256: O's dims 128 .. 255 (a second accumulator); else KILN_IDX_NONE */
    uint32_t first[2];            /* I32 the rows' first keys under the window */
    uint32_t qa;                  /* U32 this warpgroup's 64 rows of Q */
    uint32_t seen0;               /* I32 keys the warpgroup's first row sees (the fewest of its rows) */
    uint32_t firstl;              /* I32 the window's first key of its last row (the latest of its rows) */
    uint32_t pv[FW_KMAX / 4];     /* U32 variables: the previous tile's P fragments (P V runs a tile behind) */
    int32_t flags_s, flags_o;     /* the two products' WGMMA flags */
    uint32_t wgi, mine, other;    /* I32 the warpgroup (0/1); its named barrier (1 + wgi) and the other's */
} fwc;

static uint32_t lanef(fw *f, uint32_t w64, int j) { return kiln_kir_op(f->k, KILN_KOP_LANE, KILN_KT_F32, w64, KILN_IDX_NONE, KILN_IDX_NONE, j); }
static uint32_t red4(fw *f, uint32_t v, enum kiln_kred op)
{
    return kiln_kir_op(f->k, KILN_KOP_REDUCE, KILN_KT_F32, v, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)((op << 16) | 4));
}

/* The soft-cap of base-2 score x: c tanh(x / c) with c = f->capl2 (kl_attn_score's cap in the
 * scores' units), as c - 2 c / (1 + e^(2 x / c)) from one ex2 and one rsqrt squared (2 MUFU and 4
 * FMA-pipe instructions; kl_attn_score's IEEE divisions and continued fraction near 0 cost ~10x
 * that per score). Its error near 0 is absolute, ~1e-7 c, which is what the softmax feels (a
 * score off by d scales its weight by 2^d); +-inf saturate to +-c. */
static uint32_t softcap(fw *f, uint32_t x)
{
    kiln_kir *k = f->k;
    float c = f->capl2;
    uint32_t e = kiln_k1(k, KILN_KOP_EX2, o2(f, KILN_KOP_MUL, x, kiln_kf(k, 2.88539008177792681f / c)));
    uint32_t r = kiln_k1(k, KILN_KOP_RSQRT, o2(f, KILN_KOP_ADD, e, kiln_kf(k, 1.0f)));
    return kiln_kfma(k, o2(f, KILN_KOP_MUL, r, r), kiln_kf(k, -2.0f * c), kiln_kf(k, c));
}

/* The soft-cap on S's lanes (every tile), then the causal and window masks in place, only in the
 * tiles that reach past a row's keys (those near the diagonal, and the tile that crosses n_kv) or
 * begin before a row's window: a warpgroup-uniform branch; the other tiles skip it. */
static void mask_s(fw *f, fwc *c, uint32_t kb)
{
    kiln_kir *k = f->k;
    uint32_t colq = kiln_kmuli(k, c->qq, 2);
    for (int j = 0; f->capl2 != 0 && j < f->nk / 2; j++)
        kiln_kir_op(k, KILN_KOP_WSET, KILN_KT_NONE, c->S, softcap(f, lanef(f, c->S, j)), KILN_IDX_NONE, j);
    uint32_t near = o2(f, KILN_KOP_LT, c->seen0, kiln_kaddi(k, kb, f->nk));
    if (f->win) near = kiln_kir_op(k, KILN_KOP_POR, KILN_KT_PRED, near, o2(f, KILN_KOP_LT, kb, c->firstl), KILN_IDX_NONE, 0);
    kiln_kif(k, near);
    for (int j = 0; j < f->nk / 2; j++) {
        uint32_t key = o2(f, KILN_KOP_ADD, kb, kiln_kaddi(k, colq, 8 * (j >> 2) + (j & 1))), r = (j >> 1) & 1;
        uint32_t in = o2(f, KILN_KOP_LT, key, c->seen[r]);
        if (f->win) in = kiln_kir_op(k, KILN_KOP_PAND, KILN_KT_PRED, in, o2(f, KILN_KOP_LE, c->first[r], key), KILN_IDX_NONE, 0);
        kiln_kir_op(k, KILN_KOP_WSET, KILN_KT_NONE, c->S, kiln_ksel(k, KILN_KT_F32, in, lanef(f, c->S, j), kiln_kf(k, -INFINITY)),
                    KILN_IDX_NONE, j);
    }
    kiln_kendif(k);
}

/* Online softmax of tile kb's scores (S's nk / 2 lanes: lane j is row (j >> 1) & 1, key kb + 8 (j >> 2)
 * + 2 q + (j & 1)), capped and masked to each row's keys: the rows' new max and sums, O's factors
 * alpha[2] (applied once the previous tile's P V has retired), and P in f32 (p[j] for S's lane j).
 * Touches neither O nor the P variables. A row that sees no key of the tiles walked so far keeps
 * the max -inf, and 0 stands in for it (exp2(-inf - 0) = 0, not exp2(-inf - -inf) = NaN): under a
 * window (its first tiles), and under a key split, whose rank r >= 1 starts at tile t0 + r, which a
 * block's earlier rows may see none of (their keys end in an earlier rank's tiles). Else every row
 * sees key 0 in tile 0 and the max is finite from the first tile on. */
static void softmax(fw *f, fwc *c, uint32_t kb, uint32_t alpha[2], uint32_t p[FW_KMAX / 2])
{
    kiln_kir *k = f->k;
    uint32_t sv[FW_KMAX / 2], ms[2];
    mask_s(f, c, kb);
    for (int r = 0; r < 2; r++) {
        uint32_t mx = kiln_kf(k, -INFINITY);
        for (int j = 0; j < f->nk / 2; j++) {
            if (((j >> 1) & 1) != r) continue;
            sv[j] = lanef(f, c->S, j);
            mx = o2(f, KILN_KOP_MAX, mx, sv[j]);
        }
        uint32_t mn = o2(f, KILN_KOP_MAX, c->m[r], red4(f, mx, KILN_KRED_MAX));
        ms[r] = f->win || f->split > 1 ? kiln_ksel(k, KILN_KT_F32, o2(f, KILN_KOP_EQ, mn, kiln_kf(k, -INFINITY)), kiln_kf(k, 0), mn) : mn;
        alpha[r] = kiln_k1(k, KILN_KOP_EX2, o2(f, KILN_KOP_SUB, c->m[r], ms[r]));
        kiln_kset(k, c->m[r], mn);
    }
    uint32_t sum[2] = {kiln_kf(k, 0), kiln_kf(k, 0)};
    for (int j = 0; j < f->nk / 2; j++) {
        int r = (j >> 1) & 1;
        p[j] = kiln_k1(k, KILN_KOP_EX2, o2(f, KILN_KOP_SUB, sv[j], ms[r]));
        sum[r] = o2(f, KILN_KOP_ADD, sum[r], p[j]);
    }
    for (int r = 0; r < 2; r++) kiln_kset(k, c->l[r], kiln_kfma(k, c->l[r], alpha[r], sum[r]));
}

/* The first key a row that sees `seen` keys sees under the window (kl_attn_first_key's rule). */
static uint32_t window_start(fw *f, uint32_t seen) { return o2(f, KILN_KOP_MAX, o2(f, KILN_KOP_SUB, seen, ci(f, f->win)), ci(f, 0)); }

/* The consumer's rows (row R of the block: token R / G, head head0 + R % G), their keys, and its
 * state: m, l, the S and O accumulators, the P variables. */
static void consumer_rows(fw *f, fwc *c)
{
    kiln_kir *k = f->k;
    uint32_t wg = kiln_kshri(k, f->tid, 7), w = kiln_kandi(k, kiln_kshri(k, f->tid, 5), 3), lane = kiln_kandi(k, f->tid, 31);
    c->wgi = wg, c->mine = kiln_kaddi(k, wg, 1), c->other = o2(f, KILN_KOP_SUB, ci(f, 2), wg);
    uint32_t g = kiln_kshri(k, lane, 2);
    c->qq = kiln_kandi(k, lane, 3);
    for (int r = 0; r < 2; r++) {
        uint32_t R = o2(f, KILN_KOP_ADD, f->R0, o2(f, KILN_KOP_ADD, kiln_kmuli(k, wg, 64), o2(f, KILN_KOP_ADD, kiln_kmuli(k, w, 16), kiln_kaddi(k, g, 8 * r))));
        c->tok[r] = o2(f, KILN_KOP_DIV, R, ci(f, f->G));
        uint32_t t = o2(f, KILN_KOP_MIN, c->tok[r], kiln_kaddi(k, f->n_tok, -1));
        c->qrow[r] = o2(f, KILN_KOP_ADD, kiln_kmuli(k, t, f->n_head), o2(f, KILN_KOP_ADD, f->head0, o2(f, KILN_KOP_REM, R, ci(f, f->G))));
        c->seen[r] = o2(f, KILN_KOP_ADD, f->past, kiln_kaddi(k, c->tok[r], 1));
        c->first[r] = f->win ? window_start(f, c->seen[r]) : KILN_IDX_NONE;
        c->m[r] = kiln_kvar(k, kiln_kf(k, -INFINITY));
        c->l[r] = kiln_kvar(k, kiln_kf(k, 0));
    }
    c->zero = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_W64, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    c->S = kiln_kvar(k, c->zero), c->O = kiln_kvar(k, c->zero);
    c->O2 = f->hd == 256 ? kiln_kvar(k, c->zero) : KILN_IDX_NONE;
    for (int j = 0; j < f->nk / 4; j++) c->pv[j] = kiln_kvar(k, cu(f, 0));
    c->qa = o2(f, KILN_KOP_ADD, f->qbase, to_u(f, kiln_kmuli(k, wg, 64 * 128)));
    uint32_t first = o2(f, KILN_KOP_ADD, f->R0, kiln_kmuli(k, wg, 64));
    c->seen0 = o2(f, KILN_KOP_ADD, f->past, kiln_kaddi(k, o2(f, KILN_KOP_DIV, first, ci(f, f->G)), 1));
    uint32_t lastw = o2(f, KILN_KOP_DIV, kiln_kaddi(k, first, 63), ci(f, f->G)); /* the warpgroup's last row's token */
    c->firstl = f->win ? window_start(f, o2(f, KILN_KOP_ADD, f->past, kiln_kaddi(k, lastw, 1))) : KILN_IDX_NONE;
    int32_t bf = f->bf ? 1 : 0;
    c->flags_s = (1024 / 16) << 8 | (f->nk / 16 % 8) << 4 | 2 | bf; /* N = nk; SBO 1024: 8 rows of 128 bytes, swizzled */
    /* N = hd (128 per accumulator at 256), A in registers, V MN-major: LBO = a 64-dim chunk of nk rows */
    c->flags_o = (f->nk * 128 / 16) << 16 | (1024 / 16) << 8 | (f->hd / 16 % 8) << 4 | 8 | 4 | 2 | bf;
}

/* The register A fragments of P V from the P variables. */
static void p_frags(fw *f, fwc *c, uint32_t a[FW_KMAX / 16])
{
    for (int kk = 0; kk < f->nk / 16; kk++) {
        a[kk] = KILN_IDX_NONE;
        for (int rr = 0; rr < 4; rr++) a[kk] = kiln_kir_op(f->k, KILN_KOP_SETLANE, KILN_KT_V4, a[kk], c->pv[4 * kk + rr], KILN_IDX_NONE, rr);
    }
}

/* S = Q K^T of the tile in stage s, one group (K has landed, the fence issued). */
static void issue_s(fw *f, fwc *c, uint32_t s)
{
    uint32_t kt = stage_at(f, s, 0);
    for (int kk = 0; kk < f->hd / 16; kk++) { /* chunk kk / 4 of 64 dims, 32 bytes per k16 step inside it */
        uint32_t a = o2(f, KILN_KOP_ADD, c->qa, cu(f, (uint32_t)(kk / 4 * f->rows * 128 + kk % 4 * 32)));
        uint32_t b = o2(f, KILN_KOP_ADD, kt, cu(f, (uint32_t)(kk / 4 * f->nk * 128 + kk % 4 * 32)));
        kiln_kir_op(f->k, KILN_KOP_WGMMA, KILN_KT_NONE, c->S, a, b, c->flags_s);
    }
    sync_op(f, KILN_KOP_WG_COMMIT, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

/* O += P V of the tile in stage s from P's fragments pa[], one group (V has landed, the fence
 * issued); at head_dim 256 O2 takes V's dims 128 .. 255 (its chunks 2 and 3). */
static void issue_pv(fw *f, fwc *c, uint32_t s, const uint32_t pa[FW_KMAX / 16])
{
    uint32_t vt = stage_at(f, s, 1);
    for (int kk = 0; kk < f->nk / 16; kk++) { /* keys 16 kk ..: 16 rows of 128 bytes further into V's chunks */
        kiln_kir_op(f->k, KILN_KOP_WGMMA, KILN_KT_NONE, c->O, pa[kk], o2(f, KILN_KOP_ADD, vt, cu(f, (uint32_t)(kk * 16 * 128))), c->flags_o);
        if (c->O2 != KILN_IDX_NONE)
            kiln_kir_op(f->k, KILN_KOP_WGMMA, KILN_KT_NONE, c->O2, pa[kk], o2(f, KILN_KOP_ADD, vt, cu(f, (uint32_t)(kk * 16 * 128 + 2 * f->nk * 128))),
                        c->flags_o);
    }
    sync_op(f, KILN_KOP_WG_COMMIT, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

/* Waits for mbarrier `which` of stage s in phase ph. Every wait and every register the WGMMAs read
 * comes before the WG_FENCE that precedes them: ptxas serializes all of a kernel's WGMMAs when an
 * input is defined, or control flow passes, between that fence and them. */
static void wait_bar(fw *f, int which, uint32_t s, uint32_t ph) { sync_op(f, KILN_KOP_MBAR_WAIT, bar_at(f, which, s), ph, 0); }
static void wg_fence(fw *f) { sync_op(f, KILN_KOP_WG_FENCE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void wg_wait(fw *f, int n) { sync_op(f, KILN_KOP_WG_WAIT, KILN_IDX_NONE, KILN_IDX_NONE, n); }

/* Softmax of tile kb (after S has retired and K's stage is freed); unless `first` (O is 0 then),
 * the previous tile's P V is waited for (its V stage freed) and O rescaled; then P's register A
 * words into the P variables (lane rr of the fragment of keys 16 kk ..: word 4 kk + rr). P is
 * packed only after that wait: ptxas serializes every WGMMA when a register that may share an
 * in-flight WGMMA's input is defined (the packed words become the next fragments). */
static void softmax_step(fw *f, fwc *c, uint32_t kb, bool first, uint32_t sp)
{
    kiln_kir *k = f->k;
    uint32_t alpha[2], p[FW_KMAX / 2];
    softmax(f, c, kb, alpha, p);
    if (!first) {
        wg_wait(f, 0); /* the previous tile's P V has retired: O and its V stage are free */
        sync_op(f, KILN_KOP_MBAR_ARRIVE, bar_at(f, 3, sp), KILN_IDX_NONE, 0);
        for (int h = 0; h < (c->O2 != KILN_IDX_NONE ? 2 : 1); h++) {
            uint32_t o = h ? c->O2 : c->O;
            for (int j = 0; j < (f->hd == 64 ? 32 : 64); j++)
                kiln_kir_op(k, KILN_KOP_WSET, KILN_KT_NONE, o, o2(f, KILN_KOP_MUL, lanef(f, o, j), alpha[(j >> 1) & 1]), KILN_IDX_NONE, j);
        }
    }
    for (int kk = 0; kk < f->nk / 16; kk++) /* A lane rr: row g + 8 (rr & 1), keys 16 kk + 8 (rr >> 1) + 2 q + {0, 1} */
        for (int rr = 0; rr < 4; rr++) {
            int j0 = 4 * (2 * kk + (rr >> 1)) + 2 * (rr & 1);
            kiln_kset(k, c->pv[4 * kk + rr], pack2(f, p[j0], p[j0 + 1]));
        }
}

/* The rows' outputs: O / (their sums over the quad; every row sees at least its own key: >= 1),
 * staged through shared memory so that they leave as whole 16-byte pieces of rows (FlashAttention-3's
 * epilogue; from the accumulator fragments a warp's store would touch 8 rows' sectors, half of each).
 * The warpgroup's own 64 rows of Q's tile take them (its S products have retired; the other
 * warpgroup's rows are elsewhere in each 64-dim chunk), in Q's 128-byte-swizzled layout (a warp's 8
 * rows x 4 quad lanes hit 32 distinct banks); rows of hd * 2 bytes: one pass for a 16-bit output
 * (the O matmul's x type, kiln_graph_narrow_gemm_inputs: pairs packed by cvt.rn as the GEMM's split
 * kernel would round them), two of hd / 2 dims for f32. A named barrier of the warpgroup (3 + w,
 * 128 threads) separates the staging from the reading (and a pass's reading from the next staging). */
static void consumer_store(fw *f, fwc *c, uint32_t node)
{
    kiln_kir *k = f->k;
    kiln_dtype ot = (kiln_dtype)f->g->nodes[node].dtype;
    bool h16 = ot == KILN_DTYPE_F16 || ot == KILN_DTYPE_BF16;
    int32_t npass = h16 ? 1 : 2, dp = f->hd / npass, ncol = f->hd * 2 / 16; /* 16-byte pieces a staged row */
    uint32_t os = kiln_kir_buf(k, KILN_KBUF_NODE, node, true);
    uint32_t w = kiln_kshri(k, f->tid, 7), t = kiln_kandi(k, f->tid, 127), wp = kiln_kandi(k, kiln_kshri(k, f->tid, 5), 3);
    uint32_t g8 = kiln_kandi(k, kiln_kshri(k, f->tid, 2), 7), bar = kiln_kaddi(k, w, 3);
    uint32_t inv[2];
    for (int r = 0; r < 2; r++) inv[r] = o2(f, KILN_KOP_DIV, kiln_kf(k, 1.0f), red4(f, c->l[r], KILN_KRED_SUM));
    for (int h = 0; h < npass; h++) {
        if (h) kiln_kir_op(k, KILN_KOP_NBAR_SYNC, KILN_KT_NONE, bar, KILN_IDX_NONE, KILN_IDX_NONE, 128 << 8); /* pass 0 read */
        for (int j = 0; j < f->hd / 2; j += 2) { /* lanes j, j + 1 of O (j < 64) or of O2 (dims 128 ..): dims d, d + 1 */
            int jj = j & 63, r = (jj >> 1) & 1, d0 = 128 * (j >> 6) + 8 * (jj >> 2) - h * dp; /* + 2 q */
            if (d0 < 0 || d0 >= dp) continue;
            uint32_t o = j < 64 ? c->O : c->O2;
            uint32_t row = o2(f, KILN_KOP_ADD, kiln_kmuli(k, w, 64), o2(f, KILN_KOP_ADD, kiln_kmuli(k, wp, 16), kiln_kaddi(k, g8, 8 * r)));
            uint32_t v0 = o2(f, KILN_KOP_MUL, lanef(f, o, jj), inv[r]), v1 = o2(f, KILN_KOP_MUL, lanef(f, o, jj + 1), inv[r]);
            if (h16) { /* bytes 2 d0 + 4 q: piece d0 / 8, word q */
                uint32_t wd = kiln_kir_op(k, KILN_KOP_PACK2, KILN_KT_U32, v0, v1, KILN_IDX_NONE, ot == KILN_DTYPE_BF16);
                kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, o2(f, KILN_KOP_ADD, swz_word(f, row, ci(f, d0 / 8), f->rows), c->qq), wd,
                            KILN_IDX_NONE, (int32_t)f->qsh);
            } else { /* bytes 4 d0 + 8 q: piece d0 / 4 + q / 2, words 2 (q & 1) and the next */
                uint32_t at = o2(f, KILN_KOP_ADD, swz_word(f, row, kiln_kaddi(k, kiln_kshri(k, c->qq, 1), d0 / 4), f->rows),
                                 kiln_kmuli(k, kiln_kandi(k, c->qq, 1), 2));
                kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, at, v0, KILN_IDX_NONE, (int32_t)f->qsh);
                kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, kiln_kaddi(k, at, 1), v1, KILN_IDX_NONE, (int32_t)f->qsh);
            }
        }
        kiln_kir_op(k, KILN_KOP_NBAR_SYNC, KILN_KT_NONE, bar, KILN_IDX_NONE, KILN_IDX_NONE, 128 << 8); /* the rows staged */
        for (int u = 0; u < 64 * ncol / 128; u++) { /* piece u of thread t: row i / ncol, column i % ncol (a row's pieces: consecutive threads) */
            uint32_t i = kiln_kaddi(k, t, 128 * u), rl = o2(f, KILN_KOP_DIV, i, ci(f, ncol)), col = o2(f, KILN_KOP_REM, i, ci(f, ncol));
            uint32_t R = o2(f, KILN_KOP_ADD, f->R0, o2(f, KILN_KOP_ADD, kiln_kmuli(k, w, 64), rl));
            uint32_t tok = o2(f, KILN_KOP_DIV, R, ci(f, f->G));
            uint32_t v4 = kiln_kir_op(k, KILN_KOP_LDS4, KILN_KT_V4, swz_word(f, o2(f, KILN_KOP_ADD, kiln_kmuli(k, w, 64), rl), col, f->rows),
                                      KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)f->qsh);
            kiln_kif(k, o2(f, KILN_KOP_LT, tok, f->n_tok));
            uint32_t orow = o2(f, KILN_KOP_ADD, kiln_kmuli(k, tok, f->n_head), o2(f, KILN_KOP_ADD, f->head0, o2(f, KILN_KOP_REM, R, ci(f, f->G))));
            /* word (orow hd + h dp) es / 4 + 4 col */
            uint32_t wi = o2(f, KILN_KOP_ADD, kiln_kmuli(k, orow, f->hd * (h16 ? 2 : 4) / 4), kiln_kaddi(k, kiln_kmuli(k, col, 4), h * dp));
            kiln_kir_op(k, KILN_KOP_ST4, KILN_KT_NONE, wi, v4, KILN_IDX_NONE, (int32_t)os);
            kiln_kendif(k);
        }
    }
}

/* Key split: word w of partial result p (a block of rank >= 1) of consumer thread tid, in the
 * threads' order (each thread reads back only what its twin of rank 0 wrote). */
static uint32_t part_word(fw *f, uint32_t p, int32_t w)
{
    return o2(f, KILN_KOP_ADD, kiln_kmuli(f->k, p, f->ct * fw_part_words(f)), kiln_kaddi(f->k, f->tid, w * f->ct));
}

/* Key split: every block of rank >= 1 writes its rows' state (O unnormalized, m, each thread's l)
 * into the scratch buffer; the cluster meets (its release/acquire orders those stores); the block
 * of rank 0 folds each in: m = max(m, m'), O = O 2^(m_0 - m) + O' 2^(m' - m), l alike (a max of -inf,
 * a row with no key in either, stands in as 0: the factors are 0, not NaN). */
static void split_combine(fw *f, fwc *c)
{
    kiln_kir *k = f->k;
    int32_t no = f->hd == 64 ? 32 : 64, nacc = c->O2 != KILN_IDX_NONE ? 2 : 1;
    uint32_t bq = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 1);
    uint32_t part0 = kiln_kmuli(k, o2(f, KILN_KOP_ADD, kiln_kmuli(k, bq, f->n_kvh), f->kvh), f->split - 1); /* the cluster's first */
    kiln_kif(k, o2(f, KILN_KOP_LT, ci(f, 0), f->rank));
    uint32_t p = o2(f, KILN_KOP_ADD, part0, kiln_kaddi(k, f->rank, -1));
    for (int r = 0; r < 2; r++) {
        kl_store(k, f->scr, KILN_DTYPE_F32, part_word(f, p, 2 * r), c->m[r]);
        kl_store(k, f->scr, KILN_DTYPE_F32, part_word(f, p, 2 * r + 1), c->l[r]);
    }
    for (int h = 0; h < nacc; h++)
        for (int j = 0; j < no; j++) kl_store(k, f->scr, KILN_DTYPE_F32, part_word(f, p, 4 + h * no + j), lanef(f, h ? c->O2 : c->O, j));
    kiln_kendif(k);
    sync_op(f, KILN_KOP_CLUSTER_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kiln_kif(k, o2(f, KILN_KOP_EQ, f->rank, ci(f, 0)));
    for (int q = 1; q < f->split; q++) {
        uint32_t pq = kiln_kaddi(k, part0, q - 1), a[2], b[2];
        for (int r = 0; r < 2; r++) {
            uint32_t m2 = kl_load(k, f->scr, KILN_DTYPE_F32, part_word(f, pq, 2 * r));
            uint32_t l2 = kl_load(k, f->scr, KILN_DTYPE_F32, part_word(f, pq, 2 * r + 1));
            uint32_t mn = o2(f, KILN_KOP_MAX, c->m[r], m2);
            uint32_t ms = kiln_ksel(k, KILN_KT_F32, o2(f, KILN_KOP_EQ, mn, kiln_kf(k, -INFINITY)), kiln_kf(k, 0), mn);
            a[r] = kiln_k1(k, KILN_KOP_EX2, o2(f, KILN_KOP_SUB, c->m[r], ms));
            b[r] = kiln_k1(k, KILN_KOP_EX2, o2(f, KILN_KOP_SUB, m2, ms));
            kiln_kset(k, c->l[r], kiln_kfma(k, c->l[r], a[r], o2(f, KILN_KOP_MUL, l2, b[r])));
            kiln_kset(k, c->m[r], mn);
        }
        for (int h = 0; h < nacc; h++) {
            uint32_t o = h ? c->O2 : c->O;
            for (int j = 0; j < no; j++) {
                uint32_t x = kl_load(k, f->scr, KILN_DTYPE_F32, part_word(f, pq, 4 + h * no + j));
                kiln_kir_op(k, KILN_KOP_WSET, KILN_KT_NONE, o, kiln_kfma(k, lanef(f, o, j), a[(j >> 1) & 1], o2(f, KILN_KOP_MUL, x, b[(j >> 1) & 1])),
                            KILN_IDX_NONE, j);
            }
        }
    }
    kiln_kendif(k);
}

/* Named barrier `id` (an I32 value) of the two consumer warpgroups' 256 threads: wait for it (sync)
 * or only arrive. */
static void nbar(fw *f, enum kiln_kop op, uint32_t id) { kiln_kir_op(f->k, op, KILN_KT_NONE, id, KILN_IDX_NONE, KILN_IDX_NONE, f->ct << 8); }

/* A consumer warpgroup over the block's tiles, P V one tile behind (FlashAttention-3's overlap):
 * tile i issues S_i = Q K_i^T, then O += P_{i-1} V_{i-1}; once S_i has retired (K_i's stage is
 * freed) the softmax of tile i runs on the CUDA cores while that P V runs on the tensor cores;
 * then O is rescaled, V_{i-1}'s stage freed and P_i kept for the next tile. Tile 0 is peeled (no
 * P V before it), so no branch separates a fence from its WGMMAs. With f->pingpong the two
 * warpgroups also take turns issuing (FlashAttention-3's inter-warpgroup overlap): warpgroup w
 * issues a tile's two products after a sync on its named barrier 1 + w and then arrives at the
 * other's, so one warpgroup's softmax runs while the other's products hold the tensor cores
 * (without it both issue at once, share the tensor cores, and then both compute their softmax
 * with the tensor cores idle but for P V). Warpgroup 0 takes the first turn on its own early
 * arrival; the last arrival is left pending at exit, as in FlashAttention-3. */
static void consumer(fw *f, uint32_t node)
{
    kiln_kir *k = f->k;
    fwc c = {0};
    consumer_rows(f, &c);
    uint32_t pa[FW_KMAX / 16], z = ci(f, 0);
    if (f->split > 1) kiln_kif(k, o2(f, KILN_KOP_LT, z, f->ntiles)); /* a split's block may have no tile */
    wait_bar(f, 0, z, z); /* tile 0: stage 0, phase 0 */
    wg_fence(f);
    issue_s(f, &c, z);
    wg_wait(f, 0);
    sync_op(f, KILN_KOP_MBAR_ARRIVE, bar_at(f, 2, z), KILN_IDX_NONE, 0); /* K_0 read */
    if (f->pingpong) {
        kiln_kif(k, o2(f, KILN_KOP_EQ, c.wgi, z));
        nbar(f, KILN_KOP_NBAR_ARRIVE, c.mine); /* warpgroup 0 goes first */
        kiln_kendif(k);
    }
    softmax_step(f, &c, key0(f, z), true, z);
    uint32_t i = kiln_kvar(k, ci(f, 1));
    kiln_kloop(k, i, f->ntiles, ci(f, 1));
    uint32_t ph, s = slot_of(f, i, &ph), kb = key0(f, i), php, sp = slot_of(f, kiln_kaddi(k, i, -1), &php);
    wait_bar(f, 0, s, ph);
    wait_bar(f, 1, sp, php);
    kiln_kset(k, c.S, c.zero);
    p_frags(f, &c, pa);
    if (f->pingpong) nbar(f, KILN_KOP_NBAR_SYNC, c.mine); /* this warpgroup's turn */
    wg_fence(f);
    issue_s(f, &c, s);
    issue_pv(f, &c, sp, pa);
    if (f->pingpong) nbar(f, KILN_KOP_NBAR_ARRIVE, c.other); /* the other's turn */
    wg_wait(f, 1); /* S_i has retired; P V runs on */
    sync_op(f, KILN_KOP_MBAR_ARRIVE, bar_at(f, 2, s), KILN_IDX_NONE, 0); /* K_i read */
    softmax_step(f, &c, kb, false, sp);
    kl_loop_end(k);
    uint32_t phl, sl = slot_of(f, kiln_kaddi(k, f->ntiles, -1), &phl); /* the last tile's P V */
    wait_bar(f, 1, sl, phl);
    p_frags(f, &c, pa);
    wg_fence(f);
    issue_pv(f, &c, sl, pa);
    wg_wait(f, 0);
    if (f->split > 1) {
        kiln_kendif(k);
        split_combine(f, &c);
        kiln_kif(k, o2(f, KILN_KOP_EQ, f->rank, z));
    }
    consumer_store(f, &c, node);
    if (f->split > 1) kiln_kendif(k);
}


bool kl_flash_wg_fits(const kiln_graph *g, const kiln_node_rec *n, const kiln_region_spec *sp, const kiln_lower_target *tg)
{
    if (!tg->wgmma || tg->opts.precision != KILN_PREC_F16 || tg->opts.flash_wg == KILN_GEMM_OFF || sp->block) return false;
    const kiln_node_rec *q = &g->nodes[n->src[0]], *kc = &g->nodes[n->src[1]], *vc = &g->nodes[n->src[2]];
    int64_t hd = q->dims[2], G = kc->dims[0] ? q->dims[1] / kc->dims[0] : 0;
    if (kc->dtype != vc->dtype || (kc->dtype != KILN_DTYPE_F16 && kc->dtype != KILN_DTYPE_BF16) || (hd != 64 && hd != 128 && hd != 256))
        return false;
    if (n->i[1] < 0 || n->i[1] > INT32_MAX / 2) return false; /* a window the I32 key arithmetic holds */
    if (G < 1 || G > 8 || kc->dims[1] < 1 || kc->dims[0] * kc->dims[1] >= ((int64_t)1 << 24)) return false;
    return kl_dim_max(g, q->dims[0]) > KL_SMALL_ROWS && kl_tma_aligned(g, n->src[1]) && kl_tma_aligned(g, n->src[2]);
}

/* The key split of codegen.flash_split -1 (KILN_FLASH_SPLIT=auto): the most blocks of a cluster (4, 2)
 * that still fit the grid on the device at once (blocks x split <= the SMs, two 64-row blocks an SM)
 * and that the heaviest block's walk has tiles for (at least split of them at the bound's n_tok):
 * grids that leave SMs idle (the 512-token shapes of head_dim 64 with 7 heads a kv head, 56
 * blocks, and head_dim 256 16/8, 64 blocks) fill them; grids of a full wave keep none. */
static int32_t fw_split_auto(const fw *f, int64_t tok_max, uint32_t sms)
{
    int64_t blocks = (int64_t)f->n_kvh * ((tok_max * f->G + f->rows - 1) / f->rows), cap = (int64_t)sms * (f->rows == 64 ? 2 : 1);
    int64_t tiles = (tok_max + f->nk - 1) / f->nk;
    for (int32_t s = 4; s >= 2; s /= 2)
        if (blocks * s <= cap && tiles >= s) return s;
    return 1;
}

/* The kernel's per-shape choices, made here only (docs/kernels.md, Attention: the ping-pong table):
 * - ping-pong of the two consumer warpgroups: on for one query head a kv head at head_dim <= 128,
 *   off for grouped heads and head_dim 256 (H100, 4096 tokens: MHA hd 128 371 vs 323 TFLOP/s with
 *   / without; GQA 32/8 386 vs 404; hd 256 244 vs 274); codegen.flash_wg forces it either way;
 * - query rows a block: 128 unless codegen.flash_rows is 64 at head_dim <= 128 (one consumer
 *   warpgroup, 64-key tiles at head_dim 128: two blocks share an SM, twice the blocks for short
 *   prompts; at head_dim 256 one would fill an SM alone);
 * - keys a tile: 64 where O and S would not fit the registers (head_dim 256) or two 64-row blocks
 *   the shared memory (head_dim 128), else 128;
 * - for grids of 128-row blocks that leave half the SMs idle (short prompts of few heads): 64-row
 *   blocks at head_dim 64, fw_split_auto's key split at 128 and 256 (codegen.flash_rows 128 and
 *   flash_split 1 keep them off; flash_split 2 or 4 forces a split, -1 fw_split_auto's anywhere). */
static void fw_choose(fw *f, const kiln_codegen_options *o, int64_t tok_max, uint32_t sms)
{
    /* a grid of 128-row blocks that leaves half the SMs idle: head_dim 64 takes 64-row blocks, the
     * others a key split (H100, 512 tokens, two rounds: hd 64 14/2, 56 blocks: 13.7/14.1 us in 64-row
     * blocks, 15.7/15.5 split 2, 16.9/19.1 as is; hd 256 16/8, 64 blocks: 41.4/41.4 split 2 against
     * 48.3/46.5; hd 128 32/32 at 256 tokens: 19.4 split 2 against 21.6) */
    int64_t blocks = (int64_t)f->n_kvh * ((tok_max * f->G + 127) / 128);
    bool idle = sms && blocks * 2 <= (int64_t)sms;
    f->rows = f->hd <= 128 && (o->flash_rows == 64 || (!o->flash_rows && idle && f->hd == 64)) ? 64 : 128;
    f->ct = 2 * f->rows;
    f->nk = f->hd == 256 || (f->rows == 64 && f->hd == 128) ? 64 : 128;
    bool pp = f->G == 1 && f->hd <= 128;
    if (o->flash_wg == KILN_FLASH_WG_NO_PINGPONG) pp = false;
    if (o->flash_wg == KILN_FLASH_WG_PINGPONG) pp = true;
    f->pingpong = pp && f->rows == 128; /* one consumer warpgroup has no one to take turns with */
    bool autosplit = o->flash_split == -1 || (!o->flash_split && idle && f->rows == 128);
    f->split = o->flash_split == 2 || o->flash_split == 4 ? o->flash_split : autosplit ? fw_split_auto(f, tok_max, sms) : 1;
}

/* The mbarriers (thread 0) before the warpgroups part. */
static void fw_setup(fw *f)
{
    kiln_kir *k = f->k;
    kiln_kif(k, o2(f, KILN_KOP_EQ, f->tid, ci(f, 0)));
    for (int s = 0; s < FW_STAGES; s++) {
        sync_op(f, KILN_KOP_MBAR_INIT, bar_at(f, 0, ci(f, s)), KILN_IDX_NONE, 1);   /* the producer's expect_tx + K's bytes */
        sync_op(f, KILN_KOP_MBAR_INIT, bar_at(f, 1, ci(f, s)), KILN_IDX_NONE, FW_VTHREADS); /* every V thread (+ V's bytes) */
        sync_op(f, KILN_KOP_MBAR_INIT, bar_at(f, 2, ci(f, s)), KILN_IDX_NONE, f->ct); /* every consumer thread */
        sync_op(f, KILN_KOP_MBAR_INIT, bar_at(f, 3, ci(f, s)), KILN_IDX_NONE, f->ct);
    }
    sync_op(f, KILN_KOP_MBAR_INIT, bar_at(f, 4, ci(f, 0)), KILN_IDX_NONE, f->ct); /* Q staged: every consumer thread */
    sync_op(f, KILN_KOP_FENCE_ASYNC, KILN_IDX_NONE, KILN_IDX_NONE, 1); /* the inits, visible to the TMA engine */
    kiln_kendif(k);
    kiln_kbarrier(k);
}

void kl_lower_flash_wg(const kiln_graph *g, uint32_t node, const kiln_lower_target *tg, kiln_kir *k)
{
    const kiln_node_rec *n = &g->nodes[node];
    const kiln_node_rec *q = &g->nodes[n->src[0]], *kc = &g->nodes[n->src[1]];
    fw f = {.k = k, .g = g, .hd = (int32_t)q->dims[2], .n_head = (int32_t)q->dims[1], .max_ctx = (int32_t)kc->dims[1],
            .n_kvh = (int32_t)kc->dims[0], .bf = kc->dtype == KILN_DTYPE_BF16};
    f.G = f.n_head / f.n_kvh;
    f.q16 = kl_tma_aligned(g, n->src[0]);
    fw_choose(&f, &tg->opts, kl_dim_max(g, q->dims[0]), tg->sm_count);
    f.capl2 = n->f[1] * 1.44269504088896341f, f.win = (int32_t)n->i[1]; /* the scores carry log2 e */
    int32_t nqb = (int32_t)((kl_dim_max(g, q->dims[0]) * f.G + f.rows - 1) / f.rows);
    int64_t parts = (int64_t)f.n_kvh * nqb * (f.split - 1) * f.ct * fw_part_words(&f); /* key split: scratch words */
    if (parts > INT32_MAX) f.split = 1, parts = 0; /* past I32 indices: no split */
    kiln_kir_init(k, "kiln_attn_flash_wg", (uint32_t)(f.ct + 128));
    snprintf(k->what, sizeof k->what, "attention: flash wg, %d q heads a kv head, hd %d%s%s%s, %d rows%s", (int)(f.G & 15), (int)(f.hd & 511),
             f.capl2 != 0 ? ", cap" : "", f.win ? ", window" : "", f.pingpong ? ", ping-pong" : "", (int)(f.rows & 255),
             f.split == 2 ? ", split 2" : f.split == 4 ? ", split 4" : "");
    k->grid[0] = (uint32_t)(f.n_kvh * f.split), k->grid[1] = (uint32_t)nqb;
    k->cluster = f.split > 1 ? (uint32_t)f.split : 0;
    k->scratch_bytes = (uint64_t)parts * 4;
    k->dyn_shared = true;
    /* 64-row blocks are written for two an SM (at most 82 KB of shared memory each; 128 registers a thread
     * at entry: the consumers' 216 and the producers' 40 fill the block's 256 x 128) */
    k->min_blocks = f.rows == 64 ? 2 : 0;
    int32_t creg = f.rows == 128 ? 232 : 216;
    f.qsh = kiln_kir_shared(k, (uint32_t)(f.rows * f.hd / 2));
    f.ring = kiln_kir_shared(k, (uint32_t)(FW_STAGES * 2 * f.nk * f.hd / 2));
    f.bars = kiln_kir_shared(k, 2 * (4 * FW_STAGES + 1)); /* full and empty of K and V per stage, and Q's */
    uint32_t qs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], false);
    uint32_t ks = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[1], false);
    f.vs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false);
    kiln_ktmap m = {.slot = ks, .inner = (uint32_t)f.hd, .outer = (uint32_t)(f.n_kvh * f.max_ctx), .stride = (uint32_t)f.hd * 2,
                    .box_inner = 64, .box_outer = (uint32_t)f.nk};
    f.kmap = kiln_kir_tmap(k, &m);
    m.slot = f.vs;
    f.vmap = kiln_kir_tmap(k, &m);
    f.tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    f.kvh = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    if (f.split > 1) { /* a cluster of split blocks a kv head's query tile */
        f.rank = o2(&f, KILN_KOP_REM, f.kvh, ci(&f, f.split));
        f.kvh = o2(&f, KILN_KOP_DIV, f.kvh, ci(&f, f.split));
        f.scr = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, true);
    }
    uint32_t bq = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 1);
    f.head0 = kiln_kmuli(k, f.kvh, f.G);
    f.n_tok = kl_dim(k, q->dims[0]), f.n_kv = kl_dim(k, n->dim);
    f.past = o2(&f, KILN_KOP_SUB, f.n_kv, f.n_tok); /* keys before the first query */
    f.R0 = kiln_kmuli(k, o2(&f, KILN_KOP_SUB, ci(&f, nqb - 1), bq), f.rows); /* latest rows first */
    f.qbase = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, ci(&f, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)f.qsh);
    f.rbase = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, ci(&f, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)f.ring);
    f.bbase = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, ci(&f, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)f.bars);
    kiln_kif(k, o2(&f, KILN_KOP_LT, f.R0, kiln_kmuli(k, f.n_tok, f.G)));
    /* keys the block's last row sees: its token is (R0 + rows - 1) / G, at most the run's last */
    uint32_t last = o2(&f, KILN_KOP_MIN, o2(&f, KILN_KOP_DIV, kiln_kaddi(k, f.R0, f.rows - 1), ci(&f, f.G)), kiln_kaddi(k, f.n_tok, -1));
    uint32_t kend = o2(&f, KILN_KOP_ADD, f.past, kiln_kaddi(k, last, 1));
    f.ntiles = o2(&f, KILN_KOP_DIV, kiln_kaddi(k, kend, f.nk - 1), ci(&f, f.nk));
    f.t0 = ci(&f, 0);
    if (f.win) { /* tiles before the block's first row's window are skipped: its later rows' windows start later */
        uint32_t seen = o2(&f, KILN_KOP_ADD, f.past, kiln_kaddi(k, o2(&f, KILN_KOP_DIV, f.R0, ci(&f, f.G)), 1));
        f.t0 = o2(&f, KILN_KOP_DIV, o2(&f, KILN_KOP_MAX, o2(&f, KILN_KOP_SUB, seen, ci(&f, f.win)), ci(&f, 0)), ci(&f, f.nk));
    }
    f.ntiles = o2(&f, KILN_KOP_SUB, f.ntiles, f.t0); /* the tiles the block walks, from t0 */
    if (f.split > 1) { /* rank r takes tiles t0 + r, t0 + r + split, ...: ceil((ntiles - r) / split) of them, maybe none */
        f.ntiles = o2(&f, KILN_KOP_DIV, o2(&f, KILN_KOP_MAX, kiln_kaddi(k, o2(&f, KILN_KOP_SUB, f.ntiles, f.rank), f.split - 1), ci(&f, 0)),
                      ci(&f, f.split));
        f.t0 = o2(&f, KILN_KOP_ADD, f.t0, f.rank);
    }
    fw_setup(&f);
    kiln_kif(k, o2(&f, KILN_KOP_LT, f.tid, ci(&f, f.ct)));
    sync_op(&f, KILN_KOP_SETMAXNREG, KILN_IDX_NONE, KILN_IDX_NONE, 1 << 16 | creg);
    stage_q(&f, n, q, qs);
    consumer(&f, node);
    kiln_kelse(k);
    sync_op(&f, KILN_KOP_SETMAXNREG, KILN_IDX_NONE, KILN_IDX_NONE, 40);
    uint32_t pt = kiln_kaddi(k, f.tid, -f.ct);
    kiln_kif(k, o2(&f, KILN_KOP_EQ, pt, ci(&f, 0)));
    producer_k(&f);
    kiln_kelse(k);
    kiln_kif(k, o2(&f, KILN_KOP_LE, ci(&f, 32), pt));
    producer_v(&f, kiln_kaddi(k, pt, -32));
    kiln_kendif(k);
    kiln_kendif(k);
    /* a key split's cluster meets once (split_combine): the producers too, so that its count never
     * hangs on threads still running or gone */
    if (f.split > 1) sync_op(&f, KILN_KOP_CLUSTER_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kiln_kendif(k);
    kiln_kendif(k);
}
