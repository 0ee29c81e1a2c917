/* `kiln check` beyond single ops: fused patterns (rms_norm -> matmul, sibling matmuls, gate/up ->
 * swiglu -> down + residual, elementwise chains) compiled fused and unfused and both compared
 * with the reference and with each other; llama-style preset layers (decode and prefill) against
 * the reference; and determinism (one plan run 10 times, bit-identical). Only builds graphs. */
#include <stdio.h>
#include <string.h>

#include "check/check.h"
#include "model/presets.h"

static const kiln_dtype PW[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

static void set_sym(kiln_check_spec *s, int run, const char *name, int64_t v)
{
    uint32_t i = kiln_graph_find_sym(s->g, name);
    if (i != KILN_IDX_NONE && i < 4) s->syms[run][i] = v;
}

/* Tolerance of a pattern: matmul chains with quantized weights carry int8 activations (one scale
 * per 32 values for q8_0, per 256 for the k-quants). Two chained matmuls with k-quant weights
 * (gate/up -> swiglu -> down) measured worst NMSE 4e-4..1.6e-3 over 13 seeds (the heavy-tailed
 * swiglu output quantized per 256); q8_0 1.5e-4..3.4e-4. A wrong scale or nibble order gives 1e-2+.
 * No output may share one error: a weight of mean m adds m * sum(x's rounding errors) to every
 * output, so the NMSE of zero-mean x with weights in [-0.5, 1.5] had a chi^2(1) tail (numpy model
 * of qkv at D 256, one row: mean 0.10 of 2e-4, 1 in 200 over half of it, ~5e-5 over it; mlp with
 * down weights of mean 0.5: 1 in 1000 over half of 5e-3, worst 0.96 of it in 1000). So x has a
 * mean (in [-0.5, 1.5]: y's own shared part dominates its sum, qkv worst 0.012 of 2e-4 in 1000)
 * and the down weights none (mlp worst 0.15 of 5e-3 in 1000). */
static double pat_tol(kiln_dtype w, int depth)
{
    if (kiln_dtype_block(w) > 1) return depth > 1 ? 5e-3 : 2e-4;
    return depth > 1 ? 1e-8 : 1e-9;
}

enum pat { PAT_NORM_MM, PAT_QKV, PAT_MLP, PAT_RESID, PAT_CHAIN, PAT_COUNT };
static const char *const PAT_NAME[] = {"rms_norm+matmul", "qkv", "mlp", "matmul+residual", "elementwise-chain"};

static kiln_node pattern(kiln_check_run *r, kiln_graph *g, enum pat p, kiln_dtype wt, int64_t D, int64_t F, kiln_dim T)
{
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, D});
    kiln_node nw = kiln_check_weight(r, g, "nw", KILN_DTYPE_F32, 1, &D, 0.8f, 1.2f);
    switch (p) {
    case PAT_NORM_MM: return kiln_matmul(g, kiln_rms_norm(g, x, nw, 1e-6f), kiln_check_weight(r, g, "w", wt, 2, (kiln_dim[]){F, D}, -0.5f, 1.5f));
    case PAT_QKV: {
        kiln_node h = kiln_rms_norm(g, x, nw, 1e-6f);
        kiln_node q = kiln_matmul(g, h, kiln_check_weight(r, g, "wq", wt, 2, (kiln_dim[]){D, D}, -0.5f, 1.5f));
        kiln_node k = kiln_matmul(g, h, kiln_check_weight(r, g, "wk", wt, 2, (kiln_dim[]){F, D}, -0.5f, 1.5f));
        kiln_output(g, k, "k");
        return q;
    }
    case PAT_MLP: {
        kiln_node h = kiln_rms_norm(g, x, nw, 1e-6f);
        kiln_node a = kiln_matmul(g, h, kiln_check_weight(r, g, "wg", wt, 2, (kiln_dim[]){F, D}, -0.1f, 0.1f));
        kiln_node b = kiln_matmul(g, h, kiln_check_weight(r, g, "wu", wt, 2, (kiln_dim[]){F, D}, -0.1f, 0.1f));
        kiln_node y = kiln_matmul(g, kiln_swiglu(g, a, b), kiln_check_weight(r, g, "wd", wt, 2, (kiln_dim[]){D, F}, -1.0f, 1.0f));
        return kiln_add(g, y, x);
    }
    case PAT_RESID: return kiln_add(g, kiln_matmul(g, x, kiln_check_weight(r, g, "w", wt, 2, (kiln_dim[]){D, D}, -0.5f, 1.5f)), x);
    default: {
        kiln_node b = kiln_input(g, "b", KILN_DTYPE_F32, 1, &D);
        kiln_node y = kiln_silu(g, kiln_scale(g, kiln_add(g, x, b), 0.5f));
        return kiln_mul(g, kiln_gelu(g, y), x);
    }
    }
}

