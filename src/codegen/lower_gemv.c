/* GEMV template for matmul regions with few rows (decode; prefill runs it per chunk of 8 tokens):
 * y_j[t, n] = f(x)[t] . W_j[n] for up to 4 sibling weights sharing x, with the rms_norm prologue
 * and the epilogues (bias/residual add, swiglu, rope, KV-cache write) applied by the warp that
 * owns the output. A warp owns a unit of up to 4 output rows (rope partners and swiglu pairs
 * together), its 32 lanes stride over 16-byte chunks of the rows; the format rows (wfmt.h) turn chunks
 * into values; x's prologue (norm, quantization, staging) is lower_gemv_x.c's. Must not know any
 * target's syntax. */
#include "codegen/lower_mm.h"
#include "codegen/wfmt.h"

#include <stdlib.h>
#include <string.h>

/* The format row of weight dtype t (kl_gv_analyze refused those without one). */
static const kl_wfmt *fmt(kiln_dtype t) { return kl_wfmt_of(t); }

/* ------------------------------------------------------------------ kernel */

/* Multiplies one loaded chunk (every slot) with x for every token of the pass, into the accumulators. */
static void gv_chunk_fma(gv *s, kiln_dtype t, const gv_chunk *ch, uint32_t c, uint32_t xs, uint32_t nws,
                         const uint32_t *tt)
{
    kiln_kir *k = s->k;
    int64_t K = s->K;
    for (int sub = 0; sub < fmt(t)->subs; sub++) {
        gv_sub w[SLOTS];
        for (int r = 0; r < s->u.n_slots; r++) kl_gv_decode(s, t, &ch[r], c, sub, &w[r]);
        int V = w[0].v;
        uint32_t e0 = kl_gv_sub_elem(s, t, c, sub);
        uint32_t nwv[16] = {0};
        if (s->xstage) { /* normalized x from shared memory */
            for (int q = 0; q < s->mc; q++) {
                uint32_t xv[16] = {0};
                uint32_t xb = kiln_k2(s->k, KILN_KOP_ADD, kiln_ki(s->k, (int32_t)(q * K)),
                                      kiln_k2(s->k, KILN_KOP_DIV, e0, kiln_ki(s->k, s->xv)));
                for (int i = 0; i < V; i++) /* lanes read consecutive words: no bank conflicts */
                    xv[i] = kiln_kir_op(k, KILN_KOP_LDS, KILN_KT_F32,
                                        kiln_k2(s->k, KILN_KOP_ADD, xb, kiln_ki(s->k, (int32_t)(i * K / s->xv))),
                                        KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)s->sh_x);
                for (int r = 0; r < s->u.n_slots; r++) {
                    uint32_t a = s->u.acc[r][q];
                    for (int i = 0; i < V; i++) a = kiln_kfma(s->k, w[r].q[i], xv[i], a);
                    kiln_kset(k, s->u.acc[r][q], a);
                }
            }
            continue;
        }
        if (nws != KILN_IDX_NONE && V == 1) nwv[0] = kl_load(k, nws, KILN_DTYPE_F32, e0);
        if (nws != KILN_IDX_NONE && V > 1)
            for (int i = 0; i < V; i += 4) {
                uint32_t v4 = kiln_kld4(s->k, nws, kiln_k2(s->k, KILN_KOP_ADD, e0, kiln_ki(s->k, i)));
                for (int l = 0; l < 4; l++)
                    nwv[i + l] = kl_lanef(k, v4, l);
            }
        for (int q = 0; q < s->mc; q++) {
            uint32_t xv[16] = {0};
            uint32_t xb =
                kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, tt[q], kiln_ki(s->k, (int32_t)K)), e0);
            for (int i = 0; i < V; i += 4) {
                bool vec = V > 1 && s->xdt == KILN_DTYPE_F32;
                uint32_t v4 =
                    vec ? kiln_kld4(s->k, xs, kiln_k2(s->k, KILN_KOP_ADD, xb, kiln_ki(s->k, i))) : KILN_IDX_NONE;
                for (int l = 0; l < 4 && i + l < V; l++) {
                    xv[i + l] = !vec ? kl_load(k, xs, s->xdt, kiln_k2(s->k, KILN_KOP_ADD, xb, kiln_ki(s->k, i + l)))
                                     : kl_lanef(k, v4, l);
                    if (s->nsc[q] != KILN_IDX_NONE) {
                        xv[i + l] = kiln_k2(s->k, KILN_KOP_MUL, xv[i + l], s->nsc[q]);
                        if (nws != KILN_IDX_NONE) xv[i + l] = kiln_k2(s->k, KILN_KOP_MUL, xv[i + l], nwv[i + l]);
                    }
                }
            }
            uint32_t sx = KILN_IDX_NONE;
            if (w[0].b != KILN_IDX_NONE) {
                sx = xv[0];
                for (int i = 1; i < V; i++) sx = kiln_k2(s->k, KILN_KOP_ADD, sx, xv[i]);
            }
            for (int r = 0; r < s->u.n_slots; r++) {
                if (w[r].a == KILN_IDX_NONE) { /* float weights: straight into the accumulator */
                    uint32_t a = s->u.acc[r][q];
                    for (int i = 0; i < V; i++) a = kiln_kfma(s->k, w[r].q[i], xv[i], a);
                    kiln_kset(k, s->u.acc[r][q], a);
                    continue;
                }
                uint32_t d = kiln_k2(s->k, KILN_KOP_MUL, w[r].q[0], xv[0]);
                for (int i = 1; i < V; i++) d = kiln_kfma(s->k, w[r].q[i], xv[i], d);
                uint32_t a = kiln_kfma(s->k, w[r].a, d, s->u.acc[r][q]);
                if (w[r].b != KILN_IDX_NONE) a = kiln_kfma(s->k, w[r].b, sx, a);
                kiln_kset(k, s->u.acc[r][q], a);
            }
        }
    }
}

