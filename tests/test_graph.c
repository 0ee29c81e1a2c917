/* Graph builder, hash and run-binding errors: every mistake returns the right status and a message
 * naming what is wrong, sticks to the graph, and leaves the context usable. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kiln/kiln.h"
#include "support/testutil.h"

static kiln_graph *new_graph(void)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    return g;
}

#define EXPECT_ERR(g, st, needle)                                                                              \
    do {                                                                                                       \
        cr_assert_eq(kiln_graph_status(g), (st), "status %s, want %s (%s)", kiln_status_str(kiln_graph_status(g)), \
                     kiln_status_str(st), kiln_graph_error(g));                                                \
        cr_assert(strstr(kiln_graph_error(g), (needle)), "message '%s' lacks '%s'", kiln_graph_error(g), (needle)); \
    } while (0)

Test(graph, matmul_shape_mismatch_names_op_and_dims)
{
    kiln_graph *g = new_graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){3, 64});
    kiln_node w = kiln_weight_random(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){8, 63}, 1, 0.1f);
    cr_assert_eq(kiln_matmul(g, x, w), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_SHAPE, "matmul");
    cr_assert(strstr(kiln_graph_error(g), "[3, 64]") && strstr(kiln_graph_error(g), "[8, 63]"));
    /* The error sticks: later builders return NONE and keep the first message. */
    cr_assert_eq(kiln_silu(g, x), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_SHAPE, "matmul");
    kiln_graph_free(g);
}

Test(graph, dtype_mismatch)
{
    kiln_graph *g = new_graph();
    kiln_node a = kiln_input(g, "a", KILN_DTYPE_F32, 1, (kiln_dim[]){8});
    kiln_node b = kiln_input(g, "b", KILN_DTYPE_F16, 1, (kiln_dim[]){8});
    cr_assert_eq(kiln_add(g, a, b), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_DTYPE, "f16");
    kiln_graph_free(g);
    g = new_graph();
    kiln_node i = kiln_input(g, "i", KILN_DTYPE_I32, 1, (kiln_dim[]){8});
    cr_assert_eq(kiln_softmax(g, i), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_DTYPE, "softmax");
    kiln_graph_free(g);
}

Test(graph, unknown_and_foreign_ids)
{
    kiln_graph *g = new_graph(), *h = new_graph();
    kiln_node a = kiln_input(g, "a", KILN_DTYPE_F32, 1, (kiln_dim[]){8});
    kiln_node b = kiln_input(h, "b", KILN_DTYPE_F32, 1, (kiln_dim[]){8});
    cr_assert_eq(kiln_add(g, a, b), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_NODE, "another graph");
    cr_assert_eq(kiln_graph_status(h), KILN_OK, "the other graph is untouched");
    kiln_graph_free(g);
    g = new_graph();
    a = kiln_input(g, "a", KILN_DTYPE_F32, 1, (kiln_dim[]){8});
    cr_assert_eq(kiln_silu(g, a + 7), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_NODE, "unknown node");
    kiln_graph_free(g);
    g = new_graph();
    cr_assert_eq(kiln_silu(g, KILN_NODE_NONE), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_NODE, "missing");
    kiln_graph_free(g);
    kiln_graph_free(h);
}

Test(graph, byte_size_overflow_and_rank)
{
    kiln_graph *g = new_graph();
    cr_assert_eq(kiln_input(g, "x", KILN_DTYPE_F32, 4, (kiln_dim[]){1 << 20, 1 << 20, 1 << 20, 1 << 20}), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_SHAPE, "overflow");
    kiln_graph_free(g);
    g = new_graph();
    cr_assert_eq(kiln_input(g, "x", KILN_DTYPE_F32, 5, (kiln_dim[]){1, 2, 3, 4, 5}), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_SHAPE, "rank 5");
    kiln_graph_free(g);
    g = new_graph();
    cr_assert_eq(kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){0, 2}), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_SHAPE, ">= 1");
    kiln_graph_free(g);
    g = new_graph();
    cr_assert_eq(kiln_weight_random(g, "w", KILN_DTYPE_Q4_K, 2, (kiln_dim[]){4, 100}, 1, 1), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_SHAPE, "block of 256");
    kiln_graph_free(g);
}

