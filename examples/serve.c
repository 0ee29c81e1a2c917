/* Example: a continuous-batching serving loop, the way an inference engine drives kiln. One plan
 * (a small llama-style model with paged attention, random weights) runs every step; requests with
 * different prompt lengths arrive at different steps; each step packs the decoding sequences (one
 * token each) with chunks of prompts being prefilled, up to a token budget; KV blocks are taken
 * from a free list as sequences grow and returned when they finish; requests with a common system
 * prompt share its KV blocks (computed once). Afterwards every request runs alone through the same
 * plan and its greedy tokens must equal those it got in the batch (exit 1 otherwise). Prints the
 * timeline, and with a second argument draws it as an SVG file (requests in flight, prefill and decode
 * tokens of each step, step time; plain SVG text, no plotting library). Usage: example_serve [BACKEND
 * [TIMELINE.svg]] (default: cuda when present, else cpu). On vulkan the batched steps are queued with
 * kiln_run_async and waited for with kiln_plan_wait. Uses only kiln/kiln.h. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

enum {
    V = 512, C = 64, NH = 4, NKV = 2, HD = 16, FF = 128, NL = 2, /* the model */
    BS = 16, NB = 160, MB = 24,                                  /* blocks of 16 tokens, pool, table width */
    T_CAP = 96, S_CAP = 16, BUDGET = 48,                         /* capacity, tokens per step */
    PREFIX = 32,                                                 /* shared system prompt (2 blocks) */
    NREQ = 8, MAXLEN = MB * BS
};

typedef struct req {
    int     arrive, prompt, gen; /* step it arrives, prompt tokens, tokens to generate */
    bool    shared;              /* starts with the common system prompt */
    int32_t toks[MAXLEN];        /* prompt, then generated tokens */
    int     n_tok;               /* tokens known (prompt + generated) */
    int     n_cached;            /* tokens whose K/V are in the pool */
    int32_t bt[MB];              /* block table */
    int     n_blocks;            /* blocks held */
    int     state;               /* 0 waiting, 1 running, 2 done */
    int32_t got[MAXLEN];         /* tokens generated in the batch */
    int     n_got;               /* count */
} req;

/* One step of the timeline. */
typedef struct tl_step {
    int    step, seqs, pre, dec; /* step number, sequences, prefill and decode tokens */
    double ms;                   /* wall time of the step */
} tl_step;
#define TL_MAX 1000

typedef struct engine {
    kiln_plan *p;
    tl_step    tl[TL_MAX];       /* the timeline of serve() */
    int        n_tl;
    int32_t    free_blocks[NB];  /* free list */
    int        n_free;
    int32_t    prefix[PREFIX / BS]; /* blocks of the shared prompt, once computed */
    int        prefix_refs;      /* holders of those blocks (the cache itself counts one), 0: none yet */
    double     queue_ms, wait_ms; /* vulkan: host time of kiln_run_async (queueing) and of kiln_plan_wait */
    int        n_queued;         /* steps queued that way */
} engine;

/* Weight `name` of layer l, [o, i], random in [-sc, sc] (its seed from its name). */
static kiln_node wr(kiln_graph *g, const char *name, int l, int64_t o, int64_t i, float sc)
{
    char nm[32];
    snprintf(nm, sizeof nm, "%s%d", name, l);
    uint64_t seed = 1000 * (uint64_t)(l + 1);
    for (const char *c = name; *c; c++) seed = seed * 31 + (uint64_t)*c;
    return kiln_weight_random(g, nm, KILN_DTYPE_F32, 2, (kiln_dim[]){o, i}, seed, sc);
}

