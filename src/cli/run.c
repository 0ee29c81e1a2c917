/* `kiln run FILE.kg`: loads a graph, binds symbols (--set, else their maximum), fills inputs with
 * reproducible random data chosen so runtime checks pass (ids in range, positions consistent
 * with attention), runs once, and prints every output's dtype, shape and f64 checksums. Reads
 * the graph IR to list inputs, symbols and outputs; must not modify the graph. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "graph/graph.h"
#include "model/presets.h"

#define MAX_SETS 32 /* most --set flags */

typedef struct run_opts {
    const char *file;             /* the .kg path */
    const char *backend;          /* --backend or NULL (auto) */
    const char *devices;          /* --devices: a tensor-parallel split, or NULL */
    const char *set_name[MAX_SETS]; /* --set names (point into argv) */
    size_t      set_len[MAX_SETS];  /* length of each name */
    int64_t     set_val[MAX_SETS];  /* --set values */
    int         n_sets;           /* --set flags given */
    uint64_t    seed;             /* --seed */
    int         threads;          /* --threads; 0 = one per core */
    bool        no_fuse;          /* --no-fuse */
    bool        check_finite;     /* --check-finite */
    bool        json;             /* --json */
} run_opts;

/* Everything allocated for one run, freed by run_free. */
typedef struct run_state {
    kiln_ctx     *ctx;      /* context */
    kiln_graph   *g;        /* the loaded graph */
    kiln_plan    *plan;     /* compiled plan */
    int64_t      *sym_vals; /* value of each symbol */
    kiln_binding *binds;    /* symbol and input bindings */
    size_t        n_binds;  /* bindings in use */
    void        **bufs;     /* input buffers, one per binding (NULL for symbols) */
} run_state;

static int parse_set(run_opts *o, const char *v)
{
    const char *eq = strchr(v, '=');
    if (!eq || eq == v) {
        fprintf(stderr, "kiln run: --set wants SYM=N, got '%s'\n", v);
        return KILN_CLI_USAGE;
    }
    if (o->n_sets == MAX_SETS) {
        fprintf(stderr, "kiln run: at most %d --set flags\n", MAX_SETS);
        return KILN_CLI_USAGE;
    }
    if (!kiln_cli_parse_i64("run", "--set", eq + 1, 0, INT64_MAX / 2, &o->set_val[o->n_sets]))
        return KILN_CLI_USAGE;
    o->set_name[o->n_sets] = v;
    o->set_len[o->n_sets++] = (size_t)(eq - v);
    return KILN_CLI_OK;
}

static int parse_args(int argc, char *const *argv, run_opts *o)
{
    kiln_cli_args a = {.argc = argc, .argv = argv, .i = 1, .cmd = "run"};
    int64_t seed = 1, threads = 0;
    while (a.i < argc) {
        const char *v = NULL;
        int r;
        if ((r = kiln_cli_flag_value(&a, "--backend", &v)) != 0) {
            o->backend = v;
        } else if ((r = kiln_cli_flag_value(&a, "--devices", &v)) != 0) {
            o->devices = v;
        } else if ((r = kiln_cli_flag_value(&a, "--set", &v)) != 0) {
            if (r > 0 && parse_set(o, v) != KILN_CLI_OK)
                return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--seed", &v)) != 0) {
            if (r > 0 && !kiln_cli_parse_i64("run", "--seed", v, 0, INT64_MAX, &seed))
                return KILN_CLI_USAGE;
        } else if ((r = kiln_cli_flag_value(&a, "--threads", &v)) != 0) {
            if (r > 0 && !kiln_cli_parse_i64("run", "--threads", v, 1, 256, &threads))
                return KILN_CLI_USAGE;
        } else if (strcmp(argv[a.i], "--json") == 0 || strcmp(argv[a.i], "--no-fuse") == 0 ||
                   strcmp(argv[a.i], "--check-finite") == 0) {
            *(argv[a.i][2] == 'j' ? &o->json : argv[a.i][2] == 'c' ? &o->check_finite : &o->no_fuse) = true;
            a.i++;
        } else if (argv[a.i][0] == '-' && argv[a.i][1] != '\0') {
            return kiln_cli_unknown_flag("run", argv[a.i]);
        } else if (!o->file) {
            o->file = argv[a.i++];
        } else {
            fprintf(stderr, "kiln run: one FILE.kg expected, got a second: '%s'\n", argv[a.i]);
            return KILN_CLI_USAGE;
        }
        if (r < 0)
            return KILN_CLI_USAGE;
    }
    o->seed = (uint64_t)seed;
    o->threads = (int)threads;
    if (!o->file) {
        fprintf(stderr, "kiln run: missing FILE.kg (see kiln run --help)\n");
        return KILN_CLI_USAGE;
    }
    return KILN_CLI_OK;
}

