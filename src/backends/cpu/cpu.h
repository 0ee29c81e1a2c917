/* The CPU backend's kernel layer: ISA detection and dispatch, a persistent thread pool, fused
 * matmul regions (rms_norm prologue -> sibling matmuls -> residual/swiglu epilogue), attention,
 * row kernels and roofline calibration. The plan executor calls these; they know nothing of
 * graphs, regions or plans. Thread safety: one pool serves one caller at a time (the backend's
 * launch holds a lock for that). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

/* ---------------------------------------------------------------- ISA */

enum kiln_cpu_isa {
    KILN_CPU_ISA_SCALAR = 0, /* portable C, no vector intrinsics */
    KILN_CPU_ISA_AVX2,       /* AVX2 + FMA + F16C */
    KILN_CPU_ISA_AVX512,     /* AVX-512 F/BW/VL (+ VNNI used when present) */
    KILN_CPU_ISA_COUNT
};

/* The best ISA of this CPU (cpuid + OS xsave state, once per process). The environment variable
 * KILN_CPU_ISA=scalar|avx2|avx512 lowers it (never raises it above what the CPU has); "best" or
 * unset keeps it; any other value keeps it too and prints a warning naming the accepted values
 * on stderr (once per process). */
enum kiln_cpu_isa kiln_cpu_isa_detect(void);
/* The best ISA the CPU has, ignoring the environment. */
enum kiln_cpu_isa kiln_cpu_isa_max(void);
/* "scalar", "avx2", "avx512"; "?" out of range. */
const char *kiln_cpu_isa_name(enum kiln_cpu_isa isa);
/* true when the CPU has AVX-512 VNNI (vpdpbusd): the AVX-512 table then takes the VNNI kernels
 * for q8_0, q4_K and q6_K. */
bool kiln_cpu_has_vnni(void);

/* ---------------------------------------------------------------- thread pool */

/* A persistent pool: n_threads - 1 workers plus the calling thread (tid 0). Workers spin ~100 us
 * after a job, then sleep on a condition variable. */
typedef struct kiln_cpu_pool kiln_cpu_pool;

/* n_threads <= 0: one per online core. */
kiln_status kiln_cpu_pool_new(int n_threads, kiln_cpu_pool **out);
/* Joins the workers; NULL does nothing. */
void kiln_cpu_pool_free(kiln_cpu_pool *pool);
int  kiln_cpu_pool_threads(const kiln_cpu_pool *pool);
/* Runs fn(arg, tid, nth) on every thread (tid 0 is the caller) and returns when all are done.
 * Must not be called from inside fn. */
void kiln_cpu_pool_run(kiln_cpu_pool *pool, void (*fn)(void *arg, int tid, int nth), void *arg);
/* Scratch memory owned by the pool, 64-byte aligned, valid until the next call (grows; never
 * shrinks). NULL on OOM. Kernels use it for prepared activations and per-thread partials. */
void *kiln_cpu_pool_scratch(kiln_cpu_pool *pool, size_t bytes);

/* ---------------------------------------------------------------- fused matmul */

/* One output of a matmul region. */
typedef struct kiln_cpu_mm_out {
    const void     *w;        /* weight [n, k] in wt, rows contiguous (GGUF block bytes for q-types) */
    kiln_dtype      wt;       /* f32, f16, bf16, q8_0, q4_k, q5_k, q6_k */
    int64_t         n;        /* rows of w = columns of y */
    float          *y;        /* [m, n] result, row stride n (must not alias x or residual) */
    const float    *residual; /* optional [m, n]: y = x̂·wᵀ + residual (NULL: none) */
    const float    *bias;     /* optional [n], added to every row before the residual (NULL: none;
                                 not taken with swiglu) */
} kiln_cpu_mm_out;

/* One fused region: optional rms_norm of x (computed once, shared by all outputs), then
 * y_j = x̂ · W_jᵀ for each output, then the epilogue. Accumulation is f32. Quantized weights
 * (q8_0, q4_k, q5_k, q6_k) take integer dot products against x̂ quantized per block to int8 (per 32
 * values for q8_0, per 256 for the k-quants, with block sums), as ggml does. */
