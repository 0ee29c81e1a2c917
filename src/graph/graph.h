/* The graph IR: one arena of nodes per graph, node ids are uint32_t indices, array order is a
 * topological order. Builders append; no pass edits a graph in place. Shared by every stage.
 * Must not know about backends, fusion or plans. */
#pragma once

#include "kiln/kiln.h"

#define KILN_IDX_NONE UINT32_MAX /* "no node" inside the IR */

enum kiln_op {
    KILN_OP_NONE = 0,
    KILN_OP_INPUT,      /* leaf bound at each run */
    KILN_OP_WEIGHT,     /* leaf with constant data */
    KILN_OP_STATE,      /* leaf persistent in the plan */
    KILN_OP_MATMUL,     /* src: x, w */
    KILN_OP_ADD,        /* src: a, b (b broadcast over leading dims) */
    KILN_OP_MUL,        /* src: a, b */
    KILN_OP_SCALE,      /* src: x; f[0] = s */
    KILN_OP_SILU,       /* src: x */
    KILN_OP_GELU,       /* src: x */
    KILN_OP_SWIGLU,     /* src: gate, up */
    KILN_OP_RMS_NORM,   /* src: x, w?; f[0] = eps */
    KILN_OP_LAYER_NORM, /* src: x, w?, b?; f[0] = eps */
    KILN_OP_SOFTMAX,    /* src: x */
    KILN_OP_ROPE,       /* src: x, pos; i[0] = mode, f[0] = theta */
    KILN_OP_ATTENTION,  /* src: q, k, v; dim = n_kv, f[0] = scale (resolved, never 0) */
    KILN_OP_KV_SCATTER, /* src: state, rows, pos; result aliases the state */
    KILN_OP_GET_ROWS,   /* src: table, ids */
    KILN_OP_ARGMAX,     /* src: x */
    KILN_OP_CAST,       /* src: x; node dtype is the target */
    KILN_OP_RESHAPE,    /* src: x; aliases x */
    KILN_OP_VIEW,       /* src: x; dim = element offset; aliases x */
    KILN_OP_TRANSPOSE,  /* src: x; i[0], i[1] = swapped dims */
    KILN_OP_CONCAT,     /* src: a, b; i[0] = axis */
    KILN_OP_COUNT
};

/* Number of sources an op takes at most, and its .kg/message name. */
const char *kiln_op_name(enum kiln_op op);
bool        kiln_op_parse(const char *name, enum kiln_op *out);

typedef struct kiln_node_rec {
    uint8_t  op;                       /* enum kiln_op */
    uint8_t  dtype;                    /* kiln_dtype of the result */
    uint8_t  rank;                     /* number of dims, 0..KILN_MAX_RANK */
    uint8_t  n_src;                    /* sources used */
    uint8_t  pin;                      /* backend id + 1 from kiln_pin; 0 = placement decides */
    int64_t  dims[KILN_MAX_RANK];      /* kiln_dim: >= 0 constant, < 0 symbol (see kiln_sym_index) */
    uint32_t src[KILN_MAX_SRC];        /* source node indices; KILN_IDX_NONE for an absent optional */
    float    f[2];                     /* float params: eps, scale, theta */
    int32_t  i[2];                     /* int params: rope mode, axes */
    int64_t  dim;                      /* a kiln_dim param: attention n_kv, view offset */
    char    *name;                     /* user name (leaves: required) or NULL; owned */
    /* weights only */
    const void *data;                  /* weight bytes (inside blob when owned, else the caller's) */
    struct kiln_blob *blob;            /* refcounted owner of data shared by clones; NULL when borrowed */
    uint64_t    seed;                  /* kiln_weight_random seed (kept for the .kg printer) */
    bool        random;                /* a kiln_weight_random weight: data NULL until materialized */
    float       rand_scale;            /* kiln_weight_random scale; 0 when data came from the caller */
} kiln_node_rec;

typedef struct kiln_sym_rec {
    char   *name; /* unique symbol name; owned */
    int64_t max;  /* upper bound (inclusive) */
} kiln_sym_rec;

typedef struct kiln_output_rec {
    char    *name; /* output name; owned */
    uint32_t node; /* node index */
} kiln_output_rec;

