/* Tests of the Vulkan backend on whatever device is there (lavapipe in CI): hand-built kir
 * kernels that use every op run on the device and are compared with the kir interpreter (bit for
 * bit, except the approximate math ops) and with C references; memory at any 4-byte offset,
 * copies, record/replay with per-run parameters, timers, address errors. Each case runs with the
 * device's optional features and with them disabled (kiln_codegen_options.vk_disable). Skips, saying why, when
 * no Vulkan device is present. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "graph/dtype.h"
#include "sched/backend.h"
#include "model/presets.h"
#include "support/kirtest.h"
#include "support/testutil.h"
#ifdef KILN_HAVE_VULKAN
#include "backends/vulkan/vk.h"
#endif

#define OUT_STRIDE 128

static const kiln_backend_i *be = &kiln_backend_vulkan;

/* The backend, its kernels made without the features named in disable ("16bit,subgroup,dot"), as
 * a compile with those vk_disable options makes them. */
static void *open_vk(const char *disable)
{
    void *st = NULL;
    char detail[256];
    if (be->probe(NULL, &st, detail, sizeof detail) != KILN_OK) cr_skip("no Vulkan device: %s", detail);
#ifdef KILN_HAVE_VULKAN
    if (disable)
        ((kiln_vk *)st)->cg.vk_disable = (strstr(disable, "16bit") ? KILN_VK_NO_16BIT : 0) |
                                         (strstr(disable, "subgroup") ? KILN_VK_NO_SUBGROUP : 0) |
                                         (strstr(disable, "dot") ? KILN_VK_NO_DOT : 0);
#endif
    return st;
}

#define CHECK(call) do { char e_[512] = ""; kiln_status s_ = (call); (void)e_; cr_assert_eq(s_, KILN_OK, "%s", e_); } while (0)
#define E e_, sizeof e_

#ifdef KILN_HAVE_VULKAN
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Ops whose result Vulkan computes approximately: relative tolerance (absolute for sin/cos). */
static bool close_enough(uint8_t op, uint32_t got, uint32_t want)
{
    if (got == want) return true;
    float g = u2f(got), w = u2f(want);
    switch (op) {
    case KILN_KOP_LG2: return fabsf(g - w) <= 4e-6f * fabsf(w) + 1e-6f; /* absolute 2^-21 near 1 */
    case KILN_KOP_EX2: case KILN_KOP_RSQRT: case KILN_KOP_SQRT: return fabsf(g - w) <= 4e-6f * fabsf(w) + 1e-30f;
    case KILN_KOP_SIN: case KILN_KOP_COS: return fabsf(g - w) <= 1e-5f;
    /* Vulkan lets fma() round twice (lavapipe's does): the product's rounding shows */
    case KILN_KOP_FMA: return fabsf(g - w) <= 1e-6f * (fabsf(w) + 1.0f);
    default: return false;
    }
}

