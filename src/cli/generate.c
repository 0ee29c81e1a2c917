/* `kiln generate MODEL.gguf -p TEXT | --ids 1,2,3`: tokenizes the prompt with the file's own
 * tokenizer (optionally through its chat template), prefills it, then decodes one token per run of
 * the same compiled plan, sampling each (src/gen/sample.c) and streaming its text to stdout as it
 * comes; stops at an end-of-generation token, a --stop string or -n; a closing line on stderr gives
 * prompt and generation tokens/s; --profile says where a decode step's time goes. Must not abort on
 * user input or a malformed file. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/model_run.h"
#include "util/progress.h"
#include "gen/chat.h"
#include "gen/sample.h"
#include "tok/tok.h"

#define MAX_STOP 8

/* Flags of generate. */
typedef struct gen_opts {
    model_opts         common;          /* model, backend, threads, json */
    const char        *prompt;          /* -p, or the text of -f */
    char              *prompt_file;     /* -f FILE's text (malloc'ed) */
    bool               ignore_eos;      /* --ignore-eos: always -n tokens (for timing) */
    bool               profile;         /* --profile: where a decode step's time goes */
    const char        *system;          /* --system (with --chat) */
    int32_t           *ids;             /* --ids (malloc'ed) */
    int64_t            n_ids;           /* their count */
    int64_t            n_gen;           /* -n (0: until the context is full, at most 128) */
    bool               chat;            /* --chat */
    bool               seeded;          /* --seed given */
    const char        *logits_path;     /* --logits FILE */
    const char        *stop[MAX_STOP];  /* --stop strings */
    int                n_stop;          /* their count */
    kiln_sample_params sp;              /* sampling */
} gen_opts;

#define PROF_RERUNS 8  /* --profile: the last decode step run again kernel by kernel, for device times */
#define PROF_KINDS  12 /* kinds of kernel (region kind and fused ops) listed */

/* --profile's figures of the decode steps (host seconds summed over the steps). */
typedef struct gen_prof {
    double          run_s, sample_s, emit_s; /* in kiln_run, the sampler, the text (tokenizer, stop strings, stdout) */
    kiln_plan_stats pre, post;               /* the plan's run statistics after the prefill and after the last step */
    int32_t         last_id;                 /* the last decode step's token */
    int64_t         last_pos;                /* and position (rerunning it writes the same cache row again) */
    double          gpu_s;                   /* the kernels' device time of one step (the reruns' mean), 0: none */
    int             n_kinds;                 /* kinds below */
    struct {
        char        what[280];               /* region kind and fused ops */
        int         n;                       /* regions of that kind in the plan */
        double      s;                       /* their device time a step */
    } kind[PROF_KINDS];
} gen_prof;

/* What one generation produced. */
typedef struct gen_out {
    int32_t    *ids;       /* generated ids [n_gen] */
    int64_t     n;         /* how many */
    char       *text;      /* their text (valid UTF-8, stop string cut off), NUL-terminated */
    size_t      len, cap;  /* text bytes and room */
    size_t      shown;     /* bytes of text already on stdout */
    double      prefill_s; /* the prompt's run */
    double      decode_s;  /* the decode steps (run, sample, print) */
    int64_t     steps;     /* decode runs */
    const char *why;       /* "eos", "stop string", "-n" */
    gen_prof    prof;      /* --profile */
} gen_out;

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

static bool parse_f32(const char *flag, const char *s, double lo, double hi, float *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kiln generate: %s wants a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return false;
    }
    *out = (float)v;
    return true;
}

