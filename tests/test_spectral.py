"""msign / polar / Newton–Schulz (geoarray.linalg) and the spectral steepest directions on Stiefel and Grassmann.

Every backend, float64. Properties and tolerances:

* ``polar``: orthonormal columns (1e-12), equal to U Vᵀ of an SVD reference to 1e-10, also for an
  ill-conditioned input (κ = 1e6; Newton's error grows like ε·κ); rank-deficient input gives the
  partial isometry U_r V_rᵀ (1e-10); wide input through the transpose; ``msign`` equals U Vᵀ to
  1e-10 for κ ≤ 1e2 (its error grows like ε·κ²) and maps zero singular values to zero;
* ``newton_schulz`` equals a NumPy transcription of torch.optim.Muon's iteration (1e-12) and puts
  every singular value in [0.5, 1.5] (the documented behaviour of its coefficients);
* Stiefel spectral direction: tangent (1e-10), ‖A‖₂ ≤ 1 + 1e-8, duality-gap certificate
  0 ≤ ‖[K + P; R]‖_* − ⟨G, A⟩ ≤ 1e-8 relative, beats 200 random feasible directions; batched =
  per item (1e-10); a warm start at the solution stays there (1e-10);
* Grassmann closed form: horizontal, ⟨G, A⟩ = ‖(I − YYᵀ)G‖_* (1e-10), and equal (1e-8) to the general
  Stiefel solver on gradients whose YᵀG is symmetric, where the two problems coincide.
"""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import asarray, assert_close, to_numpy
from geoarray import linalg
from geoarray.manifolds import Grassmann, Stiefel
from geoarray.manifolds.spectral import (
    grassmann_spectral_direction,
    stiefel_spectral_direction,
    stiefel_spectral_dual,
)


def _frame(rng, *shape):
    return np.linalg.qr(rng.standard_normal(shape))[0]


def _with_singular_values(rng, m, k, s):
    U = _frame(rng, m, k)
    V = _frame(rng, k, k)
    return (U * s) @ V.T, U @ V.T


# ------------------------------------------------------------------------------------------
# msign / polar / newton_schulz
# ------------------------------------------------------------------------------------------


def test_polar_orthonormal_and_matches_svd(xp, device):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 9, 4))
    U, _, Vt = np.linalg.svd(X, full_matrices=False)
    P = linalg.polar(asarray(X, xp, device))
    Pn = to_numpy(P)
    np.testing.assert_allclose(np.swapaxes(Pn, -1, -2) @ Pn, np.broadcast_to(np.eye(4), (3, 4, 4)), atol=1e-12)
    assert_close(P, U @ Vt, xp=xp, atol=1e-10)
    assert_close(linalg.msign(asarray(X, xp, device)), U @ Vt, xp=xp, atol=1e-10)
    # the polar decomposition: X = P·H with H symmetric positive definite
    H = np.swapaxes(Pn, -1, -2) @ X
    np.testing.assert_allclose(H, np.swapaxes(H, -1, -2), atol=1e-12)
    assert np.linalg.eigvalsh(H).min() > 0


@pytest.mark.parametrize("kappa", [1e2, 1e6])
def test_polar_ill_conditioned(xp, device, kappa):
    rng = np.random.default_rng(1)
    X, ref = _with_singular_values(rng, 12, 5, np.logspace(0, -np.log10(kappa), 5))
    assert_close(linalg.polar(asarray(X, xp, device)), ref, xp=xp, atol=1e-10)
    if kappa <= 1e2:
        assert_close(linalg.msign(asarray(X, xp, device)), ref, xp=xp, atol=1e-10)


def test_polar_rank_deficient_is_partial_isometry(xp, device):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((10, 2)) @ rng.standard_normal((2, 4))
    U, _, Vt = np.linalg.svd(X, full_matrices=False)
    ref = U[:, :2] @ Vt[:2]
    for out in (linalg.polar(asarray(X, xp, device)), linalg.msign(asarray(X, xp, device))):
        assert_close(out, ref, xp=xp, atol=1e-10)