/* Runs the ALU kernel with the buffers placed at odd word offsets inside one allocation. */
static void run_alu(const char *disable, bool record)
{
    kiln_vk *s = open_vk(disable);
    kiln_kir k;
    uint32_t n_out;
    uint8_t ops[256];
    kt_build_alu(&k, &n_out, ops);
    uint32_t params[8] = {7, 12345, 0, 0, 0, 0, 0, 0};
    static uint32_t A[KT_IN_WORDS], B[KT_IN_WORDS];
    for (int i = 0; i < KT_IN_WORDS; i++) {
        A[i] = f2u((float)tu_uniform(-3.0, 3.0));
        B[i] = (uint32_t)tu_next();
    }
    size_t out_words = (size_t)KT_THREADS * OUT_STRIDE, half_words = KT_THREADS / 2;
    /* reference */
    uint32_t *ref = calloc(out_words, 4), *ref_h = calloc(half_words, 4);
    uint32_t *rb[5] = {params, A, B, ref, ref_h};
    char err[512];
    cr_assert(kt_interp(&k, rb, err, sizeof err), "%s", err);
    /* device: one allocation, slots at word offsets 1, 3 + ..., not 16-byte aligned */
    size_t off[5], total = 0, words[5] = {8, KT_IN_WORDS, KT_IN_WORDS, out_words, half_words};
    for (int i = 0; i < 5; i++) {
        off[i] = total * 4 + 4 * (size_t)(i % 2 ? 1 : 3) - 4 * (i == 0 ? 2 : 0); /* 1 or 3 words of gap */
        total = off[i] / 4 + words[i];
    }
    void *mem;
    CHECK(be->alloc(s, total * 4 + 64, &mem, E));
    void *addr[5];
    for (int i = 0; i < 5; i++) addr[i] = (char *)mem + off[i];
    uint32_t *got = malloc(out_words * 4), *got_h = malloc(half_words * 4);
    memset(got, 0xAB, out_words * 4);
    memset(got_h, 0xCD, half_words * 4);
    CHECK(be->upload(s, addr[0], params, sizeof params, E));
    CHECK(be->upload(s, addr[1], A, sizeof A, E));
    CHECK(be->upload(s, addr[2], B, sizeof B, E));
    CHECK(be->upload(s, addr[3], got, out_words * 4, E)); /* poison */
    CHECK(be->upload(s, addr[4], got_h, half_words * 4, E));
    kiln_vk_kernel *kern;
    CHECK(kiln_vk_kernel_new(s, &k, &kern, E));
    void *rec = NULL;
    if (record) {
        CHECK(be->record_begin(s, E));
        CHECK(kiln_vk_kernel_launch(s, kern, addr, E));
        CHECK(be->record_end(s, &rec, E));
        CHECK(be->replay(s, rec, E));
    } else {
        CHECK(kiln_vk_kernel_launch(s, kern, addr, E));
    }
    CHECK(be->download(s, got, addr[3], out_words * 4, E));
    CHECK(be->download(s, got_h, addr[4], half_words * 4, E));
    CHECK(be->sync(s, E));
    int bad = 0;
    for (uint32_t t = 0; t < KT_THREADS; t++)
        for (uint32_t j = 0; j < n_out; j++) {
            uint32_t g = got[t * OUT_STRIDE + j], w = ref[t * OUT_STRIDE + j];
            if (!close_enough(ops[j], g, w) && bad++ < 10)
                cr_log_error("thread %u output %u (%s): got %08x (%g), want %08x (%g)", t, j, kiln_kop_name(ops[j]), g, u2f(g), w, u2f(w));
        }
    for (uint32_t i = 0; i < half_words; i++)
        if (got_h[i] != ref_h[i] && bad++ < 10) cr_log_error("st16 word %u: got %08x, want %08x", i, got_h[i], ref_h[i]);
    cr_assert_eq(bad, 0, "%d outputs differ (features off: %s)", bad, disable ? disable : "none");
    if (record) { /* a new parameter value, the same recording */
        params[0] = 20;
        params[1] = 777;
        CHECK(be->upload(s, addr[0], params, sizeof params, E));
        CHECK(be->replay(s, rec, E));
        CHECK(be->download(s, got, addr[3], out_words * 4, E));
        CHECK(be->sync(s, E));
        cr_assert(kt_interp(&k, rb, err, sizeof err), "%s", err);
        for (uint32_t t = 0; t < KT_THREADS; t++)
            for (uint32_t j = 0; j < n_out; j++)
                cr_assert(close_enough(ops[j], got[t * OUT_STRIDE + j], ref[t * OUT_STRIDE + j]), "replay: thread %u output %u", t, j);
        be->record_free(s, rec);
    }
    kiln_vk_kernel_free(s, kern);
    be->free(s, mem);
    be->release(s);
    kiln_kir_free(&k);
    free(ref), free(ref_h), free(got), free(got_h);
}

