/* Tests of the kiln tool (run as a child process from the build directory: <test dir>/kiln) and
 * of the model-preset builder. Checksums printed by `kiln run` are compared against f64 sums of
 * the inputs regenerated from the documented fill rule. Never asserts on speed. */
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
#include "support/gguf_writer.h"
#include "tok/tok.h"

#ifndef KILN_VOCAB_DIR
#define KILN_VOCAB_DIR ""
#endif

/* Output of one child run. */
typedef struct cli_out {
    int  rc;          /* exit status (-1 when it did not exit normally) */
    char out[65536];  /* stdout, NUL-terminated */
    char err[16384];  /* stderr, NUL-terminated */
} cli_out;

static void kiln_exe(char *buf, size_t n)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(len > 0, "readlink /proc/self/exe failed");
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    cr_assert(slash);
    *slash = '\0';
    cr_assert(strlen(self) + 6 <= n, "path too long: %s", self);
    memcpy(buf, self, strlen(self));
    memcpy(buf + strlen(self), "/kiln", 6);
    cr_assert(access(buf, X_OK) == 0, "kiln binary not found at %s", buf);
}

static void slurp(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(buf, 1, n - 1, f) : 0;
    buf[got] = '\0';
    if (f)
        fclose(f);
}

/* Runs `kiln ARGS` (ARGS is shell text) and captures exit code, stdout and stderr. */
static void kiln_cli(cli_out *o, const char *args)
{
    char exe[PATH_MAX], outp[] = "/tmp/kiln_cli_outXXXXXX", errp[] = "/tmp/kiln_cli_errXXXXXX", cmd[8192];
    kiln_exe(exe, sizeof exe);
    int fo = mkstemp(outp), fe = mkstemp(errp);
    cr_assert(fo >= 0 && fe >= 0);
    close(fo);
    close(fe);
    snprintf(cmd, sizeof cmd, "'%s' %s >%s 2>%s", exe, args, outp, errp);
    int st = system(cmd);
    o->rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp(outp, o->out, sizeof o->out);
    slurp(errp, o->err, sizeof o->err);
    unlink(outp);
    unlink(errp);
}

Test(cli, help_texts)
{
    cli_out o;
    kiln_cli(&o, "help");
    cr_assert_eq(o.rc, 0);
    cr_assert(strstr(o.out, "bench") && strstr(o.out, "run") && strstr(o.out, "info"), "%s", o.out);
    const char *cmds[] = {"info --help", "run --help", "bench --help", "help bench"};
    const char *want[] = {"--json", "--set", "--preset", "--wtype"};
    for (int i = 0; i < 4; i++) {
        kiln_cli(&o, cmds[i]);
        cr_assert_eq(o.rc, 0, "%s", cmds[i]);
        cr_assert(strstr(o.out, want[i]), "kiln %s: %s", cmds[i], o.out);
    }
    kiln_cli(&o, "");
    cr_assert_eq(o.rc, 2);
}

Test(cli, usage_errors_exit_2_naming_the_culprit)
{
    const char *args[] = {"frobnicate", "info --nope", "run x.kg --wat", "bench --preset qwen2-0.5b --bogus",
                          "bench --preset gpt-17", "bench --preset qwen2-0.5b --mode sideways",
                          "bench --preset qwen2-0.5b --layers 0", "bench --preset qwen2-0.5b --wtype q9",
                          "run", "help nosuch", "bench --preset qwen2-0.5b --steps"};
    const char *named[] = {"frobnicate", "--nope", "--wat", "--bogus", "gpt-17", "sideways", "--layers", "q9",
                           "FILE.kg", "nosuch", "--steps"};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        cli_out o;
        kiln_cli(&o, args[i]);
        cr_assert_eq(o.rc, 2, "kiln %s: rc %d, stderr %s", args[i], o.rc, o.err);
        cr_assert(strstr(o.err, named[i]), "kiln %s: stderr does not name '%s': %s", args[i], named[i], o.err);
    }
}

Test(cli, info_lists_backends)
{
    cli_out o;
    kiln_cli(&o, "info");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, KILN_VERSION_STRING), "%s", o.out);
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(NULL, &ctx), KILN_OK);
    cr_assert(strstr(o.out, kiln_cpu_isa(ctx)), "%s", o.out);
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info b;
        cr_assert_eq(kiln_backend_get(ctx, i, &b), KILN_OK);
        char line[256];
        snprintf(line, sizeof line, "%-8s %-10s", b.name, b.available ? "available" : "absent");
        cr_assert(strstr(o.out, line), "missing '%s' in:\n%s", line, o.out);
    }
    kiln_ctx_free(ctx);
    kiln_cli(&o, "info --json");
    cr_assert_eq(o.rc, 0);
    cr_assert(o.out[0] == '{' && strstr(o.out, "\"backends\":[{\"name\":\"") && strstr(o.out, "\"threads\":"),
              "%s", o.out);
}

Test(cli, run_missing_file_fails_with_status_text)
{
    cli_out o;
    kiln_cli(&o, "run /nonexistent/dir/g.kg");
    cr_assert_eq(o.rc, 1, "rc %d: %s", o.rc, o.err);
    cr_assert(strstr(o.err, kiln_status_str(KILN_ERR_IO)), "%s", o.err);
}

/* Writes g as .kg into a temp file; returns its path in buf. */
static void write_kg(const kiln_graph *g, char *path)
{
    char *text = NULL;
    cr_assert_eq(kiln_kg_print(g, &text), KILN_OK, "%s", kiln_graph_error(g));
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    free(text);
}

/* Finds `"NAME"...` in json and reads the number after KEY within that object. */
static double json_num(const char *json, const char *name, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\"name\":\"%s\"", name);
    const char *p = strstr(json, pat);
    cr_assert(p, "no output %s in %s", name, json);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    p = strstr(p, pat);
    cr_assert(p, "no %s in %s", key, json);
    return strtod(p + strlen(pat), NULL);
}

static void assert_close(double got, double want, const char *what)
{
    cr_assert(fabs(got - want) <= 1e-5 * fmax(1.0, fabs(want)), "%s: got %.17g want %.17g", what, got, want);
}

