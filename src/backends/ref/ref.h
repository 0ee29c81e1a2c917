/* The reference backend: straightforward, obviously-correct C for every op and dtype, f32
 * accumulation, one node at a time, no fusion. It is the oracle for every faster backend.
 * Must stay simple: no SIMD, no threads, no cleverness. */
#pragma once

#include "graph/graph.h"
#include "sched/backend.h"


/* Executes node idx (a non-leaf; reshape/view/kv_scatter outputs alias their source, so reshape
 * and view do nothing and kv_scatter writes in place). Runtime checks (positions, ids, n_kv
 * ranges) fail with a status and a message in err naming the node. */
kiln_status kiln_ref_exec(const kiln_exec_view *v, uint32_t idx, char *err, size_t n_err);
