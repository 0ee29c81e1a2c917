/* Tests of the .kg text format: every sample and an API-built graph with every op round-trip
 * (same hash, byte-identical second print), the printer's exact text, every kind of syntax and
 * meaning error at its exact line:col, weight files, and mutated inputs that must never crash.
 * Runs no kernels: graphs are compared by hash, text and weight bytes. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/graph.h"
#include "graph/kg.h"
#include "support/testutil.h"

static kiln_ctx *ctx;

static void setup(void)
{
    kiln_ctx_options o = {.quiet = true};
    cr_assert_eq(kiln_ctx_new(&o, &ctx), KILN_OK);
}

static void teardown(void) { kiln_ctx_free(ctx); }

TestSuite(kg, .init = setup, .fini = teardown);

static const char *data_dir(void)
{
    static char dir[4096];
    const char *src = getenv("KILN_SOURCE_DIR");
    snprintf(dir, sizeof dir, "%s/tests/data", src && *src ? src : KILN_SOURCE_DIR);
    return dir;
}

static char *must_print(const kiln_graph *g)
{
    char *t = NULL;
    kiln_status s = kiln_kg_print(g, &t);
    cr_assert_eq(s, KILN_OK, "print: %s", kiln_status_str(s));
    cr_assert_not_null(t);
    return t;
}

static kiln_graph *must_parse(const char *text, const char *file)
{
    kiln_graph *g = NULL;
    kiln_status s = kiln_kg_parse(ctx, text, file, &g);
    cr_assert_eq(s, KILN_OK, "parse of %s: %s: %s\n%s", file, kiln_status_str(s), kiln_ctx_error(ctx), text);
    return g;
}

static void hash_of(const kiln_graph *g, char out[33])
{
    cr_assert_eq(kiln_graph_hash(g, out), KILN_OK);
}

/* print(g) parses back to a graph of g's hash, and printing that again gives the same text.
 * Returns the text (caller frees). */
static char *check_roundtrip(const kiln_graph *g, const char *what)
{
    char h1[33], h2[33];
    char *t1 = must_print(g);
    kiln_graph *g2 = must_parse(t1, what);
    hash_of(g, h1);
    hash_of(g2, h2);
    cr_assert_str_eq(h1, h2, "%s: hash changed through print/parse\n%s", what, t1);
    cr_assert_eq(kiln_graph_size(g), kiln_graph_size(g2), "%s: node count changed", what);
    char *t2 = must_print(g2);
    cr_assert_str_eq(t1, t2, "%s: second print differs", what);
    free(t2);
    kiln_graph_free(g2);
    return t1;
}

static const kiln_node_rec *leaf(const kiln_graph *g, const char *name)
{
    uint32_t i = kiln_graph_find_leaf(g, name);
    cr_assert_neq(i, KILN_IDX_NONE, "no leaf '%s'", name);
    return &g->nodes[i];
}

/* ------------------------------------------------------------------ samples */

Test(kg, roundtrip_every_sample)
{
    DIR *d = opendir(data_dir());
    cr_assert_not_null(d, "cannot open %s", data_dir());
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".kg") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", data_dir(), e->d_name);
        kiln_graph *g = NULL;
        kiln_status s = kiln_kg_load(ctx, path, &g);
        cr_assert_eq(s, KILN_OK, "%s: %s", path, kiln_ctx_error(ctx));
        cr_assert_gt(kiln_graph_size(g), 0, "%s is empty", path);
        free(check_roundtrip(g, path));
        kiln_graph_free(g);
        n++;
    }
    closedir(d);
    cr_assert_geq(n, 3, "expected at least 3 samples in %s, found %d", data_dir(), n);
}

/* The llama sample is exactly the graph the builder makes from the same calls. */
Test(kg, llama_sample_equals_builder_graph)
{
    char path[8192], hf[33], hg[33];
    snprintf(path, sizeof path, "%s/llama_layer.kg", data_dir());
    kiln_graph *f = NULL, *g = NULL;
    cr_assert_eq(kiln_kg_load(ctx, path, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim nt = kiln_sym(g, "n_tok", 32), nkv = kiln_sym(g, "n_kv", 32);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){nt, 64});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){nt});
    kiln_node kc0 = kiln_state(g, "kcache", KILN_DTYPE_F16, 3, (kiln_dim[]){2, 32, 16});
    kiln_node vc0 = kiln_state(g, "vcache", KILN_DTYPE_F16, 3, (kiln_dim[]){2, 32, 16});
#define W(nm, t, a, b, seed, sc) kiln_weight_random(g, nm, t, (b) ? 2 : 1, (kiln_dim[]){a, b}, seed, sc)
    kiln_node an = W("attn_norm", KILN_DTYPE_F32, 64, 0, 1, 0.5f);
    kiln_node wq = W("wq", KILN_DTYPE_Q8_0, 64, 64, 2, 0.125f), wk = W("wk", KILN_DTYPE_Q8_0, 32, 64, 3, 0.125f);
    kiln_node wv = W("wv", KILN_DTYPE_Q8_0, 32, 64, 4, 0.125f), wo = W("wo", KILN_DTYPE_Q8_0, 64, 64, 5, 0.125f);
    kiln_node fn = W("ffn_norm", KILN_DTYPE_F32, 64, 0, 6, 0.5f);
    kiln_node wg = W("w_gate", KILN_DTYPE_Q8_0, 128, 64, 7, 0.125f), wu = W("w_up", KILN_DTYPE_Q8_0, 128, 64, 8, 0.125f);
    kiln_node wd = W("w_down", KILN_DTYPE_Q8_0, 64, 128, 9, 0.09f);
