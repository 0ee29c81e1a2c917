/* GEMM template for matmul regions with many rows (prefill): y_j[t, n] = f(x)[t] . W_j[n] on
 * tensor-core tiles (kir MMA: m16n8k16, f32 accumulation). A block owns 128 tokens (block weights
 * with enough blocks; else 64) x 128 columns (the columns of every sibling of one group), 8 warps of
 * 64 (32) x 32 each; blocks along x walk the tokens, so a weight tile is read from DRAM once. The K loop stages x and the
 * weights in shared memory in fragment order (one LDS4 per fragment), the next tile's loads in
 * flight in registers while the current one multiplies. x is split into 1..3 f16/bf16 parts so
 * that its f32 value is kept (the contract's f16/bf16 tolerance); f32 weights are split into two
 * f16 parts too (three products: hi.hi, hi.lo, lo.hi); block weights are dequantized to
 * f16 by gemv's decoders. An rms_norm prologue gets its row scales from a first kernel. The
 * epilogue goes through shared memory into gemv's per-element epilogue (bias, residual, swiglu,
 * rope, KV writes). On sm_90a the Hopper template (TMA + warpgroup MMA) of lower_gemm_wg.c takes
 * the region instead; this file keeps the entry, the rms and split kernels. Must not know any
 * target's syntax. */
#include "codegen/lower_gemm_int.h"

#include <stdlib.h>
#include <string.h>


/* What a thread stages, fixed for the whole K loop (computed once, before it): its items of the
 * x tile and of the weight tile, their global word offsets without k, and the shared words of
 * their first pairs (the other pairs are at constant distances: see gm_store). */
typedef struct gm_plan {
    uint32_t xbase[4];    /* I32 word of x's item at k = 0 */
    uint32_t nwoff[4];    /* I32 first k of the item (norm weight offset at k0 = 0) */
    uint32_t ascale[4];   /* F32 rms scale of the item's row, or NONE */
    uint32_t aw[4];       /* I32 A-tile word of the item's first pair (part 0) */
    uint32_t wrow[4];     /* I32 weight row of each weight item */
    uint32_t wbase[4];    /* I32 word of a float weight item at k = 0 */
    uint32_t piece[4];    /* I32 piece of a block weight item (0, 1: 16 values each) */
    uint32_t bw[4];       /* I32 B-tile word of the item's first pair */
    uint32_t fa, fb;      /* I32 shared words of the warp's first A and B fragments */
} gm_plan;

/* One tile's global loads, held in registers while the previous tile multiplies. */
typedef struct gm_raw {
    uint32_t ax[4];       /* x: V4 per item */
    uint32_t axp[4][3];   /* prepared x: V4 per item and part */
    uint32_t anw[4][2];   /* V4 of the norm weight, or NONE */
    gv_chunk b[2];        /* weight chunks, per item */
    uint32_t b32[4];      /* f32 weights: V4 (4 values) per item */
    uint32_t bc[2];       /* I32 chunk index of each block-weight item */
} gm_raw;


/* f16/bf16 weights: 2 items of 8 values a thread; f32: 4 items of 4 values (two f16 parts each);
 * block weights: one chunk per sibling. */
static int w_items(const gm *g, const gv_group *G) { return g->wt == KILN_DTYPE_F32 ? 4 : is_float_w(g->wt) ? 2 : G->n_sib; }
/* x parts for weights t (x is split so that its f32 value is kept, unless it is already exact or
 * the compile asks for f16 activations: codegen.precision). */
int kl_gm_x_parts(const gv *s, kiln_dtype t, bool x_exact)
{
    if (kiln_dtype_block(t) > 1 || x_exact || s->tgt->opts.precision == KILN_PREC_F16) return 1;
    return t == KILN_DTYPE_BF16 ? 3 : 2;
}

/* ------------------------------------------------------------------ fragment-order layouts */


/* Tiles in fragment order (kl_frag_*): A tiles of 64 rows x 32 k, B tiles of 128 columns x 32 k. */
static uint32_t slot_of(gm *g, uint32_t lane) { return kl_frag_slot(g->k, lane); }
static uint32_t a_word(gm *g, uint32_t r, uint32_t p) { return kl_frag_a_word(g->k, r, p, 2); }
static uint32_t b_word(gm *g, uint32_t n, uint32_t p) { return addi(g, kl_frag_b_word(g->k, n, p, 2), g->parts * g->apart); }

/* ------------------------------------------------------------------ staging */

static bool x_is_f32(const gm *g) { return !g->xp && g->s->xdt == KILN_DTYPE_F32; }
static int x_items(const gm *g) { return (x_is_f32(g) ? 2 : 1) * g->bm / 64; }

/* Chunk index of piece h of a block-weight tile starting at k0 (the format's chunk layout). */
static uint32_t qchunk(gm *g, uint32_t k0, uint32_t h) { return kl_wfmt_of(g->wt)->gemm_chunk(g->k, k0, h); }

