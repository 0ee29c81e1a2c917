/* Programmatic dependent launch (codegen.pdl on sm_90, codegen/lower_pdl.c): the kir verifier
 * refuses a kernel that reads a kernel-written buffer or stores before its top-level grid wait
 * (hand-built kernels and a real gemv whose wait is moved); every region of the presets lowers
 * with the trigger first and one top-level wait, the decode gemv with weight prefetches before it
 * (and, with codegen.gemv_preload alone, with weight loads before it reads x and no pdl op);
 * and the pdl kernels, run by the block interpreter on fresh random data, give the same bits as the
 * plain kernels and match the f64 reference. Printing and ptxas are test_ptx's. */
#include <criterion/criterion.h>

#include "codegen/kir.h"
#include "fuse/fuse.h"
#include "graph/graph.h"
#include "model/presets.h"
#include "support/kirtest.h"
#include "support/ref64.h"
#include "support/testutil.h"

#include <stdlib.h>
#include <string.h>

#define N KILN_IDX_NONE

static kiln_lower_target pdl_target(bool on)
{
    kiln_lower_target t = kiln_lower_target_for_sm(90);
    t.opts.pdl = on ? KILN_GEMM_ON : KILN_GEMM_AUTO;
    return t;
}

/* sm_90 with codegen.pdl = mode (KILN_GEMM_ON, KILN_PDL_NO_PREFETCH, KILN_PDL_REGS; 0 off) and gemv_pair. */
static kiln_lower_target mode_target(int32_t mode, bool pair)
{
    kiln_lower_target t = kiln_lower_target_for_sm(90);
    t.opts.pdl = mode;
    t.opts.gemv_pair = pair ? KILN_GEMM_ON : KILN_GEMM_AUTO;
    return t;
}

/* ------------------------------------------------------------------ the verifier's check */

/* A pdl kernel: slot 1 a weight (constant), 2 an activation, 3 the output. `order` says where the
 * wait goes: 0 correct (weight read, wait, activation read, store), 1 after the activation read,
 * 2 after the store, 3 inside an if, 4 nowhere. */
static void build_ordered(kiln_kir *k, int order)
{
    kiln_kir_init(k, "pdl_order", 32);
    uint32_t w = kiln_kir_buf(k, KILN_KBUF_NODE, 1, false), x = kiln_kir_buf(k, KILN_KBUF_NODE, 2, false);
    uint32_t y = kiln_kir_buf(k, KILN_KBUF_NODE, 3, true);
    k->pdl = true;
    k->pdl_const = 1u << 0 | 1u << w;
    kiln_kir_op(k, KILN_KOP_GRID_LAUNCH, KILN_KT_NONE, N, N, N, 0);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0);
    kiln_kir_op(k, KILN_KOP_PREFETCH, KILN_KT_NONE, tid, N, N, (int32_t)w);
    uint32_t wv = kiln_kld(k, w, tid);
    if (order == 0) kiln_kir_op(k, KILN_KOP_GRID_WAIT, KILN_KT_NONE, N, N, N, 0);
    if (order == 3) {
        kiln_kif(k, kiln_k2(k, KILN_KOP_EQ, tid, kiln_ki(k, 0)));
        kiln_kir_op(k, KILN_KOP_GRID_WAIT, KILN_KT_NONE, N, N, N, 0);
        kiln_kendif(k);
    }
    uint32_t xv = kiln_kld(k, x, tid);
    if (order == 1) kiln_kir_op(k, KILN_KOP_GRID_WAIT, KILN_KT_NONE, N, N, N, 0);
    kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, tid, kiln_k2(k, KILN_KOP_XOR, wv, xv), N, (int32_t)y);
    if (order == 2) kiln_kir_op(k, KILN_KOP_GRID_WAIT, KILN_KT_NONE, N, N, N, 0);
}

