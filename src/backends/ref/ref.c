/* The reference backend's entry point and its simple kernels: element-wise ops, row reductions
 * (norms, softmax, argmax), cast and the layout ops (reshape/view/transpose/concat). Every value
 * goes through f32, one node at a time. Must stay obviously correct: no SIMD, no threads, no
 * fusion; the heavier kernels (matmul, rope, attention, kv_scatter, get_rows) are in ref_nn.c. */
#include "backends/ref/ref_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

kiln_status kiln_ref_fail(const kiln_ref_ctx *c, kiln_status s, const char *fmt, ...)
{
    if (!c->err || c->n_err == 0)
        return s;
    const char *op = kiln_op_name((enum kiln_op)c->node->op);
    op = op ? op : "?";
    int k = c->node->name ? snprintf(c->err, c->n_err, "%s '%s': ", op, c->node->name)
                          : snprintf(c->err, c->n_err, "%s #%u: ", op, c->idx);
    if (k < 0 || (size_t)k >= c->n_err)
        return s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, c->n_err - (size_t)k, fmt, ap);
    va_end(ap);
    return s;
}

int64_t kiln_ref_numel(const kiln_exec_view *v, uint32_t i)
{
    int64_t n = 1;
    for (int d = 0; d < v->g->nodes[i].rank; d++)
        n *= v->dims[i][d];
    return n;
}

int64_t kiln_ref_last_dim(const kiln_exec_view *v, uint32_t i)
{
    int r = v->g->nodes[i].rank;
    return r > 0 ? v->dims[i][r - 1] : 1;
}

/* Byte offset of element `off` in a tensor of dtype t (off a multiple of the block). */
static size_t elem_bytes(kiln_dtype t, int64_t off)
{
    return (size_t)(off / kiln_dtype_block(t)) * kiln_dtype_block_bytes(t);
}

kiln_status kiln_ref_load(const kiln_ref_ctx *c, kiln_dtype t, const void *base, int64_t off, int64_t n, float *dst)
{
    if (n == 0) /* a zero-size tensor may have no buffer at all */
        return KILN_OK;
    const char *p = (const char *)base + elem_bytes(t, off);
    if (t == KILN_DTYPE_F32) {
        memcpy(dst, p, (size_t)n * sizeof(float));
        return KILN_OK;
    }
    if (t == KILN_DTYPE_I32) {
        for (int64_t i = 0; i < n; i++) {
            int32_t x;
            memcpy(&x, p + 4 * i, 4);
            dst[i] = (float)x;
        }
        return KILN_OK;
    }
    kiln_status s = kiln_dequantize(t, p, dst, n);
    if (s != KILN_OK)
        return kiln_ref_fail(c, s, "cannot read %lld %s values", (long long)n, kiln_dtype_name(t));
    return KILN_OK;
}

kiln_status kiln_ref_store(const kiln_ref_ctx *c, kiln_dtype t, void *base, int64_t off, int64_t n, const float *src)
{
    if (n == 0)
        return KILN_OK;
    char *p = (char *)base + elem_bytes(t, off);
    if (t == KILN_DTYPE_F32) {
        memcpy(p, src, (size_t)n * sizeof(float));
        return KILN_OK;
    }
    if (t == KILN_DTYPE_I32)
        return kiln_ref_fail(c, KILN_ERR_DTYPE, "cannot write i32 from float values");
    kiln_status s = kiln_quantize(t, src, p, n);
    if (s != KILN_OK)
        return kiln_ref_fail(c, s, "cannot write %lld %s values", (long long)n, kiln_dtype_name(t));
    return KILN_OK;
}

float *kiln_ref_alloc(const kiln_ref_ctx *c, int64_t n, kiln_status *st)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p)
        *st = kiln_ref_fail(c, KILN_ERR_NOMEM, "out of memory for %lld floats", (long long)n);
    return p;
}

float *kiln_ref_load_node(const kiln_ref_ctx *c, uint32_t i, kiln_status *st)
{
    int64_t n = kiln_ref_numel(c->v, i);
    float  *p = kiln_ref_alloc(c, n, st);
    if (!p)
        return NULL;
    *st = kiln_ref_load(c, (kiln_dtype)c->v->g->nodes[i].dtype, c->v->bufs[i], 0, n, p);
    if (*st != KILN_OK) {
        free(p);
        return NULL;
    }
    return p;
}

