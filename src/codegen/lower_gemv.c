/* GEMV template for matmul regions with few rows (decode; prefill runs it per chunk of 8 tokens):
 * y_j[t, n] = f(x)[t] . W_j[n] for up to 4 sibling weights sharing x, with the rms_norm prologue
 * and the epilogues (bias/residual add, swiglu, rope, KV-cache write) applied by the warp that
 * owns the output. A warp owns a unit of up to 4 output rows (rope partners and swiglu pairs
 * together), its 32 lanes stride over 16-byte chunks of the rows; the format rows (wfmt.h) turn chunks
 * into values. Must not know any target's syntax. */
#include "codegen/lower_mm.h"
#include "codegen/wfmt.h"

#include <stdlib.h>
#include <string.h>

static uint32_t op2(gv *s, enum kiln_kop op, uint32_t a, uint32_t b) { return kiln_k2(s->k, op, a, b); }
static uint32_t ci(gv *s, int32_t v) { return kiln_ki(s->k, v); }
static uint32_t cf(gv *s, float v) { return kiln_kf(s->k, v); }
static uint32_t cvt(gv *s, enum kiln_kt t, uint32_t v) { return kiln_kir_op(s->k, KILN_KOP_CVT, t, v, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static uint32_t fma3(gv *s, uint32_t a, uint32_t b, uint32_t c) { return kiln_kir_op(s->k, KILN_KOP_FMA, KILN_KT_F32, a, b, c, 0); }
static uint32_t lane_of(gv *s, uint32_t v4, int i) { return kiln_kir_op(s->k, KILN_KOP_LANE, KILN_KT_U32, v4, KILN_IDX_NONE, KILN_IDX_NONE, i); }
static uint32_t ld4(gv *s, uint32_t slot, uint32_t word) { return kiln_kir_op(s->k, KILN_KOP_LD4, KILN_KT_V4, word, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot); }
static uint32_t ld1(gv *s, uint32_t slot, uint32_t word) { return kiln_kir_op(s->k, KILN_KOP_LD, KILN_KT_U32, word, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)slot); }
static void kif(gv *s, uint32_t p) { kiln_kir_op(s->k, KILN_KOP_IF, KILN_KT_NONE, p, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void kendif(gv *s) { kiln_kir_op(s->k, KILN_KOP_ENDIF, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); }
static void fail(gv *s, const char *why)
{
    if (!s->failed) snprintf(s->why, sizeof s->why, "%s", why);
    s->failed = true;
}

static int64_t chunks_per_row(kiln_dtype t, int64_t K, bool scalar);
/* The format row of weight dtype t (kl_gv_analyze refused those without one). */
static const kl_wfmt *fmt(kiln_dtype t) { return kl_wfmt_of(t); }

/* ------------------------------------------------------------------ analysis */

static int mm_index(const gv *s, uint32_t node)
{
    for (int j = 0; j < s->n_mm; j++)
        if (s->mm[j] == node) return j;
    return -1;
}

/* Bit set of the matmuls a region node depends on (through region nodes and reshapes). */
static unsigned deps(const gv *s, uint32_t node, int depth)
{
    if (depth > 64) return 0;
    int j = mm_index(s, node);
    if (j >= 0) return 1u << j;
    const kiln_node_rec *n = &s->g->nodes[node];
    if (n->op != KILN_OP_RESHAPE && !kl_in_region(s->r, node)) return 0;
    unsigned m = 0;
    for (int i = 0; i < n->n_src; i++)
        if (n->src[i] != KILN_IDX_NONE && !(n->op == KILN_OP_KV_SCATTER && i != 1)) m |= deps(s, n->src[i], depth + 1);
    return m;
}

bool kl_gv_analyze(gv *s, char *err, size_t n_err)
{
    const kiln_graph *g = s->g;
    const kiln_region *r = s->r;
    s->x = s->norm = s->nw = KILN_IDX_NONE;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[r->nodes[i]];
        if (n->op != KILN_OP_MATMUL) continue;
        if (s->n_mm == SLOTS || (s->x != KILN_IDX_NONE && n->src[0] != s->x)) return kl_unsupported(err, n_err, "gemv: matmuls with different inputs"), false;
        s->x = n->src[0];
        s->mm[s->n_mm++] = r->nodes[i];
    }
    if (!s->n_mm) return kl_unsupported(err, n_err, "gemv: no matmul"), false;
    const kiln_node_rec *xn = &g->nodes[s->x];
    if (xn->op == KILN_OP_RMS_NORM && kl_in_region(r, s->x)) {
        s->norm = s->x;
        s->nw = xn->src[1];
        s->eps = xn->f[0];
        s->x = xn->src[0];
        xn = &g->nodes[s->x];
    } else if (kl_in_region(r, s->x)) {
        return kl_unsupported(err, n_err, "gemv: x computed by %s in the region", kiln_op_name((enum kiln_op)xn->op)), false;
    }
    s->xdt = (kiln_dtype)xn->dtype;
    if (kiln_dtype_block(s->xdt) != 1 || s->xdt == KILN_DTYPE_I32 || (s->nw != KILN_IDX_NONE && g->nodes[s->nw].dtype != KILN_DTYPE_F32))
        return kl_unsupported(err, n_err, "gemv: x of %s", kiln_dtype_name(s->xdt)), false;
    s->K = xn->dims[xn->rank - 1];
    if (kiln_dim_is_sym(s->K)) return kl_unsupported(err, n_err, "gemv: symbolic K"), false;
    s->m_max = kl_numel_max(g, xn) / (s->K ? s->K : 1);
    if (s->m_cap > 0 && s->m_max > s->m_cap) s->m_max = s->m_cap;
    int mc_cap = MC_MAX; /* the format's decoders may hold more registers (wfmt.h mc_cap) */
    for (int j = 0; j < s->n_mm; j++) {
        kiln_dtype t = (kiln_dtype)g->nodes[g->nodes[s->mm[j]].src[1]].dtype;
        const kl_wfmt *f = kl_wfmt_of(t);
        if (!f) return kl_unsupported(err, n_err, "gemv: no GPU kernel for %s weights", kiln_dtype_name(t)), false;
        if (f->mc_cap < mc_cap) mc_cap = f->mc_cap;
    }
    s->mc = s->m_max < mc_cap ? (int)s->m_max : mc_cap;
    if (s->mc < 1) s->mc = 1;
    for (int j = 0; j < s->n_mm; j++) {
        const kiln_node_rec *w = &g->nodes[g->nodes[s->mm[j]].src[1]];
        kiln_dtype t = (kiln_dtype)w->dtype;
        const kl_wfmt *f = kl_wfmt_of(t);
        int64_t need = f->k_align;
        if (s->K % need && !f->block) { /* float weights: one value per chunk */
            s->scalar = true;
            need = 1;
        }
        if (w->rank != 2 || kiln_dim_is_sym(w->dims[0]) || s->K % need)
            return kl_unsupported(err, n_err, "gemv: %s weight with K = %lld", kiln_dtype_name(t), (long long)s->K), false;
    }
    /* Block weights take integer dot products against x quantized per 32 to int8 (as ggml and
     * kiln's CPU kernels do; contracts/matmul.yaml counts it) when the quantized x of a pass fits in
     * shared memory: per token K/4 words of quants and K/16 of scales and sums. */
    s->dp4a = s->tgt->dp4a && !s->scalar && s->K % 32 == 0 && (uint64_t)s->mc * (uint64_t)(s->K / 4 + s->K / 16) * 4 <= s->tgt->smem_bytes;
    for (int j = 0; j < s->n_mm; j++)
        if (!fmt((kiln_dtype)g->nodes[g->nodes[s->mm[j]].src[1]].dtype)->dp4a_at) s->dp4a = false; /* float weights */
    /* groups: matmuls joined by an epilogue op reading two of them */
    int gid[SLOTS];
    for (int j = 0; j < s->n_mm; j++) gid[j] = j;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        unsigned m = deps(s, r->nodes[i], 0);
        int first = -1;
        for (int j = 0; j < s->n_mm; j++)
            if (m & (1u << j)) {
                if (first < 0) first = gid[j];
                int old = gid[j];
                for (int q = 0; q < s->n_mm; q++)
                    if (gid[q] == old) gid[q] = first;
            }
    }
    uint32_t warp = 0;
    for (int j = 0; j < s->n_mm; j++) {
        if (gid[j] != j) continue;
        gv_group *G = &s->grp[s->n_grp++];
        memset(G, 0, sizeof *G);
        for (int q = 0; q < s->n_mm; q++)
            if (gid[q] == j) G->sib[G->n_sib++] = q;
        G->n = g->nodes[g->nodes[s->mm[j]].src[1]].dims[0];
        kiln_dtype t0 = (kiln_dtype)g->nodes[g->nodes[s->mm[j]].src[1]].dtype;
        for (int q = 1; q < G->n_sib; q++) {
            const kiln_node_rec *w = &g->nodes[g->nodes[s->mm[G->sib[q]]].src[1]];
            if (w->dims[0] != G->n || w->dtype != t0) return kl_unsupported(err, n_err, "gemv: fused siblings of other shapes or dtypes"), false;
        }
        G->cols = SLOTS / G->n_sib;
        /* rope on this group? */
        for (uint32_t i = 0; i < r->n_nodes; i++) {
            const kiln_node_rec *n = &g->nodes[r->nodes[i]];
            if (n->op != KILN_OP_ROPE || !(deps(s, r->nodes[i], 0) & (1u << j))) continue;
            int mode = n->i[0] == KILN_ROPE_NEOX ? 2 : 1;
            int64_t hd = n->dims[n->rank - 1];
            if ((G->rope && (G->rope != mode || G->hd != hd)) || G->cols != 4 || hd % 4 || G->n % hd)
                return kl_unsupported(err, n_err, "gemv: rope epilogue of this shape"), false;
            G->rope = mode;
            G->hd = hd;
        }
        G->units = (G->n + G->cols - 1) / G->cols;
        if (G->rope == 2) G->units = G->n / 4; /* (hd/4 units per head) */
        /* Split K over more warps when the group has few units, so a small or tall matrix still
         * keeps the target's busy_warps streaming. */
        int64_t cpr = chunks_per_row(t0, s->K, s->scalar);
        G->wpu = 1;
        while (G->wpu < WARPS && G->units * G->wpu < s->tgt->busy_warps && cpr > 32 * G->wpu) G->wpu *= 2; /* each warp keeps > 16 chunks a row */
        G->warp0 = warp;
        warp += (uint32_t)((G->units * G->wpu + WARPS - 1) / WARPS * WARPS);
    }
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[r->nodes[i]];
        if (n->op == KILN_OP_MATMUL || r->nodes[i] == s->norm || n->op == KILN_OP_ROPE || n->op == KILN_OP_KV_SCATTER) continue;
        if (!kl_is_elementwise((enum kiln_op)n->op)) return kl_unsupported(err, n_err, "gemv: %s in the epilogue", kiln_op_name((enum kiln_op)n->op)), false;
        if (!deps(s, r->nodes[i], 0)) return kl_unsupported(err, n_err, "gemv: an elementwise op before the matmul"), false;
    }
    s->k->grid[0] = warp / WARPS;
    return true;
}

