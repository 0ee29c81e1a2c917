/* The CPU backend: maps fused regions onto the SIMD kernels. A matmul region's rms_norm prologue,
 * sibling matmuls, residual add and swiglu run as one kiln_cpu_matmul pass (weights read once);
 * its rope and kv_scatter epilogues then run on the small outputs; every other node runs through
 * the cpu's per-node kernels (node.c). Must not call another backend: a region with an op the cpu
 * has no kernel for is refused by supports(), and placement puts it on the reference backend. */
#include "backends/cpu/cpu.h"
#include "backends/cpu/node.h"
#include "sched/backend.h"
#include "sched/ctx.h"

#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_state {
    kiln_cpu_pool    *pool; /* persistent threads */
    enum kiln_cpu_isa isa;  /* dispatch target */
    pthread_mutex_t   mu;   /* one region at a time on the pool (and its scratch): plans of one
                               context may run on several threads at once */
} cpu_state;

/* A compiled matmul region: which nodes the fused kernel covers; the rest run one by one after. */
struct kiln_kernel {
    bool     fused;        /* the region's matmul part runs as one kiln_cpu_matmul */
    uint32_t norm;         /* rms_norm prologue node, or KILN_IDX_NONE */
    bool     norm_out;     /* the normalized x is also read outside: store it */
    int      n_mm;         /* matmuls */
    uint32_t mm[4];        /* matmul nodes (out j) */
    uint32_t dst[4];       /* node whose buffer receives out j (the matmul, its residual add, or the swiglu) */
    uint32_t resid[4];     /* residual operand node of out j, or KILN_IDX_NONE */
    uint32_t bias[4];      /* f32 [N] bias node of out j (broadcast add right after the matmul), or KILN_IDX_NONE */
    bool     swiglu;       /* out 0 = silu(mm0) * mm1 */
    bool     sdpa;         /* region is softmax(scale(q.k^T) + mask).v written as ops (fusion rule 5) */
    uint32_t sq, sk, sv;   /* its q [T, d], k [S, d], and v ([S, d] rows, or [d, S] when !sv_rows) */
    uint32_t smask;        /* additive mask [T, S] or KILN_IDX_NONE */
    bool     sv_rows;      /* v is given as rows (through a transpose in the region) */
    float    sscale;       /* score scale (1 when there is no scale op) */
    uint32_t sout;         /* output node [T, d] */
    uint32_t n_rest;       /* nodes not covered, run in order after the fused part */
    uint32_t rest[];       /* those nodes */
};

static kiln_status cpu_probe(kiln_ctx *ctx, void **state, char *detail, size_t n)
{
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->isa = kiln_cpu_isa_detect();
    kiln_status st = kiln_cpu_pool_new(ctx->opts.n_threads, &s->pool);
    if (st != KILN_OK) {
        free(s);
        snprintf(detail, n, "could not start the thread pool");
        return st;
    }
    pthread_mutex_init(&s->mu, NULL);
    snprintf(detail, n, "%s%s, %d threads", kiln_cpu_isa_name(s->isa),
             s->isa == KILN_CPU_ISA_AVX512 && kiln_cpu_has_vnni() ? "+vnni" : "", kiln_cpu_pool_threads(s->pool));
    *state = s;
    return KILN_OK;
}

static void cpu_release(void *state)
{
    cpu_state *s = state;
    if (!s) return;
    kiln_cpu_pool_free(s->pool);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static bool cpu_supports(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o, char *why,
                         size_t n_why)
{
    for (uint32_t i = 0; i < r->n_nodes; i++)
        if (!kiln_cpu_node_supported(g, r->nodes[i], why, n_why)) return false;
    return true;
}

static void cpu_profile(void *state, kiln_device_profile *out)
{
    /* Defaults for a 2-core AVX-512 machine; `kiln calibrate` measures and overrides them. */
    *out = (kiln_device_profile){.mem_bw = 40e9, .launch_s = 2e-6};
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) out->peak_flops[t] = 150e9;
}

