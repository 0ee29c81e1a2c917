/* kiln — a graph execution engine with lazy op fusion for transformer inference.
 * This is the whole public API. Every handle is opaque; every call that can fail returns a
 * kiln_status and writes results through out-parameters placed last. Nothing here aborts on a
 * caller's mistake. Thread safety: distinct handles may be used from distinct threads, and so may
 * the plans of one context: kiln_compile and kiln_run (and the kiln_plan_* calls) on one context
 * may run on several threads at once, each plan used by one thread at a time, with the same
 * results bit for bit as one after another (work on one backend is serialized inside: a CPU
 * region, or a device backend's command stream, at a time). kiln_ctx_error gives the calling
 * thread's own last message. One graph must not be built on from two threads at once; a context
 * must not be freed while another thread uses it; kiln_check, kiln_calibrate and the profile
 * setters (kiln_ctx_set_profile, kiln_ctx_load_profile) want the context to themselves. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KILN_BUILDING) && defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"

#define KILN_MAX_RANK 4 /* most dimensions a tensor may have */
#define KILN_MAX_SRC 7  /* most operands an op may have */

/* ---------------------------------------------------------------- status and errors */

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG,  /* a NULL handle, a bad enum, a bad option */
    KILN_ERR_SHAPE,        /* shapes of operands do not agree, or a byte size overflows */
    KILN_ERR_DTYPE,        /* a dtype an op does not take */
    KILN_ERR_NODE,         /* an unknown node id, or one from another graph */
    KILN_ERR_NAME,         /* a name that is missing, unknown, or used twice */
    KILN_ERR_SYMBOL,       /* a symbolic dim unbound at run, or bound over its maximum */
    KILN_ERR_BINDING,      /* a run binding whose size or kind does not fit its tensor */
    KILN_ERR_PARSE,        /* a .kg file or profile with a syntax or meaning error */
    KILN_ERR_IO,           /* a file could not be read or written */
    KILN_ERR_NOMEM,        /* an allocation failed */
    KILN_ERR_UNSUPPORTED,  /* a backend or op/dtype combination that is not available */
    KILN_ERR_BACKEND,      /* a backend failed at run time (driver error kept in the message) */
    KILN_ERR_INTERNAL,     /* a broken invariant inside kiln: please report it */
    KILN_ERR_NONFINITE,    /* check_finite: a computed value is NaN or infinite (the message names the
                              first such node, its element, its fused region and backend) */
    KILN_ERR_BUSY,         /* kiln_run_async: the device queue holds as many unwaited steps as kiln
                              keeps (kiln_plan_wait first); nothing was enqueued */
    KILN_STATUS_COUNT
} kiln_status;

/* Static text for a status ("shape mismatch", ...). Never NULL. Thread-safe. */
KILN_API const char *kiln_status_str(kiln_status s);

/* ---------------------------------------------------------------- dtypes */

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16,
    KILN_DTYPE_BF16,
    KILN_DTYPE_I32,
    KILN_DTYPE_Q8_0, /* GGUF q8_0: blocks of 32 values, 34 bytes (f16 scale + 32 x int8)      */
    KILN_DTYPE_Q4_K, /* GGUF q4_K: blocks of 256 values, 144 bytes                              */
    KILN_DTYPE_Q5_K, /* GGUF q5_K: blocks of 256 values, 176 bytes                              */
    KILN_DTYPE_Q6_K, /* GGUF q6_K: blocks of 256 values, 210 bytes                              */
    KILN_DTYPE_Q4_0, /* GGUF q4_0: blocks of 32 values, 18 bytes (f16 scale + 16 bytes of nibbles)  */
    KILN_DTYPE_Q4_1, /* GGUF q4_1: blocks of 32 values, 20 bytes (f16 scale and min + nibbles)      */
    KILN_DTYPE_Q5_0, /* GGUF q5_0: blocks of 32 values, 22 bytes                                   */
    KILN_DTYPE_Q5_1, /* GGUF q5_1: blocks of 32 values, 24 bytes                                   */
    KILN_DTYPE_IQ4_NL, /* GGUF iq4_nl: blocks of 32 values, 18 bytes (non-linear 4-bit codebook)   */
    KILN_DTYPE_Q2_K, /* GGUF q2_K: blocks of 256 values, 84 bytes                               */
    KILN_DTYPE_Q3_K, /* GGUF q3_K: blocks of 256 values, 110 bytes                              */
    KILN_DTYPE_IQ4_XS, /* GGUF iq4_xs: blocks of 256 values, 136 bytes                           */
    /* ggml's codebook i-quants: read (dequantized exactly as ggml does) on ref and cpu; kiln has no
     * quantizer for them (kiln_quantize fails) and the GPU backends refuse them by name. */
    KILN_DTYPE_IQ2_XXS, /* GGUF iq2_xxs: blocks of 256 values, 66 bytes                          */
    KILN_DTYPE_IQ2_XS, /* GGUF iq2_xs: blocks of 256 values, 74 bytes                            */
    KILN_DTYPE_IQ2_S,  /* GGUF iq2_s: blocks of 256 values, 82 bytes                             */
    KILN_DTYPE_IQ3_XXS, /* GGUF iq3_xxs: blocks of 256 values, 98 bytes                          */
    KILN_DTYPE_IQ3_S,  /* GGUF iq3_s: blocks of 256 values, 110 bytes                            */
    KILN_DTYPE_IQ1_S,  /* GGUF iq1_s: blocks of 256 values, 50 bytes                             */
    KILN_DTYPE_IQ1_M,  /* GGUF iq1_m: blocks of 256 values, 56 bytes                             */
    KILN_DTYPE_COUNT
} kiln_dtype;

/* "f32", "q4_k", ... ; "?" for a value out of range. */
KILN_API const char *kiln_dtype_name(kiln_dtype t);
/* Parses a dtype name; returns false (and leaves *out alone) for an unknown name. */
KILN_API bool kiln_dtype_parse(const char *name, kiln_dtype *out);
/* Values per block: 1 for plain types, 32 for q8_0/q4_0/q4_1/q5_0/q5_1/iq4_nl, 256 for the k-quants and iq4_xs. */
KILN_API int64_t kiln_dtype_block(kiln_dtype t);
/* Bytes per block (f32 4, f16 2, bf16 2, i32 4, q8_0 34, q4_k 144, q5_k 176, q6_k 210, q4_0 18, q4_1 20,
 * q5_0 22, q5_1 24, iq4_nl 18, q2_k 84, q3_k 110, iq4_xs 136). */
KILN_API size_t kiln_dtype_block_bytes(kiln_dtype t);
/* Bytes of a row of n values; 0 when n is not a multiple of the block size or t is invalid. */
KILN_API size_t kiln_row_bytes(kiln_dtype t, int64_t n);

/* Reference conversion from f32 to t (f16, bf16 and every block format; f32 copies). n must be a
 * multiple of kiln_dtype_block(t). Bit-exact with ggml's reference quantizers for q8_0, q4_k, q5_k,
 * q6_k, q4_0, q4_1, q5_0 and q5_1; iq4_nl, iq4_xs, q2_k and q3_k use a plain rounding quantizer
 * (valid blocks, decoded exactly, but not ggml's search: not byte-equal with llama-quantize).
 * src is one flat run of n values cut into blocks of kiln_dtype_block(t): for a matrix, blocks
 * must not straddle rows, so the row length must itself be a multiple of the block (896 x 896 as
 * q4_k passes this call, 802816 = 3136 blocks, but its 896-wide rows are not whole blocks and
 * kiln_weight/kiln_matmul refuse that matrix). Quantize row by row, or check kiln_row_bytes(t, row) != 0. */
KILN_API kiln_status kiln_quantize(kiln_dtype t, const float *src, void *dst, int64_t n);
/* Reference conversion from t to f32 (every dtype; i32 converts values); bit-exact with ggml's dequantizers. */
KILN_API kiln_status kiln_dequantize(kiln_dtype t, const void *src, float *dst, int64_t n);

/* ---------------------------------------------------------------- context */

typedef struct kiln_ctx kiln_ctx;

typedef struct kiln_ctx_options {
    int         n_threads; /* CPU threads; 0 = one per core */
    const char *cache_dir; /* kernel and profile cache; NULL = $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln,
                              else ~/.cache/kiln ($KILN_CACHE=off|on|all: docs/cache.md) */
    bool        quiet;     /* true: no progress lines on stderr */
} kiln_ctx_options;

/* Creates a context: probes backends (a missing GPU is not an error). opts may be NULL. */
KILN_API kiln_status kiln_ctx_new(const kiln_ctx_options *opts, kiln_ctx **out);
/* Frees a context; NULL does nothing. Plans made from it must be freed first. */
KILN_API void kiln_ctx_free(kiln_ctx *ctx);
/* The detail of the last failure of a call on this context (or a plan made from it) made by the
 * calling thread: names the node, op, file:line or driver log. "" when there was none. Valid
 * until this thread's next call on the context. */
KILN_API const char *kiln_ctx_error(const kiln_ctx *ctx);

/* Backends known to kiln, present or not ("ref", "cpu", "cuda", "vulkan"). */
KILN_API int kiln_backend_count(const kiln_ctx *ctx);
typedef struct kiln_backend_info {
    const char *name;      /* "ref", "cpu", ... */
    bool        available; /* usable in this process */
    const char *detail;    /* when available: device/ISA; otherwise why not ("libcuda.so.1 not found") */
} kiln_backend_info;
KILN_API kiln_status kiln_backend_get(const kiln_ctx *ctx, int i, kiln_backend_info *out);
/* Whether split plans over distinct GPUs (kiln_compile_options.devices "cuda:0,1") can run here:
 * KILN_OK with *n_gpus and detail ("NCCL 2.21.5 from PATH, 2 GPUs"), else KILN_ERR_UNSUPPORTED
 * with why in detail (cuda absent, one GPU, libnccl.so.2 not found: $KILN_NCCL_LIB, the system's
 * library paths and Python environments' nvidia/nccl/lib are tried). Loads NCCL to look. */
KILN_API kiln_status kiln_multi_gpu(const kiln_ctx *ctx, int *n_gpus, char *detail, size_t n);
/* The CPU ISA path in use ("avx512", "avx2", "scalar"). */
KILN_API const char *kiln_cpu_isa(const kiln_ctx *ctx);

/* ---------------------------------------------------------------- graph */

typedef struct kiln_graph kiln_graph;

/* A node handle. It carries the graph's identity, so a node of one graph passed to another is
 * caught (KILN_ERR_NODE). KILN_NODE_NONE is returned by builders after an error. */
typedef uint64_t kiln_node;
#define KILN_NODE_NONE ((kiln_node)0)

/* A dimension: a constant >= 0, or a symbol made by kiln_sym (a negative value). */
typedef int64_t kiln_dim;