/* ------------------------------------------------------------------ weights (their rows in wfmt.c) */

/* Number of 16-byte chunks per row (one value each when scalar), and sub-steps per chunk. */
static int64_t chunks_per_row(kiln_dtype t, int64_t K, bool scalar) { return scalar ? K : kl_wfmt_chunks(fmt(t), K); }
static int subs_of(kiln_dtype t) { return fmt(t)->subs; }

void kl_gv_load_chunk(gv *s, kiln_dtype t, uint32_t slot, uint32_t row, uint32_t c, int64_t rows, gv_chunk *o)
{
    int64_t K = s->K;
    if (s->scalar) {
        o->d = kl_load(s->k, slot, t, op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, row, ci(s, (int32_t)K)), c));
        return;
    }
    fmt(t)->load(s->k, slot, row, c, K, rows, o);
}

/* First element (within the row) of sub-step `sub` of chunk c. */
static uint32_t sub_elem(gv *s, kiln_dtype t, uint32_t c, int sub) { return s->scalar ? c : fmt(t)->sub_elem(s->k, c, sub); }

void kl_gv_decode(gv *s, kiln_dtype t, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    o->b = KILN_IDX_NONE;
    if (s->scalar) {
        o->v = 1;
        o->q[0] = ch->d;
        o->a = KILN_IDX_NONE;
        return;
    }
    fmt(t)->decode(s->k, ch, c, sub, o);
}


