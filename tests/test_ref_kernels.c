/* Unit tests of the reference backend's kernels (kiln_ref_exec) on hand-made graphs: every element
 * checked against plain double-precision loops on fresh random data, odd sizes, block-format
 * weights, guard bytes around every buffer. Focus: attention (GQA, causal offset, n_tok > 1),
 * rope (both modes), kv_scatter (bounds), transpose/concat (rank 3/4). Not the op x dtype
 * conformance suite (tests/conformance does that). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ref/ref.h"

#define MAXN 8      /* nodes per test graph */
#define GUARD 64    /* guard bytes on each side of a buffer */
#define GUARD_BYTE 0xA5

/* A hand-built graph with its run-time view; nodes carry concrete dims. */
typedef struct tgraph {
    kiln_node_rec  nodes[MAXN];                   /* the arena */
    char          *mem[MAXN];                     /* allocation incl. guards (NULL when aliased) */
    void          *bufs[MAXN];                    /* node data */
    size_t         bytes[MAXN];                   /* data size */
    int64_t        dims[MAXN][KILN_MAX_RANK];     /* concrete dims */
    int64_t        syms[2];                       /* symbol values */
    kiln_graph     g;                             /* graph over nodes */
    kiln_exec_view v;                             /* view over all of the above */
    char           err[256];                      /* last error message */
} tgraph;

static uint64_t rng_state;

static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }

static double urand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

static void tg_init(tgraph *t)
{
    memset(t, 0, sizeof *t);
    t->g.nodes = t->nodes;
    t->v.g = &t->g;
    t->v.bufs = t->bufs;
    t->v.dims = (const int64_t(*)[KILN_MAX_RANK])t->dims;
    t->v.sym_vals = t->syms;
}

static int64_t tg_numel(const tgraph *t, uint32_t i)
{
    int64_t n = 1;
    for (int k = 0; k < t->nodes[i].rank; k++)
        n *= t->dims[i][k];
    return n;
}

/* Appends a node with its own guarded buffer (leaves get random data later; others are poisoned). */
static uint32_t tg_node(tgraph *t, enum kiln_op op, kiln_dtype dt, int rank, const int64_t *dims, int n_src,
                        const uint32_t *src, const char *name)
{
    uint32_t i = t->g.n_nodes++;
    cr_assert(i < MAXN);
    kiln_node_rec *n = &t->nodes[i];
    n->op = (uint8_t)op;
    n->dtype = (uint8_t)dt;
    n->rank = (uint8_t)rank;
    n->n_src = (uint8_t)n_src;
    n->name = (char *)name;
    for (int k = 0; k < KILN_MAX_SRC; k++)
        n->src[k] = k < n_src ? src[k] : KILN_IDX_NONE;
    for (int k = 0; k < rank; k++)
        n->dims[k] = t->dims[i][k] = dims[k];
    size_t rows = 1;
    for (int k = 0; k + 1 < rank; k++)
        rows *= (size_t)dims[k];
    t->bytes[i] = rank ? rows * kiln_row_bytes(dt, dims[rank - 1]) : kiln_dtype_block_bytes(dt);
    t->mem[i] = malloc(t->bytes[i] + 2 * GUARD);
    cr_assert(t->mem[i]);
    memset(t->mem[i], GUARD_BYTE, t->bytes[i] + 2 * GUARD);
    t->bufs[i] = t->mem[i] + GUARD;
    memset(t->bufs[i], 0xFF, t->bytes[i]); /* poison: NaN for every float dtype */
    return i;
}

/* Checks the guards of every buffer and frees them. */
static void tg_free(tgraph *t)
{
    for (uint32_t i = 0; i < t->g.n_nodes; i++) {
        if (!t->mem[i])
            continue;
        for (size_t b = 0; b < GUARD; b++) {
            cr_assert_eq((unsigned char)t->mem[i][b], GUARD_BYTE, "node %u: guard before overwritten", i);
            cr_assert_eq((unsigned char)t->mem[i][GUARD + t->bytes[i] + b], GUARD_BYTE,
                         "node %u: guard after overwritten", i);
        }
        free(t->mem[i]);
    }
}

/* Fills node i (a float or block dtype) with uniform values in [-scale, scale]; returns the values
 * as the kernel will read them (dequantized), as doubles the caller frees. */
static double *tg_fill(tgraph *t, uint32_t i, double scale)
{
    int64_t n = tg_numel(t, i);
    float *f = malloc((size_t)n * sizeof(float) + 4);
    double *d = malloc((size_t)n * sizeof(double) + 8);
    cr_assert(f && d);
    for (int64_t k = 0; k < n; k++)
        f[k] = (float)(scale * urand());
    kiln_dtype dt = (kiln_dtype)t->nodes[i].dtype;
    cr_assert_eq(kiln_quantize(dt, f, t->bufs[i], n), KILN_OK);
    cr_assert_eq(kiln_dequantize(dt, t->bufs[i], f, n), KILN_OK);
    for (int64_t k = 0; k < n; k++)
        d[k] = f[k];
    free(f);
    return d;
}

