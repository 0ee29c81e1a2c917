/* `kiln bench`: builds a model preset's layers with random weights, compiles once, and times
 * decode steps over a growing KV cache (n_kv and pos bound per step, no recompilation) or
 * prefill runs; reports the median ms per layer-step and effective GB/s. Must not assert on
 * speed or print anything but the report (and a progress line on a terminal). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/env.h"
#include "sched/backend.h"
#include "sched/ctx.h"
#include "model/presets.h"

typedef struct bench_opts {
    const kiln_preset *preset;  /* --preset */
    bool               prefill; /* --mode prefill (else decode) */
    int64_t            layers;  /* --layers; 0 = default */
    int64_t            steps;   /* --steps; 0 = default */
    int64_t            ctx;     /* --ctx; -1 = default */
    int64_t            tokens;  /* --tokens; 0 = default */
    const char        *backend; /* --backend or NULL (auto) */
    kiln_dtype         wtype;   /* --wtype */
    int64_t            seed;    /* --seed */
    int64_t            threads; /* --threads; 0 = one per core */
    bool               json;    /* --json */
    bool               profile; /* --profile: per-kernel predicted vs measured table */
    bool               no_roof; /* --no-roof: skip measuring the roofline in the same run */
    bool               check_finite; /* --check-finite: the NaN/Inf guard on (to measure its cost) */
    int32_t            precision;    /* --precision: codegen.precision (0: $KILN_PRECISION or exact) */
    bool               host_io; /* --host-io: x and y in host memory on cuda too (copied every step) */
    int64_t            gpus;    /* --gpus N: a tensor-parallel split over cuda:0..N-1 (0: none) */
    char               devices[256]; /* the split's devices ("cuda:0,1"), "" for none */
    char               layers_why[160]; /* why the default layer count ("" when --layers gave it) */
} bench_opts;

/* Results and the resources of one bench, freed by bench_free. */
typedef struct bench_state {
    kiln_ctx  *ctx;       /* context */
    kiln_plan *plan;      /* compiled stack */
    float     *x;         /* input rows [max_tok, hidden] */
    int32_t   *pos;       /* positions [max_tok] */
    float     *y;         /* output rows */
    double    *step_ms;   /* time of each timed step */
    double    *step_gb;   /* bytes read by each timed step, in GB */
    double    *step_gf;   /* FLOPs of each timed step, in GFLOP */
    double     compile_ms; /* kiln_compile time */
    int32_t    precision;  /* the compile's codegen.precision (with $KILN_PRECISION applied) */
    bool       is_ref;    /* running on the reference backend */
    int        io_be;     /* backend whose device memory holds dx, dy (cuda), or -1: x, y on the host */
    void      *dx, *dy;   /* device copies of x and y: a layer stack inside an engine reads and
                             writes device activations, not host memory */
} bench_state;

static int parse_mode(const char *v, bench_opts *o)
{
    if (strcmp(v, "decode") == 0 || strcmp(v, "prefill") == 0) {
        o->prefill = v[0] == 'p';
        return KILN_CLI_OK;
    }
    fprintf(stderr, "kiln bench: --mode wants decode, prefill or serve, got '%s'\n", v);
    return KILN_CLI_USAGE;
}

static int parse_preset(const char *v, bench_opts *o)
{
    if ((o->preset = kiln_preset_find(v)))
        return KILN_CLI_OK;
    fprintf(stderr, "kiln bench: unknown preset '%s'; presets:", v);
    for (int i = 0; i < kiln_preset_count(); i++)
        fprintf(stderr, " %s", kiln_preset_at(i)->name);
    fprintf(stderr, "\n");
    return KILN_CLI_USAGE;
}

static int parse_wtype(const char *v, bench_opts *o)
{
    if (kiln_dtype_parse(v, &o->wtype) && o->wtype != KILN_DTYPE_I32)
        return KILN_CLI_OK;
    fprintf(stderr, "kiln bench: --wtype wants f32, f16, bf16 or a block format (q8_0, q4_k, q5_k, q6_k, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, iq4_xs), got '%s'\n", v);
    return KILN_CLI_USAGE;
}

