/* Cost model and placement: the search against brute force on small synthetic problems, what-if
 * placement that moves work to a fast device only when the link pays for it, pins, liveness
 * memory reuse, profile files (good and bad), and the plan explanation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sched/cost.h"
#include "model/presets.h"
#include "util/env.h"
#include "support/testutil.h"

/* Independent total: sum of region times plus, per edge whose ends differ in location, the link
 * costs (device -> host at the producer's d2h, host -> device at the consumer's h2d). */
static double brute_total(const kiln_place_problem *pp, const uint8_t *a)
{
    double t = 0;
    for (uint32_t r = 0; r < pp->n_regions; r++) {
        double x = pp->time[r * pp->n_backends + a[r]];
        if (x < 0) return INFINITY;
        t += x;
    }
    for (uint32_t e = 0; e < pp->n_edges; e++) {
        const kiln_place_edge *ed = &pp->edges[e];
        int fb = ed->from == KILN_IDX_NONE ? -1 : a[ed->from], tb = ed->to == KILN_IDX_NONE ? -1 : a[ed->to];
        bool fd = fb >= 0 && pp->profiles[fb].h2d_bw > 0, td = tb >= 0 && pp->profiles[tb].h2d_bw > 0;
        if (fb == tb || (!fd && !td)) continue;
        if (fd) t += pp->profiles[fb].xfer_latency_s + ed->bytes / pp->profiles[fb].d2h_bw;
        if (td) t += pp->profiles[tb].xfer_latency_s + ed->bytes / pp->profiles[tb].h2d_bw;
    }
    return t;
}

Test(place, search_matches_brute_force_on_small_graphs)
{
    for (int trial = 0; trial < 300; trial++) {
        uint32_t nr = (uint32_t)tu_randint(1, 9);
        int nb = (int)tu_randint(2, 4);
        kiln_device_profile prof[4];
        memset(prof, 0, sizeof prof);
        for (int b = 1; b < nb; b++) { /* backend 0 is host memory; the others are devices */
            prof[b].h2d_bw = prof[b].d2h_bw = tu_uniform(1e9, 5e10);
            prof[b].xfer_latency_s = tu_uniform(1e-6, 2e-5);
        }
        double time[9 * 4];
        for (uint32_t r = 0; r < nr; r++)
            for (int b = 0; b < nb; b++) time[r * nb + b] = tu_randint(0, 8) ? tu_uniform(1e-6, 1e-3) : -1;
        for (uint32_t r = 0; r < nr; r++) time[r * nb] = tu_uniform(1e-6, 1e-3); /* host runs everything */
        kiln_place_edge e[40];
        uint32_t ne = 0;
        for (uint32_t r = 0; r < nr; r++) {
            e[ne++] = (kiln_place_edge){.from = r ? (uint32_t)tu_randint(0, r) : KILN_IDX_NONE, .to = r, .bytes = tu_uniform(1e3, 1e7)};
            if (r > 1 && tu_randint(0, 2)) e[ne++] = (kiln_place_edge){.from = (uint32_t)tu_randint(0, r), .to = r, .bytes = tu_uniform(1e3, 1e7)};
        }
        e[ne++] = (kiln_place_edge){.from = nr - 1, .to = KILN_IDX_NONE, .bytes = tu_uniform(1e3, 1e6)};
        kiln_place_problem pp = {.n_regions = nr, .n_backends = nb, .time = time, .edges = e, .n_edges = ne, .profiles = prof};
        /* Brute force. */
        uint8_t cur[9] = {0}, got[9], heur[9];
        double best = INFINITY;
        for (;;) {
            double t = brute_total(&pp, cur);
            if (t < best) best = t;
            uint32_t i = 0;
            while (i < nr && ++cur[i] == nb) cur[i++] = 0;
            if (i == nr) break;
        }
        double t = kiln_sched_place(&pp, 1u << 20, got);
        cr_assert_float_eq(t, best, best * 1e-12, "trial %d: search %.9g, brute force %.9g", trial, t, best);
        cr_assert_float_eq(brute_total(&pp, got), best, best * 1e-12, "the assignment returned has the claimed cost");
        double th = kiln_sched_place(&pp, 0, heur);
        cr_assert_float_eq(brute_total(&pp, heur), th, th * 1e-12);
        cr_assert_geq(th, best * (1 - 1e-12), "heuristic below the optimum: accounting is wrong");
    }
}

