/* Tensor-parallel split plans of GGUF models (issue #24): kiln_model_build graphs compiled with
 * kiln_compile_options.devices on ref and cpu virtual devices, their logits (a 12-token prefill then
 * decode steps, every element) against the unsplit graph's f64 reference; the head split by
 * vocabulary (an all_gather; a tied embedding kept whole beside the head's slice) or replicated as
 * the cost model chooses from the profile's link_bw / link_latency_s, and the choice named in the
 * plan. Small random models from tests/support/gguf_writer. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/split.h"
#include "support/gguf_writer.h"
#include "support/ref64.h"
#include "support/testutil.h"

static kiln_ctx *ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 2, .quiet = true}, &ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(ctx); }
TestSuite(split_model, .init = setup, .fini = teardown);

/* llama: q8_0 layers, an f16 embedding and its own output.weight; qwen2: q4_k layers (o and down
 * cannot be halved into whole q4_k blocks, so only the head divides) and a tied q6_k embedding;
 * llama4: 4 KV heads for 4 devices; llama_v32: a small vocabulary (a head that saves little split). */
static const gw_model llama = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 128,
                               .n_vocab = 96, .n_ctx = 64, .wtype = KILN_DTYPE_Q8_0, .embtype = KILN_DTYPE_F16, .seed = 21};
static const gw_model llama4 = {.arch = "llama", .n_layer = 1, .hidden = 64, .n_head = 4, .n_kv_head = 4, .ffn = 128,
                                .n_vocab = 96, .n_ctx = 64, .wtype = KILN_DTYPE_Q8_0, .embtype = KILN_DTYPE_F16, .seed = 23};
static const gw_model llama_v32 = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 128,
                                   .n_vocab = 32, .n_ctx = 64, .wtype = KILN_DTYPE_Q8_0, .embtype = KILN_DTYPE_F16, .seed = 24};
static const gw_model qwen2 = {.arch = "qwen2", .n_layer = 1, .hidden = 256, .n_head = 4, .n_kv_head = 2, .ffn = 256,
                               .n_vocab = 80, .n_ctx = 64, .wtype = KILN_DTYPE_Q4_K, .embtype = KILN_DTYPE_Q6_K,
                               .tied = true, .seed = 22};

typedef struct model {
    uint8_t   *bytes; /* the file */
    kiln_gguf *f;
    kiln_graph *g;    /* the decoder graph */
} model;

