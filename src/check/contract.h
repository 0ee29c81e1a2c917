/* Loader of the op contracts in contracts/<op>.yaml (libyaml): the per-dtype NMSE tolerance, the
 * cost formulas and the edge-case list that the conformance tests and `kiln check` read.
 * Only reads files; knows nothing about graphs or backends. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "kiln/kiln.h"

#define KILN_CONTRACT_MAX_EDGES 16  /* most edge_cases entries kept */
#define KILN_CONTRACT_MAX_INPUTS 4  /* most inputs entries kept */

typedef struct kiln_contract_input {
    char     name[32]; /* operand name ("x", "w") */
    char     rank[16]; /* rank or range as written ("2", "1..4") */
    unsigned dtypes;   /* bit (1u << kiln_dtype) per accepted dtype */
    bool     optional; /* operand may be KILN_NODE_NONE */
} kiln_contract_input;

typedef struct kiln_contract {
    char           op[32];                         /* op name, equal to the file name */
    char           summary[256];                   /* one-line summary */
    char           flops[160];                     /* FLOP count formula */
    char           bytes[160];                     /* byte count formula */
    double         tol[KILN_DTYPE_COUNT];          /* NMSE bound per dtype; NAN where absent */
    double         tol_f16act[KILN_DTYPE_COUNT];   /* the bound under codegen.precision = KILN_PREC_F16
                                                      (`tolerance_f16_act`); NAN where absent: tol's */
    int            n_inputs;                       /* entries in inputs */
    kiln_contract_input inputs[KILN_CONTRACT_MAX_INPUTS];    /* operands */
    int            n_edges;                        /* entries in edges */
    char           edges[KILN_CONTRACT_MAX_EDGES][160]; /* edge cases the tests exercise */
} kiln_contract;

/* Directory holding the contracts, read at run time (edit a YAML, rerun; no rebuild): $KILN_SOURCE_DIR/contracts
 * when that variable is set, else <source dir at build time>/contracts when it exists, else the
 * installed copy <prefix>/share/kiln/contracts (CMake installs contracts/ there). Not thread-safe. */
const char *kiln_contract_dir(void);
/* Loads contracts/<op>.yaml into *out. False with a message in err on a missing or malformed file
 * (no `op`, `op` not matching, no `tolerance` map, a tolerance that is not a number >= 0, an unknown dtype key). */
bool kiln_contract_load(const char *op, kiln_contract *out, char *err, size_t n);
/* The NMSE bound of dtype t, or NAN when the contract has no entry for t. */
double kiln_contract_tol(const kiln_contract *c, kiln_dtype t);
/* The bound of dtype t for a compile of that codegen.precision: tolerance_f16_act's entry under
 * KILN_PREC_F16 where the contract has one, else kiln_contract_tol's. */
double kiln_contract_tol_prec(const kiln_contract *c, kiln_dtype t, int32_t precision);
