"""Volume-preserving attention and feed-forward layers: pullbacks, det J = 1, orthogonal Λ, shapes."""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import assert_close, to_numpy
from _layer_checks import (
    check_batched_equals_looped,
    check_jit_matches_eager,
    check_pullback,
    jacobian,
    perturbed_params,
    random_input,
)
from geoarray import random
from geoarray.nn.base import Chain
from geoarray.nn.volume_preserving import (
    VolumePreservingAttention,
    VolumePreservingLowerLayer,
    VolumePreservingUpperLayer,
)


def _det(J: np.ndarray) -> float:
    sign, logabs = np.linalg.slogdet(J)
    return float(sign * np.exp(logabs))


LAYERS = {
    "attention-skew": lambda d: VolumePreservingAttention(d),
    "attention-arbitrary": lambda d: VolumePreservingAttention(d, skew_sym=False),
    "lower-tanh": lambda d: VolumePreservingLowerLayer(d, "tanh"),
    "upper-gelu": lambda d: VolumePreservingUpperLayer(d, "gelu"),
    "lower-sigmoid-nobias": lambda d: VolumePreservingLowerLayer(d, "sigmoid", use_bias=False),
    "upper-identity-nobias": lambda d: VolumePreservingUpperLayer(d, "identity", use_bias=False),
}


# ---------------------------------------------------------------------------------------------
# pullbacks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LAYERS))
def test_pullback_matches_autodiff(backend, xp, device, name):
    """Analytic vjp = torch.autograd / jax.vjp of apply to 1e-10 (finite differences to 1e-7 elsewhere)."""
    layer = LAYERS[name](5)
    params = perturbed_params(layer, xp, device)
    check_pullback(layer, params, random_input(xp, device, (2, 4, 5)), backend)


def test_chain_pullback_matches_autodiff(backend, xp, device):
    """A volume-preserving stack (attention, lower, upper, attention) pulls back like autodiff, to 1e-10."""
    d = 4
    chain = Chain(
        VolumePreservingAttention(d, 6),
        VolumePreservingLowerLayer(d, "tanh"),
        VolumePreservingUpperLayer(d, "tanh"),
        VolumePreservingAttention(d),
    )
    params = tuple(perturbed_params(layer, xp, device, seed=i) for i, layer in enumerate(chain.layers))
    check_pullback(chain, params, random_input(xp, device, (3, 6, d)), backend)


# ---------------------------------------------------------------------------------------------
# structure
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("T", "d"), [(3, 6), (6, 3), (4, 4)])
def test_attention_preserves_volume_and_lambda_is_orthogonal(xp, device, T, d):
    """det ∂vec(y)/∂vec(x) = 1 to 1e-8 (T < d, T > d, T = d) and ΛᵀΛ = I, det Λ = 1 to 1e-13."""
    layer = VolumePreservingAttention(d, T)
    params = perturbed_params(layer, xp, device, seed=T)
    x = random_input(xp, device, (T, d), seed=d)
    J = jacobian(layer, params, x, xp)
    assert abs(_det(J) - 1) < 1e-8, f"det J = {_det(J)!r}"

    xs = random_input(xp, device, (5, T, d), seed=d + 1)
    Lam = to_numpy(layer.attention_matrix(params, xs))
    np.testing.assert_allclose(np.swapaxes(Lam, -1, -2) @ Lam, np.broadcast_to(np.eye(T), Lam.shape), atol=1e-13)
    np.testing.assert_allclose(np.linalg.det(Lam), 1.0, atol=1e-13)
    C = to_numpy(layer.correlation(params, xs))
    np.testing.assert_allclose(C, -np.swapaxes(C, -1, -2), atol=1e-14)


