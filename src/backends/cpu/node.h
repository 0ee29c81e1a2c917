/* The cpu backend's per-node kernels (node.c): every op of a region that the fused matmul and
 * attention-from-ops passes do not cover runs here, one node at a time. Graph-aware, unlike the
 * kernel layer in cpu.h; internal to src/backends/cpu. Must not call another backend. */
#pragma once

#include "backends/cpu/cpu.h"
#include "sched/backend.h"

/* Runs node idx of the view (a non-leaf). Runtime checks (ids, positions, n_kv ranges, shapes
 * that only a run fixes) fail with a status and a message in err naming the node. */
kiln_status kiln_cpu_node_run(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const kiln_exec_view *v, uint32_t idx,
                              char *err, size_t n_err);

/* Whether node idx of g has a cpu kernel; when not, why names the op. Placement then puts its
 * region on the reference backend. */
bool kiln_cpu_node_supported(const kiln_graph *g, uint32_t idx, char *why, size_t n_why);
