/* The tensor-parallel split (split.h). An analysis pass gives every node a kind (replicated,
 * divided along an axis, partial sum): matmuls reading a replicated x are tried column-parallel,
 * the division flows through heads (reshape, rope, kv_scatter, attention) to the matmul that reads
 * it, which becomes row-parallel (partial output, all-reduced before its first reader). A tried
 * group that meets an op needing the whole value is replicated and the pass runs again. Must not
 * compile or run anything, nor edit the source graph. */
#include "sched/split.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIND_UNSET 255 /* a state no op has decided yet */

typedef enum { PASS_OK = 0, PASS_RETRY, PASS_REFUSE } pass_result;

typedef struct split_an {
    const kiln_graph *g;      /* source graph */
    int               n;      /* parts */
    uint8_t          *kind;   /* per node: enum kiln_split_kind or KIND_UNSET */
    int8_t           *axis;   /* per node: split axis or -1 */
    uint32_t         *parent; /* union-find over nodes: the group a divided value belongs to */
    bool             *seeded; /* matmul tried column-parallel in this pass */
    bool             *banned; /* matmul that must stay replicated (its group failed) */
    int8_t           *wslice; /* per weight: the axis it is sliced along, or -1 */
    bool             *wother; /* per weight: sliced for an op other than a matmul (cannot also be whole) */
    bool             *wrepl;  /* per weight: read whole by some op */
    bool             *gathered; /* column-parallel matmul output read whole: all-gathered (kept across passes) */
    bool             *reduce; /* per node: a partial value read by something (gets an all_reduce) */
    char             *why;    /* a refusal's message */
    size_t            n_why;
    char              quiet[3][200]; /* why groups were replicated (first three, for the description) */
    int               n_quiet;
    kiln_split_choice *choices;   /* the cost model's verdicts (split.h) */
    uint32_t          n_choices, cap_choices;
} split_an;

static const char *label(const kiln_graph *g, uint32_t i, char *buf, size_t n)
{
    const kiln_node_rec *r = &g->nodes[i];
    if (r->name) snprintf(buf, n, "%s '%s'", kiln_op_name((enum kiln_op)r->op), r->name);
    else snprintf(buf, n, "%s #%u", kiln_op_name((enum kiln_op)r->op), i);
    return buf;
}

static uint32_t find(split_an *a, uint32_t x)
{
    while (a->parent[x] != x) x = a->parent[x] = a->parent[a->parent[x]];
    return x;
}

static uint32_t unite(split_an *a, uint32_t x, uint32_t y)
{
    if (x == KILN_IDX_NONE) return find(a, y);
    x = find(a, x), y = find(a, y);
    if (x != y) a->parent[y] = x;
    return x;
}

