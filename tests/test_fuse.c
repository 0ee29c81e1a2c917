/* Fusion: each rule on its own graph (kernel counts and fused == unfused), a llama decode layer in
 * at most 6 kernels, and 1,000 random DAGs from all ops where fused == unfused on the backend
 * under test (cpu when present). Tolerances: 4x the largest contract tolerance of the ops used
 * (both results are within their contracts of the f64 value, so they are within 4x of each other). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuse/fuse.h"
#include "kiln/kiln.h"
#include "model/presets.h"
#include "support/testutil.h"

static kiln_ctx *g_ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &g_ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(g_ctx); }

static const char *fuse_backend(void)
{
    const char *b = getenv("KILN_TEST_BACKEND");
    if (b && *b) return b;
    kiln_backend_info bi;
    for (int i = 0; i < kiln_backend_count(g_ctx); i++)
        if (kiln_backend_get(g_ctx, i, &bi) == KILN_OK && !strcmp(bi.name, "cpu") && bi.available) return "cpu";
    return "ref";
}

/* Inputs of a graph: names, with what to fill them with. */
typedef struct feed {
    const char *name;  /* input or symbol */
    int64_t     value; /* symbol value; for i32 inputs: values drawn in [lo, value) */
    int64_t     lo;    /* i32 inputs: lowest value drawn */
    bool        ints;  /* i32 input */
    kiln_dtype  t;     /* input dtype */
    int64_t     n;     /* elements (after symbols) */
    bool        seq;   /* i32 inputs: lo, lo + 1, ... instead of random (distinct cache positions) */
} feed;

/* Runs g fused and unfused with the same fresh inputs and states; compares every output. */
static void fused_vs_unfused(kiln_graph *g, const feed *f, int nf, double tol, int *kernels_fused, int *kernels_unfused)
{
    kiln_plan *p[2];
    for (int k = 0; k < 2; k++) {
        kiln_compile_options o = {.backend = fuse_backend(), .no_fuse = k == 1};
        cr_assert_eq(kiln_compile(g_ctx, g, &o, &p[k]), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    }
    if (kernels_fused) *kernels_fused = kiln_plan_kernel_count(p[0]);
    if (kernels_unfused) *kernels_unfused = kiln_plan_kernel_count(p[1]);
    kiln_binding b[16];
    void *bufs[16] = {0};
    for (int i = 0; i < nf; i++) {
        b[i] = (kiln_binding){.name = f[i].name, .value = f[i].value};
        if (!f[i].n) continue;
        float *tmp = malloc(f[i].n * sizeof(float));
        if (f[i].ints) {
            int32_t *v = malloc(f[i].n * 4);
            for (int64_t j = 0; j < f[i].n; j++) v[j] = (int32_t)(f[i].seq ? f[i].lo + j : tu_randint(f[i].lo, f[i].value));
            bufs[i] = v;
            b[i].bytes = f[i].n * 4;
        } else {
            tu_fill(tmp, f[i].n, -1, 1);
            bufs[i] = tu_to_dtype(f[i].t, tmp, f[i].n, &b[i].bytes);
        }
        free(tmp);
        b[i].data = bufs[i];
    }
    /* Run twice so states written by the first run are read by the second. */
    for (int rep = 0; rep < 2; rep++)
        for (int k = 0; k < 2; k++)
            cr_assert_eq(kiln_run(p[k], b, nf), KILN_OK, "%s run: %s", k ? "unfused" : "fused", kiln_ctx_error(g_ctx));
    char outname[16];
    for (int o = 0;; o++) {
        snprintf(outname, sizeof outname, "out%d", o);
        kiln_tensor_info ti;
        if (kiln_plan_tensor(p[0], outname, &ti) != KILN_OK) break;
        void *y[2];
        double *v[2];
        int64_t n = 1;
        for (int d = 0; d < ti.rank; d++) n *= ti.dims[d];
        for (int k = 0; k < 2; k++) {
            y[k] = malloc(ti.bytes);
            v[k] = malloc(n * sizeof(double));
            tu_poison(y[k], ti.bytes);
            cr_assert_eq(kiln_plan_read(p[k], outname, y[k], ti.bytes), KILN_OK);
            tu_to_f64(ti.t, y[k], n, v[k]);
        }
        tu_compare_t(outname, ti.t, v[0], v[1], n, ti.t == KILN_DTYPE_I32 ? 0 : tol);
        for (int k = 0; k < 2; k++) free(y[k]), free(v[k]);
    }
    for (int i = 0; i < nf; i++) free(bufs[i]);
    kiln_plan_free(p[0]);
    kiln_plan_free(p[1]);
}

static kiln_graph *gnew(void)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    return g;
}

TestSuite(fuse, .init = setup, .fini = teardown);

Test(fuse, rule1_elementwise_chain_is_one_kernel)
{
    kiln_graph *g = gnew();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){3, 17});
    kiln_node b = kiln_input(g, "b", KILN_DTYPE_F32, 1, (kiln_dim[]){17});
    kiln_node y = kiln_gelu(g, kiln_scale(g, kiln_add(g, kiln_silu(g, x), b), 0.5f));
    kiln_output(g, y, "out0");
    int kf, ku;
    fused_vs_unfused(g, (feed[]){{"x", .t = KILN_DTYPE_F32, .n = 51}, {"b", .t = KILN_DTYPE_F32, .n = 17}}, 2,
                     4 * tu_tol("gelu", KILN_DTYPE_F32), &kf, &ku);
    cr_assert_eq(kf, 1);
    cr_assert_eq(ku, 4);
    kiln_graph_free(g);
}

