/* The CUDA backend's host side on any machine, against a stand-in driver (tests/fakecuda loaded
 * through $KILN_LIBCUDA): what the probe reports and why cuda is absent, plans compiled to PTX
 * modules, recorded once and replayed per run, every launch's arguments bound, the pool, out of
 * memory naming the size, JIT logs in errors, and a sticky fault that stops the backend. Nothing
 * here runs a kernel: test_cuda does that on a real GPU. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "backends/cuda/cuda.h"
#include "cache/cache.h"
#include "sched/ctx.h"
#include "support/fakecuda_use.h"

Test(cuda_host, probe_reports_the_device_or_why_not)
{
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    kiln_backend_info b;
    cr_assert_eq(kiln_backend_get(ctx, KILN_BACKEND_CUDA, &b), KILN_OK);
    cr_assert(b.available, "%s", b.detail);
    cr_assert_str_eq(b.detail, "NVIDIA H100 80GB HBM3 (fake), sm_90, 132 SMs, 80.0 GiB, driver 13.0");
    kiln_device_profile p;
    cr_assert_eq(kiln_ctx_profile(ctx, "cuda", &p), KILN_OK);
    cr_assert(p.mem_bw > 2.9e12 && p.mem_bw < 3.1e12, "mem_bw %g from 2619 MHz x 5120 bits", p.mem_bw);
    cr_assert(p.h2d_bw > 0 && p.launch_s > 0 && p.peak_flops[KILN_DTYPE_F16] > p.peak_flops[KILN_DTYPE_F32]);
    kiln_ctx_free(ctx);
    cr_assert_eq(tu_fakecuda()->live_allocs, 0);
    static const struct { const char *var, *val, *want; } absent[] = {
        {"FAKECUDA_DEVICES", "0", "no CUDA device"},
        {"FAKECUDA_CC", "75", "sm_75; kiln's PTX needs sm_80 or newer"},
        {"KILN_CUDA_DEVICE", "3", "KILN_CUDA_DEVICE=3 but there are 1 CUDA devices"},
        {"KILN_LIBCUDA", "/nonexistent/libcuda.so.1", "/nonexistent/libcuda.so.1 could not be loaded"},
    };
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        tu_fakecuda_use();
        setenv(absent[i].var, absent[i].val, 1);
        cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
        cr_assert_eq(kiln_backend_get(ctx, KILN_BACKEND_CUDA, &b), KILN_OK);
        cr_assert(!b.available && strstr(b.detail, absent[i].want), "%s=%s: %s", absent[i].var, absent[i].val, b.detail);
        kiln_ctx_free(ctx);
        unsetenv(absent[i].var);
    }
}

/* y = silu(rms_norm(x, w)) over [n_tok <= 8, 64]: a rows region the lowering takes. */
static kiln_graph *norm_graph(void)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim d[2] = {kiln_sym(g, "n_tok", 8), 64}, wd[1] = {64};
    float w[64];
    for (int i = 0; i < 64; i++) w[i] = 1.0f + i / 64.0f;
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, d);
    kiln_node y = kiln_silu(g, kiln_rms_norm(g, x, kiln_weight(g, "w", KILN_DTYPE_F32, 1, wd, w, KILN_WEIGHT_COPY), 1e-5f));
    cr_assert_eq(kiln_output(g, y, "y"), KILN_OK, "%s", kiln_graph_error(g));
    return g;
}

static void run_norm(kiln_plan *p, kiln_ctx *ctx, int n_tok)
{
    float x[8 * 64], y[8 * 64];
    for (int i = 0; i < 8 * 64; i++) x[i] = (float)(i % 13) - 6;
    kiln_binding b[] = {{.name = "n_tok", .value = n_tok}, {.name = "x", .data = x, .bytes = (size_t)n_tok * 64 * 4},
                        {.name = "y", .data = y, .bytes = (size_t)n_tok * 64 * 4}};
    cr_assert_eq(kiln_run(p, b, 3), KILN_OK, "%s", kiln_ctx_error(ctx));
}

