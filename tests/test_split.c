/* Tensor-parallel split plans (issue #24): the split's structure (what each part holds, where
 * every all_reduce sits) for 2, 4 and 8 devices, split plans on N virtual devices of the ref and
 * cpu backends against the unsplit graph's f64 reference (llama- and qwen2-shaped layers, decode
 * and prefill, fresh random data, every element), and the refusals. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/presets.h"
#include "sched/split.h"
#include "support/ref64.h"
#include "support/testutil.h"

static kiln_ctx *ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 2, .quiet = true}, &ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(ctx); }
TestSuite(split, .init = setup, .fini = teardown);

/* llama-shaped (normal rope, no biases) and qwen2-shaped (neox rope, q/k/v biases) small layers:
 * 8 query heads over 4 KV heads (GQA groups of 2), so 2 and 4 devices divide them. */
static const kiln_preset LLAMA = {.name = "llama-s", .hidden = 256, .n_head = 8, .n_kv_head = 4, .head_dim = 32,
                                  .ffn = 512, .rope = KILN_ROPE_NORMAL, .theta = 1e4f, .eps = 1e-5f};
static const kiln_preset QWEN2 = {.name = "qwen2-s", .hidden = 256, .n_head = 8, .n_kv_head = 4, .head_dim = 32,
                                  .ffn = 384, .rope = KILN_ROPE_NEOX, .theta = 1e6f, .eps = 1e-6f, .qkv_bias = true};
static const kiln_preset WIDE4 = {.name = "wide-q4", .hidden = 512, .n_head = 8, .n_kv_head = 4, .head_dim = 64,
                                  .ffn = 1024, .rope = KILN_ROPE_NORMAL, .theta = 1e4f, .eps = 1e-5f};
static const kiln_preset WIDE = {.name = "wide", .hidden = 256, .n_head = 8, .n_kv_head = 8, .head_dim = 32,
                                 .ffn = 512, .rope = KILN_ROPE_NEOX, .theta = 1e4f, .eps = 1e-6f};

static kiln_graph *build(const kiln_preset *ps, kiln_dtype wt, int64_t max_tok, int64_t max_ctx, int layers)
{
    kiln_preset_build_opts o = {.wdtype = wt, .kvdtype = kiln_preset_kv_dtype(wt), .n_layers = layers, .max_ctx = max_ctx,
                                .max_tok = max_tok, .seed = tu_next() | 1};
    kiln_graph *g = NULL;
    char err[256] = "";
    cr_assert_eq(kiln_preset_build_ex(ps, &o, &g, err, sizeof err), KILN_OK, "%s", err);
    return g;
}

static uint32_t count_op(const kiln_graph *g, enum kiln_op op)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static const kiln_node_rec *named(const kiln_graph *g, const char *name)
{
    uint32_t i = kiln_graph_find_leaf(g, name);
    cr_assert_neq(i, KILN_IDX_NONE, "no leaf '%s'", name);
    return &g->nodes[i];
}

/* ---------------------------------------------------------------- structure */

