"""Sharded parameters and optimizer state, ``make_train_step(..., mesh=mesh, param_sharding=specs)``,
through ``examples/jax_sharded.py`` at a smoke size (so the example cannot rot either).

4 host CPU devices (``--xla_force_host_platform_device_count=4``, set before JAX initialises: a fresh
interpreter, run once for this module, bounded time); a ``(8, 16, 4)`` stack of Stiefel frames sharded
along the stack (``PartitionSpec("data")``: 2 frames per device), a tall ``32×8`` Stiefel weight sharded
by rows, a plain replicated readout, the batch of 16 split over the same axis; Adam, 5 steps, float64.
What the example prints is checked against what it promises:

* the sharded steps equal the same steps on one device — parameters, optimizer state and loss — to
  1e-12 (the reductions of the gradients round differently, so not bit for bit), and the weights stay
  orthonormal (max |YᵀY − I| ≤ 1e-12);
* the parameters stay sharded (2 frames, 8 rows per device) and the optimizer state of the frames is
  sharded like the frames (each device holds the state of its own frames: Adam's two moments of the
  horizontal components A (8, 4, 4) and B (8, 12, 4), 2 frames of each per device);
* the compiled step (its HLO) has no collective whose result is the frames' stack or its state — they
  are never gathered — while the row-sharded 32×8 weight is all-gathered whole (``f64[32,8]``) where
  the update needs it.

(ManifoldMuon gives the same picture — measured, 9e-16 — and is left out to keep the compile time of
this test down: the two compiled steps are most of its ~20 s.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _jax_common import require_jax

ROOT = Path(__file__).resolve().parents[1]
STEPS = 5


@pytest.fixture(scope="module")
def printed(backend):
    """What ``examples/jax_sharded.py --devices 4 --steps 5 --check`` prints, run once in a fresh interpreter."""
    require_jax(backend)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, str(ROOT / "examples" / "jax_sharded.py"), "--devices", "4", "--steps", str(STEPS)]
    try:
        proc = subprocess.run([*cmd, "--check"], env=env, capture_output=True, text=True, timeout=240, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("examples/jax_sharded.py did not finish within 240 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_sharded_steps_equal_one_device_and_stay_on_the_manifold(printed):
    losses = [float(v) for v in re.findall(r"loss ([0-9.]+)", printed)]
    assert len(losses) == STEPS, printed
    orth = float(re.search(r"max\|YᵀY − I\| = ([0-9.e+-]+)", printed).group(1))
    diff = float(re.search(r"max difference from one device \(parameters, state, loss\) = ([0-9.e+-]+)", printed)[1])
    assert orth <= 1e-12, printed
    assert diff <= 1e-12, printed


def test_parameters_and_the_frames_state_stay_sharded(printed):
    assert "mesh: 4 devices along 'data'" in printed, printed
    assert re.search(r"frames\s+\(8, 16, 4\) → per device \[\(2, 16, 4\)\]", printed), printed
    assert re.search(r"mix\s+\(32, 8\) → per device \[\(8, 8\)\]", printed), printed
    state = re.findall(r"state of the frames \((8, \d+, 4)\) → per device \[\((2, \d+, 4)\)\]", printed)
    # Adam's two moments of A (8, 4, 4) and of B (8, 12, 4), each cut into 2 frames per device
    assert sorted(whole for whole, _ in state) == ["8, 12, 4", "8, 12, 4", "8, 4, 4", "8, 4, 4"], printed
    assert all(whole[1:] == mine[1:] for whole, mine in state), printed


def test_the_compiled_step_never_gathers_the_frames_or_their_state(printed):
    """The collectives of the compiled step, read from its HLO by the example: none that moves data
    between devices returns the frames' stack or its state (a dimension of 8 frames followed by a
    frame's or a state's trailing shape); the row-sharded 32×8 weight is all-gathered whole."""
    found = re.findall(r"^  (all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)\s+(\S+)\s+×\d+$",
                       printed, flags=re.MULTILINE)  # fmt: skip
    assert found, printed
    for kind, shape in found:
        if kind in ("all-gather", "collective-permute", "all-to-all"):
            assert shape.split("[")[1].rstrip("]") not in ("8,16,4", "8,4,4", "8,12,4"), (kind, shape, printed)
    assert ("all-gather", "f64[32,8]") in found, printed
