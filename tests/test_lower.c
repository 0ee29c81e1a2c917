/* Lowering: every region of the presets (decode and prefill, every weight dtype) and of the
 * sample graphs lowers to kernels that pass the kir verifier; the regions a decode layer needs on
 * a GPU (matmul, attention, map, rows, scatter) never fall back; lowering is deterministic; the
 * supports()-to-compile() memo answers only for the region it was given. */
#include "codegen/kir.h"
#include "codegen/lower.h"
#include "codegen/lower_memo.h"
#include "codegen/wfmt.h"
#include "graph/dtype.h"
#include "fuse/fuse.h"
#include "graph/graph.h"
#include "model/presets.h"
#include "support/kirtest.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static uint64_t kir_hash(const kiln_kir *k)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < k->n_ins; i++) {
        const kiln_kinst *in = &k->ins[i];
        uint64_t f[6] = {in->op, in->type, in->a, in->b, in->c, in->imm.u};
        for (int j = 0; j < 6; j++) h = (h ^ f[j]) * 1099511628211ull;
    }
    return h ^ k->grid[0] ^ ((uint64_t)k->grid[1] << 20) ^ ((uint64_t)k->n_bufs << 40);
}

/* Lowers every region; returns how many lowered; fails the test on a verifier error. */
static int lower_all(const kiln_graph *g, bool must_all, const char *what)
{
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    int ok = 0;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir ks[KILN_LOWER_MAX], ks2[KILN_LOWER_MAX];
        uint32_t n = 0, n2 = 0;
        char err[512];
        kiln_status s = kiln_lower_region_seq(g, &f.regions[r], ks, &n, err, sizeof err);
        cr_assert(s == KILN_OK || s == KILN_ERR_UNSUPPORTED, "%s region %u: %s: %s", what, r, kiln_status_str(s), err);
        if (s != KILN_OK) {
            cr_assert(!must_all, "%s region %u (%s) did not lower: %s", what, r,
                      kiln_region_kind_name((enum kiln_region_kind)f.regions[r].kind), err);
            continue;
        }
        ok++;
        cr_assert_eq(kiln_lower_region_seq(g, &f.regions[r], ks2, &n2, err, sizeof err), KILN_OK);
        cr_assert_eq(n, n2);
        for (uint32_t i = 0; i < n; i++) {
            cr_assert_eq(kir_hash(&ks[i]), kir_hash(&ks2[i]), "%s region %u: lowering is not deterministic", what, r);
            cr_assert(ks[i].n_ins > 0 && ks[i].grid[0] > 0);
            kiln_kir_free(&ks[i]);
            kiln_kir_free(&ks2[i]);
        }
    }
    kiln_fusion_free(&f);
    return ok;
}

Test(lower, presets_decode_and_prefill)
{
    const kiln_dtype wt[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
    /* qwen2-0.5b only: the 7B presets' random weights take seconds to generate (same templates) */
    for (int p = 0; p < 1; p++)
        for (size_t w = 0; w < sizeof wt / sizeof *wt; w++)
            for (int tok = 1; tok <= 512; tok *= 512) {
                kiln_graph *g;
                cr_assert_eq(kiln_preset_build(kiln_preset_at(p), wt[w], 1, 1024, tok, &g), KILN_OK);
                char what[128];
                snprintf(what, sizeof what, "%s %s n_tok<=%d", kiln_preset_at(p)->name, kiln_dtype_name(wt[w]), tok);
                lower_all(g, true, what);
                kiln_graph_free(g);
            }
}

Test(lower, sample_graphs)
{
    const char *files[] = {"llama_layer.kg", "every_op.kg"};
    const char *dir = getenv("KILN_SOURCE_DIR") ? getenv("KILN_SOURCE_DIR") : KILN_SOURCE_DIR;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/data/%s", dir, files[i]);
        kiln_ctx *ctx;
        cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.quiet = true, .n_threads = 1}, &ctx), KILN_OK);
        kiln_graph *g = NULL;
        cr_assert_eq(kiln_kg_load(ctx, path, &g), KILN_OK, "%s: %s", path, kiln_ctx_error(ctx));
        int ok = lower_all(g, i == 0, files[i]);
        cr_assert(ok > 0);
        kiln_graph_free(g);
        kiln_ctx_free(ctx);
    }
}

