"""The README's results tables quote the experiments' JSON files (``results/``), figure by figure.

Each experiment writes its table as data (``examples/vit_digits.py``, ``rigid_body_stability.py``,
``oscillator_stability.py`` with ``--json``); the README's Results section copies the headline rows by hand.
This checks that every copied figure is the JSON's, at the precision the README prints (3 decimals: mean ±
sample std, or the single value where one seed stayed), and that diverged counts and steps match — so a
rerun that changes a result cannot leave the README quoting the old one. Host code only: runs in every
session in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _load(name: str) -> dict:
    return json.loads((ROOT / "results" / name).read_text(encoding="utf-8"))


def _figure(stat: dict) -> str:
    """How the README prints a statistic: mean ± std over seeds, or the value of the one seed that stayed."""
    if stat["n"] == 1:
        return f"{stat['mean']:.3f} (1 seed)"
    return f"{stat['mean']:.3f} ± {stat['std']:.3f}"


def _row(cells: list[str]) -> str:
    """The README row whose first cell is ``cells[0]``; the other cells must follow in order."""
    for line in README.splitlines():
        parts = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        if parts and parts[0] == cells[0]:
            missing = [c for c in cells[1:] if c not in parts]
            assert not missing, f"README row {cells[0]!r} lacks {missing}: {line}"
            return line
    raise AssertionError(f"README has no results row {cells[0]!r}")


def test_vit_table_is_the_json():
    table = _load("vit_digits_attention_add_40ep.json")["table"]
    accuracy = {(r["layers"], r["variant"]): r["test_accuracy"] for r in table if not r["attention_add"]}
    for layers in (8, 16):
        stiefel, free = accuracy[(layers, "adam")], accuracy[(layers, "adam-free")]
        line = _row([str(layers)])
        for stat in (stiefel, free):
            assert f"{stat['mean']:.3f} ± {stat['std']:.3f}" in line, line


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("vpt", "`VolumePreservingTransformer`"),
        ("vpff", "`VolumePreservingFeedForward`"),
        ("standard", "`StandardTransformerIntegrator`"),
    ],
)
def test_rigid_body_table_is_the_json(model, name):
    (row,) = _load(f"rigid_body_stability_{model}_b256_360ep.json")["table"]
    diverged = f"{row['diverged']}/{len(row['seeds'])}"
    if row["diverged"]:
        diverged += f" (steps {', '.join(str(s) for s in row['diverged_at_steps'])})"
    # the rigid-body table is the first with these model names (the oscillator's standard row comes later)
    loss = row["final_train_loss"]
    mean = f"{loss['mean']:.2g}"  # two significant digits, the std at the mean's last decimal
    loss_cell = f"{mean} ± {loss['std']:.{len(mean.split('.')[1])}f}"
    _row([name, loss_cell, _figure(row["rollout_relative_error"]), _figure(row["max_norm_drift"]), diverged])


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("lst0", "`LinearSymplecticTransformer` (default: Ā = 0 at init)"),
        ("st", "`SymplecticTransformer`"),
        ("gsympnet", "`GSympNet`"),
    ],
)
def test_oscillator_table_is_the_json(model, name):
    rows = {r["model"]: r for r in _load("oscillator_stability.json")["table"]}
    assert model in rows, sorted(rows)
    row = rows[model]
    cells = [name, _figure(row["relative_error_50"]), _figure(row["relative_error"]), _figure(row["max_energy_drift"])]
    _row([*cells, f"{row['diverged']}/{len(row['seeds'])}"])


def test_the_check_fails_on_a_stale_figure(monkeypatch):
    """The check can fail: a README whose VP transformer row quotes another error is caught."""
    import sys

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "README", README.replace("0.597 ± 0.050", "0.598 ± 0.050"))
    with pytest.raises(AssertionError, match="lacks"):
        test_rigid_body_table_is_the_json("vpt", "`VolumePreservingTransformer`")
