/* Tests of `kiln bench` (JSON with each kernel's bandwidth, decode and prefill, serve steps, the
 * layer count's reason), gen_model's usage, and the model-preset builder (its table, a tiny custom
 * stack decoding on every backend). Run as child processes (support/cli.h). Never asserts on speed. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "model/presets.h"
#include "support/cli.h"

/* --profile with --json: the plan's per-kernel report inside the bench object, each kernel's
 * achieved bandwidth = its cost-model bytes / its measured time. */
Test(cli, bench_json_profile_has_each_kernels_bandwidth, .timeout = 300)
{
    cli_out o;
    kiln_cli(&o, "bench --preset qwen2-0.5b --mode decode --layers 1 --steps 2 --ctx 8 --backend ref --wtype f32 --json --profile --no-roof");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    const char *prof = strstr(o.out, ",\"profile\":{");
    cr_assert(prof && o.out[strlen(o.out) - 2] == '}', "%s", o.out);
    int kernels = 0;
    for (const char *r = strstr(prof, "\"kind\": "); r; r = strstr(r + 1, "\"kind\": ")) {
        const char *b = strstr(r, "\"bytes\": "), *m = strstr(r, "\"measured_s\": "), *g = strstr(r, "\"achieved_gb_s\": ");
        cr_assert(b && m && g, "%s", r);
        double bytes = strtod(b + 9, NULL), meas = strtod(m + 14, NULL), gbs = strtod(g + 17, NULL);
        cr_assert(bytes > 0 && meas > 0 && gbs > 0, "kernel %d: %g bytes, %g s, %g GB/s", kernels, bytes, meas, gbs);
        cr_assert(fabs(gbs - bytes / meas / 1e9) <= 1e-3 * gbs, "kernel %d: %g GB/s, %g / %g s", kernels, gbs, bytes, meas);
        kernels++;
    }
    cr_assert_eq(kernels, (int)json_key(o.out, "kernels"), "%s", o.out);
}

Test(cli, bench_json_decode_and_prefill, .timeout = 600)
{
    const char *args[] = {
        "bench --preset qwen2-0.5b --mode decode --layers 1 --steps 3 --ctx 8 --backend ref --wtype f32 --json",
        "bench --preset qwen2-0.5b --mode prefill --layers 1 --steps 2 --tokens 4 --backend ref --json",
        "bench --preset qwen2-0.5b --mode decode --layers 2 --steps 3 --ctx 32 --json"};
    for (int i = 0; i < 3; i++) {
        cli_out o;
        kiln_cli(&o, args[i]);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args[i], o.err);
        cr_assert(o.out[0] == '{' && strstr(o.out, "\"preset\":\"qwen2-0.5b\""), "%s", o.out);
        cr_assert(json_key(o.out, "ms_per_layer_step") > 0 && json_key(o.out, "gb_per_s") > 0, "%s", o.out);
        cr_assert_eq((int)json_key(o.out, "layers"), i == 2 ? 2 : 1);
        /* weights of one layer + KV: the bytes the report divides by must be the preset's. */
        kiln_dtype wt = i == 0 ? KILN_DTYPE_F32 : KILN_DTYPE_Q8_0, kt = i == 0 ? KILN_DTYPE_F32 : KILN_DTYPE_F16;
        const kiln_preset *p = kiln_preset_find("qwen2-0.5b");
        double w = (double)kiln_preset_layer_weight_bytes(p, wt) * (i == 2 ? 2 : 1);
        cr_assert(json_key(o.out, "bytes_per_step") > w, "%s", o.out);
        cr_assert(json_key(o.out, "bytes_per_step") < w + 2.0 * (i == 2 ? 2 : 1) *
                                                             (double)kiln_preset_layer_kv_bytes(p, kt, 64), "%s", o.out);
        const char *arr = strstr(o.out, "\"step_ms\":[");
        cr_assert(arr);
        int commas = 0;
        for (const char *c = arr; *c && *c != ']'; c++)
            commas += *c == ',';
        cr_assert_eq(commas + 1, i == 1 ? 2 : 3, "%s", o.out);
    }
}

