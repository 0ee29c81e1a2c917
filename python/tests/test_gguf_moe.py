"""Mixture-of-experts files (llama with experts, qwen2moe with its shared expert, qwen3moe) written by
the `gguf` package (llama.cpp's own writer: its tensor names, its [experts, rows, cols] stacks, its
expert keys), with random weights, run by kiln (a 10-token prefill, then 3 decode steps) against a
float64 numpy forward of llama.cpp's build_moe_ffn written here. A draw whose router keeps an expert
within 1e-3 (in logits) of one it leaves out is drawn again: f32 may route it otherwise. Skipped
without the gguf package."""
import numpy as np
import pytest

import kiln
from conftest import nmse, tolerance

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) writes these files")

from test_gguf_arch import N_DEC, N_PRE, add_vocab, attend, rms, rope, run_kiln, tname  # noqa: E402

Q8 = gguf.GGMLQuantizationType.Q8_0
T = gguf.MODEL_TENSOR

CASES = {
    # llama with experts (Mixtral): normal rope, experts as wide as feed_forward_length, weights renormalized
    "llama": dict(n_layer=2, hidden=64, n_head=4, n_kv=2, ffn=32, vocab=64, n_expert=4, used=2),
    # qwen2moe: q/k/v biases, weights as the softmax gives them, a sigmoid-gated shared expert
    "qwen2moe": dict(n_layer=2, hidden=64, n_head=4, n_kv=2, ffn=64, ffn_exp=32, ffn_shexp=48, vocab=64,
                     n_expert=6, used=2),
    # qwen3moe: q/k norms, renormalized weights; q8_0 expert stacks (run on ref: see the test)
    "qwen3moe": dict(n_layer=2, hidden=64, n_head=4, n_kv=2, ffn=96, ffn_exp=32, vocab=64, n_expert=8, used=3),
    "qwen3moe_q8_0": dict(arch="qwen3moe", n_layer=2, hidden=64, n_head=4, n_kv=2, ffn=96, ffn_exp=32, vocab=64,
                          n_expert=8, used=3, q8=True),
}


