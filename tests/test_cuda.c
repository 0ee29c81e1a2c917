/* The CUDA backend on a real device (skipped, saying why, where cuda is absent): printed PTX run
 * op by op against C on fresh random inputs (exact where PTX rounds exactly, ulp bounds for the
 * approximate math), device memory round trips through the pool, out of memory naming the size,
 * and a sticky fault that stops the backend while the cpu backend keeps working. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda.h"
#include "graph/dtype.h"
#include "ptx/ptx.h"
#include "sched/ctx.h"
#include "support/kirtest.h"
#include "support/testutil.h"

#define N KILN_IDX_NONE
#define BLOCK 256
#define GRID 2
#define THREADS (BLOCK * GRID)

static kiln_cuda *open_cuda(kiln_ctx **ctx)
{
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, ctx), KILN_OK);
    if (!(*ctx)->be_ok[KILN_BACKEND_CUDA]) {
        char why[300];
        snprintf(why, sizeof why, "cuda absent: %s", (*ctx)->be_detail[KILN_BACKEND_CUDA]);
        kiln_ctx_free(*ctx);
        cr_skip("%s", why);
    }
    return (*ctx)->be_state[KILN_BACKEND_CUDA];
}

/* ------------------------------------------------------------------ one kernel, many cases */

enum {
    C_ADD, C_SUB, C_MUL, C_DIV, C_FMA, C_MIN, C_MAX, C_NEG, C_ABS, C_SQRT, C_RSQRT, C_EX2, C_LG2, C_SIN, C_COS,
    C_FLOOR, C_RINT, C_IADD, C_IMUL, C_IDIV, C_IREM, C_UDIV, C_UREM, C_ISHR, C_USHR, C_BITS, C_IMIN, C_UMAX, C_IABS,
    C_CVT_FI, C_CVT_FU, C_CVT_IF, C_H2F0, C_H2F1, C_B2F0, C_B2F1, C_F2H, C_F2B, C_BFEU, C_BFES, C_DP4A, C_SEL, C_PRED,
    C_FNE_NAN, C_RED1, C_RED8, C_RED32, C_RED64, C_RED256, C_SHARED, C_LOOP, C_IF, C_LD4, C_PARAM, C_BID, C_ST16,
    C_COUNT
};
enum { TOL_EXACT, TOL_REL, TOL_ABS };

typedef struct vals {
    uint32_t fa, fb, ia, ib, ua, ub, tid, bid, gi; /* kir values */
    uint32_t in, out, sh;                          /* slots / shared array */
} vals;

static uint32_t opk(kiln_kir *k, enum kiln_kop o, enum kiln_kt t, uint32_t a, uint32_t b, uint32_t c, int32_t imm)
{
    return kiln_kir_op(k, o, t, a, b, c, imm);
}
static uint32_t bits(kiln_kir *k, uint32_t v) { return opk(k, KILN_KOP_BITCAST, KILN_KT_U32, v, N, N, 0); }
static uint32_t f2(kiln_kir *k, enum kiln_kop o, uint32_t a, uint32_t b) { return bits(k, kiln_k2(k, o, a, b)); }
static uint32_t f1(kiln_kir *k, enum kiln_kop o, uint32_t a) { return bits(k, kiln_k1(k, o, a)); }

