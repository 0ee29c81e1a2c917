/* kiln_check: the run state, the case runner (compile per backend, poisoned and guarded outputs,
 * compare every output with kiln_ref64 by NMSE, NaN/Inf rules, fused vs unfused, determinism)
 * and the report (table rows, JSON). Generators live in cases.c and patterns.c. Must never abort
 * on a failing backend: every failure becomes a result row with its detail. */
#include "check/check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check/contract.h"
#include "check/ref64.h"
#include "codegen/wfmt.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "sched/ctx.h"

#define GUARD 64         /* guard bytes each side of every output buffer */
#define GUARD_BYTE 0xA5  /* guard fill */
#define POISON_BYTE 0xFF /* output fill before a run: NaN in f32/f16/bf16, -1 in i32 */
#define MAX_BE 8         /* backends a run tests at most */

struct kiln_check_run {
    kiln_ctx          *ctx;            /* context (backends) */
    kiln_check_options opt;            /* options as given */
    uint64_t           rng[4];         /* xoshiro256** state */
    const char        *be[MAX_BE];     /* backends under test */
    int                n_be;           /* count */
    kiln_check_result *res;            /* results so far */
    int                n_res, cap_res; /* count, allocated */
    kiln_status        status;         /* a setup error (missing contract, OOM) that stops the run */
    int                n_emitted;      /* rows handed to opt.on_result so far */
    char               group_op[48];   /* op and key of the last case: a new pair means the rows */
    kiln_dtype         group_key;      /* before it are complete (cases of one pair are contiguous) */
    bool               group_capped;   /* quick: the capped backend ran this group's one case */
    int                quick_left;     /* quick: cases left out on vulkan (quick_skips), for the report's note */
};

/* ---------------------------------------------------------------- random */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t kiln_check_rand(kiln_check_run *r)
{
    uint64_t *s = r->rng, x = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s[3] << 45 | s[3] >> 19;
    return x;
}

double kiln_check_uniform(kiln_check_run *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(kiln_check_rand(r) >> 11) * 0x1.0p-53);
}

int64_t kiln_check_randint(kiln_check_run *r, int64_t lo, int64_t hi)
{
    return hi <= lo ? lo : lo + (int64_t)(kiln_check_rand(r) % (uint64_t)(hi - lo));
}

bool kiln_check_quick(const kiln_check_run *r) { return r->opt.quick; }

bool kiln_check_wants(const kiln_check_run *r, const char *op)
{
    if (r->status != KILN_OK) return false;
    const char *f = r->opt.op;
    if (!f || !*f) return true;
    size_t n = strlen(f);
    /* "fused" selects "fused:*", "unfused:*" and "fused-vs-unfused:*" come with it. */
    return strcmp(f, op) == 0 || (strncmp(op, f, n) == 0 && op[n] == ':');
}

/* ---------------------------------------------------------------- results */

static kiln_check_result *row(kiln_check_run *r, const char *op, kiln_dtype key, const char *be, double tol)
{
    for (int i = r->n_res - 1; i >= 0; i--) {
        kiln_check_result *x = &r->res[i];
        if (!strcmp(x->op, op) && !strcmp(x->dtype, kiln_dtype_name(key)) && !strcmp(x->backend, be)) return x;
    }
    if (r->n_res == r->cap_res) {
        int cap = r->cap_res ? 2 * r->cap_res : 64;
        kiln_check_result *n = realloc(r->res, (size_t)cap * sizeof *n);
        if (!n) {
            r->status = KILN_ERR_NOMEM;
            return NULL;
        }
        r->res = n;
        r->cap_res = cap;
    }
    kiln_check_result *x = &r->res[r->n_res++];
    memset(x, 0, sizeof *x);
    snprintf(x->op, sizeof x->op, "%s", op);
    snprintf(x->dtype, sizeof x->dtype, "%s", kiln_dtype_name(key));
    snprintf(x->backend, sizeof x->backend, "%s", be);
    x->tolerance = tol;
    x->ok = true;
    return x;
}

/* Records one case: nmse (INFINITY for a hard failure) and why it failed. The detail is that of the
 * worst failing case, so a worst NMSE of inf always comes with its reason (a NaN, a status, a
 * guard), never with the text of an earlier, milder failure (issue #17). */