static void tg_set_i32(tgraph *t, uint32_t i, const int32_t *vals)
{
    memcpy(t->bufs[i], vals, (size_t)tg_numel(t, i) * 4);
}

/* Node i's data as doubles (caller frees). */
static double *tg_read(tgraph *t, uint32_t i)
{
    int64_t n = tg_numel(t, i);
    float *f = malloc((size_t)n * sizeof(float) + 4);
    double *d = malloc((size_t)n * sizeof(double) + 8);
    cr_assert(f && d);
    cr_assert_eq(kiln_dequantize((kiln_dtype)t->nodes[i].dtype, t->bufs[i], f, n), KILN_OK);
    for (int64_t k = 0; k < n; k++)
        d[k] = f[k];
    free(f);
    return d;
}

static kiln_status tg_run(tgraph *t, uint32_t i) { return kiln_ref_exec(&t->v, i, t->err, sizeof t->err); }

/* Relative precision of a dtype's rounding (half an ulp). */
static double dtype_eps(kiln_dtype t)
{
    return t == KILN_DTYPE_F16 ? 0x1p-11 : t == KILN_DTYPE_BF16 ? 0x1p-8 : 0x1p-24;
}

static void check_close(const double *got, const double *ref, int64_t n, double atol, double rtol, const char *what)
{
    for (int64_t k = 0; k < n; k++)
        cr_assert(fabs(got[k] - ref[k]) <= atol + rtol * fabs(ref[k]), "%s: element %lld is %.9g, expected %.9g",
                  what, (long long)k, got[k], ref[k]);
}

/* ------------------------------------------------------------------ matmul */

static void matmul_case(kiln_dtype xt, kiln_dtype wt, int64_t b0, int64_t m, int64_t n, int64_t k)
{
    tgraph t;
    tg_init(&t);
    uint32_t x = tg_node(&t, KILN_OP_INPUT, xt, 3, (int64_t[]){b0, m, k}, 0, NULL, "x");
    uint32_t w = tg_node(&t, KILN_OP_WEIGHT, wt, 2, (int64_t[]){n, k}, 0, NULL, "w");
    uint32_t y = tg_node(&t, KILN_OP_MATMUL, KILN_DTYPE_F32, 3, (int64_t[]){b0, m, n}, 2, (uint32_t[]){x, w}, "y");
    double *xd = tg_fill(&t, x, 1.0), *wd = tg_fill(&t, w, 1.0);
    cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
    double *yd = tg_read(&t, y);
    for (int64_t r = 0; r < b0 * m; r++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t e = 0; e < k; e++) {
                ref += xd[r * k + e] * wd[j * k + e];
                mag += fabs(xd[r * k + e] * wd[j * k + e]);
            }
            double got = yd[r * n + j];
            /* sequential f32 summation: error <= ~K ulps of sum |x w| */
            cr_assert(fabs(got - ref) <= (double)(k + 2) * 0x1p-24 * mag + 1e-30,
                      "matmul %s x %s: y[%lld, %lld] = %.9g, expected %.9g", kiln_dtype_name(xt), kiln_dtype_name(wt),
                      (long long)r, (long long)j, got, ref);
        }
    free(xd);
    free(wd);
    free(yd);
    tg_free(&t);
}

