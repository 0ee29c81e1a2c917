/* Cache-entry metadata of lowered kernels (kir_blob.h): the writer and the checked reader cuda
 * and vulkan share. Must not know any backend; must not trust a byte of an entry. */
#include "codegen/kir_blob.h"

#include <stdio.h>

static uint64_t max_scratch(const kiln_kir *kirs, uint32_t n)
{
    uint64_t s = 0;
    for (uint32_t i = 0; i < n; i++)
        if (kirs[i].scratch_bytes > s) s = kirs[i].scratch_bytes;
    return s;
}

void kiln_kir_blob_head(kiln_blob_w *w, uint32_t magic, const kiln_kir *kirs, uint32_t n)
{
    kiln_blob_u32(w, magic);
    kiln_blob_u32(w, n);
    kiln_blob_u64(w, max_scratch(kirs, n));
}

bool kiln_kir_blob_head_ok(kiln_blob_r *rd, uint32_t magic, const kiln_kir *kirs, uint32_t n)
{
    uint32_t m = kiln_blob_get_u32(rd), nk = kiln_blob_get_u32(rd);
    uint64_t scratch = kiln_blob_get_u64(rd);
    return !rd->bad && m == magic && nk == n && scratch == max_scratch(kirs, n);
}

void kiln_kir_blob_put(kiln_blob_w *w, const kiln_kir *k)
{
    for (int d = 0; d < 3; d++) kiln_blob_u32(w, k->grid[d]); /* virtual blocks: a grid-stride launch is sized at load */
    kiln_blob_u32(w, k->block);
    kiln_blob_u32(w, k->grid_stride);
    kiln_blob_u32(w, k->n_bufs);
    for (uint32_t b = 0; b < k->n_bufs; b++) {
        kiln_blob_u32(w, k->bufs[b].kind);
        kiln_blob_u32(w, k->bufs[b].written);
        kiln_blob_u32(w, k->bufs[b].node);
    }
    kiln_blob_bytes(w, k->name, strlen(k->name) + 1);
    kiln_blob_u32(w, k->n_tables);
    for (uint32_t t = 0; t < k->n_tables; t++) kiln_blob_bytes(w, k->tables[t].words, (size_t)k->tables[t].n * 4);
    kiln_blob_u32(w, k->dyn_shared ? (uint32_t)kiln_kir_shared_bytes(k) : 0);
    kiln_blob_bytes(w, k->tmaps, k->n_tmaps * sizeof *k->tmaps);
}

/* The fields after the comparison with want: parsed as if untrusted all the same. */
static bool parse(kiln_blob_r *rd, const kiln_graph *g, kiln_kir_meta *m)
{
    for (int d = 0; d < 3; d++) m->grid[d] = kiln_blob_get_u32(rd);
    m->block = kiln_blob_get_u32(rd);
    uint32_t stride = kiln_blob_get_u32(rd);
    m->n_bufs = kiln_blob_get_u32(rd);
    if (rd->bad || m->n_bufs > KILN_KIR_MAX_BUFS || !m->block || m->block > 1024 || !m->grid[0] || !m->grid[1] ||
        !m->grid[2] || stride > 1)
        return false;
    m->grid_stride = stride != 0;
    for (uint32_t b = 0; b < m->n_bufs; b++) {
        uint32_t kind = kiln_blob_get_u32(rd), written = kiln_blob_get_u32(rd), node = kiln_blob_get_u32(rd);
        if (kind >= KILN_KBUF_KIND_COUNT || written > 1 || (kind == KILN_KBUF_NODE && node >= g->n_nodes) ||
            (kind == KILN_KBUF_TABLE && node >= KILN_KIR_MAX_TABLES))
            return false;
        m->bufs[b] = (kiln_kbuf){.kind = (uint8_t)kind, .written = written != 0, .node = node};
    }
    size_t name_n;
    m->name = kiln_blob_get_bytes(rd, &name_n);
    if (!m->name || !name_n || name_n > sizeof ((kiln_kir *)0)->name || m->name[name_n - 1] || strlen(m->name) != name_n - 1)
        return false;
    m->n_tables = kiln_blob_get_u32(rd);
    if (rd->bad || m->n_tables > KILN_KIR_MAX_TABLES) return false;
    for (uint32_t t = 0; t < m->n_tables; t++) {
        size_t bytes;
        const void *w = kiln_blob_get_bytes(rd, &bytes);
        if (rd->bad || bytes % 4 || bytes / 4 > UINT32_MAX) return false;
        m->tables[t] = (kiln_ktable){.words = (uint32_t *)(uintptr_t)w, .n = (uint32_t)(bytes / 4)};
    }
    for (uint32_t b = 0; b < m->n_bufs; b++)
        if (m->bufs[b].kind == KILN_KBUF_TABLE && m->bufs[b].node >= m->n_tables) return false;
    size_t tmap_bytes;
    m->dyn_shared_bytes = kiln_blob_get_u32(rd);
    (void)kiln_blob_get_bytes(rd, &tmap_bytes); /* the tensor maps: want's, compared byte for byte */
    if (rd->bad || tmap_bytes % sizeof(kiln_ktmap) || tmap_bytes / sizeof(kiln_ktmap) > KILN_KIR_MAX_TMAPS) return false;
    m->n_tmaps = (uint32_t)(tmap_bytes / sizeof(kiln_ktmap));
    return true;
}

kiln_status kiln_kir_blob_get(kiln_blob_r *rd, const kiln_graph *g, const kiln_kir *want, const char *who, kiln_kir_meta *m,
                              char *err, size_t n_err)
{
    kiln_blob_w meta = {0}; /* what this build's lowering says the slots, grid, name and tables are */
    kiln_kir_blob_put(&meta, want);
    bool same = !meta.oom && meta.n <= rd->n - rd->at && memcmp(rd->p + rd->at, meta.p, meta.n) == 0;
    free(meta.p);
    memset(m, 0, sizeof *m);
    if (!same) {
        snprintf(err, n_err, "%s: cache entry's launch metadata is not this region's (kernel %s)", who, want->name);
        return KILN_ERR_INVALID_ARG;
    }
    if (!parse(rd, g, m)) {
        snprintf(err, n_err, "%s: cache entry does not fit the region", who);
        return KILN_ERR_INVALID_ARG;
    }
    return KILN_OK;
}