def test_arbitrary_variant_is_orthogonal_but_not_volume_preserving(xp, device):
    """skew_sym=False (the reference's default): Λ orthogonal to 1e-13, yet |det J − 1| > 1e-2 (as documented)."""
    T, d = 4, 3
    layer = VolumePreservingAttention(d, skew_sym=False)
    params = {"A": random.normal(3, (d, d), xp=xp, device=device)}
    x = random_input(xp, device, (T, d), seed=4)
    Lam = to_numpy(layer.attention_matrix(params, x))
    np.testing.assert_allclose(Lam.T @ Lam, np.eye(T), atol=1e-13)
    assert abs(_det(jacobian(layer, params, x, xp)) - 1) > 1e-2


def test_attention_matches_seed_formula(xp, device):
    """y = (Z Λ(Z))ᵀ with Z = xᵀ, Λ = (I − ZᵀAZ)(I + ZᵀAZ)⁻¹, A = skew part (dense NumPy reference), to 1e-12."""
    T, d = 5, 3
    layer = VolumePreservingAttention(d)
    params = perturbed_params(layer, xp, device)
    x = random_input(xp, device, (2, T, d))
    A = to_numpy(params["A"])
    S = (A - A.T) / 2
    ref = []
    for xb in to_numpy(x):
        Z = xb.T
        C = Z.T @ S @ Z
        Lam = (np.eye(T) - C) @ np.linalg.inv(np.eye(T) + C)
        ref.append((Z @ Lam).T)
    assert_close(layer.apply(params, x), np.stack(ref), xp=xp, device=device, atol=1e-12)


@pytest.mark.parametrize("cls", [VolumePreservingLowerLayer, VolumePreservingUpperLayer])
def test_triangular_layer_has_unit_triangular_jacobian(xp, device, cls):
    """J − I is strictly lower (upper) triangular, exactly: det J = 1."""
    d = 5
    layer = cls(d, "tanh")
    params = perturbed_params(layer, xp, device)
    J = jacobian(layer, params, random_input(xp, device, (d,)), xp)
    keep = np.triu if cls is VolumePreservingLowerLayer else np.tril
    assert np.all(keep(J - np.eye(d)) == 0)
    assert abs(_det(J) - 1) < 1e-14


def test_stack_preserves_volume_on_sequences(xp, device):
    """A VP transformer-like stack on (T, d) = (5, 4) has det J = 1 to 1e-8."""
    T, d = 5, 4
    chain = Chain(
        VolumePreservingAttention(d),
        VolumePreservingLowerLayer(d, "tanh"),
        VolumePreservingUpperLayer(d, "gelu"),
        VolumePreservingLowerLayer(d, "sigmoid", use_bias=False),
        VolumePreservingAttention(d),
    )
    params = tuple(perturbed_params(layer, xp, device, seed=i) for i, layer in enumerate(chain.layers))
    J = jacobian(chain, params, random_input(xp, device, (T, d)), xp)
    assert abs(_det(J) - 1) < 1e-8, f"det J = {_det(J)!r}"


# ---------------------------------------------------------------------------------------------
# batching, spellings, dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["attention-skew", "attention-arbitrary", "lower-tanh"])
def test_batched_equals_looped(xp, device, name):
    """apply and pullback on a (2, 3, T, d) batch equal per-sample results (parameter gradients summed), to 1e-12."""
    T, d = 4, 3
    layer = LAYERS[name](d)
    params = perturbed_params(layer, xp, device)
    check_batched_equals_looped(layer, params, random_input(xp, device, (2, 3, T, d)), xp, batch_ndim=2, rtol=1e-12)


def test_seq_len_is_optional(xp, device):
    """VolumePreservingAttention(d, T, skew_sym=True) and VolumePreservingAttention(d) are the same map (exactly)."""
    a, b = VolumePreservingAttention(3, 4, skew_sym=True), VolumePreservingAttention(3)
    params = a.init(0, xp=xp, device=device)
    x = random_input(xp, device, (2, 4, 3))
    assert_close(a.apply(params, x), b.apply(params, x), xp=xp, atol=0)
    assert b.manifolds() == {"A": None}
    assert set(VolumePreservingLowerLayer(3).manifolds()) == {"L", "b"}
    assert set(VolumePreservingUpperLayer(3, use_bias=False).manifolds()) == {"U"}


