/* The PTX printer: hand-built kir kernels that use every op on every type it takes, printed for
 * sm_80 and sm_90 and assembled by ptxas (zero spill bytes), byte-identical reprints, the exact
 * text of the instructions other printers must agree with, and the printer's refusals. Without
 * ptxas on the machine, the assembling cases skip and say so. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/dtype.h"
#include "ptx/ptx.h"
#include "spirv/spirv.h"
#include "support/testutil.h"
#include "support/kirtest.h"

#define N KILN_IDX_NONE

static uint32_t op(kiln_kir *k, enum kiln_kop o, enum kiln_kt t, uint32_t a, uint32_t b, uint32_t c, int32_t imm)
{
    return kiln_kir_op(k, o, t, a, b, c, imm);
}

/* Applies every arithmetic/bit op of type t to x and y, folding the results into one value. */
static uint32_t fold_arith(kiln_kir *k, enum kiln_kt t, uint32_t x, uint32_t y)
{
    static const enum kiln_kop both[] = {KILN_KOP_ADD, KILN_KOP_SUB, KILN_KOP_MUL, KILN_KOP_DIV, KILN_KOP_MIN, KILN_KOP_MAX};
    static const enum kiln_kop ints[] = {KILN_KOP_REM, KILN_KOP_AND, KILN_KOP_OR, KILN_KOP_XOR, KILN_KOP_SHL, KILN_KOP_SHR};
    static const enum kiln_kop f32[] = {KILN_KOP_EX2, KILN_KOP_LG2, KILN_KOP_RSQRT, KILN_KOP_SQRT, KILN_KOP_SIN,
                                        KILN_KOP_COS, KILN_KOP_FLOOR, KILN_KOP_RINT, KILN_KOP_NEG, KILN_KOP_ABS};
    uint32_t acc = x;
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++) acc = op(k, KILN_KOP_ADD, t, acc, op(k, both[i], t, acc, y, N, 0), N, 0);
    if (t == KILN_KT_F32) {
        for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++) acc = op(k, KILN_KOP_ADD, t, acc, op(k, f32[i], t, acc, N, N, 0), N, 0);
        acc = op(k, KILN_KOP_FMA, t, acc, y, x, 0);
    } else {
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) acc = op(k, ints[i], t, acc, y, N, 0);
        if (t == KILN_KT_I32) acc = op(k, KILN_KOP_NEG, t, op(k, KILN_KOP_ABS, t, acc, N, N, 0), N, N, 0);
    }
    /* comparisons, predicate logic and select */
    uint32_t lt = op(k, KILN_KOP_LT, KILN_KT_PRED, acc, y, N, 0), le = op(k, KILN_KOP_LE, KILN_KT_PRED, acc, y, N, 0);
    uint32_t eq = op(k, KILN_KOP_EQ, KILN_KT_PRED, acc, x, N, 0), ne = op(k, KILN_KOP_NE, KILN_KT_PRED, acc, x, N, 0);
    uint32_t p = op(k, KILN_KOP_POR, KILN_KT_PRED, op(k, KILN_KOP_PAND, KILN_KT_PRED, lt, le, N, 0),
                    op(k, KILN_KOP_PAND, KILN_KT_PRED, eq, op(k, KILN_KOP_PNOT, KILN_KT_PRED, ne, N, N, 0), N, 0), N, 0);
    return op(k, KILN_KOP_SELECT, t, p, acc, y, 0);
}

/* A kernel (block 256) that uses every op: arithmetic on i32/u32/f32, conversions, memory of
 * every width, shared arrays, reductions of several widths, loops, ifs and variables. */
static void build_every_op(kiln_kir *k)
{
    kiln_kir_init(k, "every_op", 256);
    k->grid[0] = 4, k->grid[1] = 2, k->grid[2] = 3;
    snprintf(k->what, sizeof k->what, "every kir op");
    uint32_t in = kiln_kir_buf(k, KILN_KBUF_NODE, 1, false), out = kiln_kir_buf(k, KILN_KBUF_NODE, 2, true);
    uint32_t rw = kiln_kir_buf(k, KILN_KBUF_NODE, 3, true);
    uint32_t tw[4] = {0x3f800000u, 0x40000000u, 0x40400000u, 0x40800000u};
    uint32_t tab = kiln_kir_table(k, tw, 4);
    uint32_t sh = kiln_kir_shared(k, 256), shf = kiln_kir_shared(k, 64);
    uint32_t tid = op(k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0);
    uint32_t bx = op(k, KILN_KOP_BID, KILN_KT_I32, N, N, N, 0), by = op(k, KILN_KOP_BID, KILN_KT_I32, N, N, N, 1);
    uint32_t bz = op(k, KILN_KOP_BID, KILN_KT_I32, N, N, N, 2);
    bz = kiln_k2(k, KILN_KOP_REM, bz, op(k, KILN_KOP_NBID, KILN_KT_I32, N, N, N, 2)); /* bz < nbid.z: the same value */
    uint32_t n0 = op(k, KILN_KOP_PARAM, KILN_KT_I32, N, N, N, 0), n1 = op(k, KILN_KOP_PARAM, KILN_KT_I32, N, N, N, 3);
    uint32_t n0b = op(k, KILN_KOP_PARAM, KILN_KT_I32, N, N, N, 0);
    uint32_t gi = kiln_k2(k, KILN_KOP_ADD, tid, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_ADD, bx, kiln_k2(k, KILN_KOP_ADD, by, bz)), kiln_ki(k, 256)));
    uint32_t w = op(k, KILN_KOP_LD, KILN_KT_U32, gi, N, N, (int32_t)in);
    uint32_t w2 = op(k, KILN_KOP_LD, KILN_KT_U32, gi, N, N, (int32_t)rw); /* read of a written slot: no .nc */
    uint32_t v = op(k, KILN_KOP_LD4, KILN_KT_V4, kiln_k2(k, KILN_KOP_SHL, gi, kiln_ki(k, 2)), N, N, (int32_t)in);
    uint32_t l0 = op(k, KILN_KOP_LANE, KILN_KT_U32, v, N, N, 0), l1 = op(k, KILN_KOP_LANE, KILN_KT_U32, v, N, N, 1);
    uint32_t l2 = op(k, KILN_KOP_LANE, KILN_KT_U32, v, N, N, 2), l3 = op(k, KILN_KOP_LANE, KILN_KT_U32, v, N, N, 3);
    uint32_t tv = op(k, KILN_KOP_LD, KILN_KT_U32, kiln_k2(k, KILN_KOP_AND, gi, kiln_ki(k, 3)), N, N, (int32_t)tab);
    /* integer and float folds */
    uint32_t xi = op(k, KILN_KOP_BITCAST, KILN_KT_I32, w, N, N, 0), yi = kiln_k2(k, KILN_KOP_ADD, n0, n1);
    uint32_t ri = fold_arith(k, KILN_KT_I32, kiln_k2(k, KILN_KOP_ADD, xi, n0b), yi);
    uint32_t ru = fold_arith(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_XOR, l0, kiln_ku(k, 0x9e3779b9u)), op(k, KILN_KOP_CVT, KILN_KT_U32, yi, N, N, 0));
    uint32_t xf = op(k, KILN_KOP_BITCAST, KILN_KT_F32, w2, N, N, 0), yf = op(k, KILN_KOP_BITCAST, KILN_KT_F32, tv, N, N, 0);
    uint32_t rf = fold_arith(k, KILN_KT_F32, kiln_k2(k, KILN_KOP_ADD, xf, kiln_kf(k, 0.5f)), yf);
    /* conversions */
    uint32_t f = kiln_k2(k, KILN_KOP_ADD, rf, op(k, KILN_KOP_CVT, KILN_KT_F32, ri, N, N, 0));
    f = kiln_k2(k, KILN_KOP_ADD, f, op(k, KILN_KOP_CVT, KILN_KT_F32, ru, N, N, 0));
    f = kiln_k2(k, KILN_KOP_ADD, f, op(k, KILN_KOP_H2F, KILN_KT_F32, l1, N, N, 0));
    f = kiln_k2(k, KILN_KOP_ADD, f, op(k, KILN_KOP_H2F, KILN_KT_F32, l1, N, N, 1));
    f = kiln_k2(k, KILN_KOP_ADD, f, op(k, KILN_KOP_B2F, KILN_KT_F32, l2, N, N, 0));
    f = kiln_k2(k, KILN_KOP_ADD, f, op(k, KILN_KOP_B2F, KILN_KT_F32, l2, N, N, 1));
    uint32_t i2 = op(k, KILN_KOP_CVT, KILN_KT_I32, f, N, N, 0), u2 = op(k, KILN_KOP_CVT, KILN_KT_U32, f, N, N, 0);
    uint32_t bits = kiln_k2(k, KILN_KOP_OR, op(k, KILN_KOP_F2H, KILN_KT_U32, f, N, N, 0),
                            kiln_k2(k, KILN_KOP_SHL, op(k, KILN_KOP_F2B, KILN_KT_U32, f, N, N, 0), kiln_ku(k, 16)));
    uint32_t be = op(k, KILN_KOP_BFE, KILN_KT_U32, l3, N, N, 4 | (6 << 8)), bs = op(k, KILN_KOP_BFE, KILN_KT_I32, l3, N, N, 28 | (4 << 8));
    uint32_t dp = op(k, KILN_KOP_DP4A, KILN_KT_I32, l3, bits, kiln_k2(k, KILN_KOP_ADD, i2, bs), 0);
    uint32_t ui = op(k, KILN_KOP_CVT, KILN_KT_I32, kiln_k2(k, KILN_KOP_ADD, u2, be), N, N, 0);
    uint32_t fi = op(k, KILN_KOP_BITCAST, KILN_KT_F32, kiln_k2(k, KILN_KOP_XOR, dp, ui), N, N, 0);
    /* variables, loops and ifs */
    uint32_t acc = kiln_kvar(k, kiln_kf(k, 0.0f)), cnt = kiln_kvar(k, kiln_ku(k, 0));
    uint32_t j = kiln_kvar(k, kiln_ki(k, 0));
    op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, n0, kiln_ki(k, 1), 0);
    {
        uint32_t jj = kiln_kvar(k, tid);
        op(k, KILN_KOP_LOOP, KILN_KT_NONE, jj, n1, kiln_ki(k, 256), 0);
        uint32_t x = op(k, KILN_KOP_BITCAST, KILN_KT_F32, op(k, KILN_KOP_LD, KILN_KT_U32, kiln_k2(k, KILN_KOP_ADD, jj, j), N, N, (int32_t)in), N, N, 0);
        kiln_kset(k, acc, op(k, KILN_KOP_FMA, KILN_KT_F32, x, fi, acc, 0));
        op(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, N, N, N, 0);
        uint32_t odd = kiln_k2(k, KILN_KOP_EQ, kiln_k2(k, KILN_KOP_AND, j, kiln_ki(k, 1)), kiln_ki(k, 1));
        op(k, KILN_KOP_IF, KILN_KT_NONE, odd, N, N, 0);
        kiln_kset(k, cnt, kiln_k2(k, KILN_KOP_ADD, cnt, kiln_ku(k, 3)));
        op(k, KILN_KOP_ELSE, KILN_KT_NONE, N, N, N, 0);
        kiln_kset(k, cnt, kiln_k2(k, KILN_KOP_SUB, cnt, kiln_ku(k, 1)));
        op(k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0);
    }
    op(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, N, N, N, 0);
    /* shared memory and reductions of every width */
    op(k, KILN_KOP_STS, KILN_KT_NONE, tid, cnt, N, (int32_t)sh);
    op(k, KILN_KOP_STS, KILN_KT_NONE, kiln_k2(k, KILN_KOP_AND, tid, kiln_ki(k, 63)), acc, N, (int32_t)shf);
    op(k, KILN_KOP_BARRIER, KILN_KT_NONE, N, N, N, 0);
    uint32_t back = op(k, KILN_KOP_LDS, KILN_KT_U32, kiln_k2(k, KILN_KOP_XOR, tid, kiln_ki(k, 1)), N, N, (int32_t)sh);
    uint32_t backf = op(k, KILN_KOP_LDS, KILN_KT_F32, kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_ADD, tid, kiln_ki(k, 7)), kiln_ki(k, 63)), N, N, (int32_t)shf);
    uint32_t r = kiln_k2(k, KILN_KOP_ADD, acc, backf);
    static const uint32_t groups[] = {1, 2, 8, 32, 64, 128, 256};
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
        r = op(k, KILN_KOP_REDUCE, KILN_KT_F32, r, N, N, (int32_t)(groups[g] | (uint32_t)(g & 1) << 16));
    uint32_t first = kiln_k2(k, KILN_KOP_EQ, tid, kiln_ki(k, 0));
    op(k, KILN_KOP_IF, KILN_KT_NONE, first, N, N, 0);
    op(k, KILN_KOP_ST, KILN_KT_NONE, bx, op(k, KILN_KOP_BITCAST, KILN_KT_U32, r, N, N, 0), N, (int32_t)out);
    op(k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0);
    op(k, KILN_KOP_ST16, KILN_KT_NONE, gi, back, N, (int32_t)rw);
    op(k, KILN_KOP_ST, KILN_KT_NONE, kiln_k2(k, KILN_KOP_ADD, gi, kiln_ki(k, 1024)), back, N, (int32_t)rw);
}

