"""llama (biases, llama 3's rope_freqs), qwen2, qwen3, gemma2, gemma3 and phi3 files written by the
`gguf` package (llama.cpp's own writer, its tensor and key names: an independent check of kiln's
table) with random weights and a small SentencePiece token list (llama.cpp will not load a file
without one), run by kiln (a 10-token prefill, then 3 decode steps through the cache) against a
float64 numpy forward written here from the architectures' definitions (llama.cpp's graphs; the GGUF
stores gemma's norm weights as 1 + w, as its converter does). Skipped without the gguf package.
llama.cpp itself on these writers' files is the optional stage test_llama_cpp.py."""
import numpy as np
import pytest

import kiln
from conftest import nmse, tolerance

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) writes these files")

N_PRE, N_DEC = 10, 3
Q8 = gguf.GGMLQuantizationType.Q8_0

# Small shapes with the features that bite: head_dim != hidden / heads, GQA, windows shorter than the
# 13 tokens run, soft-caps deep in tanh's bend, gemma3's 6-layer pattern with a global layer.
CASES = {
    "gemma2": dict(n_layer=3, hidden=64, n_head=4, n_kv=2, hd=32, ffn=96, vocab=72, window=4, attn_cap=2.0,
                   final_cap=3.0, theta=10000.0),
    # llama.cpp scales gemma2's local layers as its global ones; rope.freq_base_swa sets their base
    "gemma2_scaled": dict(arch="gemma2", n_layer=3, hidden=64, n_head=4, n_kv=2, hd=32, ffn=96, vocab=72, window=4,
                          attn_cap=2.0, final_cap=3.0, theta=1e6, rope_factor=4.0, theta_swa=2e4),
    "gemma2_defaults_q8_0": dict(arch="gemma2", n_layer=2, hidden=64, n_head=4, n_kv=2, hd=32, ffn=96, vocab=72,
                                 window=None, attn_cap=None, final_cap=None, theta=10000.0, q8=True),
    "gemma3": dict(n_layer=7, hidden=64, n_head=4, n_kv=1, hd=32, ffn=64, vocab=72, window=5, theta=1e6,
                   rope_factor=8.0),
    "gemma3_base_swa": dict(arch="gemma3", n_layer=7, hidden=64, n_head=4, n_kv=1, hd=32, ffn=64, vocab=72, window=5,
                            theta=1e6, rope_factor=8.0, theta_swa=5000.0),
    "phi3": dict(n_layer=2, hidden=64, n_head=4, n_kv=2, hd=16, ffn=96, vocab=72, window=6, theta=10000.0),
    # llama 3: per-pair rope_freqs factors and every optional bias; qwen2: q/k/v biases; qwen3: q/k norms
    # with a head size other than hidden / heads
    "llama": dict(n_layer=2, hidden=64, n_head=4, n_kv=2, hd=16, ffn=96, vocab=72, theta=500000.0,
                  rope_freqs=True, bias=True),
    "qwen2": dict(n_layer=2, hidden=64, n_head=4, n_kv=2, hd=16, ffn=96, vocab=72, theta=1e6, bias=True),
    "qwen3": dict(n_layer=2, hidden=64, n_head=4, n_kv=2, hd=32, ffn=96, vocab=72, theta=1e6),
}


def add_vocab(w, n):
    """A SentencePiece ("llama") token list of n entries: <unk>, <s>, </s>, then t3, t4, ...; kiln
    reads only ids, llama.cpp refuses a file without a tokenizer."""
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([2, 3, 3] + [1] * (n - 3))


def tname(t, bid=None, suffix="weight"):
    name = gguf.TENSOR_NAMES[t]
    return (name.format(bid=bid) if bid is not None else name) + "." + suffix


