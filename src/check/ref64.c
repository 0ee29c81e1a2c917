/* ref64: f64 evaluation of a kiln_graph, one node at a time in array (topological) order.
 * Written from the math in kiln.h: no kiln kernel code is used, only kiln_dequantize to read data
 * in its dtype and the graph IR to walk nodes. Must not round results to the node's dtype: the
 * contracts' tolerances account for that rounding. */
#include "check/ref64.h"
#include "graph/paged.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kiln_ref64 {
    const kiln_graph *g;                   /* graph evaluated (borrowed) */
    double          **val;                 /* val[i]: values of node i (owned when own[i]) */
    bool             *own;                 /* val[i] is owned by this node (false: alias) */
    int64_t         (*dims)[KILN_MAX_RANK];/* dims[i]: concrete dims of node i in the last run */
    int64_t          *numel;               /* numel[i]: elements of node i */
    double          **wt;                  /* wt[i]: dequantized weight i, or state store of state i */
    int64_t          *sym;                 /* symbol values of the current run */
    bool              ran;                 /* a run completed */
};

#define FAIL(...) do { snprintf(err, en, __VA_ARGS__); return -1; } while (0)

/* ---------------------------------------------------------------- shapes and data */

static int64_t dims_of(const kiln_node_rec *n, const int64_t *sym, int64_t out[KILN_MAX_RANK])
{
    int64_t e = 1;
    for (int d = 0; d < KILN_MAX_RANK; d++) {
        out[d] = d < n->rank ? (kiln_dim_is_sym(n->dims[d]) ? sym[kiln_sym_index(n->dims[d])] : n->dims[d]) : 1;
        if (d < n->rank)
            e *= out[d];
    }
    return e;
}

static size_t tensor_bytes(kiln_dtype t, int rank, const int64_t *dims)
{
    if (rank == 0)
        return kiln_row_bytes(t, 1);
    int64_t rows = 1;
    for (int d = 0; d + 1 < rank; d++)
        rows *= dims[d];
    return kiln_row_bytes(t, dims[rank - 1]) * (size_t)rows;
}

/* Reads n values of dtype t into doubles (i32 read directly, others via kiln_dequantize). */
static int read_data(kiln_dtype t, const void *src, int64_t n, double *dst)
{
    if (n == 0)
        return 0;
    if (t == KILN_DTYPE_I32) {
        const int32_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = s[i];
        return 0;
    }
    float *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp)
        return -1;
    int rc = kiln_dequantize(t, src, tmp, n) == KILN_OK ? 0 : -1;
    for (int64_t i = 0; rc == 0 && i < n; i++)
        dst[i] = tmp[i];
    free(tmp);
    return rc;
}

