/* CPU attention driver: causal GQA attention with an online softmax, over a head-major KV cache
 * (one sequence, contiguous) or a paged pool (a ragged batch of sequences, keys found through each
 * one's block table: kiln_paged_slot; a tree step's new keys masked off other draft paths). Work units are (sequence, KV head, tile of queries, range of
 * KV positions): every query head of a KV head's group and every query of the tile reuse one pass
 * over the K/V block (in L1/L2). Decode (few units) splits the KV range over threads and merges the
 * partial softmaxes afterwards. Must not contain ISA intrinsics: the vector ops come from the
 * kernel table. */
#include "util/fault.h"
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/kern.h"
#include "graph/paged.h"

#define QT 16       /* queries per tile */
#define KB 64       /* keys per block when many queries share it (prefill: the block stays in L1) */
#define KB_MAX 512  /* keys per block for few queries (decode): K and V stream in long runs */
#define MIN_SPLIT 64 /* fewest keys per KV split */

/* One sequence of the batch and its units. */
typedef struct attn_seq {
    int64_t        q0, n_tok, n_kv; /* first query row, queries, keys */
    const int32_t *bt;              /* block table row, or NULL: key j is cache row j */
    const int32_t *par;             /* a tree step: parents of its new tokens (kiln_paged_sees), or NULL */
    int64_t        n_qt;            /* query tiles */
    int64_t        n_split;         /* KV splits (1: no merge) */
    int64_t        split_len;       /* keys per split */
    int64_t        unit0;           /* its first unit */
} attn_seq;

typedef struct attn_job {
    const kiln_cpu_kern *kt;        /* kernel table */
    const float *q;                 /* [rows, n_head, hd] */
    const char  *k, *v;             /* caches [n_kv_head, max_ctx, hd] (a pool: max_ctx slots) */
    size_t       es;                /* bytes per cache element */
    int          f16;               /* 1: f16 cache */
    int64_t      n_head, hd, n_kv_head, max_ctx; /* shapes */
    int64_t      block;             /* tokens per block of a paged pool (0: contiguous) */
    int64_t      grp;               /* query heads per KV head */
    float        scale;             /* score scale */
    float        softcap;           /* scores become softcap * tanh(s / softcap) (0: none) */
    int64_t      window;            /* query at p sees keys p - window + 1 .. p (0: all back to 0) */
    int64_t      kb;                /* keys per block: KB, or KB_MAX for few queries */
    attn_seq    *seqs;              /* sequences */
    int64_t      n_seq;             /* count */
    int64_t      n_units;           /* units of all sequences */
    bool         merged;            /* units keep partial states in part (some sequence splits) */
    atomic_llong next;              /* next unit */
    float       *state;             /* per thread: QT*grp states of (m, l, acc[hd]) */
    size_t       state_floats;      /* floats per thread */
    float       *part;              /* merged: per unit states, same layout */
    float       *y;                 /* [rows, n_head, hd] */
} attn_job;

/* A tree step: hide[j] = 1 for the keys jb + j of the chunk (nk keys) that query t of sq does not see
 * (new tokens off its draft path); false when it sees all of them. */
static bool tree_hidden(const attn_seq *sq, int64_t t, int64_t jb, int64_t nk, unsigned char *hide)
{
    int64_t c = sq->n_kv - sq->n_tok; /* cached keys: seen by every query */
    if (!sq->par || jb + nk <= c) return false;
    bool any = false;
    for (int64_t j = 0; j < nk; j++) any |= (hide[j] = jb + j >= c && !kiln_paged_sees(sq->par, t, jb + j - c));
    return any;
}

/* Scores of the hidden keys to -inf before the softmax: false when the chunk shows this query nothing. */
static bool mask_scores(float *s, const unsigned char *hide, int64_t nk)
{
    bool seen = false;
    for (int64_t j = 0; j < nk; j++) {
        if (hide[j]) s[j] = -INFINITY;
        seen |= !hide[j];
    }
    return seen;
}

/* Advances the states of tile queries [t0, t1) of sequence sq x heads of kv head hk over keys
 * [j0, j1). A chunk of keys never crosses a block of a paged pool, so it is contiguous in memory. */
