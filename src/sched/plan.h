/* A compiled plan: the graph copy, its regions, the backend of each region, the memory plan, and
 * per-run state. Internal; the public face is kiln_compile/kiln_run/kiln_plan_* in kiln.h. */
#pragma once

#include "fuse/fuse.h"
#include "sched/backend.h"
#include "sched/ctx.h"

#define KILN_SPACE_HOST (-1) /* the memory of the host backends (ref, cpu) */

/* A value copied between memories before a region runs (once per run). */
typedef struct kiln_xfer {
    uint32_t region; /* runs before this region */
    uint32_t node;   /* root node whose value moves */
    int8_t   from;   /* source memory: KILN_SPACE_HOST or a device backend id */
    int8_t   to;     /* destination memory */
} kiln_xfer;

/* What a plan keeps on one device backend. */
#define KILN_RECS 8 /* recordings a plan keeps: decode, prefill, mixed steps activate different kernels */

typedef struct kiln_dev_space {
    bool      used;        /* some region runs on this backend */
    void     *arena;       /* intermediates, inputs and copies (liveness-shared) */
    size_t    arena_bytes; /* its size */
    size_t   *off;         /* per root node: offset in arena, SIZE_MAX when not there */
    void    **wbuf;        /* per root node: resident weight or state buffer, or NULL */
    void    **bufs;        /* per node, per run: device address (what kernels are given) */
    void     *params;      /* per-run parameter buffer: int32 slot i = symbol i */
    int32_t  *params_host; /* its host staging copy */
    uint32_t  n_params;    /* slots */
    void     *rec[KILN_RECS];     /* recorded launches of the whole plan, one per set of active kernels */
    uint64_t  rec_sig[KILN_RECS]; /* kiln_sched_run_sig of each */
    int       n_rec, next_rec;    /* recordings kept; the one replaced next when all are taken */
    bool      bufs_set;    /* bufs holds every node's address (they never change: arena, weights, states) */
} kiln_dev_space;

/* What every run reads of the plan and runs do not change (bind.c builds it at the first run), so
 * that a step costs the host work in the bindings, not in the graph's nodes. */
typedef struct kiln_run_memo {
    uint32_t *inputs, n_inputs;     /* input nodes */
    uint32_t *views, n_views;       /* nodes aliasing an input (their data moves with it each run) */
    uint32_t *symbolic, n_symbolic; /* nodes with a symbolic dim (the others' dims never change) */
    uint32_t *paged, n_paged;       /* paged attention nodes (check_paged) */
    uint32_t *checked, n_checked;   /* kv_scatter, get_rows and attention nodes of device regions (check_indices) */
    int8_t   *space;                /* per node: the device space an input may be bound in (device_input_space) */
    size_t   *in_bytes;             /* per node: bytes of an input's binding this run */
    int64_t  *syms;                 /* symbol values the dims of p->dims were resolved with */
    uint32_t *match;                /* per binding position: its last match (symbol, input or output index) */
    int8_t   *kind;                 /* and what it matched: 0 nothing yet, 1 symbol, 2 input, 3 output */
    uint32_t  n_match;              /* positions kept */
    bool      fixed;                /* dims at syms and the data pointers of every node but inputs and views are set */
} kiln_run_memo;

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
    /* device-resident execution (sched/exec.c) */
    int64_t     (*max_dims)[KILN_MAX_RANK]; /* dims of every node at its symbols' bounds */
    int8_t       *home;        /* per root node: memory holding its value (KILN_SPACE_HOST or a backend id) */
    kiln_xfer    *xfers;       /* transfers, in region order */
    uint32_t      n_xfers;     /* used */
    uint32_t      cap_xfers;   /* allocated */
    bool          state_shared;/* a state is read in two memories (copied each run; no recording) */
    int           record_space;/* device backend whose recording replays the whole plan, or -1 */
    kiln_dev_space dev[KILN_BACKEND_COUNT]; /* per device backend */
    void        **bound_dev;   /* per node, per run: caller's device memory bound to an input/output, or NULL */
    int8_t       *bound_dev_be;/* its backend */
    /* cache (sched/plan_cache.c) */
    uint64_t      ghash[2];    /* structural hash of the (canonical) graph */
    kiln_cache_key key;        /* the plan's key in the context's memory table */
    struct kiln_plan_tmpl *tmpl; /* compiled parts shared through the table (fusion, region_be,
                                    kernels, pred_s, xfer_s point into it), or NULL: owned */
    bool          mem_hit;     /* those parts came from the table */
    uint32_t      disk_hits;   /* kernels loaded from disk entries */
    uint32_t      disk_misses; /* kernels compiled where a disk entry was looked for */
    bool          check_finite;/* scan what each region stores for NaN/Inf (finite.c) */
    kiln_compile_options opts; /* the options compiled with, environment defaults filled in
                                  (kiln_env_options; .backend is not kept) */
    void         *finite_buf;  /* host copy of a device region's output being scanned */
    size_t        finite_cap;  /* its size */
    kiln_run_memo *memo;       /* run-time lists and matches (bind.c), built at the first run; NULL before */
    kiln_plan_stats stats;     /* what runs did (kiln_plan_stats_get) */
    struct kiln_group *group;  /* a split plan (compile option devices): its parts run the graph and
                                  this plan only routes the public calls (group.c); else NULL */
};

