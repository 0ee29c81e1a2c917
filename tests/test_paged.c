/* Paged attention over ragged batches (kiln_paged_attention): every backend that runs it against an
 * f64 reference that computes each sequence alone from its own logical keys (never through the
 * pool), on fresh random data with shuffled physical blocks and shared prefix blocks; the pool
 * after the step; and bad metadata refused before any kernel runs, the plan usable after. Must not
 * compare a backend only with itself. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/presets.h"
#include "support/fakecuda_use.h"
#include "support/testutil.h"

#define T_MAX 700 /* capacity: new tokens per step */
#define S_MAX 64  /* capacity: sequences per step */

typedef struct pcase {
    const char *what;     /* label */
    int         n_seq;    /* sequences */
    const int  *new_tok;  /* new tokens per sequence */
    const int  *prior;    /* cached tokens per sequence before the step */
    int         block;    /* tokens per block */
    kiln_dtype  kvt;      /* pool dtype */
    int         H, Hkv, hd; /* heads, kv heads, head_dim */
    int         shared;   /* tokens of sequence 0's history the others share (whole blocks), 0: none */
    float       softcap;  /* logit soft-cap (kiln_paged_attention_ext), 0: none */
    int         window;   /* sliding window, 0: none */
} pcase;

/* The step as the engine would build it, and the logical keys of each sequence for the reference. */
typedef struct step {
    const pcase *c;
    int64_t      n_tok, NB, MB, n_slots; /* new tokens, blocks of the pool, block table width, slots */
    int32_t     *pos, *slots, *seqs, *bt; /* metadata */
    float       *q, *kr, *vr;            /* new rows */
    double     **K, **V;                 /* per sequence: [kv_len, Hkv, hd] keys/values as the pool holds them */
    float       *pool_k, *pool_v;        /* initial pools (f32 values exactly representable in kvt) */
} step;

static kiln_graph *build(const pcase *c, int64_t NB, int64_t MB)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim T = kiln_sym(g, "n_tok", T_MAX), S = kiln_sym(g, "n_seq", S_MAX);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, c->H, c->hd});
    kiln_node kr = kiln_input(g, "kr", KILN_DTYPE_F32, 3, (kiln_dim[]){T, c->Hkv, c->hd});
    kiln_node vr = kiln_input(g, "vr", KILN_DTYPE_F32, 3, (kiln_dim[]){T, c->Hkv, c->hd});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node slots = kiln_input(g, "slots", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){S, 2});
    kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){S, MB});
    kiln_dim pd[] = {c->Hkv, NB * c->block, c->hd};
    kiln_node kp = kiln_state(g, "kpool", c->kvt, 3, pd), vp = kiln_state(g, "vpool", c->kvt, 3, pd);
    kiln_node ks = kiln_kv_scatter(g, kp, kr, slots), vs = kiln_kv_scatter(g, vp, vr, slots);
    kiln_output(g, kiln_paged_attention_ext(g, q, ks, vs, pos, seqs, bt, c->block, 0, c->softcap, c->window), "y");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    return g;
}

/* Values as the pool's dtype holds them. */
static void round_to(kiln_dtype t, float *x, int64_t n)
{
    size_t b;
    void *d = tu_to_dtype(t, x, n, &b);
    cr_assert_eq(kiln_dequantize(t, d, x, n), KILN_OK);
    free(d);
}

/* Rows of `row` values as the pool holds them (q8_0 quantizes each row's blocks of 32 together). */
static float *rounded_rows(kiln_dtype t, const float *x, int64_t n, int64_t row)
{
    float *r = malloc((size_t)n * 4);
    memcpy(r, x, (size_t)n * 4);
    for (int64_t i = 0; i < n; i += row) round_to(t, r + i, row);
    return r;
}

