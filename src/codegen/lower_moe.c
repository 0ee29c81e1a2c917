/* moe_matmul on the GPUs (kiln.h; docs/kernels.md): a block per (token, slot, 32 columns), or per
 * (token, 32 columns) with sum; it ranks the token's router row in shared memory (kiln_moe_slots'
 * order), then a warp per 4 columns dots x's row with those rows of each routed expert through the
 * weight format rows of wfmt.h. Only the routed experts' rows are read. Must not know any target's
 * syntax. */
#include "codegen/lower.h"
#include "codegen/wfmt.h"

#include <string.h>

#define MOE_BLOCK 256 /* 8 warps */
#define MOE_ROWS 4    /* columns (weight rows) a warp at most, sharing its x loads */
#define MOE_MAX_E MOE_BLOCK /* one thread per expert ranks the router row */

static void endif(kiln_kir *k) { kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void if_(kiln_kir *k, uint32_t p) { kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, p, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void barrier(kiln_kir *k) { kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void sts(kiln_kir *k, uint32_t arr, uint32_t i, uint32_t v) { kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, i, v, KILN_IDX_NONE, (int32_t)arr); }
static uint32_t mul(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_MUL, a, b); }
static uint32_t add(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_ADD, a, b); }

/* PRED: a ranks above b in a router row (a number above NaN). */
static uint32_t above(kiln_kir *k, uint32_t a, uint32_t b)
{
    uint32_t a_num = kiln_k2(k, KILN_KOP_EQ, a, a), b_nan = kiln_k2(k, KILN_KOP_NE, b, b);
    return kiln_k2(k, KILN_KOP_PAND, a_num, kiln_k2(k, KILN_KOP_POR, b_nan, kiln_k2(k, KILN_KOP_LT, b, a)));
}

/* Row t of r into shared sh_r, then thread j < E writes j into sh_slot[rank of j] when the rank is
 * below k. Ends with a barrier. */
static void rank_experts(kiln_kir *k, const kiln_graph *g, uint32_t rnode, uint32_t t, uint32_t tid, int64_t E,
                         int64_t kk, uint32_t sh_r, uint32_t sh_slot)
{
    uint32_t is_e = kiln_k2(k, KILN_KOP_LT, tid, kiln_ki(k, (int32_t)E));
    barrier(k); /* the previous token's slots are read until here */
    if_(k, is_e);
    sts(k, sh_r, tid, kl_load_node(k, g, rnode, add(k, mul(k, t, kiln_ki(k, (int32_t)E)), tid)));
    endif(k);
    barrier(k);
    if_(k, is_e);
    uint32_t mine = kiln_klds(k, sh_r, KILN_KT_F32, tid), rank = kiln_kvar(k, kiln_ki(k, 0));
    uint32_t i = kiln_kvar(k, kiln_ki(k, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, i, kiln_ki(k, (int32_t)E), kiln_ki(k, 1), 0);
    uint32_t other = kiln_klds(k, sh_r, KILN_KT_F32, i);
    uint32_t tie = kiln_k2(k, KILN_KOP_PAND, kiln_k1(k, KILN_KOP_PNOT, above(k, mine, other)),
                           kiln_k2(k, KILN_KOP_LT, i, tid)); /* not below it and earlier: ranked before */
    uint32_t before = kiln_k2(k, KILN_KOP_POR, above(k, other, mine), tie);
    kiln_kset(k, rank, add(k, rank, kiln_ksel(k, KILN_KT_I32, before, kiln_ki(k, 1), kiln_ki(k, 0))));
    kl_loop_end(k);
    if_(k, kiln_k2(k, KILN_KOP_LT, rank, kiln_ki(k, (int32_t)kk)));
    sts(k, sh_slot, rank, kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_U32, tid, KILN_IDX_NONE, KILN_IDX_NONE, 0)); /* same bits */
    endif(k);
    endif(k);
    barrier(k);
}

/* This lane's part of x[xrow .. xrow + K) . W[row[j]] for the warp's nr rows, over chunks
 * lane, lane + 32, ...: each x value is loaded once for all of them. F32 into acc[j]. */
