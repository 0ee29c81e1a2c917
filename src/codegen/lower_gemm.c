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
 * rope, KV writes). Must not know any target's syntax. */
#include "codegen/lower_mm.h"

#include <stdlib.h>
#include <string.h>

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
} gm;

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

static uint32_t ci(gm *g, int32_t v) { return kiln_ki(g->k, v); }
static uint32_t o2(gm *g, enum kiln_kop op, uint32_t a, uint32_t b) { return kiln_k2(g->k, op, a, b); }
static uint32_t add(gm *g, uint32_t a, uint32_t b) { return o2(g, KILN_KOP_ADD, a, b); }
static uint32_t mul(gm *g, uint32_t a, uint32_t b) { return o2(g, KILN_KOP_MUL, a, b); }
static uint32_t addi(gm *g, uint32_t a, int32_t b) { return b ? add(g, a, ci(g, b)) : a; }
static uint32_t muli(gm *g, uint32_t a, int32_t b) { return b == 1 ? a : mul(g, a, ci(g, b)); }
static uint32_t shri(gm *g, uint32_t a, int32_t b) { return o2(g, KILN_KOP_SHR, a, ci(g, b)); }
static uint32_t andi(gm *g, uint32_t a, int32_t b) { return o2(g, KILN_KOP_AND, a, ci(g, b)); }
static uint32_t op1(gm *g, enum kiln_kop op, enum kiln_kt t, uint32_t a, int32_t imm)
{
    return kiln_kir_op(g->k, op, t, a, KILN_IDX_NONE, KILN_IDX_NONE, imm);
}
static uint32_t ld4(gm *g, uint32_t slot, uint32_t word) { return op1(g, KILN_KOP_LD4, KILN_KT_V4, word, (int32_t)slot); }
static uint32_t lanef(gm *g, uint32_t v4, int i) { return kl_lanef(g->k, v4, i); }
static void sts(gm *g, uint32_t idx, uint32_t v) { kiln_kir_op(g->k, KILN_KOP_STS, KILN_KT_NONE, idx, v, KILN_IDX_NONE, (int32_t)g->sh); }
static void barrier(gm *g) { kiln_kir_op(g->k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void kif(gm *g, uint32_t p) { kiln_kir_op(g->k, KILN_KOP_IF, KILN_KT_NONE, p, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void kendif(gm *g) { kiln_kir_op(g->k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }

static kiln_dtype wdtype(const gv *s, int j) { return (kiln_dtype)s->g->nodes[s->g->nodes[s->mm[j]].src[1]].dtype; }
static bool is_float_w(kiln_dtype t) { return t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16; }
/* f16/bf16 weights: 2 items of 8 values a thread; f32: 4 items of 4 values (two f16 parts each);
 * block weights: one chunk per sibling. */
static int w_items(const gm *g, const gv_group *G) { return g->wt == KILN_DTYPE_F32 ? 4 : is_float_w(g->wt) ? 2 : G->n_sib; }
/* x parts for weights t (x is split so that its f32 value is kept, unless it is already exact or
 * the compile asks for f16 activations: codegen.precision). */
static int x_parts(const gv *s, kiln_dtype t, bool x_exact)
{
    if (kiln_dtype_block(t) > 1 || x_exact || s->tgt->opts.precision == KILN_PREC_F16) return 1;
    return t == KILN_DTYPE_BF16 ? 3 : 2;
}

/* ------------------------------------------------------------------ fragment-order layouts */

static uint32_t xori(gm *g, uint32_t a, int32_t b) { return b ? o2(g, KILN_KOP_XOR, a, ci(g, b)) : a; }

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
static void chunk_values(gm *g, const gv_chunk *ch, uint32_t bc, int sub, uint32_t val[16])
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
static void w_block_values(gm *g, const gm_raw *raw, int j, int sub, uint32_t val[16]) { chunk_values(g, &raw->b[j], raw->bc[j], sub, val); }

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
static void gm_drain(gm *g, const gv_group *G, int r0, int rows)
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
        gm_drain(g, G, 32 * h, 32);
        barrier(g);
    }
}

/* ------------------------------------------------------------------ Hopper: TMA + warpgroup MMA */

/* With wg (sm_90a, 16-bit weights): 384 threads, consumer warpgroups 0 and 1 and a producer
 * warpgroup 2, whose first thread has the TMA engine bring each 64-k stage (x's parts: bm rows of
 * 128 bytes each, then the weights: 128 rows) into a ring of `stages` buffers in dynamic shared
 * memory, 128-byte swizzled, signalling a `full` mbarrier per stage with the bytes landed. Consumer
 * warpgroup c owns rows c * rc .. c * rc + rc - 1 (rc = 64 or 128: one or two W64 accumulators,
 * wgmma m64n128k16 straight from the swizzled tiles) and releases a stage through its `empty`
 * mbarrier once the WGMMAs reading it have retired, one stage behind (wait_group 1). The epilogue
 * writes the accumulators into a C tile in the stage memory and runs gemv's per-element epilogue
 * with every thread. */
#define GW_BK 64           /* k per stage: 64 halves = 128 bytes, the swizzle's and the TMA box's width */
#define GW_THREADS 384     /* two consumer warpgroups and the producer */
#define GW_STAGE_MAX 231424 /* dynamic shared bytes for the ring (227 KB less 1 KB of mbarriers) */
#define GW_ROUND 2         /* block weights: stages a producer round decodes (4 chunks in flight a stage: 4 stages spilled) */

static uint32_t cu(gm *g, uint32_t v) { return kiln_ku(g->k, v); }
static void sts4(gm *g, uint32_t idx, uint32_t v4) { kiln_kir_op(g->k, KILN_KOP_STS4, KILN_KT_NONE, idx, v4, KILN_IDX_NONE, (int32_t)g->sh); }
static uint32_t addu(gm *g, uint32_t a, uint32_t b) { return o2(g, KILN_KOP_ADD, a, b); }
static uint32_t to_u(gm *g, uint32_t i32) { return kiln_kcvt(g->k, KILN_KT_U32, i32); }

/* Byte address of stage s (I32) of the ring, and of its full (which 0) / empty (1) mbarrier. */
static uint32_t gw_stage(gm *g, uint32_t s) { return addu(g, g->ring, to_u(g, muli(g, s, (int32_t)g->sb))); }
static uint32_t gw_bar(gm *g, int which, uint32_t s) { return addu(g, g->bars, to_u(g, muli(g, addi(g, s, which * g->stages), 8))); }

static void gw_sync(gm *g, enum kiln_kop op, uint32_t a, uint32_t b, int32_t imm)
{
    kiln_kir_op(g->k, op, KILN_KT_NONE, a, b, KILN_IDX_NONE, imm);
}

/* One TMA box of map m: {dst, mbarrier, k, row}; mask: KILN_IDX_NONE, or the U32 CTA mask of a
 * multicast into the cluster's blocks */
static void gw_tma(gm *g, uint32_t m, uint32_t dst, uint32_t bar, uint32_t kcoord, uint32_t row, uint32_t mask)
{
    kiln_kir *k = g->k;
    uint32_t v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, KILN_IDX_NONE, dst, KILN_IDX_NONE, 0);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, bar, KILN_IDX_NONE, 1);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, to_u(g, kcoord), KILN_IDX_NONE, 2);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, to_u(g, row), KILN_IDX_NONE, 3);
    kiln_kir_op(k, KILN_KOP_TMA_LOAD, KILN_KT_NONE, v, mask, KILN_IDX_NONE, (int32_t)m);
}

