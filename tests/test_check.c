/* kiln_check, the conformance harness, checked itself: it passes on the working backends, it
 * catches deliberately wrong kernels (an off-by-one softmax sum, an rms_norm scaled by 1.001,
 * injected through KILN_FAULT_INJECT), it rejects bad options, and its JSON has the documented
 * shape. The full check on cpu runs as its own ctest entry (kiln_check_cpu). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "support/testutil.h"

static kiln_ctx *g_ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &g_ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(g_ctx); }

static kiln_check_report *run(const char *backend, const char *op)
{
    kiln_check_report *r = NULL;
    kiln_check_options o = {.backend = backend, .op = op, .quick = true, .seed = tu_seed()}; /* KILN_TEST_SEED replays */
    kiln_status s = kiln_check(g_ctx, &o, &r);
    cr_assert_eq(s, KILN_OK, "kiln_check: %s: %s", kiln_status_str(s), kiln_ctx_error(g_ctx));
    cr_assert(r && r->n_results > 0);
    return r;
}

static const kiln_check_result *find(const kiln_check_report *r, const char *op, const char *dt, const char *be)
{
    for (int i = 0; i < r->n_results; i++)
        if (!strcmp(r->results[i].op, op) && !strcmp(r->results[i].dtype, dt) && !strcmp(r->results[i].backend, be))
            return &r->results[i];
    cr_assert_fail("no result row %s %s %s", op, dt, be);
    return NULL;
}

Test(check, passes_on_ref_and_cpu, .init = setup, .fini = teardown)
{
    /* cpu and ref only: other backends have their own check entries (lavapipe under ASan is slow) */
    const char *ops[] = {"softmax", "rms_norm", "matmul", "attention"}, *bes[] = {"cpu", "ref"};
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 2; b++) {
            kiln_check_report *r = run(bes[b], ops[i]);
            for (int k = 0; k < r->n_results; k++) {
                const kiln_check_result *x = &r->results[k];
                cr_expect(x->ok, "%s %s %s: %s (seed %llu)", x->op, x->dtype, x->backend, x->detail, (unsigned long long)r->seed);
                cr_expect(x->cases >= 12, "%s %s %s: only %d cases", x->op, x->dtype, x->backend, x->cases);
                cr_expect(x->worst_nmse <= x->tolerance);
            }
            cr_expect(r->ok);
            find(r, ops[i], "f32", bes[b]);
            kiln_check_report_free(r);
        }
}

/* A wrong kernel must fail its rows on cpu (and only there: ref keeps its own kernels). */
static void catches(const char *fault, const char *op)
{
    setenv("KILN_FAULT_INJECT", fault, 1);
    kiln_check_report *r = run("cpu", op), *rr = run("ref", op);
    const kiln_check_result *cpu = find(r, op, "f32", "cpu"), *ref = find(rr, op, "f32", "ref");
    cr_expect(!r->ok, "%s not caught", fault);
    cr_expect(!cpu->ok, "%s: cpu f32 row passed (worst %g, tol %g)", fault, cpu->worst_nmse, cpu->tolerance);
    cr_expect(cpu->worst_nmse > cpu->tolerance && *cpu->detail, "%s: no NMSE excess or detail", fault);
    cr_expect(ref->ok, "%s: ref row failed: %s", fault, ref->detail);
    kiln_check_report_free(r);
    kiln_check_report_free(rr);
    unsetenv("KILN_FAULT_INJECT");
}

Test(check, catches_off_by_one_softmax, .init = setup, .fini = teardown) { catches("cpu_softmax_off_by_one", "softmax"); }
Test(check, catches_wrong_scale_rms_norm, .init = setup, .fini = teardown) { catches("cpu_rms_norm_scale", "rms_norm"); }
/* The attention masks (soft-cap, window, both): they pass on ref and cpu, and a window one key too
 * wide fails the cpu rows (every quick run has 1-key windows). */