static bool has_src(const kiln_node_rec *n, int k)
{
    return k < n->n_src && n->src[k] != KILN_IDX_NONE;
}

/* ---------------------------------------------------------------- element-wise */

static float silu(float x) { return x / (1.0f + expf(-x)); }

static float gelu(float x)
{
    /* 0.5 (1 + tanh z) = 1 / (1 + e^-2z): the tanh form cancels for x < -3 (1 - 0.99999...), which
     * left gelu(-5) with a 5% relative error in f32 (found by kiln check on 1-element rows). */
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return x / (1.0f + expf(-2.0f * k * (x + 0.044715f * x * x * x)));
}

/* add, mul, swiglu (b broadcast over a's leading dims), scale, silu, gelu, sigmoid, tanh. */
static kiln_status elementwise(const kiln_ref_ctx *c)
{
    const kiln_node_rec *n = c->node;
    kiln_status st = KILN_OK;
    int64_t na = kiln_ref_numel(c->v, n->src[0]);
    int64_t nb = n->n_src > 1 ? kiln_ref_numel(c->v, n->src[1]) : 1;
    if (na == 0)
        return KILN_OK;
    if (nb <= 0 || na % nb != 0)
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "%lld elements do not broadcast over %lld", (long long)nb,
                             (long long)na);
    float *a = kiln_ref_load_node(c, n->src[0], &st), *b = NULL;
    if (a && n->n_src > 1)
        b = kiln_ref_load_node(c, n->src[1], &st);
    if (st == KILN_OK) {
        for (int64_t i = 0; i < na; i++) {
            float x = a[i], y = b ? b[i % nb] : 0.0f;
            switch ((enum kiln_op)n->op) {
            case KILN_OP_ADD: a[i] = x + y; break;
            case KILN_OP_MUL: a[i] = x * y; break;
            case KILN_OP_SWIGLU: a[i] = silu(x) * y; break;
            case KILN_OP_SCALE: a[i] = x * n->f[0]; break;
            case KILN_OP_SILU: a[i] = silu(x); break;
            case KILN_OP_GELU: a[i] = gelu(x); break;
            case KILN_OP_SIGMOID: a[i] = 1.0f / (1.0f + expf(-x)); break;
            case KILN_OP_TANH: a[i] = tanhf(x); break;
            default: a[i] = NAN; break; /* kiln_ref_exec sends only the ops above */
            }
        }
        st = kiln_ref_store(c, (kiln_dtype)n->dtype, c->v->bufs[c->idx], 0, na, a);
    }
    free(a);
    free(b);
    return st;
}

/* ---------------------------------------------------------------- row reductions */

/* Normalizes one row in place: rms_norm or layer_norm with optional weight w and bias b. The
 * reference must be the most robust backend: the mean, the sum of squares and the normalized value
 * are formed in f64, where the square of any f32 (up to 1.2e77) times any row length is finite; in
 * f32 the squares of |x| >~ 1.8e19 overflow and the row came out all zeros (issue #17). */
static void norm_row(float *x, int64_t d, bool layer, float eps, const float *w, const float *b)
{
    double mean = 0.0;
    if (layer) {
        for (int64_t j = 0; j < d; j++)
            mean += x[j];
        mean /= (double)d;
    }
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++)
        ss += ((double)x[j] - mean) * ((double)x[j] - mean);
    double inv = 1.0 / sqrt(ss / (double)d + (double)eps);
    for (int64_t j = 0; j < d; j++) {
        double y = ((double)x[j] - mean) * inv;
        if (w)
            y *= w[j];
        if (b)
            y += b[j];
        x[j] = (float)y;
    }
}

static void softmax_row(float *x, int64_t d)
{
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < d; j++)
        m = x[j] > m ? x[j] : m;
    for (int64_t j = 0; j < d; j++) {
        x[j] = expf(x[j] - m);
        sum += x[j];
    }
    for (int64_t j = 0; j < d; j++)
        x[j] /= sum;
}

