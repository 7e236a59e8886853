"""Stiefel and Grassmann manifolds against dense references; Euclidean; horizontal elements.

Every identity of the paper's sections 2–3 and appendices B–C is checked on every backend in float64
(tolerances are absolute on O(1) quantities unless stated):

Ω(Δ)Y = Δ (eq. 17); ΛᵀΩΛ = global_rep (eq. 11); Λ·global_rep·E = Δ; metric = ½tr(Ω₁ᵀΩ₂);
metric(Y, rgrad(Y, G), V) = tr(GᵀV) (eq. 2); apply_section(λ, retraction(global_rep(λ, tΔ))) =
expm(tΩ(Δ))Y for t from 1e-3 to large steps, for every section strategy (section independence);
Cayley likewise; the first-order property of both retractions; batched = looped.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import asarray, assert_close, max_abs, to_numpy
from geoarray import _backend, linalg
from geoarray.manifolds import (
    DenseSection,
    Euclidean,
    Grassmann,
    GrassmannHorizontal,
    HouseholderSection,
    Stiefel,
    StiefelHorizontal,
)

SIZES = [(10, 3), (6, 6), (7, 1)]
KINDS = [Stiefel, Grassmann]
SECTIONS = ["householder", "random", "transported"]


def _setup(M, xp, device, seed=0, batch=()):
    Y = M.random(seed, xp=xp, batch_shape=batch, device=device)
    G = geoarray.random.normal(seed + 100, (*batch, M.N, M.n), xp=xp, device=device)
    return Y, G, M.rgrad(Y, G)


def _dense_section(M, lam, xp):
    """Λ = [Y, Q⊥] as a dense (..., N, N) array, from the section's own perp()."""
    m = M.N - M.n
    eye = xp.broadcast_to(linalg.eye(m, lam.Y), (*lam.Y.shape[:-2], m, m))
    return xp.concat([lam.Y, lam.perp(eye)], axis=-1)


def _section(M, Y, seed=3):
    return M.global_section(Y, seed=seed) if M.section == "random" else M.global_section(Y)


# ---------------------------------------------------------------------------------------------
# points, tangent vectors, metric
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,n", SIZES)
def test_random_points_are_on_the_manifold_and_haar_normalised(xp, device, kind, N, n):
    M = kind(N, n)
    Y = M.random(0, xp=xp, batch_shape=(4,), device=device)
    assert tuple(Y.shape) == (4, N, n)
    assert max_abs(xp.matrix_transpose(Y) @ Y - linalg.eye(n, Y)) < 1e-13
    assert M.is_point(Y)
    # Algorithm 3 with the signs of R fixed: Y = Q with diag(R) > 0 for the Gaussian it came from
    A = geoarray.random.normal(0, (4, N, n), xp=np)
    R = np.swapaxes(to_numpy(Y), -1, -2) @ A
    assert np.all(np.diagonal(R, axis1=-2, axis2=-1) > 0)
    np.testing.assert_allclose(np.tril(R, -1), 0, atol=1e-12)


