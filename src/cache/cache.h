/* The kernel and plan cache: keys (XXH3-128 of everything a compiled artifact depends on), an
 * in-memory table of refcounted objects shared by every plan of a context, and an on-disk store
 * of one checked file per entry. Knows nothing of graphs, plans or backends: callers build keys
 * and (de)serialize their own payloads. Must never hand out a payload that fails its checks. */
#pragma once

#include "kiln/kiln.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uthash.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t by value */
#include <xxhash.h>

/* Bump when lowering or printing (PTX, GLSL, CPU dispatch decisions) changes what a cached
 * artifact means. The binary's own identity (size and a hash of its bytes) is also part of every
 * key, so a rebuilt kiln never loads code printed by another build. */
#define KILN_CODEGEN_VERSION 8
#define KILN_CACHE_FORMAT 1 /* on-disk header layout */
#define KILN_CACHE_MEM_MAX 128 /* plans kept in a context's memory table (oldest leave first) */
#define KILN_CACHE_MAX_DEFAULT ((uint64_t)512 << 20) /* the folder's size bound without $KILN_CACHE_MAX */

/* What a disk entry holds (also its file extension). */
enum kiln_cache_kind {
    KILN_CACHE_KIND_NONE = 0,
    KILN_CACHE_KIND_CPU,    /* a CPU region's dispatch decisions */
    KILN_CACHE_KIND_CUDA,   /* a CUDA region: kernel metadata, PTX text, cubin */
    KILN_CACHE_KIND_VULKAN, /* a Vulkan region: kernel metadata, SPIR-V words */
    KILN_CACHE_KIND_PLAN,   /* a plan's placement (backend and predicted costs per region) */
    KILN_CACHE_KIND_COUNT
};
const char *kiln_cache_kind_ext(enum kiln_cache_kind k); /* "cpu", "cuda", "vk" */

typedef struct kiln_cache_key {
    uint64_t h[2]; /* XXH3-128: high, low */
} kiln_cache_key;

/* Building a key: reset, add the parts, finish. The codegen version and binary identity are
 * added by kiln_cache_key_begin. */
typedef struct kiln_cache_keyer {
    XXH3_state_t st; /* streaming XXH3-128 */
} kiln_cache_keyer;
void kiln_cache_key_begin(kiln_cache_keyer *k, const char *what);
/* What every key carries of the binary: size and XXH3-64 of the file holding kiln's code, and 1
 * when they are known (0, 0, 0 when that file could not be read). */
void kiln_cache_build_identity(uint64_t out[3]);
void kiln_cache_key_add(kiln_cache_keyer *k, const void *p, size_t n);
void kiln_cache_key_str(kiln_cache_keyer *k, const char *s); /* with its length: "ab"+"c" != "a"+"bc" */
kiln_cache_key kiln_cache_key_end(kiln_cache_keyer *k);
void kiln_cache_key_hex(const kiln_cache_key *k, char out[33]);

/* An object in the in-memory table: embed first in the caller's struct. refs counts the table's
 * reference and every user's; destroy runs at 0. */
typedef struct kiln_cache_obj {
    kiln_cache_key key;                        /* table key */
    atomic_int     refs;                       /* references */
    void         (*destroy)(struct kiln_cache_obj *o, void *arg); /* frees the object */
    void          *arg;                        /* passed to destroy */
    UT_hash_handle hh;                         /* uthash */
} kiln_cache_obj;

/* Counters of one process (kiln cache stats adds them to the folder's totals). */
typedef struct kiln_cache_stats {
    uint64_t mem_hits, mem_misses;   /* plan lookups in memory */
    uint64_t disk_hits, disk_misses; /* entry lookups on disk (a rejected file counts as a miss) */
    uint64_t disk_rejects;           /* files found but refused: truncated, corrupt, wrong version or key */
    uint64_t disk_writes;            /* entries written */
    uint64_t evictions;              /* entries removed to keep the folder under its size bound */
} kiln_cache_stats;

typedef struct kiln_cache kiln_cache;

/* open(2) for files in a cache folder (entries, stats, profiles.json): never follows a symlink at
 * the last component, never blocks on a FIFO, and returns -1 (errno EINVAL) for anything but a
 * regular file. The descriptor is blocking and close-on-exec. */
int kiln_cache_open_file(const char *path, int flags, unsigned mode);