/* Stage kt's slot in the ring (I32) and the parity (*ph) of its round. */
static uint32_t gw_slot(gm *g, uint32_t kt, uint32_t *ph)
{
    *ph = andi(g, o2(g, KILN_KOP_DIV, kt, ci(g, g->stages)), 1);
    return o2(g, KILN_KOP_REM, kt, ci(g, g->stages));
}

/* x's boxes of stage kt (its parts, bm rows each) into slot s, landing on mbarrier full. */
static void gw_x_boxes(gm *g, uint32_t s, uint32_t full, uint32_t kt)
{
    for (int q = 0; q < g->parts; q++)
        gw_tma(g, g->xmap, addu(g, gw_stage(g, s), cu(g, (uint32_t)(q * g->bm * 128))), full, muli(g, kt, GW_BK),
               g->xp ? addi(g, g->m0, q * (int32_t)g->s->m_max) : g->m0, KILN_IDX_NONE);
}

/* The producer's one thread: for each stage, wait until the consumers released it, expect its
 * bytes and start its boxes. */
static void gw_producer(gm *g, const gv_group *G, const uint32_t wmap[2], int32_t nk)
{
    kiln_kir *k = g->k;
    uint32_t kt = kiln_kvar(k, ci(g, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kt, ci(g, nk), ci(g, 1), 0);
    uint32_t ph, s = gw_slot(g, kt, &ph);
    gw_sync(g, KILN_KOP_MBAR_WAIT, gw_bar(g, 1, s), o2(g, KILN_KOP_XOR, ph, ci(g, 1)), 0); /* a fresh barrier passes parity 1 */
    uint32_t full = gw_bar(g, 0, s), st = gw_stage(g, s), k0 = muli(g, kt, GW_BK);
    gw_sync(g, KILN_KOP_MBAR_ARRIVE, full, KILN_IDX_NONE, (int32_t)g->sb);
    gw_x_boxes(g, s, full, kt);
    if (g->cm > 1) { /* this block's slice of each weight tile, into every block of the cluster */
        int32_t sl = g->bns / g->cm;
        uint32_t mask = cu(g, (1u << g->cm) - 1), r0 = muli(g, g->crank, sl);
        for (int sp = 0; sp < G->n_sib; sp++) {
            uint32_t dst = addu(g, st, to_u(g, muli(g, addi(g, r0, g->parts * g->bm + sp * g->bns), 128)));
            gw_tma(g, wmap[sp], dst, full, k0, add(g, g->n0, r0), mask);
        }
    } else {
        for (int sp = 0; sp < G->n_sib; sp++)
            gw_tma(g, wmap[sp], addu(g, st, cu(g, (uint32_t)((g->parts * g->bm + sp * g->bns) * 128))), full, k0, g->n0, KILN_IDX_NONE);
    }
    kl_loop_end(k);
}

/* Block weights: the producer warpgroup's 128 threads decode each stage's weight tile (128 rows x
 * 64 k: 4 pieces of 16 values a thread) with gemv's decoders into f16 in the swizzled layout the
 * TMA would give, rounds of GW_ROUND stages whose chunk loads are all issued first; thread 256
 * also brings x by TMA. A stage's full mbarrier takes that thread's expect_tx and all 128 threads'
 * arrivals after their stores (and the proxy fence that shows them to WGMMA). */
static void gw_producer_blocks(gm *g, const gv_group *G, int32_t nk)
{
    kiln_kir *k = g->k;
    gv *s = g->s;
    uint32_t pt = addi(g, g->tid, -256), lead = o2(g, KILN_KOP_EQ, pt, ci(g, 0));
    uint32_t wrow[2], piece[2], rword[2], swz[2], slot[2];
    for (int j = 0; j < 2; j++) { /* item j: B rows 64 j .. 64 j + 63 (sibling j of two), 16 values at k 16 piece */
        uint32_t i = addi(g, pt, 128 * j), r = o2(g, KILN_KOP_OR, muli(g, shri(g, i, 4), 8), andi(g, i, 7));
        int sp = G->n_sib == 2 ? j : 0;
        piece[j] = andi(g, shri(g, i, 3), 1);
        wrow[j] = o2(g, KILN_KOP_MIN, add(g, g->n0, addi(g, r, -sp * g->bns)), ci(g, (int32_t)(G->n - 1)));
        rword[j] = muli(g, r, 32);
        swz[j] = andi(g, r, 7);
        slot[j] = kiln_kir_buf(k, KILN_KBUF_NODE, s->g->nodes[s->mm[G->sib[sp]]].src[1], false);
    }
    uint32_t kr = kiln_kvar(k, ci(g, 0));
    /* two accumulators leave registers for one stage of chunks in flight (two spilled), when the
     * format's k-period fits a stage */
    const int round = g->rc == 128 && g->U <= 2 ? 1 : GW_ROUND;
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kr, ci(g, nk), ci(g, round), 0);
    gv_chunk ch[2 * GW_ROUND][2];
    uint32_t bc[2 * GW_ROUND][2];
    for (int t = 0; t < 2 * round; t++) /* the round's tiles of 32 k: every load in flight before the first decode */
        for (int j = 0; j < 2; j++) {
            if (t % g->U) { /* the U tiles of a k-period are sub-steps of the same chunks: loaded once */
                ch[t][j] = ch[t - t % g->U][j], bc[t][j] = bc[t - t % g->U][j];
                continue;
            }
            bc[t][j] = kl_wfmt_of(g->wt)->gemm_chunk(k, addi(g, muli(g, kr, GW_BK), 32 * t), piece[j]);
            kl_gv_load_chunk(s, g->wt, slot[j], wrow[j], bc[t][j], G->n, &ch[t][j]);
        }
    for (int st = 0; st < round; st++) {
        uint32_t kt = addi(g, kr, st);
        uint32_t ph, sidx = gw_slot(g, kt, &ph);
        gw_sync(g, KILN_KOP_MBAR_WAIT, gw_bar(g, 1, sidx), o2(g, KILN_KOP_XOR, ph, ci(g, 1)), 0);
        uint32_t full = gw_bar(g, 0, sidx);
        kif(g, lead);
        gw_sync(g, KILN_KOP_MBAR_ARRIVE, full, KILN_IDX_NONE, g->parts * g->bm * 128);
        gw_x_boxes(g, sidx, full, kt);
        kendif(g);
        uint32_t bword = addi(g, muli(g, sidx, (int32_t)(g->sb / 4)), g->parts * g->bm * 32); /* the B tile, in words */
        for (int tt = 0; tt < 2; tt++) {
            int t = 2 * st + tt;
            for (int j = 0; j < 2; j++) {
                uint32_t val[16];
                chunk_values(g, &ch[t][j], bc[t][j], t % g->U, val);
                for (int c = 0; c < 2; c++) { /* 16-byte chunk 4 tt + 2 piece + c of the row, swizzled */
                    uint32_t v4 = KILN_IDX_NONE;
                    for (int pp = 0; pp < 4; pp++) {
                        uint32_t word;
                        kl_split_pair(k, val[8 * c + 2 * pp], val[8 * c + 2 * pp + 1], 1, false, &word);
                        v4 = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v4, word, KILN_IDX_NONE, pp);
                    }
                    uint32_t chunk = o2(g, KILN_KOP_XOR, addi(g, muli(g, piece[j], 2), 4 * tt + c), swz[j]);
                    sts4(g, add(g, add(g, bword, rword[j]), muli(g, chunk, 4)), v4);
                }
            }
        }
        gw_sync(g, KILN_KOP_FENCE_ASYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        gw_sync(g, KILN_KOP_MBAR_ARRIVE, full, KILN_IDX_NONE, 0);
    }
    kl_loop_end(k);
}

