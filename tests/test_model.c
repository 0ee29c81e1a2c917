/* Tests of kiln_model_build on small GGUF files written by tests/support/gguf_writer (random
 * weights, llama and qwen2 layouts, several tensor types): logits of a prefill and a few decode
 * steps against ref64 (f64) on every present backend; greedy decode gives the same ids on every
 * backend; metadata and tensor errors name the key or tensor. Never asserts on speed. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "support/gguf_writer.h"
#include "support/ref64.h"
#include "support/testutil.h"

static kiln_ctx *ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 2, .quiet = true}, &ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(ctx); }
TestSuite(model, .init = setup, .fini = teardown);

static const gw_model llama = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 128,
                               .n_vocab = 96, .n_ctx = 64, .wtype = KILN_DTYPE_Q8_0, .embtype = KILN_DTYPE_F16,
                               .tokens = true, .seed = 11};
static const gw_model qwen2 = {.arch = "qwen2", .n_layer = 2, .hidden = 256, .n_head = 4, .n_kv_head = 2, .ffn = 256,
                               .n_vocab = 80, .n_ctx = 64, .wtype = KILN_DTYPE_Q4_K, .embtype = KILN_DTYPE_Q6_K,
                               .tied = true, .seed = 12};

/* Runs ids[0..n) at positions start.. on plan (and ref64 when r); logits into out (n x V). */
static void step(kiln_plan *p, ref64 *r, const int32_t *ids, int64_t n, int64_t start, float *logits, size_t lbytes,
                 int32_t *next)
{
    int32_t pos[64];
    for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(start + i);
    kiln_binding b[6] = {{.name = "n_tok", .value = n},
                         {.name = "n_kv", .value = start + n},
                         {.name = "ids", .data = (void *)ids, .bytes = (size_t)n * 4},
                         {.name = "pos", .data = pos, .bytes = (size_t)n * 4},
                         {.name = "logits", .data = logits, .bytes = lbytes},
                         {.name = "next", .data = next, .bytes = (size_t)n * 4}};
    if (p) {
        tu_poison(logits, lbytes);
        cr_assert_eq(kiln_run(p, b, 6), KILN_OK, "%s", kiln_ctx_error(ctx));
    }
    if (r) {
        char err[256];
        cr_assert_eq(ref64_run(r, b, 4, err, sizeof err), 0, "%s", err);
    }
}

/* Prefill 12 tokens then 3 decode steps on backend be: logits match ref64 each step. */
static void check_logits(const gw_model *m, const char *be, double tol)
{
    if (!tu_backend_present(ctx, be)) cr_skip("backend %s absent", be);
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, m, &bytes);
    kiln_graph *g;
    kiln_model_options o = {.max_ctx = 32, .max_tok = 16, .logits = true};
    cr_assert_eq(kiln_model_build(f, &o, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = be}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    ref64 *r = ref64_new(g);
    cr_assert(r);
    int64_t V = m->n_vocab;
    float *logits = malloc((size_t)(16 * V) * sizeof *logits);
    int32_t ids[16] = {3, 17, 42, 5, 60, 1, 2, 9, 33, 70, 0, 8}, next[16];
    int64_t start = 0, n = 12; /* 12 rows: the prefill GEMM path (more than 8 rows) */
    for (int s = 0; s < 4; s++) {
        step(p, r, ids, n, start, logits, (size_t)(n * V) * sizeof(float), next);
        int64_t numel;
        const double *want = ref64_output(r, "logits", NULL, &numel);
        cr_assert(want && numel == n * V);
        double *got = malloc((size_t)numel * sizeof *got);
        for (int64_t i = 0; i < numel; i++) got[i] = logits[i];
        char what[96];
        snprintf(what, sizeof what, "%s %s step %d logits", m->arch, be, s);
        tu_compare(what, got, want, numel, tol);
        free(got);
        for (int64_t t = 0; t < n; t++) { /* next is the argmax of the plan's own logits */
            int64_t best = 0;
            for (int64_t v = 1; v < V; v++) best = logits[t * V + v] > logits[t * V + best] ? v : best;
            cr_assert_eq(next[t], best, "%s token %lld", what, (long long)t);
        }
        start += n;
        ids[0] = next[n - 1];
        n = 1;
    }
    free(logits);
    ref64_free(r);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_gguf_close(f);
    free(bytes);
}

