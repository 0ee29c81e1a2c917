/* Prefill attention's flash kernel without a GPU: the attention region lowered for the Vulkan
 * target, the cuda target (native MMA: larger tiles; exact, and codegen.precision f16: q and P as
 * one f16 part, against the contract's tolerance_f16_act) and with codegen.flash off (the first kernel),
 * every kernel of it run by the block interpreter of tests/support/kirtest.c (mma.sync included:
 * each warp's product from kir.h's fragment layouts), against the f64 reference on fresh random
 * data: f16 and f32 caches, head_dim 32/64/128, grouped-query ratios 1/4/7, n_tok not a multiple
 * of the block's rows, keys before the first query; paged steps (q8_0 pools, draft trees too). Also the interpreter's MMA against
 * kt_ref_mma. Must not use any printer or backend. */
#include <criterion/criterion.h>

#include "codegen/kir.h"
#include "fuse/fuse.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "support/kirtest.h"
#include "support/ref64.h"
#include "support/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXB 24

Test(flash_kir, interpreter_mma)
{
    kiln_kir k;
    kt_build_mma(&k);
    enum { W = KT_MMA_BLOCK * 4 };
    uint32_t a[W], b[W], out[KT_MMA_BLOCK * KT_MMA_OUT], ref[KT_MMA_BLOCK * KT_MMA_OUT], params[4] = {0};
    for (int i = 0; i < W; i++) a[i] = kt_mma_word(), b[i] = kt_mma_word();
    memset(out, 0xFF, sizeof out);
    uint32_t *bufs[4] = {params, a, b, out};
    char err[256];
    cr_assert(kt_interp_block(&k, bufs, err, sizeof err), "%s", err);
    kt_ref_mma(a, b, ref);
    for (int i = 0; i < KT_MMA_BLOCK * KT_MMA_OUT; i++) {
        float x, y;
        memcpy(&x, &out[i], 4), memcpy(&y, &ref[i], 4);
        cr_assert(KT_MMA_EXACT(i % KT_MMA_OUT) ? out[i] == ref[i] : fabsf(x - y) <= 1e-6f * (1 + fabsf(y)),
                  "word %d: %g, reference %g", i, (double)x, (double)y);
    }
    kiln_kir_free(&k);
}

enum { TGT_VULKAN, TGT_CUDA, TGT_V1, TGT_CUDA_F16, TGT_WG, TGT_N };
static const char *const tgt_name[] = {"vulkan target", "cuda target", "flash off", "cuda target, f16 precision (mma.sync)",
                                       "sm_90a, f16 precision (warpgroup kernel where it fits)"};
static bool wg_ran;        /* the last run_regions ran the warpgroup flash kernel */
static int  wg_mutate;     /* run_regions corrupts the warpgroup kernel's WGMMAs (mutation checks): 0 none */
static int32_t wg_option;  /* codegen.flash_wg for the TGT_WG runs (0: the default, ping-pong chosen by shape) */
static int32_t wg_rows, wg_split; /* codegen.flash_rows and flash_split for the TGT_WG runs (0: the shape's choice) */
static bool wg_deadlocked; /* the last run_regions' warpgroup kernel deadlocked (expected with mutation 4) */
static kiln_dtype q_dtype = KILN_DTYPE_F32; /* flash_run's q (f16: the kernels' 16-bit q loads) */
static kiln_dtype y_dtype = KILN_DTYPE_F32; /* flash_run's output type (f16/bf16: as kiln_graph_narrow_gemm_inputs
                                               stores an attention read only by an O matmul) */
static int32_t attn_cl;    /* codegen.attn_cluster of every run_regions (0: the default) */
static bool cl_ran;        /* the last run_regions ran the cluster decode kernel, and it alone */
static int64_t g_ctx;      /* flash_run's cache rows and decode mode: runs of at most 8 rows at the bound (no flash
                              kernel), C rows (0: flash runs, n_kv + 5 rows) */
static int32_t paged_dec;  /* codegen.paged_decode of every run_regions (0: the default) */
static bool co_ran;        /* the last run_regions ran the coalesced paged split kernel (codegen.paged_decode) */
static int32_t g_sms;      /* the target's SM count for run_regions (0: the target's own) */
static int32_t paged_mix;  /* codegen.paged_mixed of every run_regions (0: the default) */
static int64_t g_rows, g_row_elems; /* run_regions records which kernels wrote each of y's g_rows rows (0: not) */
static uint8_t row_by[4096];        /* bit 0: a split kernel (kiln_attn_split/combine) changed the row; bit 1: flash */
static int64_t g_blk;      /* paged_case's tokens a block (0: 16) */
static bool f16_prec(int tgt) { return tgt == TGT_CUDA_F16 || tgt == TGT_WG; }
static double worst_f16 = 0; /* largest NMSE under f16 precision (printed: the contract's bound's margin) */

/* Random values of dtype dt (f16, bf16, f32; q8_0: n a multiple of 32) in [lo, hi) into n elements
 * at mem, and as f32 at f (the values dt holds). */
static void fill(void *mem, float *f, kiln_dtype dt, int64_t n, float lo, float hi)
{
    if (dt == KILN_DTYPE_Q8_0) {
        for (int64_t i = 0; i < n; i++) f[i] = (float)tu_uniform(lo, hi);
        cr_assert_eq(kiln_quantize(dt, f, mem, n), KILN_OK);
        cr_assert_eq(kiln_dequantize(dt, mem, f, n), KILN_OK);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float x = (float)tu_uniform(lo, hi);
        if (dt == KILN_DTYPE_F16) {
            uint16_t h = kiln_f32_to_f16(x);
            ((uint16_t *)mem)[i] = h;
            x = kiln_f16_to_f32(h);
        } else if (dt == KILN_DTYPE_BF16) {
            uint16_t h = kiln_f32_to_bf16(x);
            ((uint16_t *)mem)[i] = h;
            x = kiln_bf16_to_f32(h);
        } else {
            ((float *)mem)[i] = x;
        }
        f[i] = x;
    }
}

/* A node's buffer for the interpreter: by name among names[]/mem[], the output y, else NULL. */
typedef struct kbind {
    const char *names[8];
    void       *mem[8];
    int         n;
} kbind;

/* Mutation checks of the warpgroup kernel: 1 drops the MN-major (transposed) bit of P V's WGMMAs
 * (V read as if K-major), 2 halves their leading byte offset (V's second 64 dims read from the
 * wrong place), 3 moves S's K operand of every first k16 step by 32 bytes (a wrong descriptor
 * address: the tile's dims 16..31 instead of 0..15), 4 drops the ping-pong's hand-over (a
 * warpgroup's arrival at the other's named barrier after its products): the other never gets
 * its turn, a deadlock; 5 drops a key split's stores of partial results (the first block folds in
 * the scratch buffer's NaN poison); 6 drops the guards that stand 0 in for a running max of -inf
 * (m == -inf ? 0 : m becomes m): a key split's rank whose first tile some rows see no key of
 * computes exp2(-inf - -inf), NaN (the H100's KILN_FLASH_SPLIT defect); 7 drops the epilogue's
 * warpgroup barriers (named, 128 threads) between staging the rows in shared memory and reading
 * them out: a thread reads pieces its mates have not written yet (Q's values). */