Test(presets, table_and_errors)
{
    cr_assert_eq(kiln_preset_count(), 3); /* llama-70b is found by name, not listed */
    const kiln_preset *q = kiln_preset_find("qwen2-0.5b"), *l = kiln_preset_find("llama-7b"), *b = kiln_preset_find("llama-70b");
    cr_assert(q && l && kiln_preset_find("qwen2-7b") && !kiln_preset_find("nope"));
    cr_assert(b && b->hidden == 8192 && b->n_head == 64 && b->n_kv_head == 8 && b->head_dim == 128 && b->ffn == 28672);
    cr_assert(q->hidden == 896 && q->n_head == 14 && q->n_kv_head == 2 && q->head_dim == 64 && q->ffn == 4864);
    cr_assert(l->hidden == 4096 && l->rope == KILN_ROPE_NORMAL && q->rope == KILN_ROPE_NEOX);
    /* q4_k needs in % 256 == 0: 896 falls back to q8_0, 4864 keeps q4_k. */
    cr_assert_eq(kiln_preset_wdtype_for(KILN_DTYPE_Q4_K, 896), KILN_DTYPE_Q8_0);
    cr_assert_eq(kiln_preset_wdtype_for(KILN_DTYPE_Q4_K, 4864), KILN_DTYPE_Q4_K);
    /* f32 layer of llama-7b: 4 x 4096^2 + 3 x 4096 x 11008 floats + 2 norms. */
    cr_assert_eq(kiln_preset_layer_weight_bytes(l, KILN_DTYPE_F32),
                 4 * (4u * 4096 * 4096 + 3u * 4096 * 11008 + 2u * 4096));
    /* one token over one row: 2 flops per weight + q.k and p.v over 1 row for 32 heads of 128. */
    double params = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008;
    cr_assert_float_eq(kiln_preset_layer_flops(l, 1, 1), 2 * params + 4.0 * 32 * 128, 1e-3);
    /* 3 tokens ending at row 10 see 8 + 9 + 10 rows. */
    cr_assert_float_eq(kiln_preset_layer_flops(l, 3, 10), 6 * params + 4.0 * 32 * 128 * 27, 1e-3);
    kiln_graph *g = (kiln_graph *)1;
    cr_assert_eq(kiln_preset_build(q, KILN_DTYPE_F32, 0, 16, 1, &g), KILN_ERR_INVALID_ARG);
    cr_assert_null(g);
    kiln_preset bad = *q;
    bad.n_kv_head = 3;
    cr_assert_eq(kiln_preset_build(&bad, KILN_DTYPE_F32, 1, 16, 1, &g), KILN_ERR_INVALID_ARG);
}

/* A tiny custom preset, 2 layers: states have the documented shapes, a decode step writes only
 * row pos of every cache, and ref and the default backend agree. */