Test(pdl, verifier_wants_the_wait_before_dependent_reads_and_stores)
{
    static const char *const want[] = {NULL, "reads buffer slot 2 before", "reads buffer slot 2 before",
                                       "reads buffer slot 2 before", "reads buffer slot 2 before"};
    for (int order = 0; order < 5; order++) {
        kiln_kir k;
        build_ordered(&k, order);
        char err[512] = "";
        bool ok = kiln_kir_verify(&k, err, sizeof err);
        if (!want[order]) cr_assert(ok, "correct order refused: %s", err);
        else cr_assert(!ok && strstr(err, want[order]), "order %d: %s", order, ok ? "accepted" : err);
        k.pdl = false; /* the same instructions in a kernel launched plainly: no ordering to keep */
        cr_assert(kiln_kir_verify(&k, err, sizeof err), "order %d without pdl: %s", order, err);
        kiln_kir_free(&k);
    }
    /* a store first, and a kernel that never waits though it reads nothing a kernel writes */
    kiln_kir k;
    kiln_kir_init(&k, "pdl_store", 32);
    uint32_t y = kiln_kir_buf(&k, KILN_KBUF_NODE, 3, true);
    k.pdl = true;
    k.pdl_const = 1;
    uint32_t tid = kiln_kir_op(&k, KILN_KOP_TID, KILN_KT_I32, N, N, N, 0);
    kiln_kir_op(&k, KILN_KOP_ST, KILN_KT_NONE, tid, kiln_ku(&k, 7), N, (int32_t)y);
    char err[512] = "";
    cr_assert(!kiln_kir_verify(&k, err, sizeof err) && strstr(err, "stores to buffer slot 1 before"), "%s", err);
    kiln_kir_free(&k);
    kiln_kir_init(&k, "pdl_never", 32);
    k.pdl = true;
    kiln_kir_op(&k, KILN_KOP_GRID_LAUNCH, KILN_KT_NONE, N, N, N, 0);
    cr_assert(!kiln_kir_verify(&k, err, sizeof err) && strstr(err, "no grid wait at its top level"), "%s", err);
    kiln_kir_free(&k);
    /* parameters are loaded at entry: the parameter buffer must be one no kernel writes */
    kiln_kir_init(&k, "pdl_param", 32);
    k.pdl = true;
    kiln_kir_op(&k, KILN_KOP_GRID_WAIT, KILN_KT_NONE, N, N, N, 0);
    kiln_kir_op(&k, KILN_KOP_PARAM, KILN_KT_I32, N, N, N, 0);
    cr_assert(!kiln_kir_verify(&k, err, sizeof err) && strstr(err, "parameter buffer"), "%s", err);
    k.pdl_const = 1;
    cr_assert(kiln_kir_verify(&k, err, sizeof err), "%s", err);
    kiln_kir_free(&k);
}

/* Index of the first top-level GRID_WAIT of k (n_ins when none). */
static uint32_t top_wait(const kiln_kir *k)
{
    int depth = 0;
    for (uint32_t i = 0; i < k->n_ins; i++) {
        uint8_t op = k->ins[i].op;
        if (op == KILN_KOP_GRID_WAIT && depth == 0) return i;
        depth += op == KILN_KOP_LOOP || op == KILN_KOP_IF;
        depth -= op == KILN_KOP_ENDLOOP || op == KILN_KOP_ENDIF;
    }
    return k->n_ins;
}

/* Moves instruction `from` (no operands, nothing uses it) to the end of k. */
static void move_to_end(kiln_kir *k, uint32_t from)
{
    kiln_kinst in = k->ins[from];
    memmove(&k->ins[from], &k->ins[from + 1], (k->n_ins - from - 1) * sizeof *k->ins);
    k->ins[k->n_ins - 1] = in;
    for (uint32_t i = from; i + 1 < k->n_ins; i++) {
        kiln_kinst *x = &k->ins[i];
        if (x->a != N && x->a > from) x->a--;
        if (x->b != N && x->b > from) x->b--;
        if (x->c != N && x->c > from) x->c--;
    }
}

/* The qwen2-0.5b decode layer lowered for pdl: every kernel passes; the same kernels with their
 * wait moved to the end are caught. */
Test(pdl, verifier_catches_a_moved_wait_in_lowered_kernels)
{
    kiln_graph *g;
    cr_assert_eq(kiln_preset_build(kiln_preset_at(0), KILN_DTYPE_Q4_K, 1, 256, 1, &g), KILN_OK);
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    kiln_lower_target t = pdl_target(true);
    int caught = 0;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        uint32_t n = 0;
        char err[512];
        cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &t, ks, &n, err, sizeof err), KILN_OK, "region %u: %s", r, err);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t w = top_wait(&ks[i]);
            cr_assert(ks[i].pdl && w < ks[i].n_ins, "region %u kernel %s: no top-level wait", r, ks[i].name);
            move_to_end(&ks[i], w);
            cr_assert(!kiln_kir_verify(&ks[i], err, sizeof err), "region %u kernel %s: a wait at the end passed", r, ks[i].name);
            cr_assert(strstr(err, "before the kernel's top-level grid wait"), "%s", err);
            caught++;
            kiln_kir_free(&ks[i]);
        }
    }
    cr_assert(caught >= 5, "%d kernels", caught);
    kiln_fusion_free(&f);
    kiln_graph_free(g);
}

/* ------------------------------------------------------------------ lowering */

/* Every region of every preset, decode and prefill, lowers for pdl on sm_90: the trigger first,
 * one top-level wait, nothing dependent before it (the verifier, inside the lowering), and the
 * decode gemv prefetching weights before it. For sm_80, or with the option off, no kernel has
 * any of it. */
