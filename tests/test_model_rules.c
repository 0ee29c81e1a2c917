/* The loader's rule: a GGUF model is computed exactly as its architecture defines, or refused with
 * one line naming the tensor or key, and nothing is built. One small file per refusal kind (a
 * tensor the graph would not use, an unknown key under "<arch>.", a feature key at a value that
 * turns it on, a missing rms epsilon, an unsupported rotary scaling type, a tensor type kiln
 * cannot run), plus the neutral values that must still load. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "support/gguf_writer.h"

static kiln_ctx *ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 1, .quiet = true}, &ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(ctx); }
TestSuite(model_rules, .init = setup, .fini = teardown);

static const gw_model base = {.arch = "llama", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 96,
                              .n_vocab = 40, .n_ctx = 64, .wtype = KILN_DTYPE_F32, .embtype = KILN_DTYPE_F16, .seed = 3};

/* Changes the ggml type id of tensor `name` in a file's bytes (the data stays where it is). */
static void set_type(uint8_t *bytes, size_t n, const char *name, uint32_t type)
{
    size_t len = strlen(name);
    for (size_t i = 8; i + len + 4 <= n; i++) {
        uint64_t l;
        memcpy(&l, bytes + i - 8, 8);
        if (l != len || memcmp(bytes + i, name, len) != 0) continue;
        uint32_t rank;
        memcpy(&rank, bytes + i + len, 4);
        memcpy(bytes + i + len + 4 + 8 * rank, &type, 4);
        return;
    }
    cr_assert_fail("no tensor info '%s'", name);
}

/* Builds w's file; model build and info must fail with status want and a one-line message that
 * contains `names` (and `also`, when not NULL); no graph comes out. */
static void expect_refused(gw *w, uint32_t patch_type, kiln_status want, const char *names, const char *also)
{
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    if (patch_type) set_type(bytes, n, "blk.0.attn_q.weight", patch_type);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph *g = (kiln_graph *)&g; /* not NULL: the builder must clear it */
    kiln_status s = kiln_model_build(f, NULL, &g);
    cr_assert_eq(s, want, "%s: got %s: %s", names, kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert_null(g);
    const char *e = kiln_ctx_error(ctx);
    cr_assert(strstr(e, names), "message does not name '%s': %s", names, e);
    cr_assert(!also || strstr(e, also), "message does not say '%s': %s", also, e);
    cr_assert_null(strchr(e, '\n'), "not one line: %s", e);
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), want);
    kiln_gguf_close(f);
    free(bytes);
}

static gw *model(const gw_model *m) { return gw_model_new(m); }

Test(model_rules, unused_tensor_is_refused_by_name)
{
    gw *w = model(&base);
    gw_tensor(w, "blk.1.attn_sinks.weight", 0, 1, (int64_t[]){4}, (float[4]){1, 2, 3, 4}, 16);
    expect_refused(w, 0, KILN_ERR_UNSUPPORTED, "blk.1.attn_sinks.weight", "not used");
}

/* qwen2's loader (as llama.cpp's) takes no output-projection bias: a qwen2 file carrying one is
 * refused, where llama takes it. */
Test(model_rules, bias_the_architecture_does_not_take_is_refused)
{
    gw_model m = base;
    m.arch = "qwen2", m.out_bias = true;
    expect_refused(model(&m), 0, KILN_ERR_UNSUPPORTED, "blk.0.attn_output.bias", "not used");
}

/* An optional tensor is used in every layer or none: one only in layer 1 is refused. */
Test(model_rules, bias_in_some_layers_only_is_refused)
{
    gw *w = model(&base);
    float b[64] = {0.5f};
    gw_tensor(w, "blk.1.ffn_down.bias", 0, 1, (int64_t[]){64}, b, sizeof b);
    expect_refused(w, 0, KILN_ERR_UNSUPPORTED, "blk.1.ffn_down.bias", NULL);
}

Test(model_rules, unknown_arch_key_is_refused_by_name)
{
    gw *w = model(&base);
    gw_kv_f32(w, "llama.attention.temperature_scale", 0.5f);
    expect_refused(w, 0, KILN_ERR_UNSUPPORTED, "llama.attention.temperature_scale", NULL);
}