Test(ref_kernels, matmul_every_weight_dtype)
{
    rng_seed(1);
    const kiln_dtype wts[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                              KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
    for (size_t i = 0; i < sizeof wts / sizeof wts[0]; i++) {
        matmul_case(KILN_DTYPE_F32, wts[i], 1, 1, 3, 256);
        matmul_case(KILN_DTYPE_F32, wts[i], 2, 17, 5, 512);
    }
    matmul_case(KILN_DTYPE_F16, KILN_DTYPE_Q8_0, 3, 1, 17, 96);
    matmul_case(KILN_DTYPE_BF16, KILN_DTYPE_F32, 1, 3, 1, 17);
    matmul_case(KILN_DTYPE_F32, KILN_DTYPE_F16, 1, 1, 1, 1);
}

/* ------------------------------------------------------------------ rope */

static void rope_case(kiln_rope_mode mode, kiln_dtype dt, int64_t n_tok, int64_t n_head, int64_t hd, float theta)
{
    tgraph t;
    tg_init(&t);
    uint32_t x = tg_node(&t, KILN_OP_INPUT, dt, 3, (int64_t[]){n_tok, n_head, hd}, 0, NULL, "x");
    uint32_t p = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_I32, 1, (int64_t[]){n_tok}, 0, NULL, "pos");
    uint32_t y = tg_node(&t, KILN_OP_ROPE, dt, 3, (int64_t[]){n_tok, n_head, hd}, 2, (uint32_t[]){x, p}, "r");
    t.nodes[y].i[0] = (int32_t)mode;
    t.nodes[y].f[0] = theta;
    double *xd = tg_fill(&t, x, 2.0);
    int32_t pos[32];
    for (int64_t i = 0; i < n_tok; i++)
        pos[i] = (int32_t)((urand() + 1.0) * 2500.0); /* random, in [0, 5000) */
    if (n_tok > 2)
        pos[0] = 0; /* the identity rotation too */
    tg_set_i32(&t, p, pos);
    cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
    double *yd = tg_read(&t, y);
    int64_t half = hd / 2;
    for (int64_t tk = 0; tk < n_tok; tk++)
        for (int64_t h = 0; h < n_head; h++) {
            const double *xr = xd + (tk * n_head + h) * hd;
            const double *yr = yd + (tk * n_head + h) * hd;
            for (int64_t i = 0; i < half; i++) {
                double ang = pos[tk] * pow(theta, -2.0 * (double)i / (double)hd);
                int64_t a = mode == KILN_ROPE_NEOX ? i : 2 * i, b = mode == KILN_ROPE_NEOX ? i + half : 2 * i + 1;
                double ra = xr[a] * cos(ang) - xr[b] * sin(ang), rb = xr[a] * sin(ang) + xr[b] * cos(ang);
                double tol = 4e-6 + 2.0 * dtype_eps(dt) * 2.5;
                cr_assert(fabs(yr[a] - ra) <= tol && fabs(yr[b] - rb) <= tol,
                          "rope mode %d %s tok %lld head %lld pair %lld: (%.7g, %.7g), expected (%.7g, %.7g)", mode,
                          kiln_dtype_name(dt), (long long)tk, (long long)h, (long long)i, yr[a], yr[b], ra, rb);
            }
        }
    free(xd);
    free(yd);
    tg_free(&t);
}

Test(ref_kernels, rope_both_modes)
{
    rng_seed(2);
    for (int mode = 0; mode < KILN_ROPE_MODE_COUNT; mode++) {
        rope_case((kiln_rope_mode)mode, KILN_DTYPE_F32, 1, 1, 2, 10000.0f);
        rope_case((kiln_rope_mode)mode, KILN_DTYPE_F32, 3, 17, 8, 10000.0f);
        rope_case((kiln_rope_mode)mode, KILN_DTYPE_F32, 17, 3, 64, 500000.0f);
        rope_case((kiln_rope_mode)mode, KILN_DTYPE_F16, 5, 2, 16, 10000.0f);
        rope_case((kiln_rope_mode)mode, KILN_DTYPE_BF16, 3, 1, 6, 1000.0f);
    }
}

/* Normal and neox must differ on the same data (guards against a kernel ignoring the mode). */
Test(ref_kernels, rope_modes_differ)
{
    double *out[2];
    for (int mode = 0; mode < 2; mode++) {
        rng_seed(3);
        tgraph t;
        tg_init(&t);
        uint32_t x = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_F32, 3, (int64_t[]){1, 1, 8}, 0, NULL, "x");
        uint32_t p = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_I32, 1, (int64_t[]){1}, 0, NULL, "pos");
        uint32_t y = tg_node(&t, KILN_OP_ROPE, KILN_DTYPE_F32, 3, (int64_t[]){1, 1, 8}, 2, (uint32_t[]){x, p}, NULL);
        t.nodes[y].i[0] = mode;
        t.nodes[y].f[0] = 10000.0f;
        free(tg_fill(&t, x, 1.0));
        tg_set_i32(&t, p, (int32_t[]){7});
        cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
        out[mode] = tg_read(&t, y);
        tg_free(&t);
    }
    cr_assert(fabs(out[0][1] - out[1][1]) > 1e-3, "normal and neox rope gave the same value");
    free(out[0]);
    free(out[1]);
}

/* ------------------------------------------------------------------ attention */

typedef struct attn_shape {
    int64_t    n_tok, n_head, n_kvh, hd, max_ctx, n_kv; /* shape and valid cache length */
    kiln_dtype qt, kvt;                                  /* q dtype, cache dtype */
    double     qmag;                                     /* |q| bound (0 = 1); large -> scores overflow exp */
} attn_shape;

