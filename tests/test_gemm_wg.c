/* The Hopper GEMM template (kiln_gemm_tma: a producer warpgroup's TMA boxes into a ring of
 * 128-byte-swizzled stages with mbarriers, consumer warpgroups' WGMMAs straight from them)
 * executed here, without a GPU, by the block interpreter of tests/support/kirtest.c: it lands TMA
 * boxes with the swizzle when their mbarrier phase completes, runs WGMMA from kir.h's contract
 * (descriptor, swizzle, accumulator fragment) only at its WG_WAIT, schedules threads around
 * mbarrier waits and reports deadlocks, so a wrong layout, phase or release fails here, in CI.
 * Every kernel of the region runs in order on fresh random data; the output is compared with the
 * f64 reference (ref64) at the matmul contract's tolerance, and mutated kernels must fail. */
#include <criterion/criterion.h>

#include "codegen/kir.h"
#include "fuse/fuse.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "support/kirtest.h"
#include "support/ref64.h"
#include "support/testutil.h"

#include <stdlib.h>
#include <string.h>

#define MAXB 24

typedef struct wg_case {
    kiln_graph *g;
    kiln_binding b[8];
    size_t       nb;
    void        *in[8];
} wg_case;

/* Memory of node i at its max dims: an input's bound bytes, a weight in its device layout, else poison. */
static uint32_t *node_mem(const kiln_graph *g, uint32_t i, const wg_case *c)
{
    const kiln_node_rec *n = &g->nodes[i];
    int64_t dims[KILN_MAX_RANK];
    for (int d = 0; d < n->rank; d++) dims[d] = n->dims[d] < 0 ? g->syms[kiln_sym_index(n->dims[d])].max : n->dims[d];
    size_t bytes = kiln_node_bytes(n, dims);
    if (n->op == KILN_OP_WEIGHT) {
        int64_t rows = 1, k = dims[n->rank - 1]; /* [rows, k]; a norm's weight is [k] */
        for (int d = 0; d + 1 < n->rank; d++) rows *= dims[d];
        size_t dev = kiln_lower_weight_bytes((kiln_dtype)n->dtype, rows, k);
        uint32_t *m = calloc(dev / 4 + 4, 4);
        kiln_lower_weight_repack((kiln_dtype)n->dtype, rows, k, n->data, m);
        return m;
    }
    uint32_t *m = malloc(bytes + 16);
    memset(m, 0xFF, bytes + 16); /* NaN poison */
    const char *name = n->name;
    for (size_t j = 0; name && j < c->nb; j++)
        if (c->b[j].data && strcmp(c->b[j].name, name) == 0) memcpy(m, c->b[j].data, c->b[j].bytes);
    return m;
}

/* A change to the lowered GEMM kernel (mutation tests), or NULL. */
typedef void (*mutate_fn)(kiln_kir *k);

/* codegen.precision of the compile (KILN_PREC_F16 tests set it for their case). */
static int32_t g_precision = KILN_PREC_EXACT;
static int32_t g_epilogue; /* codegen.gemm_epilogue of the compile (KILN_GEMM_ON: on the accumulators) */
static double g_last_nmse; /* of the last case compared */

/* Lowers the graph's regions for target tg (NULL: an H100 with warpgroup MMA asked for, and a
 * kiln_gemm_tma kernel must be among them), runs their kernels (the GEMM changed by mut), compares
 * output `out` with the reference at the contract of op `op` (key: dtype): asserts the match
 * without mut; with it returns whether the kernels failed or the output missed the tolerance. */
static uint32_t g_cluster; /* the last TMA GEMM's blocks per cluster */
static uint32_t g_col_blocks; /* the last TMA GEMM's column blocks (its grid's y) */
static int32_t g_cols; /* codegen.gemm_cols of the compile (0: the shape's choice) */
static int32_t g_persist; /* codegen.gemm_persist of the compile */
static uint32_t g_sms;    /* the target's SMs where nonzero (a persistent grid of few blocks) */
static uint32_t g_grid0;  /* the last TMA GEMM's grid x */
static bool g_saw_reduce; /* the last region had a kiln_gemm_reduce kernel */

