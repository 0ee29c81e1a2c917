/* GPU rows (wfmt.h) of the GGUF formats after the first four: q4_0, q4_1, q5_0, q5_1, iq4_nl (blocks
 * of 32) and q2_K, q3_K, iq4_xs (blocks of 256). Each is repacked at upload so that its 16-byte
 * chunks are aligned and follow the chunk interface (the GEMM's piece h of a k-period's tile u is
 * sub-step u of one chunk): pairs of 32-blocks interleave their nibbles, q3_K's scales are unpacked
 * to int8. Must not know any template's tiling beyond the chunk interface, nor any target's syntax. */
#include "codegen/lower.h"
#include "codegen/wfmt.h"
#include "graph/dtype.h"

#include <stddef.h>
#include <string.h>

#define N KILN_IDX_NONE

static int64_t al4(int64_t words) { return (words + 3) / 4 * 4; } /* words, 16-byte aligned */
static uint32_t cu(kiln_kir *k, uint32_t v) { return kiln_ku(k, v); }
static uint32_t add(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_ADD, a, b); }
static uint32_t mul(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_MUL, a, b); }
static uint32_t shr(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_SHR, a, b); }
static uint32_t shl(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_SHL, a, b); }
static uint32_t and_(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_AND, a, b); }
static uint32_t or_(kiln_kir *k, uint32_t a, uint32_t b) { return kiln_k2(k, KILN_KOP_OR, a, b); }
static uint32_t f32i(kiln_kir *k, uint32_t i) { return kiln_kcvt(k, KILN_KT_F32, i); }      /* F32 of I32 */
static uint32_t f32u(kiln_kir *k, uint32_t u) { return f32i(k, kiln_kcvt(k, KILN_KT_I32, u)); } /* F32 of a small U32 */
static uint32_t u32(kiln_kir *k, uint32_t i) { return kiln_kcvt(k, KILN_KT_U32, i); }
static uint32_t bits(kiln_kir *k, uint32_t w, int off, int n) { return kiln_kbfe(k, KILN_KT_U32, w, off, n); }

/* U32 byte `byte` (I32) of the bytes starting at word `base` (I32) of a buffer slot. */
static uint32_t byte_at(kiln_kir *k, uint32_t slot, uint32_t base, uint32_t byte)
{
    uint32_t w = kiln_kld(k, slot, add(k, base, kiln_kshri(k, byte, 2)));
    return and_(k, shr(k, w, u32(k, kiln_kmuli(k, kiln_kandi(k, byte, 3), 8))), cu(k, 255));
}

/* I32 level of iq4 index n (U32 0..15): kiln_iq4nl_values as four words of int8, picked by selects. */
static uint32_t iq4_level(kiln_kir *k, uint32_t n)
{
    uint32_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = 0;
        for (int j = 0; j < 4; j++) w[i] |= (uint32_t)(uint8_t)kiln_iq4nl_values[4 * i + j] << (8 * j);
    }
    uint32_t lt = kiln_k2(k, KILN_KOP_LT, n, cu(k, 4)), lt12 = kiln_k2(k, KILN_KOP_LT, n, cu(k, 12));
    uint32_t lo = kiln_ksel(k, KILN_KT_U32, lt, cu(k, w[0]), cu(k, w[1])), hi = kiln_ksel(k, KILN_KT_U32, lt12, cu(k, w[2]), cu(k, w[3]));
    uint32_t word = kiln_ksel(k, KILN_KT_U32, kiln_k2(k, KILN_KOP_LT, n, cu(k, 8)), lo, hi);
    return kiln_kbfe(k, KILN_KT_I32, shr(k, word, shl(k, and_(k, n, cu(k, 3)), cu(k, 3))), 0, 8);
}

/* ------------------------------------------------------------------ blocks of 32 in pairs */

/* Device layout of a [rows, K] weight (K / 32 = nb blocks a row, np = ceil(nb / 2) pairs): chunk
 * c = 2 p + h of a row (16 bytes) holds in byte i the nibble of value 64 p + 16 h + i (low) and of
 * value 64 p + 32 + 16 h + i (high), so that its sub-step u is 16 values of block 2 p + u; then per
 * chunk a word of fifth bits (q5: bit 16 u + i), per pair a word of the two f16 scales and (q4_1,
 * q5_1) one of the two f16 mins. Offsets in words. */
typedef struct p32_geo {
    int64_t np;          /* pairs per row */
    int64_t qh0, d0, m0; /* first word of the fifth bits, scales, mins */
    int64_t end;         /* words in all */
} p32_geo;

/* Where a format keeps its fields in the GGUF block (-1: absent). */
typedef struct p32_fields {
    size_t bytes;
    int    qs, qh, m;
    int    off;  /* subtracted from the quant (q4_0 8, q5_0 16) */
    bool   iq4;  /* the quant indexes kiln_iq4nl_values */
} p32_fields;

