/* Helpers shared by the reference backend's files: f32 load/store of any dtype, element counts,
 * scratch allocation and node-naming error messages. Internal to src/backends/ref; must stay
 * plain scalar C like the rest of the reference backend. */
#pragma once

#include "backends/ref/ref.h"

/* Everything a kernel needs about the node it runs, gathered once by kiln_ref_exec. */
typedef struct kiln_ref_ctx {
    const kiln_exec_view *v;     /* the run's view */
    uint32_t              idx;   /* node being executed */
    const kiln_node_rec  *node;  /* v->g->nodes[idx] */
    char                 *err;   /* message buffer (may be NULL) */
    size_t                n_err; /* its size */
} kiln_ref_ctx;

/* Writes "<op> '<name>': <message>" (or "<op> #<idx>: ...") into c->err and returns s. */
kiln_status kiln_ref_fail(const kiln_ref_ctx *c, kiln_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Element count of node i for this run (product of its concrete dims; 1 for rank 0). */
int64_t kiln_ref_numel(const kiln_exec_view *v, uint32_t i);
/* Last dim of node i (1 for rank 0). */
int64_t kiln_ref_last_dim(const kiln_exec_view *v, uint32_t i);

/* Reads n values of dtype t starting at element `off` of base into f32 dst (block dtypes: off and
 * n multiples of the block). */
kiln_status kiln_ref_load(const kiln_ref_ctx *c, kiln_dtype t, const void *base, int64_t off, int64_t n, float *dst);
/* Writes n f32 values into base at element `off` converted to t (f32/f16/bf16/block; not i32). */
kiln_status kiln_ref_store(const kiln_ref_ctx *c, kiln_dtype t, void *base, int64_t off, int64_t n, const float *src);

/* malloc of n floats (at least one), failing with KILN_ERR_NOMEM through c when it cannot. */
float *kiln_ref_alloc(const kiln_ref_ctx *c, int64_t n, kiln_status *st);
/* Loads all of source node i into a new f32 array (freed by the caller); NULL on failure (*st set). */
float *kiln_ref_load_node(const kiln_ref_ctx *c, uint32_t i, kiln_status *st);

/* Kernels in ref_nn.c. */
kiln_status kiln_ref_matmul(const kiln_ref_ctx *c);
kiln_status kiln_ref_moe_matmul(const kiln_ref_ctx *c);
kiln_status kiln_ref_rope(const kiln_ref_ctx *c);
kiln_status kiln_ref_attention(const kiln_ref_ctx *c);
kiln_status kiln_ref_kv_scatter(const kiln_ref_ctx *c);
kiln_status kiln_ref_paged_attention(const kiln_ref_ctx *c);
kiln_status kiln_ref_get_rows(const kiln_ref_ctx *c);
