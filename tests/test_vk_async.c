/* kiln_run_async on the vulkan backend (lavapipe in CI) through the public API: steps queued with a
 * kiln_vk_sync give the synchronous run's bits (outputs poisoned first, host inputs overwritten as
 * soon as the call returns), several steps queued back to back see each other's KV writes, the
 * caller's wait semaphore gates a step (signalled from the host after the call), the signal
 * semaphore reports it done, binary semaphores order a step with the caller's own submissions on
 * kiln's queue, the caller's own VkBuffers bound as device memory (kiln_vk_buffer_register) give
 * the step with no host round trip, a bad kiln_vk_sync or a full queue is refused with nothing run and
 * the plan still usable, and a plan mixing cpu and vulkan kernels runs synchronously and signals.
 * Skips, saying why, when no Vulkan device is present. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/presets.h"
#include "support/testutil.h"
#ifdef KILN_HAVE_VULKAN
#include <vulkan/vulkan.h>
#endif

#ifdef KILN_HAVE_VULKAN

static kiln_ctx *ctx;
static kiln_vk_device dev;

static void setup(void)
{
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = 2}, &ctx), KILN_OK);
    if (kiln_ctx_vulkan(ctx, &dev) != KILN_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_ctx_error(ctx));
        kiln_ctx_free(ctx);
        ctx = NULL;
        cr_skip("no Vulkan device: %s", why);
    }
}
static void teardown(void) { kiln_ctx_free(ctx); }

TestSuite(vk_async, .init = setup, .fini = teardown, .timeout = 600);

enum { T = 4, STEPS = 5, HID = 64 };
static const kiln_preset small = {.name = "small", .hidden = HID, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                                  .ffn = 128, .rope = KILN_ROPE_NEOX, .theta = 1e4f, .eps = 1e-6f};

/* A one-layer decoder (f16 weights) on vulkan: a prefill of T tokens, then decode steps. */
static kiln_plan *layer_plan(void)
{
    kiln_graph *g;
    cr_assert_eq(kiln_preset_build(&small, KILN_DTYPE_F16, 1, T + 16, T, &g), KILN_OK);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    cr_assert_str_eq(kiln_plan_backend(p), "vulkan");
    return p;
}

/* The inputs of every step (fixed random data) and where step s's tokens start. */
typedef struct steps {
    float   x[STEPS][T * HID]; /* step s's activations */
    int32_t pos[STEPS][T];     /* its positions */
    int     n_tok[STEPS], n_kv[STEPS];
} steps;

static void make_steps(steps *s)
{
    int kv = 0;
    for (int i = 0; i < STEPS; i++) {
        s->n_tok[i] = i == 0 ? T : 1;
        for (int t = 0; t < s->n_tok[i]; t++) s->pos[i][t] = kv + t;
        kv += s->n_tok[i];
        s->n_kv[i] = kv;
        tu_fill(s->x[i], s->n_tok[i] * HID, -1.0f, 1.0f);
    }
}

static void bind_step(const steps *s, int i, float *x, int32_t *pos, float *y, kiln_binding b[5])
{
    memcpy(x, s->x[i], sizeof(float) * s->n_tok[i] * HID);
    memcpy(pos, s->pos[i], sizeof(int32_t) * s->n_tok[i]);
    b[0] = (kiln_binding){.name = "n_tok", .value = s->n_tok[i]};
    b[1] = (kiln_binding){.name = "n_kv", .value = s->n_kv[i]};
    b[2] = (kiln_binding){.name = "x", .data = x, .bytes = sizeof(float) * s->n_tok[i] * HID};
    b[3] = (kiln_binding){.name = "pos", .data = pos, .bytes = 4 * (size_t)s->n_tok[i]};
    b[4] = (kiln_binding){.name = "y", .data = y, .bytes = sizeof(float) * s->n_tok[i] * HID};
}

