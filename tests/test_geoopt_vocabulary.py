"""geoopt's manifold vocabulary on geoarray's manifolds, on every backend.

``projx``, ``proju``, ``egrad2rgrad``, ``retr``, ``inner``, ``check_point_on_manifold`` /
``_check_point_on_manifold`` and geoopt's call shape of ``random`` are thin aliases of the contract
(:mod:`geoarray.manifolds.base`): each is checked for the property its geoopt docstring promises, with
the tolerance stated where it is used (float64 unless the backend lacks it):

* ``projx(x)`` lands on the manifold (max|xᵀx − I| ≤ 1e-12) and is the nearest point: no other point of a
  random sample is closer, and a point is its own projection to 1e-12;
* ``proju(x, u)`` is tangent (``is_tangent`` at 1e-12), idempotent to 1e-12 and self-adjoint in the
  Frobenius product (an orthogonal projection) to 1e-12;
* ``egrad2rgrad`` *is* ``rgrad``: bit-identical outputs (the same computation);
* ``retr(x, u)`` is on the manifold (1e-12), is first order (‖retr(x, tu) − x − tu‖ ≤ 10·t²‖u‖² for
  t = 1e-4), and equals geoopt's canonical Cayley formula (I − ½A)⁻¹(I + ½A)x, A = uxᵀ − xuᵀ, written
  densely here, for horizontal u (xᵀu = 0) to 1e-12;
* ``inner`` equals ``metric`` exactly and keeps the point axes as size-1 axes under ``keepdim``;
* ``dist`` on Grassmann is the norm of the principal angles: for subspaces built with known angles θ
  (from 1e-9 to π/2, rotated by a random orthogonal map and random bases) it equals ‖θ‖₂ to 1e-12 relative
  (float64; an angle of 1e-9 to 1e-14 absolute), is 0 to 1e-12 between two bases of one subspace,
  symmetric to 1e-12; on Euclidean the
  Frobenius norm of x − y to 1e-12; on Stiefel it raises naming the replacements;
* the shapeless ``Stiefel()`` (geoopt's) and ``transp`` raise with the geoarray call to write.
"""

from __future__ import annotations

import pytest

import geoarray
from _helpers import asarray, max_abs, to_numpy
from geoarray import linalg
from geoarray.manifolds import Euclidean, Grassmann, Stiefel, SymplecticStiefel

FRAMES = [Stiefel(7, 3), Grassmann(7, 3), Stiefel(4, 4)]


def _tol(a, xp):
    return 1e-12 if a.dtype == xp.float64 else 2e-5


def _frame_error(Y, xp):
    return max_abs(xp.matrix_transpose(Y) @ Y - linalg.eye(Y.shape[-1], Y))


@pytest.mark.parametrize("M", FRAMES, ids=repr)
def test_projx_is_the_nearest_point_and_fixes_points(xp, device, M):
    X = geoarray.random.normal(0, (2, M.N, M.n), xp=xp, device=device)
    P = M.projx(X)
    tol = _tol(P, xp)
    assert _frame_error(P, xp) <= tol
    # nearest: closer to X than 20 random points of the manifold, per batch element
    dist = to_numpy(xp.sum((X - P) ** 2, axis=(-2, -1)))
    others = M.random(1, xp=xp, batch_shape=(20, 2), device=device)
    assert (to_numpy(xp.sum((X - others) ** 2, axis=(-2, -1))) >= dist - tol).all()
    Y = M.random(2, xp=xp, device=device)
    assert max_abs(M.projx(Y) - Y) <= 10 * tol  # a point is (to rounding) its own projection