/* Creates an empty graph. Graphs are independent of contexts. */
KILN_API kiln_status kiln_graph_new(kiln_graph **out);
/* Frees a graph and the weights it copied; NULL does nothing. Plans compiled from it stay valid. */
KILN_API void kiln_graph_free(kiln_graph *g);
/* The first builder error (KILN_OK if none) and its message ("matmul 'q': x has 4096 columns
 * but w has 4095"). Once set, every builder call returns KILN_NODE_NONE. */
KILN_API kiln_status kiln_graph_status(const kiln_graph *g);
KILN_API const char *kiln_graph_error(const kiln_graph *g);
/* Number of nodes. */
KILN_API uint32_t kiln_graph_size(const kiln_graph *g);

/* A symbolic dimension with an upper bound (1 <= max). Its value is bound at each run and must be
 * in [1, max]. Names are unique per graph; asking again for the same name
 * with the same max returns the same symbol. */
KILN_API kiln_dim kiln_sym(kiln_graph *g, const char *name, int64_t max);

/* Leaves. name must be unique among leaves and outputs. */
KILN_API kiln_node kiln_input(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims);

typedef enum kiln_weight_mode {
    KILN_WEIGHT_COPY = 0, /* kiln copies the data now; the caller's buffer may be freed */
    KILN_WEIGHT_BORROW,   /* kiln keeps the pointer; it must outlive every plan compiled from g */
    KILN_WEIGHT_MODE_COUNT
} kiln_weight_mode;
/* A constant tensor (dims constant). data holds the rows in dtype t (block formats: GGUF bytes). */
KILN_API kiln_node kiln_weight(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims,
                               const void *data, kiln_weight_mode mode);
/* A weight filled with reproducible random values (uniform in [-scale, scale], quantized to t). */
KILN_API kiln_node kiln_weight_random(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims,
                                      uint64_t seed, float scale);
/* A persistent tensor owned by each plan (zero at compile), e.g. a KV cache [n_kv_heads, max_ctx, head_dim].
 * Read and written by kiln_plan_state_read/_write; updated in place by kv_scatter. Dims constant.
 * dtype f32, f16, bf16, i32, or q8_0 (a quantized paged KV pool: ggml's blocks of 32 along the last
 * dim, which must be a multiple of 32; only kv_scatter and paged attention take it); another block
 * dtype (k-quants) fails here with KILN_ERR_DTYPE. */
KILN_API kiln_node kiln_state(kiln_graph *g, const char *name, kiln_dtype t, int rank, const kiln_dim *dims);

/* Marks a node as an output, bound by name at run. A node may have several output names. */
KILN_API kiln_status kiln_output(kiln_graph *g, kiln_node x, const char *name);
/* Gives a node a name for messages and plans (optional; not part of the graph hash). */
KILN_API kiln_status kiln_name(kiln_graph *g, kiln_node x, const char *name);

/* Ops. Activations are f32, f16 or bf16 (computed in f32); results keep x's dtype unless stated. */

/* y[.., n] = sum_k x[.., k] * w[n, k]. x f32/f16/bf16 [..., K]; w [N, K] of any float or block dtype
 * (K a multiple of the block). y is f32 [..., N]. */
KILN_API kiln_node kiln_matmul(kiln_graph *g, kiln_node x, kiln_node w);
/* a + b and a * b; b's dims equal a's trailing dims (b broadcast over a's leading dims). */
KILN_API kiln_node kiln_add(kiln_graph *g, kiln_node a, kiln_node b);
KILN_API kiln_node kiln_mul(kiln_graph *g, kiln_node a, kiln_node b);
KILN_API kiln_node kiln_scale(kiln_graph *g, kiln_node x, float s);
KILN_API kiln_node kiln_silu(kiln_graph *g, kiln_node x);
/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
KILN_API kiln_node kiln_gelu(kiln_graph *g, kiln_node x);
/* Logistic sigmoid: 1 / (1 + e^-x) (gates of gated attention and MoE routers). */
KILN_API kiln_node kiln_sigmoid(kiln_graph *g, kiln_node x);
/* Hyperbolic tangent (gemma's final-logit soft-capping: cap * tanh(logits / cap)). */
KILN_API kiln_node kiln_tanh(kiln_graph *g, kiln_node x);
/* silu(gate) * up; equal shapes. */
KILN_API kiln_node kiln_swiglu(kiln_graph *g, kiln_node gate, kiln_node up);
/* x / sqrt(mean(x^2 over the last dim) + eps) * w; w [D] or KILN_NODE_NONE. */
KILN_API kiln_node kiln_rms_norm(kiln_graph *g, kiln_node x, kiln_node w, float eps);
/* (x - mean) / sqrt(var + eps) * w + b over the last dim; w, b [D] or KILN_NODE_NONE. */
KILN_API kiln_node kiln_layer_norm(kiln_graph *g, kiln_node x, kiln_node w, kiln_node b, float eps);
/* Softmax over the last dim. */
KILN_API kiln_node kiln_softmax(kiln_graph *g, kiln_node x);

typedef enum kiln_rope_mode {
    KILN_ROPE_NORMAL = 0, /* rotates pairs (2i, 2i+1): for GGUF llama files (llama.cpp's converter
                             permutes the Q/K rows of Hugging Face llama weights into this layout), GPT-J */
    KILN_ROPE_NEOX,       /* rotates pairs (i, i + d/2): for Hugging Face checkpoints (llama, mistral,
                             qwen2 as published), GGUF qwen2 and GPT-NeoX. The wrong mode for a weight
                             layout runs without error and gives wrong results (NMSE ~5e-2). */
    KILN_ROPE_MODE_COUNT
} kiln_rope_mode;
/* Rotary embedding. x [n_tok, n_head, head_dim] (head_dim even); pos i32 [n_tok] absolute
 * positions; angle of pair i = pos * theta^(-2i/head_dim). */
KILN_API kiln_node kiln_rope(kiln_graph *g, kiln_node x, kiln_node pos, kiln_rope_mode mode, float theta);
/* kiln_rope with a multiplier per pair: angle of pair i = pos * theta^(-2i/head_dim) * mult[i].
 * mult holds head_dim/2 finite values > 0 (copied; NULL: all 1, which is kiln_rope). Linear rotary
 * scaling by s is mult[i] = 1/s; llama-3.1's rope_freqs tensor f gives mult[i] = 1/f[i]. */
KILN_API kiln_node kiln_rope_ext(kiln_graph *g, kiln_node x, kiln_node pos, kiln_rope_mode mode, float theta,
                                 const float *mult);
/* Partial rotary (Phi-4-mini, phi-2, stablelm, GPT-NeoX: llama.cpp's rope.dimension_count below the
 * head size): kiln_rope_ext over the first n_rot dims of each head, the other head_dim - n_rot dims
 * passed through unchanged. Within the rotated dims pairs are (2i, 2i+1) (normal) or (i, i + n_rot/2)
 * (neox), and pair i turns by pos * theta^(-2i/n_rot) * mult[i] (mult: n_rot/2 values or NULL).
 * n_rot even, 2 <= n_rot <= head_dim; n_rot == head_dim is kiln_rope_ext (the same node and hash). */
KILN_API kiln_node kiln_rope_partial(kiln_graph *g, kiln_node x, kiln_node pos, kiln_rope_mode mode, float theta,
                                     const float *mult, int64_t n_rot);

/* Causal grouped-query attention over a cache. q [n_tok, n_head, head_dim]; k, v states (or
 * kv_scatter results) [n_kv_head, max_ctx, head_dim], n_head a multiple of n_kv_head; n_kv (a
 * symbol or constant <= max_ctx) is the number of valid cache rows. The n_tok queries sit at
 * positions n_kv - n_tok .. n_kv - 1; query t sees keys 0 .. n_kv - n_tok + t. Scores are
 * scaled by `scale` (0 = 1/sqrt(head_dim)). y is f32 [n_tok, n_head, head_dim]. */
KILN_API kiln_node kiln_attention(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_dim n_kv, float scale);
/* kiln_attention with a sliding window and logit soft-capping (gemma 2/3, phi3, mistral): the query at
 * position p sees only keys p - window + 1 .. p (window 0: keys 0 .. p), and each scaled score s
 * becomes softcap * tanh(s / softcap) before the softmax (softcap 0: s unchanged). window in [0, 2^31). */
KILN_API kiln_node kiln_attention_ext(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_dim n_kv, float scale,
                                      float softcap, int64_t window);
/* Paged attention over a ragged batch of sequences (the step of a serving engine). The new tokens
 * of n_seq sequences are packed as rows: q [n_tok, n_head, head_dim] (n_tok = all new tokens of
 * the step). k, v are paged pools (states, or kv_scatter results) [n_kv_head, n_blocks * block,
 * head_dim] of f32, f16, bf16 or q8_0 (each slot's head_dim values as ggml's q8_0 blocks, which
 * kv_scatter quantizes as ggml does; GPU kernels read a q8_0 pool up to 2 bytes past its last block,
 * so a caller-owned one wants its size rounded up to 4 bytes): physical block b holds slots
 * b * block .. b * block + block - 1. Per step, bound as
 * inputs (host or device memory), of fixed capacity so a recording stays valid:
 *   pos    i32 [n_tok]  the position of each new token in its sequence;
 *   seqs   i32 [n_seq, 2]  per sequence: the row where its new tokens start (cu_seqlens: 0 for the
 *          first, increasing; sequence s has start[s+1] - start[s] new tokens, the last one
 *          n_tok - start) and its KV length (cached + new tokens, >= its new tokens);
 *   blocks i32 [n_seq, max_blocks]  the block table: key j of sequence s is at slot
 *          blocks[s][j / block] * block + j % block (entries past its KV length are not read).
 * Token i of the new tokens of sequence s must sit at position kv_len - q_len + i and sees keys
 * 0 .. that position of its own sequence (causal within its new tokens). The new keys/values are
 * written by kv_scatter(pool, rows, slots) with slots[t] = the slot of (sequence, pos[t]). Blocks
 * may be shared between sequences (prefix caching): kiln only reads them. Before any kernel runs,
 * kiln_run checks host-bound metadata (starts, lengths against capacity, positions against lengths,
 * block indices against the pool, slots against the block table) and refuses a bad step naming
 * what is wrong (KILN_ERR_BINDING); the plan stays usable. block: a power of two in [1, 1024]
 * (16..128 are the usual sizes). scale as in kiln_attention. y is f32 [n_tok, n_head, head_dim]. */
KILN_API kiln_node kiln_paged_attention(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_node pos,
                                        kiln_node seqs, kiln_node blocks, int block, float scale);
