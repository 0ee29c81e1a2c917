/* The PTX printer: one kir kernel -> one PTX module with one .entry, for sm_80 .. sm_90. One table
 * of op -> instruction text and one loop over the instructions; virtual registers are numbered
 * per class in program order, so the same kernel always prints the same bytes. Must not change
 * what the kernel computes (target fix-ups belong to the lowering) and must not call the driver. */
#include "ptx/ptx.h"
#include "util/sbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ text */

typedef kiln_sbuf sbuf;

/* ------------------------------------------------------------------ registers */

enum rcls { RC_P = 0, RC_H, RC_R, RC_F, RC_D, RC_COUNT };
static const char *const rc_name[RC_COUNT] = {"%p", "%h", "%r", "%f", "%rd"};
static const char *const rc_type[RC_COUNT] = {".pred", ".b16", ".b32", ".f32", ".b64"};

typedef struct rname {
    char s[24]; /* "%r12" */
} rname;

#define MAX_DEPTH 64

typedef struct pstate {
    const kiln_kir *k;                        /* the kernel */
    sbuf            pro;                      /* entry code: buffer bases, parameters, shared bases */
    sbuf            body;                     /* the instructions */
    uint32_t        n_reg[RC_COUNT];          /* registers used per class */
    uint32_t       *reg;                      /* reg[i]: register number of value i in its class */
    uint32_t        sbase[KILN_KIR_MAX_SHARED]; /* R register holding each shared array's address */
    uint32_t        red_base;                 /* R register holding the reduction scratch's address */
    uint32_t        tmap[KILN_KIR_MAX_TMAPS]; /* RD register holding each tensor map's generic address */
    uint32_t        red_words;                /* reduction scratch (block / 32 words when needed) */
    uint32_t        open[MAX_DEPTH];          /* open LOOP/IF instructions */
    bool            has_else[MAX_DEPTH];      /* the open IF has had its ELSE */
    uint32_t        depth;                    /* open blocks */
    uint32_t        loop_depth;               /* open loops */
    kiln_ptx_stats  st;                       /* what was printed */
} pstate;

static enum rcls cls_of(uint8_t t) { return t == KILN_KT_PRED ? RC_P : t == KILN_KT_F32 || t == KILN_KT_F4 || t == KILN_KT_W64 ? RC_F : RC_R; }

static uint32_t new_reg(pstate *p, enum rcls c) { return p->n_reg[c]++; }

static rname nreg(enum rcls c, uint32_t n)
{
    rname r;
    size_t l = strlen(rc_name[c]);
    memcpy(r.s, rc_name[c], l);
    char rev[12];
    int k = 0;
    do rev[k++] = (char)('0' + n % 10), n /= 10; while (n);
    while (k && l + 1 < sizeof r.s) r.s[l++] = rev[--k];
    r.s[l] = 0;
    return r;
}

/* The register of value v (lane 0 of a V4 or an F4). */
static rname vreg(const pstate *p, uint32_t v) { return nreg(cls_of(p->k->ins[v].type), p->reg[v]); }

/* Allocates value i's register(s) (four consecutive R for a V4, F for an F4) and returns its name. */
static rname def(pstate *p, uint32_t i)
{
    uint8_t t = p->k->ins[i].type;
    p->reg[i] = new_reg(p, cls_of(t));
    if (t == KILN_KT_V4) p->n_reg[RC_R] += 3;
    if (t == KILN_KT_F4) p->n_reg[RC_F] += 3;
    if (t == KILN_KT_W64) p->n_reg[RC_F] += 63;
    return vreg(p, i);
}

/* Lanes of an F4 or W64 value. */
static int lanes_of(uint8_t t) { return t == KILN_KT_F4 ? 4 : t == KILN_KT_W64 ? 64 : 1; }

/* Lane j of an F4 value's registers. */
static rname f4reg(const pstate *p, uint32_t v, int j) { return nreg(RC_F, p->reg[v] + (uint32_t)j); }

/* D = A . B + C on the tensor cores; the four result registers are fresh (C is read, not reused). */
static void print_mma(pstate *p, uint32_t i)
{
    const kiln_kinst *in = &p->k->ins[i];
    def(p, i);
    uint32_t a = p->reg[in->a], b = p->reg[in->b] + ((in->imm.u & 2) ? 2 : 0);
    const char *et = (in->imm.u & 1) ? "bf16" : "f16";
    kiln_sbuf_printf(&p->body, "\tmma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 {%s, %s, %s, %s}, {%%r%u, %%r%u, %%r%u, %%r%u}, {%%r%u, %%r%u}, {%s, %s, %s, %s};\n",
        et, et, f4reg(p, i, 0).s, f4reg(p, i, 1).s, f4reg(p, i, 2).s, f4reg(p, i, 3).s, a, a + 1, a + 2, a + 3, b, b + 1,
        f4reg(p, in->c, 0).s, f4reg(p, in->c, 1).s, f4reg(p, in->c, 2).s, f4reg(p, in->c, 3).s);
    p->st.mmas++;
}

/* The 64-bit shared-memory matrix descriptor of the tile at byte address `addr`: without swizzle,
 * leading byte offset 128 (the next core matrix along k); with the 128-byte swizzle (layout type 1
 * in bits 62-63), leading byte offset lbo16 * 16 (MN-major: the next 64 columns; 16, unused, for
 * K-major); stride byte offset sbo16 * 16. */
static rname wg_desc(pstate *p, uint32_t addr, uint32_t sbo16, uint32_t lbo16, bool swz)
{
    rname d = nreg(RC_D, new_reg(p, RC_D));
    kiln_sbuf_printf(&p->body, "\tcvt.u64.u32 %s, %s;\n\tshr.u64 %s, %s, 4;\n\tand.b64 %s, %s, 0x3FFF;\n", d.s, vreg(p, addr).s, d.s, d.s,
        d.s, d.s);
    uint64_t hi = swz ? ((uint64_t)(lbo16 ? lbo16 : 1) << 16 | 1ull << 62) : 8ull << 16;
    kiln_sbuf_printf(&p->body, "\tor.b64 %s, %s, 0x%llX;\n", d.s, d.s, (unsigned long long)(hi | (uint64_t)sbo16 << 32));
    return d;
}

/* W64 variable a += A . B: wgmma.mma_async m64nNk16 (kir.h's flags: N, A from shared memory or
 * registers, B K-major or MN-major). */
