/* ref64: an independent f64 evaluator of a whole kiln_graph, the oracle of the conformance tests.
 * Written from the op definitions in kiln.h, not from any kiln kernel: every op in double, data
 * read through kiln_dequantize, states persisting across runs inside the ref64 object.
 * Must stay simple and obviously correct; speed does not matter. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"

typedef struct kiln_ref64 kiln_ref64;

/* Evaluator of g (g must outlive it and stay unchanged). Weights are dequantized now; states are
 * zero. NULL on OOM or when g is NULL or carries a builder error. */
kiln_ref64 *kiln_ref64_new(const kiln_graph *g);
void kiln_ref64_free(kiln_ref64 *r);

/* Evaluates every node. Bindings as for kiln_run: inputs by name with data in their dtype and exact
 * byte sizes, symbols by value (data NULL); output bindings are ignored. Returns 0, or -1 with a
 * message in err (unbound input/symbol, bad size, out-of-range position/id/n_kv). */
int kiln_ref64_run(kiln_ref64 *r, const kiln_binding *b, size_t n, char *err, size_t en);

/* Values of node idx from the last run (row-major), its dims in dims (may be NULL) and element
 * count in *numel (may be NULL). NULL before any run or for a bad index. */
const double *kiln_ref64_node(const kiln_ref64 *r, uint32_t idx, int64_t dims[KILN_MAX_RANK], int64_t *numel);
/* Same for an output by name. */
const double *kiln_ref64_output(const kiln_ref64 *r, const char *name, int64_t dims[KILN_MAX_RANK], int64_t *numel);

/* Current contents of a state by name (valid until the next run or set); NULL if unknown. */
const double *kiln_ref64_state(const kiln_ref64 *r, const char *name, int64_t *numel);
/* Sets a state from data in the state's dtype (bytes must equal its size). 0 or -1 with err. */
int kiln_ref64_state_set(kiln_ref64 *r, const char *name, const void *data, size_t bytes, char *err, size_t en);
