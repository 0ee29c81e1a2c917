/* Helpers every lowering template shares (lower.h): dims as kir values, typed element loads and
 * stores, elementwise math, the per-element expression evaluator (so fused prologues/epilogues
 * mean the same thing in every kernel), grid loops, MMA fragment layouts and row guards. Must not
 * pick templates (lower.c does) nor print any target's text. */
#include "codegen/lower.h"
#include "graph/dtype.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

kiln_status kl_unsupported(char *err, size_t n_err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n_err, fmt, ap);
    va_end(ap);
    return KILN_ERR_UNSUPPORTED;
}

bool kl_is_elementwise(enum kiln_op op) { return kiln_op_is_elementwise(op); }

uint32_t kl_dim(kiln_kir *k, int64_t d)
{
    if (kiln_dim_is_sym(d))
        return kiln_kir_op(k, KILN_KOP_PARAM, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE,
                           (int32_t)kiln_sym_index(d));
    return kiln_ki(k, (int32_t)d);
}

uint32_t kl_numel_from(kiln_kir *k, const kiln_node_rec *n, int from)
{
    int64_t c = 1;
    uint32_t v = KILN_IDX_NONE;
    for (int i = from; i < n->rank; i++) {
        if (kiln_dim_is_sym(n->dims[i]))
            v = v == KILN_IDX_NONE ? kl_dim(k, n->dims[i]) : kiln_k2(k, KILN_KOP_MUL, v, kl_dim(k, n->dims[i]));
        else
            c *= n->dims[i];
    }
    if (v == KILN_IDX_NONE) return kiln_ki(k, (int32_t)c);
    return c == 1 ? v : kiln_k2(k, KILN_KOP_MUL, v, kiln_ki(k, (int32_t)c));
}

/* Same element count for every symbol value: same constant product and the same symbols. */
bool kl_same_numel(const kiln_node_rec *a, const kiln_node_rec *b)
{
    int64_t ca = 1, cb = 1, sa[KILN_MAX_RANK], sb[KILN_MAX_RANK];
    int na = 0, nb = 0;
    for (int i = 0; i < a->rank; i++) {
        if (kiln_dim_is_sym(a->dims[i]))
            sa[na++] = a->dims[i];
        else
            ca *= a->dims[i];
    }
    for (int i = 0; i < b->rank; i++) {
        if (kiln_dim_is_sym(b->dims[i]))
            sb[nb++] = b->dims[i];
        else
            cb *= b->dims[i];
    }
    if (ca != cb || na != nb) return false;
    bool used[KILN_MAX_RANK] = {false};
    for (int i = 0; i < na; i++) {
        bool found = false;
        for (int j = 0; j < nb && !found; j++)
            if (!used[j] && sb[j] == sa[i]) used[j] = found = true;
        if (!found) return false;
    }
    return true;
}

int64_t kl_dim_max(const kiln_graph *g, int64_t d) { return kiln_dim_is_sym(d) ? g->syms[kiln_sym_index(d)].max : d; }

int64_t kl_numel_max(const kiln_graph *g, const kiln_node_rec *n)
{
    int64_t c = 1;
    for (int i = 0; i < n->rank; i++) c *= kl_dim_max(g, n->dims[i]);
    return c;
}

uint32_t kl_load(kiln_kir *k, uint32_t slot, kiln_dtype t, uint32_t idx)
{
    switch (t) {
    case KILN_DTYPE_F32:
        return kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32,
                           kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, idx, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot),
                           KILN_IDX_NONE, KILN_IDX_NONE, 0);
    case KILN_DTYPE_I32: {
        uint32_t w = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, idx, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
        uint32_t i = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32, w, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        return kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_F32, i, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    }
    default: { /* f16, bf16: the half (idx & 1) of word idx >> 1 */
        uint32_t w = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_k2(k, KILN_KOP_SHR, idx, kiln_ki(k, 1)),
                                 KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
        uint32_t sh = kiln_kcvt(k, KILN_KT_U32,
                                kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_AND, idx, kiln_ki(k, 1)), kiln_ki(k, 4)));
        uint32_t h = kiln_k2(k, KILN_KOP_SHR, w, sh);
        return kiln_kir_op(k, t == KILN_DTYPE_F16 ? KILN_KOP_H2F : KILN_KOP_B2F, KILN_KT_F32, h, KILN_IDX_NONE,
                           KILN_IDX_NONE, 0);
    }
    }
}

