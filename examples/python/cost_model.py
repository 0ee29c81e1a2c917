"""Cost-model experiment from Python, notebook style (each block below is a cell): a qwen2-0.5b
decode layer is run on the CPU with per-kernel timing, predicted vs measured time per fused kernel
is printed (a DataFrame with pandas), the kernels are placed on the CPU's roofline (a PNG with
matplotlib), and what-if placement asks where the kernels would go on GPUs with different links.
Needs no GPU. Run: KILN_LIB=build/libkiln.so PYTHONPATH=python python3 examples/python/cost_model.py [out.png]
(or after `pip install .`: python3 examples/python/cost_model.py)."""
import sys

import numpy as np

import kiln

# %% A context and a preset layer (random q8_0 weights; any Graph works the same way)
ctx = kiln.Context()
print("backends:", ", ".join(f"{b['name']}{'' if b['available'] else ' (absent)'}" for b in ctx.backends))
g = ctx.preset("qwen2-0.5b", wdtype="q8_0", n_layers=1, max_ctx=512)
plan = ctx.compile(g, backend="cpu")
print(f"{plan.kernel_count} fused kernels, compiled in {plan.compile_ms:.1f} ms")

# %% Predicted vs measured, per kernel, at n_kv = 256
x = np.random.default_rng(0).uniform(-1, 1, (1, 896)).astype(np.float32)
rows = kiln.cost.measure(plan, {"x": x, "pos": np.array([255], np.int32)}, {"n_tok": 1, "n_kv": 256}, runs=20)
cols = ["kernel", "ops", "bound", "predicted_s", "measured_s", "achieved_gbs", "predicted_over_measured"]
table = kiln.cost.frame([{c: r.get(c) for c in cols} for r in rows])
print(table if not isinstance(table, list) else "\n".join(
    f"{r['kernel']:2d} {r['ops'][:40]:40s} {r['bound']:7s} pred {r['predicted_s'] * 1e6:8.1f} us  "
    f"meas {r['measured_s'] * 1e6:8.1f} us  {r['achieved_gbs']:6.1f} GB/s" for r in table))

# %% The roofline with every kernel on it (optional: matplotlib)
out = sys.argv[1] if len(sys.argv) > 1 else "cost_model_roofline.png"
try:
    import matplotlib

    matplotlib.use("Agg")
    ax = kiln.cost.roofline(rows, ctx.profile("cpu"), dtype="q8_0", title=f"qwen2-0.5b decode layer, cpu ({ctx.cpu_isa})")
    ax.figure.savefig(out, dpi=120, bbox_inches="tight")
    print("roofline written to", out)
except ImportError:
    print("matplotlib is not installed: no plot (pip install kiln[plot])")

# %% What-if: where would the kernels run on a GPU behind links of different speeds?
gpu = {"mem_bw": 3.0e12, "peak_flops": 4e14, "launch_s": 4e-6, "xfer_latency_s": 1e-5}
scen = {f"link {bw / 1e9:g} GB/s": {"cuda": {**gpu, "h2d_bw": bw, "d2h_bw": bw}} for bw in (1e6, 1e7, 1e8, 25e9)}
for r in kiln.cost.what_if(ctx, g, scen):
    other = sum(v for k, v in r.items() if k.startswith("on_") and k not in ("on_cpu", "on_cuda"))
    print(f"{r['scenario']:18s} cpu {r.get('on_cpu', 0):2d} kernels, cuda {r.get('on_cuda', 0):2d}, "
          f"other backends {other:2d}, predicted {r['predicted_ms']:.3f} ms")
