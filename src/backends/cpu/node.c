/* The cpu backend's per-node kernels. Ops with a SIMD or threaded kernel (matmul, attention,
 * rms_norm, softmax, rope) call it, with f16/bf16 operands staged through f32; the element-wise
 * ops, layer_norm, argmax, cast, kv_scatter, get_rows and the layout ops are written here. Values
 * convert through kiln_quantize/kiln_dequantize (an f32 operand is read in place, no copy). Must
 * not call the reference backend: that is the oracle the cpu is tested against. */
#include "backends/cpu/node.h"
#include "graph/graph.h"
#include "graph/paged.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One node being run. */
typedef struct node_run {
    kiln_cpu_pool        *pool;  /* the backend's threads */
    enum kiln_cpu_isa     isa;   /* dispatch target */
    const kiln_exec_view *v;     /* the run's buffers and dims */
    uint32_t              idx;   /* the node */
    const kiln_node_rec  *n;     /* v->g->nodes[idx] */
    char                 *err;   /* message buffer */
    size_t                n_err; /* its size */
} node_run;

/* Writes "<op> '<name>': <message>" (or "<op> #<idx>: ...") into c->err and returns s. */
__attribute__((format(printf, 3, 4))) static kiln_status fail(const node_run *c, kiln_status s, const char *fmt, ...)
{
    const char *op = kiln_op_name((enum kiln_op)c->n->op);
    int k = c->n->name ? snprintf(c->err, c->n_err, "%s '%s': ", op ? op : "?", c->n->name)
                       : snprintf(c->err, c->n_err, "%s #%u: ", op ? op : "?", c->idx);
    if (k < 0 || (size_t)k >= c->n_err) return s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, c->n_err - (size_t)k, fmt, ap);
    va_end(ap);
    return s;
}

static kiln_dtype dtype_of(const node_run *c, uint32_t i) { return (kiln_dtype)c->v->g->nodes[i].dtype; }

static int64_t numel(const node_run *c, uint32_t i)
{
    int64_t e = 1;
    for (int d = 0; d < c->v->g->nodes[i].rank; d++) e *= c->v->dims[i][d];
    return e;
}

static int64_t last_dim(const node_run *c, uint32_t i)
{
    int r = c->v->g->nodes[i].rank;
    return r > 0 ? c->v->dims[i][r - 1] : 1;
}

static int32_t read_i32(const void *base, int64_t i)
{
    int32_t x;
    memcpy(&x, (const char *)base + 4 * i, 4);
    return x;
}

/* ---------------------------------------------------------------- f32 staging */

/* n values of dtype t at base as f32 into dst. */
static kiln_status to_f32(kiln_dtype t, const void *base, int64_t n, float *dst)
{
    if (n <= 0) return KILN_OK;
    if (t == KILN_DTYPE_F32) return memcpy(dst, base, (size_t)n * sizeof(float)), KILN_OK;
    if (t != KILN_DTYPE_I32) return kiln_dequantize(t, base, dst, n);
    for (int64_t i = 0; i < n; i++) dst[i] = (float)read_i32(base, i);
    return KILN_OK;
}

/* Node i's values as f32: its buffer itself when it is f32, else a converted copy that *owned
 * says to free. NULL on failure (*st set). */
static const float *src_f32(const node_run *c, uint32_t i, bool *owned, kiln_status *st)
{
    *owned = false;
    if (dtype_of(c, i) == KILN_DTYPE_F32) return c->v->bufs[i];
    int64_t n = numel(c, i);
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) return *st = fail(c, KILN_ERR_NOMEM, "out of memory for %lld floats", (long long)n), NULL;
    if ((*st = to_f32(dtype_of(c, i), c->v->bufs[i], n, p)) != KILN_OK) {
        free(p);
        return fail(c, *st, "cannot read %lld %s values", (long long)n, kiln_dtype_name(dtype_of(c, i))), NULL;
    }
    *owned = true;
    return p;
}

/* Where the node's n f32 results go: its buffer when it is f32, else scratch that put_out converts. */
static float *out_f32(const node_run *c, int64_t n, kiln_status *st)
{
    if (c->n->dtype == KILN_DTYPE_F32) return c->v->bufs[c->idx];
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) *st = fail(c, KILN_ERR_NOMEM, "out of memory for %lld floats", (long long)n);
    return p;
}

/* Stores y (from out_f32) into the node in its dtype and frees the scratch. */
static kiln_status put_out(const node_run *c, float *y, int64_t n, kiln_status st)
{
    if (y == c->v->bufs[c->idx]) return st;
    if (st == KILN_OK && n > 0 && kiln_quantize((kiln_dtype)c->n->dtype, y, c->v->bufs[c->idx], n) != KILN_OK)
        st = fail(c, KILN_ERR_DTYPE, "cannot write %lld %s values", (long long)n, kiln_dtype_name((kiln_dtype)c->n->dtype));
    free(y);
    return st;
}

