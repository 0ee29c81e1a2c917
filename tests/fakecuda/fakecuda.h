/* What the stand-in driver (tests/fakecuda/fakecuda.c) records, one struct shared by the driver
 * and the tests that read it through dlsym (tests/support/fakecuda_use.h): a field added here is
 * seen by both, so the tests' copy can never drift from the driver's layout.
 * Must not include anything of kiln: the driver is built without it. */
#pragma once

#include <stddef.h>

typedef struct fakecuda_log {
    int    launches;         /* cuLaunchKernel calls that ran (not captured) */
    int    captured;         /* launches captured into graphs */
    int    graph_launches;   /* cuGraphLaunch calls */
    int    graph_kernels;    /* kernels run by graph launches */
    int    modules;          /* modules loaded */
    int    live_allocs;      /* allocations not freed */
    int    frees;            /* cuMemFree calls */
    size_t allocated;        /* bytes live */
    char   last_ptx[65536];  /* text of the last module loaded */
    unsigned last_grid[3], last_block; /* of the last launch */
    int    last_n_params;    /* .param count of the last launched entry */
    unsigned long long last_params[16]; /* its pointer arguments (CUdeviceptr) */
    int    fault_next_sync;  /* the next stream sync fails with an illegal address */
    int    null_params;      /* launches with a NULL pointer argument */
    int    links;            /* cuLinkComplete calls (PTX JIT'ed to a cubin) */
    int    cubin_loads;      /* modules loaded from a cubin (no JIT) */
    int    ex_launches;      /* cuLaunchKernelEx calls that launched (run or captured) */
    int    pdl_launches;     /* of those, with programmatic stream serialization */
    int    pdl_without_wait; /* programmatic launches of a kernel whose PTX has no griddepcontrol.wait */
    int    pdl_captured;     /* programmatic launches captured into graphs */
    int    stream_waits;     /* cuStreamWaitEvent calls */
    int    syncs;            /* cuStreamSynchronize calls */
    int    joined_launches;  /* launches captured on a stream that joined another's capture (an event it
                                recorded, waited for) */
    int    unjoined_ends;    /* captures ended while a stream that joined them had launches not joined
                                back (refused, as CUDA_ERROR_STREAM_CAPTURE_UNJOINED) */
    int    n_launch_log;     /* launches logged below (run or captured), wrapping at 64 */
    struct {
        char  name[48];      /* entry */
        void *stream;        /* its stream */
    } launch_log[64];
} fakecuda_log;
