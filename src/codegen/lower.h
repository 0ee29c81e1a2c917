/* Helpers shared by the lowerings (src/codegen/lower_*.c): dims as kir values, typed element
 * loads/stores, elementwise math (exp, silu, gelu, sin/cos with range reduction), and the
 * per-element expression evaluator for fused prologues/epilogues. Internal to src/codegen. */
#pragma once

#include "codegen/kir.h"

#include <stdio.h>

#define KL_MEMO 96 /* values memoized per element evaluation */

/* Per-element evaluation of a region's elementwise nodes. */
typedef struct kl_eval {
    kiln_kir          *k;      /* kernel being written */
    const kiln_graph  *g;      /* graph */
    const kiln_region *r;      /* region */
    uint32_t           idx;    /* I32: flat element index in the space of `space` */
    uint32_t           space;  /* node whose shape defines the element space */
    uint32_t           memo_node[KL_MEMO]; /* evaluated nodes ... */
    uint32_t           memo_val[KL_MEMO];  /* ... and their f32 values */
    int                n_memo;             /* used */
    bool               failed;             /* a node could not be evaluated (message in err) */
    char               err[160];           /* why */
} kl_eval;

bool     kl_is_elementwise(enum kiln_op op);
/* I32 value of dim d of a node (constant, or the symbol's parameter slot). */
uint32_t kl_dim(kiln_kir *k, int64_t d);
/* I32 product of dims [from, rank) of node n. */
uint32_t kl_numel_from(kiln_kir *k, const kiln_node_rec *n, int from);
bool     kl_same_numel(const kiln_node_rec *a, const kiln_node_rec *b);
/* F32 element `idx` of a plain-dtype (f32/f16/bf16/i32) buffer slot. */
uint32_t kl_load(kiln_kir *k, uint32_t slot, kiln_dtype t, uint32_t idx);
/* Stores F32 v as element idx of a plain-dtype buffer slot (i32: round half even, saturating). */
void     kl_store(kiln_kir *k, uint32_t slot, kiln_dtype t, uint32_t idx, uint32_t v);
/* I32 element idx of an i32 buffer slot. */
uint32_t kl_ld_i32(kiln_kir *k, uint32_t slot, uint32_t idx);
/* Paged attention's slot of key j (I32) of the sequence whose block table row starts at element
 * bt_row (I32) of i32 buffer slot bt: bt[bt_row + j / block] * block + j % block (block a power of
 * two; the block index clamped into [0, n_blocks)). The only place lowering maps keys to slots. */
uint32_t kl_paged_slot(kiln_kir *k, uint32_t bt, uint32_t bt_row, uint32_t j, int64_t block, int64_t n_blocks);
/* A tree step's parent (I32) of new token `an` (I32: its index among its sequence's new tokens, which
 * start at row q0 of the step) from i32 buffer slot par (kiln_paged_step's parents): par[q0 + max(an,
 * 0)] clamped into [-1, an - 1], so a walk up unchecked metadata stays among the step's earlier
 * tokens and ends at -1 (the cached keys). The one place lowering reads the tree: the split
 * kernels' mask (lower_attn.c) and the flash kernel's (lower_flash.c) walk through it. */
uint32_t kl_tree_parent(kiln_kir *k, uint32_t par, uint32_t q0, uint32_t an);
/* q8_0 pools (ggml's blocks: f16 d, then 32 int8 q, 34 bytes; 2-byte aligned) read by 32-bit loads:
 * block blk (I32) of buffer slot `slot` as d (F32) and its quants as 8 U32 words (byte e % 4 of
 * word e / 4 is q[e]); or element e (I32, 0..31) of it as d * q[e] (F32). A block's words may reach
 * 2 bytes past it (a pool is read up to 2 bytes past its last block). */
void     kl_q8_block(kiln_kir *k, uint32_t slot, uint32_t blk, uint32_t *d, uint32_t w[8]);
uint32_t kl_q8_elem(kiln_kir *k, uint32_t slot, uint32_t blk, uint32_t e);
/* Loads node's element idx through a buffer slot of that node. */
uint32_t kl_load_node(kiln_kir *k, const kiln_graph *g, uint32_t node, uint32_t idx);
void     kl_store_node(kiln_kir *k, const kiln_graph *g, uint32_t node, uint32_t idx, uint32_t v);