def write_model(path, arch, c, rng):
    w = gguf.GGUFWriter(str(path), arch)
    H, hd = c["hidden"], c["hidden"] // c["n_head"]
    E, F = c["n_expert"], c.get("ffn_exp", c["ffn"])
    w.add_block_count(c["n_layer"])
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_kv"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_expert_count(E)
    w.add_expert_used_count(c["used"])
    if "ffn_exp" in c:
        w.add_expert_feed_forward_length(c["ffn_exp"])
    if "ffn_shexp" in c:
        w.add_expert_shared_feed_forward_length(c["ffn_shexp"])
    add_vocab(w, c["vocab"])
    W = {}

    def put(name, shape, scale, offset=0.0, quant=False):
        a = (offset + scale * rng.uniform(-1, 1, shape)).astype(np.float32)
        if quant:
            q = gguf.quants.quantize(a, Q8)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=Q8)
            W[name] = gguf.quants.dequantize(q, Q8).astype(np.float64).reshape(shape)
        else:
            w.add_tensor(name, a)
            W[name] = a.astype(np.float64)

    qd, kvd, q8 = c["n_head"] * hd, c["n_kv"] * hd, c.get("q8", False)
    put(tname(T.TOKEN_EMBD), (c["vocab"], H), 1.0)
    put(tname(T.OUTPUT_NORM), (H,), 0.25, 1.0)
    put(tname(T.OUTPUT), (c["vocab"], H), H ** -0.5)
    for b in range(c["n_layer"]):
        put(tname(T.ATTN_NORM, b), (H,), 0.25, 1.0)
        put(tname(T.ATTN_Q, b), (qd, H), H ** -0.5)
        put(tname(T.ATTN_K, b), (kvd, H), H ** -0.5)
        put(tname(T.ATTN_V, b), (kvd, H), H ** -0.5)
        if arch == "qwen2moe":
            for t, n in ((T.ATTN_Q, qd), (T.ATTN_K, kvd), (T.ATTN_V, kvd)):
                put(tname(t, b, "bias"), (n,), 0.5)
        if arch == "qwen3moe":
            put(tname(T.ATTN_Q_NORM, b), (hd,), 0.25, 1.0)
            put(tname(T.ATTN_K_NORM, b), (hd,), 0.25, 1.0)
        put(tname(T.ATTN_OUT, b), (H, qd), qd ** -0.5)
        put(tname(T.FFN_NORM, b), (H,), 0.25, 1.0)
        put(tname(T.FFN_GATE_INP, b), (E, H), 4 * H ** -0.5)  # spread logits: few near-ties
        put(tname(T.FFN_GATE_EXP, b), (E, F, H), H ** -0.5, quant=q8)
        put(tname(T.FFN_UP_EXP, b), (E, F, H), H ** -0.5, quant=q8)
        put(tname(T.FFN_DOWN_EXP, b), (E, H, F), F ** -0.5, quant=q8)
        if arch == "qwen2moe":
            Fs = c["ffn_shexp"]
            put(tname(T.FFN_GATE_INP_SHEXP, b), (H,), 4 * H ** -0.5)
            put(tname(T.FFN_GATE_SHEXP, b), (Fs, H), H ** -0.5)
            put(tname(T.FFN_UP_SHEXP, b), (Fs, H), H ** -0.5)
            put(tname(T.FFN_DOWN_SHEXP, b), (H, Fs), Fs ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return W


def swiglu_expert(h, gate, up, down):
    g, u = h @ gate.T, h @ up.T
    return (g / (1 + np.exp(-g)) * u) @ down.T


def moe(arch, c, W, b, h, gaps):
    """llama.cpp's build_moe_ffn (softmax gating) on h [T, hidden]; notes each token's router gap."""
    E, k = c["n_expert"], c["used"]
    logits = h @ W[tname(T.FFN_GATE_INP, b)].T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        order = np.argsort(-logits[t], kind="stable")
        sel = order[:k]
        if k < E:
            gaps.append(logits[t, order[k - 1]] - logits[t, order[k]])
        wts = p[t, sel] / (p[t, sel].sum() if arch != "qwen2moe" else 1.0)
        for e, wt in zip(sel, wts):
            out[t] += wt * swiglu_expert(h[t:t + 1], W[tname(T.FFN_GATE_EXP, b)][e], W[tname(T.FFN_UP_EXP, b)][e],
                                         W[tname(T.FFN_DOWN_EXP, b)][e])[0]
    if arch == "qwen2moe":
        gate = 1 / (1 + np.exp(-(h @ W[tname(T.FFN_GATE_INP_SHEXP, b)])))
        out += gate[:, None] * swiglu_expert(h, W[tname(T.FFN_GATE_SHEXP, b)], W[tname(T.FFN_UP_SHEXP, b)],
                                             W[tname(T.FFN_DOWN_SHEXP, b)])
    return out


def forward(arch, c, W, ids, gaps):
    H, nh, nkv = c["hidden"], c["n_head"], c["n_kv"]
    hd, n = H // nh, len(ids)
    x = W[tname(T.TOKEN_EMBD)][ids]
    for b in range(c["n_layer"]):
        h = rms(x, W[tname(T.ATTN_NORM, b)])
        q, k, v = (h @ W[tname(t, b)].T + (W[tname(t, b, "bias")] if arch == "qwen2moe" else 0)
                   for t in (T.ATTN_Q, T.ATTN_K, T.ATTN_V))
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if arch == "qwen3moe":
            q, k = rms(q, W[tname(T.ATTN_Q_NORM, b)]), rms(k, W[tname(T.ATTN_K_NORM, b)])
        q, k = rope(q, 10000.0, 1.0, arch != "llama"), rope(k, 10000.0, 1.0, arch != "llama")
        a = attend(q, k, v, hd ** -0.5, 0.0, 0).reshape(n, nh * hd)
        x = x + a @ W[tname(T.ATTN_OUT, b)].T
        x = x + moe(arch, c, W, b, rms(x, W[tname(T.FFN_NORM, b)]), gaps)
    return rms(x, W[tname(T.OUTPUT_NORM)]) @ W[tname(T.OUTPUT)].T


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("be", ["ref", "cpu"])
def test_moe_matches_f64_forward(ctx, tmp_path, rng, case, be):
    c = CASES[case]
    arch = c.get("arch", case)
    if c.get("q8") and be == "cpu":
        pytest.skip("q8_0 on the cpu quantizes activations to int8, which can route otherwise (ref reads them exactly)")
    for attempt in range(8):
        path = tmp_path / f"{case}-{attempt}.gguf"
        W = write_model(path, arch, c, rng)
        ids = [int(i) for i in rng.integers(0, c["vocab"], N_PRE + N_DEC)]
        gaps = []
        want = forward(arch, c, W, ids, gaps)
        if min(gaps) >= 1e-3:
            break
    else:
        pytest.fail("8 draws with a router within 1e-3 of a tie")
    with kiln.Model.load(str(path), ctx) as m:
        info = m.info
        assert (info["n_expert"], info["n_expert_used"], info["expert_norm"]) == (c["n_expert"], c["used"],
                                                                                 arch != "qwen2moe")
    got = run_kiln(ctx, path, be, ids)
    tol = tolerance("matmul", "f32") * 100
    e = nmse(got, want)
    assert e <= tol, f"{case} on {be}: NMSE {e:.3e} > {tol:.1e}"
    e = nmse(got, run_kiln(ctx, path, be, ids, moe_dense=True))  # the routed experts only, as the dense form
    assert e <= tol, f"{case} on {be}: routed against dense NMSE {e:.3e} > {tol:.1e}"