static p32_fields p32_of(kiln_dtype t)
{
    switch (t) {
    case KILN_DTYPE_Q4_0: return (p32_fields){sizeof(kiln_block_q4_0), offsetof(kiln_block_q4_0, qs), -1, -1, 8, false};
    case KILN_DTYPE_Q4_1:
        return (p32_fields){sizeof(kiln_block_q4_1), offsetof(kiln_block_q4_1, qs), -1, offsetof(kiln_block_q4_1, m), 0, false};
    case KILN_DTYPE_Q5_0:
        return (p32_fields){sizeof(kiln_block_q5_0), offsetof(kiln_block_q5_0, qs), offsetof(kiln_block_q5_0, qh), -1, 16, false};
    case KILN_DTYPE_Q5_1:
        return (p32_fields){sizeof(kiln_block_q5_1), offsetof(kiln_block_q5_1, qs), offsetof(kiln_block_q5_1, qh),
                            offsetof(kiln_block_q5_1, m), 0, false};
    default: return (p32_fields){sizeof(kiln_block_iq4_nl), offsetof(kiln_block_iq4_nl, qs), -1, -1, 0, true};
    }
}

static p32_geo p32_at(kiln_dtype t, int64_t rows, int64_t K)
{
    p32_fields f = p32_of(t);
    p32_geo g;
    g.np = (K / 32 + 1) / 2;
    int64_t nc = rows * 2 * g.np, npair = rows * g.np;
    g.qh0 = 4 * nc;
    g.d0 = g.qh0 + (f.qh >= 0 ? al4(nc) : 0);
    g.m0 = g.d0 + al4(npair);
    g.end = g.m0 + (f.m >= 0 ? al4(npair) : 0);
    return g;
}

static size_t p32_bytes(kiln_dtype t, int64_t rows, int64_t K) { return 4 * (size_t)p32_at(t, rows, K).end; }

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint32_t rd16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

static void p32_repack(kiln_dtype t, int64_t rows, int64_t K, const void *src, void *dst)
{
    p32_fields f = p32_of(t);
    p32_geo g = p32_at(t, rows, K);
    unsigned char *o = dst;
    uint32_t *w = dst;
    memset(dst, 0, 4 * (size_t)g.end);
    int64_t nb = K / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < g.np; p++) {
            const unsigned char *b[2]; /* the pair's blocks; an odd row's last pair has one (the other reads as 0) */
            for (int u = 0; u < 2; u++) b[u] = 2 * p + u < nb ? (const unsigned char *)src + (size_t)(r * nb + 2 * p + u) * f.bytes : NULL;
            for (int h = 0; h < 2; h++) {
                int64_t c = r * 2 * g.np + 2 * p + h;
                uint32_t qh = 0;
                for (int u = 0; u < 2 && b[u]; u++) {
                    for (int i = 0; i < 16; i++) o[16 * c + i] |= (unsigned char)(((b[u][f.qs + i] >> (4 * h)) & 15) << (4 * u));
                    if (f.qh >= 0) qh |= ((rd32(b[u] + f.qh) >> (16 * h)) & 0xffffu) << (16 * u);
                }
                if (f.qh >= 0) w[g.qh0 + c] = qh;
            }
            for (int u = 0; u < 2 && b[u]; u++) {
                w[g.d0 + r * g.np + p] |= rd16(b[u]) << (16 * u); /* d is every format's first field */
                if (f.m >= 0) w[g.m0 + r * g.np + p] |= rd16(b[u] + f.m) << (16 * u);
            }
        }
}

static void p32_load(kiln_dtype t, kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    p32_fields f = p32_of(t);
    p32_geo g = p32_at(t, rows, K);
    uint32_t gc = add(k, kiln_kmuli(k, row, (int32_t)(2 * g.np)), c), pr = kiln_kshri(k, gc, 1);
    o->v[0] = kiln_kld4(k, slot, kiln_kmuli(k, gc, 4));
    o->d = kiln_kld(k, slot, kiln_kaddi(k, pr, (int32_t)g.d0));
    if (f.qh >= 0) o->v[1] = kiln_kld(k, slot, kiln_kaddi(k, gc, (int32_t)g.qh0));
    if (f.m >= 0) o->v[2] = kiln_kld(k, slot, kiln_kaddi(k, pr, (int32_t)g.m0));
}

/* 64 (c / 2) + 16 (c % 2) + 32 sub */
static uint32_t p32_sub_elem(kiln_kir *k, uint32_t c, int sub)
{
    return kiln_kaddi(k, add(k, kiln_kmuli(k, kiln_kshri(k, c, 1), 64), kiln_kmuli(k, kiln_kandi(k, c, 1), 16)), 32 * sub);
}

/* I32 quant (offset removed, or the iq4 level) from the U32 index n. */
static uint32_t p32_quant(kiln_kir *k, const p32_fields *f, uint32_t n)
{
    if (f->iq4) return iq4_level(k, n);
    return kiln_kaddi(k, kiln_kcvt(k, KILN_KT_I32, n), -f->off);
}

/* sub-step u: block 2 p + u of the pair, scale half u, values q (ggml: (q - off) * d, or q * d + m) */
static void p32_decode(kiln_dtype t, kiln_kir *k, const gv_chunk *ch, int sub, gv_sub *o)
{
    p32_fields f = p32_of(t);
    o->v = 16;
    o->a = kiln_kh2f(k, ch->d, sub);
    o->b = f.m >= 0 ? kiln_kh2f(k, ch->v[2], sub) : N;
    for (int i = 0; i < 16; i++) {
        uint32_t n = bits(k, kiln_klane(k, ch->v[0], i / 4), 8 * (i % 4) + 4 * sub, 4);
        if (f.qh >= 0) n = or_(k, n, shl(k, bits(k, ch->v[1], 16 * sub + i, 1), cu(k, 4)));
        o->q[i] = f32i(k, p32_quant(k, &f, n));
    }
}