Test(fuse, rule2_3_4_norm_siblings_swiglu_residual)
{
    kiln_graph *g = gnew();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 64});
    kiln_node nw = tu_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){64}, 0.5f, 1.5f);
    kiln_node h = kiln_rms_norm(g, x, nw, 1e-5f);
    kiln_node gt = kiln_matmul(g, h, tu_weight(g, "wg", KILN_DTYPE_F16, 2, (kiln_dim[]){96, 64}, -0.2f, 0.2f));
    kiln_node up = kiln_matmul(g, h, tu_weight(g, "wu", KILN_DTYPE_F16, 2, (kiln_dim[]){96, 64}, -0.2f, 0.2f));
    kiln_node s = kiln_swiglu(g, gt, up);
    kiln_node d = kiln_matmul(g, s, tu_weight(g, "wd", KILN_DTYPE_F16, 2, (kiln_dim[]){64, 96}, -0.2f, 0.2f));
    kiln_output(g, kiln_add(g, x, d), "out0");
    int kf, ku;
    fused_vs_unfused(g, (feed[]){{"x", .t = KILN_DTYPE_F32, .n = 128}}, 1, 4 * tu_tol("matmul", KILN_DTYPE_F16), &kf, &ku);
    cr_assert_eq(kf, 2, "norm+gate+up+swiglu, then down+residual: got %d", kf);
    cr_assert_eq(ku, 6);
    kiln_graph_free(g);
}

/* Rule 6: after an all_reduce (a split plan's row-parallel output), the bias and residual adds and
 * the next rms_norm are one row kernel (add x2 + rms_norm, the residual sum and the norm stored),
 * the next matmul reading the norm; fused == unfused, on the host backend under test and, where
 * present, on vulkan (the GPU lowering of the row kernel with its add prologue). */
Test(fuse, rule6_adds_and_norm_after_all_reduce_are_one_kernel)
{
    kiln_graph *g = gnew();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){3, 64});
    kiln_node part = kiln_input(g, "part", KILN_DTYPE_F32, 2, (kiln_dim[]){3, 64});
    kiln_node bias = tu_weight(g, "bias", KILN_DTYPE_F32, 1, (kiln_dim[]){64}, -0.5f, 0.5f);
    kiln_node h = kiln_add(g, x, kiln_add(g, kiln_all_reduce(g, part), bias));
    kiln_node n = kiln_rms_norm(g, h, tu_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){64}, 0.5f, 1.5f), 1e-5f);
    kiln_output(g, kiln_matmul(g, n, tu_weight(g, "wq", KILN_DTYPE_F16, 2, (kiln_dim[]){48, 64}, -0.2f, 0.2f)), "out0");
    kiln_output(g, h, "out1");
    feed f[] = {{"x", .t = KILN_DTYPE_F32, .n = 192}, {"part", .t = KILN_DTYPE_F32, .n = 192}};
    double tol = 4 * tu_tol("matmul", KILN_DTYPE_F16) + 4 * tu_tol("rms_norm", KILN_DTYPE_F32);
    int kf, ku;
    fused_vs_unfused(g, f, 2, tol, &kf, &ku);
    cr_assert_eq(kf, 3, "all_reduce, then add x2 + rms_norm, then the matmul: got %d", kf);
    cr_assert_eq(ku, 5);
    const char *bes[] = {fuse_backend(), "vulkan"};
    for (int k = 0; k < 2; k++) {
        kiln_backend_info bi;
        bool present = false;
        for (int i = 0; i < kiln_backend_count(g_ctx); i++)
            present |= kiln_backend_get(g_ctx, i, &bi) == KILN_OK && !strcmp(bi.name, bes[k]) && bi.available;
        if (!present) continue;
        kiln_plan *p = NULL;
        cr_assert_eq(kiln_compile(g_ctx, g, &(kiln_compile_options){.backend = bes[k]}, &p), KILN_OK, "%s", kiln_ctx_error(g_ctx));
        kiln_region_info ri;
        cr_assert_eq(kiln_plan_region(p, 1, &ri), KILN_OK);
        cr_expect_str_eq(ri.kind, "rows", "%s: region 1 is %s (%s)", bes[k], ri.kind, ri.ops);
        cr_expect(strstr(ri.ops, "add") && strstr(ri.ops, "rms_norm"), "%s: %s", bes[k], ri.ops);
        cr_assert_eq(kiln_plan_region(p, 2, &ri), KILN_OK);
        cr_expect(!strstr(ri.ops, "rms_norm"), "%s: the matmul reads the stored norm: %s", bes[k], ri.ops);
        kiln_plan_free(p);
        if (k == 1) { /* vulkan against the host backend, fused both */
            setenv("KILN_TEST_BACKEND", "vulkan", 1);
            fused_vs_unfused(g, f, 2, tol, &kf, &ku);
            unsetenv("KILN_TEST_BACKEND");
        }
    }
    kiln_graph_free(g);
}

/* Rule 1 on a norm's row kernel: gemma's post-norm of a matmul output and the residual add after it
 * are one row kernel (the norm is not stored), the matmul before it stays alone; fused == unfused
 * on the host backend under test and on vulkan where present (the GPU row kernel's epilogue); a
 * norm that something else reads too keeps its own kernel. */
