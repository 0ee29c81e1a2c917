/* The matmul templates' shared parts (lower_mm.h): the region analysis (x, the rms_norm prologue,
 * siblings and their column groups, rope, split-K), chunk loads and decoders through the weight
 * format rows (wfmt.h), and the per-element epilogue (bias/residual add, swiglu, rope, KV-cache
 * write) of the columns and tokens a template hands it. Used by lower_gemv.c and lower_gemm.c;
 * must not emit a kernel's loops itself nor know any target's syntax. */
#include "codegen/lower_mm.h"
#include "codegen/wfmt.h"

#include <string.h>

static void fail(gv *s, const char *why)
{
    if (!s->failed) snprintf(s->why, sizeof s->why, "%s", why);
    s->failed = true;
}

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
    if (n->op != KILN_OP_RESHAPE && !kiln_region_has(s->r, node)) return 0;
    unsigned m = 0;
    for (int i = 0; i < n->n_src; i++)
        if (n->src[i] != KILN_IDX_NONE && !(n->op == KILN_OP_KV_SCATTER && i != 1)) m |= deps(s, n->src[i], depth + 1);
    return m;
}

/* The matmuls (sharing x), x itself and the rms_norm prologue; K, rows and tokens per pass. */
static bool find_x(gv *s, char *err, size_t n_err)
{
    const kiln_graph *g = s->g;
    const kiln_region *r = s->r;
    const kiln_region_spec *sp = &r->spec; /* fusion's analysis of the region (fuse/spec.c) */
    if (sp->mm_mixed) return kl_unsupported(err, n_err, "gemv: matmuls with different inputs"), false;
    if (!sp->n_mm) return kl_unsupported(err, n_err, "gemv: no matmul"), false;
    s->n_mm = (int)sp->n_mm;
    memcpy(s->mm, sp->mm, sizeof s->mm);
    s->x = sp->x, s->norm = sp->norm, s->nw = sp->norm_w, s->eps = sp->eps;
    const kiln_node_rec *xn = &g->nodes[s->x];
    if (s->norm == KILN_IDX_NONE && kiln_region_has(r, s->x))
        return kl_unsupported(err, n_err, "gemv: x computed by %s in the region", kiln_op_name((enum kiln_op)xn->op)),
               false;
    s->xdt = (kiln_dtype)xn->dtype;
    if (kiln_dtype_block(s->xdt) != 1 || s->xdt == KILN_DTYPE_I32 ||
        (s->nw != KILN_IDX_NONE && g->nodes[s->nw].dtype != KILN_DTYPE_F32))
        return kl_unsupported(err, n_err, "gemv: x of %s", kiln_dtype_name(s->xdt)), false;
    s->K = xn->dims[xn->rank - 1];
    if (kiln_dim_is_sym(s->K)) return kl_unsupported(err, n_err, "gemv: symbolic K"), false;
    s->m_max = kl_numel_max(g, xn) / (s->K ? s->K : 1);
    if (s->m_cap > 0 && s->m_max > s->m_cap) s->m_max = s->m_cap;
    return true;
}

/* Every weight has a format row and a K it takes; tokens per pass, scalar loads, integer dots. */
static bool check_weights(gv *s, char *err, size_t n_err)
{
    const kiln_graph *g = s->g;
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
            return kl_unsupported(err, n_err, "gemv: %s weight with K = %lld", kiln_dtype_name(t), (long long)s->K),
                   false;
    }
    /* Block weights take integer dot products against x quantized per 32 to int8 (as ggml and
     * kiln's CPU kernels do; contracts/matmul.yaml counts it) when the quantized x of a pass fits in
     * shared memory: per token K/4 words of quants and K/16 of scales and sums. */
    s->dp4a = s->tgt->dp4a && !s->scalar && s->K % 32 == 0 &&
              (uint64_t)s->mc * (uint64_t)(s->K / 4 + s->K / 16) * 4 <= kiln_lower_smem_for(s->tgt, 32 * WARPS);
    for (int j = 0; j < s->n_mm; j++)
        if (!fmt((kiln_dtype)g->nodes[g->nodes[s->mm[j]].src[1]].dtype)->dp4a_at) s->dp4a = false; /* float weights */
    /* codegen.gemv_pair, or at AUTO every weight format's default (kl_wfmt.gemv_auto) */
    s->pair = s->pair_ok && s->dp4a && s->tgt->opts.gemv_pair != KILN_GEMM_OFF;
    for (int j = 0; j < s->n_mm; j++) {
        const kl_wfmt *f = fmt((kiln_dtype)g->nodes[g->nodes[s->mm[j]].src[1]].dtype);
        if (!f->pair_subs || (s->tgt->opts.gemv_pair != KILN_GEMM_ON && !(f->gemv_auto & KL_GV_PAIR))) s->pair = false;
    }
    return true;
}

