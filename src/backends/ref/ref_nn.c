/* Reference kernels for the transformer ops: matmul (any weight dtype, dequantized row by row),
 * rope (normal and neox), causal GQA attention over a head-major cache, kv_scatter (in place into
 * the state) and get_rows. f32 arithmetic, runtime range checks with messages naming the node.
 * Must stay obviously correct: no SIMD, no threads, no blocking or other cleverness. */
#include "backends/ref/ref_util.h"
#include "graph/paged.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static kiln_dtype dtype_of(const kiln_ref_ctx *c, uint32_t i) { return (kiln_dtype)c->v->g->nodes[i].dtype; }

static int32_t read_i32(const void *base, int64_t i)
{
    int32_t x;
    memcpy(&x, (const char *)base + 4 * i, 4);
    return x;
}

/* y[m, n] = sum_k x[m, k] * w[n, k]; x flattened to M rows of K, w [N, K] of any dtype. */
kiln_status kiln_ref_matmul(const kiln_ref_ctx *c)
{
    uint32_t xi = c->node->src[0], wi = c->node->src[1];
    int64_t K = kiln_ref_last_dim(c->v, xi), N = c->v->dims[wi][0], M = K > 0 ? kiln_ref_numel(c->v, xi) / K : 0;
    if (c->v->g->nodes[wi].rank != 2 || c->v->dims[wi][1] != K)
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "x has %lld columns but w is not [N, %lld]", (long long)K,
                             (long long)K);
    kiln_status st = KILN_OK;
    float *x = kiln_ref_load_node(c, xi, &st), *w = NULL, *y = NULL;
    if (x)
        w = kiln_ref_alloc(c, K, &st);
    if (w)
        y = kiln_ref_alloc(c, M * N, &st);
    for (int64_t n = 0; y && st == KILN_OK && n < N; n++) {
        st = kiln_ref_load(c, dtype_of(c, wi), c->v->bufs[wi], n * K, K, w);
        for (int64_t m = 0; st == KILN_OK && m < M; m++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += x[m * K + k] * w[k];
            y[m * N + n] = acc;
        }
    }
    if (y && st == KILN_OK)
        st = kiln_ref_store(c, (kiln_dtype)c->node->dtype, c->v->bufs[c->idx], 0, M * N, y);
    free(x);
    free(w);
    free(y);
    return st;
}

/* moe_matmul (kiln.h): per token its k slots (kiln_moe_slots of its row of r), each x's row times
 * the [N, K] rows of the slot's expert, dequantized row by row as in matmul; with sum, the slots
 * weighted by r and added in slot order. */
kiln_status kiln_ref_moe_matmul(const kiln_ref_ctx *c)
{
    const kiln_node_rec *nd = c->node;
    uint32_t xi = nd->src[0], wi = nd->src[1], ri = nd->src[2];
    const int64_t *wd = c->v->dims[wi];
    int64_t T = c->v->dims[ri][0], E = wd[0], N = wd[1], K = wd[2], k = nd->i[0];
    bool per_slot = c->v->g->nodes[xi].rank == 3, sum = nd->i[1] != 0;
    kiln_status st = KILN_OK;
    float *x = kiln_ref_load_node(c, xi, &st), *r = x ? kiln_ref_load_node(c, ri, &st) : NULL;
    float *w = r ? kiln_ref_alloc(c, K, &st) : NULL, *y = w ? kiln_ref_alloc(c, T * (sum ? 1 : k) * N, &st) : NULL;
    int32_t *slot = y ? malloc((size_t)k * sizeof *slot) : NULL;
    if (y && !slot) st = kiln_ref_fail(c, KILN_ERR_NOMEM, "out of memory");
    for (int64_t t = 0; slot && t < T; t++) {
        kiln_moe_slots(r + t * E, E, (int)k, slot);
        float *yt = y + t * (sum ? 1 : k) * N;
        for (int64_t n = 0; sum && n < N; n++) yt[n] = 0.0f;
        for (int64_t s = 0; st == KILN_OK && s < k; s++) {
            const float *xr = x + (t * (per_slot ? k : 1) + (per_slot ? s : 0)) * K;
            float rw = r[t * E + slot[s]];
            for (int64_t n = 0; st == KILN_OK && n < N; n++) {
                st = kiln_ref_load(c, dtype_of(c, wi), c->v->bufs[wi], (slot[s] * N + n) * K, K, w);
                float acc = 0.0f;
                for (int64_t i = 0; i < K; i++) acc += xr[i] * w[i];
                if (sum) yt[n] += rw * acc;
                else yt[s * N + n] = acc;
            }
        }
    }
    if (slot && st == KILN_OK) st = kiln_ref_store(c, KILN_DTYPE_F32, c->v->bufs[c->idx], 0, T * (sum ? 1 : k) * N, y);
    free(x), free(r), free(w), free(y), free(slot);
    return st;
}

