"""SymplecticStiefel: the symplectic Stiefel manifold against dense references, on every backend (float64).

Checked properties (tolerances are absolute on O(1) quantities unless stated; ‖Y‖₂ ≈ 1.5–2 for
random points):

Yᵀ𝕁Y = 𝕁 for random points (1e-12); rgrad is tangent and g_Y(rgrad(Y, G), V) = tr(GᵀV)
(1e-12 relative); g_Y(Δ, Δ) = ½‖Ω(Δ)‖², Ω(Δ)Y = Δ, Ω(Δ) Hamiltonian and Frobenius-orthogonal to the
vertical space; project is an idempotent onto T_Y; the section λ(Y) is symplectic, λ(Y)E = Y, and
orthogonal at orthosymplectic points; λ·W·E = Δ for W = global_rep(λ, Δ), W ∈ g^hor;
retraction = dense Cayley / scipy expm reference; first-order property by central differences;
section independence of the retracted point; retracted points stay on the manifold for steps from
1e-3 to 100 (1e-12·‖Y‖₂²); 100 optimizer-sized steps of the symplectic eigenvalue problem stay on
the manifold to 1e-9 (measured drift is printed) and respect Williamson's lower bound;
batched = looped; bad inputs raise naming the argument; jax.jit = eager.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import asarray, assert_close, max_abs, to_numpy
from geoarray.manifolds import (
    SymplecticSection,
    SymplecticStiefel,
    SymplecticStiefelHorizontal,
)
from geoarray.manifolds.base import Manifold

# (N2, n2): N ≥ 2n (core 4n < 2N), N < 2n < 2N, n2 = N2 (the symplectic group), the smallest case
SIZES = [(12, 4), (6, 4), (4, 4), (2, 2)]


def J(k: int) -> np.ndarray:
    """𝕁_{2k} = [[0, I_k], [−I_k, 0]]."""
    return np.block([[np.zeros((k, k)), np.eye(k)], [-np.eye(k), np.zeros((k, k))]])


def _sp_err(Y) -> float:
    """max |Yᵀ𝕁Y − 𝕁| on the host."""
    Y = to_numpy(Y)
    return float(np.max(np.abs(np.swapaxes(Y, -1, -2) @ J(Y.shape[-2] // 2) @ Y - J(Y.shape[-1] // 2))))


def _setup(M, xp, device, seed=0, batch=()):
    Y = M.random(seed, xp=xp, batch_shape=batch, device=device)
    G = geoarray.random.normal(seed + 100, (*batch, M.N2, M.n2), xp=xp, device=device)
    return Y, G, M.rgrad(Y, G)


def _orthosymplectic_point(M, xp, device, seed=5):
    """Q·E for a Haar unitary Q in real form: an orthonormal symplectic point."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(2, M.N, M.N)) + 1j * rng.normal(size=(2, M.N, M.N)))
    Q = np.block([[U.real, -U.imag], [U.imag, U.real]])
    E = np.eye(M.N2)[:, list(range(M.n)) + list(range(M.N, M.N + M.n))]
    return asarray(Q @ E, xp, device)


# ---------------------------------------------------------------------------------------------
# construction and identity
# ---------------------------------------------------------------------------------------------


def test_constructor_validates_sizes():
    with pytest.raises(ValueError, match=r"N2 must be even.*got 7"):
        SymplecticStiefel(7, 4)
    with pytest.raises(ValueError, match=r"n2 must be even.*got 3"):
        SymplecticStiefel(8, 3)
    with pytest.raises(ValueError, match=r"n2 ≤ N2.*N2=4, n2=6"):
        SymplecticStiefel(4, 6)
    with pytest.raises(ValueError, match="n2 must be positive"):
        SymplecticStiefel(4, 0)
    for bad in (8.0, "8", True, None):
        with pytest.raises(TypeError, match="N2 must be an int"):
            SymplecticStiefel(bad, 2)
    with pytest.raises(ValueError, match="section must be 'householder'"):
        SymplecticStiefel(8, 4, section="random")
    with pytest.raises(ValueError, match="retraction_method must be one of"):
        SymplecticStiefel(8, 4, retraction_method="qr")
    SymplecticStiefel(np.int64(8), np.int32(4))  # NumPy integers are sizes


