/* The context: options, the backends found at start, the CPU thread pool, the last error.
 * Internal to kiln; the public face is kiln_ctx_* in kiln.h. Must not know about graphs. */
#pragma once

#include "kiln/kiln.h"
#include "cache/cache.h"
#include "sched/backend.h"
#include "util/err.h"

#include <pthread.h>
#include <stddef.h>

struct kiln_ctx {
    kiln_err         err;                  /* first: the error sink the lower layers reach (util/err.h);
                                              per-thread detail of the last failure */
    kiln_ctx_options opts;                 /* options as given (cache_dir copied) */
    char            *cache_dir;            /* resolved cache directory; owned */
    kiln_cache      *cache;                /* kernel and plan cache (memory table, disk entries) */
    void            *be_state[KILN_BACKEND_COUNT]; /* each backend's state; NULL when absent */
    char             be_detail[KILN_BACKEND_COUNT][256]; /* device/ISA text, or why absent */
    bool             be_ok[KILN_BACKEND_COUNT];     /* backend usable */
    kiln_device_profile profile[KILN_BACKEND_COUNT]; /* what placement assumes of each backend */
    bool             has_profile[KILN_BACKEND_COUNT]; /* profile known (probed, calibrated or loaded) */
    int              device_ordinal;       /* >= 0: the GPU this context drives (a split plan's part on
                                              distinct GPUs, kiln_ctx_new_device); -1: $KILN_CUDA_DEVICE */
    pthread_mutex_t  be_mu[KILN_BACKEND_COUNT];     /* recursive; held by the thread that drives a device
                                                       backend (one command stream each): plans of one
                                                       context may run on several threads at once */
};

_Static_assert(offsetof(struct kiln_ctx, err) == 0, "kiln_err_of needs the sink first in kiln_ctx");

/* Sets the context's error text (printf-style). Never fails; truncates. */
void kiln_ctx_set_error(kiln_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sets the error text and returns s, for `return kiln_ctx_fail(ctx, KILN_ERR_X, "...")`. */
kiln_status kiln_ctx_fail(kiln_ctx *ctx, kiln_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A context like parent's (cache folder, quiet) whose GPU backends drive device `ordinal`: one per
 * part of a split plan over distinct GPUs (sched/group.c). Its CPU pool has one thread. */
kiln_status kiln_ctx_new_device(const kiln_ctx *parent, int ordinal, kiln_ctx **out);

/* Loads calibrated profiles from the cache dir (silently keeps defaults when absent/corrupt). */
void kiln_sched_load_cached_profiles(kiln_ctx *ctx);