/* The rope epilogue of group G (the matmuls of sibling j's group): mode and head width. */
static bool group_rope(gv *s, gv_group *G, int j, char *err, size_t n_err)
{
    const kiln_graph *g = s->g;
    const kiln_region *r = s->r;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[r->nodes[i]];
        if (n->op != KILN_OP_ROPE || !(deps(s, r->nodes[i], 0) & (1u << j))) continue;
        int mode = n->i[0] == KILN_ROPE_NEOX ? 2 : 1;
        int64_t hd = n->dims[n->rank - 1], rot = kiln_rope_dims(n, hd);
        /* a partial neox rope's units are two rotated pairs or 4 pass-through columns: rot % 4 == 0 */
        if ((G->rope && (G->rope != mode || G->hd != hd || G->rot != rot)) || G->cols != 4 || hd % 4 || G->n % hd ||
            (mode == 2 && rot % 4))
            return kl_unsupported(err, n_err, "gemv: rope epilogue of this shape"), false;
        G->rope = mode;
        G->hd = hd;
        G->rot = rot;
    }
    return true;
}

/* Groups: matmuls joined by an epilogue op reading two of them share a unit's columns; each group
 * gets its units, split-K and first warp; *warps: the warps of all groups. */
static bool make_groups(gv *s, uint32_t *warps, char *err, size_t n_err)
{
    const kiln_graph *g = s->g;
    const kiln_region *r = s->r;
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
            if (w->dims[0] != G->n || w->dtype != t0)
                return kl_unsupported(err, n_err, "gemv: fused siblings of other shapes or dtypes"), false;
        }
        G->cols = SLOTS / G->n_sib;
        if (!group_rope(s, G, j, err, n_err)) return false;
        G->units = (G->n + G->cols - 1) / G->cols;
        if (G->rope == 2) G->units = G->n / 4; /* (hd/4 units per head) */
        /* Split K over more warps when the group has few units, so a small or tall matrix still
         * keeps the target's busy_warps streaming. */
        int64_t cpr = kl_gv_steps_per_row(s, t0);
        G->wpu = 1;
        while (G->wpu < WARPS && G->units * G->wpu < s->tgt->busy_warps && cpr > 32 * G->wpu)
            G->wpu *= 2; /* each warp keeps > 16 chunks a row */
        G->warp0 = warp;
        warp += (uint32_t)((G->units * G->wpu + WARPS - 1) / WARPS * WARPS);
    }
    *warps = warp;
    return true;
}

bool kl_gv_analyze(gv *s, char *err, size_t n_err)
{
    uint32_t warp = 0;
    if (!find_x(s, err, n_err) || !check_weights(s, err, n_err) || !make_groups(s, &warp, err, n_err)) return false;
    const kiln_graph *g = s->g;
    const kiln_region *r = s->r;
    for (uint32_t i = 0; i < r->n_nodes; i++) { /* the rest is a per-element epilogue */
        const kiln_node_rec *n = &g->nodes[r->nodes[i]];
        if (n->op == KILN_OP_MATMUL || r->nodes[i] == s->norm || n->op == KILN_OP_ROPE || n->op == KILN_OP_KV_SCATTER)
            continue;
        if (!kl_is_elementwise((enum kiln_op)n->op))
            return kl_unsupported(err, n_err, "gemv: %s in the epilogue", kiln_op_name((enum kiln_op)n->op)), false;
        if (!deps(s, r->nodes[i], 0))
            return kl_unsupported(err, n_err, "gemv: an elementwise op before the matmul"), false;
    }
    s->k->grid[0] = warp / WARPS;
    return true;
}

/* ------------------------------------------------------------------ weights (their rows in wfmt.c) */

