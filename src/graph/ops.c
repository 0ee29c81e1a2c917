/* Op builders: check operands (ids, dtypes, shapes incl. symbolic dims), infer the result's
 * shape and append one node. Every rule of what an op accepts lives here, once; the .kg parser
 * and every caller go through these. Never aborts: errors stick to the graph. */
#include "graph/graph.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIMS_STR(g, n) kiln_graph_dims_str((g), (n)->rank, (n)->dims, (char[160]){0}, 160)

static bool is_float_act(uint8_t t) { return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16; }
static bool is_block(uint8_t t) { return kiln_dtype_block((kiln_dtype)t) > 1; }

static bool dims_equal(const kiln_node_rec *a, const kiln_node_rec *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

/* Starts a result node: one or more resolved sources, fields zeroed. */
typedef struct build {
    kiln_graph   *g;   /* graph */
    const char   *op;  /* op name for messages */
    kiln_node_rec r;   /* the node being built */
    bool          ok;  /* no operand error so far */
} build;

static build begin(kiln_graph *g, enum kiln_op op)
{
    build b = {.g = g, .op = kiln_op_name(op), .ok = g && g->status == KILN_OK};
    b.r.op = (uint8_t)op;
    for (int i = 0; i < KILN_MAX_SRC; i++) b.r.src[i] = KILN_IDX_NONE;
    return b;
}

/* Resolves operand `what` into src slot `slot`; optional operands accept KILN_NODE_NONE. */
static const kiln_node_rec *operand(build *b, int slot, const char *what, kiln_node h, bool optional)
{
    if (!b->ok) return NULL;
    if (optional && h == KILN_NODE_NONE) {
        if (b->r.n_src < slot + 1) b->r.n_src = (uint8_t)(slot + 1);
        return NULL;
    }
    uint32_t idx;
    if (!kiln_graph_resolve(b->g, b->op, what, h, &idx)) {
        b->ok = false;
        return NULL;
    }
    b->r.src[slot] = idx;
    if (b->r.n_src < slot + 1) b->r.n_src = (uint8_t)(slot + 1);
    return &b->g->nodes[idx];
}

static bool fail(build *b, kiln_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(build *b, kiln_status s, const char *fmt, ...)
{
    if (!b->ok) return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kiln_graph_fail(b->g, s, "%s: %s", b->op, msg);
    b->ok = false;
    return false;
}

static bool need_float(build *b, const char *what, const kiln_node_rec *n)
{
    if (!b->ok || !n || is_float_act(n->dtype)) return b->ok;
    return fail(b, KILN_ERR_DTYPE, "%s has dtype %s; this op takes f32, f16 or bf16", what, kiln_dtype_name(n->dtype));
}

static void set_shape(build *b, uint8_t dtype, int rank, const int64_t *dims)
{
    b->r.dtype = dtype;
    b->r.rank = (uint8_t)rank;
    for (int i = 0; i < rank; i++) b->r.dims[i] = dims[i];
}

/* Every result's size at its symbols' bounds must fit the limit leaves have (2^50 bytes): op
 * shapes multiply (matmul rows x outputs, reshape targets), and an unchecked product wraps
 * (issue #17). The product saturates early, so it never overflows 128 bits. */
static bool size_fits(build *b)
{
    const kiln_node_rec *r = &b->r;
    if (!b->ok || r->rank < 1) return b->ok;
    const unsigned __int128 lim = (unsigned __int128)1 << 50;
    int64_t blk = kiln_dtype_block((kiln_dtype)r->dtype);
    unsigned __int128 bytes = kiln_dtype_block_bytes((kiln_dtype)r->dtype);
    for (int i = 0; i < r->rank && bytes <= lim; i++) {
        int64_t d = kiln_dim_is_sym(r->dims[i]) ? b->g->syms[kiln_sym_index(r->dims[i])].max : r->dims[i];
        bytes *= (unsigned __int128)(i == r->rank - 1 ? (d + blk - 1) / blk : d);
    }
    if (bytes <= lim) return true;
    return fail(b, KILN_ERR_SHAPE, "result %s (%s) is larger than 2^50 bytes", DIMS_STR(b->g, r),
                kiln_dtype_name((kiln_dtype)r->dtype));
}

static kiln_node finish(build *b) { return size_fits(b) ? kiln_graph_append(b->g, &b->r) : KILN_NODE_NONE; }

static kiln_node unary(kiln_graph *g, enum kiln_op op, kiln_node x, float f0)
{
    build b = begin(g, op);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    need_float(&b, "x", a);
    if (b.ok) set_shape(&b, a->dtype, a->rank, a->dims);
    b.r.f[0] = f0;
    return finish(&b);
}

static kiln_node binary(kiln_graph *g, enum kiln_op op, kiln_node x, kiln_node y, bool broadcast)
{
    build b = begin(g, op);
    const kiln_node_rec *a = operand(&b, 0, broadcast ? "a" : "gate", x, false);
    const kiln_node_rec *c = operand(&b, 1, broadcast ? "b" : "up", y, false);
    need_float(&b, broadcast ? "a" : "gate", a);
    need_float(&b, broadcast ? "b" : "up", c);
    if (b.ok && a->dtype != c->dtype)
        fail(&b, KILN_ERR_DTYPE, "operands have dtypes %s and %s; they must match", kiln_dtype_name(a->dtype),
             kiln_dtype_name(c->dtype));
    if (b.ok) {
        bool ok = broadcast ? c->rank <= a->rank : dims_equal(a, c);
        for (int i = 0; ok && broadcast && i < c->rank; i++) ok = c->dims[i] == a->dims[a->rank - c->rank + i];
        if (!ok)
            fail(&b, KILN_ERR_SHAPE, "shapes %s and %s do not match%s", DIMS_STR(g, a), DIMS_STR(g, c),
                 broadcast ? " (b must equal a's trailing dims)" : "");
    }
    if (b.ok) set_shape(&b, a->dtype, a->rank, a->dims);
    return finish(&b);
}

KILN_API kiln_node kiln_add(kiln_graph *g, kiln_node a, kiln_node b) { return binary(g, KILN_OP_ADD, a, b, true); }
KILN_API kiln_node kiln_mul(kiln_graph *g, kiln_node a, kiln_node b) { return binary(g, KILN_OP_MUL, a, b, true); }
KILN_API kiln_node kiln_swiglu(kiln_graph *g, kiln_node gate, kiln_node up)
{
    return binary(g, KILN_OP_SWIGLU, gate, up, false);
}
KILN_API kiln_node kiln_silu(kiln_graph *g, kiln_node x) { return unary(g, KILN_OP_SILU, x, 0); }
KILN_API kiln_node kiln_gelu(kiln_graph *g, kiln_node x) { return unary(g, KILN_OP_GELU, x, 0); }
KILN_API kiln_node kiln_sigmoid(kiln_graph *g, kiln_node x) { return unary(g, KILN_OP_SIGMOID, x, 0); }
KILN_API kiln_node kiln_tanh(kiln_graph *g, kiln_node x) { return unary(g, KILN_OP_TANH, x, 0); }

static bool slot_above(float a, float b) { return !isnan(a) && (isnan(b) || a > b); }

/* Insertion into a sorted list of at most k: a later index never passes an equal value. */
void kiln_moe_slots(const float *r, int64_t e, int k, int32_t *slot)
{
    int n = 0;
    for (int64_t j = 0; j < e; j++) {
        if (n == k && !slot_above(r[j], r[slot[k - 1]])) continue;
        int p = n < k ? n++ : k - 1;
        for (; p > 0 && slot_above(r[j], r[slot[p - 1]]); p--) slot[p] = slot[p - 1];
        slot[p] = (int32_t)j;
    }
}

kiln_node kiln_op_unary(kiln_graph *g, enum kiln_op op, kiln_node x)
{
    if (g && g->status == KILN_OK && !kiln_op_is_elementwise(op))
        return kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "%s is not a unary elementwise op", kiln_op_name(op));
    return unary(g, op, x, 0);
}
KILN_API kiln_node kiln_softmax(kiln_graph *g, kiln_node x) { return unary(g, KILN_OP_SOFTMAX, x, 0); }

KILN_API kiln_node kiln_scale(kiln_graph *g, kiln_node x, float s)
{
    if (g && g->status == KILN_OK && !isfinite(s))
        return kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "scale: factor is not finite");
    return unary(g, KILN_OP_SCALE, x, s);
}