/* Every step through kiln_run on a fresh plan: the outputs to match, and the final k0 state. */
static void sync_steps(const steps *s, float want[STEPS][T * HID], void **kstate, size_t *kbytes)
{
    kiln_plan *p = layer_plan();
    float x[T * HID];
    int32_t pos[T];
    kiln_binding b[5];
    for (int i = 0; i < STEPS; i++) {
        tu_poison(want[i], sizeof want[i]);
        bind_step(s, i, x, pos, want[i], b);
        cr_assert_eq(kiln_run(p, b, 5), KILN_OK, "step %d: %s", i, kiln_ctx_error(ctx));
        for (int k = 0; k < s->n_tok[i] * HID; k++) cr_assert(isfinite(want[i][k]), "sync step %d: y[%d] = %g", i, k, want[i][k]);
    }
    kiln_tensor_info ti;
    cr_assert_eq(kiln_plan_tensor(p, "k0", &ti), KILN_OK, "%s", kiln_ctx_error(ctx));
    *kbytes = ti.bytes;
    *kstate = malloc(ti.bytes);
    cr_assert_eq(kiln_plan_state_read(p, "k0", *kstate, ti.bytes), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan_free(p);
}

/* Fresh steps in s and their outputs by kiln_run in want (the KV state they leave is not kept). */
static void want_steps(steps *s, float want[STEPS][T * HID])
{
    make_steps(s);
    void *kwant;
    size_t kbytes;
    sync_steps(s, want, &kwant, &kbytes);
    free(kwant);
}

static void assert_step_bits(const steps *s, int i, const float *got, const float *want)
{
    size_t n = sizeof(float) * s->n_tok[i] * HID;
    if (memcmp(got, want, n) == 0) return;
    for (int k = 0; k < s->n_tok[i] * HID; k++)
        cr_assert(memcmp(&got[k], &want[k], 4) == 0, "step %d: y[%d] = %a async, %a sync", i, k, got[k], want[k]);
}

static VkSemaphore timeline_semaphore(uint64_t initial)
{
    VkSemaphoreTypeCreateInfo ti = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO, .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE,
                                    .initialValue = initial};
    VkSemaphoreCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, .pNext = &ti};
    VkSemaphore sem = VK_NULL_HANDLE;
    cr_assert_eq(vkCreateSemaphore((VkDevice)dev.device, &ci, NULL, &sem), VK_SUCCESS);
    return sem;
}

static uint64_t counter(VkSemaphore sem)
{
    uint64_t v = 0;
    cr_assert_eq(vkGetSemaphoreCounterValue((VkDevice)dev.device, sem, &v), VK_SUCCESS);
    return v;
}

static void host_signal(VkSemaphore sem, uint64_t v)
{
    VkSemaphoreSignalInfo si = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = sem, .value = v};
    cr_assert_eq(vkSignalSemaphore((VkDevice)dev.device, &si), VK_SUCCESS);
}

static bool wait_value(VkSemaphore sem, uint64_t v, uint64_t timeout_ns)
{
    VkSemaphoreWaitInfo wi = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, .semaphoreCount = 1, .pSemaphores = &sem, .pValues = &v};
    return vkWaitSemaphores((VkDevice)dev.device, &wi, timeout_ns) == VK_SUCCESS;
}

static uint64_t h(VkSemaphore s) { return (uint64_t)(uintptr_t)s; }
static uint64_t hb(VkBuffer b) { return (uint64_t)(uintptr_t)b; }

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Every step queued back to back before one wait (each reads the KV rows its predecessor wrote),
 * from one x/pos buffer overwritten with NaN as soon as each call returns: the outputs and the
 * final KV state are the synchronous run's bits. A timeline semaphore signalled per step counts
 * them. */
Test(vk_async, steps_queued_back_to_back_match_sync_bits)
{
    static steps s;
    make_steps(&s);
    static float want[STEPS][T * HID], got[STEPS][T * HID];
    void *kwant;
    size_t kbytes;
    sync_steps(&s, want, &kwant, &kbytes);

    kiln_plan *p = layer_plan();
    VkSemaphore done = timeline_semaphore(0);
    float x[T * HID];
    int32_t pos[T];
    kiln_binding b[5];
    for (int i = 0; i < STEPS; i++) {
        tu_poison(got[i], sizeof got[i]);
        bind_step(&s, i, x, pos, got[i], b);
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC, .signal = h(done), .signal_value = (uint64_t)i + 1};
        cr_assert_eq(kiln_run_async(p, b, 5, &sy), KILN_OK, "step %d: %s", i, kiln_ctx_error(ctx));
        tu_poison(x, sizeof x); /* the call copied them */
        tu_poison(pos, sizeof pos);
    }
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
    /* lavapipe signals the fence kiln waits for a moment before it sets the timeline value */
    cr_assert(wait_value(done, STEPS, 10ull * 1000000000ull), "the signal semaphore counts every step");
    cr_assert_eq(counter(done), STEPS, "the signal semaphore counts every step, no more");
    for (int i = 0; i < STEPS; i++) assert_step_bits(&s, i, got[i], want[i]);
    void *k = malloc(kbytes);
    cr_assert_eq(kiln_plan_state_read(p, "k0", k, kbytes), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(memcmp(k, kwant, kbytes) == 0, "the KV state after the queued steps is the synchronous run's");
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "a plan with nothing queued");
    free(k), free(kwant);
    vkDestroySemaphore((VkDevice)dev.device, done, NULL);
    kiln_plan_free(p);
}

/* The caller's timeline wait semaphore, signalled from the host after the call, gates the step:
 * nothing of it runs before (its signal semaphore stays at 0 for 300 ms), all of it after. A NULL
 * stream runs the step as kiln_run does (outputs written when the call returns). */
