/* Text <-> ids around the two algorithms: UTF-8 checks, special tokens cut out of the text before
 * tokenizing (longest first, as llama.cpp's tokenizer_st_partition), BOS/EOS and the SPM space
 * prefix; decoding, and a streaming decoder that only ever lets out complete UTF-8 sequences.
 * Must not hand invalid UTF-8 to the regex engine (it is rejected with its byte offset first). */
#define _GNU_SOURCE /* memmem, qsort_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/ctx.h"
#include "tok/tok_impl.h"

/* Bytes a sequence with this lead byte has (0: never a lead byte). */
static int utf8_need(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0;
}

/* True when s[1..n) may continue the lead byte s[0] (the range rules of RFC 3629 for byte 2:
 * no overlong forms, no surrogates, nothing past U+10FFFF). */
static bool utf8_prefix_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        unsigned char lo = 0x80, hi = 0xbf;
        if (i == 1 && s[0] == 0xe0) lo = 0xa0;
        if (i == 1 && s[0] == 0xed) hi = 0x9f;
        if (i == 1 && s[0] == 0xf0) lo = 0x90;
        if (i == 1 && s[0] == 0xf4) hi = 0x8f;
        if (s[i] < lo || s[i] > hi) return false;
    }
    return true;
}

int kiln_tok_utf8_len(const unsigned char *s, size_t n)
{
    int need = n ? utf8_need(s[0]) : 0;
    if (!need || (size_t)need > n || !utf8_prefix_ok(s, (size_t)need)) return 0;
    return need;
}

void kiln_tok_ids_push(tok_ids *o, int32_t id)
{
    if (o->oom) return;
    if (o->n == o->cap) {
        int64_t cap = o->cap ? 2 * o->cap : 64;
        int32_t *v = realloc(o->v, (size_t)cap * sizeof *v);
        if (!v) {
            o->oom = true;
            return;
        }
        o->v = v, o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* A piece of the text to tokenize, or a special token cut out of it. */
typedef struct frag {
    size_t  start, len; /* bytes of the text (raw pieces) */
    int32_t id;         /* the token (-1: raw text) */
} frag;

typedef struct frags {
    frag   *v;
    int64_t n, cap;
    bool    oom;
} frags;

static void frag_push(frags *f, frag x)
{
    if (f->oom) return;
    if (f->n == f->cap) {
        int64_t cap = f->cap ? 2 * f->cap : 16;
        frag *v = realloc(f->v, (size_t)cap * sizeof *v);
        if (!v) {
            f->oom = true;
            return;
        }
        f->v = v, f->cap = cap;
    }
    f->v[f->n++] = x;
}

/* Cuts every special token out of the raw pieces, longest token first. User-defined tokens are
 * always cut; control and unknown ones only with parse_special. */
static bool partition(const kiln_tok *t, const char *text, size_t len, bool parse_special, frags *out)
{
    frags cur = {0}, next = {0};
    if (len) frag_push(&cur, (frag){.start = 0, .len = len, .id = -1});
    for (int64_t k = 0; k < t->n_special && !cur.oom; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->type[id] != KILN_TOKT_USER_DEFINED) continue;
        const char *s = t->text.blob + t->text.off[id];
        size_t sl = t->text.len[id];
        next.n = 0;
        for (int64_t i = 0; i < cur.n; i++) {
            frag f = cur.v[i];
            const char *at;
            while (f.id < 0 && f.len >= sl && (at = memmem(text + f.start, f.len, s, sl))) {
                size_t left = (size_t)(at - text) - f.start;
                if (left) frag_push(&next, (frag){.start = f.start, .len = left, .id = -1});
                frag_push(&next, (frag){.id = id});
                f.start += left + sl, f.len -= left + sl;
            }
            if (f.id >= 0 || f.len) frag_push(&next, f);
        }
        frags tmp = cur;
        cur = next, next = tmp;
        cur.oom = cur.oom || next.oom;
    }
    free(next.v);
    *out = cur;
    return !cur.oom;
}

/* SPM: a space before text that starts the input or follows a special token, spaces as "▁". */
static kiln_status spm_fragment(const kiln_tok *t, const char *s, size_t n, bool prefix, tok_ids *out)
{
    char *buf = malloc(3 * (n + 1));
    if (!buf) return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizing");
    size_t m = 0;
    if (prefix) memcpy(buf, "\xe2\x96\x81", 3), m = 3;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ' ') memcpy(buf + m, "\xe2\x96\x81", 3), m += 3;
        else buf[m++] = s[i];
    kiln_status st = kiln_tok_spm_encode(t, buf, m, out);
    free(buf);
    return st;
}

