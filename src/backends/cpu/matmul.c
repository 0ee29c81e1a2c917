/* The fused matmul region driver: validates a kiln_cpu_mm, runs the rms_norm prologue once and
 * prepares the activation formats the weights need (f32, q8 blocks of 32, q8_K), then splits the
 * output columns of all outputs into chunks that threads take dynamically, calls the ISA kernel
 * per chunk and applies the epilogue (bias, residual, swiglu) while the chunk is hot in cache.
 * Must not contain ISA intrinsics: the inner loops live in the kern_* files. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/kern.h"

#define PREP_INLINE_MAX 32768 /* m*k up to which the prologue runs on the caller alone */

typedef struct mm_group {
    int      o0, o1;   /* outputs computed by this group (o1 = -1 unless swiglu) */
    int64_t  n;        /* columns */
    int64_t  units;    /* chunks */
    int64_t  base;     /* index of its first unit */
} mm_group;

typedef struct mm_job {
    const kiln_cpu_mm   *mm;                     /* the region */
    const kiln_cpu_kern *kt;                     /* kernel table */
    float               *xhat;                   /* normalized rows [m, k] (NULL: none, use mm->x) */
    void                *xa[KILN_CPU_ACT_COUNT]; /* prepared activations per format (NULL: unused) */
    size_t               xs[KILN_CPU_ACT_COUNT]; /* their row strides in bytes */
    mm_group             g[4];                   /* output groups */
    int                  n_groups;               /* groups in use */
    int64_t              chunk;                  /* columns per unit */
    int64_t              n_units;                /* units over all groups */
    atomic_llong         next;                   /* next unit to take */
    char                *tmp;                    /* per-thread output tiles (run_unit) */
    size_t               tmp_bytes;              /* bytes per thread */
    size_t               off[KILN_CPU_ACT_COUNT + 1]; /* scratch offsets (plan_job): xhat, formats, tiles */
    size_t               bytes;                  /* scratch bytes of the job */
} mm_job;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static kiln_status validate(const kiln_cpu_kern *kt, const kiln_cpu_mm *mm)
{
    if (!mm || !mm->x || mm->m < 1 || mm->k < 1 || mm->n_out < 1 || mm->n_out > 4)
        return KILN_ERR_INVALID_ARG;
    for (int o = 0; o < mm->n_out; o++) {
        const kiln_cpu_mm_out *u = &mm->out[o];
        if (!u->w || u->n < 1 || (!u->y && !(mm->swiglu && o == 1)))
            return KILN_ERR_INVALID_ARG;
        if ((unsigned)u->wt >= KILN_DTYPE_COUNT || !kt->mm[u->wt])
            return KILN_ERR_DTYPE;
        if (mm->k % kiln_dtype_block(u->wt) != 0)
            return KILN_ERR_SHAPE;
    }
    if (mm->swiglu && (mm->n_out != 2 || mm->out[0].n != mm->out[1].n))
        return KILN_ERR_SHAPE;
    if (mm->swiglu && (mm->out[0].bias || mm->out[1].bias))
        return KILN_ERR_INVALID_ARG; /* the swiglu epilogue takes no bias */
    return KILN_OK;
}

/* Normalizes row i (if asked) and writes every prepared format of it. */
static void prep_row(mm_job *j, int64_t i)
{
    const kiln_cpu_mm *mm = j->mm;
    const float *xr = mm->x + i * mm->k;
    if (j->xhat) {
        float *h = j->xhat + i * mm->k;
        double s4[4] = {0, 0, 0, 0}; /* four chains: one would wait on each add's latency */
        int64_t t = 0;
        for (; t + 4 <= mm->k; t += 4)
            for (int u = 0; u < 4; u++)
                s4[u] += (double)xr[t + u] * xr[t + u];
        for (; t < mm->k; t++)
            s4[0] += (double)xr[t] * xr[t];
        double ss = (s4[0] + s4[1]) + (s4[2] + s4[3]);
        double r = 1.0 / sqrt(ss / (double)mm->k + (double)mm->eps); /* f64: below f32's normals for huge rows */
        if (mm->norm_w)
            for (t = 0; t < mm->k; t++)
                h[t] = (float)(xr[t] * r * mm->norm_w[t]);
        else
            for (t = 0; t < mm->k; t++)
                h[t] = (float)(xr[t] * r);
        xr = h;
    }
    for (int a = KILN_CPU_ACT_Q8_0; a < KILN_CPU_ACT_COUNT; a++)
        if (j->xa[a])
            kiln_cpu_quant_row((enum kiln_cpu_act)a, xr, mm->k, (char *)j->xa[a] + (size_t)i * j->xs[a]);
}