static void print_wgmma(pstate *p, uint32_t i)
{
    const kiln_kinst *in = &p->k->ins[i];
    uint32_t sbo16 = in->imm.u >> 8 & 0xff, lbo16 = in->imm.u >> 16 & 0x3fff, n = (in->imm.u >> 4 & 15) ? 16 * (in->imm.u >> 4 & 15) : 128;
    bool swz = in->imm.u & 2, rega = in->imm.u & 4, trans = in->imm.u & 8;
    char a[96];
    if (rega) {
        uint32_t r = p->reg[in->b];
        snprintf(a, sizeof a, "{%%r%u, %%r%u, %%r%u, %%r%u}", r, r + 1, r + 2, r + 3);
    } else {
        snprintf(a, sizeof a, "%s", wg_desc(p, in->b, sbo16, 0, swz).s);
    }
    rname db = wg_desc(p, in->c, sbo16, trans ? lbo16 : 0, swz);
    const char *et = (in->imm.u & 1) ? "bf16" : "f16";
    kiln_sbuf_printf(&p->body, "\twgmma.mma_async.sync.aligned.m64n%uk16.f32.%s.%s {", n, et, et);
    for (uint32_t j = 0; j < n / 2; j++) kiln_sbuf_printf(&p->body, "%s%s", j ? ", " : "", nreg(RC_F, p->reg[in->a] + j).s);
    if (rega) kiln_sbuf_printf(&p->body, "}, %s, %s, 1, 1, 1, %d;\n", a, db.s, trans ? 1 : 0);
    else kiln_sbuf_printf(&p->body, "}, %s, %s, 1, 1, 1, 0, %d;\n", a, db.s, trans ? 1 : 0);
    p->st.mmas++;
}

/* ------------------------------------------------------------------ the op table */

/* Column of an instruction type in op_table. */
static int col_of(uint8_t t) { return t == KILN_KT_I32 ? 0 : t == KILN_KT_U32 ? 1 : t == KILN_KT_F32 ? 2 : 3; }

typedef struct op_row {
    uint8_t     arity; /* value operands printed after the result: 1..3 */
    bool        cmp;   /* instruction type from operand a's type (comparisons), else from the result */
    const char *text[4]; /* per type: i32, u32, f32, pred; NULL: not defined for that type */
} op_row;

/* Ops printed as one instruction "text d, a[, b[, c]]". ADD/SUB/MUL on f32 carry .rn so that ptxas
 * never contracts them into an fma the lowering did not write (results match the other printers). */
static const op_row op_table[KILN_KOP_COUNT] = {
    [KILN_KOP_ADD] = {2, false, {"add.s32", "add.u32", "add.rn.f32"}},
    [KILN_KOP_SUB] = {2, false, {"sub.s32", "sub.u32", "sub.rn.f32"}},
    [KILN_KOP_MUL] = {2, false, {"mul.lo.s32", "mul.lo.u32", "mul.rn.f32"}},
    [KILN_KOP_DIV] = {2, false, {"div.s32", "div.u32", "div.rn.f32"}},
    [KILN_KOP_REM] = {2, false, {"rem.s32", "rem.u32"}},
    [KILN_KOP_MIN] = {2, false, {"min.s32", "min.u32", "min.f32"}},
    [KILN_KOP_MAX] = {2, false, {"max.s32", "max.u32", "max.f32"}},
    [KILN_KOP_FMA] = {3, false, {NULL, NULL, "fma.rn.f32"}},
    [KILN_KOP_HFMA2] = {3, false, {NULL, "fma.rn.f16x2"}},
    [KILN_KOP_PRMT] = {3, false, {NULL, "prmt.b32"}},
    [KILN_KOP_NEG] = {1, false, {"neg.s32", NULL, "neg.f32"}},
    [KILN_KOP_ABS] = {1, false, {"abs.s32", NULL, "abs.f32"}},
    [KILN_KOP_AND] = {2, false, {"and.b32", "and.b32"}},
    [KILN_KOP_OR] = {2, false, {"or.b32", "or.b32"}},
    [KILN_KOP_XOR] = {2, false, {"xor.b32", "xor.b32"}},
    [KILN_KOP_SHL] = {2, false, {"shl.b32", "shl.b32"}},
    [KILN_KOP_SHR] = {2, false, {"shr.s32", "shr.u32"}},
    [KILN_KOP_EX2] = {1, false, {NULL, NULL, "ex2.approx.ftz.f32"}},
    [KILN_KOP_LG2] = {1, false, {NULL, NULL, "lg2.approx.f32"}},
    [KILN_KOP_RSQRT] = {1, false, {NULL, NULL, "rsqrt.approx.f32"}},
    [KILN_KOP_SQRT] = {1, false, {NULL, NULL, "sqrt.rn.f32"}},
    [KILN_KOP_SIN] = {1, false, {NULL, NULL, "sin.approx.f32"}},
    [KILN_KOP_COS] = {1, false, {NULL, NULL, "cos.approx.f32"}},
    [KILN_KOP_FLOOR] = {1, false, {NULL, NULL, "cvt.rmi.f32.f32"}},
    [KILN_KOP_RINT] = {1, false, {NULL, NULL, "cvt.rni.f32.f32"}},
    /* f32 comparisons are ordered (false with a NaN) except NE, which is true with a NaN, as in C */
    [KILN_KOP_LT] = {2, true, {"setp.lt.s32", "setp.lt.u32", "setp.lt.f32"}},
    [KILN_KOP_LE] = {2, true, {"setp.le.s32", "setp.le.u32", "setp.le.f32"}},
    [KILN_KOP_EQ] = {2, true, {"setp.eq.s32", "setp.eq.u32", "setp.eq.f32"}},
    [KILN_KOP_NE] = {2, true, {"setp.ne.s32", "setp.ne.u32", "setp.neu.f32"}},
    [KILN_KOP_PAND] = {2, false, {NULL, NULL, NULL, "and.pred"}},
    [KILN_KOP_POR] = {2, false, {NULL, NULL, NULL, "or.pred"}},
    [KILN_KOP_PNOT] = {1, false, {NULL, NULL, NULL, "not.pred"}},
    [KILN_KOP_BITCAST] = {1, false, {"mov.b32", "mov.b32", "mov.b32"}},
};

