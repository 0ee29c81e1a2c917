/* `kiln bench --mode serve`: a preset's layers with paged attention (kiln_paged_attention), timed
 * as a serving engine runs them: steady-state decode of --seqs sequences at KV length --ctx (one
 * token each per step, blocks shuffled over the pool, equal or ragged lengths with the same total)
 * and a mixed step (one --chunk-token prefill chunk plus seqs - 1 decoding sequences) with its time
 * split between matmul and attention kernels (--only decode|mixed: one of them, e.g. under a
 * profiler; --profile: the plan's per-kernel table of the decode steps); or (--host, cuda or vulkan)
 * the host time of kiln_run_async per step with every binding in device memory, and of the waits
 * between bursts of steps. JSON or text out. Must not assert on speed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "sched/backend.h"
#include "sched/ctx.h"

typedef struct serve_opts {
    const kiln_preset *preset;
    int64_t            seqs, ctx, block, layers, steps, chunk, seed; /* --seqs --ctx --block --layers --steps --chunk --seed */
    kiln_dtype         wtype;   /* --wtype (default f16) */
    kiln_dtype         kv;      /* --kv: the pools' dtype (default f16; f32 with f32 weights; q8_0) */
    const char        *backend; /* --backend */
    bool               json, ragged, host, profile; /* --json, --ragged, --host, --profile */
    char               only;    /* --only decode|mixed: 'd' or 'm'; 0: both */
} serve_opts;

typedef struct serve_state {
    kiln_ctx  *ctx;
    kiln_plan *plan;
    int64_t    max_tok, mb, n_blocks; /* capacity: tokens, block table width, pool blocks */
    int32_t   *pos, *slots, *seqs, *bt, *len; /* step metadata; len: each sequence's KV length before the step */
    float     *x, *y;                 /* activations (host) */
    void      *dx, *dy;               /* on cuda (and vulkan with --host): device copies (what an engine binds) */
    void      *dmeta[4];              /* --host: pos, slots, seqs, blocks in device memory */
    bool       dev;                   /* x and y bound as device memory */
    int        dbe;                   /* the backend whose memory dx, dy and dmeta are in */
} serve_state;

