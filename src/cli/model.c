/* GGUF model commands of the kiln tool: `kiln info MODEL.gguf` (architecture, sizes, tensor types,
 * where kiln would run it) and `kiln bench --model MODEL.gguf` (timed prefill or decode steps);
 * loading is in model_run.c, `kiln generate` in generate.c. Must not abort on user input or a
 * malformed file. */
#include <stdlib.h>
#include <string.h>

#include "cli/model_run.h"

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

/* Weight bytes a step of n_tok tokens reads: all of them, but of the expert stacks (*_exps) at most
 * the routed share, min(1, n_tok * used / E), unless the experts run densely. */
static double weight_bytes_read(const kiln_gguf *f, const kiln_model_info *mi, int64_t n_tok, bool dense)
{
    if (mi->n_expert <= 0 || dense) return (double)mi->weight_bytes;
    double exps = 0, share = (double)n_tok * (double)mi->n_expert_used / (double)mi->n_expert;
    for (int64_t i = 0; i < kiln_gguf_tensor_count(f); i++) {
        kiln_gguf_tensor t;
        if (kiln_gguf_tensor_at(f, i, &t) == KILN_OK && t.name && strstr(t.name, "_exps.")) exps += (double)t.bytes;
    }
    return (double)mi->weight_bytes - exps + exps * (share < 1 ? share : 1);
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
    printf(",\"gguf_version\":%u,\"parts\":%d,\"bytes\":%zu,\"metadata\":%lld,\"tensors\":%lld,\"types\":[",
           kiln_gguf_version(f), kiln_gguf_part_count(f), kiln_gguf_size(f), (long long)kiln_gguf_kv_count(f),
           (long long)kiln_gguf_tensor_count(f));
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
               "\"qkv_bias\":%s,\"qk_norm\":%s,\"out_bias\":%s,\"ffn_bias\":%s,\"tied_output\":%s,\"weight_bytes\":%zu,"
               "\"rope_scale\":%g,\"rope_freqs\":%s,\"sliding_window\":%lld,\"swa_pattern\":%d,\"swa_theta\":%g,"
               "\"attn_softcap\":%g,\"final_softcap\":%g,\"attn_scale\":%g,\"embd_scale\":%s,\"post_norms\":%s,"
               "\"gelu_gate\":%s,\"fused_qkv\":%s,\"rope_dims\":%lld,\"longrope\":%s,\"rope_orig_context\":%lld,"
               "\"rope_attn_factor\":%g,\"yarn\":%s,\"backend\":\"%s\",\"kernels\":%d",
               mi->arch, mi->n_layer, (long long)mi->hidden, (long long)mi->n_head, (long long)mi->n_kv_head,
               (long long)mi->head_dim, (long long)mi->ffn, (long long)mi->n_vocab, (long long)mi->n_ctx_train,
               mi->rope == KILN_ROPE_NEOX ? "neox" : "normal", mi->theta, mi->eps, mi->qkv_bias ? "true" : "false",
               mi->qk_norm ? "true" : "false", mi->out_bias ? "true" : "false", mi->ffn_bias ? "true" : "false",
               mi->tied_output ? "true" : "false", mi->weight_bytes, mi->rope_scale, mi->rope_freqs ? "true" : "false",
               (long long)mi->sliding_window, mi->swa_pattern, mi->swa_theta, mi->attn_softcap, mi->final_softcap,
               mi->attn_scale, mi->embd_scale ? "true" : "false", mi->post_norms ? "true" : "false",
               mi->gelu_gate ? "true" : "false", mi->fused_qkv ? "true" : "false", (long long)mi->n_rot,
               mi->longrope ? "true" : "false", (long long)mi->n_ctx_orig, mi->rope_attn_factor,
               mi->yarn ? "true" : "false", be, kernels);
    }
    printf("}\n");
}

