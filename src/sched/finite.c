/* The NaN/Inf guard of kiln_compile_options.check_finite: after a region ran, scans every value it
 * stored (region outputs; on the host also the cache rows a kv_scatter wrote) and names the first
 * non-finite one. Device regions are synced and their outputs copied to a host buffer first.
 * Called by the executor only when the option is on; must not contain kernels. */
#include "graph/dtype.h"
#include "sched/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether any lane of the 64-bit words of buf (n bytes, a multiple of 8) has an exponent field
 * of all ones: per lane, (x & exp) + exp_lsb carries into the lane's top bit exactly then (no carry
 * crosses lanes). Branch-free, 8 bytes a step. */
static bool any_all_ones(const unsigned char *buf, size_t n, uint64_t exp, uint64_t lsb, uint64_t top)
{
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w;
        memcpy(&w, buf + i, 8);
        acc |= (w & exp) + lsb;
    }
    return (acc & top) != 0;
}

/* Index of the first element of n values of dtype t whose exponent bits are all ones (NaN or
 * infinity), or -1. A fast pass says whether there is one; only then is the index looked for. */
static int64_t first_nonfinite(kiln_dtype t, const void *data, int64_t n)
{
    if (t == KILN_DTYPE_F32) {
        const uint32_t *u = data;
        int64_t words = n / 2;
        if (!any_all_ones(data, (size_t)words * 8, 0x7f8000007f800000ull, 0x0080000000800000ull, 0x8000000080000000ull) &&
            (n % 2 == 0 || (u[n - 1] & 0x7f800000u) != 0x7f800000u))
            return -1;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u) return i;
    } else if (t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16) {
        const uint16_t *h = data;
        uint16_t e = t == KILN_DTYPE_F16 ? 0x7c00u : 0x7f80u, l = t == KILN_DTYPE_F16 ? 0x0400u : 0x0080u;
        int64_t words = n / 4;
        bool any = any_all_ones(data, (size_t)words * 8, e * 0x0001000100010001ull, l * 0x0001000100010001ull, 0x8000800080008000ull);
        for (int64_t i = words * 4; i < n; i++) any |= (h[i] & e) == e;
        if (!any) return -1;
        for (int64_t i = 0; i < n; i++)
            if ((h[i] & e) == e) return i;
    }
    return -1;
}

static float value_at(kiln_dtype t, const void *data, int64_t i)
{
    if (t == KILN_DTYPE_F32) return ((const float *)data)[i];
    uint16_t h = ((const uint16_t *)data)[i];
    return t == KILN_DTYPE_F16 ? kiln_f16_to_f32(h) : kiln_bf16_to_f32(h);
}

static bool is_float(uint8_t t) { return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16; }

/* Builds the error: node, value, element, shape, region, backend. */
static kiln_status report(kiln_plan *p, uint32_t r, uint32_t node, kiln_dtype t, float v, int64_t elem, const char *where)
{
    const kiln_graph *g = p->g;
    const kiln_node_rec *n = &g->nodes[node];
    char lab[160], dims[160], extra[96] = "";
    if (n->name) snprintf(lab, sizeof lab, "%s '%.100s' (node #%u)", kiln_op_name((enum kiln_op)n->op), n->name, node);
    else snprintf(lab, sizeof lab, "%s #%u", kiln_op_name((enum kiln_op)n->op), node);
    int64_t shape[KILN_MAX_RANK];
    memcpy(shape, p->dims[node], sizeof shape);
    kiln_graph_dims_str(g, n->rank, shape, dims, sizeof dims);
    if (where) snprintf(extra, sizeof extra, " (%s)", where);
    kiln_region_info info;
    if (kiln_plan_region(p, (int)r, &info) != KILN_OK) {
        memset(&info, 0, sizeof info);
        info.kind = "?";
    }
    return kiln_ctx_fail(p->ctx, KILN_ERR_NONFINITE, "%s is %s at element %lld%s of %s %s; region %u (%s: %s) on %s", lab,
                         v != v ? "NaN" : v > 0 ? "+inf" : "-inf", (long long)elem, extra, kiln_dtype_name(t), dims, r,
                         info.kind, info.ops, kiln_backends[p->region_be[r]]->name);
}