/* Number of 16-byte chunks per row (one value each when scalar), and sub-steps per chunk. */
int64_t kl_gv_chunks_per_row(kiln_dtype t, int64_t K, bool scalar) { return scalar ? K : kl_wfmt_chunks(fmt(t), K); }
int64_t kl_gv_steps_per_row(const gv *s, kiln_dtype t) { return kl_gv_chunks_per_row(t, s->K, s->scalar) / (s->pair ? 2 : 1); }

void kl_gv_load_chunk(gv *s, kiln_dtype t, uint32_t slot, uint32_t row, uint32_t c, int64_t rows, gv_chunk *o)
{
    int64_t K = s->K;
    if (s->scalar) {
        o->d = kl_load(s->k, slot, t,
                       kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, row, kiln_ki(s->k, (int32_t)K)), c));
        return;
    }
    fmt(t)->load(s->k, slot, row, c, K, rows, o);
}

/* First element (within the row) of sub-step `sub` of chunk c. */
uint32_t kl_gv_sub_elem(gv *s, kiln_dtype t, uint32_t c, int sub)
{
    return s->scalar ? c : fmt(t)->sub_elem(s->k, c, sub);
}

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

static int find_slot(const gv_unit *u, int sib, int delta)
{
    for (int r = 0; r < u->n_slots; r++)
        if (u->slot_sib[r] == sib && u->slot_delta[r] == delta) return r;
    return -1;
}

static uint32_t memo_get(const gv_unit *u, uint32_t key)
{
    for (int i = 0; i < u->n_memo; i++)
        if (u->memo_key[i] == key) return u->memo_val[i];
    return KILN_IDX_NONE;
}

static void memo_put(gv_unit *u, uint32_t key, uint32_t v)
{
    if (u->n_memo < MEMO) {
        u->memo_key[u->n_memo] = key;
        u->memo_val[u->n_memo++] = v;
    }
}

/* I32 token index (t0 + t) and flat element index of slot r for token t. */
uint32_t kl_gv_tok(gv *s, const gv_unit *u, int t) { return kiln_k2(s->k, KILN_KOP_ADD, u->t0, kiln_ki(s->k, t)); }
static uint32_t flat(gv *s, const gv_unit *u, int t, int r, int64_t n)
{
    return kiln_k2(s->k, KILN_KOP_ADD, kiln_k2(s->k, KILN_KOP_MUL, kl_gv_tok(s, u, t), kiln_ki(s->k, (int32_t)n)),
                   u->col[r]);
}

static uint32_t ev(gv *s, gv_unit *u, const gv_group *G, uint32_t node, int t, int r, int depth);

/* Memo keys beside ev's (node, token, slot) ones, bit 31 set: kind 0 a per-token value of a node,
 * 1 / 2 the sin / cos of a rope node's pair whose first slot is r. */
static uint32_t side_key(uint32_t kind, uint32_t node, int t, int r)
{
    return 0x80000000u | kind << 29 | ((node * 64u + (uint32_t)t * SLOTS + (uint32_t)r) & 0x1fffffffu);
}

/* Which of the unit's staged copies holds kind `kind` of node, or -1 where its template staged none. */
static int staged_at(const gv_unit *u, int kind, uint32_t node)
{
    for (int i = 0; i < u->n_st; i++)
        if (u->st_kind[i] == kind && u->st_node[i] == node) return i;
    return -1;
}

/* Element idx of the unit's staged copy i, read from its shared array as type t. */
static uint32_t staged_ld(gv *s, const gv_unit *u, int i, uint32_t idx, enum kiln_kt t)
{
    return kiln_kir_op(s->k, KILN_KOP_LDS, t, kiln_k2(s->k, KILN_KOP_ADD, idx, kiln_ki(s->k, u->st_off[i])), KILN_IDX_NONE,
                       KILN_IDX_NONE, (int32_t)u->st_arr);
}

uint32_t kl_gv_token_raw(gv *s, uint32_t node, uint32_t tok, bool as_int)
{
    return as_int ? kiln_kld(s->k, kiln_kir_buf(s->k, KILN_KBUF_NODE, node, false), tok) : kl_load_node(s->k, s->g, node, tok);
}

/* The value of a per-token node (positions) for token t, loaded once a block (as I32 with as_int):
 * from the template's staged copy where it made one. */
