/* The gemv's x (lower_gemv.c's prologue): each pass's rows of x, their rms_norm scales, x quantized
 * per 32 into shared memory for integer dot products or staged normalized for float weights, and
 * the normalized x as a region output. codegen.gemv_xload's batched loads live here. Must not know
 * any target's syntax, nor how weights are read. */
#include "codegen/lower_mm.h"
#include "codegen/wfmt.h"

/* x's words j .. (4 values from 4 j) of token q quantized into the shared arrays (quantize_x's body):
 * v4 the values as loaded (F32 x: a V4; else NONE and each is loaded here), n4 the norm weights'. */
static void quantize_words(gv *s, int q, bool qsum, uint32_t j, uint32_t valid, uint32_t xb, uint32_t v4, uint32_t n4, uint32_t xs)
{
    kiln_kir *k = s->k;
    int32_t W = (int32_t)(s->K / 4), G = (int32_t)(s->K / 32);
    {
        uint32_t x[4];
        uint32_t amax = KILN_IDX_NONE, sum = KILN_IDX_NONE;
        for (int l = 0; l < 4; l++) {
            x[l] = v4 != KILN_IDX_NONE ? kl_lanef(k, v4, l)
                                       : kl_load(k, xs, s->xdt, kiln_k2(s->k, KILN_KOP_ADD, xb, kiln_ki(s->k, l)));
            if (s->nsc[q] != KILN_IDX_NONE) x[l] = kiln_k2(s->k, KILN_KOP_MUL, x[l], s->nsc[q]);
            if (n4 != KILN_IDX_NONE)
                x[l] = kiln_k2(s->k, KILN_KOP_MUL, x[l],
                               kl_lanef(k, n4, l));
            uint32_t a = kiln_k1(k, KILN_KOP_ABS, x[l]);
            amax = l ? kiln_k2(s->k, KILN_KOP_MAX, amax, a) : a;
            if (!qsum) sum = l ? kiln_k2(s->k, KILN_KOP_ADD, sum, x[l]) : x[l];
        }
        amax =
            kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, amax, KILN_IDX_NONE, KILN_IDX_NONE, (KILN_KRED_MAX << 16) | 8);
        if (!qsum)
            sum = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, sum, KILN_IDX_NONE, KILN_IDX_NONE,
                              (KILN_KRED_SUM << 16) | 8);
        uint32_t pos = kiln_k2(s->k, KILN_KOP_LT, kiln_kf(s->k, 0.0f), amax);
        uint32_t inv =
            kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, pos,
                        kiln_k2(s->k, KILN_KOP_DIV, kiln_kf(s->k, 127.0f),
                                kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, pos, amax, kiln_kf(s->k, 1.0f), 0)),
                        kiln_kf(s->k, 0.0f), 0);
        uint32_t packed = KILN_IDX_NONE;
        for (int l = 0; l < 4; l++) {
            uint32_t qf = kiln_k1(k, KILN_KOP_RINT, kiln_k2(s->k, KILN_KOP_MUL, x[l], inv));
            if (qsum) sum = l ? kiln_k2(s->k, KILN_KOP_ADD, sum, qf) : qf; /* integers: exact in f32 */
            uint32_t qv = kiln_kcvt(s->k, KILN_KT_U32, kiln_kcvt(s->k, KILN_KT_I32, qf));
            qv = kiln_k2(s->k, KILN_KOP_AND, qv, kiln_ku(k, 255));
            if (l) qv = kiln_k2(s->k, KILN_KOP_SHL, qv, kiln_ku(k, 8u * (uint32_t)l));
            packed = l ? kiln_k2(s->k, KILN_KOP_OR, packed, qv) : qv;
        }
        if (qsum)
            sum = kiln_k2(s->k, KILN_KOP_MUL,
                          kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, sum, KILN_IDX_NONE, KILN_IDX_NONE,
                                      (KILN_KRED_SUM << 16) | 8),
                          kiln_k2(s->k, KILN_KOP_DIV, amax, kiln_kf(s->k, 127.0f))); /* the quants' sum, as x */
        kiln_kif(s->k, valid);
        kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, kiln_k2(s->k, KILN_KOP_ADD, kiln_ki(s->k, q * W), j), packed,
                    KILN_IDX_NONE, (int32_t)s->sh_xq);
        kiln_kif(s->k, kiln_k2(s->k, KILN_KOP_EQ, kiln_k2(s->k, KILN_KOP_AND, j, kiln_ki(s->k, 7)), kiln_ki(s->k, 0)));
        uint32_t gi =
            kiln_k2(s->k, KILN_KOP_ADD, kiln_ki(s->k, q * G), kiln_k2(s->k, KILN_KOP_SHR, j, kiln_ki(s->k, 3)));
        kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, gi, kiln_k2(s->k, KILN_KOP_DIV, amax, kiln_kf(s->k, 127.0f)),
                    KILN_IDX_NONE, (int32_t)s->sh_dx);
        kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, gi, sum, KILN_IDX_NONE, (int32_t)s->sh_xs);
        kiln_kendif(s->k);
        kiln_kendif(s->k);
    }
}