/* ------------------------------------------------------------------ epilogue */

static int find_slot(const gv *s, int sib, int delta)
{
    for (int r = 0; r < s->n_slots; r++)
        if (s->slot_sib[r] == sib && s->slot_delta[r] == delta) return r;
    return -1;
}

static uint32_t memo_get(gv *s, uint32_t key)
{
    for (int i = 0; i < s->n_memo; i++)
        if (s->memo_key[i] == key) return s->memo_val[i];
    return KILN_IDX_NONE;
}

static void memo_put(gv *s, uint32_t key, uint32_t v)
{
    if (s->n_memo < MEMO) {
        s->memo_key[s->n_memo] = key;
        s->memo_val[s->n_memo++] = v;
    }
}

/* I32 token index (t0 + t) and flat element index of slot r for token t. */
static uint32_t tok(gv *s, int t) { return op2(s, KILN_KOP_ADD, s->t0, ci(s, t)); }
static uint32_t flat(gv *s, int t, int r, int64_t n)
{
    return op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, tok(s, t), ci(s, (int32_t)n)), s->col[r]);
}

static uint32_t ev(gv *s, const gv_group *G, uint32_t node, int t, int r, int depth);

static uint32_t ev_rope(gv *s, const gv_group *G, const kiln_node_rec *n, int t, int r, int depth)
{
    int d = s->slot_delta[r];
    int pd = G->rope == 2 ? (d >= 2 ? d - 2 : d + 2) : (d ^ 1);      /* partner's delta (neox: +-hd/2 is slot +-2) */
    int pr = find_slot(s, s->slot_sib[r], pd);
    if (pr < 0) return fail(s, "rope partner"), cf(s, 0);
    bool first = d < pd;
    uint32_t x0 = ev(s, G, n->src[0], t, first ? r : pr, depth + 1), x1 = ev(s, G, n->src[0], t, first ? pr : r, depth + 1);
    /* pair index i within the head: neox i = col % hd (first half), normal i = (col % hd) / 2 */
    uint32_t cin = op2(s, KILN_KOP_REM, s->col[first ? r : pr], ci(s, (int32_t)G->hd));
    uint32_t i = G->rope == 2 ? cin : op2(s, KILN_KOP_SHR, cin, ci(s, 1));
    uint32_t tab = kl_rope_table(s->k, n->f[0], G->hd);
    uint32_t freq = kiln_kir_op(s->k, KILN_KOP_BITCAST, KILN_KT_F32, ld1(s, tab, i), KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t pos = kl_load_node(s->k, s->g, n->src[1], tok(s, t));
    uint32_t sn, cs;
    kl_sincos(s->k, op2(s, KILN_KOP_MUL, pos, freq), &sn, &cs);
    uint32_t y = first ? fma3(s, x0, cs, kiln_k1(s->k, KILN_KOP_NEG, op2(s, KILN_KOP_MUL, x1, sn)))
                       : fma3(s, x0, sn, op2(s, KILN_KOP_MUL, x1, cs));
    kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = n->dtype};
    return kl_apply(s->k, &tmp, y, KILN_IDX_NONE);
}

/* Value of node at (token t, slot r). */
static uint32_t ev(gv *s, const gv_group *G, uint32_t node, int t, int r, int depth)
{
    if (depth > 48) return fail(s, "epilogue too deep"), cf(s, 0);
    uint32_t key = node * 64u + (uint32_t)t * SLOTS + (uint32_t)r, v = memo_get(s, key);
    if (v != KILN_IDX_NONE) return v;
    const kiln_node_rec *n = &s->g->nodes[node];
    int j = mm_index(s, node);
    int64_t N = G->n;
    if (j >= 0) {
        int rr = find_slot(s, j, s->slot_delta[r]);
        if (rr < 0) return fail(s, "sibling slot"), cf(s, 0);
        v = s->acc[rr][t];
        kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = n->dtype};
        v = kl_apply(s->k, &tmp, v, KILN_IDX_NONE);
    } else if (n->op == KILN_OP_RESHAPE) {
        v = ev(s, G, n->src[0], t, r, depth + 1);
    } else if (n->op == KILN_OP_ROPE && kl_in_region(s->r, node)) {
        v = ev_rope(s, G, n, t, r, depth);
    } else if (kl_in_region(s->r, node) && kl_is_elementwise((enum kiln_op)n->op)) {
        uint32_t a = ev(s, G, n->src[0], t, r, depth + 1);
        uint32_t b = n->n_src > 1 && n->src[1] != KILN_IDX_NONE ? ev(s, G, n->src[1], t, r, depth + 1) : KILN_IDX_NONE;
        v = kl_apply(s->k, n, a, b);
    } else if (!kl_in_region(s->r, node) && kiln_dtype_block((kiln_dtype)n->dtype) == 1) {
        /* an operand from outside: [.., N] per token, or broadcast (a bias [N]) */
        int64_t numel_max = kl_numel_max(s->g, n);
        uint32_t idx = flat(s, t, r, N);
        if (numel_max == N && !kiln_dim_is_sym(n->dims[0])) idx = s->col[r];
        v = kl_load_node(s->k, s->g, node, idx);
    } else {
        return fail(s, "epilogue operand"), cf(s, 0);
    }
    memo_put(s, key, v);
    return v;
}

/* Which matmul's column space a node lives in (lowest sibling it depends on), or -1. */
static int home_sib(const gv *s, uint32_t node)
{
    unsigned m = deps(s, node, 0);
    for (int j = 0; j < s->n_mm; j++)
        if (m & (1u << j)) return j;
    return -1;
}