def test_identity_dimension_and_shape():
    M = SymplecticStiefel(8, 4)
    assert isinstance(M, Manifold)
    assert M == SymplecticStiefel(8, 4) and hash(M) == hash(SymplecticStiefel(8, 4))
    assert M != SymplecticStiefel(8, 4, retraction_method="geodesic") and M != SymplecticStiefel(10, 4)
    assert len({M, SymplecticStiefel(8, 4), SymplecticStiefel(8, 2)}) == 2
    assert repr(M) == "SymplecticStiefel(8, 4)"
    assert repr(SymplecticStiefel(8, 4, retraction_method="geodesic")) == (
        "SymplecticStiefel(8, 4, retraction_method='geodesic')"
    )
    assert M.point_shape == (8, 4) and (M.N, M.n) == (4, 2)
    # dim = 4Nn − n(2n − 1): the ambient dimension minus the n(2n−1) independent entries of Yᵀ𝕁Y = 𝕁
    assert M.dim == 4 * 4 * 2 - 2 * 3
    assert SymplecticStiefel(6, 6).dim == 21  # dim Sp(6) = n(2n + 1)


# ---------------------------------------------------------------------------------------------
# points, metric, gradient
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N2,n2", SIZES)
def test_random_points_are_symplectic(xp, device, N2, n2):
    M = SymplecticStiefel(N2, n2)
    Y = M.random(0, xp=xp, batch_shape=(2,), device=device)
    assert tuple(Y.shape) == (2, N2, n2) and Y.dtype == xp.float64
    assert geoarray._backend.device(Y) == device
    assert _sp_err(Y) < 1e-12
    assert M.is_point(Y)
    assert 1.0 <= np.linalg.norm(to_numpy(Y)[0], 2) < 4.0  # symplectic ⇒ ‖Y‖₂ ≥ 1; moderate by design
    assert_close(M.random(0, xp=xp, batch_shape=(2,), device=device), Y, xp=xp, atol=0)  # seeded


def test_is_point_and_is_tangent_are_tolerance_based(xp, device):
    M = SymplecticStiefel(12, 4)
    Y, G, D = _setup(M, xp, device, batch=(2,))
    assert M.is_point(Y) and not M.is_point(Y + 1e-6) and M.is_point(Y + 1e-6, atol=1e-4)
    assert M.is_tangent(Y, D) and not M.is_tangent(Y, G)
    assert M.is_tangent(Y, D + 1e-13 * G) and not M.is_tangent(Y, D + 1e-6 * G)


@pytest.mark.parametrize("N2,n2", SIZES)
def test_rgrad_is_tangent_and_the_riesz_representer(xp, device, N2, n2):
    """g_Y(rgrad(Y, G), V) = tr(GᵀV) for tangent V: rgrad is the Riesz representer of the metric."""
    M = SymplecticStiefel(N2, n2)
    Y, G, D = _setup(M, xp, device, batch=(2,))
    assert M.is_tangent(Y, D)
    V = M.project(Y, geoarray.random.normal(7, (2, N2, n2), xp=xp, device=device))
    assert M.is_tangent(Y, V)
    lhs = to_numpy(M.metric(Y, D, V))
    rhs = np.sum(to_numpy(G) * to_numpy(V), axis=(-2, -1))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(M.metric(Y, D, V)), to_numpy(M.metric(Y, V, D)), rtol=1e-12)


def test_metric_is_the_quotient_of_the_right_invariant_frobenius_metric(xp, device):
    """g_Y(Δ, Δ) = ½‖Ω(Δ)‖² with Ω(Δ) ∈ sp(2N), Ω(Δ)Y = Δ, Ω(Δ) ⟂ {Ω′ ∈ sp : Ω′Y = 0}."""
    M = SymplecticStiefel(12, 4)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    Om = M.omega(Y, D)
    assert_close(Om @ Y, D, xp=xp, atol=1e-13)
    JO = J(6) @ to_numpy(Om)
    assert np.max(np.abs(JO - np.swapaxes(JO, -1, -2))) < 1e-13  # Hamiltonian
    half_norm2 = 0.5 * np.sum(to_numpy(Om) ** 2, axis=(-2, -1))
    np.testing.assert_allclose(to_numpy(M.metric(Y, D, D)), half_norm2, rtol=1e-12)
    # a vertical Hamiltonian 𝕁ᵀΣ with Σ = (I − P)K(I − P) symmetric, P the projector onto span Y
    Yn = to_numpy(Y)[0]
    P = Yn @ np.linalg.solve(Yn.T @ Yn, Yn.T)
    K = np.random.default_rng(0).normal(size=(12, 12))
    vert = J(6).T @ ((np.eye(12) - P) @ (K + K.T) @ (np.eye(12) - P))
    assert np.max(np.abs(vert @ Yn)) < 1e-12
    assert abs(np.sum(to_numpy(Om)[0] * vert)) < 1e-12 * np.linalg.norm(vert)