Test(graph, names)
{
    kiln_graph *g = new_graph();
    kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){4});
    cr_assert_eq(kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){4}), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_NAME, "'x'");
    kiln_graph_free(g);
    g = new_graph();
    cr_assert_eq(kiln_input(g, "bad name", KILN_DTYPE_F32, 1, (kiln_dim[]){4}), KILN_NODE_NONE);
    EXPECT_ERR(g, KILN_ERR_NAME, "bad name");
    kiln_graph_free(g);
}

Test(graph, symbols_bounds_checked)
{
    kiln_graph *g = new_graph();
    kiln_dim n = kiln_sym(g, "n", 16);
    cr_assert(n < 0);
    cr_assert_eq(kiln_sym(g, "n", 16), n, "same name and bound give the same symbol");
    kiln_sym(g, "n", 17);
    EXPECT_ERR(g, KILN_ERR_NAME, "max 17");
    kiln_graph_free(g);
    g = new_graph();
    kiln_dim s = kiln_sym(g, "s", 8);
    kiln_node kc = kiln_state(g, "kc", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 4, 8});
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 1, 8});
    cr_assert_eq(kiln_attention(g, q, kc, kc, s, 0), KILN_NODE_NONE, "n_kv bound 8 > max_ctx 4");
    EXPECT_ERR(g, KILN_ERR_SHAPE, "max_ctx");
    kiln_graph_free(g);
}

Test(graph, hash_equal_for_same_graph_and_differs_for_any_change)
{
    char base[33], h[33];
    for (int variant = 0; variant < 8; variant++) {
        kiln_graph *g = new_graph();
        kiln_dim n = kiln_sym(g, "n", variant == 1 ? 33 : 32);
        kiln_node x = kiln_input(g, "x", variant == 2 ? KILN_DTYPE_F16 : KILN_DTYPE_F32, 2, (kiln_dim[]){n, 64});
        kiln_node w = kiln_weight_random(g, "w", KILN_DTYPE_Q8_0, 2, (kiln_dim[]){variant == 3 ? 16 : 8, 64},
                                         variant == 7 ? 99 : 5, 1); /* 7: other weight bytes, same hash */
        kiln_node y = kiln_rms_norm(g, x, KILN_NODE_NONE, variant == 4 ? 1e-6f : 1e-5f);
        kiln_node z = variant == 5 ? kiln_matmul(g, kiln_silu(g, y), w) : kiln_matmul(g, y, w);
        if (variant == 6) z = kiln_gelu(g, z);
        kiln_output(g, z, variant == 7 ? "renamed" : "z");
        cr_assert_eq(kiln_graph_hash(g, variant ? h : base), KILN_OK);
        if (variant == 7) cr_assert_str_eq(h, base, "weights and names are not hashed");
        else if (variant) cr_assert_str_neq(h, base, "variant %d must change the hash", variant);
        kiln_graph_free(g);
    }
}

/* Builds y = silu(x) over x [n, 8] with symbol n <= 4. */
static kiln_graph *small_graph(void)
{
    kiln_graph *g = new_graph();
    kiln_dim n = kiln_sym(g, "n", 4);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){n, 8});
    kiln_output(g, kiln_silu(g, x), "y");
    return g;
}

