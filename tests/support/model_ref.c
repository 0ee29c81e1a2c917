/* f64 reference forward of llama-family GGUF models (see model_ref.h): embedding [x sqrt(hidden):
 * gemma 1/2/3], per layer rms_norm -> q/k/v (+bias; phi3: rows of attn_qkv) -> [per-head q/k norm] ->
 * rope (gemma's local layers: their own base) -> causal GQA attention [soft-capped, windowed] -> output
 * (+bias) [post-norm] -> residual, rms_norm -> gate/up (+bias; phi3: halves of ffn_up) ->
 * silu(gate)*up [gemma: gelu_tanh] -> down (+bias) [post-norm] -> residual; final norm, head
 * [soft-capped]; mixtures of experts (llama with experts, qwen2moe with its shared expert, qwen3moe): the
 * routed experts only, as llama.cpp's build_moe_ffn. Written from llama.cpp's graphs; must not call
 * kiln's model builder or graph API. */
#include "support/model_ref.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mref {
    const kiln_gguf *f;
    char            *err;
    size_t           nerr;
    const char      *arch;
    int64_t          hidden, n_head, n_kv, hd, ffn, vocab, n_layer, window;
    int64_t          n_rot; /* rotary dims of a head (rope.dimension_count, default hd) */
    double           eps, theta, freq_scale;
    double           theta_swa;    /* gemma's local layers' base (rope.freq_base_swa; gemma 3: 10000, gemma 2: theta) */
    bool             swa_unscaled; /* gemma 3's local layers rotate unscaled (gemma 2's as the global ones) */
    bool             neox;
    double          *freq_factors; /* [n_rot/2] or NULL (rope_freqs, or longrope's long or short factors) */
    double           mscale;       /* rotated dims times it (rope.scaling.attn_factor, and yarn's mscale; 1) */
    bool             yarn;         /* rope.scaling.type yarn: ggml's rope_yarn with ext_factor 1 */
    float            corr[2];      /* yarn's correction dims (ggml_rope_yarn_corr_dims) */
    int64_t          max_ctx;      /* the plan's context: longrope takes its long factors above the original */
    bool             gemma, phi3;  /* gemma2/gemma3; phi3 */
    int              swa_pattern;  /* gemma: layers l % p < p - 1 are local (windowed, base theta_swa) */
    double           scale, attn_cap, final_cap; /* score scale; soft-caps (0: none) */
    int64_t          n_used;       /* expert_used_count (mixtures of experts) */
    double           route_gap;    /* smallest gap between the k-th and (k+1)-th router logit seen */
} mref;

/* Whether layer l attends through the window (llama.cpp's set_swa_pattern). */
static bool local_layer(const mref *m, int l)
{
    return m->window && (!m->swa_pattern || l % m->swa_pattern < m->swa_pattern - 1);
}

static void fail(mref *m, const char *fmt, ...)
{
    if (!m->err || !m->nerr || m->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, m->nerr, fmt, ap);
    va_end(ap);
}

static int64_t key_int(mref *m, const char *suffix, int64_t dflt)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    int64_t v;
    return kiln_gguf_get_i64(m->f, key, &v) == KILN_OK ? v : dflt;
}

static double key_f(mref *m, const char *suffix, double dflt)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    double v;
    return kiln_gguf_get_f64(m->f, key, &v) == KILN_OK ? v : dflt;
}

/* Tensor name dequantized to f64 (NULL when absent; *numel its element count). */
static double *tensor(mref *m, const char *name, int64_t *numel)
{
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(m->f, name, &t) != KILN_OK) return NULL;
    int64_t n = 1;
    for (int d = 0; d < t.rank; d++) n *= t.dims[d];
    float *v = malloc((size_t)n * sizeof *v);
    double *out = malloc((size_t)n * sizeof *out);
    if (!v || !out || kiln_dequantize(t.t, t.data, v, n) != KILN_OK) {
        fail(m, "cannot dequantize %s", name);
        free(v), free(out);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) out[i] = v[i];
    free(v);
    if (numel) *numel = n;
    return out;
}

static double *layer_tensor(mref *m, int l, const char *suffix)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    return tensor(m, name, NULL);
}

/* y[t, o] = sum_i x[t, i] w[o, i] (+ b[o]). */
static void matmul(const double *x, const double *w, const double *b, double *y, int64_t n, int64_t in, int64_t out)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t o = 0; o < out; o++) {
            double s = 0;
            for (int64_t i = 0; i < in; i++) s += x[t * in + i] * w[o * in + i];
            y[t * out + o] = s + (b ? b[o] : 0);
        }
}

