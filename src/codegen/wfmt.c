/* The GPU weight-format table (wfmt.h): per format its device layout and repack, the geometry of
 * its 16-byte chunks, and the kir of its loads, decoders and integer-dot helpers. GGUF block
 * geometry (bytes and words of a block) is written here once. Must not know any template's
 * tiling beyond the chunk interface, nor any target's syntax. */
#include "codegen/wfmt.h"
#include "codegen/lower.h"
#include "graph/dtype.h"

#include <string.h>

/* GGUF blocks of 256 values (k-quants) and their device words. */
#define Q8_0_BYTES 34  /* f16 d, 32 x int8 */
#define Q4_K_WORDS 36  /* f16 d, dmin, scales[12], qs[128] */
#define Q5_K_WORDS 44  /* f16 d, dmin, scales[12], qh[32], qs[128] */
#define Q6_K_BYTES 210 /* ql[128] qh[64] scales[16] f16 d */
#define Q6_K_SPLIT 208 /* on the device: the block without d (52 words), then every block's d */

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

/* I32 (row * per_row + c * 4): the first word of chunk c of a row of per_row words. */
static uint32_t row_word(kiln_kir *k, uint32_t row, int64_t per_row, uint32_t c)
{
    return kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)per_row)),
                   kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4)));
}

static uint32_t byte_i(kiln_kir *k, uint32_t v4, int i, enum kiln_kt t)
{
    return kiln_kbfe(k, t, kiln_klane(k, v4, i / 4), 8 * (i % 4), 8);
}

/* ------------------------------------------------------------------ f16 pairs (gemm_h2) */

/* A quant q (0 .. 2047) in the mantissa of the f16 1024 (0x6400) is the f16 1024 + q exactly;
 * 1024 + q - 1024 is q exactly; q * a + b then rounds once. */
uint32_t kl_h2_fma(kiln_kir *k, uint32_t a, uint32_t b, uint32_t c) { return kiln_kir_op(k, KILN_KOP_HFMA2, KILN_KT_U32, a, b, c, 0); }
uint32_t kl_h2_splat(kiln_kir *k, uint32_t f) { return kiln_kir_op(k, KILN_KOP_PACK2, KILN_KT_U32, f, f, KILN_IDX_NONE, 0); }
uint32_t kl_h2_half(kiln_kir *k, uint32_t w, int h)
{
    return kiln_kir_op(k, KILN_KOP_PRMT, KILN_KT_U32, w, w, kiln_ku(k, h ? 0x3232u : 0x1010u), 0);
}
uint32_t kl_h2_pair(kiln_kir *k, uint32_t v4, int p)
{
    return kiln_kir_op(k, KILN_KOP_PRMT, KILN_KT_U32, kiln_klane(k, v4, p / 2), kiln_ku(k, 0), kiln_ku(k, p % 2 ? 0x4342u : 0x4140u), 0);
}
uint32_t kl_h2_scale(kiln_kir *k, uint32_t q, uint32_t a, uint32_t b)
{
    uint32_t v = kiln_k2(k, KILN_KOP_OR, q, kiln_ku(k, 0x64006400u));
    return kl_h2_fma(k, kl_h2_fma(k, v, kiln_ku(k, 0x3C003C00u), kiln_ku(k, 0xE400E400u)), a, b);
}

/* ------------------------------------------------------------------ raw layouts */

static size_t raw_bytes(kiln_dtype t, int64_t rows, int64_t k) { return (size_t)rows * kiln_row_bytes(t, k); }
static size_t f32_bytes(int64_t rows, int64_t k) { return raw_bytes(KILN_DTYPE_F32, rows, k); }
static size_t f16_bytes(int64_t rows, int64_t k) { return raw_bytes(KILN_DTYPE_F16, rows, k); }
static size_t q4_k_bytes(int64_t rows, int64_t k) { return raw_bytes(KILN_DTYPE_Q4_K, rows, k); }
static size_t q5_k_bytes(int64_t rows, int64_t k) { return raw_bytes(KILN_DTYPE_Q5_K, rows, k); }
static void f32_repack(int64_t rows, int64_t k, const void *src, void *dst) { memcpy(dst, src, f32_bytes(rows, k)); }
static void f16_repack(int64_t rows, int64_t k, const void *src, void *dst) { memcpy(dst, src, f16_bytes(rows, k)); }
static void q4_k_repack(int64_t rows, int64_t k, const void *src, void *dst) { memcpy(dst, src, q4_k_bytes(rows, k)); }
static void q5_k_repack(int64_t rows, int64_t k, const void *src, void *dst) { memcpy(dst, src, q5_k_bytes(rows, k)); }

/* ------------------------------------------------------------------ f32, f16, bf16 */

static void f32_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    o->v[0] = kiln_kld4(k, slot, row_word(k, row, K, c));
}

static void f16_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    o->v[0] = kiln_kld4(k, slot, row_word(k, row, K / 2, c));
}

static uint32_t f32_sub_elem(kiln_kir *k, uint32_t c, int sub) { return kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4)); }
static uint32_t f16_sub_elem(kiln_kir *k, uint32_t c, int sub) { return kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 8)); }

static void f32_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    o->v = 4;
    for (int i = 0; i < 4; i++) o->q[i] = kiln_kbitcast(k, KILN_KT_F32, kiln_klane(k, ch->v[0], i));
    o->a = KILN_IDX_NONE;
}

static void half_decode(kiln_kir *k, const gv_chunk *ch, enum kiln_kop op, gv_sub *o)
{
    o->v = 8;
    for (int i = 0; i < 8; i++)
        o->q[i] = kiln_kir_op(k, op, KILN_KT_F32, kiln_klane(k, ch->v[0], i / 2), KILN_IDX_NONE, KILN_IDX_NONE, i % 2);
    o->a = KILN_IDX_NONE;
}
static void f16_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    half_decode(k, ch, KILN_KOP_H2F, o);
}
static void bf16_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    half_decode(k, ch, KILN_KOP_B2F, o);
}

/* ------------------------------------------------------------------ q8_0: quants, then the f16 scales */

static size_t q8_0_bytes(int64_t rows, int64_t k)
{
    return align16((size_t)(rows * k)) + align16(2 * (size_t)(rows * (k / 32)));
}