/* x f32 [n, 8], z f32 [8], ids i32 [n] into a [10, 4] table: outputs x+z, x*x, get_rows. */
Test(cli, run_checksums_match_f64_on_each_backend)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim n = kiln_sym(g, "n", 5);
    kiln_dim xd[2] = {n, 8}, zd[1] = {8}, idd[1] = {n}, td[2] = {10, 4};
    float table[40];
    for (int i = 0; i < 40; i++)
        table[i] = (float)(i / 4 * 10 + i % 4); /* row r, col c = 10 r + c */
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, xd), z = kiln_input(g, "z", KILN_DTYPE_F32, 1, zd);
    kiln_node ids = kiln_input(g, "ids", KILN_DTYPE_I32, 1, idd);
    kiln_node t = kiln_weight(g, "table", KILN_DTYPE_F32, 2, td, table, KILN_WEIGHT_COPY);
    kiln_output(g, kiln_add(g, x, z), "sum");
    kiln_output(g, kiln_mul(g, x, x), "sq");
    kiln_output(g, kiln_get_rows(g, t, ids), "rows");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    char path[] = "/tmp/kiln_cli_kgXXXXXX";
    write_kg(g, path);
    kiln_graph_free(g);

    /* The fill rule: inputs in node order (x, z, ids), one splitmix64 stream from --seed. */
    const int nv = 3;
    uint64_t rng = 77;
    double xs = 0, x2 = 0, zs = 0, rs = 0;
    for (int i = 0; i < nv * 8; i++) {
        double v = kiln_preset_rngf(&rng);
        xs += v;
        x2 += v * v;
    }
    for (int i = 0; i < 8; i++)
        zs += kiln_preset_rngf(&rng);
    for (int i = 0; i < nv; i++)
        rs += 4 * 10.0 * (double)(kiln_preset_rng(&rng) % 10u) + 6; /* sum of row r: 40 r + 0+1+2+3 */
    const char *backends[] = {"ref", "auto"};
    for (int b = 0; b < 2; b++) {
        char args[512];
        cli_out o;
        snprintf(args, sizeof args, "run %s --backend %s --set n=%d --seed 77 --json", path, backends[b], nv);
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
        assert_close(json_num(o.out, "sum", "sum"), xs + nv * zs, "sum(x+z)");
        assert_close(json_num(o.out, "sq", "sum"), x2, "sum(x*x)");
        assert_close(json_num(o.out, "sq", "abs_sum"), x2, "abs_sum(x*x)");
        assert_close(json_num(o.out, "rows", "sum"), rs, "sum(rows)");
        cr_assert(strstr(o.out, "\"shape\":[3,8]") && strstr(o.out, "\"shape\":[3,4]"), "%s", o.out);
    }
    cli_out o;
    char args[512];
    snprintf(args, sizeof args, "run %s --set m=3", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 2, "unknown symbol must be a usage error: %s", o.err);
    snprintf(args, sizeof args, "run %s --set n=6", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 1, "a symbol over its bound must fail the run: %s", o.err);
    cr_assert(strstr(o.err, kiln_status_str(KILN_ERR_SYMBOL)), "%s", o.err);
    unlink(path);
}

static double json_key(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    cr_assert(p, "no %s in %s", key, json);
    return strtod(p + strlen(pat), NULL);
}

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

Test(cli, spirv_prints_each_kernel)
{
    cli_out o;
    kiln_cli(&o, "spirv " KILN_SOURCE_DIR "/tests/data/every_op.kg");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, "// ---- region 0") && strstr(o.out, "#version 450") && strstr(o.out, "void main()"), "%s", o.out);
    kiln_cli(&o, "spirv --preset qwen2-0.5b --features all");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    kiln_cli(&o, "spirv --preset qwen2-0.5b --features some");
    cr_assert_eq(o.rc, 2);
    cr_assert(strstr(o.err, "--features"), "%s", o.err);
    kiln_cli(&o, "spirv --help");
    cr_assert(o.rc == 0 && strstr(o.out, "--disasm"));
#ifdef KILN_HAVE_VULKAN
    if (system("command -v spirv-dis >/dev/null 2>&1") == 0) {
        kiln_cli(&o, "spirv " KILN_SOURCE_DIR "/tests/data/every_op.kg --no-fuse --disasm");
        cr_assert_eq(o.rc, 0, "%s", o.err);
        cr_assert(strstr(o.out, "OpEntryPoint GLCompute"), "%s", o.out);
    }
#endif
}

/* kiln ptx: every region listed (lowered with its kernel, or the reason it is not), ptxas's
 * report when ptxas is here, JSON that names every region, and usage errors. */
Test(cli, ptx_lists_every_region, .timeout = 300)
{
    char args[4096];
    const char *src = getenv("KILN_SOURCE_DIR");
    snprintf(args, sizeof args, "ptx '%s/tests/data/llama_layer.kg' --summary", src && *src ? src : KILN_SOURCE_DIR);
    cli_out o;
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "rc %d: %s\n%s", o.rc, o.err, o.out);
    int regions = 0, listed = 0;
    for (const char *p = o.out; (p = strstr(p, "=== region ")); p++) listed++;
    const char *tail = strstr(o.out, " regions, ");
    cr_assert(tail, "%s", o.out);
    while (tail > o.out && tail[-1] != '\n') tail--;
    cr_assert_eq(sscanf(tail, "%d regions", &regions), 1, "%s", tail);
    cr_assert_eq(listed, regions, "%d regions listed of %d:\n%s", listed, regions, o.out);
    bool lowered = strstr(o.out, " -> ") != NULL;
    if (lowered && strstr(o.out, "assembled with ptxas")) {
        cr_assert(strstr(o.out, "--- ptxas sm_90: "), "%s", o.out);
        cr_assert(strstr(o.out, "spill bytes in all: 0,"), "%s", o.out);
    }
    if (lowered) cr_assert(strstr(o.out, "--- static: global loads "), "%s", o.out);
    /* JSON: one object per region, and PTX text unless --summary */
    snprintf(args, sizeof args, "ptx '%s/tests/data/llama_layer.kg' --json --summary --sm 80", src && *src ? src : KILN_SOURCE_DIR);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "rc %d: %s", o.rc, o.err);
    cr_assert(o.out[0] == '{' && strstr(o.out, "\"sm\":80") && strstr(o.out, "\"regions\":[{\"index\":0,"), "%s", o.out);
    int json_regions = 0;
    for (const char *p = o.out; (p = strstr(p, "{\"index\":")); p++) json_regions++;
    cr_assert_eq(json_regions, regions);
    cr_assert(!strstr(o.out, "\"ptx\":"), "--summary prints no PTX");
    snprintf(args, sizeof args, "ptx '%s/tests/data/gpt2_mlp.kg' --json --sm 80 --region 0", src && *src ? src : KILN_SOURCE_DIR);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "rc %d: %s", o.rc, o.err);
    if (strstr(o.out, "\"lowered\":true"))
        cr_assert(strstr(o.out, "\"ptx\":\"//") && strstr(o.out, "// kiln kernel kiln_") && strstr(o.out, ".target sm_80"), "%s", o.out);
    /* a preset, one region */
    kiln_cli(&o, "ptx --preset qwen2-0.5b --wtype q4_k --tokens 4 --region 0");
    cr_assert_eq(o.rc, 0, "rc %d: %s", o.rc, o.err);
    cr_assert(strstr(o.out, "=== region 0/") && !strstr(o.out, "=== region 1/"), "%s", o.out);
    /* usage errors */
    const char *bad[] = {"ptx", "ptx --preset nope", "ptx --preset qwen2-0.5b --sm 75", "ptx --preset qwen2-0.5b --frob",
                         "ptx --preset qwen2-0.5b --region 100000"};
    for (int i = 0; i < 5; i++) {
        kiln_cli(&o, bad[i]);
        cr_assert_eq(o.rc, 2, "kiln %s: rc %d", bad[i], o.rc);
        cr_assert(o.err[0], "kiln %s printed no reason", bad[i]);
    }
    kiln_cli(&o, "help ptx");
    cr_assert(o.rc == 0 && strstr(o.out, "--sm"), "%s", o.out);
}

