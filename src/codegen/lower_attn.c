/* Attention template (prefill graphs with f16 or f32 caches add lower_flash.c for runs of many rows): split-KV flash-decoding over a head-major cache, grouped-query heads
 * sharing each K/V read. Kernel 1: one block per (kv head, key split, token) computes, for every
 * query head of the group, the split's running max, sum and weighted V (online softmax over tiles
 * of 128 keys: a lane per key for q.k, lanes over head dims for p.v) into the region's scratch.
 * Kernel 2: one block per (query head, token) combines the splits. On sm_90 with codegen.attn_cluster,
 * decode over a contiguous cache is one kernel instead (kiln_attn_decode): a group's splits are the
 * blocks of a thread block cluster, which combine through distributed shared memory (cluster_combine).
 * The causal limit of token t is
 * n_kv - n_tok + t + 1 keys, from the parameter buffer. Paged attention (kiln_paged_attention) runs
 * the same two kernels over a ragged batch: token t sees pos[t] + 1 keys of its own sequence (found
 * among the step's starts), each key's cache row through the block table (kl_paged_slot), the key
 * splits sized for a sequence's capacity; steps of more than 8 rows take the flash kernel (paged:
 * a block per row tile of a sequence; by default, a->mix, only the sequences
 * of more than 4 new tokens: the split kernels take the others in the same step). A tree step (speculative verification) on the split kernels:
 * a row sees keys up to its own, those of other draft paths masked by walking its parents
 * (tree_visible); tree steps of many rows take the flash kernel, which masks its tiles alike. A sliding window starts each split's key loop at the first
 * key in the window (splits wholly before it write an empty partial); soft-capping maps each score
 * as it is formed (kl_attn_score). A q8_0 pool (ggml blocks) is read a block at a time for q.k (the
 * dot of the quants, times d) and an element at a time for p.v (kl_q8_block, kl_q8_elem); its steps
 * stay on the split kernels. Must not know any target's syntax. */
#include "codegen/lower.h"

#include <math.h>

/* Warps per block (at.aw): one warp per key split keeps thousands of splits in flight; the cluster
 * kernel's blocks take up to CL_AW. Threads per block: */
#define ABLK (32 * a->aw)
#define CL_AW  4 /* cluster kernel: most warps a block (a split's tile is 32 keys a warp) */
#define CL_MAX 8 /* blocks a cluster (the portable bound) */
#define VU   8 /* keys per unrolled step of p.v */
#define CU   8 /* splits per unrolled step of the combine */

typedef struct at {
    kiln_kir *k;
    int64_t n_head, n_kvh, G, hd, max_ctx, tok_max, S, n_split;
    const kiln_region_spec *sp; /* paged: its metadata nodes and block size (block 0: a contiguous cache) */
    int64_t cap;                /* paged: keys a sequence can hold (block table width x block) */
    bool tree;                  /* paged, a tree step (sp->parents): new keys masked off other draft paths */
    int64_t HB, GB; /* query heads per block, blocks per kv head (HB * GB = G) */
    int32_t aw;     /* warps per block (1; the cluster kernel up to CL_AW) */
    int32_t cl;     /* blocks per cluster: the n_split splits of a group are one cluster's blocks and
                       combine in distributed shared memory (one kernel); 0: split + combine kernels */
    kiln_dtype kt, vt;
    bool co;        /* paged, codegen.paged_decode: coalesced tiles (co_tile), splits sized at run time
                       (co_split), a loop over the step's rows in a grid of gy rows */
    int32_t L, per; /* co: lanes a key row (16 bytes each: per values), L a power of two up to 32 */
    int64_t gy;     /* co: rows of the grid (the sequences' bound) */
    int64_t fill;   /* co: one-warp blocks that run at once (24 an SM), which a step's splits stay within */
    int32_t mix;    /* co beside the flash kernel (codegen.paged_mixed): the split kernels take the sequences
                       of at most mix new tokens of every step, the flash kernel the longer ones (a mixed
                       step's decoding sequences stay off 128-row tiles); 0: whole steps go to one or the other */
} at;

static uint32_t red(kiln_kir *k, uint32_t v, enum kiln_kred op)
{
    return kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, v, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)((op << 16) | 32));
}
static uint32_t safe_max(kiln_kir *k, uint32_t m) /* -inf -> 0 so that exp(x - m) stays 0, not NaN */
{
    return kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, kiln_k2(k, KILN_KOP_EQ, m, kiln_kf(k, -INFINITY)),
                       kiln_kf(k, 0), m, 0);
}

/* Keys per split at run time: n_kv spread over the n_split splits in multiples of 32 (at least
 * 32), so every split works whatever n_kv is below the cache's bound. */
static uint32_t split_keys(kiln_kir *k, const at *a, uint32_t n_kv)
{
    uint32_t per = kiln_k2(k, KILN_KOP_DIV, kiln_k2(k, KILN_KOP_ADD, n_kv, kiln_ki(k, (int32_t)a->n_split - 1)),
                           kiln_ki(k, (int32_t)a->n_split));
    per = kiln_k2(k, KILN_KOP_MUL,
                  kiln_k2(k, KILN_KOP_DIV, kiln_k2(k, KILN_KOP_ADD, per, kiln_ki(k, 31)), kiln_ki(k, 32)),
                  kiln_ki(k, 32));
    return kiln_k2(k, KILN_KOP_MAX, per, kiln_ki(k, 32));
}

/* Number of keys token t sees: n_kv - n_tok + t + 1. */
static uint32_t n_seen(kiln_kir *k, uint32_t n_kv, uint32_t n_tok, uint32_t t)
{
    return kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_SUB, n_kv, n_tok), kiln_k2(k, KILN_KOP_ADD, t, kiln_ki(k, 1)));
}

/* Keys token t sees, and keys per split into *S: n_kv - n_tok + t + 1 over n_kv, or (paged)
 * pos[t] + 1 over a sequence's capacity (pos clamped into it: device-bound metadata is unchecked). */
static uint32_t token_seen(kiln_kir *k, const at *a, uint32_t n_kv, uint32_t t, uint32_t n_tok, uint32_t *S)
{
    if (!a->sp->block) { /* this order of instructions is the one the golden kernels record */
        uint32_t seen = n_seen(k, n_kv, n_tok, t);
        *S = split_keys(k, a, n_kv);
        return seen;
    }
    *S = split_keys(k, a, kiln_ki(k, (int32_t)a->cap));
    uint32_t tc = kiln_k2(k, KILN_KOP_MIN, t, kiln_k2(k, KILN_KOP_SUB, n_tok, kiln_ki(k, 1)));
    uint32_t p = kl_ld_i32(k, kiln_kir_buf(k, KILN_KBUF_NODE, a->sp->pos, false), tc);
    p = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, p, kiln_ki(k, 0)), kiln_ki(k, (int32_t)a->cap - 1));
    return kiln_k2(k, KILN_KOP_ADD, p, kiln_ki(k, 1));
}

/* Paged: token t's sequence, the number of step starts at or before t, minus one, counted by the
 * block's nth threads together (uniform control flow: the count ends in a block reduction). */
static uint32_t seq_of_row(kiln_kir *k, const kiln_graph *g, const at *a, uint32_t t, uint32_t n_tok, uint32_t tid, int32_t nth)
{
    const kiln_node_rec *sn = &g->nodes[a->sp->seqs];
    uint32_t seqs = kiln_kir_buf(k, KILN_KBUF_NODE, a->sp->seqs, false), n_seq = kl_dim(k, sn->dims[0]);
    uint32_t c = kiln_kvar(k, kiln_kf(k, 0)), i = kiln_kvar(k, tid);
    /* blocks past the step's tokens (the grid covers the capacity) count nothing: no loads */
    uint32_t lim = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, kiln_k2(k, KILN_KOP_LT, t, n_tok), n_seq, kiln_ki(k, 0), 0);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, i, lim, kiln_ki(k, nth), 0);
    uint32_t st = kl_ld_i32(k, seqs, kiln_k2(k, KILN_KOP_MUL, i, kiln_ki(k, 2)));
    kiln_kset(k, c, kiln_k2(k, KILN_KOP_ADD, c,
                            kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, kiln_k2(k, KILN_KOP_LE, st, t), kiln_kf(k, 1),
                                        kiln_kf(k, 0), 0)));
    kl_loop_end(k);
    uint32_t tot = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, c, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)((KILN_KRED_SUM << 16) | nth));
    uint32_t s = kiln_k2(k, KILN_KOP_SUB, kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32, tot, KILN_IDX_NONE, KILN_IDX_NONE, 0),
                         kiln_ki(k, 1));
    return kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, s, kiln_ki(k, 0)), kiln_k2(k, KILN_KOP_SUB, n_seq, kiln_ki(k, 1)));
}

/* Paged: where token t's sequence's row of the block table starts. */
static uint32_t seq_bt_row(kiln_kir *k, const kiln_graph *g, const at *a, uint32_t t, uint32_t n_tok, uint32_t tid, int32_t nth)
{
    uint32_t s = seq_of_row(k, g, a, t, n_tok, tid, nth);
    return kiln_k2(k, KILN_KOP_MUL, s, kiln_ki(k, (int32_t)g->nodes[a->sp->blocks].dims[1]));
}