static pass_result refuse(split_an *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Keeps why something stays whole (the first three distinct reasons), for messages. */
static void note(split_an *a, const char *msg)
{
    for (int k = 0; k < a->n_quiet; k++)
        if (!strcmp(a->quiet[k], msg)) return;
    if (a->n_quiet < 3) snprintf(a->quiet[a->n_quiet++], sizeof a->quiet[0], "%s", msg);
}

/* The group of node x cannot stay divided: its seeds are banned and the pass runs again. */
static pass_result retry(split_an *a, uint32_t x, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static pass_result retry(split_an *a, uint32_t x, const char *fmt, ...)
{
    uint32_t r = find(a, x), banned = 0;
    for (uint32_t i = 0; i < a->g->n_nodes; i++)
        if (a->seeded[i] && find(a, i) == r && !a->banned[i]) a->banned[i] = true, banned++;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!banned) return refuse(a, "%s", msg); /* nothing left to replicate: never loop */
    note(a, msg);
    return PASS_RETRY;
}

static pass_result refuse(split_an *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static pass_result refuse(split_an *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(a->why, a->n_why, "cannot split across %d devices: ", a->n);
    if (k > 0 && (size_t)k < a->n_why) vsnprintf(a->why + k, a->n_why - (size_t)k, fmt, ap);
    va_end(ap);
    return PASS_REFUSE;
}

/* The kind an operand is read with: a partial sum is all-reduced first, a gathered output joined,
 * an undecided state whole. */
static uint8_t read_kind(split_an *a, uint32_t s)
{
    if (a->kind[s] == KILN_SPLIT_AXIS && a->gathered[s]) return KILN_SPLIT_REPL;
    if (a->kind[s] == KILN_SPLIT_PARTIAL) {
        a->reduce[s] = true;
        return KILN_SPLIT_REPL;
    }
    if (a->kind[s] == KIND_UNSET) a->kind[s] = KILN_SPLIT_REPL;
    return a->kind[s];
}

/* A column-parallel matmul's [rows, cols / N] output can be joined whole by an all-gather (a head
 * split by vocabulary): marked for the passes that follow, which read it whole. */
static bool gather(split_an *a, uint32_t s)
{
    const kiln_node_rec *n = &a->g->nodes[s];
    if (n->op != KILN_OP_MATMUL || !a->seeded[s] || n->rank != 2 || a->axis[s] != 1 || n->dtype != KILN_DTYPE_F32) return false;
    a->gathered[s] = true;
    return true;
}

/* Operand s read whole: a weight sliced by a group other than matmuls' cannot also be read whole
 * (a matmul's slice and the whole are then both kept: a tied embedding and vocabulary-split head). */
static pass_result need_whole(split_an *a, uint32_t s, uint32_t reader)
{
    char l1[160], l2[160];
    if (a->g->nodes[s].op == KILN_OP_WEIGHT) {
        if (a->wslice[s] >= 0 && a->wother[s]) return retry(a, s, "weight %s is also read whole", label(a->g, s, l1, sizeof l1));
        a->wrepl[s] = true;
        return PASS_OK;
    }
    uint8_t k = read_kind(a, s);
    if (k == KILN_SPLIT_AXIS && gather(a, s)) return PASS_RETRY;
    if (k == KILN_SPLIT_AXIS)
        return retry(a, s, "%s needs %s whole", label(a->g, reader, l1, sizeof l1), label(a->g, s, l2, sizeof l2));
    return PASS_OK;
}

static void set_axis(split_an *a, uint32_t i, int ax, uint32_t grp)
{
    a->kind[i] = KILN_SPLIT_AXIS;
    a->axis[i] = (int8_t)ax;
    unite(a, grp, i);
}

/* Weight w sliced along `ax` for group grp (by a matmul: mm): whole slices of equal size, blocks kept whole. */
static pass_result slice_weight(split_an *a, uint32_t w, int ax, uint32_t grp, bool mm)
{
    const kiln_node_rec *n = &a->g->nodes[w];
    char l[160];
    int64_t d = n->dims[ax], blk = ax == n->rank - 1 ? kiln_dtype_block((kiln_dtype)n->dtype) : 1;
    if (d % a->n || (d / a->n) % blk)
        return retry(a, grp, "%s: dim %d (%lld) in %d slices is not whole %s blocks", label(a->g, w, l, sizeof l), ax,
                     (long long)d, a->n, kiln_dtype_name((kiln_dtype)n->dtype));
    if ((a->wrepl[w] && !mm) || (a->wslice[w] >= 0 && a->wslice[w] != ax))
        return retry(a, grp, "weight %s is read whole and sliced", label(a->g, w, l, sizeof l));
    a->wslice[w] = (int8_t)ax;
    a->wother[w] |= !mm;
    set_axis(a, w, ax, grp);
    return PASS_OK;
}

static pass_result do_elementwise(split_an *a, uint32_t i)
{
    const kiln_node_rec *n = &a->g->nodes[i];
    int R = n->rank, ax = -1;
    uint32_t grp = KILN_IDX_NONE;
    for (int k = 0; k < n->n_src; k++) {
        uint32_t s = n->src[k];
        if (s == KILN_IDX_NONE || read_kind(a, s) != KILN_SPLIT_AXIS) continue;
        int oa = a->axis[s] + R - a->g->nodes[s].rank;
        if (ax >= 0 && oa != ax) return retry(a, s, "operands of #%u divided along different axes", i);
        ax = oa;
        grp = unite(a, grp, s);
    }
    if (ax < 0) a->kind[i] = KILN_SPLIT_REPL;
    for (int k = 0; k < n->n_src; k++) {
        uint32_t s = n->src[k];
        if (s == KILN_IDX_NONE || a->kind[s] == KILN_SPLIT_AXIS) continue;
        int sa = ax - (R - a->g->nodes[s].rank); /* the divided axis in s (broadcast operands are trailing) */
        pass_result r = ax < 0 || sa < 0 ? need_whole(a, s, i)
                      : a->g->nodes[s].op == KILN_OP_WEIGHT ? slice_weight(a, s, sa, grp, false)
                      : retry(a, grp, "#%u: a computed operand would need slicing", i);
        if (r != PASS_OK) return r;
    }
    if (ax >= 0) set_axis(a, i, ax, grp);
    return PASS_OK;
}

static pass_result do_matmul(split_an *a, uint32_t i)
{
    const kiln_node_rec *n = &a->g->nodes[i];
    uint32_t x = n->src[0], w = n->src[1];
    bool is_w = a->g->nodes[w].op == KILN_OP_WEIGHT;
    uint8_t k = read_kind(a, x);
    char l[160];
    if (k == KILN_SPLIT_REPL) {
        if (is_w && !a->banned[i] && a->g->nodes[w].dims[0] % a->n == 0) { /* column-parallel */
            a->seeded[i] = true;
            set_axis(a, i, n->rank - 1, i);
            return slice_weight(a, w, 0, i, true);
        }
        if (is_w && a->g->nodes[w].dims[0] % a->n) {
            char msg[200];
            snprintf(msg, sizeof msg, "%s: %lld output rows do not divide by %d", label(a->g, i, l, sizeof l),
                     (long long)a->g->nodes[w].dims[0], a->n);
            note(a, msg);
        }
        a->kind[i] = KILN_SPLIT_REPL;
        return need_whole(a, w, i);
    }
    if (a->axis[x] != a->g->nodes[x].rank - 1 || !is_w)
        return retry(a, x, "%s reads x divided along a dim other than K", label(a->g, i, l, sizeof l));
    a->kind[i] = KILN_SPLIT_PARTIAL; /* row-parallel */
    unite(a, x, i);
    return slice_weight(a, w, 1, x, true);
}

/* A cache read or written divided by KV heads: an undecided state takes that split. */
static pass_result cache_divided(split_an *a, uint32_t s, uint32_t reader, uint32_t grp)
{
    char l1[160], l2[160];
    if (a->kind[s] == KIND_UNSET && a->g->nodes[s].op == KILN_OP_STATE) set_axis(a, s, 0, grp);
    if (a->kind[s] != KILN_SPLIT_AXIS || a->axis[s] != 0)
        return retry(a, grp, "%s reads cache %s whole", label(a->g, reader, l1, sizeof l1), label(a->g, s, l2, sizeof l2));
    if (a->g->nodes[s].dims[0] % a->n)
        return refuse(a, "%s: %lld KV heads do not divide by %d", label(a->g, reader, l1, sizeof l1),
                      (long long)a->g->nodes[s].dims[0], a->n);
    unite(a, grp, s);
    return PASS_OK;
}

static pass_result do_attention(split_an *a, uint32_t i, int n_cache, int first_meta)
{
    const kiln_node_rec *n = &a->g->nodes[i];
    uint32_t q = n->src[0];
    char l[160];
    if (read_kind(a, q) == KILN_SPLIT_REPL) {
        a->kind[i] = KILN_SPLIT_REPL;
        for (int k = 1; k < n->n_src; k++) {
            pass_result r = n->src[k] == KILN_IDX_NONE ? PASS_OK : need_whole(a, n->src[k], i);
            if (r != PASS_OK) return r;
        }
        return PASS_OK;
    }
    if (a->axis[q] != 1) return retry(a, q, "%s: queries divided along dim %d, not heads", label(a->g, i, l, sizeof l), a->axis[q]);
    for (int k = 1; k <= n_cache; k++) {
        pass_result r = cache_divided(a, n->src[k], i, q);
        if (r != PASS_OK) return r;
    }
    for (int k = first_meta; k < n->n_src; k++) {
        pass_result r = n->src[k] == KILN_IDX_NONE ? PASS_OK : need_whole(a, n->src[k], i);
        if (r != PASS_OK) return r;
    }
    set_axis(a, i, 1, q);
    return PASS_OK;
}

static pass_result do_scatter(split_an *a, uint32_t i)
{
    const kiln_node_rec *n = &a->g->nodes[i];
    uint32_t st = n->src[0], rows = n->src[1];
    pass_result r = need_whole(a, n->src[2], i);
    if (r != PASS_OK) return r;
    if (read_kind(a, rows) == KILN_SPLIT_REPL) {
        a->kind[i] = KILN_SPLIT_REPL;
        return need_whole(a, st, i);
    }
    char l[160];
    if (a->axis[rows] != 1) return retry(a, rows, "%s: rows divided along dim %d, not heads", label(a->g, i, l, sizeof l), a->axis[rows]);
    if ((r = cache_divided(a, st, i, rows)) != PASS_OK) return r;
    set_axis(a, i, 0, rows);
    return PASS_OK;
}

/* Product of dims [from, to) as a constant times a sorted list of symbols. */
typedef struct dprod { int64_t c; int ns; int64_t s[KILN_MAX_RANK]; } dprod;
static dprod prod(const int64_t *d, int from, int to)
{
    dprod p = {.c = 1};
    for (int k = from; k < to; k++) {
        if (!kiln_dim_is_sym(d[k])) { p.c *= d[k]; continue; }
        int j = p.ns++;
        while (j > 0 && p.s[j - 1] > d[k]) p.s[j] = p.s[j - 1], j--;
        p.s[j] = d[k];
    }
    return p;
}
static bool prod_eq(dprod x, dprod y) { return x.c == y.c && x.ns == y.ns && !memcmp(x.s, y.s, (size_t)x.ns * sizeof x.s[0]); }

static pass_result do_reshape(split_an *a, uint32_t i)
{
    const kiln_node_rec *n = &a->g->nodes[i], *s = &a->g->nodes[n->src[0]];
    if (read_kind(a, n->src[0]) == KILN_SPLIT_REPL) {
        a->kind[i] = KILN_SPLIT_REPL;
        return PASS_OK;
    }
    char l[160];
    int ax = a->axis[n->src[0]];
    dprod before = prod(s->dims, 0, ax);
    for (int b = 0; b < n->rank; b++) {
        if (kiln_dim_is_sym(n->dims[b]) || n->dims[b] == 1 || !prod_eq(prod(n->dims, 0, b), before)) continue;
        if (n->dims[b] % a->n)
            return refuse(a, "%s to %s: dim %d = %lld%s does not divide by %d", label(a->g, i, l, sizeof l),
                          kiln_graph_dims_str(a->g, n->rank, n->dims, (char[120]){0}, 120), b, (long long)n->dims[b],
                          n->rank == 3 && b == 1 ? " (heads)" : "", a->n);
        set_axis(a, i, b, n->src[0]);
        return PASS_OK;
    }
    return retry(a, n->src[0], "%s: the divided dim does not map to one dim of the result", label(a->g, i, l, sizeof l));
}

/* Row ops (norms, softmax, rope, argmax) work along the last dim: divided elsewhere they stay so. */
static pass_result do_rows(split_an *a, uint32_t i)
{
    const kiln_node_rec *n = &a->g->nodes[i];
    uint32_t x = n->src[0];
    char l[160];
    for (int k = 1; k < n->n_src; k++) {
        pass_result r = n->src[k] == KILN_IDX_NONE ? PASS_OK : need_whole(a, n->src[k], i);
        if (r != PASS_OK) return r;
    }
    if (read_kind(a, x) == KILN_SPLIT_REPL) {
        a->kind[i] = KILN_SPLIT_REPL;
        return PASS_OK;
    }
    if (a->axis[x] >= a->g->nodes[x].rank - 1 && gather(a, x)) return PASS_RETRY;
    if (a->axis[x] >= a->g->nodes[x].rank - 1)
        return retry(a, x, "%s works along the divided dim", label(a->g, i, l, sizeof l));
    set_axis(a, i, a->axis[x], x);
    return PASS_OK;
}

static pass_result do_node(split_an *a, uint32_t i)
{
    const kiln_node_rec *n = &a->g->nodes[i];
    char l[160];
    switch ((enum kiln_op)n->op) {
    case KILN_OP_INPUT: case KILN_OP_WEIGHT: a->kind[i] = KILN_SPLIT_REPL; return PASS_OK;
    case KILN_OP_STATE: a->kind[i] = KIND_UNSET; return PASS_OK;
    case KILN_OP_MATMUL: return do_matmul(a, i);
    case KILN_OP_ATTENTION: return do_attention(a, i, 2, 3);
    case KILN_OP_PAGED_ATTENTION: return do_attention(a, i, 2, 3);
    case KILN_OP_KV_SCATTER: return do_scatter(a, i);
    case KILN_OP_RESHAPE: return do_reshape(a, i);
    case KILN_OP_RMS_NORM: case KILN_OP_LAYER_NORM: case KILN_OP_SOFTMAX: case KILN_OP_ROPE: case KILN_OP_ARGMAX:
        return do_rows(a, i);
    case KILN_OP_ALL_REDUCE: return refuse(a, "the graph already holds %s (split a graph once)", label(a->g, i, l, sizeof l));
    case KILN_OP_TRANSPOSE:
        if (read_kind(a, n->src[0]) == KILN_SPLIT_AXIS) {
            int ax = a->axis[n->src[0]];
            set_axis(a, i, ax == n->i[0] ? n->i[1] : ax == n->i[1] ? n->i[0] : ax, n->src[0]);
            return PASS_OK;
        }
        a->kind[i] = KILN_SPLIT_REPL;
        return PASS_OK;
    default:
        if (kiln_op_is_elementwise((enum kiln_op)n->op)) return do_elementwise(a, i);
        a->kind[i] = KILN_SPLIT_REPL; /* view, concat, get_rows: their operands whole */
        for (int k = 0; k < n->n_src; k++) {
            pass_result r = n->src[k] == KILN_IDX_NONE ? PASS_OK : need_whole(a, n->src[k], i);
            if (r != PASS_OK) return r;
        }
        return PASS_OK;
    }
}

static pass_result run_pass(split_an *a)
{
    const kiln_graph *g = a->g;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        a->parent[i] = i;
        a->axis[i] = -1;
        a->wslice[i] = -1;
        a->wrepl[i] = a->wother[i] = a->reduce[i] = a->seeded[i] = false;
    }
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        pass_result r = do_node(a, i);
        if (r != PASS_OK) return r;
    }
    for (uint32_t o = 0; o < g->n_outs; o++) {
        uint32_t i = g->outs[o].node;
        if (a->kind[i] == KILN_SPLIT_AXIS && !a->gathered[i] && gather(a, i)) return PASS_RETRY;
        if (a->kind[i] == KILN_SPLIT_AXIS && !a->gathered[i]) return retry(a, i, "output '%s' is wanted whole", g->outs[o].name);
        if (a->kind[i] == KILN_SPLIT_PARTIAL) a->reduce[i] = true;
    }
    for (uint32_t i = 0; i < g->n_nodes; i++)
        if (a->kind[i] == KIND_UNSET) a->kind[i] = KILN_SPLIT_REPL;
    return PASS_OK;
}