/* One flag at a->i; returns an exit code (KILN_CLI_OK to go on). */
static int parse_one(kiln_cli_args *a, bench_opts *o)
{
    static const struct {
        const char *flag; /* flag name */
        size_t      off;  /* offset of its int64_t field */
        int64_t     lo;   /* smallest value */
        int64_t     hi;   /* largest value */
    } ints[] = {{"--layers", offsetof(bench_opts, layers), 1, 4096},
                {"--steps", offsetof(bench_opts, steps), 1, 1000000},
                {"--ctx", offsetof(bench_opts, ctx), 0, 1 << 24},
                {"--tokens", offsetof(bench_opts, tokens), 1, 1 << 20},
                {"--seed", offsetof(bench_opts, seed), 0, INT64_MAX},
                {"--threads", offsetof(bench_opts, threads), 1, 256},
                {"--gpus", offsetof(bench_opts, gpus), 1, 64}};
    const char *v = NULL;
    int r;
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        if ((r = kiln_cli_flag_value(a, ints[k].flag, &v)) != 0)
            return r < 0 || !kiln_cli_parse_i64("bench", ints[k].flag, v, ints[k].lo, ints[k].hi,
                                                (int64_t *)((char *)o + ints[k].off))
                       ? KILN_CLI_USAGE
                       : KILN_CLI_OK;
    }
    if ((r = kiln_cli_flag_value(a, "--preset", &v)) != 0)
        return r < 0 ? KILN_CLI_USAGE : parse_preset(v, o);
    if ((r = kiln_cli_flag_value(a, "--mode", &v)) != 0)
        return r < 0 ? KILN_CLI_USAGE : parse_mode(v, o);
    if ((r = kiln_cli_flag_value(a, "--wtype", &v)) != 0)
        return r < 0 ? KILN_CLI_USAGE : parse_wtype(v, o);
    if ((r = kiln_cli_flag_value(a, "--precision", &v)) != 0) {
        if (r < 0) return KILN_CLI_USAGE;
        if (!strcmp(v, "f16")) o->precision = KILN_PREC_F16;
        else if (!strcmp(v, "exact")) o->precision = KILN_PREC_EXACT;
        else return fprintf(stderr, "kiln bench: --precision '%s': exact or f16\n", v), KILN_CLI_USAGE;
        return KILN_CLI_OK;
    }
    if ((r = kiln_cli_flag_value(a, "--backend", &v)) != 0) {
        o->backend = v;
        return r < 0 ? KILN_CLI_USAGE : KILN_CLI_OK;
    }
    if (strcmp(a->argv[a->i], "--json") == 0 || strcmp(a->argv[a->i], "--profile") == 0 ||
        strcmp(a->argv[a->i], "--no-roof") == 0 || strcmp(a->argv[a->i], "--check-finite") == 0 ||
        strcmp(a->argv[a->i], "--host-io") == 0) {
        bool *f = a->argv[a->i][2] == 'j' ? &o->json : a->argv[a->i][2] == 'p' ? &o->profile
                : a->argv[a->i][2] == 'c' ? &o->check_finite : a->argv[a->i][2] == 'h' ? &o->host_io : &o->no_roof;
        *f = true;
        a->i++;
        return KILN_CLI_OK;
    }
    if (a->argv[a->i][0] == '-')
        return kiln_cli_unknown_flag("bench", a->argv[a->i]);
    fprintf(stderr, "kiln bench: unexpected argument '%s' (see kiln bench --help)\n", a->argv[a->i]);
    return KILN_CLI_USAGE;
}

static int parse_args(int argc, char *const *argv, bench_opts *o)
{
    *o = (bench_opts){.ctx = -1, .wtype = KILN_DTYPE_Q8_0, .seed = 1};
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "bench"};
    while (a.i < argc) {
        int rc = parse_one(&a, o);
        if (rc != KILN_CLI_OK)
            return rc;
    }
    if (!o->preset) {
        fprintf(stderr, "kiln bench: missing --preset NAME (see kiln bench --help)\n");
        return KILN_CLI_USAGE;
    }
    return KILN_CLI_OK;
}

/* L3 size from sysfs; 32 MiB when unknown. */
static size_t l3_bytes(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    unsigned long v = 0;
    char unit = 'K';
    if (f) {
        if (fscanf(f, "%lu%c", &v, &unit) < 1)
            v = 0;
        fclose(f);
    }
    size_t mul = unit == 'M' ? 1u << 20 : unit == 'G' ? 1u << 30 : 1024u;
    return v ? (size_t)v * mul : (size_t)32 << 20;
}