static void make_step(step *s, const pcase *c)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    int64_t row = (int64_t)c->Hkv * c->hd, need = 0, sb = c->shared / c->block;
    for (int i = 0; i < c->n_seq; i++) {
        int64_t kv = c->prior[i] + c->new_tok[i], nb = (kv + c->block - 1) / c->block;
        s->n_tok += c->new_tok[i];
        need += i > 0 && c->shared ? nb - sb : nb;
        s->MB = nb > s->MB ? nb : s->MB;
        if (i > 0 && c->shared) cr_assert(c->prior[i] >= c->shared, "%s: a sharer must hold the prefix", c->what);
    }
    s->NB = need + 3 + need / 4; /* spare blocks the step never reads */
    s->n_slots = s->NB * c->block;
    int32_t *perm = malloc((size_t)s->NB * sizeof *perm);
    for (int64_t i = 0; i < s->NB; i++) perm[i] = (int32_t)i;
    for (int64_t i = s->NB - 1; i > 0; i--) { /* shuffled physical blocks */
        int64_t j = tu_randint(0, i + 1);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    s->pos = malloc((size_t)s->n_tok * 4), s->slots = malloc((size_t)s->n_tok * 4);
    s->seqs = malloc((size_t)c->n_seq * 8), s->bt = malloc((size_t)(c->n_seq * s->MB) * 4);
    for (int64_t i = 0; i < c->n_seq * s->MB; i++) s->bt[i] = -7; /* unread entries: garbage */
    s->pool_k = malloc((size_t)(s->n_slots * row) * 4), s->pool_v = malloc((size_t)(s->n_slots * row) * 4);
    tu_fill(s->pool_k, s->n_slots * row, -3, 3); /* slots no sequence owns hold other values */
    tu_fill(s->pool_v, s->n_slots * row, -3, 3);
    round_to(c->kvt, s->pool_k, s->n_slots * row);
    round_to(c->kvt, s->pool_v, s->n_slots * row);
    s->q = malloc((size_t)(s->n_tok * c->H * c->hd) * 4);
    s->kr = malloc((size_t)(s->n_tok * row) * 4), s->vr = malloc((size_t)(s->n_tok * row) * 4);
    tu_fill(s->q, s->n_tok * c->H * c->hd, -1, 1);
    tu_fill(s->kr, s->n_tok * row, -1, 1);
    tu_fill(s->vr, s->n_tok * row, -0.5f, 1.5f);
    s->K = calloc((size_t)c->n_seq, sizeof *s->K), s->V = calloc((size_t)c->n_seq, sizeof *s->V);
    int64_t next = 0, t0 = 0;
    float *krr = rounded_rows(c->kvt, s->kr, s->n_tok * row, c->hd), *vrr = rounded_rows(c->kvt, s->vr, s->n_tok * row, c->hd);
    for (int i = 0; i < c->n_seq; i++) {
        int64_t kv = c->prior[i] + c->new_tok[i], nb = (kv + c->block - 1) / c->block;
        int32_t *bt = s->bt + i * s->MB;
        for (int64_t b = 0; b < nb; b++) bt[b] = i > 0 && b < sb && c->shared ? s->bt[b] : perm[next++];
        s->seqs[2 * i] = (int32_t)t0, s->seqs[2 * i + 1] = (int32_t)kv;
        s->K[i] = malloc((size_t)(kv * row) * 8), s->V[i] = malloc((size_t)(kv * row) * 8);
        for (int64_t j = 0; j < kv; j++) {
            int64_t slot = (int64_t)bt[j / c->block] * c->block + j % c->block;
            for (int64_t h = 0; h < c->Hkv; h++)
                for (int64_t d = 0; d < c->hd; d++) {
                    float *pk = &s->pool_k[(h * s->n_slots + slot) * c->hd + d], *pv = &s->pool_v[(h * s->n_slots + slot) * c->hd + d];
                    if (j >= c->prior[i]) { /* a new token: the pool gets it from kv_scatter */
                        int64_t t = t0 + j - c->prior[i];
                        float kx = krr[(t * c->Hkv + h) * c->hd + d], vx = vrr[(t * c->Hkv + h) * c->hd + d];
                        s->K[i][(j * c->Hkv + h) * c->hd + d] = kx, s->V[i][(j * c->Hkv + h) * c->hd + d] = vx;
                    } else if (i > 0 && j < c->shared) { /* the shared prefix: sequence 0's keys */
                        s->K[i][(j * c->Hkv + h) * c->hd + d] = s->K[0][(j * c->Hkv + h) * c->hd + d];
                        s->V[i][(j * c->Hkv + h) * c->hd + d] = s->V[0][(j * c->Hkv + h) * c->hd + d];
                    } else {
                        s->K[i][(j * c->Hkv + h) * c->hd + d] = *pk, s->V[i][(j * c->Hkv + h) * c->hd + d] = *pv;
                    }
                }
        }
        for (int64_t j = 0; j < c->new_tok[i]; j++) {
            s->pos[t0 + j] = (int32_t)(c->prior[i] + j);
            s->slots[t0 + j] = (int32_t)((int64_t)bt[(c->prior[i] + j) / c->block] * c->block + (c->prior[i] + j) % c->block);
        }
        t0 += c->new_tok[i];
    }
    free(perm), free(krr), free(vrr);
}

static void free_step(step *s)
{
    for (int i = 0; i < s->c->n_seq; i++) free(s->K[i]), free(s->V[i]);
    free(s->K), free(s->V), free(s->pos), free(s->slots), free(s->seqs), free(s->bt);
    free(s->q), free(s->kr), free(s->vr), free(s->pool_k), free(s->pool_v);
}