static kiln_status cpu_calibrate(void *state, kiln_device_profile *out)
{
    cpu_state *s = state;
    cpu_profile(state, out);
    pthread_mutex_lock(&s->mu);
    double bw = kiln_cpu_measure_read_bw(s->pool), peak = kiln_cpu_measure_fma_peak(s->pool, s->isa);
    pthread_mutex_unlock(&s->mu);
    if (bw <= 0 || peak <= 0) return KILN_ERR_NOMEM;
    out->mem_bw = bw * 1e9;
    for (int t = 0; t < KILN_DTYPE_COUNT; t++) out->peak_flops[t] = peak * 1e9;
    /* The quantized GEMMs run integer dot products against the f32 FMA peak measured above:
     * q8_0 at about 1.0x, q4_K and q6_K at 1.3-1.6x (packed panels, bench_cpu on the dev machine);
     * q5_K has no GEMM and runs one row pair at a time, about 0.3x. */
    static const double rate[KILN_DTYPE_COUNT] = {
        [KILN_DTYPE_Q8_0] = 1.0, [KILN_DTYPE_Q4_K] = 1.3, [KILN_DTYPE_Q5_K] = 0.3, [KILN_DTYPE_Q6_K] = 1.3};
    for (int t = 0; t < KILN_DTYPE_COUNT; t++)
        if (rate[t] > 0) out->peak_flops[t] = peak * rate[t] * 1e9;
    return KILN_OK;
}


static bool mm_dtype_ok(uint8_t t) { return t != KILN_DTYPE_I32 && t < KILN_DTYPE_COUNT; }

static void cover(const kiln_region *r, bool *covered, uint32_t node)
{
    for (uint32_t i = 0; node != KILN_IDX_NONE && i < r->n_nodes; i++) covered[i] |= r->nodes[i] == node;
}

/* The fused pass from the region's spec (fusion found the matmuls, their shared x, the rms_norm
 * and each output's bias/residual/swiglu chain): false when the kernel cannot take it (dtypes). */
static bool plan_fused(const kiln_graph *g, const kiln_region *r, struct kiln_kernel *k, bool *covered)
{
    const kiln_region_spec *sp = &r->spec;
    k->norm = KILN_IDX_NONE;
    if (r->kind != KILN_REGION_MATMUL || sp->n_mm == 0) return false;
    const kiln_node_rec *xn = &g->nodes[sp->x];
    if (sp->norm == KILN_IDX_NONE && kiln_region_has(r, sp->x)) return false;
    /* x f16/bf16 (a narrowed swiglu before down, a user's f16 activations) is staged to f32 by
       run_fused; under an rms_norm prologue x stays f32 (the statistic reads it as it is) */
    if (xn->dtype != KILN_DTYPE_F32 &&
        (sp->norm != KILN_IDX_NONE || (xn->dtype != KILN_DTYPE_F16 && xn->dtype != KILN_DTYPE_BF16)))
        return false;
    if (sp->norm_w != KILN_IDX_NONE && g->nodes[sp->norm_w].dtype != KILN_DTYPE_F32) return false;
    for (uint32_t j = 0; j < sp->n_mm; j++) {
        if (!mm_dtype_ok(g->nodes[g->nodes[sp->mm[j]].src[1]].dtype)) return false;
        const kiln_spec_out *o = &sp->out[j];
        /* the kernel reads bias and residual as f32 (a stored dst of another type is staged: run_fused) */
        if ((o->bias != KILN_IDX_NONE && g->nodes[o->bias].dtype != KILN_DTYPE_F32) ||
            (o->resid != KILN_IDX_NONE && g->nodes[o->resid].dtype != KILN_DTYPE_F32))
            return false;
        k->mm[j] = sp->mm[j], k->dst[j] = o->dst, k->bias[j] = o->bias, k->resid[j] = o->resid;
        cover(r, covered, sp->mm[j]);
        cover(r, covered, o->bias_add);
        cover(r, covered, o->resid_add);
    }
    k->n_mm = (int)sp->n_mm;
    k->swiglu = sp->swiglu;
    if (sp->swiglu) cover(r, covered, sp->out[0].dst);
    if (sp->norm != KILN_IDX_NONE) {
        if (g->nodes[sp->norm].dtype != KILN_DTYPE_F32) return false; /* norm_out stores f32 */
        k->norm = sp->norm;
        k->norm_out = kiln_region_is_out(r, sp->norm);
        cover(r, covered, sp->norm);
    }
    return true;
}

