/* The lowering memo between a GPU backend's supports() and compile() (lower_memo.h). Must not
 * know any backend; keys are compared field by field, never by pointer alone. */
#include "codegen/lower_memo.h"

#include <stdlib.h>
#include <string.h>

static void drop(kiln_lower_memo_entry *e)
{
    for (uint32_t i = 0; i < e->n; i++) {
        kiln_kir_free(&e->kir[i]);
        free(e->text[i]);
    }
    free(e->key);
    memset(e, 0, sizeof *e);
}

static bool same(const kiln_lower_memo_entry *e, const kiln_graph *g, const kiln_region *r, const kiln_codegen_options *cg)
{
    if (!e->used || e->graph_id != g->id || e->graph_nodes != g->n_nodes || e->n_nodes != r->n_nodes ||
        e->n_key != r->n_nodes + r->n_outs || memcmp(&e->cg, cg, sizeof *cg) != 0)
        return false;
    return !memcmp(e->key, r->nodes, r->n_nodes * sizeof *r->nodes) &&
           !memcmp(e->key + r->n_nodes, r->outs, r->n_outs * sizeof *r->outs);
}

void kiln_lower_memo_put(kiln_lower_memo *m, const kiln_graph *g, const kiln_region *r, const kiln_codegen_options *cg,
                         kiln_kir kir[KILN_LOWER_MAX], char *text[KILN_LOWER_MAX], uint32_t n)
{
    for (uint32_t i = 0; i < KILN_LOWER_MEMO_N; i++)
        if (same(&m->e[i], g, r, cg)) drop(&m->e[i]); /* the newer lowering replaces it */
    kiln_lower_memo_entry *e = &m->e[m->next];
    m->next = (m->next + 1) % KILN_LOWER_MEMO_N;
    drop(e);
    uint32_t n_key = r->n_nodes + r->n_outs;
    e->key = malloc((n_key ? n_key : 1) * sizeof *e->key);
    e->n = n;
    for (uint32_t i = 0; i < n; i++) e->kir[i] = kir[i], e->text[i] = text ? text[i] : NULL;
    if (!e->key) { /* out of memory: keep nothing */
        drop(e);
        return;
    }
    memcpy(e->key, r->nodes, r->n_nodes * sizeof *r->nodes);
    memcpy(e->key + r->n_nodes, r->outs, r->n_outs * sizeof *r->outs);
    e->n_key = n_key, e->n_nodes = r->n_nodes;
    e->graph_id = g->id, e->graph_nodes = g->n_nodes;
    e->cg = *cg;
    e->used = true;
}

bool kiln_lower_memo_take(kiln_lower_memo *m, const kiln_graph *g, const kiln_region *r, const kiln_codegen_options *cg,
                          kiln_kir kir[KILN_LOWER_MAX], char *text[KILN_LOWER_MAX], uint32_t *n)
{
    for (uint32_t i = 0; i < KILN_LOWER_MEMO_N; i++) {
        kiln_lower_memo_entry *e = &m->e[i];
        if (!same(e, g, r, cg)) continue;
        memset(kir, 0, KILN_LOWER_MAX * sizeof *kir);
        for (uint32_t j = 0; j < e->n; j++) {
            kir[j] = e->kir[j];
            if (text) text[j] = e->text[j];
            else free(e->text[j]);
        }
        *n = e->n;
        e->n = 0; /* moved out */
        drop(e);
        return true;
    }
    return false;
}

void kiln_lower_memo_clear(kiln_lower_memo *m)
{
    for (uint32_t i = 0; i < KILN_LOWER_MEMO_N; i++) drop(&m->e[i]);
    m->next = 0;
}
