/* Model files against an f64 forward written from the architecture's definition
 * (tests/support/model_ref.c, which reads the file itself and never calls kiln's model builder):
 * random-weight GGUF files with biases on every projection, on ref and cpu, prefill then decode
 * steps. A tensor or key the graph ignored would change the reference's answer, not kiln's, and
 * fail here. Also checks that biases fuse (no extra kernels). Never asserts on speed. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "support/gguf_writer.h"
#include "support/model_ref.h"
#include "support/testutil.h"

static kiln_ctx *ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 2, .quiet = true}, &ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(ctx); }
TestSuite(model_arch, .init = setup, .fini = teardown);

#define N_PREFILL 12 /* more than 8 rows: the prefill GEMM path */
#define N_DECODE 3
#define N_ALL (N_PREFILL + N_DECODE)
#define MAX_CTX 32 /* the plans' context (what picks phi3's longrope factors) */

/* Runs a prefill of N_PREFILL tokens and N_DECODE decode steps of m on backend be (logits of
 * every token into got [N_ALL, V]); the ids fed are fixed so the f64 forward sees the same ones.
 * moe_dense: mixtures of experts in the dense form (kiln_model_options). */
static void run_kiln_moe(kiln_gguf *f, const char *be, const int32_t *ids, int64_t V, double *got, int *kernels,
                         bool moe_dense)
{
    kiln_graph *g;
    kiln_model_options o = {.max_ctx = MAX_CTX, .max_tok = 16, .logits = true, .moe_dense = moe_dense};
    cr_assert_eq(kiln_model_build(f, &o, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = be}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    if (kernels) *kernels = kiln_plan_kernel_count(p);
    float *logits = malloc((size_t)(N_PREFILL * V) * sizeof *logits);
    int32_t next[N_PREFILL], pos[N_PREFILL];
    for (int64_t start = 0, n = N_PREFILL; start < N_ALL; start += n, n = 1) {
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(start + i);
        size_t lb = (size_t)(n * V) * sizeof *logits;
        kiln_binding b[6] = {{.name = "n_tok", .value = n}, {.name = "n_kv", .value = start + n},
                             {.name = "ids", .data = (void *)(ids + start), .bytes = (size_t)n * 4},
                             {.name = "pos", .data = pos, .bytes = (size_t)n * 4},
                             {.name = "logits", .data = logits, .bytes = lb},
                             {.name = "next", .data = next, .bytes = (size_t)n * 4}};
        tu_poison(logits, lb);
        cr_assert_eq(kiln_run(p, b, 6), KILN_OK, "%s", kiln_ctx_error(ctx));
        for (int64_t i = 0; i < n * V; i++) got[start * V + i] = logits[i];
    }
    free(logits);
    kiln_plan_free(p);
    kiln_graph_free(g);
}

static void run_kiln(kiln_gguf *f, const char *be, const int32_t *ids, int64_t V, double *got, int *kernels)
{
    run_kiln_moe(f, be, ids, V, got, kernels, false);
}

/* Every token's logits of model m on backend be against the f64 forward, NMSE <= tol. */
static void check_model(gw_model m, const char *be, double tol)
{
    if (be && !tu_backend_present(ctx, be)) cr_skip("backend %s absent", be);
    m.seed = tu_next(); /* fresh weights each run (the seed is printed on failure) */
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    int32_t ids[N_ALL];
    for (int i = 0; i < N_ALL; i++) ids[i] = (int32_t)tu_randint(0, m.n_vocab);
    char err[256];
    int64_t V = 0;
    double *want = mref_logits_ctx(f, ids, N_ALL, MAX_CTX, &V, err, sizeof err);
    cr_assert(want, "f64 forward: %s", err);
    cr_assert_eq(V, m.n_vocab);
    double *got = malloc((size_t)(N_ALL * V) * sizeof *got);
    run_kiln(f, be, ids, V, got, NULL);
    char what[128];
    snprintf(what, sizeof what, "%s (%s weights) on %s, seed %llu", m.arch, kiln_dtype_name(m.wtype), be ? be : "auto",
             (unsigned long long)tu_seed());
    double e = tu_compare(what, got, want, N_ALL * V, tol);
    cr_log_info("%s: NMSE %.3g (bound %.3g)", what, e, tol);
    free(got);
    free(want);
    kiln_gguf_close(f);
    free(bytes);
}

/* Tolerances: the matmul contract's bound for the weight dtype (what one projection may add),
 * times 10 for the ~8 projections a token's logits pass through in two layers. The ref backend
 * reads the dequantized weights exactly as the f64 forward does (no int8 activations): f32's bound
 * (1e-10) times 100 there, whatever the format. */
static double model_tol(kiln_dtype w, const char *be)
{
    return strcmp(be, "ref") == 0 ? tu_tol("matmul", KILN_DTYPE_F32) * 100 : tu_tol("matmul", w) * 10;
}

static const gw_model biased = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                                .n_vocab = 48, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                                .qkv_bias = true, .out_bias = true, .ffn_bias = true};

Test(model_arch, llama_with_every_bias_matches_f64_on_ref) { check_model(biased, "ref", model_tol(KILN_DTYPE_F32, "ref")); }
Test(model_arch, llama_with_every_bias_matches_f64_on_cpu) { check_model(biased, "cpu", model_tol(KILN_DTYPE_F32, "cpu")); }

Test(model_arch, llama_q8_0_out_and_ffn_bias_match_f64_on_cpu)
{
    gw_model m = biased;
    m.wtype = KILN_DTYPE_Q8_0, m.qkv_bias = false;
    check_model(m, "cpu", model_tol(KILN_DTYPE_Q8_0, "cpu"));
}