static void check_structure(const kiln_preset *ps, int n, int layers)
{
    kiln_graph *g = build(ps, KILN_DTYPE_F32, 4, 32, layers);
    kiln_split s;
    char err[512] = "";
    cr_assert_eq(kiln_sched_split(g, n, NULL, &s, err, sizeof err), KILN_OK, "%s across %d: %s", ps->name, n, err);
    cr_expect_eq(s.n_col, 5u * layers, "%s/%d: q, k, v, gate, up column-parallel per layer, got %u", ps->name, n, s.n_col);
    cr_expect_eq(s.n_row, 2u * layers, "%s/%d: o and down row-parallel, got %u", ps->name, n, s.n_row);
    cr_expect_eq(s.n_reduce, 2u * layers, "%s/%d: one all_reduce after o and one after down, got %u", ps->name, n, s.n_reduce);
    cr_expect_eq(s.n_split_states, 2u * layers, "%s/%d: k and v caches divided by heads", ps->name, n);
    for (int p = 0; p < n; p++) {
        const kiln_graph *pg = s.parts[p];
        cr_assert_eq(count_op(pg, KILN_OP_ALL_REDUCE), 2u * layers);
        cr_assert_eq(named(pg, "k0")->dims[0], ps->n_kv_head / n, "part %d: KV heads of the cache", p);
        cr_assert_eq(named(pg, "k0")->dims[1], 32);
        for (uint32_t i = 0; i < pg->n_nodes; i++) {
            const kiln_node_rec *r = &pg->nodes[i];
            if (r->op == KILN_OP_ATTENTION) { /* heads divided, GQA group size kept */
                cr_expect_eq(r->dims[1], ps->n_head / n, "part %d attention heads", p);
                cr_expect_eq(r->dims[1] / pg->nodes[r->src[1]].dims[0], ps->n_head / ps->n_kv_head, "GQA group");
            }
            if (r->op == KILN_OP_ALL_REDUCE) { /* right after a row-parallel matmul: its full width, partial */
                const kiln_node_rec *m = &pg->nodes[r->src[0]];
                cr_assert_eq(m->op, KILN_OP_MATMUL, "part %d: all_reduce #%u reads %s", p, i, kiln_op_name(m->op));
                cr_expect_eq(r->dims[1], ps->hidden);
                cr_expect_eq(pg->nodes[m->src[1]].dims[0], ps->hidden, "row-parallel weight keeps its rows");
                int64_t K = pg->nodes[m->src[1]].dims[1] * n;
                cr_expect(K == ps->ffn || K == ps->n_head * ps->head_dim, "row-parallel weight columns divided: %lld", (long long)K);
                cr_expect_eq(r->i[0], n, "all_reduce knows its device count");
                /* its readers: the residual add, and nothing reads the partial sum but the all_reduce */
                for (uint32_t j = 0; j < pg->n_nodes; j++)
                    for (int k = 0; k < pg->nodes[j].n_src; k++)
                        if (pg->nodes[j].src[k] == r->src[0]) cr_expect_eq(j, i, "part %d: the partial sum #%u is read by #%u", p, r->src[0], j);
            }
        }
        const struct { const char *w; int64_t rows, cols; } want[] = {
            {"wq0", ps->n_head * ps->head_dim / n, ps->hidden}, {"wk0", ps->n_kv_head * ps->head_dim / n, ps->hidden},
            {"wv0", ps->n_kv_head * ps->head_dim / n, ps->hidden}, {"wo0", ps->hidden, ps->n_head * ps->head_dim / n},
            {"wg0", ps->ffn / n, ps->hidden}, {"wu0", ps->ffn / n, ps->hidden}, {"wd0", ps->hidden, ps->ffn / n}};
        for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
            cr_expect_eq(named(pg, want[k].w)->dims[0], want[k].rows, "part %d: %s rows", p, want[k].w);
            cr_expect_eq(named(pg, want[k].w)->dims[1], want[k].cols, "part %d: %s columns", p, want[k].w);
        }
        cr_expect_eq(named(pg, "attn_norm0")->dims[0], ps->hidden, "norms replicated");
    }
    kiln_split_free(&s);
    kiln_graph_free(g);
}

Test(split, structure_for_2_4_and_8_devices)
{
    check_structure(&LLAMA, 2, 1);
    check_structure(&LLAMA, 4, 2);
    check_structure(&QWEN2, 2, 1);
    check_structure(&QWEN2, 4, 1);
    check_structure(&WIDE, 8, 1);
}

Test(split, weights_are_exact_slices)
{
    kiln_graph *g = build(&QWEN2, KILN_DTYPE_Q8_0, 1, 16, 1);
    cr_assert_eq(kiln_graph_materialize_weights(g), KILN_OK);
    kiln_split s;
    char err[512] = "";
    cr_assert_eq(kiln_sched_split(g, 2, NULL, &s, err, sizeof err), KILN_OK, "%s", err);
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *w = &g->nodes[i];
        if (w->op != KILN_OP_WEIGHT) continue;
        size_t row = kiln_row_bytes((kiln_dtype)w->dtype, w->dims[w->rank - 1]);
        size_t rows = w->rank == 2 ? (size_t)w->dims[0] : 1;
        for (int p = 0; p < 2; p++) {
            const kiln_node_rec *q = &s.parts[p]->nodes[s.part_node[i]];
            if (s.kind[i] == KILN_SPLIT_REPL) {
                cr_assert_eq(memcmp(q->data, w->data, rows * row), 0, "%s: replicated bytes differ", w->name);
                continue;
            }
            cr_assert_eq(s.kind[i], KILN_SPLIT_AXIS);
            if (s.axis[i] == 0) /* rows p*R/2 .. */
                cr_assert_eq(memcmp(q->data, (const char *)w->data + (size_t)p * rows / 2 * row, rows / 2 * row), 0, "%s rows", w->name);
            else { /* columns: each row's half, whole q8_0 blocks */
                size_t half = kiln_row_bytes((kiln_dtype)w->dtype, w->dims[1] / 2);
                for (size_t r = 0; r < rows; r++)
                    cr_assert_eq(memcmp((const char *)q->data + r * half, (const char *)w->data + r * row + (size_t)p * half, half), 0,
                                 "%s columns, row %zu", w->name, r);
            }
        }
    }
    kiln_split_free(&s);
    kiln_graph_free(g);
}