static void q8_0_repack(int64_t rows, int64_t k, const void *src, void *dst)
{
    const unsigned char *s = src;
    unsigned char *q = dst, *sc = q + align16((size_t)(rows * k));
    for (size_t b = 0, nb = (size_t)(rows * (k / 32)); b < nb; b++) {
        memcpy(sc + 2 * b, s + Q8_0_BYTES * b, 2);
        memcpy(q + 32 * b, s + Q8_0_BYTES * b + 2, 32);
    }
}

/* Word of block b's f16 scale (I32 b) in the split layout of a [rows, K] weight. */
static uint32_t q8_0_scale(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t b)
{
    int64_t qbytes = (rows * K + 15) / 16 * 16;
    return kl_load(k, slot, KILN_DTYPE_F16, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, (int32_t)(qbytes / 2)), b));
}

static void q8_0_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    uint32_t wq = row_word(k, row, K / 4, c);
    o->v[0] = kiln_kld4(k, slot, wq);
    int64_t qbytes = (rows * K + 15) / 16 * 16;
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)(K / 32))),
                           kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 1)));
    o->d = kl_load(k, slot, KILN_DTYPE_F16, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, (int32_t)(qbytes / 2)), blk));
}

static uint32_t q8_0_sub_elem(kiln_kir *k, uint32_t c, int sub) { return kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 16)); }

static void q8_0_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    o->v = 16;
    for (int i = 0; i < 16; i++) o->q[i] = kiln_kcvt(k, KILN_KT_F32, byte_i(k, ch->v[0], i, KILN_KT_I32));
    o->a = ch->d;
}

/* q8_0 in f16 pairs: the signed byte with its sign bit flipped is q + 128 (0 .. 255) */
static void q8_0_gemm_h2(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, uint32_t w[8])
{
    (void)c, (void)sub;
    /* q d = (q + 128) d - 128 d, rounded once: d is an f16 and 128 d (its exponent + 7) too */
    uint32_t a = kl_h2_splat(k, ch->d), b = kl_h2_splat(k, kiln_k2(k, KILN_KOP_MUL, ch->d, kiln_kf(k, -128.0f)));
    for (int p = 0; p < 8; p++) {
        uint32_t u = kiln_k2(k, KILN_KOP_XOR, kl_h2_pair(k, ch->v[0], p), kiln_ku(k, 0x00800080u));
        w[p] = kl_h2_scale(k, u, a, b);
    }
}

static uint32_t q8_0_dp4a_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh)
{
    return kiln_klane(k, ch->v[0], l);
}

static void q8_0_dp4a_at(kiln_kir *k, uint32_t c, kl_dp4a_at *o)
{
    o->w0 = kiln_k2(k, KILN_KOP_MUL, c, kiln_ki(k, 4)), o->g0 = kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 1)),
    o->wstep = 0, o->gstep = 0;
}

static void q8_0_dp4a_scales(kiln_kir *k, const gv_chunk *ch, uint32_t c, kl_dp4a_scales *o) { o->wa[0] = ch->d; }

/* Pair p of a row: block p's 32 quants (two V4) and its scale. */
static void q8_0_pair_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t p, uint32_t pm, int64_t K, int64_t rows,
                           gv_chunk *o)
{
    uint32_t wq = row_word(k, row, K / 4, kiln_kmuli(k, p, 2));
    o->v[0] = kiln_kld4(k, slot, wq);
    o->v[1] = kiln_kld4(k, slot, kiln_kaddi(k, wq, 4));
    int64_t qbytes = (rows * K + 15) / 16 * 16;
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, (int32_t)(K / 32)), p);
    o->d = kl_load(k, slot, KILN_DTYPE_F16, kiln_kaddi(k, blk, (int32_t)(qbytes / 2)));
}

static uint32_t q8_0_pair_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l) { return kiln_klane(k, ch->v[l / 4], l % 4); }

static void q8_0_pair_scales(kiln_kir *k, const gv_chunk *ch, uint32_t pm, kl_dp4a_scales *o) { o->wa[0] = ch->d; }

static uint32_t q8_0_gemm_chunk(kiln_kir *k, uint32_t k0, uint32_t h)
{
    return kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_SHR, k0, kiln_ki(k, 4)), h);
}

static uint32_t q8_0_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    uint32_t e =
        kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)K)), col); /* flat value index */
    uint32_t w = kiln_kld(k, slot, kiln_k2(k, KILN_KOP_SHR, e, kiln_ki(k, 2)));
    uint32_t sh =
        kiln_kcvt(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_AND, e, kiln_ki(k, 3)), kiln_ki(k, 3)));
    uint32_t q = kiln_kbfe(k, KILN_KT_I32, kiln_k2(k, KILN_KOP_SHR, w, sh), 0, 8);
    uint32_t b = kiln_k2(k, KILN_KOP_SHR, e, kiln_ki(k, 5)); /* block index = flat / 32 */
    uint32_t d = q8_0_scale(k, slot, K, rows, b);
    return kiln_k2(k, KILN_KOP_MUL, d, kiln_kcvt(k, KILN_KT_F32, q));
}

/* ------------------------------------------------------------------ q4_K, q5_K: raw 144/176-byte blocks */

/* I32 field (x >> shift) & mask of byte `byte` (I32) of the block at word `base` of a buffer slot. */
static uint32_t byte_field(kiln_kir *k, uint32_t slot, uint32_t base, uint32_t byte, uint32_t shift, int32_t mask)
{
    uint32_t w = kiln_kld(k, slot, kiln_k2(k, KILN_KOP_ADD, base, kiln_k2(k, KILN_KOP_SHR, byte, kiln_ki(k, 2))));
    uint32_t sh = kiln_k2(
        k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_AND, byte, kiln_ki(k, 3)), kiln_ki(k, 8)), shift);
    uint32_t v = kiln_k2(k, KILN_KOP_SHR, w, kiln_kcvt(k, KILN_KT_U32, sh));
    return kiln_k2(k, KILN_KOP_AND, kiln_kcvt(k, KILN_KT_I32, v), kiln_ki(k, mask));
}

