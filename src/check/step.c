/* `kiln check`'s paged-attention steps: the metadata inputs of a paged_attention (pos, seqs, blocks
 * and a tree step's parents) drawn together so that kiln_run accepts them: n_tok tokens split at
 * random over n_seq sequences (ragged: 1 to many new tokens each), KV lengths up to the block
 * table's capacity, physical blocks shuffled over the pool (reused when it runs out: kiln only
 * reads them), unread table entries garbage, and for a tree random chains/trees/forests with
 * positions by depth. Must not run or compare anything. */
#include <stdlib.h>
#include <string.h>

#include "check/check.h"

/* The first paged attention of g and its sizes at symbol values syms. */
static const kiln_node_rec *find(const kiln_graph *g, const int64_t *syms, int64_t sz[5])
{
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        if (n->op != KILN_OP_PAGED_ATTENTION) continue;
        int64_t d[KILN_MAX_RANK];
        kiln_node_numel(&g->nodes[n->src[0]], syms, d), sz[0] = d[0];         /* n_tok */
        kiln_node_numel(&g->nodes[n->src[4]], syms, d), sz[1] = d[0];         /* n_seq */
        kiln_node_numel(&g->nodes[n->src[5]], syms, d), sz[2] = d[1];         /* max_blocks */
        kiln_node_numel(&g->nodes[n->src[1]], syms, d), sz[3] = d[1] / n->i[0]; /* pool blocks */
        sz[4] = n->i[0];
        return n;
    }
    return NULL;
}

/* Sizes of n_seq sequences summing to n_tok, each >= 1 and <= cap (ragged: a random composition). */
static void split(kiln_check_run *r, int64_t n_tok, int64_t n_seq, int64_t cap, int64_t *q)
{
    for (int64_t s = 0; s < n_seq; s++) q[s] = 1;
    for (int64_t left = n_tok - n_seq, guard = 0; left > 0 && guard < 64 * n_tok; guard++) {
        int64_t s = kiln_check_randint(r, 0, n_seq);
        if (q[s] < cap) q[s]++, left--;
    }
}

/* The parents of q drafts: a chain, a tree under the first, or a forest; pos = prior + depth. */
static void tree(kiln_check_run *r, int64_t q, int64_t prior, float *par, float *pos)
{
    int shape = (int)kiln_check_randint(r, 0, 3);
    int64_t depth[4096];
    for (int64_t i = 0; i < q && i < 4096; i++) {
        int64_t p = shape == 0 ? i - 1 : i == 0 ? -1 : shape == 1 ? kiln_check_randint(r, 0, i) : kiln_check_randint(r, -1, i);
        par[i] = (float)p;
        depth[i] = p < 0 ? 0 : depth[p] + 1;
        pos[i] = (float)(prior + depth[i]);
    }
}

bool kiln_check_paged_step(kiln_check_run *r, const kiln_graph *g, const int64_t *syms, kiln_check_step *st)
{
    memset(st, 0, sizeof *st);
    int64_t sz[5];
    const kiln_node_rec *n = find(g, syms, sz);
    if (!n) return false;
    int64_t T = sz[0], S = sz[1], MB = sz[2], NB = sz[3], B = sz[4], cap = MB * B;
    bool is_tree = n->n_src > 6 && n->src[6] != KILN_IDX_NONE;
    st->pos = calloc((size_t)T + 1, sizeof *st->pos), st->par = calloc((size_t)T + 1, sizeof *st->par);
    st->seqs = calloc((size_t)(2 * S) + 1, sizeof *st->seqs), st->blocks = calloc((size_t)(S * MB) + 1, sizeof *st->blocks);
    int64_t *q = calloc((size_t)S + 1, sizeof *q), *perm = calloc((size_t)NB + 1, sizeof *perm);
    if (!st->pos || !st->par || !st->seqs || !st->blocks || !q || !perm || T < S || T > S * cap) {
        free(q), free(perm), kiln_check_step_free(st);
        return false;
    }
    split(r, T, S, cap, q);
    for (int64_t i = 0; i < NB; i++) perm[i] = i;
    for (int64_t i = NB - 1; i > 0; i--) { /* shuffled physical blocks */
        int64_t j = kiln_check_randint(r, 0, i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int64_t i = 0; i < S * MB; i++) st->blocks[i] = (float)(i % 3 == 0 ? -7 : NB + 5 + i); /* unread: garbage */
    for (int64_t s = 0, t0 = 0, next = 0; s < S; t0 += q[s], s++) {
        int64_t prior = kiln_check_randint(r, 0, cap - q[s] + 1) * (kiln_check_randint(r, 0, 4) ? 1 : 0); /* some empty caches */
        st->seqs[2 * s] = (float)t0, st->seqs[2 * s + 1] = (float)(prior + q[s]);
        for (int64_t b = 0; b < (prior + q[s] + B - 1) / B; b++) st->blocks[s * MB + b] = (float)perm[next++ % NB];
        if (is_tree) tree(r, q[s], prior, st->par + t0, st->pos + t0);
        else
            for (int64_t i = 0; i < q[s]; i++) st->pos[t0 + i] = (float)(prior + i);
    }
    st->names[0] = g->nodes[n->src[3]].name, st->names[1] = g->nodes[n->src[4]].name;
    st->names[2] = g->nodes[n->src[5]].name, st->names[3] = is_tree ? g->nodes[n->src[6]].name : NULL;
    free(q), free(perm);
    return true;
}

const float *kiln_check_step_values(const kiln_check_step *st, const char *name)
{
    const float *v[4] = {st->pos, st->seqs, st->blocks, st->par};
    for (int i = 0; i < 4; i++)
        if (st->names[i] && name && !strcmp(st->names[i], name)) return v[i];
    return NULL;
}

void kiln_check_step_free(kiln_check_step *st)
{
    free(st->pos), free(st->par), free(st->seqs), free(st->blocks);
    memset(st, 0, sizeof *st);
}
