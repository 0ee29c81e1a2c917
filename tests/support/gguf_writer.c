/* Test-side GGUF writer (see gguf_writer.h). Serializes header, key-values, tensor infos and
 * aligned data in one buffer. Aborts only on OOM (it is test support, never library code). */
#include "support/gguf_writer.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct buf {
    uint8_t *p;   /* bytes */
    size_t   n;   /* used */
    size_t   cap; /* allocated */
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

struct gw {
    uint32_t version, align; /* header version, data alignment */
    buf      kv, ti, data;   /* key-value section, tensor infos, tensor data */
    uint64_t n_kv, n_t;      /* counts */
};

gw *gw_new(uint32_t version, uint32_t alignment)
{
    gw *w = calloc(1, sizeof *w);
    if (!w) abort();
    w->version = version;
    w->align = alignment ? alignment : 32;
    if (alignment) gw_kv_u32(w, "general.alignment", alignment);
    return w;
}

void gw_free(gw *w)
{
    if (!w) return;
    free(w->kv.p);
    free(w->ti.p);
    free(w->data.p);
    free(w);
}

static const size_t scalar_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

void gw_kv(gw *w, const char *key, kiln_gguf_type t, const void *val)
{
    put_str(&w->kv, key);
    put_u32(&w->kv, (uint32_t)t);
    put(&w->kv, val, scalar_size[t]);
    w->n_kv++;
}
void gw_kv_u32(gw *w, const char *key, uint32_t v) { gw_kv(w, key, KILN_GGUF_U32, &v); }
void gw_kv_f32(gw *w, const char *key, float v) { gw_kv(w, key, KILN_GGUF_F32, &v); }
void gw_kv_str(gw *w, const char *key, const char *v)
{
    put_str(&w->kv, key);
    put_u32(&w->kv, KILN_GGUF_STRING);
    put_str(&w->kv, v);
    w->n_kv++;
}
void gw_kv_arr(gw *w, const char *key, kiln_gguf_type t, uint64_t n, const void *data)
{
    put_str(&w->kv, key);
    put_u32(&w->kv, KILN_GGUF_ARRAY);
    put_u32(&w->kv, (uint32_t)t);
    put_u64(&w->kv, n);
    put(&w->kv, data, (size_t)n * scalar_size[t]);
    w->n_kv++;
}
void gw_kv_arr_str(gw *w, const char *key, uint64_t n, const char *const *v)
{
    put_str(&w->kv, key);
    put_u32(&w->kv, KILN_GGUF_ARRAY);
    put_u32(&w->kv, KILN_GGUF_STRING);
    put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++) put_str(&w->kv, v[i]);
    w->n_kv++;
}

void gw_tensor(gw *w, const char *name, uint32_t ggml_type, int rank, const int64_t *dims, const void *data,
               size_t bytes)
{
    static const uint8_t zeros[256];
    while (w->data.n % w->align) put(&w->data, zeros, 1);
    put_str(&w->ti, name);
    put_u32(&w->ti, (uint32_t)rank);
    for (int d = rank - 1; d >= 0; d--) put_u64(&w->ti, (uint64_t)dims[d]);
    put_u32(&w->ti, ggml_type);
    put_u64(&w->ti, w->data.n);
    put(&w->data, data, bytes);
    w->n_t++;
}

uint8_t *gw_bytes(gw *w, size_t *n)
{
    buf b = {0};
    put_u32(&b, 0x46554747u);
    put_u32(&b, w->version);
    put_u64(&b, w->n_t);
    put_u64(&b, w->n_kv);
    put(&b, w->kv.p, w->kv.n);
    put(&b, w->ti.p, w->ti.n);
    static const uint8_t zeros[256];
    while (b.n % w->align) put(&b, zeros, 1);
    put(&b, w->data.p, w->data.n);
    *n = b.n;
    return b.p;
}

int gw_write(gw *w, const char *path)
{
    /* the same bytes as gw_bytes, written piece by piece: no second copy of a 7b model's data */
    buf h = {0};
    put_u32(&h, 0x46554747u);
    put_u32(&h, w->version);
    put_u64(&h, w->n_t);
    put_u64(&h, w->n_kv);
    put(&h, w->kv.p, w->kv.n);
    put(&h, w->ti.p, w->ti.n);
    static const uint8_t zeros[256];
    while (h.n % w->align) put(&h, zeros, 1);
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(h.p, 1, h.n, f) == h.n && (!w->data.n || fwrite(w->data.p, 1, w->data.n, f) == w->data.n) ? 0 : -1;
    if (f && fclose(f) != 0) rc = -1;
    free(h.p);
    return rc;
}