/* One sampling flag; 1 when argv[i] was one, 0 when not, -1 on a bad value. */
static int sample_flag(kiln_cli_args *a, gen_opts *o)
{
    const char *v = NULL;
    int r;
    int64_t i64;
    if ((r = kiln_cli_flag_value(a, "--temp", &v)) != 0) return r < 0 || !parse_f32("--temp", v, 0, 100, &o->sp.temp) ? -1 : 1;
    if ((r = kiln_cli_flag_value(a, "--top-p", &v)) != 0) return r < 0 || !parse_f32("--top-p", v, 0, 1, &o->sp.top_p) ? -1 : 1;
    if ((r = kiln_cli_flag_value(a, "--min-p", &v)) != 0) return r < 0 || !parse_f32("--min-p", v, 0, 1, &o->sp.min_p) ? -1 : 1;
    if ((r = kiln_cli_flag_value(a, "--repeat-penalty", &v)) != 0)
        return r < 0 || !parse_f32("--repeat-penalty", v, 0.01, 100, &o->sp.repeat_penalty) ? -1 : 1;
    if ((r = kiln_cli_flag_value(a, "--top-k", &v)) != 0) {
        if (r < 0 || !kiln_cli_parse_i64("generate", "--top-k", v, 0, INT32_MAX, &i64)) return -1;
        return o->sp.top_k = (int32_t)i64, 1;
    }
    if ((r = kiln_cli_flag_value(a, "--repeat-last-n", &v)) != 0) {
        if (r < 0 || !kiln_cli_parse_i64("generate", "--repeat-last-n", v, 0, INT32_MAX, &i64)) return -1;
        return o->sp.repeat_last_n = (int32_t)i64, 1;
    }
    if ((r = kiln_cli_flag_value(a, "--seed", &v)) != 0) {
        if (r < 0 || !kiln_cli_parse_i64("generate", "--seed", v, 0, INT64_MAX, &i64)) return -1;
        return o->sp.seed = (uint64_t)i64, o->seeded = true, 1;
    }
    return 0;
}

/* Reads the prompt file of -f (NUL-terminated, malloc'ed). */
static bool read_prompt(const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    char *b = NULL;
    size_t n = 0, cap = 0;
    bool ok = f != NULL;
    while (ok) {
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(b, cap = 2 * cap + 8192);
            if (!(ok = nb != NULL)) break;
            b = nb;
        }
        size_t got = fread(b + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            ok = !ferror(f);
            break;
        }
    }
    if (f) fclose(f);
    if (!ok) {
        fprintf(stderr, "kiln generate: -f: cannot read '%s'\n", path);
        free(b);
        return false;
    }
    b[n] = 0;
    *out = b;
    return true;
}

/* Prompt, output and mode flags; same return convention. */
static int text_flag(kiln_cli_args *a, gen_opts *o)
{
    const char *v = NULL;
    int r;
    bool p = (r = kiln_cli_flag_value(a, "-p", &v)) != 0, f = !p && (r = kiln_cli_flag_value(a, "-f", &v)) != 0;
    if ((p || f) && r > 0 && o->prompt) fprintf(stderr, "kiln generate: takes one of -p, -f and --ids\n");
    if ((p || f) && (r < 0 || o->prompt)) return -1;
    if (p) return o->prompt = v, 1;
    if (f) return read_prompt(v, &o->prompt_file) ? (o->prompt = o->prompt_file, 1) : -1;
    if (strcmp(a->argv[a->i], "--ignore-eos") == 0) return a->i++, o->ignore_eos = true, 1;
    if (strcmp(a->argv[a->i], "--profile") == 0) return a->i++, o->profile = true, 1;
    if ((r = kiln_cli_flag_value(a, "--system", &v)) != 0) return r < 0 ? -1 : (o->system = v, 1);
    if ((r = kiln_cli_flag_value(a, "--logits", &v)) != 0) return r < 0 ? -1 : (o->logits_path = v, 1);
    if ((r = kiln_cli_flag_value(a, "--stop", &v)) != 0) {
        if (r < 0) return -1;
        if (o->n_stop == MAX_STOP || !*v) {
            fprintf(stderr, "kiln generate: --stop wants a non-empty string, at most %d of them\n", MAX_STOP);
            return -1;
        }
        return o->stop[o->n_stop++] = v, 1;
    }
    if ((r = kiln_cli_flag_value(a, "--ids", &v)) != 0) {
        free(o->ids);
        o->ids = NULL;
        return r < 0 || !parse_ids("generate", v, &o->ids, &o->n_ids) ? -1 : 1;
    }
    if ((r = kiln_cli_flag_value(a, "-n", &v)) != 0)
        return r < 0 || !kiln_cli_parse_i64("generate", "-n", v, 1, 1 << 20, &o->n_gen) ? -1 : 1;
    if (strcmp(a->argv[a->i], "--chat") == 0) return a->i++, o->chat = true, 1;
    if ((r = kiln_cli_flag_value(a, "--gpus", &v)) != 0)
        return r < 0 || !kiln_cli_parse_i64("generate", "--gpus", v, 1, 64, &o->common.gpus) ? -1 : 1;
    return 0;
}