/* rms_norm, layer_norm, softmax over the last dim. */
static kiln_status row_op(const kiln_ref_ctx *c)
{
    const kiln_node_rec *n = c->node;
    kiln_status st = KILN_OK;
    int64_t numel = kiln_ref_numel(c->v, n->src[0]), d = kiln_ref_last_dim(c->v, n->src[0]);
    float *x = kiln_ref_load_node(c, n->src[0], &st), *w = NULL, *b = NULL;
    if (x && has_src(n, 1))
        w = kiln_ref_load_node(c, n->src[1], &st);
    if (st == KILN_OK && has_src(n, 2))
        b = kiln_ref_load_node(c, n->src[2], &st);
    if (st == KILN_OK && d > 0) {
        for (int64_t r = 0; r < numel / d; r++) {
            if (n->op == KILN_OP_SOFTMAX)
                softmax_row(x + r * d, d);
            else
                norm_row(x + r * d, d, n->op == KILN_OP_LAYER_NORM, n->f[0], w, b);
        }
    }
    if (st == KILN_OK)
        st = kiln_ref_store(c, (kiln_dtype)n->dtype, c->v->bufs[c->idx], 0, numel, x);
    free(x);
    free(w);
    free(b);
    return st;
}

/* First index of the largest value; NaN counts as smaller than everything (all NaN -> 0). */
static kiln_status argmax(const kiln_ref_ctx *c)
{
    kiln_status st = KILN_OK;
    uint32_t s = c->node->src[0];
    int64_t numel = kiln_ref_numel(c->v, s), d = kiln_ref_last_dim(c->v, s);
    float *x = kiln_ref_load_node(c, s, &st);
    if (!x)
        return st;
    int32_t *y = c->v->bufs[c->idx];
    for (int64_t r = 0; d > 0 && r < numel / d; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < d; j++) {
            float xv = x[r * d + j];
            if (!isnan(xv) && (best < 0 || xv > x[r * d + best]))
                best = j;
        }
        y[r] = (int32_t)(best < 0 ? 0 : best);
    }
    free(x);
    return KILN_OK;
}

/* Whether a ranks above b in a router's top-k: larger first, NaN below every number. */
static bool route_above(float a, float b) { return !isnan(a) && (isnan(b) || a > b); }

/* moe_route: per row of E logits, softmax, the k largest (k passes of a first-index argmax over
 * those not taken yet) keep their probability, the rest 0; norm: the kept ones over their sum. */
static kiln_status moe_route(const kiln_ref_ctx *c)
{
    kiln_status st = KILN_OK;
    uint32_t s = c->node->src[0];
    int64_t numel = kiln_ref_numel(c->v, s), e = kiln_ref_last_dim(c->v, s), k = c->node->i[0];
    float *x = kiln_ref_load_node(c, s, &st);
    float *y = calloc((size_t)(numel ? numel : 1), sizeof *y);
    bool *taken = calloc((size_t)(e ? e : 1), sizeof *taken);
    if (!x || !y || !taken) {
        free(x), free(y), free(taken);
        return st != KILN_OK ? st : kiln_ref_fail(c, KILN_ERR_NOMEM, "out of memory");
    }
    for (int64_t r = 0; e > 0 && r < numel / e; r++) {
        const float *xr = x + r * e;
        float *yr = y + r * e, mx = -INFINITY, sum = 0, kept = 0;
        for (int64_t j = 0; j < e; j++) mx = xr[j] > mx ? xr[j] : mx;
        for (int64_t j = 0; j < e; j++) sum += expf(xr[j] - mx);
        memset(taken, 0, (size_t)e * sizeof *taken);
        for (int64_t t = 0; t < k; t++) {
            int64_t best = -1;
            for (int64_t j = 0; j < e; j++)
                if (!taken[j] && (best < 0 || route_above(xr[j], xr[best]))) best = j;
            taken[best] = true;
            yr[best] = expf(xr[best] - mx) / sum;
            kept += yr[best];
        }
        for (int64_t j = 0; c->node->i[1] && j < e; j++) yr[j] = taken[j] ? yr[j] / kept : 0.0f;
    }
    st = kiln_ref_store(c, KILN_DTYPE_F32, c->v->bufs[c->idx], 0, numel, y);
    free(x), free(y), free(taken);
    return st;
}

/* scale_rows: row r of x times w[r, col]. */
static kiln_status scale_rows(const kiln_ref_ctx *c)
{
    kiln_status st = KILN_OK;
    uint32_t sx = c->node->src[0], sw = c->node->src[1];
    int64_t numel = kiln_ref_numel(c->v, sx), d = kiln_ref_last_dim(c->v, sx), cw = kiln_ref_last_dim(c->v, sw);
    float *x = kiln_ref_load_node(c, sx, &st), *w = x ? kiln_ref_load_node(c, sw, &st) : NULL;
    if (!x || !w) {
        free(x);
        return st;
    }
    for (int64_t r = 0; d > 0 && r < numel / d; r++)
        for (int64_t i = 0; i < d; i++) x[r * d + i] *= w[r * cw + c->node->i[0]];
    st = kiln_ref_store(c, KILN_DTYPE_F32, c->v->bufs[c->idx], 0, numel, x);
    free(x), free(w);
    return st;
}