static void count_op(pstate *p, const kiln_kinst *in)
{
    if (in->op >= KILN_KOP_LT && in->op <= KILN_KOP_PNOT) return;
    if (in->op == KILN_KOP_BITCAST) return;
    if (in->type == KILN_KT_F32) p->st.f32_ops++;
    else p->st.int_ops++;
}

/* ------------------------------------------------------------------ memory */

/* 64-bit address of word/half index value `idx` in buffer slot `slot`: base + idx * scale. */
static rname gaddr(pstate *p, uint32_t slot, uint32_t idx, int scale)
{
    rname a = nreg(RC_D, new_reg(p, RC_D));
    kiln_sbuf_printf(&p->body, "\tmul.wide.s32 %s, %s, %d;\n", a.s, vreg(p, idx).s, scale);
    kiln_sbuf_printf(&p->body, "\tadd.s64 %s, %s, %s;\n", a.s, nreg(RC_D, slot).s, a.s);
    return a;
}

/* 32-bit shared address of element `idx` of the array whose base is in R register `base`. */
static rname saddr(pstate *p, uint32_t base, uint32_t idx)
{
    rname a = nreg(RC_R, new_reg(p, RC_R));
    kiln_sbuf_printf(&p->body, "\tmad.lo.s32 %s, %s, 4, %s;\n", a.s, vreg(p, idx).s, nreg(RC_R, base).s);
    return a;
}

static void print_mem(pstate *p, uint32_t i)
{
    const kiln_kinst *in = &p->k->ins[i];
    uint32_t slot = in->imm.u;
    /* .nc promises the data is read-only for the kernel's lifetime: under programmatic dependent
     * launch that holds only for slots no kernel writes (the previous one may still be writing) */
    bool nc = slot < p->k->n_bufs && !p->k->bufs[slot].written && (!p->k->pdl || (slot < 32 && (p->k->pdl_const >> slot & 1)));
    const char *g = nc ? "global.nc" : "global";
    switch (in->op) {
    case KILN_KOP_LD: {
        rname a = gaddr(p, slot, in->a, 4), d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tld.%s.u32 %s, [%s];\n", g, d.s, a.s);
        p->st.ld32++, p->st.ld_nc += nc, p->st.loop_loads += p->loop_depth > 0;
        break;
    }
    case KILN_KOP_LD4: {
        rname a = gaddr(p, slot, in->a, 4);
        def(p, i);
        uint32_t r = p->reg[i];
        kiln_sbuf_printf(&p->body, "\tld.%s.v4.u32 {%%r%u, %%r%u, %%r%u, %%r%u}, [%s];\n", g, r, r + 1, r + 2, r + 3, a.s);
        p->st.ld128++, p->st.ld_nc += nc, p->st.loop_loads += p->loop_depth > 0;
        break;
    }
    case KILN_KOP_ST: {
        rname a = gaddr(p, slot, in->a, 4);
        kiln_sbuf_printf(&p->body, "\tst.global.u32 [%s], %s;\n", a.s, vreg(p, in->b).s);
        p->st.st32++;
        break;
    }
    case KILN_KOP_ST4: {
        rname a = gaddr(p, slot, in->a, 4);
        uint32_t r = p->reg[in->b];
        kiln_sbuf_printf(&p->body, "\tst.global.v4.u32 [%s], {%%r%u, %%r%u, %%r%u, %%r%u};\n", a.s, r, r + 1, r + 2, r + 3);
        p->st.st128++;
        break;
    }
    case KILN_KOP_ST16: {
        rname a = gaddr(p, slot, in->a, 2), h = nreg(RC_H, new_reg(p, RC_H));
        kiln_sbuf_printf(&p->body, "\tcvt.u16.u32 %s, %s;\n", h.s, vreg(p, in->b).s);
        kiln_sbuf_printf(&p->body, "\tst.global.u16 [%s], %s;\n", a.s, h.s);
        p->st.st16++;
        break;
    }
    case KILN_KOP_PREFETCH: {
        rname a = gaddr(p, slot, in->a, 4);
        kiln_sbuf_printf(&p->body, "\tprefetch.global.L2 [%s];\n", a.s);
        break;
    }
    case KILN_KOP_LDS4: {
        rname a = saddr(p, p->sbase[slot], in->a);
        def(p, i);
        uint32_t r = p->reg[i];
        kiln_sbuf_printf(&p->body, "\tld.shared.v4.u32 {%%r%u, %%r%u, %%r%u, %%r%u}, [%s];\n", r, r + 1, r + 2, r + 3, a.s);
        p->st.lds++;
        break;
    }
    case KILN_KOP_LDS: {
        rname a = saddr(p, p->sbase[slot], in->a), d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tld.shared.%s %s, [%s];\n", in->type == KILN_KT_F32 ? "f32" : "u32", d.s, a.s);
        p->st.lds++;
        break;
    }
    case KILN_KOP_STS4: {
        rname a = saddr(p, p->sbase[slot], in->a);
        uint32_t r = p->reg[in->b];
        kiln_sbuf_printf(&p->body, "\tst.shared.v4.u32 [%s], {%%r%u, %%r%u, %%r%u, %%r%u};\n", a.s, r, r + 1, r + 2, r + 3);
        p->st.sts++;
        break;
    }
    case KILN_KOP_STS: {
        rname a = saddr(p, p->sbase[slot], in->a);
        kiln_sbuf_printf(&p->body, "\tst.shared.%s [%s], %s;\n", p->k->ins[in->b].type == KILN_KT_F32 ? "f32" : "u32", a.s,
            vreg(p, in->b).s);
        p->st.sts++;
        break;
    }
    default: break;
    }
}

/* ------------------------------------------------------------------ reductions */

/* Value i = reduction of f32 value a over aligned groups of `grp` threads: butterfly shuffles
 * inside a warp; for groups wider than a warp, each warp's lane 0 writes its total to the
 * scratch, and every thread adds its group's warp totals in warp order (the same order in every
 * thread, so the whole group gets the same bits). The trailing barrier lets the next reduction
 * reuse the scratch. */
