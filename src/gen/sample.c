/* Token sampling (see sample.h): penalty -> top-k -> top-p -> min-p -> temperature -> draw, the order
 * of llama.cpp's default chain, so the same settings mean the same thing. Filters look at the
 * untempered distribution; the temperature only shapes the draw among the survivors. Must not
 * allocate per call or read past n_vocab; NaN logits never win (they sort last). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gen/sample.h"
#include "sched/ctx.h"

typedef struct cand {
    float   logit; /* after the penalty */
    int32_t id;    /* token */
} cand;

struct kiln_sampler {
    kiln_sample_params p;       /* settings */
    int64_t            n;       /* vocabulary */
    cand              *c;       /* [n] candidates, best first */
    double            *prob;    /* [n] probabilities of the last draw (0: excluded) */
    float             *work;    /* [n] the logits after a penalty */
    uint8_t           *seen;    /* [n] penalty applied already (cleared after each call) */
    int64_t            n_prob;  /* candidates whose prob is set (to clear them next time) */
    uint64_t           rng[4];  /* xoshiro256** state */
};

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* Uniform in [0, 1) with 53 random bits. */
static double uniform(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return (double)(r >> 11) * 0x1.0p-53;
}

kiln_status kiln_sampler_new(kiln_ctx *ctx, const kiln_sample_params *p, int64_t n_vocab, kiln_sampler **out)
{
    *out = NULL;
    const char *bad = isnan(p->temp) ? "temperature" : !(p->top_p >= 0 && p->top_p <= 1) ? "top-p"
                    : !(p->min_p >= 0 && p->min_p <= 1) ? "min-p" : p->top_k < 0 ? "top-k"
                    : !(p->repeat_penalty > 0 && isfinite(p->repeat_penalty)) ? "repeat penalty"
                    : p->repeat_last_n < 0 ? "repeat window" : n_vocab < 1 ? "vocabulary size" : NULL;
    if (bad)
        return kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "sampler: %s out of range (top-p and min-p in [0, 1], top-k >= 0, "
                             "penalty > 0)", bad);
    kiln_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->c = malloc((size_t)n_vocab * sizeof *s->c);
        s->prob = calloc((size_t)n_vocab, sizeof *s->prob);
        s->seen = calloc((size_t)n_vocab, 1);
        s->work = malloc((size_t)n_vocab * sizeof *s->work);
    }
    if (!s || !s->c || !s->prob || !s->seen || !s->work) {
        kiln_sampler_free(s);
        return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "sampler for %lld tokens", (long long)n_vocab);
    }
    s->p = *p;
    s->n = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix(&x);
    *out = s;
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s)
{
    if (!s) return;
    free(s->c);
    free(s->prob);
    free(s->seen);
    free(s->work);
    free(s);
}