/* U32 result of case c for this thread. */
static uint32_t case_value(kiln_kir *k, int c, const vals *v)
{
    switch (c) {
    case C_ADD: return f2(k, KILN_KOP_ADD, v->fa, v->fb);
    case C_SUB: return f2(k, KILN_KOP_SUB, v->fa, v->fb);
    case C_MUL: return f2(k, KILN_KOP_MUL, v->fa, v->fb);
    case C_DIV: return f2(k, KILN_KOP_DIV, v->fa, v->fb);
    case C_FMA: return bits(k, opk(k, KILN_KOP_FMA, KILN_KT_F32, v->fa, v->fb, v->fa, 0));
    case C_MIN: return f2(k, KILN_KOP_MIN, v->fa, v->fb);
    case C_MAX: return f2(k, KILN_KOP_MAX, v->fa, v->fb);
    case C_NEG: return f1(k, KILN_KOP_NEG, v->fa);
    case C_ABS: return f1(k, KILN_KOP_ABS, v->fa);
    case C_SQRT: return f1(k, KILN_KOP_SQRT, v->fb);
    case C_RSQRT: return f1(k, KILN_KOP_RSQRT, v->fb);
    case C_EX2: return f1(k, KILN_KOP_EX2, v->fa);
    case C_LG2: return f1(k, KILN_KOP_LG2, v->fb);
    case C_SIN: return f1(k, KILN_KOP_SIN, v->fa);
    case C_COS: return f1(k, KILN_KOP_COS, v->fa);
    case C_FLOOR: return f1(k, KILN_KOP_FLOOR, kiln_k2(k, KILN_KOP_MUL, v->fa, kiln_kf(k, 7.5f)));
    case C_RINT: return f1(k, KILN_KOP_RINT, kiln_k2(k, KILN_KOP_MUL, v->fa, kiln_kf(k, 4.0f)));
    case C_IADD: return bits(k, kiln_k2(k, KILN_KOP_ADD, v->ia, v->ib));
    case C_IMUL: return bits(k, kiln_k2(k, KILN_KOP_MUL, v->ia, v->ib));
    case C_IDIV: return bits(k, kiln_k2(k, KILN_KOP_DIV, v->ia, v->ib));
    case C_IREM: return bits(k, kiln_k2(k, KILN_KOP_REM, v->ia, v->ib));
    case C_UDIV: return kiln_k2(k, KILN_KOP_DIV, v->ua, kiln_k2(k, KILN_KOP_OR, v->ub, kiln_ku(k, 1)));
    case C_UREM: return kiln_k2(k, KILN_KOP_REM, v->ua, kiln_k2(k, KILN_KOP_OR, v->ub, kiln_ku(k, 1)));
    case C_ISHR: return bits(k, kiln_k2(k, KILN_KOP_SHR, v->ia, kiln_k2(k, KILN_KOP_AND, v->ib, kiln_ki(k, 31))));
    case C_USHR: return kiln_k2(k, KILN_KOP_SHR, v->ua, kiln_k2(k, KILN_KOP_AND, v->ub, kiln_ku(k, 31)));
    case C_BITS: {
        uint32_t s = kiln_k2(k, KILN_KOP_SHL, v->ua, kiln_k2(k, KILN_KOP_AND, v->ub, kiln_ku(k, 31)));
        return kiln_k2(k, KILN_KOP_XOR, kiln_k2(k, KILN_KOP_OR, s, kiln_k2(k, KILN_KOP_AND, v->ua, v->ub)), v->ub);
    }
    case C_IMIN: return bits(k, kiln_k2(k, KILN_KOP_MIN, v->ia, v->ib));
    case C_UMAX: return kiln_k2(k, KILN_KOP_MAX, v->ua, v->ub);
    case C_IABS: return bits(k, kiln_k1(k, KILN_KOP_NEG, kiln_k1(k, KILN_KOP_ABS, v->ib)));
    case C_CVT_FI: return bits(k, opk(k, KILN_KOP_CVT, KILN_KT_F32, v->ia, N, N, 0));
    case C_CVT_FU: return bits(k, opk(k, KILN_KOP_CVT, KILN_KT_F32, v->ua, N, N, 0));
    case C_CVT_IF: return bits(k, opk(k, KILN_KOP_CVT, KILN_KT_I32, kiln_k2(k, KILN_KOP_MUL, v->fa, kiln_kf(k, 1000.0f)), N, N, 0));
    case C_H2F0: case C_H2F1: return bits(k, opk(k, KILN_KOP_H2F, KILN_KT_F32, v->ua, N, N, c == C_H2F1));
    case C_B2F0: case C_B2F1: return bits(k, opk(k, KILN_KOP_B2F, KILN_KT_F32, v->ua, N, N, c == C_B2F1));
    case C_F2H: return opk(k, KILN_KOP_F2H, KILN_KT_U32, kiln_k2(k, KILN_KOP_MUL, v->fa, kiln_kf(k, 3000.0f)), N, N, 0);
    case C_F2B: return opk(k, KILN_KOP_F2B, KILN_KT_U32, v->fa, N, N, 0);
    case C_BFEU: return opk(k, KILN_KOP_BFE, KILN_KT_U32, v->ua, N, N, 5 | (11 << 8));
    case C_BFES: return bits(k, opk(k, KILN_KOP_BFE, KILN_KT_I32, v->ua, N, N, 20 | (12 << 8)));
    case C_DP4A: return bits(k, opk(k, KILN_KOP_DP4A, KILN_KT_I32, v->ua, v->ub, v->ib, 0));
    case C_SEL: return opk(k, KILN_KOP_SELECT, KILN_KT_U32, kiln_k2(k, KILN_KOP_LT, v->fa, kiln_kf(k, 0.0f)), v->ua, v->ub, 0);
    case C_PRED: { /* (ia <= ib) + 2 (ua == ub | ia != 0) + 4 !(fa < fb) */
        uint32_t p0 = kiln_k2(k, KILN_KOP_LE, v->ia, v->ib);
        uint32_t p1 = kiln_k2(k, KILN_KOP_POR, kiln_k2(k, KILN_KOP_EQ, v->ua, v->ub), kiln_k2(k, KILN_KOP_NE, v->ia, kiln_ki(k, 0)));
        uint32_t p2 = kiln_k1(k, KILN_KOP_PNOT, kiln_k2(k, KILN_KOP_LT, v->fa, v->fb));
        uint32_t one = kiln_ku(k, 1), zero = kiln_ku(k, 0);
        uint32_t r = opk(k, KILN_KOP_SELECT, KILN_KT_U32, kiln_k2(k, KILN_KOP_PAND, p0, p0), one, zero, 0);
        r = kiln_k2(k, KILN_KOP_ADD, r, opk(k, KILN_KOP_SELECT, KILN_KT_U32, p1, kiln_ku(k, 2), zero, 0));
        return kiln_k2(k, KILN_KOP_ADD, r, opk(k, KILN_KOP_SELECT, KILN_KT_U32, p2, kiln_ku(k, 4), zero, 0));
    }
    case C_FNE_NAN: { /* NaN != x is true, NaN < x and NaN == NaN false */
        uint32_t nan = opk(k, KILN_KOP_BITCAST, KILN_KT_F32, kiln_ku(k, 0x7fc00000u), N, N, 0);
        uint32_t r = opk(k, KILN_KOP_SELECT, KILN_KT_U32, kiln_k2(k, KILN_KOP_NE, nan, v->fa), kiln_ku(k, 1), kiln_ku(k, 0), 0);
        r = kiln_k2(k, KILN_KOP_ADD, r, opk(k, KILN_KOP_SELECT, KILN_KT_U32, kiln_k2(k, KILN_KOP_LT, nan, v->fa), kiln_ku(k, 2), kiln_ku(k, 0), 0));
        return kiln_k2(k, KILN_KOP_ADD, r, opk(k, KILN_KOP_SELECT, KILN_KT_U32, kiln_k2(k, KILN_KOP_EQ, nan, nan), kiln_ku(k, 4), kiln_ku(k, 0), 0));
    }
    case C_RED1: case C_RED8: case C_RED32: case C_RED64: case C_RED256: {
        static const uint32_t grp[] = {1, 8, 32, 64, 256};
        int g = c - C_RED1;
        return bits(k, opk(k, KILN_KOP_REDUCE, KILN_KT_F32, v->fa, N, N, (int32_t)(grp[g] | (uint32_t)(g & 1) << 16)));
    }
    case C_SHARED: {
        opk(k, KILN_KOP_STS, KILN_KT_NONE, v->tid, v->ua, N, (int32_t)v->sh);
        opk(k, KILN_KOP_BARRIER, KILN_KT_NONE, N, N, N, 0);
        uint32_t r = opk(k, KILN_KOP_LDS, KILN_KT_U32, kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_ADD, v->tid, kiln_ki(k, 37)), kiln_ki(k, BLOCK - 1)), N, N, (int32_t)v->sh);
        opk(k, KILN_KOP_BARRIER, KILN_KT_NONE, N, N, N, 0);
        return r;
    }
    case C_LOOP: { /* sum of 3j for j < tid & 15 */
        uint32_t s = kiln_kvar(k, kiln_ki(k, 0)), j = kiln_kvar(k, kiln_ki(k, 0));
        opk(k, KILN_KOP_LOOP, KILN_KT_NONE, j, kiln_k2(k, KILN_KOP_AND, v->tid, kiln_ki(k, 15)), kiln_ki(k, 1), 0);
        kiln_kset(k, s, kiln_k2(k, KILN_KOP_ADD, s, kiln_k2(k, KILN_KOP_MUL, j, kiln_ki(k, 3))));
        opk(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, N, N, N, 0);
        return bits(k, s);
    }
    case C_IF: { /* fa < 0 ? ia * 2 : ia ^ 0x55, then + 1 when ib > 0 */
        uint32_t r = kiln_kvar(k, kiln_ki(k, 0));
        opk(k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(k, KILN_KOP_LT, v->fa, kiln_kf(k, 0.0f)), N, N, 0);
        kiln_kset(k, r, kiln_k2(k, KILN_KOP_MUL, v->ia, kiln_ki(k, 2)));
        opk(k, KILN_KOP_ELSE, KILN_KT_NONE, N, N, N, 0);
        kiln_kset(k, r, kiln_k2(k, KILN_KOP_XOR, v->ia, kiln_ki(k, 0x55)));
        opk(k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0);
        opk(k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(k, KILN_KOP_LT, kiln_ki(k, 0), v->ib), N, N, 0);
        kiln_kset(k, r, kiln_k2(k, KILN_KOP_ADD, r, kiln_ki(k, 1)));
        opk(k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0);
        return bits(k, r);
    }
    case C_LD4: {
        uint32_t q = opk(k, KILN_KOP_LD4, KILN_KT_V4, kiln_k2(k, KILN_KOP_MUL, v->gi, kiln_ki(k, 8)), N, N, (int32_t)v->in);
        uint32_t r = opk(k, KILN_KOP_LANE, KILN_KT_U32, q, N, N, 0);
        for (int l = 1; l < 4; l++)
            r = kiln_k2(k, KILN_KOP_ADD, r, kiln_k2(k, KILN_KOP_MUL, opk(k, KILN_KOP_LANE, KILN_KT_U32, q, N, N, l), kiln_ku(k, 2u * l + 1)));
        return r;
    }
    case C_PARAM: return bits(k, kiln_k2(k, KILN_KOP_ADD, opk(k, KILN_KOP_PARAM, KILN_KT_I32, N, N, N, 3), opk(k, KILN_KOP_PARAM, KILN_KT_I32, N, N, N, 5)));
    case C_BID: return bits(k, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, v->bid, kiln_ki(k, 1000)), v->tid));
    default: return kiln_ku(k, 0);
    }
}