static double *zalloc(int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

kiln_ref64 *kiln_ref64_new(const kiln_graph *g)
{
    if (!g || g->status != KILN_OK)
        return NULL;
    kiln_ref64 *r = calloc(1, sizeof *r);
    uint32_t nn = g->n_nodes ? g->n_nodes : 1;
    if (!r)
        return NULL;
    r->g = g;
    r->val = calloc(nn, sizeof *r->val);
    r->own = calloc(nn, sizeof *r->own);
    r->dims = calloc(nn, sizeof *r->dims);
    r->numel = calloc(nn, sizeof *r->numel);
    r->wt = calloc(nn, sizeof *r->wt);
    r->sym = calloc(g->n_syms + 1, sizeof *r->sym);
    bool ok = r->val && r->own && r->dims && r->numel && r->wt && r->sym;
    for (uint32_t i = 0; ok && i < g->n_nodes; i++) {
        const kiln_node_rec *nd = &g->nodes[i];
        if (nd->op != KILN_OP_WEIGHT && nd->op != KILN_OP_STATE)
            continue;
        int64_t d[KILN_MAX_RANK];
        int64_t e = dims_of(nd, r->sym, d); /* weights and states have constant dims */
        r->wt[i] = zalloc(e);
        ok = r->wt[i] != NULL;
        if (ok && nd->op == KILN_OP_WEIGHT && !nd->data && nd->random) { /* lazy random weight: its bytes */
            size_t nb = kiln_node_bytes(nd, d);
            void *tmp = malloc(nb ? nb : 1);
            ok = tmp && kiln_graph_weight_fill(nd, tmp) == KILN_OK && read_data((kiln_dtype)nd->dtype, tmp, e, r->wt[i]) == 0;
            free(tmp);
        } else if (ok && nd->op == KILN_OP_WEIGHT) {
            ok = nd->data && read_data((kiln_dtype)nd->dtype, nd->data, e, r->wt[i]) == 0;
        }
    }
    if (!ok) {
        kiln_ref64_free(r);
        return NULL;
    }
    return r;
}

static void clear_vals(kiln_ref64 *r)
{
    for (uint32_t i = 0; i < r->g->n_nodes; i++) {
        if (r->own[i])
            free(r->val[i]);
        r->val[i] = NULL;
        r->own[i] = false;
    }
    r->ran = false;
}

void kiln_ref64_free(kiln_ref64 *r)
{
    if (!r)
        return;
    if (r->val && r->own)
        clear_vals(r);
    for (uint32_t i = 0; r->wt && i < r->g->n_nodes; i++)
        free(r->wt[i]);
    free(r->val);
    free(r->own);
    free(r->dims);
    free(r->numel);
    free(r->wt);
    free(r->sym);
    free(r);
}

/* ---------------------------------------------------------------- ops */

#define SRC(k) (r->val[nd->src[k]])
#define SDIM(k) (r->dims[nd->src[k]])
#define SRANK(k) (r->g->nodes[nd->src[k]].rank)
#define SNUM(k) (r->numel[nd->src[k]])
#define HAS(k) (nd->n_src > (k) && nd->src[k] != KILN_IDX_NONE)

static int64_t last_dim(const kiln_ref64 *r, uint32_t node)
{
    int rank = r->g->nodes[node].rank;
    return rank ? r->dims[node][rank - 1] : 1;
}

static int op_matmul(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    int64_t K = last_dim(r, nd->src[0]), N = SDIM(1)[0];
    if (SDIM(1)[1] != K || (K && SNUM(0) / K * N != ne))
        FAIL("matmul: x has %lld columns, w is [%lld, %lld], y has %lld elements", (long long)K,
             (long long)N, (long long)SDIM(1)[1], (long long)ne);
    int64_t M = K ? SNUM(0) / K : ne / (N ? N : 1);
    const double *x = SRC(0), *w = SRC(1);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += x[m * K + k] * w[n * K + k];
            y[m * N + n] = s;
        }
    return 0;
}

static double silu(double x)
{
    return x / (1.0 + exp(-x));
}

static int op_elementwise(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    const double *a = SRC(0);
    const double *b = nd->n_src > 1 ? SRC(1) : NULL;
    int64_t nb = nd->n_src > 1 ? SNUM(1) : 1;
    if (SNUM(0) != ne || (b && (nb == 0 ? ne != 0 : ne % nb != 0)))
        FAIL("%s: operand sizes %lld and %lld do not fit the result's %lld", kiln_op_name((enum kiln_op)nd->op),
             (long long)SNUM(0), (long long)nb, (long long)ne);
    const double s = nd->f[0], c = sqrt(2.0 / M_PI);
    for (int64_t i = 0; i < ne; i++) {
        double x = a[i];
        switch (nd->op) {
        case KILN_OP_ADD: y[i] = x + b[i % nb]; break;
        case KILN_OP_MUL: y[i] = x * b[i % nb]; break;
        case KILN_OP_SCALE: y[i] = s * x; break;
        case KILN_OP_SILU: y[i] = silu(x); break;
        case KILN_OP_GELU: y[i] = 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x))); break;
        case KILN_OP_SIGMOID: y[i] = 1.0 / (1.0 + exp(-x)); break;
        case KILN_OP_TANH: y[i] = tanh(x); break;
        case KILN_OP_SWIGLU: y[i] = silu(x) * b[i % nb]; break;
        default: FAIL("ref64: op %d is not elementwise", nd->op);
        }
    }
    return 0;
}