Test(fuse, rule1_post_norm_and_residual_add_are_one_row_kernel)
{
    kiln_graph *g = gnew();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){3, 64});
    kiln_node y = kiln_matmul(g, x, tu_weight(g, "wo", KILN_DTYPE_F16, 2, (kiln_dim[]){64, 64}, -0.2f, 0.2f));
    kiln_node n = kiln_rms_norm(g, y, tu_weight(g, "pn", KILN_DTYPE_F32, 1, (kiln_dim[]){64}, 0.5f, 1.5f), 1e-6f);
    kiln_output(g, kiln_add(g, x, n), "out0");
    feed f[] = {{"x", .t = KILN_DTYPE_F32, .n = 192}};
    double tol = 4 * tu_tol("matmul", KILN_DTYPE_F16) + 4 * tu_tol("rms_norm", KILN_DTYPE_F32);
    const char *bes[] = {fuse_backend(), "vulkan"};
    for (int k = 0; k < 2; k++) {
        kiln_backend_info bi;
        bool present = false;
        for (int i = 0; i < kiln_backend_count(g_ctx); i++)
            present |= kiln_backend_get(g_ctx, i, &bi) == KILN_OK && !strcmp(bi.name, bes[k]) && bi.available;
        if (!present) continue;
        if (k == 1) setenv("KILN_TEST_BACKEND", "vulkan", 1);
        int kf, ku;
        fused_vs_unfused(g, f, 1, tol, &kf, &ku);
        unsetenv("KILN_TEST_BACKEND");
        cr_assert_eq(kf, 2, "%s: the matmul, then rms_norm + add: got %d", bes[k], kf);
        cr_assert_eq(ku, 3);
        kiln_plan *p = NULL;
        cr_assert_eq(kiln_compile(g_ctx, g, &(kiln_compile_options){.backend = bes[k]}, &p), KILN_OK, "%s", kiln_ctx_error(g_ctx));
        kiln_region_info ri;
        cr_assert_eq(kiln_plan_region(p, 1, &ri), KILN_OK);
        cr_expect_str_eq(ri.kind, "rows", "%s: region 1 is %s (%s)", bes[k], ri.kind, ri.ops);
        cr_expect(strstr(ri.ops, "rms_norm") && strstr(ri.ops, "add"), "%s: %s", bes[k], ri.ops);
        kiln_plan_free(p);
    }
    kiln_graph_free(g);
    g = gnew(); /* the norm also an output: the add cannot take it over */
    x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){3, 64});
    n = kiln_rms_norm(g, x, KILN_NODE_NONE, 1e-6f);
    kiln_output(g, kiln_add(g, x, n), "out0");
    kiln_output(g, n, "out1");
    int kf;
    fused_vs_unfused(g, f, 1, tol, &kf, NULL);
    cr_assert_eq(kf, 2, "got %d", kf);
    kiln_graph_free(g);
}

/* fused_vs_unfused on the test's backend and on vulkan (lavapipe in CI: the GPU lowering); the
 * fused kernel count must be `want` on each. */
static void fused_vs_unfused_gpu_too(kiln_graph *g, const feed *f, int nf, double tol, int want, int want_unfused)
{
    const char *bes[] = {fuse_backend(), "vulkan"};
    for (int b = 0; b < 2; b++) {
        if (b == 1 && (!tu_backend_present(g_ctx, "vulkan") || !strcmp(bes[0], "vulkan"))) continue;
        if (b == 1) setenv("KILN_TEST_BACKEND", "vulkan", 1);
        int kf, ku;
        fused_vs_unfused(g, f, nf, tol, &kf, &ku);
        if (b == 1) unsetenv("KILN_TEST_BACKEND");
        cr_assert_eq(kf, want, "%s: %d kernels fused, want %d", bes[b], kf, want);
        cr_assert_eq(ku, want_unfused, "%s: %d kernels unfused", bes[b], ku);
    }
}

/* Rule 7 (qwen3's and gemma3's per-head q/k norms): rms_norm over each head, its rope and the
 * kv_scatter of the roped k are one row kernel. Prefill rows at distinct cache positions, every
 * rope pairing (neox, normal, partial of each), f32 and f16 caches; the roped q and the whole cache
 * compared with the unfused plan. */
Test(fuse, rule7_head_norm_rope_and_kv_write_are_one_row_kernel)
{
    const struct { kiln_rope_mode mode; int64_t rot; kiln_dtype kv; } cases[] = {
        {KILN_ROPE_NEOX, 16, KILN_DTYPE_F32}, {KILN_ROPE_NORMAL, 16, KILN_DTYPE_F16},
        {KILN_ROPE_NEOX, 8, KILN_DTYPE_F16},  {KILN_ROPE_NORMAL, 10, KILN_DTYPE_F32}};
    for (int c = 0; c < 4; c++) {
        kiln_graph *g = gnew();
        kiln_dim t = kiln_sym(g, "n_tok", 8);
        kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){t});
        kiln_node xq = kiln_input(g, "xq", KILN_DTYPE_F32, 3, (kiln_dim[]){t, 3, 16});
        kiln_node xk = kiln_input(g, "xk", KILN_DTYPE_F32, 3, (kiln_dim[]){t, 2, 16});
        kiln_node kc = kiln_state(g, "kc", cases[c].kv, 3, (kiln_dim[]){2, 32, 16});
        const float mult[8] = {1.0f, 0.5f, 0.25f, 2.0f, 1.5f, 1.0f, 0.75f, 3.0f};
        kiln_node q = kiln_rms_norm(g, xq, tu_weight(g, "qn", KILN_DTYPE_F32, 1, (kiln_dim[]){16}, 0.5f, 1.5f), 1e-6f);
        kiln_node k = kiln_rms_norm(g, xk, tu_weight(g, "kn", KILN_DTYPE_F32, 1, (kiln_dim[]){16}, 0.5f, 1.5f), 1e-6f);
        kiln_output(g, kiln_rope_partial(g, q, pos, cases[c].mode, 10000.0f, mult, cases[c].rot), "out0");
        kiln_node kr = kiln_rope_partial(g, k, pos, cases[c].mode, 1e6f, NULL, cases[c].rot);
        kiln_output(g, kiln_kv_scatter(g, kc, kr, pos), "out1");
        cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
        double tol = 4 * tu_tol("rms_norm", KILN_DTYPE_F32) + 4 * tu_tol("rope", KILN_DTYPE_F32) +
                     (cases[c].kv == KILN_DTYPE_F16 ? 4 * tu_tol("rope", KILN_DTYPE_F16) : 0);
        for (int64_t n = 1; n <= 7; n += 6) { /* a decode row, then 7 prefill rows at 20.. */
            feed f[] = {{"n_tok", .value = n}, {"pos", .ints = true, .seq = true, .lo = n == 1 ? 31 : 20, .value = 32, .n = n},
                        {"xq", .t = KILN_DTYPE_F32, .n = n * 48}, {"xk", .t = KILN_DTYPE_F32, .n = n * 32}};
            fused_vs_unfused_gpu_too(g, f, 4, tol, 2, 5);
        }
        kiln_plan *p;
        cr_assert_eq(kiln_compile(g_ctx, g, &(kiln_compile_options){.backend = fuse_backend()}, &p), KILN_OK);
        kiln_region_info ri;
        int writes = 0; /* the plan may order the two kernels either way */
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(kiln_plan_region(p, r, &ri), KILN_OK);
            cr_expect_str_eq(ri.kind, "rows", "%s", ri.ops);
            cr_expect(strstr(ri.ops, "rms_norm") && strstr(ri.ops, "rope"), "case %d region %d: %s", c, r, ri.ops);
            writes += strstr(ri.ops, "kv_scatter") != NULL;
        }
        cr_expect_eq(writes, 1, "case %d: the cache write is in neither row kernel", c);
        kiln_plan_free(p);
        kiln_graph_free(g);
    }
}

