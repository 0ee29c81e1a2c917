/* The memory plan of a compiled plan: when each value is first and last needed, the liveness
 * packing of intermediates into one arena (the host's here; each device backend's in exec.c
 * through the same two functions), the states' own zeroed buffers, and the refusal of a plan
 * larger than the machine's memory before anything is allocated. Must not run anything. */
#include "sched/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALIGN 64

/* Region index where each root's value is last needed (outputs: forever). */
void kiln_sched_lifetimes(const kiln_plan *p, uint32_t *first, uint32_t *last)
{
    const kiln_graph *g = p->g;
    for (uint32_t i = 0; i < g->n_nodes; i++) first[i] = last[i] = p->fusion.region_of[i];
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        uint32_t r = p->fusion.region_of[i];
        if (r == KILN_IDX_NONE) continue; /* an alias reads nothing at run; its readers name its root */
        for (int s = 0; s < g->nodes[i].n_src; s++) {
            uint32_t src = g->nodes[i].src[s];
            if (src == KILN_IDX_NONE) continue;
            uint32_t root = p->root[src];
            if (last[root] == KILN_IDX_NONE || last[root] < r) last[root] = r;
        }
    }
    for (uint32_t i = 0; i < g->n_outs; i++) last[p->root[g->outs[i].node]] = UINT32_MAX - 1;
}

size_t kiln_sched_pack(uint32_t *order, uint32_t n_order, const size_t *size, const uint32_t *first, const uint32_t *last,
                       size_t *off_of)
{
    /* Greedy: biggest first, lowest offset that overlaps no placed buffer with an overlapping lifetime. */
    for (uint32_t a = 1; a < n_order; a++)
        for (uint32_t b = a; b > 0 && size[order[b]] > size[order[b - 1]]; b--) {
            uint32_t t = order[b]; order[b] = order[b - 1]; order[b - 1] = t;
        }
    size_t total = 0;
    for (uint32_t a = 0; a < n_order; a++) {
        uint32_t i = order[a];
        size_t off = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (uint32_t b = 0; b < a; b++) {
                uint32_t j = order[b];
                bool live = !(last[i] < first[j] || last[j] < first[i]);
                if (live && off < off_of[j] + size[j] && off_of[j] < off + size[i]) {
                    off = off_of[j] + size[j];
                    moved = true;
                }
            }
        }
        off_of[i] = off;
        if (off + size[i] > total) total = off + size[i];
    }
    return total;
}

/* States: zeroed memory. Large ones are mapped fresh (zero pages, no memset): from the heap, after
 * an earlier plan freed its states, glibc's raised mmap threshold would make calloc clear megabytes
 * of recycled memory on every compile. A 64-byte header keeps the size for kiln_sched_state_free. */
#define STATE_HEAD 64
#define STATE_MAP_MIN ((size_t)1 << 20)

static void *state_new(size_t bytes)
{
    size_t total = bytes + STATE_HEAD;
    unsigned char *m;
    if (total >= STATE_MAP_MIN) {
        m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;
    } else if (!(m = calloc(1, total))) {
        return NULL;
    }
    memcpy(m, &total, sizeof total);
    return m + STATE_HEAD;
}

void kiln_sched_state_free(void *p)
{
    if (!p) return;
    unsigned char *m = (unsigned char *)p - STATE_HEAD;
    size_t total;
    memcpy(&total, m, sizeof total);
    if (total >= STATE_MAP_MIN) munmap(m, total);
    else free(m);
}

/* Host memory a plan will hold at its symbols' bounds, against the machine's: a legal graph too
 * large to run is refused before anything is allocated, with the sizes named (issue #17), instead
 * of an allocation failing (or succeeding lazily and dying later). The states and the largest
 * intermediate must fit together (intermediates share the arena by liveness, so their sum is not
 * a floor). */