/* Inputs: word 8 gi + {0..7}: fa in [-3, 3], fb in [0.25, 4], ia random, ib nonzero in [-1000, 1000],
 * ua, ub random bits, two spare words. */
static void make_inputs(uint32_t *w)
{
    for (int i = 0; i < THREADS; i++) {
        uint32_t *x = w + 8 * i;
        x[0] = kiln_f32_bits((float)tu_uniform(-3, 3));
        x[1] = kiln_f32_bits((float)tu_uniform(0.25, 4));
        x[2] = (uint32_t)tu_next();
        int32_t ib = (int32_t)tu_randint(-1000, 1000);
        x[3] = (uint32_t)(ib ? ib : 7);
        x[4] = (uint32_t)tu_next(), x[5] = (uint32_t)tu_next(), x[6] = (uint32_t)tu_next(), x[7] = (uint32_t)tu_next();
        if (i % 7 == 3) x[5] = x[4]; /* some equal pairs */
    }
}

static void build_cases(kiln_kir *k)
{
    kiln_kir_init(k, "cuda_cases", BLOCK);
    k->grid[0] = GRID;
    vals v = {.in = kiln_kir_buf(k, KILN_KBUF_NODE, 1, false), .out = kiln_kir_buf(k, KILN_KBUF_NODE, 2, true)};
    v.sh = kiln_kir_shared(k, BLOCK);
    v.tid = opk(k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0);
    v.bid = opk(k, KILN_KOP_BID, KILN_KT_I32, N, N, N, 0);
    v.gi = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, v.bid, kiln_ki(k, BLOCK)), v.tid);
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, v.gi, kiln_ki(k, 8));
    uint32_t w[6];
    for (int i = 0; i < 6; i++) w[i] = opk(k, KILN_KOP_LD, KILN_KT_U32, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, i)), N, N, (int32_t)v.in);
    v.fa = opk(k, KILN_KOP_BITCAST, KILN_KT_F32, w[0], N, N, 0);
    v.fb = opk(k, KILN_KOP_BITCAST, KILN_KT_F32, w[1], N, N, 0);
    v.ia = opk(k, KILN_KOP_BITCAST, KILN_KT_I32, w[2], N, N, 0);
    v.ib = opk(k, KILN_KOP_BITCAST, KILN_KT_I32, w[3], N, N, 0);
    v.ua = w[4], v.ub = w[5];
    for (int c = 0; c < C_COUNT; c++) {
        uint32_t at = kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, c * THREADS), v.gi);
        if (c == C_ST16) { /* the low half of the word; the high half keeps its poison */
            opk(k, KILN_KOP_ST16, KILN_KT_NONE, kiln_k2(k, KILN_KOP_MUL, at, kiln_ki(k, 2)), v.ua, N, (int32_t)v.out);
            continue;
        }
        opk(k, KILN_KOP_ST, KILN_KT_NONE, at, case_value(k, c, &v), N, (int32_t)v.out);
    }
}