/* Speculative verification: kiln_paged_attention over a step whose new tokens form, per sequence,
 * a tree (or a chain, or a forest) of draft tokens, so that one pass scores every draft. parents
 * i32 [n_tok]: the parent of each new token as an index among its own sequence's new tokens
 * (0 = the sequence's first new token), smaller than the token's own index, or -1 for a root (its
 * parent is the sequence's last cached token). New tokens keep the storage order of the rows: token
 * i of sequence s is key kv_len - q_len + i of it (its slot, for kv_scatter, is that key's), while
 * its position is kv_len - q_len + depth(i) (depth 0 for a root, the parent's + 1 otherwise): pos
 * must say so. Token i sees the sequence's cached keys 0 .. kv_len - q_len - 1 and the keys of its
 * ancestors and itself, nothing else: each row equals decoding its draft path one token at a time.
 * A chain (parents[i] = i - 1) is kiln_paged_attention. kiln_run checks the tree as it checks the
 * rest of the metadata (a parent out of range names the token and the value); device-bound parents
 * are clamped into the sequence. On GPUs, tree steps of many rows per sequence take the flash
 * kernel (its tiles mask other draft paths), the others the split-KV kernels. */
KILN_API kiln_node kiln_paged_attention_tree(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_node pos,
                                             kiln_node seqs, kiln_node blocks, kiln_node parents, int block,
                                             float scale);
/* kiln_paged_attention with kiln_attention_ext's window and soft-cap (positions are pos[t]). */
KILN_API kiln_node kiln_paged_attention_ext(kiln_graph *g, kiln_node q, kiln_node k, kiln_node v, kiln_node pos,
                                            kiln_node seqs, kiln_node blocks, int block, float scale, float softcap,
                                            int64_t window);
/* Writes rows [n_tok, n_kv_head, head_dim] into a state [n_kv_head, max_ctx, head_dim] at the
 * positions pos i32 [n_tok] (each < max_ctx, checked at run): state[h, pos[t], :] = rows[t, h, :].
 * The result is the updated state; read it (e.g. by attention) to order the write before. A q8_0
 * state (a paged pool) gets each row's blocks of 32 quantized as ggml's quantize_row_q8_0, bit for
 * bit on every backend (contracts/kv_scatter.yaml). */
KILN_API kiln_node kiln_kv_scatter(kiln_graph *g, kiln_node state, kiln_node rows, kiln_node pos);
/* Embedding lookup: table [V, D] of a float or block dtype, ids i32 [n] (each < V, checked at run) -> f32 [n, D]. */
KILN_API kiln_node kiln_get_rows(kiln_graph *g, kiln_node table, kiln_node ids);
/* Index of the largest value over the last dim (first on ties): x [..., N] -> i32 [...] ([1] for rank 1). */
KILN_API kiln_node kiln_argmax(kiln_graph *g, kiln_node x);
/* A mixture-of-experts router's weights (llama.cpp's build_moe_ffn with softmax gating): over the
 * last dim of the router logits x f32 [..., E], p = softmax(x); the k experts of largest p (the k
 * largest logits, the lower index first on ties) keep p, every other entry is 0; with norm the kept
 * ones are divided by their sum. 1 <= k <= E. y is f32 [..., E] (rows of dense expert weights). */
KILN_API kiln_node kiln_moe_route(kiln_graph *g, kiln_node x, int k, bool norm);
/* Row r of x times one value of the same row of w: y[.., i] = x[.., i] * w[.., col]. x f32 [..., D],
 * w f32 [..., C] with the same leading dims, 0 <= col < C. y is f32 [..., D] (an expert's output
 * times its routed weight, a shared expert's output times its gate). */
KILN_API kiln_node kiln_scale_rows(kiln_graph *g, kiln_node x, kiln_node w, int col);
/* A mixture-of-experts matmul over only the routed experts (ggml's mul_mat_id). w is a stack of E
 * expert matrices [E, N, K] (any dtype kiln_matmul takes; a block-dtype stack must be a weight);
 * r f32 [T, E] holds the router's weights (kiln_moe_route: at most k nonzero per row). Slot s < k
 * of token t is expert e_s, the s-th largest of r[t, :] (larger first, the lower index on ties, NaN
 * below every number). x f32/f16/bf16 is [T, K] (every slot reads row t) or [T, k, K] (slot s
 * reads x[t, s, :]). Without sum, y is f32 [T, k, N] with y[t, s, :] = x[t, (s), :] . W[e_s]^T;
 * with sum, y is f32 [T, N] = sum over s (in slot order) of r[t, e_s] * x[t, (s), :] . W[e_s]^T.
 * T may be symbolic; 1 <= k <= E. Only the k routed experts' rows of w are read for a token, so
 * a feed-forward of E experts costs k of them. The GPU backends take up to 256 experts with K a
 * multiple of the weight format's 16-byte chunk and refuse other shapes by name (placement then
 * puts it on the cpu). */
KILN_API kiln_node kiln_moe_matmul(kiln_graph *g, kiln_node x, kiln_node w, kiln_node r, int k, bool sum);
/* Sum of x over the devices of a split plan (kiln_compile_options.devices): each device holds a
 * partial sum of the same shape (a row-parallel matmul's output) and every device gets the total.
 * x f32; y has x's shape. In a plan on one device it is the identity. The split pass inserts it;
 * graphs may also hold it. */
KILN_API kiln_node kiln_all_reduce(kiln_graph *g, kiln_node x);
/* The slices of x held by the devices of a split plan, joined along a new leading dim: x f32
 * [...] -> y [devices, ...], device d's x at y[d] (NCCL's all-gather), every device gets y. The
 * split pass inserts it (with a transpose and reshape) where a column-parallel matmul's output is
 * wanted whole (a head split by vocabulary). In a plan on one device y = x as [1, ...]. */
KILN_API kiln_node kiln_all_gather(kiln_graph *g, kiln_node x);
/* Converts among f32, f16, bf16 and i32 (float to i32 rounds to nearest, ties to even). */
KILN_API kiln_node kiln_cast(kiln_graph *g, kiln_node x, kiln_dtype t);
/* Same elements, new dims (element counts equal; symbolic dims must appear in both, unchanged). */
KILN_API kiln_node kiln_reshape(kiln_graph *g, kiln_node x, int rank, const kiln_dim *dims);
/* A contiguous slice of x: `dims` elements starting at element `offset` (constant dims only). */
KILN_API kiln_node kiln_view(kiln_graph *g, kiln_node x, int rank, const kiln_dim *dims, int64_t offset);
/* Swaps dims d0 and d1. */
KILN_API kiln_node kiln_transpose(kiln_graph *g, kiln_node x, int d0, int d1);
/* Joins a and b along `axis` (other dims equal, same dtype). */
KILN_API kiln_node kiln_concat(kiln_graph *g, kiln_node a, kiln_node b, int axis);

/* The graph's hash: XXH3-128 of a canonical serialization of ops, dtypes, shapes, symbol bounds,
 * parameters and topology (not weight bytes, not names). Written as 32 hex digits + NUL. */
KILN_API kiln_status kiln_graph_hash(const kiln_graph *g, char out_hex[33]);

/* ---------------------------------------------------------------- .kg text format */

/* Parses .kg text. On error returns KILN_ERR_PARSE and puts "file:line:col: what is wrong" in
 * kiln_ctx_error(ctx). `file` names the source in messages (may be NULL). */
KILN_API kiln_status kiln_kg_parse(kiln_ctx *ctx, const char *text, const char *file, kiln_graph **out);
/* Reads and parses a .kg file. */
KILN_API kiln_status kiln_kg_load(kiln_ctx *ctx, const char *path, kiln_graph **out);
/* Prints a graph as .kg text into a malloc'ed string the caller frees. */
KILN_API kiln_status kiln_kg_print(const kiln_graph *g, char **out);

/* ---------------------------------------------------------------- compile and run */

typedef struct kiln_plan kiln_plan;

/* Code-generation and launch choices of GPU backends: zero is the default; every field is an
 * int32_t, so the struct has no padding and the kernel caches hash it whole (a new field is in the
 * keys by construction). Fields left at zero take $KILN_GEMM, $KILN_GEMM_BM, $KILN_GRID_CAP,
 * $KILN_VK_DISABLE, $KILN_WGMMA, $KILN_PDL, $KILN_PRECISION and the other variables of docs/env.md when set (docs/env.md). */
enum { KILN_GEMM_AUTO = 0, KILN_GEMM_OFF = -1, KILN_GEMM_ON = 1 };
enum { KILN_FLASH_WG_NO_PINGPONG = 2, KILN_FLASH_WG_PINGPONG = 3 }; /* codegen.flash_wg: the warpgroup kernel without / with its
                                                                   ping-pong whatever the shape (A/B runs) */
