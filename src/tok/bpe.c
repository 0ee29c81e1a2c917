/* Byte-level BPE: the pre-tokenizers (tokenizer.ggml.pre -> regexes, as llama.cpp's
 * llm_tokenizer_bpe lists them), splitting with PCRE2 (UTF + UCP), the GPT-2 byte mapping, and
 * rank-ordered merges within each word. Without PCRE2 the build keeps the table but refuses to
 * compile a pre-tokenizer, with a message saying so; it must never split approximately. */
#include <stdlib.h>
#include <string.h>

#include "sched/ctx.h"
#include "tok/tok_impl.h"

#ifdef KILN_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

#define RE_MAX 6

struct tok_pre {
    const char *label;      /* the name kiln reports */
    const char *names;      /* tokenizer.ggml.pre values it stands for, space separated */
    const char *re[RE_MAX]; /* applied in order, each to every piece the previous ones left */
    bool ignore_merges;     /* a word that is a token is taken whole (llama 3) */
    bool add_bos;           /* add_bos_token's default */
};

/* The regexes as llama.cpp writes them (its "adapted" forms: (?i:...) spelled out). */
#define RE_LLAMA3                                                                                                      \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

static const tok_pre pres[] = {
    {"llama-bpe", "llama-bpe llama3 llama-v3 falcon3 falcon-h1 pixtral", {RE_LLAMA3}, true, true},
    {"dbrx", "dbrx smaug-bpe", {RE_LLAMA3}, false, false},
    {"qwen2", "qwen2 deepseek-r1-qwen megrez stablelm2",
     {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, false},
    {"qwen35", "qwen35",
     {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
      "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false, false},
    {"gpt-2", "gpt-2 phi-2 mpt olmo jais", {RE_GPT2}, false, false},
    {"starcoder", "starcoder refact command-r smollm codeshell exaone minerva-7b", {"\\p{N}", RE_GPT2}, false, false},
    {"falcon", "falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {"deepseek-llm", "deepseek-llm",
     {"[\r\n]",
      "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba\xc6\xbc-\xc6\xbf\xc7\x84-\xca"
      "\x93\xca\x95-\xca\xaf\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7\xcd\xbb-\xcd\xbd\xcd\xbf\xce\x86\xce\x88-\xce"
      "\x8a\xce\x8c\xce\x8e-\xce\xa1\xce\xa3-\xcf\xb5\xcf\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96"
      "\xe1\x82\xa0-\xe1\x83\x85\xe1\x8e\xa0-\xe1\x8f\xb5\xe1\x8f\xb8-\xe1\x8f\xbd\xe1\xb2\x90-\xe1\xb2\xba"
      "\xe1\xb2\xbd-\xe1\xb2\xbf\xe1\xb4\x80-\xe1\xb4\xab\xe1\xb5\xab-\xe1\xb5\xb7\xe1\xb5\xb9-\xe1\xb6\x9a"
      "\xe1\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d\xe1\xbc\xa0-\xe1\xbd\x85\xe1\xbd\x88-\xe1\xbd\x8d"
      "\xe1\xbd\x90-\xe1\xbd\x97\xe1\xbd\x99\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd\x9f-\xe1\xbd\xbd\xe1\xbe\x80-"
      "\xe1\xbe\xb4\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe\xe1\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-\xe1\xbf\x8c"
      "\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac\xe1\xbf\xb2-\xe1\xbf\xb4"
      "\xe1\xbf\xb6-\xe1\xbf\xbc\xe2\x84\x82\xe2\x84\x87\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95\xe2\x84\x99-"
      "\xe2\x84\x9d\xe2\x84\xa4\xe2\x84\xa6\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf-\xe2\x84\xb4"
      "\xe2\x84\xb9\xe2\x84\xbc-\xe2\x84\xbf\xe2\x85\x85-\xe2\x85\x89\xe2\x85\x8e\xe2\x86\x83\xe2\x86\x84"
      "\xe2\xb0\x80-\xe2\xb1\xbb\xe2\xb1\xbe-\xe2\xb3\xa4\xe2\xb3\xab-\xe2\xb3\xae\xe2\xb3\xb2\xe2\xb3\xb3"
      "\xea\x99\x80-\xea\x99\xad\xea\x9a\x80-\xea\x9a\x9b\xea\x9c\xa2-\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87"
      "\xea\x9e\x8b-\xea\x9e\x8e\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-\xef\xac\x86\xef\xac\x93-\xef\xac\x97"
      "\xef\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90\x91\x8f\xf0\x90\x92\xb0-"
      "\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb\xf0\x90\xb2\x80-\xf0\x90\xb2\xb2\xf0\x90\xb3\x80-"
      "\xf0\x90\xb3\xb2\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0\x9e\xa4\x80-\xf0\x9e\xa5\x83]+",
      "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+",
      "\\s+$",
      "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
      "\\p{N}+"},
     false, false},
    {"deepseek-coder", "deepseek-coder",
     {"[\r\n]",
      "\\s?\\p{L}+",
      "\\s?\\p{P}+",
      "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
      "\\p{N}"},
     false, false},
};

const tok_pre *kiln_tok_pre_find(const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof pres / sizeof *pres; i++)
        for (const char *p = pres[i].names; *p;) {
            size_t l = strcspn(p, " ");
            if (l == n && memcmp(p, name, n) == 0) return &pres[i];
            p += l + (p[l] == ' ');
        }
    return NULL;
}

const char *kiln_tok_pre_label(const tok_pre *p) { return p->label; }
bool kiln_tok_pre_ignore_merges(const tok_pre *p) { return p->ignore_merges; }
bool kiln_tok_pre_add_bos(const tok_pre *p) { return p->add_bos; }

uint32_t kiln_tok_byte_cp(unsigned b)
{
    /* printable Latin-1 bytes stand for themselves; the others take 256, 257, ... in byte order */
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return b;
    uint32_t k = 0;
    for (unsigned c = 0; c < b; c++) k += !((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae));
    return 256 + k;
}

int kiln_tok_utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return o[0] = (unsigned char)(0xc0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | cp >> 12), o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | cp >> 18), o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)), o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---------------------------------------------------------------- splitting */

