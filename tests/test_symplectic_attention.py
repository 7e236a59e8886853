"""Linear and non-linear symplectic attention: pullbacks, Jᵀ𝕁̂J = 𝕁̂, exact potential gradients, shapes."""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import asarray, assert_close, to_numpy
from _layer_checks import (
    check_batched_equals_looped,
    check_jit_matches_eager,
    check_pullback,
    jacobian,
    perturbed_params,
    random_input,
    symplectic_form,
)
from geoarray import random
from geoarray.nn.base import Chain
from geoarray.nn.symplectic_attention import (
    LinearSymplecticAttentionP,
    LinearSymplecticAttentionQ,
    SymplecticAttentionP,
    SymplecticAttentionQ,
)

T_, D_ = 4, 6  # sequence length and (even) feature size of most cases


def _layers(T=T_, d=D_):
    out = {"linear-Q": LinearSymplecticAttentionQ(d, T), "linear-P": LinearSymplecticAttentionP(d, T)}
    for softmax in ("matrix", "vector"):
        for symmetric in (False, True):
            tag = f"{softmax}-{'sym' if symmetric else 'arb'}"
            out[f"{tag}-Q"] = SymplecticAttentionQ(d, symmetric=symmetric, softmax=softmax)
            out[f"{tag}-P"] = SymplecticAttentionP(d, symmetric=symmetric, softmax=softmax)
    return out


LAYERS = _layers()
NONLINEAR = [name for name in LAYERS if not name.startswith("linear")]


def _chain(T=T_, d=D_):
    return Chain(
        LinearSymplecticAttentionQ(d, T),
        SymplecticAttentionP(d, softmax="matrix"),
        SymplecticAttentionQ(d, symmetric=True, softmax="vector"),
        LinearSymplecticAttentionP(d, T),
        SymplecticAttentionP(d, softmax="vector"),
    )


def _chain_params(chain, xp, device):
    return tuple(perturbed_params(layer, xp, device, seed=i) for i, layer in enumerate(chain.layers))


# ---------------------------------------------------------------------------------------------
# pullbacks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LAYERS))
def test_pullback_matches_autodiff(backend, xp, device, name):
    """Analytic vjp (exact Hessian-vector product) = torch.autograd / jax.vjp to 1e-10; FD to 1e-7 elsewhere."""
    layer = LAYERS[name]
    check_pullback(layer, perturbed_params(layer, xp, device), random_input(xp, device, (2, T_, D_)), backend)


def test_chain_pullback_matches_autodiff(backend, xp, device):
    """A stack of linear and softmax symplectic attention layers pulls back like autodiff, to 1e-10."""
    chain = _chain()
    check_pullback(chain, _chain_params(chain, xp, device), random_input(xp, device, (3, T_, D_)), backend)


# ---------------------------------------------------------------------------------------------
# symplecticity
# ---------------------------------------------------------------------------------------------


def _assert_symplectic(layer, params, x, xp, T, d, atol=1e-10):
    J = jacobian(layer, params, x, xp)
    Jhat = symplectic_form(T, d)
    np.testing.assert_allclose(J.T @ Jhat @ J, Jhat, atol=atol)


@pytest.mark.parametrize("name", list(LAYERS))
def test_symplectic_on_product_space(xp, device, name):
    """Jᵀ 𝕁̂ J = 𝕁̂ (𝕁̂ = I_T ⊗ 𝕁, form Σ_t z_tᵀ𝕁z̃_t) to 1e-10, for inputs of scale 2."""
    layer = LAYERS[name]
    _assert_symplectic(
        layer, perturbed_params(layer, xp, device), random_input(xp, device, (T_, D_), scale=2.0), xp, T_, D_
    )


def test_chain_is_symplectic(xp, device):
    """The stack of five symplectic attention layers has Jᵀ 𝕁̂ J = 𝕁̂ to 1e-10 (T=5, d=4)."""
    chain = _chain(5, 4)
    _assert_symplectic(chain, _chain_params(chain, xp, device), random_input(xp, device, (5, 4)), xp, 5, 4)


@pytest.mark.parametrize("name", ["linear-Q", "matrix-arb-Q", "vector-sym-P"])
def test_only_one_half_moves(xp, device, name):
    """Q layers change only q, P layers only p (exactly): the update is a shear."""
    layer = LAYERS[name]
    x = random_input(xp, device, (2, T_, D_))
    y = to_numpy(layer.apply(perturbed_params(layer, xp, device), x))
    k = D_ // 2
    kept = slice(k, None) if name.endswith("Q") else slice(None, k)
    np.testing.assert_array_equal(y[..., kept], to_numpy(x)[..., kept])


# ---------------------------------------------------------------------------------------------
# the potentials
# ---------------------------------------------------------------------------------------------