void kl_store(kiln_kir *k, uint32_t slot, kiln_dtype t, uint32_t idx, uint32_t v)
{
    switch (t) {
    case KILN_DTYPE_F32:
        kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, idx,
                    kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_U32, v, KILN_IDX_NONE, KILN_IDX_NONE, 0), KILN_IDX_NONE,
                    (int32_t)slot);
        return;
    case KILN_DTYPE_I32: { /* round half to even, saturate, NaN -> 0 (the reference's cast) */
        uint32_t r = kiln_k1(k, KILN_KOP_RINT, v);
        r = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, r, kiln_kf(k, -2147483648.0f)),
                    kiln_kf(k, 2147483520.0f));
        uint32_t i = kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32, r, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        uint32_t big = kiln_k2(k, KILN_KOP_LE, kiln_kf(k, 2147483647.0f), v);
        i = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, big, kiln_ki(k, INT32_MAX), i, 0);
        i = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, kiln_k2(k, KILN_KOP_EQ, v, v), i, kiln_ki(k, 0), 0);
        kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, idx, kiln_kcvt(k, KILN_KT_U32, i), KILN_IDX_NONE, (int32_t)slot);
        return;
    }
    default:
        kiln_kir_op(k, KILN_KOP_ST16, KILN_KT_NONE, idx,
                    kiln_kir_op(k, t == KILN_DTYPE_F16 ? KILN_KOP_F2H : KILN_KOP_F2B, KILN_KT_U32, v, KILN_IDX_NONE,
                                KILN_IDX_NONE, 0),
                    KILN_IDX_NONE, (int32_t)slot);
    }
}

uint32_t kl_ld_i32(kiln_kir *k, uint32_t slot, uint32_t idx)
{
    uint32_t w = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, idx, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
    return kiln_kir_op(k, KILN_KOP_CVT, KILN_KT_I32, w, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

/* The position -> slot mapping of paged attention, the one copy the kernels print (the host's is
 * kiln_paged_slot): the block index is clamped into the pool, so metadata bound in device memory
 * (which kiln_run cannot check) never sends a load outside it. */
void kl_q8_block(kiln_kir *k, uint32_t slot, uint32_t blk, uint32_t *d, uint32_t w[8])
{
    uint32_t h0 = kiln_kmuli(k, blk, 17), w0 = kiln_kshri(k, h0, 1); /* d is half h0: word h0 / 2 */
    uint32_t odd = kiln_k2(k, KILN_KOP_NE, kiln_k2(k, KILN_KOP_AND, h0, kiln_ki(k, 1)), kiln_ki(k, 0));
    uint32_t W[9];
    for (int i = 0; i < 9; i++) W[i] = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_kaddi(k, w0, i), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
    uint32_t sh16 = kiln_ku(k, 16);
    *d = kiln_kir_op(k, KILN_KOP_H2F, KILN_KT_F32, kiln_ksel(k, KILN_KT_U32, odd, kiln_k2(k, KILN_KOP_SHR, W[0], sh16), W[0]),
                     KILN_IDX_NONE, KILN_IDX_NONE, 0);
    for (int i = 0; i < 8; i++) /* odd: the quants start on a word; else 2 bytes into one */
        w[i] = kiln_ksel(k, KILN_KT_U32, odd, W[i + 1],
                         kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_SHR, W[i], sh16), kiln_k2(k, KILN_KOP_SHL, W[i + 1], sh16)));
}

uint32_t kl_q8_elem(kiln_kir *k, uint32_t slot, uint32_t blk, uint32_t e)
{
    uint32_t h0 = kiln_kmuli(k, blk, 17);
    uint32_t dw = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_kshri(k, h0, 1), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
    uint32_t dsh = kiln_kcvt(k, KILN_KT_U32, kiln_kmuli(k, kiln_k2(k, KILN_KOP_AND, h0, kiln_ki(k, 1)), 16));
    uint32_t d = kiln_kir_op(k, KILN_KOP_H2F, KILN_KT_F32, kiln_k2(k, KILN_KOP_SHR, dw, dsh), KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t byte = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, blk, 34), kiln_kaddi(k, e, 2));
    uint32_t qw = kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, kiln_kshri(k, byte, 2), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot);
    uint32_t sh = kiln_kcvt(k, KILN_KT_U32, kiln_kmuli(k, kiln_k2(k, KILN_KOP_AND, byte, kiln_ki(k, 3)), 8));
    uint32_t q = kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_SHR, qw, sh), kiln_ku(k, 0xffu));
    uint32_t qi = kiln_k2(k, KILN_KOP_SUB, kiln_kcvt(k, KILN_KT_I32, kiln_k2(k, KILN_KOP_XOR, q, kiln_ku(k, 0x80u))), kiln_ki(k, 0x80));
    return kiln_k2(k, KILN_KOP_MUL, d, kiln_kcvt(k, KILN_KT_F32, qi));
}

