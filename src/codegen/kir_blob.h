/* A lowered kernel's launch metadata in a GPU backend's cache entry (grid, block, grid-stride
 * flag, buffer slots, name, constant tables, dynamic shared memory, TMA tensor maps) and the entry's head (magic, kernel count, scratch):
 * one writer and one checked reader, shared by cuda and vulkan, so an untrusted entry is parsed
 * in one place. The reader accepts only what this build's lowering of the region says, byte for
 * byte, and still checks every count and index before use. Must not know any backend. */
#pragma once

#include "cache/blob.h"
#include "codegen/kir.h"
#include "graph/graph.h"

/* One kernel's metadata read from an entry; name and table words point into the entry (the
 * words may be unaligned: copy before handing them to a driver). */
typedef struct kiln_kir_meta {
    uint32_t    grid[3];                     /* blocks along x, y, z (virtual along x when grid_stride) */
    uint32_t    block;                       /* threads per block, 1..1024 */
    bool        grid_stride;                 /* the launcher sizes grid[0] */
    uint32_t    n_bufs;                      /* buffer slots */
    kiln_kbuf   bufs[KILN_KIR_MAX_BUFS];     /* kinds, written flags, nodes (< the graph's) or tables */
    const char *name;                        /* NUL-terminated entry name */
    uint32_t    n_tables;                    /* constant tables */
    kiln_ktable tables[KILN_KIR_MAX_TABLES]; /* their words (into the entry) and counts */
    uint32_t    dyn_shared_bytes;            /* dynamic shared memory (sm_90a kernels), 0: static */
    uint32_t    n_tmaps;                     /* TMA tensor maps (as the lowering's: compared whole) */
} kiln_kir_meta;

/* The head of a region's entry: magic, kernel count and the largest scratch of kirs[0..n). */
void kiln_kir_blob_head(kiln_blob_w *w, uint32_t magic, const kiln_kir *kirs, uint32_t n);
/* Reads the head; false unless it is exactly what kiln_kir_blob_head writes for kirs. */
bool kiln_kir_blob_head_ok(kiln_blob_r *rd, uint32_t magic, const kiln_kir *kirs, uint32_t n);

/* Appends k's launch metadata. */
void kiln_kir_blob_put(kiln_blob_w *w, const kiln_kir *k);
/* Reads one kernel's metadata at rd into *m: it must be what kiln_kir_blob_put writes for want
 * (the region's lowering in this build) and pass the bounds checks against g. Otherwise
 * KILN_ERR_INVALID_ARG with "<who>: ..." in err. */
kiln_status kiln_kir_blob_get(kiln_blob_r *rd, const kiln_graph *g, const kiln_kir *want, const char *who, kiln_kir_meta *m,
                              char *err, size_t n_err);
