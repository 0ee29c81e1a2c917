/* Region building. With fusion off, every op that computes is its own region. With fusion on,
 * the rules of DESIGN.md (Fusion) group ops around anchors; see rules.c. Reads a const graph and
 * writes a new kiln_fusion; never edits the graph. */
#include "fuse/fuse.h"

#include <stdlib.h>
#include <string.h>

static const char *const kind_names[KILN_REGION_KIND_COUNT] = {
    [KILN_REGION_NONE] = "none",     [KILN_REGION_MAP] = "map",         [KILN_REGION_ROWS] = "rows",
    [KILN_REGION_MATMUL] = "matmul", [KILN_REGION_ATTENTION] = "attention", [KILN_REGION_SCATTER] = "scatter",
    [KILN_REGION_MOVE] = "move",     [KILN_REGION_COLLECTIVE] = "collective",
};

const char *kiln_region_kind_name(enum kiln_region_kind k)
{
    return (unsigned)k < KILN_REGION_KIND_COUNT ? kind_names[k] : "?";
}

bool kiln_op_is_alias(enum kiln_op op)
{
    return op == KILN_OP_RESHAPE || op == KILN_OP_VIEW || op == KILN_OP_KV_SCATTER;
}

enum kiln_region_kind kiln_fuse_kind_of(enum kiln_op op)
{
    static const uint8_t kind[KILN_OPC_COUNT] = {
        [KILN_OPC_ELEMENTWISE] = KILN_REGION_MAP, [KILN_OPC_ROW] = KILN_REGION_ROWS, [KILN_OPC_MATMUL] = KILN_REGION_MATMUL,
        [KILN_OPC_ATTENTION] = KILN_REGION_ATTENTION, [KILN_OPC_SCATTER] = KILN_REGION_SCATTER, [KILN_OPC_MOVE] = KILN_REGION_MOVE,
        [KILN_OPC_COLLECTIVE] = KILN_REGION_COLLECTIVE,
    };
    return (enum kiln_region_kind)kind[kiln_op_class_of(op)]; /* leaves and aliases: KILN_REGION_NONE */
}

void kiln_fusion_free(kiln_fusion *f)
{
    if (!f) return;
    free(f->regions);
    free(f->region_of);
    free(f->pool);
    memset(f, 0, sizeof *f);
}

/* Groups: group[i] = id of the region node i joins (KILN_IDX_NONE: no kernel). Turns groups into
 * regions in order of their first node; a region's outputs are its nodes used outside it, graph
 * outputs, and anchors of kinds whose result must be stored (scatter writes the state). */