struct tok_re {
    int n; /* regexes */
#ifdef KILN_HAVE_PCRE2
    pcre2_code *code[RE_MAX]; /* compiled, UTF + UCP, JIT where available */
#endif
};

#ifdef KILN_HAVE_PCRE2
kiln_status kiln_tok_re_new(kiln_ctx *ctx, const tok_pre *p, tok_re **out)
{
    tok_re *r = calloc(1, sizeof *r);
    if (!r) return kiln_ctx_fail(ctx, KILN_ERR_NOMEM, "tokenizer regexes");
    for (; r->n < RE_MAX && p->re[r->n]; r->n++) {
        int err;
        PCRE2_SIZE at;
        /* DOLLAR_ENDONLY: "$" is the end of the piece, as in the ECMAScript regexes llama.cpp runs */
        r->code[r->n] = pcre2_compile((PCRE2_SPTR)p->re[r->n], PCRE2_ZERO_TERMINATED,
                                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK, &err, &at, NULL);
        if (!r->code[r->n]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            kiln_tok_re_free(r);
            return kiln_ctx_fail(ctx, KILN_ERR_INTERNAL, "tokenizer: pre-tokenizer '%s' regex %d: %s at %zu", p->label, 0,
                                 (const char *)msg, (size_t)at);
        }
        pcre2_jit_compile(r->code[r->n], PCRE2_JIT_COMPLETE); /* optional: interpreted when JIT is absent */
    }
    *out = r;
    return KILN_OK;
}

void kiln_tok_re_free(tok_re *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++) pcre2_code_free(r->code[i]);
    free(r);
}

/* A list of pieces [start, start + len) of the text. */
typedef struct spans {
    uint32_t *v; /* start, len pairs */
    int64_t   n, cap;
    bool      oom;
} spans;

static void spans_push(spans *s, size_t start, size_t len)
{
    if (s->oom || !len) return;
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        uint32_t *v = realloc(s->v, (size_t)cap * 2 * sizeof *v);
        if (!v) {
            s->oom = true;
            return;
        }
        s->v = v, s->cap = cap;
    }
    s->v[2 * s->n] = (uint32_t)start, s->v[2 * s->n + 1] = (uint32_t)len;
    s->n++;
}

/* Each regex in turn splits every piece into its matches and the gaps between them (both kept),
 * the piece standing alone as the subject, as llama.cpp's unicode_regex_split does. */
