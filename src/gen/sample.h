/* Token sampling for generation: repetition penalty, top-k, top-p, min-p, temperature, then a draw
 * from a seeded generator (greedy argmax when the temperature is 0), in llama.cpp's default order.
 * Must not allocate per call: the sampler owns its scratch. Not thread-safe (one per sequence). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kiln/kiln.h"

typedef struct kiln_sample_params {
    float    temp;           /* temperature; <= 0: greedy (argmax after the penalty) */
    int32_t  top_k;          /* keep the k most likely (0: all) */
    float    top_p;          /* keep the smallest set whose probability reaches p (1: all) */
    float    min_p;          /* drop tokens below min_p times the top probability (0: none) */
    float    repeat_penalty; /* divide positive / multiply negative logits of recent tokens (1: off) */
    int32_t  repeat_last_n;  /* how many recent tokens the penalty looks at */
    uint64_t seed;           /* of the generator */
} kiln_sample_params;

typedef struct kiln_sampler kiln_sampler;

/* A sampler over n_vocab logits. KILN_ERR_INVALID_ARG (message in ctx) for a parameter out of range:
 * top_p or min_p outside [0, 1], a negative top_k or repeat_last_n, a penalty <= 0, NaN anywhere. */
kiln_status kiln_sampler_new(kiln_ctx *ctx, const kiln_sample_params *p, int64_t n_vocab, kiln_sampler **out);
void        kiln_sampler_free(kiln_sampler *s);
/* The next token given the logits [n_vocab] and the tokens so far (history, n_hist; the penalty
 * reads the last repeat_last_n of them). Logits are not modified. */
int32_t     kiln_sampler_next(kiln_sampler *s, const float *logits, const int32_t *history, int64_t n_hist);
/* The probabilities the last call drew from (0 for tokens it excluded), for tests: probs [n_vocab]. */
void        kiln_sampler_probs(const kiln_sampler *s, double *probs);
