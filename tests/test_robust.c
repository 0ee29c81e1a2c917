/* Errors where the mistake is made (issue #12): a block-dtype state refused by kiln_state,
 * attention whose queries' positions disagree with the kv_scatter positions (ref, cpu, vulkan), the
 * rope head_dim message, an unknown KILN_CPU_ISA named with the accepted values; kiln run
 * --check-finite naming a NaN. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/kiln.h"

static kiln_graph *graph(void)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    return g;
}

/* States take q8_0 (paged KV pools, head_dim a multiple of 32) and no other block dtype; a q8_0
 * state is refused by contiguous attention (only kv_scatter and paged attention read it). */
Test(robust, state_refuses_block_dtypes)
{
    const kiln_dtype bad[] = {KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
    for (int i = 0; i < 3; i++) {
        kiln_graph *g = graph();
        cr_expect_eq(kiln_state(g, "k", bad[i], 3, (kiln_dim[]){2, 8, 256}), KILN_NODE_NONE);
        cr_expect_eq(kiln_graph_status(g), KILN_ERR_DTYPE);
        cr_expect(strstr(kiln_graph_error(g), kiln_dtype_name(bad[i])) && strstr(kiln_graph_error(g), "state 'k'"), "%s",
                  kiln_graph_error(g));
        kiln_graph_free(g);
    }
    kiln_graph *g = graph();
    cr_expect_neq(kiln_state(g, "k", KILN_DTYPE_F16, 3, (kiln_dim[]){2, 8, 256}), KILN_NODE_NONE);
    kiln_graph_free(g);
    g = graph();
    cr_expect_eq(kiln_state(g, "k", KILN_DTYPE_Q8_0, 3, (kiln_dim[]){2, 8, 48}), KILN_NODE_NONE);
    cr_expect_eq(kiln_graph_status(g), KILN_ERR_SHAPE);
    cr_expect(strstr(kiln_graph_error(g), "multiple of 32"), "%s", kiln_graph_error(g));
    kiln_graph_free(g);
    g = graph();
    kiln_node k = kiln_state(g, "k", KILN_DTYPE_Q8_0, 3, (kiln_dim[]){2, 8, 64});
    cr_expect_neq(k, KILN_NODE_NONE, "%s", kiln_graph_error(g));
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 2, 64});
    cr_expect_eq(kiln_attention(g, q, k, k, 8, 0), KILN_NODE_NONE);
    cr_expect(strstr(kiln_graph_error(g), "q8_0") && strstr(kiln_graph_error(g), "f32, f16 or bf16"), "%s", kiln_graph_error(g));
    kiln_graph_free(g);
}

Test(robust, rope_error_names_head_dim)
{
    kiln_graph *g = graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 4, 7});
    kiln_rope(g, x, kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){1}), KILN_ROPE_NEOX, 1e4f);
    cr_expect(strstr(kiln_graph_error(g), "head_dim 7 must be even"), "%s", kiln_graph_error(g));
    kiln_graph_free(g);
}

/* x -> kv_scatter at pos -> attention over n_kv: pos = 5 with n_kv = 9 is an error, 8 is fine. */
static void pos_vs_n_kv(const char *backend)
{
    kiln_ctx *ctx = NULL;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g = graph();
    kiln_dim T = kiln_sym(g, "n_tok", 1), NKV = kiln_sym(g, "n_kv", 16);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, 2, 8});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T);
    kiln_node k = kiln_kv_scatter(g, kiln_state(g, "k", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 16, 8}), q, pos);
    kiln_node v = kiln_kv_scatter(g, kiln_state(g, "v", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 16, 8}), q, pos);
    cr_assert_eq(kiln_graph_status(g), KILN_ERR_SHAPE, "q has 2 heads, the cache 1: %s", kiln_graph_error(g));
    kiln_graph_free(g);
    g = graph();
    T = kiln_sym(g, "n_tok", 1), NKV = kiln_sym(g, "n_kv", 16);
    q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, 1, 8});
    pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T);
    k = kiln_kv_scatter(g, kiln_state(g, "k", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 16, 8}), q, pos);
    v = kiln_kv_scatter(g, kiln_state(g, "v", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 16, 8}), q, pos);
    kiln_output(g, kiln_attention(g, q, k, v, NKV, 0), "y");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = backend}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float qv[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    for (int32_t pv = 5; pv <= 8; pv += 3) {
        kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = 9}, {.name = "q", .data = qv, .bytes = sizeof qv},
                            {.name = "pos", .data = &pv, .bytes = 4}, {.name = "y", .data = y, .bytes = sizeof y}};
        kiln_status s = kiln_run(p, b, 5);
        if (pv == 5) {
            cr_expect_eq(s, KILN_ERR_BINDING, "%s: pos 5 with n_kv 9 accepted", backend);
            cr_expect(strstr(kiln_ctx_error(ctx), "n_kv = 9") && strstr(kiln_ctx_error(ctx), "= 5"), "%s", kiln_ctx_error(ctx));
        } else {
            cr_expect_eq(s, KILN_OK, "%s: pos 8 with n_kv 9: %s", backend, kiln_ctx_error(ctx));
        }
    }
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(robust, attention_pos_disagreement_ref) { pos_vs_n_kv("ref"); }
Test(robust, attention_pos_disagreement_cpu) { pos_vs_n_kv("cpu"); }
Test(robust, attention_pos_disagreement_vulkan) /* device backends: checked on the host before upload */
{
    kiln_ctx *ctx = NULL;
    kiln_backend_info bi;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    for (int i = 0; i < kiln_backend_count(ctx); i++)
        if (kiln_backend_get(ctx, i, &bi) == KILN_OK && !strcmp(bi.name, "vulkan") && !bi.available) {
            kiln_ctx_free(ctx);
            cr_skip("no Vulkan device: %s", bi.detail);
        }
    kiln_ctx_free(ctx);
    pos_vs_n_kv("vulkan");
}

