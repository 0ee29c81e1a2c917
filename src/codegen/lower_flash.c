/* Flash attention for prefill on tensor cores (kir MMA m16n8k16, f32 accumulation), over a
 * head-major f16 or f32 KV cache. A block of 8 warps owns 128 query rows (16 per warp); with
 * grouped-query heads those rows are (token, head) pairs of the G query heads that share one kv
 * head, so each K/V tile staged serves all G heads. The block walks the keys the causal mask lets
 * its last row see in tiles of up to 64 keys, staged in shared memory in fragment order (K as is,
 * V transposed into key pairs); the next tile's cache words are loaded into registers while the
 * warps compute on the current one (the loads' latency hides behind the MMAs). Per tile a warp
 * computes S = q . K^T (16 x tile) in registers, soft-caps and masks it (key < n_kv - n_tok + t + 1
 * and, with a sliding window, key >= the row's first key: kl_attn_score, kl_attn_first_key; computed,
 * never stored; a paged tree step's rows see the new keys of their draft path only: flash_tree_tile),
 * updates the rows' running max and sum (online softmax in base 2), and adds P . V
 * into its 16 x hd output fragments; P goes from S's accumulator layout straight into A fragments
 * (no shared memory). q and P enter the MMA as two f16 parts each (hi + lo, the sum within 2^-22
 * of the f32 value); K and V are f16 already, or, from an f32 cache, staged as two parts too (the
 * hi.hi, hi.lo and lo.hi products: three MMAs where f16 takes two; a paged q8_0 pool is dequantized
 * as its words load and staged the same way: key_item_q8): the result meets the
 * contract's f32 tolerance. Under codegen.precision = KILN_PREC_F16 q and P are one f16 part
 * (half the MMAs with an f16 cache; the contract's tolerance_f16_act). Query blocks run latest first (they see the most keys). The first
 * version of the kernel (64 rows of one head a block, 4 warps, no register prefetch) stays
 * behind codegen.flash = KILN_GEMM_OFF for A/B runs. Must not know any target's syntax. */
#include "codegen/lower.h"

#include <math.h>
#include <string.h>

#define FKMAX 64  /* keys per tile at most (keys_per_tile) */
#define FP    2   /* f16 parts of q and of P at most */
#define FHD   128 /* largest head dim (registers: q parts, output fragments) */
#define FPRE  64  /* cache words a thread prefetches at most (flash_geo keeps it so) */

/* The kernel's shape and choices (flash_geo). */
typedef struct fgeo {
    int32_t rows, threads; /* query rows and threads of a block (16 rows a warp) */
    int32_t FK;            /* keys per tile */
    bool    share;         /* a block's rows are (token, head) pairs of one kv head's query heads */
    bool    prefetch;      /* the next tile's cache words load into registers during this tile */
    int     np;            /* f16 parts of q and P (1 or 2) */
} fgeo;

typedef struct fl {
    kiln_kir *k;
    int64_t n_head, G, hd, max_ctx;
    int kp; /* f16 parts of K and V in shared memory: 1 (f16 cache) or 2 (f32 cache: hi + lo) */
} fl;

static uint32_t op1(kiln_kir *k, enum kiln_kop op, enum kiln_kt t, uint32_t a, int32_t imm)
{
    return kiln_kir_op(k, op, t, a, KILN_IDX_NONE, KILN_IDX_NONE, imm);
}
static uint32_t setlane(kiln_kir *k, enum kiln_kt t, uint32_t v, uint32_t x, int j)
{
    return kiln_kir_op(k, KILN_KOP_SETLANE, t, v, x, KILN_IDX_NONE, j);
}
static uint32_t lanef(kiln_kir *k, uint32_t f4, int j) { return op1(k, KILN_KOP_LANE, KILN_KT_F32, f4, j); }
static uint32_t red4(kiln_kir *k, uint32_t v, enum kiln_kred op) /* over the 4 lanes that hold one row */
{
    return kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, v, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)((op << 16) | 4));
}

/* The A fragments (np parts) of the 16 x 16 block whose lane j elements are x[j][0..1]. */
static void a_frags(kiln_kir *k, uint32_t x[4][2], int np, uint32_t out[FP])
{
    for (int q = 0; q < np; q++) out[q] = KILN_IDX_NONE;
    for (int j = 0; j < 4; j++) {
        uint32_t word[FP];
        kl_split_pair(k, x[j][0], x[j][1], np, false, word);
        for (int q = 0; q < np; q++) out[q] = setlane(k, KILN_KT_V4, out[q], word[q], j);
    }
}

/* Word index of dims [0, hd) of key `key` of kv head `kvh` (f16 caches: two values a word). */
static uint32_t cache_word(kiln_kir *k, const fl *f, uint32_t kvh, uint32_t key)
{
    return kiln_k2(k, KILN_KOP_MUL,
                   kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kvh, kiln_ki(k, (int32_t)f->max_ctx)), key),
                   kiln_ki(k, (int32_t)(f->hd / (3 - f->kp))));
}

/* Keys per tile: the K and V tiles (kp f16 parts each) in `budget` bytes, a multiple of 16, at
 * most 64. */
static int32_t keys_per_tile(int64_t hd, int kp, int64_t budget)
{
    int64_t fk = budget / (4 * hd * kp);
    fk = fk > FKMAX ? FKMAX : fk / 16 * 16;
    return (int32_t)(fk < 16 ? 16 : fk);
}

/* The kernel's shape for target tg: 128 rows of 8 warps, grouped heads sharing tiles, register
 * prefetch and tiles in the shared memory the target gives (32 KiB where the MMA is native; an
 * emulating printer takes 24 bytes a thread of the target's limit for its fragment exchange); or,
 * with codegen.flash off, the first kernel (64 rows of one head, 4 warps, tiles in 16 KiB). */
static fgeo flash_geo(const kiln_lower_target *tg, int64_t hd, int kp)
{
    bool v1 = tg->opts.flash == KILN_GEMM_OFF;
    fgeo o = {.rows = v1 ? 64 : 128, .threads = v1 ? 128 : 256, .share = !v1, .prefetch = !v1,
              .np = tg->opts.precision == KILN_PREC_F16 ? 1 : FP};
    int64_t budget = v1 ? 16384 : tg->mma_native ? 32768 : (int64_t)tg->smem_bytes - 24 * o.threads - 2048;
    o.FK = keys_per_tile(hd, kp, budget);
    /* Registers a thread holds across a tile: output fragments (hd / 2), q's fragments (hd np / 4),
     * scores (FK / 2) and the prefetched words (K items of 4 words, V items of 8: two keys). Past
     * ~160 the kernel spills at 8 warps (255 at most): smaller tiles (f32 accuracy at hd 128 takes
     * 32 keys). */
    for (;;) {
        int32_t cpr = (int32_t)(hd * kp / 8), nk = (o.FK * cpr + o.threads - 1) / o.threads,
                nv = (o.FK / 2 * cpr + o.threads - 1) / o.threads, pre = o.prefetch ? 4 * nk + 8 * nv : 0;
        if (pre > FPRE || (!v1 && hd / 2 + hd * o.np / 4 + o.FK / 2 + pre > 160 && o.FK > 16)) {
            if (o.FK > 16) o.FK -= 16;
            else o.prefetch = false;
            continue;
        }
        return o;
    }
}