/* Rule 1 on a lookup (gemma's embedding scale): get_rows and the scale after it are one kernel, for
 * a block-format and a plain table; the scaled rows feed a norm and an output as in a model. */
Test(fuse, rule1_embedding_scale_is_the_lookups_epilogue)
{
    kiln_dtype types[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_F16};
    for (int t = 0; t < 2; t++) {
        kiln_graph *g = gnew();
        kiln_node ids = kiln_input(g, "ids", KILN_DTYPE_I32, 1, (kiln_dim[]){5});
        kiln_node e = kiln_get_rows(g, tu_weight(g, "emb", types[t], 2, (kiln_dim[]){12, 64}, -1.0f, 1.0f), ids);
        e = kiln_scale(g, e, 8.0f);
        kiln_output(g, e, "out0");
        kiln_output(g, kiln_rms_norm(g, e, KILN_NODE_NONE, 1e-6f), "out1");
        cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
        feed f[] = {{"ids", .ints = true, .lo = 0, .value = 12, .n = 5}};
        fused_vs_unfused_gpu_too(g, f, 1, 4 * tu_tol("rms_norm", KILN_DTYPE_F32), 2, 3);
        kiln_graph_free(g);
    }
}

/* Rule 7 inside a decode step as qwen3 builds it: q/k/v from one matmul kernel, each head norm with
 * its rope (and k's cache write) one row kernel, attention reads both: 4 kernels, fused == unfused. */
Test(fuse, rule7_qwen3_attention_is_four_kernels)
{
    kiln_graph *g = gnew();
    kiln_dim n_kv = kiln_sym(g, "n_kv", 16);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){1, 64});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){1});
    kiln_node kc = kiln_state(g, "kc", KILN_DTYPE_F16, 3, (kiln_dim[]){2, 16, 32});
    kiln_node vc = kiln_state(g, "vc", KILN_DTYPE_F16, 3, (kiln_dim[]){2, 16, 32});
    kiln_node h = kiln_rms_norm(g, x, tu_weight(g, "n1", KILN_DTYPE_F32, 1, (kiln_dim[]){64}, 0.8f, 1.2f), 1e-6f);
    kiln_node q = kiln_matmul(g, h, tu_weight(g, "wq", KILN_DTYPE_Q8_0, 2, (kiln_dim[]){128, 64}, -0.2f, 0.2f));
    kiln_node k = kiln_matmul(g, h, tu_weight(g, "wk", KILN_DTYPE_Q8_0, 2, (kiln_dim[]){64, 64}, -0.2f, 0.2f));
    kiln_node v = kiln_matmul(g, h, tu_weight(g, "wv", KILN_DTYPE_Q8_0, 2, (kiln_dim[]){64, 64}, -0.2f, 0.2f));
    q = kiln_rms_norm(g, kiln_reshape(g, q, 3, (kiln_dim[]){1, 4, 32}),
                      tu_weight(g, "qn", KILN_DTYPE_F32, 1, (kiln_dim[]){32}, 0.5f, 1.5f), 1e-6f);
    k = kiln_rms_norm(g, kiln_reshape(g, k, 3, (kiln_dim[]){1, 2, 32}),
                      tu_weight(g, "kn", KILN_DTYPE_F32, 1, (kiln_dim[]){32}, 0.5f, 1.5f), 1e-6f);
    q = kiln_rope(g, q, pos, KILN_ROPE_NEOX, 1e6f);
    kiln_node ks = kiln_kv_scatter(g, kc, kiln_rope(g, k, pos, KILN_ROPE_NEOX, 1e6f), pos);
    kiln_node vs = kiln_kv_scatter(g, vc, kiln_reshape(g, v, 3, (kiln_dim[]){1, 2, 32}), pos);
    kiln_output(g, kiln_attention(g, q, ks, vs, n_kv, 0), "out0");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    double tol = 4 * tu_tol("matmul", KILN_DTYPE_Q8_0) + 4 * tu_tol("attention", KILN_DTYPE_F16);
    for (int64_t n = 1; n <= 3; n++) {
        feed f[] = {{"n_kv", .value = n}, {"x", .t = KILN_DTYPE_F32, .n = 64}, {"pos", .ints = true, .lo = n - 1, .value = n, .n = 1}};
        fused_vs_unfused_gpu_too(g, f, 3, tol, 4, 11);
    }
    kiln_graph_free(g);
}