static void kq_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, bool q5, gv_chunk *o)
{
    int bw = q5 ? Q5_K_WORDS : Q4_K_WORDS;
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)(K / 256))),
                           kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 3)));
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, blk, kiln_ki(k, bw));
    uint32_t q = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 7));
    o->v[0] = kiln_kld4(k, slot, base); /* d, dmin, scales */
    o->v[1] = kiln_kld4(
        k, slot,
        kiln_k2(k, KILN_KOP_ADD, base,
                kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, q5 ? 12 : 4), kiln_k2(k, KILN_KOP_MUL, q, kiln_ki(k, 4)))));
    if (q5) /* qh[16h .. 16h+15], h = q & 1 */
        o->v[2] = kiln_kld4(
            k, slot,
            kiln_k2(k, KILN_KOP_ADD, base,
                    kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 4),
                            kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_AND, q, kiln_ki(k, 1)), kiln_ki(k, 4)))));
}
static void q4_k_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    kq_load(k, slot, row, c, K, false, o);
}
static void q5_k_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    kq_load(k, slot, row, c, K, true, o);
}

/* block*256 + 64 j + 32 sub + 16 h, q = c & 7 = 2 j + h */
static uint32_t kq_sub_elem(kiln_kir *k, uint32_t c, int sub)
{
    uint32_t q = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 7));
    uint32_t e = kiln_k2(
        k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 3)), kiln_ki(k, 256)),
        kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_SHR, q, kiln_ki(k, 1)), kiln_ki(k, 64)),
                kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_AND, q, kiln_ki(k, 1)), kiln_ki(k, 16))));
    return kiln_k2(k, KILN_KOP_ADD, e, kiln_ki(k, 32 * sub));
}

/* 6-bit scale and min of sub-block sb (I32, runtime 0..7) from the header V4: F32, or with u32 the
 * U32 fields themselves (gemm_h2 makes f16 of them without a conversion). */
static void scale_min_as(kiln_kir *k, uint32_t hdr, uint32_t sb, uint32_t *sc, uint32_t *mn, bool u32)
{
    uint32_t sh =
        kiln_kcvt(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_AND, sb, kiln_ki(k, 3)), kiln_ki(k, 8)));
    uint32_t b1 = kiln_k2(k, KILN_KOP_SHR, kiln_klane(k, hdr, 1), sh),
             b2 = kiln_k2(k, KILN_KOP_SHR, kiln_klane(k, hdr, 2), sh),
             b3 = kiln_k2(k, KILN_KOP_SHR, kiln_klane(k, hdr, 3), sh);
    uint32_t lo = kiln_k2(k, KILN_KOP_LT, sb, kiln_ki(k, 4));
    uint32_t sc_lo = kiln_k2(k, KILN_KOP_AND, b1, kiln_ku(k, 63)), mn_lo = kiln_k2(k, KILN_KOP_AND, b2, kiln_ku(k, 63));
    uint32_t hi1 =
        kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_SHR, b1, kiln_ku(k, 6)), kiln_ku(k, 3)),
                kiln_ku(k, 4));
    uint32_t hi2 =
        kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_SHR, b2, kiln_ku(k, 6)), kiln_ku(k, 3)),
                kiln_ku(k, 4));
    uint32_t sc_hi = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_AND, b3, kiln_ku(k, 15)), hi1);
    uint32_t mn_hi = kiln_k2(
        k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_SHR, b3, kiln_ku(k, 4)), kiln_ku(k, 15)), hi2);
    *sc = kiln_ksel(k, KILN_KT_U32, lo, sc_lo, sc_hi);
    if (!u32) *sc = kiln_kcvt(k, KILN_KT_F32, kiln_kcvt(k, KILN_KT_I32, *sc));
    *mn = kiln_ksel(k, KILN_KT_U32, lo, mn_lo, mn_hi);
    if (!u32) *mn = kiln_kcvt(k, KILN_KT_F32, kiln_kcvt(k, KILN_KT_I32, *mn));
}
static void scale_min(kiln_kir *k, uint32_t hdr, uint32_t sb, uint32_t *sc, uint32_t *mn) { scale_min_as(k, hdr, sb, sc, mn, false); }

/* I32 sub-block 2 j + sub of sub-step sub of chunk c (q = c & 7 = 2 j + h) */
static uint32_t kq_sub_block(kiln_kir *k, uint32_t c, int sub)
{
    uint32_t q = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 7));
    uint32_t j = kiln_k2(k, KILN_KOP_SHR, q, kiln_ki(k, 1));
    return kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_ADD, j, j), kiln_ki(k, sub));
}

/* The scale a = d sc and offset b = -dmin mn of sub-step sub of chunk c; returns its sub-block
 * 2 j + sub (I32: q5_K's qh bit) */
static uint32_t kq_scales(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    uint32_t sb = kq_sub_block(k, c, sub);
    uint32_t sc, mn;
    scale_min(k, ch->v[0], sb, &sc, &mn);
    uint32_t hw = kiln_klane(k, ch->v[0], 0);
    o->a = kiln_k2(k, KILN_KOP_MUL, kiln_kh2f(k, hw, 0), sc);
    o->b = kiln_k1(k, KILN_KOP_NEG, kiln_k2(k, KILN_KOP_MUL, kiln_kh2f(k, hw, 1), mn));
    return sb;
}

static void kq_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, bool q5, gv_sub *o)
{
    uint32_t sb = kq_scales(k, ch, c, sub, o);
    o->v = 16;
    uint32_t hsh = q5 ? kiln_kcvt(k, KILN_KT_U32, sb) : KILN_IDX_NONE; /* qh bit 2j + sub */
    for (int i = 0; i < 16; i++) {
        uint32_t nib = kiln_kbfe(k, KILN_KT_U32, kiln_klane(k, ch->v[1], i / 4), 8 * (i % 4) + 4 * sub, 4);
        if (q5) {
            uint32_t hb = kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_SHR, byte_i(k, ch->v[2], i, KILN_KT_U32), hsh),
                                  kiln_ku(k, 1));
            nib = kiln_k2(k, KILN_KOP_OR, nib, kiln_k2(k, KILN_KOP_SHL, hb, kiln_ku(k, 4)));
        }
        o->q[i] = kiln_kcvt(k, KILN_KT_F32, kiln_kcvt(k, KILN_KT_I32, nib));
    }
}
/* q4_K / q5_K in f16 pairs: value i of sub-step sub is nibble sub of byte i (and for q5_K bit
 * 2 j + sub of qh byte i above it); a = d sc and b = -dmin mn each rounded to f16 once */