static void gm_plan_make(gm *g, const gv_group *G, gm_plan *P)
{
    gv *s = g->s;
    int64_t K = s->K;
    bool f32 = x_is_f32(g);
    for (int j = 0; j < x_items(g); j++) {
        uint32_t i = addi(g, g->tid, GM_THREADS * j);
        uint32_t row = shri(g, i, f32 ? 3 : 2), c = andi(g, i, f32 ? 7 : 3);
        uint32_t gr = o2(g, KILN_KOP_MIN, add(g, g->m0, row), addi(g, g->m, -1));
        P->xbase[j] = add(g, muli(g, gr, (int32_t)(f32 ? K : K / 2)), muli(g, c, 4));
        if (g->xp) P->xbase[j] = addi(g, P->xbase[j], g->xp_word);
        P->nwoff[j] = muli(g, c, f32 ? 4 : 8);
        P->ascale[j] = g->scr != KILN_IDX_NONE ? kl_load(g->k, g->scr, KILN_DTYPE_F32, gr) : KILN_IDX_NONE;
        P->aw[j] = a_word(g, row, muli(g, c, f32 ? 2 : 4));
    }
    for (int j = 0; j < w_items(g, G); j++) {
        int sp = g->wt == KILN_DTYPE_F32 ? (G->n_sib == 2 ? j >> 1 : 0) : is_float_w(g->wt) ? (G->n_sib == 2 ? j : 0) : j; /* sibling position */
        uint32_t ris, piece;
        if (g->wt == KILN_DTYPE_F32) { /* 8 pieces of 4 values per row */
            uint32_t i = addi(g, g->tid, GM_THREADS * (G->n_sib == 2 ? j & 1 : j));
            ris = shri(g, i, 3);
            piece = andi(g, i, 7);
        } else if (is_float_w(g->wt)) { /* 4 pieces of 8 values per row */
            ris = shri(g, g->tid, 2);
            if (G->n_sib == 1) ris = addi(g, ris, 64 * j);
            piece = andi(g, g->tid, 3);
        } else { /* 2 pieces of 16 per row; with two siblings threads 128.. repeat 0..127 (same values) */
            uint32_t li = g->bns * 2 >= GM_THREADS ? g->tid : andi(g, g->tid, g->bns * 2 - 1);
            ris = shri(g, li, 1);
            piece = andi(g, li, 1);
        }
        uint32_t brow = addi(g, ris, sp * g->bns);
        P->wrow[j] = o2(g, KILN_KOP_MIN, add(g, g->n0, ris), ci(g, (int32_t)(G->n - 1)));
        P->wbase[j] = add(g, muli(g, P->wrow[j], (int32_t)(g->wt == KILN_DTYPE_F32 ? K : K / 2)), muli(g, piece, 4));
        P->piece[j] = piece;
        P->bw[j] = b_word(g, brow, muli(g, piece, g->wt == KILN_DTYPE_F32 ? 2 : is_float_w(g->wt) ? 4 : 8));
    }
    uint32_t slot = slot_of(g, g->lane);
    P->fa = add(g, muli(g, g->wm, g->bm * 8), muli(g, slot, 4)); /* bm / 32 m-tiles x 2 k-tiles x 128 words */
    P->fb = addi(g, add(g, muli(g, g->wn, 512), muli(g, slot, 4)), g->parts * g->apart);
}

static void gm_load(gm *g, const gv_group *G, const gm_plan *P, gm_raw *raw, uint32_t k0)
{
    gv *s = g->s;
    bool f32 = x_is_f32(g);
    uint32_t k0h = shri(g, k0, 1);
    for (int j = 0; j < x_items(g); j++) {
        if (g->xp) {
            for (int q = 0; q < g->parts; q++) raw->axp[j][q] = ld4(g, g->xs, add(g, addi(g, P->xbase[j], q * g->xp_part), k0h));
            continue;
        }
        raw->ax[j] = ld4(g, g->xs, add(g, P->xbase[j], f32 ? k0 : k0h));
        for (int h = 0; h < 2; h++) raw->anw[j][h] = KILN_IDX_NONE;
        if (g->nws != KILN_IDX_NONE)
            for (int h = 0; h < (f32 ? 1 : 2); h++) raw->anw[j][h] = ld4(g, g->nws, addi(g, add(g, k0, P->nwoff[j]), 4 * h));
    }
    for (int j = 0; j < w_items(g, G); j++) {
        int sp = g->wt == KILN_DTYPE_F32 ? (G->n_sib == 2 ? j >> 1 : 0) : is_float_w(g->wt) ? (G->n_sib == 2 ? j : 0) : j;
        uint32_t slot = kiln_kir_buf(g->k, KILN_KBUF_NODE, s->g->nodes[s->mm[G->sib[sp]]].src[1], false);
        if (g->wt == KILN_DTYPE_F32) {
            raw->b32[j] = ld4(g, slot, add(g, P->wbase[j], k0));
            continue;
        }
        if (is_float_w(g->wt)) {
            raw->b[j].v[0] = ld4(g, slot, add(g, P->wbase[j], k0h));
            continue;
        }
        raw->bc[j] = qchunk(g, k0, P->piece[j]);
        kl_gv_load_chunk(s, g->wt, slot, P->wrow[j], raw->bc[j], G->n, &raw->b[j]);
    }
}

/* x staged as it comes: already the MMA's element type in one part, with no norm to apply. */
static bool x_raw_words(const gm *g)
{
    return g->s->xdt == (g->bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F16) && g->parts == 1 && g->nws == KILN_IDX_NONE && g->scr == KILN_IDX_NONE;
}

/* Pair pp of x item j (norm scale and weight applied) split into the GEMM's parts: word[0..parts). */
static void x_pair_words(gm *g, const gm_plan *P, const gm_raw *raw, int j, int pp, uint32_t word[3])
{
    gv *s = g->s;
    bool f32 = x_is_f32(g);
    uint32_t v[2];
    for (int e = 0; e < 2; e++) {
        int idx = 2 * pp + e; /* value within the item */
        v[e] = f32 ? lanef(g, raw->ax[j], idx)
                   : op1(g, s->xdt == KILN_DTYPE_F16 ? KILN_KOP_H2F : KILN_KOP_B2F, KILN_KT_F32,
                         op1(g, KILN_KOP_LANE, KILN_KT_U32, raw->ax[j], pp), e);
        if (P->ascale[j] != KILN_IDX_NONE) v[e] = mul(g, v[e], P->ascale[j]);
        if (raw->anw[j][0] != KILN_IDX_NONE) v[e] = mul(g, v[e], lanef(g, raw->anw[j][idx / 4], idx % 4));
    }
    kl_split_pair(g->k, v[0], v[1], g->parts, g->bf, word);
}

/* The 16 f32 values of a loaded block-weight chunk (index bc) at sub-step sub (gemv's decoder,
 * scale and min applied). */
void kl_gm_chunk_values(gm *g, const gv_chunk *ch, uint32_t bc, int sub, uint32_t val[16])
{
    gv_sub d;
    kl_gv_decode(g->s, g->wt, ch, bc, sub, &d);
    for (int i = 0; i < 16; i++) {
        uint32_t x = d.q[i];
        if (d.a != KILN_IDX_NONE) x = d.b != KILN_IDX_NONE ? kiln_kir_op(g->k, KILN_KOP_FMA, KILN_KT_F32, d.a, x, d.b, 0) : mul(g, d.a, x);
        val[i] = x;
    }
}

/* The same for block-weight item j of a staged tile. */
static void w_block_values(gm *g, const gm_raw *raw, int j, int sub, uint32_t val[16]) { kl_gm_chunk_values(g, &raw->b[j], raw->bc[j], sub, val); }