/* rms_norm, layer_norm and softmax: one row of the last dim at a time. */
static int op_rows(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    int64_t D = last_dim(r, nd->src[0]);
    int64_t rows = D ? ne / D : 0;
    const double *x = SRC(0), eps = nd->f[0];
    const double *w = HAS(1) ? SRC(1) : NULL, *b = HAS(2) ? SRC(2) : NULL;
    if ((w && SNUM(1) != D) || (b && SNUM(2) != D) || SNUM(0) != ne)
        FAIL("%s: weight/bias sizes do not match the last dim %lld", kiln_op_name((enum kiln_op)nd->op), (long long)D);
    for (int64_t row = 0; row < rows; row++) {
        const double *xr = x + row * D;
        double *yr = y + row * D;
        if (nd->op == KILN_OP_SOFTMAX) {
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < D; i++)
                mx = xr[i] > mx ? xr[i] : mx;
            for (int64_t i = 0; i < D; i++)
                sum += (yr[i] = exp(xr[i] - mx));
            for (int64_t i = 0; i < D; i++)
                yr[i] /= sum;
            continue;
        }
        double mean = 0, var = 0;
        if (nd->op == KILN_OP_LAYER_NORM) {
            for (int64_t i = 0; i < D; i++)
                mean += xr[i];
            mean /= (double)D;
        }
        for (int64_t i = 0; i < D; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        double inv = 1.0 / sqrt(var / (double)D + eps);
        for (int64_t i = 0; i < D; i++)
            yr[i] = (xr[i] - mean) * inv * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    }
    return 0;
}

static int op_rope(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    const int64_t *xd = SDIM(0);
    int64_t T = xd[0], H = xd[1], hd = xd[2], rot = nd->i[1] > 0 ? nd->i[1] : hd, half = rot / 2;
    const double *x = SRC(0), *pos = SRC(1), theta = nd->f[0];
    if (SRANK(0) != 3 || hd % 2 || rot % 2 || rot > hd || SNUM(1) != T || ne != T * H * hd)
        FAIL("rope: x must be [n_tok, n_head, even head_dim] and pos [n_tok], rotary dims even and <= head_dim");
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const double *xr = x + (t * H + h) * hd;
            double *yr = y + (t * H + h) * hd;
            for (int64_t i = rot; i < hd; i++) yr[i] = xr[i]; /* partial rotary: the rest passes through */
            for (int64_t i = 0; i < half; i++) {
                double a = pos[t] * pow(theta, -2.0 * (double)i / (double)rot) * (nd->vec ? (double)nd->vec[i] : 1.0);
                int64_t i0 = nd->i[0] == KILN_ROPE_NEOX ? i : 2 * i;
                int64_t i1 = nd->i[0] == KILN_ROPE_NEOX ? i + half : 2 * i + 1;
                yr[i0] = xr[i0] * cos(a) - xr[i1] * sin(a);
                yr[i1] = xr[i0] * sin(a) + xr[i1] * cos(a);
            }
        }
    return 0;
}

/* Attention's logit soft-cap (f[1]; 0: none): cap * tanh(s / cap). */
static double softcap(const kiln_node_rec *nd, double s) { return nd->f[1] != 0 ? nd->f[1] * tanh(s / nd->f[1]) : s; }

static int op_attention(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    const int64_t *qd = SDIM(0), *kd = SDIM(1);
    int64_t T = qd[0], H = qd[1], hd = qd[2], Hkv = kd[0], C = kd[1];
    int64_t n_kv = kiln_dim_is_sym(nd->dim) ? r->sym[kiln_sym_index(nd->dim)] : nd->dim;
    if (SRANK(0) != 3 || SRANK(1) != 3 || kd[2] != hd || Hkv < 1 || H % Hkv || ne != T * H * hd ||
        SDIM(2)[0] != Hkv || SDIM(2)[1] != C || SDIM(2)[2] != hd)
        FAIL("attention: q [%lld, %lld, %lld] does not fit k [%lld, %lld, %lld]", (long long)T, (long long)H,
             (long long)hd, (long long)Hkv, (long long)C, (long long)kd[2]);
    if (n_kv < 1 || n_kv > C || T > n_kv)
        FAIL("attention: n_kv = %lld out of range (n_tok %lld, max_ctx %lld)", (long long)n_kv, (long long)T, (long long)C);
    double *p = zalloc(n_kv);
    if (!p)
        FAIL("ref64: out of memory");
    const double *q = SRC(0), *k = SRC(1), *v = SRC(2), scale = nd->f[0];
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            int64_t g = h / (H / Hkv), last = n_kv - T + t, j0 = kiln_attn_first_key(nd, last);
            const double *qr = q + (t * H + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = j0; j <= last; j++) {
                double s = 0;
                for (int64_t d = 0; d < hd; d++)
                    s += qr[d] * k[(g * C + j) * hd + d];
                p[j] = softcap(nd, s * scale);
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = j0; j <= last; j++)
                sum += (p[j] = exp(p[j] - mx));
            for (int64_t d = 0; d < hd; d++) {
                double acc = 0;
                for (int64_t j = j0; j <= last; j++)
                    acc += p[j] * v[(g * C + j) * hd + d];
                y[(t * H + h) * hd + d] = acc / sum;
            }
        }
    free(p);
    return 0;
}