/* ------------------------------------------------------------------ GGUF models */

static const gw_model cli_model = {.arch = "qwen2", .n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2,
                                   .ffn = 96, .n_vocab = 50, .n_ctx = 128, .wtype = KILN_DTYPE_Q8_0,
                                   .embtype = KILN_DTYPE_F16, .tokens = true, .seed = 21};

static void write_model(char *path)
{
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(gw_model_write(&cli_model, path), 0);
}

/* Greedy ids of cli_model after prompt 1,2,3 through the API on ref: what generate must print. */
static void api_greedy(const char *path, int n, int32_t *out)
{
    kiln_ctx *ctx;
    kiln_gguf *f;
    kiln_graph *g;
    kiln_plan *p;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    cr_assert_eq(kiln_gguf_open(ctx, path, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 3 + n, .max_tok = 3, .kv_dtype = KILN_DTYPE_F16}, &g),
                 KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "ref"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    int32_t ids[3] = {1, 2, 3}, pos[3] = {0, 1, 2}, next[3];
    for (int s = 0, n_tok = 3, start = 0; s < n; s++) {
        kiln_binding b[5] = {{.name = "n_tok", .value = n_tok}, {.name = "n_kv", .value = start + n_tok},
                             {.name = "ids", .data = ids, .bytes = (size_t)n_tok * 4},
                             {.name = "pos", .data = pos, .bytes = (size_t)n_tok * 4},
                             {.name = "next", .data = next, .bytes = (size_t)n_tok * 4}};
        cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        out[s] = ids[0] = next[n_tok - 1];
        start += n_tok;
        pos[0] = start;
        n_tok = 1;
    }
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_gguf_close(f);
    kiln_ctx_free(ctx);
}

Test(cli, generate_prints_the_greedy_ids_on_each_backend)
{
    char path[] = "/tmp/kiln_cli_modelXXXXXX", args[512];
    write_model(path);
    int32_t want[8];
    api_greedy(path, 8, want);
    char ids[256] = "[";
    for (int i = 0; i < 8; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? ", " : "", want[i]);
    strcat(ids, "]");
    const char *bes[] = {"ref", "cpu"};
    for (int b = 0; b < 2; b++) {
        cli_out o;
        snprintf(args, sizeof args, "generate %s --ids 1,2,3 -n 8 --temp 0 --backend %s --json", path, bes[b]);
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
        cr_assert(strstr(o.out, ids), "kiln %s: want ids %s in %s", args, ids, o.out);
        cr_assert(json_key(o.out, "prefill_tok_s") > 0 && json_key(o.out, "decode_tok_s") > 0, "%s", o.out);
        char be[64];
        snprintf(be, sizeof be, "\"backend\": \"%s\"", bes[b]);
        cr_assert(strstr(o.out, be), "%s", o.out);
    }
    /* tensor parallelism on virtual devices (issue #24): the same greedy ids */
    for (int b = 0; b < 2; b++) {
        cli_out o;
        snprintf(args, sizeof args, "generate %s --ids 1,2,3 -n 8 --temp 0 --backend %s --gpus 2 --json", path, bes[b]);
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
        cr_assert(strstr(o.out, ids), "kiln %s: want ids %s in %s", args, ids, o.out);
        char dev[64];
        snprintf(dev, sizeof dev, "\"devices\": \"%s:0,1\"", bes[b]);
        cr_assert(strstr(o.out, dev), "%s", o.out);
    }
    cli_out o;
    snprintf(args, sizeof args, "generate %s --ids 1,2,3 -n 2 --backend vulkan --gpus 2", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 2, "%s", o.err);
    cr_assert(strstr(o.err, "--gpus splits over cuda GPUs"), "%s", o.err);
    snprintf(args, sizeof args, "generate %s --ids=1,2,3 -n 8 --temp=0", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    char text[128] = ""; /* no tokenizer.ggml.model in the file: the ids are printed as they come */
    for (int i = 0; i < 8; i++) snprintf(text + strlen(text), sizeof text - strlen(text), "%s%d", i ? " " : "", want[i]);
    cr_assert_str_eq(o.out, text);
    cr_assert(strstr(o.err, "prompt 3 tokens") && strstr(o.err, "generated 8 tokens, 7 decode steps") &&
              strstr(o.err, "ms/token") && strstr(o.err, "stopped at -n"), "%s", o.err);
    unlink(path);
}

/* generate --profile: where a decode step's time goes. On cpu every region of every decode step is
 * launched one by one and nothing is recorded; on the stand-in driver (tests/fakecuda) the prefill
 * makes one recording, the first decode step another, and every decode step replays one: no step
 * records again or launches kernels one by one. The kinds' regions add up to the plan's kernels, and
 * the ids are those of the run without --profile. */
static void kiln_cli_env(cli_out *o, const char *env, const char *args);

Test(cli, generate_profile_says_where_a_step_goes, .timeout = 300)
{
    char path[] = "/tmp/kiln_cli_modelXXXXXX", args[1024];
    write_model(path);
    int32_t want[8];
    api_greedy(path, 8, want);
    char ids[256] = "[";
    for (int i = 0; i < 8; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? ", " : "", want[i]);
    strcat(ids, "]");
    for (int fake = 0; fake < 2; fake++) {
        cli_out o;
        snprintf(args, sizeof args, "generate %s --ids 1,2,3 -n 8 --temp 0 --backend %s --json --profile", path, fake ? "cuda" : "cpu");
        if (fake) kiln_cli_env(&o, "KILN_LIBCUDA=" KILN_FAKECUDA " KILN_CACHE=off", args);
        else kiln_cli(&o, args);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
        if (!fake) cr_assert(strstr(o.out, ids), "kiln %s: want ids %s in %s", args, ids, o.out); /* the stand-in runs no kernel */
        const char *pf = strstr(o.out, "\"profile\": {");
        cr_assert(pf, "%s", o.out);
        int regions = 0;
        for (const char *r = strstr(pf, "\"regions\":"); r; r = strstr(r + 1, "\"regions\":")) regions += atoi(r + 11);
        double steps = json_key(pf, "steps"), rec = json_key(pf, "recordings"), rep = json_key(pf, "replays"),
               launches = json_key(pf, "launches"), pre = json_key(pf, "prefill_recordings");
        cr_assert(steps == 7 && regions >= 10, "%s", pf);
        cr_assert(json_key(pf, "step_ms") > 0 && json_key(pf, "kernels_ms") > 0 && json_key(pf, "run_ms") > 0, "%s", pf);
        cr_assert(json_key(pf, "run_ms") <= json_key(pf, "step_ms") * 1.0001 + 1e-3, "%s", pf);
        if (fake)
            cr_assert(pre == 1 && rec == 1 && rep == 7 && launches == 0, "stand-in cuda: %s", pf);
        else
            cr_assert(pre == 0 && rec == 0 && rep == 0 && launches == 7 * regions, "cpu: %s", pf);
    }
    cli_out o;
    snprintf(args, sizeof args, "generate %s --ids 1,2,3 -n 8 --temp 0 --backend cpu --profile", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.err, "kiln generate --profile: 7 decode steps") && strstr(o.err, "in kiln_run") &&
              strstr(o.err, "kernels' device time a step"), "%s", o.err);
    unlink(path);
}