static void kq_gemm_h2(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, bool q5, uint32_t w[8])
{
    /* a = d sc and b = -dmin mn from the f16 halves of the header and the 6-bit fields as f16 (1024 +
       field, less 1024): each product rounded once, as the f32 product rounded to f16 would be */
    uint32_t sb = kq_sub_block(k, c, sub);
    uint32_t sc, mn, hw = kiln_klane(k, ch->v[0], 0), nz = kiln_ku(k, 0x80008000u);
    scale_min_as(k, ch->v[0], sb, &sc, &mn, true);
    uint32_t sc2 = kiln_k2(k, KILN_KOP_OR, sc, kiln_k2(k, KILN_KOP_SHL, sc, kiln_ku(k, 16)));
    uint32_t mn2 = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_OR, mn, kiln_k2(k, KILN_KOP_SHL, mn, kiln_ku(k, 16))), kiln_ku(k, 0x64006400u));
    uint32_t a = kl_h2_scale(k, sc2, kl_h2_half(k, hw, 0), nz);
    uint32_t negmn = kl_h2_fma(k, mn2, kiln_ku(k, 0xBC00BC00u), kiln_ku(k, 0x64006400u)); /* -(1024 + mn) + 1024 */
    uint32_t b = kl_h2_fma(k, kl_h2_half(k, hw, 1), negmn, nz);
    uint32_t hsh = q5 ? kiln_kcvt(k, KILN_KT_U32, sb) : KILN_IDX_NONE;
    for (int p = 0; p < 8; p++) {
        uint32_t t = kl_h2_pair(k, ch->v[1], p);
        if (sub) t = kiln_k2(k, KILN_KOP_SHR, t, kiln_ku(k, 4));
        t = kiln_k2(k, KILN_KOP_AND, t, kiln_ku(k, 0x000F000Fu));
        if (q5) {
            uint32_t h = kl_h2_pair(k, ch->v[2], p);
            h = kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_SHR, h, hsh), kiln_ku(k, 0x00010001u));
            t = kiln_k2(k, KILN_KOP_OR, t, kiln_k2(k, KILN_KOP_SHL, h, kiln_ku(k, 4)));
        }
        w[p] = kl_h2_scale(k, t, a, b);
    }
}
static void q4_k_gemm_h2(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, uint32_t w[8]) { kq_gemm_h2(k, ch, c, sub, false, w); }
static void q5_k_gemm_h2(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, uint32_t w[8]) { kq_gemm_h2(k, ch, c, sub, true, w); }

static void q4_k_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    kq_decode(k, ch, c, sub, false, o);
}
static void q5_k_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    kq_decode(k, ch, c, sub, true, o);
}

static uint32_t kq_dp4a_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh, bool q5)
{
    uint32_t w = kiln_klane(k, ch->v[1], l);
    if (sub) w = kiln_k2(k, KILN_KOP_SHR, w, kiln_ku(k, 4));
    w = kiln_k2(k, KILN_KOP_AND, w, kiln_ku(k, 0x0F0F0F0Fu));
    if (q5) { /* qh bit 2j + sub of each byte */
        uint32_t hb = kiln_k2(k, KILN_KOP_AND,
                              kiln_k2(k, KILN_KOP_SHR, kiln_klane(k, ch->v[2], l),
                                      kiln_k2(k, KILN_KOP_ADD, hsh, kiln_ku(k, (uint32_t)sub))),
                              kiln_ku(k, 0x01010101u));
        w = kiln_k2(k, KILN_KOP_OR, w, kiln_k2(k, KILN_KOP_SHL, hb, kiln_ku(k, 4)));
    }
    return w;
}
static uint32_t q4_k_dp4a_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh)
{
    return kq_dp4a_bytes(k, ch, sub, l, hsh, false);
}
static uint32_t q5_k_dp4a_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh)
{
    return kq_dp4a_bytes(k, ch, sub, l, hsh, true);
}

/* e0 = 256 b + 64 j + 16 h; sub 1 at +32 */
static void kq_dp4a_at(kiln_kir *k, uint32_t c, kl_dp4a_at *o)
{
    uint32_t q = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 7)), j = kiln_k2(k, KILN_KOP_SHR, q, kiln_ki(k, 1)),
             b = kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 3));
    o->h0 = kiln_k2(k, KILN_KOP_AND, q, kiln_ki(k, 1));
    o->w0 = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, b, kiln_ki(k, 64)),
                    kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, j, kiln_ki(k, 16)),
                            kiln_k2(k, KILN_KOP_MUL, o->h0, kiln_ki(k, 4))));
    o->g0 = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, b, kiln_ki(k, 8)),
                    kiln_k2(k, KILN_KOP_MUL, j, kiln_ki(k, 2)));
    o->wstep = 8, o->gstep = 1;
    o->hsh = kiln_kcvt(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_MUL, j, kiln_ki(k, 2)));
}

static void kq_dp4a_scales(kiln_kir *k, const gv_chunk *ch, uint32_t c, kl_dp4a_scales *o)
{
    uint32_t hw = kiln_klane(k, ch->v[0], 0), d = kiln_kh2f(k, hw, 0);
    o->dmin = kiln_kh2f(k, hw, 1);
    uint32_t j = kiln_k2(k, KILN_KOP_SHR, kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 7)), kiln_ki(k, 1));
    for (int sub = 0; sub < 2; sub++) {
        uint32_t sc;
        scale_min(k, ch->v[0], kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_ADD, j, j), kiln_ki(k, sub)), &sc,
                  &o->mn[sub]);
        o->wa[sub] = kiln_k2(k, KILN_KOP_MUL, d, sc);
    }
}

/* Pair p = 4 b + j of a row: block b's header (d, dmin, scales) and qs[32 j .. 32 j + 31], whose low
 * nibbles are sub-block 2 j and high nibbles sub-block 2 j + 1 (q5_K's qh would need two more V4). */
static void q4_k_pair_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t p, uint32_t pm, int64_t K, int64_t rows,
                           gv_chunk *o)
{
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_kmuli(k, row, (int32_t)(K / 256)), kiln_kshri(k, p, 2));
    uint32_t base = kiln_kmuli(k, blk, Q4_K_WORDS);
    uint32_t qs = kiln_k2(k, KILN_KOP_ADD, base, kiln_kaddi(k, kiln_kmuli(k, kiln_kandi(k, pm, 3), 8), 4));
    o->v[0] = kiln_kld4(k, slot, base);
    o->v[1] = kiln_kld4(k, slot, qs);
    o->v[2] = kiln_kld4(k, slot, kiln_kaddi(k, qs, 4));
}