uint32_t kl_exp(kiln_kir *k, uint32_t x);
uint32_t kl_silu(kiln_kir *k, uint32_t x);
uint32_t kl_gelu(kiln_kir *k, uint32_t x);
/* tanh x to a few ulp relative (also near 0: attention and final-logit soft-capping). */
uint32_t kl_tanh(kiln_kir *k, uint32_t x);
/* The masks of attention node n, in one place for every attention kernel: a formed (scaled) score
 * soft-capped, softcap * tanh(s / softcap) (s itself when softcap is 0); and the first key a query
 * that sees `seen` keys (I32, its position + 1) may read under n's window, max(seen - window, 0)
 * (kiln_attn_first_key; call only when n->i[1] != 0). */
uint32_t kl_attn_score(kiln_kir *k, float softcap, uint32_t s);
uint32_t kl_attn_first_key(kiln_kir *k, const kiln_node_rec *n, uint32_t seen);
/* sin and cos of an angle of any size: range reduced to [-pi, pi] first. */
void     kl_sincos(kiln_kir *k, uint32_t ang, uint32_t *s, uint32_t *c);
/* The elementwise op of node n on F32 operands a (and b). */
uint32_t kl_apply(kiln_kir *k, const kiln_node_rec *n, uint32_t a, uint32_t b);
/* Rope node n's frequency table (kiln_rope_freq: theta^(-2i/d) times its multipliers), i < d/2,
 * computed in f64: returns its buffer slot. */
uint32_t kl_rope_table(kiln_kir *k, const kiln_node_rec *n, int64_t d);

/* Expression evaluation of node at the evaluator's element (see kl_eval). Nodes outside the
 * region are loaded (broadcast: index modulo their element count); reshapes are seen through;
 * values preset with kl_eval_set are used as they are. */
void     kl_eval_init(kl_eval *e, kiln_kir *k, const kiln_graph *g, const kiln_region *r, uint32_t space, uint32_t idx);
void     kl_eval_set(kl_eval *e, uint32_t node, uint32_t v);
uint32_t kl_eval_node(kl_eval *e, uint32_t node);

/* Row norms at any magnitude. The fast path sums squares in f32, which overflows for |x| beyond
 * ~1.8e19 and loses the row below ~1e-19 (squares subnormal); when its q = sum / n + eps is inf or
 * under 2^-100, a block-uniform branch redoes the row scaled by a power of two s (max |x s| in
 * [0.5, 4)), so normal rows pay two compares and a branch. A row's elements: at(ctx, j) emits
 * the F32 value of element j inside the loop the helper opens (for j = tid; j < n; j += step). */
typedef struct kl_row {
    uint32_t (*at)(void *ctx, uint32_t j); /* emits element j */
    void     *ctx;                         /* at's argument */
    uint32_t  tid;                         /* I32 this thread's first element */
    uint32_t  n;                           /* I32 elements of the row */
    uint32_t  nf;                          /* F32 n */
    int32_t   step;                        /* threads over the row: the loop step and REDUCE group */
} kl_row;
/* A row's normalization y = (x * s - ms) * sc (block-uniform F32 variables; s = 1 and ms = the
 * f32 mean on the fast path). */
typedef struct kl_norm {
    uint32_t s, ms, sc;
} kl_norm;
/* layer_norm's statistics from the fast path's f32 mean and q = var + eps. */
kl_norm  kl_norm_stats(kiln_kir *k, const kl_row *row, uint32_t mean, uint32_t q, float eps);
/* rms_norm's scale (x * it is x normalized, an F32 variable) from the fast path's q = sum x^2 / n
 * + eps. With eps = 0 it is exact while the rms is at least FLT_MIN (1/rms an f32). */
uint32_t kl_rms_scale(kiln_kir *k, const kl_row *row, uint32_t q, float eps);

