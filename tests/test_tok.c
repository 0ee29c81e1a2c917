/* Tests of the tokenizer (src/tok): every case of every llama.cpp test vocabulary kiln claims
 * (tests/data/vocab, unpacked into the build folder; skipped with a message when absent), random
 * Unicode round trips, special tokens, BOS, the streaming UTF-8 decoder on random splits and
 * invalid bytes, and the refusals (unknown model or pre-tokenizer, invalid UTF-8). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "support/gguf_writer.h"
#include "support/testutil.h"
#include "tok/tok.h"

#ifndef KILN_VOCAB_DIR
#define KILN_VOCAB_DIR ""
#endif

static kiln_ctx *ctx;
static void setup(void) { cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 1, .quiet = true}, &ctx), KILN_OK); }
static void teardown(void) { kiln_ctx_free(ctx); }
TestSuite(tok, .init = setup, .fini = teardown);

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    cr_assert(b);
    *n = fread(b, 1, (size_t)sz, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* Opens build/vocab/ggml-vocab-NAME.gguf and its tokenizer; skips the test when the file is absent. */
static kiln_tok *open_vocab(const char *name, kiln_gguf **file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", KILN_VOCAB_DIR, name);
    FILE *probe = fopen(path, "rb");
    if (!probe) cr_skip_test("%s is absent (tests/data/vocab/ggml-vocab.tar.xz not unpacked by CMake)", path);
    fclose(probe);
    cr_assert_eq(kiln_gguf_open(ctx, path, file), KILN_OK, "%s", kiln_ctx_error(ctx));
    kiln_tok *t = NULL;
    kiln_status s = kiln_tok_new(ctx, *file, &t);
#ifndef KILN_HAVE_PCRE2
    if (s == KILN_ERR_UNSUPPORTED && strstr(kiln_ctx_error(ctx), "PCRE2")) {
        kiln_gguf_close(*file);
        cr_skip_test("%s: built without PCRE2, BPE vocabularies are refused (%s)", name, kiln_ctx_error(ctx));
    }
#endif
    cr_assert_eq(s, KILN_OK, "%s: %s", name, kiln_ctx_error(ctx));
    return t;
}

/* Every case of NAME.gguf.inp tokenized (no BOS, no special parsing, as llama.cpp's
 * test-tokenizer-0 does) equals the line of NAME.gguf.out. */