Test(fuse, rule5_attention_written_as_ops_is_one_kernel)
{
    for (int variant = 0; variant < 2; variant++) {
        kiln_graph *g = gnew();
        kiln_dim t = kiln_sym(g, "t", 9);
        kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 2, (kiln_dim[]){t, 24});
        kiln_node k = kiln_input(g, "k", KILN_DTYPE_F32, 2, (kiln_dim[]){37, 24});
        kiln_node s = kiln_matmul(g, q, k);
        kiln_node v, p;
        if (variant == 0) { /* scale + mask, v as rows through a transpose */
            kiln_node mask = kiln_input(g, "mask", KILN_DTYPE_F32, 2, (kiln_dim[]){t, 37});
            p = kiln_softmax(g, kiln_add(g, kiln_scale(g, s, 0.2f), mask));
            v = kiln_transpose(g, kiln_input(g, "v", KILN_DTYPE_F32, 2, (kiln_dim[]){37, 16}), 0, 1);
        } else { /* plain, v given as [d, S] */
            p = kiln_softmax(g, s);
            v = kiln_input(g, "v", KILN_DTYPE_F32, 2, (kiln_dim[]){16, 37});
        }
        kiln_output(g, kiln_matmul(g, p, v), "out0");
        int kf, ku;
        feed f[] = {{"t", .value = 7}, {"q", .t = KILN_DTYPE_F32, .n = 7 * 24}, {"k", .t = KILN_DTYPE_F32, .n = 37 * 24},
                    {"v", .t = KILN_DTYPE_F32, .n = 37 * 16}, {"mask", .t = KILN_DTYPE_F32, .n = 7 * 37}};
        fused_vs_unfused(g, f, variant == 0 ? 5 : 4, 4 * tu_tol("attention", KILN_DTYPE_F32) + 4 * tu_tol("softmax", KILN_DTYPE_F32), &kf, &ku);
        cr_assert_eq(kf, 1, "variant %d: %d kernels", variant, kf);
        cr_assert_eq(ku, variant == 0 ? 6 : 3);
        kiln_plan *pl;
        cr_assert_eq(kiln_compile(g_ctx, g, NULL, &pl), KILN_OK);
        kiln_region_info ri;
        cr_assert_eq(kiln_plan_region(pl, 0, &ri), KILN_OK);
        cr_assert_str_eq(ri.kind, "attention");
        kiln_plan_free(pl);
        kiln_graph_free(g);
    }
}

/* A llama-style decode layer as kiln users write it. */
static kiln_graph *llama_layer(kiln_dtype wt, int64_t hidden, int64_t n_head, int64_t n_kv_head, int64_t ffn, int64_t ctx,
                               bool bias)
{
    kiln_graph *g = gnew();
    int64_t hd = hidden / n_head;
    kiln_dim n_kv = kiln_sym(g, "n_kv", ctx);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){1, hidden});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){1});
    kiln_node kc = kiln_state(g, "kc", KILN_DTYPE_F32, 3, (kiln_dim[]){n_kv_head, ctx, hd});
    kiln_node vc = kiln_state(g, "vc", KILN_DTYPE_F32, 3, (kiln_dim[]){n_kv_head, ctx, hd});
    float sc = 1.0f / sqrtf((float)hidden);
    kiln_node h = kiln_rms_norm(g, x, tu_weight(g, "n1", KILN_DTYPE_F32, 1, (kiln_dim[]){hidden}, 0.8f, 1.2f), 1e-5f);
    kiln_node q = kiln_matmul(g, h, tu_weight(g, "wq", wt, 2, (kiln_dim[]){hidden, hidden}, -sc, sc));
    kiln_node k = kiln_matmul(g, h, tu_weight(g, "wk", wt, 2, (kiln_dim[]){n_kv_head * hd, hidden}, -sc, sc));
    kiln_node v = kiln_matmul(g, h, tu_weight(g, "wv", wt, 2, (kiln_dim[]){n_kv_head * hd, hidden}, -sc, sc));
    if (bias) { /* qwen2: q/k/v biases */
        q = kiln_add(g, q, tu_weight(g, "bq", KILN_DTYPE_F32, 1, (kiln_dim[]){hidden}, -0.5f, 0.5f));
        k = kiln_add(g, k, tu_weight(g, "bk", KILN_DTYPE_F32, 1, (kiln_dim[]){n_kv_head * hd}, -0.5f, 0.5f));
        v = kiln_add(g, v, tu_weight(g, "bv", KILN_DTYPE_F32, 1, (kiln_dim[]){n_kv_head * hd}, -0.5f, 0.5f));
    }
    q = kiln_rope(g, kiln_reshape(g, q, 3, (kiln_dim[]){1, n_head, hd}), pos, KILN_ROPE_NEOX, 10000);
    k = kiln_rope(g, kiln_reshape(g, k, 3, (kiln_dim[]){1, n_kv_head, hd}), pos, KILN_ROPE_NEOX, 10000);
    kiln_node ks = kiln_kv_scatter(g, kc, k, pos);
    kiln_node vs = kiln_kv_scatter(g, vc, kiln_reshape(g, v, 3, (kiln_dim[]){1, n_kv_head, hd}), pos);
    kiln_node a = kiln_reshape(g, kiln_attention(g, q, ks, vs, n_kv, 0), 2, (kiln_dim[]){1, hidden});
    kiln_node o = kiln_matmul(g, a, tu_weight(g, "wo", wt, 2, (kiln_dim[]){hidden, hidden}, -sc, sc));
    kiln_node x2 = kiln_add(g, x, o);
    kiln_node h2 = kiln_rms_norm(g, x2, tu_weight(g, "n2", KILN_DTYPE_F32, 1, (kiln_dim[]){hidden}, 0.8f, 1.2f), 1e-5f);
    kiln_node gt = kiln_matmul(g, h2, tu_weight(g, "wg", wt, 2, (kiln_dim[]){ffn, hidden}, -sc, sc));
    kiln_node up = kiln_matmul(g, h2, tu_weight(g, "wu", wt, 2, (kiln_dim[]){ffn, hidden}, -sc, sc));
    float sd = 1.0f / sqrtf((float)ffn);
    kiln_node d = kiln_matmul(g, kiln_swiglu(g, gt, up), tu_weight(g, "wd", wt, 2, (kiln_dim[]){hidden, ffn}, -sd, sd));
    kiln_output(g, kiln_add(g, x2, d), "out0");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    return g;
}