/* Uniform 1-D grid-stride loop over [0, n): returns the I32 index variable; close with kl_loop_end. */
uint32_t kl_grid_loop(kiln_kir *k, uint32_t n);
void     kl_loop_end(kiln_kir *k);
/* Tiles of MMA operands in shared memory in fragment order (kir.h states the fragment layouts), so
 * that one LDS4 gives a lane its A fragment, or the B fragments of two n-tiles. A tile of 16 rows x
 * 16 k holds 128 words (32 lanes x 4), tiles ordered row-tile major with kt k-tiles per row tile.
 * kl_frag_slot: the 16-byte slot of a lane's words, lane ^ ((lane >> 3) & 3): the 8 rows one
 * staging store writes fall in different bank groups, and a warp's LDS4 still reads 32 distinct
 * slots; it flips only the low 2 bits, so the pair p + d (d < 4, p % 4 == 0) is at word ^ 4d.
 * kl_frag_a_word: word of the pair of k (2p, 2p+1) of row r in an A tile (row-major A).
 * kl_frag_b_word: word of the pair p of row n (an n column of B, k pairs contiguous in memory):
 * lanes 0, 1 of a lane's V4 are the B operand of n-tile 2 (n / 16), lanes 2, 3 that of the next. */
uint32_t kl_frag_slot(kiln_kir *k, uint32_t lane);
/* Lane i of a V4 (16-byte load) as an F32. */
uint32_t kl_lanef(kiln_kir *k, uint32_t v4, int i);
/* The MMA words of the f32 pair (a, b) in n parts (1..3) of f16, or bf16 with bf: part i holds the
 * rounded remainder of a and of b after parts 0..i-1 (a in the low half), so the parts sum to
 * the f32 values within 2^-22 (two f16 parts) or 2^-24 (three bf16 parts), and each part's
 * product with an f16/bf16 value is exact. */
void     kl_split_pair(kiln_kir *k, uint32_t a, uint32_t b, int n, bool bf, uint32_t word[]);
uint32_t kl_frag_a_word(kiln_kir *k, uint32_t r, uint32_t p, int kt);
uint32_t kl_frag_b_word(kiln_kir *k, uint32_t n, uint32_t p, int kt);
/* Grid size (x) for n_max elements at `per_block` elements per block, capped for grid-stride loops. */
uint32_t kl_grid_for(const kiln_lower_target *tg, int64_t n_max, int64_t per_block);
/* Upper bound of a dim (symbols at their bound). */
int64_t  kl_dim_max(const kiln_graph *g, int64_t d);
int64_t  kl_numel_max(const kiln_graph *g, const kiln_node_rec *n);

