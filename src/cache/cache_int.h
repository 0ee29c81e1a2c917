/* Inside the cache: the context cache's fields, shared by cache.c and disk.c only. */
#pragma once

#include "cache/cache.h"

#include <pthread.h>

struct kiln_cache {
    char            *dir;     /* folder of the disk entries; owned */
    atomic_bool      disk_on; /* disk entries read and written (turned off by a refused write) */
    bool             disk_cpu;/* also for the CPU backend (KILN_CACHE=all) */
    bool             quiet;   /* no warning text */
    atomic_bool      warned;  /* the read-only/full warning was given */
    pthread_mutex_t  lock;    /* guards table */
    kiln_cache_obj  *table;   /* uthash head */
    struct {
        atomic_uint_least64_t mem_hits, mem_misses, disk_hits, disk_misses, disk_rejects, disk_writes;
    } n;                      /* this process's counters */
};

/* Adds the counters to dir/stats (under flock) when disk entries are on and some were counted. */
void kiln_cache_stats_flush(kiln_cache *c);