static kiln_graph *mlp(int layers, int64_t d)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){64, d});
    for (int l = 0; l < layers; l++) {
        char n[16];
        snprintf(n, sizeof n, "w%d", l);
        x = kiln_silu(g, kiln_matmul(g, x, kiln_weight_random(g, n, KILN_DTYPE_F16, 2, (kiln_dim[]){d, d}, l, 0.05f)));
    }
    kiln_output(g, x, "y");
    return g;
}

Test(place, what_if_device_used_only_when_the_link_pays)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_device_profile cpu, gpu = {.mem_bw = 3e12, .launch_s = 5e-6, .xfer_latency_s = 1e-5};
    cr_assert_eq(kiln_ctx_profile(ctx, "cpu", &cpu), KILN_OK);
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) gpu.peak_flops[t] = 5e14;
    kiln_graph *g = mlp(8, 1024);
    const char *expect[] = {"cpu", "cuda"};
    double links[] = {1e6, 1e11};
    for (int k = 0; k < 2; k++) {
        gpu.h2d_bw = gpu.d2h_bw = links[k];
        cr_assert_eq(kiln_ctx_set_profile(ctx, "cuda", &gpu), KILN_OK);
        kiln_plan *p;
        cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.what_if = true}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert_str_eq(kiln_plan_backend(p), expect[k], "link %.0g B/s", links[k]);
        kiln_region_info ri;
        cr_assert_eq(kiln_plan_region(p, 0, &ri), KILN_OK);
        cr_assert_gt(ri.predicted_s[2], 0, "cuda predicted");
        cr_assert_eq(kiln_run(p, NULL, 0), KILN_ERR_UNSUPPORTED, "what-if plans do not run");
        kiln_plan_free(p);
    }
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(place, pins_and_forced_backend)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){8});
    kiln_node a = kiln_silu(g, x), b = kiln_softmax(g, a);
    cr_assert_eq(kiln_pin(g, b, "ref"), KILN_OK);
    kiln_output(g, b, "y");
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.no_fuse = true}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_region_info r0, r1;
    kiln_plan_region(p, 0, &r0);
    kiln_plan_region(p, 1, &r1);
    cr_assert_str_eq(r1.backend, "ref", "the pinned softmax runs on ref");
    cr_assert_str_eq(r0.backend, "cpu", "the rest is placed on the faster cpu");
    kiln_plan_free(p);
    cr_assert_eq(kiln_pin(g, a, "tpu"), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_graph_error(g), "tpu"));
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(memory, liveness_reuses_intermediates)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){1024});
    for (int i = 0; i < 20; i++) x = kiln_softmax(g, kiln_silu(g, x));
    kiln_output(g, x, "y");
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.no_fuse = true, .backend = "ref"}, &p), KILN_OK);
    cr_assert_leq(kiln_plan_peak_bytes(p), 3 * 4096, "40 ops in a chain need at most 3 live buffers, got %zu bytes",
                  kiln_plan_peak_bytes(p));
    /* And the result is still right. */
    float in[1024], out[1024];
    tu_fill(in, 1024, -3, 3);
    double ref[1024], got[1024];
    for (int i = 0; i < 1024; i++) ref[i] = in[i];
    for (int it = 0; it < 20; it++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < 1024; i++) ref[i] = ref[i] / (1 + exp(-ref[i])), mx = fmax(mx, ref[i]);
        for (int i = 0; i < 1024; i++) sum += (ref[i] = exp(ref[i] - mx));
        for (int i = 0; i < 1024; i++) ref[i] /= sum;
    }
    tu_poison(out, sizeof out);
    kiln_binding b[] = {{.name = "x", .data = in, .bytes = sizeof in}, {.name = "y", .data = out, .bytes = sizeof out}};
    cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    for (int i = 0; i < 1024; i++) got[i] = out[i];
    tu_compare("chain", got, ref, 1024, 40 * tu_tol("softmax", KILN_DTYPE_F32));
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kiln-prof-%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    return path;
}