/* x [n_tok, n_head, hd], pos i32 [n_tok]; pair i of the first d = kiln_rope_dims dims turns by
 * pos * theta^(-2i/d) (* its multiplier); the dims from d on pass through. */
kiln_status kiln_ref_rope(const kiln_ref_ctx *c)
{
    uint32_t xi = c->node->src[0], pi = c->node->src[1];
    int64_t hd = kiln_ref_last_dim(c->v, xi), numel = kiln_ref_numel(c->v, xi), n_tok = kiln_ref_numel(c->v, pi);
    bool neox = c->node->i[0] == KILN_ROPE_NEOX;
    if (hd % 2 != 0 || (n_tok > 0 && numel % (n_tok * hd) != 0) || (n_tok == 0 && numel != 0))
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "x of %lld values does not split into %lld tokens of head_dim %lld",
                             (long long)numel, (long long)n_tok, (long long)hd);
    kiln_status st = KILN_OK;
    float *x = kiln_ref_load_node(c, xi, &st);
    if (!x)
        return st;
    int64_t n_head = n_tok > 0 ? numel / (n_tok * hd) : 0, half = kiln_rope_dims(c->node, hd) / 2;
    for (int64_t t = 0; t < n_tok; t++) {
        double pos = read_i32(c->v->bufs[pi], t);
        for (int64_t h = 0; h < n_head; h++) {
            float *r = x + (t * n_head + h) * hd;
            for (int64_t i = 0; i < half; i++) {
                double ang = pos * kiln_rope_freq(c->node, i, hd);
                float cs = (float)cos(ang), sn = (float)sin(ang);
                int64_t j0 = neox ? i : 2 * i, j1 = neox ? i + half : 2 * i + 1;
                float a = r[j0], b = r[j1];
                r[j0] = a * cs - b * sn;
                r[j1] = a * sn + b * cs;
            }
        }
    }
    st = kiln_ref_store(c, (kiln_dtype)c->node->dtype, c->v->bufs[c->idx], 0, numel, x);
    free(x);
    return st;
}

/* Loads rows 0..n_kv-1 of every head of a cache [n_kv_head, max_ctx, d] into f32 [n_kv_head, n_kv, d]. */
static float *load_cache(const kiln_ref_ctx *c, uint32_t i, int64_t n_kv, kiln_status *st)
{
    const int64_t *d = c->v->dims[i];
    float *p = kiln_ref_alloc(c, d[0] * n_kv * d[2], st);
    for (int64_t h = 0; p && h < d[0]; h++) {
        *st = kiln_ref_load(c, dtype_of(c, i), c->v->bufs[i], h * d[1] * d[2], n_kv * d[2], p + h * n_kv * d[2]);
        if (*st != KILN_OK) {
            free(p);
            return NULL;
        }
    }
    return p;
}

/* One query row q[hd] against n keys/values (rows of k [.., hd] and v [.., dv]) -> out[dv]. */
static void attend(const float *q, const float *k, const float *v, int64_t n, int64_t hd, int64_t dv,
                   float scale, float softcap, float *s, float *out)
{
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float dot = 0.0f;
        for (int64_t e = 0; e < hd; e++)
            dot += q[e] * k[j * hd + e];
        s[j] = dot * scale;
        if (softcap != 0.0f) s[j] = softcap * tanhf(s[j] / softcap);
        m = s[j] > m ? s[j] : m;
    }
    for (int64_t e = 0; e < dv; e++)
        out[e] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float p = expf(s[j] - m);
        sum += p;
        for (int64_t e = 0; e < dv; e++)
            out[e] += p * v[j * dv + e];
    }
    for (int64_t e = 0; e < dv; e++)
        out[e] /= sum;
}

