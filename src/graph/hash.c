/* The graph hash: XXH3-128 over a canonical serialization of ops, dtypes, shapes, symbol bounds,
 * parameters, topology and which nodes are outputs. Never over weight bytes or names, so the
 * same structure built twice (or with other weights) hashes equal. */
#include "graph/graph.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

/* Canonical dim: constants as themselves; symbols as (index, bound) with a tag. */
static void put_dim(XXH3_state_t *st, const kiln_graph *g, int64_t d)
{
    int64_t v[2] = {d, 0};
    if (kiln_dim_is_sym(d)) v[1] = g->syms[kiln_sym_index(d)].max;
    XXH3_128bits_update(st, v, sizeof v);
}

kiln_status kiln_graph_hash128(const kiln_graph *g, uint64_t out[2])
{
    XXH3_state_t *st = XXH3_createState();
    if (!st) return KILN_ERR_NOMEM;
    XXH3_128bits_reset(st);
    const uint32_t magic[2] = {0x6b696c6e /* "kiln" */, 1 /* serialization version */};
    XXH3_128bits_update(st, magic, sizeof magic);
    XXH3_128bits_update(st, &g->n_nodes, sizeof g->n_nodes);
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        uint8_t head[4] = {n->op, n->dtype, n->rank, n->n_src};
        XXH3_128bits_update(st, head, sizeof head);
        for (int d = 0; d < n->rank; d++) put_dim(st, g, n->dims[d]);
        /* sources past the 6th only when used (paged_attention's parents): older graphs keep their hashes */
        XXH3_128bits_update(st, n->src, (n->n_src > 6 ? n->n_src : 6) * sizeof *n->src);
        XXH3_128bits_update(st, n->f, sizeof n->f);
        XXH3_128bits_update(st, n->i, sizeof n->i);
        put_dim(st, g, n->dim);
        XXH3_128bits_update(st, &n->n_vec, sizeof n->n_vec);
        if (n->n_vec) XXH3_128bits_update(st, n->vec, (size_t)n->n_vec * sizeof *n->vec);
    }
    XXH3_128bits_update(st, &g->n_outs, sizeof g->n_outs);
    for (uint32_t i = 0; i < g->n_outs; i++) XXH3_128bits_update(st, &g->outs[i].node, sizeof g->outs[i].node);
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    out[0] = h.high64;
    out[1] = h.low64;
    return KILN_OK;
}

KILN_API kiln_status kiln_graph_hash(const kiln_graph *g, char out_hex[33])
{
    if (!g || !out_hex) return KILN_ERR_INVALID_ARG;
    if (g->status != KILN_OK) return g->status;
    uint64_t h[2];
    kiln_status s = kiln_graph_hash128(g, h);
    if (s != KILN_OK) return s;
    snprintf(out_hex, 33, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
    return KILN_OK;
}