static bool is_f32_const(const kiln_kir *k, uint32_t i, float v)
{
    float x;
    memcpy(&x, &k->ins[i].imm.u, 4);
    return k->ins[i].op == KILN_KOP_CONST && k->ins[i].type == KILN_KT_F32 && x == v;
}
static void mutate_wg(kiln_kir *k, int how)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < k->n_ins; i++) {
        kiln_kinst *in = &k->ins[i];
        if (how == 4 && in->op == KILN_KOP_NBAR_ARRIVE && k->ins[in->a].op == KILN_KOP_SUB) /* the arrival at `other` = 2 - wg */
            in->op = KILN_KOP_FENCE_ASYNC, in->a = KILN_IDX_NONE, in->imm.u = 0, n++;
        if (how == 5 && in->op == KILN_KOP_ST && k->bufs[in->imm.u].kind == KILN_KBUF_SCRATCH)
            in->op = KILN_KOP_FENCE_ASYNC, in->a = in->b = KILN_IDX_NONE, in->imm.u = 0, n++;
        if (how == 7 && in->op == KILN_KOP_NBAR_SYNC && in->imm.u >> 8 == 128)
            in->op = KILN_KOP_FENCE_ASYNC, in->a = KILN_IDX_NONE, in->imm.u = 0, n++;
        if (how == 6 && in->op == KILN_KOP_SELECT && is_f32_const(k, in->b, 0.0f) && k->ins[in->a].op == KILN_KOP_EQ &&
            is_f32_const(k, k->ins[in->a].b, -INFINITY))
            in->b = in->c, n++;
        if (how >= 4 || in->op != KILN_KOP_WGMMA) continue;
        bool pv = in->imm.u & 4;
        if (how == 1 && pv) in->imm.u = (in->imm.u & ~(8u | 0x3fff0000u)), n++;
        if (how == 2 && pv) in->imm.u = (in->imm.u & ~0x3fff0000u) | ((in->imm.u >> 17 & 0x3fff) << 16), n++;
        if (how == 3 && !pv && k->ins[in->c].op == KILN_KOP_ADD) { /* c = K's stage + the step's constant */
            kiln_kinst *cst = &k->ins[k->ins[in->c].b];
            if (cst->op == KILN_KOP_CONST && cst->imm.u == 0) cst->imm.u = 32, n++;
        }
    }
    cr_assert(n, "mutation %d found nothing to change", how);
}

/* Lowers every region of g for target `tgt`, runs its kernels in the block interpreter with
 * symbol values params[] and the bound buffers, the output poisoned y; whether a flash kernel ran. */
static bool run_regions(kiln_graph *g, int tgt, uint32_t *params, const kbind *kb, float *y, const char *what)
{
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    kiln_lower_target t0 = tgt == TGT_CUDA || f16_prec(tgt) ? kiln_lower_target_for_sm(90) : kiln_lower_target_default();
    kiln_codegen_options co = {0};
    if (tgt == TGT_V1) co.flash = KILN_GEMM_OFF;
    if (f16_prec(tgt)) co.precision = KILN_PREC_F16;
    if (tgt == TGT_CUDA_F16) co.flash_wg = KILN_GEMM_OFF;
    if (tgt == TGT_WG) co.flash_wg = wg_option, co.flash_rows = wg_rows, co.flash_split = wg_split;
    co.attn_cluster = attn_cl;
    co.paged_decode = paged_dec;
    co.paged_mixed = paged_mix;
    kiln_lower_target tg = kiln_lower_target_with(&t0, &co);
    if (g_sms) tg.sm_count = g_sms;
    uint32_t yi = g->outs[0].node;
    char err[1024];
    bool flash = false;
    wg_ran = false, cl_ran = false, co_ran = false;
    cr_assert(g_rows <= (int64_t)sizeof row_by);
    memset(row_by, 0, sizeof row_by);
    float *before = g_rows ? malloc((size_t)(g_rows * g_row_elems) * 4) : NULL;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir kk[KILN_LOWER_MAX];
        uint32_t n = 0;
        cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &tg, kk, &n, err, sizeof err), KILN_OK, "%s: %s", what, err);
        cl_ran |= n == 1 && strcmp(kk[0].name, "kiln_attn_decode") == 0;
        co_ran |= n >= 1 && strstr(kk[0].what, "coalesced") != NULL;
        uint64_t sb = 0;
        for (uint32_t i = 0; i < n; i++) sb = kk[i].scratch_bytes > sb ? kk[i].scratch_bytes : sb;
        uint32_t *scratch = malloc((sb / 4 + 4) * 4);
        memset(scratch, 0xFF, (sb / 4 + 4) * 4); /* NaN poison: a partial read before it is written shows */
        for (uint32_t i = 0; i < n; i++) {
            uint32_t *bufs[MAXB] = {params};
            for (uint32_t s = 1; s < kk[i].n_bufs; s++) {
                const kiln_kbuf *b = &kk[i].bufs[s];
                cr_assert(b->kind == KILN_KBUF_SCRATCH || b->kind == KILN_KBUF_NODE, "%s: buffer kind %d", what, b->kind);
                const char *nm = b->kind == KILN_KBUF_NODE ? g->nodes[b->node].name : NULL;
                bufs[s] = b->kind == KILN_KBUF_SCRATCH ? scratch : b->node == yi ? (uint32_t *)y : NULL;
                for (int j = 0; nm && !bufs[s] && j < kb->n; j++)
                    if (!strcmp(nm, kb->names[j])) bufs[s] = kb->mem[j];
                cr_assert(bufs[s], "%s: kernel %s reads node %u", what, kk[i].name, b->node);
            }
            flash |= strcmp(kk[i].name, "kiln_attn_flash") == 0 || strcmp(kk[i].name, "kiln_attn_flash_wg") == 0;
            if (strcmp(kk[i].name, "kiln_attn_flash_wg") == 0) {
                wg_ran = true;
                if (wg_mutate) mutate_wg(&kk[i], wg_mutate);
            }
            if (before) memcpy(before, y, (size_t)(g_rows * g_row_elems) * 4);
            bool ok = kt_interp_block(&kk[i], bufs, err, sizeof err);
            if (wg_mutate == 4 && strcmp(kk[i].name, "kiln_attn_flash_wg") == 0) wg_deadlocked = !ok && strstr(err, "deadlock");
            else cr_assert(ok, "%s, kernel %s: %s", what, kk[i].name, err);
            uint8_t bit = strncmp(kk[i].name, "kiln_attn_flash", 15) == 0 ? 2 : 1;
            for (int64_t t = 0; before && t < g_rows; t++)
                if (memcmp(before + t * g_row_elems, y + t * g_row_elems, (size_t)g_row_elems * 4)) row_by[t] |= bit;
            kiln_kir_free(&kk[i]);
        }
        free(scratch);
    }
    kiln_fusion_free(&f);
    free(before);
    return flash;
}

/* The soft-cap and sliding window of the next flash_case / paged_case (kiln_attention_ext; 0: none). */
static float g_softcap;
static int64_t g_window;

/* One attention of T query rows over n_kv keys (H query heads, Hkv kv heads, caches of C rows of
 * dtype cd), lowered for target `tgt` and interpreted, checked against ref64 (or, with `mutant`, only
 * measured: returns the NMSE). stale_inf: the caches' rows past n_kv hold +inf (stale slots of an
 * earlier sequence), which no kernel may let into a result. */