static kiln_graph *build_model(void)
{
    kiln_graph *g = NULL;
    if (kiln_graph_new(&g) != KILN_OK) return NULL;
    kiln_dim T = kiln_sym(g, "n_tok", T_CAP), S = kiln_sym(g, "n_seq", S_CAP);
    kiln_node ids = kiln_input(g, "ids", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node slots = kiln_input(g, "slots", KILN_DTYPE_I32, 1, (kiln_dim[]){T});
    kiln_node seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){S, 2});
    kiln_node blocks = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){S, MB});
    kiln_node x = kiln_get_rows(g, kiln_weight_random(g, "emb", KILN_DTYPE_F32, 2, (kiln_dim[]){V, C}, 1, 1.0f), ids);
    for (int l = 0; l < NL; l++) {
        char nm[32];
#define W(name, o, i, sc) wr(g, name, l, o, i, sc)
        kiln_node h = kiln_rms_norm(g, x, KILN_NODE_NONE, 1e-5f);
        kiln_node q = kiln_reshape(g, kiln_matmul(g, h, W("wq", NH * HD, C, 0.25f)), 3, (kiln_dim[]){T, NH, HD});
        kiln_node k = kiln_reshape(g, kiln_matmul(g, h, W("wk", NKV * HD, C, 0.25f)), 3, (kiln_dim[]){T, NKV, HD});
        kiln_node v = kiln_reshape(g, kiln_matmul(g, h, W("wv", NKV * HD, C, 0.25f)), 3, (kiln_dim[]){T, NKV, HD});
        q = kiln_rope(g, q, pos, KILN_ROPE_NEOX, 10000.0f);
        k = kiln_rope(g, k, pos, KILN_ROPE_NEOX, 10000.0f);
        kiln_dim pd[] = {NKV, NB * BS, HD};
        snprintf(nm, sizeof nm, "k%d", l);
        kiln_node kp = kiln_kv_scatter(g, kiln_state(g, nm, KILN_DTYPE_F32, 3, pd), k, slots);
        snprintf(nm, sizeof nm, "v%d", l);
        kiln_node vp = kiln_kv_scatter(g, kiln_state(g, nm, KILN_DTYPE_F32, 3, pd), v, slots);
        kiln_node a = kiln_paged_attention(g, q, kp, vp, pos, seqs, blocks, BS, 0);
        x = kiln_add(g, x, kiln_matmul(g, kiln_reshape(g, a, 2, (kiln_dim[]){T, NH * HD}), W("wo", C, NH * HD, 0.25f)));
        kiln_node h2 = kiln_rms_norm(g, x, KILN_NODE_NONE, 1e-5f);
        kiln_node f = kiln_swiglu(g, kiln_matmul(g, h2, W("wg", FF, C, 0.25f)), kiln_matmul(g, h2, W("wu", FF, C, 0.25f)));
        x = kiln_add(g, x, kiln_matmul(g, f, W("wd", C, FF, 0.2f)));
#undef W
    }
    kiln_node logits = kiln_matmul(g, kiln_rms_norm(g, x, KILN_NODE_NONE, 1e-5f),
                                   kiln_weight_random(g, "out", KILN_DTYPE_F32, 2, (kiln_dim[]){V, C}, 7, 0.5f));
    kiln_output(g, kiln_argmax(g, logits), "next");
    return g;
}

/* ------------------------------------------------------------------ blocks */

static int take_block(engine *e) { return e->n_free ? e->free_blocks[--e->n_free] : -1; }

/* Blocks for r to hold `tokens` keys; false when the pool is short (r waits a step). */
static bool grow(engine *e, req *r, int tokens)
{
    while (r->n_blocks * BS < tokens) {
        int b = take_block(e);
        if (b < 0) return false;
        r->bt[r->n_blocks++] = b;
    }
    return true;
}

static void release(engine *e, req *r)
{
    int first = r->shared && e->prefix_refs && r->bt[0] == e->prefix[0] ? PREFIX / BS : 0;
    if (first) e->prefix_refs--;
    for (int b = first; b < r->n_blocks; b++) e->free_blocks[e->n_free++] = r->bt[b];
    r->n_blocks = 0;
}

/* A request with the system prompt starts from its cached blocks once some request computed them. */
static void admit(engine *e, req *r)
{
    r->state = 1;
    if (r->shared && e->prefix_refs) {
        memcpy(r->bt, e->prefix, sizeof e->prefix);
        r->n_blocks = PREFIX / BS;
        r->n_cached = PREFIX;
        e->prefix_refs++;
    }
}

/* ------------------------------------------------------------------ one step */

typedef struct batch {
    int32_t ids[T_CAP], pos[T_CAP], slots[T_CAP], seqs[S_CAP * 2], blocks[S_CAP * MB], next[T_CAP];
    req    *who[S_CAP];
    int     n_new[S_CAP], n_seq, n_tok;
} batch;