Test(vk_async, wait_semaphore_gates_the_step)
{
    cr_assert(dev.timeline, "lavapipe has timeline semaphores");
    static steps s;
    make_steps(&s);
    static float want[STEPS][T * HID], got[STEPS][T * HID];
    void *kwant;
    size_t kbytes;
    sync_steps(&s, want, &kwant, &kbytes);
    free(kwant);

    kiln_plan *p = layer_plan();
    VkSemaphore go = timeline_semaphore(0), done = timeline_semaphore(0);
    float x[T * HID];
    int32_t pos[T];
    kiln_binding b[5];
    tu_poison(got[0], sizeof got[0]);
    bind_step(&s, 0, x, pos, got[0], b);
    cr_assert_eq(kiln_run_async(p, b, 5, NULL), KILN_OK, "%s", kiln_ctx_error(ctx));
    assert_step_bits(&s, 0, got[0], want[0]); /* no kiln_vk_sync: synchronous */
    for (int i = 1; i < 3; i++) {
        tu_poison(got[i], sizeof got[i]);
        bind_step(&s, i, x, pos, got[i], b);
        uint64_t w = h(go), wv = (uint64_t)i;
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1, .wait = &w, .wait_value = &wv, .signal = h(done), .signal_value = (uint64_t)i};
        cr_assert_eq(kiln_run_async(p, b, 5, &sy), KILN_OK, "step %d: %s", i, kiln_ctx_error(ctx));
        sleep_ms(300);
        cr_assert_eq(counter(done), (uint64_t)i - 1, "step %d ran before its wait semaphore reached %d", i, i);
        host_signal(go, (uint64_t)i);
        cr_assert(wait_value(done, (uint64_t)i, 60ull * 1000000000ull), "step %d: not done 60 s after its semaphore", i);
        cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
        assert_step_bits(&s, i, got[i], want[i]);
    }
    vkDestroySemaphore((VkDevice)dev.device, go, NULL);
    vkDestroySemaphore((VkDevice)dev.device, done, NULL);
    kiln_plan_free(p);
}

/* Watchdog of plan_wait_waits_for_its_own_steps_only: signals the gate itself if the first plan's
 * kiln_plan_wait has not returned 10 s on (so that a wait for the whole queue ends, and fails). */
typedef struct watchdog {
    VkSemaphore gate;
    _Atomic int waited; /* the first plan's kiln_plan_wait returned */
    _Atomic int fired;  /* the watchdog signalled the gate */
} watchdog;

static void *watch(void *arg)
{
    watchdog *w = arg;
    for (int i = 0; i < 1000 && !w->waited; i++) sleep_ms(10);
    if (!w->waited) {
        w->fired = 1;
        VkSemaphoreSignalInfo si = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = w->gate, .value = 1};
        vkSignalSemaphore((VkDevice)dev.device, &si);
    }
    return NULL;
}

/* kiln_plan_wait waits for its own plan's steps only: plan A queues two steps, then plan B (same
 * context, same queue) queues one gated by a timeline value nobody has signalled yet. A's wait
 * returns with A's outputs (kiln_run's bits) while B's step is still gated (its done counter at 0);
 * a wait for the whole queue would block until the watchdog opens the gate 10 s on, and fail. Then
 * the gate opens and B's wait gives B's step. */
Test(vk_async, plan_wait_waits_for_its_own_steps_only)
{
    cr_assert(dev.timeline, "lavapipe has timeline semaphores");
    static steps s;
    make_steps(&s);
    static float want[STEPS][T * HID], got[STEPS][T * HID], gotb[T * HID];
    void *kwant;
    size_t kbytes;
    sync_steps(&s, want, &kwant, &kbytes);
    free(kwant);

    kiln_plan *pa = layer_plan(), *pb = layer_plan();
    VkSemaphore go = timeline_semaphore(0), done_b = timeline_semaphore(0);
    float x[T * HID], xb[T * HID];
    int32_t pos[T], posb[T];
    kiln_binding b[5], bb[5];
    for (int i = 0; i < 2; i++) {
        tu_poison(got[i], sizeof got[i]);
        bind_step(&s, i, x, pos, got[i], b);
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
        cr_assert_eq(kiln_run_async(pa, b, 5, &sy), KILN_OK, "A step %d: %s", i, kiln_ctx_error(ctx));
    }
    tu_poison(gotb, sizeof gotb);
    bind_step(&s, 0, xb, posb, gotb, bb);
    uint64_t w = h(go), wv = 1;
    kiln_vk_sync gated = {.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1, .wait = &w, .wait_value = &wv, .signal = h(done_b), .signal_value = 1};
    cr_assert_eq(kiln_run_async(pb, bb, 5, &gated), KILN_OK, "B: %s", kiln_ctx_error(ctx));

    watchdog wd = {.gate = go};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, watch, &wd), 0);
    kiln_status st = kiln_plan_wait(pa);
    wd.waited = 1;
    bool fired = wd.fired;
    uint64_t b_done = fired ? 1 : counter(done_b);
    pthread_join(th, NULL);
    cr_assert_eq(st, KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(!fired, "plan A's kiln_plan_wait waited for plan B's gated step (returned only when the watchdog opened the gate)");
    cr_assert_eq(b_done, 0, "plan B's step ran before its gate");
    for (int i = 0; i < 2; i++) assert_step_bits(&s, i, got[i], want[i]);

    host_signal(go, 1);
    cr_assert_eq(kiln_plan_wait(pb), KILN_OK, "%s", kiln_ctx_error(ctx));
    assert_step_bits(&s, 0, gotb, want[0]);
    /* lavapipe signals the fence kiln waits for a moment before it sets the timeline value */
    cr_assert(wait_value(done_b, 1, 10ull * 1000000000ull), "plan B's signal semaphore was signalled");
    vkDestroySemaphore((VkDevice)dev.device, go, NULL);
    vkDestroySemaphore((VkDevice)dev.device, done_b, NULL);
    kiln_plan_free(pa);
    kiln_plan_free(pb);
}