/* Paged attention: the metadata is checked (kiln_paged_check, converted to i32), then every query
 * attends over its own sequence's keys found through the block table (a tree step's: the cached
 * keys and those of its ancestors and itself, kiln_paged_sees). */
static int op_paged_attention(kiln_ref64 *r, const kiln_node_rec *nd, double *y, char *err, size_t en)
{
    const int64_t *qd = SDIM(0), *kd = SDIM(1);
    int64_t T = qd[0], H = qd[1], hd = qd[2], Hkv = kd[0], C = kd[1], S = SDIM(4)[0], MB = SDIM(5)[1];
    bool tree = nd->n_src > 6 && nd->src[6] != KILN_IDX_NONE;
    int32_t *meta = malloc((size_t)(2 * T + 2 * S + S * MB) * sizeof *meta);
    double *p = zalloc(C > MB * nd->i[0] ? C : MB * nd->i[0]); /* a score per key a sequence can hold */
    if (!meta || !p) {
        free(meta), free(p);
        FAIL("ref64: out of memory");
    }
    for (int64_t i = 0; i < T; i++) meta[i] = (int32_t)SRC(3)[i];
    for (int64_t i = 0; i < 2 * S; i++) meta[T + i] = (int32_t)SRC(4)[i];
    for (int64_t i = 0; i < S * MB; i++) meta[T + 2 * S + i] = (int32_t)SRC(5)[i];
    for (int64_t i = 0; tree && i < T; i++) meta[T + 2 * S + S * MB + i] = (int32_t)SRC(6)[i];
    kiln_paged_meta m = {.pos = meta, .seqs = meta + T, .blocks = meta + T + 2 * S, .n_tok = T, .n_seq = S,
                         .max_blocks = MB, .block = nd->i[0], .n_slots = C,
                         .parents = tree ? meta + T + 2 * S + S * MB : NULL};
    char why[256];
    if (!kiln_paged_check(&m, NULL, why, sizeof why)) {
        free(meta), free(p);
        FAIL("paged_attention: %s", why);
    }
    const double *q = SRC(0), *k = SRC(1), *v = SRC(2), scale = nd->f[0];
    for (int64_t s = 0; s < S; s++) {
        int64_t q0, q_len, kv_len;
        kiln_paged_seq(&m, s, &q0, &q_len, &kv_len);
        const int32_t *bt = m.blocks + s * MB, *par = tree ? m.parents + q0 : NULL;
        int64_t cached = kv_len - q_len;
        for (int64_t t = q0; t < q0 + q_len; t++)
            for (int64_t h = 0; h < H; h++) {
                int64_t g = h / (H / Hkv), last = cached + (t - q0); /* a tree's row: its key, = pos[t] causal */
                int64_t j0 = kiln_attn_first_key(nd, last); /* tree steps have no window: 0 */
                double mx = -INFINITY, sum = 0;
                for (int64_t j = j0; j <= last; j++) { /* keys it does not see (other draft paths): p 0 */
                    p[j] = -INFINITY;
                    if (j >= cached && !kiln_paged_sees(par, t - q0, j - cached)) continue;
                    const double *kr = k + (g * C + kiln_paged_slot(bt, m.block, j)) * hd, *qr = q + (t * H + h) * hd;
                    double dot = 0;
                    for (int64_t d = 0; d < hd; d++) dot += qr[d] * kr[d];
                    p[j] = softcap(nd, dot * scale);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = j0; j <= last; j++) sum += (p[j] = exp(p[j] - mx));
                double *yr = y + (t * H + h) * hd;
                for (int64_t d = 0; d < hd; d++) yr[d] = 0;
                for (int64_t j = j0; j <= last; j++) {
                    if (p[j] == 0) continue;
                    const double *vr = v + (g * C + kiln_paged_slot(bt, m.block, j)) * hd;
                    for (int64_t d = 0; d < hd; d++) yr[d] += p[j] * vr[d] / sum;
                }
            }
    }
    free(meta), free(p);
    return 0;
}