/* ------------------------------------------------------------------ the C side */

static float fb32(uint32_t u) { return kiln_bits_f32(u); }
static uint32_t bf(float f) { return kiln_f32_bits(f); }

/* Reference of case c for global thread gi; kind and tol say how close the device must be. */
static uint32_t case_ref(int c, const uint32_t *in, const int32_t *params, int gi, int *kind, double *tol)
{
    const uint32_t *x = in + 8 * gi;
    float fa = fb32(x[0]), fb = fb32(x[1]);
    int32_t ia = (int32_t)x[2], ib = (int32_t)x[3];
    uint32_t ua = x[4], ub = x[5];
    int tid = gi % BLOCK, bid = gi / BLOCK;
    *kind = TOL_EXACT, *tol = 0;
    switch (c) {
    case C_ADD: return bf(fa + fb);
    case C_SUB: return bf(fa - fb);
    case C_MUL: return bf(fa * fb);
    case C_DIV: return bf(fa / fb);
    case C_FMA: return bf(fmaf(fa, fb, fa));
    case C_MIN: return bf(fminf(fa, fb));
    case C_MAX: return bf(fmaxf(fa, fb));
    case C_NEG: return bf(-fa);
    case C_ABS: return bf(fabsf(fa));
    case C_SQRT: return bf(sqrtf(fb));
    case C_RSQRT: *kind = TOL_REL, *tol = 1e-6; return bf((float)(1.0 / sqrt((double)fb)));
    case C_EX2: *kind = TOL_REL, *tol = 1e-6; return bf((float)exp2((double)fa));
    case C_LG2: *kind = TOL_ABS, *tol = 1e-6; return bf((float)log2((double)fb));
    case C_SIN: *kind = TOL_ABS, *tol = 2e-6; return bf((float)sin((double)fa));
    case C_COS: *kind = TOL_ABS, *tol = 2e-6; return bf((float)cos((double)fa));
    case C_FLOOR: return bf(floorf(fa * 7.5f));
    case C_RINT: return bf(rintf(fa * 4.0f));
    case C_IADD: return (uint32_t)ia + (uint32_t)ib;
    case C_IMUL: return (uint32_t)ia * (uint32_t)ib;
    case C_IDIV: return (uint32_t)(ia / ib);
    case C_IREM: return (uint32_t)(ia % ib);
    case C_UDIV: return ua / (ub | 1);
    case C_UREM: return ua % (ub | 1);
    case C_ISHR: return (uint32_t)(ia >> (ib & 31));
    case C_USHR: return ua >> (ub & 31);
    case C_BITS: return ((ua << (ub & 31)) | (ua & ub)) ^ ub;
    case C_IMIN: return (uint32_t)(ia < ib ? ia : ib);
    case C_UMAX: return ua > ub ? ua : ub;
    case C_IABS: return (uint32_t)-abs(ib);
    case C_CVT_FI: return bf((float)ia);
    case C_CVT_FU: return bf((float)ua);
    case C_CVT_IF: return (uint32_t)(int32_t)(fa * 1000.0f);
    case C_H2F0: return bf(kiln_f16_to_f32((uint16_t)(ua & 0xffff)));
    case C_H2F1: return bf(kiln_f16_to_f32((uint16_t)(ua >> 16)));
    case C_B2F0: return ua << 16;
    case C_B2F1: return ua & 0xffff0000u;
    case C_F2H: return kiln_f32_to_f16(fa * 3000.0f);
    case C_F2B: return kiln_f32_to_bf16(fa);
    case C_BFEU: return (ua >> 5) & 0x7ffu;
    case C_BFES: return (uint32_t)((int32_t)ua >> 20);
    case C_DP4A: {
        int32_t s = ib;
        for (int i = 0; i < 4; i++) s += (int8_t)(ua >> 8 * i) * (int8_t)(ub >> 8 * i);
        return (uint32_t)s;
    }
    case C_SEL: return fa < 0 ? ua : ub;
    case C_PRED: return (uint32_t)((ia <= ib) + 2 * (ua == ub || ia != 0) + 4 * !(fa < fb));
    case C_FNE_NAN: return 1;
    case C_RED1: case C_RED8: case C_RED32: case C_RED64: case C_RED256: {
        static const int grp[] = {1, 8, 32, 64, 256};
        int g = grp[c - C_RED1], first = gi - gi % g;
        bool max = (c - C_RED1) & 1;
        double s = 0, a = 0;
        float m = -INFINITY;
        for (int j = first; j < first + g; j++) {
            float v = fb32(in[8 * j]);
            s += v, a += fabs(v);
            m = v > m ? v : m;
        }
        if (max) return bf(m);
        *kind = TOL_ABS, *tol = 1e-6 * a + 1e-30;
        return bf((float)s);
    }
    case C_SHARED: return in[8 * (bid * BLOCK + ((tid + 37) & (BLOCK - 1))) + 4];
    case C_LOOP: {
        int s = 0;
        for (int j = 0; j < (tid & 15); j++) s += 3 * j;
        return (uint32_t)s;
    }
    case C_IF: {
        uint32_t r = fa < 0 ? (uint32_t)ia * 2u : (uint32_t)(ia ^ 0x55);
        return r + (0 < ib);
    }
    case C_LD4: return x[0] + 3u * x[1] + 5u * x[2] + 7u * x[3];
    case C_PARAM: return (uint32_t)(params[3] + params[5]);
    case C_BID: return (uint32_t)(bid * 1000 + tid);
    case C_ST16: return 0xffff0000u | (ua & 0xffffu);
    default: return 0;
    }
}

