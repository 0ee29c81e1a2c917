/* Building and checking kir kernels: append instructions, buffer slots, shared arrays and tables;
 * verify operand types and nesting before any printer sees a kernel. Must not print anything. */
#include "codegen/kir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[KILN_KOP_COUNT] = {
    [KILN_KOP_NONE] = "none", [KILN_KOP_CONST] = "const", [KILN_KOP_TID] = "tid", [KILN_KOP_BID] = "bid", [KILN_KOP_NBID] = "nbid",
    [KILN_KOP_PARAM] = "param", [KILN_KOP_VAR] = "var", [KILN_KOP_ASSIGN] = "assign", [KILN_KOP_ADD] = "add",
    [KILN_KOP_SUB] = "sub", [KILN_KOP_MUL] = "mul", [KILN_KOP_DIV] = "div", [KILN_KOP_REM] = "rem",
    [KILN_KOP_MIN] = "min", [KILN_KOP_MAX] = "max", [KILN_KOP_FMA] = "fma", [KILN_KOP_NEG] = "neg",
    [KILN_KOP_ABS] = "abs", [KILN_KOP_AND] = "and", [KILN_KOP_OR] = "or", [KILN_KOP_XOR] = "xor",
    [KILN_KOP_SHL] = "shl", [KILN_KOP_SHR] = "shr", [KILN_KOP_EX2] = "ex2", [KILN_KOP_LG2] = "lg2",
    [KILN_KOP_RSQRT] = "rsqrt", [KILN_KOP_SQRT] = "sqrt", [KILN_KOP_SIN] = "sin", [KILN_KOP_COS] = "cos",
    [KILN_KOP_FLOOR] = "floor", [KILN_KOP_RINT] = "rint", [KILN_KOP_LT] = "lt", [KILN_KOP_LE] = "le",
    [KILN_KOP_EQ] = "eq", [KILN_KOP_NE] = "ne", [KILN_KOP_PAND] = "pand", [KILN_KOP_POR] = "por",
    [KILN_KOP_PNOT] = "pnot", [KILN_KOP_SELECT] = "select", [KILN_KOP_CVT] = "cvt", [KILN_KOP_BITCAST] = "bitcast",
    [KILN_KOP_H2F] = "h2f", [KILN_KOP_B2F] = "b2f", [KILN_KOP_F2H] = "f2h", [KILN_KOP_F2B] = "f2b",
    [KILN_KOP_BFE] = "bfe", [KILN_KOP_DP4A] = "dp4a", [KILN_KOP_LANE] = "lane", [KILN_KOP_SETLANE] = "setlane", [KILN_KOP_LD] = "ld",
    [KILN_KOP_LD4] = "ld4", [KILN_KOP_ST] = "st", [KILN_KOP_ST16] = "st16", [KILN_KOP_LDS] = "lds",
    [KILN_KOP_STS] = "sts", [KILN_KOP_LDS4] = "lds4", [KILN_KOP_MMA] = "mma", [KILN_KOP_BARRIER] = "barrier", [KILN_KOP_REDUCE] = "reduce", [KILN_KOP_LOOP] = "loop",
    [KILN_KOP_ENDLOOP] = "endloop", [KILN_KOP_IF] = "if", [KILN_KOP_ELSE] = "else", [KILN_KOP_ENDIF] = "endif",
    [KILN_KOP_STS4] = "sts4", [KILN_KOP_SADDR] = "saddr", [KILN_KOP_FENCE_ASYNC] = "fence_async", [KILN_KOP_WG_FENCE] = "wg_fence",
    [KILN_KOP_WGMMA] = "wgmma", [KILN_KOP_WG_COMMIT] = "wg_commit", [KILN_KOP_WG_WAIT] = "wg_wait",
    [KILN_KOP_MBAR_INIT] = "mbar_init", [KILN_KOP_MBAR_ARRIVE] = "mbar_arrive", [KILN_KOP_MBAR_WAIT] = "mbar_wait",
    [KILN_KOP_TMA_LOAD] = "tma_load", [KILN_KOP_MBAR_ARRIVE_CL] = "mbar_arrive_cl", [KILN_KOP_CLUSTER_SYNC] = "cluster_sync",
    [KILN_KOP_SETMAXNREG] = "setmaxnreg",
    [KILN_KOP_GRID_WAIT] = "grid_wait", [KILN_KOP_GRID_LAUNCH] = "grid_launch", [KILN_KOP_PREFETCH] = "prefetch", [KILN_KOP_WSET] = "wset",
    [KILN_KOP_NBAR_SYNC] = "nbar_sync", [KILN_KOP_NBAR_ARRIVE] = "nbar_arrive", [KILN_KOP_PACK2] = "pack2",
    [KILN_KOP_FENCE_CTA] = "fence_cta", [KILN_KOP_LDS_CL] = "lds_cl", [KILN_KOP_ST4] = "st4",
    [KILN_KOP_HFMA2] = "hfma2", [KILN_KOP_PRMT] = "prmt",
};