/* rows of width d normalized by their rms, times w. */
static void rms_norm(const double *x, const double *w, double *y, int64_t rows, int64_t d, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += x[r * d + i] * x[r * d + i];
        double inv = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t i = 0; i < d; i++) y[r * d + i] = x[r * d + i] * inv * w[i];
    }
}

/* ggml_rope_yarn_corr_dim as ggml writes it, in float: the floor and ceil of it are integers the
 * reference must land on exactly as llama.cpp does (they are the definition, not a rounding). */
static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * (float)3.14159265358979323846)) / (2 * logf(base));
}

/* yarn as llama.cpp sets it up for llama/qwen2/qwen3 (llama_context: ext_factor 1, beta_fast 32,
 * beta_slow 1, n_ctx_orig from rope.scaling.original_context_length else the training context; the
 * attention factor get_mscale(factor) / (1 + 0.1 ln factor) times rope.scaling.attn_factor, which the
 * kernel's rope_yarn multiplies by 1 + 0.1 ln(1 / freq_scale) again). */
static void yarn_setup(mref *m, double factor)
{
    int n_ctx = (int)key_int(m, "rope.scaling.original_context_length", key_int(m, "context_length", 0));
    int n_dims = (int)m->n_rot;
    float start = floorf(corr_dim(n_dims, n_ctx, 32.0f, (float)m->theta));
    float end = ceilf(corr_dim(n_dims, n_ctx, 1.0f, (float)m->theta));
    m->corr[0] = fmaxf(0.0f, start);
    m->corr[1] = fminf((float)(n_dims - 1), end);
    double f = factor != 0 ? factor : 1.0;
    double get_mscale = f <= 1.0 ? 1.0 : 0.1 * log(f) + 1.0;
    m->mscale *= get_mscale / (1.0 + 0.1 * log(f)) * (1.0 + 0.1 * log(1.0 / m->freq_scale));
}

/* Rotary embedding of the first n_rot dims of one head vector at position p (the rest stay, as
 * llama.cpp's rope with n_dims = rope.dimension_count): pair i rotated by
 * p * freq_scale * theta^(-2i/n_rot) / freq_factor[i]. */
static void rope(const mref *m, double *v, int64_t p, bool local)
{
    int64_t half = m->n_rot / 2;
    bool plain = local && m->swa_unscaled; /* gemma 3's local layers: no scaling (llama.cpp's freq_scale_swa 1) */
    double base = local && m->gemma ? m->theta_swa : m->theta;
    for (int64_t i = 0; i < half; i++) {
        double ang = (double)p * (plain ? 1.0 : m->freq_scale) * pow(base, -2.0 * (double)i / (double)m->n_rot);
        if (m->freq_factors && !plain) ang /= m->freq_factors[i];
        if (m->yarn) { /* ggml's rope_yarn: the scaled (interp) and unscaled (extrap) angle mixed by the ramp */
            double extrap = ang / m->freq_scale;
            double y = ((double)i - m->corr[0]) / fmax(0.001, (double)m->corr[1] - m->corr[0]);
            double mix = 1.0 - fmin(1.0, fmax(0.0, y));
            ang = ang * (1.0 - mix) + extrap * mix;
        }
        int64_t a = m->neox ? i : 2 * i, b = m->neox ? i + half : 2 * i + 1;
        double x0 = v[a], x1 = v[b], c = cos(ang), s = sin(ang);
        v[a] = (x0 * c - x1 * s) * m->mscale;
        v[b] = (x0 * s + x1 * c) * m->mscale;
    }
}

/* Causal GQA attention over all n tokens (sliding window on local layers, soft-capped scores). */
static void attention(const mref *m, const double *q, const double *k, const double *v, double *o, int64_t n,
                      bool local)
{
    int64_t qd = m->n_head * m->hd, kvd = m->n_kv * m->hd, grp = m->n_head / m->n_kv;
    double *s = malloc((size_t)n * sizeof *s);
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < m->n_head; h++) {
            const double *qv = q + t * qd + h * m->hd;
            int64_t kh = h / grp, lo = local ? t - m->window + 1 : 0;
            if (lo < 0) lo = 0;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = lo; j <= t; j++) {
                double d = 0;
                for (int64_t i = 0; i < m->hd; i++) d += qv[i] * k[j * kvd + kh * m->hd + i];
                s[j] = d * m->scale;
                if (m->attn_cap) s[j] = m->attn_cap * tanh(s[j] / m->attn_cap);
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int64_t j = lo; j <= t; j++) sum += s[j] = exp(s[j] - mx);
            for (int64_t i = 0; i < m->hd; i++) {
                double acc = 0;
                for (int64_t j = lo; j <= t; j++) acc += s[j] * v[j * kvd + kh * m->hd + i];
                o[t * qd + h * m->hd + i] = acc / sum;
            }
        }
    free(s);
}