Test(profile, json_overrides_and_errors)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    const char *good = "{\"cpu\": {\"mem_bw\": 1.5e10, \"peak_flops\": {\"f32\": 2e11, \"q4_k\": 9e10}},\n"
                       " \"cuda\": {\"mem_bw\": 3e12, \"h2d_bw\": 2.5e10, \"d2h_bw\": 2.5e10, \"launch_s\": 4e-6}}\n";
    cr_assert_eq(kiln_ctx_load_profile(ctx, write_tmp(good)), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_device_profile p;
    cr_assert_eq(kiln_ctx_profile(ctx, "cpu", &p), KILN_OK);
    cr_assert_float_eq(p.mem_bw, 1.5e10, 1);
    cr_assert_float_eq(p.peak_flops[KILN_DTYPE_Q4_K], 9e10, 1);
    cr_assert_eq(kiln_ctx_profile(ctx, "cuda", &p), KILN_OK);
    cr_assert_float_eq(p.h2d_bw, 2.5e10, 1);
    struct { const char *text, *needle; } bad[] = {
        {"{\"cpu\": {\"mem_bandwidth\": 1}}", "unknown profile field 'mem_bandwidth'"},
        {"{\"npu\": {\"mem_bw\": 1}}", "unknown backend"},
        {"{\"cpu\": {\"mem_bw\": \"fast\"}}", "expected a number"},
        {"{\"cpu\": {\"mem_bw\": 1e10,}", ":1:"},
        {"{\"cpu\": {\"peak_flops\": {\"f64\": 1}}}", "unknown dtype"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(kiln_ctx_load_profile(ctx, write_tmp(bad[i].text)), KILN_ERR_PARSE, "case %zu", i);
        cr_assert(strstr(kiln_ctx_error(ctx), bad[i].needle), "case %zu: '%s' lacks '%s'", i, kiln_ctx_error(ctx), bad[i].needle);
        cr_assert_eq(kiln_ctx_profile(ctx, "cpu", &p), KILN_OK);
        cr_assert_float_eq(p.mem_bw, 1.5e10, 1, "a bad file changes nothing");
    }
    cr_assert_eq(kiln_ctx_load_profile(ctx, "/nonexistent/p.json"), KILN_ERR_IO);
    remove(write_tmp(""));
    kiln_ctx_free(ctx);
}

Test(explain, text_json_dot_describe_every_kernel)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g = mlp(3, 64);
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, NULL, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_plan_kernel_count(p), 3, "matmul + silu epilogue per layer");
    float x[64 * 64], y[64 * 64];
    tu_fill(x, 64 * 64, -1, 1);
    kiln_binding b[] = {{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = y, .bytes = sizeof y}};
    cr_assert_eq(kiln_plan_profile(p, true), KILN_OK);
    for (int i = 0; i < 3; i++) cr_assert_eq(kiln_run(p, b, 2), KILN_OK);
    char *txt, *json, *dot;
    cr_assert_eq(kiln_plan_explain(p, "text", &txt), KILN_OK);
    cr_assert_eq(kiln_plan_explain(p, "json", &json), KILN_OK);
    cr_assert_eq(kiln_plan_explain(p, "dot", &dot), KILN_OK);
    cr_assert(strstr(txt, "matmul + silu"), "%s", txt);
    cr_assert(strstr(txt, "measured"), "%s", txt);
    cr_assert(strstr(json, "\"kernels\": 3"), "%s", json);
    cr_assert(strstr(dot, "digraph") && strstr(dot, "r0 -> r1"), "%s", dot);
    kiln_region_info ri;
    cr_assert_eq(kiln_plan_region(p, 2, &ri), KILN_OK);
    cr_assert_eq(ri.n_measured, 3);
    cr_assert_gt(ri.measured_s, 0);
    cr_assert_float_eq(ri.flops, 2.0 * 64 * 64 * 64 + 5 * 64 * 64, 1);
    free(txt);
    cr_assert_eq(kiln_plan_explain(p, "yaml", &txt), KILN_ERR_INVALID_ARG);
    free(json);
    free(dot);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* The public preset builder is the internal one with defaults and errors that name the problem. */
