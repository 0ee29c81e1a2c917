/* `kiln generate MODEL.gguf --ids ...`: prefill, then greedy decode with one compiled plan, and a
 * report of ids, text and tokens/s. Must not abort on user input or a malformed file. */
#include <stdlib.h>
#include <string.h>

#include "cli/model_run.h"

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
        int r = kiln_cli_model_flag(&a, &o);
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
    if (rc == KILN_CLI_OK) rc = kiln_cli_model_load("generate", &o, n_ids + n_gen, n_ids, &m);
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
        kiln_status s = kiln_cli_model_step(&m, ids, n_ids, 0, &out[0]);
        double t1 = kiln_cli_now();
        for (int64_t i = 1; s == KILN_OK && i < n_gen; i++) s = kiln_cli_model_step(&m, &out[i - 1], 1, n_ids + i - 1, &out[i]);
        double t2 = kiln_cli_now();
        if (s != KILN_OK) rc = kiln_cli_fail("generate", m.ctx, s, "running");
        else gen_report(&o, &m, out, n_gen, n_ids, t1 - t0, t2 - t1);
    }
    free(out);
    free(ids);
    kiln_cli_model_free(&m);
    return rc;
}