KILN_API kiln_node kiln_matmul(kiln_graph *g, kiln_node x, kiln_node w)
{
    build b = begin(g, KILN_OP_MATMUL);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    const kiln_node_rec *m = operand(&b, 1, "w", w, false);
    need_float(&b, "x", a);
    if (b.ok && m->dtype == KILN_DTYPE_I32) fail(&b, KILN_ERR_DTYPE, "w has dtype i32; it must be a float or block dtype");
    if (b.ok && m->rank != 2) fail(&b, KILN_ERR_SHAPE, "w has rank %d; it must be [N, K]", m->rank);
    if (b.ok && a->dims[a->rank - 1] != m->dims[1])
        fail(&b, KILN_ERR_SHAPE, "x %s has K = last dim, but w %s is [N, K] with another K", DIMS_STR(g, a),
             DIMS_STR(g, m));
    if (b.ok && is_block(m->dtype) && m->op != KILN_OP_WEIGHT)
        fail(&b, KILN_ERR_DTYPE, "w of block dtype %s must be a weight", kiln_dtype_name(m->dtype));
    if (b.ok) {
        set_shape(&b, KILN_DTYPE_F32, a->rank, a->dims);
        b.r.dims[a->rank - 1] = m->dims[0];
    }
    return finish(&b);
}

/* Checks an optional per-channel vector (norm weight/bias) of length = x's last dim. */
static void norm_vec(build *b, int slot, const char *what, kiln_node h, const kiln_node_rec *x)
{
    const kiln_node_rec *w = operand(b, slot, what, h, true);
    if (!w || !b->ok || !x) return;
    need_float(b, what, w);
    if (b->ok && (w->rank != 1 || w->dims[0] != x->dims[x->rank - 1]))
        fail(b, KILN_ERR_SHAPE, "%s is %s; it must be [%s] (x's last dim)", what, DIMS_STR(b->g, w),
             kiln_graph_dims_str(b->g, 1, &x->dims[x->rank - 1], (char[64]){0}, 64));
}

static bool good_eps(build *b, float eps)
{
    if (b->ok && !(eps >= 0 && eps < 1)) return fail(b, KILN_ERR_INVALID_ARG, "eps %g must be in [0, 1)", (double)eps);
    return b->ok;
}

KILN_API kiln_node kiln_rms_norm(kiln_graph *g, kiln_node x, kiln_node w, float eps)
{
    build b = begin(g, KILN_OP_RMS_NORM);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    need_float(&b, "x", a);
    norm_vec(&b, 1, "w", w, a);
    good_eps(&b, eps);
    if (b.ok) set_shape(&b, a->dtype, a->rank, a->dims);
    b.r.f[0] = eps;
    return finish(&b);
}