static double flash_run(int tgt, kiln_dtype cd, int64_t H, int64_t Hkv, int64_t hd, int64_t T, int64_t n_kv, bool stale_inf,
                        bool mutant)
{
    const int64_t C = g_ctx ? g_ctx : n_kv + 5, Tmax = g_ctx ? (T + 3 <= 8 ? T + 3 : 8) : T + 3;
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim ts = kiln_sym(g, "t", Tmax), ks = kiln_sym(g, "n_kv", C);
    kiln_node q = kiln_input(g, "q", q_dtype, 3, (kiln_dim[]){ts, H, hd});
    kiln_node kc = kiln_state(g, "k", cd, 3, (kiln_dim[]){Hkv, C, hd}), vc = kiln_state(g, "v", cd, 3, (kiln_dim[]){Hkv, C, hd});
    kiln_output(g, kiln_attention_ext(g, q, kc, vc, ks, 0, g_softcap, g_window), "y");
    g->nodes[g->outs[0].node].dtype = (uint8_t)y_dtype; /* a narrowed attention (an output is never narrowed: set here) */
    size_t es = cd == KILN_DTYPE_F32 ? 4 : 2, nc = (size_t)(Hkv * C * hd), nq = (size_t)(T * H * hd);
    size_t qs = q_dtype == KILN_DTYPE_F32 ? 4 : 2;
    void *kmem = malloc(nc * es + 16), *vmem = malloc(nc * es + 16);
    float *kf = malloc(nc * 4), *vf = malloc(nc * 4), *qf = malloc(nq * 4), *y = malloc(nq * 4 + 16);
    fill(kmem, kf, cd, (int64_t)nc, -1, 1);
    fill(vmem, vf, cd, (int64_t)nc, -0.5f, 1.5f);
    for (size_t i = 0; stale_inf && i < nc; i++) {
        if ((int64_t)(i / (size_t)hd) % C < n_kv) continue;
        if (es == 4) ((float *)kmem)[i] = ((float *)vmem)[i] = INFINITY;
        else ((uint16_t *)kmem)[i] = ((uint16_t *)vmem)[i] = cd == KILN_DTYPE_F16 ? 0x7C00 : 0x7F80;
    }
    void *qmem = qf; /* q as f32, or as f16 in its own buffer (qf then holds its exact values) */
    if (qs == 2) qmem = malloc(nq * 2 + 16), fill(qmem, qf, KILN_DTYPE_F16, (int64_t)nq, -2, 2);
    else
        for (size_t i = 0; i < nq; i++) qf[i] = (float)tu_uniform(-2, 2);
    memset(y, 0xFF, nq * 4 + 16); /* NaN poison: every element must be written */

    uint32_t params[8] = {0};
    params[kiln_sym_index(ts)] = (uint32_t)T, params[kiln_sym_index(ks)] = (uint32_t)n_kv;
    char what[260], err[1024];
    snprintf(what, sizeof what, "%s, %s cache, %lld/%lld heads, hd %lld, %lld rows, %lld keys%s%s, softcap %g, window %lld%s",
             tgt_name[tgt], kiln_dtype_name(cd), (long long)H, (long long)Hkv, (long long)hd, (long long)T, (long long)n_kv,
             stale_inf ? ", inf past n_kv" : "", qs == 2 ? ", f16 q" : "", (double)g_softcap, (long long)g_window,
             attn_cl == KILN_GEMM_ON ? ", attn_cluster" : "");
    if (y_dtype != KILN_DTYPE_F32) snprintf(what + strlen(what), sizeof what - strlen(what), ", %s out", kiln_dtype_name(y_dtype));
    kbind kb = {.names = {"q", "k", "v"}, .mem = {qmem, kmem, vmem}, .n = 3};
    g_rows = T, g_row_elems = H * hd;
    bool flash = run_regions(g, tgt, params, &kb, y, what);
    g_rows = 0;
    cr_assert(flash == !g_ctx, "%s: flash kernel %s", what, flash ? "ran" : "did not run");
    bool wg_fits = !g_ctx && cd != KILN_DTYPE_F32 && (hd == 64 || hd == 128 || hd == 256) && H / Hkv <= 8;
    cr_assert(wg_ran == (tgt == TGT_WG && wg_fits), "%s: warpgroup kernel %s", what, wg_ran ? "ran" : "did not run");
    bool sm90 = tgt == TGT_CUDA || f16_prec(tgt);
    cr_assert(cl_ran == (g_ctx && attn_cl == KILN_GEMM_ON && sm90), "%s: cluster decode kernel %s", what, cl_ran ? "ran" : "did not run");

    ref64 *rf = ref64_new(g);
    cr_assert_eq(ref64_state_set(rf, "k", kmem, nc * es, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ref64_state_set(rf, "v", vmem, nc * es, err, sizeof err), 0, "%s", err);
    kiln_binding b[] = {{.name = "q", .data = qmem, .bytes = nq * qs}, {.name = "t", .value = T}, {.name = "n_kv", .value = n_kv}};
    cr_assert_eq(ref64_run(rf, b, 3, err, sizeof err), 0, "%s", err);
    int64_t numel;
    const double *ref = ref64_output(rf, "y", NULL, &numel);
    cr_assert(ref && numel == (int64_t)nq, "%s: reference", what);
    double *got = malloc(nq * sizeof *got), e = 0, num = 0, den = 0;
    if (y_dtype != KILN_DTYPE_F32) { /* 16-bit values: every one written (the NaN poison is 0xFFFF), widened */
        float *w = malloc(nq * 4);
        cr_assert_eq(kiln_dequantize(y_dtype, y, w, (int64_t)nq), KILN_OK);
        for (size_t i = 0; i < nq; i++) got[i] = w[i];
        free(w);
    } else {
        for (size_t i = 0; i < nq; i++) got[i] = y[i];
    }
    if (mutant) { /* a NaN or a far-off value counts as a detected mutation */
        for (size_t i = 0; i < nq; i++) num += isfinite(got[i]) ? (got[i] - ref[i]) * (got[i] - ref[i]) : INFINITY, den += ref[i] * ref[i];
        e = num / den;
    } else {
        e = tu_compare(what, got, ref, (int64_t)nq, tu_tol_prec("attention", cd, f16_prec(tgt) ? KILN_PREC_F16 : 0));
        if (f16_prec(tgt) && e > worst_f16) worst_f16 = e;
    }
    free(got);
    ref64_free(rf);
    kiln_graph_free(g);
    if (qmem != qf) free(qmem);
    free(kmem), free(vmem), free(kf), free(vf), free(qf), free(y);
    return e;
}

static void flash_case(int tgt, kiln_dtype cd, int64_t H, int64_t Hkv, int64_t hd, int64_t T, int64_t n_kv)
{
    flash_run(tgt, cd, H, Hkv, hd, T, n_kv, false, false);
}

Test(flash_kir, f16_cache)
{
    for (int tgt = 0; tgt < TGT_N; tgt++) {
        flash_case(tgt, KILN_DTYPE_F16, 2, 2, 64, 70, 90);
        flash_case(tgt, KILN_DTYPE_F16, 8, 2, 128, 41, 41);
    }
    fprintf(stderr, "flash_kir f16_cache: worst NMSE at f16 precision %.3g\n", worst_f16);
}

Test(flash_kir, f32_cache)
{
    for (int tgt = 0; tgt < TGT_N; tgt++) {
        flash_case(tgt, KILN_DTYPE_F32, 2, 1, 64, 17, 40);
        flash_case(tgt, KILN_DTYPE_F32, 4, 4, 128, 20, 33);
    }
    fprintf(stderr, "flash_kir f32_cache: worst NMSE at f16 precision %.3g\n", worst_f16);
}

Test(flash_kir, grouped_heads)
{
    for (int tgt = 0; tgt < TGT_N; tgt++) flash_case(tgt, KILN_DTYPE_F16, 7, 1, 32, 23, 150);
}

/* Paged attention of a ragged step (kiln_paged_attention): sequences with new[i] tokens after
 * prior[i] cached ones, keys through a block table of shuffled physical blocks (block 16), a pool
 * whose other slots hold other values, the unread table entries garbage; every row checked. */
static void paged_case_tree(int tgt, kiln_dtype cd, int64_t H, int64_t Hkv, int64_t hd, int n_seq, const int *nw,
                            const int *prior, const int32_t *par)
{
    const int64_t BLK = g_blk ? g_blk : 16;
    int64_t T = 0, MB = 0, need = 0;
    for (int i = 0; i < n_seq; i++) {
        int64_t nb = (prior[i] + nw[i] + BLK - 1) / BLK;
        T += nw[i], need += nb, MB = nb > MB ? nb : MB;
    }
    int64_t NB = need + 3, nc = Hkv * NB * BLK * hd, nq = T * H * hd;
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim ts = kiln_sym(g, "n_tok", T + 5), ss = kiln_sym(g, "n_seq", n_seq + 2);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){ts, H, hd});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){ts});
    kiln_node seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){ss, 2});
    kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){ss, MB});
    kiln_dim pd[] = {Hkv, NB * BLK, hd};
    kiln_node kp = kiln_state(g, "k", cd, 3, pd), vp = kiln_state(g, "v", cd, 3, pd);
    kiln_node pn = par ? kiln_input(g, "parents", KILN_DTYPE_I32, 1, (kiln_dim[]){ts}) : KILN_NODE_NONE;
    kiln_output(g, par ? kiln_paged_attention_tree(g, q, kp, vp, pos, seqs, bt, pn, BLK, 0)
                       : kiln_paged_attention_ext(g, q, kp, vp, pos, seqs, bt, BLK, 0, g_softcap, g_window), "y");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    size_t cb = tu_bytes(cd, nc, hd); /* the pools' bytes (q8_0: 34 per 32 values) */
    void *kmem = malloc(cb + 16), *vmem = malloc(cb + 16); /* + 16: a q8_0 pool is read up to 2 bytes past its end */
    float *kf = malloc((size_t)nc * 4), *vf = malloc((size_t)nc * 4), *qf = malloc((size_t)nq * 4), *y = malloc((size_t)nq * 4 + 16);
    fill(kmem, kf, cd, nc, -1, 1);
    fill(vmem, vf, cd, nc, -0.5f, 1.5f);
    for (int64_t i = 0; i < nq; i++) qf[i] = (float)tu_uniform(-2, 2);
    memset(y, 0xFF, (size_t)nq * 4 + 16);
    int32_t *perm = malloc((size_t)NB * 4), *pv = malloc((size_t)T * 4), *sv = malloc((size_t)n_seq * 8),
            *bv = malloc((size_t)(n_seq * MB) * 4);
    for (int64_t i = 0; i < NB; i++) perm[i] = (int32_t)i;
    for (int64_t i = NB - 1; i > 0; i--) { /* shuffled physical blocks */
        int64_t j = tu_randint(0, i + 1);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    for (int64_t i = 0; i < n_seq * MB; i++) bv[i] = -7; /* unread entries: garbage */
    int64_t t0 = 0, next = 0;
    for (int i = 0; i < n_seq; i++) {
        int64_t kv = prior[i] + nw[i];
        for (int64_t b = 0; b < (kv + BLK - 1) / BLK; b++) bv[i * MB + b] = perm[next++];
        sv[2 * i] = (int32_t)t0, sv[2 * i + 1] = (int32_t)kv;
        for (int j = 0; j < nw[i]; j++) { /* a tree's draft sits at its depth */
            int d = 0;
            for (int a = j; par && par[t0 + a] >= 0; a = par[t0 + a]) d++;
            pv[t0 + j] = prior[i] + (par ? d : j);
        }
        t0 += nw[i];
    }
    uint32_t params[8] = {0};
    params[kiln_sym_index(ts)] = (uint32_t)T, params[kiln_sym_index(ss)] = (uint32_t)n_seq;
    char what[260], err[1024];
    snprintf(what, sizeof what, "paged%s%s, %s, %s pool, %lld/%lld heads, hd %lld, %d sequences, %lld rows, block %lld, softcap %g, window %lld",
             par ? " tree" : "", paged_dec == KILN_GEMM_OFF ? " (paged_decode off)" : "", tgt_name[tgt], kiln_dtype_name(cd), (long long)H,
             (long long)Hkv, (long long)hd, n_seq, (long long)T, (long long)BLK, (double)g_softcap, (long long)g_window);
    kbind kb = {.names = {"q", "k", "v", "pos", "seqs", "blocks", "parents"}, .mem = {qf, kmem, vmem, pv, sv, bv, (void *)par},
                .n = par ? 7 : 6};
    /* flash off, and Vulkan's emulated MMA: the split kernels take paged steps */
    g_rows = T, g_row_elems = H * hd;
    bool flash = run_regions(g, tgt, params, &kb, y, what);
    g_rows = 0;
    cr_assert(flash == (tgt == TGT_CUDA || f16_prec(tgt)), "%s: flash kernel %s", what, flash ? "present" : "missing");
    cr_assert(!wg_ran, "%s: the warpgroup kernel took a paged step", what);
    bool co_fits = !par && cd != KILN_DTYPE_Q8_0 && hd % (cd == KILN_DTYPE_F32 ? 4 : 8) == 0 && H / Hkv * (cd == KILN_DTYPE_F32 ? 4 : 8) <= 32;
    cr_assert(co_ran == (paged_dec != KILN_GEMM_OFF && co_fits), "%s: coalesced split kernel %s", what, co_ran ? "ran" : "did not run");
    ref64 *rf = ref64_new(g);
    cr_assert_eq(ref64_state_set(rf, "k", kmem, cb, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ref64_state_set(rf, "v", vmem, cb, err, sizeof err), 0, "%s", err);
    kiln_binding b[] = {{.name = "q", .data = qf, .bytes = (size_t)nq * 4},
                        {.name = "pos", .data = pv, .bytes = (size_t)T * 4},
                        {.name = "seqs", .data = sv, .bytes = (size_t)n_seq * 8},
                        {.name = "blocks", .data = bv, .bytes = (size_t)(n_seq * MB) * 4},
                        {.name = "n_tok", .value = T},
                        {.name = "n_seq", .value = n_seq},
                        {.name = "parents", .data = (void *)par, .bytes = (size_t)T * 4}};
    cr_assert_eq(ref64_run(rf, b, par ? 7 : 6, err, sizeof err), 0, "%s", err);
    int64_t numel;
    const double *ref = ref64_output(rf, "y", NULL, &numel);
    cr_assert(ref && numel == nq, "%s: reference", what);
    double *got = malloc((size_t)nq * sizeof *got);
    for (int64_t i = 0; i < nq; i++) got[i] = y[i];
    double e = tu_compare(what, got, ref, nq, tu_tol_prec("paged_attention", cd, f16_prec(tgt) ? KILN_PREC_F16 : 0));
    if (f16_prec(tgt) && e > worst_f16) worst_f16 = e;
    free(got);
    ref64_free(rf);
    kiln_graph_free(g);
    free(kmem), free(vmem), free(kf), free(vf), free(qf), free(y), free(perm), free(pv), free(sv), free(bv);
}

static void paged_case(int tgt, kiln_dtype cd, int64_t H, int64_t Hkv, int64_t hd, int n_seq, const int *nw,
                       const int *prior)
{
    paged_case_tree(tgt, cd, H, Hkv, hd, n_seq, nw, prior, NULL);
}

/* q8_0 pools: the split kernels (Vulkan target, flash off) and the flash kernel (cuda target) read
 * ggml's blocks through the block table. */
Test(flash_kir, paged_q8_0_pools)
{
    static const int nw[] = {1, 37, 1, 150, 5}, prior[] = {20, 0, 3, 40, 100};
    static const int nw3[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, prior3[] = {0, 5, 17, 40, 99, 3, 64, 1, 15, 16, 31, 70};
    for (int tgt = 0; tgt < TGT_N; tgt++) {
        paged_case(tgt, KILN_DTYPE_Q8_0, 8, 2, 64, 5, nw, prior);
        paged_case(tgt, KILN_DTYPE_Q8_0, 4, 2, 32, 12, nw3, prior3);
    }
}

Test(flash_kir, paged_chunks)
{
    static const int nw[] = {1, 37, 1, 150, 5}, prior[] = {20, 0, 3, 40, 100};
    static const int nw2[] = {70, 1, 1}, prior2[] = {33, 64, 0};
    /* batched decode: 12 rows, one per sequence: the split kernels' guard takes it on cuda too */
    static const int nw3[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, prior3[] = {0, 5, 17, 40, 99, 3, 64, 1, 15, 16, 31, 70};
    for (int tgt = 0; tgt < TGT_N; tgt++)
        for (int off = 0; off < 2; off++) { /* the default (coalesced split kernels), codegen.paged_decode off */
            paged_dec = off ? KILN_GEMM_OFF : 0;
            paged_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 5, nw, prior);
            paged_case(tgt, KILN_DTYPE_F32, 2, 2, 128, 3, nw2, prior2);
            paged_case(tgt, KILN_DTYPE_F16, 4, 2, 64, 12, nw3, prior3);
        }
    paged_dec = 0;
    fprintf(stderr, "flash_kir paged_chunks: worst NMSE at f16 precision %.3g\n", worst_f16);
}

/* Mixed steps (codegen.paged_mixed, the default): where the coalesced split kernels sit beside the
 * flash kernel (cuda targets), each step's sequences of at most 4 new tokens are written by the split
 * kernels and the longer ones by the flash kernel, in the same step; every row against f64. Steps:
 * a prefill chunk among decoding sequences (the bench's mixed step, small), sequences of 4 and 5
 * tokens (the boundary), short sequences only but enough rows to launch the flash kernel (its blocks
 * find no tile), batched decode (the flash kernel's guard fails), a chunk alone; the lane-a-key split
 * kernels (q8_0 pools, 8 f16 heads a group) too with paged_mixed KILN_PAGED_MIXED_ALL (else whole steps).
 * With paged_mixed off, or paged_decode off (the kernels before issue #21's change), whole steps go to
 * one kernel as before; the Vulkan target has no flash kernel (split kernels only). */
static void mixed_case(int tgt, kiln_dtype cd, int64_t H, int64_t Hkv, int64_t hd, int n_seq, const int *nw, const int *prior)
{
    paged_case(tgt, cd, H, Hkv, hd, n_seq, nw, prior);
    bool flash_tgt = tgt == TGT_CUDA || tgt == TGT_CUDA_F16, whole_flash = false;
    int64_t T = 0;
    for (int i = 0; i < n_seq; i++) T += nw[i];
    int per = cd == KILN_DTYPE_F32 ? 4 : 8; /* the coalesced split kernels take the pool (lower_attn.c co_choose) */
    bool co = cd != KILN_DTYPE_Q8_0 && hd % per == 0 && H / Hkv * per <= 32;
    bool whole = paged_mix == KILN_GEMM_OFF || paged_dec == KILN_GEMM_OFF || (!co && paged_mix != KILN_PAGED_MIXED_ALL); /* as before */
    if (whole) whole_flash = flash_tgt && T > 8 && T > 4 * n_seq;
    for (int i = 0, t0 = 0; i < n_seq; t0 += nw[i++])
        for (int j = 0; j < nw[i]; j++) {
            int want = !flash_tgt ? 1 : whole ? (whole_flash ? 2 : 1) : nw[i] > 4 ? 2 : 1;
            cr_assert_eq(row_by[t0 + j], want, "%s, %s pool, sequence %d of %d new tokens, row %d: written by %s, want %s",
                         tgt_name[tgt], kiln_dtype_name(cd), i, nw[i], j,
                         row_by[t0 + j] == 1 ? "the split kernels" : row_by[t0 + j] == 2 ? "the flash kernel" : row_by[t0 + j] ? "both" : "none",
                         want == 1 ? "the split kernels" : "the flash kernel");
        }
}

Test(flash_kir, paged_mixed_steps)
{
    static const int nw[] = {1, 1, 60, 1, 1, 1, 1, 1}, prior[] = {70, 3, 20, 0, 129, 16, 45, 200};
    static const int nb[] = {4, 5, 1, 4, 6, 1}, priorb[] = {30, 61, 0, 17, 2, 90};
    static const int ns[] = {4, 4, 1, 3, 2}, priors[] = {10, 100, 5, 33, 64};      /* 14 rows - 5 >= 4: flash launched, no tile */
    static const int nd[] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, priord[] = {0, 5, 17, 40, 99, 3, 64, 1, 15};
    static const int nc[] = {40}, priorc[] = {25};
    static const int32_t modes[] = {0, KILN_GEMM_OFF, KILN_PAGED_MIXED_ALL};
    for (int mode = 0; mode < 3; mode++) {
        paged_mix = modes[mode];
        for (int tgt = 0; tgt < TGT_N; tgt++) {
            if (tgt == TGT_V1 || tgt == TGT_WG) continue; /* flash off: split kernels alone; no warpgroup kernel for pools */
            mixed_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 8, nw, prior);
            mixed_case(tgt, KILN_DTYPE_F32, 4, 4, 32, 6, nb, priorb);
            mixed_case(tgt, KILN_DTYPE_F16, 4, 1, 128, 5, ns, priors);
            mixed_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 9, nd, priord);
            mixed_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 1, nc, priorc);
            mixed_case(tgt, KILN_DTYPE_Q8_0, 8, 2, 64, 8, nw, prior); /* the lane-a-key kernels */
            mixed_case(tgt, KILN_DTYPE_F16, 8, 1, 64, 6, nb, priorb);
            paged_dec = KILN_GEMM_OFF;
            mixed_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 8, nw, prior);
            paged_dec = 0;
        }
    }
    paged_mix = 0;
}

