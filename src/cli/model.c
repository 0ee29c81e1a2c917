/* GGUF model commands of the kiln tool: `kiln generate MODEL.gguf --ids ...` (prefill, then greedy
 * decode with one compiled plan), `kiln info MODEL.gguf` (architecture, sizes, tensor types, where
 * kiln would run it) and `kiln bench --model MODEL.gguf` (timed prefill or decode steps). Must not
 * abort on user input or a malformed file; prints a progress line only on a terminal. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* A loaded model: file, its info, the compiled plan and run buffers. */
typedef struct model_run {
    kiln_ctx        *ctx;    /* context */
    kiln_gguf       *file;   /* the mapped file */
    kiln_model_info  info;   /* metadata */
    kiln_plan       *plan;   /* compiled decoder */
    int32_t         *pos;    /* positions [max_tok] */
    int32_t         *next;   /* argmax of the last token [1] */
    double           load_s; /* open + page-in + build + compile */
} model_run;

/* Shared flags of generate and bench --model. */
typedef struct model_opts {
    const char *path;    /* MODEL.gguf */
    const char *backend; /* --backend or NULL (auto) */
    int64_t     threads; /* --threads; 0 = one per core */
    bool        json;    /* --json */
} model_opts;

static void model_free(model_run *m)
{
    kiln_plan_free(m->plan);
    kiln_gguf_close(m->file);
    kiln_ctx_free(m->ctx);
    free(m->pos);
    free(m->next);
}

/* Touches every page of the tensor data once (so the first run does not pay the page faults),
 * with a progress line on a terminal for files over 64 MiB. */
static void page_in(const kiln_gguf *f, bool progress)
{
    int64_t n = kiln_gguf_tensor_count(f);
    size_t total = kiln_gguf_size(f), done = 0, shown = 0;
    progress = progress && total > ((size_t)64 << 20);
    volatile unsigned char sink = 0;
    for (int64_t i = 0; i < n; i++) {
        kiln_gguf_tensor t;
        if (kiln_gguf_tensor_at(f, i, &t) != KILN_OK) continue;
        const unsigned char *p = t.data;
        for (size_t off = 0; off < t.bytes; off += 4096) sink ^= p[off];
        done += t.bytes;
        if (progress && done - shown > total / 50) {
            shown = done;
            fprintf(stderr, "\r  loading %.0f/%.0f MiB (%.0f%%)   ", (double)done / 1048576, (double)total / 1048576,
                    100.0 * (double)done / (double)total);
        }
    }
    if (progress) fprintf(stderr, "\r%60s\r", "");
    (void)sink;
}

/* Opens, pages in, builds (max_ctx rows, max_tok tokens) and compiles. Exit code. */
static int model_load(const char *cmd, const model_opts *o, int64_t max_ctx, int64_t max_tok, model_run *m)
{
    double t0 = kiln_cli_now();
    kiln_ctx_options co = {.quiet = true, .n_threads = (int)o->threads};
    kiln_status s = kiln_ctx_new(&co, &m->ctx);
    if (s != KILN_OK) return kiln_cli_fail(cmd, m->ctx, s, "creating the context");
    if ((s = kiln_gguf_open(m->ctx, o->path, &m->file)) != KILN_OK) return kiln_cli_fail(cmd, m->ctx, s, "opening the model");
    if ((s = kiln_model_info_get(m->file, &m->info)) != KILN_OK) return kiln_cli_fail(cmd, m->ctx, s, "reading the model");
    if (max_ctx > m->info.n_ctx_train) {
        fprintf(stderr, "kiln %s: %lld positions asked (%s), the model's context is %lld\n", cmd, (long long)max_ctx,
                strcmp(cmd, "generate") == 0 ? "prompt + -n" : "--ctx + --steps + 1, or --tokens",
                (long long)m->info.n_ctx_train);
        return KILN_CLI_USAGE;
    }
    page_in(m->file, !o->json && isatty(2));
    kiln_model_options mo = {.max_ctx = max_ctx, .max_tok = max_tok, .kv_dtype = KILN_DTYPE_F16, .last_only = true};
    kiln_graph *g = NULL;
    if ((s = kiln_model_build(m->file, &mo, &g)) != KILN_OK) return kiln_cli_fail(cmd, m->ctx, s, "building the graph");
    s = kiln_compile(m->ctx, g, &(kiln_compile_options){.backend = o->backend}, &m->plan);
    kiln_graph_free(g);
    if (s != KILN_OK) return kiln_cli_fail(cmd, m->ctx, s, "compiling");
    m->pos = malloc((size_t)max_tok * sizeof *m->pos);
    m->next = malloc(sizeof *m->next);
    if (!m->pos || !m->next) return kiln_cli_fail(cmd, NULL, KILN_ERR_NOMEM, "allocating buffers");
    m->load_s = kiln_cli_now() - t0;
    return KILN_CLI_OK;
}

