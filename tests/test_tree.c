/* Speculative tree verification (kiln_paged_attention_tree): a step whose new tokens form, per
 * sequence, a tree, a chain or a forest of drafts over a paged cache must give every row what
 * decoding its draft path one token at a time gives (an f64 decode of each root-to-leaf path, every
 * element), on every backend that runs it and, for the cuda and Vulkan lowerings, in the kir block
 * interpreter (on sm_90 steps of many rows take the flash kernel); a chain equals
 * kiln_paged_attention bit for bit; bad trees are refused by name before any kernel, the plan usable after. Must not compare a backend only with itself. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/kir.h"
#include "fuse/fuse.h"
#include "graph/graph.h"
#include "support/kirtest.h"
#include "support/testutil.h"

#define T_MAX 80 /* capacity: new tokens per step */
#define S_MAX 6  /* capacity: sequences per step */
#define MAXB 24  /* interpreter buffer slots */

enum { CHAIN, TREE, FOREST };

typedef struct tcase {
    const char *what;   /* label */
    int         n_seq;  /* sequences */
    const int  *n_new;  /* draft tokens per sequence */
    const int  *prior;  /* cached tokens per sequence */
    const int  *shape;  /* CHAIN, TREE or FOREST per sequence */
    int         block;  /* tokens per block */
    kiln_dtype  kvt;    /* pool dtype */
    int         H, Hkv, hd; /* heads, kv heads, head_dim */
} tcase;

/* One step as an engine builds it, and each sequence's keys in storage order for the reference. */
typedef struct tstep {
    const tcase *c;
    int64_t  n_tok, NB, MB, n_slots;           /* new tokens, pool blocks, table width, slots */
    int32_t *pos, *slots, *seqs, *bt, *par;    /* metadata */
    float   *q, *kr, *vr;                      /* new rows */
    float   *pool_k, *pool_v;                  /* pools before the step (values exact in kvt) */
    double **K, **V;                           /* per sequence [kv_len, Hkv, hd] keys/values by key index */
} tstep;

static void round_to(kiln_dtype t, float *x, int64_t n)
{
    size_t b;
    void *d = tu_to_dtype(t, x, n, &b);
    cr_assert_eq(kiln_dequantize(t, d, x, n), KILN_OK);
    free(d);
}

static int64_t depth_of(const int32_t *par, int64_t i)
{
    int64_t d = 0;
    while ((i = par[i]) >= 0) d++;
    return d;
}

/* Parents of n drafts: a chain, a tree under draft 0, or a forest of several roots. */
static void make_parents(int shape, int n, int32_t *par)
{
    for (int i = 0; i < n; i++)
        par[i] = shape == CHAIN ? i - 1 : i == 0 ? -1 : shape == TREE ? (int32_t)tu_randint(0, i) : (int32_t)tu_randint(-1, i);
}

static void seq_keys(tstep *s, int i, int64_t t0)
{
    const tcase *c = s->c;
    int64_t kv = s->seqs[2 * i + 1], row = (int64_t)c->Hkv * c->hd;
    const int32_t *bt = s->bt + i * s->MB;
    s->K[i] = malloc((size_t)(kv * row) * 8), s->V[i] = malloc((size_t)(kv * row) * 8);
    for (int64_t j = 0; j < kv; j++) {
        int64_t slot = (int64_t)bt[j / c->block] * c->block + j % c->block;
        for (int64_t h = 0; h < c->Hkv; h++)
            for (int64_t d = 0; d < c->hd; d++) {
                int64_t e = (j * c->Hkv + h) * c->hd + d;
                float kx = s->pool_k[(h * s->n_slots + slot) * c->hd + d], vx = s->pool_v[(h * s->n_slots + slot) * c->hd + d];
                if (j >= c->prior[i]) { /* a draft: kv_scatter writes it at its key's slot */
                    int64_t t = t0 + j - c->prior[i];
                    kx = s->kr[(t * c->Hkv + h) * c->hd + d], vx = s->vr[(t * c->Hkv + h) * c->hd + d];
                    round_to(c->kvt, &kx, 1), round_to(c->kvt, &vx, 1);
                }
                s->K[i][e] = kx, s->V[i][e] = vx;
            }
    }
}

