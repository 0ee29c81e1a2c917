/* .kg printer: kiln_graph -> text that kiln_kg_parse reads back to a graph of the same hash, and
 * that prints again byte-identically. Reads the IR; never changes it. Unnamed or doubly named op
 * nodes get generated names (t<index>); a weight whose data cannot be written fails the print. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "graph/kg.h"
#include "util/sbuf.h"

typedef kiln_sbuf sbuf;

typedef struct used_name {
    const char    *key; /* the name (owned by the graph or by names_owned) */
    UT_hash_handle hh;  /* uthash link */
} used_name;

typedef struct printer {
    const kiln_graph *g;     /* graph being printed */
    sbuf              out;   /* the text */
    const char      **names; /* printed name of each node */
    char            **owned; /* generated names (freed at the end); NULL where not generated */
    used_name        *used;  /* uthash set of names taken so far */
    used_name        *pool;  /* one entry per node, backing `used` */
} printer;

/* A name bare when the lexer reads it back as itself, else quoted with escapes. */
static void sb_name(sbuf *b, const char *s)
{
    if (kiln_kg_is_bare_name(s)) {
        kiln_sbuf_printf(b, "%s", s);
        return;
    }
    kiln_sbuf_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') kiln_sbuf_printf(b, "\\%c", *c);
        else if (*c == '\n') kiln_sbuf_printf(b, "\\n");
        else if (*c == '\t') kiln_sbuf_printf(b, "\\t");
        else if (*c == '\r') kiln_sbuf_printf(b, "\\r");
        else if (*c < 0x20 || *c == 0x7f) kiln_sbuf_printf(b, "\\x%02x", *c);
        else kiln_sbuf_printf(b, "%c", *c);
    }
    kiln_sbuf_printf(b, "\"");
}

static void sb_float(sbuf *b, const char *key, float v)
{
    char buf[32];
    kiln_sbuf_printf(b, " %s=%s", key, kiln_kg_fmt_float(v, buf));
}

/* Attention's soft-cap and window, written only when set (their defaults are 0: none). */
static void sb_mask(sbuf *b, const kiln_node_rec *n)
{
    if (n->f[1] != 0) sb_float(b, "softcap", n->f[1]);
    if (n->i[1] != 0) kiln_sbuf_printf(b, " window=%d", (int)n->i[1]);
}

/* A dim: a constant, or its symbol's name. False for a symbol the graph does not have. */
static bool sb_dim(printer *pr, int64_t d)
{
    if (!kiln_dim_is_sym(d)) {
        kiln_sbuf_printf(&pr->out, "%lld", (long long)d);
        return true;
    }
    if (kiln_sym_index(d) >= pr->g->n_syms) return false;
    sb_name(&pr->out, pr->g->syms[kiln_sym_index(d)].name);
    return true;
}

static bool sb_dims(printer *pr, int rank, const int64_t *dims)
{
    kiln_sbuf_printf(&pr->out, " [");
    for (int i = 0; i < rank; i++) {
        if (i) kiln_sbuf_printf(&pr->out, ", ");
        if (!sb_dim(pr, dims[i])) return false;
    }
    kiln_sbuf_printf(&pr->out, "]");
    return true;
}

/* ------------------------------------------------------------------ names */

static bool is_leaf(const kiln_node_rec *n)
{
    return n->op == KILN_OP_INPUT || n->op == KILN_OP_WEIGHT || n->op == KILN_OP_STATE;
}

static bool name_used(printer *pr, const char *s)
{
    used_name *e = NULL;
    HASH_FIND_STR(pr->used, s, e);
    return e != NULL;
}

static void use_name(printer *pr, uint32_t i, const char *s)
{
    pr->names[i] = s;
    pr->pool[i].key = s;
    HASH_ADD_KEYPTR(hh, pr->used, s, strlen(s), &pr->pool[i]);
}

/* Leaves keep their (unique, required) names; then each named op keeps its name unless an
 * earlier node took it; the rest get t<index> (plus '_' until free). Deterministic, so a printed
 * graph parsed and printed again gives the same names. */
