/* libFuzzer target for the GGUF parser: opens arbitrary bytes as a GGUF file, and when they parse,
 * walks every metadata getter, tensor and (for model files) the model builder. Any crash, leak or
 * sanitizer report is a bug. Built only with clang and -DKILN_FUZZ=ON; not part of CI. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static kiln_ctx *ctx;

static void walk(const kiln_gguf *f)
{
    for (int64_t i = 0; i < kiln_gguf_kv_count(f); i++) {
        const char *key = kiln_gguf_kv_key(f, i), *s;
        size_t len;
        uint64_t u64, n;
        int64_t i64;
        double d;
        bool b;
        kiln_gguf_type et;
        const void *data;
        kiln_gguf_get_u64(f, key, &u64);
        kiln_gguf_get_i64(f, key, &i64);
        kiln_gguf_get_f64(f, key, &d);
        kiln_gguf_get_bool(f, key, &b);
        kiln_gguf_get_str(f, key, &s, &len);
        if (kiln_gguf_get_arr(f, key, &et, &n, &data) == KILN_OK && et == KILN_GGUF_STRING && n)
            kiln_gguf_get_arr_str(f, key, n - 1, &s, &len);
    }
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < kiln_gguf_tensor_count(f); i++) {
        kiln_gguf_tensor t;
        if (kiln_gguf_tensor_at(f, i, &t) == KILN_OK && t.bytes)
            sink ^= ((const uint8_t *)t.data)[0] ^ ((const uint8_t *)t.data)[t.bytes - 1];
    }
    (void)sink;
    kiln_graph *g = NULL;
    if (kiln_model_build(f, &(kiln_model_options){.max_ctx = 8, .max_tok = 4}, &g) == KILN_OK) kiln_graph_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx && kiln_ctx_new(&(kiln_ctx_options){.n_threads = 1, .quiet = true}, &ctx) != KILN_OK) abort();
    uint8_t *copy = malloc(size ? size : 1); /* exact size: overreads hit the redzone */
    if (!copy) return 0;
    memcpy(copy, data, size);
    kiln_gguf *f = NULL;
    if (kiln_gguf_open_memory(ctx, copy, size, &f) == KILN_OK) walk(f);
    kiln_gguf_close(f);
    free(copy);
    return 0;
}
