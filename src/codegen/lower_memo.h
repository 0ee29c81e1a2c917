/* What a GPU backend's supports() lowered (and printed) for a region, kept for its compile() of
 * the same region, so that a cold compile lowers and prints each region once instead of twice.
 * An entry is keyed by the graph's process-unique id and node count, the region's nodes and
 * outputs, and the codegen options: graphs only grow by appending nodes, so equal keys give equal
 * lowerings (the target is fixed per backend state). Bounded: the oldest entry is dropped. Not
 * thread-safe (the backend's lock covers it). Must not know any backend. */
#pragma once

#include "codegen/lower.h"

#define KILN_LOWER_MEMO_N 32 /* entries kept: more than one compile's GPU regions of a layer */

typedef struct kiln_lower_memo_entry {
    bool                 used;                 /* holds a lowering */
    uint32_t             graph_id, graph_nodes;/* the graph (kiln_graph.id) and its node count then */
    uint32_t            *key;                  /* the region's nodes then its outs (owned) */
    uint32_t             n_key, n_nodes;       /* their count, and how many are nodes */
    kiln_codegen_options cg;                   /* the compile's codegen options */
    kiln_kir             kir[KILN_LOWER_MAX];  /* the lowering (owned) */
    char                *text[KILN_LOWER_MAX]; /* each kernel printed, or NULL (owned; free()) */
    uint32_t             n;                    /* kernels */
} kiln_lower_memo_entry;

typedef struct kiln_lower_memo {
    kiln_lower_memo_entry e[KILN_LOWER_MEMO_N]; /* entries */
    uint32_t              next;                 /* the slot the next put replaces */
} kiln_lower_memo;

/* Keeps kir[0..n) and text[0..n) (text may be NULL) for region r of g under cg; takes ownership
 * (frees them when it cannot keep them). */
void kiln_lower_memo_put(kiln_lower_memo *m, const kiln_graph *g, const kiln_region *r, const kiln_codegen_options *cg,
                         kiln_kir kir[KILN_LOWER_MAX], char *text[KILN_LOWER_MAX], uint32_t n);
/* Moves a kept lowering of r out into kir, text and *n (text may be NULL: the printed forms are then
 * freed); false when there is none. */
bool kiln_lower_memo_take(kiln_lower_memo *m, const kiln_graph *g, const kiln_region *r, const kiln_codegen_options *cg,
                          kiln_kir kir[KILN_LOWER_MAX], char *text[KILN_LOWER_MAX], uint32_t *n);
/* Frees every entry. */
void kiln_lower_memo_clear(kiln_lower_memo *m);