/* Sequence i alone in f64: its new queries over its logical keys 0..position, causal. */
static void reference(const step *s, int i, double *y)
{
    const pcase *c = s->c;
    int64_t kv = s->seqs[2 * i + 1], t0 = s->seqs[2 * i], grp = c->H / c->Hkv;
    double *p = malloc((size_t)kv * sizeof *p), scale = 1.0 / sqrt((double)c->hd);
    for (int64_t t = 0; t < c->new_tok[i]; t++)
        for (int64_t h = 0; h < c->H; h++) {
            int64_t g = h / grp, last = c->prior[i] + t, j0 = c->window && last + 1 > c->window ? last + 1 - c->window : 0;
            const float *qr = s->q + ((t0 + t) * c->H + h) * c->hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = j0; j <= last; j++) {
                double dot = 0;
                for (int64_t d = 0; d < c->hd; d++) dot += (double)qr[d] * s->K[i][(j * c->Hkv + g) * c->hd + d];
                p[j] = dot * scale;
                if (c->softcap != 0) p[j] = c->softcap * tanh(p[j] / c->softcap);
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = j0; j <= last; j++) sum += (p[j] = exp(p[j] - mx));
            for (int64_t d = 0; d < c->hd; d++) {
                double acc = 0;
                for (int64_t j = j0; j <= last; j++) acc += p[j] * s->V[i][(j * c->Hkv + g) * c->hd + d];
                y[(t * c->H + h) * c->hd + d] = acc / sum;
            }
        }
    free(p);
}

typedef struct bound {
    kiln_binding b[10];
    size_t       n;
} bound;

static bound bindings(const step *s, float *y, size_t y_bytes)
{
    const pcase *c = s->c;
    size_t row = (size_t)c->Hkv * c->hd * 4;
    bound r = {.n = 10};
    r.b[0] = (kiln_binding){.name = "n_tok", .value = s->n_tok};
    r.b[1] = (kiln_binding){.name = "n_seq", .value = c->n_seq};
    r.b[2] = (kiln_binding){.name = "q", .data = s->q, .bytes = (size_t)s->n_tok * c->H * c->hd * 4};
    r.b[3] = (kiln_binding){.name = "kr", .data = s->kr, .bytes = (size_t)s->n_tok * row};
    r.b[4] = (kiln_binding){.name = "vr", .data = s->vr, .bytes = (size_t)s->n_tok * row};
    r.b[5] = (kiln_binding){.name = "pos", .data = s->pos, .bytes = (size_t)s->n_tok * 4};
    r.b[6] = (kiln_binding){.name = "slots", .data = s->slots, .bytes = (size_t)s->n_tok * 4};
    r.b[7] = (kiln_binding){.name = "seqs", .data = s->seqs, .bytes = (size_t)c->n_seq * 8};
    r.b[8] = (kiln_binding){.name = "blocks", .data = s->bt, .bytes = (size_t)(c->n_seq * s->MB) * 4};
    r.b[9] = (kiln_binding){.name = "y", .data = y, .bytes = y_bytes};
    return r;
}

static kiln_ctx *g_ctx;

