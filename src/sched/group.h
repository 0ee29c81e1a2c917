/* Split plans: one ordinary plan per part of a tensor-parallel split, run in lock step with the
 * all-reduces between them (group.c). The public calls on a split plan (kiln_run, reads, states,
 * explain) come here from plan.c and explain.c. Must not contain kernels. */
#pragma once

#include "sched/plan.h"

typedef struct kiln_group kiln_group;

/* Reads opts->devices: *n_out devices. With one, *out stays NULL (compile an ordinary plan);
 * with more, the split plan's parts are compiled into *out. Errors name the reason (a count
 * that does not divide the heads, a device string kiln does not read, no NCCL for real GPUs). */
kiln_status kiln_sched_group_compile(kiln_ctx *ctx, const kiln_graph *g, const kiln_compile_options *opts, kiln_group **out,
                                     int *n_out);
void        kiln_sched_group_free(kiln_group *gr);
int         kiln_sched_group_size(const kiln_group *gr);
kiln_plan  *kiln_sched_group_part(const kiln_group *gr, int p);
const char *kiln_sched_group_summary(const kiln_group *gr);
const struct kiln_split *kiln_sched_group_split(const kiln_group *gr);
kiln_status kiln_sched_group_run(kiln_plan *gp, kiln_group *gr, const kiln_binding *b, size_t nb);
/* Reads (dst) or writes (src) a state by name, gathering or scattering its slices. */
kiln_status kiln_sched_group_state(kiln_plan *gp, kiln_group *gr, const char *name, void *dst, const void *src, size_t bytes);
kiln_status kiln_sched_group_tensor(const kiln_group *gr, const char *name, kiln_tensor_info *out);
/* link.c: measures the all-reduce over this host's GPUs (at most 8) into p->link_latency_s (8 KB)
 * and p->link_bw (bus bandwidth at 16 MiB); why says how many GPUs, or why not (multi-GPU off:
 * KILN_ERR_UNSUPPORTED, p untouched). */
kiln_status kiln_sched_calibrate_link(kiln_ctx *ctx, kiln_device_profile *p, char *why, size_t n);