/* ---------------------------------------------------------------- split plans against the reference */

typedef struct run_case {
    const kiln_preset *ps;
    const char        *backend;
    int                n;        /* devices */
    kiln_dtype         wt;       /* matmul weights */
    int64_t            max_tok;  /* 1: decode; more: prefill */
    bool               one_gpu;  /* every part on device 0 ("cuda:0,0"): virtual parts on one GPU */
} run_case;

static void fill_state(kiln_plan *p, ref64 *r, const char *name)
{
    kiln_tensor_info ti;
    cr_assert_eq(kiln_plan_tensor(p, name, &ti), KILN_OK, "%s", kiln_ctx_error(ctx));
    int64_t n = 1;
    for (int k = 0; k < ti.rank; k++) n *= ti.dims[k];
    float *v = malloc((size_t)n * sizeof *v);
    tu_fill(v, n, -1, 1);
    size_t bytes;
    void *d = tu_to_dtype(ti.t, v, n, &bytes);
    cr_assert_eq(bytes, ti.bytes);
    char err[256];
    cr_assert_eq(kiln_plan_state_write(p, name, d, bytes), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(ref64_state_set(r, name, d, bytes, err, sizeof err), 0, "%s", err);
    free(v);
    free(d);
}

static void check_state(kiln_plan *p, ref64 *r, const char *name, double tol, const char *what)
{
    kiln_tensor_info ti;
    cr_assert_eq(kiln_plan_tensor(p, name, &ti), KILN_OK);
    int64_t n;
    const double *ref = ref64_state(r, name, &n);
    void *raw = tu_galloc(ti.bytes);
    double *got = malloc((size_t)n * sizeof *got);
    cr_assert_eq(kiln_plan_state_read(p, name, raw, ti.bytes), KILN_OK, "%s", kiln_ctx_error(ctx));
    tu_to_f64(ti.t, raw, n, got);
    char lab[200];
    snprintf(lab, sizeof lab, "%s, state %s", what, name);
    tu_compare(lab, got, ref, n, tol);
    tu_gfree(raw, lab);
    free(got);
}

static void run_split(const run_case *c)
{
    const int64_t max_ctx = 24;
    kiln_graph *g = build(c->ps, c->wt, c->max_tok, max_ctx, 1);
    char dev[64], what[200];
    int o = snprintf(dev, sizeof dev, "%s:", c->backend);
    for (int d = 0; d < c->n; d++) o += snprintf(dev + o, sizeof dev - (size_t)o, "%s%d", d ? "," : "", c->one_gpu ? 0 : d);
    snprintf(what, sizeof what, "%s %s on %s, weights %s (seed %llu)", c->ps->name, c->max_tok > 1 ? "prefill" : "decode", dev,
             kiln_dtype_name(c->wt), (unsigned long long)tu_seed());
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = dev}, &p), KILN_OK, "%s: %s", what, kiln_ctx_error(ctx));
    ref64 *r = ref64_new(g);
    cr_assert_not_null(r);
    fill_state(p, r, "k0");
    fill_state(p, r, "v0");
    double tol = c->wt == KILN_DTYPE_F32 ? 1e-6 : 3e-3; /* the preset layer tolerances of kiln check */
    for (int step = 0; step < 2; step++) {
        int64_t nt = step == 0 ? c->max_tok : tu_randint(1, c->max_tok + 1), nkv = tu_randint(nt, max_ctx + 1);
        int64_t H = c->ps->hidden;
        float *x = malloc((size_t)(nt * H) * sizeof *x);
        int32_t *pos = malloc((size_t)nt * sizeof *pos);
        tu_fill(x, nt * H, -1, 1);
        for (int64_t t = 0; t < nt; t++) pos[t] = (int32_t)(nkv - nt + t);
        float *y = tu_galloc((size_t)(nt * H) * sizeof *y);
        kiln_binding b[] = {{.name = "n_tok", .value = nt}, {.name = "n_kv", .value = nkv},
                            {.name = "x", .data = x, .bytes = (size_t)(nt * H) * sizeof *x},
                            {.name = "pos", .data = pos, .bytes = (size_t)nt * sizeof *pos},
                            {.name = "y", .data = y, .bytes = (size_t)(nt * H) * sizeof *y}};
        char err[256];
        cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "%s: %s", what, kiln_ctx_error(ctx));
        cr_assert_eq(ref64_run(r, b, 5, err, sizeof err), 0, "%s", err);
        int64_t ne;
        const double *ref = ref64_output(r, "y", NULL, &ne);
        cr_assert_eq(ne, nt * H);
        double *got = malloc((size_t)ne * sizeof *got);
        for (int64_t i = 0; i < ne; i++) got[i] = y[i];
        char lab[300];
        snprintf(lab, sizeof lab, "%s, step %d (n_tok %lld, n_kv %lld)", what, step, (long long)nt, (long long)nkv);
        tu_compare(lab, got, ref, ne, tol);
        tu_gfree(y, lab);
        free(got), free(x), free(pos);
        check_state(p, r, "k0", tol, lab);
        check_state(p, r, "v0", tol, lab);
    }
    ref64_free(r);
    kiln_plan_free(p);
    kiln_graph_free(g);
}

