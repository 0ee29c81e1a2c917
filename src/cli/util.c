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

int kiln_cli_preset_flags(kiln_cli_args *a, const kiln_preset **preset, kiln_dtype *wtype)
{
    const char *v;
    int r;
    if ((r = kiln_cli_flag_value(a, "--preset", &v)) != 0) {
        if (r < 0) return -1;
        if (!(*preset = kiln_preset_find(v))) {
            fprintf(stderr, "kiln %s: unknown preset '%s' (qwen2-0.5b, llama-7b, qwen2-7b)\n", a->cmd, v);
            return -1;
        }
        return 1;
    }
    if ((r = kiln_cli_flag_value(a, "--wtype", &v)) != 0) {
        if (r < 0) return -1;
        if (!kiln_dtype_parse(v, wtype) || *wtype == KILN_DTYPE_I32) {
            fprintf(stderr, "kiln %s: bad --wtype '%s'\n", a->cmd, v);
            return -1;
        }
        return 1;
    }
    return 0;
}

bool kiln_cli_one_source(const char *cmd, const char *file, const kiln_preset *preset)
{
    if (!file != !preset) return true;
    fprintf(stderr, "kiln %s: give either FILE.kg or --preset NAME (see kiln %s --help)\n", cmd, cmd);
    return false;
}

int kiln_cli_load_source(const char *cmd, kiln_ctx *ctx, const char *file, const kiln_preset *preset, kiln_dtype wtype,
                         kiln_preset_build_opts bo, kiln_graph **g)
{
    char err[512] = "";
    kiln_status s;
    if (file) {
        s = kiln_kg_load(ctx, file, g);
    } else {
        bo.wdtype = wtype;
        bo.kvdtype = kiln_preset_kv_dtype(wtype);
        s = kiln_preset_build_ex(preset, &bo, g, err, sizeof err);
    }
    if (s == KILN_OK) return KILN_CLI_OK;
    if (!err[0]) return kiln_cli_fail(cmd, ctx, s, file ? file : "building the preset");
    fprintf(stderr, "kiln %s: building the preset: %s: %s\n", cmd, kiln_status_str(s), err);
    return KILN_CLI_FAIL;
}