/* One run of n ids at positions start..; *out = the argmax after the last one. */
static kiln_status model_step(model_run *m, const int32_t *ids, int64_t n, int64_t start, int32_t *out)
{
    for (int64_t i = 0; i < n; i++) m->pos[i] = (int32_t)(start + i);
    int32_t last = (int32_t)(n - 1);
    kiln_binding b[6] = {{.name = "n_tok", .value = n},
                         {.name = "n_kv", .value = start + n},
                         {.name = "ids", .data = (void *)ids, .bytes = (size_t)n * sizeof *ids},
                         {.name = "pos", .data = m->pos, .bytes = (size_t)n * sizeof *m->pos},
                         {.name = "last", .data = &last, .bytes = sizeof last},
                         {.name = "next", .data = m->next, .bytes = sizeof *m->next}};
    kiln_status s = kiln_run(m->plan, b, 6);
    if (s == KILN_OK && out) *out = m->next[0];
    return s;
}

/* Parses --backend/--threads/--json and the model path; 1 when a->argv[a->i] was one, 0 when not,
 * or an exit code (negative: KILN_CLI_USAGE). */
static int common_flag(kiln_cli_args *a, model_opts *o)
{
    const char *v = NULL;
    int r;
    if ((r = kiln_cli_flag_value(a, "--backend", &v)) != 0) {
        o->backend = v;
        return r < 0 ? -KILN_CLI_USAGE : 1;
    }
    if ((r = kiln_cli_flag_value(a, "--threads", &v)) != 0)
        return r < 0 || !kiln_cli_parse_i64(a->cmd, "--threads", v, 1, 256, &o->threads) ? -KILN_CLI_USAGE : 1;
    if (strcmp(a->argv[a->i], "--json") == 0) {
        o->json = true;
        a->i++;
        return 1;
    }
    return 0;
}

/* Parses "1,2,3" into ids (malloc'ed). */
static bool parse_ids(const char *cmd, const char *s, int32_t **ids, int64_t *n)
{
    int64_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    *ids = malloc((size_t)cap * sizeof **ids);
    *n = 0;
    if (!*ids) return false;
    char buf[32];
    for (const char *p = s;; p++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int64_t v;
        if (len == 0 || len >= sizeof buf) {
            fprintf(stderr, "kiln %s: --ids wants comma-separated token ids, got '%s'\n", cmd, s);
            return false;
        }
        memcpy(buf, p, len);
        buf[len] = 0;
        if (!kiln_cli_parse_i64(cmd, "--ids", buf, 0, INT32_MAX, &v)) return false;
        (*ids)[(*n)++] = (int32_t)v;
        if (!e) return true;
        p = e;
    }
}

/* Prints token id's text (sentencepiece "▁" and byte-level "Ġ"/"Ċ" shown as space/newline, byte
 * tokens "<0xHH>" as their byte). */