def write_model(path, arch, c, rng):
    """The file and the float64 weights the forward uses (q8_0 ones as the gguf package dequantizes them)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["n_layer"])
    w.add_context_length(64)
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_kv"])
    w.add_key_length(c["hd"])
    w.add_value_length(c["hd"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(c["theta"])
    if c.get("window"):
        w.add_sliding_window(c["window"])
    if c.get("attn_cap"):
        w.add_attn_logit_softcapping(c["attn_cap"])
    if c.get("final_cap"):
        w.add_final_logit_softcapping(c["final_cap"])
    if c.get("rope_factor"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c["rope_factor"])
    if c.get("theta_swa"):
        w.add_rope_freq_base_swa(c["theta_swa"])
    add_vocab(w, c["vocab"])
    W = {}
    T = gguf.MODEL_TENSOR

    def put(name, shape, scale, offset=0.0, quant=False):
        a = (offset + scale * rng.uniform(-1, 1, shape)).astype(np.float32)
        if quant:
            q = gguf.quants.quantize(a, Q8)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=Q8)
            W[name] = gguf.quants.dequantize(q, Q8).astype(np.float64).reshape(shape)
        else:
            w.add_tensor(name, a)
            W[name] = a.astype(np.float64)

    H, F, hd = c["hidden"], c["ffn"], c["hd"]
    qd, kvd, q8 = c["n_head"] * hd, c["n_kv"] * hd, c.get("q8", False)
    gemma = arch.startswith("gemma")
    bias = c.get("bias", False)  # qwen2: q/k/v biases; llama: those and o, gate, up, down
    put(tname(T.TOKEN_EMBD), (c["vocab"], H), 1.0 if not gemma else 0.2)
    put(tname(T.OUTPUT_NORM), (H,), 0.25, 1.0)
    if not gemma:
        put(tname(T.OUTPUT), (c["vocab"], H), H ** -0.5)
    if c.get("rope_freqs"):  # llama 3.1's factors: 1 on fast pairs up to 8 on slow ones
        put(tname(T.ROPE_FREQS), (hd // 2,), 3.5, 4.5)
    for b in range(c["n_layer"]):
        put(tname(T.ATTN_NORM, b), (H,), 0.25, 1.0)
        if arch == "phi3":
            put(tname(T.ATTN_QKV, b), (qd + 2 * kvd, H), H ** -0.5, quant=q8)
        else:
            put(tname(T.ATTN_Q, b), (qd, H), H ** -0.5, quant=q8)
            put(tname(T.ATTN_K, b), (kvd, H), H ** -0.5, quant=q8)
            put(tname(T.ATTN_V, b), (kvd, H), H ** -0.5, quant=q8)
            if bias:
                for t, n in ((T.ATTN_Q, qd), (T.ATTN_K, kvd), (T.ATTN_V, kvd)):
                    put(tname(t, b, "bias"), (n,), 0.5)
        if arch in ("gemma3", "qwen3"):
            put(tname(T.ATTN_Q_NORM, b), (hd,), 0.25, 1.0)
            put(tname(T.ATTN_K_NORM, b), (hd,), 0.25, 1.0)
        put(tname(T.ATTN_OUT, b), (H, qd), qd ** -0.5, quant=q8)
        if bias and arch == "llama":
            put(tname(T.ATTN_OUT, b, "bias"), (H,), 0.25)
        if gemma:
            put(tname(T.ATTN_POST_NORM, b), (H,), 0.25, 1.0)
        put(tname(T.FFN_NORM, b), (H,), 0.25, 1.0)
        if arch == "phi3":
            put(tname(T.FFN_UP, b), (2 * F, H), H ** -0.5, quant=q8)
        else:
            put(tname(T.FFN_GATE, b), (F, H), H ** -0.5, quant=q8)
            put(tname(T.FFN_UP, b), (F, H), H ** -0.5, quant=q8)
        put(tname(T.FFN_DOWN, b), (H, F), F ** -0.5, quant=q8)
        if bias and arch == "llama":
            for t, n in ((T.FFN_GATE, F), (T.FFN_UP, F), (T.FFN_DOWN, H)):
                put(tname(t, b, "bias"), (n,), 0.25)
        if gemma:
            put(tname(T.FFN_POST_NORM, b), (H,), 0.25, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return W


def rms(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def rope(x, theta, scale, neox=True, freqs=None):
    """x [T, heads, d]: pairs (i, i + d/2) (neox) or (2i, 2i + 1) (normal: llama) rotated by
    pos * scale * theta^(-2i/d) / freqs[i] (llama 3's rope_freqs factors)."""
    n, d = x.shape[0], x.shape[-1]
    ang = np.arange(n)[:, None] * scale * theta ** (-np.arange(d // 2) * 2.0 / d)
    if freqs is not None:
        ang = ang / freqs
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = (x[..., : d // 2], x[..., d // 2:]) if neox else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * c - b * s, a * s + b * c
    if neox:
        return np.concatenate([ra, rb], -1)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def attend(q, k, v, scale, cap, window):
    """Causal GQA attention of T queries at positions 0..T-1; window: key j visible when t - j < window."""
    n, nh, d = q.shape
    g = nh // k.shape[1]
    k, v = np.repeat(k, g, 1), np.repeat(v, g, 1)
    s = np.einsum("thd,jhd->htj", q, k) * scale
    if cap:
        s = cap * np.tanh(s / cap)
    t, j = np.arange(n)[:, None], np.arange(n)[None, :]
    s = np.where((j <= t) & ((t - j < window) if window else True), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("htj,jhd->thd", p, v)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(arch, c, W, ids):
    """Logits [T, vocab] in float64."""
    T = gguf.MODEL_TENSOR
    H, F, hd, nh, nkv = c["hidden"], c["ffn"], c["hd"], c["n_head"], c["n_kv"]
    gemma = arch.startswith("gemma")
    window = c.get("window") if c.get("window") is not None else (4096 if arch == "gemma2" else 0)
    attn_cap = c.get("attn_cap") or (50.0 if arch == "gemma2" else 0.0)
    final_cap = c.get("final_cap") or (30.0 if arch == "gemma2" else 0.0)
    pattern = {"gemma2": 2, "gemma3": 6}.get(arch, 0)
    x = W[tname(T.TOKEN_EMBD)][ids]
    if gemma:
        x = x * float(np.sqrt(np.float32(H), dtype=np.float32))  # llama.cpp: sqrtf(n_embd)
    n = len(ids)
    for b in range(c["n_layer"]):
        local = bool(window) and (not pattern or b % pattern < pattern - 1)
        h = rms(x, W[tname(T.ATTN_NORM, b)])
        if arch == "phi3":
            qkv = h @ W[tname(T.ATTN_QKV, b)].T
            q, k, v = qkv[:, : nh * hd], qkv[:, nh * hd: (nh + nkv) * hd], qkv[:, (nh + nkv) * hd:]
        else:
            q, k, v = (h @ W[tname(t, b)].T + W.get(tname(t, b, "bias"), 0.0) for t in (T.ATTN_Q, T.ATTN_K, T.ATTN_V))
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if arch in ("gemma3", "qwen3"):
            q, k = rms(q, W[tname(T.ATTN_Q_NORM, b)]), rms(k, W[tname(T.ATTN_K_NORM, b)])
        theta, scale = c["theta"], 1.0 / c.get("rope_factor", 1.0)
        if gemma and local:  # llama.cpp: gemma2's local layers rotate as its global ones, gemma3's unscaled
            theta = c.get("theta_swa") or (10000.0 if arch == "gemma3" else theta)
            scale = 1.0 if arch == "gemma3" else scale
        neox, freqs = arch != "llama", W.get(tname(T.ROPE_FREQS))
        q, k = rope(q, theta, scale, neox, freqs), rope(k, theta, scale, neox, freqs)
        a = attend(q, k, v, hd ** -0.5, attn_cap, window if local else 0).reshape(n, nh * hd)
        o = a @ W[tname(T.ATTN_OUT, b)].T + W.get(tname(T.ATTN_OUT, b, "bias"), 0.0)
        if gemma:
            o = rms(o, W[tname(T.ATTN_POST_NORM, b)])
        x = x + o
        h = rms(x, W[tname(T.FFN_NORM, b)])
        if arch == "phi3":
            gu = h @ W[tname(T.FFN_UP, b)].T
            act = gu[:, :F] / (1 + np.exp(-gu[:, :F])) * gu[:, F:]
        else:
            gt, up = (h @ W[tname(t, b)].T + W.get(tname(t, b, "bias"), 0.0) for t in (T.FFN_GATE, T.FFN_UP))
            act = (gelu_tanh(gt) if gemma else gt / (1 + np.exp(-gt))) * up
        f = act @ W[tname(T.FFN_DOWN, b)].T + W.get(tname(T.FFN_DOWN, b, "bias"), 0.0)
        if gemma:
            f = rms(f, W[tname(T.FFN_POST_NORM, b)])
        x = x + f
    x = rms(x, W[tname(T.OUTPUT_NORM)])
    logits = x @ (W[tname(T.TOKEN_EMBD)] if gemma else W[tname(T.OUTPUT)]).T
    return final_cap * np.tanh(logits / final_cap) if final_cap else logits


def run_kiln(ctx, path, backend, ids, **graph_opts):
    """Logits of a prefill of N_PRE tokens, then N_DEC one-token steps through the KV cache."""
    with kiln.Model.load(str(path), ctx) as m:
        g = m.graph(max_ctx=32, max_tok=16, logits=True, **graph_opts)
        out = []
        with ctx.compile(g, backend=backend) as plan:
            g.close()
            start, step = 0, N_PRE
            while start < len(ids):
                r = plan.run({"ids": np.array(ids[start:start + step], np.int32),
                              "pos": np.arange(start, start + step, dtype=np.int32)},
                             {"n_tok": step, "n_kv": start + step})
                out.append(np.asarray(r["logits"], np.float64).reshape(step, -1))
                start, step = start + step, 1
        return np.concatenate(out)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("be", ["ref", "cpu"])
def test_matches_f64_forward(ctx, tmp_path, rng, case, be):
    c = CASES[case]
    arch = c.get("arch", case)
    path = tmp_path / f"{case}.gguf"
    W = write_model(path, arch, c, rng)
    ids = [int(i) for i in rng.integers(0, c["vocab"], N_PRE + N_DEC)]
    want = forward(arch, c, W, ids)
    got = run_kiln(ctx, path, be, ids)
    # the ref backend reads the (dequantized) weights exactly: f32 arithmetic only; the cpu's q8_0
    # path quantizes activations to int8: 14 projections and gemma's gelu, post-norms and caps
    # measured 1.0e-4..1.9e-4 over 25 seeds, bound 5e-3 (structural errors give 1e-2 and more)
    tol = tolerance("matmul", "f32") * 100 if be == "ref" or not c.get("q8") else 5e-3
    e = nmse(got, want)
    assert e <= tol, f"{case} on {be}: NMSE {e:.3e} > {tol:.1e}"