KILN_API kiln_node kiln_layer_norm(kiln_graph *g, kiln_node x, kiln_node w, kiln_node bias, float eps)
{
    build b = begin(g, KILN_OP_LAYER_NORM);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    need_float(&b, "x", a);
    norm_vec(&b, 1, "w", w, a);
    norm_vec(&b, 2, "b", bias, a);
    good_eps(&b, eps);
    if (b.ok) set_shape(&b, a->dtype, a->rank, a->dims);
    b.r.f[0] = eps;
    return finish(&b);
}

static bool need_i32_vec(build *b, const char *what, const kiln_node_rec *p, int64_t len)
{
    if (!b->ok) return false;
    if (p->dtype != KILN_DTYPE_I32) return fail(b, KILN_ERR_DTYPE, "%s has dtype %s; it must be i32", what, kiln_dtype_name(p->dtype));
    if (p->rank != 1 || (len != 0 && p->dims[0] != len))
        return fail(b, KILN_ERR_SHAPE, "%s is %s; it must be [%s]", what, DIMS_STR(b->g, p),
                    kiln_graph_dims_str(b->g, 1, &len, (char[64]){0}, 64));
    return true;
}

KILN_API kiln_node kiln_rope_partial(kiln_graph *g, kiln_node x, kiln_node pos, kiln_rope_mode mode, float theta,
                                     const float *mult, int64_t n_rot)
{
    build b = begin(g, KILN_OP_ROPE);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    const kiln_node_rec *p = operand(&b, 1, "pos", pos, false);
    need_float(&b, "x", a);
    if (b.ok && a->rank != 3) fail(&b, KILN_ERR_SHAPE, "x is %s; it must be [n_tok, n_head, head_dim]", DIMS_STR(g, a));
    if (b.ok && kiln_dim_is_sym(a->dims[2]))
        fail(&b, KILN_ERR_SHAPE, "head_dim (last dim of x %s) must be a constant", DIMS_STR(g, a));
    if (b.ok && a->dims[2] % 2)
        fail(&b, KILN_ERR_SHAPE, "head_dim %lld must be even (x is %s)", (long long)a->dims[2], DIMS_STR(g, a));
    if (b.ok && (n_rot < 2 || n_rot % 2 || n_rot > a->dims[2]))
        fail(&b, KILN_ERR_INVALID_ARG, "rotary dims %lld must be even and in [2, head_dim %lld]", (long long)n_rot,
             (long long)a->dims[2]);
    if (b.ok) need_i32_vec(&b, "pos", p, a->dims[0]);
    if (b.ok && (unsigned)mode >= KILN_ROPE_MODE_COUNT) fail(&b, KILN_ERR_INVALID_ARG, "unknown mode %d", (int)mode);
    if (b.ok && !(theta > 1 && isfinite(theta))) fail(&b, KILN_ERR_INVALID_ARG, "theta %g must be > 1", (double)theta);
    int64_t half = b.ok ? n_rot / 2 : 0;
    for (int64_t i = 0; mult && b.ok && i < half; i++)
        if (!(mult[i] > 0 && isfinite(mult[i])))
            fail(&b, KILN_ERR_INVALID_ARG, "frequency multiplier %lld is %g; it must be finite and > 0", (long long)i,
                 (double)mult[i]);
    if (b.ok) set_shape(&b, a->dtype, a->rank, a->dims);
    b.r.i[0] = mode;
    b.r.i[1] = b.ok && n_rot < a->dims[2] ? (int32_t)n_rot : 0; /* 0: the whole head (kiln_rope_ext's node) */
    b.r.f[0] = theta;
    kiln_node h = finish(&b);
    if (h == KILN_NODE_NONE || !mult) return h;
    kiln_node_rec *n = &g->nodes[g->n_nodes - 1];
    if (!(n->vec = malloc((size_t)half * sizeof *n->vec))) {
        g->n_nodes--; /* not yet visible to anyone */
        return kiln_graph_fail(g, KILN_ERR_NOMEM, "rope: out of memory");
    }
    memcpy(n->vec, mult, (size_t)half * sizeof *n->vec);
    n->n_vec = (uint32_t)half;
    return h;
}

KILN_API kiln_node kiln_rope_ext(kiln_graph *g, kiln_node x, kiln_node pos, kiln_rope_mode mode, float theta,
                                 const float *mult)
{
    uint32_t xi;
    /* the head width names the rotary dims; a bad x is named by kiln_rope_partial's checks */
    int64_t hd = g && x != KILN_NODE_NONE && (x >> 32) == g->id && (xi = (uint32_t)x - 1) < g->n_nodes && g->nodes[xi].rank == 3
                     ? g->nodes[xi].dims[2]
                     : 2;
    return kiln_rope_partial(g, x, pos, mode, theta, mult, hd);
}

KILN_API kiln_node kiln_rope(kiln_graph *g, kiln_node x, kiln_node pos, kiln_rope_mode mode, float theta)
{
    return kiln_rope_ext(g, x, pos, mode, theta, NULL);
}

double kiln_rope_freq(const kiln_node_rec *n, int64_t i, int64_t hd)
{
    int64_t d = kiln_rope_dims(n, hd);
    if (i >= d / 2) return 0; /* a pass-through pair: turned by 0 */
    double f = pow((double)n->f[0], -2.0 * (double)i / (double)d);
    return n->vec && i < (int64_t)n->n_vec ? f * (double)n->vec[i] : f;
}

