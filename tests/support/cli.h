/* Running the kiln tool from Criterion tests (test_cli*.c): the binary beside the test's own
 * (<test exe dir>/kiln), one child run with its exit status, stdout and stderr captured; a number
 * read from JSON output; the small GGUF model those tests generate from. Asserts on failure. */
#pragma once

#include <stddef.h>

#include "support/gguf_writer.h"

/* Output of one child run. */
typedef struct cli_out {
    int  rc;          /* exit status (-1 when it did not exit normally) */
    char out[65536];  /* stdout, NUL-terminated */
    char err[16384];  /* stderr, NUL-terminated */
} cli_out;

/* The kiln binary's path (beside this test binary) into buf. */
void kiln_exe(char *buf, size_t n);
/* path's contents (at most n - 1 bytes), NUL-terminated; empty when it cannot be read. */
void slurp(const char *path, char *buf, size_t n);
/* Runs `kiln ARGS` (ARGS is shell text) and captures exit code, stdout and stderr. */
void kiln_cli(cli_out *o, const char *args);
/* kiln_cli with environment assignments ENV ("A=1 B=2") before `kiln ARGS`. */
void kiln_cli_env(cli_out *o, const char *env, const char *args);
/* The number after the first "KEY": in json. */
double json_key(const char *json, const char *key);
/* The tests' random qwen2 model (2 layers, 64 wide, q8_0 weights, f16 embeddings, 50 tokens). */
extern const gw_model cli_model;
/* Writes cli_model to a new temp file named from the mkstemp template path. */
void write_model(char *path);