static uint32_t q4_k_pair_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l)
{
    uint32_t w = kiln_klane(k, ch->v[1 + l / 4], l % 4);
    if (sub) w = kiln_k2(k, KILN_KOP_SHR, w, kiln_ku(k, 4));
    return kiln_k2(k, KILN_KOP_AND, w, kiln_ku(k, 0x0F0F0F0Fu));
}

static void q4_k_pair_scales(kiln_kir *k, const gv_chunk *ch, uint32_t pm, kl_dp4a_scales *o)
{
    uint32_t hw = kiln_klane(k, ch->v[0], 0), d = kiln_kh2f(k, hw, 0);
    o->dmin = kiln_kh2f(k, hw, 1);
    uint32_t j2 = kiln_kmuli(k, kiln_kandi(k, pm, 3), 2);
    for (int sub = 0; sub < 2; sub++) {
        uint32_t sc;
        scale_min(k, ch->v[0], kiln_kaddi(k, j2, sub), &sc, &o->mn[sub]);
        o->wa[sub] = kiln_k2(k, KILN_KOP_MUL, d, sc);
    }
}

/* chunk = 8 (k0 / 256) + 2 ((k0 % 256) / 64) + h: 8 chunks per block, 2 per 64 values */
static uint32_t kq_gemm_chunk(kiln_kir *k, uint32_t k0, uint32_t h)
{
    uint32_t low = kiln_k2(k, KILN_KOP_AND, k0, kiln_ki(k, 255));
    uint32_t in_blk = kiln_kmuli(k, kiln_k2(k, KILN_KOP_SHR, low, kiln_ki(k, 6)), 2);
    uint32_t blk = kiln_kmuli(k, kiln_k2(k, KILN_KOP_SHR, k0, kiln_ki(k, 8)), 8);
    return kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_ADD, blk, in_blk), h);
}

static uint32_t kq_elem(kiln_kir *k, uint32_t slot, int64_t K, uint32_t row, uint32_t col, bool q5)
{
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)(K / 256))),
                           kiln_k2(k, KILN_KOP_SHR, col, kiln_ki(k, 8)));
    uint32_t e = kiln_k2(k, KILN_KOP_AND, col, kiln_ki(k, 255));
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, blk, kiln_ki(k, q5 ? Q5_K_WORDS : Q4_K_WORDS));
    uint32_t sb = kiln_k2(k, KILN_KOP_SHR, e, kiln_ki(k, 5)), j = kiln_k2(k, KILN_KOP_SHR, e, kiln_ki(k, 6));
    uint32_t hi = kiln_k2(k, KILN_KOP_AND, sb, kiln_ki(k, 1)), l = kiln_k2(k, KILN_KOP_AND, e, kiln_ki(k, 31));
    uint32_t qsi = kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, q5 ? 48 : 16),
                           kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, j, kiln_ki(k, 32)), l));
    uint32_t q = byte_field(k, slot, base, qsi, kiln_k2(k, KILN_KOP_MUL, hi, kiln_ki(k, 4)), 15);
    if (q5)
        q = kiln_k2(k, KILN_KOP_OR, q,
                    kiln_k2(k, KILN_KOP_SHL,
                            byte_field(k, slot, base, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 16), l), sb, 1),
                            kiln_ki(k, 4)));
    /* 6-bit scale and min of sub-block sb (ggml's get_scale_min_k4) from bytes 4..15 */
    uint32_t lo = kiln_k2(k, KILN_KOP_LT, sb, kiln_ki(k, 4)), s3 = kiln_k2(k, KILN_KOP_AND, sb, kiln_ki(k, 3));
    uint32_t b1 = byte_field(k, slot, base, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 4), s3), kiln_ki(k, 0), 255);
    uint32_t b2 = byte_field(k, slot, base, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 8), s3), kiln_ki(k, 0), 255);
    uint32_t b3 = byte_field(k, slot, base, kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 12), s3), kiln_ki(k, 0), 255);
    uint32_t sc =
        kiln_ksel(k, KILN_KT_I32, lo, kiln_k2(k, KILN_KOP_AND, b1, kiln_ki(k, 63)),
                  kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_AND, b3, kiln_ki(k, 15)),
                          kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_SHR, b1, kiln_ki(k, 6)), kiln_ki(k, 4))));
    uint32_t mn =
        kiln_ksel(k, KILN_KT_I32, lo, kiln_k2(k, KILN_KOP_AND, b2, kiln_ki(k, 63)),
                  kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_SHR, b3, kiln_ki(k, 4)),
                          kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_SHR, b2, kiln_ki(k, 6)), kiln_ki(k, 4))));
    uint32_t hw = kiln_kld(k, slot, base);
    uint32_t d = kiln_kh2f(k, hw, 0);
    uint32_t dm = kiln_kh2f(k, hw, 1);
    uint32_t f_sc = kiln_kcvt(k, KILN_KT_F32, sc);
    uint32_t f_mn = kiln_kcvt(k, KILN_KT_F32, mn);
    uint32_t f_q = kiln_kcvt(k, KILN_KT_F32, q);
    return kiln_k2(k, KILN_KOP_SUB, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_MUL, d, f_sc), f_q),
                   kiln_k2(k, KILN_KOP_MUL, dm, f_mn));
}
static uint32_t q4_k_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    return kq_elem(k, slot, K, row, col, false);
}
static uint32_t q5_k_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    return kq_elem(k, slot, K, row, col, true);
}

/* ------------------------------------------------------------------ q6_K: 208-byte blocks, then every block's f16 d */

static size_t q6_k_bytes(int64_t rows, int64_t k)
{
    size_t nb = (size_t)(rows * (k / 256));
    return align16(Q6_K_SPLIT * nb) + align16(2 * nb);
}

static void q6_k_repack(int64_t rows, int64_t k, const void *src, void *dst)
{
    const unsigned char *s = src;
    unsigned char *d = dst;
    size_t nb = (size_t)(rows * (k / 256));
    unsigned char *dd = d + align16(Q6_K_SPLIT * nb);
    for (size_t b = 0; b < nb; b++) {
        memcpy(d + Q6_K_SPLIT * b, s + Q6_K_BYTES * b, Q6_K_SPLIT);
        memcpy(dd + 2 * b, s + Q6_K_BYTES * b + Q6_K_SPLIT, 2);
    }
}

/* F32 d of block blk (I32) of a [rows, K] weight. */
static uint32_t q6_k_d(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t blk)
{
    int64_t nb = rows * (K / 256);
    return kl_load(k, slot, KILN_DTYPE_F16,
                   kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, (int32_t)((nb * Q6_K_SPLIT + 15) / 16 * 16 / 2)), blk));
}