/* Opens the cache of a context on folder dir (created on first write). KILN_CACHE=off turns the
 * disk off. quiet: no warning text on stderr. NULL on OOM. */
kiln_cache *kiln_cache_new(const char *dir, bool quiet);
/* Frees every object of the table whose last reference this was; adds this process's counters to
 * the folder's stats file. */
void kiln_cache_free(kiln_cache *c);

/* In memory. find returns the object with a reference taken for the caller, or NULL. add inserts o
 * (the table takes a reference) unless the key is there already; returns whether it did. */
kiln_cache_obj *kiln_cache_mem_find(kiln_cache *c, const kiln_cache_key *key);
bool            kiln_cache_mem_add(kiln_cache *c, kiln_cache_obj *o);
void            kiln_cache_mem_clear(kiln_cache *c); /* drops the table's references (tests, benchmarks) */
void            kiln_cache_obj_ref(kiln_cache_obj *o);
void            kiln_cache_obj_unref(kiln_cache_obj *o);

/* On disk. get: a payload that passed every check (malloc'ed, caller frees), or false (a miss; a
 * bad file is counted and left to be replaced). put: written to a temporary file and renamed; a
 * folder that cannot be written turns the disk off for this context with one warning. */
bool kiln_cache_disk_get(kiln_cache *c, enum kiln_cache_kind kind, const kiln_cache_key *key, void **payload, size_t *len);
void kiln_cache_disk_put(kiln_cache *c, enum kiln_cache_kind kind, const kiln_cache_key *key, const void *payload, size_t len);
bool kiln_cache_disk_on(const kiln_cache *c);
/* Disk entries of this kind are used: KILN_CACHE unset or "on": GPU kinds and placements; "all":
 * the CPU's too (its kernels cost less to make than to read; CI turns them on to test the disk
 * path). */
bool kiln_cache_disk_for(const kiln_cache *c, enum kiln_cache_kind kind);

void kiln_cache_count(kiln_cache *c, bool mem, bool hit); /* counts a lookup done by the caller */
kiln_cache_stats kiln_cache_stats_get(const kiln_cache *c);

/* Validates one entry file's bytes; on success *payload points inside buf. why says what is wrong
 * ("truncated", "payload checksum", ...). Exposed for kiln cache ls and the tests. */
bool kiln_cache_entry_check(const unsigned char *buf, size_t n, enum kiln_cache_kind kind, const kiln_cache_key *key,
                            const unsigned char **payload, size_t *len, const char **why);

/* Folder operations for `kiln cache`: each entry file, with its size and whether it is valid. */
typedef struct kiln_cache_entry_info {
    char     name[64];   /* file name */
    char     kind[8];    /* "cpu", "cuda", "vk", "plan" */
    uint64_t bytes;      /* file size */
    bool     ok;         /* header and checksums hold */
    char     why[32];    /* else what is wrong */
} kiln_cache_entry_info;
/* Lists dir's entries into *out (malloc'ed). KILN_ERR_IO when dir cannot be read (a missing
 * folder lists nothing). */
kiln_status kiln_cache_list(const char *dir, kiln_cache_entry_info **out, size_t *n);
/* Removes every entry, temporary file and the stats file of dir; *removed counts files. */
kiln_status kiln_cache_clear(const char *dir, size_t *removed);
/* The folder's accumulated counters (zeros when there are none). */
kiln_cache_stats kiln_cache_folder_stats(const char *dir);
/* The folder's size bound in bytes: $KILN_CACHE_MAX (a number with an optional K, M, G or T
 * suffix, powers of 1024, optionally followed by B or iB; 0: no bound), else
 * KILN_CACHE_MAX_DEFAULT. A value that is not a size gives the default and *bad = that text
 * (NULL otherwise; bad may be NULL). */
uint64_t kiln_cache_max_bytes(const char **bad);
/* Least-recently-used eviction (a disk hit sets its file's modification time, so the oldest
 * time is the longest unused): when dir's entries sum to more than max bytes, removes the oldest
 * until they sum to at most keep; also removes temporary files an hour old (left by killed
 * processes). *removed counts removed entries, *total the bytes of entries left. Returns false,
 * doing nothing, when another process is trimming the folder or it cannot be read. */
bool kiln_cache_trim(const char *dir, uint64_t max, uint64_t keep, size_t *removed, uint64_t *total);
/* The folder a context would use: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
 * malloc'ed; NULL on OOM. */
char *kiln_cache_default_dir(void);