static int parse(int argc, char *const *argv, serve_opts *o)
{
    *o = (serve_opts){.seqs = 16, .ctx = 1024, .block = 16, .chunk = 512, .seed = 1, .wtype = KILN_DTYPE_F16, .kv = KILN_DTYPE_COUNT};
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "bench"};
    static const struct { const char *flag; size_t off; int64_t lo, hi; } ints[] = {
        {"--seqs", offsetof(serve_opts, seqs), 1, 4096},     {"--ctx", offsetof(serve_opts, ctx), 0, 1 << 20},
        {"--block", offsetof(serve_opts, block), 1, 1024},   {"--layers", offsetof(serve_opts, layers), 1, 4096},
        {"--steps", offsetof(serve_opts, steps), 1, 100000}, {"--chunk", offsetof(serve_opts, chunk), 0, 1 << 16},
        {"--seed", offsetof(serve_opts, seed), 0, INT64_MAX}};
    while (a.i < argc) {
        const char *v = NULL;
        int r = 0;
        size_t k = 0;
        for (; k < sizeof ints / sizeof *ints && !(r = kiln_cli_flag_value(&a, ints[k].flag, &v)); k++) {}
        if (r < 0) return KILN_CLI_USAGE;
        if (r > 0) {
            if (!kiln_cli_parse_i64("bench", ints[k].flag, v, ints[k].lo, ints[k].hi, (int64_t *)((char *)o + ints[k].off)))
                return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--mode", &v)) != 0) {
            if (r < 0 || strcmp(v, "serve") != 0) return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--only", &v)) != 0) {
            if (r < 0 || (strcmp(v, "decode") != 0 && strcmp(v, "mixed") != 0)) {
                fprintf(stderr, "kiln bench: --only wants decode or mixed\n");
                return KILN_CLI_USAGE;
            }
            o->only = v[0];
        } else if ((r = kiln_cli_flag_value(&a, "--backend", &v)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
            o->backend = v;
        } else if ((r = kiln_cli_flag_value(&a, "--kv", &v)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
            if (!kiln_dtype_parse(v, &o->kv) || (o->kv != KILN_DTYPE_F32 && o->kv != KILN_DTYPE_F16 && o->kv != KILN_DTYPE_Q8_0)) {
                fprintf(stderr, "kiln bench: --kv wants f32, f16 or q8_0, got '%s'\n", v);
                return KILN_CLI_USAGE;
            }
        } else if ((r = kiln_cli_preset_flags(&a, &o->preset, &o->wtype)) != 0) {
            if (r < 0) return KILN_CLI_USAGE;
        } else if (!strcmp(argv[a.i], "--json") || !strcmp(argv[a.i], "--ragged") || !strcmp(argv[a.i], "--host") ||
                   !strcmp(argv[a.i], "--profile")) {
            char c = argv[a.i][2];
            *(c == 'j' ? &o->json : c == 'r' ? &o->ragged : c == 'h' ? &o->host : &o->profile) = true;
            a.i++;
        } else {
            return kiln_cli_unknown_flag("bench", argv[a.i]);
        }
    }
    if (!o->steps) o->steps = o->host ? 160 : 16;
    if (o->kv == KILN_DTYPE_COUNT) o->kv = kiln_preset_kv_dtype(o->wtype);
    if (!o->preset) {
        fprintf(stderr, "kiln bench: missing --preset NAME (see kiln bench --help)\n");
        return KILN_CLI_USAGE;
    }
    if (o->only == 'm' && o->chunk < 2) {
        fprintf(stderr, "kiln bench: --only mixed needs a prefill chunk (--chunk of 2 or more)\n");
        return KILN_CLI_USAGE;
    }
    if (o->block & (o->block - 1)) {
        fprintf(stderr, "kiln bench: --block %lld must be a power of two\n", (long long)o->block);
        return KILN_CLI_USAGE;
    }
    return KILN_CLI_OK;
}

/* KV length of sequence s before the timed steps: --ctx each, or (--ragged) spread over
 * [ctx/2, 3ctx/2] with the same total. */
static int64_t base_len(const serve_opts *o, int64_t s)
{
    if (!o->ragged || o->seqs == 1) return o->ctx;
    return o->ctx / 2 + (o->ctx * s) / (o->seqs - 1);
}

static int setup(serve_opts *o, serve_state *st)
{
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = kiln_cli_quiet}, &st->ctx);
    if (s != KILN_OK) return kiln_cli_fail("bench", st->ctx, s, "creating the context");
    if (!o->layers) o->layers = o->host ? 32 : o->backend && !strcmp(o->backend, "ref") ? 1 : 4;
    /* the longest sequence's keys (a pool no larger than needed: past 2^31 elements kiln refuses it) */
    int64_t keys = o->ctx + (o->ragged ? o->ctx / 2 : 0) + o->steps + o->chunk + 2;
    st->mb = (keys + o->block - 1) / o->block;
    st->n_blocks = o->seqs * st->mb;
    st->max_tok = o->seqs + (o->chunk > 1 ? o->chunk - 1 : 0);
    kiln_preset_build_opts bo = {.wdtype = o->wtype, .kvdtype = o->kv, .n_layers = (int)o->layers,
                                 .max_ctx = st->n_blocks * o->block, .max_tok = st->max_tok, .seed = (uint64_t)o->seed,
                                 .block = o->block, .max_seqs = o->seqs, .max_blocks = st->mb};
    kiln_graph *g = NULL;
    char err[512];
    if ((s = kiln_preset_build_ex(o->preset, &bo, &g, err, sizeof err)) != KILN_OK) {
        fprintf(stderr, "kiln bench: building %s: %s: %s\n", o->preset->name, kiln_status_str(s), err);
        return KILN_CLI_FAIL;
    }
    s = kiln_compile(st->ctx, g, &(kiln_compile_options){.backend = o->backend}, &st->plan);
    kiln_graph_free(g);
    if (s != KILN_OK) return kiln_cli_fail("bench", st->ctx, s, "compiling");
    size_t rows = (size_t)st->max_tok * (size_t)o->preset->hidden;
    st->x = malloc(rows * 4), st->y = malloc(rows * 4);
    st->pos = malloc((size_t)st->max_tok * 4), st->slots = malloc((size_t)st->max_tok * 4);
    st->seqs = malloc((size_t)o->seqs * 8), st->len = malloc((size_t)o->seqs * 4);
    st->bt = malloc((size_t)(o->seqs * st->mb) * 4);
    if (!st->x || !st->y || !st->pos || !st->slots || !st->seqs || !st->len || !st->bt)
        return kiln_cli_fail("bench", NULL, KILN_ERR_NOMEM, "allocating buffers");
    uint64_t rng = (uint64_t)o->seed ^ 0x5e7eull;
    for (size_t i = 0; i < rows; i++) st->x[i] = kiln_preset_rngf(&rng);
    for (int64_t i = 0; i < st->n_blocks; i++) st->bt[i] = (int32_t)i;
    for (int64_t i = st->n_blocks - 1; i > 0; i--) { /* shuffled physical blocks: paging must cost no bandwidth */
        int64_t j = (int64_t)(kiln_preset_rng(&rng) % (uint64_t)(i + 1));
        int32_t t = st->bt[i];
        st->bt[i] = st->bt[j], st->bt[j] = t;
    }
    for (int64_t q = 0; q < o->seqs; q++) st->len[q] = (int32_t)base_len(o, q);
    bool vk = o->host && !strcmp(kiln_plan_backend(st->plan), "vulkan");
    if (vk || !strcmp(kiln_plan_backend(st->plan), "cuda")) { /* x and y in device memory, as in an engine */
        st->dbe = vk ? KILN_BACKEND_VULKAN : KILN_BACKEND_CUDA;
        const kiln_backend_i *b = kiln_backends[st->dbe];
        void *bs = st->ctx->be_state[st->dbe];
        if (b->alloc(bs, rows * 4, &st->dx, err, sizeof err) != KILN_OK || b->alloc(bs, rows * 4, &st->dy, err, sizeof err) != KILN_OK ||
            b->upload(bs, st->dx, st->x, rows * 4, err, sizeof err) != KILN_OK || b->sync(bs, err, sizeof err) != KILN_OK) {
            fprintf(stderr, "kiln bench: device memory for x and y: %s\n", err);
            return KILN_CLI_FAIL;
        }
        st->dev = true;
    }
    return KILN_CLI_OK;
}