/* The GPU weight-format rows (codegen/wfmt.c) and the dtype table's GPU flag (graph/dtype.c) say
 * the same: a float or block dtype has a row exactly when the GPU backends take it, and the row's
 * geometry matches the dtype's block. */
Test(lower, weight_format_rows_match_the_dtype_table)
{
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) {
        const kl_wfmt *f = kl_wfmt_of((kiln_dtype)t);
        bool gpu = kiln_dtype_on_gpu((kiln_dtype)t) && t != KILN_DTYPE_I32;
        cr_expect_eq(f != NULL, gpu, "%s: format row %s, dtype table GPU %s", kiln_dtype_name((kiln_dtype)t), f ? "yes" : "no",
                     gpu ? "yes" : "no");
        if (!f) continue;
        cr_expect_eq(f->block, kiln_dtype_block((kiln_dtype)t) > 1, "%s", kiln_dtype_name((kiln_dtype)t));
        if (f->block) cr_expect_eq(kiln_dtype_block((kiln_dtype)t) % (f->vec * f->subs), 0, "%s: chunks split blocks", kiln_dtype_name((kiln_dtype)t));
        cr_expect(f->load && f->decode && f->sub_elem && f->dev_bytes && f->repack, "%s", kiln_dtype_name((kiln_dtype)t));
    }
}

/* The memo between a GPU backend's supports() and compile() (codegen/lower_memo.h) hands back
 * exactly what was put for the same graph, region and options, once, and nothing for another
 * region, other options, another graph of the same shape, or the same graph after it grew. */
Test(lower, memo_keeps_a_lowering_for_the_same_region_only)
{
    kiln_graph *g = NULL, *g2 = NULL;
    cr_assert_eq(kiln_preset_build(kiln_preset_find("qwen2-0.5b"), KILN_DTYPE_Q8_0, 1, 64, 1, &g), KILN_OK);
    cr_assert_eq(kiln_preset_build(kiln_preset_find("qwen2-0.5b"), KILN_DTYPE_Q8_0, 1, 64, 1, &g2), KILN_OK);
    kiln_fusion f, f2;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    cr_assert_eq(kiln_fuse(g2, true, &f2), KILN_OK);
    kiln_lower_memo *m = calloc(1, sizeof *m);
    kiln_codegen_options cg = {0}, other = {.gemm = KILN_GEMM_OFF};
    uint64_t want[64];
    uint32_t n_put = 0;
    for (uint32_t r = 0; r < f.n_regions && r < 64; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        char *text[KILN_LOWER_MAX] = {0};
        uint32_t n = 0;
        char err[512];
        if (kiln_lower_region_seq(g, &f.regions[r], ks, &n, err, sizeof err) != KILN_OK) continue;
        want[r] = kir_hash(&ks[0]) ^ n;
        text[0] = strdup("printed");
        kiln_lower_memo_put(m, g, &f.regions[r], &cg, ks, text, n);
        n_put++;
    }
    cr_assert_gt(n_put, 3);
    for (uint32_t r = 0; r < f.n_regions && r < 64; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        char *text[KILN_LOWER_MAX] = {0};
        uint32_t n = 0;
        cr_assert(!kiln_lower_memo_take(m, g, &f.regions[r], &other, ks, text, &n), "region %u under other options", r);
        cr_assert(!kiln_lower_memo_take(m, g2, &f2.regions[r], &cg, ks, text, &n), "region %u of another graph", r);
        if (!kiln_lower_memo_take(m, g, &f.regions[r], &cg, ks, text, &n)) continue;
        cr_assert_eq(kir_hash(&ks[0]) ^ n, want[r], "region %u: not what was put", r);
        cr_assert_str_eq(text[0], "printed");
        cr_assert(!kiln_lower_memo_take(m, g, &f.regions[r], &cg, ks, text, &n), "region %u handed out twice", r);
        for (uint32_t i = 0; i < n; i++) kiln_kir_free(&ks[i]), free(text[i]);
        n_put--;
    }
    cr_assert_eq(n_put, 0, "every lowering put was handed back once");
    /* the graph grew: a region's kept lowering no longer answers for it */
    kiln_kir ks[KILN_LOWER_MAX];
    uint32_t n = 0;
    char err[512];
    cr_assert_eq(kiln_lower_region_seq(g, &f.regions[0], ks, &n, err, sizeof err), KILN_OK, "%s", err);
    kiln_lower_memo_put(m, g, &f.regions[0], &cg, ks, NULL, n);
    kiln_input(g, "late", KILN_DTYPE_F32, 1, (kiln_dim[]){4});
    cr_assert(!kiln_lower_memo_take(m, g, &f.regions[0], &cg, ks, NULL, &n));
    kiln_lower_memo_clear(m);
    free(m);
    kiln_fusion_free(&f);
    kiln_fusion_free(&f2);
    kiln_graph_free(g);
    kiln_graph_free(g2);
}

