/* Context: status texts, error text, backend probing at creation, backend listing.
 * Owns the backends' states; knows nothing of graphs or plans. */
#include "sched/ctx.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_text[KILN_STATUS_COUNT] = {
    [KILN_OK] = "ok",
    [KILN_ERR_INVALID_ARG] = "invalid argument",
    [KILN_ERR_SHAPE] = "shape mismatch",
    [KILN_ERR_DTYPE] = "unsupported dtype",
    [KILN_ERR_NODE] = "bad node id",
    [KILN_ERR_NAME] = "bad name",
    [KILN_ERR_SYMBOL] = "symbol unbound or out of bounds",
    [KILN_ERR_BINDING] = "bad binding",
    [KILN_ERR_PARSE] = "parse error",
    [KILN_ERR_IO] = "i/o error",
    [KILN_ERR_NOMEM] = "out of memory",
    [KILN_ERR_UNSUPPORTED] = "unsupported",
    [KILN_ERR_BACKEND] = "backend failure",
    [KILN_ERR_INTERNAL] = "internal error",
    [KILN_ERR_NONFINITE] = "non-finite value",
    [KILN_ERR_BUSY] = "busy",
};

KILN_API const char *kiln_status_str(kiln_status s)
{
    return (unsigned)s < KILN_STATUS_COUNT ? status_text[s] : "unknown status";
}

void kiln_ctx_set_error(kiln_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln_err_vset(kiln_err_of(ctx), KILN_OK, fmt, ap);
    va_end(ap);
}

kiln_status kiln_ctx_fail(kiln_ctx *ctx, kiln_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln_err_vset(kiln_err_of(ctx), s, fmt, ap);
    va_end(ap);
    return s;
}

static kiln_status ctx_new(const kiln_ctx_options *opts, int ordinal, kiln_ctx **out);

KILN_API kiln_status kiln_ctx_new(const kiln_ctx_options *opts, kiln_ctx **out) { return ctx_new(opts, -1, out); }

kiln_status kiln_ctx_new_device(const kiln_ctx *parent, int ordinal, kiln_ctx **out)
{
    kiln_ctx_options o = parent->opts;
    o.n_threads = 1;
    o.quiet = true;
    return ctx_new(&o, ordinal, out);
}

static kiln_status ctx_new(const kiln_ctx_options *opts, int ordinal, kiln_ctx **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (opts && (opts->n_threads < 0 || opts->n_threads > 1024)) return KILN_ERR_INVALID_ARG;
    kiln_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return KILN_ERR_NOMEM;
    kiln_err_init(&ctx->err);
    ctx->device_ordinal = ordinal;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    for (int i = 0; i < KILN_BACKEND_COUNT; i++) pthread_mutex_init(&ctx->be_mu[i], &ma);
    pthread_mutexattr_destroy(&ma);
    if (opts) ctx->opts = *opts;
    ctx->cache_dir = opts && opts->cache_dir ? strdup(opts->cache_dir) : kiln_cache_default_dir();
    ctx->opts.cache_dir = ctx->cache_dir;
    if (!ctx->cache_dir || !(ctx->cache = kiln_cache_new(ctx->cache_dir, false))) {
        free(ctx->cache_dir);
        for (int i = 0; i < KILN_BACKEND_COUNT; i++) pthread_mutex_destroy(&ctx->be_mu[i]);
        kiln_err_destroy(&ctx->err);
        free(ctx);
        return KILN_ERR_NOMEM;
    }
    for (int i = 0; i < KILN_BACKEND_COUNT; i++) {
        const kiln_backend_i *b = kiln_backends[i];
        kiln_status s = b->probe(ctx, &ctx->be_state[i], ctx->be_detail[i], sizeof ctx->be_detail[i]);
        ctx->be_ok[i] = s == KILN_OK;
        if (!ctx->be_ok[i]) ctx->be_state[i] = NULL;
        if (ctx->be_ok[i] && b->profile) {
            b->profile(ctx->be_state[i], &ctx->profile[i]);
            ctx->has_profile[i] = true;
        }
    }
    kiln_sched_load_cached_profiles(ctx);
    kiln_err_clear(&ctx->err);
    *out = ctx;
    return KILN_OK;
}

KILN_API void kiln_ctx_free(kiln_ctx *ctx)
{
    if (!ctx) return;
    kiln_cache_free(ctx->cache); /* compiled kernels go back to their backends first */
    for (int i = KILN_BACKEND_COUNT - 1; i >= 0; i--)
        if (ctx->be_ok[i]) kiln_backends[i]->release(ctx->be_state[i]);
    free(ctx->cache_dir);
    for (int i = 0; i < KILN_BACKEND_COUNT; i++) pthread_mutex_destroy(&ctx->be_mu[i]);
    kiln_err_destroy(&ctx->err);
    free(ctx);
}

KILN_API const char *kiln_ctx_error(const kiln_ctx *ctx)
{
    return ctx ? kiln_err_text((kiln_err *)&ctx->err) : "context is NULL"; /* the sink's lock is not state */
}

KILN_API int kiln_backend_count(const kiln_ctx *ctx) { return ctx ? KILN_BACKEND_COUNT : 0; }

KILN_API kiln_status kiln_backend_get(const kiln_ctx *ctx, int i, kiln_backend_info *out)
{
    if (!ctx || !out || i < 0 || i >= KILN_BACKEND_COUNT) return KILN_ERR_INVALID_ARG;
    out->name = kiln_backends[i]->name;
    out->available = ctx->be_ok[i];
    out->detail = ctx->be_detail[i];
    return KILN_OK;
}
