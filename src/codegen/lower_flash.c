/* Flash attention for prefill on tensor cores (kir MMA m16n8k16, f32 accumulation), over a
 * head-major f16 or f32 KV cache. A block of 4 warps owns 64 query rows of one query head (16 per
 * warp); it walks the keys the causal mask lets its last row see in tiles of up to 64 keys (K and
 * V tiles in 16 KB), staged in shared memory in fragment order (K as is, V transposed into key
 * pairs). Per tile a warp computes S = q . K^T (16 x tile) in registers, masks it (key < n_kv -
 * n_tok + t + 1, computed, never stored), updates the rows' running max and sum (online softmax in
 * base 2), and adds P . V into its 16 x hd output fragments; P goes from S's accumulator layout
 * straight into A fragments (no shared memory). q and P enter the MMA as two f16 parts each (hi +
 * lo, the sum within 2^-22 of the f32 value); K and V are f16 already, or, from an f32 cache,
 * staged as two parts too (the hi.hi, hi.lo and lo.hi products: three MMAs where f16 takes two):
 * the result meets the contract's f32 tolerance. Query blocks run latest first (they see the most
 * keys). Must not know any target's syntax. */
#include "codegen/lower.h"

#include <math.h>
#include <string.h>

#define FQ    64  /* query rows per block */
#define FKMAX 64  /* keys per tile at most (keys_per_tile) */
#define FT    128 /* threads: 4 warps of 16 rows */
#define FP    2   /* f16 parts of q and of P */
#define FHD   128 /* largest head dim (registers: q parts, output fragments) */

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

/* The A fragments (one per part) of the 16 x 16 block whose lane j elements are x[j][0..1]. */
static void a_frags(kiln_kir *k, uint32_t x[4][2], uint32_t out[FP])
{
    for (int q = 0; q < FP; q++) out[q] = KILN_IDX_NONE;
    for (int j = 0; j < 4; j++) {
        uint32_t word[FP];
        kl_split_pair(k, x[j][0], x[j][1], FP, false, word);
        for (int q = 0; q < FP; q++) out[q] = setlane(k, KILN_KT_V4, out[q], word[q], j);
    }
}

/* Word index of dims [0, hd) of key `key` of kv head `kvh` (f16 caches: two values a word). */
static uint32_t cache_word(kiln_kir *k, const fl *f, uint32_t kvh, uint32_t key)
{
    return kiln_k2(k, KILN_KOP_MUL,
                   kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kvh, kiln_ki(k, (int32_t)f->max_ctx)), key),
                   kiln_ki(k, (int32_t)(f->hd / (3 - f->kp))));
}

/* Keys per tile: the K and V tiles (kp f16 parts each) in 16 KB, at most 64. */
static int32_t keys_per_tile(int64_t hd, int kp)
{
    int64_t fk = 4096 / (hd * kp);
    return (int32_t)(fk > 64 ? 64 : fk);
}

/* The 4 words of staging item c (16 bytes) of key kg of kv head kvh in cache slot `slot`; 0 for a
 * key past n_kv (the load reads a row of the cache that exists). */
static void key_item(kiln_kir *k, const fl *f, uint32_t slot, uint32_t kvh, uint32_t kg, uint32_t n_kv, uint32_t c,
                     uint32_t w[4])
{
    uint32_t ok = kiln_k2(k, KILN_KOP_LT, kg, n_kv);
    uint32_t row = cache_word(k, f, kvh, kiln_k2(k, KILN_KOP_MIN, kg, kiln_ki(k, (int32_t)f->max_ctx - 1)));
    uint32_t v4 = kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4,
                              kiln_k2(k, KILN_KOP_ADD, row, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4))), KILN_IDX_NONE,
                              KILN_IDX_NONE, (int32_t)slot);
    for (int j = 0; j < 4; j++) w[j] = kiln_ksel(k, KILN_KT_U32, ok, kiln_klane(k, v4, j), kiln_ku(k, 0));
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
    if (kc->dtype != vc->dtype || (kc->dtype != KILN_DTYPE_F16 && kc->dtype != KILN_DTYPE_F32) || hd % 32 || hd > FHD)
        return false;
    int kp = kc->dtype == KILN_DTYPE_F32 ? 2 : 1;
    /* whole staging items per thread: K takes fk * hd / (8 / kp) 16-byte items, V half as many */
    bool items = (keys_per_tile(hd, kp) / 2 * (hd * kp / 8)) % FT == 0;
    return items && kl_dim_max(g, q->dims[0]) > 8 && kc->dims[1] < ((int64_t)1 << 24);
}