static bool run_case_on(wg_case *c, const char *out, int64_t m, const char *op, kiln_dtype key, const char *what, mutate_fn mut,
                        const kiln_lower_target *tg)
{
    kiln_graph *g = c->g;
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    uint32_t *mem[1024] = {0};
    cr_assert(g->n_nodes < 1024);
    uint32_t params[64] = {0};
    for (size_t j = 0; j < c->nb; j++)
        if (!c->b[j].data)
            for (uint32_t s = 0; s < g->n_syms; s++)
                if (strcmp(g->syms[s].name, c->b[j].name) == 0) params[s] = (uint32_t)c->b[j].value;
    bool saw_wg = false;
    g_saw_reduce = false;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        uint32_t n = 0;
        char err[1024];
        kiln_lower_target t = kiln_lower_target_for_sm(90); /* the H100: warpgroup MMA, asked for */
        t.opts.wgmma = KILN_GEMM_ON;
        if (tg) t = *tg;
        t.opts.precision = g_precision;
        t.opts.gemm_epilogue = g_epilogue;
        if (!tg) t.opts.gemm_cols = g_cols;
        if (!tg) t.opts.gemm_persist = g_persist;
        if (!tg && g_sms) t.sm_count = g_sms;
        cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &t, ks, &n, err, sizeof err), KILN_OK, "%s: %s", what, err);
        uint64_t scratch_bytes = 0;
        for (uint32_t i = 0; i < n; i++) scratch_bytes = ks[i].scratch_bytes > scratch_bytes ? ks[i].scratch_bytes : scratch_bytes;
        uint32_t *scratch = calloc(scratch_bytes / 4 + 4, 4);
        bool failed = false;
        for (uint32_t i = 0; i < n; i++) {
            bool wg = strcmp(ks[i].name, "kiln_gemm_tma") == 0;
            saw_wg |= wg;
            g_saw_reduce |= strcmp(ks[i].name, "kiln_gemm_reduce") == 0;
            if (wg) g_cluster = ks[i].cluster, g_col_blocks = ks[i].grid[1], g_grid0 = ks[i].grid[0];
            if (wg && mut) mut(&ks[i]);
            uint32_t *bufs[MAXB] = {params};
            for (uint32_t s = 1; s < ks[i].n_bufs; s++) {
                const kiln_kbuf *kb = &ks[i].bufs[s];
                if (kb->kind == KILN_KBUF_SCRATCH) bufs[s] = scratch;
                else if (kb->kind == KILN_KBUF_TABLE) bufs[s] = ks[i].tables[kb->node].words;
                else { /* views and reshapes: their root's memory at their byte offset */
                    uint32_t root = kb->node;
                    size_t off = 0;
                    while (g->nodes[root].op == KILN_OP_RESHAPE || g->nodes[root].op == KILN_OP_VIEW) {
                        if (g->nodes[root].op == KILN_OP_VIEW) off += (size_t)g->nodes[root].dim * kiln_dtype_block_bytes((kiln_dtype)g->nodes[root].dtype);
                        root = g->nodes[root].src[0];
                    }
                    if (!mem[root]) mem[root] = node_mem(g, root, c);
                    bufs[s] = (uint32_t *)((char *)mem[root] + off);
                }
            }
            bool ran = !failed && kt_interp_block(&ks[i], bufs, err, sizeof err);
            if (!mut) cr_assert(ran, "%s, kernel %s: %s", what, ks[i].name, err);
            failed |= !ran;
            kiln_kir_free(&ks[i]);
        }
        free(scratch);
        if (failed) {
            for (uint32_t i = 0; i < g->n_nodes; i++) free(mem[i]);
            kiln_fusion_free(&f);
            return true;
        }
    }
    cr_assert(saw_wg || tg, "%s: no kiln_gemm_tma kernel", what);
    ref64 *rf = ref64_new(g);
    char err[256];
    cr_assert_eq(ref64_run(rf, c->b, c->nb, err, sizeof err), 0, "%s", err);
    int64_t dims[KILN_MAX_RANK], numel;
    const double *ref = ref64_output(rf, out, dims, &numel);
    uint32_t yi = KILN_IDX_NONE;
    for (uint32_t i = 0; i < g->n_outs; i++)
        if (strcmp(g->outs[i].name, out) == 0) yi = g->outs[i].node;
    cr_assert(yi != KILN_IDX_NONE && mem[yi], "%s: output %s not written by any kernel", what, out);
    double *got = malloc((size_t)numel * sizeof *got);
    for (int64_t e = 0; e < numel; e++) {
        float v;
        memcpy(&v, &mem[yi][e], 4);
        got[e] = v;
    }
    cr_assert_eq(numel % m, 0);
    bool missed = false;
    if (!mut) {
        g_last_nmse = tu_compare(what, got, ref, numel, tu_tol_prec(op, key, g_precision));
    } else {
        double se = 0, sr = 0;
        for (int64_t e = 0; e < numel; e++) se += (got[e] - ref[e]) * (got[e] - ref[e]), sr += ref[e] * ref[e];
        missed = !(se <= tu_tol_prec(op, key, g_precision) * (sr > 1e-300 ? sr : 1e-300)); /* NaN misses too */
    }
    free(got);
    ref64_free(rf);
    for (uint32_t i = 0; i < g->n_nodes; i++) free(mem[i]);
    kiln_fusion_free(&f);
    return missed;
}

static bool run_case_mut(wg_case *c, const char *out, int64_t m, kiln_dtype key, const char *what, mutate_fn mut)
{
    return run_case_on(c, out, m, "matmul", key, what, mut, NULL);
}

static void run_case(wg_case *c, const char *out, int64_t m, kiln_dtype key, const char *what)
{
    run_case_mut(c, out, m, key, what, NULL);
}

static void bind_random(wg_case *c, const char *name, int64_t n, float lo, float hi)
{
    float *v = malloc((size_t)n * sizeof *v);
    tu_fill(v, n, lo, hi);
    c->in[c->nb] = v;
    c->b[c->nb++] = (kiln_binding){.name = name, .data = v, .bytes = (size_t)n * 4};
}

static void case_free(wg_case *c)
{
    for (size_t j = 0; j < c->nb; j++) free(c->in[j]);
    kiln_graph_free(c->g);
}

/* One weight, a residual epilogue; a row tail (m of mmax rows: the last token block partial) and
 * a column tail (136 = 128 + 8); K not a multiple of the 64-k stage where asked (the TMA's zeros
 * past K). x f32 takes the split kernel (two f16 parts); x f16/bf16 is read by the TMA as it is.
 * tg NULL: the Hopper GEMM; else that target's kernels (gemv for mmax <= 8). */
static bool plain_case_on(kiln_dtype wt, kiln_dtype xt, int64_t K, int64_t N, int64_t mmax, int64_t m, mutate_fn mut,
                          const kiln_lower_target *tg)
{
    wg_case c = {0};
    cr_assert_eq(kiln_graph_new(&c.g), KILN_OK);
    kiln_dim M = kiln_sym(c.g, "m", mmax);
    kiln_node x = kiln_input(c.g, "x", xt, 2, (kiln_dim[]){M, K});
    kiln_node r = kiln_input(c.g, "r", KILN_DTYPE_F32, 2, (kiln_dim[]){M, N});
    kiln_node w = tu_weight(c.g, "w", wt, 2, (kiln_dim[]){N, K}, -1.0f, 1.0f);
    kiln_output(c.g, kiln_add(c.g, kiln_matmul(c.g, x, w), r), "y");
    c.b[c.nb++] = (kiln_binding){.name = "m", .value = m};
    if (xt == KILN_DTYPE_F32) {
        bind_random(&c, "x", m * K, -1.0f, 1.0f);
    } else { /* 16-bit x: values exact in the type */
        uint16_t *v = malloc((size_t)(m * K) * 2);
        float *f = malloc((size_t)(m * K) * 4);
        tu_fill(f, m * K, -1.0f, 1.0f);
        for (int64_t i = 0; i < m * K; i++) v[i] = xt == KILN_DTYPE_F16 ? kiln_f32_to_f16(f[i]) : kiln_f32_to_bf16(f[i]);
        free(f);
        c.in[c.nb] = v;
        c.b[c.nb++] = (kiln_binding){.name = "x", .data = v, .bytes = (size_t)(m * K) * 2};
    }
    bind_random(&c, "r", m * N, -1.0f, 1.0f);
    char what[128];
    snprintf(what, sizeof what, "%s %s x %s K=%lld N=%lld m=%lld/%lld + residual", tg ? (tg->dp4a ? "gemv dp4a" : "gemv float") : "tma gemm",
             kiln_dtype_name(wt), kiln_dtype_name(xt), (long long)K, (long long)N, (long long)m, (long long)mmax);
    bool missed = run_case_on(&c, "y", m, "matmul", wt, what, mut, tg);
    case_free(&c);
    return missed;
}