Test(pdl, presets_lower_with_trigger_wait_and_prefetch)
{
    static const kiln_dtype wt[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
    for (int p = 0; p < kiln_preset_count(); p++)
        for (size_t w = 0; w < sizeof wt / sizeof *wt; w++)
            for (int prefill = 0; prefill < 2; prefill++) {
                kiln_preset_build_opts o = {.wdtype = wt[w], .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096,
                                            .max_tok = prefill ? 512 : 1, .seed = 1, .shape_only = true};
                kiln_graph *g = NULL;
                char err[512] = "";
                cr_assert_eq(kiln_preset_build_ex(kiln_preset_at(p), &o, &g, err, sizeof err), KILN_OK, "%s", err);
                kiln_fusion f;
                cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
                for (uint32_t r = 0; r < f.n_regions; r++)
                    for (int on = 0; on < 5; on++) { /* off, on, sm_80, no prefetch, registers */
                        kiln_lower_target t = on == 2 ? kiln_lower_target_for_sm(80) : pdl_target(on == 1);
                        if (on == 2) t.opts.pdl = KILN_GEMM_ON;
                        if (on >= 3) t = mode_target(on == 3 ? KILN_PDL_NO_PREFETCH : KILN_PDL_REGS, false);
                        kiln_kir ks[KILN_LOWER_MAX];
                        uint32_t n = 0;
                        kiln_status s = kiln_lower_region_for(g, &f.regions[r], &t, ks, &n, err, sizeof err);
                        cr_assert_eq(s, KILN_OK, "%s %s region %u: %s", kiln_preset_at(p)->name, kiln_dtype_name(wt[w]), r, err);
                        for (uint32_t i = 0; i < n; i++) {
                            const kiln_kir *k = &ks[i];
                            uint32_t waits = 0, pre = 0, lds = 0, w0 = top_wait(k);
                            for (uint32_t j = 0; j < k->n_ins; j++) {
                                waits += k->ins[j].op == KILN_KOP_GRID_WAIT;
                                pre += k->ins[j].op == KILN_KOP_PREFETCH && j < w0;
                                lds += (k->ins[j].op == KILN_KOP_LD || k->ins[j].op == KILN_KOP_LD4) && j < w0;
                            }
                            if (on >= 3) { /* no prefetches; with KILN_PDL_REGS the decode gemv loads weights before the wait */
                                cr_assert(k->pdl && waits == 1 && pre == 0, "%s: mode %d: %u waits, %u prefetches", k->name, on, waits, pre);
                                if (!prefill && !strcmp(k->name, "kiln_gemv"))
                                    cr_assert(on == 3 ? lds == 0 : lds > 0, "decode gemv, mode %d: %u loads before the wait", on, lds);
                            } else if (on != 1) {
                                cr_assert(!k->pdl && !waits && !pre && !kiln_kir_needs_sm90(k), "%s: pdl ops with pdl off", k->name);
                            } else {
                                cr_assert(k->pdl && k->ins[0].op == KILN_KOP_GRID_LAUNCH, "%s: trigger not first", k->name);
                                cr_assert(waits == 1 && w0 < k->n_ins, "%s: %u waits", k->name, waits);
                                cr_assert(k->pdl_const & 1, "%s: the parameter buffer is host-written", k->name);
                                if (!prefill && !strcmp(k->name, "kiln_gemv")) cr_assert(pre > 0, "decode gemv without prefetches");
                            }
                            kiln_kir_free(&ks[i]);
                        }
                    }
                kiln_fusion_free(&f);
                kiln_graph_free(g);
            }
}

/* Weight loads (LD/LD4 of a weight node's buffer) before k's first loop: x's prologue (norm,
 * quantization) and the chunk loop are loops, so these are loads issued before any of them. */
static uint32_t weight_loads_before_loops(const kiln_graph *g, const kiln_kir *k)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < k->n_ins && k->ins[j].op != KILN_KOP_LOOP; j++) {
        const kiln_kinst *in = &k->ins[j];
        if (in->op != KILN_KOP_LD && in->op != KILN_KOP_LD4) continue;
        const kiln_kbuf *b = &k->bufs[in->imm.i];
        n += b->kind == KILN_KBUF_NODE && g->nodes[b->node].op == KILN_OP_WEIGHT;
    }
    return n;
}

/* The decode gemvs of every preset's layer (f16, q8_0, q4_K weights, one token), each lowered for
 * variants 0 .. nv - 1 (target(v)): on_gemv sees every kiln_gemv kernel, on_done each preset and
 * weight type once its variants ran (what: "PRESET WTYPE"). No kernel of any variant is a pdl one. */
typedef struct gemv_walk {
    int                nv;
    kiln_lower_target (*target)(int v);
    void              (*on_gemv)(struct gemv_walk *w, const kiln_graph *g, const kiln_kir *k, int v, const char *what);
    void              (*on_done)(struct gemv_walk *w, const char *what);
    uint32_t           n[2];  /* the test's counters (reset after on_done) */
} gemv_walk;

