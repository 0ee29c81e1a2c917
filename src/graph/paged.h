/* Paged attention's step metadata (kiln_paged_attention in kiln.h): the one definition of where a
 * sequence's key j lives in the pool (kiln_paged_slot), of each sequence's rows and lengths, and the
 * check of a step's metadata that runs before any kernel. Host code only (the GPU lowering prints
 * the same mapping from kl_paged_row). Must not know plans or backends. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"

/* One step's metadata as bound (host pointers). */
typedef struct kiln_paged_meta {
    const int32_t *pos;      /* [n_tok] position of each new token */
    const int32_t *seqs;     /* [n_seq, 2] (first row of its new tokens, KV length) */
    const int32_t *blocks;   /* [n_seq, max_blocks] block table */
    int64_t        n_tok;    /* new tokens of the step */
    int64_t        n_seq;    /* sequences of the step */
    int64_t        max_blocks; /* block table width */
    int64_t        block;    /* tokens per block */
    int64_t        n_slots;  /* slots of the pool (n_blocks * block) */
    const int32_t *parents;  /* [n_tok] a tree step (kiln_paged_attention_tree): each new token's parent
                                among its sequence's new tokens, -1 for a root; NULL: causal */
} kiln_paged_meta;

/* The metadata of paged attention node idx of g, from every node's data pointer and dims this run
 * (host memory: the host backends' view of a run). */
kiln_paged_meta kiln_paged_meta_of(const kiln_graph *g, uint32_t idx, void *const *bufs, const int64_t (*dims)[KILN_MAX_RANK]);

/* The slot of key j of a sequence whose block table row is bt: the position -> slot mapping. */
static inline int64_t kiln_paged_slot(const int32_t *bt, int64_t block, int64_t j)
{
    return (int64_t)bt[j / block] * block + j % block;
}

/* Sequence s's first row, new-token count and KV length. */
static inline void kiln_paged_seq(const kiln_paged_meta *m, int64_t s, int64_t *q0, int64_t *q_len, int64_t *kv_len)
{
    *q0 = m->seqs[2 * s];
    *q_len = (s + 1 < m->n_seq ? m->seqs[2 * (s + 1)] : m->n_tok) - *q0;
    *kv_len = m->seqs[2 * s + 1];
}

/* Whether new token i of a sequence sees the sequence's new token j (both indices among its new
 * tokens, par its row of parents, NULL: causal): j is i or an ancestor of i. Parents must be
 * checked first (each below its token). The one definition of the tree mask on the host. */
static inline bool kiln_paged_sees(const int32_t *par, int64_t i, int64_t j)
{
    if (!par) return j <= i;
    while (i > j) i = par[i];
    return i == j;
}

/* Depth of new token i in its sequence's tree (0 for a root; i without parents). */
static inline int64_t kiln_paged_depth(const int32_t *par, int64_t i)
{
    if (!par) return i;
    int64_t d = 0;
    while ((i = par[i]) >= 0) d++;
    return d;
}

/* Checks the step: starts (0 first, increasing, below n_tok), KV lengths (>= new tokens, within
 * max_blocks * block), parents of a tree step (each in [-1, its token's index)), positions (token i
 * of sequence s at kv_len - q_len + its depth: i without a tree), block indices of every block a
 * sequence reads (in [0, n_slots / block)) and, when slots is not NULL, the slot mapping of a
 * kv_scatter (slots[t] = kiln_paged_slot(row of t's sequence, its key kv_len - q_len + i)). false
 * with a message in err naming the sequence, token and values when something is wrong. */
bool kiln_paged_check(const kiln_paged_meta *m, const int32_t *slots, char *err, size_t n_err);
