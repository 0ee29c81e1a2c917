/* Test helpers: RNG, conversions, poison, guarded buffers, NMSE comparison with worst-element
 * reports, and sessions that run a compiled plan next to ref64. Every failure asserts through
 * Criterion with the seed in the message; nothing here skips or softens a check. */
#include "support/testutil.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph/graph.h"
#include "support/contract.h"
#include "support/gguf_writer.h"
#include "support/ref64.h"

#define TU_MAX_IN 16   /* most bound inputs per session */
#define TU_MAX_SYM 8   /* most bound symbols per session */
#define TU_MAX_OUT 16  /* most graph outputs per session */
#define GUARD 64       /* guard bytes each side of a guarded buffer */
#define GUARD_BYTE 0xA5

/* ---------------------------------------------------------------- random */

static uint64_t g_seed;      /* this process's seed */
static bool     g_seeded;    /* g_seed and g_rng are set */
static uint64_t g_rng[4];    /* xoshiro256** state */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t tu_seed(void)
{
    if (!g_seeded) {
        const char *e = getenv("KILN_TEST_SEED");
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_seed = e && *e ? strtoull(e, NULL, 0)
                         : ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
        uint64_t x = g_seed;
        for (int i = 0; i < 4; i++)
            g_rng[i] = splitmix(&x);
        g_seeded = true;
        tu_print_seed(g_seed);
    }
    return g_seed;
}

void tu_print_seed(uint64_t seed)
{
    /* Printed when drawn, so a crash or a timeout (which print no assert message) still names it. */
    const struct criterion_test *t = criterion_current_test;
    fprintf(stderr, "seed %llu of %s/%s: KILN_TEST_SEED=%llu replays it\n", (unsigned long long)seed,
            t && t->category ? t->category : "-", t && t->name ? t->name : "-", (unsigned long long)seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t tu_next(void)
{
    tu_seed();
    uint64_t *s = g_rng, r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

double tu_uniform(double lo, double hi)
{
    return lo + (hi - lo) * ((double)(tu_next() >> 11) * 0x1.0p-53);
}

int64_t tu_randint(int64_t lo, int64_t hi)
{
    return hi <= lo ? lo : lo + (int64_t)(tu_next() % (uint64_t)(hi - lo));
}

void tu_fill(float *dst, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)tu_uniform(lo, hi);
}

size_t tu_bytes(kiln_dtype t, int64_t n, int64_t row)
{
    if (row <= 0)
        return 0;
    return kiln_row_bytes(t, row) * (size_t)(n / row);
}

void *tu_to_dtype(kiln_dtype t, const float *src, int64_t n, size_t *bytes)
{
    size_t nb = tu_bytes(t, n, n ? n : 1);
    void *dst = malloc(nb ? nb : 1);
    cr_assert(dst, "out of memory (seed %llu)", (unsigned long long)tu_seed());
    if (t == KILN_DTYPE_I32) {
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = (int32_t)nearbyintf(src[i]);
    } else if (n) {
        kiln_status st = kiln_quantize(t, src, dst, n);
        cr_assert(st == KILN_OK, "kiln_quantize(%s, n=%lld): %s (seed %llu)", kiln_dtype_name(t), (long long)n,
                  kiln_status_str(st), (unsigned long long)tu_seed());
    }
    if (bytes)
        *bytes = nb;
    return dst;
}

void tu_to_f64(kiln_dtype t, const void *src, int64_t n, double *dst)
{
    if (n == 0)
        return;
    if (t == KILN_DTYPE_I32) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = ((const int32_t *)src)[i];
        return;
    }
    float *tmp = malloc((size_t)n * sizeof *tmp);
    cr_assert(tmp, "out of memory");
    kiln_status st = kiln_dequantize(t, src, tmp, n);
    cr_assert(st == KILN_OK, "kiln_dequantize(%s): %s", kiln_dtype_name(t), kiln_status_str(st));
    for (int64_t i = 0; i < n; i++)
        dst[i] = tmp[i];
    free(tmp);
}

/* ---------------------------------------------------------------- buffers */

void tu_poison(void *p, size_t n)
{
    memset(p, 0xFF, n);
}

void *tu_galloc(size_t n)
{
    unsigned char *b = malloc(n + 3 * GUARD);
    cr_assert(b, "out of memory");
    memcpy(b, &n, sizeof n);
    memset(b + GUARD, GUARD_BYTE, GUARD);
    tu_poison(b + 2 * GUARD, n);
    memset(b + 2 * GUARD + n, GUARD_BYTE, GUARD);
    return b + 2 * GUARD;
}

void tu_gcheck(const void *p, const char *what)
{
    if (!p)
        return;
    const unsigned char *b = (const unsigned char *)p - 2 * GUARD;
    size_t n;
    memcpy(&n, b, sizeof n);
    for (int i = 0; i < GUARD; i++) {
        cr_assert(b[GUARD + i] == GUARD_BYTE, "%s: guard byte %d before the buffer overwritten (seed %llu)", what,
                  GUARD - i, (unsigned long long)tu_seed());
        cr_assert(b[2 * GUARD + n + i] == GUARD_BYTE, "%s: guard byte %d after the buffer (%zu bytes) overwritten (seed %llu)",
                  what, i, n, (unsigned long long)tu_seed());
    }
}

void tu_gfree(void *p, const char *what)
{
    if (!p)
        return;
    tu_gcheck(p, what);
    free((unsigned char *)p - 2 * GUARD);
}

/* ---------------------------------------------------------------- comparisons */

double nmse64(const double *y, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (y[i] - ref[i]) * (y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return num / (den > DBL_MIN ? den : DBL_MIN);
}

double nmse(const float *y, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return num / (den > DBL_MIN ? den : DBL_MIN);
}

static void log_nmse(const char *what, double e, double tol)
{
    const char *path = getenv("KILN_TEST_NMSE_LOG");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "%.3e\t%.3e\t%s\n", e, tol, what);
        fclose(f);
    }
}