void kiln_split_free(kiln_split *s)
{
    if (!s) return;
    for (int p = 0; s->parts && p < s->n; p++) kiln_graph_free(s->parts[p]);
    free(s->parts);
    free(s->kind);
    free(s->axis);
    free(s->part_node);
    free(s->choices);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------------ part graphs */

/* Slice p of weight w along its split axis, in a new blob (block rows cut at block boundaries). */
static kiln_status slice_bytes(const kiln_node_rec *w, int ax, int n, int p, kiln_node_rec *out)
{
    int R = w->rank;
    kiln_dtype t = (kiln_dtype)w->dtype;
    size_t row = kiln_row_bytes(t, w->dims[R - 1]), outer = 1, inner, chunk;
    for (int k = 0; k < (ax == R - 1 ? R - 1 : ax); k++) outer *= (size_t)w->dims[k];
    if (ax == R - 1) inner = row, chunk = kiln_row_bytes(t, w->dims[R - 1] / n);
    else {
        inner = row;
        for (int k = ax; k < R - 1; k++) inner *= (size_t)w->dims[k];
        chunk = inner / (size_t)n;
    }
    const unsigned char *src = w->data;
    void *tmp = NULL;
    if (!src) { /* a random weight not materialized: its bytes first */
        int64_t d[KILN_MAX_RANK];
        for (int k = 0; k < KILN_MAX_RANK; k++) d[k] = k < R ? w->dims[k] : 0;
        if (!(tmp = malloc(kiln_node_bytes(w, d) + 1))) return KILN_ERR_NOMEM;
        kiln_status s = kiln_graph_weight_fill(w, tmp);
        if (s != KILN_OK) { free(tmp); return s; }
        src = tmp;
    }
    void *dst;
    kiln_blob *b = kiln_blob_new(outer * chunk, &dst);
    if (b)
        for (size_t o = 0; o < outer; o++) memcpy((unsigned char *)dst + o * chunk, src + o * inner + (size_t)p * chunk, chunk);
    free(tmp);
    if (!b) return KILN_ERR_NOMEM;
    out->blob = b, out->data = dst;
    out->random = false, out->seed = 0, out->rand_scale = 0;
    return KILN_OK;
}

/* How part graphs map source nodes: map[i] the node itself (a dual weight's whole copy), join[i]
 * the value its whole readers take (after its all_reduce or all_gather) or KILN_IDX_NONE, wsl[i] a
 * dual weight's slice (read by its matmuls). */
typedef struct part_map {
    uint32_t *map, *join, *wsl;
} part_map;

/* The node reader's slot k reads in the part graph. */
static uint32_t mapped(const kiln_graph *g, const kiln_split *s, const part_map *m, uint32_t reader, int k)
{
    uint32_t x = g->nodes[reader].src[k];
    if (m->join[x] != KILN_IDX_NONE) return m->join[x];
    bool sliced_reader = g->nodes[reader].op == KILN_OP_MATMUL && k == 1 && s->kind[reader] != KILN_SPLIT_REPL;
    return sliced_reader && m->wsl[x] != KILN_IDX_NONE ? m->wsl[x] : m->map[x];
}

/* Appends node i of g (operands mapped, divided dims, sliced weight unless whole) to part graph pg. */
static kiln_status append_node(kiln_graph *pg, const kiln_graph *g, uint32_t i, const kiln_split *s, int p, const part_map *m,
                               bool whole)
{
    kiln_node_rec r = g->nodes[i];
    for (int k = 0; k < r.n_src; k++)
        if (r.src[k] != KILN_IDX_NONE) r.src[k] = mapped(g, s, m, i, k);
    bool divided = s->kind[i] == KILN_SPLIT_AXIS && !whole;
    if (divided) r.dims[s->axis[i]] /= s->n;
    r.blob = NULL;
    if (r.op == KILN_OP_WEIGHT && divided) {
        kiln_status st = slice_bytes(&g->nodes[i], s->axis[i], s->n, p, &r);
        if (st != KILN_OK) return st;
    } else if (g->nodes[i].blob) {
        kiln_blob_ref(g->nodes[i].blob);
        r.blob = g->nodes[i].blob;
    }
    if (kiln_graph_append(pg, &r) == KILN_NODE_NONE) {
        kiln_blob_unref(r.blob);
        return KILN_ERR_NOMEM;
    }
    kiln_node_rec *q = &pg->nodes[pg->n_nodes - 1];
    if (g->nodes[i].name && !(q->name = strdup(g->nodes[i].name))) return KILN_ERR_NOMEM;
    if (g->nodes[i].vec) {
        if (!(q->vec = malloc(g->nodes[i].n_vec * sizeof *q->vec))) return KILN_ERR_NOMEM;
        memcpy(q->vec, g->nodes[i].vec, g->nodes[i].n_vec * sizeof *q->vec);
        q->n_vec = g->nodes[i].n_vec;
    }
    return KILN_OK;
}

/* Appends an op of one source (x) with the given shape and int params; its index. */
static uint32_t append_op(kiln_graph *pg, enum kiln_op op, uint32_t x, int rank, const int64_t *dims, int i0, int i1)
{
    kiln_node_rec r = {.op = (uint8_t)op, .dtype = pg->nodes[x].dtype, .rank = (uint8_t)rank, .n_src = 1, .i = {i0, i1}};
    memcpy(r.dims, dims, (size_t)rank * sizeof *dims);
    for (int k = 0; k < KILN_MAX_SRC; k++) r.src[k] = KILN_IDX_NONE;
    r.src[0] = x;
    return kiln_graph_append(pg, &r) == KILN_NODE_NONE ? KILN_IDX_NONE : pg->n_nodes - 1;
}

/* The joins after part node x (source node i): an all_reduce of a partial sum, or for a [rows, c/N]
 * slice an all_gather ([N, rows, c/N], NCCL's layout), transpose ([rows, N, c/N]) and reshape. */
static uint32_t append_join(kiln_graph *pg, const kiln_split *s, uint32_t i, uint32_t x)
{
    const kiln_node_rec *n = &pg->nodes[x];
    if (s->kind[i] == KILN_SPLIT_PARTIAL) return append_op(pg, KILN_OP_ALL_REDUCE, x, n->rank, n->dims, s->n, 0);
    int64_t rows = n->dims[0], c = n->dims[1];
    uint32_t y = append_op(pg, KILN_OP_ALL_GATHER, x, 3, (int64_t[]){s->n, rows, c}, s->n, 0);
    if (y != KILN_IDX_NONE) y = append_op(pg, KILN_OP_TRANSPOSE, y, 3, (int64_t[]){rows, s->n, c}, 0, 1);
    return y == KILN_IDX_NONE ? y : append_op(pg, KILN_OP_RESHAPE, y, 2, (int64_t[]){rows, c * s->n}, 0, 0);
}

static kiln_status build_part(const kiln_graph *g, const uint8_t *join, const bool *dual, kiln_split *s, int p, part_map *m)
{
    kiln_graph *pg;
    if (kiln_graph_new(&pg) != KILN_OK) return KILN_ERR_NOMEM;
    s->parts[p] = pg;
    if (!(pg->syms = calloc(g->n_syms ? g->n_syms : 1, sizeof *pg->syms))) return KILN_ERR_NOMEM;
    for (; pg->n_syms < g->n_syms; pg->n_syms++) {
        pg->syms[pg->n_syms].max = g->syms[pg->n_syms].max;
        if (!(pg->syms[pg->n_syms].name = strdup(g->syms[pg->n_syms].name))) return KILN_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < g->n_nodes; i++) m->join[i] = m->wsl[i] = KILN_IDX_NONE;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        kiln_status st = append_node(pg, g, i, s, p, m, dual[i]);
        if (st != KILN_OK) return st;
        m->map[i] = pg->n_nodes - 1;
        if (dual[i]) { /* the matmuls' slice after the whole copy, named NAME.slice */
            if ((st = append_node(pg, g, i, s, p, m, false)) != KILN_OK) return st;
            m->wsl[i] = pg->n_nodes - 1;
            kiln_node_rec *q = &pg->nodes[m->wsl[i]];
            size_t len = q->name ? strlen(q->name) + 8 : 0;
            char *nm = len ? malloc(len) : NULL;
            if (len && !nm) return KILN_ERR_NOMEM;
            if (nm) snprintf(nm, len, "%s.slice", q->name);
            free(q->name);
            q->name = nm;
        }
        if (join[i] && (m->join[i] = append_join(pg, s, i, m->map[i])) == KILN_IDX_NONE) return KILN_ERR_NOMEM;
    }
    if (!(pg->outs = calloc(g->n_outs ? g->n_outs : 1, sizeof *pg->outs))) return KILN_ERR_NOMEM;
    for (; pg->n_outs < g->n_outs; pg->n_outs++) {
        uint32_t i = g->outs[pg->n_outs].node;
        pg->outs[pg->n_outs].node = m->join[i] != KILN_IDX_NONE ? m->join[i] : m->map[i];
        if (!(pg->outs[pg->n_outs].name = strdup(g->outs[pg->n_outs].name))) return KILN_ERR_NOMEM;
    }
    return pg->status;
}