static model open_model(const gw_model *m, bool last_only)
{
    model r = {0};
    gw *w = gw_model_new(m);
    size_t n;
    r.bytes = gw_bytes(w, &n);
    gw_free(w);
    cr_assert_eq(kiln_gguf_open_memory(ctx, r.bytes, n, &r.f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_model_options o = {.max_ctx = 32, .max_tok = 16, .logits = true, .last_only = last_only};
    cr_assert_eq(kiln_model_build(r.f, &o, &r.g), KILN_OK, "%s", kiln_ctx_error(ctx));
    return r;
}

static void close_model(model *m)
{
    kiln_graph_free(m->g);
    kiln_gguf_close(m->f);
    free(m->bytes);
}

/* A profile for backend be whose link makes every collective cost latency_s (mem_bw as the backend's). */
static void set_link(const char *be, double latency_s)
{
    kiln_device_profile p;
    cr_assert_eq(kiln_ctx_profile(ctx, be, &p), KILN_OK);
    p.link_latency_s = latency_s;
    p.link_bw = 0;
    cr_assert_eq(kiln_ctx_set_profile(ctx, be, &p), KILN_OK);
}

/* Prefill 12 tokens then 3 decode steps on plan p against the f64 reference of the unsplit graph
 * (its logits: all rows, or the last row's with last_only), every element; next is the argmax of
 * the plan's own logits. */
static void check_logits(kiln_plan *p, const model *full, int64_t V, bool last_only, double tol, const char *what)
{
    ref64 *r = ref64_new(full->g);
    cr_assert(r);
    float *logits = malloc((size_t)(16 * V) * sizeof *logits);
    int32_t ids[16] = {3, 17, 42, 5, 60, 1, 2, 9, 33, 70, 0, 8}, pos[16], next[16];
    for (int i = 0; i < 12; i++) ids[i] %= (int32_t)V;
    int64_t start = 0, n = 12;
    for (int s = 0; s < 4; s++) {
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(start + i);
        int32_t last = (int32_t)(n - 1);
        int64_t rows = last_only ? 1 : n;
        kiln_binding b[7] = {{.name = "n_tok", .value = n}, {.name = "n_kv", .value = start + n},
                             {.name = "ids", .data = ids, .bytes = (size_t)n * 4},
                             {.name = "pos", .data = pos, .bytes = (size_t)n * 4},
                             {.name = "logits", .data = logits, .bytes = (size_t)(rows * V) * sizeof *logits},
                             {.name = "next", .data = next, .bytes = (size_t)rows * 4},
                             {.name = "last", .data = &last, .bytes = 4}};
        tu_poison(logits, (size_t)(rows * V) * sizeof *logits);
        cr_assert_eq(kiln_run(p, b, last_only ? 7 : 6), KILN_OK, "%s: %s", what, kiln_ctx_error(ctx));
        char err[256];
        cr_assert_eq(ref64_run(r, b, 4, err, sizeof err), 0, "%s", err);
        int64_t numel;
        const double *want = ref64_output(r, "logits", NULL, &numel);
        cr_assert_eq(numel, n * V);
        double *got = malloc((size_t)(rows * V) * sizeof *got);
        for (int64_t i = 0; i < rows * V; i++) got[i] = logits[i];
        char lab[300];
        snprintf(lab, sizeof lab, "%s, step %d (seed %llu)", what, s, (unsigned long long)tu_seed());
        tu_compare(lab, got, want + (n - rows) * V, rows * V, tol);
        free(got);
        for (int64_t t = 0; t < rows; t++) {
            int64_t best = 0;
            for (int64_t v = 1; v < V; v++) best = logits[t * V + v] > logits[t * V + best] ? v : best;
            cr_assert_eq(next[t], best, "%s token %lld", lab, (long long)t);
        }
        start += n;
        ids[0] = next[rows - 1];
        n = 1;
    }
    free(logits);
    ref64_free(r);
}

static char *explain(kiln_plan *p)
{
    char *t = NULL;
    cr_assert_eq(kiln_plan_explain(p, "text", &t), KILN_OK);
    return t;
}

/* The model on `devices` (the cost model deciding with link latency latency_s) against the f64
 * reference; *text gets the plan's explanation (caller frees). */
static void run_model(const gw_model *gm, const char *devices, bool last_only, double latency_s, char **text)
{
    const char *be = strncmp(devices, "ref", 3) ? "cpu" : "ref";
    set_link(be, latency_s);
    model m = open_model(gm, last_only), full = last_only ? open_model(gm, false) : m;
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, m.g, &(kiln_compile_options){.devices = devices}, &p), KILN_OK, "%s %s: %s", gm->arch,
                 devices, kiln_ctx_error(ctx));
    char what[200];
    snprintf(what, sizeof what, "%s on %s%s, link latency %g s", gm->arch, devices, last_only ? ", last_only" : "", latency_s);
    check_logits(p, &full, gm->n_vocab, last_only, strcmp(be, "ref") ? 1e-3 : 1e-6, what);
    *text = explain(p);
    kiln_plan_free(p);
    if (last_only) close_model(&full);
    close_model(&m);
}

/* A free link: everything that divides is split, the head by vocabulary (one all_gather). */
Test(split_model, llama_head_split_by_vocabulary_matches_unsplit)
{
    const char *devs[] = {"ref:0,1", "cpu:0,1", "cpu:0,1,2,3"}; /* 96 rows of the head: 48 / 24 per device */
    for (int d = 0; d < 3; d++)
        for (int lo = 0; lo < 2; lo++) {
            char *t;
            run_model(d == 2 ? &llama4 : &llama, devs[d], lo, 0, &t); /* 4 devices: 4 KV heads */
            cr_expect(strstr(t, "1 all_gather (output divided by columns joined whole: a head by vocabulary)"), "%s", t);
            cr_expect(strstr(t, "cost model: output.weight: split") && strstr(t, "-> split"), "the cost model's verdict is named:\n%s", t);
            cr_expect(!strstr(t, "-> replicated"), "%s", t);
            free(t);
        }
}