/* Staging memory of queued steps is sized to them: KILN_VK_MAX_PENDING decode steps queued at once
 * (one token each: x, pos and y are a few hundred bytes) hold at most 192 KiB of host-visible
 * staging memory each above what the context held before (kiln.h's bound: 4 x the staged bytes +
 * 128 KiB; with 16 MiB per step, as before, it was over 100 MiB), a second round reuses the first
 * round's buffers (no more held than during the first), and every step has kiln_run's bits. */
Test(vk_async, queued_steps_hold_staging_sized_to_them)
{
    enum { N = KILN_VK_MAX_PENDING, R = 2 };
    kiln_plan *p = layer_plan(), *ref = layer_plan();
    static float x0[T * HID], y0[T * HID], xs[R][N][HID], want[R][N][HID], got[R][N][HID];
    int32_t pos0[T];
    tu_fill(x0, T * HID, -1.0f, 1.0f);
    for (int t = 0; t < T; t++) pos0[t] = t;
    kiln_binding pre[] = {{.name = "n_tok", .value = T}, {.name = "n_kv", .value = T}, {.name = "x", .data = x0, .bytes = sizeof x0},
                          {.name = "pos", .data = pos0, .bytes = sizeof pos0}, {.name = "y", .data = y0, .bytes = sizeof y0}};
    cr_assert_eq(kiln_run(ref, pre, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) {
            tu_fill(xs[r][i], HID, -1.0f, 1.0f);
            int32_t pos = T + r * N + i;
            tu_poison(want[r][i], sizeof want[r][i]);
            kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = pos + 1}, {.name = "x", .data = xs[r][i], .bytes = sizeof xs[r][i]},
                                {.name = "pos", .data = &pos, .bytes = 4}, {.name = "y", .data = want[r][i], .bytes = sizeof want[r][i]}};
            cr_assert_eq(kiln_run(ref, b, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        }
    cr_assert_eq(kiln_run(p, pre, 5), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_plan_stats st;
    cr_assert_eq(kiln_plan_stats_get(p, &st), KILN_OK);
    uint64_t before = st.staging_bytes, held[R];
    cr_assert_gt(before, 0, "synchronous runs staged through host-visible memory");
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < N; i++) {
            float x[HID];
            memcpy(x, xs[r][i], sizeof x);
            int32_t pos = T + r * N + i;
            tu_poison(got[r][i], sizeof got[r][i]);
            kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = pos + 1}, {.name = "x", .data = x, .bytes = sizeof x},
                                {.name = "pos", .data = &pos, .bytes = 4}, {.name = "y", .data = got[r][i], .bytes = sizeof got[r][i]}};
            kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
            cr_assert_eq(kiln_run_async(p, b, 5, &sy), KILN_OK, "round %d step %d: %s", r, i, kiln_ctx_error(ctx));
            tu_poison(x, sizeof x);
            pos = -1;
        }
        cr_assert_eq(kiln_plan_stats_get(p, &st), KILN_OK);
        held[r] = st.staging_bytes;
        cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
        for (int i = 0; i < N; i++)
            for (int k = 0; k < HID; k++)
                cr_assert(memcmp(&got[r][i][k], &want[r][i][k], 4) == 0, "round %d step %d: y[%d] = %a async, %a sync", r, i, k, got[r][i][k], want[r][i][k]);
    }
    uint64_t step_max = 192u << 10;
    cr_assert_geq(held[0], before);
    cr_assert_leq(held[0] - before, N * step_max, "%d queued one-token steps hold %llu bytes of staging memory (at most %llu)", N,
                  (unsigned long long)(held[0] - before), (unsigned long long)(N * step_max));
    cr_assert_leq(held[1], held[0], "the second round holds %llu bytes, the first %llu: staging buffers are reused", (unsigned long long)held[1],
                  (unsigned long long)held[0]);
    kiln_plan_free(p);
    kiln_plan_free(ref);
}

/* A step staging more than one small buffer holds (input and output of 200 KiB each, two queued):
 * its buffers grow with it, within kiln.h's bound (4 x its staged bytes + 128 KiB), and the outputs
 * are kiln_run's bits. */