static void make_step(tstep *s, const tcase *c)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    int64_t row = (int64_t)c->Hkv * c->hd, need = 0;
    for (int i = 0; i < c->n_seq; i++) {
        int64_t nb = (c->prior[i] + c->n_new[i] + c->block - 1) / c->block;
        s->n_tok += c->n_new[i], need += nb, s->MB = nb > s->MB ? nb : s->MB;
    }
    cr_assert(s->n_tok <= T_MAX && c->n_seq <= S_MAX, "%s: over the capacity", c->what);
    s->NB = need + 3, s->n_slots = s->NB * c->block;
    int32_t *perm = malloc((size_t)s->NB * 4);
    for (int64_t i = 0; i < s->NB; i++) perm[i] = (int32_t)i;
    for (int64_t i = s->NB - 1; i > 0; i--) { /* shuffled physical blocks */
        int64_t j = tu_randint(0, i + 1);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    s->pos = malloc((size_t)s->n_tok * 4), s->slots = malloc((size_t)s->n_tok * 4), s->par = malloc((size_t)s->n_tok * 4);
    s->seqs = malloc((size_t)c->n_seq * 8), s->bt = malloc((size_t)(c->n_seq * s->MB) * 4);
    for (int64_t i = 0; i < c->n_seq * s->MB; i++) s->bt[i] = -7; /* unread entries: garbage */
    s->pool_k = malloc((size_t)(s->n_slots * row) * 4), s->pool_v = malloc((size_t)(s->n_slots * row) * 4);
    tu_fill(s->pool_k, s->n_slots * row, -2, 2), tu_fill(s->pool_v, s->n_slots * row, -2, 2);
    round_to(c->kvt, s->pool_k, s->n_slots * row), round_to(c->kvt, s->pool_v, s->n_slots * row);
    s->q = malloc((size_t)(s->n_tok * c->H * c->hd) * 4);
    s->kr = malloc((size_t)(s->n_tok * row) * 4), s->vr = malloc((size_t)(s->n_tok * row) * 4);
    tu_fill(s->q, s->n_tok * c->H * c->hd, -1.5f, 1.5f);
    tu_fill(s->kr, s->n_tok * row, -1.5f, 1.5f), tu_fill(s->vr, s->n_tok * row, -1, 2);
    s->K = calloc((size_t)c->n_seq, sizeof *s->K), s->V = calloc((size_t)c->n_seq, sizeof *s->V);
    int64_t next = 0, t0 = 0;
    for (int i = 0; i < c->n_seq; i++) {
        int64_t kv = c->prior[i] + c->n_new[i];
        int32_t *bt = s->bt + i * s->MB;
        for (int64_t b = 0; b < (kv + c->block - 1) / c->block; b++) bt[b] = perm[next++];
        s->seqs[2 * i] = (int32_t)t0, s->seqs[2 * i + 1] = (int32_t)kv;
        make_parents(c->shape[i], c->n_new[i], s->par + t0);
        for (int64_t j = 0; j < c->n_new[i]; j++) {
            int64_t key = c->prior[i] + j; /* storage order; the position is by depth */
            s->pos[t0 + j] = (int32_t)(c->prior[i] + depth_of(s->par + t0, j));
            s->slots[t0 + j] = (int32_t)((int64_t)bt[key / c->block] * c->block + key % c->block);
        }
        seq_keys(s, i, t0);
        t0 += c->n_new[i];
    }
    free(perm);
}

static void free_step(tstep *s)
{
    for (int i = 0; i < s->c->n_seq; i++) free(s->K[i]), free(s->V[i]);
    free(s->K), free(s->V), free(s->pos), free(s->slots), free(s->par), free(s->seqs), free(s->bt);
    free(s->q), free(s->kr), free(s->vr), free(s->pool_k), free(s->pool_v);
}

/* f64: decodes the draft path root .. leaf of sequence i one token at a time — each path token's
 * query over the cached keys and the path's keys so far — writing every path token's rows of y
 * (the step's [n_tok, H, hd] layout) and marking them in done. */