static void add_seq(batch *bt, req *r, int q)
{
    int s = bt->n_seq++;
    bt->who[s] = r, bt->n_new[s] = q;
    bt->seqs[2 * s] = bt->n_tok, bt->seqs[2 * s + 1] = r->n_cached + q;
    memset(bt->blocks + s * MB, 0, MB * sizeof(int32_t));
    memcpy(bt->blocks + s * MB, r->bt, (size_t)r->n_blocks * sizeof(int32_t));
    for (int j = 0; j < q; j++) {
        int p = r->n_cached + j, t = bt->n_tok++;
        bt->ids[t] = r->toks[p], bt->pos[t] = p, bt->slots[t] = r->bt[p / BS] * BS + p % BS;
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static kiln_status run_batch(engine *e, batch *bt, bool async)
{
    kiln_binding b[] = {
        {.name = "n_tok", .value = bt->n_tok},
        {.name = "n_seq", .value = bt->n_seq},
        {.name = "ids", .data = bt->ids, .bytes = (size_t)bt->n_tok * 4},
        {.name = "pos", .data = bt->pos, .bytes = (size_t)bt->n_tok * 4},
        {.name = "slots", .data = bt->slots, .bytes = (size_t)bt->n_tok * 4},
        {.name = "seqs", .data = bt->seqs, .bytes = (size_t)bt->n_seq * 8},
        {.name = "blocks", .data = bt->blocks, .bytes = (size_t)bt->n_seq * MB * 4},
        {.name = "next", .data = bt->next, .bytes = sizeof bt->next},
    };
    /* On cuda the step is ordered on the default stream and kiln_run_async returns with the
     * host-bound `next` written; on the host it runs as kiln_run. On vulkan, with a kiln_vk_sync (here
     * without semaphores: an engine adds its own to order the step with its queue's work), the call
     * returns once the step is queued, the inputs copied: the host is free until kiln_plan_wait,
     * which writes `next` (an engine would tokenize arriving requests there). */
    kiln_vk_sync vk = {.magic = KILN_VK_SYNC_MAGIC};
    bool queued = async && strcmp(kiln_plan_backend(e->p), "vulkan") == 0;
    double t0 = now_ms();
    kiln_status s = async ? kiln_run_async(e->p, b, 8, queued ? &vk : NULL) : kiln_run(e->p, b, 8);
    if (s == KILN_OK && queued) {
        double t1 = now_ms();
        s = kiln_plan_wait(e->p);
        e->queue_ms += t1 - t0, e->wait_ms += now_ms() - t1, e->n_queued++;
    }
    if (s != KILN_OK) return s;
    for (int i = 0; i < bt->n_seq; i++) { /* the last fed row predicts the next token */
        req *r = bt->who[i];
        r->n_cached += bt->n_new[i];
        if (r->n_cached == r->n_tok) r->toks[r->n_tok++] = bt->next[bt->seqs[2 * i] + bt->n_new[i] - 1];
    }
    return KILN_OK;
}

/* Decoding sequences first (one token each), then prompt chunks up to the budget. */
static void schedule(engine *e, req *rq, batch *bt, int *n_dec, int *n_pre)
{
    memset(bt, 0, sizeof *bt);
    *n_dec = *n_pre = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < NREQ && bt->n_seq < S_CAP; i++) {
            req *r = &rq[i];
            bool decoding = r->n_cached >= r->prompt;
            if (r->state != 1 || decoding != (pass == 0)) continue;
            int left = BUDGET - bt->n_tok, q = decoding ? 1 : r->prompt - r->n_cached;
            if (q > left) q = left;
            if (q < 1 || !grow(e, r, r->n_cached + q)) continue;
            add_seq(bt, r, q);
            *(decoding ? n_dec : n_pre) += q;
        }
}

/* ------------------------------------------------------------------ the loop */

static int serve(engine *e, req *rq)
{
    int done = 0;
    printf("step  ms      seqs  prefill  decode  events\n");
    for (int step = 0; done < NREQ && step < 1000; step++) {
        char ev[160] = "";
        for (int i = 0; i < NREQ; i++)
            if (rq[i].state == 0 && rq[i].arrive <= step) {
                admit(e, &rq[i]);
                snprintf(ev + strlen(ev), sizeof ev - strlen(ev), " +r%d(%d%s)", i, rq[i].prompt, rq[i].n_cached ? ", prefix cached" : "");
            }
        batch bt;
        int n_dec, n_pre;
        schedule(e, rq, &bt, &n_dec, &n_pre);
        if (!bt.n_seq) continue;
        double t0 = now_ms();
        kiln_status s = run_batch(e, &bt, true);
        if (s != KILN_OK) {
            fprintf(stderr, "step %d: %s\n", step, kiln_status_str(s));
            return 1;
        }
        double ms = now_ms() - t0;
        for (int i = 0; i < NREQ; i++) {
            req *r = &rq[i];
            if (r->state != 1) continue;
            if (r->shared && !e->prefix_refs && r->n_cached >= PREFIX) { /* its system prompt is computed: cache it */
                memcpy(e->prefix, r->bt, sizeof e->prefix);
                e->prefix_refs = 2; /* the cache and r */
            }
            if (r->n_tok - r->prompt >= r->gen) {
                r->n_got = r->n_tok - r->prompt;
                memcpy(r->got, r->toks + r->prompt, (size_t)r->n_got * sizeof(int32_t));
                release(e, r);
                r->state = 2, done++;
                snprintf(ev + strlen(ev), sizeof ev - strlen(ev), " -r%d", i);
            }
        }
        printf("%4d  %6.2f  %4d  %7d  %6d %s\n", step, ms, bt.n_seq, n_pre, n_dec, ev);
        if (e->n_tl < TL_MAX) e->tl[e->n_tl++] = (tl_step){.step = step, .seqs = bt.n_seq, .pre = n_pre, .dec = n_dec, .ms = ms};
    }
    if (e->prefix_refs) { /* the cache lets go of the system prompt */
        for (int b = 0; b < PREFIX / BS; b++) e->free_blocks[e->n_free++] = e->prefix[b];
        e->prefix_refs = 0;
    }
    return done == NREQ ? 0 : 1;
}

/* Request r alone through the same plan: its prompt in chunks, then decoding; returns mismatches. */
static int alone(engine *e, req *r, int idx)
{
    req a = *r;
    a.n_tok = a.prompt, a.n_cached = 0, a.n_blocks = 0, a.shared = false;
    while (a.n_tok - a.prompt < a.gen) {
        batch bt;
        memset(&bt, 0, sizeof bt);
        int q = a.n_cached < a.prompt ? a.prompt - a.n_cached : 1;
        if (q > T_CAP) q = T_CAP;
        if (!grow(e, &a, a.n_cached + q)) return fprintf(stderr, "r%d alone: pool exhausted\n", idx), 1;
        add_seq(&bt, &a, q);
        if (run_batch(e, &bt, false) != KILN_OK) return fprintf(stderr, "r%d alone: run failed\n", idx), 1;
    }
    release(e, &a);
    int bad = 0;
    for (int i = 0; i < r->gen; i++) bad += a.toks[a.prompt + i] != r->got[i];
    printf("r%d: prompt %3d%s, %2d tokens %s running alone:", idx, r->prompt, r->shared ? " (shared prefix)" : "", r->gen,
           bad ? "DIFFER from" : "equal to");
    for (int i = 0; i < r->gen && i < 8; i++) printf(" %d", r->got[i]);
    printf("%s\n", r->gen > 8 ? " ..." : "");
    return bad != 0;
}

/* The timeline as an SVG chart: per step, stacked bars of prefill (orange) and decode (blue) tokens
 * against the token budget, the requests in flight as a line (green, right axis in sequences) and the
 * step time as a line (grey, scaled to the slowest step). Returns 0, or 1 when the file cannot be written. */
static int write_svg(const engine *e, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return fprintf(stderr, "%s: cannot write\n", path), 1;
    const int W = 900, H = 360, L = 60, R = 60, T = 40, B = 50, n = e->n_tl > 0 ? e->n_tl : 1;
    double pw = W - L - R, ph = H - T - B, bw = pw / n, ms_max = 1e-9;
    for (int i = 0; i < e->n_tl; i++) ms_max = e->tl[i].ms > ms_max ? e->tl[i].ms : ms_max;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">kiln serve: %d requests, %d-token steps (slowest step %.2f ms)</text>\n", L, NREQ,
            BUDGET, ms_max);
    for (int i = 0; i < e->n_tl; i++) {
        const tl_step *s = &e->tl[i];
        double x = L + i * bw, hp = ph * s->pre / BUDGET, hd = ph * s->dec / BUDGET;
        fprintf(f, "<rect class=\"prefill\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f5a142\"><title>step %d: %d prefill</title></rect>\n",
                x, T + ph - hp, bw * 0.9, hp, s->step, s->pre);
        fprintf(f, "<rect class=\"decode\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#4a7fd4\"><title>step %d: %d decode</title></rect>\n",
                x, T + ph - hp - hd, bw * 0.9, hd, s->step, s->dec);
    }
    for (int line = 0; line < 2; line++) { /* requests in flight (of S_CAP), step time (of the slowest) */
        fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", line ? "ms" : "seqs",
                line ? "#777777" : "#2a9d45");
        for (int i = 0; i < e->n_tl; i++)
            fprintf(f, "%.1f,%.1f ", L + (i + 0.45) * bw, T + ph - ph * (line ? e->tl[i].ms / ms_max : (double)e->tl[i].seqs / S_CAP));
        fprintf(f, "\"/>\n");
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T + ph, L + pw, T + ph);
    fprintf(f, "<text x=\"%d\" y=\"%d\">step</text>\n", L + (int)pw / 2, H - 15);
    fprintf(f, "<text x=\"5\" y=\"%d\">%d tok</text><text x=\"5\" y=\"%.0f\">0</text>\n", T + 4, BUDGET, T + ph);
    fprintf(f, "<text x=\"%.0f\" y=\"%d\" fill=\"#2a9d45\">%d seqs</text>\n", L + pw + 5, T + 4, S_CAP);
    fprintf(f, "<text x=\"%d\" y=\"%d\"><tspan fill=\"#f5a142\">prefill tokens</tspan>  <tspan fill=\"#4a7fd4\">decode tokens</tspan>  "
               "<tspan fill=\"#2a9d45\">requests in flight</tspan>  <tspan fill=\"#777777\">step time</tspan></text>\n", L, H - 2);
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : (fprintf(stderr, "%s: write failed\n", path), 1);
}

