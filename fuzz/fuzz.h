/* Shared by the fuzz targets: the libFuzzer entry point they define, a size cap applied before
 * compiling (a graph may declare tensors of any size; the harness only compiles graphs whose
 * nodes, at their symbols' bounds, fit in FUZZ_CAP_BYTES), and a context made once per process.
 * Must not hide a crash: a broken invariant calls FUZZ_CHECK, which traps. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "graph/graph.h"

#define FUZZ_CAP_BYTES ((size_t)64 << 20) /* most bytes of all nodes together that get compiled */

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

/* True when every node of g at its symbols' bounds, summed, fits in cap bytes (no overflow). */
static inline bool fuzz_graph_fits(const kiln_graph *g, size_t cap)
{
    unsigned __int128 total = 0;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const kiln_node_rec *n = &g->nodes[i];
        unsigned __int128 e = 1;
        for (int d = 0; d < n->rank; d++) {
            int64_t v = kiln_dim_is_sym(n->dims[d]) ? g->syms[kiln_sym_index(n->dims[d])].max : n->dims[d];
            e *= (unsigned __int128)(v > 0 ? v : 1);
            if (e > cap) return false;
        }
        total += e * 4; /* at most 4 bytes per value in every dtype */
        if (total > cap) return false;
    }
    return true;
}

/* The process's context (cpu with one thread, quiet). */
static inline kiln_ctx *fuzz_ctx(void)
{
    static kiln_ctx *ctx;
    if (!ctx) kiln_ctx_new(&(kiln_ctx_options){.n_threads = 1, .quiet = true}, &ctx);
    return ctx;
}
