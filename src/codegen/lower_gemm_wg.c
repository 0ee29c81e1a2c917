/* The Hopper GEMM template (sm_90a): TMA stages x and the weights into a ring of swizzled shared
 * buffers, consumer warpgroups multiply them with warpgroup MMA, a producer warpgroup keeps the ring
 * full (or decodes block weights into it); tile shape and cluster chosen from the problem (kl_gw_shape,
 * kl_gw_cluster); the epilogue drains through shared memory into gemv's per-element epilogue. The
 * mma.sync template, the rms and split kernels and the entry are in lower_gemm.c. Must not know any
 * target's syntax. */
#include "codegen/lower_gemm_int.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ Hopper: TMA + warpgroup MMA */

/* With wg (sm_90a, 16-bit weights): 384 threads, consumer warpgroups 0 and 1 and a producer
 * warpgroup 2, whose first thread has the TMA engine bring each 64-k stage (x's parts: bm rows of
 * 128 bytes each, then the weights: 128 rows) into a ring of `stages` buffers in dynamic shared
 * memory, 128-byte swizzled, signalling a `full` mbarrier per stage with the bytes landed. Consumer
 * warpgroup c owns rows c * rc .. c * rc + rc - 1 (rc = 64 or 128: one or two W64 accumulators,
 * wgmma m64n128k16 straight from the swizzled tiles) and releases a stage through its `empty`
 * mbarrier once the WGMMAs reading it have retired, one stage behind (wait_group 1). The epilogue
 * writes the accumulators into a C tile in the stage memory and runs gemv's per-element epilogue
 * with every thread. */
#define GW_BK 64           /* k per stage: 64 halves = 128 bytes, the swizzle's and the TMA box's width */
#define GW_THREADS 384     /* two consumer warpgroups and the producer */
#define GW_STAGE_MAX 231424 /* dynamic shared bytes for the ring (227 KB less 1 KB of mbarriers) */
#define GW_BLOCK_NREG_C 200 /* block weights, rc 128: setmaxnreg of the consumers and of the decoding producer */
#define GW_BLOCK_NREG_P 112
#define GW_ROUND 2         /* block weights: stages a producer round decodes (4 chunks in flight a stage: 4 stages spilled) */


/* Byte address of stage s (I32) of the ring, and of its full (which 0) / empty (1) mbarrier. */
static uint32_t gw_stage(gm *g, uint32_t s) { return addu(g, g->ring, to_u(g, muli(g, s, (int32_t)g->sb))); }
static uint32_t gw_bar(gm *g, int which, uint32_t s) { return addu(g, g->bars, to_u(g, muli(g, addi(g, s, which * g->stages), 8))); }

void kl_gw_sync(gm *g, enum kiln_kop op, uint32_t a, uint32_t b, int32_t imm)
{
    kiln_kir_op(g->k, op, KILN_KT_NONE, a, b, KILN_IDX_NONE, imm);
}

/* One TMA box of map m: {dst, mbarrier, k, row}; mask: KILN_IDX_NONE, or the U32 CTA mask of a
 * multicast into the cluster's blocks */
static void gw_tma(gm *g, uint32_t m, uint32_t dst, uint32_t bar, uint32_t kcoord, uint32_t row, uint32_t mask)
{
    kiln_kir *k = g->k;
    uint32_t v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, KILN_IDX_NONE, dst, KILN_IDX_NONE, 0);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, bar, KILN_IDX_NONE, 1);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, to_u(g, kcoord), KILN_IDX_NONE, 2);
    v = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v, to_u(g, row), KILN_IDX_NONE, 3);
    kiln_kir_op(k, KILN_KOP_TMA_LOAD, KILN_KT_NONE, v, mask, KILN_IDX_NONE, (int32_t)m);
}

/* Stage kt's slot in the ring (I32) and the parity (*ph) of its round. */
static uint32_t gw_slot(gm *g, uint32_t kt, uint32_t *ph)
{
    *ph = andi(g, o2(g, KILN_KOP_DIV, kt, ci(g, g->stages)), 1);
    return o2(g, KILN_KOP_REM, kt, ci(g, g->stages));
}

/* x's boxes of stage kt (its parts, bm rows each) into slot s, landing on mbarrier full. */
static void gw_x_boxes(gm *g, uint32_t s, uint32_t full, uint32_t kt)
{
    for (int q = 0; q < g->parts; q++)
        gw_tma(g, g->xmap, addu(g, gw_stage(g, s), cu(g, (uint32_t)(q * g->bm * 128))), full, muli(g, kt, GW_BK),
               g->xp ? addi(g, g->m0, q * (int32_t)g->s->m_max) : g->m0, KILN_IDX_NONE);
}

/* The producer's one thread: for each stage, wait until the consumers released it, expect its
 * bytes and start its boxes. */