static void gm_store(gm *g, const gv_group *G, const gm_plan *P, const gm_raw *raw, int sub)
{
    int V = x_is_f32(g) ? 4 : 8;
    bool raw_words = x_raw_words(g);
    for (int j = 0; j < x_items(g); j++)
        for (int pp = 0; pp < V / 2; pp++) { /* pair pp: lane + pp of the fragment (see slot_of) */
            uint32_t w = xori(g, P->aw[j], 4 * pp);
            if (g->xp) { /* normalized and split by the rms kernel */
                for (int q = 0; q < g->parts; q++) sts(g, addi(g, w, q * g->apart), op1(g, KILN_KOP_LANE, KILN_KT_U32, raw->axp[j][q], pp));
                continue;
            }
            if (raw_words) { /* x is already in the mma's element type */
                sts(g, w, op1(g, KILN_KOP_LANE, KILN_KT_U32, raw->ax[j], pp));
                continue;
            }
            uint32_t word[3];
            x_pair_words(g, P, raw, j, pp, word);
            for (int q = 0; q < g->parts; q++) sts(g, addi(g, w, q * g->apart), word[q]);
        }
    for (int j = 0; j < w_items(g, G); j++) {
        if (g->wt == KILN_DTYPE_F32) { /* two pairs, each as hi and lo f16 words; pair l of the piece: lane + l */
            for (int l = 0; l < 2; l++) {
                uint32_t word[2], w = xori(g, P->bw[j], 4 * l);
                kl_split_pair(g->k, lanef(g, raw->b32[j], 2 * l), lanef(g, raw->b32[j], 2 * l + 1), 2, false, word);
                for (int q = 0; q < 2; q++) sts(g, q ? addi(g, w, GM_BWORDS) : w, word[q]);
            }
            continue;
        }
        if (is_float_w(g->wt)) { /* the weight's own words; pair l of the piece: lane + l */
            for (int l = 0; l < 4; l++) sts(g, xori(g, P->bw[j], 4 * l), op1(g, KILN_KOP_LANE, KILN_KT_U32, raw->b[j].v[0], l));
            continue;
        }
        uint32_t val[16];
        w_block_values(g, raw, j, sub, val);
        for (int pp = 0; pp < 8; pp++) { /* pair pp of the piece: lane + (pp & 3), word j + (pp >> 2) (j even) */
            uint32_t word;
            kl_split_pair(g->k, val[2 * pp], val[2 * pp + 1], 1, g->bf, &word);
            sts(g, xori(g, P->bw[j], 4 * (pp & 3) + (pp >> 2)), word);
        }
    }
}

/* The warp's bm / 32 x 4 tiles over the staged 32 k (two k16 steps). */
static void gm_mma(gm *g, const gm_plan *P, uint32_t acc[GM_MT][4])
{
    kiln_kir *k = g->k;
    for (int ks = 0; ks < 2; ks++) {
        uint32_t bf[2][2];
        for (int wq = 0; wq < g->wparts; wq++)
            for (int n2 = 0; n2 < 2; n2++) /* block n-tile pair 2 wn + n2 */
                bf[wq][n2] = op1(g, KILN_KOP_LDS4, KILN_KT_V4, addi(g, P->fb, 128 * (2 * n2 + ks) + wq * GM_BWORDS), (int32_t)g->sh);
        for (int q = 0; q < g->parts; q++)
            for (int mt = 0; mt < g->bm / 32; mt++) { /* block m-tile (bm / 32) wm + mt */
                uint32_t af = op1(g, KILN_KOP_LDS4, KILN_KT_V4, addi(g, P->fa, q * g->apart + 128 * (2 * mt + ks)), (int32_t)g->sh);
                for (int wq = 0; wq < g->wparts && q + wq < 2; wq++) /* f32 weights: x.hi w.hi, x.hi w.lo, x.lo w.hi */
                    for (int nt = 0; nt < 4; nt++) {
                        uint32_t d = kiln_kir_op(k, KILN_KOP_MMA, KILN_KT_F4, af, bf[wq][nt / 2], acc[mt][nt], (g->bf ? 1 : 0) | ((nt & 1) << 1));
                        kiln_kset(k, acc[mt][nt], d);
                    }
            }
    }
}

/* ------------------------------------------------------------------ epilogue */

/* Runs gemv's per-element epilogue over the C tile in shared memory (its rows 0 .. rows - 1 are
 * block rows r0 .., GM_CS words a row), every thread a unit at a time; barriers on both sides are
 * the caller's. */
void kl_gm_drain(gm *g, const gv_group *G, int r0, int rows)
{
    gv *s = g->s;
    kiln_kir *k = g->k;
    int upb = g->bn / 4; /* units per block: 4 slots each */
    /* every block's columns exist: no guard; or a unit's columns exist together (its first does:
       pairs and neox partners lie in one head, a head inside the n columns): one guard a unit */
    bool whole = G->n % g->bns == 0, by_unit = !whole && G->n % G->cols == 0 && G->n % (G->rope ? G->hd : 1) == 0;
    uint32_t it = kiln_kvar(k, g->tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, it, ci(g, rows * upb), ci(g, g->threads), 0);
    uint32_t row = o2(g, KILN_KOP_DIV, it, ci(g, upb)), u = o2(g, KILN_KOP_REM, it, ci(g, upb));
    gv_unit unit = {.mc = 1}, *e = &unit; /* the epilogue's input: this template's own, not gemv's */
    e->t0 = add(g, g->m0, addi(g, row, r0));
    if ((e->n_st = g->st.n_st)) {
        e->st_arr = g->st.st_arr, e->st_row = addi(g, row, r0);
        memcpy(e->st_node, g->st.st_node, sizeof e->st_node), memcpy(e->st_kind, g->st.st_kind, sizeof e->st_kind);
        memcpy(e->st_off, g->st.st_off, sizeof e->st_off);
    }
    int deltas[SLOTS];
    uint32_t base = kl_gv_unit_base(s, G, u, deltas);
    e->n_slots = 0;
    for (int q = 0; q < G->n_sib; q++)
        for (int c = 0; c < G->cols; c++) {
            int r = e->n_slots++;
            e->slot_sib[r] = G->sib[q];
            e->slot_delta[r] = c;
            uint32_t lc = kl_gv_partial(G) ? kl_gv_slot_col(s, G, base, deltas, c) : addi(g, base, deltas[c]);
            e->col[r] = add(g, g->n0, lc);
            e->ok[r] = whole || by_unit ? KILN_IDX_NONE : o2(g, KILN_KOP_LT, e->col[r], ci(g, (int32_t)G->n));
            uint32_t cidx = add(g, muli(g, row, g->cs), addi(g, lc, q * g->bns));
            e->acc[r][0] = kiln_kir_op(k, KILN_KOP_LDS, KILN_KT_F32, cidx, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)g->sh);
        }
    if (by_unit) kif(g, o2(g, KILN_KOP_LT, add(g, g->n0, base), ci(g, (int32_t)G->n)));
    kl_gv_epilogue(s, G, e, g->m);
    if (by_unit) kendif(g);
    kl_loop_end(k);
}