/* n-tiles of a consumer's accumulators (128 columns each, the last one 64 with bn 192) and the
 * accumulator of m-tile mt, n-tile nt (at most two in all: rc 128 x bn 128 or rc 64 x bn <= 256). */
static int gw_nn(const gm *g) { return (g->bn + 127) / 128; }
static int gw_ncols(const gm *g, int nt) { return g->bn - 128 * nt < 128 ? g->bn - 128 * nt : 128; }
static int gw_acc(const gm *g, int mt, int nt) { return mt * gw_nn(g) + nt; }

/* A consumer warpgroup: its accumulators += its rows of x . the weights, stage by stage. */
static void gw_consumer(gm *g, const uint32_t acc[2], int32_t nk)
{
    kiln_kir *k = g->k;
    uint32_t wg = shri(g, g->tid, 7);
    uint32_t arow = to_u(g, muli(g, wg, g->rc * 128)); /* byte offset of this warpgroup's rows in an A tile */
    int32_t flags = (1024 / 16) << 8 | 2 | (g->bf ? 1 : 0); /* SBO 1024 (8 rows of 128 bytes), swizzled */
    uint32_t kt = kiln_kvar(k, ci(g, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kt, ci(g, nk), ci(g, 1), 0);
    uint32_t ph, s = gw_slot(g, kt, &ph);
    gw_sync(g, KILN_KOP_MBAR_WAIT, gw_bar(g, 0, s), ph, 0);
    uint32_t st = gw_stage(g, s);
    gw_sync(g, KILN_KOP_WG_FENCE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    for (int q = 0; q < g->parts; q++)
        for (int ks = 0; ks < GW_BK / 16; ks++)
            for (int mt = 0; mt < g->rc / 64; mt++)
                for (int nt = 0; nt < gw_nn(g); nt++) { /* n-tile nt: B rows 128 nt .. (128 bytes a row) */
                    uint32_t a = addu(g, addu(g, st, arow), cu(g, (uint32_t)(q * g->bm * 128 + mt * 64 * 128 + ks * 32)));
                    uint32_t b = addu(g, st, cu(g, (uint32_t)((g->parts * g->bm + 128 * nt) * 128 + ks * 32)));
                    int n = gw_ncols(g, nt);
                    kiln_kir_op(k, KILN_KOP_WGMMA, KILN_KT_NONE, acc[gw_acc(g, mt, nt)], a, b, flags | (n < 128 ? (n / 16) << 4 : 0));
                }
    gw_sync(g, KILN_KOP_WG_COMMIT, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    gw_sync(g, KILN_KOP_WG_WAIT, KILN_IDX_NONE, KILN_IDX_NONE, 1); /* the previous stage's WGMMAs have retired */
    kif(g, o2(g, KILN_KOP_LT, ci(g, 0), kt));
    uint32_t empty = gw_bar(g, 1, o2(g, KILN_KOP_REM, addi(g, kt, g->stages - 1), ci(g, g->stages)));
    if (g->cm > 1) { /* every block of the cluster writes into this stage: each warp tells each of them */
        kif(g, o2(g, KILN_KOP_EQ, g->lane, ci(g, 0)));
        for (int r = 0; r < g->cm; r++) gw_sync(g, KILN_KOP_MBAR_ARRIVE_CL, empty, cu(g, (uint32_t)r), 0);
        kendif(g);
    } else {
        gw_sync(g, KILN_KOP_MBAR_ARRIVE, empty, KILN_IDX_NONE, 0);
    }
    kendif(g);
    kl_loop_end(k);
    gw_sync(g, KILN_KOP_WG_WAIT, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

/* The epilogue's per-token values (positions of the rope and KV writes, as f32 and i32) and rope
 * frequency tables of the region, staged in a shared array of their own so that the drain reads
 * them with shared loads: loaded from global memory inside its loop they left the QKV drain
 * latency-bound (a load or two in flight a warp, 16 iterations). Sets G->st; returns the words. */
static uint32_t gw_stage_plan(gm *G)
{
    gv *s = G->s;
    const kiln_graph *g = s->g;
    gv_unit *u = &G->st;
    uint32_t words = 0;
    u->n_st = 0;
    for (uint32_t i = 0; i < s->r->n_nodes; i++) {
        uint32_t id = s->r->nodes[i];
        const kiln_node_rec *n = &g->nodes[id];
        uint32_t node[2] = {KILN_IDX_NONE, KILN_IDX_NONE};
        int kind[2] = {0, 0};
        if (n->op == KILN_OP_ROPE) node[0] = n->src[1], kind[0] = 0, node[1] = id, kind[1] = 2;
        if (n->op == KILN_OP_KV_SCATTER) node[0] = n->src[2], kind[0] = 1;
        for (int j = 0; j < 2; j++) {
            if (node[j] == KILN_IDX_NONE) continue;
            bool seen = false;
            for (int q = 0; q < u->n_st; q++) seen = seen || (u->st_node[q] == node[j] && u->st_kind[q] == kind[j]);
            int32_t len = kind[j] == 2 ? (int32_t)(n->dims[n->rank - 1] / 2) : G->bm;
            if (seen || u->n_st == 4 || (kind[j] == 2 && (len < 1 || len > 256))) continue;
            u->st_node[u->n_st] = node[j], u->st_kind[u->n_st] = kind[j], u->st_off[u->n_st++] = (int32_t)words;
            words += (uint32_t)len;
        }
    }
    return words;
}

/* Each staged value into G->st's array (before the barrier that precedes the drain). */
static void gw_stage_values(gm *g)
{
    gv *s = g->s;
    const gv_unit *u = &g->st;
    for (int i = 0; i < u->n_st; i++) {
        const kiln_node_rec *n = &s->g->nodes[u->st_node[i]];
        if (u->st_kind[i] == 2) { /* the rope's frequencies: the table its epilogue reads */
            int32_t half = (int32_t)(n->dims[n->rank - 1] / 2);
            kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, half)));
            uint32_t v = kiln_kld(g->k, kl_rope_table(g->k, n, n->dims[n->rank - 1]), g->tid);
            kiln_kir_op(g->k, KILN_KOP_STS, KILN_KT_NONE, addi(g, g->tid, u->st_off[i]), v, KILN_IDX_NONE, (int32_t)u->st_arr);
            kendif(g);
            continue;
        }
        uint32_t row = add(g, g->m0, g->tid);
        kif(g, o2(g, KILN_KOP_PAND, o2(g, KILN_KOP_LT, g->tid, ci(g, g->bm)), o2(g, KILN_KOP_LT, row, g->m)));
        uint32_t v = kl_gv_token_raw(s, u->st_node[i], row, u->st_kind[i] == 1);
        kiln_kir_op(g->k, KILN_KOP_STS, KILN_KT_NONE, addi(g, g->tid, u->st_off[i]), v, KILN_IDX_NONE, (int32_t)u->st_arr);
        kendif(g);
    }
}

/* The accumulators into the C tile (the ring's memory, every load retired), then gemv's epilogue
 * over all bm rows with every thread. */
static void gw_epilogue(gm *g, const gv_group *G, const uint32_t acc[2])
{
    kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, 256)));
    uint32_t wg = shri(g, g->tid, 7), w = andi(g, shri(g, g->tid, 5), 3);
    uint32_t gq = shri(g, g->lane, 2), qq = andi(g, g->lane, 3);
    uint32_t r0 = add(g, add(g, muli(g, wg, g->rc), muli(g, w, 16)), gq);
    for (int mt = 0; mt < g->rc / 64; mt++)
        for (int nt = 0; nt < gw_nn(g); nt++)
            for (int j = 0; j < gw_ncols(g, nt) / 2; j++) {
                uint32_t row = addi(g, r0, mt * 64 + 8 * ((j >> 1) & 1));
                uint32_t col = addi(g, muli(g, qq, 2), 128 * nt + 8 * (j >> 2) + (j & 1));
                sts(g, add(g, muli(g, row, g->cs), col), op1(g, KILN_KOP_LANE, KILN_KT_F32, acc[gw_acc(g, mt, nt)], j));
            }
    kendif(g);
    gw_stage_values(g);
    barrier(g);
    gm_drain(g, G, 0, g->bm);
}