/* Fills the defaults that depend on the backend (reference: small and short). */
static void defaults(bench_opts *o, bool is_ref)
{
    if (!o->steps)
        o->steps = o->prefill ? (is_ref ? 2 : 4) : (is_ref ? 8 : 32);
    if (o->ctx < 0)
        o->ctx = is_ref ? 128 : 1024;
    if (!o->tokens)
        o->tokens = is_ref ? 32 : 256;
    if (!o->layers) {
        size_t lb = kiln_preset_layer_weight_bytes(o->preset, o->wtype);
        size_t want = 2 * l3_bytes(), ram = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
        o->layers = is_ref ? 1 : (int64_t)((want + lb - 1) / lb);
        while (o->layers > 1 && (size_t)o->layers * lb * 3 > ram / 2) /* graph copy + plan + slack */
            o->layers--;
        /* The preset's own depth does not matter for a per-layer figure; what does is that the weights
         * do not fit in the caches, so every step reads them from memory as a real model's do. */
        if (is_ref)
            snprintf(o->layers_why, sizeof o->layers_why, "1 layer: the reference backend is slow; --layers N for more");
        else
            snprintf(o->layers_why, sizeof o->layers_why,
                     "%lld layers of %.1f MiB: weights over twice the %.0f MiB L3 cache, so each step reads memory "
                     "(not the model's depth; --layers N to change)", (long long)o->layers, (double)lb / (1 << 20),
                     (double)l3_bytes() / (1 << 20));
    }
}

/* Whether "auto"/the named backend is the reference (auto picks ref only when nothing else is). */
static bool backend_is_ref(const kiln_ctx *ctx, const char *backend)
{
    if (backend && strcmp(backend, "auto") != 0)
        return strcmp(backend, "ref") == 0;
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info b;
        if (kiln_backend_get(ctx, i, &b) == KILN_OK && b.available && strcmp(b.name, "ref") != 0)
            return false;
    }
    return true;
}


static int setup(bench_opts *o, bench_state *st)
{
    kiln_ctx_options co = {.quiet = kiln_cli_quiet, .n_threads = (int)o->threads};
    kiln_status s = kiln_ctx_new(&co, &st->ctx);
    if (s != KILN_OK)
        return kiln_cli_fail("bench", st->ctx, s, "creating the context");
    if (!o->threads)
        o->threads = kiln_cli_threads();
    st->is_ref = backend_is_ref(st->ctx, o->backend);
    defaults(o, st->is_ref);
    int64_t max_tok = o->prefill ? o->tokens : 1;
    int64_t max_ctx = o->prefill ? o->tokens : o->ctx + o->steps + 2;
    kiln_preset_build_opts bo = {.wdtype = o->wtype, .kvdtype = kiln_preset_kv_dtype(o->wtype), .n_layers = (int)o->layers,
                                 .max_ctx = max_ctx, .max_tok = max_tok, .seed = (uint64_t)o->seed};
    kiln_graph *g = NULL;
    char err[512];
    bool progress = !o->json && isatty(2);
    if (progress)
        fprintf(stderr, "  building and compiling %lld layers of %s...", (long long)o->layers, o->preset->name);
    if ((s = kiln_preset_build_ex(o->preset, &bo, &g, err, sizeof err)) != KILN_OK) {
        fprintf(stderr, "%skiln bench: building %s: %s: %s\n", progress ? "\n" : "", o->preset->name,
                kiln_status_str(s), err);
        return KILN_CLI_FAIL;
    }
    kiln_compile_options copt = {.backend = o->backend, .check_finite = o->check_finite, .codegen.precision = o->precision};
    if (o->gpus > 1) { /* a split: x and y on the host (each part reads x on its own GPU) */
        int k = snprintf(o->devices, sizeof o->devices, "cuda:");
        for (int64_t d = 0; d < o->gpus; d++) k += snprintf(o->devices + k, sizeof o->devices - (size_t)k, "%s%lld", d ? "," : "", (long long)d);
        copt.devices = o->devices;
        o->host_io = true;
    } else if (o->gpus == 1 && !o->backend) {
        copt.backend = "cuda";
    }
    kiln_compile_options eff;
    kiln_env_options(&copt, &eff); /* what the compile will take: to report it */
    st->precision = eff.codegen.precision;
    double t0 = kiln_cli_now();
    s = kiln_compile(st->ctx, g, &copt, &st->plan);
    st->compile_ms = (kiln_cli_now() - t0) * 1e3;
    kiln_graph_free(g);
    if (progress)
        fprintf(stderr, "\r%70s\r", "");
    if (s != KILN_OK)
        return kiln_cli_fail("bench", st->ctx, s, "compiling");
    st->is_ref = strcmp(kiln_plan_backend(st->plan), "ref") == 0;
    size_t rows = (size_t)max_tok * (size_t)o->preset->hidden;
    st->x = malloc(rows * sizeof *st->x);
    st->y = malloc(rows * sizeof *st->y);
    st->pos = malloc((size_t)max_tok * sizeof *st->pos);
    st->step_ms = calloc((size_t)o->steps, sizeof *st->step_ms);
    st->step_gb = calloc((size_t)o->steps, sizeof *st->step_gb);
    st->step_gf = calloc((size_t)o->steps, sizeof *st->step_gf);
    if (!st->x || !st->y || !st->pos || !st->step_ms || !st->step_gb || !st->step_gf)
        return kiln_cli_fail("bench", NULL, KILN_ERR_NOMEM, "allocating buffers");
    uint64_t rng = (uint64_t)o->seed ^ 0x5eedull;
    for (size_t i = 0; i < rows; i++)
        st->x[i] = kiln_preset_rngf(&rng);
    st->io_be = -1;
    if (!o->host_io && strcmp(kiln_plan_backend(st->plan), "cuda") == 0) {
        const kiln_backend_i *b = kiln_backends[KILN_BACKEND_CUDA];
        void *bs = st->ctx->be_state[KILN_BACKEND_CUDA];
        size_t xb = rows * sizeof *st->x;
        if (b->alloc(bs, xb, &st->dx, err, sizeof err) != KILN_OK || b->alloc(bs, xb, &st->dy, err, sizeof err) != KILN_OK ||
            b->upload(bs, st->dx, st->x, xb, err, sizeof err) != KILN_OK || b->sync(bs, err, sizeof err) != KILN_OK) {
            fprintf(stderr, "kiln bench: device memory for x and y: %s\n", err);
            return KILN_CLI_FAIL;
        }
        st->io_be = KILN_BACKEND_CUDA;
    }
    return KILN_CLI_OK;
}