/* The 4 words of staging item c (16 bytes) of key kg of kv head kvh in cache slot `slot` (a row
 * of the cache that exists: the key clamped into it; keys past n_kv are zeroed where stored). */
static uint32_t key_item(kiln_kir *k, const fl *f, uint32_t slot, uint32_t kvh, uint32_t kg, uint32_t c)
{
    uint32_t row = cache_word(k, f, kvh, kiln_k2(k, KILN_KOP_MIN, kg, kiln_ki(k, (int32_t)f->max_ctx - 1)));
    return kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4,
                       kiln_k2(k, KILN_KOP_ADD, row, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4))), KILN_IDX_NONE,
                       KILN_IDX_NONE, (int32_t)slot);
}

/* Paged: the same for logical key kg of the block's sequence, through its block table row (the
 * key clamped into the sequence's capacity; kl_paged_slot clamps the block into the pool). */
static uint32_t key_item_paged(kiln_kir *k, const fl *f, uint32_t slot, uint32_t kvh, uint32_t kg, uint32_t c,
                               const kiln_region_spec *sp, int64_t cap, uint32_t bt, uint32_t bt_row)
{
    uint32_t j = kiln_k2(k, KILN_KOP_MIN, kg, kiln_ki(k, (int32_t)cap - 1));
    uint32_t row = cache_word(k, f, kvh, kl_paged_slot(k, bt, bt_row, j, sp->block, f->max_ctx / sp->block));
    return kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4,
                       kiln_k2(k, KILN_KOP_ADD, row, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4))), KILN_IDX_NONE,
                       KILN_IDX_NONE, (int32_t)slot);
}

/* Paged q8_0 pool: staging item c (dims 4c .. 4c + 3, as f32 words: d * q) of logical key kg of kv
 * head kvh, through the block table (the key clamped as in key_item_paged). Staged as an f32 cache
 * is (two f16 parts each: d * q has up to 19 significant bits). */
static uint32_t key_item_q8(kiln_kir *k, const fl *f, uint32_t slot, uint32_t kvh, uint32_t kg, uint32_t c,
                            const kiln_region_spec *sp, int64_t cap, uint32_t bt, uint32_t bt_row)
{
    uint32_t j = kiln_k2(k, KILN_KOP_MIN, kg, kiln_ki(k, (int32_t)cap - 1));
    uint32_t row = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kvh, kiln_ki(k, (int32_t)f->max_ctx)),
                           kl_paged_slot(k, bt, bt_row, j, sp->block, f->max_ctx / sp->block));
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, (int32_t)(f->hd / 32)), kiln_kshri(k, c, 3));
    uint32_t h0 = kiln_kmuli(k, blk, 17);
    uint32_t dw = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_kshri(k, h0, 1), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
    uint32_t d = op1(k, KILN_KOP_H2F, KILN_KT_F32,
                     kiln_k2(k, KILN_KOP_SHR, dw, kiln_kcvt(k, KILN_KT_U32, kiln_kmuli(k, kiln_kandi(k, h0, 1), 16))), 0);
    /* the 4 quants at byte blk * 34 + 2 + 4 (c % 8): on a word, or 2 bytes into one */
    uint32_t byte = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, blk, 34), kiln_kaddi(k, kiln_kmuli(k, kiln_kandi(k, c, 7), 4), 2));
    uint32_t w0 = kiln_kshri(k, byte, 2);
    uint32_t lo = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, w0, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
    uint32_t hi = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_kaddi(k, w0, 1), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
    uint32_t mid = kiln_k2(k, KILN_KOP_NE, kiln_kandi(k, byte, 3), kiln_ki(k, 0));
    uint32_t sh16 = kiln_ku(k, 16);
    uint32_t q4 = kiln_ksel(k, KILN_KT_U32, mid, kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_SHR, lo, sh16), kiln_k2(k, KILN_KOP_SHL, hi, sh16)), lo);
    uint32_t v4 = KILN_IDX_NONE;
    for (int e = 0; e < 4; e++) {
        uint32_t x = kiln_k2(k, KILN_KOP_MUL, d, kiln_kcvt(k, KILN_KT_F32, kiln_kbfe(k, KILN_KT_I32, q4, 8 * e, 8)));
        v4 = setlane(k, KILN_KT_V4, v4, kiln_kbitcast(k, KILN_KT_U32, x), e);
    }
    return v4;
}

/* The f32 pair of words (a, b) as hi and lo f16 parts, stored at word `at` of part 0 of a tile
 * array whose parts are tw words apart. */
static void store_parts(kiln_kir *k, uint32_t arr, uint32_t at, int32_t tw, uint32_t a, uint32_t b)
{
    uint32_t pw[FP];
    kl_split_pair(k, op1(k, KILN_KOP_BITCAST, KILN_KT_F32, a, 0), op1(k, KILN_KOP_BITCAST, KILN_KT_F32, b, 0), FP,
                  false, pw);
    for (int pt = 0; pt < FP; pt++)
        kiln_ksts(k, arr, pt ? kiln_k2(k, KILN_KOP_ADD, at, kiln_ki(k, pt * tw)) : at, pw[pt]);
}

bool kl_flash_fits(const kiln_graph *g, const kiln_node_rec *n)
{
    const kiln_node_rec *q = &g->nodes[n->src[0]], *kc = &g->nodes[n->src[1]], *vc = &g->nodes[n->src[2]];
    int64_t hd = q->dims[2];
    bool q8 = n->op == KILN_OP_PAGED_ATTENTION && kc->dtype == KILN_DTYPE_Q8_0; /* a q8_0 pool: staged as f32 */
    if (kc->dtype != vc->dtype || (kc->dtype != KILN_DTYPE_F16 && kc->dtype != KILN_DTYPE_F32 && !q8) || hd % 32 || hd > FHD)
        return false;
    return kl_dim_max(g, q->dims[0]) > 8 && kc->dims[1] < ((int64_t)1 << 24);
}

