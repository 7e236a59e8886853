"""``examples/jax_sharded.py`` at a smoke size: 4 host CPU devices, in a fresh interpreter (JAX fixes
its number of CPU devices when it is first imported, and this session's JAX is already initialised).

What the example promises, checked from its output: the stack of 8 frames lives as 2 whole frames per
device and so does their Adam state (each device steps its own frames), the tall 32×8 weight as 8 rows
per device; the weights stay orthonormal (max |YᵀY − I| ≤ 1e-12 in float64); and the sharded steps
equal the same steps on one device to 1e-12 (``--check``; the reductions of the gradients round
differently, so not bit for bit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _jax_common import require_jax

ROOT = Path(__file__).resolve().parents[1]


def test_jax_sharded_example_shards_frames_and_state_and_equals_one_device(backend):
    require_jax(backend)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, str(ROOT / "examples" / "jax_sharded.py"), "--devices", "4", "--steps", "3", "--check"]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("examples/jax_sharded.py did not finish within 240 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "mesh: 4 devices along 'data'" in out, out
    assert re.search(r"frames\s+\(8, 16, 4\) → per device \[\(2, 16, 4\)\]", out), out
    assert re.search(r"mix\s+\(32, 8\) → per device \[\(8, 8\)\]", out), out
    state = re.findall(r"state of the frames \((8, \d+, 4)\) → per device \[\((2, \d+, 4)\)\]", out)
    assert len(state) == 4 and all(whole[3:] == mine[3:] for whole, mine in state), out  # Adam's two moments, A and B
    losses = [float(v) for v in re.findall(r"loss ([0-9.]+)", out)]
    assert len(losses) == 3, out
    orth = float(re.search(r"max\|YᵀY − I\| = ([0-9.e+-]+)", out).group(1))
    diff = float(re.search(r"max difference from one device = ([0-9.e+-]+)", out).group(1))
    assert orth <= 1e-12 and diff <= 1e-12, out