const char *kiln_kop_name(enum kiln_kop op) { return op < KILN_KOP_COUNT && op_names[op] ? op_names[op] : "?"; }

const char *kiln_kt_name(enum kiln_kt t)
{
    static const char *const n[KILN_KT_COUNT] = {"none", "pred", "i32", "u32", "f32", "v4", "f4", "w64"};
    return t < KILN_KT_COUNT ? n[t] : "?";
}

void kiln_kir_init(kiln_kir *k, const char *name, uint32_t block)
{
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->block = block;
    k->grid[0] = k->grid[1] = k->grid[2] = 1;
    k->n_bufs = 1; /* slot 0: the parameter buffer */
    k->bufs[0] = (kiln_kbuf){.kind = KILN_KBUF_PARAMS, .node = KILN_IDX_NONE};
}

void kiln_kir_free(kiln_kir *k)
{
    if (!k) return;
    for (uint32_t i = 0; i < k->n_tables; i++) free(k->tables[i].words);
    free(k->ins);
    memset(k, 0, sizeof *k);
}

uint32_t kiln_kir_op(kiln_kir *k, enum kiln_kop op, enum kiln_kt t, uint32_t a, uint32_t b, uint32_t c, int32_t imm)
{
    if (k->oom) return 0;
    if (k->n_ins == k->cap_ins) {
        uint32_t cap = k->cap_ins ? 2 * k->cap_ins : 256;
        kiln_kinst *grown = realloc(k->ins, cap * sizeof *grown);
        if (!grown) {
            k->oom = true;
            return 0;
        }
        k->ins = grown;
        k->cap_ins = cap;
    }
    k->ins[k->n_ins] = (kiln_kinst){.op = op, .type = t, .a = a, .b = b, .c = c, .imm.i = imm};
    return k->n_ins++;
}

bool kiln_krows_pass(const kiln_krows *r, const kiln_graph *g, const int64_t (*dims)[KILN_MAX_RANK])
{
    if (!r->set) return true;
    uint32_t numel = 1;
    for (int i = 0; i < g->nodes[r->node].rank; i++) numel *= (uint32_t)dims[r->node][i];
    int32_t rows = (int32_t)numel / (int32_t)r->per_row;
    if (r->seqs == KILN_IDX_NONE)
        return r->small ? rows <= (int32_t)r->cap && (r->lo <= 0 || (int32_t)r->lo < rows) : (int32_t)r->cap < rows;
    if (r->mix > 0) return rows - (int32_t)dims[r->seqs][0] >= (int32_t)r->mix;
    int32_t ns = (int32_t)((uint32_t)dims[r->seqs][0] * (uint32_t)r->per_seq);
    bool many = (int32_t)r->cap < rows && ns < rows;
    return r->small ? !many : many;
}

void kiln_kir_guard(kiln_kir *k, const kiln_kir *cond, uint32_t pred)
{
    if (k->oom || cond->oom) {
        k->oom = true;
        return;
    }
    uint32_t head = cond->n_ins + 1, n = head + k->n_ins + 1;
    kiln_kinst *ins = malloc((size_t)n * sizeof *ins);
    if (!ins) {
        k->oom = true;
        return;
    }
    memcpy(ins, cond->ins, cond->n_ins * sizeof *ins);
    ins[cond->n_ins] = (kiln_kinst){.op = KILN_KOP_IF, .type = KILN_KT_NONE, .a = pred, .b = KILN_IDX_NONE, .c = KILN_IDX_NONE};
    for (uint32_t i = 0; i < k->n_ins; i++) {
        kiln_kinst in = k->ins[i];
        if (in.a != KILN_IDX_NONE) in.a += head;
        if (in.b != KILN_IDX_NONE) in.b += head;
        if (in.c != KILN_IDX_NONE) in.c += head;
        ins[head + i] = in;
    }
    ins[n - 1] = (kiln_kinst){.op = KILN_KOP_ENDIF, .type = KILN_KT_NONE, .a = KILN_IDX_NONE, .b = KILN_IDX_NONE, .c = KILN_IDX_NONE};
    free(k->ins);
    k->ins = ins;
    k->n_ins = k->cap_ins = n;
}

uint32_t kiln_kir_buf(kiln_kir *k, enum kiln_kbuf_kind kind, uint32_t node, bool written)
{
    for (uint32_t i = 0; i < k->n_bufs; i++)
        if (k->bufs[i].kind == kind && k->bufs[i].node == node) {
            k->bufs[i].written |= written;
            return i;
        }
    if (k->n_bufs == KILN_KIR_MAX_BUFS) {
        k->oom = true;
        return 0;
    }
    k->bufs[k->n_bufs] = (kiln_kbuf){.kind = kind, .node = node, .written = written};
    return k->n_bufs++;
}

uint32_t kiln_kir_shared(kiln_kir *k, uint32_t n)
{
    if (k->n_shared == KILN_KIR_MAX_SHARED) {
        k->oom = true;
        return 0;
    }
    k->shared[k->n_shared] = n;
    return k->n_shared++;
}

