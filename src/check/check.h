/* Internals of `kiln check` (src/check): a run's state (context, backends under test, results),
 * the case runner that compiles one graph per backend and compares it with kiln_ref64, and the
 * case generators (cases.c ops, patterns.c fused patterns/presets/determinism). Uses the public
 * API plus the graph IR; must not reach into sched or backends. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"

#define KILN_CHECK_MAX_IN 12 /* most inputs of a checked graph */

/* How a run fills an input of a checked graph (looked up by input name; default: floats). */
typedef enum kiln_check_fill {
    KILN_CHECK_FILL_FLOAT = 0, /* uniform in [lo, hi) */
    KILN_CHECK_FILL_INT,       /* i32 uniform in [lo, hi) */
    KILN_CHECK_FILL_POS_ATTN,  /* i32 n_kv - n_tok + t (needs symbols n_kv and n_tok) */
    KILN_CHECK_FILL_POS_DISTINCT, /* i32 distinct positions in [0, lo) */
    KILN_CHECK_FILL_PAGED,     /* a paged_attention's pos, seqs, blocks or parents: one coherent step
                                  (kiln_check_paged_step) */
    KILN_CHECK_FILL_COUNT
} kiln_check_fill;

typedef struct kiln_check_in {
    const char     *name; /* input name */
    kiln_check_fill fill; /* how */
    double          lo;   /* range (or position bound) */
    double          hi;   /* range end (exclusive) */
} kiln_check_in;

/* One graph to check: every output compared with kiln_ref64 at each symbol binding. */
typedef struct kiln_check_spec {
    const char         *op;        /* result row: op or pattern name */
    kiln_dtype          key;       /* result row dtype (the contract's tolerance key) */
    double              tol;       /* NMSE bound; < 0: the contract's for (op, key) */
    const kiln_graph   *g;         /* graph with named outputs */
    int                 n_binds;   /* symbol bindings to run (>= 1) */
    int64_t             syms[8][4];/* syms[run][s]: value of graph symbol s */
    float               lo, hi;    /* default float input range */
    bool                row_anchor;/* first element of every row of float inputs in [0.5, 2]: a row of
                                      only large negative x gives silu/gelu results that underflow f16,
                                      an NMSE of 1 that says nothing about the kernel */
    kiln_check_in       ins[KILN_CHECK_MAX_IN]; /* per-input overrides */
    int                 n_ins;     /* count */
    float               state_lo, state_hi; /* states set to uniform [lo, hi) before the first run */
    bool                fused_vs_unfused;   /* also compile with no_fuse, compare fused with unfused */
    int                 determinism;        /* > 0: run the plan this many times, bit-identical */
    const char         *label;     /* what the case is, for failure messages */
} kiln_check_spec;

typedef struct kiln_check_run kiln_check_run;

/* A paged attention's step metadata drawn by kiln_check_paged_step (values as floats: the runner
 * converts inputs from f32). */
typedef struct kiln_check_step {
    float      *pos, *seqs, *blocks, *par; /* [n_tok], [n_seq, 2], [n_seq, max_blocks], [n_tok] */
    const char *names[4];                  /* the inputs they fill (parents NULL without a tree) */
} kiln_check_step;

/* Draws a step of g's first paged attention at symbol values syms (check/step.c): false when g has
 * none or its sizes admit no step (then st holds nothing). */
bool kiln_check_paged_step(kiln_check_run *r, const kiln_graph *g, const int64_t *syms, kiln_check_step *st);
/* The values for input `name`, or NULL when the step does not fill it. */
const float *kiln_check_step_values(const kiln_check_step *st, const char *name);
void kiln_check_step_free(kiln_check_step *st);

/* Random numbers of the run (xoshiro256**, seeded from the options). */
uint64_t kiln_check_rand(kiln_check_run *r);
double   kiln_check_uniform(kiln_check_run *r, double lo, double hi);
int64_t  kiln_check_randint(kiln_check_run *r, int64_t lo, int64_t hi);
/* true in --quick mode. */
bool     kiln_check_quick(const kiln_check_run *r);
/* true when op (or pattern group name) is selected by the --op filter. */
bool     kiln_check_wants(const kiln_check_run *r, const char *op);

/* A weight of random values uniform in [lo, hi) quantized to t (copied into g). */
kiln_node kiln_check_weight(kiln_check_run *r, kiln_graph *g, const char *name, kiln_dtype t, int rank,
                            const kiln_dim *dims, float lo, float hi);
/* Runs spec on every backend under test and records the outcome in the results. A graph that
 * fails to build or compile is recorded as a failed case (never skipped). */
void kiln_check_case(kiln_check_run *r, const kiln_check_spec *spec);
/* Records a failure not tied to one backend (a builder error of a generator). */
void kiln_check_fail_all(kiln_check_run *r, const char *op, kiln_dtype key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Generators. */
void kiln_check_ops(kiln_check_run *r);
void kiln_check_patterns(kiln_check_run *r);
