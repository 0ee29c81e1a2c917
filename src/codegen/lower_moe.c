/* moe_matmul on the GPUs (kiln.h; docs/kernels.md): a block per (token, slot, 8 columns), or per
 * (token, 8 columns) with sum; it ranks the token's router row in shared memory (kiln_moe_slots'
 * order), then a warp per column dots x's row with that row of each routed expert through the
 * weight format rows of wfmt.h. Only the routed experts' rows are read. Must not know any target's
 * syntax. */
#include "codegen/lower.h"
#include "codegen/wfmt.h"

#include <string.h>

#define MOE_BLOCK 256 /* 8 warps, a column each */
#define MOE_COLS (MOE_BLOCK / 32)
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

/* This lane's part of x[xrow .. xrow + K) . W[row] over chunks lane, lane + 32, ... (F32). */
static uint32_t lane_dot(kiln_kir *k, const kiln_graph *g, const kl_wfmt *f, uint32_t xnode, uint32_t wslot,
                         uint32_t row, uint32_t xrow, uint32_t lane, int64_t K, int64_t rows)
{
    uint32_t acc = kiln_kvar(k, kiln_kf(k, 0.0f)), c = kiln_kvar(k, lane);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, c, kiln_ki(k, (int32_t)kl_wfmt_chunks(f, K)), kiln_ki(k, 32), 0);
    gv_chunk ch;
    memset(&ch, 0, sizeof ch);
    f->load(k, wslot, row, c, K, rows, &ch);
    for (int sub = 0; sub < f->subs; sub++) {
        gv_sub w;
        w.b = KILN_IDX_NONE;
        f->decode(k, &ch, c, sub, &w);
        uint32_t e0 = add(k, xrow, f->sub_elem(k, c, sub)), xv[16], sx = KILN_IDX_NONE;
        if (g->nodes[xnode].dtype == KILN_DTYPE_F32 && w.v % 4 == 0) /* 16-byte loads, as gemv's */
            for (int i = 0; i < w.v; i += 4) {
                uint32_t v4 = kiln_kld4(k, kiln_kir_buf(k, KILN_KBUF_NODE, xnode, false), add(k, e0, kiln_ki(k, i)));
                for (int l = 0; l < 4; l++) xv[i + l] = kl_lanef(k, v4, l);
            }
        else
            for (int i = 0; i < w.v; i++) xv[i] = kl_load_node(k, g, xnode, add(k, e0, kiln_ki(k, i)));
        if (w.a == KILN_IDX_NONE) { /* float weights: straight into the accumulator */
            uint32_t a = acc;
            for (int i = 0; i < w.v; i++) a = kiln_kfma(k, w.q[i], xv[i], a);
            kiln_kset(k, acc, a);
            continue;
        }
        uint32_t d = mul(k, w.q[0], xv[0]); /* value i = a q[i] + b: a dot(q, x) + b sum(x) */
        for (int i = 1; i < w.v; i++) d = kiln_kfma(k, w.q[i], xv[i], d);
        uint32_t a = kiln_kfma(k, w.a, d, acc);
        if (w.b != KILN_IDX_NONE) {
            sx = xv[0];
            for (int i = 1; i < w.v; i++) sx = add(k, sx, xv[i]);
            a = kiln_kfma(k, w.b, sx, a);
        }
        kiln_kset(k, acc, a);
    }
    kl_loop_end(k);
    return acc;
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
    snprintf(k->what, sizeof k->what, "moe_matmul %s [%lld, %lld, %lld] k %lld%s", kiln_dtype_name((kiln_dtype)w->dtype),
             (long long)E, (long long)N, (long long)K, (long long)kk, sum ? " sum" : "");
    int64_t cb = (N + MOE_COLS - 1) / MOE_COLS, per_tok = cb * (sum ? 1 : kk); /* blocks of a token */
    k->grid[0] = kl_grid_for(tg, kl_dim_max(g, g->nodes[rn].dims[0]) * per_tok, 1);
    uint32_t sh_r = kiln_kir_shared(k, (uint32_t)E), sh_slot = kiln_kir_shared(k, (uint32_t)kk);
    uint32_t wslot = kiln_kir_buf(k, KILN_KBUF_NODE, wn, false);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t lane = kiln_k2(k, KILN_KOP_REM, tid, kiln_ki(k, 32)), warp = kiln_k2(k, KILN_KOP_DIV, tid, kiln_ki(k, 32));
    uint32_t units = mul(k, kl_dim(k, g->nodes[rn].dims[0]), kiln_ki(k, (int32_t)per_tok));
    uint32_t vb = kiln_kvar(k, kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, vb, units, kiln_ki(k, (int32_t)k->grid[0]), 0);
    uint32_t t = kiln_k2(k, KILN_KOP_DIV, vb, kiln_ki(k, (int32_t)per_tok)), u = kiln_k2(k, KILN_KOP_REM, vb, kiln_ki(k, (int32_t)per_tok));
    uint32_t s0 = sum ? kiln_ki(k, 0) : kiln_k2(k, KILN_KOP_DIV, u, kiln_ki(k, (int32_t)cb)); /* without sum: the block's slot */
    uint32_t col = add(k, mul(k, kiln_k2(k, KILN_KOP_REM, u, kiln_ki(k, (int32_t)cb)), kiln_ki(k, MOE_COLS)), warp);
    uint32_t in = kiln_k2(k, KILN_KOP_LT, col, kiln_ki(k, (int32_t)N));
    uint32_t nc = kiln_k2(k, KILN_KOP_MIN, col, kiln_ki(k, (int32_t)(N - 1))); /* every warp reaches the reductions */
    rank_experts(k, g, rn, t, tid, E, kk, sh_r, sh_slot);
    uint32_t total = kiln_kvar(k, kiln_kf(k, 0.0f)), s = kiln_kvar(k, s0);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, s, sum ? kiln_ki(k, (int32_t)kk) : add(k, s0, kiln_ki(k, 1)), kiln_ki(k, 1), 0);
    uint32_t e = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32, kiln_klds(k, sh_slot, KILN_KT_U32, s), KILN_IDX_NONE,
                             KILN_IDX_NONE, 0); /* the expert of slot s */
    uint32_t row = add(k, mul(k, e, kiln_ki(k, (int32_t)N)), nc);
    uint32_t tok_s = add(k, mul(k, t, kiln_ki(k, (int32_t)kk)), s); /* the (token, slot) pair */
    uint32_t xrow = mul(k, per_slot ? tok_s : t, kiln_ki(k, (int32_t)K));
    uint32_t part = lane_dot(k, g, f, xn, wslot, row, xrow, lane, K, E * N);
    uint32_t dot = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, part, KILN_IDX_NONE, KILN_IDX_NONE,
                               (int32_t)((KILN_KRED_SUM << 16) | 32));
    uint32_t lead = kiln_k2(k, KILN_KOP_PAND, in, kiln_k2(k, KILN_KOP_EQ, lane, kiln_ki(k, 0)));
    if (sum) {
        kiln_kset(k, total, kiln_kfma(k, kiln_klds(k, sh_r, KILN_KT_F32, e), dot, total));
    } else {
        if_(k, lead);
        kl_store_node(k, g, anchor, add(k, mul(k, tok_s, kiln_ki(k, (int32_t)N)), col), dot);
        endif(k);
    }
    kl_loop_end(k);
    if (sum) {
        if_(k, lead);
        kl_store_node(k, g, anchor, add(k, mul(k, t, kiln_ki(k, (int32_t)N)), col), total);
        endif(k);
    }
    kl_loop_end(k);
    return KILN_OK;
}
