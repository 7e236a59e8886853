"""SympNet layers and the PSD layer: formulas, pullbacks against autodiff, symplecticity, shapes.

Every layer maps z = [q; p] pointwise; inputs here are (B, T, d) so that batch and time axes are
both exercised. Tolerances are for float64.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

from _helpers import assert_close, max_abs, to_numpy
from _layer_checks import (
    check_batched_equals_looped,
    check_jit_matches_eager,
    check_pullback,
    jacobian,
    symplectic_form,
)
from geoarray import random
from geoarray.manifolds import Stiefel
from geoarray.nn import Chain
from geoarray.nn.sympnet import (
    ActivationLayerP,
    ActivationLayerQ,
    BiasLayer,
    GradientLayerP,
    GradientLayerQ,
    LinearLayerP,
    LinearLayerQ,
    PSDLayer,
)

D = 6  # d = 2k, k = 3
M = 5  # upscale

SYMPNET_LAYERS = {
    "GradientLayerQ": lambda: GradientLayerQ(D, M, "tanh"),
    "GradientLayerP": lambda: GradientLayerP(D, M, "sigmoid"),
    "LinearLayerQ": lambda: LinearLayerQ(D),
    "LinearLayerP": lambda: LinearLayerP(D),
    "ActivationLayerQ": lambda: ActivationLayerQ(D, "tanh"),
    "ActivationLayerP": lambda: ActivationLayerP(D, "gelu"),
    "BiasLayer": lambda: BiasLayer(D),
}
CHAINS = {
    "G-SympNet": lambda: Chain(GradientLayerQ(D, M), GradientLayerP(D, M), GradientLayerQ(D, M, "sigmoid")),
    "LA-SympNet": lambda: Chain(
        LinearLayerQ(D), ActivationLayerP(D), LinearLayerP(D), ActivationLayerQ(D), BiasLayer(D)
    ),
}
PSD_LAYERS = {"PSD lift 4→10": lambda: PSDLayer(4, 10), "PSD reduce 10→4": lambda: PSDLayer(10, 4)}
ALL = {**SYMPNET_LAYERS, **CHAINS, **PSD_LAYERS}


def _params(layer, xp, device, seed=0):
    """init() with every unconstrained leaf redrawn as N(0, 0.7²), so zero biases are exercised too."""
    params = layer.init(seed, xp=xp, device=device)
    leaves, spec = optree.tree_flatten(params, none_is_leaf=True)
    mans = optree.tree_leaves(layer.manifolds(), none_is_leaf=True)
    seeds = random.spawn(seed + 1, len(leaves))
    new = [
        leaf if man is not None else random.normal(s, tuple(leaf.shape), xp=xp, device=device, scale=0.7)
        for leaf, man, s in zip(leaves, mans, seeds, strict=True)
    ]
    return optree.tree_unflatten(spec, new)


def _x(xp, device, dim, shape=(2, 3), seed=7):
    return random.normal(seed, (*shape, dim), xp=xp, device=device)


def _in_dim(layer):
    return layer.layers[0].in_dim if isinstance(layer, Chain) else layer.in_dim


# ---------------------------------------------------------------------------------------------
# formulas against a NumPy reference
# ---------------------------------------------------------------------------------------------


def _np_act(name, x):
    if name == "tanh":
        return np.tanh(x)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    c = np.sqrt(2 / np.pi)
    return x * (1 + np.tanh(c * (x + 0.044715 * x**3))) / 2  # gelu (tanh form)


def _reference(name, P, z):
    k = z.shape[-1] // 2
    q, p = z[..., :k], z[..., k:]
    if name.startswith("Gradient"):
        act = "tanh" if name.endswith("Q") else "sigmoid"
        src = p if name.endswith("Q") else q
        hidden = P["a"] * _np_act(act, np.einsum("mk,...k->...m", P["K"], src) + P["b"])
        inc = np.einsum("mk,...m->...k", P["K"], hidden)
    elif name.startswith("Linear"):
        S = (P["S"] + P["S"].T) / 2
        inc = np.einsum("ij,...j->...i", S, p if name.endswith("Q") else q)
    elif name.startswith("Activation"):
        inc = P["a"] * _np_act("tanh" if name.endswith("Q") else "gelu", p if name.endswith("Q") else q)
    else:
        return z + P["b"]
    return np.concatenate([q + inc, p] if name.endswith("Q") else [q, p + inc], axis=-1)


@pytest.mark.parametrize("name", list(SYMPNET_LAYERS))
def test_apply_matches_formula(xp, device, name):
    """apply(params, x) equals the formula of the issue (NumPy, float64) to 1e-13, same dtype/device."""
    layer = SYMPNET_LAYERS[name]()
    params, x = _params(layer, xp, device), _x(xp, device, D)
    P = {key: to_numpy(v) for key, v in params.items()}
    assert_close(layer.apply(params, x), _reference(name, P, to_numpy(x)), xp=xp, device=device, atol=1e-13)


@pytest.mark.parametrize("name", list(PSD_LAYERS))
def test_psd_matches_block_diagonal(xp, device, name):
    """Lift: y = blockdiag(Φ, Φ)x; reduce: y = blockdiag(Φᵀ, Φᵀ)x (to 1e-13)."""
    layer = PSD_LAYERS[name]()
    params, x = _params(layer, xp, device), _x(xp, device, layer.in_dim)
    Phi = to_numpy(params["Phi"])
    A = np.kron(np.eye(2), Phi if layer.lifting else Phi.T)
    assert_close(layer.apply(params, x), to_numpy(x) @ A.T, xp=xp, device=device, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# pullbacks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALL))
def test_pullback_matches_autodiff(backend, xp, device, name):
    """Analytic vjp = torch.autograd / jax.vjp of apply to 1e-10 (finite differences to 1e-7 elsewhere)."""
    layer = ALL[name]()
    params = _params(layer, xp, device)
    check_pullback(layer, params, _x(xp, device, _in_dim(layer)), backend, rtol=1e-10)


@pytest.mark.parametrize("name", ["GradientLayerQ", "LinearLayerP", "ActivationLayerQ", "BiasLayer", *PSD_LAYERS])
def test_batched_equals_looped(xp, device, name):
    """apply and pullback on (2, 3, d) equal per-sample calls; dparams are the sum of per-sample ones (1e-13)."""
    layer = ALL[name]()
    params = _params(layer, xp, device)
    check_batched_equals_looped(layer, params, _x(xp, device, layer.in_dim), xp, batch_ndim=2, rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# symplecticity
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SYMPNET_LAYERS, *CHAINS])
def test_symplectic(xp, device, name):
    """Jᵀ𝕁J = 𝕁 to 1e-10 for the Jacobian at one sample, and J ≠ I (except BiasLayer) so the check bites."""
    layer = ALL[name]()
    params = _params(layer, xp, device)
    J = jacobian(layer, params, _x(xp, device, D, shape=()), xp)
    Jd = symplectic_form(1, D)
    np.testing.assert_allclose(J.T @ Jd @ J, Jd, rtol=0, atol=1e-10)
    if name != "BiasLayer":
        assert np.max(np.abs(J - np.eye(D))) > 1e-2


def test_psd_lift_is_symplectic_and_reduce_is_its_symplectic_inverse(xp, device):
    """Lift A: Aᵀ𝕁_{2N}A = 𝕁_{2n}; reduce A⁺ (same Φ) = 𝕁_{2n}ᵀAᵀ𝕁_{2N}, A⁺A = I, A⁺𝕁_{2N}A⁺ᵀ = 𝕁_{2n} (1e-10)."""
    lift, reduce = PSDLayer(4, 10), PSDLayer(10, 4)
    params = lift.init(3, xp=xp, device=device)
    A = jacobian(lift, params, _x(xp, device, 4, shape=()), xp)
    Ap = jacobian(reduce, params, _x(xp, device, 10, shape=()), xp)
    J2n, J2N = symplectic_form(1, 4), symplectic_form(1, 10)
    assert A.shape == (10, 4) and Ap.shape == (4, 10)
    np.testing.assert_allclose(A.T @ J2N @ A, J2n, rtol=0, atol=1e-10)
    np.testing.assert_allclose(Ap, J2n.T @ A.T @ J2N, rtol=0, atol=1e-10)
    np.testing.assert_allclose(Ap @ A, np.eye(4), rtol=0, atol=1e-10)
    np.testing.assert_allclose(Ap @ J2N @ Ap.T, J2n, rtol=0, atol=1e-10)


def test_psd_square_is_symplectic(xp, device):
    """in_dim = out_dim: Φ ∈ O(n) and blockdiag(Φ, Φ) is a symplectic matrix (1e-10)."""
    layer = PSDLayer(6, 6)
    J = jacobian(layer, layer.init(0, xp=xp, device=device), _x(xp, device, 6, shape=()), xp)
    np.testing.assert_allclose(J.T @ symplectic_form(1, 6) @ J, symplectic_form(1, 6), rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# init and manifolds
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALL))
def test_manifolds_mirror_init(xp, device, name):
    """manifolds() has init()'s tree structure (none_is_leaf=True); leaves are float64 on the device."""
    layer = ALL[name]()
    params = layer.init(0, xp=xp, device=device)
    assert optree.tree_structure(params, none_is_leaf=True) == optree.tree_structure(
        layer.manifolds(), none_is_leaf=True
    )
    for leaf in optree.tree_leaves(params):
        assert leaf.dtype == xp.float64


