/* The lowering's entry point: a dispatch table from region kind to the templates that may take
 * it, in order, with the row guards between them (matmul: the GEMM for runs of many rows, gemv
 * for the few; attention: its own three kernels). Every template lives in its own file; the
 * helpers they share are in lower_util.c. Must not print any target's text. */
#include "codegen/lower.h"
#include "graph/dtype.h"

#include <string.h>

/* A template: lowers region r into out[0..*n) or says why not (KILN_ERR_UNSUPPORTED). */
typedef kiln_status (*kl_template)(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                                   kiln_kir out[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err);

static kiln_status map_1(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                         kiln_kir out[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err)
{
    *n = 1;
    return kiln_lower_map(g, r, tg, out, err, n_err);
}

static kiln_status rows_1(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                          kiln_kir out[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err)
{
    *n = 1;
    return kiln_lower_rows(g, r, tg, out, err, n_err);
}

static kiln_status move_1(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                          kiln_kir out[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err)
{
    *n = 1;
    return kiln_lower_move(g, r, tg, out, err, n_err);
}

/* all_reduce on one device is a copy; the parts of a split plan meet in the group executor (the
 * cuda backend's NCCL call takes the region's place there). */
static kiln_status collective_1(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                                kiln_kir out[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err)
{
    (void)err, (void)n_err;
    *n = 1;
    return kiln_lower_copy(g, r, tg, out);
}

/* The x of a matmul region's first matmul (any node of its shape gives the run's rows). */
static uint32_t matmul_x(const kiln_graph *g, const kiln_region *r)
{
    for (uint32_t i = 0; i < r->n_nodes; i++)
        if (g->nodes[r->nodes[i]].op == KILN_OP_MATMUL) return g->nodes[r->nodes[i]].src[0];
    return g->nodes[r->anchor].src[0];
}

/* A one-row gemv beside the region's gemv of up to `cap` rows (0: its own bound) when that one takes
 * more than a row a pass: a decode step through a prefill-sized plan then runs the kernel a decode
 * plan has (an 8-row pass repeats the dots and registers for 7 idle rows: 116 against 64 registers,
 * 3x the q4_k step on the H100) and the wide gemv only the runs of 2..cap rows. out[*n] holds the
 * wide gemv; the one-row kernel goes to out[*n + 1]. False (nothing added) where it does not apply. */
static bool gemv_one(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *out, uint32_t x,
                     int64_t K, int64_t cap)
{
    int64_t rows = kl_numel_max(g, &g->nodes[x]) / K;
    if (tg->opts.decode_kernels == KILN_GEMM_OFF || (cap && rows > cap ? cap : rows) <= 1) return false;
    char e2[160];
    if (kiln_lower_gemv_cap(g, r, tg, &out[1], 1, e2, sizeof e2) != KILN_OK) return false;
    kl_guard_rows(&out[1], g, x, K, 1, KILN_IDX_NONE, 0, true);
    return true;
}

/* Beside the GEMM of a prefill-sized plan (out[0..*n)), the persistent GEMM with splits of K for runs
 * of KL_SMALL_ROWS < rows <= KL_SPLITK_ROWS (batched decode through a serving plan: the plan's GEMM
 * leaves most SMs idle at those rows), where the options and the target allow it and it splits;
 * appended at out[*n..] with its guard. Whether it was. */
static bool splitk_variant(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir out[KILN_LOWER_MAX],
                           uint32_t *n, uint32_t x, int64_t K)
{
    if (tg->opts.gemm_persist == KILN_GEMM_OFF || tg->opts.gemm_splitk == KILN_GEMM_OFF || !tg->wgmma ||
        kl_numel_max(g, &g->nodes[x]) / K <= KL_SPLITK_ROWS || *n + 5 > KILN_LOWER_MAX)
        return false;
    for (uint32_t i = 0; i < *n; i++)
        if (!strcmp(out[i].name, "kiln_gemm_reduce")) return false; /* the plan's own GEMM splits */
    kiln_kir v[KILN_LOWER_MAX];
    uint32_t nv = 0;
    char e2[160];
    bool split = false;
    if (kiln_lower_gemm_cap(g, r, tg, v, &nv, KL_SPLITK_ROWS, e2, sizeof e2) == KILN_OK)
        for (uint32_t i = 0; i < nv; i++) split = split || !strcmp(v[i].name, "kiln_gemm_reduce");
    if (!split || *n + nv + 2 > KILN_LOWER_MAX) {
        for (uint32_t i = 0; i < nv; i++) kiln_kir_free(&v[i]);
        return false;
    }
    for (uint32_t i = 0; i < nv; i++) {
        out[*n] = v[i];
        kl_guard_rows_range(&out[(*n)++], g, x, K, KL_SMALL_ROWS, KL_SPLITK_ROWS);
    }
    return true;
}

/* The GEMM unless the options say gemv (A/B runs): on the H100 it runs a 512-token llama-7b
 * layer's matmuls 19x faster than gemv's passes. gemv takes what the GEMM does not (few rows,
 * other shapes), and, guarded by the run's rows, the short runs of a prefill plan; runs of one row
 * take a one-row gemv (gemv_one). */
static kiln_status matmul(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg,
                          kiln_kir out[KILN_LOWER_MAX], uint32_t *n, char *err, size_t n_err)
{
    kiln_status s = tg->opts.gemm != KILN_GEMM_OFF && tg->mma ? kiln_lower_gemm(g, r, tg, out, n, err, n_err)
                                                              : KILN_ERR_UNSUPPORTED;
    uint32_t x = matmul_x(g, r);
    int64_t K = g->nodes[x].dims[g->nodes[x].rank - 1];
    if (s == KILN_ERR_UNSUPPORTED) {
        err[0] = 0;
        *n = 1;
        if ((s = kiln_lower_gemv(g, r, tg, out, err, n_err)) != KILN_OK || kiln_dim_is_sym(K) || K < 1) return s;
        if (gemv_one(g, r, tg, out, x, K, 0)) { /* the passes' gemv takes runs of more than one row */
            kl_guard_rows(&out[0], g, x, K, 1, KILN_IDX_NONE, 0, false);
            *n = 2;
        }
        return KILN_OK;
    }
    if (s != KILN_OK) return s;
    char e2[160];
    uint32_t n_big = *n;
    int64_t big_lo = splitk_variant(g, r, tg, out, n, x, K) ? KL_SPLITK_ROWS : KL_SMALL_ROWS;
    if (kiln_lower_gemv_cap(g, r, tg, &out[*n], KL_SMALL_ROWS, e2, sizeof e2) != KILN_OK) {
        kiln_kir_free(&out[*n]);
        return KILN_OK;
    }
    for (uint32_t i = 0; i < n_big; i++) kl_guard_rows(&out[i], g, x, K, big_lo, KILN_IDX_NONE, 0, false);
    if (*n + 2 <= KILN_LOWER_MAX && gemv_one(g, r, tg, &out[*n], x, K, KL_SMALL_ROWS)) {
        kl_guard_rows_range(&out[*n], g, x, K, 1, KL_SMALL_ROWS);
        *n += 2;
        return KILN_OK;
    }
    kl_guard_rows(&out[*n], g, x, K, KL_SMALL_ROWS, KILN_IDX_NONE, 0, true);
    (*n)++;
    return KILN_OK;
}

static const kl_template templates[KILN_REGION_KIND_COUNT] = {
    [KILN_REGION_MAP] = map_1,      [KILN_REGION_ROWS] = rows_1,
    [KILN_REGION_MATMUL] = matmul,  [KILN_REGION_ATTENTION] = kiln_lower_attention,
    [KILN_REGION_SCATTER] = move_1, [KILN_REGION_MOVE] = move_1,
    [KILN_REGION_COLLECTIVE] = collective_1,
};

/* A block format the GPU templates do not read (the dtype table's gpu member: q4_0, q5_0,
 * iq4_nl, q2_K, ...) would be misread as raw bytes, so a region touching one is refused by name
 * and placement keeps it on the cpu. */
static kiln_status check_dtypes(const kiln_graph *g, const kiln_region *r, char *err, size_t n_err)
{
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[r->nodes[i]];
        for (int k = 0; k < n->n_src; k++) {
            const kiln_node_rec *s = n->src[k] != KILN_IDX_NONE ? &g->nodes[n->src[k]] : NULL;
            if (s && !kiln_dtype_on_gpu((kiln_dtype)s->dtype))
                return kl_unsupported(err, n_err, "'%s' is %s: the GPU backends have no kernel for that format (it runs "
                                      "on cpu)", s->name ? s->name : "a weight", kiln_dtype_name((kiln_dtype)s->dtype));
        }
    }
    return KILN_OK;
}

kiln_status kiln_lower_region_seq(const kiln_graph *g, const kiln_region *r, kiln_kir out[KILN_LOWER_MAX],
                                  uint32_t *n_out, char *err, size_t n_err)
{
    return kiln_lower_region_for(g, r, NULL, out, n_out, err, n_err);
}

kiln_status kiln_lower_region_for(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *t,
                                  kiln_kir out[KILN_LOWER_MAX], uint32_t *n_out, char *err, size_t n_err)
{
    const kiln_lower_target def = kiln_lower_target_default(), *tg = t ? t : &def;
    memset(out, 0, KILN_LOWER_MAX * sizeof *out);
    *n_out = 0;
    err[0] = 0;
    kiln_status s = check_dtypes(g, r, err, n_err);
    if (s != KILN_OK) return s;
    uint32_t n = 1;
    kl_template fn = r->kind < KILN_REGION_KIND_COUNT ? templates[r->kind] : NULL;
    s = fn ? fn(g, r, tg, out, &n, err, n_err)
           : kl_unsupported(err, n_err, "region kind %s has no kernel template",
                            kiln_region_kind_name((enum kiln_region_kind)r->kind));
    for (uint32_t i = 0; s == KILN_OK && i < n && kiln_lower_target_pdl(tg); i++) kl_pdl_apply(&out[i], g);
    for (uint32_t i = 0; s == KILN_OK && i < n; i++)
        if (!kiln_kir_verify(&out[i], err, n_err)) s = KILN_ERR_INTERNAL;
    if (s != KILN_OK) {
        for (uint32_t i = 0; i < KILN_LOWER_MAX; i++) kiln_kir_free(&out[i]);
        return s;
    }
    *n_out = n;
    return KILN_OK;
}