double tu_compare(const char *what, const double *got, const double *ref, int64_t n, double tol)
{
    return tu_compare_t(what, KILN_DTYPE_F32, got, ref, n, tol);
}

double tu_compare_t(const char *what, kiln_dtype t, const double *got, const double *ref, int64_t n, double tol)
{
    return tu_compare_mag(what, t, got, ref, NULL, n, tol);
}

double tu_compare_mag(const char *what, kiln_dtype t, const double *got, const double *ref, const double *mag, int64_t n,
                      double tol)
{
    unsigned long long seed = (unsigned long long)tu_seed();
    double num = 0, den = 0, worst = -1;
    int64_t wi = -1;
    cr_assert(!isnan(tol), "%s: no tolerance (seed %llu)", what, seed);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(ref[i])) {
            bool same = isnan(ref[i]) ? isnan(got[i]) : got[i] == ref[i];
            cr_assert(same, "%s: element %lld is %g, reference %g (seed %llu)", what, (long long)i, got[i], ref[i], seed);
            continue;
        }
        cr_assert(isfinite(got[i]), "%s: element %lld is %g where the reference is %.9g (seed %llu)", what,
                  (long long)i, got[i], ref[i], seed);
        double d = fabs(got[i] - ref[i]);
        num += d * d;
        den += mag ? mag[i] * mag[i] : ref[i] * ref[i];
        if (d > worst) {
            worst = d;
            wi = i;
        }
    }
    /* the contracts' floor (src/check/check.c nmse_floor): n * m^2, m the smallest normal of t */
    double m = t == KILN_DTYPE_F16 ? 0x1p-14 : 0x1p-126, fl = fmax((double)n * m * m, DBL_MIN);
    double e = num / (den > fl ? den : fl);
    log_nmse(what, e, tol);
    cr_assert(e <= tol, "%s: NMSE%s %.3e > tolerance %.1e over %lld elements; worst element %lld: got %.9g, reference %.9g (seed %llu)",
              what, mag ? " (against the terms' magnitude)" : "", e, tol, (long long)n, (long long)wi, wi >= 0 ? got[wi] : 0.0,
              wi >= 0 ? ref[wi] : 0.0, seed);
    return e;
}

/* Under KILN_PRECISION=f16 the compiles of the tests take that precision too (kiln_env_options):
 * their bounds follow. */
double tu_tol(const char *op, kiln_dtype t)
{
    const char *e = getenv("KILN_PRECISION");
    return tu_tol_prec(op, t, e && !strcmp(e, "f16") ? KILN_PREC_F16 : KILN_PREC_EXACT);
}

double tu_tol_prec(const char *op, kiln_dtype t, int32_t precision)
{
    contract c;
    char err[512];
    cr_assert(contract_load(op, &c, err, sizeof err), "contract of %s: %s", op, err);
    double tol = contract_tol_prec(&c, t, precision);
    cr_assert(!isnan(tol), "contracts/%s.yaml has no tolerance for %s", op, kiln_dtype_name(t));
    return tol;
}

const char *tu_backend(void)
{
    const char *b = getenv("KILN_TEST_BACKEND");
    return b && *b ? b : "ref";
}

