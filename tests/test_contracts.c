/* Contracts: every op has contracts/<op>.yaml with a tolerance for every dtype it takes (by the
 * table below from kiln.h, and by asking the builder which dtypes it accepts), exact ops say 0,
 * and the loader rejects missing and malformed files with a clear message. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph/graph.h"
#include "support/contract.h"

#define B(t) (1u << KILN_DTYPE_##t)
#define ACT (B(F32) | B(F16) | B(BF16))
#define PLAIN (ACT | B(I32))
#define WTS (ACT | B(Q8_0) | B(Q4_K) | B(Q5_K) | B(Q6_K) | B(Q4_0) | B(Q4_1) | B(Q5_0) | B(Q5_1) | B(IQ4_NL) | \
             B(Q2_K) | B(Q3_K) | B(IQ4_XS))

/* Dtypes keying each op's tolerance, from kiln.h (see each contract's tolerance_key). */
static unsigned key_dtypes(enum kiln_op op)
{
    switch (op) {
    case KILN_OP_MATMUL: case KILN_OP_MOE_MATMUL: return WTS;
    case KILN_OP_GET_ROWS: return WTS;
    case KILN_OP_ALL_REDUCE: return B(F32); /* sums the f32 outputs of row-parallel matmuls */
    case KILN_OP_ALL_GATHER: return B(F32); /* joins the f32 outputs of column-parallel matmuls */
    case KILN_OP_MOE_ROUTE: case KILN_OP_SCALE_ROWS: return B(F32); /* router logits and expert outputs: matmul results */
    case KILN_OP_CAST: case KILN_OP_RESHAPE: case KILN_OP_VIEW: case KILN_OP_TRANSPOSE: case KILN_OP_CONCAT: return PLAIN;
    default: return ACT;
    }
}

Test(contracts, every_op_has_a_contract_with_its_dtypes)
{
    for (int op = KILN_OP_MATMUL; op < KILN_OP_COUNT; op++) {
        const char *name = kiln_op_name((enum kiln_op)op);
        contract c;
        char err[512];
        cr_assert(name && *name, "op %d has no name", op);
        cr_assert(contract_load(name, &c, err, sizeof err), "op %s: %s", name, err);
        cr_assert(c.summary[0] && c.flops[0] && c.bytes[0], "op %s: summary, flops or bytes missing", name);
        cr_assert(c.n_inputs >= 1 && c.n_edges >= 1, "op %s: inputs or edge_cases missing", name);
        for (int t = 0; t < KILN_DTYPE_COUNT; t++)
            if (key_dtypes((enum kiln_op)op) & (1u << t))
                cr_assert(!isnan(contract_tol(&c, (kiln_dtype)t)), "op %s: no tolerance for %s", name,
                          kiln_dtype_name((kiln_dtype)t));
    }
}

Test(contracts, exact_ops_have_zero_tolerance)
{
    static const char *exact[] = {"reshape", "view", "transpose", "concat", "argmax"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) {
        contract c;
        char err[512];
        cr_assert(contract_load(exact[i], &c, err, sizeof err), "%s", err);
        for (int t = 0; t < KILN_DTYPE_COUNT; t++)
            cr_assert(isnan(c.tol[t]) || c.tol[t] == 0.0, "%s: %s tolerance %g, must be exact", exact[i],
                      kiln_dtype_name((kiln_dtype)t), c.tol[t]);
    }
    const struct { const char *op; kiln_dtype t; } z[] = {{"kv_scatter", KILN_DTYPE_F32}, {"get_rows", KILN_DTYPE_F32},
                                                          {"cast", KILN_DTYPE_F32}, {"cast", KILN_DTYPE_I32}};
    for (size_t i = 0; i < sizeof z / sizeof *z; i++) {
        contract c;
        char err[512];
        cr_assert(contract_load(z[i].op, &c, err, sizeof err), "%s", err);
        cr_assert(contract_tol(&c, z[i].t) == 0.0, "%s %s must be exact", z[i].op, kiln_dtype_name(z[i].t));
    }
}