/* Builds q, k, v and the attention node (n_kv as symbol 0); cache rows >= n_kv are NaN. */
static uint32_t attn_build(tgraph *t, const attn_shape *s, double **qd, double **kd, double **vd)
{
    tg_init(t);
    int64_t kvdims[3] = {s->n_kvh, s->max_ctx, s->hd};
    uint32_t q = tg_node(t, KILN_OP_INPUT, s->qt, 3, (int64_t[]){s->n_tok, s->n_head, s->hd}, 0, NULL, "q");
    uint32_t k = tg_node(t, KILN_OP_STATE, s->kvt, 3, kvdims, 0, NULL, "k");
    uint32_t v = tg_node(t, KILN_OP_STATE, s->kvt, 3, kvdims, 0, NULL, "v");
    uint32_t a = tg_node(t, KILN_OP_ATTENTION, KILN_DTYPE_F32, 3, (int64_t[]){s->n_tok, s->n_head, s->hd}, 3,
                         (uint32_t[]){q, k, v}, "attn");
    t->nodes[a].dim = kiln_sym_dim(0);
    t->nodes[a].f[0] = (float)(1.0 / sqrt((double)s->hd)) * 1.5f;
    t->syms[0] = s->n_kv;
    *qd = tg_fill(t, q, s->qmag > 0 ? s->qmag : 1.0);
    *kd = tg_fill(t, k, 1.0);
    *vd = tg_fill(t, v, 1.0);
    float nan_row[64];
    for (int e = 0; e < 64; e++)
        nan_row[e] = NAN;
    size_t rb = kiln_row_bytes(s->kvt, s->hd);
    for (int64_t h = 0; h < s->n_kvh; h++)
        for (int64_t r = s->n_kv > 0 ? s->n_kv : 0; r < s->max_ctx; r++) {
            kiln_quantize(s->kvt, nan_row, (char *)t->bufs[k] + (size_t)(h * s->max_ctx + r) * rb, s->hd);
            kiln_quantize(s->kvt, nan_row, (char *)t->bufs[v] + (size_t)(h * s->max_ctx + r) * rb, s->hd);
        }
    return a;
}

static void attn_case(attn_shape s)
{
    tgraph t;
    double *qd, *kd, *vd;
    uint32_t a = attn_build(&t, &s, &qd, &kd, &vd);
    cr_assert_eq(tg_run(&t, a), KILN_OK, "%s", t.err);
    double *yd = tg_read(&t, a), sc[64], out[64];
    double scale = t.nodes[a].f[0];
    int64_t group = s.n_head / s.n_kvh;
    for (int64_t tk = 0; tk < s.n_tok; tk++)
        for (int64_t h = 0; h < s.n_head; h++) {
            const double *qr = qd + (tk * s.n_head + h) * s.hd;
            const double *kh = kd + (h / group) * s.max_ctx * s.hd, *vh = vd + (h / group) * s.max_ctx * s.hd;
            int64_t last = s.n_kv - s.n_tok + tk;
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= last; j++) {
                sc[j] = 0;
                for (int64_t e = 0; e < s.hd; e++)
                    sc[j] += qr[e] * kh[j * s.hd + e];
                sc[j] *= scale;
                m = fmax(m, sc[j]);
            }
            for (int64_t e = 0; e < s.hd; e++)
                out[e] = 0;
            for (int64_t j = 0; j <= last; j++) {
                double p = exp(sc[j] - m);
                sum += p;
                for (int64_t e = 0; e < s.hd; e++)
                    out[e] += p * vh[j * s.hd + e];
            }
            for (int64_t e = 0; e < s.hd; e++)
                out[e] /= sum;
            /* score rounding grows with |q|: the tolerance follows it */
            check_close(yd + (tk * s.n_head + h) * s.hd, out, s.hd, 2e-6 * fmax(1.0, s.qmag), 1e-5, "attention");
        }
    free(qd);
    free(kd);
    free(vd);
    free(yd);
    tg_free(&t);
}

Test(ref_kernels, attention_gqa_causal)
{
    rng_seed(4);
    /* n_tok, n_head, n_kvh, hd, max_ctx, n_kv, q dtype, cache dtype */
    attn_case((attn_shape){1, 1, 1, 1, 1, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, 1});  /* smallest */
    attn_case((attn_shape){1, 4, 2, 8, 17, 11, KILN_DTYPE_F32, KILN_DTYPE_F32, 1});   /* decode, GQA 2 */
    attn_case((attn_shape){3, 4, 2, 16, 17, 11, KILN_DTYPE_F32, KILN_DTYPE_F16, 1});  /* n_tok > 1, offset */
    attn_case((attn_shape){17, 8, 1, 8, 17, 17, KILN_DTYPE_BF16, KILN_DTYPE_F32, 1}); /* full prefill, MQA */
    attn_case((attn_shape){5, 3, 3, 32, 40, 5, KILN_DTYPE_F16, KILN_DTYPE_BF16, 1});  /* n_tok == n_kv, MHA */
    attn_case((attn_shape){2, 6, 3, 32, 33, 33, KILN_DTYPE_F32, KILN_DTYPE_Q8_0, 1}); /* block cache, n_kv = max */
    attn_case((attn_shape){2, 2, 1, 16, 9, 7, KILN_DTYPE_F32, KILN_DTYPE_F32, 400}); /* scores >> 88: safe softmax */
}