static void drop(const float *p, bool owned)
{
    if (owned) free((void *)p);
}

/* ---------------------------------------------------------------- element-wise */

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* The sigmoid form of the tanh approximation: 0.5 (1 + tanh z) = 1 / (1 + e^-2z) does not cancel
 * for x < -3 as the tanh form does. */
static float gelu(float x) { return x / (1.0f + expf(-2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x))); }

/* y = op(a, b) with b repeated over a's leading dims (nb divides na). */
static void ew_loop(enum kiln_op op, float f, const float *a, const float *b, int64_t na, int64_t nb, float *y)
{
    for (int64_t o = 0; o < na; o += nb) {
        const float *ao = a + o, *bo = b;
        float *yo = y + o;
        int64_t m = b ? nb : na;
        switch (op) {
        case KILN_OP_ADD: for (int64_t i = 0; i < m; i++) yo[i] = ao[i] + bo[i]; break;
        case KILN_OP_MUL: for (int64_t i = 0; i < m; i++) yo[i] = ao[i] * bo[i]; break;
        case KILN_OP_SWIGLU: for (int64_t i = 0; i < m; i++) yo[i] = silu(ao[i]) * bo[i]; break;
        case KILN_OP_SCALE: for (int64_t i = 0; i < m; i++) yo[i] = ao[i] * f; break;
        case KILN_OP_SILU: for (int64_t i = 0; i < m; i++) yo[i] = silu(ao[i]); break;
        case KILN_OP_GELU: for (int64_t i = 0; i < m; i++) yo[i] = gelu(ao[i]); break;
        case KILN_OP_SIGMOID: for (int64_t i = 0; i < m; i++) yo[i] = 1.0f / (1.0f + expf(-ao[i])); break;
        case KILN_OP_TANH: for (int64_t i = 0; i < m; i++) yo[i] = tanhf(ao[i]); break;
        default: for (int64_t i = 0; i < m; i++) yo[i] = NAN; break; /* kiln_cpu_node_supported lists the ops */
        }
        if (!b) break;
    }
}

static kiln_status elementwise(const node_run *c)
{
    const kiln_node_rec *n = c->n;
    bool binary = n->n_src > 1 && n->src[1] != KILN_IDX_NONE, oa = false, ob = false;
    int64_t na = numel(c, n->src[0]), nb = binary ? numel(c, n->src[1]) : 1;
    if (na == 0) return KILN_OK;
    if (nb <= 0 || na % nb != 0)
        return fail(c, KILN_ERR_SHAPE, "%lld elements do not broadcast over %lld", (long long)nb, (long long)na);
    kiln_status st = KILN_OK;
    const float *a = src_f32(c, n->src[0], &oa, &st), *b = a && binary ? src_f32(c, n->src[1], &ob, &st) : NULL;
    float *y = st == KILN_OK ? out_f32(c, na, &st) : NULL;
    if (y) ew_loop((enum kiln_op)n->op, n->f[0], a, b, na, nb, y);
    if (y) st = put_out(c, y, na, st);
    drop(a, oa);
    drop(b, ob);
    return st;
}

/* ---------------------------------------------------------------- rows */

/* layer_norm of one row with optional weight and bias; mean and variance in f64 like rms_norm's. */
static void layer_norm_row(const float *x, int64_t d, float eps, const float *w, const float *b, float *y)
{
    double mean = 0, ss = 0;
    for (int64_t j = 0; j < d; j++) mean += x[j];
    mean /= (double)d;
    for (int64_t j = 0; j < d; j++) ss += ((double)x[j] - mean) * ((double)x[j] - mean);
    double inv = 1.0 / sqrt(ss / (double)d + (double)eps);
    for (int64_t j = 0; j < d; j++) y[j] = (float)(((double)x[j] - mean) * inv * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f));
}

/* rms_norm, layer_norm, softmax over the last dim. */
static kiln_status row_op(const node_run *c)
{
    const kiln_node_rec *n = c->n;
    int64_t total = numel(c, n->src[0]), d = last_dim(c, n->src[0]), rows = d > 0 ? total / d : 0;
    bool ox = false, ow = false, ob = false;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, n->src[0], &ox, &st), *w = NULL, *b = NULL;
    if (x && n->n_src > 1 && n->src[1] != KILN_IDX_NONE) w = src_f32(c, n->src[1], &ow, &st);
    if (st == KILN_OK && n->n_src > 2 && n->src[2] != KILN_IDX_NONE) b = src_f32(c, n->src[2], &ob, &st);
    float *y = st == KILN_OK ? out_f32(c, total, &st) : NULL;
    if (y && n->op == KILN_OP_SOFTMAX) kiln_cpu_softmax(x, rows, d, y);
    else if (y && n->op == KILN_OP_RMS_NORM) kiln_cpu_rms_norm(x, w, n->f[0], rows, d, y);
    else if (y) for (int64_t r = 0; r < rows; r++) layer_norm_row(x + r * d, d, n->f[0], w, b, y + r * d);
    if (y) st = put_out(c, y, total, st);
    drop(x, ox);
    drop(w, ow);
    drop(b, ob);
    return st;
}