#undef W
    kiln_node h = kiln_rms_norm(g, x, an, 1e-5f);
    kiln_node q = kiln_matmul(g, h, wq), k = kiln_matmul(g, h, wk), v = kiln_matmul(g, h, wv);
    kiln_node q3 = kiln_reshape(g, q, 3, (kiln_dim[]){nt, 4, 16});
    kiln_node k3 = kiln_reshape(g, k, 3, (kiln_dim[]){nt, 2, 16});
    kiln_node v3 = kiln_reshape(g, v, 3, (kiln_dim[]){nt, 2, 16});
    kiln_node qr = kiln_rope(g, q3, pos, KILN_ROPE_NEOX, 10000.0f), kr = kiln_rope(g, k3, pos, KILN_ROPE_NEOX, 10000.0f);
    kiln_node kc = kiln_kv_scatter(g, kc0, kr, pos), vc = kiln_kv_scatter(g, vc0, v3, pos);
    kiln_node att = kiln_attention(g, qr, kc, vc, nkv, 0.0f);
    kiln_node att2 = kiln_reshape(g, att, 2, (kiln_dim[]){nt, 64});
    kiln_node h2 = kiln_add(g, x, kiln_matmul(g, att2, wo));
    kiln_node hn = kiln_rms_norm(g, h2, fn, 1e-5f);
    kiln_node gate = kiln_matmul(g, hn, wg); /* separate statements: argument order is unspecified */
    kiln_node up = kiln_matmul(g, hn, wu);
    kiln_node act = kiln_swiglu(g, gate, up);
    kiln_node y = kiln_add(g, h2, kiln_matmul(g, act, wd));
    cr_assert_eq(kiln_output(g, y, "out"), KILN_OK, "%s", kiln_graph_error(g));
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    hash_of(f, hf);
    hash_of(g, hg);
    cr_assert_str_eq(hf, hg, "llama_layer.kg differs from the builder's graph");
    cr_assert_eq(kiln_graph_size(f), 34); /* 4 inputs/states + 9 weights + 21 ops */
    const kiln_node_rec *a = leaf(f, "w_down"), *b = leaf(g, "w_down");
    cr_assert(a->data == NULL && b->data == NULL, "random weights must not be generated while parsing/building");
    cr_assert_eq(kiln_graph_materialize_weights(f), KILN_OK);
    cr_assert_eq(kiln_graph_materialize_weights(g), KILN_OK);
    cr_assert_eq(memcmp(a->data, b->data, kiln_row_bytes(KILN_DTYPE_Q8_0, 128) * 64), 0, "seeded data differs");
    kiln_graph_free(f);
    kiln_graph_free(g);
}

Test(kg, every_op_sample_has_every_op)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/every_op.kg", data_dir());
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_kg_load(ctx, path, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    bool seen[KILN_OP_COUNT] = {0};
    for (uint32_t i = 0; i < g->n_nodes; i++) seen[g->nodes[i].op] = true;
    for (int op = KILN_OP_INPUT; op < KILN_OP_COUNT; op++)
        cr_expect(seen[op], "every_op.kg has no %s", kiln_op_name((enum kiln_op)op));
    const float want[4] = {1, 2, 3, 4};
    cr_assert_eq(memcmp(leaf(g, "beta")->data, want, sizeof want), 0, "data=hex: decoded wrongly");
    kiln_graph_free(g);
}

/* ------------------------------------------------------------------ graphs from the API */