static kiln_status assign_names(printer *pr)
{
    const kiln_graph *g = pr->g;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < g->n_nodes; i++) {
            const kiln_node_rec *n = &g->nodes[i];
            if (is_leaf(n) != (pass == 0) || !n->name || name_used(pr, n->name)) {
                if (pass == 0 && is_leaf(n)) return KILN_ERR_INTERNAL; /* leaves are named and unique */
                continue;
            }
            use_name(pr, i, n->name);
        }
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        if (pr->names[i]) continue;
        char *gen = malloc(32);
        if (!gen) return KILN_ERR_NOMEM;
        int len = snprintf(gen, 32, "t%u", i);
        while (name_used(pr, gen)) {
            char *longer = realloc(gen, (size_t)len + 2);
            if (!longer) {
                free(gen);
                return KILN_ERR_NOMEM;
            }
            gen = longer;
            gen[len++] = '_';
            gen[len] = '\0';
        }
        pr->owned[i] = gen;
        use_name(pr, i, gen);
    }
    return KILN_OK;
}

/* ------------------------------------------------------------------ lines */

static kiln_status print_weight_data(printer *pr, const kiln_node_rec *n)
{
    sbuf *b = &pr->out;
    if (n->random) { /* kiln_weight_random: its seed, not its bytes */
        kiln_sbuf_printf(b, " seed=%llu", (unsigned long long)n->seed);
        sb_float(b, "scale", n->rand_scale);
        return KILN_OK;
    }
    size_t bytes;
    const char *why;
    if (!kiln_kg_weight_bytes((kiln_dtype)n->dtype, n->rank, n->dims, &bytes, &why)) return KILN_ERR_INTERNAL;
    if (bytes > KILN_KG_MAX_INLINE_BYTES) return KILN_ERR_UNSUPPORTED;
    kiln_sbuf_reserve(b, 2 * bytes + 16);
    if (b->oom) return KILN_ERR_NOMEM;
    static const char hex[] = "0123456789abcdef";
    char *o = b->s + b->n;
    memcpy(o, " data=hex:", 10);
    o += 10;
    for (size_t k = 0; k < bytes; k++) {
        unsigned char c = ((const unsigned char *)n->data)[k];
        *o++ = hex[c >> 4];
        *o++ = hex[c & 15];
    }
    *o = '\0';
    b->n = (size_t)(o - b->s);
    return KILN_OK;
}

static kiln_status print_leaf(printer *pr, uint32_t i)
{
    const kiln_node_rec *n = &pr->g->nodes[i];
    sbuf *b = &pr->out;
    kiln_sbuf_printf(b, "%s ", kiln_op_name((enum kiln_op)n->op));
    sb_name(b, pr->names[i]);
    kiln_sbuf_printf(b, " %s", kiln_dtype_name((kiln_dtype)n->dtype));
    if (!sb_dims(pr, n->rank, n->dims)) return KILN_ERR_INTERNAL;
    kiln_status s = n->op == KILN_OP_WEIGHT ? print_weight_data(pr, n) : KILN_OK;
    kiln_sbuf_printf(b, "\n");
    return s;
}