/* One run: n_tok tokens at positions start.., attending over start + n_tok rows. */
static kiln_status step(const bench_opts *o, bench_state *st, int64_t n_tok, int64_t start)
{
    for (int64_t t = 0; t < n_tok; t++)
        st->pos[t] = (int32_t)(start + t);
    size_t xb = (size_t)n_tok * (size_t)o->preset->hidden * sizeof(float);
    bool dev = st->io_be >= 0;
    kiln_binding b[5] = {
        {.name = "n_tok", .value = n_tok},
        {.name = "n_kv", .value = start + n_tok},
        {.name = "x", .data = dev ? st->dx : st->x, .bytes = xb, .device = dev},
        {.name = "pos", .data = st->pos, .bytes = (size_t)n_tok * sizeof(int32_t)},
        {.name = "y", .data = dev ? st->dy : st->y, .bytes = xb, .device = dev},
    };
    return kiln_run(st->plan, b, 5);
}

static int timed_loop(const bench_opts *o, bench_state *st)
{
    bool progress = !o->json && isatty(2);
    int64_t n_tok = o->prefill ? o->tokens : 1;
    size_t wbytes = (size_t)o->layers * kiln_preset_layer_weight_bytes(o->preset, o->wtype);
    double t_begin = kiln_cli_now();
    kiln_status s = step(o, st, n_tok, o->prefill ? 0 : o->ctx); /* warm-up, untimed */
    if (o->profile) kiln_plan_profile(st->plan, true);
    for (int64_t i = 0; s == KILN_OK && i < o->steps; i++) {
        int64_t start = o->prefill ? 0 : o->ctx + 1 + i;
        double t0 = kiln_cli_now();
        s = step(o, st, n_tok, start);
        double t1 = kiln_cli_now();
        st->step_ms[i] = (t1 - t0) * 1e3;
        size_t kv = (size_t)o->layers * kiln_preset_layer_kv_bytes(o->preset, kiln_preset_kv_dtype(o->wtype), start + n_tok);
        st->step_gb[i] = (double)(wbytes + kv) * 1e-9;
        st->step_gf[i] = (double)o->layers * kiln_preset_layer_flops(o->preset, n_tok, start + n_tok) * 1e-9;
        if (progress && t1 - t_begin > 1.0)
            fprintf(stderr, "\r  step %lld/%lld  %.2f ms/layer-step   ", (long long)(i + 1), (long long)o->steps,
                    st->step_ms[i] / (double)o->layers);
    }
    if (progress && kiln_cli_now() - t_begin > 1.0)
        fprintf(stderr, "\r%60s\r", "");
    return s == KILN_OK ? KILN_CLI_OK : kiln_cli_fail("bench", st->ctx, s, "running a step");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The device text of a backend ("NVIDIA H100 ...", "llvmpipe ..."), cut at 120 characters. */
static const char *backend_detail(const kiln_ctx *ctx, const char *be)
{
    static char buf[128];
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info b;
        if (kiln_backend_get(ctx, i, &b) == KILN_OK && !strcmp(b.name, be)) {
            snprintf(buf, sizeof buf, "%.120s", b.detail);
            return buf;
        }
    }
    return be;
}