static void gw_producer(gm *g, const gv_group *G, const uint32_t wmap[2], int32_t nk)
{
    kiln_kir *k = g->k;
    uint32_t kt = kiln_kvar(k, ci(g, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kt, ci(g, nk), ci(g, 1), 0);
    uint32_t ph, s = gw_slot(g, kt, &ph);
    kl_gw_sync(g, KILN_KOP_MBAR_WAIT, gw_bar(g, 1, s), o2(g, KILN_KOP_XOR, ph, ci(g, 1)), 0); /* a fresh barrier passes parity 1 */
    uint32_t full = gw_bar(g, 0, s), st = gw_stage(g, s), k0 = muli(g, kt, GW_BK);
    kl_gw_sync(g, KILN_KOP_MBAR_ARRIVE, full, KILN_IDX_NONE, (int32_t)g->sb);
    gw_x_boxes(g, s, full, kt);
    if (g->cm > 1) { /* this block's slice of each weight tile, into every block of the cluster */
        int32_t sl = g->bns / g->cm;
        uint32_t mask = cu(g, (1u << g->cm) - 1), r0 = muli(g, g->crank, sl);
        for (int sp = 0; sp < G->n_sib; sp++) {
            uint32_t dst = addu(g, st, to_u(g, muli(g, addi(g, r0, g->parts * g->bm + sp * g->bns), 128)));
            gw_tma(g, wmap[sp], dst, full, k0, add(g, g->n0, r0), mask);
        }
    } else {
        for (int sp = 0; sp < G->n_sib; sp++)
            gw_tma(g, wmap[sp], addu(g, st, cu(g, (uint32_t)((g->parts * g->bm + sp * g->bns) * 128))), full, k0, g->n0, KILN_IDX_NONE);
    }
    kl_loop_end(k);
}

/* The 16 values of sub-step sub of a loaded block-weight chunk (bc its index) in f16, as 8 words
 * of value pairs: the format's f16-pair decoder (kl_wfmt.gemm_h2: no int->float conversions), else
 * its f32 values, two to a PACK2 (sm_90 converts 16 values a clock an SM: two conversions a value
 * kept the one producer warpgroup from feeding the tensor cores). */
static void gw_chunk_words(gm *g, const gv_chunk *ch, uint32_t bc, int sub, uint32_t w[8])
{
    const kl_wfmt *f = kl_wfmt_of(g->wt);
    if (f->gemm_h2 && g->s->tgt->opts.gemm_pairs != KILN_GEMM_OFF) {
        f->gemm_h2(g->k, ch, bc, sub, w);
        return;
    }
    uint32_t val[16];
    kl_gm_chunk_values(g, ch, bc, sub, val);
    for (int p = 0; p < 8; p++) w[p] = kiln_kir_op(g->k, KILN_KOP_PACK2, KILN_KT_U32, val[2 * p], val[2 * p + 1], KILN_IDX_NONE, 0);
}

/* Block weights: the producer warpgroup's 128 threads decode each stage's weight tile (128 rows x
 * 64 k: 4 pieces of 16 values a thread) with gemv's decoders into f16 in the swizzled layout the
 * TMA would give, rounds of GW_ROUND stages whose chunk loads are all issued first; thread 256
 * also brings x by TMA. A stage's full mbarrier takes that thread's expect_tx and all 128 threads'
 * arrivals after their stores (and the proxy fence that shows them to WGMMA). */
static void gw_producer_blocks(gm *g, const gv_group *G, int32_t nk)
{
    kiln_kir *k = g->k;
    gv *s = g->s;
    uint32_t pt = addi(g, g->tid, -256), lead = o2(g, KILN_KOP_EQ, pt, ci(g, 0));
    uint32_t wrow[2], piece[2], rword[2], swz[2], slot[2];
    for (int j = 0; j < 2; j++) { /* item j: B rows 64 j .. 64 j + 63 (sibling j of two), 16 values at k 16 piece */
        uint32_t i = addi(g, pt, 128 * j), r = o2(g, KILN_KOP_OR, muli(g, shri(g, i, 4), 8), andi(g, i, 7));
        int sp = G->n_sib == 2 ? j : 0;
        piece[j] = andi(g, shri(g, i, 3), 1);
        wrow[j] = o2(g, KILN_KOP_MIN, add(g, g->n0, addi(g, r, -sp * g->bns)), ci(g, (int32_t)(G->n - 1)));
        rword[j] = muli(g, r, 32);
        swz[j] = andi(g, r, 7);
        slot[j] = kiln_kir_buf(k, KILN_KBUF_NODE, s->g->nodes[s->mm[G->sib[sp]]].src[1], false);
    }
    uint32_t kr = kiln_kvar(k, ci(g, 0));
    /* two accumulators leave registers for one stage of chunks in flight (two spilled), when the
     * format's k-period fits a stage */
    const int round = g->rc == 128 && g->U <= 2 ? 1 : GW_ROUND;
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kr, ci(g, nk), ci(g, round), 0);
    gv_chunk ch[2 * GW_ROUND][2];
    uint32_t bc[2 * GW_ROUND][2];
    for (int t = 0; t < 2 * round; t++) /* the round's tiles of 32 k: every load in flight before the first decode */
        for (int j = 0; j < 2; j++) {
            if (t % g->U) { /* the U tiles of a k-period are sub-steps of the same chunks: loaded once */
                ch[t][j] = ch[t - t % g->U][j], bc[t][j] = bc[t - t % g->U][j];
                continue;
            }
            bc[t][j] = kl_wfmt_of(g->wt)->gemm_chunk(k, addi(g, muli(g, kr, GW_BK), 32 * t), piece[j]);
            kl_gv_load_chunk(s, g->wt, slot[j], wrow[j], bc[t][j], G->n, &ch[t][j]);
        }
    for (int st = 0; st < round; st++) {
        uint32_t kt = addi(g, kr, st);
        uint32_t ph, sidx = gw_slot(g, kt, &ph);
        kl_gw_sync(g, KILN_KOP_MBAR_WAIT, gw_bar(g, 1, sidx), o2(g, KILN_KOP_XOR, ph, ci(g, 1)), 0);
        uint32_t full = gw_bar(g, 0, sidx);
        kif(g, lead);
        kl_gw_sync(g, KILN_KOP_MBAR_ARRIVE, full, KILN_IDX_NONE, g->parts * g->bm * 128);
        gw_x_boxes(g, sidx, full, kt);
        kendif(g);
        uint32_t bword = addi(g, muli(g, sidx, (int32_t)(g->sb / 4)), g->parts * g->bm * 32); /* the B tile, in words */
        for (int tt = 0; tt < 2; tt++) {
            int t = 2 * st + tt;
            for (int j = 0; j < 2; j++) {
                uint32_t word[8];
                gw_chunk_words(g, &ch[t][j], bc[t][j], t % g->U, word);
                for (int c = 0; c < 2; c++) { /* 16-byte chunk 4 tt + 2 piece + c of the row, swizzled */
                    uint32_t v4 = KILN_IDX_NONE;
                    for (int pp = 0; pp < 4; pp++) v4 = kiln_kir_op(k, KILN_KOP_SETLANE, KILN_KT_V4, v4, word[4 * c + pp], KILN_IDX_NONE, pp);
                    uint32_t chunk = o2(g, KILN_KOP_XOR, addi(g, muli(g, piece[j], 2), 4 * tt + c), swz[j]);
                    sts4(g, add(g, add(g, bword, rword[j]), muli(g, chunk, 4)), v4);
                }
            }
        }
        kl_gw_sync(g, KILN_KOP_FENCE_ASYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0);
        kl_gw_sync(g, KILN_KOP_MBAR_ARRIVE, full, KILN_IDX_NONE, 0);
    }
    kl_loop_end(k);
}

/* n-tiles of a consumer's accumulators (128 columns each, the last one narrower: 64 with bn 192,
 * 48 with bn 176) and the accumulator of m-tile mt, n-tile nt (at most GW_ACC: two m-tiles x two
 * n-tiles with wide, else rc 128 x bn 128 or rc 64 x bn <= 256). */
#define GW_ACC 4
static int gw_nn(const gm *g) { return (g->bn + 127) / 128; }
static int gw_ncols(const gm *g, int nt) { return g->bn - 128 * nt < 128 ? g->bn - 128 * nt : 128; }
static int gw_acc(const gm *g, int mt, int nt) { return mt * gw_nn(g) + nt; }

/* A consumer warpgroup: its accumulators += its rows of x . the weights, stage by stage; it0 (I32):
 * the ring's count of stages before its first (pp: the block's earlier tiles' stages), else 0. */