static void vocab_cases(const char *name)
{
    kiln_gguf *f = NULL;
    kiln_tok *t = open_vocab(name, &f);
    char path[1024];
    size_t ni, no;
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", KILN_VOCAB_DIR, name);
    char *inp = slurp(path, &ni);
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", KILN_VOCAB_DIR, name);
    char *out = slurp(path, &no);
    cr_assert(inp && out, "%s: test files missing", name);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t pos = 0, sl = strlen(sep);
    char *line = out;
    int cases = 0, bad = 0;
    while (pos < ni) {
        char *e = strstr(inp + pos, sep);
        size_t len = e ? (size_t)(e - (inp + pos)) : ni - pos;
        char *nl = strchr(line, '\n');
        cr_assert(nl, "%s: fewer expected lines than cases", name);
        *nl = 0;
        int32_t want[4096];
        int64_t nw = 0;
        for (char *p = line; *p;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) break;
            want[nw++] = (int32_t)v;
            p = end;
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        cr_assert_eq(kiln_tok_encode(t, inp + pos, len, false, false, &ids, &n), KILN_OK, "%s", kiln_ctx_error(ctx));
        bool same = n == nw && (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
        if (!same && bad++ < 5) {
            fprintf(stderr, "%s case %d '%.*s': got", name, cases, (int)len, inp + pos);
            for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want %s\n", line);
        }
        free(ids);
        cases++;
        line = nl + 1;
        pos = e ? (size_t)(e - inp) + sl : ni;
    }
    cr_expect_eq(bad, 0, "%s: %d of %d cases differ from llama.cpp's expected ids", name, bad, cases);
    cr_assert_geq(cases, 40, "%s: only %d cases read", name, cases);
    free(inp);
    free(out);
    kiln_tok_free(t);
    kiln_gguf_close(f);
}

Test(tok, llama_spm_cases) { vocab_cases("llama-spm"); }
Test(tok, phi_3_cases) { vocab_cases("phi-3"); }
Test(tok, llama_bpe_cases) { vocab_cases("llama-bpe"); }
Test(tok, qwen2_cases) { vocab_cases("qwen2"); }
Test(tok, qwen35_cases) { vocab_cases("qwen35"); }
Test(tok, gpt_2_cases) { vocab_cases("gpt-2"); }
Test(tok, mpt_cases) { vocab_cases("mpt"); }
Test(tok, starcoder_cases) { vocab_cases("starcoder"); }
Test(tok, refact_cases) { vocab_cases("refact"); }
Test(tok, falcon_cases) { vocab_cases("falcon"); }
Test(tok, deepseek_llm_cases) { vocab_cases("deepseek-llm"); }
Test(tok, deepseek_coder_cases) { vocab_cases("deepseek-coder"); }

/* A random code point from ranges that stress the pre-tokenizers: ASCII (letters, digits,
 * punctuation, spaces, newlines, tabs), Latin-1, combining marks, Greek/Cyrillic, CJK, Hangul,
 * unusual spaces (NBSP, ideographic space, U+0085), emoji and other planes. Never a surrogate. */
static uint32_t random_cp(void)
{
    static const uint32_t ranges[][2] = {
        {0x20, 0x7e}, {0x20, 0x20}, {0x0a, 0x0a}, {0x09, 0x0d}, {'0', '9'}, {'a', 'z'}, {0xa0, 0xff}, {0x300, 0x36f},
        {0x391, 0x3c9}, {0x410, 0x44f}, {0x4e00, 0x9fff}, {0xac00, 0xd7a3}, {0x3000, 0x3000}, {0x85, 0x85},
        {0x2000, 0x206f}, {0x1f300, 0x1f64f}, {0x10000, 0x10ffff}, {0xe000, 0xfffd},
    };
    int r = (int)tu_randint(0, sizeof ranges / sizeof *ranges - 1);
    return (uint32_t)tu_randint(ranges[r][0], ranges[r][1]);
}

static size_t put_cp(uint32_t cp, char *o)
{
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[2] = (char)(0x80 | (cp & 0x3f)), 3;
    o[0] = (char)(0xf0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* decode(encode(s)) == s for random texts; every id in range. */
static void round_trips(const char *name, int n_texts)
{
    kiln_gguf *f = NULL;
    kiln_tok *t = open_vocab(name, &f);
    char text[1024];
    for (int k = 0; k < n_texts; k++) {
        size_t n = 0;
        int chars = (int)tu_randint(0, 200);
        for (int c = 0; c < chars; c++) n += put_cp(random_cp(), text + n);
        int32_t *ids = NULL;
        int64_t ni = 0;
        cr_assert_eq(kiln_tok_encode(t, text, n, false, false, &ids, &ni), KILN_OK, "%s", kiln_ctx_error(ctx));
        for (int64_t i = 0; i < ni; i++) cr_assert(ids[i] >= 0 && ids[i] < kiln_tok_n_vocab(t));
        char *back = NULL;
        size_t nb = 0;
        cr_assert_eq(kiln_tok_decode(t, ids, ni, false, &back, &nb), KILN_OK);
        cr_assert(nb == n && memcmp(back, text, n) == 0, "%s: text %d (%zu bytes) came back as %zu bytes:\n%.*s\n%s", name, k, n,
                  nb, (int)n, text, back);
        free(back);
        free(ids);
    }
    kiln_tok_free(t);
    kiln_gguf_close(f);
}

Test(tok, llama_bpe_round_trips) { round_trips("llama-bpe", 200); }
Test(tok, qwen2_round_trips) { round_trips("qwen2", 200); }
Test(tok, gpt_2_round_trips) { round_trips("gpt-2", 200); }
Test(tok, deepseek_llm_round_trips) { round_trips("deepseek-llm", 100); }
Test(tok, llama_spm_round_trips) { round_trips("llama-spm", 200); }

/* Appends encode(s) to ids. */
static int64_t enc_into(kiln_tok *t, const char *s, bool parse_special, int32_t *ids, int64_t n)
{
    int32_t *v = NULL;
    int64_t m = 0;
    cr_assert_eq(kiln_tok_encode(t, s, strlen(s), false, parse_special, &v, &m), KILN_OK, "%s", kiln_ctx_error(ctx));
    memcpy(ids + n, v, (size_t)m * sizeof *v);
    free(v);
    return n + m;
}

Test(tok, control_tokens_only_when_parsing_special)
{
    kiln_gguf *f = NULL;
    kiln_tok *t = open_vocab("qwen2", &f);
    const char *txt = "<|im_start|>user\nhi there<|im_end|>\n";
    int32_t st = kiln_tok_find(t, "<|im_start|>", 12), en = kiln_tok_find(t, "<|im_end|>", 10);
    cr_assert(st >= 0 && en >= 0);
    cr_assert(kiln_tok_is_eog(t, en), "<|im_end|> ends generation");
    cr_assert(!kiln_tok_is_eog(t, st));
    int32_t want[64], got[64];
    int64_t nw = 0, ng;
    want[nw++] = st;
    nw = enc_into(t, "user\nhi there", false, want, nw);
    want[nw++] = en;
    nw = enc_into(t, "\n", false, want, nw);
    ng = enc_into(t, txt, true, got, 0);
    cr_assert(ng == nw && memcmp(got, want, (size_t)ng * sizeof *got) == 0, "special tokens not cut out");
    ng = enc_into(t, txt, false, got, 0); /* as plain text: no control id appears */
    for (int64_t i = 0; i < ng; i++) cr_assert(got[i] != st && got[i] != en);
    size_t l;
    kiln_tok_piece(t, en, false, &l);
    cr_assert_eq(l, 0, "a control token decodes to nothing unless asked");
    const char *p = kiln_tok_piece(t, en, true, &l);
    cr_assert(l == 10 && memcmp(p, "<|im_end|>", 10) == 0);
    kiln_tok_free(t);
    kiln_gguf_close(f);
}

Test(tok, bos_and_space_prefix_spm)
{
    kiln_gguf *f = NULL;
    kiln_tok *t = open_vocab("llama-spm", &f);
    cr_assert(kiln_tok_add_bos(t));
    int32_t *a = NULL, *b = NULL;
    int64_t na, nb;
    const char *s = "Hello world";
    cr_assert_eq(kiln_tok_encode(t, s, strlen(s), true, false, &a, &na), KILN_OK);
    cr_assert_eq(kiln_tok_encode(t, s, strlen(s), false, false, &b, &nb), KILN_OK);
    cr_assert_eq(na, nb + 1);
    cr_assert_eq(a[0], kiln_tok_bos(t));
    cr_assert(memcmp(a + 1, b, (size_t)nb * sizeof *b) == 0);
    size_t l;
    const char *p = kiln_tok_piece(t, b[0], false, &l); /* "▁Hello": the space prefix */
    cr_assert(l == 6 && memcmp(p, " Hello", 6) == 0, "first piece '%.*s'", (int)l, p);
    char *back;
    size_t nback;
    cr_assert_eq(kiln_tok_decode(t, b, nb, false, &back, &nback), KILN_OK);
    cr_assert_str_eq(back, s);
    free(back);
    free(a);
    free(b);
    kiln_tok_free(t);
    kiln_gguf_close(f);
}

/* Streams bytes in random pieces; returns the output length. */
static size_t stream_random(const char *in, size_t n, char *out)
{
    kiln_tok_stream s = {0};
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = (size_t)tu_randint(0, 5);
        if (k > n - i) k = n - i;
        o += kiln_tok_stream_put(&s, in + i, k, out + o);
        i += k;
    }
    return o + kiln_tok_stream_end(&s, out + o);
}

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int l = kiln_tok_utf8_len((const unsigned char *)s + i, n - i);
        if (!l) return false;
        i += (size_t)l;
    }
    return true;
}