static kiln_status build_parts(const kiln_graph *g, const uint8_t *join, const bool *dual, kiln_split *s)
{
    uint32_t nn = g->n_nodes ? g->n_nodes : 1;
    part_map m = {.join = calloc(nn, sizeof *m.join), .wsl = calloc(nn, sizeof *m.wsl)};
    s->part_node = m.map = calloc(nn, sizeof *s->part_node);
    s->parts = calloc((size_t)s->n, sizeof *s->parts);
    kiln_status st = m.join && m.wsl && s->part_node && s->parts ? KILN_OK : KILN_ERR_NOMEM;
    for (int p = 0; st == KILN_OK && p < s->n; p++) st = build_part(g, join, dual, s, p, &m);
    free(m.join), free(m.wsl);
    return st;
}

/* The weight names of the matmuls of group root r ("wq0, wk0, wv0, wo0"). */
static void group_names(const split_an *a, uint32_t r, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < a->g->n_nodes && o < n; i++) {
        const kiln_node_rec *nd = &a->g->nodes[i];
        if (nd->op != KILN_OP_MATMUL || a->kind[i] == KILN_SPLIT_REPL || find((split_an *)a, i) != r) continue;
        const char *w = a->g->nodes[nd->src[1]].name;
        o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? ", " : "", w ? w : "?");
    }
}