def test_random_points_are_the_same_on_every_backend(xp, device):
    M = Stiefel(9, 4)
    assert_close(
        M.random(5, xp=xp, batch_shape=(2,), device=device),
        M.random(5, xp=np, batch_shape=(2,)),
        xp=xp,
        device=device,
        atol=1e-13,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_rgrad_is_tangent_and_represents_the_differential(xp, device, kind):
    M = kind(10, 3)
    Y, G, D = _setup(M, xp, device)
    assert M.is_tangent(Y, D, atol=1e-13)
    V = M.project(Y, geoarray.random.normal(7, (10, 3), xp=xp, device=device))
    assert M.is_tangent(Y, V, atol=1e-13)
    lhs = M.metric(Y, D, V)
    rhs = xp.sum(G * V)  # ⟨dL, V⟩ = tr(GᵀV), eq. 2
    assert abs(float(lhs - rhs)) < 1e-13 * max(1.0, abs(float(rhs)))


@pytest.mark.parametrize("kind", KINDS)
def test_omega_maps_to_the_tangent_vector(xp, device, kind):
    M = kind(10, 3)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    Om = M.omega(Y, D)
    assert_close(Om @ Y, D, xp=xp, atol=1e-13)  # Ω(Δ)Y = Δ (eq. 17)
    assert_close(xp.matrix_transpose(Om), -Om, xp=xp, atol=1e-15)  # Ω ∈ so(N)


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,n", SIZES)
def test_global_rep_is_the_conjugated_omega(xp, device, kind, section, N, n):
    M = kind(N, n, section=section)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    lam = _section(M, Y)
    Lam = _dense_section(M, lam, xp)
    assert max_abs(xp.matrix_transpose(Lam) @ Lam - linalg.eye(N, Lam)) < 1e-13  # λ(Y) ∈ O(N)
    assert_close(Lam[..., :n], Y, xp=xp, atol=0)  # λ(Y)E = Y
    W = M.global_rep(lam, D)
    assert isinstance(W, StiefelHorizontal if kind is Stiefel else GrassmannHorizontal)
    Om = M.omega(Y, D)
    assert_close(xp.matrix_transpose(Lam) @ Om @ Lam, W.to_dense(), xp=xp, atol=1e-13)  # eq. 11
    assert_close(M.apply_section(lam, W.to_dense()[..., :n]), D, xp=xp, atol=1e-13)  # Λ·W·E = Δ


@pytest.mark.parametrize("kind", KINDS)
def test_metric_is_half_the_trace_of_omegas(xp, device, kind):
    M = kind(10, 3)
    Y, _, D1 = _setup(M, xp, device, seed=1)
    D2 = M.rgrad(Y, geoarray.random.normal(9, (10, 3), xp=xp, device=device))
    half_trace = xp.sum(M.omega(Y, D1) * M.omega(Y, D2)) / 2
    assert abs(float(M.metric(Y, D1, D2) - half_trace)) < 1e-13
    lam = M.global_section(Y)
    assert abs(float(M.global_rep(lam, D1).inner(M.global_rep(lam, D2)) - half_trace)) < 1e-13


# ---------------------------------------------------------------------------------------------
# retractions
# ---------------------------------------------------------------------------------------------


def _dense_cayley(Om, xp):
    eye = linalg.eye(Om.shape[-1], Om)
    return xp.linalg.solve(eye - Om / 2, eye + Om / 2)


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["geodesic", "cayley"])
@pytest.mark.parametrize("t", [1e-3, 0.3, 3.0, 30.0])
def test_retraction_is_section_independent_and_matches_dense(xp, device, host_reads_policy, kind, section, method, t):
    if t > 10:  # ‖tΩ‖ = 30 is beyond the doubling budget of a retraction that reads nothing (a GPU's default)
        host_reads_policy("always")
    M = kind(10, 3, section=section)
    Y, _, D = _setup(M, xp, device)
    D = D / float(xp.sqrt(M.metric(Y, D, D)))  # unit speed: ‖tΩ‖ ≈ t
    lam = _section(M, Y)
    Y_new = M.apply_section(lam, M.retraction(t * M.global_rep(lam, D), method))
    Om = t * M.omega(Y, D)
    ref = (linalg.expm(Om) if method == "geodesic" else _dense_cayley(Om, xp)) @ Y
    # the dense references err by ~ε·‖tΩ‖; the result is orthonormal regardless
    assert_close(Y_new, ref, xp=xp, atol=1e-14 * max(1.0, t) * 10)
    assert max_abs(xp.matrix_transpose(Y_new) @ Y_new - linalg.eye(3, Y_new)) < 1e-13


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["geodesic", "cayley"])
def test_retraction_first_order(xp, device, kind, method):
    """R(0) = E and d/dt R(tW)|₀ = W E, so d/dt λ·R(tW)|₀ = Δ (Definition 3)."""
    M = kind(10, 3)
    Y, _, D = _setup(M, xp, device)
    D = D / float(xp.sqrt(M.metric(Y, D, D)))  # unit speed, so the O(h²) remainder is ~h²
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    E = asarray(np.eye(10, 3), xp, device)
    assert_close(M.retraction(0 * W, method), E, xp=xp, atol=0)
    h = 1e-5
    deriv = M.apply_section(lam, M.retraction(h * W, method)) - M.apply_section(lam, M.retraction(-h * W, method))
    assert_close(deriv / (2 * h), D, xp=xp, atol=1e-9)  # central difference: O(h²) ≈ 1e-10


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["geodesic", "cayley"])
@pytest.mark.parametrize("norm", [10.0, 100.0, 1000.0])
def test_retraction_stays_orthonormal_for_huge_steps(xp, device, host_reads_policy, kind, method, norm):
    """The seed's Taylor loop fails near ‖B‖ ≈ 40; scaling and doubling keeps 1e-12 up to 1e3 (with the
    doublings the norm asks for: a host read, which a GPU makes only under ``set_host_reads("always")``)."""
    host_reads_policy("always")
    M = kind(20, 4)
    Y, _, D = _setup(M, xp, device)
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    W = (norm / float(W.norm())) * W
    X = M.retraction(W, method)
    err = max_abs(xp.matrix_transpose(X) @ X - linalg.eye(4, X))
    assert err < 1e-12, f"‖XᵀX − I‖ = {err:.1e} at ‖W‖ = {norm:g}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["geodesic", "cayley"])