static const char *pick_backend(kiln_ctx *ctx, int argc, char **argv)
{
    if (argc > 1) return argv[1];
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info bi;
        if (kiln_backend_get(ctx, i, &bi) == KILN_OK && bi.available && strcmp(bi.name, "cuda") == 0) return "cuda";
    }
    return "cpu";
}

int main(int argc, char **argv)
{
    static const int prompt[NREQ] = {40, 7, 150, 70, 12, 200, 33, 90}, arrive[NREQ] = {0, 0, 1, 3, 4, 6, 9, 12};
    static const int gen[NREQ] = {16, 24, 10, 20, 30, 12, 18, 8}, shared[NREQ] = {1, 0, 1, 1, 0, 0, 1, 1};
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    const char *be = pick_backend(ctx, argc, argv);
    kiln_graph *g = build_model();
    engine e = {0};
    kiln_status s = g ? kiln_compile(ctx, g, &(kiln_compile_options){.backend = be}, &e.p) : KILN_ERR_NOMEM;
    kiln_graph_free(g);
    if (s != KILN_OK) {
        fprintf(stderr, "compile on %s: %s: %s\n", be, kiln_status_str(s), kiln_ctx_error(ctx));
        kiln_ctx_free(ctx);
        return 1;
    }
    for (int b = NB - 1; b >= 0; b--) e.free_blocks[e.n_free++] = (b * 37) % NB; /* scattered physical blocks */
    static req rq[NREQ];
    uint64_t st = 12345;
    for (int i = 0; i < NREQ; i++) {
        req *r = &rq[i];
        memset(r, 0, sizeof *r);
        r->arrive = arrive[i], r->prompt = prompt[i], r->gen = gen[i], r->shared = shared[i], r->n_tok = prompt[i];
        for (int t = 0; t < prompt[i]; t++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            r->toks[t] = r->shared && t < PREFIX ? (int32_t)((t * 131 + 7) % V) : (int32_t)((st >> 33) % V);
        }
    }
    printf("serving %d requests on %s: %d-token steps, blocks of %d, a %d-token system prompt shared by %d requests\n",
           NREQ, be, BUDGET, BS, PREFIX, shared[0] + shared[2] + shared[3] + shared[6] + shared[7]);
    int rc = serve(&e, rq);
    if (e.n_queued)
        printf("vulkan: %d steps queued by kiln_run_async in %.3f ms each on average (host free), waited for in %.2f ms each\n",
               e.n_queued, e.queue_ms / e.n_queued, e.wait_ms / e.n_queued);
    if (rc == 0 && argc > 2) {
        rc = write_svg(&e, argv[2]);
        if (!rc) printf("timeline of %d steps drawn in %s\n", e.n_tl, argv[2]);
    }
    for (int i = 0; rc == 0 && i < NREQ; i++) rc |= alone(&e, &rq[i], i);
    if (e.n_free != NB) fprintf(stderr, "%d blocks leaked\n", NB - e.n_free), rc = 1;
    printf("%s\n", rc ? "FAILED" : "ok: every request's tokens equal running it alone");
    kiln_plan_free(e.p);
    kiln_ctx_free(ctx);
    return rc;
}