/* A GEMV-shaped kernel: 128 threads per row, 16-byte loads in a strided loop, f16 weights
 * widened, a block-wide sum, thread 0 stores. */
static void build_gemv(kiln_kir *k, uint32_t block)
{
    kiln_kir_init(k, "gemv_f16", block);
    k->grid[0] = 896;
    uint32_t x = kiln_kir_buf(k, KILN_KBUF_NODE, 1, false), wt = kiln_kir_buf(k, KILN_KBUF_NODE, 2, false);
    uint32_t y = kiln_kir_buf(k, KILN_KBUF_NODE, 3, true);
    uint32_t tid = op(k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0), row = op(k, KILN_KOP_BID, KILN_KT_I32, N, N, N, 0);
    uint32_t kk = kiln_ki(k, 896), acc = kiln_kvar(k, kiln_kf(k, 0.0f));
    uint32_t i = kiln_kvar(k, kiln_k2(k, KILN_KOP_MUL, tid, kiln_ki(k, 8)));
    op(k, KILN_KOP_LOOP, KILN_KT_NONE, i, kk, kiln_ki(k, (int32_t)block * 8), 0);
    uint32_t wv = op(k, KILN_KOP_LD4, KILN_KT_V4, kiln_k2(k, KILN_KOP_SHR, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kk), i), kiln_ki(k, 1)), N, N, (int32_t)wt);
    for (int h = 0; h < 2; h++) {
        uint32_t xv = op(k, KILN_KOP_LD4, KILN_KT_V4, kiln_k2(k, KILN_KOP_ADD, i, kiln_ki(k, 4 * h)), N, N, (int32_t)x);
        for (int l = 0; l < 4; l++) {
            uint32_t wl = op(k, KILN_KOP_LANE, KILN_KT_U32, wv, N, N, 2 * h + l / 2);
            uint32_t wf = op(k, KILN_KOP_H2F, KILN_KT_F32, wl, N, N, l & 1);
            uint32_t xf = op(k, KILN_KOP_BITCAST, KILN_KT_F32, op(k, KILN_KOP_LANE, KILN_KT_U32, xv, N, N, l), N, N, 0);
            kiln_kset(k, acc, op(k, KILN_KOP_FMA, KILN_KT_F32, wf, xf, acc, 0));
        }
    }
    op(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, N, N, N, 0);
    uint32_t s = op(k, KILN_KOP_REDUCE, KILN_KT_F32, acc, N, N, (int32_t)block);
    op(k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(k, KILN_KOP_EQ, tid, kiln_ki(k, 0)), N, N, 0);
    op(k, KILN_KOP_ST, KILN_KT_NONE, row, op(k, KILN_KOP_BITCAST, KILN_KT_U32, s, N, N, 0), N, (int32_t)y);
    op(k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0);
}

static char *print_ok(const kiln_kir *k, int sm)
{
    char err[512] = "", *txt = NULL;
    kiln_status s = kiln_ptx_print(k, sm, &txt, err, sizeof err);
    cr_assert_eq(s, KILN_OK, "printing %s for sm_%d: %s: %s", k->name, sm, kiln_status_str(s), err);
    cr_assert(txt);
    return txt;
}

/* Assembles with ptxas (skips when absent) and asserts zero spills; returns the report. */
static kiln_ptxas_report assemble_ok(const char *txt, int sm, const char *what)
{
    char ptxas[1024], err[8192];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    kiln_ptxas_report rep;
    kiln_status s = kiln_ptx_assemble(ptxas, txt, sm, &rep, err, sizeof err);
    cr_assert_eq(s, KILN_OK, "%s for sm_%d: %s\n%s", what, sm, err, txt);
    cr_assert(rep.regs > 0, "no register count in ptxas's report: %s", rep.log);
    cr_assert_eq(rep.spill_stores + rep.spill_loads, 0, "%s sm_%d spills %d/%d bytes:\n%s", what, sm, rep.spill_stores,
                 rep.spill_loads, rep.log);
    return rep;
}

Test(ptx, every_op_assembles_for_sm80_and_sm90)
{
    kiln_kir k;
    build_every_op(&k);
    char err[512];
    cr_assert(kiln_kir_verify(&k, err, sizeof err), "%s", err);
    for (int sm = 80; sm <= 90; sm += 10) {
        char *txt = print_ok(&k, sm);
        kiln_ptxas_report rep = assemble_ok(txt, sm, k.name);
        cr_assert(rep.smem >= 4 * (256 + 64) + 32, "smem %d: %s", rep.smem, rep.log);
        free(txt);
    }
    kiln_kir_free(&k);
}