/* The slots of a register unit as static column offsets from its first column (off) and the
 * first columns a thread's fragment gives it (base: static parts, 2 qq is added), or false where a
 * rope partner lies in another thread's fragment (neox with hd / 2 not a multiple of 8). Slots are
 * rope partners (normal: adjacent columns, slots 0-1 and 2-3; neox: + hd / 2, slots 0-2 and 1-3) or
 * the same columns of each sibling (siblings outermost, as gm_drain orders them). */
static bool gw_reg_units(const gm *g, const gv_group *G, int off[SLOTS], int base[GM_BN / 8], int *n_base)
{
    int cols = G->cols, half = (int)(G->hd / 2);
    *n_base = 0;
    if (G->rope && G->rot < G->hd) return false; /* partial rope: pass-through units (kl_gv_slot_col) keep the C tile */
    if (G->rope == 2) {
        if (half % 8 || g->bns % G->hd || cols != 4) return false;
        off[0] = 0, off[1] = 1, off[2] = half, off[3] = half + 1;
        for (int b = 0; b < g->bns; b += 8)
            if (b % G->hd < half) base[(*n_base)++] = b;
        return true;
    }
    if (cols == 4) {
        off[0] = 0, off[1] = 1, off[2] = 8, off[3] = 9;
        for (int b = 0; b < g->bns; b += 16) base[(*n_base)++] = b;
        return true;
    }
    if (cols == 2) {
        off[0] = 0, off[1] = 1;
        for (int b = 0; b < g->bns; b += 8) base[(*n_base)++] = b;
        return true;
    }
    return false;
}