static kiln_status split(const kiln_tok *t, const char *text, size_t len, spans *out)
{
    spans cur = {0}, next = {0};
    spans_push(&cur, 0, len);
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    bool fail = md == NULL;
    for (int r = 0; !fail && r < t->re->n; r++) {
        next.n = 0;
        for (int64_t i = 0; i < cur.n && !fail; i++) {
            const char *sub = text + cur.v[2 * i];
            size_t n = cur.v[2 * i + 1], pos = 0, last = 0;
            while (pos < n) {
                int rc = pcre2_match(t->re->code[r], (PCRE2_SPTR)sub, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    fail = true;
                    break;
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                if (ov[1] == ov[0]) { /* an empty match: step over one character */
                    int l = kiln_tok_utf8_len((const unsigned char *)sub + ov[0], n - ov[0]);
                    pos = ov[0] + (size_t)(l ? l : 1);
                    continue;
                }
                spans_push(&next, cur.v[2 * i] + last, ov[0] - last);
                spans_push(&next, cur.v[2 * i] + ov[0], ov[1] - ov[0]);
                pos = last = ov[1];
            }
            spans_push(&next, cur.v[2 * i] + last, n - last);
        }
        spans tmp = cur;
        cur = next, next = tmp;
        fail = fail || cur.oom;
    }
    pcre2_match_data_free(md);
    free(next.v);
    *out = cur;
    if (fail) {
        free(cur.v);
        *out = (spans){0};
        return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizer: splitting the text (pre-tokenizer '%s')", t->pre->label);
    }
    return KILN_OK;
}
#else
kiln_status kiln_tok_re_new(kiln_ctx *ctx, const tok_pre *p, tok_re **out)
{
    *out = NULL;
    return kiln_ctx_fail(ctx, KILN_ERR_UNSUPPORTED,
                         "tokenizer: pre-tokenizer '%s' needs PCRE2, and kiln was built without it (install libpcre2-dev "
                         "and rebuild)",
                         p->label);
}

void kiln_tok_re_free(tok_re *r) { free(r); }
#endif

/* ---------------------------------------------------------------- merges within a word */
#ifdef KILN_HAVE_PCRE2

typedef struct bpe_sym {
    int32_t  prev, next; /* neighbours (-1: none) */
    uint32_t start, n;   /* bytes of the encoded word; n = 0 once merged into its left neighbour */
} bpe_sym;

typedef struct bpe_pair {
    int32_t  left, right; /* symbols */
    int32_t  rank;        /* merge rank: lower merges first */
    uint32_t ln, rn;      /* the symbols' lengths when queued: stale when they changed */
} bpe_pair;

/* Scratch of one encode call, grown to the longest word. */
typedef struct bpe_work {
    char     *enc;  /* the word, byte-mapped */
    char     *key;  /* "left right" */
    bpe_sym  *sym;  /* symbols */
    bpe_pair *heap; /* min-heap on (rank, left) */
    size_t    cap;  /* bytes of word the buffers hold (enc 4x, key 4x+1, sym and heap 1x..) */
    int64_t   n_heap, cap_heap;
} bpe_work;

static bool pair_before(const bpe_pair *a, const bpe_pair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool bheap_push(bpe_work *w, bpe_pair p)
{
    if (w->n_heap == w->cap_heap) {
        int64_t cap = w->cap_heap ? 2 * w->cap_heap : 64;
        bpe_pair *v = realloc(w->heap, (size_t)cap * sizeof *v);
        if (!v) return false;
        w->heap = v, w->cap_heap = cap;
    }
    int64_t i = w->n_heap++;
    while (i > 0 && pair_before(&p, &w->heap[(i - 1) / 2])) w->heap[i] = w->heap[(i - 1) / 2], i = (i - 1) / 2;
    w->heap[i] = p;
    return true;
}

static bpe_pair bheap_pop(bpe_work *w)
{
    bpe_pair top = w->heap[0], last = w->heap[--w->n_heap];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= w->n_heap) break;
        if (c + 1 < w->n_heap && pair_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!pair_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c], i = c;
    }
    if (w->n_heap) w->heap[i] = last;
    return top;
}

/* Queues (l, r) when "left right" is a merge. */
static bool add_pair(const kiln_tok *t, bpe_work *w, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return true;
    const bpe_sym *a = &w->sym[l], *b = &w->sym[r];
    memcpy(w->key, w->enc + a->start, a->n);
    w->key[a->n] = ' ';
    memcpy(w->key + a->n + 1, w->enc + b->start, b->n);
    int64_t rank = kiln_tok_map_find(&t->by_merge, &t->merge, w->key, a->n + 1 + b->n);
    if (rank < 0 || t->merge_split[rank] != a->n) return true;
    return bheap_push(w, (bpe_pair){.left = l, .right = r, .rank = (int32_t)rank, .ln = a->n, .rn = b->n});
}