/* MMA and LDS4 (emulated through shared memory in GLSL) against kt_ref_mma, the fragment layouts
 * written from the PTX ISA (test_cuda runs the same kernel on the tensor cores). */
static void run_mma(void)
{
    kiln_vk *s = open_vk(NULL);
    kiln_kir k;
    kt_build_mma(&k);
    enum { W = 4 * KT_MMA_BLOCK, O = KT_MMA_BLOCK * KT_MMA_OUT };
    uint32_t a[W], b[W], want[O], got[O];
    for (int i = 0; i < W; i++) a[i] = kt_mma_word(), b[i] = kt_mma_word();
    kt_ref_mma(a, b, want);
    void *p, *x, *y, *z;
    CHECK(be->alloc(s, 64, &p, E));
    CHECK(be->alloc(s, sizeof a, &x, E));
    CHECK(be->alloc(s, sizeof b, &y, E));
    CHECK(be->alloc(s, sizeof got, &z, E));
    kiln_vk_kernel *kern;
    CHECK(kiln_vk_kernel_new(s, &k, &kern, E));
    CHECK(be->upload(s, x, a, sizeof a, E));
    CHECK(be->upload(s, y, b, sizeof b, E));
    void *addr[4] = {p, x, y, z};
    CHECK(kiln_vk_kernel_launch(s, kern, addr, E));
    CHECK(be->download(s, got, z, sizeof got, E));
    CHECK(be->sync(s, E));
    for (int i = 0; i < O; i++) {
        float g, w;
        memcpy(&g, &got[i], 4), memcpy(&w, &want[i], 4);
        bool same = KT_MMA_EXACT(i % KT_MMA_OUT) ? got[i] == want[i] : fabsf(g - w) <= 1e-5f * (1 + fabsf(w));
        cr_assert(same, "output %d (thread %d, %d): got %08x (%g) want %08x (%g)", i, i / KT_MMA_OUT, i % KT_MMA_OUT, got[i], g, want[i], w);
    }
    kiln_vk_kernel_free(s, kern);
    be->free(s, p), be->free(s, x), be->free(s, y), be->free(s, z);
    be->release(s);
    kiln_kir_free(&k);
}

static void run_reduce(const char *disable)
{
    kiln_vk *s = open_vk(disable);
    kiln_kir k;
    kt_build_reduce(&k);
    float in[2 * KT_RED_BLOCK], want[2 * KT_RED_BLOCK * KT_RED_OUT], got[2 * KT_RED_BLOCK * KT_RED_OUT];
    tu_fill(in, 2 * KT_RED_BLOCK, -2.0f, 2.0f);
    kt_ref_reduce(in, want);
    void *p, *x, *y;
    CHECK(be->alloc(s, 64, &p, E));
    CHECK(be->alloc(s, sizeof in, &x, E));
    CHECK(be->alloc(s, sizeof got, &y, E));
    kiln_vk_kernel *kern;
    CHECK(kiln_vk_kernel_new(s, &k, &kern, E));
    if (!disable && s->feat.subgroup_size) /* the device's subgroups are really what runs */
        cr_assert(strstr(kiln_vk_kernel_glsl(kern), "subgroupAdd"), "%s", kiln_vk_kernel_glsl(kern));
    CHECK(be->upload(s, x, in, sizeof in, E));
    void *addr[3] = {p, x, y};
    CHECK(kiln_vk_kernel_launch(s, kern, addr, E));
    CHECK(be->download(s, got, y, sizeof got, E));
    CHECK(be->sync(s, E));
    for (int i = 0; i < 2 * KT_RED_BLOCK * KT_RED_OUT; i++)
        cr_assert(fabsf(got[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])), "output %d (thread %d, %d): got %g want %g (features off: %s)\n%s",
                  i, i / KT_RED_OUT, i % KT_RED_OUT, got[i], want[i], disable ? disable : "none", kiln_vk_kernel_glsl(kern));
    kiln_vk_kernel_free(s, kern);
    be->free(s, p), be->free(s, x), be->free(s, y);
    be->release(s);
    kiln_kir_free(&k);
}
#endif