/* The epilogue straight from the accumulators (codegen.gemm_epilogue = KILN_GEMM_ON): each
 * consumer thread runs gemv's per-element epilogue on units made of its own fragment values (rows
 * r0 and r0 + 8 of each 64-row tile, columns 2 qq + 8 jj + {0, 1}): no C tile, no barrier, no
 * division. Built because the layer's QKV (rope + KV writes) runs 38 us longer than the plain GEMM
 * of its shape; measured on the H100 (ncu, real clocks, 512-token llama-7b layer) it is no faster
 * than the C-tile drain (QKV 157.5 vs 156.5 us, O 44 vs 40, down 97.7 vs 93: its stores fill 13 of
 * 32 bytes a sector), so the drain stays the default. Both are latency-bound with the tensor cores
 * idle; the lever is running the epilogue under another tile's MMAs (a persistent ping-pong of the
 * consumer warpgroups, which needs this per-thread form). */
static bool gw_epilogue_regs(gm *g, const gv_group *G, const uint32_t acc[2])
{
    int off[SLOTS], base[GM_BN / 8], n_base;
    /* not for block weights: the decoders' registers beside the unrolled epilogue passed the
       384-thread cap of 168 (ptxas spilled a q8_0 QKV with PDL, 64 rows a consumer) */
    if (g->wblock || g->bn != GM_BN || !gw_reg_units(g, G, off, base, &n_base)) return false;
    gv *s = g->s;
    kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, 256)));
    uint32_t wg = shri(g, g->tid, 7), w = andi(g, shri(g, g->tid, 5), 3);
    uint32_t gq = shri(g, g->lane, 2), qq2 = muli(g, andi(g, g->lane, 3), 2);
    uint32_t r0 = add(g, g->m0, add(g, add(g, muli(g, wg, g->rc), muli(g, w, 16)), gq));
    uint32_t c0 = add(g, g->n0, qq2);
    gv_unit unit = {.mc = 1}, *e = &unit;
    for (int mt = 0; mt < g->rc / 64; mt++)
        for (int hh = 0; hh < 2; hh++)
            for (int b = 0; b < n_base; b++) {
                e->t0 = addi(g, r0, mt * 64 + 8 * hh);
                e->n_slots = 0;
                for (int q = 0; q < G->n_sib; q++)
                    for (int c = 0; c < G->cols; c++) {
                        int r = e->n_slots++, tc = q * g->bns + base[b] + off[c]; /* tile column less 2 qq */
                        e->slot_sib[r] = G->sib[q];
                        e->slot_delta[r] = c;
                        e->col[r] = addi(g, c0, base[b] + off[c]);
                        e->ok[r] = o2(g, KILN_KOP_LT, e->col[r], ci(g, (int32_t)G->n));
                        e->acc[r][0] = op1(g, KILN_KOP_LANE, KILN_KT_F32, acc[mt], (tc / 8) << 2 | hh << 1 | (tc & 1));
                    }
                kl_gv_epilogue(s, G, e, g->m);
            }
    kendif(g);
    return true;
}

static void gw_group(gm *g, const gv_group *G)
{
    kiln_kir *k = g->k;
    gv *s = g->s;
    uint32_t zero = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_W64, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t acc[2] = {kiln_kvar(k, zero), g->rc > 64 || gw_nn(g) > 1 ? kiln_kvar(k, zero) : KILN_IDX_NONE};
    int32_t nk = (int32_t)((s->K + GW_BK - 1) / GW_BK); /* a last half stage reads zeros past K */
    uint32_t wmap[2] = {KILN_IDX_NONE, KILN_IDX_NONE};
    for (int sp = 0; !g->wblock && sp < G->n_sib; sp++) {
        uint32_t slot = kiln_kir_buf(k, KILN_KBUF_NODE, s->g->nodes[s->mm[G->sib[sp]]].src[1], false);
        kiln_ktmap m = {.slot = slot, .inner = (uint32_t)s->K, .outer = (uint32_t)G->n, .stride = (uint32_t)s->K * 2,
                        .box_inner = GW_BK, .box_outer = (uint16_t)(g->bns / g->cm)};
        wmap[sp] = kiln_kir_tmap(k, &m);
    }
    kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, 256)));
    gw_consumer(g, acc, nk);
    kiln_kelse(k);
    if (g->wblock) {
        gw_producer_blocks(g, G, nk);
    } else {
        kif(g, o2(g, KILN_KOP_EQ, g->tid, ci(g, 256)));
        gw_producer(g, G, wmap, nk);
        kendif(g);
    }
    kendif(g);
    if (g->s->tgt->opts.gemm_epilogue == KILN_GEMM_ON && gw_epilogue_regs(g, G, acc)) return;
    barrier(g); /* every stage consumed: the ring's memory is free */
    gw_epilogue(g, G, acc);
}