bool tu_backend_present(kiln_ctx *ctx, const char *name)
{
    for (int i = 0; i < kiln_backend_count(ctx); i++) {
        kiln_backend_info b;
        if (kiln_backend_get(ctx, i, &b) == KILN_OK && strcmp(b.name, name) == 0) return b.available;
    }
    return false;
}

kiln_gguf *tu_model_open(kiln_ctx *ctx, const gw_model *m, uint8_t **bytes)
{
    gw *w = gw_model_new(m);
    size_t n;
    *bytes = gw_bytes(w, &n);
    gw_free(w);
    kiln_gguf *f;
    cr_assert_eq(kiln_gguf_open_memory(ctx, *bytes, n, &f), KILN_OK, "%s", kiln_ctx_error(ctx));
    return f;
}

kiln_node tu_weight(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims, float lo, float hi)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= dims[d];
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert(v, "out of memory");
    tu_fill(v, n, lo, hi);
    size_t bytes;
    void *data = tu_to_dtype(t, v, n, &bytes);
    kiln_node w = kiln_weight(g, name, t, rank, dims, data, KILN_WEIGHT_COPY);
    cr_assert(w != KILN_NODE_NONE, "kiln_weight '%s' (%s): %s", name, kiln_dtype_name(t), kiln_graph_error(g));
    free(v);
    free(data);
    return w;
}

/* ---------------------------------------------------------------- sessions */

typedef struct tu_in {
    char   *name;  /* input name (owned) */
    void   *data;  /* bound data in the input's dtype (owned) */
    size_t  bytes; /* its size */
} tu_in;

struct tu_sess {
    const kiln_graph *g;              /* graph under test (borrowed) */
    char              what[256];      /* description for messages */
    kiln_ctx         *ctx;            /* context of the plan */
    kiln_plan        *plan;           /* compiled plan on tu_backend() */
    ref64            *ref;            /* f64 oracle */
    tu_in             in[TU_MAX_IN];  /* bound inputs */
    int               n_in;           /* entries in in */
    int64_t           sym[TU_MAX_SYM];/* value per graph symbol index */
    bool              sym_set[TU_MAX_SYM]; /* sym[i] was bound */
    void             *out[TU_MAX_OUT];/* guarded output buffers of the last run, per graph output */
    bool              ran;            /* the last tu_run succeeded */
};

kiln_plan *tu_plan(tu_sess *s)
{
    return s->plan;
}

tu_sess *tu_sess_new(const kiln_graph *g, const char *what)
{
    tu_sess *s = calloc(1, sizeof *s);
    cr_assert(s, "out of memory");
    s->g = g;
    snprintf(s->what, sizeof s->what, "[%s] %s", tu_backend(), what);
    cr_assert(kiln_graph_status(g) == KILN_OK, "%s: graph error: %s", s->what, kiln_graph_error(g));
    cr_assert(g->n_syms <= TU_MAX_SYM && g->n_outs <= TU_MAX_OUT, "%s: too many symbols/outputs for tu_sess", s->what);
    kiln_ctx_options o = {.n_threads = 0, .cache_dir = NULL, .quiet = true};
    kiln_status st = kiln_ctx_new(&o, &s->ctx);
    cr_assert(st == KILN_OK, "%s: kiln_ctx_new: %s", s->what, kiln_status_str(st));
    kiln_compile_options co = {.backend = tu_backend(), .no_fuse = false};
    st = kiln_compile(s->ctx, g, &co, &s->plan);
    cr_assert(st == KILN_OK, "%s: kiln_compile: %s: %s", s->what, kiln_status_str(st), kiln_ctx_error(s->ctx));
    s->ref = ref64_new(g);
    cr_assert(s->ref, "%s: ref64_new failed", s->what);
    return s;
}

static void free_outs(tu_sess *s)
{
    for (uint32_t o = 0; o < TU_MAX_OUT; o++) {
        tu_gfree(s->out[o], s->what);
        s->out[o] = NULL;
    }
}

void tu_sess_free(tu_sess *s)
{
    if (!s)
        return;
    free_outs(s);
    for (int i = 0; i < s->n_in; i++) {
        free(s->in[i].name);
        free(s->in[i].data);
    }
    ref64_free(s->ref);
    kiln_plan_free(s->plan);
    kiln_ctx_free(s->ctx);
    free(s);
}

void tu_sym(tu_sess *s, const char *name, int64_t v)
{
    for (uint32_t i = 0; i < s->g->n_syms; i++)
        if (strcmp(s->g->syms[i].name, name) == 0) {
            s->sym[i] = v;
            s->sym_set[i] = true;
            return;
        }
    cr_assert_fail("%s: no symbol '%s'", s->what, name);
}

