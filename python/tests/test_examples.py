"""The Python examples run as a user runs them: examples/python/cost_model.py (notebook-style
cells as a script, on the CPU) prints a predicted vs measured row per kernel and a what-if row per
scenario, whose kernel counts add up to the plan's."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cost_model_example_runs(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples/python/cost_model.py"), str(tmp_path / "roof.png")],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"(\d+) fused kernels", r.stdout)
    assert m, r.stdout
    kernels = int(m.group(1))
    # where a GPU machine has a calibrated vulkan too, some kernels go there: every backend counts
    scen = re.findall(r"^link .* cpu +(\d+) kernels, cuda +(\d+), other backends +(\d+), predicted ([0-9.]+) ms",
                      r.stdout, re.M)
    assert len(scen) == 4, r.stdout
    for cpu, cuda, other, ms in scen:
        assert int(cpu) + int(cuda) + int(other) == kernels and float(ms) > 0, (cpu, cuda, other, ms, kernels)
    assert ("roofline written to" in r.stdout) == (tmp_path / "roof.png").exists(), r.stdout