/* The ring, its mbarriers and the x tensor map of kernel k (G->wg), initialized by thread 0. */
static void gw_setup(gm *G, kiln_kir *k)
{
    gv *s = G->s;
    G->sb = (uint32_t)((G->parts * G->bm + G->bn) * 128);
    uint32_t st_words = gw_stage_plan(G), st_bytes = (st_words * 4 + 1023) / 1024 * 1024; /* arrays are 1024-aligned */
    G->stages = (int)((GW_STAGE_MAX - st_bytes) / G->sb);
    if (G->stages > 6) G->stages = 6;
    uint32_t ring_words = (uint32_t)G->stages * G->sb / 4;
    if (ring_words < (uint32_t)(G->bm * G->cs)) ring_words = (uint32_t)(G->bm * G->cs); /* the C tile */
    G->sh = kiln_kir_shared(k, ring_words);
    uint32_t mb = kiln_kir_shared(k, (uint32_t)(4 * G->stages));
    if (G->st.n_st) G->st.st_arr = kiln_kir_shared(k, st_words);
    k->dyn_shared = true;
    G->ring = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, ci(G, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)G->sh);
    G->bars = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, ci(G, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)mb);
    kiln_ktmap xm = {.slot = G->xs, .word = G->xp ? (uint32_t)G->xp_word : 0, .inner = (uint32_t)s->K,
                     .outer = (uint32_t)(s->m_max * (G->xp ? G->parts : 1)), .stride = (uint32_t)s->K * 2, .box_inner = GW_BK,
                     .box_outer = (uint16_t)G->bm};
    G->xmap = kiln_kir_tmap(k, &xm);
    kif(G, o2(G, KILN_KOP_EQ, G->tid, ci(G, 0)));
    for (int i = 0; i < G->stages; i++) {
        gw_sync(G, KILN_KOP_MBAR_INIT, gw_bar(G, 0, ci(G, i)), KILN_IDX_NONE, G->wblock ? 129 : 1); /* the producer's arrive(s) + the bytes */
        /* every consumer thread, or with a cluster each consumer warp of each of its blocks */
        gw_sync(G, KILN_KOP_MBAR_INIT, gw_bar(G, 1, ci(G, i)), KILN_IDX_NONE, G->cm > 1 ? 8 * G->cm : 256);
    }
    gw_sync(G, KILN_KOP_FENCE_ASYNC, KILN_IDX_NONE, KILN_IDX_NONE, 1); /* the inits, visible to the TMA engine */
    kendif(G);
    if (G->cm > 1) gw_sync(G, KILN_KOP_CLUSTER_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0); /* every block's barriers ready */
    else barrier(G);
}

static void gm_prepare(gm *G);


/* Whether the TMA template takes the region (sm_90a, the compile's choice, 16-bit weights of one
 * type, x in at most two parts that a TMA can read: as it comes, or prepared by the rms or split
 * kernel): sets G->wg, bf, parts, xp; returns whether a split kernel must prepare x. */
static bool gw_choose(gm *G, const kiln_lower_target *tg)
{
    gv *s = G->s;
    G->wg = false;
    if (!tg->wgmma || tg->opts.wgmma == KILN_GEMM_OFF || s->K % 8) return false; /* on by default on sm_90 */
    bool floats = false;
    G->wblock = false;
    for (int q = 0; q < s->n_grp; q++) {
        kiln_dtype t = wdtype(s, s->grp[q].sib[0]);
        const kl_wfmt *f = kl_wfmt_of(t);
        if (is_float_w(t)) {
            if (floats && (t == KILN_DTYPE_BF16) != G->bf) return false;
            floats = true;
            G->bf = t == KILN_DTYPE_BF16;
        } else if (f->block && f->gemm_chunk && s->K % (GW_BK * GW_ROUND) == 0 && (2 * GW_ROUND) % f->subs == 0) { /* whole rounds */
            G->wblock = true;
        } else {
            return false;
        }
    }
    if (floats && G->wblock) return false; /* one producer kind a kernel */
    for (int q = 0; floats && q < s->n_grp; q++)
        for (int j = 0; j < s->grp[q].n_sib; j++)
            if (!kl_tma_aligned(s->g, s->g->nodes[s->mm[s->grp[q].sib[j]]].src[1])) return false; /* the weights' map */
    if (G->wblock) G->bf = false;
    /* x read by the TMA as it is: already the MMA's type, no norm, and a map can start where it does
     * (else the split kernel copies it into the scratch) */
    bool x_exact = s->norm == KILN_IDX_NONE && s->xdt == (G->bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F16) && kl_tma_aligned(s->g, s->x);
    G->parts = G->wblock ? 1 : x_parts(s, G->bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F16, x_exact);
    if (G->parts > 2) return false;
    if (s->norm != KILN_IDX_NONE) {
        gm_prepare(G);
        G->wg = G->xp;
        if (G->wg) G->threads = GW_THREADS;
        return false;
    }
    G->wg = true;
    G->threads = GW_THREADS;
    if (x_exact) return false; /* the TMA reads x's node */
    if (s->m_max * s->K / 2 >= ((int64_t)1 << 29) / 3) return G->wg = false, false;
    G->xp = true;
    G->xp_word = 0;
    G->xp_part = (int32_t)(s->m_max * s->K / 2);
    return true;
}

/* Column blocks of the region with bn columns a block (each group's siblings share them). */
static int64_t gw_col_blocks(const gv *s, int bn)
{
    int64_t b = 0;
    for (int q = 0; q < s->n_grp; q++) b += (s->grp[q].n + bn / s->grp[q].n_sib - 1) / (bn / s->grp[q].n_sib);
    return b;
}

