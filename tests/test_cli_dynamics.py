"""``geoarray train vpt|lst|sympnet``: 2-epoch smoke runs on the session's backend (metrics JSON with
finite losses and rollout errors, PNG plots) and one-line errors with exit code 2."""

from __future__ import annotations

import json
import math

import pytest

from geoarray.cli import main

_CLI_BACKENDS = {"numpy", "array-api-strict", "torch", "jax"}
# 24 (vpt, lst) and 36 (sympnet) windows: whole batches of 12, because geoarray.train.fit slices the last
# batch past the end, which array-api-strict rejects (reported to the lead)
_SMALL = ["--epochs", "2", "--n-traj", "3", "--n-steps", "12", "--rollout", "8", "--batch-size", "12", "--no-progress"]


@pytest.mark.parametrize("cmd", [["vpt"], ["lst"], ["sympnet"], ["sympnet", "--system", "oscillator"]], ids=" ".join)
def test_train_dynamics_smoke(cmd, backend, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--out writes matplotlib plots")
    if backend.name not in _CLI_BACKENDS:
        pytest.skip(f"the CLI runs on CPU backends {sorted(_CLI_BACKENDS)}; {backend.name} has no --backend value")
    argv = ["train", *cmd, "--backend", backend.name, "--out", str(tmp_path), *_SMALL]
    assert main(argv) == 0
    assert "relative error" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    assert all(math.isfinite(h["train_loss"]) for h in metrics["history"])
    assert metrics["summary"]["rollout_steps"] == 8
    assert math.isfinite(metrics["summary"]["rollout_relative_error"])
    for name in ("loss.png", "rollout.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_too_short_trajectories_are_one_line_errors(capsys):
    assert main(["train", "vpt", "--n-steps", "2", "--seq-len", "3", "--epochs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--n-steps" in err and len(err.splitlines()) == 1