def test_transported_section_moves_with_the_point(xp, device, kind, method):
    M = kind(9, 2, section="transported", retraction_method=method)
    Y, _, D = _setup(M, xp, device, batch=(3,))
    lam = M.global_section(Y)
    assert isinstance(lam, DenseSection)
    for step in range(3):
        W = M.global_rep(lam, 0.7 * D)
        expected = M.apply_section(lam, M.retraction(W))
        lam = M.transport_section(lam, W)
        assert_close(lam.Y, expected, xp=xp, atol=1e-13)
        Lam = lam.to_dense()
        assert max_abs(xp.matrix_transpose(Lam) @ Lam - linalg.eye(9, Lam)) < 1e-13, f"step {step}"
        D = M.rgrad(lam.Y, geoarray.random.normal(step, (3, 9, 2), xp=xp, device=device))


@pytest.mark.parametrize("kind", KINDS)
def test_batched_equals_looped(xp, device, kind):
    M = kind(8, 3)
    Y, G, D = _setup(M, xp, device, batch=(2, 3))
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    Y_new = M.apply_section(lam, M.retraction(W))
    for i in range(2):
        for j in range(3):
            Yij = Y[i, j, ...]
            lam_ij = M.global_section(Yij)
            W_ij = M.global_rep(lam_ij, M.rgrad(Yij, G[i, j, ...]))
            assert_close(M.apply_section(lam_ij, M.retraction(W_ij)), Y_new[i, j, ...], xp=xp, atol=1e-14)


def test_householder_section_never_forms_n_by_n(xp, device):
    """Section storage is O(N·n): the section holds N×n and n×n arrays only."""
    M = Stiefel(500, 4)
    Y = M.random(0, xp=xp, device=device)
    lam = M.global_section(Y)
    assert isinstance(lam, HouseholderSection)
    assert all(max(leaf.shape) <= 500 and min(leaf.shape) <= 4 for leaf in lam)


@pytest.mark.parametrize(("N", "n"), SIZES)
def test_householder_section_through_q_equals_its_definition(xp, device, N, n):
    """λX = Q[S·X_top; X_bot] and λᵀD = [S·(QᵀD)_top; (QᵀD)_bot] (the fast form, two products each)
    equal the definition λ = [Y, Q⊥]: Y·X_top + Q⊥·X_bot and [YᵀD; Q⊥ᵀD], to 1e-13 (float64, batched)."""
    M = Stiefel(N, n)
    Y = M.random(0, xp=xp, batch_shape=(3,), device=device)
    lam = M.global_section(Y)
    X = geoarray.random.normal(1, (3, N, 2), xp=xp, device=device)
    by_definition = Y @ X[..., :n, :] + lam.perp(X[..., n:, :])
    assert_close(lam.apply(X), by_definition, xp=xp, atol=1e-13)
    mT = xp.matrix_transpose
    coords_def = xp.concat([mT(Y) @ X, lam.perp_t(X)], axis=-2)
    assert_close(lam.coords(X), coords_def, xp=xp, atol=1e-13)
    assert_close(M.apply_section(lam, X), by_definition, xp=xp, atol=1e-13)


@pytest.mark.parametrize("manifold", ["stiefel", "grassmann"])
@pytest.mark.parametrize("strategy", ["householder", "transported"])
@pytest.mark.parametrize("method", ["geodesic", "cayley"])
def test_apply_retraction_equals_apply_section_of_the_retraction(xp, device, manifold, strategy, method):
    """``apply_retraction(λ, W)`` (operation 3 with g(W)E's row blocks handed to the section unassembled)
    equals ``apply_section(λ, retraction(W))`` to 1e-13, and the section's ``coords_blocks``/``apply_blocks``
    equal the row blocks of ``coords``/``apply`` (float64, batched; the Householder and dense sections, and
    torch's packed one, which its Householder strategy picks for this batch of 16 small frames); a W that is
    not horizontal raises TypeError, a section of another manifold ValueError naming lam.Y."""
    M = (Stiefel if manifold == "stiefel" else Grassmann)(9, 3)
    Y = M.random(0, xp=xp, batch_shape=(16,), device=device)
    lam = M.global_section(Y, strategy=strategy)
    W = 0.3 * M.lift(Y, lam, geoarray.random.normal(1, (16, 9, 3), xp=xp, device=device))
    expected = M.apply_section(lam, M.retraction(W, method))
    assert_close(M.apply_retraction(lam, W, method), expected, xp=xp, atol=1e-13)
    X = geoarray.random.normal(2, (16, 9, 2), xp=xp, device=device)
    top, bottom = lam.coords_blocks(X)
    coords = lam.coords(X)
    assert_close(top, coords[..., :3, :], xp=xp, atol=1e-13)
    assert_close(bottom, coords[..., 3:, :], xp=xp, atol=1e-13)
    assert_close(lam.apply_blocks(X[..., :3, :], X[..., 3:, :]), lam.apply(X), xp=xp, atol=1e-13)
    with pytest.raises(TypeError, match="W must be a"):
        M.apply_retraction(lam, X, method)
    other = (Stiefel if manifold == "stiefel" else Grassmann)(10, 3)  # a section of another manifold
    lam_other = other.global_section(other.random(3, xp=xp, batch_shape=(16,), device=device), strategy=strategy)
    with pytest.raises(ValueError, match=r"lam.Y must have trailing shape \(9, 3\)"):
        M.apply_retraction(lam_other, W, method)