/* codegen.gemv_xload: thread tid's words tid + 256 i (i < xl_n) of x's row, each a 16-byte load, all
 * issued before any is used (one memory round trip where a loop over them took one each). Cached in
 * s->xl_v by the norm's pass (same words), else loaded here. */
static void xl_words(gv *s, uint32_t tid, uint32_t tt, uint32_t j[XL_MAX], uint32_t valid[XL_MAX], uint32_t e[XL_MAX],
                     uint32_t xb[XL_MAX])
{
    kiln_kir *k = s->k;
    int32_t W = (int32_t)(s->K / 4), nt = 32 * WARPS;
    for (int i = 0; i < s->xl_n; i++) {
        j[i] = kiln_kaddi(k, tid, i * nt);
        valid[i] = (i + 1) * nt <= W ? KILN_IDX_NONE : kiln_k2(k, KILN_KOP_LT, j[i], kiln_ki(k, W)); /* NONE: always */
        e[i] = kiln_kmuli(k, valid[i] == KILN_IDX_NONE ? j[i] : kiln_ksel(k, KILN_KT_I32, valid[i], j[i], kiln_ki(k, 0)), 4);
        xb[i] = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, tt, W * 4), e[i]);
    }
}

/* dp4a path: the block quantizes (normalized) x of the pass's tokens into shared memory, per 32
 * values: int8 quants (rint(x * 127 / amax)), the scale amax / 127 and, for q4_K/q5_K, the sum of
 * the 32 values *as quantized* (their min term). The min term must see the same x as the scale
 * term: with the exact sum, the rounding error of x is weighted by w + dmin * min (all >= 0)
 * instead of w, several times the contract's NMSE for weights centred on 0 (issue #17; ggml's
 * q8_K bsums and kiln's CPU kernels sum the quants too). Every thread takes 4 values; 8 threads
 * make a group. */
