"""``geoarray train vpt|lst|sympnet``: 2-epoch smoke runs on the session's backend (metrics JSON with
finite losses, the rollout's error or the step where it diverged, PNG plots), one-line errors with
exit code 2, and honest output for a diverging rollout:

* ``divergence_step`` finds the first predicted step whose state is non-finite or whose invariant is
  off by more than ``DIVERGENCE_FACTOR`` · |I(z_0)| (steps counted after the T-state window), and
  None for a rollout that stays;
* a rollout forced to leave (the model's rollout replaced by the truth scaled by 1.5ⁿ) is printed as
  ``DIVERGED at step n`` without a number in scientific notation, its JSON has the step and null
  error and drift, and the plot is still written.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from geoarray.cli import main
from geoarray.commands.dynamics import DIVERGENCE_FACTOR, divergence_step

_CLI_BACKENDS = {"numpy", "array-api-strict", "torch", "jax"}
# 24 (vpt, lst) and 36 (sympnet) windows: whole batches of 12, because geoarray.train.fit slices the last
# batch past the end, which array-api-strict rejects (reported to the lead)
_SMALL = ["--epochs", "2", "--n-traj", "3", "--n-steps", "12", "--rollout", "8", "--batch-size", "12", "--no-progress"]


@pytest.mark.parametrize(
    "cmd",
    [["vpt"], ["lst"], ["lst", "--attention-init", "normal"], ["sympnet"], ["sympnet", "--system", "oscillator"]],
    ids=" ".join,
)
def test_train_dynamics_smoke(cmd, backend, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--out writes matplotlib plots")
    if backend.name not in _CLI_BACKENDS:
        pytest.skip(f"the CLI runs on CPU backends {sorted(_CLI_BACKENDS)}; {backend.name} has no --backend value")
    argv = ["train", *cmd, "--backend", backend.name, "--out", str(tmp_path), *_SMALL]
    assert main(argv) == 0
    out = capsys.readouterr().out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    assert all(math.isfinite(h["train_loss"]) for h in metrics["history"])
    summary = metrics["summary"]
    assert summary["rollout_steps"] == 8
    if summary["rollout_diverged_at_step"] is None:  # 2 epochs may or may not give a stable rollout
        assert "relative error" in out and math.isfinite(summary["rollout_relative_error"])
    else:
        assert 1 <= summary["rollout_diverged_at_step"] <= 8 and "DIVERGED at step" in out
    for name in ("loss.png", "rollout.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_too_short_trajectories_are_one_line_errors(capsys):
    assert main(["train", "vpt", "--n-steps", "2", "--seq-len", "3", "--epochs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--n-steps" in err and len(err.splitlines()) == 1


def test_divergence_step():
    T, n = 3, 10
    z = np.ones((2, T + n, 3))
    inv = np.ones((2, T + n))
    assert divergence_step(z, inv, T) is None
    inv[1, T - 1 + 4] = 1 + 1.01 * DIVERGENCE_FACTOR  # off by more than the factor at predicted step 4
    assert divergence_step(z, inv, T) == 4
    inv[0, T - 1 + 6] = 1 + 0.99 * DIVERGENCE_FACTOR  # within the factor: not a divergence
    assert divergence_step(z, inv, T) == 4
    z[0, T - 1 + 2, 1] = np.nan  # a non-finite state comes first
    assert divergence_step(z, inv, T) == 2
    z[...] = 1.0
    inv[...] = 1.0
    inv[0, 1] = 5.0  # inside the true initial window: not the model's step
    assert divergence_step(z, inv, T) is None


def test_diverging_rollout_is_reported_as_diverged(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib", reason="--out writes matplotlib plots")
    import geoarray.models

    def blow_up(model, params, window, n_steps):  # the truth scaled by 1.5 per predicted step
        from geoarray.data import systems

        ref = systems.rigid_body_trajectories(window[:, 0, :], window.shape[-2] - 1 + n_steps)
        growth = 1.5 ** np.maximum(np.arange(ref.shape[-2]) - (window.shape[-2] - 1), 0)
        return ref * growth[:, None]

    monkeypatch.setattr(geoarray.models, "iterate", blow_up)
    argv = ["train", "vpt", "--backend", "numpy", "--out", str(tmp_path), *_SMALL]
    assert main(argv) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("vpt:"))
    # ‖z‖ = 1.5ⁿ: off by more than 100 % once 1.5ⁿ > 2, i.e. from step 2
    assert "DIVERGED at step 2" in line and not re.search(r"\de[+-]\d", line.split("loss", 1)[1]), line
    summary = json.loads((tmp_path / "metrics.json").read_text())["summary"]
    assert summary["rollout_diverged_at_step"] == 2
    assert summary["rollout_relative_error"] is None and summary["rollout_max_drift_|z|"] is None
    assert (tmp_path / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_vpt_takes_no_system_flag(capsys):
    """``train vpt`` learns the rigid body only: ``--system`` (sympnet's) is refused, not ignored."""
    code = main(["train", "vpt", "--system", "oscillator", "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "error: unrecognized arguments: --system oscillator" in err, err  # argparse's top-level parser says it
