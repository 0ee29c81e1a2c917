/* CPU attention driver: causal GQA attention over a head-major KV cache with an online softmax.
 * Work units are (KV head, tile of queries, range of KV positions): every query head of a KV
 * head's group and every query of the tile reuse one pass over the K/V block (in L1/L2). Decode
 * (few units) splits the KV range over threads and merges the partial softmaxes afterwards.
 * Must not contain ISA intrinsics: the vector ops come from the kernel table. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "backends/cpu/kern.h"

#define QT 16       /* queries per tile */
#define KB 64       /* keys per block when many queries share it (prefill: the block stays in L1) */
#define KB_MAX 512  /* keys per block for few queries (decode): K and V stream in long runs */
#define MIN_SPLIT 64 /* fewest keys per KV split */

typedef struct attn_job {
    const kiln_cpu_kern *kt;        /* kernel table */
    const float *q;                 /* [n_tok, n_head, hd] */
    const char  *k, *v;             /* caches [n_kv_head, max_ctx, hd] */
    size_t       es;                /* bytes per cache element */
    int          f16;               /* 1: f16 cache */
    int64_t      n_tok, n_head, hd, n_kv_head, max_ctx, n_kv; /* shapes */
    int64_t      grp;               /* query heads per KV head */
    float        scale;             /* score scale */
    int64_t      n_qt;              /* query tiles */
    int64_t      kb;                /* keys per block: KB, or KB_MAX for few queries */
    int64_t      n_split;           /* KV splits (1: no merge) */
    int64_t      split_len;         /* keys per split */
    int64_t      n_units;           /* n_kv_head * n_qt * n_split */
    atomic_llong next;              /* next unit */
    float       *state;             /* per thread: QT*grp states of (m, l, acc[hd]) */
    size_t       state_floats;      /* floats per thread */
    float       *part;              /* n_split > 1: per unit states, same layout */
    float       *y;                 /* [n_tok, n_head, hd] */
} attn_job;

/* Advances the states of tile queries [t0, t1) x heads of kv head hk over keys [j0, j1). */
static void attend(attn_job *a, int64_t hk, int64_t t0, int64_t t1, int64_t j0, int64_t j1, float *st)
{
    const int64_t hd = a->hd, sw = hd + 2;
    const size_t rs = (size_t)hd * a->es;
    const char *kb = a->k + (size_t)(hk * a->max_ctx) * rs, *vb = a->v + (size_t)(hk * a->max_ctx) * rs;
    float s[KB_MAX];
    for (int64_t jb = j0; jb < j1; jb += a->kb) {
        for (int64_t t = t0; t < t1; t++) {
            int64_t lim = a->n_kv - a->n_tok + t + 1; /* keys this query sees */
            int64_t je = jb + a->kb < j1 ? jb + a->kb : j1;
            je = je < lim ? je : lim;
            if (je <= jb)
                continue;
            int64_t nk = je - jb;
            for (int64_t g = 0; g < a->grp; g++) {
                int64_t h = hk * a->grp + g;
                float *e = st + ((t - t0) * a->grp + g) * sw; /* m, l, acc */
                a->kt->kv_dot[a->f16](hd, a->q + (t * a->n_head + h) * hd, kb + (size_t)jb * rs, rs, nk, s);
                float mx = e[0];
                for (int64_t j = 0; j < nk; j++) {
                    s[j] *= a->scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                float c = expf(e[0] - mx), l = a->kt->exp_sum(s, nk, mx);
                e[0] = mx;
                e[1] = e[1] * c + l;
                a->kt->kv_axpy[a->f16](hd, c, s, vb + (size_t)jb * rs, rs, nk, e + 2);
            }
        }
    }
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
        int64_t sp = u % a->n_split, qt = (u / a->n_split) % a->n_qt, hk = u / (a->n_split * a->n_qt);
        int64_t t0 = qt * QT, t1 = t0 + QT < a->n_tok ? t0 + QT : a->n_tok;
        int64_t j0 = sp * a->split_len, j1 = j0 + a->split_len < a->n_kv ? j0 + a->split_len : a->n_kv;
        float *st = a->n_split > 1 ? a->part + (size_t)u * a->state_floats
                                   : a->state + (size_t)tid * a->state_floats;
        for (int64_t i = 0; i < (t1 - t0) * a->grp; i++) {
            st[i * sw] = -INFINITY;
            st[i * sw + 1] = 0;
            memset(st + i * sw + 2, 0, (size_t)a->hd * sizeof(float));
        }
        attend(a, hk, t0, t1, j0, j1, st);
        if (a->n_split > 1)
            continue;
        for (int64_t t = t0; t < t1; t++)
            for (int64_t g = 0; g < a->grp; g++) {
                const float *e = st + ((t - t0) * a->grp + g) * sw;
                float *yr = a->y + (t * a->n_head + hk * a->grp + g) * a->hd;
                float il = 1.0f / e[1];
                for (int64_t d = 0; d < a->hd; d++)
                    yr[d] = e[2 + d] * il;
            }
    }
}

