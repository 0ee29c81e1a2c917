/* The tensor-parallel split (Megatron-style) of a graph over N devices: which nodes are replicated,
 * divided along an axis, or partial sums, and the N part graphs that follow (all-reduce ops
 * inserted where partial sums meet replicated consumers). Backend-neutral: reads a const graph,
 * writes new graphs; must not compile, place or run anything. */
#pragma once

#include "graph/graph.h"

enum kiln_split_kind {
    KILN_SPLIT_REPL = 0, /* every part holds the whole value */
    KILN_SPLIT_AXIS,     /* part p holds slice p of N equal slices along `axis` */
    KILN_SPLIT_PARTIAL,  /* every part holds a summand of the value (a row-parallel matmul's output) */
    KILN_SPLIT_KIND_COUNT
};

/* The cost model's verdict on one group of divided nodes (the column-parallel matmuls of a seed, what
 * their division flows through, the row-parallel matmul or all-gather that joins them). */
typedef struct kiln_split_choice {
    uint32_t seed;      /* its first column-parallel matmul (source node) */
    char     what[120]; /* its matmuls by weight name ("wq0, wk0, wv0, wo0") */
    double   split_s;   /* predicted: per part divided, plus the joins' link time (two steps summed) */
    double   whole_s;   /* predicted: replicated on every device */
    bool     split;     /* split_s < whole_s */
} kiln_split_choice;

typedef struct kiln_split {
    int          n;          /* parts */
    kiln_graph **parts;      /* n part graphs, structurally equal (dims divided, weights sliced) */
    uint32_t     n_src;      /* nodes of the source graph */
    uint8_t     *kind;       /* per source node: enum kiln_split_kind */
    int8_t      *axis;       /* per source node: the split axis (KILN_SPLIT_AXIS), else -1 */
    uint32_t    *part_node;  /* per source node: its index in every part graph */
    uint32_t     n_col;      /* column-parallel matmuls (weight rows divided) */
    uint32_t     n_row;      /* row-parallel matmuls (weight columns divided, partial output) */
    uint32_t     n_reduce;   /* all_reduce ops inserted */
    uint32_t     n_gather;   /* all_gather ops inserted (column-parallel outputs wanted whole: a head by vocabulary) */
    uint32_t     n_dual;     /* weights both whole and sliced (a tied embedding: get_rows whole, the head's slice) */
    kiln_split_choice *choices; /* the cost model's verdicts, one per group it weighed (none without a profile) */
    uint32_t     n_choices;
    uint32_t     n_split_states; /* states divided along axis 0 (KV caches: heads) */
} kiln_split;

/* Splits g over n >= 2 parts. With a profile (the parts' device: peak, mem_bw, link_bw,
 * link_latency_s), each group of divided nodes is split only where the cost model predicts it
 * faster than replicated, summed over the smallest step (every symbol 1) and the largest (every
 * symbol at its bound); without one (NULL), everything that can be divided is. Refuses (KILN_ERR_UNSUPPORTED, message in err naming the node and
 * the count that does not divide) a graph whose attention heads, KV heads, reshaped head dims or
 * quantized weight blocks do not divide by n, and a graph where nothing can be split. Values that
 * cannot stay divided (a head whose logits feed argmax, a graph output) are computed replicated. */
kiln_status kiln_sched_split(const kiln_graph *g, int n, const kiln_device_profile *prof, kiln_split *out, char *err,
                             size_t n_err);
void        kiln_split_free(kiln_split *s);

/* One line per split kind, for plans: "column-parallel: q, k, v, gate, up; row-parallel: o, down
 * (+ all_reduce); states divided: k0, v0; replicated: ...". Appends to buf. */
void kiln_split_describe(const kiln_split *s, const kiln_graph *g, char *buf, size_t n);

/* split_cost.c: node i's predicted time on one device at symbol values sym (roofline), and the link
 * time of an all-reduce of `bytes` and of an all-gather of `slice_bytes` per device over n devices. */
double kiln_split_node_time(const kiln_graph *g, uint32_t i, const int64_t *sym, const kiln_device_profile *p);
double kiln_split_reduce_time(double bytes, int n, const kiln_device_profile *p);
double kiln_split_gather_time(double slice_bytes, int n, const kiln_device_profile *p);
