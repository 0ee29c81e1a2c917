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
    cand              *c;       /* [n] candidates, best first after filtering */
    double            *prob;    /* [n] probabilities of the last draw (0: excluded) */
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
    }
    if (!s || !s->c || !s->prob || !s->seen) {
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
    free(s);
}

/* Better first: higher logit, then lower id; NaN after everything. */
static bool better(const cand *a, const cand *b)
{
    if (isnan(a->logit) || isnan(b->logit)) return !isnan(a->logit) && isnan(b->logit);
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *x, const void *y)
{
    const cand *a = x, *b = y;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Moves the k best of c[0..n) to the front, sorted: a min-heap of the k best so far, O(n log k). */
static void keep_best(cand *c, int64_t n, int64_t k)
{
    for (int64_t i = 0; i < k; i++) { /* heapify c[0..k) with the worst on top */
        for (int64_t j = i; j > 0 && better(&c[(j - 1) / 2], &c[j]); j = (j - 1) / 2) {
            cand t = c[j];
            c[j] = c[(j - 1) / 2], c[(j - 1) / 2] = t;
        }
    }
    for (int64_t i = k; i < n; i++) {
        if (!better(&c[i], &c[0])) continue;
        c[0] = c[i];
        for (int64_t j = 0;;) { /* sift down */
            int64_t l = 2 * j + 1, w = j;
            if (l < k && better(&c[w], &c[l])) w = l;
            if (l + 1 < k && better(&c[w], &c[l + 1])) w = l + 1;
            if (w == j) break;
            cand t = c[j];
            c[j] = c[w], c[w] = t, j = w;
        }
    }
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
}

static void penalize(kiln_sampler *s, const int32_t *hist, int64_t n_hist)
{
    float pen = s->p.repeat_penalty;
    if (pen == 1.0f || !s->p.repeat_last_n) return;
    int64_t from = n_hist > s->p.repeat_last_n ? n_hist - s->p.repeat_last_n : 0;
    for (int64_t i = from; i < n_hist; i++) { /* once per distinct token, as llama.cpp does */
        int32_t id = hist[i];
        if (id < 0 || id >= s->n || s->seen[id]) continue;
        s->seen[id] = 1;
        float *l = &s->c[id].logit;
        *l = *l > 0 ? *l / pen : *l * pen;
    }
    for (int64_t i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->n) s->seen[hist[i]] = 0;
}

/* Softmax of c[0..n) (sorted best first) at temperature t into prob (f64). */
static void softmax(kiln_sampler *s, int64_t n, double t)
{
    if (n == 1) { /* also when every logit is -inf or NaN */
        s->prob[s->c[0].id] = 1;
        return;
    }
    double mx = s->c[0].logit, sum = 0;
    for (int64_t i = 0; i < n; i++) sum += s->prob[s->c[i].id] = exp(((double)s->c[i].logit - mx) / t);
    for (int64_t i = 0; i < n; i++) s->prob[s->c[i].id] /= sum;
}

int32_t kiln_sampler_next(kiln_sampler *s, const float *logits, const int32_t *history, int64_t n_hist)
{
    for (int64_t i = 0; i < s->n_prob; i++) s->prob[s->c[i].id] = 0;
    for (int64_t i = 0; i < s->n; i++) s->c[i] = (cand){.logit = logits[i], .id = (int32_t)i};
    penalize(s, history, n_hist);
    int64_t n = s->n;
    if (s->p.temp <= 0) n = 1; /* greedy */
    else if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
    keep_best(s->c, s->n, n);
    if (isnan(s->c[0].logit) || s->c[0].logit == -INFINITY) n = 1; /* nothing to choose from: the first */
    softmax(s, n, 1.0);
    if (s->p.top_p < 1) {
        double cum = 0;
        int64_t m = 0;
        while (m < n && cum < s->p.top_p) cum += s->prob[s->c[m++].id];
        for (int64_t i = m < 1 ? 1 : m; i < n; i++) s->prob[s->c[i].id] = 0;
        n = m < 1 ? 1 : m;
    }
    if (s->p.min_p > 0) {
        double floor = s->p.min_p * s->prob[s->c[0].id];
        int64_t m = 1;
        while (m < n && s->prob[s->c[m].id] >= floor) m++;
        for (int64_t i = m; i < n; i++) s->prob[s->c[i].id] = 0;
        n = m;
    }
    if (s->p.temp > 0) softmax(s, n, s->p.temp);
    s->n_prob = n;
    double u = uniform(s->rng), cum = 0;
    for (int64_t i = 0; i < n; i++)
        if ((cum += s->prob[s->c[i].id]) > u) return s->c[i].id;
    return s->c[n - 1].id; /* rounding left u above the last sum */
}

void kiln_sampler_probs(const kiln_sampler *s, double *probs) { memcpy(probs, s->prob, (size_t)s->n * sizeof *probs); }