static void quantize_x(gv *s, uint32_t tid, const uint32_t *tt, uint32_t xs, uint32_t nws)
{
    kiln_kir *k = s->k;
    int32_t W = (int32_t)(s->K / 4), nt = 32 * WARPS;
    bool qsum = false; /* a weight with mins (q4_K, q5_K, q4_1, q5_1) reads the sums; the others print as before */
    for (int j = 0; j < s->n_mm; j++) qsum |= kl_wfmt_of((kiln_dtype)s->g->nodes[s->g->nodes[s->mm[j]].src[1]].dtype)->dp4a_mins;
    kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE,
                0); /* the last pass's readers are done */
    for (int q = 0; q < s->mc; q++) {
        if (s->xl_n) { /* codegen.gemv_xload: every word's loads first (x's from the norm's pass when it ran) */
            uint32_t j[XL_MAX], valid[XL_MAX], e[XL_MAX], xb[XL_MAX], v4[XL_MAX], n4[XL_MAX];
            xl_words(s, tid, tt[q], j, valid, e, xb);
            for (int b = 0; b < s->xl_n; b += XL_BATCH) { /* batches of loads in flight together */
                int end = b + XL_BATCH < s->xl_n ? b + XL_BATCH : s->xl_n;
                for (int i = b; i < end; i++) {
                    v4[i] = s->xl_v[i] != KILN_IDX_NONE ? s->xl_v[i] : kiln_kld4(k, xs, xb[i]);
                    n4[i] = nws != KILN_IDX_NONE ? kiln_kld4(k, nws, e[i]) : KILN_IDX_NONE;
                }
                for (int i = b; i < end; i++)
                    quantize_words(s, q, qsum, j[i], valid[i] == KILN_IDX_NONE ? kiln_k2(k, KILN_KOP_LT, j[i], kiln_ki(k, W)) : valid[i],
                                   xb[i], v4[i], n4[i], xs);
            }
            continue;
        }
        uint32_t j = kiln_kvar(k, tid);
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, kiln_ki(s->k, (W + nt - 1) / nt * nt), kiln_ki(s->k, nt),
                    0); /* uniform trip count */
        uint32_t valid = kiln_k2(s->k, KILN_KOP_LT, j, kiln_ki(s->k, W));
        uint32_t e =
            kiln_k2(s->k, KILN_KOP_MUL, kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, valid, j, kiln_ki(s->k, 0), 0),
                    kiln_ki(s->k, 4));
        uint32_t xb = kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, tt[q], kiln_ki(s->k, W * 4)), e);
        uint32_t v4 = s->xdt == KILN_DTYPE_F32 ? kiln_kld4(s->k, xs, xb) : KILN_IDX_NONE;
        uint32_t n4 = nws != KILN_IDX_NONE ? kiln_kld4(s->k, nws, e) : KILN_IDX_NONE;
        quantize_words(s, q, qsum, j, valid, xb, v4, n4, xs);
        kl_loop_end(k);
    }
    kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

/* x[idx] * the norm scale of token q of the pass * the norm weight at column j (each when fused). */
static uint32_t x_normed(gv *s, uint32_t xs, uint32_t nws, int q, uint32_t idx, uint32_t j)
{
    uint32_t v = kl_load(s->k, xs, s->xdt, idx);
    if (s->nsc[q] != KILN_IDX_NONE) v = kiln_k2(s->k, KILN_KOP_MUL, v, s->nsc[q]);
    if (nws != KILN_IDX_NONE) v = kiln_k2(s->k, KILN_KOP_MUL, v, kl_load(s->k, nws, KILN_DTYPE_F32, j));
    return v;
}

/* Token t's row of x, for the norm's scaled passes (kl_row.at). */
typedef struct x_row {
    gv      *s;
    uint32_t xs, t; /* x's slot, I32 token */
} x_row;

static uint32_t x_at(void *p, uint32_t j)
{
    x_row *r = p;
    kiln_kir *k = r->s->k;
    return kl_load(k, r->xs, r->s->xdt, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, r->t, kiln_ki(k, (int32_t)r->s->K)), j));
}

/* The start of a pass over tokens t0 .. t0 + mc - 1: their rows of x, the rms_norm scale of each
 * (the whole block reduces over x's row) and, for integer dot products, x quantized into shared
 * memory. Block-uniform: every thread of the block runs it. */