/* The attention half of layer l on x [n, hidden], in place. */
static void attn_half(mref *m, int l, double *x, int64_t n)
{
    int64_t H = m->hidden, qd = m->n_head * m->hd, kvd = m->n_kv * m->hd;
    double *h = malloc((size_t)(n * H) * sizeof *h), *q = malloc((size_t)(n * qd) * sizeof *q);
    double *k = malloc((size_t)(n * kvd) * sizeof *k), *v = malloc((size_t)(n * kvd) * sizeof *v);
    double *a = malloc((size_t)(n * qd) * sizeof *a), *o = malloc((size_t)(n * H) * sizeof *o);
    double *w[13] = {layer_tensor(m, l, "attn_norm.weight"), layer_tensor(m, l, "attn_q.weight"),
                     layer_tensor(m, l, "attn_k.weight"),    layer_tensor(m, l, "attn_v.weight"),
                     layer_tensor(m, l, "attn_q.bias"),      layer_tensor(m, l, "attn_k.bias"),
                     layer_tensor(m, l, "attn_v.bias"),      layer_tensor(m, l, "attn_output.weight"),
                     layer_tensor(m, l, "attn_output.bias"), layer_tensor(m, l, "attn_q_norm.weight"),
                     layer_tensor(m, l, "attn_k_norm.weight"), layer_tensor(m, l, "post_attention_norm.weight"),
                     layer_tensor(m, l, "attn_qkv.weight")};
    const double *wq = w[1], *wk = w[2], *wv = w[3];
    if (w[12]) wq = w[12], wk = w[12] + qd * H, wv = w[12] + (qd + kvd) * H; /* phi3: q, k, v rows stacked */
    rms_norm(x, w[0], h, n, H, m->eps);
    matmul(h, wq, w[4], q, n, H, qd);
    matmul(h, wk, w[5], k, n, H, kvd);
    matmul(h, wv, w[6], v, n, H, kvd);
    if (w[9]) rms_norm(q, w[9], q, n * m->n_head, m->hd, m->eps);
    if (w[10]) rms_norm(k, w[10], k, n * m->n_kv, m->hd, m->eps);
    for (int64_t t = 0; t < n; t++) {
        for (int64_t hh = 0; hh < m->n_head; hh++) rope(m, q + t * qd + hh * m->hd, t, local_layer(m, l));
        for (int64_t hh = 0; hh < m->n_kv; hh++) rope(m, k + t * kvd + hh * m->hd, t, local_layer(m, l));
    }
    attention(m, q, k, v, a, n, local_layer(m, l));
    matmul(a, w[7], w[8], o, n, qd, H);
    if (w[11]) rms_norm(o, w[11], o, n, H, m->eps);
    for (int64_t i = 0; i < n * H; i++) x[i] += o[i];
    for (int i = 0; i < 13; i++) free(w[i]);
    free(h), free(q), free(k), free(v), free(a), free(o);
}

/* y += silu(h . gate^T) * (h . up^T) . down^T over n rows: one SwiGLU expert of width F, each row
 * times wt[t] (wt NULL: 1). */
static void expert(const double *h, const double *gate, const double *up, const double *down, const double *wt,
                   double *y, int64_t n, int64_t H, int64_t F)
{
    double *g = malloc((size_t)(n * F) * sizeof *g), *u = malloc((size_t)(n * F) * sizeof *u);
    double *o = malloc((size_t)(n * H) * sizeof *o);
    matmul(h, gate, NULL, g, n, H, F);
    matmul(h, up, NULL, u, n, H, F);
    for (int64_t i = 0; i < n * F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
    matmul(g, down, NULL, o, n, F, H);
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < H; i++) y[t * H + i] += (wt ? wt[t] : 1.0) * o[t * H + i];
    free(g), free(u), free(o);
}