def test_packed_householder_section_equals_the_compact_wy_form(backend, xp, device):
    """torch's packed-reflector section (ormqr; chosen for batches of ≥ 16 small frames) equals the compact-WY
    section in every operation (λX, λᵀD, Q⊥X, Q⊥ᵀD) to 1e-13, and a Stiefel-Adam step with it equals the
    step taken with the WY form (float64)."""
    if backend.kind != "torch":
        pytest.skip("the packed (ormqr) section is torch's fast path")
    from geoarray.manifolds import PackedHouseholderSection

    M = Stiefel(12, 3)
    Y = M.random(0, xp=xp, batch_shape=(20,), device=device)
    packed, wy = M.global_section(Y), HouseholderSection.of(Y)
    assert isinstance(packed, PackedHouseholderSection)
    X = geoarray.random.normal(1, (20, 12, 2), xp=xp, device=device)
    assert_close(packed.apply(X), wy.apply(X), xp=xp, atol=1e-13)
    assert_close(packed.coords(X), wy.coords(X), xp=xp, atol=1e-13)
    assert_close(packed.perp_t(X), wy.perp_t(X), xp=xp, atol=1e-13)
    assert_close(packed.perp(X[..., 3:, :]), wy.perp(X[..., 3:, :]), xp=xp, atol=1e-13)
    G = geoarray.random.normal(2, (20, 12, 3), xp=xp, device=device)
    steps = [M.apply_section(lam, M.retraction(0.1 * M.lift(Y, lam, G))) for lam in (packed, wy)]
    assert_close(steps[0], steps[1], xp=xp, atol=1e-13)


def test_reconstructed_householder_section_equals_the_qr_section(backend, xp, device):
    """The section from reflectors reconstructed out of Y's orthonormality (``set_section_form("reconstructed")``:
    an n×n LU instead of the QR) equals the QR-built one in every operation to 1e-13, and so does a
    Stiefel-Adam step (float64; every backend runs both constructions)."""
    M = Stiefel(512, 32)
    Y = M.random(0, xp=xp, device=device)
    rec, qr = HouseholderSection.of(Y, reconstruct=True), HouseholderSection.of(Y)
    X = geoarray.random.normal(1, (512, 3), xp=xp, device=device)
    for op in ("apply", "coords", "perp_t"):
        assert_close(getattr(rec, op)(X), getattr(qr, op)(X), xp=xp, atol=1e-13)
    assert_close(rec.perp(X[32:, :]), qr.perp(X[32:, :]), xp=xp, atol=1e-13)
    G = geoarray.random.normal(2, (512, 32), xp=xp, device=device)
    steps = [M.apply_section(lam, M.retraction(0.1 * M.lift(Y, lam, G))) for lam in (rec, qr)]
    assert_close(steps[0], steps[1], xp=xp, atol=1e-13)
    previous = geoarray.set_section_form("reconstructed")
    try:
        chosen = M.global_section(Y)
    finally:
        geoarray.set_section_form(previous)
    assert_close(chosen.V, rec.V, xp=xp, atol=0)  # the setting builds the reconstruction