static void each_decode_gemv(gemv_walk *w)
{
    static const kiln_dtype wt[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
    for (int p = 0; p < kiln_preset_count(); p++)
        for (size_t d = 0; d < sizeof wt / sizeof *wt; d++) {
            kiln_preset_build_opts o = {.wdtype = wt[d], .kvdtype = KILN_DTYPE_F16, .n_layers = 1, .max_ctx = 4096,
                                        .max_tok = 1, .seed = 1, .shape_only = true};
            kiln_graph *g = NULL;
            char err[512] = "", what[96];
            cr_assert_eq(kiln_preset_build_ex(kiln_preset_at(p), &o, &g, err, sizeof err), KILN_OK, "%s", err);
            snprintf(what, sizeof what, "%s %s", kiln_preset_at(p)->name, kiln_dtype_name(wt[d]));
            kiln_fusion f;
            cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
            for (uint32_t r = 0; r < f.n_regions; r++)
                for (int v = 0; v < w->nv; v++) {
                    kiln_lower_target t = w->target(v);
                    kiln_kir ks[KILN_LOWER_MAX];
                    uint32_t n = 0;
                    cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], &t, ks, &n, err, sizeof err), KILN_OK, "%s", err);
                    for (uint32_t i = 0; i < n; i++) {
                        const kiln_kir *k = &ks[i];
                        if (!strcmp(k->name, "kiln_gemv")) w->on_gemv(w, g, k, v, what);
                        for (uint32_t j = 0; j < k->n_ins; j++)
                            cr_assert(k->ins[j].op != KILN_KOP_GRID_WAIT && k->ins[j].op != KILN_KOP_GRID_LAUNCH, "%s: a pdl op", k->name);
                        cr_assert(!k->pdl, "%s: pdl with codegen.pdl off", k->name);
                        kiln_kir_free(&ks[i]);
                    }
                }
            w->on_done(w, what);
            w->n[0] = w->n[1] = 0;
            kiln_fusion_free(&f);
            kiln_graph_free(g);
        }
}

/* on_done of the tests that count the decode gemvs of their variant 1 in n[0] */
static void enough_gemvs(gemv_walk *w, const char *what) { cr_assert(w->n[0] >= 4, "%s: %u decode gemvs", what, w->n[0]); }

static kiln_lower_target preload_target(int v) /* off; on at sm_90, sm_80, sm_90 with the pair path */
{
    kiln_lower_target t = v == 2 ? kiln_lower_target_for_sm(80) : mode_target(0, v == 3);
    t.opts.gemv_preload = v ? KILN_GEMM_ON : KILN_GEMM_AUTO;
    return t;
}

static void preload_gemv(gemv_walk *w, const kiln_graph *g, const kiln_kir *k, int v, const char *what)
{
    uint32_t before = weight_loads_before_loops(g, k);
    cr_assert(v ? before > 0 : before == 0, "%s, variant %d: %u weight loads before the first loop", what, v, before);
    w->n[0] += v == 1;
}

/* codegen.gemv_preload: every decode gemv of the presets (f16, q8_0, q4_K; pair path too) loads
 * weights before its first loop (x's norm and quantization, the chunk loop), with no pdl op (sm_90
 * and sm_80); without it, every weight load is inside a loop. */
Test(pdl, gemv_preload_loads_weights_before_the_prologue_without_pdl)
{
    gemv_walk w = {.nv = 4, .target = preload_target, .on_gemv = preload_gemv, .on_done = enough_gemvs};
    each_decode_gemv(&w);
}

/* LD4s of matrix weights (chunk loads; not a norm's or bias's vector) of k: how many, and how many
 * directly in a loop's body (no IF between the load and its innermost loop). */
static void weight_ld4s(const kiln_graph *g, const kiln_kir *k, uint32_t *n, uint32_t *bare)
{
    uint8_t stack[64];
    int depth = 0;
    *n = *bare = 0;
    for (uint32_t j = 0; j < k->n_ins; j++) {
        const kiln_kinst *in = &k->ins[j];
        if (in->op == KILN_KOP_LOOP || in->op == KILN_KOP_IF) {
            cr_assert(depth < 64);
            stack[depth++] = in->op;
        } else if (in->op == KILN_KOP_ENDLOOP || in->op == KILN_KOP_ENDIF) {
            depth--;
        } else if (in->op == KILN_KOP_LD4 && k->bufs[in->imm.i].kind == KILN_KBUF_NODE &&
                   g->nodes[k->bufs[in->imm.i].node].op == KILN_OP_WEIGHT && g->nodes[k->bufs[in->imm.i].node].rank == 2) {
            (*n)++;
            *bare += depth > 0 && stack[depth - 1] == KILN_KOP_LOOP;
        }
    }
}

static kiln_lower_target pipeline_target(int v) /* off; on; on with the pair path */
{
    kiln_lower_target t = mode_target(0, v == 2);
    t.opts.gemv_pipeline = v ? KILN_GEMM_ON : KILN_GEMM_AUTO;
    return t;
}