static void print_reduce(pstate *p, uint32_t i)
{
    const kiln_kinst *in = &p->k->ins[i];
    uint32_t grp = in->imm.u & 0xffff;
    const char *op = (in->imm.u >> 16) == KILN_KRED_MAX ? "max.f32" : "add.rn.f32";
    rname x = def(p, i);
    kiln_sbuf_printf(&p->body, "\tmov.f32 %s, %s;\n", x.s, vreg(p, in->a).s);
    for (uint32_t off = (grp < 32 ? grp : 32) / 2; off >= 1; off /= 2) {
        rname t = nreg(RC_F, new_reg(p, RC_F));
        kiln_sbuf_printf(&p->body, "\tshfl.sync.bfly.b32 %s, %s, %u, 31, 0xffffffff;\n", t.s, x.s, off);
        kiln_sbuf_printf(&p->body, "\t%s %s, %s, %s;\n", op, x.s, x.s, t.s);
        p->st.shuffles++;
    }
    p->st.reduces++;
    if (grp <= 32) return;
    uint32_t warps = grp / 32;
    rname tid = nreg(RC_R, new_reg(p, RC_R)), lane = nreg(RC_R, new_reg(p, RC_R)), warp = nreg(RC_R, new_reg(p, RC_R));
    rname own = nreg(RC_R, new_reg(p, RC_R)), first = nreg(RC_R, new_reg(p, RC_R)), from = nreg(RC_R, new_reg(p, RC_R));
    rname lead = nreg(RC_P, new_reg(p, RC_P)), base = nreg(RC_R, p->red_base);
    kiln_sbuf_printf(&p->body, "\tmov.u32 %s, %%tid.x;\n", tid.s);
    kiln_sbuf_printf(&p->body, "\tand.b32 %s, %s, 31;\n", lane.s, tid.s);
    kiln_sbuf_printf(&p->body, "\tsetp.eq.u32 %s, %s, 0;\n", lead.s, lane.s);
    kiln_sbuf_printf(&p->body, "\tshr.u32 %s, %s, 5;\n", warp.s, tid.s);
    kiln_sbuf_printf(&p->body, "\tmad.lo.s32 %s, %s, 4, %s;\n", own.s, warp.s, base.s);
    kiln_sbuf_printf(&p->body, "\t@%s st.shared.f32 [%s], %s;\n", lead.s, own.s, x.s);
    kiln_sbuf_printf(&p->body, "\tbar.sync 0;\n");
    kiln_sbuf_printf(&p->body, "\tand.b32 %s, %s, 0x%X;\n", first.s, warp.s, ~(warps - 1));
    kiln_sbuf_printf(&p->body, "\tmad.lo.s32 %s, %s, 4, %s;\n", from.s, first.s, base.s);
    kiln_sbuf_printf(&p->body, "\tld.shared.f32 %s, [%s];\n", x.s, from.s);
    for (uint32_t w = 1; w < warps; w++) {
        rname t = nreg(RC_F, new_reg(p, RC_F));
        kiln_sbuf_printf(&p->body, "\tld.shared.f32 %s, [%s+%u];\n", t.s, from.s, 4 * w);
        kiln_sbuf_printf(&p->body, "\t%s %s, %s, %s;\n", op, x.s, x.s, t.s);
    }
    kiln_sbuf_printf(&p->body, "\tbar.sync 0;\n");
    p->st.sts++, p->st.lds += warps, p->st.barriers += 2;
}

/* ------------------------------------------------------------------ conversions */

static void print_convert(pstate *p, uint32_t i)
{
    const kiln_kinst *in = &p->k->ins[i];
    uint8_t ta = p->k->ins[in->a].type;
    rname a = vreg(p, in->a);
    switch (in->op) {
    case KILN_KOP_CVT: {
        const char *text = "mov.b32"; /* int <-> int: same bits */
        if (in->type == KILN_KT_F32) text = ta == KILN_KT_I32 ? "cvt.rn.f32.s32" : "cvt.rn.f32.u32";
        else if (ta == KILN_KT_F32) text = in->type == KILN_KT_I32 ? "cvt.rzi.s32.f32" : "cvt.rzi.u32.f32";
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\t%s %s, %s;\n", text, d.s, a.s);
        break;
    }
    case KILN_KOP_H2F: {
        uint32_t h = new_reg(p, RC_H);
        new_reg(p, RC_H);
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tmov.b32 {%%h%u, %%h%u}, %s;\n", h, h + 1, a.s);
        kiln_sbuf_printf(&p->body, "\tcvt.f32.f16 %s, %%h%u;\n", d.s, h + (uint32_t)in->imm.i);
        break;
    }
    case KILN_KOP_B2F: {
        rname t = nreg(RC_R, new_reg(p, RC_R)), d = def(p, i);
        if (in->imm.i == 0) kiln_sbuf_printf(&p->body, "\tshl.b32 %s, %s, 16;\n", t.s, a.s);
        else kiln_sbuf_printf(&p->body, "\tand.b32 %s, %s, 0xFFFF0000;\n", t.s, a.s);
        kiln_sbuf_printf(&p->body, "\tmov.b32 %s, %s;\n", d.s, t.s);
        break;
    }
    case KILN_KOP_F2H: case KILN_KOP_F2B: {
        rname h = nreg(RC_H, new_reg(p, RC_H)), d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tcvt.rn.%s.f32 %s, %s;\n", in->op == KILN_KOP_F2H ? "f16" : "bf16", h.s, a.s);
        kiln_sbuf_printf(&p->body, "\tcvt.u32.u16 %s, %s;\n", d.s, h.s);
        break;
    }
    case KILN_KOP_BFE: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tbfe.%s %s, %s, %d, %d;\n", in->type == KILN_KT_I32 ? "s32" : "u32", d.s, a.s, in->imm.i & 31,
            in->imm.i >> 8);
        break;
    }
    default: break;
    }
    p->st.int_ops += in->op == KILN_KOP_BFE;
}

/* ------------------------------------------------------------------ control flow */