/* A tree step's row: where it sits in its sequence (I32 values, clamped so that device-bound
 * metadata that was never checked only reads inside the step). */
typedef struct tree_row {
    uint32_t q0, i;  /* the sequence's first row (t - i), the row's index among its new tokens */
    uint32_t c;      /* the sequence's cached keys (KV length - new tokens): every row sees them */
    uint32_t depth;  /* its depth in the tree, pos[t] - c in [0, i]: ancestors are that many parents up */
    uint32_t par;    /* buffer slot of the parents */
} tree_row;

/* Keys row t of sequence s sees through (its own key c + i, + 1: new keys before it off its path
 * are masked, tree_visible), and its place in the tree. */
static uint32_t tree_seen(kiln_kir *k, const kiln_graph *g, const at *a, uint32_t t, uint32_t n_tok, uint32_t s, tree_row *tr)
{
    uint32_t seqs = kiln_kir_buf(k, KILN_KBUF_NODE, a->sp->seqs, false), n_seq = kl_dim(k, g->nodes[a->sp->seqs].dims[0]);
    uint32_t tc = kiln_k2(k, KILN_KOP_MIN, t, kiln_k2(k, KILN_KOP_SUB, n_tok, kiln_ki(k, 1)));
    uint32_t s2 = kiln_k2(k, KILN_KOP_MUL, s, kiln_ki(k, 2));
    uint32_t q0 = kl_ld_i32(k, seqs, s2), kv = kl_ld_i32(k, seqs, kiln_k2(k, KILN_KOP_ADD, s2, kiln_ki(k, 1)));
    uint32_t more = kiln_k2(k, KILN_KOP_LT, kiln_k2(k, KILN_KOP_ADD, s, kiln_ki(k, 1)), n_seq);
    uint32_t nx = kl_ld_i32(k, seqs, kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, more, kiln_k2(k, KILN_KOP_ADD, s2, kiln_ki(k, 2)), s2, 0));
    nx = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, more, nx, n_tok, 0);
    tr->i = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, kiln_k2(k, KILN_KOP_SUB, tc, q0), kiln_ki(k, 0)), tc);
    tr->q0 = kiln_k2(k, KILN_KOP_SUB, tc, tr->i);
    uint32_t c = kiln_k2(k, KILN_KOP_SUB, kv, kiln_k2(k, KILN_KOP_SUB, nx, q0));
    tr->c = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, c, kiln_ki(k, 0)), kiln_ki(k, (int32_t)a->cap - 1));
    uint32_t p = kl_ld_i32(k, kiln_kir_buf(k, KILN_KBUF_NODE, a->sp->pos, false), tc);
    tr->depth = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, kiln_k2(k, KILN_KOP_SUB, p, tr->c), kiln_ki(k, 0)), tr->i);
    tr->par = kiln_kir_buf(k, KILN_KBUF_NODE, a->sp->parents, false);
    return kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_ADD, tr->c, tr->i), kiln_ki(k, 1)),
                   kiln_ki(k, (int32_t)a->cap));
}

/* Whether the row sees key j < its own of its sequence (the split kernels' tree mask, kiln_paged_sees's
 * rule): a cached key, or a new one that walking `walk` parents up from the row (kl_tree_parent, as
 * the flash kernel's flash_tree_tile) meets (walk: its depth where the tile reaches past the cached
 * keys, else 0; every thread of the block takes the same trip count). */
static uint32_t tree_visible(kiln_kir *k, const tree_row *tr, uint32_t j, uint32_t walk)
{
    uint32_t jj = kiln_k2(k, KILN_KOP_SUB, j, tr->c), an = kiln_kvar(k, tr->i), x = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, x, walk, kiln_ki(k, 1), 0);
    {
        uint32_t up = kiln_k2(k, KILN_KOP_LT, jj, an);
        kiln_kset(k, an, kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, up, kl_tree_parent(k, tr->par, tr->q0, an), an, 0));
    }
    kl_loop_end(k);
    return kiln_k2(k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_LT, j, tr->c), kiln_k2(k, KILN_KOP_EQ, an, jj));
}

/* The values the phases of one split-attention kernel share. */
typedef struct attn_st {
    kiln_kir *k;
    const at *a;
    int32_t G, hd, dpl;           /* query heads of the block, head dim, dims per lane */
    uint32_t qsh, psh, csh;       /* shared: q, p, the warps' partial results */
    uint32_t bsh;                 /* shared (cluster kernel): the block's partial result, read by the cluster */
    uint32_t scr, ks, vs;         /* slots: scratch, K and V caches */
    uint32_t tid, t, lane, warp;  /* I32: thread, query row, lane, warp */
    uint32_t qh0, sp, start, end; /* I32: first query head, split, its key range */
    uint32_t head_row, kb;        /* I32: the kv head's first cache row; the tile's first key */
    uint32_t bt, bt_row, last;    /* paged: block table slot, the sequence's row start in it; the row's last key seen */
    tree_row tr;                  /* a tree step: the row's place in its sequence's tree */
    uint32_t m[8], l[8], o[8][8]; /* F32 variables: running max, sum and output of each head */
    float softcap;                /* the node's logit soft-cap (0: none) */
    uint32_t qr[8][8], oc[8][8];  /* co: q (values) and the output (F32 variables) of the lane's dims c per .. */
    uint32_t osh;                 /* co: shared, the lanes' outputs gathered for write_partial */
} attn_st;

/* Cache row (within a kv head) of key j: j itself, or its slot through the block table. */
static uint32_t key_row(const attn_st *st, uint32_t j)
{
    const kiln_region_spec *sp = st->a->sp;
    if (!sp->block) return j;
    return kl_paged_slot(st->k, st->bt, st->bt_row, j, sp->block, st->a->max_ctx / sp->block);
}

/* s[gg] = q_gg . K[key] of this thread's key of the tile; *valid: the key is in the split. */
static void tile_scores(const attn_st *st, uint32_t s[8], uint32_t *valid_out)
{
    kiln_kir *k = st->k;
    const at *a = st->a;
    int32_t G = st->G, hd = st->hd;
    uint32_t kb = st->kb, tid = st->tid, end = st->end, start = st->start, head_row = st->head_row, ks = st->ks,
             qsh = st->qsh;
    uint32_t j = kiln_k2(k, KILN_KOP_ADD, kb, tid);
    uint32_t valid = kiln_k2(k, KILN_KOP_LT, j, end);
    uint32_t jc = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, valid, j, start, 0);
    if (a->tree) { /* keys of other draft paths score -inf like keys past the split */
        uint32_t reach = kiln_k2(k, KILN_KOP_LT, st->tr.c, kiln_k2(k, KILN_KOP_ADD, kb, kiln_ki(k, 32 * a->aw)));
        uint32_t walk = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, reach, st->tr.depth, kiln_ki(k, 0), 0);
        valid = kiln_k2(k, KILN_KOP_PAND, valid, tree_visible(k, &st->tr, jc, walk));
    }
    bool q8 = a->kt == KILN_DTYPE_Q8_0;
    uint32_t rowi = q8 ? kiln_k2(k, KILN_KOP_ADD, head_row, key_row(st, jc)) : KILN_IDX_NONE;
    /* (this form, not rowi * hd: the golden kernels record its order of instructions) */
    uint32_t krow = q8 ? KILN_IDX_NONE : kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_ADD, head_row, key_row(st, jc)), kiln_ki(k, hd));
    for (int gg = 0; gg < G; gg++) s[gg] = kiln_kf(k, 0);
    int esz = (int)kiln_dtype_block_bytes(a->kt), per = q8 ? 1 : 16 / esz; /* values per 16-byte load */
    if (q8) { /* a block of 32 at a time: q . quants, then times d */
        for (int b = 0; b < hd / 32; b++) {
            uint32_t d, w[8], part[8];
            kl_q8_block(k, ks, kiln_kaddi(k, kiln_kmuli(k, rowi, hd / 32), b), &d, w);
            for (int gg = 0; gg < G; gg++) part[gg] = kiln_kf(k, 0);
            for (int e = 0; e < 32; e++) {
                uint32_t qv = kiln_kcvt(k, KILN_KT_F32, kiln_kbfe(k, KILN_KT_I32, w[e / 4], 8 * (e % 4), 8));
                for (int gg = 0; gg < G; gg++)
                    part[gg] = kiln_kfma(k, kiln_klds(k, qsh, KILN_KT_F32, kiln_ki(k, gg * hd + 32 * b + e)), qv, part[gg]);
            }
            for (int gg = 0; gg < G; gg++) s[gg] = kiln_kfma(k, part[gg], d, s[gg]);
        }
    } else if (hd % per == 0) { /* 16-byte loads of the key row */
        uint32_t kw = kiln_k2(k, KILN_KOP_DIV, kiln_k2(k, KILN_KOP_MUL, krow, kiln_ki(k, esz)), kiln_ki(k, 4));
        for (int d = 0; d < hd; d += per) {
            uint32_t v4 =
                kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4, kiln_k2(k, KILN_KOP_ADD, kw, kiln_ki(k, d * esz / 4)),
                            KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)ks);
            for (int e = 0; e < per; e++) {
                uint32_t w =
                    kiln_kir_op(k, KILN_KOP_LANE, KILN_KT_U32, v4, KILN_IDX_NONE, KILN_IDX_NONE, esz == 4 ? e : e / 2);
                uint32_t kv = esz == 4
                                  ? kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32, w, KILN_IDX_NONE, KILN_IDX_NONE, 0)
                                  : kiln_kir_op(k, a->kt == KILN_DTYPE_F16 ? KILN_KOP_H2F : KILN_KOP_B2F, KILN_KT_F32,
                                                w, KILN_IDX_NONE, KILN_IDX_NONE, e % 2);
                for (int gg = 0; gg < G; gg++)
                    s[gg] = kiln_kfma(k, kiln_klds(k, qsh, KILN_KT_F32, kiln_ki(k, gg * hd + d + e)), kv, s[gg]);
            }
        }
    } else {
        for (int d = 0; d < hd; d++) {
            uint32_t kv = kl_load(k, ks, a->kt, kiln_k2(k, KILN_KOP_ADD, krow, kiln_ki(k, d)));
            for (int gg = 0; gg < G; gg++)
                s[gg] = kiln_kfma(k, kiln_klds(k, qsh, KILN_KT_F32, kiln_ki(k, gg * hd + d)), kv, s[gg]);
        }
    }
    for (int gg = 0; gg < G; gg++) s[gg] = kl_attn_score(k, st->softcap, s[gg]);
    *valid_out = valid;
}

