/* `kiln check` op generators: for every op x dtype, SHAPES graphs (20; 6 in quick mode) of random
 * shapes drawn from pools of 1, small odd, prime, power-of-two +-1 and large sizes, each run at two
 * values of its symbolic dims (one of them the bound), so >= 40 cases per op x dtype (12 quick).
 * Activation ranges alternate between narrow and wide. Must only build graphs and hand them to
 * kiln_check_case; comparing is the runner's job. */
#include <stdio.h>
#include <string.h>

#include "check/check.h"

static const kiln_dtype ACT[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
static const kiln_dtype PLAIN[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32};
static const kiln_dtype WTS[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                                 KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K, KILN_DTYPE_Q4_0,
                                 KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1, KILN_DTYPE_IQ4_NL,
                                 KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K, KILN_DTYPE_IQ4_XS}; /* GPU backends must refuse the last 8 */
/* Row widths: 1, odd, primes, around powers of two, large. */
static const int64_t WIDTH[] = {1, 2, 3, 5, 7, 13, 17, 31, 32, 33, 63, 64, 97, 127, 128, 251, 256, 257, 509, 1021, 4093, 4097};
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

static int shapes(kiln_check_run *r) { return kiln_check_quick(r) ? 6 : 20; }

static int64_t pick(kiln_check_run *r, const int64_t *v, int n) { return v[kiln_check_randint(r, 0, n)]; }

/* Binds symbol 0 to its bound and to a random smaller value (or the bound twice when it is 1). */
static void two_binds(kiln_check_run *r, kiln_check_spec *s, int64_t max)
{
    s->n_binds = 2;
    s->syms[0][0] = max;
    s->syms[1][0] = kiln_check_randint(r, 1, max + 1);
}

static kiln_graph *new_graph(void)
{
    kiln_graph *g = NULL;
    return kiln_graph_new(&g) == KILN_OK ? g : NULL;
}

static void finish(kiln_check_run *r, kiln_check_spec *s, kiln_graph *g, kiln_node y)
{
    if (y != KILN_NODE_NONE) kiln_output(g, y, "y");
    s->g = g;
    kiln_check_case(r, s);
    kiln_graph_free(g);
}

/* ---------------------------------------------------------------- matmul */

static void matmul(kiln_check_run *r)
{
    char lab[160];
    for (int w = 0; w < N_OF(WTS); w++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_dtype wt = WTS[w], xt = i % 5 == 3 ? ACT[1 + i % 2] : KILN_DTYPE_F32;
            int64_t blk = kiln_dtype_block(wt);
            int64_t K = blk == 1 ? pick(r, WIDTH, N_OF(WIDTH)) : blk * kiln_check_randint(r, 1, blk == 32 ? 40 : 9);
            if (i == 0) K = blk == 1 ? 4097 : 4096; /* one long row per dtype */
            const int64_t ns[] = {1, 2, 3, 7, 17, 31, 64, 67};
            int64_t N = pick(r, ns, N_OF(ns)), tmax = i % 4 == 1 ? kiln_check_randint(r, 9, 41) : kiln_check_randint(r, 1, 9);
            if (K * N * tmax > (1 << 21)) N = 1 + (1 << 21) / (K * tmax);
            kiln_graph *g = new_graph();
            if (!g) return;
            kiln_dim T = kiln_sym(g, "t", tmax);
            bool r3 = i % 7 == 5;
            kiln_node x = r3 ? kiln_input(g, "x", xt, 3, (kiln_dim[]){2, T, K}) : kiln_input(g, "x", xt, 2, (kiln_dim[]){T, K});
            /* few outputs of mixed-sign terms can all cancel to ~0, where no relative bound holds (seen: K = 5,
             * N = 1, bf16 weights, NMSE 2.3e-10 on ref from f32 rounding alone; K = 32, N = 1, t = 1, q4_0,
             * NMSE 8.3e-4 on cpu from x's int8 rounding: a 32-term sum of mean 8 and sd 3 near 0, about 1 in
             * 140 such cases; numpy model: 7 outputs of K = 32 still 2.5e-5, K = 64 one output 1.8e-4). Under 64
             * terms or under 8 columns (t may be 1) x and w are positive, so no output cancels; the others keep
             * mixed signs, their NMSE averages over >= 17 outputs of >= 64 terms. */
            bool pos = K < 64 || N < 8;
            float lo = pos ? 0.25f : -0.5f, hi = pos ? 1.25f : 1.5f;
            kiln_node wn = kiln_check_weight(r, g, "w", wt, 2, (kiln_dim[]){N, K}, lo, hi);
            snprintf(lab, sizeof lab, "matmul x %s [%st<=%lld, %lld] w %s [%lld, %lld]", kiln_dtype_name(xt), r3 ? "2, " : "",
                     (long long)tmax, (long long)K, kiln_dtype_name(wt), (long long)N, (long long)K);
            kiln_check_spec s = {.op = "matmul", .key = wt, .tol = -1, .lo = lo, .hi = hi, .label = lab};
            two_binds(r, &s, tmax);
            finish(r, &s, g, kiln_matmul(g, x, wn));
        }
}

/* moe_matmul: a stack of E experts, k of them per token (router weights an input in [0.05, 1): no
 * two equal, so every backend picks the reference's experts), x [t, K] or [t, k, K], per slot or
 * summed. K a multiple of 8 (floats) or 256 (blocks): every GPU format row's chunk divides it. x
 * and w positive, so no output cancels (matmul's small-case rule). */
static void moe_matmul(kiln_check_run *r)
{
    char lab[200];
    const int64_t es[] = {1, 2, 8, 60, 128}, ns[] = {1, 3, 17, 64};
    for (int w = 0; w < N_OF(WTS); w++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_dtype wt = WTS[w], xt = i % 5 == 3 ? ACT[1 + i % 2] : KILN_DTYPE_F32;
            int64_t E = pick(r, es, N_OF(es)), N = pick(r, ns, N_OF(ns));
            int k = (int)kiln_check_randint(r, 1, (E < 8 ? E : 8) + 1);
            int64_t K = kiln_dtype_block(wt) == 1 ? 8 * kiln_check_randint(r, 1, 65) : 256 * kiln_check_randint(r, 1, 3);
            int64_t tmax = i % 4 == 1 ? kiln_check_randint(r, 9, 41) : kiln_check_randint(r, 1, 9);
            if (E * N * K > (1 << 21)) N = 1 + (1 << 21) / (E * K);
            bool per_slot = i % 3 == 1, sum = i % 2 == 1;
            kiln_graph *g = new_graph();
            if (!g) return;
            kiln_dim T = kiln_sym(g, "t", tmax);
            kiln_node x = per_slot ? kiln_input(g, "x", xt, 3, (kiln_dim[]){T, k, K}) : kiln_input(g, "x", xt, 2, (kiln_dim[]){T, K});
            kiln_node ws = kiln_check_weight(r, g, "w", wt, 3, (kiln_dim[]){E, N, K}, 0.25f, 1.25f);
            kiln_node y = kiln_moe_matmul(g, x, ws, kiln_input(g, "r", KILN_DTYPE_F32, 2, (kiln_dim[]){T, E}), k, sum);
            snprintf(lab, sizeof lab, "moe_matmul x %s [t<=%lld, %s%lld] w %s [%lld, %lld, %lld] k %d%s", kiln_dtype_name(xt),
                     (long long)tmax, per_slot ? "k, " : "", (long long)K, kiln_dtype_name(wt), (long long)E, (long long)N,
                     (long long)K, k, sum ? " sum" : "");
            kiln_check_spec s = {.op = "moe_matmul", .key = wt, .tol = -1, .lo = 0.25f, .hi = 1.25f, .label = lab,
                                 .n_ins = 1, .ins = {{"r", KILN_CHECK_FILL_FLOAT, 0.05, 1.0}}};
            two_binds(r, &s, tmax);
            finish(r, &s, g, y);
        }
}

/* ---------------------------------------------------------------- elementwise and rows */

typedef enum ew { EW_SCALE, EW_SILU, EW_GELU, EW_SOFTMAX, EW_ADD, EW_MUL, EW_SWIGLU, EW_RMS, EW_LN, EW_ARGMAX, EW_SIGMOID, EW_TANH } ew;
static const char *const EW_NAME[] = {"scale", "silu", "gelu", "softmax", "add", "mul", "swiglu", "rms_norm", "layer_norm", "argmax", "sigmoid", "tanh"};

static kiln_node ew_build(kiln_check_run *r, kiln_graph *g, ew op, kiln_dtype t, int rank, const kiln_dim *d, int i)
{
    kiln_node a = kiln_input(g, "a", t, rank, d);
    kiln_dim D = d[rank - 1];
    switch (op) {
    case EW_SCALE: return kiln_scale(g, a, i % 2 ? -2.5f : 0.37f);
    case EW_SILU: return kiln_silu(g, a);
    case EW_GELU: return kiln_gelu(g, a);
    case EW_SIGMOID: return kiln_sigmoid(g, a);
    case EW_TANH: return kiln_tanh(g, a);
    case EW_SOFTMAX: return kiln_softmax(g, a);
    case EW_ARGMAX: return kiln_argmax(g, a);
    case EW_ADD: case EW_MUL: case EW_SWIGLU: {
        bool bcast = op != EW_SWIGLU && i % 2; /* b over the last dim only */
        kiln_node b = bcast ? kiln_input(g, "b", t, 1, &D) : kiln_input(g, "b", t, rank, d);
        return op == EW_ADD ? kiln_add(g, a, b) : op == EW_MUL ? kiln_mul(g, a, b) : kiln_swiglu(g, a, b);
    }
    case EW_RMS: case EW_LN: {
        bool wtd = i % 2 == 0;
        kiln_node w = wtd ? kiln_check_weight(r, g, "w", t, 1, &D, 0.5f, 1.5f) : KILN_NODE_NONE;
        kiln_node b = wtd ? kiln_check_weight(r, g, "bias", t, 1, &D, -1, 1) : KILN_NODE_NONE;
        return op == EW_RMS ? kiln_rms_norm(g, a, w, i % 3 ? 1e-5f : 1e-6f) : kiln_layer_norm(g, a, w, b, 1e-5f);
    }
    }
    return KILN_NODE_NONE;
}

static void elementwise(kiln_check_run *r, ew op)
{
    char lab[160];
    if (!kiln_check_wants(r, EW_NAME[op])) return;
    for (int t = 0; t < N_OF(ACT); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            int64_t D = i == 0 ? 4097 : pick(r, WIDTH, N_OF(WIDTH)), tmax = kiln_check_randint(r, 1, 9);
            int rank = i % 5 == 4 ? 3 : i % 7 == 6 ? 1 : 2;
            kiln_dim T = kiln_sym(g, "t", tmax);
            kiln_dim d[3] = {T, D, D};
            if (rank == 3) d[0] = 2, d[1] = T;
            if (rank == 1) d[0] = D;
            /* wide ranges surface overflow (|x| up to 60 into exp, 1e3 products); f16 stays in range */
            bool wide = i % 3 == 2;
            float hi = op == EW_SOFTMAX ? (wide ? 100.f : 4.f) : op == EW_ADD || op == EW_MUL || op == EW_SCALE ? (wide ? 200.f : 1.f)
                                                          : op == EW_RMS || op == EW_LN ? (wide ? 50.f : 1.f) : (wide ? 60.f : 6.f);
            kiln_node y = ew_build(r, g, op, ACT[t], rank, d, i);
            snprintf(lab, sizeof lab, "%s %s rank %d [.., t<=%lld, %lld] range +-%g", EW_NAME[op], kiln_dtype_name(ACT[t]), rank,
                     (long long)tmax, (long long)D, (double)hi);
            kiln_check_spec s = {.op = EW_NAME[op], .key = ACT[t], .tol = -1, .lo = -hi, .hi = hi, .label = lab};
            /* layer_norm of data with a large mean: cancellation in the variance */
            if (op == EW_LN && i % 4 == 3) s.lo = 7, s.hi = 9;
            s.row_anchor = op == EW_SILU || op == EW_GELU || op == EW_SWIGLU || op == EW_SIGMOID || op == EW_TANH;
            if (rank == 1) {
                s.n_binds = 2; /* symbol unused: bind anyway, data differs per run */
                s.syms[0][0] = s.syms[1][0] = tmax;
            } else {
                two_binds(r, &s, tmax);
            }
            finish(r, &s, g, y);
        }
}

/* ---------------------------------------------------------------- rope, attention, paged attention, kv_scatter */

static void rope(kiln_check_run *r)
{
    char lab[160];
    const int64_t hds[] = {2, 6, 8, 34, 64, 128}, hs[] = {1, 2, 3, 8};
    for (int t = 0; t < N_OF(ACT); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            int64_t H = pick(r, hs, N_OF(hs)), hd = pick(r, hds, N_OF(hds)), tmax = kiln_check_randint(r, 1, 9);
            kiln_rope_mode m = i % 2 ? KILN_ROPE_NEOX : KILN_ROPE_NORMAL;
            float theta = i % 3 == 2 ? 1e6f : 1e4f;
            kiln_dim T = kiln_sym(g, "t", tmax);
            kiln_node x = kiln_input(g, "x", ACT[t], 3, (kiln_dim[]){T, H, hd});
            /* every third shape with per-pair multipliers (llama-3.1 rope_freqs, linear scaling); every
             * fourth on part of each head (partial rotary: Phi-4-mini, stablelm), the rest passed through */
            float mult[64];
            for (int64_t j = 0; j < hd / 2; j++) mult[j] = (float)(0.125 + 0.875 * kiln_check_randint(r, 0, 1000) / 1000.0);
            bool ext = i % 3 == 1;
            int64_t rot = i % 4 == 3 ? 2 * kiln_check_randint(r, 1, hd / 2 + 1) : hd;
            kiln_node y = kiln_rope_partial(g, x, kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T), m, theta, ext ? mult : NULL, rot);
            snprintf(lab, sizeof lab, "rope %s %s [t<=%lld, %lld, %lld] theta %g%s rot %lld", kiln_dtype_name(ACT[t]),
                     m ? "neox" : "normal", (long long)tmax, (long long)H, (long long)hd, (double)theta,
                     ext ? " mult" : "", (long long)rot);
            kiln_check_spec s = {.op = "rope", .key = ACT[t], .tol = -1, .lo = -1, .hi = 1, .label = lab, .n_ins = 1,
                                 .ins = {{"pos", KILN_CHECK_FILL_INT, 0, 4096}}};
            two_binds(r, &s, tmax);
            finish(r, &s, g, y);
        }
}

