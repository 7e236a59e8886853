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
``householder_block_reflector``
    The same Q for orthonormal columns as one block reflector I − W M Wᵀ with W = Y − E·S, from
    matrix products and elementwise operations only (no QR, LU or triangular solve).
``solve``, ``solve_vectors``
    Batched linear solves, with the stacked-vector rule of the standard made explicit.
``msign``, ``polar``, ``newton_schulz``
    The orthogonal polar factor U Vᵀ (exact, through the Gram matrix or Newton's iteration) and
    Muon's quintic Newton–Schulz approximation of it.

One module per concept: :mod:`.basic` (identity, skew/sym, solves, Cayley), :mod:`.expm`,
:mod:`.householder` (compact-WY QR and its reconstruction from orthonormal columns), :mod:`.polar`
(msign, polar, Newton–Schulz); everything is re-exported here.
"""

from __future__ import annotations

from .basic import cayley, eye, skew, solve, solve_vectors, sym
from .expm import expm
from .householder import (  # noqa: F401  (_t_factor_series: tests)
    BlockReflector,
    HouseholderQR,
    _t_factor_series,
    apply_q,
    apply_qt,
    householder_block_reflector,
    householder_of_orthonormal,
    householder_qr,
)
from .polar import msign, newton_schulz, polar

__all__ = [
    "BlockReflector",
    "HouseholderQR",
    "apply_q",
    "apply_qt",
    "cayley",
    "expm",
    "eye",
    "householder_block_reflector",
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
