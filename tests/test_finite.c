/* The NaN/Inf guard (kiln_compile_options.check_finite) on ref, cpu and vulkan (lavapipe in CI;
 * the cuda path is in test_cuda_backend against the stand-in driver): a NaN in a weight or an
 * input makes kiln_run return KILN_ERR_NONFINITE naming the first node that stores a non-finite
 * value, its region and its backend; the plan stays usable; with finite data the guarded plan
 * gives the same bits as an unguarded one, and without the guard the NaN runs through silently. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "support/testutil.h"

enum { D = 64, T = 3 };

/* y = matmul(silu(rms_norm(x, wn) . wq^T + x), wo): nodes named h, q, a, s, y. wo[bad_row, 3] is
 * NaN when bad_row >= 0. */
static kiln_graph *graph(int bad_row)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    float wn[D], wq[D * D], wo[D * D];
    tu_fill(wn, D, 0.5f, 1.5f);
    tu_fill(wq, D * D, -0.2f, 0.2f);
    tu_fill(wo, D * D, -0.2f, 0.2f);
    if (bad_row >= 0) wo[bad_row * D + 3] = NAN;
    kiln_dim xd[2] = {kiln_sym(g, "n_tok", 8), D};
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, xd);
    kiln_node h = kiln_rms_norm(g, x, kiln_weight(g, "wn", KILN_DTYPE_F32, 1, (kiln_dim[]){D}, wn, KILN_WEIGHT_COPY), 1e-5f);
    kiln_node q = kiln_matmul(g, h, kiln_weight(g, "wq", KILN_DTYPE_F32, 2, (kiln_dim[]){D, D}, wq, KILN_WEIGHT_COPY));
    kiln_node a = kiln_add(g, q, x);
    kiln_node s = kiln_silu(g, a);
    kiln_node y = kiln_matmul(g, s, kiln_weight(g, "wo", KILN_DTYPE_F32, 2, (kiln_dim[]){D, D}, wo, KILN_WEIGHT_COPY));
    kiln_name(g, h, "h");
    kiln_name(g, q, "q");
    kiln_name(g, a, "a");
    kiln_name(g, s, "s");
    kiln_name(g, y, "y");
    cr_assert_eq(kiln_output(g, y, "y"), KILN_OK, "%s", kiln_graph_error(g));
    return g;
}

static kiln_ctx *context(const char *backend)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info bi;
        if (kiln_backend_get(ctx, i, &bi) == KILN_OK && !strcmp(bi.name, backend) && !bi.available) {
            kiln_ctx_free(ctx);
            cr_skip("backend %s is absent: %s", backend, bi.detail);
        }
    }
    return ctx;
}

static kiln_plan *compile(kiln_ctx *ctx, const kiln_graph *g, const char *backend, bool guard, bool no_fuse)
{
    kiln_plan *p = NULL;
    kiln_compile_options o = {.backend = backend, .check_finite = guard, .no_fuse = no_fuse};
    cr_assert_eq(kiln_compile(ctx, g, &o, &p), KILN_OK, "%s: %s", backend, kiln_ctx_error(ctx));
    return p;
}

static kiln_status run(kiln_plan *p, const float *x, float *y)
{
    for (int i = 0; i < T * D; i++) y[i] = -12345.0f;
    kiln_binding b[] = {{.name = "n_tok", .value = T}, {.name = "x", .data = (void *)x, .bytes = sizeof(float) * T * D},
                        {.name = "y", .data = y, .bytes = sizeof(float) * T * D}};
    return kiln_run(p, b, 3);
}

/* The message names the node (op and name), the value, the region and the backend. */
static void expect_named(kiln_ctx *ctx, const char *node, const char *backend)
{
    const char *e = kiln_ctx_error(ctx);
    char want[64];
    snprintf(want, sizeof want, " on %s", backend);
    cr_assert(strstr(e, node) && strstr(e, "NaN at element") && strstr(e, "region ") && strstr(e, want),
              "expected %s on %s, got: %s", node, backend, e);
}

/* A NaN in the last matmul's weight: the first stored non-finite value is y's (every region
 * before it is finite), whatever the fusion. Without the guard the same run succeeds with NaN in
 * column 5 of y. The plan stays usable: an unguarded finite graph gives the same bits guarded. */
