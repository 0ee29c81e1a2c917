/* Bit-exactness of every GGUF block format against ggml's reference, through the `gguf` package's
 * numpy code: tests/data/ggml_quant_fixtures.txt holds hashes of what gguf-py gives for random
 * blocks (dequantization: every nibble and bit pattern, zero and subnormal scales) and random
 * floats (quantization, for the formats gguf-py quantizes as ggml does), written by
 * scripts/gen_dequant_fixtures.py from the splitmix64 stream regenerated here. No network at test
 * time. Also: random-block dot products through kiln_matmul on ref and cpu against f64. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/dtype.h"
#include "kiln/kiln.h"
#include "support/testutil.h"

#define SEED 0x6b696c6eull

typedef struct fmt {
    const char *name;    /* kiln name */
    kiln_dtype  t;       /* kiln dtype */
    uint32_t    ggml;    /* ggml type id (the fixtures' seed offset) */
    int         f16s[2]; /* byte offsets of f16 scale fields (-1: none) */
} fmt;

static const fmt FMTS[] = {
    {"q8_0", KILN_DTYPE_Q8_0, 8, {0, -1}},     {"q4_k", KILN_DTYPE_Q4_K, 12, {0, 2}},
    {"q5_k", KILN_DTYPE_Q5_K, 13, {0, 2}},     {"q6_k", KILN_DTYPE_Q6_K, 14, {208, -1}},
    {"q4_0", KILN_DTYPE_Q4_0, 2, {0, -1}},     {"q4_1", KILN_DTYPE_Q4_1, 3, {0, 2}},
    {"q5_0", KILN_DTYPE_Q5_0, 6, {0, -1}},     {"q5_1", KILN_DTYPE_Q5_1, 7, {0, 2}},
    {"iq4_nl", KILN_DTYPE_IQ4_NL, 20, {0, -1}}, {"q2_k", KILN_DTYPE_Q2_K, 10, {80, 82}},
    {"q3_k", KILN_DTYPE_Q3_K, 11, {108, -1}},  {"iq4_xs", KILN_DTYPE_IQ4_XS, 23, {0, -1}},
};
#define N_FMTS (int)(sizeof FMTS / sizeof FMTS[0])

/* The i-quants (dequantization only; f16s[0] == -2: iq1_m's scale spread over the top nibbles of
 * bytes 49, 51, 53, 55, as the script's "spread"). */
static const fmt IQ_FMTS[] = {
    {"iq2_xxs", KILN_DTYPE_IQ2_XXS, 16, {0, -1}}, {"iq2_xs", KILN_DTYPE_IQ2_XS, 17, {0, -1}},
    {"iq2_s", KILN_DTYPE_IQ2_S, 22, {0, -1}},     {"iq3_xxs", KILN_DTYPE_IQ3_XXS, 18, {0, -1}},
    {"iq3_s", KILN_DTYPE_IQ3_S, 21, {0, -1}},     {"iq1_s", KILN_DTYPE_IQ1_S, 19, {0, -1}},
    {"iq1_m", KILN_DTYPE_IQ1_M, 29, {-2, -1}},
};
#define N_IQ (int)(sizeof IQ_FMTS / sizeof IQ_FMTS[0])

static uint64_t sm_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* As the script's f16_bits: block 0 zero, block 1 subnormal, else +-2^(-10..1). */
static uint16_t f16_bits(uint64_t *s, int blk)
{
    uint64_t z = sm_next(s);
    if (blk == 0) return 0;
    if (blk == 1) return (uint16_t)((z & 0x3ff) | 1 | (z & 0x400 ? 0x8000 : 0));
    uint64_t e = 5 + (z >> 11) % 12;
    return (uint16_t)((z & 0x3ff) | (e << 10) | ((z >> 20) & 1 ? 0x8000 : 0));
}

/* n random blocks of f (the script's `blocks`): malloc'ed. */
static uint8_t *random_blocks(const fmt *f, uint64_t seed, int n)
{
    size_t ts = kiln_dtype_block_bytes(f->t);
    uint8_t *out = malloc(ts * (size_t)n), blk[512];
    for (int b = 0; b < n; b++) {
        for (size_t i = 0; i < ts; i += 8) {
            uint64_t z = sm_next(&seed);
            memcpy(blk + i, &z, 8);
        }
        if (f->f16s[0] == -2) { /* iq1_m */
            uint16_t h = f16_bits(&seed, b);
            for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (uint8_t)((blk[49 + 2 * k] & 0x0f) | (((h >> (4 * k)) & 0xf) << 4));
        }
        for (int k = 0; k < 2 && f->f16s[k] >= 0; k++) {
            uint16_t h = f16_bits(&seed, b);
            memcpy(blk + f->f16s[k], &h, 2);
        }
        memcpy(out + (size_t)b * ts, blk, ts);
    }
    return out;
}

