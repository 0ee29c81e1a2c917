"""Plan.run_async and PyTorch tensors: the stream argument's forms, run_async on a host plan (runs
as run() does, outputs in place); torch CPU tensors in and out without copies (DLPack); on a
machine with CUDA and torch (scripts/device-python.sh), torch CUDA tensors bound as device
memory on a cuda plan, ordered on torch's current stream, and the torch decode-loop example.
Skipped pieces say why (no torch, no CUDA)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_close

import kiln
from kiln._plan import _stream_handle

ROOT = Path(__file__).resolve().parents[2]


def mlp_graph(rows=8, d=32, f=48, seed=0):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((f, d)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((d, f)) / np.sqrt(f)).astype(np.float32)
    g = kiln.Graph()
    n = g.sym("n", rows)
    x = g.input("x", "f32", [n, d])
    g.output(x + g.matmul(g.silu(g.matmul(x, g.weight("w1", w1))), g.weight("w2", w2)), "y")
    return g, w1.astype(np.float64), w2.astype(np.float64)


def mlp_ref(x, w1, w2):
    h = x.astype(np.float64) @ w1.T
    return x + (h / (1 + np.exp(-h))) @ w2.T


def test_stream_handle_forms():
    class TorchLike:
        cuda_stream = 0x1234

    class Proto:
        def __cuda_stream__(self):
            return (0, 0x5678)

    class CupyLike:
        ptr = 0x9abc

    assert _stream_handle(None) is None and _stream_handle(0) is None
    assert _stream_handle(77) == 77
    assert _stream_handle(TorchLike()) == 0x1234
    assert _stream_handle(Proto()) == 0x5678
    assert _stream_handle(CupyLike()) == 0x9abc
    with pytest.raises(TypeError, match="stream"):
        _stream_handle("default")


def test_run_async_on_a_host_plan_writes_outputs_in_place(ctx, backend, rng):
    g, w1, w2 = mlp_graph()
    plan = ctx.compile(g, backend=backend)
    for n in (1, 5, 8):
        x = rng.standard_normal((n, 32)).astype(np.float32)
        y = np.full((n, 32), np.nan, np.float32)  # poisoned: every element must be written
        got = plan.run_async({"x": x}, {"n": n}, out={"y": y}, stream=None)
        assert got["y"] is y
        assert_close(y, mlp_ref(x, w1, w2), "matmul")
    with pytest.raises(kiln.SymbolError):  # checked before anything runs; the plan stays usable
        plan.run_async({"x": np.zeros((9, 32), np.float32)}, {"n": 9}, out={"y": np.zeros((9, 32), np.float32)})
    x = rng.standard_normal((2, 32)).astype(np.float32)
    assert_close(plan.run_async({"x": x}, {"n": 2}, out={"y": np.empty((2, 32), np.float32)})["y"],
                 mlp_ref(x, w1, w2), "matmul")


def test_torch_cpu_tensors_bind_in_place(ctx, backend):
    torch = pytest.importorskip("torch")
    g, w1, w2 = mlp_graph()
    plan = ctx.compile(g, backend=backend)
    x = torch.randn(6, 32)
    y = torch.full((6, 32), float("nan"))
    plan.run({"x": x}, {"n": 6}, out={"y": y})
    assert_close(y.numpy(), mlp_ref(x.numpy(), w1, w2), "matmul")
    y2 = torch.full((3, 32), float("nan"))
    plan.run_async({"x": x[2:5]}, {"n": 3}, out={"y": y2}, stream=None)  # a row slice is contiguous
    assert_close(y2.numpy(), mlp_ref(x[2:5].numpy(), w1, w2), "matmul")
    with pytest.raises(ValueError, match="contiguous"):
        plan.run({"x": x.t().contiguous().t()}, {"n": 6})  # a transposed view is refused, not copied


def _cuda_ready(ctx):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    if not any(b["name"] == "cuda" and b["available"] for b in ctx.backends):
        pytest.skip("kiln's cuda backend is absent")
    return torch


def test_torch_cuda_tensors_on_the_current_stream(ctx):
    torch = _cuda_ready(ctx)
    g, w1, w2 = mlp_graph()
    plan = ctx.compile(g, backend="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.randn(8, 32, device="cuda")
        y = torch.full((8, 32), float("nan"), device="cuda")
        for _ in range(20):  # each step's x is made on the stream from the last y: order matters
            x.copy_(torch.tanh(y.nan_to_num(0.5)))
            plan.run_async({"x": x}, {"n": 8}, out={"y": y}, stream=torch.cuda.current_stream())
        last_x = x.clone()
    s.synchronize()
    assert_close(y.cpu().numpy(), mlp_ref(last_x.cpu().numpy(), w1, w2), "matmul")
    y2 = torch.empty(8, 32, device="cuda")  # run() with device tensors too
    plan.run({"x": last_x}, {"n": 8}, out={"y": y2})
    torch.cuda.synchronize()
    assert_close(y2.cpu().numpy(), mlp_ref(last_x.cpu().numpy(), w1, w2), "matmul")


def test_torch_decode_example():
    pytest.importorskip("torch")
    dev = os.environ.get("KILN_TORCH_EXAMPLE")  # "cpu" or "cuda": scripts/device-python.sh runs it
    if not dev:
        pytest.skip("KILN_TORCH_EXAMPLE unset (the example runs from scripts/device-python.sh)")
    args = ["--device", dev] + (["--small", "--steps", "8", "--prompt", "4"] if dev == "cpu" else [])
    r = subprocess.run([sys.executable, str(ROOT / "examples/python/torch_decode.py"), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: every step matches" in r.stdout, r.stdout