static void gw_consumer(gm *g, const uint32_t acc[GW_ACC], int32_t nk, uint32_t it0, uint32_t handoff, uint32_t other)
{
    kiln_kir *k = g->k;
    uint32_t wg = shri(g, g->tid, 7);
    /* byte offset of this warpgroup's rows in an A tile (pp: a stage holds its rows alone) */
    uint32_t arow = g->pp ? cu(g, 0) : to_u(g, muli(g, wg, g->rc * 128));
    int32_t flags = (1024 / 16) << 8 | 2 | (g->bf ? 1 : 0); /* SBO 1024 (8 rows of 128 bytes), swizzled */
    uint32_t kt = kiln_kvar(k, ci(g, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kt, ci(g, nk), ci(g, 1), 0);
    uint32_t ph, s = gw_slot(g, add(g, it0, kt), &ph);
    kl_gw_sync(g, KILN_KOP_MBAR_WAIT, gw_bar(g, 0, s), ph, 0);
    if (g->pp) { /* every stage of this tile has landed: the other warpgroup's waits on the next tile's are unambiguous */
        kif(g, o2(g, KILN_KOP_PAND, o2(g, KILN_KOP_EQ, kt, ci(g, nk - 1)), handoff));
        kiln_kir_op(k, KILN_KOP_NBAR_ARRIVE, KILN_KT_NONE, other, KILN_IDX_NONE, KILN_IDX_NONE, 256 << 8);
        kendif(g);
    }
    uint32_t st = gw_stage(g, s);
    kl_gw_sync(g, KILN_KOP_WG_FENCE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    for (int q = 0; q < g->parts; q++)
        for (int ks = 0; ks < GW_BK / 16; ks++)
            for (int mt = 0; mt < g->rc / 64; mt++)
                for (int nt = 0; nt < gw_nn(g); nt++) { /* n-tile nt: B rows 128 nt .. (128 bytes a row) */
                    uint32_t a = addu(g, addu(g, st, arow), cu(g, (uint32_t)(q * g->bm * 128 + mt * 64 * 128 + ks * 32)));
                    uint32_t b = addu(g, st, cu(g, (uint32_t)((g->parts * g->bm + 128 * nt) * 128 + ks * 32)));
                    int n = gw_ncols(g, nt);
                    kiln_kir_op(k, KILN_KOP_WGMMA, KILN_KT_NONE, acc[gw_acc(g, mt, nt)], a, b, flags | (n < 128 ? (n / 16) << 4 : 0));
                }
    kl_gw_sync(g, KILN_KOP_WG_COMMIT, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kl_gw_sync(g, KILN_KOP_WG_WAIT, KILN_IDX_NONE, KILN_IDX_NONE, 1); /* the previous stage's WGMMAs have retired */
    kif(g, o2(g, KILN_KOP_LT, ci(g, 0), kt));
    uint32_t empty = gw_bar(g, 1, o2(g, KILN_KOP_REM, addi(g, add(g, it0, kt), g->stages - 1), ci(g, g->stages)));
    if (g->cm > 1) { /* every block of the cluster writes into this stage: each warp tells each of them */
        kif(g, o2(g, KILN_KOP_EQ, g->lane, ci(g, 0)));
        for (int r = 0; r < g->cm; r++) kl_gw_sync(g, KILN_KOP_MBAR_ARRIVE_CL, empty, cu(g, (uint32_t)r), 0);
        kendif(g);
    } else {
        kl_gw_sync(g, KILN_KOP_MBAR_ARRIVE, empty, KILN_IDX_NONE, 0);
    }
    kendif(g);
    kl_loop_end(k);
    kl_gw_sync(g, KILN_KOP_WG_WAIT, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    if (g->pp) /* the tile's last stage, for the other warpgroup's tiles (the kernel's end frees it otherwise) */
        kl_gw_sync(g, KILN_KOP_MBAR_ARRIVE, gw_bar(g, 1, o2(g, KILN_KOP_REM, addi(g, it0, nk - 1), ci(g, g->stages))), KILN_IDX_NONE, 0);
}

/* The epilogue's per-token values (positions of the rope and KV writes, as f32 and i32) and rope
 * frequency tables of the region, staged in a shared array of their own so that the drain reads
 * them with shared loads: loaded from global memory inside its loop they left the QKV drain
 * latency-bound (a load or two in flight a warp, 16 iterations). Sets G->st; returns the words. */
static uint32_t gw_stage_plan(gm *G)
{
    gv *s = G->s;
    const kiln_graph *g = s->g;
    gv_unit *u = &G->st;
    uint32_t words = 0;
    u->n_st = 0;
    for (uint32_t i = 0; i < s->r->n_nodes; i++) {
        uint32_t id = s->r->nodes[i];
        const kiln_node_rec *n = &g->nodes[id];
        uint32_t node[2] = {KILN_IDX_NONE, KILN_IDX_NONE};
        int kind[2] = {0, 0};
        if (n->op == KILN_OP_ROPE) node[0] = n->src[1], kind[0] = 0, node[1] = id, kind[1] = 2;
        if (n->op == KILN_OP_KV_SCATTER) node[0] = n->src[2], kind[0] = 1;
        for (int j = 0; j < 2; j++) {
            if (node[j] == KILN_IDX_NONE) continue;
            bool seen = false;
            for (int q = 0; q < u->n_st; q++) seen = seen || (u->st_node[q] == node[j] && u->st_kind[q] == kind[j]);
            int32_t len = kind[j] == 2 ? (int32_t)(n->dims[n->rank - 1] / 2) : G->bm;
            if (seen || u->n_st == 4 || (kind[j] == 2 && (len < 1 || len > 256))) continue;
            u->st_node[u->n_st] = node[j], u->st_kind[u->n_st] = kind[j], u->st_off[u->n_st++] = (int32_t)words;
            words += (uint32_t)len;
        }
    }
    return words;
}

/* Each staged value into G->st's array (before the barrier that precedes the drain). */
static void gw_stage_values(gm *g)
{
    gv *s = g->s;
    const gv_unit *u = &g->st;
    for (int i = 0; i < u->n_st; i++) {
        const kiln_node_rec *n = &s->g->nodes[u->st_node[i]];
        if (u->st_kind[i] == 2) { /* the rope's frequencies: the table its epilogue reads */
            int32_t half = (int32_t)(n->dims[n->rank - 1] / 2);
            kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, half)));
            uint32_t v = kiln_kld(g->k, kl_rope_table(g->k, n, n->dims[n->rank - 1]), g->tid);
            kiln_kir_op(g->k, KILN_KOP_STS, KILN_KT_NONE, addi(g, g->tid, u->st_off[i]), v, KILN_IDX_NONE, (int32_t)u->st_arr);
            kendif(g);
            continue;
        }
        uint32_t row = add(g, g->m0, g->tid);
        kif(g, o2(g, KILN_KOP_PAND, o2(g, KILN_KOP_LT, g->tid, ci(g, g->bm)), o2(g, KILN_KOP_LT, row, g->m)));
        uint32_t v = kl_gv_token_raw(s, u->st_node[i], row, u->st_kind[i] == 1);
        kiln_kir_op(g->k, KILN_KOP_STS, KILN_KT_NONE, addi(g, g->tid, u->st_off[i]), v, KILN_IDX_NONE, (int32_t)u->st_arr);
        kendif(g);
    }
}

/* The accumulators into the C tile (the ring's memory, every load retired), then gemv's epilogue
 * over all bm rows with every thread; with wide, the consumers' 256 threads alone, meeting at named
 * barrier 1 (the producer warpgroup has left). */
static void gw_epilogue(gm *g, const gv_group *G, const uint32_t acc[GW_ACC])
{
    const int32_t consumers = 1 | 256 << 8; /* named barrier 1, 256 threads */
    if (g->nreg_c) kl_gw_sync(g, KILN_KOP_NBAR_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, consumers); /* both warpgroups' WGMMAs retired: the ring is free */
    else kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, 256)));
    uint32_t wg = shri(g, g->tid, 7), w = andi(g, shri(g, g->tid, 5), 3);
    uint32_t gq = shri(g, g->lane, 2), qq = andi(g, g->lane, 3);
    uint32_t r0 = add(g, add(g, muli(g, wg, g->rc), muli(g, w, 16)), gq);
    for (int mt = 0; mt < g->rc / 64; mt++)
        for (int nt = 0; nt < gw_nn(g); nt++)
            for (int j = 0; j < gw_ncols(g, nt) / 2; j++) {
                uint32_t row = addi(g, r0, mt * 64 + 8 * ((j >> 1) & 1));
                uint32_t col = addi(g, muli(g, qq, 2), 128 * nt + 8 * (j >> 2) + (j & 1));
                sts(g, add(g, muli(g, row, g->cs), col), op1(g, KILN_KOP_LANE, KILN_KT_F32, acc[gw_acc(g, mt, nt)], j));
            }
    if (!g->nreg_c) kendif(g);
    gw_stage_values(g);
    if (g->nreg_c) kl_gw_sync(g, KILN_KOP_NBAR_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, consumers);
    else barrier(g);
    int threads = g->threads;
    if (g->nreg_c) g->threads = 256;
    kl_gm_drain(g, G, 0, g->bm);
    g->threads = threads;
}