/* The online softmax step of a tile: each lane's score s (of its key, slot pslot of the tile; -inf
 * where not valid) updates the running max and sum, p goes to shared memory (slot pslot), and the
 * n_o output variables of each head are rescaled. */
static void softmax_step(attn_st *st, const uint32_t s[8], uint32_t valid, uint32_t pslot, uint32_t (*o)[8], int n_o)
{
    kiln_kir *k = st->k;
    int32_t G = st->G;
    uint32_t warp = st->warp, psh = st->psh, *m = st->m, *l = st->l;
    kiln_kbarrier(k); /* the previous tile's p is consumed */
    uint32_t alpha[8];
    for (int gg = 0; gg < G; gg++) {
        uint32_t sv = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, valid, s[gg], kiln_kf(k, -INFINITY), 0);
        uint32_t mn = kiln_k2(k, KILN_KOP_MAX, m[gg], red(k, sv, KILN_KRED_MAX));
        uint32_t ms = safe_max(k, mn);
        alpha[gg] = kl_exp(k, kiln_k2(k, KILN_KOP_SUB, m[gg], ms));
        uint32_t p = kl_exp(k, kiln_k2(k, KILN_KOP_SUB, sv, ms));
        kiln_kset(k, l[gg], kiln_kfma(k, l[gg], alpha[gg], red(k, p, KILN_KRED_SUM)));
        kiln_kset(k, m[gg], mn);
        kiln_ksts(k, psh,
                  kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, warp, kiln_ki(k, G * 32)),
                          kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, gg * 32), pslot)),
                  p);
    }
    kiln_kbarrier(k);
    for (int gg = 0; gg < G; gg++)
        for (int d = 0; d < n_o; d++) kiln_kset(k, o[gg][d], kiln_k2(k, KILN_KOP_MUL, o[gg][d], alpha[gg]));
}

/* The online softmax over the tile's scores (p through shared memory), then O += P . V, VU keys
 * per step with their V loads in flight together. */
static void tile_softmax_pv(attn_st *st, const uint32_t s[8], uint32_t valid)
{
    kiln_kir *k = st->k;
    const at *a = st->a;
    int32_t G = st->G, hd = st->hd, dpl = st->dpl;
    uint32_t kb = st->kb, lane = st->lane, warp = st->warp, head_row = st->head_row, psh = st->psh, vs = st->vs;
    uint32_t (*o)[8] = st->o;
    softmax_step(st, s, valid, lane, o, dpl);
    uint32_t kk = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kk, kiln_ki(k, 32), kiln_ki(k, VU), 0);
    { /* VU keys per iteration: their V loads are all in flight before the first use */
        uint32_t vv[VU][8];
        for (int u = 0; u < VU; u++) {
            uint32_t key = kiln_k2(k, KILN_KOP_MIN,
                                   kiln_k2(k, KILN_KOP_ADD,
                                           kiln_k2(k, KILN_KOP_ADD, kb, kiln_k2(k, KILN_KOP_MUL, warp, kiln_ki(k, 32))),
                                           kiln_k2(k, KILN_KOP_ADD, kk, kiln_ki(k, u))),
                                   st->last); /* p is 0 past it, but 0 x a stale inf in the cache is not */
            bool q8 = a->vt == KILN_DTYPE_Q8_0;
            uint32_t vri = q8 ? kiln_k2(k, KILN_KOP_ADD, head_row, key_row(st, key)) : KILN_IDX_NONE;
            uint32_t vrow = q8 ? KILN_IDX_NONE
                               : kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_ADD, head_row, key_row(st, key)), kiln_ki(k, hd));
            for (int d = 0; d < dpl && q8; d++) /* dims lane + 32 d: block d, element lane */
                vv[u][d] = kl_q8_elem(k, vs, kiln_kaddi(k, kiln_kmuli(k, vri, hd / 32), d), lane);
            for (int d = 0; d < dpl && !q8; d++)
                vv[u][d] = kl_load(k, vs, a->vt,
                                   kiln_k2(k, KILN_KOP_ADD, vrow,
                                           kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_ADD, lane, kiln_ki(k, 32 * d)),
                                                   kiln_ki(k, hd - 1))));
        }
        for (int u = 0; u < VU; u++)
            for (int gg = 0; gg < G; gg++) {
                uint32_t p = kiln_klds(k, psh, KILN_KT_F32,
                                       kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, warp, kiln_ki(k, G * 32)),
                                               kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, gg * 32 + u), kk)));
                for (int d = 0; d < dpl; d++) kiln_kset(k, o[gg][d], kiln_kfma(k, p, vv[u][d], o[gg][d]));
            }
    }
    kl_loop_end(k);
}

/* ------------------------------------------------------------------ coalesced tiles (a->co)
 * A lane = sub * L + c of the (one-warp) block reads 16 bytes, dims c per .. c per + per - 1, of
 * key rows kb + i R + sub (R = 32 / L rows a load, i < L): each load instruction reads R whole rows
 * of consecutive bytes (a lane a key read 32 rows 16 bytes at a time). q.k sums a row's L lanes with a
 * group reduction; lane c of group sub keeps key c R + sub's score, so the softmax step is the lane
 * a key one's; p.v accumulates each lane's dims over its group's keys, summed over the R groups at
 * the end (co_finish). Both phases read the rows a key table of the tile gives once. */

static int32_t lg2i(int32_t v)
{
    int32_t r = 0;
    while ((1 << r) < v) r++;
    return r;
}

/* The per F32 values of a 16-byte load of the pool (f16/bf16 halves, or f32 words). */
static void co_vals(kiln_kir *k, kiln_dtype t, uint32_t v4, int per, uint32_t out[8])
{
    for (int e = 0; e < per; e++) {
        uint32_t w = kiln_klane(k, v4, per == 4 ? e : e / 2);
        out[e] = per == 4 ? kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32, w, KILN_IDX_NONE, KILN_IDX_NONE, 0)
                          : kiln_kir_op(k, t == KILN_DTYPE_F16 ? KILN_KOP_H2F : KILN_KOP_B2F, KILN_KT_F32, w, KILN_IDX_NONE,
                                        KILN_IDX_NONE, e % 2);
    }
}

/* The 16 bytes of cache row `row` (kv head's rows included) at dims c per .. of buffer slot `slot`. */
static uint32_t co_ld(const attn_st *st, uint32_t slot, uint32_t row, uint32_t c)
{
    kiln_kir *k = st->k;
    int32_t words = st->hd * (16 / st->a->per) / 4; /* of a row */
    uint32_t w = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, words), kiln_kmuli(k, c, 4));
    return kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4, w, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
}

