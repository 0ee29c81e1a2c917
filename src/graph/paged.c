/* The check of a paged-attention step's metadata (paged.h): every index a kernel will follow is
 * proven in range, and the per-token positions (a tree step's: by depth) and the slot mapping agree
 * with the lengths, the parents and the block table, before any kernel runs. Must not read the pool or know plans. */
#include "graph/paged.h"

#include <stdio.h>

kiln_paged_meta kiln_paged_meta_of(const kiln_graph *g, uint32_t idx, void *const *bufs, const int64_t (*dims)[KILN_MAX_RANK])
{
    const kiln_node_rec *n = &g->nodes[idx];
    return (kiln_paged_meta){.pos = bufs[n->src[3]], .seqs = bufs[n->src[4]], .blocks = bufs[n->src[5]],
                             .n_tok = dims[n->src[0]][0], .n_seq = dims[n->src[4]][0], .max_blocks = dims[n->src[5]][1],
                             .block = n->i[0], .n_slots = dims[n->src[1]][1],
                             .parents = n->n_src > 6 && n->src[6] != KILN_IDX_NONE ? bufs[n->src[6]] : NULL};
}

static bool seq_ok(const kiln_paged_meta *m, int64_t s, char *err, size_t n_err)
{
    int64_t q0, q_len, kv_len;
    kiln_paged_seq(m, s, &q0, &q_len, &kv_len);
    int64_t cap = m->max_blocks * m->block, n_blocks = m->n_slots / m->block;
    if (s == 0 && q0 != 0) {
        snprintf(err, n_err, "seqs[0] starts at row %lld: the first sequence's new tokens start at row 0", (long long)q0);
        return false;
    }
    if (q0 < 0 || q_len < 1 || q0 + q_len > m->n_tok) {
        snprintf(err, n_err, "sequence %lld starts at row %lld and has %lld new tokens (starts must increase and stay below n_tok = %lld)",
                 (long long)s, (long long)q0, (long long)q_len, (long long)m->n_tok);
        return false;
    }
    if (kv_len < q_len || kv_len > cap) {
        snprintf(err, n_err, "sequence %lld: KV length %lld must be in [its new tokens = %lld, max_blocks x block = %lld]",
                 (long long)s, (long long)kv_len, (long long)q_len, (long long)cap);
        return false;
    }
    const int32_t *bt = m->blocks + s * m->max_blocks;
    for (int64_t b = 0; b < (kv_len + m->block - 1) / m->block; b++)
        if (bt[b] < 0 || bt[b] >= n_blocks) {
            snprintf(err, n_err, "sequence %lld: block table entry %lld = %d is past the pool of %lld blocks", (long long)s,
                     (long long)b, bt[b], (long long)n_blocks);
            return false;
        }
    return true;
}

/* A tree step's parents of sequence s: each an earlier new token of the sequence, or -1. */
static bool parents_ok(const kiln_paged_meta *m, int64_t s, char *err, size_t n_err)
{
    int64_t q0, q_len, kv_len;
    kiln_paged_seq(m, s, &q0, &q_len, &kv_len);
    for (int64_t i = 0; m->parents && i < q_len; i++)
        if (m->parents[q0 + i] < -1 || m->parents[q0 + i] >= i) {
            snprintf(err, n_err,
                     "sequence %lld: parents[%lld] = %d, but the parent of its new token %lld must be an earlier new "
                     "token of the sequence (0 .. %lld) or -1 (a root)",
                     (long long)s, (long long)(q0 + i), m->parents[q0 + i], (long long)i, (long long)i - 1);
            return false;
        }
    return true;
}

/* Token i of sequence s sits at kv_len - q_len + i, or + its depth in a tree (after every start and
 * parent is known good). */
static bool pos_ok(const kiln_paged_meta *m, int64_t s, char *err, size_t n_err)
{
    int64_t q0, q_len, kv_len;
    kiln_paged_seq(m, s, &q0, &q_len, &kv_len);
    const int32_t *par = m->parents ? m->parents + q0 : NULL;
    for (int64_t i = 0; i < q_len; i++) {
        int64_t d = kiln_paged_depth(par, i);
        if (m->pos[q0 + i] != kv_len - q_len + d) {
            snprintf(err, n_err,
                     "sequence %lld: pos[%lld] = %d, but its new token %lld sits at KV length - new tokens + %s%lld = %lld "
                     "(KV length %lld, %lld new tokens)",
                     (long long)s, (long long)(q0 + i), m->pos[q0 + i], (long long)i, par ? "its depth in the tree " : "",
                     (long long)d, (long long)(kv_len - q_len + d), (long long)kv_len, (long long)q_len);
            return false;
        }
    }
    return true;
}

bool kiln_paged_check(const kiln_paged_meta *m, const int32_t *slots, char *err, size_t n_err)
{
    for (int64_t s = 0; s < m->n_seq; s++)
        if (!seq_ok(m, s, err, n_err)) return false;
    for (int64_t s = 0; s < m->n_seq; s++)
        if (!parents_ok(m, s, err, n_err)) return false;
    for (int64_t s = 0; s < m->n_seq; s++)
        if (!pos_ok(m, s, err, n_err)) return false;
    for (int64_t s = 0; slots && s < m->n_seq; s++) {
        int64_t q0, q_len, kv_len;
        kiln_paged_seq(m, s, &q0, &q_len, &kv_len);
        for (int64_t t = q0; t < q0 + q_len; t++) {
            int64_t key = kv_len - q_len + (t - q0); /* = pos[t] without a tree */
            int64_t want = kiln_paged_slot(m->blocks + s * m->max_blocks, m->block, key);
            if (slots[t] < 0 || slots[t] >= m->n_slots) {
                snprintf(err, n_err, "slot %d of token %lld is out of the pool's [0, %lld)", slots[t], (long long)t,
                         (long long)m->n_slots);
                return false;
            }
            if (slots[t] != want) {
                snprintf(err, n_err,
                         "slot %d of token %lld (sequence %lld, key %lld) disagrees with the block table, which puts "
                         "that key at slot %lld",
                         slots[t], (long long)t, (long long)s, (long long)key, (long long)want);
                return false;
            }
        }
    }
    return true;
}