/* Concrete dims/numel of node idx with the bound symbols. */
static int64_t node_numel(const tu_sess *s, uint32_t idx, int64_t *row)
{
    const kiln_node_rec *n = &s->g->nodes[idx];
    int64_t e = 1, d = 1;
    for (int k = 0; k < n->rank; k++) {
        d = n->dims[k];
        if (kiln_dim_is_sym(d)) {
            uint32_t si = kiln_sym_index(d);
            cr_assert(s->sym_set[si], "%s: symbol '%s' used before it is bound", s->what, s->g->syms[si].name);
            d = s->sym[si];
        }
        e *= d;
    }
    if (row)
        *row = n->rank ? d : 1;
    return e;
}

static uint32_t find_input(const tu_sess *s, const char *name)
{
    for (uint32_t i = 0; i < s->g->n_nodes; i++)
        if (s->g->nodes[i].op == KILN_OP_INPUT && strcmp(s->g->nodes[i].name, name) == 0)
            return i;
    cr_assert_fail("%s: no input named '%s'", s->what, name);
    return KILN_IDX_NONE;
}

void tu_input(tu_sess *s, const char *name, const void *data, size_t bytes)
{
    int i = 0;
    while (i < s->n_in && strcmp(s->in[i].name, name) != 0)
        i++;
    cr_assert(i < TU_MAX_IN, "%s: too many inputs", s->what);
    if (i == s->n_in) {
        s->in[i].name = strdup(name);
        s->n_in++;
    }
    free(s->in[i].data);
    s->in[i].data = malloc(bytes ? bytes : 1);
    cr_assert(s->in[i].name && s->in[i].data, "out of memory");
    memcpy(s->in[i].data, data, bytes);
    s->in[i].bytes = bytes;
}

void tu_input_f32(tu_sess *s, const char *name, const float *v, int64_t n)
{
    uint32_t idx = find_input(s, name);
    int64_t row, e = node_numel(s, idx, &row);
    cr_assert(e == n, "%s: input '%s' has %lld elements, %lld given", s->what, name, (long long)e, (long long)n);
    size_t bytes;
    void *d = tu_to_dtype((kiln_dtype)s->g->nodes[idx].dtype, v, n, &bytes);
    tu_input(s, name, d, bytes);
    free(d);
}

void tu_input_random(tu_sess *s, const char *name, float lo, float hi)
{
    int64_t n = node_numel(s, find_input(s, name), NULL);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert(v, "out of memory");
    tu_fill(v, n, lo, hi);
    tu_input_f32(s, name, v, n);
    free(v);
}

void tu_input_ints(tu_sess *s, const char *name, int64_t lo, int64_t hi)
{
    int64_t n = node_numel(s, find_input(s, name), NULL);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert(v, "out of memory");
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)tu_randint(lo, hi);
    tu_input_f32(s, name, v, n);
    free(v);
}

void tu_state_random(tu_sess *s, const char *name, float lo, float hi)
{
    uint32_t idx = kiln_graph_find_leaf(s->g, name);
    cr_assert(idx != KILN_IDX_NONE && s->g->nodes[idx].op == KILN_OP_STATE, "%s: no state '%s'", s->what, name);
    int64_t row, n = node_numel(s, idx, &row);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert(v, "out of memory");
    tu_fill(v, n, lo, hi);
    size_t bytes;
    void *d = tu_to_dtype((kiln_dtype)s->g->nodes[idx].dtype, v, n, &bytes);
    kiln_status st = kiln_plan_state_write(s->plan, name, d, bytes);
    cr_assert(st == KILN_OK, "%s: kiln_plan_state_write '%s': %s: %s", s->what, name, kiln_status_str(st),
              kiln_ctx_error(s->ctx));
    char err[512];
    cr_assert(ref64_state_set(s->ref, name, d, bytes, err, sizeof err) == 0, "%s: %s", s->what, err);
    free(v);
    free(d);
}