Test(cuda_host, plans_compile_record_once_and_replay)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    kiln_graph *g = norm_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(f->modules >= 1);
    cr_assert(strstr(f->last_ptx, ".target sm_90\n") && strstr(f->last_ptx, ".visible .entry "), "%s", f->last_ptx);
    run_norm(p, ctx, 3);
    run_norm(p, ctx, 8);
    cr_assert(f->captured >= 1, "nothing was recorded");
    cr_assert_eq(f->launches, 0, "%d launches ran outside the recording", f->launches);
    cr_assert_eq(f->graph_launches, 2, "one replay per run");
    cr_assert_eq(f->graph_kernels, 2 * f->captured);
    cr_assert(f->last_n_params >= 2 && f->last_block >= 32 && f->last_grid[0] >= 1);
    for (int i = 0; i < f->last_n_params; i++) cr_assert(f->last_params[i], "parameter %d is NULL", i);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    cr_assert_eq(f->live_allocs, 0, "%d device allocations left after the context", f->live_allocs);
}

Test(cuda_host, without_recording_every_region_launches)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    kiln_graph *g = norm_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda", .no_record = true}, &p), KILN_OK, "%s",
                 kiln_ctx_error(ctx));
    run_norm(p, ctx, 5);
    cr_assert(f->launches >= 1 && f->captured == 0 && f->graph_launches == 0);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(cuda_host, pool_rounds_and_reuses)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    void *st = ctx->be_state[KILN_BACKEND_CUDA], *a, *b, *c;
    char err[512];
    const kiln_backend_i *be = &kiln_backend_cuda;
    cr_assert_eq(be->alloc(st, 1, &a, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(f->allocated, 256u, "1 byte rounds to 256");
    be->free(st, a);
    cr_assert_eq(be->alloc(st, 200, &b, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(a, b, "the freed block was not reused");
    cr_assert_eq(be->alloc(st, 100000, &c, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(f->live_allocs, 2);
    char host[300], back[300];
    for (int i = 0; i < 300; i++) host[i] = (char)(i * 7);
    cr_assert_eq(be->upload(st, c, host, 300, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(be->copy(st, (char *)c + 1000, c, 300, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(be->download(st, back, (char *)c + 1000, 300, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(be->sync(st, err, sizeof err), KILN_OK, "%s", err);
    cr_assert(!memcmp(host, back, 300));
    kiln_ctx_free(ctx);
    cr_assert_eq(f->live_allocs, 0);
}

Test(cuda_host, out_of_memory_and_jit_errors_say_what)
{
    setenv("FAKECUDA_MEM", "1073741824", 1);
    setenv("KILN_CACHE", "off", 1); /* a cubin on disk from another test would need no JIT */
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    void *st = ctx->be_state[KILN_BACKEND_CUDA], *a = NULL;
    char err[1024] = "";
    cr_assert_eq(kiln_backend_cuda.alloc(st, (size_t)2 << 30, &a, err, sizeof err), KILN_ERR_NOMEM, "%s", err);
    cr_assert(strstr(err, "cuMemAlloc of 2147483648 bytes (2048.0 MiB): CUDA_ERROR_OUT_OF_MEMORY: out of memory"), "%s", err);
    cr_assert_eq(kiln_backend_cuda.alloc(st, 4096, &a, err, sizeof err), KILN_OK, "%s", err);
    kiln_backend_cuda.free(st, a);
    setenv("FAKECUDA_JIT_FAIL", "1", 1);
    kiln_graph *g = norm_graph();
    kiln_plan *p = NULL;
    kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p);
    cr_assert_eq(s, KILN_ERR_BACKEND, "%s", kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed") &&
              strstr(kiln_ctx_error(ctx), "ptxas fatal   : fake JIT failure"), "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

Test(cuda_host, sticky_fault_stops_the_backend)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    kiln_graph *g = norm_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    void *st = ctx->be_state[KILN_BACKEND_CUDA];
    char err[1024] = "";
    f->fault_next_sync = 1;
    cr_assert_eq(kiln_backend_cuda.sync(st, err, sizeof err), KILN_ERR_BACKEND);
    cr_assert(strstr(err, "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered") && strstr(err, "unusable"), "%s", err);
    void *a = NULL;
    cr_assert_eq(kiln_backend_cuda.alloc(st, 64, &a, err, sizeof err), KILN_ERR_BACKEND);
    cr_assert(strstr(err, "stopped after an earlier error") && strstr(err, "ILLEGAL_ADDRESS"), "%s", err);
    float x[64] = {0}, y[64];
    kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = y, .bytes = sizeof y}};
    cr_assert_neq(kiln_run(p, b, 3), KILN_OK);
    cr_assert(strstr(kiln_ctx_error(ctx), "stopped after an earlier error"), "%s", kiln_ctx_error(ctx));
    /* the cpu backend in the same context still runs the graph */
    kiln_plan *pc = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cpu"}, &pc), KILN_OK, "%s", kiln_ctx_error(ctx));
    x[0] = 1;
    cr_assert_eq(kiln_run(pc, b, 3), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(y[0] > 0.5f);
    kiln_plan_free(pc);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

#include "model/presets.h"

/* One decode layer of preset pr (q8_0 weights, 64 KV rows) compiled onto cuda; *g is its graph. */
static kiln_plan *decode_layer_plan(kiln_ctx *ctx, const kiln_preset *pr, kiln_graph **g)
{
    cr_assert_eq(kiln_preset_build(pr, KILN_DTYPE_Q8_0, 1, 64, 1, g), KILN_OK);
    kiln_plan *p = NULL;
    kiln_status s = kiln_compile(ctx, *g, &(kiln_compile_options){.backend = "cuda"}, &p);
    if (s == KILN_ERR_UNSUPPORTED) cr_skip("the lowering does not take every region yet: %s", kiln_ctx_error(ctx));
    cr_assert_eq(s, KILN_OK, "%s", kiln_ctx_error(ctx));
    return p;
}

/* A whole qwen2-0.5b decode layer forced onto cuda: every region compiles (attention as two
 * kernels sharing a scratch buffer), one recording is replayed per step, no argument is NULL. */
Test(cuda_host, decode_layer_compiles_and_replays)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    const kiln_preset *pr = kiln_preset_find("qwen2-0.5b");
    kiln_graph *g = NULL;
    kiln_plan *p = decode_layer_plan(ctx, pr, &g);
    int modules = f->modules;
    cr_assert(modules >= 4, "%d modules for a decode layer", modules);
    float *x = calloc((size_t)pr->hidden, 4), *y = calloc((size_t)pr->hidden, 4);
    for (int step = 0; step < 3; step++) {
        int32_t pos = 10 + step;
        kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = pos + 1},
                            {.name = "x", .data = x, .bytes = (size_t)pr->hidden * 4}, {.name = "pos", .data = &pos, .bytes = 4},
                            {.name = "y", .data = y, .bytes = (size_t)pr->hidden * 4}};
        cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "step %d: %s", step, kiln_ctx_error(ctx));
    }
    cr_assert_eq(f->graph_launches, 3);
    cr_assert(f->captured >= modules, "%d kernels recorded, %d modules", f->captured, modules);
    cr_assert_eq(f->graph_kernels, 3 * f->captured);
    cr_assert_eq(f->null_params, 0, "%d launches had a NULL argument", f->null_params);
    free(x), free(y);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    cr_assert_eq(f->live_allocs, 0, "%d device allocations left after the context", f->live_allocs);
}

/* Inputs and outputs bound as device memory are copied device to device (the fake's device memory
 * is host memory: a copy from the host side would read the NULL host address and crash). */
Test(cuda_host, device_bindings_copy_device_to_device)
{
    tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    const kiln_preset *pr = kiln_preset_find("qwen2-0.5b");
    kiln_graph *g = NULL;
    kiln_plan *p = decode_layer_plan(ctx, pr, &g);
    size_t xb = (size_t)pr->hidden * 4;
    float *dx = calloc((size_t)pr->hidden, 4), *dy = malloc(xb);
    memset(dy, 0xff, xb);
    int32_t pos = 3;
    kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = pos + 1},
                        {.name = "x", .data = dx, .bytes = xb, .device = true}, {.name = "pos", .data = &pos, .bytes = 4},
                        {.name = "y", .data = dy, .bytes = xb, .device = true}};
    for (int step = 0; step < 2; step++) cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "step %d: %s", step, kiln_ctx_error(ctx));
    /* a binding that names nothing is refused by name, and the plan stays usable */
    kiln_binding bad[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = pos + 1},
                          {.name = "x", .data = dx, .bytes = xb}, {.name = "pos", .data = &pos, .bytes = 4},
                          {.name = "y", .data = dy, .bytes = xb, .device = true}, {.name = "bogus", .data = dx, .bytes = 4, .device = true}};
    cr_assert_eq(kiln_run(p, bad, 6), KILN_ERR_NAME);
    cr_assert(strstr(kiln_ctx_error(ctx), "bogus"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
    free(dx), free(dy);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* kiln_run_async on a cuda plan with device bindings: the recorded graph replays once, kiln's
 * stream and the caller's are joined both ways (two stream waits), and the host never waits (no
 * stream sync); kiln_run afterwards syncs as before. */
Test(cuda_host, run_async_joins_the_callers_stream_without_waiting)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    const kiln_preset *pr = kiln_preset_find("qwen2-0.5b");
    kiln_graph *g = NULL;
    kiln_plan *p = decode_layer_plan(ctx, pr, &g);
    size_t xb = (size_t)pr->hidden * 4;
    float *dx = calloc((size_t)pr->hidden, 4), *dy = malloc(xb);
    int32_t *dpos = calloc(1, 4);
    kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = 1},
                        {.name = "x", .data = dx, .bytes = xb, .device = true}, {.name = "pos", .data = dpos, .bytes = 4, .device = true},
                        {.name = "y", .data = dy, .bytes = xb, .device = true}};
    cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx)); /* records the graph */
    int waits = f->stream_waits, syncs = f->syncs, graphs = f->graph_launches;
    void *caller = (void *)(uintptr_t)0x5710;
    for (int step = 0; step < 3; step++) cr_assert_eq(kiln_run_async(p, b, 5, caller), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->graph_launches - graphs, 3, "one graph replay per step");
    cr_assert_eq(f->stream_waits - waits, 6, "each step joins the caller's stream both ways");
    cr_assert_eq(f->syncs, syncs, "an async step with device bindings must not wait on the host");
    cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(f->syncs > syncs, "kiln_run still waits for its step");
    b[1].value = 2000000; /* errors before enqueueing come back and nothing is joined */
    waits = f->stream_waits;
    cr_assert_eq(kiln_run_async(p, b, 5, caller), KILN_ERR_SYMBOL);
    cr_assert_eq(f->stream_waits, waits);
    free(dx), free(dy), free(dpos);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* A kernel the JIT reports spilling is loaded again with every register allowed. */
Test(cuda_host, spilling_kernels_are_reprinted_with_all_registers)
{
    setenv("KILN_CACHE", "off", 1); /* an entry of the first compile would serve the second */
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    kiln_graph *g = norm_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    int plain = f->modules;
    cr_assert(!strstr(f->last_ptx, ".minnctapersm"), "%s", f->last_ptx);
    kiln_plan_free(p);
    setenv("FAKECUDA_SPILL", "1", 1);
    kiln_cache_mem_clear(ctx->cache); /* the driver changed under the context: compile again */
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->modules, 3 * plain, "each kernel loaded twice after spilling");
    cr_assert(strstr(f->last_ptx, ".minnctapersm 1\n"), "%s", f->last_ptx);
    run_norm(p, ctx, 2);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* The cubin the driver's linker makes is kept on disk: a new context loads it without printing PTX
 * or running the JIT, launches bind as before, and a damaged entry is linked again and replaced. */
Test(cuda_host, cubins_from_disk_skip_the_jit)
{
    char dir[] = "/tmp/kiln-test-cuda-cache-XXXXXX";
    cr_assert(mkdtemp(dir));
    setenv("KILN_CACHE_DIR", dir, 1);
    unsetenv("KILN_CACHE");
    fakecuda_log *f = tu_fakecuda();
    kiln_graph *g = norm_graph();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    int kernels = f->links;
    cr_assert(kernels >= 1 && f->cubin_loads == kernels, "%d links, %d cubins loaded", f->links, f->cubin_loads);
    cr_assert_str_eq(kiln_plan_cache(p), "miss");
    kiln_plan_free(p);
    kiln_ctx_free(ctx);
    kiln_cache_entry_info *e;
    size_t n;
    cr_assert_eq(kiln_cache_list(dir, &e, &n), KILN_OK);
    cr_assert_geq(n, 1);
    char path[256] = "";
    for (size_t i = 0; i < n; i++) {
        cr_assert(e[i].ok, "%s: %s", e[i].name, e[i].why);
        if (strcmp(e[i].kind, "cuda") == 0) snprintf(path, sizeof path, "%s/%s", dir, e[i].name);
    }
    cr_assert(path[0], "no cuda entry");
    free(e);
    /* a new context: cubins loaded, nothing linked */
    ctx = tu_fakecuda_ctx(0);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_str_eq(kiln_plan_cache(p), "disk");
    cr_assert_eq(f->links, kernels, "the JIT ran on a warm start");
    cr_assert_eq(f->cubin_loads, 2 * kernels);
    run_norm(p, ctx, 4);
    cr_assert(f->last_n_params >= 2);
    for (int i = 0; i < f->last_n_params; i++) cr_assert(f->last_params[i], "parameter %d is NULL", i);
    cr_assert_eq(f->null_params, 0);
    kiln_plan_free(p);
    kiln_ctx_free(ctx);
    /* a damaged entry: linked again and replaced */
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp);
    fseek(fp, -3, SEEK_END);
    int ch = fgetc(fp);
    fseek(fp, -3, SEEK_END);
    fputc(ch ^ 0x10, fp);
    fclose(fp);
    ctx = tu_fakecuda_ctx(0);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->links, kernels + 1, "the damaged kernel is linked again, the others load");
    cr_assert_eq(kiln_cache_stats_get(ctx->cache).disk_rejects, 1);
    run_norm(p, ctx, 2);
    kiln_plan_free(p);
    kiln_ctx_free(ctx);
    cr_assert_eq(kiln_cache_list(dir, &e, &n), KILN_OK);
    for (size_t i = 0; i < n; i++) cr_assert(e[i].ok, "%s: %s after the rebuild", e[i].name, e[i].why);
    free(e);
    size_t removed;
    kiln_cache_clear(dir, &removed);
    rmdir(dir);
    kiln_graph_free(g);
    cr_assert_eq(f->live_allocs, 0);
}