static void print_token(FILE *out, const kiln_gguf *f, int32_t id)
{
    const char *s;
    size_t len;
    if (kiln_gguf_get_arr_str(f, "tokenizer.ggml.tokens", (uint64_t)id, &s, &len) != KILN_OK) return;
    unsigned byte;
    char hex[7] = {0};
    if (len == 6 && (memcpy(hex, s, 6), sscanf(hex, "<0x%2x>", &byte) == 1) && hex[5] == '>') { /* byte token */
        fputc((int)byte, out);
        return;
    }
    for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && (unsigned char)s[i] == 0xe2 && (unsigned char)s[i + 1] == 0x96 && (unsigned char)s[i + 2] == 0x81)
            fputc(' ', out), i += 2;
        else if (i + 1 < len && (unsigned char)s[i] == 0xc4 && (unsigned char)s[i + 1] == 0xa0)
            fputc(' ', out), i += 1;
        else if (i + 1 < len && (unsigned char)s[i] == 0xc4 && (unsigned char)s[i + 1] == 0x8a)
            fputc('\n', out), i += 1;
        else
            fputc(s[i], out);
    }
}

static void gen_report(const model_opts *o, model_run *m, const int32_t *out, int64_t n_out, int64_t n_prompt,
                       double prefill_s, double decode_s)
{
    double pf = prefill_s > 0 ? (double)n_prompt / prefill_s : 0;
    double dc = n_out > 1 && decode_s > 0 ? (double)(n_out - 1) / decode_s : 0;
    double ms = n_out > 1 ? decode_s * 1e3 / (double)(n_out - 1) : 0;
    bool has_text = kiln_gguf_kv_find(m->file, "tokenizer.ggml.tokens") >= 0;
    if (o->json) {
        printf("{\"ids\": [");
        for (int64_t i = 0; i < n_out; i++) printf("%s%d", i ? ", " : "", out[i]);
        printf("], \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, \"ms_per_token\": %.4f, \"backend\": ", pf, dc, ms);
        kiln_cli_json_str(stdout, kiln_plan_backend(m->plan));
        printf("}\n");
        return;
    }
    printf("ids:");
    for (int64_t i = 0; i < n_out; i++) printf(" %d", out[i]);
    printf("\n");
    if (has_text) {
        printf("text: ");
        for (int64_t i = 0; i < n_out; i++) print_token(stdout, m->file, out[i]);
        printf("\n");
    }
    printf("%s on %s, %d kernels, loaded in %.0f ms\n", m->info.arch, kiln_plan_backend(m->plan),
           kiln_plan_kernel_count(m->plan), m->load_s * 1e3);
    printf("prefill: %lld tokens in %.2f ms (%.1f tok/s)\n", (long long)n_prompt, prefill_s * 1e3, pf);
    printf("decode:  %lld tokens in %.2f ms (%.1f tok/s, %.3f ms/token)\n", (long long)(n_out - 1), decode_s * 1e3, dc,
           ms);
}

int kiln_cli_generate(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "generate")) return KILN_CLI_OK;
    model_opts o = {0};
    int64_t n_gen = 32, n_ids = 0;
    int32_t *ids = NULL;
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "generate"};
    int rc = KILN_CLI_OK;
    while (rc == KILN_CLI_OK && a.i < argc) {
        const char *v = NULL;
        int r = common_flag(&a, &o);
        if (r < 0) rc = -r;
        else if (r > 0) continue;
        else if ((r = kiln_cli_flag_value(&a, "-n", &v)) != 0)
            rc = r < 0 || !kiln_cli_parse_i64("generate", "-n", v, 1, 1 << 20, &n_gen) ? KILN_CLI_USAGE : KILN_CLI_OK;
        else if ((r = kiln_cli_flag_value(&a, "--ids", &v)) != 0) {
            free(ids);
            rc = r < 0 || !parse_ids("generate", v, &ids, &n_ids) ? KILN_CLI_USAGE : KILN_CLI_OK;
        } else if (argv[a.i][0] == '-')
            rc = kiln_cli_unknown_flag("generate", argv[a.i]);
        else if (o.path)
            fprintf(stderr, "kiln generate: unexpected argument '%s'\n", argv[a.i]), rc = KILN_CLI_USAGE;
        else
            o.path = argv[a.i++];
    }
    if (rc == KILN_CLI_OK && (!o.path || !n_ids)) {
        fprintf(stderr, "kiln generate: needs MODEL.gguf and --ids (see kiln generate --help)\n");
        rc = KILN_CLI_USAGE;
    }
    model_run m = {0};
    if (rc == KILN_CLI_OK) rc = model_load("generate", &o, n_ids + n_gen, n_ids, &m);
    for (int64_t i = 0; rc == KILN_CLI_OK && i < n_ids; i++)
        if (ids[i] >= m.info.n_vocab) {
            fprintf(stderr, "kiln generate: --ids: id %d is past the vocabulary (%lld tokens)\n", ids[i],
                    (long long)m.info.n_vocab);
            rc = KILN_CLI_USAGE;
        }
    int32_t *out = rc == KILN_CLI_OK ? malloc((size_t)n_gen * sizeof *out) : NULL;
    if (rc == KILN_CLI_OK && !out) rc = kiln_cli_fail("generate", NULL, KILN_ERR_NOMEM, "allocating");
    if (rc == KILN_CLI_OK) {
        double t0 = kiln_cli_now();
        kiln_status s = model_step(&m, ids, n_ids, 0, &out[0]);
        double t1 = kiln_cli_now();
        for (int64_t i = 1; s == KILN_OK && i < n_gen; i++) s = model_step(&m, &out[i - 1], 1, n_ids + i - 1, &out[i]);
        double t2 = kiln_cli_now();
        if (s != KILN_OK) rc = kiln_cli_fail("generate", m.ctx, s, "running");
        else gen_report(&o, &m, out, n_gen, n_ids, t1 - t0, t2 - t1);
    }
    free(out);
    free(ids);
    model_free(&m);
    return rc;
}

