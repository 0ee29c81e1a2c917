/* `kiln check`: runs kiln_check (every op x dtype x backend against the f64 reference, fused
 * patterns, presets, determinism) and prints a table or the JSON report. Exit 0 when everything
 * passed, 1 on any failure, 2 on a usage error. Must not judge results itself: the library does. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* The table streams: each row is printed (and flushed, so a redirected report fills as it runs) when
 * kiln_check completes it; with --failures only failures are, and a counter on stderr (a terminal
 * only) shows the run is alive. */
typedef struct stream {
    bool all;      /* every row, not only failures */
    bool counter;  /* "\r[n] op" on stderr */
    int  n;        /* rows seen */
} stream;

static void print_row(const kiln_check_result *x)
{
    printf("%-40s %-6s %-8s %6d %11.3g %11.3g  %s\n", x->op, x->dtype, x->backend, x->cases, x->worst_nmse, x->tolerance,
           x->ok ? "ok" : "FAIL");
    if (!x->ok) printf("    %s\n", x->detail);
}

static void on_result(const kiln_check_result *x, void *user)
{
    stream *st = user;
    st->n++;
    if (st->counter) fprintf(stderr, "\r\033[K[%d] %s %s %s", st->n, x->op, x->dtype, x->backend);
    if (st->all || !x->ok) {
        if (st->counter) fputs("\r\033[K", stderr);
        print_row(x);
    }
    fflush(stdout);
}

static void print_summary(const kiln_check_report *r)
{
    if (r->note[0]) printf("note: %s\n", r->note);
    int n_ok = 0, cases = 0;
    for (int i = 0; i < r->n_results; i++) {
        n_ok += r->results[i].ok;
        cases += r->results[i].cases;
    }
    printf("%d of %d checks passed (%d cases) in %.1f s, seed %llu: %s\n", n_ok, r->n_results, cases, r->seconds,
           (unsigned long long)r->seed, r->ok ? "OK" : "FAILED");
}

int kiln_cli_check(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "check")) return KILN_CLI_OK;
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "check"};
    kiln_check_options o = {0};
    bool json = false, failures_only = false;
    int64_t threads = 0, seed = 0;
    while (a.i < argc) {
        const char *v = NULL;
        int k;
        if ((k = kiln_cli_flag_value(&a, "--backend", &o.backend)) != 0) {
            if (k < 0) return KILN_CLI_USAGE;
        } else if ((k = kiln_cli_flag_value(&a, "--op", &o.op)) != 0) {
            if (k < 0) return KILN_CLI_USAGE;
        } else if ((k = kiln_cli_flag_value(&a, "--seed", &v)) != 0) {
            if (k < 0 || !kiln_cli_parse_i64("check", "--seed", v, 1, INT64_MAX, &seed)) return KILN_CLI_USAGE;
        } else if ((k = kiln_cli_flag_value(&a, "--threads", &v)) != 0) {
            if (k < 0 || !kiln_cli_parse_i64("check", "--threads", v, 1, 1024, &threads)) return KILN_CLI_USAGE;
        } else if (!strcmp(argv[a.i], "--json")) {
            json = true;
            a.i++;
        } else if (!strcmp(argv[a.i], "--quick")) {
            o.quick = true;
            a.i++;
        } else if (!strcmp(argv[a.i], "--failures")) {
            failures_only = true;
            a.i++;
        } else {
            return kiln_cli_unknown_flag("check", argv[a.i]);
        }
    }
    o.seed = (uint64_t)seed;
    kiln_ctx *ctx = NULL;
    kiln_status s = kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = (int)threads}, &ctx);
    if (s != KILN_OK) return kiln_cli_fail("check", ctx, s, "creating the context");
    kiln_check_report *r = NULL;
    stream st = {.all = !failures_only, .counter = isatty(2)};
    if (!json) {
        o.on_result = on_result;
        o.user = &st;
        printf("%-40s %-6s %-8s %6s %11s %11s  %s\n", "op", "dtype", "backend", "cases", "worst nmse", "tolerance", "result");
        fflush(stdout);
    }
    s = kiln_check(ctx, &o, &r);
    if (st.counter && st.n) fputs("\r\033[K", stderr);
    if (s != KILN_OK) {
        int rc = kiln_cli_fail("check", ctx, s, "running the check");
        kiln_ctx_free(ctx);
        return s == KILN_ERR_INVALID_ARG || s == KILN_ERR_UNSUPPORTED ? KILN_CLI_USAGE : rc;
    }
    if (json) {
        char *j = NULL;
        if (kiln_check_report_json(r, &j) == KILN_OK) puts(j);
        free(j);
    } else {
        print_summary(r);
    }
    int rc = r->ok ? KILN_CLI_OK : KILN_CLI_FAIL;
    kiln_check_report_free(r);
    kiln_ctx_free(ctx);
    return rc;
}