/* The NaN/Inf guard on cuda: kernels run nothing here, so what a region "stores" is what its
 * memory held: zeros pass, NaN bytes (FAKECUDA_POISON) are caught after the region, named with
 * its node, region and backend; the guard launches region by region (no graph replay). */
Test(cuda_host, check_finite_reads_region_outputs_back)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    kiln_graph *g = norm_graph();
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda", .check_finite = true}, &p), KILN_OK, "%s",
                 kiln_ctx_error(ctx));
    run_norm(p, ctx, 3);
    cr_assert(f->launches >= 1 && f->graph_launches == 0, "guarded runs launch region by region");
    kiln_plan_free(p);
    kiln_ctx_free(ctx); /* its memory pool holds the zeroed blocks */
    setenv("FAKECUDA_POISON", "1", 1);
    ctx = tu_fakecuda_ctx(0);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda", .check_finite = true}, &p), KILN_OK, "%s",
                 kiln_ctx_error(ctx));
    float x[8 * 64] = {1}, y[8 * 64];
    kiln_binding b[] = {{.name = "n_tok", .value = 2}, {.name = "x", .data = x, .bytes = 2 * 64 * 4},
                        {.name = "y", .data = y, .bytes = 2 * 64 * 4}};
    cr_assert_eq(kiln_run(p, b, 3), KILN_ERR_NONFINITE, "%s", kiln_ctx_error(ctx));
    const char *e = kiln_ctx_error(ctx);
    /* the silu is the row kernel's epilogue (fusion rule 1): the region stores only it */
    cr_assert(strstr(e, "silu #3 is NaN at element 0 of f32 [2, 64]; region 0 (rows: rms_norm + silu") && strstr(e, ") on cuda"),
              "%s", e);
    kiln_plan_free(p);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_run(p, b, 3), KILN_OK, "unguarded: %s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
    unsetenv("FAKECUDA_POISON");
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* Faults through kiln_compile leave the context usable: out of device memory (two 768 MiB weights
 * on a 1 GiB device: each allocation would fit, the plan does not; refused before any allocation,
 * naming the plan's size, its largest weight and what is free), invalid PTX (the JIT's log), then,
 * with both gone, the same context compiles and runs on cuda, and on cpu. A missing driver makes
 * cuda absent, and asking for it says why. */