static void decode_path(const tstep *s, int i, int64_t leaf, double *y, bool *done)
{
    const tcase *c = s->c;
    int64_t t0 = s->seqs[2 * i], prior = c->prior[i], grp = c->H / c->Hkv, path[T_MAX], n = 0;
    for (int64_t a = leaf; a >= 0; a = s->par[t0 + a]) path[n++] = a;
    double *p = malloc((size_t)(prior + n) * 8), scale = 1.0 / sqrt((double)c->hd);
    for (int64_t d = 0; d < n; d++) { /* step d: the token at depth d, its key appended to the path's cache */
        int64_t tok = path[n - 1 - d], nk = prior + d + 1;
        for (int64_t h = 0; h < c->H; h++) {
            int64_t g = h / grp;
            const float *qr = s->q + ((t0 + tok) * c->H + h) * c->hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < nk; j++) {
                int64_t key = j < prior ? j : prior + path[n - 1 - (j - prior)]; /* cached, then the path's drafts */
                double dot = 0;
                for (int64_t e = 0; e < c->hd; e++) dot += (double)qr[e] * s->K[i][(key * c->Hkv + g) * c->hd + e];
                p[j] = dot * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = 0; j < nk; j++) sum += (p[j] = exp(p[j] - mx));
            for (int64_t e = 0; e < c->hd; e++) {
                double acc = 0;
                for (int64_t j = 0; j < nk; j++) {
                    int64_t key = j < prior ? j : prior + path[n - 1 - (j - prior)];
                    acc += p[j] * s->V[i][(key * c->Hkv + g) * c->hd + e];
                }
                y[((t0 + tok) * c->H + h) * c->hd + e] = acc / sum;
            }
        }
        done[t0 + tok] = true;
    }
    free(p);
}

/* The reference of the whole step: every leaf's path decoded (every draft lies on one). */
static double *reference(const tstep *s)
{
    const tcase *c = s->c;
    double *y = malloc((size_t)(s->n_tok * c->H * c->hd) * 8);
    bool *done = calloc((size_t)s->n_tok, 1), *inner = calloc((size_t)s->n_tok, 1);
    for (int i = 0; i < c->n_seq; i++) {
        int64_t t0 = s->seqs[2 * i];
        for (int64_t j = 0; j < c->n_new[i]; j++)
            if (s->par[t0 + j] >= 0) inner[t0 + s->par[t0 + j]] = true; /* has a child: not a leaf */
        for (int64_t j = 0; j < c->n_new[i]; j++)
            if (!inner[t0 + j]) decode_path(s, i, j, y, done);
    }
    for (int64_t t = 0; t < s->n_tok; t++) cr_assert(done[t], "%s: draft %lld on no path", c->what, (long long)t);
    free(done), free(inner);
    return y;
}

static kiln_graph *build(const tstep *s, bool tree)
{
    const tcase *c = s->c;
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim T = kiln_sym(g, "n_tok", T_MAX), S = kiln_sym(g, "n_seq", S_MAX);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, c->H, c->hd});
    kiln_node kr = kiln_input(g, "kr", KILN_DTYPE_F32, 3, (kiln_dim[]){T, c->Hkv, c->hd});
    kiln_node vr = kiln_input(g, "vr", KILN_DTYPE_F32, 3, (kiln_dim[]){T, c->Hkv, c->hd});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node slots = kiln_input(g, "slots", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){S, 2});
    kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){S, s->MB});
    kiln_dim pd[] = {c->Hkv, s->n_slots, c->hd};
    kiln_node kp = kiln_state(g, "kpool", c->kvt, 3, pd), vp = kiln_state(g, "vpool", c->kvt, 3, pd);
    kiln_node ks = kiln_kv_scatter(g, kp, kr, slots), vs = kiln_kv_scatter(g, vp, vr, slots);
    kiln_node y = tree ? kiln_paged_attention_tree(g, q, ks, vs, pos, seqs, bt, kiln_input(g, "parents", KILN_DTYPE_I32, 1, (kiln_dim[]){T}),
                                                   c->block, 0)
                       : kiln_paged_attention(g, q, ks, vs, pos, seqs, bt, c->block, 0);
    kiln_output(g, y, "y");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    return g;
}