@pytest.mark.parametrize("M", [*FRAMES, Euclidean()], ids=repr)
def test_proju_is_an_orthogonal_projection_onto_the_tangent_space(xp, device, M):
    shape = (M.N, M.n) if M.point_shape else (5, 3)
    x = M.random(0, xp=xp, batch_shape=() if M.point_shape else shape, device=device)
    u = geoarray.random.normal(1, shape, xp=xp, device=device)
    w = geoarray.random.normal(2, shape, xp=xp, device=device)
    pu = M.proju(x, u)
    tol = _tol(pu, xp)
    assert M.is_tangent(x, pu, atol=tol)
    assert max_abs(M.proju(x, pu) - pu) <= tol  # idempotent
    # self-adjoint in the Frobenius product: <P u, w> = <u, P w>
    assert abs(float(xp.sum(pu * w)) - float(xp.sum(u * M.proju(x, w)))) <= 10 * tol


@pytest.mark.parametrize("M", [*FRAMES, Euclidean(), SymplecticStiefel(6, 4)], ids=repr)
def test_egrad2rgrad_is_rgrad_and_inner_is_metric(xp, device, M):
    shape = M.point_shape or (5, 3)
    x = M.random(0, xp=xp, batch_shape=() if M.point_shape else shape, device=device)
    u = geoarray.random.normal(1, shape, xp=xp, device=device)
    v = geoarray.random.normal(2, shape, xp=xp, device=device)
    assert bool(xp.all(M.egrad2rgrad(x, u) == M.rgrad(x, u)))  # the same computation: bit-identical
    gu, gv = M.rgrad(x, u), M.rgrad(x, v)
    assert bool(xp.all(M.inner(x, gu, gv) == M.metric(x, gu, gv)))
    assert bool(xp.all(M.inner(x, gu) == M.metric(x, gu, gu)))
    k = len(shape) if M.point_shape is None else 2
    kept = M.inner(x, gu, gv, keepdim=True)
    assert tuple(kept.shape) == (*M.metric(x, gu, gv).shape, *(1,) * k)


@pytest.mark.parametrize("M", [Stiefel(7, 3), Grassmann(7, 3), Stiefel(7, 3, retraction_method="cayley")], ids=repr)
def test_retr_is_a_first_order_retraction_onto_the_manifold(xp, device, M):
    x = M.random(0, xp=xp, device=device)
    u = M.proju(x, geoarray.random.normal(1, (M.N, M.n), xp=xp, device=device))
    y = M.retr(x, u)
    tol = _tol(y, xp)
    assert _frame_error(y, xp) <= tol
    t = 1e-4
    step = M.retr(x, t * u) - x - t * u
    assert max_abs(step) <= 10 * t**2 * float(xp.sum(u * u)) + 10 * tol


def test_retr_equals_geoopts_canonical_cayley_for_horizontal_u(xp, device):
    """geoopt's CanonicalStiefel.retr(x, u) = (I − ½A)⁻¹(I + ½A)x with A = uxᵀ − xuᵀ: for xᵀu = 0,
    A = Ω(u), so it is geoarray's Cayley retraction of u."""
    M = Stiefel(6, 2, retraction_method="cayley")
    x = M.random(0, xp=xp, device=device)
    g = geoarray.random.normal(1, (6, 2), xp=xp, device=device)
    u = 0.3 * (g - x @ (xp.matrix_transpose(x) @ g))  # horizontal: xᵀu = 0
    A = u @ xp.matrix_transpose(x) - x @ xp.matrix_transpose(u)
    eye = linalg.eye(6, x)
    dense = xp.linalg.solve(eye - A / 2, (eye + A / 2) @ x)
    assert max_abs(M.retr(x, u) - dense) <= _tol(x, xp)


@pytest.mark.parametrize("M", [Stiefel(5, 2), SymplecticStiefel(6, 4), Euclidean()], ids=repr)
def test_check_point_on_manifold_with_geoopts_signature(xp, device, M):
    shape = M.point_shape or (3, 2)
    x = M.random(0, xp=xp, batch_shape=() if M.point_shape else shape, device=device)
    assert M.check_point_on_manifold(x) is True
    assert M.check_point_on_manifold(x, explain=True) == (True, None)
    if M.is_vector_space:
        return
    off = x * 1.01  # |xᵀx − I| ≈ 0.02 on the diagonal: above atol=1e-5, below atol=0.1
    ok, reason = M.check_point_on_manifold(off, explain=True, atol=1e-5, rtol=1e-5)
    assert not ok and "atol=1e-05" in reason and "measured" in reason
    assert M._check_point_on_manifold(off, atol=0.1) == (True, None)
    ok, reason = M.check_point_on_manifold(x[..., :-1], explain=True)  # geoopt: a bad shape is (False, reason)
    assert not ok and "does not end in" in reason


