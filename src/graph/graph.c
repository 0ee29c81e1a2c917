/* The graph arena: creation, handles, sticky errors, symbols, leaves, outputs, lookup, clone.
 * Op builders and their shape rules live in ops.c; the hash in hash.c. Nothing here aborts on
 * a caller's mistake: the first error sticks to the graph. */
#include "graph/graph.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint g_next_graph_id = 1;

static const char *const op_names[KILN_OP_COUNT] = {
#define KILN_OP_NAME(id, name, cls, flops, nreq, nopt, params, req, usage) [KILN_OP_##id] = name,
    KILN_OPS(KILN_OP_NAME)
#undef KILN_OP_NAME
};

static const uint8_t op_class[KILN_OP_COUNT] = {
#define KILN_OP_CLASS(id, name, cls, flops, nreq, nopt, params, req, usage) [KILN_OP_##id] = KILN_OPC_##cls,
    KILN_OPS(KILN_OP_CLASS)
#undef KILN_OP_CLASS
};

static const double op_flops[KILN_OP_COUNT] = {
#define KILN_OP_FLOPS(id, name, cls, flops, nreq, nopt, params, req, usage) [KILN_OP_##id] = flops,
    KILN_OPS(KILN_OP_FLOPS)
#undef KILN_OP_FLOPS
};

enum kiln_op_class kiln_op_class_of(enum kiln_op op) { return (unsigned)op < KILN_OP_COUNT ? (enum kiln_op_class)op_class[op] : KILN_OPC_LEAF; }
bool kiln_op_is_elementwise(enum kiln_op op) { return kiln_op_class_of(op) == KILN_OPC_ELEMENTWISE; }
double kiln_op_flops(enum kiln_op op) { return (unsigned)op < KILN_OP_COUNT ? op_flops[op] : 0; }


const char *kiln_op_name(enum kiln_op op)
{
    return (unsigned)op < KILN_OP_COUNT ? op_names[op] : "?";
}

bool kiln_op_parse(const char *name, enum kiln_op *out)
{
    for (int i = 1; i < KILN_OP_COUNT; i++)
        if (name && strcmp(name, op_names[i]) == 0) {
            *out = (enum kiln_op)i;
            return true;
        }
    return false;
}

KILN_API kiln_status kiln_graph_new(kiln_graph **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    kiln_graph *g = calloc(1, sizeof *g);
    if (!g) return KILN_ERR_NOMEM;
    g->id = atomic_fetch_add(&g_next_graph_id, 1);
    if (g->id == 0) g->id = atomic_fetch_add(&g_next_graph_id, 1); /* 0 would make handle 0 = NONE-like */
    *out = g;
    return KILN_OK;
}

KILN_API void kiln_graph_free(kiln_graph *g)
{
    if (!g) return;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        free(g->nodes[i].name);
        free(g->nodes[i].vec);
        kiln_blob_unref(g->nodes[i].blob);
    }
    for (uint32_t i = 0; i < g->n_syms; i++) free(g->syms[i].name);
    for (uint32_t i = 0; i < g->n_outs; i++) free(g->outs[i].name);
    free(g->nodes);
    free(g->syms);
    free(g->outs);
    free(g);
}

KILN_API kiln_status kiln_graph_status(const kiln_graph *g) { return g ? g->status : KILN_ERR_INVALID_ARG; }
KILN_API const char *kiln_graph_error(const kiln_graph *g) { return g ? g->error : "graph is NULL"; }
KILN_API uint32_t kiln_graph_size(const kiln_graph *g) { return g ? g->n_nodes : 0; }

kiln_node kiln_graph_fail(kiln_graph *g, kiln_status s, const char *fmt, ...)
{
    if (g->status != KILN_OK) return KILN_NODE_NONE;
    g->status = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof g->error, fmt, ap);
    va_end(ap);
    return KILN_NODE_NONE;
}

bool kiln_graph_resolve(kiln_graph *g, const char *op, const char *what, kiln_node h, uint32_t *out)
{
    if (h == KILN_NODE_NONE) {
        kiln_graph_fail(g, KILN_ERR_NODE, "%s: operand '%s' is missing (KILN_NODE_NONE)", op, what);
        return false;
    }
    if ((uint32_t)(h >> 32) != g->id) {
        kiln_graph_fail(g, KILN_ERR_NODE, "%s: operand '%s' is a node of another graph", op, what);
        return false;
    }
    uint32_t idx = (uint32_t)h - 1;
    if ((uint32_t)h == 0 || idx >= g->n_nodes) {
        kiln_graph_fail(g, KILN_ERR_NODE, "%s: operand '%s' is an unknown node id %u", op, what, (uint32_t)h);
        return false;
    }
    *out = idx;
    return true;
}