static void prep_fn(void *arg, int tid, int nth)
{
    mm_job *j = arg;
    int64_t m = j->mm->m;
    for (int64_t i = m * tid / nth; i < m * (tid + 1) / nth; i++)
        prep_row(j, i);
}

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

/* y = t + r over cw values (fixed blocks of 16 let the compiler vectorize it at -O2). */
static void add_row(float *restrict y, const float *restrict t, const float *restrict r, int64_t cw)
{
    int64_t c = 0;
    for (; c + 16 <= cw; c += 16)
        for (int v = 0; v < 16; v++)
            y[c + v] = t[c + v] + r[c + v];
    for (; c < cw; c++)
        y[c] = t[c] + r[c];
}

/* y += b over cw values. */
static void add_bias(float *restrict y, const float *restrict b, int64_t cw)
{
    for (int64_t c = 0; c < cw; c++)
        y[c] += b[c];
}

/* y[i, c0 .. c0 + cw) = t[i, 0 .. cw) (+ bias) (+ residual) for every row: t is a unit's compact output. */
static void store_unit(const kiln_cpu_mm_out *o, int64_t m, int64_t n, int64_t c0, int64_t cw, float *t)
{
    for (int64_t i = 0; o->bias && i < m; i++)
        add_bias(t + i * cw, o->bias + c0, cw);
    for (int64_t i = 0; i < m; i++) {
        if (o->residual)
            add_row(o->y + i * n + c0, t + i * cw, o->residual + i * n + c0, cw);
        else
            memcpy(o->y + i * n + c0, t + i * cw, (size_t)cw * sizeof(float));
    }
}

/* Computes columns [c0, c0 + cw) of group g. With many rows (the GEMM path) the kernels write a
 * compact per-thread tile (row stride cw), which the epilogue then copies to y: the GEMM revisits
 * its output once per k-block, and rows n floats apart spread that over many lines and pages
 * (f32, n = 4864: 4% slower written in place). */
static void run_unit(mm_job *j, const mm_group *g, int64_t c0, int64_t cw, int tid)
{
    const kiln_cpu_mm *mm = j->mm;
    const int64_t m = mm->m, k = mm->k, n = g->n;
    const kiln_cpu_mm_out *o0 = &mm->out[g->o0];
    enum kiln_cpu_act a0 = kiln_cpu_act_of(o0->wt);
    size_t ws0 = kiln_row_bytes(o0->wt, k);
    const char *w0 = (const char *)o0->w + (size_t)c0 * ws0;
    float *t0 = (float *)(j->tmp + (size_t)tid * j->tmp_bytes);
    if (g->o1 < 0) {
        if (m > 8) {
            j->kt->mm[o0->wt](k, w0, ws0, cw, j->xa[a0], j->xs[a0], m, t0, cw);
            store_unit(o0, m, n, c0, cw, t0);
            return;
        }
        j->kt->mm[o0->wt](k, w0, ws0, cw, j->xa[a0], j->xs[a0], m, o0->y + c0, n);
        for (int64_t i = 0; o0->bias && i < m; i++)
            add_bias(o0->y + i * n + c0, o0->bias + c0, cw);
        if (o0->residual)
            for (int64_t i = 0; i < m; i++)
                for (int64_t c = c0; c < c0 + cw; c++)
                    o0->y[i * n + c] += o0->residual[i * n + c];
        return;
    }
    const kiln_cpu_mm_out *o1 = &mm->out[g->o1];
    enum kiln_cpu_act a1 = kiln_cpu_act_of(o1->wt);
    size_t ws1 = kiln_row_bytes(o1->wt, k);
    const char *w1 = (const char *)o1->w + (size_t)c0 * ws1;
    float *t1 = t0 + m * cw;
    j->kt->mm[o0->wt](k, w0, ws0, cw, j->xa[a0], j->xs[a0], m, t0, cw);
    j->kt->mm[o1->wt](k, w1, ws1, cw, j->xa[a1], j->xs[a1], m, t1, cw);
    for (int64_t i = 0; i < m; i++) {
        const float *gr = t0 + i * cw, *ur = t1 + i * cw, *rr = o0->residual ? o0->residual + i * n + c0 : NULL;
        float *yr = o0->y + i * n + c0;
        if (j->kt->swiglu) {
            j->kt->swiglu(cw, gr, ur, rr, yr);
            continue;
        }
        for (int64_t c = 0; c < cw; c++) {
            float v = silu(gr[c]) * ur[c];
            yr[c] = rr ? v + rr[c] : v;
        }
    }
}

