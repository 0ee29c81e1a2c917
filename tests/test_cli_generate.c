/* Tests of the kiln tool on GGUF models: generate (greedy ids as the API's on each backend, --profile,
 * text and logits against the API with llama.cpp's test vocabularies, eos and stop strings, chat
 * templates, seeded sampling), info and bench of a model file, and model errors that name the
 * culprit. Run as child processes (support/cli.h). Never asserts on speed. */
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
#include "support/cli.h"
#include "support/gguf_writer.h"
#include "tok/tok.h"

#ifndef KILN_VOCAB_DIR
#define KILN_VOCAB_DIR ""
#endif

/* ------------------------------------------------------------------ GGUF models */

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

/* The greedy ids after prompt 1,2,3 through the API on ref (what generate must print) of the model
 * at path, 8 of them into want and as --json prints them ("[a, b, ...]") into ids. */
static void greedy_ids(const char *path, int32_t want[8], char *ids, size_t n)
{
    api_run(path, (const int32_t[]){1, 2, 3}, 3, 8, want, NULL);
    snprintf(ids, n, "[");
    for (int i = 0; i < 8; i++) snprintf(ids + strlen(ids), n - strlen(ids), "%s%d", i ? ", " : "", want[i]);
    snprintf(ids + strlen(ids), n - strlen(ids), "]");
}

Test(cli, generate_prints_the_greedy_ids_on_each_backend)
{
    char path[] = "/tmp/kiln_cli_modelXXXXXX", args[512];
    write_model(path);
    int32_t want[8];
    char ids[256];
    greedy_ids(path, want, ids, sizeof ids);
    const char *bes[] = {"ref", "cpu"};
    for (int v = 0; v < 4; v++) { /* each backend alone, then split over 2 virtual devices (issue #24): the same ids */
        const char *be = bes[v % 2];
        bool tp = v >= 2;
        cli_out o;
        snprintf(args, sizeof args, "generate %s --ids 1,2,3 -n 8 --temp 0 --backend %s%s --json", path, be, tp ? " --gpus 2" : "");
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
        cr_assert(strstr(o.out, ids), "kiln %s: want ids %s in %s", args, ids, o.out);
        char key[64];
        if (tp) snprintf(key, sizeof key, "\"devices\": \"%s:0,1\"", be);
        else snprintf(key, sizeof key, "\"backend\": \"%s\"", be);
        cr_assert(strstr(o.out, key), "%s", o.out);
        if (!tp) cr_assert(json_key(o.out, "prefill_tok_s") > 0 && json_key(o.out, "decode_tok_s") > 0, "%s", o.out);
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
Test(cli, generate_profile_says_where_a_step_goes, .timeout = 300)
{
    char path[] = "/tmp/kiln_cli_modelXXXXXX", args[1024];
    write_model(path);
    int32_t want[8];
    char ids[256];
    greedy_ids(path, want, ids, sizeof ids);
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

/* A mixture of experts: info says only the routed experts run; bench --model reads (and reports) the
 * routed share of the expert stacks in fewer kernels than --moe-dense, which reads them all. */
Test(cli, moe_info_and_bench_read_the_routed_experts, .timeout = 300)
{
    char path[] = "/tmp/kiln_cli_moeXXXXXX", args[512];
    gw_model m = cli_model;
    m.arch = "qwen3moe", m.n_expert = 16, m.n_expert_used = 2, m.ffn_exp = 32, m.tokens = false;
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(gw_model_write(&m, path), 0);
    cli_out o;
    snprintf(args, sizeof args, "info %s", path);
    kiln_cli(&o, args);
    cr_assert(o.rc == 0 && strstr(o.out, "16 experts of ffn 32, 2 routed per token") &&
              strstr(o.out, "only the routed experts run"), "%s%s", o.out, o.err);
    double bytes[2], kernels[2];
    for (int dense = 0; dense < 2; dense++) {
        snprintf(args, sizeof args, "bench --model %s --ctx 4 --steps 2 --json%s", path, dense ? " --moe-dense" : "");
        kiln_cli(&o, args);
        cr_assert_eq(o.rc, 0, "kiln %s: %s", args, o.err);
        bytes[dense] = json_key(o.out, "weight_bytes_read"), kernels[dense] = json_key(o.out, "kernels");
        cr_assert(bytes[dense] > 0 && kernels[dense] > 0 && json_key(o.out, "tok_s") > 0, "%s", o.out);
    }
    cr_assert(bytes[0] < bytes[1] && kernels[0] < kernels[1], "routed: %g bytes, %g kernels; dense: %g, %g", bytes[0],
              kernels[0], bytes[1], kernels[1]);
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