static void record(kiln_check_run *r, const char *op, kiln_dtype key, const char *be, double tol, double nmse,
                   const char *why)
{
    kiln_check_result *x = row(r, op, key, be, tol);
    if (!x) return;
    x->cases++;
    bool worst = !(nmse <= x->worst_nmse); /* NaN-safe: NaN never stays below */
    if (worst) x->worst_nmse = nmse;
    if (why && *why) {
        if (x->ok || worst) snprintf(x->detail, sizeof x->detail, "%s (seed %llu)", why, (unsigned long long)r->opt.seed);
        x->ok = false;
    } else if (worst && !(nmse < INFINITY)) { /* cannot happen by construction; say so if it ever does */
        snprintf(x->detail, sizeof x->detail, "NMSE %g with no failure recorded (seed %llu)", nmse, (unsigned long long)r->opt.seed);
        x->ok = false;
    }
}

void kiln_check_fail_all(kiln_check_run *r, const char *op, kiln_dtype key, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    for (int b = 0; b < r->n_be; b++) record(r, op, key, r->be[b], 0, INFINITY, why);
}

/* ---------------------------------------------------------------- data */

/* Converts n f32 values into a new buffer of dtype t (i32: round to nearest even). */
static void *to_dtype(kiln_dtype t, const float *src, int64_t n, size_t *bytes)
{
    size_t nb = t == KILN_DTYPE_I32 ? (size_t)n * 4 : kiln_row_bytes(t, n);
    void *dst = malloc(nb ? nb : 1);
    if (!dst) return NULL;
    if (t == KILN_DTYPE_I32)
        for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i] = (int32_t)nearbyintf(src[i]);
    else if (n && kiln_quantize(t, src, dst, n) != KILN_OK) {
        free(dst);
        return NULL;
    }
    *bytes = nb;
    return dst;
}

static bool to_f64(kiln_dtype t, const void *src, int64_t n, double *dst)
{
    if (t == KILN_DTYPE_I32) {
        for (int64_t i = 0; i < n; i++) dst[i] = ((const int32_t *)src)[i];
        return true;
    }
    float *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    bool ok = tmp && (n == 0 || kiln_dequantize(t, src, tmp, n) == KILN_OK);
    for (int64_t i = 0; ok && i < n; i++) dst[i] = tmp[i];
    free(tmp);
    return ok;
}

kiln_node kiln_check_weight(kiln_check_run *r, kiln_graph *g, const char *name, kiln_dtype t, int rank,
                            const kiln_dim *dims, float lo, float hi)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i] > 0 ? dims[i] : 1;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return kiln_graph_fail(g, KILN_ERR_NOMEM, "check: out of memory");
    for (int64_t i = 0; i < n; i++) v[i] = (float)kiln_check_uniform(r, lo, hi);
    size_t nb = 0;
    void *d = to_dtype(t, v, n, &nb);
    free(v);
    if (!d) return kiln_graph_fail(g, KILN_ERR_NOMEM, "check: cannot convert weight '%s' to %s", name, kiln_dtype_name(t));
    kiln_node h = kiln_weight(g, name, t, rank, dims, d, KILN_WEIGHT_COPY);
    free(d);
    return h;
}

/* The NMSE denominator's floor for n values of dtype t: n * m^2, m the smallest normal of t (the
 * contracts' definition). f16 rounds values under m = 2^-14 to a fixed step of 2^-24, so a small
 * output of few elements (one product a * b under 6e-5: 3e-4 of one-element f16 mul cases) would
 * have an unbounded NMSE without it; with it a subnormal output is held to the same 2^-22 as a
 * normal one. f32 and bf16 share f32's exponent range, where the floor is negligible. */
static double nmse_floor(kiln_dtype t, int64_t n)
{
    double m = t == KILN_DTYPE_F16 ? 0x1p-14 : 0x1p-126;
    return (double)n * m * m;
}

/* Compares n values of dtype t with the reference: NaN fails, infinities must match in sign, the
 * rest by NMSE. Returns the NMSE (INFINITY on a hard failure, with why filled). */
static double compare(kiln_dtype t, const double *got, const double *ref, int64_t n, char *why, size_t wn)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], x = ref[i];
        if (isnan(g) || isnan(x)) {
            snprintf(why, wn, "NaN at element %lld (got %g, reference %g)", (long long)i, g, x);
            return INFINITY;
        }
        if (isinf(g) || isinf(x)) {
            if (g != x) {
                snprintf(why, wn, "element %lld: got %g, reference %g (infinities must match)", (long long)i, g, x);
                return INFINITY;
            }
            continue;
        }
        num += (g - x) * (g - x);
        den += x * x;
    }
    double fl = nmse_floor(t, n);
    return num / (den > fl ? den : fl > 1e-300 ? fl : 1e-300);
}

/* ---------------------------------------------------------------- bindings */

typedef struct binds {
    kiln_binding b[32];   /* symbols, inputs, outputs */
    int          n;       /* bindings in use */
    void        *own[32]; /* input buffers owned */
    int          n_own;   /* count */
} binds;