Test(split, ref_layers_match_unsplit_reference)
{
    const kiln_preset *ps[] = {&LLAMA, &QWEN2};
    for (int i = 0; i < 2; i++)
        for (int n = 2; n <= 4; n += 2)
            for (int64_t mt = 1; mt <= 6; mt += 5) run_split(&(run_case){ps[i], "ref", n, KILN_DTYPE_F32, mt, false});
}

Test(split, cpu_layers_match_unsplit_reference)
{
    const kiln_preset *ps[] = {&LLAMA, &QWEN2};
    for (int i = 0; i < 2; i++)
        for (int n = 2; n <= 4; n += 2)
            for (int64_t mt = 1; mt <= 6; mt += 5) run_split(&(run_case){ps[i], "cpu", n, KILN_DTYPE_F32, mt, false});
    run_split(&(run_case){&LLAMA, "cpu", 2, KILN_DTYPE_Q8_0, 6, false});
    run_split(&(run_case){&QWEN2, "cpu", 4, KILN_DTYPE_Q8_0, 1, false});
}

/* ---------------------------------------------------------------- refusals and reports */

static void expect_refused(kiln_graph *g, const char *devices, kiln_status want, const char *needle)
{
    kiln_plan *p = (kiln_plan *)1;
    kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.devices = devices}, &p);
    cr_assert_eq(s, want, "devices '%s': status %s, want %s (%s)", devices, kiln_status_str(s), kiln_status_str(want),
                 kiln_ctx_error(ctx));
    cr_assert_null(p, "a refused compile leaves *out NULL");
    cr_assert_not_null(strstr(kiln_ctx_error(ctx), needle), "devices '%s': message '%s' should name '%s'", devices,
                       kiln_ctx_error(ctx), needle);
}

Test(split, refuses_what_does_not_divide)
{
    const kiln_preset *q05 = kiln_preset_find("qwen2-0.5b"); /* 14 heads over 2 KV heads */
    cr_assert_not_null(q05);
    kiln_graph *g = build(q05, KILN_DTYPE_F32, 1, 16, 1);
    expect_refused(g, "cpu:0,1,2,3", KILN_ERR_UNSUPPORTED, "14 (heads) does not divide by 4");
    expect_refused(g, "ref:0,1,2", KILN_ERR_UNSUPPORTED, "896 output rows do not divide by 3");
    kiln_graph_free(g);
    g = build(&LLAMA, KILN_DTYPE_F32, 1, 16, 1); /* 4 KV heads over 8 devices */
    expect_refused(g, "cpu:0,1,2,3,4,5,6,7", KILN_ERR_UNSUPPORTED, "4 (heads) does not divide by 8");
    expect_refused(g, "cpu:0,x", KILN_ERR_INVALID_ARG, "expected a device number");
    expect_refused(g, "0", KILN_ERR_INVALID_ARG, "give a count");
    expect_refused(g, "vulkan:0,1", KILN_ERR_UNSUPPORTED, "a split runs on ref, cpu");
    kiln_graph_free(g);
    /* nothing to divide: one matmul with 6 outputs over 4 devices */
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 32});
    kiln_output(g, kiln_matmul(g, x, kiln_weight_random(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){6, 32}, 3, 1.0f)), "y");
    expect_refused(g, "cpu:0,1,2,3", KILN_ERR_UNSUPPORTED, "no matmul can be divided");
    kiln_graph_free(g);
    /* a graph that already holds an all_reduce */
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 32});
    kiln_output(g, kiln_all_reduce(g, kiln_matmul(g, x, kiln_weight_random(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){8, 32}, 3, 1.0f))), "y");
    expect_refused(g, "cpu:0,1", KILN_ERR_UNSUPPORTED, "already holds all_reduce");
    kiln_graph_free(g);
}

