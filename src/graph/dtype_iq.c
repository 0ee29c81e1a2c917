/* Dequantization of ggml's codebook i-quants (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m),
 * one block of 256 values at a time, in ggml's float operations and order (dequantize_row_iq* in
 * ggml-quants.c), so the floats are ggml's bit for bit. The codebooks are data in dtype_iq_grids.c.
 * No quantizers (ggml's need an importance search); scalar code only, must not allocate. */
#include "graph/dtype.h"

#define IQ1S_DELTA 0.125f

static const uint8_t kmask_iq2xs[8] = {1, 2, 4, 8, 16, 32, 64, 128};

/* Row `i` of a grid of 8 (or 4) byte values, as ggml reads it through a byte pointer. */
static void grid8(const uint64_t *g, uint32_t i, uint8_t out[8]) { memcpy(out, &g[i], 8); }
static void grid4(const uint32_t *g, uint32_t i, uint8_t out[4]) { memcpy(out, &g[i], 4); }

void kiln_dtype_dequant_iq2_xxs(const kiln_block_iq2_xxs *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    for (int ib32 = 0; ib32 < KILN_QK_K / 32; ib32++) {
        uint32_t aux32[2];
        memcpy(aux32, b->qs + 4 * ib32, 2 * sizeof(uint32_t));
        const uint8_t *aux8 = (const uint8_t *)aux32;
        const float db = d * (0.5f + (float)(aux32[1] >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            uint8_t grid[8];
            grid8(kiln_iq2xxs_grid, aux8[l], grid);
            const uint8_t signs = kiln_ksigns_iq2xs[(aux32[1] >> 7 * l) & 127];
            for (int j = 0; j < 8; j++) y[j] = db * (float)grid[j] * (signs & kmask_iq2xs[j] ? -1.f : 1.f);
            y += 8;
        }
    }
}

void kiln_dtype_dequant_iq2_xs(const kiln_block_iq2_xs *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    for (int ib32 = 0; ib32 < KILN_QK_K / 32; ib32++) {
        const float db[2] = {d * (0.5f + (float)(b->scales[ib32] & 0xf)) * 0.25f,
                             d * (0.5f + (float)(b->scales[ib32] >> 4)) * 0.25f};
        for (int l = 0; l < 4; l++) {
            uint8_t grid[8];
            const uint16_t q = b->qs[4 * ib32 + l];
            grid8(kiln_iq2xs_grid, q & 511, grid);
            const uint8_t signs = kiln_ksigns_iq2xs[q >> 9];
            for (int j = 0; j < 8; j++) y[j] = db[l / 2] * (float)grid[j] * (signs & kmask_iq2xs[j] ? -1.f : 1.f);
            y += 8;
        }
    }
}

void kiln_dtype_dequant_iq2_s(const kiln_block_iq2_s *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    const uint8_t *qs = b->qs, *qh = b->qh, *signs = b->qs + KILN_QK_K / 8;
    for (int ib32 = 0; ib32 < KILN_QK_K / 32; ib32++) {
        const float db[2] = {d * (0.5f + (float)(b->scales[ib32] & 0xf)) * 0.25f,
                             d * (0.5f + (float)(b->scales[ib32] >> 4)) * 0.25f};
        for (int l = 0; l < 4; l++) {
            const float dl = db[l / 2];
            uint8_t grid[8];
            grid8(kiln_iq2s_grid, qs[l] | ((qh[ib32] << (8 - 2 * l)) & 0x300), grid);
            for (int j = 0; j < 8; j++) y[j] = dl * (float)grid[j] * (signs[l] & kmask_iq2xs[j] ? -1.f : 1.f);
            y += 8;
        }
        qs += 4;
        signs += 4;
    }
}

void kiln_dtype_dequant_iq3_xxs(const kiln_block_iq3_xxs *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    const uint8_t *qs = b->qs, *scales_and_signs = b->qs + KILN_QK_K / 4;
    for (int ib32 = 0; ib32 < KILN_QK_K / 32; ib32++) {
        uint32_t aux32;
        memcpy(&aux32, scales_and_signs + 4 * ib32, sizeof aux32);
        const float db = d * (0.5f + (float)(aux32 >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = kiln_ksigns_iq2xs[(aux32 >> 7 * l) & 127];
            uint8_t g1[4], g2[4];
            grid4(kiln_iq3xxs_grid, qs[2 * l + 0], g1);
            grid4(kiln_iq3xxs_grid, qs[2 * l + 1], g2);
            for (int j = 0; j < 4; j++) {
                y[j + 0] = db * (float)g1[j] * (signs & kmask_iq2xs[j + 0] ? -1.f : 1.f);
                y[j + 4] = db * (float)g2[j] * (signs & kmask_iq2xs[j + 4] ? -1.f : 1.f);
            }
            y += 8;
        }
        qs += 8;
    }
}

void kiln_dtype_dequant_iq3_s(const kiln_block_iq3_s *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    const uint8_t *qs = b->qs, *qh = b->qh, *signs = b->signs;
    for (int ib32 = 0; ib32 < KILN_QK_K / 32; ib32 += 2) {
        const float db[2] = {d * (float)(1 + 2 * (b->scales[ib32 / 2] & 0xf)),
                             d * (float)(1 + 2 * (b->scales[ib32 / 2] >> 4))};
        for (int half = 0; half < 2; half++) {
            for (int l = 0; l < 4; l++) {
                uint8_t g1[4], g2[4];
                grid4(kiln_iq3s_grid, qs[2 * l + 0] | ((qh[half] << (8 - 2 * l)) & 256), g1);
                grid4(kiln_iq3s_grid, qs[2 * l + 1] | ((qh[half] << (7 - 2 * l)) & 256), g2);
                for (int j = 0; j < 4; j++) {
                    y[j + 0] = db[half] * (float)g1[j] * (signs[l] & kmask_iq2xs[j + 0] ? -1.f : 1.f);
                    y[j + 4] = db[half] * (float)g2[j] * (signs[l] & kmask_iq2xs[j + 4] ? -1.f : 1.f);
                }
                y += 8;
            }
            qs += 8;
            signs += 4;
        }
        qh += 2;
    }
}

void kiln_dtype_dequant_iq1_s(const kiln_block_iq1_s *b, float *y)
{
    const float d = kiln_f16_to_f32(b->d);
    const uint8_t *qs = b->qs;
    for (int ib = 0; ib < KILN_QK_K / 32; ib++) {
        const uint16_t qh = b->qh[ib];
        const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -IQ1S_DELTA : IQ1S_DELTA;
        for (int l = 0; l < 4; l++) {
            int8_t grid[8];
            memcpy(grid, &kiln_iq1s_grid[qs[l] | (((qh >> 3 * l) & 7) << 8)], 8);
            for (int j = 0; j < 8; j++) y[j] = dl * ((float)grid[j] + delta);
            y += 8;
        }
        qs += 4;
    }
}

void kiln_dtype_dequant_iq1_m(const kiln_block_iq1_m *b, float *y)
{
    uint16_t sc[4];
    memcpy(sc, b->scales, sizeof sc);
    const uint16_t dh = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    const float d = kiln_f16_to_f32(dh);
    const uint8_t *qs = b->qs, *qh = b->qh;
    for (int ib = 0; ib < KILN_QK_K / 32; ib++) {
        const float dl1 = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1);
        const float dl2 = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1);
        const uint16_t idx[4] = {(uint16_t)(qs[0] | ((qh[0] << 8) & 0x700)), (uint16_t)(qs[1] | ((qh[0] << 4) & 0x700)),
                                 (uint16_t)(qs[2] | ((qh[1] << 8) & 0x700)), (uint16_t)(qs[3] | ((qh[1] << 4) & 0x700))};
        const float delta[4] = {qh[0] & 0x08 ? -IQ1S_DELTA : IQ1S_DELTA, qh[0] & 0x80 ? -IQ1S_DELTA : IQ1S_DELTA,
                                qh[1] & 0x08 ? -IQ1S_DELTA : IQ1S_DELTA, qh[1] & 0x80 ? -IQ1S_DELTA : IQ1S_DELTA};
        for (int l = 0; l < 4; l++) {
            int8_t grid[8];
            memcpy(grid, &kiln_iq1s_grid[idx[l]], 8);
            const float dl = l < 2 ? dl1 : dl2;
            for (int j = 0; j < 8; j++) y[j] = dl * ((float)grid[j] + delta[l]);
            y += 8;
        }
        qs += 4;
        qh += 2;
    }
}