Test(ref_kernels, attention_rejects_bad_n_kv)
{
    rng_seed(5);
    struct { int64_t n_tok, n_kv; } bad[] = {{1, 0}, {1, 18}, {4, 3}, {1, -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tgraph t;
        double *qd, *kd, *vd;
        attn_shape s = {bad[i].n_tok, 2, 1, 4, 17, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, 1};
        uint32_t a = attn_build(&t, &s, &qd, &kd, &vd);
        t.syms[0] = bad[i].n_kv;
        cr_assert_eq(tg_run(&t, a), KILN_ERR_SHAPE, "n_tok %lld n_kv %lld accepted", (long long)bad[i].n_tok,
                     (long long)bad[i].n_kv);
        cr_assert(strstr(t.err, "attn") && strstr(t.err, "attention"), "message '%s' does not name the node", t.err);
        free(qd);
        free(kd);
        free(vd);
        tg_free(&t);
    }
}

/* ------------------------------------------------------------------ kv_scatter */

static void scatter_case(kiln_dtype st_t, kiln_dtype rows_t, int64_t n_tok, int64_t n_kvh, int64_t max_ctx,
                         int64_t hd)
{
    tgraph t;
    tg_init(&t);
    int64_t sd[3] = {n_kvh, max_ctx, hd};
    uint32_t s = tg_node(&t, KILN_OP_STATE, st_t, 3, sd, 0, NULL, "kcache");
    uint32_t r = tg_node(&t, KILN_OP_INPUT, rows_t, 3, (int64_t[]){n_tok, n_kvh, hd}, 0, NULL, "rows");
    uint32_t p = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_I32, 1, (int64_t[]){n_tok}, 0, NULL, "pos");
    uint32_t o = tg_node(&t, KILN_OP_KV_SCATTER, st_t, 3, sd, 3, (uint32_t[]){s, r, p}, "kv_w");
    free(t.mem[o]); /* the result aliases the state */
    t.mem[o] = NULL;
    t.bufs[o] = t.bufs[s];
    double *before = tg_fill(&t, s, 1.0), *rd = tg_fill(&t, r, 3.0);
    int32_t pos[64];
    int64_t shift = (int64_t)((urand() + 1.0) * 0.5 * (double)max_ctx);
    for (int64_t i = 0; i < n_tok; i++) /* distinct (7 is prime to every max_ctx used), random start */
        pos[i] = (int32_t)((shift + 7 * i) % max_ctx);
    tg_set_i32(&t, p, pos);
    cr_assert_eq(tg_run(&t, o), KILN_OK, "%s", t.err);
    double *after = tg_read(&t, s), *ref = malloc((size_t)(n_kvh * max_ctx * hd) * sizeof(double));
    memcpy(ref, before, (size_t)(n_kvh * max_ctx * hd) * sizeof(double));
    for (int64_t i = 0; i < n_tok; i++)
        for (int64_t h = 0; h < n_kvh; h++)
            for (int64_t e = 0; e < hd; e++)
                ref[(h * max_ctx + pos[i]) * hd + e] = rd[(i * n_kvh + h) * hd + e];
    check_close(after, ref, n_kvh * max_ctx * hd, 0, 2 * dtype_eps(st_t), "kv_scatter");

    /* Out-of-range positions fail, name the node and the value, and leave the state alone. */
    const int32_t bad[] = {(int32_t)max_ctx, -1, 1 << 30};
    for (size_t b = 0; b < 3; b++) {
        pos[n_tok - 1] = bad[b];
        tg_set_i32(&t, p, pos);
        cr_assert_eq(tg_run(&t, o), KILN_ERR_SHAPE, "position %d accepted", bad[b]);
        char want[32];
        snprintf(want, sizeof want, "%d", bad[b]);
        cr_assert(strstr(t.err, "kv_w") && strstr(t.err, want), "message '%s' lacks the node or %s", t.err, want);
        double *again = tg_read(&t, s);
        check_close(again, after, n_kvh * max_ctx * hd, 0, 0, "state after a rejected kv_scatter");
        free(again);
    }
    free(before);
    free(rd);
    free(after);
    free(ref);
    tg_free(&t);
}