/* One tile of 32 keys: the scores (q.k by group reductions), the softmax step, O += P . V. */
static void co_tile(attn_st *st)
{
    kiln_kir *k = st->k;
    const at *a = st->a;
    int32_t G = st->G, L = a->L, R = 32 / L, per = a->per, B = G <= 2 ? 16 : 8;
    if (B > L) B = L;
    uint32_t c = kiln_kandi(k, st->lane, L - 1), sub = kiln_kshri(k, st->lane, lg2i(L));
    uint32_t row[32], own[8] = {0}, v4[16];
    for (int i = 0; i < L; i++) { /* keys past the row's last read its last (p is 0 there; 0 x a stale inf is not) */
        uint32_t key = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_ADD, st->kb, kiln_kaddi(k, sub, i * R)), st->last);
        row[i] = kiln_k2(k, KILN_KOP_ADD, st->head_row, key_row(st, key));
    }
    for (int gg = 0; gg < G; gg++) own[gg] = kiln_kf(k, 0);
    for (int i0 = 0; i0 < L; i0 += B) { /* B rows' loads in flight together */
        for (int i = i0; i < i0 + B; i++) v4[i - i0] = co_ld(st, st->ks, row[i], c);
        for (int i = i0; i < i0 + B; i++) {
            uint32_t v[8], here = kiln_k2(k, KILN_KOP_EQ, c, kiln_ki(k, i));
            co_vals(k, a->kt, v4[i - i0], per, v);
            for (int gg = 0; gg < G; gg++) {
                uint32_t part = kiln_kf(k, 0);
                for (int e = 0; e < per; e++) part = kiln_kfma(k, st->qr[gg][e], v[e], part);
                uint32_t full = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, part, KILN_IDX_NONE, KILN_IDX_NONE,
                                            (int32_t)((KILN_KRED_SUM << 16) | L));
                own[gg] = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, here, full, own[gg], 0);
            }
        }
    }
    uint32_t slot = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, c, R), sub), s[8] = {0}; /* the lane's key: kb + slot */
    uint32_t valid = kiln_k2(k, KILN_KOP_LT, kiln_k2(k, KILN_KOP_ADD, st->kb, slot), st->end);
    for (int gg = 0; gg < G; gg++) s[gg] = kl_attn_score(k, st->softcap, own[gg]);
    softmax_step(st, s, valid, slot, st->oc, per);
    uint32_t pw = kiln_kmuli(k, st->warp, G * 32);
    for (int i0 = 0; i0 < L; i0 += B) {
        for (int i = i0; i < i0 + B; i++) v4[i - i0] = co_ld(st, st->vs, row[i], c);
        for (int i = i0; i < i0 + B; i++) {
            uint32_t v[8];
            co_vals(k, a->vt, v4[i - i0], per, v);
            for (int gg = 0; gg < G; gg++) {
                uint32_t p = kiln_klds(k, st->psh, KILN_KT_F32, kiln_k2(k, KILN_KOP_ADD, pw, kiln_kaddi(k, sub, gg * 32 + i * R)));
                for (int e = 0; e < per; e++) kiln_kset(k, st->oc[gg][e], kiln_kfma(k, p, v[e], st->oc[gg][e]));
            }
        }
    }
}

/* The lanes' outputs summed over the R groups of rows into st->o (lane owns dims lane + 32 d, as
 * write_partial takes them), through shared memory. */
static void co_finish(attn_st *st)
{
    kiln_kir *k = st->k;
    const at *a = st->a;
    int32_t G = st->G, hd = st->hd, L = a->L, R = 32 / L, per = a->per;
    uint32_t c = kiln_kandi(k, st->lane, L - 1), sub = kiln_kshri(k, st->lane, lg2i(L));
    uint32_t base = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, sub, G * hd), kiln_kmuli(k, c, per));
    for (int gg = 0; gg < G; gg++)
        for (int e = 0; e < per; e++) kiln_ksts(k, st->osh, kiln_kaddi(k, base, gg * hd + e), st->oc[gg][e]);
    kiln_kbarrier(k);
    for (int gg = 0; gg < G; gg++)
        for (int d = 0; d < st->dpl; d++) {
            uint32_t dim = kiln_k2(k, KILN_KOP_MIN, kiln_kaddi(k, st->lane, 32 * d), kiln_ki(k, hd - 1)), sum = kiln_kf(k, 0);
            for (int r = 0; r < R; r++) sum = kiln_k2(k, KILN_KOP_ADD, sum, kiln_klds(k, st->osh, KILN_KT_F32, kiln_kaddi(k, dim, (r * G + gg) * hd)));
            st->o[gg][d] = sum;
        }
}

/* Splits of a row the step runs (co): as many as keep every (sequence, kv-head group, split) block
 * of the step in one wave of a->fill, 1 .. n_split (I32): a second, partial wave would double the
 * step's time for the blocks in it (64 sequences x 32 kv heads: 1 split; 16: 3). */
static uint32_t co_want(kiln_kir *k, const kiln_graph *g, const at *a)
{
    uint32_t ns = kl_dim(k, g->nodes[a->sp->seqs].dims[0]);
    uint32_t den = kiln_k2(k, KILN_KOP_MAX, kiln_kmuli(k, ns, (int32_t)(a->n_kvh * a->GB)), kiln_ki(k, 1));
    uint32_t w = kiln_k2(k, KILN_KOP_DIV, kiln_ki(k, (int32_t)a->fill), den);
    return kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, w, kiln_ki(k, 1)), kiln_ki(k, (int32_t)a->n_split));
}

/* Keys per split of a row that sees `seen` keys (co): seen over co_want splits, a multiple of 32. */
static uint32_t co_split(kiln_kir *k, const kiln_graph *g, const at *a, uint32_t seen)
{
    uint32_t w = co_want(k, g, a);
    uint32_t per = kiln_k2(k, KILN_KOP_DIV, kiln_k2(k, KILN_KOP_ADD, seen, kiln_kaddi(k, w, -1)), w);
    per = kiln_kmuli(k, kiln_k2(k, KILN_KOP_DIV, kiln_kaddi(k, per, 31), kiln_ki(k, 32)), 32);
    return kiln_k2(k, KILN_KOP_MAX, per, kiln_ki(k, 32));
}

/* co: opens the loop over the rows a block row y takes: rows y, y + gy, ... of the step; or, with
 * a->mix, sequences y, y + gy, ... of the step, each sequence's rows in turn when it has at most mix
 * new tokens (the flash kernel takes the longer ones). *t: the row (I32 variable); *s: its sequence
 * (mix; else KILN_IDX_NONE). Starts are clamped into [0, n_tok] (device-bound metadata is unchecked),
 * so every row is < n_tok. Every thread of the block takes the same trips. Close with co_rows_end. */
static void co_rows(kiln_kir *k, const kiln_graph *g, const at *a, uint32_t y, uint32_t n_tok, uint32_t *t, uint32_t *s)
{
    if (!a->mix) {
        *t = kiln_kvar(k, y), *s = KILN_IDX_NONE;
        kiln_kloop(k, *t, n_tok, kiln_ki(k, (int32_t)a->gy));
        return;
    }
    uint32_t seqs = kiln_kir_buf(k, KILN_KBUF_NODE, a->sp->seqs, false), n_seq = kl_dim(k, g->nodes[a->sp->seqs].dims[0]);
    *s = kiln_kvar(k, y);
    kiln_kloop(k, *s, n_seq, kiln_ki(k, (int32_t)a->gy));
    uint32_t s2 = kiln_kmuli(k, *s, 2), more = kiln_k2(k, KILN_KOP_LT, kiln_kaddi(k, *s, 1), n_seq);
    uint32_t q0 = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, kl_ld_i32(k, seqs, s2), kiln_ki(k, 0)), n_tok);
    uint32_t nx = kl_ld_i32(k, seqs, kiln_ksel(k, KILN_KT_I32, more, kiln_kaddi(k, s2, 2), s2));
    nx = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, kiln_ksel(k, KILN_KT_I32, more, nx, n_tok), q0), n_tok);
    uint32_t mine = kiln_k2(k, KILN_KOP_LE, kiln_k2(k, KILN_KOP_SUB, nx, q0), kiln_ki(k, a->mix));
    *t = kiln_kvar(k, q0);
    kiln_kloop(k, *t, kiln_ksel(k, KILN_KT_I32, mine, nx, q0), kiln_ki(k, 1));
}
static void co_rows_end(kiln_kir *k, const at *a)
{
    kl_loop_end(k);
    if (a->mix) kl_loop_end(k);
}