static int gen_args(int argc, char *const *argv, gen_opts *o)
{
    /* llama.cpp's defaults, so the same flags mean the same thing */
    o->sp = (kiln_sample_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                                 .repeat_last_n = 64};
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "generate"};
    int rc = KILN_CLI_OK;
    while (rc == KILN_CLI_OK && a.i < argc) {
        int r = kiln_cli_model_flag(&a, &o->common);
        if (r < 0) rc = -r;
        else if (r > 0) continue;
        else if ((r = sample_flag(&a, o)) != 0 || (r = text_flag(&a, o)) != 0) rc = r < 0 ? KILN_CLI_USAGE : rc;
        else if (argv[a.i][0] == '-') rc = kiln_cli_unknown_flag("generate", argv[a.i]);
        else if (o->common.path) fprintf(stderr, "kiln generate: unexpected argument '%s'\n", argv[a.i]), rc = KILN_CLI_USAGE;
        else o->common.path = argv[a.i++];
    }
    const char *why = NULL;
    if (rc != KILN_CLI_OK || (rc = kiln_cli_model_devices("generate", &o->common)) != KILN_CLI_OK) return rc;
    if (!o->common.path || (!o->prompt && !o->n_ids)) why = "needs MODEL.gguf and -p TEXT, -f FILE or --ids 1,2,3";
    else if (o->prompt && o->n_ids) why = "takes one of -p, -f and --ids";
    else if (o->chat && !o->prompt) why = "--chat needs -p TEXT or -f FILE";
    else if (o->system && !o->chat) why = "--system goes with --chat";
    if (why) fprintf(stderr, "kiln generate: %s (see kiln generate --help)\n", why);
    if (!o->seeded) o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    /* greedy without a penalty takes the plan's own argmax (`next`): no logits leave the device */
    o->common.logits = o->logits_path || o->sp.temp > 0 || o->sp.repeat_penalty != 1.0f;
    return why ? KILN_CLI_USAGE : KILN_CLI_OK;
}

/* The tokenizer and the things read with it, before the model is compiled (whose size depends on
 * the prompt's length). */
typedef struct gen_tok {
    kiln_ctx *ctx;      /* errors of the tokenizer and the sampler */
    kiln_tok *tok;      /* NULL: ids only (--ids with a file that has no usable tokenizer) */
    char     *tmpl;     /* tokenizer.chat_template (malloc'ed) or NULL */
    int64_t   n_ctx;    /* the model's context length (0 when unreadable: model_load says why) */
    int32_t  *prompt;   /* prompt ids (malloc'ed) */
    int64_t   n_prompt; /* their count */
} gen_tok;

static int load_tok(const gen_opts *o, gen_tok *gt)
{
    kiln_gguf *f = NULL;
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &gt->ctx);
    if (s == KILN_OK) s = kiln_gguf_open(gt->ctx, o->common.path, &f);
    if (s != KILN_OK) return kiln_cli_fail("generate", gt->ctx, s, "opening the model");
    kiln_model_info mi;
    if (kiln_model_info_get(f, &mi) == KILN_OK) gt->n_ctx = mi.n_ctx_train;
    const char *t = NULL;
    if (kiln_gguf_get_str(f, "tokenizer.chat_template", &t, NULL) == KILN_OK && !(gt->tmpl = strdup(t))) s = KILN_ERR_NOMEM;
    if (s == KILN_OK) s = kiln_tok_new(gt->ctx, f, &gt->tok);
    kiln_gguf_close(f);
    if (s == KILN_OK) return KILN_CLI_OK;
    if (o->prompt || s == KILN_ERR_NOMEM) return kiln_cli_fail("generate", gt->ctx, s, "reading the tokenizer");
    if (!o->common.json) /* --ids: ids in, ids out */
        fprintf(stderr, "kiln generate: no text output (%s)\n", kiln_ctx_error(gt->ctx));
    return KILN_CLI_OK;
}

/* The prompt's ids: --ids as given, else -p tokenized (special tokens in the text parsed, BOS as the
 * file says), through the chat template with --chat. */