/* Expected hash of `kind` for format name from the fixture file (asserts it is there). */
static uint64_t fixture(const char *kind, const char *name, int *n_blocks)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/ggml_quant_fixtures.txt", KILN_SOURCE_DIR);
    FILE *fp = fopen(path, "r");
    cr_assert(fp, "cannot open %s", path);
    char line[256], k[32], nm[32];
    unsigned long long h = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, fp))
        found = sscanf(line, "%31s %31s %d %llx", k, nm, n_blocks, &h) == 4 && !strcmp(k, kind) && !strcmp(nm, name);
    fclose(fp);
    cr_assert(found, "no '%s %s' line in %s", kind, name, path);
    return h;
}

Test(quant_fixtures, dequantize_bit_exact_with_gguf_py)
{
    for (int i = 0; i < N_FMTS; i++) {
        const fmt *f = &FMTS[i];
        int nb = 0;
        uint64_t want = fixture("dequant", f->name, &nb);
        uint8_t *q = random_blocks(f, SEED + f->ggml, nb);
        int64_t n = nb * kiln_dtype_block(f->t);
        float *y = malloc((size_t)n * sizeof *y);
        tu_poison(y, (size_t)n * sizeof *y);
        cr_assert_eq(kiln_dequantize(f->t, q, y, n), KILN_OK, "%s", f->name);
        cr_assert_eq(fnv(y, (size_t)n * sizeof *y), want, "%s: dequantized values differ from ggml's", f->name);
        free(y);
        free(q);
    }
}

Test(quant_fixtures, iquants_dequantize_bit_exact_with_gguf_py)
{
    for (int i = 0; i < N_IQ; i++) {
        const fmt *f = &IQ_FMTS[i];
        int nb = 0;
        uint64_t want = fixture("dequant", f->name, &nb);
        uint8_t *q = random_blocks(f, SEED + f->ggml, nb);
        int64_t n = nb * kiln_dtype_block(f->t);
        float *y = malloc((size_t)n * sizeof *y);
        tu_poison(y, (size_t)n * sizeof *y);
        cr_assert_eq(kiln_dequantize(f->t, q, y, n), KILN_OK, "%s", f->name);
        cr_assert_eq(fnv(y, (size_t)n * sizeof *y), want, "%s: dequantized values differ from ggml's", f->name);
        float x[256];
        cr_assert_eq(kiln_quantize(f->t, x, q, 256), KILN_ERR_UNSUPPORTED, "%s: kiln has no quantizer for it", f->name);
        free(y);
        free(q);
    }
}

/* Matmul with i-quant weights (random blocks, sane scales) on ref and cpu against an f64 product of
 * kiln_dequantize's values (which the test above ties to ggml's), at the matmul contract's bound:
 * the cpu's dequantizing kernel (kern_scalar.c) and the ref backend's generic path. */
Test(quant_fixtures, iquant_matmul_on_ref_and_cpu)
{
    enum { N = 5, K = 512, T = 3 };
    kiln_ctx *ctx;
    cr_assert_eq(kiln_ctx_new(&(kiln_ctx_options){.n_threads = 2, .quiet = true}, &ctx), KILN_OK);
    for (int i = 0; i < N_IQ; i++) {
        const fmt *f = &IQ_FMTS[i];
        uint8_t *w = random_blocks(f, tu_next(), N * K / 256);
        for (int b = 0; b < N * K / 256; b++) /* blocks 0 and 1 of random_blocks have zero/subnormal scales */
            if (b < 2) memcpy(w + (size_t)b * kiln_dtype_block_bytes(f->t), w + (size_t)(N * K / 256 - 1 - b) * kiln_dtype_block_bytes(f->t), kiln_dtype_block_bytes(f->t));
        float wd[N * K], x[T * K], y[T * N];
        cr_assert_eq(kiln_dequantize(f->t, w, wd, N * K), KILN_OK);
        tu_fill(x, T * K, -1, 1);
        double want[T * N], mag = 0, err;
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                double acc = 0;
                for (int k = 0; k < K; k++) acc += (double)x[t * K + k] * wd[n * K + k];
                want[t * N + n] = acc, mag += acc * acc;
            }
        cr_assert_gt(mag, 0, "%s: all-zero weights", f->name);
        const char *bes[2] = {"ref", "cpu"};
        for (int b = 0; b < 2; b++) {
            kiln_graph *g;
            cr_assert_eq(kiln_graph_new(&g), KILN_OK);
            kiln_node xn = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, K});
            kiln_node wn = kiln_weight(g, "w", f->t, 2, (kiln_dim[]){N, K}, w, KILN_WEIGHT_BORROW);
            cr_assert_eq(kiln_output(g, kiln_matmul(g, xn, wn), "y"), KILN_OK, "%s", kiln_graph_error(g));
            kiln_plan *p;
            cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = bes[b]}, &p), KILN_OK, "%s on %s: %s",
                         f->name, bes[b], kiln_ctx_error(ctx));
            tu_poison(y, sizeof y);
            kiln_binding bd[2] = {{.name = "x", .data = x, .bytes = sizeof x}, {.name = "y", .data = y, .bytes = sizeof y}};
            cr_assert_eq(kiln_run(p, bd, 2), KILN_OK, "%s", kiln_ctx_error(ctx));
            err = 0;
            for (int j = 0; j < T * N; j++) err += ((double)y[j] - want[j]) * ((double)y[j] - want[j]);
            cr_assert_leq(err / mag, tu_tol("matmul", f->t), "%s on %s: NMSE %.3g", f->name, bes[b], err / mag);
            cr_assert_leq(err / mag, 1e-10, "%s on %s: NMSE %.3g (f32 activations: no int8 rounding)", f->name, bes[b],
                          err / mag);
            kiln_plan_free(p);
            kiln_graph_free(g);
        }
        /* the GPU backends have no row for it: a forced plan is refused by name (auto placement keeps it on cpu) */
        for (int b = 0; b < kiln_backend_count(ctx); b++) {
            kiln_backend_info bi;
            if (kiln_backend_get(ctx, b, &bi) != KILN_OK || !bi.available ||
                (strcmp(bi.name, "vulkan") != 0 && strcmp(bi.name, "cuda") != 0))
                continue;
            kiln_graph *g;
            cr_assert_eq(kiln_graph_new(&g), KILN_OK);
            kiln_node xn = kiln_input(g, "x", KILN_DTYPE_F32, 2, (kiln_dim[]){T, K});
            kiln_node wn = kiln_weight(g, "w", f->t, 2, (kiln_dim[]){N, K}, w, KILN_WEIGHT_BORROW);
            kiln_output(g, kiln_matmul(g, xn, wn), "y");
            kiln_plan *p = NULL;
            cr_assert_eq(kiln_compile(ctx, g, &(kiln_compile_options){.backend = bi.name}, &p), KILN_ERR_UNSUPPORTED,
                         "%s on %s", f->name, bi.name);
            cr_assert(strstr(kiln_ctx_error(ctx), f->name), "%s on %s: %s", f->name, bi.name, kiln_ctx_error(ctx));
            kiln_graph_free(g);
        }
        free(w);
    }
    kiln_ctx_free(ctx);
}