void kl_gv_epilogue(gv *s, const gv_group *G, uint32_t m)
{
    const kiln_graph *g = s->g;
    for (int t = 0; t < s->mc; t++) {
        kif(s, op2(s, KILN_KOP_LT, tok(s, t), m));
        s->n_memo = 0;
        for (int r = 0; r < s->n_slots; r++) {
            s->n_memo = 0; /* values of one IF block are not reused in another */
            kif(s, s->ok[r]);
            for (uint32_t o = 0; o < s->r->n_outs; o++) {
                uint32_t node = s->r->outs[o];
                if (node == s->norm) continue;
                const kiln_node_rec *n = &g->nodes[node];
                if (n->op == KILN_OP_KV_SCATTER) {
                    if (home_sib(s, n->src[1]) != s->slot_sib[r]) continue;
                    const kiln_node_rec *st = &g->nodes[n->src[0]];
                    int64_t max_ctx = st->dims[1], hd = st->dims[2];
                    uint32_t val = ev(s, G, n->src[1], t, r, 0);
                    uint32_t pos = cvt(s, KILN_KT_I32, ld1(s, kiln_kir_buf(s->k, KILN_KBUF_NODE, n->src[2], false), tok(s, t)));
                    uint32_t okp = op2(s, KILN_KOP_PAND, op2(s, KILN_KOP_LE, ci(s, 0), pos), op2(s, KILN_KOP_LT, pos, ci(s, (int32_t)max_ctx)));
                    kif(s, okp);
                    uint32_t h = op2(s, KILN_KOP_DIV, s->col[r], ci(s, (int32_t)hd)), e = op2(s, KILN_KOP_REM, s->col[r], ci(s, (int32_t)hd));
                    uint32_t dst = op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, h, ci(s, (int32_t)max_ctx)), pos), ci(s, (int32_t)hd)), e);
                    kl_store(s->k, kiln_kir_buf(s->k, KILN_KBUF_NODE, n->src[0], true), (kiln_dtype)st->dtype, dst, val);
                    kendif(s);
                    continue;
                }
                if (home_sib(s, node) != s->slot_sib[r]) continue;
                kl_store_node(s->k, g, node, flat(s, t, r, G->n), ev(s, G, node, t, r, 0));
            }
            kendif(s);
        }
        kendif(s);
    }
}

/* ------------------------------------------------------------------ kernel */

/* Multiplies one loaded chunk (every slot) with x for every token of the pass, into the accumulators. */
static void gv_chunk_fma(gv *s, kiln_dtype t, const gv_chunk *ch, uint32_t c, uint32_t xs, uint32_t nws, const uint32_t *tt)
{
    kiln_kir *k = s->k;
    int64_t K = s->K;
    for (int sub = 0; sub < subs_of(t); sub++) {
        gv_sub w[SLOTS];
        for (int r = 0; r < s->n_slots; r++) kl_gv_decode(s, t, &ch[r], c, sub, &w[r]);
        int V = w[0].v;
        uint32_t e0 = sub_elem(s, t, c, sub);
        uint32_t nwv[16] = {0};
        if (s->xstage) { /* normalized x from shared memory */
            for (int q = 0; q < s->mc; q++) {
                uint32_t xv[16] = {0};
                uint32_t xb = op2(s, KILN_KOP_ADD, ci(s, (int32_t)(q * K)), op2(s, KILN_KOP_DIV, e0, ci(s, s->xv)));
                for (int i = 0; i < V; i++) /* lanes read consecutive words: no bank conflicts */
                    xv[i] = kiln_kir_op(k, KILN_KOP_LDS, KILN_KT_F32, op2(s, KILN_KOP_ADD, xb, ci(s, (int32_t)(i * K / s->xv))), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)s->sh_x);
                for (int r = 0; r < s->n_slots; r++) {
                    uint32_t a = s->acc[r][q];
                    for (int i = 0; i < V; i++) a = fma3(s, w[r].q[i], xv[i], a);
                    kiln_kset(k, s->acc[r][q], a);
                }
            }
            continue;
        }
        if (nws != KILN_IDX_NONE && V == 1) nwv[0] = kl_load(k, nws, KILN_DTYPE_F32, e0);
        if (nws != KILN_IDX_NONE && V > 1)
            for (int i = 0; i < V; i += 4) {
                uint32_t v4 = ld4(s, nws, op2(s, KILN_KOP_ADD, e0, ci(s, i)));
                for (int l = 0; l < 4; l++) nwv[i + l] = kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32, lane_of(s, v4, l), KILN_IDX_NONE, KILN_IDX_NONE, 0);
            }
        for (int q = 0; q < s->mc; q++) {
            uint32_t xv[16] = {0};
            uint32_t xb = op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, tt[q], ci(s, (int32_t)K)), e0);
            for (int i = 0; i < V; i += 4) {
                bool vec = V > 1 && s->xdt == KILN_DTYPE_F32;
                uint32_t v4 = vec ? ld4(s, xs, op2(s, KILN_KOP_ADD, xb, ci(s, i))) : KILN_IDX_NONE;
                for (int l = 0; l < 4 && i + l < V; l++) {
                    xv[i + l] = !vec ? kl_load(k, xs, s->xdt, op2(s, KILN_KOP_ADD, xb, ci(s, i + l)))
                                     : kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32, lane_of(s, v4, l), KILN_IDX_NONE, KILN_IDX_NONE, 0);
                    if (s->nsc[q] != KILN_IDX_NONE) {
                        xv[i + l] = op2(s, KILN_KOP_MUL, xv[i + l], s->nsc[q]);
                        if (nws != KILN_IDX_NONE) xv[i + l] = op2(s, KILN_KOP_MUL, xv[i + l], nwv[i + l]);
                    }
                }
            }
            uint32_t sx = KILN_IDX_NONE;
            if (w[0].b != KILN_IDX_NONE) {
                sx = xv[0];
                for (int i = 1; i < V; i++) sx = op2(s, KILN_KOP_ADD, sx, xv[i]);
            }
            for (int r = 0; r < s->n_slots; r++) {
                if (w[r].a == KILN_IDX_NONE) { /* float weights: straight into the accumulator */
                    uint32_t a = s->acc[r][q];
                    for (int i = 0; i < V; i++) a = fma3(s, w[r].q[i], xv[i], a);
                    kiln_kset(k, s->acc[r][q], a);
                    continue;
                }
                uint32_t d = op2(s, KILN_KOP_MUL, w[r].q[0], xv[0]);
                for (int i = 1; i < V; i++) d = fma3(s, w[r].q[i], xv[i], d);
                uint32_t a = fma3(s, w[r].a, d, s->acc[r][q]);
                if (w[r].b != KILN_IDX_NONE) a = fma3(s, w[r].b, sx, a);
                kiln_kset(k, s->acc[r][q], a);
            }
        }
    }
}