static int prompt_ids(const gen_opts *o, gen_tok *gt)
{
    if (!o->prompt) {
        gt->prompt = malloc((size_t)o->n_ids * sizeof *gt->prompt);
        if (!gt->prompt) return kiln_cli_fail("generate", NULL, KILN_ERR_NOMEM, "allocating");
        memcpy(gt->prompt, o->ids, (size_t)o->n_ids * sizeof *gt->prompt);
        gt->n_prompt = o->n_ids;
        return KILN_CLI_OK;
    }
    char *text = NULL;
    kiln_chat_kind k;
    kiln_status s = KILN_OK;
    if (o->chat && (s = kiln_chat_detect(gt->ctx, gt->tmpl, &k)) == KILN_OK)
        s = kiln_chat_format(gt->ctx, k, o->system, o->prompt, &text);
    if (s != KILN_OK) return kiln_cli_fail("generate", gt->ctx, s, "--chat");
    const char *p = text ? text : o->prompt;
    s = kiln_tok_encode(gt->tok, p, strlen(p), true, true, &gt->prompt, &gt->n_prompt);
    free(text);
    if (s != KILN_OK) return kiln_cli_fail("generate", gt->ctx, s, "tokenizing the prompt");
    if (gt->n_prompt == 0) {
        fprintf(stderr, "kiln generate: the prompt is empty after tokenizing (and the model adds no BOS)\n");
        return KILN_CLI_USAGE;
    }
    return KILN_CLI_OK;
}

static bool text_put(gen_out *g, const char *s, size_t n)
{
    if (g->len + n + 1 > g->cap) {
        size_t cap = 2 * (g->len + n + 1) + 256;
        char *t = realloc(g->text, cap);
        if (!t) return false;
        g->text = t, g->cap = cap;
    }
    memcpy(g->text + g->len, s, n);
    g->len += n;
    g->text[g->len] = 0;
    return true;
}

/* Cuts the text at the first stop string that ends in the new bytes [from, len): true when one did.
 * Otherwise *safe = the end of what cannot be the start of a stop string any more. */
static bool stop_check(const gen_opts *o, gen_out *g, size_t from, size_t *safe)
{
    *safe = g->len;
    for (int k = 0; k < o->n_stop; k++) {
        size_t sl = strlen(o->stop[k]), start = from + 1 > sl ? from + 1 - sl : 0;
        const char *hit = memmem(g->text + start, g->len - start, o->stop[k], sl);
        if (hit) {
            g->len = (size_t)(hit - g->text);
            g->text[g->len] = 0;
            *safe = g->len;
            return true;
        }
        for (size_t l = sl - 1 < g->len ? sl - 1 : g->len; l > 0; l--) /* longest suffix that starts the string */
            if (memcmp(g->text + g->len - l, o->stop[k], l) == 0) {
                if (g->len - l < *safe) *safe = g->len - l;
                break;
            }
    }
    return false;
}

/* Adds token id's text; prints what is safe to print (text mode). True when a stop string hit. */
static bool emit(const gen_opts *o, const gen_tok *gt, kiln_tok_stream *st, gen_out *g, int32_t id)
{
    size_t from = g->len, safe, pl = 0;
    char buf[64];
    if (gt->tok) {
        const char *p = kiln_tok_piece(gt->tok, id, false, &pl);
        char *tmp = malloc(3 * pl + 16);
        size_t n = tmp ? kiln_tok_stream_put(st, p, pl, tmp) : 0;
        if (tmp) text_put(g, tmp, n);
        free(tmp);
    } else {
        int n = snprintf(buf, sizeof buf, "%s%d", g->n > 1 ? " " : "", id);
        text_put(g, buf, (size_t)n);
    }
    bool hit = stop_check(o, g, from, &safe);
    if (!o->common.json && safe > g->shown) {
        fwrite(g->text + g->shown, 1, safe - g->shown, stdout);
        fflush(stdout);
        g->shown = safe;
    }
    return hit;
}

/* The end of the text: what the stream still holds, then everything not printed yet. */
static void finish(const gen_opts *o, kiln_tok_stream *st, gen_out *g, bool stopped)
{
    char tail[16];
    size_t n = kiln_tok_stream_end(st, tail);
    if (!stopped) text_put(g, tail, n);
    if (!o->common.json && g->len > g->shown) fwrite(g->text + g->shown, 1, g->len - g->shown, stdout);
    g->shown = g->len;
    fflush(stdout);
}