kiln_node kiln_graph_append(kiln_graph *g, const kiln_node_rec *rec)
{
    if (g->n_nodes == g->cap_nodes) {
        uint32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
        kiln_node_rec *n = realloc(g->nodes, (size_t)cap * sizeof *n);
        if (!n) return kiln_graph_fail(g, KILN_ERR_NOMEM, "out of memory growing the graph to %u nodes", cap);
        g->nodes = n;
        g->cap_nodes = cap;
    }
    if (g->n_nodes >= UINT32_MAX - 2)
        return kiln_graph_fail(g, KILN_ERR_SHAPE, "graph has too many nodes");
    g->nodes[g->n_nodes] = *rec;
    g->nodes[g->n_nodes].name = NULL;
    g->nodes[g->n_nodes].vec = NULL; /* the builder copies its own (kiln_rope_ext) */
    g->nodes[g->n_nodes].n_vec = 0;
    return kiln_graph_handle(g, g->n_nodes++);
}

const char *kiln_graph_dims_str(const kiln_graph *g, int rank, const int64_t *dims, char *buf, size_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < rank && o < n; i++) {
        if (kiln_dim_is_sym(dims[i]) && kiln_sym_index(dims[i]) < g->n_syms)
            o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", g->syms[kiln_sym_index(dims[i])].name);
        else
            o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)dims[i]);
    }
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* ------------------------------------------------------------------ symbols */

static bool valid_name(const char *s)
{
    if (!s || !*s || strlen(s) > 200) return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.' ||
                  (p != s && ((c >= '0' && c <= '9') || c == '-'));
        if (!ok) return false;
    }
    return true;
}

static bool name_taken(const kiln_graph *g, const char *name)
{
    return kiln_graph_find_leaf(g, name) != KILN_IDX_NONE || kiln_graph_find_output(g, name) != KILN_IDX_NONE ||
           kiln_graph_find_sym(g, name) != KILN_IDX_NONE;
}

KILN_API kiln_dim kiln_sym(kiln_graph *g, const char *name, int64_t max)
{
    if (!g || g->status != KILN_OK) return 0;
    if (!valid_name(name)) {
        kiln_graph_fail(g, KILN_ERR_NAME, "sym: bad name '%s' (letters, digits, _ . -; at most 200)", name ? name : "(null)");
        return 0;
    }
    uint32_t s = kiln_graph_find_sym(g, name);
    if (s != KILN_IDX_NONE) {
        if (g->syms[s].max == max) return kiln_sym_dim(s);
        kiln_graph_fail(g, KILN_ERR_NAME, "sym '%s': declared again with max %lld (was %lld)", name, (long long)max,
                        (long long)g->syms[s].max);
        return 0;
    }
    if (max < 1 || max > ((int64_t)1 << 40)) {
        kiln_graph_fail(g, KILN_ERR_SHAPE, "sym '%s': max %lld out of range [1, 2^40]", name, (long long)max);
        return 0;
    }
    if (name_taken(g, name)) {
        kiln_graph_fail(g, KILN_ERR_NAME, "sym '%s': name already used by a leaf or output", name);
        return 0;
    }
    kiln_sym_rec *n = realloc(g->syms, (size_t)(g->n_syms + 1) * sizeof *n);
    char *copy = strdup(name);
    if (!n || !copy) {
        free(copy);
        if (n) g->syms = n;
        kiln_graph_fail(g, KILN_ERR_NOMEM, "sym '%s': out of memory", name);
        return 0;
    }
    g->syms = n;
    g->syms[g->n_syms] = (kiln_sym_rec){.name = copy, .max = max};
    return kiln_sym_dim(g->n_syms++);
}

/* ------------------------------------------------------------------ leaves */

