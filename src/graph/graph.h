/* The graph IR: one arena of nodes per graph, node ids are uint32_t indices, array order is a
 * topological order. Builders append; no pass edits a graph in place. Shared by every stage.
 * Must not know about backends, fusion or plans. */
#pragma once

#include "kiln/kiln.h"

#define KILN_IDX_NONE UINT32_MAX /* "no node" inside the IR */

/* What kind of work an op is: fusion makes regions of it (elementwise ops fuse into any anchor's
 * prologue or epilogue), the cost model and the reference evaluators read it. */
enum kiln_op_class {
    KILN_OPC_LEAF = 0,     /* none, input, weight, state: no work */
    KILN_OPC_ELEMENTWISE,  /* y[i] = f(a[i], b[i % |b|]): a map region, fusable */
    KILN_OPC_ROW,          /* per-row reduction or row op: a rows region */
    KILN_OPC_MATMUL,       /* the matmul anchor */
    KILN_OPC_ATTENTION,    /* the attention anchor */
    KILN_OPC_SCATTER,      /* kv_scatter */
    KILN_OPC_MOVE,         /* data movement: get_rows, transpose, concat */
    KILN_OPC_ALIAS,        /* reshape, view: no kernel */
    KILN_OPC_COLLECTIVE,   /* all_reduce, all_gather: a region of its own, joined across the parts of a split plan */
    KILN_OPC_COUNT
};

/* Every op, once: X(ID, "name", class, flops per result element (0: the cost model computes it,
 * or none), then its .kg form: operands required, optional, parameter bits accepted and required
 * (KILN_KG_P_*: kg.h), usage text). Sources and parameters of each op are in the comment of its
 * builder in kiln.h. Adding an op: a row here, its builder (ops.c, kiln.h), its ref kernel
 * (backends/ref), its f64 reference (check/ref64.c), its lowering formula (codegen kl_apply for
 * elementwise ops) and its contract (contracts/NAME.yaml). */