/* One flash kernel being written: its geometry, slots and the values its phases share. */
typedef struct flash_st {
    kiln_kir *k;
    fl f;
    fgeo o;
    int KP;                      /* f16 parts of K and V (f.kp) */
    int32_t hd, FK, KT, VT, tw;  /* head dim, keys per tile, k-tiles of q, k-tiles of V, words of a tile part */
    int32_t nk, nv;              /* staging items of K (4 words) and V (two keys: 8 words) a thread takes */
    uint32_t ksh, vsh, ks, vs;   /* shared K and V tiles; the caches' slots */
    uint32_t tid, kvh, n_kv, kb; /* I32: thread, kv head, keys, first key of the tile (loop variable) */
    uint32_t qq, frag, zero4;    /* I32 lane & 3; the lane's words in a tile; F4 zero */
    uint32_t seen[2];            /* I32 keys each of the lane's two rows sees */
    uint32_t first[2];           /* I32 their first keys under a sliding window (KILN_IDX_NONE: none) */
    float capl2;                 /* the logit soft-cap in base-2 units (scores are base 2), 0: none */
    uint32_t m[2], l[2];         /* F32 variables: running max and sum of the rows */
    uint32_t o_[FHD / 8];        /* F4 variables: output fragments */
    uint32_t qf[FHD / 16][FP];   /* q's A fragments, pre-scaled */
    uint32_t pre[FPRE];          /* U32 variables: the prefetched cache words (K items, then V items) */
    const kiln_region_spec *sp;  /* paged (sp->block > 0): the metadata nodes and block size */
    int64_t cap;                 /* paged: keys a sequence can hold (block table width x block) */
    uint32_t bt, bt_row;         /* paged: block table slot; I32 the block's sequence's row start in it */
    bool tree;                   /* paged, a tree step (sp->parents): new keys masked off each row's draft path */
    bool q8;                     /* paged, a q8_0 pool: items dequantized as they load (key_item_q8), staged as f32 */
    int32_t mix;                 /* paged: sequences of at most mix new tokens get no tiles (the split kernels take them) */
    uint32_t par, c, q0;         /* tree: parents slot; I32 the sequence's cached keys (every row sees them), first row */
    uint32_t ti[2], walk[2];     /* tree: I32 the rows' indices among the new tokens, their depth + 1 (path length) */
    uint32_t am[2][2];           /* tree, per tile: U32 the rows' path (ancestors and itself) among the tile's keys,
                                    bit j of word w: key kb + 32 w + j, shifted right by 2 (lane & 3) */
} flash_st;

static int32_t cpr_of(const flash_st *st) { return st->hd * st->KP / 8; } /* 16-byte items a key's row takes */

/* Staging item u of K (v false) or V: its index, key (V: key pair) and 16-byte column, and whether
 * this thread has one (a guard is opened when the items do not divide the threads). */
static void stage_item(flash_st *st, bool v, int u, uint32_t *key, uint32_t *c)
{
    kiln_kir *k = st->k;
    int32_t items = (v ? st->FK / 2 : st->FK) * cpr_of(st);
    uint32_t i = kiln_k2(k, KILN_KOP_ADD, st->tid, kiln_ki(k, st->o.threads * u));
    if (items % st->o.threads) kiln_kif(k, kiln_k2(k, KILN_KOP_LT, i, kiln_ki(k, items)));
    *key = kiln_k2(k, KILN_KOP_DIV, i, kiln_ki(k, cpr_of(st)));
    *c = kiln_k2(k, KILN_KOP_REM, i, kiln_ki(k, cpr_of(st)));
}
static void stage_item_end(flash_st *st, bool v)
{
    int32_t items = (v ? st->FK / 2 : st->FK) * cpr_of(st);
    if (items % st->o.threads) kiln_kendif(st->k);
}

/* The cache words of items [u0, u1) of the tile at key kb0 into w[] (K items, then V items: 4
 * and 8 words each, at their place in w). */
static void flash_load(flash_st *st, uint32_t kb0, uint32_t w[FPRE], bool assign, int u0, int u1)
{
    kiln_kir *k = st->k;
    for (int u = u0; u < u1; u++) {
        bool v = u >= st->nk;
        uint32_t kk, c;
        stage_item(st, v, v ? u - st->nk : u, &kk, &c);
        int at = v ? 4 * st->nk + 8 * (u - st->nk) : 4 * u;
        for (int h = 0; h < (v ? 2 : 1); h++) {
            uint32_t kg = v ? kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, kk, 2), kiln_ki(k, h)) : kk;
            uint32_t key = kiln_k2(k, KILN_KOP_ADD, kb0, kg), sl = v ? st->vs : st->ks;
            uint32_t v4 = st->q8      ? key_item_q8(k, &st->f, sl, st->kvh, key, c, st->sp, st->cap, st->bt, st->bt_row)
                          : st->sp->block ? key_item_paged(k, &st->f, sl, st->kvh, key, c, st->sp, st->cap, st->bt, st->bt_row)
                                          : key_item(k, &st->f, sl, st->kvh, key, c);
            for (int j = 0; j < 4; j++) {
                uint32_t x = kiln_klane(k, v4, j);
                if (assign) kiln_kset(k, w[at + 4 * h + j], x);
                else w[at + 4 * h + j] = x;
            }
        }
        stage_item_end(st, v);
    }
}

/* Stores items [u0, u1) of the tile at key kb from their words in w[] (flash_load's places): K as
 * is, V transposed into key pairs (fragment order), V's keys past n_kv as 0 (P is 0 there, but 0 x
 * a stale inf is not; K's stale keys only make scores the mask drops). */