/* ---------------------------------------------------------------- random models */

static uint32_t ggml_id(kiln_dtype t)
{
    static const uint32_t id[KILN_DTYPE_COUNT] = {[KILN_DTYPE_F32] = 0, [KILN_DTYPE_F16] = 1, [KILN_DTYPE_BF16] = 30,
                                                  [KILN_DTYPE_Q8_0] = 8, [KILN_DTYPE_Q4_K] = 12,
                                                  [KILN_DTYPE_Q5_K] = 13, [KILN_DTYPE_Q6_K] = 14,
                                                  [KILN_DTYPE_Q4_0] = 2, [KILN_DTYPE_Q4_1] = 3, [KILN_DTYPE_Q5_0] = 6,
                                                  [KILN_DTYPE_Q5_1] = 7, [KILN_DTYPE_IQ4_NL] = 20, [KILN_DTYPE_Q2_K] = 10,
                                                  [KILN_DTYPE_Q3_K] = 11, [KILN_DTYPE_IQ4_XS] = 23};
    return id[t];
}

static float rngf(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) * 0x1p-23 - 1.0);
}

/* Rows [r0, r1) of a random tensor: values offset + scale * u from the generator state the first
 * of them draws from (value i of the tensor uses state s0 + (i + 1) * step, so any split of the
 * rows gives the same bytes), quantized into q. */
typedef struct rand_rows {
    kiln_dtype t;
    int64_t    cols, r0, r1;
    float      offset, scale;
    uint64_t   s0;   /* the tensor's first state */
    uint8_t   *q;    /* the tensor's bytes */
    int        fail; /* kiln_quantize failed */
} rand_rows;

static void *rand_rows_run(void *arg)
{
    rand_rows *a = arg;
    int64_t n = (a->r1 - a->r0) * a->cols;
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) abort();
    uint64_t s = a->s0 + (uint64_t)(a->r0 * a->cols) * 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; i++) v[i] = a->offset + a->scale * rngf(&s);
    if (n && kiln_quantize(a->t, v, a->q + (size_t)a->r0 * kiln_row_bytes(a->t, a->cols), n) != KILN_OK) a->fail = 1;
    free(v);
    return NULL;
}

/* A random tensor [rows, cols] (rows 0: 1-D [cols]; stack > 0: [stack, rows / stack, cols], an expert
 * stack) in dtype t, values offset + scale * u. Large tensors are drawn and quantized by up to 16
 * threads (a 7b model in minutes, not a quarter hour). */
static void rand_tensor_n(gw *w, const char *name, kiln_dtype t, int64_t stack, int64_t rows, int64_t cols, float offset,
                          float scale, uint64_t *s)
{
    if (t != KILN_DTYPE_F32 && cols % kiln_dtype_block(t)) t = cols % 32 == 0 ? KILN_DTYPE_Q8_0 : KILN_DTYPE_F16;
    int64_t nr = rows ? rows : 1, n = nr * cols;
    size_t bytes = (size_t)nr * kiln_row_bytes(t, cols);
    uint8_t *q = malloc(bytes);
    if (!q) abort();
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = n < (1 << 20) || cpus < 2 ? 1 : cpus > 16 ? 16 : (int)cpus;
    if (nt > nr) nt = (int)nr;
    rand_rows a[16];
    pthread_t th[16];
    for (int i = 0; i < nt; i++) {
        a[i] = (rand_rows){.t = t, .cols = cols, .r0 = nr * i / nt, .r1 = nr * (i + 1) / nt, .offset = offset,
                           .scale = scale, .s0 = *s, .q = q};
        if (i && pthread_create(&th[i], NULL, rand_rows_run, &a[i]) != 0) abort();
    }
    rand_rows_run(&a[0]);
    for (int i = 1; i < nt; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < nt; i++)
        if (a[i].fail) abort();
    *s += (uint64_t)n * 0x9e3779b97f4a7c15ull;
    int64_t dims[3] = {stack, stack ? rows / stack : rows, cols};
    gw_tensor(w, name, ggml_id(t), stack ? 3 : rows ? 2 : 1, stack ? dims : rows ? dims + 1 : dims + 2, q, bytes);
    free(q);
}