static uint32_t token_value(gv *s, gv_unit *u, uint32_t node, int t, bool as_int)
{
    uint32_t key = side_key(0, node, t, as_int), v = memo_get(u, key);
    if (v != KILN_IDX_NONE) return v;
    int i = staged_at(u, as_int, node); /* the staged row is computed only where there is one to read */
    v = i >= 0 ? staged_ld(s, u, i, kiln_k2(s->k, KILN_KOP_ADD, u->st_row, kiln_ki(s->k, t)), as_int ? KILN_KT_U32 : KILN_KT_F32)
               : kl_gv_token_raw(s, node, kl_gv_tok(s, u, t), as_int); /* what a template stages */
    if (as_int) v = kiln_kcvt(s->k, KILN_KT_I32, v);
    memo_put(u, key, v);
    return v;
}

static uint32_t ev_rope(gv *s, gv_unit *u, const gv_group *G, const kiln_node_rec *n, int t, int r, int depth)
{
    int d = u->slot_delta[r];
    int pd = G->rope == 2 ? (d >= 2 ? d - 2 : d + 2) : (d ^ 1); /* partner's delta (neox: +-hd/2 is slot +-2) */
    int pr = find_slot(u, u->slot_sib[r], pd);
    if (pr < 0) return fail(s, "rope partner"), kiln_kf(s->k, 0);
    bool first = d < pd;
    uint32_t x0 = ev(s, u, G, n->src[0], t, first ? r : pr, depth + 1),
             x1 = ev(s, u, G, n->src[0], t, first ? pr : r, depth + 1);
    /* pair index i within the head: neox i = col % hd (first half), normal i = (col % hd) / 2 */
    uint32_t cin = kiln_k2(s->k, KILN_KOP_REM, u->col[first ? r : pr], kiln_ki(s->k, (int32_t)G->hd));
    uint32_t i = G->rope == 2 ? cin : kiln_k2(s->k, KILN_KOP_SHR, cin, kiln_ki(s->k, 1));
    uint32_t rotated = KILN_IDX_NONE; /* partial rotary: the pair's first column is below rot (else it passes) */
    if (G->rot < G->hd) {
        rotated = kiln_k2(s->k, KILN_KOP_LT, cin, kiln_ki(s->k, (int32_t)G->rot));
        i = kiln_ksel(s->k, KILN_KT_I32, rotated, i, kiln_ki(s->k, 0)); /* inside the table either way */
    }
    /* the pair's angle is the same for both of its slots: sin and cos once a pair (memo keys
       outside ev's node space: bit 31 set) */
    uint32_t self = (uint32_t)(n - s->g->nodes);
    uint32_t sn = memo_get(u, side_key(1, self, t, first ? r : pr)), cs = memo_get(u, side_key(2, self, t, first ? r : pr));
    if (sn == KILN_IDX_NONE || cs == KILN_IDX_NONE) {
        int at = staged_at(u, 2, self);
        uint32_t freq = at >= 0 ? staged_ld(s, u, at, i, KILN_KT_F32) : KILN_IDX_NONE;
        if (freq == KILN_IDX_NONE)
            freq = kiln_kir_op(s->k, KILN_KOP_BITCAST, KILN_KT_F32, kiln_kld(s->k, kl_rope_table(s->k, n, G->hd), i), KILN_IDX_NONE,
                               KILN_IDX_NONE, 0);
        uint32_t pos = token_value(s, u, n->src[1], t, false);
        kl_sincos(s->k, kiln_k2(s->k, KILN_KOP_MUL, pos, freq), &sn, &cs);
        memo_put(u, side_key(1, self, t, first ? r : pr), sn);
        memo_put(u, side_key(2, self, t, first ? r : pr), cs);
    }
    uint32_t y = first ? kiln_kfma(s->k, x0, cs, kiln_k1(s->k, KILN_KOP_NEG, kiln_k2(s->k, KILN_KOP_MUL, x1, sn)))
                       : kiln_kfma(s->k, x0, sn, kiln_k2(s->k, KILN_KOP_MUL, x1, cs));
    if (rotated != KILN_IDX_NONE) y = kiln_ksel(s->k, KILN_KT_F32, rotated, y, first ? x0 : x1);
    kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = n->dtype};
    return kl_apply(s->k, &tmp, y, KILN_IDX_NONE);
}