static bool plain_case_mut(kiln_dtype wt, kiln_dtype xt, int64_t K, int64_t mmax, int64_t m, mutate_fn mut)
{
    return plain_case_on(wt, xt, K, 136, mmax, m, mut, NULL);
}

static void plain_case(kiln_dtype wt, kiln_dtype xt, int64_t K, int64_t mmax, int64_t m) { plain_case_mut(wt, xt, K, mmax, m, NULL); }

Test(gemm_wg, f16_weights_f32_x_residual) { plain_case(KILN_DTYPE_F16, KILN_DTYPE_F32, 96, 160, 130); }
Test(gemm_wg, f16_weights_f16_x_two_accumulators) { plain_case(KILN_DTYPE_F16, KILN_DTYPE_F16, 448, 300, 290); }
Test(gemm_wg, bf16_weights_bf16_x) { plain_case(KILN_DTYPE_BF16, KILN_DTYPE_BF16, 128, 140, 137); }
/* block weights: decoded by the producer warpgroup into the swizzled stages, x in one f16 part */
Test(gemm_wg, q8_0_weights) { plain_case(KILN_DTYPE_Q8_0, KILN_DTYPE_F32, 512, 160, 130); }
Test(gemm_wg, q4_k_weights_two_accumulators) { plain_case(KILN_DTYPE_Q4_K, KILN_DTYPE_F32, 512, 300, 290); }
Test(gemm_wg, q6_k_weights_f16_x) { plain_case(KILN_DTYPE_Q6_K, KILN_DTYPE_F16, 256, 140, 137); }
Test(gemm_wg, q5_k_weights) { plain_case(KILN_DTYPE_Q5_K, KILN_DTYPE_F32, 256, 100, 77); }

/* rms_norm prologue (x normalized and split once by the rms kernel) and two siblings with a
 * swiglu epilogue: the gate/up shape of a llama layer. */
/* rms_norm + gate/up + swiglu over K columns of x: K 64 takes the rms kernel's loop, K 1024 and
 * 2048 its registers (rms_row_vec: 1 and 2 16-byte loads a thread); x scaled by xs (1e-20: the
 * f32 squares underflow and the rescaled pass runs). The norm is an output too where norm_out. */
static int64_t g_swiglu_f = 72; /* columns of each sibling */

static void swiglu_case(int64_t K, int64_t m, float xs, bool norm_out)
{
    wg_case c = {0};
    cr_assert_eq(kiln_graph_new(&c.g), KILN_OK);
    kiln_dim M = kiln_sym(c.g, "m", 144);
    const int64_t F = g_swiglu_f;
    kiln_node x = kiln_input(c.g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){M, K});
    kiln_node nw = tu_weight(c.g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){K}, 0.5f, 1.5f);
    kiln_node h = kiln_rms_norm(c.g, x, nw, 1e-5f * xs * xs);
    kiln_node wg = tu_weight(c.g, "wg", KILN_DTYPE_F16, 2, (kiln_dim[]){F, K}, -1.0f, 1.0f);
    kiln_node wu = tu_weight(c.g, "wu", KILN_DTYPE_F16, 2, (kiln_dim[]){F, K}, -1.0f, 1.0f);
    kiln_output(c.g, kiln_swiglu(c.g, kiln_matmul(c.g, h, wg), kiln_matmul(c.g, h, wu)), "y");
    if (norm_out) kiln_output(c.g, h, "h");
    c.b[c.nb++] = (kiln_binding){.name = "m", .value = m};
    bind_random(&c, "x", m * K, -xs, xs);
    char what[96];
    snprintf(what, sizeof what, "tma gemm rms_norm (K %lld, x in +-%g) + gate/up + swiglu", (long long)K, (double)xs);
    run_case(&c, "y", m, KILN_DTYPE_F16, what);
    if (norm_out) run_case_on(&c, "h", m, "rms_norm", KILN_DTYPE_F32, "tma gemm: the norm beside it", NULL, NULL);
    case_free(&c);
}

Test(gemm_wg, rms_norm_siblings_swiglu) { swiglu_case(64, 137, 1.0f, false); }
Test(gemm_wg, rms_norm_rows_in_registers) { swiglu_case(1024, 37, 1.0f, true); swiglu_case(2048, 20, 1e-20f, false); }