def test_polar_wide_is_transpose(xp, device):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2, 4, 9))
    U, _, Vt = np.linalg.svd(X, full_matrices=False)
    assert_close(linalg.polar(asarray(X, xp, device)), U @ Vt, xp=xp, atol=1e-10)
    assert_close(linalg.msign(asarray(X, xp, device)), U @ Vt, xp=xp, atol=1e-10)


def _ns_reference(X, steps=5, abc=(3.4445, -4.7750, 2.0315), eps=1e-7):
    # a line-by-line transcription of torch.optim._muon._zeropower_via_newtonschulz (float64)
    a, b, c = abc
    tall = X.shape[0] > X.shape[1]
    Z = X.T if tall else X
    Z = Z / max(np.linalg.norm(Z), eps)
    for _ in range(steps):
        S = Z @ Z.T
        Z = a * Z + (b * S + c * S @ S) @ Z
    return Z.T if tall else Z


@pytest.mark.parametrize("shape", [(9, 4), (3, 7), (5, 5)])
def test_newton_schulz_matches_torch_transcription(xp, device, shape):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((2, *shape))
    out = linalg.newton_schulz(asarray(X, xp, device))
    assert_close(out, np.stack([_ns_reference(x) for x in X]), xp=xp, atol=1e-12)
    s = np.linalg.svd(to_numpy(out), compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.5
    zero = linalg.newton_schulz(asarray(np.zeros(shape), xp, device))  # eps guards the division
    assert_close(zero, np.zeros(shape), xp=xp, atol=0.0)


# ------------------------------------------------------------------------------------------
# Stiefel spectral direction
# ------------------------------------------------------------------------------------------


def _random_tangents(rng, Y, count):
    N, n = Y.shape
    Z = rng.standard_normal((count, N, n))
    YtZ = Y.T @ Z
    Z = Z - Y @ (YtZ + np.swapaxes(YtZ, -1, -2)) / 2
    return Z / np.linalg.norm(Z, ord=2, axis=(-2, -1))[:, None, None]


@pytest.mark.parametrize("N,n", [(16, 4), (10, 3), (49, 7)])
def test_stiefel_direction_is_feasible_and_optimal(xp, device, N, n):
    rng = np.random.default_rng(5 + N)
    Y, G = _frame(rng, N, n), rng.standard_normal((N, n))
    A, P = stiefel_spectral_direction(asarray(Y, xp, device), asarray(G, xp, device), n_iter=200)
    An, Pn = to_numpy(A), to_numpy(P)
    assert np.abs(Y.T @ An + An.T @ Y).max() < 1e-10
    assert np.linalg.norm(An, 2) <= 1 + 1e-8
    np.testing.assert_allclose(Pn, Pn.T, atol=1e-12)
    dual = float(to_numpy(stiefel_spectral_dual(asarray(Y, xp, device), asarray(G, xp, device), P)))
    primal = float(np.sum(G * An))
    assert -1e-12 <= (dual - primal) / dual <= 1e-8
    # weak duality: no feasible direction can exceed the dual value, and none of these beats A
    others = np.sum(G * _random_tangents(rng, Y, 200), axis=(-2, -1))
    assert others.max() < primal <= dual * (1 + 1e-12)


def test_stiefel_direction_batched_equals_per_item_and_warm_start(xp, device):
    rng = np.random.default_rng(6)
    Y = np.stack([_frame(rng, 8, 3) for _ in range(3)])
    G = rng.standard_normal((3, 8, 3))
    A, P = stiefel_spectral_direction(asarray(Y, xp, device), asarray(G, xp, device), n_iter=150)
    for i in range(3):
        Ai, Pi = stiefel_spectral_direction(asarray(Y[i], xp, device), asarray(G[i], xp, device), n_iter=150)
        assert_close(A[i, ...], Ai, xp=xp, atol=1e-10)
        assert_close(P[i, ...], Pi, xp=xp, atol=1e-10)
    # converged: a warm start needs no iteration, and the free gradient step leaves P where it is
    A0, P1 = stiefel_spectral_direction(asarray(Y, xp, device), asarray(G, xp, device), P0=P, n_iter=0)
    assert_close(A0, A, xp=xp, atol=1e-10)
    assert_close(P1, P, xp=xp, atol=1e-12)
    # the manifold method delegates to the same solver
    Am, _ = Stiefel(8, 3).spectral_direction(asarray(Y, xp, device), asarray(G, xp, device), n_iter=150)
    assert_close(Am, A, xp=xp, atol=1e-14)


def test_the_returned_dual_variable_is_the_next_iterate(xp, device):
    """A* is evaluated at the n-th dual iterate P_n, and the P returned is P_{n+1}, the gradient step that the
    same msign evaluation gives: so a call with n_iter = k warm-starting a call with n_iter = 0 is one call with
    n_iter = k + 1 (A and P), and P_{n+1} lowers the dual value below P_n's (it is a descent step)."""
    from geoarray.manifolds.spectral import stiefel_spectral_dual

    rng = np.random.default_rng(8)
    Y = asarray(np.stack([_frame(rng, 12, 4) for _ in range(2)]), xp, device)
    G = asarray(rng.standard_normal((2, 12, 4)), xp, device)
    for k in (0, 1, 3):
        A_k, P_k1 = stiefel_spectral_direction(Y, G, n_iter=k)
        A_chain, P_chain = stiefel_spectral_direction(Y, G, P0=P_k1, n_iter=0)
        A_one, P_one = stiefel_spectral_direction(Y, G, n_iter=k + 1)
        assert_close(A_chain, A_one, xp=xp, atol=1e-12)
        assert_close(P_chain, P_one, xp=xp, atol=1e-12)
        if k > 0:
            _, P_k = stiefel_spectral_direction(Y, G, n_iter=k - 1)  # P_k, at which A_k was evaluated
            dual_k, dual_k1 = (to_numpy(stiefel_spectral_dual(Y, G, Q)) for Q in (P_k, P_k1))
            assert np.all(dual_k1 < dual_k)
            assert np.all(to_numpy(xp.sum(G * A_k, axis=(-2, -1))) <= dual_k1 * (1 + 1e-12))


def test_stiefel_direction_rejects_bad_input(xp, device):
    Y = asarray(_frame(np.random.default_rng(7), 6, 2), xp, device)
    with pytest.raises(ValueError, match="G must end in"):
        stiefel_spectral_direction(Y, asarray(np.ones((6, 3)), xp, device))
    with pytest.raises(ValueError, match="P0 must end in"):
        stiefel_spectral_direction(Y, Y, P0=asarray(np.zeros((3, 3)), xp, device))
    with pytest.raises(ValueError, match="n_iter"):
        stiefel_spectral_direction(Y, Y, n_iter=-1)


# ------------------------------------------------------------------------------------------
# Grassmann
# ------------------------------------------------------------------------------------------


def test_grassmann_closed_form(xp, device):
    rng = np.random.default_rng(8)
    Y, G = _frame(rng, 11, 3), rng.standard_normal((11, 3))
    A = to_numpy(grassmann_spectral_direction(asarray(Y, xp, device), asarray(G, xp, device)))
    assert np.abs(Y.T @ A).max() < 1e-12
    assert np.linalg.norm(A, 2) <= 1 + 1e-12
    Gh = G - Y @ (Y.T @ G)
    nuc = np.linalg.svd(Gh, compute_uv=False).sum()
    np.testing.assert_allclose(np.sum(G * A), nuc, rtol=1e-10)
    Am = Grassmann(11, 3).spectral_direction(asarray(Y, xp, device), asarray(G, xp, device))
    assert_close(Am, A, xp=xp, atol=1e-14)


def test_grassmann_equals_general_solver_when_constraints_coincide(xp, device):
    # With YᵀG symmetric, K = 0 and the Stiefel dual value at P = 0 is ‖[0; R]‖_* = ‖R‖_*, the Grassmann
    # optimum; the Grassmann maximiser is Stiefel-feasible and attains it, so the two solutions coincide.
    rng = np.random.default_rng(9)
    Y, G = _frame(rng, 12, 3), rng.standard_normal((12, 3))
    YtG = Y.T @ G
    G = G - Y @ (YtG - YtG.T) / 2
    As, _ = stiefel_spectral_direction(asarray(Y, xp, device), asarray(G, xp, device), n_iter=200)
    Ag = grassmann_spectral_direction(asarray(Y, xp, device), asarray(G, xp, device))
    assert_close(As, Ag, xp=xp, atol=1e-8)


def test_spectral_step_compiles_once_for_a_learning_rate_schedule(backend, xp, device):
    """``lr`` is an array argument of the jitted step, not a static one: a schedule (a new lr every step)
    reuses one compilation per degree of the (XᵀX)^{-1/2} series (400 recompilations made a Brockett test
    take minutes and crash XLA once). The degree, a static argument, takes three values and the eigh: a
    schedule from 0.2 down to 1e-3 compiles at most four times, one within a degree's range once."""
    if backend.kind != "jax":
        pytest.skip("jax.jit compilation caches exist on the jax backend only")
    from geoarray import _backend
    from geoarray.manifolds import spectral

    rng = np.random.default_rng(0)
    Y0 = asarray(np.linalg.qr(rng.standard_normal((8, 2)))[0], xp, device)
    G = asarray(rng.standard_normal((8, 2)), xp, device)
    jitted = _backend._jax_jit(spectral._stiefel_step, ("xp", "n_iter", "step", "direction", "degree"))
    eps = float(np.finfo(np.float64).eps)
    for schedule, most in (([0.02, 0.015, 0.01, 0.006], 1), (list(np.geomspace(0.2, 1e-3, 12)), 4)):
        assert len({spectral._series_degree(float(lr), eps) for lr in schedule}) == most
        before = jitted._cache_size()  # other tests may have compiled it for their shapes already
        Y, P = Y0, None
        for lr in schedule:
            Y, P = spectral.stiefel_spectral_step(Y, G, lr=float(lr), P0=P, n_iter=2)
        assert jitted._cache_size() - before <= most


@pytest.mark.parametrize("r", [1e-4, 3e-3, 0.05])
def test_inverse_square_root_series_error_is_within_its_bound(xp, device, r):
    """The truncated binomial series for (I + E)^{-1/2} that the compressed polar step uses differs from the
    eigendecomposition's by at most r^{k+1}/(1 − r) for ‖E‖₂ = r (plus rounding), at the degrees 2, 4, 8,
    batched; and the degree chosen for an lr meets ε/4 at r = lr² + √ε."""
    from geoarray.manifolds.spectral import _inv_sqrt_near_identity, _inv_sqrt_psd, _series_degree

    rng = np.random.default_rng(13)
    B = rng.standard_normal((3, 6, 6))
    E = B + np.swapaxes(B, -1, -2)
    E *= r / np.linalg.norm(E, 2, axis=(-2, -1))[:, None, None]
    exact, _ = _inv_sqrt_psd(asarray(np.eye(6) + E, xp, device), xp)
    for k in (2, 4, 8):
        series = _inv_sqrt_near_identity(asarray(E, xp, device), k, xp)
        err = np.max(np.linalg.norm(to_numpy(series) - to_numpy(exact), 2, axis=(-2, -1)))
        assert err <= r ** (k + 1) / (1 - r) + 1e-14
        assert err > 0.1 * r ** (k + 1) or r ** (k + 1) < 1e-13  # the bound is not loose by orders
    eps = float(np.finfo(np.float64).eps)
    for lr in (1e-3, 5e-3, 0.05, 0.1):
        k = _series_degree(lr, eps)
        rr = lr * lr + eps**0.5
        assert k is None or rr ** (k + 1) / (1 - rr) <= eps / 4


def test_inv_sqrt_of_a_zero_gram_is_zero_without_warnings(xp, device):
    """A zero Gram matrix (G = 0, P = 0: M = 0) gives H = 0 exactly and evaluates no 1/0 (warnings are errors
    in this suite), nor does one whose eigenvalues all round below 0."""
    from geoarray.manifolds.spectral import _inv_sqrt_psd

    for gram in (np.zeros((2, 4, 4)), -1e-300 * np.eye(4)[None]):
        H, _ = _inv_sqrt_psd(asarray(gram, xp, device), xp)
        assert np.all(to_numpy(H) == 0.0)