/* First index of the largest value; NaN counts as smaller than everything (all NaN -> 0). */
static kiln_status argmax(const node_run *c)
{
    uint32_t s = c->n->src[0];
    int64_t d = last_dim(c, s), rows = d > 0 ? numel(c, s) / d : 0;
    bool owned;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, s, &owned, &st);
    if (!x) return st;
    int32_t *y = c->v->bufs[c->idx];
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        int64_t best = -1;
        for (int64_t j = 0; j < d; j++)
            if (!isnan(xr[j]) && (best < 0 || xr[j] > xr[best])) best = j;
        y[r] = (int32_t)(best < 0 ? 0 : best);
    }
    drop(x, owned);
    return KILN_OK;
}

/* moe_route (kiln.h): per row of E router logits, softmax; the k largest logits (first index on
 * ties, NaN below every number) keep their probability, the rest 0; norm: kept ones over their sum. */
static kiln_status moe_route(const node_run *c)
{
    uint32_t s = c->n->src[0];
    int64_t e = last_dim(c, s), rows = e > 0 ? numel(c, s) / e : 0, k = c->n->i[0];
    bool owned;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, s, &owned, &st);
    if (!x) return st;
    bool *taken = malloc((size_t)(e > 0 ? e : 1) * sizeof *taken);
    if (!taken) return drop(x, owned), fail(c, KILN_ERR_NOMEM, "out of memory");
    float *y = c->v->bufs[c->idx];
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * e;
        float *yr = y + r * e, mx = -INFINITY, sum = 0, kept = 0;
        for (int64_t j = 0; j < e; j++) mx = xr[j] > mx ? xr[j] : mx;
        for (int64_t j = 0; j < e; j++) sum += expf(xr[j] - mx), taken[j] = false;
        for (int64_t t = 0; t < k; t++) {
            int64_t best = -1;
            for (int64_t j = 0; j < e; j++)
                if (!taken[j] && (best < 0 || (!isnan(xr[j]) && (isnan(xr[best]) || xr[j] > xr[best])))) best = j;
            taken[best] = true;
            kept += expf(xr[best] - mx) / sum;
        }
        for (int64_t j = 0; j < e; j++) {
            float p = taken[j] ? expf(xr[j] - mx) / sum : 0.0f;
            yr[j] = c->n->i[1] && taken[j] ? p / kept : p;
        }
    }
    free(taken);
    drop(x, owned);
    return KILN_OK;
}

/* scale_rows (kiln.h): row r of x times w[r, col]. */
static kiln_status scale_rows(const node_run *c)
{
    uint32_t xi = c->n->src[0], wi = c->n->src[1];
    int64_t d = last_dim(c, xi), rows = d > 0 ? numel(c, xi) / d : 0, cw = last_dim(c, wi);
    bool ox, ow;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, xi, &ox, &st), *w = x ? src_f32(c, wi, &ow, &st) : NULL;
    if (!w) {
        if (x) drop(x, ox);
        return st;
    }
    float *y = c->v->bufs[c->idx];
    for (int64_t r = 0; r < rows; r++) {
        float s = w[r * cw + c->n->i[0]];
        for (int64_t i = 0; i < d; i++) y[r * d + i] = x[r * d + i] * s;
    }
    drop(x, ox), drop(w, ow);
    return KILN_OK;
}

/* x [n_tok, n_head, hd] rotated by pos [n_tok] (rows of the SIMD-free kernel in rows.c). */
static kiln_status rope(const node_run *c)
{
    uint32_t xi = c->n->src[0], pi = c->n->src[1];
    int64_t hd = last_dim(c, xi), total = numel(c, xi), n_tok = numel(c, pi);
    if (hd % 2 != 0 || (n_tok > 0 && total % (n_tok * hd) != 0) || (n_tok == 0 && total != 0))
        return fail(c, KILN_ERR_SHAPE, "x of %lld values does not split into %lld tokens of head_dim %lld", (long long)total,
                    (long long)n_tok, (long long)hd);
    bool owned;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, xi, &owned, &st);
    float *y = x ? out_f32(c, total, &st) : NULL;
    if (y && y != x && total > 0) memcpy(y, x, (size_t)total * sizeof(float));
    if (y && n_tok > 0)
        kiln_cpu_rope(y, c->v->bufs[pi], n_tok, total / (n_tok * hd), hd, kiln_rope_dims(c->n, hd), c->n->i[0],
                      c->n->f[0], c->n->vec);
    if (y) st = put_out(c, y, total, st);
    drop(x, owned);
    return st;
}

/* ---------------------------------------------------------------- matmul and attention */