struct kiln_graph {
    uint32_t        id;        /* process-unique serial, the high half of every kiln_node */
    kiln_node_rec  *nodes;     /* arena; array order is topological */
    uint32_t        n_nodes;   /* nodes in use */
    uint32_t        cap_nodes; /* allocated */
    kiln_sym_rec   *syms;      /* symbols; symbol i is dim value -(i+1) */
    uint32_t        n_syms;    /* symbols in use */
    kiln_output_rec *outs;     /* outputs in order of declaration */
    uint32_t        n_outs;    /* outputs in use */
    kiln_status     status;    /* first builder error, sticky */
    char            error[512];/* its message */
};

/* Symbol encoding inside dims. */
static inline bool     kiln_dim_is_sym(int64_t d) { return d < 0; }
static inline uint32_t kiln_sym_index(int64_t d) { return (uint32_t)(-(d + 1)); }
static inline int64_t  kiln_sym_dim(uint32_t i) { return -(int64_t)i - 1; }

/* Node handles <-> indices. */
static inline kiln_node kiln_graph_handle(const kiln_graph *g, uint32_t idx)
{
    return ((uint64_t)g->id << 32) | (uint64_t)(idx + 1);
}

/* Records the first error on g (printf-style); later errors are ignored. Returns KILN_NODE_NONE. */
kiln_node kiln_graph_fail(kiln_graph *g, kiln_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resolves a handle to an index, failing the graph (naming `what` and the op) when it is bad. */
bool kiln_graph_resolve(kiln_graph *g, const char *op, const char *what, kiln_node h, uint32_t *out);

/* Appends a node (all fields given by the caller except name); returns its handle or NONE (OOM). */
kiln_node kiln_graph_append(kiln_graph *g, const kiln_node_rec *rec);

/* Concrete dims of node n given symbol values (vals[i] for symbol i); returns element count. */
int64_t kiln_node_numel(const kiln_node_rec *n, const int64_t *sym_vals, int64_t dims_out[KILN_MAX_RANK]);
/* Bytes of a node with the given concrete element dims (rows of the last dim for block dtypes). */
size_t kiln_node_bytes(const kiln_node_rec *n, const int64_t dims[KILN_MAX_RANK]);

/* Looks up a leaf, symbol or output by name: returns node index / symbol index or KILN_IDX_NONE. */
uint32_t kiln_graph_find_leaf(const kiln_graph *g, const char *name);
uint32_t kiln_graph_find_sym(const kiln_graph *g, const char *name);
uint32_t kiln_graph_find_output(const kiln_graph *g, const char *name);

/* Copy for a plan: nodes, names, symbols and outputs are duplicated; weight bytes are shared
 * (owned ones by reference count, borrowed ones stay borrowed). Returns NULL on OOM. */
kiln_graph *kiln_graph_clone(const kiln_graph *g);

/* A refcounted block of weight bytes. */
typedef struct kiln_blob kiln_blob;
kiln_blob *kiln_blob_new(size_t bytes, void **data_out); /* refs = 1; NULL on OOM */
void       kiln_blob_ref(kiln_blob *b);
void       kiln_blob_unref(kiln_blob *b);                  /* frees at 0; NULL does nothing */

/* Random weights (kiln_weight_random) carry only seed and scale until a plan needs their bytes:
 * building and parsing stay cheap whatever the declared size. kiln_graph_materialize_weights
 * generates every random weight of g that some op reads (or that is an output) and that has no
 * bytes yet (rows split over up to one thread per
 * core; the values do not depend on the split) into a refcounted blob. KILN_ERR_NOMEM when a
 * weight cannot be allocated (the graph is left as it was for that weight). */
kiln_status kiln_graph_materialize_weights(kiln_graph *g);
/* Writes the bytes of random weight n into dst (kiln_node_bytes of its dims), in parallel. */
kiln_status kiln_graph_weight_fill(const kiln_node_rec *n, void *dst);

/* Formats dims as "[4096, n_kv]" into buf. */
const char *kiln_graph_dims_str(const kiln_graph *g, int rank, const int64_t *dims, char *buf, size_t n);

/* The 128-bit graph hash (kiln_graph_hash prints it). */
kiln_status kiln_graph_hash128(const kiln_graph *g, uint64_t out[2]);

/* The canonical copy of g (canon.c): nodes in an order that depends only on the structure, symbols
 * renumbered by first use, names and weights kept. hash gets the structural hash of the copy
 * (the graph hash plus the symbols' bounds and the pins): two graphs built by the same calls in
 * another order, or with other names or weights, hash equal. NULL on OOM. */
kiln_graph *kiln_graph_canonical(const kiln_graph *g, uint64_t hash[2]);