/* ------------------------------------------------------------------ generate with a real vocabulary */

/* Copies the tokenizer.* keys of llama.cpp's test vocabulary NAME into w (not its chat template;
 * eos >= 0 replaces the EOS id); returns its token count, or 0 (test skipped) when the vocabulary is absent. */
static int64_t copy_tokenizer(gw *w, const char *name, int64_t eos)
{
    char vpath[1024];
    snprintf(vpath, sizeof vpath, "%s/ggml-vocab-%s.gguf", KILN_VOCAB_DIR, name);
    if (access(vpath, R_OK) != 0) return 0;
    kiln_ctx *ctx;
    kiln_gguf *f;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    cr_assert_eq(kiln_gguf_open(ctx, vpath, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    int64_t n_tok = 0;
    for (int64_t i = 0; i < kiln_gguf_kv_count(f); i++) {
        const char *key = kiln_gguf_kv_key(f, i);
        if (strncmp(key, "tokenizer.", 10) != 0 || strcmp(key, "tokenizer.chat_template") == 0 ||
            (eos >= 0 && strcmp(key, "tokenizer.ggml.eos_token_id") == 0))
            continue; /* the test writes its own template */
        kiln_gguf_type t = kiln_gguf_kv_type(f, i), et;
        const char *str;
        uint64_t n;
        const void *data;
        uint8_t raw[8] = {0};
        if (t == KILN_GGUF_STRING) {
            cr_assert_eq(kiln_gguf_get_str(f, key, &str, NULL), KILN_OK);
            gw_kv_str(w, key, str);
        } else if (t == KILN_GGUF_ARRAY) {
            cr_assert_eq(kiln_gguf_get_arr(f, key, &et, &n, &data), KILN_OK);
            if (et != KILN_GGUF_STRING) {
                gw_kv_arr(w, key, et, n, data);
                continue;
            }
            char **v = malloc(n * sizeof *v);
            cr_assert(v);
            for (uint64_t k = 0; k < n; k++) {
                size_t l;
                cr_assert_eq(kiln_gguf_get_arr_str(f, key, k, &str, &l), KILN_OK);
                v[k] = strndup(str, l);
            }
            gw_kv_arr_str(w, key, n, (const char *const *)v);
            for (uint64_t k = 0; k < n; k++) free(v[k]);
            free(v);
            if (strcmp(key, "tokenizer.ggml.tokens") == 0) n_tok = (int64_t)n;
        } else if (t == KILN_GGUF_BOOL) {
            bool b;
            cr_assert_eq(kiln_gguf_get_bool(f, key, &b), KILN_OK);
            raw[0] = b;
            gw_kv(w, key, t, raw);
        } else if (t == KILN_GGUF_U32 || t == KILN_GGUF_I32) {
            uint32_t u;
            cr_assert_eq(kiln_gguf_get_u32(f, key, &u), KILN_OK);
            gw_kv(w, key, t, &u);
        }
    }
    if (eos >= 0) gw_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    kiln_gguf_close(f);
    kiln_ctx_free(ctx);
    return n_tok;
}

/* A small random model of arch with the tokenizer (and vocabulary size) of test vocabulary NAME and
 * chat template tmpl (NULL: none). Skips the test when the vocabulary is absent. */
static int64_t write_vocab_model(char *path, const char *arch, const char *name, const char *tmpl, int64_t eos)
{
    gw *probe = gw_new(3, 0);
    int64_t n_vocab = copy_tokenizer(probe, name, -1);
    gw_free(probe);
    if (!n_vocab) cr_skip_test("vocabulary %s absent (tests/data/vocab not unpacked)", name);
    gw_model m = cli_model;
    m.arch = arch, m.n_vocab = n_vocab, m.tokens = false, m.n_ctx = 256;
    gw *w = gw_model_new(&m);
    copy_tokenizer(w, name, eos);
    if (tmpl) gw_kv_str(w, "tokenizer.chat_template", tmpl);
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(gw_write(w, path), 0);
    gw_free(w);
    return n_vocab;
}

/* Greedy ids and every step's logits (rows [n, n_vocab], may be NULL) of prompt through the API on ref. */
static void api_run(const char *path, const int32_t *prompt, int n_prompt, int n, int32_t *out, float *rows)
{
    kiln_ctx *ctx;
    kiln_gguf *f;
    kiln_graph *g;
    kiln_plan *p;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    cr_assert_eq(kiln_gguf_open(ctx, path, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_model_info mi;
    cr_assert_eq(kiln_model_info_get(f, &mi), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_model_options mo = {.max_ctx = n_prompt + n, .max_tok = n_prompt, .kv_dtype = KILN_DTYPE_F16, .logits = true,
                             .last_only = true};
    cr_assert_eq(kiln_model_build(f, &mo, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "ref"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    int32_t *ids = malloc((size_t)n_prompt * 4), *pos = malloc((size_t)n_prompt * 4), next, last;
    float *logits = malloc((size_t)mi.n_vocab * 4);
    memcpy(ids, prompt, (size_t)n_prompt * 4);
    for (int s = 0, n_tok = n_prompt, start = 0; s < n; s++) {
        for (int i = 0; i < n_tok; i++) pos[i] = start + i;
        last = n_tok - 1;
        kiln_binding b[7] = {{.name = "n_tok", .value = n_tok}, {.name = "n_kv", .value = start + n_tok},
                             {.name = "ids", .data = ids, .bytes = (size_t)n_tok * 4},
                             {.name = "pos", .data = pos, .bytes = (size_t)n_tok * 4},
                             {.name = "last", .data = &last, .bytes = 4}, {.name = "next", .data = &next, .bytes = 4},
                             {.name = "logits", .data = logits, .bytes = (size_t)mi.n_vocab * 4}};
        cr_assert_eq(kiln_run(p, b, 7), KILN_OK, "%s", kiln_ctx_error(ctx));
        if (rows) memcpy(rows + (size_t)s * (size_t)mi.n_vocab, logits, (size_t)mi.n_vocab * 4);
        out[s] = ids[0] = next;
        start += n_tok;
        n_tok = 1;
    }
    free(ids);
    free(pos);
    free(logits);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_gguf_close(f);
    kiln_ctx_free(ctx);
}

/* The file's tokenizer. */
static kiln_tok *file_tok(const char *path, kiln_ctx **ctx)
{
    kiln_gguf *f;
    kiln_tok *t;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, ctx), KILN_OK);
    cr_assert_eq(kiln_gguf_open(*ctx, path, &f), KILN_OK, "%s", kiln_ctx_error(*ctx));
    kiln_status s = kiln_tok_new(*ctx, f, &t);
    kiln_gguf_close(f);
#ifndef KILN_HAVE_PCRE2
    if (s == KILN_ERR_UNSUPPORTED && strstr(kiln_ctx_error(*ctx), "PCRE2")) {
        unlink(path);
        cr_skip_test("built without PCRE2: %s", kiln_ctx_error(*ctx));
    }
#endif
    cr_assert_eq(s, KILN_OK, "%s", kiln_ctx_error(*ctx));
    return t;
}

/* The text generate prints for ids: their pieces through the streaming decoder. */
static size_t ids_text(const kiln_tok *t, const int32_t *ids, int n, char *out)
{
    kiln_tok_stream st = {0};
    size_t o = 0, l;
    for (int i = 0; i < n; i++) {
        const char *p = kiln_tok_piece(t, ids[i], false, &l);
        o += kiln_tok_stream_put(&st, p, l, out + o);
    }
    o += kiln_tok_stream_end(&st, out + o);
    out[o] = 0;
    return o;
}

/* The first greedy ids up to (not including) an end-of-generation token. */
static int until_eog(const kiln_tok *t, const int32_t *ids, int n)
{
    int k = 0;
    while (k < n && !kiln_tok_is_eog(t, ids[k])) k++;
    return k;
}

Test(cli, generate_text_and_logits_match_the_api, .timeout = 600)
{
    char path[] = "/tmp/kiln_cli_vocabXXXXXX", lpath[] = "/tmp/kiln_cli_logitsXXXXXX", args[1024];
    int64_t nv = write_vocab_model(path, "llama", "llama-spm", NULL, -1);
    kiln_ctx *tctx;
    kiln_tok *t = file_tok(path, &tctx);
    const char *prompt = "Hello world, how are you?";
    int32_t *pids;
    int64_t np;
    cr_assert_eq(kiln_tok_encode(t, prompt, strlen(prompt), true, true, &pids, &np), KILN_OK);
    cr_assert_eq(pids[0], kiln_tok_bos(t), "llama-spm adds BOS");
    enum { N = 8 };
    int32_t want[N];
    float *rows = malloc((size_t)N * (size_t)nv * 4);
    api_run(path, pids, (int)np, N, want, rows);
    int n = until_eog(t, want, N);
    static char text[1 << 16];
    ids_text(t, want, n, text);
    int fd = mkstemp(lpath);
    close(fd);
    cli_out o;
    snprintf(args, sizeof args, "generate %s -p '%s' -n %d --temp 0 --backend ref --logits %s", path, prompt, N, lpath);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
    cr_assert_str_eq(o.out, text, "streamed text differs from the API's greedy tokens' text");
    char say[128];
    snprintf(say, sizeof say, "prompt %lld tokens", (long long)np);
    cr_assert(strstr(o.err, say) && strstr(o.err, "tok/s"), "%s", o.err);
    char ppath[] = "/tmp/kiln_cli_promptXXXXXX"; /* -f: the same prompt from a file */
    fd = mkstemp(ppath);
    cr_assert(fd >= 0 && write(fd, prompt, strlen(prompt)) == (ssize_t)strlen(prompt));
    close(fd);
    snprintf(args, sizeof args, "generate %s -f %s -n %d --temp 0 --backend ref", path, ppath, N);
    kiln_cli(&o, args);
    unlink(ppath);
    cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
    cr_assert_str_eq(o.out, text, "-f gave another text than -p");
    /* --logits: one row per drawn token (the EOS one too), equal to the API's */
    FILE *lf = fopen(lpath, "rb");
    cr_assert(lf);
    int rows_want = n < N ? n + 1 : N;
    float *got = malloc((size_t)N * (size_t)nv * 4);
    size_t nr = fread(got, 4, (size_t)N * (size_t)nv, lf);
    fclose(lf);
    cr_assert_eq(nr, (size_t)rows_want * (size_t)nv, "--logits wrote %zu floats, want %d rows of %lld", nr, rows_want, (long long)nv);
    double err = 0, ref = 0;
    for (size_t i = 0; i < nr; i++) err += ((double)got[i] - rows[i]) * ((double)got[i] - rows[i]), ref += (double)rows[i] * rows[i];
    cr_assert(ref > 0 && err / ref < 1e-10, "--logits NMSE %g against the API", err / ref);
    /* --json: the same ids, and the text */
    snprintf(args, sizeof args, "generate %s -p '%s' -n %d --temp 0 --backend ref --json", path, prompt, N);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    char ids[512] = "\"ids\": [";
    for (int i = 0; i < n; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? ", " : "", want[i]);
    strcat(ids, "]");
    cr_assert(strstr(o.out, ids), "want %s in %s", ids, o.out);
    cr_assert_eq((int64_t)json_key(o.out, "prompt_tokens"), np, "%s", o.out);
    free(got);
    free(rows);
    free(pids);
    kiln_tok_free(t);
    kiln_ctx_free(tctx);
    unlink(lpath);
    unlink(path);
}

Test(cli, generate_stops_at_eos_and_stop_strings, .timeout = 600)
{
    char path[] = "/tmp/kiln_cli_vocabXXXXXX", path2[] = "/tmp/kiln_cli_vocabXXXXXX", args[1024];
    write_vocab_model(path, "llama", "llama-spm", NULL, -1);
    kiln_ctx *tctx;
    kiln_tok *t = file_tok(path, &tctx);
    int32_t *pids;
    int64_t np;
    cr_assert_eq(kiln_tok_encode(t, "Once upon a time", 16, true, true, &pids, &np), KILN_OK);
    enum { N = 12 };
    int32_t want[N];
    api_run(path, pids, (int)np, N, want, NULL);
    int n = until_eog(t, want, N);
    cr_assert_geq(n, 6, "random weights ended at EOS too early to test stops");
    /* the same weights with EOS = the 4th greedy token: generation ends before its first occurrence */
    write_vocab_model(path2, "llama", "llama-spm", NULL, want[3]);
    int k = 0;
    while (want[k] != want[3]) k++;
    cli_out o;
    snprintf(args, sizeof args, "generate %s -p 'Once upon a time' -n %d --temp 0 --backend ref --json", path2, N);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, "\"stop\": \"eos\""), "%s", o.out);
    char ids[512] = "\"ids\": [";
    for (int i = 0; i < k; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? ", " : "", want[i]);
    strcat(ids, "]");
    cr_assert(strstr(o.out, ids), "want %s in %s", ids, o.out);
    snprintf(args, sizeof args, "generate %s -p 'Once upon a time' -n %d --temp 0 --backend ref --json --ignore-eos", path2, N);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    strcpy(ids, "\"ids\": [");
    for (int i = 0; i < N; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? ", " : "", want[i]);
    strcat(ids, "]");
    cr_assert(strstr(o.out, ids) && strstr(o.out, "\"stop\": \"-n\""), "--ignore-eos: want %s in %s", ids, o.out);
    /* --stop: two ASCII letters from the middle of the text; the output is cut before their first occurrence */
    static char text[1 << 16];
    size_t len = ids_text(t, want, n, text);
    size_t at = len / 3;
    while (at + 1 < len && !(isalpha((unsigned char)text[at]) && isalpha((unsigned char)text[at + 1]))) at++;
    cr_assert(at + 1 < len, "no two ASCII letters after the first third of '%s' (the weights are fixed: pick another prompt)",
              text);
    char stop[3] = {text[at], text[at + 1], 0};
    *strstr(text, stop) = 0;
    snprintf(args, sizeof args, "generate %s -p 'Once upon a time' -n %d --temp 0 --backend ref --stop %s", path, N, stop);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert_str_eq(o.out, text, "--stop %s", stop);
    cr_assert(strstr(o.err, "stopped at stop string"), "%s", o.err);
    free(pids);
    kiln_tok_free(t);
    kiln_ctx_free(tctx);
    unlink(path);
    unlink(path2);
}

Test(cli, generate_chat_bpe_and_seeded_sampling, .timeout = 600)
{
    char path[] = "/tmp/kiln_cli_vocabXXXXXX", tpath[1024], args[1024];
    snprintf(tpath, sizeof tpath, "%s/tests/data/chat/Qwen-Qwen2.5-7B-Instruct.jinja", KILN_SOURCE_DIR);
    static char tmpl[65536];
    slurp(tpath, tmpl, sizeof tmpl);
    cr_assert(tmpl[0], "%s missing", tpath);
    write_vocab_model(path, "qwen2", "qwen2", tmpl, -1);
    kiln_ctx *tctx;
    kiln_tok *t = file_tok(path, &tctx);
    const char *chat = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                       "<|im_start|>assistant\n";
    int32_t *pids;
    int64_t np;
    cr_assert_eq(kiln_tok_encode(t, chat, strlen(chat), true, true, &pids, &np), KILN_OK);
    enum { N = 4 };
    int32_t want[N];
    api_run(path, pids, (int)np, N, want, NULL);
    int n = until_eog(t, want, N);
    cli_out o;
    snprintf(args, sizeof args, "generate %s --chat --system 'Be brief.' -p 'What is 2+2?' -n %d --temp 0 --backend ref --json",
             path, N);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert_eq((int64_t)json_key(o.out, "prompt_tokens"), np, "the chatml prompt: %s", o.out);
    char ids[512] = "\"ids\": [";
    for (int i = 0; i < n; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? ", " : "", want[i]);
    strcat(ids, "]");
    cr_assert(strstr(o.out, ids), "want %s in %s", ids, o.out);
    /* sampling: the same seed gives the same tokens */
    static char first[sizeof o.out];
    snprintf(args, sizeof args, "generate %s -p 'The sky is' -n 6 --temp 1.0 --top-k 0 --top-p 1 --min-p 0 --seed 77 "
             "--backend ref --json", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    memcpy(first, o.out, sizeof first);
    *strchr(first, ']') = 0; /* the ids (the rest has timings) */
    kiln_cli(&o, args);
    cr_assert(strncmp(o.out, first, strlen(first)) == 0, "same seed, different tokens: %s then %s", first, o.out);
    cr_assert(strstr(o.out, "\"seed\": 77"), "%s", o.out);
    free(pids);
    kiln_tok_free(t);
    kiln_ctx_free(tctx);
    unlink(path);
}

Test(cli, generate_chat_refuses_unknown_templates)
{
    char path[] = "/tmp/kiln_cli_vocabXXXXXX", path2[] = "/tmp/kiln_cli_vocabXXXXXX", args[1024];
    write_vocab_model(path, "llama", "llama-spm", NULL, -1);
    write_vocab_model(path2, "llama", "llama-spm", "{% for m in messages %}<|user|>{{ m.content }}<|end|><|assistant|>{% endfor %}", -1);
    cli_out o;
    snprintf(args, sizeof args, "generate %s --chat -p hi", path);
    kiln_cli(&o, args);
    cr_assert(o.rc == 1 && strstr(o.err, "tokenizer.chat_template"), "rc %d: %s", o.rc, o.err);
    snprintf(args, sizeof args, "generate %s --chat -p hi", path2);
    kiln_cli(&o, args);
    cr_assert(o.rc == 1 && strstr(o.err, "llama-3, chatml"), "rc %d: %s", o.rc, o.err);
    unlink(path);
    unlink(path2);
}

Test(cli, info_and_bench_of_a_model)
{
    char path[] = "/tmp/kiln_cli_modelXXXXXX", args[512];
    write_model(path);
    cli_out o;
    snprintf(args, sizeof args, "info %s", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, "qwen2, 2 layers, hidden 64, 4 heads (2 KV, head dim 16), ffn 96, vocab 50") &&
              strstr(o.out, "q8_0") && strstr(o.out, "q/k/v biases") && strstr(o.out, "kiln would run it on"), "%s", o.out);
    snprintf(args, sizeof args, "info %s --json", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(o.out[0] == '{' && strstr(o.out, "\"runnable\":true") && json_key(o.out, "kernels") >= 1, "%s", o.out);
    const char *modes[] = {"decode --ctx 8 --steps 3", "prefill --tokens 5 --steps 2"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "bench --model %s --mode %s --json", path, modes[i]);
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
        cr_assert(json_key(o.out, "tok_s") > 0 && json_key(o.out, "ms_per_step") > 0, "%s", o.out);
        cr_assert_eq((int)json_key(o.out, "tokens"), i ? 5 : 1, "%s", o.out);
    }
    snprintf(args, sizeof args, "plan %s --ctx 64", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
    cr_assert(strstr(o.out, "14 kernels") && strstr(o.out, "rms_norm + matmul x3 + add x3 + rope x2 + kv_scatter x2"), "%s",
              o.out);
    snprintf(args, sizeof args, "bench --model %s --ctx 4 --steps 2 --profile", path);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
    cr_assert(strstr(o.out, "tok/s") && strstr(o.out, "per kernel") && strstr(o.out, "add x3 + rope x2"), "%s", o.out);
    unlink(path);
}

Test(cli, model_errors_name_the_culprit)
{
    char path[] = "/tmp/kiln_cli_modelXXXXXX", bad[] = "/tmp/kiln_cli_badXXXXXX", args[512];
    write_model(path);
    int fd = mkstemp(bad);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "GGUF\3\0\0\0\1\0\0\0", 12), 12); /* truncated tensor_count */
    close(fd);
    struct {
        const char *fmt; /* args with %s = path */
        int         rc;  /* exit code */
        const char *say; /* in stderr */
    } cases[] = {{"generate %s", 2, "--ids"},
                 {"generate %s -p hi --ids 1", 2, "one of -p, -f and --ids"},
                 {"generate %s --ids 1 --chat", 2, "--chat needs -p"},
                 {"generate %s --ids 1 --temp -1", 2, "--temp"},
                 {"generate %s --ids 1 --top-p 2", 2, "--top-p"},
                 {"generate %s --ids 1 --stop ''", 2, "--stop"},
                 {"generate %s -p hi", 1, "tokenizer.ggml.model"},
                 {"generate %s -p hi -f /nonexistent", 2, "one of -p, -f"},
                 {"generate %s -f /nonexistent", 2, "cannot read"},
                 {"generate %s --ids 1,x", 2, "'x'"},
                 {"generate %s --ids 1,,2", 2, "--ids"},
                 {"generate %s --ids 1,50", 2, "id 50"},
                 {"generate %s --ids 1 -n 500", 2, "context is 128"},
                 {"generate %s --ids 1 --frob", 2, "--frob"},
                 {"generate /nonexistent.gguf --ids 1", 1, "cannot open"},
                 {"bench --model %s --mode sideways", 2, "sideways"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_out o;
        snprintf(args, sizeof args, cases[i].fmt, path);
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, cases[i].rc, "kiln %s: rc %d: %s", args, o.rc, o.err);
        cr_assert(strstr(o.err, cases[i].say), "kiln %s: stderr lacks '%s': %s", args, cases[i].say, o.err);
    }
    const char *cmds[] = {"info %s", "generate %s --ids 1"};
    for (int i = 0; i < 2; i++) {
        cli_out o;
        snprintf(args, sizeof args, cmds[i], bad);
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, 1, "kiln %s: %s", args, o.err);
        cr_assert(strstr(o.err, "byte 8") && strstr(o.err, "tensor_count"), "kiln %s: %s", args, o.err);
    }
    unlink(path);
    unlink(bad);
}

/* ------------------------------------------------------------------ errors that name the real problem */

/* Writes text (n bytes) to a new temp file named from tmpl (mkstemps: suffix kept). */
static void write_temp(char *tmpl, int suffix, const char *text, size_t n)
{
    int fd = mkstemps(tmpl, suffix);
    cr_assert(fd >= 0, "mkstemps %s", tmpl);
    cr_assert_eq(write(fd, text, n), (ssize_t)n);
    close(fd);
}

Test(cli, errors_point_at_the_real_problem, .timeout = 300)
{
    char model[] = "/tmp/kiln_cli_modelXXXXXX", text_gguf[] = "/tmp/kiln_cli_textXXXXXX.gguf",
         empty[] = "/tmp/kiln_cli_emptyXXXXXX.kg", kg[] = "/tmp/kiln_cli_okXXXXXX.kg", args[1024];
    write_model(model);
    write_temp(text_gguf, 5, "hello\n", 6);
    write_temp(empty, 3, "", 0);
    write_temp(kg, 3, "input x f32 [4]\ny = silu x\noutput y y\n", 38);
    struct {
        const char *fmt; /* args; %1$s model, %2$s text .gguf, %3$s empty .kg, %4$s good .kg */
        int         rc;  /* exit code */
        const char *say; /* in stderr */
    } cases[] = {
        {"run %1$s", 1, "is a GGUF model file, not a .kg graph"},
        {"ptx %1$s", 1, "is a GGUF model file, not a .kg graph"},
        {"spirv %1$s", 1, "is a GGUF model file, not a .kg graph"},
        {"plan %2$s", 1, "is named .gguf but is not a GGUF file"},
        {"run %3$s", 1, "is empty: a .kg graph declares inputs"},
        {"run %4$s --backend bogus", 2, "unknown backend 'bogus' (known: ref, cpu"},
        {"plan %4$s --backend=nope", 2, "unknown backend 'nope'"},
        {"check --backend bogus", 2, "unknown backend 'bogus'"},
        {"plan %4$s --json --dot", 2, "--json and --dot"},
        {"plan %4$s --dot --json", 2, "--json and --dot"},
        {"plan %4$s --what-if", 2, "--profile"},
        {"run /dev/stdin < /dev/zero", 1, "NUL byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_out o;
        snprintf(args, sizeof args, cases[i].fmt, model, text_gguf, empty, kg);
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, cases[i].rc, "kiln %s: rc %d: %s", args, o.rc, o.err);
        cr_assert(strstr(o.err, cases[i].say), "kiln %s: stderr lacks '%s': %s", args, cases[i].say, o.err);
    }
    cli_out o; /* the same flags alone are fine */
    snprintf(args, sizeof args, "plan %s --json --json --backend cpu", kg);
    kiln_cli(&o, args);
    cr_assert(o.rc == 0 && strstr(o.out, "\"kernels\""), "kiln %s: %s", args, o.err);

    /* --disasm without spirv-dis on PATH says so before any output; with it, the listing comes */
    char exe[PATH_MAX], cmd[2 * PATH_MAX], outp[] = "/tmp/kiln_cli_disXXXXXX";
    kiln_exe(exe, sizeof exe);
    int fd = mkstemp(outp);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "PATH=/nonexistent '%s' spirv '%s' --disasm >%s 2>&1", exe, kg, outp);
    int st = system(cmd);
    slurp(outp, o.err, sizeof o.err);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s", o.err);
    cr_assert(strstr(o.err, "spirv-dis, which is not on PATH"), "%s", o.err);
    unlink(outp);
    unlink(model);
    unlink(text_gguf);
    unlink(empty);
    unlink(kg);
}