Test(ptx, mma_kernel_assembles_for_sm80_and_sm90)
{
    kiln_kir k;
    kt_build_mma(&k);
    for (int sm = 80; sm <= 90; sm += 10) {
        char *txt = print_ok(&k, sm);
        cr_assert(strstr(txt, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") && strstr(txt, "ld.shared.v4.u32"), "%s", txt);
        assemble_ok(txt, sm, k.name);
        free(txt);
    }
    kiln_kir_free(&k);
}

Test(ptx, gemv_assembles_at_every_block_size)
{
    for (uint32_t block = 32; block <= 1024; block *= 2) {
        kiln_kir k;
        build_gemv(&k, block);
        for (int sm = 80; sm <= 90; sm += 10) {
            char *txt = print_ok(&k, sm);
            assemble_ok(txt, sm, "gemv");
            free(txt);
        }
        kiln_kir_free(&k);
    }
}

Test(ptx, prints_identical_bytes_twice)
{
    kiln_kir a, b;
    build_every_op(&a);
    build_every_op(&b);
    char *t1 = print_ok(&a, 90), *t2 = print_ok(&a, 90), *t3 = print_ok(&b, 90);
    cr_assert_str_eq(t1, t2);
    cr_assert_str_eq(t1, t3);
    free(t1), free(t2), free(t3);
    kiln_kir_free(&a);
    kiln_kir_free(&b);
}

static void must_have(const char *txt, const char *needle)
{
    cr_assert(strstr(txt, needle), "'%s' missing from:\n%s", needle, txt);
}

Test(ptx, instruction_text_is_the_contract)
{
    kiln_kir k;
    build_every_op(&k);
    kiln_ptx_stats st;
    char err[256], *txt = NULL;
    cr_assert_eq(kiln_ptx_print_ex(&k, 90, 0, &txt, &st, err, sizeof err), KILN_OK, "%s", err);
    static const char *const want[] = {
        ".version 8.0\n.target sm_90\n.address_size 64\n", ".maxntid 256, 1, 1", ".param .u64 every_op_p4\n)",
        "add.rn.f32", "sub.rn.f32", "mul.rn.f32", "mul.lo.s32", "mul.lo.u32", "div.rn.f32", "div.s32", "div.u32",
        "rem.s32", "rem.u32", "min.f32", "max.s32", "fma.rn.f32", "ex2.approx.ftz.f32", "lg2.approx.f32",
        "rsqrt.approx.f32", "sqrt.rn.f32", "sin.approx.f32", "cos.approx.f32", "cvt.rmi.f32.f32", "cvt.rni.f32.f32",
        "shr.s32", "shr.u32", "shl.b32", "neg.s32", "abs.f32", "setp.lt.s32", "setp.le.u32", "setp.eq.f32",
        "setp.neu.f32", "and.pred", "or.pred", "not.pred", "selp.f32", "selp.b32", "cvt.rn.f32.s32", "cvt.rn.f32.u32",
        "cvt.rzi.s32.f32", "cvt.rzi.u32.f32", "cvt.f32.f16", "cvt.rn.f16.f32", "cvt.rn.bf16.f32", "0xFFFF0000",
        "bfe.u32", "bfe.s32", "dp4a.s32.s32", "mul.wide.s32", "ld.global.nc.u32", "ld.global.u32",
        "ld.global.nc.v4.u32", "st.global.u32", "st.global.u16", "ld.shared.u32", "ld.shared.f32", "st.shared.f32",
        "bar.sync 0;", "shfl.sync.bfly.b32", "%ctaid.z", "%tid.x", ".shared .align 16 .b32 every_op_s0[256];",
        "every_op_red[8]", "@!%p",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) must_have(txt, want[i]);
    cr_assert(!strstr(txt, "bra.uni"), "bra.uni is not safe under divergent branches");
    cr_assert(!strstr(txt, ".minnctapersm"));
    char *all = NULL;
    cr_assert_eq(kiln_ptx_print_ex(&k, 90, KILN_PTX_ALL_REGISTERS, &all, NULL, err, sizeof err), KILN_OK, "%s", err);
    must_have(all, ".maxntid 256, 1, 1\n.minnctapersm 1\n{");
    free(all);
    /* parameter slots 0 and 3 are each loaded once, at entry */
    const char *p0 = strstr(txt, "[%rd0+0]"), *p3 = strstr(txt, "[%rd0+12]");
    cr_assert(p0 && p3 && !strstr(p0 + 1, "[%rd0+0]") && !strstr(p3 + 1, "[%rd0+12]"), "%s", txt);
    cr_assert_eq(st.params, 2);
    cr_assert_eq(st.ld128, 1);
    cr_assert_eq(st.st16, 1);
    cr_assert_eq(st.st32, 2);
    cr_assert_eq(st.ld32, 4);
    cr_assert_eq(st.ld_nc, 4);
    cr_assert_eq(st.loop_loads, 1);
    cr_assert_eq(st.reduces, 7);
    cr_assert_eq(st.loops, 2);
    cr_assert_eq(st.max_depth, 2);
    cr_assert_eq(st.shared_bytes, 4 * (256 + 64 + 8));
    free(txt);
    kiln_kir_free(&k);
}

/* A tiny kernel printed in full: the layout every printed module has. */
Test(ptx, golden_small_kernel)
{
    kiln_kir k;
    kiln_kir_init(&k, "axpy", 64);
    snprintf(k.what, sizeof k.what, "y = 2x + y");
    uint32_t x = kiln_kir_buf(&k, KILN_KBUF_NODE, 1, false), y = kiln_kir_buf(&k, KILN_KBUF_NODE, 2, true);
    uint32_t t = op(&k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0);
    uint32_t n = op(&k, KILN_KOP_PARAM, KILN_KT_I32, N, N, N, 1);
    op(&k, KILN_KOP_IF, KILN_KT_NONE, kiln_k2(&k, KILN_KOP_LT, t, n), N, N, 0);
    uint32_t xv = op(&k, KILN_KOP_BITCAST, KILN_KT_F32, op(&k, KILN_KOP_LD, KILN_KT_U32, t, N, N, (int32_t)x), N, N, 0);
    uint32_t yv = op(&k, KILN_KOP_BITCAST, KILN_KT_F32, op(&k, KILN_KOP_LD, KILN_KT_U32, t, N, N, (int32_t)y), N, N, 0);
    uint32_t r = op(&k, KILN_KOP_FMA, KILN_KT_F32, kiln_kf(&k, 2.0f), xv, yv, 0);
    op(&k, KILN_KOP_ST, KILN_KT_NONE, t, op(&k, KILN_KOP_BITCAST, KILN_KT_U32, r, N, N, 0), N, (int32_t)y);
    op(&k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0);
    char *txt = print_ok(&k, 80);
    static const char golden[] =
        "//\n// kiln kernel axpy: y = 2x + y\n// block 64, grid 1 x 1 x 1\n//\n\n"
        ".version 8.0\n.target sm_80\n.address_size 64\n\n"
        ".visible .entry axpy(\n\t.param .u64 axpy_p0,\n\t.param .u64 axpy_p1,\n\t.param .u64 axpy_p2\n)\n"
        ".maxntid 64, 1, 1\n{\n"
        "\t.reg .pred %p<1>;\n\t.reg .b32 %r<5>;\n\t.reg .f32 %f<4>;\n\t.reg .b64 %rd<6>;\n\n"
        "\tld.param.u64 %rd0, [axpy_p0];\n\tcvta.to.global.u64 %rd0, %rd0;\n"
        "\tld.param.u64 %rd1, [axpy_p1];\n\tcvta.to.global.u64 %rd1, %rd1;\n"
        "\tld.param.u64 %rd2, [axpy_p2];\n\tcvta.to.global.u64 %rd2, %rd2;\n"
        "\tld.global.nc.u32 %r0, [%rd0+4];\n"
        "\tmov.u32 %r1, %tid.x;\n"
        "\tsetp.lt.s32 %p0, %r1, %r0;\n"
        "\t@!%p0 bra $L3_else;\n"
        "\tmul.wide.s32 %rd3, %r1, 4;\n\tadd.s64 %rd3, %rd1, %rd3;\n\tld.global.nc.u32 %r2, [%rd3];\n"
        "\tmov.b32 %f0, %r2;\n"
        "\tmul.wide.s32 %rd4, %r1, 4;\n\tadd.s64 %rd4, %rd2, %rd4;\n\tld.global.u32 %r3, [%rd4];\n"
        "\tmov.b32 %f1, %r3;\n"
        "\tmov.f32 %f2, 0f40000000;\n"
        "\tfma.rn.f32 %f3, %f2, %f0, %f1;\n"
        "\tmov.b32 %r4, %f3;\n"
        "\tmul.wide.s32 %rd5, %r1, 4;\n\tadd.s64 %rd5, %rd2, %rd5;\n\tst.global.u32 [%rd5], %r4;\n"
        "$L3_else:\n"
        "\tret;\n}\n";
    cr_assert_str_eq(txt, golden, "got:\n%s", txt);
    free(txt);
    kiln_kir_free(&k);
}

Test(ptx, refuses_what_it_cannot_print)
{
    kiln_kir k;
    kiln_kir_init(&k, "big_shared", 32);
    kiln_kir_shared(&k, 20000);
    char err[256] = "", *txt = (char *)1;
    cr_assert_eq(kiln_ptx_print(&k, 90, &txt, err, sizeof err), KILN_ERR_UNSUPPORTED);
    cr_assert_null(txt);
    cr_assert(strstr(err, "shared memory"), "%s", err);
    cr_assert_eq(kiln_ptx_print(&k, 75, &txt, err, sizeof err), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "sm_75"), "%s", err);
    kiln_kir_free(&k);
    /* an invalid kernel is never printed */
    kiln_kir_init(&k, "bad", 32);
    op(&k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0);
    cr_assert_neq(kiln_ptx_print(&k, 90, &txt, err, sizeof err), KILN_OK);
    cr_assert(strstr(err, "endif"), "%s", err);
    kiln_kir_free(&k);
}

/* ------------------------------------------------------------------ lowered regions */

#include <xxhash.h>

#include "fuse/fuse.h"
#include "model/presets.h"

/* Texts already assembled (by hash): most regions print the same across weight dtypes. */
typedef struct seen_set {
    XXH64_hash_t h[4096]; /* hashes of assembled texts */
    int          n;       /* used */
} seen_set;

typedef struct lower_tally {
    int lowered;     /* regions lowered and printed */
    int assembled;   /* distinct texts assembled */
    int unsupported; /* regions the lowering does not take yet */
    int max_regs;    /* most registers of any kernel */
    char first_unsupported[256]; /* the first such message */
    int  n_spilling;             /* kernels with spills or a stack frame */
    int  all_regs;               /* kernels that needed KILN_PTX_ALL_REGISTERS */
    char spills[8192];           /* which */
} lower_tally;

static bool seen_before(seen_set *s, const char *txt)
{
    XXH64_hash_t h = XXH64(txt, strlen(txt), 0);
    for (int i = 0; i < s->n; i++)
        if (s->h[i] == h) return true;
    if (s->n < 4096) s->h[s->n++] = h;
    return false;
}

/* Lowers every region of g for target tg (NULL: the default), prints it for sm_80 (unless tg is
 * for sm_90 only) and sm_90 and assembles each new text. */
static void lower_all_for(const kiln_graph *g, const kiln_lower_target *tg, const char *what, const char *ptxas, seen_set *seen,
                          lower_tally *t)
{
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK, "%s: fusion failed", what);
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        uint32_t nk = 0;
        char err[8192] = "";
        kiln_status s = kiln_lower_region_for(g, &f.regions[r], tg, ks, &nk, err, sizeof err);
        if (s == KILN_ERR_UNSUPPORTED) {
            if (!t->unsupported++) snprintf(t->first_unsupported, sizeof t->first_unsupported, "%.64s region %u: %.160s", what, r, err);
            continue;
        }
        cr_assert_eq(s, KILN_OK, "%s region %u: lowering: %s: %s", what, r, kiln_status_str(s), err);
        t->lowered++;
        for (uint32_t i = 0; i < nk; i++) {
            kiln_kir *k = &ks[i];
            for (int sm = tg && tg->griddep ? 90 : 80; sm <= 90; sm += 10) {
                char *txt = NULL;
                s = kiln_ptx_print(k, sm, &txt, err, sizeof err);
                cr_assert_eq(s, KILN_OK, "%s region %u (%s): printing: %s", what, r, k->what, err);
                bool fresh = !seen_before(seen, txt);
                free(txt);
                if (!fresh) continue;
                kiln_ptxas_report rep;
                unsigned flags;
                s = kiln_ptx_print_assembled(ptxas, k, sm, &txt, &flags, NULL, &rep, err, sizeof err);
                cr_assert_eq(s, KILN_OK, "%s region %u (%s) sm_%d: %s\n%s", what, r, k->what, sm, err, txt ? txt : "");
                free(txt);
                t->all_regs += flags != 0;
                if (rep.spill_stores + rep.spill_loads + rep.stack) {
                    size_t l = strlen(t->spills);
                    snprintf(t->spills + l, sizeof t->spills - l, "  %s region %u (%s) sm_%d: %d registers, %d/%d spill bytes, %d stack\n",
                             what, r, k->what, sm, rep.regs, rep.spill_stores, rep.spill_loads, rep.stack);
                    t->n_spilling++;
                }
                if (rep.regs > t->max_regs) t->max_regs = rep.regs;
                t->assembled++;
            }
            kiln_kir_free(k);
        }
    }
    kiln_fusion_free(&f);
}