kiln_status kiln_tok_encode(const kiln_tok *t, const char *text, size_t len, bool add_special, bool parse_special,
                            int32_t **ids, int64_t *n)
{
    if (!ids || !n) return KILN_ERR_INVALID_ARG;
    *ids = NULL, *n = 0;
    if (!t || (!text && len)) return KILN_ERR_INVALID_ARG;
    for (size_t i = 0; i < len;) {
        int l = kiln_tok_utf8_len((const unsigned char *)text + i, len - i);
        if (!l) return kiln_ctx_fail(t->ctx, KILN_ERR_INVALID_ARG, "tokenizer: the text is not valid UTF-8 at byte %zu", i);
        i += (size_t)l;
    }
    frags fr;
    tok_ids out = {0};
    kiln_status s = partition(t, text, len, parse_special, &fr) ? KILN_OK : KILN_ERR_NOMEM;
    if (add_special && t->add_bos) kiln_tok_ids_push(&out, t->bos);
    bool prev_special = true;
    for (int64_t i = 0; s == KILN_OK && i < fr.n; i++) {
        frag f = fr.v[i];
        if (f.id >= 0) kiln_tok_ids_push(&out, f.id);
        else if (t->kind == KILN_TOK_SPM) s = spm_fragment(t, text + f.start, f.len, t->space_prefix && prev_special, &out);
        else s = kiln_tok_bpe_encode(t, text + f.start, f.len, &out);
        prev_special = f.id >= 0;
    }
    if (add_special && t->add_eos) kiln_tok_ids_push(&out, t->eos);
    free(fr.v);
    if (s == KILN_ERR_NOMEM || out.oom) s = kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "tokenizing %zu bytes", len);
    if (s != KILN_OK) {
        free(out.v);
        return s;
    }
    *ids = out.v, *n = out.n;
    return KILN_OK;
}

kiln_status kiln_tok_decode(const kiln_tok *t, const int32_t *ids, int64_t n, bool special, char **text, size_t *len)
{
    if (!text || !len || !t || (!ids && n)) return KILN_ERR_INVALID_ARG;
    *text = NULL, *len = 0;
    bool strip = t->space_prefix;
    if (n && t->space_prefix && t->add_bos && ids[0] == t->bos) ids++, n--, strip = false;
    size_t total = 0, pl;
    for (int64_t i = 0; i < n; i++) kiln_tok_piece(t, ids[i], special, &pl), total += pl;
    char *o = malloc(total + 1);
    if (!o) return kiln_ctx_fail(t->ctx, KILN_ERR_NOMEM, "decoding %lld tokens", (long long)n);
    size_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *p = kiln_tok_piece(t, ids[i], special, &pl);
        if (strip && pl && p[0] == ' ') p++, pl--;
        strip = false;
        memcpy(o + m, p, pl);
        m += pl;
    }
    o[m] = 0;
    *text = o, *len = m;
    return KILN_OK;
}

/* ---------------------------------------------------------------- streaming decode */

static size_t put_fffd(char *out)
{
    memcpy(out, "\xef\xbf\xbd", 3);
    return 3;
}

size_t kiln_tok_stream_put(kiln_tok_stream *s, const char *piece, size_t len, char *out)
{
    size_t o = 0, i = 0;
    /* complete what is held first, one byte at a time from the piece */
    while (s->n_held && i < len) {
        s->held[s->n_held++] = (unsigned char)piece[i++];
        int need = utf8_need(s->held[0]);
        if (!utf8_prefix_ok(s->held, (size_t)s->n_held)) { /* the held lead can never complete */
            o += put_fffd(out + o);
            i -= 1, s->n_held = 0; /* the new byte is looked at again on its own */
        } else if (s->n_held == need) {
            memcpy(out + o, s->held, (size_t)need), o += (size_t)need, s->n_held = 0;
        }
    }
    while (i < len) {
        const unsigned char *u = (const unsigned char *)piece + i;
        int need = utf8_need(u[0]);
        size_t have = len - i < (size_t)need ? len - i : (size_t)need;
        if (need == 0 || !utf8_prefix_ok(u, have)) {
            o += put_fffd(out + o), i++;
        } else if (have < (size_t)need) { /* incomplete at the end of the piece: held back */
            memcpy(s->held, u, have), s->n_held = (int)have, i += have;
        } else {
            memcpy(out + o, u, (size_t)need), o += (size_t)need, i += (size_t)need;
        }
    }
    return o;
}

size_t kiln_tok_stream_end(kiln_tok_stream *s, char *out)
{
    size_t o = 0;
    if (s->n_held) o = put_fffd(out); /* one replacement for the incomplete sequence */
    s->n_held = 0;
    return o;
}
