"""Every builder call of kiln.Graph, run on the backend under test, against numpy float64 on fresh
random data, outputs poisoned (NaN) before each run and every element compared; tolerances from
contracts/. Also the graph's hash and .kg round trip."""
import numpy as np
import pytest
from conftest import assert_close

import kiln


def f32(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def run1(ctx, backend, g, inputs, symbols=None, name="y"):
    plan = ctx.compile(g, backend=backend)
    out = plan._empty(name) if not symbols else None
    if out is not None:
        out.fill(np.nan)  # poisoned: a kernel that skips elements cannot pass
        return plan.run(inputs, symbols, out={name: out})[name]
    return plan.run(inputs, symbols)[name]


def silu(x):
    return x / (1 + np.exp(-x))


def test_matmul_silu_symbolic_rows(ctx, backend, rng):
    g = kiln.Graph()
    n = g.sym("n", 16)
    x = g.input("x", "f32", [n, 96])
    w = rng.uniform(-1, 1, (40, 96)).astype(np.float32)
    g.output(g.silu(g.matmul(x, g.weight("w", w))), "y")
    plan = ctx.compile(g, backend=backend)
    for rows in (1, 7, 16):
        xv = f32(rng, rows, 96)
        out = np.full((rows, 40), np.nan, np.float32)
        y = plan.run({"x": xv}, {"n": rows}, out={"y": out})["y"]
        assert y is out
        ref = xv.astype(np.float64) @ w.astype(np.float64).T
        assert_close(y, silu(ref), "silu")


def test_elementwise_and_broadcast(ctx, backend, rng):
    g = kiln.Graph()
    a, b = g.input("a", "f32", [5, 33]), g.input("b", "f32", [33])
    g.output(g.gelu((a + b) * 0.5), "y")
    g.output(g.swiglu(a, g.mul(a, b)), "z")
    av, bv = f32(rng, 5, 33), f32(rng, 33)
    plan = ctx.compile(g, backend=backend)
    out = plan.run({"a": av, "b": bv})
    A, B = av.astype(np.float64), bv.astype(np.float64)
    s = (A + B) * 0.5
    assert_close(out["y"], 0.5 * s * (1 + np.tanh(np.sqrt(2 / np.pi) * (s + 0.044715 * s ** 3))), "gelu")
    assert_close(out["z"], silu(A) * (A * B), "swiglu")


def test_norms_and_softmax(ctx, backend, rng):
    g = kiln.Graph()
    x = g.input("x", "f32", [6, 64])
    w, b = f32(rng, 64), f32(rng, 64)
    g.output(g.rms_norm(x, g.weight("w", w), eps=1e-6), "rms")
    g.output(g.layer_norm(x, g.weight("lw", w), g.weight("lb", b), eps=1e-5), "ln")
    g.output(g.softmax(x), "sm")
    xv = f32(rng, 6, 64, lo=-8, hi=8)
    out = ctx.compile(g, backend=backend).run({"x": xv})
    X = xv.astype(np.float64)
    assert_close(out["rms"], X / np.sqrt((X ** 2).mean(-1, keepdims=True) + 1e-6) * w, "rms_norm")
    mu, var = X.mean(-1, keepdims=True), X.var(-1, keepdims=True)
    assert_close(out["ln"], (X - mu) / np.sqrt(var + 1e-5) * w + b, "layer_norm")
    e = np.exp(X - X.max(-1, keepdims=True))
    assert_close(out["sm"], e / e.sum(-1, keepdims=True), "softmax")


def rope_ref(x, pos, mode, theta):
    x = x.astype(np.float64).copy()
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None].astype(np.float64) * inv[None, :]  # [n_tok, d/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if mode == "normal":
        a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : d // 2].copy(), x[..., d // 2:].copy()
        x[..., : d // 2], x[..., d // 2:] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_rope(ctx, backend, rng, mode):
    g = kiln.Graph()
    x, pos = g.input("x", "f32", [3, 4, 16]), g.input("pos", "i32", [3])
    g.output(g.rope(x, pos, mode, 10000.0), "y")
    xv, pv = f32(rng, 3, 4, 16), rng.integers(0, 500, 3).astype(np.int32)
    y = ctx.compile(g, backend=backend).run({"x": xv, "pos": pv})["y"]
    assert_close(y, rope_ref(xv, pv, mode, 10000.0), "rope")


def test_attention_over_a_cache_with_kv_scatter(ctx, backend, rng):
    H, KVH, D, MAXC = 4, 2, 16, 32
    g = kiln.Graph()
    n_tok, n_kv = g.sym("n_tok", 8), g.sym("n_kv", MAXC)
    q = g.input("q", "f32", [n_tok, H, D])
    k, v = g.input("k", "f32", [n_tok, KVH, D]), g.input("v", "f32", [n_tok, KVH, D])
    pos = g.input("pos", "i32", [n_tok])
    kc, vc = g.state("kc", "f32", [KVH, MAXC, D]), g.state("vc", "f32", [KVH, MAXC, D])
    g.output(g.attention(q, g.kv_scatter(kc, k, pos), g.kv_scatter(vc, v, pos), n_kv), "y")
    plan = ctx.compile(g, backend=backend)
    K = np.zeros((KVH, MAXC, D))
    V = np.zeros((KVH, MAXC, D))
    done = 0
    for nt in (3, 1, 2):  # prefill then decode steps over the growing cache
        qv, kv_, vv = f32(rng, nt, H, D), f32(rng, nt, KVH, D), f32(rng, nt, KVH, D)
        pv = np.arange(done, done + nt, dtype=np.int32)
        y = plan.run({"q": qv, "k": kv_, "v": vv, "pos": pv}, {"n_tok": nt, "n_kv": done + nt})["y"]
        K[:, done:done + nt] = kv_.transpose(1, 0, 2)
        V[:, done:done + nt] = vv.transpose(1, 0, 2)
        done += nt
        ref = np.empty((nt, H, D))
        for t in range(nt):
            upto = done - nt + t + 1
            for h in range(H):
                kh = h // (H // KVH)
                sc = K[kh, :upto] @ qv[t, h].astype(np.float64) / np.sqrt(D)
                p = np.exp(sc - sc.max())
                ref[t, h] = (p / p.sum()) @ V[kh, :upto]
        assert_close(y, ref, "attention")
    np.testing.assert_array_equal(plan.state("kc")[:, :done], K[:, :done].astype(np.float32))


def test_rows_argmax_cast_shapes(ctx, backend, rng):
    g = kiln.Graph()
    table = f32(rng, 10, 8)
    ids = g.input("ids", "i32", [4])
    r = g.get_rows(g.weight("t", table), ids)
    g.output(r, "rows")
    g.output(g.argmax(r), "am")
    g.output(g.cast(r, "f16"), "half")
    g.output(g.transpose(g.reshape(r, [2, 2, 8]), 0, 1), "tr")
    g.output(g.view(r, [2, 8], offset=8), "vw")
    g.output(g.concat(r, r * 2.0, 1), "cat")
    iv = rng.integers(0, 10, 4).astype(np.int32)
    out = ctx.compile(g, backend=backend).run({"ids": iv})
    R = table[iv].astype(np.float64)
    assert_close(out["rows"], R, "get_rows")
    np.testing.assert_array_equal(out["am"], R.argmax(-1).astype(np.int32))
    assert out["half"].dtype == np.float16
    assert_close(out["half"], R, "cast", "f16")
    assert_close(out["tr"], R.reshape(2, 2, 8).transpose(1, 0, 2), "transpose")
    assert_close(out["vw"], R[1:3], "view")
    assert_close(out["cat"], np.concatenate([R, 2 * R], 1), "concat")


def test_moe_route_and_matmul(ctx, backend, rng):
    """A router (moe_route) feeding moe_matmul: per slot, and summed weighted by the route, against
    numpy's top-k (distinct logits: the ranking is not in doubt)."""
    E, k, N, K, T = 16, 4, 24, 64, 5
    g = kiln.Graph()
    n = g.sym("n", 8)
    x = g.input("x", "f32", [n, K])
    logits = g.input("l", "f32", [n, E])
    w = f32(rng, E, N, K, lo=-1, hi=1)
    ws = g.weight("w", w)
    r = g.moe_route(logits, k, norm=True)
    g.output(g.moe_matmul(x, ws, r, k), "slots")
    g.output(g.moe_matmul(x, ws, r, k, sum=True), "y")
    xv = f32(rng, T, K)
    lv = (rng.permutation(T * E).reshape(T, E) * 0.05).astype(np.float32)  # distinct, 0.05 apart
    out = ctx.compile(g, backend=backend).run({"x": xv, "l": lv}, {"n": T})
    W, X = w.astype(np.float64), xv.astype(np.float64)
    slots = np.zeros((T, k, N))
    y = np.zeros((T, N))
    for t in range(T):
        p = np.exp(lv[t] - lv[t].max())
        p /= p.sum()
        top = np.argsort(-lv[t], kind="stable")[:k]
        for s, e in enumerate(top):
            slots[t, s] = W[e] @ X[t]
            y[t] += p[e] / p[top].sum() * slots[t, s]
    assert out["slots"].shape == (T, k, N) and out["y"].shape == (T, N)
    assert_close(out["slots"], slots, "moe_matmul")
    assert_close(out["y"], y, "moe_matmul")


def test_quantized_weights_roundtrip(ctx, backend, rng):
    w = f32(rng, 16, 256, lo=-1, hi=1)
    for t in ("q8_0", "q4_k", "q6_k"):
        raw = kiln.quantize(w, t)
        assert raw.dtype == np.uint8 and raw.shape[0] == 16
        deq = kiln.dequantize(raw, t).reshape(16, 256)
        g = kiln.Graph()
        x = g.input("x", "f32", [2, 256])
        g.output(g.matmul(x, g.weight("w", raw, dtype=t, shape=[16, 256], copy=False)), "y")
        xv = f32(rng, 2, 256)
        y = ctx.compile(g, backend=backend).run({"x": xv})["y"]
        assert_close(y, xv.astype(np.float64) @ deq.astype(np.float64).T, "matmul", t)


def test_hash_and_kg_round_trip(ctx):
    g = kiln.Graph()
    n = g.sym("n", 4)
    x = g.input("x", "f32", [n, 32])
    g.output(g.rms_norm(x, None, 1e-5), "y")
    text = g.to_kg()
    g2 = ctx.parse(text, "roundtrip.kg")
    assert g2.hash() == g.hash() and len(g.hash()) == 32
    assert g2.inputs == ["x"] and g2.outputs == ["y"] and "n" in g2.symbols