static void attention(kiln_check_run *r)
{
    char lab[160];
    const int64_t hds[] = {2, 8, 16, 64, 128}, cs[] = {1, 5, 17, 64, 130, 300}, ratio[] = {1, 2, 4};
    for (int t = 0; t < N_OF(ACT); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            int64_t hd = pick(r, hds, N_OF(hds)), C = pick(r, cs, N_OF(cs)), Hkv = kiln_check_randint(r, 1, 3);
            int64_t H = Hkv * pick(r, ratio, N_OF(ratio)), tmax = kiln_check_randint(r, 1, (C < 8 ? C : 8) + 1);
            kiln_dim T = kiln_sym(g, "n_tok", tmax), NKV = kiln_sym(g, "n_kv", C);
            kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, H, hd});
            kiln_node k = kiln_state(g, "k", ACT[t], 3, (kiln_dim[]){Hkv, C, hd});
            kiln_node v = kiln_state(g, "v", ACT[t], 3, (kiln_dim[]){Hkv, C, hd});
            float sc = i % 3 == 1 ? 0.3f : 0.0f;
            kiln_node y = kiln_attention(g, q, k, v, NKV, sc);
            snprintf(lab, sizeof lab, "attention cache %s q [n_tok<=%lld, %lld, %lld] kv [%lld, %lld, %lld] scale %g",
                     kiln_dtype_name(ACT[t]), (long long)tmax, (long long)H, (long long)hd, (long long)Hkv, (long long)C,
                     (long long)hd, (double)sc);
            kiln_check_spec s = {.op = "attention", .key = ACT[t], .tol = -1, .lo = -2, .hi = 2, .label = lab,
                                 .state_lo = -1, .state_hi = 1.5f, .n_binds = 2};
            for (int b = 0; b < 2; b++) {
                s.syms[b][0] = b == 0 ? tmax : kiln_check_randint(r, 1, tmax + 1);
                s.syms[b][1] = b == 0 ? C : kiln_check_randint(r, s.syms[b][0], C + 1);
            }
            finish(r, &s, g, y);
        }
}