static void gm_epilogue(gm *g, const gv_group *G, uint32_t acc[GM_MT][4])
{
    uint32_t gq = shri(g, g->lane, 2), qq = andi(g, g->lane, 3);
    int hpw = g->bm / 64; /* 32-row passes per warp row */
    for (int h = 0; h < g->bm / 32; h++) { /* pass h: block rows 32 h .. 32 h + 31, m-tiles 2 (h % hpw) + 0, 1 of warp row h / hpw */
        kif(g, o2(g, KILN_KOP_EQ, g->wm, ci(g, h / hpw)));
        for (int mt = 0; mt < 2; mt++)
            for (int nt = 0; nt < 4; nt++)
                for (int j = 0; j < 4; j++) {
                    uint32_t row = addi(g, gq, mt * 16 + 8 * (j >> 1));
                    uint32_t col = add(g, muli(g, g->wn, 32), addi(g, muli(g, qq, 2), nt * 8 + (j & 1)));
                    sts(g, add(g, muli(g, row, g->cs), col), op1(g, KILN_KOP_LANE, KILN_KT_F32, acc[2 * (h % hpw) + mt][nt], j));
                }
        kendif(g);
        barrier(g);
        kl_gm_drain(g, G, 32 * h, 32);
        barrier(g);
    }
}

/* split_kernel for f32 x: a thread loads four values at once and stores two words a part (the
 * pair-a-thread loop moved 12 MB in 7.7 us on the H100 for llama-7b's 512 x 4096 attention output,
 * 12.7 us for 512 x 11008). */
static void split_quads(gv *s, kiln_kir *k, const gm *G, uint32_t xs, uint32_t scr)
{
    int64_t K = s->K;
    uint32_t n = kiln_k2(k, KILN_KOP_DIV, kl_numel_from(k, &s->g->nodes[s->x], 0), kiln_ki(k, 4)); /* quads */
    k->grid[0] = kl_grid_for(s->tgt, s->m_max * K / 4, 256);
    uint32_t e = kl_grid_loop(k, n);
    uint32_t v4 = kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4, kiln_kmuli(k, e, 4), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)xs);
    uint32_t v[4];
    for (int c = 0; c < 4; c++) v[c] = kl_lanef(k, v4, c);
    uint32_t row = kiln_k2(k, KILN_KOP_DIV, e, kiln_ki(k, (int32_t)(K / 4))), col = kiln_k2(k, KILN_KOP_REM, e, kiln_ki(k, (int32_t)(K / 4)));
    uint32_t at0 = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, (int32_t)(K / 2)), kiln_kmuli(k, col, 2)); /* word of the first pair */
    for (int p = 0; p < 2; p++) {
        uint32_t word[3];
        kl_split_pair(k, v[2 * p], v[2 * p + 1], G->parts, G->bf, word);
        for (int q = 0; q < G->parts; q++)
            kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, kiln_kaddi(k, at0, G->xp_word + q * G->xp_part + p), word[q], KILN_IDX_NONE, (int32_t)scr);
    }
    kl_loop_end(k);
}

/* x split into the GEMM's parts in the scratch (no norm: scale 1), for the TMA to read. */
static void split_kernel(gv *s, kiln_kir *k, const gm *G)
{
    const kiln_graph *g = s->g;
    kiln_kir_init(k, "kiln_gemm_split", 256);
    snprintf(k->what, sizeof k->what, "x in %d %s parts for a gemm", G->parts, G->bf ? "bf16" : "f16");
    int64_t K = s->K;
    k->scratch_bytes = 4 * ((uint64_t)G->xp_word + (uint64_t)G->parts * (uint64_t)G->xp_part);
    uint32_t xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false), scr = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, true);
    if (s->xdt == KILN_DTYPE_F32 && K % 4 == 0 && kl_tma_aligned(g, s->x)) { /* 16-byte loads: four values, two pairs a thread */
        split_quads(s, k, G, xs, scr);
        return;
    }
    uint32_t n = kiln_k2(k, KILN_KOP_DIV, kl_numel_from(k, &g->nodes[s->x], 0), kiln_ki(k, 2)); /* pairs */
    k->grid[0] = kl_grid_for(s->tgt, s->m_max * K / 2, 256); /* kl_grid_loop strides by this grid: not a grid_stride kernel
                                                                 (a launcher running fewer blocks would skip pairs) */
    uint32_t e = kl_grid_loop(k, n);
    uint32_t v[2], word[3];
    for (int h = 0; h < 2; h++) v[h] = kl_load(k, xs, s->xdt, kiln_kaddi(k, kiln_kmuli(k, e, 2), h));
    kl_split_pair(k, v[0], v[1], G->parts, G->bf, word);
    uint32_t row = kiln_k2(k, KILN_KOP_DIV, e, kiln_ki(k, (int32_t)(K / 2))), col = kiln_k2(k, KILN_KOP_REM, e, kiln_ki(k, (int32_t)(K / 2)));
    for (int q = 0; q < G->parts; q++) {
        uint32_t at = kiln_kaddi(k, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, (int32_t)(K / 2)), col), G->xp_word + q * G->xp_part);
        kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, at, word[q], KILN_IDX_NONE, (int32_t)scr);
    }
    kl_loop_end(k);
}

/* ------------------------------------------------------------------ kernels */