static void pipeline_gemv(gemv_walk *w, const kiln_graph *g, const kiln_kir *k, int v, const char *what)
{
    uint32_t lds, bare;
    weight_ld4s(g, k, &lds, &bare);
    cr_assert(lds > 0, "%s: no chunk loads", what);
    cr_assert(v ? bare == 0 : bare > 0, "%s, variant %d: %u of %u chunk loads in a loop's body", what, v, bare, lds);
    w->n[0] += v == 1;
}

/* codegen.gemv_pipeline: in every decode gemv of the presets (f16, q8_0, q4_K; pair path too) each
 * chunk load sits in an IF (the first step's before the chunk loop, the next step's at its top),
 * none directly in a loop's body, with no pdl op; without it the chunk loop's loads are its body's. */
Test(pdl, gemv_pipeline_loads_the_next_step_in_the_chunk_loop)
{
    gemv_walk w = {.nv = 3, .target = pipeline_target, .on_gemv = pipeline_gemv, .on_done = enough_gemvs};
    each_decode_gemv(&w);
}

/* Loads (LD/LD4) of activations (graph nodes other than weights) in a loop that no IF encloses: the
 * loops over x of a gemv's prologue (the rms_norm's rare rescaled passes sit in an IF). */
static uint32_t activation_loads_in_loops(const kiln_graph *g, const kiln_kir *k)
{
    int loops = 0, ifs = 0;
    uint8_t stack[64];
    int depth = 0;
    uint32_t n = 0;
    for (uint32_t j = 0; j < k->n_ins; j++) {
        const kiln_kinst *in = &k->ins[j];
        if (in->op == KILN_KOP_LOOP || in->op == KILN_KOP_IF) {
            cr_assert(depth < 64);
            stack[depth++] = in->op;
            loops += in->op == KILN_KOP_LOOP, ifs += in->op == KILN_KOP_IF;
        } else if (in->op == KILN_KOP_ENDLOOP || in->op == KILN_KOP_ENDIF) {
            uint8_t op = stack[--depth];
            loops -= op == KILN_KOP_LOOP, ifs -= op == KILN_KOP_IF;
        } else if ((in->op == KILN_KOP_LD || in->op == KILN_KOP_LD4) && k->bufs[in->imm.i].kind == KILN_KBUF_NODE &&
                   g->nodes[k->bufs[in->imm.i].node].op != KILN_OP_WEIGHT) {
            n += loops > 0 && ifs == 0;
        }
    }
    return n;
}

static kiln_lower_target xload_target(int v)
{
    kiln_lower_target t = mode_target(0, false);
    t.opts.gemv_xload = v ? KILN_GEMM_ON : KILN_GEMM_AUTO;
    return t;
}

static void xload_gemv(gemv_walk *w, const kiln_graph *g, const kiln_kir *k, int v, const char *what)
{
    (void)what;
    w->n[v] += activation_loads_in_loops(g, k);
}

static void xload_done(gemv_walk *w, const char *what)
{
    cr_assert(w->n[0] > 0 && w->n[1] == 0, "%s: x loads in loops %u without, %u with gemv_xload", what, w->n[0], w->n[1]);
}

/* codegen.gemv_xload: no decode gemv of the presets (f16, q8_0, q4_K) loads x in a loop outside an IF
 * (its norm's and quantization's words all loaded at once); without it, the prologues' loops do. */
Test(pdl, gemv_xload_loads_x_once_without_loops)
{
    gemv_walk w = {.nv = 2, .target = xload_target, .on_gemv = xload_gemv, .on_done = xload_done};
    each_decode_gemv(&w);
}

/* ------------------------------------------------------------------ what the kernels compute */

typedef struct run_case {
    kiln_graph  *g;
    kiln_binding b[8];
    size_t       nb;
    void        *in[8];
} run_case;

/* Memory of node i at its max dims: an input's bound bytes, a weight in its device layout, else poison. */
static uint32_t *node_mem(const kiln_graph *g, uint32_t i, const run_case *c)
{
    const kiln_node_rec *n = &g->nodes[i];
    int64_t dims[KILN_MAX_RANK];
    for (int d = 0; d < n->rank; d++) dims[d] = n->dims[d] < 0 ? g->syms[kiln_sym_index(n->dims[d])].max : n->dims[d];
    if (n->op == KILN_OP_WEIGHT) {
        int64_t rows = 1, k = dims[n->rank - 1];
        for (int d = 0; d + 1 < n->rank; d++) rows *= dims[d];
        size_t dev = kiln_lower_weight_bytes((kiln_dtype)n->dtype, rows, k);
        uint32_t *m = calloc(dev / 4 + 4, 4);
        kiln_lower_weight_repack((kiln_dtype)n->dtype, rows, k, n->data, m);
        return m;
    }
    size_t bytes = kiln_node_bytes(n, dims);
    uint32_t *m = malloc(bytes + 16);
    memset(m, 0xFF, bytes + 16); /* NaN poison */
    for (size_t j = 0; n->name && j < c->nb; j++)
        if (c->b[j].data && strcmp(c->b[j].name, n->name) == 0) memcpy(m, c->b[j].data, c->b[j].bytes);
    return m;
}

