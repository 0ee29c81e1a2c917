/* Per-call cost of kiln_run on a GPU backend: a decode step of a preset (and a 16-element add, to
 * show the fixed part) run with host bindings (x uploaded, y downloaded, one sync) and with device
 * bindings (x and y device memory of the plan's device: copied device to device, no host round
 * trip), median wall time per call. The device memory is allocated here through libcuda (dlopen,
 * the primary context kiln uses too), as an inference engine holding its activations would.
 * JSON out. Usage: bench_overhead [preset] [layers] [steps] [backend]  (cuda only for device). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kiln/kiln.h"
#include "model/presets.h"

typedef unsigned long long devptr;
typedef struct cu {
    void *lib;
    int (*init)(unsigned);
    int (*device_get)(int *, int);
    int (*retain)(void **, int);
    int (*set_current)(void *);
    int (*alloc)(devptr *, size_t);
    int (*free_)(devptr);
} cu;

/* Device allocations through libcuda's primary context; false (and why) when there is none. */
static bool cu_open(cu *c, char *why, size_t n)
{
    memset(c, 0, sizeof *c);
    c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!c->lib) return snprintf(why, n, "libcuda.so.1 not found"), false;
    *(void **)&c->init = dlsym(c->lib, "cuInit");
    *(void **)&c->device_get = dlsym(c->lib, "cuDeviceGet");
    *(void **)&c->retain = dlsym(c->lib, "cuDevicePrimaryCtxRetain");
    *(void **)&c->set_current = dlsym(c->lib, "cuCtxSetCurrent");
    *(void **)&c->alloc = dlsym(c->lib, "cuMemAlloc_v2");
    *(void **)&c->free_ = dlsym(c->lib, "cuMemFree_v2");
    void *ctx = NULL;
    int dev = 0;
    if (!c->init || !c->device_get || !c->retain || !c->set_current || !c->alloc || !c->free_ || c->init(0) ||
        c->device_get(&dev, 0) || c->retain(&ctx, dev) || c->set_current(ctx))
        return snprintf(why, n, "libcuda has no usable device 0"), false;
    return true;
}

