/* The CUDA backend's table: probe (driver, device, primary context, one non-blocking stream),
 * device memory and copies on that stream, recording launches into a CUDA graph by stream capture
 * and replaying it, device timers from events. Every driver result goes through kiln_cuda_fail;
 * after a sticky error every entry fails fast. Must not print or exit: errors go back in err. */
#include "util/env.h"
#include "backends/cuda/cuda.h"
#include "codegen/kir.h"
#include "sched/ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* want >= 0: that device (a split plan's part), else $KILN_CUDA_DEVICE or 0. */
static kiln_status open_device(kiln_cuda *c, int want, char *detail, size_t n)
{
    char err[512];
    int count = 0, major = 0, minor = 0, version = 0;
    CUresult r = c->d.init(0);
    if (r == KILN_CU_ERROR_NO_DEVICE || (r == KILN_CU_SUCCESS && c->d.device_count(&count) == KILN_CU_SUCCESS && count == 0)) {
        snprintf(detail, n, "NVIDIA driver present but no CUDA device (cuInit: no CUDA-capable device is detected)");
        return KILN_ERR_UNSUPPORTED;
    }
    if (r != KILN_CU_SUCCESS) {
        kiln_cuda_fail(c, r, "cuInit", err, sizeof err);
        snprintf(detail, n, "%s", err);
        return KILN_ERR_UNSUPPORTED;
    }
    const char *env = kiln_env(KILN_ENV_CUDA_DEVICE);
    int ordinal = want >= 0 ? want : env ? atoi(env) : 0; /* a split plan's part: its GPU */
    if (ordinal < 0 || ordinal >= count) {
        if (want >= 0) snprintf(detail, n, "CUDA device %d asked for but there are %d", ordinal, count);
        else snprintf(detail, n, "KILN_CUDA_DEVICE=%d but there are %d CUDA devices", ordinal, count);
        return KILN_ERR_UNSUPPORTED;
    }
    c->d.driver_version(&version);
#define TRY(call, what)                                                      \
    if ((r = c->d.call) != KILN_CU_SUCCESS) {                                \
        kiln_cuda_fail(c, r, what, err, sizeof err);                         \
        snprintf(detail, n, "%s", err);                                      \
        return KILN_ERR_UNSUPPORTED;                                         \
    }
    TRY(device_get(&c->dev, ordinal), "cuDeviceGet");
    TRY(device_name(c->name, sizeof c->name, c->dev), "cuDeviceGetName");
    TRY(device_attr(&major, KILN_CU_ATTR_CC_MAJOR, c->dev), "cuDeviceGetAttribute");
    TRY(device_attr(&minor, KILN_CU_ATTR_CC_MINOR, c->dev), "cuDeviceGetAttribute");
    TRY(device_attr(&c->n_sm, KILN_CU_ATTR_SM_COUNT, c->dev), "cuDeviceGetAttribute");
    TRY(device_total_mem(&c->mem_total, c->dev), "cuDeviceTotalMem");
    /* optional: only the default profile uses them */
    if (c->d.device_attr(&c->clock_khz, KILN_CU_ATTR_CLOCK_RATE, c->dev) != KILN_CU_SUCCESS) c->clock_khz = 0;
    if (c->d.device_attr(&c->mem_khz, KILN_CU_ATTR_MEMORY_CLOCK_RATE, c->dev) != KILN_CU_SUCCESS) c->mem_khz = 0;
    if (c->d.device_attr(&c->bus_bits, KILN_CU_ATTR_MEMORY_BUS_WIDTH, c->dev) != KILN_CU_SUCCESS) c->bus_bits = 0;
    c->sm = major * 10 + minor;
    c->ptx_sm = c->sm > 90 ? 90 : c->sm;
    if (c->sm < 80) {
        snprintf(detail, n, "%s is sm_%d; kiln's PTX needs sm_80 or newer", c->name, c->sm);
        return KILN_ERR_UNSUPPORTED;
    }
    c->target = kiln_lower_target_for_sm(c->ptx_sm); /* the numbers the templates were tuned with, and this SM count */
    if (c->n_sm > 0) c->target.sm_count = (uint32_t)c->n_sm;
    if (!c->d.tmap_encode || !c->d.func_set_attr) c->target.wgmma = false; /* its GEMM needs TMA and > 48 KB of shared memory */
    TRY(primary_retain(&c->ctx, c->dev), "cuDevicePrimaryCtxRetain");
    TRY(ctx_set_current(c->ctx), "cuCtxSetCurrent");
    TRY(stream_create(&c->stream, KILN_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
#undef TRY
    snprintf(detail, n, "%s, sm_%d, %d SMs, %.1f GiB, driver %d.%d", c->name, c->sm, c->n_sm,
             c->mem_total / 1073741824.0, version / 1000, version % 1000 / 10);
    return KILN_OK;
}

static void cuda_release(void *state)
{
    kiln_cuda *c = state;
    if (!c) return;
    if (c->ctx) {
        c->d.ctx_set_current(c->ctx);
        kiln_cuda_pool_destroy(c);
        for (int i = 0; i < c->n_timers; i++)
            if (c->timers[i]) c->d.event_destroy(c->timers[i]);
        for (int i = 0; i < 2; i++) {
            if (c->join[i]) c->d.event_destroy(c->join[i]);
            if (c->side_ev[i]) c->d.event_destroy(c->side_ev[i]);
        }
        if (c->side) c->d.stream_destroy(c->side);
        if (c->stream) c->d.stream_destroy(c->stream);
        c->d.primary_release(c->dev);
    }
    free(c->timers);
    kiln_lower_memo_clear(&c->memo);
    kiln_cuda_unload(&c->d);
    free(c);
}

static kiln_status cuda_probe(kiln_ctx *ctx, void **state, char *detail, size_t n)
{
    *state = NULL;
    kiln_cuda *c = calloc(1, sizeof *c);
    if (!c) return KILN_ERR_NOMEM;
    if (!kiln_cuda_load(&c->d, detail, n)) {
        free(c);
        return KILN_ERR_UNSUPPORTED;
    }
    kiln_status s = open_device(c, ctx->device_ordinal, detail, n);
    if (s != KILN_OK) {
        cuda_release(c);
        return s;
    }
    *state = c;
    return KILN_OK;
}

static void cuda_profile(void *state, kiln_device_profile *out) { kiln_cuda_profile_defaults(state, out); }

static kiln_status cuda_calibrate(void *state, kiln_device_profile *out)
{
    char err[512];
    return kiln_cuda_measure(state, out, err, sizeof err);
}

/* ------------------------------------------------------------------ memory and copies */

static kiln_status cuda_alloc(void *state, size_t bytes, void **out, char *err, size_t n)
{
    kiln_cuda *c = state;
    *out = NULL;
    kiln_status s = kiln_cuda_enter(c, err, n);
    CUdeviceptr p = 0;
    if (s == KILN_OK) s = kiln_cuda_alloc(c, bytes, &p, err, n);
    *out = (void *)(uintptr_t)p;
    return s;
}

static bool cuda_mem_info(void *state, uint64_t *free_bytes, uint64_t *total_bytes)
{
    kiln_cuda *c = state;
    size_t f = 0, t = 0;
    if (c->dead || !c->d.mem_info || c->d.ctx_set_current(c->ctx) != KILN_CU_SUCCESS || c->d.mem_info(&f, &t) != KILN_CU_SUCCESS)
        return false;
    *free_bytes = f, *total_bytes = t;
    return true;
}

static void cuda_free(void *state, void *buf)
{
    kiln_cuda *c = state;
    if (!c->dead) c->d.ctx_set_current(c->ctx);
    kiln_cuda_free(c, (CUdeviceptr)(uintptr_t)buf);
}

static kiln_status copy_check(kiln_cuda *c, CUresult r, const char *dir, size_t bytes, char *err, size_t n)
{
    if (r == KILN_CU_SUCCESS) return KILN_OK;
    char what[96];
    snprintf(what, sizeof what, "%s of %zu bytes", dir, bytes);
    return kiln_cuda_fail(c, r, what, err, n);
}

static kiln_status cuda_upload(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK || !bytes) return s;
    return copy_check(c, c->d.htod((CUdeviceptr)(uintptr_t)dst, src, bytes, c->stream), "cuMemcpyHtoDAsync", bytes, err, n);
}

static kiln_status cuda_download(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK || !bytes) return s;
    return copy_check(c, c->d.dtoh(dst, (CUdeviceptr)(uintptr_t)src, bytes, c->stream), "cuMemcpyDtoHAsync", bytes, err, n);
}