Test(vk_async, large_step_staging_grows_within_its_bound)
{
    enum { ROWS = 200, N = 256 };
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){ROWS, N});
    kiln_output(g, kiln_silu(g, x), "y");
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    static float xv[2][ROWS * N], want[2][ROWS * N], got[2][ROWS * N];
    for (int i = 0; i < 2; i++) {
        tu_fill(xv[i], ROWS * N, -3.0f, 3.0f);
        tu_poison(want[i], sizeof want[i]);
        kiln_binding b[] = {{.name = "x", .data = xv[i], .bytes = sizeof xv[i]}, {.name = "y", .data = want[i], .bytes = sizeof want[i]}};
        cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    }
    kiln_plan_stats st;
    cr_assert_eq(kiln_plan_stats_get(p, &st), KILN_OK);
    uint64_t before = st.staging_bytes;
    for (int i = 0; i < 2; i++) {
        tu_poison(got[i], sizeof got[i]);
        kiln_binding b[] = {{.name = "x", .data = xv[i], .bytes = sizeof xv[i]}, {.name = "y", .data = got[i], .bytes = sizeof got[i]}};
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
        cr_assert_eq(kiln_run_async(p, b, 2, &sy), KILN_OK, "%s", kiln_ctx_error(ctx));
    }
    cr_assert_eq(kiln_plan_stats_get(p, &st), KILN_OK);
    uint64_t held = st.staging_bytes - before, staged = 2 * sizeof xv[0] + 64, bound = 2 * (4 * staged + (128u << 10));
    cr_assert_leq(held, bound, "two steps of %llu staged bytes each hold %llu bytes (bound %llu)", (unsigned long long)staged,
                  (unsigned long long)held, (unsigned long long)bound);
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(memcmp(got, want, sizeof got) == 0, "the queued steps have kiln_run's bits");
    kiln_plan_free(p);
}

/* Binary semaphores: the caller signals one on kiln's queue (an empty submission, while no kiln call
 * runs), the step waits for it (wait_value NULL) and signals another binary one, which the caller's
 * next submission waits for (its fence then says the step is done). kiln_ctx_vulkan describes the
 * device the handles belong to. */
Test(vk_async, binary_semaphores_order_the_step_with_the_callers_submissions)
{
    cr_assert(dev.instance && dev.physical_device && dev.device && dev.queue, "kiln_ctx_vulkan gives every handle");
    cr_assert_geq(dev.api_version, VK_API_VERSION_1_1);
    static steps s;
    static float want[STEPS][T * HID], got[T * HID];
    want_steps(&s, want);
    kiln_plan *p = layer_plan();
    VkDevice d = (VkDevice)dev.device;
    VkQueue q = (VkQueue)dev.queue;
    VkSemaphoreCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    VkSemaphore before, after;
    cr_assert_eq(vkCreateSemaphore(d, &ci, NULL, &before), VK_SUCCESS);
    cr_assert_eq(vkCreateSemaphore(d, &ci, NULL, &after), VK_SUCCESS);
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    cr_assert_eq(vkCreateFence(d, &fi, NULL, &fence), VK_SUCCESS);
    float x[T * HID];
    int32_t pos[T];
    kiln_binding b[5];
    for (int i = 0; i < 2; i++) {
        VkSubmitInfo sig = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .signalSemaphoreCount = 1, .pSignalSemaphores = &before};
        kiln_vk_queue_lock(ctx, true);
        cr_assert_eq(vkQueueSubmit(q, 1, &sig, VK_NULL_HANDLE), VK_SUCCESS);
        kiln_vk_queue_lock(ctx, false);
        tu_poison(got, sizeof got);
        bind_step(&s, i, x, pos, got, b);
        uint64_t w = h(before);
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1, .wait = &w, .signal = h(after)};
        cr_assert_eq(kiln_run_async(p, b, 5, &sy), KILN_OK, "step %d: %s", i, kiln_ctx_error(ctx));
        VkPipelineStageFlags st = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        VkSubmitInfo wt = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .waitSemaphoreCount = 1, .pWaitSemaphores = &after, .pWaitDstStageMask = &st};
        kiln_vk_queue_lock(ctx, true);
        cr_assert_eq(vkQueueSubmit(q, 1, &wt, fence), VK_SUCCESS);
        kiln_vk_queue_lock(ctx, false);
        cr_assert_eq(vkWaitForFences(d, 1, &fence, VK_TRUE, 60ull * 1000000000ull), VK_SUCCESS);
        cr_assert_eq(vkResetFences(d, 1, &fence), VK_SUCCESS);
        cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
        assert_step_bits(&s, i, got, want[i]);
    }
    vkDestroyFence(d, fence, NULL);
    vkDestroySemaphore(d, before, NULL);
    vkDestroySemaphore(d, after, NULL);
    kiln_plan_free(p);
}