#define KILN_OPS(X)                                                                                   \
    X(NONE,       "none",       LEAF,        0, 0, 0, 0, 0, NULL)                                    \
    X(INPUT,      "input",      LEAF,        0, 0, 0, 0, 0, NULL) /* bound at each run */            \
    X(WEIGHT,     "weight",     LEAF,        0, 0, 0, 0, 0, NULL) /* constant data */                \
    X(STATE,      "state",      LEAF,        0, 0, 0, 0, 0, NULL) /* persistent in the plan */       \
    X(MATMUL,     "matmul",     MATMUL,      0, 2, 0, 0, 0, "x w")                                   \
    X(ADD,        "add",        ELEMENTWISE, 1, 2, 0, 0, 0, "a b") /* b broadcast over leading dims */ \
    X(MUL,        "mul",        ELEMENTWISE, 1, 2, 0, 0, 0, "a b")                                   \
    X(SCALE,      "scale",      ELEMENTWISE, 1, 1, 0, P(S), P(S), "x s=FLOAT") /* f[0] = s */       \
    X(SILU,       "silu",       ELEMENTWISE, 5, 1, 0, 0, 0, "x")                                     \
    X(GELU,       "gelu",       ELEMENTWISE, 5, 1, 0, 0, 0, "x") /* tanh approximation */           \
    X(SWIGLU,     "swiglu",     ELEMENTWISE, 5, 2, 0, 0, 0, "gate up")                               \
    X(RMS_NORM,   "rms_norm",   ROW,         5, 1, 1, P(EPS), 0, "x [w] [eps=FLOAT]")              \
    X(LAYER_NORM, "layer_norm", ROW,         5, 1, 2, P(EPS), 0, "x [w] [b] [eps=FLOAT]")          \
    X(SOFTMAX,    "softmax",    ROW,         5, 1, 0, 0, 0, "x")                                     \
    X(ROPE,       "rope",       ROW,         5, 2, 0, P(MODE) | P(THETA) | P(MULT) | P(ROT), 0,                    \
      "x pos [mode=normal|neox] [theta=FLOAT] [mult=\"F,F,...\"] [rot=INT]") /* i[0] mode, i[1] rotary dims (0: all), f[0] theta */ \
    X(ATTENTION,  "attention",  ATTENTION,   0, 3, 0, P(NKV) | P(SCALE) | P(SOFTCAP) | P(WINDOW), P(NKV),             \
      "q k v n_kv=DIM [scale=FLOAT] [softcap=FLOAT] [window=INT]") /* f[0] scale, f[1] softcap, i[1] window */ \
    X(KV_SCATTER, "kv_scatter", SCATTER,     0, 3, 0, 0, 0, "state rows pos") /* aliases the state */ \
    X(GET_ROWS,   "get_rows",   MOVE,        0, 2, 0, 0, 0, "table ids")                             \
    X(ARGMAX,     "argmax",     ROW,         1, 1, 0, 0, 0, "x")                                     \
    X(CAST,       "cast",       ELEMENTWISE, 1, 1, 0, P(DTYPE), P(DTYPE), "x dtype=DTYPE")           \
    X(RESHAPE,    "reshape",    ALIAS,       0, 1, 0, P(DIMS), P(DIMS), "x [dims]")                 \
    X(VIEW,       "view",       ALIAS,       0, 1, 0, P(DIMS) | P(OFFSET), P(DIMS), "x [dims] [offset=INT]") \
    X(TRANSPOSE,  "transpose",  MOVE,        0, 1, 0, P(D0) | P(D1), P(D0) | P(D1), "x d0=INT d1=INT") \
    X(CONCAT,     "concat",     MOVE,        0, 2, 0, P(AXIS), P(AXIS), "a b axis=INT")             \
    X(SIGMOID,    "sigmoid",    ELEMENTWISE, 4, 1, 0, 0, 0, "x") /* 1 / (1 + e^-x) */            \
    X(PAGED_ATTENTION, "paged_attention", ATTENTION, 0, 6, 1, P(BLOCK) | P(SCALE) | P(SOFTCAP) | P(WINDOW), P(BLOCK), \
      "q k v pos seqs blocks [parents] block=INT [scale=FLOAT] [softcap=FLOAT] [window=INT]") /* i[0] block, f[0] scale, \
      f[1] softcap, i[1] window as attention; parents: a tree step (no softcap or window) */ \
    X(ALL_REDUCE, "all_reduce", COLLECTIVE,  0, 1, 0, 0, 0, "x") /* i[0]: devices summed (split pass) */ \
    X(ALL_GATHER, "all_gather", COLLECTIVE,  0, 1, 0, 0, 0, "x") /* i[0]: devices (split pass), y [i[0], x] */ \
    X(TANH,       "tanh",       ELEMENTWISE, 6, 1, 0, 0, 0, "x") /* final-logit soft-capping (gemma) */ \
    X(MOE_ROUTE,  "moe_route",  ROW,         6, 1, 0, P(K) | P(NORM), P(K), "x k=INT [norm=0|1]") /* i[0] k, \
      i[1] norm: the experts' weights of a mixture-of-experts router (softmax, top k, zeros elsewhere) */ \
    X(SCALE_ROWS, "scale_rows", ROW,         1, 2, 0, P(COL), P(COL), "x w col=INT") /* i[0] col: row r of x \
      times w[r, col] (a routed expert's weight, a shared expert's gate) */ \
    X(MOE_MATMUL, "moe_matmul", MOVE,        0, 3, 0, P(K) | P(SUM), P(K), "x w r k=INT [sum=0|1]") /* i[0] k, \
      i[1] sum: x times only the k routed experts of a stack w [E, N, K] (the largest of r's row; ggml's \
      mul_mat_id), their outputs kept per slot or summed weighted by r. A region of its own (lower_moe.c on GPUs) */

enum kiln_op {
#define KILN_OP_ENUM(id, name, cls, flops, nreq, nopt, params, req, usage) KILN_OP_##id,
    KILN_OPS(KILN_OP_ENUM)
#undef KILN_OP_ENUM
    KILN_OP_COUNT
};

/* The op's .kg/message name; parse is its inverse. */
const char *kiln_op_name(enum kiln_op op);
bool        kiln_op_parse(const char *name, enum kiln_op *out);
/* Its class (KILN_OPC_LEAF for out-of-range values), whether it is elementwise, and the FLOPs the
 * cost model counts per result element (0 for leaves, aliases and the anchors it sizes itself). */