static void flash_put(flash_st *st, const uint32_t w[FPRE], int u0, int u1)
{
    kiln_kir *k = st->k;
    int KP = st->KP;
    int32_t KT = st->KT, VT = st->VT, tw = st->tw;
    for (int u = u0; u < u1 && u < st->nk; u++) {
        uint32_t key, c;
        stage_item(st, false, u, &key, &c);
        const uint32_t *x = w + 4 * u;
        if (KP == 1) {
            uint32_t w0 = kl_frag_b_word(k, key, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4)), KT);
            for (int p = 0; p < 4; p++)
                kiln_ksts(k, st->ksh, p ? kiln_k2(k, KILN_KOP_XOR, w0, kiln_ki(k, 4 * p)) : w0, x[p]);
        } else {
            for (int p = 0; p < 2; p++) /* pair 2c + p: dims 4c + 2p, + 1, as hi and lo parts */
                store_parts(k, st->ksh,
                            kl_frag_b_word(k, key,
                                           kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 2)),
                                                   kiln_ki(k, p)),
                                           KT),
                            tw, x[2 * p], x[2 * p + 1]);
        }
        stage_item_end(st, false);
    }
    for (int u = (u0 > st->nk ? u0 : st->nk) - st->nk; u < u1 - st->nk; u++) {
        uint32_t kp, c;
        stage_item(st, true, u, &kp, &c);
        const uint32_t *x = w + 4 * st->nk + 8 * u;
        uint32_t ok[2];
        for (int h = 0; h < 2; h++)
            ok[h] = kiln_k2(k, KILN_KOP_LT,
                            kiln_k2(k, KILN_KOP_ADD, st->kb, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, kp, 2), kiln_ki(k, h))),
                            st->n_kv);
        for (int j = 0; j < 4; j++) {
            uint32_t a = kiln_ksel(k, KILN_KT_U32, ok[0], x[j], kiln_ku(k, 0)),
                     b = kiln_ksel(k, KILN_KT_U32, ok[1], x[4 + j], kiln_ku(k, 0));
            if (KP == 2) { /* dim 4c + j: the two keys' f32 values as hi and lo parts */
                store_parts(
                    k, st->vsh,
                    kl_frag_b_word(
                        k, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4)), kiln_ki(k, j)), kp, VT),
                    tw, a, b);
                continue;
            }
            uint32_t lo = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_AND, a, kiln_ku(k, 0xffffu)),
                                  kiln_k2(k, KILN_KOP_SHL, b, kiln_ku(k, 16)));
            uint32_t hi = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_SHR, a, kiln_ku(k, 16)),
                                  kiln_k2(k, KILN_KOP_AND, b, kiln_ku(k, 0xffff0000u)));
            uint32_t dim = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 8)), kiln_ki(k, 2 * j));
            kiln_ksts(k, st->vsh, kl_frag_b_word(k, dim, kp, VT), lo);
            kiln_ksts(k, st->vsh, kl_frag_b_word(k, kiln_k2(k, KILN_KOP_ADD, dim, kiln_ki(k, 1)), kp, VT), hi);
        }
        stage_item_end(st, true);
    }
}

/* Stages the tile at key kb between two barriers: from the words prefetched during the previous
 * tile, then the next tile's loads are issued (they land while this tile computes); or loaded here. */
static void flash_stage(flash_st *st, uint32_t kend)
{
    kiln_kir *k = st->k;
    kiln_kbarrier(k); /* every warp is done with the previous tile */
    int nu = st->nk + st->nv;
    if (st->o.prefetch) {
        flash_put(st, st->pre, 0, nu);
    } else { /* item by item (few registers); one some threads lack is loaded inside a guard: into variables */
        uint32_t w[FPRE];
        bool guard = (st->FK * cpr_of(st)) % st->o.threads || (st->FK / 2 * cpr_of(st)) % st->o.threads;
        for (int i = 0; guard && i < 4 * st->nk + 8 * st->nv; i++) w[i] = kiln_kvar(k, kiln_ku(k, 0));
        for (int u = 0; u < nu; u++) {
            flash_load(st, st->kb, w, guard, u, u + 1);
            flash_put(st, w, u, u + 1);
        }
    }
    kiln_kbarrier(k);
    if (st->o.prefetch) {
        uint32_t nxt = kiln_kaddi(k, st->kb, st->FK);
        kiln_kif(k, kiln_k2(k, KILN_KOP_LT, nxt, kend));
        flash_load(st, nxt, st->pre, true, 0, st->nk + st->nv);
        kiln_kendif(k);
    }
}

/* S = q . K^T of the tile into s[] (n-tiles of 8 keys). */
static void flash_scores(flash_st *st, uint32_t s[FKMAX / 8])
{
    kiln_kir *k = st->k;
    int KP = st->KP, np = st->o.np;
    int32_t FK = st->FK, KT = st->KT, tw = st->tw;
    uint32_t ksh = st->ksh, frag = st->frag, zero4 = st->zero4;
    for (int nt = 0; nt < FK / 8; nt++) s[nt] = zero4;
    for (int np2 = 0; np2 < FK / 16; np2++)
        for (int kk = 0; kk < KT; kk++) {
            uint32_t bf[2];
            for (int pt = 0; pt < KP; pt++)
                bf[pt] = kiln_kir_op(k, KILN_KOP_LDS4, KILN_KT_V4,
                                     kiln_k2(k, KILN_KOP_ADD, frag, kiln_ki(k, (np2 * KT + kk) * 128 + pt * tw)),
                                     KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)ksh);
            for (int p = 0; p < np; p++)
                for (int pt = 0; pt + p < 2 && pt < KP; pt++) /* hi.hi, hi.lo, lo.hi: lo.lo is below f32's rounding */
                    for (int h = 0; h < 2; h++)
                        s[2 * np2 + h] =
                            kiln_kir_op(k, KILN_KOP_MMA, KILN_KT_F4, st->qf[kk][p], bf[pt], s[2 * np2 + h], h << 1);
        }
}

/* The causal mask, the rows' running max and sum (base 2), P into pv[] and the rescaled output
 * fragments into on[]. */