uint32_t kl_paged_slot(kiln_kir *k, uint32_t bt, uint32_t bt_row, uint32_t j, int64_t block, int64_t n_blocks)
{
    int32_t sh = 0;
    while (((int64_t)1 << sh) < block) sh++;
    uint32_t b = kl_ld_i32(k, bt, kiln_k2(k, KILN_KOP_ADD, bt_row, kiln_k2(k, KILN_KOP_SHR, j, kiln_ki(k, sh))));
    b = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, b, kiln_ki(k, 0)), kiln_ki(k, (int32_t)n_blocks - 1));
    return kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_SHL, b, kiln_ki(k, sh)),
                   kiln_k2(k, KILN_KOP_AND, j, kiln_ki(k, (int32_t)block - 1)));
}

uint32_t kl_tree_parent(kiln_kir *k, uint32_t par, uint32_t q0, uint32_t an)
{
    uint32_t pa = kl_ld_i32(k, par, kiln_k2(k, KILN_KOP_ADD, q0, kiln_k2(k, KILN_KOP_MAX, an, kiln_ki(k, 0))));
    return kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, pa, kiln_ki(k, -1)), kiln_k2(k, KILN_KOP_SUB, an, kiln_ki(k, 1)));
}

uint32_t kl_load_node(kiln_kir *k, const kiln_graph *g, uint32_t node, uint32_t idx)
{
    return kl_load(k, kiln_kir_buf(k, KILN_KBUF_NODE, node, false), (kiln_dtype)g->nodes[node].dtype, idx);
}

void kl_store_node(kiln_kir *k, const kiln_graph *g, uint32_t node, uint32_t idx, uint32_t v)
{
    kl_store(k, kiln_kir_buf(k, KILN_KBUF_NODE, node, true), (kiln_dtype)g->nodes[node].dtype, idx, v);
}

/* ------------------------------------------------------------------ math */

uint32_t kl_exp(kiln_kir *k, uint32_t x)
{
    return kiln_k1(k, KILN_KOP_EX2, kiln_k2(k, KILN_KOP_MUL, x, kiln_kf(k, 1.44269504088896341f)));
}

uint32_t kl_silu(kiln_kir *k, uint32_t x)
{
    uint32_t e = kl_exp(k, kiln_k1(k, KILN_KOP_NEG, x));
    return kiln_k2(k, KILN_KOP_DIV, x, kiln_k2(k, KILN_KOP_ADD, kiln_kf(k, 1.0f), e));
}

uint32_t kl_gelu(kiln_kir *k, uint32_t x)
{
    uint32_t x3 = kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_MUL, x, x), x);
    uint32_t z = kiln_k2(k, KILN_KOP_MUL, kiln_kf(k, 0.7978845608028654f),
                         kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, kiln_kf(k, 0.044715f), x3, x, 0));
    /* tanh z = 1 - 2 / (e^{2z} + 1): exact limits at +-inf */
    uint32_t e = kl_exp(k, kiln_k2(k, KILN_KOP_ADD, z, z));
    uint32_t th = kiln_k2(k, KILN_KOP_SUB, kiln_kf(k, 1.0f),
                          kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 2.0f), kiln_k2(k, KILN_KOP_ADD, e, kiln_kf(k, 1.0f))));
    return kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_MUL, kiln_kf(k, 0.5f), x),
                   kiln_k2(k, KILN_KOP_ADD, kiln_kf(k, 1.0f), th));
}