/* Combines the block's warps, then writes the split's partial result (max, sum, output). */
static void write_partial(attn_st *st)
{
    kiln_kir *k = st->k;
    const at *a = st->a;
    int32_t G = st->G, hd = st->hd, dpl = st->dpl;
    uint32_t tid = st->tid, t = st->t, lane = st->lane, warp = st->warp, qh0 = st->qh0, sp = st->sp, csh = st->csh,
             scr = st->scr;
    uint32_t *m = st->m, *l = st->l, (*o)[8] = st->o;
    int32_t cw = G * (hd + 2);
    for (int gg = 0; gg < G; gg++) {
        uint32_t b0 =
            kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, warp, kiln_ki(k, cw)), kiln_ki(k, gg * (hd + 2)));
        kiln_kif(k, kiln_k2(k, KILN_KOP_EQ, lane, kiln_ki(k, 0)));
        kiln_ksts(k, csh, b0, m[gg]);
        kiln_ksts(k, csh, kiln_k2(k, KILN_KOP_ADD, b0, kiln_ki(k, 1)), l[gg]);
        kiln_kendif(k);
        for (int d = 0; d < dpl; d++) {
            uint32_t dd = kiln_k2(k, KILN_KOP_ADD, lane, kiln_ki(k, 32 * d));
            kiln_kif(k, kiln_k2(k, KILN_KOP_LT, dd, kiln_ki(k, hd)));
            kiln_ksts(k, csh, kiln_k2(k, KILN_KOP_ADD, b0, kiln_k2(k, KILN_KOP_ADD, dd, kiln_ki(k, 2))), o[gg][d]);
            kiln_kendif(k);
        }
    }
    kiln_kbarrier(k);
    uint32_t x = kiln_kvar(k, tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, x, kiln_ki(k, G * hd), kiln_ki(k, ABLK), 0);
    {
        uint32_t gg = kiln_k2(k, KILN_KOP_DIV, x, kiln_ki(k, hd)), d = kiln_k2(k, KILN_KOP_REM, x, kiln_ki(k, hd));
        uint32_t gb = kiln_k2(k, KILN_KOP_MUL, gg, kiln_ki(k, hd + 2));
        uint32_t mm = kiln_kf(k, -INFINITY);
        for (int w = 0; w < a->aw; w++)
            mm = kiln_k2(k, KILN_KOP_MAX, mm,
                         kiln_klds(k, csh, KILN_KT_F32, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, w * cw), gb)));
        uint32_t ms = safe_max(k, mm), L = kiln_kf(k, 0), O = kiln_kf(k, 0);
        for (int w = 0; w < a->aw; w++) {
            uint32_t wb = kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, w * cw), gb);
            uint32_t f = kl_exp(k, kiln_k2(k, KILN_KOP_SUB, kiln_klds(k, csh, KILN_KT_F32, wb), ms));
            L = kiln_kfma(k, kiln_klds(k, csh, KILN_KT_F32, kiln_k2(k, KILN_KOP_ADD, wb, kiln_ki(k, 1))), f, L);
            O = kiln_kfma(k,
                          kiln_klds(k, csh, KILN_KT_F32,
                                    kiln_k2(k, KILN_KOP_ADD, wb, kiln_k2(k, KILN_KOP_ADD, d, kiln_ki(k, 2)))),
                          f, O);
        }
        if (a->cl) { /* the cluster kernel: the block's result stays in its shared memory (cluster_combine) */
            uint32_t b = kiln_k2(k, KILN_KOP_MUL, gg, kiln_ki(k, hd + 2));
            kiln_kif(k, kiln_k2(k, KILN_KOP_EQ, d, kiln_ki(k, 0)));
            kiln_ksts(k, st->bsh, b, mm);
            kiln_ksts(k, st->bsh, kiln_kaddi(k, b, 1), L);
            kiln_kendif(k);
            kiln_ksts(k, st->bsh, kiln_k2(k, KILN_KOP_ADD, b, kiln_kaddi(k, d, 2)), O);
        } else {
            uint32_t head = kiln_k2(k, KILN_KOP_ADD, qh0, gg);
            uint32_t base = kiln_k2(
                k, KILN_KOP_MUL,
                kiln_k2(k, KILN_KOP_ADD,
                        kiln_k2(k, KILN_KOP_MUL,
                                kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)a->n_head)), head),
                                kiln_ki(k, (int32_t)a->n_split)),
                        sp),
                kiln_ki(k, hd + 2));
            kiln_kif(k, kiln_k2(k, KILN_KOP_EQ, d, kiln_ki(k, 0)));
            kl_store(k, scr, KILN_DTYPE_F32, base, mm);
            kl_store(k, scr, KILN_DTYPE_F32, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, 1)), L);
            kiln_kendif(k);
            kl_store(k, scr, KILN_DTYPE_F32, kiln_k2(k, KILN_KOP_ADD, base, kiln_k2(k, KILN_KOP_ADD, d, kiln_ki(k, 2))), O);
        }
    }
    kl_loop_end(k);
}

/* q of the block's G heads, pre-scaled, into shared memory (then a barrier). */
static void stage_q(kiln_kir *k, const at *a, float scale, uint32_t qs, kiln_dtype qt, uint32_t qsh, uint32_t tid,
                    uint32_t t, uint32_t qh0, int32_t G, int32_t hd)
{
    uint32_t i = kiln_kvar(k, tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, i, kiln_ki(k, G * hd), kiln_ki(k, ABLK), 0);
    uint32_t qi =
        kiln_k2(k, KILN_KOP_ADD,
                kiln_k2(k, KILN_KOP_MUL,
                        kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)a->n_head)), qh0),
                        kiln_ki(k, hd)),
                i);
    kiln_ksts(k, qsh, i, kiln_k2(k, KILN_KOP_MUL, kl_load(k, qs, qt, qi), kiln_kf(k, scale)));
    kl_loop_end(k);
    kiln_kbarrier(k);
}

/* The cluster kernel's end: every block's partial result is in its shared memory (bsh); the
 * cluster's threads each take an output element (gg, d) of the group, weigh the blocks' results by
 * exp(m_r - max m) through distributed shared memory, and store O / L. */