/* kv_scatter writes into its source's buffer (the state store) and aliases it. */
static int op_kv_scatter(kiln_ref64 *r, uint32_t idx, const kiln_node_rec *nd, char *err, size_t en)
{
    const int64_t *sd = SDIM(0), *rd = SDIM(1);
    int64_t Hkv = sd[0], C = sd[1], hd = sd[2], T = rd[0];
    if (SRANK(0) != 3 || SRANK(1) != 3 || rd[1] != Hkv || rd[2] != hd || SNUM(2) != T)
        FAIL("kv_scatter: rows do not fit the state");
    double *st = SRC(0);
    const double *rows = SRC(1), *pos = SRC(2);
    for (int64_t t = 0; t < T; t++) {
        if (pos[t] < 0 || pos[t] >= (double)C)
            FAIL("kv_scatter: pos[%lld] = %.0f out of [0, %lld)", (long long)t, pos[t], (long long)C);
        for (int64_t h = 0; h < Hkv; h++)
            memcpy(st + (h * C + (int64_t)pos[t]) * hd, rows + (t * Hkv + h) * hd, (size_t)hd * sizeof(double));
    }
    r->val[idx] = st;
    return 0;
}

static int op_get_rows(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    int64_t V = SDIM(0)[0], D = SDIM(0)[1], n = SNUM(1);
    if (ne != n * D)
        FAIL("get_rows: result has %lld elements, expected %lld", (long long)ne, (long long)(n * D));
    for (int64_t t = 0; t < n; t++) {
        double id = SRC(1)[t];
        if (id < 0 || id >= (double)V)
            FAIL("get_rows: ids[%lld] = %.0f out of [0, %lld)", (long long)t, id, (long long)V);
        memcpy(y + t * D, SRC(0) + (int64_t)id * D, (size_t)D * sizeof(double));
    }
    return 0;
}

static int op_argmax(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    int64_t N = last_dim(r, nd->src[0]);
    if (N < 1 || SNUM(0) / N != ne)
        FAIL("argmax: %lld rows of %lld do not give %lld results", (long long)(N ? SNUM(0) / N : 0), (long long)N,
             (long long)ne);
    for (int64_t row = 0; row < ne; row++) {
        const double *x = SRC(0) + row * N;
        int64_t best = 0;
        for (int64_t i = 1; i < N; i++)
            if (x[i] > x[best])
                best = i;
        y[row] = (double)best;
    }
    return 0;
}

/* moe_route in f64: softmax per row; the k largest logits (first index on ties) keep their
 * probability, over the kept ones' sum with norm (i[1]); the rest 0. */
static int op_moe_route(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    int64_t E = last_dim(r, nd->src[0]), k = nd->i[0];
    if (E < 1 || k < 1 || k > E || SNUM(0) != ne) FAIL("moe_route: %lld experts, k %lld", (long long)E, (long long)k);
    for (int64_t row = 0; row < ne / E; row++) {
        const double *x = SRC(0) + row * E;
        double *yr = y + row * E, mx = -INFINITY, sum = 0, kept = 0;
        for (int64_t j = 0; j < E; j++) mx = fmax(mx, x[j]);
        for (int64_t j = 0; j < E; j++) sum += exp(x[j] - mx), yr[j] = -1; /* -1: not taken */
        for (int64_t t = 0; t < k; t++) {
            int64_t best = -1;
            for (int64_t j = 0; j < E; j++)
                if (yr[j] < 0 && (best < 0 || x[j] > x[best])) best = j;
            kept += yr[best] = exp(x[best] - mx) / sum;
        }
        for (int64_t j = 0; j < E; j++) yr[j] = yr[j] < 0 ? 0 : nd->i[1] ? yr[j] / kept : yr[j];
    }
    return 0;
}

