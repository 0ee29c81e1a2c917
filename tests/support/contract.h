/* Loader of the op contracts in contracts/<op>.yaml (libyaml): the per-dtype NMSE tolerance, the
 * cost formulas and the edge-case list that the conformance tests and `kiln check` read.
 * Only reads files; knows nothing about graphs or backends. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "kiln/kiln.h"

#define CONTRACT_MAX_EDGES 16  /* most edge_cases entries kept */
#define CONTRACT_MAX_INPUTS 4  /* most inputs entries kept */

typedef struct contract_input {
    char     name[32]; /* operand name ("x", "w") */
    char     rank[16]; /* rank or range as written ("2", "1..4") */
    unsigned dtypes;   /* bit (1u << kiln_dtype) per accepted dtype */
    bool     optional; /* operand may be KILN_NODE_NONE */
} contract_input;

typedef struct contract {
    char           op[32];                         /* op name, equal to the file name */
    char           summary[256];                   /* one-line summary */
    char           flops[160];                     /* FLOP count formula */
    char           bytes[160];                     /* byte count formula */
    double         tol[KILN_DTYPE_COUNT];          /* NMSE bound per dtype; NAN where absent */
    int            n_inputs;                       /* entries in inputs */
    contract_input inputs[CONTRACT_MAX_INPUTS];    /* operands */
    int            n_edges;                        /* entries in edges */
    char           edges[CONTRACT_MAX_EDGES][160]; /* edge cases the tests exercise */
} contract;

/* Directory holding the contracts: $KILN_SOURCE_DIR/contracts, else the compile-time source dir. */
const char *contract_dir(void);
/* Loads contracts/<op>.yaml into *out. False with a message in err on a missing or malformed file
 * (no `op`, `op` not matching, no `tolerance` map, a tolerance that is not a number >= 0, an unknown dtype key). */
bool contract_load(const char *op, contract *out, char *err, size_t n);
/* The NMSE bound of dtype t, or NAN when the contract has no entry for t. */
double contract_tol(const contract *c, kiln_dtype t);