uint32_t kiln_kir_tmap(kiln_kir *k, const kiln_ktmap *m)
{
    for (uint32_t t = 0; t < k->n_tmaps; t++)
        if (!memcmp(&k->tmaps[t], m, sizeof *m)) return t;
    if (k->n_tmaps == KILN_KIR_MAX_TMAPS) {
        k->oom = true;
        return KILN_IDX_NONE;
    }
    k->tmaps[k->n_tmaps] = *m;
    return k->n_tmaps++;
}

uint64_t kiln_kir_shared_bytes(const kiln_kir *k)
{
    uint64_t b = 0;
    for (uint32_t s = 0; s < k->n_shared; s++) b = (k->dyn_shared ? (b + 1023) / 1024 * 1024 : (b + 15) / 16 * 16) + 4ull * k->shared[s];
    return b;
}

uint32_t kiln_kir_table(kiln_kir *k, const uint32_t *words, uint32_t n)
{
    for (uint32_t t = 0; t < k->n_tables; t++) /* the same table twice is one buffer */
        if (k->tables[t].n == n && memcmp(k->tables[t].words, words, n * sizeof *words) == 0)
            return kiln_kir_buf(k, KILN_KBUF_TABLE, t, false);
    if (k->n_tables == KILN_KIR_MAX_TABLES) {
        k->oom = true;
        return 0;
    }
    uint32_t *w = malloc((n ? n : 1) * sizeof *w);
    if (!w) {
        k->oom = true;
        return 0;
    }
    memcpy(w, words, n * sizeof *w);
    k->tables[k->n_tables] = (kiln_ktable){.words = w, .n = n};
    return kiln_kir_buf(k, KILN_KBUF_TABLE, k->n_tables++, false);
}

enum kiln_kt kiln_ktype(const kiln_kir *k, uint32_t v) { return v < k->n_ins ? (enum kiln_kt)k->ins[v].type : KILN_KT_NONE; }

uint32_t kiln_ki(kiln_kir *k, int32_t v) { return kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, v); }
uint32_t kiln_ku(kiln_kir *k, uint32_t v)
{
    return kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_U32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)v);
}
uint32_t kiln_kf(kiln_kir *k, float v)
{
    int32_t bits;
    memcpy(&bits, &v, 4);
    return kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_F32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, bits);
}
uint32_t kiln_k2(kiln_kir *k, enum kiln_kop op, uint32_t a, uint32_t b)
{
    enum kiln_kt t = op >= KILN_KOP_LT && op <= KILN_KOP_POR ? KILN_KT_PRED : kiln_ktype(k, a);
    return kiln_kir_op(k, op, t, a, b, KILN_IDX_NONE, 0);
}
uint32_t kiln_k1(kiln_kir *k, enum kiln_kop op, uint32_t a) { return kiln_kir_op(k, op, kiln_ktype(k, a), a, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
uint32_t kiln_kvar(kiln_kir *k, uint32_t init) { return kiln_kir_op(k, KILN_KOP_VAR, kiln_ktype(k, init), init, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
void kiln_kset(kiln_kir *k, uint32_t var, uint32_t v) { kiln_kir_op(k, KILN_KOP_ASSIGN, KILN_KT_NONE, var, v, KILN_IDX_NONE, 0); }

#define N KILN_IDX_NONE
uint32_t kiln_kaddi(kiln_kir *k, uint32_t a, int32_t b) { return b ? kiln_k2(k, KILN_KOP_ADD, a, kiln_ki(k, b)) : a; }
uint32_t kiln_kmuli(kiln_kir *k, uint32_t a, int32_t b) { return b == 1 ? a : kiln_k2(k, KILN_KOP_MUL, a, kiln_ki(k, b)); }
uint32_t kiln_kshri(kiln_kir *k, uint32_t a, int32_t b) { return kiln_k2(k, KILN_KOP_SHR, a, kiln_ki(k, b)); }
uint32_t kiln_kandi(kiln_kir *k, uint32_t a, int32_t b) { return kiln_k2(k, KILN_KOP_AND, a, kiln_ki(k, b)); }
uint32_t kiln_kfma(kiln_kir *k, uint32_t a, uint32_t b, uint32_t c) { return kiln_kir_op(k, KILN_KOP_FMA, KILN_KT_F32, a, b, c, 0); }
uint32_t kiln_kcvt(kiln_kir *k, enum kiln_kt t, uint32_t v) { return kiln_kir_op(k, KILN_KOP_CVT, t, v, N, N, 0); }
uint32_t kiln_kbitcast(kiln_kir *k, enum kiln_kt t, uint32_t v) { return kiln_kir_op(k, KILN_KOP_BITCAST, t, v, N, N, 0); }
uint32_t kiln_kbfe(kiln_kir *k, enum kiln_kt t, uint32_t v, int off, int width) { return kiln_kir_op(k, KILN_KOP_BFE, t, v, N, N, off | (width << 8)); }
uint32_t kiln_kh2f(kiln_kir *k, uint32_t w, int half) { return kiln_kir_op(k, KILN_KOP_H2F, KILN_KT_F32, w, N, N, half); }
uint32_t kiln_klane(kiln_kir *k, uint32_t v4, int i) { return kiln_kir_op(k, KILN_KOP_LANE, KILN_KT_U32, v4, N, N, i); }
uint32_t kiln_ksel(kiln_kir *k, enum kiln_kt t, uint32_t p, uint32_t a, uint32_t b) { return kiln_kir_op(k, KILN_KOP_SELECT, t, p, a, b, 0); }
uint32_t kiln_kld(kiln_kir *k, uint32_t slot, uint32_t word) { return kiln_kir_op(k, KILN_KOP_LD, KILN_KT_U32, word, N, N, (int32_t)slot); }
uint32_t kiln_kld4(kiln_kir *k, uint32_t slot, uint32_t word) { return kiln_kir_op(k, KILN_KOP_LD4, KILN_KT_V4, word, N, N, (int32_t)slot); }
uint32_t kiln_klds(kiln_kir *k, uint32_t arr, enum kiln_kt t, uint32_t idx) { return kiln_kir_op(k, KILN_KOP_LDS, t, idx, N, N, (int32_t)arr); }
void     kiln_ksts(kiln_kir *k, uint32_t arr, uint32_t idx, uint32_t v) { kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, idx, v, N, (int32_t)arr); }
void     kiln_kif(kiln_kir *k, uint32_t pred) { kiln_kir_op(k, KILN_KOP_IF, KILN_KT_NONE, pred, N, N, 0); }
void     kiln_kelse(kiln_kir *k) { kiln_kir_op(k, KILN_KOP_ELSE, KILN_KT_NONE, N, N, N, 0); }
void     kiln_kendif(kiln_kir *k) { kiln_kir_op(k, KILN_KOP_ENDIF, KILN_KT_NONE, N, N, N, 0); }
void     kiln_kloop(kiln_kir *k, uint32_t var, uint32_t end, uint32_t step) { kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, var, end, step, 0); }
void     kiln_kendloop(kiln_kir *k) { kiln_kir_op(k, KILN_KOP_ENDLOOP, KILN_KT_NONE, N, N, N, 0); }
void     kiln_kbarrier(kiln_kir *k) { kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, N, N, N, 0); }
#undef N

/* ------------------------------------------------------------------ verification */

#define FAIL(...) do { snprintf(err, n_err, "kernel %s, instruction %u (%s): ", k->name, i, kiln_kop_name(op)); \
    size_t l_ = strlen(err); snprintf(err + l_, n_err > l_ ? n_err - l_ : 0, __VA_ARGS__); return false; } while (0)