Test(fuse, decode_layer_at_most_6_kernels_and_matches_unfused)
{
    kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
    for (int t = 0; t < 3; t++) {
        kiln_graph *g = llama_layer(types[t], 256, 4, 2, 512, 16, false);
        int kf, ku;
        for (int64_t n = 1; n <= 3; n++) {
            feed f[] = {{"n_kv", .value = n}, {"x", .t = KILN_DTYPE_F32, .n = 256}, {"pos", .ints = true, .lo = n - 1, .value = n, .n = 1}};
            /* pos must be n - 1: attention's query position (another is a KILN_ERR_BINDING). */
            fused_vs_unfused(g, f, 3, 4 * tu_tol("matmul", types[t]) + 4 * tu_tol("attention", KILN_DTYPE_F32), &kf, &ku);
        }
        cr_assert_leq(kf, 6, "%s layer: %d kernels", kiln_dtype_name(types[t]), kf);
        cr_assert_geq(ku, 15);
        kiln_graph_free(g);
    }
}

/* qwen2's q/k/v biases fuse as matmul epilogues ahead of rope and the KV write: the biased layer
 * has as many kernels as the unbiased one, and matches the unfused plan (decode and prefill rows). */
Test(fuse, qkv_bias_adds_are_matmul_epilogues)
{
    kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_Q8_0};
    for (int t = 0; t < 2; t++) {
        kiln_graph *plain = llama_layer(types[t], 256, 4, 2, 512, 16, false);
        kiln_graph *g = llama_layer(types[t], 256, 4, 2, 512, 16, true);
        kiln_plan *p0, *p1;
        cr_assert_eq(kiln_compile(g_ctx, plain, &(kiln_compile_options){.backend = fuse_backend()}, &p0), KILN_OK);
        cr_assert_eq(kiln_compile(g_ctx, g, &(kiln_compile_options){.backend = fuse_backend()}, &p1), KILN_OK);
        int want = kiln_plan_kernel_count(p0), got = kiln_plan_kernel_count(p1);
        cr_assert_eq(got, want, "%s: biased layer %d kernels, unbiased %d", kiln_dtype_name(types[t]), got, want);
        cr_assert_leq(got, 5);
        kiln_region_info ri;
        cr_assert_eq(kiln_plan_region(p1, 0, &ri), KILN_OK);
        cr_assert(strstr(ri.ops, "add x3") && strstr(ri.ops, "rope x2") && strstr(ri.ops, "kv_scatter x2"),
                  "first kernel: %s", ri.ops);
        kiln_plan_free(p0);
        kiln_plan_free(p1);
        for (int64_t n = 1; n <= 3; n++) {
            feed f[] = {{"n_kv", .value = n}, {"x", .t = KILN_DTYPE_F32, .n = 256}, {"pos", .ints = true, .lo = n - 1, .value = n, .n = 1}};
            fused_vs_unfused(g, f, 3, 4 * tu_tol("matmul", types[t]) + 4 * tu_tol("attention", KILN_DTYPE_F32), NULL, NULL);
        }
        kiln_graph_free(plain);
        kiln_graph_free(g);
    }
}

/* ------------------------------------------------------------------ random DAGs */

typedef struct rnode {
    kiln_node h;       /* handle */
    int64_t   rows, d; /* shape [rows, d] (rows may be the symbol) */
    bool      sym;     /* rows is the symbol t */
} rnode;

static double g_tol;
/* i32 inputs the random ops created: positions (one per token) and ids (3). */
static struct { char name[16]; bool is_pos; int64_t n; /* 0: one per token */ } g_extra[24];
static int g_n_extra;

static const char *extra_input(bool is_pos, int64_t n)
{
    cr_assert_lt(g_n_extra, 24);
    g_extra[g_n_extra].n = n;
    snprintf(g_extra[g_n_extra].name, 16, "%s%d", is_pos ? "p" : "i", g_n_extra);
    g_extra[g_n_extra].is_pos = is_pos;
    return g_extra[g_n_extra++].name;
}
static void tol_of(const char *op, kiln_dtype t)
{
    double x = tu_tol(op, t);
    if (x > g_tol) g_tol = x;
}

