"""Householder QR of tall matrices in compact-WY form Q = I − V T Vᵀ, applied without forming Q."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .. import _backend
from .._backend import array_namespace
from .._typing import Array
from .basic import check_matrix, eye, mT

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
    """LAPACK's geqrf by n batched rank-one updates (dlarfg, then dlarf), for backends without a native one
    (array-api-strict, CuPy; JAX compiles it). The optimizers' Householder section runs it at every step
    there, so it spends few array operations per column: it updates the trailing block B (rows and
    columns k on) and keeps its first row as R's row k, so nothing is written into an array (JAX's are
    immutable, and the copy and index checks of a functional update cost more than the update on
    array-api-strict), and it adds axes by ``expand_dims`` rather than by indexing, which array-api-strict
    validates at ~6× the cost (``a[..., None, :]`` 31 µs against ``expand_dims`` 5 µs, an addition 7 µs)."""
    *batch, _, n = A.shape
    dev = _backend.device(A)
    one = xp.ones((*batch, 1), dtype=A.dtype, device=dev)
    B = A
    vs, taus, rows = [], [], []
    for k in range(n):
        alpha, tail = B[..., 0, 0], B[..., 1:, 0]
        xnorm = xp.linalg.vector_norm(tail, axis=-1)
        # LAPACK's dlarfg with s = −beta = sign(alpha)·‖x‖: tau = (alpha + s)/s, v = [1, tail/(alpha + s)]; no
        # reflection (tau = 0, v = e₁) where the tail is zero, where the divisions take 1 and ∞ (no 0/0)
        trivial = xnorm == 0
        s = xp.copysign(xp.hypot(alpha, xnorm), alpha)
        d = xp.where(trivial, 1.0, alpha + s)
        tau = d / xp.where(trivial, math.inf, s)
        v = xp.concat([one, tail / xp.expand_dims(d, axis=-1)], axis=-1)
        w = xp.matmul(xp.expand_dims(v, axis=-2), B)  # (..., 1, n-k) = vᵀ B
        B = B - xp.reshape(tau, (*batch, 1, 1)) * (xp.expand_dims(v, axis=-1) * w)
        zeros = xp.zeros((*batch, k), dtype=A.dtype, device=dev)
        vs.append(xp.concat([zeros, v], axis=-1))
        rows.append(xp.concat([zeros, B[..., 0, :]], axis=-1))
        taus.append(tau)
        B = B[..., 1:, 1:]
    return xp.stack(vs, axis=-1), xp.stack(taus, axis=-1), xp.stack(rows, axis=-2)


def _compact_wy(V: Array, tau: Array, xp: Any) -> tuple[Array, Array]:
    """(V, T) of the compact-WY form Q = H₁⋯Hₙ = I − V T Vᵀ, via the UT transform.

    T⁻¹ = diag(1/τ) + striu(VᵀV) (Joffrain, Low, Quintana-Ortí, van de Geijn, Schreiber 2006), that is
    T = (I + M)⁻¹·diag(τ) with M = diag(τ)·striu(VᵀV): a unit upper triangular inverse, with no 1/τ. A
    reflector with τₖ = 0 is the identity (LAPACK's choice when a column is already reduced): row k of M
    is then zero, so row k of (I + M)⁻¹ is eₖ and row and column k of T are zero without masks; V T Vᵀ
    no longer sees vₖ. Where the backend has a triangular solver (torch, JAX) T is one unit triangular solve;
    elsewhere :func:`_t_factor_series`, a few n×n products instead of a general LU solve. All of this is
    n×n work.
    """
    G = mT(V, xp) @ V
    T = _backend.t_factor(G, tau, xp)  # torch, JAX: one unit triangular solve
    return V, _t_factor_series(tau[..., :, None] * xp.triu(G, k=1), tau, xp) if T is None else T


def _t_factor_series(M: Array, tau: Array, xp: Any) -> Array:
    """T = (I + M)⁻¹·diag(τ) for M = diag(τ)·striu(VᵀV) (:func:`_compact_wy`), without a solver.

    M is strictly upper triangular, hence nilpotent (Mⁿ = 0), and the Neumann series ends:
    (I + M)⁻¹ = Σ_{k<n} (−M)ᵏ = (I − M)(I + M²)(I + M⁴)⋯, ⌈log₂ n⌉ − 1 squarings and as many products
    (n = 4: one of each). τₖ = 0 zeroes row k of M and column k of T, and row k of (I + M)⁻¹ is eₖ, so
    T's row and column k are zero without masks. NumPy, 96 × 4×4 (the demo's ViT): 40 µs for VᵀV and
    T, against 114 µs with the LU solve (NumPy's batched solve runs in float64 per matrix); 336 × 7×7:
    0.33 against 0.79 ms; the error against float64 is the same (≈2e-7 in float32).
    """
    n = M.shape[-1]
    P = eye(n, M) - M
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
    check_matrix(A, "A", xp)
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
    geqrf chooses R's signs) makes every pivot ``|uₖₖ|`` ≥ 1, so the LU of the n×n top block Y₁ − S is
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
    check_matrix(Y, "Y", xp)
    N, n = Y.shape[-2], Y.shape[-1]
    if n > N:
        raise ValueError(f"Y must be tall (rows ≥ columns) for householder_of_orthonormal, got shape {tuple(Y.shape)}")
    V, tau, signs = _backend.compiled(_reconstruct_householder, xp, "xp")(Y, xp=xp)
    V, T = _backend.compiled(_compact_wy, xp, "xp")(V, tau, xp=xp)
    return HouseholderQR(V, T, signs[..., None, :] * eye(n, Y))


def _reconstruct_householder(Y: Array, xp: Any) -> tuple[Array, Array, Array]:
    n = Y.shape[-1]
    A, s = _signed_lu(Y[..., :n, :], xp)
    U = xp.triu(A)
    V1 = xp.tril(A, k=-1) + eye(n, Y)
    native = _backend.fast_path("triu_inverse", xp)
    U_inv = native(U) if native is not None else _backend.solve(U, xp.broadcast_to(eye(n, Y), U.shape), xp)
    V = xp.concat([V1, Y[..., n:, :] @ U_inv], axis=-2) if Y.shape[-2] > n else V1
    return V, 2 / xp.sum(V * V, axis=-2), s


def _signed_lu(Y1: Array, xp: Any) -> tuple[Array, Array]:
    """(A, s): the LU factorisation without pivoting Y₁ − diag(s) = V₁U of an orthonormal frame's top
    block, packed in A (V₁'s multipliers below the diagonal, U on and above), with each sₖ = −sign of the
    k-th pivot as the elimination reaches it (geqrf's choice of R's signs, sign(0) = +), so that every
    ``|uₖₖ|`` = ``|pivot|`` + 1 ≥ 1 (:func:`householder_of_orthonormal`).

    Elementwise steps only, no linear-algebra call. Where arrays take writes (eager NumPy, torch, CuPy,
    array-api-strict) step k writes its column of multipliers and updates the trailing block in place:
    a few operations on shrinking slices (36 × 64×64 in float32, torch's CPU eager, one thread: 7.2 ms, the
    time of some 300 small operations; the masked form below: 41 ms); on JAX one ``lax.fori_loop`` of
    masked steps."""
    if _backend.writable(xp):
        return _signed_lu_written(Y1, xp)
    return _signed_lu_masked(Y1, xp)


def _signed_lu_written(Y1: Array, xp: Any) -> tuple[Array, Array]:
    n = Y1.shape[-1]
    A = xp.asarray(Y1, copy=True)
    s = xp.empty(A.shape[:-1], dtype=A.dtype, device=_backend.device(A))
    one = xp.ones((), dtype=A.dtype, device=_backend.device(A))
    for k in range(n):
        a = A[..., k, k]
        sk = xp.where(a >= 0, -one, one)
        s[..., k] = sk
        u = a - sk  # |u| = |a| + 1 ≥ 1
        A[..., k, k] = u
        if k + 1 < n:
            low = A[..., k + 1 :, k] / u[..., None]
            A[..., k + 1 :, k] = low
            A[..., k + 1 :, k + 1 :] = A[..., k + 1 :, k + 1 :] - low[..., :, None] * A[..., k, None, k + 1 :]
    return A, s


def _signed_lu_masked(Y1: Array, xp: Any) -> tuple[Array, Array]:
    n = Y1.shape[-1]
    idx = xp.arange(n, device=_backend.device(Y1))
    one = xp.ones((), dtype=Y1.dtype, device=_backend.device(Y1))

    def eliminate(k: Any, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        # step k of the LU of Y₁ − S in place (L below the diagonal, U on and above), with masks rather
        # than indexing so that k may be traced (lax.fori_loop)
        A, s = carry
        e = xp.astype(idx == k, Y1.dtype)
        after = xp.astype(idx > k, Y1.dtype)
        col = xp.sum(A * e, axis=-1)  # A[:, k]
        row = xp.sum(A * e[:, None], axis=-2)  # A[k, :]
        a = xp.sum(col * e, axis=-1)  # the pivot before sₖ is subtracted
        sk = xp.where(a >= 0, -one, one)  # geqrf's sign: R[k, k] = −sign(a), sign(0) = +
        u = a - sk  # |u| = |a| + 1 ≥ 1
        low = col * after / u[..., None]  # the multipliers L[i, k], i > k
        A = A - low[..., :, None] * (row * after)[..., None, :]
        A = A + (low - col * after)[..., :, None] * e + (u - a)[..., None, None] * (e[:, None] * e)
        return A, s + sk[..., None] * e

    carry = (Y1, xp.zeros(Y1.shape[:-1], dtype=Y1.dtype, device=_backend.device(Y1)))
    return _backend.static_loop(eliminate, carry, n, xp)


class BlockReflector(NamedTuple):
    """The Householder Q of an orthonormal Y (..., N, n) as one block reflector (Schreiber and Parlett,
    *Block reflectors: theory and computation*, SIAM J. Numer. Anal. 25, 1988):

        Q = I − W M Wᵀ,   W = Y − E·S,   M = (I − Y₁ᵀS)⁻¹,

    with E the first n columns of the identity, Y₁ the top n×n block of Y and S = diag(``signs``) the
    signs of geqrf's R (Q·E·S = Y). W is Y with S subtracted from its top block, so Q is applied with
    products by Y itself: nothing of size N×n is stored besides Y (``M`` is (..., n, n))."""

    M: Array
    signs: Array


def householder_block_reflector(Y: Array) -> BlockReflector:
    """Householder's Q of a Y (..., N, n) with orthonormal columns as Q = I − W M Wᵀ, W = Y − E·S, computed
    with matrix products and elementwise operations only: no QR, LU, triangular solve or inverse call
    (the GEMM-only route of issue #52, for accelerators whose batched QR of many small frames runs frame
    by frame).

    Derivation. Householder QR of an orthonormal Y has R = S = diag(±1) and Y − E·S = V·U, V the unit
    lower trapezoidal reflectors and U upper triangular (:func:`householder_of_orthonormal`). With
    Q = I − V T Vᵀ and V = W U⁻¹, Q = I − W (U⁻¹ T U⁻ᵀ) Wᵀ, and Q·E·S = Y forces U⁻¹ T U⁻ᵀ =
    (I − Y₁ᵀS)⁻¹ = −S V₁⁻ᵀ U⁻ᵀ. So the section needs S and two n×n triangular inverses, from the
    signed LU Y₁ − S = V₁U of the top block (``_signed_lu``: elementwise steps, geqrf's signs,
    pivots ≥ 1) and ``_triu_inverse_by_products`` (⌈log₂ n⌉ doublings of two n×n products each).

    Y's drift from orthonormality. M is then refined to the inverse of C = I − Y₁ᵀS + ½(YᵀY − I) by two
    Newton steps M ← M(2I − CM): C + Cᵀ = WᵀW for any Y, which makes Q orthogonal to rounding (to the
    fourth power of the drift) whatever Y's drift, as a QR of Y keeps it; for an orthonormal Y, C is
    I − Y₁ᵀS and nothing changes. Cost: YᵀY (one N×n×n product) and n×n work. The section equals
    :func:`householder_qr`'s (the Q⊥ columns of ``Q``) to rounding, including the columns that geqrf
    leaves unreflected (τₖ = 0), whose reflection here only flips a column of Q that S flips back. A pivot
    of −0.0 counts as +0, as MKL's geqrf (torch's) takes it; OpenBLAS's LAPACK (NumPy's, JAX's) takes the
    zero's sign, so for such frames (±eₖ columns) the two QRs' sections differ, each valid; so may a QR's and
    this where a pivot lies within rounding of zero (the sign is then a coin that rounding tosses, as it is
    between two QR implementations).
    Y must have orthonormal columns up to a drift of, say, 1e-3 (not checked: a check reads to the host).
    """
    xp = array_namespace(Y=Y)
    check_matrix(Y, "Y", xp)
    N, n = Y.shape[-2], Y.shape[-1]
    if n > N:
        raise ValueError(f"Y must be tall (rows ≥ columns) for householder_block_reflector, got shape {tuple(Y.shape)}")
    M, signs = _backend.compiled(_block_reflector, xp, "xp")(Y, xp=xp)
    return BlockReflector(M, signs)


def _block_reflector(Y: Array, xp: Any) -> tuple[Array, Array]:
    n = Y.shape[-1]
    A, s = _signed_lu(Y[..., :n, :], xp)
    I = eye(n, Y)
    U_inv = _triu_inverse_by_products(xp.triu(A), xp)
    V1_inv_t = _triu_inverse_by_products(mT(xp.tril(A, k=-1), xp) + I, xp)
    M = -s[..., :, None] * (V1_inv_t @ mT(U_inv, xp))  # (I − Y₁ᵀS)⁻¹
    # C = I − Y₁ᵀS + ½(YᵀY − I) = M₀⁻¹ + ½(YᵀY − I): C + Cᵀ = WᵀW exactly, so Q is orthogonal
    C = I - mT(Y[..., :n, :], xp) * s[..., None, :] + 0.5 * (mT(Y, xp) @ Y - I)
    for _ in range(2):
        M = M + M @ (I - C @ M)
    return M, s


def _triu_inverse_by_products(U: Array, xp: Any) -> Array:
    """U⁻¹ for an upper triangular U (..., n, n) with a nonzero diagonal, by matrix products only.

    The block recursion of LAPACK's trtri, run bottom-up on all diagonal blocks at once: the inverses of
    the b×b diagonal blocks pair up into those of the 2b×2b blocks, [[A, B], [0, C]]⁻¹ =
    [[A⁻¹, −A⁻¹BC⁻¹], [0, C⁻¹]], two batched b×b products per pair; ⌈log₂ n⌉ doublings from the
    reciprocals of the diagonal. n is padded to a power of two with an identity block (whose inverse it
    is). Work ∑ n·b² ≈ n³/3, in a few batched GEMMs on any backend; its rounding errors are trtri's."""
    n = U.shape[-1]
    batch = tuple(U.shape[:-2])
    nb = len(batch)
    size = 1 << (n - 1).bit_length()
    if size != n:  # [[U, 0], [0, I]]
        dev = _backend.device(U)
        pad = size - n
        right = xp.zeros((*batch, n, pad), dtype=U.dtype, device=dev)
        corner = xp.broadcast_to(eye(pad, U), (*batch, pad, pad))
        low = xp.concat([xp.zeros((*batch, pad, n), dtype=U.dtype, device=dev), corner], axis=-1)
        U = xp.concat([xp.concat([U, right], axis=-1), low], axis=-2)
    blocks = xp.reshape(1 / xp.linalg.diagonal(U), (*batch, size, 1, 1))
    axes = tuple(range(nb))
    b = 1
    while b < size:
        half = size // (2 * b)
        # B of pair r: rows [2rb, 2rb + b), columns [(2r + 1)b, (2r + 2)b): a diagonal over the pairs
        pairs = xp.reshape(U, (*batch, half, 2, b, half, 2, b))[..., :, 0, :, :, 1, :]
        B = xp.linalg.diagonal(xp.permute_dims(pairs, (*axes, nb + 1, nb + 3, nb, nb + 2)))
        B = xp.permute_dims(B, (*axes, nb + 2, nb, nb + 1))  # (..., half, b, b)
        A_inv, C_inv = blocks[..., 0::2, :, :], blocks[..., 1::2, :, :]
        top = xp.concat([A_inv, -(A_inv @ (B @ C_inv))], axis=-1)
        blocks = xp.concat([top, xp.concat([xp.zeros_like(C_inv), C_inv], axis=-1)], axis=-2)
        b *= 2
    return blocks[..., 0, :n, :n]


def _check_wy(V: Array, T: Array, X: Array, xp: Any) -> None:
    for name, a in (("V", V), ("T", T), ("X", X)):
        check_matrix(a, name, xp)
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
    return _backend.addmm(X, V, T @ (mT(V, xp) @ X), xp, alpha=-1.0)


def apply_qt(V: Array, T: Array, X: Array) -> Array:
    """Qᵀ X = X − V (Tᵀ (Vᵀ X)) for Q = I − V T Vᵀ, in O(N·n·k); X is (..., N, k)."""
    xp = array_namespace(V=V, T=T, X=X)
    _check_wy(V, T, X, xp)
    if V.shape[-1] == 0:  # no reflectors: Q = I
        return X
    return _backend.addmm(X, V, mT(T, xp) @ (mT(V, xp) @ X), xp, alpha=-1.0)