Test(vulkan, mma_matches_fragment_layouts)
{
#ifdef KILN_HAVE_VULKAN
    run_mma();
#else
    cr_skip("kiln was built without Vulkan");
#endif
}

Test(vulkan, alu_kernel_matches_interpreter)
{
#ifdef KILN_HAVE_VULKAN
    run_alu(NULL, false);
#else
    cr_skip("kiln was built without Vulkan");
#endif
}

Test(vulkan, alu_kernel_without_features)
{
#ifdef KILN_HAVE_VULKAN
    run_alu("16bit,subgroup,dot", false);
#else
    cr_skip("kiln was built without Vulkan");
#endif
}

Test(vulkan, alu_kernel_recorded_and_replayed)
{
#ifdef KILN_HAVE_VULKAN
    run_alu(NULL, true);
#else
    cr_skip("kiln was built without Vulkan");
#endif
}

Test(vulkan, reductions_subgroups)
{
#ifdef KILN_HAVE_VULKAN
    run_reduce(NULL);
#else
    cr_skip("kiln was built without Vulkan");
#endif
}

Test(vulkan, reductions_shared_memory)
{
#ifdef KILN_HAVE_VULKAN
    run_reduce("subgroup");
#else
    cr_skip("kiln was built without Vulkan");
#endif
}

Test(vulkan, memory_offsets_copies_errors)
{
    void *s = open_vk(NULL);
    enum { N = 1000 };
    uint8_t src[N], dst[N], back[N];
    for (int i = 0; i < N; i++) src[i] = (uint8_t)tu_next();
    void *a, *b;
    CHECK(be->alloc(s, N + 64, &a, E));
    CHECK(be->alloc(s, N + 64, &b, E));
    cr_assert_not_null(a);
    CHECK(be->upload(s, (char *)a + 7, src, N, E)); /* any byte offset */
    CHECK(be->copy(s, (char *)b + 33, (char *)a + 7, N, E));
    memset(dst, 0x5A, N);
    memset(back, 0x5A, N);
    CHECK(be->download(s, dst, (char *)b + 33, N, E));
    CHECK(be->download(s, back, (char *)a + 7, N - 1, E));
    CHECK(be->sync(s, E));
    cr_assert(memcmp(dst, src, N) == 0, "copy then download");
    cr_assert(memcmp(back, src, N - 1) == 0 && back[N - 1] == 0x5A, "download size");
    char err[256];
    cr_assert_eq(be->upload(s, (char *)a + 100, src, N, err, sizeof err), KILN_ERR_INVALID_ARG, "overrun accepted");
    cr_assert(strstr(err, "overruns"), "%s", err);
    cr_assert_eq(be->download(s, dst, (void *)(uintptr_t)0x1234, 4, err, sizeof err), KILN_ERR_INVALID_ARG);
    be->free(s, b);
    cr_assert_eq(be->download(s, dst, b, 4, err, sizeof err), KILN_ERR_INVALID_ARG, "freed address accepted");
    /* timers around nothing, then around a copy */
    char e2[256];
    kiln_status ts = be->timer_mark(s, 0, e2, sizeof e2);
    if (ts == KILN_OK) {
        CHECK(be->copy(s, (char *)a + 500, a, 400, E));
        CHECK(be->timer_mark(s, 1, E));
        CHECK(be->sync(s, E));
        double sec = -1;
        CHECK(be->timer_read(s, 0, 1, &sec, E));
        cr_assert(sec >= 0 && sec < 10, "timer %g s", sec);
    } else {
        cr_log_info("no timestamps: %s", e2);
    }
    be->free(s, a);
    be->release(s);
}