Test(ref_kernels, kv_scatter_writes_and_checks_bounds)
{
    rng_seed(6);
    scatter_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 1, 1, 1, 1);
    scatter_case(KILN_DTYPE_F32, KILN_DTYPE_F32, 3, 2, 17, 8);
    scatter_case(KILN_DTYPE_F16, KILN_DTYPE_F32, 5, 3, 9, 16);
    scatter_case(KILN_DTYPE_BF16, KILN_DTYPE_F16, 17, 1, 17, 4);
}

/* ------------------------------------------------------------------ transpose / concat */

static int64_t flat(const int64_t *dims, const int64_t *c, int rank)
{
    int64_t o = 0;
    for (int k = 0; k < rank; k++)
        o = o * dims[k] + c[k];
    return o;
}

/* Visits every coordinate of dims (rank <= 4) in row-major order. */
static bool next_coord(int64_t *c, const int64_t *dims, int rank)
{
    for (int k = rank - 1; k >= 0; k--) {
        if (++c[k] < dims[k])
            return true;
        c[k] = 0;
    }
    return false;
}

static void transpose_case(kiln_dtype dt, int rank, const int64_t *dims, int d0, int d1)
{
    tgraph t;
    tg_init(&t);
    int64_t od[KILN_MAX_RANK];
    memcpy(od, dims, sizeof od);
    od[d0] = dims[d1];
    od[d1] = dims[d0];
    uint32_t x = tg_node(&t, KILN_OP_INPUT, dt, rank, dims, 0, NULL, "x");
    uint32_t y = tg_node(&t, KILN_OP_TRANSPOSE, dt, rank, od, 1, (uint32_t[]){x}, NULL);
    t.nodes[y].i[0] = d0;
    t.nodes[y].i[1] = d1;
    double *xd = tg_fill(&t, x, 1.0);
    cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
    double *yd = tg_read(&t, y);
    int64_t c[KILN_MAX_RANK] = {0}, oc[KILN_MAX_RANK];
    do {
        memcpy(oc, c, sizeof oc);
        oc[d0] = c[d1];
        oc[d1] = c[d0];
        cr_assert_eq(yd[flat(od, oc, rank)], xd[flat(dims, c, rank)], "transpose rank %d (%d,%d) wrong", rank, d0, d1);
    } while (next_coord(c, dims, rank));
    free(xd);
    free(yd);
    tg_free(&t);
}

Test(ref_kernels, transpose_rank3_rank4)
{
    rng_seed(7);
    const int64_t d3[4] = {3, 5, 2, 1}, d4[4] = {2, 3, 4, 5};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            if (a < 3 && b < 3)
                transpose_case(KILN_DTYPE_F32, 3, d3, a, b);
            transpose_case((a + b) % 2 ? KILN_DTYPE_F16 : KILN_DTYPE_F32, 4, d4, a, b);
        }
    transpose_case(KILN_DTYPE_BF16, 2, (int64_t[]){17, 1, 0, 0}, 0, 1);
}

static void concat_case(kiln_dtype dt, int rank, const int64_t *da, const int64_t *db, int axis)
{
    tgraph t;
    tg_init(&t);
    int64_t od[KILN_MAX_RANK];
    memcpy(od, da, sizeof od);
    od[axis] = da[axis] + db[axis];
    uint32_t a = tg_node(&t, KILN_OP_INPUT, dt, rank, da, 0, NULL, "a");
    uint32_t b = tg_node(&t, KILN_OP_INPUT, dt, rank, db, 0, NULL, "b");
    uint32_t y = tg_node(&t, KILN_OP_CONCAT, dt, rank, od, 2, (uint32_t[]){a, b}, NULL);
    t.nodes[y].i[0] = axis;
    double *ad = tg_fill(&t, a, 1.0), *bd = tg_fill(&t, b, 1.0);
    cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
    double *yd = tg_read(&t, y);
    int64_t c[KILN_MAX_RANK] = {0}, sc[KILN_MAX_RANK];
    do {
        memcpy(sc, c, sizeof sc);
        bool in_a = c[axis] < da[axis];
        if (!in_a)
            sc[axis] -= da[axis];
        double want = in_a ? ad[flat(da, sc, rank)] : bd[flat(db, sc, rank)];
        cr_assert_eq(yd[flat(od, c, rank)], want, "concat %s rank %d axis %d wrong", kiln_dtype_name(dt), rank, axis);
    } while (next_coord(c, od, rank));
    free(ad);
    free(bd);
    free(yd);
    tg_free(&t);
}