/* The slots of a register unit as static column offsets from its first column (off) and the
 * first columns a thread's fragment gives it (base: static parts, 2 qq is added), or false where a
 * rope partner lies in another thread's fragment (neox with hd / 2 not a multiple of 8). Slots are
 * rope partners (normal: adjacent columns, slots 0-1 and 2-3; neox: + hd / 2, slots 0-2 and 1-3) or
 * the same columns of each sibling (siblings outermost, as kl_gm_drain orders them). */
#define GW_BASES 32 /* first columns of a thread's register units: bns / 8 at most */
static bool gw_reg_units(const gm *g, const gv_group *G, int off[SLOTS], int base[GW_BASES], int *n_base)
{
    int cols = G->cols, half = (int)(G->hd / 2);
    *n_base = 0;
    if (G->rope && G->rot < G->hd) return false; /* partial rope: pass-through units (kl_gv_slot_col) keep the C tile */
    if (G->rope == 2) {
        if (half % 8 || g->bns % G->hd || cols != 4) return false;
        off[0] = 0, off[1] = 1, off[2] = half, off[3] = half + 1;
        for (int b = 0; b < g->bns; b += 8)
            if (b % G->hd < half) base[(*n_base)++] = b;
        return true;
    }
    if (cols == 4) {
        if (g->bns % 16) return false; /* a unit's columns 8 and 9 would be the next sibling's */
        off[0] = 0, off[1] = 1, off[2] = 8, off[3] = 9;
        for (int b = 0; b < g->bns; b += 16) base[(*n_base)++] = b;
        return true;
    }
    if (cols == 2) {
        off[0] = 0, off[1] = 1;
        for (int b = 0; b < g->bns; b += 8) base[(*n_base)++] = b;
        return true;
    }
    return false;
}

/* The epilogue straight from the accumulators (codegen.gemm_epilogue = KILN_GEMM_ON): each
 * consumer thread runs gemv's per-element epilogue on units made of its own fragment values (rows
 * r0 and r0 + 8 of each 64-row tile, columns 2 qq + 8 jj + {0, 1}): no C tile, no barrier, no
 * division. Built because the layer's QKV (rope + KV writes) runs 38 us longer than the plain GEMM
 * of its shape; measured on the H100 (ncu, real clocks, 512-token llama-7b layer) it is no faster
 * than the C-tile drain (QKV 157.5 vs 156.5 us, O 44 vs 40, down 97.7 vs 93: its stores fill 13 of
 * 32 bytes a sector), so the drain stays the default. Both are latency-bound with the tensor cores
 * idle; the lever is running the epilogue under another tile's MMAs (a persistent ping-pong of the
 * consumer warpgroups, which needs this per-thread form). */
static bool gw_epilogue_regs(gm *g, const gv_group *G, const uint32_t acc[GW_ACC])
{
    int off[SLOTS], base[GW_BASES], n_base;
    /* not for block weights: the decoders' registers beside the unrolled epilogue passed the
       384-thread cap of 168 (ptxas spilled a q8_0 QKV with PDL, 64 rows a consumer); wide tiles
       run it inside the consumers' branch */
    if (g->wblock || (g->bn != GM_BN && !g->wide && !g->pp) || !gw_reg_units(g, G, off, base, &n_base)) return false;
    gv *s = g->s;
    bool inside = g->wide || g->pp; /* already in the consumers' branch */
    if (!inside) kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, 256)));
    uint32_t wg = shri(g, g->tid, 7), w = andi(g, shri(g, g->tid, 5), 3);
    uint32_t gq = shri(g, g->lane, 2), qq2 = muli(g, andi(g, g->lane, 3), 2);
    uint32_t r0 = add(g, g->m0, add(g, add(g, g->pp ? ci(g, 0) : muli(g, wg, g->rc), muli(g, w, 16)), gq));
    uint32_t c0 = add(g, g->n0, qq2);
    gv_unit unit = {.mc = 1}, *e = &unit;
    for (int mt = 0; mt < g->rc / 64; mt++)
        for (int hh = 0; hh < 2; hh++)
            for (int b = 0; b < n_base; b++) {
                e->t0 = addi(g, r0, mt * 64 + 8 * hh);
                e->n_slots = 0;
                for (int q = 0; q < G->n_sib; q++)
                    for (int c = 0; c < G->cols; c++) {
                        int r = e->n_slots++, tc = q * g->bns + base[b] + off[c]; /* tile column less 2 qq */
                        e->slot_sib[r] = G->sib[q];
                        e->slot_delta[r] = c;
                        e->col[r] = addi(g, c0, base[b] + off[c]);
                        e->ok[r] = o2(g, KILN_KOP_LT, e->col[r], ci(g, (int32_t)G->n));
                        e->acc[r][0] = op1(g, KILN_KOP_LANE, KILN_KT_F32, acc[gw_acc(g, mt, tc / 128)], (tc % 128 / 8) << 2 | hh << 1 | (tc & 1));
                    }
                kl_gv_epilogue(s, G, e, g->m);
            }
    if (!inside) kendif(g);
    return true;
}

/* The weights' tensor maps of group G (one a sibling): boxes of 64 k x bns / cm rows. */
static void gw_wmaps(gm *g, const gv_group *G, uint32_t wmap[2])
{
    gv *s = g->s;
    wmap[0] = wmap[1] = KILN_IDX_NONE;
    for (int sp = 0; !g->wblock && sp < G->n_sib; sp++) {
        uint32_t slot = kiln_kir_buf(g->k, KILN_KBUF_NODE, s->g->nodes[s->mm[G->sib[sp]]].src[1], false);
        kiln_ktmap m = {.slot = slot, .inner = (uint32_t)s->K, .outer = (uint32_t)G->n, .stride = (uint32_t)s->K * 2,
                        .box_inner = GW_BK, .box_outer = (uint16_t)(g->bns / g->cm)};
        wmap[sp] = kiln_kir_tmap(g->k, &m);
    }
}

/* Tile t of the persistent grid (I32): its first row into g->m0 and its column block over all the
 * groups (returned); rows fastest, so the tiles in flight share few weight tiles (rt: I32 row tiles
 * of the run). */
static uint32_t gw_pp_tile(gm *g, uint32_t t, uint32_t rt)
{
    g->m0 = muli(g, o2(g, KILN_KOP_REM, t, rt), g->rc);
    return o2(g, KILN_KOP_DIV, t, rt);
}

/* Word of the partial sums of split kq (I32) of the tile at row tile rb, column block cb (I32). */
static uint32_t gw_part_tile(gm *g, uint32_t kq, uint32_t cb, uint32_t rb, int32_t nb)
{
    uint32_t t = add(g, muli(g, add(g, muli(g, kq, nb), cb), g->rt_max), rb);
    return addi(g, muli(g, t, g->rc * g->bn), g->part_word);
}

/* Element j of n-tile nt of m-tile mt of a consumer thread's accumulators: its row and column in the
 * tile (the WGMMA fragment: rows w 16 + lane / 4 + 8 ((j >> 1) & 1), columns 2 (lane & 3) + 8 (j >> 2) + (j & 1)). */