/* A host-visible VkBuffer of the caller's on kiln's device, mapped. */
typedef struct cbuf {
    VkBuffer       buf;
    VkDeviceMemory mem;
    void          *map;
} cbuf;

static cbuf caller_buffer(VkDeviceSize bytes)
{
    VkDevice d = (VkDevice)dev.device;
    cbuf c = {0};
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes,
                             .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    cr_assert_eq(vkCreateBuffer(d, &bi, NULL, &c.buf), VK_SUCCESS);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d, c.buf, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties((VkPhysicalDevice)dev.physical_device, &mp);
    VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t t = 0;
    while (t < mp.memoryTypeCount && !((req.memoryTypeBits >> t & 1) && (mp.memoryTypes[t].propertyFlags & want) == want)) t++;
    cr_assert_lt(t, mp.memoryTypeCount, "a host-visible coherent memory type");
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = t};
    cr_assert_eq(vkAllocateMemory(d, &ai, NULL, &c.mem), VK_SUCCESS);
    cr_assert_eq(vkBindBufferMemory(d, c.buf, c.mem, 0), VK_SUCCESS);
    cr_assert_eq(vkMapMemory(d, c.mem, 0, VK_WHOLE_SIZE, 0, &c.map), VK_SUCCESS);
    return c;
}

static void caller_buffer_free(cbuf *c)
{
    vkDestroyBuffer((VkDevice)dev.device, c->buf, NULL);
    vkFreeMemory((VkDevice)dev.device, c->mem, NULL);
}

/* An engine's step with no host round trip: x and y in the caller's own VkBuffers (registered,
 * bound as device memory at offsets), the step queued with a timeline signal; the caller waits for
 * the semaphore only (no kiln_plan_wait) and reads y with kiln_run's bits. A range past the
 * registered size and an unregistered address are refused; the plan stays usable. */