/* Ragged steps over a paged pool (check/step.c draws the metadata): block sizes 1..128, shuffled
 * blocks, caches from empty to the table's capacity, and every third shape a tree step (drafts in
 * chains, trees and forests). Runs at the bounds of n_tok / n_seq and at smaller values. */
/* Pool dtypes of paged attention and kv_scatter: the float ones, then q8_0 (head_dim a multiple of 32). */
static const kiln_dtype POOL[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0};
static const int64_t Q8_HDS[] = {32, 64, 128};

static void paged_attention(kiln_check_run *r)
{
    char lab[200];
    const int64_t hds[] = {2, 8, 16, 64, 128}, ratio[] = {1, 2, 4}, blks[] = {1, 4, 16, 32, 128};
    for (int t = 0; t < N_OF(POOL); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            bool q8 = POOL[t] == KILN_DTYPE_Q8_0;
            int64_t hd = q8 ? pick(r, Q8_HDS, N_OF(Q8_HDS)) : pick(r, hds, N_OF(hds)), Hkv = kiln_check_randint(r, 1, 3), H = Hkv * pick(r, ratio, N_OF(ratio));
            int64_t B = pick(r, blks, N_OF(blks)), tmax = kiln_check_randint(r, 1, 41);
            int64_t smax = kiln_check_randint(r, 1, (tmax < 8 ? tmax : 8) + 1);
            int64_t MB = kiln_check_randint(r, 1, 300 / B + 2);
            if (MB * B < tmax) MB = (tmax + B - 1) / B; /* any split of the tokens fits a sequence */
            int64_t NB = kiln_check_randint(r, MB, MB * smax + 4);
            bool tree = i % 3 == 2;
            kiln_dim T = kiln_sym(g, "n_tok", tmax), S = kiln_sym(g, "n_seq", smax);
            kiln_node q = kiln_input(g, "q", i % 4 == 1 && !q8 ? POOL[t] : KILN_DTYPE_F32, 3, (kiln_dim[]){T, H, hd});
            kiln_node k = kiln_state(g, "k", POOL[t], 3, (kiln_dim[]){Hkv, NB * B, hd});
            kiln_node v = kiln_state(g, "v", POOL[t], 3, (kiln_dim[]){Hkv, NB * B, hd});
            kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T), seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){S, 2});
            kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){S, MB});
            float sc = i % 3 == 1 ? 0.3f : 0.0f;
            kiln_node y = tree ? kiln_paged_attention_tree(g, q, k, v, pos, seqs, bt, kiln_input(g, "parents", KILN_DTYPE_I32, 1, &T), (int)B, sc)
                               : kiln_paged_attention(g, q, k, v, pos, seqs, bt, (int)B, sc);
            snprintf(lab, sizeof lab, "paged_attention pool %s [%lld, %lld x %lld, %lld] q [n_tok<=%lld, %lld] n_seq<=%lld, %lld blocks each%s",
                     kiln_dtype_name(POOL[t]), (long long)Hkv, (long long)NB, (long long)B, (long long)hd, (long long)tmax,
                     (long long)H, (long long)smax, (long long)MB, tree ? ", draft trees" : "");
            kiln_check_spec s = {.op = "paged_attention", .key = POOL[t], .tol = -1, .lo = -2, .hi = 2, .label = lab,
                                 .state_lo = -1, .state_hi = 1.5f, .n_binds = 2, .n_ins = tree ? 4 : 3,
                                 .ins = {{"pos", KILN_CHECK_FILL_PAGED, 0, 0}, {"seqs", KILN_CHECK_FILL_PAGED, 0, 0},
                                         {"blocks", KILN_CHECK_FILL_PAGED, 0, 0}, {"parents", KILN_CHECK_FILL_PAGED, 0, 0}}};
            s.syms[0][0] = tmax, s.syms[0][1] = smax;
            s.syms[1][0] = kiln_check_randint(r, 1, tmax + 1);
            s.syms[1][1] = kiln_check_randint(r, 1, (s.syms[1][0] < smax ? s.syms[1][0] : smax) + 1);
            finish(r, &s, g, y);
        }
}