static kiln_ctx *g_ctx;

static kiln_plan *compile(const tstep *s, const char *backend, bool tree)
{
    kiln_graph *g = build(s, tree);
    kiln_plan *p = NULL;
    cr_assert_eq(kiln_compile(g_ctx, g, &(kiln_compile_options){.backend = backend}, &p), KILN_OK, "%s on %s: %s", s->c->what,
                 backend, kiln_ctx_error(g_ctx));
    kiln_graph_free(g);
    for (int i = 0; i < kiln_plan_kernel_count(p); i++) { /* the attention really runs where asked */
        kiln_region_info ri;
        cr_assert_eq(kiln_plan_region(p, i, &ri), KILN_OK);
        if (strstr(ri.ops, "paged_attention")) cr_assert_str_eq(ri.backend, backend, "%s", ri.ops);
    }
    size_t n = (size_t)(s->n_slots * s->c->Hkv * s->c->hd), bytes;
    void *d = tu_to_dtype(s->c->kvt, s->pool_k, (int64_t)n, &bytes);
    cr_assert_eq(kiln_plan_state_write(p, "kpool", d, bytes), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    free(d);
    d = tu_to_dtype(s->c->kvt, s->pool_v, (int64_t)n, &bytes);
    cr_assert_eq(kiln_plan_state_write(p, "vpool", d, bytes), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    free(d);
    return p;
}

static kiln_status run(const tstep *s, kiln_plan *p, float *y, bool tree)
{
    const tcase *c = s->c;
    size_t row = (size_t)c->Hkv * c->hd * 4, nt = (size_t)s->n_tok;
    kiln_binding b[] = {
        {.name = "n_tok", .value = s->n_tok},
        {.name = "n_seq", .value = c->n_seq},
        {.name = "q", .data = s->q, .bytes = nt * c->H * c->hd * 4},
        {.name = "kr", .data = s->kr, .bytes = nt * row},
        {.name = "vr", .data = s->vr, .bytes = nt * row},
        {.name = "pos", .data = s->pos, .bytes = nt * 4},
        {.name = "slots", .data = s->slots, .bytes = nt * 4},
        {.name = "seqs", .data = s->seqs, .bytes = (size_t)c->n_seq * 8},
        {.name = "blocks", .data = s->bt, .bytes = (size_t)(c->n_seq * s->MB) * 4},
        {.name = "y", .data = y, .bytes = nt * c->H * c->hd * 4},
        {.name = "parents", .data = s->par, .bytes = nt * 4},
    };
    return kiln_run(p, b, tree ? 11 : 10);
}

static double worst; /* largest NMSE of a test (printed: the contract's bound's margin) */

/* Every sequence's rows against its paths decoded in f64, at the contract's tolerance. */
static void check_rows(const tstep *s, const float *y, const double *ref, const char *where)
{
    const tcase *c = s->c;
    for (int i = 0; i < c->n_seq; i++) {
        int64_t e = (int64_t)c->n_new[i] * c->H * c->hd, o = (int64_t)s->seqs[2 * i] * c->H * c->hd;
        double *got = malloc((size_t)e * 8);
        for (int64_t k = 0; k < e; k++) got[k] = y[o + k];
        char what[200];
        snprintf(what, sizeof what, "%s on %s: sequence %d (%d drafts, %s, %d cached)", c->what, where, i, c->n_new[i],
                 c->shape[i] == CHAIN ? "chain" : c->shape[i] == TREE ? "tree" : "forest", c->prior[i]);
        double nm = tu_compare(what, got, ref + o, e, tu_tol("paged_attention", c->kvt));
        worst = nm > worst ? nm : worst;
        free(got);
    }
}

static void run_case(const tcase *c, const char *backend)
{
    tstep s;
    make_step(&s, c);
    double *ref = reference(&s);
    kiln_plan *p = compile(&s, backend, true);
    size_t yb = (size_t)(s.n_tok * c->H * c->hd) * 4;
    float *y = tu_galloc(yb);
    cr_assert_eq(run(&s, p, y, true), KILN_OK, "%s on %s: %s", c->what, backend, kiln_ctx_error(g_ctx));
    tu_gcheck(y, "y");
    check_rows(&s, y, ref, backend);
    tu_gfree(y, "y");
    kiln_plan_free(p);
    free(ref);
    free_step(&s);
}

static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = 2}, &g_ctx), KILN_OK); }
static void teardown(void)
{
    kiln_ctx_free(g_ctx);
    fprintf(stderr, "worst NMSE %.3g (contract 1e-10)\n", worst);
}