/* Symbol values: --set, else the symbol's maximum. Unknown names are usage errors. */
static int bind_symbols(const run_opts *o, run_state *st)
{
    const kiln_graph *g = st->g;
    for (int s = 0; s < o->n_sets; s++) {
        bool found = false;
        for (uint32_t i = 0; i < g->n_syms; i++)
            found |= strlen(g->syms[i].name) == o->set_len[s] &&
                     strncmp(g->syms[i].name, o->set_name[s], o->set_len[s]) == 0;
        if (!found) {
            fprintf(stderr, "kiln run: --set: the graph has no symbol '%.*s'\n", (int)o->set_len[s],
                    o->set_name[s]);
            return KILN_CLI_USAGE;
        }
    }
    for (uint32_t i = 0; i < g->n_syms; i++) {
        st->sym_vals[i] = g->syms[i].max;
        for (int s = 0; s < o->n_sets; s++)
            if (strlen(g->syms[i].name) == o->set_len[s] &&
                strncmp(g->syms[i].name, o->set_name[s], o->set_len[s]) == 0)
                st->sym_vals[i] = o->set_val[s];
        if (st->sym_vals[i] > g->syms[i].max) { /* caught here so inputs are never sized by it */
            fprintf(stderr, "kiln run: --set: %s: symbol '%s' = %lld is over its maximum %lld\n",
                    kiln_status_str(KILN_ERR_SYMBOL), g->syms[i].name, (long long)st->sym_vals[i],
                    (long long)g->syms[i].max);
            return KILN_CLI_FAIL;
        }
        st->binds[st->n_binds++] = (kiln_binding){.name = g->syms[i].name, .value = st->sym_vals[i]};
    }
    return KILN_CLI_OK;
}

static int64_t resolve(const kiln_graph *g, const int64_t *vals, int64_t d)
{
    return kiln_dim_is_sym(d) ? (kiln_sym_index(d) < g->n_syms ? vals[kiln_sym_index(d)] : 0) : d;
}

/* Fills an i32 input (node idx, n values) according to its consumers (see usage text). */
static void fill_i32(const run_state *st, uint32_t idx, int32_t *v, int64_t n, uint64_t *rng)
{
    const kiln_graph *g = st->g;
    int64_t rows = 0, n_kv = -1;
    bool is_pos = false;
    for (uint32_t j = idx + 1; j < g->n_nodes; j++) {
        const kiln_node_rec *r = &g->nodes[j];
        if (r->op == KILN_OP_ATTENTION && n_kv < 0)
            n_kv = resolve(g, st->sym_vals, r->dim);
        if (r->op == KILN_OP_GET_ROWS && r->src[1] == idx && r->src[0] < g->n_nodes)
            rows = resolve(g, st->sym_vals, g->nodes[r->src[0]].dims[0]);
        if ((r->op == KILN_OP_KV_SCATTER && r->src[2] == idx) || (r->op == KILN_OP_ROPE && r->src[1] == idx))
            is_pos = true;
    }
    int64_t start = is_pos && n_kv >= n ? n_kv - n : 0;
    for (int64_t t = 0; t < n; t++) {
        if (rows > 0)
            v[t] = (int32_t)(kiln_preset_rng(rng) % (uint64_t)rows);
        else if (is_pos)
            v[t] = (int32_t)(start + t);
        else
            v[t] = (int32_t)(kiln_preset_rng(rng) % 100u);
    }
}