static void lower_all(const kiln_graph *g, const char *what, const char *ptxas, seen_set *seen, lower_tally *t)
{
    lower_all_for(g, NULL, what, ptxas, seen, t);
}

Test(ptx, every_preset_region_assembles, .timeout = 1200)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    static seen_set seen;
    lower_tally t = {0};
    static const kiln_dtype wt[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
    for (int p = 0; p < kiln_preset_count(); p++)
        for (int w = 0; w < 4; w++)
            for (int prefill = 0; prefill < 2; prefill++) {
                kiln_preset_build_opts o = {.wdtype = wt[w], .kvdtype = wt[w] == KILN_DTYPE_F32 ? KILN_DTYPE_F32 : KILN_DTYPE_F16,
                                            .n_layers = 1, .max_ctx = 4096, .max_tok = prefill ? 512 : 1, .seed = 1, .shape_only = true};
                kiln_graph *g = NULL;
                char err[512] = "", what[128];
                cr_assert_eq(kiln_preset_build_ex(kiln_preset_at(p), &o, &g, err, sizeof err), KILN_OK, "%s", err);
                snprintf(what, sizeof what, "%s %s %s", kiln_preset_at(p)->name, kiln_dtype_name(wt[w]), prefill ? "prefill" : "decode");
                lower_all(g, what, ptxas, &seen, &t);
                kiln_graph_free(g);
            }
    cr_log_info("presets: %d regions lowered, %d distinct kernels assembled (max %d registers, %d needed all registers), %d not lowered yet%s%s",
                t.lowered, t.assembled, t.max_regs, t.all_regs, t.unsupported, t.unsupported ? "; first: " : "", t.first_unsupported);
    cr_assert_eq(t.n_spilling, 0, "%d preset kernels spill:\n%s", t.n_spilling, t.spills);
    if (!t.lowered) cr_skip("no preset region lowers yet (%s)", t.first_unsupported);
}

Test(ptx, every_kg_region_assembles, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    static const char *const files[] = {"every_op.kg", "gpt2_mlp.kg", "llama_layer.kg", "paged_layer.kg", "tree_layer.kg",
                                        "masked_attn.kg"};
    const char *src = getenv("KILN_SOURCE_DIR");
    static seen_set seen;
    lower_tally t = {0};
    kiln_ctx *ctx = NULL;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true}, &ctx), KILN_OK);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/data/%s", src && *src ? src : KILN_SOURCE_DIR, files[i]);
        kiln_graph *g = NULL;
        cr_assert_eq(kiln_kg_load(ctx, path, &g), KILN_OK, "%s: %s", path, kiln_ctx_error(ctx));
        lower_all(g, files[i], ptxas, &seen, &t);
        kiln_graph_free(g);
    }
    kiln_ctx_free(ctx);
    cr_log_info(".kg files: %d regions lowered, %d distinct kernels assembled (max %d registers, %d needed all registers), %d not lowered yet%s%s",
                t.lowered, t.assembled, t.max_regs, t.all_regs, t.unsupported, t.unsupported ? "; first: " : "", t.first_unsupported);
    cr_assert_eq(t.n_spilling, 0, "%d .kg kernels spill:\n%s", t.n_spilling, t.spills);
    if (!t.lowered) cr_skip("no .kg region lowers yet (%s)", t.first_unsupported);
}

/* The formats of codegen/wfmt_more.c in a llama-7b layer (every matmul in the format: K 4096 and
 * 11008 take pairs of 32-blocks and blocks of 256): decode and 512-token prefill for the default
 * target (sm_80 and sm_90 text: gemv, mma.sync GEMM) and the prefill for sm_90a (TMA + wgmma GEMM
 * with the producer's decoders) assemble; gemv kernels without spills. */
Test(ptx, more_formats_assemble, .timeout = 1200)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    static const kiln_dtype wt[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1,
                                    KILN_DTYPE_IQ4_NL, KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K, KILN_DTYPE_IQ4_XS};
    static seen_set seen;
    const kiln_lower_target h100 = kiln_lower_target_for_sm(90);
    for (int w = 0; w < 8; w++) {
        lower_tally dec = {0}, pre = {0};
        for (int prefill = 0; prefill < 2; prefill++) {
            kiln_preset_build_opts o = {.wdtype = wt[w], .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096,
                                        .max_tok = prefill ? 512 : 1, .seed = 1, .shape_only = true};
            kiln_graph *g = NULL;
            char err[512] = "", what[128];
            cr_assert_eq(kiln_preset_build_ex(kiln_preset_find("llama-7b"), &o, &g, err, sizeof err), KILN_OK, "%s", err);
            snprintf(what, sizeof what, "llama-7b %s %s", kiln_dtype_name(wt[w]), prefill ? "prefill" : "decode");
            lower_all_for(g, NULL, what, ptxas, &seen, prefill ? &pre : &dec);
            if (prefill) lower_all_for(g, &h100, what, ptxas, &seen, &pre);
            kiln_graph_free(g);
        }
        cr_log_info("%s: %d + %d regions lowered, %d + %d kernels assembled (max %d / %d registers)%s%s", kiln_dtype_name(wt[w]), dec.lowered,
                    pre.lowered, dec.assembled, pre.assembled, dec.max_regs, pre.max_regs, pre.n_spilling ? "; prefill spills:\n" : "",
                    pre.spills);
        cr_assert_eq(dec.unsupported + pre.unsupported, 0, "%s: %s %s", kiln_dtype_name(wt[w]), dec.first_unsupported, pre.first_unsupported);
        cr_assert_eq(dec.n_spilling, 0, "%s decode kernels spill:\n%s", kiln_dtype_name(wt[w]), dec.spills);
    }
}

/* Programmatic dependent launch (codegen.pdl on sm_90): every decode region of the presets (the
 * gemv with its L2 prefetches), and qwen2-0.5b's prefill regions, with griddepcontrol, assemble
 * with no spills. (q6_k's prefill gemv for short runs spills with or without pdl: not here.) */
