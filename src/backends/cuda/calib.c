/* The CUDA device profile for the cost model: defaults from the device's attributes (H100-like
 * numbers when an attribute is missing), and measurements for `kiln calibrate`: device copy
 * bandwidth (256 MiB device-to-device), the cost of one launch of an empty kernel replayed from a
 * CUDA graph, and host <-> device bandwidth and latency. Must not keep anything it allocates. */
#include "backends/cuda/cuda.h"
#include "ptx/ptx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void kiln_cuda_profile_defaults(const kiln_cuda *c, kiln_device_profile *out)
{
    double bw = 3.0e12, f32 = 60e12;
    if (c && c->mem_khz > 0 && c->bus_bits > 0) bw = 0.9 * 2.0 * c->mem_khz * 1e3 * c->bus_bits / 8; /* DDR, ~90% reachable */
    if (c && c->clock_khz > 0 && c->n_sm > 0) f32 = 0.9 * c->n_sm * 128.0 * 2.0 * c->clock_khz * 1e3;
    /* link: NCCL all-reduce over NVLink between two H100/H200s, about 150 GB/s bus bandwidth at
     * megabytes and 6-25 us for a token's 8 KB (../shared/notes/gpu-anchors.md section 5) */
    *out = (kiln_device_profile){.mem_bw = bw, .launch_s = 3e-6, .h2d_bw = 25e9, .d2h_bw = 25e9, .xfer_latency_s = 10e-6,
                                 .link_bw = 150e9, .link_latency_s = 10e-6};
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) out->peak_flops[t] = f32;
    /* f16/bf16 weights can use the tensor cores (about 700 TFLOP/s dense on an H100 SXM) */
    out->peak_flops[KILN_DTYPE_F16] = out->peak_flops[KILN_DTYPE_BF16] = f32 * (700.0 / 60.0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Device seconds of `reps` device-to-device copies of `bytes`. */
static kiln_status time_copies(kiln_cuda *c, CUdeviceptr dst, CUdeviceptr src, size_t bytes, int reps, CUevent e0,
                               CUevent e1, double *secs, char *err, size_t n)
{
    float ms = 0;
    KILN_CUDA_TRY(c, dtod(dst, src, bytes, c->stream), "cuMemcpyDtoDAsync", err, n); /* warm up */
    KILN_CUDA_TRY(c, event_record(e0, c->stream), "cuEventRecord", err, n);
    for (int i = 0; i < reps; i++) KILN_CUDA_TRY(c, dtod(dst, src, bytes, c->stream), "cuMemcpyDtoDAsync", err, n);
    KILN_CUDA_TRY(c, event_record(e1, c->stream), "cuEventRecord", err, n);
    KILN_CUDA_TRY(c, event_sync(e1), "cuEventSynchronize", err, n);
    KILN_CUDA_TRY(c, event_elapsed(&ms, e0, e1), "cuEventElapsedTime", err, n);
    *secs = ms * 1e-3;
    return KILN_OK;
}

/* Device seconds per launch of an empty kernel: 100 launches captured into a graph and replayed
 * (how the executor runs plans). */
static kiln_status time_launch(kiln_cuda *c, CUevent e0, CUevent e1, double *secs, char *err, size_t n)
{
    kiln_kir k;
    kiln_kir_init(&k, "kiln_empty", 32);
    char *ptx = NULL;
    kiln_status s = kiln_ptx_print(&k, c->ptx_sm, &ptx, err, n);
    kiln_kir_free(&k);
    if (s != KILN_OK) return s;
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    s = kiln_cuda_load_ptx(c, ptx, "kiln_empty", &mod, &fn, NULL, err, n);
    free(ptx);
    if (s != KILN_OK) return s;
    CUdeviceptr dummy = 0;
    void *args[] = {&dummy};
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CUresult r = c->d.capture_begin(c->stream, KILN_CU_STREAM_CAPTURE_MODE_RELAXED);
    for (int i = 0; r == KILN_CU_SUCCESS && i < 100; i++) r = c->d.launch(fn, 1, 1, 1, 32, 1, 1, 0, c->stream, args, NULL);
    CUresult re = c->d.capture_end(c->stream, &graph);
    if (r == KILN_CU_SUCCESS) r = re;
    if (r == KILN_CU_SUCCESS) r = c->d.graph_instantiate(&exec, graph, 0);
    if (r == KILN_CU_SUCCESS) r = c->d.graph_launch(exec, c->stream); /* warm up */
    if (r == KILN_CU_SUCCESS) r = c->d.event_record(e0, c->stream);
    for (int i = 0; r == KILN_CU_SUCCESS && i < 10; i++) r = c->d.graph_launch(exec, c->stream);
    if (r == KILN_CU_SUCCESS) r = c->d.event_record(e1, c->stream);
    if (r == KILN_CU_SUCCESS) r = c->d.event_sync(e1);
    float ms = 0;
    if (r == KILN_CU_SUCCESS) r = c->d.event_elapsed(&ms, e0, e1);
    if (exec) c->d.graph_exec_destroy(exec);
    if (graph) c->d.graph_destroy(graph);
    c->d.module_unload(mod);
    if (r != KILN_CU_SUCCESS) return kiln_cuda_fail(c, r, "timing empty kernel launches", err, n);
    *secs = ms * 1e-3 / 1000;
    return KILN_OK;
}

/* Host seconds of one copy of `bytes` in direction up (host -> device) or down, synchronized. */
static kiln_status time_host_copy(kiln_cuda *c, bool up, CUdeviceptr dev, void *host, size_t bytes, double *secs,
                                  char *err, size_t n)
{
    double best = 1e30;
    for (int i = 0; i < 3; i++) {
        double t0 = now_s();
        CUresult r = up ? c->d.htod(dev, host, bytes, c->stream) : c->d.dtoh(host, dev, bytes, c->stream);
        if (r == KILN_CU_SUCCESS) r = c->d.stream_sync(c->stream);
        if (r != KILN_CU_SUCCESS) return kiln_cuda_fail(c, r, up ? "timing cuMemcpyHtoDAsync" : "timing cuMemcpyDtoHAsync", err, n);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    *secs = best;
    return KILN_OK;
}

kiln_status kiln_cuda_measure(kiln_cuda *c, kiln_device_profile *out, char *err, size_t n)
{
    kiln_cuda_profile_defaults(c, out);
    kiln_status s = kiln_cuda_enter(c, err, n);
    if (s != KILN_OK) return s;
    CUevent e0 = NULL, e1 = NULL;
    CUdeviceptr a = 0, b = 0;
    size_t bytes = 256u << 20;
    void *host = NULL;
    KILN_CUDA_TRY(c, event_create(&e0, 0), "cuEventCreate", err, n);
    if (c->d.event_create(&e1, 0) != KILN_CU_SUCCESS) e1 = NULL;
    while ((s = kiln_cuda_alloc(c, bytes, &a, err, n)) == KILN_ERR_NOMEM && bytes > (16u << 20)) bytes /= 4;
    if (s == KILN_OK) s = kiln_cuda_alloc(c, bytes, &b, err, n);
    double t = 0;
    if (s == KILN_OK && !e1) s = KILN_ERR_BACKEND;
    if (s == KILN_OK) s = time_copies(c, b, a, bytes, 5, e0, e1, &t, err, n);
    if (s == KILN_OK && t > 0) out->mem_bw = 2.0 * bytes * 5 / t; /* each copy reads and writes `bytes` */
    if (s == KILN_OK) s = time_launch(c, e0, e1, &t, err, n);
    if (s == KILN_OK && t > 0) out->launch_s = t;
    size_t hbytes = 64u << 20;
    if (s == KILN_OK && !(host = malloc(hbytes))) s = KILN_ERR_NOMEM;
    if (s == KILN_OK) {
        memset(host, 1, hbytes);
        s = time_host_copy(c, true, a, host, hbytes, &t, err, n);
        if (s == KILN_OK && t > 0) out->h2d_bw = hbytes / t;
    }
    if (s == KILN_OK) s = time_host_copy(c, false, a, host, hbytes, &t, err, n);
    if (s == KILN_OK && t > 0) out->d2h_bw = hbytes / t;
    if (s == KILN_OK) s = time_host_copy(c, true, a, host, 4, &t, err, n);
    if (s == KILN_OK) out->xfer_latency_s = t;
    free(host);
    kiln_cuda_free(c, a);
    kiln_cuda_free(c, b);
    kiln_cuda_pool_trim(c);
    if (e0) c->d.event_destroy(e0);
    if (e1) c->d.event_destroy(e1);
    return s;
}