@pytest.mark.parametrize("kind", KINDS)
def test_householder_retraction_does_not_carry_orthogonality_errors(xp, device, kind):
    """From a point with |YᵀY − I| ≈ 1e-7 (accumulated drift), λ(Y)·g(W)E is orthonormal to 1e-13:
    the Householder Q is orthogonal whatever Y's error, so errors do not accumulate over steps; the
    result differs from the step taken at the exact point by O(1e-7)."""
    M = kind(12, 3)
    Y, _, D = _setup(M, xp, device, batch=(2,))
    noisy = Y + 1e-7 * geoarray.random.normal(7, (2, 12, 3), xp=xp, device=device)
    assert max_abs(xp.matrix_transpose(noisy) @ noisy - linalg.eye(3, Y)) > 1e-8
    lam, lam_noisy = M.global_section(Y), M.global_section(noisy)
    W = 0.3 * M.global_rep(lam, D)
    step = M.apply_section(lam_noisy, M.retraction(M.global_rep(lam_noisy, 0.3 * D)))
    assert max_abs(xp.matrix_transpose(step) @ step - linalg.eye(3, Y)) < 1e-13
    assert_close(step, M.apply_section(lam, M.retraction(W)), xp=xp, atol=1e-6)


@pytest.mark.parametrize("norm", [0.05, 0.6, 40.0])
def test_float32_phi1_is_accurate_to_float32_roundoff(xp, device, host_reads_policy, norm):
    """φ₁ in float32 (degree-8 Taylor, θ = 0.7; ``norm`` 40 needs doublings) equals the float64
    value (degree 19) to 2e-6 relative: the lower degree loses nothing at float32 precision."""
    from geoarray.manifolds.retraction import phi1

    if norm > 10:  # more doublings than a retraction that reads nothing (a GPU's default) has
        host_reads_policy("always")

    X64 = geoarray.random.normal(3, (4, 8, 8), xp=xp, device=device)
    X64 = norm * X64 / xp.max(xp.sum(xp.abs(X64), axis=-2), axis=-1)[..., None, None]
    ref = phi1(X64, xp, 64)
    got = xp.astype(phi1(xp.astype(X64, xp.float32), xp, 64), xp.float64)
    rel = max_abs(got - ref) / max_abs(ref)
    assert rel < 2e-6 * max(1.0, norm / 4), rel


@pytest.fixture(params=["cpu", "never"])
def host_reads(request, host_reads_policy):
    """The test under the default host reads policy and under ``"never"`` (what a GPU runs), restored after."""
    host_reads_policy(request.param)
    return request.param


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_phi1_taylor_rules_are_accurate_up_to_their_theta(xp, device, dtype_name, host_reads):
    """Each Taylor rule (degree, chunk, θ) of φ₁ is accurate to a few unit roundoffs at ‖X‖₁ = θ (its
    truncation error Σ_{k>m} θ^k/(k+1)! is below u), against the top float64 rule with scaling and
    doubling; an eager call picks the lowest rule whose θ covers the largest bound (bit for bit where it
    reads the bound to the host: the same call; without host reads, a GPU or ``set_host_reads("never")``,
    another computation held to the rule's accuracy), and a bound beyond the last θ takes the scaled route."""
    from geoarray.manifolds.retraction import _PHI1_RULES, _phi1_bounded, _phi1_scaled, _phi1_taylor

    dtype = getattr(xp, dtype_name)
    u = float(np.finfo(dtype_name).eps) / 2
    X64 = geoarray.random.normal(5, (3, 8, 8), xp=xp, device=device)
    X64 = X64 / xp.max(xp.sum(xp.abs(X64), axis=-2), axis=-1)[..., None, None]  # ‖X‖₁ = 1 per element
    for rule in _PHI1_RULES[dtype_name]:
        theta = rule[2]
        ref = _phi1_scaled(theta * X64, xp.full((3,), theta, dtype=xp.float64, device=device), xp, 64)
        X = xp.astype(theta * X64, dtype)
        got = _phi1_taylor(X, xp, rule)
        assert max_abs(xp.astype(got, xp.float64) - ref) < 8 * u, rule
        bound = xp.full((3,), 0.999 * theta, dtype=dtype, device=device)  # below θ after rounding
        bounded = _phi1_bounded(X, bound, xp, 64)
        if _backend.host_reads_allowed(bound):  # the rule chosen on the host runs this same _phi1_taylor call
            assert_close(bounded, got, xp=xp, atol=0, dtype=dtype)
        else:  # no host reads (a GPU): fixed work, or a lax.switch compiled apart: another computation
            assert max_abs(xp.astype(bounded, xp.float64) - ref) < 8 * u, rule
    X = xp.astype(2.0 * X64, dtype)
    bound = xp.full((3,), 2.0, dtype=dtype, device=device)
    bounded, scaled = _phi1_bounded(X, bound, xp, 64), _phi1_scaled(X, bound, xp, 64)
    if _backend.host_reads_allowed(bound):  # the same _phi1_scaled call, bit for bit
        assert_close(bounded, scaled, xp=xp, atol=0, dtype=dtype)
    else:  # as above: another computation of the same route, which rounds differently (a few u, one doubling)
        assert_close(bounded, scaled, xp=xp, atol=32 * u * max(1.0, max_abs(scaled)), dtype=dtype)