Test(ptx, pdl_kernels_assemble_for_sm90, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    static seen_set seen;
    lower_tally t = {0};
    kiln_lower_target tg = kiln_lower_target_for_sm(90);
    tg.opts.pdl = KILN_GEMM_ON;
    static const kiln_dtype wt[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
    int with_prefetch = 0;
    for (int p = 0; p < kiln_preset_count(); p++)
        for (int w = 0; w < 4; w++)
            for (int prefill = 0; prefill < (p == 0 && wt[w] != KILN_DTYPE_Q6_K ? 2 : 1); prefill++) {
                kiln_preset_build_opts o = {.wdtype = wt[w], .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096,
                                            .max_tok = prefill ? 512 : 1, .seed = 1, .shape_only = true};
                kiln_graph *g = NULL;
                char err[512] = "", what[128];
                cr_assert_eq(kiln_preset_build_ex(kiln_preset_at(p), &o, &g, err, sizeof err), KILN_OK, "%s", err);
                snprintf(what, sizeof what, "pdl %s %s %s", kiln_preset_at(p)->name, kiln_dtype_name(wt[w]), prefill ? "prefill" : "decode");
                int before = t.assembled;
                lower_all_for(g, &tg, what, ptxas, &seen, &t);
                with_prefetch += !prefill && t.assembled > before;
                kiln_graph_free(g);
            }
    cr_log_info("pdl presets: %d regions lowered, %d distinct kernels assembled for sm_90 (max %d registers)", t.lowered, t.assembled,
                t.max_regs);
    cr_assert_eq(t.unsupported, 0, "%s", t.first_unsupported);
    cr_assert_eq(t.n_spilling, 0, "%d pdl kernels spill:\n%s", t.n_spilling, t.spills);
    cr_assert(with_prefetch > 0);
}

/* The decode gemv's A/B variants (codegen.pdl 3: weights in registers before the wait, gemv_pair,
 * gemv_prefetch, gemv_fence) assemble for sm_90 without spills: all of them at once on the llama-7b
 * q8_0/q4_k and qwen2-0.5b q8_0 decode layers, and without the pair path on llama-7b f16;
 * codegen.gemv_preload alone on qwen2-0.5b q4_k and f16; codegen.gemv_pipeline with prefetches on
 * llama-7b q4_k and, with the pair path, q8_0, and with gemv_xload on qwen2-0.5b q8_0, llama-7b f16 and
 * qwen2-7b q4_k (kept to a few dozen ptxas runs: this executable is the suite's longest). */
Test(ptx, gemv_variants_assemble_for_sm90, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    static seen_set seen;
    lower_tally t = {0};
    static const struct { const char *preset; kiln_dtype w; bool pair; int alone; } cases[] = { /* alone: 1 preload, 2 pipeline, 3 xload + pipeline */
        {"llama-7b", KILN_DTYPE_Q8_0, true, 0}, {"llama-7b", KILN_DTYPE_Q4_K, true, 0},
        {"qwen2-0.5b", KILN_DTYPE_Q8_0, true, 0}, {"llama-7b", KILN_DTYPE_F16, false, 0},
        {"qwen2-0.5b", KILN_DTYPE_Q4_K, false, 1}, {"qwen2-0.5b", KILN_DTYPE_F16, false, 1},
        {"llama-7b", KILN_DTYPE_Q4_K, false, 2}, {"llama-7b", KILN_DTYPE_Q8_0, true, 2},
        {"qwen2-0.5b", KILN_DTYPE_Q8_0, false, 3}, {"llama-7b", KILN_DTYPE_F16, false, 3}, {"qwen2-7b", KILN_DTYPE_Q4_K, false, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_lower_target tg = kiln_lower_target_for_sm(90);
        if (cases[i].alone == 1) { /* codegen.gemv_preload alone: the same registers without pdl */
            tg.opts.gemv_preload = KILN_GEMM_ON;
        } else if (cases[i].alone >= 2) { /* codegen.gemv_pipeline, with L2 prefetches (and the pair path; xload) */
            tg.opts.gemv_pipeline = KILN_GEMM_ON;
            if (cases[i].alone == 3) tg.opts.gemv_xload = KILN_GEMM_ON;
            tg.opts.gemv_prefetch = 1;
            tg.opts.gemv_pair = cases[i].pair ? KILN_GEMM_ON : KILN_GEMM_AUTO;
        } else {
            tg.opts.pdl = KILN_PDL_REGS;
            tg.opts.gemv_pair = cases[i].pair ? KILN_GEMM_ON : KILN_GEMM_AUTO;
            tg.opts.gemv_prefetch = cases[i].pair ? 1 : 2;
            tg.opts.gemv_fence = KILN_GEMM_ON;
        }
        const kiln_preset *p = kiln_preset_find(cases[i].preset);
        cr_assert(p, "no preset %s", cases[i].preset);
        kiln_preset_build_opts o = {.wdtype = cases[i].w, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096, .max_tok = 1,
                                    .seed = 1, .shape_only = true};
        kiln_graph *g = NULL;
        char err[512] = "", what[128];
        cr_assert_eq(kiln_preset_build_ex(p, &o, &g, err, sizeof err), KILN_OK, "%s", err);
        snprintf(what, sizeof what, "gemv variants %s %s", cases[i].preset, kiln_dtype_name(cases[i].w));
        lower_all_for(g, &tg, what, ptxas, &seen, &t);
        kiln_graph_free(g);
    }
    cr_log_info("gemv variants: %d regions lowered, %d distinct kernels assembled (max %d registers)", t.lowered, t.assembled, t.max_regs);
    cr_assert_eq(t.unsupported, 0, "%s", t.first_unsupported);
    cr_assert_eq(t.n_spilling, 0, "%d kernels spill:\n%s", t.n_spilling, t.spills);
    cr_assert(t.assembled > 0);
}

/* The three ops print as PTX ISA 7.8 text, only for sm_90. */
Test(ptx, pdl_ops_print_for_sm90_only)
{
    kiln_kir k;
    kiln_kir_init(&k, "pdl_ops", 32);
    uint32_t w = kiln_kir_buf(&k, KILN_KBUF_NODE, 1, false), y = kiln_kir_buf(&k, KILN_KBUF_NODE, 2, true);
    k.pdl = true;
    k.pdl_const = 1u | 1u << w;
    op(&k, KILN_KOP_GRID_LAUNCH, KILN_KT_NONE, N, N, N, 0);
    uint32_t tid = op(&k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0);
    op(&k, KILN_KOP_PREFETCH, KILN_KT_NONE, tid, N, N, (int32_t)w);
    op(&k, KILN_KOP_GRID_WAIT, KILN_KT_NONE, N, N, N, 0);
    op(&k, KILN_KOP_ST, KILN_KT_NONE, tid, op(&k, KILN_KOP_LD, KILN_KT_U32, tid, N, N, (int32_t)w), N, (int32_t)y);
    char *txt = print_ok(&k, 90);
    const char *l = strstr(txt, "\tgriddepcontrol.launch_dependents;\n"), *pf = strstr(txt, "\tprefetch.global.L2 [%rd"),
               *wt = strstr(txt, "\tgriddepcontrol.wait;\n"), *st = strstr(txt, "\tst.global.u32");
    cr_assert(l && pf && wt && st && l < pf && pf < wt && wt < st, "%s", txt);
    cr_assert(strstr(txt, "ld.global.nc.u32"), "a weight keeps its read-only loads: %s", txt);
    assemble_ok(txt, 90, "pdl ops");
    free(txt);
    char err[256] = "";
    cr_assert_eq(kiln_ptx_print(&k, 80, &txt, err, sizeof err), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "griddepcontrol"), "%s", err);
    kiln_kir_free(&k);
}

/* A one-block test kernel of T threads reading node 1 and writing node 2 (their slots in *x, *y):
 * returns the thread index. */
static uint32_t io_kernel(kiln_kir *k, const char *name, uint32_t T, uint32_t *x, uint32_t *y)
{
    kiln_kir_init(k, name, T);
    *x = kiln_kir_buf(k, KILN_KBUF_NODE, 1, false), *y = kiln_kir_buf(k, KILN_KBUF_NODE, 2, true);
    k->grid[0] = 1;
    return kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

/* k printed for sm_80 and sm_90 holds both instruction texts and assembles. */
static void prints_both_and_assembles(const kiln_kir *k, const char *a, const char *b)
{
    for (int sm = 80; sm <= 90; sm += 10) {
        char *txt = print_ok(k, sm);
        cr_assert(strstr(txt, a) && strstr(txt, b), "%s", txt);
        assemble_ok(txt, sm, k->name);
        free(txt);
    }
}

/* PACK2 (two f32 to an f16x2 or bf16x2 word in one cvt): a in the low half, b in the high half,
 * each rounded as F2H / F2B round (the interpreter against the two-conversion form on values
 * that include halfway cases, subnormals, overflow and infinities); prints as cvt.rn.f16x2.f32
 * with b first (PTX puts its first source in the upper half) and assembles for sm_80 and sm_90. */
Test(ptx, pack2_halves)
{
    enum { T = 64 };
    kiln_kir k;
    uint32_t x, y, tid = io_kernel(&k, "pack2", T, &x, &y);
    uint32_t a = kiln_kbitcast(&k, KILN_KT_F32, kiln_kld(&k, x, kiln_kmuli(&k, tid, 2)));
    uint32_t b = kiln_kbitcast(&k, KILN_KT_F32, kiln_kld(&k, x, kiln_kaddi(&k, kiln_kmuli(&k, tid, 2), 1)));
    for (int bf = 0; bf < 2; bf++) {
        uint32_t p = kiln_kir_op(&k, KILN_KOP_PACK2, KILN_KT_U32, a, b, KILN_IDX_NONE, bf);
        enum kiln_kop one = bf ? KILN_KOP_F2B : KILN_KOP_F2H;
        uint32_t lo = kiln_kir_op(&k, one, KILN_KT_U32, a, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        uint32_t hi = kiln_kir_op(&k, one, KILN_KT_U32, b, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        uint32_t two = kiln_k2(&k, KILN_KOP_OR, lo, kiln_k2(&k, KILN_KOP_SHL, hi, kiln_ku(&k, 16)));
        kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, kiln_kaddi(&k, kiln_kmuli(&k, tid, 4), 2 * bf), p, KILN_IDX_NONE, (int32_t)y);
        kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, kiln_kaddi(&k, kiln_kmuli(&k, tid, 4), 2 * bf + 1), two, KILN_IDX_NONE, (int32_t)y);
    }
    float in[2 * T];
    static const float special[] = {1.00048828125f, 1.000732421875f, 65520.0f, 65519.0f, 1e-7f, -3e-8f, INFINITY, -INFINITY,
                                    1.00390625f, 1.01171875f, 3.3895314e38f, -0.0f};
    for (int i = 0; i < 2 * T; i++) in[i] = i < (int)(sizeof special / sizeof *special) ? special[i] : (float)tu_uniform(-70000, 70000);
    uint32_t out[4 * T], params[4] = {0};
    memset(out, 0xFF, sizeof out);
    uint32_t *bufs[3] = {params, (uint32_t *)in, out};
    char err[512] = "";
    cr_assert(kt_interp(&k, bufs, err, sizeof err), "%s", err);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(out[4 * t], out[4 * t + 1], "f16x2 of %g, %g: %#x, two conversions %#x", (double)in[2 * t], (double)in[2 * t + 1],
                     out[4 * t], out[4 * t + 1]);
        cr_assert_eq(out[4 * t] & 0xffff, kiln_f32_to_f16(in[2 * t]), "f16 of a in the low half");
        cr_assert_eq(out[4 * t + 2], out[4 * t + 3], "bf16x2 of %g, %g: %#x, two conversions %#x", (double)in[2 * t],
                     (double)in[2 * t + 1], out[4 * t + 2], out[4 * t + 3]);
    }
    prints_both_and_assembles(&k, "\tcvt.rn.f16x2.f32 %r", "\tcvt.rn.bf16x2.f32 %r");
    kiln_kir_free(&k);
}

/* HFMA2 and PRMT (the Hopper GEMM's f16-pair decoders, kl_wfmt.gemm_h2): the interpreter's PRMT
 * picks bytes of a (0-3) and b (4-7) by the selector's nibbles, replicating the sign where bit 3 is
 * set (checked against bytes written out here); HFMA2 rounds each half's a * b + c once (checked
 * against the f16 of the f32 fma, exact for these operands: 11-bit by 11-bit products), and the
 * decoders' trick holds: 1024 + q (q in the f16 1024's mantissa) less 1024 is q. Both print as one
 * instruction each and assemble for sm_80 and sm_90. */
Test(ptx, hfma2_prmt)
{
    enum { T = 64 };
    kiln_kir k;
    uint32_t x, y, tid = io_kernel(&k, "h2", T, &x, &y);
    uint32_t w[4];
    for (int i = 0; i < 4; i++) w[i] = kiln_kld(&k, x, kiln_kaddi(&k, kiln_kmuli(&k, tid, 4), i));
    uint32_t out[5];
    out[0] = kiln_kir_op(&k, KILN_KOP_PRMT, KILN_KT_U32, w[0], w[1], w[2], 0);
    out[1] = kiln_kir_op(&k, KILN_KOP_PRMT, KILN_KT_U32, w[0], kiln_ku(&k, 0), kiln_ku(&k, 0x4140u), 0);
    out[2] = kiln_kir_op(&k, KILN_KOP_HFMA2, KILN_KT_U32, w[1], w[2], w[3], 0);
    uint32_t q = kiln_k2(&k, KILN_KOP_OR, kiln_k2(&k, KILN_KOP_AND, w[0], kiln_ku(&k, 0x03FF03FFu)), kiln_ku(&k, 0x64006400u));
    out[3] = kiln_kir_op(&k, KILN_KOP_HFMA2, KILN_KT_U32, q, kiln_ku(&k, 0x3C003C00u), kiln_ku(&k, 0xE400E400u), 0);
    out[4] = kiln_kir_op(&k, KILN_KOP_HFMA2, KILN_KT_U32, out[3], w[1], w[3], 0);
    for (int i = 0; i < 5; i++) kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, kiln_kaddi(&k, kiln_kmuli(&k, tid, 5), i), out[i], KILN_IDX_NONE, (int32_t)y);
    char err[512] = "";
    cr_assert(kiln_kir_verify(&k, err, sizeof err), "%s", err);
    uint32_t in[4 * T], res[5 * T], params[4] = {0};
    for (int t = 0; t < T; t++) {
        in[4 * t] = (uint32_t)tu_next();
        in[4 * t + 1] = (uint32_t)kiln_f32_to_f16((float)tu_uniform(-4, 4)) | (uint32_t)kiln_f32_to_f16((float)tu_uniform(-1e-3, 1e-3)) << 16;
        in[4 * t + 2] = (uint32_t)tu_next(); /* a selector too: every nibble */
        in[4 * t + 3] = (uint32_t)kiln_f32_to_f16((float)tu_uniform(-8, 8)) | (uint32_t)kiln_f32_to_f16((float)tu_uniform(-1e-2, 1e-2)) << 16;
    }
    in[2] = 0x76543210u, in[6] = 0xBA98FEDCu; /* identity, and sign replication of b's bytes */
    memset(res, 0xFF, sizeof res);
    uint32_t *bufs[3] = {params, in, res};
    cr_assert(kt_interp(&k, bufs, err, sizeof err), "%s", err);
    for (int t = 0; t < T; t++) {
        const uint32_t *a = &in[4 * t], *r = &res[5 * t];
        uint8_t src[8];
        for (int j = 0; j < 4; j++) src[j] = (uint8_t)(a[0] >> 8 * j), src[4 + j] = (uint8_t)(a[1] >> 8 * j);
        uint32_t want = 0;
        for (int j = 0; j < 4; j++) {
            uint32_t n = (a[2] >> 4 * j) & 15u, byte = src[n & 7];
            want |= (n & 8 ? (byte & 0x80 ? 0xffu : 0u) : byte) << 8 * j;
        }
        cr_assert_eq(r[0], want, "prmt(%#x, %#x, %#x) = %#x, want %#x", a[0], a[1], a[2], r[0], want);
        cr_assert_eq(r[1], (a[0] & 0xffu) | (a[0] & 0xff00u) << 8, "bytes 0 and 1 into the halves");
        for (int h = 0; h < 2; h++) {
            float f1 = kiln_f16_to_f32((uint16_t)(a[1] >> 16 * h)), f2 = kiln_f16_to_f32((uint16_t)(a[2] >> 16 * h));
            float f3 = kiln_f16_to_f32((uint16_t)(a[3] >> 16 * h)), qv = (float)((a[0] >> 16 * h) & 0x3FFu);
            if (isfinite(f1 * f2 + f3))
                cr_assert_eq((r[2] >> 16 * h) & 0xffffu, kiln_f32_to_f16(fmaf(f1, f2, f3)), "hfma2 half %d", h);
            cr_assert_eq((r[3] >> 16 * h) & 0xffffu, kiln_f32_to_f16(qv), "1024 + q - 1024 = q (%g)", (double)qv);
            cr_assert_eq((r[4] >> 16 * h) & 0xffffu, kiln_f32_to_f16(fmaf(qv, f1, f3)), "q a + b rounded once");
        }
    }
    prints_both_and_assembles(&k, "\tfma.rn.f16x2 %r", "\tprmt.b32 %r");
    kiln_kir_free(&k);
}