/* Sub-step sub in f16 pairs (gemm_h2; not iq4's levels): the scale half is an f16 already; (q - off) d
 * = q d - off d (off 8 or 16: exact), or q d + m with the f16 min; the fifth bits of values 2 p and
 * 2 p + 1 (bits 16 sub + 2 p, + 1 of the chunk's word) go to bits 4 and 20 */
static void p32_gemm_h2(kiln_dtype t, kiln_kir *k, const gv_chunk *ch, int sub, uint32_t w[8])
{
    p32_fields f = p32_of(t);
    uint32_t a = kl_h2_half(k, ch->d, sub);
    uint32_t moff = (uint32_t)kiln_f32_to_f16((float)-f.off);
    uint32_t b = f.m >= 0 ? kl_h2_half(k, ch->v[2], sub) : kl_h2_fma(k, a, cu(k, moff | moff << 16), cu(k, 0x80008000u));
    for (int p = 0; p < 8; p++) {
        uint32_t q = kl_h2_pair(k, ch->v[0], p);
        if (sub) q = shr(k, q, cu(k, 4));
        q = and_(k, q, cu(k, 0x000F000Fu));
        if (f.qh >= 0) {
            uint32_t hb = shr(k, ch->v[1], cu(k, (uint32_t)(16 * sub + 2 * p)));
            q = or_(k, q, or_(k, shl(k, and_(k, hb, cu(k, 1)), cu(k, 4)), shl(k, and_(k, hb, cu(k, 2)), cu(k, 19))));
        }
        w[p] = kl_h2_scale(k, q, a, b);
    }
}

/* int8 bytes of values 4 l .. 4 l + 3 of sub-step sub, as stored (dp4a_offset removes the offset) */
static uint32_t p32_dp4a_bytes(kiln_dtype t, kiln_kir *k, const gv_chunk *ch, int sub, int l)
{
    uint32_t w = kiln_klane(k, ch->v[0], l);
    if (sub) w = shr(k, w, cu(k, 4));
    w = and_(k, w, cu(k, 0x0F0F0F0Fu));
    if (p32_of(t).qh >= 0) { /* fifth bits 16 sub + 4 l + j to bit 4 of byte j: shifts 4, 11, 18, 25 never overlap */
        uint32_t hb = bits(k, ch->v[1], 16 * sub + 4 * l, 4);
        w = or_(k, w, and_(k, mul(k, hb, cu(k, 0x02040810u)), cu(k, 0x10101010u)));
    }
    return w;
}

/* x words of sub-step 0: 16 p + 4 h (+8 per sub-step), groups 2 p, 2 p + 1; chunks of h = 0 add the mins */
static void p32_dp4a_at(kiln_kir *k, uint32_t c, kl_dp4a_at *o, bool mins)
{
    uint32_t p = kiln_kshri(k, c, 1), h = kiln_kandi(k, c, 1);
    o->w0 = add(k, kiln_kmuli(k, p, 16), kiln_kmuli(k, h, 4)), o->wstep = 8;
    o->g0 = kiln_kmuli(k, p, 2), o->gstep = 1;
    if (mins) o->h0 = h;
}

static void p32_dp4a_scales(kiln_dtype t, kiln_kir *k, const gv_chunk *ch, kl_dp4a_scales *o)
{
    for (int u = 0; u < 2; u++) o->wa[u] = kiln_kh2f(k, ch->d, u);
    if (p32_of(t).m < 0) return;
    o->dmin = kiln_kf(k, -1.0f); /* the mins add: m0 sum(x of block 2 p) + m1 sum(x of block 2 p + 1) */
    for (int u = 0; u < 2; u++) o->mn[u] = kiln_kh2f(k, ch->v[2], u);
}

/* chunk 2 (k0 / 64) + h */
static uint32_t p32_gemm_chunk(kiln_kir *k, uint32_t k0, uint32_t h) { return add(k, kiln_kmuli(k, kiln_kshri(k, k0, 6), 2), h); }

static uint32_t p32_elem(kiln_dtype t, kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    p32_fields f = p32_of(t);
    p32_geo g = p32_at(t, rows, K);
    uint32_t u = kiln_kandi(k, kiln_kshri(k, col, 5), 1), i = kiln_kandi(k, col, 15);
    uint32_t pr = add(k, kiln_kmuli(k, row, (int32_t)g.np), kiln_kshri(k, col, 6));
    uint32_t gc = add(k, kiln_kmuli(k, pr, 2), kiln_kandi(k, kiln_kshri(k, col, 4), 1));
    uint32_t n = and_(k, shr(k, byte_at(k, slot, kiln_kmuli(k, gc, 4), i), u32(k, kiln_kmuli(k, u, 4))), cu(k, 15));
    if (f.qh >= 0) {
        uint32_t qh = kiln_kld(k, slot, kiln_kaddi(k, gc, (int32_t)g.qh0));
        n = or_(k, n, shl(k, and_(k, shr(k, qh, u32(k, add(k, kiln_kmuli(k, u, 16), i))), cu(k, 1)), cu(k, 4)));
    }
    uint32_t hs = u32(k, kiln_kmuli(k, u, 16));
    uint32_t d = kiln_kh2f(k, shr(k, kiln_kld(k, slot, kiln_kaddi(k, pr, (int32_t)g.d0)), hs), 0);
    uint32_t v = mul(k, f32i(k, p32_quant(k, &f, n)), d);
    if (f.m >= 0) v = add(k, v, kiln_kh2f(k, shr(k, kiln_kld(k, slot, kiln_kaddi(k, pr, (int32_t)g.m0)), hs), 0));
    return v;
}