static kiln_plan *compile(const step *s, const char *backend)
{
    kiln_graph *g = build(s->c, s->NB, s->MB);
    kiln_plan *p = NULL;
    kiln_compile_options o = {.backend = backend};
    cr_assert_eq(kiln_compile(g_ctx, g, &o, &p), KILN_OK, "%s on %s: %s", s->c->what, backend, kiln_ctx_error(g_ctx));
    kiln_graph_free(g);
    int n_attn = 0;
    for (int i = 0; i < kiln_plan_kernel_count(p); i++) { /* the paged kernel really runs where asked */
        kiln_region_info ri;
        cr_assert_eq(kiln_plan_region(p, i, &ri), KILN_OK);
        if (!strstr(ri.ops, "paged_attention")) continue;
        n_attn++;
        cr_assert_str_eq(ri.backend, backend, "%s", ri.ops);
    }
    cr_assert_eq(n_attn, 1);
    size_t pb = (size_t)(s->n_slots * s->c->Hkv * s->c->hd), bytes;
    void *d = tu_to_dtype(s->c->kvt, s->pool_k, (int64_t)pb, &bytes);
    cr_assert_eq(kiln_plan_state_write(p, "kpool", d, bytes), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    free(d);
    d = tu_to_dtype(s->c->kvt, s->pool_v, (int64_t)pb, &bytes);
    cr_assert_eq(kiln_plan_state_write(p, "vpool", d, bytes), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    free(d);
    return p;
}

/* The pool after the step: every new token's rows at its slot, every other slot as it was. */
static void check_pool(const step *s, kiln_plan *p, const char *name, const float *init, const float *rows)
{
    const pcase *c = s->c;
    int64_t n = s->n_slots * c->Hkv * c->hd;
    size_t bytes = tu_bytes(c->kvt, n, c->hd);
    void *raw = malloc(bytes);
    double *got = malloc((size_t)n * 8);
    cr_assert_eq(kiln_plan_state_read(p, name, raw, bytes), KILN_OK);
    tu_to_f64(c->kvt, raw, n, got);
    float *want = malloc((size_t)n * 4), *rr = rounded_rows(c->kvt, rows, s->n_tok * c->Hkv * c->hd, c->hd);
    memcpy(want, init, (size_t)n * 4);
    for (int64_t t = 0; t < s->n_tok; t++)
        for (int64_t h = 0; h < c->Hkv; h++)
            for (int64_t d = 0; d < c->hd; d++)
                want[(h * s->n_slots + s->slots[t]) * c->hd + d] = rr[(t * c->Hkv + h) * c->hd + d];
    free(rr);
    for (int64_t i = 0; i < n; i++)
        cr_assert(got[i] == (double)want[i], "%s: %s element %lld is %g, want %g (seed %llu)", c->what, name, (long long)i,
                  got[i], (double)want[i], (unsigned long long)tu_seed());
    free(raw), free(got), free(want);
}

/* async: through kiln_run_async. Host plans run synchronously and never touch the stream (one that
 * is not one); a vulkan plan gets a kiln_vk_sync, its output is written by kiln_plan_wait, and a
 * synchronous rerun of the same step (the same KV rows written again) gives the same bits. */
static void run_case(const pcase *c, const char *backend, bool async)
{
    step s;
    make_step(&s, c);
    kiln_plan *p = compile(&s, backend);
    size_t y_n = (size_t)s.n_tok * c->H * c->hd;
    float *y = tu_galloc(y_n * 4);
    bound b = bindings(&s, y, y_n * 4);
    bool vk = strcmp(backend, "vulkan") == 0;
    kiln_vk_sync sy = {.magic = KILN_VK_SYNC_MAGIC};
    kiln_status st = async ? kiln_run_async(p, b.b, b.n, vk ? (void *)&sy : (void *)(uintptr_t)0xdead) : kiln_run(p, b.b, b.n);
    cr_assert_eq(st, KILN_OK, "%s on %s: %s", c->what, backend, kiln_ctx_error(g_ctx));
    if (async && vk) {
        cr_assert_eq(kiln_plan_wait(p), KILN_OK, "%s", kiln_ctx_error(g_ctx));
        float *y2 = malloc(y_n * 4);
        tu_poison(y2, y_n * 4);
        bound b2 = bindings(&s, y2, y_n * 4);
        cr_assert_eq(kiln_run(p, b2.b, b2.n), KILN_OK, "%s", kiln_ctx_error(g_ctx));
        cr_assert(memcmp(y, y2, y_n * 4) == 0, "%s on vulkan: kiln_run_async's output differs from kiln_run's", c->what);
        free(y2);
    }
    tu_gcheck(y, "y");
    for (int i = 0; i < c->n_seq; i++) { /* each sequence against itself computed alone */
        int64_t e = (int64_t)c->new_tok[i] * c->H * c->hd;
        double *ref = malloc((size_t)e * 8), *got = malloc((size_t)e * 8);
        reference(&s, i, ref);
        for (int64_t k = 0; k < e; k++) got[k] = y[(size_t)s.seqs[2 * i] * c->H * c->hd + k];
        char what[160];
        snprintf(what, sizeof what, "%s on %s: sequence %d (%d new, %d cached)", c->what, backend, i, c->new_tok[i], c->prior[i]);
        tu_compare(what, got, ref, e, tu_tol("paged_attention", c->kvt));
        free(ref), free(got);
    }
    check_pool(&s, p, "kpool", s.pool_k, s.kr);
    check_pool(&s, p, "vpool", s.pool_v, s.vr);
    tu_gfree(y, "y");
    kiln_plan_free(p);
    free_step(&s);
}

static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = 2}, &g_ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(g_ctx); }

TestSuite(paged, .init = setup, .fini = teardown, .timeout = 300);

/* One prefill chunk into an empty cache; a mixed batch of decode, a chunk and a long prefill; 17
 * sequences sharing a prefix, mostly decoding, over long caches. */