static void gm_group(gm *g, const gv_group *G, uint32_t nb)
{
    gv *s = g->s;
    kiln_kir *k = g->k;
    g->wt = wdtype(s, G->sib[0]);
    g->bf = g->wt == KILN_DTYPE_BF16;
    bool x_exact = s->norm == KILN_IDX_NONE && s->xdt == (g->bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F16);
    if (!g->wg) g->parts = kl_gm_x_parts(s, g->wt, x_exact); /* with xp: what kl_gm_prepare found for every group; wg: kl_gw_choose's */
    g->wparts = g->wt == KILN_DTYPE_F32 ? 2 : 1;
    g->bns = g->bn / G->n_sib;
    g->U = kl_wfmt_of(g->wt)->subs;
    g->n0 = muli(g, nb, g->bns);
    if (g->wg) {
        kl_gw_group(g, G);
        return;
    }
    uint32_t zero = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_F4, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t acc[GM_MT][4];
    for (int mt = 0; mt < g->bm / 32; mt++)
        for (int nt = 0; nt < 4; nt++) acc[mt][nt] = kiln_kvar(k, zero);
    int64_t K = s->K;
    gm_plan P;
    gm_raw raw;
    memset(&P, 0, sizeof P);
    memset(&raw, 0, sizeof raw);
    gm_plan_make(g, G, &P);
    gm_load(g, G, &P, &raw, ci(g, 0));
    gm_store(g, G, &P, &raw, 0);
    barrier(g);
    uint32_t kk = kiln_kvar(k, ci(g, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kk, ci(g, (int32_t)K), ci(g, GM_BK * g->U), 0);
    for (int u = 0; u < g->U; u++) {
        /* the next tile (past the end: the last one again, loaded and discarded) */
        uint32_t kn = o2(g, KILN_KOP_MIN, addi(g, kk, GM_BK * (u + 1)), ci(g, (int32_t)(K - GM_BK)));
        gm_load(g, G, &P, &raw, kn);
        gm_mma(g, &P, acc);
        barrier(g);
        gm_store(g, G, &P, &raw, (u + 1) % g->U);
        barrier(g);
    }
    kl_loop_end(k);
    gm_epilogue(g, G, acc);
}

/* Row t of x, for the norm's scaled passes (kl_row.at). */
typedef struct rms_row {
    gv       *s;
    kiln_kir *k;
    uint32_t  xs, t; /* x's slot, I32 row */
} rms_row;

static uint32_t rms_x_at(void *p, uint32_t j)
{
    rms_row *r = p;
    return kl_load(r->k, r->xs, r->s->xdt, kiln_k2(r->k, KILN_KOP_ADD, kiln_k2(r->k, KILN_KOP_MUL, r->t, kiln_ki(r->k, (int32_t)r->s->K)), j));
}

/* The norm itself where the region outputs it (row t, scale sc). */
static void rms_norm_out(gv *s, kiln_kir *k, uint32_t xs, uint32_t nws, uint32_t tid, uint32_t t, uint32_t sc)
{
    const kiln_graph *g = s->g;
    int64_t K = s->K;
    if (!kiln_region_is_out(s->r, s->norm)) return;
    uint32_t e = kiln_kvar(k, tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, e, kiln_ki(k, (int32_t)K), kiln_ki(k, GM_THREADS), 0);
    uint32_t idx = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)K)), e);
    uint32_t y = kiln_k2(k, KILN_KOP_MUL, kl_load(k, xs, s->xdt, idx), sc);
    if (nws != KILN_IDX_NONE) y = kiln_k2(k, KILN_KOP_MUL, y, kl_load(k, nws, KILN_DTYPE_F32, e));
    kl_store_node(k, g, s->norm, idx, y);
    kl_loop_end(k);
}

/* rms_kernel's row t when x is f32, 16-byte aligned, K a multiple of 1024 up to 8192 and x is
 * prepared (xp): each thread loads its K / 256 values at once (16-byte loads, none waiting on
 * another), squares them, and normalizes, splits and stores them from registers, so x is read
 * once. The scalar loop it replaces waited on each load (H100, llama-7b 512 x 4096 rows: 13 us,
 * 650 GB/s). Returns the row's scale. */
static uint32_t rms_row_vec(gv *s, kiln_kir *k, const gm *G, uint32_t xs, uint32_t nws, uint32_t scr, uint32_t tid, uint32_t t, kl_row *row)
{
    int64_t K = s->K;
    int nv = (int)(K / (4 * GM_THREADS));
    uint32_t v4[8], ss = kiln_kf(k, 0);
    uint32_t rowword = kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)K)), c4 = kiln_kmuli(k, tid, 4);
    for (int i = 0; i < nv; i++)
        v4[i] = kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4, kiln_k2(k, KILN_KOP_ADD, rowword, kiln_kaddi(k, c4, 4 * GM_THREADS * i)), KILN_IDX_NONE,
                            KILN_IDX_NONE, (int32_t)xs);
    uint32_t v[8][4];
    for (int i = 0; i < nv; i++)
        for (int c = 0; c < 4; c++) {
            v[i][c] = kl_lanef(k, v4[i], c);
            ss = kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, v[i][c], v[i][c], ss, 0);
        }
    uint32_t tot = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, ss, KILN_IDX_NONE, KILN_IDX_NONE, (KILN_KRED_SUM << 16) | GM_THREADS);
    uint32_t qv = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_DIV, tot, kiln_kf(k, (float)K)), kiln_kf(k, s->eps));
    uint32_t sc = kl_rms_scale(k, row, qv, s->eps); /* f32 squares redone scaled when they over/underflowed */
    kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(k, KILN_KOP_EQ, tid, kiln_ki(k, 0)), KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kl_store(k, scr, KILN_DTYPE_F32, t, sc);
    kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    for (int i = 0; i < nv; i++) {
        uint32_t col0 = kiln_kaddi(k, c4, 4 * GM_THREADS * i);
        uint32_t w4 = nws != KILN_IDX_NONE ? kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4, col0, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)nws) : KILN_IDX_NONE;
        uint32_t y[4];
        for (int c = 0; c < 4; c++) {
            y[c] = kiln_k2(k, KILN_KOP_MUL, v[i][c], sc);
            if (w4 != KILN_IDX_NONE)
                y[c] = kiln_k2(k, KILN_KOP_MUL, y[c], kl_lanef(k, w4, c));
        }
        for (int p = 0; p < 2; p++) {
            uint32_t word[3];
            kl_split_pair(k, y[2 * p], y[2 * p + 1], G->parts, G->bf, word);
            uint32_t e = kiln_kaddi(k, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)(K / 2))), kiln_k2(k, KILN_KOP_SHR, col0, kiln_ki(k, 1))), p);
            for (int q = 0; q < G->parts; q++)
                kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, kiln_kaddi(k, e, G->xp_word + q * G->xp_part), word[q], KILN_IDX_NONE, (int32_t)scr);
        }
    }
    return sc;
}