static void q6_k_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)(K / 256))),
                           kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 2)));
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, blk, kiln_ki(k, Q6_K_SPLIT / 4));
    uint32_t hh = kiln_k2(k, KILN_KOP_SHR, kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 3)), kiln_ki(k, 1)),
             l0 = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 1));
    /* ql[64h + 16 l0], ql[64h + 32 + 16 l0], qh[32h + 16 l0] (words: 16h + 4 l0, +8, 32 + 8h + 4 l0), scales at word 48 */
    uint32_t w0 = kiln_k2(k, KILN_KOP_ADD, base,
                          kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, hh, kiln_ki(k, 16)),
                                  kiln_k2(k, KILN_KOP_MUL, l0, kiln_ki(k, 4))));
    o->v[0] = kiln_kld4(k, slot, w0);
    o->v[1] = kiln_kld4(k, slot, kiln_k2(k, KILN_KOP_ADD, w0, kiln_ki(k, 8)));
    o->v[2] = kiln_kld4(k, slot,
                        kiln_k2(k, KILN_KOP_ADD, base,
                                kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 32),
                                        kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, hh, kiln_ki(k, 8)),
                                                kiln_k2(k, KILN_KOP_MUL, l0, kiln_ki(k, 4))))));
    o->v[3] = kiln_kld4(k, slot, kiln_k2(k, KILN_KOP_ADD, base, kiln_ki(k, 48)));
    o->d = q6_k_d(k, slot, K, rows, blk);
}

/* block*256 + 128 h + 16 l0 + 32 sub */
static uint32_t q6_k_sub_elem(kiln_kir *k, uint32_t c, int sub)
{
    uint32_t hh = kiln_k2(k, KILN_KOP_SHR, kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 3)), kiln_ki(k, 1)),
             l0 = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 1));
    uint32_t e =
        kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 2)), kiln_ki(k, 256)),
                kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, hh, kiln_ki(k, 128)),
                        kiln_k2(k, KILN_KOP_MUL, l0, kiln_ki(k, 16))));
    return kiln_k2(k, KILN_KOP_ADD, e, kiln_ki(k, 32 * sub));
}

/* d * scale of sub-step sub of chunk c (scale index 8h + l0 + 2 sub; is = l / 16 = l0). */
static uint32_t q6_scale(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub)
{
    uint32_t hh = kiln_k2(k, KILN_KOP_SHR, kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 3)), kiln_ki(k, 1)),
             l0 = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 1));
    uint32_t si = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, hh, kiln_ki(k, 8)), l0),
                          kiln_ki(k, 2 * sub));
    uint32_t word = kiln_ksel(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_LT, si, kiln_ki(k, 8)),
                              kiln_ksel(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_LT, si, kiln_ki(k, 4)),
                                        kiln_klane(k, ch->v[3], 0), kiln_klane(k, ch->v[3], 1)),
                              kiln_ksel(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_LT, si, kiln_ki(k, 12)),
                                        kiln_klane(k, ch->v[3], 2), kiln_klane(k, ch->v[3], 3)));
    uint32_t sh =
        kiln_kcvt(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_AND, si, kiln_ki(k, 3)), kiln_ki(k, 8)));
    uint32_t scv = kiln_kbfe(k, KILN_KT_I32, kiln_k2(k, KILN_KOP_SHR, word, sh), 0, 8);
    return kiln_k2(k, KILN_KOP_MUL, ch->d, kiln_kcvt(k, KILN_KT_F32, scv));
}

/* sub 0..3 = values l, l+32, l+64, l+96: ql word set (sub & 1), nibble (sub >> 1), qh bits 2 sub */
static void q6_k_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    o->a = q6_scale(k, ch, c, sub);
    o->b = kiln_k2(k, KILN_KOP_MUL, o->a, kiln_kf(k, -32.0f));
    o->v = 16;
    uint32_t ql = ch->v[sub & 1];
    for (int i = 0; i < 16; i++) {
        uint32_t lo = kiln_kbfe(k, KILN_KT_U32, kiln_klane(k, ql, i / 4), 8 * (i % 4) + 4 * (sub >> 1), 4);
        uint32_t hi = kiln_kbfe(k, KILN_KT_U32, kiln_klane(k, ch->v[2], i / 4), 8 * (i % 4) + 2 * sub, 2);
        o->q[i] = kiln_kcvt(
            k, KILN_KT_F32,
            kiln_kcvt(k, KILN_KT_I32, kiln_k2(k, KILN_KOP_OR, lo, kiln_k2(k, KILN_KOP_SHL, hi, kiln_ku(k, 4)))));
    }
}

/* q6_K in f16 pairs: the 6-bit quant q (nibble sub >> 1 of ql set sub & 1, qh bits 2 sub above
 * it) to (q - 32) a = q a - 32 a, rounded once (32 a is exact where a = d scale is) */
static void q6_k_gemm_h2(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, uint32_t w[8])
{
    uint32_t a = q6_scale(k, ch, c, sub);
    uint32_t b = kl_h2_splat(k, kiln_k2(k, KILN_KOP_MUL, a, kiln_kf(k, -32.0f)));
    a = kl_h2_splat(k, a);
    for (int p = 0; p < 8; p++) {
        uint32_t lo = kl_h2_pair(k, ch->v[sub & 1], p);
        if (sub >> 1) lo = kiln_k2(k, KILN_KOP_SHR, lo, kiln_ku(k, 4));
        uint32_t hi = kl_h2_pair(k, ch->v[2], p);
        if (sub) hi = kiln_k2(k, KILN_KOP_SHR, hi, kiln_ku(k, 2u * (uint32_t)sub));
        uint32_t q = kiln_k2(k, KILN_KOP_OR, kiln_k2(k, KILN_KOP_AND, lo, kiln_ku(k, 0x000F000Fu)),
                             kiln_k2(k, KILN_KOP_SHL, kiln_k2(k, KILN_KOP_AND, hi, kiln_ku(k, 0x00030003u)), kiln_ku(k, 4)));
        w[p] = kl_h2_scale(k, q, a, b);
    }
}