/* Checks rank and dims of a new tensor; `constant` forbids symbols. Computes the max bytes. */
static bool check_dims(kiln_graph *g, const char *what, const char *name, kiln_dtype t, int rank,
                       const kiln_dim *dims, bool constant)
{
    if ((unsigned)t >= KILN_DTYPE_COUNT) {
        kiln_graph_fail(g, KILN_ERR_DTYPE, "%s '%s': unknown dtype %d", what, name, (int)t);
        return false;
    }
    if (rank < 1 || rank > KILN_MAX_RANK) {
        kiln_graph_fail(g, KILN_ERR_SHAPE, "%s '%s': rank %d out of range [1, %d]", what, name, rank, KILN_MAX_RANK);
        return false;
    }
    if (!dims) {
        kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "%s '%s': dims is NULL", what, name);
        return false;
    }
    unsigned __int128 bytes = kiln_dtype_block_bytes(t);
    for (int i = 0; i < rank; i++) {
        int64_t d = dims[i], mx;
        if (kiln_dim_is_sym(d)) {
            if (constant) {
                kiln_graph_fail(g, KILN_ERR_SHAPE, "%s '%s': dim %d must be constant (symbols are for inputs and ops)", what, name, i);
                return false;
            }
            if (kiln_sym_index(d) >= g->n_syms) {
                kiln_graph_fail(g, KILN_ERR_SHAPE, "%s '%s': dim %d is not a symbol of this graph", what, name, i);
                return false;
            }
            mx = g->syms[kiln_sym_index(d)].max;
        } else if (d < 1) {
            kiln_graph_fail(g, KILN_ERR_SHAPE, "%s '%s': dim %d is %lld (must be >= 1)", what, name, i, (long long)d);
            return false;
        } else {
            mx = d;
        }
        if (i == rank - 1) {
            int64_t blk = kiln_dtype_block(t);
            if (blk > 1 && (kiln_dim_is_sym(d) || d % blk != 0)) {
                kiln_graph_fail(g, KILN_ERR_SHAPE, "%s '%s': last dim %lld is not a multiple of %s's block of %lld",
                                what, name, (long long)d, kiln_dtype_name(t), (long long)blk);
                return false;
            }
            bytes = bytes * (unsigned __int128)(mx / blk);
        } else {
            bytes = bytes * (unsigned __int128)mx;
        }
        if (bytes > ((unsigned __int128)1 << 50)) {
            kiln_graph_fail(g, KILN_ERR_SHAPE, "%s '%s': byte size overflows (more than 2^50 bytes)", what, name);
            return false;
        }
    }
    return true;
}

static kiln_node add_leaf(kiln_graph *g, enum kiln_op op, const char *name, kiln_dtype t, int rank,
                          const kiln_dim *dims, bool constant)
{
    const char *what = kiln_op_name(op);
    if (!valid_name(name))
        return kiln_graph_fail(g, KILN_ERR_NAME, "%s: bad name '%s' (letters, digits, _ . -; at most 200)", what,
                               name ? name : "(null)");
    if (name_taken(g, name))
        return kiln_graph_fail(g, KILN_ERR_NAME, "%s '%s': name already used", what, name);
    if (!check_dims(g, what, name, t, rank, dims, constant)) return KILN_NODE_NONE;
    kiln_node_rec r = {.op = (uint8_t)op, .dtype = (uint8_t)t, .rank = (uint8_t)rank};
    for (int i = 0; i < KILN_MAX_SRC; i++) r.src[i] = KILN_IDX_NONE;
    for (int i = 0; i < rank; i++) r.dims[i] = dims[i];
    char *copy = strdup(name);
    if (!copy) return kiln_graph_fail(g, KILN_ERR_NOMEM, "%s '%s': out of memory", what, name);
    kiln_node h = kiln_graph_append(g, &r);
    if (h == KILN_NODE_NONE) {
        free(copy);
        return h;
    }
    g->nodes[g->n_nodes - 1].name = copy;
    return h;
}

KILN_API kiln_node kiln_input(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims)
{
    if (!g || g->status != KILN_OK) return KILN_NODE_NONE;
    return add_leaf(g, KILN_OP_INPUT, name, t, rank, dims, false);
}