kiln_status kl_unsupported(char *err, size_t n_err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Programmatic dependent launch (lower_pdl.c). kl_pdl_apply: GRID_LAUNCH first, GRID_WAIT at the
 * top level before the first store or read of a buffer a kernel writes, kiln_kir.pdl and pdl_const
 * set; run on a finished kernel (after any kiln_kir_guard). kl_pdl_prefetch_tail: the instructions
 * appended since index `from` (straight-line code that loads, e.g. a weight format's chunk load)
 * become L2 prefetches of the same words: every LD/LD4 a PREFETCH, what was computed from a loaded
 * value removed. */
void kl_pdl_apply(kiln_kir *k, const kiln_graph *g);
void kl_pdl_prefetch_tail(kiln_kir *k, uint32_t from);

kiln_status kiln_lower_map(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k, char *err, size_t n_err);
kiln_status kiln_lower_rows(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k, char *err, size_t n_err);
kiln_status kiln_lower_gemv(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k, char *err, size_t n_err);
/* gemv for runs of at most m_cap rows (the caller guards the kernel so: kl_guard_rows). */
kiln_status kiln_lower_gemv_cap(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k, int64_t m_cap, char *err, size_t n_err);
/* Runs kernel k only when node's rows (its elements / per_row, at run time) are more than `cap`
 * (!small) or not (small): the other kernel of a region takes the other runs. With a per-sequence
 * bound (seqs: the node whose dim 0 counts a step's sequences, KILN_IDX_NONE: none) the large runs
 * must also have more than per_seq rows a sequence on average (paged prefill chunks, not batched decode). */
void kl_guard_rows(kiln_kir *k, const kiln_graph *g, uint32_t node, int64_t per_row, int64_t cap, uint32_t seqs,
                   int64_t per_seq, bool small);
/* Runs kernel k only when lo < rows <= cap (rows as kl_guard_rows counts them; lo >= 1): the middle
 * kernel of three that split a region's runs by length (kiln_krows.lo). */
void kl_guard_rows_range(kiln_kir *k, const kiln_graph *g, uint32_t node, int64_t per_row, int64_t lo, int64_t cap);
/* Paged steps split by sequence (the flash kernel of a region whose split kernels take sequences of at
 * most `mix` new tokens, lower_attn.c): runs kernel k only when a sequence of the step may have more,
 * rows - n_seq >= mix (seqs: the node whose dim 0 counts a step's sequences; kiln_krows.mix). */
void kl_guard_rows_mixed(kiln_kir *k, const kiln_graph *g, uint32_t node, int64_t per_row, uint32_t seqs, int64_t mix);
/* Rows up to which gemv and the split attention kernels take a run; the GEMM and the flash kernel
 * take longer runs. */
#define KL_SMALL_ROWS 8
/* Tensor-core GEMM for matmul regions of more than 8 rows (1 or 2 kernels); KILN_ERR_UNSUPPORTED
 * (gemv then takes the region) for fewer rows, i32 weights, K not a multiple of 32, more than two
 * fused siblings, a neox rope head wider than a block's columns. */
/* tg->wgmma (and not opts.wgmma off): Hopper's warpgroup MMA for the shapes it takes (f16/block
 * weights; else mma.sync) */
kiln_status kiln_lower_gemm(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir k[KILN_LOWER_MAX], uint32_t *n_out, char *err, size_t n_err);
/* The same for runs of at most m_cap rows (0: the region's bound), as a guard will ensure. */
kiln_status kiln_lower_gemm_cap(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir k[KILN_LOWER_MAX], uint32_t *n_out,
                                int64_t m_cap, char *err, size_t n_err);
/* Rows up to which a prefill-sized plan's matmul regions also get the persistent GEMM with splits of K
 * (codegen.gemm_persist auto, sm_90): few rows leave most SMs idle in the GEMM of the plan's bound. */
#define KL_SPLITK_ROWS 64
/* Tokens per GEMM block where the shape takes 128 (lower_gemm.c): 128, or 64 by the options (A/B runs). */
int kl_gemm_rows(const kiln_lower_target *t);
/* Whether node's memory starts 16-byte aligned, as a TMA tensor map needs (a view's offset may
 * not: the plan aligns roots, views add their offset in bytes). */
bool kl_tma_aligned(const kiln_graph *g, uint32_t node);
kiln_status kiln_lower_attention(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir k[KILN_LOWER_MAX], uint32_t *n_out, char *err, size_t n_err);
/* Causal flash attention on tensor cores for prefill (lower_flash.c): whether it takes attention
 * node n (f16 or f32 caches or pools, head_dim 32, 64, 96 or 128, more than 8 query rows at the
 * bound), and the kernel for target tg (its shape: codegen.flash, the target's shared memory);
 * paged attention (sp->block) reads keys through the block table, a block per row tile of a
 * sequence. */
bool kl_flash_fits(const kiln_graph *g, const kiln_node_rec *n);
/* mix > 0 (paged): only sequences of more than mix new tokens get row tiles (the split kernels take the
 * others); 0: every sequence. */
void kl_lower_flash(const kiln_graph *g, uint32_t node, const kiln_region_spec *sp, const kiln_lower_target *tg,
                    int32_t mix, kiln_kir *k);
/* Hopper's warpgroup flash attention (lower_flash_wg.c): whether it takes attention node n for
 * target tg (sm_90a, codegen.precision f16, codegen.flash_wg not off, a contiguous f16/bf16 cache
 * of head_dim 64, 128 or 256, up to 8 query heads a kv head, more than 8 query rows at the bound;
 * soft-caps and sliding windows included), and the kernel. */
bool kl_flash_wg_fits(const kiln_graph *g, const kiln_node_rec *n, const kiln_region_spec *sp, const kiln_lower_target *tg);
void kl_lower_flash_wg(const kiln_graph *g, uint32_t node, const kiln_lower_target *tg, kiln_kir *k);
kiln_status kiln_lower_copy(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k);
kiln_status kiln_lower_move(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k, char *err, size_t n_err);
/* moe_matmul (lower_moe.c): a block per (token, 8 columns), the router row ranked in shared memory,
 * a warp per column dotting the routed experts' rows; KILN_ERR_UNSUPPORTED for more than 256 experts,
 * K not a multiple of the format's chunk, a stack that is not a weight. */
kiln_status kiln_lower_moe_matmul(const kiln_graph *g, const kiln_region *r, const kiln_lower_target *tg, kiln_kir *k,
                                  char *err, size_t n_err);
