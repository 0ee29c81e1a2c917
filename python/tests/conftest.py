"""Shared helpers of the binding's tests: a quiet context on the backend under test ($KILN_TEST_BACKEND,
default cpu; the tests' cache folder from $KILN_CACHE_DIR), fresh random data, the NMSE against an
f64 reference, and tolerances read from contracts/<op>.yaml (the single source of truth)."""
import os
import re
from pathlib import Path

import numpy as np
import pytest

import kiln

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ctx():
    c = kiln.Context(quiet=True)
    yield c
    c.close()


@pytest.fixture(scope="session")
def backend():
    return os.environ.get("KILN_TEST_BACKEND", "cpu")


@pytest.fixture
def rng(request):
    """Fresh data every run from a printed seed (pytest shows it with a failure); KILN_TEST_SEED=<seed>
    replays it."""
    env = os.environ.get("KILN_TEST_SEED")
    seed = int(env, 0) if env else int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"seed {seed} of {request.node.name}: KILN_TEST_SEED={seed} replays it")
    return np.random.default_rng(seed)


def tolerance(op: str, dtype: str = "f32") -> float:
    """The NMSE bound of op for dtype from contracts/<op>.yaml."""
    text = (ROOT / "contracts" / f"{op}.yaml").read_text()
    block = text.split("\ntolerance:", 1)[1]
    m = re.search(rf"^\s+{re.escape(dtype)}:\s*([0-9.eE+-]+)", block, re.M)
    assert m, f"contracts/{op}.yaml has no {dtype} tolerance"
    return float(m.group(1))


def nmse(y, ref) -> float:
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    assert np.all(np.isfinite(y)), "non-finite output"
    return float(np.sum((y - ref) ** 2) / max(np.sum(ref ** 2), 1e-300))


def assert_close(y, ref, op: str, dtype: str = "f32"):
    e, tol = nmse(y, ref), tolerance(op, dtype)
    assert e <= max(tol, 1e-14), f"{op}: NMSE {e:.3e} over the contract's {tol:.1e}"