static void info_model_text(const char *path, kiln_ctx *ctx, const kiln_gguf *f, const kiln_model_info *mi,
                            kiln_status ms, const char *why, const type_stat *st, int n_st, const char *be, int kernels)
{
    const char *name = NULL;
    kiln_gguf_get_str(f, "general.name", &name, NULL);
    char parts[32] = ""; /* a split GGUF: how many files it was read from */
    if (kiln_gguf_part_count(f) > 1) snprintf(parts, sizeof parts, " in %d split parts", kiln_gguf_part_count(f));
    printf("%s: GGUF v%u, %.1f MiB%s, %lld metadata keys, %lld tensors%s%s%s\n", path, kiln_gguf_version(f),
           (double)kiln_gguf_size(f) / 1048576, parts, (long long)kiln_gguf_kv_count(f),
           (long long)kiln_gguf_tensor_count(f), name ? " (" : "", name ? name : "", name ? ")" : "");
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
    char part[96] = "";
    if (mi->n_rot < mi->head_dim) snprintf(part, sizeof part, " on %lld of %lld dims", (long long)mi->n_rot, (long long)mi->head_dim);
    printf("        context %lld, rope %s%s theta %g, rms eps %g%s%s%s%s%s\n", (long long)mi->n_ctx_train,
           mi->rope == KILN_ROPE_NEOX ? "neox" : "normal", part, mi->theta, mi->eps, mi->qkv_bias ? ", q/k/v biases" : "",
           mi->qk_norm ? ", q/k head norms" : "", mi->out_bias ? ", output bias" : "", mi->ffn_bias ? ", ffn biases" : "",
           mi->tied_output ? ", tied output head" : "");
    if (mi->n_expert)
        printf("        mixture of experts: %lld experts of ffn %lld, %lld routed per token%s%s (only the routed "
               "experts run: moe_matmul)\n", (long long)mi->n_expert, (long long)mi->ffn_exp, (long long)mi->n_expert_used,
               mi->expert_norm ? " (weights renormalized)" : "", mi->ffn_shexp ? ", plus a shared expert" : "");
    if (mi->yarn)
        printf("        yarn: factor %g over the original context %lld (beta fast %g, slow %g), rotated q/k dims x%g\n",
               mi->rope_scale, (long long)mi->n_ctx_orig, mi->yarn_beta_fast, mi->yarn_beta_slow, mi->rope_attn_factor);
    else if (mi->longrope || mi->rope_attn_factor != 1.0f)
        printf("        longrope: %s factors per pair (long ones past the original context %lld), rotated q/k dims x%g\n",
               mi->longrope ? "long/short" : "no", (long long)mi->n_ctx_orig, mi->rope_attn_factor);
    if ((mi->rope_scale != 1.0f && !mi->yarn) || mi->rope_freqs || mi->sliding_window)
        printf("        rotary scaling: linear x%g%s; sliding window: %lld%s\n", mi->yarn ? 1.0f : mi->rope_scale,
               mi->rope_freqs ? " and rope_freqs factors per pair (llama 3.1)" : "", (long long)mi->sliding_window,
               !mi->sliding_window ? " (none)" : mi->swa_pattern ? " positions on the local layers" : " positions");
    if (mi->swa_pattern && mi->sliding_window)
        printf("        local layers: l %% %d < %d (rope theta %g%s), global layers the rest\n", mi->swa_pattern,
               mi->swa_pattern - 1, mi->swa_theta > 0 ? mi->swa_theta : mi->theta,
               strcmp(mi->arch, "gemma3") == 0 ? ", unscaled" : "");
    if (mi->attn_softcap || mi->final_softcap || mi->embd_scale || mi->post_norms || mi->gelu_gate || mi->fused_qkv)
        printf("        %s%s%s%s%s%sscore scale %g, attention soft-cap %g, final soft-cap %g\n",
               mi->embd_scale ? "embeddings x sqrt(hidden), " : "", mi->post_norms ? "post-norms, " : "",
               mi->gelu_gate ? "gelu-tanh gate, " : "", mi->fused_qkv ? "fused qkv and gate/up, " : "", "", "",
               mi->attn_scale, mi->attn_softcap, mi->final_softcap);
    printf("kiln would run it on: %s (%s), %d kernels per decode step (%.1f per layer), %.1f MiB of weights read "
           "per token\n", be, strcmp(be, "cpu") == 0 ? kiln_cpu_isa(ctx) : "-", kernels,
           mi->n_layer ? (double)kernels / mi->n_layer : 0.0, weight_bytes_read(f, mi, 1, false) / 1048576);
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
        int r = kiln_cli_model_flag(&a, &b->common);
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
        else if (strcmp(argv[a.i], "--moe-dense") == 0) b->common.moe_dense = true, a.i++;
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
    double tok_s = (double)n_tok / (med * 1e-3), wread = weight_bytes_read(m->file, &m->info, n_tok, b->common.moe_dense);
    double gbps = wread * 1e-9 / (med * 1e-3);
    const char *be = kiln_plan_backend(m->plan), *mode = b->prefill ? "prefill" : "decode";
    int threads = b->common.threads ? (int)b->common.threads : kiln_cli_threads();
    if (b->common.json) {
        printf("{\"model\":");
        kiln_cli_json_str(stdout, b->common.path);
        printf(",\"arch\":\"%s\",\"mode\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"steps\":%lld,\"tokens\":%lld,"
               "\"ctx\":%lld,\"kernels\":%d,\"moe_dense\":%s,\"ms_per_step\":%.6f,\"tok_s\":%.4f,\"weight_bytes_read\":%.0f,"
               "\"weight_gb_per_s\":%.4f,\"step_ms\":[",
               m->info.arch, mode, be, threads, (long long)n, (long long)n_tok, (long long)(b->prefill ? 0 : b->ctx0),
               kiln_plan_kernel_count(m->plan), b->common.moe_dense ? "true" : "false", med, tok_s, wread, gbps);
        for (int64_t i = 0; i < n; i++) printf("%s%.6f", i ? "," : "", ms[i]);
        printf("]");
        char *kp = NULL; /* per kernel: bytes (cost model), measured_s, achieved_gb_s */
        if (b->profile && kiln_plan_explain(m->plan, "json", &kp) == KILN_OK) {
            size_t l = strlen(kp);
            while (l && kp[l - 1] == '\n') kp[--l] = 0;
            printf(",\"profile\":%s", kp);
        }
        free(kp);
        printf("}\n");
    } else {
        printf("%s (%s, %d layers) %s on %s, %d threads, %d kernels\n", b->common.path, m->info.arch, m->info.n_layer,
               mode, be, threads, kiln_plan_kernel_count(m->plan));
        if (b->prefill) printf("  %lld tokens, %lld steps\n", (long long)n_tok, (long long)n);
        else printf("  n_kv %lld..%lld, %lld steps\n", (long long)b->ctx0 + 2, (long long)(b->ctx0 + 1 + n), (long long)n);
        printf("  median %.3f ms/step (min %.3f, max %.3f)   %.1f tok/s   %.2f GB/s of weights (%.1f MiB read a step%s)\n",
               med, sorted[0], sorted[n - 1], tok_s, gbps, wread / 1048576,
               m->info.n_expert > 0 ? (b->common.moe_dense ? ", every expert" : ", the routed experts' share") : "");
    }
    free(sorted);
    char *txt = NULL;
    if (b->profile && !b->common.json && kiln_plan_explain(m->plan, "text", &txt) == KILN_OK) {
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
    rc = ms && ids ? kiln_cli_model_load("bench", &b.common, max_ctx, max_tok, &m)
                   : kiln_cli_fail("bench", NULL, KILN_ERR_NOMEM, "allocating");
    for (int64_t i = 0; rc == KILN_CLI_OK && i < max_tok; i++) ids[i] = (int32_t)(i % m.info.n_vocab);
    kiln_status s = rc == KILN_CLI_OK ? kiln_cli_model_step(&m, ids, max_tok, b.prefill ? 0 : b.ctx0, NULL) : KILN_OK; /* warm-up */
    if (rc == KILN_CLI_OK && b.profile) kiln_plan_profile(m.plan, true);
    for (int64_t i = 0; rc == KILN_CLI_OK && s == KILN_OK && i < b.steps; i++) {
        double t0 = kiln_cli_now();
        s = kiln_cli_model_step(&m, ids, max_tok, b.prefill ? 0 : b.ctx0 + 1 + i, NULL);
        ms[i] = (kiln_cli_now() - t0) * 1e3;
    }
    if (rc == KILN_CLI_OK && s != KILN_OK) rc = kiln_cli_fail("bench", m.ctx, s, "running a step");
    if (rc == KILN_CLI_OK) bench_model_report(&b, &m, ms, max_tok);
    free(ms);
    free(ids);
    kiln_cli_model_free(&m);
    return rc;
}