/* Rule-5 regions: the nodes are (transpose), softmax, (add), (scale), matmul q.k, matmul p.v. */
static bool plan_sdpa(const kiln_graph *g, const kiln_region *r, struct kiln_kernel *k)
{
    const kiln_node_rec *o = &g->nodes[r->anchor];
    if (o->op != KILN_OP_MATMUL) return false;
    k->sout = r->anchor;
    uint32_t p = o->src[0], w = o->src[1];
    k->sv_rows = g->nodes[w].op == KILN_OP_TRANSPOSE && kiln_region_has(r, w);
    k->sv = k->sv_rows ? g->nodes[w].src[0] : w;
    uint32_t s = g->nodes[p].src[0];
    k->smask = KILN_IDX_NONE;
    k->sscale = 1;
    if (g->nodes[s].op == KILN_OP_ADD && kiln_region_has(r, s)) k->smask = g->nodes[s].src[1], s = g->nodes[s].src[0];
    if (g->nodes[s].op == KILN_OP_SCALE && kiln_region_has(r, s)) k->sscale = g->nodes[s].f[0], s = g->nodes[s].src[0];
    if (g->nodes[s].op != KILN_OP_MATMUL || !kiln_region_has(r, s)) return false;
    k->sq = g->nodes[s].src[0];
    k->sk = g->nodes[s].src[1];
    const uint32_t f32[] = {k->sq, k->sk, k->sv, k->smask};
    for (int i = 0; i < 4; i++)
        if (f32[i] != KILN_IDX_NONE && g->nodes[f32[i]].dtype != KILN_DTYPE_F32) return false;
    if (k->smask != KILN_IDX_NONE && g->nodes[k->smask].rank != 2) return false; /* a broadcast mask: op by op */
    return k->sdpa = true;
}

static kiln_status cpu_compile(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                               kiln_kernel **out, char *err, size_t n_err)
{
    struct kiln_kernel *k = calloc(1, sizeof *k + r->n_nodes * sizeof(uint32_t));
    bool *covered = calloc(r->n_nodes + 1, sizeof *covered);
    if (!k || !covered) {
        free(k);
        free(covered);
        snprintf(err, n_err, "out of memory");
        return KILN_ERR_NOMEM;
    }
    if (r->kind == KILN_REGION_ATTENTION && r->n_nodes > 1 && plan_sdpa(g, r, k)) {
        k->n_rest = 0; /* the whole region is one kernel */
        free(covered);
        *out = k;
        return KILN_OK;
    }
    if (r->kind == KILN_REGION_MATMUL) k->fused = plan_fused(g, r, k, covered);
    if (!k->fused) {
        memset(covered, 0, r->n_nodes * sizeof *covered);
        k->n_mm = 0;
    }
    for (uint32_t i = 0; i < r->n_nodes; i++)
        if (!covered[i]) k->rest[k->n_rest++] = r->nodes[i];
    free(covered);
    *out = k;
    return KILN_OK;
}

static void cpu_kernel_free(void *state, kiln_kernel *k) { free(k); }

/* ------------------------------------------------------------------ cache entries */

static void cpu_identity(void *state, char *buf, size_t n)
{
    cpu_state *s = state;
    snprintf(buf, n, "cpu %s%s", kiln_cpu_isa_name(s->isa), s->isa == KILN_CPU_ISA_AVX512 && kiln_cpu_has_vnni() ? "+vnni" : "");
}

/* The entry is the kernel's bytes (the binary's identity is in the key, so the layout is this one). */
static kiln_status cpu_kernel_save(void *state, const kiln_kernel *k, void **out, size_t *len)
{
    *len = sizeof *k + k->n_rest * sizeof(uint32_t);
    if (!(*out = malloc(*len))) return KILN_ERR_NOMEM;
    memcpy(*out, k, *len);
    return KILN_OK;
}

/* An entry is accepted only when it is, byte for byte, the table this build plans for this region
 * of this graph: a table is cheap to plan, and any other check leaves roles unverified (a node
 * index in range can still name a weight where the kernel writes its output: issue #17). So a
 * forged entry, or one whose checksums were recomputed over edited bytes, is refused as a whole. */
static kiln_status cpu_kernel_load(void *state, const kiln_graph *g, const kiln_region *r, const kiln_compile_options *o,
                                   const void *buf, size_t len, kiln_kernel **out, char *err, size_t n_err)
{
    *out = NULL;
    kiln_kernel *k = NULL;
    kiln_status s = cpu_compile(state, g, r, o, &k, err, n_err);
    if (s != KILN_OK) return s;
    if (len != sizeof *k + k->n_rest * sizeof(uint32_t) || memcmp(k, buf, len) != 0) {
        free(k);
        snprintf(err, n_err, "cpu: cache entry is not the table planned for this region");
        return KILN_ERR_INVALID_ARG;
    }
    *out = k;
    return KILN_OK;
}

static int64_t rows_of(const kiln_exec_view *v, uint32_t node, int64_t *last)
{
    const kiln_node_rec *n = &v->g->nodes[node];
    int64_t rows = 1;
    for (int i = 0; i + 1 < n->rank; i++) rows *= v->dims[node][i];
    *last = v->dims[node][n->rank - 1];
    return rows;
}

