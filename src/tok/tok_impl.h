/* Inside of the tokenizer (src/tok only): the vocabulary tables, the hash map over token and merge
 * texts, and the pieces each algorithm file provides. Not for use outside src/tok. */
#pragma once

#include "tok/tok.h"

/* Open-addressing hash set of indices into a string table (slot = index + 1, 0 = empty). */
typedef struct tok_map {
    uint32_t *slot; /* [mask + 1] */
    uint32_t  mask; /* capacity - 1 (a power of two, at least twice the entries) */
} tok_map;

/* A table of byte strings in one blob. */
typedef struct tok_strs {
    char     *blob; /* all texts back to back */
    uint64_t *off;  /* [n] start of each in blob */
    uint32_t *len;  /* [n] byte length */
    int64_t   n;    /* entries */
} tok_strs;

typedef struct tok_pre tok_pre; /* a pre-tokenizer (bpe.c) */
typedef struct tok_re tok_re;   /* its compiled regexes (bpe.c) */

struct kiln_tok {
    kiln_ctx     *ctx;          /* errors of encode go here */
    kiln_tok_kind kind;         /* SPM or BPE */
    tok_strs      text;         /* token texts as in the file */
    tok_strs      piece;        /* what each token decodes to (control/unknown: their text) */
    float        *score;        /* [n] tokenizer.ggml.scores (0 when absent) */
    uint8_t      *type;         /* [n] tokenizer.ggml.token_type (NORMAL when absent) */
    uint8_t      *eog;          /* [n] 1 for tokens that end generation */
    tok_map       by_text;      /* token text -> id */
    tok_strs      merge;        /* BPE merges "left right" */
    uint32_t     *merge_split;  /* [n merges] byte offset of the separating space */
    tok_map       by_merge;     /* "left right" -> rank */
    int32_t       byte_tok[256]; /* token of each byte (SPM <0xXX>, BPE its mapped character), -1 */
    char          byte_chr[256][2]; /* BPE: the UTF-8 of each byte's mapped character */
    uint8_t       byte_len[256]; /* its length (1 or 2) */
    int32_t      *special;      /* control / user-defined / unknown ids, longest text first */
    int64_t       n_special;    /* their count */
    int32_t       bos, eos, eot, unk; /* special ids, -1 when none */
    bool          add_bos, add_eos;   /* encode with add_special adds them */
    bool          space_prefix;  /* SPM: a space is put before text (tokenizer.ggml.add_space_prefix) */
    bool          ignore_merges; /* BPE: a word that is a whole token is taken as it is (llama 3) */
    const tok_pre *pre;          /* BPE pre-tokenizer */
    tok_re        *re;           /* its compiled regexes */
};

/* Hash map over a string table. */
/* keep_first: a text that occurs twice maps to its first index (else its last). */
bool    kiln_tok_map_build(tok_map *m, const tok_strs *s, bool keep_first);
int64_t kiln_tok_map_find(const tok_map *m, const tok_strs *s, const char *p, size_t n);
void    kiln_tok_map_free(tok_map *m);

/* A growing id list (malloc'ed). */
typedef struct tok_ids {
    int32_t *v;   /* ids */
    int64_t  n;   /* count */
    int64_t  cap; /* capacity */
    bool     oom; /* an allocation failed */
} tok_ids;
void kiln_tok_ids_push(tok_ids *o, int32_t id);

/* SPM (spm.c): tokens of text (already escaped: spaces as "▁"). */
kiln_status kiln_tok_spm_encode(const kiln_tok *t, const char *text, size_t len, tok_ids *out);

/* BPE (bpe.c): the pre-tokenizer named by tokenizer.ggml.pre (NULL when unknown), its regexes
 * compiled (KILN_ERR_UNSUPPORTED without PCRE2), and the tokens of one raw text fragment. */
const tok_pre *kiln_tok_pre_find(const char *name);
const char    *kiln_tok_pre_label(const tok_pre *p);
bool           kiln_tok_pre_ignore_merges(const tok_pre *p);
bool           kiln_tok_pre_add_bos(const tok_pre *p);
kiln_status    kiln_tok_re_new(kiln_ctx *ctx, const tok_pre *p, tok_re **out);
void           kiln_tok_re_free(tok_re *r);
kiln_status    kiln_tok_bpe_encode(const kiln_tok *t, const char *text, size_t len, tok_ids *out);
/* The GPT-2 byte-to-character mapping: the code point standing for byte b. */
uint32_t       kiln_tok_byte_cp(unsigned b);
/* Writes code point cp as UTF-8 into out (4 bytes of room); returns its length. */
int            kiln_tok_utf8_put(uint32_t cp, char *out);