/* The warpgroup kernel (sm_90a, f16 precision) on the shapes it takes: bf16 caches, several 128-key
 * tiles (the 2-stage ring wraps), grouped heads 1/2/4/7, rows not a multiple of 128, keys before the
 * first query, inf in the caches' slots past n_kv (V's boundary tile staged with zeros), f32 and
 * f16 q. */
Test(flash_kir, warpgroup_kernel)
{
    flash_run(TGT_WG, KILN_DTYPE_BF16, 4, 1, 128, 45, 300, false, false);
    flash_run(TGT_WG, KILN_DTYPE_F16, 7, 1, 64, 37, 290, true, false);
    flash_run(TGT_WG, KILN_DTYPE_BF16, 2, 2, 64, 130, 200, true, false);
    flash_run(TGT_WG, KILN_DTYPE_F16, 8, 2, 128, 20, 20, true, false);
    q_dtype = KILN_DTYPE_F16; /* 16-bit q: the kernel's 8-halves loads */
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 2, 128, 50, 180, false, false);
    flash_run(TGT_WG, KILN_DTYPE_BF16, 2, 1, 64, 33, 133, false, false);
    q_dtype = KILN_DTYPE_F32;
    for (int tgt = 0; tgt < TGT_N; tgt++) flash_run(tgt, KILN_DTYPE_F16, 4, 4, 64, 30, 140, true, false);
    wg_option = KILN_FLASH_WG_NO_PINGPONG; /* the A/B variant: warpgroups not taking turns */
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 2, 128, 60, 400, true, false);
    wg_option = 0;
    wg_rows = 128, wg_split = 1; /* head_dim 64 in 128-row blocks (small grids take 64 by default) */
    flash_run(TGT_WG, KILN_DTYPE_F16, 7, 1, 64, 37, 290, true, false);
    flash_run(TGT_WG, KILN_DTYPE_BF16, 2, 2, 64, 130, 200, true, false);
    wg_rows = 0, wg_split = 0;
    fprintf(stderr, "flash_kir warpgroup_kernel: worst NMSE at f16 precision %.3g\n", worst_f16);
}