enum { KILN_VK_NO_16BIT = 1, KILN_VK_NO_SUBGROUP = 2, KILN_VK_NO_DOT = 4 };
enum { KILN_PREC_EXACT = 0, KILN_PREC_F16 = 1 };
enum { KILN_PDL_NO_PREFETCH = 2, KILN_PDL_REGS = 3 }; /* codegen.pdl's variants beside KILN_GEMM_ON */
enum { KILN_PAGED_MIXED_SIDE = 2, KILN_PAGED_MIXED_ALL = 3 }; /* codegen.paged_mixed's variants beside KILN_GEMM_ON */
typedef struct kiln_codegen_options {
    int32_t gemm;       /* KILN_GEMM_AUTO: matmul regions of more than 8 rows use the tensor-core GEMM;
                           KILN_GEMM_OFF: gemv's passes take every matmul region (A/B runs) */
    int32_t gemm_rows;  /* tokens per GEMM block where a shape takes 128: 0 (128) or 64 (A/B runs) */
    int32_t grid_cap;   /* blocks launched for a grid-stride kernel: 0 as many as the device holds at
                           once; N > 0 at most N; -1 every virtual block (comparisons) */
    int32_t vk_disable; /* vulkan: optional device features not to use (KILN_VK_NO_* bits): the
                           kernels fall back to plain 32-bit stores, shared-memory reductions and
                           byte-wise dot products (tests cover both paths on one device) */
    int32_t wgmma;      /* KILN_GEMM_AUTO/ON: on sm_90 the GEMM of f16/bf16 weights uses the TMA +
                           warpgroup MMA template (H100: 361 vs 149 TFLOP/s at 512 x 12288 x
                           4096, docs/kernels.md); KILN_GEMM_OFF: mma.sync everywhere */
    int32_t pdl;        /* KILN_GEMM_ON: on sm_90 every kernel of a plan is written and launched for
                           programmatic dependent launch (it may start while the previous kernel ends:
                           weight prefetches first, a grid wait before it touches anything a kernel
                           writes); KILN_PDL_NO_PREFETCH (2): the same without the decode gemv's L2
                           prefetch; KILN_PDL_REGS (3): the decode gemv loads its first weight chunks
                           into registers before the wait instead; KILN_GEMM_AUTO/OFF: plain launches.
                           Opt-in until measured */
    int32_t precision;  /* KILN_PREC_EXACT (0): float activations enter the tensor cores as two or three
                           f16/bf16 parts whose sum is their f32 value, so GEMMs and flash attention
                           meet the f32 contracts (NMSE 1e-10); KILN_PREC_F16: as one f16 (bf16 beside
                           bf16 weights) part, as PyTorch and llama.cpp run f16 layers: half the tensor
                           work of f16/bf16-weight GEMMs, NMSE within the contracts' tolerance_f16_act
                           (matmul: 1e-6 f16, 3e-5 bf16). Block weights take one part either way */
    int32_t flash;      /* KILN_GEMM_AUTO/ON: prefill attention's flash kernel takes 128 query rows a block
                           (8 warps), grouped query heads share its K/V tiles, the next tile loads during
                           this one, paged steps of many rows take it too; KILN_GEMM_OFF: the first flash
                           kernel (64 rows of one head, 4 warps) and paged steps on the split-KV
                           kernels (A/B runs, $KILN_FLASH=0) */
    int32_t flash_wg;   /* KILN_GEMM_AUTO/ON: on sm_90 under precision f16, prefill attention over a
                           contiguous f16/bf16 cache of head_dim 64/128/256 takes the warpgroup flash kernel
                           (TMA + wgmma, FlashAttention-3 style), its two consumer warpgroups taking turns
                           at the tensor cores (ping-pong) where the shape gains from it (one query head a
                           kv head, head_dim <= 128: docs/kernels.md); KILN_GEMM_OFF: the mma.sync flash
                           kernel (A/B runs, $KILN_FLASH_WG=0); KILN_FLASH_WG_NO_PINGPONG /
                           KILN_FLASH_WG_PINGPONG: the warpgroup kernel without / with the ping-pong on
                           every shape (A/B runs, $KILN_FLASH_WG=2 / 3) */
    int32_t gemm_cluster; /* sm_90 TMA GEMM of f16/bf16 weights: 2 or 4 blocks of consecutive token rows
                           form a thread block cluster and share each weight tile, every block bringing
                           1/n of it by TMA multicast into all of them (L2 traffic per tile falls from
                           x + W to x + W / n); 0 or 1: no clusters, the default: on the H100 cluster 2
                           measured as fast as none, 4 slower ($KILN_GEMM_CLUSTER, docs/kernels.md) */
    int32_t gemv_pair;  /* KILN_GEMM_ON: the decode gemv of q8_0 and q4_K weights (integer dot products)
                           gives each lane two adjacent 16-byte chunks a step: one scale read and decoded
                           per 32 bytes of quants, each dot a whole 32-value group of x (about half the
                           instructions per weight byte); KILN_GEMM_OFF: one chunk a lane;
                           KILN_GEMM_AUTO: the weight format's decode default (kl_wfmt.gemv_auto in
                           src/codegen/wfmt.c: one chunk a lane until measured otherwise on the H100)
                           ($KILN_GEMV_PAIR=1/0, docs/kernels.md) */
    int32_t gemm_epilogue; /* KILN_GEMM_ON: the sm_90 TMA GEMM runs its epilogue (bias, residual,
                           swiglu, rope, KV writes) on each consumer thread's own accumulators;
                           KILN_GEMM_AUTO/OFF: through a C tile in shared memory drained by every
                           thread, the default (H100: 0-5 us faster a GEMM; $KILN_GEMM_EPILOGUE=1) */
    int32_t gemv_prefetch; /* N in 1..4: the gemv's chunk loop asks L2 (prefetch.global.L2) for the weights
                           of its step N steps ahead at the top of every step, so each warp keeps more
                           than one step's bytes in flight (ptxas issues a step's loads row by row, each
                           after the previous row's arithmetic); 0: none ($KILN_GEMV_PREFETCH). Opt-in
                           until measured */
    int32_t gemv_fence; /* KILN_GEMM_ON: a block-scope fence (PTX fence.acq_rel.cta) after each step's loads in the
                           gemv's chunk loop, which ptxas does not move loads across: all of a step's rows
                           are in flight together (else ptxas may load each row next to its arithmetic);
                           KILN_GEMM_OFF: none; KILN_GEMM_AUTO: the weight format's decode default
                           (kl_wfmt.gemv_auto: none until measured otherwise) ($KILN_GEMV_FENCE=1/0) */
    int32_t attn_cluster; /* KILN_GEMM_ON: on sm_90, decode attention (up to 8 query rows, contiguous cache) is one
                           kernel: the key splits of a query-head group are the blocks of a thread block cluster
                           (up to 8) and combine through distributed shared memory, instead of the split kernel
                           writing partials that kiln_attn_combine reads; KILN_GEMM_AUTO/OFF: the two kernels
                           ($KILN_ATTN_CLUSTER, docs/kernels.md). Opt-in until measured */
    int32_t flash_rows; /* the warpgroup flash kernel's query rows a block: 128 (two consumer warpgroups), 64
                           (one consumer warpgroup, 64-key tiles at head_dim 128, two blocks an SM: twice the
                           blocks for short prompts), or 0: the shape's choice (64 at head_dim 64 where 128-row
                           blocks leave half the SMs idle, else 128; A/B runs, $KILN_FLASH_ROWS=64|128) */
    int32_t flash_split; /* the warpgroup flash kernel's key split: 2 or 4 blocks of a thread block cluster
                           share each query tile's key tiles (taking every 2nd / 4th) and the first block
                           combines their partial results (short prompts: more blocks, shorter walks);
                           1: none; -1: split where the grid leaves SMs idle (the most blocks a cluster whose
                           grid still fits the device at once); 0: the shape's choice (-1's where 128-row blocks
                           leave half the SMs idle, else none; A/B runs, $KILN_FLASH_SPLIT=2|4|1|auto) */
    int32_t gemm_cols;  /* sm_90 TMA GEMM of f16/bf16 weights: columns a block (128, 192 or 256; 0: the
                           shape's choice, docs/kernels.md) where the shape allows it (A/B runs,
                           $KILN_GEMM_BN) */
    int32_t paged_decode; /* KILN_GEMM_AUTO/ON (the default, measured on the H100: device-serve.sh steps):
                           paged attention's split kernels (batched decode over a f16/bf16/f32
                           pool) read each key and value row with 16-byte loads of consecutive lanes (a
                           row's lanes sum q.k by a group reduction), size each row's key splits from its
                           own key count and the step's sequences, and loop over the step's rows (a grid
                           of the sequences' bound, not the token capacity); N in 2..64: the same with a
                           step's splits sized for waves of N one-warp blocks an SM instead of 24 (A/B
                           runs); KILN_GEMM_OFF: a lane a key, splits sized for a sequence's capacity
                           ($KILN_PAGED_DECODE, docs/kernels.md) */
    int32_t decode_kernels; /* KILN_GEMM_AUTO/ON: a prefill-sized plan (more than one token at the bound,
                           as `kiln generate` decodes through its prompt's plan) also gets a decode plan's
                           kernels for runs of one row: a one-row gemv beside each matmul region's gemv of
                           up to 8 rows a pass, and key splits sized for one row beside the 8-row ones in a
                           contiguous cache's attention (those repeat their work for idle rows or leave most
                           blocks idle: 3x the decode step of a Q4_K_M llama-7b on the H100); KILN_GEMM_OFF:
                           the several-row kernels take one-row runs too (A/B runs, $KILN_DECODE_KERNELS=0) */
    int32_t gemv_reduce; /* KILN_GEMM_ON: a gemv whose output rows are split over several warps sums every
                           accumulator's warp totals through one shared array (two barriers a unit) where its
                           shared memory has room; KILN_GEMM_AUTO/OFF: one block reduction per accumulator,
                           two barriers each ($KILN_GEMV_REDUCE=1). Opt-in until measured */
    int32_t gemv_preload; /* KILN_GEMM_ON: the decode gemv loads the weights of each lane's first step
                           (every row of its unit) into registers at its start, before it reads x (the
                           rms_norm and x's quantization then run while those loads are in flight; for
                           qwen2-0.5b's matrices that is every weight a warp reads), as codegen.pdl
                           KILN_PDL_REGS does before its grid wait, without programmatic dependent launch;
                           KILN_GEMM_AUTO/OFF: the first weight loads after x's prologue
                           ($KILN_GEMV_PRELOAD=1, docs/kernels.md). Opt-in until measured */
    int32_t paged_mixed; /* KILN_GEMM_AUTO/ON: in paged attention with both the coalesced split kernels
                           (codegen.paged_decode) and the flash kernel, every step's sequences of at most 4
                           new tokens go to the split kernels and the longer ones to the flash kernel (a
                           mixed step's decoding sequences are no 128-row flash tiles; measured on the
                           H100); KILN_PAGED_MIXED_SIDE: the same, with the flash kernel on a second CUDA
                           stream beside the split kernels; KILN_PAGED_MIXED_ALL: that, and the lane-a-key
                           split kernels (q8_0 pools, more than 4 f16 heads a group) split steps too (both
                           opt-in until timed); KILN_GEMM_OFF: a whole step goes to one or the other, by its
                           rows a sequence on average ($KILN_PAGED_MIXED=0/2/3, docs/kernels.md) */
    int32_t gemv_pipeline; /* KILN_GEMM_ON: the decode gemv's chunk loop loads a lane's next step (every
                           row of its unit) into registers before the arithmetic of the current one, so a
                           warp has two steps of weights in flight (not with gemv_preload or KILN_PDL=3,
                           and without gemv_fence's fence); KILN_GEMM_AUTO/OFF: a step's loads, then its
                           arithmetic ($KILN_GEMV_PIPELINE=1, docs/kernels.md). Opt-in until measured */
    int32_t gemm_persist; /* KILN_GEMM_ON: the sm_90 TMA GEMM of f16/bf16 weights (one group, no cluster) is
                           persistent: one block an SM walks the tiles, its two consumer warpgroups each take
                           whole tiles in turn (ping-pong) and run the epilogue on their own accumulators
                           while the other multiplies; KILN_GEMM_OFF: a block a tile, two consumer
                           warpgroups on one tile, the epilogue after it; KILN_GEMM_AUTO: the default
                           (docs/kernels.md) ($KILN_GEMM_PERSIST=1/0) */
    int32_t gemm_splitk; /* the persistent GEMM (gemm_persist) where its tiles leave most SMs idle (few rows):
                           KILN_GEMM_AUTO/ON: K split over up to 8 blocks a tile, f32 partial sums in the
                           scratch, a second kernel adds them and runs the epilogue; KILN_GEMM_OFF: one block
                           a tile (A/B runs, $KILN_GEMM_SPLITK=0) */
    int32_t gemv_xload; /* KILN_GEMM_ON: the decode gemv's prologue (x's rms_norm, x's quantization for integer
                           dot products) loads a thread's words of x as 16-byte loads all issued at once and the
                           quantization reuses the norm's (one memory round trip where the loops over x took one
                           per iteration: K / 256 for the norm's squares); KILN_GEMM_AUTO/OFF: the loops
                           ($KILN_GEMV_XLOAD=1, docs/kernels.md). Opt-in until measured */
    int32_t gemm_pairs; /* KILN_GEMM_AUTO/ON: the sm_90 TMA GEMM's producer decodes block weights (q8_0, q4_0,
                           q4_1, q5_0, q5_1, q4_K, q5_K, q6_K) straight into f16 pairs (the quant in the f16 1024's mantissa, then two
                           fma.rn.f16x2: no int->float or float->half conversions); KILN_GEMM_OFF: each
                           value decoded in f32 and two rounded to an f16 pair (A/B runs, $KILN_GEMM_PAIRS=0) */
} kiln_codegen_options;