/* A WGMMA whose accumulator is read before its wait is caught by the interpreter. */
Test(gemm_wg, interpreter_catches_read_in_flight)
{
    kiln_kir k;
    kiln_kir_init(&k, "bad", 128);
    uint32_t sh = kiln_kir_shared(&k, 4096);
    uint32_t acc = kiln_kvar(&k, kiln_kir_op(&k, KILN_KOP_CONST, KILN_KT_W64, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0));
    uint32_t a = kiln_kir_op(&k, KILN_KOP_SADDR, KILN_KT_U32, kiln_ki(&k, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)sh);
    kiln_kir_op(&k, KILN_KOP_WGMMA, KILN_KT_NONE, acc, a, a, 32 << 8);
    kiln_kir_op(&k, KILN_KOP_WG_COMMIT, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t y = kiln_kir_buf(&k, KILN_KBUF_NODE, 1, true);
    uint32_t v = kiln_kir_op(&k, KILN_KOP_LANE, KILN_KT_F32, acc, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, kiln_kir_op(&k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0),
                kiln_kir_op(&k, KILN_KOP_BITCAST, KILN_KT_U32, v, KILN_IDX_NONE, KILN_IDX_NONE, 0), KILN_IDX_NONE, (int32_t)y);
    kiln_kir_op(&k, KILN_KOP_WG_WAIT, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t params[8] = {0}, out[128];
    uint32_t *bufs[2] = {params, out};
    char err[256];
    cr_assert(!kt_interp_block(&k, bufs, err, sizeof err));
    cr_assert(strstr(err, "in flight"), "%s", err);
    kiln_kir_free(&k);
}

/* Named barriers (NBAR_SYNC / NBAR_ARRIVE), as FlashAttention-3's warpgroup ping-pong uses them:
 * two warpgroups take turns 5 times each, warpgroup w syncing on barrier 1 + w (256 threads: its
 * own 128 and the other's arrival) and then arriving on the other's; warpgroup 0's first turn is
 * given by its own early arrival. Each turn one thread appends w to a log in shared memory. The
 * interpreter runs the lowest thread as far as it can go, so without the barriers warpgroup 0 logs
 * all its turns first: the log must alternate 0 1 0 1 ... with them, and must not without
 * (mutation `drop`: the syncs become no-ops). `hang`: warpgroup 1 never arrives, a deadlock. */
static bool nbar_pingpong(int how, uint32_t out[10], char *err, size_t n_err)
{
    kiln_kir k;
    kiln_kir_init(&k, "nbar_pingpong", 256);
    uint32_t sh = kiln_kir_shared(&k, 16), y = kiln_kir_buf(&k, KILN_KBUF_NODE, 1, true);
    uint32_t tid = kiln_kir_op(&k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t wg = kiln_kshri(&k, tid, 7), lead = kiln_k2(&k, KILN_KOP_EQ, kiln_kandi(&k, tid, 127), kiln_ki(&k, 0));
    kiln_kif(&k, kiln_k2(&k, KILN_KOP_EQ, tid, kiln_ki(&k, 0)));
    kiln_ksts(&k, sh, kiln_ki(&k, 15), kiln_ku(&k, 0)); /* the log's length */
    kiln_kendif(&k);
    kiln_kbarrier(&k);
    kiln_kif(&k, kiln_k2(&k, KILN_KOP_EQ, wg, kiln_ki(&k, 0)));
    kiln_kir_op(&k, KILN_KOP_NBAR_ARRIVE, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 256 << 8 | 1);
    kiln_kendif(&k);
    uint32_t i = kiln_kvar(&k, kiln_ki(&k, 0));
    kiln_kloop(&k, i, kiln_ki(&k, 5), kiln_ki(&k, 1));
    uint32_t mine = kiln_kaddi(&k, wg, 1), other = kiln_k2(&k, KILN_KOP_SUB, kiln_ki(&k, 2), wg); /* ids as values */
    if (how != 1) kiln_kir_op(&k, KILN_KOP_NBAR_SYNC, KILN_KT_NONE, mine, KILN_IDX_NONE, KILN_IDX_NONE, 256 << 8);
    kiln_kif(&k, lead);
    uint32_t n = kiln_kcvt(&k, KILN_KT_I32, kiln_klds(&k, sh, KILN_KT_U32, kiln_ki(&k, 15)));
    kiln_ksts(&k, sh, n, kiln_kcvt(&k, KILN_KT_U32, wg));
    kiln_ksts(&k, sh, kiln_ki(&k, 15), kiln_kcvt(&k, KILN_KT_U32, kiln_kaddi(&k, n, 1)));
    kiln_kendif(&k);
    if (how == 2) kiln_kif(&k, kiln_k2(&k, KILN_KOP_EQ, wg, kiln_ki(&k, 0)));
    kiln_kir_op(&k, KILN_KOP_NBAR_ARRIVE, KILN_KT_NONE, other, KILN_IDX_NONE, KILN_IDX_NONE, 256 << 8);
    if (how == 2) kiln_kendif(&k);
    kiln_kendloop(&k);
    kiln_kbarrier(&k);
    kiln_kif(&k, kiln_k2(&k, KILN_KOP_LT, tid, kiln_ki(&k, 10)));
    kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, tid, kiln_klds(&k, sh, KILN_KT_U32, tid), KILN_IDX_NONE, (int32_t)y);
    kiln_kendif(&k);
    uint32_t params[8] = {0};
    uint32_t *bufs[2] = {params, out};
    bool ok = kt_interp_block(&k, bufs, err, n_err);
    kiln_kir_free(&k);
    return ok;
}

Test(gemm_wg, named_barriers_take_turns)
{
    uint32_t out[10];
    char err[512];
    memset(out, 0xFF, sizeof out);
    cr_assert(nbar_pingpong(0, out, err, sizeof err), "%s", err);
    for (int i = 0; i < 10; i++) cr_assert_eq(out[i], (uint32_t)(i & 1), "turn %d taken by warpgroup %u", i, out[i]);
    memset(out, 0xFF, sizeof out);
    cr_assert(nbar_pingpong(1, out, err, sizeof err), "%s", err);
    bool alt = true;
    for (int i = 0; i < 10; i++) alt &= out[i] == (uint32_t)(i & 1);
    cr_assert(!alt, "without the syncs the turns still alternate: the test cannot fail");
    cr_assert(!nbar_pingpong(2, out, err, sizeof err), "a barrier no one completes must deadlock");
    cr_assert(strstr(err, "deadlock"), "%s", err);
}

/* Mutations of the pipeline that a GPU would turn into wrong numbers must fail here too. */
static void drop_full_wait(kiln_kir *k) /* the consumers no longer wait for a stage's bytes */
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_MBAR_WAIT && k->ins[i].b != KILN_IDX_NONE && k->ins[k->ins[i].b].op != KILN_KOP_XOR) {
            k->ins[i] = (kiln_kinst){.op = KILN_KOP_FENCE_ASYNC, .type = KILN_KT_NONE, .a = KILN_IDX_NONE, .b = KILN_IDX_NONE, .c = KILN_IDX_NONE};
            return;
        }
}
static void early_release(kiln_kir *k) /* a stage released while its WGMMAs may still read it */
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_WG_WAIT && k->ins[i].imm.i == 1) k->ins[i].imm.i = 3;
}
static void no_swizzle(kiln_kir *k) /* WGMMA reads the tiles unswizzled */
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_WGMMA) k->ins[i].imm.u &= ~2u;
}

/* Clusters (codegen.gemm_cluster): blocks of consecutive token rows share each weight tile, each
 * bringing its slice into all of them by TMA multicast and releasing stages to all of them. */