Test(check, attention_masks_pass_and_catch_a_wide_window, .init = setup, .fini = teardown)
{
    const char *ops[] = {"attention:masks", "paged_attention:masks"}, *bes[] = {"cpu", "ref"};
    for (int i = 0; i < 2; i++)
        for (int b = 0; b < 2; b++) {
            kiln_check_report *r = run(bes[b], ops[i]);
            for (int k = 0; k < r->n_results; k++)
                cr_expect(r->results[k].ok, "%s %s %s: %s (seed %llu)", r->results[k].op, r->results[k].dtype,
                          r->results[k].backend, r->results[k].detail, (unsigned long long)r->seed);
            find(r, ops[i], "f16", bes[b]);
            kiln_check_report_free(r);
        }
    catches("cpu_attn_window_wide", "attention:masks");
}

/* A mild failure first, then NaNs (issue #17: a worst NMSE of inf was reported with the detail of
 * the first, mild failure): the detail names the NaN, in the report and in its JSON with the seed. */
Test(check, infinite_nmse_comes_with_its_reason, .init = setup, .fini = teardown)
{
    setenv("KILN_FAULT_INJECT", "cpu_rms_norm_scale,cpu_rms_norm_nan_late", 1);
    kiln_check_report *r = run("cpu", "rms_norm");
    unsetenv("KILN_FAULT_INJECT");
    const kiln_check_result *cpu = find(r, "rms_norm", "f32", "cpu");
    cr_expect(!cpu->ok && isinf(cpu->worst_nmse), "worst %g", cpu->worst_nmse);
    cr_expect(strstr(cpu->detail, "NaN at element"), "the worst case's reason: %s", cpu->detail);
    char *j = NULL, seed[48];
    cr_assert_eq(kiln_check_report_json(r, &j), KILN_OK);
    snprintf(seed, sizeof seed, "\"seed\": %llu,", (unsigned long long)r->seed);
    cr_expect(strstr(j, seed) && strstr(j, "\"worst_nmse\": 1e999") && strstr(j, "NaN at element"), "%s", j);
    free(j);
    kiln_check_report_free(r);
}

Test(check, rejects_bad_options, .init = setup, .fini = teardown)
{
    kiln_check_report *r = (kiln_check_report *)1;
    cr_expect_eq(kiln_check(g_ctx, &(kiln_check_options){.backend = "nope"}, &r), KILN_ERR_INVALID_ARG);
    cr_expect_null(r);
    cr_expect(strstr(kiln_ctx_error(g_ctx), "nope"));
    cr_expect_eq(kiln_check(g_ctx, &(kiln_check_options){.op = "frobnicate"}, &r), KILN_ERR_INVALID_ARG);
    cr_expect(strstr(kiln_ctx_error(g_ctx), "frobnicate"));
    cr_expect_eq(kiln_check(NULL, NULL, &r), KILN_ERR_INVALID_ARG);
    cr_expect_eq(kiln_check(g_ctx, NULL, NULL), KILN_ERR_INVALID_ARG);
    kiln_check_report_free(NULL);
}

Test(check, json_shape, .init = setup, .fini = teardown)
{
    kiln_check_report *r = run("cpu", "scale");
    char *j = NULL;
    cr_assert_eq(kiln_check_report_json(r, &j), KILN_OK);
    char head[200];
    snprintf(head, sizeof head, "{\"ok\": true, \"seed\": %llu, \"seconds\": ", (unsigned long long)r->seed);
    cr_expect(r->seed != 0 && !strncmp(j, head, strlen(head)), "the seed leads: %s", j);
    cr_expect(strstr(j, "\"note\": \"\", \"results\": [{\"op\": \"scale\", \"dtype\": \"f32\", \"backend\": \"cpu\", \"cases\": "), "%s", j);
    cr_expect(strstr(j, "\"worst_nmse\": ") && strstr(j, "\"tolerance\": ") && strstr(j, "\"ok\": true, \"detail\": \"\"}]}"), "%s", j);
    free(j);
    kiln_check_report_free(r);
}

Test(check, same_seed_same_report, .init = setup, .fini = teardown)
{
    kiln_check_report *r[2];
    for (int k = 0; k < 2; k++)
        cr_assert_eq(kiln_check(g_ctx, &(kiln_check_options){.backend = "cpu", .op = "matmul", .quick = true, .seed = 42}, &r[k]), KILN_OK);
    cr_assert_eq(r[0]->n_results, r[1]->n_results);
    for (int i = 0; i < r[0]->n_results; i++) cr_expect_eq(r[0]->results[i].worst_nmse, r[1]->results[i].worst_nmse);
    cr_expect_eq(r[0]->seed, 42);
    kiln_check_report_free(r[0]);
    kiln_check_report_free(r[1]);
}