/* ---------------------------------------------------------------- cast */

/* Round to nearest, ties to even, saturating to i32; NaN -> 0. */
static int32_t f32_to_i32(float f)
{
    if (isnan(f))
        return 0;
    double x = f, r = floor(x), diff = x - r;
    if (diff > 0.5 || (diff == 0.5 && fmod(r, 2.0) != 0.0))
        r += 1.0;
    if (r >= 2147483647.0)
        return INT32_MAX;
    if (r <= -2147483648.0)
        return INT32_MIN;
    return (int32_t)r;
}

static kiln_status cast(const kiln_ref_ctx *c)
{
    uint32_t s = c->node->src[0];
    kiln_dtype ts = (kiln_dtype)c->v->g->nodes[s].dtype, td = (kiln_dtype)c->node->dtype;
    int64_t numel = kiln_ref_numel(c->v, s);
    void *dst = c->v->bufs[c->idx];
    if (ts == KILN_DTYPE_I32 && td == KILN_DTYPE_I32) {
        memmove(dst, c->v->bufs[s], (size_t)numel * 4);
        return KILN_OK;
    }
    kiln_status st = KILN_OK;
    float *x = kiln_ref_load_node(c, s, &st);
    if (!x)
        return st;
    if (td == KILN_DTYPE_I32) {
        for (int64_t i = 0; i < numel; i++) {
            int32_t q = f32_to_i32(x[i]);
            memcpy((char *)dst + 4 * i, &q, 4);
        }
    } else {
        st = kiln_ref_store(c, td, dst, 0, numel, x);
    }
    free(x);
    return st;
}

/* ---------------------------------------------------------------- layout */

/* reshape and view alias their source; copy only if the executor gave distinct buffers. */
static kiln_status alias(const kiln_ref_ctx *c)
{
    uint32_t s = c->node->src[0];
    kiln_dtype t = (kiln_dtype)c->node->dtype;
    int64_t off = c->node->op == KILN_OP_VIEW ? c->node->dim : 0;
    const char *src = (const char *)c->v->bufs[s] + elem_bytes(t, off);
    void *dst = c->v->bufs[c->idx];
    size_t bytes = elem_bytes(t, kiln_ref_numel(c->v, c->idx));
    if (dst != src && bytes > 0)
        memmove(dst, src, bytes);
    return KILN_OK;
}

/* Swaps dims i[0] and i[1] of any rank <= 4 tensor of a plain dtype, byte-wise. */
static kiln_status transpose(const kiln_ref_ctx *c)
{
    uint32_t s = c->node->src[0];
    kiln_dtype t = (kiln_dtype)c->node->dtype;
    int rank = c->node->rank, d0 = c->node->i[0], d1 = c->node->i[1];
    if (kiln_dtype_block(t) != 1)
        return kiln_ref_fail(c, KILN_ERR_DTYPE, "cannot transpose %s", kiln_dtype_name(t));
    if (d0 < 0 || d1 < 0 || d0 >= rank || d1 >= rank)
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "axes %d, %d out of rank %d", d0, d1, rank);
    size_t es = kiln_dtype_block_bytes(t);
    int64_t sd[KILN_MAX_RANK], sstride[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    for (int k = 0; k < rank; k++)
        sd[k] = c->v->dims[s][k];
    for (int64_t k = rank - 1, stride = 1; k >= 0; k--) {
        sstride[k] = stride;
        stride *= sd[k];
    }
    const char *src = c->v->bufs[s];
    char *dst = c->v->bufs[c->idx];
    int64_t numel = kiln_ref_numel(c->v, s);
    /* Walk the output in order; idx holds the output coordinate, whose d0/d1 are swapped in the source. */
    for (int64_t o = 0; o < numel; o++) {
        int64_t so = 0;
        for (int k = 0; k < rank; k++) {
            int ks = k == d0 ? d1 : k == d1 ? d0 : k;
            so += idx[k] * sstride[ks];
        }
        memcpy(dst + (size_t)o * es, src + (size_t)so * es, es);
        for (int k = rank - 1; k >= 0; k--) {
            if (++idx[k] < c->v->dims[c->idx][k])
                break;
            idx[k] = 0;
        }
    }
    return KILN_OK;
}