/* Predicted time of group root r split and replicated, summed over the smallest and largest step. */
static void group_times(split_an *a, uint32_t r, const kiln_device_profile *p, const int64_t *const *syms, double *split, double *whole)
{
    *split = *whole = 0;
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; i < a->g->n_nodes; i++) {
            if (a->kind[i] == KILN_SPLIT_REPL || a->kind[i] == KIND_UNSET || find(a, i) != r) continue;
            double t = kiln_split_node_time(a->g, i, syms[k], p), b = 0;
            *whole += t;
            *split += t / a->n;
            if (!a->reduce[i] && !a->gathered[i]) continue;
            int64_t d[KILN_MAX_RANK];
            kiln_node_numel(&a->g->nodes[i], syms[k], d);
            b = (double)kiln_node_bytes(&a->g->nodes[i], d);
            *split += a->reduce[i] ? kiln_split_reduce_time(b, a->n, p) : kiln_split_gather_time(b / a->n, a->n, p);
        }
}

/* Records (or updates) the verdict on the group of seed s. */
static kiln_split_choice *choice_for(split_an *a, uint32_t s)
{
    for (uint32_t k = 0; k < a->n_choices; k++)
        if (a->choices[k].seed == s) return &a->choices[k];
    if (a->n_choices == a->cap_choices) {
        uint32_t cap = a->cap_choices ? 2 * a->cap_choices : 16;
        kiln_split_choice *c = realloc(a->choices, cap * sizeof *c);
        if (!c) return NULL;
        a->choices = c, a->cap_choices = cap;
    }
    kiln_split_choice *c = &a->choices[a->n_choices++];
    memset(c, 0, sizeof *c);
    c->seed = s;
    return c;
}