/* Float-valued cases compare NaN with NaN whatever the payload (cvt.f32.f16 makes it canonical). */
static bool is_float_case(int c) { return c <= C_RINT || c == C_CVT_FI || c == C_CVT_FU || c == C_H2F0 || c == C_H2F1 || (c >= C_RED1 && c <= C_RED256); }

static bool close_enough(int c, uint32_t got, uint32_t want, int kind, double tol)
{
    if (got == want) return true;
    if (!is_float_case(c)) return false;
    float g = fb32(got), w = fb32(want);
    if (isnan(w)) return isnan(g);
    if (kind == TOL_REL) return fabs((double)g - w) <= tol * fabs((double)w);
    if (kind == TOL_ABS) return fabs((double)g - w) <= tol;
    return false;
}

static const char *const case_names[C_COUNT] = {
    "add", "sub", "mul", "div", "fma", "min", "max", "neg", "abs", "sqrt", "rsqrt", "ex2", "lg2", "sin", "cos",
    "floor", "rint", "iadd", "imul", "idiv", "irem", "udiv", "urem", "ishr", "ushr", "bits", "imin", "umax", "iabs",
    "cvt f<-i", "cvt f<-u", "cvt i<-f", "h2f lo", "h2f hi", "b2f lo", "b2f hi", "f2h", "f2b", "bfe u", "bfe s", "dp4a",
    "select", "predicates", "nan compares", "reduce 1", "reduce max 8", "reduce 32", "reduce max 64", "reduce 256",
    "shared", "loop", "if/else", "ld4", "param", "bid", "st16"};