/* Unit u of job j: the columns of its group that the unit covers. */
static void job_unit(mm_job *j, int64_t u, int tid)
{
    int gi = 0;
    while (gi + 1 < j->n_groups && u >= j->g[gi + 1].base)
        gi++;
    const mm_group *g = &j->g[gi];
    int64_t c0 = (u - g->base) * j->chunk;
    int64_t cw = g->n - c0 < j->chunk ? g->n - c0 : j->chunk;
    run_unit(j, g, c0, cw, tid);
}

static void mm_fn(void *arg, int tid, int nth)
{
    mm_job *j = arg;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (u >= j->n_units)
            return;
        job_unit(j, u, tid);
    }
}

/* Columns per unit, in whole weight tiles of the kernels. Few rows (m <= 8): multiples of 12 (4x3
 * float tiles, 4-row GEMVs), 8 units per thread, at most 240 columns. More rows: multiples of 16
 * (the GEMM's panels: 16 float or 2 x 8 quantized weight rows), 32 units per thread (a unit is
 * long here, and the last one decides when a thread idles; units of 16 columns measured as fast
 * as units of 64 on one thread, since the GEMM packs each panel once per call either way), at
 * most 64 columns so the output tiles (up to 2 x m x 64 floats) stay in L2. Unit boundaries
 * then fall on 64-byte lines of y. */
static int64_t pick_chunk(const kiln_cpu_mm *mm, int64_t total, int nth)
{
    if (mm->m > 8) {
        int64_t c = (total + nth * 32 - 1) / (nth * 32);
        c = (c + 15) / 16 * 16;
        return c > 64 ? 64 : c;
    }
    int64_t c = (total + nth * 8 - 1) / (nth * 8);
    c = (c + 11) / 12 * 12;
    return c < 12 ? 12 : c > 240 ? 240 : c;
}

/* Plans a job for nth threads: groups, units, and its scratch layout (xhat, prepared formats,
 * per-thread output tiles) as offsets from the start of its scratch (j->off, j->bytes). */
static void plan_job(mm_job *j, int nth)
{
    const kiln_cpu_mm *mm = j->mm;
    bool need[KILN_CPU_ACT_COUNT] = {false};
    int64_t total = 0;
    for (int o = 0; o < mm->n_out; o++)
        need[kiln_cpu_act_of(mm->out[o].wt)] = true;
    j->n_groups = 0;
    for (int o = 0; o < mm->n_out; o++) {
        if (mm->swiglu && o == 1)
            continue;
        mm_group *g = &j->g[j->n_groups++];
        g->o0 = o;
        g->o1 = mm->swiglu ? 1 : -1;
        g->n = mm->out[o].n;
        total += g->n;
    }
    j->chunk = pick_chunk(mm, total, nth);
    j->n_units = 0;
    for (int gi = 0; gi < j->n_groups; gi++) {
        j->g[gi].base = j->n_units;
        j->g[gi].units = (j->g[gi].n + j->chunk - 1) / j->chunk;
        j->n_units += j->g[gi].units;
    }
    size_t sz = 0;
    size_t xhat_b = mm->norm ? align64((size_t)(mm->m * mm->k) * sizeof(float)) : 0;
    j->off[0] = sz, sz += xhat_b;
    for (int a = KILN_CPU_ACT_Q8_0; a < KILN_CPU_ACT_COUNT; a++) {
        j->xs[a] = kiln_cpu_act_row_bytes((enum kiln_cpu_act)a, mm->k);
        j->off[a] = sz;
        if (need[a])
            sz += align64(j->xs[a] * (size_t)mm->m);
        else
            j->off[a] = SIZE_MAX; /* format not used */
    }
    int tiles = mm->swiglu ? 2 : mm->m > 8 ? 1 : 0; /* compact output tiles per thread (run_unit) */
    j->tmp_bytes = align64((size_t)(tiles * mm->m * j->chunk) * sizeof(float));
    j->off[KILN_CPU_ACT_COUNT] = sz, sz += j->tmp_bytes * (size_t)nth;
    j->bytes = sz;
}

/* Points the job's scratch at s (64-byte aligned, j->bytes long). */
static void bind_job(mm_job *j, char *s)
{
    const kiln_cpu_mm *mm = j->mm;
    j->xhat = mm->norm ? (float *)(s + j->off[0]) : NULL;
    j->xa[KILN_CPU_ACT_F32] = (void *)(j->xhat ? j->xhat : mm->x);
    j->xs[KILN_CPU_ACT_F32] = (size_t)mm->k * sizeof(float);
    for (int a = KILN_CPU_ACT_Q8_0; a < KILN_CPU_ACT_COUNT; a++)
        j->xa[a] = j->off[a] != SIZE_MAX ? s + j->off[a] : NULL;
    j->tmp = s + j->off[KILN_CPU_ACT_COUNT];
}

