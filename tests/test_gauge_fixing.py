"""geoarray.gauge.fixing: the gauge-fixed (smaller) model equals the original.

Every backend, float64. Properties and tolerances:

* ``fixed.apply(reduced)`` equals ``model.apply(params)`` to 1e-8 relative (measured ≈ 1e-14) for
  every architecture variant;
* the stored parameters are exactly ``redundancy(config).total`` fewer than the original's (for
  untied GPT-2: minus the residual rotation, the documented unfixed source), and the saving breakdown
  sums to the saving;
* the canonical point really has the fixed entries (identity blocks, zeros, ones, signs) to 1e-12;
* the canonical form is one point per orbit: a random head/MLP gauge element applied before fixing
  gives the same stored parameters (1e-9 relative);
* save_fixed/load_fixed round trips (float64 file: equal outputs to 1e-14);
* mismatched reduced parameters raise ValueError naming the key.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from _gauge_common import VARIANTS, inputs, rel
from _helpers import to_numpy
from geoarray.gauge import apply_gauge, gauge_fix, load_fixed, random_gauge, redundancy, save_fixed
from geoarray.gauge.fixing import GaugeFixedLM, canonicalize
from geoarray.models import TransformerLM


@pytest.mark.parametrize("name", list(VARIANTS))
def test_gauge_fixed_model_equals_original_and_is_smaller_by_the_count(name, xp, device):
    cfg = VARIANTS[name]
    model = TransformerLM(cfg)
    params = model.init(0, xp=xp, device=device)
    tok, types = inputs(cfg, xp, device)
    fixed, reduced = gauge_fix(model, params)
    assert rel(fixed.apply(reduced, tok, types), model.apply(params, tok, types)) <= 1e-8
    r = redundancy(cfg)
    unfixed = sum(r.breakdown.get(k, 0) for k in fixed.unfixed)
    assert fixed.unfixed == (["residual_rotation"] if name == "gpt2-untied" else [])
    assert fixed.n_params() == sum(int(v.shape[0]) for v in reduced.values())
    assert fixed.saving == model.n_params() - fixed.n_params() == r.total - unfixed
    assert sum(fixed.saving_breakdown.values()) == fixed.saving
    canon, _ = canonicalize(model, params)
    assert _max_fixed_deviation(fixed, canon) <= 1e-12


@pytest.mark.parametrize("name", ["gpt2-relu", "llama", "bert-gelu"])
def test_canonical_form_is_one_point_per_orbit(name, xp, device):
    """Heads' GL(d_h)/RoPE-commutant pairs and MLP scalings are fixed uniquely (the residual rotation of
    LLaMA is fixed up to the signs of a QR factorisation, so it is left out here)."""
    cfg = VARIANTS[name]
    model = TransformerLM(cfg)
    params = model.init(1, xp=xp, device=device)
    g = random_gauge(model, 9, xp=xp, device=device, residual=False)
    _, moved = apply_gauge(model, params, g)
    _, a = gauge_fix(model, params)
    _, b = gauge_fix(model, moved)
    assert set(a) == set(b)
    for k in a:
        ref = to_numpy(a[k])
        assert np.abs(to_numpy(b[k]) - ref).max() <= 1e-9 * max(1.0, np.abs(ref).max()), k


@pytest.mark.parametrize("name", ["gpt2-relu", "bert-gelu"])
def test_save_and_load_fixed(name, xp, device, tmp_path):
    cfg = VARIANTS[name]
    model = TransformerLM(cfg)
    params = model.init(2, xp=xp, device=device)
    fixed, reduced = gauge_fix(model, params)
    path = tmp_path / "fixed.safetensors"
    save_fixed(path, fixed, reduced, dtype="float64")
    fixed2, reduced2 = load_fixed(path, xp=xp, device=device)
    assert fixed2.config == fixed.config
    assert fixed2.n_params() == fixed.n_params()
    tok, types = inputs(cfg, xp, device)
    assert rel(fixed2.apply(reduced2, tok, types), model.apply(params, tok, types)) <= 1e-12


def _max_fixed_deviation(fixed: GaugeFixedLM, canon: dict) -> float:
    """Largest |entry − fixed value| over the fixed entries of a canonical point (diagnostic)."""
    worst = 0.0
    for k, m in fixed.free.items():
        if m.all():
            continue
        v = to_numpy(canon[k])
        dev = np.abs(v[~m] - fixed.fixed[k][~m])
        worst = max(worst, float(dev.max()) if dev.size else 0.0)
    return worst if math.isfinite(worst) else float("inf")


def test_bad_reduced_parameters(xp, device, tmp_path):
    model = TransformerLM(VARIANTS["gpt2-gelu-tied"])
    fixed, reduced = gauge_fix(model, model.init(0, xp=xp, device=device))
    bad = dict(reduced)
    del bad["layers.0.attn.wk"]
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.wk"):
        fixed.expand(bad)
    bad = dict(reduced)
    bad["embed"] = bad["embed"][:3]
    with pytest.raises(ValueError, match=r"reduced\['embed'\]"):
        fixed.expand(bad)
    (tmp_path / "x.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_fixed(tmp_path / "x.safetensors")