Test(tok, stream_passes_valid_utf8_whole)
{
    char in[2048], out[8192];
    for (int k = 0; k < 300; k++) {
        size_t n = 0;
        for (int c = (int)tu_randint(0, 300); c > 0; c--) n += put_cp(random_cp(), in + n);
        size_t o = stream_random(in, n, out);
        cr_assert(o == n && memcmp(in, out, n) == 0, "text %d changed in streaming", k);
    }
}

Test(tok, stream_replaces_invalid_bytes_and_stays_valid)
{
    char in[512], out[4096];
    for (int k = 0; k < 500; k++) {
        size_t n = (size_t)tu_randint(0, 200);
        for (size_t i = 0; i < n; i++) in[i] = (char)tu_randint(0, 255);
        size_t o = stream_random(in, n, out);
        cr_assert(o <= 3 * n + 3);
        cr_assert(valid_utf8(out, o), "random bytes %d streamed to invalid UTF-8", k);
    }
    /* held back, then completed by the next piece; a truncated one becomes U+FFFD at the end */
    kiln_tok_stream s = {0};
    cr_assert_eq(kiln_tok_stream_put(&s, "a\xe2\x82", 3, out), 1);
    cr_assert_eq(kiln_tok_stream_put(&s, "\xac" "b", 2, out), 4);
    cr_assert(memcmp(out, "\xe2\x82\xac" "b", 4) == 0);
    cr_assert_eq(kiln_tok_stream_put(&s, "\xf0\x9f", 2, out), 0);
    cr_assert_eq(kiln_tok_stream_end(&s, out), 3);
    cr_assert(memcmp(out, "\xef\xbf\xbd", 3) == 0);
}