static void print_flow(pstate *p, uint32_t i)
{
    const kiln_kinst *in = &p->k->ins[i];
    switch (in->op) {
    case KILN_KOP_LOOP: {
        rname c = nreg(RC_P, new_reg(p, RC_P));
        kiln_sbuf_printf(&p->body, "$L%u_loop:\n", i);
        kiln_sbuf_printf(&p->body, "\tsetp.lt.s32 %s, %s, %s;\n", c.s, vreg(p, in->a).s, vreg(p, in->b).s);
        kiln_sbuf_printf(&p->body, "\t@!%s bra $L%u_done;\n", c.s, i);
        p->open[p->depth] = i;
        p->has_else[p->depth++] = false;
        p->loop_depth++;
        p->st.loops++;
        break;
    }
    case KILN_KOP_ENDLOOP: {
        uint32_t l = p->open[--p->depth];
        const kiln_kinst *lp = &p->k->ins[l];
        kiln_sbuf_printf(&p->body, "\tadd.s32 %s, %s, %s;\n", vreg(p, lp->a).s, vreg(p, lp->a).s, vreg(p, lp->c).s);
        kiln_sbuf_printf(&p->body, "\tbra $L%u_loop;\n$L%u_done:\n", l, l);
        p->loop_depth--;
        break;
    }
    case KILN_KOP_IF:
        kiln_sbuf_printf(&p->body, "\t@!%s bra $L%u_else;\n", vreg(p, in->a).s, i);
        p->open[p->depth] = i;
        p->has_else[p->depth++] = false;
        p->st.ifs++;
        break;
    case KILN_KOP_ELSE: {
        uint32_t f = p->open[p->depth - 1];
        kiln_sbuf_printf(&p->body, "\tbra $L%u_endif;\n$L%u_else:\n", f, f);
        p->has_else[p->depth - 1] = true;
        break;
    }
    case KILN_KOP_ENDIF: {
        p->depth--;
        kiln_sbuf_printf(&p->body, "$L%u_%s:\n", p->open[p->depth], p->has_else[p->depth] ? "endif" : "else");
        break;
    }
    default: break;
    }
    if (p->depth > p->st.max_depth) p->st.max_depth = p->depth;
}

/* ------------------------------------------------------------------ one instruction */

/* Definitions and copies of registers: constants, special registers, variables, assignments,
 * selects and the lanes of vector values. */
static void print_move(pstate *p, uint32_t i)
{
    const kiln_kinst *in = &p->k->ins[i];
    switch (in->op) {
    case KILN_KOP_CONST: {
        rname d = def(p, i);
        if (in->type == KILN_KT_F4 || in->type == KILN_KT_W64)
            for (int j = 0; j < lanes_of(in->type); j++) kiln_sbuf_printf(&p->body, "\tmov.f32 %s, 0f%08X;\n", f4reg(p, i, j).s, in->imm.u);
        else if (in->type == KILN_KT_F32) kiln_sbuf_printf(&p->body, "\tmov.f32 %s, 0f%08X;\n", d.s, in->imm.u);
        else if (in->type == KILN_KT_I32) kiln_sbuf_printf(&p->body, "\tmov.s32 %s, %d;\n", d.s, in->imm.i);
        else kiln_sbuf_printf(&p->body, "\tmov.u32 %s, 0x%X;\n", d.s, in->imm.u);
        return;
    }
    case KILN_KOP_TID: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tmov.u32 %s, %%tid.x;\n", d.s);
        return;
    }
    case KILN_KOP_BID: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tmov.u32 %s, %%ctaid.%c;\n", d.s, "xyz"[in->imm.i]);
        return;
    }
    case KILN_KOP_NBID: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tmov.u32 %s, %%nctaid.%c;\n", d.s, "xyz"[in->imm.i]);
        return;
    }
    case KILN_KOP_VAR: {
        rname d = def(p, i);
        if (in->type == KILN_KT_F4 || in->type == KILN_KT_W64) {
            for (int j = 0; j < lanes_of(in->type); j++) kiln_sbuf_printf(&p->body, "\tmov.f32 %s, %s;\n", f4reg(p, i, j).s, f4reg(p, in->a, j).s);
            return;
        }
        kiln_sbuf_printf(&p->body, "\tmov.%s %s, %s;\n", in->type == KILN_KT_F32 ? "f32" : "b32", d.s, vreg(p, in->a).s);
        return;
    }
    case KILN_KOP_ASSIGN:
        if (p->k->ins[in->a].type == KILN_KT_F4 || p->k->ins[in->a].type == KILN_KT_W64) {
            for (int j = 0; j < lanes_of(p->k->ins[in->a].type); j++) kiln_sbuf_printf(&p->body, "\tmov.f32 %s, %s;\n", f4reg(p, in->a, j).s, f4reg(p, in->b, j).s);
            return;
        }
        kiln_sbuf_printf(&p->body, "\tmov.%s %s, %s;\n", p->k->ins[in->a].type == KILN_KT_F32 ? "f32" : "b32", vreg(p, in->a).s,
            vreg(p, in->b).s);
        return;
    case KILN_KOP_SELECT: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tselp.%s %s, %s, %s, %s;\n", in->type == KILN_KT_F32 ? "f32" : "b32", d.s, vreg(p, in->b).s,
            vreg(p, in->c).s, vreg(p, in->a).s);
        return;
    }
    case KILN_KOP_LANE:
        if (in->type == KILN_KT_F32) { /* a copy: an F4/W64 variable's registers change after this point */
            rname d = def(p, i);
            kiln_sbuf_printf(&p->body, "\tmov.f32 %s, %s;\n", d.s, f4reg(p, in->a, in->imm.i).s);
            return;
        }
        /* an alias of the V4's lane register: V4 values are never reassigned */
        p->reg[i] = p->reg[in->a] + (uint32_t)in->imm.i;
        return;
    case KILN_KOP_SETLANE: { /* fresh registers: V4 values are never reassigned, F4 variables are */
        def(p, i);
        bool f = in->type == KILN_KT_F4;
        enum rcls c = f ? RC_F : RC_R;
        for (int j = 0; j < 4; j++) {
            rname d = nreg(c, p->reg[i] + (uint32_t)j);
            if (j == in->imm.i) kiln_sbuf_printf(&p->body, "\tmov.%s %s, %s;\n", f ? "f32" : "b32", d.s, vreg(p, in->b).s);
            else if (in->a != KILN_IDX_NONE) kiln_sbuf_printf(&p->body, "\tmov.%s %s, %s;\n", f ? "f32" : "b32", d.s, nreg(c, p->reg[in->a] + (uint32_t)j).s);
            else kiln_sbuf_printf(&p->body, f ? "\tmov.f32 %s, 0f00000000;\n" : "\tmov.b32 %s, 0;\n", d.s);
        }
        return;
    }
    default: break; /* print_ins sends only the ops above */
    }
}