/* The metadata of a step (sequence 0 feeds `first` tokens, the others one each, after `extra`
 * earlier steps) into st's host arrays; returns the step's tokens. */
static int64_t fill_meta(const serve_opts *o, serve_state *st, int64_t first, int64_t extra)
{
    int64_t t = 0;
    for (int64_t q = 0; q < o->seqs; q++) {
        int64_t n = q ? 1 : first, start = st->len[q] + extra;
        st->seqs[2 * q] = (int32_t)t, st->seqs[2 * q + 1] = (int32_t)(start + n);
        const int32_t *row = st->bt + q * st->mb;
        for (int64_t j = 0; j < n; j++, t++)
            st->pos[t] = (int32_t)(start + j), st->slots[t] = (int32_t)(row[(start + j) / o->block] * o->block + (start + j) % o->block);
    }
    return t;
}

/* One step: sequence 0 feeds `first` tokens, the others one each, after `extra` earlier steps. */
static kiln_status step(const serve_opts *o, serve_state *st, int64_t first, int64_t extra)
{
    int64_t t = fill_meta(o, st, first, extra);
    size_t xb = (size_t)t * (size_t)o->preset->hidden * 4;
    kiln_binding b[] = {
        {.name = "n_tok", .value = t},
        {.name = "n_seq", .value = o->seqs},
        {.name = "x", .data = st->dev ? st->dx : st->x, .bytes = xb, .device = st->dev},
        {.name = "pos", .data = st->pos, .bytes = (size_t)t * 4},
        {.name = "slots", .data = st->slots, .bytes = (size_t)t * 4},
        {.name = "seqs", .data = st->seqs, .bytes = (size_t)o->seqs * 8},
        {.name = "blocks", .data = st->bt, .bytes = (size_t)(o->seqs * st->mb) * 4},
        {.name = "y", .data = st->dev ? st->dy : st->y, .bytes = xb, .device = st->dev},
    };
    return kiln_run(st->plan, b, sizeof b / sizeof *b);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median ms of `n` steps of `first` tokens for sequence 0. */
static kiln_status timed(const serve_opts *o, serve_state *st, int64_t first, int64_t n, double *med)
{
    double *ms = calloc((size_t)n, sizeof *ms);
    if (!ms) return KILN_ERR_NOMEM;
    kiln_status s = step(o, st, first, 0); /* warm-up */
    for (int64_t i = 0; s == KILN_OK && i < n; i++) {
        double t0 = kiln_cli_now();
        s = step(o, st, first, first > 1 ? 0 : i + 1);
        ms[i] = (kiln_cli_now() - t0) * 1e3;
    }
    qsort(ms, (size_t)n, sizeof *ms, cmp_d);
    *med = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    free(ms);
    return s;
}

/* Mean measured seconds of the matmul and attention kernels (and all) over `n` profiled mixed steps. */
static kiln_status split(const serve_opts *o, serve_state *st, int64_t n, double out[3])
{
    kiln_plan_profile(st->plan, true);
    kiln_status s = KILN_OK;
    for (int64_t i = 0; s == KILN_OK && i < n; i++) s = step(o, st, o->chunk, 0);
    kiln_plan_profile(st->plan, false);
    out[0] = out[1] = out[2] = 0;
    for (int r = 0; s == KILN_OK && r < kiln_plan_kernel_count(st->plan); r++) {
        kiln_region_info ri;
        if (kiln_plan_region(st->plan, r, &ri) != KILN_OK) continue;
        if (!strcmp(ri.kind, "matmul")) out[0] += ri.measured_s;
        else if (!strcmp(ri.kind, "attention")) out[1] += ri.measured_s;
        out[2] += ri.measured_s;
    }
    return s;
}

/* --host: a decode step's metadata uploaded once into device memory (an engine writes its own every
 * step, on its stream: its work, not kiln's), so that every binding of the step is device memory. */
static kiln_status host_setup(const serve_opts *o, serve_state *st, int64_t *t_out, char *err, size_t n)
{
    const kiln_backend_i *b = kiln_backends[st->dbe];
    void *bs = st->ctx->be_state[st->dbe];
    int64_t t = *t_out = fill_meta(o, st, 1, 0);
    const void *src[4] = {st->pos, st->slots, st->seqs, st->bt};
    size_t bytes[4] = {(size_t)t * 4, (size_t)t * 4, (size_t)o->seqs * 8, (size_t)(o->seqs * st->mb) * 4};
    kiln_status s = KILN_OK;
    for (int i = 0; s == KILN_OK && i < 4; i++)
        if ((s = b->alloc(bs, bytes[i], &st->dmeta[i], err, n)) == KILN_OK) s = b->upload(bs, st->dmeta[i], src[i], bytes[i], err, n);
    return s == KILN_OK ? b->sync(bs, err, n) : s;
}

/* The wait between bursts: cuda, a sync of kiln's stream; vulkan, kiln_plan_wait. */
static kiln_status burst_wait(serve_state *st)
{
    if (st->dbe == KILN_BACKEND_VULKAN) return kiln_plan_wait(st->plan);
    char err[512] = "";
    kiln_status s = kiln_backends[st->dbe]->sync(st->ctx->be_state[st->dbe], err, sizeof err);
    return s == KILN_OK ? s : kiln_ctx_fail(st->ctx, s, "sync: %s", err);
}

/* --host: the host time of each kiln_run_async call of `steps` decode steps (cuda: the caller's
 * stream is the legacy default stream; vulkan: a kiln_vk_sync without semaphores), enqueued in
 * bursts (cuda 16, vulkan KILN_VK_MAX_PENDING) with a wait between them so that the queue never
 * fills; res = median, p90 and max us per call, device ms per step (bursts and waits), and the
 * waits' host us per step. */
static kiln_status host_timed(const serve_opts *o, serve_state *st, double res[5])
{
    char err[512] = "";
    int64_t t = 0;
    kiln_status s = host_setup(o, st, &t, err, sizeof err);
    if (s != KILN_OK) return kiln_ctx_fail(st->ctx, s, "device metadata: %s", err);
    size_t xb = (size_t)t * (size_t)o->preset->hidden * 4;
    kiln_binding bd[] = {
        {.name = "n_tok", .value = t},
        {.name = "n_seq", .value = o->seqs},
        {.name = "x", .data = st->dx, .bytes = xb, .device = true},
        {.name = "pos", .data = st->dmeta[0], .bytes = (size_t)t * 4, .device = true},
        {.name = "slots", .data = st->dmeta[1], .bytes = (size_t)t * 4, .device = true},
        {.name = "seqs", .data = st->dmeta[2], .bytes = (size_t)o->seqs * 8, .device = true},
        {.name = "blocks", .data = st->dmeta[3], .bytes = (size_t)(o->seqs * st->mb) * 4, .device = true},
        {.name = "y", .data = st->dy, .bytes = xb, .device = true},
    };
    size_t nb = sizeof bd / sizeof *bd;
    double *us = calloc((size_t)o->steps, sizeof *us), dev = 0, wait = 0;
    if (!us) return KILN_ERR_NOMEM;
    kiln_vk_sync vs = {.magic = KILN_VK_SYNC_MAGIC};
    void *stream = st->dbe == KILN_BACKEND_VULKAN ? (void *)&vs : NULL;
    int64_t burst = st->dbe == KILN_BACKEND_VULKAN ? KILN_VK_MAX_PENDING : 16;
    if ((s = kiln_run_async(st->plan, bd, nb, stream)) == KILN_OK) s = burst_wait(st); /* records the graph / command buffer */
    for (int64_t i = 0; s == KILN_OK && i < o->steps; i += burst) {
        double t0 = kiln_cli_now();
        for (int64_t j = i; s == KILN_OK && j < i + burst && j < o->steps; j++) {
            double c0 = kiln_cli_now();
            s = kiln_run_async(st->plan, bd, nb, stream);
            us[j] = (kiln_cli_now() - c0) * 1e6;
        }
        double w0 = kiln_cli_now();
        if (s == KILN_OK) s = burst_wait(st);
        wait += kiln_cli_now() - w0;
        dev += kiln_cli_now() - t0;
    }
    qsort(us, (size_t)o->steps, sizeof *us, cmp_d);
    res[0] = us[o->steps / 2], res[1] = us[o->steps * 9 / 10], res[2] = us[o->steps - 1];
    res[3] = dev * 1e3 / (double)o->steps;
    res[4] = wait * 1e6 / (double)o->steps;
    free(us);
    return s;
}

static void report_host(const serve_opts *o, const serve_state *st, const double r[5])
{
    bool vk = st->dbe == KILN_BACKEND_VULKAN;
    if (o->json) {
        printf("{\"preset\":\"%s\",\"mode\":\"serve\",\"host\":true,\"backend\":\"%s\",\"wtype\":\"%s\",\"layers\":%lld,"
               "\"kernels\":%d,\"seqs\":%lld,\"ctx\":%lld,\"steps\":%lld,\"burst\":%d,\"host_us_per_step_median\":%.3f,"
               "\"host_us_per_step_p90\":%.3f,\"host_us_per_step_max\":%.3f,\"wait_us_per_step\":%.3f,\"step_ms\":%.6f}\n",
               o->preset->name, kiln_plan_backend(st->plan), kiln_dtype_name(o->wtype), (long long)o->layers,
               kiln_plan_kernel_count(st->plan), (long long)o->seqs, (long long)o->ctx, (long long)o->steps,
               vk ? KILN_VK_MAX_PENDING : 16, r[0], r[1], r[2], r[4], r[3]);
        return;
    }
    printf("%s serve on %s, %lld layers (%d kernels, one recorded %s), %lld sequences at KV %lld, every binding "
           "device memory\n  kiln_run_async host time per step: median %.2f us, p90 %.2f, max %.2f (%lld steps, in bursts of %d); "
           "%s between bursts: %.2f us per step; device step %.3f ms\n",
           o->preset->name, kiln_plan_backend(st->plan), (long long)o->layers, kiln_plan_kernel_count(st->plan),
           vk ? "command buffer" : "CUDA graph", (long long)o->seqs, (long long)o->ctx, r[0], r[1], r[2], (long long)o->steps,
           vk ? KILN_VK_MAX_PENDING : 16, vk ? "kiln_plan_wait" : "sync", r[4], r[3]);
}

static void report(const serve_opts *o, const serve_state *st, double dec_ms, double mix_ms, const double sp[3], const char *prof)
{
    kiln_dtype kt = o->kv;
    double wb = (double)kiln_preset_layer_weight_bytes(o->preset, o->wtype), kvb = 0;
    for (int64_t q = 0; q < o->seqs; q++) kvb += (double)kiln_preset_layer_kv_bytes(o->preset, kt, st->len[q] + o->steps / 2 + 1);
    double per = dec_ms / (double)o->layers, gbps = per > 0 ? (wb + kvb) / (per * 1e-3) * 1e-9 : 0; /* 0: --only mixed */
    const char *be = kiln_plan_backend(st->plan);
    if (o->json) {
        printf("{\"preset\":\"%s\",\"mode\":\"serve\",\"backend\":\"%s\",\"wtype\":\"%s\",\"kvtype\":\"%s\",\"layers\":%lld,"
               "\"seqs\":%lld,\"ctx\":%lld,\"ragged\":%s,\"block\":%lld,\"pool_blocks\":%lld,\"steps\":%lld,\"io\":\"%s\","
               "\"decode_ms_per_layer\":%.6f,\"decode_bytes_per_layer\":%.0f,\"decode_gb_per_s\":%.4f,\"decode_tok_per_s\":%.1f,"
               "\"chunk\":%lld,\"mixed_ms_per_layer\":%.6f,\"mixed_matmul_ms_per_layer\":%.6f,\"mixed_attention_ms_per_layer\":%.6f,"
               "\"mixed_profiled_ms_per_layer\":%.6f%s%s}\n",
               o->preset->name, be, kiln_dtype_name(o->wtype), kiln_dtype_name(kt), (long long)o->layers, (long long)o->seqs,
               (long long)o->ctx, o->ragged ? "true" : "false", (long long)o->block, (long long)st->n_blocks, (long long)o->steps,
               st->dev ? "device" : "host", per, wb + kvb, gbps, dec_ms > 0 ? (double)o->seqs / (dec_ms * 1e-3) : 0, (long long)o->chunk,
               mix_ms / (double)o->layers, sp[0] * 1e3 / (double)o->layers, sp[1] * 1e3 / (double)o->layers,
               sp[2] * 1e3 / (double)o->layers, prof ? ",\"profile\":" : "", prof ? prof : "");
        return;
    }
    printf("%s serve on %s, %s weights, %s KV in blocks of %lld (pool %lld blocks, shuffled), %lld layers\n", o->preset->name, be,
           kiln_dtype_name(o->wtype), kiln_dtype_name(kt), (long long)o->block, (long long)st->n_blocks, (long long)o->layers);
    if (dec_ms > 0)
        printf("  decode: %lld sequences at KV %lld%s: median %.3f ms/layer-step, %.1f MB read per layer, %.2f GB/s, %.0f tok/s\n",
               (long long)o->seqs, (long long)o->ctx, o->ragged ? " (ragged: ctx/2..3ctx/2, same total)" : "", per,
               (wb + kvb) * 1e-6, gbps, (double)o->seqs / (dec_ms * 1e-3));
    if (o->chunk > 1 && mix_ms > 0)
        printf("  mixed: a %lld-token prefill chunk + %lld decoding: median %.3f ms/layer-step; profiled: matmul %.3f, attention "
               "%.3f of %.3f ms/layer\n",
               (long long)o->chunk, (long long)o->seqs - 1, mix_ms / (double)o->layers, sp[0] * 1e3 / (double)o->layers,
               sp[1] * 1e3 / (double)o->layers, sp[2] * 1e3 / (double)o->layers);
    if (prof) printf("\nper kernel of the decode steps, all %lld layers (measured = mean over %lld steps):\n%s", (long long)o->layers,
                     (long long)o->steps, prof);
}

/* --profile: the plan's per-kernel table (text or JSON) over `steps` profiled decode steps. */
static kiln_status decode_profile(const serve_opts *o, serve_state *st, char **out)
{
    kiln_plan_profile(st->plan, true);
    kiln_status s = KILN_OK;
    for (int64_t i = 0; s == KILN_OK && i < o->steps; i++) s = step(o, st, 1, i + 1);
    kiln_plan_profile(st->plan, false);
    return s == KILN_OK ? kiln_plan_explain(st->plan, o->json ? "json" : "text", out) : s;
}

int kiln_cli_bench_serve(int argc, char *const *argv)
{
    serve_opts o;
    int rc = parse(argc, argv, &o);
    if (rc != KILN_CLI_OK) return rc;
    serve_state st = {0};
    double dec = 0, mix = 0, sp[5] = {0, 0, 0, 0, 0};
    char *prof = NULL;
    rc = setup(&o, &st);
    kiln_status s = KILN_OK;
    if (rc == KILN_CLI_OK && o.host) {
        if (!st.dev) {
            fprintf(stderr, "kiln bench: --host measures kiln_run_async on cuda or vulkan, but the plan runs on %s\n",
                    kiln_plan_backend(st.plan));
            rc = KILN_CLI_FAIL;
        } else if ((s = host_timed(&o, &st, sp)) != KILN_OK) {
            rc = kiln_cli_fail("bench", st.ctx, s, "running a step");
        } else {
            report_host(&o, &st, sp);
        }
        o.chunk = 0, o.steps = 0; /* nothing more to time */
    }
    bool dec_on = o.steps && o.only != 'm', mix_on = o.chunk > 1 && o.only != 'd';
    if (rc == KILN_CLI_OK && dec_on) s = timed(&o, &st, 1, o.steps, &dec);
    if (rc == KILN_CLI_OK && s == KILN_OK && dec_on && o.profile) s = decode_profile(&o, &st, &prof);
    if (rc == KILN_CLI_OK && s == KILN_OK && mix_on) s = timed(&o, &st, o.chunk, o.steps / 2 + 1, &mix);
    if (rc == KILN_CLI_OK && s == KILN_OK && mix_on) s = split(&o, &st, 3, sp);
    if (rc == KILN_CLI_OK && s != KILN_OK) rc = kiln_cli_fail("bench", st.ctx, s, "running a step");
    if (rc == KILN_CLI_OK && !o.host) report(&o, &st, dec, mix, sp, prof);
    free(prof);
    for (int i = 0; i < 4; i++)
        if (st.dmeta[i]) kiln_backends[st.dbe]->free(st.ctx->be_state[st.dbe], st.dmeta[i]);
    if (st.dev) {
        kiln_backends[st.dbe]->free(st.ctx->be_state[st.dbe], st.dx);
        kiln_backends[st.dbe]->free(st.ctx->be_state[st.dbe], st.dy);
    }
    free(st.x), free(st.y), free(st.pos), free(st.slots), free(st.seqs), free(st.len), free(st.bt);
    kiln_plan_free(st.plan);
    kiln_ctx_free(st.ctx);
    return rc;
}