/* One flash kernel being written: its geometry, slots and the values its phases share. */
typedef struct flash_st {
    kiln_kir *k;
    fl f;
    int KP;                      /* f16 parts of K and V (f.kp) */
    int32_t hd, FK, KT, VT, tw;  /* head dim, keys per tile, k-tiles of q, k-tiles of V, words of a tile part */
    uint32_t ksh, vsh, ks, vs;   /* shared K and V tiles; the caches' slots */
    uint32_t tid, kvh, n_kv, kb; /* I32: thread, kv head, keys, first key of the tile (loop variable) */
    uint32_t qq, frag, zero4;    /* I32 lane & 3; the lane's words in a tile; F4 zero */
    uint32_t seen[2];            /* I32 keys each of the lane's two rows sees */
    uint32_t m[2], l[2];         /* F32 variables: running max and sum of the rows */
    uint32_t o[FHD / 8];         /* F4 variables: output fragments */
    uint32_t qf[FHD / 16][FP];   /* q's A fragments, pre-scaled */
} flash_st;

/* Stages the tile at key kb: K as is, V transposed into key pairs (fragment order). */
static void flash_stage(flash_st *st)
{
    kiln_kir *k = st->k;
    const fl f = st->f;
    int KP = st->KP;
    int32_t hd = st->hd, FK = st->FK, KT = st->KT, VT = st->VT, tw = st->tw;
    uint32_t ksh = st->ksh, vsh = st->vsh, ks = st->ks, vs = st->vs, tid = st->tid, kvh = st->kvh, n_kv = st->n_kv,
             kb = st->kb;
    kiln_kbarrier(k); /* every warp is done with the previous tile */
    /* K: a thread stages 16 bytes of a key per item (8 f16 or 4 f32 dims: 4 or 2 pairs); keys
     * past n_kv are 0 */
    int32_t dpi = 8 / KP, cpr = hd / dpi; /* dims per item, items per key */
    for (int u = 0; u < FK * cpr / FT; u++) {
        uint32_t i = kiln_k2(k, KILN_KOP_ADD, tid, kiln_ki(k, FT * u));
        uint32_t key = kiln_k2(k, KILN_KOP_DIV, i, kiln_ki(k, cpr)), c = kiln_k2(k, KILN_KOP_REM, i, kiln_ki(k, cpr));
        uint32_t w[4];
        key_item(k, &f, ks, kvh, kiln_k2(k, KILN_KOP_ADD, kb, key), n_kv, c, w);
        if (KP == 1) {
            uint32_t w0 = kl_frag_b_word(k, key, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4)), KT);
            for (int p = 0; p < 4; p++)
                kiln_ksts(k, ksh, p ? kiln_k2(k, KILN_KOP_XOR, w0, kiln_ki(k, 4 * p)) : w0, w[p]);
            continue;
        }
        for (int p = 0; p < 2; p++) /* pair 2c + p: dims 4c + 2p, + 1, as hi and lo parts */
            store_parts(
                k, ksh,
                kl_frag_b_word(k, key,
                               kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 2)), kiln_ki(k, p)), KT),
                tw, w[2 * p], w[2 * p + 1]);
    }
    /* V transposed: a thread takes 16 bytes of two neighbouring keys and stores their key pairs
     * of each dim (kp parts) */
    for (int u = 0; u < FK / 2 * cpr / FT; u++) {
        uint32_t i = kiln_k2(k, KILN_KOP_ADD, tid, kiln_ki(k, FT * u));
        uint32_t kp = kiln_k2(k, KILN_KOP_DIV, i, kiln_ki(k, cpr)), c = kiln_k2(k, KILN_KOP_REM, i, kiln_ki(k, cpr));
        uint32_t vw[2][4];
        for (int h = 0; h < 2; h++)
            key_item(k, &f, vs, kvh,
                     kiln_k2(k, KILN_KOP_ADD, kb,
                             kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kp, kiln_ki(k, 2)), kiln_ki(k, h))),
                     n_kv, c, vw[h]);
        for (int w = 0; w < 4; w++) {
            uint32_t a = vw[0][w], b = vw[1][w];
            if (KP == 2) { /* dim 4c + w: the two keys' f32 values as hi and lo parts */
                store_parts(
                    k, vsh,
                    kl_frag_b_word(
                        k, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4)), kiln_ki(k, w)), kp, VT),
                    tw, a, b);
                continue;
            }
            uint32_t lo = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_AND, a, kiln_ku(k, 0xffffu)),
                                  kiln_k2(k, KILN_KOP_SHL, b, kiln_ku(k, 16)));
            uint32_t hi = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_SHR, a, kiln_ku(k, 16)),
                                  kiln_k2(k, KILN_KOP_AND, b, kiln_ku(k, 0xffff0000u)));
            uint32_t dim = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 8)), kiln_ki(k, 2 * w));
            kiln_ksts(k, vsh, kl_frag_b_word(k, dim, kp, VT), lo);
            kiln_ksts(k, vsh, kl_frag_b_word(k, kiln_k2(k, KILN_KOP_ADD, dim, kiln_ki(k, 1)), kp, VT), hi);
        }
    }
    kiln_kbarrier(k);
}