KILN_API kiln_node kiln_state(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims)
{
    if (!g || g->status != KILN_OK) return KILN_NODE_NONE;
    if ((unsigned)t < KILN_DTYPE_COUNT && kiln_dtype_block(t) > 1 && t != KILN_DTYPE_Q8_0) /* refused here, not at the first kv_scatter */
        return kiln_graph_fail(g, KILN_ERR_DTYPE,
                               "state '%s': %s is a block format; states (KV caches) are f32, f16, bf16, i32 or q8_0 "
                               "(the only quantized KV cache)", name ? name : "(null)", kiln_dtype_name(t));
    if (t == KILN_DTYPE_Q8_0 && (rank < 1 || !dims || kiln_dim_is_sym(dims[rank - 1]) || dims[rank - 1] % 32))
        return kiln_graph_fail(g, KILN_ERR_SHAPE, "state '%s': a q8_0 state's last dim must be a constant multiple of 32 "
                               "(blocks of 32 values)", name ? name : "(null)");
    return add_leaf(g, KILN_OP_STATE, name, t, rank, dims, true);
}

KILN_API kiln_node kiln_weight(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims,
                               const void *data, kiln_weight_mode mode)
{
    if (!g || g->status != KILN_OK) return KILN_NODE_NONE;
    if (!data) return kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "weight '%s': data is NULL", name ? name : "(null)");
    if ((unsigned)mode >= KILN_WEIGHT_MODE_COUNT)
        return kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "weight '%s': bad mode %d", name ? name : "(null)", (int)mode);
    kiln_node h = add_leaf(g, KILN_OP_WEIGHT, name, t, rank, dims, true);
    if (h == KILN_NODE_NONE) return h;
    kiln_node_rec *n = &g->nodes[g->n_nodes - 1];
    size_t bytes = kiln_node_bytes(n, n->dims);
    if (mode == KILN_WEIGHT_COPY) {
        void *copy;
        n->blob = kiln_blob_new(bytes, &copy);
        if (!n->blob) {
            g->n_nodes--;
            free(n->name);
            return kiln_graph_fail(g, KILN_ERR_NOMEM, "weight '%s': out of memory copying %zu bytes", name, bytes);
        }
        memcpy(copy, data, bytes);
        n->data = copy;
    } else {
        n->data = data;
    }
    return h;
}

KILN_API kiln_node kiln_weight_random(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims,
                                      uint64_t seed, float scale)
{
    if (!g || g->status != KILN_OK) return KILN_NODE_NONE;
    if (t == KILN_DTYPE_I32)
        return kiln_graph_fail(g, KILN_ERR_DTYPE, "weight '%s': random data needs a float or block dtype", name ? name : "(null)");
    if (!(scale >= 0 && scale < 1e30f))
        return kiln_graph_fail(g, KILN_ERR_INVALID_ARG, "weight '%s': bad scale", name ? name : "(null)");
    kiln_node h = add_leaf(g, KILN_OP_WEIGHT, name, t, rank, dims, true);
    if (h == KILN_NODE_NONE) return h;
    kiln_node_rec *n = &g->nodes[g->n_nodes - 1];
    /* No bytes now: kiln_graph_materialize_weights makes them when a plan is compiled. */
    n->random = true;
    n->seed = seed;
    n->rand_scale = scale;
    return h;
}

KILN_API kiln_status kiln_output(kiln_graph *g, kiln_node x, const char *name)
{
    if (!g) return KILN_ERR_INVALID_ARG;
    if (g->status != KILN_OK) return g->status;
    uint32_t idx;
    if (!kiln_graph_resolve(g, "output", "x", x, &idx)) return g->status;
    if (!valid_name(name)) {
        kiln_graph_fail(g, KILN_ERR_NAME, "output: bad name '%s'", name ? name : "(null)");
        return g->status;
    }
    if (name_taken(g, name)) {
        kiln_graph_fail(g, KILN_ERR_NAME, "output '%s': name already used", name);
        return g->status;
    }
    kiln_output_rec *o = realloc(g->outs, (size_t)(g->n_outs + 1) * sizeof *o);
    char *copy = strdup(name);
    if (!o || !copy) {
        free(copy);
        if (o) g->outs = o;
        kiln_graph_fail(g, KILN_ERR_NOMEM, "output '%s': out of memory", name);
        return g->status;
    }
    g->outs = o;
    g->outs[g->n_outs++] = (kiln_output_rec){.name = copy, .node = idx};
    return KILN_OK;
}