/* A cache operand of attention/kv_scatter: rank 3, constant dims, float dtype (q8_0 too where
 * `pool`: kv_scatter and paged attention; its head_dim a multiple of 32, checked by kiln_state). */
static bool cache_operand(build *b, const char *what, const kiln_node_rec *c, bool pool)
{
    if (!b->ok) return false;
    if (!(pool && c && c->dtype == KILN_DTYPE_Q8_0)) need_float(b, what, c);
    if (b->ok && (c->rank != 3 || kiln_dim_is_sym(c->dims[0]) || kiln_dim_is_sym(c->dims[1]) ||
                  kiln_dim_is_sym(c->dims[2])))
        fail(b, KILN_ERR_SHAPE, "%s is %s; it must be a constant [n_kv_head, max_ctx, head_dim]", what,
             DIMS_STR(b->g, c));
    return b->ok;
}

/* Attention's soft-cap (f[1]) and window (i[1]), shared by both attention builders. */
static void set_mask(build *b, float softcap, int64_t window)
{
    if (b->ok && !(softcap >= 0 && isfinite(softcap)))
        fail(b, KILN_ERR_INVALID_ARG, "softcap %g must be >= 0 (0: none) and finite", (double)softcap);
    if (b->ok && (window < 0 || window > INT32_MAX))
        fail(b, KILN_ERR_INVALID_ARG, "window %lld must be in [0, 2^31) (0: none)", (long long)window);
    if (b->ok) {
        b->r.f[1] = softcap;
        b->r.i[1] = (int32_t)window;
    }
}

KILN_API kiln_node kiln_attention(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_dim n_kv, float scale)
{
    return kiln_attention_ext(g, q, k, v, n_kv, scale, 0.0f, 0);
}

KILN_API kiln_node kiln_attention_ext(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_dim n_kv, float scale,
                                      float softcap, int64_t window)
{
    build b = begin(g, KILN_OP_ATTENTION);
    const kiln_node_rec *qn = operand(&b, 0, "q", q, false);
    const kiln_node_rec *kn = operand(&b, 1, "k", k, false);
    const kiln_node_rec *vn = operand(&b, 2, "v", v, false);
    need_float(&b, "q", qn);
    if (b.ok && (qn->rank != 3 || kiln_dim_is_sym(qn->dims[1]) || kiln_dim_is_sym(qn->dims[2])))
        fail(&b, KILN_ERR_SHAPE, "q is %s; it must be [n_tok, n_head, head_dim] (n_head, head_dim constant)", DIMS_STR(g, qn));
    cache_operand(&b, "k", kn, false);
    cache_operand(&b, "v", vn, false);
    if (b.ok && !dims_equal(kn, vn)) fail(&b, KILN_ERR_SHAPE, "k %s and v %s differ", DIMS_STR(g, kn), DIMS_STR(g, vn));
    if (b.ok && kn->dtype != vn->dtype) fail(&b, KILN_ERR_DTYPE, "k and v dtypes differ");
    if (b.ok && kn->dims[2] != qn->dims[2])
        fail(&b, KILN_ERR_SHAPE, "head_dim of q %s and of k %s differ", DIMS_STR(g, qn), DIMS_STR(g, kn));
    if (b.ok && qn->dims[1] % kn->dims[0])
        fail(&b, KILN_ERR_SHAPE, "n_head %lld is not a multiple of n_kv_head %lld", (long long)qn->dims[1],
             (long long)kn->dims[0]);
    int64_t bound = 0;
    if (b.ok && kiln_dim_is_sym(n_kv)) {
        if (kiln_sym_index(n_kv) >= g->n_syms) fail(&b, KILN_ERR_SHAPE, "n_kv is not a symbol of this graph");
        else bound = g->syms[kiln_sym_index(n_kv)].max;
    } else bound = n_kv;
    if (b.ok && (bound < 1 || bound > kn->dims[1]))
        fail(&b, KILN_ERR_SHAPE, "n_kv (at most %lld) must be in [1, max_ctx = %lld]", (long long)bound,
             (long long)kn->dims[1]);
    if (b.ok && kiln_dim_is_sym(qn->dims[0]) && g->syms[kiln_sym_index(qn->dims[0])].max > kn->dims[1])
        fail(&b, KILN_ERR_SHAPE, "n_tok's bound exceeds max_ctx %lld", (long long)kn->dims[1]);
    if (b.ok && !(scale >= 0 && isfinite(scale))) fail(&b, KILN_ERR_INVALID_ARG, "scale %g must be >= 0 and finite", (double)scale);
    if (b.ok) {
        set_shape(&b, KILN_DTYPE_F32, 3, qn->dims);
        b.r.dim = n_kv;
        b.r.f[0] = scale == 0 ? (float)(1.0 / sqrt((double)qn->dims[2])) : scale;
    }
    set_mask(&b, softcap, window);
    return finish(&b);
}