static void flash_softmax(flash_st *st, const uint32_t s[FKMAX / 8], uint32_t pv[FKMAX / 8][4], uint32_t on[FHD / 8])
{
    kiln_kir *k = st->k;
    int32_t hd = st->hd, FK = st->FK;
    uint32_t kb = st->kb, qq = st->qq, *m = st->m, *l = st->l, *o = st->o_;
    const uint32_t *seen = st->seen;
    /* the causal mask, the rows' maxima, P (base 2) and the rows' running sums */
    uint32_t sv[FKMAX / 8][4], mx[2] = {kiln_kf(k, -INFINITY), kiln_kf(k, -INFINITY)};
    uint32_t key0 = kiln_k2(k, KILN_KOP_ADD, kb, kiln_k2(k, KILN_KOP_MUL, qq, kiln_ki(k, 2)));
    for (int nt = 0; nt < FK / 8; nt++)
        for (int j = 0; j < 4; j++) {
            uint32_t key = kiln_k2(k, KILN_KOP_ADD, key0, kiln_ki(k, 8 * nt + (j & 1)));
            if (st->first[0] == KILN_IDX_NONE && st->capl2 == 0 && !st->tree) { /* unmasked: the golden kernels' order */
                sv[nt][j] = kiln_ksel(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_LT, key, seen[j >> 1]), lanef(k, s[nt], j),
                                      kiln_kf(k, -INFINITY));
            } else {
                uint32_t in = kiln_k2(k, KILN_KOP_LT, key, seen[j >> 1]);
                if (st->tree) { /* a cached key, or a new one on the row's path: the lane's key is kb + 2 qq + this */
                    int32_t rel = 8 * (nt & 3) + (j & 1);
                    uint32_t bit = kiln_k2(k, KILN_KOP_AND, st->am[j >> 1][nt >> 2], kiln_ku(k, 1u << rel));
                    in = kiln_k2(k, KILN_KOP_PAND, in,
                                 kiln_k2(k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_LT, key, st->c),
                                         kiln_k2(k, KILN_KOP_NE, bit, kiln_ku(k, 0))));
                }
                if (st->first[0] != KILN_IDX_NONE)
                    in = kiln_k2(k, KILN_KOP_PAND, in, kiln_k2(k, KILN_KOP_LE, st->first[j >> 1], key));
                uint32_t sc = kl_attn_score(k, st->capl2, lanef(k, s[nt], j));
                sv[nt][j] = kiln_ksel(k, KILN_KT_F32, in, sc, kiln_kf(k, -INFINITY));
            }
            mx[j >> 1] = kiln_k2(k, KILN_KOP_MAX, mx[j >> 1], sv[nt][j]);
        }
    uint32_t ms[2], alpha[2], sum[2];
    for (int r = 0; r < 2; r++) {
        uint32_t mn = kiln_k2(k, KILN_KOP_MAX, m[r], red4(k, mx[r], KILN_KRED_MAX));
        /* -inf -> 0 so that exp2(x - m) stays 0, not NaN */
        ms[r] = kiln_ksel(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_EQ, mn, kiln_kf(k, -INFINITY)), kiln_kf(k, 0), mn);
        alpha[r] = kiln_k1(k, KILN_KOP_EX2, kiln_k2(k, KILN_KOP_SUB, m[r], ms[r]));
        kiln_kset(k, m[r], mn);
        sum[r] = kiln_kf(k, 0);
    }
    for (int nt = 0; nt < FK / 8; nt++)
        for (int j = 0; j < 4; j++) {
            pv[nt][j] = kiln_k1(k, KILN_KOP_EX2, kiln_k2(k, KILN_KOP_SUB, sv[nt][j], ms[j >> 1]));
            sum[j >> 1] = kiln_k2(k, KILN_KOP_ADD, sum[j >> 1], pv[nt][j]);
        }
    for (int r = 0; r < 2; r++)
        kiln_kset(k, l[r], kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, l[r], alpha[r], sum[r], 0));
    for (int dt = 0; dt < hd / 8; dt++) {
        on[dt] = KILN_IDX_NONE;
        for (int j = 0; j < 4; j++)
            on[dt] = setlane(k, KILN_KT_F4, on[dt], kiln_k2(k, KILN_KOP_MUL, lanef(k, o[dt], j), alpha[j >> 1]), j);
    }
}

/* O += P . V: P's A fragments from S's accumulator layout (n-tiles 2 kk and 2 kk + 1). */
static void flash_pv(flash_st *st, uint32_t pv[FKMAX / 8][4], uint32_t on[FHD / 8])
{
    kiln_kir *k = st->k;
    int KP = st->KP, np = st->o.np;
    int32_t hd = st->hd, VT = st->VT, tw = st->tw;
    uint32_t vsh = st->vsh, frag = st->frag;
    for (int kk = 0; kk < VT; kk++) {
        uint32_t x[4][2] = {{pv[2 * kk][0], pv[2 * kk][1]},
                            {pv[2 * kk][2], pv[2 * kk][3]},
                            {pv[2 * kk + 1][0], pv[2 * kk + 1][1]},
                            {pv[2 * kk + 1][2], pv[2 * kk + 1][3]}};
        uint32_t pf[FP];
        a_frags(k, x, np, pf);
        for (int dp = 0; dp < hd / 16; dp++) {
            uint32_t bf[2];
            for (int pt = 0; pt < KP; pt++)
                bf[pt] = kiln_kir_op(k, KILN_KOP_LDS4, KILN_KT_V4,
                                     kiln_k2(k, KILN_KOP_ADD, frag, kiln_ki(k, (dp * VT + kk) * 128 + pt * tw)),
                                     KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)vsh);
            for (int p = 0; p < np; p++)
                for (int pt = 0; pt + p < 2 && pt < KP; pt++)
                    for (int h = 0; h < 2; h++)
                        on[2 * dp + h] =
                            kiln_kir_op(k, KILN_KOP_MMA, KILN_KT_F4, pf[p], bf[pt], on[2 * dp + h], h << 1);
        }
    }
    for (int dt = 0; dt < hd / 8; dt++) kiln_kset(k, st->o_[dt], on[dt]);
}

/* The lane's two query rows: their tokens (I32, counted from the block's first token tbase) and
 * their q rows in units of hd (row of q's [n_tok, n_head] heads, the token clamped to the last of
 * the tlim the block has, for rows past the end). A block's rows are R0 + 16 warp + g + 8 r; with
 * shared tiles row R is head (R % G) of the group at token R / G. */
typedef struct flash_rows {
    uint32_t tok[2], qrow[2], tq[2]; /* local token, q row, token (tbase + the clamped local token) */
    uint32_t lim;                    /* I32 the block's tokens: rows with tok < lim are stored */
} flash_rows;

static flash_rows flash_rows_of(kiln_kir *k, const flash_st *st, uint32_t R0, uint32_t warp, uint32_t gq,
                                uint32_t head0, uint32_t tbase, uint32_t tlim)
{
    flash_rows fr = {.lim = tlim};
    int32_t Gs = st->o.share ? (int32_t)st->f.G : 1;
    uint32_t R = kiln_k2(k, KILN_KOP_ADD, R0, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, warp, 16), gq));
    for (int r = 0; r < 2; r++) {
        uint32_t Rr = kiln_kaddi(k, R, 8 * r), hh = head0;
        fr.tok[r] = Rr;
        if (Gs > 1) {
            fr.tok[r] = kiln_k2(k, KILN_KOP_DIV, Rr, kiln_ki(k, Gs));
            hh = kiln_k2(k, KILN_KOP_ADD, head0, kiln_k2(k, KILN_KOP_REM, Rr, kiln_ki(k, Gs)));
        }
        uint32_t t = kiln_k2(k, KILN_KOP_MIN, fr.tok[r], kiln_k2(k, KILN_KOP_SUB, tlim, kiln_ki(k, 1)));
        if (tbase != KILN_IDX_NONE) t = kiln_k2(k, KILN_KOP_ADD, tbase, t);
        fr.tq[r] = t;
        fr.qrow[r] = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, t, (int32_t)st->f.n_head), hh);
    }
    return fr;
}