Test(vk_async, callers_buffers_bound_as_device_memory)
{
    static steps s;
    static float want[STEPS][T * HID];
    want_steps(&s, want);
    kiln_plan *p = layer_plan();
    enum { OFF = 256 }; /* bytes before each tensor in its buffer */
    const size_t xy = sizeof(float) * T * HID;
    cbuf bx = caller_buffer(OFF + xy), by = caller_buffer(OFF + xy);
    void *ax, *ay;
    cr_assert_eq(kiln_vk_buffer_register(ctx, hb(bx.buf), OFF + xy, &ax), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_vk_buffer_register(ctx, hb(by.buf), OFF + xy, &ay), KILN_OK, "%s", kiln_ctx_error(ctx));
    VkSemaphore done = timeline_semaphore(0);
    float x[T * HID];
    int32_t pos[T];
    kiln_binding b[5];
    for (int i = 0; i < 3; i++) {
        float y[T * HID];
        bind_step(&s, i, x, pos, y, b);
        memcpy((char *)bx.map + OFF, x, b[2].bytes);
        tu_poison((char *)by.map + OFF, xy);
        b[2] = (kiln_binding){.name = "x", .data = (char *)ax + OFF, .bytes = b[2].bytes, .device = true};
        b[4] = (kiln_binding){.name = "y", .data = (char *)ay + OFF, .bytes = b[4].bytes, .device = true};
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC, .signal = h(done), .signal_value = (uint64_t)i + 1};
        cr_assert_eq(kiln_run_async(p, b, 5, &sy), KILN_OK, "step %d: %s", i, kiln_ctx_error(ctx));
        cr_assert(wait_value(done, (uint64_t)i + 1, 60ull * 1000000000ull), "step %d: not signalled", i);
        assert_step_bits(&s, i, (const float *)((char *)by.map + OFF), want[i]);
    }
    b[2].data = (char *)ax + OFF + xy - b[2].bytes + 4; /* its last 4 bytes past the registered range */
    kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
    kiln_status st = kiln_run_async(p, b, 5, &sy);
    cr_assert_neq(st, KILN_OK);
    cr_assert(strstr(kiln_ctx_error(ctx), "overruns"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_vk_buffer_unregister(ctx, ax), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_vk_buffer_unregister(ctx, ax), KILN_ERR_INVALID_ARG, "twice");
    b[2].data = ax;
    st = kiln_run_async(p, b, 5, &sy);
    cr_assert_neq(st, KILN_OK, "an unregistered buffer's address");
    cr_assert(strstr(kiln_ctx_error(ctx), "not a live vulkan address"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_vk_buffer_unregister(ctx, ay), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_vk_buffer_register(ctx, 0, 16, &ax), KILN_ERR_INVALID_ARG);
    static float y[T * HID]; /* the plan still runs from host memory, the KV state as the steps left it */
    bind_step(&s, 3, x, pos, y, b);
    tu_poison(y, sizeof y);
    cr_assert_eq(kiln_run_async(p, b, 5, &sy), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
    assert_step_bits(&s, 3, y, want[3]);
    caller_buffer_free(&bx);
    caller_buffer_free(&by);
    vkDestroySemaphore((VkDevice)dev.device, done, NULL);
    kiln_plan_free(p);
}

/* A kiln_vk_sync that is wrong in any way is refused before anything runs (the output keeps its
 * poison, the KV state is untouched: the next good step still matches the synchronous run). */
Test(vk_async, bad_sync_is_refused_and_kiln_stays_usable)
{
    static steps s;
    static float want[STEPS][T * HID], got[T * HID];
    want_steps(&s, want);
    kiln_plan *p = layer_plan();
    VkSemaphore sem = timeline_semaphore(0);
    uint64_t w = h(sem), zero = 0, nine[9] = {w, w, w, w, w, w, w, w, w};
    const struct {
        kiln_vk_sync sy;
        kiln_status want;
        const char *says;
    } bad[] = {
        {{.magic = 0x1234}, KILN_ERR_INVALID_ARG, "not a kiln_vk_sync"},
        {{.magic = KILN_VK_SYNC_MAGIC, .n_wait = 9, .wait = nine}, KILN_ERR_INVALID_ARG, "9 wait semaphores"},
        {{.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1}, KILN_ERR_INVALID_ARG, "NULL wait array"},
        {{.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1, .wait = &zero}, KILN_ERR_INVALID_ARG, "wait semaphore 0 is VK_NULL_HANDLE"},
        {{.magic = KILN_VK_SYNC_MAGIC, .signal_value = 3}, KILN_ERR_INVALID_ARG, "without a signal semaphore"},
    };
    float x[T * HID];
    int32_t pos[T];
    kiln_binding b[5];
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        tu_poison(got, sizeof got);
        bind_step(&s, 0, x, pos, got, b);
        kiln_status st = kiln_run_async(p, b, 5, (void *)&bad[k].sy);
        cr_assert_eq(st, bad[k].want, "case %zu: %s: %s", k, kiln_status_str(st), kiln_ctx_error(ctx));
        cr_assert(strstr(kiln_ctx_error(ctx), bad[k].says), "case %zu: %s", k, kiln_ctx_error(ctx));
        cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
        float poison;
        tu_poison(&poison, sizeof poison);
        cr_assert(memcmp(got, &poison, 4) == 0, "case %zu: the refused step wrote its output", k);
    }
    for (int i = 0; i < 2; i++) { /* the prefill and a decode step: the state is as if nothing had run */
        tu_poison(got, sizeof got);
        bind_step(&s, i, x, pos, got, b);
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
        cr_assert_eq(kiln_run_async(p, b, 5, &sy), KILN_OK, "%s", kiln_ctx_error(ctx));
        cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
        assert_step_bits(&s, i, got, want[i]);
    }
    vkDestroySemaphore((VkDevice)dev.device, sem, NULL);
    kiln_plan_free(p);
}

/* With the first step gated, KILN_VK_MAX_PENDING steps queue and the next is refused with
 * KILN_ERR_BUSY (nothing enqueued); once the gate opens and the plan is waited for, every queued
 * step has the synchronous run's bits and the refused one can be queued again. */
Test(vk_async, a_full_queue_is_refused_busy)
{
    enum { N = KILN_VK_MAX_PENDING + 1 };
    static float want[N][T * HID], got[N][T * HID];
    static float x[N][T * HID];
    static int32_t pos[N][T];
    tu_fill(x[0], (int64_t)N * T * HID, -1.0f, 1.0f);
    kiln_plan *ref = layer_plan(), *p = layer_plan();
    kiln_binding b[N][5];
    for (int i = 0; i < N; i++) { /* a prefill, then decode steps */
        int n_tok = i == 0 ? T : 1, n_kv = i == 0 ? T : T + i;
        for (int t = 0; t < n_tok; t++) pos[i][t] = n_kv - n_tok + t;
        b[i][0] = (kiln_binding){.name = "n_tok", .value = n_tok};
        b[i][1] = (kiln_binding){.name = "n_kv", .value = n_kv};
        b[i][2] = (kiln_binding){.name = "x", .data = x[i], .bytes = sizeof(float) * n_tok * HID};
        b[i][3] = (kiln_binding){.name = "pos", .data = pos[i], .bytes = 4 * (size_t)n_tok};
        b[i][4] = (kiln_binding){.name = "y", .data = want[i], .bytes = sizeof(float) * n_tok * HID};
        cr_assert_eq(kiln_run(ref, b[i], 5), KILN_OK, "%s", kiln_ctx_error(ctx));
        b[i][4].data = got[i];
        tu_poison(got[i], sizeof got[i]);
    }
    VkSemaphore go = timeline_semaphore(0);
    uint64_t w = h(go), one = 1;
    for (int i = 0; i < N; i++) {
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC, .n_wait = i == 0, .wait = &w, .wait_value = &one};
        kiln_status st = kiln_run_async(p, b[i], 5, &sy);
        if (i < KILN_VK_MAX_PENDING) {
            cr_assert_eq(st, KILN_OK, "step %d: %s", i, kiln_ctx_error(ctx));
            continue;
        }
        cr_assert_eq(st, KILN_ERR_BUSY, "step %d: %s: %s", i, kiln_status_str(st), kiln_ctx_error(ctx));
        cr_assert(strstr(kiln_ctx_error(ctx), "kiln_plan_wait"), "%s", kiln_ctx_error(ctx));
    }
    host_signal(go, 1);
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
    cr_assert_eq(kiln_run_async(p, b[N - 1], 5, &sy), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(ctx));
    for (int i = 0; i < N; i++) {
        size_t n = (size_t)(i == 0 ? T : 1) * HID;
        for (size_t k = 0; k < n; k++) cr_assert(memcmp(&got[i][k], &want[i][k], 4) == 0, "step %d: y[%zu] = %a, sync %a", i, k, got[i][k], want[i][k]);
    }
    vkDestroySemaphore((VkDevice)dev.device, go, NULL);
    kiln_plan_free(p);
    kiln_plan_free(ref);
}