KILN_API kiln_node kiln_kv_scatter(kiln_graph *g, kiln_node state, kiln_node rows, kiln_node pos)
{
    build b = begin(g, KILN_OP_KV_SCATTER);
    const kiln_node_rec *s = operand(&b, 0, "state", state, false);
    const kiln_node_rec *r = operand(&b, 1, "rows", rows, false);
    const kiln_node_rec *p = operand(&b, 2, "pos", pos, false);
    if (b.ok && s->op != KILN_OP_STATE && s->op != KILN_OP_KV_SCATTER)
        fail(&b, KILN_ERR_NODE, "state must be a state leaf or a kv_scatter of one, not a %s", kiln_op_name(s->op));
    cache_operand(&b, "state", s, true);
    need_float(&b, "rows", r);
    if (b.ok && (r->rank != 3 || r->dims[1] != s->dims[0] || r->dims[2] != s->dims[2]))
        fail(&b, KILN_ERR_SHAPE, "rows is %s; it must be [n_tok, %lld, %lld] to fit state %s", DIMS_STR(g, r),
             (long long)s->dims[0], (long long)s->dims[2], DIMS_STR(g, s));
    if (b.ok) need_i32_vec(&b, "pos", p, r->dims[0]);
    if (b.ok) set_shape(&b, s->dtype, 3, s->dims);
    return finish(&b);
}

/* An i32 metadata table [rows, cols] of paged attention (rows the sequence count, cols constant). */
static bool need_i32_table(build *b, const char *what, const kiln_node_rec *t, int64_t rows, int64_t cols)
{
    if (!b->ok) return false;
    if (t->dtype != KILN_DTYPE_I32) return fail(b, KILN_ERR_DTYPE, "%s has dtype %s; it must be i32", what, kiln_dtype_name(t->dtype));
    if (t->rank != 2 || (rows != 0 && t->dims[0] != rows) || kiln_dim_is_sym(t->dims[1]) || (cols && t->dims[1] != cols) ||
        t->dims[1] < 1)
        return fail(b, KILN_ERR_SHAPE, "%s is %s; it must be [n_seq, %s]", what, DIMS_STR(b->g, t), cols == 2 ? "2" : "max_blocks");
    return true;
}

/* parents KILN_NODE_NONE: a step without a tree (n_src stays 6, so the .kg form has no parents). */
static kiln_node paged(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_node pos, kiln_node seqs,
                       kiln_node blocks, kiln_node parents, int block, float scale, float softcap, int64_t window)
{
    build b = begin(g, KILN_OP_PAGED_ATTENTION);
    const kiln_node_rec *qn = operand(&b, 0, "q", q, false), *kn = operand(&b, 1, "k", k, false);
    const kiln_node_rec *vn = operand(&b, 2, "v", v, false), *pn = operand(&b, 3, "pos", pos, false);
    const kiln_node_rec *sn = operand(&b, 4, "seqs", seqs, false), *bn = operand(&b, 5, "blocks", blocks, false);
    const kiln_node_rec *tn = parents != KILN_NODE_NONE ? operand(&b, 6, "parents", parents, false) : NULL;
    need_float(&b, "q", qn);
    if (b.ok && (qn->rank != 3 || kiln_dim_is_sym(qn->dims[1]) || kiln_dim_is_sym(qn->dims[2])))
        fail(&b, KILN_ERR_SHAPE, "q is %s; it must be [n_tok, n_head, head_dim] (n_head, head_dim constant)", DIMS_STR(g, qn));
    cache_operand(&b, "k", kn, true);
    cache_operand(&b, "v", vn, true);
    if (b.ok && !dims_equal(kn, vn)) fail(&b, KILN_ERR_SHAPE, "k %s and v %s differ", DIMS_STR(g, kn), DIMS_STR(g, vn));
    if (b.ok && kn->dtype != vn->dtype) fail(&b, KILN_ERR_DTYPE, "k and v dtypes differ");
    if (b.ok && kn->dims[2] != qn->dims[2])
        fail(&b, KILN_ERR_SHAPE, "head_dim of q %s and of k %s differ", DIMS_STR(g, qn), DIMS_STR(g, kn));
    if (b.ok && qn->dims[1] % kn->dims[0])
        fail(&b, KILN_ERR_SHAPE, "n_head %lld is not a multiple of n_kv_head %lld", (long long)qn->dims[1], (long long)kn->dims[0]);
    if (b.ok && (block < 1 || block > 1024 || (block & (block - 1))))
        fail(&b, KILN_ERR_INVALID_ARG, "block %d must be a power of two in [1, 1024]", block);
    if (b.ok && kn->dims[1] % block)
        fail(&b, KILN_ERR_SHAPE, "the pool's %lld slots (k %s) are not whole blocks of %d", (long long)kn->dims[1],
             DIMS_STR(g, kn), block);
    if (b.ok) need_i32_vec(&b, "pos", pn, qn->dims[0]);
    if (b.ok) need_i32_table(&b, "seqs", sn, 0, 2);
    if (b.ok) need_i32_table(&b, "blocks", bn, sn->dims[0], 0);
    if (b.ok && tn) need_i32_vec(&b, "parents", tn, qn->dims[0]);
    if (b.ok && !(scale >= 0 && isfinite(scale))) fail(&b, KILN_ERR_INVALID_ARG, "scale %g must be >= 0 and finite", (double)scale);
    if (b.ok) {
        set_shape(&b, KILN_DTYPE_F32, 3, qn->dims);
        b.r.i[0] = block;
        b.r.f[0] = scale == 0 ? (float)(1.0 / sqrt((double)qn->dims[2])) : scale;
    }
    set_mask(&b, softcap, window);
    return finish(&b);
}

KILN_API kiln_node kiln_paged_attention(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_node pos,
                                        kiln_node seqs, kiln_node blocks, int block, float scale)
{
    return paged(g, q, k, v, pos, seqs, blocks, KILN_NODE_NONE, block, scale, 0.0f, 0);
}

KILN_API kiln_node kiln_paged_attention_ext(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_node pos,
                                            kiln_node seqs, kiln_node blocks, int block, float scale, float softcap,
                                            int64_t window)
{
    return paged(g, q, k, v, pos, seqs, blocks, KILN_NODE_NONE, block, scale, softcap, window);
}