/* Launches fn over (params, in, out) on the backend's stream. */
static void launch3(kiln_cuda *c, CUfunction fn, CUdeviceptr p, CUdeviceptr in, CUdeviceptr out, unsigned grid)
{
    void *args[] = {&p, &in, &out};
    char err[512];
    CUresult r = c->d.launch(fn, grid, 1, 1, BLOCK, 1, 1, 0, c->stream, args, NULL);
    if (r != KILN_CU_SUCCESS) kiln_cuda_fail(c, r, "cuLaunchKernel", err, sizeof err);
    cr_assert_eq(r, KILN_CU_SUCCESS, "%s", err);
}

static CUfunction load_kir(kiln_cuda *c, const kiln_kir *k, CUmodule *mod)
{
    char err[16384], *ptx = NULL;
    cr_assert_eq(kiln_ptx_print(k, c->ptx_sm, &ptx, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(kiln_cuda_enter(c, err, sizeof err), KILN_OK, "%s", err);
    CUfunction fn = NULL;
    kiln_status s = kiln_cuda_load_ptx(c, ptx, k->name, mod, &fn, NULL, err, sizeof err);
    cr_assert_eq(s, KILN_OK, "%s\n%s", err, ptx);
    free(ptx);
    return fn;
}

static void *dev_alloc(kiln_cuda *c, size_t bytes)
{
    void *p = NULL;
    char err[512];
    cr_assert_eq(kiln_backend_cuda.alloc(c, bytes, &p, err, sizeof err), KILN_OK, "%s", err);
    return p;
}

static void up(kiln_cuda *c, void *dst, const void *src, size_t n)
{
    char err[512];
    cr_assert_eq(kiln_backend_cuda.upload(c, dst, src, n, err, sizeof err), KILN_OK, "%s", err);
}

static void down_sync(kiln_cuda *c, void *dst, const void *src, size_t n)
{
    char err[512];
    cr_assert_eq(kiln_backend_cuda.download(c, dst, src, n, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(kiln_backend_cuda.sync(c, err, sizeof err), KILN_OK, "%s", err);
}

Test(cuda, printed_ops_match_c)
{
    kiln_ctx *ctx;
    kiln_cuda *c = open_cuda(&ctx);
    kiln_kir k;
    build_cases(&k);
    CUmodule mod;
    CUfunction fn = load_kir(c, &k, &mod);
    uint32_t *in = malloc(THREADS * 8 * 4), *out = malloc((size_t)C_COUNT * THREADS * 4);
    int32_t params[16];
    for (int i = 0; i < 16; i++) params[i] = (int32_t)tu_randint(-100000, 100000);
    make_inputs(in);
    for (int i = 0; i < THREADS; i++)
        if (in[8 * i + 2] == 0x80000000u) in[8 * i + 2] = 1; /* no INT_MIN / -1 */
    void *d_in = dev_alloc(c, THREADS * 8 * 4), *d_out = dev_alloc(c, (size_t)C_COUNT * THREADS * 4), *d_p = dev_alloc(c, sizeof params);
    memset(out, 0xff, (size_t)C_COUNT * THREADS * 4);
    up(c, d_in, in, THREADS * 8 * 4);
    up(c, d_out, out, (size_t)C_COUNT * THREADS * 4);
    up(c, d_p, params, sizeof params);
    launch3(c, fn, (CUdeviceptr)(uintptr_t)d_p, (CUdeviceptr)(uintptr_t)d_in, (CUdeviceptr)(uintptr_t)d_out, GRID);
    down_sync(c, out, d_out, (size_t)C_COUNT * THREADS * 4);
    int bad_cases = 0;
    char failed[2048] = "";
    for (int cs = 0; cs < C_COUNT; cs++) {
        int bad = 0;
        for (int gi = 0; gi < THREADS; gi++) {
            int kind;
            double tol;
            uint32_t want = case_ref(cs, in, params, gi, &kind, &tol), got = out[cs * THREADS + gi];
            if (close_enough(cs, got, want, kind, tol)) continue;
            if (bad++ < 3)
                cr_log_error("%s, thread %d: got 0x%08x (%g), want 0x%08x (%g); inputs %08x %08x %08x %08x %08x %08x",
                             case_names[cs], gi, got, fb32(got), want, fb32(want), in[8 * gi], in[8 * gi + 1], in[8 * gi + 2],
                             in[8 * gi + 3], in[8 * gi + 4], in[8 * gi + 5]);
        }
        if (bad) {
            bad_cases++;
            size_t l = strlen(failed);
            snprintf(failed + l, sizeof failed - l, "%s%s (%d)", l ? ", " : "", case_names[cs], bad);
        }
    }
    cr_assert_eq(bad_cases, 0, "cases differing from C (seed %llu): %s", (unsigned long long)tu_seed(), failed);
    c->d.module_unload(mod);
    kiln_backend_cuda.free(c, d_in), kiln_backend_cuda.free(c, d_out), kiln_backend_cuda.free(c, d_p);
    free(in), free(out);
    kiln_kir_free(&k);
    kiln_ctx_free(ctx);
}

/* MMA on the tensor cores and LDS4 against kt_ref_mma: kir.h's fragment layouts (which the GLSL
 * emulation and lower_gemm.c follow) are the hardware's. */
Test(cuda, mma_matches_fragment_layouts)
{
    kiln_ctx *ctx;
    kiln_cuda *c = open_cuda(&ctx);
    kiln_kir k;
    kt_build_mma(&k);
    CUmodule mod;
    CUfunction fn = load_kir(c, &k, &mod);
    enum { W = 4 * KT_MMA_BLOCK, O = KT_MMA_BLOCK * KT_MMA_OUT };
    uint32_t a[W], b[W], want[O], got[O];
    for (int i = 0; i < W; i++) a[i] = kt_mma_word(), b[i] = kt_mma_word();
    kt_ref_mma(a, b, want);
    void *d_a = dev_alloc(c, sizeof a), *d_b = dev_alloc(c, sizeof b), *d_o = dev_alloc(c, sizeof got), *d_p = dev_alloc(c, 64);
    up(c, d_a, a, sizeof a);
    up(c, d_b, b, sizeof b);
    CUdeviceptr pp = (CUdeviceptr)(uintptr_t)d_p, pa = (CUdeviceptr)(uintptr_t)d_a, pb = (CUdeviceptr)(uintptr_t)d_b, po = (CUdeviceptr)(uintptr_t)d_o;
    void *args[] = {&pp, &pa, &pb, &po};
    char err[512];
    CUresult r = c->d.launch(fn, 1, 1, 1, KT_MMA_BLOCK, 1, 1, 0, c->stream, args, NULL);
    if (r != KILN_CU_SUCCESS) kiln_cuda_fail(c, r, "cuLaunchKernel", err, sizeof err);
    cr_assert_eq(r, KILN_CU_SUCCESS, "%s", err);
    down_sync(c, got, d_o, sizeof got);
    for (int i = 0; i < O; i++) {
        float g = fb32(got[i]), w = fb32(want[i]);
        bool same = KT_MMA_EXACT(i % KT_MMA_OUT) ? got[i] == want[i] : fabsf(g - w) <= 1e-5f * (1 + fabsf(w));
        cr_assert(same, "output %d (thread %d, %d): got %08x (%g) want %08x (%g)", i, i / KT_MMA_OUT, i % KT_MMA_OUT, got[i], g, want[i], w);
    }
    c->d.module_unload(mod);
    kiln_backend_cuda.free(c, d_a), kiln_backend_cuda.free(c, d_b), kiln_backend_cuda.free(c, d_o), kiln_backend_cuda.free(c, d_p);
    kiln_kir_free(&k);
    kiln_ctx_free(ctx);
}

/* out[gi] += 1 (slot 2), reading in (slot 1) not at all: for recordings and faults. */
static void build_increment(kiln_kir *k)
{
    kiln_kir_init(k, "cuda_increment", BLOCK);
    kiln_kir_buf(k, KILN_KBUF_NODE, 1, false);
    uint32_t out = kiln_kir_buf(k, KILN_KBUF_NODE, 2, true);
    uint32_t gi = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, opk(k, KILN_KOP_BID, KILN_KT_I32, N, N, N, 0), kiln_ki(k, BLOCK)),
                          opk(k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0));
    uint32_t v = opk(k, KILN_KOP_LD, KILN_KT_U32, gi, N, N, (int32_t)out);
    opk(k, KILN_KOP_ST, KILN_KT_NONE, gi, kiln_k2(k, KILN_KOP_ADD, v, kiln_ku(k, 1)), N, (int32_t)out);
}

Test(cuda, memory_through_the_pool)
{
    kiln_ctx *ctx;
    kiln_cuda *c = open_cuda(&ctx);
    char err[512];
    for (int round = 0; round < 20; round++) {
        size_t n = (size_t)tu_randint(1, 3 << 20);
        unsigned char *h = malloc(n), *back = malloc(n);
        for (size_t i = 0; i < n; i++) h[i] = (unsigned char)tu_next();
        void *a = dev_alloc(c, n), *b = dev_alloc(c, n);
        cr_assert(((uintptr_t)a & 255) == 0 && ((uintptr_t)b & 255) == 0 && a != b);
        up(c, a, h, n);
        cr_assert_eq(kiln_backend_cuda.copy(c, b, a, n, err, sizeof err), KILN_OK, "%s", err);
        memset(back, 0, n);
        down_sync(c, back, b, n);
        cr_assert(!memcmp(h, back, n), "round %d: %zu bytes differ after upload, copy, download", round, n);
        kiln_backend_cuda.free(c, b);
        void *again = dev_alloc(c, n); /* the pool hands the freed block back */
        cr_assert_eq(again, b, "a freed block of the same size was not reused");
        kiln_backend_cuda.free(c, a);
        kiln_backend_cuda.free(c, again);
        free(h), free(back);
    }
    kiln_ctx_free(ctx);
}

Test(cuda, out_of_memory_names_the_size)
{
    kiln_ctx *ctx;
    kiln_cuda *c = open_cuda(&ctx);
    char err[512] = "";
    void *p = (void *)1;
    cr_assert_eq(kiln_backend_cuda.alloc(c, (size_t)1 << 50, &p, err, sizeof err), KILN_ERR_NOMEM, "%s", err);
    cr_assert_null(p);
    cr_assert(strstr(err, "1125899906842624 bytes") && strstr(err, "CUDA_ERROR_OUT_OF_MEMORY"), "%s", err);
    void *q = dev_alloc(c, 4096); /* still usable */
    kiln_backend_cuda.free(c, q);
    kiln_ctx_free(ctx);
}

Test(cuda, record_replay_and_timers)
{
    kiln_ctx *ctx;
    kiln_cuda *c = open_cuda(&ctx);
    kiln_kir k;
    build_increment(&k);
    CUmodule mod;
    CUfunction fn = load_kir(c, &k, &mod);
    uint32_t zero[THREADS] = {0}, got[THREADS];
    void *d = dev_alloc(c, sizeof zero);
    up(c, d, zero, sizeof zero);
    char err[512];
    void *rec = NULL;
    cr_assert_eq(kiln_backend_cuda.record_begin(c, err, sizeof err), KILN_OK, "%s", err);
    launch3(c, fn, 0, 0, (CUdeviceptr)(uintptr_t)d, GRID);
    launch3(c, fn, 0, 0, (CUdeviceptr)(uintptr_t)d, GRID);
    cr_assert_eq(kiln_backend_cuda.record_end(c, &rec, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(kiln_backend_cuda.timer_mark(c, 0, err, sizeof err), KILN_OK, "%s", err);
    for (int i = 0; i < 3; i++) cr_assert_eq(kiln_backend_cuda.replay(c, rec, err, sizeof err), KILN_OK, "%s", err);
    cr_assert_eq(kiln_backend_cuda.timer_mark(c, 7, err, sizeof err), KILN_OK, "%s", err);
    down_sync(c, got, d, sizeof got);
    for (int i = 0; i < THREADS; i++) cr_assert_eq(got[i], 6u, "thread %d: %u after 3 replays of 2 recorded launches", i, got[i]);
    double s = -1;
    cr_assert_eq(kiln_backend_cuda.timer_read(c, 0, 7, &s, err, sizeof err), KILN_OK, "%s", err);
    cr_assert(s > 0 && s < 1, "3 replays took %g s", s);
    cr_assert_neq(kiln_backend_cuda.timer_read(c, 0, 3, &s, err, sizeof err), KILN_OK);
    kiln_backend_cuda.record_free(c, rec);
    kiln_backend_cuda.free(c, d);
    c->d.module_unload(mod);
    kiln_kir_free(&k);
    kiln_ctx_free(ctx);
}

Test(cuda, sticky_fault_stops_cuda_only)
{
    kiln_ctx *ctx;
    kiln_cuda *c = open_cuda(&ctx);
    kiln_kir k;
    build_increment(&k);
    CUmodule mod;
    CUfunction fn = load_kir(c, &k, &mod);
    char err[1024] = "";
    launch3(c, fn, 0, 0, (CUdeviceptr)0x1000, GRID); /* writes through a bogus address */
    kiln_status s = kiln_backend_cuda.sync(c, err, sizeof err);
    cr_assert_eq(s, KILN_ERR_BACKEND, "%s", err);
    cr_assert(strstr(err, "CUDA_ERROR_") && strstr(err, "unusable"), "%s", err);
    void *p = NULL;
    cr_assert_eq(kiln_backend_cuda.alloc(c, 256, &p, err, sizeof err), KILN_ERR_BACKEND);
    cr_assert(strstr(err, "stopped after an earlier error") && strstr(err, "CUDA_ERROR_"), "%s", err);
    /* the process and the cpu backend go on */
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim d[1] = {4};
    kiln_node a = kiln_input(g, "a", KILN_DTYPE_F32, 1, d);
    cr_assert_eq(kiln_output(g, kiln_add(g, a, a), "y"), KILN_OK);
    kiln_plan *pl;
    cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cpu"}, &pl), KILN_OK, "%s", kiln_ctx_error(ctx));
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    kiln_binding b[] = {{.name = "a", .data = x, .bytes = sizeof x}, {.name = "y", .data = y, .bytes = sizeof y}};
    cr_assert_eq(kiln_run(pl, b, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert(y[0] == 2 && y[3] == 8);
    kiln_plan_free(pl);
    kiln_graph_free(g);
    kiln_kir_free(&k);
    kiln_ctx_free(ctx);
}
