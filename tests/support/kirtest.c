/* Hand-built kir kernels (the ALU kernel, the reduction kernel) and a reference interpreter of kir
 * written from the op comments of kir.h. Must not use any printer or backend: it is what their
 * output is compared with. */
#include "support/kirtest.h"

#include "graph/dtype.h"
#include "support/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE KILN_IDX_NONE
#define KT_OUT_STRIDE 128 /* output words per thread of the ALU kernel */

/* ---------------------------------------------------------------- builders */

static uint32_t op3(kiln_kir *k, enum kiln_kop op, enum kiln_kt t, uint32_t a, uint32_t b, uint32_t c, int32_t imm)
{
    return kiln_kir_op(k, op, t, a, b, c, imm);
}
static uint32_t cv(kiln_kir *k, enum kiln_kop op, enum kiln_kt t, uint32_t a) { return op3(k, op, t, a, NONE, NONE, 0); }

typedef struct alu {
    kiln_kir *k;
    uint32_t  base;     /* gid * KT_OUT_STRIDE (i32) */
    uint32_t  n;        /* outputs so far */
    uint8_t  *ops;      /* op of each output, or NULL */
} alu;

/* Stores value v (any type) as output word a->n. */
static void out(alu *a, uint32_t v)
{
    kiln_kir *k = a->k;
    enum kiln_kt t = kiln_ktype(k, v);
    uint32_t w = v;
    if (t == KILN_KT_F32 || t == KILN_KT_I32) w = cv(k, KILN_KOP_BITCAST, KILN_KT_U32, v);
    if (t == KILN_KT_PRED) w = op3(k, KILN_KOP_SELECT, KILN_KT_U32, v, kiln_ku(k, 1), kiln_ku(k, 0), 0);
    uint32_t idx = kiln_k2(k, KILN_KOP_ADD, a->base, kiln_ki(k, (int32_t)a->n));
    op3(k, KILN_KOP_ST, KILN_KT_NONE, idx, w, NONE, 3);
    if (a->ops && a->n < 256) a->ops[a->n] = k->ins[v].op;
    a->n++;
}

void kt_build_alu(kiln_kir *k, uint32_t *n_out, uint8_t out_ops[256])
{
    kiln_kir_init(k, "kt_alu", KT_BLOCK);
    snprintf(k->what, sizeof k->what, "every value op of kir");
    k->grid[0] = KT_GRID_X;
    k->grid[1] = KT_GRID_Y;
    kiln_kir_buf(k, KILN_KBUF_NODE, 1, false);
    kiln_kir_buf(k, KILN_KBUF_NODE, 2, false);
    kiln_kir_buf(k, KILN_KBUF_NODE, 3, true);
    kiln_kir_buf(k, KILN_KBUF_NODE, 4, true);
    const enum kiln_kt F = KILN_KT_F32, I = KILN_KT_I32, U = KILN_KT_U32;
    uint32_t tid = op3(k, KILN_KOP_TID, I, NONE, NONE, NONE, 0);
    uint32_t bx = op3(k, KILN_KOP_BID, I, NONE, NONE, NONE, 0), by = op3(k, KILN_KOP_BID, I, NONE, NONE, NONE, 1);
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, by, op3(k, KILN_KOP_NBID, I, NONE, NONE, NONE, 0)), bx); /* nbid.x = KT_GRID_X */
    uint32_t gid = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, blk, kiln_ki(k, KT_BLOCK)), tid);
    op3(k, KILN_KOP_FENCE_CTA, KILN_KT_NONE, NONE, NONE, NONE, 0); /* orders nothing here: printed, interpreted */
    alu a = {.k = k, .base = kiln_k2(k, KILN_KOP_MUL, gid, kiln_ki(k, KT_OUT_STRIDE)), .ops = out_ops};
    uint32_t g4 = kiln_k2(k, KILN_KOP_MUL, gid, kiln_ki(k, 4));
    uint32_t v4 = op3(k, KILN_KOP_LD4, KILN_KT_V4, g4, NONE, NONE, 1);
    uint32_t fw[4], uw[4];
    for (int j = 0; j < 4; j++) {
        fw[j] = cv(k, KILN_KOP_BITCAST, F, op3(k, KILN_KOP_LANE, U, v4, NONE, NONE, j));
        uw[j] = op3(k, KILN_KOP_LD, U, kiln_k2(k, KILN_KOP_ADD, g4, kiln_ki(k, j)), NONE, NONE, 2);
    }
    uint32_t fa = fw[0], fb = fw[1], fc = fw[2], ua = uw[0], ub = uw[1], uc = uw[2];
    uint32_t ia = cv(k, KILN_KOP_CVT, I, ua), ib = cv(k, KILN_KOP_CVT, I, ub), ic = cv(k, KILN_KOP_CVT, I, uc);
    uint32_t idiv = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_SHR, ib, kiln_ki(k, 24)), kiln_ki(k, 1));
    uint32_t udiv = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_SHR, ub, kiln_ku(k, 24)), kiln_ku(k, 1));
    uint32_t ish = kiln_k2(k, KILN_KOP_AND, ic, kiln_ki(k, 31)), ush = kiln_k2(k, KILN_KOP_AND, uc, kiln_ku(k, 31));
    uint32_t fpos = kiln_k2(k, KILN_KOP_ADD, kiln_k1(k, KILN_KOP_ABS, fa), kiln_kf(k, 0.25f));
    static const enum kiln_kop bin[] = {KILN_KOP_ADD, KILN_KOP_SUB, KILN_KOP_MUL, KILN_KOP_MIN, KILN_KOP_MAX};
    for (size_t j = 0; j < sizeof bin / sizeof *bin; j++) {
        out(&a, kiln_k2(k, bin[j], fa, fb));
        out(&a, kiln_k2(k, bin[j], ia, ib));
        out(&a, kiln_k2(k, bin[j], ua, ub));
    }
    out(&a, kiln_k2(k, KILN_KOP_DIV, fa, fb));
    out(&a, kiln_k2(k, KILN_KOP_DIV, fc, fpos));
    out(&a, kiln_k2(k, KILN_KOP_DIV, ia, idiv));
    out(&a, kiln_k2(k, KILN_KOP_DIV, ua, udiv));
    out(&a, kiln_k2(k, KILN_KOP_REM, ia, idiv));
    out(&a, kiln_k2(k, KILN_KOP_REM, ua, udiv));
    out(&a, op3(k, KILN_KOP_FMA, F, fa, fb, fc, 0));
    out(&a, kiln_k1(k, KILN_KOP_NEG, fa));
    out(&a, kiln_k1(k, KILN_KOP_ABS, fb));
    out(&a, kiln_k1(k, KILN_KOP_NEG, ia));
    out(&a, kiln_k1(k, KILN_KOP_ABS, ib));
    static const enum kiln_kop bits[] = {KILN_KOP_AND, KILN_KOP_OR, KILN_KOP_XOR};
    for (size_t j = 0; j < 3; j++) {
        out(&a, kiln_k2(k, bits[j], ia, ib));
        out(&a, kiln_k2(k, bits[j], ua, ub));
    }
    out(&a, kiln_k2(k, KILN_KOP_SHL, ia, ish));
    out(&a, kiln_k2(k, KILN_KOP_SHR, ia, ish));
    out(&a, kiln_k2(k, KILN_KOP_SHL, ua, ush));
    out(&a, kiln_k2(k, KILN_KOP_SHR, ua, ush));
    out(&a, kiln_k1(k, KILN_KOP_EX2, fa));
    out(&a, kiln_k1(k, KILN_KOP_LG2, fpos));
    out(&a, kiln_k1(k, KILN_KOP_RSQRT, fpos));
    out(&a, kiln_k1(k, KILN_KOP_SQRT, fpos));
    out(&a, kiln_k1(k, KILN_KOP_SIN, fa));
    out(&a, kiln_k1(k, KILN_KOP_COS, fb));
    uint32_t f8 = kiln_k1(k, KILN_KOP_FLOOR, kiln_k2(k, KILN_KOP_MUL, fa, kiln_kf(k, 8.0f)));
    out(&a, f8);
    uint32_t halves = kiln_k2(k, KILN_KOP_MUL, f8, kiln_kf(k, 0.5f)); /* k/2: many ties */
    out(&a, kiln_k1(k, KILN_KOP_RINT, halves));
    out(&a, kiln_k1(k, KILN_KOP_RINT, kiln_k2(k, KILN_KOP_MUL, fb, kiln_kf(k, 3.3f))));
    static const enum kiln_kop cmp[] = {KILN_KOP_LT, KILN_KOP_LE, KILN_KOP_EQ, KILN_KOP_NE};
    uint32_t pl = 0, pe = 0;
    for (size_t j = 0; j < 4; j++) {
        uint32_t p = kiln_k2(k, cmp[j], fa, fb);
        if (j == 0) pl = p;
        out(&a, p);
        out(&a, kiln_k2(k, cmp[j], ia, ib));
        out(&a, kiln_k2(k, cmp[j], ua, ub));
        out(&a, kiln_k2(k, cmp[j], halves, f8)); /* equal where f8 == 0 */
        pe = kiln_k2(k, cmp[j], ia, ia);
        out(&a, pe);
    }
    out(&a, kiln_k2(k, KILN_KOP_PAND, pl, pe));
    out(&a, kiln_k2(k, KILN_KOP_POR, pl, kiln_k2(k, KILN_KOP_LT, ia, ib)));
    out(&a, kiln_k1(k, KILN_KOP_PNOT, pl));
    out(&a, op3(k, KILN_KOP_SELECT, F, pl, fa, fc, 0));
    out(&a, op3(k, KILN_KOP_SELECT, I, pl, ia, ic, 0));
    out(&a, op3(k, KILN_KOP_SELECT, U, pl, ua, uc, 0));
    out(&a, cv(k, KILN_KOP_CVT, I, kiln_k2(k, KILN_KOP_MUL, fa, kiln_kf(k, 1000.0f))));
    out(&a, cv(k, KILN_KOP_CVT, U, kiln_k2(k, KILN_KOP_MUL, fpos, kiln_kf(k, 1000.0f))));
    out(&a, cv(k, KILN_KOP_CVT, F, ia));
    out(&a, cv(k, KILN_KOP_CVT, F, ua));
    out(&a, cv(k, KILN_KOP_CVT, U, ib));
    out(&a, cv(k, KILN_KOP_BITCAST, I, fa));
    out(&a, cv(k, KILN_KOP_BITCAST, U, cv(k, KILN_KOP_BITCAST, F, ib)));
    out(&a, cv(k, KILN_KOP_BITCAST, F, ia));
    for (int h = 0; h < 2; h++) {
        out(&a, op3(k, KILN_KOP_H2F, F, uc, NONE, NONE, h));
        out(&a, op3(k, KILN_KOP_B2F, F, uc, NONE, NONE, h));
    }
    out(&a, cv(k, KILN_KOP_F2H, U, kiln_k2(k, KILN_KOP_MUL, fa, kiln_kf(k, 100.0f))));
    out(&a, cv(k, KILN_KOP_F2H, U, kiln_k2(k, KILN_KOP_MUL, fb, kiln_kf(k, 1e-5f)))); /* subnormal halves */
    out(&a, cv(k, KILN_KOP_F2B, U, fa));
    out(&a, cv(k, KILN_KOP_F2B, U, cv(k, KILN_KOP_BITCAST, F, uc)));
    out(&a, op3(k, KILN_KOP_BFE, U, uc, NONE, NONE, 5 | 7 << 8));
    out(&a, op3(k, KILN_KOP_BFE, I, uc, NONE, NONE, 20 | 9 << 8));
    out(&a, op3(k, KILN_KOP_BFE, I, uc, NONE, NONE, 28 | 4 << 8));
    out(&a, op3(k, KILN_KOP_BFE, U, uc, NONE, NONE, 0 | 32 << 8));
    out(&a, op3(k, KILN_KOP_DP4A, I, ua, ub, ic, 0));
    out(&a, kiln_ki(k, INT32_MIN));
    out(&a, kiln_ku(k, 0xdeadbeefu));
    out(&a, kiln_kf(k, -0.0f));
    out(&a, kiln_kf(k, INFINITY));
    out(&a, kiln_kf(k, 1e30f));
    out(&a, kiln_kf(k, 0.1f));
    out(&a, op3(k, KILN_KOP_PARAM, I, NONE, NONE, NONE, 1));
    out(&a, gid);
    /* loop with if/else over a run-time count: acc accumulates i*ia on odd i, xors i on even */
    uint32_t acc = kiln_kvar(k, kiln_ki(k, 0)), i = kiln_kvar(k, kiln_ki(k, 0));
    uint32_t n = op3(k, KILN_KOP_PARAM, I, NONE, NONE, NONE, 0);
    op3(k, KILN_KOP_LOOP, KILN_KT_NONE, i, n, kiln_ki(k, 1), 0);
    op3(k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(k, KILN_KOP_EQ, kiln_k2(k, KILN_KOP_AND, i, kiln_ki(k, 1)), kiln_ki(k, 1)), NONE, NONE, 0);
    kiln_kset(k, acc, kiln_k2(k, KILN_KOP_ADD, acc, kiln_k2(k, KILN_KOP_MUL, i, ia)));
    op3(k, KILN_KOP_ELSE, KILN_KT_NONE, NONE, NONE, NONE, 0);
    uint32_t inner = kiln_k2(k, KILN_KOP_XOR, acc, i); /* defined inside the else, read after the loop */
    kiln_kset(k, acc, inner);
    op3(k, KILN_KOP_ENDIF, KILN_KT_NONE, NONE, NONE, NONE, 0);
    op3(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, NONE, NONE, NONE, 0);
    out(&a, acc);
    out(&a, i);
    out(&a, inner);
    /* a loop starting at tid & 3, stepping 3, with an f32 variable; an if without else */
    uint32_t facc = kiln_kvar(k, kiln_kf(k, 0.0f)), j = kiln_kvar(k, kiln_k2(k, KILN_KOP_AND, tid, kiln_ki(k, 3)));
    op3(k, KILN_KOP_LOOP, KILN_KT_NONE, j, kiln_ki(k, 10), kiln_ki(k, 3), 0);
    kiln_kset(k, facc, op3(k, KILN_KOP_FMA, F, facc, fa, cv(k, KILN_KOP_CVT, F, j), 0));
    op3(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, NONE, NONE, NONE, 0);
    op3(k, KILN_KOP_IF, KILN_KT_NONE, pl, NONE, NONE, 0);
    kiln_kset(k, facc, kiln_k1(k, KILN_KOP_NEG, facc));
    op3(k, KILN_KOP_ENDIF, KILN_KT_NONE, NONE, NONE, NONE, 0);
    out(&a, facc);
    if (a.ops) a.ops[a.n - 1] = KILN_KOP_FMA; /* compared like fma */
    /* 16-bit stores: neighbours write the two halves of one word */
    uint32_t h = kiln_k2(k, KILN_KOP_XOR, gid, kiln_ki(k, 1));
    op3(k, KILN_KOP_ST16, KILN_KT_NONE, h, cv(k, KILN_KOP_F2H, U, fa), NONE, 4);
    *n_out = a.n;
}