Test(vulkan, out_of_memory_leaves_it_usable)
{
    void *s = open_vk(NULL);
    void *huge = (void *)1;
    char err[256] = "";
    kiln_status st = be->alloc(s, (size_t)1 << 39, &huge, err, sizeof err); /* 512 GiB */
    cr_assert_eq(st, KILN_ERR_NOMEM, "%s: %s", kiln_status_str(st), err);
    cr_assert_null(huge);
    cr_assert(strstr(err, "VK_ERROR_OUT_OF"), "%s", err);
    void *a;
    uint32_t in[16], out[16];
    for (int i = 0; i < 16; i++) in[i] = (uint32_t)tu_next();
    CHECK(be->alloc(s, sizeof in, &a, E));
    CHECK(be->upload(s, a, in, sizeof in, E));
    CHECK(be->download(s, out, a, sizeof out, E));
    CHECK(be->sync(s, E));
    cr_assert(memcmp(in, out, sizeof in) == 0);
    be->free(s, a);
    be->release(s);
}

/* A plan larger than the device's memory (weights summing past its largest device-local heap, each
 * of them small enough to allocate) is refused at compile before any allocation, naming the
 * plan's size, its largest weight and the device's memory; the context then compiles and runs a
 * small plan. The weights are borrowed from one untouched anonymous mapping. */
Test(vulkan, plan_larger_than_device_memory_is_refused)
{
    void *st = open_vk(NULL);
    uint64_t free_b = 0, total = 0;
    cr_assert(be->mem_info && be->mem_info(st, &free_b, &total), "the vulkan backend reports its memory");
    cr_assert(total > 0 && free_b <= total, "free %llu of %llu", (unsigned long long)free_b, (unsigned long long)total);
    be->release(st);
    const int64_t k = total <= (32ull << 30) ? 16384 : 32768; /* square f32 weights of 1 or 4 GiB */
    const size_t wbytes = (size_t)(k * k * 4);
    const int64_t n_w = (int64_t)(total / wbytes) + 2;
    if (n_w > 200) cr_skip("a %.0f GiB heap would take %lld weights", total / 1073741824.0, (long long)n_w);
    void *w = mmap(NULL, wbytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    cr_assert(w != MAP_FAILED);
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){1, k});
    kiln_node acc = KILN_NODE_NONE;
    for (int64_t i = 0; i < n_w; i++) { /* a chain, so that no two matmuls fuse as siblings */
        char name[32];
        snprintf(name, sizeof name, "w%lld", (long long)i);
        acc = kiln_matmul(g, acc == KILN_NODE_NONE ? x : acc, kiln_weight(g, name, KILN_DTYPE_F32, 2, (kiln_dim[]){k, k}, w, KILN_WEIGHT_BORROW));
    }
    cr_assert_eq(kiln_output(g, acc, "y"), KILN_OK, "%s", kiln_graph_error(g));
    kiln_plan *p = NULL;
    kiln_status s = kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p);
    cr_assert_eq(s, KILN_ERR_NOMEM, "%s: %s", kiln_status_str(s), kiln_ctx_error(ctx));
    cr_assert_null(p);
    const char *e = kiln_ctx_error(ctx);
    cr_assert(strstr(e, "GiB of vulkan device memory (weights ") && strstr(e, "the largest 'w") && strstr(e, "GiB free of "), "%s", e);
    kiln_graph_free(g);
    munmap(w, wbytes);
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_output(g, kiln_silu(g, kiln_input(g, "x", KILN_DTYPE_F32, 1, (kiln_dim[]){64})), "y");
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    float xv[64], yv[64];
    for (int i = 0; i < 64; i++) xv[i] = (float)tu_uniform(-4, 4);
    kiln_binding b[] = {{.name = "x", .data = xv, .bytes = sizeof xv}, {.name = "y", .data = yv, .bytes = sizeof yv}};
    cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    for (int i = 0; i < 64; i++) cr_assert_float_eq(yv[i], xv[i] / (1 + exp(-xv[i])), 1e-5 * (1 + fabs(xv[i])), "silu(%g)", xv[i]);
    kiln_plan_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* A llama-style layer (a small preset: lavapipe is slow) run for several steps (prefill of 4
 * tokens, then decode with growing n_kv) on vulkan and on ref through the public API: outputs
 * agree (ref, not cpu: cpu quantizes activations for q8_0 weights). */
