/* Device profiles: defaults from each backend, the calibration file in the cache dir
 * (profiles.json, written by kiln_calibrate), and JSON overrides for cost-model experiments.
 * JSON is read with libyaml (JSON is YAML). Also kiln_pin. Must not run kernels itself. */
#include "sched/ctx.h"
#include "sched/group.h"
#include "cache/cache.h"
#include "graph/graph.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

static int backend_index(const char *name)
{
    for (int i = 0; name && i < KILN_BACKEND_COUNT; i++)
        if (strcmp(name, kiln_backends[i]->name) == 0) return i;
    return -1;
}

KILN_API kiln_status kiln_ctx_profile(const kiln_ctx *ctx, const char *backend, kiln_device_profile *out)
{
    if (!ctx || !out) return KILN_ERR_INVALID_ARG;
    int b = backend_index(backend);
    if (b < 0) return kiln_ctx_fail((kiln_ctx *)ctx, KILN_ERR_INVALID_ARG, "unknown backend '%s'", backend ? backend : "(null)");
    if (!ctx->has_profile[b]) return kiln_ctx_fail((kiln_ctx *)ctx, KILN_ERR_UNSUPPORTED, "backend '%s' has no profile", backend);
    *out = ctx->profile[b];
    return KILN_OK;
}

KILN_API kiln_status kiln_ctx_set_profile(kiln_ctx *ctx, const char *backend, const kiln_device_profile *p)
{
    if (!ctx || !p) return KILN_ERR_INVALID_ARG;
    int b = backend_index(backend);
    if (b < 0) return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "unknown backend '%s'", backend ? backend : "(null)");
    if (!(p->mem_bw > 0)) return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "profile of '%s': mem_bw must be > 0", backend);
    ctx->profile[b] = *p;
    ctx->has_profile[b] = true;
    return KILN_OK;
}

/* ------------------------------------------------------------------ JSON via libyaml */

typedef struct jreader {
    yaml_parser_t p;       /* libyaml parser */
    yaml_event_t  ev;      /* current event */
    const char   *path;    /* file name for messages */
    kiln_ctx     *ctx;     /* error sink */
} jreader;

static bool next(jreader *r)
{
    yaml_event_delete(&r->ev);
    if (!yaml_parser_parse(&r->p, &r->ev)) {
        kiln_ctx_fail(r->ctx, KILN_ERR_PARSE, "%s:%zu:%zu: %s", r->path, r->p.problem_mark.line + 1,
                      r->p.problem_mark.column + 1, r->p.problem ? r->p.problem : "syntax error");
        return false;
    }
    return true;
}

static bool bad(jreader *r, const char *what)
{
    kiln_ctx_fail(r->ctx, KILN_ERR_PARSE, "%s:%zu:%zu: %s", r->path, r->ev.start_mark.line + 1,
                  r->ev.start_mark.column + 1, what);
    return false;
}

static bool number(jreader *r, double *out)
{
    if (!next(r)) return false;
    if (r->ev.type != YAML_SCALAR_EVENT) return bad(r, "expected a number");
    char *end;
    errno = 0;
    double v = strtod((const char *)r->ev.data.scalar.value, &end);
    if (errno || *end || end == (char *)r->ev.data.scalar.value || !(v >= 0)) return bad(r, "expected a number >= 0");
    *out = v;
    return true;
}

static bool key(jreader *r, bool *end)
{
    if (!next(r)) return false;
    *end = r->ev.type == YAML_MAPPING_END_EVENT;
    if (*end) return true;
    if (r->ev.type != YAML_SCALAR_EVENT) return bad(r, "expected a key");
    return true;
}

static bool peak_map(jreader *r, kiln_device_profile *p)
{
    if (!next(r)) return false;
    if (r->ev.type != YAML_MAPPING_START_EVENT) return bad(r, "peak_flops: expected an object of dtype: FLOP/s");
    for (bool end = false;;) {
        if (!key(r, &end)) return false;
        if (end) return true;
        kiln_dtype t;
        if (!kiln_dtype_parse((const char *)r->ev.data.scalar.value, &t)) return bad(r, "unknown dtype in peak_flops");
        if (!number(r, &p->peak_flops[t])) return false;
    }
}