KILN_API kiln_node kiln_paged_attention_tree(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_node pos,
                                             kiln_node seqs, kiln_node blocks, kiln_node parents, int block,
                                             float scale)
{
    if (g && g->status == KILN_OK && parents == KILN_NODE_NONE)
        return kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "paged_attention: a tree step needs parents (none given)");
    return paged(g, q, k, v, pos, seqs, blocks, parents, block, scale, 0.0f, 0); /* trees: no soft-cap or window */
}

KILN_API kiln_node kiln_get_rows(kiln_graph *g, kiln_node table, kiln_node ids)
{
    build b = begin(g, KILN_OP_GET_ROWS);
    const kiln_node_rec *t = operand(&b, 0, "table", table, false);
    const kiln_node_rec *i = operand(&b, 1, "ids", ids, false);
    if (b.ok && (t->rank != 2 || t->dtype == KILN_DTYPE_I32))
        fail(&b, KILN_ERR_SHAPE, "table is %s %s; it must be [V, D] of a float or block dtype", kiln_dtype_name(t->dtype),
             DIMS_STR(g, t));
    if (b.ok) need_i32_vec(&b, "ids", i, 0);
    if (b.ok) set_shape(&b, KILN_DTYPE_F32, 2, (int64_t[]){i->dims[0], t->dims[1]});
    return finish(&b);
}

KILN_API kiln_node kiln_argmax(kiln_graph *g, kiln_node x)
{
    build b = begin(g, KILN_OP_ARGMAX);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    need_float(&b, "x", a);
    if (b.ok) {
        if (a->rank == 1) set_shape(&b, KILN_DTYPE_I32, 1, (int64_t[]){1});
        else set_shape(&b, KILN_DTYPE_I32, a->rank - 1, a->dims);
    }
    return finish(&b);
}

static bool need_f32(build *b, const char *what, const kiln_node_rec *n)
{
    if (!b->ok || !n || n->dtype == KILN_DTYPE_F32) return b->ok;
    return fail(b, KILN_ERR_DTYPE, "%s has dtype %s; this op takes f32", what, kiln_dtype_name(n->dtype));
}

KILN_API kiln_node kiln_moe_route(kiln_graph *g, kiln_node x, int k, bool norm)
{
    build b = begin(g, KILN_OP_MOE_ROUTE);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    need_f32(&b, "x", a);
    if (b.ok && a->rank < 1) fail(&b, KILN_ERR_SHAPE, "x must have at least one dim");
    int64_t e = b.ok ? a->dims[a->rank - 1] : 0;
    if (b.ok && kiln_dim_is_sym(e)) fail(&b, KILN_ERR_SHAPE, "x %s: the experts (last dim) must be constant", DIMS_STR(g, a));
    if (b.ok && (k < 1 || k > e))
        fail(&b, KILN_ERR_INVALID_ARG, "k = %d experts kept of %lld (need 1 <= k <= the last dim)", k, (long long)e);
    if (b.ok) set_shape(&b, KILN_DTYPE_F32, a->rank, a->dims);
    b.r.i[0] = k;
    b.r.i[1] = norm ? 1 : 0;
    return finish(&b);
}

KILN_API kiln_node kiln_scale_rows(kiln_graph *g, kiln_node x, kiln_node w, int col)
{
    build b = begin(g, KILN_OP_SCALE_ROWS);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    const kiln_node_rec *c = operand(&b, 1, "w", w, false);
    need_f32(&b, "x", a);
    need_f32(&b, "w", c);
    if (b.ok && (a->rank < 1 || a->rank != c->rank))
        fail(&b, KILN_ERR_SHAPE, "x %s and w %s: need the same rank >= 1", DIMS_STR(g, a), DIMS_STR(g, c));
    for (int i = 0; b.ok && i + 1 < a->rank; i++)
        if (a->dims[i] != c->dims[i])
            fail(&b, KILN_ERR_SHAPE, "x %s and w %s: leading dims differ", DIMS_STR(g, a), DIMS_STR(g, c));
    int64_t cc = b.ok ? c->dims[c->rank - 1] : 0;
    if (b.ok && (kiln_dim_is_sym(cc) || col < 0 || col >= cc))
        fail(&b, KILN_ERR_INVALID_ARG, "col %d is not a column of w %s", col, DIMS_STR(g, c));
    if (b.ok) set_shape(&b, KILN_DTYPE_F32, a->rank, a->dims);
    b.r.i[0] = col;
    return finish(&b);
}