/* kiln plan shows a paged attention's capacity (block, pool, sequences, keys, tokens), as text
 * and as JSON. */
Test(cli, plan_shows_paged_capacity)
{
    cli_out o;
    kiln_cli(&o, "plan " KILN_SOURCE_DIR "/tests/data/every_op.kg --backend cpu");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, "paged attention pa: blocks of 4 tokens, pool of 2 blocks per kv head (f32), up to 4 sequences x 2 blocks (8 keys each), 8 new tokens per step"),
              "%s", o.out);
    cr_assert(strstr(o.out, "paged_attention"), "the region's ops name it: %s", o.out);
    kiln_cli(&o, "run " KILN_SOURCE_DIR "/tests/data/every_op.kg --backend cpu --set ns=3"); /* a step kiln_run accepts */
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, "paged        f32   [8, 2, 16]"), "%s", o.out);
    kiln_cli(&o, "plan " KILN_SOURCE_DIR "/tests/data/every_op.kg --backend cpu --json");
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.out, "\"paged\": [{\"node\": \"pa\", \"block\": 4, \"pool_blocks\": 2, \"kv_dtype\": \"f32\", \"max_seqs\": 4, "
                            "\"max_blocks_per_seq\": 2, \"max_tokens\": 8, \"draft_trees\": false}, {\"node\": \"pw\", \"block\": 4, "
                            "\"pool_blocks\": 2, \"kv_dtype\": \"f32\", \"max_seqs\": 4, \"max_blocks_per_seq\": 2, \"max_tokens\": 8, "
                            "\"draft_trees\": false}]"),
              "%s", o.out);
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
    cr_assert(strstr(o.err, "--host measures kiln_run_async on cuda, but the plan runs on cpu"), "%s", o.err);
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
                          "--arch gpt x.gguf", "", "--shape 13b x.gguf", "--layers 2x x.gguf"};
    const int rcs[] = {0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
    const char *say[] = {"usage: gen_model", "--shape", "--bogus", "--layers", "1..200", "q9", "gpt", "no output path",
                         "13b", "2x"};
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

/* ------------------------------------------------------------------ progress and settings (issue #23) */

/* kiln_cli with environment assignments ENV ("A=1 B=2") before `kiln ARGS`. */
static void kiln_cli_env(cli_out *o, const char *env, const char *args)
{
    char exe[PATH_MAX], cmd[8192];
    kiln_exe(exe, sizeof exe);
    snprintf(cmd, sizeof cmd, "--version >/dev/null; env %s '%s' %s", env, exe, args); /* the second command is captured */
    kiln_cli(o, cmd);
}

Test(cli, progress_lines_quiet_and_cache_warnings, .timeout = 300)
{
    char path[] = "/tmp/kiln_cli_modelXXXXXX", args[1024], env[1024], cache[] = "/tmp/kiln_cli_cacheXXXXXX";
    write_model(path);
    cr_assert_not_null(mkdtemp(cache));
    cli_out o;
    /* KILN_PROGRESS=1 forces lines (stderr is a file here): model loading, the compile's count, the
     * prefill; --quiet or a stderr that is not a terminal: none. */
    const char *forms[4] = {"KILN_PROGRESS=1", "KILN_PROGRESS=1 + --quiet", "not a terminal", "--quiet first"};
    for (int f = 0; f < 4; f++) {
        snprintf(env, sizeof env, "KILN_CACHE_DIR=%s KILN_PROGRESS=%s", cache, f == 2 ? "" : "1");
        snprintf(args, sizeof args, "%sgenerate %s --ids 1,2,3 -n 2 --temp 0 --backend cpu %s", f == 3 ? "--quiet " : "", path,
                 f == 1 ? "--quiet" : "");
        kiln_cli_env(&o, env, args);
        cr_assert_eq(o.rc, 0, "%s: %s", forms[f], o.err);
        bool lines = strstr(o.err, "kiln: loading the model") && strstr(o.err, "kiln: compiling kernels ") &&
                     strstr(o.err, ", done") && strstr(o.err, "kiln: prefill of 3 tokens");
        if (f == 0) cr_assert(lines, "forced progress lines: %s", o.err);
        else cr_assert_null(strstr(o.err, "kiln: compiling"), "%s: no progress lines: %s", forms[f], o.err);
        cr_assert(strstr(o.err, "generated 2 tokens"), "%s", o.err);
    }
    /* Bad settings warn, --quiet or not (it silences progress, not misconfiguration). */
    snprintf(args, sizeof args, "run %s/tests/data/gpt2_mlp.kg --backend cpu", KILN_SOURCE_DIR);
    snprintf(env, sizeof env, "KILN_CACHE=bogus KILN_CACHE_MAX=3x KILN_CACHE_DIR=%s", cache);
    kiln_cli_env(&o, env, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.err, "KILN_CACHE='bogus' is not one of off, on, all") && strstr(o.err, "KILN_CACHE_MAX='3x' is not a size"),
              "%s", o.err);
    strcat(args, " --quiet");
    kiln_cli_env(&o, env, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.err, "KILN_CACHE='bogus'"), "--quiet: %s", o.err);
    /* A folder that cannot be made (under a regular file): one warning, the run still works, also
     * when the run would write nothing there (the CPU's kernels: KILN_CACHE=on). */
    snprintf(args, sizeof args, "run %s/tests/data/gpt2_mlp.kg --backend cpu", KILN_SOURCE_DIR);
    snprintf(env, sizeof env, "KILN_CACHE=on KILN_CACHE_DIR=%s/x", path); /* on, whatever the caller's KILN_CACHE */
    kiln_cli_env(&o, env, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    cr_assert(strstr(o.err, "caching in memory only"), "%s", o.err);
    unlink(path);
    snprintf(args, sizeof args, "rm -rf '%s'", cache);
    cr_assert_eq(system(args), 0);
}