static void *signal_later(void *sem)
{
    sleep_ms(300);
    VkSemaphoreSignalInfo si = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = (VkSemaphore)sem, .value = 1};
    vkSignalSemaphore((VkDevice)dev.device, &si); /* thread-safe on a semaphore nothing else signals */
    return NULL;
}

/* A plan with a cpu kernel beside vulkan ones runs synchronously: outputs are written and the
 * signal semaphore is signalled when the call returns, with kiln_run's bits; its device work waits
 * for the wait semaphore (signalled from another thread, since the call blocks). */
Test(vk_async, mixed_plan_runs_synchronously_and_signals)
{
    enum { N = 256 };
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){4, N});
    kiln_node a = kiln_silu(g, x);
    cr_assert_eq(kiln_pin(g, a, "cpu"), KILN_OK);
    kiln_node w = tu_weight(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){N, N}, -0.1f, 0.1f);
    kiln_output(g, kiln_matmul(g, a, w), "y");
    kiln_plan *p;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "vulkan"}, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    kiln_region_info ri[8];
    int nr = kiln_plan_kernel_count(p);
    bool on[2] = {false, false};
    for (int r = 0; r < nr && r < 8; r++) {
        cr_assert_eq(kiln_plan_region(p, r, &ri[r]), KILN_OK, "%s", kiln_ctx_error(ctx));
        on[strcmp(ri[r].backend, "cpu") == 0] = true;
    }
    cr_assert(on[0] && on[1], "the plan mixes cpu and vulkan kernels");
    static float xv[4 * N], want[4 * N], got[4 * N];
    tu_fill(xv, 4 * N, -2.0f, 2.0f);
    kiln_binding b[] = {{.name = "x", .data = xv, .bytes = sizeof xv}, {.name = "y", .data = want, .bytes = sizeof want}};
    tu_poison(want, sizeof want);
    cr_assert_eq(kiln_run(p, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    VkSemaphore done = timeline_semaphore(0);
    b[1].data = got;
    tu_poison(got, sizeof got);
    kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC, .signal = h(done), .signal_value = 5};
    cr_assert_eq(kiln_run_async(p, b, 2, &sy), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(memcmp(got, want, sizeof got) == 0, "the mixed plan's output is written at return, with kiln_run's bits");
    cr_assert(wait_value(done, 5, 10ull * 1000000000ull), "the signal semaphore was signalled");
    /* its device work waits for the wait semaphore: signalled by another thread 300 ms on, the
     * synchronous call cannot return before */
    VkSemaphore go = timeline_semaphore(0);
    tu_poison(got, sizeof got);
    uint64_t gw = h(go), wv = 1;
    kiln_vk_sync gated = {.magic = KILN_VK_SYNC_MAGIC, .n_wait = 1, .wait = &gw, .wait_value = &wv, .signal = h(done), .signal_value = 6};
    pthread_t th;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(pthread_create(&th, NULL, signal_later, (void *)go), 0);
    cr_assert_eq(kiln_run_async(p, b, 2, &gated), KILN_OK, "%s", kiln_ctx_error(ctx));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(th, NULL);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
    cr_assert_geq(ms, 250.0, "the mixed step returned after %.0f ms, before its wait semaphore was signalled (300 ms)", ms);
    cr_assert(memcmp(got, want, sizeof got) == 0, "the gated mixed step has kiln_run's bits");
    cr_assert_geq(counter(done), 6);
    vkDestroySemaphore((VkDevice)dev.device, go, NULL);
    kiln_vk_sync bad = {.magic = 7};
    cr_assert_eq(kiln_run_async(p, b, 2, &bad), KILN_ERR_INVALID_ARG, "a mixed plan checks its kiln_vk_sync too");
    vkDestroySemaphore((VkDevice)dev.device, done, NULL);
    kiln_plan_free(p);
}

#else
Test(vk_async, skipped) { cr_skip("built without Vulkan"); }
#endif