static bool profile_obj(jreader *r, kiln_device_profile *p)
{
    if (!next(r)) return false;
    if (r->ev.type != YAML_MAPPING_START_EVENT) return bad(r, "expected an object of profile fields");
    for (bool end = false;;) {
        if (!key(r, &end)) return false;
        if (end) return true;
        const char *k = (const char *)r->ev.data.scalar.value;
        double *f = !strcmp(k, "mem_bw") ? &p->mem_bw : !strcmp(k, "launch_s") ? &p->launch_s
                  : !strcmp(k, "h2d_bw") ? &p->h2d_bw : !strcmp(k, "d2h_bw") ? &p->d2h_bw
                  : !strcmp(k, "xfer_latency_s") ? &p->xfer_latency_s : !strcmp(k, "link_bw") ? &p->link_bw
                  : !strcmp(k, "link_latency_s") ? &p->link_latency_s : NULL;
        if (!strcmp(k, "peak_flops")) {
            if (!peak_map(r, p)) return false;
        } else if (!f) {
            char msg[200];
            snprintf(msg, sizeof msg, "unknown profile field '%.80s' (mem_bw, peak_flops, launch_s, h2d_bw, d2h_bw, xfer_latency_s, link_bw, link_latency_s)", k);
            return bad(r, msg);
        } else if (!number(r, f)) {
            return false;
        }
    }
}

/* Reads {"backend": {fields}} from f into a copy of the profiles; applies them only when all is well. */
static kiln_status read_profiles(kiln_ctx *ctx, FILE *f, const char *path)
{
    jreader r = {.path = path, .ctx = ctx};
    kiln_device_profile prof[KILN_BACKEND_COUNT];
    bool has[KILN_BACKEND_COUNT];
    memcpy(prof, ctx->profile, sizeof prof);
    memcpy(has, ctx->has_profile, sizeof has);
    yaml_parser_initialize(&r.p);
    yaml_parser_set_input_file(&r.p, f);
    memset(&r.ev, 0, sizeof r.ev);
    bool ok = next(&r) && next(&r) && next(&r); /* stream start, document start, mapping start */
    if (ok && r.ev.type != YAML_MAPPING_START_EVENT) ok = bad(&r, "expected an object {\"backend\": {...}}");
    for (bool end = false; ok;) {
        if (!(ok = key(&r, &end)) || end) break;
        int b = backend_index((const char *)r.ev.data.scalar.value);
        if (b < 0) {
            ok = bad(&r, "unknown backend name (ref, cpu, cuda, vulkan)");
            break;
        }
        ok = profile_obj(&r, &prof[b]);
        has[b] = true;
    }
    yaml_event_delete(&r.ev);
    yaml_parser_delete(&r.p);
    if (!ok) return KILN_ERR_PARSE;
    memcpy(ctx->profile, prof, sizeof prof);
    memcpy(ctx->has_profile, has, sizeof has);
    return KILN_OK;
}

KILN_API kiln_status kiln_ctx_load_profile(kiln_ctx *ctx, const char *path)
{
    if (!ctx || !path) return KILN_ERR_INVALID_ARG;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_ctx_fail(ctx, KILN_ERR_IO, "cannot open profile '%s': %s", path, strerror(errno));
    kiln_status s = read_profiles(ctx, f, path);
    fclose(f);
    return s;
}

static void cache_path(const kiln_ctx *ctx, char *buf, size_t n)
{
    snprintf(buf, n, "%s/profiles.json", ctx->cache_dir);
}

void kiln_sched_load_cached_profiles(kiln_ctx *ctx)
{
    char path[4200];
    cache_path(ctx, path, sizeof path);
    int fd = kiln_cache_open_file(path, O_RDONLY, 0); /* a FIFO or symlink planted there is ignored */
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return;
    }
    char *saved = strdup(kiln_ctx_error(ctx));
    read_profiles(ctx, f, path); /* a corrupt file keeps the defaults */
    if (saved) kiln_ctx_set_error(ctx, "%s", saved);
    free(saved);
    fclose(f);
}