Test(cuda_host, compile_faults_leave_the_context_usable)
{
    setenv("KILN_CACHE", "off", 1); /* a cubin on disk from another test would skip the failing JIT */
    setenv("FAKECUDA_MEM", "1073741824", 1);
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    const size_t rows = (size_t)3 << 12, k = (size_t)1 << 14, bytes = rows * k * 4; /* 768 MiB f32 */
    void *w = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    cr_assert(w != MAP_FAILED);
    kiln_graph *big;
    cr_assert_eq(kiln_graph_new(&big), KILN_OK);
    kiln_node x = kiln_input(big, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){1, (kiln_dim)k});
    for (int i = 0; i < 2; i++) {
        kiln_node wn = kiln_weight(big, i ? "w_up" : "w_gate", KILN_DTYPE_F32, 2, (kiln_dim[]){(kiln_dim)rows, (kiln_dim)k}, w,
                                   KILN_WEIGHT_BORROW);
        cr_assert_eq(kiln_output(big, kiln_matmul(big, x, wn), i ? "up" : "gate"), KILN_OK, "%s", kiln_graph_error(big));
    }
    int allocs = f->live_allocs;
    kiln_plan *p = NULL;
    kiln_status s = kiln_compile(ctx, big, &(kiln_compile_options){.backend = "cuda"}, &p);
    cr_assert_eq(s, KILN_ERR_NOMEM, "%s: %s", kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert(strstr(kiln_ctx_error(ctx), "the plan needs 1.5 GiB of cuda device memory (weights 1.5 GiB, the largest 'w_") &&
                  strstr(kiln_ctx_error(ctx), "the device has 1 GiB free of 1 GiB"),
              "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->live_allocs, allocs, "refused before allocating: %d buffers were left", f->live_allocs - allocs);
    kiln_graph_free(big);
    munmap(w, bytes);
    kiln_graph *g = norm_graph();
    setenv("FAKECUDA_JIT_FAIL", "1", 1);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_ERR_BACKEND);
    cr_assert(strstr(kiln_ctx_error(ctx), "fake JIT failure"), "%s", kiln_ctx_error(ctx));
    unsetenv("FAKECUDA_JIT_FAIL");
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    run_norm(p, ctx, 4);
    kiln_plan_free(p);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cpu"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    run_norm(p, ctx, 4);
    kiln_plan_free(p);
    kiln_ctx_free(ctx);
    setenv("KILN_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cuda"}, &p), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "backend 'cuda' is not available: ") && strstr(kiln_ctx_error(ctx), "could not be loaded"),
              "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cpu"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    run_norm(p, ctx, 2);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* ------------------------------------------------------------------ programmatic dependent launch */