/* ------------------------------------------------------------------ integer dot products */

/* One loaded chunk (every slot) against the quantized x of every token of the pass. */
static void gv_chunk_dp4a(gv *s, kiln_dtype t, const gv_chunk *ch, uint32_t c)
{
    kiln_kir *k = s->k;
    int32_t W = (int32_t)(s->K / 4), G = (int32_t)(s->K / 32);
    /* per chunk: xq word of sub-step 0, its step per sub, x group of sub-step 0 and its step */
    const kl_wfmt *f = fmt(t);
    kl_dp4a_at at = {.h0 = KILN_IDX_NONE, .hsh = KILN_IDX_NONE};
    f->dp4a_at(k, c, &at);
    uint32_t w0 = at.w0, g0 = at.g0, h0 = at.h0, hsh = at.hsh;
    int wstep = at.wstep, gstep = at.gstep, nsub = f->subs;
    /* per slot: weight scales of each sub-step (and the k-quants' d, dmin, mins) */
    kl_dp4a_scales sc[SLOTS];
    memset(sc, 0, sizeof sc);
    for (int r = 0; r < s->u.n_slots; r++) f->dp4a_scales(k, &ch[r], c, &sc[r]);
    for (int q = 0; q < s->mc; q++) {
        uint32_t part[SLOTS] = {0};
        for (int sub = 0; sub < nsub; sub++) {
            uint32_t wb = kiln_k2(s->k, KILN_KOP_ADD, kiln_ki(s->k, q * W + wstep * sub), w0);
            uint32_t gi = kiln_k2(s->k, KILN_KOP_ADD, kiln_ki(s->k, q * G + gstep * sub), g0);
            uint32_t xq[4], dx = kiln_klds(s->k, s->sh_dx, KILN_KT_F32, gi), sq = KILN_IDX_NONE;
            for (int l = 0; l < 4; l++)
                xq[l] = kiln_klds(s->k, s->sh_xq, KILN_KT_U32, kiln_k2(s->k, KILN_KOP_ADD, wb, kiln_ki(s->k, l)));
            if (f->dp4a_offset) { /* the values are stored + offset: subtract offset * sum of the x quants */
                sq = kiln_ki(s->k, 0);
                for (int l = 0; l < 4; l++)
                    sq = kiln_kir_op(k, KILN_KOP_DP4A, KILN_KT_I32, kiln_ku(k, 0x01010101u), xq[l], sq, 0);
                sq = kiln_k2(s->k, KILN_KOP_MUL, sq, kiln_ki(s->k, -f->dp4a_offset));
            }
            for (int r = 0; r < s->u.n_slots; r++) {
                uint32_t dot = sq != KILN_IDX_NONE ? sq : kiln_ki(s->k, 0);
                for (int l = 0; l < 4; l++)
                    dot = kiln_kir_op(k, KILN_KOP_DP4A, KILN_KT_I32, f->dp4a_bytes(k, &ch[r], sub, l, hsh), xq[l], dot,
                                      0);
                uint32_t v = kiln_k2(s->k, KILN_KOP_MUL, kiln_kcvt(s->k, KILN_KT_F32, dot),
                                     kiln_k2(s->k, KILN_KOP_MUL, sc[r].wa[sub], dx));
                part[r] = sub ? kiln_k2(s->k, KILN_KOP_ADD, part[r], v) : v;
            }
        }
        if (h0 !=
            KILN_IDX_NONE) { /* k-quant mins: the chunk of h = 0 subtracts dmin * min * sum(x) for both sub-blocks */
            uint32_t first = kiln_k2(s->k, KILN_KOP_EQ, h0, kiln_ki(s->k, 0));
            uint32_t gi = kiln_k2(s->k, KILN_KOP_ADD, kiln_ki(s->k, q * G), g0);
            uint32_t xs0 = kiln_klds(s->k, s->sh_xs, KILN_KT_F32, gi),
                     xs1 = kiln_klds(s->k, s->sh_xs, KILN_KT_F32, kiln_k2(s->k, KILN_KOP_ADD, gi, kiln_ki(s->k, 1)));
            for (int r = 0; r < s->u.n_slots; r++) {
                uint32_t m = kiln_kfma(s->k, sc[r].mn[0], xs0, kiln_k2(s->k, KILN_KOP_MUL, sc[r].mn[1], xs1));
                m = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, first, kiln_k2(s->k, KILN_KOP_MUL, sc[r].dmin, m),
                                kiln_kf(s->k, 0.0f), 0);
                part[r] = kiln_k2(s->k, KILN_KOP_SUB, part[r], m);
            }
        }
        for (int r = 0; r < s->u.n_slots; r++)
            kiln_kset(k, s->u.acc[r][q], kiln_k2(s->k, KILN_KOP_ADD, s->u.acc[r][q], part[r]));
    }
}

/* The pair path (s->pair): one loaded pair of chunks (every slot) against the quantized x of every
 * token of the pass. Group g = pair_subs p + sub of token q: 8 words of quants (two 16-byte shared
 * loads), its scale and (k-quants) its sum; weight scales once per pair. */