static const int one_new[] = {300}, one_prior[] = {0};
static const int three_new[] = {1, 37, 300}, three_prior[] = {1000, 0, 211};
static const int s17_new[] = {1, 1, 1, 1, 5, 1, 1, 64, 1, 1, 1, 1, 16, 1, 1, 1, 2};
static const int s17_prior[] = {700, 300, 999, 256, 1500, 301, 480, 256, 2047, 290, 333, 1200, 256, 260, 700, 900, 257};

static void cases(const char *backend, int scale)
{
    int s17p[17], s64n[64], s64p[64];
    for (int i = 0; i < 17; i++) s17p[i] = s17_prior[i] / scale > 256 ? s17_prior[i] / scale : 256; /* sharers hold the prefix */
    /* 64 sequences: KV lengths 1 (an empty cache) to 4096 (at scale 1), mostly decoding, a few rows
     * (2-4: the split kernels' share of a mixed step on cuda) and chunks of 5, 37 and 300 (the flash
     * kernel's): 410 rows */
    for (int i = 0; i < 64; i++) {
        s64n[i] = i == 7 ? 300 : i == 20 ? 37 : i == 33 ? 5 : i % 16 == 5 ? 2 + i / 16 % 3 : 1;
        s64p[i] = (i == 63 ? 4095 : i * 64 + i * 37 % 64) / scale;
    }
    const pcase cs[] = {
        {"1 sequence, 300 new, empty cache, block 16", 1, one_new, one_prior, 16, KILN_DTYPE_F32, 4, 2, 32, 0, 0, 0},
        {"3 sequences, decode + chunk + prefill, block 16, f16", 3, three_new, three_prior, 16, KILN_DTYPE_F16, 4, 1, 64, 0, 0, 0},
        {"3 sequences, block 128", 3, three_new, three_prior, 128, KILN_DTYPE_F32, 2, 2, 16, 0, 0, 0},
        {"17 sequences sharing 256 tokens, block 16, f16", 17, s17_new, s17p, 16, KILN_DTYPE_F16, 8, 2, 32, 256, 0, 0},
        {"17 sequences sharing 256 tokens, block 128", 17, s17_new, s17p, 128, KILN_DTYPE_F32, 4, 4, 32, 256, 0, 0},
        {"3 sequences, decode + chunk + prefill, block 16, q8_0", 3, three_new, three_prior, 16, KILN_DTYPE_Q8_0, 4, 1, 64, 0, 0, 0},
        {"17 sequences sharing 256 tokens, block 16, q8_0", 17, s17_new, s17p, 16, KILN_DTYPE_Q8_0, 8, 2, 32, 256, 0, 0},
        {"64 sequences, KV 1 to 4096 / scale, block 16, f16", 64, s64n, s64p, 16, KILN_DTYPE_F16, 4, 1, 32, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], backend, i == 1 && strcmp(backend, "cuda") != 0);
}

/* Soft-capped scores and sliding windows (gemma 2/3): windows ending inside a block, inside a key
 * split and inside a prefill chunk, window 1, and a window no sequence reaches. */
static void masked_cases(const char *backend, int scale)
{
    static const int two_new[] = {1, 40}, two_prior[] = {1000, 90};
    int p2[2] = {two_prior[0] / scale, two_prior[1]};
    const pcase cs[] = {
        {"3 sequences, softcap 2, window 100, block 16", 3, three_new, three_prior, 16, KILN_DTYPE_F32, 4, 2, 32, 0, 2.0f, 100},
        {"3 sequences, window 37, block 16, f16", 3, three_new, three_prior, 16, KILN_DTYPE_F16, 4, 1, 64, 0, 0, 37},
        {"2 sequences, softcap 1, window 1, block 128", 2, two_new, p2, 128, KILN_DTYPE_F32, 2, 2, 32, 0, 1.0f, 1},
        {"2 sequences, softcap 50, window 4096, block 16", 2, two_new, p2, 16, KILN_DTYPE_F16, 4, 2, 32, 0, 50.0f, 4096},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], backend, false);
}

static bool have(const char *backend)
{
    for (int i = 0; i < kiln_backend_count(g_ctx); i++) {
        kiln_backend_info bi;
        if (kiln_backend_get(g_ctx, i, &bi) == KILN_OK && strcmp(bi.name, backend) == 0) return bi.available;
    }
    return false;
}

Test(paged, ragged_batches_cpu) { cases("cpu", 1); }
Test(paged, softcap_and_window_cpu) { masked_cases("cpu", 1); }
Test(paged, softcap_and_window_ref) { masked_cases("ref", 4); }
Test(paged, ragged_batches_ref) { cases("ref", 4); } /* the reference kernel is slow: shorter caches */