/* llama.cpp's build_moe_ffn (softmax gating) on h [n, hidden] into y: router logits, softmax, the
 * expert_used_count largest (first index on ties), their probabilities [over their sum: llama and
 * qwen3moe], each routed expert's SwiGLU output times its weight; qwen2moe adds its shared expert times
 * sigmoid(h . ffn_gate_inp_shexp). Notes the smallest gap between the k-th and (k+1)-th logit. */
static void moe(mref *m, int l, const double *h, double *y, int64_t n)
{
    int64_t H = m->hidden, E = 0, F = 0;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
    kiln_gguf_tensor t;
    if (kiln_gguf_tensor_get(m->f, name, &t) == KILN_OK) E = t.dims[0], F = t.dims[1];
    double *w[4] = {layer_tensor(m, l, "ffn_gate_inp.weight"), layer_tensor(m, l, "ffn_gate_exps.weight"),
                    layer_tensor(m, l, "ffn_up_exps.weight"), layer_tensor(m, l, "ffn_down_exps.weight")};
    bool norm = strcmp(m->arch, "qwen2moe") != 0; /* llama.cpp's norm_w: llama true, qwen2moe false, qwen3moe true */
    double *logit = malloc((size_t)(n * E) * sizeof *logit), *wt = malloc((size_t)n * sizeof *wt);
    bool *taken = malloc((size_t)E * sizeof *taken);
    if (!w[0] || !w[1] || !w[2] || !w[3] || E < 1 || m->n_used < 1 || m->n_used > E) {
        fail(m, "layer %d: expert tensors or expert_used_count missing", l);
    } else {
        matmul(h, w[0], NULL, logit, n, H, E);
        for (int64_t e = 0; e < E; e++) {
            for (int64_t tk = 0; tk < n; tk++) wt[tk] = 0;
            for (int64_t tk = 0; tk < n; tk++) {
                const double *z = logit + tk * E;
                double mx = -INFINITY, sum = 0, kept = 0;
                for (int64_t j = 0; j < E; j++) mx = fmax(mx, z[j]), taken[j] = false;
                for (int64_t j = 0; j < E; j++) sum += exp(z[j] - mx);
                double last = 0;
                for (int64_t r = 0; r < m->n_used; r++) {
                    int64_t best = -1;
                    for (int64_t j = 0; j < E; j++)
                        if (!taken[j] && (best < 0 || z[j] > z[best])) best = j;
                    taken[best] = true, kept += exp(z[best] - mx) / sum, last = z[best];
                }
                double next = -INFINITY; /* the best logit left out */
                for (int64_t j = 0; j < E; j++)
                    if (!taken[j]) next = fmax(next, z[j]);
                if (e == 0 && last - next < m->route_gap) m->route_gap = last - next;
                if (taken[e]) wt[tk] = exp(z[e] - mx) / sum / (norm ? kept : 1.0);
            }
            expert(h, w[1] + e * F * H, w[2] + e * F * H, w[3] + e * H * F, wt, y, n, H, F);
        }
    }
    double *sh[4] = {layer_tensor(m, l, "ffn_gate_inp_shexp.weight"), layer_tensor(m, l, "ffn_gate_shexp.weight"),
                     layer_tensor(m, l, "ffn_up_shexp.weight"), layer_tensor(m, l, "ffn_down_shexp.weight")};
    if (sh[0] && sh[1] && sh[2] && sh[3]) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_shexp.weight", l);
        int64_t Fs = kiln_gguf_tensor_get(m->f, name, &t) == KILN_OK ? t.dims[0] : 0;
        for (int64_t tk = 0; tk < n; tk++) {
            double z = 0;
            for (int64_t i = 0; i < H; i++) z += h[tk * H + i] * sh[0][i];
            wt[tk] = 1.0 / (1.0 + exp(-z));
        }
        expert(h, sh[1], sh[2], sh[3], wt, y, n, H, Fs);
    }
    for (int i = 0; i < 4; i++) free(w[i]), free(sh[i]);
    free(logit), free(wt), free(taken);
}