static void attend(attn_job *a, const attn_seq *sq, int64_t hk, int64_t t0, int64_t t1, int64_t j0, int64_t j1, float *st)
{
    const int64_t hd = a->hd, sw = hd + 2;
    const size_t rs = (size_t)hd * a->es;
    const char *kb = a->k + (size_t)(hk * a->max_ctx) * rs, *vb = a->v + (size_t)(hk * a->max_ctx) * rs;
    float s[KB_MAX];
    unsigned char hide[KB_MAX];
    for (int64_t jb = j0, je; jb < j1; jb = je) {
        je = jb + a->kb < j1 ? jb + a->kb : j1;
        int64_t row = jb;
        if (sq->bt) {
            int64_t end = (jb / a->block + 1) * a->block;
            je = je < end ? je : end;
            row = kiln_paged_slot(sq->bt, a->block, jb);
        }
        for (int64_t t = t0; t < t1; t++) {
            int64_t lim = sq->n_kv - sq->n_tok + t + 1; /* keys this query sees: [lo, lim) */
            int64_t lo = a->window && lim - a->window > jb ? lim - a->window : jb; /* kiln_attn_first_key */
            int64_t te = je < lim ? je : lim;
            if (te <= lo)
                continue;
            int64_t nk = te - lo, r0 = row + (lo - jb); /* a chunk is contiguous: the row moves with the key */
            bool tree = tree_hidden(sq, t, lo, nk, hide); /* tree steps have no window: lo = jb */
            for (int64_t g = 0; g < a->grp; g++) {
                int64_t h = hk * a->grp + g;
                float *e = st + ((t - t0) * a->grp + g) * sw; /* m, l, acc */
                a->kt->kv_dot[a->f16](hd, a->q + ((sq->q0 + t) * a->n_head + h) * hd, kb + (size_t)r0 * rs, rs, nk, s);
                if (tree && !mask_scores(s, hide, nk)) break; /* nothing of this chunk on its path */
                float mx = e[0];
                for (int64_t j = 0; j < nk; j++) {
                    s[j] *= a->scale;
                    if (a->softcap != 0.0f) s[j] = a->softcap * tanhf(s[j] / a->softcap);
                    mx = s[j] > mx ? s[j] : mx;
                }
                float c = expf(e[0] - mx), l = a->kt->exp_sum(s, nk, mx);
                for (int64_t j = 0; tree && j < nk; j++) /* the vector exp clamps: hidden keys weigh exactly 0 */
                    if (hide[j]) l -= s[j], s[j] = 0;
                e[0] = mx;
                e[1] = e[1] * c + l;
                a->kt->kv_axpy[a->f16](hd, c, s, vb + (size_t)r0 * rs, rs, nk, e + 2);
            }
        }
    }
}

/* The sequence unit u belongs to (binary search over unit0). */
static const attn_seq *seq_of(const attn_job *a, int64_t u)
{
    int64_t lo = 0, hi = a->n_seq - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (a->seqs[mid].unit0 <= u) lo = mid;
        else hi = mid - 1;
    }
    return &a->seqs[lo];
}

static void attn_fn(void *arg, int tid, int nth)
{
    (void)nth;
    attn_job *a = arg;
    const int64_t sw = a->hd + 2;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (u >= a->n_units)
            return;
        const attn_seq *sq = seq_of(a, u);
        int64_t lu = u - sq->unit0;
        int64_t sp = lu % sq->n_split, qt = (lu / sq->n_split) % sq->n_qt, hk = lu / (sq->n_split * sq->n_qt);
        int64_t t0 = qt * QT, t1 = t0 + QT < sq->n_tok ? t0 + QT : sq->n_tok;
        int64_t j0 = sp * sq->split_len, j1 = j0 + sq->split_len < sq->n_kv ? j0 + sq->split_len : sq->n_kv;
        float *st = a->merged ? a->part + (size_t)u * a->state_floats : a->state + (size_t)tid * a->state_floats;
        for (int64_t i = 0; i < (t1 - t0) * a->grp; i++) {
            st[i * sw] = -INFINITY;
            st[i * sw + 1] = 0;
            memset(st + i * sw + 2, 0, (size_t)a->hd * sizeof(float));
        }
        attend(a, sq, hk, t0, t1, j0, j1, st);
        if (a->merged)
            continue;
        for (int64_t t = t0; t < t1; t++)
            for (int64_t g = 0; g < a->grp; g++) {
                const float *e = st + ((t - t0) * a->grp + g) * sw;
                float *yr = a->y + ((sq->q0 + t) * a->n_head + hk * a->grp + g) * a->hd;
                float il = 1.0f / e[1];
                for (int64_t d = 0; d < a->hd; d++)
                    yr[d] = e[2 + d] * il;
            }
    }
}

