"""Batched linear-algebra building blocks, written once against the array API.

Every function accepts leading batch dimensions (``(..., N, N)`` or ``(..., N, n)``), keeps the
namespace, dtype and device of its input, and uses no Python control flow on array values, so it
traces under ``jax.jit``. Native routines are registered in :mod:`geoarray._backend`; the
``impl`` keyword picks between them and the generic path (``"auto"``: the native one where it is
as accurate, ``"generic"``, ``"native"``).

Contents
--------
``skew``, ``sym``
    Projections onto skew-symmetric and symmetric matrices.
``cayley``
    The Cayley transform (I − C)(I + C)⁻¹, orthogonal for skew C.
``expm``
    Matrix exponential of small matrices (scaling and squaring with a degree-13 Padé kernel).
``householder_qr``, ``apply_q``, ``apply_qt``
    Householder QR of a tall matrix in compact-WY form Q = I − V T Vᵀ, applied in O(N·n·k)
    without ever forming the N×N matrix Q.
``householder_of_orthonormal``
    The same factors for a matrix with orthonormal columns, reconstructed from an n×n LU instead
    of a QR of the whole matrix.
``solve``, ``solve_vectors``
    Batched linear solves, with the stacked-vector rule of the standard made explicit.
``msign``, ``polar``, ``newton_schulz``
    The orthogonal polar factor U Vᵀ (exact, through the Gram matrix or Newton's iteration) and
    Muon's quintic Newton–Schulz approximation of it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import array_api_extra as xpx

from . import _backend
from ._backend import array_namespace, check_real_floating

__all__ = [
    "HouseholderQR",
    "apply_q",
    "apply_qt",
    "cayley",
    "expm",
    "eye",
    "householder_of_orthonormal",
    "householder_qr",
    "msign",
    "newton_schulz",
    "polar",
    "skew",
    "solve",
    "solve_vectors",
    "sym",
]

Array = Any


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _check_matrix(A: Array, name: str, xp: Any, *, square: bool = False) -> None:
    check_real_floating(A, name, xp)
    if A.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (..., rows, cols), got shape {tuple(A.shape)}")
    if square and A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name} must be square in its last two axes, got shape {tuple(A.shape)}")


def eye(n: int, like: Array, m: int | None = None) -> Array:
    """Identity (n×m) with the namespace, dtype and device of ``like``; broadcasts over batches."""
    return _backend.eye(n, m, like, array_namespace(like))


def _mT(A: Array, xp: Any) -> Array:
    return xp.matrix_transpose(A)


# --------------------------------------------------------------------------------------------
# projections
# --------------------------------------------------------------------------------------------


def skew(A: Array) -> Array:
    """Skew-symmetric part ½(A − Aᵀ) over the last two axes."""
    xp = array_namespace(A=A)
    _check_matrix(A, "A", xp, square=True)
    return (A - _mT(A, xp)) / 2


def sym(A: Array) -> Array:
    """Symmetric part ½(A + Aᵀ) over the last two axes."""
    xp = array_namespace(A=A)
    _check_matrix(A, "A", xp, square=True)
    return (A + _mT(A, xp)) / 2


# --------------------------------------------------------------------------------------------
# solves
# --------------------------------------------------------------------------------------------


def solve(A: Array, B: Array) -> Array:
    """X with A X = B for stacks of matrices: A (..., n, n), B (..., n, k)."""
    xp = array_namespace(A=A, B=B)
    _check_matrix(A, "A", xp, square=True)
    _check_matrix(B, "B", xp)
    if B.shape[-2] != A.shape[-1]:
        raise ValueError(f"B must have {A.shape[-1]} rows to match A {tuple(A.shape)}, got {tuple(B.shape)}")
    return xp.linalg.solve(A, B)


def solve_vectors(A: Array, b: Array) -> Array:
    """x with A x = b for stacks of vectors: A (..., n, n), b (..., n).

    The array API treats the right-hand side of ``linalg.solve`` as a vector only when it is 1-D;
    a stack of vectors must be passed as a stack of one-column matrices: ``solve(A, b[..., None])[..., 0]``.
    """
    xp = array_namespace(A=A, b=b)
    _check_matrix(A, "A", xp, square=True)
    check_real_floating(b, "b", xp)
    if b.ndim < 1 or b.shape[-1] != A.shape[-1]:
        raise ValueError(f"b must end in {A.shape[-1]} to match A {tuple(A.shape)}, got {tuple(b.shape)}")
    return xp.linalg.solve(A, b[..., None])[..., 0]


# --------------------------------------------------------------------------------------------
# Cayley transform
# --------------------------------------------------------------------------------------------


def cayley(C: Array) -> Array:
    """Cayley transform Cay(C) = (I − C)(I + C)⁻¹ of a stack of square matrices.

    (I − C) and (I + C)⁻¹ commute, so the transform is one batched solve (I + C) X = (I − C).
    For skew-symmetric C the result is orthogonal with determinant 1 (the map the volume-preserving
    attention seed writes with a spurious factor ½ in front; see ``shared/seeds/README.md``).
    """
    xp = array_namespace(C=C)
    _check_matrix(C, "C", xp, square=True)
    eye_n = eye(C.shape[-1], C)
    return xp.linalg.solve(eye_n + C, eye_n - C)


# --------------------------------------------------------------------------------------------
# Matrix exponential
# --------------------------------------------------------------------------------------------

# Higham (2005), "The scaling and squaring method for the matrix exponential revisited":
# coefficients of the [13/13] Padé approximant and the 1-norm bound θ₁₃ below which it is accurate
# to double precision unit roundoff.
_PADE13 = (
    64764752532480000.0,
    32382376266240000.0,
    7771770303897600.0,
    1187353796428800.0,
    129060195264000.0,
    10559470521600.0,
    670442572800.0,
    33522128640.0,
    1323241920.0,
    40840800.0,
    960960.0,
    16380.0,
    182.0,
    1.0,
)
_THETA13 = 5.371920351148152


def _expm_generic(A: Array, xp: Any, max_squarings: int) -> Array:
    n = A.shape[-1]
    eye_n = eye(n, A)
    norm1 = xp.max(xp.sum(xp.abs(A), axis=-2), axis=-1)  # (...,)
    # s = max(0, ceil(log2(‖A‖₁/θ₁₃))): the number of squarings, as an array (no host sync)
    ratio = xp.maximum(norm1 / _THETA13, xp.asarray(1.0, dtype=A.dtype, device=_backend.device(A)))
    s = xp.ceil(xp.log2(ratio))
    scaled = A / xp.pow(2.0, s)[..., None, None]

    b = _PADE13
    A2 = scaled @ scaled
    A4 = A2 @ A2
    A6 = A4 @ A2
    U = scaled @ (A6 @ (b[13] * A6 + b[11] * A4 + b[9] * A2) + b[7] * A6 + b[5] * A4 + b[3] * A2 + b[1] * eye_n)
    V = A6 @ (b[12] * A6 + b[10] * A4 + b[8] * A2) + b[6] * A6 + b[4] * A4 + b[2] * A2 + b[0] * eye_n
    R = xp.linalg.solve(V - U, V + U)

    # A fixed number of masked squarings keeps the code traceable; inputs that would need more than
    # max_squarings are marked with NaN rather than silently returned inaccurate (as jax.scipy does).
    for k in range(max_squarings):
        needed = (s > k)[..., None, None]
        base = xp.where(needed, R, eye_n)  # finished elements square I, so they cannot overflow
        R = xp.where(needed, base @ base, R)
    too_big = (s > max_squarings)[..., None, None]
    return xp.where(too_big, xp.asarray(float("nan"), dtype=A.dtype, device=_backend.device(A)), R)


def expm(A: Array, *, max_squarings: int = 16, impl: str = "auto") -> Array:
    """Matrix exponential exp(A) of a stack of (small) square matrices.

    Generic path: scaling and squaring with the [13/13] Padé approximant (Higham 2005),
    exp(A) = r₁₃(A / 2ˢ)^(2ˢ) with s = max(0, ⌈log₂(‖A‖₁ / θ₁₃)⌉), θ₁₃ ≈ 5.37. Every batch
    element gets its own s; the squarings are a fixed loop of ``max_squarings`` masked steps, so
    there is no Python control flow on array values and the function traces under ``jax.jit``.
    Inputs with ‖A‖₁ > θ₁₃·2^max_squarings (≈ 3.5e5 by default) give NaN; raise ``max_squarings``
    for them.

    ``impl="native"`` uses ``torch.linalg.matrix_exp``, ``jax.scipy.linalg.expm`` or, for NumPy with
    SciPy installed, ``scipy.linalg.expm``. ``impl="auto"`` (default) and ``"generic"`` use the
    array-API path everywhere, because it is the accurate one (see the table) at a cost of
    1.3-1.6× torch's native kernel on CPU and below SciPy's.

    Accuracy (float64, 16×16, relative Frobenius error against exact references, tested):

    ==============  =========  =========  =========
    ‖A‖             10         100        1000
    ==============  =========  =========  =========
    generic          7e-16      6e-15      3e-14
    scipy            2e-15      3e-14      3e-12
    torch            3e-15      2e-14      2e-13
    ==============  =========  =========  =========
    """
    xp = array_namespace(A=A)
    _check_matrix(A, "A", xp, square=True)
    if not isinstance(max_squarings, int) or max_squarings < 0:
        raise ValueError(f"max_squarings must be a non-negative int, got {max_squarings!r}")
    native = _backend.fast_path("expm", xp, impl)
    if native is not None:
        out = native(A)
        if out is not NotImplemented:
            return out
    return _backend.compiled(_expm_generic, xp, "xp", "max_squarings")(A, xp=xp, max_squarings=max_squarings)


# --------------------------------------------------------------------------------------------
# Householder QR in compact-WY form
# --------------------------------------------------------------------------------------------


class HouseholderQR(NamedTuple):
    """Householder QR of a tall A (..., N, n) in compact-WY form.

    ``A = Q[:, :n] R`` with ``Q = H₁⋯Hₙ = I − V T Vᵀ``, where Hₖ = I − τₖ vₖ vₖᵀ (LAPACK's geqrf
    convention, vₖ[k] = 1), ``V`` (..., N, n) unit lower trapezoidal (a column whose reflector is the
    identity, τₖ = 0, has zero row and column k in T), ``T`` (..., n, n) upper triangular and ``R`` (..., n, n)
    upper triangular. Memory O(N·n); Q itself is never formed.
    """

    V: Array
    T: Array
    R: Array


def _geqrf_generic(A: Array, xp: Any) -> tuple[Array, Array, Array]:
    n = A.shape[-1]
    dev = _backend.device(A)
    R = A
    vs, taus = [], []
    for k in range(n):
        x = R[..., k:, k]
        alpha = x[..., 0]
        xnorm = xp.linalg.vector_norm(x[..., 1:], axis=-1)
        # LAPACK dlarfg: beta = -sign(alpha)·‖x‖; no reflection (tau = 0) when the tail is zero
        trivial = xnorm == 0
        beta = xp.where(trivial, alpha, -xp.copysign(xp.hypot(alpha, xnorm), alpha))
        tau = xp.where(trivial, xp.zeros_like(alpha), (beta - alpha) / xp.where(trivial, 1.0, beta))
        denom = xp.where(trivial, xp.ones_like(alpha), alpha - beta)
        v = xp.concat([xp.ones_like(x[..., :1]), x[..., 1:] / denom[..., None]], axis=-1)
        sub = R[..., k:, k:]
        w = xp.matmul(v[..., None, :], sub)  # (..., 1, n-k) = vᵀ R
        sub = sub - tau[..., None, None] * (v[..., :, None] * w)
        # copy on the first write: R starts as the caller's A, which must not be modified
        R = xpx.at(R)[..., k:, k:].set(sub, copy=True if k == 0 else None)
        pad = xp.zeros((*v.shape[:-1], k), dtype=A.dtype, device=dev)
        vs.append(xp.concat([pad, v], axis=-1))
        taus.append(tau)
    V = xp.stack(vs, axis=-1)
    tau = xp.stack(taus, axis=-1)
    return V, tau, xp.triu(R[..., :n, :])


def _compact_wy(V: Array, tau: Array, xp: Any) -> tuple[Array, Array]:
    """(V, T) of the compact-WY form Q = H₁⋯Hₙ = I − V T Vᵀ, via the UT transform.

    T⁻¹ = diag(1/τ) + striu(VᵀV) (Joffrain, Low, Quintana-Ortí, van de Geijn, Schreiber 2006). Where
    the backend has a triangular solver (torch, JAX), T is that inverse; elsewhere it is
    :func:`_t_factor_series`, a few n×n products instead of a general LU solve. A reflector with
    τₖ = 0 is the identity (LAPACK's choice when a column is already reduced): row and column k of T
    are then zero, so V T Vᵀ no longer sees vₖ, and T stays finite. All of this is n×n work.
    """
    G = _mT(V, xp) @ V
    native = _backend.fast_path("triu_inverse", xp)
    if native is None:
        return V, _t_factor_series(G, tau, xp)
    n = V.shape[-1]
    active = tau != 0
    keep = xp.astype(active, V.dtype)
    both = keep[..., :, None] * keep[..., None, :]
    inv_tau = xp.where(active, 1 / xp.where(active, tau, xp.ones_like(tau)), xp.ones_like(tau))
    # diag(1/τ) as a product with I: xpx.create_diagonal loops over batch elements, which unrolled
    # into 336 operations made jax.jit of the ViT's optimizer step compile for 20 s
    T_inv = xp.triu(G * both, k=1) + inv_tau[..., None, :] * eye(n, V)
    return V, native(T_inv) * both


def _t_factor_series(G: Array, tau: Array, xp: Any) -> Array:
    """T = (diag(1/τ) + striu(G))⁻¹ = (I + M)⁻¹·diag(τ) with M = diag(τ)·striu(G), G = VᵀV.

    M is strictly upper triangular, hence nilpotent (Mⁿ = 0), and the Neumann series ends:
    (I + M)⁻¹ = Σ_{k<n} (−M)ᵏ = (I − M)(I + M²)(I + M⁴)⋯, ⌈log₂ n⌉ − 1 squarings and as many products
    (n = 4: one of each). τₖ = 0 zeroes row k of M and column k of T, and row k of (I + M)⁻¹ is eₖ, so
    T's row and column k are zero without masks. NumPy, 96 × 4×4 (the demo's ViT): 40 µs for VᵀV and
    T, against 114 µs with the LU solve (NumPy's batched solve runs in float64 per matrix); 336 × 7×7:
    0.33 against 0.79 ms; the error against float64 is the same (≈2e-7 in float32).
    """
    n = G.shape[-1]
    M = tau[..., :, None] * xp.triu(G, k=1)
    P = eye(n, G) - M
    power, covered = M, 2  # P = Σ_{k<covered} (−M)ᵏ
    while covered < n:
        power = power @ power
        P = P + P @ power
        covered *= 2
    return P * tau[..., None, :]


def householder_qr(A: Array, *, impl: str = "auto") -> HouseholderQR:
    """Householder QR of a tall stack A (..., N, n), N ≥ n, in compact-WY form.

    O(N·n²) time and O(N·n) memory. Native factorisations: ``torch.geqrf`` and NumPy's
    ``linalg.qr(mode="raw")``; the generic array-API path (used by JAX, CuPy and
    array-api-strict, or with ``impl="generic"``) performs the n reflections as batched
    rank-one updates. T comes from the UT transform (:func:`_compact_wy`) in both cases.
    """
    xp = array_namespace(A=A)
    _check_matrix(A, "A", xp)
    N, n = A.shape[-2], A.shape[-1]
    if n > N:
        raise ValueError(f"A must be tall (rows ≥ columns) for householder_qr, got shape {tuple(A.shape)}")
    native = _backend.fast_path("geqrf", xp, impl)
    out = native(A) if native is not None else NotImplemented
    if out is NotImplemented:
        out = _backend.compiled(_geqrf_generic, xp, "xp")(A, xp=xp)
    V, tau, R = out
    V, T = _backend.compiled(_compact_wy, xp, "xp")(V, tau, xp=xp)
    return HouseholderQR(V, T, R)


def householder_of_orthonormal(Y: Array) -> HouseholderQR:
    """The Householder QR Y = Q[:, :n]·R of a Y (..., N, n) with orthonormal columns, without factorising Y.

    For orthonormal Y the factor R is diagonal with entries S = ±1, and Y − [S; 0] = V·U with V the
    unit lower trapezoidal Householder vectors and U = −T V₁ᵀ S upper triangular: an LU factorisation
    without pivoting. Choosing each sₖ = −sign of the k-th pivot as the elimination reaches it (as
    geqrf chooses R's signs) makes every pivot |uₖₖ| ≥ 1, so the LU of the n×n top block Y₁ − S is
    stable; then V = [L; Y₂U⁻¹] (Ballard, Demmel, Grigori, Jacquelin, Knight, Nguyen, *Reconstructing
    Householder vectors from tall-skinny QR*, JPDC 2015; LAPACK's ``orhr_col``). Cost: n small
    rank-one updates of an n×n matrix, an n×n triangular inverse and one N×n×n product, against a
    QR of the N×n matrix (XLA's CPU QR of 4096×128: 6.5 ms, a product of that size 0.7 ms).

    The factors equal :func:`householder_qr`'s to rounding (tested), except where a column of Y is
    already reduced (±eₖ below the previous ones), for which geqrf takes the identity (τₖ = 0) and
    this takes the reflection, τₖ = 2: both are valid. τ is recomputed as 2/‖vₖ‖², so that Q is a
    product of exact reflectors, orthogonal to rounding whatever the orthonormality error of Y
    (λE = Q·E·S then equals Y up to that error, as for a QR of Y).

    Y must have orthonormal columns; this is not checked (a check reads a value to the host). For any
    other Y the returned Q is still orthogonal but Q[:, :n]·R is not Y: use :func:`householder_qr`.
    The n elimination steps are one ``lax.fori_loop`` on JAX and a Python loop of n batched steps
    elsewhere, which is why the optimizers use this on JAX only (see ``sections.householder_section``).
    """
    xp = array_namespace(Y=Y)
    _check_matrix(Y, "Y", xp)
    N, n = Y.shape[-2], Y.shape[-1]
    if n > N:
        raise ValueError(f"Y must be tall (rows ≥ columns) for householder_of_orthonormal, got shape {tuple(Y.shape)}")
    V, tau, signs = _backend.compiled(_reconstruct_householder, xp, "xp")(Y, xp=xp)
    V, T = _backend.compiled(_compact_wy, xp, "xp")(V, tau, xp=xp)
    return HouseholderQR(V, T, signs[..., None, :] * eye(n, Y))


def _reconstruct_householder(Y: Array, xp: Any) -> tuple[Array, Array, Array]:
    n = Y.shape[-1]
    idx = xp.arange(n, device=_backend.device(Y))
    one = xp.ones((), dtype=Y.dtype, device=_backend.device(Y))

    def eliminate(k: Any, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        # step k of the LU of Y₁ − S in place (L below the diagonal, U on and above), with masks rather
        # than indexing so that k may be traced (lax.fori_loop)
        A, s = carry
        e = xp.astype(idx == k, Y.dtype)
        after = xp.astype(idx > k, Y.dtype)
        col = xp.sum(A * e, axis=-1)  # A[:, k]
        row = xp.sum(A * e[:, None], axis=-2)  # A[k, :]
        a = xp.sum(col * e, axis=-1)  # the pivot before sₖ is subtracted
        sk = xp.where(a >= 0, -one, one)  # geqrf's sign: R[k, k] = −sign(a), sign(0) = +
        u = a - sk  # |u| = |a| + 1 ≥ 1
        low = col * after / u[..., None]  # the multipliers L[i, k], i > k
        A = A - low[..., :, None] * (row * after)[..., None, :]
        A = A + (low - col * after)[..., :, None] * e + (u - a)[..., None, None] * (e[:, None] * e)
        return A, s + sk[..., None] * e

    carry = (Y[..., :n, :], xp.zeros((*Y.shape[:-2], n), dtype=Y.dtype, device=_backend.device(Y)))
    A, s = _backend.static_loop(eliminate, carry, n, xp)
    U = xp.triu(A)
    V1 = xp.tril(A, k=-1) + eye(n, Y)
    native = _backend.fast_path("triu_inverse", xp)
    U_inv = native(U) if native is not None else xp.linalg.solve(U, xp.broadcast_to(eye(n, Y), U.shape))
    V = xp.concat([V1, Y[..., n:, :] @ U_inv], axis=-2) if Y.shape[-2] > n else V1
    return V, 2 / xp.sum(V * V, axis=-2), s


def _check_wy(V: Array, T: Array, X: Array, xp: Any) -> None:
    for name, a in (("V", V), ("T", T), ("X", X)):
        _check_matrix(a, name, xp)
    n = V.shape[-1]
    if T.shape[-2:] != (n, n):
        raise ValueError(f"T must be ({n}, {n}) to match V {tuple(V.shape)}, got {tuple(T.shape)}")
    if X.shape[-2] != V.shape[-2]:
        raise ValueError(f"X must have {V.shape[-2]} rows to match V {tuple(V.shape)}, got {tuple(X.shape)}")


def apply_q(V: Array, T: Array, X: Array) -> Array:
    """Q X = X − V (T (Vᵀ X)) for Q = I − V T Vᵀ, in O(N·n·k); X is (..., N, k)."""
    xp = array_namespace(V=V, T=T, X=X)
    _check_wy(V, T, X, xp)
    if V.shape[-1] == 0:  # no reflectors: Q = I
        return X
    return _backend.addmm(X, V, T @ (_mT(V, xp) @ X), xp, alpha=-1.0)


def apply_qt(V: Array, T: Array, X: Array) -> Array:
    """Qᵀ X = X − V (Tᵀ (Vᵀ X)) for Q = I − V T Vᵀ, in O(N·n·k); X is (..., N, k)."""
    xp = array_namespace(V=V, T=T, X=X)
    _check_wy(V, T, X, xp)
    if V.shape[-1] == 0:  # no reflectors: Q = I
        return X
    return _backend.addmm(X, V, _mT(T, xp) @ (_mT(V, xp) @ X), xp, alpha=-1.0)


# --------------------------------------------------------------------------------------------
# Matrix sign / polar factor and Muon's Newton–Schulz iteration
# --------------------------------------------------------------------------------------------


def _msign_eigh(X: Array, xp: Any) -> Array:
    # X (XᵀX)^{-1/2} on the range of XᵀX, zero on its null space; eigenvalues below
    # k·ε·λ_max are numerically zero singular values (they would otherwise be amplified noise).
    k = X.shape[-1]
    lam, V = xp.linalg.eigh(_mT(X, xp) @ X)
    tiny = k * xp.finfo(X.dtype).eps * xp.max(lam, axis=-1, keepdims=True)
    keep = lam > tiny
    inv_sqrt = xp.where(keep, 1 / xp.sqrt(xp.where(keep, lam, xp.ones_like(lam))), xp.zeros_like(lam))
    # form the k×k factor first: one O(m·k²) product with X instead of two
    return X @ ((V * inv_sqrt[..., None, :]) @ _mT(V, xp))


def _polar_newton(Q: Array, R: Array, xp: Any, steps: int) -> Array:
    # polar(QR) = Q·polar(R). Newton's iteration Z ← ½(μZ + μ⁻¹Z⁻ᵀ) with Higham's Frobenius
    # scaling μ = (‖Z⁻¹‖_F/‖Z‖_F)^{1/2} converges quadratically from any non-singular R.
    k = R.shape[-1]
    eye_k = xp.broadcast_to(eye(k, R), R.shape)
    Z = R
    for _ in range(steps):
        Zinv_t = _mT(xp.linalg.solve(Z, eye_k), xp)
        nz = xp.linalg.matrix_norm(Z, ord="fro")
        ni = xp.linalg.matrix_norm(Zinv_t, ord="fro")
        mu = xp.sqrt(ni / nz)[..., None, None]
        Z = (mu * Z + Zinv_t / mu) / 2
    return Q @ Z


def msign(X: Array) -> Array:
    """Matrix sign msign(X) = U Vᵀ of X = U Σ Vᵀ (thin SVD), zero singular values mapped to zero.

    Computed from the k×k Gram matrix: XᵀX = V Λ Vᵀ (``eigh``), msign(X) = X V Λ^{-1/2} Vᵀ, with
    eigenvalues λ ≤ k·ε·λ_max treated as zero (their columns are dropped). For rank-deficient X the
    result is therefore the partial isometry U₊V₊ᵀ on the numerical range of X (the convention of
    Muon, whose Newton–Schulz iteration also sends zero singular values to zero); a zero row of X
    gives an exactly zero row of msign(X).

    Cost: one k×k ``eigh`` and O(m·k²) matmuls — the cheapest exact route for tall matrices.
    Accuracy: forming XᵀX squares the condition number, so the error is ≈ ε·κ(X)²; measured
    (float64, 49×7, against the exact U Vᵀ): 3e-16 at κ = 1, 6e-14 at κ = 1e2, 3e-10 at κ = 1e4,
    0.3 (useless) at κ = 1e8.
    Use :func:`polar` (Newton's iteration, error ≈ ε·κ) for ill-conditioned full-rank inputs.
    """
    xp = array_namespace(X=X)
    _check_matrix(X, "X", xp)
    if X.shape[-2] < X.shape[-1]:
        return _mT(msign(_mT(X, xp)), xp)
    return _backend.compiled(_msign_eigh, xp, "xp")(X, xp=xp)


def polar(X: Array, *, method: str = "newton", steps: int = 12) -> Array:
    """Orthogonal polar factor U Vᵀ of X = U Σ Vᵀ (..., m, k), so that X = (U Vᵀ)(V Σ Vᵀ).

    ``method="newton"`` (default): reduced QR X = QR, then Newton's iteration
    Z ← ½(μZ + μ⁻¹Z⁻ᵀ) on the k×k factor R with the Frobenius scaling
    μ = (‖Z⁻¹‖_F/‖Z‖_F)^{1/2} (Higham, "Computing the polar decomposition — with applications",
    1986; *Functions of Matrices*, §8.6), ``steps`` times; polar(X) = Q·Z. Quadratic convergence
    from any non-singular R: 12 steps reach double precision for κ(X) up to ≈ 1e15 (extra steps
    are harmless once Z is orthogonal, μ = 1). It is the accurate route: its error grows like ε·κ
    while the Gram-matrix route (:func:`msign`, ``method="eigh"``) grows like ε·κ² (ε·κ is the
    conditioning of the polar factor itself, so no method does better). Measured (float64, 49×7,
    X = U diag(logspace(0, −log₁₀κ)) Vᵀ against the exact U Vᵀ, max abs error):

    =========  ==========  ==========
    κ(X)       newton      eigh
    =========  ==========  ==========
    1          2e-16       3e-16
    1e2        3e-15       6e-14
    1e4        1e-13       3e-10
    1e8        1e-9        3e-1
    1e12       7e-6        3e-1
    =========  ==========  ==========

    Rank-deficient X (some σᵢ ≤ k·ε·σ_max, i.e. R numerically singular): the polar factor is not
    unique and Newton's iteration would divide by zero; those batch elements return
    :func:`msign` instead (the partial isometry on the range of X, exact zeros elsewhere), chosen
    elementwise with ``where`` so that batches and ``jax.jit`` work.

    ``method="eigh"`` is :func:`msign` (one k×k eigendecomposition): exact to ε·κ², and the fast
    choice for well-conditioned inputs such as the retraction Y − t·A of a tangent A
    (singular values in [1, (1 + t²‖A‖₂²)^{1/2}]).

    Wide matrices (m < k) are handled through the transpose.
    """
    xp = array_namespace(X=X)
    _check_matrix(X, "X", xp)
    if method not in ("newton", "eigh"):
        raise ValueError(f"method must be 'newton' or 'eigh', got {method!r}")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if X.shape[-2] < X.shape[-1]:
        return _mT(polar(_mT(X, xp), method=method, steps=steps), xp)
    if method == "eigh":
        return msign(X)
    return _backend.compiled(_polar_generic, xp, "xp", "steps")(X, xp=xp, steps=steps)


def _polar_generic(X: Array, xp: Any, steps: int) -> Array:
    k = X.shape[-1]
    Q, R = xp.linalg.qr(X)
    d = xp.abs(xp.linalg.diagonal(R))
    dmax = xp.max(d, axis=-1)
    # |diag R| bounds σ_min from above, so a tiny diagonal entry flags numerical rank deficiency
    singular = xp.min(d, axis=-1) <= k * xp.finfo(X.dtype).eps * dmax
    safe = xp.where(singular[..., None, None], xp.broadcast_to(eye(k, X), R.shape), R)
    newton = _polar_newton(Q, safe, xp, steps)
    return xp.where(singular[..., None, None], _msign_eigh(X, xp), newton)


def newton_schulz(
    X: Array,
    steps: int = 5,
    coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
    eps: float = 1e-7,
) -> Array:
    """Muon's quintic Newton–Schulz iteration, an approximate msign(X) (Jordan et al., "Muon: an
    optimizer for hidden layers in neural networks", 2024), exactly as ``torch.optim.Muon`` runs it.

    A wide orientation is used (tall X is transposed, and the result transposed back); X is divided by
    max(‖X‖_F, eps) so that ‖X‖₂ ≤ 1; then ``steps`` times, with (a, b, c) = ``coefficients``,

        S = X Xᵀ,   X ← a X + (b S + c S²) X,

    i.e. X ← p(X) with p(σ) = aσ + bσ³ + cσ⁵ on each singular value. The default coefficients
    maximise the slope at zero; the result is U S' Vᵀ with S'ᵢᵢ roughly in [0.7, 1.2] after five
    steps, not the exact msign (use :func:`msign`/:func:`polar` for that). Batched over leading
    dimensions; runs in the dtype of X (cast first for a bfloat16 iteration).
    """
    xp = array_namespace(X=X)
    if not xp.isdtype(X.dtype, "real floating"):
        raise TypeError(f"X must have a real floating dtype, got {X.dtype}")
    if X.ndim < 2:
        raise ValueError(f"X must have at least 2 dimensions (..., rows, cols), got shape {tuple(X.shape)}")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if len(coefficients) != 3:
        raise ValueError(f"coefficients must be three numbers (a, b, c), got {coefficients!r}")
    a, b, c = (float(v) for v in coefficients)
    return _backend.compiled(_newton_schulz, xp, "xp", "steps", "a", "b", "c", "eps")(
        X, xp=xp, steps=steps, a=a, b=b, c=c, eps=float(eps)
    )


def _newton_schulz(X: Array, xp: Any, steps: int, a: float, b: float, c: float, eps: float) -> Array:
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = _mT(X, xp)
    norm = xp.linalg.matrix_norm(X, ord="fro")[..., None, None]
    X = X / xp.clip(norm, min=eps)
    for _ in range(steps):
        S = X @ _mT(X, xp)
        X = a * X + (b * S + c * (S @ S)) @ X
    return _mT(X, xp) if tall else X