static kiln_status print_op(printer *pr, uint32_t i)
{
    const kiln_node_rec *n = &pr->g->nodes[i];
    const kiln_kg_op_spec *sp = kiln_kg_op_spec_of((enum kiln_op)n->op);
    sbuf *b = &pr->out;
    if (!sp || n->n_src > KILN_MAX_SRC) return KILN_ERR_INTERNAL;
    sb_name(b, pr->names[i]);
    kiln_sbuf_printf(b, " = %s", kiln_op_name((enum kiln_op)n->op));
    for (unsigned k = 0; k < sp->n_req + sp->n_opt; k++) {
        if (k >= sp->n_req && k >= n->n_src) break; /* optionals the builder never took (paged_attention's parents) */
        uint32_t src = k < n->n_src ? n->src[k] : KILN_IDX_NONE;
        if (src != KILN_IDX_NONE && src >= i) return KILN_ERR_INTERNAL; /* not topological */
        if (src == KILN_IDX_NONE && k < sp->n_req) return KILN_ERR_INTERNAL;
        kiln_sbuf_printf(b, " ");
        if (src == KILN_IDX_NONE) kiln_sbuf_printf(b, "_");
        else sb_name(b, pr->names[src]);
    }
    char buf[32];
    switch ((enum kiln_op)n->op) {
    case KILN_OP_SCALE: sb_float(b, "s", n->f[0]); break;
    case KILN_OP_RMS_NORM:
    case KILN_OP_LAYER_NORM: sb_float(b, "eps", n->f[0]); break;
    case KILN_OP_ROPE:
        kiln_sbuf_printf(b, " mode=%s theta=%s", n->i[0] == KILN_ROPE_NEOX ? "neox" : "normal",
                  kiln_kg_fmt_float(n->f[0], buf));
        for (uint32_t j = 0; j < n->n_vec; j++)
            kiln_sbuf_printf(b, "%s%s", j ? "," : " mult=\"", kiln_kg_fmt_float(n->vec[j], buf));
        if (n->n_vec) kiln_sbuf_printf(b, "\"");
        if (n->i[1] > 0) kiln_sbuf_printf(b, " rot=%d", (int)n->i[1]);
        break;
    case KILN_OP_ATTENTION:
        kiln_sbuf_printf(b, " n_kv=");
        if (!sb_dim(pr, n->dim)) return KILN_ERR_INTERNAL;
        sb_float(b, "scale", n->f[0]);
        sb_mask(b, n);
        break;
    case KILN_OP_PAGED_ATTENTION:
        kiln_sbuf_printf(b, " block=%d", (int)n->i[0]);
        sb_float(b, "scale", n->f[0]);
        sb_mask(b, n);
        break;
    case KILN_OP_CAST: kiln_sbuf_printf(b, " dtype=%s", kiln_dtype_name((kiln_dtype)n->dtype)); break;
    case KILN_OP_RESHAPE:
    case KILN_OP_VIEW:
        if (!sb_dims(pr, n->rank, n->dims)) return KILN_ERR_INTERNAL;
        if (n->op == KILN_OP_VIEW) kiln_sbuf_printf(b, " offset=%lld", (long long)n->dim);
        break;
    case KILN_OP_TRANSPOSE: kiln_sbuf_printf(b, " d0=%d d1=%d", (int)n->i[0], (int)n->i[1]); break;
    case KILN_OP_CONCAT: kiln_sbuf_printf(b, " axis=%d", (int)n->i[0]); break;
    case KILN_OP_MOE_ROUTE: kiln_sbuf_printf(b, " k=%d norm=%d", (int)n->i[0], (int)n->i[1]); break;
    case KILN_OP_SCALE_ROWS: kiln_sbuf_printf(b, " col=%d", (int)n->i[0]); break;
    case KILN_OP_MOE_MATMUL: kiln_sbuf_printf(b, " k=%d sum=%d", (int)n->i[0], (int)n->i[1]); break;
    default: break;
    }
    kiln_sbuf_printf(b, "\n");
    return KILN_OK;
}

static kiln_status print_all(printer *pr)
{
    const kiln_graph *g = pr->g;
    sbuf *b = &pr->out;
    kiln_status s = assign_names(pr);
    for (uint32_t i = 0; s == KILN_OK && i < g->n_syms; i++) {
        kiln_sbuf_printf(b, "sym ");
        sb_name(b, g->syms[i].name);
        kiln_sbuf_printf(b, " %lld\n", (long long)g->syms[i].max);
    }
    for (uint32_t i = 0; s == KILN_OK && i < g->n_nodes; i++)
        s = is_leaf(&g->nodes[i]) ? print_leaf(pr, i) : print_op(pr, i);
    for (uint32_t i = 0; s == KILN_OK && i < g->n_outs; i++) {
        if (g->outs[i].node >= g->n_nodes) return KILN_ERR_INTERNAL;
        kiln_sbuf_printf(b, "output ");
        sb_name(b, g->outs[i].name);
        kiln_sbuf_printf(b, " ");
        sb_name(b, pr->names[g->outs[i].node]);
        kiln_sbuf_printf(b, "\n");
    }
    if (s == KILN_OK && b->oom) s = KILN_ERR_NOMEM;
    return s;
}

KILN_API kiln_status kiln_kg_print(const kiln_graph *g, char **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (!g) return KILN_ERR_INVALID_ARG;
    if (g->status != KILN_OK) return g->status; /* a failed graph is not a graph to write */
    size_t n = g->n_nodes ? g->n_nodes : 1;
    printer pr = {.g = g, .names = calloc(n, sizeof(char *)), .owned = calloc(n, sizeof(char *)),
                  .pool = calloc(n, sizeof(used_name))};
    kiln_status s = pr.names && pr.owned && pr.pool ? KILN_OK : KILN_ERR_NOMEM;
    kiln_sbuf_reserve(&pr.out, 0);
    if (s == KILN_OK && pr.out.oom) s = KILN_ERR_NOMEM;
    if (s == KILN_OK) {
        pr.out.s[0] = '\0';
        s = print_all(&pr);
    }
    HASH_CLEAR(hh, pr.used);
    for (uint32_t i = 0; pr.owned && i < g->n_nodes; i++) free(pr.owned[i]);
    free(pr.owned);
    free(pr.names);
    free(pr.pool);
    if (s != KILN_OK) {
        free(pr.out.s);
        return s;
    }
    *out = pr.out.s;
    return KILN_OK;
}