/* moe_matmul: the slots chosen again here, in f64 (larger first, lower index on ties, NaN last). */
static int op_moe_matmul(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    const int64_t *wd = SDIM(1);
    int64_t T = SDIM(2)[0], E = wd[0], N = wd[1], K = wd[2], k = nd->i[0];
    bool per_slot = SRANK(0) == 3, sum = nd->i[1] != 0;
    if (SRANK(1) != 3 || SDIM(2)[1] != E || k < 1 || k > E || last_dim(r, nd->src[0]) != K ||
        SNUM(0) != T * (per_slot ? k : 1) * K || ne != T * (sum ? 1 : k) * N)
        FAIL("moe_matmul: x, w [%lld, %lld, %lld], r and k %lld do not fit", (long long)E, (long long)N, (long long)K,
             (long long)k);
    int64_t *slot = malloc((size_t)k * sizeof *slot);
    if (!slot) FAIL("moe_matmul: out of memory");
    for (int64_t t = 0; t < T; t++) {
        const double *rt = SRC(2) + t * E;
        for (int64_t s = 0; s < k; s++) { /* pass s: the first best of those not taken */
            int64_t best = -1;
            for (int64_t j = 0; j < E; j++) {
                bool taken = false;
                for (int64_t q = 0; q < s && !taken; q++) taken = slot[q] == j;
                if (!taken && (best < 0 || (!isnan(rt[j]) && (isnan(rt[best]) || rt[j] > rt[best])))) best = j;
            }
            slot[s] = best;
        }
        double *yt = y + t * (sum ? 1 : k) * N;
        for (int64_t n = 0; sum && n < N; n++) yt[n] = 0;
        for (int64_t s = 0; s < k; s++) {
            const double *xr = SRC(0) + (t * (per_slot ? k : 1) + (per_slot ? s : 0)) * K, *w = SRC(1) + slot[s] * N * K;
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t i = 0; i < K; i++) acc += xr[i] * w[n * K + i];
                if (sum) yt[n] += rt[slot[s]] * acc;
                else yt[s * N + n] = acc;
            }
        }
    }
    free(slot);
    return 0;
}

static int op_scale_rows(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    int64_t D = last_dim(r, nd->src[0]), C = last_dim(r, nd->src[1]), col = nd->i[0];
    if (D < 1 || SNUM(0) != ne || col < 0 || col >= C || SNUM(1) / C != ne / D) FAIL("scale_rows: shapes");
    for (int64_t i = 0; i < ne; i++) y[i] = SRC(0)[i] * SRC(1)[(i / D) * C + col];
    return 0;
}

static void op_transpose(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne)
{
    int rank = SRANK(0);
    const int64_t *xd = SDIM(0);
    int64_t xs[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    int64_t od[KILN_MAX_RANK];
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        xs[d] = stride;
        stride *= xd[d];
    }
    for (int d = 0; d < rank; d++)
        od[d] = xd[d];
    od[nd->i[0]] = xd[nd->i[1]];
    od[nd->i[1]] = xd[nd->i[0]];
    for (int64_t o = 0; o < ne; o++) {
        int64_t rem = o, src = 0;
        for (int d = rank - 1; d >= 0; d--) {
            idx[d] = rem % od[d];
            rem /= od[d];
        }
        for (int d = 0; d < rank; d++) {
            int sd = d == nd->i[0] ? nd->i[1] : d == nd->i[1] ? nd->i[0] : d;
            src += idx[d] * xs[sd];
        }
        y[o] = SRC(0)[src];
    }
}

static int op_concat(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    int rank = SRANK(0), axis = nd->i[0];
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++)
        outer *= SDIM(0)[d];
    for (int d = axis + 1; d < rank; d++)
        inner *= SDIM(0)[d];
    int64_t na = SDIM(0)[axis] * inner, nb = SDIM(1)[axis] * inner;
    if (axis < 0 || axis >= rank || outer * (na + nb) != ne || SNUM(1) != outer * nb)
        FAIL("concat: operands do not fit the result along axis %d", axis);
    for (int64_t o = 0; o < outer; o++) {
        memcpy(y + o * (na + nb), SRC(0) + o * na, (size_t)na * sizeof(double));
        memcpy(y + o * (na + nb) + na, SRC(1) + o * nb, (size_t)nb * sizeof(double));
    }
    return 0;
}

