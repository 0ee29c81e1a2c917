/* The canonical copy of a graph: nodes renumbered into an order that depends only on the graph's
 * structure (not on the order its independent builder calls were made in), symbols renumbered by
 * first use, and the structural hash of the result. Plans are built on this copy, so two equal
 * graphs give the same regions, node ids and kernels, and the plan cache can share them.
 * Names and weight bytes take no part; must not change what the graph computes. */
#include "graph/graph.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct canon_rank {
    uint32_t depth; /* longest path from a leaf */
    uint64_t down;  /* hash of the node with everything that reads it */
    uint64_t up;    /* hash of the node with everything it reads */
    uint32_t old;   /* index in the source graph: the last tie-break */
} canon_rank;

static int cmp_rank(const void *pa, const void *pb)
{
    const canon_rank *a = pa, *b = pb;
    if (a->depth != b->depth) return a->depth < b->depth ? -1 : 1;
    if (a->down != b->down) return a->down < b->down ? -1 : 1;
    if (a->up != b->up) return a->up < b->up ? -1 : 1;
    return (a->old > b->old) - (a->old < b->old);
}

static int cmp_out(const void *pa, const void *pb)
{
    const kiln_output_rec *a = pa, *b = pb;
    if (a->node != b->node) return a->node < b->node ? -1 : 1;
    return strcmp(a->name, b->name); /* one node under two names: either order computes the same */
}

/* A dim as structure: a constant, or a symbol by its bound (its index is not structural). */
static void dim_code(const kiln_graph *g, int64_t d, int64_t out[2])
{
    out[0] = kiln_dim_is_sym(d) ? -1 : d;
    out[1] = kiln_dim_is_sym(d) ? g->syms[kiln_sym_index(d)].max : 0;
}

static uint64_t up_hash(const kiln_graph *g, uint32_t i, const uint64_t *up, uint32_t depth)
{
    const kiln_node_rec *n = &g->nodes[i];
    struct {
        uint8_t  head[8];
        int64_t  dims[KILN_MAX_RANK][2];
        float    f[2];
        int32_t  iv[2];
        int64_t  dim[2];
        uint64_t src[6]; /* a 7th source (paged_attention's parents) folds into vec: older graphs keep their hashes */
        uint64_t vec; /* hash of the vector param */
        uint32_t depth;
    } rec;
    memset(&rec, 0, sizeof rec);
    rec.head[0] = n->op, rec.head[1] = n->dtype, rec.head[2] = n->rank, rec.head[3] = n->n_src, rec.head[4] = n->pin;
    for (int d = 0; d < n->rank; d++) dim_code(g, n->dims[d], rec.dims[d]);
    memcpy(rec.f, n->f, sizeof rec.f);
    memcpy(rec.iv, n->i, sizeof rec.iv);
    dim_code(g, n->dim, rec.dim);
    for (int s = 0; s < 6; s++) rec.src[s] = n->src[s] == KILN_IDX_NONE ? ~0ull : up[n->src[s]];
    rec.vec = n->n_vec ? XXH3_64bits(n->vec, (size_t)n->n_vec * sizeof *n->vec) : 0;
    for (int s = 6; s < KILN_MAX_SRC; s++)
        if (n->src[s] != KILN_IDX_NONE) rec.vec = XXH3_64bits((uint64_t[3]){rec.vec, up[n->src[s]], (uint64_t)s}, 24);
    rec.depth = depth;
    return XXH3_64bits(&rec, sizeof rec);
}

static uint64_t mix2(uint64_t a, uint64_t b)
{
    uint64_t v[2] = {a, b};
    return XXH3_64bits(v, sizeof v);
}