void kt_build_reduce(kiln_kir *k)
{
    kiln_kir_init(k, "kt_reduce", KT_RED_BLOCK);
    snprintf(k->what, sizeof k->what, "reductions and shared memory");
    k->grid[0] = 2;
    kiln_kir_buf(k, KILN_KBUF_NODE, 1, false);
    kiln_kir_buf(k, KILN_KBUF_NODE, 2, true);
    uint32_t s = kiln_kir_shared(k, KT_RED_BLOCK);
    uint32_t tid = op3(k, KILN_KOP_TID, KILN_KT_I32, NONE, NONE, NONE, 0);
    uint32_t gid = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, op3(k, KILN_KOP_BID, KILN_KT_I32, NONE, NONE, NONE, 0),
                                                    kiln_ki(k, KT_RED_BLOCK)), tid);
    uint32_t x = cv(k, KILN_KOP_BITCAST, KILN_KT_F32, op3(k, KILN_KOP_LD, KILN_KT_U32, gid, NONE, NONE, 1));
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, gid, kiln_ki(k, KT_RED_OUT));
    static const int grp[] = {1, 4, 8, 32, 128};
    int j = 0;
    for (int g = 0; g < 5; g++)
        for (int op = 0; op < 2; op++) {
            uint32_t r = op3(k, KILN_KOP_REDUCE, KILN_KT_F32, x, NONE, NONE, grp[g] | op << 16);
            op3(k, KILN_KOP_ST, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, j++)),
                cv(k, KILN_KOP_BITCAST, KILN_KT_U32, r), NONE, 2);
        }
    op3(k, KILN_KOP_STS, KILN_KT_NONE, tid, x, NONE, s);
    op3(k, KILN_KOP_BARRIER, KILN_KT_NONE, NONE, NONE, NONE, 0);
    uint32_t nb = kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_ADD, tid, kiln_ki(k, 1)), kiln_ki(k, KT_RED_BLOCK - 1));
    uint32_t y = op3(k, KILN_KOP_LDS, KILN_KT_F32, nb, NONE, NONE, s);
    op3(k, KILN_KOP_ST, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, j)), cv(k, KILN_KOP_BITCAST, KILN_KT_U32, y), NONE, 2);
}

void kt_ref_reduce(const float *in, float *out)
{
    static const int grp[] = {1, 4, 8, 32, 128};
    for (int t = 0; t < 2 * KT_RED_BLOCK; t++) {
        for (int g = 0; g < 5; g++) {
            int b = t & ~(grp[g] - 1);
            double s = 0, m = -INFINITY;
            for (int i = b; i < b + grp[g]; i++) {
                s += in[i];
                m = fmax(m, in[i]);
            }
            out[t * KT_RED_OUT + 2 * g] = (float)s;
            out[t * KT_RED_OUT + 2 * g + 1] = (float)m;
        }
        out[t * KT_RED_OUT + 10] = in[(t & ~(KT_RED_BLOCK - 1)) + ((t + 1) & (KT_RED_BLOCK - 1))];
    }
}

static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ---------------------------------------------------------------- tensor cores */

