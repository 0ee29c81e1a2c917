/* Split plans over distinct GPUs on any machine: the cuda backend's host side against the stand-in
 * driver (tests/fakecuda, two devices) and a stand-in NCCL (tests/fakenccl, through
 * $KILN_NCCL_LIB): why multi-GPU is off (kiln_multi_gpu, compile errors), the NCCL calls a split
 * plan makes (communicators once, one group of all-reduces per all_reduce region per run, on every
 * part's stream, destroyed with the plan), and a failing all-reduce stopping the plan. Nothing here
 * runs a kernel: the device script (scripts/device-mgpu.sh) does that on two GPUs. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/presets.h"
#include "sched/group.h"
#include "support/fakecuda_use.h"
#include "support/gguf_writer.h"
#include "support/testutil.h"

static const char *(*nccl_log)(void);
static void (*nccl_reset)(void);


static void setup(void)
{
    void *h = dlopen(KILN_FAKENCCL, RTLD_NOW | RTLD_LOCAL); /* the handle kiln's dlopen shares */
    cr_assert(h, "%s: %s", KILN_FAKENCCL, dlerror());
    *(void **)&nccl_log = dlsym(h, "fakenccl_log");
    *(void **)&nccl_reset = dlsym(h, "fakenccl_reset");
    cr_assert(nccl_log && nccl_reset);
    nccl_reset();
    tu_fakecuda_use();
    setenv("FAKECUDA_DEVICES", "2", 1);
    setenv("KILN_NCCL_LIB", KILN_FAKENCCL, 1);
    unsetenv("FAKENCCL_INIT_FAIL");
    unsetenv("FAKENCCL_REDUCE_FAIL");
    unsetenv("FAKENCCL_VERSION");
    unsetenv("KILN_CUDA_DEVICE");
    unsetenv("KILN_NO_RECORD");
    setenv("KILN_SPLIT", "all", 1); /* small layers: the NCCL calls, whatever the cost model would choose */
}
TestSuite(mgpu, .init = setup);

static kiln_ctx *new_ctx(void)
{
    kiln_ctx *ctx = NULL;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = 1}, &ctx), KILN_OK);
    return ctx;
}

Test(mgpu, info_says_whether_multi_gpu_is_on_and_why_not)
{
    char why[512];
    int n = -1;
    kiln_ctx *ctx = new_ctx();
    cr_assert_eq(kiln_multi_gpu(ctx, &n, why, sizeof why), KILN_OK, "%s", why);
    cr_expect_eq(n, 2);
    cr_expect(strstr(why, "NCCL 2.21.5 from ") && strstr(why, "2 GPUs"), "%s", why);
    kiln_ctx_free(ctx);
    static const struct { const char *var, *val, *want; } off[] = {
        {"FAKECUDA_DEVICES", "1", "1 CUDA device: a split over GPUs needs two or more"},
        {"KILN_NCCL_LIB", "/nonexistent/libnccl.so.2", "KILN_NCCL_LIB=/nonexistent/libnccl.so.2 could not be loaded"},
        {"KILN_NCCL_LIB", KILN_FAKECUDA, "has no ncclGetVersion: not an NCCL 2 library"},
        {"FAKENCCL_VERSION", "1010", "NCCL version 1010; kiln needs NCCL 2"},
        {"KILN_LIBCUDA", "/nonexistent/libcuda.so.1", "cuda is not available: /nonexistent/libcuda.so.1 could not be loaded"},
    };
    for (size_t i = 0; i < sizeof off / sizeof *off; i++) {
        setenv(off[i].var, off[i].val, 1);
        ctx = new_ctx();
        cr_assert_eq(kiln_multi_gpu(ctx, &n, why, sizeof why), KILN_ERR_UNSUPPORTED, "%s=%s", off[i].var, off[i].val);
        cr_expect_eq(n, 0);
        cr_expect(strstr(why, off[i].want), "%s=%s: '%s' should say '%s'", off[i].var, off[i].val, why, off[i].want);
        kiln_ctx_free(ctx);
        setup();
    }
    cr_assert_eq(kiln_multi_gpu(NULL, &n, why, sizeof why), KILN_ERR_INVALID_ARG);
}

static kiln_graph *layer(int64_t max_tok)
{
    static const kiln_preset ps = {.name = "llama-s", .hidden = 256, .n_head = 8, .n_kv_head = 4, .head_dim = 32,
                                   .ffn = 512, .rope = KILN_ROPE_NORMAL, .theta = 1e4f, .eps = 1e-5f};
    kiln_preset_build_opts o = {.wdtype = KILN_DTYPE_F16, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 32,
                                .max_tok = max_tok, .seed = 7};
    kiln_graph *g = NULL;
    char err[256] = "";
    cr_assert_eq(kiln_preset_build_ex(&ps, &o, &g, err, sizeof err), KILN_OK, "%s", err);
    return g;
}