static kiln_status matmul(const node_run *c)
{
    uint32_t xi = c->n->src[0], wi = c->n->src[1];
    bool owned;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, xi, &owned, &st);
    if (!x) return st;
    kiln_cpu_mm mm = {.x = x, .n_out = 1, .k = last_dim(c, xi)};
    mm.m = mm.k > 0 ? numel(c, xi) / mm.k : 0;
    mm.out[0] = (kiln_cpu_mm_out){.w = c->v->bufs[wi], .wt = dtype_of(c, wi), .n = c->v->dims[wi][0], .y = c->v->bufs[c->idx]};
    st = kiln_cpu_matmul(c->pool, c->isa, &mm);
    drop(x, owned);
    return st;
}

/* moe_matmul (kiln.h): the tokens' slots (kiln_moe_slots) grouped by expert, so each routed
 * expert's [N, K] rows are one matmul over the rows that chose it (gathered when there are several),
 * all of them in one kiln_cpu_matmul_batch (one pass of the pool), and an expert no token chose is
 * never read: a decode step reads k experts of E. With sum, each token's slots are weighted by r
 * and added in slot order afterwards, as in the ref. */
static kiln_status moe_matmul(const node_run *c)
{
    const kiln_node_rec *n = c->n;
    uint32_t xi = n->src[0], wi = n->src[1], ri = n->src[2];
    const int64_t *wd = c->v->dims[wi];
    int64_t T = c->v->dims[ri][0], E = wd[0], N = wd[1], K = wd[2], k = n->i[0], tk = T * k, maxc = 0;
    int64_t xk = c->v->g->nodes[xi].rank == 3 ? k : 1; /* x rows per token */
    kiln_dtype wt = dtype_of(c, wi);
    size_t ebytes = (size_t)N * kiln_row_bytes(wt, K);
    const float *r = c->v->bufs[ri];
    bool owned, sum = n->i[1] != 0;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, xi, &owned, &st);
    if (!x) return st;
    int32_t *slot = malloc((size_t)(tk > 0 ? tk : 1) * sizeof *slot);
    int64_t *start = calloc((size_t)E + 2, sizeof *start), *order = malloc((size_t)(tk > 0 ? tk : 1) * sizeof *order);
    float *ys = sum ? malloc((size_t)(tk * N > 0 ? tk * N : 1) * sizeof *ys) : c->v->bufs[c->idx], *xg = NULL, *yg = NULL;
    if (!slot || !start || !order || !ys) st = fail(c, KILN_ERR_NOMEM, "out of memory for %lld slots", (long long)tk);
    for (int64_t t = 0; st == KILN_OK && t < T; t++) kiln_moe_slots(r + t * E, E, (int)k, slot + t * k);
    for (int64_t p = 0; st == KILN_OK && p < tk; p++) start[slot[p] + 2]++; /* counting sort of the slots by expert */
    for (int64_t e = 0; st == KILN_OK && e < E; e++) {
        maxc = start[e + 2] > maxc ? start[e + 2] : maxc;
        start[e + 2] += start[e + 1];
    }
    for (int64_t p = 0; st == KILN_OK && p < tk; p++) order[start[slot[p] + 1]++] = p; /* start[e + 1]: e's end */
    kiln_cpu_mm *mm = st == KILN_OK ? calloc((size_t)(E < tk ? E : tk) + 1, sizeof *mm) : NULL;
    if (st == KILN_OK && !mm) st = fail(c, KILN_ERR_NOMEM, "out of memory for %lld experts", (long long)E);
    if (st == KILN_OK && maxc > 1) { /* experts of several rows read them gathered, in expert order */
        xg = malloc((size_t)(tk * K) * sizeof *xg), yg = malloc((size_t)(tk * N) * sizeof *yg);
        if (!xg || !yg) st = fail(c, KILN_ERR_NOMEM, "out of memory gathering %lld rows", (long long)tk);
    }
    int n_mm = 0;
    for (int64_t e = 0; st == KILN_OK && e < E; e++) {
        int64_t b = start[e], m = start[e + 1] - b; /* expert e's slots: order[b .. b + m) */
        if (m == 0) continue;
        kiln_cpu_mm *u = &mm[n_mm++];
        *u = (kiln_cpu_mm){.m = m, .k = K, .n_out = 1};
        u->out[0] = (kiln_cpu_mm_out){.w = (const char *)c->v->bufs[wi] + (size_t)e * ebytes, .wt = wt, .n = N};
        if (m == 1) { /* its row in place */
            int64_t p = order[b];
            u->x = x + ((p / k) * xk + (xk > 1 ? p % k : 0)) * K, u->out[0].y = ys + p * N;
            continue;
        }
        for (int64_t i = 0; i < m; i++) {
            int64_t p = order[b + i];
            memcpy(xg + (b + i) * K, x + ((p / k) * xk + (xk > 1 ? p % k : 0)) * K, (size_t)K * sizeof *xg);
        }
        u->x = xg + b * K, u->out[0].y = yg + b * N;
    }
    if (st == KILN_OK && (st = kiln_cpu_matmul_batch(c->pool, c->isa, mm, n_mm)) != KILN_OK)
        st = fail(c, st, "expert matmuls [%lld, %lld] %s: %s", (long long)N, (long long)K, kiln_dtype_name(wt),
                  kiln_status_str(st));
    for (int64_t e = 0; st == KILN_OK && maxc > 1 && e < E; e++) /* gathered outputs back to their slots */
        for (int64_t i = start[e]; start[e + 1] - start[e] > 1 && i < start[e + 1]; i++)
            memcpy(ys + order[i] * N, yg + i * N, (size_t)N * sizeof *yg);
    float *y = c->v->bufs[c->idx];
    for (int64_t t = 0; st == KILN_OK && sum && t < T; t++) {
        for (int64_t j = 0; j < N; j++) y[t * N + j] = 0.0f;
        for (int64_t s = 0; s < k; s++) {
            float rw = r[t * E + slot[t * k + s]];
            const float *yr = ys + (t * k + s) * N;
            for (int64_t j = 0; j < N; j++) y[t * N + j] += rw * yr[j];
        }
    }
    if (sum) free(ys);
    free(slot), free(start), free(order), free(xg), free(yg), free(mm);
    drop(x, owned);
    return st;
}