@pytest.mark.parametrize("M", [Stiefel(5, 2), Grassmann(5, 2), Euclidean()], ids=repr)
def test_random_takes_geoopts_call_shape(xp, device, M):
    shape = M.point_shape or (4,)
    batched = M.random(3, *shape, xp=xp, seed=7, device=device)  # geoopt: random(*size)
    assert tuple(batched.shape) == (3, *shape)
    # the same law and draw as geoarray's form with batch_shape
    same = M.random(7, xp=xp, batch_shape=(3,) if M.point_shape else (3, *shape), device=device)
    assert bool(xp.all(batched == same))
    assert bool(xp.all(M.random((3, *shape), xp=xp, seed=7, device=device) == batched))  # one tuple
    if M.point_shape:
        assert _frame_error(batched, xp) <= _tol(batched, xp)
        with pytest.raises(ValueError, match=r"does not end in the point shape \(5, 2\).*M.random\(seed, xp"):
            M.random(2, 5, xp=xp, seed=0)
    with pytest.raises(TypeError, match=r"geoopt's form.*batch_shape"):
        M.random(5, 2, xp=xp, seed=0, batch_shape=(3,))


def test_geoopt_random_without_xp_draws_torch_from_torchs_generator(torch):
    M = Stiefel(5, 2)
    torch.manual_seed(0)
    a = M.random(5, 2)  # geoopt's literal call: torch, torch's default generator
    torch.manual_seed(0)
    b = M.random(5, 2)
    assert isinstance(a, torch.Tensor) and tuple(a.shape) == (5, 2) and torch.equal(a, b)
    assert M.check_point_on_manifold(a, atol=1e-5)


def test_geoopt_random_without_xp_and_without_torch_names_the_fix(monkeypatch):
    """Where torch is not installed (``_backend.torch_module`` finds none), geoopt's ``M.random(*size)``
    without ``xp`` is a TypeError that says to pass the namespace; nothing is drawn."""
    monkeypatch.setattr(geoarray._backend, "torch_module", lambda: None)
    with pytest.raises(TypeError, match=r"torch is not installed; pass the namespace, e\.g\. M\.random\(\*size, xp="):
        Stiefel(5, 2).random(5, 2)


def test_shapeless_manifolds_and_transp_say_what_to_write():
    with pytest.raises(TypeError, match=r"Stiefel\(\) needs its shape.*Stiefel\(N, n\)"):
        Stiefel()
    with pytest.raises(TypeError, match=r"Stiefel\(\) needs its shape.*checks every point"):
        geoarray.Stiefel()
    with pytest.raises(TypeError, match=r"Grassmann\(\) needs its shape.*Grassmann\(N, n\)"):
        Grassmann(5)
    with pytest.raises(TypeError, match=r"SymplecticStiefel\(\) needs its shape"):
        SymplecticStiefel()
    M = Stiefel(4, 2)
    with pytest.raises(NotImplementedError, match=r"no vector transport.*M.proju\(y, v\)"):
        M.transp(None, None, None)


def test_projx_without_a_closed_form_names_the_fix(xp, device):
    M = SymplecticStiefel(4, 2)
    x = M.random(0, xp=xp, device=device)
    with pytest.raises(NotImplementedError, match=r"no closed-form projection.*M.random\(seed"):
        M.projx(x)