Test(cli, plan_svg_places_every_kernel_inside_the_plot, .timeout = 120)
{
    char svg[] = "/tmp/kiln_cli_svgXXXXXX", args[512];
    int fd = mkstemp(svg);
    cr_assert_geq(fd, 0);
    close(fd);
    cli_out o;
    snprintf(args, sizeof args, "plan --preset qwen2-0.5b --backend cpu --svg %s", svg);
    kiln_cli(&o, args);
    cr_assert_eq(o.rc, 0, "%s", o.err);
    int drawn = -1, total = -1;
    const char *m = strstr(o.err, "roofline of ");
    cr_assert(m && sscanf(m, "roofline of %d kernels (of %d", &drawn, &total) == 2, "%s", o.err);
    cr_assert(drawn > 0 && drawn <= total, "%d of %d", drawn, total);
    static char text[1 << 16];
    slurp(svg, text, sizeof text);
    cr_assert(strstr(text, "<svg ") && strstr(text, "</svg>") && strstr(text, ">cpu: "), "%.400s", text);
    int circles = 0;
    for (const char *c = text; (c = strstr(c, "<circle cx='")); c++, circles++) {
        double x, y;
        cr_assert_eq(sscanf(c, "<circle cx='%lf' cy='%lf'", &x, &y), 2);
        cr_assert(x >= 80 && x <= 840 && y >= 40 && y <= 460, "kernel %d at (%g, %g) is outside the plot", circles, x, y);
    }
    cr_assert_eq(circles, drawn, "one dot per kernel with FLOPs");
    kiln_cli(&o, "plan --preset qwen2-0.5b --svg /nonexistent/dir/x.svg");
    cr_assert_eq(o.rc, 1, "%s", o.err);
    cr_assert(strstr(o.err, "--svg /nonexistent/dir/x.svg: cannot write it"), "%s", o.err);
    unlink(svg);
}