void kl_gv_pass_prologue(gv *s, uint32_t tid, uint32_t m)
{
    kiln_kir *k = s->k;
    int64_t K = s->K;
    uint32_t xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    uint32_t nws = s->nw != KILN_IDX_NONE ? kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false) : KILN_IDX_NONE;
    for (int q = 0; q < s->mc; q++) /* clamped into 0 .. m - 1 (row 0 when m = 0: its stores are all guarded) */
        s->tt[q] =
            kiln_k2(s->k, KILN_KOP_MAX,
                    kiln_k2(s->k, KILN_KOP_MIN, kl_gv_tok(s, &s->u, q), kiln_k2(s->k, KILN_KOP_SUB, m, kiln_ki(s->k, 1))),
                    kiln_ki(s->k, 0));
    for (int q = 0; q < s->mc; q++) {
        if (s->norm == KILN_IDX_NONE) {
            s->nsc[q] = KILN_IDX_NONE;
            continue;
        }
        uint32_t ss;
        if (s->xl_n) { /* codegen.gemv_xload: the thread's words of x in 16-byte loads issued together, kept for quantize_x */
            uint32_t j[XL_MAX], valid[XL_MAX], e[XL_MAX], xb[XL_MAX];
            xl_words(s, tid, s->tt[q], j, valid, e, xb);
            ss = kiln_kf(k, 0);
            uint32_t v[XL_MAX];
            for (int b = 0; b < s->xl_n; b += XL_BATCH) { /* batches of loads in flight together */
                int end = b + XL_BATCH < s->xl_n ? b + XL_BATCH : s->xl_n;
                for (int i = b; i < end; i++) v[i] = kiln_kld4(k, xs, xb[i]);
                for (int i = b; i < end; i++) {
                    uint32_t p = kiln_kf(k, 0);
                    for (int l = 0; l < 4; l++) {
                        uint32_t xv = kl_lanef(k, v[i], l);
                        p = kiln_kfma(k, xv, xv, p);
                    }
                    ss = kiln_k2(k, KILN_KOP_ADD, ss, valid[i] == KILN_IDX_NONE ? p : kiln_ksel(k, KILN_KT_F32, valid[i], p, kiln_kf(k, 0)));
                }
            }
            if (s->xl_n <= XL_BATCH) /* one batch: kept in registers for the quantization / staging */
                for (int i = 0; i < s->xl_n; i++) s->xl_v[i] = v[i];
        } else {
            ss = kiln_kvar(k, kiln_kf(s->k, 0));
            uint32_t j = kiln_kvar(k, tid);
            kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, kiln_ki(s->k, (int32_t)K), kiln_ki(s->k, 32 * WARPS), 0);
            uint32_t xv =
                kl_load(k, xs, s->xdt,
                        kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, s->tt[q], kiln_ki(s->k, (int32_t)K)), j));
            kiln_kset(k, ss, kiln_kfma(s->k, xv, xv, ss));
            kl_loop_end(k);
        }
        uint32_t tot = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, ss, KILN_IDX_NONE, KILN_IDX_NONE,
                                   (KILN_KRED_SUM << 16) | (32 * WARPS));
        uint32_t qv = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_DIV, tot, kiln_kf(k, (float)K)), kiln_kf(k, s->eps));
        x_row xr = {s, xs, s->tt[q]};
        kl_row row = {.at = x_at, .ctx = &xr, .tid = tid, .n = kiln_ki(k, (int32_t)K), .nf = kiln_kf(k, (float)K), .step = 32 * WARPS};
        s->nsc[q] = kl_rms_scale(k, &row, qv, s->eps); /* f32 squares redone scaled when they over/underflowed */
    }
    if (s->dp4a) quantize_x(s, tid, s->tt, xs, nws);
    if (s->xstage && s->xl_n && s->xl_v[0] != KILN_IDX_NONE) { /* codegen.gemv_xload: from the norm's words */
        uint32_t j[XL_MAX], valid[XL_MAX], e[XL_MAX], xb[XL_MAX], n4[XL_MAX];
        xl_words(s, tid, s->tt[0], j, valid, e, xb);
        for (int i = 0; i < s->xl_n; i++) n4[i] = nws != KILN_IDX_NONE ? kiln_kld4(k, nws, e[i]) : KILN_IDX_NONE;
        for (int i = 0; i < s->xl_n; i++) {
            if (valid[i] != KILN_IDX_NONE) kiln_kif(k, valid[i]);
            for (int l = 0; l < 4; l++) {
                uint32_t jj = kiln_kaddi(k, e[i], l), xv = kl_lanef(k, s->xl_v[i], l);
                if (s->nsc[0] != KILN_IDX_NONE) xv = kiln_k2(k, KILN_KOP_MUL, xv, s->nsc[0]);
                if (n4[i] != KILN_IDX_NONE) xv = kiln_k2(k, KILN_KOP_MUL, xv, kl_lanef(k, n4[i], l));
                uint32_t at = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, kiln_k2(k, KILN_KOP_REM, jj, kiln_ki(k, s->xv)), (int32_t)(K / s->xv)),
                                      kiln_k2(k, KILN_KOP_DIV, jj, kiln_ki(k, s->xv)));
                kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, at, xv, KILN_IDX_NONE, (int32_t)s->sh_x);
            }
            if (valid[i] != KILN_IDX_NONE) kiln_kendif(k);
        }
        kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    } else if (s->xstage) { /* x * norm scale * norm weight, once per block */
        for (int q = 0; q < s->mc; q++) {
            uint32_t j = kiln_kvar(k, tid);
            kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, kiln_ki(s->k, (int32_t)K), kiln_ki(s->k, 32 * WARPS), 0);
            uint32_t xv = x_normed(
                s, xs, nws, q,
                kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, s->tt[q], kiln_ki(s->k, (int32_t)K)), j), j);
            uint32_t at = kiln_k2(s->k, KILN_KOP_ADD,
                                  kiln_k2(s->k, KILN_KOP_MUL, kiln_k2(s->k, KILN_KOP_REM, j, kiln_ki(s->k, s->xv)),
                                          kiln_ki(s->k, (int32_t)(K / s->xv))),
                                  kiln_k2(s->k, KILN_KOP_DIV, j, kiln_ki(s->k, s->xv)));
            kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, kiln_k2(s->k, KILN_KOP_ADD, kiln_ki(s->k, (int32_t)(q * K)), at),
                        xv, KILN_IDX_NONE, (int32_t)s->sh_x);
            kl_loop_end(k);
        }
        kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    }
}