Test(contracts, float_tolerances_are_tight)
{
    /* f32 results within 1e-8 NMSE; f16/bf16 within their rounding bounds (2^-21, 2^-15). Matmul
     * with block weights: 1e-4, the int8 rounding of x that fast kernels use (see matmul.yaml);
     * kv_scatter into a q8_0 pool: 5e-4, ggml's rounding bound for any data (kv_scatter.yaml). */
    for (int op = KILN_OP_MATMUL; op < KILN_OP_COUNT; op++) {
        contract c;
        char err[512];
        cr_assert(contract_load(kiln_op_name((enum kiln_op)op), &c, err, sizeof err), "%s", err);
        const double q = op == KILN_OP_MATMUL || op == KILN_OP_MOE_MATMUL ? 1e-4 : op == KILN_OP_KV_SCATTER ? 5e-4 : 1e-8;
        const double lim[KILN_DTYPE_COUNT] = {1e-8, 0x1p-21, 0x1p-15, 0, q, q, q, q, q, q, q, q,
                                              q,    q,       q,       q, q, q, q, q, q, q, q};
        for (int t = 0; t < KILN_DTYPE_COUNT; t++)
            cr_assert(isnan(c.tol[t]) || c.tol[t] <= lim[t], "%s: %s tolerance %g is looser than %g", c.op,
                      kiln_dtype_name((kiln_dtype)t), c.tol[t], lim[t]);
    }
}

/* ---------------------------------------------------------------- builder probe */

static kiln_node in(kiln_graph *g, const char *n, kiln_dtype t, int rank, const kiln_dim *d)
{
    return kiln_input(g, n, t, rank, d);
}

