"""Volume-preserving attention and feed-forward layers: pullbacks, det J = 1, orthogonal Λ, shapes."""

from __future__ import annotations

import numpy as np
import optree
import pytest

from _helpers import assert_close, to_numpy
from _layer_checks import check_pullback, jacobian
from geoarray import random
from geoarray.nn.base import Chain
from geoarray.nn.volume_preserving import (
    VolumePreservingAttention,
    VolumePreservingLowerLayer,
    VolumePreservingUpperLayer,
)


def _params(layer, xp, device, seed=0, scale=0.3):
    """The layer's init plus a generic perturbation (non-zero bias, parts the layer projects away)."""
    params = layer.init(seed, xp=xp, device=device)
    leaves, spec = optree.tree_flatten(params)
    noise = [
        random.normal(1000 + seed + i, tuple(leaf.shape), xp=xp, device=device, scale=scale)
        for i, leaf in enumerate(leaves)
    ]
    return optree.tree_unflatten(spec, [leaf + n for leaf, n in zip(leaves, noise, strict=True)])


def _x(xp, device, shape, seed=7, scale=1.0):
    return random.normal(seed, shape, xp=xp, device=device, scale=scale)


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
    params = _params(layer, xp, device)
    check_pullback(layer, params, _x(xp, device, (2, 4, 5)), backend)


def test_chain_pullback_matches_autodiff(backend, xp, device):
    """A volume-preserving stack (attention, lower, upper, attention) pulls back like autodiff, to 1e-10."""
    d = 4
    chain = Chain(
        VolumePreservingAttention(d, 6),
        VolumePreservingLowerLayer(d, "tanh"),
        VolumePreservingUpperLayer(d, "tanh"),
        VolumePreservingAttention(d),
    )
    params = tuple(_params(layer, xp, device, seed=i) for i, layer in enumerate(chain.layers))
    check_pullback(chain, params, _x(xp, device, (3, 6, d)), backend)


# ---------------------------------------------------------------------------------------------
# structure
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("T", "d"), [(3, 6), (6, 3), (4, 4)])
def test_attention_preserves_volume_and_lambda_is_orthogonal(xp, device, T, d):
    """det ∂vec(y)/∂vec(x) = 1 to 1e-8 (T < d, T > d, T = d) and ΛᵀΛ = I, det Λ = 1 to 1e-13."""
    layer = VolumePreservingAttention(d, T)
    params = _params(layer, xp, device, seed=T)
    x = _x(xp, device, (T, d), seed=d)
    J = jacobian(layer, params, x, xp)
    assert abs(_det(J) - 1) < 1e-8, f"det J = {_det(J)!r}"

    xs = _x(xp, device, (5, T, d), seed=d + 1)
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
    x = _x(xp, device, (T, d), seed=4)
    Lam = to_numpy(layer.attention_matrix(params, x))
    np.testing.assert_allclose(Lam.T @ Lam, np.eye(T), atol=1e-13)
    assert abs(_det(jacobian(layer, params, x, xp)) - 1) > 1e-2


def test_attention_matches_seed_formula(xp, device):
    """y = (Z Λ(Z))ᵀ with Z = xᵀ, Λ = (I − ZᵀAZ)(I + ZᵀAZ)⁻¹, A = skew part (dense NumPy reference), to 1e-12."""
    T, d = 5, 3
    layer = VolumePreservingAttention(d)
    params = _params(layer, xp, device)
    x = _x(xp, device, (2, T, d))
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
    params = _params(layer, xp, device)
    J = jacobian(layer, params, _x(xp, device, (d,)), xp)
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
    params = tuple(_params(layer, xp, device, seed=i) for i, layer in enumerate(chain.layers))
    J = jacobian(chain, params, _x(xp, device, (T, d)), xp)
    assert abs(_det(J) - 1) < 1e-8, f"det J = {_det(J)!r}"