@pytest.mark.parametrize("norm", [0.01, 0.1, 0.5, 2.0, float("nan")])
def test_phi1_rule_chosen_under_jax_jit_equals_eager(backend, xp, device, norm):
    """Under jax.jit the Taylor rule is chosen on the device (``lax.switch``, no host read): the jitted
    φ₁ equals the eager one, whose rule is chosen on the host, to float32 rounding, for bounds within
    each rule's θ, beyond the last one (scaling and doubling) and NaN (NaN out)."""
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    from geoarray.manifolds.retraction import _phi1_bounded

    X = geoarray.random.normal(6, (4, 8, 8), xp=xp, device=device, dtype=xp.float32)
    X = norm * X / xp.max(xp.sum(xp.abs(X), axis=-2), axis=-1)[..., None, None]
    bound = xp.max(xp.sum(xp.abs(X), axis=-2), axis=-1)
    eager = _phi1_bounded(X, bound, xp, 64)
    jitted = jax.jit(lambda X, b: _phi1_bounded(X, b, xp, 64))(X, bound)
    if norm != norm:
        assert bool(xp.all(xp.isnan(jitted))) and bool(xp.all(xp.isnan(eager)))
    else:
        assert_close(jitted, eager, xp=xp, atol=1e-6, dtype=xp.float32)


