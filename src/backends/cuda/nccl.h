/* NCCL loaded at run time (dlopen of libnccl.so.2, like libcuda): the few entry points a split
 * plan over distinct GPUs needs (communicators for all devices at once, an f32 sum all-reduce per
 * device inside a group, the all-gather, the error text), declared here so kiln builds without NCCL. Must not
 * include <nccl.h> or link libnccl. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct ncclComm *kiln_nccl_comm;

typedef struct kiln_nccl {
    void *lib;  /* dlopen handle */
    char  path[640]; /* where it was loaded from */
    int   version;   /* ncclGetVersion: e.g. 22105 for 2.21.5 */
    int         (*get_version)(int *v);
    int         (*comm_init_all)(kiln_nccl_comm *comms, int n, const int *devs);
    int         (*all_reduce)(const void *x, void *y, size_t count, int dtype, int op, kiln_nccl_comm comm, void *stream);
    int         (*all_gather)(const void *x, void *y, size_t sendcount, int dtype, kiln_nccl_comm comm, void *stream);
    int         (*group_start)(void);
    int         (*group_end)(void);
    int         (*comm_destroy)(kiln_nccl_comm comm);
    const char *(*error_string)(int r);
} kiln_nccl;

enum { KILN_NCCL_FLOAT32 = 7, KILN_NCCL_SUM = 0 }; /* ncclFloat32, ncclSum (nccl.h) */

/* Loads NCCL: $KILN_NCCL_LIB, else libnccl.so.2 from the system's library paths, else the one a
 * Python environment ships (nvidia/nccl/lib under $VIRTUAL_ENV, $CONDA_PREFIX or the system's
 * site-packages). false with why in msg ("libnccl.so.2 not found: ..."). */
bool kiln_nccl_load(kiln_nccl *n, char *msg, size_t len);
void kiln_nccl_unload(kiln_nccl *n);
