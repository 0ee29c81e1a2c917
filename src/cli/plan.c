/* `kiln plan` (of a .kg file, a preset or a GGUF model: fusion and placement explained: each kernel's fused ops, backend, predicted time on
 * every backend, roofline bound; text, JSON or Graphviz dot; --svg: the roofline picture, svg.c) and `kiln calibrate` (measure the
 * device profiles and store them in the cache dir). Reports only; never runs a graph. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/presets.h"

typedef struct plan_opts {
    const char        *file;     /* FILE.kg, or NULL with --preset */
    const kiln_preset *preset;   /* --preset */
    kiln_dtype         wtype;    /* --wtype */
    int64_t            layers;   /* --layers; 0 = default (1 for a preset, all for a GGUF model) */
    int64_t            ctx;      /* --ctx: bound of n_kv */
    int64_t            tokens;   /* --tokens: bound of n_tok */
    const char        *backend;  /* --backend */
    const char        *devices;  /* --devices: a tensor-parallel split (kiln_compile_options.devices) */
    const char        *profile;  /* --profile FILE */
    const char        *format;   /* "text", "json", "dot" */
    const char        *svg;      /* --svg FILE: the roofline picture */
    bool               no_fuse;  /* --no-fuse */
    bool               what_if;  /* --what-if */
} plan_opts;

static int parse_plan(int argc, char *const *argv, plan_opts *o)
{
    *o = (plan_opts){.wtype = KILN_DTYPE_Q8_0, .layers = 0, .ctx = 1024, .tokens = 1, .format = "text"};
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "plan"};
    while (a.i < argc) {
        const char *v, *arg = argv[a.i];
        int r;
        int64_t n;
        if ((r = kiln_cli_preset_flags(&a, &o->preset, &o->wtype)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--layers", &v)) != 0 || (r = kiln_cli_flag_value(&a, "--ctx", &v)) != 0 ||
                   (r = kiln_cli_flag_value(&a, "--tokens", &v)) != 0) {
            if (r < 0 || !kiln_cli_parse_i64("plan", arg, v, 1, 1 << 20, &n)) return KILN_CLI_USAGE;
            *(strstr(arg, "layers") ? &o->layers : strstr(arg, "ctx") ? &o->ctx : &o->tokens) = n;
        } else if ((r = kiln_cli_flag_value(&a, "--backend", &v)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
            o->backend = v;
        } else if ((r = kiln_cli_flag_value(&a, "--devices", &v)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
            o->devices = v;
        } else if ((r = kiln_cli_flag_value(&a, "--profile", &v)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
            o->profile = v;
        } else if ((r = kiln_cli_flag_value(&a, "--svg", &v)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
            o->svg = v;
        } else if (!strcmp(arg, "--json") || !strcmp(arg, "--dot")) {
            if (strcmp(o->format, "text") && strcmp(o->format, arg + 2)) {
                fprintf(stderr, "kiln plan: --json and --dot are two formats: give one of them\n");
                return KILN_CLI_USAGE;
            }
            o->format = arg + 2;
            a.i++;
        } else if (!strcmp(arg, "--no-fuse") || !strcmp(arg, "--what-if")) {
            *(arg[2] == 'n' ? &o->no_fuse : &o->what_if) = true;
            a.i++;
        } else if (arg[0] == '-') {
            return kiln_cli_unknown_flag("plan", arg);
        } else if (!o->file) {
            o->file = arg;
            a.i++;
        } else {
            fprintf(stderr, "kiln plan: unexpected argument '%s' (see kiln plan --help)\n", arg);
            return KILN_CLI_USAGE;
        }
    }
    if (o->what_if && !o->profile) { /* without one, a what-if plan is the plan of the devices present */
        fprintf(stderr, "kiln plan: --what-if places kernels on the absent devices that --profile FILE describes: "
                        "give --profile (a JSON file of device profiles, see kiln plan --help)\n");
        return KILN_CLI_USAGE;
    }
    return kiln_cli_one_source("plan", o->file, o->preset) ? KILN_CLI_OK : KILN_CLI_USAGE;
}

/* True when the file starts with the GGUF magic (else it is read as .kg text). */
static bool is_gguf(const char *path)
{
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    bool yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    if (f) fclose(f);
    return yes;
}

int kiln_cli_plan(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "plan")) return KILN_CLI_OK;
    plan_opts o;
    int rc = parse_plan(argc, argv, &o);
    if (rc != KILN_CLI_OK) return rc;
    kiln_ctx *ctx = NULL;
    kiln_graph *g = NULL;
    kiln_plan *p = NULL;
    kiln_gguf *gf = NULL; /* a GGUF model's file: the plan borrows its weights, so it closes last */
    char *out = NULL;
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = kiln_cli_quiet}, &ctx);
    if (s != KILN_OK) return kiln_cli_fail("plan", ctx, s, "creating the context");
    if (o.profile && (s = kiln_ctx_load_profile(ctx, o.profile)) != KILN_OK) {
        rc = kiln_cli_fail("plan", ctx, s, "loading the profile");
        goto out;
    }
    if (o.file && is_gguf(o.file)) { /* a model: its decoder with the CLI's options */
        if ((s = kiln_gguf_open(ctx, o.file, &gf)) == KILN_OK)
            s = kiln_model_build(gf, &(kiln_model_options){.max_ctx = o.ctx, .max_tok = o.tokens, .kv_dtype = KILN_DTYPE_F16,
                                                           .n_layers = (int)o.layers, .last_only = true}, &g);
        if (s != KILN_OK) {
            rc = kiln_cli_fail("plan", ctx, s, o.file);
            goto out;
        }
    } else {
        rc = kiln_cli_load_source("plan", ctx, o.file, o.preset, o.wtype,
                                  (kiln_preset_build_opts){.n_layers = o.layers ? (int)o.layers : 1, .max_ctx = o.ctx,
                                                           .max_tok = o.tokens, .seed = 1}, &g);
        if (rc != KILN_CLI_OK) goto out;
    }
    kiln_compile_options co = {.backend = o.backend, .no_fuse = o.no_fuse, .what_if = o.what_if, .devices = o.devices};
    if ((s = kiln_compile(ctx, g, &co, &p)) != KILN_OK) {
        rc = kiln_cli_fail("plan", ctx, s, "compiling");
        goto out;
    }
    if ((s = kiln_plan_explain(p, o.format, &out)) != KILN_OK) {
        rc = kiln_cli_fail("plan", ctx, s, "explaining");
        goto out;
    }
    fputs(out, stdout);
    if (o.svg) {
        char title[256];
        snprintf(title, sizeof title, "kiln plan %s%s: %d kernels, predicted on the roofline", o.file ? o.file : "--preset ",
                 o.file ? "" : o.preset->name, kiln_plan_kernel_count(p));
        rc = kiln_cli_plan_svg(ctx, p, o.svg, title);
    }
out:
    free(out);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_gguf_close(gf);
    kiln_ctx_free(ctx);
    return rc;
}

