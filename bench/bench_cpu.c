/* Benchmark of the CPU backend's kernels, JSON on stdout: measures the read bandwidth and the FMA
 * peak in the same run, then decode GEMV per weight dtype with cold weights (copies cycled past
 * the LLC), decode attention over a cold 1024-long cache, and prefill GEMM (qwen2-0.5b sizes),
 * each with the fraction of its roof. Never part of the test command; asserts nothing.
 * Usage: bench_cpu [n_threads] (env KILN_CPU_ISA forces an ISA). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "backends/cpu/cpu.h"

#define COLD_BYTES ((size_t)192 << 20) /* weights cycled per GEMV case: 6x a 32 MiB L3 */

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

static void fill_rand(float *p, size_t n, unsigned *s)
{
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        p[i] = (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

/* Copies of a random [n, k] weight in dtype t: cold, enough to exceed COLD_BYTES (at least 2). */
static char *make_copies(kiln_dtype t, int64_t n, int64_t k, bool cold, int *copies, size_t *bytes)
{
    *bytes = kiln_row_bytes(t, k) * (size_t)n;
    if (*bytes == 0) /* k not a multiple of t's block */
        return NULL;
    *copies = cold ? (int)(COLD_BYTES / *bytes) + 1 : 1;
    if (cold && *copies < 2)
        *copies = 2;
    char *w = malloc(*bytes * (size_t)*copies);
    float *f = malloc(sizeof(float) * (size_t)(n * k));
    if (!w || !f) {
        free(w), free(f);
        return NULL;
    }
    unsigned s = 12345;
    fill_rand(f, (size_t)(n * k), &s);
    kiln_quantize(t, f, w, n * k);
    for (int c = 1; c < *copies; c++)
        memcpy(w + (size_t)c * *bytes, w, *bytes);
    free(f);
    return w;
}

static void bench_gemv(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, double bw, int64_t n, int64_t k, kiln_dtype t,
                       bool *first)
{
    int copies;
    size_t bytes;
    bool hot = getenv("BENCH_HOT") != NULL; /* weights stay in cache: the kernel's compute rate */
    char *w = make_copies(t, n, k, !hot, &copies, &bytes);
    float *x = malloc(sizeof(float) * (size_t)k), *y = malloc(sizeof(float) * (size_t)n);
    if (!w || !x || !y) {
        free(w), free(x), free(y);
        return;
    }
    unsigned s = 7;
    fill_rand(x, (size_t)k, &s);
    int iters = copies * 4 > 24 ? copies * 4 : 24;
    double *ts = malloc(sizeof(double) * (size_t)iters);
    double bwl = kiln_cpu_measure_read_bw(pool); /* the machine is shared: the roof right now */
    for (int it = -copies; it < iters; it++) {
        kiln_cpu_mm mm = {.x = x, .m = 1, .k = k, .n_out = 1};
        mm.out[0] = (kiln_cpu_mm_out){.w = w + (size_t)((it + copies) % copies) * bytes, .wt = t, .n = n, .y = y};
        double t0 = bench_now_s();
        kiln_cpu_matmul(pool, isa, &mm);
        if (it >= 0)
            ts[it] = bench_now_s() - t0;
    }
    double med = median(ts, iters), gbs = (double)bytes / med * 1e-9;
    printf("%s    {\"kind\": \"gemv\", \"dtype\": \"%s\", \"isa\": \"%s\", \"n\": %ld, \"k\": %ld, \"ms\": %.4f, "
           "\"gb_s\": %.2f, \"frac_bw\": %.3f, \"bw_local\": %.2f, \"frac_bw_local\": %.3f}",
           *first ? "" : ",\n", kiln_dtype_name(t), kiln_cpu_isa_name(isa), (long)n, (long)k, med * 1e3, gbs, gbs / bw,
           bwl, gbs / bwl);
    *first = false;
    free(ts), free(w), free(x), free(y);
}

static void bench_attn(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, double bw, kiln_dtype kt, bool *first)
{
    const int64_t n_head = 32, n_kv_head = 32, hd = 128, ctx = 1024, n_kv = 1024;
    size_t es = kt == KILN_DTYPE_F16 ? 2 : 4, cache = (size_t)(n_kv_head * ctx * hd) * es;
    int copies = getenv("BENCH_HOT") ? 1 : (int)(COLD_BYTES / (2 * cache)) + 1;
    char *kv = malloc(2 * cache * (size_t)copies);
    float *f = malloc(sizeof(float) * (size_t)(n_kv_head * ctx * hd)), *q = malloc(sizeof(float) * (size_t)(n_head * hd));
    float *y = malloc(sizeof(float) * (size_t)(n_head * hd));
    if (!kv || !f || !q || !y) {
        free(kv), free(f), free(q), free(y);
        return;
    }
    unsigned s = 99;
    fill_rand(f, (size_t)(n_kv_head * ctx * hd), &s);
    fill_rand(q, (size_t)(n_head * hd), &s);
    kiln_quantize(kt, f, kv, n_kv_head * ctx * hd);
    for (int c = 1; c < 2 * copies; c++)
        memcpy(kv + (size_t)c * cache, kv, cache);
    int iters = copies * 4;
    double *ts = malloc(sizeof(double) * (size_t)iters);
    double bwl = kiln_cpu_measure_read_bw(pool);
    for (int it = -copies; it < iters; it++) {
        const char *base = kv + (size_t)((it + copies) % copies) * 2 * cache;
        double t0 = bench_now_s();
        kiln_cpu_attention(pool, isa, q, 1, n_head, hd, base, base + cache, kt, n_kv_head, ctx, n_kv,
                           &(kiln_cpu_attn_mask){0}, y);
        if (it >= 0)
            ts[it] = bench_now_s() - t0;
    }
    double med = median(ts, iters), gbs = 2.0 * (double)cache / med * 1e-9;
    printf("%s    {\"kind\": \"attention_decode\", \"cache\": \"%s\", \"n_head\": %ld, \"hd\": %ld, \"n_kv\": %ld, "
           "\"ms\": %.4f, \"gb_s\": %.2f, \"frac_bw\": %.3f, \"bw_local\": %.2f, \"frac_bw_local\": %.3f}",
           *first ? "" : ",\n", kiln_dtype_name(kt), (long)n_head, (long)hd, (long)n_kv, med * 1e3, gbs, gbs / bw, bwl,
           gbs / bwl);
    *first = false;
    free(ts), free(kv), free(f), free(q), free(y);
}

static void bench_gemm(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, double peak, int64_t m, int64_t n, int64_t k,
                       kiln_dtype t, bool *first)
{
    int copies;
    size_t bytes;
    char *w = make_copies(t, n, k, false, &copies, &bytes);
    float *x = malloc(sizeof(float) * (size_t)(m * k)), *y = malloc(sizeof(float) * (size_t)(m * n));
    if (!w || !x || !y) {
        free(w), free(x), free(y);
        return;
    }
    unsigned s = 5;
    fill_rand(x, (size_t)(m * k), &s);
    const int iters = 15;
    double ts[15];
    for (int it = -2; it < iters; it++) {
        kiln_cpu_mm mm = {.x = x, .m = m, .k = k, .n_out = 1};
        mm.out[0] = (kiln_cpu_mm_out){.w = w, .wt = t, .n = n, .y = y};
        double t0 = bench_now_s();
        kiln_cpu_matmul(pool, isa, &mm);
        if (it >= 0)
            ts[it] = bench_now_s() - t0;
    }
    double med = median(ts, iters), gf = 2.0 * (double)(m * n * k) / med * 1e-9;
    printf("%s    {\"kind\": \"gemm\", \"dtype\": \"%s\", \"m\": %ld, \"n\": %ld, \"k\": %ld, \"ms\": %.4f, "
           "\"gflop_s\": %.2f, \"frac_peak\": %.3f}",
           *first ? "" : ",\n", kiln_dtype_name(t), (long)m, (long)n, (long)k, med * 1e3, gf, gf / peak);
    *first = false;
    free(w), free(x), free(y);
}

int main(int argc, char **argv)
{
    int nth = argc > 1 ? atoi(argv[1]) : 0;
    kiln_cpu_pool *pool;
    if (kiln_cpu_pool_new(nth, &pool) != KILN_OK) {
        fprintf(stderr, "bench_cpu: cannot start the pool\n");
        return 1;
    }
    enum kiln_cpu_isa isa = kiln_cpu_isa_detect();
    double bw = kiln_cpu_measure_read_bw(pool), peak = kiln_cpu_measure_fma_peak(pool, isa);
    printf("{\n  \"isa\": \"%s\", \"threads\": %d, \"read_bw_gb_s\": %.2f, \"fma_peak_gflop_s\": %.1f,\n"
           "  \"results\": [\n",
           kiln_cpu_isa_name(isa), kiln_cpu_pool_threads(pool), bw, peak);
    bool first = true;
    static const kiln_dtype gt[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K,
                                    KILN_DTYPE_BF16, KILN_DTYPE_F32, KILN_DTYPE_Q5_K};
    const char *only = getenv("BENCH_ONLY"); /* gemv | formats | attn | gemm: one section */
    for (size_t d = 0; d < sizeof gt / sizeof *gt && (!only || !strcmp(only, "gemv")); d++) {
        if (getenv("BENCH_HOT")) {
            const char *hn = getenv("BENCH_N"), *hk = getenv("BENCH_K");
            bench_gemv(pool, isa, bw, hn ? atol(hn) : 1024, hk ? atol(hk) : 2048, gt[d], &first);
            continue;
        }
        bench_gemv(pool, isa, bw, 4096, 4096, gt[d], &first);
        bench_gemv(pool, isa, bw, 11008, 4096, gt[d], &first);
    }
    /* q8_0, q4_K and the other block formats at one shape, on the detected ISA and (BENCH_SCALAR=1)
     * on the scalar kernels too: the before/after of their SIMD kernels in one run. */
    static const kiln_dtype ft[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q4_0,   KILN_DTYPE_Q4_1,
                                    KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1, KILN_DTYPE_IQ4_NL, KILN_DTYPE_Q2_K,
                                    KILN_DTYPE_Q3_K, KILN_DTYPE_IQ4_XS};
    for (size_t d = 0; d < sizeof ft / sizeof *ft && (!only || !strcmp(only, "formats")); d++) {
        bench_gemv(pool, isa, bw, 4096, 4096, ft[d], &first);
        if (getenv("BENCH_SCALAR")) bench_gemv(pool, KILN_CPU_ISA_SCALAR, bw, 4096, 4096, ft[d], &first);
    }
    for (int c = 0; c < 2 && (!only || !strcmp(only, "attn")); c++)
        bench_attn(pool, isa, bw, c ? KILN_DTYPE_F32 : KILN_DTYPE_F16, &first);
    /* K = 896 is not a multiple of 256: the k-quants are measured at K = 1024 instead, and all
     * at the down projection's shape (K = 4864, the one qwen2-0.5b's q4_k preset quantizes). */
    static const kiln_dtype mt[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0};
    for (size_t d = 0; d < sizeof mt / sizeof *mt && (!only || !strcmp(only, "gemm")); d++) {
        bench_gemm(pool, isa, peak, 128, 896, 896, mt[d], &first);
        bench_gemm(pool, isa, peak, 128, 4864, 896, mt[d], &first);
    }
    for (int d = 0; d < 2 && (!only || !strcmp(only, "gemm")); d++)
        bench_gemm(pool, isa, peak, 128, 4864, 1024, d ? KILN_DTYPE_Q6_K : KILN_DTYPE_Q4_K, &first);
    static const kiln_dtype dt[] = {KILN_DTYPE_F32, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
    for (size_t d = 0; d < sizeof dt / sizeof *dt && (!only || !strcmp(only, "gemm")); d++)
        bench_gemm(pool, isa, peak, 128, 896, 4864, dt[d], &first);
    double bw2 = kiln_cpu_measure_read_bw(pool);
    printf("\n  ],\n  \"read_bw_gb_s_after\": %.2f\n}\n", bw2);
    kiln_cpu_pool_free(pool);
    return 0;
}
