"""Smoke run of ``examples/rigid_body_stability.py`` (tiny sizes; no training result asserted).

Two seeds × 2 epochs × the three models on 31 short trajectories with 30-step rollouts: the JSON
holds the command, the commit and one row per model over exactly the seeds run; every run either
diverged (a step in 1…rollout, and no error or drift reported for it) or stayed (finite error and
drift), and each row's count of diverged runs and its mean error (1e-12) follow from the runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_rigid_body_stability_table(backend, tmp_path, capsys):
    if backend.name != "numpy":
        pytest.skip("examples/rigid_body_stability.py trains on NumPy arrays; the models run on every backend")
    spec = importlib.util.spec_from_file_location(
        "rigid_body_stability", os.path.join(EXAMPLES, "rigid_body_stability.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "rb.json"
    argv = ["--seeds", "2", "--epochs", "2", "--every", "40", "--t-end", "4", "--rollout", "30", "--json", str(path)]
    module.main(argv)
    assert "| vpt |" in capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result["command"].startswith("python examples/rigid_body_stability.py --seeds 2") and "commit" in result
    assert [row["model"] for row in result["table"]] == ["vpt", "vpff", "standard"]
    for row in result["table"]:
        runs = [r for r in result["results"] if r["model"] == row["model"]]
        assert row["seeds"] == [0, 1] and len(runs) == 2
        stayed = [r for r in runs if r["diverged_at_step"] is None]
        assert row["diverged"] == 2 - len(stayed)
        for r in runs:
            if r["diverged_at_step"] is None:
                assert math.isfinite(r["rollout_relative_error"]) and math.isfinite(r["max_norm_drift"])
            else:
                assert 1 <= r["diverged_at_step"] <= 30
                assert r["rollout_relative_error"] is None and r["max_norm_drift"] is None
        if stayed:
            mean = statistics.mean(r["rollout_relative_error"] for r in stayed)
            assert math.isclose(row["rollout_relative_error"]["mean"], mean, rel_tol=0, abs_tol=1e-12)
        else:
            assert row["rollout_relative_error"] is None


def test_unknown_model_is_refused():
    spec = importlib.util.spec_from_file_location(
        "rigid_body_stability", os.path.join(EXAMPLES, "rigid_body_stability.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        module.main(["--models", "vpt", "gpt", "--epochs", "1"])