/* Tensor count and bytes per type, for info. */
typedef struct type_stat {
    const char *name;  /* type name */
    int64_t     n;     /* tensors */
    size_t      bytes; /* their bytes */
    bool        ok;    /* kiln has the dtype */
} type_stat;

static int type_stats(const kiln_gguf *f, type_stat *st, int max)
{
    int n = 0;
    for (int64_t i = 0; i < kiln_gguf_tensor_count(f); i++) {
        kiln_gguf_tensor t;
        if (kiln_gguf_tensor_at(f, i, &t) != KILN_OK) continue;
        int k = 0;
        while (k < n && strcmp(st[k].name, t.type_name) != 0) k++;
        if (k == n && n == max) continue;
        if (k == n) st[n++] = (type_stat){.name = t.type_name, .ok = t.t != KILN_DTYPE_COUNT};
        st[k].n++;
        st[k].bytes += t.bytes;
    }
    return n;
}

/* The plan kiln would make for one decode step: backend and kernel count (compile only). */
static kiln_status would_run(kiln_ctx *ctx, const kiln_gguf *f, const kiln_model_info *mi, char *be, size_t nbe,
                             int *kernels)
{
    kiln_graph *g = NULL;
    kiln_plan *p = NULL;
    int64_t max_ctx = mi->n_ctx_train < 4096 ? mi->n_ctx_train : 4096;
    kiln_model_options mo = {.max_ctx = max_ctx, .max_tok = 1, .kv_dtype = KILN_DTYPE_F16};
    kiln_status s = kiln_model_build(f, &mo, &g);
    if (s == KILN_OK) s = kiln_compile(ctx, g, NULL, &p);
    if (s == KILN_OK) {
        snprintf(be, nbe, "%s", kiln_plan_backend(p));
        *kernels = kiln_plan_kernel_count(p);
    }
    kiln_plan_free(p);
    kiln_graph_free(g);
    return s;
}