/* Ops that move or convert data: cast, reshape, view, transpose, concat. */
static int op_layout(kiln_ref64 *r, const kiln_node_rec *nd, double *y, int64_t ne, char *err, size_t en)
{
    switch (nd->op) {
    case KILN_OP_CAST:
    case KILN_OP_RESHAPE:
    case KILN_OP_ALL_REDUCE: /* the sum over one device */
    case KILN_OP_ALL_GATHER: /* the slices of one device */
        if (SNUM(0) != ne)
            FAIL("%s: %lld elements in, %lld out", kiln_op_name((enum kiln_op)nd->op), (long long)SNUM(0), (long long)ne);
        for (int64_t i = 0; i < ne; i++)
            y[i] = nd->op == KILN_OP_CAST && nd->dtype == KILN_DTYPE_I32 ? nearbyint(SRC(0)[i]) : SRC(0)[i];
        return 0;
    case KILN_OP_VIEW:
        if (nd->dim < 0 || nd->dim + ne > SNUM(0))
            FAIL("view: offset %lld + %lld elements exceeds the source's %lld", (long long)nd->dim, (long long)ne,
                 (long long)SNUM(0));
        memcpy(y, SRC(0) + nd->dim, (size_t)ne * sizeof(double));
        return 0;
    case KILN_OP_TRANSPOSE:
        if (SNUM(0) != ne)
            FAIL("transpose: element counts differ");
        op_transpose(r, nd, y, ne);
        return 0;
    case KILN_OP_CONCAT:
        return op_concat(r, nd, y, ne, err, en);
    default:
        FAIL("ref64: op %d is not a layout op", nd->op);
    }
}

/* ---------------------------------------------------------------- run */

static const kiln_binding *find_binding(const kiln_binding *b, size_t n, const char *name, bool sym)
{
    for (size_t i = 0; name && i < n; i++)
        if (b[i].name && strcmp(b[i].name, name) == 0 && (b[i].data == NULL) == sym)
            return &b[i];
    return NULL;
}

static int bind_syms(kiln_ref64 *r, const kiln_binding *b, size_t n, char *err, size_t en)
{
    for (uint32_t s = 0; s < r->g->n_syms; s++) {
        const kiln_sym_rec *sr = &r->g->syms[s];
        const kiln_binding *x = find_binding(b, n, sr->name, true);
        if (!x)
            FAIL("symbol '%s' is not bound", sr->name);
        if (x->value < 0 || x->value > sr->max)
            FAIL("symbol '%s' = %lld out of [0, %lld]", sr->name, (long long)x->value, (long long)sr->max);
        r->sym[s] = x->value;
    }
    return 0;
}

static int eval_leaf(kiln_ref64 *r, uint32_t i, const kiln_binding *b, size_t n, char *err, size_t en)
{
    const kiln_node_rec *nd = &r->g->nodes[i];
    if (nd->op != KILN_OP_INPUT) {
        r->val[i] = r->wt[i]; /* weight data or state store, not owned by the node */
        return 0;
    }
    const kiln_binding *x = find_binding(b, n, nd->name, false);
    size_t want = tensor_bytes((kiln_dtype)nd->dtype, nd->rank, r->dims[i]);
    if (!x)
        FAIL("input '%s' is not bound", nd->name ? nd->name : "?");
    if (x->bytes != want)
        FAIL("input '%s': %zu bytes bound, %zu expected", nd->name, x->bytes, want);
    if (!(r->val[i] = zalloc(r->numel[i])))
        FAIL("ref64: out of memory");
    r->own[i] = true;
    if (read_data((kiln_dtype)nd->dtype, x->data, r->numel[i], r->val[i]) != 0)
        FAIL("input '%s': kiln_dequantize failed", nd->name);
    return 0;
}

static int eval_node(kiln_ref64 *r, uint32_t i, char *err, size_t en)
{
    const kiln_node_rec *nd = &r->g->nodes[i];
    int64_t ne = r->numel[i];
    if (nd->op == KILN_OP_KV_SCATTER)
        return op_kv_scatter(r, i, nd, err, en);
    double *y = zalloc(ne);
    if (!y)
        FAIL("ref64: out of memory");
    r->val[i] = y;
    r->own[i] = true;
    if (kiln_op_is_elementwise((enum kiln_op)nd->op) && nd->op != KILN_OP_CAST) /* the op table's class */
        return op_elementwise(r, nd, y, ne, err, en);
    switch (nd->op) {
    case KILN_OP_MATMUL: return op_matmul(r, nd, y, ne, err, en);
    case KILN_OP_RMS_NORM: case KILN_OP_LAYER_NORM: case KILN_OP_SOFTMAX: return op_rows(r, nd, y, ne, err, en);
    case KILN_OP_ROPE: return op_rope(r, nd, y, ne, err, en);
    case KILN_OP_ATTENTION: return op_attention(r, nd, y, ne, err, en);
    case KILN_OP_PAGED_ATTENTION: return op_paged_attention(r, nd, y, err, en);
    case KILN_OP_GET_ROWS: return op_get_rows(r, nd, y, ne, err, en);
    case KILN_OP_ARGMAX: return op_argmax(r, nd, y, ne, err, en);
    case KILN_OP_MOE_ROUTE: return op_moe_route(r, nd, y, ne, err, en);
    case KILN_OP_SCALE_ROWS: return op_scale_rows(r, nd, y, ne, err, en);
    case KILN_OP_MOE_MATMUL: return op_moe_matmul(r, nd, y, ne, err, en);
    default: return op_layout(r, nd, y, ne, err, en);
    }
}