/* Every op, mostly unnamed nodes, two ops with one name, caller weights copied and borrowed. */
Test(kg, api_graph_with_every_op_roundtrips)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim n = kiln_sym(g, "n", 8);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){n, 32});
    kiln_node ids = kiln_input(g, "ids", KILN_DTYPE_I32, 1, (kiln_dim[]){4});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){n});
    kiln_node cache = kiln_state(g, "cache", KILN_DTYPE_F32, 3, (kiln_dim[]){2, 8, 16});
    float wdat[32 * 32], gdat[32];
    tu_fill(wdat, 32 * 32, -1, 1);
    tu_fill(gdat, 32, 0.5f, 1.5f);
    size_t g16_bytes;
    void *g16 = tu_to_dtype(KILN_DTYPE_BF16, gdat, 32, &g16_bytes);
    kiln_node w = kiln_weight(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){32, 32}, wdat, KILN_WEIGHT_COPY);
    kiln_node gm = kiln_weight(g, "gamma", KILN_DTYPE_F32, 1, (kiln_dim[]){32}, gdat, KILN_WEIGHT_BORROW);
    kiln_node wq = kiln_weight_random(g, "wq", KILN_DTYPE_Q5_K, 2, (kiln_dim[]){16, 256}, 99, 0.3f);
    kiln_node tab = kiln_weight_random(g, "table", KILN_DTYPE_Q4_K, 2, (kiln_dim[]){10, 256}, 98, 1.0f);
    kiln_node m = kiln_matmul(g, x, w);
    kiln_node s = kiln_scale(g, kiln_mul(g, kiln_add(g, m, x), gm), -0.3f);
    kiln_node sw = kiln_swiglu(g, kiln_tanh(g, kiln_sigmoid(g, kiln_gelu(g, kiln_silu(g, s)))), s);
    kiln_name(g, sw, "dup");
    kiln_node rn = kiln_rms_norm(g, sw, KILN_NODE_NONE, 1e-6f);
    kiln_name(g, rn, "dup");
    kiln_node ln = kiln_layer_norm(g, rn, KILN_NODE_NONE, gm, 0.1f);
    kiln_node sm = kiln_softmax(g, kiln_layer_norm(g, ln, gm, gm, 1e-5f));
    kiln_node am = kiln_argmax(g, sm);
    kiln_node c = kiln_cast(g, sm, KILN_DTYPE_BF16);
    kiln_node ro = kiln_rope(g, kiln_reshape(g, sm, 3, (kiln_dim[]){n, 2, 16}), pos, KILN_ROPE_NEOX, 1e6f);
    kiln_node kc = kiln_kv_scatter(g, cache, ro, pos);
    kiln_node at = kiln_attention(g, ro, kc, kc, n, 0.0f);
    kiln_dim ns = kiln_sym(g, "ns", 3);
    kiln_node sq = kiln_input(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){ns, 2});
    kiln_node bl = kiln_input(g, "blocks", KILN_DTYPE_I32, 2, (kiln_dim[]){ns, 4});
    kiln_node pa = kiln_paged_attention(g, ro, kc, kc, pos, sq, bl, 2, 0.5f);
    kiln_output(g, pa, "paged");
    kiln_output(g, kiln_paged_attention_tree(g, ro, kc, kc, pos, sq, bl, kiln_input(g, "parents", KILN_DTYPE_I32, 1, (kiln_dim[]){n}), 4, 0),
                "tree");
    kiln_output(g, kiln_attention_ext(g, ro, kc, kc, n, 0.0f, 30.0f, 3), "capped");
    kiln_output(g, kiln_paged_attention_ext(g, ro, kc, kc, pos, kiln_input(g, "seqs2", KILN_DTYPE_I32, 2, (kiln_dim[]){ns, 2}),
                                            kiln_input(g, "blocks2", KILN_DTYPE_I32, 2, (kiln_dim[]){ns, 4}), 2, 0.5f, 50.0f, 7),
                "paged_capped");
    kiln_node tr = kiln_transpose(g, kiln_view(g, w, 2, (kiln_dim[]){4, 16}, 48), 1, 0);
    kiln_node cc = kiln_concat(g, tr, tr, 0);
    kiln_node mq = kiln_matmul(g, kiln_get_rows(g, tab, ids), wq);
    kiln_output(g, at, "att");
    kiln_output(g, am, "tok");
    kiln_output(g, c, "c");
    kiln_output(g, cc, "cc");
    kiln_output(g, mq, "mq");
    kiln_output(g, kiln_all_reduce(g, mq), "ar");
    kiln_output(g, kiln_all_gather(g, mq), "ag");
    kiln_output(g, kiln_scale_rows(g, sm, kiln_moe_route(g, sm, 2, false), 3), "sr");
    kiln_output(g, kiln_moe_matmul(g, sm, kiln_weight_random(g, "exps", KILN_DTYPE_Q8_0, 3, (kiln_dim[]){32, 2, 32}, 5, 1.0f),
                                   kiln_moe_route(g, sm, 2, true), 2, true), "moe");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    char *t = check_roundtrip(g, "api graph");
    for (int op = KILN_OP_MATMUL; op < KILN_OP_COUNT; op++) {
        char pat[64];
        snprintf(pat, sizeof pat, " = %s ", kiln_op_name((enum kiln_op)op));
        cr_expect_not_null(strstr(t, pat), "no '%s' in\n%s", pat, t);
    }
    cr_expect(strstr(t, " pos seqs blocks block=2 ") && strstr(t, " pos seqs blocks parents block=4 "),
              "paged attention with and without parents:\n%s", t);
    cr_expect_not_null(strstr(t, "\ndup = swiglu "), "the first 'dup' keeps its name:\n%s", t);
    cr_expect_null(strstr(t, "\ndup = rms_norm"), "the second 'dup' must be renamed:\n%s", t);
    kiln_graph *g2 = must_parse(t, "api graph");
    cr_assert_eq(memcmp(leaf(g2, "w")->data, wdat, sizeof wdat), 0, "copied weight bytes changed");
    cr_assert_eq(memcmp(leaf(g2, "gamma")->data, gdat, sizeof gdat), 0, "borrowed weight bytes changed");
    cr_assert_eq(kiln_graph_materialize_weights(g), KILN_OK);
    cr_assert_eq(kiln_graph_materialize_weights(g2), KILN_OK);
    cr_assert_eq(memcmp(leaf(g2, "wq")->data, leaf(g, "wq")->data, kiln_row_bytes(KILN_DTYPE_Q5_K, 256) * 16), 0,
                 "seeded weight bytes changed");
    kiln_graph_free(g2);
    free(t);
    free(g16);
    kiln_graph_free(g);
}