/* The masks of kiln_attention_ext / kiln_paged_attention_ext (gemma 2/3, mistral, phi3): case i takes a
 * soft-cap (i % 3 != 1: 1.5 .. 50, deep in tanh's bend at the low end), a window (i % 3 != 0) or both.
 * Windows: 1 key in cases 1 and 2 (so a quick run always has one: a window one key too wide fails
 * it), then a few keys, then more than the cache. */
static void mask_of(kiln_check_run *r, int i, int64_t keys, float *softcap, int64_t *window)
{
    static const float caps[] = {1.5f, 5.0f, 20.0f, 50.0f};
    *softcap = i % 3 != 1 ? caps[kiln_check_randint(r, 0, 4)] : 0.0f;
    int w = (i / 3) % 3;
    *window = i % 3 == 0 ? 0 : w == 0 ? 1 : w == 1 ? kiln_check_randint(r, 2, keys + 2) : keys + kiln_check_randint(r, 1, 9);
}

static void attention_masks(kiln_check_run *r)
{
    char lab[200];
    const int64_t hds[] = {8, 16, 64, 128, 256}, cs[] = {5, 17, 64, 130, 300}, ratio[] = {1, 2, 4};
    for (int t = 0; t < N_OF(ACT); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            int64_t hd = pick(r, hds, N_OF(hds)), C = pick(r, cs, N_OF(cs)), Hkv = kiln_check_randint(r, 1, 3);
            int64_t H = Hkv * pick(r, ratio, N_OF(ratio)), tmax = kiln_check_randint(r, 1, (C < 40 ? C : 40) + 1);
            float cap;
            int64_t win;
            mask_of(r, i, C, &cap, &win);
            kiln_dim T = kiln_sym(g, "n_tok", tmax), NKV = kiln_sym(g, "n_kv", C);
            kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, H, hd});
            kiln_node k = kiln_state(g, "k", ACT[t], 3, (kiln_dim[]){Hkv, C, hd});
            kiln_node v = kiln_state(g, "v", ACT[t], 3, (kiln_dim[]){Hkv, C, hd});
            kiln_node y = kiln_attention_ext(g, q, k, v, NKV, 0.0f, cap, win);
            snprintf(lab, sizeof lab, "attention masks cache %s q [n_tok<=%lld, %lld, %lld] kv [%lld, %lld] softcap %g window %lld",
                     kiln_dtype_name(ACT[t]), (long long)tmax, (long long)H, (long long)hd, (long long)Hkv, (long long)C,
                     (double)cap, (long long)win);
            kiln_check_spec s = {.op = "attention:masks", .key = ACT[t], .tol = -1, .lo = -2, .hi = 2, .label = lab,
                                 .state_lo = -1, .state_hi = 1.5f, .n_binds = 2};
            for (int b = 0; b < 2; b++) {
                s.syms[b][0] = b == 0 ? tmax : kiln_check_randint(r, 1, tmax + 1);
                s.syms[b][1] = b == 0 ? C : kiln_check_randint(r, s.syms[b][0], C + 1);
            }
            finish(r, &s, g, y);
        }
}