Test(presets, tiny_stack_decodes_on_every_backend)
{
    const kiln_preset tiny = {.name = "tiny", .hidden = 64, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                              .ffn = 128, .rope = KILN_ROPE_NEOX, .theta = 1e4f, .eps = 1e-6f};
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(NULL, &ctx), KILN_OK);
    float y[2][64], x[64];
    uint64_t rng = 5;
    for (int i = 0; i < 64; i++)
        x[i] = kiln_preset_rngf(&rng);
    const char *bk[2] = {"ref", "auto"};
    for (int b = 0; b < 2; b++) {
        kiln_graph *g;
        cr_assert_eq(kiln_preset_build(&tiny, KILN_DTYPE_F32, 2, 8, 1, &g), KILN_OK);
        kiln_compile_options co = {.backend = bk[b]};
        kiln_plan *p;
        cr_assert_eq(kiln_compile(ctx, g, &co, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
        kiln_graph_free(g);
        kiln_tensor_info ti;
        cr_assert_eq(kiln_plan_tensor(p, "v1", &ti), KILN_OK);
        cr_assert(ti.rank == 3 && ti.dims[0] == 2 && ti.dims[1] == 8 && ti.dims[2] == 16 && ti.t == KILN_DTYPE_F32);
        for (int step = 0; step < 3; step++) {
            int32_t pos = step;
            for (int i = 0; i < 64; i++)
                y[b][i] = NAN;
            kiln_binding bd[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = step + 1},
                                 {.name = "x", .data = x, .bytes = sizeof x}, {.name = "pos", .data = &pos, .bytes = 4},
                                 {.name = "y", .data = y[b], .bytes = sizeof y[b]}};
            cr_assert_eq(kiln_run(p, bd, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        }
        float k0[2 * 8 * 16];
        cr_assert_eq(kiln_plan_state_read(p, "k0", k0, sizeof k0), KILN_OK);
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < 8; r++) {
                double a = 0;
                for (int d = 0; d < 16; d++)
                    a += fabs(k0[(h * 8 + r) * 16 + d]);
                cr_assert((r < 3) == (a > 0), "k0 head %d row %d: |sum| %g", h, r, a);
            }
        for (int i = 0; i < 64; i++)
            cr_assert(isfinite(y[b][i]) && fabsf(y[b][i]) < 100, "y[%d] = %g", i, y[b][i]);
        kiln_plan_free(p);
    }
    for (int i = 0; i < 64; i++)
        cr_assert(fabsf(y[0][i] - y[1][i]) <= 1e-4f * (1 + fabsf(y[0][i])), "y[%d]: ref %g vs auto %g", i,
                  y[0][i], y[1][i]);
    kiln_ctx_free(ctx);
}

/* kiln bench --mode serve: decode of ragged sequences over a paged pool and a mixed step, as JSON;
 * a block size that is not a power of two is a usage error. */
Test(cli, bench_serve_reports_decode_and_mixed_steps, .timeout = 300)
{
    cli_out o;
    kiln_cli(&o, "bench --preset qwen2-0.5b --mode serve --seqs 3 --ctx 40 --ragged --chunk 16 --layers 1 --steps 2 --backend cpu --json");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    static const char *keys[] = {"\"mode\":\"serve\"", "\"seqs\":3", "\"ctx\":40", "\"ragged\":true", "\"block\":16",
                                 "\"decode_ms_per_layer\":", "\"mixed_ms_per_layer\":", "\"mixed_attention_ms_per_layer\":"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) cr_assert(strstr(o.out, keys[i]), "no %s in %s", keys[i], o.out);
    kiln_cli(&o, "bench --preset qwen2-0.5b --mode serve --block 3");
    cr_assert_eq(o.rc, 2);
    cr_assert(strstr(o.err, "power of two"), "%s", o.err);
    kiln_cli(&o, "bench --preset qwen2-0.5b --mode serve --host --seqs 1 --ctx 8 --chunk 0 --layers 1 --backend cpu");
    cr_assert_eq(o.rc, 1, "%s%s", o.out, o.err);
    cr_assert(strstr(o.err, "--host measures kiln_run_async on cuda or vulkan, but the plan runs on cpu"), "%s", o.err);
}

/* kiln bench --mode serve --host on vulkan (lavapipe here): the host time of queueing each
 * kiln_run_async step (every binding in kiln's vulkan device memory) and of the kiln_plan_wait
 * between bursts of KILN_VK_MAX_PENDING, in the cuda run's JSON fields; text names the wait. */
Test(cli, bench_serve_host_vulkan, .timeout = 300)
{
    kiln_ctx *ctx;
    kiln_vk_device d;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    bool have = kiln_ctx_vulkan(ctx, &d) == KILN_OK;
    kiln_ctx_free(ctx);
    if (!have) cr_skip("no Vulkan device");
    cli_out o;
    kiln_cli(&o, "bench --preset qwen2-0.5b --mode serve --host --seqs 1 --ctx 8 --chunk 0 --layers 1 --steps 10 --backend vulkan --json");
    cr_assert_eq(o.rc, 0, "%s%s", o.out, o.err);
    static const char *keys[] = {"\"mode\":\"serve\"", "\"host\":true", "\"backend\":\"vulkan\"", "\"steps\":10", "\"burst\":8"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) cr_assert(strstr(o.out, keys[i]), "no %s in %s", keys[i], o.out);
    static const char *times[] = {"host_us_per_step_median", "host_us_per_step_p90", "host_us_per_step_max", "wait_us_per_step", "step_ms"};
    for (size_t i = 0; i < sizeof times / sizeof *times; i++) cr_assert_gt(json_key(o.out, times[i]), 0.0, "%s in %s", times[i], o.out);
    cr_assert_leq(json_key(o.out, "host_us_per_step_median"), json_key(o.out, "host_us_per_step_max"), "%s", o.out);
    kiln_cli(&o, "bench --preset qwen2-0.5b --mode serve --host --seqs 2 --ctx 8 --chunk 0 --layers 1 --steps 3 --backend vulkan");
    cr_assert_eq(o.rc, 0, "%s%s", o.out, o.err);
    cr_assert(strstr(o.out, "one recorded command buffer") && strstr(o.out, "kiln_plan_wait between bursts"), "%s", o.out);
}

/* bench says why it chose its layer count; gen_model has options and --help (and never writes a
 * file named after an option). */
Test(cli, bench_layers_reason_and_gen_model_usage, .timeout = 300)
{
    cli_out o;
    kiln_cli(&o, "bench --preset qwen2-0.5b --backend ref --wtype f32 --steps 1 --ctx 8 --no-roof");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, "1 layers") && strstr(o.out, "1 layer: the reference backend is slow"), "%s", o.out);
    kiln_cli(&o, "bench --preset qwen2-0.5b --backend ref --wtype f32 --steps 1 --ctx 8 --no-roof --layers 1");
    cr_assert(o.rc == 0 && !strstr(o.out, "reference backend is slow"), "--layers given: no reason needed: %s", o.out);

    char exe[PATH_MAX], cmd[2 * PATH_MAX + 64], dir[] = "/tmp/kiln_genXXXXXX", outp[PATH_MAX];
    kiln_exe(exe, sizeof exe);
    strcpy(strrchr(exe, '/') + 1, "gen_model");
    cr_assert(access(exe, X_OK) == 0, "%s not built", exe);
    cr_assert_not_null(mkdtemp(dir));
    snprintf(outp, sizeof outp, "%s/out.txt", dir);
    const char *args[] = {"--help", "-h", "--bogus x.gguf", "--layers", "--layers 0 x.gguf", "--wtype q9 x.gguf",
                          "--arch gpt x.gguf", "", "--shape 13b x.gguf", "--layers 2x x.gguf",
                          "--shape 30b-a3b x.gguf", "--experts 8 x.gguf", "--arch qwen3moe --experts 0 x.gguf"};
    const int rcs[] = {0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    const char *say[] = {"usage: gen_model", "--shape", "--bogus", "--layers", "1..200", "q9", "gpt", "no output path",
                         "13b", "2x", "30b-a3b", "--experts", "1..512"};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >out.txt 2>&1", dir, exe, args[i]);
        int st = system(cmd);
        slurp(outp, o.out, sizeof o.out);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == rcs[i], "gen_model %s: %s", args[i], o.out);
        cr_assert(strstr(o.out, say[i]), "gen_model %s: lacks '%s': %s", args[i], say[i], o.out);
    }
    snprintf(cmd, sizeof cmd, "ls -A '%s'", dir); /* nothing but out.txt was written */
    FILE *p = popen(cmd, "r");
    char listing[256] = "";
    size_t got = fread(listing, 1, sizeof listing - 1, p);
    listing[got] = '\0';
    pclose(p);
    cr_assert_str_eq(listing, "out.txt\n", "gen_model wrote files on usage errors: %s", listing);
    unlink(outp);
    rmdir(dir);
}