/* low nibble of ql set (sub & 1) at nibble (sub >> 1), two qh bits at 2 sub */
static uint32_t q6_k_dp4a_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh)
{
    uint32_t lo =
        kiln_k2(k, KILN_KOP_AND,
                kiln_k2(k, KILN_KOP_SHR, kiln_klane(k, ch->v[sub & 1], l), kiln_ku(k, 4u * (uint32_t)(sub >> 1))),
                kiln_ku(k, 0x0F0F0F0Fu));
    uint32_t hi =
        kiln_k2(k, KILN_KOP_AND, kiln_k2(k, KILN_KOP_SHR, kiln_klane(k, ch->v[2], l), kiln_ku(k, 2u * (uint32_t)sub)),
                kiln_ku(k, 0x03030303u));
    return kiln_k2(k, KILN_KOP_OR, lo, kiln_k2(k, KILN_KOP_SHL, hi, kiln_ku(k, 4)));
}

/* e0 = 256 b + 128 hh + 16 l0; sub at +32 sub */
static void q6_k_dp4a_at(kiln_kir *k, uint32_t c, kl_dp4a_at *o)
{
    uint32_t b = kiln_k2(k, KILN_KOP_SHR, c, kiln_ki(k, 2)),
             hh = kiln_k2(k, KILN_KOP_SHR, kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 3)), kiln_ki(k, 1)),
             l0 = kiln_k2(k, KILN_KOP_AND, c, kiln_ki(k, 1));
    o->w0 = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, b, kiln_ki(k, 64)),
                    kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, hh, kiln_ki(k, 32)),
                            kiln_k2(k, KILN_KOP_MUL, l0, kiln_ki(k, 4))));
    o->g0 = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, b, kiln_ki(k, 8)),
                    kiln_k2(k, KILN_KOP_MUL, hh, kiln_ki(k, 4)));
    o->wstep = 8, o->gstep = 1;
}

static void q6_k_dp4a_scales(kiln_kir *k, const gv_chunk *ch, uint32_t c, kl_dp4a_scales *o)
{
    for (int sub = 0; sub < 4; sub++) o->wa[sub] = q6_scale(k, ch, c, sub);
}

/* chunk = 4 (k0 / 256) + 2 ((k0 % 256) / 128) + h: 4 chunks per block, 2 per 128 values */
static uint32_t q6_k_gemm_chunk(kiln_kir *k, uint32_t k0, uint32_t h)
{
    uint32_t low = kiln_k2(k, KILN_KOP_AND, k0, kiln_ki(k, 255));
    uint32_t in_blk = kiln_kmuli(k, kiln_k2(k, KILN_KOP_SHR, low, kiln_ki(k, 7)), 2);
    uint32_t blk = kiln_kmuli(k, kiln_k2(k, KILN_KOP_SHR, k0, kiln_ki(k, 8)), 4);
    return kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_ADD, blk, in_blk), h);
}

static uint32_t q6_k_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    uint32_t blk = kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, row, kiln_ki(k, (int32_t)(K / 256))),
                           kiln_k2(k, KILN_KOP_SHR, col, kiln_ki(k, 8)));
    uint32_t e = kiln_k2(k, KILN_KOP_AND, col, kiln_ki(k, 255));
    uint32_t base = kiln_k2(k, KILN_KOP_MUL, blk, kiln_ki(k, Q6_K_SPLIT / 4));
    uint32_t h = kiln_k2(k, KILN_KOP_SHR, e, kiln_ki(k, 7)), ee = kiln_k2(k, KILN_KOP_AND, e, kiln_ki(k, 127));
    uint32_t g4 = kiln_k2(k, KILN_KOP_SHR, ee, kiln_ki(k, 5)), l = kiln_k2(k, KILN_KOP_AND, ee, kiln_ki(k, 31));
    uint32_t qli =
        kiln_k2(k, KILN_KOP_ADD,
                kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, h, kiln_ki(k, 64)),
                        kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_AND, g4, kiln_ki(k, 1)), kiln_ki(k, 32))),
                l);
    uint32_t nib = byte_field(k, slot, base, qli,
                              kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_SHR, g4, kiln_ki(k, 1)), kiln_ki(k, 4)), 15);
    uint32_t qhi = kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 128),
                           kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, h, kiln_ki(k, 32)), l));
    uint32_t hb = byte_field(k, slot, base, qhi, kiln_k2(k, KILN_KOP_MUL, g4, kiln_ki(k, 2)), 3);
    uint32_t q = kiln_k2(k, KILN_KOP_SUB, kiln_k2(k, KILN_KOP_OR, nib, kiln_k2(k, KILN_KOP_SHL, hb, kiln_ki(k, 4))),
                         kiln_ki(k, 32));
    uint32_t si = kiln_k2(k, KILN_KOP_ADD, kiln_ki(k, 192),
                          kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_MUL, h, kiln_ki(k, 8)),
                                  kiln_k2(k, KILN_KOP_ADD, kiln_k2(k, KILN_KOP_SHR, l, kiln_ki(k, 4)),
                                          kiln_k2(k, KILN_KOP_MUL, g4, kiln_ki(k, 2)))));
    uint32_t sc = byte_field(k, slot, base, si, kiln_ki(k, 0), 255);
    sc = kiln_k2(k, KILN_KOP_SUB, kiln_k2(k, KILN_KOP_XOR, sc, kiln_ki(k, 128)),
                 kiln_ki(k, 128)); /* sign-extend the int8 */
    uint32_t d = q6_k_d(k, slot, K, rows, blk);
    return kiln_k2(k, KILN_KOP_MUL, kiln_k2(k, KILN_KOP_MUL, d, kiln_kcvt(k, KILN_KT_F32, sc)),
                   kiln_kcvt(k, KILN_KT_F32, q));
}

/* ------------------------------------------------------------------ the table */