/* Allocates and fills the buffer of input node idx and adds its binding. */
static kiln_status bind_input(run_state *st, uint32_t idx, uint64_t *rng)
{
    const kiln_node_rec *r = &st->g->nodes[idx];
    int64_t n = 1, last = 1;
    for (int d = 0; d < r->rank; d++) {
        last = resolve(st->g, st->sym_vals, r->dims[d]);
        n *= last;
    }
    size_t bytes = r->rank ? kiln_row_bytes((kiln_dtype)r->dtype, last) * (size_t)(n / (last ? last : 1))
                           : kiln_row_bytes((kiln_dtype)r->dtype, 1);
    void *buf = malloc(bytes ? bytes : 1);
    float *tmp = r->dtype == KILN_DTYPE_I32 ? NULL : malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!buf || (r->dtype != KILN_DTYPE_I32 && !tmp)) {
        free(buf);
        free(tmp);
        return KILN_ERR_NOMEM;
    }
    kiln_status s = KILN_OK;
    if (r->dtype == KILN_DTYPE_I32) {
        fill_i32(st, idx, buf, n, rng);
    } else {
        for (int64_t i = 0; i < n; i++)
            tmp[i] = kiln_preset_rngf(rng);
        s = kiln_quantize((kiln_dtype)r->dtype, tmp, buf, n);
    }
    free(tmp);
    st->bufs[st->n_binds] = buf;
    st->binds[st->n_binds++] = (kiln_binding){.name = r->name, .data = buf, .bytes = bytes};
    return s;
}

/* The bound buffer of input node idx, or NULL (another kind of node). */
static int32_t *input_buf(const run_state *st, uint32_t idx)
{
    const kiln_node_rec *r = &st->g->nodes[idx];
    for (size_t k = 0; r->op == KILN_OP_INPUT && r->dtype == KILN_DTYPE_I32 && k < st->n_binds; k++)
        if (st->binds[k].name && !strcmp(st->binds[k].name, r->name)) return st->bufs[k];
    return NULL;
}

/* A paged attention's step that kiln_run accepts: n_tok tokens split over n_seq sequences, each
 * prefilling from an empty cache into blocks of its own (taken in order around the pool); with
 * parents (a tree step), each sequence's tokens a binary tree of drafts (token j's parent (j-1)/2,
 * its position its depth; slots stay in row order). */
static kiln_status fill_paged(const run_state *st, uint32_t i)
{
    const kiln_graph *g = st->g;
    const kiln_node_rec *n = &g->nodes[i];
    int32_t *pos = input_buf(st, n->src[3]), *seqs = input_buf(st, n->src[4]), *bt = input_buf(st, n->src[5]), *slots[2];
    int32_t *par = n->n_src > 6 && n->src[6] != KILN_IDX_NONE ? input_buf(st, n->src[6]) : NULL;
    for (int k = 0; k < 2; k++) {
        const kiln_node_rec *w = &g->nodes[n->src[1 + k]];
        slots[k] = w->op == KILN_OP_KV_SCATTER ? input_buf(st, w->src[2]) : NULL;
    }
    if (!pos || !seqs || !bt) return KILN_OK; /* computed metadata: nothing to make up */
    int64_t n_tok = resolve(g, st->sym_vals, g->nodes[n->src[0]].dims[0]), n_seq = resolve(g, st->sym_vals, g->nodes[n->src[4]].dims[0]);
    int64_t mb = g->nodes[n->src[5]].dims[1], block = n->i[0], n_blocks = g->nodes[n->src[1]].dims[1] / block, next = 0;
    if (n_tok < n_seq || (n_tok / n_seq + 1) > mb * block) {
        fprintf(stderr, "kiln run: %s: %lld tokens over %lld sequences do not fit (each needs 1 to %lld): --set them\n",
                n->name ? n->name : "paged_attention", (long long)n_tok, (long long)n_seq, (long long)(mb * block));
        return KILN_ERR_SYMBOL;
    }
    for (int64_t s = 0, t = 0; s < n_seq; s++) {
        int64_t q = n_tok / n_seq + (s < n_tok % n_seq);
        seqs[2 * s] = (int32_t)t, seqs[2 * s + 1] = (int32_t)q;
        for (int64_t b = 0; b < mb; b++) bt[s * mb + b] = (int32_t)((next + b) % n_blocks);
        next += (q + block - 1) / block;
        for (int64_t j = 0; j < q; j++, t++) {
            pos[t] = (int32_t)j;
            if (par) {
                par[t] = j ? (int32_t)((j - 1) / 2) : -1;
                pos[t] = j ? pos[t - j + par[t]] + 1 : 0;
            }
            for (int k = 0; k < 2; k++)
                if (slots[k]) slots[k][t] = (int32_t)(bt[s * mb + j / block] * block + j % block);
        }
    }
    return KILN_OK;
}