static kiln_status print_ins(pstate *p, uint32_t i, char *err, size_t n)
{
    const kiln_kinst *in = &p->k->ins[i];
    const op_row *row = &op_table[in->op];
    if (row->arity) {
        const char *text = row->text[col_of(row->cmp ? p->k->ins[in->a].type : in->type)];
        if (!text) {
            snprintf(err, n, "kernel %s, instruction %u: no PTX for %s on %s", p->k->name, i, kiln_kop_name(in->op),
                     kiln_kt_name(in->type));
            return KILN_ERR_UNSUPPORTED;
        }
        rname a = vreg(p, in->a), b = row->arity > 1 ? vreg(p, in->b) : a, c = row->arity > 2 ? vreg(p, in->c) : a;
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\t%s %s, %s", text, d.s, a.s);
        if (row->arity > 1) kiln_sbuf_printf(&p->body, ", %s", b.s);
        if (row->arity > 2) kiln_sbuf_printf(&p->body, ", %s", c.s);
        kiln_sbuf_printf(&p->body, ";\n");
        count_op(p, in);
        return KILN_OK;
    }
    switch (in->op) {
    case KILN_KOP_CONST: case KILN_KOP_TID: case KILN_KOP_BID: case KILN_KOP_NBID: case KILN_KOP_VAR: case KILN_KOP_ASSIGN:
    case KILN_KOP_SELECT: case KILN_KOP_LANE: case KILN_KOP_SETLANE:
        print_move(p, i);
        return KILN_OK;
    case KILN_KOP_PARAM: return KILN_OK; /* loaded at entry; reg[i] set by the prologue */
    case KILN_KOP_DP4A: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tdp4a.s32.s32 %s, %s, %s, %s;\n", d.s, vreg(p, in->a).s, vreg(p, in->b).s, vreg(p, in->c).s);
        p->st.int_ops++;
        return KILN_OK;
    }
    case KILN_KOP_MMA: print_mma(p, i); return KILN_OK;
    case KILN_KOP_WGMMA: print_wgmma(p, i); return KILN_OK;
    case KILN_KOP_PACK2: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tcvt.rn.%s.f32 %s, %s, %s;\n", in->imm.u ? "bf16x2" : "f16x2", d.s, vreg(p, in->b).s, vreg(p, in->a).s);
        return KILN_OK;
    }
    case KILN_KOP_NBAR_SYNC: case KILN_KOP_NBAR_ARRIVE:
        if (in->a != KILN_IDX_NONE)
            kiln_sbuf_printf(&p->body, "\tbar.%s %s, %u;\n", in->op == KILN_KOP_NBAR_SYNC ? "sync" : "arrive", vreg(p, in->a).s, in->imm.u >> 8);
        else kiln_sbuf_printf(&p->body, "\tbar.%s %u, %u;\n", in->op == KILN_KOP_NBAR_SYNC ? "sync" : "arrive", in->imm.u & 0xff, in->imm.u >> 8);
        return KILN_OK;
    case KILN_KOP_WSET: kiln_sbuf_printf(&p->body, "\tmov.f32 %s, %s;\n", f4reg(p, in->a, in->imm.i).s, vreg(p, in->b).s); return KILN_OK;
    case KILN_KOP_FENCE_ASYNC:
        kiln_sbuf_printf(&p->body, in->imm.i ? "\tfence.mbarrier_init.release.cluster;\n" : "\tfence.proxy.async.shared::cta;\n");
        return KILN_OK;
    case KILN_KOP_WG_FENCE: kiln_sbuf_printf(&p->body, "\twgmma.fence.sync.aligned;\n"); return KILN_OK;
    case KILN_KOP_FENCE_CTA: kiln_sbuf_printf(&p->body, "\tfence.acq_rel.cta;\n"); return KILN_OK;
    case KILN_KOP_WG_COMMIT: kiln_sbuf_printf(&p->body, "\twgmma.commit_group.sync.aligned;\n"); return KILN_OK;
    case KILN_KOP_WG_WAIT: kiln_sbuf_printf(&p->body, "\twgmma.wait_group.sync.aligned %d;\n", in->imm.i); return KILN_OK;
    case KILN_KOP_MBAR_INIT: kiln_sbuf_printf(&p->body, "\tmbarrier.init.shared::cta.b64 [%s], %d;\n", vreg(p, in->a).s, in->imm.i); return KILN_OK;
    case KILN_KOP_MBAR_ARRIVE:
        if (in->imm.i) kiln_sbuf_printf(&p->body, "\tmbarrier.arrive.expect_tx.shared::cta.b64 _, [%s], %d;\n", vreg(p, in->a).s, in->imm.i);
        else kiln_sbuf_printf(&p->body, "\tmbarrier.arrive.shared::cta.b64 _, [%s];\n", vreg(p, in->a).s);
        return KILN_OK;
    case KILN_KOP_MBAR_WAIT: {
        rname c = nreg(RC_P, new_reg(p, RC_P));
        kiln_sbuf_printf(&p->body, "$L%u_wait:\n\tmbarrier.try_wait.parity.shared::cta.b64 %s, [%s], %s;\n\t@!%s bra $L%u_wait;\n", i, c.s,
                         vreg(p, in->a).s, vreg(p, in->b).s, c.s, i);
        return KILN_OK;
    }
    case KILN_KOP_TMA_LOAD: {
        uint32_t r = p->reg[in->a];
        if (in->b == KILN_IDX_NONE) {
            kiln_sbuf_printf(&p->body,
                             "\tcp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%%r%u], [%%rd%u, {%%r%u, %%r%u}], [%%r%u];\n",
                             r, p->tmap[in->imm.u], r + 2, r + 3, r + 1);
            return KILN_OK;
        }
        rname h = nreg(RC_H, new_reg(p, RC_H)); /* the CTA mask is 16 bits */
        kiln_sbuf_printf(&p->body, "\tcvt.u16.u32 %s, %s;\n", h.s, vreg(p, in->b).s);
        kiln_sbuf_printf(&p->body,
                         "\tcp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%%r%u], [%%rd%u, {%%r%u, %%r%u}], [%%r%u], %s;\n",
                         r, p->tmap[in->imm.u], r + 2, r + 3, r + 1, h.s);
        return KILN_OK;
    }
    case KILN_KOP_MBAR_ARRIVE_CL: {
        rname ra = nreg(RC_R, new_reg(p, RC_R));
        kiln_sbuf_printf(&p->body, "\tmapa.shared::cluster.u32 %s, %s, %s;\n\tmbarrier.arrive.shared::cluster.b64 _, [%s];\n",
                         ra.s, vreg(p, in->a).s, vreg(p, in->b).s, ra.s);
        return KILN_OK;
    }
    case KILN_KOP_CLUSTER_SYNC:
        kiln_sbuf_printf(&p->body, "\tbarrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n");
        return KILN_OK;
    case KILN_KOP_LDS_CL: {
        rname ra = nreg(RC_R, new_reg(p, RC_R)), d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tmapa.shared::cluster.u32 %s, %s, %s;\n\tld.shared::cluster.%s %s, [%s];\n", ra.s, vreg(p, in->a).s,
                         vreg(p, in->b).s, in->type == KILN_KT_F32 ? "f32" : "u32", d.s, ra.s);
        return KILN_OK;
    }
    case KILN_KOP_SETMAXNREG:
        kiln_sbuf_printf(&p->body, "\tsetmaxnreg.%s.sync.aligned.u32 %u;\n", (in->imm.u >> 16) ? "inc" : "dec", in->imm.u & 0xffff);
        return KILN_OK;
    case KILN_KOP_GRID_WAIT: kiln_sbuf_printf(&p->body, "\tgriddepcontrol.wait;\n"); return KILN_OK;
    case KILN_KOP_GRID_LAUNCH: kiln_sbuf_printf(&p->body, "\tgriddepcontrol.launch_dependents;\n"); return KILN_OK;
    case KILN_KOP_SADDR: {
        rname d = def(p, i);
        kiln_sbuf_printf(&p->body, "\tmad.lo.s32 %s, %s, 4, %%r%u;\n", d.s, vreg(p, in->a).s, p->sbase[in->imm.u]);
        return KILN_OK;
    }
    case KILN_KOP_CVT: case KILN_KOP_H2F: case KILN_KOP_B2F: case KILN_KOP_F2H: case KILN_KOP_F2B: case KILN_KOP_BFE:
        print_convert(p, i);
        return KILN_OK;
    case KILN_KOP_LD: case KILN_KOP_LD4: case KILN_KOP_ST: case KILN_KOP_ST16: case KILN_KOP_ST4: case KILN_KOP_LDS: case KILN_KOP_STS:
    case KILN_KOP_LDS4: case KILN_KOP_STS4: case KILN_KOP_PREFETCH:
        print_mem(p, i);
        return KILN_OK;
    case KILN_KOP_BARRIER:
        kiln_sbuf_printf(&p->body, "\tbar.sync 0;\n");
        p->st.barriers++;
        return KILN_OK;
    case KILN_KOP_REDUCE: print_reduce(p, i); return KILN_OK;
    case KILN_KOP_LOOP: case KILN_KOP_ENDLOOP: case KILN_KOP_IF: case KILN_KOP_ELSE: case KILN_KOP_ENDIF:
        print_flow(p, i);
        return KILN_OK;
    default:
        snprintf(err, n, "kernel %s, instruction %u: the PTX printer has no rule for op %s", p->k->name, i,
                 kiln_kop_name(in->op));
        return KILN_ERR_UNSUPPORTED;
    }
}

