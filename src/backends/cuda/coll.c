/* The cuda backend's collectives (backend.h coll_*): NCCL communicators for the GPUs of a split
 * plan, one per part's state, and the f32 sum all-reduce (or all-gather) enqueued on each part's
 * stream inside one NCCL group. NCCL is loaded here (nccl.c) when a split asks for it. Must not launch kernels. */
#include "backends/cuda/cuda.h"
#include "backends/cuda/nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_coll {
    kiln_nccl       nccl;  /* the library (loaded for this communicator) */
    int             n;     /* devices */
    kiln_nccl_comm *comms; /* one per device, in the states' order */
} cuda_coll;

bool kiln_cuda_coll_probe(void *state, int *n_devices, char *detail, size_t n)
{
    kiln_cuda *c = state;
    int count = 0;
    *n_devices = 0;
    if (c->d.device_count(&count) != KILN_CU_SUCCESS || count < 2) {
        snprintf(detail, n, "%d CUDA device%s: a split over GPUs needs two or more", count, count == 1 ? "" : "s");
        return false;
    }
    kiln_nccl nc;
    if (!kiln_nccl_load(&nc, detail, n)) return false;
    snprintf(detail, n, "NCCL %d.%d.%d from %s, %d GPUs", nc.version / 10000, nc.version / 100 % 100, nc.version % 100,
             nc.path, count);
    kiln_nccl_unload(&nc);
    *n_devices = count;
    return true;
}

void kiln_cuda_coll_free(void *comm)
{
    cuda_coll *cc = comm;
    if (!cc) return;
    for (int i = 0; cc->comms && i < cc->n; i++)
        if (cc->comms[i]) cc->nccl.comm_destroy(cc->comms[i]);
    free(cc->comms);
    kiln_nccl_unload(&cc->nccl);
    free(cc);
}

static kiln_status nccl_fail(const cuda_coll *cc, int r, const char *what, char *err, size_t n)
{
    const char *text = cc->nccl.error_string ? cc->nccl.error_string(r) : NULL;
    snprintf(err, n, "%s: ncclResult %d: %s", what, r, text ? text : "(no description)");
    return KILN_ERR_BACKEND;
}

kiln_status kiln_cuda_coll_init(void *const *states, const int *devs, int n, void **comm, char *err, size_t n_err)
{
    *comm = NULL;
    cuda_coll *cc = calloc(1, sizeof *cc);
    if (!cc || !(cc->comms = calloc((size_t)n, sizeof *cc->comms))) {
        free(cc);
        return KILN_ERR_NOMEM;
    }
    cc->n = n;
    if (!kiln_nccl_load(&cc->nccl, err, n_err)) {
        kiln_cuda_coll_free(cc);
        return KILN_ERR_UNSUPPORTED;
    }
    kiln_status s = kiln_cuda_enter(states[0], err, n_err); /* NCCL sets each device itself */
    int r = s == KILN_OK ? cc->nccl.comm_init_all(cc->comms, n, devs) : 0;
    if (s == KILN_OK && r != 0) s = nccl_fail(cc, r, "ncclCommInitAll", err, n_err);
    if (s != KILN_OK) {
        if (r != 0) memset(cc->comms, 0, (size_t)n * sizeof *cc->comms); /* none made */
        kiln_cuda_coll_free(cc);
        return s;
    }
    *comm = cc;
    return KILN_OK;
}

/* One collective per device inside one NCCL group: a sum all-reduce of count values, or an
 * all-gather of count values from each device into y[devices][count]. */
static kiln_status collective(cuda_coll *cc, void *const *states, void *const *x, void *const *y, size_t count, bool gather,
                              char *err, size_t n_err)
{
    for (int i = 0; i < cc->n; i++) {
        kiln_cuda *c = states[i];
        if (c->dead) return kiln_cuda_enter(c, err, n_err); /* the sticky error's text */
    }
    int r = cc->nccl.group_start();
    if (r != 0) return nccl_fail(cc, r, "ncclGroupStart", err, n_err);
    int first = 0;
    for (int i = 0; i < cc->n && !first; i++) {
        kiln_cuda *c = states[i];
        first = gather ? cc->nccl.all_gather(x[i], y[i], count, KILN_NCCL_FLOAT32, cc->comms[i], c->stream)
                       : cc->nccl.all_reduce(x[i], y[i], count, KILN_NCCL_FLOAT32, KILN_NCCL_SUM, cc->comms[i], c->stream);
    }
    r = cc->nccl.group_end(); /* always closes the group, so the next one starts clean */
    if (first) return nccl_fail(cc, first, gather ? "ncclAllGather" : "ncclAllReduce", err, n_err);
    return r ? nccl_fail(cc, r, "ncclGroupEnd", err, n_err) : KILN_OK;
}

kiln_status kiln_cuda_all_reduce(void *comm, void *const *states, void *const *x, void *const *y, size_t count, char *err,
                                 size_t n_err)
{
    return collective(comm, states, x, y, count, false, err, n_err);
}

kiln_status kiln_cuda_all_gather(void *comm, void *const *states, void *const *x, void *const *y, size_t count, char *err,
                                 size_t n_err)
{
    return collective(comm, states, x, y, count, true, err, n_err);
}
