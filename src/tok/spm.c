/* SentencePiece-style encoding of one text fragment (spaces already written as "▁"): start from
 * UTF-8 characters, repeatedly merge the adjacent pair whose joined text is the highest-scoring
 * token (ties: leftmost), then emit each symbol's token or, when it is none, its bytes' tokens (byte
 * fallback). Same order of merges as llama.cpp's llm_tokenizer_spm, so the same ids. */
#include <stdlib.h>
#include <string.h>

#include "sched/ctx.h"
#include "tok/tok_impl.h"

typedef struct spm_sym {
    int32_t prev, next; /* neighbours (-1: none) */
    uint32_t start, n;  /* bytes of text; n = 0 once merged into its left neighbour */
} spm_sym;

typedef struct spm_pair {
    int32_t  left, right; /* symbols */
    float    score;       /* the joined token's score */
    uint32_t n;           /* joined length: stale when the symbols changed since */
} spm_pair;

/* Max-heap on (score, then lower left index). */
static bool pair_above(const spm_pair *a, const spm_pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct spm_heap {
    spm_pair *v;
    int64_t   n, cap;
} spm_heap;

static bool heap_push(spm_heap *h, spm_pair p)
{
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 64;
        spm_pair *v = realloc(h->v, (size_t)cap * sizeof *v);
        if (!v) return false;
        h->v = v, h->cap = cap;
    }
    int64_t i = h->n++;
    while (i > 0 && pair_above(&p, &h->v[(i - 1) / 2])) h->v[i] = h->v[(i - 1) / 2], i = (i - 1) / 2;
    h->v[i] = p;
    return true;
}

static spm_pair heap_pop(spm_heap *h)
{
    spm_pair top = h->v[0], last = h->v[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && pair_above(&h->v[c + 1], &h->v[c])) c++;
        if (!pair_above(&h->v[c], &last)) break;
        h->v[i] = h->v[c], i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* Queues the pair (left, right) when their joined text is a token. */
static bool try_pair(const kiln_tok *t, const char *text, const spm_sym *sym, int32_t l, int32_t r, spm_heap *h)
{
    if (l < 0 || r < 0) return true;
    uint32_t n = sym[l].n + sym[r].n;
    int32_t id = kiln_tok_find(t, text + sym[l].start, n);
    if (id < 0) return true;
    return heap_push(h, (spm_pair){.left = l, .right = r, .score = t->score[id], .n = n});
}

kiln_status kiln_tok_spm_encode(const kiln_tok *t, const char *text, size_t len, tok_ids *out)
{
    spm_sym *sym = malloc((len + 1) * sizeof *sym);
    spm_heap h = {0};
    bool ok = sym != NULL;
    int32_t ns = 0;
    for (size_t o = 0; ok && o < len; ns++) { /* input is valid UTF-8: checked by the caller */
        uint32_t l = (uint32_t)kiln_tok_utf8_len((const unsigned char *)text + o, len - o);
        if (!l) l = 1;
        sym[ns] = (spm_sym){.prev = ns - 1, .next = o + l == len ? -1 : ns + 1, .start = (uint32_t)o, .n = l};
        o += l;
    }
    for (int32_t i = 1; ok && i < ns; i++) ok = try_pair(t, text, sym, i - 1, i, &h);
    while (ok && h.n) {
        spm_pair p = heap_pop(&h);
        spm_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.n) continue; /* one side was merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        ok = try_pair(t, text, sym, l->prev, p.left, &h) && try_pair(t, text, sym, p.left, l->next, &h);
    }
    kiln_status s = KILN_OK;
    for (int32_t i = 0; ok && s == KILN_OK && ns && i != -1; i = sym[i].next) {
        int32_t id = kiln_tok_find(t, text + sym[i].start, sym[i].n);
        if (id >= 0) {
            kiln_tok_ids_push(out, id);
            continue;
        }
        for (uint32_t k = 0; k < sym[i].n; k++) { /* byte fallback */
            int32_t b = t->byte_tok[(unsigned char)text[sym[i].start + k]];
            if (b < 0) b = t->unk;
            if (b < 0) {
                s = kiln_ctx_fail(t->ctx, KILN_ERR_UNSUPPORTED, "tokenizer: no token for byte 0x%02X and no unknown token",
                                  (unsigned char)text[sym[i].start + k]);
                break;
            }
            kiln_tok_ids_push(out, b);
        }
    }
    free(sym);
    free(h.v);
    if (!ok) return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizing");
    return s;
}