Test(kg, printer_exact_text)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim T = kiln_sym(g, "T", 16);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, 8});
    kiln_node w = kiln_weight_random(g, "w", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 8}, 7, 0.5f);
    const float bd[2] = {1.0f, -2.0f};
    kiln_node b = kiln_weight(g, "b", KILN_DTYPE_F32, 1, (kiln_dim[]){2}, bd, KILN_WEIGHT_COPY);
    kiln_node m = kiln_matmul(g, x, w);
    kiln_node a = kiln_add(g, m, b);
    kiln_name(g, a, "t5"); /* takes the name the rms_norm would have been given */
    kiln_node r = kiln_rms_norm(g, a, KILN_NODE_NONE, 1e-5f);
    kiln_node sc = kiln_scale(g, r, 0.1f);
    kiln_output(g, sc, "y");
    kiln_output(g, m, "mm");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    char *t = must_print(g);
    cr_assert_str_eq(t, "sym T 16\n"
                        "input x f32 [T, 8]\n"
                        "weight w f32 [2, 8] seed=7 scale=0.5\n"
                        "weight b f32 [2] data=hex:0000803f000000c0\n"
                        "t3 = matmul x w\n"
                        "t5 = add t3 b\n"
                        "t5_ = rms_norm t5 _ eps=1e-5\n"
                        "t6 = scale t5_ s=0.1\n"
                        "output y t6\n"
                        "output mm t3\n");
    free(t);
    kiln_graph_free(g);
}

Test(kg, quoted_names_and_comments)
{
    const char *text = "# leading comment\n"
                       "\n"
                       "   input \"_\" f32 [4]   # the builder allows a leaf named _\r\n"
                       "sym \"n-1\" 3\n"
                       "input \"z\" f32 [\"n-1\", 4]\n"
                       "\"y\" = silu \"_\"\n"
                       "output o y";
    kiln_graph *g = must_parse(text, "q.kg");
    char *t = check_roundtrip(g, "quoted");
    cr_assert_str_eq(t, "sym n-1 3\ninput \"_\" f32 [4]\ninput z f32 [n-1, 4]\ny = silu \"_\"\noutput o y\n");
    free(t);
    kiln_graph_free(g);
}

/* ------------------------------------------------------------------ errors */

typedef struct err_case {
    const char *text; /* input */
    int         line; /* expected line */
    int         col;  /* expected column */
    const char *what; /* substring of the message */
} err_case;