/* One format's typed entry points over the shared pair32 code. */
#define P32_FNS(NAME, T)                                                                                                     \
    static size_t NAME##_bytes(int64_t rows, int64_t k) { return p32_bytes(T, rows, k); }                                  \
    static void NAME##_repack(int64_t rows, int64_t k, const void *s, void *d) { p32_repack(T, rows, k, s, d); }            \
    static void NAME##_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)    \
    {                                                                                                                        \
        p32_load(T, k, slot, row, c, K, rows, o);                                                                            \
    }                                                                                                                        \
    static void NAME##_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o) { p32_decode(T, k, ch, sub, o); } \
    static uint32_t NAME##_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)           \
    {                                                                                                                        \
        return p32_elem(T, k, slot, K, rows, row, col);                                                                      \
    }
#define P32_DP4A(NAME, T, MINS)                                                                                              \
    static uint32_t NAME##_dp4a_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh)                      \
    {                                                                                                                        \
        return p32_dp4a_bytes(T, k, ch, sub, l);                                                                             \
    }                                                                                                                        \
    static void NAME##_dp4a_at(kiln_kir *k, uint32_t c, kl_dp4a_at *o) { p32_dp4a_at(k, c, o, MINS); }                     \
    static void NAME##_gemm_h2(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, uint32_t w[8]) { p32_gemm_h2(T, k, ch, sub, w); } \
    static void NAME##_dp4a_scales(kiln_kir *k, const gv_chunk *ch, uint32_t c, kl_dp4a_scales *o) { p32_dp4a_scales(T, k, ch, o); }
P32_FNS(q4_0, KILN_DTYPE_Q4_0)
P32_FNS(q4_1, KILN_DTYPE_Q4_1)
P32_FNS(q5_0, KILN_DTYPE_Q5_0)
P32_FNS(q5_1, KILN_DTYPE_Q5_1)
P32_FNS(iq4_nl, KILN_DTYPE_IQ4_NL)
P32_DP4A(q4_0, KILN_DTYPE_Q4_0, false)
P32_DP4A(q4_1, KILN_DTYPE_Q4_1, true)
P32_DP4A(q5_0, KILN_DTYPE_Q5_0, false)
P32_DP4A(q5_1, KILN_DTYPE_Q5_1, true)
#undef P32_FNS
#undef P32_DP4A

/* ------------------------------------------------------------------ q2_K, q3_K: chunks of 16 qs bytes, 4 sub-steps */

/* Both keep qs[64] first in the device block: chunk c of a row is qs[32 hh + 16 l0 ..] of block
 * c / 4 (q = c % 4 = 2 hh + l0), whose sub-step u is values 128 hh + 32 u + 16 l0 + i (2 bits at
 * 2 u of byte i), sub-block 8 hh + 2 u + l0. */
#define Q2_K_WORDS 20 /* qs[64] scales[16]; then a word d | dmin << 16 per block */
#define Q3_K_WORDS 28 /* qs[64] hmask[32] scales[16] (int8, sc - 32); then the f16 d of every block */

static size_t q2_k_bytes(int64_t rows, int64_t k)
{
    int64_t nb = rows * (k / 256);
    return 4 * (size_t)(Q2_K_WORDS * nb + al4(nb));
}

static void q2_k_repack(int64_t rows, int64_t k, const void *src, void *dst)
{
    int64_t nb = rows * (k / 256);
    const kiln_block_q2_k *b = src;
    unsigned char *o = dst;
    uint32_t *dd = (uint32_t *)dst + Q2_K_WORDS * nb;
    memset(dst, 0, q2_k_bytes(rows, k));
    for (int64_t i = 0; i < nb; i++) {
        memcpy(o + 4 * Q2_K_WORDS * i, b[i].qs, 64);
        memcpy(o + 4 * Q2_K_WORDS * i + 64, b[i].scales, 16);
        dd[i] = (uint32_t)b[i].d | (uint32_t)b[i].dmin << 16;
    }
}

static size_t q3_k_bytes(int64_t rows, int64_t k)
{
    int64_t nb = rows * (k / 256);
    return 4 * (size_t)(Q3_K_WORDS * nb + al4((nb + 1) / 2));
}

static void q3_k_repack(int64_t rows, int64_t k, const void *src, void *dst)
{
    int64_t nb = rows * (k / 256);
    const kiln_block_q3_k *b = src;
    unsigned char *o = dst;
    uint16_t *d = (uint16_t *)((uint32_t *)dst + Q3_K_WORDS * nb);
    memset(dst, 0, q3_k_bytes(rows, k));
    for (int64_t i = 0; i < nb; i++) {
        int8_t sc[16];
        kiln_q3_k_scales(&b[i], sc);
        memcpy(o + 4 * Q3_K_WORDS * i, b[i].qs, 64);
        memcpy(o + 4 * Q3_K_WORDS * i + 64, b[i].hmask, 32);
        memcpy(o + 4 * Q3_K_WORDS * i + 96, sc, 16);
        d[i] = b[i].d;
    }
}