static void cluster_combine(const kiln_graph *g, uint32_t node, const attn_st *st)
{
    kiln_kir *k = st->k;
    const at *a = st->a;
    int32_t G = st->G, hd = st->hd, cl = a->cl, blk = 32 * a->aw;
    kiln_kir_op(k, KILN_KOP_CLUSTER_SYNC, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t x = kiln_kvar(k, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, st->sp, blk), st->tid)); /* sp: the block's rank */
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, x, kiln_ki(k, G * hd), kiln_ki(k, cl * blk), 0);
    {
        uint32_t gg = kiln_k2(k, KILN_KOP_DIV, x, kiln_ki(k, hd)), d = kiln_k2(k, KILN_KOP_REM, x, kiln_ki(k, hd));
        uint32_t b = kiln_k2(k, KILN_KOP_MUL, gg, kiln_ki(k, hd + 2)), ad[3];
        ad[0] = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, b, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)st->bsh);
        ad[1] = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, kiln_kaddi(k, b, 1), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)st->bsh);
        ad[2] = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, kiln_k2(k, KILN_KOP_ADD, b, kiln_kaddi(k, d, 2)), KILN_IDX_NONE,
                            KILN_IDX_NONE, (int32_t)st->bsh);
        uint32_t v[CL_MAX][3], mm = kiln_kf(k, -INFINITY);
        for (int r = 0; r < cl; r++) { /* every load in flight before the first use */
            for (int j = 0; j < 3; j++)
                v[r][j] = kiln_kir_op(k, KILN_KOP_LDS_CL, KILN_KT_F32, ad[j], kiln_ku(k, (uint32_t)r), KILN_IDX_NONE, 0);
            mm = kiln_k2(k, KILN_KOP_MAX, mm, v[r][0]);
        }
        uint32_t ms = safe_max(k, mm), L = kiln_kf(k, 0), O = kiln_kf(k, 0);
        for (int r = 0; r < cl; r++) { /* a block whose keys were all past n_kv (m = -inf) weighs 0 */
            uint32_t f = kl_exp(k, kiln_k2(k, KILN_KOP_SUB, v[r][0], ms));
            L = kiln_kfma(k, v[r][1], f, L);
            O = kiln_kfma(k, v[r][2], f, O);
        }
        uint32_t row = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, st->t, kiln_ki(k, (int32_t)a->n_head)),
                               kiln_k2(k, KILN_KOP_ADD, st->qh0, gg));
        kl_store_node(k, g, node, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, hd), d), kiln_k2(k, KILN_KOP_DIV, O, L));
    }
    kl_loop_end(k);
    /* no block leaves while another may still read its shared memory */
    kiln_kir_op(k, KILN_KOP_CLUSTER_SYNC, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

static void partial(const kiln_graph *g, uint32_t node, const kiln_node_rec *n, at *a, kiln_kir *k)
{
    kiln_kir_init(k, a->cl ? "kiln_attn_decode" : "kiln_attn_split", ABLK);
    snprintf(k->what, sizeof k->what, "attention: %lld key splits%s, %lld q heads per kv head", (long long)a->n_split,
             a->cl ? " a cluster, combined in it" : a->co ? " sized per row, coalesced rows" : "", (long long)a->G);
    k->grid[0] = (uint32_t)(a->n_kvh * a->GB * a->n_split);
    k->grid[1] = (uint32_t)(a->co || a->mix ? a->gy : a->tok_max);
    if (a->cl) k->cluster = (uint32_t)a->cl; /* n_split = cl: a cluster is a group's splits */
    int32_t G = (int32_t)a->HB, hd = (int32_t)a->hd, dpl = (hd + 31) / 32; /* lane owns dims lane + 32 i */
    uint32_t qsh = kiln_kir_shared(k, (uint32_t)(G * hd)), psh = kiln_kir_shared(k, (uint32_t)(a->aw * G * 32));
    uint32_t csh = kiln_kir_shared(k, (uint32_t)(a->aw * G * (hd + 2)));
    uint32_t bsh = a->cl ? kiln_kir_shared(k, (uint32_t)(G * (hd + 2))) : KILN_IDX_NONE;
    uint32_t osh = a->co ? kiln_kir_shared(k, (uint32_t)(32 / a->L * G * hd)) : KILN_IDX_NONE;
    uint32_t scr = a->cl ? KILN_IDX_NONE : kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, true);
    uint32_t ks = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[1], false),
             vs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false);
    uint32_t qs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], false);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bx = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t t = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 1);
    uint32_t lane = kiln_k2(k, KILN_KOP_AND, tid, kiln_ki(k, 31)), warp = kiln_k2(k, KILN_KOP_SHR, tid, kiln_ki(k, 5));
    uint32_t hg = kiln_k2(k, KILN_KOP_DIV, bx, kiln_ki(k, (int32_t)a->n_split)),
             sp = kiln_k2(k, KILN_KOP_REM, bx, kiln_ki(k, (int32_t)a->n_split));
    uint32_t h = kiln_k2(k, KILN_KOP_DIV, hg, kiln_ki(k, (int32_t)a->GB)); /* kv head */
    uint32_t qh0 = kiln_k2(
        k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, h, kiln_ki(k, (int32_t)a->G)), /* first query head of the block */
        kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_REM, hg, kiln_ki(k, (int32_t)a->GB)), kiln_ki(k, G)));
    const kiln_node_rec *q = &g->nodes[n->src[0]];
    uint32_t n_tok = kl_dim(k, q->dims[0]), n_kv = kl_dim(k, n->dim), S; /* n_kv: paged attention has none (0) */
    uint32_t rs = KILN_IDX_NONE; /* co with a->mix: the row's sequence */
    if (a->co || a->mix) { /* the block row's rows of the step (co_rows); co: splits past what the step wants leave at once */
        if (a->co) kiln_kif(k, kiln_k2(k, KILN_KOP_LT, sp, co_want(k, g, a)));
        co_rows(k, g, a, t, n_tok, &t, &rs);
        kiln_kbarrier(k); /* the previous row's shared memory is consumed */
    }
    uint32_t seen, bt_row = KILN_IDX_NONE;
    tree_row tr = {0};
    if (a->tree) {
        uint32_t sq = seq_of_row(k, g, a, t, n_tok, tid, ABLK);
        bt_row = kiln_k2(k, KILN_KOP_MUL, sq, kiln_ki(k, (int32_t)g->nodes[a->sp->blocks].dims[1]));
        seen = tree_seen(k, g, a, t, n_tok, sq, &tr);
        S = split_keys(k, a, kiln_ki(k, (int32_t)a->cap));
    } else {
        seen = token_seen(k, a, n_kv, t, n_tok, &S);
        if (a->mix) bt_row = kiln_kmuli(k, rs, (int32_t)g->nodes[a->sp->blocks].dims[1]);
        else if (a->sp->block) bt_row = seq_bt_row(k, g, a, t, n_tok, tid, ABLK);
        if (a->co) S = co_split(k, g, a, seen);
    }
    uint32_t start = kiln_k2(k, KILN_KOP_MUL, sp, S);
    uint32_t end = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_ADD, start, S), seen);
    /* the cluster kernel's blocks all reach its cluster syncs (an empty split loops zero times) */
    uint32_t live = kiln_k2(k, KILN_KOP_LT, t, n_tok);
    kiln_kif(k, a->cl ? live : kiln_k2(k, KILN_KOP_PAND, live, kiln_k2(k, KILN_KOP_LT, start, seen)));
    stage_q(k, a, n->f[0], qs, (kiln_dtype)q->dtype, qsh, tid, t, qh0, G, hd);
    attn_st st = {.k = k,
                  .a = a,
                  .G = G,
                  .hd = hd,
                  .dpl = dpl,
                  .qsh = qsh,
                  .psh = psh,
                  .csh = csh,
                  .bsh = bsh,
                  .scr = scr,
                  .ks = ks,
                  .vs = vs,
                  .tid = tid,
                  .t = t,
                  .lane = lane,
                  .warp = warp,
                  .qh0 = qh0,
                  .sp = sp,
                  .start = start,
                  .end = end,
                  .bt = a->sp->block ? kiln_kir_buf(k, KILN_KBUF_NODE, a->sp->blocks, false) : KILN_IDX_NONE,
                  .bt_row = bt_row,
                  .tr = tr,
                  .last = kiln_k2(k, KILN_KOP_SUB, seen, kiln_ki(k, 1)),
                  .osh = osh};
    for (int gg = 0; gg < G; gg++) {
        st.m[gg] = kiln_kvar(k, kiln_kf(k, -INFINITY));
        st.l[gg] = kiln_kvar(k, kiln_kf(k, 0));
        for (int d = 0; d < dpl && !a->co; d++) st.o[gg][d] = kiln_kvar(k, kiln_kf(k, 0));
        for (int e = 0; a->co && e < a->per; e++) { /* q of the lane's dims in registers, its outputs */
            uint32_t c = kiln_kandi(k, lane, a->L - 1);
            st.qr[gg][e] = kiln_klds(k, qsh, KILN_KT_F32, kiln_kaddi(k, kiln_kmuli(k, c, a->per), gg * hd + e));
            st.oc[gg][e] = kiln_kvar(k, kiln_kf(k, 0));
        }
    }
    uint32_t head_row = kiln_k2(k, KILN_KOP_MUL, h, kiln_ki(k, (int32_t)a->max_ctx));
    st.softcap = n->f[1];
    /* the window: keys before seen - window are skipped (a split wholly before them loops zero times) */
    uint32_t kb = kiln_kvar(k, n->i[1] ? kiln_k2(k, KILN_KOP_MAX, start, kl_attn_first_key(k, n, seen)) : start);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kb, end, kiln_ki(k, ABLK), 0);
    st.head_row = head_row;
    st.kb = kb;
    if (a->co) {
        co_tile(&st);
    } else {
        uint32_t s[8], valid;
        tile_scores(&st, s, &valid);
        tile_softmax_pv(&st, s, valid);
    }
    kl_loop_end(k);
    if (a->co) co_finish(&st);
    write_partial(&st);
    if (a->cl) cluster_combine(g, node, &st);
    kiln_kendif(k);
    if (a->co || a->mix) co_rows_end(k, a);
    if (a->co) kiln_kendif(k);
    if (!a->cl) k->scratch_bytes = (uint64_t)(a->tok_max * a->n_head * a->n_split * (a->hd + 2) * 4);
}

/* Paged steps beside the flash kernel: the split kernels take the sequences of at most
 * PAGED_FLASH_ROWS new tokens of every step and the flash kernel the longer ones (a->mix,
 * kl_guard_rows_mixed); with codegen.paged_mixed or codegen.paged_decode off whole steps go
 * to the flash kernel when they have more than KL_SMALL_ROWS rows and more than PAGED_FLASH_ROWS rows
 * per sequence on average (prefill chunks), else to the split kernels (kl_guard_rows). */
#define PAGED_FLASH_ROWS 4

/* codegen.paged_decode (co): a paged, non-tree step over an f16/bf16/f32 pool whose rows are whole
 * 16-byte chunks over a power of two of lanes, with q and the output of the lane's chunk for every head
 * of the group in at most 32 registers each (sm_90: llama-7b's kernel 72 registers; 7 heads a group
 * took 242, so groups of more than 4 f16 heads keep the lane-a-key kernel). Its splits: up to CO_SPLITS a row (how many a step runs comes
 * from its sequences, co_want), one query-head group a block, a grid of the sequences' bound in rows. */
#define CO_SPLITS 8
static void co_choose(const kiln_graph *g, const kiln_region_spec *sp, const kiln_lower_target *tg, bool flash, at *a)
{
    int per = a->kt == KILN_DTYPE_F32 ? 4 : 8, L = (int)a->hd / per;
    int32_t on = tg->opts.paged_decode; /* AUTO/ON, or 2..64: one-warp blocks an SM a wave holds */
    a->co = sp->block && !a->tree && (on == KILN_GEMM_AUTO || on == KILN_GEMM_ON || (on >= 2 && on <= 64)) && a->kt == a->vt &&
            (a->kt == KILN_DTYPE_F16 || a->kt == KILN_DTYPE_BF16 || a->kt == KILN_DTYPE_F32) && a->hd % per == 0 && L >= 1 &&
            L <= 32 && (L & (L - 1)) == 0 && a->G * per <= 32;
    /* a mixed step's single-token sequences were 128-row flash tiles walking their keys alone (a
     * 512-token chunk + 63 decoding: 1418 us of flash on the H100); now the coalesced split kernels
     * take them, and with codegen.paged_mixed KILN_PAGED_MIXED_ALL (opt-in until timed: qwen2-7b's
     * split kernel 122 -> 152 registers) the lane-a-key ones too (q8_0 pools, groups of more than 4
     * f16 heads); never with codegen.paged_decode off (the kernels before issue #21's change) */
    int32_t pm = tg->opts.paged_mixed;
    a->mix = sp->block && !a->tree && flash && pm != KILN_GEMM_OFF && on != KILN_GEMM_OFF && (a->co || pm == KILN_PAGED_MIXED_ALL)
                 ? PAGED_FLASH_ROWS
                 : 0;
    if (!a->co) { /* the lane-a-key kernels loop over a block row's sequences too (co_rows) when mixed */
        int64_t ns = a->mix ? kl_dim_max(g, g->nodes[sp->seqs].dims[0]) : 0;
        if (a->mix) a->gy = ns < a->tok_max ? (ns > 0 ? ns : 1) : a->tok_max;
        return;
    }
    a->per = per, a->L = L;
    a->HB = a->G, a->GB = 1;
    a->n_split = (a->cap + 31) / 32 < CO_SPLITS ? (a->cap + 31) / 32 : CO_SPLITS;
    /* with the flash kernel beside them the split kernels run steps of up to PAGED_FLASH_ROWS rows a
     * sequence (a pass or a few); without it every step, prefill chunks too: a row a grid row */
    int64_t seqs = flash ? kl_dim_max(g, g->nodes[sp->seqs].dims[0]) : a->tok_max;
    a->gy = seqs < a->tok_max ? seqs : a->tok_max;
    if (a->gy < 1) a->gy = 1;
    /* 72 registers: 28 one-warp blocks fit an SM; codegen.paged_decode 2..64 sets the wave (A/B runs) */
    a->fill = (on >= 2 ? on : 24) * (int64_t)(tg->sm_count ? tg->sm_count : 132);
}