kiln_status kiln_fuse_regions_from_groups(const kiln_graph *g, const uint32_t *group, const uint32_t *anchor_of,
                                          const uint8_t *kind_of, kiln_fusion *out)
{
    uint32_t n = g->n_nodes;
    memset(out, 0, sizeof *out);
    out->region_of = malloc((n ? n : 1) * sizeof *out->region_of);
    out->pool = malloc((2 * (size_t)n + 1) * sizeof *out->pool);
    out->regions = calloc(n ? n : 1, sizeof *out->regions);
    uint32_t *gid2reg = malloc((n ? n : 1) * sizeof *gid2reg);
    bool *used_outside = calloc(n ? n : 1, sizeof *used_outside);
    uint32_t *count = calloc(n ? n : 1, sizeof *count); /* nodes per region */
    if (!out->region_of || !out->pool || !out->regions || !gid2reg || !used_outside || !count) {
        free(gid2reg);
        free(used_outside);
        free(count);
        kiln_fusion_free(out);
        return KILN_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < n; i++) gid2reg[i] = KILN_IDX_NONE;
    /* Regions are numbered in order of their first node. */
    for (uint32_t i = 0; i < n; i++) {
        out->region_of[i] = KILN_IDX_NONE;
        if (group[i] == KILN_IDX_NONE) continue;
        if (gid2reg[group[i]] == KILN_IDX_NONE) gid2reg[group[i]] = out->n_regions++;
        out->region_of[i] = gid2reg[group[i]];
        count[out->region_of[i]]++;
    }
    /* Which nodes are read outside their region (through aliases too: an alias is "outside"). */
    for (uint32_t i = 0; i < n; i++)
        for (int s = 0; s < g->nodes[i].n_src; s++) {
            uint32_t src = g->nodes[i].src[s];
            if (src != KILN_IDX_NONE && out->region_of[src] != KILN_IDX_NONE && out->region_of[src] != out->region_of[i])
                used_outside[src] = true;
        }
    for (uint32_t i = 0; i < g->n_outs; i++) used_outside[g->outs[i].node] = true;
    uint32_t off = 0;
    for (uint32_t r = 0; r < out->n_regions; r++) {
        out->regions[r].nodes = out->pool + off;
        off += count[r];
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = out->region_of[i];
        if (r == KILN_IDX_NONE) continue;
        kiln_region *reg = &out->regions[r];
        reg->nodes[reg->n_nodes++] = i;
        if (anchor_of[group[i]] == i) {
            reg->anchor = i;
            reg->kind = kind_of[group[i]] ? kind_of[group[i]] : (uint8_t)kiln_fuse_kind_of((enum kiln_op)g->nodes[i].op);
        }
    }
    for (uint32_t r = 0; r < out->n_regions; r++) {
        kiln_region *reg = &out->regions[r];
        reg->outs = out->pool + off;
        for (uint32_t j = 0; j < reg->n_nodes; j++) {
            uint32_t i = reg->nodes[j];
            if (used_outside[i] || g->nodes[i].op == KILN_OP_KV_SCATTER) reg->outs[reg->n_outs++] = i;
        }
        off += reg->n_outs;
        kiln_fuse_spec(g, reg); /* computed once, read by every consumer */
    }
    free(count);
    free(gid2reg);
    free(used_outside);
    return KILN_OK;
}

/* Every operand from outside a region must come from an earlier region (or a leaf). */
static bool regions_ordered(const kiln_graph *g, const kiln_fusion *f)
{
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        uint32_t r = f->region_of[i];
        if (r == KILN_IDX_NONE) continue;
        for (int s = 0; s < g->nodes[i].n_src; s++) {
            uint32_t p = g->nodes[i].src[s];
            while (p != KILN_IDX_NONE && f->region_of[p] == KILN_IDX_NONE && kiln_op_is_alias((enum kiln_op)g->nodes[p].op))
                p = g->nodes[p].src[0];
            if (p != KILN_IDX_NONE && f->region_of[p] != KILN_IDX_NONE && f->region_of[p] > r) return false;
        }
    }
    return true;
}

kiln_status kiln_fuse(const kiln_graph *g, bool fuse, kiln_fusion *out)
{
    uint32_t n = g->n_nodes;
    uint32_t *group = malloc((n ? n : 1) * sizeof *group);
    uint32_t *anchor_of = malloc((n ? n : 1) * sizeof *anchor_of);
    uint8_t *kind_of = calloc(n ? n : 1, 1);
    if (!group || !anchor_of || !kind_of) {
        free(group);
        free(anchor_of);
        free(kind_of);
        return KILN_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        bool kernel = kiln_fuse_kind_of((enum kiln_op)g->nodes[i].op) != KILN_REGION_NONE;
        group[i] = kernel ? i : KILN_IDX_NONE;
        anchor_of[i] = i;
    }
    if (fuse) kiln_fuse_apply_rules(g, group, anchor_of, kind_of);
    kiln_status s = kiln_fuse_regions_from_groups(g, group, anchor_of, kind_of, out);
    if (s == KILN_OK && fuse && !regions_ordered(g, out)) {
        /* A rule made a region that needs a later one: a bug in a rule, never a wrong answer. */
        kiln_fusion_free(out);
        for (uint32_t i = 0; i < n; i++) {
            group[i] = kiln_fuse_kind_of((enum kiln_op)g->nodes[i].op) != KILN_REGION_NONE ? i : KILN_IDX_NONE;
            anchor_of[i] = i;
            kind_of[i] = 0;
        }
        s = kiln_fuse_regions_from_groups(g, group, anchor_of, kind_of, out);
    }
    free(group);
    free(anchor_of);
    free(kind_of);
    return s;
}