def test_project_is_an_idempotent_onto_the_tangent_space(xp, device):
    M = SymplecticStiefel(12, 4)
    Y, G, D = _setup(M, xp, device, batch=(2,))
    P = M.project(Y, G)
    assert M.is_tangent(Y, P)
    assert_close(M.project(Y, P), P, xp=xp, atol=1e-12)
    assert_close(M.project(Y, D), D, xp=xp, atol=1e-12)
    # the residual is g_Y-orthogonal to T_Y: g(P, V) = g(G, V) extends the metric to G through 𝒢_Y
    V = M.rgrad(Y, geoarray.random.normal(3, (2, 12, 4), xp=xp, device=device))
    np.testing.assert_allclose(to_numpy(M.metric(Y, P, V)), to_numpy(M.metric(Y, G, V)), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# section and global representation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N2,n2", SIZES)
def test_section_is_symplectic_and_reproduces_y(xp, device, N2, n2):
    M = SymplecticStiefel(N2, n2)
    Y = M.random(1, xp=xp, batch_shape=(2,), device=device)
    lam = M.global_section(Y)
    assert isinstance(lam, SymplecticSection)
    L = lam.to_dense()
    assert _sp_err(L) < 1e-12
    E = M.distinguished_point(Y)
    assert_close(L @ E, Y, xp=xp, atol=1e-13)
    X = geoarray.random.normal(2, (2, N2, 3), xp=xp, device=device)
    assert_close(lam.apply_inv(lam.apply(X)), X, xp=xp, atol=1e-12)
    # storage is O(N·n): nothing is 2N×2N unless n2 = N2
    assert all(min(leaf.shape[-2:]) <= 2 * n2 for leaf in lam)


@pytest.mark.parametrize("N2,n2", [(12, 4), (6, 4)])
def test_section_is_orthogonal_at_orthosymplectic_points(xp, device, N2, n2):
    """At Y with YᵀY = I the section is orthogonal, so W.inner equals the metric there."""
    M = SymplecticStiefel(N2, n2)
    Y = _orthosymplectic_point(M, xp, device)
    lam = M.global_section(Y)
    L = to_numpy(lam.to_dense())
    assert np.max(np.abs(np.swapaxes(L, -1, -2) @ L - np.eye(N2))) < 1e-13
    D = M.rgrad(Y, geoarray.random.normal(4, (2, N2, n2), xp=xp, device=device))
    W = M.global_rep(lam, D)
    np.testing.assert_allclose(to_numpy(W.inner(W)), to_numpy(M.metric(Y, D, D)), rtol=1e-12)
    E = M.distinguished_point(Y)
    for YE in (xp.stack([E, -E]),):  # 𝕁-invariant spans: C = Y_q + iY_p is rank-deficient
        lam = M.global_section(YE)
        assert_close(lam.to_dense() @ E, YE, xp=xp, atol=1e-15)
        assert _sp_err(lam.to_dense()) < 1e-15


@pytest.mark.parametrize("N2,n2", SIZES)
def test_global_rep_is_horizontal_and_reproduces_delta(xp, device, N2, n2):
    M = SymplecticStiefel(N2, n2)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    assert isinstance(W, SymplecticStiefelHorizontal)
    Wd = to_numpy(W.to_dense())
    N, n = M.N, M.n
    JW = J(N) @ Wd
    assert np.max(np.abs(JW - np.swapaxes(JW, -1, -2))) < 1e-13  # W ∈ sp(2N)
    F = list(range(n, N)) + list(range(N + n, 2 * N))
    assert np.max(np.abs(Wd[..., F, :][..., :, F]), initial=0.0) == 0.0  # W ∈ g^hor: zero F-F block
    for S in (W.A12, W.A21):
        assert_close(S, xp.matrix_transpose(S), xp=xp, atol=0)
    E = to_numpy(M.distinguished_point(Y))
    np.testing.assert_allclose(to_numpy(lam.to_dense()) @ Wd @ E, to_numpy(D), atol=1e-12 * max_abs(D))
    # the inner product: ½tr(W₁ᵀW₂) counted on the stored blocks
    np.testing.assert_allclose(to_numpy(W.inner(W)), 0.5 * np.sum(Wd**2, axis=(-2, -1)), rtol=1e-13)


def test_horizontal_arithmetic_keeps_the_structure_and_is_a_tree(xp, device):
    M = SymplecticStiefel(12, 4)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    W = M.global_rep(M.global_section(Y), D)
    v = W * W  # an Adam second moment
    step = W / (v.sqrt() + 1e-8)
    assert isinstance(step, SymplecticStiefelHorizontal)
    for S in (step.A12, step.A21, v.A12):
        assert_close(S, xp.matrix_transpose(S), xp=xp, atol=0)
    JW = J(6) @ to_numpy(step.to_dense())
    assert np.max(np.abs(JW - np.swapaxes(JW, -1, -2))) < 1e-14
    leaves = optree.tree_leaves(W)
    assert len(leaves) == 4
    doubled = optree.tree_map(lambda a: 2 * a, W)
    assert isinstance(doubled, SymplecticStiefelHorizontal)
    assert_close(doubled.B, 2 * W.B, xp=xp, atol=0)
    assert W.batch_shape == (2,) and W.dtype == xp.float64


# ---------------------------------------------------------------------------------------------
# retraction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N2,n2", SIZES)
def test_retraction_matches_dense_cayley_and_expm(xp, device, N2, n2):
    sla = pytest.importorskip("scipy.linalg", reason="scipy.linalg.expm is the dense reference")
    M = SymplecticStiefel(N2, n2)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    W = M.global_rep(M.global_section(Y), D)
    W = W * (0.7 / xp.reshape(W.norm(), (2, 1, 1)))
    Wd = to_numpy(W.to_dense())
    E = to_numpy(M.distinguished_point(Y))
    eye = np.eye(N2)
    cay = np.linalg.solve(eye - Wd / 2, (eye + Wd / 2) @ E)
    assert_close(M.retraction(W), cay, xp=xp, device=device, atol=1e-13)
    assert_close(M.retraction(W, method="geodesic"), sla.expm(Wd) @ E, xp=xp, device=device, atol=1e-13)


@pytest.mark.parametrize("method", ["cayley", "geodesic"])
def test_retraction_first_order_property(xp, device, method):
    """d/dt|₀ λ·g(tW)·E = Δ, by central differences (error O(h²) + O(ε/h))."""
    M = SymplecticStiefel(12, 4)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    h = 1e-5
    plus = M.apply_section(lam, M.retraction(h * W, method=method))
    minus = M.apply_section(lam, M.retraction(-h * W, method=method))
    assert_close((plus - minus) / (2 * h), D, xp=xp, atol=1e-9 * max_abs(D))
    assert_close(M.apply_section(lam, M.retraction(0 * W, method=method)), Y, xp=xp, atol=1e-13)


def test_retracted_point_does_not_depend_on_the_section(xp, device):
    """λh·g(h⁻¹W h)·E = λ·g(W)·E for h in the stabiliser Sp(2(N−n)) (dense check)."""
    sla = pytest.importorskip("scipy.linalg", reason="scipy.linalg.expm is the dense reference")
    M = SymplecticStiefel(12, 4)
    N, n, m = 6, 2, 4
    Y, _, D = _setup(M, xp, device, batch=(2,))
    lam = M.global_section(Y)
    L, Dn = to_numpy(lam.to_dense())[0], to_numpy(D)[0]
    E = to_numpy(M.distinguished_point(Y))
    Wd = to_numpy(M.global_rep(lam, D).to_dense())[0]
    rng = np.random.default_rng(0)
    S = rng.normal(size=(2 * m, 2 * m))
    h = sla.expm(J(m).T @ (S + S.T) / 4)  # a non-orthogonal element of Sp(2m)
    F = list(range(n, N)) + list(range(N + n, 2 * N))
    H = np.eye(2 * N)
    H[np.ix_(F, F)] = h
    L2 = L @ H
    assert np.max(np.abs(L2.T @ J(N) @ L2 - J(N))) < 1e-12 and np.allclose(L2 @ E, to_numpy(Y)[0])
    W2 = np.linalg.solve(H, Wd @ H)  # the global representation for the section λh
    np.testing.assert_allclose(W2 @ E, np.linalg.solve(L2, Dn), atol=1e-12)
    np.testing.assert_allclose(L2 @ sla.expm(W2) @ E, L @ sla.expm(Wd) @ E, atol=1e-12)


@pytest.mark.parametrize("method", ["cayley", "geodesic"])
@pytest.mark.parametrize("t", [1e-3, 1.0, 10.0, 100.0])
def test_retracted_points_stay_on_the_manifold(xp, device, host_reads_policy, method, t):
    if t > 10:  # beyond the doubling budget of a retraction that reads nothing (a GPU's default)
        host_reads_policy("always")
    M = SymplecticStiefel(12, 4)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    W = W / xp.reshape(W.norm(), (2, 1, 1))
    Y_new = M.apply_section(lam, M.retraction(t * W, method=method))
    scale = max(1.0, float(np.max(np.linalg.norm(to_numpy(Y_new), 2, axis=(-2, -1)))) ** 2)
    assert _sp_err(Y_new) < 1e-12 * scale
    if t <= 1.0:
        assert _sp_err(Y_new) < 1e-13


@pytest.mark.parametrize("resymplectify", [True, False])
def test_drift_over_100_optimizer_steps(xp, device, resymplectify):
    """Gradient descent on the symplectic eigenvalue problem min tr(YᵀSY), S ≻ 0, with η‖W‖ = 0.05.

    Williamson: tr(YᵀSY) ≥ 2(d₁ + … + d_n) on SpSt, d_j the smallest symplectic eigenvalues of S
    (the moduli of the eigenvalues of 𝕁S); the iterates must stay on the manifold to 1e-9.
    """
    M = SymplecticStiefel(12, 4, resymplectify=resymplectify)
    rng = np.random.default_rng(0)
    A = rng.normal(size=(12, 12))
    S_host = A @ A.T / 12 + 0.1 * np.eye(12)
    S = asarray(S_host, xp, device)
    d = np.sort(np.abs(np.linalg.eigvals(J(6) @ S_host).imag))[::2]
    bound = 2 * np.sum(d[:2])
    Y = M.random(3, xp=xp, batch_shape=(2,), device=device)  # two independent runs

    def f(Y):
        return to_numpy(xp.sum(Y * (S @ Y), axis=(-2, -1)))

    values = [f(Y)]
    drift = 0.0
    for _ in range(100):
        lam = M.global_section(Y)
        W = M.global_rep(lam, M.rgrad(Y, 2 * (S @ Y)))
        Y = M.apply_section(lam, M.retraction(W * (-0.05 / xp.reshape(W.norm(), (2, 1, 1)))))
        drift = max(drift, _sp_err(Y))
        values.append(f(Y))
    values = np.stack(values)
    print(f"\nmax drift over 100 steps (resymplectify={resymplectify}): {drift:.2e}; f: {values[0]} -> {values[-1]}")
    assert drift < 1e-9
    assert np.min(values) >= bound - 1e-10  # Williamson's lower bound holds on the manifold
    assert np.all(values[-1] - bound < 0.1 * (values[0] - bound))


# ---------------------------------------------------------------------------------------------
# batching, errors, jit, float32
# ---------------------------------------------------------------------------------------------


def test_batched_equals_looped(xp, device):
    M = SymplecticStiefel(12, 4)
    Y, G, D = _setup(M, xp, device, batch=(2, 3))
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    Y_new = M.apply_section(lam, M.retraction(0.3 * W))
    g = M.metric(Y, D, D)
    for i in range(2):
        for j in range(3):
            Yij, Gij = Y[i, j, ...], G[i, j, ...]
            Dij = M.rgrad(Yij, Gij)
            assert_close(Dij, D[i, j, ...], xp=xp, atol=1e-14)
            lam_ij = M.global_section(Yij)
            W_ij = M.global_rep(lam_ij, Dij)
            for a, b in zip(W_ij, W, strict=True):
                assert_close(a, b[i, j, ...], xp=xp, atol=1e-13)
            assert_close(M.apply_section(lam_ij, M.retraction(0.3 * W_ij)), Y_new[i, j, ...], xp=xp, atol=1e-13)
            assert abs(float(M.metric(Yij, Dij, Dij)) - float(g[i, j])) < 1e-12 * abs(float(g[i, j]))


def test_bad_inputs_raise_naming_the_argument(xp, device):
    M = SymplecticStiefel(12, 4)
    Y, G, D = _setup(M, xp, device, batch=(2,))
    with pytest.raises(ValueError, match=r"Y must have trailing shape \(12, 4\).*\(2, 12, 3\)"):
        M.rgrad(Y[..., :3], G[..., :3])
    with pytest.raises(ValueError, match=r"dL must have trailing shape \(12, 4\).*\(2, 6, 4\)"):
        M.rgrad(Y, G[..., :6, :])
    with pytest.raises(ValueError, match=r"D2 must have trailing shape"):
        M.metric(Y, D, D[..., :2])
    with pytest.raises(TypeError, match="Y must have a real floating dtype"):
        M.global_section(xp.astype(Y, xp.int64))
    with pytest.raises(TypeError, match="dL must have a real floating dtype"):
        M.rgrad(Y, xp.astype(G, xp.int64))
    with pytest.raises(TypeError, match="Y must have a real floating dtype"):
        M.is_point(xp.astype(Y, xp.int64))
    lam = M.global_section(Y)
    with pytest.raises(TypeError, match="lam must be a SymplecticSection"):
        M.global_rep(Y, D)
    with pytest.raises(ValueError, match=r"D must have trailing shape"):
        M.global_rep(lam, D[..., :2])
    W = M.global_rep(lam, D)
    with pytest.raises(TypeError, match="W must be a SymplecticStiefelHorizontal"):
        M.retraction(D)
    with pytest.raises(ValueError, match=r"W\.B must have trailing shape \(8, 4\)"):
        M.retraction(W._replace(B=W.B[..., :2, :]))
    with pytest.raises(TypeError, match=r"W\.A12 must have a real floating dtype"):
        M.retraction(W._replace(A12=xp.astype(W.A12, xp.int64)))
    with pytest.raises(ValueError, match="method must be one of"):
        M.retraction(W, method="qr")
    with pytest.raises(ValueError, match=r"X must have 12 rows.*\(2, 6, 4\)"):
        M.apply_section(lam, Y[..., :6, :])
    with pytest.raises(TypeError, match="xp must be an array namespace"):
        M.random(0, xp="numpy")
    with pytest.raises(TypeError, match="dtype must be"):
        M.random(0, xp=xp, dtype=xp.int64, device=device)
    strict = SymplecticStiefel(12, 4, validate=True)
    strict.global_section(Y)  # on the manifold: accepted
    with pytest.raises(ValueError, match="Y is not a point of SymplecticStiefel"):
        strict.global_section(Y + 1e-3)


def test_retraction_and_section_trace_under_jax_jit(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    for method in ("cayley", "geodesic"):
        M = SymplecticStiefel(12, 4, retraction_method=method)
        Y, _, D = _setup(M, xp, device, batch=(2,))

        def step(Y, D, M=M):
            lam = M.global_section(Y)
            return M.apply_section(lam, M.retraction(0.5 * M.global_rep(lam, D)))

        assert_close(jax.jit(step)(Y, D), step(Y, D), xp=xp, atol=1e-13)


def test_float32_keeps_dtype(xp, device):
    M = SymplecticStiefel(12, 4)
    Y = M.random(0, xp=xp, batch_shape=(2,), dtype="float32", device=device)
    assert Y.dtype == xp.float32
    D = M.rgrad(Y, geoarray.random.normal(1, (2, 12, 4), xp=xp, dtype="float32", device=device))
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    assert W.dtype == xp.float32
    Y_new = M.apply_section(lam, M.retraction(W * (0.1 / xp.reshape(W.norm(), (2, 1, 1)))))
    assert Y_new.dtype == xp.float32
    assert _sp_err(Y_new) < 1e-5 and M.is_point(Y_new)
