/* Plans of one context used from several threads at once (each plan by one thread at a time):
 * compiled concurrently, then run concurrently for a prefill and several decode steps, they give
 * the same bits as the same plans run one after another on one thread; a thread's failed run
 * leaves its own message in kiln_ctx_error, not another thread's. cpu and ref plans mixed (8
 * threads), and vulkan plans (3 threads, one queueing its steps with kiln_run_async and waiting once)
 * where a device is present. CI also runs this test under
 * ThreadSanitizer (.ci/run, -DKILN_SANITIZE=thread), where any data race fails it. */
#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "model/presets.h"
#include "support/plain_test.h" /* Criterion, or a plain main under ThreadSanitizer */

static uint64_t rng_state;  /* fresh per process: $KILN_TEST_SEED, else the clock and pid; printed */
static bool     rng_seeded;

static void fill(float *x, int n)
{
    if (!rng_seeded) {
        const char *e = getenv("KILN_TEST_SEED");
        rng_state = e && *e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 20;
        rng_seeded = true;
        fprintf(stderr, "seed %llu: KILN_TEST_SEED=%llu replays it\n", (unsigned long long)rng_state,
                (unsigned long long)rng_state);
    }
    for (int i = 0; i < n; i++) x[i] = kiln_preset_rngf(&rng_state);
}

enum { MAX_PLANS = 8, T = 4, STEPS = 6, MAX_CTX = 32 }; /* step 0: prefill of T tokens; then decode */

static const kiln_preset small = {.name = "small", .hidden = 64, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                                  .ffn = 128, .rope = KILN_ROPE_NEOX, .theta = 1e4f, .eps = 1e-6f};

typedef struct job {
    kiln_ctx   *ctx;                  /* shared */
    kiln_graph *g;                    /* this job's graph */
    const char *backend;              /* where its plan runs */
    kiln_plan  *plan;                 /* compiled by the job's thread */
    float       x[STEPS][T * 64];     /* inputs per step */
    float       y[STEPS][T * 64];     /* outputs of this pass */
    int         id;                   /* index, for the deliberate error */
    bool        async;                /* vulkan: every step queued by kiln_run_async, one wait at the end
                                         (other threads' runs may deliver its outputs) */
    kiln_status st;                   /* first failure of the thread */
    char        err[512];             /* its message */
    pthread_barrier_t *go;            /* all threads start together */
} job;

static int n_tok_at(int step) { return step == 0 ? T : 1; }

static kiln_status run_steps(job *j)
{
    int n_kv = 0;
    for (int step = 0; step < STEPS; step++) {
        int n = n_tok_at(step);
        int32_t pos[T];
        for (int t = 0; t < n; t++) pos[t] = n_kv + t;
        n_kv += n;
        for (int i = 0; i < T * 64; i++) j->y[step][i] = NAN;
        kiln_binding b[] = {{.name = "n_tok", .value = n}, {.name = "n_kv", .value = n_kv},
                            {.name = "x", .data = j->x[step], .bytes = sizeof(float) * (size_t)n * 64},
                            {.name = "pos", .data = pos, .bytes = 4 * (size_t)n},
                            {.name = "y", .data = j->y[step], .bytes = sizeof(float) * (size_t)n * 64}};
        kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
        kiln_status s = j->async ? kiln_run_async(j->plan, b, 5, &sy) : kiln_run(j->plan, b, 5);
        if (s != KILN_OK) {
            snprintf(j->err, sizeof j->err, "step %d: %s", step, kiln_ctx_error(j->ctx));
            return s;
        }
        if (step == 2) { /* a failed run on this thread: its own message, then the plan goes on */
            kiln_binding bad[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = 1000 + j->id}};
            if (kiln_run(j->plan, bad, 2) != KILN_ERR_SYMBOL) {
                snprintf(j->err, sizeof j->err, "an out-of-bounds n_kv was accepted");
                return KILN_ERR_INTERNAL;
            }
            char want[64];
            snprintf(want, sizeof want, "'n_kv' = %d is out of its bounds", 1000 + j->id);
            if (!strstr(kiln_ctx_error(j->ctx), want)) {
                snprintf(j->err, sizeof j->err, "thread %d read another message: %s", j->id, kiln_ctx_error(j->ctx));
                return KILN_ERR_INTERNAL;
            }
        }
    }
    kiln_status s = kiln_plan_wait(j->plan);
    if (s != KILN_OK) snprintf(j->err, sizeof j->err, "wait: %s", kiln_ctx_error(j->ctx));
    return s;
}

static void *compile_and_run(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->go);
    j->st = kiln_compile(j->ctx, j->g, &(kiln_compile_options){.backend = j->backend}, &j->plan);
    if (j->st != KILN_OK) {
        snprintf(j->err, sizeof j->err, "compile: %s", kiln_ctx_error(j->ctx));
        return NULL;
    }
    pthread_barrier_wait(j->go); /* every plan compiled: run them all at once */
    j->st = run_steps(j);
    return NULL;
}