static void multicast_self_only(kiln_kir *k) /* a slice lands only in the block that brought it */
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_TMA_LOAD && k->ins[i].b != KILN_IDX_NONE) k->ins[i].b = KILN_IDX_NONE;
}
static void release_self_only(kiln_kir *k) /* consumers tell only their own block a stage is free */
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_MBAR_ARRIVE_CL) k->ins[i].op = KILN_KOP_MBAR_ARRIVE, k->ins[i].b = KILN_IDX_NONE;
}
static bool cluster_case(int cm, kiln_dtype xt, int64_t K, int64_t mmax, int64_t m, mutate_fn mut)
{
    kiln_lower_target t = kiln_lower_target_for_sm(90);
    t.opts.wgmma = KILN_GEMM_ON;
    t.opts.gemm_cluster = cm;
    return plain_case_on(KILN_DTYPE_F16, xt, K, 136, mmax, m, mut, &t);
}

Test(gemm_wg, clusters)
{
    cr_assert(!cluster_case(4, KILN_DTYPE_F16, 256, 520, 515, NULL)); /* 5 row blocks: a second cluster with 1 block of rows */
    cr_assert_eq(g_cluster, 4);
    cr_assert(!cluster_case(2, KILN_DTYPE_F32, 224, 390, 260, NULL)); /* x in two parts; the last cluster has no rows */
    cr_assert_eq(g_cluster, 2);
    cr_assert(!cluster_case(0, KILN_DTYPE_F16, 256, 300, 290, NULL)); /* the default: none */
    cr_assert_eq(g_cluster, 0);
    cr_assert(cluster_case(2, KILN_DTYPE_F16, 256, 300, 290, multicast_self_only), "slices landing in one block passed");
    cr_assert(cluster_case(4, KILN_DTYPE_F16, 512, 520, 515, release_self_only), "stages released to one block passed");
}

static void drop_turns(kiln_kir *k) /* the persistent GEMM's warpgroups do not wait for their turn */
{
    for (uint32_t i = 0; i < k->n_ins; i++)
        if (k->ins[i].op == KILN_KOP_NBAR_SYNC) k->ins[i].op = KILN_KOP_NBAR_ARRIVE;
}

Test(gemm_wg, mutations_fail)
{
    g_persist = KILN_GEMM_OFF; /* the block-a-tile GEMM (4 blocks at 140 rows: auto would take the persistent one) */
    cr_assert(plain_case_mut(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 140, 137, drop_full_wait), "a missing full-barrier wait passed");
    cr_assert(plain_case_mut(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 140, 137, early_release), "an early stage release passed");
    cr_assert(plain_case_mut(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 140, 137, no_swizzle), "unswizzled WGMMA reads passed");
    g_persist = KILN_GEMM_ON, g_sms = 3; /* the persistent one: two tiles and more a block */
    cr_assert(plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 456, 300, 290, drop_turns, NULL), "warpgroups without turns passed");
    cr_assert(plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 456, 300, 290, drop_full_wait, NULL), "persistent: a missing full-barrier wait passed");
    g_persist = 0, g_sms = 0;
}

Test(gemm_wg, f16_weights_long_k) { plain_case(KILN_DTYPE_F16, KILN_DTYPE_F32, 2048, 100, 100); } /* the ring wraps 8 times */

/* The QKV region of a multi-head llama layer: rms_norm prologue, three groups in one kernel
 * (q, k, v), rope (mode, head width hd) on q and k, k and v written to their caches; q and k after
 * rope and v are outputs too, so each group's result is checked. The epilogue runs on the
 * C tile, or with epi KILN_GEMM_ON on the accumulators (rope partners in one thread: adjacent
 * columns, or + hd / 2 with hd / 2 a multiple of 8; neox partners in other threads, hd 8, take
 * the C tile; so does a partial rope, rot of HD dims). */
static int64_t g_qkv_m = 100; /* rows (and their bound) of qkv_case */
static int64_t g_qkv_d = 256; /* its model width (K, and the columns of each of q, k, v) */

static void qkv_case(enum kiln_rope_mode mode, int64_t HD, int64_t rot, int32_t epi)
{
    wg_case c = {0};
    cr_assert_eq(kiln_graph_new(&c.g), KILN_OK);
    kiln_graph *g = c.g;
    const int64_t D = g_qkv_d, H = D / HD, m = g_qkv_m, CTX = m > 128 ? 256 : 128;
    kiln_dim M = kiln_sym(g, "m", m);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){M, D});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){M});
    kiln_node nw = tu_weight(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){D}, 0.5f, 1.5f);
    kiln_node h = kiln_rms_norm(g, x, nw, 1e-5f);
    kiln_node wq = tu_weight(g, "wq", KILN_DTYPE_F16, 2, (kiln_dim[]){D, D}, -1.0f, 1.0f);
    kiln_node wk = tu_weight(g, "wk", KILN_DTYPE_F16, 2, (kiln_dim[]){D, D}, -1.0f, 1.0f);
    kiln_node wv = tu_weight(g, "wv", KILN_DTYPE_F16, 2, (kiln_dim[]){D, D}, -1.0f, 1.0f);
    kiln_dim hd3[3] = {M, H, HD};
    kiln_node q = kiln_rope_partial(g, kiln_reshape(g, kiln_matmul(g, h, wq), 3, hd3), pos, mode, 1e4f, NULL, rot);
    kiln_node k = kiln_rope_partial(g, kiln_reshape(g, kiln_matmul(g, h, wk), 3, hd3), pos, mode, 1e4f, NULL, rot);
    kiln_node vm = kiln_matmul(g, h, wv), v = kiln_reshape(g, vm, 3, hd3);
    kiln_dim sd[3] = {H, CTX, HD};
    kiln_output(g, kiln_kv_scatter(g, kiln_state(g, "kc", KILN_DTYPE_F16, 3, sd), k, pos), "kc_out");
    kiln_output(g, kiln_kv_scatter(g, kiln_state(g, "vc", KILN_DTYPE_F16, 3, sd), v, pos), "vc_out");
    kiln_output(g, q, "q");
    kiln_output(g, k, "k");
    kiln_output(g, vm, "v");
    c.b[c.nb++] = (kiln_binding){.name = "m", .value = m};
    bind_random(&c, "x", m * D, -1.0f, 1.0f);
    int32_t *p = malloc((size_t)m * 4);
    for (int64_t i = 0; i < m; i++) p[i] = (int32_t)(i * 7 % CTX); /* positions far from the row index */
    c.in[c.nb] = p;
    c.b[c.nb++] = (kiln_binding){.name = "pos", .data = p, .bytes = (size_t)m * 4};
    g_epilogue = epi;
    char what[3][96];
    for (int o = 0; o < 3; o++)
        snprintf(what[o], sizeof what[o], "tma gemm qkv (%s rope %lld of %lld, %s epilogue): %c", mode == KILN_ROPE_NEOX ? "neox" : "normal",
                 (long long)rot, (long long)HD, epi == KILN_GEMM_ON ? "register" : "c-tile", "qkv"[o]);
    run_case(&c, "q", m, KILN_DTYPE_F16, what[0]);
    run_case(&c, "k", m, KILN_DTYPE_F16, what[1]);
    run_case(&c, "v", m, KILN_DTYPE_F16, what[2]);
    g_epilogue = 0;
    case_free(&c);
}