/* Appends one random op reading earlier nodes; returns false when the pick does not apply. */
static bool random_op(kiln_graph *g, rnode *n, int *cnt, kiln_dim tsym, int *wid)
{
    rnode a = n[tu_randint(0, *cnt)];
    int64_t rows = a.sym ? tsym : a.rows;
    char name[32];
    snprintf(name, sizeof name, "w%d", (*wid)++);
    rnode r = a;
    switch (tu_randint(0, 15)) {
    case 0: case 1: { /* matmul with a random weight dtype */
        kiln_dtype ts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
        kiln_dtype t = ts[tu_randint(0, a.d % 256 == 0 ? 6 : a.d % 32 == 0 ? 4 : 3)];
        r.d = (int64_t[]){32, 64, 256}[tu_randint(0, 3)];
        float s = 1.0f / sqrtf((float)a.d);
        r.h = kiln_matmul(g, a.h, tu_weight(g, name, t, 2, (kiln_dim[]){r.d, a.d}, -s, s));
        tol_of("matmul", t);
        break;
    }
    case 2: { /* add/mul with a same-shape node or a bias */
        rnode b = n[tu_randint(0, *cnt)];
        bool same = b.d == a.d && b.sym == a.sym && b.rows == a.rows;
        kiln_node bh = same ? b.h : tu_weight(g, name, KILN_DTYPE_F32, 1, (kiln_dim[]){a.d}, -1, 1);
        r.h = tu_randint(0, 2) ? kiln_add(g, a.h, bh) : kiln_mul(g, a.h, bh);
        tol_of("add", KILN_DTYPE_F32), tol_of("mul", KILN_DTYPE_F32);
        break;
    }
    case 3: r.h = kiln_scale(g, a.h, 0.75f); tol_of("scale", KILN_DTYPE_F32); break;
    case 4: r.h = kiln_silu(g, a.h); tol_of("silu", KILN_DTYPE_F32); break;
    case 5: r.h = kiln_gelu(g, a.h); tol_of("gelu", KILN_DTYPE_F32); break;
    case 6: { /* swiglu with a same-shape node */
        rnode b = n[tu_randint(0, *cnt)];
        if (b.d != a.d || b.sym != a.sym || b.rows != a.rows) return false;
        r.h = kiln_swiglu(g, a.h, b.h);
        tol_of("swiglu", KILN_DTYPE_F32);
        break;
    }
    case 7:
        r.h = kiln_rms_norm(g, a.h, tu_randint(0, 2) ? tu_weight(g, name, KILN_DTYPE_F32, 1, (kiln_dim[]){a.d}, 0.5f, 1.5f)
                                                     : KILN_NODE_NONE, 1e-5f);
        tol_of("rms_norm", KILN_DTYPE_F32);
        break;
    case 8: r.h = kiln_layer_norm(g, a.h, KILN_NODE_NONE, KILN_NODE_NONE, 1e-5f); tol_of("layer_norm", KILN_DTYPE_F32); break;
    case 9: r.h = kiln_softmax(g, a.h); tol_of("softmax", KILN_DTYPE_F32); break;
    case 10: { /* rope over heads of 8 */
        if (a.d % 8) return false;
        if (g_n_extra >= 20) return false;
        kiln_node pos = kiln_input(g, extra_input(true, a.sym ? 0 : a.rows), KILN_DTYPE_I32, 1, (kiln_dim[]){rows});
        kiln_node x3 = kiln_reshape(g, a.h, 3, (kiln_dim[]){rows, a.d / 8, 8});
        r.h = kiln_reshape(g, kiln_rope(g, x3, pos, (kiln_rope_mode)tu_randint(0, 2), 10000), 2, (kiln_dim[]){rows, a.d});
        tol_of("rope", KILN_DTYPE_F32);
        break;
    }
    case 11: { /* f16 round trip */
        r.h = kiln_cast(g, kiln_cast(g, a.h, KILN_DTYPE_F16), KILN_DTYPE_F32);
        g_tol = fmax(g_tol, 1e-6); /* f16 rounding of both sides may differ by one ulp after upstream noise */
        break;
    }
    case 12: { /* concat with itself along the feature axis */
        if (a.d > 128) return false;
        r.h = kiln_concat(g, a.h, a.h, 1);
        r.d = 2 * a.d;
        break;
    }
    case 13: { /* transpose twice (materialized) */
        r.h = kiln_transpose(g, kiln_transpose(g, a.h, 0, 1), 0, 1);
        break;
    }
    default: { /* get_rows from a table, giving a constant-row node */
        if (g_n_extra >= 20) return false;
        kiln_node ids = kiln_input(g, extra_input(false, 3), KILN_DTYPE_I32, 1, (kiln_dim[]){3});
        snprintf(name, sizeof name, "t%d", (*wid)++);
        kiln_node tab = tu_weight(g, name, tu_randint(0, 2) ? KILN_DTYPE_F32 : KILN_DTYPE_Q8_0, 2, (kiln_dim[]){7, 32}, -1, 1);
        r = (rnode){.h = kiln_get_rows(g, tab, ids), .rows = 3, .d = 32};
        tol_of("get_rows", KILN_DTYPE_Q8_0);
        break;
    }
    }
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    n[(*cnt)++] = r;
    return true;
}

Test(fuse, random_dags_fused_equals_unfused, .timeout = 900)
{
    int total_fused = 0, total_unfused = 0;
    for (int dag = 0; dag < 1000; dag++) {
        kiln_graph *g = gnew();
        kiln_dim tsym = kiln_sym(g, "t", 4);
        rnode n[64];
        int cnt = 0, wid = 0;
        int64_t d0 = (int64_t[]){32, 64, 256}[tu_randint(0, 3)];
        n[cnt++] = (rnode){.h = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){tsym, d0}), .d = d0, .sym = true};
        g_tol = 0;
        g_n_extra = 0;
        for (int ops = (int)tu_randint(3, 14); ops > 0;) ops -= random_op(g, n, &cnt, tsym, &wid);
        int n_out = 0;
        char name[16];
        for (int i = cnt - 1; i > 0 && n_out < 3; i -= (int)tu_randint(1, 4)) {
            snprintf(name, sizeof name, "out%d", n_out++);
            kiln_output(g, n[i].h, name);
        }
        int64_t t = tu_randint(1, 5);
        feed f[24] = {{"t", .value = t}, {"x", .t = KILN_DTYPE_F32, .n = t * d0}};
        int nf = 2;
        for (int k = 0; k < g_n_extra && nf < 24; k++)
            f[nf++] = g_extra[k].is_pos ? (feed){g_extra[k].name, .ints = true, .value = 64, .n = g_extra[k].n ? g_extra[k].n : t}
                                        : (feed){g_extra[k].name, .ints = true, .value = 7, .n = 3};
        int kf, ku;
        fused_vs_unfused(g, f, nf, fmax(4 * g_tol, 1e-9), &kf, &ku);
        cr_assert_leq(kf, ku);
        total_fused += kf;
        total_unfused += ku;
        kiln_graph_free(g);
    }
    cr_log_info("1000 random DAGs: %d kernels fused vs %d unfused", total_fused, total_unfused);
    cr_assert_lt(total_fused, total_unfused, "fusion merged nothing in 1000 DAGs");
}