/* One corruption of a good step: what to change and the words the error must carry. */
typedef struct bad {
    const char *what;  /* label */
    int         field; /* 0 slots, 1 pos, 2 seqs, 3 blocks, 4 n_seq symbol */
    int64_t     index; /* element changed */
    int64_t     delta; /* added to it (field 4: the symbol's value) */
    kiln_status want;  /* status */
    const char *words; /* in kiln_ctx_error */
} bad;

static void bad_metadata(const char *backend)
{
    const pcase c = {"bad metadata", 3, three_new, three_prior, 16, KILN_DTYPE_F32, 2, 1, 16, 0, 0, 0};
    step s;
    make_step(&s, &c);
    kiln_plan *p = compile(&s, backend);
    size_t y_n = (size_t)s.n_tok * c.H * c.hd, pool = tu_bytes(c.kvt, s.n_slots * c.Hkv * c.hd, c.hd);
    float *y = tu_galloc(y_n * 4);
    void *before = malloc(pool), *after = malloc(pool);
    cr_assert_eq(kiln_plan_state_read(p, "kpool", before, pool), KILN_OK);
    const bad cases[] = {
        {"slot out of the pool", 0, 5, 1 << 20, KILN_ERR_BINDING, "out of the pool"},
        {"slot against the block table", 0, 40, 1, KILN_ERR_BINDING, "disagrees with the block table"},
        {"negative slot", 0, 0, -(1 << 24), KILN_ERR_BINDING, "slot"},
        {"block index past the pool", 3, 0, 1 << 16, KILN_ERR_BINDING, "past the pool"},
        {"negative block index", 3, s.MB * 2 + 1, -(1 << 16), KILN_ERR_BINDING, "past the pool"},
        {"position against lengths", 1, 7, 1, KILN_ERR_BINDING, "pos[7]"},
        {"decode position against lengths", 1, 0, -3, KILN_ERR_BINDING, "pos[0]"},
        {"first start not 0", 2, 0, 1, KILN_ERR_BINDING, "row 0"},
        {"starts out of order", 2, 2, 100, KILN_ERR_BINDING, "starts must increase"},
        {"KV length over capacity", 2, 1, 1 << 20, KILN_ERR_BINDING, "max_blocks x block"},
        {"KV length below new tokens", 2, 3, -1000, KILN_ERR_BINDING, "KV length"},
        {"sequences over capacity", 4, 0, S_MAX + 1, KILN_ERR_SYMBOL, "n_seq"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad *k = &cases[i];
        int32_t *arr = k->field == 0 ? s.slots : k->field == 1 ? s.pos : k->field == 2 ? s.seqs : s.bt;
        bound b = bindings(&s, y, y_n * 4);
        int32_t keep = k->field < 4 ? arr[k->index] : 0;
        if (k->field < 4) arr[k->index] = (int32_t)(arr[k->index] + k->delta);
        else b.b[1].value = k->delta;
        kiln_status st = kiln_run(p, b.b, b.n);
        if (k->field < 4) arr[k->index] = keep;
        cr_assert_eq(st, k->want, "%s on %s: status %s, want %s (%s)", k->what, backend, kiln_status_str(st),
                     kiln_status_str(k->want), kiln_ctx_error(g_ctx));
        cr_assert(strstr(kiln_ctx_error(g_ctx), k->words), "%s on %s: message '%s' does not say '%s'", k->what, backend,
                  kiln_ctx_error(g_ctx), k->words);
        cr_assert_eq(kiln_plan_state_read(p, "kpool", after, pool), KILN_OK);
        cr_assert_eq(memcmp(before, after, pool), 0, "%s on %s: the pool changed although the step was refused", k->what, backend);
    }
    bound b = bindings(&s, y, y_n * 4); /* the plan still runs a good step */
    cr_assert_eq(kiln_run(p, b.b, b.n), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    for (int i = 0; i < c.n_seq; i++) {
        int64_t e = (int64_t)c.new_tok[i] * c.H * c.hd;
        double *ref = malloc((size_t)e * 8), *got = malloc((size_t)e * 8);
        reference(&s, i, ref);
        for (int64_t k = 0; k < e; k++) got[k] = y[(size_t)s.seqs[2 * i] * c.H * c.hd + k];
        tu_compare("good step after refused ones", got, ref, e, tu_tol("paged_attention", c.kvt));
        free(ref), free(got);
    }
    tu_gfree(y, "y");
    free(before), free(after);
    kiln_plan_free(p);
    free_step(&s);
}

Test(paged, bad_metadata_refused_cpu) { bad_metadata("cpu"); }
Test(paged, bad_metadata_refused_ref) { bad_metadata("ref"); }

/* The GPU lowering (split-KV kernels through the block table) on a device when one is present:
 * lavapipe in CI runs the same kir the PTX printer prints for cuda. */
Test(paged, ragged_batches_vulkan, .timeout = 900)
{
    if (!have("vulkan")) cr_skip_test("no vulkan device");
    cases("vulkan", 4);
}
Test(paged, softcap_and_window_vulkan, .timeout = 900)
{
    if (!have("vulkan")) cr_skip_test("no vulkan device");
    masked_cases("vulkan", 4);
}
Test(paged, softcap_and_window_cuda)
{
    if (!have("cuda")) cr_skip_test("no cuda device");
    masked_cases("cuda", 1);
}
Test(paged, ragged_batches_cuda)
{
    if (!have("cuda")) cr_skip_test("no cuda device");
    cases("cuda", 1);
}
Test(paged, bad_metadata_refused_vulkan, .timeout = 600)
{
    if (!have("vulkan")) cr_skip_test("no vulkan device");
    bad_metadata("vulkan");
}

/* A contiguous single-sequence cache is the special case of one sequence with an identity block
 * table: a preset layer built both ways (kiln_attention over k/v caches; kiln_paged_attention over
 * pools of blocks 0, 1, 2, ...) gives the same outputs for a prefill and the decode steps after
 * it (fused QKV epilogues writing through the slots included). */
static kiln_plan *preset_plan(int64_t block, kiln_graph **g)
{
    kiln_preset_build_opts o = {.wdtype = KILN_DTYPE_F16, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 64, .max_tok = 16,
                                .seed = 3, .block = block, .max_seqs = block ? 1 : 0, .max_blocks = block ? 64 / block : 0};
    char err[256];
    cr_assert_eq(kiln_preset_build_ex(kiln_preset_find("qwen2-0.5b"), &o, g, err, sizeof err), KILN_OK, "%s", err);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(g_ctx, *g, &(kiln_compile_options){.backend = "cpu"}, &p), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    return p;
}

Test(paged, one_sequence_with_identity_blocks_equals_a_contiguous_cache)
{
    kiln_graph *gc = NULL, *gp = NULL;
    kiln_plan *pc = preset_plan(0, &gc), *pp = preset_plan(16, &gp);
    const int64_t H = 896, steps[][2] = {{0, 10}, {10, 1}, {11, 1}, {12, 4}}; /* (first position, tokens) */
    float *x = malloc(16 * H * 4), *yc = malloc(16 * H * 4), *yp = malloc(16 * H * 4);
    int32_t pos[16], blocks[4] = {0, 1, 2, 3};
    for (size_t s = 0; s < sizeof steps / sizeof *steps; s++) {
        int64_t p0 = steps[s][0], n = steps[s][1];
        tu_fill(x, n * H, -1, 1);
        for (int64_t t = 0; t < n; t++) pos[t] = (int32_t)(p0 + t);
        int32_t seqs[2] = {0, (int32_t)(p0 + n)};
        kiln_binding bc[] = {{.name = "n_tok", .value = n}, {.name = "n_kv", .value = p0 + n}, {.name = "x", .data = x, .bytes = (size_t)(n * H) * 4},
                             {.name = "pos", .data = pos, .bytes = (size_t)n * 4}, {.name = "y", .data = yc, .bytes = (size_t)(n * H) * 4}};
        kiln_binding bp[] = {{.name = "n_tok", .value = n}, {.name = "n_seq", .value = 1}, {.name = "x", .data = x, .bytes = (size_t)(n * H) * 4},
                             {.name = "pos", .data = pos, .bytes = (size_t)n * 4}, {.name = "slots", .data = pos, .bytes = (size_t)n * 4},
                             {.name = "seqs", .data = seqs, .bytes = 8}, {.name = "blocks", .data = blocks, .bytes = 16},
                             {.name = "y", .data = yp, .bytes = (size_t)(n * H) * 4}};
        cr_assert_eq(kiln_run(pc, bc, 5), KILN_OK, "%s", kiln_ctx_error(g_ctx));
        cr_assert_eq(kiln_run(pp, bp, 8), KILN_OK, "%s", kiln_ctx_error(g_ctx));
        double *a = malloc((size_t)(n * H) * 8), *b = malloc((size_t)(n * H) * 8);
        for (int64_t i = 0; i < n * H; i++) a[i] = yp[i], b[i] = yc[i];
        char what[64];
        snprintf(what, sizeof what, "step %zu (%lld tokens at %lld)", s, (long long)n, (long long)p0);
        tu_compare(what, a, b, n * H, tu_tol("paged_attention", KILN_DTYPE_F16));
        free(a), free(b);
    }
    free(x), free(yc), free(yp);
    kiln_plan_free(pc), kiln_plan_free(pp);
    kiln_graph_free(gc), kiln_graph_free(gp);
}

/* The cuda backend's host side on tests/fakecuda (any machine): a mixed step's flash kernel (the
 * chunks of 37 and 300 rows) runs on a second stream beside the split kernels (the decoding row),
 * forked after what came before and joined back before the next region, launched one by one and
 * inside a recording (the side stream's launches a branch of the graph, joined back before the
 * capture ends) with codegen.paged_mixed = KILN_PAGED_MIXED_SIDE (opt-in until timed); the default
 * keeps it on the plan's stream; a decode step (no flash kernel) forks nothing. */
static void side_stream_case(kiln_ctx *ctx, fakecuda_log *f, step *s, bool record, int32_t mixed, bool decode)
{
    kiln_graph *g = build(s->c, s->NB, s->MB);
    kiln_plan *p = NULL;
    kiln_compile_options o = {.backend = "cuda", .no_record = !record};
    o.codegen.paged_mixed = mixed;
    cr_assert_eq(kiln_compile(ctx, g, &o, &p), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_graph_free(g);
    size_t y_n = (size_t)s->n_tok * s->c->H * s->c->hd;
    float *y = malloc(y_n * 4);
    for (int run = 0; run < 2; run++) { /* recorded at the first run, replayed at the second */
        int l0 = f->n_launch_log, w0 = f->stream_waits, j0 = f->joined_launches;
        bound b = bindings(s, y, y_n * 4);
        cr_assert_eq(kiln_run(p, b.b, b.n), KILN_OK, "%s", kiln_ctx_error(ctx));
        int flash = -1, split = -1;
        for (int i = l0; i < f->n_launch_log; i++) {
            const char *nm = f->launch_log[i % 64].name;
            if (!strcmp(nm, "kiln_attn_flash")) flash = i % 64;
            if (!strcmp(nm, "kiln_attn_split")) split = i % 64;
        }
        char what[96];
        snprintf(what, sizeof what, "%s step, %s, paged_mixed %d, run %d", decode ? "decode" : "mixed", record ? "recorded" : "launched",
                 (int)mixed, run);
        if (record && run) { /* the replay launches no kernel one by one */
            cr_assert_eq(f->n_launch_log, l0, "%s: %d launches", what, f->n_launch_log - l0);
            continue;
        }
        cr_assert(split >= 0, "%s: no split kernel", what);
        cr_assert((flash >= 0) == !decode, "%s: flash kernel %s", what, flash >= 0 ? "launched" : "missing");
        if (decode) {
            cr_assert_eq(f->stream_waits, w0, "%s: %d stream waits", what, f->stream_waits - w0);
            continue;
        }
        bool beside = f->launch_log[flash].stream != f->launch_log[split].stream;
        bool side = mixed >= KILN_PAGED_MIXED_SIDE;
        cr_assert_eq(beside, side, "%s: the flash kernel %s the split kernels' stream", what, beside ? "left" : "shares");
        cr_assert_eq(f->stream_waits - w0, side ? 2 : 0, "%s: %d stream waits (a fork and a join)", what, f->stream_waits - w0);
        cr_assert_eq(f->joined_launches - j0, record && side ? 1 : 0, "%s: %d launches on a stream joined to the recording", what,
                     f->joined_launches - j0);
    }
    cr_assert_eq(f->unjoined_ends, 0, "a recording ended before the side stream joined back");
    free(y);
    kiln_plan_free(p);
}

Test(paged, mixed_step_runs_flash_beside_the_split_kernels_fakecuda)
{
    fakecuda_log *f = tu_fakecuda();
    kiln_ctx *ctx = tu_fakecuda_ctx(0);
    static const int dec_new[] = {1, 1, 1};
    const pcase mixed = {"mixed", 3, three_new, three_prior, 16, KILN_DTYPE_F16, 4, 1, 64, 0, 0, 0};
    const pcase dec = {"decode", 3, dec_new, three_prior, 16, KILN_DTYPE_F16, 4, 1, 64, 0, 0, 0};
    step sm, sd;
    make_step(&sm, &mixed);
    make_step(&sd, &dec);
    for (int record = 0; record < 2; record++) {
        side_stream_case(ctx, f, &sm, record, KILN_PAGED_MIXED_SIDE, false);
        side_stream_case(ctx, f, &sm, record, 0, false);
        side_stream_case(ctx, f, &sd, record, KILN_PAGED_MIXED_SIDE, true);
    }
    free_step(&sm), free_step(&sd);
    kiln_ctx_free(ctx);
}