static void weight_nan(const char *backend, int modes)
{
    kiln_ctx *ctx = context(backend);
    kiln_graph *bad = graph(5), *good = graph(-1);
    float x[T * D], y[T * D], y2[T * D];
    tu_fill(x, T * D, -1, 1);
    for (int fuse = 0; fuse < 2; fuse++) {
        if (!(modes & (1 << fuse))) continue;
        kiln_plan *pg = compile(ctx, bad, backend, true, !fuse), *pu = compile(ctx, bad, backend, false, !fuse);
        cr_assert_eq(run(pg, x, y), KILN_ERR_NONFINITE, "%s: %s", backend, kiln_ctx_error(ctx));
        expect_named(ctx, "matmul 'y'", backend);
        cr_assert(strstr(kiln_ctx_error(ctx), "element 5 of f32 [3, 64]"), "%s", kiln_ctx_error(ctx));
        cr_assert_eq(kiln_status_str(KILN_ERR_NONFINITE)[0], 'n');
        cr_assert_eq(run(pu, x, y), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert(isnan(y[5]) && isnan(y[D + 5]) && isfinite(y[4]), "unguarded: y[5] = %g, y[4] = %g", y[5], y[4]);
        cr_assert_eq(run(pg, x, y), KILN_ERR_NONFINITE, "a second run fails the same way");
        kiln_plan_free(pg);
        kiln_plan_free(pu);
        pg = compile(ctx, good, backend, true, !fuse);
        pu = compile(ctx, good, backend, false, !fuse);
        cr_assert_eq(run(pg, x, y), KILN_OK, "%s: %s", backend, kiln_ctx_error(ctx));
        cr_assert_eq(run(pu, x, y2), KILN_OK, "%s: %s", backend, kiln_ctx_error(ctx));
        cr_assert(memcmp(y, y2, sizeof y) == 0, "the guard changed the result on %s", backend);
        for (int i = 0; i < T * D; i++) cr_assert(isfinite(y[i]));
        kiln_plan_free(pg);
        kiln_plan_free(pu);
    }
    kiln_graph_free(bad);
    kiln_graph_free(good);
    kiln_ctx_free(ctx);
}

/* A NaN in an input: unfused, the first node storing it is rms_norm 'h' (row 1: element D + k);
 * fused, a node of region 0. The next run with finite input succeeds on the same plan. */
static void input_nan(const char *backend, int modes)
{
    kiln_ctx *ctx = context(backend);
    kiln_graph *g = graph(-1);
    float x[T * D], y[T * D], y2[T * D];
    tu_fill(x, T * D, -1, 1);
    for (int fuse = 0; fuse < 2; fuse++) {
        if (!(modes & (1 << fuse))) continue;
        kiln_plan *p = compile(ctx, g, backend, true, !fuse);
        float keep = x[D + 7];
        x[D + 7] = NAN;
        cr_assert_eq(run(p, x, y), KILN_ERR_NONFINITE, "%s: %s", backend, kiln_ctx_error(ctx));
        if (!fuse) {
            expect_named(ctx, "rms_norm 'h'", backend);
            cr_assert(strstr(kiln_ctx_error(ctx), "at element 64 of") && strstr(kiln_ctx_error(ctx), "region 0 "), "%s",
                      kiln_ctx_error(ctx));
        } else {
            cr_assert(strstr(kiln_ctx_error(ctx), "region 0 ("), "%s", kiln_ctx_error(ctx));
        }
        x[D + 7] = keep;
        cr_assert_eq(run(p, x, y), KILN_OK, "%s: %s", backend, kiln_ctx_error(ctx));
        kiln_plan *pu = compile(ctx, g, backend, false, !fuse);
        cr_assert_eq(run(pu, x, y2), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert(memcmp(y, y2, sizeof y) == 0, "the guard changed the result on %s", backend);
        kiln_plan_free(pu);
        kiln_plan_free(p);
    }
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* An overflow to +inf (not a NaN) in an f16 cast is caught too, named as +inf. */
static void cast_inf(const char *backend)
{
    kiln_ctx *ctx = context(backend);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){D});
    kiln_node c = kiln_cast(g, kiln_scale(g, x, 1000.0f), KILN_DTYPE_F16);
    kiln_name(g, c, "c");
    cr_assert_eq(kiln_output(g, c, "c"), KILN_OK, "%s", kiln_graph_error(g));
    kiln_plan *p = compile(ctx, g, backend, true, true);
    float in[D];
    uint16_t out[D];
    tu_fill(in, D, -1, 1);
    in[9] = 70.0f; /* 70000 > 65504 */
    kiln_binding b[] = {{.name = "x", .data = in, .bytes = sizeof in}, {.name = "c", .data = out, .bytes = sizeof out}};
    cr_assert_eq(kiln_run(p, b, 2), KILN_ERR_NONFINITE, "%s: %s", backend, kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "cast 'c'") && strstr(kiln_ctx_error(ctx), "+inf at element 9 of f16 [64]"), "%s",
              kiln_ctx_error(ctx));
    in[9] = 0.5f;
    cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* A NaN row written into a KV cache by kv_scatter (host backends scan the rows written). */
static void scatter_nan(const char *backend)
{
    kiln_ctx *ctx = context(backend);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node st = kiln_state(g, "k", KILN_DTYPE_F16, 3, (kiln_dim[]){2, 16, 8});
    kiln_node rows = kiln_input(g, "rows", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 2, 8});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){1});
    kiln_node w = kiln_kv_scatter(g, st, rows, pos);
    kiln_name(g, w, "kw");
    cr_assert_eq(kiln_output(g, w, "kout"), KILN_OK, "%s", kiln_graph_error(g));
    kiln_plan *p = compile(ctx, g, backend, true, false);
    float r[16];
    tu_fill(r, 16, -1, 1);
    r[8 + 2] = NAN; /* kv head 1, element 2 */
    int32_t ps = 11;
    kiln_binding b[] = {{.name = "rows", .data = r, .bytes = sizeof r}, {.name = "pos", .data = &ps, .bytes = 4}};
    kiln_status s = kiln_run(p, b, 2);
    cr_assert_eq(s, KILN_ERR_NONFINITE, "%s: %s: %s", backend, kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "'kw'") && strstr(kiln_ctx_error(ctx), "cache row 11 of kv head 1"), "%s",
              kiln_ctx_error(ctx));
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* modes: 1 unfused, 2 fused (vulkan: one each, lavapipe compiles slowly) */
/* Odd lengths: the value sits in the tail the word-wide scan leaves to the element loop. */
Test(finite, tails_cpu)
{
    kiln_ctx *ctx = context("cpu");
    for (int n = 1; n <= 9; n++) {
        for (int t16 = 0; t16 < 2; t16++) {
            kiln_graph *g;
            cr_assert_eq(kiln_graph_new(&g), KILN_OK);
            kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){n});
            kiln_node y = kiln_scale(g, x, 3.0f);
            if (t16) y = kiln_cast(g, y, KILN_DTYPE_F16);
            kiln_name(g, y, "y");
            cr_assert_eq(kiln_output(g, y, "y"), KILN_OK, "%s", kiln_graph_error(g));
            kiln_plan *p = compile(ctx, g, "cpu", true, true);
            float in[9], out[9];
            tu_fill(in, 9, -1, 1);
            kiln_binding b[] = {{.name = "x", .data = in, .bytes = sizeof(float) * (size_t)n},
                                {.name = "y", .data = out, .bytes = sizeof out}};
            cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "n %d: %s", n, kiln_ctx_error(ctx));
            in[n - 1] = t16 ? 30000.0f : -INFINITY; /* f16: 90000 overflows */
            cr_assert_eq(kiln_run(p, b, 2), KILN_ERR_NONFINITE, "n %d f16 %d: %s", n, t16, kiln_ctx_error(ctx));
            char want[64];
            snprintf(want, sizeof want, "%s at element %d of %s [%d]", t16 ? "+inf" : "-inf", n - 1, t16 ? "f16" : "f32", n);
            cr_assert(strstr(kiln_ctx_error(ctx), want), "want '%s': %s", want, kiln_ctx_error(ctx));
            kiln_plan_free(p);
            kiln_graph_free(g);
        }
    }
    kiln_ctx_free(ctx);
}

Test(finite, weight_nan_ref) { weight_nan("ref", 3); }
Test(finite, weight_nan_cpu) { weight_nan("cpu", 3); }
Test(finite, weight_nan_vulkan) { weight_nan("vulkan", 2); }
Test(finite, input_nan_ref) { input_nan("ref", 3); }
Test(finite, input_nan_cpu) { input_nan("cpu", 3); }
Test(finite, input_nan_vulkan) { input_nan("vulkan", 1); }
Test(finite, cast_inf_cpu) { cast_inf("cpu"); }
Test(finite, cast_inf_vulkan) { cast_inf("vulkan"); }
Test(finite, scatter_nan_cpu) { scatter_nan("cpu"); }
Test(finite, scatter_nan_ref) { scatter_nan("ref"); }