/* Median wall time (us) of `steps` runs of p with bindings b (after 3 warm-up runs). */
static double time_runs(kiln_plan *p, const kiln_binding *b, size_t nb, int steps, kiln_ctx *ctx, bool *ok)
{
    double *t = malloc(sizeof(double) * (size_t)steps), med = 0;
    *ok = t != NULL;
    for (int i = -3; *ok && i < steps; i++) {
        double t0 = (bench_now_s() * 1e6);
        kiln_status s = kiln_run(p, b, nb);
        double t1 = (bench_now_s() * 1e6);
        if (s != KILN_OK) {
            fprintf(stderr, "kiln_run: %s: %s\n", kiln_status_str(s), kiln_ctx_error(ctx));
            *ok = false;
        }
        if (i >= 0) t[i] = t1 - t0;
    }
    if (*ok) {
        qsort(t, (size_t)steps, sizeof *t, bench_cmp_double);
        med = t[steps / 2];
    }
    free(t);
    return med;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "qwen2-0.5b", *backend = argc > 4 ? argv[4] : "cuda";
    int layers = argc > 2 ? atoi(argv[2]) : 24, steps = argc > 3 ? atoi(argv[3]) : 200;
    const kiln_preset *pr = kiln_preset_find(name);
    if (!pr || layers < 1 || steps < 1 || steps > 100000) {
        fprintf(stderr, "usage: bench_overhead [preset] [layers] [steps] [backend]\n");
        return 2;
    }
    kiln_ctx *ctx;
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    enum { CTX = 1024 };
    kiln_graph *g = NULL, *tiny = NULL;
    if (kiln_preset_build(pr, KILN_DTYPE_Q8_0, layers, CTX, 1, &g) != KILN_OK) return 1;
    kiln_graph_new(&tiny);
    kiln_node a = kiln_input(tiny, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){16});
    kiln_output(tiny, kiln_add(tiny, a, a), "y");
    kiln_plan *p = NULL, *pt = NULL;
    kiln_compile_options co = {.backend = backend};
    if (kiln_compile(ctx, g, &co, &p) != KILN_OK || kiln_compile(ctx, tiny, &co, &pt) != KILN_OK) {
        printf("{\"error\": \"compile on %s: %s\"}\n", backend, kiln_ctx_error(ctx));
        return 1;
    }
    int64_t hid = pr->hidden;
    size_t xb = sizeof(float) * (size_t)hid;
    float *x = calloc((size_t)hid, sizeof(float)), *y = calloc((size_t)hid, sizeof(float)), tx[16] = {0}, ty[16];
    for (int64_t i = 0; i < hid; i++) x[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
    int32_t pos = CTX - 1;
    kiln_binding hb[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = CTX}, {.name = "x", .data = x, .bytes = xb},
                         {.name = "pos", .data = &pos, .bytes = 4}, {.name = "y", .data = y, .bytes = xb}};
    kiln_binding th[] = {{.name = "x", .data = tx, .bytes = sizeof tx}, {.name = "y", .data = ty, .bytes = sizeof ty}};
    bool ok1 = false, ok2 = false, ok3 = false, ok4 = false;
    double host = time_runs(p, hb, 5, steps, ctx, &ok1), tiny_host = time_runs(pt, th, 2, steps, ctx, &ok2);
    double dev = 0, tiny_dev = 0;
    char why[128] = "";
    cu c;
    if (!strcmp(backend, "cuda") && cu_open(&c, why, sizeof why)) {
        devptr dx = 0, dy = 0, tdx = 0, tdy = 0;
        if (c.alloc(&dx, xb) || c.alloc(&dy, xb) || c.alloc(&tdx, 64) || c.alloc(&tdy, 64)) {
            snprintf(why, sizeof why, "cuMemAlloc failed");
        } else {
            kiln_binding db[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = CTX},
                                 {.name = "x", .data = (void *)(uintptr_t)dx, .bytes = xb, .device = true},
                                 {.name = "pos", .data = &pos, .bytes = 4},
                                 {.name = "y", .data = (void *)(uintptr_t)dy, .bytes = xb, .device = true}};
            kiln_binding td[] = {{.name = "x", .data = (void *)(uintptr_t)tdx, .bytes = 64, .device = true},
                                 {.name = "y", .data = (void *)(uintptr_t)tdy, .bytes = 64, .device = true}};
            dev = time_runs(p, db, 5, steps, ctx, &ok3);
            tiny_dev = time_runs(pt, td, 2, steps, ctx, &ok4);
        }
        c.free_(dx), c.free_(dy), c.free_(tdx), c.free_(tdy);
    } else if (!why[0]) {
        snprintf(why, sizeof why, "device bindings are measured on cuda only");
    }
    printf("{\"preset\": \"%s\", \"layers\": %d, \"backend\": \"%s\", \"kernels\": %d, \"steps\": %d, \"n_kv\": %d, "
           "\"host_bound_us\": %.2f, \"device_bound_us\": %.2f, \"per_layer_host_us\": %.2f, \"per_layer_device_us\": %.2f, "
           "\"tiny_host_bound_us\": %.2f, \"tiny_device_bound_us\": %.2f, \"ok\": %s, \"note\": \"%s\"}\n",
           name, layers, kiln_plan_backend(p), kiln_plan_kernel_count(p), steps, CTX, host, dev, host / layers, dev / layers,
           tiny_host, tiny_dev, ok1 && ok2 && (why[0] || (ok3 && ok4)) ? "true" : "false", why);
    kiln_plan_free(p), kiln_plan_free(pt);
    kiln_graph_free(g), kiln_graph_free(tiny);
    free(x), free(y);
    kiln_ctx_free(ctx);
    return ok1 && ok2 ? 0 : 1;
}