static uint32_t k4_blk(kiln_kir *k, uint32_t row, uint32_t c, int64_t K)
{
    return add(k, kiln_kmuli(k, row, (int32_t)(K / 256)), kiln_kshri(k, c, 2));
}

/* The chunk's 8 of the 16 scale bytes at word sc (sub-blocks 8 hh .. 8 hh + 7: words 2 hh, 2 hh + 1)
 * into o->v[2], v[3]: two words rather than the V4 of all 16 keep the GEMM producer's chunks small. */
static void k4_scale_words(kiln_kir *k, uint32_t slot, uint32_t sc, uint32_t c, gv_chunk *o)
{
    uint32_t w = add(k, sc, kiln_kandi(k, c, 2)); /* 2 hh */
    o->v[2] = kiln_kld(k, slot, w);
    o->v[3] = kiln_kld(k, slot, kiln_kaddi(k, w, 1));
}

static void q2_k_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    uint32_t blk = k4_blk(k, row, c, K), base = kiln_kmuli(k, blk, Q2_K_WORDS);
    o->v[0] = kiln_kld4(k, slot, add(k, base, kiln_kmuli(k, kiln_kandi(k, c, 3), 4)));
    k4_scale_words(k, slot, kiln_kaddi(k, base, 16), c, o);
    o->d = kiln_kld(k, slot, kiln_kaddi(k, blk, (int32_t)(Q2_K_WORDS * rows * (K / 256))));
}

static void q3_k_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    uint32_t blk = k4_blk(k, row, c, K), base = kiln_kmuli(k, blk, Q3_K_WORDS);
    o->v[0] = kiln_kld4(k, slot, add(k, base, kiln_kmuli(k, kiln_kandi(k, c, 3), 4)));
    o->v[1] = kiln_kld4(k, slot, add(k, kiln_kaddi(k, base, 16), kiln_kmuli(k, kiln_kandi(k, c, 1), 4))); /* hmask[16 l0 ..] */
    k4_scale_words(k, slot, kiln_kaddi(k, base, 24), c, o);
    o->d = kl_load(k, slot, KILN_DTYPE_F16, kiln_kaddi(k, blk, (int32_t)(2 * Q3_K_WORDS * rows * (K / 256))));
}

/* 256 (c / 4) + 128 hh + 16 l0 + 32 sub */
static uint32_t k4_sub_elem(kiln_kir *k, uint32_t c, int sub)
{
    uint32_t e = add(k, kiln_kmuli(k, kiln_kshri(k, c, 2), 256),
                     add(k, kiln_kmuli(k, kiln_kandi(k, kiln_kshri(k, c, 1), 1), 128), kiln_kmuli(k, kiln_kandi(k, c, 1), 16)));
    return kiln_kaddi(k, e, 32 * sub);
}

/* U32 (low byte) of sub-block 8 hh + 2 sub + l0: byte l0 + 2 (sub % 2) of scale word sub / 2. */
static uint32_t k4_scale_byte(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub)
{
    return shr(k, ch->v[2 + sub / 2], u32(k, kiln_kaddi(k, kiln_kmuli(k, kiln_kandi(k, c, 1), 8), 16 * (sub % 2))));
}

/* ggml: d * (sc & 15) * q - dmin * (sc >> 4) */
static void q2_k_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    uint32_t sc = and_(k, k4_scale_byte(k, ch, c, sub), cu(k, 255));
    o->a = mul(k, kiln_kh2f(k, ch->d, 0), f32u(k, and_(k, sc, cu(k, 15))));
    o->b = kiln_k1(k, KILN_KOP_NEG, mul(k, kiln_kh2f(k, ch->d, 1), f32u(k, shr(k, sc, cu(k, 4)))));
    o->v = 16;
    for (int i = 0; i < 16; i++) o->q[i] = f32u(k, bits(k, kiln_klane(k, ch->v[0], i / 4), 8 * (i % 4) + 2 * sub, 2));
}

static uint32_t q3_k_scale(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub)
{
    return mul(k, ch->d, f32i(k, kiln_kbfe(k, KILN_KT_I32, k4_scale_byte(k, ch, c, sub), 0, 8)));
}

/* ggml: d * sc * (q2 - (hmask bit ? 0 : 4)); the bit of value 128 hh + 32 u + l is bit 4 hh + u of hmask[l] */
static void q3_k_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    o->a = q3_k_scale(k, ch, c, sub);
    o->b = N;
    o->v = 16;
    uint32_t hs = u32(k, kiln_kaddi(k, kiln_kmuli(k, kiln_kandi(k, kiln_kshri(k, c, 1), 1), 4), sub));
    for (int l = 0; l < 4; l++) {
        uint32_t hm = shr(k, kiln_klane(k, ch->v[1], l), hs);
        for (int j = 0; j < 4; j++) {
            uint32_t q = or_(k, bits(k, kiln_klane(k, ch->v[0], l), 8 * j + 2 * sub, 2), shl(k, bits(k, hm, 8 * j, 1), cu(k, 2)));
            o->q[4 * l + j] = f32i(k, kiln_kaddi(k, kiln_kcvt(k, KILN_KT_I32, q), -4));
        }
    }
}