/* S = q . K^T of the tile into s[] (n-tiles of 8 keys). */
static void flash_scores(flash_st *st, uint32_t s[FKMAX / 8])
{
    kiln_kir *k = st->k;
    int KP = st->KP;
    int32_t FK = st->FK, KT = st->KT, tw = st->tw;
    uint32_t ksh = st->ksh, frag = st->frag, zero4 = st->zero4;
    /* S = q . K^T: n-tiles of 8 keys */
    for (int nt = 0; nt < FK / 8; nt++) s[nt] = zero4;
    for (int np = 0; np < FK / 16; np++)
        for (int kk = 0; kk < KT; kk++) {
            uint32_t bf[2];
            for (int pt = 0; pt < KP; pt++)
                bf[pt] = kiln_kir_op(k, KILN_KOP_LDS4, KILN_KT_V4,
                                     kiln_k2(k, KILN_KOP_ADD, frag, kiln_ki(k, (np * KT + kk) * 128 + pt * tw)),
                                     KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)ksh);
            for (int p = 0; p < FP; p++)
                for (int pt = 0; pt + p < 2 && pt < KP; pt++) /* hi.hi, hi.lo, lo.hi: lo.lo is below f32's rounding */
                    for (int h = 0; h < 2; h++)
                        s[2 * np + h] =
                            kiln_kir_op(k, KILN_KOP_MMA, KILN_KT_F4, st->qf[kk][p], bf[pt], s[2 * np + h], h << 1);
        }
}

/* The causal mask, the rows' running max and sum (base 2), P into pv[] and the rescaled output
 * fragments into on[]. */
static void flash_softmax(flash_st *st, const uint32_t s[FKMAX / 8], uint32_t pv[FKMAX / 8][4], uint32_t on[FHD / 8])
{
    kiln_kir *k = st->k;
    int32_t hd = st->hd, FK = st->FK;
    uint32_t kb = st->kb, qq = st->qq, *m = st->m, *l = st->l, *o = st->o;
    const uint32_t *seen = st->seen;
    /* the causal mask, the rows' maxima, P (base 2) and the rows' running sums */
    uint32_t sv[FKMAX / 8][4], mx[2] = {kiln_kf(k, -INFINITY), kiln_kf(k, -INFINITY)};
    uint32_t key0 = kiln_k2(k, KILN_KOP_ADD, kb, kiln_k2(k, KILN_KOP_MUL, qq, kiln_ki(k, 2)));
    for (int nt = 0; nt < FK / 8; nt++)
        for (int j = 0; j < 4; j++) {
            uint32_t key = kiln_k2(k, KILN_KOP_ADD, key0, kiln_ki(k, 8 * nt + (j & 1)));
            sv[nt][j] = kiln_ksel(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_LT, key, seen[j >> 1]), lanef(k, s[nt], j),
                                  kiln_kf(k, -INFINITY));
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
    int KP = st->KP;
    int32_t hd = st->hd, VT = st->VT, tw = st->tw;
    uint32_t vsh = st->vsh, frag = st->frag;
    for (int kk = 0; kk < VT; kk++) {
        uint32_t x[4][2] = {{pv[2 * kk][0], pv[2 * kk][1]},
                            {pv[2 * kk][2], pv[2 * kk][3]},
                            {pv[2 * kk + 1][0], pv[2 * kk + 1][1]},
                            {pv[2 * kk + 1][2], pv[2 * kk + 1][3]}};
        uint32_t pf[FP];
        a_frags(k, x, pf);
        for (int dp = 0; dp < hd / 16; dp++) {
            uint32_t bf[2];
            for (int pt = 0; pt < KP; pt++)
                bf[pt] = kiln_kir_op(k, KILN_KOP_LDS4, KILN_KT_V4,
                                     kiln_k2(k, KILN_KOP_ADD, frag, kiln_ki(k, (dp * VT + kk) * 128 + pt * tw)),
                                     KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)vsh);
            for (int p = 0; p < FP; p++)
                for (int pt = 0; pt + p < 2 && pt < KP; pt++)
                    for (int h = 0; h < 2; h++)
                        on[2 * dp + h] =
                            kiln_kir_op(k, KILN_KOP_MMA, KILN_KT_F4, pf[p], bf[pt], on[2 * dp + h], h << 1);
        }
    }
    for (int dt = 0; dt < hd / 8; dt++) kiln_kset(k, st->o[dt], on[dt]);
}