/* Whether bn columns a block suit every group: wider than GM_BN only for TMA weights (the block
 * decoders write 128 rows) in one part, no clusters, and a neox head inside a sibling's columns. */
static bool gw_cols_ok(const gm *G, int bn, const kiln_lower_target *tg)
{
    if (bn == GM_BN) return true;
    if (G->wblock || G->parts != 1 || tg->opts.gemm_cluster > 1) return false;
    for (int q = 0; q < G->s->n_grp; q++) {
        const gv_group *Gq = &G->s->grp[q];
        if (bn % (8 * Gq->n_sib) || (Gq->rope == 2 && (bn / Gq->n_sib) % Gq->hd)) return false;
    }
    return true;
}

/* The block's tile: rows per consumer (rc 64 or 128) and columns (bn 128, 192 or 256), at most two
 * W64 accumulators a consumer. A stage brings (bm + bn) x 128 bytes from L2 for bm x bn x 64 MACs:
 * the tile's rate goes as bm bn / (bm + bn) (measured on the H100: 256 x 128 tiles 1.33x the rate of
 * 128 x 128 ones, as the ratio says), and its time as waves of the grid (whole waves: the last one
 * takes as long as a full one) times bm + bn. 128 x 256 tiles (two n-tiles a consumer) measured
 * slower than 256 x 128 ones at every shape (4096^3 564 vs 592, 512 x 22016 x 4096 509 vs 553
 * TFLOP/s), so only codegen.gemm_cols asks for them; 128 x 192 ran 512 x 12288 x 4096 at 510 vs
 * 475. codegen.gemm_rows 64 / gemm_cols force a side. */
static void gw_shape(gm *G, const kiln_lower_target *tg)
{
    gv *s = G->s;
    int64_t sms = tg->sm_count ? tg->sm_count : 132;
    static const int cand[][2] = {{64, 128}, {128, 128}, {64, 192}, {64, 256}};
    int64_t best = -1;
    G->rc = 64, G->bn = GM_BN;
    for (int c = 0; c < 4; c++) {
        int rc = cand[c][0], bn = cand[c][1];
        if (rc == 128 && (G->parts != 1 || s->m_max <= 128 || tg->opts.gemm_rows == 64)) continue;
        if (tg->opts.gemm_cols ? bn != tg->opts.gemm_cols : bn == 256) continue; /* 256: measured slower at every shape */
        if (!gw_cols_ok(G, bn, tg)) continue;
        int64_t blocks = gw_col_blocks(s, bn) * ((s->m_max + 2 * rc - 1) / (2 * rc));
        int64_t cost = (blocks + sms - 1) / sms * (2 * rc + bn);
        if (best < 0 || cost < best) best = cost, G->rc = rc, G->bn = bn;
    }
    G->bm = 2 * G->rc;
    G->apart = G->bm * 16;
}

/* Thread block clusters for TMA weights (codegen.gemm_cluster: 0 or 1 = none, 2, 4): the token-row
 * blocks of a cluster share each weight tile, so the L2 serves x + W / cm per tile instead of
 * x + W. Built on the hypothesis that the GEMM was L2-bound (6.4-7 TB/s of L2 reads at every
 * shape); measured on the H100 it was not: cluster 2 ran as fast as none (llama-7b 512-token
 * f16 layer 0.679 vs 0.686 ms, 512 x 12288 x 4096 458 vs 464 TFLOP/s), cluster 4 slower (0.857
 * ms), so it is opt-in. Needs as many row blocks as the cluster has (else smaller), and weight
 * slices of whole 8-row atoms. */