Test(gemm_wg, qkv_rope_kv_scatter) { qkv_case(KILN_ROPE_NORMAL, 64, 64, 0); }
Test(gemm_wg, qkv_partial_neox_rope) { qkv_case(KILN_ROPE_NEOX, 64, 32, 0); qkv_case(KILN_ROPE_NEOX, 64, 32, KILN_GEMM_ON); }
Test(gemm_wg, qkv_rope_register_epilogue) { qkv_case(KILN_ROPE_NORMAL, 64, 64, KILN_GEMM_ON); }
Test(gemm_wg, qkv_neox_rope) { qkv_case(KILN_ROPE_NEOX, 64, 64, 0); qkv_case(KILN_ROPE_NEOX, 64, 64, KILN_GEMM_ON); }
Test(gemm_wg, qkv_neox_rope_narrow_heads) { qkv_case(KILN_ROPE_NEOX, 8, 8, KILN_GEMM_ON); }
Test(gemm_wg, register_epilogue_plain_and_swiglu)
{
    g_epilogue = KILN_GEMM_ON;
    plain_case(KILN_DTYPE_F16, KILN_DTYPE_F32, 96, 160, 130);
    plain_case(KILN_DTYPE_F16, KILN_DTYPE_F16, 448, 300, 290); /* two accumulators a consumer */
    swiglu_case(64, 137, 1.0f, false);
    g_epilogue = 0;
}

/* Wide tiles (codegen.gemm_cols 192 / 256: two accumulators a consumer side by side, the second
 * 64 or 128 columns wide; x in one part): several column blocks with a tail, gate/up siblings
 * (96 or 128 columns each) and the QKV epilogue (normal and neox rope, KV writes) on the C tile of
 * bn + 4 words a row. The grid shows the width was taken. */
Test(gemm_wg, wide_tiles)
{
    static const int32_t cols[2] = {192, 256};
    for (int i = 0; i < 2; i++) {
        g_cols = cols[i];
        plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 192, 456, 150, 140, NULL, NULL);
        cr_assert_eq(g_col_blocks, (uint32_t)((456 + cols[i] - 1) / cols[i]), "bn %d: %u column blocks", cols[i], g_col_blocks);
        g_precision = KILN_PREC_F16;
        swiglu_case(128, 137, 1.0f, false);
        cr_assert_eq(g_col_blocks, 1u, "bn %d: siblings of 72 columns in %u blocks", cols[i], g_col_blocks);
        qkv_case(KILN_ROPE_NORMAL, 64, 64, 0);
        cr_assert_eq(g_col_blocks, (uint32_t)(3 * ((256 + cols[i] - 1) / cols[i])), "bn %d: qkv in %u blocks", cols[i], g_col_blocks);
        qkv_case(KILN_ROPE_NEOX, 64, 64, 0);
        g_precision = KILN_PREC_EXACT;
    }
    g_cols = 0;
}

/* The wide tiles (256 rows x 144, 160, 176 or 192 columns): four accumulators a consumer thread (up to
 * 192 registers), setmaxnreg 240 / 24, the consumers draining alone between named barriers; the
 * second n-tile narrower than 128 (16, 32, 48 columns). Columns past N in the last block (72 and
 * 200 columns a sibling against 88 a block), rows past the run's count, rope pairs and neox heads
 * across a block's columns. */
Test(gemm_wg, wide_accumulators)
{
    static const int32_t cols[4] = {144, 160, 176, 192};
    g_precision = KILN_PREC_F16;
    g_sms = 4; /* 256-row tiles: fewer waves than 128-row ones of the same width */
    for (int i = 0; i < 4; i++) {
        g_cols = cols[i];
        plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 192, 456, 300, 290, NULL, NULL);
        cr_assert_eq(g_grid0, 2u, "bn %d: %u row blocks (256-row tiles: 2)", cols[i], g_grid0);
        cr_assert_eq(g_col_blocks, (uint32_t)((456 + cols[i] - 1) / cols[i]), "bn %d: %u column blocks", cols[i], g_col_blocks);
        for (int f = 0; f < 2; f++) {
            g_swiglu_f = f ? 200 : 72;
            swiglu_case(128, 137, 1.0f, false);
            cr_assert_eq(g_col_blocks, (uint32_t)((g_swiglu_f + cols[i] / 2 - 1) / (cols[i] / 2)), "bn %d: siblings of %lld columns in %u blocks",
                         cols[i], (long long)g_swiglu_f, g_col_blocks);
        }
        g_swiglu_f = 72;
    }
    g_cols = 144; /* 48 columns of each of q, k, v: rope pairs and KV writes across blocks, 256-row tiles */
    g_qkv_m = 200;
    qkv_case(KILN_ROPE_NORMAL, 64, 64, 0);
    cr_assert_eq(g_col_blocks, 6u, "qkv in %u blocks of 48 columns a sibling", g_col_blocks);
    qkv_case(KILN_ROPE_NORMAL, 64, 64, KILN_GEMM_ON); /* the register epilogue inside the consumers' branch */
    g_cols = 192; /* the tile of llama-7b's 512-token QKV: 256 rows x 192 columns */
    qkv_case(KILN_ROPE_NORMAL, 64, 64, 0);
    cr_assert_eq(g_col_blocks, 6u, "qkv in %u blocks of 192 columns", g_col_blocks);
    g_cols = 176;
    g_epilogue = KILN_GEMM_ON;
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 192, 456, 300, 290, NULL, NULL);
    g_swiglu_f = 200;
    swiglu_case(128, 137, 1.0f, false);
    g_swiglu_f = 72;
    g_epilogue = 0;
    g_qkv_m = 100;
    g_cols = 0;
    g_sms = 0;
    g_precision = KILN_PREC_EXACT;
}

