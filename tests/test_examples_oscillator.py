"""Smoke run of ``examples/oscillator_stability.py`` (``--smoke``: tiny sizes; no training result asserted),
and the ``attention_init="zero"`` option of :class:`LinearSymplecticTransformer` that it compares.

The JSON holds the command, the commit, the figure and one row per model over exactly the seeds run;
every run either diverged (a step in 1…rollout, no 500-step error or drift, a 50-step error only if it
left after step 50) or stayed (finite errors and drift); each row's diverged count and mean errors
(1e-12) follow from its runs; the figure is a PNG.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from _examples import load_example

from _helpers import to_numpy
from _layer_checks import jacobian, random_input, symplectic_form
from geoarray import models
from geoarray.nn import LinearSymplecticAttentionP, LinearSymplecticAttentionQ


def _module():
    return load_example("oscillator_stability")


def _check_row(row, runs, rollout, short):
    stayed = [r for r in runs if r["diverged_at_step"] is None]
    assert row["diverged"] == len(runs) - len(stayed)
    for r in runs:
        d = r["diverged_at_step"]
        if d is None:
            for key in (f"relative_error_{short}", "relative_error", "max_energy_drift"):
                assert math.isfinite(r[key]) and r[key] >= 0
        else:
            assert 1 <= d <= rollout
            assert r["relative_error"] is None and r["max_energy_drift"] is None
            assert (r[f"relative_error_{short}"] is None) == (d <= short)
    for key, pool in (("relative_error", stayed), (f"relative_error_{short}", runs)):
        values = [r[key] for r in pool if r[key] is not None]
        if values:
            assert math.isclose(row[key]["mean"], statistics.mean(values), rel_tol=0, abs_tol=1e-12)
        else:
            assert row[key] is None


def test_oscillator_stability_table(backend, tmp_path, capsys):
    if backend.name != "numpy":
        pytest.skip("examples/oscillator_stability.py trains on NumPy arrays; the models run on every backend")
    pytest.importorskip("matplotlib")
    module = _module()
    path, figure = tmp_path / "osc.json", tmp_path / "osc.png"
    module.main(["--smoke", "--json", str(path), "--figure", str(figure)])
    out = capsys.readouterr().out
    assert "| lst0 |" in out and f"wrote {figure}" in out
    assert "smoke size: too little data" in out  # a diverged smoke rollout is not read as the models' result
    result = json.loads(path.read_text())
    assert result["command"].startswith("python examples/oscillator_stability.py --smoke") and "commit" in result
    assert result["figures"] == [str(figure)] and result["complete"] is True
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [row["model"] for row in result["table"]] == list(module.MODELS)
    rollout = result["config"]["rollout"]
    for row in result["table"]:
        runs = [r for r in result["results"] if r["model"] == row["model"]]
        assert row["seeds"] == [0, 1] and [r["seed"] for r in runs] == [0, 1]
        _check_row(row, runs, rollout, module.SHORT)


def test_unknown_model_and_short_rollout_are_refused():
    module = _module()
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        module.main(["--models", "lst", "gpt", "--epochs", "1"])
    with pytest.raises(ValueError, match="--rollout: expected at least 50"):
        module.main(["--smoke", "--rollout", "10"])


def test_zero_attention_init(xp, device):
    # Ā = 0 exactly in every attention layer, the other layers as with the default init (same seed), so
    # the model starts as a G-SympNet acting on each time step; after a perturbation it is symplectic
    T = 3
    zero = models.LinearSymplecticTransformer(4, T, L=1, upscale=2, attention_init="zero")
    normal = models.LinearSymplecticTransformer(4, T, L=1, upscale=2, attention_init="normal")
    pz = zero.init(5, xp=xp, dtype=xp.float64, device=device)
    pn = normal.init(5, xp=xp, dtype=xp.float64, device=device)
    attention = (LinearSymplecticAttentionQ, LinearSymplecticAttentionP)
    for layer, a, b in zip(zero.chain.layers, pz, pn, strict=True):
        if isinstance(layer, attention):
            assert np.all(to_numpy(a["A"]) == 0) and np.abs(to_numpy(b["A"])).max() > 0
        else:
            for key in a:
                np.testing.assert_array_equal(to_numpy(a[key]), to_numpy(b[key]))
    x = random_input(xp, device, (T, 4), scale=0.7)
    pz = tuple(
        {"A": p["A"] + 0.3 * xp.eye(T, dtype=p["A"].dtype, device=device)} if isinstance(layer, attention) else p
        for layer, p in zip(zero.chain.layers, pz, strict=True)
    )
    J = jacobian(zero, pz, x, xp)
    Jd = symplectic_form(T, 4)
    np.testing.assert_allclose(J.T @ Jd @ J, Jd, atol=1e-8)
    assert "attention_init='normal'" in repr(normal) and "attention_init" not in repr(zero)  # zero: the default
    assert models.LinearSymplecticTransformer(4, T).attention_init == "zero"
    with pytest.raises(ValueError, match="attention_init: expected 'normal' or 'zero', got 'xavier'"):
        models.LinearSymplecticTransformer(4, T, attention_init="xavier")


def test_join_error_ratio_sees_jumps_between_windows():
    # a smooth error (Δ² constant) is the same at the joins and inside: ratio 1; an offset per predicted
    # window (the zig-zag: each window internally smooth, displaced from the last) shows at the joins only
    module = _module()
    T, t = 3, np.arange(3 + 30, dtype=np.float64)
    R = np.stack([np.sin(0.3 * t), np.cos(0.3 * t)], -1)[None]
    smooth = R + 1e-3 * (t**2)[None, :, None]
    assert math.isclose(module.join_error_ratio(smooth, R, T), 1.0, rel_tol=1e-9)
    window = np.maximum(t - T, -1) // T  # −1 for the given window, k for the k-th predicted one
    zigzag = smooth + 0.05 * np.where(window >= 0, (-1.0) ** window, 0.0)[None, :, None]
    assert module.join_error_ratio(zigzag, R, T) > 10