def _reference_potential(C: np.ndarray, softmax: str) -> np.ndarray:
    """Σ from C (..., T, T) by NumPy's stable logaddexp, with the 1 as exp(0)."""
    zero = np.zeros_like(C[..., :1, :])
    if softmax == "matrix":
        flat = C.reshape(*C.shape[:-2], -1)
        return np.logaddexp.reduce(np.concatenate([zero[..., 0, :1], flat], axis=-1), axis=-1)
    return np.logaddexp.reduce(np.concatenate([zero, C], axis=-2), axis=-2).sum(axis=-1)


@pytest.mark.parametrize("name", NONLINEAR)
def test_potential_gradient_equals_finite_differences(xp, device, name):
    """∇Σ = central differences of Σ along every coordinate of the driving half (h = 1e-5), to 1e-8 relative."""
    layer = LAYERS[name]
    params = perturbed_params(layer, xp, device)
    x0 = to_numpy(random_input(xp, device, (T_, D_)))
    k = D_ // 2
    off = k if name.endswith("Q") else 0  # Q layers read p, P layers read q
    h = 1e-5
    E = np.zeros((T_ * k, T_, D_))
    for i in range(T_):
        for j in range(k):
            E[i * k + j, i, off + j] = h
    xs = asarray(np.concatenate([x0 + E, x0 - E]), xp, device)  # one batched evaluation
    pot = to_numpy(layer.potential(params, xs))
    fd = ((pot[: T_ * k] - pot[T_ * k :]) / (2 * h)).reshape(T_, k)
    g = to_numpy(layer.potential_gradient(params, asarray(x0, xp, device)))
    np.testing.assert_allclose(g, fd, rtol=0, atol=1e-8 * max(1.0, np.abs(g).max()))


@pytest.mark.parametrize("name", NONLINEAR)
def test_potential_is_stable_for_large_correlations(xp, device, name):
    """With inputs of scale 30 (|C| up to ~1e3) Σ matches NumPy's logaddexp to 1e-12 relative and ∇Σ stays finite."""
    layer = LAYERS[name]
    params = perturbed_params(layer, xp, device)
    x = random_input(xp, device, (3, T_, D_), scale=30.0)
    A = to_numpy(params["A"])
    A = (A + A.T) / 2 if layer.symmetric else A
    k = D_ // 2
    xn = to_numpy(x)
    s = xn[..., k:] if name.endswith("Q") else xn[..., :k]
    C = s @ A @ np.swapaxes(s, -1, -2)
    assert np.abs(C).max() > 300  # exp would overflow without the max subtraction
    ref = _reference_potential(C, layer.softmax)
    assert_close(layer.potential(params, x), ref, xp=xp, device=device, rtol=1e-12)
    assert np.all(np.isfinite(to_numpy(layer.potential_gradient(params, x))))