@pytest.mark.parametrize(("in_dim", "out_dim", "N", "n"), [(4, 10, 5, 2), (10, 4, 5, 2), (6, 6, 3, 3)])
def test_psd_init_is_on_stiefel(xp, device, in_dim, out_dim, N, n):
    """Φ from init lies on St(N, n): |ΦᵀΦ − I| ≤ 1e-12, and manifolds() names Stiefel(N, n)."""
    layer = PSDLayer(in_dim, out_dim)
    Phi = layer.init(5, xp=xp, device=device)["Phi"]
    assert layer.manifolds() == {"Phi": Stiefel(N, n)}
    assert tuple(Phi.shape) == (N, n)
    assert Stiefel(N, n).is_point(Phi, atol=1e-12)
    assert max_abs(xp.matrix_transpose(Phi) @ Phi - xp.eye(n, dtype=Phi.dtype, device=device)) <= 1e-12


def test_init_is_deterministic_and_chain_children_differ(xp, device):
    """Same seed → same params; Chain gives each layer its own child seed (entries differ by > 1e-3)."""
    layer = Chain(GradientLayerQ(D, M), GradientLayerQ(D, M))
    a, b = layer.init(1, xp=xp, device=device), layer.init(1, xp=xp, device=device)
    assert max_abs(a[0]["K"] - b[0]["K"]) == 0.0
    assert max_abs(a[0]["K"] - a[1]["K"]) > 1e-3


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def test_bad_sizes_raise():
    """Odd or non-positive sizes raise ValueError naming the argument; non-ints raise TypeError."""
    with pytest.raises(ValueError, match=r"dim must be even.*dim=5"):
        GradientLayerQ(5, 4)
    for cls in (GradientLayerP, LinearLayerQ, LinearLayerP, ActivationLayerQ, ActivationLayerP, BiasLayer):
        args = (7, 3) if cls is GradientLayerP else (7,)
        with pytest.raises(ValueError, match=r"dim must be even.*dim=7"):
            cls(*args)
    with pytest.raises(ValueError, match="upscale must be positive"):
        GradientLayerQ(4, 0)
    with pytest.raises(TypeError, match="dim must be an int"):
        LinearLayerQ(4.0)
    with pytest.raises(ValueError, match=r"in_dim must be even.*in_dim=5"):
        PSDLayer(5, 10)
    with pytest.raises(ValueError, match=r"out_dim must be even.*out_dim=3"):
        PSDLayer(10, 3)
    with pytest.raises(ValueError, match="activation must be one of"):
        ActivationLayerQ(4, "softsign")