/* Sum and sum of |x| of an output in f64; values converted with kiln_dequantize. */
static kiln_status checksum(const kiln_plan *p, const char *name, kiln_tensor_info *ti, double *sum, double *asum)
{
    kiln_status s = kiln_plan_tensor(p, name, ti);
    if (s != KILN_OK)
        return s;
    int64_t n = 1;
    for (int d = 0; d < ti->rank; d++)
        n *= ti->dims[d];
    void *raw = malloc(ti->bytes ? ti->bytes : 1);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    s = raw && f ? kiln_plan_read(p, name, raw, ti->bytes) : KILN_ERR_NOMEM;
    if (s == KILN_OK && ti->t != KILN_DTYPE_I32)
        s = kiln_dequantize(ti->t, raw, f, n);
    *sum = *asum = 0;
    for (int64_t i = 0; s == KILN_OK && i < n; i++) {
        double v = ti->t == KILN_DTYPE_I32 ? (double)((const int32_t *)raw)[i] : (double)f[i];
        *sum += v;
        *asum += fabs(v);
    }
    free(raw);
    free(f);
    return s;
}

static void print_num(double v)
{
    if (isfinite(v))
        printf("%.17g", v);
    else
        printf("null");
}

static void print_shape(const kiln_tensor_info *ti, bool json)
{
    printf(json ? "[" : "[");
    for (int d = 0; d < ti->rank; d++)
        printf("%s%lld", d ? (json ? "," : ", ") : "", (long long)ti->dims[d]);
    printf("]");
}

/* Prints the header (text) or opening (json), then one line/object per output. */
static int report(const run_opts *o, const run_state *st)
{
    const kiln_graph *g = st->g;
    if (o->json) {
        printf("{\"file\":");
        kiln_cli_json_str(stdout, o->file);
        printf(",\"backend\":");
        kiln_cli_json_str(stdout, kiln_plan_backend(st->plan));
        printf(",\"kernels\":%d,\"cache\":\"%s\",\"symbols\":{", kiln_plan_kernel_count(st->plan), kiln_plan_cache(st->plan));
        for (uint32_t i = 0; i < g->n_syms; i++) {
            printf("%s", i ? "," : "");
            kiln_cli_json_str(stdout, g->syms[i].name);
            printf(":%lld", (long long)st->sym_vals[i]);
        }
        printf("},\"outputs\":[");
    } else {
        printf("backend %s, %d kernels, cache %s\n", kiln_plan_backend(st->plan), kiln_plan_kernel_count(st->plan),
               kiln_plan_cache(st->plan));
    }
    for (uint32_t i = 0; i < g->n_outs; i++) {
        kiln_tensor_info ti;
        double sum, asum;
        kiln_status s = checksum(st->plan, g->outs[i].name, &ti, &sum, &asum);
        if (s != KILN_OK) {
            if (o->json)
                printf("]}\n");
            return kiln_cli_fail("run", st->ctx, s, "reading an output");
        }
        if (o->json) {
            printf("%s{\"name\":", i ? "," : "");
            kiln_cli_json_str(stdout, g->outs[i].name);
            printf(",\"dtype\":\"%s\",\"shape\":", kiln_dtype_name(ti.t));
            print_shape(&ti, true);
            printf(",\"sum\":");
            print_num(sum);
            printf(",\"abs_sum\":");
            print_num(asum);
            printf("}");
        } else {
            printf("%-12s %-5s ", g->outs[i].name, kiln_dtype_name(ti.t));
            print_shape(&ti, false);
            printf("  sum %.9g  abs_sum %.9g\n", sum, asum);
        }
    }
    if (o->json)
        printf("]}\n");
    return KILN_CLI_OK;
}

