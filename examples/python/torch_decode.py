"""One kiln decoder-layer plan inside a PyTorch decode loop, as an engine drives it: torch owns the
activations, the positions and the stream; kiln reads and writes those device tensors in place
(no host copies) and orders its step on torch.cuda.current_stream() through kiln_run_async.
Torch's own f32 layer with the same weights checks every step. Must not copy a tensor to the host
inside the loop. Run: KILN_LIB=build/libkiln.so PYTHONPATH=python python3 examples/python/torch_decode.py
[--device cuda|cpu] [--steps N] [--small]  (cpu: torch CPU tensors through DLPack, kiln's cpu backend)."""
import argparse
import time

import numpy as np
import torch

import kiln

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--steps", type=int, default=64, help="decode steps after the prompt")
ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (one prefill step)")
ap.add_argument("--small", action="store_true", help="a small layer (CI on the CPU)")
args = ap.parse_args()
dev = torch.device(args.device)
torch.backends.cuda.matmul.allow_tf32 = False  # the reference stays f32

# %% Shapes: a llama-style layer with grouped-query attention (small: for the CPU).
D, H, KVH, HD, F = (256, 4, 2, 64, 512) if args.small else (2048, 16, 4, 128, 5632)
MAXC = args.prompt + args.steps
EPS, THETA = 1e-5, 10000.0
rng = np.random.default_rng(0)


def w(rows, cols):  # f16 weights [out, in], as torch.nn.Linear holds them
    return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)


W = {"wq": w(H * HD, D), "wk": w(KVH * HD, D), "wv": w(KVH * HD, D), "wo": w(D, H * HD),
     "wg": w(F, D), "wu": w(F, D), "wd": w(D, F)}
NA = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
NF = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)

# %% The layer as a kiln graph: symbols n_tok (tokens of a step) and n_kv (cache length after it).
g = kiln.Graph()
n_tok, n_kv = g.sym("n_tok", max(args.prompt, 1)), g.sym("n_kv", MAXC)
x, pos = g.input("x", "f32", [n_tok, D]), g.input("pos", "i32", [n_tok])
wt = {k: g.weight(k, v, copy=False) for k, v in W.items()}
h = g.rms_norm(x, g.weight("attn_norm", NA), EPS)
q = g.rope(g.reshape(g.matmul(h, wt["wq"]), [n_tok, H, HD]), pos, "normal", THETA)
k = g.rope(g.reshape(g.matmul(h, wt["wk"]), [n_tok, KVH, HD]), pos, "normal", THETA)
v = g.reshape(g.matmul(h, wt["wv"]), [n_tok, KVH, HD])
kc, vc = g.state("k_cache", "f16", [KVH, MAXC, HD]), g.state("v_cache", "f16", [KVH, MAXC, HD])
a = g.attention(q, g.kv_scatter(kc, k, pos), g.kv_scatter(vc, v, pos), n_kv)
x2 = x + g.matmul(g.reshape(a, [n_tok, H * HD]), wt["wo"])
h2 = g.rms_norm(x2, g.weight("ffn_norm", NF), EPS)
g.output(x2 + g.matmul(g.swiglu(g.matmul(h2, wt["wg"]), g.matmul(h2, wt["wu"])), wt["wd"]), "y")

ctx = kiln.Context(quiet=False)
t0 = time.perf_counter()
plan = ctx.compile(g, backend="cuda" if dev.type == "cuda" else "cpu")
print(f"kiln: {plan.kernel_count} kernels on {plan.backend}, compiled in {time.perf_counter() - t0:.1f} s "
      f"(cache: {plan.cache})")

# %% The decode loop: every tensor is torch's, on its stream; x of each step is made by torch from
# kiln's previous output, so a step that ran out of order would read a stale x and fail the check.
stream = torch.cuda.current_stream() if dev.type == "cuda" else None
X = torch.empty(MAXC, D, device=dev)      # every step's input, for the reference
Y = torch.empty(MAXC, D, device=dev)      # kiln writes its outputs here in place
POS = torch.arange(MAXC, dtype=torch.int32, device=dev)
X[: args.prompt] = torch.randn(args.prompt, D, generator=torch.Generator().manual_seed(1)).to(dev)
tok = 0
plan.run_async({"x": X[:args.prompt], "pos": POS[:args.prompt]}, {"n_tok": args.prompt, "n_kv": args.prompt},
               out={"y": Y[:args.prompt]}, stream=stream)  # prefill
