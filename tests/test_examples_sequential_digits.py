"""examples/sequential_digits.py (geotorch's sequential-MNIST example on the 8×8 digits, geotorch against
geoarray.torch) at its smoke size: hidden 16, 2 seeds × 2 epochs, a few seconds.

Torch sessions only: the example is plain PyTorch (its model, data and geotorch's optimizer are torch's),
so it is skipped elsewhere with that reason; it runs under torch's default dtype, float32, as the script
does (the torch session sets float64). Skipped without scikit-learn (the digits). What is checked, with
geotorch 0.4.0 installed: both trainings of a seed start from the same weights and see the same first
batch, so their first losses agree to 1e-6 (relative; measured: equal); both recurrent weights end
orthonormal to 1e-5 (float32; measured ≤ 3.4e-7); every loss is finite; and the JSON's table is the mean
± sample std of its runs, the difference row that of the per-seed differences (1e-12). Without geotorch
the script says so in one line and runs geoarray alone.
"""

from __future__ import annotations

import json
import math
import statistics
import sys

import pytest
from _examples import load_example


@pytest.fixture(autouse=True)
def _torch_session(backend):
    if backend.kind != "torch":
        pytest.skip("examples/sequential_digits.py is plain PyTorch (model, data, torch.optim): torch sessions")


@pytest.fixture(scope="module")
def example():
    # a module fixture is set up before the function-scoped skip above: sessions without torch skip here
    pytest.importorskip("torch", reason="examples/sequential_digits.py is plain PyTorch: torch sessions")
    pytest.importorskip("sklearn", reason="the 8×8 digits come from scikit-learn (the demo extra)")
    return load_example("sequential_digits")


def test_smoke_run_starts_equal_and_stays_orthogonal(example, torch_default_float32, tmp_path, capsys):
    pytest.importorskip("geotorch", reason="the comparison runs geotorch's own example")
    path = tmp_path / "digits.json"
    result = example.main(["--smoke", "--json", str(path)])
    out = capsys.readouterr().out
    assert "difference geoarray − geotorch" in out
    saved = json.loads(path.read_text())
    assert saved["command"] == f"python examples/sequential_digits.py --smoke --json {path}"
    assert "commit" in saved and saved["config"]["seeds"] == 2 and saved["config"]["hidden"] == 16
    runs = {(r["method"], r["seed"]): r for r in result["runs"]}
    assert sorted(runs) == [(m, s) for m in ("geoarray", "geotorch") for s in (0, 1)]
    for seed in (0, 1):
        ours, theirs = runs["geoarray", seed], runs["geotorch", seed]
        # the same initial weights and first batch: the first loss is the same computation
        assert math.isclose(ours["curve"][0], theirs["curve"][0], rel_tol=1e-6)
        for r in (ours, theirs):
            assert len(r["curve"]) == 2 * 12  # 2 epochs of 12 batches (1437 images, batch 128)
            assert all(v is not None and math.isfinite(v) for v in r["curve"])
            assert r["orthogonality_error"] < 1e-5
    table = saved["table"]
    for method in ("geoarray", "geotorch"):
        values = [runs[method, s]["test_accuracy"] for s in (0, 1)]
        assert table[method]["seeds"] == [0, 1]
        assert math.isclose(table[method]["test_accuracy"]["mean"], statistics.mean(values), abs_tol=1e-12)
        assert math.isclose(table[method]["test_accuracy"]["std"], statistics.stdev(values), abs_tol=1e-12)
    diff = [runs["geoarray", s]["test_accuracy"] - runs["geotorch", s]["test_accuracy"] for s in (0, 1)]
    assert math.isclose(table["difference"]["mean"], statistics.mean(diff), abs_tol=1e-12)
    assert math.isclose(table["difference"]["std"], statistics.stdev(diff), abs_tol=1e-12)


def test_without_geotorch_only_geoarray_runs(example, torch_default_float32, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "geotorch", None)  # `import geotorch` raises ImportError
    result = example.main(["--smoke", "--seeds", "1"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("geotorch is not installed: only geoarray runs")
    assert [(r["method"], r["seed"]) for r in result["runs"]] == [("geoarray", 0)]
    assert "difference" not in result["table"]
    assert result["runs"][0]["orthogonality_error"] < 1e-5


def test_bad_size_is_a_one_line_usage_error(example, capsys):
    with pytest.raises(SystemExit) as info:
        example.main(["--hidden", "0"])
    assert info.value.code == 2
    assert "--hidden must be at least 1, got 0" in capsys.readouterr().err