/* Ragged paged steps (as paged_attention, without draft trees) with a soft-cap, a window or both. */
static void paged_masks(kiln_check_run *r)
{
    char lab[200];
    const int64_t hds[] = {8, 16, 64, 128}, ratio[] = {1, 2, 4}, blks[] = {1, 4, 16, 32};
    for (int t = 0; t < N_OF(ACT); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            int64_t hd = pick(r, hds, N_OF(hds)), Hkv = kiln_check_randint(r, 1, 3), H = Hkv * pick(r, ratio, N_OF(ratio));
            int64_t B = pick(r, blks, N_OF(blks)), tmax = kiln_check_randint(r, 1, 41);
            int64_t smax = kiln_check_randint(r, 1, (tmax < 8 ? tmax : 8) + 1);
            int64_t MB = kiln_check_randint(r, 1, 200 / B + 2);
            if (MB * B < tmax) MB = (tmax + B - 1) / B;
            int64_t NB = kiln_check_randint(r, MB, MB * smax + 4);
            float cap;
            int64_t win;
            mask_of(r, i, MB * B, &cap, &win);
            kiln_dim T = kiln_sym(g, "n_tok", tmax), S = kiln_sym(g, "n_seq", smax);
            kiln_node q = kiln_input(g, "q", KILN_DTYPE_F32, 3, (kiln_dim[]){T, H, hd});
            kiln_node k = kiln_state(g, "k", ACT[t], 3, (kiln_dim[]){Hkv, NB * B, hd});
            kiln_node v = kiln_state(g, "v", ACT[t], 3, (kiln_dim[]){Hkv, NB * B, hd});
            kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T), seqs = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){S, 2});
            kiln_node bt = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){S, MB});
            kiln_node y = kiln_paged_attention_ext(g, q, k, v, pos, seqs, bt, (int)B, 0.0f, cap, win);
            snprintf(lab, sizeof lab, "paged_attention masks pool %s [%lld, %lld x %lld, %lld] q [n_tok<=%lld, %lld] n_seq<=%lld softcap %g window %lld",
                     kiln_dtype_name(ACT[t]), (long long)Hkv, (long long)NB, (long long)B, (long long)hd, (long long)tmax,
                     (long long)H, (long long)smax, (double)cap, (long long)win);
            kiln_check_spec s = {.op = "paged_attention:masks", .key = ACT[t], .tol = -1, .lo = -2, .hi = 2, .label = lab,
                                 .state_lo = -1, .state_hi = 1.5f, .n_binds = 2, .n_ins = 3,
                                 .ins = {{"pos", KILN_CHECK_FILL_PAGED, 0, 0}, {"seqs", KILN_CHECK_FILL_PAGED, 0, 0},
                                         {"blocks", KILN_CHECK_FILL_PAGED, 0, 0}}};
            s.syms[0][0] = tmax, s.syms[0][1] = smax;
            s.syms[1][0] = kiln_check_randint(r, 1, tmax + 1);
            s.syms[1][1] = kiln_check_randint(r, 1, (s.syms[1][0] < smax ? s.syms[1][0] : smax) + 1);
            finish(r, &s, g, y);
        }
}

