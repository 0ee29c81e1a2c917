/* The roofline cost model and placement. Region cost on a backend = max(flops / peak, bytes / bw)
 * + launch; moving a value between host and a device costs latency + bytes / link bandwidth.
 * Placement minimizes the plan's total. Pure functions of (graph, regions, dims, profiles). */
#pragma once

#include "fuse/fuse.h"
#include "sched/backend.h"

/* FLOPs and bytes moved by region r at the given per-node dims and symbol values. */
typedef struct kiln_region_cost {
    double   flops;      /* arithmetic */
    double   bytes;      /* read from outside + written to outside */
    uint8_t  peak_dtype; /* dtype whose peak applies (matmul: weight dtype; else f32) */
    double   link_bytes; /* all_reduce: bytes each device sends over the links (ring: 2 (N-1)/N of x) */
} kiln_region_cost;

void kiln_sched_region_cost(const kiln_graph *g, const kiln_region *r, const int64_t (*dims)[KILN_MAX_RANK],
                            const int64_t *sym_vals, kiln_region_cost *out);

/* Time of a region with cost c on a device with profile p (seconds); sets *compute_bound. */
double kiln_sched_time(const kiln_region_cost *c, const kiln_device_profile *p, bool *compute_bound);

/* A placement problem: region costs per backend, and the values that flow between regions. */
typedef struct kiln_place_edge {
    uint32_t from;  /* producing region, or KILN_IDX_NONE for a host value (run input / result to host) */
    uint32_t to;    /* consuming region, or KILN_IDX_NONE for "back to the host" (a graph output) */
    double   bytes; /* size */
} kiln_place_edge;

typedef struct kiln_place_problem {
    uint32_t                   n_regions;  /* regions */
    int                        n_backends; /* backends considered */
    const double              *time;       /* time[r * n_backends + b]; < 0: region r cannot run on b */
    const kiln_place_edge     *edges;      /* value flows */
    uint32_t                   n_edges;    /* count */
    const kiln_device_profile *profiles;   /* per backend (h2d_bw == 0: runs on host memory) */
} kiln_place_problem;

/* Total predicted time of an assignment (backend per region); INFINITY if any region cannot run. */
double kiln_sched_total(const kiln_place_problem *pp, const uint8_t *assign);
/* Transfer time of one edge given the backends at its ends (-1 = host). */
double kiln_sched_edge_time(const kiln_place_problem *pp, const kiln_place_edge *e, int from_b, int to_b);
/* Chooses a backend per region minimizing kiln_sched_total: exhaustive when the search space has at
 * most max_exhaustive assignments, else greedy in order followed by single and block moves until no
 * move helps. Writes assign; returns the total. */
double kiln_sched_place(const kiln_place_problem *pp, uint64_t max_exhaustive, uint8_t *assign);