/* The first n_kv rows of every head of a bf16 cache [n_kv_head, max_ctx, hd] as f32 [n_kv_head, n_kv, hd]. */
static float *cache_f32(const node_run *c, uint32_t i, int64_t n_kv, kiln_status *st)
{
    const int64_t *d = c->v->dims[i];
    float *p = malloc((size_t)(d[0] * n_kv * d[2]) * sizeof(float));
    if (!p) return *st = fail(c, KILN_ERR_NOMEM, "out of memory staging the %s cache", kiln_dtype_name(dtype_of(c, i))), NULL;
    size_t row = kiln_row_bytes(dtype_of(c, i), d[2]);
    for (int64_t h = 0; h < d[0]; h++)
        *st = to_f32(dtype_of(c, i), (const char *)c->v->bufs[i] + (size_t)(h * d[1]) * row, n_kv * d[2], p + h * n_kv * d[2]);
    return p;
}

/* q [n_tok, n_head, hd] over the caches; query t sits at n_kv - n_tok + t (kiln.h). The executor
 * has checked the positions of a kv_scatter feeding the caches (sched/exec.c). */
static kiln_status attention(const node_run *c)
{
    const kiln_node_rec *n = c->n;
    const int64_t *qd = c->v->dims[n->src[0]], *kd = c->v->dims[n->src[1]];
    int64_t n_kv = kiln_dim_is_sym(n->dim) ? c->v->sym_vals[kiln_sym_index(n->dim)] : n->dim;
    if (n_kv < 1 || n_kv > kd[1])
        return fail(c, KILN_ERR_SHAPE, "n_kv = %lld is outside [1, max_ctx = %lld]", (long long)n_kv, (long long)kd[1]);
    if (qd[0] > n_kv) return fail(c, KILN_ERR_SHAPE, "n_tok = %lld exceeds n_kv = %lld", (long long)qd[0], (long long)n_kv);
    kiln_dtype kt = dtype_of(c, n->src[1]);
    bool oq = false, staged = kt != KILN_DTYPE_F32 && kt != KILN_DTYPE_F16; /* the SIMD kernel reads f32 and f16 caches */
    kiln_status st = KILN_OK;
    const float *q = src_f32(c, n->src[0], &oq, &st);
    float *k = q && staged ? cache_f32(c, n->src[1], n_kv, &st) : NULL;
    float *v = k ? cache_f32(c, n->src[2], n_kv, &st) : NULL;
    float *y = st == KILN_OK && q ? out_f32(c, numel(c, c->idx), &st) : NULL; /* a narrowed (f16) output: staged */
    if (st == KILN_OK)
        st = kiln_cpu_attention(c->pool, c->isa, q, qd[0], qd[1], qd[2], staged ? k : c->v->bufs[n->src[1]],
                                staged ? v : c->v->bufs[n->src[2]], staged ? KILN_DTYPE_F32 : kt, kd[0],
                                staged ? n_kv : kd[1], n_kv,
                                &(kiln_cpu_attn_mask){.scale = n->f[0], .softcap = n->f[1], .window = n->i[1]}, y);
    if (y) st = put_out(c, y, numel(c, c->idx), st);
    drop(q, oq);
    free(k);
    free(v);
    return st;
}

/* Paged attention over a ragged batch (kiln.h): each sequence's keys through its block table. The
 * executor has checked the step's metadata (sched/plan.c); it is checked again here, where a
 * kernel would follow it. Pools in bf16 and q8_0 are staged whole through f32. */