TestSuite(tree, .init = setup, .fini = teardown, .timeout = 300);

static bool have(const char *backend)
{
    for (int i = 0; i < kiln_backend_count(g_ctx); i++) {
        kiln_backend_info bi;
        if (kiln_backend_get(g_ctx, i, &bi) == KILN_OK && strcmp(bi.name, backend) == 0) return bi.available;
    }
    return false;
}

/* A tree of 24 drafts over a long cache with a chain, a forest, a lone decode token and a tree
 * over an empty cache beside it; a chain-only step; block 128 with f16 pools. */
static const int mix_new[] = {24, 6, 9, 1, 12}, mix_prior[] = {300, 45, 17, 80, 0}, mix_shape[] = {TREE, CHAIN, FOREST, TREE, TREE};
static const int big_new[] = {40, 30}, big_prior[] = {129, 1}, big_shape[] = {TREE, FOREST};

static void cases(const char *backend)
{
    const tcase cs[] = {
        {"mixed trees, block 16", 5, mix_new, mix_prior, mix_shape, 16, KILN_DTYPE_F32, 4, 2, 32},
        {"mixed trees, block 128, f16, 8 heads per kv head", 5, mix_new, mix_prior, mix_shape, 128, KILN_DTYPE_F16, 8, 1, 64},
        {"70 drafts in a tree and a forest, block 16, f16", 2, big_new, big_prior, big_shape, 16, KILN_DTYPE_F16, 2, 2, 16},
        {"70 drafts in a tree and a forest, block 16, f16, head_dim 64", 2, big_new, big_prior, big_shape, 16, KILN_DTYPE_F16, 4, 2, 64},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], backend);
}

Test(tree, verify_equals_path_decoding_ref) { cases("ref"); }
Test(tree, verify_equals_path_decoding_cpu) { cases("cpu"); }
Test(tree, verify_equals_path_decoding_vulkan, .timeout = 900)
{
    if (!have("vulkan")) cr_skip_test("no vulkan device");
    cases("vulkan");
}
Test(tree, verify_equals_path_decoding_cuda)
{
    if (!have("cuda")) cr_skip_test("no cuda device");
    cases("cuda");
}

/* A chain of drafts is an ordinary step: kiln_paged_attention_tree with parents i - 1 gives the bits
 * of kiln_paged_attention on the cpu backend. */