static const kiln_check_in *in_spec(const kiln_check_spec *s, const char *name)
{
    for (int i = 0; i < s->n_ins; i++)
        if (!strcmp(s->ins[i].name, name)) return &s->ins[i];
    return NULL;
}

static int64_t sym_val(const kiln_graph *g, const int64_t *vals, const char *name, int64_t dflt)
{
    uint32_t i = kiln_graph_find_sym(g, name);
    return i == KILN_IDX_NONE ? dflt : vals[i];
}

/* Fills the symbol and input bindings of run k with fresh data. false with why on OOM. */
static bool make_inputs(kiln_check_run *r, const kiln_check_spec *s, int k, binds *bd, char *why, size_t wn)
{
    const kiln_graph *g = s->g;
    bd->n = bd->n_own = 0;
    for (uint32_t i = 0; i < g->n_syms && bd->n < 32; i++)
        bd->b[bd->n++] = (kiln_binding){.name = g->syms[i].name, .value = s->syms[k][i]};
    kiln_check_step step = {0}; /* a paged attention's metadata, drawn together */
    bool paged = false;
    for (int i = 0; i < s->n_ins; i++) paged |= s->ins[i].fill == KILN_CHECK_FILL_PAGED;
    if (paged && !kiln_check_paged_step(r, g, s->syms[k], &step))
        return snprintf(why, wn, "no paged attention step fits these sizes (or out of memory)"), false;
    bool ok = true;
    for (uint32_t i = 0; i < g->n_nodes && ok; i++) {
        const kiln_node_rec *nd = &g->nodes[i];
        if (nd->op != KILN_OP_INPUT || bd->n >= 32) continue;
        int64_t dims[KILN_MAX_RANK];
        int64_t n = kiln_node_numel(nd, s->syms[k], dims);
        float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        if (!v) {
            ok = !snprintf(why, wn, "out of memory");
            break;
        }
        const kiln_check_in *is = in_spec(s, nd->name);
        const float *sv = is && is->fill == KILN_CHECK_FILL_PAGED ? kiln_check_step_values(&step, nd->name) : NULL;
        kiln_check_fill f = is ? is->fill : nd->dtype == KILN_DTYPE_I32 ? KILN_CHECK_FILL_INT : KILN_CHECK_FILL_FLOAT;
        double lo = is ? is->lo : nd->dtype == KILN_DTYPE_I32 ? -1000 : s->lo, hi = is ? is->hi : nd->dtype == KILN_DTYPE_I32 ? 1000 : s->hi;
        int64_t last = nd->rank && dims[nd->rank - 1] > 0 ? dims[nd->rank - 1] : 1;
        int64_t n_kv = sym_val(g, s->syms[k], "n_kv", n), n_tok = sym_val(g, s->syms[k], "n_tok", n);
        for (int64_t j = 0; j < n; j++) {
            switch (f) {
            case KILN_CHECK_FILL_INT: v[j] = (float)kiln_check_randint(r, (int64_t)lo, (int64_t)hi); break;
            case KILN_CHECK_FILL_POS_ATTN: v[j] = (float)(n_kv - n_tok + j); break;
            case KILN_CHECK_FILL_POS_DISTINCT: {
                bool dup = true;
                while (dup) { /* n <= bound is the generator's promise */
                    v[j] = (float)kiln_check_randint(r, 0, (int64_t)lo);
                    dup = false;
                    for (int64_t q = 0; q < j; q++) dup |= v[q] == v[j];
                }
                break;
            }
            case KILN_CHECK_FILL_PAGED: v[j] = sv ? sv[j] : 0; break;
            default: v[j] = (float)kiln_check_uniform(r, lo, hi); break;
            }
            if (f == KILN_CHECK_FILL_FLOAT && s->row_anchor && j % last == 0)
                v[j] = (float)kiln_check_uniform(r, 0.5, 2.0);
        }
        size_t nb = 0;
        void *d = to_dtype((kiln_dtype)nd->dtype, v, n, &nb);
        free(v);
        if (!d) {
            ok = !snprintf(why, wn, "out of memory");
            break;
        }
        bd->own[bd->n_own++] = d;
        bd->b[bd->n++] = (kiln_binding){.name = nd->name, .data = d, .bytes = nb};
    }
    kiln_check_step_free(&step);
    return ok;
}

static void free_binds(binds *bd)
{
    for (int i = 0; i < bd->n_own; i++) free(bd->own[i]);
    bd->n_own = 0;
}