void kt_build_mma(kiln_kir *k)
{
    kiln_kir_init(k, "kt_mma", KT_MMA_BLOCK);
    snprintf(k->what, sizeof k->what, "mma and lds4");
    kiln_kir_buf(k, KILN_KBUF_NODE, 1, false);
    kiln_kir_buf(k, KILN_KBUF_NODE, 2, false);
    kiln_kir_buf(k, KILN_KBUF_NODE, 3, true);
    uint32_t s = kiln_kir_shared(k, 4 * KT_MMA_BLOCK);
    uint32_t tid = op3(k, KILN_KOP_TID, KILN_KT_I32, NONE, NONE, NONE, 0);
    uint32_t w4 = kiln_k2(k, KILN_KOP_MUL, tid, kiln_ki(k, 4));
    uint32_t a = op3(k, KILN_KOP_LD4, KILN_KT_V4, w4, NONE, NONE, 1), b = op3(k, KILN_KOP_LD4, KILN_KT_V4, w4, NONE, NONE, 2);
    uint32_t zero = op3(k, KILN_KOP_CONST, KILN_KT_F4, NONE, NONE, NONE, 0);
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, tid, kiln_ki(k, KT_MMA_OUT));
    int j = 0;
    uint32_t rev = NONE; /* the last D, lanes reversed */
    for (int bf = 0; bf < 2; bf++) {
        uint32_t acc = kiln_kvar(k, zero);
        for (int h = 0; h < 2; h++) {
            kiln_kset(k, acc, op3(k, KILN_KOP_MMA, KILN_KT_F4, a, b, acc, bf | h << 1));
            for (int l = 0; l < 4; l++)
                op3(k, KILN_KOP_ST, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, j++)),
                    cv(k, KILN_KOP_BITCAST, KILN_KT_U32, op3(k, KILN_KOP_LANE, KILN_KT_F32, acc, NONE, NONE, l)), NONE, 3);
        }
        if (bf == 1)
            for (int l = 0; l < 4; l++) rev = op3(k, KILN_KOP_SETLANE, KILN_KT_F4, rev, op3(k, KILN_KOP_LANE, KILN_KT_F32, acc, NONE, NONE, 3 - l), NONE, l);
    }
    for (int l = 0; l < 4; l++)
        op3(k, KILN_KOP_STS, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, w4, kiln_ki(k, l)), op3(k, KILN_KOP_LANE, KILN_KT_U32, a, NONE, NONE, l), NONE, s);
    op3(k, KILN_KOP_BARRIER, KILN_KT_NONE, NONE, NONE, NONE, 0);
    uint32_t nb = kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_ADD, tid, kiln_ki(k, 1)), kiln_ki(k, KT_MMA_BLOCK - 1));
    uint32_t v = op3(k, KILN_KOP_LDS4, KILN_KT_V4, kiln_k2(k, KILN_KOP_MUL, nb, kiln_ki(k, 4)), NONE, NONE, s);
    uint32_t vr = NONE;
    for (int l = 0; l < 4; l++) vr = op3(k, KILN_KOP_SETLANE, KILN_KT_V4, vr, op3(k, KILN_KOP_LANE, KILN_KT_U32, v, NONE, NONE, 3 - l), NONE, l);
    for (int l = 0; l < 4; l++)
        op3(k, KILN_KOP_ST, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, j++)), op3(k, KILN_KOP_LANE, KILN_KT_U32, vr, NONE, NONE, l), NONE, 3);
    for (int l = 0; l < 4; l++)
        op3(k, KILN_KOP_ST, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, j++)),
            cv(k, KILN_KOP_BITCAST, KILN_KT_U32, op3(k, KILN_KOP_LANE, KILN_KT_F32, rev, NONE, NONE, l)), NONE, 3);
}