typedef struct kiln_cpu_mm {
    const float    *x;        /* activations [m, k] f32, row stride k */
    int64_t         m;        /* rows of x, 1..(any); >= 9 takes the tiled GEMM path */
    int64_t         k;        /* inner dim; a multiple of the block of every quantized weight */
    bool            norm;     /* rms_norm prologue: x̂ = x / sqrt(mean(x²) + eps) * norm_w */
    const float    *norm_w;   /* [k] norm weight; NULL = ones */
    float           eps;      /* rms_norm epsilon */
    kiln_cpu_mm_out out[4];   /* outputs sharing x̂ (Q/K/V, gate/up) */
    int             n_out;    /* 1..4 */
    bool            swiglu;   /* epilogue: out[0].y = silu(x̂·W0ᵀ) * (x̂·W1ᵀ) (+ out[0].residual);
                                 needs n_out == 2, equal n; out[1].y is not written (may be NULL) */
} kiln_cpu_mm;

/* Runs one region on the pool. Returns KILN_ERR_INVALID_ARG / _DTYPE / _SHAPE for bad
 * descriptions (nothing written), KILN_ERR_NOMEM when scratch cannot grow. */
kiln_status kiln_cpu_matmul(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const kiln_cpu_mm *mm);
/* n independent regions (each its own x, rows and outputs; none may write what another reads) in
 * one pass of the pool, their column units interleaved: the routed experts of a moe_matmul, where
 * a pass per expert would cost a wake-up of every thread each. Same checks and results as n calls
 * of kiln_cpu_matmul; nothing is written when one region is invalid. */
kiln_status kiln_cpu_matmul_batch(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const kiln_cpu_mm *mm, int n);

/* ---------------------------------------------------------------- attention */

/* How scores are formed and masked (kiln_attention_ext in kiln.h). */
typedef struct kiln_cpu_attn_mask {
    float   scale;   /* score scale; 0 = 1/sqrt(hd) */
    float   softcap; /* scores become softcap * tanh(s / softcap); 0: none */
    int64_t window;  /* the query at p sees keys p - window + 1 .. p; 0: keys 0 .. p */
} kiln_cpu_attn_mask;

/* Causal GQA attention, semantics of kiln_attention_ext (kiln.h): q [n_tok, n_head, hd] f32; k, v
 * caches [n_kv_head, max_ctx, hd] in kv_t (f32 or f16); the n_tok queries sit at positions
 * n_kv - n_tok .. n_kv - 1; y [n_tok, n_head, hd] f32. Decode (few
 * queries) splits the KV positions over threads and merges the partial softmaxes; GQA heads of
 * one KV head share each K/V read. */
kiln_status kiln_cpu_attention(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const float *q, int64_t n_tok,
                               int64_t n_head, int64_t hd, const void *k, const void *v, kiln_dtype kv_t,
                               int64_t n_kv_head, int64_t max_ctx, int64_t n_kv, const kiln_cpu_attn_mask *mk, float *y);

/* Paged attention over a ragged batch (kiln_paged_attention in kiln.h): q [n_tok, n_head, hd] f32,
 * k, v pools [n_kv_head, m->n_slots, hd] in kv_t (f32 or f16), the step's metadata m (checked
 * before: kiln_paged_check). y [n_tok, n_head, hd] f32. */
struct kiln_paged_meta;
kiln_status kiln_cpu_paged_attention(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const float *q, int64_t n_head,
                                     int64_t hd, const void *k, const void *v, kiln_dtype kv_t, int64_t n_kv_head,
                                     const struct kiln_paged_meta *m, const kiln_cpu_attn_mask *mk, float *y);

/* ---------------------------------------------------------------- row kernels (single thread) */

/* y[r] = x[r] / sqrt(mean(x[r]²) + eps) * w (w NULL = ones), rows of d. y may equal x. */
void kiln_cpu_rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t d, float *y);
/* Softmax over each row of d. y may equal x. */
void kiln_cpu_softmax(const float *x, int64_t rows, int64_t d, float *y);
/* Rotary embedding in place on the first rot (even, <= hd) dims of each head of x [n_tok, n_head, hd]
 * (the others stay); mode 0 = normal (pairs 2i, 2i+1), 1 = neox (pairs i, i + rot/2); angle of pair
 * i = pos[t] * theta^(-2i/rot). */
void kiln_cpu_rope(float *x, const int32_t *pos, int64_t n_tok, int64_t n_head, int64_t hd, int64_t rot, int mode,
                   float theta, const float *mult); /* mult: [rot/2] per-pair frequency multipliers or NULL */

/* ---------------------------------------------------------------- calibration */

/* Streaming read bandwidth in GB/s over a buffer much larger than the LLC, all pool threads (the
 * best of a few passes). 0 on OOM. */
double kiln_cpu_measure_read_bw(kiln_cpu_pool *pool);
/* f32 FMA peak in GFLOP/s (2 flops per lane per FMA), all pool threads, register-only loop. */
double kiln_cpu_measure_fma_peak(kiln_cpu_pool *pool, enum kiln_cpu_isa isa);