Test(ref_kernels, concat_every_axis)
{
    rng_seed(8);
    for (int axis = 0; axis < 4; axis++) {
        int64_t a4[4] = {2, 3, 1, 5}, b4[4] = {2, 3, 1, 5};
        b4[axis] = 3;
        concat_case(KILN_DTYPE_F32, 4, a4, b4, axis);
        if (axis < 3) {
            int64_t a3[4] = {3, 1, 17, 0}, b3[4] = {3, 1, 17, 0};
            b3[axis] = 2;
            concat_case(KILN_DTYPE_F16, 3, a3, b3, axis);
            int64_t q3[4] = {2, 3, 32, 0}, r3[4] = {2, 3, 32, 0};
            r3[axis] = axis == 2 ? 64 : 1;
            concat_case(KILN_DTYPE_Q8_0, 3, q3, r3, axis);
        }
    }
}

/* ------------------------------------------------------------------ get_rows, argmax, cast */

Test(ref_kernels, get_rows_block_table_and_bounds)
{
    rng_seed(9);
    const kiln_dtype tts[] = {KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K, KILN_DTYPE_F16};
    for (size_t ti = 0; ti < 3; ti++) {
        tgraph t;
        tg_init(&t);
        uint32_t tab = tg_node(&t, KILN_OP_WEIGHT, tts[ti], 2, (int64_t[]){5, 256}, 0, NULL, "emb");
        uint32_t ids = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_I32, 1, (int64_t[]){3}, 0, NULL, "ids");
        uint32_t y = tg_node(&t, KILN_OP_GET_ROWS, KILN_DTYPE_F32, 2, (int64_t[]){3, 256}, 2, (uint32_t[]){tab, ids},
                             "lookup");
        double *td = tg_fill(&t, tab, 1.0);
        int32_t idv[3] = {4, 0, 2};
        tg_set_i32(&t, ids, idv);
        cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
        double *yd = tg_read(&t, y);
        for (int i = 0; i < 3; i++)
            check_close(yd + i * 256, td + idv[i] * 256, 256, 0, 0, "get_rows");
        idv[1] = 5;
        tg_set_i32(&t, ids, idv);
        cr_assert_eq(tg_run(&t, y), KILN_ERR_SHAPE);
        cr_assert(strstr(t.err, "lookup") && strstr(t.err, "5"), "message '%s'", t.err);
        idv[1] = -1;
        tg_set_i32(&t, ids, idv);
        cr_assert_eq(tg_run(&t, y), KILN_ERR_SHAPE);
        free(td);
        free(yd);
        tg_free(&t);
    }
}

Test(ref_kernels, argmax_ties_and_nan)
{
    tgraph t;
    tg_init(&t);
    uint32_t x = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_F32, 2, (int64_t[]){5, 4}, 0, NULL, "x");
    uint32_t y = tg_node(&t, KILN_OP_ARGMAX, KILN_DTYPE_I32, 1, (int64_t[]){5}, 1, (uint32_t[]){x}, NULL);
    const float xv[20] = {1, 3, 3, 2,            /* tie: first */
                          NAN, -5, -1, NAN,      /* NaN below everything */
                          NAN, NAN, NAN, NAN,    /* all NaN -> 0 */
                          -INFINITY, -INFINITY, -INFINITY, -2,
                          7, INFINITY, 8, NAN};
    memcpy(t.bufs[x], xv, sizeof xv);
    cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
    const int32_t want[5] = {1, 2, 0, 3, 1};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(((int32_t *)t.bufs[y])[i], want[i], "row %d: %d, expected %d", i, ((int32_t *)t.bufs[y])[i],
                     want[i]);
    tg_free(&t);
}

Test(ref_kernels, cast_float_to_i32_rounds_even_and_saturates)
{
    tgraph t;
    tg_init(&t);
    uint32_t x = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_F32, 1, (int64_t[]){11}, 0, NULL, "x");
    uint32_t y = tg_node(&t, KILN_OP_CAST, KILN_DTYPE_I32, 1, (int64_t[]){11}, 1, (uint32_t[]){x}, NULL);
    const float xv[11] = {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 2.6f, -3.4f, NAN, 3e9f, -3e9f, 16777215.0f};
    const int32_t want[11] = {0, 2, 2, 0, -2, 3, -3, 0, INT32_MAX, INT32_MIN, 16777215};
    memcpy(t.bufs[x], xv, sizeof xv);
    cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
    for (int i = 0; i < 11; i++)
        cr_assert_eq(((int32_t *)t.bufs[y])[i], want[i], "cast(%g) = %d, expected %d", xv[i],
                     ((int32_t *)t.bufs[y])[i], want[i]);
    tg_free(&t);
}

/* ------------------------------------------------------------------ norms, softmax, broadcast */