Test(robust, unknown_cpu_isa_is_warned)
{
    char self[4096], cmd[8192];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1); /* kiln sits beside this test */
    cr_assert(len > 0);
    self[len] = 0;
    *strrchr(self, '/') = 0;
    snprintf(cmd, sizeof cmd, "KILN_CPU_ISA=avx3 '%s/kiln' info 2>&1", self);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char out[8192] = "";
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    pclose(f);
    cr_expect(strstr(out, "KILN_CPU_ISA='avx3'") && strstr(out, "scalar, avx2, avx512, best"), "%s", out);
}

/* Runs `kiln ARGS` (the binary beside this test), returns its exit code and stdout in out. */
static int kiln_cmd(const char *args, char *out, size_t n)
{
    char self[4096], cmd[8192];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(len > 0);
    self[len] = 0;
    *strrchr(self, '/') = 0;
    snprintf(cmd, sizeof cmd, "'%s/kiln' %s 2>/dev/null", self, args);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t k = fread(out, 1, n - 1, f);
    out[k] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(robust, cli_check_json_and_exit_codes)
{
    static char out[1 << 16];
    cr_expect_eq(kiln_cmd("check --backend cpu --op silu --quick --seed 77 --json", out, sizeof out), 0, "%s", out);
    cr_expect(!strncmp(out, "{\"ok\": true, \"seed\": 77, \"seconds\": ", 36) &&
                  strstr(out, "\"note\": \"\", \"results\": [{\"op\": \"silu\""),
              "the JSON carries the seed and the note: %s", out);
    cr_expect_eq(kiln_cmd("check --op silu --quick", out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "silu") && strstr(out, "OK"), "%s", out);
    cr_expect_eq(kiln_cmd("check --bogus", out, sizeof out), 2);
    cr_expect_eq(kiln_cmd("check --op nope", out, sizeof out), 2);
    cr_expect_eq(kiln_cmd("check --backend nope", out, sizeof out), 2);
    setenv("KILN_FAULT_INJECT", "cpu_softmax_off_by_one", 1);
    cr_expect_eq(kiln_cmd("check --backend cpu --op softmax --quick --failures", out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "FAIL"), "%s", out);
    unsetenv("KILN_FAULT_INJECT");
}

/* kiln_compile generates random weights into its own copy: the graph stays lazy, and a plan from
 * the lazy graph computes what a plan from the same graph with generated bytes computes. */
Test(robust, compile_materializes_random_weights_in_the_plan_only)
{
    kiln_ctx *ctx = NULL;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g = graph();
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 256});
    kiln_node w = kiln_weight_random(g, "w", KILN_DTYPE_Q4_K, 2, (kiln_dim[]){64, 256}, 5, 0.1f);
    kiln_weight_random(g, "unused", KILN_DTYPE_F32, 2, (kiln_dim[]){1 << 20, 1 << 12}, 6, 1.0f); /* 16 GiB if made */
    kiln_output(g, kiln_matmul(g, x, w), "y");
    kiln_plan *p[2] = {NULL, NULL};
    float in[512], y[2][128];
    for (int i = 0; i < 512; i++) in[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = k ? "ref" : "cpu"}, &p[k]), KILN_OK, "%s",
                     kiln_ctx_error(ctx));
        kiln_binding b[] = {{.name = "x", .data = in, .bytes = sizeof in}, {.name = "y", .data = y[k], .bytes = sizeof y[k]}};
        cr_assert_eq(kiln_run(p[k], b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    }
    double num = 0, den = 0;
    for (int i = 0; i < 128; i++) num += (y[0][i] - y[1][i]) * (y[0][i] - y[1][i]), den += y[1][i] * y[1][i];
    cr_expect(den > 0 && num / den < 1e-4, "cpu vs ref NMSE %g", num / den);
    kiln_plan_free(p[0]);
    kiln_plan_free(p[1]);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* kiln run --check-finite: a NaN weight in a .kg is an exit code 1 naming the node; without the
 * flag the same graph runs (exit 0). */
Test(robust, cli_check_finite)
{
    char path[] = "/tmp/kiln_finite_XXXXXX.kg", self[4096], cmd[8192], out[4096];
    int fd = mkstemps(path, 3);
    cr_assert(fd >= 0);
    static const char kg[] = "input x f32 [2, 2]\n"
                             "weight w f32 [2, 2] data=hex:0000803f0000c07f000000400000803f\n" /* 1, NaN, 2, 1 */
                             "h = silu x\ny = matmul h w\noutput y y\n";
    cr_assert_eq(write(fd, kg, sizeof kg - 1), (ssize_t)(sizeof kg - 1));
    close(fd);
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(len > 0);
    self[len] = 0;
    *strrchr(self, '/') = 0;
    for (int guard = 0; guard < 2; guard++) {
        snprintf(cmd, sizeof cmd, "'%s/kiln' run '%s' --backend cpu%s 2>&1", self, path, guard ? " --check-finite" : "");
        FILE *f = popen(cmd, "r");
        cr_assert_not_null(f);
        size_t k = fread(out, 1, sizeof out - 1, f);
        out[k] = 0;
        int st = pclose(f);
        cr_expect_eq(WIFEXITED(st) ? WEXITSTATUS(st) : -1, guard ? 1 : 0, "%s", out);
        if (guard)
            cr_expect(strstr(out, "non-finite value: matmul 'y' (node #3) is NaN at element 0 of f32 [2, 2]") && strstr(out, "on cpu"),
                      "%s", out);
    }
    unlink(path);
}