/* A head whose logits feed argmax stays whole; the layers around it split. A q4_k down
 * projection whose halves are not whole blocks keeps its FFN replicated, exactly. */
Test(split, replicates_what_must_stay_whole)
{
    kiln_graph *g = build(&LLAMA, KILN_DTYPE_F32, 1, 16, 1);
    kiln_split s;
    char err[512] = "";
    cr_assert_eq(kiln_sched_split(g, 2, NULL, &s, err, sizeof err), KILN_OK, "%s", err);
    uint32_t y = g->outs[kiln_graph_find_output(g, "y")].node;
    cr_assert_eq(s.kind[y], KILN_SPLIT_REPL, "the output is whole");
    kiln_split_free(&s);
    kiln_graph_free(g);
    g = build(&WIDE4, KILN_DTYPE_Q4_K, 1, 16, 1); /* o: 512 / 2 = 256 whole q4_k blocks, / 4 = 128 not; down 1024 / 4 = 256 */
    cr_assert_eq(kiln_sched_split(g, 2, NULL, &s, err, sizeof err), KILN_OK, "%s", err);
    cr_expect_eq(s.n_col, 5u);
    cr_expect_eq(s.n_row, 2u);
    kiln_split_free(&s);
    cr_assert_eq(kiln_sched_split(g, 4, NULL, &s, err, sizeof err), KILN_OK, "%s", err);
    cr_expect_eq(s.n_col, 2u, "gate/up divided; q, k, v replicated (o's quarters are not whole q4_k blocks)");
    cr_expect_eq(s.n_row, 1u);
    cr_expect_eq(s.n_split_states, 0u);
    kiln_split_free(&s);
    kiln_graph_free(g);
}