def test_bad_inputs_raise(xp, device):
    """Wrong feature size, wrong param shapes/keys, mixed dtypes, integer inputs and a wrong dy are refused clearly."""
    layer = GradientLayerQ(D, M)
    params = layer.init(0, xp=xp, device=device)
    with pytest.raises(
        ValueError,
        match=r"GradientLayerQ\(dim=6, upscale=5, activation='tanh'\): x must have shape \(\.\.\., 6\), "
        r"got shape \(2, 3, 4\)",
    ):
        layer.apply(params, _x(xp, device, 4))
    bad = {**params, "K": random.normal(0, (M, 2), xp=xp, device=device)}
    with pytest.raises(ValueError, match=r"params\['K'\] must have shape \(5, 3\), got shape \(5, 2\)"):
        layer.apply(bad, _x(xp, device, D))
    with pytest.raises(ValueError, match=r"params must be a dict with keys \['K', 'a', 'b'\], got \['K'\]"):
        layer.apply({"K": params["K"]}, _x(xp, device, D))
    with pytest.raises(TypeError, match="x must have a real floating dtype"):
        layer.apply(params, xp.ones((2, D), dtype=xp.int64, device=device))
    x32 = xp.astype(_x(xp, device, D), xp.float32)
    with pytest.raises(TypeError, match=r"params\['K'\] must have the dtype of x"):
        layer.apply(params, x32)
    psd = PSDLayer(4, 10)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 4\), got shape \(2, 3, 10\)"):
        psd.apply(psd.init(0, xp=xp, device=device), _x(xp, device, 10))
    _, pullback = layer.vjp(params, _x(xp, device, D))
    with pytest.raises(ValueError, match=r"dy must have the output's shape \(2, 3, 6\), got shape \(3, 6\)"):
        pullback(_x(xp, device, D, shape=(3,)))


def test_float32_keeps_dtype(xp, device):
    """float32 params and inputs give float32 outputs and gradients (values agree with float64 to 1e-5)."""
    layer = CHAINS["G-SympNet"]()
    p64 = _params(layer, xp, device)
    p32 = optree.tree_map(lambda v: xp.astype(v, xp.float32), p64)
    x64 = _x(xp, device, D)
    y32, pb = layer.vjp(p32, xp.astype(x64, xp.float32))
    dp, dx = pb(xp.ones_like(y32))
    assert y32.dtype == xp.float32 and dx.dtype == xp.float32
    assert all(leaf.dtype == xp.float32 for leaf in optree.tree_leaves(dp))
    np.testing.assert_allclose(to_numpy(y32), to_numpy(layer.apply(p64, x64)), rtol=0, atol=1e-5)


def test_jit_matches_eager(backend, xp, device):
    """jax.jit of a G-SympNet apply and vjp equals the eager result to 1e-13 (the layers are traceable)."""
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    layer = CHAINS["G-SympNet"]()
    check_jit_matches_eager(layer, _params(layer, xp, device), _x(xp, device, D), xp, atol=1e-13)