static const gw_model llama_k5 = {.arch = "llama", .n_layer = 1, .hidden = 256, .n_head = 2, .n_kv_head = 1,
                                  .ffn = 512, .n_vocab = 72, .n_ctx = 64, .wtype = KILN_DTYPE_Q5_K,
                                  .embtype = KILN_DTYPE_BF16, .seed = 13};

Test(model, llama_q5_k_bf16_logits_match_f64_on_ref) { check_logits(&llama_k5, "ref", 1e-6); }
Test(model, llama_q5_k_bf16_logits_match_f64_on_cpu) { check_logits(&llama_k5, "cpu", 1e-3); }
Test(model, llama_q8_0_logits_match_f64_on_ref) { check_logits(&llama, "ref", 1e-6); }
Test(model, llama_q8_0_logits_match_f64_on_cpu) { check_logits(&llama, "cpu", 1e-3); }
Test(model, qwen2_q4_k_tied_logits_match_f64_on_ref) { check_logits(&qwen2, "ref", 1e-6); }
Test(model, qwen2_q4_k_tied_logits_match_f64_on_cpu) { check_logits(&qwen2, "cpu", 1e-3); }

/* With last_only, the head runs on the row `last` picks: its logits equal the f64 logits of that
 * token (prefill of 12, then decode steps), on every present backend. */
