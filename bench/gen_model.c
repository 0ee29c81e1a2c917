/* Writes a random GGUF model (tests/support/gguf_writer.c's generator) for timing `kiln generate`
 * and `kiln bench --model` on real-model-shaped files without a download.
 * Usage: gen_model PATH [llama|qwen2] [layers] [wtype] [shape]   shape: 7b (4096 wide, 32 heads,
 * ffn 11008, vocab 32000; default) or 0.5b (qwen2-0.5b: 896 wide, 14/2 heads, ffn 4864, 151936). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gguf_writer.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: gen_model PATH [llama|qwen2] [layers] [f16|q8_0|q4_k|...] [7b|0.5b]\n");
        return 2;
    }
    const char *arch = argc > 2 ? argv[2] : "llama", *wt = argc > 4 ? argv[4] : "q4_k", *shape = argc > 5 ? argv[5] : "7b";
    int layers = argc > 3 ? atoi(argv[3]) : 4;
    kiln_dtype t;
    if (!kiln_dtype_parse(wt, &t) || layers < 1 || layers > 200) {
        fprintf(stderr, "gen_model: bad weight type '%s' or layer count %d\n", wt, layers);
        return 2;
    }
    bool small = !strcmp(shape, "0.5b");
    gw_model m = {.arch = arch, .n_layer = layers, .hidden = small ? 896 : 4096, .n_head = small ? 14 : 32,
                  .n_kv_head = small ? 2 : 32, .ffn = small ? 4864 : 11008, .n_vocab = small ? 151936 : 32000,
                  .n_ctx = 4096, .wtype = t, .embtype = KILN_DTYPE_F16, .tied = small, .tokens = true, .seed = 7};
    fprintf(stderr, "gen_model: writing %s (%s, %d layers, %s weights, %s shape)...\n", argv[1], arch, layers, wt, shape);
    if (gw_model_write(&m, argv[1]) != 0) {
        fprintf(stderr, "gen_model: could not write %s\n", argv[1]);
        return 1;
    }
    return 0;
}