static const kl_wfmt table[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_F32] = {.t = KILN_DTYPE_F32,
                        .layout = KILN_KLAYOUT_RAW,
                        .vec = 4,
                        .subs = 1,
                        .k_align = 4,
                        .mc_cap = 8,
                        .two = true,
                        .dev_bytes = f32_bytes,
                        .repack = f32_repack,
                        .load = f32_load,
                        .sub_elem = f32_sub_elem,
                        .decode = f32_decode},
    [KILN_DTYPE_F16] = {.t = KILN_DTYPE_F16,
                        .layout = KILN_KLAYOUT_RAW,
                        .vec = 8,
                        .subs = 1,
                        .k_align = 8,
                        .mc_cap = 8,
                        .two = true,
                        .dev_bytes = f16_bytes,
                        .repack = f16_repack,
                        .load = f16_load,
                        .sub_elem = f16_sub_elem,
                        .decode = f16_decode},
    [KILN_DTYPE_BF16] = {.t = KILN_DTYPE_BF16,
                         .layout = KILN_KLAYOUT_RAW,
                         .vec = 8,
                         .subs = 1,
                         .k_align = 8,
                         .mc_cap = 8,
                         .two = true,
                         .dev_bytes = f16_bytes,
                         .repack = f16_repack,
                         .load = f16_load,
                         .sub_elem = f16_sub_elem,
                         .decode = bf16_decode},
    [KILN_DTYPE_Q8_0] = {.t = KILN_DTYPE_Q8_0,
                         .layout = KILN_KLAYOUT_Q8_0_SPLIT,
                         .block = true,
                         .vec = 16,
                         .subs = 1,
                         .k_align = 32,
                         .mc_cap = 8,
                         .two = true,
                         .two_dp4a = true,
                         .dev_bytes = q8_0_bytes,
                         .repack = q8_0_repack,
                         .load = q8_0_load,
                         .sub_elem = q8_0_sub_elem,
                         .decode = q8_0_decode,
                         .dp4a_bytes = q8_0_dp4a_bytes,
                         .dp4a_at = q8_0_dp4a_at,
                         .dp4a_scales = q8_0_dp4a_scales,
                         .pair_subs = 1,
                         .pair_load = q8_0_pair_load,
                         .pair_bytes = q8_0_pair_bytes,
                         .pair_scales = q8_0_pair_scales,
                         .gemm_chunk = q8_0_gemm_chunk,
                         .gemm_h2 = q8_0_gemm_h2,
                         .elem = q8_0_elem},
    /* k-quant decoders hold more registers: 4 tokens per pass keep them unspilled */
    [KILN_DTYPE_Q4_K] = {.t = KILN_DTYPE_Q4_K,
                         .layout = KILN_KLAYOUT_RAW,
                         .block = true,
                         .vec = 16,
                         .subs = 2,
                         .k_align = 256,
                         .mc_cap = 4,
                         .two_dp4a = true,
                         .dp4a_mins = true,
                         .dev_bytes = q4_k_bytes,
                         .repack = q4_k_repack,
                         .load = q4_k_load,
                         .sub_elem = kq_sub_elem,
                         .decode = q4_k_decode,
                         .dp4a_bytes = q4_k_dp4a_bytes,
                         .dp4a_at = kq_dp4a_at,
                         .dp4a_scales = kq_dp4a_scales,
                         .pair_subs = 2,
                         .pair_load = q4_k_pair_load,
                         .pair_bytes = q4_k_pair_bytes,
                         .pair_scales = q4_k_pair_scales,
                         .gemm_chunk = kq_gemm_chunk,
                         .gemm_h2 = q4_k_gemm_h2,
                         .elem = q4_k_elem},
    [KILN_DTYPE_Q5_K] = {.t = KILN_DTYPE_Q5_K,
                         .layout = KILN_KLAYOUT_RAW,
                         .block = true,
                         .vec = 16,
                         .subs = 2,
                         .k_align = 256,
                         .mc_cap = 4,
                         .two_dp4a = true,
                         .dp4a_mins = true,
                         .dev_bytes = q5_k_bytes,
                         .repack = q5_k_repack,
                         .load = q5_k_load,
                         .sub_elem = kq_sub_elem,
                         .decode = q5_k_decode,
                         .dp4a_bytes = q5_k_dp4a_bytes,
                         .dp4a_at = kq_dp4a_at,
                         .dp4a_scales = kq_dp4a_scales,
                         .gemm_chunk = kq_gemm_chunk,
                         .gemm_h2 = q5_k_gemm_h2,
                         .elem = q5_k_elem},
    /* q6_K's four loads per chunk would not fit two chunks per step in 80 registers */
    [KILN_DTYPE_Q6_K] = {.t = KILN_DTYPE_Q6_K,
                         .layout = KILN_KLAYOUT_Q6_K_SPLIT,
                         .block = true,
                         .vec = 16,
                         .subs = 4,
                         .k_align = 256,
                         .mc_cap = 4,
                         .dev_bytes = q6_k_bytes,
                         .repack = q6_k_repack,
                         .load = q6_k_load,
                         .sub_elem = q6_k_sub_elem,
                         .decode = q6_k_decode,
                         .dp4a_bytes = q6_k_dp4a_bytes,
                         .dp4a_at = q6_k_dp4a_at,
                         .dp4a_scales = q6_k_dp4a_scales,
                         .dp4a_offset = 32,
                         .gemm_chunk = q6_k_gemm_chunk,
                         .gemm_h2 = q6_k_gemm_h2,
                         .elem = q6_k_elem},
};

const kl_wfmt *kl_wfmt_of(kiln_dtype t)
{
    if ((unsigned)t >= KILN_DTYPE_COUNT) return NULL;
    return table[t].load ? &table[t] : kl_wfmt_more[t].load ? &kl_wfmt_more[t] : NULL;
}

int64_t kl_wfmt_chunks(const kl_wfmt *f, int64_t K) { return K / (f->vec * f->subs); }

/* ------------------------------------------------------------------ weight layouts (kir.h) */

enum kiln_klayout kiln_lower_weight_layout(kiln_dtype t)
{
    const kl_wfmt *f = kl_wfmt_of(t);
    return f ? f->layout : KILN_KLAYOUT_RAW;
}

size_t kiln_lower_weight_bytes(kiln_dtype t, int64_t rows, int64_t k)
{
    const kl_wfmt *f = kl_wfmt_of(t);
    return f ? f->dev_bytes(rows, k) : raw_bytes(t, rows, k);
}

size_t kiln_lower_weight_dev_bytes(void *state, kiln_dtype t, int64_t rows, int64_t k)
{
    return kiln_lower_weight_layout(t) == KILN_KLAYOUT_RAW ? 0 : kiln_lower_weight_bytes(t, rows, k);
}

void kiln_lower_weight_dev_repack(void *state, kiln_dtype t, int64_t rows, int64_t k, const void *src, void *dst)
{
    kiln_lower_weight_repack(t, rows, k, src, dst);
}

void kiln_lower_weight_repack(kiln_dtype t, int64_t rows, int64_t k, const void *src, void *dst)
{
    const kl_wfmt *f = kl_wfmt_of(t);
    if (f)
        f->repack(rows, k, src, dst);
    else
        memcpy(dst, src, raw_bytes(t, rows, k));
}