/* Whether rms_row_vec can take x (its conditions above; the norm weight, when there is one, f32). */
static bool rms_vec_fits(const gv *s, const gm *G)
{
    const kiln_graph *g = s->g;
    return G->xp && s->xdt == KILN_DTYPE_F32 && s->K % (4 * GM_THREADS) == 0 && s->K <= 8 * 4 * GM_THREADS && kl_tma_aligned(g, s->x) &&
           (s->nw == KILN_IDX_NONE || (g->nodes[s->nw].dtype == KILN_DTYPE_F32 && kl_tma_aligned(g, s->nw)));
}

/* The rms_norm of x's rows for the GEMM: with xp (kl_gm_prepare), x normalized and split into the
 * GEMM's parts in its element type, written to the scratch once (each column block of the GEMM
 * then stages raw words instead of loading x, the norm weight and the scale and converting);
 * else only the row scales. */
static void rms_kernel(gv *s, kiln_kir *k, const gm *G)
{
    const kiln_graph *g = s->g;
    kiln_kir_init(k, "kiln_gemm_rms", GM_THREADS);
    snprintf(k->what, sizeof k->what, G->xp ? "rms_norm of x, in %d %s parts, for a gemm" : "rms_norm scales for a gemm", G->parts,
             G->bf ? "bf16" : "f16");
    int64_t K = s->K;
    k->grid[0] = kl_grid_for(s->tgt, s->m_max, 1);
    k->scratch_bytes = G->xp ? 4 * ((uint64_t)G->xp_word + (uint64_t)G->parts * (uint64_t)G->xp_part) : 4 * (uint64_t)s->m_max;
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bid = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t m = kiln_k2(k, KILN_KOP_DIV, kl_numel_from(k, &g->nodes[s->x], 0), kiln_ki(k, (int32_t)K));
    uint32_t xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    uint32_t nws = s->nw != KILN_IDX_NONE ? kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false) : KILN_IDX_NONE;
    uint32_t scr = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, true);
    uint32_t t = kiln_kvar(k, bid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, t, m, kiln_ki(k, (int32_t)k->grid[0]), 0);
    rms_row xr = {s, k, xs, t};
    kl_row row = {.at = rms_x_at, .ctx = &xr, .tid = tid, .n = kiln_ki(k, (int32_t)K), .nf = kiln_kf(k, (float)K), .step = GM_THREADS};
    if (rms_vec_fits(s, G)) {
        rms_norm_out(s, k, xs, nws, tid, t, rms_row_vec(s, k, G, xs, nws, scr, tid, t, &row));
        kl_loop_end(k);
        return;
    }
    uint32_t ss = kiln_kvar(k, kiln_kf(k, 0));
    uint32_t j = kiln_kvar(k, tid);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, kiln_ki(k, (int32_t)K), kiln_ki(k, GM_THREADS), 0);
    uint32_t xv = kl_load(k, xs, s->xdt, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)K)), j));
    kiln_kset(k, ss, kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, xv, xv, ss, 0));
    kl_loop_end(k);
    uint32_t tot = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, ss, KILN_IDX_NONE, KILN_IDX_NONE, (KILN_KRED_SUM << 16) | GM_THREADS);
    uint32_t qv = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_DIV, tot, kiln_kf(k, (float)K)), kiln_kf(k, s->eps));
    uint32_t sc = kl_rms_scale(k, &row, qv, s->eps); /* f32 squares redone scaled when they over/underflowed */
    kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(k, KILN_KOP_EQ, tid, kiln_ki(k, 0)), KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kl_store(k, scr, KILN_DTYPE_F32, t, sc);
    kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    if (G->xp) { /* a thread per pair of values: one word per part, split as the GEMM's staging splits */
        uint32_t e = kiln_kvar(k, tid);
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, e, kiln_ki(k, (int32_t)(K / 2)), kiln_ki(k, GM_THREADS), 0);
        uint32_t v[2], word[3];
        for (int h = 0; h < 2; h++) {
            uint32_t col = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, e, kiln_ki(k, 2)), kiln_ki(k, h));
            v[h] = kiln_k2(k, KILN_KOP_MUL, kl_load(k, xs, s->xdt, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)K)), col)), sc);
            if (nws != KILN_IDX_NONE) v[h] = kiln_k2(k, KILN_KOP_MUL, v[h], kl_load(k, nws, KILN_DTYPE_F32, col));
        }
        kl_split_pair(k, v[0], v[1], G->parts, G->bf, word);
        for (int q = 0; q < G->parts; q++) {
            uint32_t w = word[q];
            uint32_t at = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, G->xp_word + q * G->xp_part), kiln_k2(k, KILN_KOP_MUL, t, kiln_ki(k, (int32_t)(K / 2)))), e);
            kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, at, w, KILN_IDX_NONE, (int32_t)scr);
        }
        kl_loop_end(k);
    }
    rms_norm_out(s, k, xs, nws, tid, t, sc);
    kl_loop_end(k);
}

/* Whether the rms kernel prepares x for every group (G->xp): a norm leads and every group takes x
 * in the same element type and number of parts; sets G->bf, G->parts and the scratch layout. */
void kl_gm_prepare(gm *G)
{
    gv *s = G->s;
    G->xp = false;
    if (s->norm == KILN_IDX_NONE || s->m_max * s->K / 2 >= ((int64_t)1 << 29) / 3) return;
    for (int q = 0; q < s->n_grp; q++) {
        kiln_dtype t = wdtype(s, s->grp[q].sib[0]);
        bool bf = t == KILN_DTYPE_BF16;
        int parts = kl_gm_x_parts(s, t, false); /* x_exact is false behind a norm */
        if (q && (bf != G->bf || parts != G->parts)) return;
        G->bf = bf, G->parts = parts;
    }
    G->xp = true;
    G->xp_word = (int32_t)((s->m_max + 3) / 4 * 4); /* after the row scales, 16-byte aligned */
    G->xp_part = (int32_t)(s->m_max * s->K / 2);
}