Test(tree, chain_is_the_causal_step_cpu)
{
    static const int nw[] = {20, 1, 7}, pr[] = {33, 64, 0}, sh[] = {CHAIN, CHAIN, CHAIN};
    const tcase c = {"chains", 3, nw, pr, sh, 16, KILN_DTYPE_F16, 4, 2, 32};
    tstep s;
    make_step(&s, &c);
    size_t yb = (size_t)(s.n_tok * c.H * c.hd) * 4;
    float *ya = malloc(yb), *yb_ = malloc(yb);
    kiln_plan *pt = compile(&s, "cpu", true), *pp = compile(&s, "cpu", false);
    cr_assert_eq(run(&s, pt, ya, true), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    cr_assert_eq(run(&s, pp, yb_, false), KILN_OK, "%s", kiln_ctx_error(g_ctx));
    cr_assert_eq(memcmp(ya, yb_, yb), 0, "a chain differs from the causal step");
    double *ref = reference(&s);
    check_rows(&s, ya, ref, "cpu");
    free(ref), free(ya), free(yb_);
    kiln_plan_free(pt), kiln_plan_free(pp);
    free_step(&s);
}

/* ---------------------------------------------------------------- the GPU lowering, interpreted */

/* Lowers every region of g for the target, runs its kernels in the block interpreter with symbol
 * values params[] over the buffers named in names[]/mem[] (the output y poisoned); whether the flash
 * kernel was among them (tree steps of many rows take it where the MMA is native). */
static bool interpret(kiln_graph *g, const kiln_lower_target *tg, uint32_t *params, const char *const *names, void *const *mem,
                      int n_mem, float *y, const char *what)
{
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    uint32_t yi = g->outs[0].node;
    char err[1024];
    bool flash = false;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir kk[KILN_LOWER_MAX];
        uint32_t n = 0;
        cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], tg, kk, &n, err, sizeof err), KILN_OK, "%s: %s", what, err);
        uint64_t sb = 0;
        for (uint32_t i = 0; i < n; i++) sb = kk[i].scratch_bytes > sb ? kk[i].scratch_bytes : sb;
        uint32_t *scratch = calloc(sb / 4 + 4, 4);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t *bufs[MAXB] = {params};
            for (uint32_t s = 1; s < kk[i].n_bufs; s++) {
                const kiln_kbuf *b = &kk[i].bufs[s];
                const char *nm = b->kind == KILN_KBUF_NODE ? g->nodes[b->node].name : NULL;
                bufs[s] = b->kind == KILN_KBUF_SCRATCH ? scratch : b->node == yi ? (uint32_t *)y : NULL;
                for (int j = 0; nm && !bufs[s] && j < n_mem; j++)
                    if (!strcmp(nm, names[j])) bufs[s] = mem[j];
                cr_assert(bufs[s], "%s: kernel %s reads node %u", what, kk[i].name, b->node);
            }
            flash |= strcmp(kk[i].name, "kiln_attn_flash") == 0;
            cr_assert(kt_interp_block(&kk[i], bufs, err, sizeof err), "%s, kernel %s: %s", what, kk[i].name, err);
            kiln_kir_free(&kk[i]);
        }
        free(scratch);
    }
    kiln_fusion_free(&f);
    return flash;
}

/* The pool as the kernels read it after the step's kv_scatter, in the pool's dtype. */
static void *pool_after(const tstep *s, const float *pool, const float *rows, size_t *bytes)
{
    const tcase *c = s->c;
    int64_t n = s->n_slots * c->Hkv * c->hd;
    float *f = malloc((size_t)n * 4);
    memcpy(f, pool, (size_t)n * 4);
    for (int64_t t = 0; t < s->n_tok; t++)
        for (int64_t h = 0; h < c->Hkv; h++)
            memcpy(f + (h * s->n_slots + s->slots[t]) * c->hd, rows + (t * c->Hkv + h) * c->hd, (size_t)c->hd * 4);
    void *d = tu_to_dtype(c->kvt, f, n, bytes);
    free(f);
    return d;
}

/* flash: whether the lowering must include the flash kernel (its tiles masking draft paths; its
 * guard runs it for steps of more than 4 rows a sequence, the split kernels' for the others). */