/* Prefill, then sample / emit / decode until EOS, a stop string or n_gen tokens. */
static kiln_status gen_loop(const gen_opts *o, model_run *m, const gen_tok *gt, kiln_sampler *smp, int32_t *all,
                            int64_t n_gen, FILE *lf, gen_out *g)
{
    kiln_tok_stream st = {0};
    int64_t n_all = gt->n_prompt;
    double t0 = kiln_cli_now();
    char what[64];
    snprintf(what, sizeof what, "prefill of %lld tokens", (long long)n_all);
    kiln_progress *prog = kiln_progress_start(kiln_cli_quiet, what, 0, NULL); /* one run: time passing */
    kiln_status s = kiln_cli_model_step(m, all, n_all, 0, NULL);
    kiln_progress_end(prog);
    g->prefill_s = kiln_cli_now() - t0;
    kiln_plan_stats_get(m->plan, &g->prof.pre);
    bool stopped = false;
    double t1 = 0; /* after the first token: each decode step is timed with its sampling and printing */
    g->why = "-n";
    gen_prof *pf = &g->prof;
    while (s == KILN_OK) {
        if (lf && fwrite(m->logits, sizeof *m->logits, (size_t)m->info.n_vocab, lf) != (size_t)m->info.n_vocab) {
            fprintf(stderr, "kiln generate: --logits %s: write failed\n", o->logits_path);
            return KILN_ERR_IO;
        }
        double ts = kiln_cli_now();
        int32_t id = m->logits ? kiln_sampler_next(smp, m->logits, all, n_all) : m->next[0];
        double te = kiln_cli_now();
        if (gt->tok && !o->ignore_eos && kiln_tok_is_eog(gt->tok, id)) {
            g->why = "eos";
            break;
        }
        all[n_all++] = g->ids[g->n++] = id;
        stopped = emit(o, gt, &st, g, id);
        double tr = kiln_cli_now();
        if (g->n > 1) pf->sample_s += te - ts, pf->emit_s += tr - te; /* the decode steps' share */
        if (stopped) {
            g->why = "stop string";
            break;
        }
        if (g->n == n_gen) break;
        if (g->n == 1) t1 = tr;
        s = kiln_cli_model_step(m, &id, 1, n_all - 1, NULL);
        pf->run_s += kiln_cli_now() - tr;
        pf->last_id = id, pf->last_pos = n_all - 1;
        g->steps++;
    }
    if (g->steps) g->decode_s = kiln_cli_now() - t1;
    kiln_plan_stats_get(m->plan, &pf->post);
    finish(o, &st, g, stopped);
    return s;
}

/* --profile: the last decode step again, PROF_RERUNS times with per-kernel device timers (kernels
 * launched one by one, no recording): the device time of a step by kind of kernel. Its cache row is
 * written again with the same values, so the generation is unchanged. */
static kiln_status prof_kernels(model_run *m, gen_out *g)
{
    gen_prof *pf = &g->prof;
    if (!g->steps) return KILN_OK;
    kiln_status s = kiln_plan_profile(m->plan, true);
    for (int i = 0; s == KILN_OK && i < PROF_RERUNS; i++) s = kiln_cli_model_step(m, &pf->last_id, 1, pf->last_pos, NULL);
    kiln_region_info ri;
    for (int r = 0; s == KILN_OK && kiln_plan_region(m->plan, r, &ri) == KILN_OK; r++) {
        char what[280];
        snprintf(what, sizeof what, "%s [%s] on %s", ri.kind, ri.ops, ri.backend);
        int k = 0;
        while (k < pf->n_kinds && strcmp(pf->kind[k].what, what) != 0) k++;
        if (k == pf->n_kinds && pf->n_kinds == PROF_KINDS) k = PROF_KINDS - 1, snprintf(pf->kind[k].what, sizeof pf->kind[k].what, "other");
        else if (k == pf->n_kinds) snprintf(pf->kind[pf->n_kinds++].what, sizeof pf->kind[k].what, "%s", what);
        pf->kind[k].n++;
        pf->kind[k].s += ri.measured_s;
        pf->gpu_s += ri.measured_s;
    }
    kiln_plan_profile(m->plan, false);
    return s;
}