/* The persistent ping-pong GEMM (codegen.gemm_persist) on a target of 3 SMs: each of the grid's
 * blocks (at most one an SM) walks several tiles, its two consumer warpgroups taking them in turn,
 * the ring's stages counted across tiles (phases wrap mid-tile), the last stage of each tile given
 * back for the other warpgroup, a register epilogue a tile. Row tails (the run's rows short of the
 * bound: fewer tiles than the grid was sized for), column tails, x in two parts (exact) and one,
 * a residual, rms_norm + gate/up siblings + swiglu, and the QKV region's groups (q alone, k and v
 * siblings) with rope and KV writes in one tile loop. The grid shows the persistent form ran. */
Test(gemm_wg, persistent_pingpong)
{
    g_persist = KILN_GEMM_ON;
    g_sms = 3;
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F32, 96, 300, 290, 250, NULL, NULL); /* two parts, residual */
    cr_assert(g_col_blocks == 1 && g_grid0 <= 3, "not persistent: grid %u x %u", g_grid0, g_col_blocks);
    g_precision = KILN_PREC_F16;
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 448, 456, 300, 290, NULL, NULL);
    cr_assert(g_col_blocks == 1 && g_grid0 <= 3, "not persistent: grid %u x %u", g_grid0, g_col_blocks);
    g_sms = 2; /* an odd count of tiles a block */
    plain_case_on(KILN_DTYPE_BF16, KILN_DTYPE_BF16, 128, 140, 137, 137, NULL, NULL);
    g_sms = 3;
    g_swiglu_f = 200;
    swiglu_case(128, 137, 1.0f, false);
    g_swiglu_f = 72;
    g_qkv_m = 200;
    qkv_case(KILN_ROPE_NORMAL, 64, 64, 0);
    cr_assert(g_col_blocks == 1 && g_grid0 <= 3, "qkv not persistent: grid %u x %u", g_grid0, g_col_blocks);
    qkv_case(KILN_ROPE_NEOX, 64, 64, 0);
    g_qkv_m = 100;
    g_cols = 176; /* a forced width: 128-row tiles, two accumulators a side */
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 192, 456, 300, 290, NULL, NULL);
    g_cols = 0;
    g_precision = KILN_PREC_EXACT;
    g_sms = 0;
    g_persist = 0;
}

/* The persistent GEMM's splits of K (few rows: the tiles leave most SMs idle): each split's partial
 * sums into the scratch, kiln_gemm_reduce adds them and runs the epilogue (residual, swiglu,
 * rope + KV writes); the splits' K ranges end past K (zeros), rows past the run's count. The
 * region must have its reduce kernel. By default (auto) a region of many rows at its bound gets it
 * beside its GEMM for runs of 9..64 rows (lower.c splitk_variant), each set guarded by the rows. */
Test(gemm_wg, persistent_split_k)
{
    g_persist = KILN_GEMM_ON;
    g_sms = 8;
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F32, 992, 300, 64, 40, NULL, NULL); /* two parts, 15.5 stages in splits */
    cr_assert(g_grid0 <= 8 && g_col_blocks == 1 && g_saw_reduce, "split grid %u x %u, reduce %d", g_grid0, g_col_blocks, g_saw_reduce);
    g_precision = KILN_PREC_F16;
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 200, 20, 17, NULL, NULL);
    cr_assert(g_saw_reduce, "f16: no split");
    g_sms = 32;
    swiglu_case(1024, 37, 1.0f, false);
    cr_assert(g_saw_reduce, "swiglu: no split");
    g_sms = 8;
    g_qkv_m = 20, g_qkv_d = 512, g_sms = 64;
    qkv_case(KILN_ROPE_NORMAL, 64, 64, 0);
    cr_assert(g_saw_reduce, "qkv: no split (grid %u x %u)", g_grid0, g_col_blocks);
    qkv_case(KILN_ROPE_NEOX, 64, 64, 0);
    g_qkv_m = 100, g_qkv_d = 256;
    g_sms = 0;
    g_persist = 0; /* auto: a region of 300 rows at the bound gets the split variant for runs of 9..64 rows */
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 300, 300, 40, NULL, NULL);
    cr_assert(g_saw_reduce, "no split variant beside the 300-row GEMM");
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 300, 300, 200, NULL, NULL); /* the plan's GEMM */
    plain_case_on(KILN_DTYPE_F16, KILN_DTYPE_F16, 1024, 300, 300, 64, NULL, NULL);  /* the variant's last row count */
    g_precision = KILN_PREC_EXACT;
}

/* x f16 as a view at an offset a tensor map cannot start at (2 halves = 4 bytes): the split kernel
 * copies it into the scratch (two parts: the second is zero) instead of the TMA reading the node. */
Test(gemm_wg, f16_x_unaligned_view)
{
    wg_case c = {0};
    cr_assert_eq(kiln_graph_new(&c.g), KILN_OK);
    const int64_t K = 128, N = 136, m = 130;
    kiln_node xb = kiln_input(c.g, "xb", KILN_DTYPE_F16, 1, (kiln_dim[]){160 * K + 2}); /* views have constant dims */
    kiln_node x = kiln_view(c.g, xb, 2, (kiln_dim[]){m, K}, 2);
    kiln_node w = tu_weight(c.g, "w", KILN_DTYPE_F16, 2, (kiln_dim[]){N, K}, -1.0f, 1.0f);
    kiln_output(c.g, kiln_matmul(c.g, x, w), "y");
    uint16_t *v = malloc((size_t)(160 * K + 2) * 2);
    float *f = malloc((size_t)(160 * K + 2) * 4);
    tu_fill(f, 160 * K + 2, -1.0f, 1.0f);
    for (int64_t i = 0; i < 160 * K + 2; i++) v[i] = kiln_f32_to_f16(f[i]);
    free(f);
    c.in[c.nb] = v;
    c.b[c.nb++] = (kiln_binding){.name = "xb", .data = v, .bytes = (size_t)(160 * K + 2) * 2};
    run_case(&c, "y", m, KILN_DTYPE_F16, "tma gemm x f16 view at 4 bytes");
    case_free(&c);
}

/* codegen.precision = KILN_PREC_F16: f32 x in one f16 part (the split kernel's cast) and behind an
 * rms_norm (the rms kernel's one part); the 256-row tile (two accumulators) is open to f16 weights
 * then. Within tolerance_f16_act; the exact contract's 1e-10 would fail (x rounded to f16). */
