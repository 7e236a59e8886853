"""``examples/_results.py``, the helpers every experiment script in ``examples/`` writes its table with:
the statistics over seeds agree with NumPy's (mean, sample standard deviation with n − 1, range; 1e-12),
runs without a number (None) are counted, not averaged; the JSON holds the command that reruns the
script, the commit and the payload, and replaces the file only once it is complete. Host-side Python
(no arrays): it runs once, in the numpy session."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from _examples import load_example


@pytest.fixture(autouse=True)
def _numpy_session(backend):
    if backend.name != "numpy":
        pytest.skip("examples/_results.py is host-side Python on lists of floats: it runs in the numpy session")


@pytest.fixture(scope="module")
def results():
    return load_example("_results")


def test_stats_agree_with_numpy(results):
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 8):
        values = list(rng.lognormal(size=n))
        s = results.stats([*values, None, None])
        a = np.asarray(values)
        assert s["n"] == n and s["non_finite"] == 2
        np.testing.assert_allclose(s["mean"], a.mean(), rtol=1e-12, atol=0)
        np.testing.assert_allclose(s["std"], a.std(ddof=1) if n > 1 else 0.0, rtol=1e-12, atol=1e-15)
        assert (s["min"], s["max"]) == (a.min(), a.max())
    assert results.stats([]) is None and results.stats([None, None]) is None


def test_command_commit_and_json(results, tmp_path):
    assert (
        results.command("x.py", ["--seeds", "2", "--json", "a b.json"])
        == "python examples/x.py --seeds 2 --json 'a b.json'"
    )
    ran = results.commit()
    assert ran is None or re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", ran)
    path = tmp_path / "sub" / "r.json"
    payload = {
        "command": "python examples/x.py",
        "commit": ran,
        "table": [{"seeds": [0, 1], "loss": results.stats([1.0, 3.0])}],
    }
    results.write_json(str(path), payload)
    assert json.loads(path.read_text()) == payload
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # the temporary file is gone