def test_init_is_structured_and_float32_is_kept(xp, device):
    """init gives a skew A and a strictly triangular L; float32 parameters and inputs give float32 outputs."""
    A = to_numpy(VolumePreservingAttention(4).init(0, xp=xp, device=device)["A"])
    np.testing.assert_array_equal(A, -A.T)
    L = to_numpy(VolumePreservingLowerLayer(4).init(0, xp=xp, device=device)["L"])
    np.testing.assert_array_equal(L, np.tril(L, -1))
    for layer in (VolumePreservingAttention(4), VolumePreservingUpperLayer(4)):
        params = layer.init(0, xp=xp, dtype="float32", device=device)
        x = random.normal(1, (2, 3, 4), xp=xp, dtype="float32", device=device)
        y, pullback = layer.vjp(params, x)
        dparams, dx = pullback(y)
        assert y.dtype == x.dtype and dx.dtype == x.dtype
        assert all(g.dtype == x.dtype for g in dparams.values())


def test_bad_inputs_raise(xp, device):
    """Wrong d, wrong T (when seq_len is given), missing time axis, bad params or dy: ValueError naming shapes;
    a non-int size or a parameter dtype other than x's: TypeError."""
    layer = VolumePreservingAttention(3, 4)
    params = layer.init(0, xp=xp, device=device)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 4, 3\) \(seq_len=4\), got shape \(2, 4, 5\)"):
        layer.apply(params, random_input(xp, device, (2, 4, 5)))
    with pytest.raises(ValueError, match=r"\(seq_len=4\), got shape \(2, 5, 3\)"):
        layer.apply(params, random_input(xp, device, (2, 5, 3)))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, 3\), got shape \(3,\)"):
        VolumePreservingAttention(3).apply(params, random_input(xp, device, (3,)))
    with pytest.raises(ValueError, match=r"params\['A'\] must have shape \(3, 3\), got shape \(4, 4\)"):
        layer.apply({"A": random_input(xp, device, (4, 4))}, random_input(xp, device, (4, 3)))
    with pytest.raises(ValueError, match=r"params must be a dict with keys \['A'\], got \['W'\]"):
        layer.apply({"W": params["A"]}, random_input(xp, device, (4, 3)))
    _, pullback = layer.vjp(params, random_input(xp, device, (2, 4, 3)))
    with pytest.raises(ValueError, match=r"dy must have the output's shape \(2, 4, 3\), got shape \(4, 3\)"):
        pullback(random_input(xp, device, (4, 3)))
    with pytest.raises(TypeError, match="x must have a real floating dtype"):
        layer.apply(params, xp.ones((4, 3), dtype=xp.int64, device=device))
    lower = VolumePreservingLowerLayer(3)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 3\), got shape \(4, 2\)"):
        lower.apply(lower.init(0, xp=xp, device=device), random_input(xp, device, (4, 2)))
    with pytest.raises(ValueError, match="dim must be positive, got 0"):
        VolumePreservingAttention(0)
    with pytest.raises(TypeError, match=r"seq_len must be an int, got 4\.0"):
        VolumePreservingAttention(3, 4.0)
    with pytest.raises(TypeError, match=r"params\['A'\] must have the dtype of x"):
        layer.apply({"A": xp.astype(params["A"], xp.float32)}, random_input(xp, device, (4, 3)))
    with pytest.raises(ValueError, match="activation must be one of"):
        VolumePreservingUpperLayer(3, "softplus")


def test_traces_under_jax_jit(backend, xp, device):
    """apply and the pullback are pure: under jax.jit they give the eager results to 1e-13."""
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    layer = Chain(VolumePreservingAttention(3), VolumePreservingLowerLayer(3))
    params = tuple(perturbed_params(lay, xp, device, seed=i) for i, lay in enumerate(layer.layers))
    check_jit_matches_eager(layer, params, random_input(xp, device, (2, 4, 3)), xp, atol=1e-13)