Test(tok, invalid_utf8_text_is_refused_naming_the_byte)
{
    kiln_gguf *f = NULL;
    kiln_tok *t = open_vocab("llama-spm", &f);
    int32_t *ids = (int32_t *)1;
    int64_t n = 7;
    cr_assert_eq(kiln_tok_encode(t, "ab\xc3(", 4, false, false, &ids, &n), KILN_ERR_INVALID_ARG);
    cr_assert(ids == NULL && n == 0);
    cr_assert(strstr(kiln_ctx_error(ctx), "byte 2"), "%s", kiln_ctx_error(ctx));
    kiln_tok_free(t);
    kiln_gguf_close(f);
}

/* A small GGUF with a tokenizer of the given model and pre-tokenizer. */
static kiln_status tiny_vocab(const char *model, const char *pre, bool tokens, kiln_tok **t)
{
    gw *w = gw_new(3, 0);
    if (model) gw_kv_str(w, "tokenizer.ggml.model", model);
    if (pre) gw_kv_str(w, "tokenizer.ggml.pre", pre);
    const char *toks[] = {"a", "b", "ab", "\xc4\xa0"};
    const char *merges[] = {"a b"};
    if (tokens) gw_kv_arr_str(w, "tokenizer.ggml.tokens", 4, toks);
    gw_kv_arr_str(w, "tokenizer.ggml.merges", 1, merges);
    size_t n;
    uint8_t *bytes = gw_bytes(w, &n);
    gw_free(w);
    kiln_gguf *f = NULL;
    cr_assert_eq(kiln_gguf_open_memory(ctx, bytes, n, &f), KILN_OK);
    kiln_status s = kiln_tok_new(ctx, f, t);
    kiln_gguf_close(f); /* the tokenizer keeps copies */
    free(bytes);
    return s;
}