/* q's A fragments for the lane's two rows (row[], clamped to n_tok - 1), pre-scaled to base-2
 * logits by the attention's scale, for the whole key loop. */
static void flash_q_frags(kiln_kir *k, const fl *fp, const kiln_node_rec *n, const kiln_node_rec *q, uint32_t qs,
                          const uint32_t row[2], uint32_t n_tok, uint32_t head, uint32_t qq, int32_t KT,
                          uint32_t qf[FHD / 16][FP])
{
    const fl f = *fp;
    int32_t hd = (int32_t)f.hd;
    float qscale = n->f[0] * 1.44269504088896341f;
    uint32_t qrow[2];
    for (int r = 0; r < 2; r++)
        qrow[r] =
            kiln_k2(k, KILN_KOP_MUL,
                    kiln_k2(k, KILN_KOP_ADD,
                            kiln_k2(k, KILN_KOP_MUL,
                                    kiln_k2(k, KILN_KOP_MIN, row[r], kiln_k2(k, KILN_KOP_SUB, n_tok, kiln_ki(k, 1))),
                                    kiln_ki(k, (int32_t)f.n_head)),
                            head),
                    kiln_ki(k, hd));
    for (int kk = 0; kk < KT; kk++) {
        uint32_t x[4][2];
        for (int j = 0; j < 4; j++)
            for (int e = 0; e < 2; e++) {
                uint32_t d = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, qq, kiln_ki(k, 2)),
                                     kiln_ki(k, kk * 16 + 8 * (j >> 1) + e));
                x[j][e] = kiln_k2(k, KILN_KOP_MUL,
                                  kl_load(k, qs, (kiln_dtype)q->dtype, kiln_k2(k, KILN_KOP_ADD, qrow[j & 1], d)),
                                  kiln_kf(k, qscale));
            }
        a_frags(k, x, qf[kk]);
    }
}

/* The rows' outputs: O / (their sums over the 4 lanes; every row sees at least its own key, so the
 * sum is >= 1). */
static void flash_store(kiln_kir *k, const kiln_graph *g, uint32_t node, const flash_st *st, const uint32_t row[2],
                        uint32_t n_tok, uint32_t head)
{
    const fl f = st->f;
    int32_t hd = st->hd;
    uint32_t qq = st->qq;
    const uint32_t *l = st->l, *o = st->o;
    for (int r = 0; r < 2; r++) {
        uint32_t inv = kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f), red4(k, l[r], KILN_KRED_SUM));
        kiln_kif(k, kiln_k2(k, KILN_KOP_LT, row[r], n_tok));
        uint32_t ob = kiln_k2(
            k, KILN_KOP_ADD,
            kiln_k2(k, KILN_KOP_MUL,
                    kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row[r], kiln_ki(k, (int32_t)f.n_head)), head),
                    kiln_ki(k, hd)),
            kiln_k2(k, KILN_KOP_MUL, qq, kiln_ki(k, 2)));
        for (int dt = 0; dt < hd / 8; dt++)
            for (int e = 0; e < 2; e++)
                kl_store_node(k, g, node, kiln_k2(k, KILN_KOP_ADD, ob, kiln_ki(k, 8 * dt + e)),
                              kiln_k2(k, KILN_KOP_MUL, lanef(k, o[dt], 2 * r + e), inv));
        kiln_kendif(k);
    }
}