/* Named barriers print as bar.sync / bar.arrive with the id as a constant or a register and the
 * thread count, assemble (also for sm_80: they are not Hopper's), and the GLSL printer refuses them. */
Test(ptx, named_barriers_print)
{
    kiln_kir k;
    kiln_kir_init(&k, "nbar", 256);
    uint32_t tid = kiln_kir_op(&k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t id = kiln_kaddi(&k, kiln_kshri(&k, tid, 7), 1);
    kiln_kir_op(&k, KILN_KOP_NBAR_SYNC, KILN_KT_NONE, id, KILN_IDX_NONE, KILN_IDX_NONE, 256 << 8);
    kiln_kir_op(&k, KILN_KOP_NBAR_ARRIVE, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 128 << 8 | 3);
    char err[512] = "";
    cr_assert(kiln_kir_verify(&k, err, sizeof err), "%s", err);
    for (int sm = 80; sm <= 90; sm += 10) {
        char *txt = print_ok(&k, sm);
        cr_assert(strstr(txt, "\tbar.sync %r") && strstr(txt, ", 256;\n") && strstr(txt, "\tbar.arrive 3, 128;\n"), "%s", txt);
        assemble_ok(txt, sm, "named barriers");
        free(txt);
    }
    char *glsl = NULL;
    cr_assert_neq(kiln_spv_glsl(&k, NULL, &glsl, err, sizeof err), KILN_OK, "GLSL printed a named barrier");
    free(glsl);
    kiln_kir k2;
    kiln_kir_init(&k2, "nbar_bad", 256);
    kiln_kir_op(&k2, KILN_KOP_NBAR_SYNC, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 100 << 8 | 1); /* not whole warps */
    cr_assert(!kiln_kir_verify(&k2, err, sizeof err) && strstr(err, "named barrier"), "%s", err);
    kiln_kir_free(&k2);
    kiln_kir_free(&k);
}

/* The warpgroup flash kernels (kiln_attn_flash_wg) among g's regions lowered for tg, assembled for
 * sm_90a: asserts no spills; returns how many. */
/* Assembles g's kernels named `name` for sm_90a (no spills, WGMMAs kept asynchronous); returns how many. */
static int assemble_named(const kiln_graph *g, const kiln_lower_target *tg, const char *ptxas, const char *what, const char *name)
{
    kiln_fusion f;
    char err[8192] = "";
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    int found = 0;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        uint32_t nk = 0;
        if (kiln_lower_region_for(g, &f.regions[r], tg, ks, &nk, err, sizeof err) != KILN_OK) continue;
        for (uint32_t i = 0; i < nk; i++) {
            if (!strcmp(ks[i].name, name)) {
                char *txt = NULL;
                unsigned flags;
                kiln_ptxas_report rep;
                kiln_status s = kiln_ptx_print_assembled(ptxas, &ks[i], 90, &txt, &flags, NULL, &rep, err, sizeof err);
                cr_assert_eq(s, KILN_OK, "%s: %s", what, err);
                cr_assert_eq(rep.spill_stores + rep.spill_loads + rep.stack, 0, "%s: %d/%d spill bytes, stack %d:\n%s", what,
                             rep.spill_stores, rep.spill_loads, rep.stack, rep.log);
                /* ptxas falls back to one WGMMA at a time (C7513/C7510) when a register an in-flight WGMMA reads may be written */
                cr_assert(!strstr(rep.log, "serialized") && !strstr(rep.log, "setmaxnreg' ignored"), "%s: ptxas:\n%s", what, rep.log);
                cr_log_info("%s: %s, %d registers at entry, %u B dynamic shared", what, name, rep.regs,
                            (unsigned)kiln_kir_shared_bytes(&ks[i]));
                free(txt);
                found++;
            }
            kiln_kir_free(&ks[i]);
        }
    }
    kiln_fusion_free(&f);
    return found;
}