/* The normalized x is a region output too: block 0 of the first group writes it (pass tokens
 * t0 .. t0 + mc - 1 below m). */
void kl_gv_store_normed_x(gv *s, uint32_t gw, uint32_t u, uint32_t lane, uint32_t m)
{
    kiln_kir *k = s->k;
    const kiln_graph *g = s->g;
    int64_t K = s->K;
    uint32_t xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    uint32_t nws = s->nw != KILN_IDX_NONE ? kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false) : KILN_IDX_NONE;
    kiln_kif(s->k, kiln_k2(s->k, KILN_KOP_EQ, gw,
                           kiln_k2(s->k, KILN_KOP_MUL, kiln_k2(s->k, KILN_KOP_DIV, gw, kiln_ki(s->k, WARPS)),
                                   kiln_ki(s->k, WARPS))));
    kiln_kif(s->k, kiln_k2(s->k, KILN_KOP_EQ, u, kiln_ki(s->k, 0)));
    for (int q = 0; q < s->mc; q++) {
        kiln_kif(s->k, kiln_k2(s->k, KILN_KOP_LT, kl_gv_tok(s, &s->u, q), m));
        uint32_t j = kiln_kvar(k, lane);
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, kiln_ki(s->k, (int32_t)K), kiln_ki(s->k, 32), 0);
        uint32_t idx =
            kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, kl_gv_tok(s, &s->u, q), kiln_ki(s->k, (int32_t)K)), j);
        kl_store_node(k, g, s->norm, idx, x_normed(s, xs, nws, q, idx, j));
        kl_loop_end(k);
        kiln_kendif(s->k);
    }
    kiln_kendif(s->k);
    kiln_kendif(s->k);
}