/* Each thread a head dim: O = sum over the splits of their weighted outputs, CU splits per step with
 * their loads in flight together (weight 0 past nsp), divided by L. */
static void combine_out(kiln_kir *k, const kiln_graph *g, uint32_t node, const at *a, uint32_t scr, uint32_t fsh,
                        uint32_t tid, uint32_t t, uint32_t head, uint32_t row, uint32_t nsp, uint32_t L)
{
    int32_t hd = (int32_t)a->hd;
    uint32_t d = kiln_kvar(k, tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, d, kiln_ki(k, hd), kiln_ki(k, 128), 0);
    {
        uint32_t O = kiln_kvar(k, kiln_kf(k, 0));
        uint32_t s3 = kiln_kvar(k, kiln_ki(k, 0));
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, s3, nsp, kiln_ki(k, CU), 0);
        uint32_t ov[CU];
        for (int u = 0; u < CU; u++) {
            uint32_t si = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_ADD, s3, kiln_ki(k, u)),
                                  kiln_k2(k, KILN_KOP_SUB, nsp, kiln_ki(k, 1)));
            ov[u] = kl_load(k, scr, KILN_DTYPE_F32,
                            kiln_k2(k, KILN_KOP_ADD,
                                    kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_ADD, row, si), kiln_ki(k, hd + 2)),
                                    kiln_k2(k, KILN_KOP_ADD, d, kiln_ki(k, 2))));
        }
        uint32_t acc = O;
        for (int u = 0; u < CU; u++)
            acc = kiln_kfma(k, ov[u], kiln_klds(k, fsh, KILN_KT_F32, kiln_k2(k, KILN_KOP_ADD, s3, kiln_ki(k, u))), acc);
        kiln_kset(k, O, acc);
        kl_loop_end(k);
        uint32_t y = kiln_k2(k, KILN_KOP_DIV, O, L);
        uint32_t oi =
            kiln_k2(k, KILN_KOP_ADD,
                    kiln_k2(k, KILN_KOP_MUL,
                            kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)a->n_head)), head),
                            kiln_ki(k, hd)),
                    d);
        kl_store_node(k, g, node, oi, y);
    }
    kl_loop_end(k);
}

static void combine(const kiln_graph *g, uint32_t node, const kiln_node_rec *n, at *a, kiln_kir *k)
{
    kiln_kir_init(k, "kiln_attn_combine", 128);
    snprintf(k->what, sizeof k->what, "attention: combine up to %lld splits", (long long)a->n_split);
    k->grid[0] = (uint32_t)a->n_head;
    k->grid[1] = (uint32_t)(a->co || a->mix ? a->gy : a->tok_max);
    k->scratch_bytes = (uint64_t)(a->tok_max * a->n_head * a->n_split * (a->hd + 2) * 4);
    int32_t hd = (int32_t)a->hd;
    uint32_t scr = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, false);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t head = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t t = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 1);
    const kiln_node_rec *q = &g->nodes[n->src[0]];
    uint32_t n_tok = kl_dim(k, q->dims[0]), n_kv = kl_dim(k, n->dim), S;
    if (a->co || a->mix) { /* the partial kernel's rows (co_rows) */
        uint32_t sq;
        co_rows(k, g, a, t, n_tok, &t, &sq);
        kiln_kbarrier(k); /* the previous row's weights in shared memory are consumed */
    }
    kiln_kif(k, kiln_k2(k, KILN_KOP_LT, t, n_tok));
    uint32_t seen;
    if (a->tree) {
        tree_row tr;
        seen = tree_seen(k, g, a, t, n_tok, seq_of_row(k, g, a, t, n_tok, tid, 128), &tr);
        S = split_keys(k, a, kiln_ki(k, (int32_t)a->cap));
    } else {
        seen = token_seen(k, a, n_kv, t, n_tok, &S);
        if (a->co) S = co_split(k, g, a, seen);
    }
    uint32_t nsp =
        kiln_k2(k, KILN_KOP_DIV, kiln_k2(k, KILN_KOP_SUB, kiln_k2(k, KILN_KOP_ADD, seen, S), kiln_ki(k, 1)), S);
    uint32_t row = kiln_k2(k, KILN_KOP_MUL,
                           kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)a->n_head)), head),
                           kiln_ki(k, (int32_t)a->n_split));
    /* the splits' maxima and weights in parallel: thread s takes splits s, s + 128, ... */
    int32_t nsh = (int32_t)((a->n_split + CU - 1) / CU * CU);
    uint32_t fsh = kiln_kir_shared(k, (uint32_t)nsh);
    uint32_t mloc = kiln_kvar(k, kiln_kf(k, -INFINITY));
    uint32_t s1 = kiln_kvar(k, tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, s1, kiln_ki(k, nsh), kiln_ki(k, 128), 0);
    {
        uint32_t in = kiln_k2(k, KILN_KOP_LT, s1, nsp);
        uint32_t mv = kl_load(k, scr, KILN_DTYPE_F32,
                              kiln_k2(k, KILN_KOP_MUL,
                                      kiln_k2(k, KILN_KOP_ADD, row,
                                              kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, in, s1, kiln_ki(k, 0), 0)),
                                      kiln_ki(k, hd + 2)));
        mv = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, in, mv, kiln_kf(k, -INFINITY), 0);
        kiln_ksts(k, fsh, s1, mv);
        kiln_kset(k, mloc, kiln_k2(k, KILN_KOP_MAX, mloc, mv));
    }
    kl_loop_end(k);
    uint32_t ms = safe_max(k, kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, mloc, KILN_IDX_NONE, KILN_IDX_NONE,
                                          (int32_t)((KILN_KRED_MAX << 16) | 128)));
    uint32_t lloc = kiln_kvar(k, kiln_kf(k, 0));
    uint32_t s2 = kiln_kvar(k, tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, s2, kiln_ki(k, nsh), kiln_ki(k, 128), 0);
    {
        uint32_t in = kiln_k2(k, KILN_KOP_LT, s2, nsp);
        uint32_t f =
            kl_exp(k, kiln_k2(k, KILN_KOP_SUB, kiln_klds(k, fsh, KILN_KT_F32, s2), ms)); /* 0 past nsp: m = -inf */
        uint32_t lv =
            kl_load(k, scr, KILN_DTYPE_F32,
                    kiln_k2(k, KILN_KOP_ADD,
                            kiln_k2(k, KILN_KOP_MUL,
                                    kiln_k2(k, KILN_KOP_ADD, row,
                                            kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, in, s2, kiln_ki(k, 0), 0)),
                                    kiln_ki(k, hd + 2)),
                            kiln_ki(k, 1)));
        kiln_kset(k, lloc,
                  kiln_kfma(k, kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, in, lv, kiln_kf(k, 0), 0), f, lloc));
        kiln_ksts(k, fsh, s2, f);
    }
    kl_loop_end(k);
    uint32_t L = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, lloc, KILN_IDX_NONE, KILN_IDX_NONE,
                             (int32_t)((KILN_KRED_SUM << 16) | 128));
    kiln_kbarrier(k); /* every weight is in shared memory */
    combine_out(k, g, node, a, scr, fsh, tid, t, head, row, nsp, L);
    kiln_kendif(k);
    if (a->co || a->mix) co_rows_end(k, a);
}

/* Key split: enough blocks to fill the GPU (about 8 one-warp blocks per SM: 1056 on an H100)
 * at the cache's bound for a->tok_max rows (at most 8), >= 32 keys; when there are still too few
 * blocks, the query heads of a group split over blocks too (each re-reads the group's K/V, mostly
 * from L2). Sets S, n_split, HB, GB, aw and cl. */