/* Sets every state of plan p (and of ref64 when given) to the same random values. */
static bool set_states(kiln_check_run *r, const kiln_check_spec *s, kiln_plan **p, int np, kiln_ref64 *ref,
                       char *why, size_t wn)
{
    const kiln_graph *g = s->g;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *nd = &g->nodes[i];
        if (nd->op != KILN_OP_STATE) continue;
        int64_t dims[KILN_MAX_RANK];
        int64_t n = kiln_node_numel(nd, NULL, dims);
        float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        if (!v) return snprintf(why, wn, "out of memory"), false;
        for (int64_t j = 0; j < n; j++) v[j] = (float)kiln_check_uniform(r, s->state_lo, s->state_hi);
        size_t nb = 0;
        void *d = to_dtype((kiln_dtype)nd->dtype, v, n, &nb);
        free(v);
        if (!d) return snprintf(why, wn, "out of memory"), false;
        bool ok = true;
        for (int k = 0; k < np && ok; k++)
            if (kiln_plan_state_write(p[k], nd->name, d, nb) != KILN_OK)
                ok = !snprintf(why, wn, "state '%s': %s", nd->name, kiln_ctx_error(r->ctx));
        if (ok && ref && kiln_ref64_state_set(ref, nd->name, d, nb, why, wn) != 0) ok = false;
        free(d);
        if (!ok) return false;
    }
    return true;
}

/* Output buffers: guarded, poisoned; bound after the inputs. */
typedef struct outs {
    unsigned char *mem[16];   /* guarded allocations */
    size_t         bytes[16]; /* payload sizes */
    double        *val[16];   /* payload as f64 after the run */
    int64_t        numel[16]; /* elements */
    int            n;         /* outputs */
} outs;

static void free_outs(outs *o)
{
    for (int i = 0; i < o->n; i++) {
        free(o->mem[i]);
        free(o->val[i]);
    }
    o->n = 0;
}

static bool bind_outs(const kiln_graph *g, const int64_t *syms, binds *bd, outs *o, char *why, size_t wn)
{
    o->n = 0;
    for (uint32_t k = 0; k < g->n_outs && k < 16 && bd->n < 32; k++) {
        const kiln_node_rec *nd = &g->nodes[g->outs[k].node];
        int64_t dims[KILN_MAX_RANK];
        o->numel[k] = kiln_node_numel(nd, syms, dims);
        o->bytes[k] = kiln_node_bytes(nd, dims);
        o->mem[k] = malloc(o->bytes[k] + 2 * GUARD);
        o->val[k] = malloc((size_t)(o->numel[k] ? o->numel[k] : 1) * sizeof(double));
        o->n = (int)k + 1;
        if (!o->mem[k] || !o->val[k]) return snprintf(why, wn, "out of memory"), false;
        memset(o->mem[k], GUARD_BYTE, GUARD);
        memset(o->mem[k] + GUARD, POISON_BYTE, o->bytes[k]);
        memset(o->mem[k] + GUARD + o->bytes[k], GUARD_BYTE, GUARD);
        bd->b[bd->n++] = (kiln_binding){.name = g->outs[k].name, .data = o->mem[k] + GUARD, .bytes = o->bytes[k]};
    }
    return true;
}

static kiln_dtype out_dtype(const kiln_graph *g, int k) { return (kiln_dtype)g->nodes[g->outs[k].node].dtype; }

/* Checks guards and converts outputs to f64. */
static bool read_outs(const kiln_graph *g, outs *o, char *why, size_t wn)
{
    for (int k = 0; k < o->n; k++) {
        const char *name = g->outs[k].name;
        for (size_t j = 0; j < GUARD; j++)
            if (o->mem[k][j] != GUARD_BYTE || o->mem[k][GUARD + o->bytes[k] + j] != GUARD_BYTE)
                return snprintf(why, wn, "output '%s': guard byte %s the buffer overwritten", name,
                                o->mem[k][j] != GUARD_BYTE ? "before" : "after"), false;
        if (!to_f64((kiln_dtype)g->nodes[g->outs[k].node].dtype, o->mem[k] + GUARD, o->numel[k], o->val[k]))
            return snprintf(why, wn, "output '%s': cannot read its dtype", name), false;
    }
    return true;
}

/* ---------------------------------------------------------------- the case runner */

static double spec_tol(kiln_check_run *r, const kiln_check_spec *s)
{
    if (s->tol >= 0) return s->tol;
    kiln_contract c;
    char err[512], op[64];
    snprintf(op, sizeof op, "%.*s", (int)strcspn(s->op, ":"), s->op); /* "attention:masks": attention's contract */
    if (!kiln_contract_load(op, &c, err, sizeof err)) {
        r->status = KILN_ERR_IO;
        kiln_check_fail_all(r, s->op, s->key, "contract: %s", err);
        kiln_ctx_set_error(r->ctx, "%s", err);
        return NAN;
    }
    double t = kiln_contract_tol(&c, s->key);
    if (isnan(t)) kiln_check_fail_all(r, s->op, s->key, "contracts/%s.yaml has no tolerance for %s", s->op, kiln_dtype_name(s->key));
    return t;
}