uint32_t kl_tanh(kiln_kir *k, uint32_t x)
{
    /* |x| < 0.625: Lambert's continued fraction to depth 4 (relative error < 1e-9, no cancellation
     * near 0); above: 1 - 2 / (e^{2|x|} + 1) (exact limit 1 at +inf) with x's sign */
    uint32_t ax = kiln_k1(k, KILN_KOP_ABS, x), x2 = kiln_k2(k, KILN_KOP_MUL, x, x), v = kiln_kf(k, 9.0f);
    for (int c = 7; c >= 1; c -= 2) v = kiln_k2(k, KILN_KOP_ADD, kiln_kf(k, (float)c), kiln_k2(k, KILN_KOP_DIV, x2, v));
    uint32_t near = kiln_k2(k, KILN_KOP_DIV, x, v);
    uint32_t e = kl_exp(k, kiln_k2(k, KILN_KOP_ADD, ax, ax));
    uint32_t far = kiln_k2(k, KILN_KOP_SUB, kiln_kf(k, 1.0f),
                           kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 2.0f), kiln_k2(k, KILN_KOP_ADD, e, kiln_kf(k, 1.0f))));
    far = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, kiln_k2(k, KILN_KOP_LT, x, kiln_kf(k, 0.0f)),
                      kiln_k1(k, KILN_KOP_NEG, far), far, 0);
    return kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, kiln_k2(k, KILN_KOP_LT, ax, kiln_kf(k, 0.625f)), near, far, 0);
}

uint32_t kl_attn_score(kiln_kir *k, float softcap, uint32_t s)
{
    if (softcap == 0.0f) return s;
    return kiln_k2(k, KILN_KOP_MUL, kiln_kf(k, softcap), kl_tanh(k, kiln_k2(k, KILN_KOP_DIV, s, kiln_kf(k, softcap))));
}

uint32_t kl_attn_first_key(kiln_kir *k, const kiln_node_rec *n, uint32_t seen)
{
    return kiln_k2(k, KILN_KOP_MAX, kiln_k2(k, KILN_KOP_SUB, seen, kiln_ki(k, n->i[1])), kiln_ki(k, 0));
}

void kl_sincos(kiln_kir *k, uint32_t ang, uint32_t *s, uint32_t *c)
{
    /* Cody-Waite: r = ang - n * 2pi with 2pi split in two floats, so r is accurate to ~1e-7 for
     * angles up to ~1e5 (positions times frequencies <= 1). */
    uint32_t n = kiln_k1(k, KILN_KOP_RINT, kiln_k2(k, KILN_KOP_MUL, ang, kiln_kf(k, 0.159154943091895336f)));
    uint32_t nn = kiln_k1(k, KILN_KOP_NEG, n);
    uint32_t r = kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, nn, kiln_kf(k, 6.28318548202514648f), ang, 0);
    r = kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, nn, kiln_kf(k, -1.74845553e-7f), r, 0);
    *s = kiln_k1(k, KILN_KOP_SIN, r);
    *c = kiln_k1(k, KILN_KOP_COS, r);
}

uint32_t kl_rope_table(kiln_kir *k, const kiln_node_rec *n, int64_t d)
{
    uint32_t w[4096];
    int64_t half = d / 2 < 4096 ? d / 2 : 4096;
    for (int64_t i = 0; i < half; i++) {
        float f = (float)kiln_rope_freq(n, i, d);
        memcpy(&w[i], &f, 4);
    }
    return kiln_kir_table(k, w, (uint32_t)half);
}

static uint32_t round_to(kiln_kir *k, kiln_dtype t, uint32_t v)
{
    if (t == KILN_DTYPE_F16)
        return kiln_kir_op(k, KILN_KOP_H2F, KILN_KT_F32,
                           kiln_kir_op(k, KILN_KOP_F2H, KILN_KT_U32, v, KILN_IDX_NONE, KILN_IDX_NONE, 0), KILN_IDX_NONE,
                           KILN_IDX_NONE, 0);
    if (t == KILN_DTYPE_BF16)
        return kiln_kir_op(k, KILN_KOP_B2F, KILN_KT_F32,
                           kiln_kir_op(k, KILN_KOP_F2B, KILN_KT_U32, v, KILN_IDX_NONE, KILN_IDX_NONE, 0), KILN_IDX_NONE,
                           KILN_IDX_NONE, 0);
    return v;
}

