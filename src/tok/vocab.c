/* Reads a tokenizer from GGUF metadata (tokenizer.ggml.*) into kiln_tok: token texts, scores, types,
 * merges, special ids, the flags that change tokenization, the end-of-generation set, and each
 * token's decoded piece. Copies everything, so the file may be closed afterwards. Must not accept a
 * tokenizer it cannot reproduce: unknown models and pre-tokenizers are refused by name. */
#define _GNU_SOURCE /* memmem, qsort_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sched/ctx.h"
#include "tok/tok_impl.h"

/* ---------------------------------------------------------------- hash map over a string table */

bool kiln_tok_map_build(tok_map *m, const tok_strs *s, bool keep_first)
{
    uint32_t cap = 16;
    while (cap < 2 * (uint64_t)s->n + 2) cap *= 2;
    m->slot = calloc(cap, sizeof *m->slot);
    m->mask = cap - 1;
    if (!m->slot) return false;
    for (int64_t i = 0; i < s->n; i++) {
        if (!s->len[i]) continue; /* an empty text is never looked up */
        uint32_t h = (uint32_t)XXH3_64bits(s->blob + s->off[i], s->len[i]) & m->mask;
        for (;; h = (h + 1) & m->mask) {
            uint32_t e = m->slot[h];
            if (!e) break;
            if (s->len[e - 1] == s->len[i] && memcmp(s->blob + s->off[e - 1], s->blob + s->off[i], s->len[i]) == 0) break;
        }
        /* a repeated text: llama.cpp's token map keeps the last id, its merge ranks the first */
        if (!m->slot[h] || !keep_first) m->slot[h] = (uint32_t)i + 1;
    }
    return true;
}

int64_t kiln_tok_map_find(const tok_map *m, const tok_strs *s, const char *p, size_t n)
{
    if (!m->slot || !n) return -1;
    for (uint32_t h = (uint32_t)XXH3_64bits(p, n) & m->mask;; h = (h + 1) & m->mask) {
        uint32_t e = m->slot[h];
        if (!e) return -1;
        if (s->len[e - 1] == n && memcmp(s->blob + s->off[e - 1], p, n) == 0) return (int64_t)e - 1;
    }
}

void kiln_tok_map_free(tok_map *m)
{
    free(m->slot);
    m->slot = NULL;
}

static void strs_free(tok_strs *s)
{
    free(s->blob);
    free(s->off);
    free(s->len);
    *s = (tok_strs){0};
}

/* Copies a GGUF array of strings. */
static kiln_status strs_read(kiln_ctx *ctx, const kiln_gguf *f, const char *key, tok_strs *s)
{
    kiln_gguf_type et;
    uint64_t n = 0;
    kiln_status st = kiln_gguf_get_arr(f, key, &et, &n, NULL);
    if (st != KILN_OK) return st;
    if (et != KILN_GGUF_STRING) return kiln_ctx_fail(ctx, KILN_ERR_PARSE, "%s is an array of %s, not of strings", key, kiln_gguf_type_name(et));
    if (n > INT32_MAX) return kiln_ctx_fail(ctx, KILN_ERR_PARSE, "%s has %llu entries", key, (unsigned long long)n);
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t l;
        const char *p;
        if ((st = kiln_gguf_get_arr_str(f, key, i, &p, &l)) != KILN_OK) return st;
        if (l > UINT32_MAX / 2) return kiln_ctx_fail(ctx, KILN_ERR_PARSE, "%s[%llu] is %zu bytes long", key, (unsigned long long)i, l);
        total += l;
    }
    s->n = (int64_t)n;
    s->blob = malloc(total + 1);
    s->off = malloc((n + 1) * sizeof *s->off);
    s->len = malloc((n + 1) * sizeof *s->len);
    if (!s->blob || !s->off || !s->len) return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "copying %s", key);
    size_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t l;
        const char *p;
        kiln_gguf_get_arr_str(f, key, i, &p, &l);
        memcpy(s->blob + at, p, l);
        s->off[i] = at;
        s->len[i] = (uint32_t)l;
        at += l;
    }
    return KILN_OK;
}

