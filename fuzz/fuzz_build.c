/* Fuzz target: builder + compile + run. The bytes are a program of builder calls (leaves with
 * fuzz-chosen dtypes and dims, every op on fuzz-chosen earlier nodes, now and then a bad handle),
 * then outputs; a graph that builds and fits the caps (fuzz.h: bytes, and predicted work, so a legal
 * but huge matmul is skipped rather than run for minutes) is compiled on ref (unfused) and cpu (fused),
 * both run on the same inputs drawn from the bytes, and where both succeed and the reference is
 * finite the outputs must agree (NMSE <= 1e-2: a loose bound that only catches gross errors); then
 * both run again with bindings broken on purpose, which must be refused with a message, and once
 * more correctly. Every input must give a status: no crash, leak, or allocation over 1 GiB. Inputs
 * share nothing: the context's memory table is emptied after each (fuzz_forget). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"

#define MAX_NODES 40 /* builder calls per input */
#define SLACK 16 /* bytes allocated past each input's and output's size: a claim of a larger buffer stays true */

typedef struct rd {
    const uint8_t *p; /* bytes */
    size_t         n; /* count */
    size_t         i; /* next */
} rd;

static unsigned u8(rd *r) { return r->i < r->n ? r->p[r->i++] : 0; }

static const kiln_dtype FLOATS[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
static const kiln_dtype ANY[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32,
                                 KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};

typedef struct prog {
    rd         r;               /* the bytes */
    kiln_graph *g;              /* graph built */
    kiln_node  nodes[MAX_NODES];/* handles made so far */
    int        n;               /* count */
    kiln_dim   sym[2];          /* symbols */
} prog;

/* An earlier node, or (rarely) a handle that is wrong on purpose. */
static kiln_node pick(prog *p)
{
    unsigned b = u8(&p->r);
    if (b == 255) return (kiln_node)0xdeadbeef00000007ull;
    if (b == 254) return KILN_NODE_NONE;
    return p->n ? p->nodes[b % (unsigned)p->n] : KILN_NODE_NONE;
}

static kiln_dim dim(prog *p, bool allow_sym)
{
    unsigned b = u8(&p->r);
    if (allow_sym && b >= 224) return p->sym[b & 1];
    static const kiln_dim pool[] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 33, 64, 256, 512};
    return pool[b % (sizeof pool / sizeof *pool)];
}

static int rank_of(prog *p, kiln_dim *d, bool allow_sym)
{
    int rank = 1 + (int)(u8(&p->r) % 3);
    for (int i = 0; i < rank; i++) d[i] = dim(p, allow_sym && i == 0);
    return rank;
}

static kiln_node step(prog *p, char *name)
{
    kiln_graph *g = p->g;
    kiln_dim d[KILN_MAX_RANK];
    unsigned op = u8(&p->r) % 26;
    switch (op) {
    case 0: case 1: {
        int rank = rank_of(p, d, true);
        return kiln_input(g, name, FLOATS[u8(&p->r) % 3], rank, d);
    }
    case 2: return kiln_input(g, name, KILN_DTYPE_I32, 1, (kiln_dim[]){dim(p, true)});
    case 3: {
        int rank = 1 + (int)(u8(&p->r) % 2);
        for (int i = 0; i < rank; i++) d[i] = dim(p, false);
        return kiln_weight_random(g, name, ANY[u8(&p->r) % 8], rank, d, u8(&p->r), 0.5f);
    }
    case 4: return kiln_state(g, name, ANY[u8(&p->r) % 8], 3, (kiln_dim[]){dim(p, false), dim(p, false), dim(p, false)});
    case 5: return kiln_matmul(g, pick(p), pick(p));
    case 6: return kiln_add(g, pick(p), pick(p));
    case 7: return kiln_mul(g, pick(p), pick(p));
    case 8: return kiln_scale(g, pick(p), (float)((int)u8(&p->r) - 128) / 16.0f);
    case 9: return kiln_silu(g, pick(p));
    case 10: return kiln_gelu(g, pick(p));
    case 11: return kiln_swiglu(g, pick(p), pick(p));
    case 12: return kiln_rms_norm(g, pick(p), u8(&p->r) & 1 ? pick(p) : KILN_NODE_NONE, 1e-5f);
    case 13: return kiln_layer_norm(g, pick(p), pick(p), u8(&p->r) & 1 ? pick(p) : KILN_NODE_NONE, 1e-5f);
    case 14: return kiln_softmax(g, pick(p));
    case 15: return kiln_rope(g, pick(p), pick(p), (kiln_rope_mode)(u8(&p->r) % 3), 1e4f);
    case 16: return kiln_attention(g, pick(p), pick(p), pick(p), u8(&p->r) & 1 ? p->sym[1] : dim(p, false), 0.0f);
    case 17: return kiln_kv_scatter(g, pick(p), pick(p), pick(p));
    case 18: return kiln_get_rows(g, pick(p), pick(p));
    case 19: return kiln_argmax(g, pick(p));
    case 20: return kiln_cast(g, pick(p), ANY[u8(&p->r) % 8]);
    case 21: {
        kiln_node x = pick(p);
        int rank = rank_of(p, d, true);
        return kiln_reshape(g, x, rank, d);
    }
    case 22: {
        kiln_node x = pick(p);
        int rank = rank_of(p, d, false);
        return kiln_view(g, x, rank, d, u8(&p->r));
    }
    case 23: return kiln_transpose(g, pick(p), (int)(u8(&p->r) % 4), (int)(u8(&p->r) % 4));
    case 24: return kiln_concat(g, pick(p), pick(p), (int)(u8(&p->r) % 4));
    default: {
        int rank = rank_of(p, d, true);
        return kiln_input(g, name, FLOATS[0], rank, d);
    }
    }
}

