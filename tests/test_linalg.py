"""linalg: projections, Cayley, expm and Householder compact-WY against dense references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _helpers import asarray, assert_close, max_abs, to_numpy
from geoarray import _backend, linalg, random

HYP = settings(max_examples=20, deadline=None, derandomize=True)


def _rand(xp, device, seed, shape, scale=1.0):
    return random.normal(seed, shape, xp=xp, device=device, scale=scale)


# ---------------------------------------------------------------------------------------------
# skew / sym
# ---------------------------------------------------------------------------------------------


@given(seed=st.integers(0, 2**31), n=st.integers(1, 7), batch=st.sampled_from([(), (3,), (2, 2)]))
@HYP
def test_skew_sym_decompose_and_project(xp, device, seed, n, batch):
    A = _rand(xp, device, seed, (*batch, n, n))
    S, K = linalg.sym(A), linalg.skew(A)
    assert_close(S + K, A, xp=xp, atol=1e-15)
    assert_close(xp.matrix_transpose(K), -K, xp=xp, atol=0)
    assert_close(xp.matrix_transpose(S), S, xp=xp, atol=0)
    assert_close(linalg.skew(K), K, xp=xp, atol=0)  # projections are idempotent


def test_non_square_is_rejected(xp, device):
    with pytest.raises(ValueError, match=r"A must be square.*\(3, 2\)"):
        linalg.skew(_rand(xp, device, 0, (3, 2)))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        linalg.expm(_rand(xp, device, 0, (3,)))


# ---------------------------------------------------------------------------------------------
# Cayley
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e3])
@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_cayley_matches_dense_reference(xp, device, scale, batch):
    C = linalg.skew(_rand(xp, device, 1, (*batch, 6, 6), scale=scale))
    Cn = to_numpy(C)
    eye = np.eye(6)
    ref = (eye - Cn) @ np.linalg.inv(eye + Cn)
    # a backward-stable solve errs by ~ε·cond(I + C) and cond(I + C) ≤ 1 + ‖C‖₂ for skew C
    cond = 1 + np.max(np.linalg.norm(Cn, ord=2, axis=(-2, -1)))
    assert_close(linalg.cayley(C), ref, xp=xp, device=device, atol=2e-15 * cond)


@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 12),
    log_scale=st.floats(-8, 3),
    batch=st.sampled_from([(), (5,), (2, 3)]),
)
@HYP
def test_cayley_of_skew_is_orthogonal(xp, device, seed, n, log_scale, batch):
    C = linalg.skew(_rand(xp, device, seed, (*batch, n, n), scale=10.0**log_scale))
    Q = linalg.cayley(C)
    err = max_abs(xp.matrix_transpose(Q) @ Q - linalg.eye(n, Q))
    assert err < 1e-13, f"‖QᵀQ − I‖_max = {err:.2e} for ‖C‖ ≈ 1e{log_scale:.1f}"


def test_cayley_keeps_dtype(xp, device):
    C = linalg.skew(random.normal(0, (5, 5), xp=xp, dtype="float32", device=device))
    Q = linalg.cayley(C)
    assert Q.dtype == xp.float32 and _backend.device(Q) == device
    assert max_abs(xp.matrix_transpose(Q) @ Q - linalg.eye(5, Q)) < 1e-5


# ---------------------------------------------------------------------------------------------
# expm
# ---------------------------------------------------------------------------------------------

# Exact references: Q = (I − ½·11ᵀ) ⊗ (I − ½·11ᵀ) is orthogonal with entries ±1/4, ±3/4·…, so with
# eigenvalues/rotation angles that are small integers times a power of two, A = Q S Qᵀ is exact in
# float64 and exp(A) = Q exp(S) Qᵀ needs only cos/sin/exp of those exact numbers.
_Q4 = np.eye(4) - 0.5
_Q16 = np.kron(_Q4, _Q4)


def _exact_case(kind: str, norm: float, seed: int = 0):
    n = 16
    rng = np.random.default_rng(seed)
    m = rng.integers(-8, 9, size=n // 2).astype(float)
    m[0] = 8.0
    theta = 2.0 ** math.floor(math.log2(norm / 8)) * m
    if kind == "skew":
        S = np.zeros((n, n))
        E = np.zeros((n, n))
        for j, t in enumerate(theta):
            S[2 * j, 2 * j + 1], S[2 * j + 1, 2 * j] = t, -t
            E[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = [[np.cos(t), np.sin(t)], [-np.sin(t), np.cos(t)]]
    else:
        lam = np.concatenate([theta, -theta / 2])
        S, E = np.diag(lam), np.diag(np.exp(lam))
    A = _Q16 @ S @ _Q16.T
    assert np.array_equal(_Q16.T @ A @ _Q16, S)  # the construction is exact
    return A, _Q16 @ E @ _Q16.T


_NORMS = [1e-8, 1e-4, 1e-1, 1.0, 10.0, 100.0, 1e3]


@pytest.mark.parametrize("norm", _NORMS)
@pytest.mark.parametrize("kind", ["skew", "sym"])
def test_expm_relative_accuracy_1e13(xp, device, kind, norm):
    if kind == "sym" and norm > 500:
        norm = 500.0  # exp(1000) overflows float64; 500 is the largest symmetric case
    A, ref = _exact_case(kind, norm)
    E = to_numpy(linalg.expm(asarray(A, xp, device)))
    rel = np.linalg.norm(E - ref) / np.linalg.norm(ref)
    assert rel < 1e-13, f"relative error {rel:.2e} at ‖A‖ ≈ {norm:g} ({kind})"


@pytest.mark.parametrize("scale", [1e-3, 0.5, 3.0, 30.0])
def test_expm_matches_scipy_on_dense_random_batches(xp, device, scale):
    sla = pytest.importorskip("scipy.linalg")
    A = _rand(xp, device, 4, (3, 2, 5, 5), scale=scale)
    ref = sla.expm(to_numpy(A))
    E = linalg.expm(A)
    rel = np.max(np.abs(to_numpy(E) - ref)) / np.max(np.abs(ref))
    # SciPy itself is accurate to ~1e-14 relative here; exp of a non-normal matrix has condition ~‖A‖
    assert rel < 1e-14 * max(1.0, scale) * 10, f"relative difference to SciPy {rel:.2e}"
    assert_close(E, ref, xp=xp, device=device, rtol=1e-12 * max(1.0, scale), atol=0)


def test_expm_native_agrees_with_generic(xp, device, backend):
    if backend.kind not in _backend.fast_path_backends("expm"):
        with pytest.raises(ValueError, match="has no native expm"):
            linalg.expm(_rand(xp, device, 0, (2, 2)), impl="native")
        return
    A = _rand(xp, device, 5, (4, 6, 6), scale=2.0)
    native, generic = linalg.expm(A, impl="native"), linalg.expm(A, impl="generic")
    assert_close(native, generic, xp=xp, rtol=1e-12, atol=1e-13)


@given(seed=st.integers(0, 2**31), n=st.integers(1, 8), log_scale=st.floats(-8, 2.5))
@HYP
def test_expm_group_properties(xp, device, seed, n, log_scale):
    K = linalg.skew(_rand(xp, device, seed, (2, n, n), scale=10.0**log_scale))
    E = linalg.expm(K)
    eye = linalg.eye(n, E)
    assert max_abs(xp.matrix_transpose(E) @ E - eye) < 1e-13  # exp(so(n)) ⊂ O(n)
    assert max_abs(E @ linalg.expm(-K) - eye) < 1e-13  # exp(A) exp(−A) = I


def test_expm_too_large_gives_nan_not_garbage(xp, device):
    A = asarray(np.array([[0.0, 1e3], [-1e3, 0.0]]), xp, device)
    out = to_numpy(linalg.expm(A, max_squarings=2))
    assert np.all(np.isnan(out))
    ok = to_numpy(linalg.expm(A, max_squarings=16))
    np.testing.assert_allclose(ok, [[np.cos(1e3), np.sin(1e3)], [-np.sin(1e3), np.cos(1e3)]], atol=1e-13)


def test_expm_bad_max_squarings(xp, device):
    with pytest.raises(ValueError, match="max_squarings"):
        linalg.expm(_rand(xp, device, 0, (2, 2)), max_squarings=-1)
    with pytest.raises(ValueError, match="impl must be one of"):
        linalg.expm(_rand(xp, device, 0, (2, 2)), impl="fast")


def test_generic_kernels_trace_under_jax_jit(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    A = linalg.skew(_rand(xp, device, 9, (3, 5, 5), scale=20.0))
    jitted = jax.jit(lambda a: linalg.expm(a, impl="generic"))(A)
    assert_close(jitted, linalg.expm(A, impl="generic"), xp=xp, atol=1e-13)
    qr_jit = jax.jit(lambda a: tuple(linalg.householder_qr(a)))(A[..., :3])
    for got, ref in zip(qr_jit, linalg.householder_qr(A[..., :3]), strict=True):
        assert_close(got, ref, xp=xp, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# Householder QR, compact WY
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7, 3), (10, 10), (5, 12, 4), (2, 3, 9, 1)])
def test_householder_apply_q_equals_dense_complete_q(xp, device, shape):
    A = _rand(xp, device, 3, shape)
    qr = linalg.householder_qr(A)
    N = shape[-2]
    eye = xp.broadcast_to(linalg.eye(N, A), (*shape[:-2], N, N))
    Q = linalg.apply_q(qr.V, qr.T, eye)
    Q_ref, R_ref = np.linalg.qr(to_numpy(A), mode="complete")
    assert_close(Q, Q_ref, xp=xp, device=device, atol=1e-13)
    assert_close(qr.R, R_ref[..., : shape[-1], :], xp=xp, device=device, atol=1e-13)
    # A = Q[:, :n] R and Qᵀ Q = I through apply_qt
    assert_close(Q[..., : shape[-1]] @ qr.R, to_numpy(A), xp=xp, device=device, atol=1e-13)
    assert_close(
        linalg.apply_qt(qr.V, qr.T, Q), np.broadcast_to(np.eye(N), Q_ref.shape), xp=xp, device=device, atol=1e-13
    )


def test_householder_generic_equals_native(xp, device, backend):
    A = _rand(xp, device, 8, (6, 20, 5))
    A_before = to_numpy(A).copy()
    generic = linalg.householder_qr(A, impl="generic")
    np.testing.assert_array_equal(to_numpy(A), A_before)  # the input is not modified
    if backend.kind not in _backend.fast_path_backends("geqrf"):
        with pytest.raises(ValueError, match="has no native geqrf"):
            linalg.householder_qr(A, impl="native")
        return
    native = linalg.householder_qr(A, impl="native")
    for g, n in zip(generic, native, strict=True):
        assert_close(g, n, xp=xp, atol=1e-13)


def test_triu_inverse_native_equals_generic(xp, device, backend):
    """The triangular-solve fast path for the compact-WY T factor equals the generic LU solve (and is an
    inverse), batched, for the backends that have one."""
    if backend.kind not in _backend.fast_path_backends("triu_inverse"):
        assert _backend.fast_path("triu_inverse", xp) is None
        pytest.skip(f"{backend.kind} has no triangular solver in its namespace: T comes from _t_factor_series")
    U = xp.triu(_rand(xp, device, 11, (4, 9, 9))) + 3 * linalg.eye(9, xp.zeros((9, 9), device=device))
    native = _backend.fast_path("triu_inverse", xp)(U)
    generic = xp.linalg.solve(U, xp.broadcast_to(linalg.eye(9, U), U.shape))
    assert_close(native, generic, xp=xp, atol=1e-13)
    assert_close(U @ native, np.broadcast_to(np.eye(9), (4, 9, 9)), xp=xp, device=device, atol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 9, 16])
def test_t_factor_series_is_the_ut_inverse(xp, device, n):
    """The Neumann-series T factor (the path of backends without a triangular solver), (I + M)⁻¹·diag(τ)
    with M = diag(τ)·striu(VᵀV), equals (diag(1/τ) + striu(VᵀV))⁻¹ by an LU solve to 1e-13, on every
    backend, batched; a reflector with τₖ = 0 gives a zero row and column k, and the same inverse elsewhere."""
    rng = np.random.default_rng(20 + n)
    V_np = np.tril(rng.standard_normal((3, 2 * n + 1, n)), k=-1)
    V_np[:, np.arange(n), np.arange(n)] = 1.0
    tau_np = 2.0 / np.sum(V_np * V_np, axis=-2)
    V, tau = asarray(V_np, xp, device), asarray(tau_np, xp, device)
    G = xp.matrix_transpose(V) @ V

    def series(tau):
        return linalg._t_factor_series(tau[..., :, None] * xp.triu(G, k=1), tau, xp)

    T = series(tau)
    T_inv = np.triu(to_numpy(G), k=1) + tau_np[..., None, :] ** -1 * np.eye(n)
    assert_close(T, np.linalg.inv(T_inv), xp=xp, device=device, atol=1e-13)
    # τₖ = 0 for one reflector: row and column k vanish, the rest is the inverse without reflector k
    k = n // 2
    tau_np[1, k] = 0.0
    T = to_numpy(series(asarray(tau_np, xp, device)))
    assert np.all(T[1, k, :] == 0) and np.all(T[1, :, k] == 0)
    rest = [i for i in range(n) if i != k]
    sub = np.triu(to_numpy(G)[1][np.ix_(rest, rest)], k=1) + np.diag(1 / tau_np[1, rest])
    np.testing.assert_allclose(T[1][np.ix_(rest, rest)], np.linalg.inv(sub), atol=1e-13)


@pytest.mark.parametrize("n", [1, 4, 9])
def test_t_factor_native_equals_the_series(xp, device, backend, n):
    """The unit-triangular-solve fast path of the T factor (torch, JAX), which reads only the strict upper
    triangle of diag(τ)·VᵀV, equals the Neumann series to 1e-13, batched, also with a τₖ = 0 reflector
    (a zero row and column k)."""
    if backend.kind not in _backend.fast_path_backends("t_factor"):
        assert _backend.t_factor(xp.zeros((2, 2), device=device), xp.zeros((2,), device=device), xp) is None
        pytest.skip(f"{backend.kind} has no triangular solver in its namespace: T comes from _t_factor_series")
    rng = np.random.default_rng(40 + n)
    V_np = np.tril(rng.standard_normal((3, 2 * n + 1, n)), k=-1)
    V_np[:, np.arange(n), np.arange(n)] = 1.0
    tau_np = 2.0 / np.sum(V_np * V_np, axis=-2)
    tau_np[1, n // 2] = 0.0
    V, tau = asarray(V_np, xp, device), asarray(tau_np, xp, device)
    G = xp.matrix_transpose(V) @ V
    series = linalg._t_factor_series(tau[..., :, None] * xp.triu(G, k=1), tau, xp)
    native = _backend.t_factor(G, tau, xp)
    assert_close(native, series, xp=xp, atol=1e-13)
    T = to_numpy(native)
    assert np.all(T[1, n // 2, :] == 0) and np.all(T[1, :, n // 2] == 0)


def test_householder_handles_already_reduced_columns(xp, device):
    """Y = E = [I; 0] needs no reflection (τ = 0): T must stay finite and Q = I."""
    E = asarray(np.eye(8, 3), xp, device)
    for impl in ["auto", "generic"]:
        qr = linalg.householder_qr(E, impl=impl)
        assert np.all(np.isfinite(to_numpy(qr.T)))
        Q = linalg.apply_q(qr.V, qr.T, linalg.eye(8, E))
        np.testing.assert_allclose(np.abs(to_numpy(Q)), np.eye(8), atol=1e-15)
        assert_close(Q[..., :3] @ qr.R, np.eye(8, 3), xp=xp, device=device, atol=1e-15)
    # mixed: the first column already reduced (τ₁ = 0), the others not; Q stays orthogonal and A = Q[:, :n]R
    A_np = np.random.default_rng(12).standard_normal((8, 3))
    A_np[:, 0] = 0.0
    A_np[0, 0] = -2.0
    A = asarray(A_np, xp, device)
    for impl in ["auto", "generic"]:
        qr = linalg.householder_qr(A, impl=impl)
        assert np.all(np.isfinite(to_numpy(qr.T)))
        Q = linalg.apply_q(qr.V, qr.T, linalg.eye(8, A))
        assert_close(xp.matrix_transpose(Q) @ Q, np.eye(8), xp=xp, device=device, atol=1e-14)
        assert_close(Q[..., :3] @ qr.R, A_np, xp=xp, device=device, atol=1e-14)


@pytest.mark.parametrize("shape", [(20, 5), (3, 49, 7), (2, 64, 16), (6, 1)])
def test_householder_of_orthonormal_equals_householder_qr(xp, device, shape):
    """The reconstruction from an n×n LU (Ballard et al. 2015) gives geqrf's factors V, T, R = diag(±1) of an
    orthonormal Y to 1e-13, batched, and Q = I − V T Vᵀ is orthogonal with Q[:, :n]R = Y."""
    Y_np = np.linalg.qr(np.random.default_rng(13).standard_normal(shape))[0]
    Y = asarray(Y_np, xp, device)
    qr, rec = linalg.householder_qr(Y), linalg.householder_of_orthonormal(Y)
    for a, b in zip(qr, rec, strict=True):  # V, T, R
        assert_close(b, a, xp=xp, atol=1e-13)
    N = shape[-2]
    Q = linalg.apply_q(rec.V, rec.T, xp.broadcast_to(linalg.eye(N, Y), (*shape[:-2], N, N)))
    assert_close(xp.matrix_transpose(Q) @ Q, np.broadcast_to(np.eye(N), Q.shape), xp=xp, device=device, atol=1e-14)
    assert_close(Q[..., : shape[-1]] @ rec.R, Y_np, xp=xp, device=device, atol=1e-14)


def test_householder_of_orthonormal_drifted_and_reduced_columns(xp, device):
    """A Y off the manifold by 1e-6 still gives an orthogonal Q (τ = 2/‖v‖²: exact reflectors), with
    Q[:, :n]R = Y up to that 1e-6; already reduced columns (Y = E) take reflections (R = −I), a valid
    factorisation where geqrf takes identities."""
    Y_np = np.linalg.qr(np.random.default_rng(14).standard_normal((30, 4)))[0] * (1 + 1e-6)
    rec = linalg.householder_of_orthonormal(asarray(Y_np, xp, device))
    Q = linalg.apply_q(rec.V, rec.T, linalg.eye(30, rec.V))
    assert_close(xp.matrix_transpose(Q) @ Q, np.eye(30), xp=xp, device=device, atol=1e-14)
    err = max_abs(Q[..., :4] @ rec.R - asarray(Y_np, xp, device))
    assert 5e-7 < err < 2e-6
    E = asarray(np.eye(8, 3), xp, device)
    rec = linalg.householder_of_orthonormal(E)
    assert np.all(np.isfinite(to_numpy(rec.T)))
    assert_close(rec.R, -np.eye(3), xp=xp, device=device, atol=0)
    Q = linalg.apply_q(rec.V, rec.T, linalg.eye(8, E))
    assert_close(Q[..., :3] @ rec.R, np.eye(8, 3), xp=xp, device=device, atol=1e-15)
    with pytest.raises(ValueError, match="Y must be tall"):
        linalg.householder_of_orthonormal(asarray(np.eye(3, 5), xp, device))


def test_householder_is_o_n_memory(xp, device):
    """The factors are N×n and n×n: nothing N×N is returned."""
    qr = linalg.householder_qr(_rand(xp, device, 0, (300, 4)))
    assert tuple(qr.V.shape) == (300, 4) and tuple(qr.T.shape) == (4, 4) and tuple(qr.R.shape) == (4, 4)


def test_householder_float32(xp, device):
    A = random.normal(2, (30, 6), xp=xp, dtype="float32", device=device)
    qr = linalg.householder_qr(A)
    assert qr.V.dtype == xp.float32 and qr.T.dtype == xp.float32
    Y = linalg.apply_q(qr.V, qr.T, linalg.eye(30, A, 6)) @ qr.R
    assert max_abs(Y - A) < 1e-5


def test_householder_rejects_wide_and_mismatched(xp, device):
    with pytest.raises(ValueError, match="must be tall"):
        linalg.householder_qr(_rand(xp, device, 0, (3, 5)))
    qr = linalg.householder_qr(_rand(xp, device, 0, (6, 2)))
    with pytest.raises(ValueError, match="X must have 6 rows"):
        linalg.apply_q(qr.V, qr.T, _rand(xp, device, 0, (5, 2)))
    with pytest.raises(ValueError, match=r"T must be \(2, 2\)"):
        linalg.apply_qt(qr.V, qr.V, _rand(xp, device, 0, (6, 2)))


# ---------------------------------------------------------------------------------------------
# solves, cross-backend agreement
# ---------------------------------------------------------------------------------------------


def test_solve_vectors_uses_the_stacked_vector_rule(xp, device):
    A = _rand(xp, device, 1, (4, 3, 3)) + 3 * linalg.eye(3, _rand(xp, device, 1, (3, 3)))
    b = _rand(xp, device, 2, (4, 3))
    x = linalg.solve_vectors(A, b)
    assert tuple(x.shape) == (4, 3)
    assert_close((A @ x[..., None])[..., 0], b, xp=xp, atol=1e-13)
    with pytest.raises(ValueError, match="b must end in 3"):
        linalg.solve_vectors(A, _rand(xp, device, 2, (4, 2)))


def test_same_inputs_same_outputs_as_numpy(xp, device):
    """Every helper gives what the NumPy backend gives, to rounding."""
    host = random.normal(21, (3, 6, 6), xp=np)
    A = asarray(host, xp, device)
    tall = asarray(host[..., :3], xp, device)
    pairs = [
        (linalg.expm(A), linalg.expm(host)),
        (linalg.cayley(linalg.skew(A)), linalg.cayley(linalg.skew(host))),
        (linalg.householder_qr(tall).T, linalg.householder_qr(host[..., :3]).T),
        (linalg.householder_qr(tall).V, linalg.householder_qr(host[..., :3]).V),
    ]
    for got, ref in pairs:
        assert_close(got, ref, xp=xp, device=device, rtol=1e-12, atol=1e-13)


def test_cayley_of_a_singular_i_plus_c_is_non_finite_or_raises(backend, xp, device):
    """I + C singular (C = diag(−1, ½)): torch and JAX return non-finite entries (nothing is read back from
    the device to raise on); NumPy, array-api-strict (NumPy underneath) and CuPy (which checks cuSOLVER's info
    while synchronisation is allowed, and raises NumPy's LinAlgError) raise."""
    C = asarray(np.diag([-1.0, 0.5]), xp, device)
    if backend.kind in ("numpy", "array_api_strict", "cupy"):
        with pytest.raises(np.linalg.LinAlgError):
            linalg.cayley(C)
        return
    Q = to_numpy(linalg.cayley(C))
    assert not np.all(np.isfinite(Q[:, 0])) and np.isclose(Q[1, 1], 1 / 3, rtol=1e-12)