Test(preset, public_builder_matches_internal_and_names_errors)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    cr_assert_str_eq(kiln_preset_name(0), kiln_preset_at(0)->name);
    cr_assert_null(kiln_preset_name(kiln_preset_count()));
    cr_assert_null(kiln_preset_name(-1));
    kiln_graph *pub, *in;
    cr_assert_eq(kiln_preset_graph(ctx, "qwen2-0.5b", &(kiln_preset_options){.wdtype = KILN_DTYPE_Q8_0, .n_layers = 2}, &pub),
                 KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_preset_build(kiln_preset_find("qwen2-0.5b"), KILN_DTYPE_Q8_0, 2, 1024, 1, &in), KILN_OK);
    char h1[33], h2[33];
    kiln_graph_hash(pub, h1);
    kiln_graph_hash(in, h2);
    cr_assert_str_eq(h1, h2, "defaults: max_ctx 1024, max_tok 1, f16 cache for q8_0 weights");
    kiln_graph_free(pub);
    kiln_graph_free(in);

    kiln_graph *g = (kiln_graph *)1;
    cr_assert_eq(kiln_preset_graph(ctx, "gpt-5", NULL, &g), KILN_ERR_NAME);
    cr_assert_null(g);
    cr_assert(strstr(kiln_ctx_error(ctx), "'gpt-5'") && strstr(kiln_ctx_error(ctx), "llama-7b"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_preset_graph(ctx, "llama-7b", &(kiln_preset_options){.max_ctx = 4, .max_tok = 8}, &g),
                 KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_ctx_error(ctx), "max_tok"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_preset_graph(ctx, "llama-7b", &(kiln_preset_options){.wdtype = KILN_DTYPE_I32}, &g),
                 KILN_ERR_DTYPE);
    cr_assert_eq(kiln_preset_graph(NULL, "nope", NULL, &g), KILN_ERR_NAME, "a NULL context only loses the message");
    kiln_ctx_free(ctx);
}

/* The code-changing environment variables only fill the options a caller left at zero. */
Test(sched, env_fills_options_left_at_zero)
{
    setenv("KILN_GEMM", "0", 1);
    setenv("KILN_GEMM_BM", "64", 1);
    setenv("KILN_GRID_CAP", "0", 1);
    setenv("KILN_VK_DISABLE", "dot,16bit", 1);
    setenv("KILN_NO_RECORD", "1", 1);
    setenv("KILN_PDL", "1", 1);
    kiln_compile_options o;
    kiln_env_options(NULL, &o);
    cr_assert_eq(o.codegen.pdl, KILN_GEMM_ON);
    cr_assert_eq(o.codegen.gemm, KILN_GEMM_OFF);
    cr_assert_eq(o.codegen.gemm_rows, 64);
    cr_assert_eq(o.codegen.grid_cap, -1, "KILN_GRID_CAP=0 means every virtual block");
    cr_assert_eq(o.codegen.vk_disable, KILN_VK_NO_DOT | KILN_VK_NO_16BIT);
    cr_assert(o.no_record);
    setenv("KILN_GRID_CAP", "7", 1);
    kiln_compile_options in = {.no_fuse = true, .codegen.gemm_rows = 128, .codegen.grid_cap = 3};
    kiln_env_options(&in, &o);
    cr_assert(o.no_fuse);
    cr_assert_eq(o.codegen.gemm_rows, 128, "a set option wins over the environment");
    cr_assert_eq(o.codegen.grid_cap, 3);
    const char *vars[] = {"KILN_GEMM", "KILN_GEMM_BM", "KILN_GRID_CAP", "KILN_VK_DISABLE", "KILN_NO_RECORD", "KILN_PDL"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    kiln_env_options(NULL, &o);
    kiln_compile_options zero;
    memset(&zero, 0, sizeof zero);
    cr_assert(memcmp(&o.codegen, &zero.codegen, sizeof o.codegen) == 0 && !o.no_record, "unset: all defaults");
    cr_assert_str_eq(kiln_env_name(KILN_ENV_GEMM), "KILN_GEMM");
}