static uint32_t gw_frag_word(gm *g, int mt, int nt, int j)
{
    uint32_t w = andi(g, shri(g, g->tid, 5), 3), gq = shri(g, g->lane, 2), qq = andi(g, g->lane, 3);
    uint32_t row = addi(g, add(g, muli(g, w, 16), gq), mt * 64 + 8 * ((j >> 1) & 1));
    uint32_t col = addi(g, muli(g, qq, 2), 128 * nt + 8 * (j >> 2) + (j & 1));
    return add(g, muli(g, row, g->bn), col);
}

/* Column blocks of group q (bns = bn / its siblings columns each). */
static int32_t gw_pp_blocks(const gm *g, int q)
{
    const gv_group *G = &g->s->grp[q];
    int bns = g->bn / G->n_sib;
    return (int32_t)((G->n + bns - 1) / bns);
}

/* Opens `if cb is one of group q's column blocks` (first: cb0) and sets g->bns, g->n0 for it. */
static void gw_pp_group_if(gm *g, int q, uint32_t cb, int32_t cb0)
{
    g->bns = g->bn / g->s->grp[q].n_sib;
    kif(g, o2(g, KILN_KOP_PAND, o2(g, KILN_KOP_LE, ci(g, cb0), cb), o2(g, KILN_KOP_LT, cb, ci(g, cb0 + gw_pp_blocks(g, q)))));
    g->n0 = muli(g, addi(g, cb, -cb0), g->bns);
}

/* The register epilogue of column block cb (I32, over all the groups) on the accumulators. */
static void gw_pp_epilogue(gm *g, const uint32_t acc[GW_ACC], uint32_t cb)
{
    gv *s = g->s;
    for (int q = 0, cb0 = 0; q < s->n_grp; cb0 += gw_pp_blocks(g, q), q++) {
        gw_pp_group_if(g, q, cb, cb0);
        if (!gw_epilogue_regs(g, &s->grp[q], acc)) s->failed = true, snprintf(s->why, sizeof s->why, "persistent gemm without a register epilogue");
        kendif(g);
    }
}

/* The persistent ping-pong GEMM (g->pp), every group of the region: block pb takes tiles pb + j grid
 * for j < nl (column blocks of the groups one after another); the producer thread brings their stages
 * in that order into the ring (stage j nk + kt of the block), consumer warpgroup c multiplies tiles
 * j = c, c + 2, ... and runs its group's register epilogue on each while the other warpgroup
 * multiplies the next (the ring's order makes them take turns). */
void kl_gw_pp(gm *g)
{
    kiln_kir *k = g->k;
    gv *s = g->s;
    uint32_t zero = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_W64, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    int32_t nb = (int32_t)kl_gw_col_blocks(s, g->bn);
    uint32_t rt = o2(g, KILN_KOP_DIV, addi(g, g->m, g->rc - 1), ci(g, g->rc)); /* row tiles of this run */
    uint32_t nt = muli(g, muli(g, rt, nb), g->ks); /* split kq of column block cb, row tile rb: (kq nb + cb) rt + rb */
    uint32_t pslot = g->ks > 1 ? kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, true) : KILN_IDX_NONE;
    kif(g, o2(g, KILN_KOP_LT, g->pb, nt));
    uint32_t nl = o2(g, KILN_KOP_DIV, addi(g, o2(g, KILN_KOP_SUB, nt, g->pb), g->grid - 1), ci(g, g->grid)); /* the block's tiles */
    kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, 256)));
    kl_gw_sync(g, KILN_KOP_SETMAXNREG, KILN_IDX_NONE, KILN_IDX_NONE, 1 << 16 | 240);
    /* Turns: a warpgroup starts a tile's waits after the other has passed its last wait of the tile
     * before (named barrier 2 + c is warpgroup c's turn, 256 threads: its sync and the other's
     * arrive). A full mbarrier's parity names its phase only while the waiter is at most one round
     * ahead: tile j's first stages share slots with tile j - 1's last ones. Warpgroup 0 goes first. */
    uint32_t c = shri(g, g->tid, 7), mine = addi(g, c, 2), other = o2(g, KILN_KOP_SUB, ci(g, 3), c);
    kif(g, o2(g, KILN_KOP_EQ, c, ci(g, 0)));
    kiln_kir_op(k, KILN_KOP_NBAR_ARRIVE, KILN_KT_NONE, mine, KILN_IDX_NONE, KILN_IDX_NONE, 256 << 8);
    kendif(g);
    uint32_t j = kiln_kvar(k, c);
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, j, nl, ci(g, 2), 0);
    uint32_t cb = gw_pp_tile(g, add(g, g->pb, muli(g, j, g->grid)), rt);
    uint32_t acc[GW_ACC];
    for (int i = 0; i < GW_ACC; i++) acc[i] = i < g->rc / 64 * gw_nn(g) ? kiln_kvar(k, zero) : KILN_IDX_NONE;
    kiln_kir_op(k, KILN_KOP_NBAR_SYNC, KILN_KT_NONE, mine, KILN_IDX_NONE, KILN_IDX_NONE, 256 << 8);
    gw_consumer(g, acc, g->nks, muli(g, j, g->nks), o2(g, KILN_KOP_LT, addi(g, j, 1), nl), other);
    if (g->ks > 1) { /* the split's partial sums, every element of the tile (kiln_gemm_reduce masks) */
        uint32_t pw = gw_part_tile(g, o2(g, KILN_KOP_DIV, cb, ci(g, nb)), o2(g, KILN_KOP_REM, cb, ci(g, nb)), o2(g, KILN_KOP_DIV, g->m0, ci(g, g->rc)), nb);
        for (int mt = 0; mt < g->rc / 64; mt++)
            for (int n_t = 0; n_t < gw_nn(g); n_t++)
                for (int e = 0; e < gw_ncols(g, n_t) / 2; e++) {
                    uint32_t v = op1(g, KILN_KOP_LANE, KILN_KT_F32, acc[gw_acc(g, mt, n_t)], e);
                    kiln_kir_op(k, KILN_KOP_ST, KILN_KT_NONE, add(g, pw, gw_frag_word(g, mt, n_t, e)), op1(g, KILN_KOP_BITCAST, KILN_KT_U32, v, 0),
                                KILN_IDX_NONE, (int32_t)pslot);
                }
    }
    if (g->ks == 1) gw_pp_epilogue(g, acc, cb); /* ks 1: cb is the column block */
    kl_loop_end(k);
    kiln_kelse(k);
    kl_gw_sync(g, KILN_KOP_SETMAXNREG, KILN_IDX_NONE, KILN_IDX_NONE, 24);
    kif(g, o2(g, KILN_KOP_EQ, g->tid, ci(g, 256)));
    uint32_t wmap[KILN_SPEC_MM][2];
    for (int q = 0; q < s->n_grp; q++) {
        g->bns = g->bn / s->grp[q].n_sib;
        gw_wmaps(g, &s->grp[q], wmap[q]);
    }
    uint32_t jp = kiln_kvar(k, ci(g, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, jp, nl, ci(g, 1), 0);
    uint32_t cbp = gw_pp_tile(g, add(g, g->pb, muli(g, jp, g->grid)), rt);
    uint32_t k0 = muli(g, o2(g, KILN_KOP_DIV, cbp, ci(g, nb)), g->nks); /* the split's first stage of K */
    cbp = o2(g, KILN_KOP_REM, cbp, ci(g, nb));
    uint32_t kt = kiln_kvar(k, ci(g, 0));
    kiln_kir_op(k, KILN_KOP_LOOP, KILN_KT_NONE, kt, ci(g, g->nks), ci(g, 1), 0);
    uint32_t ph, sl = gw_slot(g, add(g, muli(g, jp, g->nks), kt), &ph);
    kl_gw_sync(g, KILN_KOP_MBAR_WAIT, gw_bar(g, 1, sl), o2(g, KILN_KOP_XOR, ph, ci(g, 1)), 0); /* a fresh barrier passes parity 1 */
    uint32_t full = gw_bar(g, 0, sl), st = gw_stage(g, sl), ka = add(g, k0, kt);
    kl_gw_sync(g, KILN_KOP_MBAR_ARRIVE, full, KILN_IDX_NONE, (int32_t)g->sb);
    gw_x_boxes(g, sl, full, ka);
    for (int q = 0, cb0 = 0; q < s->n_grp; cb0 += gw_pp_blocks(g, q), q++) {
        gw_pp_group_if(g, q, cbp, cb0);
        for (int sp = 0; sp < s->grp[q].n_sib; sp++)
            gw_tma(g, wmap[q][sp], addu(g, st, cu(g, (uint32_t)((g->parts * g->bm + sp * g->bns) * 128))), full, muli(g, ka, GW_BK), g->n0,
                   KILN_IDX_NONE);
        kendif(g);
    }
    kl_loop_end(k);
    kl_loop_end(k);
    kendif(g);
    kendif(g);
    kendif(g);
}