/* ------------------------------------------------------------------ integer dot products */

/* dp4a path: the block quantizes (normalized) x of the pass's tokens into shared memory, per 32
 * values: int8 quants (rint(x * 127 / amax)), the scale amax / 127 and the float sum of the 32
 * values (for the k-quants' min term). Every thread takes 4 values; 8 threads make a group. */
static void quantize_x(gv *s, uint32_t tid, const uint32_t *tt, uint32_t xs, uint32_t nws)
{
    kiln_kir *k = s->k;
    int32_t W = (int32_t)(s->K / 4), G = (int32_t)(s->K / 32), nt = 32 * WARPS;
    kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); /* the last pass's readers are done */
    for (int q = 0; q < s->mc; q++) {
        uint32_t j = kiln_kvar(k, tid);
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, ci(s, (W + nt - 1) / nt * nt), ci(s, nt), 0); /* uniform trip count */
        uint32_t valid = op2(s, KILN_KOP_LT, j, ci(s, W));
        uint32_t e = op2(s, KILN_KOP_MUL, kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, valid, j, ci(s, 0), 0), ci(s, 4));
        uint32_t xb = op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, tt[q], ci(s, W * 4)), e);
        uint32_t x[4], v4 = s->xdt == KILN_DTYPE_F32 ? ld4(s, xs, xb) : KILN_IDX_NONE;
        uint32_t n4 = nws != KILN_IDX_NONE ? ld4(s, nws, e) : KILN_IDX_NONE;
        uint32_t amax = KILN_IDX_NONE, sum = KILN_IDX_NONE;
        for (int l = 0; l < 4; l++) {
            x[l] = v4 != KILN_IDX_NONE ? kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32, lane_of(s, v4, l), KILN_IDX_NONE, KILN_IDX_NONE, 0)
                                       : kl_load(k, xs, s->xdt, op2(s, KILN_KOP_ADD, xb, ci(s, l)));
            if (s->nsc[q] != KILN_IDX_NONE) x[l] = op2(s, KILN_KOP_MUL, x[l], s->nsc[q]);
            if (n4 != KILN_IDX_NONE) x[l] = op2(s, KILN_KOP_MUL, x[l], kiln_kir_op(k, KILN_KOP_BITCAST, KILN_KT_F32, lane_of(s, n4, l), KILN_IDX_NONE, KILN_IDX_NONE, 0));
            uint32_t a = kiln_k1(k, KILN_KOP_ABS, x[l]);
            amax = l ? op2(s, KILN_KOP_MAX, amax, a) : a;
            sum = l ? op2(s, KILN_KOP_ADD, sum, x[l]) : x[l];
        }
        amax = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, amax, KILN_IDX_NONE, KILN_IDX_NONE, (KILN_KRED_MAX << 16) | 8);
        sum = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, sum, KILN_IDX_NONE, KILN_IDX_NONE, (KILN_KRED_SUM << 16) | 8);
        uint32_t pos = op2(s, KILN_KOP_LT, cf(s, 0.0f), amax);
        uint32_t inv = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, pos, op2(s, KILN_KOP_DIV, cf(s, 127.0f), kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, pos, amax, cf(s, 1.0f), 0)), cf(s, 0.0f), 0);
        uint32_t packed = KILN_IDX_NONE;
        for (int l = 0; l < 4; l++) {
            uint32_t qv = cvt(s, KILN_KT_U32, cvt(s, KILN_KT_I32, kiln_k1(k, KILN_KOP_RINT, op2(s, KILN_KOP_MUL, x[l], inv))));
            qv = op2(s, KILN_KOP_AND, qv, kiln_ku(k, 255));
            if (l) qv = op2(s, KILN_KOP_SHL, qv, kiln_ku(k, 8u * (uint32_t)l));
            packed = l ? op2(s, KILN_KOP_OR, packed, qv) : qv;
        }
        kif(s, valid);
        kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, op2(s, KILN_KOP_ADD, ci(s, q * W), j), packed, KILN_IDX_NONE, (int32_t)s->sh_xq);
        kif(s, op2(s, KILN_KOP_EQ, op2(s, KILN_KOP_AND, j, ci(s, 7)), ci(s, 0)));
        uint32_t gi = op2(s, KILN_KOP_ADD, ci(s, q * G), op2(s, KILN_KOP_SHR, j, ci(s, 3)));
        kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, gi, op2(s, KILN_KOP_DIV, amax, cf(s, 127.0f)), KILN_IDX_NONE, (int32_t)s->sh_dx);
        kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, gi, sum, KILN_IDX_NONE, (int32_t)s->sh_xs);
        kendif(s);
        kendif(s);
        kl_loop_end(k);
    }
    kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
}

static uint32_t lds(gv *s, uint32_t arr, enum kiln_kt t, uint32_t idx) { return kiln_kir_op(s->k, KILN_KOP_LDS, t, idx, KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)arr); }