/* The rows kv_scatter node i wrote into its host state this run: state[h, pos[t], :]. */
static kiln_status check_scatter_host(kiln_plan *p, uint32_t r, uint32_t i)
{
    const kiln_graph *g = p->g;
    const kiln_node_rec *n = &g->nodes[i];
    uint32_t st = n->src[0], rows = n->src[1], pos = n->src[2];
    kiln_dtype t = (kiln_dtype)g->nodes[st].dtype;
    const unsigned char *base = p->bufs[i];
    const int32_t *pv = p->bufs[pos];
    if (!is_float(t) || !base || !pv) return KILN_OK;
    int64_t H = p->dims[st][0], ctx = p->dims[st][1], D = p->dims[st][2], T = p->dims[rows][0];
    size_t es = kiln_dtype_block_bytes(t);
    for (int64_t tok = 0; tok < T; tok++) {
        if (pv[tok] < 0 || pv[tok] >= ctx) continue; /* the kernel refused it already */
        for (int64_t h = 0; h < H; h++) {
            const unsigned char *row = base + ((size_t)(h * ctx + pv[tok]) * (size_t)D) * es;
            int64_t e = first_nonfinite(t, row, D);
            if (e >= 0) {
                char where[96];
                snprintf(where, sizeof where, "cache row %d of kv head %lld, from token %lld", pv[tok], (long long)h, (long long)tok);
                return report(p, r, i, t, value_at(t, row, e), (h * ctx + pv[tok]) * D + e, where);
            }
        }
    }
    return KILN_OK;
}

kiln_status kiln_sched_check_finite(kiln_plan *p, uint32_t r)
{
    const kiln_graph *g = p->g;
    const kiln_region *reg = &p->fusion.regions[r];
    int be = p->region_be[r];
    const kiln_backend_i *b = kiln_backends[be];
    bool dev = kiln_backend_is_device(b);
    char err[512] = "";
    if (dev && b->sync(p->ctx->be_state[be], err, sizeof err) != KILN_OK)
        return kiln_ctx_fail(p->ctx, KILN_ERR_BACKEND, "%s: running region %u: %s", b->name, r, err);
    for (uint32_t k = 0; k < reg->n_outs; k++) {
        uint32_t i = reg->outs[k];
        const kiln_node_rec *n = &g->nodes[i];
        if (n->op == KILN_OP_KV_SCATTER) {
            if (dev) continue; /* the rows' readers (attention) are scanned instead */
            kiln_status s = check_scatter_host(p, r, i);
            if (s != KILN_OK) return s;
            continue;
        }
        if (!is_float(n->dtype)) continue;
        int64_t numel = 1;
        for (int d = 0; d < n->rank; d++) numel *= p->dims[i][d];
        size_t bytes = kiln_node_bytes(n, p->dims[i]);
        if (numel <= 0 || bytes == 0) continue;
        const void *data = p->bufs[i];
        if (dev) {
            if (bytes > p->finite_cap) {
                void *m = realloc(p->finite_buf, bytes);
                if (!m) return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "check_finite: out of memory (%zu bytes)", bytes);
                p->finite_buf = m;
                p->finite_cap = bytes;
            }
            void *st = p->ctx->be_state[be];
            kiln_status s = b->download(st, p->finite_buf, p->dev[be].bufs[i], bytes, err, sizeof err);
            if (s == KILN_OK) s = b->sync(st, err, sizeof err);
            if (s != KILN_OK) return kiln_ctx_fail(p->ctx, s, "%s: check_finite: reading region %u back: %s", b->name, r, err);
            data = p->finite_buf;
        }
        if (!data) continue;
        int64_t e = first_nonfinite((kiln_dtype)n->dtype, data, numel);
        if (e >= 0) return report(p, r, i, (kiln_dtype)n->dtype, value_at((kiln_dtype)n->dtype, data, e), e, NULL);
    }
    return KILN_OK;
}