/* The tied embedding: get_rows reads it whole, the head its slice (both kept on each device). */
Test(split_model, qwen2_tied_head_split_keeps_the_embedding_whole)
{
    for (int lo = 0; lo < 2; lo++) {
        char *t;
        run_model(&qwen2, "cpu:0,1", lo, 0, &t);
        cr_expect(strstr(t, "1 all_gather"), "%s", t);
        cr_expect(strstr(t, "1 weight whole and sliced (tied embedding)"), "%s", t);
        cr_expect(strstr(t, "matmuls replicated: blk.0.attn_q.weight"), "q4_k o halves are not whole blocks:\n%s", t);
        free(t);
    }
    char *t;
    run_model(&qwen2, "ref:0,1", true, 0, &t);
    cr_expect(strstr(t, "1 all_gather"), "%s", t);
    free(t);
}

/* The verdicts of the cost model on the llama graph at link latency L (kiln_sched_split directly). */
static kiln_split split_at(const model *m, int n, double latency_s)
{
    kiln_device_profile p;
    cr_assert_eq(kiln_ctx_profile(ctx, "cpu", &p), KILN_OK);
    p.link_latency_s = latency_s, p.link_bw = 0;
    kiln_split s;
    char err[512] = "";
    kiln_graph *g = kiln_graph_clone(m->g);
    cr_assert_eq(kiln_graph_materialize_weights(g), KILN_OK);
    kiln_status st = kiln_sched_split(g, n, &p, &s, err, sizeof err);
    kiln_graph_free(g);
    if (st != KILN_OK) memset(&s, 0, sizeof s);
    return s;
}

static const kiln_split_choice *choice(const kiln_split *s, const char *name)
{
    for (uint32_t k = 0; k < s->n_choices; k++)
        if (!strcmp(s->choices[k].what, name)) return &s->choices[k];
    cr_assert_fail("no verdict on %s", name);
    return NULL;
}

/* Between the head's saving and the layers', the link latency keeps the head replicated (its
 * logits computed whole on every device, no all_gather) while the layers split; past both, the
 * compile is refused naming the cost model. The latencies come from the model's own predictions. */
Test(split_model, cost_model_replicates_the_head_when_the_link_costs_more)
{
    model m = open_model(&llama_v32, true);
    kiln_split s = split_at(&m, 2, 0);
    cr_assert_eq(s.n_gather, 1u);
    double head = choice(&s, "output.weight")->whole_s - choice(&s, "output.weight")->split_s;
    double layer = INFINITY;
    for (uint32_t k = 0; k < s.n_choices; k++) {
        cr_assert(s.choices[k].split, "%s: split %g, replicated %g", s.choices[k].what, s.choices[k].split_s, s.choices[k].whole_s);
        if (strcmp(s.choices[k].what, "output.weight"))
            layer = fmin(layer, s.choices[k].whole_s - s.choices[k].split_s);
    }
    char d[4096] = "";
    kiln_split_describe(&s, m.g, d, sizeof d);
    kiln_split_free(&s);
    /* one collective per group at each of the two steps weighed: the latency counts twice */
    cr_assert(head < 0.5 * layer, "the small-vocabulary head saves %g s, the least layer group %g s:\n%s", head, layer, d);
    double mid = (head + layer) / 4;
    s = split_at(&m, 2, mid);
    cr_assert_eq(s.n, 2, "latency %g: the layers still split", mid);
    cr_expect_eq(s.n_gather, 0u, "the head is replicated");
    cr_expect(!choice(&s, "output.weight")->split);
    cr_expect_eq(s.n_row, 4u, "o and down of both layers row-parallel");
    kiln_split_free(&s);
    close_model(&m);
    char *t;
    run_model(&llama_v32, "cpu:0,1", true, mid, &t);
    cr_expect(strstr(t, "cost model: output.weight: split") && strstr(t, "-> replicated"), "%s", t);
    cr_expect(!strstr(t, "all_gather"), "%s", t);
    free(t);
    set_link("cpu", 1.0); /* a second per collective: nothing is worth splitting */
    m = open_model(&llama_v32, true);
    kiln_plan *p = (kiln_plan *)1;
    cr_assert_eq(kiln_compile(ctx, m.g, &(kiln_compile_options){.devices = "cpu:0,1"}, &p), KILN_ERR_UNSUPPORTED);
    cr_assert_null(p);
    cr_expect(strstr(kiln_ctx_error(ctx), "the cost model keeps every matmul replicated"), "%s", kiln_ctx_error(ctx));
    close_model(&m);
}