Test(model_arch, qwen2_matches_f64_on_cpu)
{
    gw_model m = biased;
    m.arch = "qwen2", m.out_bias = m.ffn_bias = false, m.tied = true;
    check_model(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
}

/* A bias add right after a matmul is an epilogue of that matmul's kernel: the file with every
 * bias compiles to as many kernels as the file without. */
Test(model_arch, biases_fuse_as_matmul_epilogues)
{
    const char *bes[2] = {"ref", "cpu"};
    for (int b = 0; b < 2; b++) {
        if (!tu_backend_present(ctx, bes[b])) continue;
        int k[2];
        for (int with = 0; with < 2; with++) {
            gw_model m = biased;
            m.seed = 5;
            m.qkv_bias = m.out_bias = m.ffn_bias = with;
            uint8_t *bytes;
            kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
            int32_t ids[N_ALL] = {0};
            double *got = malloc((size_t)(N_ALL * m.n_vocab) * sizeof *got);
            run_kiln(f, bes[b], ids, m.n_vocab, got, &k[with]);
            free(got);
            kiln_gguf_close(f);
            free(bytes);
        }
        cr_assert_eq(k[1], k[0], "%s: %d kernels with biases, %d without", bes[b], k[1], k[0]);
    }
}

/* ---------------------------------------------------------------- architectures */

/* qwen3: per-head q/k rms norms before rope, neox rotary, a head size from key_length that is not
 * hidden / n_head (q is 128 wide on a 64-wide model), tied output head. */
static const gw_model qwen3 = {.arch = "qwen3", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                               .n_vocab = 48, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                               .head_dim = 32, .tied = true};

Test(model_arch, qwen3_matches_f64_on_ref) { check_model(qwen3, "ref", model_tol(KILN_DTYPE_F32, "ref")); }
Test(model_arch, qwen3_matches_f64_on_cpu) { check_model(qwen3, "cpu", model_tol(KILN_DTYPE_F32, "cpu")); }

/* On the GPU: the q/k head norms as rule 7's row kernels (norm, rope, cache write), f32 and q8_0. */
Test(model_arch, qwen3_matches_f64_on_cuda)
{
    if (!tu_backend_present(ctx, "cuda")) cr_skip("no cuda device");
    gw_model m = qwen3;
    check_model(m, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    m.wtype = KILN_DTYPE_Q8_0;
    check_model(m, "cuda", model_tol(KILN_DTYPE_Q8_0, "cuda"));
}

Test(model_arch, qwen3_q8_0_matches_f64_on_cpu)
{
    gw_model m = qwen3;
    m.wtype = m.embtype = KILN_DTYPE_Q8_0;
    check_model(m, "cpu", model_tol(KILN_DTYPE_Q8_0, "cpu"));
}

/* Tied embeddings in llama (no output.weight: the head is token_embd.weight). */
Test(model_arch, llama_tied_head_matches_f64_on_cpu)
{
    gw_model m = biased;
    m.tied = true, m.qkv_bias = m.out_bias = m.ffn_bias = false;
    check_model(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
}

/* qwen3 without its q/k norms is refused by name (llama.cpp requires them too). */
Test(model_arch, qwen3_without_qk_norm_is_refused)
{
    gw_model m = qwen3;
    gw *w = gw_model_new(&m);
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    /* rename layer 1's q norm (same length): the file then lacks blk.1.attn_q_norm.weight */
    uint8_t *p = NULL;
    for (size_t i = 0; !p && i + 24 <= n; i++) p = memcmp(bytes + i, "blk.1.attn_q_norm.weight", 24) ? NULL : bytes + i;
    cr_assert(p);
    memcpy(p, "blk.1.attn_q_xorm", 17);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph *g;
    cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_NAME, "%s", kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "blk.1.attn_q_norm.weight"), "%s", kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    free(bytes);
}

/* ---------------------------------------------------------------- weight formats */

/* Every block format kiln reads, as the matmul weights of a small llama file (width 256, so the
 * k-quants and iq4_xs fill their rows), on every backend against the f64 forward. */
static const kiln_dtype FORMATS[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1,
                                     KILN_DTYPE_IQ4_NL, KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K, KILN_DTYPE_IQ4_XS};
static const gw_model wide = {.arch = "llama", .n_layer = 1, .hidden = 256, .n_head = 4, .n_kv_head = 2, .ffn = 256,
                              .n_vocab = 40, .n_ctx = 64, .embtype = KILN_DTYPE_Q8_0, .out_bias = true};

static void formats_on(const char *be)
{
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++) {
        gw_model m = wide;
        m.wtype = m.embtype = FORMATS[i];
        check_model(m, be, model_tol(FORMATS[i], be));
    }
}

Test(model_arch, every_weight_format_matches_f64_on_ref) { formats_on("ref"); }
Test(model_arch, every_weight_format_matches_f64_on_cpu) { formats_on("cpu"); }
/* The GPU rows of codegen/wfmt_more.c: every matmul and the embedding lookup of the file on the
 * device (skips where cuda is absent; on lavapipe the eight plans take over ten minutes to compile,
 * test_ops' matmul_more_formats covers the kernels there). */
Test(model_arch, every_weight_format_matches_f64_on_cuda) { formats_on("cuda"); }

/* The GPU rows of the 32-blocks take K in whole pairs (a multiple of 64): a q5_0 file of width 96
 * compiled with the automatic choice runs on the cpu and computes right; forced onto a GPU backend,
 * the compile fails naming the format. Never a plan that misreads the bytes. */
Test(model_arch, q5_0_file_of_odd_pairs_runs_on_cpu_or_is_refused_by_gpu_backends)
{
    gw_model m = wide;
    m.hidden = m.ffn = 96;
    m.wtype = KILN_DTYPE_Q5_0;
    check_model(m, NULL, model_tol(KILN_DTYPE_Q5_0, "cpu")); /* auto placement */
    const char *gpus[2] = {"vulkan", "cuda"};
    for (int b = 0; b < 2; b++) {
        if (!tu_backend_present(ctx, gpus[b])) continue;
        uint8_t *bytes;
        kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
        kiln_graph *g;
        cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 32, .max_tok = 16}, &g), KILN_OK);
        kiln_plan *p = NULL;
        kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = gpus[b]}, &p);
        cr_assert_eq(s, KILN_ERR_UNSUPPORTED, "%s: %s", gpus[b], kiln_status_str(s));
        cr_assert_null(p);
        cr_assert(strstr(kiln_ctx_error(ctx), "q5_0"), "%s: %s", gpus[b], kiln_ctx_error(ctx));
        cr_log_info("%s: %s", gpus[b], kiln_ctx_error(ctx));
        kiln_graph_free(g);
        kiln_gguf_close(f);
        free(bytes);
    }
}


