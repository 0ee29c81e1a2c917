/* Tokenizer built from a GGUF file's own tokenizer.ggml.* metadata: SentencePiece-style (score-based
 * merges, byte fallback, "▁" for space) and byte-level BPE (GPT-2 byte mapping, merge ranks, the
 * pre-tokenizer regex named by tokenizer.ggml.pre, through PCRE2). Tokenizes as llama.cpp does.
 * Must not guess: a tokenizer model or pre-tokenizer it does not know is refused, naming it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

typedef struct kiln_tok kiln_tok;

typedef enum kiln_tok_kind {
    KILN_TOK_SPM, /* tokenizer.ggml.model "llama": SentencePiece (llama 1/2, mistral, gemma) */
    KILN_TOK_BPE, /* tokenizer.ggml.model "gpt2": byte-level BPE (llama 3, qwen2, gpt-2, ...) */
    KILN_TOK_KIND_COUNT
} kiln_tok_kind;

/* GGUF tokenizer.ggml.token_type values. */
enum {
    KILN_TOKT_NORMAL = 1,
    KILN_TOKT_UNKNOWN = 2,
    KILN_TOKT_CONTROL = 3,
    KILN_TOKT_USER_DEFINED = 4,
    KILN_TOKT_UNUSED = 5,
    KILN_TOKT_BYTE = 6,
};

/* Reads the tokenizer of f (a copy: f may be closed afterwards). Errors go to ctx (which must
 * outlive the tokenizer): KILN_ERR_NAME (no tokenizer.ggml.tokens / model / merges),
 * KILN_ERR_UNSUPPORTED (a tokenizer model or pre-tokenizer kiln does not implement, or a BPE
 * tokenizer in a build without PCRE2), KILN_ERR_PARSE (arrays of the wrong type or length, ids
 * out of range), KILN_ERR_NOMEM. */
kiln_status kiln_tok_new(kiln_ctx *ctx, const kiln_gguf *f, kiln_tok **out);
void        kiln_tok_free(kiln_tok *t);

/* Text to ids (*ids malloc'ed, the caller frees; *n may be 0). add_special: BOS/EOS as the file's
 * add_bos_token / add_eos_token say; parse_special: control tokens written in the text ("<|im_end|>")
 * become their ids (user-defined tokens always do, as in llama.cpp). KILN_ERR_INVALID_ARG when the
 * text is not valid UTF-8 (naming the byte offset). t is only read: threads may share it, with the
 * context's rule for error messages (the last failure's text). */
kiln_status kiln_tok_encode(const kiln_tok *t, const char *text, size_t len, bool add_special, bool parse_special,
                            int32_t **ids, int64_t *n);

/* The bytes token id stands for (not NUL-terminated; valid while t lives): control and unknown
 * tokens give "" unless special; a byte token gives its byte, so a piece may be part of a UTF-8
 * sequence. id out of range gives "". */
const char *kiln_tok_piece(const kiln_tok *t, int32_t id, bool special, size_t *len);

/* Decodes ids into a malloc'ed NUL-terminated string (*len its length): the pieces concatenated;
 * with an SPM vocabulary's space prefix the leading space of the first piece is dropped (unless the
 * first id is BOS, which is skipped), as llama.cpp's detokenize does. */
kiln_status kiln_tok_decode(const kiln_tok *t, const int32_t *ids, int64_t n, bool special, char **text, size_t *len);

/* Streaming decode: pieces in, only complete UTF-8 sequences out. An incomplete sequence at the
 * end of a piece is held back until the next piece completes it; bytes that can never form a valid
 * sequence are replaced by U+FFFD (so what comes out is always valid UTF-8). */
typedef struct kiln_tok_stream {
    unsigned char held[4]; /* bytes of an incomplete sequence */
    int           n_held;  /* how many */
} kiln_tok_stream;

/* Appends the complete part of held + piece to out and returns the bytes written; out needs room
 * for 3 * len + 8 bytes (every byte may become a 3-byte U+FFFD). */
size_t kiln_tok_stream_put(kiln_tok_stream *s, const char *piece, size_t len, char *out);
/* Ends the stream: an incomplete sequence still held becomes one U+FFFD; returns the bytes written
 * (0 or 3). */
size_t kiln_tok_stream_end(kiln_tok_stream *s, char *out);

kiln_tok_kind kiln_tok_kind_of(const kiln_tok *t);
int64_t       kiln_tok_n_vocab(const kiln_tok *t);
int32_t       kiln_tok_bos(const kiln_tok *t); /* -1 when none */
int32_t       kiln_tok_eos(const kiln_tok *t); /* -1 when none */
bool          kiln_tok_add_bos(const kiln_tok *t);
/* True for ids that end generation: EOS, EOT, and the end-of-turn tokens llama.cpp recognizes by text
 * ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|endoftext|>", ...). */
bool          kiln_tok_is_eog(const kiln_tok *t, int32_t id);
/* The id of an exact token text, or -1. */
int32_t       kiln_tok_find(const kiln_tok *t, const char *text, size_t len);
/* The pre-tokenizer name in use ("llama-bpe", "qwen2", ...; "" for SPM). */
const char   *kiln_tok_pre_name(const kiln_tok *t);

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid or incomplete. */
int kiln_tok_utf8_len(const unsigned char *s, size_t n);