uint32_t kl_apply(kiln_kir *k, const kiln_node_rec *n, uint32_t a, uint32_t b)
{
    uint32_t y;
    switch ((enum kiln_op)n->op) {
    case KILN_OP_ADD: y = kiln_k2(k, KILN_KOP_ADD, a, b); break;
    case KILN_OP_MUL: y = kiln_k2(k, KILN_KOP_MUL, a, b); break;
    case KILN_OP_SCALE: y = kiln_k2(k, KILN_KOP_MUL, a, kiln_kf(k, n->f[0])); break;
    case KILN_OP_SILU: y = kl_silu(k, a); break;
    case KILN_OP_GELU: y = kl_gelu(k, a); break;
    case KILN_OP_TANH: y = kl_tanh(k, a); break;
    case KILN_OP_SIGMOID:
        y = kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f),
                    kiln_k2(k, KILN_KOP_ADD, kiln_kf(k, 1.0f), kl_exp(k, kiln_k1(k, KILN_KOP_NEG, a))));
        break;
    case KILN_OP_SWIGLU: y = kiln_k2(k, KILN_KOP_MUL, kl_silu(k, a), b); break;
    default: y = a; break; /* cast: the value is rounded to the target dtype below */
    }
    return round_to(k, (kiln_dtype)n->dtype, y);
}

/* ------------------------------------------------------------------ expression evaluator */

void kl_eval_init(kl_eval *e, kiln_kir *k, const kiln_graph *g, const kiln_region *r, uint32_t space, uint32_t idx)
{
    memset(e, 0, sizeof *e);
    e->k = k;
    e->g = g;
    e->r = r;
    e->space = space;
    e->idx = idx;
}

void kl_eval_set(kl_eval *e, uint32_t node, uint32_t v)
{
    if (e->n_memo == KL_MEMO) {
        e->failed = true;
        snprintf(e->err, sizeof e->err, "expression too large");
        return;
    }
    e->memo_node[e->n_memo] = node;
    e->memo_val[e->n_memo++] = v;
}

uint32_t kl_eval_node(kl_eval *e, uint32_t node)
{
    for (int i = 0; i < e->n_memo; i++)
        if (e->memo_node[i] == node) return e->memo_val[i];
    const kiln_node_rec *n = &e->g->nodes[node];
    uint32_t v;
    if (n->op == KILN_OP_RESHAPE) {
        v = kl_eval_node(e, n->src[0]);
    } else if (kiln_region_has(e->r, node) && kl_is_elementwise((enum kiln_op)n->op)) {
        if (!kl_same_numel(n, &e->g->nodes[e->space])) {
            e->failed = true;
            snprintf(e->err, sizeof e->err, "%s #%u has another shape than the kernel's elements",
                     kiln_op_name((enum kiln_op)n->op), node);
            return kiln_kf(e->k, 0);
        }
        if (n->op == KILN_OP_CAST && n->dtype == KILN_DTYPE_I32 && e->g->nodes[n->src[0]].dtype == KILN_DTYPE_I32) {
            e->failed = true;
            snprintf(e->err, sizeof e->err, "cast i32 -> i32");
        }
        uint32_t a = kl_eval_node(e, n->src[0]);
        uint32_t b = n->n_src > 1 && n->src[1] != KILN_IDX_NONE ? kl_eval_node(e, n->src[1]) : KILN_IDX_NONE;
        v = kl_apply(e->k, n, a, b);
    } else if (kiln_region_has(e->r, node)) {
        e->failed = true;
        snprintf(e->err, sizeof e->err, "%s #%u cannot be fused here", kiln_op_name((enum kiln_op)n->op), node);
        return kiln_kf(e->k, 0);
    } else {
        kiln_dtype t = (kiln_dtype)n->dtype;
        if (kiln_dtype_block(t) != 1) {
            e->failed = true;
            snprintf(e->err, sizeof e->err, "elementwise read of a %s tensor", kiln_dtype_name(t));
            return kiln_kf(e->k, 0);
        }
        uint32_t idx = e->idx;
        if (!kl_same_numel(n, &e->g->nodes[e->space]))
            idx = kiln_k2(e->k, KILN_KOP_REM, idx, kl_numel_from(e->k, n, 0));
        v = kl_load_node(e->k, e->g, node, idx);
    }
    kl_eval_set(e, node, v);
    return v;
}

/* ------------------------------------------------------------------ row norms at any magnitude */

enum { ROW_MAXABS, ROW_SUM, ROW_SQUARES };

