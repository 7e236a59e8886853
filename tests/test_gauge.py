"""geoarray.gauge: the group action, its invariance, and the paper's count.

Every backend, float64. Properties and tolerances:

* group elements: the residual G is orthogonal (GᵀG = I to 1e-13) with det 1, and fixes the all-ones
  vector for LayerNorm models (G·1 = 1 to 1e-13); GL(d_h) samples have condition number ≤ e; the
  RoPE-commutant samples commute with every rotary position rotation (to 1e-13);
* invariance: for every architecture variant (GPT-2 with tanh-GELU and tied embeddings, GPT-2 with
  ReLU, GPT-2 untied, LLaMA untied and tied, BERT with erf-GELU and with ReLU), outputs after a random
  gauge element equal the original to 1e-10 relative while the weights move by ‖Δθ‖/‖θ‖ ≥ 0.3;
* folding norms alone leaves outputs unchanged (1e-12); applying the residual rotation *without*
  folding changes them by more than 1e-2 relative (why folding matters); re-tying a rotated model
  changes them too (why tied embeddings break the rotation);
* ``paper_redundancy`` reproduces Table 1 (gpt2: 1,473,409 exactly; gpt2-XL 11.1M and LLaMA-65B 201M
  to the printed rounding); the breakdown of ``redundancy`` sums to its total;
* ``check`` reports max_abs_output_diff ≤ 1e-10 relative, an O(1) weight change and
  redundancy_numerical = redundancy on a tiny configuration;
* bad requests (a residual element for BERT, scalings for GELU units, a wrong shape) raise ValueError.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from _gauge_common import TINY, VARIANTS, inputs, rel
from _helpers import to_numpy
from geoarray.gauge import (
    GaugeElement,
    apply_gauge,
    check,
    fold_norms,
    haar_rotation_fixing_ones,
    paper_redundancy,
    random_gauge,
    random_gl,
    redundancy,
    untie,
)
from geoarray.gauge.transforms import haar_orthogonal, rope_commutant
from geoarray.models import TransformerLM
from geoarray.models.language import apply_rope, rope_tables


def _weight_change(p, q):
    num = sum(float(np.sum((to_numpy(q[k]) - to_numpy(v)) ** 2)) for k, v in p.items())
    return math.sqrt(num / sum(float(np.sum(to_numpy(v) ** 2)) for v in p.values()))


# --------------------------------------------------------------------------------------------
# group elements
# --------------------------------------------------------------------------------------------


def test_rotation_fixing_ones(xp, device):
    d = 5
    G = to_numpy(haar_rotation_fixing_ones(d, 3, xp=xp, device=device))
    assert np.abs(G.T @ G - np.eye(d)).max() <= 1e-13
    assert np.abs(G @ np.ones(d) - np.ones(d)).max() <= 1e-13
    assert abs(np.linalg.det(G) - 1) <= 1e-12
    assert np.abs(G - np.eye(d)).max() > 0.1  # a genuine rotation, not the identity


def test_haar_special_orthogonal(xp, device):
    for seed in range(4):  # both signs of det of the raw QR factor occur among these seeds
        Q = to_numpy(haar_orthogonal(5, seed, xp=xp, device=device))
        assert np.abs(Q.T @ Q - np.eye(5)).max() <= 1e-13
        assert abs(np.linalg.det(Q) - 1) <= 1e-12


def test_random_gl_is_well_conditioned(xp, device):
    A = to_numpy(random_gl(4, 0, batch_shape=(3,), xp=xp, device=device))
    assert A.shape == (3, 4, 4)
    for a in A:
        assert np.linalg.cond(a) <= math.e + 1e-9


def test_rope_commutant_commutes_with_position_rotations(xp, device):
    dh, T = 6, 5
    rng = np.random.default_rng(0)
    A = rope_commutant(xp.asarray(rng.normal(size=3), device=device), xp.asarray(rng.normal(size=3), device=device))
    x = xp.asarray(rng.normal(size=(T, dh)), device=device)
    cos, sin = rope_tables(T, dh, 10000.0, xp=xp, dtype=x.dtype, device=device)
    lhs = to_numpy(apply_rope(x @ A, cos, sin))
    rhs = to_numpy(apply_rope(x, cos, sin) @ A)
    assert np.abs(lhs - rhs).max() <= 1e-13


# --------------------------------------------------------------------------------------------
# invariance
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VARIANTS))
def test_outputs_invariant_under_random_gauge_element(name, xp, device):
    cfg = VARIANTS[name]
    model = TransformerLM(cfg)
    params = model.init(0, xp=xp, device=device)
    tok, types = inputs(cfg, xp, device)
    g = random_gauge(model, 5, xp=xp, device=device)
    assert (g.residual is not None) == (cfg["arch"] != "bert")
    assert any(s is not None for s in g.mlp) == (model.config.activation in ("relu", "swiglu"))
    model2, params2 = apply_gauge(model, params, g)
    assert model2.config.tie_embeddings is False or cfg["arch"] == "bert"
    assert rel(model2.apply(params2, tok, types), model.apply(params, tok, types)) <= 1e-10
    assert _weight_change(params, params2) >= 0.3


@pytest.mark.parametrize("name", ["gpt2-gelu-tied", "gpt2-untied", "llama"])
def test_folding_alone_keeps_outputs(name, xp, device):
    cfg = VARIANTS[name]
    model = TransformerLM(cfg)
    params = model.init(1, xp=xp, device=device)
    tok, _ = inputs(cfg, xp, device)
    m, p = untie(model, params)
    folded = fold_norms(m, p)
    assert np.all(to_numpy(folded["layers.0.norm1.scale"]) == 1.0)
    assert rel(m.apply(folded, tok), model.apply(params, tok)) <= 1e-12


@pytest.mark.parametrize("name", ["gpt2-gelu-tied", "gpt2-untied", "llama"])
def test_rotation_without_folding_is_not_a_symmetry(name, xp, device):
    """LN(xG) = LN(x)G holds for the bare normalisation only: γ ⊙ (·) + β does not commute with G."""
    cfg = VARIANTS[name]
    model = TransformerLM(cfg)
    params = model.init(2, xp=xp, device=device)
    tok, _ = inputs(cfg, xp, device)
    g = GaugeElement(residual=random_gauge(model, 7, xp=xp, device=device).residual)
    ref = model.apply(params, tok)
    m_fold, p_fold = apply_gauge(model, params, g, fold=True)
    m_raw, p_raw = apply_gauge(model, params, g, fold=False)
    assert rel(m_fold.apply(p_fold, tok), ref) <= 1e-10
    assert rel(m_raw.apply(p_raw, tok), ref) > 1e-2


@pytest.mark.parametrize("name", ["gpt2-gelu-tied", "llama-tied"])
def test_tied_embeddings_break_the_residual_rotation(name, xp, device):
    """The rotated model needs an unembedding Gᵀ diag(γ_f) Eᵀ ≠ (E G)ᵀ: re-tying changes the outputs."""
    cfg = VARIANTS[name]
    model = TransformerLM(cfg)
    params = model.init(3, xp=xp, device=device)
    tok, _ = inputs(cfg, xp, device)
    g = GaugeElement(residual=random_gauge(model, 8, xp=xp, device=device).residual)
    m2, p2 = apply_gauge(model, params, g)
    assert not m2.config.tie_embeddings
    retied = {k: v for k, v in p2.items() if k != "unembed"}
    ref = model.apply(params, tok)
    assert rel(m2.apply(p2, tok), ref) <= 1e-10
    assert rel(model.apply(retied, tok), ref) > 1e-2


def test_bad_gauge_requests(xp, device):
    bert = TransformerLM(VARIANTS["bert-gelu"])
    with pytest.raises(ValueError, match="residual"):
        random_gauge(bert, 0, xp=xp, device=device, residual=True)
    gpt2 = TransformerLM(VARIANTS["gpt2-gelu-tied"])
    with pytest.raises(ValueError, match="scaling"):
        random_gauge(gpt2, 0, xp=xp, device=device, mlp=True)
    params = gpt2.init(0, xp=xp, device=device)
    with pytest.raises(ValueError, match=r"g\.residual must have shape"):
        apply_gauge(gpt2, params, GaugeElement(residual=xp.eye(3, device=device)))
    with pytest.raises(ValueError, match="post-LN"):
        fold_norms(bert, bert.init(0, xp=xp, device=device))


# --------------------------------------------------------------------------------------------
# counts
# --------------------------------------------------------------------------------------------


def test_paper_redundancy_reproduces_table_1():
    assert paper_redundancy(12, 12, 64, 768) == 1_473_409  # gpt2, as printed
    assert round(paper_redundancy(48, 25, 64, 1600) / 1e5) == 111  # gpt2-XL: 11.1M
    assert round(paper_redundancy(80, 64, 128, 8192) / 1e6) == 201  # LLaMA-65B: 201M
    with pytest.raises(ValueError, match="d_head"):
        paper_redundancy(1, 1, 0, 4)


@pytest.mark.parametrize("preset", ["gpt2", "gpt2-xl", "llama-65b", "all-minilm-l6-v2"])
def test_redundancy_breakdown(preset):
    r = redundancy(preset)
    assert r.total == sum(r.breakdown.values())
    c = r.config
    L, H, dh, d = c.n_layers, c.n_heads, c.d_head, c.d_model
    assert r.paper == paper_redundancy(L, H, dh, d)
    if c.arch == "llama":  # RoPE: d_h per query/key head; RMSNorm: SO(d)
        assert r.breakdown["qk_rope"] == L * H * dh
        assert r.breakdown["residual_rotation"] == d * (d - 1) // 2
    else:
        assert r.breakdown["qk_gl"] == r.breakdown["vo_gl"] == L * H * dh * dh
        assert "residual_rotation" not in r.breakdown  # tied GPT-2 and post-LN BERT have none
    untied = redundancy({**r.config.to_dict(), "tie_embeddings": False}) if c.arch == "gpt2" else None
    if untied is not None:
        assert untied.breakdown["residual_rotation"] == (d - 1) * (d - 2) // 2


def test_check_report(xp, device):
    cfg = dict(arch="gpt2", **TINY)
    report = check(cfg, 0, xp=xp, device=device, n_sequences=3)
    for key in ("max_abs_output_diff", "relative_weight_change", "n_params", "redundancy", "redundancy_numerical"):
        assert key in report
    assert report["max_rel_output_diff"] <= 1e-10
    assert report["relative_weight_change"] >= 0.3
    assert report["n_params"] == TransformerLM(cfg).n_params()
    assert report["redundancy"] == redundancy(cfg).total
    assert report["redundancy_numerical"] == report["redundancy"]
    assert report["untied"] is True
    assert report["paper_redundancy"] == paper_redundancy(2, 2, 2, 5)
