/* Hostile inputs found by fuzzing (issue #17), each kept as the reproduction that once crashed,
 * hung or answered wrongly: a node pinned to an absent backend, reshape/view and op-result dim
 * products that overflow. Every case must end in a clear error naming what is wrong, or in the
 * right answer; none may abort. Cache and GGUF cases live beside their modules' tests
 * (test_cache.c, test_gguf.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "support/testutil.h"

static kiln_graph *graph(void)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    return g;
}

/* ------------------------------------------------------------------ pins */

/* A node pinned to cuda, with libcuda made unloadable: compile on ref, cpu and auto must name the
 * node and say why cuda is absent (it once called the cuda backend with a NULL state). */
Test(hostile, pin_to_absent_backend_is_named)
{
    setenv("KILN_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info bi;
        cr_assert_eq(kiln_backend_get(ctx, i, &bi), KILN_OK);
        if (!strcmp(bi.name, "cuda")) cr_assert(!bi.available, "cuda must be absent with KILN_LIBCUDA pointing nowhere");
    }
    const char *backends[] = {"ref", "cpu", NULL};
    for (int i = 0; i < 3; i++) {
        kiln_graph *g = graph();
        kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){8});
        kiln_node a = kiln_silu(g, x);
        kiln_name(g, a, "act");
        cr_assert_eq(kiln_pin(g, a, "cuda"), KILN_OK);
        kiln_output(g, kiln_softmax(g, a), "y");
        kiln_plan *p = NULL;
        kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = backends[i]}, &p);
        cr_expect_eq(s, KILN_ERR_UNSUPPORTED, "backend %s: %s", backends[i] ? backends[i] : "auto", kiln_status_str(s));
        cr_expect_null(p);
        const char *e = kiln_ctx_error(ctx);
        cr_expect(strstr(e, "'act'") && strstr(e, "pinned to backend 'cuda'") && strstr(e, "not available") &&
                      strstr(e, "/nonexistent/libcuda.so.1"),
                  "the error names the node, the backend and why: %s", e);
        kiln_graph_free(g);
    }
    /* what-if placement with a cuda profile given: the pin is honoured there. */
    kiln_device_profile prof;
    cr_assert_eq(kiln_ctx_profile(ctx, "cpu", &prof), KILN_OK);
    prof.h2d_bw = prof.d2h_bw = 2e10, prof.xfer_latency_s = 1e-5;
    cr_assert_eq(kiln_ctx_set_profile(ctx, "cuda", &prof), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph *g = graph();
    kiln_node a = kiln_silu(g, kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){8}));
    cr_assert_eq(kiln_pin(g, a, "cuda"), KILN_OK);
    kiln_output(g, a, "y");
    kiln_plan *p = NULL;
    cr_expect_eq(kiln_compile(ctx, g, &(kiln_compile_options){.what_if = true}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    if (p) {
        kiln_region_info r;
        kiln_plan_region(p, 0, &r);
        cr_expect_str_eq(r.backend, "cuda");
    }
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* ------------------------------------------------------------------ shape products */

/* 4323 * 2731 * 409891 * 7623851 = 2 * 2^64 + 1: a product that wraps int64 to exactly 1, so an
 * unchecked reshape of a one-element tensor (the fuzzer's three-line .kg) was accepted. */
static const char wrap_kg[] = "input x f32 [1]\n"
                              "y = reshape x [4323, 2731, 409891, 7623851]\n"
                              "output y y\n";

Test(hostile, reshape_whose_dim_product_wraps_is_refused)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g = NULL;
    kiln_status s = kiln_kg_parse(ctx, wrap_kg, "wrap.kg", &g);
    cr_expect_eq(s, KILN_ERR_PARSE, "%s", kiln_status_str(s));
    cr_expect(strstr(kiln_ctx_error(ctx), "wrap.kg:2") && strstr(kiln_ctx_error(ctx), "overflows"), "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    g = graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){1});
    cr_expect_eq(kiln_reshape(g, x, 4, (kiln_dim[]){4323, 2731, 409891, 7623851}), KILN_NODE_NONE);
    cr_expect_eq(kiln_graph_status(g), KILN_ERR_SHAPE);
    cr_expect(strstr(kiln_graph_error(g), "reshape") && strstr(kiln_graph_error(g), "overflows"), "%s", kiln_graph_error(g));
    kiln_graph_free(g);
    /* A product that does not wrap still has to match. */
    g = graph();
    x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){6, 4});
    cr_expect_neq(kiln_reshape(g, x, 3, (kiln_dim[]){2, 3, 4}), KILN_NODE_NONE, "%s", kiln_graph_error(g));
    cr_expect_eq(kiln_reshape(g, x, 2, (kiln_dim[]){5, 5}), KILN_NODE_NONE);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(hostile, view_whose_dim_product_wraps_is_refused)
{
    kiln_graph *g = graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){16});
    cr_expect_eq(kiln_view(g, x, 4, (kiln_dim[]){4323, 2731, 409891, 7623851}, 0), KILN_NODE_NONE);
    cr_expect_eq(kiln_graph_status(g), KILN_ERR_SHAPE);
    cr_expect(strstr(kiln_graph_error(g), "view") && strstr(kiln_graph_error(g), "overflows"), "%s", kiln_graph_error(g));
    kiln_graph_free(g);
    g = graph();
    x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){16});
    cr_expect_neq(kiln_view(g, x, 2, (kiln_dim[]){3, 4}, 4), KILN_NODE_NONE, "%s", kiln_graph_error(g));
    cr_expect_eq(kiln_view(g, x, 2, (kiln_dim[]){3, 4}, 5), KILN_NODE_NONE, "12 elements at 5 do not fit in 16");
    kiln_graph_free(g);
}

/* Op results multiply their operands' dims: x [2^30, 1] times a weight of 2^40 rows is 2^70
 * elements (each operand is legal). Refused at the builder, naming the size. */
Test(hostile, op_result_too_large_is_refused)
{
    kiln_graph *g = graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){(int64_t)1 << 30, 1});
    kiln_node w = kiln_weight_random(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){(int64_t)1 << 40, 1}, 1, 1.0f);
    cr_assert_neq(w, KILN_NODE_NONE, "%s", kiln_graph_error(g));
    cr_expect_eq(kiln_matmul(g, x, w), KILN_NODE_NONE);
    cr_expect_eq(kiln_graph_status(g), KILN_ERR_SHAPE);
    cr_expect(strstr(kiln_graph_error(g), "matmul") && strstr(kiln_graph_error(g), "2^50 bytes"), "%s", kiln_graph_error(g));
    kiln_graph_free(g);
}