Test(tok, unknown_tokenizers_are_refused_by_name)
{
    kiln_tok *t = NULL;
    cr_assert_eq(tiny_vocab("bert", NULL, true, &t), KILN_ERR_UNSUPPORTED);
    cr_assert(t == NULL && strstr(kiln_ctx_error(ctx), "'bert'"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(tiny_vocab("gpt2", "no-such-pre", true, &t), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "'no-such-pre'"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(tiny_vocab("gpt2", NULL, true, &t), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "tokenizer.ggml.pre"), "%s", kiln_ctx_error(ctx));
    cr_assert_eq(tiny_vocab(NULL, NULL, true, &t), KILN_ERR_NAME);
    cr_assert_eq(tiny_vocab("llama", NULL, false, &t), KILN_ERR_NAME);
    cr_assert(strstr(kiln_ctx_error(ctx), "tokenizer.ggml.tokens"), "%s", kiln_ctx_error(ctx));
}

Test(tok, tiny_bpe_merges_by_rank)
{
    kiln_tok *t = NULL;
#ifndef KILN_HAVE_PCRE2
    cr_assert_eq(tiny_vocab("gpt2", "gpt-2", true, &t), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_ctx_error(ctx), "PCRE2"), "%s", kiln_ctx_error(ctx));
    cr_skip_test("built without PCRE2: BPE tokenizers are refused (checked)");
#endif
    cr_assert_eq(tiny_vocab("gpt2", "gpt-2", true, &t), KILN_OK, "%s", kiln_ctx_error(ctx));
    int32_t want[] = {2, 0, 3, 2}, got[16]; /* "ab" merged, "a" alone, " " as Ġ, "ab" */
    int64_t n = enc_into(t, "aba ab", false, got, 0);
    cr_assert(n == 4 && memcmp(got, want, sizeof want) == 0, "got %lld ids: %d %d %d", (long long)n, got[0], got[1], got[2]);
    kiln_tok_free(t);
}

/* Random bytes (invalid UTF-8 refused, nothing else) and random text mixed with the vocabulary's
 * control tokens: with parse_special every control token written comes out as its id, and (BPE)
 * decode(encode(s), special) == s. */
/* True when text is a control token of t (it decodes to nothing unless asked). */
static bool is_control(const kiln_tok *t, const char *text)
{
    int32_t id = kiln_tok_find(t, text, strlen(text));
    size_t l = 1;
    if (id >= 0) kiln_tok_piece(t, id, false, &l);
    return id >= 0 && l == 0;
}

static void hostile_texts(const char *name)
{
    kiln_gguf *f = NULL;
    kiln_tok *t = open_vocab(name, &f);
    char text[2048];
    for (int k = 0; k < 200; k++) {
        size_t n = (size_t)tu_randint(0, 300);
        for (size_t i = 0; i < n; i++) text[i] = (char)tu_randint(0, 256);
        int32_t *ids = NULL;
        int64_t ni = 0;
        kiln_status s = kiln_tok_encode(t, text, n, true, true, &ids, &ni);
        cr_assert(s == KILN_OK || s == KILN_ERR_INVALID_ARG, "random bytes: %s", kiln_status_str(s));
        for (int64_t i = 0; i < ni; i++) cr_assert(ids[i] >= 0 && ids[i] < kiln_tok_n_vocab(t));
        free(ids);
    }
    const char *specials[] = {"<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                              "<|eot_id|>", "<|start_header_id|>"};
    for (int k = 0; k < 200; k++) {
        size_t n = 0;
        int n_sp = 0;
        for (int c = (int)tu_randint(1, 40); c > 0; c--) {
            if (tu_randint(0, 4) == 0) {
                const char *sp = specials[tu_randint(0, sizeof specials / sizeof *specials)];
                if (!is_control(t, sp)) continue; /* absent, or a normal token in this vocabulary */
                memcpy(text + n, sp, strlen(sp)), n += strlen(sp), n_sp++;
            } else {
                n += put_cp(random_cp(), text + n);
            }
        }
        int32_t *ids = NULL;
        int64_t ni = 0;
        cr_assert_eq(kiln_tok_encode(t, text, n, false, true, &ids, &ni), KILN_OK, "%s", kiln_ctx_error(ctx));
        int found = 0;
        for (int64_t i = 0; i < ni; i++)
            for (size_t j = 0; j < sizeof specials / sizeof *specials; j++)
                found += is_control(t, specials[j]) && ids[i] == kiln_tok_find(t, specials[j], strlen(specials[j]));
        cr_assert_geq(found, n_sp, "%s: %d special tokens written, %d of their ids out", name, n_sp, found);
        if (kiln_tok_kind_of(t) == KILN_TOK_BPE) { /* SPM puts a space after each special token */
            char *back = NULL;
            size_t nb = 0;
            cr_assert_eq(kiln_tok_decode(t, ids, ni, true, &back, &nb), KILN_OK);
            cr_assert(nb == n && memcmp(back, text, n) == 0, "%s: text with special tokens came back changed", name);
            free(back);
        }
        free(ids);
    }
    kiln_tok_free(t);
    kiln_gguf_close(f);
}

Test(tok, hostile_texts_llama_spm) { hostile_texts("llama-spm"); }
Test(tok, hostile_texts_llama_bpe) { hostile_texts("llama-bpe"); }
Test(tok, hostile_texts_qwen2) { hostile_texts("qwen2"); }