#define X1 "input x f32 [4]\n"
static const err_case err_cases[] = {
    {"foo x\n", 1, 1, "unknown keyword 'foo'"},
    {"= add x\n", 1, 1, "expected a keyword"},
    {X1 "y = frob x\n", 2, 5, "unknown op 'frob'"},
    {X1 "y = input x\n", 2, 5, "unknown op 'input'"},
    {X1 "y =\n", 2, 4, "missing op after '='"},
    {X1 "y = add x\n", 2, 10, "missing operand for add"},
    {X1 "y = add x z\n", 2, 11, "unknown name 'z'"},
    {X1 "y = silu x x\n", 2, 12, "too many operands for silu"},
    {X1 "y = add _ x\n", 2, 9, "may not be '_'"},
    {X1 "input x f32 [4]\n", 2, 7, "duplicate name 'x'"},
    {X1 "y = silu x\ny = gelu x\n", 3, 1, "duplicate name 'y'"},
    {"sym n 4\nsym n 4\n", 2, 5, "duplicate symbol 'n'"},
    {"input _ f32 [4]\n", 1, 7, "'_' is not a name"},
    {"input x\n", 1, 8, "missing dtype"},
    {"input x f33 [4]\n", 1, 9, "bad dtype 'f33'"},
    {X1 "y = cast x dtype=f64\n", 2, 18, "bad dtype 'f64'"},
    {"input x f32 4\n", 1, 13, "expected '['"},
    {"input x f32 [4x]\n", 1, 14, "bad dim '4x'"},
    {"input x f32 [-1]\n", 1, 14, "dim -1 out of range"},
    {"input x f32 [4,]\n", 1, 16, "expected a dim, found ']'"},
    {"input x f32 [4 5]\n", 1, 16, "expected ',' or ']'"},
    {"input x f32 [n]\n", 1, 14, "unknown symbol 'n'"},
    {"input x f32 [4, 5\n", 1, 13, "unterminated '['"},
    {"input x f32 [1, 2, 3, 4, 5]\n", 1, 26, "too many dims"},
    {"input x f32 [4] extra\n", 1, 17, "unexpected 'extra'"},
    {"sym n 1.5\n", 1, 7, "bad max '1.5'"},
    {"sym n 0\n", 1, 7, "max 0 out of range"},
    {"sym n 99999999999999999999\n", 1, 7, "out of range"},
    {"sym n\n", 1, 6, "missing the symbol's max"},
    {X1 "y = scale x s=1.2.3\n", 2, 15, "bad s '1.2.3'"},
    {X1 "y = scale x s=1e999\n", 2, 15, "out of range for f32"},
    {X1 "y = scale x s=nan(12)\n", 2, 15, "NaN is written nan"},
    {X1 "y = scale x\n", 2, 12, "missing parameter s= for scale"},
    {X1 "y = transpose x d0=0\n", 2, 21, "missing parameter d1="},
    {X1 "y = attention x x x\n", 2, 20, "missing parameter n_kv="},
    {X1 "y = rms_norm x foo=1\n", 2, 16, "unknown parameter 'foo' for rms_norm"},
    {X1 "y = rms_norm x eps=1 eps=2\n", 2, 22, "parameter 'eps' given twice"},
    {X1 "y = rms_norm x eps=\n", 2, 20, "missing value for 'eps'"},
    {X1 "y = rms_norm x eps\n", 2, 16, "unknown name 'eps'"},
    {X1 "y = rms_norm x _ _\n", 2, 18, "too many operands"},
    {"input x f32 [2, 4, 16]\ninput p i32 [2]\ny = rope x p mode=sideways\n", 3, 19, "bad mode 'sideways'"},
    {X1 "y = view x [2] offset=-1\n", 2, 23, "offset -1 out of range"},
    {X1 "y = silu x [4]\n", 2, 12, "silu takes no dims"},
    {X1 "y = reshape x\n", 2, 14, "missing dims"},
    {X1 "y = reshape x [1, 1, 1, 1, 4]\n", 2, 28, "too many dims"},
    {X1 "output o z\n", 2, 10, "unknown name 'z'"},
    {X1 "output o\n", 2, 9, "missing node to output"},
    {X1 "weight w f32 [4] file=\"abc\n", 2, 23, "unterminated string"},
    {"input \"a\\q\" f32 [4]\n", 1, 9, "unknown escape"},
    {"input \"a\\x0\" f32 [4]\n", 1, 9, "bad \\x escape"},
    {"input \"a\\x00\" f32 [4]\n", 1, 9, "NUL byte in string"},
    {"input x f32\x01 [4]\n", 1, 12, "control character 0x01"},
    {"weight w f32 [4]\n", 1, 17, "needs seed=, file= or data="},
    {"weight w f32 [4] seed=1 file=\"a\"\n", 1, 25, "exclude each other"},
    {"weight w f32 [4] file=\"a\" scale=2\n", 1, 27, "scale= goes with seed="},
    {"weight w f32 [4] seed=-1\n", 1, 23, "bad seed '-1'"},
    {"weight w f32 [4] bias=1\n", 1, 18, "unknown parameter 'bias' for weight"},
    {"weight w f32 [4] file=\"/nonexistent_kiln_dir/w.bin\"\n", 1, 23, "cannot open weight file"},
    {"weight w f32 [2] data=hex:0000803f0000004g\n", 1, 42, "bad hex digit 'g'"},
    {"weight w f32 [2] data=hex:0000803f\n", 1, 23, "data has 4 bytes, the weight needs 8"},
    {"weight w f32 [2] data=hex:0000803f0\n", 1, 23, "odd number of hex digits"},
    {"weight w f32 [2] data=0000803f00000000\n", 1, 23, "data must be written hex:"},
    {"weight w q4_k [2, 100] data=hex:00\n", 1, 1, "not a multiple of the dtype's block"},
    {"sym n 4\nweight w f32 [n] data=hex:00\n", 2, 1, "must be constant"},
    /* builder errors: at the op (or keyword) with the builder's message */
    {X1 "input z f32 [5]\ny = add x z\n", 3, 5, "add"},
    {"weight w i32 [4] seed=1\n", 1, 1, "random data needs a float"},
    {X1 "y = scale x s=inf\n", 2, 5, "scale"},
    {"input x f32 []\n", 1, 1, "rank 0"},
    {X1 "output x x\n", 2, 1, "already used"},
};

Test(kg, every_error_at_its_line_and_col)
{
    const char *good = "input x f32 [4]\ny = silu x\noutput o y\n";
    for (size_t i = 0; i < sizeof err_cases / sizeof err_cases[0]; i++) {
        const err_case *c = &err_cases[i];
        kiln_graph *g = (kiln_graph *)0x1;
        kiln_status s = kiln_kg_parse(ctx, c->text, "t.kg", &g);
        cr_expect_eq(s, KILN_ERR_PARSE, "case %zu: status %s for:\n%s", i, kiln_status_str(s), c->text);
        cr_expect_null(g, "case %zu: *out must be NULL on error", i);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "t.kg:%d:%d: ", c->line, c->col);
        const char *msg = kiln_ctx_error(ctx);
        cr_expect_eq(strncmp(msg, prefix, strlen(prefix)), 0, "case %zu: want '%s...', got '%s'", i, prefix, msg);
        cr_expect_not_null(strstr(msg, c->what), "case %zu: want '%s' in '%s'", i, c->what, msg);
        kiln_graph_free(g == (kiln_graph *)0x1 ? NULL : g);
        /* the context stays usable */
        g = NULL;
        cr_expect_eq(kiln_kg_parse(ctx, good, "good.kg", &g), KILN_OK, "case %zu: good text after error: %s", i,
                     kiln_ctx_error(ctx));
        cr_expect_eq(kiln_graph_size(g), 2);
        kiln_graph_free(g);
    }
}

