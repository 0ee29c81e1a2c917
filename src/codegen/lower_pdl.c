/* Programmatic dependent launch (Hopper, PTX griddepcontrol): makes a lowered kernel safe to start
 * while the previous kernel of the stream still runs. GRID_LAUNCH goes first (the next kernel may
 * be scheduled as soon as every block of this one has started); GRID_WAIT goes at the top level
 * before the first store and the first read of a buffer some kernel writes (activations, states,
 * scratch), so what a kernel does before it is only address arithmetic and reads of weights, tables
 * and the host-written parameter buffer. The trigger carries no memory fence: correctness rests on
 * every kernel waiting, in every thread, for its predecessor's completion (which, by the same rule,
 * covers every earlier kernel); kiln_kir_verify checks it. Must not change what a kernel computes. */
#include "codegen/lower.h"

#include <stdlib.h>
#include <string.h>

/* Whether node's memory is a weight's (constant: written once at upload, by no kernel). Views and
 * reshapes are seen through to the node that owns the memory. */
static bool is_weight(const kiln_graph *g, uint32_t node)
{
    while (node < g->n_nodes && kiln_op_class_of((enum kiln_op)g->nodes[node].op) == KILN_OPC_ALIAS) node = g->nodes[node].src[0];
    return node < g->n_nodes && g->nodes[node].op == KILN_OP_WEIGHT;
}

/* Slots no kernel writes: the parameter buffer (the host writes it before the stream runs the plan),
 * constant tables, weights. */
static uint32_t const_slots(const kiln_kir *k, const kiln_graph *g)
{
    uint32_t m = 0;
    for (uint32_t s = 0; s < k->n_bufs && s < 32; s++) {
        const kiln_kbuf *b = &k->bufs[s];
        bool c = !b->written && (b->kind == KILN_KBUF_PARAMS || b->kind == KILN_KBUF_TABLE || (b->kind == KILN_KBUF_NODE && is_weight(g, b->node)));
        m |= (uint32_t)c << s;
    }
    return m;
}

/* Whether instruction in must come after the grid wait. */
static bool needs_wait(const kiln_kir *k, const kiln_kinst *in)
{
    switch (in->op) {
    case KILN_KOP_ST: case KILN_KOP_ST16: return true;
    case KILN_KOP_LD: case KILN_KOP_LD4: case KILN_KOP_PREFETCH: return !(in->imm.u < 32 && (k->pdl_const >> in->imm.u & 1));
    case KILN_KOP_TMA_LOAD: { /* reads its tensor map's slot */
        uint32_t slot = in->imm.u < k->n_tmaps ? k->tmaps[in->imm.u].slot : 32;
        return !(slot < 32 && (k->pdl_const >> slot & 1));
    }
    default: return false;
    }
}

/* Where the wait goes: before the top-level statement (the instruction, or the outermost loop/if)
 * that holds the first instruction needing it; the end when none does. */
static uint32_t wait_at(const kiln_kir *k)
{
    int depth = 0;
    uint32_t top = 0;
    for (uint32_t i = 0; i < k->n_ins; i++) {
        uint8_t op = k->ins[i].op;
        if (depth == 0) top = i;
        if (needs_wait(k, &k->ins[i])) return top;
        if (op == KILN_KOP_LOOP || op == KILN_KOP_IF) depth++;
        else if (op == KILN_KOP_ENDLOOP || op == KILN_KOP_ENDIF) depth--;
    }
    return k->n_ins;
}

/* Inserts an operand-less NONE instruction of op at position `at`; later operands are renumbered. */
static void insert_at(kiln_kir *k, uint32_t at, enum kiln_kop op)
{
    uint32_t end = k->n_ins;
    kiln_kir_op(k, op, KILN_KT_NONE, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0); /* grows the array */
    if (k->oom) return;
    kiln_kinst ins = k->ins[end];
    memmove(&k->ins[at + 1], &k->ins[at], (end - at) * sizeof *k->ins);
    k->ins[at] = ins;
    for (uint32_t i = at + 1; i <= end; i++) {
        kiln_kinst *in = &k->ins[i];
        if (in->a != KILN_IDX_NONE && in->a >= at) in->a++;
        if (in->b != KILN_IDX_NONE && in->b >= at) in->b++;
        if (in->c != KILN_IDX_NONE && in->c >= at) in->c++;
    }
}

void kl_pdl_apply(kiln_kir *k, const kiln_graph *g)
{
    if (k->oom || k->pdl) return;
    k->pdl_const = const_slots(k, g);
    insert_at(k, wait_at(k), KILN_KOP_GRID_WAIT);
    insert_at(k, 0, KILN_KOP_GRID_LAUNCH);
    k->pdl = true;
}

void kl_pdl_prefetch_tail(kiln_kir *k, uint32_t from)
{
    if (k->oom || from >= k->n_ins) return;
    uint32_t n = k->n_ins - from, out = from;
    uint32_t *map = malloc(n * sizeof *map); /* new index of each tail value, KILN_IDX_NONE when it has none */
    if (!map) {
        k->oom = true;
        return;
    }
    for (uint32_t i = from; i < k->n_ins; i++) {
        kiln_kinst in = k->ins[i];
        uint32_t *ops[3] = {&in.a, &in.b, &in.c};
        bool dead = false;
        for (int j = 0; j < 3; j++)
            if (*ops[j] != KILN_IDX_NONE && *ops[j] >= from) {
                *ops[j] = map[*ops[j] - from];
                dead |= *ops[j] == KILN_IDX_NONE;
            }
        map[i - from] = KILN_IDX_NONE;
        if (dead) continue; /* computed from a loaded value */
        if (in.op == KILN_KOP_LD || in.op == KILN_KOP_LD4) {
            in.op = KILN_KOP_PREFETCH;
            in.type = KILN_KT_NONE;
            k->ins[out++] = in;
            continue;
        }
        map[i - from] = out;
        k->ins[out++] = in;
    }
    k->n_ins = out;
    free(map);
}