static void gv_pair_dp4a(gv *s, kiln_dtype t, const gv_chunk *ch, uint32_t p, uint32_t pm)
{
    kiln_kir *k = s->k;
    int32_t W = (int32_t)(s->K / 4), G = (int32_t)(s->K / 32);
    const kl_wfmt *f = fmt(t);
    int nsub = f->pair_subs;
    kl_dp4a_scales sc[SLOTS];
    memset(sc, 0, sizeof sc);
    for (int r = 0; r < s->u.n_slots; r++) f->pair_scales(k, &ch[r], pm, &sc[r]);
    uint32_t g0 = kiln_kmuli(k, p, nsub);
    for (int q = 0; q < s->mc; q++) {
        uint32_t part[SLOTS] = {0}, xs[2] = {KILN_IDX_NONE, KILN_IDX_NONE};
        for (int sub = 0; sub < nsub; sub++) {
            uint32_t gi = kiln_kaddi(k, g0, q * G + sub);
            uint32_t wb = kiln_kaddi(k, kiln_kmuli(k, g0, 8), q * W + 8 * sub);
            uint32_t x4[2] = {kiln_kir_op(k, KILN_KOP_LDS4, KILN_KT_V4, wb, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)s->sh_xq),
                              kiln_kir_op(k, KILN_KOP_LDS4, KILN_KT_V4, kiln_kaddi(k, wb, 4), KILN_IDX_NONE, KILN_IDX_NONE,
                                          (int32_t)s->sh_xq)};
            uint32_t dx = kiln_klds(k, s->sh_dx, KILN_KT_F32, gi);
            if (sc[0].dmin) xs[sub] = kiln_klds(k, s->sh_xs, KILN_KT_F32, gi);
            for (int r = 0; r < s->u.n_slots; r++) {
                uint32_t dot = kiln_ki(k, 0);
                for (int l = 0; l < 8; l++)
                    dot = kiln_kir_op(k, KILN_KOP_DP4A, KILN_KT_I32, f->pair_bytes(k, &ch[r], sub, l), kiln_klane(k, x4[l / 4], l % 4),
                                      dot, 0);
                uint32_t ws = kiln_k2(k, KILN_KOP_MUL, sc[r].wa[sub], dx), fd = kiln_kcvt(k, KILN_KT_F32, dot);
                part[r] = sub ? kiln_kfma(k, fd, ws, part[r]) : kiln_k2(k, KILN_KOP_MUL, fd, ws);
            }
        }
        for (int r = 0; r < s->u.n_slots; r++) {
            if (sc[r].dmin) { /* k-quant mins: dmin * (m0 * sum(x of group 0) + m1 * sum(x of group 1)) */
                uint32_t m = kiln_kfma(k, sc[r].mn[0], xs[0], kiln_k2(k, KILN_KOP_MUL, sc[r].mn[1], xs[1]));
                part[r] = kiln_k2(k, KILN_KOP_SUB, part[r], kiln_k2(k, KILN_KOP_MUL, sc[r].dmin, m));
            }
            kiln_kset(k, s->u.acc[r][q], kiln_k2(k, KILN_KOP_ADD, s->u.acc[r][q], part[r]));
        }
    }
}

/* Loads a lane's step c of weight row `row` (I32): chunk c, or on the pair path pair c (pm = c mod 8). */
static void gv_load_step(gv *s, kiln_dtype t, uint32_t slot, uint32_t row, uint32_t c, uint32_t pm, int64_t rows, gv_chunk *o)
{
    if (s->pair) fmt(t)->pair_load(s->k, slot, row, c, pm, s->K, rows, o);
    else kl_gv_load_chunk(s, t, slot, row, c, rows, o);
}

/* Unit u and warp wi within it of global warp gw in group G; fills un's slots (columns, ok) and each
 * slot's weight buffer and row (0 where the column does not exist). */
static void set_unit(gv *s, const gv_group *G, uint32_t gw, gv_unit *un, uint32_t *u, uint32_t *wi, uint32_t slot_w[SLOTS],
                     uint32_t row[SLOTS])
{
    kiln_kir *k = s->k;
    const kiln_graph *g = s->g;
    uint32_t gl = kiln_k2(k, KILN_KOP_SUB, gw, kiln_ki(k, (int32_t)G->warp0));
    *u = kiln_k2(k, KILN_KOP_DIV, gl, kiln_ki(k, G->wpu)), *wi = kiln_k2(k, KILN_KOP_REM, gl, kiln_ki(k, G->wpu));
    uint32_t valid = kiln_k2(k, KILN_KOP_LT, *u, kiln_ki(k, (int32_t)G->units));
    int deltas[SLOTS]; /* unit base column and the slots' deltas */
    uint32_t base = kl_gv_unit_base(s, G, *u, deltas);
    un->n_slots = 0;
    for (int q = 0; q < G->n_sib; q++)
        for (int c = 0; c < G->cols; c++) {
            int r = un->n_slots++;
            un->slot_sib[r] = G->sib[q];
            un->slot_delta[r] = c; /* the same position in every sibling of the group */
            un->col[r] = kl_gv_slot_col(s, G, base, deltas, c);
            un->ok[r] = kiln_k2(k, KILN_KOP_PAND, valid, kiln_k2(k, KILN_KOP_LT, un->col[r], kiln_ki(k, (int32_t)G->n)));
        }
    for (int r = 0; r < un->n_slots; r++) {
        slot_w[r] = kiln_kir_buf(k, KILN_KBUF_NODE, g->nodes[s->mm[un->slot_sib[r]]].src[1], false);
        row[r] = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, un->ok[r], un->col[r], kiln_ki(k, 0), 0);
    }
}

/* Whether group G loads two chunks a step (both in flight before the first is used). Not with
 * codegen.gemv_pipeline, whose next step is in flight instead (two would double its registers). */