/* on_result streams the report: each row once, in report order, complete when handed over. */
typedef struct seen {
    kiln_check_result rows[256]; /* copies as handed over */
    int               n;         /* count */
} seen;

static void collect(const kiln_check_result *x, void *user)
{
    seen *s = user;
    cr_assert_lt(s->n, 256);
    s->rows[s->n++] = *x;
}

Test(check, streams_rows_as_they_complete, .init = setup, .fini = teardown)
{
    static seen s; /* large: not on the stack */
    s.n = 0;
    kiln_check_report *r = NULL;
    kiln_check_options o = {.backend = "cpu", .op = "fused", .quick = true, .seed = 7, .on_result = collect, .user = &s};
    cr_assert_eq(kiln_check(g_ctx, &o, &r), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    cr_assert_eq(s.n, r->n_results, "every row handed over once");
    for (int i = 0; i < s.n; i++) {
        cr_assert_str_eq(s.rows[i].op, r->results[i].op);
        cr_assert_str_eq(s.rows[i].dtype, r->results[i].dtype);
        cr_assert_eq(s.rows[i].cases, r->results[i].cases, "row %s %s handed over before it was complete",
                     s.rows[i].op, s.rows[i].dtype);
    }
    kiln_check_report_free(r);
}

/* Quick mode runs one small case per op x dtype on vulkan when it is named (lavapipe compiles each
 * case's kernels), and leaves a CPU Vulkan device out when it is not. */
Test(check, quick_caps_vulkan, .init = setup, .fini = teardown, .timeout = 600)
{
    kiln_backend_info bi = {0};
    for (int i = 0; i < kiln_backend_count(g_ctx); i++) {
        kiln_backend_get(g_ctx, i, &bi);
        if (!strcmp(bi.name, "vulkan")) break;
    }
    if (!bi.name || strcmp(bi.name, "vulkan") || !bi.available) cr_skip("vulkan backend absent: %s", bi.detail ? bi.detail : "");
    kiln_check_report *q = run("vulkan", "silu"), *c = run("cpu", "silu");
    for (int i = 0; i < q->n_results; i++) {
        const kiln_check_result *v = &q->results[i], *u = find(c, v->op, v->dtype, "cpu");
        cr_assert(v->ok, "%s %s: %s", v->op, v->dtype, v->detail);
        cr_assert(v->cases >= 1 && v->cases * 3 <= u->cases, "%s %s: %d vulkan cases vs %d on cpu", v->op, v->dtype,
                  v->cases, u->cases);
    }
    kiln_check_report_free(q);
    kiln_check_report_free(c);
    /* not named, a CPU device (lavapipe) is left out of a quick run, and the report says so */
    kiln_check_report *all = NULL;
    cr_assert_eq(kiln_check(g_ctx, &(kiln_check_options){.op = "silu", .quick = true}, &all), KILN_OK);
    bool cpu_device = strstr(bi.detail, " (cpu, ") != NULL, any_vk = false;
    for (int i = 0; i < all->n_results; i++) any_vk |= !strcmp(all->results[i].backend, "vulkan");
    cr_assert_eq(any_vk, !cpu_device, "%s", bi.detail);
    cr_assert_eq(strstr(all->note, "vulkan skipped") != NULL, cpu_device, "note: '%s'", all->note);
    char *js = NULL;
    cr_assert_eq(kiln_check_report_json(all, &js), KILN_OK);
    cr_assert(strstr(js, "\"note\": \"") != NULL, "%s", js);
    free(js);
    kiln_check_report_free(all);
    /* named, the fused patterns are all left out of a quick run on a CPU device: 0 checks, not ok,
       and the note says why (it was a bare FAILED) */
    if (!cpu_device) return;
    kiln_check_report *f = NULL;
    cr_assert_eq(kiln_check(g_ctx, &(kiln_check_options){.backend = "vulkan", .op = "fused", .quick = true, .seed = 1}, &f), KILN_OK);
    cr_assert(!f->ok && f->n_results == 0, "%d results", f->n_results);
    cr_assert(strstr(f->note, "--quick left ") && strstr(f->note, "without --quick"), "note: '%s'", f->note);
    kiln_check_report_free(f);
}