/* Combines the partial states of every (query, head) of sequence sq into y. */
static void merge_seq(attn_job *a, const attn_seq *sq)
{
    const int64_t sw = a->hd + 2;
    for (int64_t hk = 0; hk < a->n_kv_head; hk++)
        for (int64_t t = 0; t < sq->n_tok; t++)
            for (int64_t g = 0; g < a->grp; g++) {
                int64_t qt = t / QT, base = sq->unit0 + (hk * sq->n_qt + qt) * sq->n_split;
                size_t off = (size_t)(((t - qt * QT) * a->grp + g) * sw);
                float mx = -INFINITY, l = 0;
                for (int64_t sp = 0; sp < sq->n_split; sp++) {
                    float m = a->part[(size_t)(base + sp) * a->state_floats + off];
                    mx = m > mx ? m : mx;
                }
                float *yr = a->y + ((sq->q0 + t) * a->n_head + hk * a->grp + g) * a->hd;
                memset(yr, 0, (size_t)a->hd * sizeof(float));
                for (int64_t sp = 0; sp < sq->n_split; sp++) {
                    const float *e = a->part + (size_t)(base + sp) * a->state_floats + off;
                    if (e[1] == 0)
                        continue;
                    float c = expf(e[0] - mx);
                    l += e[1] * c;
                    for (int64_t d = 0; d < a->hd; d++)
                        yr[d] += e[2 + d] * c;
                }
                float il = 1.0f / l;
                for (int64_t d = 0; d < a->hd; d++)
                    yr[d] *= il;
            }
}

/* Splits of the KV range per sequence (decode: few units keep threads idle), units numbered. */
static void plan_units(attn_job *a, int nth)
{
    int64_t tasks = 0, max_tok = 0;
    for (int64_t s = 0; s < a->n_seq; s++) {
        a->seqs[s].n_qt = (a->seqs[s].n_tok + QT - 1) / QT;
        tasks += a->n_kv_head * a->seqs[s].n_qt;
        max_tok = a->seqs[s].n_tok > max_tok ? a->seqs[s].n_tok : max_tok;
    }
    /* Few queries per K/V block gain nothing from L1-sized blocks; long blocks keep the K and V
     * reads in long sequential runs instead of switching streams every 64 keys. */
    a->kb = max_tok * a->grp <= 8 ? KB_MAX : KB;
    int64_t want = (4 * nth + tasks - 1) / tasks;
    a->n_units = 0;
    a->merged = false;
    for (int64_t s = 0; s < a->n_seq; s++) {
        attn_seq *sq = &a->seqs[s];
        int64_t max_split = (sq->n_kv + MIN_SPLIT - 1) / MIN_SPLIT;
        sq->n_split = tasks >= 2 * nth ? 1 : want < max_split ? want : max_split;
        if (sq->n_split < 1)
            sq->n_split = 1;
        sq->split_len = (sq->n_kv + sq->n_split - 1) / sq->n_split;
        sq->split_len = (sq->split_len + KB - 1) / KB * KB; /* whole KB blocks: a split edge is a block edge */
        sq->n_split = (sq->n_kv + sq->split_len - 1) / sq->split_len;
        sq->unit0 = a->n_units;
        a->n_units += a->n_kv_head * sq->n_qt * sq->n_split;
        a->merged |= sq->n_split > 1;
    }
}

static kiln_status run(kiln_cpu_pool *pool, attn_job *a)
{
    int nth = kiln_cpu_pool_threads(pool);
    plan_units(a, nth);
    a->state_floats = (size_t)(QT * a->grp * (a->hd + 2));
    size_t n_state = a->merged ? (size_t)a->n_units : (size_t)nth;
    float *s = kiln_cpu_pool_scratch(pool, n_state * a->state_floats * sizeof(float));
    if (!s)
        return KILN_ERR_NOMEM;
    if (a->merged)
        a->part = s;
    else
        a->state = s;
    atomic_init(&a->next, 0);
    kiln_cpu_pool_run(pool, attn_fn, a);
    for (int64_t i = 0; a->merged && i < a->n_seq; i++)
        merge_seq(a, &a->seqs[i]);
    return KILN_OK;
}