/* head_dim 256 (64-key tiles; O in two accumulators, the second reading V's dims 128 .. 255) and
 * gemma's masks in the warpgroup kernel: soft-caps 50 and 2 (deep in tanh's bend), windows that end
 * inside a tile, span several (the tiles before the block's first row's window skipped: a row of
 * a later warpgroup then sees none of the first tiles it walks), and longer than every key; keys
 * before the first query; f16 and bf16 caches; grouped heads 2 and 4 (a block's rows span several
 * windows' starts). Checked against ref64 at the contract's f16-activation tolerance. */
Test(flash_kir, warpgroup_head_dim_256_and_masks)
{
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 1, 256, 40, 200, true, false);
    flash_run(TGT_WG, KILN_DTYPE_BF16, 4, 1, 256, 20, 20, false, false);
    g_softcap = 50.0f, g_window = 0;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 2, 128, 45, 260, true, false);
    g_softcap = 0, g_window = 70;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 150, 400, true, false); /* two blocks; the first walks from tile 2 */
    flash_run(TGT_WG, KILN_DTYPE_BF16, 4, 1, 64, 60, 300, false, false);
    g_softcap = 2.0f, g_window = 33;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 1, 256, 70, 180, true, false);
    g_softcap = 30.0f, g_window = 5000;
    flash_run(TGT_WG, KILN_DTYPE_BF16, 8, 4, 64, 33, 150, false, false);
    g_softcap = 0, g_window = 0;
    fprintf(stderr, "flash_kir warpgroup_head_dim_256_and_masks: worst NMSE at f16 precision %.3g\n", worst_f16);
}