/* memplan.c: the host memory plan of p (arena offsets of computed roots, zeroed states), and the
 * release of one state buffer. */
kiln_status kiln_sched_plan_memory(kiln_plan *p);
void        kiln_sched_state_free(void *p);

/* Memory planning helpers shared by the host and device arenas (memplan.c). */
void   kiln_sched_lifetimes(const kiln_plan *p, uint32_t *first, uint32_t *last);
/* Greedy packing (largest first, lowest offset free over each buffer's lifetime) of the n buffers
 * order[], sizes size[i]: writes off[i], returns the total. Sorts order[]. */
size_t kiln_sched_pack(uint32_t *order, uint32_t n, const size_t *size, const uint32_t *first, const uint32_t *last, size_t *off);

/* The executor (exec.c). */
/* Takes (lock) or releases the context's lock of every device backend p's regions run on, in
 * backend order: a thread holds them while it drives those backends. Recursive. */
void        kiln_sched_lock(const kiln_plan *p, bool lock);
kiln_status kiln_sched_devices_setup(kiln_plan *p);
void        kiln_sched_devices_free(kiln_plan *p);
kiln_status kiln_sched_execute(kiln_plan *p);
/* Regions [r0, r1) launched one by one, never recorded (a split plan's part between all-reduces);
 * r0 == 0 writes the run's parameters first. */
kiln_status kiln_sched_execute_range(kiln_plan *p, uint32_t r0, uint32_t r1);
/* A plan recorded from outside (split plans' CUDA graphs, sched/group.c), record_space >= 0: the
 * parameter buffer and every transfer (all input uploads there) before a recording's replay, and
 * the launches of regions [r0, r1) alone, to be captured. */
kiln_status kiln_sched_prepare_all(kiln_plan *p);
kiln_status kiln_sched_launch_range(kiln_plan *p, uint32_t r0, uint32_t r1);
/* Which kernels this run launches on backend space sp (the backends' `active` answers for every
 * region there, hashed; 0 where no backend answers): runs with equal signatures launch the same
 * kernels, so one recording serves them. */
uint64_t kiln_sched_run_sig(const kiln_plan *p, int sp);
/* The device address of a node's value in this run (after the run's first region range), or NULL
 * when it lives on the host. */
void       *kiln_sched_dev_addr(const kiln_plan *p, uint32_t node);
/* Writes a computed node's value where it lives (host arena or device), e.g. an all-reduce total. */
kiln_status kiln_sched_put(kiln_plan *p, uint32_t node, const void *src, size_t bytes);
/* kiln_run in two halves (plan.c), for split plans: bind, resolve and check a run's bindings
 * (*out_bind: the output bindings, freed by the caller), then copy the outputs bound out. */
/* bind.c: frees the run memo. */
void kiln_sched_memo_free(kiln_run_memo *m);
kiln_status kiln_sched_run_begin(kiln_plan *p, const kiln_binding *b, size_t nb, const kiln_binding ***out_bind);
/* later: host-bound outputs are downloaded without waiting (written when the device queue retires
 * the step: kiln_run_async on a backend with join_semaphores). */
kiln_status kiln_sched_run_outputs(kiln_plan *p, const kiln_binding **out_bind, bool later);
kiln_status kiln_sched_fetch(const kiln_plan *p, uint32_t node, void *dst, size_t bytes);
/* The same, without waiting: dst is written at the device's next sync (host-homed nodes: now). */
kiln_status kiln_sched_fetch_later(const kiln_plan *p, uint32_t node, void *dst, size_t bytes);
kiln_status kiln_sched_sync_all(kiln_plan *p);
/* kiln_plan_wait: the plan's own kiln_run_async steps on each device (backends with wait_steps),
 * a sync of the others. */
kiln_status kiln_sched_wait_steps(kiln_plan *p);
kiln_status kiln_sched_state_put(kiln_plan *p, uint32_t state, const void *src, size_t bytes);

/* The plan cache (plan_cache.c). lookup computes p->key from p->ghash and the options and, on a
 * hit, points the plan's fusion, placement and kernels at the shared copy (p->mem_hit). keep
 * hands a freshly compiled plan's parts to the table. release drops the plan's reference. */
void        kiln_sched_cache_lookup(kiln_plan *p, int forced);
void        kiln_sched_cache_keep(kiln_plan *p);
void        kiln_sched_cache_release(kiln_plan *p);
/* The placement (region_be, pred_s, xfer_s) from its disk entry: true when read; save writes it. */
bool        kiln_sched_cache_load_placement(kiln_plan *p, int forced);
void        kiln_sched_cache_save_placement(const kiln_plan *p, int forced);
/* Compiles region r on its backend through the disk entries (when the backend can save/load). */
kiln_status kiln_sched_compile_region(kiln_plan *p, uint32_t r, char *err, size_t n);
/* The NaN/Inf guard (finite.c): scans the values region r stored in this run (its outputs; on the
 * host also the cache rows its kv_scatter wrote) and returns KILN_ERR_NONFINITE naming the first
 * non-finite node, element, region and backend. Device regions are synced and copied back. */
kiln_status kiln_sched_check_finite(kiln_plan *p, uint32_t r);
/* Attention node i's query positions against the kv_scatter feeding its caches (exec.c); host_ran:
 * read the positions from the host buffers before a host region's launch, else from a bound input. */
kiln_status kiln_sched_check_attention_pos(kiln_plan *p, uint32_t i, bool host_ran);
