/* The host path's all-reduce epilogue of split plans (group_epi.c): the adds and rms_norm after an
 * all_reduce (fusion rule 6) computed in the same pass as the host sum. Internal to src/sched. */
#pragma once

#include "sched/plan.h"

#define KILN_EPI_MAX 8 /* nodes of an epilogue region the host pass takes (adds, then the norm) */

/* Whether part plan p's region after collective region coll is such an epilogue on host backends. */
bool kiln_sched_epi_ok(const kiln_plan *p, uint32_t coll);
/* Computes that region from the all-reduced sum (n f32 values) and writes its outputs to every part. */
kiln_status kiln_sched_epi_run(kiln_plan *const *parts, int n_parts, uint32_t coll, const float *sum, size_t n);
