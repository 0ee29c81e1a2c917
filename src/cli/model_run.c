/* Loading a GGUF model for the kiln tool's model commands: open, page in, build, compile, and one
 * decoder run. Shared by generate.c and model.c (bench --model). Must not abort on user input or a
 * malformed file; progress lines (util/progress.h) only on a terminal. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/model_run.h"
#include "util/progress.h"

void kiln_cli_model_free(model_run *m)
{
    kiln_plan_free(m->plan);
    kiln_gguf_close(m->file);
    kiln_ctx_free(m->ctx);
    free(m->pos);
    free(m->next);
    free(m->logits);
}

/* Touches every page of the tensor data once (so the first run does not pay the page faults),
 * with a progress line on a terminal when it takes over 2 s. */
static void page_in(const kiln_gguf *f)
{
    int64_t n = kiln_gguf_tensor_count(f);
    size_t total = kiln_gguf_size(f), done = 0;
    kiln_progress *prog = kiln_progress_start(kiln_cli_quiet, "loading the model", total >> 20, " MiB");
    volatile unsigned char sink = 0;
    for (int64_t i = 0; i < n; i++) {
        kiln_gguf_tensor t;
        if (kiln_gguf_tensor_at(f, i, &t) != KILN_OK) continue;
        const unsigned char *p = t.data;
        for (size_t off = 0; off < t.bytes; off += 4096) sink ^= p[off];
        done += t.bytes;
        kiln_progress_set(prog, done >> 20, NULL);
    }
    kiln_progress_end(prog);
    (void)sink;
}

/* Opens, pages in, builds (max_ctx rows, max_tok tokens) and compiles. Exit code. */
int kiln_cli_model_load(const char *cmd, const model_opts *o, int64_t max_ctx, int64_t max_tok, model_run *m)
{
    double t0 = kiln_cli_now();
    kiln_ctx_options co = {.quiet = kiln_cli_quiet, .n_threads = (int)o->threads};
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
    page_in(m->file);
    kiln_model_options mo = {.max_ctx = max_ctx, .max_tok = max_tok, .kv_dtype = KILN_DTYPE_F16, .last_only = true,
                             .logits = o->logits, .moe_dense = o->moe_dense};
    kiln_graph *g = NULL;
    if ((s = kiln_model_build(m->file, &mo, &g)) != KILN_OK) return kiln_cli_fail(cmd, m->ctx, s, "building the graph");
    s = kiln_compile(m->ctx, g, &(kiln_compile_options){.backend = o->devices[0] ? NULL : o->backend,
                                                       .devices = o->devices[0] ? o->devices : NULL}, &m->plan);
    kiln_graph_free(g);
    if (s != KILN_OK) return kiln_cli_fail(cmd, m->ctx, s, "compiling");
    m->pos = malloc((size_t)max_tok * sizeof *m->pos);
    m->next = malloc(sizeof *m->next);
    m->logits = o->logits ? malloc((size_t)m->info.n_vocab * sizeof *m->logits) : NULL;
    if (!m->pos || !m->next || (o->logits && !m->logits)) return kiln_cli_fail(cmd, NULL, KILN_ERR_NOMEM, "allocating buffers");
    m->load_s = kiln_cli_now() - t0;
    return KILN_CLI_OK;
}

/* One run of n ids at positions start..; *out = the argmax after the last one. */
kiln_status kiln_cli_model_step(model_run *m, const int32_t *ids, int64_t n, int64_t start, int32_t *out)
{
    for (int64_t i = 0; i < n; i++) m->pos[i] = (int32_t)(start + i);
    int32_t last = (int32_t)(n - 1);
    kiln_binding b[7] = {{.name = "n_tok", .value = n},
                         {.name = "n_kv", .value = start + n},
                         {.name = "ids", .data = (void *)ids, .bytes = (size_t)n * sizeof *ids},
                         {.name = "pos", .data = m->pos, .bytes = (size_t)n * sizeof *m->pos},
                         {.name = "last", .data = &last, .bytes = sizeof last},
                         {.name = "next", .data = m->next, .bytes = sizeof *m->next},
                         {.name = "logits", .data = m->logits, .bytes = (size_t)m->info.n_vocab * sizeof *m->logits}};
    kiln_status s = kiln_run(m->plan, b, m->logits ? 7 : 6);
    if (s == KILN_OK && out) *out = m->next[0];
    return s;
}

/* --gpus N: the devices string, on --backend's host backend (virtual devices: ref, cpu) or cuda's
 * GPUs 0..N-1. Exit code. */
int kiln_cli_model_devices(const char *cmd, model_opts *o)
{
    if (o->gpus <= 1) return KILN_CLI_OK;
    const char *be = o->backend && strcmp(o->backend, "auto") ? o->backend : "cuda";
    if (strcmp(be, "cuda") && strcmp(be, "cpu") && strcmp(be, "ref")) {
        fprintf(stderr, "kiln %s: --gpus splits over cuda GPUs (or ref/cpu virtual devices), not --backend %s\n", cmd, be);
        return KILN_CLI_USAGE;
    }
    int k = snprintf(o->devices, sizeof o->devices, "%s:", be);
    for (int64_t d = 0; d < o->gpus; d++) k += snprintf(o->devices + k, sizeof o->devices - (size_t)k, "%s%lld", d ? "," : "", (long long)d);
    return KILN_CLI_OK;
}

/* Parses --backend/--threads/--json and the model path; 1 when a->argv[a->i] was one, 0 when not,
 * or an exit code (negative: KILN_CLI_USAGE). */
int kiln_cli_model_flag(kiln_cli_args *a, model_opts *o)
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