static double half_of(uint32_t w, int e, bool bf)
{
    uint16_t h = (uint16_t)(w >> (16 * e));
    if (!bf) return kiln_f16_to_f32(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element (r, kk) of the 16x16 A and (kk, n) of the 16x8 B (B from lanes 2h, 2h+1) of warp w, read
 * from the lanes' words as kir.h's MMA says (written from the PTX ISA's fragment tables). */
static double mma_a(const uint32_t *a, int w, int r, int kk, bool bf)
{
    int lane = (r % 8) * 4 + (kk % 8) / 2, j = r / 8 + 2 * (kk / 8);
    return half_of(a[(w * 32 + lane) * 4 + j], kk & 1, bf);
}
static double mma_b(const uint32_t *b, int w, int kk, int n, int h, bool bf)
{
    int lane = n * 4 + (kk % 8) / 2;
    return half_of(b[(w * 32 + lane) * 4 + 2 * h + kk / 8], kk & 1, bf);
}

void kt_ref_mma(const uint32_t *a, const uint32_t *b, uint32_t *out)
{
    for (int t = 0; t < KT_MMA_BLOCK; t++) {
        int w = t / 32, l = t % 32, g = l / 4, q = l % 4, j = 0;
        uint32_t rev[4];
        for (int bf = 0; bf < 2; bf++) {
            double acc[4] = {0, 0, 0, 0};
            for (int h = 0; h < 2; h++)
                for (int e = 0; e < 4; e++) {
                    int r = g + 8 * (e >> 1), n = 2 * q + (e & 1);
                    for (int kk = 0; kk < 16; kk++) acc[e] += mma_a(a, w, r, kk, bf) * mma_b(b, w, kk, n, h, bf);
                    out[t * KT_MMA_OUT + j++] = f_bits((float)acc[e]);
                }
            for (int e = 0; e < 4; e++) rev[e] = f_bits((float)acc[3 - e]);
        }
        for (int e = 0; e < 4; e++) out[t * KT_MMA_OUT + j++] = a[((t + 1) % KT_MMA_BLOCK) * 4 + 3 - e];
        for (int e = 0; e < 4; e++) out[t * KT_MMA_OUT + j++] = rev[e];
    }
}

uint32_t kt_mma_word(void)
{
    uint32_t w = 0;
    for (int e = 0; e < 2; e++) { /* bf16 sign, exponent 127 or 128, 7 random mantissa bits */
        uint32_t h = (uint32_t)tu_randint(0, 1) << 15 | (uint32_t)(127 + tu_randint(0, 1)) << 7 | (uint32_t)tu_randint(0, 127);
        w |= h << (16 * e);
    }
    return w;
}

/* ---------------------------------------------------------------- interpreter */

typedef union kval {
    int32_t  i;
    uint32_t u;
    float    f;
    bool     p;
    uint32_t v[4];
} kval;


/* bf16 of f, rounded to nearest even (a NaN stays a quiet NaN) */
static uint32_t f2b(float f)
{
    uint32_t u = f_bits(f);
    return (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

static bool step(const kiln_kir *k, uint32_t pc, kval *v, uint32_t *const *bufs, const uint32_t tid, const uint32_t *bid,
                 char *err, size_t n_err)
{
    const kiln_kinst *in = &k->ins[pc];
    kval a = in->a != NONE ? v[in->a] : (kval){0}, b = in->b != NONE ? v[in->b] : (kval){0};
    kval c = in->c != NONE ? v[in->c] : (kval){0}, r = {0};
    enum kiln_kt t = (enum kiln_kt)in->type, ta = in->a != NONE ? (enum kiln_kt)k->ins[in->a].type : KILN_KT_NONE;
    bool F = t == KILN_KT_F32, I = t == KILN_KT_I32;
    switch ((enum kiln_kop)in->op) {
    case KILN_KOP_CONST: r.u = in->imm.u; break;
    case KILN_KOP_TID: r.i = (int32_t)tid; break;
    case KILN_KOP_BID: r.i = (int32_t)bid[in->imm.u]; break;
    case KILN_KOP_NBID: r.i = (int32_t)k->grid[in->imm.u]; break;
    case KILN_KOP_PARAM: r.u = bufs[0][in->imm.u]; break;
    case KILN_KOP_VAR: r = a; break;
    case KILN_KOP_ASSIGN: v[in->a] = b; return true;
    case KILN_KOP_ADD: if (F) r.f = a.f + b.f; else r.u = a.u + b.u; break;
    case KILN_KOP_SUB: if (F) r.f = a.f - b.f; else r.u = a.u - b.u; break;
    case KILN_KOP_MUL: if (F) r.f = a.f * b.f; else r.u = a.u * b.u; break;
    case KILN_KOP_DIV: if (F) r.f = a.f / b.f; else if (I) r.i = a.i / b.i; else r.u = a.u / b.u; break;
    case KILN_KOP_REM: if (I) r.i = a.i % b.i; else r.u = a.u % b.u; break;
    case KILN_KOP_MIN: if (F) r.f = fminf(a.f, b.f); else if (I) r.i = a.i < b.i ? a.i : b.i; else r.u = a.u < b.u ? a.u : b.u; break;
    case KILN_KOP_MAX: if (F) r.f = fmaxf(a.f, b.f); else if (I) r.i = a.i > b.i ? a.i : b.i; else r.u = a.u > b.u ? a.u : b.u; break;
    case KILN_KOP_FMA: r.f = fmaf(a.f, b.f, c.f); break;
    case KILN_KOP_NEG: if (F) r.f = -a.f; else r.u = 0u - a.u; break;
    case KILN_KOP_ABS: if (F) r.f = fabsf(a.f); else r.u = a.i < 0 ? 0u - a.u : a.u; break;
    case KILN_KOP_AND: r.u = a.u & b.u; break;
    case KILN_KOP_OR: r.u = a.u | b.u; break;
    case KILN_KOP_XOR: r.u = a.u ^ b.u; break;
    case KILN_KOP_SHL: r.u = a.u << (b.u & 31); break;
    case KILN_KOP_SHR: if (I) r.i = a.i >> (b.u & 31); else r.u = a.u >> (b.u & 31); break;
    case KILN_KOP_EX2: r.f = exp2f(a.f); break;
    case KILN_KOP_LG2: r.f = log2f(a.f); break;
    case KILN_KOP_RSQRT: r.f = (float)(1.0 / sqrt(a.f)); break;
    case KILN_KOP_SQRT: r.f = sqrtf(a.f); break;
    case KILN_KOP_SIN: r.f = sinf(a.f); break;
    case KILN_KOP_COS: r.f = cosf(a.f); break;
    case KILN_KOP_FLOOR: r.f = floorf(a.f); break;
    case KILN_KOP_RINT: r.f = nearbyintf(a.f); break;
    case KILN_KOP_LT: r.p = ta == KILN_KT_F32 ? a.f < b.f : ta == KILN_KT_I32 ? a.i < b.i : a.u < b.u; break;
    case KILN_KOP_LE: r.p = ta == KILN_KT_F32 ? a.f <= b.f : ta == KILN_KT_I32 ? a.i <= b.i : a.u <= b.u; break;
    case KILN_KOP_EQ: r.p = ta == KILN_KT_F32 ? a.f == b.f : a.u == b.u; break;
    case KILN_KOP_NE: r.p = ta == KILN_KT_F32 ? a.f != b.f : a.u != b.u; break;
    case KILN_KOP_PAND: r.p = a.p && b.p; break;
    case KILN_KOP_POR: r.p = a.p || b.p; break;
    case KILN_KOP_PNOT: r.p = !a.p; break;
    case KILN_KOP_SELECT: r = a.p ? b : c; break;
    case KILN_KOP_CVT:
        if (F) r.f = ta == KILN_KT_I32 ? (float)a.i : ta == KILN_KT_U32 ? (float)a.u : a.f;
        else if (ta == KILN_KT_F32) { if (I) r.i = (int32_t)a.f; else r.u = (uint32_t)a.f; }
        else r.u = a.u;
        break;
    case KILN_KOP_BITCAST: r.u = a.u; break;
    case KILN_KOP_H2F: r.f = kiln_f16_to_f32((uint16_t)(a.u >> (16 * in->imm.u))); break;
    case KILN_KOP_B2F: r.u = in->imm.u ? a.u & 0xffff0000u : a.u << 16; break;
    case KILN_KOP_F2H: r.u = kiln_f32_to_f16(a.f); break;
    case KILN_KOP_F2B: r.u = f2b(a.f); break;
    case KILN_KOP_PACK2: r.u = in->imm.u ? f2b(a.f) | f2b(b.f) << 16 : (uint32_t)kiln_f32_to_f16(a.f) | (uint32_t)kiln_f32_to_f16(b.f) << 16; break;
    case KILN_KOP_HFMA2: /* the product is exact in double; the sum and the two roundings after it
                            differ from one f16 rounding only at rare double-rounding ties */
        r.u = 0;
        for (int h = 0; h < 2; h++) {
            double x = (double)kiln_f16_to_f32((uint16_t)(a.u >> 16 * h)) * kiln_f16_to_f32((uint16_t)(b.u >> 16 * h)) +
                       kiln_f16_to_f32((uint16_t)(c.u >> 16 * h));
            r.u |= (uint32_t)kiln_f32_to_f16((float)x) << 16 * h;
        }
        break;
    case KILN_KOP_PRMT:
        r.u = 0;
        for (int j = 0; j < 4; j++) {
            uint32_t sel = c.u >> 4 * j, src = sel & 7, byte = ((src < 4 ? a.u : b.u) >> 8 * (src & 3)) & 0xffu;
            if (sel & 8) byte = (byte & 0x80u) ? 0xffu : 0u;
            r.u |= byte << 8 * j;
        }
        break;
    case KILN_KOP_BFE: {
        int off = in->imm.i & 31, w = in->imm.i >> 8;
        uint32_t f = w == 32 ? a.u : (a.u >> off) & ((1u << w) - 1u);
        if (I && w < 32 && (f >> (w - 1)) & 1) f |= ~((1u << w) - 1u);
        r.u = f;
        break;
    }
    case KILN_KOP_DP4A:
        r.u = c.u;
        for (int j = 0; j < 4; j++) r.u += (uint32_t)((int8_t)(a.u >> 8 * j) * (int8_t)(b.u >> 8 * j));
        break;
    case KILN_KOP_LANE: r.u = a.v[in->imm.u]; break;
    case KILN_KOP_SETLANE:
        if (in->a == KILN_IDX_NONE) memset(r.v, 0, sizeof r.v);
        else memcpy(r.v, a.v, sizeof r.v);
        r.v[in->imm.u] = b.u;
        break;
    case KILN_KOP_LD: r.u = bufs[in->imm.u][a.i]; break;
    case KILN_KOP_LD4: memcpy(r.v, &bufs[in->imm.u][a.i], 16); break;
    case KILN_KOP_ST: bufs[in->imm.u][a.i] = b.u; return true;
    case KILN_KOP_ST16: ((uint16_t *)bufs[in->imm.u])[a.i] = (uint16_t)b.u; return true;
    case KILN_KOP_ST4:
        if (a.i % 4) return snprintf(err, n_err, "kt_interp: st4 at word %d, not a multiple of 4", a.i), false;
        memcpy(&bufs[in->imm.u][a.i], b.v, 16);
        return true;
    case KILN_KOP_GRID_WAIT: case KILN_KOP_GRID_LAUNCH: case KILN_KOP_PREFETCH: return true; /* one kernel at a time: nothing overlaps */
    case KILN_KOP_FENCE_CTA: return true; /* a thread's accesses happen in program order here */
    default:
        snprintf(err, n_err, "kt_interp: op %s not interpreted", kiln_kop_name((enum kiln_kop)in->op));
        return false;
    }
    v[pc] = r;
    return true;
}

bool kt_interp(const kiln_kir *k, uint32_t *const *bufs, char *err, size_t n_err)
{
    if (!kiln_kir_verify(k, err, n_err)) return false;
    uint32_t *match = calloc(k->n_ins, sizeof *match), stack[64], depth = 0;
    kval *v = calloc(k->n_ins, sizeof *v);
    bool ok = match && v;
    for (uint32_t i = 0; ok && i < k->n_ins; i++) { /* LOOP<->ENDLOOP, IF->ELSE/ENDIF, ELSE->ENDIF */
        uint8_t op = k->ins[i].op;
        if (op == KILN_KOP_LOOP || op == KILN_KOP_IF) stack[depth++] = i;
        else if (op == KILN_KOP_ELSE) { match[stack[depth - 1]] = i; stack[depth - 1] = i; }
        else if (op == KILN_KOP_ENDLOOP || op == KILN_KOP_ENDIF) { match[stack[--depth]] = i; match[i] = k->ins[i].op == KILN_KOP_ENDLOOP ? stack[depth] : i; }
    }
    for (uint32_t bz = 0; ok && bz < k->grid[2]; bz++)
        for (uint32_t by = 0; ok && by < k->grid[1]; by++)
            for (uint32_t bx = 0; ok && bx < k->grid[0]; bx++)
                for (uint32_t t = 0; ok && t < k->block; t++) {
                    uint32_t bid[3] = {bx, by, bz};
                    for (uint32_t pc = 0; ok && pc < k->n_ins;) {
                        const kiln_kinst *in = &k->ins[pc];
                        switch (in->op) {
                        case KILN_KOP_LOOP: pc = v[in->a].i < v[in->b].i ? pc + 1 : match[pc] + 1; break;
                        case KILN_KOP_ENDLOOP: {
                            const kiln_kinst *l = &k->ins[match[pc]];
                            v[l->a].i = (int32_t)((uint32_t)v[l->a].i + (uint32_t)v[l->c].i);
                            pc = match[pc];
                            break;
                        }
                        case KILN_KOP_IF: pc = v[in->a].p ? pc + 1 : match[pc] + 1; break;
                        case KILN_KOP_ELSE: pc = match[pc] + 1; break;
                        case KILN_KOP_ENDIF: pc++; break;
                        default: ok = step(k, pc, v, bufs, t, bid, err, n_err); pc++;
                        }
                    }
                }
    free(match);
    free(v);
    if (!match || !v) snprintf(err, n_err, "kt_interp: out of memory");
    return ok;
}

/* ---------------------------------------------------------------- block interpreter */

/* TS_WGW: a WG_WAIT for quad mates' A fragments; TS_NBAR: at a named barrier whose phase has not completed */
enum { TS_RUN = 0, TS_BAR, TS_RED, TS_MBAR, TS_MMA, TS_WGW, TS_CSYNC, TS_NBAR, TS_DONE };

/* A TMA box in flight: copied into shared memory when its mbarrier's phase completes (the latest
 * moment the hardware may land it, so a read before the wait sees stale bytes). */
typedef struct tma_op {
    uint32_t map, dst, c0, c1;
    bool     landed; /* multicast into another block: landed when issued (the earliest moment: a
                        block that still reads that stage sees it overwritten), counted here */
} tma_op;

/* An mbarrier, found by its shared address. */
typedef struct mbar {
    uint32_t addr, count, pending, phase;
    int64_t  tx;      /* bytes expected and not landed */
    tma_op  *ops;     /* boxes in flight on it */
    uint32_t n_ops, cap_ops;
} mbar;

typedef struct wg_op {
    uint32_t acc;   /* W64 slot of the accumulator variable */
    uint32_t a, b;  /* shared byte addresses of the tiles */
    uint32_t imm;   /* flags (bf16, SBO, N, register A, MN-major B, LBO) */
    uint32_t group; /* commit group (0: not committed yet) */
    uint32_t ra;    /* register A: the issuing thread's count of register-A WGMMAs before this one (its
                       quad mates' fragments of the same issue are their entry ra) */
} wg_op;

typedef struct bthread {
    kval    *v;        /* values */
    uint32_t pc;       /* next instruction */
    int      state;    /* TS_* */
    float   *w;        /* W64 slots, 64 floats each */
    wg_op   *pend;     /* WGMMAs issued and not run */
    uint32_t n_pend, cap_pend, groups;
    uint32_t (*ra)[4]; /* A fragments of the register-A WGMMAs issued in this block, in issue order */
    uint32_t n_ra, cap_ra;
    uint32_t nbar_gen; /* TS_NBAR: the phase of its named barrier it waits to see completed */
} bthread;

/* A named barrier: threads counted in its current phase, the count that phase expects, phases completed. */
typedef struct nbar {
    uint32_t arrived, count, gen;
} nbar;

typedef struct bstate {
    const kiln_kir *k;
    uint32_t *match, *wslot; /* control-flow partners; W64 slot of each W64 instruction */
    uint32_t  n_w;
    uint8_t  *sh;            /* the block's shared window */
    uint32_t  sh_bytes, sh_off[KILN_KIR_MAX_SHARED];
    bthread  *t;
    char     *err;
    size_t    n_err;
    mbar     *bars;          /* mbarriers initialized in this block (n_bars); entries up to n_made keep their op buffers */
    uint32_t  n_bars, n_made, cap_bars;
    uint32_t *const *bufs;   /* the launch's buffers (TMA sources) */
    struct bstate *cl;       /* the blocks of this block's cluster (cl[rank] is this one) */
    uint32_t  rank, ncl;     /* this block's rank in its cluster, blocks per cluster */
    uint32_t  bid[3];        /* this block's index */
    nbar      nb[16];        /* named barriers 1..15 (0: BARRIER's) */
} bstate;

static float half_f(uint16_t h, bool bf)
{
    if (bf) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return kiln_f16_to_f32(h);
}

/* Byte address of element (i, kk) of a WGMMA tile at b (kir.h: core matrices, or 128-byte swizzled). */
static uint32_t wg_elem(uint32_t b, uint32_t i, uint32_t kk, uint32_t sbo, bool swz)
{
    if (!swz) return b + (i >> 3) * sbo + (kk >> 3) * 128 + (i & 7) * 16 + (kk & 7) * 2;
    uint32_t l = b + (i >> 3) * sbo + (i & 7) * 128 + kk * 2;
    return l ^ (((l >> 7) & 7) << 4);
}

/* Byte address of element (n, kk) of an MN-major (transposed) 128-byte-swizzled B tile at c. */
static uint32_t wg_elem_mn(uint32_t c, uint32_t n, uint32_t kk, uint32_t sbo, uint32_t lbo)
{
    uint32_t l = c + (n >> 6) * lbo + (kk >> 3) * sbo + (kk & 7) * 128 + (n & 63) * 2;
    return l ^ (((l >> 7) & 7) << 4);
}

/* Element (row, kk) of a register A operand: held by quad mate (kk & 7) >> 1 of the row's quad,
 * fragment lane (row >> 3 & 1) + 2 (kk >> 3), half kk & 1 (kir.h). */
static uint16_t wg_rega(const bstate *S, uint32_t t, const wg_op *o, uint32_t row, uint32_t kk)
{
    uint32_t mate = (t & ~3u) + ((kk & 7) >> 1), j = ((row >> 3) & 1) + 2 * (kk >> 3);
    return (uint16_t)(S->t[mate].ra[o->ra][j] >> (16 * (kk & 1)));
}

static bool wg_run(bstate *S, uint32_t t, const wg_op *o)
{
    uint32_t sbo = 16 * (o->imm >> 8 & 0xff), lbo = 16 * (o->imm >> 16 & 0x3fff), tw = t % 128, w = tw / 32, l = tw % 32, g = l / 4, q = l % 4;
    uint32_t n = (o->imm >> 4 & 15) ? 16 * (o->imm >> 4 & 15) : 128;
    bool bf = o->imm & 1, swz = o->imm & 2, rega = o->imm & 4, trans = o->imm & 8;
    float *acc = S->t[t].w + 64 * (size_t)o->acc;
    for (uint32_t j = 0; j < n / 2; j++) {
        uint32_t row = 16 * w + g + 8 * ((j >> 1) & 1), col = 8 * (j >> 2) + 2 * q + (j & 1);
        double sum = 0;
        for (uint32_t kk = 0; kk < 16; kk++) {
            uint32_t aa = rega ? 0 : wg_elem(o->a, row, kk, sbo, swz), ba = trans ? wg_elem_mn(o->b, col, kk, sbo, lbo) : wg_elem(o->b, col, kk, sbo, swz);
            if (aa + 2 > S->sh_bytes || ba + 2 > S->sh_bytes || ((rega ? 0 : o->a) | o->b) % 16) {
                snprintf(S->err, S->n_err, "kt_interp_block: wgmma tile outside shared memory or misaligned (A %u, B %u)", o->a, o->b);
                return false;
            }
            uint16_t ha, hb;
            if (rega) ha = wg_rega(S, t, o, g + 8 * ((j >> 1) & 1), kk);
            else memcpy(&ha, S->sh + aa, 2);
            memcpy(&hb, S->sh + ba, 2);
            sum += (double)half_f(ha, bf) * (double)half_f(hb, bf);
        }
        acc[j] = (float)((double)acc[j] + sum);
    }
    return true;
}

/* Whether every register-A WGMMA thread t would retire at its WG_WAIT (pc) has its quad mates'
 * fragments (they issue in uniform control flow, possibly later in the interpreter's order). */
static bool wg_mates_ready(const bstate *S, uint32_t t, uint32_t pc)
{
    const bthread *th = &S->t[t];
    int32_t keep = S->k->ins[pc].imm.i;
    for (uint32_t i = 0; i < th->n_pend; i++) {
        const wg_op *o = &th->pend[i];
        if (!(o->imm & 4) || !o->group || o->group + (uint32_t)keep > th->groups) continue;
        for (uint32_t m = t & ~3u; m < (t & ~3u) + 4; m++)
            if (S->t[m].n_ra <= o->ra) return false;
    }
    return true;
}

static mbar *bar_at(bstate *S, uint32_t addr)
{
    for (uint32_t i = 0; i < S->n_bars; i++)
        if (S->bars[i].addr == addr) return &S->bars[i];
    snprintf(S->err, S->n_err, "kt_interp_block: mbarrier at %u used before its init", addr);
    return NULL;
}

/* Lands box o of a TMA into shared memory: rows of box_inner 16-bit elements (128 bytes, swizzled
 * by address as WGMMA reads them), zeros past the tensor's end. */
static bool tma_land(bstate *S, const tma_op *o)
{
    const kiln_ktmap *m = &S->k->tmaps[o->map];
    uint32_t rb = 2u * m->box_inner;
    if (rb != 128 || o->dst % 1024 || o->dst + (uint64_t)rb * m->box_outer > S->sh_bytes)
        return snprintf(S->err, S->n_err, "kt_interp_block: tma box of %u x %u to %u: rows must be 128 bytes, 1024-aligned, inside shared memory",
                        m->box_inner, m->box_outer, o->dst), false;
    const uint8_t *src = (const uint8_t *)S->bufs[m->slot] + 4ull * m->word;
    if ((uintptr_t)src % 16) /* cuTensorMapEncodeTiled refuses it (buffers here are malloc'd: 16-aligned like device memory) */
        return snprintf(S->err, S->n_err, "kt_interp_block: tensor map %u starts %u bytes past a 16-byte boundary", o->map,
                        (unsigned)((uintptr_t)src % 16)), false;
    for (uint32_t r = 0; r < m->box_outer; r++)
        for (uint32_t e = 0; e < m->box_inner; e++) {
            uint64_t gr = (uint64_t)o->c1 + r, ge = (uint64_t)o->c0 + e;
            uint16_t h = 0;
            if (gr < m->outer && ge < m->inner) memcpy(&h, src + gr * m->stride + ge * 2, 2);
            uint32_t l = o->dst + r * rb + e * 2;
            memcpy(S->sh + (l ^ (((l >> 7) & 7) << 4)), &h, 2);
        }
    return true;
}

/* Completes b's phase once every arrival is in and its bytes have landed. */
static bool bar_check(bstate *S, mbar *b)
{
    int64_t bytes = 0;
    for (uint32_t i = 0; i < b->n_ops; i++) bytes += 2ll * S->k->tmaps[b->ops[i].map].box_inner * S->k->tmaps[b->ops[i].map].box_outer;
    if (b->pending || bytes < b->tx) return true;
    if (bytes > b->tx)
        return snprintf(S->err, S->n_err, "kt_interp_block: mbarrier at %u: %lld bytes landed, %lld expected", b->addr, (long long)bytes,
                        (long long)b->tx), false;
    for (uint32_t i = 0; i < b->n_ops; i++)
        if (!b->ops[i].landed && !tma_land(S, &b->ops[i])) return false;
    b->n_ops = 0, b->tx = 0, b->pending = b->count, b->phase ^= 1;
    return true;
}

static bool pending_on(const bthread *th, uint32_t slot)
{
    for (uint32_t i = 0; i < th->n_pend; i++)
        if (th->pend[i].acc == slot) return true;
    return false;
}

/* One thread's arrival at the named barrier of instruction in (NBAR_SYNC or NBAR_ARRIVE): the
 * phase completes at its count; a count that differs inside one phase is an error (PTX leaves it
 * undefined). *gen: the phase arrived in. */
static uint32_t nbar_id(const kiln_kinst *in, const kval *v) { return in->a != NONE ? (uint32_t)v[in->a].i : in->imm.u & 0xff; }
static bool nbar_arrive(bstate *S, const kiln_kinst *in, const kval *v, uint32_t *gen)
{
    uint32_t id = nbar_id(in, v), cnt = in->imm.u >> 8;
    if (id < 1 || id > 15) return snprintf(S->err, S->n_err, "kt_interp_block: named barrier %u (ids 1..15)", id), false;
    nbar *b = &S->nb[id];
    if (b->arrived && b->count != cnt)
        return snprintf(S->err, S->n_err, "kt_interp_block: named barrier %u: %u threads expected in a phase that began expecting %u",
                        id, cnt, b->count), false;
    b->count = cnt, *gen = b->gen;
    if (++b->arrived == cnt) b->arrived = 0, b->gen++;
    return true;
}

/* One instruction of thread t that the one-thread interpreter does not take. */
static bool bstep(bstate *S, uint32_t t, uint32_t pc)
{
    const kiln_kir *k = S->k;
    const kiln_kinst *in = &k->ins[pc];
    bthread *th = &S->t[t];
    kval *v = th->v;
    enum kiln_kt ta = in->a != NONE ? (enum kiln_kt)k->ins[in->a].type : KILN_KT_NONE;
    uint32_t off = in->op == KILN_KOP_WGMMA || in->op >= KILN_KOP_WG_COMMIT || in->op == KILN_KOP_FENCE_ASYNC || in->op == KILN_KOP_WG_FENCE
                       ? 0 : S->sh_off[in->imm.u < KILN_KIR_MAX_SHARED ? in->imm.u : 0];
    mbar *b = NULL;
    uint32_t words = in->imm.u < k->n_shared ? k->shared[in->imm.u] : 0;
    switch (in->op) {
    case KILN_KOP_LDS: case KILN_KOP_STS: case KILN_KOP_LDS4: case KILN_KOP_STS4: {
        uint32_t n = in->op == KILN_KOP_LDS4 || in->op == KILN_KOP_STS4 ? 4 : 1;
        if (v[in->a].i < 0 || (uint32_t)v[in->a].i + n > words || (n == 4 && v[in->a].i % 4)) {
            snprintf(S->err, S->n_err, "kt_interp_block: instruction %u (%s): element %d of a shared array of %u", pc,
                     kiln_kop_name(in->op), v[in->a].i, words);
            return false;
        }
        uint8_t *at = S->sh + off + 4 * (uint32_t)v[in->a].i;
        if (in->op == KILN_KOP_LDS) memcpy(&v[pc].u, at, 4);
        else if (in->op == KILN_KOP_LDS4) memcpy(v[pc].v, at, 16);
        else if (in->op == KILN_KOP_STS) memcpy(at, &v[in->b].u, 4);
        else memcpy(at, v[in->b].v, 16);
        return true;
    }
    case KILN_KOP_SADDR: v[pc].u = off + 4 * (uint32_t)v[in->a].i; return true;
    case KILN_KOP_FENCE_ASYNC: case KILN_KOP_WG_FENCE: case KILN_KOP_SETMAXNREG: return true;
    case KILN_KOP_MBAR_INIT:
        if (v[in->a].u % 8 || v[in->a].u + 8 > S->sh_bytes) return snprintf(S->err, S->n_err, "kt_interp_block: mbarrier at %u", v[in->a].u), false;
        for (uint32_t i = 0; i < S->n_bars; i++)
            if (S->bars[i].addr == v[in->a].u) b = &S->bars[i];
        if (!b) {
            if (S->n_bars == S->cap_bars) {
                uint32_t cap = S->cap_bars ? 2 * S->cap_bars : 16;
                mbar *g = realloc(S->bars, cap * sizeof *g);
                if (!g) return snprintf(S->err, S->n_err, "kt_interp_block: out of memory"), false;
                S->bars = g, S->cap_bars = cap;
            }
            b = &S->bars[S->n_bars++];
            if (S->n_bars > S->n_made) *b = (mbar){0}, S->n_made = S->n_bars;
        }
        b->addr = v[in->a].u, b->count = b->pending = in->imm.u, b->phase = 0, b->tx = 0, b->n_ops = 0;
        return true;
    case KILN_KOP_MBAR_ARRIVE:
        if (!(b = bar_at(S, v[in->a].u))) return false;
        if (!b->pending) return snprintf(S->err, S->n_err, "kt_interp_block: more arrivals at mbarrier %u than its count %u", b->addr, b->count), false;
        b->pending--, b->tx += in->imm.i;
        return bar_check(S, b);
    case KILN_KOP_TMA_LOAD: { /* into this block, or (multicast) into every block of the mask */
        const kval *q = &v[in->a];
        uint32_t mask = in->b == NONE ? 1u << S->rank : v[in->b].u;
        if (!mask || mask >> S->ncl)
            return snprintf(S->err, S->n_err, "kt_interp_block: tma multicast mask %#x in a cluster of %u", mask, S->ncl), false;
        for (uint32_t r = 0; r < S->ncl; r++) {
            if (!(mask >> r & 1)) continue;
            bstate *D = &S->cl[r];
            if (!(b = bar_at(D, q->v[1]))) return false;
            if (b->n_ops == b->cap_ops) {
                uint32_t cap = b->cap_ops ? 2 * b->cap_ops : 8;
                tma_op *g = realloc(b->ops, cap * sizeof *g);
                if (!g) return snprintf(S->err, S->n_err, "kt_interp_block: out of memory"), false;
                b->ops = g, b->cap_ops = cap;
            }
            tma_op o = {.map = in->imm.u, .dst = q->v[0], .c0 = q->v[2], .c1 = q->v[3], .landed = r != S->rank};
            if (o.landed && !tma_land(D, &o)) return false;
            b->ops[b->n_ops++] = o;
            if (!bar_check(D, b)) return false;
        }
        return true;
    }
    case KILN_KOP_LDS_CL: { /* a word of the shared window of the cluster's block of rank b */
        uint32_t r = v[in->b].u, at = v[in->a].u;
        if (r >= S->ncl) return snprintf(S->err, S->n_err, "kt_interp_block: shared load from rank %u in a cluster of %u", r, S->ncl), false;
        if (at % 4 || at + 4 > S->cl[r].sh_bytes)
            return snprintf(S->err, S->n_err, "kt_interp_block: shared load at byte %u of rank %u's %u", at, r, S->cl[r].sh_bytes), false;
        memcpy(&v[pc].u, S->cl[r].sh + at, 4);
        return true;
    }
    case KILN_KOP_MBAR_ARRIVE_CL: {
        uint32_t r = v[in->b].u;
        if (r >= S->ncl) return snprintf(S->err, S->n_err, "kt_interp_block: arrive at the block of rank %u in a cluster of %u", r, S->ncl), false;
        bstate *D = &S->cl[r];
        if (!(b = bar_at(D, v[in->a].u))) return false;
        if (!b->pending) return snprintf(S->err, S->n_err, "kt_interp_block: more arrivals at mbarrier %u (rank %u) than its count %u", b->addr, r, b->count), false;
        b->pending--;
        return bar_check(D, b);
    }
    case KILN_KOP_GRID_WAIT: case KILN_KOP_GRID_LAUNCH: case KILN_KOP_PREFETCH: return true; /* kernels run one after another */
    case KILN_KOP_NBAR_ARRIVE: { uint32_t g; return nbar_arrive(S, in, v, &g); }
    case KILN_KOP_FENCE_CTA: return true; /* a thread's accesses happen in program order here */
    case KILN_KOP_WGMMA:
        if (th->n_pend == th->cap_pend) {
            uint32_t cap = th->cap_pend ? 2 * th->cap_pend : 16;
            wg_op *g = realloc(th->pend, cap * sizeof *g);
            if (!g) return snprintf(S->err, S->n_err, "kt_interp_block: out of memory"), false;
            th->pend = g, th->cap_pend = cap;
        }
        if (in->imm.u & 4) { /* register A: this thread's fragment, captured at issue (it may not change until the wait) */
            if (th->n_ra == th->cap_ra) {
                uint32_t cap = th->cap_ra ? 2 * th->cap_ra : 64;
                uint32_t (*g)[4] = realloc(th->ra, cap * sizeof *g);
                if (!g) return snprintf(S->err, S->n_err, "kt_interp_block: out of memory"), false;
                th->ra = g, th->cap_ra = cap;
            }
            memcpy(th->ra[th->n_ra], v[in->b].v, 16);
            th->pend[th->n_pend++] = (wg_op){.acc = S->wslot[in->a], .b = v[in->c].u, .imm = in->imm.u, .ra = th->n_ra++};
            return true;
        }
        th->pend[th->n_pend++] = (wg_op){.acc = S->wslot[in->a], .a = v[in->b].u, .b = v[in->c].u, .imm = in->imm.u};
        return true;
    case KILN_KOP_WG_COMMIT:
        th->groups++;
        for (uint32_t i = 0; i < th->n_pend; i++)
            if (!th->pend[i].group) th->pend[i].group = th->groups;
        return true;
    case KILN_KOP_WG_WAIT: {
        uint32_t keep = 0;
        for (uint32_t i = 0; i < th->n_pend; i++) {
            wg_op o = th->pend[i];
            if (o.group && o.group + (uint32_t)in->imm.i <= th->groups) {
                if (!wg_run(S, t, &o)) return false;
            } else {
                th->pend[keep++] = o;
            }
        }
        th->n_pend = keep;
        return true;
    }
    default: break;
    }
    /* W64 values: CONST, VAR, ASSIGN, LANE */
    if (in->type == KILN_KT_W64 || ta == KILN_KT_W64) {
        uint32_t src = in->op == KILN_KOP_ASSIGN ? in->b : in->a;
        if (src != NONE && k->ins[src].type == KILN_KT_W64 && pending_on(th, S->wslot[src])) {
            snprintf(S->err, S->n_err, "kt_interp_block: instruction %u (%s) reads an accumulator a WGMMA in flight writes", pc, kiln_kop_name(in->op));
            return false;
        }
        float *w = th->w;
        switch (in->op) {
        case KILN_KOP_CONST: { float f; memcpy(&f, &in->imm.u, 4); for (int j = 0; j < 64; j++) w[64 * S->wslot[pc] + j] = f; return true; }
        case KILN_KOP_VAR: memcpy(w + 64 * S->wslot[pc], w + 64 * S->wslot[in->a], 256); return true;
        case KILN_KOP_ASSIGN:
            if (pending_on(th, S->wslot[in->a])) return snprintf(S->err, S->n_err, "kt_interp_block: assigns an accumulator in flight"), false;
            memcpy(w + 64 * S->wslot[in->a], w + 64 * S->wslot[in->b], 256);
            return true;
        case KILN_KOP_LANE: memcpy(&v[pc].u, &w[64 * S->wslot[in->a] + in->imm.u], 4); return true;
        case KILN_KOP_WSET:
            if (pending_on(th, S->wslot[in->a])) return snprintf(S->err, S->n_err, "kt_interp_block: sets a lane of an accumulator in flight"), false;
            w[64 * S->wslot[in->a] + in->imm.u] = v[in->b].f;
            return true;
        default: break;
        }
    }
    return false; /* not ours */
}

/* Runs thread t until it meets a barrier, a reduction or its end. */
static bool brun(bstate *S, uint32_t t, uint32_t *const *bufs, const uint32_t bid[3], uint64_t *budget)
{
    const kiln_kir *k = S->k;
    bthread *th = &S->t[t];
    kval *v = th->v;
    while (th->pc < k->n_ins) {
        if (!(*budget)--) return snprintf(S->err, S->n_err, "kt_interp_block: step budget exhausted (a loop that never ends?)"), false;
        uint32_t pc = th->pc;
        const kiln_kinst *in = &k->ins[pc];
        switch (in->op) {
        case KILN_KOP_LOOP: th->pc = v[in->a].i < v[in->b].i ? pc + 1 : S->match[pc] + 1; continue;
        case KILN_KOP_ENDLOOP: {
            const kiln_kinst *l = &k->ins[S->match[pc]];
            v[l->a].i = (int32_t)((uint32_t)v[l->a].i + (uint32_t)v[l->c].i);
            th->pc = S->match[pc];
            continue;
        }
        case KILN_KOP_IF: th->pc = v[in->a].p ? pc + 1 : S->match[pc] + 1; continue;
        case KILN_KOP_ELSE: th->pc = S->match[pc] + 1; continue;
        case KILN_KOP_ENDIF: th->pc++; continue;
        case KILN_KOP_BARRIER: th->state = TS_BAR; return true;
        case KILN_KOP_REDUCE: th->state = TS_RED; return true;
        case KILN_KOP_MBAR_WAIT: {
            mbar *b = bar_at(S, v[in->a].u);
            if (!b) return false;
            if (b->phase == (v[in->b].u & 1)) { /* that phase has not completed: wait */
                th->state = TS_MBAR;
                return true;
            }
            th->pc++;
            continue;
        }
        case KILN_KOP_MMA: th->state = TS_MMA; return true; /* a warp's lanes exchange fragments: they meet */
        case KILN_KOP_WG_WAIT:
            if (!wg_mates_ready(S, t, pc)) { th->state = TS_WGW; return true; }
            break;
        case KILN_KOP_CLUSTER_SYNC: th->state = TS_CSYNC; return true;
        case KILN_KOP_NBAR_SYNC:
            if (!nbar_arrive(S, in, v, &th->nbar_gen)) return false;
            if (S->nb[nbar_id(in, v)].gen == th->nbar_gen) { th->state = TS_NBAR; return true; } /* the phase goes on: wait */
            th->pc++;
            continue;
        default: break;
        }
        bool mine = (in->op >= KILN_KOP_STS4 && in->op != KILN_KOP_PACK2 && in->op != KILN_KOP_ST4 && in->op != KILN_KOP_HFMA2 &&
                     in->op != KILN_KOP_PRMT) || in->op == KILN_KOP_LDS || in->op == KILN_KOP_STS || in->op == KILN_KOP_LDS4 ||
                    in->type == KILN_KT_W64 || (in->a != NONE && k->ins[in->a].type == KILN_KT_W64 && in->op != KILN_KOP_WGMMA);
        if (mine) {
            if (!bstep(S, t, pc)) {
                if (!S->err[0]) snprintf(S->err, S->n_err, "kt_interp_block: op %s not interpreted", kiln_kop_name(in->op));
                return false;
            }
        } else if (!step(k, pc, v, bufs, t, bid, S->err, S->n_err)) {
            return false;
        }
        th->pc++;
    }
    th->state = TS_DONE;
    return true;
}

/* Every thread of the block is at MMA instruction pc (kir.h: reached in uniform control flow): each
 * warp's D = A . B + C from its lanes' fragments (kir.h's layouts, as kt_ref_mma reads them), the
 * products summed in f64 and added to C once. */
static bool bmma(bstate *S, uint32_t pc)
{
    const kiln_kir *k = S->k;
    const kiln_kinst *in = &k->ins[pc];
    bool bf = in->imm.u & 1;
    int h = (int)(in->imm.u >> 1 & 1);
    uint32_t *a = malloc(32 * 4 * sizeof *a), *b = malloc(32 * 4 * sizeof *b);
    if (!a || !b) return free(a), free(b), snprintf(S->err, S->n_err, "kt_interp_block: out of memory"), false;
    for (uint32_t w0 = 0; w0 < k->block; w0 += 32) {
        for (uint32_t l = 0; l < 32; l++)
            for (int j = 0; j < 4; j++) a[l * 4 + j] = S->t[w0 + l].v[in->a].v[j], b[l * 4 + j] = S->t[w0 + l].v[in->b].v[j];
        for (uint32_t l = 0; l < 32; l++) {
            kval *d = &S->t[w0 + l].v[pc];
            const kval *c = &S->t[w0 + l].v[in->c];
            int g = (int)l / 4, q = (int)l % 4;
            for (int e = 0; e < 4; e++) {
                int r = g + 8 * (e >> 1), n = 2 * q + (e & 1);
                double acc = 0;
                for (int kk = 0; kk < 16; kk++) acc += mma_a(a, 0, r, kk, bf) * mma_b(b, 0, kk, n, h, bf);
                float cf;
                memcpy(&cf, &c->v[e], 4);
                d->v[e] = f_bits((float)((double)cf + acc));
            }
        }
    }
    free(a), free(b);
    return true;
}

/* Every waiting thread has met: a barrier lets them on; a reduction computes its groups; an MMA
 * its warps' products. */
static bool bmeet(bstate *S)
{
    const kiln_kir *k = S->k;
    uint32_t mma_pc = NONE;
    for (uint32_t t = 0; t < k->block; t++)
        if (S->t[t].state == TS_MMA) {
            if (mma_pc != NONE && S->t[t].pc != mma_pc)
                return snprintf(S->err, S->n_err, "kt_interp_block: threads at different MMAs"), false;
            mma_pc = S->t[t].pc;
        }
    if (mma_pc != NONE) {
        for (uint32_t t = 0; t < k->block; t++)
            if (S->t[t].state != TS_MMA)
                return snprintf(S->err, S->n_err, "kt_interp_block: an MMA not reached by every thread (instruction %u)", mma_pc), false;
        if (!bmma(S, mma_pc)) return false;
        for (uint32_t t = 0; t < k->block; t++) S->t[t].state = TS_RUN, S->t[t].pc++;
        return true;
    }
    uint32_t red_pc = NONE;
    for (uint32_t t = 0; t < k->block; t++)
        if (S->t[t].state == TS_RED) {
            if (red_pc != NONE && S->t[t].pc != red_pc)
                return snprintf(S->err, S->n_err, "kt_interp_block: threads at different reductions"), false;
            red_pc = S->t[t].pc;
        }
    if (red_pc != NONE) {
        const kiln_kinst *in = &k->ins[red_pc];
        uint32_t grp = in->imm.u & 0xffff;
        bool mx = (in->imm.u >> 16) == KILN_KRED_MAX;
        for (uint32_t g0 = 0; g0 < k->block; g0 += grp) {
            float acc = 0;
            for (uint32_t t = g0; t < g0 + grp; t++) {
                if (S->t[t].state != TS_RED) return snprintf(S->err, S->n_err, "kt_interp_block: a reduction's group not all there"), false;
                float x = S->t[t].v[in->a].f;
                acc = t == g0 ? x : mx ? fmaxf(acc, x) : acc + x;
            }
            for (uint32_t t = g0; t < g0 + grp; t++) S->t[t].v[red_pc].f = acc;
        }
    }
    for (uint32_t t = 0; t < k->block; t++)
        if (S->t[t].state == TS_BAR || S->t[t].state == TS_RED) S->t[t].state = TS_RUN, S->t[t].pc++;
    return true;
}

/* Reductions over groups of at most a warp (shuffles) need only their warp: every warp whose 32
 * threads all wait at one such REDUCE gets its result now (*woke counts them), so warp-specialized
 * kernels (a producer warpgroup elsewhere) reduce without the whole block. */
static bool bwarp_reduce(bstate *S, uint32_t *woke)
{
    const kiln_kir *k = S->k;
    for (uint32_t w0 = 0; w0 < k->block; w0 += 32) {
        uint32_t pc = S->t[w0].pc;
        if (S->t[w0].state != TS_RED || (k->ins[pc].imm.u & 0xffff) > 32) continue;
        bool all = true;
        for (uint32_t t = w0; t < w0 + 32; t++) all &= S->t[t].state == TS_RED && S->t[t].pc == pc;
        if (!all) continue;
        uint32_t grp = k->ins[pc].imm.u & 0xffff;
        bool mx = (k->ins[pc].imm.u >> 16) == KILN_KRED_MAX;
        for (uint32_t g0 = w0; g0 < w0 + 32; g0 += grp) {
            float acc = 0;
            for (uint32_t t = g0; t < g0 + grp; t++) {
                float x = S->t[t].v[k->ins[pc].a].f;
                acc = t == g0 ? x : mx ? fmaxf(acc, x) : acc + x;
            }
            for (uint32_t t = g0; t < g0 + grp; t++) S->t[t].v[pc].f = acc, S->t[t].state = TS_RUN, S->t[t].pc++;
        }
        *woke += 32;
    }
    return true;
}

/* Has block S's every thread that has not ended met at a barrier, a reduction or an MMA? */
static bool meetable(const bstate *S)
{
    uint32_t at = 0;
    for (uint32_t t = 0; t < S->k->block; t++) {
        int st = S->t[t].state;
        if (st == TS_RUN || st == TS_MBAR || st == TS_WGW || st == TS_CSYNC || st == TS_NBAR) return false;
        at += st != TS_DONE;
    }
    return at > 0;
}

/* One step of block S alone: runs its threads that can run until each waits; else wakes its
 * mbarrier waiters whose phase completed; else meets its barrier. *progress: something happened. */
static bool step_block(bstate *S, uint32_t *const *bufs, uint64_t *budget, bool *progress)
{
    const kiln_kir *k = S->k;
    *progress = false;
    for (uint32_t t = 0; t < k->block; t++)
        if (S->t[t].state == TS_RUN) {
            if (!brun(S, t, bufs, S->bid, budget)) return false;
            *progress = true;
        }
    if (*progress) return true;
    for (uint32_t t = 0; t < k->block; t++) {
        bthread *th = &S->t[t];
        if (th->state == TS_WGW) {
            if (wg_mates_ready(S, t, th->pc)) th->state = TS_RUN, *progress = true; /* runs the WG_WAIT */
            continue;
        }
        if (th->state == TS_NBAR) {
            if (S->nb[nbar_id(&k->ins[th->pc], th->v)].gen != th->nbar_gen) th->state = TS_RUN, th->pc++, *progress = true;
            continue;
        }
        if (th->state != TS_MBAR) continue;
        const kiln_kinst *in = &k->ins[th->pc];
        mbar *b = bar_at(S, th->v[in->a].u);
        if (!b) return false;
        if (b->phase != (th->v[in->b].u & 1)) th->state = TS_RUN, th->pc++, *progress = true;
    }
    if (*progress) return true;
    uint32_t woke = 0;
    if (!bwarp_reduce(S, &woke)) return false;
    if (woke) return *progress = true, true;
    if (!meetable(S)) return true;
    *progress = true; /* bar.sync counts the threads that have not exited */
    return bmeet(S);
}

/* Runs one cluster (cl[0..ncl), the blocks' indices and fresh state set) to its end. The block of
 * lowest rank that can go on always goes first, so a block runs as far ahead of the others as its
 * barriers let it (an adversarial order: a stage given back too early is overwritten before the
 * others read it); the cluster meets at its syncs; a wait no one can end is a deadlock. */
static bool run_cluster(bstate *cl, uint32_t ncl, uint32_t *const *bufs, uint64_t *budget, char *err, size_t n_err)
{
    const kiln_kir *k = cl[0].k;
    for (;;) {
        bool progress = false;
        for (uint32_t c = 0; c < ncl && !progress; c++)
            if (!step_block(&cl[c], bufs, budget, &progress)) return false;
        if (progress) continue;
        uint32_t done = 0, waiting = 0, csync = 0;
        for (uint32_t c = 0; c < ncl; c++)
            for (uint32_t t = 0; t < k->block; t++) {
                int st = cl[c].t[t].state;
                done += st == TS_DONE, csync += st == TS_CSYNC, waiting += st == TS_MBAR || st == TS_WGW || st == TS_NBAR;
            }
        if (done == ncl * k->block) return true;
        if (csync && csync + done == ncl * k->block) { /* every thread of the cluster is at its sync */
            for (uint32_t c = 0; c < ncl; c++)
                for (uint32_t t = 0; t < k->block; t++)
                    if (cl[c].t[t].state == TS_CSYNC) cl[c].t[t].state = TS_RUN, cl[c].t[t].pc++;
            continue;
        }
        if (waiting) snprintf(err, n_err, "kt_interp_block: deadlock: %u threads wait on mbarriers or named barriers no one completes", waiting);
        else snprintf(err, n_err, "kt_interp_block: deadlock: threads wait at barriers and cluster syncs that cannot all meet");
        return false;
    }
}

static void free_block(bstate *S)
{
    for (uint32_t i = 0; i < S->n_made; i++) free(S->bars[i].ops);
    free(S->bars);
    for (uint32_t t = 0; S->t && t < S->k->block; t++) free(S->t[t].v), free(S->t[t].w), free(S->t[t].pend), free(S->t[t].ra);
    free(S->t), free(S->sh);
}

bool kt_interp_block(const kiln_kir *k, uint32_t *const *bufs, char *err, size_t n_err)
{
    if (!kiln_kir_verify(k, err, n_err)) return false;
    err[0] = 0;
    uint32_t ncl = k->cluster > 1 ? k->cluster : 1;
    uint32_t *match = calloc(k->n_ins + 1, sizeof *match), *wslot = calloc(k->n_ins + 1, sizeof *wslot), n_w = 0;
    bstate *cl = calloc(ncl, sizeof *cl);
    bool ok = match && wslot && cl;
    uint32_t stack[64], depth = 0;
    for (uint32_t i = 0; ok && i < k->n_ins; i++) {
        uint8_t op = k->ins[i].op;
        if (op == KILN_KOP_LOOP || op == KILN_KOP_IF) stack[depth++] = i;
        else if (op == KILN_KOP_ELSE) { match[stack[depth - 1]] = i; stack[depth - 1] = i; }
        else if (op == KILN_KOP_ENDLOOP || op == KILN_KOP_ENDIF) { match[stack[--depth]] = i; match[i] = op == KILN_KOP_ENDLOOP ? stack[depth] : i; }
        if (k->ins[i].type == KILN_KT_W64) wslot[i] = n_w++;
    }
    for (uint32_t c = 0; ok && c < ncl; c++) {
        bstate *S = &cl[c];
        *S = (bstate){.k = k, .err = err, .n_err = n_err, .match = match, .wslot = wslot, .n_w = n_w, .bufs = bufs, .cl = cl,
                      .rank = c, .ncl = ncl};
        for (uint32_t s = 0; s < k->n_shared; s++) { /* as printed: dynamic arrays 1024-aligned (the swizzle's atoms) */
            uint32_t al = k->dyn_shared ? 1024 : 128;
            S->sh_bytes = (S->sh_bytes + al - 1) / al * al;
            S->sh_off[s] = S->sh_bytes;
            S->sh_bytes += (4 * k->shared[s] + 127) / 128 * 128;
        }
        S->sh = calloc(S->sh_bytes ? S->sh_bytes : 1, 1);
        S->t = calloc(k->block, sizeof *S->t);
        ok = S->sh && S->t;
        for (uint32_t t = 0; ok && t < k->block; t++) {
            S->t[t].v = calloc(k->n_ins + 1, sizeof *S->t[t].v);
            S->t[t].w = calloc((size_t)n_w * 64 + 1, sizeof *S->t[t].w);
            ok = S->t[t].v && S->t[t].w;
        }
    }
    if (!ok) snprintf(err, n_err, "kt_interp_block: out of memory");
    uint64_t budget = (uint64_t)1 << 34;
    for (uint32_t bz = 0; ok && bz < k->grid[2]; bz++)
        for (uint32_t by = 0; ok && by < k->grid[1]; by++)
            for (uint32_t bx = 0; ok && bx < k->grid[0]; bx += ncl) {
                for (uint32_t c = 0; c < ncl; c++) {
                    bstate *S = &cl[c];
                    S->bid[0] = bx + c, S->bid[1] = by, S->bid[2] = bz;
                    memset(S->sh, 0xA5, S->sh_bytes); /* stale shared memory from an earlier block */
                    memset(S->nb, 0, sizeof S->nb);   /* a block starts with its named barriers fresh */
                    for (uint32_t t = 0; t < k->block; t++) {
                        S->t[t].pc = 0, S->t[t].state = TS_RUN, S->t[t].n_pend = 0, S->t[t].groups = 0, S->t[t].n_ra = 0;
                        memset(S->t[t].v, 0, (k->n_ins + 1) * sizeof *S->t[t].v);
                    }
                    S->n_bars = 0;
                }
                ok = run_cluster(cl, ncl, bufs, &budget, err, n_err);
                for (uint32_t c = 0; ok && c < ncl; c++)
                    for (uint32_t t = 0; ok && t < k->block; t++)
                        if (cl[c].t[t].n_pend)
                            ok = false, snprintf(err, n_err, "kt_interp_block: thread %u ended with %u WGMMAs never waited for", t, cl[c].t[t].n_pend);
            }
    for (uint32_t c = 0; cl && c < ncl; c++) free_block(&cl[c]);
    free(cl), free(match), free(wslot);
    return ok;
}
