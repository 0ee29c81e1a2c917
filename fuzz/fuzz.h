/* Shared by the fuzz targets: the libFuzzer entry point they define, a size cap and a work cap
 * applied before compiling (a graph may declare tensors of any size and a legal matmul of any
 * shape; the harness only compiles graphs whose nodes, at their symbols' bounds, fit in
 * FUZZ_CAP_BYTES and whose predicted work fits in FUZZ_CAP_WORK, so that no input runs for
 * minutes on the ref backend), and a context made once per process. Must not hide a crash: a
 * broken invariant calls FUZZ_CHECK, which traps; a graph over a cap is skipped, never failed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/cache.h"
#include "graph/graph.h"
#include "sched/ctx.h"

#define FUZZ_CAP_BYTES ((size_t)64 << 20) /* most bytes of all nodes together that get compiled */
#ifndef FUZZ_CAP_WORK
#define FUZZ_CAP_WORK 1.2e7 /* most work units (fuzz_graph_work) of a graph that gets compiled and run */
#endif

#define FUZZ_CHECK(cond, ...)                                                                            \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "fuzz check failed: %s: ", #cond);                                           \
            fprintf(stderr, __VA_ARGS__);                                                                \
            fputc('\n', stderr);                                                                         \
            __builtin_trap();                                                                            \
        }                                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A dim at its symbol's bound (at least 1). */
static inline double fuzz_dim_max(const kiln_graph *g, int64_t d)
{
    int64_t v = kiln_dim_is_sym(d) ? g->syms[kiln_sym_index(d)].max : d;
    return v > 0 ? (double)v : 1.0;
}

/* True when every node of g at its symbols' bounds, summed, fits in cap bytes (no overflow). */
static inline bool fuzz_graph_fits(const kiln_graph *g, size_t cap)
{
    unsigned __int128 total = 0;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        unsigned __int128 e = 1;
        for (int d = 0; d < n->rank; d++) {
            e *= (unsigned __int128)fuzz_dim_max(g, n->dims[d]);
            if (e > cap) return false;
        }
        total += e * 4; /* at most 4 bytes per value in every dtype */
        if (total > cap) return false;
    }
    return true;
}

/* Whether node i is read by a later node or is an output (a random weight is made only then). */
static inline bool fuzz_node_read(const kiln_graph *g, uint32_t i)
{
    for (uint32_t o = 0; o < g->n_outs; o++)
        if (g->outs[o].node == i) return true;
    for (uint32_t j = i + 1; j < g->n_nodes; j++)
        for (int s = 0; s < g->nodes[j].n_src; s++)
            if (g->nodes[j].src[s] == i) return true;
    return false;
}

/* Predicted work of compiling and running g at its symbols' bounds, in units of about one
 * multiply-add of a run: a matmul's result elements times its K, an attention's query values times
 * its keys (twice: scores and values), every other node its elements, an input's value
 * FUZZ_INPUT_WORK more (drawn, converted and copied in at every run); a value of a block-quantized
 * dtype that the harness or a compile quantizes (random weights that some node reads, inputs, casts)
 * counts FUZZ_QUANT_WORK more (measured under ASan: a q5_k value quantized at each of the two
 * compiles costs about as much as 20 units run by the harness's eight runs). A cheap estimate from
 * the shapes, for graphs that pass fuzz_graph_fits (so every product is exact in a double). */
#define FUZZ_QUANT_WORK 24.0 /* work units per value quantized */
#define FUZZ_INPUT_WORK 3.0  /* work units per input value, beyond the one every node's value counts */
static inline double fuzz_graph_work(const kiln_graph *g)
{
    double total = 0;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        double e = 1;
        for (int d = 0; d < n->rank; d++) e *= fuzz_dim_max(g, n->dims[d]);
        total += e;
        if (n->op == KILN_OP_MATMUL) {
            const kiln_node_rec *x = &g->nodes[n->src[0]];
            total += e * (fuzz_dim_max(g, x->dims[x->rank - 1]) - 1);
        } else if (n->op == KILN_OP_ATTENTION || n->op == KILN_OP_PAGED_ATTENTION) {
            const kiln_node_rec *k = &g->nodes[n->src[1]]; /* [kv_heads, keys, head_dim] */
            total += 2 * e * fuzz_dim_max(g, n->op == KILN_OP_ATTENTION ? n->dim : k->dims[1]);
        }
        if (n->op == KILN_OP_INPUT) total += e * FUZZ_INPUT_WORK;
        bool made = n->op == KILN_OP_INPUT || n->op == KILN_OP_CAST || (n->random && fuzz_node_read(g, i));
        if (made && kiln_dtype_block((kiln_dtype)n->dtype) > 1) total += e * FUZZ_QUANT_WORK;
    }
    return total;
}

/* Both caps: g is small enough to compile and run in well under a second. */
static inline bool fuzz_graph_small(const kiln_graph *g)
{
    return fuzz_graph_fits(g, FUZZ_CAP_BYTES) && fuzz_graph_work(g) <= FUZZ_CAP_WORK;
}

/* The process's context (cpu with one thread, quiet). */
static inline kiln_ctx *fuzz_ctx(void)
{
    static kiln_ctx *ctx;
    if (!ctx) kiln_ctx_new(&(kiln_ctx_options){.n_threads = 1, .quiet = true}, &ctx);
    return ctx;
}

/* Drops what an input's compiles left in ctx's memory table, so that no input sees an earlier
 * one's plans (a finding replays alone as it ran) and an input frees all it allocated: libFuzzer
 * re-runs an input that ends with more mallocs than frees and scans the heap for leaks after it,
 * which a table growing by every input's plans turned into two runs and a heap scan per input. */
static inline void fuzz_forget(kiln_ctx *ctx)
{
    if (ctx) kiln_cache_mem_clear(ctx->cache);
}
