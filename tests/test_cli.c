/* Tests of the kiln tool (run as a child process from the build directory: <test dir>/kiln): help
 * and usage, info, run (checksums against f64 sums of the inputs regenerated from the documented
 * fill rule), spirv/ptx listings, errors that name the real problem, plan, progress lines and
 * settings, the plan's SVG. bench and presets: test_cli_bench.c; GGUF models and generate:
 * test_cli_generate.c. Never asserts on speed. */
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

/* ------------------------------------------------------------------ progress and settings (issue #23) */

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