@pytest.mark.parametrize("softmax", ["matrix", "vector"])
def test_gradient_matches_seed_formulas(xp, device, softmax):
    """∇_P Σ = A P wᵀ + Aᵀ P w (seed, k×T layout, dense NumPy) to 1e-12; for symmetric A and the matrix
    softmax it equals the seed's 2 A P exp.(C)/(1 + Σ exp C)."""
    layer = SymplecticAttentionQ(D_, softmax=softmax)
    params = perturbed_params(layer, xp, device)
    x = random_input(xp, device, (T_, D_))
    A, P = to_numpy(params["A"]), to_numpy(x)[:, D_ // 2 :].T  # P: the seed's k×T matrix
    C = P.T @ A @ P
    if softmax == "matrix":
        w = np.exp(C) / (1 + np.exp(C).sum())
    else:
        w = np.exp(C) / (1 + np.exp(C).sum(axis=0, keepdims=True))
    ref = (A @ P @ w.T + A.T @ P @ w).T
    assert_close(layer.potential_gradient(params, x), ref, xp=xp, device=device, atol=1e-12)

    if softmax == "matrix":
        sym_layer = SymplecticAttentionQ(D_, symmetric=True, softmax="matrix")
        S = (A + A.T) / 2
        C = P.T @ S @ P
        seed = 2 * S @ P @ np.exp(C) / (1 + np.exp(C).sum())
        assert_close(sym_layer.potential_gradient(params, x), seed.T, xp=xp, device=device, atol=1e-12)


def test_linear_matches_dense_formula(xp, device):
    """Linear Q: y = [q + Ā p, p], Ā = ½(A + Aᵀ) (seed: Q ← Q + P Ā); linear P: [q, p + Ā q]; to 1e-13."""
    k = D_ // 2
    x = random_input(xp, device, (2, T_, D_))
    xn = to_numpy(x)
    q, p = xn[..., :k], xn[..., k:]
    for layer, ref in (
        (LAYERS["linear-Q"], lambda Ab: np.concatenate([q + Ab @ p, p], axis=-1)),
        (LAYERS["linear-P"], lambda Ab: np.concatenate([q, p + Ab @ q], axis=-1)),
    ):
        params = perturbed_params(layer, xp, device)
        A = to_numpy(params["A"])
        assert_close(layer.apply(params, x), ref((A + A.T) / 2), xp=xp, device=device, atol=1e-13)
    # the seed's k×T form of the Q layer: Q ← Q + P Ā
    Q, P = q[0].T, p[0].T
    params = perturbed_params(LAYERS["linear-Q"], xp, device)
    A = to_numpy(params["A"])
    seed_out = Q + P @ ((A + A.T) / 2)
    assert_close(LAYERS["linear-Q"].apply(params, x)[0, :, :k], seed_out.T, xp=xp, device=device, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# batching, dtypes, bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["linear-P", "matrix-arb-Q", "vector-sym-P"])
def test_batched_equals_looped(xp, device, name):
    """apply and pullback on a (2, 2, T, d) batch equal per-sample results (parameter gradients summed), to 1e-12."""
    layer = LAYERS[name]
    params = perturbed_params(layer, xp, device)
    check_batched_equals_looped(layer, params, random_input(xp, device, (2, 2, T_, D_)), xp, batch_ndim=2, rtol=1e-12)


def test_init_structure_and_float32(xp, device):
    """init: Ā symmetric for linear and symmetric=True layers; float32 in gives float32 out (values and gradients)."""
    A = to_numpy(LinearSymplecticAttentionQ(4, 3).init(0, xp=xp, device=device)["A"])
    np.testing.assert_array_equal(A, A.T)
    A = to_numpy(SymplecticAttentionP(4, symmetric=True).init(0, xp=xp, device=device)["A"])
    np.testing.assert_array_equal(A, A.T)
    for layer in (LinearSymplecticAttentionP(4, 3), SymplecticAttentionQ(4, softmax="vector")):
        assert layer.manifolds() == {"A": None}
        params = layer.init(0, xp=xp, dtype="float32", device=device)
        x = random.normal(1, (2, 3, 4), xp=xp, dtype="float32", device=device)
        y, pullback = layer.vjp(params, x)
        dparams, dx = pullback(y)
        assert y.dtype == x.dtype and dx.dtype == x.dtype and dparams["A"].dtype == x.dtype


def test_bad_inputs_raise(xp, device):
    """Odd d, wrong d, wrong T, bad softmax, bad params: ValueError naming the expected and actual shape."""
    for cls in (SymplecticAttentionQ, SymplecticAttentionP):
        with pytest.raises(ValueError, match=r"dim must be even.*got dim=5"):
            cls(5)
    for cls in (LinearSymplecticAttentionQ, LinearSymplecticAttentionP):
        with pytest.raises(ValueError, match=r"dim must be even.*got dim=3"):
            cls(3, 4)
    lin = LinearSymplecticAttentionQ(4, 3)
    params = lin.init(0, xp=xp, device=device)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 3, 4\) \(seq_len=3\), got shape \(2, 5, 4\)"):
        lin.apply(params, random_input(xp, device, (2, 5, 4)))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 3, 4\) \(seq_len=3\), got shape \(3, 6\)"):
        lin.apply(params, random_input(xp, device, (3, 6)))
    with pytest.raises(ValueError, match=r"params\['A'\] must have shape \(3, 3\), got shape \(2, 2\)"):
        lin.apply({"A": random_input(xp, device, (2, 2))}, random_input(xp, device, (3, 4)))
    att = SymplecticAttentionP(4)
    with pytest.raises(
        ValueError, match=r"SymplecticAttentionP\(dim=4, .*\): x must have shape \(\.\.\., T, 4\), got shape \(3, 6\)"
    ):
        att.apply(att.init(0, xp=xp, device=device), random_input(xp, device, (3, 6)))
    with pytest.raises(ValueError, match=r"params\['A'\] must have shape \(2, 2\), got shape \(4, 4\)"):
        att.apply({"A": random_input(xp, device, (4, 4))}, random_input(xp, device, (3, 4)))
    with pytest.raises(ValueError, match="softmax must be one of"):
        SymplecticAttentionQ(4, softmax="row")
    with pytest.raises(ValueError, match="seq_len must be positive, got 0"):
        LinearSymplecticAttentionP(4, 0)


def test_traces_under_jax_jit(backend, xp, device):
    """apply and the pullback are pure: under jax.jit they give the eager results to 1e-13."""
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    chain = Chain(LinearSymplecticAttentionQ(4, 3), SymplecticAttentionP(4, softmax="vector"))
    check_jit_matches_eager(chain, _chain_params(chain, xp, device), random_input(xp, device, (2, 3, 4)), xp)