Test(split, plan_explains_the_split)
{
    kiln_graph *g = build(&LLAMA, KILN_DTYPE_F32, 1, 16, 1);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "2", .backend = "cpu"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    char *t = NULL;
    cr_assert_eq(kiln_plan_explain(p, "text", &t), KILN_OK);
    cr_expect_not_null(strstr(t, "tensor-parallel split across 2 devices"), "%s", t);
    cr_expect_not_null(strstr(t, "collective"), "the all_reduce regions are listed:\n%s", t);
    free(t);
    cr_assert_eq(kiln_plan_explain(p, "json", &t), KILN_OK);
    cr_expect_not_null(strstr(t, "\"split\": {\"devices\": 2"), "%s", t);
    free(t);
    kiln_tensor_info ti;
    cr_assert_eq(kiln_plan_tensor(p, "k0", &ti), KILN_OK);
    cr_expect_eq(ti.dims[0], LLAMA.n_kv_head, "a divided state reads whole");
    float x[256];
    kiln_binding b = {.name = "x", .data = x, .bytes = sizeof x, .device = true};
    cr_expect_eq(kiln_run(p, &b, 1), KILN_ERR_BINDING);
    cr_expect(strstr(kiln_ctx_error(ctx), "host memory"), "%s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    /* one device: an ordinary plan on the backend named */
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "ref:0"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_expect_str_eq(kiln_plan_backend(p), "ref");
    kiln_plan_free(p);
    kiln_graph_free(g);
}

/* ---------------------------------------------------------------- on GPUs (skipped without them) */

static bool have_cuda(void)
{
    kiln_backend_info b;
    return kiln_backend_get(ctx, 2, &b) == KILN_OK && !strcmp(b.name, "cuda") && b.available;
}

/* Parts on one GPU listed twice: the split's kernels and the host all-reduce on the device. */
Test(split, cuda_virtual_parts_match_unsplit_reference)
{
    if (!have_cuda()) cr_skip("cuda absent");
    setenv("KILN_SPLIT", "all", 1); /* small layers: the link's latency would keep them whole */
    run_split(&(run_case){&LLAMA, "cuda", 2, KILN_DTYPE_F32, 1, true});
    run_split(&(run_case){&QWEN2, "cuda", 2, KILN_DTYPE_F32, 6, true});
    run_split(&(run_case){&QWEN2, "cuda", 4, KILN_DTYPE_Q8_0, 6, true});
}

/* Full-size layers on two GPUs through NCCL against the same layer on one GPU: 16 decode steps then
 * a 512-token prefill (a fresh plan pair), every output element, the f32 preset tolerance. */
static void two_gpus_vs_one(const char *name, int64_t max_tok, int steps)
{
    const kiln_preset *ps = kiln_preset_find(name);
    cr_assert_not_null(ps);
    const int64_t max_ctx = max_tok > 1 ? max_tok : 1024;
    kiln_graph *g = build(ps, KILN_DTYPE_F32, max_tok, max_ctx, 1);
    kiln_plan *one = NULL, *two = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &one), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "cuda:0,1"}, &two), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_tensor_info ti;
    cr_assert_eq(kiln_plan_tensor(one, "k0", &ti), KILN_OK);
    float *kv = malloc(ti.bytes); /* f32 KV (f32 weights): random initial caches */
    tu_fill(kv, (int64_t)(ti.bytes / 4), -1, 1);
    for (int k = 0; k < 2; k++) {
        const char *st = k ? "v0" : "k0";
        cr_assert_eq(kiln_plan_state_write(one, st, kv, ti.bytes), KILN_OK);
        cr_assert_eq(kiln_plan_state_write(two, st, kv, ti.bytes), KILN_OK, "%s", kiln_ctx_error(ctx));
    }
    free(kv);
    int64_t H = ps->hidden;
    float *x = malloc((size_t)(max_tok * H) * sizeof *x), *y1 = malloc((size_t)(max_tok * H) * sizeof *y1);
    float *y2 = tu_galloc((size_t)(max_tok * H) * sizeof *y2);
    int32_t *pos = malloc((size_t)max_tok * sizeof *pos);
    for (int s = 0; s < steps; s++) {
        int64_t nt = max_tok, nkv = max_tok > 1 ? max_tok : 100 + s;
        tu_fill(x, nt * H, -1, 1);
        for (int64_t t = 0; t < nt; t++) pos[t] = (int32_t)(nkv - nt + t);
        tu_poison(y2, (size_t)(nt * H) * sizeof *y2);
        kiln_binding b[] = {{.name = "n_tok", .value = nt}, {.name = "n_kv", .value = nkv},
                            {.name = "x", .data = x, .bytes = (size_t)(nt * H) * sizeof *x},
                            {.name = "pos", .data = pos, .bytes = (size_t)nt * sizeof *pos},
                            {.name = "y", .data = y1, .bytes = (size_t)(nt * H) * sizeof *y1}};
        cr_assert_eq(kiln_run(one, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        b[4].data = y2;
        cr_assert_eq(kiln_run(two, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        double *ref = malloc((size_t)(nt * H) * sizeof *ref), *got = malloc((size_t)(nt * H) * sizeof *got);
        for (int64_t i = 0; i < nt * H; i++) ref[i] = y1[i], got[i] = y2[i];
        char lab[200];
        snprintf(lab, sizeof lab, "%s %s on cuda:0,1 vs one GPU, step %d (n_kv %lld)", name, max_tok > 1 ? "prefill" : "decode", s,
                 (long long)nkv);
        double e = tu_compare(lab, got, ref, nt * H, 1e-6);
        fprintf(stderr, "%s: NMSE %.3g\n", lab, e);
        free(ref), free(got);
    }
    tu_gfree(y2, "two-GPU output");
    free(x), free(y1), free(pos);
    kiln_plan_free(two);
    kiln_plan_free(one);
    kiln_graph_free(g);
}

Test(split, cuda_two_gpus_match_one, .timeout = 600)
{
    char why[512];
    int n = 0;
    if (kiln_multi_gpu(ctx, &n, why, sizeof why) != KILN_OK) cr_skip("multi-GPU off: %s", why);
    setenv("KILN_SPLIT", "all", 1); /* the split whatever the calibrated link says */
    two_gpus_vs_one("llama-7b", 1, 16);
    two_gpus_vs_one("llama-7b", 512, 1);
    two_gpus_vs_one("qwen2-7b", 1, 16);
    two_gpus_vs_one("qwen2-7b", 512, 1);
}