static void report(const bench_opts *o, const bench_state *st)
{
    size_t n = (size_t)o->steps;
    double *sorted = malloc(n * sizeof *sorted), gb = 0, gf = 0;
    if (!sorted)
        return;
    memcpy(sorted, st->step_ms, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_double);
    double med = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    for (size_t i = 0; i < n; i++)
        gb += st->step_gb[i] / (double)n, gf += st->step_gf[i] / (double)n;
    double per_layer = med / (double)o->layers, gbps = gb / (med * 1e-3), gfps = gf / (med * 1e-3);
    const char *be = kiln_plan_backend(st->plan), *isa = kiln_cpu_isa(st->ctx);
    const char *wt = kiln_dtype_name(o->wtype), *kt = kiln_dtype_name(kiln_preset_kv_dtype(o->wtype));
    /* The roofline of this machine, measured now, in the same run (memory bandwidth drifts). */
    kiln_device_profile prof = {0}, before = {0};
    double roof_bw = 0, roof_gf = 0;
    bool roof_measured = false; /* a backend without calibration keeps its default profile: say it is assumed */
    if (!o->no_roof && strcmp(be, "ref") != 0 && kiln_ctx_profile(st->ctx, be, &before) == KILN_OK &&
        kiln_calibrate(st->ctx, false) == KILN_OK && kiln_ctx_profile(st->ctx, be, &prof) == KILN_OK) {
        roof_bw = prof.mem_bw * 1e-9, roof_gf = prof.peak_flops[KILN_DTYPE_F32] * 1e-9;
        roof_measured = memcmp(&prof, &before, sizeof prof) != 0;
    }
    /* The header names the device the plan runs on: the CPU's ISA and threads only for cpu. */
    char where[200];
    if (!strcmp(be, "cpu"))
        snprintf(where, sizeof where, "%s, %d threads", isa, (int)o->threads);
    else
        snprintf(where, sizeof where, "%s", backend_detail(st->ctx, be));
    double frac_bw = roof_bw > 0 ? gbps / roof_bw : 0, frac_gf = roof_gf > 0 ? gfps / roof_gf : 0;
    if (o->json) {
        printf("{\"preset\":\"%s\",\"mode\":\"%s\",\"backend\":", o->preset->name, o->prefill ? "prefill" : "decode");
        kiln_cli_json_str(stdout, be);
        printf(",\"isa\":");
        kiln_cli_json_str(stdout, isa);
        printf(",\"threads\":%d,\"wtype\":\"%s\",\"kvtype\":\"%s\",\"layers\":%lld,\"steps\":%lld,\"ctx\":%lld,"
               "\"tokens\":%lld,\"precision\":\"%s\",\"kernels\":%d,\"compile_ms\":%.3f,\"compile_cache\":\"%s\",\"ms_per_layer_step\":%.6f,\"gb_per_s\":%.4f,"
               "\"gflop_per_s\":%.4f,\"roof_gb_per_s\":%.4f,\"roof_gflop_per_s\":%.4f,\"roof_measured\":%s,\"fraction_of_bw\":%.4f,"
               "\"fraction_of_peak\":%.4f,\"bytes_per_step\":%.0f,\"io\":\"%s\",\"devices\":\"%s\",\"step_ms\":[",
               (int)o->threads, wt, kt, (long long)o->layers, (long long)o->steps, (long long)o->ctx,
               (long long)(o->prefill ? o->tokens : 1), st->precision == KILN_PREC_F16 ? "f16" : "exact", kiln_plan_kernel_count(st->plan), st->compile_ms, kiln_plan_cache(st->plan), per_layer,
               gbps, gfps, roof_bw, roof_gf, roof_measured ? "true" : "false", frac_bw, frac_gf, gb * 1e9, st->io_be >= 0 ? "device" : "host",
               o->devices);
        for (size_t i = 0; i < n; i++)
            printf("%s%.6f", i ? "," : "", st->step_ms[i]);
        printf("]");
        char *kp = NULL; /* per kernel: bytes (cost model), measured_s (device time where it has timers), achieved_gb_s */
        if (o->profile && kiln_plan_explain(st->plan, "json", &kp) == KILN_OK) {
            size_t l = strlen(kp);
            while (l && kp[l - 1] == '\n') kp[--l] = 0;
            printf(",\"profile\":%s", kp);
        }
        free(kp);
        printf("}\n");
    } else {
        printf("%s %s on %s (%s), %s weights, %s KV, %lld layers, %d kernels%s\n", o->preset->name,
               o->prefill ? "prefill" : "decode", be, where, wt, kt, (long long)o->layers, kiln_plan_kernel_count(st->plan),
               st->precision == KILN_PREC_F16 && strcmp(be, "cpu") && strcmp(be, "ref") ? ", activations into tensor cores as f16 (--precision f16)" : "");
        if (o->layers_why[0])
            printf("  %s\n", o->layers_why);
        if (o->devices[0]) /* bytes and FLOPs below are the whole layer's; the roofline is one GPU's */
            printf("  tensor-parallel split over %s (bytes and FLOPs below: the whole layer, over all GPUs)\n", o->devices);
        if (o->prefill)
            printf("  %lld tokens, %lld steps\n", (long long)o->tokens, (long long)o->steps);
        else
            printf("  n_kv %lld..%lld, %lld steps\n", (long long)o->ctx + 2, (long long)(o->ctx + 1 + o->steps),
                   (long long)o->steps);
        printf("  %.1f MB read and %.2f GFLOP per step, compile %.1f ms (cache: %s), x and y in %s memory\n", gb * 1e3, gf,
               st->compile_ms, kiln_plan_cache(st->plan), st->io_be >= 0 ? "device" : "host");
        printf("  median %.3f ms/layer-step (min %.3f, max %.3f)   %.2f GB/s   %.2f GFLOP/s\n", per_layer,
               sorted[0] / (double)o->layers, sorted[n - 1] / (double)o->layers, gbps, gfps);
        if (roof_bw > 0)
            printf("  roofline %s: %.1f GB/s read, %.1f GFLOP/s f32 -> %.0f%% of %s bandwidth, %.0f%% of its peak\n",
                   roof_measured ? "measured now" : "assumed (kiln's default profile: this backend has no calibration)",
                   roof_bw, roof_gf, 100 * frac_bw, be, 100 * frac_gf);
    }
    if (o->profile && !o->json) { /* with --json it is the object's "profile" */
        char *txt = NULL;
        if (kiln_plan_explain(st->plan, "text", &txt) == KILN_OK) {
            printf("\nper kernel, all %lld layers (measured = mean over the timed steps):\n%s", (long long)o->layers, txt);
            free(txt);
        }
    }
    free(sorted);
}