/* Checks attention's runtime shapes; returns n_kv through *n_kv_out. */
static kiln_status attention_check(const kiln_ref_ctx *c, int64_t *n_kv_out)
{
    const int64_t *qd = c->v->dims[c->node->src[0]], *kd = c->v->dims[c->node->src[1]],
                  *vd = c->v->dims[c->node->src[2]];
    int64_t n_kv = kiln_dim_is_sym(c->node->dim) ? c->v->sym_vals[kiln_sym_index(c->node->dim)] : c->node->dim;
    *n_kv_out = n_kv;
    if (n_kv < 1 || n_kv > kd[1] || n_kv > vd[1])
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "n_kv = %lld is outside [1, max_ctx = %lld]", (long long)n_kv,
                             (long long)kd[1]);
    if (qd[0] > n_kv)
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "n_tok = %lld exceeds n_kv = %lld", (long long)qd[0],
                             (long long)n_kv);
    if (kd[0] < 1 || qd[1] % kd[0] != 0 || vd[0] != kd[0] || qd[2] != kd[2])
        return kiln_ref_fail(c, KILN_ERR_SHAPE, "q [%lld, %lld, %lld] does not fit k [%lld, %lld, %lld]",
                             (long long)qd[0], (long long)qd[1], (long long)qd[2], (long long)kd[0],
                             (long long)kd[1], (long long)kd[2]);
    return KILN_OK;
}

/* q [n_tok, n_head, hd]; query t sits at n_kv - n_tok + t and sees keys 0..that position. */
kiln_status kiln_ref_attention(const kiln_ref_ctx *c)
{
    int64_t n_kv;
    kiln_status st = attention_check(c, &n_kv); /* the positions of a kv_scatter feeding it: sched/exec.c */
    if (st != KILN_OK)
        return st;
    uint32_t qi = c->node->src[0], ki = c->node->src[1], vi = c->node->src[2];
    const int64_t *qd = c->v->dims[qi];
    int64_t n_tok = qd[0], n_head = qd[1], hd = qd[2], n_kvh = c->v->dims[ki][0], dv = c->v->dims[vi][2];
    int64_t group = n_head / n_kvh;
    float scale = c->node->f[0] != 0.0f ? c->node->f[0] : 1.0f / sqrtf((float)hd); /* builder resolves it */
    float *q = kiln_ref_load_node(c, qi, &st), *k = NULL, *v = NULL, *s = NULL, *y = NULL;
    if (q)
        k = load_cache(c, ki, n_kv, &st);
    if (k)
        v = load_cache(c, vi, n_kv, &st);
    if (v)
        s = kiln_ref_alloc(c, n_kv, &st);
    if (s)
        y = kiln_ref_alloc(c, n_tok * n_head * dv, &st);
    for (int64_t t = 0; y && t < n_tok; t++) {
        int64_t p = n_kv - n_tok + t, j0 = kiln_attn_first_key(c->node, p);
        for (int64_t h = 0; h < n_head; h++) {
            int64_t g = h / group;
            attend(q + (t * n_head + h) * hd, k + (g * n_kv + j0) * hd, v + (g * n_kv + j0) * dv, p - j0 + 1, hd, dv,
                   scale, c->node->f[1], s, y + (t * n_head + h) * dv);
        }
    }
    if (y)
        st = kiln_ref_store(c, (kiln_dtype)c->node->dtype, c->v->bufs[c->idx], 0, n_tok * n_head * dv, y);
    free(q);
    free(k);
    free(v);
    free(s);
    free(y);
    return st;
}