/* A launcher skips a kernel whose row guard fails (kiln_krows_pass, evaluated on the host): it must
 * agree with the guard the kernel itself evaluates, at every size. Kernels guarded by kl_guard_rows
 * (few rows / many rows; with a sequence count: many rows and more than per_seq a sequence) store
 * 1 when they pass; the interpreter runs them at random sizes around the caps. */
Test(lower, host_row_guard_matches_the_kernel)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim T = kiln_sym(g, "t", 4096), S = kiln_sym(g, "s", 64);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 3, (kiln_dim[]){T, 2, 24});
    kiln_node sq = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){S, 2});
    kiln_node y = kiln_input(g, "y", KILN_DTYPE_F32, 1, (kiln_dim[]){4});
    uint32_t xi, si, yi;
    cr_assert(kiln_graph_resolve(g, "test", "x", x, &xi) && kiln_graph_resolve(g, "test", "seqs", sq, &si) &&
              kiln_graph_resolve(g, "test", "y", y, &yi));
    int32_t tsym = (int32_t)kiln_sym_index(T), ssym = (int32_t)kiln_sym_index(S);
    unsigned seed = 12345u;
    int passes = 0, fails = 0;
    for (int c = 0; c < 8; c++) {
        bool small = c & 1, with_seqs = c & 2;
        int64_t per_row = c & 4 ? 48 : 24, cap = c & 4 ? 8 : 64, per_seq = 3;
        kiln_kir k;
        kiln_kir_init(&k, "guarded", 32);
        uint32_t slot = kiln_kir_buf(&k, KILN_KBUF_NODE, yi, true);
        kl_store(&k, slot, KILN_DTYPE_F32, kiln_ki(&k, 0), kiln_kf(&k, 1.0f));
        kl_guard_rows(&k, g, xi, per_row, cap, with_seqs ? si : KILN_IDX_NONE, per_seq, small);
        cr_assert(k.rows.set && k.rows.small == small);
        for (int i = 0; i < 200; i++) {
            seed = seed * 1103515245u + 12345u;
            int64_t t = 1 + (seed >> 8) % (i < 100 ? 80 : 4096), s = 1 + (seed >> 20) % 64;
            int64_t dims[64][KILN_MAX_RANK] = {{0}};
            dims[xi][0] = t, dims[xi][1] = 2, dims[xi][2] = 24;
            dims[si][0] = s, dims[si][1] = 2;
            dims[yi][0] = 4;
            uint32_t params[8] = {0}, out[4] = {0};
            params[tsym] = (uint32_t)t, params[ssym] = (uint32_t)s;
            uint32_t *bufs[4] = {params, out};
            char err[256];
            cr_assert(kt_interp_block(&k, bufs, err, sizeof err), "%s", err);
            bool host = kiln_krows_pass(&k.rows, g, (const int64_t(*)[KILN_MAX_RANK])dims), dev = out[0] == 0x3f800000u;
            cr_assert_eq(host, dev, "case %d (small %d, seqs %d, per_row %lld, cap %lld): t %lld, s %lld: host %d, kernel %d", c, small,
                         with_seqs, (long long)per_row, (long long)cap, (long long)t, (long long)s, host, dev);
            passes += dev, fails += !dev;
        }
        kiln_kir_free(&k);
    }
    cr_assert(passes > 100 && fails > 100, "sizes on both sides of the caps: %d pass, %d fail", passes, fails);
    kiln_graph_free(g);
}

/* kl_guard_rows_range (lo < rows <= cap) on the host as in the kernel, at sizes around both
 * bounds: an off-by-one on either side fails it. */
