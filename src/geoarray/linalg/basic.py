"""The basics: identity, skew/sym projections, batched solves and the Cayley transform."""

from __future__ import annotations

from typing import Any

from .. import _backend
from .._backend import array_namespace, check_real_floating
from .._typing import Array

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def check_matrix(A: Array, name: str, xp: Any, *, square: bool = False) -> None:
    check_real_floating(A, name, xp)
    if A.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (..., rows, cols), got shape {tuple(A.shape)}")
    if square and A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name} must be square in its last two axes, got shape {tuple(A.shape)}")


def eye(n: int, like: Array, m: int | None = None) -> Array:
    """Identity (n×m) with the namespace, dtype and device of ``like``; broadcasts over batches."""
    return _backend.eye(n, m, like, array_namespace(like))


def mT(A: Array, xp: Any) -> Array:
    return xp.matrix_transpose(A)


# --------------------------------------------------------------------------------------------
# projections
# --------------------------------------------------------------------------------------------


def skew(A: Array) -> Array:
    """Skew-symmetric part ½(A − Aᵀ) over the last two axes."""
    xp = array_namespace(A=A)
    check_matrix(A, "A", xp, square=True)
    return (A - mT(A, xp)) / 2


def sym(A: Array) -> Array:
    """Symmetric part ½(A + Aᵀ) over the last two axes."""
    xp = array_namespace(A=A)
    check_matrix(A, "A", xp, square=True)
    return (A + mT(A, xp)) / 2


# --------------------------------------------------------------------------------------------
# solves
# --------------------------------------------------------------------------------------------


def solve(A: Array, B: Array) -> Array:
    """X with A X = B for stacks of matrices: A (..., n, n), B (..., n, k)."""
    xp = array_namespace(A=A, B=B)
    check_matrix(A, "A", xp, square=True)
    check_matrix(B, "B", xp)
    if B.shape[-2] != A.shape[-1]:
        raise ValueError(f"B must have {A.shape[-1]} rows to match A {tuple(A.shape)}, got {tuple(B.shape)}")
    return xp.linalg.solve(A, B)


def solve_vectors(A: Array, b: Array) -> Array:
    """x with A x = b for stacks of vectors: A (..., n, n), b (..., n).

    The array API treats the right-hand side of ``linalg.solve`` as a vector only when it is 1-D;
    a stack of vectors must be passed as a stack of one-column matrices: ``solve(A, b[..., None])[..., 0]``.
    """
    xp = array_namespace(A=A, b=b)
    check_matrix(A, "A", xp, square=True)
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
    A singular I + C (never for skew C, whose I + C has every singular value ≥ 1) gives non-finite entries
    on torch and JAX, which do not wait for the device to check it; NumPy (and CuPy, while synchronisation
    is allowed) raises ``LinAlgError``.
    """
    xp = array_namespace(C=C)
    check_matrix(C, "C", xp, square=True)
    eye_n = eye(C.shape[-1], C)
    return _backend.solve(eye_n + C, eye_n - C, xp)