/* new_of[old] for every node; returns false on OOM. */
static bool canonical_order(const kiln_graph *g, uint32_t *new_of)
{
    uint32_t n = g->n_nodes;
    canon_rank *rk = calloc(n ? n : 1, sizeof *rk);
    uint64_t *up = calloc(n ? n : 1, sizeof *up), *acc = calloc(n ? n : 1, sizeof *acc);
    if (!rk || !up || !acc) {
        free(rk), free(up), free(acc);
        return false;
    }
    for (uint32_t i = 0; i < n; i++) {
        const kiln_node_rec *nd = &g->nodes[i];
        uint32_t depth = 0;
        for (int s = 0; s < nd->n_src && s < KILN_MAX_SRC; s++)
            if (nd->src[s] != KILN_IDX_NONE && rk[nd->src[s]].depth + 1 > depth) depth = rk[nd->src[s]].depth + 1;
        rk[i].depth = depth;
        rk[i].old = i;
        up[i] = rk[i].up = up_hash(g, i, up, depth);
    }
    /* Readers add into their sources' accumulators (a sum: the order readers come in is no part). */
    /* outputs are found by name, so their declaration order is no part either */
    for (uint32_t o = 0; o < g->n_outs; o++) acc[g->outs[o].node] += mix2(0x6f7574ull /* "out" */, 0);
    for (uint32_t i = n; i-- > 0;) {
        rk[i].down = mix2(up[i], acc[i]);
        const kiln_node_rec *nd = &g->nodes[i];
        for (int s = 0; s < KILN_MAX_SRC; s++)
            if (nd->src[s] != KILN_IDX_NONE) acc[nd->src[s]] += mix2(rk[i].down, (uint64_t)s);
    }
    qsort(rk, n, sizeof *rk, cmp_rank);
    for (uint32_t k = 0; k < n; k++) new_of[rk[k].old] = k;
    free(rk), free(up), free(acc);
    return true;
}

kiln_graph *kiln_graph_canonical(const kiln_graph *g, uint64_t hash[2])
{
    uint32_t n = g->n_nodes, ns = g->n_syms;
    uint32_t *new_of = malloc((n + 1) * sizeof *new_of), *sym_new = malloc((ns + 1) * sizeof *sym_new);
    kiln_node_rec *nodes = calloc(g->cap_nodes ? g->cap_nodes : 1, sizeof *nodes);
    kiln_sym_rec *syms = calloc(ns ? ns : 1, sizeof *syms);
    kiln_graph *c = NULL;
    if (!new_of || !sym_new || !nodes || !syms || !canonical_order(g, new_of) || !(c = kiln_graph_clone(g))) goto fail;
    for (uint32_t i = 0; i < n; i++) {
        kiln_node_rec *d = &nodes[new_of[i]];
        *d = c->nodes[i];
        for (int s = 0; s < KILN_MAX_SRC; s++)
            if (d->src[s] != KILN_IDX_NONE) d->src[s] = new_of[d->src[s]];
    }
    /* symbols: by first use in the new order, then the unused ones as they were */
    uint32_t next = 0;
    for (uint32_t s = 0; s < ns; s++) sym_new[s] = KILN_IDX_NONE;
    for (uint32_t i = 0; i < n; i++) {
        kiln_node_rec *d = &nodes[i];
        for (int k = 0; k <= d->rank; k++) {
            int64_t *v = k < d->rank ? &d->dims[k] : &d->dim;
            if (!kiln_dim_is_sym(*v)) continue;
            uint32_t old = kiln_sym_index(*v);
            if (sym_new[old] == KILN_IDX_NONE) sym_new[old] = next++;
            *v = kiln_sym_dim(sym_new[old]);
        }
    }
    for (uint32_t s = 0; s < ns; s++)
        if (sym_new[s] == KILN_IDX_NONE) sym_new[s] = next++;
    for (uint32_t s = 0; s < ns; s++) syms[sym_new[s]] = c->syms[s];
    for (uint32_t o = 0; o < c->n_outs; o++) c->outs[o].node = new_of[c->outs[o].node];
    qsort(c->outs, c->n_outs, sizeof *c->outs, cmp_out);
    free(c->nodes);
    free(c->syms);
    c->nodes = nodes;
    c->syms = syms;
    nodes = NULL;
    syms = NULL;
    /* The hash: the structural one, the symbols' bounds in order and the pins. */
    uint64_t h[2];
    if (kiln_graph_hash128(c, h) != KILN_OK) goto fail;
    XXH3_state_t *st = XXH3_createState();
    if (!st) goto fail;
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, h, sizeof h);
    XXH3_128bits_update(st, &c->n_syms, sizeof c->n_syms);
    for (uint32_t s = 0; s < ns; s++) XXH3_128bits_update(st, &c->syms[s].max, sizeof c->syms[s].max);
    for (uint32_t i = 0; i < n; i++) XXH3_128bits_update(st, &c->nodes[i].pin, 1);
    XXH128_hash_t r = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    hash[0] = r.high64;
    hash[1] = r.low64;
    free(new_of), free(sym_new);
    return c;
fail:
    free(new_of), free(sym_new), free(nodes), free(syms);
    kiln_graph_free(c);
    return NULL;
}