/* Query t of a tree step (new token i of its sequence) sees the c cached keys of kr/vr and the new
 * keys of its ancestors and itself: those are gathered after the cached ones in kt/vt (whose first
 * c rows the caller filled). */
static void attend_tree(const kiln_paged_meta *m, const float *q, const float *kr, const float *vr, float *kt, float *vt,
                        int64_t q0, int64_t i, int64_t c, int64_t hd, float scale, float *s, float *y)
{
    int64_t n = c;
    for (int64_t j = 0; j <= i; j++)
        if (kiln_paged_sees(m->parents + q0, i, j)) {
            memcpy(kt + n * hd, kr + (c + j) * hd, (size_t)hd * sizeof *kt);
            memcpy(vt + n * hd, vr + (c + j) * hd, (size_t)hd * sizeof *vt);
            n++;
        }
    attend(q, kt, vt, n, hd, hd, scale, 0.0f, s, y); /* tree steps: no soft-cap (kiln_paged_attention_tree) */
}

/* Paged attention: each query over its own sequence's keys, found through the block table (a tree
 * step: the cached ones and its ancestors'). */
kiln_status kiln_ref_paged_attention(const kiln_ref_ctx *c)
{
    kiln_paged_meta m = kiln_paged_meta_of(c->v->g, c->idx, c->v->bufs, c->v->dims);
    char why[300];
    if (!kiln_paged_check(&m, NULL, why, sizeof why)) return kiln_ref_fail(c, KILN_ERR_BINDING, "%s", why);
    const int64_t *qd = c->v->dims[c->node->src[0]];
    int64_t n_head = qd[1], hd = qd[2], n_kvh = c->v->dims[c->node->src[1]][0], C = m.n_slots;
    kiln_status st = KILN_OK;
    float *q = kiln_ref_load_node(c, c->node->src[0], &st), *k = NULL, *v = NULL, *kr = NULL, *vr = NULL, *s = NULL, *y = NULL;
    float *kt = NULL, *vt = NULL;
    if (q) k = kiln_ref_load_node(c, c->node->src[1], &st);
    if (k) v = kiln_ref_load_node(c, c->node->src[2], &st);
    int64_t cap = m.max_blocks * m.block;
    if (v) kr = kiln_ref_alloc(c, cap * hd, &st);
    if (kr) vr = kiln_ref_alloc(c, cap * hd, &st);
    if (vr) s = kiln_ref_alloc(c, cap, &st);
    if (s) y = kiln_ref_alloc(c, m.n_tok * n_head * hd, &st);
    if (y && m.parents) kt = kiln_ref_alloc(c, cap * hd, &st);
    if (kt) vt = kiln_ref_alloc(c, cap * hd, &st);
    for (int64_t sq = 0; y && (vt || !m.parents) && sq < m.n_seq; sq++) {
        int64_t q0, q_len, kv_len;
        kiln_paged_seq(&m, sq, &q0, &q_len, &kv_len);
        for (int64_t g = 0; g < n_kvh; g++) {
            for (int64_t j = 0; j < kv_len; j++) { /* this head's keys of the sequence, in order */
                int64_t slot = kiln_paged_slot(m.blocks + sq * m.max_blocks, m.block, j);
                memcpy(kr + j * hd, k + (g * C + slot) * hd, (size_t)hd * sizeof *kr);
                memcpy(vr + j * hd, v + (g * C + slot) * hd, (size_t)hd * sizeof *vr);
            }
            int64_t cached = kv_len - q_len;
            if (m.parents) memcpy(kt, kr, (size_t)(cached * hd) * sizeof *kt), memcpy(vt, vr, (size_t)(cached * hd) * sizeof *vt);
            for (int64_t t = q0; t < q0 + q_len; t++) {
                int64_t j0 = kiln_attn_first_key(c->node, m.pos[t]); /* tree steps have no window: 0 */
                for (int64_t h = g * (n_head / n_kvh); h < (g + 1) * (n_head / n_kvh); h++) {
                    const float *qr = q + (t * n_head + h) * hd;
                    float *yr = y + (t * n_head + h) * hd;
                    if (m.parents) attend_tree(&m, qr, kr, vr, kt, vt, q0, t - q0, cached, hd, c->node->f[0], s, yr);
                    else attend(qr, kr + j0 * hd, vr + j0 * hd, m.pos[t] - j0 + 1, hd, hd, c->node->f[0], c->node->f[1], s, yr);
                }
            }
        }
    }
    if (y && (vt || !m.parents)) st = kiln_ref_store(c, KILN_DTYPE_F32, c->v->bufs[c->idx], 0, m.n_tok * n_head * hd, y);
    free(q), free(k), free(v), free(kr), free(vr), free(s), free(y), free(kt), free(vt);
    return st;
}