int kiln_cli_calibrate(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "calibrate")) return KILN_CLI_OK;
    bool json = false, save = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--no-save")) save = false;
        else return kiln_cli_unknown_flag("calibrate", argv[i]);
    }
    kiln_ctx *ctx = NULL;
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = json || kiln_cli_quiet}, &ctx);
    if (s != KILN_OK) return kiln_cli_fail("calibrate", ctx, s, "creating the context");
    if ((s = kiln_calibrate(ctx, save)) != KILN_OK) {
        int rc = kiln_cli_fail("calibrate", ctx, s, "measuring");
        kiln_ctx_free(ctx);
        return rc;
    }
    if (json) printf("{");
    for (int i = 0, first = 1; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info b;
        kiln_device_profile pr;
        if (kiln_backend_get(ctx, i, &b) != KILN_OK || !b.available || kiln_ctx_profile(ctx, b.name, &pr) != KILN_OK) continue;
        if (json)
            printf("%s\"%s\":{\"mem_bw\":%.6g,\"peak_f32\":%.6g,\"peak_q8_0\":%.6g,\"launch_s\":%.6g}", first ? "" : ",",
                   b.name, pr.mem_bw, pr.peak_flops[KILN_DTYPE_F32], pr.peak_flops[KILN_DTYPE_Q8_0], pr.launch_s);
        else
            printf("%-7s read bandwidth %7.1f GB/s   f32 peak %7.1f GFLOP/s   launch %.1f us%s\n", b.name, pr.mem_bw / 1e9,
                   pr.peak_flops[KILN_DTYPE_F32] / 1e9, pr.launch_s * 1e6, !strcmp(b.name, "ref") ? "   (assumed)" : "");
        first = 0;
    }
    kiln_device_profile pr; /* the multi-GPU all-reduce, measured with NCCL over two or more GPUs */
    char why[512];
    int n_gpus = 0;
    bool link = kiln_multi_gpu(ctx, &n_gpus, why, sizeof why) == KILN_OK && kiln_ctx_profile(ctx, "cuda", &pr) == KILN_OK;
    if (json && link) printf(",\"link\":{\"gpus\":%d,\"link_bw\":%.6g,\"link_latency_s\":%.6g}", n_gpus, pr.link_bw, pr.link_latency_s);
    else if (json) {
        printf(",\"link\":{\"skipped\":");
        kiln_cli_json_str(stdout, why);
        printf("}");
    } else if (link)
        printf("link    all-reduce over %d GPUs: bus bandwidth %.1f GB/s, %.1f us for 8 KB\n", n_gpus, pr.link_bw / 1e9,
               pr.link_latency_s * 1e6);
    else printf("link    all-reduce not measured: %s\n", why);
    if (json) printf("}\n");
    else if (save) printf("saved to the cache dir (profiles.json); kiln plan and placement use it\n");
    kiln_ctx_free(ctx);
    return KILN_CLI_OK;
}