/* Better first: higher logit, then lower id (NaN logits never get here). */
static int cmp_cand(const void *x, const void *y)
{
    const cand *a = x, *b = y;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The logits with the repetition penalty applied (once per distinct recent token): logits itself
 * when there is no penalty, else s->work. */
static const float *penalize(kiln_sampler *s, const float *logits, const int32_t *hist, int64_t n_hist)
{
    float pen = s->p.repeat_penalty;
    int64_t from = n_hist > s->p.repeat_last_n ? n_hist - s->p.repeat_last_n : 0;
    if (pen == 1.0f || from == n_hist) return logits;
    memcpy(s->work, logits, (size_t)s->n * sizeof *s->work);
    for (int64_t i = from; i < n_hist; i++) {
        int32_t id = hist[i];
        if (id < 0 || id >= s->n || s->seen[id]) continue;
        s->seen[id] = 1;
        float *l = &s->work[id];
        *l = *l > 0 ? *l / pen : *l * pen;
    }
    for (int64_t i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->n) s->seen[hist[i]] = 0;
    return s->work;
}

/* The k best of work into c[0..k), sorted: one pass with a min-heap of the best so far (a later
 * token must be strictly better, so ties keep the lower id; NaN is never better). Returns the count
 * (less than k when fewer tokens are not NaN). */
static int64_t top_k(kiln_sampler *s, const float *w, int64_t k)
{
    cand *h = s->c;
    int64_t n = 0;
    for (int64_t i = 0; i < s->n; i++) {
        float v = w[i];
        if (n == k ? !(v > h[0].logit) : isnan(v)) continue;
        int64_t j = n < k ? n++ : 0;
        if (j) /* still filling: sift up */
            for (; j > 0 && h[(j - 1) / 2].logit >= v; j = (j - 1) / 2) h[j] = h[(j - 1) / 2]; /* ties: v, the later id, is worse */
        else
            for (;;) { /* replace the worst: sift down */
                int64_t c = 2 * j + 1;
                if (c >= n) break;
                if (c + 1 < n && (h[c + 1].logit < h[c].logit || (h[c + 1].logit == h[c].logit && h[c + 1].id > h[c].id))) c++;
                if (!(h[c].logit < v || (h[c].logit == v && h[c].id > (int32_t)i))) break;
                h[j] = h[c], j = c;
            }
        h[j] = (cand){.logit = v, .id = (int32_t)i};
    }
    qsort(h, (size_t)n, sizeof *h, cmp_cand);
    return n;
}

/* Without top-k: the tokens that can survive top-p and min-p, sorted, into c; *z = the softmax
 * denominator over every token (relative to the best). Only tokens within a factor of the best are
 * sorted: min-p's floor when set (nothing below it survives), else the widest of 1e-4, 1e-8, ...
 * whose tokens already hold top-p of the mass (the nucleus lies inside it). */
static int64_t all_tokens(kiln_sampler *s, const float *w, double *z)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < s->n; i++)
        if (w[i] > mx) mx = w[i];
    if (mx == -INFINITY) return 0; /* every logit -inf or NaN */
    double sum = 0;
    for (int64_t i = 0; i < s->n; i++)
        if (w[i] == w[i]) sum += exp((double)w[i] - mx);
    *z = sum;
    bool all = s->p.top_p >= 1 && s->p.min_p <= 0;
    double floor = s->p.min_p > 0 ? log(s->p.min_p) : -4 * M_LN10;
    for (;; floor -= 4 * M_LN10) {
        int64_t n = 0;
        double mass = 0;
        for (int64_t i = 0; i < s->n; i++)
            if (w[i] == w[i] && (all || (double)w[i] - mx >= floor)) { /* never NaN */
                s->c[n++] = (cand){.logit = w[i], .id = (int32_t)i};
                mass += exp((double)w[i] - mx);
            }
        if (all || s->p.min_p > 0 || mass >= s->p.top_p * sum || floor < -700) {
            qsort(s->c, (size_t)n, sizeof *s->c, cmp_cand);
            return n;
        }
    }
}

/* prob of c[0..n) = softmax at temperature t (f64), relative to z when given (else their own sum). */
static void softmax(kiln_sampler *s, int64_t n, double t, double z)
{
    double mx = s->c[0].logit, sum = 0;
    for (int64_t i = 0; i < n; i++) sum += s->prob[s->c[i].id] = exp(((double)s->c[i].logit - mx) / t);
    if (z > 0) sum = z;
    for (int64_t i = 0; i < n; i++) s->prob[s->c[i].id] /= sum;
}

/* top-p then min-p over c[0..n) (probabilities in prob); returns the survivors' count (>= 1). */
static int64_t nucleus(kiln_sampler *s, int64_t n)
{
    if (s->p.top_p < 1) {
        double cum = 0;
        int64_t m = 0;
        while (m < n && cum < s->p.top_p) cum += s->prob[s->c[m++].id];
        n = m < 1 ? 1 : m;
    }
    if (s->p.min_p > 0) {
        double floor = s->p.min_p * s->prob[s->c[0].id];
        int64_t m = 1;
        while (m < n && s->prob[s->c[m].id] >= floor) m++;
        n = m;
    }
    return n;
}

int32_t kiln_sampler_next(kiln_sampler *s, const float *logits, const int32_t *history, int64_t n_hist)
{
    for (int64_t i = 0; i < s->n_prob; i++) s->prob[s->c[i].id] = 0;
    const float *w = penalize(s, logits, history, n_hist);
    double z = 0;
    int64_t n = s->p.temp <= 0 ? top_k(s, w, 1) /* greedy */
              : s->p.top_k > 0 && s->p.top_k < s->n ? top_k(s, w, s->p.top_k) : all_tokens(s, w, &z);
    if (n == 0 || s->c[0].logit == -INFINITY) { /* nothing to choose from: the first token */
        s->c[0] = (cand){.logit = 0, .id = 0};
        n = 1;
    }
    int64_t all = n;
    softmax(s, n, 1.0, z);
    n = nucleus(s, n);
    for (int64_t i = n; i < all; i++) s->prob[s->c[i].id] = 0;
    if (s->p.temp > 0) softmax(s, n, s->p.temp, 0);
    s->n_prob = all;
    double u = uniform(s->rng), cum = 0;
    for (int64_t i = 0; i < n; i++)
        if ((cum += s->prob[s->c[i].id]) > u) return s->c[i].id;
    return s->c[n - 1].id; /* rounding left u above the last sum */
}

void kiln_sampler_probs(const kiln_sampler *s, double *probs) { memcpy(probs, s->prob, (size_t)s->n * sizeof *probs); }