static void row_case(enum kiln_op op, kiln_dtype dt, int64_t rows, int64_t d, bool weighted, double xmag)
{
    tgraph t;
    tg_init(&t);
    uint32_t x = tg_node(&t, KILN_OP_INPUT, dt, 2, (int64_t[]){rows, d}, 0, NULL, "x");
    uint32_t w = tg_node(&t, KILN_OP_WEIGHT, KILN_DTYPE_F32, 1, (int64_t[]){d}, 0, NULL, "w");
    uint32_t b = tg_node(&t, KILN_OP_WEIGHT, KILN_DTYPE_F32, 1, (int64_t[]){d}, 0, NULL, "b");
    uint32_t src[3] = {x, weighted ? w : KILN_IDX_NONE, weighted ? b : KILN_IDX_NONE};
    int n_src = op == KILN_OP_SOFTMAX ? 1 : op == KILN_OP_RMS_NORM ? 2 : 3;
    uint32_t y = tg_node(&t, op, dt, 2, (int64_t[]){rows, d}, n_src, src, NULL);
    t.nodes[y].f[0] = 1e-5f;
    double *xd = tg_fill(&t, x, xmag), *wd = tg_fill(&t, w, 2.0), *bd = tg_fill(&t, b, 1.0), ref[64];
    cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
    double *yd = tg_read(&t, y);
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = xd + r * d;
        double mean = 0, ss = 0, mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < d; j++) {
            mean += xr[j] / (double)d;
            mx = fmax(mx, xr[j]);
        }
        if (op != KILN_OP_LAYER_NORM)
            mean = 0;
        for (int64_t j = 0; j < d; j++) {
            ss += (xr[j] - mean) * (xr[j] - mean) / (double)d;
            sum += exp(xr[j] - mx);
        }
        for (int64_t j = 0; j < d; j++) {
            if (op == KILN_OP_SOFTMAX) {
                ref[j] = exp(xr[j] - mx) / sum;
                continue;
            }
            ref[j] = (xr[j] - mean) / sqrt(ss + 1e-5);
            if (weighted)
                ref[j] = ref[j] * wd[j] + (op == KILN_OP_LAYER_NORM ? bd[j] : 0.0);
        }
        check_close(yd + r * d, ref, d, 1e-5, 1e-5 + 2 * dtype_eps(dt), kiln_op_name(op));
    }
    free(xd);
    free(wd);
    free(bd);
    free(yd);
    tg_free(&t);
}

Test(ref_kernels, norms_and_softmax_odd_sizes)
{
    rng_seed(10);
    const int64_t ds[] = {1, 3, 17, 64};
    for (int i = 0; i < 4; i++)
        for (int wtd = 0; wtd < 2; wtd++) {
            row_case(KILN_OP_RMS_NORM, KILN_DTYPE_F32, 3, ds[i], wtd, 3.0);
            row_case(KILN_OP_LAYER_NORM, i == 2 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32, 2, ds[i], wtd, 3.0);
            row_case(KILN_OP_SOFTMAX, i == 1 ? KILN_DTYPE_F16 : KILN_DTYPE_F32, 17, ds[i], false, 3.0);
        }
    row_case(KILN_OP_SOFTMAX, KILN_DTYPE_F32, 3, 17, false, 200.0); /* exp overflows without the max */
}

Test(ref_kernels, binary_broadcast_and_swiglu)
{
    rng_seed(11);
    const enum kiln_op ops[] = {KILN_OP_ADD, KILN_OP_MUL, KILN_OP_SWIGLU};
    for (int o = 0; o < 3; o++) {
        tgraph t;
        tg_init(&t);
        uint32_t a = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_F16, 3, (int64_t[]){3, 2, 17}, 0, NULL, "a");
        int brank = ops[o] == KILN_OP_SWIGLU ? 3 : 2;
        uint32_t b = tg_node(&t, KILN_OP_INPUT, KILN_DTYPE_F32, brank,
                             brank == 3 ? (int64_t[]){3, 2, 17} : (int64_t[]){2, 17}, 0, NULL, "b");
        uint32_t y = tg_node(&t, ops[o], KILN_DTYPE_F16, 3, (int64_t[]){3, 2, 17}, 2, (uint32_t[]){a, b}, NULL);
        double *ad = tg_fill(&t, a, 4.0), *bd = tg_fill(&t, b, 4.0), ref[102];
        int64_t nb = brank == 3 ? 102 : 34;
        for (int i = 0; i < 102; i++) {
            double x = ad[i], z = bd[i % nb];
            ref[i] = ops[o] == KILN_OP_ADD ? x + z : ops[o] == KILN_OP_MUL ? x * z : x / (1 + exp(-x)) * z;
        }
        cr_assert_eq(tg_run(&t, y), KILN_OK, "%s", t.err);
        double *yd = tg_read(&t, y);
        check_close(yd, ref, 102, 1e-6, 2 * dtype_eps(KILN_DTYPE_F16), kiln_op_name(ops[o]));
        free(ad);
        free(bd);
        free(yd);
        tg_free(&t);
    }
}