/* The feed-forward half of layer l on x [n, hidden], in place. */
static void ffn_half(mref *m, int l, double *x, int64_t n)
{
    char rn[96];
    snprintf(rn, sizeof rn, "blk.%d.ffn_gate_inp.weight", l);
    kiln_gguf_tensor rt;
    if (kiln_gguf_tensor_get(m->f, rn, &rt) == KILN_OK) { /* a mixture of experts */
        int64_t H = m->hidden;
        double *nw = layer_tensor(m, l, "ffn_norm.weight"), *h = malloc((size_t)(n * H) * sizeof *h);
        double *y = calloc((size_t)(n * H), sizeof *y);
        rms_norm(x, nw, h, n, H, m->eps);
        moe(m, l, h, y, n);
        for (int64_t i = 0; i < n * H; i++) x[i] += y[i];
        free(nw), free(h), free(y);
        return;
    }
    int64_t H = m->hidden, F = m->ffn;
    double *h = malloc((size_t)(n * H) * sizeof *h), *g = malloc((size_t)(n * F) * sizeof *g);
    double *u = malloc((size_t)(n * F) * sizeof *u), *o = malloc((size_t)(n * H) * sizeof *o);
    double *w[8] = {layer_tensor(m, l, "ffn_norm.weight"), layer_tensor(m, l, "ffn_gate.weight"),
                    layer_tensor(m, l, "ffn_up.weight"),   layer_tensor(m, l, "ffn_down.weight"),
                    layer_tensor(m, l, "ffn_gate.bias"),   layer_tensor(m, l, "ffn_up.bias"),
                    layer_tensor(m, l, "ffn_down.bias"),   layer_tensor(m, l, "post_ffw_norm.weight")};
    const double *wg = w[1], *wu = w[2];
    if (m->phi3) wg = w[2], wu = w[2] + F * H; /* phi3's ffn_up: gate rows, then up rows */
    rms_norm(x, w[0], h, n, H, m->eps);
    matmul(h, wg, w[4], g, n, H, F);
    matmul(h, wu, w[5], u, n, H, F);
    for (int64_t i = 0; i < n * F; i++)
        g[i] = (m->gemma ? 0.5 * g[i] * (1.0 + tanh(sqrt(2.0 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i])))
                         : g[i] / (1.0 + exp(-g[i]))) * u[i];
    matmul(g, w[3], w[6], o, n, F, H);
    if (w[7]) rms_norm(o, w[7], o, n, H, m->eps);
    for (int64_t i = 0; i < n * H; i++) x[i] += o[i];
    for (int i = 0; i < 8; i++) free(w[i]);
    free(h), free(g), free(u), free(o);
}

/* Reads the sizes and rotary settings the forward needs. */
static bool read_meta(mref *m)
{
    if (kiln_gguf_get_str(m->f, "general.architecture", &m->arch, NULL) != KILN_OK) return fail(m, "no arch"), false;
    m->neox = strcmp(m->arch, "llama") != 0; /* qwen2(moe), qwen3(moe), gemma2/3, phi3: NEOX pairing in llama.cpp */
    bool gemma2 = strcmp(m->arch, "gemma2") == 0, gemma3 = strcmp(m->arch, "gemma3") == 0;
    m->gemma = gemma2 || gemma3 || strcmp(m->arch, "gemma") == 0; /* gemma 1: no window, caps or post-norms */
    m->phi3 = strcmp(m->arch, "phi3") == 0;
    m->swa_pattern = gemma2 ? 2 : gemma3 ? 6 : 0;
    m->n_used = key_int(m, "expert_used_count", 0);
    m->hidden = key_int(m, "embedding_length", 0);
    m->n_head = key_int(m, "attention.head_count", 0);
    m->n_kv = key_int(m, "attention.head_count_kv", m->n_head);
    m->hd = key_int(m, "attention.key_length", m->n_head ? m->hidden / m->n_head : 0);
    m->ffn = key_int(m, "feed_forward_length", 0);
    m->n_layer = key_int(m, "block_count", 0);
    bool caps = gemma2 || gemma3; /* the architectures llama.cpp reads a window and soft-caps for */
    m->window = m->gemma && !caps ? 0 : key_int(m, "attention.sliding_window", gemma2 ? 4096 : 0);
    m->attn_cap = caps ? key_f(m, "attn_logit_softcapping", gemma2 ? 50.0 : 0.0) : 0;
    m->final_cap = caps ? key_f(m, "final_logit_softcapping", gemma2 ? 30.0 : 0.0) : 0;
    bool wide = (gemma2 && m->n_layer == 46) || (gemma3 && m->n_layer == 62); /* llama.cpp's 27B rule */
    m->eps = key_f(m, "attention.layer_norm_rms_epsilon", 1e-5);
    m->theta = key_f(m, "rope.freq_base", 10000.0);
    m->theta_swa = key_f(m, "rope.freq_base_swa", gemma3 ? 10000.0 : m->theta); /* llama.cpp's gemma2/gemma3 loaders */
    m->swa_unscaled = gemma3;
    double factor = key_f(m, "rope.scaling.factor", key_f(m, "rope.scale_linear", 0.0));
    const char *type = "linear";
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch);
    kiln_gguf_get_str(m->f, key, &type, NULL);
    m->freq_scale = strcmp(type, "none") != 0 && factor != 0 ? 1.0 / factor : 1.0;
    int64_t nf = 0;
    m->freq_factors = tensor(m, "rope_freqs.weight", &nf);
    m->n_rot = key_int(m, "rope.dimension_count", m->hd);
    m->mscale = key_f(m, "rope.scaling.attn_factor", 1.0);
    m->yarn = strcmp(type, "yarn") == 0;
    if (m->yarn) yarn_setup(m, factor);
    if (m->phi3 && !m->freq_factors) { /* llama.cpp's get_rope_factors: long above the original context */
        int64_t orig = key_int(m, "rope.scaling.original_context_length", key_int(m, "context_length", 0));
        m->freq_factors = tensor(m, m->max_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight", &nf);
    }
    if (m->freq_factors && nf != m->n_rot / 2) return fail(m, "rope factors: %lld values", (long long)nf), false;
    if (!m->hidden || !m->n_head || !m->hd || !m->ffn || !m->n_layer) return fail(m, "missing sizes"), false;
    m->scale = 1.0 / sqrt((double)(wide ? m->hidden / m->n_head : m->hd));
    return true;
}