static void info_model_json(const char *path, const kiln_gguf *f, const kiln_model_info *mi, kiln_status ms,
                            const char *why, const type_stat *st, int n_st, const char *be, int kernels)
{
    printf("{\"file\":");
    kiln_cli_json_str(stdout, path);
    printf(",\"gguf_version\":%u,\"bytes\":%zu,\"metadata\":%lld,\"tensors\":%lld,\"types\":[", kiln_gguf_version(f),
           kiln_gguf_size(f), (long long)kiln_gguf_kv_count(f), (long long)kiln_gguf_tensor_count(f));
    for (int i = 0; i < n_st; i++)
        printf("%s{\"type\":\"%s\",\"tensors\":%lld,\"bytes\":%zu,\"supported\":%s}", i ? "," : "", st[i].name,
               (long long)st[i].n, st[i].bytes, st[i].ok ? "true" : "false");
    printf("],\"runnable\":%s", ms == KILN_OK ? "true" : "false");
    if (ms != KILN_OK) {
        printf(",\"why_not\":");
        kiln_cli_json_str(stdout, why);
    } else {
        printf(",\"arch\":\"%s\",\"layers\":%d,\"hidden\":%lld,\"heads\":%lld,\"kv_heads\":%lld,\"head_dim\":%lld,"
               "\"ffn\":%lld,\"vocab\":%lld,\"context\":%lld,\"rope\":\"%s\",\"rope_theta\":%g,\"rms_eps\":%g,"
               "\"qkv_bias\":%s,\"tied_output\":%s,\"weight_bytes\":%zu,\"backend\":\"%s\",\"kernels\":%d",
               mi->arch, mi->n_layer, (long long)mi->hidden, (long long)mi->n_head, (long long)mi->n_kv_head,
               (long long)mi->head_dim, (long long)mi->ffn, (long long)mi->n_vocab, (long long)mi->n_ctx_train,
               mi->rope == KILN_ROPE_NEOX ? "neox" : "normal", mi->theta, mi->eps, mi->qkv_bias ? "true" : "false",
               mi->tied_output ? "true" : "false", mi->weight_bytes, be, kernels);
    }
    printf("}\n");
}

static void info_model_text(const char *path, kiln_ctx *ctx, const kiln_gguf *f, const kiln_model_info *mi,
                            kiln_status ms, const char *why, const type_stat *st, int n_st, const char *be, int kernels)
{
    const char *name = NULL;
    kiln_gguf_get_str(f, "general.name", &name, NULL);
    printf("%s: GGUF v%u, %.1f MiB, %lld metadata keys, %lld tensors%s%s%s\n", path, kiln_gguf_version(f),
           (double)kiln_gguf_size(f) / 1048576, (long long)kiln_gguf_kv_count(f), (long long)kiln_gguf_tensor_count(f),
           name ? " (" : "", name ? name : "", name ? ")" : "");
    printf("tensor types:\n");
    for (int i = 0; i < n_st; i++)
        printf("  %-8s %5lld tensors %10.2f MiB%s\n", st[i].name, (long long)st[i].n, (double)st[i].bytes / 1048576,
               st[i].ok ? "" : "   (kiln cannot run this type)");
    if (ms != KILN_OK) {
        printf("kiln cannot run it: %s: %s\n", kiln_status_str(ms), why);
        return;
    }
    printf("model:  %s, %d layers, hidden %lld, %lld heads (%lld KV, head dim %lld), ffn %lld, vocab %lld\n", mi->arch,
           mi->n_layer, (long long)mi->hidden, (long long)mi->n_head, (long long)mi->n_kv_head, (long long)mi->head_dim,
           (long long)mi->ffn, (long long)mi->n_vocab);
    printf("        context %lld, rope %s theta %g, rms eps %g%s%s\n", (long long)mi->n_ctx_train,
           mi->rope == KILN_ROPE_NEOX ? "neox" : "normal", mi->theta, mi->eps, mi->qkv_bias ? ", q/k/v biases" : "",
           mi->tied_output ? ", tied output head" : "");
    printf("kiln would run it on: %s (%s), %d kernels per decode step (%.1f per layer), %.1f MiB of weights read "
           "per token\n", be, strcmp(be, "cpu") == 0 ? kiln_cpu_isa(ctx) : "-", kernels,
           mi->n_layer ? (double)kernels / mi->n_layer : 0.0, (double)mi->weight_bytes / 1048576);
}