/* Runs every region's kernels (lowered for target t) through the block interpreter; returns the
 * floats of output `out` (numel of them, malloc'ed). */
static float *run_kernels(run_case *c, const kiln_lower_target *t, const char *out, int64_t numel, int *n_pdl)
{
    kiln_graph *g = c->g;
    kiln_fusion f;
    cr_assert_eq(kiln_fuse(g, true, &f), KILN_OK);
    uint32_t **mem = calloc(g->n_nodes, sizeof *mem), params[64] = {0};
    for (size_t j = 0; j < c->nb; j++)
        for (uint32_t s = 0; !c->b[j].data && s < g->n_syms; s++)
            if (strcmp(g->syms[s].name, c->b[j].name) == 0) params[s] = (uint32_t)c->b[j].value;
    for (uint32_t r = 0; r < f.n_regions; r++) {
        kiln_kir ks[KILN_LOWER_MAX];
        uint32_t n = 0;
        char err[1024];
        cr_assert_eq(kiln_lower_region_for(g, &f.regions[r], t, ks, &n, err, sizeof err), KILN_OK, "%s", err);
        uint64_t sb = 0;
        for (uint32_t i = 0; i < n; i++) sb = ks[i].scratch_bytes > sb ? ks[i].scratch_bytes : sb;
        uint32_t *scratch = calloc(sb / 4 + 4, 4);
        for (uint32_t i = 0; i < n; i++) {
            *n_pdl += ks[i].pdl;
            uint32_t *bufs[KILN_KIR_MAX_BUFS] = {params};
            for (uint32_t s = 1; s < ks[i].n_bufs; s++) {
                const kiln_kbuf *kb = &ks[i].bufs[s];
                if (kb->kind == KILN_KBUF_SCRATCH) bufs[s] = scratch;
                else if (kb->kind == KILN_KBUF_TABLE) bufs[s] = ks[i].tables[kb->node].words;
                else bufs[s] = mem[kb->node] ? mem[kb->node] : (mem[kb->node] = node_mem(g, kb->node, c));
            }
            cr_assert(kt_interp_block(&ks[i], bufs, err, sizeof err), "kernel %s: %s", ks[i].name, err);
            kiln_kir_free(&ks[i]);
        }
        free(scratch);
    }
    uint32_t yi = N;
    for (uint32_t i = 0; i < g->n_outs; i++)
        if (strcmp(g->outs[i].name, out) == 0) yi = g->outs[i].node;
    cr_assert(yi != N && mem[yi], "output %s not written", out);
    float *y = malloc((size_t)numel * sizeof *y);
    memcpy(y, mem[yi], (size_t)numel * sizeof *y);
    for (uint32_t i = 0; i < g->n_nodes; i++) free(mem[i]);
    free(mem);
    kiln_fusion_free(&f);
    return y;
}

static void bind_random(run_case *c, const char *name, int64_t n)
{
    float *v = malloc((size_t)n * sizeof *v);
    tu_fill(v, n, -1.0f, 1.0f);
    c->in[c->nb] = v;
    c->b[c->nb++] = (kiln_binding){.name = name, .data = v, .bytes = (size_t)n * 4};
}

static void compare_ref(const char *what, const char *out, const float *y, const double *ref, int64_t numel, kiln_dtype key)
{
    double *got = malloc((size_t)numel * sizeof *got);
    for (int64_t e = 0; e < numel; e++) got[e] = y[e];
    char w2[160];
    snprintf(w2, sizeof w2, "%s, output %s", what, out);
    tu_compare(w2, got, ref, numel, tu_tol("matmul", key));
    free(got);
}

/* Runs c without pdl and with each pdl mode (L2 prefetch, none, weights in registers) and with the
 * gemv's prefetches 1 and 2 steps ahead (and its fence after a step's loads): for each of its outputs the same bits, at the matmul
 * contract's tolerance from ref64. Weights with gemv's pair path (q8_0, q4_K) run it too, plain and
 * with weights in registers and prefetches: the same bits, at the contract's tolerance (the pair
 * path sums in another order than the chunk path). codegen.gemv_preload (the first step's weights
 * loaded before x's prologue, without pdl) and codegen.gemv_pipeline (the next step's loads before
 * this step's arithmetic) give the same bits on both paths. */