Test(run, binding_errors_leave_plan_usable)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(NULL, &ctx), KILN_OK);
    kiln_graph *g = small_graph();
    kiln_plan *p;
    kiln_compile_options o = {.backend = tu_backend()};
    cr_assert_eq(kiln_compile(ctx, g, &o, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float x[32], y[32];
    tu_fill(x, 32, -2, 2);
    struct { kiln_binding b[3]; size_t n; kiln_status st; const char *needle; } cases[] = {
        {{{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = y, .bytes = sizeof y}}, 2, KILN_ERR_SYMBOL, "'n' is not bound"},
        {{{.name = "n", .value = 5}, {.name = "x", .data = x, .bytes = sizeof x}}, 2, KILN_ERR_SYMBOL, "out of its bounds"},
        {{{.name = "n", .value = 0}, {.name = "x", .data = x, .bytes = sizeof x}}, 2, KILN_ERR_SYMBOL, "out of its bounds"},
        {{{.name = "n", .value = 2}}, 1, KILN_ERR_BINDING, "'x' is not bound"},
        {{{.name = "n", .value = 2}, {.name = "x", .data = x, .bytes = 12}}, 2, KILN_ERR_BINDING, "needs 64 bytes"},
        {{{.name = "n", .value = 2}, {.name = "x", .data = x, .bytes = 64}, {.name = "zz", .data = x, .bytes = 4}}, 3, KILN_ERR_NAME, "'zz'"},
        {{{.name = "n", .value = 2}, {.name = "x", .data = x, .bytes = 64}, {.name = "y", .data = y, .bytes = 8}}, 3, KILN_ERR_BINDING, "needs 64 bytes"},
        {{{.name = "n", .value = 2}, {.name = "n", .value = 2}, {.name = "x", .data = x, .bytes = 64}}, 3, KILN_ERR_BINDING, "twice"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kiln_status s = kiln_run(p, cases[c].b, cases[c].n);
        cr_assert_eq(s, cases[c].st, "case %zu: %s (%s)", c, kiln_status_str(s), kiln_ctx_error(ctx));
        cr_assert(strstr(kiln_ctx_error(ctx), cases[c].needle), "case %zu: '%s' lacks '%s'", c, kiln_ctx_error(ctx),
                  cases[c].needle);
    }
    /* Still usable: a good run gives silu of every element. */
    tu_poison(y, sizeof y);
    kiln_binding ok[] = {{.name = "n", .value = 3}, {.name = "x", .data = x, .bytes = 96}, {.name = "y", .data = y, .bytes = sizeof y}};
    cr_assert_eq(kiln_run(p, ok, 3), KILN_OK, "%s", kiln_ctx_error(ctx));
    double ref[24], got[24];
    for (int i = 0; i < 24; i++) ref[i] = x[i] / (1 + exp(-(double)x[i])), got[i] = y[i];
    tu_compare("silu", got, ref, 24, tu_tol("silu", KILN_DTYPE_F32));
    kiln_tensor_info ti;
    cr_assert_eq(kiln_plan_tensor(p, "y", &ti), KILN_OK);
    cr_assert_eq(ti.dims[0], 3);
    cr_assert_eq(ti.bytes, 96);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* y = a + silu(b) over [n, 8], n <= 4, on data filled fresh for each run. */
static void check_sum_silu(kiln_ctx *ctx, kiln_plan *p, kiln_binding *b, size_t nb, int n, const float *a, const float *x, float *y)
{
    tu_poison(y, 32 * sizeof *y);
    cr_assert_eq(kiln_run(p, b, nb), KILN_OK, "%s", kiln_ctx_error(ctx));
    double ref[32], got[32];
    for (int i = 0; i < n * 8; i++) ref[i] = a[i] + x[i] / (1 + exp(-(double)x[i])), got[i] = y[i];
    tu_compare("a + silu(b)", got, ref, n * 8, tu_tol("silu", KILN_DTYPE_F32));
}

/* The run memo (sched/bind.c) remembers each binding position's match: bindings that move, names
 * whose text changes in the same buffer, sizes that change and a bad binding between good runs
 * must all be matched by name every run. */
Test(run, bindings_match_by_name_whatever_their_order)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(NULL, &ctx), KILN_OK);
    kiln_graph *g = new_graph();
    kiln_dim n = kiln_sym(g, "n", 4);
    kiln_node a = kiln_input(g, "a", KILN_DTYPE_F32, 2, (kiln_dim[]){n, 8});
    kiln_node b = kiln_input(g, "b", KILN_DTYPE_F32, 2, (kiln_dim[]){n, 8});
    kiln_output(g, kiln_add(g, a, kiln_silu(g, b)), "y");
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = tu_backend()}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float da[32], db[32], y[32];
    char na[4] = "a", nb_[4] = "b";
    for (int round = 0; round < 3; round++) {
        tu_fill(da, 32, -2, 2), tu_fill(db, 32, -3, 3);
        kiln_binding fw[] = {{.name = "n", .value = 2}, {.name = na, .data = da, .bytes = 64}, {.name = nb_, .data = db, .bytes = 64},
                             {.name = "y", .data = y, .bytes = sizeof y}};
        check_sum_silu(ctx, p, fw, 4, 2, da, db, y);
        kiln_binding bw[] = {{.name = "y", .data = y, .bytes = sizeof y}, {.name = "b", .data = db, .bytes = 128},
                             {.name = "a", .data = da, .bytes = 128}, {.name = "n", .value = 4}};
        check_sum_silu(ctx, p, bw, 4, 4, da, db, y);
        /* the same name buffers, their text swapped: position 1 is now b, position 2 a */
        strcpy(na, "b"), strcpy(nb_, "a");
        kiln_binding sw[] = {{.name = "n", .value = 3}, {.name = na, .data = db, .bytes = 96}, {.name = nb_, .data = da, .bytes = 96},
                             {.name = "y", .data = y, .bytes = sizeof y}};
        check_sum_silu(ctx, p, sw, 4, 3, da, db, y);
        strcpy(na, "a"), strcpy(nb_, "b");
        kiln_binding bad[] = {{.name = "n", .value = 3}, {.name = "a", .data = da, .bytes = 64}, {.name = "b", .data = db, .bytes = 96}};
        cr_assert_eq(kiln_run(p, bad, 3), KILN_ERR_BINDING);
        cr_assert(strstr(kiln_ctx_error(ctx), "'a'") && strstr(kiln_ctx_error(ctx), "needs 96 bytes, got 64"), "%s", kiln_ctx_error(ctx));
        kiln_binding one[] = {{.name = "a", .data = da, .bytes = 32}, {.name = "n", .value = 1}, {.name = "b", .data = db, .bytes = 32},
                              {.name = "y", .data = y, .bytes = sizeof y}};
        check_sum_silu(ctx, p, one, 4, 1, da, db, y);
    }
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(run, compile_errors)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(NULL, &ctx), KILN_OK);
    kiln_graph *g = small_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "tpu"}, &p), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_ctx_error(ctx), "unknown backend 'tpu'"));
    kiln_graph *bad = new_graph();
    kiln_silu(bad, KILN_NODE_NONE);
    cr_assert_eq(kiln_compile(ctx, bad, NULL, &p), KILN_ERR_NODE);
    cr_assert(strstr(kiln_ctx_error(ctx), "missing"), "%s", kiln_ctx_error(ctx));
    kiln_graph *noout = new_graph();
    kiln_input(noout, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){4});
    cr_assert_eq(kiln_compile(ctx, noout, NULL, &p), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_ctx_error(ctx), "no outputs"));
    cr_assert_eq(kiln_compile(ctx, g, NULL, &p), KILN_OK, "context still usable: %s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    kiln_plan_free(NULL);
    kiln_graph_free(NULL);
    kiln_ctx_free(NULL);
    kiln_graph_free(g);
    kiln_graph_free(bad);
    kiln_graph_free(noout);
    kiln_ctx_free(ctx);
}