int kiln_cli_info_model(const char *path, bool json)
{
    kiln_ctx *ctx = NULL;
    kiln_gguf *f = NULL;
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx);
    if (s != KILN_OK) return kiln_cli_fail("info", ctx, s, "creating the context");
    if ((s = kiln_gguf_open(ctx, path, &f)) != KILN_OK) {
        int rc = kiln_cli_fail("info", ctx, s, "opening the model");
        kiln_ctx_free(ctx);
        return rc;
    }
    type_stat st[48];
    int n_st = type_stats(f, st, 48), kernels = 0;
    kiln_model_info mi = {0};
    char be[32] = "", why[1024] = "";
    kiln_status ms = kiln_model_info_get(f, &mi);
    if (ms == KILN_OK) ms = would_run(ctx, f, &mi, be, sizeof be, &kernels);
    if (ms != KILN_OK) snprintf(why, sizeof why, "%s", kiln_ctx_error(ctx));
    if (json) info_model_json(path, f, &mi, ms, why, st, n_st, be, kernels);
    else info_model_text(path, ctx, f, &mi, ms, why, st, n_st, be, kernels);
    kiln_gguf_close(f);
    kiln_ctx_free(ctx);
    return KILN_CLI_OK;
}

static int cmp_f64(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Flags of `kiln bench --model`. */
typedef struct bench_model_opts {
    model_opts common;  /* model path, backend, threads, json */
    bool       prefill; /* --mode prefill */
    bool       profile; /* --profile */
    int64_t    steps;   /* --steps (0: 16 decode, 4 prefill) */
    int64_t    ctx0;    /* --ctx: KV length before the first decode step (-1: 256) */
    int64_t    tokens;  /* --tokens: prefill length (0: 128) */
} bench_model_opts;

static int bench_model_args(int argc, char *const *argv, bench_model_opts *b)
{
    *b = (bench_model_opts){.ctx0 = -1};
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "bench"};
    int rc = KILN_CLI_OK;
    while (rc == KILN_CLI_OK && a.i < argc) {
        const char *v = NULL;
        int r = common_flag(&a, &b->common);
        if (r < 0) rc = -r;
        else if (r > 0) continue;
        else if ((r = kiln_cli_flag_value(&a, "--model", &v)) != 0) b->common.path = v, rc = r < 0 ? KILN_CLI_USAGE : rc;
        else if ((r = kiln_cli_flag_value(&a, "--mode", &v)) != 0) {
            if (r < 0 || (strcmp(v, "decode") != 0 && strcmp(v, "prefill") != 0)) {
                fprintf(stderr, "kiln bench: --mode wants decode or prefill, got '%s'\n", r < 0 ? "" : v);
                rc = KILN_CLI_USAGE;
            } else b->prefill = v[0] == 'p';
        } else if ((r = kiln_cli_flag_value(&a, "--steps", &v)) != 0)
            rc = r < 0 || !kiln_cli_parse_i64("bench", "--steps", v, 1, 100000, &b->steps) ? KILN_CLI_USAGE : rc;
        else if ((r = kiln_cli_flag_value(&a, "--ctx", &v)) != 0)
            rc = r < 0 || !kiln_cli_parse_i64("bench", "--ctx", v, 0, 1 << 24, &b->ctx0) ? KILN_CLI_USAGE : rc;
        else if ((r = kiln_cli_flag_value(&a, "--tokens", &v)) != 0)
            rc = r < 0 || !kiln_cli_parse_i64("bench", "--tokens", v, 1, 1 << 20, &b->tokens) ? KILN_CLI_USAGE : rc;
        else if (strcmp(argv[a.i], "--profile") == 0) b->profile = true, a.i++;
        else rc = kiln_cli_unknown_flag("bench", argv[a.i]);
    }
    if (!b->steps) b->steps = b->prefill ? 4 : 16;
    if (b->ctx0 < 0) b->ctx0 = 256;
    if (!b->tokens) b->tokens = 128;
    return rc;
}