static kiln_status paged_attention(const node_run *c)
{
    const kiln_node_rec *n = c->n;
    kiln_paged_meta m = kiln_paged_meta_of(c->v->g, c->idx, c->v->bufs, c->v->dims);
    char why[300];
    if (!kiln_paged_check(&m, NULL, why, sizeof why)) return fail(c, KILN_ERR_BINDING, "%s", why);
    const int64_t *qd = c->v->dims[n->src[0]], *kd = c->v->dims[n->src[1]];
    kiln_dtype kt = dtype_of(c, n->src[1]);
    bool oq = false, staged = kt != KILN_DTYPE_F32 && kt != KILN_DTYPE_F16;
    kiln_status st = KILN_OK;
    const float *q = src_f32(c, n->src[0], &oq, &st);
    float *k = q && staged ? cache_f32(c, n->src[1], kd[1], &st) : NULL;
    float *v = k ? cache_f32(c, n->src[2], kd[1], &st) : NULL;
    float *y = st == KILN_OK && q ? out_f32(c, numel(c, c->idx), &st) : NULL; /* a narrowed (f16) output: staged */
    if (st == KILN_OK)
        st = kiln_cpu_paged_attention(c->pool, c->isa, q, qd[1], qd[2], staged ? k : c->v->bufs[n->src[1]],
                                      staged ? v : c->v->bufs[n->src[2]], staged ? KILN_DTYPE_F32 : kt, kd[0], &m,
                                      &(kiln_cpu_attn_mask){.scale = n->f[0], .softcap = n->f[1], .window = n->i[1]}, y);
    if (y) st = put_out(c, y, numel(c, c->idx), st);
    drop(q, oq);
    free(k);
    free(v);
    return st;
}

/* ---------------------------------------------------------------- indexed writes and reads */

/* state[h, pos[t], :] = rows[t, h, :], in place; every position is checked before any write. */
static kiln_status kv_scatter(const node_run *c)
{
    uint32_t si = c->n->src[0], ri = c->n->src[1], pi = c->n->src[2];
    const int64_t *sd = c->v->dims[si], *rd = c->v->dims[ri];
    int64_t n_tok = numel(c, pi), n_kvh = sd[0], max_ctx = sd[1], hd = sd[2];
    if (rd[0] != n_tok || rd[1] != n_kvh || rd[2] != hd)
        return fail(c, KILN_ERR_SHAPE, "rows [%lld, %lld, %lld] do not fit %lld positions into [%lld, %lld, %lld]",
                    (long long)rd[0], (long long)rd[1], (long long)rd[2], (long long)n_tok, (long long)n_kvh,
                    (long long)max_ctx, (long long)hd);
    for (int64_t i = 0; i < n_tok; i++) {
        int32_t p = read_i32(c->v->bufs[pi], i);
        if (p < 0 || p >= max_ctx)
            return fail(c, KILN_ERR_SHAPE, "position %d (token %lld) is outside [0, %lld)", p, (long long)i, (long long)max_ctx);
    }
    kiln_dtype t = dtype_of(c, si);
    size_t row = kiln_row_bytes(t, hd);
    char *state = c->v->bufs[c->idx];
    if (state != c->v->bufs[si]) memmove(state, c->v->bufs[si], row * (size_t)(n_kvh * max_ctx)); /* not aliased: carry it */
    bool owned = false;
    kiln_status st = KILN_OK;
    const float *rows = t == KILN_DTYPE_F32 ? NULL : src_f32(c, ri, &owned, &st); /* f32 rows are copied as bytes */
    for (int64_t i = 0; st == KILN_OK && i < n_tok; i++)
        for (int64_t h = 0; st == KILN_OK && h < n_kvh; h++) {
            char *dst = state + (size_t)(h * max_ctx + read_i32(c->v->bufs[pi], i)) * row;
            int64_t from = (i * n_kvh + h) * hd;
            if (t == KILN_DTYPE_F32 && dtype_of(c, ri) == KILN_DTYPE_F32) memcpy(dst, (const float *)c->v->bufs[ri] + from, row);
            else if (t == KILN_DTYPE_F32) st = to_f32(dtype_of(c, ri), (const char *)c->v->bufs[ri] + kiln_row_bytes(dtype_of(c, ri), from), hd, (float *)dst);
            else if (kiln_quantize(t, rows + from, dst, hd) != KILN_OK) st = fail(c, KILN_ERR_DTYPE, "cannot write %s rows", kiln_dtype_name(t));
        }
    drop(rows, owned);
    return st;
}

