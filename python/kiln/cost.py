"""Cost-model experiments in a notebook: per-kernel predicted vs measured rows, what-if placement
across device profiles, and the roofline with every kernel on it. Rows are plain dicts (a pandas
DataFrame through frame() when pandas is installed); the plot needs matplotlib (pip install
kiln[plot]). Must not change a context's profiles except where a function says it does.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ._graph import Graph
from ._plan import Context, Plan


def frame(rows: Sequence[dict]):
    """rows as a pandas DataFrame when pandas is installed, else the list itself."""
    try:
        import pandas as pd
    except ImportError:
        return list(rows)
    return pd.DataFrame(list(rows))


def measure(plan: Plan, inputs: Mapping, symbols: Mapping[str, int] | None = None, runs: int = 10) -> list[dict]:
    """Runs the plan `runs` times with per-kernel timing on and returns its regions() rows:
    predicted_s next to measured_s, achieved GB/s and GFLOP/s, predicted_over_measured."""
    plan.profile(True)
    try:
        for _ in range(runs):
            plan.run(inputs, symbols, read=())
    finally:
        plan.profile(False)
    return plan.regions()


def what_if(ctx: Context, graph: Graph, scenarios: Mapping[str, Mapping[str, Mapping]]) -> list[dict]:
    """Places `graph` once per scenario as if every profiled backend were present (what-if plans:
    explained, never run). A scenario maps backend -> profile fields to override, e.g.
    {"pcie4": {"cuda": {"mem_bw": 2e12, "h2d_bw": 25e9}}}. Changes ctx's profiles (restored after,
    where the backend had one). Returns one row per scenario: kernels per backend and the total
    predicted time (kernels + transfers) in ms, and the plan's kernel rows under "kernels"."""
    rows = []
    for name, overrides in scenarios.items():
        saved = {}
        for be in overrides:
            try:
                saved[be] = ctx.profile(be)
            except Exception:  # noqa: BLE001 - no profile yet: nothing to restore
                saved[be] = None
        try:
            for be, fields in overrides.items():
                ctx.set_profile(be, fields)
            with ctx.compile(graph, what_if=True) as plan:
                kern = plan.regions()
        finally:
            for be, prof in saved.items():
                if prof is not None:
                    ctx.set_profile(be, prof)
        per = {}
        for k in kern:
            per[k["backend"]] = per.get(k["backend"], 0) + 1
        total = sum(k["predicted_s"] + k["transfer_s"] for k in kern)
        rows.append({"scenario": name, **{f"on_{b}": n for b, n in sorted(per.items())},
                     "predicted_ms": total * 1e3, "kernels": kern})
    return rows


def roofline(rows: Sequence[dict], profile: Mapping, dtype: str = "f32", ax=None, title: str | None = None):
    """Plots the roofline of `profile` (ctx.profile(backend)) with every kernel of `rows`
    (Plan.regions() or measure()) placed at its arithmetic intensity: measured GFLOP/s as dots,
    predicted as crosses. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt  # optional dependency: pip install kiln[plot]

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    peak, bw = profile["peak_flops"].get(dtype) or max(profile["peak_flops"].values()), profile["mem_bw"]
    xs = [r["flops"] / r["bytes"] for r in rows if r["bytes"] > 0 and r["flops"] > 0]
    lo, hi = min(xs + [0.1]) / 2, max(xs + [peak / bw * 4]) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.loglog(grid, [min(peak, bw * x) / 1e9 for x in grid], "k-", lw=1.5,
              label=f"roof: {bw / 1e9:.0f} GB/s, {peak / 1e9:.0f} GFLOP/s ({dtype})")
    for r in rows:
        if r["bytes"] <= 0 or r["flops"] <= 0:
            continue
        x = r["flops"] / r["bytes"]
        label = f"{r['kernel']}: {r['ops'][:28]}"
        if r.get("predicted_s", 0) > 0:
            ax.scatter([x], [r["flops"] / r["predicted_s"] / 1e9], marker="x", color="gray")
        if r.get("measured_s"):
            ax.scatter([x], [r["flops"] / r["measured_s"] / 1e9], label=label)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s (dots: measured, x: predicted)")
    ax.set_title(title or "kiln kernels on the roofline")
    ax.legend(fontsize=7, loc="lower right")
    return ax