/* kiln_gemm_reduce (pp with ks > 1): a block of 128 threads a tile (grid: row tiles at the bound x
 * column blocks) sums the splits' partials of each of its threads' fragment elements into
 * accumulators of the WGMMA layout and runs the group's register epilogue on them, as the GEMM's
 * consumer would have. Row tiles past the run's rows do nothing. */
void kl_gw_reduce(const gm *G0, kiln_kir *k)
{
    gm G = *G0, *g = &G;
    gv *s = g->s;
    g->k = k;
    s->k = k;
    g->threads = 128;
    g->tid = kiln_kir_op(k, KILN_KOP_TID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    g->lane = andi(g, g->tid, 31);
    g->m = o2(g, KILN_KOP_DIV, kl_numel_from(k, &s->g->nodes[s->x], 0), ci(g, (int32_t)s->K));
    uint32_t t = kiln_kir_op(k, KILN_KOP_BID, KILN_KT_I32, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    int32_t nb = (int32_t)kl_gw_col_blocks(s, g->bn);
    uint32_t rb = o2(g, KILN_KOP_REM, t, ci(g, g->rt_max)), cb = o2(g, KILN_KOP_DIV, t, ci(g, g->rt_max));
    g->m0 = muli(g, rb, g->rc);
    uint32_t pslot = kiln_kir_buf(k, KILN_KBUF_SCRATCH, 0, false);
    uint32_t zero = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_W64, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    kif(g, o2(g, KILN_KOP_LT, g->m0, g->m));
    uint32_t acc[GW_ACC];
    for (int i = 0; i < GW_ACC; i++) acc[i] = i < g->rc / 64 * gw_nn(g) ? kiln_kvar(k, zero) : KILN_IDX_NONE;
    for (int mt = 0; mt < g->rc / 64; mt++)
        for (int n_t = 0; n_t < gw_nn(g); n_t++)
            for (int e = 0; e < gw_ncols(g, n_t) / 2; e++) {
                uint32_t fw = gw_frag_word(g, mt, n_t, e), sum = KILN_IDX_NONE;
                for (int kq = 0; kq < g->ks; kq++) {
                    uint32_t v = op1(g, KILN_KOP_BITCAST, KILN_KT_F32, kiln_kld(k, pslot, add(g, gw_part_tile(g, ci(g, kq), cb, rb, nb), fw)), 0);
                    sum = kq ? o2(g, KILN_KOP_ADD, sum, v) : v;
                }
                kiln_kir_op(k, KILN_KOP_WSET, KILN_KT_NONE, acc[gw_acc(g, mt, n_t)], sum, KILN_IDX_NONE, e);
            }
    gw_pp_epilogue(g, acc, cb);
    kendif(g);
    k->grid[0] = (uint32_t)(g->rt_max * nb);
    snprintf(k->what, sizeof k->what, "gemm: the sums of %d splits of K + epilogue", g->ks);
}

void kl_gw_group(gm *g, const gv_group *G)
{
    kiln_kir *k = g->k;
    gv *s = g->s;
    uint32_t zero = kiln_kir_op(k, KILN_KOP_CONST, KILN_KT_W64, KILN_IDX_NONE, KILN_IDX_NONE, KILN_IDX_NONE, 0);
    uint32_t acc[GW_ACC];
    /* wide: the accumulators live from inside the consumers' branch, after their setmaxnreg (zeroed
       before it, their 176 registers passed the 168 of the code before it: ptxas spilled) */
    for (int i = 0; i < GW_ACC; i++) acc[i] = !g->nreg_c && i < g->rc / 64 * gw_nn(g) ? kiln_kvar(k, zero) : KILN_IDX_NONE;
    int32_t nk = (int32_t)((s->K + GW_BK - 1) / GW_BK); /* a last half stage reads zeros past K */
    uint32_t wmap[2];
    gw_wmaps(g, G, wmap);
    kif(g, o2(g, KILN_KOP_LT, g->tid, ci(g, 256)));
    if (g->nreg_c) kl_gw_sync(g, KILN_KOP_SETMAXNREG, KILN_IDX_NONE, KILN_IDX_NONE, 1 << 16 | g->nreg_c);
    for (int i = 0; g->nreg_c && i < g->rc / 64 * gw_nn(g); i++) acc[i] = kiln_kvar(k, zero);
    gw_consumer(g, acc, nk, ci(g, 0), KILN_IDX_NONE, KILN_IDX_NONE);
    if (g->nreg_c && !(g->s->tgt->opts.gemm_epilogue == KILN_GEMM_ON && gw_epilogue_regs(g, G, acc)))
        gw_epilogue(g, G, acc); /* the consumers alone: the producer's registers are gone */
    kiln_kelse(k);
    if (g->nreg_c) kl_gw_sync(g, KILN_KOP_SETMAXNREG, KILN_IDX_NONE, KILN_IDX_NONE, g->nreg_p);
    if (g->wblock) {
        gw_producer_blocks(g, G, nk);
    } else {
        kif(g, o2(g, KILN_KOP_EQ, g->tid, ci(g, 256)));
        gw_producer(g, G, wmap, nk);
        kendif(g);
    }
    kendif(g);
    if (g->nreg_c) return;
    if (g->s->tgt->opts.gemm_epilogue == KILN_GEMM_ON && gw_epilogue_regs(g, G, acc)) return;
    barrier(g); /* every stage consumed: the ring's memory is free */
    gw_epilogue(g, G, acc);
}

/* The ring, its mbarriers and the x tensor map of kernel k (G->wg), initialized by thread 0. */
void kl_gw_setup(gm *G, kiln_kir *k)
{
    gv *s = G->s;
    G->sb = (uint32_t)((G->parts * G->bm + G->bn) * 128);
    if (G->pp) G->st.n_st = 0; /* the register epilogue reads its values itself */
    uint32_t st_words = G->pp ? 0 : gw_stage_plan(G), st_bytes = (st_words * 4 + 1023) / 1024 * 1024; /* arrays are 1024-aligned */
    G->stages = (int)((GW_STAGE_MAX - st_bytes) / G->sb);
    if (G->stages > 6) G->stages = 6;
    uint32_t ring_words = (uint32_t)G->stages * G->sb / 4;
    if (ring_words < (uint32_t)(G->bm * G->cs)) ring_words = (uint32_t)(G->bm * G->cs); /* the C tile */
    G->sh = kiln_kir_shared(k, ring_words);
    uint32_t mb = kiln_kir_shared(k, (uint32_t)(4 * G->stages));
    if (G->st.n_st) G->st.st_arr = kiln_kir_shared(k, st_words);
    k->dyn_shared = true;
    G->ring = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, ci(G, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)G->sh);
    G->bars = kiln_kir_op(k, KILN_KOP_SADDR, KILN_KT_U32, ci(G, 0), KILN_IDX_NONE, KILN_IDX_NONE, (int32_t)mb);
    kiln_ktmap xm = {.slot = G->xs, .word = G->xp ? (uint32_t)G->xp_word : 0, .inner = (uint32_t)s->K,
                     .outer = (uint32_t)(s->m_max * (G->xp ? G->parts : 1)), .stride = (uint32_t)s->K * 2, .box_inner = GW_BK,
                     .box_outer = (uint16_t)G->bm};
    G->xmap = kiln_kir_tmap(k, &xm);
    kif(G, o2(G, KILN_KOP_EQ, G->tid, ci(G, 0)));
    for (int i = 0; i < G->stages; i++) {
        kl_gw_sync(G, KILN_KOP_MBAR_INIT, gw_bar(G, 0, ci(G, i)), KILN_IDX_NONE, G->wblock ? 129 : 1); /* the producer's arrive(s) + the bytes */
        /* every consumer thread, or with a cluster each consumer warp of each of its blocks */
        kl_gw_sync(G, KILN_KOP_MBAR_INIT, gw_bar(G, 1, ci(G, i)), KILN_IDX_NONE, G->pp ? 128 : G->cm > 1 ? 8 * G->cm : 256);
    }
    kl_gw_sync(G, KILN_KOP_FENCE_ASYNC, KILN_IDX_NONE, KILN_IDX_NONE, 1); /* the inits, visible to the TMA engine */
    kendif(G);
    if (G->cm > 1) kl_gw_sync(G, KILN_KOP_CLUSTER_SYNC, KILN_IDX_NONE, KILN_IDX_NONE, 0); /* every block's barriers ready */
    else barrier(G);
}



/* Whether the TMA template takes the region (sm_90a, the compile's choice, 16-bit weights of one
 * type, x in at most two parts that a TMA can read: as it comes, or prepared by the rms or split
 * kernel): sets G->wg, bf, parts, xp; returns whether a split kernel must prepare x. */
bool kl_gw_choose(gm *G, const kiln_lower_target *tg)
{
    gv *s = G->s;
    G->wg = false;
    if (!tg->wgmma || tg->opts.wgmma == KILN_GEMM_OFF || s->K % 8) return false; /* on by default on sm_90 */
    bool floats = false;
    G->wblock = false;
    for (int q = 0; q < s->n_grp; q++) {
        kiln_dtype t = wdtype(s, s->grp[q].sib[0]);
        const kl_wfmt *f = kl_wfmt_of(t);
        if (is_float_w(t)) {
            if (floats && (t == KILN_DTYPE_BF16) != G->bf) return false;
            floats = true;
            G->bf = t == KILN_DTYPE_BF16;
        } else if (f->block && f->gemm_chunk && s->K % (GW_BK * GW_ROUND) == 0 && (2 * GW_ROUND) % f->subs == 0) { /* whole rounds */
            G->wblock = true;
        } else {
            return false;
        }
    }
    if (floats && G->wblock) return false; /* one producer kind a kernel */
    for (int q = 0; floats && q < s->n_grp; q++)
        for (int j = 0; j < s->grp[q].n_sib; j++)
            if (!kl_tma_aligned(s->g, s->g->nodes[s->mm[s->grp[q].sib[j]]].src[1])) return false; /* the weights' map */
    if (G->wblock) G->bf = false;
    /* x read by the TMA as it is: already the MMA's type, no norm, and a map can start where it does
     * (else the split kernel copies it into the scratch) */
    bool x_exact = s->norm == KILN_IDX_NONE && s->xdt == (G->bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F16) && kl_tma_aligned(s->g, s->x);
    G->parts = G->wblock ? 1 : kl_gm_x_parts(s, G->bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F16, x_exact);
    if (G->parts > 2) return false;
    if (s->norm != KILN_IDX_NONE) {
        kl_gm_prepare(G);
        G->wg = G->xp;
        if (G->wg) G->threads = GW_THREADS;
        return false;
    }
    G->wg = true;
    G->threads = GW_THREADS;
    if (x_exact) return false; /* the TMA reads x's node */
    if (s->m_max * s->K / 2 >= ((int64_t)1 << 29) / 3) return G->wg = false, false;
    G->xp = true;
    G->xp_word = 0;
    G->xp_part = (int32_t)(s->m_max * s->K / 2);
    return true;
}

/* Column blocks of the region with bn columns a block (each group's siblings share them). */
int64_t kl_gw_col_blocks(const gv *s, int bn)
{
    int64_t b = 0;
    for (int q = 0; q < s->n_grp; q++) b += (s->grp[q].n + bn / s->grp[q].n_sib - 1) / (bn / s->grp[q].n_sib);
    return b;
}

/* Whether bn columns a block suit every group: wider than GM_BN only for TMA weights (the block
 * decoders write 128 rows) in one part, no clusters, and a neox head inside a sibling's columns. */
static bool gw_cols_ok(const gm *G, int bn, const kiln_lower_target *tg)
{
    if (bn == GM_BN) return true;
    if (G->wblock || G->parts != 1 || tg->opts.gemm_cluster > 1) return false;
    for (int q = 0; q < G->s->n_grp; q++) {
        const gv_group *Gq = &G->s->grp[q];
        if (bn % (8 * Gq->n_sib) || (Gq->rope == 2 && (bn / Gq->n_sib) % Gq->hd)) return false;
    }
    return true;
}

/* The block's tile: rows per consumer (rc 64 or 128) and columns (bn 128, 192 or 256; with rc 128
 * also 144, 160 or 176: wide). A stage brings (bm + bn) x 128 bytes from L2 for bm x bn x 64 MACs:
 * the tile's rate goes as bm bn / (bm + bn) (measured on the H100: 256 x 128 tiles 1.33x the rate of
 * 128 x 128 ones, as the ratio says), and its time as waves of the grid (whole waves: the last one
 * takes as long as a full one) times bm + bn. 128 x 256 tiles (two n-tiles a consumer) measured
 * slower than 256 x 128 ones at every shape (4096^3 564 vs 592, 512 x 22016 x 4096 509 vs 553
 * TFLOP/s), so only codegen.gemm_cols asks for them; 128 x 192 ran 512 x 12288 x 4096 at 510 vs
 * 475. The wide tiles are for a grid whose last wave is mostly empty: llama-7b's 512-token gate/up
 * (2 x 11008 columns) takes 344 blocks of 256 x 128 (2.6 waves on 132 SMs, 85% of the SMs busy),
 * or 252 of 256 x 176 (88 columns of each sibling; 1.9 waves): 199 -> 159 us on the H100, the
 * layer 0.520 -> 0.488 ms; 4096 tokens: gate/up 1356 -> 1207 us, QKV (256 x 144) 933 -> 900.
 * codegen.gemm_rows 64 / gemm_cols force a side. */
void kl_gw_shape(gm *G, const kiln_lower_target *tg)
{
    gv *s = G->s;
    int64_t sms = tg->sm_count ? tg->sm_count : 132;
    static const int cand[][2] = {{64, 128}, {128, 128}, {64, 192}, {64, 256}, {128, 144}, {128, 160}, {128, 176}, {128, 192}};
    bool residual = false; /* an add in the epilogue: its drain reads a global value per element */
    for (uint32_t i = 0; i < s->r->n_nodes; i++) residual = residual || s->g->nodes[s->r->nodes[i]].op == KILN_OP_ADD;
    int64_t best = -1;
    G->rc = 64, G->bn = GM_BN;
    for (int c = 0; c < (int)(sizeof cand / sizeof cand[0]); c++) {
        int rc = cand[c][0], bn = cand[c][1];
        if (rc == 128 && (G->parts != 1 || s->m_max <= 128 || tg->opts.gemm_rows == 64)) continue;
        if (tg->opts.gemm_cols ? bn != tg->opts.gemm_cols : bn == 256) continue; /* 256: measured slower at every shape */
        /* wide tiles drain with the 256 consumer threads alone: a residual's loads left the
           4096-token O GEMM slower on them (279 vs 255 us), so they are for other epilogues */
        if (!tg->opts.gemm_cols && rc == 128 && bn > GM_BN && residual) continue;
        if (!gw_cols_ok(G, bn, tg)) continue;
        int64_t blocks = kl_gw_col_blocks(s, bn) * ((s->m_max + 2 * rc - 1) / (2 * rc));
        int64_t cost = (blocks + sms - 1) / sms * (2 * rc + bn);
        if (best < 0 || cost < best) best = cost, G->rc = rc, G->bn = bn;
    }
    G->bm = 2 * G->rc;
    G->apart = G->bm * 16;
    G->wide = G->rc == 128 && G->bn > GM_BN;
    /* block weights at rc 128: two accumulators (128 registers) and the consumers' addressing passed
       the 168 of a thread of 384 (ptxas spilled llama-7b's q4_K gate/up); the producer decodes in
       fewer: 2 x 128 x GW_BLOCK_NREG_C + 128 x GW_BLOCK_NREG_P = 64 K registers */
    G->nreg_c = G->wide ? 240 : G->wblock && G->rc == 128 ? GW_BLOCK_NREG_C : 0;
    G->nreg_p = G->wide ? 24 : G->wblock && G->rc == 128 ? GW_BLOCK_NREG_P : 0;
}

/* The persistent ping-pong form (codegen.gemm_persist): one group of TMA weights, no cluster, a
 * register epilogue for its columns. A consumer warpgroup's tile is rc rows x bn columns; a stage
 * then brings parts rc + bn rows of 128 bytes for rc bn 64 MACs: per stage the tensor cores take
 * about rc bn / 16 cycles of an SM and L2 about 4.6 (parts rc + bn) at the 6.5 TB/s it gave the
 * non-persistent GEMM, the slower of the two sets a tile's time, and an SM runs ceil(tiles / SMs)
 * of them one after another (the epilogues hidden under the other warpgroup's tiles). Sets G->pp
 * with its tile, the grid (at most one block an SM) and bm = rc; false leaves G as it was. */
bool kl_gw_persist(gm *G, const kiln_lower_target *tg)
{
    gv *s = G->s;
    G->pp = false;
    if (tg->opts.gemm_persist == KILN_GEMM_OFF || !G->wg || G->wblock || G->cm > 1) return false;
    int64_t sms = tg->sm_count ? tg->sm_count : 132;
    static const int cand[][2] = {{64, 128}, {64, 192}, {64, 256}, {128, 128}, {128, 144}, {128, 160}, {128, 176}};
    gm T = *G, keep = *G;
    double best = -1;
    int64_t best_tiles = 0;
    for (int c = 0; c < (int)(sizeof cand / sizeof cand[0]); c++) {
        int rc = cand[c][0], bn = cand[c][1];
        if ((tg->opts.gemm_cols && bn != tg->opts.gemm_cols) || (rc == 128 && tg->opts.gemm_rows == 64)) continue;
        if (!gw_cols_ok(G, bn, tg)) continue;
        T.rc = rc, T.bn = bn;
        bool units = true;
        for (int q = 0; q < s->n_grp; q++) {
            int off[SLOTS], base[GW_BASES], n_base;
            T.bns = bn / s->grp[q].n_sib;
            units = units && gw_reg_units(&T, &s->grp[q], off, base, &n_base);
        }
        if (!units) continue;
        int64_t tiles = (s->m_max + rc - 1) / rc * kl_gw_col_blocks(s, bn);
        double mma = rc * bn / 16.0, l2 = 4.6 * (G->parts * rc + bn);
        double cost = (double)((tiles + sms - 1) / sms) * (mma > l2 ? mma : l2);
        if (best < 0 || cost < best) best = cost, best_tiles = tiles, G->rc = rc, G->bn = bn;
    }
    if (best < 0) return false;
    G->pp = true;
    G->wide = false;
    G->nreg_c = G->nreg_p = 0; /* kl_gw_pp sets its own */
    G->bm = G->rc;
    G->apart = G->bm * 16;
    G->cs = G->bn + 4;
    /* splits of K where the tiles leave most SMs idle (few rows: the weights' stream sets the time) */
    int32_t nk = (int32_t)((s->K + GW_BK - 1) / GW_BK);
    G->ks = 1;
    if (tg->opts.gemm_splitk != KILN_GEMM_OFF && best_tiles * 2 <= sms) {
        int64_t ks = sms / best_tiles;
        if (ks > 8) ks = 8;
        if (ks > nk / 4) ks = nk / 4;
        if (ks > 1) {
            G->nks = (int32_t)((nk + ks - 1) / ks);
            G->ks = (int)((nk + G->nks - 1) / G->nks); /* no empty split */
        }
    }
    if (G->ks == 1) G->nks = nk;
    if (G->ks == 1 && tg->opts.gemm_persist != KILN_GEMM_ON) { /* auto: only where K splits (H100: slower elsewhere) */
        *G = keep;
        return false;
    }
    G->rt_max = (int32_t)((s->m_max + G->rc - 1) / G->rc);
    best_tiles *= G->ks;
    G->grid = (int32_t)(best_tiles < sms ? best_tiles : sms);
    return true;
}

/* Thread block clusters for TMA weights (codegen.gemm_cluster: 0 or 1 = none, 2, 4): the token-row
 * blocks of a cluster share each weight tile, so the L2 serves x + W / cm per tile instead of
 * x + W. Built on the hypothesis that the GEMM was L2-bound (6.4-7 TB/s of L2 reads at every
 * shape); measured on the H100 it was not: cluster 2 ran as fast as none (llama-7b 512-token
 * f16 layer 0.679 vs 0.686 ms, 512 x 12288 x 4096 458 vs 464 TFLOP/s), cluster 4 slower (0.857
 * ms), so it is opt-in. Needs as many row blocks as the cluster has (else smaller), and weight
 * slices of whole 8-row atoms. */
void kl_gw_cluster(gm *G, const kiln_lower_target *tg)
{
    gv *s = G->s;
    int want = tg->opts.gemm_cluster == 2 ? 2 : tg->opts.gemm_cluster == 4 ? 4 : 1;
    int64_t rows = (s->m_max + G->bm - 1) / G->bm;
    int sib = 1;
    for (int q = 0; q < s->n_grp; q++) sib = s->grp[q].n_sib > sib ? s->grp[q].n_sib : sib;
    while (want > 1 && (G->wblock || G->bn != GM_BN || rows < want || (GM_BN / sib) % (8 * want))) want /= 2;
    G->cm = want;
}