static void interp_case(const tcase *c, const kiln_lower_target *tg, const char *tname, bool flash)
{
    tstep s;
    make_step(&s, c);
    double *ref = reference(&s);
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim T = kiln_sym(g, "n_tok", T_MAX), S = kiln_sym(g, "n_seq", S_MAX);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, c->H, c->hd});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node par = kiln_input(g, "parents", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){S, 2});
    kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){S, s.MB});
    kiln_dim pd[] = {c->Hkv, s.n_slots, c->hd};
    kiln_node kp = kiln_state(g, "k", c->kvt, 3, pd), vp = kiln_state(g, "v", c->kvt, 3, pd);
    kiln_output(g, kiln_paged_attention_tree(g, q, kp, vp, pos, seqs, bt, par, c->block, 0), "y");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    size_t kb, vb, yn = (size_t)(s.n_tok * c->H * c->hd);
    void *km = pool_after(&s, s.pool_k, s.kr, &kb), *vm = pool_after(&s, s.pool_v, s.vr, &vb);
    float *y = malloc(yn * 4 + 16);
    memset(y, 0xFF, yn * 4 + 16); /* NaN poison: every element must be written */
    uint32_t params[8] = {0};
    params[kiln_sym_index(T)] = (uint32_t)s.n_tok, params[kiln_sym_index(S)] = (uint32_t)c->n_seq;
    const char *const names[] = {"q", "k", "v", "pos", "parents", "seqs", "blocks"};
    void *const mem[] = {s.q, km, vm, s.pos, s.par, s.seqs, s.bt};
    char what[160];
    snprintf(what, sizeof what, "%s, %s", c->what, tname);
    cr_assert(interpret(g, tg, params, names, mem, 7, y, what) == flash, "%s: the flash kernel %s", what,
              flash ? "did not take the step" : "took the step");
    check_rows(&s, y, ref, tname);
    kiln_graph_free(g);
    free(km), free(vm), free(y), free(ref);
    free_step(&s);
}

/* The cuda lowering (sm_90: tree steps of many rows take the flash kernel, whose tiles mask draft
 * paths; few rows a sequence: the split kernels) and the Vulkan one (split kernels), run by the
 * interpreter: what the PTX and GLSL printers print. The 70 drafts straddle key tiles (a path's
 * ancestors in two tiles of 64 keys); the decode-like step has fewer than 4 rows a sequence. */
Test(tree, gpu_lowering_interpreted)
{
    static const int nw[] = {19, 1, 8}, pr[] = {40, 7, 0}, sh[] = {TREE, CHAIN, FOREST};
    static const int bw[] = {40, 30}, bp[] = {100, 1}, bs[] = {TREE, FOREST};
    static const int dw[] = {3, 2, 1, 3}, dp[] = {50, 9, 130, 0}, ds[] = {TREE, CHAIN, TREE, FOREST};
    const tcase cs[] = {
        {"trees, block 16, f16", 3, nw, pr, sh, 16, KILN_DTYPE_F16, 4, 1, 64},
        {"trees, block 32, f32, 2 kv heads", 3, nw, pr, sh, 32, KILN_DTYPE_F32, 4, 2, 32},
        {"70 drafts across key tiles, block 16, f16, 4 heads per kv head", 2, bw, bp, bs, 16, KILN_DTYPE_F16, 8, 2, 64},
        {"9 drafts over 4 sequences, block 16, f32", 4, dw, dp, ds, 16, KILN_DTYPE_F32, 2, 2, 32},
    };
    kiln_lower_target sm90 = kiln_lower_target_for_sm(90), vk = kiln_lower_target_default();
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        interp_case(&cs[i], &sm90, "cuda target (sm_90)", true); /* lowered; the last step's guard runs the split kernels */
        interp_case(&cs[i], &vk, "vulkan target", false);
    }
}

/* ---------------------------------------------------------------- bad trees */

/* One corruption of a good tree step: the array, the element, its new value, the words the error
 * must carry. */
typedef struct bad {
    const char *what;
    int         field; /* 0 parents, 1 pos, 2 slots */
    int64_t     index; /* element (a draft of sequence 0, whose rows start at 0) */
    int32_t     value; /* its new value; INT32_MIN: the value a causal step would have had */
    const char *words;
} bad;