/* Paged: the block's sequence (grid y counts the row tiles of every sequence in turn; with st->mix,
 * of every sequence of more than mix new tokens): its first token, new tokens and KV length, and the
 * block's first row within it; *found false for a block past the step's tiles. Every thread scans the step's starts (the same words: broadcast loads). */
typedef struct flash_seq {
    uint32_t found, start, qlen, kvlen, R0, bt_row;
} flash_seq;

static flash_seq flash_find_seq(flash_st *st, const kiln_graph *g, uint32_t b, uint32_t n_tok, int32_t FQ)
{
    kiln_kir *k = st->k;
    const kiln_node_rec *sn = &g->nodes[st->sp->seqs], *bn = &g->nodes[st->sp->blocks];
    int32_t Gs = st->o.share ? (int32_t)st->f.G : 1;
    uint32_t seqs = kiln_kir_buf(k, KILN_KBUF_NODE, st->sp->seqs, false), n_seq = kl_dim(k, sn->dims[0]);
    uint32_t acc = kiln_kvar(k, kiln_ki(k, 0)), fs = kiln_kvar(k, kiln_ki(k, -1)), fst = kiln_kvar(k, kiln_ki(k, 0)),
             fq = kiln_kvar(k, kiln_ki(k, 0)), fkv = kiln_kvar(k, kiln_ki(k, 0)), ft = kiln_kvar(k, kiln_ki(k, 0));
    uint32_t i = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kloop(k, i, n_seq, kiln_ki(k, 1));
    {
        uint32_t start = kl_ld_i32(k, seqs, kiln_kmuli(k, i, 2)), kv = kl_ld_i32(k, seqs, kiln_kaddi(k, kiln_kmuli(k, i, 2), 1));
        uint32_t more = kiln_k2(k, KILN_KOP_LT, kiln_kaddi(k, i, 1), n_seq);
        uint32_t nxt = kl_ld_i32(k, seqs,
                                 kiln_kmuli(k, kiln_k2(k, KILN_KOP_MIN, kiln_kaddi(k, i, 1), kiln_kaddi(k, n_seq, -1)), 2));
        nxt = kiln_ksel(k, KILN_KT_I32, more, nxt, n_tok);
        /* unchecked device metadata: new tokens clamped into [0, n_tok - start] */
        start = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, start, kiln_ki(k, 0)), n_tok);
        uint32_t ql = kiln_k2(k, KILN_KOP_MAX, kiln_k2(k, KILN_KOP_SUB, kiln_k2(k, KILN_KOP_MIN, nxt, n_tok), start),
                              kiln_ki(k, 0));
        uint32_t tiles = kiln_k2(k, KILN_KOP_DIV, kiln_kaddi(k, kiln_kmuli(k, ql, Gs), FQ - 1), kiln_ki(k, FQ));
        if (st->mix) tiles = kiln_ksel(k, KILN_KT_I32, kiln_k2(k, KILN_KOP_LT, kiln_ki(k, st->mix), ql), tiles, kiln_ki(k, 0));
        uint32_t in = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, acc, b),
                              kiln_k2(k, KILN_KOP_LT, b, kiln_k2(k, KILN_KOP_ADD, acc, tiles)));
        kiln_kset(k, fs, kiln_ksel(k, KILN_KT_I32, in, i, fs));
        kiln_kset(k, fst, kiln_ksel(k, KILN_KT_I32, in, start, fst));
        kiln_kset(k, fq, kiln_ksel(k, KILN_KT_I32, in, ql, fq));
        kiln_kset(k, fkv, kiln_ksel(k, KILN_KT_I32, in, kv, fkv));
        kiln_kset(k, ft, kiln_ksel(k, KILN_KT_I32, in, kiln_k2(k, KILN_KOP_SUB, b, acc), ft));
        kiln_kset(k, acc, kiln_k2(k, KILN_KOP_ADD, acc, tiles));
    }
    kl_loop_end(k);
    flash_seq q = {.found = kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), fs), .start = fst, .qlen = fq};
    q.kvlen = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, fkv, kiln_ki(k, 0)), kiln_ki(k, (int32_t)st->cap));
    q.R0 = kiln_kmuli(k, ft, FQ);
    q.bt_row = kiln_kmuli(k, kiln_k2(k, KILN_KOP_MAX, fs, kiln_ki(k, 0)), (int32_t)bn->dims[1]);
    return q;
}

/* q's A fragments for the lane's two rows, pre-scaled to base-2 logits by the attention's scale,
 * for the whole key loop. */
static void flash_q_frags(flash_st *st, const kiln_node_rec *n, const kiln_node_rec *q, uint32_t qs,
                          const flash_rows *fr)
{
    kiln_kir *k = st->k;
    int32_t hd = st->hd;
    float qscale = n->f[0] * 1.44269504088896341f;
    uint32_t qrow[2];
    for (int r = 0; r < 2; r++) qrow[r] = kiln_kmuli(k, fr->qrow[r], hd);
    for (int kk = 0; kk < st->KT; kk++) {
        uint32_t x[4][2];
        for (int j = 0; j < 4; j++)
            for (int e = 0; e < 2; e++) {
                uint32_t d = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, st->qq, kiln_ki(k, 2)),
                                     kiln_ki(k, kk * 16 + 8 * (j >> 1) + e));
                x[j][e] = kiln_k2(k, KILN_KOP_MUL,
                                  kl_load(k, qs, (kiln_dtype)q->dtype, kiln_k2(k, KILN_KOP_ADD, qrow[j & 1], d)),
                                  kiln_kf(k, qscale));
            }
        a_frags(k, x, st->o.np, st->qf[kk]);
    }
}

/* The rows' outputs: O / (their sums over the 4 lanes; every row sees at least its own key, so the
 * sum is >= 1). */
static void flash_store(kiln_kir *k, const kiln_graph *g, uint32_t node, const flash_st *st, const flash_rows *fr)
{
    int32_t hd = st->hd;
    const uint32_t *l = st->l, *o = st->o_;
    for (int r = 0; r < 2; r++) {
        uint32_t inv = kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f), red4(k, l[r], KILN_KRED_SUM));
        kiln_kif(k, kiln_k2(k, KILN_KOP_LT, fr->tok[r], fr->lim));
        uint32_t ob = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, fr->qrow[r], hd), kiln_kmuli(k, st->qq, 2));
        for (int dt = 0; dt < hd / 8; dt++)
            for (int e = 0; e < 2; e++)
                kl_store_node(k, g, node, kiln_k2(k, KILN_KOP_ADD, ob, kiln_ki(k, 8 * dt + e)),
                              kiln_k2(k, KILN_KOP_MUL, lanef(k, o[dt], 2 * r + e), inv));
        kiln_kendif(k);
    }
}