static void job_init(attn_job *a, enum kiln_cpu_isa isa, const float *q, int64_t n_head, int64_t hd, const void *k,
                     const void *v, kiln_dtype kv_t, int64_t n_kv_head, int64_t max_ctx, const kiln_cpu_attn_mask *mk,
                     float *y)
{
    memset(a, 0, sizeof *a);
    a->kt = kiln_cpu_kern_get(isa);
    a->q = q, a->k = k, a->v = v, a->y = y;
    a->f16 = kv_t == KILN_DTYPE_F16;
    a->es = a->f16 ? 2 : 4;
    a->n_head = n_head, a->hd = hd, a->n_kv_head = n_kv_head, a->max_ctx = max_ctx;
    a->grp = n_head / n_kv_head;
    a->scale = mk->scale != 0 ? mk->scale : 1.0f / sqrtf((float)hd);
    a->softcap = mk->softcap;
    a->window = mk->window && kiln_fault("cpu_attn_window_wide") ? mk->window + 1 : mk->window; /* test-only */
}

kiln_status kiln_cpu_attention(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const float *q, int64_t n_tok,
                               int64_t n_head, int64_t hd, const void *k, const void *v, kiln_dtype kv_t,
                               int64_t n_kv_head, int64_t max_ctx, int64_t n_kv, const kiln_cpu_attn_mask *mk, float *y)
{
    if (!pool || !q || !k || !v || !y || !mk || n_tok < 1 || n_head < 1 || hd < 1 || n_kv_head < 1 ||
        n_head % n_kv_head != 0 || n_kv < n_tok || n_kv > max_ctx || mk->window < 0)
        return n_head >= 1 && n_kv_head >= 1 && n_head % n_kv_head != 0 ? KILN_ERR_SHAPE : KILN_ERR_INVALID_ARG;
    if (kv_t != KILN_DTYPE_F32 && kv_t != KILN_DTYPE_F16)
        return KILN_ERR_DTYPE;
    attn_job a;
    job_init(&a, isa, q, n_head, hd, k, v, kv_t, n_kv_head, max_ctx, mk, y);
    attn_seq one = {.q0 = 0, .n_tok = n_tok, .n_kv = n_kv};
    a.seqs = &one;
    a.n_seq = 1;
    return run(pool, &a);
}

kiln_status kiln_cpu_paged_attention(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const float *q, int64_t n_head,
                                     int64_t hd, const void *k, const void *v, kiln_dtype kv_t, int64_t n_kv_head,
                                     const kiln_paged_meta *m, const kiln_cpu_attn_mask *mk, float *y)
{
    if (!pool || !q || !k || !v || !y || !m || !mk || mk->window < 0 || m->n_seq < 1 || n_head < 1 || hd < 1 || n_kv_head < 1 ||
        n_head % n_kv_head != 0 || m->block < 1)
        return KILN_ERR_INVALID_ARG;
    if (kv_t != KILN_DTYPE_F32 && kv_t != KILN_DTYPE_F16)
        return KILN_ERR_DTYPE;
    attn_job a;
    job_init(&a, isa, q, n_head, hd, k, v, kv_t, n_kv_head, m->n_slots, mk, y);
    if (!(a.seqs = malloc((size_t)m->n_seq * sizeof *a.seqs)))
        return KILN_ERR_NOMEM;
    a.n_seq = m->n_seq;
    a.block = m->block;
    for (int64_t s = 0; s < m->n_seq; s++) {
        attn_seq *sq = &a.seqs[s];
        memset(sq, 0, sizeof *sq);
        kiln_paged_seq(m, s, &sq->q0, &sq->n_tok, &sq->n_kv);
        sq->bt = m->blocks + s * m->max_blocks;
        sq->par = m->parents ? m->parents + sq->q0 : NULL;
    }
    kiln_status st = run(pool, &a);
    free(a.seqs);
    return st;
}
