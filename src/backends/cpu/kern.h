/* Internal to src/backends/cpu: the per-ISA kernel table the drivers (matmul.c, attn.c, calib.c)
 * dispatch through, and the prepared-activation formats the quantized dot products read.
 * Each ISA file (kern_scalar.c, *_avx2.c, *_avx512.c) fills one table; entries it leaves NULL
 * fall back to the next lower ISA's. Must not be included outside src/backends/cpu. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "backends/cpu/cpu.h"
#include "graph/dtype.h"

/* Activation formats a weight dtype's kernel reads. */
enum kiln_cpu_act {
    KILN_CPU_ACT_F32 = 0, /* f32 rows (f32, f16, bf16 weights) */
    KILN_CPU_ACT_Q8_0,    /* kiln_cpu_q8a blocks of 32 (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl weights) */
    KILN_CPU_ACT_Q8_K,    /* kiln_block_q8_k blocks of 256 (q4_k, q5_k, q6_k, q2_k, q3_k, iq4_xs weights) */
    KILN_CPU_ACT_COUNT
};

/* One int8 activation block for q8_0 dot products: x ≈ d * qs. */
typedef struct kiln_cpu_q8a {
    float  d;              /* scale = amax / 127, rounded to f16 (as ggml's block_q8_0) when a normal f16 */
    int8_t qs[KILN_QK8_0]; /* round(x / d), in [-127, 127] */
    float  s;              /* (f32 d) * sum(qs), rounded to f16 as ggml's block_q8_1 s: q4_1/q5_1's min term */
} kiln_cpu_q8a;

static inline enum kiln_cpu_act kiln_cpu_act_of(kiln_dtype wt)
{
    switch (wt) {
    case KILN_DTYPE_Q8_0:
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q4_1:
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1:
    case KILN_DTYPE_IQ4_NL: return KILN_CPU_ACT_Q8_0;
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K:
    case KILN_DTYPE_Q6_K:
    case KILN_DTYPE_Q2_K:
    case KILN_DTYPE_Q3_K:
    case KILN_DTYPE_IQ4_XS: return KILN_CPU_ACT_Q8_K;
    default: return KILN_CPU_ACT_F32;
    }
}

/* y[i * ldy + j] = dot(weight row j, activation row i) for j < nw, i < m. Weight rows are ws
 * bytes apart; activation rows xs bytes apart, in the format kiln_cpu_act_of(wt) names. k is the
 * row length in values (a multiple of the weight's block). */
typedef void (*kiln_cpu_mm_fn)(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs,
                               int64_t m, float *y, int64_t ldy);
/* s[j] = dot(q, key j) for j < nk; keys hd values each, ks bytes apart (f32 or f16 by table slot). */
typedef void (*kiln_cpu_kv_dot_fn)(int64_t hd, const float *q, const void *k, size_t ks, int64_t nk, float *s);
/* acc[:] = acc[:] * c + sum_j p[j] * value j[:] for j < nk; values hd each, vs bytes apart. */
typedef void (*kiln_cpu_kv_axpy_fn)(int64_t hd, float c, const float *p, const void *v, size_t vs, int64_t nk,
                                    float *acc);

typedef struct kiln_cpu_kern {
    kiln_cpu_mm_fn      mm[KILN_DTYPE_COUNT]; /* per weight dtype; NULL = lower ISA's */
    kiln_cpu_kv_dot_fn  kv_dot[2];            /* [0] f32 cache, [1] f16 cache */
    kiln_cpu_kv_axpy_fn kv_axpy[2];           /* [0] f32 cache, [1] f16 cache */
    float             (*exp_sum)(float *s, int64_t n, float m); /* s[j] = exp(s[j] - m); returns the sum */
    double            (*fma_loop)(int64_t iters); /* register-only FMA loop; returns flops done */
    uint64_t          (*read_sum)(const void *p, size_t bytes); /* streams bytes (a multiple of 128) */
    /* y[j] = silu(g[j]) * u[j] (+ r[j] unless r is NULL) for j < n: the swiglu epilogue of the
     * matmul driver; NULL = its scalar loop. */
    void              (*swiglu)(int64_t n, const float *g, const float *u, const float *r, float *y);
} kiln_cpu_kern;

extern const kiln_cpu_kern kiln_cpu_kern_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const kiln_cpu_kern kiln_cpu_kern_avx2;
extern const kiln_cpu_kern kiln_cpu_kern_avx512;
/* AVX-512 VNNI kernels (quant_avx512vnni.c), laid over kiln_cpu_kern_avx512 only on CPUs with VNNI. */
extern const kiln_cpu_kern kiln_cpu_kern_avx512vnni;
/* Quantized-weight kernels of quant_avx2.c (shared by the AVX2 and AVX-512 tables). */
void kiln_cpu_mm_q8_0_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                           float *y, int64_t ldy);
void kiln_cpu_mm_q4_k_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                           float *y, int64_t ldy);
void kiln_cpu_mm_q5_k_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                           float *y, int64_t ldy);
void kiln_cpu_mm_q6_k_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                           float *y, int64_t ldy);
/* The other block formats' kernels (quant_more_avx2.c; the AVX-512 table falls back to them). */
#define KILN_CPU_DECL_MM(NAME)                                                                          \
    void NAME(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m, float *y, \
              int64_t ldy);
KILN_CPU_DECL_MM(kiln_cpu_mm_q4_0_avx2)
KILN_CPU_DECL_MM(kiln_cpu_mm_q4_1_avx2)
KILN_CPU_DECL_MM(kiln_cpu_mm_q5_0_avx2)
KILN_CPU_DECL_MM(kiln_cpu_mm_q5_1_avx2)
KILN_CPU_DECL_MM(kiln_cpu_mm_iq4_nl_avx2)
KILN_CPU_DECL_MM(kiln_cpu_mm_q2_k_avx2)
KILN_CPU_DECL_MM(kiln_cpu_mm_q3_k_avx2)
KILN_CPU_DECL_MM(kiln_cpu_mm_iq4_xs_avx2)
#undef KILN_CPU_DECL_MM
/* Packed-panel GEMMs of gemm_avx2.c for many activation rows (the mm entries' m > 8 branch). */
void kiln_cpu_gemm_f32_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                            float *y, int64_t ldy);
void kiln_cpu_gemm_f16_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                            float *y, int64_t ldy);
void kiln_cpu_gemm_bf16_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                             float *y, int64_t ldy);
void kiln_cpu_gemm_q8_0_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                             float *y, int64_t ldy);
void kiln_cpu_gemm_q4_k_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                             float *y, int64_t ldy);
void kiln_cpu_gemm_q6_k_avx2(int64_t k, const void *w, size_t ws, int64_t nw, const void *xa, size_t xs, int64_t m,
                             float *y, int64_t ldy);
/* The swiglu epilogue of gemm_avx2.c (kiln_cpu_kern.swiglu). */
void kiln_cpu_swiglu_avx2(int64_t n, const float *g, const float *u, const float *r, float *y);
#endif

/* The complete table for isa (clamped to what the CPU has), lower-ISA entries filled in. */
const kiln_cpu_kern *kiln_cpu_kern_get(enum kiln_cpu_isa isa);

/* Quantizes one activation row of k values (k a multiple of the block) into format a. */
void kiln_cpu_quant_row(enum kiln_cpu_act a, const float *x, int64_t k, void *dst);
/* Bytes of one prepared activation row of k values in format a. */
size_t kiln_cpu_act_row_bytes(enum kiln_cpu_act a, int64_t k);