static void kv_scatter(kiln_check_run *r)
{
    char lab[160];
    const int64_t hds[] = {1, 2, 8, 64, 128}, cs[] = {1, 4, 17, 64, 300};
    for (int t = 0; t < N_OF(POOL); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            bool q8 = POOL[t] == KILN_DTYPE_Q8_0; /* a q8_0 pool takes f32 rows (quantized by the scatter) */
            int64_t hd = q8 ? pick(r, Q8_HDS, N_OF(Q8_HDS)) : pick(r, hds, N_OF(hds)), C = pick(r, cs, N_OF(cs)), Hkv = kiln_check_randint(r, 1, 4);
            int64_t tmax = kiln_check_randint(r, 1, (C < 6 ? C : 6) + 1);
            kiln_dim T = kiln_sym(g, "t", tmax);
            kiln_node st = kiln_state(g, "k", POOL[t], 3, (kiln_dim[]){Hkv, C, hd});
            kiln_node rows = kiln_input(g, "rows", q8 ? KILN_DTYPE_F32 : POOL[t], 3, (kiln_dim[]){T, Hkv, hd});
            kiln_node y = kiln_kv_scatter(g, st, rows, kiln_input(g, "pos", KILN_DTYPE_I32, 1, &T));
            snprintf(lab, sizeof lab, "kv_scatter %s rows [t<=%lld, %lld, %lld] into [.., %lld, ..]", kiln_dtype_name(POOL[t]),
                     (long long)tmax, (long long)Hkv, (long long)hd, (long long)C);
            kiln_check_spec s = {.op = "kv_scatter", .key = POOL[t], .tol = -1, .lo = -3, .hi = 3, .label = lab,
                                 .state_lo = -1, .state_hi = 1, .n_ins = 1,
                                 .ins = {{"pos", KILN_CHECK_FILL_POS_DISTINCT, (double)C, 0}}};
            two_binds(r, &s, tmax);
            finish(r, &s, g, y);
        }
}

