/* gen_model: writes a random GGUF model (tests/support/gguf_writer.c's generator) with the tensors,
 * metadata and tokenizer list of a llama or qwen2 file, for `kiln generate`, `kiln bench --model`
 * and `kiln info` without a download. Must never write a file it was not clearly asked for: an
 * unknown option or a path that looks like one is a usage error (exit 2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/gguf_writer.h"

static const char USAGE[] =
    "usage: gen_model [options] OUT.gguf [ARCH [LAYERS [WTYPE [SHAPE]]]]\n"
    "Writes a GGUF model with random weights (reproducible from --seed) to OUT.gguf.\n"
    "  --arch A             llama, qwen2, qwen2moe or qwen3moe (default llama)\n"
    "  --layers N           decoder blocks, 1..200 (default 4)\n"
    "  --wtype T            matmul weight dtype: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k\n"
    "                       q6_k iq4_nl iq4_xs, or q4_k_m: llama.cpp's Q4_K_M mix (q4_k; attn_v and ffn_down\n"
    "                       q6_k on its use_more_bits layers, output q6_k) (default q4_k)\n"
    "  --shape 7b|0.5b|tiny 7b: 4096 wide, 32 heads, ffn 11008, vocab 32000 (about 100 MiB a q4_k layer);\n"
    "                       0.5b: qwen2-0.5b's 896 wide, 14/2 heads, ffn 4864, vocab 151936;\n"
    "                       tiny: 256 wide, 4/2 heads, ffn 512, vocab 64, context 128 (tests) (default 7b);\n"
    "                       30b-a3b: Qwen3-30B-A3B's 2048 wide, 32/4 heads of 128, 128 experts of 768, 8 routed,\n"
    "                       vocab 151936 (qwen3moe; qwen2moe: the same with a shared expert of 5632)\n"
    "  --experts N          experts per MoE layer (qwen2moe/qwen3moe; default the shape's, tiny 8)\n"
    "  --seed N             weight seed (default 7)\n"
    "  -h, --help           this text\n"
    "The positional ARCH LAYERS WTYPE SHAPE are the same settings (older scripts use them).\n"
    "Example: gen_model --arch qwen2 --shape 0.5b --layers 24 --wtype q8_0 qwen2-0.5b-random.gguf\n";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "gen_model: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (gen_model --help)\n");
    return 2;
}

/* The value of option argv[*i] (consumed with it), or NULL when missing. */
static const char *value(int argc, char **argv, int *i)
{
    return *i + 1 < argc ? argv[++*i] : NULL;
}