typedef struct kiln_compile_options {
    const char *backend;  /* "auto" (NULL): placement picks per kernel; or "ref", "cpu", "cuda", "vulkan" */
    bool        no_fuse;  /* true: one kernel per op (debugging, fused-vs-unfused tests) */
    bool        what_if;  /* place as if every backend with a device profile were present (cost-model
                             experiments): the plan can be explained, not run (KILN_ERR_UNSUPPORTED) */
    bool        check_finite; /* true: after each kernel, every value it stores (each region output,
                             and the cache rows a kv_scatter writes on the host) is scanned, and a NaN
                             or infinity makes kiln_run return KILN_ERR_NONFINITE naming the first such
                             node (in execution order), the element, its region and backend; later
                             kernels do not run. Inputs and weights are not scanned (their first
                             reader is). Device backends then launch kernel by kernel (no replay of a
                             recording) and copy each region's outputs to the host to scan them.
                             false (the default) costs nothing. */
    kiln_codegen_options codegen; /* see above */
    bool        no_record; /* device backends launch kernel by kernel each run instead of replaying
                             one recording ($KILN_NO_RECORD) */
    const char *devices;  /* tensor parallelism: NULL or "" = one device (as without it). "BACKEND:ID,ID,..."
                             ("cuda:0,1", "cpu:0,1,2,3") or a count ("2", on `backend`): the graph is
                             split Megatron-style over that many devices (q/k/v and gate/up divided by
                             output rows, heads and KV caches by head, GQA groups whole; o and down by
                             input columns, followed by an all_reduce; a head by vocabulary, joined
                             by an all_gather), each group of divided matmuls only where the cost
                             model predicts it faster than replicated (profile link_bw and
                             link_latency_s; $KILN_SPLIT=all: wherever it divides), one part per device, and runs
                             as one plan (kiln_run, states whole to kiln_plan_state_read/_write;
                             kiln_plan_explain names the split). Distinct GPUs ("cuda:0,1"): a context,
                             stream and memory per GPU (weights sliced and uploaded to each at
                             compile), the all-reduces through NCCL on each GPU's stream, each GPU's
                             kernels and NCCL calls recorded together as one CUDA graph per GPU at
                             the second run of each size of the collectives (4 kept; the first runs
                             launch by launch) and replayed
                             (no_record: launched kernel by kernel); without NCCL the compile fails
                             saying why (kiln_multi_gpu); a device fault stops the split plan for
                             good, other plans keep working. Virtual devices: several parts on ref or
                             cpu in one process, or one GPU listed more than once ("cuda:0,0"), the
                             all-reduce summing through host memory (tests, experiments). Outputs and
                             inputs are host memory for a split plan. A graph whose heads, KV heads or reshaped head
                             dims do not divide by the count, or where no matmul can be divided, is
                             refused (KILN_ERR_UNSUPPORTED) naming why. */
} kiln_compile_options;

/* Compiles g into a plan. The plan copies what it needs from g (g may be freed after; borrowed
 * weights must stay). States are allocated and zeroed. opts may be NULL. A graph equal to one
 * compiled before in this context (same structure, options and backends; names, weights and the
 * order of independent builder calls may differ) reuses that plan's fusion, placement and kernels
 * and binds only its own weights and states (kiln_plan_cache says so); GPU kernels also come from
 * the cache folder. Thread-safe for one context's plan cache; the context's error text is shared.
 * A plan whose states and largest intermediate, at the symbols' bounds, exceed the machine's memory
 * is refused before anything is allocated (KILN_ERR_NOMEM, the sizes and the node named); so is a
 * plan whose weights, states and intermediates on a GPU exceed that device's free memory (cuda:
 * cuMemGetInfo; vulkan: its largest device-local heap less what kiln holds there), naming the
 * sizes, the largest weight and the device's memory. The context stays usable either way. */
KILN_API kiln_status kiln_compile(kiln_ctx *ctx, const kiln_graph *g, const kiln_compile_options *opts,
                                  kiln_plan **out);
KILN_API void kiln_plan_free(kiln_plan *p);

/* One binding of a run: an input (data read), an output (data written) or a symbol (value). */
typedef struct kiln_binding {
    const char *name;  /* name of an input, an output, or a symbol */
    void       *data;  /* input: read from; output: written to; NULL for a symbol */
    size_t      bytes; /* size of data: an input must match its shape exactly; an output must hold it */
    int64_t     value; /* the symbol's value */
    bool        device;/* data is device memory of the GPU backend that runs the plan (cuda: a
                          CUdeviceptr cast to void *; vulkan: an address kiln_vk_buffer_register
                          gave, plus a byte offset): inputs are copied device to device and
                          outputs written there, with no host round trip */
} kiln_binding;

/* Runs the plan once. Every symbol and input must be bound; outputs not bound are computed and
 * kept (see kiln_plan_tensor). States persist across runs. On error the plan stays usable. */
KILN_API kiln_status kiln_run(kiln_plan *p, const kiln_binding *b, size_t n);

/* Runs the plan once, ordered on a caller's queue: the step of an inference engine that drives its
 * own GPU queue. What stream is depends on the backend the plan's kernels run on:
 * - cuda: a CUstream of the device kiln's cuda backend uses (its primary context; NULL is the legacy
 *   default stream). A plan whose kernels all run on cuda: the step is ordered after the work
 *   enqueued on stream before the call, and stream waits for the step (events: the host does not
 *   wait), so later work on stream sees the outputs bound as device memory and the updated states.
 *   The plan's recorded CUDA graph replays on kiln's own stream, one per step whatever the batch
 *   composition (symbols and metadata are per-run data). The call returns without waiting when
 *   every input and output is bound as device memory; a host-bound input is copied, and a
 *   host-bound output written, before the call returns (the call then waits for what it needs).
 * - vulkan: a kiln_vk_sync (below; NULL: the step runs as kiln_run does). A plan whose kernels all
 *   run on vulkan: the call enqueues the step on kiln's queue and returns without waiting for the
 *   device. The step starts after the sync's wait semaphores and signals its signal semaphore when
 *   done. Host-bound inputs are copied (to staging memory) at the call: the caller may reuse them as
 *   soon as it returns. Host-bound outputs are written when the step is waited for: by
 *   kiln_plan_wait, or by any later call that waits for the context's vulkan queue (kiln_run,
 *   kiln_plan_read, kiln_plan_state_*, kiln_plan_free); their memory must stay valid, and is not to
 *   be read, until kiln_plan_wait returns. Staging memory of a queued step is sized to what it
 *   copies between host and device: at most 4 x those bytes (each copy rounded up to 16) + 128 KiB
 *   while queued, reused by later steps once it is done (kiln_plan_stats.staging_bytes). Steps
 *   queued before earlier ones are waited for run in call order on the one queue (each sees the states its predecessor wrote); at most
 *   KILN_VK_MAX_PENDING steps of a context wait at once: one more is refused with KILN_ERR_BUSY, and
 *   nothing is enqueued (kiln_plan_wait, then call again). Every call that waits for the queue
 *   (all of the above but kiln_plan_wait, which waits for its own plan's steps only) waits for every
 *   step queued before it, one still waiting for its semaphores included: signal them (or have them
 *   signalled) before such a call on the same thread, or it never returns. kiln_plan_wait blocks the
 *   same way on a gated step queued before the plan's last one.
 *   A plan that mixes host kernels with vulkan ones runs synchronously (the call returns when the
 *   step is done): its device work still waits for the wait semaphores, which must therefore be
 *   signalled by work already submitted or by another thread, and the signal semaphore is signalled
 *   when the step is done.
 * - Any other plan (cpu, ref, or one mixing the host with cuda): runs as kiln_run does and returns
 *   when done; stream is not used.
 * Errors found before enqueueing (bindings, symbols, host-bound paged metadata, a bad kiln_vk_sync)
 * are returned and nothing runs; a fault of the device surfaces at the plan's next run, wait or
 * read. Metadata bound as device memory is not checked by kiln (the GPU kernels clamp every index
 * into its buffer). A plan is used by one thread at a time, as with kiln_run; device buffers bound
 * here must stay valid until stream has passed the step. */
KILN_API kiln_status kiln_run_async(kiln_plan *p, const kiln_binding *b, size_t n, void *stream);

/* Waits until the steps kiln_run_async queued for this plan are done, and writes their host-bound
 * outputs. Returns the device's fault if one happened (the plan stays usable unless the device is
 * lost). A plan with nothing queued returns KILN_OK at once; so does a plan of host kernels.
 * vulkan: only the plan's own steps are waited for, and, the queue running in call order, the steps
 * of other plans queued before its last one (their outputs are written too); steps queued after it
 * (another plan's, perhaps still gated by its semaphores) are not. cuda: the whole kiln stream.
 * Used by one thread at a time, as the plan's runs are. */
KILN_API kiln_status kiln_plan_wait(kiln_plan *p);

/* Vulkan queue interop, the `stream` of kiln_run_async for a plan that runs on vulkan. Semaphores are
 * Vulkan handles (VkSemaphore as a uint64_t) created on kiln's own device (kiln_ctx_vulkan): kiln
 * cannot check that a handle is a live semaphore of that device (the validation layers can). A wait
 * semaphore may be binary (its value 0; a signal operation for it must be submitted before the
 * call, as Vulkan requires) or timeline (its value: the step starts once the semaphore reaches it,
 * and the value may be signalled later, from the host or another queue). Timeline values need a
 * device with timeline semaphores (kiln_vk_device.timeline; Vulkan 1.2 and lavapipe have them),
 * else the sync is refused (KILN_ERR_UNSUPPORTED). Without timeline semaphores kiln tracks its steps
 * with fences: everything but timeline values works the same. */