/* Runs `steps` decode steps of a qwen2-0.5b layer compiled for cuda with codegen.pdl = pdl and
 * no_record = !record; returns the status of the first failed step (KILN_OK when all ran). */
static kiln_status pdl_steps(kiln_ctx *ctx, int32_t pdl, bool record, int steps, int *modules)
{
    const kiln_preset *pr = kiln_preset_find("qwen2-0.5b");
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_preset_build(pr, KILN_DTYPE_Q8_0, 1, 64, 1, &g), KILN_OK);
    kiln_plan *p = NULL;
    kiln_compile_options o = {.backend = "cuda", .no_record = !record, .codegen.pdl = pdl};
    kiln_status s = kiln_compile(ctx, g, &o, &p);
    if (s == KILN_ERR_UNSUPPORTED) cr_skip("the lowering does not take every region yet: %s", kiln_ctx_error(ctx));
    cr_assert_eq(s, KILN_OK, "%s", kiln_ctx_error(ctx));
    if (modules) *modules = tu_fakecuda()->modules;
    float *x = calloc((size_t)pr->hidden, 4), *y = calloc((size_t)pr->hidden, 4);
    for (int step = 0; s == KILN_OK && step < steps; step++) {
        int32_t pos = 10 + step;
        kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = pos + 1},
                            {.name = "x", .data = x, .bytes = (size_t)pr->hidden * 4}, {.name = "pos", .data = &pos, .bytes = 4},
                            {.name = "y", .data = y, .bytes = (size_t)pr->hidden * 4}};
        s = kiln_run(p, b, 5);
    }
    free(x), free(y);
    kiln_plan_free(p);
    kiln_graph_free(g);
    return s;
}