/* Reads a numeric array of at least n entries as floats (f32 or i32) or small ints (i32/u32). */
static kiln_status num_read(kiln_ctx *ctx, const kiln_gguf *f, const char *key, int64_t n, float *fl, uint8_t *u8)
{
    kiln_gguf_type et;
    uint64_t cnt = 0;
    const void *data = NULL;
    kiln_status st = kiln_gguf_get_arr(f, key, &et, &cnt, &data);
    if (st != KILN_OK) return st;
    bool ok = et == KILN_GGUF_I32 || et == KILN_GGUF_U32 || (fl && et == KILN_GGUF_F32);
    if (!ok) return kiln_ctx_fail(ctx, KILN_ERR_PARSE, "%s is an array of %s", key, kiln_gguf_type_name(et));
    if (cnt < (uint64_t)n)
        return kiln_ctx_fail(ctx, KILN_ERR_PARSE, "%s has %llu entries for %lld tokens", key, (unsigned long long)cnt, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, (const char *)data + 4 * i, 4);
        if (fl) {
            float v;
            memcpy(&v, &w, 4);
            fl[i] = et == KILN_GGUF_F32 ? v : (float)(int32_t)w;
        } else {
            u8[i] = w <= KILN_TOKT_BYTE ? (uint8_t)w : 0; /* 0: undefined (decodes to nothing) */
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------- pieces, special ids */

/* The code point of the valid UTF-8 sequence s[0..l). */
static uint32_t utf8_cp(const unsigned char *s, int l)
{
    if (l == 1) return s[0];
    if (l == 2) return (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    if (l == 3) return (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 | (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
}

/* Writes the decoded bytes of token id (its piece) into out (room for the text's length). inv maps
 * the GPT-2 byte characters (code points below 512) back to their byte (-1 for others). */
static size_t make_piece(const kiln_tok *t, int64_t id, const int16_t inv[512], char *out)
{
    const char *s = t->text.blob + t->text.off[id];
    size_t n = t->text.len[id], o = 0;
    uint8_t ty = t->type[id];
    unsigned b;
    if (ty == KILN_TOKT_BYTE && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && sscanf(s + 3, "%2x", &b) == 1) {
        out[0] = (char)b;
        return 1;
    }
    if (ty == KILN_TOKT_UNUSED || ty == 0) return 0; /* llama.cpp renders these as nothing */
    if (ty != KILN_TOKT_NORMAL && ty != KILN_TOKT_BYTE) { /* control, user-defined, unknown: the text */
        memcpy(out, s, n);
        return n;
    }
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        int l = kiln_tok_utf8_len(u, n - i);
        uint32_t cp = l ? utf8_cp(u, l) : 0x110000;
        if (l == 0) { /* not UTF-8: copied as it is */
            out[o++] = s[i++];
            continue;
        }
        if (t->kind == KILN_TOK_SPM && cp == 0x2581) out[o++] = ' ';
        else if (t->kind == KILN_TOK_BPE && cp < 512 && inv[cp] >= 0) out[o++] = (char)inv[cp];
        else memcpy(out + o, u, (size_t)l), o += (size_t)l; /* outside the byte mapping: kept */
        i += (size_t)l;
    }
    return o;
}

static kiln_status make_pieces(kiln_tok *t)
{
    int16_t inv[512];
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (unsigned b = 0; b < 256; b++) inv[kiln_tok_byte_cp(b)] = (int16_t)b;
    tok_strs *p = &t->piece;
    int64_t n = t->text.n;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) total += t->text.len[i];
    p->n = n;
    p->blob = malloc(total + 1);
    p->off = malloc((size_t)(n + 1) * sizeof *p->off);
    p->len = malloc((size_t)(n + 1) * sizeof *p->len);
    if (!p->blob || !p->off || !p->len) return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizer pieces");
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        p->off[i] = at;
        p->len[i] = (uint32_t)make_piece(t, i, inv, p->blob + at);
        at += p->len[i];
    }
    return KILN_OK;
}

/* Texts llama.cpp treats as end of generation (and as control tokens) whatever their type. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
};

/* An id key (u32) when present and in range, else dflt (-1 when it is out of range too). */
static int32_t id_key(const kiln_gguf *f, const char *key, int32_t dflt, int64_t n)
{
    uint32_t v;
    if (kiln_gguf_get_u32(f, key, &v) == KILN_OK && v < n) return (int32_t)v;
    return dflt >= 0 && dflt < n ? dflt : -1;
}

static bool bool_key(const kiln_gguf *f, const char *key, bool dflt)
{
    bool v;
    return kiln_gguf_get_bool(f, key, &v) == KILN_OK ? v : dflt;
}

/* Longest text first; equal lengths by id, so the order never depends on the sort. */
static int longer_first(const void *a, const void *b, void *arg)
{
    const kiln_tok *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = t->text.len[x], ly = t->text.len[y];
    return lx != ly ? (lx < ly ? 1 : -1) : (x > y) - (x < y);
}

/* Special ids, add_bos/eos, the EOG set and the special-token list (longest text first). */
static kiln_status read_specials(kiln_tok *t, const kiln_gguf *f)
{
    int64_t n = t->text.n;
    bool spm = t->kind == KILN_TOK_SPM;
    t->bos = id_key(f, "tokenizer.ggml.bos_token_id", spm ? 1 : 11, n);
    t->eos = id_key(f, "tokenizer.ggml.eos_token_id", spm ? 2 : 11, n);
    t->unk = id_key(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
    t->eot = id_key(f, "tokenizer.ggml.eot_token_id", -1, n);
    int32_t eom = id_key(f, "tokenizer.ggml.eom_token_id", -1, n);
    t->add_bos = bool_key(f, "tokenizer.ggml.add_bos_token", spm || (t->pre && kiln_tok_pre_add_bos(t->pre)));
    t->add_eos = bool_key(f, "tokenizer.ggml.add_eos_token", false);
    t->space_prefix = spm && bool_key(f, "tokenizer.ggml.add_space_prefix", true);
    if ((t->add_bos && t->bos < 0) || (t->add_eos && t->eos < 0))
        return kiln_ctx_fail(t->ctx, KILN_ERR_PARSE, "tokenizer: add_%s_token is set but the %s id is missing or out of range",
                             t->add_bos && t->bos < 0 ? "bos" : "eos", t->add_bos && t->bos < 0 ? "bos" : "eos");
    t->eog = calloc((size_t)n, 1);
    t->special = malloc((size_t)n * sizeof *t->special);
    if (!t->eog || !t->special) return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizer tables");
    for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++) {
        int32_t id = kiln_tok_find(t, eog_texts[k], strlen(eog_texts[k]));
        if (id < 0) continue;
        t->eog[id] = 1;
        if (t->type[id] != KILN_TOKT_CONTROL && t->type[id] != KILN_TOKT_UNKNOWN) t->type[id] = KILN_TOKT_CONTROL;
    }
    int32_t ends[3] = {t->eos, t->eot, eom};
    for (int k = 0; k < 3; k++)
        if (ends[k] >= 0) t->eog[ends[k]] = 1;
    for (int64_t i = 0; i < n; i++) {
        uint8_t ty = t->type[i];
        if ((ty == KILN_TOKT_CONTROL || ty == KILN_TOKT_USER_DEFINED || ty == KILN_TOKT_UNKNOWN) && t->text.len[i])
            t->special[t->n_special++] = (int32_t)i;
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, longer_first, (void *)t);
    return KILN_OK;
}


/* ---------------------------------------------------------------- the tokenizer */

static kiln_status read_merges(kiln_tok *t, const kiln_gguf *f)
{
    kiln_status s = strs_read(t->ctx, f, "tokenizer.ggml.merges", &t->merge);
    if (s == KILN_ERR_NAME) return kiln_ctx_fail(t->ctx, s, "tokenizer: a BPE vocabulary needs tokenizer.ggml.merges");
    if (s != KILN_OK) return s;
    t->merge_split = malloc((size_t)(t->merge.n + 1) * sizeof *t->merge_split);
    if (!t->merge_split || !kiln_tok_map_build(&t->by_merge, &t->merge, true))
        return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizer merges");
    for (int64_t i = 0; i < t->merge.n; i++) { /* "left right": the first space after the first byte */
        const char *m = t->merge.blob + t->merge.off[i];
        const char *sp = t->merge.len[i] > 1 ? memchr(m + 1, ' ', t->merge.len[i] - 1) : NULL;
        t->merge_split[i] = sp ? (uint32_t)(sp - m) : 0; /* 0: malformed, never matches */
    }
    return KILN_OK;
}

/* The tokenizer kind and, for BPE, the pre-tokenizer and its regexes. */
static kiln_status read_kind(kiln_tok *t, const kiln_gguf *f)
{
    const char *model = NULL, *pre = NULL;
    if (kiln_gguf_get_str(f, "tokenizer.ggml.model", &model, NULL) != KILN_OK)
        return kiln_ctx_fail(t->ctx, KILN_ERR_NAME, "tokenizer: the file has no tokenizer.ggml.model");
    if (strcmp(model, "llama") == 0) {
        t->kind = KILN_TOK_SPM;
        return KILN_OK;
    }
    if (strcmp(model, "gpt2") != 0)
        return kiln_ctx_fail(t->ctx, KILN_ERR_UNSUPPORTED,
                             "tokenizer: tokenizer.ggml.model '%s' is not supported (kiln has 'llama' and 'gpt2')", model);
    t->kind = KILN_TOK_BPE;
    if (kiln_gguf_get_str(f, "tokenizer.ggml.pre", &pre, NULL) != KILN_OK)
        return kiln_ctx_fail(t->ctx, KILN_ERR_UNSUPPORTED,
                             "tokenizer: a BPE vocabulary without tokenizer.ggml.pre: its pre-tokenizer is unknown");
    if (!(t->pre = kiln_tok_pre_find(pre)))
        return kiln_ctx_fail(t->ctx, KILN_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer '%s' (tokenizer.ggml.pre) is not supported",
                             pre);
    t->ignore_merges = kiln_tok_pre_ignore_merges(t->pre);
    return kiln_tok_re_new(t->ctx, t->pre, &t->re);
}

/* Each byte's token: SPM "<0xXX>" (else the byte itself as text); BPE the byte's mapped character. */
static void byte_tokens(kiln_tok *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char buf[8];
        int n;
        if (t->kind == KILN_TOK_SPM) {
            n = snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_tok[b] = kiln_tok_find(t, buf, (size_t)n);
            if (t->byte_tok[b] < 0) buf[0] = (char)b, t->byte_tok[b] = kiln_tok_find(t, buf, 1);
        } else {
            n = kiln_tok_utf8_put(kiln_tok_byte_cp(b), buf); /* code points below 512: 1 or 2 bytes */
            t->byte_tok[b] = kiln_tok_find(t, buf, (size_t)n);
            memcpy(t->byte_chr[b], buf, 2);
            t->byte_len[b] = (uint8_t)n;
        }
    }
}

static kiln_status tok_load(kiln_tok *t, const kiln_gguf *f)
{
    kiln_status s = read_kind(t, f);
    if (s != KILN_OK) return s;
    if ((s = strs_read(t->ctx, f, "tokenizer.ggml.tokens", &t->text)) != KILN_OK) {
        if (s == KILN_ERR_NAME) kiln_ctx_fail(t->ctx, s, "tokenizer: the file has no tokenizer.ggml.tokens");
        return s;
    }
    int64_t n = t->text.n;
    if (n == 0) return kiln_ctx_fail(t->ctx, KILN_ERR_PARSE, "tokenizer: tokenizer.ggml.tokens is empty");
    t->score = calloc((size_t)n, sizeof *t->score);
    t->type = malloc((size_t)n);
    if (!t->score || !t->type || !kiln_tok_map_build(&t->by_text, &t->text, false))
        return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizer tables");
    memset(t->type, KILN_TOKT_NORMAL, (size_t)n);
    if (kiln_gguf_kv_find(f, "tokenizer.ggml.scores") >= 0 &&
        (s = num_read(t->ctx, f, "tokenizer.ggml.scores", n, t->score, NULL)) != KILN_OK)
        return s;
    if (kiln_gguf_kv_find(f, "tokenizer.ggml.token_type") >= 0 &&
        (s = num_read(t->ctx, f, "tokenizer.ggml.token_type", n, NULL, t->type)) != KILN_OK)
        return s;
    if (t->kind == KILN_TOK_BPE && (s = read_merges(t, f)) != KILN_OK) return s;
    if ((s = read_specials(t, f)) != KILN_OK) return s;
    byte_tokens(t);
    return make_pieces(t);
}

kiln_status kiln_tok_new(kiln_ctx *ctx, const kiln_gguf *f, kiln_tok **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    if (!ctx || !f) return KILN_ERR_INVALID_ARG;
    kiln_tok *t = calloc(1, sizeof *t);
    if (!t) return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "tokenizer");
    t->ctx = ctx;
    kiln_status s = tok_load(t, f);
    if (s != KILN_OK) {
        kiln_tok_free(t);
        return s;
    }
    *out = t;
    return KILN_OK;
}