Test(lower, host_range_guard_matches_the_kernel)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim T = kiln_sym(g, "t", 4096);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, 24});
    kiln_node y = kiln_input(g, "y", KILN_DTYPE_F32, 1, (kiln_dim[]){4});
    uint32_t xi, yi;
    cr_assert(kiln_graph_resolve(g, "test", "x", x, &xi) && kiln_graph_resolve(g, "test", "y", y, &yi));
    int32_t tsym = (int32_t)kiln_sym_index(T);
    const int64_t bounds[3][2] = {{1, 8}, {3, 64}, {8, 9}};
    int passes = 0, fails = 0;
    for (int c = 0; c < 3; c++) {
        int64_t lo = bounds[c][0], cap = bounds[c][1];
        kiln_kir k;
        kiln_kir_init(&k, "ranged", 32);
        uint32_t slot = kiln_kir_buf(&k, KILN_KBUF_NODE, yi, true);
        kl_store(&k, slot, KILN_DTYPE_F32, kiln_ki(&k, 0), kiln_kf(&k, 1.0f));
        kl_guard_rows_range(&k, g, xi, 24, lo, cap);
        cr_assert(k.rows.set && k.rows.small && k.rows.lo == lo && k.rows.cap == cap);
        for (int64_t t = 1; t <= 80; t++) {
            int64_t dims[8][KILN_MAX_RANK] = {{0}};
            dims[xi][0] = t, dims[xi][1] = 24, dims[yi][0] = 4;
            uint32_t params[8] = {0}, out[4] = {0};
            params[tsym] = (uint32_t)t;
            uint32_t *bufs[4] = {params, out};
            char err[256];
            cr_assert(kt_interp_block(&k, bufs, err, sizeof err), "%s", err);
            bool host = kiln_krows_pass(&k.rows, g, (const int64_t(*)[KILN_MAX_RANK])dims), dev = out[0] == 0x3f800000u;
            cr_assert_eq(host, dev, "lo %lld, cap %lld, t %lld: host %d, kernel %d", (long long)lo, (long long)cap, (long long)t, host, dev);
            cr_assert_eq(dev, lo < t && t <= cap, "lo %lld, cap %lld, t %lld: kernel %d", (long long)lo, (long long)cap, (long long)t, dev);
            passes += dev, fails += !dev;
        }
        kiln_kir_free(&k);
    }
    cr_assert(passes > 10 && fails > 100);
    kiln_graph_free(g);
}

/* The kernels of a region (lowered: ks[0..n)) that run at n_tok = t: their count, their indices in idx. */
static uint32_t runs_at(const kiln_graph *g, const kiln_kir *ks, uint32_t n, int64_t t, uint32_t *idx)
{
    int64_t syms[8] = {0}, dims[4096][KILN_MAX_RANK];
    cr_assert(g->n_nodes <= 4096 && g->n_syms <= 8);
    for (uint32_t s = 0; s < g->n_syms; s++) syms[s] = strcmp(g->syms[s].name, "n_tok") == 0 ? t : g->syms[s].max;
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (ks[i].rows.set) kiln_node_numel(&g->nodes[ks[i].rows.node], syms, dims[ks[i].rows.node]);
        if (kiln_krows_pass(&ks[i].rows, g, (const int64_t(*)[KILN_MAX_RANK])dims)) idx[c++] = i;
    }
    return c;
}

/* Kernel a is kernel b behind a row guard (its test, IF, b's instructions, ENDIF): same grid, shared
 * memory and instructions. */
static bool same_behind_guard(const kiln_kir *a, const kiln_kir *b)
{
    bool same = strcmp(a->name, b->name) == 0 && a->n_ins > b->n_ins && a->grid[0] == b->grid[0] && a->grid[1] == b->grid[1] &&
                kiln_kir_shared_bytes(a) == kiln_kir_shared_bytes(b);
    for (uint32_t i = 0, d = a->n_ins - b->n_ins - 1; same && i < b->n_ins; i++)
        same = a->ins[d + i].op == b->ins[i].op && a->ins[d + i].type == b->ins[i].type && a->ins[d + i].imm.u == b->ins[i].imm.u;
    return same;
}