static void run_free(run_state *st)
{
    for (size_t i = 0; st->bufs && i < st->n_binds; i++)
        free(st->bufs[i]);
    free(st->bufs);
    free(st->binds);
    free(st->sym_vals);
    kiln_plan_free(st->plan);
    kiln_graph_free(st->g);
    kiln_ctx_free(st->ctx);
}

/* Loads, binds, compiles and runs; returns an exit code. */
static int run_file(const run_opts *o, run_state *st)
{
    kiln_ctx_options co = {.quiet = kiln_cli_quiet, .n_threads = o->threads};
    kiln_status s = kiln_ctx_new(&co, &st->ctx);
    if (s != KILN_OK)
        return kiln_cli_fail("run", st->ctx, s, "creating the context");
    if ((s = kiln_kg_load(st->ctx, o->file, &st->g)) != KILN_OK)
        return kiln_cli_fail("run", st->ctx, s, o->file);
    size_t cap = (size_t)st->g->n_syms + st->g->n_nodes + 1;
    st->sym_vals = calloc(st->g->n_syms + 1u, sizeof *st->sym_vals);
    st->binds = calloc(cap, sizeof *st->binds);
    st->bufs = calloc(cap, sizeof *st->bufs);
    if (!st->sym_vals || !st->binds || !st->bufs)
        return kiln_cli_fail("run", NULL, KILN_ERR_NOMEM, "allocating bindings");
    int rc = bind_symbols(o, st);
    if (rc != KILN_CLI_OK)
        return rc;
    uint64_t rng = o->seed;
    for (uint32_t i = 0; i < st->g->n_nodes; i++)
        if (st->g->nodes[i].op == KILN_OP_INPUT && (s = bind_input(st, i, &rng)) != KILN_OK)
            return kiln_cli_fail("run", NULL, s, "filling inputs");
    for (uint32_t i = 0; i < st->g->n_nodes; i++)
        if (st->g->nodes[i].op == KILN_OP_PAGED_ATTENTION && (s = fill_paged(st, i)) != KILN_OK)
            return kiln_cli_fail("run", NULL, s, "filling a paged attention's step");
    kiln_compile_options copt = {.backend = o->backend, .no_fuse = o->no_fuse, .check_finite = o->check_finite,
                                 .devices = o->devices};
    if ((s = kiln_compile(st->ctx, st->g, &copt, &st->plan)) != KILN_OK)
        return kiln_cli_fail("run", st->ctx, s, "compiling");
    if ((s = kiln_run(st->plan, st->binds, st->n_binds)) != KILN_OK)
        return kiln_cli_fail("run", st->ctx, s, "running");
    return report(o, st);
}

int kiln_cli_run(int argc, char *const *argv)
{
    if (kiln_cli_wants_help(argc, argv, "run"))
        return KILN_CLI_OK;
    run_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc != KILN_CLI_OK)
        return rc;
    run_state st = {0};
    rc = run_file(&o, &st);
    run_free(&st);
    return rc;
}