int kiln_ref64_run(kiln_ref64 *r, const kiln_binding *b, size_t n, char *err, size_t en)
{
    if (!r)
        FAIL("kiln_ref64_run: NULL evaluator");
    clear_vals(r);
    if (bind_syms(r, b, n, err, en))
        return -1;
    for (uint32_t i = 0; i < r->g->n_nodes; i++) {
        const kiln_node_rec *nd = &r->g->nodes[i];
        r->numel[i] = dims_of(nd, r->sym, r->dims[i]);
        int rc = nd->op <= KILN_OP_STATE ? eval_leaf(r, i, b, n, err, en) : eval_node(r, i, err, en);
        if (rc) {
            size_t l = strlen(err);
            snprintf(err + l, en > l ? en - l : 0, " (node %u '%s')", i, nd->name ? nd->name : kiln_op_name((enum kiln_op)nd->op));
            return -1;
        }
    }
    r->ran = true;
    return 0;
}

/* ---------------------------------------------------------------- results and states */

const double *kiln_ref64_node(const kiln_ref64 *r, uint32_t idx, int64_t dims[KILN_MAX_RANK], int64_t *numel)
{
    if (!r || !r->ran || idx >= r->g->n_nodes)
        return NULL;
    if (dims)
        memcpy(dims, r->dims[idx], sizeof r->dims[idx]);
    if (numel)
        *numel = r->numel[idx];
    return r->val[idx];
}

const double *kiln_ref64_output(const kiln_ref64 *r, const char *name, int64_t dims[KILN_MAX_RANK], int64_t *numel)
{
    for (uint32_t o = 0; r && name && o < r->g->n_outs; o++)
        if (strcmp(r->g->outs[o].name, name) == 0)
            return kiln_ref64_node(r, r->g->outs[o].node, dims, numel);
    return NULL;
}

static uint32_t find_state(const kiln_ref64 *r, const char *name)
{
    for (uint32_t i = 0; r && name && i < r->g->n_nodes; i++)
        if (r->g->nodes[i].op == KILN_OP_STATE && r->g->nodes[i].name && strcmp(r->g->nodes[i].name, name) == 0)
            return i;
    return KILN_IDX_NONE;
}

const double *kiln_ref64_state(const kiln_ref64 *r, const char *name, int64_t *numel)
{
    uint32_t i = find_state(r, name);
    if (i == KILN_IDX_NONE)
        return NULL;
    int64_t d[KILN_MAX_RANK];
    int64_t e = dims_of(&r->g->nodes[i], r->sym, d);
    if (numel)
        *numel = e;
    return r->wt[i];
}

int kiln_ref64_state_set(kiln_ref64 *r, const char *name, const void *data, size_t bytes, char *err, size_t en)
{
    uint32_t i = find_state(r, name);
    if (i == KILN_IDX_NONE)
        FAIL("no state named '%s'", name ? name : "(null)");
    const kiln_node_rec *nd = &r->g->nodes[i];
    int64_t d[KILN_MAX_RANK];
    int64_t e = dims_of(nd, r->sym, d);
    size_t want = tensor_bytes((kiln_dtype)nd->dtype, nd->rank, d);
    if (bytes != want)
        FAIL("state '%s': %zu bytes given, %zu expected", name, bytes, want);
    if (read_data((kiln_dtype)nd->dtype, data, e, r->wt[i]) != 0)
        FAIL("state '%s': kiln_dequantize failed", name);
    return 0;
}