def _subspaces_at_angles(theta, N, seed, xp, device):
    """Bases x, y of two n-dimensional subspaces of R^N whose principal angles are ``theta`` (N ≥ 2n): x = Q[I; 0]·R₁,
    y = Q[diag cos θ; diag sin θ; 0]·R₂ for a random orthogonal Q and random orthogonal R₁, R₂."""
    import numpy as np

    n = len(theta)
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((N, N)))[0]
    R1, R2 = (np.linalg.qr(rng.standard_normal((n, n)))[0] for _ in range(2))
    E = np.zeros((N, n))
    E[:n] = np.eye(n)
    F = np.zeros((N, n))
    F[:n] = np.diag(np.cos(theta))
    F[n : 2 * n] = np.diag(np.sin(theta))
    return asarray(Q @ E @ R1, xp, device), asarray(Q @ F @ R2, xp, device)


@pytest.mark.parametrize(
    "theta", [[1e-9, 0.3, 1.2], [0.0, 0.0, 0.0], [1.5707963267948966, 0.7, 1e-5]], ids=["small", "same", "right"]
)
def test_grassmann_dist_is_the_norm_of_the_principal_angles(xp, device, theta):
    import math

    x, y = _subspaces_at_angles(theta, 8, 0, xp, device)
    M = Grassmann(8, 3)
    want = math.sqrt(sum(t * t for t in theta))
    tol = _tol(x, xp)
    d = float(M.dist(x, y))
    assert abs(d - want) <= tol * max(want, 1.0), (d, want)
    assert abs(float(M.dist(y, x)) - d) <= tol
    assert float(M.dist(x, x)) <= tol
    assert tuple(M.dist(x, y, keepdim=True).shape) == (1, 1)


def test_grassmann_dist_of_a_batch_and_a_small_angle(xp, device):
    """One value per point of a batch; an angle of 1e-9 comes out to 1e-14 absolute in float64 (arccos of the
    cosine alone gives 0: cos 1e-9 rounds to 1)."""
    pairs = [_subspaces_at_angles(theta, 6, k, xp, device) for k, theta in enumerate([[1e-9, 0.0], [0.5, 0.25]])]
    x = xp.stack([p[0] for p in pairs])
    y = xp.stack([p[1] for p in pairs])
    d = to_numpy(Grassmann(6, 2).dist(x, y))
    assert d.shape == (2,)
    tol = _tol(x, xp)
    assert abs(d[0] - 1e-9) <= (1e-14 if x.dtype == xp.float64 else tol)
    assert abs(d[1] - (0.5**2 + 0.25**2) ** 0.5) <= tol


def test_euclidean_dist_is_the_frobenius_norm(xp, device):
    x = geoarray.random.normal(0, (4, 3), xp=xp, dtype=xp.float64, device=device)
    y = geoarray.random.normal(1, (4, 3), xp=xp, dtype=xp.float64, device=device)
    M = Euclidean()
    d = M.dist(x, y)
    want = float(xp.sqrt(xp.sum((x - y) ** 2)))
    assert abs(float(d) - want) <= 1e-12 * want
    assert tuple(M.dist(x, y, keepdim=True).shape) == (1, 1)


def test_stiefel_dist_names_what_to_compute_instead():
    with pytest.raises(NotImplementedError, match=r"no closed-form geodesic distance.*Grassmann\(N, n\).dist"):
        Stiefel(5, 2).dist(None, None)
    with pytest.raises(NotImplementedError, match="matrix_norm"):
        SymplecticStiefel(4, 2).dist(None, None)


def test_geoopts_canonical_keyword():
    """``Stiefel(N, n, canonical=True)`` is geoarray's Stiefel (the canonical metric); ``canonical=False``
    (geoopt's EuclideanStiefel) raises, naming the metric and the map to use; the shape error comes first."""
    assert repr(Stiefel(5, 2, canonical=True)) == repr(Stiefel(5, 2))
    with pytest.raises(ValueError, match=r"canonical=False.*canonical metric only.*M.proju\(x, u\)"):
        Stiefel(5, 2, canonical=False)
    with pytest.raises(TypeError, match="needs its shape"):
        Stiefel(canonical=False)