Test(run, states_persist_and_runtime_positions_checked)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(NULL, &ctx), KILN_OK);
    kiln_graph *g = new_graph();
    kiln_node st = kiln_state(g, "cache", KILN_DTYPE_F32, 3, (kiln_dim[]){2, 5, 4});
    kiln_node rows = kiln_input(g, "rows", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 2, 4});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){1});
    kiln_output(g, kiln_kv_scatter(g, st, rows, pos), "after");
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = tu_backend()}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float r[8], cache[40];
    for (int32_t step = 0; step < 5; step++) {
        tu_fill(r, 8, -1, 1);
        kiln_binding b[] = {{.name = "rows", .data = r, .bytes = sizeof r}, {.name = "pos", .data = &step, .bytes = 4}};
        cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert_eq(kiln_plan_state_read(p, "cache", cache, sizeof cache), KILN_OK);
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 4; d++) cr_assert_eq(cache[(h * 5 + step) * 4 + d], r[h * 4 + d]);
    }
    int32_t bad = 5;
    kiln_binding b[] = {{.name = "rows", .data = r, .bytes = sizeof r}, {.name = "pos", .data = &bad, .bytes = 4}};
    cr_assert_eq(kiln_run(p, b, 2), KILN_ERR_SHAPE);
    cr_assert(strstr(kiln_ctx_error(ctx), "5"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_plan_state_read(p, "cache", cache, 12), KILN_ERR_BINDING);
    cr_assert_eq(kiln_plan_state_read(p, "nope", cache, sizeof cache), KILN_ERR_NAME);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}