static kiln_status check_host_memory(const kiln_plan *p, const int64_t *maxv)
{
    const kiln_graph *g = p->g;
    unsigned __int128 states = 0, big = 0;
    uint32_t big_i = KILN_IDX_NONE;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *r = &g->nodes[i];
        if (kiln_op_is_alias((enum kiln_op)r->op) || r->op == KILN_OP_INPUT || r->op == KILN_OP_WEIGHT) continue;
        int64_t d[KILN_MAX_RANK];
        kiln_node_numel(r, maxv, d);
        size_t b = kiln_node_bytes(r, d);
        if (r->op == KILN_OP_STATE) states += b;
        else if (b > big) big = b, big_i = i;
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) return KILN_OK; /* unknown: the allocations decide */
    unsigned __int128 have = (unsigned __int128)pages * (unsigned __int128)psz;
    if (states + big <= have) return KILN_OK;
    char lab[300] = "none";
    if (big_i != KILN_IDX_NONE) {
        const kiln_node_rec *r = &g->nodes[big_i];
        if (r->name) snprintf(lab, sizeof lab, "%s '%s'", kiln_op_name((enum kiln_op)r->op), r->name);
        else snprintf(lab, sizeof lab, "%s #%u", kiln_op_name((enum kiln_op)r->op), big_i);
    }
    const double gib = 1073741824.0;
    return kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM,
                         "kiln_compile: the plan needs more host memory than this machine has: states %.4g GiB and its "
                         "largest intermediate %.4g GiB (%s) at the symbols' bounds, %.4g GiB of memory",
                         (double)states / gib, (double)big / gib, lab, (double)have / gib);
}

kiln_status kiln_sched_plan_memory(kiln_plan *p)
{
    const kiln_graph *g = p->g;
    uint32_t n = g->n_nodes;
    int64_t max_syms[64], *maxv = g->n_syms <= 64 ? max_syms : malloc(g->n_syms * sizeof(int64_t));
    uint32_t *first = malloc((n + 1) * sizeof *first), *last = malloc((n + 1) * sizeof *last);
    uint32_t *order = malloc((n + 1) * sizeof *order);
    size_t *size = calloc(n + 1, sizeof *size);
    kiln_status st = KILN_OK;
    if (!maxv || !first || !last || !order || !size) {
        st = kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "kiln_compile: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < g->n_syms; i++) maxv[i] = g->syms[i].max;
    if ((st = check_host_memory(p, maxv)) != KILN_OK) goto out;
    uint32_t n_order = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kiln_node_rec *r = &g->nodes[i];
        int64_t d[KILN_MAX_RANK];
        kiln_node_numel(r, maxv, d);
        p->arena_off[i] = SIZE_MAX;
        if (kiln_op_is_alias((enum kiln_op)r->op)) {
            p->root[i] = p->root[r->src[0]];
            p->offset[i] = p->offset[r->src[0]] +
                           (r->op == KILN_OP_VIEW ? (size_t)r->dim * kiln_dtype_block_bytes((kiln_dtype)r->dtype) : 0);
            continue;
        }
        p->root[i] = i;
        p->offset[i] = 0;
        if (r->op == KILN_OP_STATE) {
            /* calloc: large states come zeroed from fresh pages, so a big KV cache costs no memset. */
            if (!(p->state_mem[i] = state_new(kiln_node_bytes(r, d) + 1))) {
                st = kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "kiln_compile: out of memory for state '%s' (%zu bytes)", r->name,
                                   kiln_node_bytes(r, d));
                goto out;
            }
        } else if (r->op != KILN_OP_INPUT && r->op != KILN_OP_WEIGHT) {
            size[i] = (kiln_node_bytes(r, d) + ALIGN - 1) / ALIGN * ALIGN;
            order[n_order++] = i;
        }
    }
    kiln_sched_lifetimes(p, first, last);
    size_t total = kiln_sched_pack(order, n_order, size, first, last, p->arena_off);
    p->arena_bytes = total;
    if (!(p->arena = aligned_alloc(ALIGN, total ? total : ALIGN)))
        st = kiln_ctx_fail(p->ctx, KILN_ERR_NOMEM, "kiln_compile: out of memory for %zu bytes of intermediates", total);
out:
    if (maxv != max_syms) free(maxv);
    free(first); free(last); free(order); free(size);
    return st;
}
