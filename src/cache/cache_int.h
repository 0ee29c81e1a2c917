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
    uint64_t         max_bytes;/* the folder's size bound (0: none) */
    atomic_uint_least64_t est_bytes; /* the folder's bytes as last scanned plus what this context wrote since */
    atomic_bool      scanned; /* est_bytes holds a scan (the first write of a context scans) */
    atomic_bool      trimming;/* one thread of the context trims at a time */
    pthread_mutex_t  lock;    /* guards table */
    kiln_cache_obj  *table;   /* uthash head */
    struct {
        atomic_uint_least64_t mem_hits, mem_misses, disk_hits, disk_misses, disk_rejects, disk_writes, evictions;
    } n;                      /* this process's counters */
};

/* A folder that cannot be written (or made) turns the disk off with the one warning, at once:
 * a context whose plans write nothing (the CPU's) would otherwise never say. */
void kiln_cache_check_dir(kiln_cache *c);
/* Adds the counters to dir/stats (under flock) when disk entries are on and some were counted. */
void kiln_cache_stats_flush(kiln_cache *c);