/* out[i, :] = table[ids[i], :] (table of any dtype, converted row by row), ids checked against V. */
static kiln_status get_rows(const node_run *c)
{
    uint32_t ti = c->n->src[0], ii = c->n->src[1];
    int64_t V = c->v->dims[ti][0], D = last_dim(c, ti), n = numel(c, ii);
    for (int64_t i = 0; i < n; i++) {
        int32_t id = read_i32(c->v->bufs[ii], i);
        if (id < 0 || id >= V) return fail(c, KILN_ERR_SHAPE, "id %d (index %lld) is outside [0, %lld)", id, (long long)i, (long long)V);
    }
    kiln_status st = KILN_OK;
    float *y = out_f32(c, n * D, &st);
    size_t row = kiln_row_bytes(dtype_of(c, ti), D);
    for (int64_t i = 0; y && st == KILN_OK && i < n; i++)
        st = to_f32(dtype_of(c, ti), (const char *)c->v->bufs[ti] + (size_t)read_i32(c->v->bufs[ii], i) * row, D, y + i * D);
    if (st != KILN_OK && y) st = fail(c, st, "cannot read %s rows", kiln_dtype_name(dtype_of(c, ti)));
    return y ? put_out(c, y, n * D, st) : st;
}

/* ---------------------------------------------------------------- cast and layout */

/* Round to nearest, ties to even, saturating to i32; NaN -> 0. */
static int32_t f32_to_i32(float f)
{
    if (isnan(f)) return 0;
    double x = f, r = floor(x), diff = x - r;
    if (diff > 0.5 || (diff == 0.5 && fmod(r, 2.0) != 0.0)) r += 1.0;
    return r >= 2147483647.0 ? INT32_MAX : r <= -2147483648.0 ? INT32_MIN : (int32_t)r;
}

static kiln_status cast(const node_run *c)
{
    uint32_t s = c->n->src[0];
    int64_t n = numel(c, s);
    char *dst = c->v->bufs[c->idx];
    if (dtype_of(c, s) == c->n->dtype && kiln_dtype_block((kiln_dtype)c->n->dtype) == 1) { /* same dtype: bytes */
        if (n > 0 && dst != c->v->bufs[s]) memmove(dst, c->v->bufs[s], kiln_row_bytes((kiln_dtype)c->n->dtype, n));
        return KILN_OK;
    }
    bool owned;
    kiln_status st = KILN_OK;
    const float *x = src_f32(c, s, &owned, &st);
    if (!x) return st;
    if (c->n->dtype == KILN_DTYPE_I32) {
        for (int64_t i = 0; i < n; i++) {
            int32_t q = f32_to_i32(x[i]);
            memcpy(dst + 4 * i, &q, 4);
        }
    } else if (n > 0 && kiln_quantize((kiln_dtype)c->n->dtype, x, dst, n) != KILN_OK) {
        st = fail(c, KILN_ERR_DTYPE, "cannot write %lld %s values", (long long)n, kiln_dtype_name((kiln_dtype)c->n->dtype));
    }
    drop(x, owned);
    return st;
}

/* reshape and view alias their source; copy only if the executor gave distinct buffers. */
static kiln_status alias(const node_run *c)
{
    kiln_dtype t = (kiln_dtype)c->n->dtype;
    const char *src = (const char *)c->v->bufs[c->n->src[0]] + kiln_row_bytes(t, c->n->op == KILN_OP_VIEW ? c->n->dim : 0);
    size_t bytes = kiln_row_bytes(t, numel(c, c->idx));
    if (c->v->bufs[c->idx] != src && bytes > 0) memmove(c->v->bufs[c->idx], src, bytes);
    return KILN_OK;
}

/* Swaps dims i[0] and i[1] of a tensor of a plain dtype: the output walked in order, the source by strides. */
static kiln_status transpose(const node_run *c)
{
    uint32_t s = c->n->src[0];
    int rank = c->n->rank, d0 = c->n->i[0], d1 = c->n->i[1];
    if (d0 < 0 || d1 < 0 || d0 >= rank || d1 >= rank) return fail(c, KILN_ERR_SHAPE, "axes %d, %d out of rank %d", d0, d1, rank);
    size_t es = kiln_row_bytes((kiln_dtype)c->n->dtype, 1);
    int64_t stride[KILN_MAX_RANK], at[KILN_MAX_RANK] = {0}, total = numel(c, s);
    for (int64_t k = rank - 1, m = 1; k >= 0; k--) stride[k] = m, m *= c->v->dims[s][k];
    int64_t tmp = stride[d0];
    stride[d0] = stride[d1], stride[d1] = tmp; /* output coordinate k steps the source by stride[k] */
    const char *src = c->v->bufs[s];
    char *dst = c->v->bufs[c->idx];
    for (int64_t o = 0; o < total; o++) {
        int64_t so = 0;
        for (int k = 0; k < rank; k++) so += at[k] * stride[k];
        memcpy(dst + (size_t)o * es, src + (size_t)so * es, es);
        for (int k = rank - 1; k >= 0 && ++at[k] == c->v->dims[c->idx][k]; k--) at[k] = 0;
    }
    return KILN_OK;
}

/* Bytes of node i from `axis` inward (one slab below the outer dims). */
static size_t slab(const node_run *c, uint32_t i, int axis)
{
    size_t b = kiln_row_bytes(dtype_of(c, i), c->v->dims[i][c->n->rank - 1]);
    for (int k = axis; k < c->n->rank - 1; k++) b *= (size_t)c->v->dims[i][k];
    return b;
}