/* A tree step: each row's path among the tile's keys [kb, kb + FK) as bits (st->am), by walking its
 * `walk` ancestors (itself first) where the tile reaches the new keys (none before them: the walk is
 * skipped), up the tree by kl_tree_parent (the split kernels' tree_visible walks alike).
 * The words are shifted right by 2 qq: the lane's keys are kb + 2 qq + 8 n + {0, 1}. */
static void flash_tree_tile(flash_st *st)
{
    kiln_kir *k = st->k;
    uint32_t reach = kiln_k2(k, KILN_KOP_LT, st->c, kiln_kaddi(k, st->kb, st->FK));
    uint32_t sh = kiln_kcvt(k, KILN_KT_U32, kiln_kmuli(k, st->qq, 2));
    for (int r = 0; r < 2; r++) {
        uint32_t w[2] = {kiln_kvar(k, kiln_ku(k, 0)), kiln_kvar(k, kiln_ku(k, 0))}, an = kiln_kvar(k, st->ti[r]);
        uint32_t x = kiln_kvar(k, kiln_ki(k, 0));
        kiln_kloop(k, x, kiln_ksel(k, KILN_KT_I32, reach, st->walk[r], kiln_ki(k, 0)), kiln_ki(k, 1));
        {
            uint32_t off = kiln_k2(k, KILN_KOP_SUB, kiln_k2(k, KILN_KOP_ADD, st->c, an), st->kb);
            uint32_t in = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), an),
                                  kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 0), off),
                                          kiln_k2(k, KILN_KOP_LT, off, kiln_ki(k, st->FK))));
            uint32_t bit = kiln_k2(k, KILN_KOP_SHL, kiln_ku(k, 1),
                                   kiln_kcvt(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_AND, off, kiln_ki(k, 31))));
            uint32_t hi = kiln_k2(k, KILN_KOP_LE, kiln_ki(k, 32), off);
            for (int h = 0; h < 2; h++) {
                uint32_t mine = kiln_k2(k, KILN_KOP_PAND, in, h ? hi : kiln_k1(k, KILN_KOP_PNOT, hi));
                kiln_kset(k, w[h], kiln_ksel(k, KILN_KT_U32, mine, kiln_k2(k, KILN_KOP_OR, w[h], bit), w[h]));
            }
            kiln_kset(k, an, kl_tree_parent(k, st->par, st->q0, an));
        }
        kl_loop_end(k);
        for (int h = 0; h < 2; h++) st->am[r][h] = kiln_k2(k, KILN_KOP_SHR, w[h], sh);
    }
}

/* The loop over the block's key tiles (the state's variables made here). */
static void flash_loop(flash_st *st, uint32_t kend)
{
    kiln_kir *k = st->k;
    for (int r = 0; r < 2; r++) st->m[r] = kiln_kvar(k, kiln_kf(k, -INFINITY)), st->l[r] = kiln_kvar(k, kiln_kf(k, 0));
    for (int dt = 0; dt < st->hd / 8; dt++) st->o_[dt] = kiln_kvar(k, st->zero4);
    if (st->o.prefetch) { /* the first tile's words */
        for (int i = 0; i < 4 * st->nk + 8 * st->nv; i++) st->pre[i] = kiln_kvar(k, kiln_ku(k, 0));
        flash_load(st, kiln_ki(k, 0), st->pre, true, 0, st->nk + st->nv);
    }
    st->kb = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, st->kb, kend, kiln_ki(k, st->FK), 0);
    flash_stage(st, kend);
    if (st->tree) flash_tree_tile(st);
    uint32_t s[FKMAX / 8], pv[FKMAX / 8][4], on[FHD / 8];
    flash_scores(st, s);
    flash_softmax(st, s, pv, on);
    flash_pv(st, pv, on);
    kl_loop_end(k);
}

/* Contiguous cache: the block's rows (query blocks latest first), their keys (n_kv - n_tok + t + 1)
 * and the block's key end; opens the block's guard. */
static flash_rows flash_rows_contig(flash_st *st, const kiln_node_rec *n, uint32_t bq, uint32_t warp, uint32_t gq,
                                    uint32_t head0, uint32_t n_tok, int32_t nqb, uint32_t *kend)
{
    kiln_kir *k = st->k;
    int32_t FQ = st->o.rows, Gs = st->o.share ? (int32_t)st->f.G : 1;
    uint32_t R0 = kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_SUB, kiln_ki(k, nqb - 1), bq), kiln_ki(k, FQ));
    st->n_kv = kl_dim(k, n->dim);
    kiln_kif(k, kiln_k2(k, KILN_KOP_LT, R0, kiln_kmuli(k, n_tok, Gs)));
    flash_rows fr = flash_rows_of(k, st, R0, warp, gq, head0, KILN_IDX_NONE, n_tok);
    uint32_t past = kiln_k2(k, KILN_KOP_SUB, st->n_kv, n_tok); /* keys before the first query */
    for (int r = 0; r < 2; r++) st->seen[r] = kiln_k2(k, KILN_KOP_ADD, past, kiln_kaddi(k, fr.tok[r], 1));
    /* keys the block's last row sees: its token is (R0 + FQ - 1) / Gs */
    uint32_t last = kiln_kaddi(k, R0, FQ - 1);
    if (Gs > 1) last = kiln_k2(k, KILN_KOP_DIV, last, kiln_ki(k, Gs));
    *kend = kiln_k2(k, KILN_KOP_ADD, past, kiln_k2(k, KILN_KOP_MIN, kiln_kaddi(k, last, 1), n_tok));
    return fr;
}

/* Paged pool: the block's sequence and rows, each row's keys (its position + 1, clamped into the
 * sequence's capacity: device-bound metadata is unchecked), the key end (their block maximum) and
 * the keys past which V is zeroed (the sequence's KV length); opens the block's guard. */
