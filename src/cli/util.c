/* Helpers shared by the kiln tool's commands: flag parsing, error printing, JSON strings, time.
 * Must not exit the process or keep global state. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

int kiln_cli_flag_value(kiln_cli_args *a, const char *flag, const char **val)
{
    const char *arg = a->argv[a->i];
    size_t n = strlen(flag);
    if (strncmp(arg, flag, n) != 0)
        return 0;
    if (arg[n] == '=') {
        *val = arg + n + 1;
        a->i++;
        return 1;
    }
    if (arg[n] != '\0')
        return 0;
    if (a->i + 1 >= a->argc) {
        fprintf(stderr, "kiln %s: flag '%s' needs a value\n", a->cmd, flag);
        return -1;
    }
    *val = a->argv[a->i + 1];
    a->i += 2;
    return 1;
}

bool kiln_cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "kiln %s: %s wants an integer in [%lld, %lld], got '%s'\n", cmd, flag, (long long)lo,
                (long long)hi, s);
        return false;
    }
    *out = v;
    return true;
}

int kiln_cli_unknown_flag(const char *cmd, const char *flag)
{
    fprintf(stderr, "kiln %s: unknown flag '%s' (see kiln %s --help)\n", cmd, flag, cmd);
    return KILN_CLI_USAGE;
}

int kiln_cli_fail(const char *cmd, const kiln_ctx *ctx, kiln_status s, const char *what)
{
    const char *detail = ctx ? kiln_ctx_error(ctx) : "";
    fprintf(stderr, "kiln %s: %s: %s%s%s\n", cmd, what, kiln_status_str(s), detail && *detail ? ": " : "",
            detail ? detail : "");
    return KILN_CLI_FAIL;
}

void kiln_cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

double kiln_cli_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int kiln_cli_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