static bool two_step(gv *s, const gv_group *G, kiln_dtype t)
{
    return (fmt(t)->two || (s->dp4a && fmt(t)->two_dp4a)) && !s->scalar && !s->pair && !s->pipe &&
           kl_gv_steps_per_row(s, t) % (64 * G->wpu) == 0;
}

/* One step's arithmetic: loaded chunk(s) ch (every slot) at step index cc[h] (pair mod 8: pm). */
static void step_math(gv *s, kiln_dtype t, bool two, gv_chunk ch[2][SLOTS], const uint32_t cc[2], uint32_t pm, uint32_t xs,
                      uint32_t nws)
{
    for (int h = 0; h < (two ? 2 : 1); h++) {
        if (s->pair) gv_pair_dp4a(s, t, ch[h], cc[h], pm);
        else if (s->dp4a) gv_chunk_dp4a(s, t, ch[h], cc[h]);
        else gv_chunk_fma(s, t, ch[h], cc[h], xs, nws, s->tt);
    }
}

/* The pre_* variables (make_pre_vars) as chunks of a step of group gi: fresh values (SETLANE copies
 * the lanes, the scale word is bitcast), so that the variables may be loaded again before they are
 * used (codegen.gemv_pipeline). */
static void chunks_of_vars(gv *s, int gi, bool two, gv_chunk ch[2][SLOTS])
{
    kiln_kir *k = s->k;
    for (int h = 0; h < (two ? 2 : 1); h++)
        for (int r = 0; r < s->u.n_slots; r++) {
            memset(&ch[h][r], 0xFF, sizeof ch[h][r]); /* KILN_IDX_NONE */
            for (int i = 0; i < 4; i++) {
                if (!(s->pre_vmask[gi][r] >> i & 1)) continue;
                uint32_t v = KILN_IDX_NONE;
                for (int l = 0; l < 4; l++) v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, s->pre_v[h][r][i][l], KILN_IDX_NONE, l);
                ch[h][r].v[i] = v;
            }
            enum kiln_kt dt = (enum kiln_kt)s->pre_dtype[gi][r];
            if (dt != KILN_KT_NONE) {
                uint32_t w = kiln_kbitcast(k, KILN_KT_U32, s->pre_d[h][r]); /* F32 variable: a copy */
                ch[h][r].d = dt == KILN_KT_U32 ? w : kiln_kbitcast(k, dt, w);
            }
        }
}

/* The variables pre_v / pre_d (zero), made once per kernel and shared by the groups (a warp is in one). */
static void make_pre_vars(gv *s)
{
    if (s->pre_made) return;
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < SLOTS; r++) {
            for (int i = 0; i < 4; i++)
                for (int l = 0; l < 4; l++) s->pre_v[h][r][i][l] = kiln_kvar(s->k, kiln_ku(s->k, 0));
            s->pre_d[h][r] = kiln_kvar(s->k, kiln_kf(s->k, 0.0f));
        }
    s->pre_made = true;
}

/* Loads a lane's step c (both chunks of a two-chunk step) of every slot of group gi into the pre_*
 * variables, and notes which fields the format's load sets. */
static void load_into_vars(gv *s, int gi, kiln_dtype t, bool two, int wpu, uint32_t c, uint32_t pm, const uint32_t slot_w[SLOTS],
                           const uint32_t row[SLOTS], int n_slots, int64_t rows)
{
    kiln_kir *k = s->k;
    for (int h = 0; h < (two ? 2 : 1); h++) {
        uint32_t ch_c = kiln_kaddi(k, c, 32 * wpu * h);
        for (int r = 0; r < n_slots; r++) {
            gv_chunk ch;
            memset(&ch, 0xFF, sizeof ch); /* KILN_IDX_NONE: fields the format's load leaves */
            gv_load_step(s, t, slot_w[r], row[r], ch_c, pm, rows, &ch);
            s->pre_vmask[gi][r] = 0;
            for (int i = 0; i < 4; i++) {
                if (ch.v[i] == KILN_IDX_NONE) continue;
                s->pre_vmask[gi][r] |= (uint8_t)(1u << i);
                for (int l = 0; l < 4; l++) kiln_kset(k, s->pre_v[h][r][i][l], kiln_klane(k, ch.v[i], l));
            }
            s->pre_dtype[gi][r] = ch.d == KILN_IDX_NONE ? KILN_KT_NONE : (uint8_t)kiln_ktype(k, ch.d);
            if (ch.d != KILN_IDX_NONE)
                kiln_kset(k, s->pre_d[h][r], kiln_ktype(k, ch.d) == KILN_KT_F32 ? ch.d : kiln_kbitcast(k, KILN_KT_F32, ch.d));
        }
    }
}

/* KILN_PDL_REGS or codegen.gemv_preload: the step a lane takes first in its block's first virtual
 * block is in the pre_* variables (loaded before x's prologue and any grid wait, preload_first): its
 * arithmetic runs here, before the chunk loop, which then starts one step later in that virtual block. */
static void peel_first(gv *s, const gv_group *G, kiln_dtype t, bool two, uint32_t c0, uint32_t pm, uint32_t xs, uint32_t nws)
{
    kiln_kir *k = s->k;
    kiln_kif(k, kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_EQ, s->vb, s->bid),
                        kiln_k2(k, KILN_KOP_LT, c0, kiln_ki(k, (int32_t)kl_gv_steps_per_row(s, t)))));
    gv_chunk ch[2][SLOTS];
    uint32_t cc[2] = {c0, kiln_kaddi(k, c0, 32 * G->wpu)};
    chunks_of_vars(s, (int)(G - s->grp), two, ch);
    step_math(s, t, two, ch, cc, pm, xs, nws);
    kiln_kendif(k);
}