/* One pass over the row reduced over the block: max |x|, sum of x s, or sum of (x s - ms)^2. */
static uint32_t row_pass(kiln_kir *k, const kl_row *row, int what, uint32_t s, uint32_t ms)
{
    uint32_t acc = kiln_kvar(k, kiln_kf(k, 0.0f));
    uint32_t j = kiln_kvar(k, row->tid);
    kiln_kloop(k, j, row->n, kiln_ki(k, row->step));
    uint32_t x = row->at(row->ctx, j);
    if (what == ROW_MAXABS) {
        kiln_kset(k, acc, kiln_k2(k, KILN_KOP_MAX, acc, kiln_k1(k, KILN_KOP_ABS, x)));
    } else {
        uint32_t xs = kiln_k2(k, KILN_KOP_MUL, x, s);
        if (what == ROW_SUM) {
            kiln_kset(k, acc, kiln_k2(k, KILN_KOP_ADD, acc, xs));
        } else {
            if (ms != KILN_IDX_NONE) xs = kiln_k2(k, KILN_KOP_SUB, xs, ms);
            kiln_kset(k, acc, kiln_kfma(k, xs, xs, acc));
        }
    }
    kiln_kendloop(k);
    enum kiln_kred op = what == ROW_MAXABS ? KILN_KRED_MAX : KILN_KRED_SUM;
    return kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, acc, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)((op << 16) | row->step));
}

/* The power of two 2^(126 - e) for m = max |x| with biased exponent e, its exponent clamped to
 * the normal range: m s lands in [0.5, 1) (in [2, 4) for e = 254; below 1 for subnormal m). */
static uint32_t pow2_scale(kiln_kir *k, uint32_t m)
{
    uint32_t e = kiln_kshri(k, kiln_kbitcast(k, KILN_KT_I32, m), 23); /* m >= 0: no sign bit */
    uint32_t b = kiln_k2(k, KILN_KOP_SUB, kiln_ki(k, 253), e);
    b = kiln_k2(k, KILN_KOP_MIN, kiln_k2(k, KILN_KOP_MAX, b, kiln_ki(k, 1)), kiln_ki(k, 254));
    return kiln_kbitcast(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_SHL, b, kiln_ki(k, 23)));
}

/* Fast path: sc = 1 / sqrt(q). Else, with x scaled by s: a = mean of (x s - ms)^2, b = eps s^2,
 * sc = 1 / sqrt(a + b); when b overflows, a (< 16) is lost in it: sc = 1 / (sqrt(eps) s). raw:
 * only sc, for unscaled x (s sc), as rms_norm's consumers take it. */
static kl_norm norm_stats(kiln_kir *k, const kl_row *row, uint32_t mean, uint32_t q, float eps, bool raw)
{
    kl_norm o = {.s = KILN_IDX_NONE, .ms = KILN_IDX_NONE};
    o.sc = kiln_kvar(k, kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f), kiln_k1(k, KILN_KOP_SQRT, q)));
    if (!raw) o.s = kiln_kvar(k, kiln_kf(k, 1.0f)), o.ms = kiln_kvar(k, mean);
    kiln_kif(k, kiln_k2(k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_LT, kiln_kf(k, FLT_MAX), q),
                        kiln_k2(k, KILN_KOP_LT, q, kiln_kf(k, 0x1p-100f))));
    uint32_t s = pow2_scale(k, row_pass(k, row, ROW_MAXABS, KILN_IDX_NONE, KILN_IDX_NONE));
    uint32_t ms = raw ? KILN_IDX_NONE : kiln_k2(k, KILN_KOP_DIV, row_pass(k, row, ROW_SUM, s, KILN_IDX_NONE), row->nf);
    uint32_t a = kiln_k2(k, KILN_KOP_DIV, row_pass(k, row, ROW_SQUARES, s, ms), row->nf);
    uint32_t b = kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_MUL, kiln_kf(k, eps), s), s);
    uint32_t sc = kiln_ksel(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_LE, b, kiln_kf(k, FLT_MAX)),
                            kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f), kiln_k1(k, KILN_KOP_SQRT, kiln_k2(k, KILN_KOP_ADD, a, b))),
                            kiln_k2(k, KILN_KOP_DIV, kiln_kf(k, 1.0f), kiln_k2(k, KILN_KOP_MUL, kiln_kf(k, sqrtf(eps)), s)));
    if (raw) {
        kiln_kset(k, o.sc, kiln_k2(k, KILN_KOP_MUL, sc, s));
    } else {
        kiln_kset(k, o.s, s);
        kiln_kset(k, o.ms, ms);
        kiln_kset(k, o.sc, sc);
    }
    kiln_kendif(k);
    return o;
}