void kl_lower_flash(const kiln_graph *g, uint32_t node, kiln_kir *k)
{
    const kiln_node_rec *n = &g->nodes[node];
    const kiln_node_rec *q = &g->nodes[n->src[0]], *kc = &g->nodes[n->src[1]];
    fl f = {.k = k,
            .n_head = q->dims[1],
            .hd = q->dims[2],
            .max_ctx = kc->dims[1],
            .kp = kc->dtype == KILN_DTYPE_F32 ? 2 : 1};
    f.G = f.n_head / kc->dims[0];
    int KP = f.kp;
    int32_t hd = (int32_t)f.hd, FK = keys_per_tile(hd, KP), KT = hd / 16, VT = FK / 16,
            nqb = (int32_t)((kl_dim_max(g, q->dims[0]) + FQ - 1) / FQ);
    int32_t tw = FK * hd / 2; /* words of one part of a K or V tile */
    kiln_kir_init(k, "kiln_attn_flash", FT);
    snprintf(k->what, sizeof k->what, "attention: causal flash, tensor cores, %lld q heads per kv head",
             (long long)f.G);
    k->grid[0] = (uint32_t)f.n_head;
    k->grid[1] = (uint32_t)nqb;
    uint32_t ksh = kiln_kir_shared(k, (uint32_t)(KP * tw)), vsh = kiln_kir_shared(k, (uint32_t)(KP * tw));
    uint32_t qs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[0], false);
    uint32_t ks = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[1], false),
             vs = kiln_kir_buf(k, KILN_KBUF_NODE, n->src[2], false);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t head = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bq = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 1);
    uint32_t lane = kiln_k2(k, KILN_KOP_AND, tid, kiln_ki(k, 31)), warp = kiln_k2(k, KILN_KOP_SHR, tid, kiln_ki(k, 5));
    uint32_t gq = kiln_k2(k, KILN_KOP_SHR, lane, kiln_ki(k, 2)), qq = kiln_k2(k, KILN_KOP_AND, lane, kiln_ki(k, 3));
    uint32_t t0 = kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_SUB, kiln_ki(k, nqb - 1), bq), kiln_ki(k, FQ));
    uint32_t kvh = kiln_k2(k, KILN_KOP_DIV, head, kiln_ki(k, (int32_t)f.G));
    uint32_t n_tok = kl_dim(k, q->dims[0]), n_kv = kl_dim(k, n->dim);
    kiln_kif(k, kiln_k2(k, KILN_KOP_LT, t0, n_tok));
    uint32_t row[2];
    row[0] = kiln_k2(k, KILN_KOP_ADD, t0, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, warp, kiln_ki(k, 16)), gq));
    row[1] = kiln_k2(k, KILN_KOP_ADD, row[0], kiln_ki(k, 8));
    uint32_t past = kiln_k2(k, KILN_KOP_SUB, n_kv, n_tok); /* keys before the first query */
    uint32_t seen[2];                                      /* keys row r sees */
    for (int r = 0; r < 2; r++)
        seen[r] = kiln_k2(k, KILN_KOP_ADD, past, kiln_k2(k, KILN_KOP_ADD, row[r], kiln_ki(k, 1)));
    uint32_t kend =
        kiln_k2(k, KILN_KOP_ADD, past, kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_ADD, t0, kiln_ki(k, FQ)), n_tok));
    /* q's A fragments, pre-scaled to base-2 logits, for the whole key loop */
    uint32_t qf[FHD / 16][FP] = {{0}};
    flash_q_frags(k, &f, n, q, qs, row, n_tok, head, qq, KT, qf);
    uint32_t m[2], l[2], o[FHD / 8] = {0};
    uint32_t zero4 = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_F4, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    for (int r = 0; r < 2; r++) m[r] = kiln_kvar(k, kiln_kf(k, -INFINITY)), l[r] = kiln_kvar(k, kiln_kf(k, 0));
    for (int dt = 0; dt < hd / 8; dt++) o[dt] = kiln_kvar(k, zero4);
    uint32_t frag = kiln_k2(k, KILN_KOP_MUL, kl_frag_slot(k, lane), kiln_ki(k, 4)); /* the lane's words in a tile */
    uint32_t kb = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kb, kend, kiln_ki(k, FK), 0);
    /* clang-format off */
    flash_st st = {.k = k, .f = f, .KP = KP, .hd = hd, .FK = FK, .KT = KT, .VT = VT, .tw = tw, .ksh = ksh, .vsh = vsh,
                   .ks = ks, .vs = vs, .tid = tid, .kvh = kvh, .n_kv = n_kv, .kb = kb, .qq = qq, .frag = frag,
                   .zero4 = zero4, .seen = {seen[0], seen[1]}, .m = {m[0], m[1]}, .l = {l[0], l[1]}};
    /* clang-format on */
    memcpy(st.o, o, sizeof o);
    memcpy(st.qf, qf, sizeof qf);
    {
        flash_stage(&st);
        uint32_t s[FKMAX / 8], pv[FKMAX / 8][4], on[FHD / 8];
        flash_scores(&st, s);
        flash_softmax(&st, s, pv, on);
        flash_pv(&st, pv, on);
    }
    kl_loop_end(k);
    flash_store(k, g, node, &st, row, n_tok, head);
    kiln_kendif(k);
}