/* A 16-bit output (kiln_graph_narrow_gemm_inputs: an attention read only by an O matmul with f16,
 * block or bf16 weights is stored as that matmul's x) from every kernel that writes it at f16
 * precision: the warpgroup kernel (pairs of dims packed into one word: MHA and grouped heads, head_dim
 * 64/128/256, several tiles, rows not a multiple of 128, a key split, 64-row blocks, soft-cap and
 * window), the mma.sync flash kernel (f32 caches), and the decode kernels (split + combine, the
 * cluster kernel). Every element written (NaN poison), within the contract's tolerance of f64. */
Test(flash_kir, narrowed_output)
{
    y_dtype = KILN_DTYPE_F16;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 4, 128, 200, 330, true, false);
    flash_run(TGT_WG, KILN_DTYPE_F16, 8, 2, 64, 45, 300, false, false);
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 1, 256, 40, 200, true, false);
    wg_split = 2;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 2, 128, 60, 400, true, false);
    wg_split = 0, wg_rows = 64;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 70, 170, false, false);
    wg_rows = 0, g_softcap = 30.0f, g_window = 90;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 1, 64, 150, 260, true, false);
    g_softcap = 0, g_window = 0;
    flash_run(TGT_CUDA_F16, KILN_DTYPE_F16, 4, 2, 64, 70, 90, false, false);
    flash_run(TGT_WG, KILN_DTYPE_F32, 2, 1, 128, 37, 140, true, false); /* f32 caches: the mma.sync kernel */
    for (int on = 0; on < 2; on++) { /* decode: split + combine, then the cluster kernel */
        attn_cl = on ? KILN_GEMM_ON : 0, g_ctx = 300;
        flash_run(TGT_WG, KILN_DTYPE_F16, 8, 2, 128, 3, 77, true, false);
        attn_cl = 0, g_ctx = 0;
    }
    y_dtype = KILN_DTYPE_BF16; /* bf16 O weights */
    flash_run(TGT_WG, KILN_DTYPE_BF16, 4, 1, 128, 45, 300, false, false);
    g_ctx = 40;
    flash_run(TGT_WG, KILN_DTYPE_BF16, 4, 4, 32, 2, 5, false, false);
    g_ctx = 0, y_dtype = KILN_DTYPE_F32;
    fprintf(stderr, "flash_kir narrowed_output: worst NMSE at f16 precision %.3g\n", worst_f16);
}

/* Key splits whose rank r >= 1 starts its walk at a tile that some of the block's rows see no key
 * of (those rows' keys all lie in earlier tiles, another rank's): their running max is still -inf
 * after that tile, and exp2(-inf - -inf) would be NaN (on the H100 this was KILN_FLASH_SPLIT's NaN
 * outputs: test_ops' 28/4-head and 8/2-head prefills with n_kv - n_tok not a multiple of 128).
 * Splits 2 and 4, 128 and 64 rows, head_dim 64, 128 and 256, grouped heads 1, 2 and 7 (a block's
 * rows straddle a tile's first key), keys before the first query. */
static void split_first_tile_masked(void)
{
    int32_t saved_rows = wg_rows, saved_split = wg_split;
    wg_split = 2;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 64, 150, 160, true, false);  /* rows 0..116 see none of tile 1 */
    flash_run(TGT_WG, KILN_DTYPE_BF16, 7, 1, 128, 40, 140, false, false); /* 18 tokens a block around key 128 */
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 1, 256, 40, 100, true, false);  /* 64-key tiles, 64 tokens a block */
    wg_split = 4;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 2, 128, 100, 300, true, false); /* rank 2's first tile: tokens 0..54 see none */
    wg_rows = 64;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 100, 170, false, false);
    wg_rows = saved_rows, wg_split = saved_split;
}

/* The short-prompt variants of the warpgroup kernel: 64-row blocks (one consumer warpgroup, 64-key
 * tiles at head_dim 128; head_dim 256 keeps 128) and key splits over clusters of 2 and 4 blocks (rank r walks every 2nd / 4th
 * tile from r; the first block folds the others' partial results in), alone and together: several
 * tiles per rank, ranks with no tile (fewer tiles than blocks), windows (the walk starts past t0),
 * head_dim 256 (two O accumulators folded) and 64, grouped heads, bf16, inf past n_kv; and the
 * ping-pong forced on a grouped-heads shape (off there by default). */
Test(flash_kir, warpgroup_short_prompt_variants)
{
    wg_rows = 64;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 150, 400, true, false);
    flash_run(TGT_WG, KILN_DTYPE_BF16, 4, 1, 64, 45, 300, false, false);
    g_softcap = 50.0f, g_window = 70;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 2, 128, 150, 300, true, false);
    g_softcap = 0, g_window = 0;
    wg_rows = 0, wg_split = 2;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 150, 400, true, false);
    flash_run(TGT_WG, KILN_DTYPE_BF16, 8, 2, 64, 20, 20, false, false); /* one tile: rank 1 has none */
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 1, 256, 70, 180, true, false);
    wg_split = 4;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 2, 128, 100, 700, true, false);
    g_softcap = 2.0f, g_window = 150;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 150, 600, true, false); /* the window starts the walk at tile 3 */
    g_softcap = 0, g_window = 0;
    wg_rows = 64;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 130, 330, true, false);
    wg_rows = 0;
    split_first_tile_masked();
    wg_split = 0, wg_option = KILN_FLASH_WG_PINGPONG;
    flash_run(TGT_WG, KILN_DTYPE_F16, 4, 1, 128, 60, 400, true, false);
    wg_option = 0;
    fprintf(stderr, "flash_kir warpgroup_short_prompt_variants: worst NMSE at f16 precision %.3g\n", worst_f16);
}

/* The warpgroup flash kernel's cluster (its key split) for an attention of T rows (the bound) with
 * H / Hkv heads of head_dim hd under codegen.flash_split `split` and flash_rows `rows` on an
 * H100-sized target (132 SMs). */
static uint32_t wg_block; /* the last wg_cluster's kernel's threads a block (rows * 2 + 128) */
static uint32_t wg_cluster(int64_t T, int64_t H, int64_t Hkv, int64_t hd, int32_t split, int32_t rows)
{
    kiln_graph *g;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim ts = kiln_sym(g, "t", T), ks = kiln_sym(g, "n_kv", 4096);
    kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){ts, H, hd});
    kiln_node kc = kiln_state(g, "k", KILN_DTYPE_F16, 3, (kiln_dim[]){Hkv, 4096, hd});
    kiln_node vc = kiln_state(g, "v", KILN_DTYPE_F16, 3, (kiln_dim[]){Hkv, 4096, hd});
    kiln_output(g, kiln_attention(g, q, kc, vc, ks, 0), "y");
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    kiln_lower_target t0 = kiln_lower_target_for_sm(90);
    kiln_codegen_options co = {.precision = KILN_PREC_F16, .flash_split = split, .flash_rows = rows};
    kiln_lower_target tg = kiln_lower_target_with(&t0, &co);
    cr_assert_eq(tg.sm_count, 132);
    uint32_t cl = UINT32_MAX;
    char err[512];
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir kk[KILN_LOWER_MAX];
        uint32_t n = 0;
        cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &tg, kk, &n, err, sizeof err), KILN_OK, "%s", err);
        for (uint32_t i = 0; i < n; i++) {
            if (strcmp(kk[i].name, "kiln_attn_flash_wg") == 0) cl = kk[i].cluster, wg_block = kk[i].block;
            kiln_kir_free(&kk[i]);
        }
    }
    kiln_fusion_free(&f);
    kiln_graph_free(g);
    cr_assert(cl != UINT32_MAX, "%lld rows, %lld/%lld heads, hd %lld: no warpgroup flash kernel", (long long)T, (long long)H,
              (long long)Hkv, (long long)hd);
    return cl;
}

/* codegen.flash_split = -1 (KILN_FLASH_SPLIT=auto) splits where the grid leaves SMs idle and the
 * walk has the tiles: 512 tokens of 14/2 heads at head_dim 64 (56 blocks) and of 16/8 at 256 (64)
 * over 2; 32 heads of 128 rows at 256 tokens (64 blocks) over 2, at 128 tokens (1 tile) not; 512
 * tokens of 32/32 and 32/8 (128 blocks) and 4096 tokens not; 64-row blocks count two an SM; the
 * default (0) and 1 never split, 2 and 4 always. */