static void preset_steps_vs(const kiln_preset *p, kiln_dtype wt, int T, const char *dev, const char *against)
{
    const char *name = p->name;
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    kiln_backend_info bi;
    for (int i = 0; i < kiln_backend_count(ctx); i++)
        if (kiln_backend_get(ctx, i, &bi) == KILN_OK && !strcmp(bi.name, dev) && !bi.available) {
            kiln_ctx_free(ctx);
            cr_skip("no %s device", dev);
        }
    enum { STEPS = 4 };
    int64_t hid = p->hidden;
    kiln_plan *plan[2];
    const char *bk[2] = {against, dev};
    for (int b = 0; b < 2; b++) {
        kiln_graph *g;
        cr_assert_eq(kiln_preset_build(p, wt, 1, T + 16, T, &g), KILN_OK);
        kiln_compile_options co = {.backend = bk[b]};
        cr_assert_eq(kiln_compile(ctx, g, &co, &plan[b]), KILN_OK, "%s on %s: %s", name, bk[b], kiln_ctx_error(ctx));
        kiln_graph_free(g);
    }
    float *x = malloc(sizeof(float) * T * hid), *y[2] = {malloc(sizeof(float) * T * hid), malloc(sizeof(float) * T * hid)};
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    int n_kv = 0;
    for (int step = 0; step < STEPS; step++) {
        int n_tok = step == 0 ? T : 1;
        for (int t = 0; t < n_tok; t++) pos[t] = n_kv + t;
        n_kv += n_tok;
        tu_fill(x, n_tok * hid, -1.0f, 1.0f);
        for (int b = 0; b < 2; b++) {
            for (int64_t i = 0; i < n_tok * hid; i++) y[b][i] = NAN;
            kiln_binding bd[] = {{.name = "n_tok", .value = n_tok}, {.name = "n_kv", .value = n_kv},
                                 {.name = "x", .data = x, .bytes = sizeof(float) * n_tok * hid},
                                 {.name = "pos", .data = pos, .bytes = 4 * (size_t)n_tok},
                                 {.name = "y", .data = y[b], .bytes = sizeof(float) * n_tok * hid}};
            cr_assert_eq(kiln_run(plan[b], bd, 5), KILN_OK, "%s step %d on %s: %s", name, step, bk[b], kiln_ctx_error(ctx));
        }
        double worst = 0, top = 0, se = 0, sr = 0;
        for (int64_t i = 0; i < n_tok * hid; i++) {
            cr_assert(isfinite(y[1][i]), "%s step %d: y[%ld] = %g on %s", name, step, (long)i, y[1][i], dev);
            double d = (double)y[1][i] - y[0][i];
            worst = fmax(worst, fabs(d));
            top = fmax(top, fabs(y[0][i]));
            se += d * d, sr += (double)y[0][i] * y[0][i];
        }
        if (kiln_dtype_block(wt) == 1) /* float weights: x is never rounded */
            cr_assert_leq(worst, 1e-4 * top, "%s %s step %d (n_tok %d, n_kv %d): max |%s - %s| %g of max |y| %g", name,
                          kiln_dtype_name(wt), step, n_tok, n_kv, dev, against, worst, top);
        else /* block weights: x quantized per 32 to int8 (contracts/matmul.yaml: NMSE 1e-4) */
            cr_assert_leq(se / fmax(sr, 1e-30), 1e-4, "%s %s step %d (n_tok %d, n_kv %d): NMSE %g (max |%s - %s| %g of %g)",
                          name, kiln_dtype_name(wt), step, n_tok, n_kv, se / fmax(sr, 1e-30), dev, against, worst, top);
    }
    free(x), free(y[0]), free(y[1]), free(pos);
    kiln_plan_free(plan[0]);
    kiln_plan_free(plan[1]);
    kiln_ctx_free(ctx);
}