static flash_rows flash_rows_paged(flash_st *st, const kiln_graph *g, uint32_t bq, uint32_t warp, uint32_t gq,
                                   uint32_t head0, uint32_t n_tok, uint32_t *kend)
{
    kiln_kir *k = st->k;
    flash_seq sq = flash_find_seq(st, g, bq, n_tok, st->o.rows);
    st->bt = kiln_kir_buf(k, KILN_KBUF_NODE, st->sp->blocks, false), st->bt_row = sq.bt_row, st->n_kv = sq.kvlen;
    kiln_kif(k, sq.found);
    flash_rows fr = flash_rows_of(k, st, sq.R0, warp, gq, head0, sq.start, sq.qlen);
    uint32_t pos = kiln_kir_buf(k, KILN_KBUF_NODE, st->sp->pos, false), mx = kiln_kf(k, 0);
    if (st->tree) { /* the cached keys: KV length - new tokens, clamped into the capacity */
        st->par = kiln_kir_buf(k, KILN_KBUF_NODE, st->sp->parents, false), st->q0 = sq.start;
        st->c = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, kiln_k2(k, KILN_KOP_SUB, sq.kvlen, sq.qlen), kiln_ki(k, 0)),
                        kiln_ki(k, (int32_t)st->cap - 1));
    }
    for (int r = 0; r < 2; r++) {
        uint32_t p = kl_ld_i32(k, pos, fr.tq[r]);
        p = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, p, kiln_ki(k, 0)), kiln_ki(k, (int32_t)st->cap - 1));
        st->seen[r] = kiln_kaddi(k, p, 1);
        if (st->tree) { /* a draft's key is c + its index (its position is c + its depth): keys up to its own */
            st->ti[r] = kiln_k2(k, KILN_KOP_SUB, fr.tq[r], sq.start);
            uint32_t d = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, kiln_k2(k, KILN_KOP_SUB, p, st->c), kiln_ki(k, 0)), st->ti[r]);
            st->walk[r] = kiln_kaddi(k, d, 1);
            st->seen[r] = kiln_k2(k, KILN_KOP_MIN, kiln_kaddi(k, kiln_k2(k, KILN_KOP_ADD, st->c, st->ti[r]), 1),
                                  kiln_ki(k, (int32_t)st->cap));
        }
        mx = kiln_k2(k, KILN_KOP_MAX, mx, kiln_kcvt(k, KILN_KT_F32, st->seen[r]));
    }
    uint32_t red = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, mx, KILN_IDX_NONE, KILN_IDX_NONE,
                               (int32_t)((KILN_KRED_MAX << 16) | st->o.threads));
    *kend = kiln_kcvt(k, KILN_KT_I32, red); /* exact: keys < 2^24 */
    return fr;
}

void kl_lower_flash(const kiln_graph *g, uint32_t node, const kiln_region_spec *sp, const kiln_lower_target *tg,
                    int32_t mix, kiln_kir *k)
{
    const kiln_node_rec *n = &g->nodes[node];
    const kiln_node_rec *q = &g->nodes[n->src[0]], *kc = &g->nodes[n->src[1]];
    flash_st st = {.k = k, .sp = sp, .cap = sp->block ? g->nodes[sp->blocks].dims[1] * sp->block : 0,
                   .tree = sp->block && sp->parents != KILN_IDX_NONE, .q8 = sp->block && kc->dtype == KILN_DTYPE_Q8_0,
                   .mix = sp->block ? mix : 0};
    st.f = (fl){.k = k, .n_head = q->dims[1], .hd = q->dims[2], .max_ctx = kc->dims[1],
                .kp = kc->dtype == KILN_DTYPE_F32 || st.q8 ? 2 : 1};
    st.f.G = st.f.n_head / kc->dims[0];
    st.o = flash_geo(tg, st.f.hd, st.f.kp);
    st.KP = st.f.kp, st.hd = (int32_t)st.f.hd, st.FK = st.o.FK, st.KT = st.hd / 16, st.VT = st.FK / 16;
    st.tw = st.FK * st.hd / 2; /* words of one part of a K or V tile */
    int32_t cpr = st.hd * st.KP / 8, FT = st.o.threads, FQ = st.o.rows, Gs = st.o.share ? (int32_t)st.f.G : 1;
    st.nk = (st.FK * cpr + FT - 1) / FT, st.nv = (st.FK / 2 * cpr + FT - 1) / FT;
    int32_t nqb = (int32_t)((kl_dim_max(g, q->dims[0]) * Gs + FQ - 1) / FQ);
    if (sp->block) nqb += (int32_t)kl_dim_max(g, g->nodes[sp->seqs].dims[0]); /* a sequence's last tile may be partial */
    kiln_kir_init(k, "kiln_attn_flash", (uint32_t)FT);
    snprintf(k->what, sizeof k->what, "attention: causal flash%s, tensor cores, %d q heads/kv head%s",
             st.tree ? " (paged, draft trees)" : sp->block ? " (paged)" : "", (int)(st.f.G & 0xff), st.o.share && st.f.G > 1 ? ", shared tiles" : "");
    k->grid[0] = (uint32_t)(st.o.share ? kc->dims[0] : st.f.n_head);
    k->grid[1] = (uint32_t)nqb;
    st.ksh = kiln_kir_shared(k, (uint32_t)(st.KP * st.tw)), st.vsh = kiln_kir_shared(k, (uint32_t)(st.KP * st.tw));
    uint32_t qs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], false);
    st.ks = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[1], false), st.vs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false);
    st.tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bx = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bq = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 1);
    uint32_t lane = kiln_k2(k, KILN_KOP_AND, st.tid, kiln_ki(k, 31)), warp = kiln_k2(k, KILN_KOP_SHR, st.tid, kiln_ki(k, 5));
    uint32_t gq = kiln_k2(k, KILN_KOP_SHR, lane, kiln_ki(k, 2));
    st.qq = kiln_k2(k, KILN_KOP_AND, lane, kiln_ki(k, 3));
    st.kvh = st.o.share ? bx : kiln_k2(k, KILN_KOP_DIV, bx, kiln_ki(k, (int32_t)st.f.G));
    uint32_t head0 = st.o.share ? kiln_kmuli(k, bx, (int32_t)st.f.G) : bx;
    uint32_t n_tok = kl_dim(k, q->dims[0]), kend;
    flash_rows fr = sp->block ? flash_rows_paged(&st, g, bq, warp, gq, head0, n_tok, &kend)
                              : flash_rows_contig(&st, n, bq, warp, gq, head0, n_tok, nqb, &kend);
    /* the window's first keys; the soft-cap in the base-2 units of the scores (q carries log2 e) */
    for (int r = 0; r < 2; r++) st.first[r] = n->i[1] ? kl_attn_first_key(k, n, st.seen[r]) : KILN_IDX_NONE;
    st.capl2 = n->f[1] * 1.44269504088896341f;
    flash_q_frags(&st, n, q, qs, &fr);
    st.zero4 = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_F4, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    st.frag = kiln_k2(k, KILN_KOP_MUL, kl_frag_slot(k, lane), kiln_ki(k, 4)); /* the lane's words in a tile */
    flash_loop(&st, kend);
    flash_store(k, g, node, &st, &fr);
    kiln_kendif(k);
}