int kiln_cli_bench(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "bench"))
        return KILN_CLI_OK;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--model", 7) == 0 && (argv[i][7] == 0 || argv[i][7] == '='))
            return kiln_cli_bench_model(argc, argv);
    for (int i = 1; i < argc; i++) /* a serving step over paged attention: bench_serve.c */
        if (!strcmp(argv[i], "--mode=serve") || (!strcmp(argv[i], "--mode") && i + 1 < argc && !strcmp(argv[i + 1], "serve")))
            return kiln_cli_bench_serve(argc, argv);
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != KILN_CLI_OK)
        return rc;
    bench_state st = {.io_be = -1};
    rc = setup(&o, &st);
    if (rc == KILN_CLI_OK)
        rc = timed_loop(&o, &st);
    if (rc == KILN_CLI_OK)
        report(&o, &st);
    free(st.x);
    free(st.y);
    free(st.pos);
    free(st.step_ms);
    free(st.step_gb);
    free(st.step_gf);
    if (st.io_be >= 0) {
        kiln_backends[st.io_be]->free(st.ctx->be_state[st.io_be], st.dx);
        kiln_backends[st.io_be]->free(st.ctx->be_state[st.io_be], st.dy);
    }
    kiln_plan_free(st.plan);
    kiln_ctx_free(st.ctx);
    return rc;
}
