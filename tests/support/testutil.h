/* Helpers shared by the Criterion tests: seeded RNG (fresh data each run, KILN_TEST_SEED to
 * replay), dtype conversion, poison, NMSE, guarded buffers, and a session that compiles a graph
 * on the backend under test, runs it beside ref64 and checks outputs against the op contract.
 * Failures go through Criterion asserts and always print the seed. Must not hide a failure. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

/* ---------------------------------------------------------------- random data */

/* The seed of this test process: $KILN_TEST_SEED, else from the clock and pid (printed to stderr
 * with the test's name when first drawn). */
uint64_t tu_seed(void);
/* Prints a test's seed and how to replay it (for tests with their own generators). */
void tu_print_seed(uint64_t seed);
/* Next 64 random bits (xoshiro256** seeded by splitmix64 from tu_seed()). */
uint64_t tu_next(void);
/* Uniform in [lo, hi). */
double tu_uniform(double lo, double hi);
/* Uniform integer in [lo, hi). */
int64_t tu_randint(int64_t lo, int64_t hi);
/* Fills n floats uniformly in [lo, hi). */
void tu_fill(float *dst, int64_t n, float lo, float hi);
/* malloc'ed copy of src in dtype t (kiln_quantize; i32 rounds to nearest even). n must be a
 * multiple of t's block. *bytes gets the size. Asserts on failure. */
void *tu_to_dtype(kiln_dtype t, const float *src, int64_t n, size_t *bytes);
/* Reads n values of dtype t into doubles (i32 exactly). Asserts on failure. */
void tu_to_f64(kiln_dtype t, const void *src, int64_t n, double *dst);
/* Size of n values of t laid out in rows of `row` values (block dtypes need row % block == 0). */
size_t tu_bytes(kiln_dtype t, int64_t n, int64_t row);

/* ---------------------------------------------------------------- buffers and comparisons */

/* Fills with 0xFF bytes: NaN in f32/f16/bf16, -1 in i32. */
void tu_poison(void *p, size_t n);
/* Guarded allocation: poisoned contents with 64 guard bytes before and after; tu_gfree asserts
 * they are intact (naming `what`). */
void *tu_galloc(size_t n);
void tu_gcheck(const void *p, const char *what);
void tu_gfree(void *p, const char *what);
/* sum((y - ref)^2) / max(sum(ref^2), tiny) (the plain ratio; tu_compare_t adds the contracts' floor). */
double nmse(const float *y, const double *ref, int64_t n);
double nmse64(const double *y, const double *ref, int64_t n);
/* Compares n values against ref: asserts no NaN/Inf where ref is finite (and matching non-finite
 * values where it is not) and NMSE <= tol, reporting the worst element. Returns the NMSE. */
double tu_compare(const char *what, const double *got, const double *ref, int64_t n, double tol);
/* Same for values of dtype t: the NMSE denominator is at least n * m^2, m the smallest normal of t
 * (contracts/: f16's subnormals have a fixed step of 2^-24). tu_compare is this with f32. */
double tu_compare_t(const char *what, kiln_dtype t, const double *got, const double *ref, int64_t n, double tol);
/* Same with the NMSE taken against the magnitude of the terms each output sums (mag[i] >= |ref[i]|,
 * e.g. sum_k |x_k w_k| for a dot product) instead of ref: rounding errors scale with the terms, so
 * an output that cancels to near 0 does not inflate the ratio (contracts/matmul.yaml). mag NULL: ref. */
double tu_compare_mag(const char *what, kiln_dtype t, const double *got, const double *ref, const double *mag, int64_t n,
                      double tol);

/* The contract's NMSE bound for op and dtype (tolerance_f16_act's under $KILN_PRECISION=f16); asserts
 * that it exists. */
double tu_tol(const char *op, kiln_dtype t);
/* The bound under a compile's codegen.precision (tolerance_f16_act under KILN_PREC_F16). */
double tu_tol_prec(const char *op, kiln_dtype t, int32_t precision);

/* ---------------------------------------------------------------- sessions */

/* Backend under test: $KILN_TEST_BACKEND, default "ref". */
const char *tu_backend(void);
/* Whether ctx lists backend `name` as available. */
bool tu_backend_present(kiln_ctx *ctx, const char *name);

struct gw_model;
/* A random model file (support/gguf_writer.h) opened from memory in ctx; the bytes it reads are
 * *bytes (malloc'ed: free them after kiln_gguf_close). Asserts. */
kiln_gguf *tu_model_open(kiln_ctx *ctx, const struct gw_model *m, uint8_t **bytes);

/* A weight of fresh random values uniform in [lo, hi) converted to t (kiln_quantize); asserts. */
kiln_node tu_weight(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims, float lo, float hi);

typedef struct tu_sess tu_sess;
/* Compiles g on tu_backend() and makes its ref64 (asserts on failure, naming `what`). g must
 * outlive the session. */
tu_sess *tu_sess_new(const kiln_graph *g, const char *what);
void tu_sess_free(tu_sess *s);
/* Binds a symbol for the next runs. */
void tu_sym(tu_sess *s, const char *name, int64_t v);
/* Binds an input from data in its dtype (copied). */
void tu_input(tu_sess *s, const char *name, const void *data, size_t bytes);
/* Binds an input from f32 values converted to its dtype; n must be its element count. */
void tu_input_f32(tu_sess *s, const char *name, const float *v, int64_t n);
/* Binds an input to fresh random values in [lo, hi) (dims resolved with the bound symbols). */
void tu_input_random(tu_sess *s, const char *name, float lo, float hi);
/* Binds an i32 input to random integers in [lo, hi). */
void tu_input_ints(tu_sess *s, const char *name, int64_t lo, int64_t hi);
/* Sets a state to random values in [lo, hi), in the plan and in ref64 alike. */
void tu_state_random(tu_sess *s, const char *name, float lo, float hi);
/* Runs the plan (outputs poisoned, guarded) and ref64; asserts both succeed. */
void tu_run(tu_sess *s);
/* Runs the plan only and returns its status (for runs that must fail). */
kiln_status tu_run_status(tu_sess *s);
/* Checks output `out` of the last run against ref64 with tolerance tol. Returns the NMSE. */
double tu_check_tol(tu_sess *s, const char *out, double tol);
/* Same with the NMSE against the terms' magnitude mag (tu_compare_mag; one value per output element). */
double tu_check_mag(tu_sess *s, const char *out, const double *mag, double tol);
/* Same with the contract's tolerance for (op, key dtype). */
double tu_check(tu_sess *s, const char *out, const char *op, kiln_dtype key);
/* Checks a state of the plan against ref64's with the contract's tolerance. */
double tu_check_state(tu_sess *s, const char *state, const char *op, kiln_dtype key);
/* The plan (for extra checks). */
kiln_plan *tu_plan(tu_sess *s);
