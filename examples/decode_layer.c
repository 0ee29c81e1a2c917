/* Example: one llama-style decoder layer built with the public API, run for 16 decode steps over
 * a growing KV cache (one compiled plan; n_kv and pos bound per step). Every step's output is
 * checked against an independent f64 computation written below; exits 1 if any step's max error
 * exceeds 1e-4 of the output's largest magnitude. Usage: example_decode_layer [BACKEND].
 * Uses only kiln/kiln.h: this is how an inference engine hands kiln a layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

enum { C = 256, NH = 8, NKV = 4, HD = 32, FF = 512, MAXCTX = 64, STEPS = 16 };
#define EPS 1e-6f
#define THETA 10000.0f

/* The layer's weights, as f32 (kiln gets copies; the reference reads them as doubles). */
typedef struct layer_w {
    float wq[NH * HD * C], wk[NKV * HD * C], wv[NKV * HD * C], wo[C * NH * HD]; /* attention [out, in] */
    float wg[FF * C], wu[FF * C], wd[C * FF];                                   /* feed-forward [out, in] */
    float n1[C], n2[C];                                                         /* rms_norm weights */
} layer_w;

static uint64_t rng_state = 42;
static float frand(void) /* splitmix64 -> uniform [-1, 1) */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (float)((double)((z ^ (z >> 31)) >> 40) * 0x1p-23 - 1.0);
}
static void fill(float *w, int n, float scale, float bias)
{
    for (int i = 0; i < n; i++)
        w[i] = bias + scale * frand();
}

/* ------------------------------------------------------------------ f64 reference */

static void ref_matvec(const float *w, const double *x, double *y, int out, int in)
{
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < in; i++)
            s += (double)w[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

static void ref_rmsnorm(const double *x, const float *w, double *y)
{
    double ss = 0;
    for (int i = 0; i < C; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / C + (double)EPS);
    for (int i = 0; i < C; i++)
        y[i] = x[i] * r * w[i];
}

static void ref_rope(double *v, int n_head, int pos) /* normal mode: pairs (2i, 2i+1) */
{
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < HD / 2; i++) {
            double a = pos * pow((double)THETA, -2.0 * i / HD), c = cos(a), s = sin(a);
            double *p = v + h * HD + 2 * i, x0 = p[0], x1 = p[1];
            p[0] = x0 * c - x1 * s;
            p[1] = x0 * s + x1 * c;
        }
}

/* One decode step at position pos; kc/vc [NKV][MAXCTX][HD] is the reference's own cache. */
static void ref_step(const layer_w *w, const float *xin, int pos, double *kc, double *vc, double *y)
{
    static double x[C], h[C], q[NH * HD], k[NKV * HD], v[NKV * HD], a[NH * HD], o[C], g[FF], u[FF];
    for (int i = 0; i < C; i++)
        x[i] = xin[i];
    ref_rmsnorm(x, w->n1, h);
    ref_matvec(w->wq, h, q, NH * HD, C);
    ref_matvec(w->wk, h, k, NKV * HD, C);
    ref_matvec(w->wv, h, v, NKV * HD, C);
    ref_rope(q, NH, pos);
    ref_rope(k, NKV, pos);
    for (int kh = 0; kh < NKV; kh++)
        for (int d = 0; d < HD; d++) {
            kc[((size_t)kh * MAXCTX + pos) * HD + d] = k[kh * HD + d];
            vc[((size_t)kh * MAXCTX + pos) * HD + d] = v[kh * HD + d];
        }
    for (int hq = 0; hq < NH; hq++) {
        int kh = hq / (NH / NKV);
        double sc[MAXCTX], mx = -INFINITY, den = 0;
        for (int t = 0; t <= pos; t++) {
            double s = 0;
            for (int d = 0; d < HD; d++)
                s += q[hq * HD + d] * kc[((size_t)kh * MAXCTX + t) * HD + d];
            sc[t] = s / sqrt((double)HD);
            mx = fmax(mx, sc[t]);
        }
        for (int t = 0; t <= pos; t++)
            den += (sc[t] = exp(sc[t] - mx));
        for (int d = 0; d < HD; d++) {
            double s = 0;
            for (int t = 0; t <= pos; t++)
                s += sc[t] * vc[((size_t)kh * MAXCTX + t) * HD + d];
            a[hq * HD + d] = s / den;
        }
    }
    ref_matvec(w->wo, a, o, C, NH * HD);
    for (int i = 0; i < C; i++)
        x[i] += o[i];
    ref_rmsnorm(x, w->n2, h);
    ref_matvec(w->wg, h, g, FF, C);
    ref_matvec(w->wu, h, u, FF, C);
    for (int i = 0; i < FF; i++)
        g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
    ref_matvec(w->wd, g, o, C, FF);
    for (int i = 0; i < C; i++)
        y[i] = x[i] + o[i];
}