tok = args.prompt
if dev.type == "cuda":
    torch.cuda.synchronize()
start = torch.cuda.Event(enable_timing=True) if dev.type == "cuda" else None
end = torch.cuda.Event(enable_timing=True) if dev.type == "cuda" else None
host_t0 = time.perf_counter()
if start:
    start.record()
for step in range(args.steps):
    torch.tanh(Y[tok - 1: tok], out=X[tok: tok + 1])  # torch's work on the stream, from kiln's output
    plan.run_async({"x": X[tok: tok + 1], "pos": POS[tok: tok + 1]}, {"n_tok": 1, "n_kv": tok + 1},
                   out={"y": Y[tok: tok + 1]}, stream=stream)
    tok += 1
if end:
    end.record()
host_s = time.perf_counter() - host_t0
if dev.type == "cuda":
    torch.cuda.synchronize()
    gpu_ms = start.elapsed_time(end)
    print(f"decode: {args.steps} steps, {gpu_ms / args.steps:.3f} ms/step on the stream; the host enqueued them "
          f"in {host_s * 1e3 / args.steps:.3f} ms/step")
else:
    print(f"decode: {args.steps} steps, {host_s * 1e3 / args.steps:.3f} ms/step (cpu: kiln_run_async runs synchronously)")


# %% Torch's own layer (f32, the same f16 weights) over every input kiln saw, causal over positions.
def rope(t, p):  # "normal" rope: interleaved pairs, as ggml's llama
    inv = THETA ** (-torch.arange(0, HD, 2, device=dev, dtype=torch.float64) / HD)
    ang = (p.double()[:, None] * inv[None, :])[:, None, :]
    c, s = torch.cos(ang).float(), torch.sin(ang).float()
    a_, b_ = t[..., 0::2], t[..., 1::2]
    return torch.stack((a_ * c - b_ * s, a_ * s + b_ * c), -1).flatten(-2)


def rms(t, wn):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS) * wn


TW = {k: torch.from_numpy(v.astype(np.float32)).to(dev) for k, v in W.items()}
na, nf = torch.from_numpy(NA).to(dev), torch.from_numpy(NF).to(dev)
xs = X[:tok]
hh = rms(xs, na)
qq = rope((hh @ TW["wq"].T).view(tok, H, HD), POS[:tok])
kk = rope((hh @ TW["wk"].T).view(tok, KVH, HD), POS[:tok]).half().float()  # the cache is f16
vv = (hh @ TW["wv"].T).view(tok, KVH, HD).half().float()
kk, vv = kk.repeat_interleave(H // KVH, 1), vv.repeat_interleave(H // KVH, 1)
att = torch.einsum("qhd,khd->hqk", qq, kk) / HD ** 0.5
att = att.masked_fill(torch.ones(tok, tok, device=dev, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
xx2 = xs + torch.einsum("hqk,khd->qhd", att, vv).reshape(tok, H * HD) @ TW["wo"].T
hh2 = rms(xx2, nf)
ref = xx2 + (torch.nn.functional.silu(hh2 @ TW["wg"].T) * (hh2 @ TW["wu"].T)) @ TW["wd"].T

err = ((Y[:tok] - ref).pow(2).sum(-1) / ref.pow(2).sum(-1)).cpu().numpy()  # NMSE per token
print(f"NMSE per token against torch: worst {err.max():.3g} (prompt {err[:args.prompt].max():.3g}, "
      f"decode {err[args.prompt:].max() if args.steps else 0:.3g})")
if not (err.max() < 1e-4):
    raise SystemExit(f"FAIL: kiln's layer differs from torch's (worst token {int(err.argmax())}: NMSE {err.max():.3g})")
print("OK: every step matches torch's layer; inputs, outputs and positions stayed torch tensors on", dev)