/* Builds op with its key operand of dtype t; true when the builder accepts it. */
static bool accepts(enum kiln_op op, kiln_dtype t)
{
    kiln_graph *g;
    cr_assert(kiln_graph_new(&g) == KILN_OK);
    const kiln_dim d2[] = {2, 256}, d1[] = {256}, d3[] = {1, 2, 256}, c3[] = {2, 8, 256}, w2[] = {4, 256};
    kiln_node x = kiln_weight_random(g, "x", t, 2, d2, 1, 1.0f), y = KILN_NODE_NONE;
    kiln_node f = in(g, "f", KILN_DTYPE_F32, 2, d2), p1 = in(g, "p1", KILN_DTYPE_I32, 1, (kiln_dim[]){1});
    kiln_node p2 = in(g, "p2", KILN_DTYPE_I32, 1, (kiln_dim[]){2});
    switch (op) {
    case KILN_OP_MATMUL: y = kiln_matmul(g, f, kiln_weight_random(g, "w", t, 2, w2, 2, 1.0f)); break;
    case KILN_OP_ADD: y = kiln_add(g, x, kiln_weight_random(g, "b", t, 1, d1, 3, 1.0f)); break;
    case KILN_OP_MUL: y = kiln_mul(g, x, kiln_weight_random(g, "b", t, 1, d1, 3, 1.0f)); break;
    case KILN_OP_SCALE: y = kiln_scale(g, x, 0.5f); break;
    case KILN_OP_SILU: y = kiln_silu(g, x); break;
    case KILN_OP_GELU: y = kiln_gelu(g, x); break;
    case KILN_OP_SIGMOID: y = kiln_sigmoid(g, x); break;
    case KILN_OP_TANH: y = kiln_tanh(g, x); break;
    case KILN_OP_SWIGLU: y = kiln_swiglu(g, x, kiln_weight_random(g, "u", t, 2, d2, 4, 1.0f)); break;
    case KILN_OP_RMS_NORM: y = kiln_rms_norm(g, x, KILN_NODE_NONE, 1e-5f); break;
    case KILN_OP_LAYER_NORM: y = kiln_layer_norm(g, x, KILN_NODE_NONE, KILN_NODE_NONE, 1e-5f); break;
    case KILN_OP_SOFTMAX: y = kiln_softmax(g, x); break;
    case KILN_OP_ROPE: y = kiln_rope(g, kiln_weight_random(g, "r", t, 3, d3, 5, 1.0f), p1, KILN_ROPE_NORMAL, 1e4f); break;
    case KILN_OP_ATTENTION:
        y = kiln_attention(g, in(g, "q", KILN_DTYPE_F32, 3, d3), kiln_state(g, "k", t, 3, c3), kiln_state(g, "v", t, 3, c3), 4, 0);
        break;
    case KILN_OP_PAGED_ATTENTION:
        y = kiln_paged_attention(g, in(g, "q", KILN_DTYPE_F32, 3, d3), kiln_state(g, "k", t, 3, c3), kiln_state(g, "v", t, 3, c3), p1,
                                 in(g, "seqs", KILN_DTYPE_I32, 2, (kiln_dim[]){1, 2}), in(g, "bt", KILN_DTYPE_I32, 2, (kiln_dim[]){1, 2}), 4, 0);
        break;
    case KILN_OP_KV_SCATTER:
        y = kiln_kv_scatter(g, kiln_state(g, "k", t, 3, c3), in(g, "rows", KILN_DTYPE_F32, 3, (kiln_dim[]){1, 2, 256}), p1);
        break;
    case KILN_OP_GET_ROWS: y = kiln_get_rows(g, kiln_weight_random(g, "tab", t, 2, w2, 6, 1.0f), p2); break;
    case KILN_OP_ARGMAX: y = kiln_argmax(g, x); break;
    case KILN_OP_MOE_ROUTE: y = kiln_moe_route(g, x, 2, true); break;
    case KILN_OP_SCALE_ROWS: y = kiln_scale_rows(g, x, f, 1); break;
    case KILN_OP_MOE_MATMUL:
        y = kiln_moe_matmul(g, f, kiln_weight_random(g, "w", t, 3, (kiln_dim[]){3, 4, 256}, 2, 1.0f),
                            in(g, "r", KILN_DTYPE_F32, 2, (kiln_dim[]){2, 3}), 2, false);
        break;
    case KILN_OP_CAST: y = kiln_cast(g, f, t); break;
    case KILN_OP_RESHAPE: y = kiln_reshape(g, x, 1, (kiln_dim[]){512}); break;
    case KILN_OP_VIEW: y = kiln_view(g, x, 1, d1, 0); break;
    case KILN_OP_TRANSPOSE: y = kiln_transpose(g, x, 0, 1); break;
    case KILN_OP_ALL_REDUCE: y = kiln_all_reduce(g, x); break;
    case KILN_OP_ALL_GATHER: y = kiln_all_gather(g, x); break;
    case KILN_OP_CONCAT: y = kiln_concat(g, x, kiln_weight_random(g, "x2", t, 2, d2, 7, 1.0f), 0); break;
    default: break;
    }
    bool ok = y != KILN_NODE_NONE && kiln_graph_status(g) == KILN_OK;
    kiln_graph_free(g);
    return ok;
}

Test(contracts, every_dtype_the_builder_accepts_has_a_tolerance)
{
    for (int op = KILN_OP_MATMUL; op < KILN_OP_COUNT; op++) {
        const char *name = kiln_op_name((enum kiln_op)op);
        contract c;
        char err[512];
        int n_ok = 0;
        cr_assert(contract_load(name, &c, err, sizeof err), "op %s: %s", name, err);
        for (int t = 0; t < KILN_DTYPE_COUNT; t++) {
            if (!accepts((enum kiln_op)op, (kiln_dtype)t))
                continue;
            n_ok++;
            cr_assert(!isnan(contract_tol(&c, (kiln_dtype)t)), "op %s: the builder accepts %s but the contract has no tolerance",
                      name, kiln_dtype_name((kiln_dtype)t));
        }
        cr_assert(n_ok > 0, "op %s: the probe built it with no dtype at all", name);
    }
}