/* q3_K's integer dots: bytes q2 | bit << 2 (stored + 4: dp4a_offset), x words 64 b + 32 hh + 4 l0 + 8 sub */
static uint32_t q3_k_dp4a_bytes(kiln_kir *k, const gv_chunk *ch, int sub, int l, uint32_t hsh)
{
    uint32_t lo = and_(k, shr(k, kiln_klane(k, ch->v[0], l), cu(k, 2u * (uint32_t)sub)), cu(k, 0x03030303u));
    uint32_t hb = and_(k, shr(k, kiln_klane(k, ch->v[1], l), add(k, hsh, cu(k, (uint32_t)sub))), cu(k, 0x01010101u));
    return or_(k, lo, shl(k, hb, cu(k, 2)));
}

static void q3_k_dp4a_at(kiln_kir *k, uint32_t c, kl_dp4a_at *o)
{
    uint32_t b = kiln_kshri(k, c, 2), hh = kiln_kandi(k, kiln_kshri(k, c, 1), 1), l0 = kiln_kandi(k, c, 1);
    o->w0 = add(k, kiln_kmuli(k, b, 64), add(k, kiln_kmuli(k, hh, 32), kiln_kmuli(k, l0, 4)));
    o->g0 = add(k, kiln_kmuli(k, b, 8), kiln_kmuli(k, hh, 4));
    o->wstep = 8, o->gstep = 1;
    o->hsh = u32(k, kiln_kmuli(k, hh, 4));
}

static void q3_k_dp4a_scales(kiln_kir *k, const gv_chunk *ch, uint32_t c, kl_dp4a_scales *o)
{
    for (int sub = 0; sub < 4; sub++) o->wa[sub] = q3_k_scale(k, ch, c, sub);
}

/* chunk 4 (k0 / 256) + 2 ((k0 % 256) / 128) + h */
static uint32_t k4_gemm_chunk(kiln_kir *k, uint32_t k0, uint32_t h)
{
    uint32_t in_blk = kiln_kmuli(k, kiln_kshri(k, kiln_kandi(k, k0, 255), 7), 2);
    return add(k, add(k, kiln_kmuli(k, kiln_kshri(k, k0, 8), 4), in_blk), h);
}

/* block, base word and the value's hh, u (sub-step) and l of element col of row `row` */
typedef struct k4_at {
    uint32_t blk, base, hh, u, l, sb;
} k4_at;

static k4_at k4_elem_at(kiln_kir *k, int64_t K, uint32_t row, uint32_t col, int words)
{
    k4_at a;
    a.blk = add(k, kiln_kmuli(k, row, (int32_t)(K / 256)), kiln_kshri(k, col, 8));
    a.base = kiln_kmuli(k, a.blk, words);
    uint32_t e = kiln_kandi(k, col, 255);
    a.hh = kiln_kshri(k, e, 7), a.u = kiln_kandi(k, kiln_kshri(k, e, 5), 3), a.l = kiln_kandi(k, e, 31), a.sb = kiln_kshri(k, e, 4);
    return a;
}

static uint32_t q2_k_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    k4_at a = k4_elem_at(k, K, row, col, Q2_K_WORDS);
    uint32_t qb = byte_at(k, slot, a.base, add(k, kiln_kmuli(k, a.hh, 32), a.l));
    uint32_t q = and_(k, shr(k, qb, u32(k, kiln_kmuli(k, a.u, 2))), cu(k, 3));
    uint32_t sc = byte_at(k, slot, a.base, kiln_kaddi(k, a.sb, 64));
    uint32_t dd = kiln_kld(k, slot, kiln_kaddi(k, a.blk, (int32_t)(Q2_K_WORDS * rows * (K / 256))));
    uint32_t dl = mul(k, kiln_kh2f(k, dd, 0), f32u(k, and_(k, sc, cu(k, 15)))), ml = mul(k, kiln_kh2f(k, dd, 1), f32u(k, shr(k, sc, cu(k, 4))));
    return kiln_k2(k, KILN_KOP_SUB, mul(k, dl, f32u(k, q)), ml);
}

static uint32_t q3_k_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    k4_at a = k4_elem_at(k, K, row, col, Q3_K_WORDS);
    uint32_t qb = byte_at(k, slot, a.base, add(k, kiln_kmuli(k, a.hh, 32), a.l));
    uint32_t q = and_(k, shr(k, qb, u32(k, kiln_kmuli(k, a.u, 2))), cu(k, 3));
    uint32_t hm = byte_at(k, slot, a.base, kiln_kaddi(k, a.l, 64));
    uint32_t hb = and_(k, shr(k, hm, u32(k, add(k, kiln_kmuli(k, a.hh, 4), a.u))), cu(k, 1));
    uint32_t qv = kiln_kaddi(k, kiln_kcvt(k, KILN_KT_I32, or_(k, q, shl(k, hb, cu(k, 2)))), -4);
    uint32_t sc = kiln_kbfe(k, KILN_KT_I32, byte_at(k, slot, a.base, kiln_kaddi(k, a.sb, 96)), 0, 8);
    uint32_t d = kl_load(k, slot, KILN_DTYPE_F16, kiln_kaddi(k, a.blk, (int32_t)(2 * Q3_K_WORDS * rows * (K / 256))));
    return mul(k, mul(k, d, f32i(k, sc)), f32i(k, qv));
}