/* codegen.gemv_prefetch: at the top of a step at c, L2 is asked for the weights of the step at
 * c + ahead (clamped into the row: the last steps ask again for the row's last one), through the
 * format's own loads turned into prefetches. They take no registers, so ptxas leaves them where
 * they are, and a warp has that step's bytes in flight while it works through this one. */
static void prefetch_ahead(gv *s, kiln_dtype t, const gv_group *G, bool two, uint32_t c, uint32_t pm, const uint32_t slot_w[SLOTS],
                           const uint32_t row[SLOTS], int32_t ahead, int64_t cpr)
{
    kiln_kir *k = s->k;
    for (int h = 0; h < (two ? 2 : 1); h++) {
        uint32_t cn = kiln_k2(k, KILN_KOP_MIN, kiln_kaddi(k, c, ahead + h * 32 * G->wpu), kiln_ki(k, (int32_t)(cpr - 1)));
        for (int r = 0; r < s->u.n_slots; r++) {
            gv_chunk ch;
            uint32_t from = k->n_ins;
            gv_load_step(s, t, slot_w[r], row[r], cn, pm, G->n, &ch);
            kl_pdl_prefetch_tail(k, from);
        }
    }
}

/* The K split over a unit's wpu warps: every accumulator summed over the unit's warps. Each warp's
 * totals first (shuffles only, independent chains), lane 0's into shared memory, one barrier, then
 * the unit's warps' totals in warp order, and a barrier before the array is written again: two
 * barriers where one REDUCE per accumulator took two each (the QKV gemv has 12 accumulators). Same
 * sums in the same order as REDUCE over 32 wpu threads prints (butterfly in the warp, then warps).
 * Only with codegen.gemv_reduce on (opt-in until timed on the H100) and where the kernel's shared
 * memory has room for the array; else REDUCE per accumulator. */
static void reduce_split(gv *s, const gv_group *G, uint32_t tid, uint32_t wi)
{
    kiln_kir *k = s->k;
    int n = s->u.n_slots * s->mc;
    if (!s->red_made) { /* the totals' array, where it fits beside the kernel's others (x staged: 32 KB at K 8192) */
        uint64_t need = (kiln_kir_shared_bytes(k) + 15) / 16 * 16 + 4ull * SLOTS * MC_MAX * WARPS;
        s->red_ok = s->tgt->opts.gemv_reduce == KILN_GEMM_ON && need <= s->tgt->smem_bytes; /* opt-in until timed */
        if (s->red_ok) s->sh_red = kiln_kir_shared(k, SLOTS * MC_MAX * WARPS);
        s->red_made = true;
    }
    if (G->wpu == 1 || n == 1 || !s->red_ok) { /* a warp's own sum, one accumulator, or no room: REDUCE as it prints */
        for (int r = 0; r < s->u.n_slots; r++)
            for (int q = 0; q < s->mc; q++)
                kiln_kset(k, s->u.acc[r][q],
                          kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, s->u.acc[r][q], KILN_IDX_NONE, KILN_IDX_NONE,
                                      (KILN_KRED_SUM << 16) | (32 * G->wpu)));
        return;
    }
    uint32_t warp = kiln_kshri(k, tid, 5), lead = kiln_k2(k, KILN_KOP_EQ, kiln_kandi(k, tid, 31), kiln_ki(k, 0));
    uint32_t v[SLOTS * MC_MAX];
    for (int i = 0; i < n; i++)
        v[i] = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, s->u.acc[i / s->mc][i % s->mc], KILN_IDX_NONE, KILN_IDX_NONE,
                           (KILN_KRED_SUM << 16) | 32);
    kiln_kif(k, lead);
    for (int i = 0; i < n; i++) kiln_ksts(k, s->sh_red, kiln_kaddi(k, warp, i * WARPS), v[i]);
    kiln_kendif(k);
    kiln_kbarrier(k);
    uint32_t first = kiln_k2(k, KILN_KOP_SUB, warp, wi); /* the unit's first warp in the block */
    for (int i = 0; i < n; i++) {
        uint32_t t = kiln_klds(k, s->sh_red, KILN_KT_F32, kiln_kaddi(k, first, i * WARPS));
        for (int w = 1; w < G->wpu; w++)
            t = kiln_k2(k, KILN_KOP_ADD, t, kiln_klds(k, s->sh_red, KILN_KT_F32, kiln_kaddi(k, first, i * WARPS + w)));
        kiln_kset(k, s->u.acc[i / s->mc][i % s->mc], t);
    }
    kiln_kbarrier(k); /* read before the next virtual block's totals land */
}