/* ---------------------------------------------------------------- data movement */

static void get_rows(kiln_check_run *r)
{
    char lab[160];
    const int64_t vs[] = {1, 2, 3, 17, 100, 257};
    for (int w = 0; w < N_OF(WTS); w++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            int64_t blk = kiln_dtype_block(WTS[w]), V = pick(r, vs, N_OF(vs)), tmax = kiln_check_randint(r, 1, 9);
            int64_t D = blk == 1 ? pick(r, WIDTH, N_OF(WIDTH)) : blk * kiln_check_randint(r, 1, 5);
            kiln_dim T = kiln_sym(g, "t", tmax);
            kiln_node tab = kiln_check_weight(r, g, "table", WTS[w], 2, (kiln_dim[]){V, D}, -2, 2);
            kiln_node y = kiln_get_rows(g, tab, kiln_input(g, "ids", KILN_DTYPE_I32, 1, &T));
            snprintf(lab, sizeof lab, "get_rows %s [%lld, %lld] ids [t<=%lld]", kiln_dtype_name(WTS[w]), (long long)V,
                     (long long)D, (long long)tmax);
            kiln_check_spec s = {.op = "get_rows", .key = WTS[w], .tol = -1, .label = lab, .n_ins = 1,
                                 .ins = {{"ids", KILN_CHECK_FILL_INT, 0, (double)V}}};
            two_binds(r, &s, tmax);
            finish(r, &s, g, y);
        }
}

static void cast(kiln_check_run *r)
{
    char lab[160];
    for (int a = 0; a < N_OF(PLAIN); a++)
        for (int b = 0; b < N_OF(PLAIN); b++)
            for (int i = 0; i < (shapes(r) + 3) / 4; i++) { /* 16 pairs: a quarter of the shapes each */
                kiln_graph *g = new_graph();
                if (!g) return;
                int64_t D = pick(r, WIDTH, N_OF(WIDTH)), tmax = kiln_check_randint(r, 1, 9);
                kiln_dim T = kiln_sym(g, "t", tmax);
                kiln_node y = kiln_cast(g, kiln_input(g, "x", PLAIN[a], 2, (kiln_dim[]){T, D}), PLAIN[b]);
                snprintf(lab, sizeof lab, "cast %s -> %s [t<=%lld, %lld]", kiln_dtype_name(PLAIN[a]), kiln_dtype_name(PLAIN[b]),
                         (long long)tmax, (long long)D);
                float hi = PLAIN[b] == KILN_DTYPE_F16 || PLAIN[a] == KILN_DTYPE_F16 ? 6e4f : 1e6f;
                kiln_check_spec s = {.op = "cast", .key = PLAIN[b], .tol = -1, .lo = -hi, .hi = hi, .label = lab, .n_ins = 1,
                                     .ins = {{"x", PLAIN[a] == KILN_DTYPE_I32 ? KILN_CHECK_FILL_INT : KILN_CHECK_FILL_FLOAT,
                                              PLAIN[a] == KILN_DTYPE_I32 ? -2048 : -hi, PLAIN[a] == KILN_DTYPE_I32 ? 2048 : hi}}};
                if (i % 2) s.lo = -3, s.hi = 3, s.ins[0].lo = PLAIN[a] == KILN_DTYPE_I32 ? -3 : -3.5, s.ins[0].hi = 3.5; /* ties at .5 */
                two_binds(r, &s, tmax);
                finish(r, &s, g, y);
            }
}