static void patterns(kiln_check_run *r)
{
    char lab[160], name[48];
    int n = kiln_check_quick(r) ? 2 : 5;
    for (enum pat p = 0; p < PAT_COUNT; p++)
        for (int w = 0; w < (p == PAT_CHAIN ? 1 : N_OF(PW)); w++)
            for (int i = 0; i < n; i++) {
                kiln_graph *g = NULL;
                if (kiln_graph_new(&g) != KILN_OK) return;
                bool q = kiln_check_quick(r); /* quick: sizes that keep the f64 reference cheap */
                int64_t D = 256 * kiln_check_randint(r, 1, q ? 2 : 4), F = 256 * kiln_check_randint(r, 1, q ? 3 : 5);
                if (p == PAT_CHAIN) D = kiln_check_randint(r, 1, 3000);
                int64_t tmax = i % 2 ? kiln_check_randint(r, 9, q ? 12 : 24) : kiln_check_randint(r, 1, 5);
                kiln_dim T = kiln_sym(g, "t", tmax);
                kiln_node y = pattern(r, g, p, PW[w], D, F, T);
                if (y != KILN_NODE_NONE) kiln_output(g, y, "y");
                snprintf(name, sizeof name, "%s", PAT_NAME[p]);
                snprintf(lab, sizeof lab, "%s w %s D %lld F %lld t<=%lld", PAT_NAME[p], kiln_dtype_name(PW[w]), (long long)D,
                         (long long)F, (long long)tmax);
                kiln_check_spec s = {.op = name, .key = PW[w], .tol = pat_tol(PW[w], p == PAT_MLP ? 2 : 1), .g = g,
                                     .lo = -0.5, .hi = 1.5, .label = lab, .fused_vs_unfused = true, .n_binds = 2};
                if (p == PAT_CHAIN) s.tol = 1e-10, s.lo = -1, s.hi = 1;
                s.syms[0][0] = tmax;
                s.syms[1][0] = kiln_check_randint(r, 1, tmax + 1);
                kiln_check_case(r, &s);
                kiln_graph_free(g);
            }
}

/* A preset stack of one layer; decode (n_tok 1) or prefill (n_tok up to 8), checked against the
 * reference (fused and unfused) and for determinism. */
static void presets(kiln_check_run *r)
{
    static const kiln_preset small = {.name = "small", .hidden = 256, .n_head = 4, .n_kv_head = 2, .head_dim = 64,
                                      .ffn = 512, .rope = KILN_ROPE_NEOX, .theta = 1e6f, .eps = 1e-6f};
    const kiln_preset *ps[2] = {&small, kiln_preset_find("qwen2-0.5b")};
    const kiln_dtype wts[] = {KILN_DTYPE_F32, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K};
    char lab[160], name[40];
    for (int pi = 0; pi < (kiln_check_quick(r) ? 1 : 2); pi++)
        for (int w = 0; w < N_OF(wts); w++)
            for (int mode = 0; mode < 2; mode++) {
                if (!ps[pi]) continue;
                const int64_t max_ctx = 64, max_tok = mode ? 8 : 1;
                kiln_preset_build_opts o = {.wdtype = wts[w], .kvdtype = w == 0 ? KILN_DTYPE_F32 : KILN_DTYPE_F16,
                                            .n_layers = 1, .max_ctx = max_ctx, .max_tok = max_tok,
                                            .seed = kiln_check_rand(r)};
                kiln_graph *g = NULL;
                char err[256] = "";
                snprintf(name, sizeof name, "%s-%s", ps[pi]->name, mode ? "prefill" : "decode");
                snprintf(lab, sizeof lab, "preset %s layer, weights %s, kv %s", name, kiln_dtype_name(wts[w]),
                         kiln_dtype_name(o.kvdtype));
                if (kiln_preset_build_ex(ps[pi], &o, &g, err, sizeof err) != KILN_OK) {
                    kiln_check_fail_all(r, name, wts[w], "%s: %s", lab, err);
                    continue;
                }
                kiln_check_spec s = {.op = name, .key = wts[w], .tol = wts[w] == KILN_DTYPE_F32 ? 1e-6 : 3e-3, .g = g,
                                     .lo = -1, .hi = 1, .label = lab, .state_lo = -1, .state_hi = 1, .n_binds = 3,
                                     .fused_vs_unfused = true, .n_ins = 1,
                                     .ins = {{"pos", KILN_CHECK_FILL_POS_ATTN, 0, 0}}};
                s.determinism = 10;
                for (int b = 0; b < 3; b++) {
                    int64_t nt = b == 0 ? max_tok : kiln_check_randint(r, 1, max_tok + 1);
                    set_sym(&s, b, "n_tok", nt);
                    set_sym(&s, b, "n_kv", b == 0 ? max_ctx : kiln_check_randint(r, nt, max_ctx + 1));
                }
                {
                    char pname[64];
                    snprintf(pname, sizeof pname, "preset:%s", name);
                    s.op = pname;
                    kiln_check_case(r, &s);
                }
                kiln_graph_free(g);
            }
}

void kiln_check_patterns(kiln_check_run *r)
{
    if (kiln_check_wants(r, "fused") || kiln_check_wants(r, "unfused") || kiln_check_wants(r, "fused-vs-unfused")) patterns(r);
    if (kiln_check_wants(r, "preset") || kiln_check_wants(r, "determinism")) presets(r);
}