KILN_API kiln_status kiln_name(kiln_graph *g, kiln_node x, const char *name)
{
    if (!g) return KILN_ERR_INVALID_ARG;
    if (g->status != KILN_OK) return g->status;
    uint32_t idx;
    if (!kiln_graph_resolve(g, "name", "x", x, &idx)) return g->status;
    if (!valid_name(name)) {
        kiln_graph_fail(g, KILN_ERR_NAME, "name: bad name '%s'", name ? name : "(null)");
        return g->status;
    }
    kiln_node_rec *n = &g->nodes[idx];
    if (n->op == KILN_OP_INPUT || n->op == KILN_OP_WEIGHT || n->op == KILN_OP_STATE) {
        kiln_graph_fail(g, KILN_ERR_NAME, "name '%s': leaves are named when created", name);
        return g->status;
    }
    char *copy = strdup(name);
    if (!copy) {
        kiln_graph_fail(g, KILN_ERR_NOMEM, "name '%s': out of memory", name);
        return g->status;
    }
    free(n->name);
    n->name = copy;
    return KILN_OK;
}

/* ------------------------------------------------------------------ weight blobs */

struct kiln_blob {
    atomic_int refs;  /* owners: the graph and every clone */
    size_t     bytes; /* payload size */
    _Alignas(64) unsigned char data[]; /* payload, 64-byte aligned for SIMD loads */
};

kiln_blob *kiln_blob_new(size_t bytes, void **data_out)
{
    kiln_blob *b = aligned_alloc(64, (sizeof(kiln_blob) + bytes + 63) / 64 * 64);
    if (!b) return NULL;
    atomic_init(&b->refs, 1);
    b->bytes = bytes;
    *data_out = b->data;
    return b;
}

void kiln_blob_ref(kiln_blob *b) { atomic_fetch_add(&b->refs, 1); }

void kiln_blob_unref(kiln_blob *b)
{
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
}

/* ------------------------------------------------------------------ sizes and lookup */

int64_t kiln_node_numel(const kiln_node_rec *n, const int64_t *sym_vals, int64_t dims_out[KILN_MAX_RANK])
{
    int64_t numel = 1;
    for (int i = 0; i < KILN_MAX_RANK; i++) {
        int64_t d = 0;
        if (i < n->rank) d = kiln_dim_is_sym(n->dims[i]) ? sym_vals[kiln_sym_index(n->dims[i])] : n->dims[i];
        if (dims_out) dims_out[i] = d;
        if (i < n->rank) numel *= d;
    }
    return numel;
}

size_t kiln_node_bytes(const kiln_node_rec *n, const int64_t dims[KILN_MAX_RANK])
{
    if (n->rank == 0) return 0;
    size_t rows = 1;
    for (int i = 0; i + 1 < n->rank; i++) rows *= (size_t)dims[i];
    return rows * kiln_row_bytes((kiln_dtype)n->dtype, dims[n->rank - 1]);
}

uint32_t kiln_graph_find_leaf(const kiln_graph *g, const char *name)
{
    for (uint32_t i = 0; name && i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        if ((n->op == KILN_OP_INPUT || n->op == KILN_OP_WEIGHT || n->op == KILN_OP_STATE) && n->name &&
            strcmp(n->name, name) == 0)
            return i;
    }
    return KILN_IDX_NONE;
}

uint32_t kiln_graph_find_sym(const kiln_graph *g, const char *name)
{
    for (uint32_t i = 0; name && i < g->n_syms; i++)
        if (strcmp(g->syms[i].name, name) == 0) return i;
    return KILN_IDX_NONE;
}

uint32_t kiln_graph_find_output(const kiln_graph *g, const char *name)
{
    for (uint32_t i = 0; name && i < g->n_outs; i++)
        if (strcmp(g->outs[i].name, name) == 0) return i;
    return KILN_IDX_NONE;
}