/* A decode step through a prefill-sized plan (kiln generate decodes through its prompt's plan) runs
 * the kernels a decode plan has: in every matmul and attention region of a qwen2-0.5b layer with
 * n_tok <= 16 on the H100 target, the kernels that run at one token are the decode plan's (the same
 * instructions behind their guard, shared memory and grid), where the 8-row gemv and the 8-row key
 * splits used to run; runs of 2..8 tokens take those, runs of 9 the GEMM and the flash kernel.
 * codegen.decode_kernels off: the 8-row kernels at one token again. */
Test(lower, a_decode_step_of_a_prefill_plan_runs_the_decode_kernels)
{
    const kiln_dtype wt[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
    for (size_t w = 0; w < sizeof wt / sizeof *wt; w++)
        for (int off = 0; off < 2; off++) {
            kiln_graph *gp, *gd;
            cr_assert_eq(kiln_preset_build(kiln_preset_at(0), wt[w], 1, 640, 16, &gp), KILN_OK);
            cr_assert_eq(kiln_preset_build(kiln_preset_at(0), wt[w], 1, 640, 1, &gd), KILN_OK);
            kiln_fusion fp, fd;
            cr_assert_eq(kiln_fuse(gp, true, &fp), KILN_OK);
            cr_assert_eq(kiln_fuse(gd, true, &fd), KILN_OK);
            cr_assert_eq(fp.n_regions, fd.n_regions);
            kiln_lower_target tg = kiln_lower_target_for_sm(90);
            tg.opts.decode_kernels = off ? KILN_GEMM_OFF : KILN_GEMM_AUTO;
            int checked = 0;
            for (uint32_t r = 0; r < fp.n_regions; r++) {
                int kind = fp.regions[r].kind;
                if (kind != KILN_REGION_MATMUL && kind != KILN_REGION_ATTENTION) continue;
                kiln_kir kp[KILN_LOWER_MAX], kd[KILN_LOWER_MAX];
                uint32_t np = 0, nd = 0, one[KILN_LOWER_MAX], two[KILN_LOWER_MAX], eight[KILN_LOWER_MAX], nine[KILN_LOWER_MAX];
                char err[512];
                cr_assert_eq(kiln_lower_region_for(gp, &fp.regions[r], &tg, kp, &np, err, sizeof err), KILN_OK, "%s", err);
                cr_assert_eq(kiln_lower_region_for(gd, &fd.regions[r], &tg, kd, &nd, err, sizeof err), KILN_OK, "%s", err);
                const char *what = kiln_dtype_name(wt[w]);
                cr_assert_eq(runs_at(gp, kp, np, 1, one), nd, "%s region %u: the decode plan's %u kernels at 1 token", what, r, nd);
                cr_assert_eq(runs_at(gp, kp, np, 2, two), nd);
                cr_assert_eq(runs_at(gp, kp, np, 8, eight), nd);
                uint32_t n9 = runs_at(gp, kp, np, 9, nine);
                cr_assert(n9 >= 1 && nine[0] != eight[0] && nine[0] != one[0], "%s region %u: 9 tokens, the GEMM or flash kernel", what, r);
                bool same = true, shared = true;
                for (uint32_t i = 0; i < nd; i++) same &= same_behind_guard(&kp[one[i]], &kd[i]), shared &= one[i] == two[i];
                cr_assert_eq(same, !off, "%s region %u (decode_kernels %s): the kernels at 1 token are%s the decode plan's", what, r,
                             off ? "off" : "auto", same ? "" : " not");
                cr_assert_eq(shared, (bool)off, "%s region %u: 1 and 2 tokens run %s kernels", what, r, shared ? "the same" : "other");
                for (uint32_t i = 0; i < nd; i++) cr_assert_eq(two[i], eight[i]);
                for (uint32_t i = 0; i < np; i++) kiln_kir_free(&kp[i]);
                for (uint32_t i = 0; i < nd; i++) kiln_kir_free(&kd[i]);
                checked++;
            }
            cr_assert_eq(checked, 5, "4 matmul regions and the attention");
            kiln_fusion_free(&fp);
            kiln_fusion_free(&fd);
            kiln_graph_free(gp);
            kiln_graph_free(gd);
        }
}

/* No gemv claims more shared memory than its target has, with codegen.gemv_reduce on: the portable
 * target's 32 KB (every Vulkan device) with x staged for K = 8192 (exactly 32 KB) leaves no room for
 * the split-K totals' array (1 KB), so those kernels sum with REDUCE per accumulator. */
Test(lower, gemv_shared_memory_fits_the_target)
{
    const kiln_dtype wt[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
    const int64_t Ks[] = {896, 4096, 8192};
    kiln_lower_target tgs[2] = {kiln_lower_target_default(), kiln_lower_target_for_sm(90)};
    tgs[0].opts.gemv_reduce = tgs[1].opts.gemv_reduce = KILN_GEMM_ON;
    int kernels = 0;
    for (size_t w = 0; w < sizeof wt / sizeof *wt; w++)
        for (size_t kk = 0; kk < sizeof Ks / sizeof *Ks; kk++)
            for (int tok = 1; tok <= 4; tok *= 4) {
                int64_t K = Ks[kk], N = 256;
                kiln_graph *g = NULL;
                cr_assert_eq(kiln_graph_new(&g), KILN_OK);
                kiln_dim T = kiln_sym(g, "n_tok", tok);
                kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, K});
                kiln_node nw = kiln_weight_random(g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){K}, 1, 1.0f);
                kiln_node wq = kiln_weight_random(g, "w", wt[w], 2, (kiln_dim[]){N, K}, 2, 0.1f);
                kiln_output(g, kiln_matmul(g, kiln_rms_norm(g, x, nw, 1e-5f), wq), "y");
                kiln_fusion f;
                cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
                for (uint32_t r = 0; r < f.n_regions; r++)
                    for (int t = 0; t < 2; t++) {
                        if (f.regions[r].kind != KILN_REGION_MATMUL) continue;
                        kiln_kir ks[KILN_LOWER_MAX];
                        uint32_t n = 0;
                        char err[512];
                        cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &tgs[t], ks, &n, err, sizeof err), KILN_OK, "%s", err);
                        for (uint32_t i = 0; i < n; i++) {
                            cr_assert_leq(kiln_kir_shared_bytes(&ks[i]), tgs[t].smem_bytes, "%s K %lld, %d tokens, target %d: %s %llu B",
                                          kiln_dtype_name(wt[w]), (long long)K, tok, t, ks[i].name,
                                          (unsigned long long)kiln_kir_shared_bytes(&ks[i]));
                            kernels++;
                            kiln_kir_free(&ks[i]);
                        }
                    }
                kiln_fusion_free(&f);
                kiln_graph_free(g);
            }
    cr_assert(kernels >= 48);
}