/* ------------------------------------------------------------------ iq4_xs: sub-block pairs interleaved */

/* Device: per block qs[128] where chunk q = 2 j + h holds the nibbles of sub-blocks 2 j (low) and
 * 2 j + 1 (high) at 16 h + i (as the pairs of blocks of 32 above); then per block its 8 scales as
 * int8 (ls - 32); then the f16 d of every block. Chunk c of a row: block c / 8, q = c % 8. */
static int64_t iq4_xs_sc0(int64_t nb) { return 32 * nb; }
static int64_t iq4_xs_d0(int64_t nb) { return 32 * nb + al4(2 * nb); }

static size_t iq4_xs_bytes(int64_t rows, int64_t k)
{
    int64_t nb = rows * (k / 256);
    return 4 * (size_t)(iq4_xs_d0(nb) + al4((nb + 1) / 2));
}

static void iq4_xs_repack(int64_t rows, int64_t k, const void *src, void *dst)
{
    int64_t nb = rows * (k / 256);
    const kiln_block_iq4_xs *b = src;
    unsigned char *o = dst;
    int8_t *sc = (int8_t *)((uint32_t *)dst + iq4_xs_sc0(nb));
    uint16_t *d = (uint16_t *)((uint32_t *)dst + iq4_xs_d0(nb));
    memset(dst, 0, iq4_xs_bytes(rows, k));
    for (int64_t i = 0; i < nb; i++) {
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++)
                for (int e = 0; e < 16; e++)
                    o[128 * i + 16 * (2 * j + h) + e] =
                        (unsigned char)(((b[i].qs[32 * j + e] >> (4 * h)) & 15) | ((b[i].qs[32 * j + 16 + e] >> (4 * h)) & 15) << 4);
        for (int ib = 0; ib < 8; ib++) {
            int ls = ((b[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b[i].scales_h >> 2 * ib) & 3) << 4);
            sc[8 * i + ib] = (int8_t)(ls - 32);
        }
        d[i] = b[i].d;
    }
}

static void iq4_xs_load(kiln_kir *k, uint32_t slot, uint32_t row, uint32_t c, int64_t K, int64_t rows, gv_chunk *o)
{
    int64_t nb = rows * (K / 256);
    uint32_t blk = add(k, kiln_kmuli(k, row, (int32_t)(K / 256)), kiln_kshri(k, c, 3));
    o->v[0] = kiln_kld4(k, slot, add(k, kiln_kmuli(k, blk, 32), kiln_kmuli(k, kiln_kandi(k, c, 7), 4)));
    o->v[1] = kiln_kld(k, slot, add(k, kiln_kaddi(k, kiln_kmuli(k, blk, 2), (int32_t)iq4_xs_sc0(nb)), kiln_kshri(k, kiln_kandi(k, c, 7), 2)));
    o->d = kl_load(k, slot, KILN_DTYPE_F16, kiln_kaddi(k, blk, (int32_t)(2 * iq4_xs_d0(nb))));
}

/* 256 (c / 8) + 64 j + 16 h + 32 sub, c % 8 = 2 j + h */
static uint32_t iq4_xs_sub_elem(kiln_kir *k, uint32_t c, int sub)
{
    uint32_t e = add(k, kiln_kmuli(k, kiln_kshri(k, c, 3), 256),
                     add(k, kiln_kmuli(k, kiln_kandi(k, kiln_kshri(k, c, 1), 3), 64), kiln_kmuli(k, kiln_kandi(k, c, 1), 16)));
    return kiln_kaddi(k, e, 32 * sub);
}

/* ggml: d * (ls - 32) * level; sub-block 2 j + sub, its scale byte 2 (j % 2) + sub of the word loaded */
static void iq4_xs_decode(kiln_kir *k, const gv_chunk *ch, uint32_t c, int sub, gv_sub *o)
{
    uint32_t sh = u32(k, kiln_kmuli(k, kiln_kandi(k, kiln_kshri(k, c, 1), 1), 16));
    o->a = mul(k, ch->d, f32i(k, kiln_kbfe(k, KILN_KT_I32, shr(k, ch->v[1], sh), 8 * sub, 8)));
    o->b = N;
    o->v = 16;
    for (int i = 0; i < 16; i++) o->q[i] = f32i(k, iq4_level(k, bits(k, kiln_klane(k, ch->v[0], i / 4), 8 * (i % 4) + 4 * sub, 4)));
}

/* chunk 8 (k0 / 256) + 2 ((k0 % 256) / 64) + h */
static uint32_t iq4_xs_gemm_chunk(kiln_kir *k, uint32_t k0, uint32_t h)
{
    uint32_t in_blk = kiln_kmuli(k, kiln_kshri(k, kiln_kandi(k, k0, 255), 6), 2);
    return add(k, add(k, kiln_kmuli(k, kiln_kshri(k, k0, 8), 8), in_blk), h);
}