/* Value of node at (token t, slot r). */
static uint32_t ev(gv *s, gv_unit *u, const gv_group *G, uint32_t node, int t, int r, int depth)
{
    if (depth > 48) return fail(s, "epilogue too deep"), kiln_kf(s->k, 0);
    uint32_t key = node * 64u + (uint32_t)t * SLOTS + (uint32_t)r, v = memo_get(u, key);
    if (v != KILN_IDX_NONE) return v;
    const kiln_node_rec *n = &s->g->nodes[node];
    int j = mm_index(s, node);
    int64_t N = G->n;
    if (j >= 0) {
        int rr = find_slot(u, j, u->slot_delta[r]);
        if (rr < 0) return fail(s, "sibling slot"), kiln_kf(s->k, 0);
        v = u->acc[rr][t];
        kiln_node_rec tmp = {.op = KILN_OP_CAST, .dtype = n->dtype};
        v = kl_apply(s->k, &tmp, v, KILN_IDX_NONE);
    } else if (n->op == KILN_OP_RESHAPE) {
        v = ev(s, u, G, n->src[0], t, r, depth + 1);
    } else if (n->op == KILN_OP_ROPE && kiln_region_has(s->r, node)) {
        v = ev_rope(s, u, G, n, t, r, depth);
    } else if (kiln_region_has(s->r, node) && kl_is_elementwise((enum kiln_op)n->op)) {
        uint32_t a = ev(s, u, G, n->src[0], t, r, depth + 1);
        uint32_t b = n->n_src > 1 && n->src[1] != KILN_IDX_NONE ? ev(s, u, G, n->src[1], t, r, depth + 1) : KILN_IDX_NONE;
        v = kl_apply(s->k, n, a, b);
    } else if (!kiln_region_has(s->r, node) && kiln_dtype_block((kiln_dtype)n->dtype) == 1) {
        /* an operand from outside: [.., N] per token, or broadcast (a bias [N]) */
        int64_t numel_max = kl_numel_max(s->g, n);
        uint32_t idx = flat(s, u, t, r, N);
        if (numel_max == N && !kiln_dim_is_sym(n->dims[0])) idx = u->col[r];
        v = kl_load_node(s->k, s->g, node, idx);
    } else {
        return fail(s, "epilogue operand"), kiln_kf(s->k, 0);
    }
    memo_put(u, key, v);
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

void kl_gv_epilogue(gv *s, const gv_group *G, gv_unit *u, uint32_t m)
{
    const kiln_graph *g = s->g;
    /* ok[r] NONE for every slot: the caller knows each column exists, so the slots share one block
       and reuse each other's values (rope partners, sin/cos, positions) */
    bool guarded = false;
    for (int r = 0; r < u->n_slots; r++) guarded = guarded || u->ok[r] != KILN_IDX_NONE;
    for (int t = 0; t < u->mc; t++) {
        kiln_kif(s->k, kiln_k2(s->k, KILN_KOP_LT, kl_gv_tok(s, u, t), m));
        u->n_memo = 0;
        /* the token's positions (rope angles, KV-cache rows) before any slot's branch: one load a
           token, in flight while the slots compute (a load per slot inside its branch left the
           GEMM's drain latency-bound on them) */
        for (uint32_t i = 0; i < s->r->n_nodes; i++) {
            const kiln_node_rec *n = &g->nodes[s->r->nodes[i]];
            if (n->op == KILN_OP_ROPE) token_value(s, u, n->src[1], t, false);
            if (n->op == KILN_OP_KV_SCATTER) token_value(s, u, n->src[2], t, true);
        }
        int kept = u->n_memo;
        for (int r = 0; r < u->n_slots; r++) {
            if (guarded) {
                u->n_memo = kept; /* values of one IF block are not reused in another (but the token's are) */
                kiln_kif(s->k, u->ok[r]);
            }
            for (uint32_t o = 0; o < s->r->n_outs; o++) {
                uint32_t node = s->r->outs[o];
                if (node == s->norm) continue;
                const kiln_node_rec *n = &g->nodes[node];
                if (n->op == KILN_OP_KV_SCATTER) {
                    if (home_sib(s, n->src[1]) != u->slot_sib[r]) continue;
                    const kiln_node_rec *st = &g->nodes[n->src[0]];
                    int64_t max_ctx = st->dims[1], hd = st->dims[2];
                    uint32_t val = ev(s, u, G, n->src[1], t, r, 0);
                    uint32_t pos = token_value(s, u, n->src[2], t, true);
                    uint32_t okp = kiln_k2(s->k, KILN_KOP_PAND, kiln_k2(s->k, KILN_KOP_LE, kiln_ki(s->k, 0), pos),
                                           kiln_k2(s->k, KILN_KOP_LT, pos, kiln_ki(s->k, (int32_t)max_ctx)));
                    kiln_kif(s->k, okp);
                    uint32_t h = kiln_k2(s->k, KILN_KOP_DIV, u->col[r], kiln_ki(s->k, (int32_t)hd)),
                             e = kiln_k2(s->k, KILN_KOP_REM, u->col[r], kiln_ki(s->k, (int32_t)hd));
                    uint32_t dst =
                        kiln_k2(s->k, KILN_KOP_ADD,
                                kiln_k2(s->k, KILN_KOP_MUL,
                                        kiln_k2(s->k, KILN_KOP_ADD,
                                                kiln_k2(s->k, KILN_KOP_MUL, h, kiln_ki(s->k, (int32_t)max_ctx)), pos),
                                        kiln_ki(s->k, (int32_t)hd)),
                                e);
                    kl_store(s->k, kiln_kir_buf(s->k, KILN_KBUF_NODE, n->src[0], true), (kiln_dtype)st->dtype, dst,
                             val);
                    kiln_kendif(s->k);
                    continue;
                }
                if (home_sib(s, node) != u->slot_sib[r]) continue;
                kl_store_node(s->k, g, node, flat(s, u, t, r, G->n), ev(s, u, G, node, t, r, 0));
            }
            if (guarded) kiln_kendif(s->k);
        }
        kiln_kendif(s->k);
    }
}

uint32_t kl_gv_unit_base(gv *s, const gv_group *G, uint32_t u, int deltas[SLOTS])
{
    if (G->rope == 2) {
        int32_t upp = (int32_t)(G->hd / 4); /* units per head */
        int32_t half = (int32_t)(G->rot / 2);
        deltas[0] = 0, deltas[1] = 1, deltas[2] = half, deltas[3] = half + 1;
        if (kl_gv_partial(G)) { /* units j < rot/4: pairs (2j, 2j+1) and their partners; the rest: columns 4j .. 4j+3 */
            uint32_t head = kiln_k2(s->k, KILN_KOP_MUL, kiln_k2(s->k, KILN_KOP_DIV, u, kiln_ki(s->k, upp)),
                                    kiln_ki(s->k, (int32_t)G->hd));
            uint32_t j = kiln_k2(s->k, KILN_KOP_REM, u, kiln_ki(s->k, upp));
            uint32_t rotated = kiln_k2(s->k, KILN_KOP_LT, j, kiln_ki(s->k, (int32_t)(G->rot / 4)));
            uint32_t step = kiln_ksel(s->k, KILN_KT_I32, rotated, kiln_ki(s->k, 2), kiln_ki(s->k, 4));
            return kiln_k2(s->k, KILN_KOP_ADD, head, kiln_k2(s->k, KILN_KOP_MUL, j, step));
        }
        return kiln_k2(
            s->k, KILN_KOP_ADD,
            kiln_k2(s->k, KILN_KOP_MUL, kiln_k2(s->k, KILN_KOP_DIV, u, kiln_ki(s->k, upp)),
                    kiln_ki(s->k, (int32_t)G->hd)),
            kiln_k2(s->k, KILN_KOP_MUL, kiln_k2(s->k, KILN_KOP_REM, u, kiln_ki(s->k, upp)), kiln_ki(s->k, 2)));
    }
    for (int c = 0; c < G->cols; c++) deltas[c] = c;
    return kiln_k2(s->k, KILN_KOP_MUL, u, kiln_ki(s->k, G->cols));
}

uint32_t kl_gv_slot_col(gv *s, const gv_group *G, uint32_t base, const int deltas[SLOTS], int c)
{
    uint32_t col = kiln_k2(s->k, KILN_KOP_ADD, base, kiln_ki(s->k, deltas[c]));
    if (!kl_gv_partial(G) || deltas[c] == c) return col;
    uint32_t pass = kiln_k2(s->k, KILN_KOP_LE, kiln_ki(s->k, (int32_t)G->rot),
                            kiln_k2(s->k, KILN_KOP_REM, base, kiln_ki(s->k, (int32_t)G->hd)));
    return kiln_ksel(s->k, KILN_KT_I32, pass, kiln_k2(s->k, KILN_KOP_ADD, base, kiln_ki(s->k, c)), col);
}