Test(kg, file_null_names_text_and_bad_args)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_kg_parse(ctx, "\n\n  bogus\n", NULL, &g), KILN_ERR_PARSE);
    cr_assert_str_eq(kiln_ctx_error(ctx), "<text>:3:3: unknown keyword 'bogus' (sym, input, weight, state, output, "
                                          "or NAME = op ...)");
    cr_assert_eq(kiln_kg_parse(ctx, NULL, NULL, &g), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_kg_parse(ctx, "", NULL, NULL), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_kg_parse(ctx, "", NULL, &g), KILN_OK, "an empty file is an empty graph");
    cr_assert_eq(kiln_graph_size(g), 0);
    kiln_graph_free(g);
    cr_assert_eq(kiln_kg_parse(NULL, "nonsense", NULL, &g), KILN_ERR_PARSE, "NULL ctx: status without message");
    char *t = (char *)0x1;
    cr_assert_eq(kiln_kg_print(NULL, &t), KILN_ERR_INVALID_ARG);
    cr_assert_null(t);
}

/* ------------------------------------------------------------------ files */

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

Test(kg, weight_files_relative_to_the_kg_file)
{
    char dir[] = "/tmp/kiln_kg_XXXXXX", path[64], kg[64], text[512];
    cr_assert_not_null(mkdtemp(dir));
    float w[4];
    tu_fill(w, 4, -3, 3);
    snprintf(path, sizeof path, "%s/w.bin", dir);
    write_file(path, w, sizeof w);
    snprintf(kg, sizeof kg, "%s/g.kg", dir);
    const char *src = "weight w f32 [4] file=\"w.bin\"   # relative to this file\n";
    write_file(kg, src, strlen(src));

    kiln_graph *g = NULL;
    cr_assert_eq(kiln_kg_load(ctx, kg, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(memcmp(leaf(g, "w")->data, w, sizeof w), 0);
    char *t = must_print(g); /* the path is not kept: the data is written inline */
    cr_assert_not_null(strstr(t, "weight w f32 [4] data=hex:"), "%s", t);
    free(t);
    kiln_graph_free(g);

    g = NULL; /* an absolute path works with no file name */
    snprintf(text, sizeof text, "weight w f32 [2, 2] file=\"%s\"\n", path);
    cr_assert_eq(kiln_kg_parse(ctx, text, NULL, &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(memcmp(leaf(g, "w")->data, w, sizeof w), 0);
    kiln_graph_free(g);

    g = NULL;
    cr_assert_eq(kiln_kg_parse(ctx, "\nweight w f32 [5] file=\"w.bin\"\n", kg, &g), KILN_ERR_PARSE);
    snprintf(text, sizeof text, "%s:2:23: weight file '%s' has 16 bytes, the weight needs 20", kg, path);
    cr_assert_str_eq(kiln_ctx_error(ctx), text);
    cr_assert_eq(kiln_kg_parse(ctx, "weight w f32 [4] file=\"nope.bin\"\n", kg, &g), KILN_ERR_PARSE);
    snprintf(text, sizeof text, "%s:1:23: cannot open weight file '%s/nope.bin'", kg, dir);
    cr_assert_eq(strncmp(kiln_ctx_error(ctx), text, strlen(text)), 0, "%s", kiln_ctx_error(ctx));
    cr_assert_eq(kiln_kg_parse(ctx, "weight w f32 [4] file=\".\"\n", kg, &g), KILN_ERR_PARSE);
    cr_assert_not_null(strstr(kiln_ctx_error(ctx), "not a regular file"), "%s", kiln_ctx_error(ctx));

    /* a NUL byte in a file is an error at its place, not the silent end of the text */
    write_file(kg, "input x f32 [4]\nin\0put", 22);
    cr_assert_eq(kiln_kg_load(ctx, kg, &g), KILN_ERR_PARSE);
    snprintf(text, sizeof text, "%s:2:3: NUL byte in the file", kg);
    cr_assert_str_eq(kiln_ctx_error(ctx), text);
    cr_assert_null(g);

    unlink(path);
    unlink(kg);
    cr_assert_eq(rmdir(dir), 0);
    cr_assert_eq(kiln_kg_load(ctx, kg, &g), KILN_ERR_IO);
    cr_assert_not_null(strstr(kiln_ctx_error(ctx), "cannot open"));
}

/* ------------------------------------------------------------------ printer limits */

Test(kg, printer_refuses_what_it_cannot_write)
{
    kiln_graph *g = NULL;
    char *t = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_input(g, "x", KILN_DTYPE_F32, 0, NULL); /* a builder error sticks */
    cr_assert_neq(kiln_graph_status(g), KILN_OK);
    cr_assert_eq(kiln_kg_print(g, &t), kiln_graph_status(g));
    cr_assert_null(t);
    kiln_graph_free(g);

    cr_assert_eq(kiln_graph_new(&g), KILN_OK); /* too big to inline: an error, not a lie */
    size_t big = KILN_KG_MAX_INLINE_BYTES + 4096;
    void *mem = malloc(big); /* borrowed, never read */
    cr_assert_not_null(mem);
    kiln_weight(g, "big", KILN_DTYPE_F32, 2, (kiln_dim[]){(kiln_dim)(big / 4096), 1024}, mem, KILN_WEIGHT_BORROW);
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    cr_assert_eq(kiln_kg_print(g, &t), KILN_ERR_UNSUPPORTED);
    cr_assert_null(t);
    kiln_graph_free(g);
    free(mem);
}

Test(kg, float_text_is_exact)
{
    char buf[32];
    cr_assert_str_eq(kiln_kg_fmt_float(1e-5f, buf), "1e-5");
    cr_assert_str_eq(kiln_kg_fmt_float(10000.0f, buf), "10000");
    cr_assert_str_eq(kiln_kg_fmt_float(-0.0f, buf), "-0");
    cr_assert_str_eq(kiln_kg_fmt_float(3e20f, buf), "3e20");
    cr_assert_str_eq(kiln_kg_fmt_float(-NAN, buf), "-nan");
    cr_assert_str_eq(kiln_kg_fmt_float(-INFINITY, buf), "-inf");
    for (int i = 0; i < 50000; i++) {
        uint32_t bits = (uint32_t)tu_next();
        float v;
        memcpy(&v, &bits, 4);
        if (!isfinite(v)) continue;
        float back = strtof(kiln_kg_fmt_float(v, buf), NULL);
        cr_assert_eq(memcmp(&back, &v, 4), 0, "0x%08x printed as %s reads back differently", bits, buf);
    }
}

/* ------------------------------------------------------------------ robustness */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* Mutated samples: a graph or a PARSE error with a located message, never a crash; what parses
 * round-trips. */
Test(kg, mutated_inputs_never_crash, .timeout = 300)
{
    static const char *names[] = {"llama_layer.kg", "every_op.kg", "gpt2_mlp.kg"};
    static const char alphabet[] = "[]=,\"#_ \n\\0123456789-+.exnqfi";
    int ok = 0, bad = 0;
    for (int f = 0; f < 3; f++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", data_dir(), names[f]);
        char *orig = slurp(path);
        size_t len = strlen(orig);
        for (int it = 0; it < 500; it++) {
            char *t = strdup(orig);
            size_t l = len;
            for (int m = (int)tu_randint(1, 4); m > 0 && l > 1; m--) {
                size_t at = (size_t)tu_randint(0, (int64_t)l);
                int kind = (int)tu_randint(0, 3);
                if (kind == 0) { /* replace a byte */
                    t[at] = alphabet[tu_randint(0, (int64_t)sizeof alphabet - 1)];
                } else if (kind == 1) { /* delete a run */
                    size_t k = (size_t)tu_randint(1, 12);
                    if (at + k > l) k = l - at;
                    memmove(t + at, t + at + k, l - at - k + 1);
                    l -= k;
                } else { /* truncate */
                    t[at] = '\0';
                    l = at;
                }
            }
            kiln_graph *g = NULL;
            kiln_status s = kiln_kg_parse(ctx, t, "<fuzz>", &g);
            cr_assert(s == KILN_OK || s == KILN_ERR_PARSE, "status %s for:\n%s", kiln_status_str(s), t);
            if (s == KILN_OK) {
                free(check_roundtrip(g, "mutant"));
                ok++;
            } else {
                cr_assert_eq(strncmp(kiln_ctx_error(ctx), "<fuzz>:", 7), 0, "%s", kiln_ctx_error(ctx));
                bad++;
            }
            kiln_graph_free(g);
            free(t);
        }
        free(orig);
    }
    cr_assert_gt(ok, 20, "too few mutants parsed (%d) to test their round trip", ok);
    cr_assert_gt(bad, 200, "too few mutants failed (%d)", bad);
}

Test(kg, special_floats_roundtrip)
{
    kiln_graph *g = must_parse("input x f32 [4]\na = scale x s=3.4028235e38\nb = scale a s=-1.5e-45\n"
                               "c = scale b s=1e-40\nd = scale c s=-0\noutput o d\n", "f.kg");
    char *t = check_roundtrip(g, "special floats");
    cr_assert_str_eq(t, "input x f32 [4]\na = scale x s=3.4028235e38\nb = scale a s=-1e-45\nc = scale b s=1e-40\n"
                        "d = scale c s=-0\noutput o d\n");
    free(t);
    kiln_graph_free(g);
}

/* A huge random weight costs nothing until a plan needs it: parse, hash and print never touch
 * its bytes (this line used to allocate 2.6 GB inside kiln_kg_parse). */
Test(kg, random_weight_is_lazy)
{
    const char *text = "weight proj bf16 [2544446, 512] seed=24\ninput x f32 [4]\ny = scale x s=2\noutput y y\n";
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_kg_parse(ctx, text, "lazy.kg", &g), KILN_OK, "%s", kiln_ctx_error(ctx));
    const kiln_node_rec *w = leaf(g, "proj");
    cr_assert_null(w->data);
    cr_assert(w->random);
    char h[33];
    cr_assert_eq(kiln_graph_hash(g, h), KILN_OK);
    char *t = must_print(g);
    cr_assert(strstr(t, "seed=24"), "%s", t);
    free(t);
    kiln_graph_free(g);
}

/* Materialized bytes do not depend on how the rows are split over threads: generated in one
 * piece (rows = 1) they equal the threaded result row for row. */
Test(kg, random_weight_bytes_independent_of_split)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_weight_random(g, "w", KILN_DTYPE_Q8_0, 2, (kiln_dim[]){4096, 64}, 7, 0.5f);
    kiln_weight_random(g, "v", KILN_DTYPE_F32, 1, (kiln_dim[]){4096 * 64}, 7, 0.5f);
    const kiln_node_rec *w = leaf(g, "w"), *v = leaf(g, "v");
    void *wb = malloc(kiln_row_bytes(KILN_DTYPE_Q8_0, 64) * 4096), *vb = malloc(4096 * 64 * sizeof(float));
    cr_assert_eq(kiln_graph_weight_fill(w, wb), KILN_OK);
    cr_assert_eq(kiln_graph_weight_fill(v, vb), KILN_OK);
    float *a = malloc(4096 * 64 * sizeof *a);
    cr_assert_eq(kiln_dequantize(KILN_DTYPE_Q8_0, wb, a, 4096 * 64), KILN_OK);
    float *q = malloc(4096 * 64 * sizeof *q);
    void *qb = malloc(kiln_row_bytes(KILN_DTYPE_Q8_0, 64) * 4096);
    cr_assert_eq(kiln_quantize(KILN_DTYPE_Q8_0, vb, qb, 4096 * 64), KILN_OK);
    cr_assert_eq(kiln_dequantize(KILN_DTYPE_Q8_0, qb, q, 4096 * 64), KILN_OK);
    cr_assert_eq(memcmp(a, q, 4096 * 64 * sizeof *a), 0, "threaded rows differ from one sequential stream");
    free(a);
    free(q);
    free(qb);
    free(wb);
    free(vb);
    kiln_graph_free(g);
}

/* rope's per-pair multipliers (kiln_rope_ext) print as mult="...", parse back to the same hash, and
 * are part of the hash (a plan cache must not mix two models' rotary tables); a wrong count or an
 * unquoted list is a parse error at its column. */
static kiln_graph *rope_graph(const float *mult)
{
    kiln_graph *g = NULL;
    cr_assert_eq(kiln_graph_new(&g), KILN_OK);
    kiln_dim n = kiln_sym(g, "n", 8);
    kiln_node x = kiln_input(g, "x", KILN_DTYPE_F32, 3, (kiln_dim[]){n, 2, 8});
    kiln_node pos = kiln_input(g, "pos", KILN_DTYPE_I32, 1, (kiln_dim[]){n});
    kiln_output(g, kiln_rope_ext(g, x, pos, KILN_ROPE_NORMAL, 5e5f, mult), "y");
    cr_assert_eq(kiln_graph_status(g), KILN_OK, "%s", kiln_graph_error(g));
    return g;
}

Test(kg, rope_multipliers_roundtrip_and_change_the_hash)
{
    float a[4] = {1.0f, 0.5f, 0.125f, 1.0f / 3}, b[4] = {1.0f, 0.5f, 0.125f, 0.25f};
    kiln_graph *ga = rope_graph(a), *gb = rope_graph(b), *g0 = rope_graph(NULL);
    char *t = check_roundtrip(ga, "rope mult");
    cr_assert(strstr(t, " mult=\"1,0.5,0.125,0.33333334\""), "%s", t);
    free(t);
    char ha[33], hb[33], h0[33];
    hash_of(ga, ha), hash_of(gb, hb), hash_of(g0, h0);
    cr_assert(strcmp(ha, hb) != 0 && strcmp(ha, h0) != 0, "multipliers must change the hash");
    kiln_graph_free(ga), kiln_graph_free(gb), kiln_graph_free(g0);
    const char *bad[3] = {"mult=\"1,2,3\"", "mult=1", "mult=\"1,x,2,3\""}, *why[3] = {"lists 3 numbers", "quoted list",
                                                                                       "exactly 4 numbers"};
    for (int i = 0; i < 3; i++) {
        char text[256];
        snprintf(text, sizeof text, "sym n 8\ninput x f32 [n, 2, 8]\ninput pos i32 [n]\ny = rope x pos %s\noutput y y\n",
                 bad[i]);
        kiln_graph *g = NULL;
        cr_assert_eq(kiln_kg_parse(ctx, text, "m.kg", &g), KILN_ERR_PARSE, "%s", bad[i]);
        cr_assert(strstr(kiln_ctx_error(ctx), why[i]) && strstr(kiln_ctx_error(ctx), "m.kg:4:"), "%s: %s", bad[i],
                  kiln_ctx_error(ctx));
        cr_assert_null(g);
    }
}