Test(gemm_wg, precision_f16_one_part)
{
    g_precision = KILN_PREC_F16;
    plain_case(KILN_DTYPE_F16, KILN_DTYPE_F32, 192, 300, 290); /* measured NMSE 3.4e-8 */
    cr_assert_gt(g_last_nmse, 1e-9, "f16 x: NMSE %.2e, as exact as two parts: x was not rounded to one part", g_last_nmse);
    plain_case(KILN_DTYPE_BF16, KILN_DTYPE_F32, 128, 140, 137); /* 2.1e-6 */
    cr_assert_gt(g_last_nmse, 1e-7, "bf16 x: NMSE %.2e: x was not rounded to one part", g_last_nmse);
    g_precision = KILN_PREC_EXACT;
}

/* ---------------------------------------------------------------- the formats of wfmt_more.c */

/* q4_0, q4_1, q5_0, q5_1, iq4_nl (pairs of 32-blocks), q2_K, q3_K, iq4_xs: their rows' kernels in
 * the interpreter. The gemv for decode (x f32 and f16, every chunk position: K of several pairs or
 * blocks, N over a warp's units) with integer dot products (where the row has them) and with the
 * float decoders, the Hopper GEMM's producer decoding them (a row tail, two accumulators for the
 * 32-blocks), and get_rows of a table in the format (exact but for an FMA's ulp). */
static void get_rows_case(kiln_dtype t, int64_t V, int64_t D, int64_t n)
{
    wg_case c = {0};
    cr_assert_eq(kiln_graph_new(&c.g), KILN_OK);
    kiln_dim T = kiln_sym(c.g, "t", n);
    kiln_node tab = tu_weight(c.g, "tab", t, 2, (kiln_dim[]){V, D}, -2.0f, 2.0f);
    kiln_output(c.g, kiln_get_rows(c.g, tab, kiln_input(c.g, "ids", KILN_DTYPE_I32, 1, &T)), "y");
    c.b[c.nb++] = (kiln_binding){.name = "t", .value = n};
    int32_t *ids = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(i == 0 ? V - 1 : (i * 7919 + 13) % V);
    c.in[c.nb] = ids;
    c.b[c.nb++] = (kiln_binding){.name = "ids", .data = ids, .bytes = (size_t)n * 4};
    char what[96];
    snprintf(what, sizeof what, "get_rows %s [%lld, %lld] x %lld", kiln_dtype_name(t), (long long)V, (long long)D, (long long)n);
    kiln_lower_target tg = kiln_lower_target_default();
    run_case_on(&c, "y", n, "get_rows", t, what, NULL, &tg);
    case_free(&c);
}

static void more_format(kiln_dtype t)
{
    bool b32 = kiln_dtype_block(t) == 32;
    kiln_lower_target dp = kiln_lower_target_for_sm(80), fl = dp;
    fl.dp4a = false;
    int64_t K = b32 ? 192 : 512, K2 = b32 ? 64 : 256;
    plain_case_on(t, KILN_DTYPE_F32, K, 40, 8, 5, NULL, &dp);
    plain_case_on(t, KILN_DTYPE_F32, K, 40, 8, 3, NULL, &fl);
    plain_case_on(t, KILN_DTYPE_F16, K2, 9, 4, 4, NULL, &dp);
    /* more x words than threads, two chunks a step; 40 outputs: with 3, NMSE past 1e-4 came in 7% of
     * runs from outputs near 0 alone (x's int8 rounding, as expected; chi-square tail) */
    plain_case_on(t, KILN_DTYPE_F32, b32 ? 2048 : 4096, 40, 1, 1, NULL, &dp);
    plain_case_on(t, KILN_DTYPE_F32, b32 ? 384 : 512, 136, 160, 130, NULL, NULL);
    if (b32) plain_case_on(t, KILN_DTYPE_F32, 256, 136, 300, 290, NULL, NULL); /* two accumulators: one-stage rounds */
    get_rows_case(t, 7, b32 ? 96 : 512, 5); /* an odd number of 32-blocks a row: the pair's second reads as zeros */
}

/* gemv's pair path (codegen.gemv_pair: two adjacent chunks a lane, scales once per pair, whole x
 * groups per dot) for the formats that have it: passes of 5 of 8 tokens, f16 x, a decode row of
 * 4096 (several steps a lane), and K where a row has fewer pairs than a warp has lanes. */
static void pair_format(kiln_dtype t)
{
    kiln_lower_target tg = kiln_lower_target_for_sm(90);
    tg.opts.gemv_pair = KILN_GEMM_ON;
    bool k256 = t == KILN_DTYPE_Q4_K;
    plain_case_on(t, KILN_DTYPE_F32, 512, 40, 8, 5, NULL, &tg);
    plain_case_on(t, KILN_DTYPE_F16, 256, 9, 4, 4, NULL, &tg);
    plain_case_on(t, KILN_DTYPE_F32, 4096, 40, 1, 1, NULL, &tg);
    plain_case_on(t, KILN_DTYPE_F32, k256 ? 768 : 96, 40, 1, 1, NULL, &tg);
    plain_case_on(t, KILN_DTYPE_F32, k256 ? 2304 : 896, 136, 1, 1, NULL, &tg);
}

Test(gemm_wg, q8_0_pair_rows) { pair_format(KILN_DTYPE_Q8_0); }
Test(gemm_wg, q4_k_pair_rows) { pair_format(KILN_DTYPE_Q4_K); }

Test(gemm_wg, q4_0_rows) { more_format(KILN_DTYPE_Q4_0); }
Test(gemm_wg, q4_1_rows) { more_format(KILN_DTYPE_Q4_1); }
Test(gemm_wg, q5_0_rows) { more_format(KILN_DTYPE_Q5_0); }
Test(gemm_wg, q5_1_rows) { more_format(KILN_DTYPE_Q5_1); }
Test(gemm_wg, iq4_nl_rows) { more_format(KILN_DTYPE_IQ4_NL); }
Test(gemm_wg, q2_k_rows) { more_format(KILN_DTYPE_Q2_K); }
Test(gemm_wg, q3_k_rows) { more_format(KILN_DTYPE_Q3_K); }
Test(gemm_wg, iq4_xs_rows) { more_format(KILN_DTYPE_IQ4_XS); }