/* One loaded chunk (every slot) against the quantized x of every token of the pass. */
static void gv_chunk_dp4a(gv *s, kiln_dtype t, const gv_chunk *ch, uint32_t c)
{
    kiln_kir *k = s->k;
    int32_t W = (int32_t)(s->K / 4), G = (int32_t)(s->K / 32);
    /* per chunk: xq word of sub-step 0, its step per sub, x group of sub-step 0 and its step */
    const kl_wfmt *f = fmt(t);
    kl_dp4a_at at = {.h0 = KILN_IDX_NONE, .hsh = KILN_IDX_NONE};
    f->dp4a_at(k, c, &at);
    uint32_t w0 = at.w0, g0 = at.g0, h0 = at.h0, hsh = at.hsh;
    int wstep = at.wstep, gstep = at.gstep, nsub = f->subs;
    /* per slot: weight scales of each sub-step (and the k-quants' d, dmin, mins) */
    kl_dp4a_scales sc[SLOTS];
    memset(sc, 0, sizeof sc);
    for (int r = 0; r < s->n_slots; r++) f->dp4a_scales(k, &ch[r], c, &sc[r]);
    for (int q = 0; q < s->mc; q++) {
        uint32_t part[SLOTS] = {0};
        for (int sub = 0; sub < nsub; sub++) {
            uint32_t wb = op2(s, KILN_KOP_ADD, ci(s, q * W + wstep * sub), w0);
            uint32_t gi = op2(s, KILN_KOP_ADD, ci(s, q * G + gstep * sub), g0);
            uint32_t xq[4], dx = lds(s, s->sh_dx, KILN_KT_F32, gi), sq = KILN_IDX_NONE;
            for (int l = 0; l < 4; l++) xq[l] = lds(s, s->sh_xq, KILN_KT_U32, op2(s, KILN_KOP_ADD, wb, ci(s, l)));
            if (f->dp4a_offset32) { /* the values are stored + 32: subtract 32 * sum of the x quants */
                sq = ci(s, 0);
                for (int l = 0; l < 4; l++) sq = kiln_kir_op(k, KILN_KOP_DP4A, KILN_KT_I32, kiln_ku(k, 0x01010101u), xq[l], sq, 0);
                sq = op2(s, KILN_KOP_MUL, sq, ci(s, -32));
            }
            for (int r = 0; r < s->n_slots; r++) {
                uint32_t dot = sq != KILN_IDX_NONE ? sq : ci(s, 0);
                for (int l = 0; l < 4; l++) dot = kiln_kir_op(k, KILN_KOP_DP4A, KILN_KT_I32, f->dp4a_bytes(k, &ch[r], sub, l, hsh), xq[l], dot, 0);
                uint32_t v = op2(s, KILN_KOP_MUL, cvt(s, KILN_KT_F32, dot), op2(s, KILN_KOP_MUL, sc[r].wa[sub], dx));
                part[r] = sub ? op2(s, KILN_KOP_ADD, part[r], v) : v;
            }
        }
        if (h0 != KILN_IDX_NONE) { /* k-quant mins: the chunk of h = 0 subtracts dmin * min * sum(x) for both sub-blocks */
            uint32_t first = op2(s, KILN_KOP_EQ, h0, ci(s, 0));
            uint32_t gi = op2(s, KILN_KOP_ADD, ci(s, q * G), g0);
            uint32_t xs0 = lds(s, s->sh_xs, KILN_KT_F32, gi), xs1 = lds(s, s->sh_xs, KILN_KT_F32, op2(s, KILN_KOP_ADD, gi, ci(s, 1)));
            for (int r = 0; r < s->n_slots; r++) {
                uint32_t m = fma3(s, sc[r].mn[0], xs0, op2(s, KILN_KOP_MUL, sc[r].mn[1], xs1));
                m = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_F32, first, op2(s, KILN_KOP_MUL, sc[r].dmin, m), cf(s, 0.0f), 0);
                part[r] = op2(s, KILN_KOP_SUB, part[r], m);
            }
        }
        for (int r = 0; r < s->n_slots; r++) kiln_kset(k, s->acc[r][q], op2(s, KILN_KOP_ADD, s->acc[r][q], part[r]));
    }
}

/* x[idx] * the norm scale of token q of the pass * the norm weight at column j (each when fused). */
static uint32_t x_normed(gv *s, uint32_t xs, uint32_t nws, int q, uint32_t idx, uint32_t j)
{
    uint32_t v = kl_load(s->k, xs, s->xdt, idx);
    if (s->nsc[q] != KILN_IDX_NONE) v = op2(s, KILN_KOP_MUL, v, s->nsc[q]);
    if (nws != KILN_IDX_NONE) v = op2(s, KILN_KOP_MUL, v, kl_load(s->k, nws, KILN_DTYPE_F32, j));
    return v;
}

/* The start of a pass over tokens t0 .. t0 + mc - 1: their rows of x, the rms_norm scale of each
 * (the whole block reduces over x's row) and, for integer dot products, x quantized into shared
 * memory. Block-uniform: every thread of the block runs it. */
static void pass_prologue(gv *s, uint32_t tid, uint32_t m)
{
    kiln_kir *k = s->k;
    int64_t K = s->K;
    uint32_t xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    uint32_t nws = s->nw != KILN_IDX_NONE ? kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false) : KILN_IDX_NONE;
    for (int q = 0; q < s->mc; q++) /* clamped into 0 .. m - 1 (row 0 when m = 0: its stores are all guarded) */
        s->tt[q] = op2(s, KILN_KOP_MAX, op2(s, KILN_KOP_MIN, tok(s, q), op2(s, KILN_KOP_SUB, m, ci(s, 1))), ci(s, 0));
    for (int q = 0; q < s->mc; q++) {
        if (s->norm == KILN_IDX_NONE) { s->nsc[q] = KILN_IDX_NONE; continue; }
        uint32_t ss = kiln_kvar(k, cf(s, 0));
        uint32_t j = kiln_kvar(k, tid);
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, ci(s, (int32_t)K), ci(s, 32 * WARPS), 0);
        uint32_t xv = kl_load(k, xs, s->xdt, op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, s->tt[q], ci(s, (int32_t)K)), j));
        kiln_kset(k, ss, fma3(s, xv, xv, ss));
        kl_loop_end(k);
        uint32_t tot = kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, ss, KILN_IDX_NONE, KILN_IDX_NONE, (KILN_KRED_SUM << 16) | (32 * WARPS));
        s->nsc[q] = op2(s, KILN_KOP_DIV, cf(s, 1.0f), kiln_k1(k, KILN_KOP_SQRT, op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_DIV, tot, cf(s, (float)K)), cf(s, s->eps))));
    }
    if (s->dp4a) quantize_x(s, tid, s->tt, xs, nws);
    if (s->xstage) { /* x * norm scale * norm weight, once per block */
        for (int q = 0; q < s->mc; q++) {
            uint32_t j = kiln_kvar(k, tid);
            kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, ci(s, (int32_t)K), ci(s, 32 * WARPS), 0);
            uint32_t xv = x_normed(s, xs, nws, q, op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, s->tt[q], ci(s, (int32_t)K)), j), j);
            uint32_t at = op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, op2(s, KILN_KOP_REM, j, ci(s, s->xv)), ci(s, (int32_t)(K / s->xv))), op2(s, KILN_KOP_DIV, j, ci(s, s->xv)));
            kiln_kir_op(k, KILN_KOP_STS, KILN_KT_NONE, op2(s, KILN_KOP_ADD, ci(s, (int32_t)(q * K)), at), xv, KILN_IDX_NONE, (int32_t)s->sh_x);
            kl_loop_end(k);
        }
        kiln_kir_op(k, KILN_KOP_BARRIER, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    }
}

