/* The tests' name for the f64 oracle: ref64 is kiln_ref64 (src/check/ref64.c), the one copy that
 * the tests and `kiln check` share. Only aliases live here; no logic. */
#pragma once

#include "check/ref64.h"

typedef kiln_ref64 ref64;
#define ref64_new kiln_ref64_new
#define ref64_free kiln_ref64_free
#define ref64_run kiln_ref64_run
#define ref64_node kiln_ref64_node
#define ref64_output kiln_ref64_output
#define ref64_state kiln_ref64_state
#define ref64_state_set kiln_ref64_state_set