kiln_graph *kiln_graph_clone(const kiln_graph *src)
{
    kiln_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    *g = *src;
    g->nodes = calloc(src->cap_nodes ? src->cap_nodes : 1, sizeof *g->nodes);
    g->syms = calloc(src->n_syms ? src->n_syms : 1, sizeof *g->syms);
    g->outs = calloc(src->n_outs ? src->n_outs : 1, sizeof *g->outs);
    g->n_nodes = g->n_syms = g->n_outs = 0;
    if (!g->nodes || !g->syms || !g->outs) goto fail;
    for (uint32_t i = 0; i < src->n_nodes; i++, g->n_nodes++) {
        kiln_node_rec *n = &g->nodes[i];
        *n = src->nodes[i];
        n->name = NULL;
        n->vec = NULL;
        if (src->nodes[i].name && !(n->name = strdup(src->nodes[i].name))) goto fail;
        if (src->nodes[i].vec) {
            if (!(n->vec = malloc((size_t)n->n_vec * sizeof *n->vec))) goto fail;
            memcpy(n->vec, src->nodes[i].vec, (size_t)n->n_vec * sizeof *n->vec);
        }
        if (n->blob) kiln_blob_ref(n->blob);
    }
    for (uint32_t i = 0; i < src->n_syms; i++, g->n_syms++)
        if (!(g->syms[i].name = strdup(src->syms[i].name))) goto fail;
        else g->syms[i].max = src->syms[i].max;
    for (uint32_t i = 0; i < src->n_outs; i++, g->n_outs++)
        if (!(g->outs[i].name = strdup(src->outs[i].name))) goto fail;
        else g->outs[i].node = src->outs[i].node;
    return g;
fail:
    kiln_graph_free(g);
    return NULL;
}

/* The 16-bit type every reader of node i takes as a matmul's x, looking through reshapes (which
 * share i's memory and type); -1: no reader; -2: some reader takes none, or i or a reshape of it is
 * a graph output. */
static int narrow_want(const kiln_graph *g, uint32_t i, int depth)
{
    for (uint32_t o = 0; o < g->n_outs; o++)
        if (g->outs[o].node == i) return -2;
    int want = -1;
    for (uint32_t j = i + 1; j < g->n_nodes && want != -2; j++) {
        const kiln_node_rec *m = &g->nodes[j];
        for (int s = 0; s < m->n_src && want != -2; s++) {
            if (m->src[s] != i) continue;
            int t;
            if (m->op == KILN_OP_RESHAPE) {
                t = depth < 4 ? narrow_want(g, j, depth + 1) : -2;
                if (t == -1) continue; /* a reshape nobody reads */
            } else {
                kiln_dtype w = m->op == KILN_OP_MATMUL && s == 0 ? (kiln_dtype)g->nodes[m->src[1]].dtype : KILN_DTYPE_F32;
                t = w == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : w == KILN_DTYPE_F16 || kiln_dtype_block(w) > 1 ? KILN_DTYPE_F16 : -2;
            }
            want = want == -1 || want == t ? t : -2;
        }
    }
    return want;
}

/* Node i and the reshapes of it (narrow_want's chains) stored as type t. */
static void narrow_set(kiln_graph *g, uint32_t i, uint8_t t, int depth)
{
    g->nodes[i].dtype = t;
    for (uint32_t j = i + 1; j < g->n_nodes && depth < 4; j++)
        if (g->nodes[j].op == KILN_OP_RESHAPE && g->nodes[j].src[0] == i) narrow_set(g, j, t, depth + 1);
}

/* Under codegen.precision = KILN_PREC_F16 the GEMMs take their x as one f16 (bf16) part: rounded
 * by a split kernel that reads the f32 node and writes the 16-bit copy the TMA reads. An
 * elementwise node whose every reader is such a matmul's x (llama's swiglu before down, a gelu
 * before an MLP's second matmul) is therefore stored in that type at once: the same rounding, done
 * by the producer's store (the gate/up GEMM's epilogue writes half the bytes), and the matmul reads
 * it as it is (no split kernel: 12 us of the 512-token llama-7b layer on the H100). An attention
 * read (through a reshape of its heads into rows) only by the O matmul likewise: its kernels
 * store 16-bit values (no split kernel before O: 7 us at 512 tokens). Readers are seen through
 * reshapes, which take the same type. Matmuls with block weights take f16; outputs and nodes
 * read by anything else keep f32. Every backend plans the narrowed graph: ref, cpu and vulkan
 * store and read the 16-bit node as its type says (cpu's fused matmul pass and its attention
 * kernels through f32 staging), within tolerance_f16_act. */
void kiln_graph_narrow_gemm_inputs(kiln_graph *g)
{
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        kiln_node_rec *x = &g->nodes[i];
        enum kiln_op_class c = kiln_op_class_of((enum kiln_op)x->op);
        if (x->dtype != KILN_DTYPE_F32 || (c != KILN_OPC_ELEMENTWISE && c != KILN_OPC_ATTENTION)) continue;
        int want = narrow_want(g, i, 0);
        if (want >= 0) narrow_set(g, i, (uint8_t)want, 0);
    }
}