/* Fills the bindings for symbol values from the bytes and inputs with values from a generator
 * seeded by the bytes; returns the count. Buffers go into own[], their allocated sizes into held[]
 * (SLACK more than each claims). */
static size_t bind(prog *p, kiln_binding *b, void **own, size_t *held, int64_t *sv)
{
    const kiln_graph *g = p->g;
    size_t n = 0;
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ p->r.n;
    for (uint32_t s = 0; s < g->n_syms; s++) {
        sv[s] = 1 + (int64_t)(u8(&p->r) % (unsigned)g->syms[s].max);
        b[n++] = (kiln_binding){.name = g->syms[s].name, .value = sv[s]};
    }
    for (uint32_t i = 0; i < g->n_nodes && n < 64; i++) {
        const kiln_node_rec *nd = &g->nodes[i];
        if (nd->op != KILN_OP_INPUT) continue;
        int64_t dims[KILN_MAX_RANK];
        int64_t e = kiln_node_numel(nd, sv, dims);
        size_t bytes = kiln_node_bytes(nd, dims);
        float *v = malloc((size_t)(e ? e : 1) * sizeof *v);
        void *d = malloc(bytes + SLACK);
        for (int64_t k = 0; v && k < e; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            v[k] = (float)((double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
        }
        if (v && d && nd->dtype == KILN_DTYPE_I32)
            for (int64_t k = 0; k < e; k++) ((int32_t *)d)[k] = (int32_t)((v[k] + 1.0f) * 8.0f); /* 0..16 */
        else if (v && d && e)
            kiln_quantize((kiln_dtype)nd->dtype, v, d, e);
        free(v);
        own[n] = d;
        held[n] = bytes + SLACK;
        b[n++] = (kiln_binding){.name = nd->name, .data = d, .bytes = bytes};
    }
    return n;
}

/* Output o's size at this run's symbol values sv (its element count in *numel): what a run with
 * these bindings writes. kiln_plan_tensor reports the last run's dims, which a new run's symbols
 * may exceed, so it must not size a buffer the next run fills. */
static size_t out_bytes(const kiln_graph *g, uint32_t o, const int64_t *sv, int64_t *numel)
{
    int64_t dims[KILN_MAX_RANK];
    const kiln_node_rec *nd = &g->nodes[g->outs[o].node];
    *numel = kiln_node_numel(nd, sv, dims);
    return kiln_node_bytes(nd, dims);
}

/* Runs both plans on the same bindings and compares every output where both succeed. */
static void run_and_compare(prog *p, kiln_plan *ref, kiln_plan *cpu)
{
    const kiln_graph *g = p->g;
    kiln_binding b[64];
    void *own[64] = {0};
    size_t held[64] = {0};
    int64_t sv[8] = {0};
    size_t nb = bind(p, b, own, held, sv);
    kiln_status s1 = kiln_run(ref, b, nb), s2 = kiln_run(cpu, b, nb);
    for (uint32_t o = 0; s1 == KILN_OK && s2 == KILN_OK && o < g->n_outs; o++) {
        const kiln_node_rec *nd = &g->nodes[g->outs[o].node];
        int64_t e;
        size_t bytes = out_bytes(g, o, sv, &e);
        void *y1 = malloc(bytes + 1), *y2 = malloc(bytes + 1);
        float *f1 = malloc((size_t)(e + 1) * sizeof *f1), *f2 = malloc((size_t)(e + 1) * sizeof *f2);
        bool got = y1 && y2 && f1 && f2 && kiln_plan_read(ref, g->outs[o].name, y1, bytes) == KILN_OK &&
                   kiln_plan_read(cpu, g->outs[o].name, y2, bytes) == KILN_OK;
        if (got && nd->dtype == KILN_DTYPE_I32) {
            for (int64_t k = 0; k < e; k++) f1[k] = (float)((int32_t *)y1)[k], f2[k] = (float)((int32_t *)y2)[k];
        } else if (got) {
            got = kiln_dequantize((kiln_dtype)nd->dtype, y1, f1, e) == KILN_OK && kiln_dequantize((kiln_dtype)nd->dtype, y2, f2, e) == KILN_OK;
        }
        double num = 0, den = 0;
        bool finite = true;
        for (int64_t k = 0; got && k < e; k++) {
            finite &= isfinite(f1[k]) && fabsf(f1[k]) < 1e15f;
            num += ((double)f1[k] - f2[k]) * ((double)f1[k] - f2[k]);
            den += (double)f1[k] * f1[k];
        }
        /* argmax may pick another index among near-equal values: compare only float outputs */
        if (got && finite && den > 1e-20 && nd->op != KILN_OP_ARGMAX && nd->dtype != KILN_DTYPE_I32)
            FUZZ_CHECK(num / den <= 1e-2, "output '%s' (%s): cpu fused vs ref NMSE %g", g->outs[o].name,
                       kiln_op_name((enum kiln_op)nd->op), num / den);
        free(y1);
        free(y2);
        free(f1);
        free(f2);
    }
    for (size_t i = 0; i < nb; i++) free(own[i]);
}

/* Bindings made wrong on purpose, from the bytes (issue #17: every broken binding must be refused
 * with a status): a symbol or input left out, bound twice, an unknown or NULL name, an input of the
 * wrong size or with NULL data, an output buffer too small, a symbol out of [1, max], host memory
 * flagged as device memory. Each plan must refuse the run; then a correct run must still succeed
 * (on error the plan stays usable). */
static void hostile(prog *p, kiln_plan *ref, kiln_plan *cpu)
{
    const kiln_graph *g = p->g;
    kiln_binding b[72];
    void *own[72] = {0};
    size_t held[72] = {0}; /* bytes allocated behind binding k: never claim more */
    int64_t sv[8] = {0};
    size_t nb = bind(p, b, own, held, sv), n_in = nb;
    void *outs[4] = {0};
    for (uint32_t o = 0; o < g->n_outs && o < 4 && nb < 70; o++) { /* outputs at this run's size */
        int64_t e;
        size_t bytes = out_bytes(g, o, sv, &e);
        if (!(outs[o] = malloc(bytes + SLACK))) continue;
        held[nb] = bytes + SLACK;
        b[nb++] = (kiln_binding){.name = g->outs[o].name, .data = outs[o], .bytes = bytes};
    }
    if (!nb) goto out;
    unsigned kind = u8(&p->r) % 9, at = u8(&p->r) % (unsigned)nb;
    kiln_binding bad[72];
    memcpy(bad, b, nb * sizeof *b);
    size_t nbad = nb;
    bool is_sym = !b[at].data, is_in = at < n_in && !is_sym, must_fail = true;
    switch (kind) {
    case 0: /* left out: outputs may be */
        memmove(&bad[at], &bad[at + 1], (nb - at - 1) * sizeof *bad), nbad--;
        must_fail = at < n_in;
        break;
    case 1: bad[nbad++] = b[at]; break; /* twice */
    case 2: bad[at].name = "no_such_binding"; break;
    case 3: bad[at].name = NULL; break;
    case 4: /* a size off by one (the buffer has the byte): too small fails everywhere; larger only an input */
        if (is_sym) bad[at].value = 0;
        else if (u8(&p->r) & 1 || !bad[at].bytes) bad[at].bytes += 1, must_fail = is_in;
        else bad[at].bytes -= 1;
        break;
    case 5: if (is_sym) bad[at].value = -1; else bad[at].data = NULL, must_fail = bad[at].bytes > 0; break;
    case 6: {
        uint32_t s = kiln_graph_find_sym(g, b[at].name);
        if (is_sym && s != KILN_IDX_NONE) bad[at].value = g->syms[s].max + 1 + (int64_t)(u8(&p->r) % 3) * ((int64_t)1 << 40);
        else must_fail = false; /* unchanged */
        break;
    }
    case 7: if (!is_sym) bad[at].device = true; else bad[at].value = INT64_MIN; break;
    default: /* the whole allocation claimed: an output may be larger than its tensor, an input must
              * match its size exactly; a symbol far out of range */
        if (is_sym) bad[at].value = INT64_MAX;
        else bad[at].bytes = held[at], must_fail = is_in;
        break;
    }
    kiln_plan *plans[2] = {ref, cpu};
    for (int k = 0; k < 2; k++) {
        kiln_status first = kiln_run(plans[k], b, nb), s = kiln_run(plans[k], bad, nbad);
        if (must_fail)
            FUZZ_CHECK(s != KILN_OK, "%s plan ran with a broken binding (kind %u on '%s')", k ? "cpu" : "ref", kind,
                       b[at].name ? b[at].name : "(null)");
        if (s != KILN_OK) FUZZ_CHECK(*kiln_ctx_error(fuzz_ctx()), "a refused binding without a message (kind %u)", kind);
        kiln_status again = kiln_run(plans[k], b, nb);
        FUZZ_CHECK(again == first, "a correct run after a refused one: %s, before it %s: %s", kiln_status_str(again),
                   kiln_status_str(first), kiln_ctx_error(fuzz_ctx()));
    }
out:
    for (int o = 0; o < 4; o++) free(outs[o]);
    for (size_t i = 0; i < n_in; i++) free(own[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096) return 0;
    prog p = {.r = {data, size, 0}};
    if (kiln_graph_new(&p.g) != KILN_OK) return 0;
    p.sym[0] = kiln_sym(p.g, "n", 1 + u8(&p.r) % 8);
    p.sym[1] = kiln_sym(p.g, "n_kv", 1 + u8(&p.r) % 64);
    unsigned steps = 1 + u8(&p.r) % MAX_NODES;
    for (unsigned i = 0; i < steps && p.r.i < p.r.n; i++) {
        char name[16];
        snprintf(name, sizeof name, "l%u", i);
        kiln_node h = step(&p, name);
        if (h != KILN_NODE_NONE) p.nodes[p.n++] = h;
    }
    unsigned n_out = 1 + u8(&p.r) % 3;
    for (unsigned o = 0; o < n_out && p.n; o++) {
        char name[16];
        snprintf(name, sizeof name, "out%u", o);
        kiln_output(p.g, p.nodes[p.n - 1 - (int)(o % (unsigned)p.n)], name);
    }
    kiln_ctx *ctx = fuzz_ctx();
    /* Random weights get their bytes once, here, by the same function kiln_compile calls: both
     * compiles then share them (each would otherwise generate and quantize every weight again,
     * under coverage and ASan the larger part of an input's time). */
    if (kiln_graph_status(p.g) == KILN_OK && fuzz_graph_small(p.g) && kiln_graph_materialize_weights(p.g) == KILN_OK) {
        kiln_plan *ref = NULL, *cpu = NULL;
        kiln_status s1 = kiln_compile(ctx, p.g, &(kiln_compile_options){.backend = "ref", .no_fuse = true}, &ref);
        kiln_status s2 = kiln_compile(ctx, p.g, &(kiln_compile_options){.backend = "cpu"}, &cpu);
        FUZZ_CHECK((s1 == KILN_OK) == (s2 == KILN_OK), "ref compile %d, cpu compile %d: %s", (int)s1, (int)s2, kiln_ctx_error(ctx));
        if (s1 == KILN_OK && s2 == KILN_OK) run_and_compare(&p, ref, cpu);
        if (s1 == KILN_OK && s2 == KILN_OK) hostile(&p, ref, cpu);
        kiln_plan_free(ref);
        kiln_plan_free(cpu);
    }
    kiln_graph_free(p.g);
    fuzz_forget(ctx);
    return 0;
}
