"""Plan.run_async on a vulkan plan (lavapipe in CI) with a kiln.VkSync: steps queued back to back,
their inputs reused at once (copied at the call), their outputs written by Plan.wait() with run()'s
bits; a stream of the wrong kind for the plan's backend is a TypeError before anything runs.
Skipped when no Vulkan device is present. Semaphores need a Vulkan binding on the caller's side:
the C tests (tests/test_vk_async.c) cover them."""
import numpy as np
import pytest
from test_async_torch import mlp_graph

import kiln


@pytest.fixture
def vk_plan(ctx):
    if not any(b["name"] == "vulkan" and b["available"] for b in ctx.backends):
        pytest.skip("no Vulkan device")
    g, _, _ = mlp_graph()
    return ctx.compile(g, backend="vulkan")


def test_steps_queued_with_a_vksync_match_run(vk_plan, rng):
    xs = [rng.standard_normal((n, 32)).astype(np.float32) for n in (1, 5, 8)]
    want = [vk_plan.run({"x": x}, {"n": len(x)}, out={"y": np.empty_like(x)})["y"] for x in xs]
    x = np.empty((8, 32), np.float32)
    ys = [np.full_like(w, np.nan) for w in want]
    for xi, y in zip(xs, ys):
        x[:len(xi)] = xi
        vk_plan.run_async({"x": x[:len(xi)]}, {"n": len(xi)}, out={"y": y}, stream=kiln.VkSync())
        x[:] = np.nan  # copied at the call
    vk_plan.wait()
    for y, w in zip(ys, want):
        assert np.array_equal(y.view(np.uint32), w.view(np.uint32))
    vk_plan.wait()  # nothing queued


def test_stream_kinds_are_checked(vk_plan, ctx):
    x, y = np.ones((2, 32), np.float32), np.empty((2, 32), np.float32)
    with pytest.raises(TypeError, match="VkSync"):
        vk_plan.run_async({"x": x}, {"n": 2}, out={"y": y}, stream=0x1234)
    g, _, _ = mlp_graph()
    cpu = ctx.compile(g, backend="cpu")
    with pytest.raises(TypeError, match="vulkan plan"):
        cpu.run_async({"x": x}, {"n": 2}, out={"y": y}, stream=kiln.VkSync())
    with pytest.raises(ValueError, match="wait values"):
        kiln.VkSync(wait=[1, 2], wait_values=[1])
    with pytest.raises(kiln.InvalidArgError, match="VK_NULL_HANDLE"):
        vk_plan.run_async({"x": x}, {"n": 2}, out={"y": y}, stream=kiln.VkSync(wait=[0]))
    vk_plan.run_async({"x": x}, {"n": 2}, out={"y": y}, stream=None)  # None: as run()
    assert np.all(np.isfinite(y))