static void same_as_plain(run_case *c, kiln_dtype key, const char *what)
{
    ref64 *rf = ref64_new(c->g);
    char err[256];
    cr_assert_eq(ref64_run(rf, c->b, c->nb, err, sizeof err), 0, "%s", err);
    kiln_lower_target off = pdl_target(false);
    static const int32_t modes[] = {KILN_GEMM_ON, KILN_PDL_NO_PREFETCH, KILN_PDL_REGS};
    bool pair = key == KILN_DTYPE_Q8_0 || key == KILN_DTYPE_Q4_K;
    for (uint32_t o = 0; o < c->g->n_outs; o++) {
        const char *out = c->g->outs[o].name;
        int64_t dims[KILN_MAX_RANK], numel;
        const double *ref = ref64_output(rf, out, dims, &numel);
        int n_off = 0;
        float *y0 = run_kernels(c, &off, out, numel, &n_off);
        cr_assert(n_off == 0, "%s: %d pdl kernels with it off", what, n_off);
        for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
            kiln_lower_target on = mode_target(modes[m], false);
            int n_on = 0;
            float *y = run_kernels(c, &on, out, numel, &n_on);
            cr_assert(n_on > 0, "%s: no pdl kernels in mode %d", what, modes[m]);
            cr_assert_eq(memcmp(y, y0, (size_t)numel * 4), 0, "%s, %s: pdl kernels (mode %d) computed other bits", what, out, modes[m]);
            free(y);
        }
        { /* codegen.gemv_preload: the first step's weights loaded before x's prologue, no pdl */
            kiln_lower_target pl = pdl_target(false);
            pl.opts.gemv_preload = KILN_GEMM_ON;
            int n_pl = 0;
            float *y = run_kernels(c, &pl, out, numel, &n_pl);
            cr_assert(n_pl == 0, "%s: %d pdl kernels with gemv_preload alone", what, n_pl);
            cr_assert_eq(memcmp(y, y0, (size_t)numel * 4), 0, "%s, %s: gemv_preload computed other bits", what, out);
            free(y);
            kiln_lower_target pp = pdl_target(false); /* codegen.gemv_pipeline, with L2 prefetches too */
            pp.opts.gemv_pipeline = KILN_GEMM_ON;
            for (int32_t ahead = 0; ahead <= 1; ahead++) {
                pp.opts.gemv_prefetch = ahead;
                y = run_kernels(c, &pp, out, numel, &n_pl);
                cr_assert_eq(memcmp(y, y0, (size_t)numel * 4), 0, "%s, %s: gemv_pipeline (prefetch %d) computed other bits", what, out, ahead);
                free(y);
            }
        }
        { /* codegen.gemv_xload: the norm's squares summed in another order (the quantization reads the
           * same words): the contract's tolerance against f64, alone and with the pipeline */
            for (int v = 0; v < 2; v++) {
                kiln_lower_target xl = pdl_target(false);
                xl.opts.gemv_xload = KILN_GEMM_ON;
                if (v) xl.opts.gemv_pipeline = KILN_GEMM_ON;
                int n_xl = 0;
                float *y = run_kernels(c, &xl, out, numel, &n_xl);
                char w2[160];
                snprintf(w2, sizeof w2, "%s (gemv_xload%s)", what, v ? " + pipeline" : "");
                compare_ref(w2, out, y, ref, numel, key);
                free(y);
            }
        }
        for (int32_t ahead = 1; ahead <= 2; ahead++) { /* codegen.gemv_prefetch: L2 hints only */
            kiln_lower_target pf = mode_target(ahead == 2 ? KILN_PDL_REGS : 0, false);
            pf.opts.gemv_prefetch = ahead;
            pf.opts.gemv_fence = ahead == 2 ? KILN_GEMM_ON : KILN_GEMM_AUTO; /* and a fence after each step's loads */
            int n_pf = 0;
            float *y = run_kernels(c, &pf, out, numel, &n_pf);
            cr_assert_eq(memcmp(y, y0, (size_t)numel * 4), 0, "%s, %s: gemv prefetching %d steps ahead computed other bits", what, out, ahead);
            free(y);
        }
        compare_ref(what, out, y0, ref, numel, key);
        if (pair) {
            kiln_lower_target p0 = mode_target(0, true), p3 = mode_target(KILN_PDL_REGS, true);
            p3.opts.gemv_prefetch = 1;
            p3.opts.gemv_fence = KILN_GEMM_ON;
            int n0 = 0, n3 = 0;
            float *yp = run_kernels(c, &p0, out, numel, &n0), *yr = run_kernels(c, &p3, out, numel, &n3);
            cr_assert_eq(memcmp(yp, yr, (size_t)numel * 4), 0, "%s, %s: pair path with weights in registers computed other bits", what, out);
            kiln_lower_target pp = mode_target(0, true);
            pp.opts.gemv_preload = KILN_GEMM_ON;
            int npp = 0;
            float *yq = run_kernels(c, &pp, out, numel, &npp);
            cr_assert_eq(memcmp(yp, yq, (size_t)numel * 4), 0, "%s, %s: pair path with gemv_preload computed other bits", what, out);
            free(yq);
            pp.opts.gemv_preload = KILN_GEMM_AUTO, pp.opts.gemv_pipeline = KILN_GEMM_ON;
            yq = run_kernels(c, &pp, out, numel, &npp);
            cr_assert_eq(memcmp(yp, yq, (size_t)numel * 4), 0, "%s, %s: pair path with gemv_pipeline computed other bits", what, out);
            free(yq);
            char w2[128];
            snprintf(w2, sizeof w2, "%s (pair path)", what);
            compare_ref(w2, out, yp, ref, numel, key);
            free(yp), free(yr);
        }
        free(y0);
    }
    ref64_free(rf);
    for (size_t j = 0; j < c->nb; j++) free(c->in[j]);
    kiln_graph_free(c->g);
}