/* ---------------------------------------------------------------- rotary scaling, sliding window */

/* llama 3.1: rope_freqs.weight divides pair i's angle by its factor (random factors in [0.5, 7.5],
 * so a graph that ignored them would be far off); with linear scaling as well, both divide. */
static const gw_model llama31 = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                                 .n_vocab = 48, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                                 .rope_freqs = true};

Test(model_arch, llama3_rope_freqs_match_f64_on_ref) { check_model(llama31, "ref", model_tol(KILN_DTYPE_F32, "ref")); }
Test(model_arch, llama3_rope_freqs_match_f64_on_cpu) { check_model(llama31, "cpu", model_tol(KILN_DTYPE_F32, "cpu")); }

Test(model_arch, linear_rope_scaling_matches_f64_on_cpu)
{
    gw_model m = qwen3; /* neox pairing */
    m.rope_scale = 8.0f;
    check_model(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
    m = llama31;
    m.rope_scale = 2.5f, m.wtype = KILN_DTYPE_Q8_0;
    check_model(m, "cpu", model_tol(KILN_DTYPE_Q8_0, "cpu"));
}

/* A bad rope_freqs tensor is refused by name: wrong length, a factor that is not > 0. */
Test(model_arch, bad_rope_freqs_are_refused)
{
    for (int k = 0; k < 2; k++) {
        gw_model m = llama31;
        m.rope_freqs = false, m.seed = 3;
        gw *w = gw_model_new(&m);
        float v[8] = {1, 2, 3, 4, 5, 6, 7, k == 0 ? 8.0f : -1.0f}; /* head size 16: 8 factors */
        gw_tensor(w, "rope_freqs.weight", 0 /* f32 */, 1, (int64_t[]){k == 0 ? 7 : 8}, v, (size_t)(k == 0 ? 28 : 32));
        size_t n;
        uint8_t *bytes = gw_bytes(w, &n);
        gw_free(w);
        kiln_gguf *f;
        cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
        kiln_graph *g = NULL;
        kiln_status s = kiln_model_build(f, NULL, &g);
        cr_assert_eq(s, KILN_ERR_SHAPE, "case %d: %s: %s", k, kiln_status_str(s), kiln_ctx_error(ctx));
        cr_assert_null(g);
        cr_assert(strstr(kiln_ctx_error(ctx), "rope_freqs.weight"), "%s", kiln_ctx_error(ctx));
        cr_log_info("%s", kiln_ctx_error(ctx));
        kiln_gguf_close(f);
        free(bytes);
    }
}

/* mistral-style sliding window of W positions on every layer: kiln_attention_ext's window, exact
 * past the window (5 keys here, 15 tokens run), on ref, cpu and vulkan; max_ctx is not capped. */
Test(model_arch, sliding_window_matches_f64_past_the_window)
{
    gw_model m = biased;
    m.window = 5;
    check_model(m, "ref", model_tol(KILN_DTYPE_F32, "ref"));
    check_model(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 64}, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    char *text = NULL;
    cr_assert_eq(kiln_kg_print(g, &text), KILN_OK);
    cr_assert(strstr(text, "sym n_kv 64\n") && strstr(text, "window=5"), "window not applied:\n%.300s", text);
    free(text);
    kiln_graph_free(g);
    kiln_gguf_close(f);
    free(bytes);
}

/* gemma 2 (llama.cpp's graph): embeddings x sqrt(hidden), post-attention and post-ffn norms,
 * gelu_tanh(gate) * up, soft-capped attention scores (here cap 2: deep in tanh's bend) and final
 * logits (cap 3), the window (4 keys) on even layers only, every layer rotating with the file's
 * base (1e6; llama.cpp's gemma2 loader: the local layers' base and scale are the global ones, unlike
 * gemma 3's), head_dim 32 != hidden / n_head. The defaults (caps 50 and 30, window 4096) in the
 * second file. */
static const gw_model gemma2 = {.arch = "gemma2", .n_layer = 3, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                                .n_vocab = 80, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                                .tied = true, .head_dim = 32, .window = 4, .attn_softcap = 2.0f, .final_softcap = 3.0f};
static const gw_model gemma3 = {.arch = "gemma3", .n_layer = 7, .hidden = 64, .n_head = 4, .n_kv_head = 1, .ffn = 64,
                                .n_vocab = 80, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                                .tied = true, .head_dim = 32, .window = 6, .rope_scale = 8.0f};
static const gw_model phi3 = {.arch = "phi3", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                              .n_vocab = 80, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                              .window = 7};

/* gemma 1 (llama.cpp's LLM_ARCH_GEMMA: gemma-2b/7b, codegemma): embeddings x sqrt(hidden) and the
 * gelu gate, no post-norms, window or soft-caps; head_dim 32 != hidden / n_head (gemma-7b: 256 for
 * 3072 / 16); the head is the tied embedding. */
static const gw_model gemma1 = {.arch = "gemma", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 4, .ffn = 96,
                                .n_vocab = 80, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                                .tied = true, .head_dim = 32};

/* ref and cpu here; GPUs through cuda (below) and the op tests (test_ops, test_paged, test_flash_kir
 * run the new masks and tanh on lavapipe; a whole model there takes minutes). */
static void on_backends(gw_model m, kiln_dtype w)
{
    m.wtype = w;
    check_model(m, "ref", model_tol(w, "ref"));
    check_model(m, "cpu", model_tol(w, "cpu"));
}

Test(model_arch, gemma2_matches_f64) { on_backends(gemma2, KILN_DTYPE_F32); }
/* gemma 2 with linear rope scaling: llama.cpp scales the local layers too (rope_freq_scale_train_swa =
 * rope_freq_scale_train); kiln rotated them with base 10000 unscaled until session 8 (found against
 * llama.cpp: python/tests/test_llama_cpp.py). And rope.freq_base_swa, which recent converters write
 * for gemma 3 (rope_local_base_freq): the local layers' base, gemma 2's still scaled, gemma 3's not. */
Test(model_arch, gemma_local_rope_as_llama_cpp)
{
    gw_model m = gemma2;
    m.rope_scale = 4.0f;
    on_backends(m, KILN_DTYPE_F32);
    m.theta_swa = 2e4f;
    on_backends(m, KILN_DTYPE_F32);
    m = gemma3;
    m.theta_swa = 5e3f;
    on_backends(m, KILN_DTYPE_F32);
}
Test(model_arch, gemma1_matches_f64)
{
    on_backends(gemma1, KILN_DTYPE_F32);
    gw_model m = gemma1;
    m.wtype = KILN_DTYPE_Q8_0, m.n_kv_head = 1; /* gemma-2b: one KV head */
    check_model(m, "cpu", model_tol(KILN_DTYPE_Q8_0, "cpu"));
}

/* What llama.cpp's gemma loaders refuse or ignore: a window or soft-cap key on gemma 1 (it reads
 * neither: refused unless at the value that turns it off), an output.weight on any gemma (the head
 * is always the embedding: the tensor would go unread). */
Test(model_arch, gemma1_refusals_and_kernels)
{
    struct { gw_model m; const char *want; } bad[3] = {{gemma1, "sliding_window"}, {gemma1, "attn_logit_softcapping"},
                                                       {gemma2, "output.weight"}};
    bad[0].m.window = 4, bad[1].m.attn_softcap = 50.0f, bad[2].m.tied = false;
    for (int i = 0; i < 3; i++) {
        uint8_t *bytes;
        kiln_gguf *f = tu_model_open(ctx, &bad[i].m, &bytes);
        kiln_model_info mi;
        cr_assert_eq(kiln_model_info_get(f, &mi), KILN_ERR_UNSUPPORTED, "case %d", i);
        cr_assert(strstr(kiln_ctx_error(ctx), bad[i].want), "case %d: %s", i, kiln_ctx_error(ctx));
        kiln_gguf_close(f);
        free(bytes);
    }
}
Test(model_arch, gemma2_defaults_and_q8_0_match_f64)
{
    gw_model m = gemma2;
    m.window = 0, m.attn_softcap = 0, m.final_softcap = 0; /* llama.cpp's defaults: 4096, 50, 30 */
    on_backends(m, KILN_DTYPE_Q8_0);
}
/* gemma 3: q/k head norms, every 6th layer global (layers 5 of 7 here) with linear rope scaling x8
 * and base 1e6, the local ones base 10000 unscaled (llama.cpp's freq_base_swa default); no soft-caps. */
Test(model_arch, gemma3_matches_f64) { on_backends(gemma3, KILN_DTYPE_F32); }
/* phi3: fused attn_qkv rows and ffn_up halves (gate first), window on every layer. */
Test(model_arch, phi3_matches_f64) { on_backends(phi3, KILN_DTYPE_F32); }
Test(model_arch, phi3_q4_k_matches_f64_on_cpu)
{
    gw_model m = phi3;
    m.hidden = 256, m.ffn = 256, m.n_head = 4, m.n_kv_head = 4, m.wtype = KILN_DTYPE_Q4_K;
    check_model(m, "cpu", model_tol(KILN_DTYPE_Q4_K, "cpu"));
}

/* The new architectures on a GPU (the device runs these; skipped without one). */
Test(model_arch, gemma_and_phi3_match_f64_on_cuda)
{
    if (!tu_backend_present(ctx, "cuda")) cr_skip("no cuda device");
    gw_model m = gemma2;
    check_model(m, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    m.wtype = KILN_DTYPE_Q8_0, m.window = 0, m.attn_softcap = 0, m.final_softcap = 0;
    check_model(m, "cuda", model_tol(KILN_DTYPE_Q8_0, "cuda"));
    check_model(gemma3, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    check_model(phi3, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    check_model(gemma1, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
}

/* Kernels per decode layer on cpu: compiled with 2 layers minus 1 layer; *rest: the 1-layer plan's
 * others (embedding, head, argmax). */
static int layer_kernels_rest(gw_model m, int *rest)
{
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    int k[2];
    for (int n = 1; n <= 2; n++) {
        kiln_graph *g;
        cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 32, .max_tok = 1, .n_layers = n}, &g), KILN_OK,
                     "%s", kiln_ctx_error(ctx));
        kiln_plan *p;
        cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cpu"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
        k[n - 1] = kiln_plan_kernel_count(p);
        kiln_plan_free(p);
        kiln_graph_free(g);
    }
    kiln_gguf_close(f);
    free(bytes);
    if (rest) *rest = 2 * k[0] - k[1];
    return k[1] - k[0];
}

static int layer_kernels(gw_model m) { return layer_kernels_rest(m, NULL); }

/* gemma's post-norms take their residual adds into their row kernels (fusion rule 1): a gemma 2
 * layer is llama's 5 kernels plus one per post-norm (it needs the whole row of its matmul's output,
 * so it cannot be that matmul's epilogue); it was 9 before. */
Test(model_arch, gemma_post_norms_fuse_with_their_residual_adds)
{
    if (!tu_backend_present(ctx, "cpu")) cr_skip("no cpu backend");
    int llama = layer_kernels(biased), gemma = layer_kernels(gemma2);
    cr_assert_eq(llama, 5, "llama layer: %d kernels", llama);
    cr_assert_eq(gemma, 7, "gemma2 layer: %d kernels", gemma);
}

/* Fusion rule 7: qwen3's and gemma3's per-head q/k norms each join their rope's row kernel (with
 * k's cache write): 3 kernels fewer a layer than the norm, rope and write apart (qwen3 10 -> 7,
 * gemma3 12 -> 9). Gemma's embedding scale is the lookup's epilogue: the kernels outside the layers
 * (lookup, head, argmax) are llama's 3. The f64 tests above check the numbers of these plans. */
Test(model_arch, head_norms_and_embedding_scale_fuse)
{
    if (!tu_backend_present(ctx, "cpu")) cr_skip("no cpu backend");
    int rest[4];
    int k[4] = {layer_kernels_rest(biased, &rest[0]), layer_kernels_rest(qwen3, &rest[1]),
                layer_kernels_rest(gemma2, &rest[2]), layer_kernels_rest(gemma3, &rest[3])};
    cr_log_info("kernels a layer: llama %d, qwen3 %d, gemma2 %d, gemma3 %d; outside: %d %d %d %d", k[0], k[1], k[2], k[3],
                rest[0], rest[1], rest[2], rest[3]);
    cr_assert_eq(k[1], 7, "qwen3 layer: %d kernels", k[1]);
    cr_assert_eq(k[3], 9, "gemma3 layer: %d kernels", k[3]);
    for (int i = 1; i < 4; i++) cr_assert_eq(rest[i], rest[0], "model %d: %d kernels outside the layers, llama %d", i, rest[i], rest[0]);
    int g1 = layer_kernels(gemma1); /* gemma 1: llama's layer with a gelu gate */
    cr_assert_eq(g1, 5, "gemma layer: %d kernels", g1);
}


/* Partial rotary (Phi-4-mini: rope.dimension_count 96 of head 128; here 8 of 16, neox): the first
 * n_rot dims of each q/k head turn with theta^(-2i/n_rot), the rest pass through; and llama with
 * 6 of 16 (normal pairs, an odd pair count) with rope_freqs of n_rot/2 values. Breaking the
 * pass-through or using head_dim in the frequencies fails these. */
static gw_model partial_phi3(void)
{
    gw_model m = phi3;
    m.n_rot = 8;
    return m;
}
static gw_model partial_llama(void)
{
    gw_model m = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96, .n_vocab = 80,
                  .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32, .n_rot = 6, .rope_freqs = true};
    return m;
}
Test(model_arch, partial_rotary_matches_f64)
{
    on_backends(partial_phi3(), KILN_DTYPE_F32);
    on_backends(partial_llama(), KILN_DTYPE_F32);
    gw_model m = partial_phi3();
    m.hidden = 256, m.ffn = 256, m.n_head = 2, m.n_kv_head = 2, m.n_rot = 96; /* 96 of 128, as Phi-4-mini */
    check_model(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
}
Test(model_arch, partial_rotary_matches_f64_on_cuda)
{
    if (!tu_backend_present(ctx, "cuda")) cr_skip("no cuda device");
    check_model(partial_phi3(), "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    check_model(partial_llama(), "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    gw_model m = partial_phi3();
    m.hidden = 256, m.ffn = 256, m.n_head = 2, m.n_kv_head = 2, m.n_rot = 96;
    check_model(m, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    m.wtype = KILN_DTYPE_Q8_0;
    check_model(m, "cuda", model_tol(KILN_DTYPE_Q8_0, "cuda"));
}
/* rope.dimension_count is read (kiln_model_info.n_rot) and refused, named, when odd or above the head. */
Test(model_arch, partial_rotary_metadata_and_refusals)
{
    gw_model m = partial_phi3();
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(mi.n_rot == 8 && mi.head_dim == 16, "n_rot %lld head_dim %lld", (long long)mi.n_rot, (long long)mi.head_dim);
    kiln_gguf_close(f);
    free(bytes);
    m = phi3;
    f = tu_model_open(ctx, &m, &bytes);
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(mi.n_rot, mi.head_dim); /* no key: the whole head */
    kiln_gguf_close(f);
    free(bytes);
    const int64_t bad[] = {7, 18};
    for (int i = 0; i < 2; i++) {
        m = partial_phi3(), m.n_rot = bad[i];
        f = tu_model_open(ctx, &m, &bytes);
        kiln_graph *g = NULL;
        cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_UNSUPPORTED, "n_rot %lld", (long long)bad[i]);
        cr_assert_null(g);
        cr_assert(strstr(kiln_ctx_error(ctx), "phi3.rope.dimension_count"), "%s", kiln_ctx_error(ctx));
        kiln_gguf_close(f);
        free(bytes);
    }
}

/* phi3 longrope (Phi-3.5-mini, Phi-3-128k, Phi-4-mini): per-pair factors dividing the angles, the
 * long ones when the plan's context (32) exceeds rope.scaling.original_context_length (16 here;
 * 64: the short ones), and rope.scaling.attn_factor times the rotated q/k dims: folded into the
 * score scale with every dim rotated, a q multiplier with partial rotary (Phi-4-mini: 96 of 128;
 * here 8 of 16). Using the other factor set, or leaving the factor out, fails these. */
static gw_model longrope_phi3(int64_t orig, int64_t n_rot)
{
    gw_model m = phi3;
    m.longrope = true, m.n_ctx_orig = orig, m.rope_attn_factor = 1.19f, m.n_rot = n_rot;
    return m;
}
Test(model_arch, phi3_longrope_long_factors_match_f64) { on_backends(longrope_phi3(16, 0), KILN_DTYPE_F32); }
Test(model_arch, phi3_longrope_short_factors_partial_rotary_match_f64)
{
    on_backends(longrope_phi3(64, 8), KILN_DTYPE_F32);
    check_model(longrope_phi3(16, 8), "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
}
Test(model_arch, phi3_longrope_matches_f64_on_cuda)
{
    if (!tu_backend_present(ctx, "cuda")) cr_skip("no cuda device");
    check_model(longrope_phi3(16, 0), "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    check_model(longrope_phi3(64, 8), "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
}

/* What the loader reads for a longrope file, and the longrope tensors it refuses: on an
 * architecture llama.cpp does not read them for, one without the other, beside rope_freqs. */
Test(model_arch, longrope_metadata_and_refusals)
{
    gw_model m = longrope_phi3(16, 8);
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(mi.longrope && mi.n_ctx_orig == 16 && mi.rope_attn_factor == 1.19f && mi.n_rot == 8);
    kiln_gguf_close(f);
    free(bytes);
    m = phi3;
    f = tu_model_open(ctx, &m, &bytes);
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(!mi.longrope && mi.n_ctx_orig == mi.n_ctx_train && mi.rope_attn_factor == 1.0f);
    kiln_gguf_close(f);
    free(bytes);
    struct { gw_model m; const char *rename, *want; } bad[3] = {
        {biased, NULL, "rope_factors_long.weight"},                       /* llama: not read there */
        {longrope_phi3(16, 0), "rope_factors_short.weight", "alone"},     /* one of the two */
        {longrope_phi3(16, 0), NULL, "rope_freqs"},                       /* with rope_freqs */
    };
    bad[0].m.longrope = true;
    bad[2].m.rope_freqs = true;
    for (int i = 0; i < 3; i++) {
        gw *w = gw_model_new(&bad[i].m);
        size_t n;
        bytes = gw_bytes(w, &n);
        gw_free(w);
        if (bad[i].rename) { /* "rope_factors_short.weight" -> "rope_factors_xhort.weight": then unused */
            uint8_t *p = NULL;
            for (size_t j = 0; !p && j + 25 <= n; j++) p = memcmp(bytes + j, bad[i].rename, 25) ? NULL : bytes + j;
            cr_assert(p);
            p[13] = 'x';
        }
        cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert_eq(kiln_model_info_get(f, &mi), KILN_ERR_UNSUPPORTED, "case %d", i);
        cr_assert(strstr(kiln_ctx_error(ctx), bad[i].want), "case %d: %s", i, kiln_ctx_error(ctx));
        cr_log_info("%s", kiln_ctx_error(ctx));
        kiln_gguf_close(f);
        free(bytes);
    }
}

/* What the loader reads for the new architectures, and what it refuses by name. */
Test(model_arch, gemma_and_phi3_metadata_and_refusals)
{
    gw_model m = gemma2;
    m.n_layer = 46; /* llama.cpp's gemma 2 27B: scores scaled by 1/sqrt(hidden / n_head), not head_dim */
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_float_eq(mi.attn_scale, 1.0f / sqrtf(16.0f), 1e-7f);
    cr_assert(mi.embd_scale && mi.post_norms && mi.gelu_gate && !mi.fused_qkv && mi.swa_pattern == 2);
    cr_assert(mi.attn_softcap == 2.0f && mi.final_softcap == 3.0f && mi.sliding_window == 4 && mi.swa_theta == 0.0f);
    kiln_gguf_close(f);
    free(bytes);
    m = gemma2, m.window = 0, m.attn_softcap = 0, m.final_softcap = 0;
    f = tu_model_open(ctx, &m, &bytes);
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(mi.attn_softcap == 50.0f && mi.final_softcap == 30.0f && mi.sliding_window == 4096);
    cr_assert_float_eq(mi.attn_scale, 1.0f / sqrtf(32.0f), 1e-7f);
    kiln_gguf_close(f);
    free(bytes);
    m = phi3;
    f = tu_model_open(ctx, &m, &bytes);
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(mi.fused_qkv && !mi.gelu_gate && mi.swa_pattern == 0 && mi.sliding_window == 7 && mi.attn_softcap == 0);
    kiln_gguf_close(f);
    free(bytes);
    /* a soft-cap key on an architecture llama.cpp does not cap (llama): refused with its value */
    m = biased, m.attn_softcap = 50.0f;
    f = tu_model_open(ctx, &m, &bytes);
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "attn_logit_softcapping"), "%s", kiln_ctx_error(ctx));
    kiln_gguf_close(f);
    free(bytes);
}

/* yarn (Qwen2.5/Qwen3 long-context files, llama with rope.scaling.type yarn): pair i's angle is
 * ggml's rope_yarn mix of the scaled and unscaled angle over the correction dims of beta 32 / 1 at
 * rope.scaling.original_context_length, and the rotated dims times 1 + 0.1 ln(factor) (and any
 * rope.scaling.attn_factor). Base 100 and an original context of 256 put the ramp across the 8
 * pairs of a 16-wide head (pair 0 unscaled, 7 fully scaled), so reading yarn as linear scaling, or
 * leaving out the mscale, fails these. */
static gw_model yarn_model(const char *arch, float factor, int64_t n_rot, float attn_factor)
{
    gw_model m = biased;
    m.arch = arch, m.out_bias = m.ffn_bias = false, m.qkv_bias = strcmp(arch, "qwen2") == 0;
    m.yarn = true, m.rope_scale = factor, m.theta = 100.0f, m.n_ctx_orig = 256, m.n_rot = n_rot;
    m.rope_attn_factor = attn_factor;
    return m;
}
Test(model_arch, qwen2_yarn_matches_f64) { on_backends(yarn_model("qwen2", 4.0f, 0, 0), KILN_DTYPE_F32); }
Test(model_arch, llama_yarn_rope_freqs_partial_attn_factor_match_f64)
{
    gw_model m = yarn_model("llama", 8.0f, 12, 1.1f);
    m.rope_freqs = true;
    on_backends(m, KILN_DTYPE_F32);
    m = yarn_model("qwen3", 2.5f, 0, 0);
    m.wtype = KILN_DTYPE_Q8_0;
    check_model(m, "cpu", model_tol(KILN_DTYPE_Q8_0, "cpu"));
}
Test(model_arch, yarn_matches_f64_on_cuda)
{
    if (!tu_backend_present(ctx, "cuda")) cr_skip("no cuda device");
    check_model(yarn_model("qwen2", 4.0f, 0, 0), "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    check_model(yarn_model("llama", 8.0f, 12, 1.1f), "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
}

/* What the loader reads for yarn, and what it refuses: yarn on gemma (unscaled local layers) and
 * phi3, a yarn key these architectures do not read in llama.cpp. */
Test(model_arch, yarn_metadata_and_refusals)
{
    gw_model m = yarn_model("qwen2", 4.0f, 0, 1.25f);
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    float want = 1.25f * (1.0f + 0.1f * logf(4.0f));
    cr_assert(mi.yarn && mi.rope_scale == 4.0f && mi.n_ctx_orig == 256 && mi.yarn_beta_fast == 32.0f &&
                  mi.yarn_beta_slow == 1.0f && fabsf(mi.rope_attn_factor - want) < 1e-6f,
              "yarn %d scale %g orig %lld mscale %g (want %g)", mi.yarn, mi.rope_scale, (long long)mi.n_ctx_orig,
              mi.rope_attn_factor, want);
    kiln_gguf_close(f);
    free(bytes);
    struct { gw_model m; const char *key; const char *want; } bad[3] = {
        {yarn_model("gemma2", 4.0f, 0, 0), NULL, "not for gemma2"},
        {yarn_model("phi3", 4.0f, 0, 0), NULL, "not for phi3"},
        {yarn_model("qwen2", 4.0f, 0, 0), "qwen2.rope.scaling.yarn_beta_fast", "qwen2.rope.scaling.yarn_beta_fast"},
    };
    bad[0].m.n_kv_head = bad[0].m.n_head; /* shapes gemma2 takes otherwise */
    bad[1].m = phi3, bad[1].m.yarn = true, bad[1].m.rope_scale = 4.0f;
    for (int i = 0; i < 3; i++) {
        gw *w = gw_model_new(&bad[i].m);
        if (bad[i].key) gw_kv_f32(w, bad[i].key, 16.0f);
        size_t n;
        bytes = gw_bytes(w, &n);
        gw_free(w);
        cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
        kiln_graph *g = NULL;
        cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_ERR_UNSUPPORTED, "case %d: %s", i, kiln_ctx_error(ctx));
        cr_assert_null(g);
        cr_assert(strstr(kiln_ctx_error(ctx), bad[i].want), "case %d: %s", i, kiln_ctx_error(ctx));
        kiln_gguf_close(f);
        free(bytes);
    }
}

/* ---------------------------------------------------------------- mixtures of experts */

/* Every token's logits of MoE model m on backend be against the f64 forward (llama.cpp's
 * build_moe_ffn), and against kiln's dense form (every expert on every token, weighted 0 where not
 * routed) within the same bound: the default runs only the routed experts (moe_matmul), in fewer
 * kernels. Routing is discrete: where the f64 router's k-th and (k+1)-th logits lie within
 * 1e-3 of each other, an f32 forward may keep the other expert, so such a draw is put aside and the
 * next seed tried (a draw lands that close about 1 time in 100 here; 8 tries). */
static void check_moe_form(gw_model m, const char *be, double tol, bool dense_too)
{
    if (be && !tu_backend_present(ctx, be)) cr_skip("backend %s absent", be);
    for (int attempt = 0; attempt < 8; attempt++) {
        m.seed = tu_next();
        uint8_t *bytes;
        kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
        int32_t ids[N_ALL];
        for (int i = 0; i < N_ALL; i++) ids[i] = (int32_t)tu_randint(0, m.n_vocab);
        char err[256];
        int64_t V = 0;
        double gap = 0;
        double *want = mref_logits_gap(f, ids, N_ALL, MAX_CTX, &V, &gap, err, sizeof err);
        cr_assert(want, "f64 forward: %s", err);
        cr_assert(gap > 0 && gap < INFINITY, "the f64 forward saw no router (gap %g)", gap);
        if (gap < 1e-3) {
            cr_log_info("%s seed %llu: router gap %.2g, drawn again", m.arch, (unsigned long long)m.seed, gap);
            free(want), kiln_gguf_close(f), free(bytes);
            continue;
        }
        double *got = malloc((size_t)(N_ALL * V) * sizeof *got), *dense = malloc((size_t)(N_ALL * V) * sizeof *dense);
        int kr = 0, kd = 0;
        run_kiln_moe(f, be, ids, V, got, &kr, false);
        char what[160];
        snprintf(what, sizeof what, "%s (%d of %d experts, %s weights) on %s, seed %llu", m.arch, m.n_expert_used,
                 m.n_expert, kiln_dtype_name(m.wtype), be ? be : "auto", (unsigned long long)tu_seed());
        double e = tu_compare(what, got, want, N_ALL * V, tol), ed = NAN;
        if (dense_too) {
            run_kiln_moe(f, be, ids, V, dense, &kd, true);
            char wd[200];
            snprintf(wd, sizeof wd, "%s: routed experts against the dense form", what);
            ed = tu_compare(wd, got, dense, N_ALL * V, tol);
            cr_assert(kr < kd, "%s: %d kernels routed, %d dense", what, kr, kd);
        }
        cr_log_info("%s: NMSE %.3g (bound %.3g), against dense %.3g, router gap %.2g, kernels %d (dense %d)", what, e,
                    tol, ed, gap, kr, kd);
        free(got), free(dense), free(want), kiln_gguf_close(f), free(bytes);
        return;
    }
    cr_assert_fail("%s: 8 draws with routers within 1e-3 of a tie", m.arch);
}

static void check_moe(gw_model m, const char *be, double tol) { check_moe_form(m, be, tol, true); }

/* Mixtral: llama with experts (norm_w: the kept weights over their sum), dense layers' ffn width. */
static const gw_model mixtral = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 32,
                                 .n_vocab = 48, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F32,
                                 .n_expert = 4, .n_expert_used = 2, .router_scale = 4};

Test(model_arch, llama_experts_match_f64)
{
    check_moe(mixtral, "ref", model_tol(KILN_DTYPE_F32, "ref"));
    check_moe(mixtral, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
}

/* qwen2moe: attention biases, weights as the softmax gives them (no renormalization), a shared
 * expert of its own width gated by sigmoid(h . ffn_gate_inp_shexp). */
Test(model_arch, qwen2moe_shared_expert_matches_f64)
{
    gw_model m = mixtral;
    m.arch = "qwen2moe", m.n_expert = 6, m.n_expert_used = 2, m.ffn = 64, m.ffn_exp = 32, m.ffn_shexp = 48;
    check_moe(m, "ref", model_tol(KILN_DTYPE_F32, "ref"));
    check_moe(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
    m.ffn_exp = 0, m.ffn_shexp = 0; /* llama.cpp's defaults: ffn / used per expert, ffn for the shared one */
    check_moe(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
}

/* qwen3moe: q/k norms, renormalized weights, 8 experts of which 3 routed; q8_0 stacks on ref (which
 * reads them dequantized, as the f64 forward: the cpu's int8 activations could route otherwise). */
Test(model_arch, qwen3moe_matches_f64)
{
    gw_model m = mixtral;
    m.arch = "qwen3moe", m.n_expert = 8, m.n_expert_used = 3, m.ffn = 96, m.ffn_exp = 32;
    check_moe(m, "cpu", model_tol(KILN_DTYPE_F32, "cpu"));
    m.wtype = KILN_DTYPE_Q8_0;
    check_moe(m, "ref", model_tol(KILN_DTYPE_Q8_0, "ref"));
}

/* A whole MoE model on vulkan (lavapipe in CI): moe_matmul's GPU kernel (lower_moe.c) with the
 * routing ops' row kernels, prefill and decode, against the f64 forward (the dense form is left to
 * the cpu cases: its 3x the kernels took lavapipe over 10 minutes to compile on a loaded machine). */
Test(model_arch, qwen3moe_matches_f64_on_vulkan, .timeout = 600)
{
    gw_model m = mixtral;
    m.arch = "qwen3moe", m.n_expert = 8, m.n_expert_used = 3, m.ffn = 96, m.ffn_exp = 32;
    check_moe_form(m, "vulkan", model_tol(KILN_DTYPE_F32, "vulkan"), false);
}

/* What the loader reads for experts, and what it refuses: more experts used than there are, a dense
 * ffn tensor beside the experts, an expert width key llama's loader does not read. */
Test(model_arch, moe_metadata_and_refusals)
{
    gw_model m = mixtral;
    m.arch = "qwen2moe", m.n_expert = 6, m.n_expert_used = 2, m.ffn = 64, m.ffn_shexp = 40;
    uint8_t *bytes;
    kiln_gguf *f = tu_model_open(ctx, &m, &bytes);
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(mi.n_expert == 6 && mi.n_expert_used == 2 && mi.ffn_exp == 32 && mi.ffn_shexp == 40 && !mi.expert_norm,
              "experts %lld used %lld ffn_exp %lld shexp %lld norm %d", (long long)mi.n_expert,
              (long long)mi.n_expert_used, (long long)mi.ffn_exp, (long long)mi.ffn_shexp, mi.expert_norm);
    kiln_gguf_close(f);
    free(bytes);
    f = tu_model_open(ctx, &mixtral, &bytes);
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(mi.n_expert == 4 && mi.ffn_exp == 32 && mi.ffn_shexp == 0 && mi.expert_norm);
    kiln_gguf_close(f);
    free(bytes);
    struct { int used; const char *tensor; const char *want; kiln_status st; } bad[4] = {
        {5, NULL, "expert_used_count", KILN_ERR_SHAPE},
        {2, "blk.1.ffn_gate.weight", "blk.1.ffn_gate.weight", KILN_ERR_UNSUPPORTED},
        {2, NULL, "llama.expert_feed_forward_length", KILN_ERR_UNSUPPORTED}, /* llama.cpp's llama reads ffn */
        {2, NULL, "convert the model again", KILN_ERR_UNSUPPORTED}, /* an old Mixtral file: a tensor per expert */
    };
    for (int i = 0; i < 4; i++) {
        gw_model b = mixtral;
        b.n_expert_used = bad[i].used;
        if (i == 2) b.ffn_exp = 32;
        if (i == 3) b.n_expert = 0, b.n_expert_used = 0; /* dense, then the old layout's keys and tensors */
        gw *w = gw_model_new(&b);
        static float z[64 * 32];
        if (i == 1) gw_tensor(w, bad[i].tensor, 0, 2, (int64_t[]){32, 64}, z, sizeof z);
        if (i == 3) {
            gw_kv_u32(w, "llama.expert_count", 4);
            gw_kv_u32(w, "llama.expert_used_count", 2);
            gw_tensor(w, "blk.0.ffn_gate_inp.weight", 0, 2, (int64_t[]){4, 64}, z, 4 * 64 * sizeof(float));
            gw_tensor(w, "blk.0.ffn_gate.0.weight", 0, 2, (int64_t[]){32, 64}, z, sizeof z);
        }
        size_t n;
        bytes = gw_bytes(w, &n);
        gw_free(w);
        cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
        kiln_graph *g = NULL;
        cr_assert_eq(kiln_model_build(f, NULL, &g), bad[i].st, "case %d: %s", i, kiln_ctx_error(ctx));
        cr_assert_null(g);
        cr_assert(strstr(kiln_ctx_error(ctx), bad[i].want), "case %d: %s", i, kiln_ctx_error(ctx));
        kiln_gguf_close(f);
        free(bytes);
    }
}

/* On a GPU: every op of a MoE layer has a GPU kernel (moe_route and scale_rows in the row template,
 * moe_matmul in lower_moe.c), so auto placement with cuda can keep a layer on the device. Skips
 * without a cuda device. */
Test(model_arch, moe_matches_f64_with_cuda_placement)
{
    if (!tu_backend_present(ctx, "cuda")) cr_skip("no cuda device");
    gw_model m = mixtral;
    check_moe(m, NULL, model_tol(KILN_DTYPE_F32, "cuda"));
    m.arch = "qwen2moe", m.n_expert = 6, m.ffn = 64, m.ffn_exp = 32, m.ffn_shexp = 48;
    check_moe(m, NULL, model_tol(KILN_DTYPE_F32, "cuda"));
}

/* Every kernel of a MoE model on cuda (moe_matmul's GPU kernel included), f32 weights (block
 * stacks: test_ops; the GPU's int8 activations could route a q8_0 router otherwise than f64). */
Test(model_arch, moe_matches_f64_on_cuda)
{
    gw_model m = mixtral;
    m.arch = "qwen3moe", m.n_expert = 8, m.n_expert_used = 3, m.ffn = 96, m.ffn_exp = 32;
    check_moe(m, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
    m.arch = "qwen2moe", m.n_expert = 6, m.n_expert_used = 2, m.ffn = 64, m.ffn_shexp = 48;
    check_moe(m, "cuda", model_tol(KILN_DTYPE_F32, "cuda"));
}