/* codegen.pdl on an sm_90 device: every kernel carries griddepcontrol and is launched through
 * cuLaunchKernelEx with programmatic stream serialization, recorded into the CUDA graph; no kernel
 * without a grid wait is ever launched so. */
Test(cuda_host, pdl_kernels_launch_programmatically_and_record)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    int modules = 0;
    cr_assert_eq(pdl_steps(ctx, KILN_GEMM_ON, true, 3, &modules), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(strstr(f->last_ptx, "\tgriddepcontrol.launch_dependents;\n") && strstr(f->last_ptx, "\tgriddepcontrol.wait;\n"),
              "%s", f->last_ptx);
    cr_assert(f->captured >= modules, "%d kernels recorded, %d modules", f->captured, modules);
    cr_assert_eq(f->pdl_captured, f->captured, "%d of %d recorded launches were programmatic", f->pdl_captured, f->captured);
    cr_assert_eq(f->pdl_without_wait, 0, "%d programmatic launches of kernels that do not wait", f->pdl_without_wait);
    cr_assert_eq(f->graph_launches, 3);
    cr_assert_eq(f->null_params, 0);
    kiln_ctx_free(ctx);
    cr_assert_eq(f->live_allocs, 0);
}

/* The same launched kernel by kernel (no recording), and the default (pdl off): plain launches of
 * kernels without griddepcontrol. */