Test(model_rules, unknown_top_level_key_is_refused_by_name)
{
    gw *w = model(&base);
    gw_kv_str(w, "adapter.type", "lora");
    expect_refused(w, 0, KILN_ERR_UNSUPPORTED, "adapter.type", NULL);
}

Test(model_rules, feature_key_turned_on_is_refused_with_its_value)
{
    const char *keys[4] = {"llama.attn_logit_softcapping", "llama.final_logit_softcapping", "llama.logit_scale",
                           "llama.expert_count"};
    for (int k = 0; k < 4; k++) {
        gw *w = model(&base);
        if (k == 3) gw_kv_u32(w, keys[k], 8);
        else gw_kv_f32(w, keys[k], k == 2 ? 0.5f : 30.0f);
        expect_refused(w, 0, KILN_ERR_UNSUPPORTED, keys[k], k == 3 ? "= 8: a mixture-of-experts model" : NULL);
    }
}

/* Mixture-of-experts architectures kiln does not build (phimoe, granitemoe) are named as such; a
 * dense architecture's file asking for experts is refused with the key. */
Test(model_rules, moe_architecture_is_refused_as_such)
{
    const char *archs[2] = {"phimoe", "granitemoe"};
    for (int k = 0; k < 2; k++) {
        gw *w = gw_new(3, 0);
        gw_kv_str(w, "general.architecture", archs[k]);
        gw_kv_u32(w, "phimoe.expert_count", 8);
        expect_refused(w, 0, KILN_ERR_UNSUPPORTED, archs[k], "a mixture-of-experts architecture kiln does not build");
    }
    gw_model m = base;
    m.arch = "qwen2";
    gw *w = model(&m);
    gw_kv_u32(w, "qwen2.expert_count", 8);
    gw_kv_u32(w, "qwen2.expert_used_count", 2);
    expect_refused(w, 0, KILN_ERR_UNSUPPORTED, "qwen2.expert_count", "builds no mixture of experts");
}

Test(model_rules, missing_rms_eps_is_refused)
{
    gw_model m = base;
    m.no_eps = true;
    expect_refused(model(&m), 0, KILN_ERR_NAME, "llama.attention.layer_norm_rms_epsilon", NULL);
}

Test(model_rules, unsupported_rope_scaling_type_is_refused)
{
    const char *types[3] = {"dynamic", "longrope", "su"}; /* yarn is built (test_model_arch) */
    for (int k = 0; k < 3; k++) {
        gw *w = model(&base);
        gw_kv_str(w, "llama.rope.scaling.type", types[k]);
        expect_refused(w, 0, KILN_ERR_UNSUPPORTED, "llama.rope.scaling.type", types[k]);
    }
}

/* q8_1 (ggml id 9) is an activation format kiln has no dtype for: the tensor and type are named. */
Test(model_rules, unsupported_tensor_type_is_refused_by_name)
{
    expect_refused(model(&base), 9, KILN_ERR_UNSUPPORTED, "blk.0.attn_q.weight", "q8_1");
}

/* Keys at their neutral values, informational keys and other prefixes load. */
Test(model_rules, neutral_values_load)
{
    gw *w = model(&base);
    gw_kv_u32(w, "llama.expert_count", 0);
    gw_kv_f32(w, "llama.logit_scale", 1.0f);
    gw_kv(w, "llama.attention.causal", KILN_GGUF_BOOL, &(uint8_t){1});
    gw_kv_str(w, "llama.rope.scaling.type", "none");
    gw_kv_f32(w, "llama.rope.scaling.factor", 8.0f); /* ignored when the type is none, as in llama.cpp */
    gw_kv_u32(w, "llama.vocab_size", 40);
    gw_kv_u32(w, "general.file_type", 0);
    gw_kv_str(w, "quantize.imatrix.file", "x.dat");
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK);
    kiln_graph *g;
    cr_assert_eq(kiln_model_build(f, NULL, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    kiln_gguf_close(f);
    free(bytes);
}

Test(model_rules, vocab_size_must_match_the_embedding)
{
    gw *w = model(&base);
    gw_kv_u32(w, "llama.vocab_size", 41);
    expect_refused(w, 0, KILN_ERR_SHAPE, "llama.vocab_size", "40 rows");
}