static kiln_status cuda_copy(void *state, void *dst, const void *src, size_t bytes, char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK || !bytes) return s;
    return copy_check(c, c->d.dtod((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, c->stream),
                      "cuMemcpyDtoDAsync", bytes, err, n);
}

static kiln_status cuda_sync(void *state, char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    /* kernel faults surface here: name the last step the stream ran */
    KILN_CUDA_TRY(c, stream_sync(c->stream), "cuStreamSynchronize (a kernel or copy since the last sync failed)", err, n);
    return KILN_OK;
}

/* ------------------------------------------------------------------ recording */

static kiln_status cuda_record_begin(void *state, char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    if (c->capturing) {
        snprintf(err, n, "record_begin while a recording is open");
        return KILN_ERR_INTERNAL;
    }
    KILN_CUDA_TRY(c, capture_begin(c->stream, KILN_CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture", err, n);
    c->capturing = true;
    c->pdl_captured = 0;
    return KILN_OK;
}

static kiln_status cuda_record_end(void *state, void **rec, char *err, size_t n)
{
    kiln_cuda *c = state;
    *rec = NULL;
    if (!c->capturing) {
        snprintf(err, n, "record_end without record_begin");
        return KILN_ERR_INTERNAL;
    }
    c->capturing = false;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    /* end the capture even when a launch inside it failed, so the stream is usable again */
    CUresult r = c->d.capture_end(c->stream, &graph);
    const char *what = "cuStreamEndCapture";
    if (r == KILN_CU_SUCCESS) {
        what = "cuGraphInstantiateWithFlags";
        r = c->d.graph_instantiate(&exec, graph, 0);
        c->d.graph_destroy(graph); /* the executable graph does not need it */
    }
    if (r != KILN_CU_SUCCESS && c->pdl_captured && !kiln_cuda_sticky(r)) {
        /* the driver would not record programmatic edges: plain launches from the next recording on */
        kiln_cuda_pdl_refused(c, r, what);
        char text[256];
        kiln_cuda_fail(c, r, what, text, sizeof text);
        snprintf(err, n, "%s (with %d programmatic launches captured: they are off now, the next run records plain launches)", text,
                 c->pdl_captured);
        return KILN_ERR_BACKEND;
    }
    if (r != KILN_CU_SUCCESS) return kiln_cuda_fail(c, r, what, err, n);
    *rec = exec;
    return KILN_OK;
}

static kiln_status cuda_replay(void *state, void *rec, char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    KILN_CUDA_TRY(c, graph_launch((CUgraphExec)rec, c->stream), "cuGraphLaunch", err, n);
    return KILN_OK;
}

static void cuda_record_free(void *state, void *rec)
{
    kiln_cuda *c = state;
    if (!rec || c->dead || c->d.ctx_set_current(c->ctx) != KILN_CU_SUCCESS) return;
    c->d.graph_exec_destroy((CUgraphExec)rec);
}

/* ------------------------------------------------------------------ timers */

static kiln_status timer_slot(kiln_cuda *c, int slot, char *err, size_t n)
{
    if (slot < 0 || slot > 1 << 20) {
        snprintf(err, n, "timer slot %d out of range", slot);
        return KILN_ERR_INVALID_ARG;
    }
    if (slot >= c->n_timers) {
        int cap = c->n_timers ? c->n_timers : 64;
        while (cap <= slot) cap *= 2;
        CUevent *grown = realloc(c->timers, (size_t)cap * sizeof *grown);
        if (!grown) return KILN_ERR_NOMEM;
        memset(grown + c->n_timers, 0, (size_t)(cap - c->n_timers) * sizeof *grown);
        c->timers = grown;
        c->n_timers = cap;
    }
    if (!c->timers[slot]) KILN_CUDA_TRY(c, event_create(&c->timers[slot], 0), "cuEventCreate", err, n);
    return KILN_OK;
}

static kiln_status cuda_timer_mark(void *state, int slot, char *err, size_t n)
{
    kiln_cuda *c = state;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s == KILN_OK) s = timer_slot(c, slot, err, n);
    if (s != KILN_OK) return s;
    KILN_CUDA_TRY(c, event_record(c->timers[slot], c->stream), "cuEventRecord", err, n);
    return KILN_OK;
}

static kiln_status cuda_timer_read(void *state, int a, int b, double *seconds, char *err, size_t n)
{
    kiln_cuda *c = state;
    *seconds = 0;
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    if (a < 0 || b < 0 || a >= c->n_timers || b >= c->n_timers || !c->timers[a] || !c->timers[b]) {
        snprintf(err, n, "timer slots %d and %d were not both marked", a, b);
        return KILN_ERR_INVALID_ARG;
    }
    float ms = 0;
    KILN_CUDA_TRY(c, event_sync(c->timers[b]), "cuEventSynchronize", err, n);
    KILN_CUDA_TRY(c, event_elapsed(&ms, c->timers[a], c->timers[b]), "cuEventElapsedTime", err, n);
    *seconds = ms * 1e-3;
    return KILN_OK;
}

/* ------------------------------------------------------------------ caller streams */

/* One direction of a join: `to` waits for what was enqueued on `from` so far (an event, no host wait). */
static kiln_status join(kiln_cuda *c, int e, CUstream from, CUstream to, char *err, size_t n)
{
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    if (!c->join[e]) KILN_CUDA_TRY(c, event_create(&c->join[e], 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate", err, n);
    KILN_CUDA_TRY(c, event_record(c->join[e], from), "cuEventRecord", err, n);
    KILN_CUDA_TRY(c, stream_wait_event(to, c->join[e], 0), "cuStreamWaitEvent", err, n);
    return KILN_OK;
}

static kiln_status cuda_join_wait(void *state, void *q, char *err, size_t n)
{
    kiln_cuda *c = state;
    return join(c, 0, (CUstream)q, c->stream, err, n);
}

static kiln_status cuda_join_signal(void *state, void *q, const void *owner, char *err, size_t n)
{
    (void)owner;
    kiln_cuda *c = state;
    return join(c, 1, c->stream, (CUstream)q, err, n);
}

const kiln_backend_i kiln_backend_cuda = {
    .name = "cuda",
    .probe = cuda_probe,
    .release = cuda_release,
    .supports = kiln_cuda_supports,
    .profile = cuda_profile,
    .calibrate = cuda_calibrate,
    .compile = kiln_cuda_compile,
    .kernel_free = kiln_cuda_kernel_free,
    .identity = kiln_cuda_identity,
    .kernel_save = kiln_cuda_kernel_save,
    .kernel_load = kiln_cuda_kernel_load,
    .weight_bytes = kiln_lower_weight_dev_bytes,
    .weight_repack = kiln_lower_weight_dev_repack,
    .launch = kiln_cuda_launch,
    .alloc = cuda_alloc,
    .mem_info = cuda_mem_info,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .active = kiln_cuda_active,
    .record_begin = cuda_record_begin,
    .record_end = cuda_record_end,
    .replay = cuda_replay,
    .record_free = cuda_record_free,
    .timer_mark = cuda_timer_mark,
    .timer_read = cuda_timer_read,
    .join_wait = cuda_join_wait,
    .join_signal = cuda_join_signal,
    .coll_probe = kiln_cuda_coll_probe,
    .coll_init = kiln_cuda_coll_init,
    .all_reduce = kiln_cuda_all_reduce,
    .all_gather = kiln_cuda_all_gather,
    .coll_free = kiln_cuda_coll_free,
};