/* ---------------------------------------------------------------- loader errors */

static char g_dir[256]; /* temporary source root with a contracts/ folder */

static void write_contract(const char *op, const char *text)
{
    char path[400];
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln_contracts_%d", (int)getpid());
    snprintf(path, sizeof path, "%s/contracts", g_dir);
    mkdir(g_dir, 0700);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/contracts/%s.yaml", g_dir, op);
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    setenv("KILN_SOURCE_DIR", g_dir, 1);
}

/* Removes the temporary contracts folder. */
static void cleanup(void)
{
    char path[700];
    snprintf(path, sizeof path, "%s/contracts", g_dir);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) {
        char f[1000];
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        if (e->d_name[0] != '.')
            unlink(f);
    }
    if (d)
        closedir(d);
    rmdir(path);
    rmdir(g_dir);
}

static void expect_fail(const char *op, const char *text, const char *needle)
{
    contract c;
    char err[512] = "";
    write_contract(op, text);
    cr_assert_not(contract_load(op, &c, err, sizeof err), "%s: malformed contract loaded", op);
    cr_assert(strstr(err, needle), "%s: error '%s' does not mention '%s'", op, err, needle);
    cr_assert(strstr(err, op), "%s: error '%s' does not name the file", op, err);
}

Test(contracts, loader_reports_missing_file)
{
    contract c;
    char err[512] = "";
    cr_assert_not(contract_load("no_such_op", &c, err, sizeof err));
    cr_assert(strstr(err, "no_such_op.yaml") && strstr(err, "cannot open"), "message: %s", err);
}

Test(contracts, loader_rejects_malformed_files)
{
    expect_fail("bad_syntax", "op: bad_syntax\ntolerance: {f32: [1e-9\n", "YAML error");
    expect_fail("wrong_op", "op: other\ntolerance: {f32: 1e-9}\n", "expected 'wrong_op'");
    expect_fail("no_tol", "op: no_tol\nsummary: x\n", "tolerance");
    expect_fail("neg_tol", "op: neg_tol\ntolerance: {f32: -1e-9}\n", "not a number >= 0");
    expect_fail("text_tol", "op: text_tol\ntolerance: {f32: small}\n", "not a number >= 0");
    expect_fail("bad_key", "op: bad_key\ntolerance: {f64: 1e-9}\n", "not a dtype");
    expect_fail("not_map", "- op\n- x\n", "not a map");
    cleanup();
}

Test(contracts, loader_reads_values_and_reports_absent_dtypes)
{
    contract c;
    char err[512] = "";
    write_contract("good", "op: good\nsummary: s\nflops: \"2 * n\"\nbytes: \"8 * n\"\n"
                           "inputs:\n  - {name: x, rank: 2, dtypes: [f32, q4_k]}\n"
                           "tolerance: {f32: 1.5e-10, bf16: exact}\nedge_cases: [a, b]\n");
    cr_assert(contract_load("good", &c, err, sizeof err), "%s", err);
    cr_assert_eq(contract_tol(&c, KILN_DTYPE_F32), 1.5e-10);
    cr_assert_eq(contract_tol(&c, KILN_DTYPE_BF16), 0.0);
    cr_assert(isnan(contract_tol(&c, KILN_DTYPE_F16)));
    cr_assert(isnan(contract_tol(&c, (kiln_dtype)99)));
    cr_assert_str_eq(c.flops, "2 * n");
    cr_assert_eq(c.n_inputs, 1);
    cr_assert_eq(c.inputs[0].dtypes, (1u << KILN_DTYPE_F32) | (1u << KILN_DTYPE_Q4_K));
    cr_assert_eq(c.n_edges, 2);
    cr_assert_str_eq(c.edges[1], "b");
    cleanup();
}