static void lane_dot(kiln_kir *k, const kiln_graph *g, const kl_wfmt *f, uint32_t xnode, uint32_t wslot,
                     const uint32_t row[MOE_ROWS], uint32_t xrow, uint32_t lane, int64_t K, int64_t rows,
                     int nr, uint32_t acc[MOE_ROWS], bool *bad)
{
    for (int j = 0; j < nr; j++) acc[j] = kiln_kvar(k, kiln_kf(k, 0.0f));
    uint32_t c = kiln_kvar(k, lane);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, c, kiln_ki(k, (int32_t)kl_wfmt_chunks(f, K)), kiln_ki(k, 32), 0);
    gv_chunk ch[MOE_ROWS];
    memset(ch, 0, sizeof ch);
    for (int j = 0; j < nr; j++) f->load(k, wslot, row[j], c, K, rows, &ch[j]); /* all in flight first */
    for (int sub = 0; sub < f->subs; sub++) {
        uint32_t e0 = add(k, xrow, f->sub_elem(k, c, sub)), xv[16], sx = KILN_IDX_NONE;
        int V = f->vec; /* values of a sub-step */
        if (g->nodes[xnode].dtype == KILN_DTYPE_F32 && V % 4 == 0) /* 16-byte loads, as gemv's */
            for (int i = 0; i < V; i += 4) {
                uint32_t v4 = kiln_kld4(k, kiln_kir_buf(k, KILN_KBUF_NODE, xnode, false), add(k, e0, kiln_ki(k, i)));
                for (int l = 0; l < 4; l++) xv[i + l] = kl_lanef(k, v4, l);
            }
        else
            for (int i = 0; i < V; i++) xv[i] = kl_load_node(k, g, xnode, add(k, e0, kiln_ki(k, i)));
        for (int j = 0; j < nr; j++) { /* a row decoded just before its products: fewer live values */
            gv_sub w;
            w.b = KILN_IDX_NONE;
            f->decode(k, &ch[j], c, sub, &w);
            if (w.v != V) *bad = true; /* a format whose sub-steps are not vec values: refused */
            if (w.a == KILN_IDX_NONE) { /* float weights: straight into the accumulator */
                uint32_t a = acc[j];
                for (int i = 0; i < V; i++) a = kiln_kfma(k, w.q[i], xv[i], a);
                kiln_kset(k, acc[j], a);
                continue;
            }
            uint32_t d = mul(k, w.q[0], xv[0]); /* value i = a q[i] + b: a dot(q, x) + b sum(x) */
            for (int i = 1; i < V; i++) d = kiln_kfma(k, w.q[i], xv[i], d);
            uint32_t a = kiln_kfma(k, w.a, d, acc[j]);
            if (w.b != KILN_IDX_NONE) {
                if (sx == KILN_IDX_NONE) {
                    sx = xv[0];
                    for (int i = 1; i < V; i++) sx = add(k, sx, xv[i]);
                }
                a = kiln_kfma(k, w.b, sx, a);
            }
            kiln_kset(k, acc[j], a);
        }
    }
    kl_loop_end(k);
}