/* ------------------------------------------------------------------ the module */

static bool is_ident(const char *s)
{
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_')) return false;
    return true;
}

/* Entry code: buffer bases (%rd<slot>), the parameter slots the kernel reads (each loaded once),
 * the addresses of the shared arrays. */
static void print_prologue(pstate *p)
{
    const kiln_kir *k = p->k;
    for (uint32_t s = 0; s < k->n_bufs; s++) {
        rname d = nreg(RC_D, new_reg(p, RC_D));
        kiln_sbuf_printf(&p->pro, "\tld.param.u64 %s, [%s_p%u];\n\tcvta.to.global.u64 %s, %s;\n", d.s, k->name, s, d.s, d.s);
    }
    for (uint32_t i = 0; i < k->n_ins; i++) {
        if (k->ins[i].op != KILN_KOP_PARAM) continue;
        uint32_t j = 0;
        while (j < i && !(k->ins[j].op == KILN_KOP_PARAM && k->ins[j].imm.i == k->ins[i].imm.i)) j++;
        if (j < i) { /* the same slot again: the same register */
            p->reg[i] = p->reg[j];
            continue;
        }
        rname d = def(p, i);
        kiln_sbuf_printf(&p->pro, "\tld.global.nc.u32 %s, [%%rd0+%u];\n", d.s, 4 * k->ins[i].imm.u);
        p->st.params++;
    }
    uint64_t off = 0;
    for (uint32_t s = 0; s < k->n_shared; s++) {
        p->sbase[s] = new_reg(p, RC_R);
        if (k->dyn_shared) { /* offsets in the one dynamic window, as kiln_kir_shared_bytes lays them out */
            off = (off + 1023) / 1024 * 1024;
            kiln_sbuf_printf(&p->pro, "\tmov.u32 %%r%u, %s_dsm;\n\tadd.u32 %%r%u, %%r%u, %llu;\n", p->sbase[s], k->name, p->sbase[s],
                             p->sbase[s], (unsigned long long)off);
            off += 4ull * k->shared[s];
        } else {
            kiln_sbuf_printf(&p->pro, "\tmov.u32 %%r%u, %s_s%u;\n", p->sbase[s], k->name, s);
        }
    }
    for (uint32_t t = 0; t < k->n_tmaps; t++) {
        p->tmap[t] = new_reg(p, RC_D);
        kiln_sbuf_printf(&p->pro, "\tmov.u64 %%rd%u, %s_t%u;\n\tcvta.param.u64 %%rd%u, %%rd%u;\n", p->tmap[t], k->name, t, p->tmap[t], p->tmap[t]);
    }
    if (p->red_words) {
        p->red_base = new_reg(p, RC_R);
        kiln_sbuf_printf(&p->pro, "\tmov.u32 %%r%u, %s_red;\n", p->red_base, k->name);
    }
}