/* One run of plan p at binding k: outputs into o (compared by the caller). */
static bool run_plan(kiln_check_run *r, const kiln_check_spec *s, kiln_plan *p, int k, binds *bd, outs *o, char *why,
                     size_t wn)
{
    int n_in = bd->n;
    bool ok = bind_outs(s->g, s->syms[k], bd, o, why, wn);
    kiln_status st = ok ? kiln_run(p, bd->b, (size_t)bd->n) : KILN_OK;
    bd->n = n_in;
    if (ok && st != KILN_OK) ok = !snprintf(why, wn, "kiln_run: %s: %s", kiln_status_str(st), kiln_ctx_error(r->ctx));
    return ok && read_outs(s->g, o, why, wn);
}

/* Same plan, same inputs: outputs bit-identical on every one of s->determinism runs. Recorded
 * under its own row ("determinism:<op>"). */
static void determinism(kiln_check_run *r, const kiln_check_spec *s, kiln_plan *p, const char *be)
{
    char why[512] = "", name[64];
    binds bd = {.n = 0};
    outs o = {.n = 0};
    snprintf(name, sizeof name, "determinism:%s", s->op);
    unsigned char *first[16] = {0};
    bool ok = make_inputs(r, s, 0, &bd, why, sizeof why);
    for (int rep = 0; rep < s->determinism && ok; rep++) {
        if (!(ok = run_plan(r, s, p, 0, &bd, &o, why, sizeof why))) break;
        for (int j = 0; j < o.n && ok; j++) {
            if (rep == 0) {
                if ((first[j] = malloc(o.bytes[j] ? o.bytes[j] : 1))) memcpy(first[j], o.mem[j] + GUARD, o.bytes[j]);
                else ok = !snprintf(why, sizeof why, "out of memory");
            } else if (memcmp(first[j], o.mem[j] + GUARD, o.bytes[j]) != 0) {
                ok = !snprintf(why, sizeof why, "%s: run %d of output '%s' differs from run 1", s->label, rep + 1,
                               s->g->outs[j].name);
            }
        }
        free_outs(&o);
    }
    free_outs(&o);
    for (int j = 0; j < 16; j++) free(first[j]);
    free_binds(&bd);
    record(r, name, s->key, be, 0, ok ? 0 : INFINITY, ok ? NULL : why);
}