/* Can the GEMM take this region? (Else gemv runs it.) */
static bool gm_fits(const gv *s, char *err, size_t n_err)
{
    if (s->K % GM_BK || s->scalar) return kl_unsupported(err, n_err, "gemm: K = %lld", (long long)s->K), false;
    if (s->K > (int64_t)1 << 24 || s->m_max > (int64_t)1 << 20) return kl_unsupported(err, n_err, "gemm: too large"), false;
    for (int q = 0; q < s->n_grp; q++) {
        const gv_group *G = &s->grp[q];
        kiln_dtype t = wdtype(s, G->sib[0]);
        const kl_wfmt *f = kl_wfmt_of(t); /* gemv's analysis refused dtypes without a row */
        if (f->block && !f->gemm_chunk) return kl_unsupported(err, n_err, "gemm: %s weights", kiln_dtype_name(t)), false;
        if (G->n_sib > 2) return kl_unsupported(err, n_err, "gemm: %d fused siblings", G->n_sib), false;
        if (G->rope == 2 && (GM_BN / G->n_sib) % G->hd) return kl_unsupported(err, n_err, "gemm: neox rope head %lld", (long long)G->hd), false;
        if (G->n * (int64_t)s->K >= (int64_t)1 << 31) return kl_unsupported(err, n_err, "gemm: weight too large"), false;
    }
    return true;
}

kiln_status kiln_lower_gemm(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir out[KILN_LOWER_MAX], uint32_t *n_out, char *err, size_t n_err)
{
    return kiln_lower_gemm_cap(g, r, tg, out, n_out, 0, err, n_err);
}

/* The shared analysis for the GEMM (gemv's, then the GEMM's own limits) into a fresh gv, or NULL
 * (*st: KILN_ERR_NOMEM or KILN_ERR_UNSUPPORTED with err). */
static gv *gm_analyze(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, int64_t m_cap, kiln_status *st, char *err,
                      size_t n_err)
{
    gv *s = calloc(1, sizeof *s);
    if (!s) return *st = KILN_ERR_NOMEM, NULL;
    s->g = g;
    s->r = r;
    s->tgt = tg;
    s->m_cap = m_cap;
    kiln_kir scratch_k; /* gemv's analysis writes its grid into a kernel */
    kiln_kir_init(&scratch_k, "kiln_gemm", GM_THREADS);
    s->k = &scratch_k;
    bool ok = kl_gv_analyze(s, err, n_err) && gm_fits(s, err, n_err);
    if (ok && s->m_max <= 8) {
        kl_unsupported(err, n_err, "gemm: %lld rows (gemv takes up to 8 per pass)", (long long)s->m_max);
        ok = false;
    }
    kiln_kir_free(&scratch_k);
    if (!ok) free(s), s = NULL, *st = KILN_ERR_UNSUPPORTED;
    return s;
}

/* The GEMM kernel k's tile: the mma.sync template's rows a block and shared memory, or the Hopper
 * template's shape, cluster and persistent form (lower_gemm_wg.c). */
static void gm_shape(gm *G, kiln_kir *k, const kiln_lower_target *tg)
{
    gv *s = G->s;
    if (G->wg) {
        kl_gw_shape(G, tg);
        G->cs = G->bn + 4;
        /* wide: its setmaxnreg takes effect only where the entry's register count is known (one
           block an SM); without it the H100's JIT kept 168 a thread and spilled the accumulators */
        if (G->nreg_c) k->min_blocks = 1;
        kl_gw_cluster(G, tg);
        if (kl_gw_persist(G, tg)) k->min_blocks = 1; /* its setmaxnreg, as wide's */
        return;
    }
    int parts_max = 1, wparts_max = 1;
    bool all_blocks = true;
    for (int q = 0; q < s->n_grp; q++) {
        kiln_dtype t = wdtype(s, s->grp[q].sib[0]);
        if (kl_gm_x_parts(s, t, false) > parts_max) parts_max = kl_gm_x_parts(s, t, false);
        if (t == KILN_DTYPE_F32) wparts_max = 2;
        if (kiln_dtype_block(t) == 1) all_blocks = false;
    }
    /* 128 tokens per block halves the dequantization per token of block weights (H100, 512-token
     * llama-7b layer: q4_k QKV 503 -> 474 us, gate/up 1173 -> 947 us), but costs float weights
     * occupancy (f16 QKV 499 -> 584 us) and leaves too few blocks for narrow outputs (down,
     * 4096 columns: 128 blocks, 373 -> 485 us). So: block weights only, and only with at least
     * two blocks per SM (264 on a 132-SM H100); never for x in three parts (the A tile would pass
     * lavapipe's 32 KB of shared memory). */
    int64_t col_blocks = kl_gw_col_blocks(s, GM_BN);
    G->bm = all_blocks && parts_max <= 2 && col_blocks * ((s->m_max + 127) / 128) >= 2 * (int64_t)tg->sm_count && kl_gemm_rows(tg) == 128 ? 128 : 64;
    G->apart = G->bm * 16;
    uint32_t words = (uint32_t)(parts_max * G->apart + wparts_max * GM_BWORDS);
    if (words < 32 * GM_CS) words = 32 * GM_CS;
    G->sh = kiln_kir_shared(k, words);
    k->min_blocks = 2; /* 16 warps per SM: at 130 registers ptxas left one block (8 warps), and gate/up ran at 2/3 the rate of QKV */
}

/* x's buffer (the node, or the scratch the rms/split kernel prepared), the norm's scratch and
 * weight, the splits' partial sums: kernel k's buffers and scratch bytes. */
static kiln_status gm_buffers(gm *G, kiln_kir *k, char *err, size_t n_err)
{
    gv *s = G->s;
    if (G->xp) {
        G->xs = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, false);
        k->scratch_bytes = 4 * ((uint64_t)G->xp_word + (uint64_t)G->parts * (uint64_t)G->xp_part);
    } else {
        G->xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    }
    if (s->norm != KILN_IDX_NONE && !G->xp) {
        G->scr = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, false);
        if (s->nw != KILN_IDX_NONE) G->nws = kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false);
        k->scratch_bytes = 4 * (uint64_t)s->m_max;
    }
    if (!G->pp || G->ks == 1) return KILN_OK;
    G->part_word = (int32_t)((k->scratch_bytes / 4 + 3) / 4 * 4); /* the splits' partial sums after what the scratch holds */
    uint64_t words = (uint64_t)G->part_word + (uint64_t)G->ks * (uint64_t)G->rt_max * (uint64_t)kl_gw_col_blocks(s, G->bn) * (uint64_t)(G->rc * G->bn);
    k->scratch_bytes = 4 * words;
    return words >= (uint64_t)1 << 30 ? kl_unsupported(err, n_err, "gemm: %llu words of partial sums", (unsigned long long)words) : KILN_OK;
}

