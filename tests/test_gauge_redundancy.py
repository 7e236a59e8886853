"""redundancy(config) against the Jacobian referee numerical_redundancy, on tiny configurations.

Every backend, float64: forward-mode autodiff on torch and JAX, fourth-order central differences on
NumPy and array-api-strict. Property: the exact count equals the number of singular values of
∂outputs/∂parameters below 1e-10·σ_max, and the spectrum has a gap of at least 100 around the
threshold (null σ ≲ 1e-12, non-null σ ≳ 1e-8 here), so the count does not hinge on the threshold.

Configurations: pre-LN + GELU (GPT-2, tied), RMSNorm + RoPE + SwiGLU (LLaMA, untied), post-LN (BERT),
ReLU MLP (GPT-2), plus GPT-2 untied and LLaMA tied (one layer). The decoders keep their own ε (1e-5, 1e-6); the
encoder uses ε = 1e-2, because its 2L + 1 ε-broken near-symmetries sit at ≈ 3e-10·σ_max for ε = 1e-5
(see numerical_redundancy). For ReLU the count assumes every unit is active on some inputs and
inactive on others (an always-active unit's bias could move into b_out); the test asserts that.
"""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import to_numpy
from geoarray.gauge import numerical_redundancy, redundancy, referee_inputs
from geoarray.models import TransformerLM

SIZES = dict(n_layers=2, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4)
CONFIGS = {
    "pre-LN+GELU (gpt2)": dict(arch="gpt2", **SIZES),
    "RMSNorm+RoPE+SwiGLU (llama)": dict(arch="llama", **SIZES),
    "post-LN (bert)": dict(arch="bert", activation="gelu_new", norm_eps=1e-2, **SIZES),
    "ReLU MLP (gpt2)": dict(arch="gpt2", activation="relu", **SIZES),
    # the untied/tied switch changes the embeddings and the final norm only: one layer suffices
    "gpt2 untied": dict(arch="gpt2", tie_embeddings=False, **{**SIZES, "n_layers": 1}),
    "llama tied": dict(arch="llama", tie_embeddings=True, **{**SIZES, "n_layers": 1}),
}


def _relu_activity(model, params, tokens):
    """Fraction of inputs on which each ReLU unit of each layer is active."""
    fractions = []
    original = model._mlp

    def spy(p, prefix, h):
        z = to_numpy(h @ p[prefix + "mlp.w_in"] + p[prefix + "mlp.b_in"])
        fractions.append((z > 0).reshape(-1, z.shape[-1]).mean(axis=0))
        return original(p, prefix, h)

    model._mlp = spy
    try:
        model.apply(params, tokens)
    finally:
        del model._mlp
    return np.stack(fractions)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_redundancy_equals_jacobian_nullity(name, xp, device):
    cfg = CONFIGS[name]
    model = TransformerLM(cfg)
    params = model.init(2, xp=xp, device=device)
    tokens, types = referee_inputs(cfg, 0, xp=xp, device=device)
    if model.config.activation == "relu":
        active = _relu_activity(model, params, tokens)
        assert np.all((active > 0) & (active < 1)), f"a ReLU unit is always on or always off: {active}"
    result = numerical_redundancy(model, params, tokens, token_types=types)
    exact = redundancy(cfg)
    assert result.n_params == model.n_params()
    assert result.n_outputs >= 3 * result.n_params
    assert result.nullity == exact.total, (result.nullity, exact.breakdown)
    assert result.gap >= 100


def test_referee_sees_a_missing_token(xp, device):
    """Behaviour check of the referee: with one token absent from the inputs, its input embedding row
    is only seen through the unembedding (tied GPT-2), and the untied model's row becomes dead: the
    nullity grows by d_model − 1 (its all-ones component was already counted)."""
    cfg = CONFIGS["gpt2 untied"]
    model = TransformerLM(cfg)
    params = model.init(2, xp=xp, device=device)
    tokens, _ = referee_inputs(cfg, 0, xp=xp, device=device)
    t = to_numpy(tokens).copy()
    t[t == 3] = 4
    result = numerical_redundancy(model, params, xp.asarray(t, device=device))
    assert result.nullity == redundancy(cfg).total + cfg["d_model"] - 1


def test_referee_options(xp, device):
    cfg = CONFIGS["pre-LN+GELU (gpt2)"]
    model = TransformerLM({**cfg, "n_layers": 1})
    params = model.init(0, xp=xp, device=device)
    tokens, _ = referee_inputs(model.config, 0, xp=xp, device=device)
    central = numerical_redundancy(model, params, tokens, method="central")
    assert central.method == "central"
    assert central.nullity == redundancy(model.config).total
    with pytest.raises(ValueError, match="method"):
        numerical_redundancy(model, params, tokens, method="backward")