static void case_on(kiln_check_run *r, const kiln_check_spec *s, const char *be, double tol)
{
    char why[512] = "", name[64];
    kiln_plan *p[2] = {NULL, NULL};
    int np = s->fused_vs_unfused ? 2 : 1;
    double fail_nmse = INFINITY; /* what a failure records: infinity for hard failures (why says which) */
    kiln_ref64 *ref = kiln_ref64_new(s->g);
    binds bd = {.n = 0};
    outs o[2] = {{.n = 0}, {.n = 0}};
    bool ok = ref != NULL;
    if (!ok) snprintf(why, sizeof why, "reference evaluator: out of memory or graph error");
    for (int k = 0; k < np && ok; k++) {
        kiln_compile_options co = {.backend = be, .no_fuse = k == 1};
        kiln_status st = kiln_compile(r->ctx, s->g, &co, &p[k]);
        if (st != KILN_OK) ok = !snprintf(why, sizeof why, "kiln_compile: %s: %s", kiln_status_str(st), kiln_ctx_error(r->ctx));
    }
    ok = ok && set_states(r, s, p, np, ref, why, sizeof why);
    for (int k = 0; k < s->n_binds && ok; k++) {
        double worst[2] = {0, 0};
        if (!(ok = make_inputs(r, s, k, &bd, why, sizeof why))) break;
        if (kiln_ref64_run(ref, bd.b, (size_t)bd.n, why, sizeof why) != 0) {
            ok = false;
            break;
        }
        for (int v = 0; v < np && ok; v++) {
            if (!(ok = run_plan(r, s, p[v], k, &bd, &o[v], why, sizeof why))) break;
            for (int j = 0; j < o[v].n && ok; j++) {
                const double *x = kiln_ref64_output(ref, s->g->outs[j].name, NULL, NULL);
                double e = x ? compare(out_dtype(s->g, j), o[v].val[j], x, o[v].numel[j], why, sizeof why) : INFINITY;
                if (!x) snprintf(why, sizeof why, "reference has no output '%s'", s->g->outs[j].name);
                if (!(e <= tol) && !*why) {
                    snprintf(why, sizeof why, "output '%s' NMSE %.3g > %.3g", s->g->outs[j].name, e, tol);
                    fail_nmse = e; /* a measured excess is reported as measured, not as infinity */
                }
                if (e > worst[v] || isnan(e)) worst[v] = e;
                ok = !*why;
            }
        }
        if (ok && np == 2) { /* fused against unfused, within the tolerance of either */
            double e = 0;
            for (int j = 0; j < o[0].n; j++) {
                double x = compare(out_dtype(s->g, j), o[0].val[j], o[1].val[j], o[0].numel[j], why, sizeof why);
                e = x > e ? x : e;
            }
            snprintf(name, sizeof name, "fused-vs-unfused:%s", s->op);
            if (!(e <= 4 * tol) && !*why) snprintf(why, sizeof why, "%s: fused vs unfused NMSE %.3g", s->label, e);
            record(r, name, s->key, be, 4 * tol, e, why);
            why[0] = 0;
        }
        if (ok)
            for (int v = 0; v < np; v++) {
                snprintf(name, sizeof name, "%s%s", np == 2 ? (v ? "unfused:" : "fused:") : "", s->op);
                record(r, name, s->key, be, tol, worst[v], NULL);
            }
        for (int v = 0; v < np; v++) free_outs(&o[v]);
        free_binds(&bd);
    }
    if (ok && s->determinism > 0) determinism(r, s, p[0], be); /* recorded under its own row */
    if (!ok) {
        char lab[600];
        snprintf(lab, sizeof lab, "%s: %s", s->label, why);
        snprintf(name, sizeof name, "%s%s", np == 2 ? "fused:" : "", s->op);
        record(r, name, s->key, be, tol, fail_nmse, lab);
    }
    for (int v = 0; v < 2; v++) free_outs(&o[v]);
    free_binds(&bd);
    kiln_plan_free(p[0]);
    kiln_plan_free(p[1]);
    kiln_ref64_free(ref);
}

/* True when g reads a dtype the GPU templates do not have, or multiplies by a block weight whose K
 * its GPU row does not take (codegen/wfmt.h k_align: pairs of 32-blocks need K a multiple of 64). */
static bool host_only(const kiln_graph *g)
{
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        if (!kiln_dtype_on_gpu((kiln_dtype)n->dtype)) return true;
        if (n->op != KILN_OP_MATMUL) continue;
        const kiln_node_rec *w = &g->nodes[n->src[1]];
        const kl_wfmt *f = kl_wfmt_of((kiln_dtype)w->dtype);
        if (f && f->block && w->rank >= 1 && w->dims[w->rank - 1] % f->k_align) return true;
    }
    return false;
}

/* On cuda/vulkan such a graph must be refused (a plan would misread the format or has no kernel
 * for it): the compile has to fail with KILN_ERR_UNSUPPORTED naming the format. Recorded as
 * "refused:<op>". */
static void refused_on(kiln_check_run *r, const kiln_check_spec *s, const char *be)
{
    kiln_plan *p = NULL;
    kiln_status st = kiln_compile(r->ctx, s->g, &(kiln_compile_options){.backend = be}, &p);
    char name[64], why[512] = "";
    bool ok = st == KILN_ERR_UNSUPPORTED && strstr(kiln_ctx_error(r->ctx), kiln_dtype_name(s->key));
    if (!ok)
        snprintf(why, sizeof why, "%s: %s must refuse %s, got %s: %s", s->label, be, kiln_dtype_name(s->key),
                 kiln_status_str(st), st == KILN_OK ? "a plan" : kiln_ctx_error(r->ctx));
    snprintf(name, sizeof name, "refused:%s", s->op);
    record(r, name, s->key, be, 0, ok ? 0 : INFINITY, ok ? NULL : why);
    kiln_plan_free(p);
}

/* Hands the rows before `upto` that are not yet reported to opt.on_result. */
static void emit(kiln_check_run *r, int upto)
{
    for (; r->opt.on_result && r->n_emitted < upto; r->n_emitted++) r->opt.on_result(&r->res[r->n_emitted], r->opt.user);
}

/* Elements of every node of a spec's graph with its symbols at their bounds: the size of a case. */
static int64_t spec_elems(const kiln_check_spec *s)
{
    const kiln_graph *g = s->g;
    int64_t vals[64], dims[KILN_MAX_RANK], n = 0;
    for (uint32_t i = 0; i < g->n_syms && i < 64; i++) vals[i] = g->syms[i].max;
    for (uint32_t i = 0; i < g->n_nodes && g->n_syms <= 64; i++) n += kiln_node_numel(&g->nodes[i], vals, dims);
    return n;
}

