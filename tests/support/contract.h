/* The tests' name for the contract loader: contract is kiln_contract (src/check/contract.c), the
 * one copy that the tests and `kiln check` share. Only aliases live here; no logic. */
#pragma once

#include "check/contract.h"

typedef kiln_contract contract;
typedef kiln_contract_input contract_input;
#define CONTRACT_MAX_EDGES KILN_CONTRACT_MAX_EDGES
#define CONTRACT_MAX_INPUTS KILN_CONTRACT_MAX_INPUTS
#define contract_dir kiln_contract_dir
#define contract_load kiln_contract_load
#define contract_tol kiln_contract_tol
#define contract_tol_prec kiln_contract_tol_prec
