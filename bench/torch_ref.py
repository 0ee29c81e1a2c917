#!/usr/bin/env python3
"""PyTorch on the same GPU as kiln, for the comparisons in bench/ and scripts/device-check: cuBLAS
GEMM rates (torch.matmul, f16) at kiln's shapes, and one llama-7b decoder layer's 512-token prefill
in eager PyTorch and torch.compile (f16 weights and activations, SDPA attention, RoPE, SwiGLU),
each also captured into a CUDA graph and replayed (the GPU's time alone, as kiln's replay is);
serve: the same layer's decode step of N sequences at KV length C (issue #21's peer: cuBLAS + SDPA over
contiguous equal-length caches, no paging, one captured CUDA graph) and the copy bandwidth of the run
(the floor is weights + KV bytes over it). JSON, one object per line. Needs torch with CUDA; prints
an error object otherwise.
Usage: bench/torch_ref.py [gemm] [layer] [--compile] [serve NxC ...]   (serve default: 16x1024 64x1024 256x1024 64x4096)"""
import json, sys, time

def timed(fn, reps=20):
    import torch
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2] * 1e-3

def graphed(fn, x, reps=50):
    """fn(x) captured into a CUDA graph, replayed reps times back to back: seconds per replay."""
    import torch
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for _ in range(3): fn(x)
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    for _ in range(3): g.replay()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e-3 / reps

def rms(x, w):
    """rms_norm in f32, back in x's dtype (f16 here), times w: the layer's and serve's."""
    import torch
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

def rope(x, cos, sin):
    """Normal (interleaved pairs) RoPE of x [.., heads, HD] by cos/sin [.., 1, HD/2]."""
    import torch
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

def gemm():
    import torch
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 4096), (512, 12288, 4096), (512, 4096, 4096),
                    (512, 22016, 4096), (512, 4096, 11008), (128, 4096, 4096), (64, 4096, 4096)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        s = timed(lambda: x @ w.t())
        print(json.dumps({"torch": "matmul", "m": m, "n": n, "k": k, "dtype": "f16", "ms": round(s * 1e3, 4),
                          "tflop_per_s": round(2 * m * n * k / s * 1e-12, 1)}), flush=True)

def layer(compile_too):
    import torch, torch.nn.functional as F
    D, H, KV, HD, FF, T = 4096, 32, 32, 128, 11008, 512
    dt = torch.float16
    p = {n: (torch.randn(*s, device="cuda", dtype=dt) * 0.02) for n, s in
         [("wqkv", (3 * D, D)), ("wo", (D, D)), ("wgu", (2 * FF, D)), ("wd", (D, FF))]}
    n1 = torch.ones(D, device="cuda", dtype=dt); n2 = torch.ones(D, device="cuda", dtype=dt)
    pos = torch.arange(T, device="cuda")
    inv = 1.0 / (10000 ** (torch.arange(0, HD, 2, device="cuda").float() / HD))
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = ang.cos().to(dt)[:, None, :], ang.sin().to(dt)[:, None, :]
    def f(x):
        h = rms(x, n1) @ p["wqkv"].t()
        q, k, v = h.split(D, -1)
        q = rope(q.view(T, H, HD), cos, sin).transpose(0, 1); k = rope(k.view(T, KV, HD), cos, sin).transpose(0, 1)
        v = v.view(T, KV, HD).transpose(0, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, D)
        x = x + a @ p["wo"].t()
        g, u = (rms(x, n2) @ p["wgu"].t()).split(FF, -1)
        return x + (F.silu(g) * u) @ p["wd"].t()
    x = torch.randn(T, D, device="cuda", dtype=dt)
    with torch.no_grad():
        s = timed(lambda: f(x))
        print(json.dumps({"torch": "llama-7b layer prefill", "mode": "eager", "tokens": T, "ms_per_layer": round(s * 1e3, 4)}), flush=True)
        # kiln replays a recorded CUDA graph; eager PyTorch pays a Python launch per op. The same
        # layer captured into a CUDA graph and replayed times the GPU's work alone.
        print(json.dumps({"torch": "llama-7b layer prefill", "mode": "eager+cudagraph", "tokens": T,
                          "ms_per_layer": round(graphed(f, x) * 1e3, 4)}), flush=True)
        if compile_too:
            for mode in ("default", "max-autotune-no-cudagraphs"):
                t0 = time.time()
                fc = torch.compile(f, mode=mode)
                fc(x); torch.cuda.synchronize()
                s = timed(lambda: fc(x))
                cs = round(time.time() - t0, 1)
                print(json.dumps({"torch": "llama-7b layer prefill", "mode": f"torch.compile {mode}", "tokens": T,
                                  "ms_per_layer": round(s * 1e3, 4), "compile_s": cs}), flush=True)
                print(json.dumps({"torch": "llama-7b layer prefill", "mode": f"torch.compile {mode}+cudagraph", "tokens": T,
                                  "ms_per_layer": round(graphed(fc, x) * 1e3, 4)}), flush=True)