void kiln_tok_free(kiln_tok *t)
{
    if (!t) return;
    strs_free(&t->text);
    strs_free(&t->piece);
    strs_free(&t->merge);
    kiln_tok_map_free(&t->by_text);
    kiln_tok_map_free(&t->by_merge);
    kiln_tok_re_free(t->re);
    free(t->merge_split);
    free(t->score);
    free(t->type);
    free(t->eog);
    free(t->special);
    free(t);
}

const char *kiln_tok_piece(const kiln_tok *t, int32_t id, bool special, size_t *len)
{
    *len = 0;
    if (id < 0 || id >= t->text.n) return "";
    uint8_t ty = t->type[id];
    if (!special && (ty == KILN_TOKT_CONTROL || ty == KILN_TOKT_UNKNOWN)) return "";
    *len = t->piece.len[id];
    return t->piece.blob + t->piece.off[id];
}

int32_t kiln_tok_find(const kiln_tok *t, const char *text, size_t len)
{
    return (int32_t)kiln_tok_map_find(&t->by_text, &t->text, text, len);
}

kiln_tok_kind kiln_tok_kind_of(const kiln_tok *t) { return t->kind; }
int64_t kiln_tok_n_vocab(const kiln_tok *t) { return t->text.n; }
int32_t kiln_tok_bos(const kiln_tok *t) { return t->bos; }
int32_t kiln_tok_eos(const kiln_tok *t) { return t->eos; }
bool kiln_tok_add_bos(const kiln_tok *t) { return t->add_bos; }
bool kiln_tok_is_eog(const kiln_tok *t, int32_t id) { return id >= 0 && id < t->text.n && t->eog[id]; }
const char *kiln_tok_pre_name(const kiln_tok *t) { return t->pre ? kiln_tok_pre_label(t->pre) : ""; }