/* The block's work: the persistent tile loop, or the group whose column blocks hold bx (I32).
 * Returns the column blocks of the grid. */
static uint32_t gm_body(gm *G, uint32_t by, uint32_t bx)
{
    gv *s = G->s;
    uint32_t blocks = 0;
    /* a cluster works whole (its blocks bring each other's weight slices) when its first block has rows */
    kif(G, o2(G, KILN_KOP_LT, G->cm > 1 ? muli(G, o2(G, KILN_KOP_SUB, by, G->crank), G->bm) : G->m0, G->m));
    if (G->pp) { /* every group's tiles in one persistent loop */
        G->wt = wdtype(s, s->grp[0].sib[0]);
        G->wparts = 1;
        G->U = kl_wfmt_of(G->wt)->subs;
        kl_gw_pp(G);
    }
    for (int q = 0; q < s->n_grp && !G->pp; q++) {
        const gv_group *Gq = &s->grp[q];
        uint32_t nb = (uint32_t)((Gq->n + G->bn / Gq->n_sib - 1) / (G->bn / Gq->n_sib));
        kif(G, o2(G, KILN_KOP_PAND, o2(G, KILN_KOP_LE, ci(G, (int32_t)blocks), bx), o2(G, KILN_KOP_LT, bx, ci(G, (int32_t)(blocks + nb)))));
        gm_group(G, Gq, addi(G, bx, -(int32_t)blocks));
        kendif(G);
        blocks += nb;
    }
    kendif(G);
    if (G->cm > 1) kl_gw_sync(G, KILN_KOP_CLUSTER_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0); /* no block leaves while others may arrive at its barriers */
    return blocks;
}

kiln_status kiln_lower_gemm_cap(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir out[KILN_LOWER_MAX], uint32_t *n_out,
                                int64_t m_cap, char *err, size_t n_err)
{
    *n_out = 0;
    kiln_status st = KILN_OK;
    gv *s = gm_analyze(g, r, tg, m_cap, &st, err, n_err);
    if (!s) return st;
    int ki = 0;
    gm G = {.s = s, .scr = KILN_IDX_NONE, .nws = KILN_IDX_NONE, .threads = GM_THREADS, .bn = GM_BN, .cs = GM_CS};
    bool pre = kl_gw_choose(&G, tg); /* the Hopper template, and whether a split kernel prepares x for it */
    if (!G.wg) kl_gm_prepare(&G);
    pre = pre || s->norm != KILN_IDX_NONE;
    kiln_kir *k = &out[pre ? 1 : 0];
    G.k = k;
    if (s->norm != KILN_IDX_NONE) rms_kernel(s, &out[ki++], &G);
    else if (pre) split_kernel(s, &out[ki++], &G);
    ki++;
    kiln_kir_init(k, G.wg ? "kiln_gemm_tma" : "kiln_gemm", (uint32_t)G.threads);
    s->k = k;
    gm_shape(&G, k, tg);
    k->cluster = G.cm > 1 ? (uint32_t)G.cm : 0;
    char form[64] = "";
    if (G.wg) /* the tile (rows x columns a block, or a consumer's with pp) and the persistent form */
        snprintf(form, sizeof form, ", %d x %d tiles%s%s", G.pp ? G.rc : G.bm, G.bn, G.pp ? ", persistent" : "",
                 G.pp && G.ks > 1 ? ", K in splits" : "");
    /* %.40s: form is at most 42 bytes, the bound keeps gcc -O1 (tsan) from reading
     * the 64-byte buffer as a possible truncation of the 96-byte what */
    snprintf(k->what, sizeof k->what, "gemm%s %s x%d%s, %u ops%.48s", G.wg ? " (tma + wgmma)" : "", kiln_dtype_name(wdtype(s, 0)), s->n_mm,
             s->norm != KILN_IDX_NONE ? " + rms_norm" : "", r->n_nodes, form);
    G.tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    /* x (fastest) walks the token blocks: the blocks in flight share a few column blocks, so each
     * weight tile comes from DRAM once and from L2 for the other token blocks (with the token
     * blocks outer, every token block read the whole weight again: 8x the bytes at 512 tokens) */
    uint32_t by = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bx = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 1);
    G.lane = andi(&G, G.tid, 31);
    uint32_t warp = shri(&G, G.tid, 5);
    G.wm = shri(&G, warp, 2);
    G.wn = andi(&G, warp, 3);
    G.m = o2(&G, KILN_KOP_DIV, kl_numel_from(k, &g->nodes[s->x], 0), ci(&G, (int32_t)s->K));
    G.m0 = G.pp ? ci(&G, 0) : muli(&G, by, G.bm); /* pp: each tile's (kl_gw_pp) */
    G.pb = by;
    G.cm = G.cm ? G.cm : 1;
    if (G.cm > 1) G.crank = o2(&G, KILN_KOP_REM, by, ci(&G, G.cm));
    st = gm_buffers(&G, k, err, n_err);
    if (G.wg) kl_gw_setup(&G, k);
    uint32_t blocks = gm_body(&G, by, bx);
    if (blocks > 65535) st = kl_unsupported(err, n_err, "gemm: %u column blocks (a grid's y is at most 65535)", blocks);
    k->grid[0] = (uint32_t)((s->m_max + G.bm - 1) / G.bm);
    k->grid[0] = (k->grid[0] + G.cm - 1) / G.cm * G.cm;
    k->grid[1] = blocks;
    if (G.pp) k->grid[0] = (uint32_t)G.grid, k->grid[1] = 1;
    if (G.pp && G.ks > 1 && st == KILN_OK) { /* the splits' sums and the epilogue */
        kiln_kir_init(&out[ki], "kiln_gemm_reduce", 128);
        out[ki].scratch_bytes = k->scratch_bytes;
        kl_gw_reduce(&G, &out[ki++]);
    }
    if (s->failed) st = kl_unsupported(err, n_err, "gemm: %s", s->why);
    if (st != KILN_OK) {
        for (int i = 0; i < ki; i++) kiln_kir_free(&out[i]);
    } else {
        *n_out = (uint32_t)ki;
    }
    free(s);
    return st;
}