#define KILN_VK_SYNC_MAGIC 0x6b766b31u /* "kvk1": kiln_vk_sync.magic */
#define KILN_VK_SYNC_MAX_WAIT 8         /* most wait semaphores of one step */
#define KILN_VK_MAX_PENDING 8           /* most kiln_run_async steps of a context not yet waited for */
typedef struct kiln_vk_sync {
    uint32_t        magic;        /* KILN_VK_SYNC_MAGIC; anything else (a CUstream passed by mistake) is
                                     refused with KILN_ERR_INVALID_ARG */
    uint32_t        n_wait;       /* wait semaphores, 0..KILN_VK_SYNC_MAX_WAIT */
    const uint64_t *wait;         /* n_wait VkSemaphore handles (none 0); NULL when n_wait is 0 */
    const uint64_t *wait_value;   /* n_wait values: a timeline semaphore's value to wait for, 0 for a
                                     binary semaphore; NULL: every wait semaphore is binary */
    uint64_t        signal;       /* a VkSemaphore signalled when the step's work (its output copies
                                     included) is done, or 0 for none */
    uint64_t        signal_value; /* signal is a timeline semaphore: the value it is set to (above its
                                     current value); 0: signal is a binary semaphore */
} kiln_vk_sync;

/* The Vulkan objects kiln's vulkan backend drives in ctx, for a caller that shares the device: to
 * create the semaphores of kiln_vk_sync, and buffers of its own. The queue is kiln's only queue:
 * Vulkan requires a queue's use to be externally synchronized, so a caller submits to it only while
 * no kiln call on this context runs on another thread (kiln_vk_queue_lock). Handles stay valid until
 * kiln_ctx_free. KILN_ERR_UNSUPPORTED when the context has no vulkan backend (the message says why). */
typedef struct kiln_vk_device {
    void    *instance;        /* VkInstance (one per process, never destroyed) */
    void    *physical_device; /* VkPhysicalDevice */
    void    *device;          /* VkDevice */
    void    *queue;           /* VkQueue kiln submits to */
    uint32_t queue_family;    /* the queue's family index */
    uint32_t api_version;     /* the device's Vulkan version (VK_MAKE_API_VERSION) */
    bool     timeline;        /* timeline semaphores are enabled on the device */
} kiln_vk_device;
KILN_API kiln_status kiln_ctx_vulkan(kiln_ctx *ctx, kiln_vk_device *out);
/* Takes (lock) or gives back kiln's hold on its vulkan queue in ctx, the lock kiln's own calls on the
 * context take: a caller that submits to kiln_vk_device.queue from its own threads holds it around
 * vkQueueSubmit (and vkQueueWaitIdle). Recursive: kiln calls on the holding thread go on. Nothing
 * when the context has no vulkan backend. */
KILN_API void kiln_vk_queue_lock(kiln_ctx *ctx, bool lock);

/* Registers a VkBuffer of the caller's (made on kiln's device, kiln_ctx_vulkan, with usage
 * TRANSFER_SRC and TRANSFER_DST, its memory bound) so that it can be bound as device memory: *addr
 * plus a byte offset is a kiln_binding's data with device = true, on a plan that runs on vulkan. An
 * input is copied from it, an output into it, on the device and in the step's order (with
 * kiln_run_async the signal semaphore covers those copies, so the caller needs no kiln_plan_wait to
 * use them). A range beyond `bytes` is refused at the run. The buffer stays the caller's: kiln
 * never frees it. kiln_vk_buffer_unregister waits for kiln's work on the context's queue, then
 * forgets it (its address is refused after): call it before destroying the buffer. Thread-safe
 * like kiln_run. KILN_ERR_UNSUPPORTED without a vulkan backend; KILN_ERR_INVALID_ARG for a NULL
 * buffer, zero bytes or an address that is not a registered buffer's. */
KILN_API kiln_status kiln_vk_buffer_register(kiln_ctx *ctx, uint64_t buffer, uint64_t bytes, void **addr);
KILN_API kiln_status kiln_vk_buffer_unregister(kiln_ctx *ctx, void *addr);

typedef struct kiln_tensor_info {
    kiln_dtype t;                  /* dtype */
    int        rank;               /* number of dims */
    int64_t    dims[KILN_MAX_RANK]; /* dims as of the last run (symbols resolved) or their bound before any */
    size_t     bytes;              /* bytes of the tensor with these dims */
} kiln_tensor_info;
/* Shape of an input, output or state by name. */
KILN_API kiln_status kiln_plan_tensor(const kiln_plan *p, const char *name, kiln_tensor_info *out);
/* Copies the last run's value of an output into dst (bytes >= its size). */
KILN_API kiln_status kiln_plan_read(const kiln_plan *p, const char *name, void *dst, size_t bytes);
/* Copies a state out of / into the plan (bytes == the state's size). */
KILN_API kiln_status kiln_plan_state_read(const kiln_plan *p, const char *name, void *dst, size_t bytes);
KILN_API kiln_status kiln_plan_state_write(kiln_plan *p, const char *name, const void *src, size_t bytes);

/* Backend the plan runs on, and its number of kernels (fused regions). */
KILN_API const char *kiln_plan_backend(const kiln_plan *p);
KILN_API int kiln_plan_kernel_count(const kiln_plan *p);

/* ---------------------------------------------------------------- conformance check */

/* kiln_check runs every op x dtype on every available backend (or one) against kiln's f64
 * reference evaluator: at least 40 shapes per op x dtype (1, odd, prime, large, symbolic dims at
 * several values; 12 in quick mode) on fresh random data (never zeros; wide ranges for
 * activations), outputs poisoned (NaN bytes) before each run and guarded by 64 bytes each side
 * that must come back untouched. A case passes when no output holds a NaN, infinities match the
 * reference's in sign, and the NMSE is within the tolerance of the op's contract
 * (contracts/<op>.yaml, read at run time: $KILN_SOURCE_DIR/contracts, else the build's source
 * tree, else <prefix>/share/kiln/contracts). It also checks fused patterns and preset decode and
 * prefill layers against the reference, fused against unfused, and determinism (one plan run 10
 * times gives bit-identical outputs). New backends take part as soon as kiln_backend_get reports
 * them available. */
struct kiln_check_result; /* one row of the report, below */
typedef struct kiln_check_options {
    const char *backend; /* NULL: every available backend; else one name ("cpu") */
    const char *op;      /* NULL: everything; else one op ("matmul") or group ("fused", "preset",
                            "determinism") */
    bool        quick;   /* 12 shapes per op x dtype and a small preset layer (for CI). Vulkan compiles
                            every case's kernels (seconds each on lavapipe): named with `backend` it
                            runs one small case per op x dtype (no fused patterns or presets); not
                            named, a Vulkan device that is a CPU (lavapipe) is skipped (report.note) */
    uint64_t    seed;    /* data seed; 0 = from the clock (the report says which) */
    void      (*on_result)(const struct kiln_check_result *res, void *user); /* NULL, or called on the
                            calling thread as each result row is complete (to stream a report) */
    void       *user;    /* passed to on_result */
} kiln_check_options;

typedef struct kiln_check_result {
    char   op[48];       /* op, or "fused:<pattern>", "unfused:<pattern>", "fused-vs-unfused:<pattern>",
                            "preset:<layer>", "determinism:<layer>" */
    char   dtype[8];     /* the contract's tolerance key dtype ("f32", "q4_k", ...) */
    char   backend[16];  /* backend name */
    int    cases;        /* runs compared */
    double worst_nmse;   /* largest NMSE seen (infinity when a NaN/guard/status failure occurred) */
    double tolerance;    /* the NMSE bound */
    bool   ok;           /* every case passed */
    char   detail[256];  /* why the worst failing case failed ("" when ok): case, element, values, seed */
} kiln_check_result;

typedef struct kiln_check_report {
    bool               ok;        /* every result ok (and at least one ran) */
    uint64_t           seed;      /* the data seed used (replay with options.seed) */
    double             seconds;   /* wall time */
    int                n_results; /* entries in results */
    kiln_check_result *results;   /* one per (op, dtype, backend), in the order run */
    char               note[256]; /* what the run left out and why ("" when nothing) */
} kiln_check_report;

/* Runs the check. Returns KILN_OK when the check ran (read report->ok for the verdict), or an
 * error (unknown backend/op: KILN_ERR_INVALID_ARG; a missing contract: KILN_ERR_IO) with the
 * detail in kiln_ctx_error(ctx). *out is freed with kiln_check_report_free. Uses ctx's backends;
 * not to be called on ctx from two threads at once. */
KILN_API kiln_status kiln_check(kiln_ctx *ctx, const kiln_check_options *opts, kiln_check_report **out);
KILN_API void kiln_check_report_free(kiln_check_report *r);
/* The report as JSON: {"ok": bool, "seed": the data seed, "seconds", "note": "...", "results":
 * [{"op", "dtype", "backend", "cases", "worst_nmse" (1e999 for infinity), "tolerance", "ok",
 * "detail" (why the worst case failed, "" when ok)}]} (malloc'ed; the caller frees). */
KILN_API kiln_status kiln_check_report_json(const kiln_check_report *r, char **out);

/* ---------------------------------------------------------------- cost model and placement */

#define KILN_MAX_BACKENDS 8 /* size of per-backend arrays below (index = kiln_backend_get's i) */

/* What placement knows of a device. Seconds, bytes/s, FLOP/s. A value of 0 means "unknown". */
typedef struct kiln_device_profile {
    double peak_flops[KILN_DTYPE_COUNT]; /* matmul FLOP/s with weights of each dtype */
    double mem_bw;                       /* device memory read bandwidth */
    double launch_s;                     /* fixed cost of one kernel launch */
    double h2d_bw;                       /* host -> device bytes/s (0: the device uses host memory) */
    double d2h_bw;                       /* device -> host bytes/s */
    double xfer_latency_s;               /* fixed cost of one transfer */
    double link_bw;                      /* all-reduce bus bytes/s between devices of a split plan (NCCL's
                                            busbw; 0: the sum goes through this device's memory) */
    double link_latency_s;               /* fixed cost of one all-reduce */
} kiln_device_profile;

/* The profile placement uses for a backend (defaults, then the calibration file in the cache dir,
 * then kiln_ctx_load_profile overrides). */
KILN_API kiln_status kiln_ctx_profile(const kiln_ctx *ctx, const char *backend, kiln_device_profile *out);
KILN_API kiln_status kiln_ctx_set_profile(kiln_ctx *ctx, const char *backend, const kiln_device_profile *p);
/* Overrides profile fields from a JSON file: {"cpu": {"mem_bw": 4e10, "peak_flops": {"f32": 1e11},
 * "launch_s": 2e-6}, "cuda": {...}}. Unknown keys are errors naming the key. */
KILN_API kiln_status kiln_ctx_load_profile(kiln_ctx *ctx, const char *path);
/* Measures the profiles of the present backends (CPU: read bandwidth and FMA peak; with two or
 * more GPUs and NCCL, the cuda profile's link_latency_s and link_bw from timed all-reduces, else
 * those stay as they were) and, when save is true, stores them in the cache dir, where later
 * contexts find them. */