static void expect_refused(const char *devices, kiln_status want_s, const char *want)
{
    kiln_ctx *ctx = new_ctx();
    kiln_graph *g = layer(1);
    kiln_plan *p = NULL;
    kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.devices = devices}, &p);
    cr_assert_eq(s, want_s, "%s: %s (%s)", devices, kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert_null(p);
    cr_expect(strstr(kiln_ctx_error(ctx), want), "%s: '%s' should say '%s'", devices, kiln_ctx_error(ctx), want);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(mgpu, compile_says_why_it_cannot_split_over_gpus)
{
    setenv("KILN_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    expect_refused("cuda:0,1", KILN_ERR_UNSUPPORTED, "devices 'cuda:0,1': multi-GPU is off: KILN_NCCL_LIB=/nonexistent/libnccl.so.2 could not be loaded");
    setup();
    setenv("FAKECUDA_DEVICES", "1", 1);
    expect_refused("cuda:0,1", KILN_ERR_UNSUPPORTED, "multi-GPU is off: 1 CUDA device");
    setup();
    expect_refused("cuda:0,5", KILN_ERR_UNSUPPORTED, "there is no GPU 5 (2 GPUs)");
    nccl_reset();
    setenv("FAKENCCL_INIT_FAIL", "1", 1);
    expect_refused("cuda:0,1", KILN_ERR_BACKEND, "ncclCommInitAll: ncclResult 2: unhandled system error (fake)");
    cr_expect_str_eq(nccl_log(), "init 2: 0 1\n");
}

/* One step: n_tok tokens at positions n_kv - n_tok .. n_kv - 1. */
static kiln_status step(kiln_plan *p, int64_t nt, int64_t nkv)
{
    float x[4 * 256], y[4 * 256];
    int32_t pos[4];
    tu_fill(x, nt * 256, -1, 1);
    for (int64_t t = 0; t < nt; t++) pos[t] = (int32_t)(nkv - nt + t);
    kiln_binding b[] = {{.name = "n_tok", .value = nt}, {.name = "n_kv", .value = nkv},
                        {.name = "x", .data = x, .bytes = (size_t)nt * 256 * sizeof(float)},
                        {.name = "pos", .data = pos, .bytes = (size_t)nt * sizeof(int32_t)},
                        {.name = "y", .data = y, .bytes = (size_t)nt * 256 * sizeof(float)}};
    return kiln_run(p, b, 5);
}

Test(mgpu, split_plan_calls_nccl_per_all_reduce_on_each_gpu)
{
    kiln_ctx *ctx = new_ctx();
    kiln_graph *g = layer(4);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "cuda:0,1"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_expect_str_eq(kiln_plan_backend(p), "cuda");
    cr_expect_str_eq(nccl_log(), "init 2: 0 1\n", "communicators once, at compile");
    nccl_reset();
    fakecuda_log *f = tu_fakecuda();
    int launches = f->launches, graphs = f->graph_launches, captured = f->captured;
    cr_assert_eq(step(p, 1, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(step(p, 3, 9), KILN_OK, "%s", kiln_ctx_error(ctx));
    const char *one = "group{ ar(rank 0, 256, dtype 7, op 0) ar(rank 1, 256, dtype 7, op 0)}\n";
    const char *three = "group{ ar(rank 0, 768, dtype 7, op 0) ar(rank 1, 768, dtype 7, op 0)}\n";
    char want[1024];
    snprintf(want, sizeof want, "%s%s%s%s", one, one, three, three); /* after o and after down, per step */
    cr_expect_str_eq(nccl_log(), want);
    /* each size's first run: launch by launch, nothing recorded */
    cr_expect_gt(f->launches, launches);
    cr_expect_eq(f->graph_launches, graphs);
    cr_expect_eq(f->captured, captured);
    /* a decode step again: recorded (kernels and NCCL calls captured, none launched alone), replayed */
    launches = f->launches;
    nccl_reset();
    cr_assert_eq(step(p, 1, 7), KILN_OK, "%s", kiln_ctx_error(ctx));
    snprintf(want, sizeof want, "%s%s", one, one);
    cr_expect_str_eq(nccl_log(), want, "the NCCL calls once, inside the capture");
    cr_expect_eq(f->launches, launches, "no launch outside the recordings");
    cr_expect_gt(f->captured, captured);
    cr_expect_eq(f->graph_launches - graphs, 2, "one graph per GPU");
    int kernels = f->graph_kernels;
    nccl_reset();
    cr_assert_eq(step(p, 1, 8), KILN_OK, "%s", kiln_ctx_error(ctx)); /* and again: replayed alone */
    cr_expect_str_eq(nccl_log(), "", "a replay calls no NCCL: its calls are in the graphs");
    cr_expect_eq(f->graph_launches - graphs, 4);
    cr_expect_gt(f->graph_kernels, kernels);
    cr_expect_eq(f->launches, launches);
    /* states read whole: each GPU's half of the KV heads */
    kiln_tensor_info ti;
    cr_assert_eq(kiln_plan_tensor(p, "k0", &ti), KILN_OK);
    cr_expect_eq(ti.dims[0], 4);
    void *k = malloc(ti.bytes);
    cr_assert_eq(kiln_plan_state_read(p, "k0", k, ti.bytes), KILN_OK, "%s", kiln_ctx_error(ctx));
    free(k);
    /* a failing all-reduce (a new size): a clear error, and the plan stays stopped */
    setenv("FAKENCCL_REDUCE_FAIL", "1", 1);
    cr_assert_eq(step(p, 2, 6), KILN_ERR_BACKEND);
    cr_expect(strstr(kiln_ctx_error(ctx), "ncclAllReduce: ncclResult 3: internal error (fake)"), "%s", kiln_ctx_error(ctx));
    unsetenv("FAKENCCL_REDUCE_FAIL");
    cr_assert_eq(step(p, 1, 6), KILN_ERR_BACKEND);
    cr_expect(strstr(kiln_ctx_error(ctx), "this multi-GPU plan stopped after an error"), "%s", kiln_ctx_error(ctx));
    nccl_reset();
    kiln_plan_free(p);
    cr_expect_str_eq(nccl_log(), "destroy 0\ndestroy 1\n");
    /* the context's own plans keep working: one GPU */
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(step(p, 2, 4), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* One GPU listed twice: virtual parts on it, summed through the host; NCCL is not involved. */
Test(mgpu, one_gpu_listed_twice_needs_no_nccl)
{
    setenv("KILN_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    kiln_ctx *ctx = new_ctx();
    kiln_graph *g = layer(2);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "cuda:0,0"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(step(p, 2, 3), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_expect_str_eq(nccl_log(), "");
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* A GGUF model over two GPUs: per step, an all-reduce after o and after down of each layer, then the
 * head's all-gather (last_only: one row, 48 of the 96 logits from each GPU). */
Test(mgpu, model_head_split_by_vocabulary_calls_nccl_all_gather)
{
    static const gw_model gm = {.arch = "llama", .n_layer = 1, .hidden = 64, .n_head = 4, .n_kv_head = 2, .ffn = 128,
                                .n_vocab = 96, .n_ctx = 64, .wtype = KILN_DTYPE_F16, .embtype = KILN_DTYPE_F16, .seed = 5};
    kiln_ctx *ctx = new_ctx();
    gw *w = gw_model_new(&gm);
    size_t nb;
    uint8_t *bytes = gw_bytes(w, &nb);
    gw_free(w);
    kiln_gguf *f = NULL;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, nb, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_model_build(f, &(kiln_model_options){.max_ctx = 16, .max_tok = 4, .last_only = true, .logits = true}, &g),
                 KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "cuda:0,1"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    nccl_reset();
    int32_t ids[3] = {1, 2, 3}, pos[3] = {0, 1, 2}, last = 2, next = -1;
    float logits[96];
    kiln_binding b[] = {{.name = "n_tok", .value = 3}, {.name = "n_kv", .value = 3},
                        {.name = "ids", .data = ids, .bytes = sizeof ids}, {.name = "pos", .data = pos, .bytes = sizeof pos},
                        {.name = "last", .data = &last, .bytes = 4}, {.name = "next", .data = &next, .bytes = 4},
                        {.name = "logits", .data = logits, .bytes = sizeof logits}};
    cr_assert_eq(kiln_run(p, b, 7), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_expect_str_eq(nccl_log(), "group{ ar(rank 0, 192, dtype 7, op 0) ar(rank 1, 192, dtype 7, op 0)}\n"
                                 "group{ ar(rank 0, 192, dtype 7, op 0) ar(rank 1, 192, dtype 7, op 0)}\n"
                                 "group{ ag(rank 0, 48, dtype 7) ag(rank 1, 48, dtype 7)}\n");
    setenv("FAKENCCL_REDUCE_FAIL", "1", 1); /* a failing collective (2 tokens: run as launches) stops the plan */
    nccl_reset();
    b[0].value = 2, b[1].value = 2, b[2].bytes = b[3].bytes = 8, last = 1;
    kiln_status st = kiln_run(p, b, 7);
    cr_assert_eq(st, KILN_ERR_BACKEND, "%s: %s", kiln_status_str(st), kiln_ctx_error(ctx));
    cr_expect(strstr(kiln_ctx_error(ctx), "ncclAllReduce: ncclResult 3"), "%s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_gguf_close(f);
    free(bytes);
    kiln_ctx_free(ctx);
}

/* kiln calibrate's link measurement: an 8 KB and a 16 MiB all-reduce over both GPUs, timed into the
 * profile's link_latency_s and link_bw; with multi-GPU off, the profile is untouched and why says so. */
Test(mgpu, calibrate_measures_the_all_reduce)
{
    kiln_ctx *ctx = new_ctx();
    nccl_reset();
    kiln_device_profile p = {.link_bw = -1, .link_latency_s = -1};
    char why[512] = "";
    cr_assert_eq(kiln_sched_calibrate_link(ctx, &p, why, sizeof why), KILN_OK, "%s", why);
    cr_expect(p.link_bw > 0 && p.link_latency_s > 0, "link_bw %g, link_latency_s %g", p.link_bw, p.link_latency_s);
    cr_expect_str_eq(why, "2 GPUs");
    const char *log = nccl_log();
    cr_expect(!strncmp(log, "init 2: 0 1\n", 12), "%s", log);
    cr_expect(strstr(log, "group{ ar(rank 0, 2048, dtype 7, op 0) ar(rank 1, 2048, dtype 7, op 0)}\n"), "8 KB: %.300s", log);
    cr_expect(strstr(log, "group{ ar(rank 0, 4194304, dtype 7, op 0) ar(rank 1, 4194304, dtype 7, op 0)}\n"), "16 MiB");
    cr_expect(strstr(log, "destroy 0\ndestroy 1\n"), "communicators freed");
    kiln_ctx_free(ctx);
    setenv("KILN_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    ctx = new_ctx();
    p = (kiln_device_profile){.link_bw = 7, .link_latency_s = 8};
    cr_assert_eq(kiln_sched_calibrate_link(ctx, &p, why, sizeof why), KILN_ERR_UNSUPPORTED);
    cr_expect(p.link_bw == 7 && p.link_latency_s == 8, "untouched");
    cr_expect(strstr(why, "could not be loaded"), "%s", why);
    kiln_ctx_free(ctx);
}

/* KILN_NO_RECORD=1: the parts launch kernel by kernel and call NCCL every run. */
Test(mgpu, no_record_launches_kernel_by_kernel)
{
    setenv("KILN_NO_RECORD", "1", 1);
    kiln_ctx *ctx = new_ctx();
    kiln_graph *g = layer(2);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "cuda:0,1"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    fakecuda_log *f = tu_fakecuda();
    int launches = f->launches, graphs = f->graph_launches;
    for (int k = 0; k < 2; k++) {
        nccl_reset();
        cr_assert_eq(step(p, 1, 3 + k), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_expect_str_eq(nccl_log(), "group{ ar(rank 0, 256, dtype 7, op 0) ar(rank 1, 256, dtype 7, op 0)}\n"
                                     "group{ ar(rank 0, 256, dtype 7, op 0) ar(rank 1, 256, dtype 7, op 0)}\n");
    }
    cr_expect_gt(f->launches, launches);
    cr_expect_eq(f->graph_launches, graphs);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* A GPU that faults (an illegal address at a sync) stops the split plan for good with an error naming
 * the GPU and the driver's text; a new split plan and the context's one-GPU plans still run. */
Test(mgpu, device_fault_stops_the_split_plan_only)
{
    kiln_ctx *ctx = new_ctx();
    kiln_graph *g = layer(1);
    kiln_plan *p = NULL, *one = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "cuda:0,1"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &one), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(step(p, 1, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(step(p, 1, 3), KILN_OK, "%s", kiln_ctx_error(ctx)); /* recorded: the fault comes in a replay */
    int graphs = tu_fakecuda()->graph_launches;
    tu_fakecuda()->fault_next_sync = 1;
    cr_assert_eq(step(p, 1, 4), KILN_ERR_BACKEND);
    cr_expect_eq(tu_fakecuda()->graph_launches - graphs, 2, "the step was a replay");
    const char *e = kiln_ctx_error(ctx);
    cr_expect(strstr(e, "split plan, part ") && strstr(e, "(GPU ") && strstr(e, "cuStreamSynchronize"), "%s", e);
    cr_assert_eq(step(p, 1, 5), KILN_ERR_BACKEND);
    cr_expect(strstr(kiln_ctx_error(ctx), "this multi-GPU plan stopped after an error") &&
              strstr(kiln_ctx_error(ctx), "cuStreamSynchronize"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(step(one, 1, 2), KILN_OK, "the one-GPU plan: %s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.devices = "cuda:0,1"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(step(p, 1, 2), KILN_OK, "a new split plan: %s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    kiln_plan_free(one);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}