/* --profile's report: text on stderr, or the members of a "profile" JSON object on stdout. */
static void prof_report(const gen_out *g, bool json)
{
    const gen_prof *pf = &g->prof;
    double n = g->steps ? (double)g->steps : 1, ms = 1e3 / n, step = g->decode_s * ms;
    int64_t rec = pf->post.recordings - pf->pre.recordings, rep = pf->post.replays - pf->pre.replays,
            lau = pf->post.launches - pf->pre.launches;
    double bind = (pf->post.bind_s - pf->pre.bind_s) * ms, sub = (pf->post.submit_s - pf->pre.submit_s) * ms,
           wait = (pf->post.wait_s - pf->pre.wait_s) * ms, run = pf->run_s * ms, smp = pf->sample_s * ms, emt = pf->emit_s * ms;
    double other = step - run - smp - emt;
    if (json) {
        printf("{\"steps\": %lld, \"step_ms\": %.4f, \"run_ms\": %.4f, \"bind_ms\": %.4f, \"submit_ms\": %.4f, "
               "\"wait_ms\": %.4f, \"sample_ms\": %.4f, \"emit_ms\": %.4f, \"other_ms\": %.4f, \"recordings\": %lld, "
               "\"replays\": %lld, \"launches\": %lld, \"prefill_recordings\": %lld, \"kernels_ms\": %.4f, \"kinds\": [",
               (long long)g->steps, step, run, bind, sub, wait, smp, emt, other, (long long)rec, (long long)rep, (long long)lau,
               (long long)pf->pre.recordings, pf->gpu_s * 1e3);
        for (int k = 0; k < pf->n_kinds; k++) {
            printf("%s{\"what\": ", k ? ", " : "");
            kiln_cli_json_str(stdout, pf->kind[k].what);
            printf(", \"regions\": %d, \"ms\": %.4f}", pf->kind[k].n, pf->kind[k].s * 1e3);
        }
        printf("]}");
        return;
    }
    fprintf(stderr,
            "kiln generate --profile: %lld decode steps, %.3f ms a step:\n"
            "  in kiln_run      %8.3f ms  (bindings %.3f, launch/replay %.3f, outputs and wait %.3f)\n"
            "  sampling         %8.3f ms\n  text             %8.3f ms\n  rest of the loop %8.3f ms\n"
            "  recordings made %lld in the decode steps (%lld by the prefill), replays %lld, regions launched one by one %lld\n",
            (long long)g->steps, step, run, bind, sub, wait, smp, emt, other, (long long)rec, (long long)pf->pre.recordings,
            (long long)rep, (long long)lau);
    if (pf->gpu_s <= 0) return;
    fprintf(stderr, "  kernels' device time a step (the last step again, %d times, kernel by kernel): %.3f ms\n", PROF_RERUNS,
            pf->gpu_s * 1e3);
    for (int k = 0; k < pf->n_kinds; k++)
        fprintf(stderr, "    %8.3f ms  %3d x %s\n", pf->kind[k].s * 1e3, pf->kind[k].n, pf->kind[k].what);
}

static void gen_report(const gen_opts *o, const model_run *m, const gen_tok *gt, const gen_out *g)
{
    double pf = g->prefill_s > 0 ? (double)gt->n_prompt / g->prefill_s : 0;
    double dc = g->steps && g->decode_s > 0 ? (double)g->steps / g->decode_s : 0;
    double ms = g->steps ? g->decode_s * 1e3 / (double)g->steps : 0;
    if (o->common.json) {
        printf("{\"ids\": [");
        for (int64_t i = 0; i < g->n; i++) printf("%s%d", i ? ", " : "", g->ids[i]);
        printf("], \"text\": ");
        kiln_cli_json_str(stdout, gt->tok ? g->text : "");
        printf(", \"prompt_tokens\": %lld, \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, \"ms_per_token\": %.4f, "
               "\"stop\": \"%s\", \"seed\": %llu, \"backend\": ",
               (long long)gt->n_prompt, pf, dc, ms, g->why, (unsigned long long)o->sp.seed);
        kiln_cli_json_str(stdout, kiln_plan_backend(m->plan));
        printf(", \"devices\": ");
        kiln_cli_json_str(stdout, o->common.devices);
        if (o->profile) printf(", \"profile\": "), prof_report(g, true);
        printf("}\n");
        return;
    }
    if (isatty(1)) printf("\n");
    fprintf(stderr,
            "kiln generate: prompt %lld tokens in %.2f ms (%.1f tok/s); generated %lld tokens, %lld decode steps in "
            "%.2f ms (%.1f tok/s, %.3f ms/token); stopped at %s; %s on %s%s%s, %d kernels, loaded in %.0f ms, seed %llu\n",
            (long long)gt->n_prompt, g->prefill_s * 1e3, pf, (long long)g->n, (long long)g->steps, g->decode_s * 1e3, dc,
            ms, g->why, m->info.arch, kiln_plan_backend(m->plan), o->common.devices[0] ? " split over " : "",
            o->common.devices, kiln_plan_kernel_count(m->plan), m->load_s * 1e3,
            (unsigned long long)o->sp.seed);
    if (o->profile) prof_report(g, false);
}