int main(int argc, char **argv)
{
    const char *arch = "llama", *wt = "q4_k", *shape = "7b", *out = NULL, *pos[4] = {0};
    long layers = 4, experts = 0;
    unsigned long long seed = 7;
    int n_pos = 0;
    bool only_paths = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!only_paths && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!only_paths && !strcmp(a, "--")) {
            only_paths = true;
        } else if (!only_paths && a[0] == '-' && a[1]) {
            if (!(v = value(argc, argv, &i))) return usage_error("%s needs a value", a);
            char *end;
            if (!strcmp(a, "--arch")) arch = v;
            else if (!strcmp(a, "--wtype")) wt = v;
            else if (!strcmp(a, "--shape")) shape = v;
            else if (!strcmp(a, "--layers")) {
                layers = strtol(v, &end, 10);
                if (*end) return usage_error("--layers takes a number, not '%s'", v);
            } else if (!strcmp(a, "--experts")) {
                experts = strtol(v, &end, 10);
                if (*end || experts < 1 || experts > 512) return usage_error("--experts takes 1..512, not '%s'", v);
            } else if (!strcmp(a, "--seed")) {
                seed = strtoull(v, &end, 10);
                if (*end) return usage_error("--seed takes a number, not '%s'", v);
            } else
                return usage_error("unknown option '%s'", a);
        } else if (!out) {
            out = a;
        } else if (n_pos < 4) {
            pos[n_pos++] = a;
        } else {
            return usage_error("too many arguments ('%s')", a);
        }
    }
    if (!out) return usage_error("%s", "no output path given");
    if (pos[0]) arch = pos[0];
    if (pos[1]) layers = atol(pos[1]);
    if (pos[2]) wt = pos[2];
    if (pos[3]) shape = pos[3];
    kiln_dtype t;
    bool q4_k_m = !strcmp(wt, "q4_k_m");
    if (q4_k_m) wt = "q4_k";
    bool moe = !strcmp(arch, "qwen2moe") || !strcmp(arch, "qwen3moe");
    if (strcmp(arch, "llama") && strcmp(arch, "qwen2") && !moe)
        return usage_error("unknown architecture '%s' (llama, qwen2, qwen2moe, qwen3moe)", arch);
    if (!kiln_dtype_parse(wt, &t) || t == KILN_DTYPE_I32) return usage_error("unknown weight dtype '%s'", wt);
    if (strcmp(shape, "7b") && strcmp(shape, "0.5b") && strcmp(shape, "tiny") && strcmp(shape, "30b-a3b"))
        return usage_error("unknown shape '%s' (7b, 0.5b, tiny, 30b-a3b)", shape);
    if (!strcmp(shape, "30b-a3b") && !moe) return usage_error("shape 30b-a3b goes with qwen2moe/qwen3moe only (%s)", arch);
    char got[32];
    snprintf(got, sizeof got, "%ld", layers);
    if (layers < 1 || layers > 200) return usage_error("layers must be 1..200 (got %s)", got);
    struct stat st;
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) return usage_error("'%s' is a directory", out);
    bool small = !strcmp(shape, "0.5b"), tiny = !strcmp(shape, "tiny");
    gw_model m = {.arch = arch, .n_layer = (int)layers, .hidden = small ? 896 : 4096, .n_head = small ? 14 : 32,
                  .n_kv_head = small ? 2 : 32, .ffn = small ? 4864 : 11008, .n_vocab = small ? 151936 : 32000,
                  .n_ctx = 4096, .wtype = t, .embtype = KILN_DTYPE_F16, .tied = small, .tokens = true, .seed = seed,
                  .q4_k_m = q4_k_m};
    if (tiny) /* rows of 256: whole blocks of every weight dtype */
        m.hidden = 256, m.n_head = 4, m.n_kv_head = 2, m.ffn = 512, m.n_vocab = 64, m.n_ctx = 128;
    if (!strcmp(shape, "30b-a3b")) /* Qwen3-30B-A3B */
        m.hidden = 2048, m.n_head = 32, m.n_kv_head = 4, m.head_dim = 128, m.ffn = 6144, m.n_vocab = 151936, m.tied = false,
        m.n_expert = 128, m.n_expert_used = 8, m.ffn_exp = 768, m.ffn_shexp = !strcmp(arch, "qwen2moe") ? 5632 : 0;
    if (moe && tiny) m.n_expert = 8, m.n_expert_used = 2, m.ffn_exp = 256, m.ffn_shexp = !strcmp(arch, "qwen2moe") ? 256 : 0;
    if (moe && !tiny && strcmp(shape, "30b-a3b")) return usage_error("a MoE file takes shape tiny or 30b-a3b (%s)", shape);
    if (experts) {
        if (!moe) return usage_error("--experts goes with qwen2moe/qwen3moe (%s)", arch);
        m.n_expert = (int)experts;
        if (m.n_expert_used > m.n_expert) m.n_expert_used = m.n_expert;
    }
    fprintf(stderr, "gen_model: writing %s (%s, %ld layers, %s weights, %s shape)...\n", out, arch, layers, q4_k_m ? "q4_k_m" : wt,
            shape);
    if (gw_model_write(&m, out) != 0) {
        fprintf(stderr, "gen_model: could not write %s\n", out);
        return 1;
    }
    if (stat(out, &st) == 0) fprintf(stderr, "gen_model: wrote %s, %.1f MiB\n", out, (double)st.st_size / (1 << 20));
    return 0;
}