KILN_API kiln_status kiln_calibrate(kiln_ctx *ctx, bool save);
/* Pins a node to a backend for placement ("ref", "cpu", ...; NULL clears). Not part of the hash. */
KILN_API kiln_status kiln_pin(kiln_graph *g, kiln_node x, const char *backend);

typedef struct kiln_region_info {
    const char *kind;                           /* "matmul", "attention", "rows", "map", "scatter", "move" */
    const char *backend;                        /* where it runs */
    char        ops[256];                       /* fused ops, e.g. "rms_norm + matmul x3 + rope x2 + kv_scatter x2" */
    char        anchor[64];                     /* name (or #id) of the anchor node */
    double      flops;                          /* FLOPs at the plan's current dims */
    double      bytes;                          /* bytes read and written at the current dims */
    double      predicted_s[KILN_MAX_BACKENDS]; /* predicted time per backend; < 0: cannot run there */
    double      transfer_s;                     /* predicted transfers into the chosen backend */
    bool        compute_bound;                  /* on the chosen backend: flops/peak > bytes/bw */
    double      measured_s;                     /* mean measured time (kiln_plan_profile on), else 0 */
    int         n_measured;                     /* runs measured */
} kiln_region_info;

KILN_API kiln_status kiln_plan_region(const kiln_plan *p, int i, kiln_region_info *out);
/* Turns per-kernel timing on or off for later runs (adds a clock read around each kernel). */
KILN_API kiln_status kiln_plan_profile(kiln_plan *p, bool on);
/* The plan explained: format "text" (a table for people), "json" or "dot" (Graphviz of the fused
 * graph). Returns a malloc'ed string the caller frees. */
KILN_API kiln_status kiln_plan_explain(const kiln_plan *p, const char *format, char **out);
/* Milliseconds kiln_compile took for this plan, and the peak bytes of intermediates. */
KILN_API double kiln_plan_compile_ms(const kiln_plan *p);
/* Where the plan's compiled code came from: "memory" (an equal graph was compiled in this context:
 * fusion, placement and kernels shared, only weights and states set up), "disk" (every kernel
 * loaded from the cache folder), "partial" (some), or "miss" (compiled). Static text. */
KILN_API const char *kiln_plan_cache(const kiln_plan *p);
KILN_API size_t kiln_plan_peak_bytes(const kiln_plan *p);

/* What the plan's runs did since it was compiled (counts and host seconds, summed over runs): where a
 * step's time goes (`kiln generate --profile`). A split plan (compile option devices) counts its runs,
 * their whole time in wait_s. Not to be called while the plan runs on another thread. */
typedef struct kiln_plan_stats {
    int64_t runs;       /* kiln_run / kiln_run_async calls that completed */
    int64_t recordings; /* whole-plan recordings made (a CUDA graph captured, a command buffer recorded):
                           one per set of launched kernels the plan meets, KILN_RECS kept */
    int64_t replays;    /* runs that replayed a recording */
    int64_t launches;   /* regions launched one by one (host backends, profiling, or plans that do not record) */
    double  bind_s;     /* host time matching bindings, checking inputs, resolving dims */
    double  submit_s;   /* host time uploading inputs and launching, recording or replaying */
    double  wait_s;     /* host time reading outputs back and waiting for the devices */
    uint64_t staging_bytes; /* now, not summed: host-visible staging memory held by the plan's device
                               backends in its context (vulkan: the synchronous runs' buffer, queued
                               steps' buffers and up to 4 kept for reuse), 0 for host plans */
} kiln_plan_stats;
KILN_API kiln_status kiln_plan_stats_get(const kiln_plan *p, kiln_plan_stats *out);

/* ---------------------------------------------------------------- model presets */

/* Built-in shapes of well-known llama-style models ("qwen2-0.5b", "llama-7b", "qwen2-7b"; "llama-70b" by name only) and a
 * builder of an N-layer decoder stack with reproducible random weights: benchmarks and cost-model
 * experiments without a model file (the graphs of `kiln bench --preset` and `kiln plan --preset`). */

/* Name of preset i (0, 1, ...); NULL past the end. Static text. Thread-safe. */
KILN_API const char *kiln_preset_name(int i);

typedef struct kiln_preset_options {
    kiln_dtype wdtype;   /* matmul weight dtype (default f32). A block dtype whose block does not divide
                            a matmul's input width falls back to q8_0 (or f16) for that matmul, as GGUF
                            converters do. Norm weights and biases stay f32. */
    int        n_layers; /* decoder layers; 0 = 1 */
    int64_t    max_ctx;  /* KV-cache rows, bound of symbol n_kv; 0 = 1024 */
    int64_t    max_tok;  /* bound of symbol n_tok; 0 = 1 (decode) */
    uint64_t   seed;     /* seed of the random weights; 0 = 1 */
} kiln_preset_options;

/* Builds preset `name`'s decoder stack. Interface: symbols `n_tok`, `n_kv`; inputs `x` f32
 * [n_tok, hidden] and `pos` i32 [n_tok] (positions n_kv - n_tok .. n_kv - 1); states `k<L>`, `v<L>`
 * [n_kv_head, max_ctx, head_dim] (f32 with f32 weights, else f16); output `y` f32 [n_tok, hidden].
 * Per layer: rms_norm, q/k/v (+ f32 biases for qwen2), rope, kv_scatter, attention over n_kv, o,
 * residual add, rms_norm, gate/up, swiglu, down, residual add. An unknown name is KILN_ERR_NAME
 * (the message lists the presets). Errors go to kiln_ctx_error(ctx) (ctx may be NULL: no message);
 * opts may be NULL. *out is NULL on error; free the graph with kiln_graph_free. Thread-safe. */
KILN_API kiln_status kiln_preset_graph(kiln_ctx *ctx, const char *name, const kiln_preset_options *opts,
                                       kiln_graph **out);

/* ---------------------------------------------------------------- GGUF files and models */

/* A GGUF file (v2 or v3) mapped read-only: its metadata key-values, and its tensors by name.
 * Tensor data is used in place (borrowed by the model builder), so the file must stay open while
 * any graph or plan built from it is alive. Every malformed file is an error naming the byte
 * offset and the field, never a crash. The context must outlive the file; errors of every call
 * below go to kiln_ctx_error(ctx) of the context it was opened with. */
typedef struct kiln_gguf kiln_gguf;

typedef enum kiln_gguf_type { /* GGUF metadata value types, numbered as in the file */
    KILN_GGUF_U8 = 0,
    KILN_GGUF_I8,
    KILN_GGUF_U16,
    KILN_GGUF_I16,
    KILN_GGUF_U32,
    KILN_GGUF_I32,
    KILN_GGUF_F32,
    KILN_GGUF_BOOL,
    KILN_GGUF_STRING,
    KILN_GGUF_ARRAY,
    KILN_GGUF_U64,
    KILN_GGUF_I64,
    KILN_GGUF_F64,
    KILN_GGUF_TYPE_COUNT
} kiln_gguf_type;

/* "u32", "string", "array", ...; "?" out of range. */
KILN_API const char *kiln_gguf_type_name(kiln_gguf_type t);
/* Opens and parses the file at path (mmap). Errors: KILN_ERR_IO (cannot open/map), KILN_ERR_PARSE
 * (malformed: "FILE: byte N: FIELD: what"), KILN_ERR_NOMEM. *out is NULL on error.
 * A split GGUF (split.count > 1, as llama-gguf-split and the converters write large models) is
 * opened by its first part, NAME-00001-of-0000N.gguf: every other part is opened from the same
 * folder by llama.cpp's naming, checked (split.no, split.count, split.tensors.count, no tensor in
 * two parts, metadata that does not contradict the first part's) and its tensors join the first
 * part's table; metadata is the first part's (as in llama.cpp). A missing part is KILN_ERR_IO naming
 * it; a later part opened alone, or parts that disagree, KILN_ERR_PARSE. */
KILN_API kiln_status kiln_gguf_open(kiln_ctx *ctx, const char *path, kiln_gguf **out);
/* Same over a caller's buffer (borrowed: it must outlive the file; 8-byte aligned when the file
 * holds tensors, else KILN_ERR_INVALID_ARG, because tensor data is used in place). For tests and
 * fuzzing. A file whose general.alignment is not a multiple of 8 is refused (KILN_ERR_PARSE), as
 * the format requires. A part of a split GGUF is refused (KILN_ERR_UNSUPPORTED): its other parts
 * can only be found by path. */
KILN_API kiln_status kiln_gguf_open_memory(kiln_ctx *ctx, const void *data, size_t bytes, kiln_gguf **out);
/* Unmaps and frees; NULL does nothing. */
KILN_API void kiln_gguf_close(kiln_gguf *f);
/* Format version (2 or 3), data alignment, and the file's size in bytes. */
KILN_API uint32_t kiln_gguf_version(const kiln_gguf *f);
KILN_API uint32_t kiln_gguf_alignment(const kiln_gguf *f);
KILN_API size_t kiln_gguf_size(const kiln_gguf *f); /* a split GGUF: of every part */
/* Files the model was read from: 1, or a split GGUF's part count. */
KILN_API int kiln_gguf_part_count(const kiln_gguf *f);

/* Metadata, by index (0 .. count-1, file order) or by key. */
KILN_API int64_t kiln_gguf_kv_count(const kiln_gguf *f);
/* Key of entry i (NUL-terminated, valid while f is open); NULL out of range. */
KILN_API const char *kiln_gguf_kv_key(const kiln_gguf *f, int64_t i);
/* Index of a key, or -1. */
KILN_API int64_t kiln_gguf_kv_find(const kiln_gguf *f, const char *key);
/* Value type of entry i (KILN_GGUF_TYPE_COUNT out of range). */
KILN_API kiln_gguf_type kiln_gguf_kv_type(const kiln_gguf *f, int64_t i);

/* Scalar getters by key. A missing key is KILN_ERR_NAME; a value of another kind KILN_ERR_DTYPE.
 * Integer getters take any integer type whose value fits the result (else KILN_ERR_SHAPE);
 * get_f32/get_f64 take f32 or f64; get_bool takes bool. *out is left alone on error. */
KILN_API kiln_status kiln_gguf_get_u32(const kiln_gguf *f, const char *key, uint32_t *out);
KILN_API kiln_status kiln_gguf_get_i32(const kiln_gguf *f, const char *key, int32_t *out);
KILN_API kiln_status kiln_gguf_get_u64(const kiln_gguf *f, const char *key, uint64_t *out);
KILN_API kiln_status kiln_gguf_get_i64(const kiln_gguf *f, const char *key, int64_t *out);
KILN_API kiln_status kiln_gguf_get_f32(const kiln_gguf *f, const char *key, float *out);
KILN_API kiln_status kiln_gguf_get_f64(const kiln_gguf *f, const char *key, double *out);
KILN_API kiln_status kiln_gguf_get_bool(const kiln_gguf *f, const char *key, bool *out);
/* A string value, NUL-terminated (valid while f is open); *len (may be NULL) its byte length. */
KILN_API kiln_status kiln_gguf_get_str(const kiln_gguf *f, const char *key, const char **out, size_t *len);
/* An array: element type and count; *data (may be NULL) points at the elements in the file,
 * little-endian and possibly unaligned (copy with memcpy); NULL for arrays of strings. */