Test(cuda_host, pdl_without_recording_and_off_by_default)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    cr_assert_eq(pdl_steps(ctx, KILN_GEMM_ON, false, 2, NULL), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(f->launches > 0 && f->pdl_launches == f->launches && f->captured == 0, "%d launches, %d programmatic", f->launches,
              f->pdl_launches);
    cr_assert_eq(f->pdl_without_wait, 0);
    int before = f->launches;
    kiln_ctx_free(ctx);
    ctx = tu_fakecuda_ctx(0);
    cr_assert_eq(pdl_steps(ctx, KILN_GEMM_AUTO, false, 2, NULL), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->pdl_launches, before, "pdl is opt-in");
    cr_assert_eq(f->ex_launches, before);
    cr_assert_null(strstr(f->last_ptx, "griddepcontrol"), "%s", f->last_ptx);
    kiln_ctx_free(ctx);
}

/* An sm_80 device has no programmatic dependent launch: the option changes nothing there. */
Test(cuda_host, pdl_is_for_sm90_only)
{
    fakecuda_log *f = tu_fakecuda();
    setenv("FAKECUDA_CC", "80", 1);
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    cr_assert_eq(pdl_steps(ctx, KILN_GEMM_ON, true, 2, NULL), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->ex_launches, 0);
    cr_assert(f->captured > 0);
    cr_assert_null(strstr(f->last_ptx, "griddepcontrol"), "%s", f->last_ptx);
    kiln_ctx_free(ctx);
    unsetenv("FAKECUDA_CC");
}

/* A driver that refuses the attribute, one before 12.3, and a graph capture that refuses
 * programmatic edges: plain launches take over (the capture's run fails once, saying so), the
 * results are the same kernels' and the warning is printed once. */
Test(cuda_host, pdl_falls_back_to_plain_launches, .init = cr_redirect_stderr)
{
    fakecuda_log *f = tu_fakecuda();
    setenv("FAKECUDA_EX_FAIL", "1", 1);
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    cr_assert_eq(pdl_steps(ctx, KILN_GEMM_ON, true, 2, NULL), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->pdl_launches, 0);
    cr_assert(f->captured > 0 && f->graph_launches == 2);
    kiln_ctx_free(ctx);
    unsetenv("FAKECUDA_EX_FAIL");

    setenv("FAKECUDA_DRIVER", "12020", 1);
    ctx = tu_fakecuda_ctx(0);
    int ex = f->ex_launches;
    cr_assert_eq(pdl_steps(ctx, KILN_GEMM_ON, false, 2, NULL), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->ex_launches, ex, "a 12.2 driver gets plain launches");
    kiln_ctx_free(ctx);
    unsetenv("FAKECUDA_DRIVER");

    setenv("FAKECUDA_GRAPH_NO_PDL", "1", 1);
    ctx = tu_fakecuda_ctx(0);
    int graphs = f->graph_launches;
    kiln_status s = pdl_steps(ctx, KILN_GEMM_ON, true, 1, NULL);
    cr_assert_eq(s, KILN_ERR_BACKEND);
    cr_assert(strstr(kiln_ctx_error(ctx), "programmatic launches captured"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(pdl_steps(ctx, KILN_GEMM_ON, true, 2, NULL), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(f->graph_launches, graphs + 2, "the next recording is plain and replays");
    kiln_ctx_free(ctx);
    unsetenv("FAKECUDA_GRAPH_NO_PDL");
    fflush(stderr);
    char buf[4096] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[n] = 0;
    int said = 0;
    for (const char *q = buf; (q = strstr(q, "programmatic dependent launch")); q++) said++;
    cr_assert_eq(said, 3, "one warning per backend (three contexts): %s", buf);
    cr_assert(strstr(buf, "CUDA_ERROR_NOT_SUPPORTED") && strstr(buf, "12.3") && strstr(buf, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
              "%s", buf);
}