/* ------------------------------------------------------------------ the kiln graph */

static kiln_node weight(kiln_graph *g, const char *name, const float *data, int64_t out, int64_t in)
{
    kiln_dim d[2] = {out, in};
    return in ? kiln_weight(g, name, KILN_DTYPE_F32, 2, d, data, KILN_WEIGHT_COPY)
              : kiln_weight(g, name, KILN_DTYPE_F32, 1, d, data, KILN_WEIGHT_COPY);
}

/* Builds the layer; builder errors stick to g and are reported by kiln_graph_status. */
static void build(kiln_graph *g, const layer_w *w)
{
    kiln_dim n_tok = kiln_sym(g, "n_tok", 1), n_kv = kiln_sym(g, "n_kv", MAXCTX);
    kiln_dim xd[2] = {n_tok, C}, pd[1] = {n_tok}, sd[3] = {NKV, MAXCTX, HD};
    kiln_dim qd[3] = {n_tok, NH, HD}, kd[3] = {n_tok, NKV, HD}, ad[2] = {n_tok, NH * HD};
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, xd);
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, pd);
    kiln_node h = kiln_rms_norm(g, x, weight(g, "n1", w->n1, C, 0), EPS);
    kiln_node q = kiln_reshape(g, kiln_matmul(g, h, weight(g, "wq", w->wq, NH * HD, C)), 3, qd);
    kiln_node k = kiln_reshape(g, kiln_matmul(g, h, weight(g, "wk", w->wk, NKV * HD, C)), 3, kd);
    kiln_node v = kiln_reshape(g, kiln_matmul(g, h, weight(g, "wv", w->wv, NKV * HD, C)), 3, kd);
    q = kiln_rope(g, q, pos, KILN_ROPE_NORMAL, THETA);
    k = kiln_rope(g, k, pos, KILN_ROPE_NORMAL, THETA);
    kiln_node kc = kiln_kv_scatter(g, kiln_state(g, "k_cache", KILN_DTYPE_F32, 3, sd), k, pos);
    kiln_node vc = kiln_kv_scatter(g, kiln_state(g, "v_cache", KILN_DTYPE_F32, 3, sd), v, pos);
    kiln_node a = kiln_reshape(g, kiln_attention(g, q, kc, vc, n_kv, 0.0f), 2, ad);
    x = kiln_add(g, x, kiln_matmul(g, a, weight(g, "wo", w->wo, C, NH * HD)));
    h = kiln_rms_norm(g, x, weight(g, "n2", w->n2, C, 0), EPS);
    kiln_node gate = kiln_matmul(g, h, weight(g, "wg", w->wg, FF, C));
    kiln_node up = kiln_matmul(g, h, weight(g, "wu", w->wu, FF, C));
    x = kiln_add(g, x, kiln_matmul(g, kiln_swiglu(g, gate, up), weight(g, "wd", w->wd, C, FF)));
    kiln_output(g, x, "y");
}