KILN_API kiln_status kiln_gguf_get_arr(const kiln_gguf *f, const char *key, kiln_gguf_type *elem, uint64_t *n,
                                       const void **data);
/* Element i of an array of strings: bytes (not NUL-terminated, valid while f is open) and length. */
KILN_API kiln_status kiln_gguf_get_arr_str(const kiln_gguf *f, const char *key, uint64_t i, const char **out,
                                           size_t *len);

/* A tensor as kiln sees it. */
typedef struct kiln_gguf_tensor {
    const char *name;              /* valid while f is open */
    uint32_t    ggml_type;         /* type id in the file */
    const char *type_name;         /* "q4_K", "f16", ... ("?" for an id kiln does not know) */
    kiln_dtype  t;                 /* kiln dtype, or KILN_DTYPE_COUNT when kiln has none */
    int         rank;              /* dims */
    int64_t     dims[KILN_MAX_RANK]; /* kiln order, outermost first (GGUF lists ne[0] = row length first) */
    const void *data;              /* the bytes in the mapping */
    size_t      bytes;             /* their size */
    uint64_t    offset;            /* absolute byte offset of the data in its file (a split GGUF: its part) */
    int         part;              /* split GGUF: the part holding the data (0: the first file) */
} kiln_gguf_tensor;

KILN_API int64_t kiln_gguf_tensor_count(const kiln_gguf *f);
/* Tensor i in file order, whatever its type (for listings); KILN_ERR_INVALID_ARG out of range. */
KILN_API kiln_status kiln_gguf_tensor_at(const kiln_gguf *f, int64_t i, kiln_gguf_tensor *out);
/* Tensor by name, for use: KILN_ERR_NAME when missing, KILN_ERR_UNSUPPORTED (naming the tensor and
 * its type) when kiln has no dtype for it. */
KILN_API kiln_status kiln_gguf_tensor_get(const kiln_gguf *f, const char *name, kiln_gguf_tensor *out);

/* What kiln_model_build reads from a file's metadata. */
typedef struct kiln_model_info {
    char           arch[32];    /* general.architecture: "llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
                                   "phi3" */
    int            n_layer;     /* {arch}.block_count */
    int64_t        hidden;      /* {arch}.embedding_length */
    int64_t        n_head;      /* {arch}.attention.head_count */
    int64_t        n_kv_head;   /* {arch}.attention.head_count_kv (default n_head) */
    int64_t        head_dim;    /* {arch}.attention.key_length, else hidden / n_head */
    int64_t        ffn;         /* {arch}.feed_forward_length */
    int64_t        n_vocab;     /* rows of token_embd.weight */
    int64_t        n_ctx_train; /* {arch}.context_length */
    float          theta;       /* {arch}.rope.freq_base (default 10000) */
    float          eps;         /* {arch}.attention.layer_norm_rms_epsilon */
    kiln_rope_mode rope;        /* NORMAL for llama, NEOX for qwen2, qwen3, gemma, gemma2, gemma3, phi3 */
    bool           qkv_bias;    /* q/k/v biases present (qwen2; optional in llama) */
    bool           tied_output; /* no output.weight: the head reuses token_embd.weight */
    size_t         weight_bytes; /* bytes of all tensors the graph reads */
    bool           out_bias;    /* attn_output.bias present (added after the output projection) */
    bool           ffn_bias;    /* ffn_gate/ffn_up/ffn_down biases present (any of the three) */
    bool           qk_norm;     /* per-head rms norms of q and k before rope (qwen3) */
    float          rope_scale;  /* linear rotary scaling factor: every angle divided by it (1: none) */
    bool           rope_freqs;  /* rope_freqs.weight: a rotary frequency factor per pair (llama 3.1+) */
    int64_t        sliding_window; /* {arch}.attention.sliding_window (gemma 2: default 4096; 0: none): a
                                      query sees the keys less than this many positions back, on the
                                      layers swa_pattern picks (kiln_attention_ext's window) */
    float          attn_softcap;   /* attention logit soft-cap, {arch}.attn_logit_softcapping (gemma 2:
                                      default 50); 0: none */
    float          final_softcap;  /* final-logit soft-cap, {arch}.final_logit_softcapping (gemma 2:
                                      default 30): logits = cap * tanh(logits / cap); 0: none */
    int            swa_pattern;    /* > 0: only layers l with l % swa_pattern < swa_pattern - 1 use the
                                      window (gemma 2: 2, gemma 3: 6); 0: every layer (mistral, phi3) */
    float          swa_theta;      /* rotary base of the window layers (gemma 3: 10000, unscaled; or the file's
                                      rope.freq_base_swa); 0: theta (gemma 2's rotate as its global layers) */
    float          attn_scale;     /* score scale: 1/sqrt(head_dim), or llama.cpp's gemma 27B rule
                                      1/sqrt(hidden / n_head) (46-layer gemma 2, 62-layer gemma 3) */
    bool           embd_scale;     /* token embeddings times sqrt(hidden) (gemma) */
    bool           post_norms;     /* rms norms of the attention and feed-forward outputs before their
                                      residual adds (gemma 2/3: post_attention_norm, post_ffw_norm) */
    bool           gelu_gate;      /* gelu_tanh(gate) * up instead of silu(gate) * up (gemma) */
    bool           fused_qkv;      /* q/k/v in one attn_qkv matrix, gate/up in one ffn_up (phi3) */
    int64_t        n_rot;          /* {arch}.rope.dimension_count (default head_dim): rotary dims of each
                                      head, the rest passed through (kiln_rope_partial; Phi-4-mini 96 of 128) */
    bool           longrope;       /* rope_factors_long/short.weight (phi3 longrope: Phi-3.5-mini, Phi-4-mini):
                                      a factor per rotated pair dividing its angle, the long ones when
                                      the plan's max_ctx exceeds n_ctx_orig (llama.cpp's choice by n_ctx) */
    int64_t        n_ctx_orig;     /* {arch}.rope.scaling.original_context_length (default n_ctx_train) */
    float          rope_attn_factor; /* {arch}.rope.scaling.attn_factor (phi3; default 1): the rotated dims of
                                      q and k times it (llama.cpp's rope mscale), so those dims' share of
                                      each score times its square; with yarn, times llama.cpp's yarn mscale
                                      1 + 0.1 ln(rope_scale) when rope_scale > 1) */
    bool           yarn;           /* {arch}.rope.scaling.type "yarn" (llama, qwen2, qwen3: Qwen2.5/Qwen3 long-context
                                      files): pair i's angle times s + (1 - s) * ramp_i, s = 1 / rope_scale, ramp_i
                                      llama.cpp's rope_yarn_ramp over ggml_rope_yarn_corr_dims(n_rot, n_ctx_orig,
                                      theta, yarn_beta_fast, yarn_beta_slow); the rotated dims times the mscale above */
    float          yarn_beta_fast; /* 32: llama.cpp's default (these architectures read no key for it) */
    float          yarn_beta_slow; /* 1 */
    int64_t        n_expert;       /* {arch}.expert_count: experts of each mixture-of-experts feed-forward (llama
                                      with experts: Mixtral; qwen2moe, qwen3moe); 0: a dense feed-forward */
    int64_t        n_expert_used;  /* {arch}.expert_used_count: experts routed per token */
    int64_t        ffn_exp;        /* one expert's width: {arch}.expert_feed_forward_length (qwen MoE; default
                                      ffn / n_expert_used), ffn for llama */
    int64_t        ffn_shexp;      /* the shared expert's width (qwen2moe: {arch}.expert_shared_feed_forward_length,
                                      default ffn); 0: no shared expert */
    bool           expert_norm;    /* the routed weights divided by their sum (llama, qwen3moe; not qwen2moe) */
} kiln_model_info;

/* Reads and checks a file's model metadata and every tensor the graph needs. A file is either
 * computed exactly as its architecture defines or refused, never run approximately:
 * - KILN_ERR_UNSUPPORTED for another architecture; a tensor the graph would not use (named); a
 *   metadata key under "<arch>." that kiln does not know, or one naming a feature it does not
 *   build at a value that turns the feature on (mixture of experts, rotary scaling types other
 *   than none and linear, soft-capping outside gemma, ...; named with its value); rotary dims that
 *   are odd or above the head size; phi3 longrope (its rope_factors_long/short tensors, named); a tensor type kiln has no
 *   dtype for (named with the type);
 * - KILN_ERR_NAME for a missing key (including {arch}.attention.layer_norm_rms_epsilon, which
 *   llama.cpp requires too) or tensor; KILN_ERR_SHAPE for inconsistent sizes. */
KILN_API kiln_status kiln_model_info_get(const kiln_gguf *f, kiln_model_info *out);

typedef struct kiln_model_options {
    int64_t    max_ctx;  /* KV-cache rows, bound of symbol n_kv; 0 = min(context_length, 4096) */
    int64_t    max_tok;  /* bound of symbol n_tok; 0 = min(max_ctx, 512) */
    kiln_dtype kv_dtype; /* KV-cache dtype: f32 (default, 0) or f16 */
    int        n_layers; /* layers to build; 0 = all (fewer: tests, benchmarks) */
    bool       logits;   /* also output "logits" f32 [n_tok, n_vocab] ([1, n_vocab] with last_only) */
    bool       last_only; /* the output head runs on one token: input `last` i32 [1] (bind n_tok - 1)
                             picks it; `next` is then [1]. Saves the head's work on prefill. */
    bool       moe_dense; /* mixture-of-experts layers run every expert on every token, each times its
                             routed weight (0 when not routed): the same sum as the default, which runs
                             only the routed experts (kiln_moe_matmul); for tests and A/B runs */
} kiln_model_options;

/* Builds the decoder graph of a llama, qwen2, qwen3, gemma, gemma2, gemma3 or phi3 file. Interface: symbols `n_tok`, `n_kv`; inputs
 * `ids` i32 [n_tok] (token ids) and `pos` i32 [n_tok] (positions, n_kv - n_tok .. n_kv - 1);
 * states `k<L>`, `v<L>` [n_kv_head, max_ctx, head_dim]; output `next` i32 [n_tok] (argmax of
 * each token's logits) and, with opts->logits, `logits`. Weights are borrowed from the mapping:
 * f must outlive the graph and every plan compiled from it. opts may be NULL. */
KILN_API kiln_status kiln_model_build(const kiln_gguf *f, const kiln_model_options *opts, kiln_graph **out);

#ifdef __cplusplus
}
#endif