uint32_t kl_gv_unit_base(gv *s, const gv_group *G, uint32_t u, int deltas[SLOTS])
{
    if (G->rope == 2) {
        int32_t upp = (int32_t)(G->hd / 4); /* units per head */
        int32_t half = (int32_t)(G->hd / 2);
        deltas[0] = 0, deltas[1] = 1, deltas[2] = half, deltas[3] = half + 1;
        return op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, op2(s, KILN_KOP_DIV, u, ci(s, upp)), ci(s, (int32_t)G->hd)),
                   op2(s, KILN_KOP_MUL, op2(s, KILN_KOP_REM, u, ci(s, upp)), ci(s, 2)));
    }
    for (int c = 0; c < G->cols; c++) deltas[c] = c;
    return op2(s, KILN_KOP_MUL, u, ci(s, G->cols));
}

static void emit_group(gv *s, const gv_group *G, uint32_t gw, uint32_t lane, uint32_t tid, uint32_t m)
{
    kiln_kir *k = s->k;
    const kiln_graph *g = s->g;
    kiln_dtype t = (kiln_dtype)g->nodes[g->nodes[s->mm[G->sib[0]]].src[1]].dtype;
    uint32_t gl = op2(s, KILN_KOP_SUB, gw, ci(s, (int32_t)G->warp0));
    uint32_t u = op2(s, KILN_KOP_DIV, gl, ci(s, G->wpu)), wi = op2(s, KILN_KOP_REM, gl, ci(s, G->wpu));
    uint32_t valid = op2(s, KILN_KOP_LT, u, ci(s, (int32_t)G->units));
    /* unit base column and the slots' deltas */
    int deltas[SLOTS];
    uint32_t base = kl_gv_unit_base(s, G, u, deltas);
    s->n_slots = 0;
    for (int q = 0; q < G->n_sib; q++)
        for (int c = 0; c < G->cols; c++) {
            int r = s->n_slots++;
            s->slot_sib[r] = G->sib[q];
            s->slot_delta[r] = c; /* the same position in every sibling of the group */
            s->col[r] = op2(s, KILN_KOP_ADD, base, ci(s, deltas[c]));
            s->ok[r] = op2(s, KILN_KOP_PAND, valid, op2(s, KILN_KOP_LT, s->col[r], ci(s, (int32_t)G->n)));
        }
    uint32_t slot_w[SLOTS], row[SLOTS];
    for (int r = 0; r < s->n_slots; r++) {
        slot_w[r] = kiln_kir_buf(k, KILN_KBUF_NODE, g->nodes[s->mm[s->slot_sib[r]]].src[1], false);
        row[r] = kiln_kir_op(k, KILN_KOP_SELECT, KILN_KT_I32, s->ok[r], s->col[r], ci(s, 0), 0);
    }
    uint32_t xs = kiln_kir_buf(k, KILN_KBUF_NODE, s->x, false);
    uint32_t nws = s->nw != KILN_IDX_NONE ? kiln_kir_buf(k, KILN_KBUF_NODE, s->nw, false) : KILN_IDX_NONE;
    int64_t K = s->K, rows = G->n, cpr = chunks_per_row(t, K, s->scalar);
    if (!s->hoisted) {
        s->t0 = kiln_kvar(k, ci(s, 0));
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, s->t0, m, ci(s, s->mc), 0);
        pass_prologue(s, tid, m);
    }
    const uint32_t *tt = s->tt;
    for (int r = 0; r < s->n_slots; r++)
        for (int q = 0; q < s->mc; q++) s->acc[r][q] = kiln_kvar(k, cf(s, 0));
    /* Float and q8_0 rows take two chunks per step when the chunk count allows: both chunks' loads
     * are in flight before the first is used (more bytes in flight per warp). So do q4_K/q5_K rows
     * with integer dot products (ptxas gives them the same 80 registers either way; q6_K's four
     * loads per chunk would not fit). */
    bool two = (fmt(t)->two || (s->dp4a && fmt(t)->two_dp4a)) && !s->scalar && cpr % (64 * G->wpu) == 0;
    uint32_t c = kiln_kvar(k, op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, wi, ci(s, 32)), lane));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, c, ci(s, (int32_t)cpr), ci(s, 32 * G->wpu * (two ? 2 : 1)), 0);
    gv_chunk ch[2][SLOTS];
    uint32_t cc[2] = {c, two ? op2(s, KILN_KOP_ADD, c, ci(s, 32 * G->wpu)) : KILN_IDX_NONE};
    for (int h = 0; h < (two ? 2 : 1); h++)
        for (int r = 0; r < s->n_slots; r++) kl_gv_load_chunk(s, t, slot_w[r], row[r], cc[h], rows, &ch[h][r]);
    for (int h = 0; h < (two ? 2 : 1); h++) {
        if (s->dp4a) gv_chunk_dp4a(s, t, ch[h], cc[h]);
        else gv_chunk_fma(s, t, ch[h], cc[h], xs, nws, tt);
    }
    kl_loop_end(k);
    for (int r = 0; r < s->n_slots; r++)
        for (int q = 0; q < s->mc; q++)
            kiln_kset(k, s->acc[r][q], kiln_kir_op(k, KILN_KOP_REDUCE, KILN_KT_F32, s->acc[r][q], KILN_IDX_NONE, KILN_IDX_NONE, (KILN_KRED_SUM << 16) | (32 * G->wpu)));
    /* the normalized x is a region output too: block 0 of the first group writes it */
    if (s->norm != KILN_IDX_NONE && kl_is_out(s->r, s->norm) && G == &s->grp[0]) {
        kif(s, op2(s, KILN_KOP_EQ, gw, op2(s, KILN_KOP_MUL, op2(s, KILN_KOP_DIV, gw, ci(s, WARPS)), ci(s, WARPS))));
        kif(s, op2(s, KILN_KOP_EQ, u, ci(s, 0)));
        for (int q = 0; q < s->mc; q++) {
            kif(s, op2(s, KILN_KOP_LT, tok(s, q), m));
            uint32_t j = kiln_kvar(k, lane);
            kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, ci(s, (int32_t)K), ci(s, 32), 0);
            uint32_t idx = op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, tok(s, q), ci(s, (int32_t)K)), j);
            kl_store_node(k, g, s->norm, idx, x_normed(s, xs, nws, q, idx, j));
            kl_loop_end(k);
            kendif(s);
        }
        kendif(s);
        kendif(s);
    }
    kif(s, op2(s, KILN_KOP_PAND, op2(s, KILN_KOP_EQ, lane, ci(s, 0)), op2(s, KILN_KOP_EQ, wi, ci(s, 0))));
    kl_gv_epilogue(s, G, m);
    kendif(s);
    if (!s->hoisted) kl_loop_end(k);
}

