"""The binding's contracts beyond the ops: errors raise kiln.Error subclasses carrying kiln's
status and message and leave the context usable; zero-copy binding (outputs written in place,
borrowed weights kept alive, DLPack and __array_interface__ objects); states; presets; the cost
model rows and what-if placement; help() text."""
import gc

import numpy as np
import pytest
from conftest import assert_close

import kiln


def small_graph():
    g = kiln.Graph()
    x = g.input("x", "f32", [4, 8])
    g.output(g.scale(x, 3.0), "y")
    return g


def test_builder_error_raises_with_message_and_sticks():
    g = kiln.Graph()
    x = g.input("x", "f32", [4, 8])
    w = g.weight_random("w", "f32", [5, 7], seed=1, scale=1.0)
    with pytest.raises(kiln.ShapeError) as e:
        g.matmul(x, w)
    assert e.value.status == 2 and e.value.status_name == "shape"
    assert "8" in e.value.message and "7" in e.value.message, e.value.message
    assert g.status == 2 and g.error == e.value.message
    with pytest.raises(kiln.Error):
        g.silu(x)  # the first error sticks to the graph


def test_context_errors_leave_it_usable(ctx):
    with pytest.raises(kiln.ParseError) as e:
        ctx.parse("input x f32 [4]\nbogus y x\n", "bad.kg")
    assert "bad.kg:2" in e.value.message
    with pytest.raises(kiln.InvalidArgError):
        ctx.compile(small_graph(), backend="nosuch")
    with pytest.raises(kiln.NamingError) as e:
        ctx.preset("gpt-5")
    assert "qwen2-0.5b" in str(e.value)
    plan = ctx.compile(small_graph(), backend="cpu")  # still usable
    xv = np.random.default_rng().standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(kiln.BindingError):
        plan.run({"x": xv[:2]})
    with pytest.raises(kiln.BindingError, match="f32"):
        plan.run({"x": np.ascontiguousarray(xv.astype(np.float64)[:, :4])})  # same bytes, wrong dtype: refused
    np.testing.assert_allclose(plan.run({"x": xv})["y"], xv * 3.0, rtol=1e-6)


def test_symbol_out_of_range(ctx):
    g = kiln.Graph()
    n = g.sym("n", 4)
    g.output(g.silu(g.input("x", "f32", [n, 8])), "y")
    plan = ctx.compile(g)
    with pytest.raises(kiln.SymbolError):
        plan.run({"x": np.zeros((5, 8), np.float32) + 1}, {"n": 5})


def test_zero_copy_inputs_outputs_and_borrowed_weights(ctx, rng):
    w = rng.uniform(-1, 1, (16, 32)).astype(np.float32)
    g = kiln.Graph()
    x = g.input("x", "f32", [3, 32])
    g.output(g.matmul(x, g.weight("w", w, copy=False)), "y")
    plan = ctx.compile(g, backend="cpu")
    ref_w = w.astype(np.float64).copy()
    del g, w
    gc.collect()  # the plan keeps the borrowed array alive
    xv = rng.standard_normal((3, 32)).astype(np.float32)
    out = np.full((3, 16), np.nan, np.float32)
    res = plan.run({"x": memoryview(xv)}, out={"y": out}, read=())
    assert res["y"] is out and set(res) == {"y"}
    assert_close(out, xv.astype(np.float64) @ ref_w.T, "matmul")

    class Iface:  # anything with __array_interface__ binds in place
        def __init__(self, a):
            self.a, self.__array_interface__ = a, a.__array_interface__

    out2 = np.full((3, 16), np.nan, np.float32)
    plan.run({"x": Iface(xv)}, out={"y": Iface(out2)})
    np.testing.assert_array_equal(out2, out)
    out3 = np.full((3, 16), np.nan, np.float32)
    plan.run({"x": np.from_dlpack(xv)}, out={"y": out3})  # DLPack round trip with numpy
    np.testing.assert_array_equal(out3, out)
    with pytest.raises(ValueError, match="C-contiguous"):
        plan.run({"x": np.asfortranarray(xv)})


def test_states_read_and_write(ctx, rng):
    g = kiln.Graph()
    s = g.state("acc", "f32", [4])
    g.output(g.add(g.input("x", "f32", [4]), s), "y")
    plan = ctx.compile(g)
    assert np.all(plan.state("acc") == 0)
    sv = rng.standard_normal(4).astype(np.float32)
    plan.set_state("acc", sv)
    xv = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(plan.run({"x": xv})["y"], xv + sv, rtol=1e-6)
    assert plan.tensor("acc") == {"dtype": "f32", "shape": (4,), "bytes": 16}


def test_preset_layer_against_float64(ctx, rng):
    """A whole qwen2-style layer from the preset: kiln's cpu run against the ref backend's f64-checked
    evaluator is covered in C; here the binding must drive it end to end and agree with ref."""
    g = ctx.preset("qwen2-0.5b", wdtype="q8_0", n_layers=1, max_ctx=16, max_tok=4)
    assert g.inputs == ["x", "pos"] and g.outputs == ["y"] and g.states == ["k0", "v0"]
    xv = rng.uniform(-1, 1, (2, 896)).astype(np.float32)
    pv = np.arange(2, dtype=np.int32)
    ys = [ctx.compile(g, backend=b).run({"x": xv, "pos": pv}, {"n_tok": 2, "n_kv": 2})["y"] for b in ("ref", "cpu")]
    assert_close(ys[1], ys[0].astype(np.float64), "matmul", "q8_0")