/* Lays out scratch: xhat, prepared formats, per-thread output tiles. */
static kiln_status setup(kiln_cpu_pool *pool, mm_job *j)
{
    plan_job(j, kiln_cpu_pool_threads(pool));
    char *s = kiln_cpu_pool_scratch(pool, j->bytes + 64);
    if (!s)
        return KILN_ERR_NOMEM;
    bind_job(j, s);
    return KILN_OK;
}

kiln_status kiln_cpu_matmul(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const kiln_cpu_mm *mm)
{
    if (!pool)
        return KILN_ERR_INVALID_ARG;
    const kiln_cpu_kern *kt = kiln_cpu_kern_get(isa);
    kiln_status st = validate(kt, mm);
    if (st != KILN_OK)
        return st;
    mm_job j;
    memset(&j, 0, sizeof j);
    j.mm = mm;
    j.kt = kt;
    if ((st = setup(pool, &j)) != KILN_OK)
        return st;
    bool any_prep = j.xhat || j.xa[KILN_CPU_ACT_Q8_0] || j.xa[KILN_CPU_ACT_Q8_K];
    if (any_prep) {
        if (mm->m * mm->k <= PREP_INLINE_MAX || mm->m == 1)
            prep_fn(&j, 0, 1);
        else
            kiln_cpu_pool_run(pool, prep_fn, &j);
    }
    atomic_init(&j.next, 0);
    kiln_cpu_pool_run(pool, mm_fn, &j);
    return KILN_OK;
}

/* ---------------------------------------------------------------- batches */

/* Independent matmuls sharing one pass of the pool: units numbered across the jobs. */
typedef struct mm_batch {
    mm_job      *jobs;   /* n jobs */
    int64_t     *base;   /* first unit of each job, then the total */
    int          n;      /* jobs */
    atomic_llong next;   /* next unit to take */
} mm_batch;

static void batch_fn(void *arg, int tid, int nth)
{
    (void)nth;
    mm_batch *b = arg;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed);
        if (u >= b->base[b->n])
            return;
        int lo = 0, hi = b->n - 1; /* the job holding unit u: base[lo] <= u < base[lo + 1] */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (b->base[mid] <= u) lo = mid;
            else hi = mid - 1;
        }
        job_unit(&b->jobs[lo], u - b->base[lo], tid);
    }
}

kiln_status kiln_cpu_matmul_batch(kiln_cpu_pool *pool, enum kiln_cpu_isa isa, const kiln_cpu_mm *mm, int n)
{
    if (!pool || n < 0 || (n > 0 && !mm))
        return KILN_ERR_INVALID_ARG;
    if (n <= 1)
        return n ? kiln_cpu_matmul(pool, isa, mm) : KILN_OK;
    const kiln_cpu_kern *kt = kiln_cpu_kern_get(isa);
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++)
        st = validate(kt, &mm[i]);
    if (st != KILN_OK)
        return st;
    mm_batch b = {.jobs = calloc((size_t)n, sizeof *b.jobs), .base = malloc((size_t)(n + 1) * sizeof *b.base), .n = n};
    if (!b.jobs || !b.base) {
        free(b.jobs), free(b.base);
        return KILN_ERR_NOMEM;
    }
    int nth = kiln_cpu_pool_threads(pool);
    size_t total = 0;
    b.base[0] = 0;
    for (int i = 0; i < n; i++) {
        b.jobs[i].mm = &mm[i], b.jobs[i].kt = kt;
        plan_job(&b.jobs[i], nth);
        total += align64(b.jobs[i].bytes);
        b.base[i + 1] = b.base[i] + b.jobs[i].n_units;
    }
    char *s = kiln_cpu_pool_scratch(pool, total + 64);
    if (!s) {
        free(b.jobs), free(b.base);
        return KILN_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        mm_job *j = &b.jobs[i];
        bind_job(j, s);
        s += align64(j->bytes);
        if (j->xhat || j->xa[KILN_CPU_ACT_Q8_0] || j->xa[KILN_CPU_ACT_Q8_K]) {
            if (j->mm->m * j->mm->k <= PREP_INLINE_MAX || j->mm->m == 1)
                prep_fn(j, 0, 1);
            else
                kiln_cpu_pool_run(pool, prep_fn, j);
        }
    }
    atomic_init(&b.next, 0);
    kiln_cpu_pool_run(pool, batch_fn, &b);
    free(b.jobs), free(b.base);
    return KILN_OK;
}