kiln_status kiln_lower_gemv(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k, char *err, size_t n_err)
{
    return kiln_lower_gemv_cap(g, r, tg, k, 0, err, n_err);
}

kiln_status kiln_lower_gemv_cap(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k, int64_t m_cap,
                                char *err, size_t n_err)
{
    gv *s = calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->tgt = tg;
    s->m_cap = m_cap;
    s->k = k;
    s->g = g;
    s->r = r;
    kiln_kir_init(k, "kiln_gemv", 32 * WARPS);
    kiln_status st = KILN_OK;
    if (!kl_gv_analyze(s, err, n_err)) {
        st = KILN_ERR_UNSUPPORTED;
        goto out;
    }
    snprintf(k->what, sizeof k->what, "gemv %s x%d%s%s, %u ops", kiln_dtype_name((kiln_dtype)g->nodes[g->nodes[s->mm[0]].src[1]].dtype), s->n_mm,
             s->norm != KILN_IDX_NONE ? " + rms_norm" : "", s->dp4a ? " (int8 dot)" : "", r->n_nodes);
    uint32_t tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t bid = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t lane = op2(s, KILN_KOP_AND, tid, ci(s, 31));
    uint32_t gw = op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, bid, ci(s, WARPS)), op2(s, KILN_KOP_SHR, tid, ci(s, 5)));
    uint32_t m = op2(s, KILN_KOP_DIV, kl_numel_from(k, &g->nodes[s->x], 0), ci(s, (int32_t)s->K));
    if (s->dp4a) {
        s->sh_xq = kiln_kir_shared(k, (uint32_t)(s->mc * s->K / 4));
        s->sh_dx = kiln_kir_shared(k, (uint32_t)(s->mc * s->K / 32));
        s->sh_xs = kiln_kir_shared(k, (uint32_t)(s->mc * s->K / 32));
    }
    /* Decode (every token in one pass): the norm and x's quantization run once per block, which
     * then strides over the virtual blocks; a launcher may run as few blocks as fill the GPU. */
    s->hoisted = s->m_max <= s->mc;
    /* Float weights behind an rms_norm, in one pass, read x from shared memory, normalized once per
     * block: the loop's loads are then all weight streams (within the target's shared memory).
     * Without a norm the prologue would only delay the first weight loads. */
    s->xstage = s->hoisted && s->norm != KILN_IDX_NONE && !s->dp4a && !s->scalar && (uint64_t)s->mc * (uint64_t)s->K * 4 <= s->tgt->smem_bytes;
    for (int j = 0; j < s->n_mm; j++) { /* one chunk layout for every weight */
        kiln_dtype t = (kiln_dtype)g->nodes[g->nodes[s->mm[j]].src[1]].dtype;
        int v = fmt(t)->block ? 0 : fmt(t)->vec;
        if (!v || (j && v != s->xv)) s->xstage = false;
        s->xv = v;
    }
    if (s->xstage) s->sh_x = kiln_kir_shared(k, (uint32_t)(s->mc * s->K));
    uint32_t vb = KILN_IDX_NONE;
    if (s->hoisted) {
        s->t0 = ci(s, 0);
        pass_prologue(s, tid, m);
        k->grid_stride = true;
        vb = kiln_kvar(k, bid);
        kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, vb, ci(s, (int32_t)k->grid[0]),
                    kiln_kir_op(k, KILN_KOP_NBID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0), 0);
        gw = op2(s, KILN_KOP_ADD, op2(s, KILN_KOP_MUL, vb, ci(s, WARPS)), op2(s, KILN_KOP_SHR, tid, ci(s, 5)));
    }
    for (int q = 0; q < s->n_grp; q++) {
        const gv_group *G = &s->grp[q];
        uint32_t end = q + 1 < s->n_grp ? s->grp[q + 1].warp0 : k->grid[0] * WARPS;
        kif(s, op2(s, KILN_KOP_PAND, op2(s, KILN_KOP_LE, ci(s, (int32_t)G->warp0), gw), op2(s, KILN_KOP_LT, gw, ci(s, (int32_t)end))));
        emit_group(s, G, gw, lane, tid, m);
        kendif(s);
    }
    if (s->hoisted) kl_loop_end(k);
    if (s->failed) st = kl_unsupported(err, n_err, "gemv: %s", s->why);
out:
    if (st != KILN_OK) kiln_kir_free(k);
    free(s);
    return st;
}