/* Combines the n_split partial states of every (query, head) into y. */
static void merge(attn_job *a)
{
    const int64_t sw = a->hd + 2;
    for (int64_t hk = 0; hk < a->n_kv_head; hk++)
        for (int64_t t = 0; t < a->n_tok; t++)
            for (int64_t g = 0; g < a->grp; g++) {
                int64_t qt = t / QT, base = (hk * a->n_qt + qt) * a->n_split;
                size_t off = (size_t)(((t - qt * QT) * a->grp + g) * sw);
                float mx = -INFINITY, l = 0;
                for (int64_t sp = 0; sp < a->n_split; sp++) {
                    float m = a->part[(size_t)(base + sp) * a->state_floats + off];
                    mx = m > mx ? m : mx;
                }
                float *yr = a->y + (t * a->n_head + hk * a->grp + g) * a->hd;
                memset(yr, 0, (size_t)a->hd * sizeof(float));
                for (int64_t sp = 0; sp < a->n_split; sp++) {
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

kiln_status kiln_cpu_attention(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const float *q, int64_t n_tok,
                               int64_t n_head, int64_t hd, const void *k, const void *v, kiln_dtype kv_t,
                               int64_t n_kv_head, int64_t max_ctx, int64_t n_kv, float scale, float *y)
{
    if (!pool || !q || !k || !v || !y || n_tok < 1 || n_head < 1 || hd < 1 || n_kv_head < 1 ||
        n_head % n_kv_head != 0 || n_kv < n_tok || n_kv > max_ctx)
        return n_head >= 1 && n_kv_head >= 1 && n_head % n_kv_head != 0 ? KILN_ERR_SHAPE : KILN_ERR_INVALID_ARG;
    if (kv_t != KILN_DTYPE_F32 && kv_t != KILN_DTYPE_F16)
        return KILN_ERR_DTYPE;
    attn_job a;
    memset(&a, 0, sizeof a);
    a.kt = kiln_cpu_kern_get(isa);
    a.q = q, a.k = k, a.v = v, a.y = y;
    a.f16 = kv_t == KILN_DTYPE_F16;
    a.es = a.f16 ? 2 : 4;
    a.n_tok = n_tok, a.n_head = n_head, a.hd = hd, a.n_kv_head = n_kv_head, a.max_ctx = max_ctx, a.n_kv = n_kv;
    a.grp = n_head / n_kv_head;
    a.scale = scale != 0 ? scale : 1.0f / sqrtf((float)hd);
    a.n_qt = (n_tok + QT - 1) / QT;
    /* Few queries per K/V block gain nothing from L1-sized blocks; long blocks keep the K and V
     * reads in long sequential runs instead of switching streams every 64 keys. */
    a.kb = n_tok * a.grp <= 8 ? KB_MAX : KB;
    int nth = kiln_cpu_pool_threads(pool);
    int64_t tasks = n_kv_head * a.n_qt, want = (4 * nth + tasks - 1) / tasks;
    int64_t max_split = (n_kv + MIN_SPLIT - 1) / MIN_SPLIT;
    a.n_split = tasks >= 2 * nth ? 1 : want < max_split ? want : max_split;
    if (a.n_split < 1)
        a.n_split = 1;
    a.split_len = (n_kv + a.n_split - 1) / a.n_split;
    a.split_len = (a.split_len + KB - 1) / KB * KB; /* whole KB blocks: a split edge is a block edge */
    a.n_split = (n_kv + a.split_len - 1) / a.split_len;
    a.n_units = tasks * a.n_split;
    a.state_floats = (size_t)(QT * a.grp * (hd + 2));
    size_t n_state = a.n_split > 1 ? (size_t)a.n_units : (size_t)nth;
    float *s = kiln_cpu_pool_scratch(pool, n_state * a.state_floats * sizeof(float));
    if (!s)
        return KILN_ERR_NOMEM;
    if (a.n_split > 1)
        a.part = s;
    else
        a.state = s;
    atomic_init(&a.next, 0);
    kiln_cpu_pool_run(pool, attn_fn, &a);
    if (a.n_split > 1)
        merge(&a);
    return KILN_OK;
}