double *mref_logits(const kiln_gguf *f, const int32_t *ids, int64_t n, int64_t *n_vocab, char *err, size_t nerr)
{
    return mref_logits_ctx(f, ids, n, 0, n_vocab, err, nerr);
}

double *mref_logits_ctx(const kiln_gguf *f, const int32_t *ids, int64_t n, int64_t max_ctx, int64_t *n_vocab, char *err,
                        size_t nerr)
{
    return mref_logits_gap(f, ids, n, max_ctx, n_vocab, NULL, err, nerr);
}

double *mref_logits_gap(const kiln_gguf *f, const int32_t *ids, int64_t n, int64_t max_ctx, int64_t *n_vocab,
                        double *route_gap, char *err, size_t nerr)
{
    mref m = {.f = f, .err = err, .nerr = nerr, .max_ctx = max_ctx, .route_gap = INFINITY};
    if (err && nerr) err[0] = 0;
    if (!read_meta(&m)) return NULL;
    int64_t ne = 0;
    double *embd = tensor(&m, "token_embd.weight", &ne), *x = NULL, *logits = NULL;
    if (!embd) return fail(&m, "no token_embd.weight"), free(m.freq_factors), NULL;
    m.vocab = ne / m.hidden;
    x = malloc((size_t)(n * m.hidden) * sizeof *x);
    for (int64_t t = 0; t < n; t++) memcpy(x + t * m.hidden, embd + ids[t] * m.hidden, (size_t)m.hidden * sizeof *x);
    if (m.gemma) /* llama.cpp scales by sqrtf(n_embd), an f32 value */
        for (int64_t i = 0; i < n * m.hidden; i++) x[i] *= (double)sqrtf((float)m.hidden);
    for (int l = 0; l < m.n_layer; l++) {
        attn_half(&m, l, x, n);
        ffn_half(&m, l, x, n);
    }
    double *norm = tensor(&m, "output_norm.weight", NULL), *head = tensor(&m, "output.weight", NULL);
    logits = malloc((size_t)(n * m.vocab) * sizeof *logits);
    if (norm && logits) {
        rms_norm(x, norm, x, n, m.hidden, m.eps);
        matmul(x, head ? head : embd, NULL, logits, n, m.hidden, m.vocab);
        for (int64_t i = 0; m.final_cap && i < n * m.vocab; i++) logits[i] = m.final_cap * tanh(logits[i] / m.final_cap);
    } else {
        fail(&m, "no output_norm.weight");
        free(logits);
        logits = NULL;
    }
    if (n_vocab) *n_vocab = m.vocab;
    if (route_gap) *route_gap = m.route_gap;
    free(norm), free(head), free(embd), free(x), free(m.freq_factors);
    if (logits && err && err[0]) free(logits), logits = NULL; /* a layer failed (missing expert tensors) */
    return logits;
}
