"""Smoke runs of the vision-transformer examples in examples/ (tiny sizes; no training result asserted).

* ``vit_digits.py`` (the multi-seed sweep behind the README's digits table): 2 seeds × 1 epoch × depths
  1 and 2 × attention add on and off on 64 digits; its ``--json`` holds the command, the commit and one
  table row per (depth, add connection, variant) with mean ± std over exactly the seeds run, and the
  mean is the mean of the per-run values (1e-12);
* ``torch_stiefel_vit.py`` (torch sessions) and ``jax_stiefel_vit.py`` (jax sessions): one epoch of
  one block with ``--attention-add off`` runs and prints the orthonormality error.

The examples build their data and models with NumPy (vit_digits), torch or JAX themselves, so each
runs in the session whose backend it uses and is skipped elsewhere with that reason.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest
from _examples import load_example


def _load(name: str):
    return load_example(name)


def test_vit_digits_sweep_writes_its_table(backend, tmp_path, monkeypatch, capsys):
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    if backend.name != "numpy":
        pytest.skip("examples/vit_digits.py trains on NumPy arrays; the models run on every backend in their own tests")
    module = _load("vit_digits")
    data = module._data
    monkeypatch.setattr(module, "_data", lambda: tuple((x[:64], t[:64]) for x, t in data()))
    path = tmp_path / "sweep.json"
    argv = ["--seeds", "2", "--epochs", "1", "--layers", "1", "2", "--attention-add", "both"]
    argv += ["--variants", "adam", "adam-free", "--json", str(path)]
    module.main(argv)
    assert "attn add" in capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result["command"].startswith("python examples/vit_digits.py --seeds 2")
    assert "commit" in result
    keys = [(r["layers"], r["attention_add"], r["variant"]) for r in result["table"]]
    assert sorted(keys) == sorted((L, a, v) for L in (1, 2) for a in (True, False) for v in ("adam", "adam-free"))
    for row in result["table"]:
        assert row["seeds"] == [0, 1]
        runs = [
            r
            for r in result["results"]
            if (r["layers"], r["attention_add"], r["variant"])
            == tuple(row[k] for k in ("layers", "attention_add", "variant"))
        ]
        acc = [r["test_accuracy"] for r in runs]
        assert math.isclose(row["test_accuracy"]["mean"], statistics.mean(acc), rel_tol=0, abs_tol=1e-12)
        assert math.isclose(row["test_accuracy"]["std"], statistics.stdev(acc), rel_tol=0, abs_tol=1e-12)
        assert all(math.isfinite(r["train_loss"]) for r in runs)


def test_torch_example_without_attention_add(backend, capsys):
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    if backend.name != "torch":
        pytest.skip("examples/torch_stiefel_vit.py is plain PyTorch: it runs in the torch session")
    _load("torch_stiefel_vit").main(["--epochs", "1", "--layers", "1", "--attention-add", "off"])
    assert "max |YᵀY − I| over the projections" in capsys.readouterr().out


def test_jax_example_without_attention_add(backend, capsys):
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    if backend.name != "jax":
        pytest.skip("examples/jax_stiefel_vit.py is JAX: it runs in the jax session")
    _load("jax_stiefel_vit").main(["--epochs", "1", "--layers", "1", "--attention-add", "off"])
    assert "(attention add off)" in capsys.readouterr().out
