/* Prefill attention alone on a backend (default cuda): causal attention of n_tok query rows over
 * n_kv = n_tok keys of an f16 cache (32 query heads, head_dim 128, grouped-query ratios 1, 4 and
 * 8), the region's kernel time from kiln_plan_profile (no upload, no download), median over the
 * steps, and TFLOP/s of causal work (4 hd heads x the keys each row sees: q.k and p.v). KILN_FLASH=0
 * times the first flash kernel for comparison; under KILN_PRECISION=f16 on sm_90 the warpgroup
 * kernel runs ("kernel": "wg"), KILN_FLASH_WG=0 keeps the mma.sync one (2 / 3: the warpgroup kernel
 * without / with its ping-pong on every shape: "wg_nopp" / "wg_pp"; KILN_FLASH_ROWS=64 and
 * KILN_FLASH_SPLIT=2|4|auto its short-prompt variants, reported as "rows" and "split", -1 for auto). Also head_dim 64 (14 query heads over 2, qwen2-style), head_dim 256 (16
 * over 8, gemma-style) and gemma's masks: soft-cap 50 and a 1024-key sliding window (the keys a
 * row sees, and so the work counted, are at most the window). JSON, one object per line.
 * Usage: bench_attn [backend] [steps] [max_tokens] [shapes] (shapes of at most max_tokens rows: sanitizer
 * runs; shapes: only those rows of the table, from 0, comma-separated: profiler runs, A/B tables) */
#include <kiln/kiln.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct shape {
    int64_t n_tok, heads, kv_heads, hd;
    float   softcap; /* kiln_attention_ext's soft-cap (0: none) */
    int64_t window;  /* and sliding window (0: none) */
} shape;

static int run_case(kiln_ctx *ctx, const char *backend, const shape *s, int steps)
{
    kiln_graph *g = NULL;
    if (kiln_graph_new(&g) != KILN_OK) return 1;
    int64_t T = s->n_tok, H = s->heads, hd = s->hd;
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, H, hd});
    kiln_node k = kiln_state(g, "k", KILN_DTYPE_F16, 3, (kiln_dim[]){s->kv_heads, T, hd});
    kiln_node v = kiln_state(g, "v", KILN_DTYPE_F16, 3, (kiln_dim[]){s->kv_heads, T, hd});
    kiln_output(g, kiln_attention_ext(g, q, k, v, T, 0, s->softcap, s->window), "y");
    size_t qb = (size_t)(T * H * hd) * 4;
    float *qd = malloc(qb), *y = malloc(qb);
    double med = 0;
    int rc = 1;
    if (qd && y) {
        for (size_t i = 0; i < qb / 4; i++) qd[i] = (float)((i * 2654435761u) % 1000) * 0.002f - 1.0f;
        kiln_binding b[] = {{.name = "q", .data = qd, .bytes = qb}, {.name = "y", .data = y, .bytes = qb}};
        rc = bench_kernel_median(ctx, g, backend, b, 2, steps, "attention", &med);
    }
    if (!rc) {
        double seen = 0;
        for (int64_t r = 0; r < T; r++) seen += (double)(s->window && s->window < r + 1 ? s->window : r + 1);
        double fl = 4.0 * seen * (double)hd * (double)H;
        const char *fe = getenv("KILN_FLASH"), *pe = getenv("KILN_PRECISION"), *we = getenv("KILN_FLASH_WG");
        const char *re = getenv("KILN_FLASH_ROWS"), *se = getenv("KILN_FLASH_SPLIT");
        bool f16 = pe && !strcmp(pe, "f16"), wg = f16 && !(we && !strcmp(we, "0")), nopp = wg && we && !strcmp(we, "2"), pp = wg && we && !strcmp(we, "3");
        int rows = wg && re && !strcmp(re, "64") && hd <= 128 ? 64 : wg ? 128 : 0, split = wg && se ? (!strcmp(se, "auto") ? -1 : atoi(se)) : 0;
        printf("{\"backend\": \"%s\", \"flash\": \"%s\", \"precision\": \"%s\", \"kernel\": \"%s\", \"n_tok\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"hd\": %lld, "
               "\"us\": %.2f, \"tflop_per_s\": %.1f, \"softcap\": %g, \"window\": %lld, \"rows\": %d, \"split\": %d}\n",
               backend, fe && !strcmp(fe, "0") ? "first" : "new", f16 ? "f16" : "exact", nopp ? "wg_nopp" : pp ? "wg_pp" : wg ? "wg" : "mma", (long long)T,
               (long long)H, (long long)s->kv_heads, (long long)hd, med * 1e6, fl / med * 1e-12, (double)s->softcap, (long long)s->window, rows,
               split == 2 || split == 4 || split == -1 ? split : 1);
    }
    free(qd), free(y);
    kiln_graph_free(g);
    return rc;
}

/* Whether index i is among the comma-separated indices of list. */
static bool listed(const char *list, size_t i)
{
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return false;
        if (v >= 0 && (size_t)v == i) return true;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return false;
    }
    return false;
}

int main(int argc, char **argv)
{
    const char *backend = argc > 1 ? argv[1] : "cuda";
    int steps = argc > 2 ? atoi(argv[2]) : 10;
    long max_tok = argc > 3 ? atol(argv[3]) : 1L << 30;
    const char *only = argc > 4 ? argv[4] : NULL; /* comma-separated shape indices */
    if (steps < 1 || steps > 10000) {
        fprintf(stderr, "usage: bench_attn [backend] [steps] [max_tokens] [shape]\n");
        return 2;
    }
    kiln_ctx *ctx;
    if (kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx) != KILN_OK) return 1;
    const shape shapes[] = {
        {512, 32, 32, 128, 0, 0}, {512, 32, 8, 128, 0, 0}, {512, 32, 4, 128, 0, 0},
        {4096, 32, 32, 128, 0, 0}, {4096, 32, 8, 128, 0, 0}, {4096, 32, 4, 128, 0, 0},
        {512, 14, 2, 64, 0, 0}, {4096, 14, 2, 64, 0, 0},
        {512, 16, 8, 256, 0, 0}, {4096, 16, 8, 256, 0, 0}, {512, 16, 8, 256, 50, 0}, {4096, 16, 8, 256, 50, 1024},
        {4096, 32, 8, 128, 0, 1024}, {4096, 32, 8, 128, 50, 0},
        /* 14-17: llama-7b's MHA at 128, 256, 384 and 1024 tokens: the critical block walks 1, 2, 3 (and at
         * 512 tokens 4) key tiles, so the times against n_tok split a short prompt's time into a fixed part
         * and a part per key tile (1024: two waves) */
        {128, 32, 32, 128, 0, 0}, {256, 32, 32, 128, 0, 0}, {384, 32, 32, 128, 0, 0}, {1024, 32, 32, 128, 0, 0},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (shapes[i].n_tok <= max_tok && (!only || listed(only, i))) rc |= run_case(ctx, backend, &shapes[i], steps);
    kiln_ctx_free(ctx);
    return rc;
}
