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

/* Checks the step: starts (0 first, increasing, below n_tok), KV lengths (>= new tokens, within
 * max_blocks * block), positions (token i of sequence s at kv_len - q_len + i), block indices of
 * every block a sequence reads (in [0, n_slots / block)) and, when slots is not NULL, the slot
 * mapping of a kv_scatter (slots[t] = kiln_paged_slot(row of t's sequence, pos[t])). false with a
 * message in err naming the sequence, token and values when something is wrong. */
bool kiln_paged_check(const kiln_paged_meta *m, const int32_t *slots, char *err, size_t n_err);