/* The cost model weighs every group of the converged pass: a group predicted no faster split has
 * its seeds banned (true: the pass runs again). */
static bool weigh_groups(split_an *a, const kiln_device_profile *p, const int64_t *const *syms)
{
    bool again = false;
    for (uint32_t s = 0; s < a->g->n_nodes; s++) {
        if (!a->seeded[s] || a->banned[s]) continue;
        uint32_t r = find(a, s);
        bool first = true; /* weigh a group once, by its first seed */
        for (uint32_t t = 0; t < s && first; t++) first = !(a->seeded[t] && !a->banned[t] && find(a, t) == r);
        if (!first) continue;
        kiln_split_choice *c = choice_for(a, s);
        if (!c) return false;
        group_times(a, r, p, syms, &c->split_s, &c->whole_s);
        group_names(a, r, c->what, sizeof c->what);
        c->split = c->split_s < c->whole_s;
        if (c->split) continue;
        for (uint32_t t = s; t < a->g->n_nodes; t++)
            if (a->seeded[t] && find(a, t) == r) a->banned[t] = true;
        again = true;
    }
    return again;
}

/* Runs the passes to a fixed point; with a profile, the cost model's bans run them again. */
static pass_result analyse(split_an *a, const kiln_device_profile *prof)
{
    const kiln_graph *g = a->g;
    int64_t *lo = malloc((g->n_syms + 1) * sizeof *lo), *hi = malloc((g->n_syms + 1) * sizeof *hi);
    pass_result r = PASS_REFUSE;
    if (!lo || !hi) {
        snprintf(a->why, a->n_why, "out of memory splitting the graph");
        goto done;
    }
    for (uint32_t k = 0; k < g->n_syms; k++) lo[k] = 1, hi[k] = g->syms[k].max;
    const int64_t *syms[2] = {lo, hi};
    do
        while ((r = run_pass(a)) == PASS_RETRY) {} /* each retry bans a seed or gathers a node: it ends */
    while (r == PASS_OK && prof && weigh_groups(a, prof, syms));
done:
    free(lo), free(hi);
    return r;
}