static void bad_trees(const char *backend)
{
    static const int nw[] = {12, 1}, pr[] = {20, 5}, sh[] = {TREE, CHAIN};
    const tcase c = {"bad trees", 2, nw, pr, sh, 16, KILN_DTYPE_F32, 2, 1, 16};
    tstep s;
    make_step(&s, &c);
    s.par[5] = 3, s.par[4] = 0, s.par[3] = 1, s.par[1] = 0; /* draft 5 at depth 3: a causal step would put it at 25 */
    for (int64_t j = 0; j < 12; j++) s.pos[j] = (int32_t)(20 + depth_of(s.par, j));
    double *ref = reference(&s);
    kiln_plan *p = compile(&s, backend, true);
    size_t yb = (size_t)(s.n_tok * c.H * c.hd) * 4, pool = (size_t)(s.n_slots * c.Hkv * c.hd) * 4;
    float *y = tu_galloc(yb);
    void *before = malloc(pool), *after = malloc(pool);
    cr_assert_eq(kiln_plan_state_read(p, "kpool", before, pool), KILN_OK);
    const bad cases[] = {
        {"a parent that is the token itself", 0, 6, 6, "parents[6] = 6"},
        {"a parent after the token", 0, 2, 9, "parents[2] = 9"},
        {"a parent below -1", 0, 7, -2, "parents[7] = -2"},
        {"the first draft with a parent", 0, 0, 0, "parents[0] = 0"},
        {"a position by row, not by depth", 1, 5, 25, "its depth in the tree"},
        {"a root not at the cached length", 1, 0, 21, "pos[0]"},
        {"a slot by position, not by key", 2, 5, INT32_MIN, "disagrees with the block table"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const bad *k = &cases[i];
        int32_t *arr = k->field == 0 ? s.par : k->field == 1 ? s.pos : s.slots, keep = arr[k->index];
        if (k->value != INT32_MIN) arr[k->index] = k->value;
        else arr[k->index] = (int32_t)((int64_t)s.bt[s.pos[k->index] / c.block] * c.block + s.pos[k->index] % c.block);
        kiln_status st = run(&s, p, y, true);
        arr[k->index] = keep;
        cr_assert_eq(st, KILN_ERR_BINDING, "%s on %s: status %s (%s)", k->what, backend, kiln_status_str(st), kiln_ctx_error(g_ctx));
        cr_assert(strstr(kiln_ctx_error(g_ctx), k->words), "%s on %s: message '%s' does not say '%s'", k->what, backend,
                  kiln_ctx_error(g_ctx), k->words);
        cr_assert_eq(kiln_plan_state_read(p, "kpool", after, pool), KILN_OK);
        cr_assert_eq(memcmp(before, after, pool), 0, "%s on %s: the pool changed although the step was refused", k->what, backend);
    }
    cr_assert_eq(run(&s, p, y, true), KILN_OK, "%s", kiln_ctx_error(g_ctx)); /* the plan still runs a good step */
    tu_gcheck(y, "y");
    check_rows(&s, y, ref, backend);
    tu_gfree(y, "y");
    free(before), free(after), free(ref);
    kiln_plan_free(p);
    free_step(&s);
}

Test(tree, bad_trees_refused_cpu) { bad_trees("cpu"); }
Test(tree, bad_trees_refused_ref) { bad_trees("ref"); }
Test(tree, bad_trees_refused_vulkan, .timeout = 600)
{
    if (!have("vulkan")) cr_skip_test("no vulkan device");
    bad_trees("vulkan");
}

/* The builder names what is wrong with parents; a tree needs them. */
Test(tree, builder_refuses_bad_parents)
{
    static const struct { kiln_dtype dt; int64_t len; const char *words; } bads[] = {
        {KILN_DTYPE_F32, 8, "parents has dtype f32"}, {KILN_DTYPE_I32, 7, "parents is [7]"}, {KILN_DTYPE_I32, 0, "needs parents"}};
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
        kiln_graph *g;
        cr_assert_eq(kiln_graph_new(&g), KILN_OK);
        kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){8, 2, 16});
        kiln_node kp = kiln_state(g, "k", KILN_DTYPE_F16, 3, (kiln_dim[]){1, 64, 16});
        kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){8});
        kiln_node seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){2, 2});
        kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){2, 4});
        kiln_node par = bads[i].len ? kiln_input(g, "parents", bads[i].dt, 1, (kiln_dim[]){bads[i].len}) : KILN_NODE_NONE;
        cr_assert_eq(kiln_paged_attention_tree(g, q, kp, kp, pos, seqs, bt, par, 16, 0), KILN_NODE_NONE);
        cr_assert(strstr(kiln_graph_error(g), bads[i].words), "'%s' does not say '%s'", kiln_graph_error(g), bads[i].words);
        kiln_graph_free(g);
    }
}
