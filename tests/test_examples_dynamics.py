"""Smoke run of ``examples/rigid_body_stability.py`` (tiny sizes; no training result asserted).

Two seeds × 2 epochs × the three models on 31 short trajectories with 30-step rollouts: the JSON and the figure
holds the command, the commit and one row per model over exactly the seeds run; every run either
diverged (a step in 1…rollout, and no error or drift reported for it) or stayed (finite error and
drift), and each row's count of diverged runs and its mean error (1e-12) follow from the runs.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest
from _examples import load_example


def test_rigid_body_stability_table(backend, tmp_path, capsys):
    if backend.name != "numpy":
        pytest.skip("examples/rigid_body_stability.py trains on NumPy arrays; the models run on every backend")
    module = load_example("rigid_body_stability")
    pytest.importorskip("matplotlib")
    path, figure = tmp_path / "rb.json", tmp_path / "rb.png"
    argv = ["--seeds", "2", "--epochs", "2", "--every", "40", "--t-end", "4", "--rollout", "30", "--json", str(path)]
    module.main([*argv, "--figure", str(figure)])
    assert "| vpt |" in capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result["command"].startswith("python examples/rigid_body_stability.py --seeds 2") and "commit" in result
    assert result["figures"] == [str(figure)] and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
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
    module = load_example("rigid_body_stability")
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        module.main(["--models", "vpt", "gpt", "--epochs", "1"])
