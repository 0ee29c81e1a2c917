/* An f64 forward pass of a llama-family GGUF model, written from the architectures' definitions
 * (llama.cpp's graphs), independent of kiln's model builder: it reads the file's metadata and
 * tensors itself, so a tensor or key kiln's graph ignores changes this reference's answer. Test
 * support only: slow (dequantizes every weight to f64), returns NULL with a message on trouble. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

/* Logits [n, n_vocab] (malloc'ed) of tokens ids[0..n) at positions 0..n-1, causal. Weights are
 * dequantized with kiln_dequantize (bit-exact with ggml's dequantizers, tested on their own), every
 * other step in f64. Honours: q/k/v/output/ffn biases, per-head q/k rms norms, rope_freqs.weight
 * and linear rotary scaling, a sliding window, tied output; rope mode by architecture; phi3's longrope
 * factors (long ones when max_ctx exceeds the original context) and rope attn_factor. */
double *mref_logits(const kiln_gguf *f, const int32_t *ids, int64_t n, int64_t *n_vocab, char *err, size_t nerr);
/* mref_logits for a plan of max_ctx positions (what picks longrope's factors; 0 in mref_logits). */
double *mref_logits_ctx(const kiln_gguf *f, const int32_t *ids, int64_t n, int64_t max_ctx, int64_t *n_vocab, char *err,
                        size_t nerr);
/* mref_logits_ctx, also giving the smallest gap (in logits) between the last expert a mixture-of-experts
 * router kept and the best it left out, over every token and layer (INFINITY without experts): a
 * backend computing in f32 may route differently from this f64 forward only when it is tiny. */
double *mref_logits_gap(const kiln_gguf *f, const int32_t *ids, int64_t n, int64_t max_ctx, int64_t *n_vocab,
                        double *route_gap, char *err, size_t nerr);