static void preset_steps_on(const kiln_preset *p, kiln_dtype wt, int T, const char *dev) { preset_steps_vs(p, wt, T, dev, "ref"); }
static void preset_steps(const kiln_preset *p, kiln_dtype wt, int T) { preset_steps_on(p, wt, T, "vulkan"); }

Test(vulkan, preset_layer_matches_ref, .timeout = 600)
{
    const kiln_preset small = {.name = "small", .hidden = 64, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                               .ffn = 128, .rope = KILN_ROPE_NEOX, .theta = 1e4f, .eps = 1e-6f, .rope_mult = true};
    const kiln_dtype wt[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0};
    for (int i = 0; i < 2; i++) preset_steps(&small, wt[i], 4);
}

/* The same with a prefill of 12 tokens: the GEMM template (rms_norm prologue, neox rope and KV
 * writes, swiglu and residual epilogues) on tensor-core tiles, emulated on lavapipe. The normal-rope
 * layer carries per-pair rotary multipliers (llama 3.1's rope_freqs): its fused rope's table. One
 * test per preset: lavapipe compiles each layer's GEMM and flash pipelines with LLVM, and without
 * its shader cache both layers in one test timed out at 600 s on the loaded 2-core machine (110 s
 * of CPU by then). */
Test(vulkan, preset_layer_prefill_gemm_matches_ref, .timeout = 600)
{
    const kiln_preset small = {.name = "small", .hidden = 64, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                               .ffn = 128, .rope = KILN_ROPE_NEOX, .theta = 1e4f, .eps = 1e-6f};
    preset_steps(&small, KILN_DTYPE_F16, 12);
}

Test(vulkan, preset_layer_prefill_gemm_normal_rope_q8_0_matches_ref, .timeout = 600)
{
    const kiln_preset normal = {.name = "small-normal-rope", .hidden = 64, .n_head = 2, .n_kv_head = 1, .head_dim = 32,
                                .ffn = 96, .rope = KILN_ROPE_NORMAL, .theta = 1e4f, .eps = 1e-6f, .rope_mult = true};
    preset_steps(&normal, KILN_DTYPE_Q8_0, 12);
}

/* Every real preset's layer on CUDA against the cpu backend (skipped without a device): a prefill of
 * 100 tokens (the GEMM and the flash kernel), then 3 decode steps through the same plan (the
 * guarded gemv and split-attention kernels), for f16, q8_0 and q4_k weights. */
Test(vulkan, cuda_real_presets_prefill_match_cpu, .timeout = 900)
{
    static const char *names[] = {"qwen2-0.5b", "llama-7b", "qwen2-7b"};
    static const kiln_dtype wts[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        for (size_t w = 0; w < sizeof wts / sizeof *wts; w++) preset_steps_vs(kiln_preset_find(names[i]), wts[w], 100, "cuda", "cpu");
}

/* The same prefill on CUDA (skipped without a device): the GEMM on the tensor cores. */
Test(vulkan, cuda_preset_layer_prefill_gemm_matches_ref, .timeout = 600)
{
    const kiln_preset small = {.name = "small", .hidden = 64, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                               .ffn = 128, .rope = KILN_ROPE_NEOX, .theta = 1e4f, .eps = 1e-6f};
    const kiln_preset wide = {.name = "wide-normal-rope", .hidden = 256, .n_head = 4, .n_kv_head = 2, .head_dim = 64,
                              .ffn = 512, .rope = KILN_ROPE_NORMAL, .theta = 1e4f, .eps = 1e-6f};
    preset_steps_on(&small, KILN_DTYPE_F16, 12, "cuda");
    preset_steps_on(&wide, KILN_DTYPE_Q4_K, 16, "cuda");
    preset_steps_on(&wide, KILN_DTYPE_BF16, 16, "cuda");
}