static uint32_t iq4_xs_elem(kiln_kir *k, uint32_t slot, int64_t K, int64_t rows, uint32_t row, uint32_t col)
{
    int64_t nb = rows * (K / 256);
    uint32_t blk = add(k, kiln_kmuli(k, row, (int32_t)(K / 256)), kiln_kshri(k, col, 8)), e = kiln_kandi(k, col, 255);
    uint32_t j = kiln_kshri(k, e, 6), u = kiln_kandi(k, kiln_kshri(k, e, 5), 1), h = kiln_kandi(k, kiln_kshri(k, e, 4), 1);
    uint32_t byte = add(k, kiln_kmuli(k, add(k, kiln_kmuli(k, j, 2), h), 16), kiln_kandi(k, e, 15));
    uint32_t n = and_(k, shr(k, byte_at(k, slot, kiln_kmuli(k, blk, 32), byte), u32(k, kiln_kmuli(k, u, 4))), cu(k, 15));
    uint32_t scb = byte_at(k, slot, kiln_kaddi(k, kiln_kmuli(k, blk, 2), (int32_t)iq4_xs_sc0(nb)), add(k, kiln_kmuli(k, j, 2), u));
    uint32_t d = kl_load(k, slot, KILN_DTYPE_F16, kiln_kaddi(k, blk, (int32_t)(2 * iq4_xs_d0(nb))));
    return mul(k, mul(k, d, f32i(k, kiln_kbfe(k, KILN_KT_I32, scb, 0, 8))), f32i(k, iq4_level(k, n)));
}

/* ------------------------------------------------------------------ the rows */

/* Blocks of 32 take K a multiple of 64 (whole pairs); q4_0/q4_1 decoders hold about q8_0's
 * registers, the fifth bits and iq4's lookups more (8 tokens a pass: q5_1's prefill gemv spilled
 * 40/124 bytes on sm_80, 4 keep every kernel unspilled). */
#define P32_ROW(T, NAME, CAP)                                                                                                \
    [T] = {.t = T, .layout = KILN_KLAYOUT_PAIR32, .block = true, .vec = 16, .subs = 2, .k_align = 64, .mc_cap = CAP,         \
           .dev_bytes = NAME##_bytes, .repack = NAME##_repack, .load = NAME##_load, .sub_elem = p32_sub_elem,               \
           .decode = NAME##_decode, .gemm_chunk = p32_gemm_chunk, .elem = NAME##_elem
#define P32_DP4A_ROW(NAME) .gemm_h2 = NAME##_gemm_h2, .two_dp4a = true, .dp4a_bytes = NAME##_dp4a_bytes, .dp4a_at = NAME##_dp4a_at, .dp4a_scales = NAME##_dp4a_scales

const kl_wfmt kl_wfmt_more[KILN_DTYPE_COUNT] = {
    P32_ROW(KILN_DTYPE_Q4_0, q4_0, 8), P32_DP4A_ROW(q4_0), .dp4a_offset = 8},
    P32_ROW(KILN_DTYPE_Q4_1, q4_1, 8), P32_DP4A_ROW(q4_1), .dp4a_mins = true},
    P32_ROW(KILN_DTYPE_Q5_0, q5_0, 4), P32_DP4A_ROW(q5_0), .dp4a_offset = 16},
    P32_ROW(KILN_DTYPE_Q5_1, q5_1, 4), P32_DP4A_ROW(q5_1), .dp4a_mins = true},
    P32_ROW(KILN_DTYPE_IQ4_NL, iq4_nl, 4)},
    [KILN_DTYPE_Q2_K] = {.t = KILN_DTYPE_Q2_K,
                         .layout = KILN_KLAYOUT_Q2_K_SPLIT,
                         .block = true,
                         .vec = 16,
                         .subs = 4,
                         .k_align = 256,
                         .mc_cap = 4,
                         .dev_bytes = q2_k_bytes,
                         .repack = q2_k_repack,
                         .load = q2_k_load,
                         .sub_elem = k4_sub_elem,
                         .decode = q2_k_decode,
                         .gemm_chunk = k4_gemm_chunk,
                         .elem = q2_k_elem},
    [KILN_DTYPE_Q3_K] = {.t = KILN_DTYPE_Q3_K,
                         .layout = KILN_KLAYOUT_Q3_K_SPLIT,
                         .block = true,
                         .vec = 16,
                         .subs = 4,
                         .k_align = 256,
                         .mc_cap = 4,
                         .dev_bytes = q3_k_bytes,
                         .repack = q3_k_repack,
                         .load = q3_k_load,
                         .sub_elem = k4_sub_elem,
                         .decode = q3_k_decode,
                         .dp4a_bytes = q3_k_dp4a_bytes,
                         .dp4a_at = q3_k_dp4a_at,
                         .dp4a_scales = q3_k_dp4a_scales,
                         .dp4a_offset = 4,
                         .gemm_chunk = k4_gemm_chunk,
                         .elem = q3_k_elem},
    [KILN_DTYPE_IQ4_XS] = {.t = KILN_DTYPE_IQ4_XS,
                           .layout = KILN_KLAYOUT_IQ4_XS_SPLIT,
                           .block = true,
                           .vec = 16,
                           .subs = 2,
                           .k_align = 256,
                           .mc_cap = 4,
                           .dev_bytes = iq4_xs_bytes,
                           .repack = iq4_xs_repack,
                           .load = iq4_xs_load,
                           .sub_elem = iq4_xs_sub_elem,
                           .decode = iq4_xs_decode,
                           .gemm_chunk = iq4_xs_gemm_chunk,
                           .elem = iq4_xs_elem},
};