static void split_shape(const kiln_graph *g, at *a, const kiln_region_spec *sp, const kiln_lower_target *tg, bool flash)
{
    int64_t tok = a->tok_max < 8 ? a->tok_max : 8, fill = 8 * (int64_t)tg->sm_count;
    int64_t want = fill / (a->n_kvh * tok), keys = sp->block ? a->cap : a->max_ctx; /* paged: one sequence's keys */
    if (want < 1) want = 1;
    a->S = (keys + want - 1) / want;
    a->aw = 1; /* one-warp splits of a multiple of 32 keys */
    a->S = (a->S + 31) / 32 * 32;
    if (a->S < 32) a->S = 32;
    a->n_split = (keys + a->S - 1) / a->S;
    a->HB = a->G;
    while (a->n_kvh * (a->G / a->HB) * a->n_split * tok < fill) {
        int64_t hb = a->HB - 1;
        while (hb > 1 && a->G % hb) hb--;
        if (hb < 1 || hb == a->HB) break;
        a->HB = hb;
    }
    a->GB = a->G / a->HB;
    co_choose(g, sp, tg, flash, a);
    /* codegen.attn_cluster (sm_90, a contiguous cache, runs of up to KL_SMALL_ROWS rows): a group's
     * splits become the blocks of one thread block cluster, of up to CL_AW warps each (about as many
     * warps as the one-warp splits above), which combine in distributed shared memory: one kernel, no
     * partials in global memory. Bounds that want many more splits than a cluster holds (long caches
     * over few kv heads) keep the two kernels. */
    if (tg->wgmma && tg->opts.attn_cluster == KILN_GEMM_ON && !sp->block && a->tok_max <= KL_SMALL_ROWS &&
        a->n_split <= 2 * CL_MAX * CL_AW) {
        while (a->aw < CL_AW && 2 * a->aw * CL_MAX <= a->n_split) a->aw *= 2;
        a->cl = 2;
        while (a->cl < CL_MAX && a->cl * a->aw < a->n_split) a->cl *= 2;
        a->n_split = a->cl;
    }
}

kiln_status kiln_lower_attention(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                                 kiln_kir k[KILN_LOWER_MAX], uint32_t *n_out, char *err, size_t n_err)
{
    uint32_t node = r->anchor;
    const kiln_node_rec *n = &g->nodes[node];
    if (r->n_nodes != 1 || (n->op != KILN_OP_ATTENTION && n->op != KILN_OP_PAGED_ATTENTION))
        return kl_unsupported(err, n_err, "attention written as ops has no GPU kernel yet");
    const kiln_region_spec *sp = &r->spec; /* q, the caches and the grouping, found by fusion */
    const kiln_node_rec *q = &g->nodes[sp->q], *kc = &g->nodes[sp->k], *vc = &g->nodes[sp->v];
    at a = {.sp = sp,
            .cap = sp->block ? g->nodes[sp->blocks].dims[1] * sp->block : 0,
            .tree = sp->block && sp->parents != KILN_IDX_NONE,
            .n_head = q->dims[1],
            .hd = q->dims[2],
            .n_kvh = kc->dims[0],
            .max_ctx = kc->dims[1],
            .kt = (kiln_dtype)kc->dtype,
            .vt = (kiln_dtype)vc->dtype,
            .tok_max = kl_dim_max(g, q->dims[0])};
    if (kiln_dim_is_sym(a.n_head) || kiln_dim_is_sym(a.hd) || kiln_dim_is_sym(a.n_kvh) || kiln_dim_is_sym(a.max_ctx) ||
        kiln_dim_is_sym(vc->dims[1]) || vc->dims[2] != a.hd || vc->dims[0] != a.n_kvh)
        return kl_unsupported(err, n_err, "attention: head counts, head_dim and cache sizes must be constants");
    if (!sp->heads_per_group) return kl_unsupported(err, n_err, "attention: heads do not group");
    a.G = sp->heads_per_group;
    if (a.hd < 1 || a.hd > 256 || a.G > 8 || (a.hd + 31) / 32 * a.G > 32)
        return kl_unsupported(err, n_err, "attention: head_dim %lld with %lld heads per kv head", (long long)a.hd,
                              (long long)a.G);
    bool q8 = sp->block && a.kt == KILN_DTYPE_Q8_0 && a.vt == KILN_DTYPE_Q8_0 && a.hd % 32 == 0; /* a q8_0 pool */
    if (((kiln_dtype_block(a.kt) != 1 || kiln_dtype_block(a.vt) != 1) && !q8) || a.kt == KILN_DTYPE_I32 ||
        a.vt == KILN_DTYPE_I32 || kiln_dtype_block((kiln_dtype)q->dtype) != 1 || kiln_dtype_block((kiln_dtype)n->dtype) != 1)
        return kl_unsupported(err, n_err, "attention: cache dtype %s", kiln_dtype_name(a.kt));
    /* Prefill (more than KL_SMALL_ROWS query rows at the bound): the flash kernel on the tensor
     * cores takes runs of many rows; the split kernels, sized for few, take the others (decode
     * through a prefill plan), each guarded by the run's row count. */
    if (sp->block && (a.cap > INT32_MAX / 2 || a.max_ctx > INT32_MAX / a.hd || (q8 && a.n_kvh * a.max_ctx > INT32_MAX / (a.hd / 32 * 34))))
        return kl_unsupported(err, n_err, "paged attention: a pool of %lld slots x %lld is past 32-bit indices",
                              (long long)a.max_ctx, (long long)a.hd);
    /* paged steps of many rows too (prefill chunks with decoding sequences) where the MMA is native,
     * unless codegen.flash is off (A/B runs: the split kernels take every paged step, as before);
     * Vulkan's emulated MMA keeps paged steps on the split kernels (lavapipe runs minutes longer) */
    /* tree steps (a.tree) of many rows take the mma.sync flash kernel (its tiles mask draft paths,
     * flash_tree_tile), never the warpgroup one */
    bool wg = !a.tree && kl_flash_wg_fits(g, n, sp, tg); /* Hopper, f16 precision: the warpgroup kernel (lower_flash_wg.c) */
    bool flash = wg || (kl_flash_fits(g, n) && (!sp->block || (tg->opts.flash != KILN_GEMM_OFF && tg->mma_native)));
    /* contiguous: the split kernels take only runs of up to KL_SMALL_ROWS rows; paged steps of many
     * sequences with few rows each (batched decode) stay on them too (one flash block per sequence
     * walks all its keys alone: 64 x 1024 decode ran 2x slower there), so they keep the bound */
    if (flash && !sp->block) a.tok_max = KL_SMALL_ROWS; /* kl_flash_fits: more rows than that at the bound */
    at a1 = a; /* the one-row splits of a prefill-sized plan (one_row) */
    a1.tok_max = 1;
    split_shape(g, &a, sp, tg, flash);
    /* a pool's element (co: word) and the lane-a-key kernel's byte indices are 32-bit (and so are the
     * KV writes of the GEMM epilogue and kv_scatter): on the H100 a 256 x 2064-slot llama-7b pool
     * (2.2 G elements) and, in the lane-a-key kernel, a 64 x 6688-slot one (3.5 G bytes) hit illegal
     * addresses; refused here instead */
    int64_t pool = a.n_kvh * a.max_ctx * a.hd;
    if (sp->block && !q8 && (pool > INT32_MAX || (!a.co && pool > INT32_MAX / (int64_t)kiln_dtype_block_bytes(a.kt))))
        return kl_unsupported(err, n_err, "paged attention: a pool of %lld kv heads x %lld slots x %lld is past 32-bit indices%s",
                              (long long)a.n_kvh, (long long)a.max_ctx, (long long)a.hd,
                              a.co ? "" : " (the lane-a-key kernel's byte offsets)");
    partial(g, node, n, &a, &k[0]);
    uint32_t f = 1; /* kernels before the flash kernel: the cluster kernel, or split and combine */
    if (!a.cl) combine(g, node, n, &a, &k[f++]);
    *n_out = f;
    if (flash) {
        int64_t per_row = a.n_head * a.hd;
        /* Decode steps through a prefill-sized plan (kiln generate) take the splits a decode plan
         * sizes for one row: those sized for 8 rows leave 7/8 of their blocks idle at one row (llama-7b
         * at KV 640: 4 key splits, 128 busy one-warp blocks, against 32 splits and 1024). */
        bool one_row = !sp->block && tg->opts.decode_kernels != KILN_GEMM_OFF;
        uint32_t f8 = f;
        if (one_row) {
            split_shape(g, &a1, sp, tg, flash);
            partial(g, node, n, &a1, &k[f++]);
            if (!a1.cl) combine(g, node, n, &a1, &k[f++]);
        }
        if (wg) kl_lower_flash_wg(g, node, tg, &k[f]); /* contiguous caches only */
        else kl_lower_flash(g, node, sp, tg, a.mix, &k[f]);
        for (uint32_t i = 0; i <= f; i++)
            if (a.mix) { /* the split kernels run every step (each takes its short sequences) */
                if (i < f) continue;
                kl_guard_rows_mixed(&k[i], g, n->src[0], per_row, sp->seqs, a.mix);
                /* the flash kernel's rows are none of theirs and it uses no scratch: a launcher may run
                 * it beside them (its 128-row tiles leave most of each SM to the bandwidth-bound splits) */
                k[i].side = tg->opts.paged_mixed >= KILN_PAGED_MIXED_SIDE; /* opt-in until timed on the H100 */
            } else if (one_row && i < f8) kl_guard_rows_range(&k[i], g, n->src[0], per_row, 1, KL_SMALL_ROWS);
            else if (one_row && i < f) kl_guard_rows(&k[i], g, n->src[0], per_row, 1, KILN_IDX_NONE, 0, true);
            else
                kl_guard_rows(&k[i], g, n->src[0], per_row, KL_SMALL_ROWS, sp->block ? sp->seqs : KILN_IDX_NONE,
                              PAGED_FLASH_ROWS, i < f);
        *n_out = f + 1;
    }
    return KILN_OK;
}