static void print_module(pstate *p, int sm, unsigned flags, sbuf *out)
{
    const kiln_kir *k = p->k;
    kiln_sbuf_printf(out, "//\n// kiln kernel %s: ", k->name);
    for (const char *c = k->what; *c; c++) kiln_sbuf_printf(out, "%c", *c >= ' ' && *c <= '~' ? *c : '?');
    kiln_sbuf_printf(out, "\n// block %u, grid %u x %u x %u\n//\n\n", k->block, k->grid[0], k->grid[1], k->grid[2]);
    kiln_sbuf_printf(out, ".version 8.0\n.target sm_%d%s\n.address_size 64\n\n", sm, kiln_kir_needs_sm90a(k) ? "a" : "");
    if (k->dyn_shared && k->n_shared) kiln_sbuf_printf(out, ".extern .shared .align 1024 .b8 %s_dsm[];\n", k->name);
    for (uint32_t s = 0; !k->dyn_shared && s < k->n_shared; s++) kiln_sbuf_printf(out, ".shared .align 16 .b32 %s_s%u[%u];\n", k->name, s, k->shared[s]);
    if (p->red_words) kiln_sbuf_printf(out, ".shared .align 16 .f32 %s_red[%u];\n", k->name, p->red_words);
    if (k->n_shared || p->red_words) kiln_sbuf_printf(out, "\n");
    kiln_sbuf_printf(out, ".visible .entry %s(\n", k->name);
    for (uint32_t s = 0; s < k->n_bufs; s++) kiln_sbuf_printf(out, "\t.param .u64 %s_p%u%s\n", k->name, s, s + 1 < k->n_bufs || k->n_tmaps ? "," : "");
    for (uint32_t t = 0; t < k->n_tmaps; t++) kiln_sbuf_printf(out, "\t.param .align 64 .b8 %s_t%u[128]%s\n", k->name, t, t + 1 < k->n_tmaps ? "," : "");
    kiln_sbuf_printf(out, ")\n.maxntid %u, 1, 1\n", k->block);
    if (flags & KILN_PTX_ALL_REGISTERS) kiln_sbuf_printf(out, ".minnctapersm 1\n");
    else if (k->min_blocks >= 1) kiln_sbuf_printf(out, ".minnctapersm %u\n", k->min_blocks);
    if (k->cluster > 1) kiln_sbuf_printf(out, ".reqnctapercluster %u, 1, 1\n", k->cluster);
    kiln_sbuf_printf(out, "{\n");
    for (int c = 0; c < RC_COUNT; c++)
        if (p->n_reg[c]) kiln_sbuf_printf(out, "\t.reg %s %s<%u>;\n", rc_type[c], rc_name[c], p->n_reg[c]);
    kiln_sbuf_printf(out, "\n%s%s\tret;\n}\n", p->pro.s ? p->pro.s : "", p->body.s ? p->body.s : "");
}

kiln_status kiln_ptx_print_ex(const kiln_kir *k, int sm, unsigned flags, char **out_text, kiln_ptx_stats *stats,
                              char *err, size_t n)
{
    *out_text = NULL;
    if (sm < 80 || sm > 90) {
        snprintf(err, n, "PTX for sm_%d: kiln prints sm_80 .. sm_90 (bf16 conversions need sm_80)", sm);
        return KILN_ERR_UNSUPPORTED;
    }
    if (!kiln_kir_verify(k, err, n)) return KILN_ERR_INTERNAL;
    if (kiln_kir_needs_sm90a(k) && sm != 90) {
        snprintf(err, n, "kernel %s uses warpgroup MMA (sm_90a): no PTX for sm_%d", k->name, sm);
        return KILN_ERR_UNSUPPORTED;
    }
    if (kiln_kir_needs_sm90(k) && sm != 90) {
        snprintf(err, n, "kernel %s uses griddepcontrol (programmatic dependent launch, sm_90): no PTX for sm_%d", k->name, sm);
        return KILN_ERR_UNSUPPORTED;
    }
    if (!is_ident(k->name)) {
        snprintf(err, n, "kernel name '%s' is not an identifier", k->name);
        return KILN_ERR_INTERNAL;
    }
    pstate p = {.k = k, .reg = calloc(k->n_ins ? k->n_ins : 1, sizeof *p.reg)};
    if (!p.reg) return KILN_ERR_NOMEM;
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_REDUCE && (k->ins[i].imm.u & 0xffff) > 32) p.red_words = k->block / 32;
    uint64_t shared = 4ull * p.red_words, dyn = k->dyn_shared ? kiln_kir_shared_bytes(k) : 0;
    for (uint32_t s = 0; !k->dyn_shared && s < k->n_shared; s++) shared += 4ull * k->shared[s];
    p.st.shared_bytes = (uint32_t)(shared < UINT32_MAX ? shared : UINT32_MAX);
    p.st.dyn_shared_bytes = (uint32_t)(dyn < UINT32_MAX ? dyn : UINT32_MAX);
    kiln_status s = KILN_OK;
    if (dyn + shared > KILN_PTX_MAX_DYN_SHARED) {
        snprintf(err, n, "kernel %s: %llu bytes of shared memory, over the %d bytes a block can have", k->name,
                 (unsigned long long)(dyn + shared), KILN_PTX_MAX_DYN_SHARED);
        s = KILN_ERR_UNSUPPORTED;
    }
    if (shared > KILN_PTX_MAX_STATIC_SHARED) {
        snprintf(err, n, "kernel %s: %llu bytes of shared memory, over the %d bytes a kernel can declare", k->name,
                 (unsigned long long)shared, KILN_PTX_MAX_STATIC_SHARED);
        s = KILN_ERR_UNSUPPORTED;
    }
    if (s == KILN_OK) print_prologue(&p);
    for (uint32_t i = 0; s == KILN_OK && i < k->n_ins; i++) s = print_ins(&p, i, err, n);
    sbuf out = {0};
    if (s == KILN_OK) print_module(&p, sm, flags, &out);
    if (s == KILN_OK && (p.pro.oom || p.body.oom || out.oom)) s = KILN_ERR_NOMEM;
    free(p.pro.s);
    free(p.body.s);
    free(p.reg);
    if (s != KILN_OK) {
        free(out.s);
        return s;
    }
    *out_text = out.s;
    if (stats) *stats = p.st;
    return KILN_OK;
}

kiln_status kiln_ptx_print(const kiln_kir *k, int sm, char **out_text, char *err, size_t n)
{
    return kiln_ptx_print_ex(k, sm, 0, out_text, NULL, err, n);
}
