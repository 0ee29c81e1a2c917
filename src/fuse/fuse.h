/* Fusion: turns a graph into regions, one future kernel each: an anchor op plus the elementwise
 * ops fused before (prologue) and after (epilogue) it. Regions are backend-neutral: every backend
 * consumes the same list. Reads a const graph; never edits it. */
#pragma once

#include "graph/graph.h"

enum kiln_region_kind {
    KILN_REGION_NONE = 0,  /* leaves and pure aliases (reshape, view): no kernel */
    KILN_REGION_MAP,       /* elementwise map (add, mul, scale, silu, gelu, swiglu, cast) */
    KILN_REGION_ROWS,      /* row reduction (rms_norm, layer_norm, softmax, argmax) or row op (rope) */
    KILN_REGION_MATMUL,    /* one or more matmuls sharing x, with optional norm prologue / epilogues */
    KILN_REGION_ATTENTION, /* attention over a cache */
    KILN_REGION_SCATTER,   /* kv_scatter */
    KILN_REGION_MOVE,      /* data movement: get_rows, transpose, concat */
    KILN_REGION_COLLECTIVE,/* all_reduce: alone (a split plan's parts meet there) */
    KILN_REGION_KIND_COUNT
};

#define KILN_SPEC_MM 4 /* sibling matmuls a matmul region's spec lists at most */

/* The epilogue of one matmul output inside its region: y = x̂·Wᵀ (+ bias) (+ residual), stored at
 * dst; then optionally rope and a KV-cache write of that value. Nodes not in the region are
 * KILN_IDX_NONE. */
typedef struct kiln_spec_out {
    uint32_t dst;      /* the node whose buffer receives the output: the matmul, its last add, or
                          (out 0 of a swiglu pair) the swiglu */
    uint32_t bias;     /* [N] operand of an add right after the matmul (read only by it), or NONE */
    uint32_t bias_add; /* that add */
    uint32_t resid;    /* other operand of an add after that (the residual), or NONE */
    uint32_t resid_add;/* that add */
    uint32_t rope;     /* a rope in the region of dst's value (through reshapes), or NONE */
    uint32_t kv;       /* a kv_scatter in the region writing the roped (or plain) value, or NONE */
} kiln_spec_out;

/* The structure of a region, computed once by kiln_fuse (fuse/spec.c) so that the GPU lowering,
 * the cpu backend and the cost model read it instead of re-deriving it. Fields of other kinds are
 * KILN_IDX_NONE / 0. What a consumer's kernels can take (dtypes, shapes) it still decides itself. */
typedef struct kiln_region_spec {
    /* KILN_REGION_MATMUL */
    uint32_t n_mm;             /* matmuls sharing one input, in region order; 0 with mm_mixed */
    bool     mm_mixed;         /* the region's matmuls read different inputs, or more than KILN_SPEC_MM */
    uint32_t mm[KILN_SPEC_MM]; /* the matmul nodes */
    uint32_t x_in;             /* their input (the fused norm when there is one) */
    uint32_t x;                /* the activation read from memory: x_in, or the fused norm's input */
    uint32_t norm;             /* the rms_norm prologue (x_in, computed in the region), or NONE */
    uint32_t norm_w;           /* its weight, or NONE */
    float    eps;              /* its epsilon */
    kiln_spec_out out[KILN_SPEC_MM]; /* per matmul: its epilogue */
    bool     swiglu;           /* out 0 = silu(mm 0) * mm 1, stored at out[0].dst (two matmuls, no adds);
                                  out 1 then stores nothing */
    /* KILN_REGION_ATTENTION (an attention node anchor) */
    uint32_t q, k, v;          /* queries [n_tok, n_head, hd], the K and V caches [n_kv_head, max_ctx, hd] */
    int64_t  n_kv;             /* kiln_dim: keys attended (the symbol n_kv, or a constant) */
    int64_t  heads_per_group;  /* query heads per kv head (GQA), 0 when they do not group */
    float    scale;            /* score scale (resolved) */
    /* paged attention (kiln_paged_attention) only: where a sequence's key lives. The lowering
     * prints the position -> slot mapping from these in one place (kl_paged_slot) */
    uint32_t pos, seqs, blocks; /* per-token positions, (start, KV length) per sequence, block table */
    uint32_t parents;           /* a tree step's parents (kiln_paged_attention_tree), or NONE: causal */
    int64_t  block;             /* tokens per block; 0 for attention over a contiguous cache */
    /* KILN_REGION_ROWS: the anchor's op over the last axis */
    uint8_t  row_op;           /* enum kiln_op */
} kiln_region_spec;

typedef struct kiln_region {
    uint8_t   kind;     /* enum kiln_region_kind */
    uint32_t  anchor;   /* node index of the anchor (first matmul of a sibling group) */
    uint32_t *nodes;    /* nodes computed by the region, topological order (points into kiln_fusion.pool) */
    uint32_t  n_nodes;  /* count */
    uint32_t *outs;     /* nodes whose values leave the region (need memory) — also into pool */
    uint32_t  n_outs;   /* count */
    kiln_region_spec spec; /* its structure (fuse/spec.c) */
} kiln_region;

typedef struct kiln_fusion {
    kiln_region *regions;   /* in execution order */
    uint32_t     n_regions; /* count */
    uint32_t    *region_of; /* region_of[node]: region index, or KILN_IDX_NONE (leaves, aliases) */
    uint32_t    *pool;      /* backing store of every region's node lists */
} kiln_fusion;

/* Builds the regions of g. fuse = false gives one region per op (debugging, fused-vs-unfused
 * tests). Returns KILN_ERR_NOMEM or KILN_OK. */
kiln_status kiln_fuse(const kiln_graph *g, bool fuse, kiln_fusion *out);
void        kiln_fusion_free(kiln_fusion *f);

/* Whether node is computed by region r / leaves it (is one of its outs). */
bool kiln_region_has(const kiln_region *r, uint32_t node);
bool kiln_region_is_out(const kiln_region *r, uint32_t node);

/* Name of a region kind ("matmul", ...). */
const char *kiln_region_kind_name(enum kiln_region_kind k);
/* Aliasing ops: their result shares memory with source 0 (reshape, view, kv_scatter). */
bool kiln_op_is_alias(enum kiln_op op);

/* Internal to src/fuse. */
enum kiln_region_kind kiln_fuse_kind_of(enum kiln_op op);
/* Applies the fusion rules: merges nodes into groups (group[i] = group id, anchor_of[gid] = anchor,
 * kind_of[gid] = region kind when a rule decides it, else 0 = the anchor op's kind). */
void kiln_fuse_apply_rules(const kiln_graph *g, uint32_t *group, uint32_t *anchor_of, uint8_t *kind_of);
/* Fills r->spec from the graph (spec.c). */
void kiln_fuse_spec(const kiln_graph *g, kiln_region *r);
kiln_status kiln_fuse_regions_from_groups(const kiln_graph *g, const uint32_t *group, const uint32_t *anchor_of,
                                          const uint8_t *kind_of, kiln_fusion *out);