KILN_API kiln_node kiln_moe_matmul(kiln_graph *g, kiln_node x, kiln_node w, kiln_node r, int k, bool sum)
{
    build b = begin(g, KILN_OP_MOE_MATMUL);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    const kiln_node_rec *m = operand(&b, 1, "w", w, false);
    const kiln_node_rec *c = operand(&b, 2, "r", r, false);
    need_float(&b, "x", a);
    need_f32(&b, "r", c);
    if (b.ok && m->dtype == KILN_DTYPE_I32) fail(&b, KILN_ERR_DTYPE, "w has dtype i32; it must be a float or block dtype");
    if (b.ok && m->rank != 3) fail(&b, KILN_ERR_SHAPE, "w %s must be a stack of experts [E, N, K]", DIMS_STR(g, m));
    if (b.ok && is_block(m->dtype) && m->op != KILN_OP_WEIGHT)
        fail(&b, KILN_ERR_DTYPE, "w of block dtype %s must be a weight", kiln_dtype_name(m->dtype));
    if (b.ok && (c->rank != 2 || c->dims[1] != m->dims[0]))
        fail(&b, KILN_ERR_SHAPE, "r %s must be [T, E] with w %s's E experts", DIMS_STR(g, c), DIMS_STR(g, m));
    if (b.ok && (k < 1 || k > m->dims[0]))
        fail(&b, KILN_ERR_INVALID_ARG, "k = %d experts per token of %lld (need 1 <= k <= E)", k, (long long)m->dims[0]);
    if (b.ok && !((a->rank == 2 && a->dims[0] == c->dims[0]) || (a->rank == 3 && a->dims[0] == c->dims[0] && a->dims[1] == k)))
        fail(&b, KILN_ERR_SHAPE, "x %s must be [T, K] or [T, k = %d, K] with r %s's T", DIMS_STR(g, a), k, DIMS_STR(g, c));
    if (b.ok && a->dims[a->rank - 1] != m->dims[2])
        fail(&b, KILN_ERR_SHAPE, "x %s has K = last dim, but w %s is [E, N, K] with another K", DIMS_STR(g, a),
             DIMS_STR(g, m));
    if (b.ok) {
        int64_t d[3] = {a->dims[0], sum ? m->dims[1] : k, m->dims[1]};
        set_shape(&b, KILN_DTYPE_F32, sum ? 2 : 3, d);
    }
    b.r.i[0] = k;
    b.r.i[1] = sum ? 1 : 0;
    return finish(&b);
}

KILN_API kiln_node kiln_all_reduce(kiln_graph *g, kiln_node x)
{
    build b = begin(g, KILN_OP_ALL_REDUCE);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    if (b.ok && a->dtype != KILN_DTYPE_F32)
        fail(&b, KILN_ERR_DTYPE, "x has dtype %s; all_reduce sums f32 partial results", kiln_dtype_name(a->dtype));
    if (b.ok) set_shape(&b, a->dtype, a->rank, a->dims);
    return finish(&b);
}

KILN_API kiln_node kiln_all_gather(kiln_graph *g, kiln_node x)
{
    build b = begin(g, KILN_OP_ALL_GATHER);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    if (b.ok && a->dtype != KILN_DTYPE_F32)
        fail(&b, KILN_ERR_DTYPE, "x has dtype %s; all_gather joins f32 slices", kiln_dtype_name(a->dtype));
    if (b.ok && a->rank >= KILN_MAX_RANK)
        fail(&b, KILN_ERR_SHAPE, "x has rank %d; all_gather adds a leading dim (rank at most %d)", a->rank, KILN_MAX_RANK - 1);
    if (b.ok) {
        int64_t d[KILN_MAX_RANK] = {1};
        memcpy(d + 1, a->dims, (size_t)a->rank * sizeof *d);
        set_shape(&b, a->dtype, a->rank + 1, d);
    }
    return finish(&b);
}

KILN_API kiln_node kiln_cast(kiln_graph *g, kiln_node x, kiln_dtype t)
{
    build b = begin(g, KILN_OP_CAST);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    if (b.ok && (is_block(a->dtype) || a->dtype >= KILN_DTYPE_COUNT))
        fail(&b, KILN_ERR_DTYPE, "x has dtype %s; cast takes f32, f16, bf16 or i32", kiln_dtype_name(a->dtype));
    if (b.ok && ((unsigned)t >= KILN_DTYPE_COUNT || is_block((uint8_t)t)))
        fail(&b, KILN_ERR_DTYPE, "target dtype %s; cast makes f32, f16, bf16 or i32", kiln_dtype_name(t));
    if (b.ok) set_shape(&b, (uint8_t)t, a->rank, a->dims);
    return finish(&b);
}

/* Splits dims into (product of constants, multiset of symbols as a sorted list). The product is -1
 * when it overflows int64 (target dims are each at most 2^40: four of them reach 2^160). */
static int64_t split_dims(int rank, const int64_t *dims, int64_t *syms, int *n_syms)
{
    int64_t p = 1;
    *n_syms = 0;
    for (int i = 0; i < rank; i++) {
        if (kiln_dim_is_sym(dims[i])) {
            int j = (*n_syms)++;
            while (j > 0 && syms[j - 1] > dims[i]) syms[j] = syms[j - 1], j--;
            syms[j] = dims[i];
        } else if (p >= 0 && __builtin_mul_overflow(p, dims[i], &p)) {
            p = -1;
        }
    }
    return p;
}

/* Validates a user-given dims array of a reshape/view target. */
static bool target_dims(build *b, int rank, const kiln_dim *dims, bool allow_sym)
{
    if (!b->ok) return false;
    if (rank < 1 || rank > KILN_MAX_RANK) return fail(b, KILN_ERR_SHAPE, "rank %d out of range [1, %d]", rank, KILN_MAX_RANK);
    if (!dims) return fail(b, KILN_ERR_INVALID_ARG, "dims is NULL");
    for (int i = 0; i < rank; i++) {
        if (kiln_dim_is_sym(dims[i])) {
            if (!allow_sym) return fail(b, KILN_ERR_SHAPE, "dim %d: a view's dims must be constant", i);
            if (kiln_sym_index(dims[i]) >= b->g->n_syms) return fail(b, KILN_ERR_SHAPE, "dim %d is not a symbol of this graph", i);
        } else if (dims[i] < 1 || dims[i] > ((int64_t)1 << 40)) {
            return fail(b, KILN_ERR_SHAPE, "dim %d is %lld (must be in [1, 2^40])", i, (long long)dims[i]);
        }
    }
    return true;
}

