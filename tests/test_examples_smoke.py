"""Smoke runs of the examples no other test runs: ``quickstart.py``, ``optimizer_sweep.py`` (both tasks)
and ``coupled_oscillator.py``, at tiny sizes, in the NumPy session (each example picks its own
backends: the quickstart runs every installed one). What is checked is that they run and print what
they promise, with finite figures — not a training result."""

from __future__ import annotations

import math
import re

import pytest
from _examples import load_example


@pytest.fixture(autouse=True)
def _numpy_session(backend):
    if backend.name != "numpy":
        pytest.skip("the examples choose their own backends; they run once, in the numpy session")


def _load(name: str):
    return load_example(name)


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?|nan|inf", text)]


def test_quickstart_runs_on_the_installed_backends(capsys):
    _load("quickstart").main(["--steps", "5", "--N", "8", "--n", "2"])
    out = capsys.readouterr().out
    assert "numpy" in out and "max|YᵀY − I|" in out
    orth = [float(x) for x in re.findall(r"max\|YᵀY − I\| = ([0-9.e+-]+)", out)]
    assert orth and max(orth) < 1e-10  # every backend's iterate is on St(8, 2)


def test_optimizer_sweep_brockett_prints_one_row_per_variant(capsys):
    _load("optimizer_sweep").main(
        ["brockett", "--seeds", "2", "--steps", "3", "--N", "6", "--n", "2", "--sections", "householder", "transported"]
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("delta", "eps"))]
    assert len(rows) == 4 and all(math.isfinite(v) for row in rows for v in _numbers(row))


def test_optimizer_sweep_vit_runs_manifold_muon(monkeypatch, capsys):
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    from geoarray.data import images

    load = images.load_digits
    monkeypatch.setattr(images, "load_digits", lambda **kw: tuple(a[:48] for a in load(**kw)))
    _load("optimizer_sweep").main(
        ["vit", "--seeds", "1", "--epochs", "1", "--sections", "manifold-muon", "--forms", "delta"]
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("delta")]
    assert len(rows) == 1 and "manifold-muon" in rows[0]


def test_coupled_oscillator_prints_its_table(capsys):
    _load("coupled_oscillator").main(["--epochs", "1", "--n-traj", "3", "--n-steps", "12", "--rollout", "6"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "model" not in line]
    assert {r.split("|")[1].strip() for r in rows} == {
        "linear symplectic transformer",
        "standard transformer",
        "G-SympNet",
    }