static void reset_states(job *j)
{
    static const char zeros[2 * MAX_CTX * 16 * 4];
    char name[8];
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "%c%d", "kv"[k], l);
            kiln_tensor_info ti;
            if (kiln_plan_tensor(j->plan, name, &ti) != KILN_OK) continue; /* a one-layer plan */
            cr_assert_leq(ti.bytes, sizeof zeros);
            cr_assert_eq(kiln_plan_state_write(j->plan, name, zeros, ti.bytes), KILN_OK, "%s", kiln_ctx_error(j->ctx));
        }
}

static void concurrent(const char *const *backends, int n_plans, int max_layers)
{
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = 2}, &ctx), KILN_OK);
    for (int b = 0; b < n_plans; b++) {
        kiln_backend_info bi;
        for (int i = 0; i < kiln_backend_count(ctx); i++)
            if (kiln_backend_get(ctx, i, &bi) == KILN_OK && !strcmp(bi.name, backends[b]) && !bi.available) {
                kiln_ctx_free(ctx);
                cr_skip("backend %s is absent: %s", backends[b], bi.detail);
            }
    }
    static const kiln_dtype wt[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_F16, KILN_DTYPE_F32, KILN_DTYPE_BF16};
    static job jobs[MAX_PLANS];
    cr_assert(n_plans > 0 && n_plans <= MAX_PLANS);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)n_plans);
    for (int i = 0; i < n_plans; i++) {
        job *j = &jobs[i];
        kiln_preset pr = small;
        pr.rope = i % 2 ? KILN_ROPE_NORMAL : KILN_ROPE_NEOX;
        kiln_preset_build_opts o = {.wdtype = wt[i % 4], .kvdtype = i % 3 ? KILN_DTYPE_F16 : KILN_DTYPE_F32,
                                    .n_layers = 1 + i % max_layers, .max_ctx = MAX_CTX, .max_tok = T, .seed = 100 + (uint64_t)i};
        char err[256] = "";
        cr_assert_eq(kiln_preset_build_ex(&pr, &o, &j->g, err, sizeof err), KILN_OK, "%s", err);
        *j = (job){.ctx = ctx, .g = j->g, .backend = backends[i], .id = i, .go = &go, .async = i == 1 && !strcmp(backends[i], "vulkan")};
        for (int s = 0; s < STEPS; s++) fill(j->x[s], T * 64);
    }
    pthread_t th[MAX_PLANS];
    for (int i = 0; i < n_plans; i++) cr_assert_eq(pthread_create(&th[i], NULL, compile_and_run, &jobs[i]), 0);
    for (int i = 0; i < n_plans; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n_plans; i++) cr_assert_eq(jobs[i].st, KILN_OK, "plan %d on %s: %s", i, jobs[i].backend, jobs[i].err);
    /* the same plans, one after another on this thread, from zeroed caches */
    static float want[MAX_PLANS][STEPS][T * 64];
    for (int i = 0; i < n_plans; i++) {
        memcpy(want[i], jobs[i].y, sizeof want[i]);
        reset_states(&jobs[i]);
        cr_assert_eq(run_steps(&jobs[i]), KILN_OK, "plan %d alone: %s", i, jobs[i].err);
    }
    for (int i = 0; i < n_plans; i++)
        for (int s = 0; s < STEPS; s++) {
            size_t n = (size_t)n_tok_at(s) * 64;
            for (size_t e = 0; e < n; e++) cr_assert(isfinite(jobs[i].y[s][e]), "plan %d step %d: y[%zu] = %g", i, s, e, jobs[i].y[s][e]);
            cr_assert(memcmp(want[i][s], jobs[i].y[s], n * sizeof(float)) == 0,
                      "plan %d (%s) step %d: the concurrent run differs from the single-threaded one", i, jobs[i].backend, s);
        }
    for (int i = 0; i < n_plans; i++) {
        kiln_plan_free(jobs[i].plan);
        kiln_graph_free(jobs[i].g);
    }
    pthread_barrier_destroy(&go);
    kiln_ctx_free(ctx);
}

Test(concurrency, eight_threads_cpu_and_ref, .timeout = 600)
{
    const char *b[MAX_PLANS] = {"cpu", "cpu", "cpu", "ref", "cpu", "cpu", "cpu", "ref"};
    concurrent(b, MAX_PLANS, 2);
}

Test(concurrency, three_threads_vulkan, .timeout = 600) /* lavapipe compiles slowly: fewer, one-layer plans */
{
    const char *b[3] = {"vulkan", "vulkan", "vulkan"};
    concurrent(b, 3, 1);
}