/* Quick mode caps the vulkan backend: it compiles every case's kernels through glslang, and lavapipe
 * JIT-compiles and runs them on the CPU (seconds per case; the uncapped quick run took 17 minutes).
 * So it gets its own small case set: per op x dtype, the first case of at most QUICK_VK_ELEMS
 * elements; fused patterns and preset layers are left to the full run, `kiln check --backend vulkan`,
 * and to ctest's vulkan entries. (Not named, a CPU Vulkan device is skipped: see kiln_check.) */
#define QUICK_VK_ELEMS (1 << 16)
static bool quick_skips(const kiln_check_run *r, const kiln_check_spec *s, const char *be)
{
    if (!r->opt.quick || strcmp(be, "vulkan") != 0) return false;
    return r->group_capped || s->fused_vs_unfused || s->determinism || spec_elems(s) > QUICK_VK_ELEMS;
}

void kiln_check_case(kiln_check_run *r, const kiln_check_spec *s)
{
    if (r->status != KILN_OK) return;
    if (strcmp(r->group_op, s->op) != 0 || r->group_key != s->key) {
        emit(r, r->n_res);
        snprintf(r->group_op, sizeof r->group_op, "%s", s->op); /* a copy: specs reuse their name buffers */
        r->group_key = s->key;
        r->group_capped = false;
    }
    if (kiln_graph_status(s->g) != KILN_OK) {
        kiln_check_fail_all(r, s->op, s->key, "%s: builder error: %s", s->label, kiln_graph_error(s->g));
        return;
    }
    double tol = spec_tol(r, s);
    if (isnan(tol)) return;
    bool host = host_only(s->g), capped = false;
    for (int b = 0; b < r->n_be; b++) {
        if (quick_skips(r, s, r->be[b])) {
            r->quick_left++;
            continue;
        }
        if (host && strcmp(r->be[b], "ref") != 0 && strcmp(r->be[b], "cpu") != 0) refused_on(r, s, r->be[b]);
        else case_on(r, s, r->be[b], tol);
        capped |= r->opt.quick && !strcmp(r->be[b], "vulkan");
    }
    r->group_capped |= capped;
}

/* ---------------------------------------------------------------- public API */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *const GROUPS[] = {"matmul", "moe_matmul", "add", "mul", "scale", "silu", "gelu", "sigmoid", "tanh", "swiglu", "rms_norm",
                                     "layer_norm", "softmax", "rope", "attention", "attention:masks", "paged_attention",
                                     "paged_attention:masks", "kv_scatter", "get_rows",
                                     "argmax", "cast", "reshape", "view", "transpose", "concat", "fused",
                                     "unfused", "fused-vs-unfused", "preset", "determinism"};