static void emit_group(gv *s, const gv_group *G, uint32_t gw, uint32_t lane, uint32_t tid, uint32_t m)
{
    kiln_kir *k = s->k;
    const kiln_graph *g = s->g;
    kiln_dtype t = (kiln_dtype)g->nodes[g->nodes[s->mm[G->sib[0]]].src[1]].dtype;
    uint32_t u, wi, slot_w[SLOTS], row[SLOTS];
    set_unit(s, G, gw, &s->u, &u, &wi, slot_w, row);
    uint32_t xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    uint32_t nws = s->nw != KILN_IDX_NONE ? kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false) : KILN_IDX_NONE;
    int64_t rows = G->n, cpr = kl_gv_steps_per_row(s, t);
    if (!s->hoisted) {
        s->u.t0 = kiln_kvar(k, kiln_ki(s->k, 0));
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, s->u.t0, m, kiln_ki(s->k, s->mc), 0);
        kl_gv_pass_prologue(s, tid, m);
    }
    for (int r = 0; r < s->u.n_slots; r++)
        for (int q = 0; q < s->mc; q++) s->u.acc[r][q] = kiln_kvar(k, kiln_kf(s->k, 0));
    /* Float and q8_0 rows take two chunks per step when the chunk count allows: both chunks' loads
     * are in flight before the first is used (more bytes in flight per warp). So do q4_K/q5_K rows
     * with integer dot products (ptxas gives them the same 80 registers either way; q6_K's four
     * loads per chunk would not fit). */
    bool two = two_step(s, G, t);
    int32_t step = 32 * G->wpu * (two ? 2 : 1);
    uint32_t c0 = kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, wi, kiln_ki(s->k, 32)), lane);
    uint32_t pm = s->pair ? kiln_kandi(k, c0, 7) : KILN_IDX_NONE; /* c mod 8 at every step (steps of 32 wpu) */
    if (s->pre) peel_first(s, G, t, two, c0, pm, xs, nws);
    int gi = (int)(G - s->grp);
    if (s->pipe) { /* codegen.gemv_pipeline: the lane's first step into the variables */
        kiln_kif(k, kiln_k2(k, KILN_KOP_LT, c0, kiln_ki(k, (int32_t)cpr)));
        load_into_vars(s, gi, t, two, G->wpu, c0, pm, slot_w, row, s->u.n_slots, rows);
        kiln_kendif(k);
    }
    uint32_t c = kiln_kvar(k, s->pre ? kiln_ksel(k, KILN_KT_I32, kiln_k2(k, KILN_KOP_EQ, s->vb, s->bid), kiln_kaddi(k, c0, step), c0) : c0);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, c, kiln_ki(s->k, (int32_t)cpr), kiln_ki(s->k, step), 0);
    gv_chunk ch[2][SLOTS];
    uint32_t cc[2] = {c, two ? kiln_k2(s->k, KILN_KOP_ADD, c, kiln_ki(s->k, 32 * G->wpu)) : KILN_IDX_NONE};
    if (s->tgt->opts.gemv_prefetch > 0 && s->tgt->opts.gemv_prefetch <= 4) /* codegen.gemv_prefetch steps ahead */
        prefetch_ahead(s, t, G, two, c, pm, slot_w, row, step * s->tgt->opts.gemv_prefetch, cpr);
    if (s->pipe) { /* this step from the variables (copies), then the next step's loads into them, in flight during this step's arithmetic */
        chunks_of_vars(s, gi, two, ch);
        uint32_t cn = kiln_kaddi(k, c, step);
        kiln_kif(k, kiln_k2(k, KILN_KOP_LT, cn, kiln_ki(k, (int32_t)cpr)));
        load_into_vars(s, gi, t, two, G->wpu, cn, pm, slot_w, row, s->u.n_slots, rows);
        kiln_kendif(k);
    } else {
        for (int h = 0; h < (two ? 2 : 1); h++)
            for (int r = 0; r < s->u.n_slots; r++) gv_load_step(s, t, slot_w[r], row[r], cc[h], pm, rows, &ch[h][r]);
        /* the step's loads issue together (ptxas moves no load across it): codegen.gemv_fence, or at AUTO the format's default */
        if (s->tgt->opts.gemv_fence == KILN_GEMM_ON || (s->tgt->opts.gemv_fence == KILN_GEMM_AUTO && (fmt(t)->gemv_auto & KL_GV_FENCE)))
            kiln_kir_op(k, KILN_KOP_FENCE_CTA, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    }
    step_math(s, t, two, ch, cc, pm, xs, nws);
    kl_loop_end(k);
    reduce_split(s, G, tid, wi);
    if (s->norm != KILN_IDX_NONE && kiln_region_is_out(s->r, s->norm) && G == &s->grp[0])
        kl_gv_store_normed_x(s, gw, u, lane, m);
    kiln_kif(s->k, kiln_k2(s->k, KILN_KOP_PAND, kiln_k2(s->k, KILN_KOP_EQ, lane, kiln_ki(s->k, 0)),
                           kiln_k2(s->k, KILN_KOP_EQ, wi, kiln_ki(s->k, 0))));
    kl_gv_epilogue(s, G, &s->u, m);
    kiln_kendif(s->k);
    if (!s->hoisted) kl_loop_end(k);
}

/* Programmatic dependent launch (lower_pdl.c): before its grid wait, each lane asks L2 for the
 * weight chunks of its first steps in the block's first virtual block (every row of its unit),
 * through the format's own chunk load turned into prefetches. The weight stream then starts while
 * the previous kernel ends; x, which that kernel writes, is read after the wait. Steps: 1 to
 * GV_PREFETCH, so that all resident blocks together ask for about GV_PREFETCH_BYTES (what ~1.5 us
 * of an H100's previous-kernel tail streams): more would push lines out of L2 before their use
 * (a llama-7b gate/up matrix is 180 MB). Tuning knobs until measured. */