/* The script's `floats`: blocks of 32 of u * mult + off, computed in double, rounded to float. */
static void random_floats(uint64_t seed, float *x, int n)
{
    static const double mult[6] = {1.0, 0.01, 100.0, 3.0, 1e-4, 0.5}, off[6] = {0, 0, 0, 2.5, 0, -0.75};
    for (int i = 0; i < n; i++) {
        double u = (double)(sm_next(&seed) >> 40) * 0x1p-23 - 1.0;
        x[i] = (float)(u * mult[(i / 32) % 6] + off[(i / 32) % 6]);
    }
}

Test(quant_fixtures, quantize_bit_exact_with_ggml_reference)
{
    const char *names[5] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1"};
    for (int i = 0; i < 5; i++) {
        const fmt *f = NULL;
        for (int j = 0; j < N_FMTS; j++) f = strcmp(FMTS[j].name, names[i]) == 0 ? &FMTS[j] : f;
        int nb = 0;
        uint64_t want = fixture("quant", f->name, &nb);
        float x[64 * 32];
        random_floats(SEED + 1000 + f->ggml, x, nb * 32);
        size_t bytes = kiln_row_bytes(f->t, nb * 32);
        uint8_t *q = malloc(bytes);
        memset(q, 0x5a, bytes);
        cr_assert_eq(kiln_quantize(f->t, x, q, nb * 32), KILN_OK);
        cr_assert_eq(fnv(q, bytes), want, "%s: quantized bytes differ from ggml's", f->name);
        free(q);
    }
}

/* Every format round-trips fresh random data within a bound per format (plain quantizers for
 * iq4_nl, iq4_xs, q2_K, q3_K included: their blocks must decode close to the input). */
Test(quant_fixtures, round_trip_error_is_bounded)
{
    enum { N = 4096 };
    static const double bound[] = {1e-4, 1e-2, 3e-3, 1e-3, 2e-2, 1e-2, 5e-3, 3e-3, 2e-2, 1.5e-1, 6e-2, 3e-2};
    float x[N], y[N];
    for (int i = 0; i < N_FMTS; i++) {
        tu_fill(x, N, -1.0f, 1.0f);
        size_t bytes = kiln_row_bytes(FMTS[i].t, N);
        uint8_t *q = malloc(bytes);
        cr_assert_eq(kiln_quantize(FMTS[i].t, x, q, N), KILN_OK, "%s", FMTS[i].name);
        tu_poison(y, sizeof y);
        cr_assert_eq(kiln_dequantize(FMTS[i].t, q, y, N), KILN_OK);
        double e = 0, r = 0;
        for (int j = 0; j < N; j++) e += ((double)y[j] - x[j]) * ((double)y[j] - x[j]), r += (double)x[j] * x[j];
        cr_log_info("%s round trip NMSE %.3g (bound %.3g)", FMTS[i].name, e / r, bound[i]);
        cr_assert_lt(e / r, bound[i], "%s: round-trip NMSE %.3g (seed %llu)", FMTS[i].name, e / r,
                     (unsigned long long)tu_seed());
        free(q);
    }
}