def test_cost_model_rows_and_what_if(ctx, rng):
    g = ctx.preset("qwen2-0.5b", wdtype="q8_0", n_layers=1)
    plan = ctx.compile(g, backend="cpu")
    plan.profile(True)
    xv = rng.uniform(-1, 1, (1, 896)).astype(np.float32)
    for step in range(3):
        plan.run({"x": xv, "pos": np.array([step], np.int32)}, {"n_tok": 1, "n_kv": step + 1})
    rows = plan.regions()
    assert len(rows) == plan.kernel_count >= 3
    for r in rows:
        assert r["backend"] == "cpu" and r["predicted_s"] > 0 and r["n_measured"] == 3 and r["measured_s"] > 0
        assert r["bound"] in ("memory", "compute") and r["achieved_gbs"] > 0
    assert "fused ops" in plan.explain("text") and plan.explain("json").lstrip().startswith("{")
    assert plan.explain("dot").lstrip().startswith("digraph")

    with kiln.Context() as wctx:  # its own context: the profiles set here stay there
        fast = wctx.set_profile("cuda", mem_bw=3e12, launch_s=4e-6, h2d_bw=1e12, d2h_bw=1e12, xfer_latency_s=1e-6,
                                peak_flops=4e14)
        assert fast["mem_bw"] == 3e12 and fast["peak_flops"]["q8_0"] == 4e14
        assert wctx.profile("cuda") == fast
        wi = wctx.compile(g, what_if=True)
        on = {r["backend"] for r in wi.regions()}
        assert "cuda" in on, "a fast, well-linked GPU must take kernels in a what-if plan"
        with pytest.raises(kiln.UnsupportedError):
            wi.run({"x": xv, "pos": np.array([0], np.int32)}, {"n_tok": 1, "n_kv": 1})
        with pytest.raises(KeyError):
            wctx.set_profile("cuda", bandwidth=1)
        del wi


def test_help_reads_like_the_header():
    assert "y[.., n] = sum_k x[.., k] * w[n, k]" in kiln.Graph.matmul.__doc__
    assert "Causal grouped-query attention" in kiln.Graph.attention.__doc__


def test_cost_helpers_measure_and_what_if(ctx, rng):
    g = ctx.preset("qwen2-0.5b", wdtype="q8_0", n_layers=1, max_ctx=64)
    plan = ctx.compile(g, backend="cpu")
    xv = rng.uniform(-1, 1, (1, 896)).astype(np.float32)
    rows = kiln.cost.measure(plan, {"x": xv, "pos": np.array([7], np.int32)}, {"n_tok": 1, "n_kv": 8}, runs=4)
    assert [r["n_measured"] for r in rows] == [4] * plan.kernel_count
    table = kiln.cost.frame(rows)
    assert len(table) == plan.kernel_count
    with kiln.Context() as wctx:
        gpu = {"peak_flops": 4e14, "launch_s": 4e-6, "h2d_bw": 25e9, "d2h_bw": 25e9, "xfer_latency_s": 1e-5}
        res = kiln.cost.what_if(wctx, g, {"fast": {"cuda": {**gpu, "mem_bw": 3e12}},
                                          "slow": {"cuda": {**gpu, "mem_bw": 1e6}}})
        by = {r["scenario"]: r for r in res}
        assert by["fast"].get("on_cuda", 0) > 0 and by["slow"].get("on_cuda", 0) == 0, res
        assert by["fast"]["predicted_ms"] < by["slow"]["predicted_ms"]
        assert sum(v for k, v in by["slow"].items() if k.startswith("on_")) == len(by["slow"]["kernels"])


def test_split_plan_matches_the_unsplit_one(ctx):
    """compile(devices=...) splits a layer over virtual cpu devices: same outputs as one device."""
    g = ctx.preset("qwen2-0.5b", wdtype="f32", max_ctx=16, max_tok=2, seed=5)
    one = ctx.compile(g, backend="cpu")
    two = ctx.compile(g, devices="cpu:0,1")
    assert "tensor-parallel split across 2 devices" in two.explain()
    rng = np.random.default_rng()
    x = rng.uniform(-1, 1, (2, 896)).astype(np.float32)
    pos = np.array([3, 4], dtype=np.int32)
    a = one.run({"x": x, "pos": pos}, {"n_tok": 2, "n_kv": 5})["y"]
    b = two.run({"x": x, "pos": pos}, {"n_tok": 2, "n_kv": 5})["y"]
    err = float(np.sum((a.astype(np.float64) - b) ** 2) / np.sum(a.astype(np.float64) ** 2))
    assert err < 1e-10, err
    with pytest.raises(kiln.UnsupportedError) as e:
        ctx.compile(g, devices="cpu:0,1,2")
    assert "divide by 3" in e.value.message