/* Each output's epilogue in a qwen2 layer's spec: q/k/v take their bias adds (right after the
 * matmul), q and k then a rope, k and v a KV-cache write (of the roped k); gate/up are a swiglu
 * pair stored at the swiglu; o and down store their residual add. */
static void check_epilogues(const kiln_graph *g, const kiln_region *reg)
{
    const kiln_region_spec *s = &reg->spec;
    for (uint32_t j = 0; j < s->n_mm; j++) {
        const kiln_spec_out *o = &s->out[j];
        cr_assert(kiln_region_has(reg, o->dst), "out %u's dst is in the region", j);
        if (s->n_mm == 3) {
            cr_assert(o->bias_add == o->dst && g->nodes[o->dst].op == KILN_OP_ADD && g->nodes[o->dst].src[0] == s->mm[j] &&
                      g->nodes[o->dst].src[1] == o->bias && g->nodes[o->bias].rank == 1, "q/k/v out %u: bias add", j);
            cr_assert_eq(o->resid, KILN_IDX_NONE);
            cr_assert_eq(o->rope != KILN_IDX_NONE, j < 2, "rope on q and k only (out %u)", j);
            cr_assert_eq(o->kv != KILN_IDX_NONE, j > 0, "KV writes of k and v only (out %u)", j);
            if (j == 1) cr_assert_eq(g->nodes[o->kv].src[1], o->rope, "the roped k is cached");
            if (j == 2) cr_assert_eq(g->nodes[o->kv].src[1] == o->dst || g->nodes[g->nodes[o->kv].src[1]].src[0] == o->dst, 1);
        } else if (s->n_mm == 2) {
            cr_assert(s->swiglu && (j == 1 || g->nodes[o->dst].op == KILN_OP_SWIGLU), "gate/up: swiglu pair");
            cr_assert(o->bias == KILN_IDX_NONE && o->resid == KILN_IDX_NONE && o->rope == KILN_IDX_NONE && o->kv == KILN_IDX_NONE);
        } else {
            cr_assert(!s->swiglu && o->bias == KILN_IDX_NONE && o->resid != KILN_IDX_NONE && o->resid_add == o->dst &&
                      g->nodes[o->dst].op == KILN_OP_ADD, "o/down: residual add stored");
        }
    }
}

/* Fusion hands every consumer the region's structure (fuse/spec.c): a qwen2 decode layer has one
 * q/k/v region (3 siblings behind the attention norm, reading x), one gate/up region (2 behind the
 * ffn norm), o and down alone, and its attention groups 14 query heads over 2 kv heads. */
Test(fuse, region_specs_of_a_decode_layer)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_preset_build(kiln_preset_find("qwen2-0.5b"), KILN_DTYPE_Q8_0, 1, 256, 1, &g), KILN_OK);
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    int by_n[KILN_SPEC_MM + 1] = {0}, norms = 0, attn = 0;
    uint32_t x = KILN_IDX_NONE;
    for (uint32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].name && !strcmp(g->nodes[i].name, "x")) x = i;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        const kiln_region *reg = &f.regions[r];
        const kiln_region_spec *s = &reg->spec;
        if (reg->kind == KILN_REGION_MATMUL) {
            cr_assert(!s->mm_mixed && s->n_mm >= 1 && s->n_mm <= KILN_SPEC_MM, "region %u: %u matmuls", r, s->n_mm);
            by_n[s->n_mm]++;
            for (uint32_t j = 0; j < s->n_mm; j++) {
                cr_assert(kiln_region_has(reg, s->mm[j]) && g->nodes[s->mm[j]].op == KILN_OP_MATMUL);
                cr_assert_eq(g->nodes[s->mm[j]].src[0], s->x_in, "siblings share x");
            }
            if (s->norm != KILN_IDX_NONE) {
                norms++;
                cr_assert(kiln_region_has(reg, s->norm) && g->nodes[s->norm].op == KILN_OP_RMS_NORM);
                cr_assert_eq(s->x, g->nodes[s->norm].src[0]);
                cr_assert_eq(s->norm_w, g->nodes[s->norm].src[1]);
                cr_assert_float_eq(s->eps, g->nodes[s->norm].f[0], 0);
            } else {
                cr_assert_eq(s->x, s->x_in);
            }
            if (s->n_mm == 3) cr_assert_eq(s->x, x, "q/k/v read the layer's input");
            check_epilogues(g, reg);
        } else if (reg->kind == KILN_REGION_ATTENTION) {
            attn++;
            cr_assert_eq(s->heads_per_group, 7);
            cr_assert_eq(g->nodes[s->q].op, KILN_OP_ROPE);
            cr_assert_eq(s->n_kv, g->nodes[reg->anchor].dim);
        } else {
            cr_assert_eq(s->n_mm, 0);
        }
    }
    cr_assert(by_n[3] == 1 && by_n[2] == 1 && by_n[1] == 2 && norms == 2 && attn == 1, "%d x3, %d x2, %d x1, %d norms, %d attention",
              by_n[3], by_n[2], by_n[1], norms, attn);
    kiln_fusion_free(&f);
    kiln_graph_free(g);
}