static void gw_cluster(gm *G, const kiln_lower_target *tg)
{
    gv *s = G->s;
    int want = tg->opts.gemm_cluster == 2 ? 2 : tg->opts.gemm_cluster == 4 ? 4 : 1;
    int64_t rows = (s->m_max + G->bm - 1) / G->bm;
    int sib = 1;
    for (int q = 0; q < s->n_grp; q++) sib = s->grp[q].n_sib > sib ? s->grp[q].n_sib : sib;
    while (want > 1 && (G->wblock || G->bn != GM_BN || rows < want || (GM_BN / sib) % (8 * want))) want /= 2;
    G->cm = want;
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
    if (!g->wg) g->parts = x_parts(s, g->wt, x_exact); /* with xp: what gm_prepare found for every group; wg: gw_choose's */
    g->wparts = g->wt == KILN_DTYPE_F32 ? 2 : 1;
    g->bns = g->bn / G->n_sib;
    g->U = kl_wfmt_of(g->wt)->subs;
    g->n0 = muli(g, nb, g->bns);
    if (g->wg) {
        gw_group(g, G);
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

/* The rms_norm of x's rows for the GEMM: with xp (gm_prepare), x normalized and split into the
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
static void gm_prepare(gm *G)
{
    gv *s = G->s;
    G->xp = false;
    if (s->norm == KILN_IDX_NONE || s->m_max * s->K / 2 >= ((int64_t)1 << 29) / 3) return;
    for (int q = 0; q < s->n_grp; q++) {
        kiln_dtype t = wdtype(s, s->grp[q].sib[0]);
        bool bf = t == KILN_DTYPE_BF16;
        int parts = x_parts(s, t, false); /* x_exact is false behind a norm */
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
    gv *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    *n_out = 0;
    kiln_status st = KILN_OK;
    int ki = 0;
    s->g = g;
    s->r = r;
    s->tgt = tg;
    kiln_kir scratch_k; /* gemv's analysis writes its grid into a kernel */
    kiln_kir_init(&scratch_k, "kiln_gemm", GM_THREADS);
    s->k = &scratch_k;
    bool ok = kl_gv_analyze(s, err, n_err) && gm_fits(s, err, n_err);
    if (ok && s->m_max <= 8) {
        kl_unsupported(err, n_err, "gemm: %lld rows (gemv takes up to 8 per pass)", (long long)s->m_max);
        ok = false;
    }
    kiln_kir_free(&scratch_k);
    if (!ok) {
        free(s);
        return KILN_ERR_UNSUPPORTED;
    }
    gm G = {.s = s, .scr = KILN_IDX_NONE, .nws = KILN_IDX_NONE, .threads = GM_THREADS, .bn = GM_BN, .cs = GM_CS};
    bool pre = gw_choose(&G, tg); /* the Hopper template, and whether a split kernel prepares x for it */
    if (!G.wg) gm_prepare(&G);
    pre = pre || s->norm != KILN_IDX_NONE;
    kiln_kir *k = &out[pre ? 1 : 0];
    G.k = k;
    if (s->norm != KILN_IDX_NONE) rms_kernel(s, &out[ki++], &G);
    else if (pre) split_kernel(s, &out[ki++], &G);
    ki++;
    kiln_kir_init(k, G.wg ? "kiln_gemm_tma" : "kiln_gemm", (uint32_t)G.threads);
    s->k = k;
    int parts_max = 1, wparts_max = 1;
    for (int q = 0; q < s->n_grp; q++) {
        kiln_dtype t = wdtype(s, s->grp[q].sib[0]);
        if (x_parts(s, t, false) > parts_max) parts_max = x_parts(s, t, false);
        if (t == KILN_DTYPE_F32) wparts_max = 2;
    }
    /* 128 tokens per block halves the dequantization per token of block weights (H100, 512-token
     * llama-7b layer: q4_k QKV 503 -> 474 us, gate/up 1173 -> 947 us), but costs float weights
     * occupancy (f16 QKV 499 -> 584 us) and leaves too few blocks for narrow outputs (down,
     * 4096 columns: 128 blocks, 373 -> 485 us). So: block weights only, and only with at least
     * two blocks per SM (264 on a 132-SM H100); never for x in three parts (the A tile would pass
     * lavapipe's 32 KB of shared memory). */
    int64_t col_blocks = gw_col_blocks(s, GM_BN);
    bool all_blocks = true;
    for (int q = 0; q < s->n_grp; q++)
        if (kiln_dtype_block(wdtype(s, s->grp[q].sib[0])) == 1) all_blocks = false;
    if (!G.wg) {
        G.bm = all_blocks && parts_max <= 2 && col_blocks * ((s->m_max + 127) / 128) >= 2 * (int64_t)tg->sm_count &&
                       kl_gemm_rows(tg) == 128 ? 128 : 64;
        G.apart = G.bm * 16;
        uint32_t words = (uint32_t)(parts_max * G.apart + wparts_max * GM_BWORDS);
        if (words < 32 * GM_CS) words = 32 * GM_CS;
        G.sh = kiln_kir_shared(k, words);
        k->min_blocks = 2; /* 16 warps per SM: at 130 registers ptxas left one block (8 warps), and gate/up ran at 2/3 the rate of QKV */
    } else {
        gw_shape(&G, tg);
        G.cs = G.bn + 4;
        gw_cluster(&G, tg);
    }
    k->cluster = G.cm > 1 ? (uint32_t)G.cm : 0;
    snprintf(k->what, sizeof k->what, "gemm%s %s x%d%s, %u ops", G.wg ? " (tma + wgmma)" : "", kiln_dtype_name(wdtype(s, 0)), s->n_mm,
             s->norm != KILN_IDX_NONE ? " + rms_norm" : "", r->n_nodes);
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
    G.m0 = muli(&G, by, G.bm);
    G.cm = G.cm ? G.cm : 1;
    if (G.cm > 1) G.crank = o2(&G, KILN_KOP_REM, by, ci(&G, G.cm));
    if (G.xp) {
        G.xs = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, false);
        k->scratch_bytes = 4 * ((uint64_t)G.xp_word + (uint64_t)G.parts * (uint64_t)G.xp_part);
    } else {
        G.xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    }
    if (s->norm != KILN_IDX_NONE && !G.xp) {
        G.scr = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, false);
        if (s->nw != KILN_IDX_NONE) G.nws = kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false);
        k->scratch_bytes = 4 * (uint64_t)s->m_max;
    }
    if (G.wg) gw_setup(&G, k);
    uint32_t blocks = 0;
    /* a cluster works whole (its blocks bring each other's weight slices) when its first block has rows */
    kif(&G, o2(&G, KILN_KOP_LT, G.cm > 1 ? muli(&G, o2(&G, KILN_KOP_SUB, by, G.crank), G.bm) : G.m0, G.m));
    for (int q = 0; q < s->n_grp; q++) {
        const gv_group *Gq = &s->grp[q];
        uint32_t nb = (uint32_t)((Gq->n + G.bn / Gq->n_sib - 1) / (G.bn / Gq->n_sib));
        kif(&G, o2(&G, KILN_KOP_PAND, o2(&G, KILN_KOP_LE, ci(&G, (int32_t)blocks), bx), o2(&G, KILN_KOP_LT, bx, ci(&G, (int32_t)(blocks + nb)))));
        gm_group(&G, Gq, addi(&G, bx, -(int32_t)blocks));
        kendif(&G);
        blocks += nb;
    }
    kendif(&G);
    if (G.cm > 1) gw_sync(&G, KILN_KOP_CLUSTER_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0); /* no block leaves while others may arrive at its barriers */
    if (blocks > 65535) st = kl_unsupported(err, n_err, "gemm: %u column blocks (a grid's y is at most 65535)", blocks);
    k->grid[0] = (uint32_t)((s->m_max + G.bm - 1) / G.bm);
    k->grid[0] = (k->grid[0] + G.cm - 1) / G.cm * G.cm;
    k->grid[1] = blocks;
    if (s->failed) st = kl_unsupported(err, n_err, "gemm: %s", s->why);
    if (st != KILN_OK) {
        for (int i = 0; i < ki; i++) kiln_kir_free(&out[i]);
    } else {
        *n_out = (uint32_t)ki;
    }
    free(s);
    return st;
}