/* Bytes of one slab of a tensor from `axis` inward (the contiguous piece below the outer dims). */
static size_t slab_bytes(kiln_dtype t, const int64_t *dims, int rank, int axis)
{
    if (axis == rank - 1)
        return kiln_row_bytes(t, dims[axis]);
    size_t b = kiln_row_bytes(t, dims[rank - 1]);
    for (int k = axis; k < rank - 1; k++)
        b *= (size_t)dims[k];
    return b;
}

static kiln_status concat(const kiln_ref_ctx *c)
{
    uint32_t a = c->node->src[0], b = c->node->src[1];
    kiln_dtype t = (kiln_dtype)c->node->dtype;
    int rank = c->node->rank, axis = c->node->i[0];
    if (axis < 0 || axis >= rank)
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "axis %d out of rank %d", axis, rank);
    int64_t outer = 1;
    for (int k = 0; k < axis; k++)
        outer *= c->v->dims[c->idx][k];
    size_t sa = slab_bytes(t, c->v->dims[a], rank, axis), sb = slab_bytes(t, c->v->dims[b], rank, axis);
    const char *pa = c->v->bufs[a], *pb = c->v->bufs[b];
    char *dst = c->v->bufs[c->idx];
    for (int64_t o = 0; o < outer; o++) {
        if (sa > 0)
            memcpy(dst + (size_t)o * (sa + sb), pa + (size_t)o * sa, sa);
        if (sb > 0)
            memcpy(dst + (size_t)o * (sa + sb) + sa, pb + (size_t)o * sb, sb);
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- dispatch */

kiln_status kiln_ref_exec(const kiln_exec_view *v, uint32_t idx, char *err, size_t n_err)
{
    if (err && n_err)
        err[0] = '\0';
    kiln_ref_ctx c = {.v = v, .idx = idx, .node = &v->g->nodes[idx], .err = err, .n_err = n_err};
    if (kiln_op_is_elementwise((enum kiln_op)c.node->op) && c.node->op != KILN_OP_CAST) return elementwise(&c); /* the op table's class */
    switch ((enum kiln_op)c.node->op) {
    case KILN_OP_INPUT:
    case KILN_OP_WEIGHT:
    case KILN_OP_STATE: return KILN_OK;
    case KILN_OP_MATMUL: return kiln_ref_matmul(&c);
    case KILN_OP_RMS_NORM:
    case KILN_OP_LAYER_NORM:
    case KILN_OP_SOFTMAX: return row_op(&c);
    case KILN_OP_ROPE: return kiln_ref_rope(&c);
    case KILN_OP_ATTENTION: return kiln_ref_attention(&c);
    case KILN_OP_KV_SCATTER: return kiln_ref_kv_scatter(&c);
    case KILN_OP_PAGED_ATTENTION: return kiln_ref_paged_attention(&c);
    case KILN_OP_GET_ROWS: return kiln_ref_get_rows(&c);
    case KILN_OP_ARGMAX: return argmax(&c);
    case KILN_OP_MOE_ROUTE: return moe_route(&c);
    case KILN_OP_MOE_MATMUL: return kiln_ref_moe_matmul(&c);
    case KILN_OP_SCALE_ROWS: return scale_rows(&c);
    case KILN_OP_CAST: return cast(&c);
    case KILN_OP_RESHAPE:
    case KILN_OP_VIEW:
    case KILN_OP_ALL_REDUCE: return alias(&c); /* one device: the sum is x (a split plan's parts sum in group.c) */
    case KILN_OP_ALL_GATHER: /* one device: y is x; a split plan's parts gather in group.c, never here */
        if (c.node->i[0] > 1) return kiln_ref_fail(&c, KILN_ERR_INTERNAL, "all_gather over %d devices outside a split plan", c.node->i[0]);
        return alias(&c);
    case KILN_OP_TRANSPOSE: return transpose(&c);
    case KILN_OP_CONCAT: return concat(&c);
    default: break;
    }
    return kiln_ref_fail(&c, KILN_ERR_INTERNAL, "op %u has no reference kernel", (unsigned)c.node->op);
}
