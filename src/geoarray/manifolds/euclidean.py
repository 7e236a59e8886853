"""The vector space R^{shape} as a (trivially) homogeneous space.

Algorithm 1 specialises to ordinary first-order optimisation (paper, section 2): rgrad and the lift
are identities and the retraction is addition. Euclidean weights therefore take the same code path
through the optimizer as manifold weights: the section of a point Y is Y itself (a translation),
``global_rep`` returns Δ, ``retraction`` returns W, and ``apply_section(Y, W) = Y + W``.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _backend
from .. import random as _random
from .base import Manifold, check_batch_shape

__all__ = ["Euclidean"]

from .._typing import Array


class Euclidean(Manifold):
    """A vector space of arrays of any shape (the default for unconstrained weights)."""

    point_shape = None
    is_vector_space = True
    has_nearest_point = True
    validate = False
    section_strategies = ("householder", "transported", "random")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Euclidean)

    def __hash__(self) -> int:
        return hash(Euclidean)

    def __repr__(self) -> str:
        return "Euclidean()"

    def _random_point(
        self, seed: Any, *, xp: Any, batch_shape: tuple[int, ...] = (), dtype: Any = None, device: Any = None
    ) -> Array:
        """Standard normal entries of shape ``batch_shape``."""
        return _random.normal(seed, check_batch_shape(batch_shape), xp=xp, dtype=dtype, device=device)

    def is_point(self, Y: Array, atol: float | None = None) -> bool:
        xp = self._namespace(Y=Y)
        return bool(xp.all(xp.isfinite(Y)))

    def point_error(self, Y: Array) -> float:
        """0 for finite Y (every finite array is a point), ∞ otherwise."""
        xp = self._namespace(Y=Y)
        return 0.0 if bool(xp.all(xp.isfinite(Y))) else math.inf

    def nearest_point(self, Y: Array) -> Array:
        """Y itself, as a new array: a vector space is its own nearest point."""
        xp = self._namespace(Y=Y)
        return xp.asarray(Y, copy=True)

    def is_tangent(self, Y: Array, D: Array, atol: float | None = None) -> bool:
        xp = self._check_tangent_shape(Y, D, "D")
        return bool(xp.all(xp.isfinite(D)))

    def project(self, Y: Array, G: Array) -> Array:
        self._check_tangent_shape(Y, G, "G")
        return G

    def metric(self, Y: Array, D1: Array, D2: Array) -> Array:
        """⟨Δ₁, Δ₂⟩ = Σ Δ₁ ⊙ Δ₂ over all axes."""
        xp = self._check_tangent_shape(Y, D1, "D1")
        self._check_tangent_shape(Y, D2, "D2")
        return xp.sum(D1 * D2)

    def dist(self, x: Array, y: Array, *, keepdim: bool = False) -> Array:
        """geoopt's ``dist``: the geodesic distance ‖x − y‖ of the metric Σ Δ₁ ⊙ Δ₂, over every axis (one
        value, like :meth:`metric`; with ``keepdim`` shaped as size-1 axes of x's rank)."""
        xp = self._check_tangent_shape(x, y, "y")
        d = x - y
        return self._keepdim(xp.sqrt(xp.sum(d * d)), x, keepdim)

    def rgrad(self, Y: Array, dL: Array) -> Array:
        self._check_tangent_shape(Y, dL, "dL")
        return dL

    def global_section(self, Y: Array, *, strategy: str | None = None, seed: Any = None) -> Array:
        """The translation by Y: every section strategy is the same on a vector space."""
        self._namespace(Y=Y)
        return Y

    def global_rep(self, lam: Array, D: Array) -> Array:
        self._check_tangent_shape(lam, D, "D")
        return D

    def retraction(self, W: Array, method: str | None = None) -> Array:
        _backend.check_real_floating(W, "W")
        return W

    def apply_section(self, lam: Array, X: Array) -> Array:
        """Y + X: the retraction of a vector space is addition."""
        self._check_tangent_shape(lam, X, "X")
        return lam + X