static kiln_status concat(const node_run *c)
{
    uint32_t a = c->n->src[0], b = c->n->src[1];
    int axis = c->n->i[0];
    if (axis < 0 || axis >= c->n->rank) return fail(c, KILN_ERR_SHAPE, "axis %d out of rank %d", axis, c->n->rank);
    int64_t outer = 1;
    for (int k = 0; k < axis; k++) outer *= c->v->dims[c->idx][k];
    size_t sa = slab(c, a, axis), sb = slab(c, b, axis);
    char *dst = c->v->bufs[c->idx];
    for (int64_t o = 0; o < outer; o++) {
        if (sa) memcpy(dst + (size_t)o * (sa + sb), (const char *)c->v->bufs[a] + (size_t)o * sa, sa);
        if (sb) memcpy(dst + (size_t)o * (sa + sb) + sa, (const char *)c->v->bufs[b] + (size_t)o * sb, sb);
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- dispatch */

bool kiln_cpu_node_supported(const kiln_graph *g, uint32_t idx, char *why, size_t n_why)
{
    enum kiln_op op = (enum kiln_op)g->nodes[idx].op;
    switch (op) {
    case KILN_OP_ADD: case KILN_OP_MUL: case KILN_OP_SWIGLU: case KILN_OP_SCALE: case KILN_OP_SILU: case KILN_OP_GELU:
    case KILN_OP_SIGMOID: case KILN_OP_TANH: case KILN_OP_CAST: case KILN_OP_MATMUL: case KILN_OP_RMS_NORM: case KILN_OP_LAYER_NORM:
    case KILN_OP_SOFTMAX: case KILN_OP_ROPE: case KILN_OP_ATTENTION: case KILN_OP_PAGED_ATTENTION: case KILN_OP_KV_SCATTER: case KILN_OP_GET_ROWS:
    case KILN_OP_ARGMAX: case KILN_OP_MOE_ROUTE: case KILN_OP_SCALE_ROWS: case KILN_OP_MOE_MATMUL: case KILN_OP_RESHAPE: case KILN_OP_VIEW:
    case KILN_OP_TRANSPOSE: case KILN_OP_CONCAT:
    case KILN_OP_ALL_REDUCE: case KILN_OP_ALL_GATHER: case KILN_OP_INPUT: case KILN_OP_WEIGHT: case KILN_OP_STATE: return true;
    default: break;
    }
    const char *name = kiln_op_name(op);
    snprintf(why, n_why, "cpu: no kernel for op %s (node #%u)", name ? name : "?", idx);
    return false;
}

kiln_status kiln_cpu_node_run(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const kiln_exec_view *v, uint32_t idx,
                              char *err, size_t n_err)
{
    node_run c = {.pool = pool, .isa = isa, .v = v, .idx = idx, .n = &v->g->nodes[idx], .err = err, .n_err = n_err};
    switch ((enum kiln_op)c.n->op) {
    case KILN_OP_ADD: case KILN_OP_MUL: case KILN_OP_SWIGLU: case KILN_OP_SCALE: case KILN_OP_SILU: case KILN_OP_GELU:
    case KILN_OP_SIGMOID: case KILN_OP_TANH: return elementwise(&c);
    case KILN_OP_CAST: return cast(&c);
    case KILN_OP_MATMUL: return matmul(&c);
    case KILN_OP_RMS_NORM: case KILN_OP_LAYER_NORM: case KILN_OP_SOFTMAX: return row_op(&c);
    case KILN_OP_ROPE: return rope(&c);
    case KILN_OP_ATTENTION: return attention(&c);
    case KILN_OP_PAGED_ATTENTION: return paged_attention(&c);
    case KILN_OP_KV_SCATTER: return kv_scatter(&c);
    case KILN_OP_GET_ROWS: return get_rows(&c);
    case KILN_OP_ARGMAX: return argmax(&c);
    case KILN_OP_MOE_ROUTE: return moe_route(&c);
    case KILN_OP_SCALE_ROWS: return scale_rows(&c);
    case KILN_OP_MOE_MATMUL: return moe_matmul(&c);
    case KILN_OP_RESHAPE: case KILN_OP_VIEW: case KILN_OP_ALL_REDUCE: return alias(&c); /* all_reduce: one device */
    case KILN_OP_ALL_GATHER: /* one device: y is x; a split plan's parts gather in group.c, never here */
        if (c.n->i[0] > 1) return fail(&c, KILN_ERR_INTERNAL, "all_gather over %d devices outside a split plan", c.n->i[0]);
        return alias(&c);
    case KILN_OP_TRANSPOSE: return transpose(&c);
    case KILN_OP_CONCAT: return concat(&c);
    case KILN_OP_INPUT: case KILN_OP_WEIGHT: case KILN_OP_STATE: return KILN_OK;
    default: break;
    }
    return fail(&c, KILN_ERR_INTERNAL, "no cpu kernel (placement should have put this region on ref)");
}