typedef enum lay { LAY_RESHAPE, LAY_VIEW, LAY_TRANSPOSE, LAY_CONCAT } lay;
static const char *const LAY_NAME[] = {"reshape", "view", "transpose", "concat"};

static void layout(kiln_check_run *r, lay op)
{
    char lab[160];
    const int64_t sm[] = {1, 2, 3, 5, 7, 16, 17, 33};
    if (!kiln_check_wants(r, LAY_NAME[op])) return;
    for (int t = 0; t < N_OF(PLAIN); t++)
        for (int i = 0; i < shapes(r); i++) {
            kiln_graph *g = new_graph();
            if (!g) return;
            int64_t A = pick(r, sm, N_OF(sm)), B = pick(r, sm, N_OF(sm)), C = pick(r, sm, N_OF(sm));
            int64_t tmax = kiln_check_randint(r, 1, 6);
            kiln_dim T = kiln_sym(g, "t", tmax);
            kiln_node y = KILN_NODE_NONE, x;
            switch (op) {
            case LAY_RESHAPE: /* [t, A, B*C] -> [t, A*B, C]: symbolic dim kept */
                x = kiln_input(g, "x", PLAIN[t], 3, (kiln_dim[]){T, A, B * C});
                y = PLAIN[t] == KILN_DTYPE_I32 ? kiln_reshape(g, x, 2, (kiln_dim[]){T, A * B * C})
                                               : kiln_scale(g, kiln_reshape(g, x, 3, (kiln_dim[]){T, A * B, C}), 1.0f);
                break;
            case LAY_VIEW: { /* a contiguous slice of a constant [A, B, C] */
                x = kiln_input(g, "x", PLAIN[t], 3, (kiln_dim[]){A, B, C});
                int64_t n = A * B * C, len = kiln_check_randint(r, 1, n + 1), off = kiln_check_randint(r, 0, n - len + 1);
                y = kiln_view(g, x, 1, (kiln_dim[]){len}, off);
                break;
            }
            case LAY_TRANSPOSE: {
                int d0 = (int)kiln_check_randint(r, 0, 3), d1 = (d0 + (int)kiln_check_randint(r, 1, 3)) % 3;
                x = kiln_input(g, "x", PLAIN[t], 3, (kiln_dim[]){T, A, B});
                y = kiln_transpose(g, x, d0, d1);
                break;
            }
            case LAY_CONCAT: {
                int ax = (int)kiln_check_randint(r, 1, 3); /* not along the symbolic dim */
                kiln_dim da[3] = {T, A, B}, db[3] = {T, A, B};
                db[ax] = C;
                kiln_node a = kiln_input(g, "x", PLAIN[t], 3, da), b = kiln_input(g, "b", PLAIN[t], 3, db);
                y = kiln_concat(g, a, b, ax);
                break;
            }
            }
            snprintf(lab, sizeof lab, "%s %s [t<=%lld, %lld, %lld, %lld]", LAY_NAME[op], kiln_dtype_name(PLAIN[t]),
                     (long long)tmax, (long long)A, (long long)B, (long long)C);
            kiln_check_spec s = {.op = LAY_NAME[op], .key = PLAIN[t], .tol = -1, .lo = -100, .hi = 100, .label = lab};
            two_binds(r, &s, tmax);
            finish(r, &s, g, y);
        }
}

void kiln_check_ops(kiln_check_run *r)
{
    if (kiln_check_wants(r, "matmul")) matmul(r);
    if (kiln_check_wants(r, "moe_matmul")) moe_matmul(r);
    for (ew op = EW_SCALE; op <= EW_TANH; op++) elementwise(r, op);
    if (kiln_check_wants(r, "rope")) rope(r);
    if (kiln_check_wants(r, "attention")) attention(r);
    if (kiln_check_wants(r, "attention:masks")) attention_masks(r);
    if (kiln_check_wants(r, "paged_attention")) paged_attention(r);
    if (kiln_check_wants(r, "paged_attention:masks")) paged_masks(r);
    if (kiln_check_wants(r, "kv_scatter")) kv_scatter(r);
    if (kiln_check_wants(r, "get_rows")) get_rows(r);
    if (kiln_check_wants(r, "cast")) cast(r);
    for (lay op = LAY_RESHAPE; op <= LAY_CONCAT; op++) layout(r, op);
}
