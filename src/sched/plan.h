/* A compiled plan: the graph copy, its regions, the backend of each region, the memory plan, and
 * per-run state. Internal; the public face is kiln_compile/kiln_run/kiln_plan_* in kiln.h. */
#pragma once

#include "fuse/fuse.h"
#include "sched/backend.h"
#include "sched/ctx.h"

struct kiln_plan {
    kiln_ctx     *ctx;         /* context the plan was compiled in (errors go there) */
    kiln_graph   *g;           /* the plan's own copy of the graph */
    kiln_fusion   fusion;      /* regions in execution order */
    uint8_t      *region_be;   /* backend of each region (enum kiln_backend_id) */
    kiln_kernel **kernels;     /* compiled kernel per region, or NULL */
    int           backend;     /* main backend (the plan's "backend" for reports) */
    uint32_t     *root;        /* root[i]: node owning i's memory (itself unless i aliases) */
    size_t       *offset;      /* byte offset of i inside its root's memory (views) */
    size_t       *arena_off;   /* for computed roots: offset inside `arena`; SIZE_MAX otherwise */
    unsigned char *arena;      /* intermediates (liveness-shared), 64-byte aligned */
    size_t        arena_bytes; /* its size */
    void        **state_mem;   /* per node: state buffers (zeroed at compile), else NULL */
    void        **bufs;        /* per run: data pointer of every node */
    int64_t     (*dims)[KILN_MAX_RANK]; /* per run: concrete dims of every node */
    int64_t      *sym_vals;    /* per run: symbol values */
    bool          ran;         /* a run completed (outputs readable) */
    bool          what_if;     /* placed over absent backends: explain only, never run */
    bool          profiling;   /* time every region in runs */
    double       *pred_s;      /* pred_s[r * KILN_BACKEND_COUNT + b]: predicted time, < 0 = cannot run */
    double       *xfer_s;      /* transfers into region r on its backend, predicted */
    double       *meas_s;      /* summed measured time per region */
    int          *n_meas;      /* runs measured per region */
    double        compile_ms;  /* time spent in kiln_compile */
};