Test(flash_kir, warpgroup_split_choice)
{
    cr_assert_eq(wg_cluster(512, 14, 2, 64, -1, 0), 2);
    cr_assert_eq(wg_cluster(512, 16, 8, 256, -1, 0), 2);
    cr_assert_eq(wg_cluster(256, 32, 32, 128, -1, 0), 2);
    cr_assert_eq(wg_cluster(512, 4, 4, 128, -1, 0), 4);   /* 16 blocks */
    cr_assert_eq(wg_cluster(128, 32, 32, 128, -1, 0), 0); /* one key tile */
    cr_assert_eq(wg_cluster(512, 32, 32, 128, -1, 0), 0);
    cr_assert_eq(wg_cluster(512, 32, 8, 128, -1, 0), 0);
    cr_assert_eq(wg_cluster(4096, 14, 2, 64, -1, 0), 0);
    cr_assert_eq(wg_cluster(512, 32, 32, 128, -1, 64), 0); /* 256 blocks, two an SM */
    cr_assert_eq(wg_cluster(256, 32, 32, 128, -1, 64), 2); /* 128 blocks of 64 rows */
    cr_assert_eq(wg_cluster(512, 14, 2, 64, 1, 0), 0);
    cr_assert_eq(wg_cluster(512, 32, 32, 128, 2, 0), 2);
    cr_assert_eq(wg_cluster(512, 32, 32, 128, 4, 0), 4);
    /* the defaults (0, 0): 64-row blocks at head_dim 64, split at 128 and 256, where 128-row blocks leave half the SMs idle */
    cr_assert_eq(wg_cluster(512, 14, 2, 64, 0, 0), 0);
    cr_assert_eq(wg_block, 256, "512 tokens, 14/2 heads, hd 64: 64-row blocks by default");
    cr_assert_eq(wg_cluster(512, 14, 2, 64, 0, 128), 2); /* 128 rows forced: split instead */
    cr_assert_eq(wg_block, 384);
    cr_assert_eq(wg_cluster(512, 16, 8, 256, 0, 0), 2);
    cr_assert_eq(wg_cluster(256, 32, 32, 128, 0, 0), 2);
    cr_assert_eq(wg_block, 384);
    cr_assert_eq(wg_cluster(512, 32, 32, 128, 0, 0), 0);
    cr_assert_eq(wg_block, 384);
    cr_assert_eq(wg_cluster(512, 32, 8, 128, 0, 0), 0);
    cr_assert_eq(wg_cluster(4096, 14, 2, 64, 0, 0), 0);
    cr_assert_eq(wg_block, 384, "4096 tokens, 14/2 heads, hd 64: 128-row blocks");
    cr_assert_eq(wg_cluster(256, 32, 32, 128, 1, 0), 0);
}

/* A wrong transposition or descriptor in the warpgroup kernel's WGMMAs fails: each mutation's NMSE
 * is past 100x the contract's tolerance (measured >= 1.4e-3; the kernel itself stays under 1e-8). */
Test(flash_kir, warpgroup_mutations)
{
    double tol = tu_tol_prec("attention", KILN_DTYPE_F16, KILN_PREC_F16);
    for (int how = 1; how <= 3; how++) {
        wg_mutate = how;
        double e = flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 40, 150, false, true);
        wg_mutate = 0;
        cr_assert(e > 100 * tol, "mutation %d: NMSE %.3g is within 100x the tolerance %.1g", how, e, tol);
        fprintf(stderr, "flash_kir warpgroup_mutations: mutation %d NMSE %.3g\n", how, e);
    }
    wg_mutate = 5, wg_split = 2; /* the fold reads what the other block of the cluster stored */
    double e5 = flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 150, 400, false, true);
    wg_mutate = 0, wg_split = 0;
    cr_assert(!(e5 <= 100 * tol), "mutation 5: NMSE %.3g is within 100x the tolerance %.1g", e5, tol);
    for (int32_t sp = 2; sp <= 4; sp += 2) { /* rank sp - 1 starts at tile 1 or 3, which rows 0 .. 116 see no key of */
        wg_mutate = 6, wg_split = sp;
        double e6 = flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 64, 150, sp == 2 ? 160 : 420, true, true);
        wg_mutate = 0, wg_split = 0;
        cr_assert(!(e6 <= 100 * tol), "mutation 6, split %d: NMSE %.3g is within 100x the tolerance %.1g", sp, e6, tol);
    }
    for (int f32 = 0; f32 < 2; f32++) { /* the 16-bit output's one pass, f32's two */
        wg_mutate = 7, y_dtype = f32 ? KILN_DTYPE_F32 : KILN_DTYPE_F16;
        double e7 = flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 150, 200, false, true);
        wg_mutate = 0, y_dtype = KILN_DTYPE_F32;
        cr_assert(!(e7 <= 100 * tol), "mutation 7 (%s out): NMSE %.3g is within 100x the tolerance %.1g", f32 ? "f32" : "f16", e7, tol);
        fprintf(stderr, "flash_kir warpgroup_mutations: mutation 7 (%s out) NMSE %.3g\n", f32 ? "f32" : "f16", e7);
    }
    wg_mutate = 4, wg_deadlocked = false;
    flash_run(TGT_WG, KILN_DTYPE_F16, 2, 2, 128, 40, 300, false, true); /* 3 tiles: the loop runs */
    wg_mutate = 0;
    cr_assert(wg_deadlocked, "mutation 4 (no hand-over at the named barrier): no deadlock");
}

/* Soft-capped scores and sliding windows in the flash kernel (and the split kernels of the flash-off
 * target): windows ending inside a 64-key tile, across tiles and past every key; the paged step's
 * sequences each masked at their own positions. */
Test(flash_kir, softcap_and_window)
{
    static const int nw[] = {1, 37, 150}, prior[] = {20, 0, 40};
    for (int tgt = 0; tgt < TGT_N; tgt++) {
        g_softcap = 2.0f, g_window = 40;
        flash_case(tgt, KILN_DTYPE_F16, 2, 2, 64, 70, 90);
        g_softcap = 0, g_window = 7;
        flash_case(tgt, KILN_DTYPE_F32, 4, 2, 128, 20, 33);
        g_softcap = 50.0f, g_window = 500;
        flash_case(tgt, KILN_DTYPE_F16, 7, 1, 32, 23, 150);
        g_softcap = 1.0f, g_window = 29;
        paged_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 3, nw, prior);
    }
    g_softcap = 0, g_window = 0;
    fprintf(stderr, "flash_kir softcap_and_window: worst NMSE at f16 precision %.3g\n", worst_f16);
}

/* Decode (runs of at most 8 rows at the graph's bound: no flash kernel) on every target, with
 * codegen.attn_cluster on and off: on sm_90 with it on, the key splits of a query-head group are one
 * thread block cluster's blocks that combine through distributed shared memory (kiln_attn_decode,
 * the region's only kernel; the interpreter runs a cluster's blocks together and their LDS_CL
 * reads); else the split and combine kernels. Clusters of 2 to 8 blocks of 1 to 4 warps (the cache
 * bound sets them), splits past n_kv (empty blocks, stale inf rows there), grouped heads split over
 * blocks (qwen2-0.5b's 14/2 heads), several rows, soft-cap and window; f16, bf16 and f32 caches. */
static void decode_case(kiln_dtype cd, int64_t H, int64_t Hkv, int64_t hd, int64_t T, int64_t n_kv, int64_t ctx, bool stale_inf)
{
    g_ctx = ctx;
    for (int on = 0; on < 2; on++) {
        attn_cl = on ? KILN_GEMM_ON : 0;
        for (int tgt = 0; tgt < TGT_N; tgt++) {
            if (tgt == TGT_V1 || tgt == TGT_CUDA_F16) continue; /* the flash variants: the same decode kernels */
            flash_run(tgt, cd, H, Hkv, hd, T, n_kv, stale_inf, false);
        }
    }
    attn_cl = 0, g_ctx = 0;
}