/* state[h, pos[t], :] = rows[t, h, :], in place; every position is checked before any write. */
kiln_status kiln_ref_kv_scatter(const kiln_ref_ctx *c)
{
    uint32_t si = c->node->src[0], ri = c->node->src[1], pi = c->node->src[2];
    const int64_t *sd = c->v->dims[si], *rd = c->v->dims[ri];
    int64_t n_tok = kiln_ref_numel(c->v, pi), n_kvh = sd[0], max_ctx = sd[1], hd = sd[2];
    kiln_dtype t = dtype_of(c, si);
    if (rd[0] != n_tok || rd[1] != n_kvh || rd[2] != hd)
        return kiln_ref_fail(c, KILN_ERR_SHAPE,
                             "rows [%lld, %lld, %lld] do not fit %lld positions into [%lld, %lld, %lld]", (long long)rd[0], (long long)rd[1], (long long)rd[2], (long long)n_tok,
                             (long long)n_kvh, (long long)max_ctx, (long long)hd);
    for (int64_t i = 0; i < n_tok; i++) {
        int32_t p = read_i32(c->v->bufs[pi], i);
        if (p < 0 || p >= max_ctx)
            return kiln_ref_fail(c, KILN_ERR_SHAPE, "position %d (token %lld) is outside [0, %lld)", p,
                                 (long long)i, (long long)max_ctx);
    }
    void *state = c->v->bufs[c->idx];
    if (state != c->v->bufs[si]) /* an executor that does not alias: carry the old state over first */
        memmove(state, c->v->bufs[si], kiln_row_bytes(t, hd) * (size_t)(n_kvh * max_ctx));
    kiln_status st = KILN_OK;
    float *rows = kiln_ref_load_node(c, ri, &st);
    for (int64_t i = 0; rows && st == KILN_OK && i < n_tok; i++) {
        int64_t p = read_i32(c->v->bufs[pi], i);
        for (int64_t h = 0; st == KILN_OK && h < n_kvh; h++)
            st = kiln_ref_store(c, t, state, (h * max_ctx + p) * hd, hd, rows + (i * n_kvh + h) * hd);
    }
    free(rows);
    return st;
}

/* out[i, :] = table[ids[i], :] (table of any dtype, dequantized), ids checked against V. */
kiln_status kiln_ref_get_rows(const kiln_ref_ctx *c)
{
    uint32_t ti = c->node->src[0], ii = c->node->src[1];
    int64_t V = c->v->dims[ti][0], D = kiln_ref_last_dim(c->v, ti), n = kiln_ref_numel(c->v, ii);
    for (int64_t i = 0; i < n; i++) {
        int32_t id = read_i32(c->v->bufs[ii], i);
        if (id < 0 || id >= V)
            return kiln_ref_fail(c, KILN_ERR_SHAPE, "id %d (index %lld) is outside [0, %lld)", id, (long long)i,
                                 (long long)V);
    }
    kiln_status st = KILN_OK;
    float *y = kiln_ref_alloc(c, n * D, &st);
    for (int64_t i = 0; y && st == KILN_OK && i < n; i++)
        st = kiln_ref_load(c, dtype_of(c, ti), c->v->bufs[ti], (int64_t)read_i32(c->v->bufs[ii], i) * D, D,
                           y + i * D);
    if (y && st == KILN_OK)
        st = kiln_ref_store(c, (kiln_dtype)c->node->dtype, c->v->bufs[c->idx], 0, n * D, y);
    free(y);
    return st;
}