static int assemble_flash_wg(const kiln_graph *g, const kiln_lower_target *tg, const char *ptxas, const char *what)
{
    return assemble_named(g, tg, ptxas, what, "kiln_attn_flash_wg");
}

/* The TMA GEMM's wide tiles (codegen.gemm_cols 192 / 256: two accumulators side by side) on the
 * 512-token llama-7b (normal rope) and qwen2-7b (neox, 128-wide heads: 256 only for QKV) layers
 * under precision f16 assemble for sm_90a with no spills, WGMMAs asynchronous. */
Test(ptx, wide_gemm_tiles_assemble, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    kiln_lower_target tg = kiln_lower_target_for_sm(90);
    tg.opts.precision = KILN_PREC_F16;
    static const char *const presets[] = {"llama-7b", "qwen2-7b"};
    for (int p = 0; p < 2; p++)
        for (int c = 0; c < 2; c++) {
            tg.opts.gemm_cols = c ? 256 : 192;
            tg.opts.gemm_splitk = KILN_GEMM_OFF; /* the plan's GEMMs alone (no split-K variant for few rows) */
            kiln_preset_build_opts o = {.wdtype = KILN_DTYPE_F16, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096,
                                        .max_tok = 512, .seed = 1, .shape_only = true};
            kiln_graph *g = NULL;
            char err[512] = "", what[64];
            cr_assert_eq(kiln_preset_build_ex(kiln_preset_find(presets[p]), &o, &g, err, sizeof err), KILN_OK, "%s", err);
            snprintf(what, sizeof what, "%s, %d columns a block", presets[p], tg.opts.gemm_cols);
            cr_assert_eq(assemble_named(g, &tg, ptxas, what, "kiln_gemm_tma"), 4, "%s: four TMA GEMMs", what);
            kiln_graph_free(g);
        }
}

/* The persistent ping-pong GEMM (codegen.gemm_persist): llama-7b and qwen2-7b layers at 512 tokens
 * (f16 and exact precision: x in one and two parts) and 64 tokens (O and down split K: the reduce
 * kernels) assemble for sm_90a with no spills, WGMMAs asynchronous. */
Test(ptx, persistent_gemm_assembles, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    kiln_lower_target tg = kiln_lower_target_for_sm(90);
    tg.opts.gemm_persist = KILN_GEMM_ON;
    static const char *const presets[] = {"llama-7b", "qwen2-7b", "llama-7b", "llama-7b"};
    static const int32_t prec[] = {KILN_PREC_F16, KILN_PREC_F16, KILN_PREC_EXACT, KILN_PREC_F16};
    static const int64_t tok[] = {512, 512, 512, 64};
    for (int p = 0; p < 4; p++) {
        tg.opts.precision = prec[p];
        kiln_preset_build_opts o = {.wdtype = KILN_DTYPE_F16, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096,
                                    .max_tok = tok[p], .seed = 1, .shape_only = true};
        kiln_graph *g = NULL;
        char err[512] = "", what[96];
        cr_assert_eq(kiln_preset_build_ex(kiln_preset_find(presets[p]), &o, &g, err, sizeof err), KILN_OK, "%s", err);
        snprintf(what, sizeof what, "%s, %lld tokens, %s, persistent", presets[p], (long long)tok[p], prec[p] ? "f16" : "exact");
        /* at 512 tokens the regions whose tiles few rows leave idle (O, down; qwen2-7b's QKV too) also get
           the split-K GEMM and its reduce kernel for runs of 9..64 rows (lower.c splitk_variant) */
        int tma = assemble_named(g, &tg, ptxas, what, "kiln_gemm_tma");
        if (tok[p] == 512) {
            int red = assemble_named(g, &tg, ptxas, what, "kiln_gemm_reduce");
            cr_assert(red >= 2 && tma == 4 + red, "%s: %d TMA GEMMs, %d reduce kernels (four + one a split variant)", what, tma, red);
        } else {
            cr_assert_eq(tma, 4, "%s: four TMA GEMMs", what);
        }
        if (tok[p] == 64) cr_assert_eq(assemble_named(g, &tg, ptxas, what, "kiln_gemm_reduce"), 2, "%s: O and down split K", what);
        kiln_graph_free(g);
    }
}

/* Prefill attention's warpgroup flash kernel (sm_90a, codegen.precision f16; lower_flash_wg.c):
 * llama-7b (head_dim 128, 32 heads) and qwen2-0.5b (head_dim 64, 7 query heads a kv head) with
 * f16 caches, an attention over a bf16 cache, and gemma's soft-capped, windowed attention at head_dim
 * 256 and 128 assemble for sm_90a with no spills (llama-7b also without the ping-pong, in 64-row
 * blocks and with key splits of 2 and 4; masked head_dim 128 in 64-row blocks, head_dim 256 split), and ptxas
 * keeps the WGMMAs asynchronous (no serialization notice: P V overlaps the next softmax). */