static bool is_num(uint8_t t) { return t == KILN_KT_I32 || t == KILN_KT_U32 || t == KILN_KT_F32; }
static bool is_int(uint8_t t) { return t == KILN_KT_I32 || t == KILN_KT_U32; }

/* Programmatic dependent launch: a kernel may start while the previous one still runs, so until
 * its first top-level GRID_WAIT (one every thread runs) it may read only slots no kernel writes
 * (kiln_kir.pdl_const) and store nothing. */
static bool pdl_order_ok(const kiln_kir *k, const kiln_kinst *in, bool waited)
{
    if (!k->pdl || waited) return true;
    if (in->op == KILN_KOP_ST || in->op == KILN_KOP_ST16 || in->op == KILN_KOP_ST4) return false;
    return in->imm.u < 32 && (k->pdl_const >> in->imm.u & 1);
}

bool kiln_kir_verify(const kiln_kir *k, char *err, size_t n_err)
{
    uint32_t i = 0;
    bool waited = false; /* a top-level GRID_WAIT was seen (programmatic dependent launch) */
    enum kiln_kop op = KILN_KOP_NONE;
    if (k->oom) FAIL("out of memory while lowering");
    if (k->block == 0 || k->block % 32 || k->block > 1024) FAIL("block size %u is not a multiple of 32 in 32..1024", k->block);
    if (k->cluster > 1 && ((k->cluster & (k->cluster - 1)) || k->cluster > 8 || k->grid[0] % k->cluster))
        FAIL("cluster of %u blocks over a grid of %u along x", k->cluster, k->grid[0]);
    char stack[64];
    int depth = 0;
    for (i = 0; i < k->n_ins; i++) {
        const kiln_kinst *in = &k->ins[i];
        op = (enum kiln_kop)in->op;
        uint8_t t = in->type;
        uint32_t ops[3] = {in->a, in->b, in->c};
        uint8_t ta[3] = {0, 0, 0};
        for (int j = 0; j < 3; j++) {
            if (ops[j] == KILN_IDX_NONE) continue;
            if (ops[j] >= i) FAIL("operand %d names value %u, not defined before", j, ops[j]);
            ta[j] = k->ins[ops[j]].type;
        }
        switch (op) {
        case KILN_KOP_CONST: case KILN_KOP_PARAM: case KILN_KOP_TID: case KILN_KOP_BID: case KILN_KOP_NBID:
            if (!is_num(t) && !(op == KILN_KOP_CONST && (t == KILN_KT_F4 || t == KILN_KT_W64))) FAIL("type %s", kiln_kt_name(t));
            if (op == KILN_KOP_PARAM && k->pdl && !(k->pdl_const & 1)) /* printers load parameters at entry */
                FAIL("reads the parameter buffer at entry, before the grid wait, but it is not marked constant");
            break;
        case KILN_KOP_VAR:
            if (ta[0] != t || !(is_num(t) || t == KILN_KT_F4 || t == KILN_KT_W64)) FAIL("variable of %s from %s", kiln_kt_name(t), kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_ASSIGN:
            if (k->ins[in->a].op != KILN_KOP_VAR || ta[0] != ta[1]) FAIL("assigns %s to a non-variable or %s", kiln_kt_name(ta[1]), kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_ADD: case KILN_KOP_SUB: case KILN_KOP_MUL: case KILN_KOP_DIV: case KILN_KOP_MIN: case KILN_KOP_MAX:
            if (!is_num(t) || ta[0] != t || ta[1] != t) FAIL("%s from %s, %s", kiln_kt_name(t), kiln_kt_name(ta[0]), kiln_kt_name(ta[1]));
            break;
        case KILN_KOP_REM: case KILN_KOP_AND: case KILN_KOP_OR: case KILN_KOP_XOR: case KILN_KOP_SHL: case KILN_KOP_SHR:
            if (!is_int(t) || ta[0] != t || ta[1] != t) FAIL("%s from %s, %s", kiln_kt_name(t), kiln_kt_name(ta[0]), kiln_kt_name(ta[1]));
            break;
        case KILN_KOP_FMA:
            if (t != KILN_KT_F32 || ta[0] != t || ta[1] != t || ta[2] != t) FAIL("fma needs f32 operands");
            break;
        case KILN_KOP_NEG: case KILN_KOP_ABS:
            if (!(t == KILN_KT_F32 || t == KILN_KT_I32) || ta[0] != t) FAIL("%s of %s", kiln_kt_name(t), kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_EX2: case KILN_KOP_LG2: case KILN_KOP_RSQRT: case KILN_KOP_SQRT: case KILN_KOP_SIN: case KILN_KOP_COS:
        case KILN_KOP_FLOOR: case KILN_KOP_RINT:
            if (t != KILN_KT_F32 || ta[0] != t) FAIL("needs f32");
            break;
        case KILN_KOP_LT: case KILN_KOP_LE: case KILN_KOP_EQ: case KILN_KOP_NE:
            if (t != KILN_KT_PRED || !is_num(ta[0]) || ta[0] != ta[1]) FAIL("compares %s with %s", kiln_kt_name(ta[0]), kiln_kt_name(ta[1]));
            break;
        case KILN_KOP_PAND: case KILN_KOP_POR:
            if (t != KILN_KT_PRED || ta[0] != t || ta[1] != t) FAIL("needs predicates");
            break;
        case KILN_KOP_PNOT: if (t != KILN_KT_PRED || ta[0] != t) FAIL("needs a predicate"); break;
        case KILN_KOP_SELECT:
            if (ta[0] != KILN_KT_PRED || ta[1] != t || ta[2] != t || !is_num(t)) FAIL("select of %s", kiln_kt_name(t));
            break;
        case KILN_KOP_CVT:
            if (!((t == KILN_KT_F32 && is_int(ta[0])) || (is_int(t) && ta[0] == KILN_KT_F32) || (is_int(t) && is_int(ta[0]))))
                FAIL("cvt %s from %s", kiln_kt_name(t), kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_BITCAST:
            if (!is_num(t) || !is_num(ta[0])) FAIL("bitcast %s from %s", kiln_kt_name(t), kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_H2F: case KILN_KOP_B2F:
            if (t != KILN_KT_F32 || ta[0] != KILN_KT_U32 || in->imm.i < 0 || in->imm.i > 1) FAIL("needs u32 and half 0/1");
            break;
        case KILN_KOP_F2H: case KILN_KOP_F2B: if (t != KILN_KT_U32 || ta[0] != KILN_KT_F32) FAIL("needs f32 -> u32"); break;
        case KILN_KOP_PACK2:
            if (t != KILN_KT_U32 || ta[0] != KILN_KT_F32 || ta[1] != KILN_KT_F32 || in->imm.u > 1) FAIL("pack2 needs two f32 -> u32, flag 0/1");
            break;
        case KILN_KOP_HFMA2: case KILN_KOP_PRMT:
            if (t != KILN_KT_U32 || ta[0] != t || ta[1] != t || ta[2] != t) FAIL("%s needs three u32", kiln_kop_name(in->op));
            break;
        case KILN_KOP_BFE: {
            int off = in->imm.i & 31, w = in->imm.i >> 8;
            if (!is_int(t) || ta[0] != KILN_KT_U32 || w < 1 || off + w > 32) FAIL("field %d:%d of %s", off, w, kiln_kt_name(ta[0]));
            break;
        }
        case KILN_KOP_DP4A:
            if (t != KILN_KT_I32 || ta[0] != KILN_KT_U32 || ta[1] != KILN_KT_U32 || ta[2] != KILN_KT_I32) FAIL("dp4a types");
            break;
        case KILN_KOP_LANE:
            if (!((t == KILN_KT_U32 && ta[0] == KILN_KT_V4) || (t == KILN_KT_F32 && ta[0] == KILN_KT_F4) ||
                  (t == KILN_KT_F32 && ta[0] == KILN_KT_W64)) || in->imm.i < 0 || in->imm.i > (ta[0] == KILN_KT_W64 ? 63 : 3))
                FAIL("lane %d: %s of %s", in->imm.i, kiln_kt_name(t), kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_SETLANE:
            if (!((t == KILN_KT_V4 && ta[1] == KILN_KT_U32) || (t == KILN_KT_F4 && ta[1] == KILN_KT_F32)) ||
                (in->a != KILN_IDX_NONE && ta[0] != t) || in->imm.i < 0 || in->imm.i > 3)
                FAIL("setlane %d: %s from %s, %s", in->imm.i, kiln_kt_name(t), kiln_kt_name(ta[0]), kiln_kt_name(ta[1]));
            break;
        case KILN_KOP_LD: case KILN_KOP_LD4: case KILN_KOP_ST: case KILN_KOP_ST16: case KILN_KOP_ST4: case KILN_KOP_PREFETCH:
            if (in->imm.u >= k->n_bufs || ta[0] != KILN_KT_I32) FAIL("buffer slot %u of %u, index %s", in->imm.u, k->n_bufs, kiln_kt_name(ta[0]));
            if (!pdl_order_ok(k, in, waited))
                FAIL("%s buffer slot %u before the kernel's top-level grid wait (programmatic dependent launch: the "
                     "previous kernel may still write or read it)", op == KILN_KOP_ST || op == KILN_KOP_ST16 || op == KILN_KOP_ST4 ? "stores to" : "reads",
                     in->imm.u);
            if ((op == KILN_KOP_ST || op == KILN_KOP_ST16) && (ta[1] != KILN_KT_U32 || !k->bufs[in->imm.u].written))
                FAIL("stores %s into a buffer not marked written", kiln_kt_name(ta[1]));
            if (op == KILN_KOP_ST4 && (ta[1] != KILN_KT_V4 || !k->bufs[in->imm.u].written))
                FAIL("st4 stores %s into a buffer %s", kiln_kt_name(ta[1]), k->bufs[in->imm.u].written ? "(want v4)" : "not marked written");
            if (op == KILN_KOP_LD && t != KILN_KT_U32) FAIL("ld gives u32");
            if (op == KILN_KOP_LD4 && t != KILN_KT_V4) FAIL("ld4 gives v4");
            if (op == KILN_KOP_PREFETCH && t != KILN_KT_NONE) FAIL("prefetch gives no value");
            break;
        case KILN_KOP_LDS: case KILN_KOP_STS:
            if (in->imm.u >= k->n_shared || ta[0] != KILN_KT_I32) FAIL("shared array %u of %u", in->imm.u, k->n_shared);
            if (op == KILN_KOP_LDS && t != KILN_KT_U32 && t != KILN_KT_F32) FAIL("lds type");
            if (op == KILN_KOP_STS && ta[1] != KILN_KT_U32 && ta[1] != KILN_KT_F32) FAIL("sts type");
            break;
        case KILN_KOP_LDS4:
            if (in->imm.u >= k->n_shared || ta[0] != KILN_KT_I32 || t != KILN_KT_V4 || k->shared[in->imm.u] % 4)
                FAIL("lds4 from shared array %u of %u (its size a multiple of 4), index %s", in->imm.u, k->n_shared, kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_MMA:
            if (t != KILN_KT_F4 || ta[0] != KILN_KT_V4 || ta[1] != KILN_KT_V4 || ta[2] != KILN_KT_F4 || (in->imm.u & ~3u))
                FAIL("mma gives f4 from v4, v4, f4 (flags 0..3): %s from %s, %s, %s, flags %u", kiln_kt_name(t), kiln_kt_name(ta[0]),
                     kiln_kt_name(ta[1]), kiln_kt_name(ta[2]), in->imm.u);
            if (k->block % 32) FAIL("mma in a block that is not whole warps");
            break;
        case KILN_KOP_BARRIER: case KILN_KOP_FENCE_ASYNC: case KILN_KOP_WG_FENCE: case KILN_KOP_WG_COMMIT: case KILN_KOP_FENCE_CTA: break;
        case KILN_KOP_GRID_WAIT: waited |= depth == 0; break;
        case KILN_KOP_GRID_LAUNCH: break;
        case KILN_KOP_WG_WAIT: if (in->imm.i < 0 || in->imm.i > 7) FAIL("wait for %d groups", in->imm.i); break;
        case KILN_KOP_STS4:
            if (in->imm.u >= k->n_shared || ta[0] != KILN_KT_I32 || ta[1] != KILN_KT_V4 || k->shared[in->imm.u] % 4)
                FAIL("sts4 of %s into shared array %u of %u (its size a multiple of 4)", kiln_kt_name(ta[1]), in->imm.u, k->n_shared);
            break;
        case KILN_KOP_SADDR:
            if (in->imm.u >= k->n_shared || ta[0] != KILN_KT_I32 || t != KILN_KT_U32) FAIL("saddr of shared array %u of %u", in->imm.u, k->n_shared);
            break;
        case KILN_KOP_WGMMA: {
            bool rega = in->imm.u & 4, trans = in->imm.u & 8;
            if (k->ins[in->a].op != KILN_KOP_VAR || ta[0] != KILN_KT_W64 || ta[1] != (rega ? KILN_KT_V4 : KILN_KT_U32) ||
                ta[2] != KILN_KT_U32 || (in->imm.u & 0xc0000000u) || !(in->imm.u >> 8 & 0xff))
                FAIL("wgmma needs a w64 variable, an A tile (u32 shared address, or v4 fragment with flag 4) and a u32 shared B address (flags %#x)",
                     in->imm.u);
            if (trans && (!(in->imm.u & 2) || !(in->imm.u >> 16))) FAIL("wgmma with an MN-major B needs the swizzled layout and a leading byte offset (flags %#x)", in->imm.u);
            if (!trans && (in->imm.u >> 16)) FAIL("wgmma leading byte offset without an MN-major B (flags %#x)", in->imm.u);
            if (k->block % 128) FAIL("wgmma in a block that is not whole warpgroups");
            break;
        }
        case KILN_KOP_NBAR_SYNC: case KILN_KOP_NBAR_ARRIVE: {
            uint32_t id = in->imm.u & 0xff, cnt = in->imm.u >> 8;
            bool reg = in->a != KILN_IDX_NONE;
            if ((reg ? id != 0 || ta[0] != KILN_KT_I32 : id < 1 || id > 15) || !cnt || cnt % 32 || cnt > k->block || k->block % 32)
                FAIL("named barrier %u of %u threads in a block of %u (ids 1..15 or an i32 value, whole warps)", id, cnt, k->block);
            break;
        }
        case KILN_KOP_WSET:
            if (k->ins[in->a].op != KILN_KOP_VAR || ta[0] != KILN_KT_W64 || ta[1] != KILN_KT_F32 || in->imm.u > 63)
                FAIL("wset of lane %u needs a w64 variable and an f32", in->imm.u);
            break;
        case KILN_KOP_MBAR_INIT:
            if (ta[0] != KILN_KT_U32 || in->imm.i <= 0 || in->imm.i > 1024) FAIL("mbarrier init of %d arrivals at a %s", in->imm.i, kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_MBAR_ARRIVE:
            if (ta[0] != KILN_KT_U32 || in->imm.i < 0 || in->imm.i >= (1 << 20)) FAIL("mbarrier arrive (%d bytes) at a %s", in->imm.i, kiln_kt_name(ta[0]));
            break;
        case KILN_KOP_MBAR_WAIT:
            if (ta[0] != KILN_KT_U32 || (ta[1] != KILN_KT_I32 && ta[1] != KILN_KT_U32)) FAIL("mbarrier wait needs an address and a parity");
            break;
        case KILN_KOP_TMA_LOAD:
            if (ta[0] != KILN_KT_V4 || in->imm.u >= k->n_tmaps) FAIL("tma load of map %u of %u from a %s", in->imm.u, k->n_tmaps, kiln_kt_name(ta[0]));
            if (in->b != KILN_IDX_NONE && (k->cluster < 2 || ta[1] != KILN_KT_U32)) FAIL("tma multicast needs a cluster and a u32 mask");
            if (k->tmaps[in->imm.u].slot >= k->n_bufs) FAIL("tensor map %u on slot %u of %u", in->imm.u, k->tmaps[in->imm.u].slot, k->n_bufs);
            {
                kiln_kinst as_ld = *in; /* the box reads the map's slot: the same order rule as a load */
                as_ld.op = KILN_KOP_LD4, as_ld.imm.u = k->tmaps[in->imm.u].slot;
                if (!pdl_order_ok(k, &as_ld, waited)) FAIL("tma load of slot %u before the kernel's top-level grid wait", as_ld.imm.u);
            }
            break;
        case KILN_KOP_MBAR_ARRIVE_CL:
            if (k->cluster < 2 || ta[0] != KILN_KT_U32 || ta[1] != KILN_KT_U32) FAIL("remote mbarrier arrive needs a cluster, an address and a u32 rank");
            break;
        case KILN_KOP_CLUSTER_SYNC:
            if (k->cluster < 2) FAIL("cluster sync in a kernel without a cluster");
            break;
        case KILN_KOP_LDS_CL:
            if (k->cluster < 2 || ta[0] != KILN_KT_U32 || ta[1] != KILN_KT_U32 || (t != KILN_KT_U32 && t != KILN_KT_F32))
                FAIL("remote shared load needs a cluster, a u32 address and a u32 rank, and gives u32 or f32");
            break;
        case KILN_KOP_SETMAXNREG: {
            uint32_t r = in->imm.u & 0xffff;
            if (r < 24 || r > 256 || r % 8 || (in->imm.u >> 16) > 1 || k->block % 128) FAIL("setmaxnreg %u", r);
            break;
        }
        case KILN_KOP_REDUCE: {
            uint32_t grp = in->imm.u & 0xffff, rop = in->imm.u >> 16;
            if (t != KILN_KT_F32 || ta[0] != t || rop >= KILN_KRED_COUNT || !grp || (grp & (grp - 1)) || k->block % grp)
                FAIL("reduce of group %u op %u", grp, rop);
            break;
        }
        case KILN_KOP_LOOP:
            if (k->ins[in->a].op != KILN_KOP_VAR || ta[0] != KILN_KT_I32 || ta[1] != KILN_KT_I32 || ta[2] != KILN_KT_I32)
                FAIL("loop needs an i32 variable, end and step");
            if (depth == (int)sizeof stack) FAIL("nesting too deep");
            stack[depth++] = 'L';
            break;
        case KILN_KOP_IF:
            if (ta[0] != KILN_KT_PRED) FAIL("if needs a predicate");
            if (depth == (int)sizeof stack) FAIL("nesting too deep");
            stack[depth++] = 'I';
            break;
        case KILN_KOP_ELSE:
            if (!depth || stack[depth - 1] != 'I') FAIL("else outside if");
            stack[depth - 1] = 'E';
            break;
        case KILN_KOP_ENDIF: if (!depth || stack[depth - 1] == 'L') FAIL("endif without if"); depth--; break;
        case KILN_KOP_ENDLOOP: if (!depth || stack[depth - 1] != 'L') FAIL("endloop without loop"); depth--; break;
        default: FAIL("unknown op %d", op);
        }
    }
    if (depth) {
        i = k->n_ins;
        op = KILN_KOP_NONE;
        FAIL("%d unclosed loop/if blocks", depth);
    }
    if (k->pdl && !waited) {
        i = k->n_ins;
        op = KILN_KOP_NONE;
        FAIL("a kernel for programmatic dependent launch has no grid wait at its top level (every thread must wait, or "
             "the next kernel's wait would not cover this one's predecessor)");
    }
    return true;
}

bool kiln_kir_needs_sm90(const kiln_kir *k)
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_GRID_WAIT || k->ins[i].op == KILN_KOP_GRID_LAUNCH) return true;
    return false;
}

bool kiln_kir_needs_sm90a(const kiln_kir *k)
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if ((k->ins[i].op >= KILN_KOP_WG_FENCE && k->ins[i].op <= KILN_KOP_SETMAXNREG) || k->ins[i].op == KILN_KOP_WSET) return true; /* WG_FENCE .. SETMAXNREG */
    return k->n_tmaps > 0;
}

/* ------------------------------------------------------------------ listing */

void kiln_kir_dump(const kiln_kir *k, FILE *f)
{
    fprintf(f, "kernel %s  block %u  grid %u,%u,%u  bufs %u  shared", k->name, k->block, k->grid[0], k->grid[1], k->grid[2], k->n_bufs);
    for (uint32_t i = 0; i < k->n_shared; i++) fprintf(f, " %u", k->shared[i]);
    fprintf(f, "  scratch %llu  (%s)\n", (unsigned long long)k->scratch_bytes, k->what);
    int depth = 1;
    for (uint32_t i = 0; i < k->n_ins; i++) {
        const kiln_kinst *in = &k->ins[i];
        if (in->op == KILN_KOP_ENDLOOP || in->op == KILN_KOP_ENDIF || in->op == KILN_KOP_ELSE) depth--;
        fprintf(f, "%5u %*s%s.%s", i, 2 * depth, "", kiln_kop_name((enum kiln_kop)in->op), kiln_kt_name((enum kiln_kt)in->type));
        const uint32_t ops[3] = {in->a, in->b, in->c};
        for (int j = 0; j < 3; j++)
            if (ops[j] != KILN_IDX_NONE) fprintf(f, " %%%u", ops[j]);
        if (in->op == KILN_KOP_CONST && (in->type == KILN_KT_F32 || in->type == KILN_KT_F4 || in->type == KILN_KT_W64)) {
            float v;
            memcpy(&v, &in->imm.u, 4);
            fprintf(f, " #%g", v);
        } else if (in->imm.i) {
            fprintf(f, " #%d", in->imm.i);
        }
        fputc('\n', f);
        if (in->op == KILN_KOP_LOOP || in->op == KILN_KOP_IF || in->op == KILN_KOP_ELSE) depth++;
    }
}