#define GV_PREFETCH 4
#define GV_PREFETCH_BYTES (4 << 20)
static void prefetch_first(gv *s, uint32_t bid, uint32_t tid, uint32_t lane)
{
    kiln_kir *k = s->k;
    const kiln_graph *g = s->g;
    uint32_t gw = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, bid, WARPS), kiln_kshri(k, tid, 5));
    int64_t resident = (int64_t)s->tgt->sm_count * (2048 / (32 * WARPS)); /* blocks of 256 threads an SM holds at most */
    int64_t blocks = k->grid[0] < resident ? k->grid[0] : resident, per_warp = GV_PREFETCH_BYTES / (blocks > 0 ? blocks : 1) / WARPS;
    for (int q = 0; q < s->n_grp; q++) {
        const gv_group *G = &s->grp[q];
        kiln_dtype t = (kiln_dtype)g->nodes[g->nodes[s->mm[G->sib[0]]].src[1]].dtype;
        int64_t cpr = kl_gv_steps_per_row(s, t), step = 32 * (int64_t)G->wpu;
        int64_t steps = per_warp / ((s->pair ? 1024 : 512) * G->n_sib * G->cols); /* a step: 16 (pairs 32) bytes a lane of every row */
        steps = steps < 1 ? 1 : steps > GV_PREFETCH ? GV_PREFETCH : steps;
        uint32_t end = q + 1 < s->n_grp ? s->grp[q + 1].warp0 : k->grid[0] * WARPS;
        uint32_t gl = kiln_k2(k, KILN_KOP_SUB, gw, kiln_ki(k, (int32_t)G->warp0));
        uint32_t u = kiln_k2(k, KILN_KOP_DIV, gl, kiln_ki(k, G->wpu)), wi = kiln_k2(k, KILN_KOP_REM, gl, kiln_ki(k, G->wpu));
        kiln_kif(k, kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, (int32_t)G->warp0), gw),
                            kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LT, gw, kiln_ki(k, (int32_t)end)),
                                    kiln_k2(k, KILN_KOP_LT, u, kiln_ki(k, (int32_t)G->units)))));
        int deltas[SLOTS];
        uint32_t base = kl_gv_unit_base(s, G, u, deltas), c0 = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, wi, 32), lane);
        for (int64_t h = 0; h < steps && h * step < cpr; h++) {
            uint32_t c = kiln_k2(k, KILN_KOP_MIN, kiln_kaddi(k, c0, (int32_t)(h * step)), kiln_ki(k, (int32_t)(cpr - 1)));
            for (int sb = 0; sb < G->n_sib; sb++)
                for (int cl = 0; cl < G->cols; cl++) {
                    uint32_t slot = kiln_kir_buf(k, KILN_KBUF_NODE, g->nodes[s->mm[G->sib[sb]]].src[1], false);
                    uint32_t col = kl_gv_partial(G) ? kl_gv_slot_col(s, G, base, deltas, cl) : kiln_kaddi(k, base, deltas[cl]);
                    uint32_t row = kiln_k2(k, KILN_KOP_MIN, col, kiln_ki(k, (int32_t)(G->n - 1)));
                    gv_chunk ch;
                    uint32_t from = k->n_ins;
                    gv_load_step(s, t, slot, row, c, s->pair ? kiln_kandi(k, c0, 7) : KILN_IDX_NONE, G->n, &ch);
                    kl_pdl_prefetch_tail(k, from);
                }
        }
        kiln_kendif(k);
    }
}

/* KILN_PDL_REGS (and codegen.gemv_preload, without pdl): before the grid wait and x's prologue each
 * lane loads the weights of its first step in its block's first virtual block (every slot of its
 * unit, both chunks of a two-chunk step) into the pre_* variables, as the published H100
 * measurement's kernels do (docs/kernels.md): all of a small matrix's weights are in flight while
 * the previous kernel ends (with pdl) or while x is normalized and quantized. peel_first uses them.
 * Variables are shared by the groups (a warp is in one). */
static void preload_first(gv *s, uint32_t bid, uint32_t tid, uint32_t lane)
{
    kiln_kir *k = s->k;
    const kiln_graph *g = s->g;
    make_pre_vars(s);
    uint32_t gw = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, bid, WARPS), kiln_kshri(k, tid, 5));
    for (int q = 0; q < s->n_grp; q++) {
        const gv_group *G = &s->grp[q];
        kiln_dtype t = (kiln_dtype)g->nodes[g->nodes[s->mm[G->sib[0]]].src[1]].dtype;
        uint32_t end = q + 1 < s->n_grp ? s->grp[q + 1].warp0 : k->grid[0] * WARPS;
        kiln_kif(k, kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LE, kiln_ki(k, (int32_t)G->warp0), gw),
                            kiln_k2(k, KILN_KOP_LT, gw, kiln_ki(k, (int32_t)end))));
        gv_unit un;
        uint32_t u, wi, slot_w[SLOTS], row[SLOTS];
        set_unit(s, G, gw, &un, &u, &wi, slot_w, row);
        int64_t cpr = kl_gv_steps_per_row(s, t);
        uint32_t c0 = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, wi, 32), lane), pm = s->pair ? kiln_kandi(k, c0, 7) : KILN_IDX_NONE;
        /* clamped into the row (a lane past it loads the row's last step and never uses it); a
         * two-chunk step's second chunk is inside whenever its first is (cpr % (64 wpu) == 0) */
        uint32_t c = kiln_k2(k, KILN_KOP_MIN, c0, kiln_ki(k, (int32_t)(cpr - 1 - (two_step(s, G, t) ? 32 * G->wpu : 0))));
        load_into_vars(s, q, t, two_step(s, G, t), G->wpu, c, pm, slot_w, row, un.n_slots, G->n);
        kiln_kendif(k);
    }
}

kiln_status kiln_lower_gemv(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                            char *err, size_t n_err)
{
    return kiln_lower_gemv_cap(g, r, tg, k, 0, err, n_err);
}