enum kiln_op_class kiln_op_class_of(enum kiln_op op);

/* For codegen.precision = KILN_PREC_F16: each f32 elementwise node read only as the x of matmuls
 * with 16-bit or block weights (never an output) becomes f16 (bf16 for bf16 weights), the type
 * those GEMMs round x to anyway (graph.c says why); attentions read so too, and readers through
 * reshapes. Called on the compile's own copy (kiln_compile, every backend) and by kiln ptx. */
struct kiln_graph;
void kiln_graph_narrow_gemm_inputs(struct kiln_graph *g);
bool               kiln_op_is_elementwise(enum kiln_op op);
double             kiln_op_flops(enum kiln_op op);
/* Builds a unary elementwise op without parameters (silu, gelu, sigmoid, ...): the .kg parser and
 * the kiln.h builders share it. */
kiln_node          kiln_op_unary(kiln_graph *g, enum kiln_op op, kiln_node x);
/* The k slots of one moe_matmul row (kiln.h): slot[0..k) = the indices of the k largest of
 * r[0..e), larger first, the lower index first on ties, NaN below every number. The ref and cpu
 * kernels share it so they pick the same experts in the same order; 1 <= k <= e. */
void               kiln_moe_slots(const float *r, int64_t e, int k, int32_t *slot);

typedef struct kiln_node_rec {
    uint8_t  op;                       /* enum kiln_op */
    uint8_t  dtype;                    /* kiln_dtype of the result */
    uint8_t  rank;                     /* number of dims, 0..KILN_MAX_RANK */
    uint8_t  n_src;                    /* sources used */
    uint8_t  pin;                      /* backend id + 1 from kiln_pin; 0 = placement decides */
    int64_t  dims[KILN_MAX_RANK];      /* kiln_dim: >= 0 constant, < 0 symbol (see kiln_sym_index) */
    uint32_t src[KILN_MAX_SRC];        /* source node indices; KILN_IDX_NONE for an absent optional */
    float    f[2];                     /* float params: eps, scale, theta */
    int32_t  i[2];                     /* int params: rope mode and rotary dims, axes */
    int64_t  dim;                      /* a kiln_dim param: attention n_kv, view offset */
    float   *vec;                      /* a float vector param (rope: per-pair frequency multipliers) or NULL; owned */
    uint32_t n_vec;                    /* its length */
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

/* The first key an attention query at position p sees under node n's sliding window (i[1]; 0: none):
 * keys kiln_attn_first_key(n, p) .. p. Every backend and reference masks through this one rule. */
static inline int64_t kiln_attn_first_key(const kiln_node_rec *n, int64_t p)
{
    int64_t w = n->i[1];
    return w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
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

/* Rotary dims of rope node n over head_dim hd: its n_rot (i[1], kiln_rope_partial), 0 meaning hd. */
static inline int64_t kiln_rope_dims(const kiln_node_rec *n, int64_t hd) { return n->i[1] > 0 ? n->i[1] : hd; }

/* Rotary frequency of pair i (i < hd/2) of a rope node over head_dim hd: theta^(-2i/d) with d its
 * rotary dims, times the node's per-pair multiplier when it has them (kiln_rope_ext); 0 for the
 * pass-through pairs i >= d/2 of a partial rope. Every backend's rope reads it from here. */
double kiln_rope_freq(const kiln_node_rec *n, int64_t i, int64_t hd);

/* The 128-bit graph hash (kiln_graph_hash prints it). */
kiln_status kiln_graph_hash128(const kiln_graph *g, uint64_t out[2]);

/* The canonical copy of g (canon.c): nodes in an order that depends only on the structure, symbols
 * renumbered by first use, names and weights kept. hash gets the structural hash of the copy
 * (the graph hash plus the symbols' bounds and the pins): two graphs built by the same calls in
 * another order, or with other names or weights, hash equal. NULL on OOM. */
kiln_graph *kiln_graph_canonical(const kiln_graph *g, uint64_t hash[2]);