KILN_API kiln_node kiln_reshape(kiln_graph *g, kiln_node x, int rank, const kiln_dim *dims)
{
    build b = begin(g, KILN_OP_RESHAPE);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    target_dims(&b, rank, dims, true);
    if (b.ok && is_block(a->dtype)) fail(&b, KILN_ERR_DTYPE, "cannot reshape a %s tensor", kiln_dtype_name(a->dtype));
    if (b.ok) {
        int64_t s0[KILN_MAX_RANK], s1[KILN_MAX_RANK];
        int n0, n1;
        int64_t p0 = split_dims(a->rank, a->dims, s0, &n0), p1 = split_dims(rank, dims, s1, &n1);
        if (p1 < 0)
            fail(&b, KILN_ERR_SHAPE, "cannot reshape %s to %s (the target's element count overflows int64)", DIMS_STR(g, a),
                 kiln_graph_dims_str(g, rank, dims, (char[160]){0}, 160));
        else if (p0 != p1 || n0 != n1 || memcmp(s0, s1, (size_t)n0 * sizeof *s0))
            fail(&b, KILN_ERR_SHAPE, "cannot reshape %s to %s (element counts differ, or symbols do not match)",
                 DIMS_STR(g, a), kiln_graph_dims_str(g, rank, dims, (char[160]){0}, 160));
    }
    if (b.ok) set_shape(&b, a->dtype, rank, dims);
    return finish(&b);
}

KILN_API kiln_node kiln_view(kiln_graph *g, kiln_node x, int rank, const kiln_dim *dims, int64_t offset)
{
    build b = begin(g, KILN_OP_VIEW);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    target_dims(&b, rank, dims, false);
    if (b.ok && is_block(a->dtype)) fail(&b, KILN_ERR_DTYPE, "cannot view a %s tensor", kiln_dtype_name(a->dtype));
    if (b.ok) {
        int64_t syms[KILN_MAX_RANK], n_src = 1, n = 1;
        int ns;
        n_src = split_dims(a->rank, a->dims, syms, &ns);
        n = split_dims(rank, dims, (int64_t[KILN_MAX_RANK]){0}, &(int){0}); /* constant: target_dims said so */
        if (ns) fail(&b, KILN_ERR_SHAPE, "x %s has symbolic dims; views need constant ones", DIMS_STR(g, a));
        else if (n < 0)
            fail(&b, KILN_ERR_SHAPE, "view %s: the element count overflows int64",
                 kiln_graph_dims_str(g, rank, dims, (char[160]){0}, 160));
        else if (offset < 0 || offset > n_src || n > n_src - offset)
            fail(&b, KILN_ERR_SHAPE, "%lld elements at offset %lld do not fit in x %s", (long long)n, (long long)offset,
                 DIMS_STR(g, a));
    }
    if (b.ok) set_shape(&b, a->dtype, rank, dims);
    b.r.dim = offset;
    return finish(&b);
}

KILN_API kiln_node kiln_transpose(kiln_graph *g, kiln_node x, int d0, int d1)
{
    build b = begin(g, KILN_OP_TRANSPOSE);
    const kiln_node_rec *a = operand(&b, 0, "x", x, false);
    if (b.ok && is_block(a->dtype)) fail(&b, KILN_ERR_DTYPE, "cannot transpose a %s tensor", kiln_dtype_name(a->dtype));
    if (b.ok && (d0 < 0 || d1 < 0 || d0 >= a->rank || d1 >= a->rank))
        fail(&b, KILN_ERR_SHAPE, "dims %d and %d out of range for rank %d", d0, d1, a->rank);
    if (b.ok) {
        set_shape(&b, a->dtype, a->rank, a->dims);
        b.r.dims[d0] = a->dims[d1];
        b.r.dims[d1] = a->dims[d0];
    }
    b.r.i[0] = d0;
    b.r.i[1] = d1;
    return finish(&b);
}

KILN_API kiln_node kiln_concat(kiln_graph *g, kiln_node x, kiln_node y, int axis)
{
    build b = begin(g, KILN_OP_CONCAT);
    const kiln_node_rec *a = operand(&b, 0, "a", x, false);
    const kiln_node_rec *c = operand(&b, 1, "b", y, false);
    if (b.ok && (a->dtype != c->dtype || is_block(a->dtype)))
        fail(&b, KILN_ERR_DTYPE, "dtypes %s and %s must be equal and not block formats", kiln_dtype_name(a->dtype),
             kiln_dtype_name(c->dtype));
    if (b.ok && (a->rank != c->rank || axis < 0 || axis >= a->rank))
        fail(&b, KILN_ERR_SHAPE, "ranks %d and %d must match and axis %d be in range", a->rank, c->rank, axis);
    for (int i = 0; b.ok && i < a->rank; i++)
        if (i != axis && a->dims[i] != c->dims[i])
            fail(&b, KILN_ERR_SHAPE, "%s and %s differ in dim %d (only the axis %d may differ)", DIMS_STR(g, a),
                 DIMS_STR(g, c), i, axis);
    if (b.ok && (kiln_dim_is_sym(a->dims[axis]) || kiln_dim_is_sym(c->dims[axis])))
        fail(&b, KILN_ERR_SHAPE, "cannot concat along a symbolic dim");
    if (b.ok) {
        set_shape(&b, a->dtype, a->rank, a->dims);
        b.r.dims[axis] = a->dims[axis] + c->dims[axis];
    }
    b.r.i[0] = axis;
    return finish(&b);
}