kiln_status kiln_lower_gemv_cap(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                                int64_t m_cap, char *err, size_t n_err)
{
    gv *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->tgt = tg;
    s->m_cap = m_cap;
    s->k = k;
    s->g = g;
    s->r = r;
    s->pair_ok = true;
    kiln_kir_init(k, "kiln_gemv", 32 * WARPS);
    kiln_status st = KILN_OK;
    if (!kl_gv_analyze(s, err, n_err)) {
        st = KILN_ERR_UNSUPPORTED;
        goto out;
    }
    s->u.mc = s->mc; /* the epilogue stores every token of a pass */
    snprintf(k->what, sizeof k->what, "gemv %s x%d%s%s, %u ops",
             kiln_dtype_name((kiln_dtype)g->nodes[g->nodes[s->mm[0]].src[1]].dtype), s->n_mm,
             s->norm != KILN_IDX_NONE ? " + rms_norm" : "", s->pair ? " (int8 dot, pairs)" : s->dp4a ? " (int8 dot)" : "", r->n_nodes);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bid = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t lane = kiln_k2(s->k, KILN_KOP_AND, tid, kiln_ki(s->k, 31));
    uint32_t gw = kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, bid, kiln_ki(s->k, WARPS)),
                          kiln_k2(s->k, KILN_KOP_SHR, tid, kiln_ki(s->k, 5)));
    uint32_t m = kiln_k2(s->k, KILN_KOP_DIV, kl_numel_from(k, &g->nodes[s->x], 0), kiln_ki(s->k, (int32_t)s->K));
    if (s->dp4a) {
        s->sh_xq = kiln_kir_shared(k, (uint32_t)(s->mc * s->K / 4));
        s->sh_dx = kiln_kir_shared(k, (uint32_t)(s->mc * s->K / 32));
        s->sh_xs = kiln_kir_shared(k, (uint32_t)(s->mc * s->K / 32));
    }
    /* Decode (every token in one pass): the norm and x's quantization run once per block, which
     * then strides over the virtual blocks; a launcher may run as few blocks as fill the GPU. */
    s->hoisted = s->m_max <= s->mc;
    /* codegen.gemv_xload: one token's f32 x in 16-byte words a thread, all loaded at once */
    for (int i = 0; i < XL_MAX; i++) s->xl_v[i] = KILN_IDX_NONE;
    if (tg->opts.gemv_xload == KILN_GEMM_ON && s->hoisted && s->mc == 1 && s->xdt == KILN_DTYPE_F32 && s->K % 4 == 0 &&
        (s->K / 4 + 32 * WARPS - 1) / (32 * WARPS) <= XL_MAX)
        s->xl_n = (int)((s->K / 4 + 32 * WARPS - 1) / (32 * WARPS));
    /* Float weights behind an rms_norm, in one pass, read x from shared memory, normalized once per
     * block: the loop's loads are then all weight streams (within the target's shared memory).
     * Without a norm the prologue would only delay the first weight loads. */
    s->xstage = s->hoisted && s->norm != KILN_IDX_NONE && !s->dp4a && !s->scalar &&
                (uint64_t)s->mc * (uint64_t)s->K * 4 <= kiln_lower_smem_for(s->tgt, 32 * WARPS);
    for (int j = 0; j < s->n_mm; j++) { /* one chunk layout for every weight */
        kiln_dtype t = (kiln_dtype)g->nodes[g->nodes[s->mm[j]].src[1]].dtype;
        int v = fmt(t)->block ? 0 : fmt(t)->vec;
        if (!v || (j && v != s->xv)) s->xstage = false;
        s->xv = v;
    }
    if (s->xstage) s->sh_x = kiln_kir_shared(k, (uint32_t)(s->mc * s->K));
    uint32_t vb = KILN_IDX_NONE;
    if (s->hoisted) {
        if (kiln_lower_target_pdl(tg) && tg->opts.pdl == KILN_GEMM_ON) prefetch_first(s, bid, tid, lane); /* not KILN_PDL_NO_PREFETCH */
        /* KILN_PDL_REGS: before the grid wait; codegen.gemv_preload: the same loads at the kernel's
         * start without PDL, so that they are in flight while x's prologue runs */
        s->pre = (kiln_lower_target_pdl(tg) && tg->opts.pdl == KILN_PDL_REGS) || tg->opts.gemv_preload == KILN_GEMM_ON;
        if (s->pre) preload_first(s, bid, tid, lane);
        /* codegen.gemv_pipeline: not with pre (its peeled first step); its variables are pre's */
        s->pipe = !s->pre && tg->opts.gemv_pipeline == KILN_GEMM_ON;
        if (s->pipe) make_pre_vars(s);
        s->u.t0 = kiln_ki(s->k, 0);
        kl_gv_pass_prologue(s, tid, m);
        k->grid_stride = true;
        vb = kiln_kvar(k, bid);
        s->vb = vb, s->bid = bid;
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, vb, kiln_ki(s->k, (int32_t)k->grid[0]),
                    kiln_kir_op(k, KILN_KOP_NBID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0), 0);
        gw = kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, vb, kiln_ki(s->k, WARPS)),
                     kiln_k2(s->k, KILN_KOP_SHR, tid, kiln_ki(s->k, 5)));
    }
    for (int q = 0; q < s->n_grp; q++) {
        const gv_group *G = &s->grp[q];
        uint32_t end = q + 1 < s->n_grp ? s->grp[q + 1].warp0 : k->grid[0] * WARPS;
        kiln_kif(s->k, kiln_k2(s->k, KILN_KOP_PAND, kiln_k2(s->k, KILN_KOP_LE, kiln_ki(s->k, (int32_t)G->warp0), gw),
                               kiln_k2(s->k, KILN_KOP_LT, gw, kiln_ki(s->k, (int32_t)end))));
        emit_group(s, G, gw, lane, tid, m);
        kiln_kendif(s->k);
    }
    if (s->hoisted) kl_loop_end(k);
    if (s->failed) st = kl_unsupported(err, n_err, "gemv: %s", s->why);
out:
    if (st != KILN_OK) kiln_kir_free(k);
    free(s);
    return st;
}