/* Builds the binding list: inputs, symbols, and fresh poisoned guarded buffers for every output. */
static size_t make_bindings(tu_sess *s, kiln_binding *b)
{
    size_t n = 0;
    free_outs(s);
    for (int i = 0; i < s->n_in; i++)
        b[n++] = (kiln_binding){.name = s->in[i].name, .data = s->in[i].data, .bytes = s->in[i].bytes};
    for (uint32_t i = 0; i < s->g->n_syms; i++) {
        cr_assert(s->sym_set[i], "%s: symbol '%s' is not bound", s->what, s->g->syms[i].name);
        b[n++] = (kiln_binding){.name = s->g->syms[i].name, .data = NULL, .bytes = 0, .value = s->sym[i]};
    }
    for (uint32_t o = 0; o < s->g->n_outs; o++) {
        uint32_t idx = s->g->outs[o].node;
        int64_t row, e = node_numel(s, idx, &row);
        size_t bytes = tu_bytes((kiln_dtype)s->g->nodes[idx].dtype, e, row);
        s->out[o] = tu_galloc(bytes);
        b[n++] = (kiln_binding){.name = s->g->outs[o].name, .data = s->out[o], .bytes = bytes};
    }
    return n;
}

kiln_status tu_run_status(tu_sess *s)
{
    kiln_binding b[TU_MAX_IN + TU_MAX_SYM + TU_MAX_OUT];
    size_t n = make_bindings(s, b);
    s->ran = false;
    return kiln_run(s->plan, b, n);
}

void tu_run(tu_sess *s)
{
    kiln_binding b[TU_MAX_IN + TU_MAX_SYM + TU_MAX_OUT];
    size_t n = make_bindings(s, b);
    char err[512] = "";
    s->ran = false;
    kiln_status st = kiln_run(s->plan, b, n);
    cr_assert(st == KILN_OK, "%s: kiln_run: %s: %s (seed %llu)", s->what, kiln_status_str(st), kiln_ctx_error(s->ctx),
              (unsigned long long)tu_seed());
    cr_assert(ref64_run(s->ref, b, n, err, sizeof err) == 0, "%s: ref64_run: %s", s->what, err);
    s->ran = true;
}

double tu_check_tol(tu_sess *s, const char *out, double tol)
{
    return tu_check_mag(s, out, NULL, tol);
}

double tu_check_mag(tu_sess *s, const char *out, const double *mag, double tol)
{
    cr_assert(s->ran, "%s: check of '%s' without a successful run", s->what, out);
    uint32_t o = 0;
    while (o < s->g->n_outs && strcmp(s->g->outs[o].name, out) != 0)
        o++;
    cr_assert(o < s->g->n_outs, "%s: no output '%s'", s->what, out);
    uint32_t idx = s->g->outs[o].node;
    int64_t row, e = node_numel(s, idx, &row), rn = -1;
    const double *ref = ref64_output(s->ref, out, NULL, &rn);
    cr_assert(ref && rn == e, "%s: ref64 has %lld elements for '%s', the graph %lld", s->what, (long long)rn, out, (long long)e);
    char what[400];
    snprintf(what, sizeof what, "%s: output '%s'", s->what, out);
    tu_gcheck(s->out[o], what);
    double *got = malloc((size_t)(e ? e : 1) * sizeof *got);
    cr_assert(got, "out of memory");
    kiln_dtype t = (kiln_dtype)s->g->nodes[idx].dtype;
    tu_to_f64(t, s->out[o], e, got);
    double r = tu_compare_mag(what, t, got, ref, mag, e, tol);
    free(got);
    return r;
}

double tu_check(tu_sess *s, const char *out, const char *op, kiln_dtype key)
{
    return tu_check_tol(s, out, tu_tol(op, key));
}

double tu_check_state(tu_sess *s, const char *state, const char *op, kiln_dtype key)
{
    kiln_tensor_info ti;
    kiln_status st = kiln_plan_tensor(s->plan, state, &ti);
    cr_assert(st == KILN_OK, "%s: kiln_plan_tensor '%s': %s", s->what, state, kiln_status_str(st));
    int64_t e = 1, rn = -1;
    for (int d = 0; d < ti.rank; d++)
        e *= ti.dims[d];
    void *buf = tu_galloc(ti.bytes);
    st = kiln_plan_state_read(s->plan, state, buf, ti.bytes);
    cr_assert(st == KILN_OK, "%s: kiln_plan_state_read '%s': %s: %s", s->what, state, kiln_status_str(st),
              kiln_ctx_error(s->ctx));
    const double *ref = ref64_state(s->ref, state, &rn);
    cr_assert(ref && rn == e, "%s: state '%s' has %lld elements in the plan, %lld in ref64", s->what, state, (long long)e,
              (long long)rn);
    double *got = malloc((size_t)(e ? e : 1) * sizeof *got);
    cr_assert(got, "out of memory");
    tu_to_f64(ti.t, buf, e, got);
    char what[400];
    snprintf(what, sizeof what, "%s: state '%s'", s->what, state);
    double r = tu_compare_t(what, ti.t, got, ref, e, tu_tol(op, key));
    free(got);
    tu_gfree(buf, what);
    return r;
}