/* n f32 values of scratch for a staged operand (NULL: out of memory). */
static float *stage_new(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

static kiln_status run_fused(cpu_state *s, const struct kiln_kernel *k, const kiln_exec_view *v)
{
    const kiln_graph *g = v->g;
    const kiln_node_rec *m0 = &g->nodes[k->mm[0]];
    uint32_t x = k->norm != KILN_IDX_NONE ? g->nodes[k->norm].src[0] : m0->src[0];
    kiln_cpu_mm mm = {.x = v->bufs[x], .n_out = k->n_mm, .swiglu = k->swiglu};
    mm.m = rows_of(v, x, &mm.k);
    /* The pass reads and stores f32. Another type (kiln_graph_narrow_gemm_inputs: under precision
       f16 the swiglu that gate/up store and the down matmul reads is f16) is staged: x converted
       before, a destination converted once after (written in place, the f32 values overran the
       f16 buffer). stage[0]: x; stage[1 + j]: out j. */
    float *stage[5] = {NULL, NULL, NULL, NULL, NULL};
    kiln_status st = KILN_OK;
    if (g->nodes[x].dtype != KILN_DTYPE_F32) {
        if (!(stage[0] = stage_new(mm.m * mm.k))) st = KILN_ERR_NOMEM;
        else if (mm.m * mm.k > 0) st = kiln_dequantize((kiln_dtype)g->nodes[x].dtype, v->bufs[x], stage[0], mm.m * mm.k);
        mm.x = stage[0];
    }
    if (k->norm != KILN_IDX_NONE) {
        const kiln_node_rec *nn = &g->nodes[k->norm];
        mm.norm = true;
        mm.eps = nn->f[0];
        mm.norm_w = nn->src[1] != KILN_IDX_NONE ? v->bufs[nn->src[1]] : NULL;
        if (k->norm_out) kiln_cpu_rms_norm(mm.x, mm.norm_w, mm.eps, mm.m, mm.k, v->bufs[k->norm]);
    }
    for (int j = 0; j < k->n_mm; j++) {
        uint32_t w = g->nodes[k->mm[j]].src[1], d = k->dst[j];
        mm.out[j] = (kiln_cpu_mm_out){.w = v->bufs[w], .wt = (kiln_dtype)g->nodes[w].dtype, .n = v->dims[w][0],
                                      .y = v->bufs[d],
                                      .residual = k->resid[j] != KILN_IDX_NONE ? v->bufs[k->resid[j]] : NULL,
                                      .bias = k->bias[j] != KILN_IDX_NONE ? v->bufs[k->bias[j]] : NULL};
        if (g->nodes[d].dtype != KILN_DTYPE_F32 && !(k->swiglu && j == 1)) {
            int64_t last, n = rows_of(v, d, &last) * last;
            if (!(stage[1 + j] = stage_new(n))) st = KILN_ERR_NOMEM;
            mm.out[j].y = stage[1 + j];
        }
    }
    if (k->swiglu) mm.out[1].y = NULL;
    if (st == KILN_OK) st = kiln_cpu_matmul(s->pool, s->isa, &mm);
    for (int j = 0; j < k->n_mm; j++) {
        if (!stage[1 + j]) continue;
        int64_t last, n = rows_of(v, k->dst[j], &last) * last;
        if (st == KILN_OK && n > 0) st = kiln_quantize((kiln_dtype)g->nodes[k->dst[j]].dtype, stage[1 + j], v->bufs[k->dst[j]], n);
    }
    for (int i = 0; i < 5; i++) free(stage[i]);
    return st;
}

/* Attention written as ops, one pass: per query row, scores over S keys (never stored), softmax,
 * weighted sum of v. Rows are split over the threads. */
typedef struct sdpa_job {
    const float *q, *k, *v, *mask; /* operands */
    float       *y, *scratch;      /* output [T, d]; S floats per thread */
    int64_t      T, S, d, dv;      /* queries, keys, q/k width, v width */
    float        scale;            /* score scale */
    bool         v_rows;           /* v is [S, d] (else [d, S]) */
} sdpa_job;

static void sdpa_rows(void *arg, int tid, int nth)
{
    const sdpa_job *j = arg;
    float *sc = j->scratch + (size_t)tid * j->S;
    for (int64_t t = tid; t < j->T; t += nth) {
        const float *qt = j->q + t * j->d;
        float mx = -INFINITY;
        for (int64_t s = 0; s < j->S; s++) {
            const float *ks = j->k + s * j->d;
            float acc = 0;
            for (int64_t i = 0; i < j->d; i++) acc += qt[i] * ks[i];
            sc[s] = acc * j->scale + (j->mask ? j->mask[t * j->S + s] : 0);
            mx = sc[s] > mx ? sc[s] : mx;
        }
        float sum = 0;
        for (int64_t s = 0; s < j->S; s++) sum += (sc[s] = mx == -INFINITY ? 0 : expf(sc[s] - mx));
        float inv = sum > 0 ? 1 / sum : 0, *yt = j->y + t * j->dv;
        for (int64_t i = 0; i < j->dv; i++) yt[i] = 0;
        for (int64_t s = 0; s < j->S; s++) {
            float p = sc[s] * inv;
            if (j->v_rows)
                for (int64_t i = 0; i < j->dv; i++) yt[i] += p * j->v[s * j->dv + i];
            else
                for (int64_t i = 0; i < j->dv; i++) yt[i] += p * j->v[i * j->S + s];
        }
    }
}

static kiln_status run_sdpa(cpu_state *s, const struct kiln_kernel *k, const kiln_exec_view *v)
{
    sdpa_job j = {.q = v->bufs[k->sq], .k = v->bufs[k->sk], .v = v->bufs[k->sv], .y = v->bufs[k->sout],
                  .mask = k->smask != KILN_IDX_NONE ? v->bufs[k->smask] : NULL, .scale = k->sscale, .v_rows = k->sv_rows,
                  .T = v->dims[k->sq][0], .d = v->dims[k->sq][1], .S = v->dims[k->sk][0], .dv = v->dims[k->sout][1]};
    int nth = kiln_cpu_pool_threads(s->pool);
    if (!(j.scratch = kiln_cpu_pool_scratch(s->pool, (size_t)nth * (size_t)j.S * sizeof(float)))) return KILN_ERR_NOMEM;
    kiln_cpu_pool_run(s->pool, sdpa_rows, &j);
    return KILN_OK;
}

static kiln_status launch_locked(cpu_state *s, const kiln_kernel *k, const kiln_exec_view *v, char *err, size_t n_err);

static kiln_status cpu_launch(void *state, const kiln_kernel *k, const kiln_region *r, const kiln_exec_view *v,
                              char *err, size_t n_err)
{
    cpu_state *s = state;
    pthread_mutex_lock(&s->mu);
    kiln_status st = launch_locked(s, k, v, err, n_err);
    pthread_mutex_unlock(&s->mu);
    return st;
}

static kiln_status launch_locked(cpu_state *s, const kiln_kernel *k, const kiln_exec_view *v, char *err, size_t n_err)
{
    if (k->sdpa) {
        kiln_status st = run_sdpa(s, k, v);
        if (st != KILN_OK) snprintf(err, n_err, "attention from ops (#%u) failed: %s", k->sout, kiln_status_str(st));
        return st;
    }
    if (k->fused) {
        kiln_status st = run_fused(s, k, v);
        if (st != KILN_OK) {
            const kiln_node_rec *a = &v->g->nodes[k->mm[0]];
            snprintf(err, n_err, "fused matmul '%s' (#%u) failed: %s", a->name ? a->name : "", k->mm[0], kiln_status_str(st));
            return st;
        }
    }
    for (uint32_t i = 0; i < k->n_rest; i++) {
        kiln_status st = kiln_cpu_node_run(s->pool, s->isa, v, k->rest[i], err, n_err);
        if (st != KILN_OK) {
            if (!err[0]) snprintf(err, n_err, "%s kernel failed: %s", kiln_op_name((enum kiln_op)v->g->nodes[k->rest[i]].op),
                                  kiln_status_str(st));
            return st;
        }
    }
    return KILN_OK;
}

const kiln_backend_i kiln_backend_cpu = {
    .name = "cpu",
    .probe = cpu_probe,
    .release = cpu_release,
    .supports = cpu_supports,
    .profile = cpu_profile,
    .calibrate = cpu_calibrate,
    .compile = cpu_compile,
    .kernel_free = cpu_kernel_free,
    .identity = cpu_identity,
    .kernel_save = cpu_kernel_save,
    .kernel_load = cpu_kernel_load,
    .launch = cpu_launch,
};

KILN_API const char *kiln_cpu_isa(const kiln_ctx *ctx)
{
    (void)ctx;
    return kiln_cpu_isa_name(kiln_cpu_isa_detect());
}
