/* libFuzzer target for the GGUF parser: opens arbitrary bytes as a GGUF file, and when they parse,
 * walks every metadata getter, tensor and (for model files) the model builder; a model that builds
 * and fits the size cap is compiled on cpu and decodes two steps, and a token id past the vocabulary
 * and a position past the cache must be refused (issue #17). Any crash, leak or sanitizer report is
 * a bug. Built only with clang and -DKILN_FUZZ=ON; CI replays tests/fuzz/corpus/gguf. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "kiln/kiln.h"

static kiln_ctx *ctx;

/* A model that builds is compiled on cpu and decodes two steps (token ids from its vocabulary);
 * then an id past the vocabulary and a position past the cache must be refused with a status. */
static void compile_and_run(const kiln_gguf *f, kiln_graph *g)
{
    kiln_model_info mi;
    kiln_plan *p = NULL;
    if (kiln_model_info_get(f, &mi) != KILN_OK || kiln_compile(ctx, g, &(kiln_compile_options){.backend = "cpu"}, &p) != KILN_OK)
        return;
    int32_t next[4], ids[4] = {0, (int32_t)(mi.n_vocab - 1), 1 % (int32_t)mi.n_vocab, 0}, pos[4] = {0, 1, 2, 3};
    for (int step = 0; step < 2; step++) {
        int64_t nt = step ? 3 : 1, nkv = step ? 4 : 1;
        kiln_binding b[] = {{.name = "n_tok", .value = nt}, {.name = "n_kv", .value = nkv},
                            {.name = "ids", .data = ids + step, .bytes = (size_t)nt * 4},
                            {.name = "pos", .data = pos + step, .bytes = (size_t)nt * 4},
                            {.name = "next", .data = next, .bytes = (size_t)nt * 4}};
        kiln_status s = kiln_run(p, b, 5);
        FUZZ_CHECK(s == KILN_OK, "decode step %d of a model that compiled: %s: %s", step, kiln_status_str(s), kiln_ctx_error(ctx));
        for (int i = 0; i < nt; i++) FUZZ_CHECK(next[i] >= 0 && next[i] < mi.n_vocab, "token %d out of the vocabulary", next[i]);
    }
    int32_t bad_id = (int32_t)mi.n_vocab, bad_pos = 100;
    kiln_binding b[] = {{.name = "n_tok", .value = 1}, {.name = "n_kv", .value = 1}, {.name = "ids", .data = &bad_id, .bytes = 4},
                        {.name = "pos", .data = pos, .bytes = 4}, {.name = "next", .data = next, .bytes = 4}};
    FUZZ_CHECK(kiln_run(p, b, 5) != KILN_OK, "token id %d of a %lld-token vocabulary was accepted", bad_id, (long long)mi.n_vocab);
    b[2].data = ids, b[3].data = &bad_pos;
    FUZZ_CHECK(kiln_run(p, b, 5) != KILN_OK, "position 100 in an 8-row cache was accepted");
    kiln_plan_free(p);
}

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
    if (kiln_model_build(f, &(kiln_model_options){.max_ctx = 8, .max_tok = 4}, &g) == KILN_OK) {
        if (fuzz_graph_small(g)) compile_and_run(f, g);
        kiln_graph_free(g);
    }
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
    fuzz_forget(ctx);
    return 0;
}