kl_norm kl_norm_stats(kiln_kir *k, const kl_row *row, uint32_t mean, uint32_t q, float eps)
{
    return norm_stats(k, row, mean, q, eps, false);
}

uint32_t kl_rms_scale(kiln_kir *k, const kl_row *row, uint32_t q, float eps)
{
    return norm_stats(k, row, KILN_IDX_NONE, q, eps, true).sc;
}

/* ------------------------------------------------------------------ loops and grids */

uint32_t kl_grid_loop(kiln_kir *k, uint32_t n)
{
    uint32_t bid = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t i =
        kiln_kvar(k, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, bid, kiln_ki(k, (int32_t)k->block)), tid));
    uint32_t step = kiln_ki(k, (int32_t)(k->block * k->grid[0]));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, i, n, step, 0);
    return i;
}

void kl_loop_end(kiln_kir *k)
{
    kiln_kir_op(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

uint32_t kl_grid_for(const kiln_lower_target *tg, int64_t n_max, int64_t per_block)
{
    int64_t g = (n_max + per_block - 1) / per_block;
    if (g > tg->grid_max) g = tg->grid_max; /* grid-stride loops cover the rest */
    return g < 1 ? 1 : (uint32_t)g;
}

/* ------------------------------------------------------------------ MMA operands */

void kl_split_pair(kiln_kir *k, uint32_t a, uint32_t b, int n, bool bf, uint32_t word[])
{
    enum kiln_kop to = bf ? KILN_KOP_F2B : KILN_KOP_F2H, back = bf ? KILN_KOP_B2F : KILN_KOP_H2F;
    uint32_t v[2] = {a, b}, h[2][3];
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < n; i++) {
            h[e][i] = kiln_kir_op(k, to, KILN_KT_U32, v[e], KILN_IDX_NONE, KILN_IDX_NONE, 0);
            if (i + 1 < n)
                v[e] = kiln_k2(k, KILN_KOP_SUB, v[e],
                               kiln_kir_op(k, back, KILN_KT_F32, h[e][i], KILN_IDX_NONE, KILN_IDX_NONE, 0));
        }
    for (int i = 0; i < n; i++)
        word[i] = kiln_k2(k, KILN_KOP_OR, h[0][i], kiln_k2(k, KILN_KOP_SHL, h[1][i], kiln_ku(k, 16)));
}

uint32_t kl_lanef(kiln_kir *k, uint32_t v4, int i)
{
    return kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32, kiln_klane(k, v4, i), KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

uint32_t kl_frag_slot(kiln_kir *k, uint32_t lane)
{
    return kiln_k2(k, KILN_KOP_XOR, lane, kiln_kandi(k, kiln_kshri(k, lane, 3), 3));
}

/* Word of pair p of row r (an A row, or a B column with b) in a fragment-order tile: the two
 * layouts differ only in which of the row's and the pair's high bits pick the lane's word j. */
static uint32_t frag_word(kiln_kir *k, uint32_t r, uint32_t p, int kt, bool b)
{
    uint32_t rr = kiln_kandi(k, r, 15), pp = kiln_kandi(k, p, 7);
    uint32_t tile = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, kiln_kshri(k, r, 4), kt), kiln_kshri(k, p, 3));
    uint32_t ln =
        kl_frag_slot(k, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, kiln_kandi(k, rr, 7), 4), kiln_kandi(k, pp, 3)));
    uint32_t j = b ? kiln_k2(k, KILN_KOP_ADD, kiln_kshri(k, pp, 2), kiln_kmuli(k, kiln_kshri(k, rr, 3), 2))
                   : kiln_k2(k, KILN_KOP_ADD, kiln_kshri(k, rr, 3), kiln_kmuli(k, kiln_kshri(k, pp, 2), 2));
    return kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, tile, 32), ln), 4), j);
}

uint32_t kl_frag_a_word(kiln_kir *k, uint32_t r, uint32_t p, int kt) { return frag_word(k, r, p, kt, false); }
uint32_t kl_frag_b_word(kiln_kir *k, uint32_t n, uint32_t p, int kt) { return frag_word(k, n, p, kt, true); }

