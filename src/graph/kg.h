/* Internal helpers shared by the .kg parser (kg_parse.c) and printer (kg_print.c): the operand
 * and parameter table of every op, name quoting rules, exact float formatting, weight sizes.
 * Must not build graphs or read files; the format itself is described in docs/kg-format.md. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "graph/graph.h"

/* Parameter bits: which key=value parameters (or positional dims) an op takes. */
enum kiln_kg_param {
    KILN_KG_P_S = 1 << 0,      /* scale: s=FLOAT (required) */
    KILN_KG_P_EPS = 1 << 1,    /* norms: eps=FLOAT (default 1e-5) */
    KILN_KG_P_MODE = 1 << 2,   /* rope: mode=normal|neox (default normal) */
    KILN_KG_P_THETA = 1 << 3,  /* rope: theta=FLOAT (default 10000) */
    KILN_KG_P_NKV = 1 << 4,    /* attention: n_kv=DIM (required) */
    KILN_KG_P_SCALE = 1 << 5,  /* attention: scale=FLOAT (default 0 = 1/sqrt(head_dim)) */
    KILN_KG_P_AXIS = 1 << 6,   /* concat: axis=INT (required) */
    KILN_KG_P_D0 = 1 << 7,     /* transpose: d0=INT (required) */
    KILN_KG_P_D1 = 1 << 8,     /* transpose: d1=INT (required) */
    KILN_KG_P_DTYPE = 1 << 9,  /* cast: dtype=DTYPE (required) */
    KILN_KG_P_OFFSET = 1 << 10,/* view: offset=INT (default 0) */
    KILN_KG_P_DIMS = 1 << 11,  /* reshape, view: a positional [dims] list after the operands */
    KILN_KG_P_MULT = 1 << 12,  /* rope: mult="F,F,..." per-pair frequency multipliers (default none) */
    KILN_KG_P_BLOCK = 1 << 13, /* paged_attention: block=INT (required) */
    KILN_KG_P_SOFTCAP = 1 << 14, /* attention: softcap=FLOAT (default 0 = none) */
    KILN_KG_P_WINDOW = 1 << 15,  /* attention: window=INT (default 0 = none) */
    KILN_KG_P_ROT = 1 << 16,     /* rope: rot=INT rotary dims of each head (default: all of them) */
    KILN_KG_P_K = 1 << 17,       /* moe_route, moe_matmul: k=INT experts kept per row (required) */
    KILN_KG_P_NORM = 1 << 18,    /* moe_route: norm=0|1 kept weights rescaled to sum 1 (default 0) */
    KILN_KG_P_COL = 1 << 19,     /* scale_rows: col=INT the column of w (required) */
    KILN_KG_P_SUM = 1 << 20,     /* moe_matmul: sum=0|1 the slots summed weighted by r (default 0) */
};

typedef struct kiln_kg_op_spec {
    unsigned    n_req;    /* operands that must be given */
    unsigned    n_opt;    /* optional operands after them (written `_` when absent) */
    unsigned    params;   /* enum kiln_kg_param bits the op accepts */
    unsigned    required; /* of those, the ones without a default */
    const char *usage;    /* operand list for messages: "x [w]" */
} kiln_kg_op_spec;

/* The spec of a computing op; NULL for leaves, KILN_OP_NONE and out-of-range values. */
const kiln_kg_op_spec *kiln_kg_op_spec_of(enum kiln_op op);

/* Key of a single parameter bit ("eps"), NULL for KILN_KG_P_DIMS or an unknown bit. */
const char *kiln_kg_param_key(unsigned bit);

/* True when s can be written bare (a name the lexer reads back as one word and not `_`):
 * [A-Za-z_.][A-Za-z0-9_.-]*, excluding "_". Otherwise the printer quotes it. */
bool kiln_kg_is_bare_name(const char *s);

/* Shortest decimal text that strtof reads back to exactly v ("1e-05", "0.125", "inf", "nan").
 * buf must hold 32 bytes. Returns buf. */
const char *kiln_kg_fmt_float(float v, char buf[32]);

/* Bytes of a weight of dtype t and constant dims; false (with *why set to static text) when the
 * dims are symbolic, out of range, not a multiple of the block, or the size overflows. */
bool kiln_kg_weight_bytes(kiln_dtype t, int rank, const int64_t *dims, size_t *bytes, const char **why);

/* Largest weight the printer writes inline as hex (bigger ones make kiln_kg_print fail). */
#define KILN_KG_MAX_INLINE_BYTES ((size_t)64 << 20)

/* Sets ctx's error text (printf-style, truncated to 1 KiB) when ctx is not NULL; returns s. */
kiln_status kiln_kg_fail(kiln_ctx *ctx, kiln_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