static bool work_fit(bpe_work *w, size_t n)
{
    if (n <= w->cap) return true;
    size_t cap = n < 256 ? 256 : 2 * n;
    char *enc = realloc(w->enc, 4 * cap), *key = enc ? realloc(w->key, 8 * cap + 1) : NULL;
    if (enc) w->enc = enc;
    if (key) w->key = key;
    bpe_sym *sym = key ? realloc(w->sym, 4 * cap * sizeof *sym) : NULL;
    if (sym) w->sym = sym;
    if (!sym) return false;
    w->cap = cap;
    return true;
}

/* Emits the tokens of one symbol: its token, else each character's (else unk). */
static kiln_status emit_sym(const kiln_tok *t, const char *s, uint32_t n, tok_ids *out)
{
    int32_t id = kiln_tok_find(t, s, n);
    if (id >= 0) {
        kiln_tok_ids_push(out, id);
        return KILN_OK;
    }
    for (uint32_t k = 0; k < n;) {
        int l = kiln_tok_utf8_len((const unsigned char *)s + k, n - k);
        if (!l) l = 1;
        id = kiln_tok_find(t, s + k, (size_t)l);
        if (id < 0) id = t->unk;
        if (id < 0)
            return kiln_ctx_fail(t->ctx, KILN_ERR_UNSUPPORTED, "tokenizer: the vocabulary has no token for '%.*s'", l, s + k);
        kiln_tok_ids_push(out, id);
        k += (uint32_t)l;
    }
    return KILN_OK;
}

/* One pre-tokenized word: byte-map it, merge by rank, emit. */
static kiln_status bpe_word(const kiln_tok *t, bpe_work *w, const char *word, size_t len, tok_ids *out)
{
    if (!work_fit(w, len)) return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizing");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)word[i];
        memcpy(w->enc + n, t->byte_chr[b], 2); /* enc has 4 bytes per input byte */
        n += t->byte_len[b];
    }
    if (t->ignore_merges) {
        int32_t id = kiln_tok_find(t, w->enc, n);
        if (id >= 0) {
            kiln_tok_ids_push(out, id);
            return KILN_OK;
        }
    }
    int32_t ns = 0;
    for (size_t o = 0; o < n; ns++) {
        uint32_t l = (uint32_t)kiln_tok_utf8_len((const unsigned char *)w->enc + o, n - o);
        w->sym[ns] = (bpe_sym){.prev = ns - 1, .next = o + l == n ? -1 : ns + 1, .start = (uint32_t)o, .n = l};
        o += l;
    }
    w->n_heap = 0;
    bool ok = true;
    for (int32_t i = 1; ok && i < ns; i++) ok = add_pair(t, w, i - 1, i);
    while (ok && w->n_heap) {
        bpe_pair p = bheap_pop(w);
        bpe_sym *l = &w->sym[p.left], *r = &w->sym[p.right];
        if (l->n != p.ln || r->n != p.rn || l->next != p.right) continue; /* merged since it was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = p.left;
        ok = add_pair(t, w, l->prev, p.left) && add_pair(t, w, p.left, l->next);
    }
    if (!ok) return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizing");
    kiln_status s = KILN_OK;
    for (int32_t i = 0; s == KILN_OK && ns && i != -1; i = w->sym[i].next)
        s = emit_sym(t, w->enc + w->sym[i].start, w->sym[i].n, out);
    return s;
}

kiln_status kiln_tok_bpe_encode(const kiln_tok *t, const char *text, size_t len, tok_ids *out)
{
    spans sp;
    kiln_status s = split(t, text, len, &sp);
    bpe_work w = {0};
    for (int64_t i = 0; s == KILN_OK && i < sp.n; i++) s = bpe_word(t, &w, text + sp.v[2 * i], sp.v[2 * i + 1], out);
    free(sp.v);
    free(w.enc);
    free(w.key);
    free(w.sym);
    free(w.heap);
    return s;
}
#else
kiln_status kiln_tok_bpe_encode(const kiln_tok *t, const char *text, size_t len, tok_ids *out)
{
    (void)text, (void)len, (void)out;
    return kiln_ctx_fail(t->ctx, KILN_ERR_UNSUPPORTED, "tokenizer: byte-level BPE needs PCRE2 (install libpcre2-dev and rebuild)");
}
#endif