kiln_status kiln_sched_split(const kiln_graph *g, int n, const kiln_device_profile *prof, kiln_split *out, char *err,
                             size_t n_err)
{
    memset(out, 0, sizeof *out);
    if (n < 2 || n > 64) {
        snprintf(err, n_err, "a split needs 2 to 64 devices, not %d", n);
        return KILN_ERR_INVALID_ARG;
    }
    uint32_t nn = g->n_nodes ? g->n_nodes : 1;
    split_an a = {.g = g, .n = n, .why = err, .n_why = n_err};
    a.kind = calloc(nn, 1), a.axis = calloc(nn, 1), a.parent = calloc(nn, sizeof *a.parent);
    a.seeded = calloc(nn, 1), a.banned = calloc(nn, 1), a.wslice = calloc(nn, 1), a.wrepl = calloc(nn, 1);
    a.reduce = calloc(nn, 1), a.wother = calloc(nn, 1), a.gathered = calloc(nn, 1);
    uint8_t *join = calloc(nn, 1);
    bool *dual = calloc(nn, 1);
    kiln_status st = KILN_ERR_NOMEM;
    if (!a.kind || !a.axis || !a.parent || !a.seeded || !a.banned || !a.wslice || !a.wrepl || !a.reduce || !a.wother ||
        !a.gathered || !join || !dual)
        goto done;
    pass_result r = analyse(&a, prof);
    st = KILN_ERR_UNSUPPORTED;
    if (r == PASS_REFUSE) goto done;
    uint32_t n_col = 0;
    for (uint32_t i = 0; i < g->n_nodes; i++) n_col += a.seeded[i];
    if (!n_col && a.n_choices) {
        snprintf(err, n_err, "cannot split across %d devices: the cost model keeps every matmul replicated (%s: split %.3g s, "
                 "replicated %.3g s; profile link_bw, link_latency_s)", n, a.choices[0].what, a.choices[0].split_s, a.choices[0].whole_s);
        goto done;
    }
    if (!n_col) {
        snprintf(err, n_err, "cannot split across %d devices: no matmul can be divided%s%s", n, a.n_quiet ? " (" : "",
                 a.n_quiet ? a.quiet[0] : "");
        if (a.n_quiet) strncat(err, ")", n_err - strlen(err) - 1);
        goto done;
    }
    out->n = n;
    out->n_src = g->n_nodes;
    out->kind = a.kind, a.kind = NULL;
    out->axis = a.axis, a.axis = NULL;
    out->choices = a.choices, a.choices = NULL;
    out->n_choices = a.n_choices;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *nd = &g->nodes[i];
        out->n_col += a.seeded[i];
        out->n_row += nd->op == KILN_OP_MATMUL && out->kind[i] == KILN_SPLIT_PARTIAL;
        join[i] = a.reduce[i] || (a.gathered[i] && out->kind[i] == KILN_SPLIT_AXIS);
        out->n_reduce += a.reduce[i];
        out->n_gather += join[i] && !a.reduce[i];
        dual[i] = nd->op == KILN_OP_WEIGHT && out->kind[i] == KILN_SPLIT_AXIS && a.wrepl[i];
        out->n_dual += dual[i];
        out->n_split_states += nd->op == KILN_OP_STATE && out->kind[i] == KILN_SPLIT_AXIS;
    }
    st = build_parts(g, join, dual, out);
    if (st != KILN_OK) kiln_split_free(out);