static int fail(const char *what, kiln_status s, const kiln_ctx *ctx)
{
    fprintf(stderr, "decode_layer: %s: %s: %s\n", what, kiln_status_str(s), ctx ? kiln_ctx_error(ctx) : "");
    return 1;
}

/* Runs STEPS decode steps, comparing each with the reference; returns the exit code. */
static int decode(kiln_ctx *ctx, kiln_plan *plan, const layer_w *w)
{
    static double kc[NKV * MAXCTX * HD], vc[NKV * MAXCTX * HD], ref[C];
    float x[C], y[C];
    int bad = 0;
    for (int t = 0; t < STEPS; t++) {
        fill(x, C, 1.0f, 0.0f);
        for (int i = 0; i < C; i++)
            y[i] = NAN; /* poison: a step that writes nothing must fail */
        int32_t pos = t;
        kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = t + 1},
                            {.name = "x", .data = x, .bytes = sizeof x}, {.name = "pos", .data = &pos, .bytes = 4},
                            {.name = "y", .data = y, .bytes = sizeof y}};
        kiln_status s = kiln_run(plan, b, sizeof b / sizeof b[0]);
        if (s != KILN_OK)
            return fail("run", s, ctx);
        ref_step(w, x, t, kc, vc, ref);
        double err = 0, mag = 0;
        for (int i = 0; i < C; i++) {
            double e = fabs((double)y[i] - ref[i]);
            err = isnan(e) || e > err ? (isnan(e) ? INFINITY : e) : err;
            mag = fmax(mag, fabs(ref[i]));
        }
        double rel = err / fmax(mag, 1e-30);
        printf("step %2d  n_kv %2d  max |err| %.3e  (%.3e of max |y| %.3f)%s\n", t, t + 1, err, rel, mag,
               rel > 1e-4 ? "  FAIL" : "");
        bad |= !(rel <= 1e-4);
    }
    return bad;
}

int main(int argc, char **argv)
{
    layer_w *w = malloc(sizeof *w);
    if (!w)
        return 1;
    const float sc = 1.0f / sqrtf(C), sa = 1.0f / sqrtf(NH * HD), sf = 1.0f / sqrtf(FF);
    fill(w->wq, NH * HD * C, sc, 0);
    fill(w->wk, NKV * HD * C, sc, 0);
    fill(w->wv, NKV * HD * C, sc, 0);
    fill(w->wo, C * NH * HD, sa, 0);
    fill(w->wg, FF * C, sc, 0);
    fill(w->wu, FF * C, sc, 0);
    fill(w->wd, C * FF, sf, 0);
    fill(w->n1, C, 0.125f, 1.0f); /* norm weights near 1 */
    fill(w->n2, C, 0.125f, 1.0f);

    kiln_ctx *ctx = NULL;
    kiln_graph *g = NULL;
    kiln_plan *plan = NULL;
    kiln_compile_options opts = {.backend = argc > 1 ? argv[1] : "auto"};
    kiln_status s;
    int rc = 1;
    if ((s = kiln_ctx_new(NULL, &ctx)) != KILN_OK) {
        rc = fail("context", s, ctx);
    } else if ((s = kiln_graph_new(&g)) != KILN_OK) {
        rc = fail("graph", s, ctx);
    } else if (build(g, w), (s = kiln_graph_status(g)) != KILN_OK) {
        fprintf(stderr, "decode_layer: build: %s: %s\n", kiln_status_str(s), kiln_graph_error(g));
    } else if ((s = kiln_compile(ctx, g, &opts, &plan)) != KILN_OK) {
        rc = fail("compile", s, ctx);
    } else {
        printf("decode_layer: backend %s, %d kernels\n", kiln_plan_backend(plan), kiln_plan_kernel_count(plan));
        rc = decode(ctx, plan, w);
        printf("decode_layer: %s\n", rc ? "FAILED" : "ok");
    }
    kiln_plan_free(plan);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    free(w);
    return rc;
}