void kl_guard_rows(kiln_kir *k, const kiln_graph *g, uint32_t node, int64_t per_row, int64_t cap, uint32_t seqs,
                   int64_t per_seq, bool small)
{
    kiln_kir c;
    kiln_kir_init(&c, k->name, k->block);
    uint32_t rows = kiln_k2(&c, KILN_KOP_DIV, kl_numel_from(&c, &g->nodes[node], 0), kiln_ki(&c, (int32_t)per_row));
    uint32_t p;
    if (seqs == KILN_IDX_NONE) { /* this order of instructions is the one the golden kernels record */
        p = small ? kiln_k2(&c, KILN_KOP_LE, rows, kiln_ki(&c, (int32_t)cap))
                  : kiln_k2(&c, KILN_KOP_LT, kiln_ki(&c, (int32_t)cap), rows);
    } else { /* many rows, and more than per_seq rows a sequence on average; small: the negation */
        uint32_t ns = kiln_kmuli(&c, kl_dim(&c, g->nodes[seqs].dims[0]), (int32_t)per_seq);
        p = kiln_k2(&c, KILN_KOP_PAND, kiln_k2(&c, KILN_KOP_LT, kiln_ki(&c, (int32_t)cap), rows),
                    kiln_k2(&c, KILN_KOP_LT, ns, rows));
        if (small) p = kiln_kir_op(&c, KILN_KOP_PNOT, KILN_KT_PRED, p, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    }
    kiln_kir_guard(k, &c, p);
    kiln_kir_free(&c);
    k->rows = (kiln_krows){.set = true, .small = small, .node = node, .seqs = seqs, .per_row = per_row, .cap = cap, .per_seq = per_seq};
}

void kl_guard_rows_range(kiln_kir *k, const kiln_graph *g, uint32_t node, int64_t per_row, int64_t lo, int64_t cap)
{
    kiln_kir c;
    kiln_kir_init(&c, k->name, k->block);
    uint32_t rows = kiln_k2(&c, KILN_KOP_DIV, kl_numel_from(&c, &g->nodes[node], 0), kiln_ki(&c, (int32_t)per_row));
    uint32_t p = kiln_k2(&c, KILN_KOP_PAND, kiln_k2(&c, KILN_KOP_LT, kiln_ki(&c, (int32_t)lo), rows),
                         kiln_k2(&c, KILN_KOP_LE, rows, kiln_ki(&c, (int32_t)cap)));
    kiln_kir_guard(k, &c, p);
    kiln_kir_free(&c);
    k->rows = (kiln_krows){.set = true, .small = true, .node = node, .seqs = KILN_IDX_NONE, .per_row = per_row, .cap = cap, .lo = lo};
}

void kl_guard_rows_mixed(kiln_kir *k, const kiln_graph *g, uint32_t node, int64_t per_row, uint32_t seqs, int64_t mix)
{
    kiln_kir c;
    kiln_kir_init(&c, k->name, k->block);
    uint32_t rows = kiln_k2(&c, KILN_KOP_DIV, kl_numel_from(&c, &g->nodes[node], 0), kiln_ki(&c, (int32_t)per_row));
    uint32_t ns = kl_dim(&c, g->nodes[seqs].dims[0]);
    kiln_kir_guard(k, &c, kiln_k2(&c, KILN_KOP_LE, kiln_ki(&c, (int32_t)mix), kiln_k2(&c, KILN_KOP_SUB, rows, ns)));
    kiln_kir_free(&c);
    k->rows = (kiln_krows){.set = true, .node = node, .seqs = seqs, .per_row = per_row, .mix = mix};
}

bool kl_tma_aligned(const kiln_graph *g, uint32_t node)
{
    uint64_t off = 0;
    while (node < g->n_nodes && (g->nodes[node].op == KILN_OP_RESHAPE || g->nodes[node].op == KILN_OP_VIEW)) {
        const kiln_node_rec *n = &g->nodes[node];
        if (n->op == KILN_OP_VIEW) off += (uint64_t)n->dim * kiln_dtype_block_bytes((kiln_dtype)n->dtype);
        node = n->src[0];
    }
    return off % 16 == 0;
}

int kl_gemm_rows(const kiln_lower_target *tg) { return tg->opts.gemm_rows == 64 ? 64 : 128; }