static void rand_tensor(gw *w, const char *name, kiln_dtype t, int64_t rows, int64_t cols, float offset, float scale,
                        uint64_t *s)
{
    rand_tensor_n(w, name, t, 0, rows, cols, offset, scale, s);
}

/* llama.cpp's use_more_bits (llama-quant.cpp): the layers whose attn_v and ffn_down a Q4_K_M file
 * keeps in q6_k. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

gw *gw_model_new(const gw_model *m)
{
    gw *w = gw_new(3, 0);
    char key[128];
    uint64_t s = m->seed;
    gw_kv_str(w, "general.architecture", m->arch);
    gw_kv_str(w, "general.name", "kiln test model");
#define ARCH_KEY(k) (snprintf(key, sizeof key, "%s." k, m->arch), key)
    gw_kv_u32(w, ARCH_KEY("block_count"), (uint32_t)(m->meta_n_layer ? m->meta_n_layer : m->n_layer));
    gw_kv_u32(w, ARCH_KEY("context_length"), (uint32_t)m->n_ctx);
    gw_kv_u32(w, ARCH_KEY("embedding_length"), (uint32_t)m->hidden);
    gw_kv_u32(w, ARCH_KEY("feed_forward_length"), (uint32_t)(m->meta_ffn ? m->meta_ffn : m->ffn));
    gw_kv_u32(w, ARCH_KEY("attention.head_count"), (uint32_t)m->n_head);
    gw_kv_u32(w, ARCH_KEY("attention.head_count_kv"), (uint32_t)m->n_kv_head);
    gw_kv_f32(w, ARCH_KEY("rope.freq_base"), m->theta > 0 ? m->theta : strcmp(m->arch, "llama") != 0 ? 1e6f : 1e4f);
    if (m->head_dim) {
        gw_kv_u32(w, ARCH_KEY("attention.key_length"), (uint32_t)m->head_dim);
        gw_kv_u32(w, ARCH_KEY("attention.value_length"), (uint32_t)m->head_dim);
    }
    if (!m->no_eps) gw_kv_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    if (m->rope_scale > 0) {
        gw_kv_str(w, ARCH_KEY("rope.scaling.type"), m->yarn ? "yarn" : "linear");
        gw_kv_f32(w, ARCH_KEY("rope.scaling.factor"), m->rope_scale);
    }
    if (m->window > 0) gw_kv_u32(w, ARCH_KEY("attention.sliding_window"), (uint32_t)m->window);
    if (m->n_rot > 0) gw_kv_u32(w, ARCH_KEY("rope.dimension_count"), (uint32_t)m->n_rot);
    if (m->n_ctx_orig > 0) gw_kv_u32(w, ARCH_KEY("rope.scaling.original_context_length"), (uint32_t)m->n_ctx_orig);
    if (m->rope_attn_factor > 0) gw_kv_f32(w, ARCH_KEY("rope.scaling.attn_factor"), m->rope_attn_factor);
    if (m->theta_swa > 0) gw_kv_f32(w, ARCH_KEY("rope.freq_base_swa"), m->theta_swa);
    if (m->attn_softcap > 0) gw_kv_f32(w, ARCH_KEY("attn_logit_softcapping"), m->attn_softcap);
    if (m->final_softcap > 0) gw_kv_f32(w, ARCH_KEY("final_logit_softcapping"), m->final_softcap);
    bool qwen_moe = strcmp(m->arch, "qwen2moe") == 0 || strcmp(m->arch, "qwen3moe") == 0;
    bool shexp = strcmp(m->arch, "qwen2moe") == 0;
    if (m->n_expert > 0) {
        gw_kv_u32(w, ARCH_KEY("expert_count"), (uint32_t)m->n_expert);
        gw_kv_u32(w, ARCH_KEY("expert_used_count"), (uint32_t)m->n_expert_used);
    }
    if (m->ffn_exp > 0) gw_kv_u32(w, ARCH_KEY("expert_feed_forward_length"), (uint32_t)m->ffn_exp);
    if (m->ffn_shexp > 0) gw_kv_u32(w, ARCH_KEY("expert_shared_feed_forward_length"), (uint32_t)m->ffn_shexp);
#undef ARCH_KEY
    if (m->tokens) {
        char **tok = malloc((size_t)m->n_vocab * sizeof *tok);
        if (!tok) abort();
        for (int64_t i = 0; i < m->n_vocab; i++) {
            tok[i] = malloc(24);
            if (!tok[i]) abort();
            snprintf(tok[i], 24, "t%lld", (long long)i);
        }
        gw_kv_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)m->n_vocab, (const char *const *)tok);
        for (int64_t i = 0; i < m->n_vocab; i++) free(tok[i]);
        free(tok);
    }
    bool bias = strcmp(m->arch, "qwen2") == 0 || strcmp(m->arch, "qwen2moe") == 0 || m->qkv_bias;
    bool qk_norm = strcmp(m->arch, "qwen3") == 0 || strcmp(m->arch, "qwen3moe") == 0 || strcmp(m->arch, "gemma3") == 0 ||
                   m->qk_norm;
    int64_t fe = m->ffn_exp > 0 ? m->ffn_exp : qwen_moe && m->n_expert_used ? m->ffn / m->n_expert_used : m->ffn;
    int64_t fs = m->ffn_shexp > 0 ? m->ffn_shexp : m->ffn;
    bool post_norms = strcmp(m->arch, "gemma2") == 0 || strcmp(m->arch, "gemma3") == 0, fused = strcmp(m->arch, "phi3") == 0;
    bool mix = m->q4_k_m && m->wtype == KILN_DTYPE_Q4_K;
    int64_t hd = m->head_dim ? m->head_dim : m->hidden / m->n_head, qd = m->n_head * hd, kvd = m->n_kv_head * hd;
    if (m->rope_freqs) rand_tensor(w, "rope_freqs.weight", KILN_DTYPE_F32, 0, (m->n_rot > 0 ? m->n_rot : hd) / 2, 4.0f, 3.5f, &s);
    if (m->longrope) { /* long factors larger on average than short ones, as in the released files */
        rand_tensor(w, "rope_factors_long.weight", KILN_DTYPE_F32, 0, (m->n_rot > 0 ? m->n_rot : hd) / 2, 8.0f, 7.0f, &s);
        rand_tensor(w, "rope_factors_short.weight", KILN_DTYPE_F32, 0, (m->n_rot > 0 ? m->n_rot : hd) / 2, 2.0f, 1.0f, &s);
    }
    rand_tensor(w, "token_embd.weight", m->embtype, m->n_vocab, m->hidden, 0, 1.0f, &s);
    float sh = 1.0f / sqrtf((float)m->hidden), sq = 1.0f / sqrtf((float)qd), sf = 1.0f / sqrtf((float)m->ffn);
    for (int l = 0; l < m->n_layer; l++) {
        char n[96];
#define T(name) (snprintf(n, sizeof n, "blk.%d." name, l), n)
        rand_tensor(w, T("attn_norm.weight"), KILN_DTYPE_F32, 0, m->hidden, 1.0f, 0.125f, &s);
        if (fused) {
            rand_tensor(w, T("attn_qkv.weight"), m->wtype, qd + 2 * kvd, m->hidden, 0, sh, &s);
        } else {
            rand_tensor(w, T("attn_q.weight"), m->wtype, qd, m->hidden, 0, sh, &s);
            rand_tensor(w, T("attn_k.weight"), m->wtype, kvd, m->hidden, 0, sh, &s);
            rand_tensor(w, T("attn_v.weight"), mix && more_bits(l, m->n_layer) ? KILN_DTYPE_Q6_K : m->wtype, kvd,
                        m->hidden, 0, sh, &s);
        }
        if (bias) {
            rand_tensor(w, T("attn_q.bias"), KILN_DTYPE_F32, 0, qd, 0, 0.5f, &s);
            rand_tensor(w, T("attn_k.bias"), KILN_DTYPE_F32, 0, kvd, 0, 0.5f, &s);
            rand_tensor(w, T("attn_v.bias"), KILN_DTYPE_F32, 0, kvd, 0, 0.5f, &s);
        }
        if (qk_norm) {
            rand_tensor(w, T("attn_q_norm.weight"), KILN_DTYPE_F32, 0, hd, 1.0f, 0.25f, &s);
            rand_tensor(w, T("attn_k_norm.weight"), KILN_DTYPE_F32, 0, hd, 1.0f, 0.25f, &s);
        }
        rand_tensor(w, T("attn_output.weight"), m->wtype, m->hidden, qd, 0, sq, &s);
        if (m->out_bias) rand_tensor(w, T("attn_output.bias"), KILN_DTYPE_F32, 0, m->hidden, 0, 0.5f, &s);
        if (post_norms) rand_tensor(w, T("post_attention_norm.weight"), KILN_DTYPE_F32, 0, m->hidden, 1.0f, 0.25f, &s);
        rand_tensor(w, T("ffn_norm.weight"), KILN_DTYPE_F32, 0, m->hidden, 1.0f, 0.125f, &s);
        if (m->n_expert > 0) { /* the router (f32, as llama.cpp keeps it), then the expert stacks */
            float sr = sh * (m->router_scale > 0 ? m->router_scale : 1.0f), se = 1.0f / sqrtf((float)fe);
            rand_tensor(w, T("ffn_gate_inp.weight"), KILN_DTYPE_F32, m->n_expert, m->hidden, 0, sr, &s);
            rand_tensor_n(w, T("ffn_gate_exps.weight"), m->wtype, m->n_expert, m->n_expert * fe, m->hidden, 0, sh, &s);
            rand_tensor_n(w, T("ffn_up_exps.weight"), m->wtype, m->n_expert, m->n_expert * fe, m->hidden, 0, sh, &s);
            rand_tensor_n(w, T("ffn_down_exps.weight"), m->wtype, m->n_expert, m->n_expert * m->hidden, fe, 0, se, &s);
            if (shexp) {
                rand_tensor(w, T("ffn_gate_inp_shexp.weight"), KILN_DTYPE_F32, 0, m->hidden, 0, sh * 4, &s);
                rand_tensor(w, T("ffn_gate_shexp.weight"), m->wtype, fs, m->hidden, 0, sh, &s);
                rand_tensor(w, T("ffn_up_shexp.weight"), m->wtype, fs, m->hidden, 0, sh, &s);
                rand_tensor(w, T("ffn_down_shexp.weight"), m->wtype, m->hidden, fs, 0, 1.0f / sqrtf((float)fs), &s);
            }
        } else if (fused) {
            rand_tensor(w, T("ffn_up.weight"), m->wtype, 2 * m->ffn, m->hidden, 0, sh, &s);
        } else {
            rand_tensor(w, T("ffn_gate.weight"), m->wtype, m->ffn, m->hidden, 0, sh, &s);
            rand_tensor(w, T("ffn_up.weight"), m->wtype, m->ffn, m->hidden, 0, sh, &s);
        }
        if (m->n_expert <= 0)
            rand_tensor(w, T("ffn_down.weight"), mix && more_bits(l, m->n_layer) ? KILN_DTYPE_Q6_K : m->wtype, m->hidden,
                        m->ffn, 0, sf, &s);
        if (post_norms) rand_tensor(w, T("post_ffw_norm.weight"), KILN_DTYPE_F32, 0, m->hidden, 1.0f, 0.25f, &s);
        if (m->ffn_bias) {
            rand_tensor(w, T("ffn_gate.bias"), KILN_DTYPE_F32, 0, m->ffn, 0, 0.5f, &s);
            rand_tensor(w, T("ffn_up.bias"), KILN_DTYPE_F32, 0, m->ffn, 0, 0.5f, &s);
            rand_tensor(w, T("ffn_down.bias"), KILN_DTYPE_F32, 0, m->hidden, 0, 0.5f, &s);
        }
#undef T
    }
    rand_tensor(w, "output_norm.weight", KILN_DTYPE_F32, 0, m->hidden, 1.0f, 0.125f, &s);
    if (!m->tied) rand_tensor(w, "output.weight", mix ? KILN_DTYPE_Q6_K : m->wtype, m->n_vocab, m->hidden, 0, sh, &s);
    return w;
}

int gw_model_write(const gw_model *m, const char *path)
{
    gw *w = gw_model_new(m);
    int rc = gw_write(w, path);
    gw_free(w);
    return rc;
}