/* Under precision f16 on cuda (kiln_graph_narrow_gemm_inputs) a qwen2-0.5b layer's attention, read
 * only (through the reshape of its heads into rows) as the O matmul's x, is stored as that x's
 * 16-bit type (f16 for f16 and block weights, bf16 for bf16 ones), its reshape too, and the O
 * matmul's region on sm_90 then has no split kernel (the TMA reads the attention's output) while
 * the flash kernel stores whole 16-byte pieces of its rows (no 16-bit stores). An attention that is also an output, or
 * read by anything but a matmul's x, or before f32 weights, keeps f32. */
Test(lower, an_attention_read_only_by_the_o_matmul_is_narrowed)
{
    const kiln_dtype wt[] = {KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0, KILN_DTYPE_F32};
    for (size_t w = 0; w < sizeof wt / sizeof *wt; w++) {
        kiln_graph *g;
        cr_assert_eq(kiln_preset_build(kiln_preset_at(0), wt[w], 1, 1024, 512, &g), KILN_OK);
        kiln_graph_narrow_gemm_inputs(g);
        kiln_dtype want = wt[w] == KILN_DTYPE_F32 ? KILN_DTYPE_F32 : wt[w] == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16;
        uint32_t att = KILN_IDX_NONE;
        for (uint32_t i = 0; i < g->n_nodes; i++)
            if (g->nodes[i].op == KILN_OP_ATTENTION) att = i;
        cr_assert(att != KILN_IDX_NONE);
        cr_assert_eq(g->nodes[att].dtype, want, "%s weights: attention stored as %s", kiln_dtype_name(wt[w]),
                     kiln_dtype_name((kiln_dtype)g->nodes[att].dtype));
        int reshapes = 0;
        for (uint32_t i = att + 1; i < g->n_nodes; i++)
            if (g->nodes[i].op == KILN_OP_RESHAPE && g->nodes[i].src[0] == att) {
                cr_assert_eq(g->nodes[i].dtype, want, "the attention's reshape");
                reshapes++;
            }
        cr_assert_eq(reshapes, 1);
        kiln_fusion f;
        cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
        kiln_lower_target t0 = kiln_lower_target_for_sm(90);
        kiln_codegen_options co = {.precision = KILN_PREC_F16};
        kiln_lower_target tg = kiln_lower_target_with(&t0, &co);
        int o_regions = 0, flash = 0;
        for (uint32_t r = 0; r < f.n_regions; r++) {
            const kiln_region *rg = &f.regions[r];
            bool o_mm = rg->kind == KILN_REGION_MATMUL && g->nodes[g->nodes[rg->anchor].src[0]].op == KILN_OP_RESHAPE &&
                        g->nodes[g->nodes[rg->anchor].src[0]].src[0] == att;
            if (!o_mm && rg->kind != KILN_REGION_ATTENTION) continue;
            kiln_kir ks[KILN_LOWER_MAX];
            uint32_t n = 0;
            char err[512];
            cr_assert_eq(kiln_lower_region_for(g, rg, &tg, ks, &n, err, sizeof err), KILN_OK, "%s", err);
            for (uint32_t i = 0; i < n; i++) {
                if (o_mm && wt[w] != KILN_DTYPE_F32 && wt[w] != KILN_DTYPE_Q8_0)
                    cr_assert(strcmp(ks[i].name, "kiln_gemm_split") != 0, "%s weights: a split kernel before O", kiln_dtype_name(wt[w]));
                if (!strcmp(ks[i].name, "kiln_attn_flash_wg")) {
                    int st16 = 0, st4 = 0;
                    for (uint32_t j = 0; j < ks[i].n_ins; j++)
                        if (ks[i].ins[j].op == KILN_KOP_ST16) st16++;
                        else if (ks[i].ins[j].op == KILN_KOP_ST4) st4++;
                    cr_assert(st4 == 4 && st16 == 0, "flash_wg (hd 64: a warpgroup's 64 rows of 128 bytes, 4 pieces a thread): %d 16-bit stores, %d 16-byte ones", st16, st4);
                    flash++;
                }
                kiln_kir_free(&ks[i]);
            }
            o_regions += o_mm;
        }
        cr_assert_eq(o_regions, 1, "the O matmul's region");
        cr_assert_eq(flash, wt[w] != KILN_DTYPE_F32, "the warpgroup flash kernel (f16 caches)");
        kiln_fusion_free(&f);
        kiln_graph_free(g);
    }
    /* an attention also read by an add, or an output, keeps f32 */
    for (int c = 0; c < 2; c++) {
        kiln_graph *g;
        cr_assert_eq(kiln_graph_new(&g), KILN_OK);
        kiln_dim ts = kiln_sym(g, "t", 64), ks = kiln_sym(g, "n_kv", 128);
        kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){ts, 4, 64});
        kiln_node kc = kiln_state(g, "k", KILN_DTYPE_F16, 3, (kiln_dim[]){4, 128, 64});
        kiln_node vc = kiln_state(g, "v", KILN_DTYPE_F16, 3, (kiln_dim[]){4, 128, 64});
        kiln_node a = kiln_attention(g, q, kc, vc, ks, 0.125f);
        kiln_node x = kiln_reshape(g, a, 2, (kiln_dim[]){ts, 256});
        kiln_node wo = kiln_weight_random(g, "wo", KILN_DTYPE_F16, 2, (kiln_dim[]){256, 256}, 1, 0.1f);
        kiln_node y = kiln_matmul(g, x, wo);
        kiln_output(g, c ? y : kiln_add(g, y, x), "y");
        if (c) kiln_output(g, a, "a");
        cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
        kiln_graph_narrow_gemm_inputs(g);
        for (uint32_t i = 0; i < g->n_nodes; i++)
            if (g->nodes[i].op == KILN_OP_ATTENTION || g->nodes[i].op == KILN_OP_RESHAPE)
                cr_assert_eq(g->nodes[i].dtype, KILN_DTYPE_F32, "case %d: node %u narrowed", c, i);
        kiln_graph_free(g);
    }
}