static void bench_model_report(const bench_model_opts *b, const model_run *m, const double *ms, int64_t n_tok)
{
    double *sorted = malloc((size_t)b->steps * sizeof *sorted);
    if (!sorted) return;
    memcpy(sorted, ms, (size_t)b->steps * sizeof *sorted);
    qsort(sorted, (size_t)b->steps, sizeof *sorted, cmp_f64);
    int64_t n = b->steps;
    double med = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    double tok_s = (double)n_tok / (med * 1e-3), gbps = (double)m->info.weight_bytes * 1e-9 / (med * 1e-3);
    const char *be = kiln_plan_backend(m->plan), *mode = b->prefill ? "prefill" : "decode";
    int threads = b->common.threads ? (int)b->common.threads : kiln_cli_threads();
    if (b->common.json) {
        printf("{\"model\":");
        kiln_cli_json_str(stdout, b->common.path);
        printf(",\"arch\":\"%s\",\"mode\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"steps\":%lld,\"tokens\":%lld,"
               "\"ctx\":%lld,\"kernels\":%d,\"ms_per_step\":%.6f,\"tok_s\":%.4f,\"weight_gb_per_s\":%.4f,\"step_ms\":[",
               m->info.arch, mode, be, threads, (long long)n, (long long)n_tok, (long long)(b->prefill ? 0 : b->ctx0),
               kiln_plan_kernel_count(m->plan), med, tok_s, gbps);
        for (int64_t i = 0; i < n; i++) printf("%s%.6f", i ? "," : "", ms[i]);
        printf("]}\n");
    } else {
        printf("%s (%s, %d layers) %s on %s, %d threads, %d kernels\n", b->common.path, m->info.arch, m->info.n_layer,
               mode, be, threads, kiln_plan_kernel_count(m->plan));
        if (b->prefill) printf("  %lld tokens, %lld steps\n", (long long)n_tok, (long long)n);
        else printf("  n_kv %lld..%lld, %lld steps\n", (long long)b->ctx0 + 2, (long long)(b->ctx0 + 1 + n), (long long)n);
        printf("  median %.3f ms/step (min %.3f, max %.3f)   %.1f tok/s   %.2f GB/s of weights\n", med, sorted[0],
               sorted[n - 1], tok_s, gbps);
    }
    free(sorted);
    char *txt = NULL;
    if (b->profile && kiln_plan_explain(m->plan, "text", &txt) == KILN_OK) {
        printf("\nper kernel (measured = mean over the timed steps):\n%s", txt);
        free(txt);
    }
}

/* `kiln bench --model MODEL.gguf`: S timed decode steps from KV length --ctx, or S prefills of T tokens. */
int kiln_cli_bench_model(int argc, char *const *argv)
{
    bench_model_opts b;
    int rc = bench_model_args(argc, argv, &b);
    if (rc != KILN_CLI_OK) return rc;
    int64_t max_ctx = b.prefill ? b.tokens : b.ctx0 + b.steps + 1, max_tok = b.prefill ? b.tokens : 1;
    model_run m = {0};
    double *ms = calloc((size_t)b.steps, sizeof *ms);
    int32_t *ids = calloc((size_t)max_tok, sizeof *ids);
    rc = ms && ids ? model_load("bench", &b.common, max_ctx, max_tok, &m)
                   : kiln_cli_fail("bench", NULL, KILN_ERR_NOMEM, "allocating");
    for (int64_t i = 0; rc == KILN_CLI_OK && i < max_tok; i++) ids[i] = (int32_t)(i % m.info.n_vocab);
    kiln_status s = rc == KILN_CLI_OK ? model_step(&m, ids, max_tok, b.prefill ? 0 : b.ctx0, NULL) : KILN_OK; /* warm-up */
    if (rc == KILN_CLI_OK && b.profile) kiln_plan_profile(m.plan, true);
    for (int64_t i = 0; rc == KILN_CLI_OK && s == KILN_OK && i < b.steps; i++) {
        double t0 = kiln_cli_now();
        s = model_step(&m, ids, max_tok, b.prefill ? 0 : b.ctx0 + 1 + i, NULL);
        ms[i] = (kiln_cli_now() - t0) * 1e3;
    }
    if (rc == KILN_CLI_OK && s != KILN_OK) rc = kiln_cli_fail("bench", m.ctx, s, "running a step");
    if (rc == KILN_CLI_OK) bench_model_report(&b, &m, ms, max_tok);
    free(ms);
    free(ids);
    model_free(&m);
    return rc;
}