kiln_status kiln_lower_moe_matmul(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                                  char *err, size_t n_err)
{
    uint32_t anchor = r->anchor;
    const kiln_node_rec *n = &g->nodes[anchor];
    uint32_t xn = n->src[0], wn = n->src[1], rn = n->src[2];
    const kiln_node_rec *x = &g->nodes[xn], *w = &g->nodes[wn];
    int64_t E = w->dims[0], N = w->dims[1], K = w->dims[2], kk = n->i[0];
    bool per_slot = x->rank == 3, sum = n->i[1] != 0;
    const kl_wfmt *f = kl_wfmt_of((kiln_dtype)w->dtype);
    if (r->n_nodes != 1) return kl_unsupported(err, n_err, "moe_matmul: fused with other ops");
    if (w->op != KILN_OP_WEIGHT || !f)
        return kl_unsupported(err, n_err, "moe_matmul: the stack must be a weight of a GPU format (%s)",
                              kiln_dtype_name((kiln_dtype)w->dtype));
    if (E > MOE_MAX_E) return kl_unsupported(err, n_err, "moe_matmul: %lld experts, at most %d on the GPU", (long long)E, MOE_MAX_E);
    if (K % (f->vec * f->subs) != 0 || K > INT32_MAX / 4 || E * N > INT32_MAX)
        return kl_unsupported(err, n_err, "moe_matmul: K = %lld is not a multiple of %d (%s chunks) on the GPU", (long long)K,
                              f->vec * f->subs, kiln_dtype_name((kiln_dtype)w->dtype));
    kiln_kir_init(k, "kiln_moe_matmul", MOE_BLOCK);
    k->min_blocks = 2; /* at most 128 registers: two blocks an SM (the k-quants' decoders of 4 rows took up to 175) */
    snprintf(k->what, sizeof k->what, "moe_matmul %s [%lld, %lld, %lld] k %lld%s", kiln_dtype_name((kiln_dtype)w->dtype),
             (long long)E, (long long)N, (long long)K, (long long)kk, sum ? " sum" : "");
    /* rows a warp: 4 where a row's decode is light; 2 for the k-quants, whose decoders of 4 rows
     * took up to 244 registers (q6_K) */
    int nr = f->block && kiln_dtype_block((kiln_dtype)w->dtype) == 256 ? 2 : MOE_ROWS;
    /* with sum, G warps share a column group, each taking every G-th slot (a decode's 8 slots of a
     * column in parallel, not one after another), their totals added through shared memory */
    int G = 1;
    while (sum && G * 2 <= kk && G * 2 <= MOE_BLOCK / 32) G *= 2;
    int cols = MOE_BLOCK / 32 / G * nr, iters = sum ? (int)((kk + G - 1) / G) : 1;
    int64_t cb = (N + cols - 1) / cols, per_tok = cb * (sum ? 1 : kk); /* blocks of a token */
    k->grid[0] = kl_grid_for(tg, kl_dim_max(g, g->nodes[rn].dims[0]) * per_tok, 1);
    uint32_t sh_r = kiln_kir_shared(k, (uint32_t)E), sh_slot = kiln_kir_shared(k, (uint32_t)kk);
    uint32_t sh_part = G > 1 ? kiln_kir_shared(k, (uint32_t)(MOE_BLOCK / 32 * nr)) : KILN_IDX_NONE; /* warps' totals */
    uint32_t wslot = kiln_kir_buf(k, KILN_KBUF_NODE, wn, false);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t lane = kiln_k2(k, KILN_KOP_REM, tid, kiln_ki(k, 32)), warp = kiln_k2(k, KILN_KOP_DIV, tid, kiln_ki(k, 32));
    uint32_t n_tok = kl_dim(k, g->nodes[rn].dims[0]), units = mul(k, n_tok, kiln_ki(k, (int32_t)per_tok));
    uint32_t pairs = mul(k, n_tok, kiln_ki(k, (int32_t)(sum ? 1 : kk))); /* (token, slot) blocks of a column block */
    uint32_t vb = kiln_kvar(k, kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, vb, units, kiln_ki(k, (int32_t)k->grid[0]), 0);
    /* column block major: the blocks in flight share a column range of the experts (every expert's
     * slice of it, 4.7 MB for qwen3-30b-a3b's gate, stays in L2), so a prefill's tokens routed to an
     * expert read its rows from DRAM about once */
    uint32_t cbi = kiln_k2(k, KILN_KOP_DIV, vb, pairs), u = kiln_k2(k, KILN_KOP_REM, vb, pairs);
    uint32_t t = sum ? u : kiln_k2(k, KILN_KOP_DIV, u, kiln_ki(k, (int32_t)kk));
    uint32_t s0 = sum ? kiln_ki(k, 0) : kiln_k2(k, KILN_KOP_REM, u, kiln_ki(k, (int32_t)kk)); /* without sum: the block's slot */
    uint32_t gi = kiln_k2(k, KILN_KOP_DIV, warp, kiln_ki(k, G)), sl = kiln_k2(k, KILN_KOP_REM, warp, kiln_ki(k, G));
    uint32_t col0 = add(k, mul(k, cbi, kiln_ki(k, cols)), mul(k, gi, kiln_ki(k, nr)));
    uint32_t col[MOE_ROWS], in[MOE_ROWS], nc[MOE_ROWS], total[MOE_ROWS];
    for (int j = 0; j < nr; j++) {
        col[j] = add(k, col0, kiln_ki(k, j));
        in[j] = kiln_k2(k, KILN_KOP_PAND, kiln_k2(k, KILN_KOP_LT, col[j], kiln_ki(k, (int32_t)N)),
                        kiln_k2(k, KILN_KOP_EQ, lane, kiln_ki(k, 0))); /* lane 0 stores the column */
        nc[j] = kiln_k2(k, KILN_KOP_MIN, col[j], kiln_ki(k, (int32_t)(N - 1))); /* every warp reaches the reductions */
    }
    rank_experts(k, g, rn, t, tid, E, kk, sh_r, sh_slot);
    for (int j = 0; j < nr; j++) total[j] = kiln_kvar(k, kiln_kf(k, 0.0f));
    uint32_t it = kiln_kvar(k, kiln_ki(k, 0)); /* the same trip count in every warp: the reductions are block-uniform */
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, it, kiln_ki(k, iters), kiln_ki(k, 1), 0);
    uint32_t s_raw = sum ? add(k, sl, mul(k, it, kiln_ki(k, G))) : s0;
    uint32_t valid = kiln_k2(k, KILN_KOP_LT, s_raw, kiln_ki(k, (int32_t)kk));
    uint32_t s = kiln_k2(k, KILN_KOP_MIN, s_raw, kiln_ki(k, (int32_t)(kk - 1)));
    uint32_t e = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32, kiln_klds(k, sh_slot, KILN_KT_U32, s), KILN_IDX_NONE,
                             KILN_IDX_NONE, 0); /* the expert of slot s */
    uint32_t row[MOE_ROWS], part[MOE_ROWS];
    for (int j = 0; j < nr; j++) row[j] = add(k, mul(k, e, kiln_ki(k, (int32_t)N)), nc[j]);
    uint32_t tok_s = add(k, mul(k, t, kiln_ki(k, (int32_t)kk)), s); /* the (token, slot) pair */
    uint32_t xrow = mul(k, per_slot ? tok_s : t, kiln_ki(k, (int32_t)K));
    bool bad = false;
    lane_dot(k, g, f, xn, wslot, row, xrow, lane, K, E * N, nr, part, &bad);
    uint32_t rw = sum ? kiln_klds(k, sh_r, KILN_KT_F32, e) : KILN_IDX_NONE;
    for (int j = 0; j < nr; j++) {
        uint32_t dot = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, part[j], KILN_IDX_NONE, KILN_IDX_NONE,
                                   (int32_t)((KILN_KRED_SUM << 16) | 32));
        if (sum) {
            kiln_kset(k, total[j], kiln_ksel(k, KILN_KT_F32, valid, kiln_kfma(k, rw, dot, total[j]), total[j]));
            continue;
        }
        if_(k, in[j]);
        kl_store_node(k, g, anchor, add(k, mul(k, tok_s, kiln_ki(k, (int32_t)N)), col[j]), dot);
        endif(k);
    }
    kl_loop_end(k);
    if (G > 1) { /* the group's warps' totals, added in warp order by its first warp */
        uint32_t first = kiln_k2(k, KILN_KOP_EQ, lane, kiln_ki(k, 0));
        if_(k, first);
        for (int j = 0; j < nr; j++) sts(k, sh_part, add(k, mul(k, warp, kiln_ki(k, nr)), kiln_ki(k, j)), total[j]);
        endif(k);
        barrier(k);
        for (int j = 0; j < nr; j++) {
            uint32_t a = kiln_kf(k, 0.0f);
            for (int q = 0; q < G; q++)
                a = add(k, a, kiln_klds(k, sh_part, KILN_KT_F32,
                                        add(k, mul(k, add(k, mul(k, gi, kiln_ki(k, G)), kiln_ki(k, q)), kiln_ki(k, nr)),
                                            kiln_ki(k, j))));
            kiln_kset(k, total[j], a);
        }
    }
    for (int j = 0; sum && j < nr; j++) {
        if_(k, kiln_k2(k, KILN_KOP_PAND, in[j], kiln_k2(k, KILN_KOP_EQ, sl, kiln_ki(k, 0))));
        kl_store_node(k, g, anchor, add(k, mul(k, t, kiln_ki(k, (int32_t)N)), col[j]), total[j]);
        endif(k);
    }
    kl_loop_end(k);
    if (bad) {
        kiln_kir_free(k);
        return kl_unsupported(err, n_err, "moe_matmul: %s sub-steps are not %d values", kiln_dtype_name((kiln_dtype)w->dtype),
                              f->vec);
    }
    return KILN_OK;
}