static void write_profile(FILE *f, const char *name, const kiln_device_profile *p, bool comma)
{
    fprintf(f, "  \"%s\": {\"mem_bw\": %.6g, \"launch_s\": %.6g, \"h2d_bw\": %.6g, \"d2h_bw\": %.6g, "
               "\"xfer_latency_s\": %.6g, \"link_bw\": %.6g, \"link_latency_s\": %.6g, \"peak_flops\": {", name, p->mem_bw,
            p->launch_s, p->h2d_bw, p->d2h_bw, p->xfer_latency_s, p->link_bw, p->link_latency_s);
    for (int t = 0; t < KILN_DTYPE_COUNT; t++)
        fprintf(f, "%s\"%s\": %.6g", t ? ", " : "", kiln_dtype_name((kiln_dtype)t), p->peak_flops[t]);
    fprintf(f, "}}%s\n", comma ? "," : "");
}

static int mkdirs(const char *dir)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *q = tmp + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            mkdir(tmp, 0755);
            *q = '/';
        }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

KILN_API kiln_status kiln_calibrate(kiln_ctx *ctx, bool save)
{
    if (!ctx) return KILN_ERR_INVALID_ARG;
    for (int b = 0; b < KILN_BACKEND_COUNT; b++) {
        const kiln_backend_i *bi = kiln_backends[b];
        if (!ctx->be_ok[b] || !bi->calibrate) continue;
        if (!ctx->opts.quiet) fprintf(stderr, "kiln: calibrating %s...\n", bi->name);
        kiln_device_profile p;
        kiln_status s = bi->calibrate(ctx->be_state[b], &p);
        if (s != KILN_OK) return kiln_ctx_fail(ctx, s, "calibrating %s failed", bi->name);
        ctx->profile[b] = p;
        ctx->has_profile[b] = true;
    }
    if (ctx->has_profile[KILN_BACKEND_CUDA]) { /* split plans' links: skipped (defaults kept) without NCCL or GPUs */
        char why[512] = "";
        if (!ctx->opts.quiet) fprintf(stderr, "kiln: calibrating the multi-GPU all-reduce...\n");
        kiln_status s = kiln_sched_calibrate_link(ctx, &ctx->profile[KILN_BACKEND_CUDA], why, sizeof why);
        if (s != KILN_OK && s != KILN_ERR_UNSUPPORTED) return kiln_ctx_fail(ctx, s, "calibrating the multi-GPU all-reduce: %s", why);
    }
    if (!save) return KILN_OK;
    char path[4200], tmp[4300];
    cache_path(ctx, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (mkdirs(ctx->cache_dir) != 0)
        return kiln_ctx_fail(ctx, KILN_ERR_IO, "cannot create cache dir '%s': %s", ctx->cache_dir, strerror(errno));
    unlink(tmp); /* a leftover of a killed process with this pid; never written through */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0) close(fd);
        return kiln_ctx_fail(ctx, KILN_ERR_IO, "cannot write '%s': %s", tmp, strerror(e));
    }
    int last = -1;
    for (int b = 0; b < KILN_BACKEND_COUNT; b++)
        if (ctx->has_profile[b]) last = b;
    fprintf(f, "{\n");
    for (int b = 0; b < KILN_BACKEND_COUNT; b++)
        if (ctx->has_profile[b]) write_profile(f, kiln_backends[b]->name, &ctx->profile[b], b != last);
    fprintf(f, "}\n");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return kiln_ctx_fail(ctx, KILN_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    }
    return KILN_OK;
}

KILN_API kiln_status kiln_pin(kiln_graph *g, kiln_node x, const char *backend)
{
    if (!g) return KILN_ERR_INVALID_ARG;
    if (g->status != KILN_OK) return g->status;
    uint32_t idx;
    if (!kiln_graph_resolve(g, "pin", "x", x, &idx)) return g->status;
    int b = backend ? backend_index(backend) : -1;
    if (backend && b < 0) {
        kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "pin: unknown backend '%s' (ref, cpu, cuda, vulkan)", backend);
        return g->status;
    }
    g->nodes[idx].pin = (uint8_t)(b + 1);
    return KILN_OK;
}
