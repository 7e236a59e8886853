"""examples/copying_problem.py (the orthogonal RNN on the copying task) at a smoke size.

Torch sessions only: the example is plain PyTorch (its model, data and baseline optimizer are torch's),
so it is skipped elsewhere with that reason. What is checked: the task's data (the targets are the
first K inputs after L + K blanks), the memoryless baseline K·log 8/(L + 2K) as the cross-entropy of
the predictor that knows nothing, and a smoke run — both methods start from the same weights and
batches, the orthogonal recurrent weight stays orthogonal while the unconstrained one leaves O(n), and
the JSON's table is the mean ± std of its runs.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest
from _examples import load_example


@pytest.fixture(autouse=True)
def _torch_session(backend):
    if backend.kind != "torch":
        pytest.skip("examples/copying_problem.py is plain PyTorch (model, data, torch.optim baseline): torch sessions")


@pytest.fixture(scope="module")
def example():
    # a module fixture is set up before the function-scoped skip above: sessions without torch skip here
    pytest.importorskip("torch", reason="examples/copying_problem.py is plain PyTorch: torch sessions")
    return load_example("copying_problem")


def test_copy_batch_and_memoryless_baseline(example, torch):
    L, K = 12, example.K
    x, y = example.copy_batch(5, L, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, L + 2 * K)
    assert torch.equal(y[:, -K:], x[:, :K])
    assert bool(((x[:, :K] >= 1) & (x[:, :K] <= example.ALPHABET)).all())
    assert bool((x[:, K + L] == example.ALPHABET + 1).all())  # the marker
    assert int(x[:, K : K + L].count_nonzero()) == int(x[:, K + L + 1 :].count_nonzero()) == 0
    assert int(y[:, : L + K].count_nonzero()) == 0
    # the predictor that remembers nothing: blank (probability 1) until the copy, then uniform over 8
    logp = torch.full((*x.shape, example.ALPHABET + 1), -math.inf, dtype=torch.float64)
    logp[:, : L + K, 0] = 0.0
    logp[:, L + K :, 1:] = -math.log(example.ALPHABET)
    ce = -logp.gather(-1, y[..., None]).mean().item()
    assert math.isclose(ce, example.baseline_loss(L), rel_tol=1e-12)


def test_smoke_run_writes_its_table_and_plot(example, tmp_path, capsys):
    path, png = tmp_path / "copying.json", tmp_path / "copying.png"
    result = example.main(["--smoke", "--json", str(path), "--plot", str(png)])
    assert "memoryless baseline" in capsys.readouterr().out
    saved = json.loads(path.read_text())
    assert saved["command"] == f"python examples/copying_problem.py --smoke --json {path} --plot {png}"
    assert "commit" in saved and saved["config"]["seeds"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = {(r["method"], r["seed"]): r for r in result["runs"]}
    assert sorted(runs) == [(m, s) for m in ("orthogonal", "unconstrained") for s in (0, 1)]
    for seed in (0, 1):
        ortho, free = runs["orthogonal", seed], runs["unconstrained", seed]
        # same initial weights and first batch: the first loss is the same computation
        assert math.isclose(ortho["curve"][0], free["curve"][0], rel_tol=1e-6)
        assert len(ortho["curve"]) == len(free["curve"]) == 5
        # float32 weights: the retraction keeps WᵀW = I to rounding; Adam's plain steps leave O(n)
        assert ortho["orthogonality_error"] < 1e-5
        assert free["orthogonality_error"] > 1e-3
    for row in saved["table"]:
        rs = [r for r in saved["runs"] if r["method"] == row["method"]]
        assert row["seeds"] == [0, 1]
        for key in ("final_loss", "accuracy"):
            values = [r[key] for r in rs]
            assert math.isclose(row[key]["mean"], statistics.mean(values), rel_tol=0, abs_tol=1e-12)
            assert math.isclose(row[key]["std"], statistics.stdev(values), rel_tol=0, abs_tol=1e-12)


def test_bad_size_is_a_one_line_usage_error(example, capsys):
    with pytest.raises(SystemExit) as info:
        example.main(["--length", "0"])
    assert info.value.code == 2
    assert "--length must be at least 1, got 0" in capsys.readouterr().err