KILN_API kiln_status kiln_check(kiln_ctx *ctx, const kiln_check_options *opts, kiln_check_report **out)
{
    if (!ctx || !out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    kiln_check_run *r = calloc(1, sizeof *r);
    kiln_check_report *rep = calloc(1, sizeof *rep);
    if (!r || !rep) {
        free(r);
        free(rep);
        return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "kiln_check: out of memory");
    }
    double t0 = now_s();
    r->ctx = ctx;
    if (opts) r->opt = *opts;
    if (!r->opt.seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->opt.seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    }
    uint64_t x = r->opt.seed;
    for (int i = 0; i < 4; i++) r->rng[i] = splitmix(&x);
    kiln_status st = KILN_OK;
    bool known_be = !r->opt.backend;
    for (int i = 0; i < kiln_backend_count(ctx) && r->n_be < MAX_BE; i++) {
        kiln_backend_info bi;
        if (kiln_backend_get(ctx, i, &bi) != KILN_OK) continue;
        if (r->opt.backend && strcmp(r->opt.backend, bi.name) != 0) continue;
        known_be = true;
        if (!bi.available && !r->opt.backend) continue; /* absent here: not tested, not a failure */
        if (r->opt.quick && !r->opt.backend && !strcmp(bi.name, "vulkan") && strstr(bi.detail, " (cpu, ")) {
            /* vk_device.c's detail names the device type: a CPU device (lavapipe) runs each case for
             * seconds, which --quick is not for; its small case set runs when asked for by name */
            snprintf(rep->note, sizeof rep->note, "vulkan skipped: its device is a CPU (%.60s); "
                     "--backend vulkan --quick runs its small case set", bi.detail);
            continue;
        }
        if (!bi.available) {
            st = kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED, "kiln_check: backend '%s' is not available: %s", bi.name, bi.detail);
            break;
        }
        r->be[r->n_be++] = bi.name;
    }
    if (st == KILN_OK && !known_be)
        st = kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG, "kiln_check: unknown backend '%s'", r->opt.backend);
    if (st == KILN_OK && r->opt.op && *r->opt.op) {
        bool known = false;
        for (size_t i = 0; i < sizeof GROUPS / sizeof *GROUPS; i++) known |= !strcmp(GROUPS[i], r->opt.op);
        if (!known)
            st = kiln_ctx_fail(ctx, KILN_ERR_INVALID_ARG,
                               "kiln_check: unknown op '%s' (an op name, or fused, preset, determinism)", r->opt.op);
    }
    if (st == KILN_OK) {
        kiln_check_ops(r);
        kiln_check_patterns(r);
        st = r->status;
        emit(r, r->n_res);
    }
    if (st == KILN_OK && r->quick_left && !rep->note[0]) /* a quick run that left cases out says so (all of them: 0 checks) */
        snprintf(rep->note, sizeof rep->note,
                 "--quick left %d case%s out on vulkan (fused-vs-unfused, determinism and large cases: a CPU device runs each "
                 "for seconds); run without --quick for them", r->quick_left, r->quick_left == 1 ? "" : "s");
    rep->results = r->res;
    rep->n_results = r->n_res;
    rep->seed = r->opt.seed;
    rep->ok = st == KILN_OK && r->n_res > 0;
    for (int i = 0; i < r->n_res; i++) rep->ok &= r->res[i].ok;
    rep->seconds = now_s() - t0;
    free(r);
    if (st != KILN_OK) {
        kiln_check_report_free(rep);
        return st;
    }
    kiln_err_clear(&ctx->err);
    *out = rep;
    return KILN_OK;
}

KILN_API void kiln_check_report_free(kiln_check_report *r)
{
    if (!r) return;
    free(r->results);
    free(r);
}

/* JSON number: finite values as %.6g, others as null-free large sentinels JSON can hold. */
static int jnum(char *b, size_t n, double v)
{
    if (isnan(v) || isinf(v)) return snprintf(b, n, "1e999");
    return snprintf(b, n, "%.6g", v);
}

/* src as the inside of a JSON string (quotes, backslashes and control bytes escaped); dst holds
 * 6 * strlen(src) + 1. */
static void json_text(char *dst, const char *src)
{
    for (; *src; src++) {
        unsigned char c = (unsigned char)*src;
        if (c == '"' || c == '\\') *dst++ = '\\', *dst++ = (char)c;
        else if (c < 0x20) dst += sprintf(dst, "\\u%04x", c);
        else *dst++ = (char)c;
    }
    *dst = 0;
}

KILN_API kiln_status kiln_check_report_json(const kiln_check_report *r, char **out)
{
    if (!r || !out) return KILN_ERR_INVALID_ARG;
    size_t cap = 640 + (size_t)r->n_results * (256 + 6 * sizeof r->results[0].detail), len = 0;
    char *s = malloc(cap);
    if (!s) return KILN_ERR_NOMEM;
    len += (size_t)snprintf(s + len, cap - len, "{\"ok\": %s, \"seed\": %llu, \"seconds\": %.3f, \"note\": \"",
                            r->ok ? "true" : "false", (unsigned long long)r->seed, r->seconds);
    for (const char *c = r->note; *c && len + 8 < cap; c++) { /* the note is ours, a device name is not */
        if (*c == '"' || *c == '\\') s[len++] = '\\';
        s[len++] = (unsigned char)*c < 0x20 ? '?' : *c;
    }
    len += (size_t)snprintf(s + len, cap - len, "\", \"results\": [");
    for (int i = 0; i < r->n_results; i++) {
        const kiln_check_result *x = &r->results[i];
        char a[40], b[40], d[6 * sizeof x->detail + 1];
        jnum(a, sizeof a, x->worst_nmse);
        jnum(b, sizeof b, x->tolerance);
        json_text(d, x->detail);
        len += (size_t)snprintf(s + len, cap - len,
                                "%s{\"op\": \"%s\", \"dtype\": \"%s\", \"backend\": \"%s\", \"cases\": %d, "
                                "\"worst_nmse\": %s, \"tolerance\": %s, \"ok\": %s, \"detail\": \"%s\"}",
                                i ? ", " : "", x->op, x->dtype, x->backend, x->cases, a, b, x->ok ? "true" : "false", d);
    }
    snprintf(s + len, cap - len, "]}");
    *out = s;
    return KILN_OK;
}