/* Loads the model for the prompt, checks the ids, makes the sampler and runs. */
static int gen_main(gen_opts *o, gen_tok *gt)
{
    int64_t n_gen = o->n_gen;
    if (!n_gen) { /* default: 128, or what the context leaves */
        n_gen = gt->n_ctx > gt->n_prompt ? gt->n_ctx - gt->n_prompt : 1;
        if (n_gen > 128) n_gen = 128;
    }
    model_run m = {0};
    int rc = kiln_cli_model_load("generate", &o->common, gt->n_prompt + n_gen, gt->n_prompt, &m);
    for (int64_t i = 0; rc == KILN_CLI_OK && i < gt->n_prompt; i++)
        if (gt->prompt[i] < 0 || gt->prompt[i] >= m.info.n_vocab) {
            fprintf(stderr, "kiln generate: %s: id %d is past the vocabulary (%lld tokens)\n", o->prompt ? "-p" : "--ids",
                    gt->prompt[i], (long long)m.info.n_vocab);
            rc = KILN_CLI_USAGE;
        }
    if (rc == KILN_CLI_OK && gt->tok && kiln_tok_n_vocab(gt->tok) > m.info.n_vocab) {
        fprintf(stderr, "kiln generate: the tokenizer has %lld tokens, the model's embedding %lld rows\n",
                (long long)kiln_tok_n_vocab(gt->tok), (long long)m.info.n_vocab);
        rc = KILN_CLI_FAIL;
    }
    kiln_sampler *smp = NULL;
    kiln_status s = rc == KILN_CLI_OK ? kiln_sampler_new(gt->ctx, &o->sp, m.info.n_vocab, &smp) : KILN_OK;
    if (s != KILN_OK) rc = kiln_cli_fail("generate", gt->ctx, s, "sampling");
    FILE *lf = rc == KILN_CLI_OK && o->logits_path ? fopen(o->logits_path, "wb") : NULL;
    if (rc == KILN_CLI_OK && o->logits_path && !lf) {
        fprintf(stderr, "kiln generate: --logits: cannot write '%s'\n", o->logits_path);
        rc = KILN_CLI_FAIL;
    }
    gen_out g = {0};
    int32_t *all = rc == KILN_CLI_OK ? malloc((size_t)(gt->n_prompt + n_gen) * sizeof *all) : NULL;
    g.ids = rc == KILN_CLI_OK ? malloc((size_t)n_gen * sizeof *g.ids) : NULL;
    if (rc == KILN_CLI_OK && (!all || !g.ids || !text_put(&g, "", 0)))
        rc = kiln_cli_fail("generate", NULL, KILN_ERR_NOMEM, "allocating");
    if (rc == KILN_CLI_OK) {
        memcpy(all, gt->prompt, (size_t)gt->n_prompt * sizeof *all);
        s = gen_loop(o, &m, gt, smp, all, n_gen, lf, &g);
        if (s == KILN_OK && o->profile) s = prof_kernels(&m, &g);
        if (s != KILN_OK) rc = kiln_cli_fail("generate", s == KILN_ERR_IO ? NULL : m.ctx, s, "running");
        else gen_report(o, &m, gt, &g);
    }
    if (lf && fclose(lf) != 0 && rc == KILN_CLI_OK) rc = kiln_cli_fail("generate", NULL, KILN_ERR_IO, "--logits");
    free(all);
    free(g.ids);
    free(g.text);
    kiln_sampler_free(smp);
    kiln_cli_model_free(&m);
    return rc;
}

int kiln_cli_generate(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "generate")) return KILN_CLI_OK;
    gen_opts o = {0};
    gen_tok gt = {0};
    int rc = gen_args(argc, argv, &o);
    if (rc == KILN_CLI_OK) rc = load_tok(&o, &gt);
    if (rc == KILN_CLI_OK) rc = prompt_ids(&o, &gt);
    if (rc == KILN_CLI_OK) rc = gen_main(&o, &gt);
    free(o.ids);
    free(o.prompt_file);
    free(gt.prompt);
    free(gt.tmpl);
    kiln_tok_free(gt.tok);
    kiln_ctx_free(gt.ctx);
    return rc;
}
