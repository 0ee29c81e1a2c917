/* GGUF file internals shared by the parser (gguf.c), the getters (gguf_get.c) and the model
 * builder: the parsed header, key-values and tensor table over a read-only byte range (an mmap of
 * the file or a caller's buffer). Parsing only reads; nothing here writes the mapped bytes. */
#pragma once

#include "kiln/kiln.h"

#include <uthash.h>

typedef struct gguf_kv {
    char            *key;      /* NUL-terminated copy of the key; owned */
    kiln_gguf_type   type;     /* value type */
    kiln_gguf_type   arr_type; /* element type when type is ARRAY */
    uint64_t         n;        /* array length (1 for scalars) */
    size_t           off;      /* byte offset of the value (array: of its first element) */
    char            *str;      /* STRING value: NUL-terminated copy; owned (else NULL) */
    uint64_t        *str_offs; /* ARRAY of STRING: offset of each element's length prefix; owned */
    UT_hash_handle   hh;       /* by key */
} gguf_kv;

typedef struct gguf_tensor {
    char          *name;      /* NUL-terminated copy; owned */
    uint32_t       ggml_type; /* GGUF/ggml type id */
    int            rank;      /* dims */
    int64_t        ne[4];     /* GGUF order: ne[0] = row length (innermost) */
    uint64_t       rel_off;   /* offset inside the data section */
    uint64_t       bytes;     /* data bytes */
    size_t         info_off;  /* byte offset of the tensor info in the file (for messages) */
    const struct kiln_gguf *home; /* split GGUF: the part whose data section holds it (NULL: this file) */
    int            part;      /* its part's index (0: the first file) */
    UT_hash_handle hh;        /* by name */
} gguf_tensor;

struct kiln_gguf {
    kiln_ctx      *ctx;       /* errors of later calls go here */
    char          *path;      /* file path for messages ("<memory>" for a buffer); owned */
    const uint8_t *base;      /* the bytes */
    size_t         size;      /* their count */
    bool           mapped;    /* base is our mmap (unmapped at close) */
    uint32_t       version;   /* 2 or 3 */
    uint32_t       alignment; /* general.alignment or 32 */
    size_t         data_off;  /* start of the tensor data section */
    gguf_kv       *kvs;       /* array of n_kv */
    uint64_t       n_kv;      /* count */
    gguf_kv       *kv_by_key; /* uthash over kvs */
    gguf_tensor   *tensors;   /* array of n_tensors */
    uint64_t       n_tensors; /* count */
    gguf_tensor   *t_by_name; /* uthash over tensors */
    struct kiln_gguf **parts; /* split GGUF: parts 2..n_parts, each parsed alone (tensors moved here); owned */
    int            n_parts;   /* 1 for a single file */
    size_t         total;     /* bytes of every part */
};

/* Maps and parses one file (no split handling); KILN_OK or the error in ctx. */
kiln_status kiln_gguf_open_one(kiln_ctx *ctx, const char *path, kiln_gguf **out);
/* After the first part f is parsed: when its split.count is above 1, opens every other part
 * (named as llama.cpp's llama_split_path names them), checks they agree, and moves their tensors
 * into f's table. A single file is left alone; a part read from memory (by_path false) is refused,
 * since its siblings cannot be found. */
kiln_status kiln_gguf_join_parts(kiln_gguf *f, bool by_path);
/* Size in bytes of one scalar value of type t (0 for STRING/ARRAY/unknown). */
size_t kiln_gguf_scalar_size(kiln_gguf_type t);
/* The kiln dtype of a ggml type id, or KILN_DTYPE_COUNT when kiln has none. */
kiln_dtype kiln_gguf_dtype_of(uint32_t ggml_type);
/* Block values and block bytes of a ggml type id; false for an id kiln does not know at all. */
bool kiln_gguf_type_size(uint32_t ggml_type, int64_t *block, size_t *block_bytes);
/* Index (file order) of tensor name, or -1; sets no error. */
int64_t kiln_gguf_tensor_index(const kiln_gguf *f, const char *name);
/* ggml's name of a type id ("q4_K", "f16"), "?" when unknown. */
const char *kiln_gguf_type_label(uint32_t ggml_type);