Test(ptx, flash_wg_assembles, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    kiln_lower_target tg = kiln_lower_target_for_sm(90);
    tg.opts.precision = KILN_PREC_F16;
    /* the A/B variants too: no ping-pong; 64-row blocks (two an SM: 216 registers a consumer thread);
     * key splits over clusters of 2 and 4; 64 rows with a split of 2 */
    static const char *const presets[] = {"llama-7b", "qwen2-0.5b", "llama-7b", "llama-7b", "llama-7b", "llama-7b", "llama-7b", "qwen2-0.5b"};
    static const char *const variant[] = {"llama-7b", "qwen2-0.5b (64 rows: its 512-token grid is small)", "llama-7b, no ping-pong",
                                          "llama-7b, 64 rows", "llama-7b, split 2", "llama-7b, split 4", "llama-7b, 64 rows, split 2",
                                          "qwen2-0.5b, 128 rows, no split"};
    static const int32_t rows[] = {0, 0, 0, 64, 0, 0, 64, 128}, split[] = {0, 0, 0, 0, 2, 4, 2, 1};
    for (int p = 0; p < 8; p++) {
        tg.opts.flash_wg = p == 2 ? KILN_FLASH_WG_NO_PINGPONG : 0;
        tg.opts.flash_rows = rows[p], tg.opts.flash_split = split[p];
        kiln_preset_build_opts o = {.wdtype = KILN_DTYPE_F16, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096, .max_tok = 512,
                                    .seed = 1, .shape_only = true};
        kiln_graph *g = NULL;
        char err[512] = "";
        cr_assert_eq(kiln_preset_build_ex(kiln_preset_find(presets[p]), &o, &g, err, sizeof err), KILN_OK, "%s", err);
        cr_assert_eq(assemble_flash_wg(g, &tg, ptxas, variant[p]), 1, "%s: one warpgroup flash kernel", variant[p]);
        kiln_graph_free(g);
    }
    tg.opts.flash_wg = 0, tg.opts.flash_rows = 0, tg.opts.flash_split = 0;
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim ts = kiln_sym(g, "t", 4096), ks = kiln_sym(g, "n_kv", 4096);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){ts, 32, 128});
    kiln_node kc = kiln_state(g, "k", KILN_DTYPE_BF16, 3, (kiln_dim[]){8, 4096, 128});
    kiln_node vc = kiln_state(g, "v", KILN_DTYPE_BF16, 3, (kiln_dim[]){8, 4096, 128});
    kiln_output(g, kiln_attention(g, q, kc, vc, ks, 0), "y");
    cr_assert_eq(assemble_flash_wg(g, &tg, ptxas, "bf16 cache, 32/8 heads"), 1, "bf16 cache: one warpgroup flash kernel");
    kiln_graph_free(g);
    /* gemma: head_dim 256 (O in two accumulators, 64-key tiles) with the soft-cap and a window; head_dim 128 masked */
    static const struct { int64_t H, Hkv, hd; float cap; int64_t win; } gm[] = {
        {16, 8, 256, 50.0f, 4096}, {32, 16, 128, 50.0f, 1024}, {32, 16, 128, 50.0f, 1024}, {16, 8, 256, 50.0f, 4096}};
    for (int i = 0; i < 4; i++) { /* the masked head_dim 128 also in 64-row blocks, head_dim 256 split over 2 */
        tg.opts.flash_rows = i == 2 ? 64 : 0, tg.opts.flash_split = i == 3 ? 2 : 0;
        cr_assert_eq(kiln_graph_new(&g), KILN_OK);
        ts = kiln_sym(g, "t", 4096), ks = kiln_sym(g, "n_kv", 8192);
        q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){ts, gm[i].H, gm[i].hd});
        kc = kiln_state(g, "k", KILN_DTYPE_F16, 3, (kiln_dim[]){gm[i].Hkv, 8192, gm[i].hd});
        vc = kiln_state(g, "v", KILN_DTYPE_F16, 3, (kiln_dim[]){gm[i].Hkv, 8192, gm[i].hd});
        kiln_output(g, kiln_attention_ext(g, q, kc, vc, ks, 0, gm[i].cap, gm[i].win), "y");
        char what[96];
        snprintf(what, sizeof what, "hd %lld, %lld/%lld heads, soft-cap %g, window %lld%s", (long long)gm[i].hd, (long long)gm[i].H,
                 (long long)gm[i].Hkv, (double)gm[i].cap, (long long)gm[i].win, i == 2 ? ", 64 rows" : i == 3 ? ", split 2" : "");
        cr_assert_eq(assemble_flash_wg(g, &tg, ptxas, what), 1, "%s: one warpgroup flash kernel", what);
        kiln_graph_free(g);
    }
}

/* Decode attention as one cluster kernel (codegen.attn_cluster, lower_attn.c: a group's key splits
 * are a thread block cluster's blocks that combine through distributed shared memory, kir LDS_CL):
 * qwen2-0.5b (7 query heads a kv head, 8 blocks x 4 warps) and llama-7b (head_dim 128, 2 warps a
 * block) at a 1058-row cache, with and without programmatic dependent launch, and qwen2-7b at a
 * 300-row one (one-warp blocks) assemble for sm_90 with no spills; the split and combine kernels
 * are gone. */
Test(ptx, attn_cluster_assembles_for_sm90, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    static const struct { const char *preset; int64_t ctx; int32_t pdl; } cases[] = {
        {"qwen2-0.5b", 1058, 0}, {"qwen2-0.5b", 1058, KILN_PDL_REGS}, {"llama-7b", 1058, KILN_GEMM_ON}, {"qwen2-7b", 300, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kiln_lower_target tg = kiln_lower_target_for_sm(90);
        tg.opts.attn_cluster = KILN_GEMM_ON, tg.opts.pdl = cases[c].pdl;
        kiln_preset_build_opts o = {.wdtype = KILN_DTYPE_F16, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = cases[c].ctx,
                                    .max_tok = 1, .seed = 1, .shape_only = true};
        kiln_graph *g = NULL;
        char err[8192] = "", what[128];
        cr_assert_eq(kiln_preset_build_ex(kiln_preset_find(cases[c].preset), &o, &g, err, sizeof err), KILN_OK, "%s", err);
        snprintf(what, sizeof what, "%s decode, %lld-row cache, pdl %d", cases[c].preset, (long long)cases[c].ctx, cases[c].pdl);
        kiln_fusion f;
        cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
        int found = 0, split = 0;
        for (uint32_t r = 0; r < f.n_regions; r++) {
            kiln_kir ks[KILN_LOWER_MAX];
            uint32_t nk = 0;
            cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &tg, ks, &nk, err, sizeof err), KILN_OK, "%s: %s", what, err);
            for (uint32_t i = 0; i < nk; i++) {
                split += !strncmp(ks[i].name, "kiln_attn_split", 15) || !strncmp(ks[i].name, "kiln_attn_combine", 17);
                if (!strcmp(ks[i].name, "kiln_attn_decode")) {
                    char *txt = NULL;
                    unsigned flags;
                    kiln_ptxas_report rep;
                    kiln_status s = kiln_ptx_print_assembled(ptxas, &ks[i], 90, &txt, &flags, NULL, &rep, err, sizeof err);
                    cr_assert_eq(s, KILN_OK, "%s: %s", what, err);
                    cr_assert(strstr(txt, "ld.shared::cluster.f32") && strstr(txt, ".reqnctapercluster"), "%s: no cluster loads", what);
                    cr_assert_eq(rep.spill_stores + rep.spill_loads + rep.stack, 0, "%s: %d/%d spill bytes, stack %d:\n%s", what,
                                 rep.spill_stores, rep.spill_loads, rep.stack, rep.log);
                    cr_log_info("%s: %s, cluster %u, %u threads, %d registers", what, ks[i].what, ks[i].cluster, ks[i].block, rep.regs);
                    free(txt);
                    found++;
                }
                kiln_kir_free(&ks[i]);
            }
        }
        kiln_fusion_free(&f);
        kiln_graph_free(g);
        cr_assert_eq(found, 1, "%s: %d cluster decode kernels", what, found);
        cr_assert_eq(split, 0, "%s: split/combine kernels remain", what);
    }
}

/* Paged decode's coalesced split kernels (codegen.paged_decode, lower_attn.c co_tile: a key row's
 * 16-byte chunks over consecutive lanes, q.k by group reductions): llama-7b (MHA, head_dim 128)
 * serving steps of 64 sequences (blocks of 16 and 128, a plan holding a 512-token chunk) assemble for
 * sm_90 with no spills; qwen2-7b's 7 query heads a kv head keep the lane-a-key kernel. */
Test(ptx, paged_decode_assembles_for_sm90, .timeout = 600)
{
    char ptxas[1024];
    if (!kiln_ptx_find_ptxas(ptxas, sizeof ptxas)) cr_skip("ptxas not found ($KILN_PTXAS, PATH, /usr/local/cuda/bin)");
    static const struct { const char *preset; int64_t block; int co; } cases[] = {{"llama-7b", 16, 1}, {"llama-7b", 128, 1}, {"qwen2-7b", 16, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kiln_lower_target tg = kiln_lower_target_for_sm(90);
        tg.opts.paged_decode = KILN_GEMM_ON;
        int64_t mb = 2064 / cases[c].block + 1;
        kiln_preset_build_opts o = {.wdtype = KILN_DTYPE_F16, .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 64 * mb * cases[c].block,
                                    .max_tok = 64 + 511, .seed = 1, .shape_only = true, .block = cases[c].block, .max_seqs = 64,
                                    .max_blocks = mb};
        kiln_graph *g = NULL;
        char err[8192] = "", what[128];
        cr_assert_eq(kiln_preset_build_ex(kiln_preset_find(cases[c].preset), &o, &g, err, sizeof err), KILN_OK, "%s", err);
        snprintf(what, sizeof what, "%s serve, block %lld", cases[c].preset, (long long)cases[c].block);
        kiln_fusion f;
        cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
        int found = 0;
        for (uint32_t r = 0; r < f.n_regions; r++) {
            kiln_kir ks[KILN_LOWER_MAX];
            uint32_t nk = 0;
            cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &tg, ks, &nk, err, sizeof err), KILN_OK, "%s: %s", what, err);
            for (uint32_t i = 0; i < nk; i++) {
                if (!strncmp(ks[i].name, "kiln_attn_", 10) && strncmp(ks[i].name, "kiln_attn_flash", 15)) {
                    char *txt = NULL;
                    unsigned flags;
                    kiln_ptxas_report rep;
                    kiln_status s = kiln_ptx_print_assembled(ptxas, &ks[i], 90, &txt, &flags, NULL, &rep, err, sizeof err);
                    cr_assert_eq(s, KILN_OK, "%s, %s: %s", what, ks[i].name, err);
                    cr_assert_eq(rep.spill_stores + rep.spill_loads + rep.stack, 0, "%s, %s: %d/%d spill bytes, stack %d:\n%s", what,
                                 ks[i].name, rep.spill_stores, rep.spill_loads, rep.stack, rep.log);
                    cr_log_info("%s: %s (%s), grid %u x %u, %u threads, %d registers", what, ks[i].name, ks[i].what, ks[i].grid[0],
                                ks[i].grid[1], ks[i].block, rep.regs);
                    found += strstr(ks[i].what, "coalesced") != NULL;
                    free(txt);
                }
                kiln_kir_free(&ks[i]);
            }
        }
        kiln_fusion_free(&f);
        kiln_graph_free(g);
        cr_assert_eq(found, cases[c].co, "%s: %d coalesced split kernels", what, found);
    }
}