/* A decode step's rms_norm + gate/up siblings (the gemv with x staged or quantized, two rows per
 * unit), each an output (swiglu would amplify the quantized x's error past the matmul contract). */
static void gate_up_case(kiln_dtype wt, int64_t K, int64_t F)
{
    run_case c = {0};
    cr_assert_eq(kiln_graph_new(&c.g), KILN_OK);
    kiln_dim M = kiln_sym(c.g, "n_tok", 1);
    kiln_node x = kiln_input(c.g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){M, K});
    kiln_node nw = tu_weight(c.g, "nw", KILN_DTYPE_F32, 1, (kiln_dim[]){K}, 0.5f, 1.5f);
    kiln_node h = kiln_rms_norm(c.g, x, nw, 1e-5f);
    kiln_node wg = tu_weight(c.g, "wg", wt, 2, (kiln_dim[]){F, K}, -1.0f, 1.0f);
    kiln_node wu = tu_weight(c.g, "wu", wt, 2, (kiln_dim[]){F, K}, -1.0f, 1.0f);
    kiln_output(c.g, kiln_matmul(c.g, h, wg), "g");
    kiln_output(c.g, kiln_matmul(c.g, h, wu), "u");
    c.b[c.nb++] = (kiln_binding){.name = "n_tok", .value = 1};
    bind_random(&c, "x", K);
    char what[96];
    snprintf(what, sizeof what, "pdl gemv %s rms_norm + gate/up, K=%lld", kiln_dtype_name(wt), (long long)K);
    same_as_plain(&c, wt, what);
}

/* An output projection with a residual epilogue (no norm: x read straight from memory). */
static void residual_case(kiln_dtype wt, int64_t K, int64_t Nn)
{
    run_case c = {0};
    cr_assert_eq(kiln_graph_new(&c.g), KILN_OK);
    kiln_dim M = kiln_sym(c.g, "n_tok", 1);
    kiln_node x = kiln_input(c.g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){M, K});
    kiln_node r = kiln_input(c.g, "r", KILN_DTYPE_F32, 2, (kiln_dim[]){M, Nn});
    kiln_node w = tu_weight(c.g, "w", wt, 2, (kiln_dim[]){Nn, K}, -1.0f, 1.0f);
    kiln_output(c.g, kiln_add(c.g, kiln_matmul(c.g, x, w), r), "y");
    c.b[c.nb++] = (kiln_binding){.name = "n_tok", .value = 1};
    bind_random(&c, "x", K);
    bind_random(&c, "r", Nn);
    char what[96];
    snprintf(what, sizeof what, "pdl gemv %s + residual, K=%lld", kiln_dtype_name(wt), (long long)K);
    same_as_plain(&c, wt, what);
}

/* Block weights: 128 more outputs than the odd counts the units' tails need. One output's NMSE
 * against matmul's 1e-4 follows a ratio of two chi^2 sums over its N columns (x's int8 rounding:
 * mean 2.3e-5 with rms_norm, 1.2e-5..1.5e-5 without; a scratch harness): with N = 24
 * about 3 in 10000 outputs fail (F(24, 24) > 4.4, simulated), with N = 20 at 8x its mean 1 in 10^5. */
Test(pdl, gemv_f16_same_bits_as_plain) { gate_up_case(KILN_DTYPE_F16, 256, 40); residual_case(KILN_DTYPE_F16, 192, 72); }
Test(pdl, gemv_q8_0_same_bits_as_plain) { gate_up_case(KILN_DTYPE_Q8_0, 256, 24 + 128); residual_case(KILN_DTYPE_Q8_0, 128, 40 + 128); }
Test(pdl, gemv_q4_k_same_bits_as_plain) { gate_up_case(KILN_DTYPE_Q4_K, 512, 24 + 128); residual_case(KILN_DTYPE_Q4_K, 256, 36 + 128); }
Test(pdl, gemv_q6_k_same_bits_as_plain) { gate_up_case(KILN_DTYPE_Q6_K, 256, 24 + 128); residual_case(KILN_DTYPE_Q6_K, 256, 20 + 128); }