Test(model, last_only_head_matches_f64_on_the_last_token)
{
    const char *bes[] = {"ref", "cpu"};
    for (int b = 0; b < 2; b++) {
        if (!tu_backend_present(ctx, bes[b])) continue;
        uint8_t *bytes;
        kiln_gguf *f = tu_model_open(ctx, &qwen2, &bytes);
        kiln_graph *g;
        kiln_model_options o = {.max_ctx = 32, .max_tok = 16, .logits = true, .last_only = true};
        cr_assert_eq(kiln_model_build(f, &o, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
        kiln_graph *full;
        o.last_only = false;
        cr_assert_eq(kiln_model_build(f, &o, &full), KILN_OK, "%s", kiln_ctx_error(ctx));
        kiln_plan *p;
        cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = bes[b]}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
        ref64 *r = ref64_new(full);
        cr_assert(r);
        int64_t V = qwen2.n_vocab;
        float *logits = malloc((size_t)V * sizeof *logits);
        int32_t ids[12] = {3, 17, 42, 5, 60, 1, 2, 9, 33, 70, 0, 8}, pos[12], next = -1;
        for (int64_t start = 0, n = 12, s = 0; s < 3; s++) {
            for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(start + i);
            int32_t last = (int32_t)(n - 1);
            kiln_binding bd[7] = {{.name = "n_tok", .value = n}, {.name = "n_kv", .value = start + n},
                                  {.name = "ids", .data = ids, .bytes = (size_t)n * 4},
                                  {.name = "pos", .data = pos, .bytes = (size_t)n * 4},
                                  {.name = "last", .data = &last, .bytes = 4},
                                  {.name = "logits", .data = logits, .bytes = (size_t)V * sizeof *logits},
                                  {.name = "next", .data = &next, .bytes = 4}};
            tu_poison(logits, (size_t)V * sizeof *logits);
            cr_assert_eq(kiln_run(p, bd, 7), KILN_OK, "%s", kiln_ctx_error(ctx));
            char err[256];
            cr_assert_eq(ref64_run(r, bd, 4, err, sizeof err), 0, "%s", err);
            int64_t numel;
            const double *want = ref64_output(r, "logits", NULL, &numel);
            cr_assert_eq(numel, n * V);
            double *got = malloc((size_t)V * sizeof *got);
            for (int64_t i = 0; i < V; i++) got[i] = logits[i];
            tu_compare(bes[b], got, want + (n - 1) * V, V, b ? 1e-3 : 1e-6);
            free(got);
            start += n;
            ids[0] = next;
            n = 1;
        }
        free(logits);
        ref64_free(r);
        kiln_plan_free(p);
        kiln_graph_free(g);
        kiln_graph_free(full);
        kiln_gguf_close(f);
        free(bytes);
    }
}

/* Weights are borrowed from the file's bytes, not copied: changing the final norm weight in the
 * buffer after compiling changes the next run's logits. */
Test(model, weights_are_borrowed_from_the_mapping)
{
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &llama, &bytes);
    kiln_graph *g;
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 8, .max_tok = 1, .logits = true}, &g), KILN_OK);
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cpu"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    kiln_gguf_tensor t;
    cr_assert_eq(kiln_gguf_tensor_get(f, "output_norm.weight", &t), KILN_OK);
    float logits[2][96];
    int32_t id = 5, pos = 0;
    for (int k = 0; k < 2; k++) {
        kiln_binding b[5] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = 1},
                             {.name = "ids", .data = &id, .bytes = 4}, {.name = "pos", .data = &pos, .bytes = 4},
                             {.name = "logits", .data = logits[k], .bytes = sizeof logits[k]}};
        cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        float *w = (float *)(bytes + t.offset); /* the file's bytes: scale the final norm by 2 */
        for (int64_t i = 0; i < t.dims[0]; i++) w[i] *= 2.0f;
    }
    for (int i = 0; i < 96; i++)
        cr_assert(fabsf(logits[1][i] - 2.0f * logits[0][i]) <= 1e-4f * (1.0f + fabsf(logits[0][i])),
                  "logit %d: %g then %g (the scaled norm weight was not seen)", i, logits[0][i], logits[1][i]);
    kiln_plan_free(p);
    kiln_gguf_close(f);
    free(bytes);
}

/* Greedy decode of 12 tokens after a 4-token prompt. */
static void greedy(const gw_model *m, const char *be, int32_t *out)
{
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, m, &bytes);
    kiln_graph *g;
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 32, .max_tok = 4, .kv_dtype = KILN_DTYPE_F16}, &g),
                 KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = be}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    int32_t ids[4] = {1, 2, 3, 4}, next[4];
    int64_t start = 0, n = 4;
    for (int s = 0; s < 12; s++) {
        int32_t pos[4];
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(start + i);
        kiln_binding b[5] = {{.name = "n_tok", .value = n}, {.name = "n_kv", .value = start + n},
                             {.name = "ids", .data = ids, .bytes = (size_t)n * 4},
                             {.name = "pos", .data = pos, .bytes = (size_t)n * 4},
                             {.name = "next", .data = next, .bytes = (size_t)n * 4}};
        cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        out[s] = ids[0] = next[n - 1];
        cr_assert(out[s] >= 0 && out[s] < m->n_vocab);
        start += n;
        n = 1;
    }
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_gguf_close(f);
    free(bytes);
}

Test(model, greedy_decode_agrees_on_every_backend)
{
    const gw_model *models[2] = {&llama, &qwen2};
    const char *bes[] = {"ref", "cpu", "cuda", "vulkan"};
    for (int mi = 0; mi < 2; mi++) {
        int32_t want[12], got[12];
        greedy(models[mi], "ref", want);
        for (int b = 1; b < 4; b++) {
            if (!tu_backend_present(ctx, bes[b])) continue;
            greedy(models[mi], bes[b], got);
            for (int s = 0; s < 12; s++)
                cr_assert_eq(got[s], want[s], "%s on %s: token %d is %d, ref says %d", models[mi]->arch, bes[b], s, got[s],
                             want[s]);
        }
    }
}