done:
    if (st == KILN_ERR_NOMEM) snprintf(err, n_err, "out of memory splitting the graph");
    free(a.kind), free(a.axis), free(a.parent), free(a.seeded), free(a.banned), free(a.wslice), free(a.wrepl);
    free(a.reduce), free(a.wother), free(a.gathered), free(a.choices), free(join), free(dual);
    return st;
}

/* Appends the names (or #ids) of the nodes of op `op` (any op: KILN_OP_COUNT) and kind `kind`. */
static void list_nodes(const kiln_split *s, const kiln_graph *g, int op, uint8_t kind, bool weights_of, char *buf, size_t n)
{
    size_t o = strlen(buf);
    int k = 0;
    for (uint32_t i = 0; i < g->n_nodes && o < n; i++) {
        const kiln_node_rec *r = &g->nodes[i];
        if (r->op != op || s->kind[i] != kind) continue;
        const kiln_node_rec *nm = weights_of ? &g->nodes[r->src[1]] : r; /* a matmul by its weight's name */
        if (k++ == 8) {
            o += (size_t)snprintf(buf + o, n - o, ", ...");
            break;
        }
        o += nm->name ? (size_t)snprintf(buf + o, n - o, "%s%s", k > 1 ? ", " : "", nm->name)
                      : (size_t)snprintf(buf + o, n - o, "%s#%u", k > 1 ? ", " : "", i);
    }
    if (!k && o < n) snprintf(buf + o, n - o, "none");
}

void kiln_split_describe(const kiln_split *s, const kiln_graph *g, char *buf, size_t n)
{
    size_t o = strlen(buf);
    if (o >= n) return;
    snprintf(buf + o, n - o, "tensor-parallel split across %d devices: %u column-parallel matmuls (weight rows divided: ",
             s->n, s->n_col);
    list_nodes(s, g, KILN_OP_MATMUL, KILN_SPLIT_AXIS, true, buf, n);
    o = strlen(buf);
    snprintf(buf + o, n - o, "), %u row-parallel (weight columns divided, partial sums: ", s->n_row);
    list_nodes(s, g, KILN_OP_MATMUL, KILN_SPLIT_PARTIAL, true, buf, n);
    o = strlen(buf);
    snprintf(buf + o, n - o, "), %u all_reduce; states divided by heads: ", s->n_reduce);
    list_nodes(s, g, KILN_OP_STATE, KILN_SPLIT_AXIS, false, buf, n);
    o = strlen(buf);
    snprintf(buf + o, n - o, "; matmuls replicated: ");
    list_nodes(s, g, KILN_OP_MATMUL, KILN_SPLIT_REPL, true, buf, n);
    o = strlen(buf);
    if (s->n_gather && o < n)
        o += (size_t)snprintf(buf + o, n - o, "; %u all_gather (output divided by columns joined whole: a head by vocabulary)",
                              s->n_gather);
    if (s->n_dual && o < n)
        o += (size_t)snprintf(buf + o, n - o, "; %u weight%s whole and sliced (tied embedding)", s->n_dual, s->n_dual > 1 ? "s" : "");
    if (o < n) o += (size_t)snprintf(buf + o, n - o, "\n");
    for (uint32_t k = 0; k < s->n_choices && o < n; k++) {
        const kiln_split_choice *c = &s->choices[k];
        o += (size_t)snprintf(buf + o, n - o, "  cost model: %s: split %.3g us, replicated %.3g us (smallest + largest step) -> %s\n",
                              c->what, c->split_s * 1e6, c->whole_s * 1e6, c->split ? "split" : "replicated");
    }
}
