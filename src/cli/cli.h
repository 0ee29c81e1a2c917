/* Shared pieces of the kiln command-line tool: exit codes, flag parsing, error printing, JSON
 * string output, timing. Internal to src/cli; the library never includes it. Must not exit the
 * process itself: commands return an exit code to main. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/kiln.h"
#include "model/presets.h"

enum {
    KILN_CLI_OK = 0,    /* success */
    KILN_CLI_FAIL = 1,  /* a kiln call failed */
    KILN_CLI_USAGE = 2, /* unknown command or flag, bad flag value */
};

/* --quiet was given (main takes it out of every command's arguments): contexts are made quiet
 * (no progress lines; warnings about the settings still show). */
extern bool kiln_cli_quiet;

/* A cursor over a command's arguments (argv[0] is the command name). */
typedef struct kiln_cli_args {
    int          argc; /* number of arguments */
    char *const *argv; /* the arguments */
    int          i;    /* next argument to read */
    const char  *cmd;  /* command name, for messages */
} kiln_cli_args;

/* If argv[i] is `flag` or `flag=VALUE`, consumes it (and VALUE from the next argument in the first
 * form), sets *val and returns 1; returns 0 if it is another argument, -1 (message printed) when the
 * value is missing. */
int kiln_cli_flag_value(kiln_cli_args *a, const char *flag, const char **val);
/* Parses an integer in [lo, hi] for `flag`; prints a message and returns false otherwise. */
bool kiln_cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
/* Prints "kiln CMD: unknown flag 'X' (see kiln CMD --help)" and returns KILN_CLI_USAGE. */
int kiln_cli_unknown_flag(const char *cmd, const char *flag);
/* Prints "kiln CMD: WHAT: <status text>: <ctx error>" (ctx may be NULL) and returns KILN_CLI_FAIL. */
int kiln_cli_fail(const char *cmd, const kiln_ctx *ctx, kiln_status s, const char *what);
/* Writes s as a JSON string literal (quotes included). */
void kiln_cli_json_str(FILE *f, const char *s);
/* Monotonic seconds. */
double kiln_cli_now(void);
/* CPU threads kiln uses with n_threads 0 (online cores). */
int kiln_cli_threads(void);

/* The graph source of plan, spirv and ptx: FILE.kg, or --preset NAME with --wtype T.
 * preset_flags: 1 when argv[i] was --preset or --wtype (consumed), 0 for another argument, -1
 * (message printed) for a bad value. one_source: exactly one of FILE and --preset, else a message
 * and false. load_source: the file's graph, or the preset built with bo (bo->wdtype and the KV
 * dtype that goes with it are set from wtype); returns KILN_CLI_OK, or prints why and returns the
 * exit code. */
int  kiln_cli_preset_flags(kiln_cli_args *a, const kiln_preset **preset, kiln_dtype *wtype);
bool kiln_cli_one_source(const char *cmd, const char *file, const kiln_preset *preset);
int  kiln_cli_load_source(const char *cmd, kiln_ctx *ctx, const char *file, const kiln_preset *preset, kiln_dtype wtype,
                          kiln_preset_build_opts bo, kiln_graph **g);

/* True (and the command's usage printed on stdout) when --help or -h is among its arguments. */
bool kiln_cli_wants_help(int argc, char *const *argv, const char *cmd);

/* Commands: argv[0] is the command name. Each returns an exit code. */
int kiln_cli_info(int argc, char *const *argv);
int kiln_cli_run(int argc, char *const *argv);
int kiln_cli_bench(int argc, char *const *argv);
int kiln_cli_plan(int argc, char *const *argv);
int kiln_cli_calibrate(int argc, char *const *argv);
int kiln_cli_spirv(int argc, char *const *argv);
int kiln_cli_ptx(int argc, char *const *argv);
/* GGUF model commands: generate (generate.c), info MODEL.gguf and bench --model (model.c). */
int kiln_cli_generate(int argc, char *const *argv);
int kiln_cli_info_model(const char *path, bool json);
int kiln_cli_bench_model(int argc, char *const *argv);
int kiln_cli_bench_serve(int argc, char *const *argv);
int kiln_cli_check(int argc, char *const *argv);
int kiln_cli_cache(int argc, char *const *argv);
/* Writes the roofline picture of p's kernels (svg.c) to path; prints where on stderr. Exit code. */
int kiln_cli_plan_svg(const kiln_ctx *ctx, const kiln_plan *p, const char *path, const char *title);
