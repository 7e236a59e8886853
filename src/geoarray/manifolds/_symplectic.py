"""Coordinates of R^{2K} = (q₁…q_K, p₁…p_K) for the symplectic manifolds: 𝕁, the symplectic inverse,
row blocks and the projection onto sp(2n). Rows of a (..., 2K, k) array are the q rows, then the p rows.
"""

from __future__ import annotations

from typing import Any

from .._typing import Array


def j_times(X: Array, xp: Any) -> Array:
    """𝕁X for X (..., 2K, k): (q, p) ↦ (p, −q)."""
    K = X.shape[-2] // 2
    return xp.concat([X[..., K:, :], -X[..., :K, :]], axis=-2)


def jt_times(X: Array, xp: Any) -> Array:
    """𝕁ᵀX: (q, p) ↦ (−p, q)."""
    K = X.shape[-2] // 2
    return xp.concat([-X[..., K:, :], X[..., :K, :]], axis=-2)


def symplectic_inverse(Y: Array, xp: Any) -> Array:
    """Y⁺ = 𝕁ᵀYᵀ𝕁 for Y (..., 2K, 2k): (..., 2k, 2K)."""
    return jt_times(xp.matrix_transpose(jt_times(Y, xp)), xp)


def rows(X: Array, lo: int, hi: int, xp: Any) -> Array:
    """Rows (q_lo…q_hi, p_lo…p_hi) (0-based, hi exclusive) of X (..., 2K, k)."""
    K = X.shape[-2] // 2
    return xp.concat([X[..., lo:hi, :], X[..., K + lo : K + hi, :]], axis=-2)


def stack_rows(parts: list[Array], xp: Any) -> Array:
    """Inverse of :func:`rows`: interleave the q halves, then the p halves, of consecutive blocks."""
    qs = [P[..., : P.shape[-2] // 2, :] for P in parts]
    ps = [P[..., P.shape[-2] // 2 :, :] for P in parts]
    return xp.concat(qs + ps, axis=-2)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Broadcast batch shapes (static Python tuples)."""
    ndim = max(len(s) for s in shapes)
    out = []
    for dims in zip(*((1,) * (ndim - len(s)) + tuple(s) for s in shapes), strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError(f"batch shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def hamiltonian_blocks(A: Array, xp: Any) -> tuple[Array, Array, Array]:
    """Frobenius projection ½(A − A⁺) of A (..., 2n, 2n) onto sp(2n), as its blocks.

    sp(2n) = {[[A₁₁, A₁₂], [A₂₁, −A₁₁ᵀ]] : A₁₂ = A₁₂ᵀ, A₂₁ = A₂₁ᵀ}.
    """
    n = A.shape[-1] // 2
    mT = xp.matrix_transpose
    A11 = (A[..., :n, :n] - mT(A[..., n:, n:])) / 2
    A12 = (A[..., :n, n:] + mT(A[..., :n, n:])) / 2
    A21 = (A[..., n:, :n] + mT(A[..., n:, :n])) / 2
    return A11, A12, A21