def copy_bw():
    """GB/s of a 2 GiB device-to-device copy (read + write bytes over the time), as kiln calibrate's."""
    import torch
    a = torch.empty(1 << 30, device="cuda", dtype=torch.float16); b = torch.empty_like(a)
    s = timed(lambda: b.copy_(a), reps=10)
    del a, b
    return 2 * (1 << 31) / s * 1e-9

def serve(cases, compile_too):
    """A llama-7b f16 layer's decode step of N sequences at KV C: q, k, v of the N new tokens, k and
    v written into contiguous [N, H, C + 1, HD] caches at position C, SDPA of one query row per
    sequence over its C + 1 keys, O, MLP. Captured into a CUDA graph, replayed."""
    import torch, torch.nn.functional as F
    D, H, HD, FF = 4096, 32, 128, 11008
    dt = torch.float16
    bw = copy_bw()
    print(json.dumps({"torch": "copy", "gb_per_s": round(bw, 1)}), flush=True)
    p = {n: (torch.randn(*s, device="cuda", dtype=dt) * 0.02) for n, s in
         [("wqkv", (3 * D, D)), ("wo", (D, D)), ("wgu", (2 * FF, D)), ("wd", (D, FF))]}
    wbytes = sum(t.numel() * 2 for t in p.values())
    n1 = torch.ones(D, device="cuda", dtype=dt); n2 = torch.ones(D, device="cuda", dtype=dt)
    inv = 1.0 / (10000 ** (torch.arange(0, HD, 2, device="cuda").float() / HD))
    for case in cases:
        N, C = (int(v) for v in case.split("x"))
        kc = torch.randn(N, H, C + 1, HD, device="cuda", dtype=dt); vc = torch.randn_like(kc)
        ang = torch.full((N, 1), float(C), device="cuda") * inv[None, :]
        cos, sin = ang.cos().to(dt)[:, None, :], ang.sin().to(dt)[:, None, :]
        def f(x):
            h = rms(x, n1) @ p["wqkv"].t()
            q, k, v = h.split(D, -1)
            q = rope(q.view(N, H, HD), cos, sin); k = rope(k.view(N, H, HD), cos, sin)
            kc[:, :, C] = k; vc[:, :, C] = v.view(N, H, HD)
            a = F.scaled_dot_product_attention(q[:, :, None], kc, vc).reshape(N, D)
            x = x + a @ p["wo"].t()
            g, u = (rms(x, n2) @ p["wgu"].t()).split(FF, -1)
            return x + (F.silu(g) * u) @ p["wd"].t()
        x = torch.randn(N, D, device="cuda", dtype=dt)
        kvbytes = 2 * kc.numel() * 2
        floor = (wbytes + kvbytes) / (bw * 1e9) * 1e3
        modes = [("eager+cudagraph", f)]
        if compile_too: modes.append(("torch.compile default+cudagraph", torch.compile(f)))
        with torch.no_grad():
            for mode, fn in modes:
                ms = graphed(fn, x) * 1e3
                print(json.dumps({"torch": "llama-7b layer serve decode", "mode": mode, "seqs": N, "ctx": C,
                                  "ms_per_layer": round(ms, 4), "floor_ms": round(floor, 4),
                                  "fraction_of_floor": round(floor / ms, 3), "bytes": wbytes + kvbytes}), flush=True)
        del kc, vc
        torch.cuda.empty_cache()

if __name__ == "__main__":
    try:
        import torch
        assert torch.cuda.is_available()
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"error": f"torch with CUDA unavailable: {e}"})); sys.exit(0)
    args = sys.argv[1:] or ["gemm", "layer"]
    if "gemm" in args: gemm()
    if "layer" in args: layer("--compile" in args)
    if "serve" in args:
        cases = [a for a in args if "x" in a and a[0].isdigit()] or ["16x1024", "64x1024", "256x1024", "64x4096"]
        serve(cases, "--compile" in args)