# ---------------------------------------------------------------------------------------------
# batching, spellings, dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["attention-skew", "attention-arbitrary", "lower-tanh"])
def test_batched_equals_looped(xp, device, name):
    """apply and pullback on a (2, 3, T, d) batch equal per-sample results (parameter gradients summed), to 1e-12."""
    T, d = 4, 3
    layer = LAYERS[name](d)
    params = _params(layer, xp, device)
    x = _x(xp, device, (2, 3, T, d))
    dy = _x(xp, device, (2, 3, T, d), seed=8)
    y, pullback = layer.vjp(params, x)
    dparams, dx = pullback(dy)
    for key in params:
        total = 0.0
        for i in range(2):
            for j in range(3):
                yi, pbi = layer.vjp(params, x[i, j, ...])
                dpi, dxi = pbi(dy[i, j, ...])
                assert_close(y[i, j, ...], yi, xp=xp, atol=1e-12)
                assert_close(dx[i, j, ...], dxi, xp=xp, atol=1e-12)
                total = total + dpi[key]
        assert_close(dparams[key], total, xp=xp, atol=1e-12)


def test_seq_len_is_optional(xp, device):
    """VolumePreservingAttention(d, T, skew_sym=True) and VolumePreservingAttention(d) are the same map (exactly)."""
    a, b = VolumePreservingAttention(3, 4, skew_sym=True), VolumePreservingAttention(3)
    params = a.init(0, xp=xp, device=device)
    x = _x(xp, device, (2, 4, 3))
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
    """Wrong d, wrong T (when seq_len is given), missing time axis, bad params or dy: ValueError naming shapes."""
    layer = VolumePreservingAttention(3, 4)
    params = layer.init(0, xp=xp, device=device)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 4, 3\), got \(2, 4, 5\)"):
        layer.apply(params, _x(xp, device, (2, 4, 5)))
    with pytest.raises(ValueError, match=r"seq_len=4.*got \(2, 5, 3\)"):
        layer.apply(params, _x(xp, device, (2, 5, 3)))
    with pytest.raises(ValueError, match=r"got \(3,\)"):
        VolumePreservingAttention(3).apply(params, _x(xp, device, (3,)))
    with pytest.raises(ValueError, match=r"params\['A'\] must have shape \(3, 3\), got \(4, 4\)"):
        layer.apply({"A": _x(xp, device, (4, 4))}, _x(xp, device, (4, 3)))
    with pytest.raises(ValueError, match="params must be a dict with key 'A'"):
        layer.apply({"W": params["A"]}, _x(xp, device, (4, 3)))
    _, pullback = layer.vjp(params, _x(xp, device, (2, 4, 3)))
    with pytest.raises(ValueError, match=r"dy must have the output's shape \(2, 4, 3\), got \(4, 3\)"):
        pullback(_x(xp, device, (4, 3)))
    with pytest.raises(TypeError, match="x must have a real floating dtype"):
        layer.apply(params, xp.ones((4, 3), dtype=xp.int64, device=device))
    lower = VolumePreservingLowerLayer(3)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 3\), got \(4, 2\)"):
        lower.apply(lower.init(0, xp=xp, device=device), _x(xp, device, (4, 2)))
    with pytest.raises(ValueError, match="dim must be a positive int, got 0"):
        VolumePreservingAttention(0)
    with pytest.raises(ValueError, match="activation must be one of"):
        VolumePreservingUpperLayer(3, "softplus")


def test_traces_under_jax_jit(backend, xp, device):
    """apply and the pullback are pure: under jax.jit they give the eager results to 1e-13."""
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    layer = Chain(VolumePreservingAttention(3), VolumePreservingLowerLayer(3))
    params = tuple(_params(lay, xp, device, seed=i) for i, lay in enumerate(layer.layers))
    x = _x(xp, device, (2, 4, 3))

    def step(params, x):
        y, pullback = layer.vjp(params, x)
        return y, pullback(y)

    y, (dp, dx) = jax.jit(step)(params, x)
    y0, (dp0, dx0) = step(params, x)
    assert_close(y, y0, xp=xp, atol=1e-13)
    assert_close(dx, dx0, xp=xp, atol=1e-13)
    for a, b in zip(optree.tree_leaves(dp), optree.tree_leaves(dp0), strict=True):
        assert_close(a, b, xp=xp, atol=1e-13)