Test(model, info_reads_metadata)
{
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &qwen2, &bytes);
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_str_eq(mi.arch, "qwen2");
    cr_assert(mi.n_layer == 2 && mi.hidden == 256 && mi.n_head == 4 && mi.n_kv_head == 2 && mi.head_dim == 64 &&
              mi.ffn == 256 && mi.n_vocab == 80 && mi.n_ctx_train == 64);
    cr_assert(mi.rope == KILN_ROPE_NEOX && mi.theta == 1e6f && mi.eps == 1e-5f && mi.qkv_bias && mi.tied_output);
    cr_assert_gt(mi.weight_bytes, 0);
    kiln_gguf_close(f);
    free(bytes);
    f = tu_model_open(ctx, &llama, &bytes);
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(mi.rope == KILN_ROPE_NORMAL && !mi.qkv_bias && !mi.tied_output && mi.theta == 1e4f);
    kiln_graph *g;
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.n_layers = 3}, &g), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_ctx_error(ctx), "n_layers 3"), "%s", kiln_ctx_error(ctx));
    cr_assert_null(g);
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 8, .max_tok = 9}, &g), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    kiln_gguf_close(f);
    free(bytes);
}

/* Files that are valid GGUF but not a model kiln can build. */
Test(model, bad_models_name_key_or_tensor)
{
    gw *w = gw_new(3, 0);
    gw_kv_str(w, "general.architecture", "mamba");
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    kiln_gguf *f;
    kiln_graph *g;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK);
    cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "mamba"), "%s", kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    free(bytes);
    w = gw_new(3, 0);
    gw_kv_str(w, "general.architecture", "llama");
    gw_kv_u32(w, "llama.block_count", 1);
    bytes = gw_bytes(w, &n);
    gw_free(w);
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK);
    cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_NAME);
    cr_assert(strstr(kiln_ctx_error(ctx), "llama.embedding_length"), "%s", kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    free(bytes);
    /* a model with one layer's tensor missing, and one with a wrong shape (head count changed) */
    gw_model m = llama;
    m.n_layer = 1;
    m.meta_n_layer = 2;
    w = gw_model_new(&m);
    bytes = gw_bytes(w, &n);
    gw_free(w);
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK);
    cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_NAME, "%s", kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "blk.1.attn_norm.weight"), "%s", kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    free(bytes);
    /* features kiln does not build are refused by name, not run wrong */
    for (int k = 0; k < 4; k++) {
        gw_model mm = llama;
        w = gw_model_new(&mm);
        const char *want[4] = {"llama.expert_count", "llama.rope.scaling.type", "llama.attn_logit_softcapping",
                               "llama.final_logit_softcapping"};
        if (k == 0) gw_kv_u32(w, "llama.expert_count", 8);
        if (k == 1) gw_kv_str(w, "llama.rope.scaling.type", "longrope");
        if (k == 2) gw_kv_f32(w, "llama.attn_logit_softcapping", 50.0f);
        if (k == 3) gw_kv_f32(w, "llama.final_logit_softcapping", 30.0f);
        bytes = gw_bytes(w, &n);
        gw_free(w);
        cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_UNSUPPORTED, "%s", want[k]);
        cr_assert(strstr(kiln_ctx_error(ctx), want[k]), "%s", kiln_ctx_error(ctx));
        kiln_gguf_close(f);
        free(bytes);
    }
    m.meta_n_layer = 0;
    m.ffn = 96;
    m.meta_ffn = 128;
    w = gw_model_new(&m);
    bytes = gw_bytes(w, &n);
    gw_free(w);
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK);
    cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_SHAPE, "%s", kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "blk.0.ffn_gate.weight") && strstr(kiln_ctx_error(ctx), "[96, 64]"), "%s",
              kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    free(bytes);
}