def test_retraction_and_section_trace_under_jax_jit(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    M = Stiefel(12, 3)
    Y, _, D = _setup(M, xp, device, batch=(2,))

    def step(Y, D):
        lam = M.global_section(Y)
        return M.apply_section(lam, M.retraction(50.0 * M.global_rep(lam, D)))

    assert_close(jax.jit(step)(Y, D), step(Y, D), xp=xp, atol=1e-13)


def test_float32_retraction_keeps_dtype(xp, device):
    M = Stiefel(16, 4)
    Y = M.random(0, xp=xp, dtype="float32", device=device)
    assert Y.dtype == xp.float32
    D = M.rgrad(Y, geoarray.random.normal(1, (16, 4), xp=xp, dtype="float32", device=device))
    lam = M.global_section(Y)
    Y_new = M.apply_section(lam, M.retraction(M.global_rep(lam, D)))
    assert Y_new.dtype == xp.float32
    assert max_abs(xp.matrix_transpose(Y_new) @ Y_new - linalg.eye(4, Y_new)) < 1e-5


# ---------------------------------------------------------------------------------------------
# horizontal elements
# ---------------------------------------------------------------------------------------------


def test_horizontal_arithmetic_is_fieldwise_and_a_tree(xp, device):
    M = Stiefel(7, 3)
    Y, _, D = _setup(M, xp, device)
    lam = M.global_section(Y)
    W = M.global_rep(lam, D)
    second = W * W
    v = W / (second + 1e-8).sqrt()  # Adam's velocity shape (eq. 6)
    assert isinstance(v, StiefelHorizontal)
    assert_close(xp.matrix_transpose(v.A), -v.A, xp=xp, atol=1e-15)  # stays skew: one statistic per entry
    assert_close((2 * W - W).B, W.B, xp=xp, atol=1e-15)
    assert_close((W - W).A, W.zeros_like().A, xp=xp, atol=0)
    assert_close((-W).B, 0 - W.B, xp=xp, atol=0)
    assert len(optree.tree_leaves(W)) == 2
    doubled = optree.tree_map(lambda a: 2 * a, W)
    assert isinstance(doubled, StiefelHorizontal)
    with pytest.raises(TypeError, match="cannot combine"):
        W + GrassmannHorizontal(W.B)


# ---------------------------------------------------------------------------------------------
# Euclidean
# ---------------------------------------------------------------------------------------------


def test_euclidean_is_ordinary_addition(xp, device):
    M = Euclidean()
    Y = geoarray.random.normal(0, (3, 5), xp=xp, device=device)
    G = geoarray.random.normal(1, (3, 5), xp=xp, device=device)
    lam = M.global_section(Y)
    W = M.global_rep(lam, M.rgrad(Y, G))
    assert_close(M.apply_section(lam, M.retraction(-0.1 * W)), Y - 0.1 * G, xp=xp, atol=0)
    assert abs(float(M.metric(Y, G, G) - xp.sum(G * G))) == 0
    with pytest.raises(ValueError, match="shape of Y"):
        M.rgrad(Y, G[:2, ...])


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_constructor_validation(kind):
    with pytest.raises(ValueError, match="n ≤ N"):
        kind(3, 4)
    with pytest.raises(TypeError, match="N must be an int"):
        kind(3.0, 2)
    with pytest.raises(TypeError, match="n must be an int"):
        kind(3, True)
    with pytest.raises(ValueError, match="n must be positive"):
        kind(3, 0)
    with pytest.raises(ValueError, match="section must be one of"):
        kind(5, 2, section="qr")
    with pytest.raises(ValueError, match="retraction_method must be one of"):
        kind(5, 2, retraction_method="exp")
    assert kind(5, 2) == kind(np.int64(5), 2) and hash(kind(5, 2)) == hash(kind(5, 2))
    assert kind(5, 2) != kind(5, 2, section="random")


@pytest.mark.parametrize("kind", KINDS)
def test_operation_validation(xp, device, kind):
    M = kind(6, 2)
    Y, G, D = _setup(M, xp, device)
    with pytest.raises(ValueError, match=r"Y must have trailing shape \(6, 2\)"):
        M.rgrad(Y[:5, ...], G[:5, ...])
    with pytest.raises(ValueError, match=r"dL must have trailing shape \(6, 2\)"):
        M.rgrad(Y, G[..., :1])
    with pytest.raises(TypeError, match="Y must have a real floating dtype"):
        M.rgrad(xp.asarray(np.eye(6, 2, dtype=np.int64), device=device), G)
    with pytest.raises(TypeError, match="section='random' needs a seed"):
        kind(6, 2, section="random").global_section(Y)
    lam = M.global_section(Y)
    with pytest.raises(TypeError, match="W must be a"):
        M.retraction(D)
    with pytest.raises(ValueError, match="method must be one of"):
        M.retraction(M.global_rep(lam, D), method="exp")
    with pytest.raises(ValueError, match="is not a point"):
        kind(6, 2, validate=True).rgrad(2 * Y, G)
    assert not M.is_point(2 * Y)
    assert not M.is_tangent(Y, Y + D)


# ---------------------------------------------------------------------------------------------
# the contract's projection: point_error and nearest_point
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,n", SIZES)
def test_nearest_point_is_the_polar_factor_and_point_error_measures_the_distance(xp, device, kind, N, n):
    """For frames, point_error = max|YᵀY − I| (NumPy reference, 1e-12) and nearest_point = U Vᵀ of the
    SVD Y = U Σ Vᵀ (Higham, Theorem 8.4; 1e-10 on O(1) entries), a point fixed by the projection."""
    M = kind(N, n)
    Y = M.random(0, xp=xp, batch_shape=(2,), device=device)
    assert M.has_nearest_point and M.point_error(Y) <= 1e-12
    off = Y + 1e-2 * geoarray.random.normal(5, (2, N, n), xp=xp, device=device)
    A = to_numpy(off)
    assert abs(M.point_error(off) - np.abs(np.swapaxes(A, -1, -2) @ A - np.eye(n)).max()) <= 1e-12
    U, _, Vt = np.linalg.svd(A, full_matrices=False)
    P = M.nearest_point(off)
    assert M.is_point(P)
    np.testing.assert_allclose(to_numpy(P), U @ Vt, rtol=0, atol=1e-10)
    assert max_abs(M.nearest_point(Y) - Y) <= 1e-12


def test_point_error_and_nearest_point_of_euclidean_and_symplectic_stiefel(xp, device):
    """Euclidean: every finite array is a point (error 0, ∞ for NaN), its own nearest point (a new array).
    Symplectic Stiefel: point_error of a random point is below is_point's tolerance and grows off it;
    there is no closed-form projection, and asking for one says so."""
    E = Euclidean()
    X = geoarray.random.normal(0, (3, 2), xp=xp, device=device)
    assert E.has_nearest_point and E.point_error(X) == 0.0
    assert E.point_error(X * float("nan")) == float("inf")
    Xp = E.nearest_point(X)
    assert Xp is not X and max_abs(Xp - X) == 0.0
    S = geoarray.manifolds.SymplecticStiefel(6, 2)
    Y = S.random(0, xp=xp, device=device)
    assert S.point_error(Y) <= S.default_atol(Y.dtype, xp)
    assert S.point_error(Y * 1.1) > 0.1  # (1.1² − 1) on the entries of 𝕁
    assert not S.has_nearest_point
    with pytest.raises(NotImplementedError, match="no closed-form nearest point"):
        S.nearest_point(Y)


def test_retract_e_takes_gram_or_the_lower_block_and_refuses_neither(xp, device):
    """retract_e's geodesic kernel from the Gram block G or from c = a² − G directly gives the same
    g(W)E blocks to 1e-13 (float64); with neither, or the Cayley kernel without G, it raises ValueError
    naming what is missing."""
    from geoarray.manifolds.retraction import retract_e

    M = Stiefel(9, 3)
    Y, G, _ = _setup(M, xp, device, batch=(2,))
    W = M.lift(Y, M.global_section(Y), 0.3 * G)
    a, B = W.A / 2, W.B
    gram = xp.matrix_transpose(B) @ B
    kw = {"xp": xp, "max_doublings": 64}
    from_gram = retract_e(a, gram, B, method="geodesic", **kw)
    from_low = retract_e(a, None, B, method="geodesic", low=a @ a - gram, **kw)
    for x, y in zip(from_gram, from_low, strict=True):
        assert_close(x, y, xp=xp, atol=1e-13)
    with pytest.raises(ValueError, match="give gram"):
        retract_e(a, None, B, method="geodesic", **kw)
    with pytest.raises(ValueError, match="'cayley' kernel needs gram"):
        retract_e(a, None, B, method="cayley", low=a @ a - gram, **kw)


@pytest.mark.parametrize("method", ["geodesic", "cayley"])
def test_square_fast_path_equals_the_2n_kernel_and_does_not_carry_drift(xp, device, method):
    """O(n) = Stiefel(n, n): the section is Y itself (λE = Y) and g(W)E = exp(A) or Cay(A) from the n×n
    block alone. In float64 the step equals the general 2n×2n kernel (``retract_e`` with G = 0) applied
    through the Householder section to 1e-12. An orthogonality error e of Y becomes ≤ 2e² in one step (the
    Newton–Schulz step, ¾e² to first order) and rounding (1e-13) in the next: drift does not accumulate."""
    from geoarray.manifolds import SquareSection
    from geoarray.manifolds.retraction import retract_e
    from geoarray.manifolds.sections import householder_section

    n = 12
    M = Stiefel(n, n, retraction_method=method)
    Y, G, _ = _setup(M, xp, device, batch=(2,))
    lam = M.global_section(Y)
    assert isinstance(lam, SquareSection) and max_abs(lam.Y - Y) == 0.0
    W = M.lift(Y, lam, 0.3 * G)
    new = M.apply_retraction(lam, W)
    ref_lam = householder_section(Y)
    zero = xp.zeros((2, n, n), dtype=Y.dtype, device=device)
    top, _ = retract_e(W.A / 2, zero, W.B, xp=xp, method=method, max_doublings=64)
    assert max_abs(new - ref_lam.apply_blocks(top, W.B)) <= 1e-12
    drifted = Y + 1e-5 * geoarray.random.normal(7, (2, n, n), xp=xp, device=device)
    errors = [M.point_error(drifted)]
    for _ in range(2):
        lam = M.global_section(drifted)
        drifted = M.apply_retraction(lam, M.lift(drifted, lam, 0.3 * G))
        errors.append(M.point_error(drifted))
    assert errors[0] > 1e-5 and errors[1] <= 2 * errors[0] ** 2 and errors[2] <= 1e-13, errors


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_square_retraction_exp_rules_are_accurate_up_to_their_theta(xp, device, dtype_name):
    """Each Taylor rule of exp (``_EXP_RULES``) used by the square retraction, at ‖A‖₁ = θ for a skew A,
    and the route beyond the last θ (I + A·φ₁(A), ‖A‖₁ = 3θ), equal SciPy's expm to 8 unit roundoffs
    relative (float64 2^-53, float32 2^-24), and exp(A) is orthogonal to the same order."""
    import scipy.linalg

    from geoarray.manifolds.retraction import _EXP_RULES, _phi1_taylor, retract_square

    dtype = getattr(xp, dtype_name)
    u = 2.0**-53 if dtype_name == "float64" else 2.0**-24
    G = to_numpy(geoarray.random.normal(4, (10, 10), xp=xp, device=device))
    S = G - G.T
    S = S / np.abs(S).sum(axis=0).max()
    rules = _EXP_RULES[dtype_name]
    cases = [(r[2], lambda A, r=r: _phi1_taylor(A, xp, r, shift=0)) for r in rules]
    cases.append((3 * rules[-1][2], lambda A: retract_square(A / 2, xp=xp, method="geodesic", max_doublings=64)))
    for norm, route in cases:
        A = norm * S
        got = to_numpy(route(xp.asarray(A, dtype=dtype, device=device))).astype(np.float64)
        ref = scipy.linalg.expm(A)
        assert np.abs(got - ref).max() / np.abs(ref).max() <= 8 * u, (norm, np.abs(got - ref).max())
        assert np.abs(got.T @ got - np.eye(10)).max() <= 16 * u