Test(flash_kir, decode_cluster)
{
    decode_case(KILN_DTYPE_F16, 14, 2, 64, 1, 1000, 1058, true); /* qwen2-0.5b: 8 blocks x 4 warps */
    decode_case(KILN_DTYPE_F32, 8, 2, 128, 3, 77, 300, true);    /* most blocks past n_kv */
    decode_case(KILN_DTYPE_BF16, 4, 4, 32, 2, 5, 40, false);     /* 2 one-warp blocks */
    g_softcap = 30.0f, g_window = 100;
    decode_case(KILN_DTYPE_F16, 7, 1, 64, 4, 600, 700, false);
    g_softcap = 0, g_window = 0;
}

/* Speculative verification (kiln_paged_attention_tree) on the flash kernel: random forests of drafts
 * (each draft's parent a random earlier draft or none), paths across key tiles (90 drafts after 45
 * cached keys), a chain, a lone root; every row against ref64's tree mask. */
Test(flash_kir, paged_trees)
{
    static const int nw[] = {90, 1, 12, 20}, prior[] = {45, 7, 0, 100};
    int32_t par[123];
    for (int t0 = 0, s = 0; s < 4; t0 += nw[s++])
        for (int i = 0; i < nw[s]; i++) par[t0 + i] = s == 2 ? i - 1 : (int32_t)tu_randint(-1, i); /* sequence 2: a chain */
    for (int tgt = 0; tgt < TGT_N; tgt++) {
        paged_case_tree(tgt, KILN_DTYPE_F16, 8, 2, 64, 4, nw, prior, par);
        paged_case_tree(tgt, KILN_DTYPE_F32, 2, 2, 128, 4, nw, prior, par);
    }
}

/* codegen.paged_decode: the coalesced split kernels (a key row's 16-byte chunks over consecutive
 * lanes, splits sized per row from its key count and the step's sequences, a loop over the step's
 * rows) on every target: batched decode of 1 to 17 sequences (ragged, 1 to 1000 keys: one split to
 * eight, several tiles a split), rows per sequence 1 to 4 (and, on the Vulkan target, prefill chunks),
 * blocks of 16 and 128, MHA and grouped heads 2/4 (f16) and 4/8 (f32), head_dim 32 to 256, f16/bf16/f32
 * pools, soft-cap and window; an SM count of 1 and codegen.paged_decode = 2 (waves of 2 blocks an SM)
 * make a step want fewer splits than the grid has (co_want). q8_0 pools and groups of 7 or 8 f16 heads keep the lane-a-key kernels (checked: the
 * coalesced kernel does not run there). */
Test(flash_kir, paged_decode_coalesced)
{
    static const int one[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const int prior17[] = {0, 999, 31, 32, 33, 64, 300, 5, 127, 128, 129, 17, 511, 700, 1, 2, 250};
    static const int few[] = {2, 1, 4, 3}, prior4[] = {40, 0, 260, 95};
    static const int chunk[] = {1, 37, 1}, priorc[] = {20, 0, 300};
    paged_dec = KILN_GEMM_ON;
    for (int tgt = 0; tgt < TGT_N; tgt++) {
        if (tgt == TGT_V1 || tgt == TGT_WG) continue; /* the same split kernels as the cuda target's */
        g_blk = 16;
        paged_case(tgt, KILN_DTYPE_F16, 4, 4, 128, 17, one, prior17);
        paged_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 4, few, prior4);
        paged_case(tgt, KILN_DTYPE_F16, 8, 2, 32, 4, few, prior4);
        paged_case(tgt, KILN_DTYPE_F32, 2, 2, 128, 4, few, prior4);
        paged_case(tgt, KILN_DTYPE_F32, 8, 1, 64, 3, chunk, priorc); /* 8 heads a group; cuda: the flash kernel takes the chunk */
        paged_case(tgt, KILN_DTYPE_F16, 7, 1, 64, 4, few, prior4);   /* 7 f16 heads a group: not taken */
        if (tgt == TGT_VULKAN) { /* no flash kernel for bf16 pools or head_dim 256: the split kernels take every step */
            paged_case(tgt, KILN_DTYPE_BF16, 4, 1, 64, 4, few, prior4);
            paged_case(tgt, KILN_DTYPE_F16, 2, 1, 256, 3, chunk, priorc);
        }
        g_blk = 128;
        paged_case(tgt, KILN_DTYPE_F16, 8, 2, 128, 17, one, prior17);
        g_sms = 1; /* 24 blocks at once: 1 split a row (17 x 4 kv heads), 3 (4 x 2) */
        paged_case(tgt, KILN_DTYPE_F16, 4, 4, 128, 17, one, prior17);
        paged_case(tgt, KILN_DTYPE_F32, 8, 2, 64, 4, few, prior4);
        g_sms = 0, g_blk = 16;
        paged_dec = 2; /* waves of 2 blocks an SM (A/B runs): 264 blocks, 3 splits for 17 x 4 */
        paged_case(tgt, KILN_DTYPE_F16, 4, 4, 128, 17, one, prior17);
        paged_dec = KILN_GEMM_ON;
        g_softcap = 30.0f, g_window = 100;
        paged_case(tgt, KILN_DTYPE_F16, 8, 2, 64, 4, few, prior4);
        g_softcap = 0, g_window = 0;
        paged_case(tgt, KILN_DTYPE_Q8_0, 4, 2, 32, 4, few, prior4); /* not taken */
    }
    paged_dec = 0, g_blk = 0;
    fprintf(stderr, "flash_kir paged_decode_coalesced: worst NMSE at f16 precision %.3g\n", worst_f16);
}

/* Pools past 32-bit indices are refused at lowering with a message naming them, never run (on the
 * H100 a 2.2 G-element llama-7b pool hit illegal addresses): 32 kv heads x 600000 slots x 128 (2.5 G
 * elements) on both kernels; 300000 slots (1.2 G elements, 2.5 G bytes) only on the lane-a-key
 * kernel (byte offsets), which codegen.paged_decode off keeps. Lowering only: nothing is allocated. */
Test(flash_kir, paged_pool_past_32_bits_refused)
{
    static const int64_t slots[] = {600000, 300000};
    for (int i = 0; i < 2; i++)
        for (int off = 0; off < 2; off++) {
            kiln_graph *g;
            cr_assert_eq(kiln_graph_new(&g), KILN_OK);
            kiln_dim ts = kiln_sym(g, "n_tok", 64), ss = kiln_sym(g, "n_seq", 64);
            kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){ts, 32, 128});
            kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){ts});
            kiln_node seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){ss, 2});
            kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){ss, 100});
            kiln_dim pd[] = {32, slots[i], 128};
            kiln_node kp = kiln_state(g, "k", KILN_DTYPE_F16, 3, pd), vp = kiln_state(g, "v", KILN_DTYPE_F16, 3, pd);
            kiln_output(g, kiln_paged_attention_ext(g, q, kp, vp, pos, seqs, bt, 16, 0, 0, 0), "y");
            cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
            kiln_fusion f;
            cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
            kiln_lower_target t0 = kiln_lower_target_for_sm(90);
            kiln_codegen_options co = {.paged_decode = off ? KILN_GEMM_OFF : 0};
            kiln_lower_target tg = kiln_lower_target_with(&t0, &co);
            bool refused = false;
            char err[1024] = "";
            for (uint32_t r = 0; r < f.n_regions; r++) {
                kiln_kir kk[KILN_LOWER_MAX];
                uint32_t n = 0;
                kiln_status s = kiln_lower_region_for(g, &f.regions[r], &tg, kk, &n, err, sizeof err);
                if (s != KILN_OK) {
                    cr_assert(strstr(err, "past 32-bit indices"), "%lld slots, paged_decode %s: %s", (long long)slots[i], off ? "off" : "on", err);
                    refused = true;
                }
                for (uint32_t j = 0; s == KILN_OK && j < n; j++) kiln_kir_free(&kk[j]);
            }
            cr_assert_eq(refused, i == 0 || off, "%lld slots, paged_decode %s: %s", (long long)slots[i], off ? "off" : "on",
                         refused ? "refused" : "lowered");
            kiln_fusion_free(&f);
            kiln_graph_free(g);
        }
}
