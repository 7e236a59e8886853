"""The Grassmann manifold Gr(N, n) of n-dimensional subspaces of R^N, as O(N)/(O(n)×O(N−n)).

A subspace is represented by an orthonormal basis Y (N×n, YᵀY = I); the tangent space at Y is the
horizontal space {Δ : YᵀΔ = 0}. Compared with Stiefel:

* metric g_Y(Δ₁, Δ₂) = tr(Δ₁ᵀΔ₂) and rgrad(Y, ∇L) = (I − YYᵀ)∇L;
* Ω(Δ) = ΔYᵀ − YΔᵀ, so the global representation is [[0, −Bᵀ], [B, 0]] with B = Q⊥ᵀΔ: the
  A-block of the Stiefel case vanishes (:class:`~geoarray.manifolds.horizontal.GrassmannHorizontal`);
* the retraction is the Stiefel one with A = 0: exp(W)E through the same 2n×2n kernel.

Sections, random points and validation are those of the Stiefel manifold (the group is O(N) in both).
"""

from __future__ import annotations

from typing import Any

from .._backend import device as _device
from .horizontal import GrassmannHorizontal
from .sections import DenseSection, HouseholderSection
from .stiefel import OrthonormalFrames

__all__ = ["Grassmann"]

from .._typing import Array


class Grassmann(OrthonormalFrames):
    """Gr(N, n): n-dimensional subspaces of R^N, represented by orthonormal bases Y (N×n).

    Takes the same keywords as :class:`~geoarray.manifolds.Stiefel` (section strategy,
    retraction method, validation).
    """

    @property
    def dim(self) -> int:
        """Manifold dimension n(N − n)."""
        return self.n * (self.N - self.n)

    def is_tangent(self, Y: Array, D: Array, atol: float | None = None) -> bool:
        """YᵀΔ = 0 within atol (horizontal lift of a tangent vector)."""
        xp = self._check_tangent_shape(Y, D, "D")
        atol = self.default_atol(D.dtype, xp) if atol is None else atol
        return bool(xp.all(xp.abs(xp.matrix_transpose(Y) @ D) <= atol))

    def project(self, Y: Array, G: Array) -> Array:
        """(I − YYᵀ)G."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, G, "G")
        return G - Y @ (xp.matrix_transpose(Y) @ G)

    def metric(self, Y: Array, D1: Array, D2: Array) -> Array:
        """g_Y(Δ₁, Δ₂) = tr(Δ₁ᵀΔ₂), per batch element."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, D1, "D1")
        self._check_tangent_shape(Y, D2, "D2")
        return xp.sum(D1 * D2, axis=(-2, -1))

    def dist(self, x: Array, y: Array, *, keepdim: bool = False) -> Array:
        """The geodesic distance of the metric tr(Δ₁ᵀΔ₂) between span(x) and span(y): ‖θ‖₂ of the principal
        angles θ₁…θₙ ∈ [0, π/2] (Edelman, Arias, Smith, *The geometry of algorithms with orthogonality
        constraints*, SIAM J. Matrix Anal. Appl. 1998, §4.3), per point of a batch; geoopt's ``dist``.

        cos θ are the singular values of xᵀy and sin θ those of y − x(xᵀy); θ = atan2(sin θ, cos θ), the
        largest cosine with the smallest sine, is accurate at every angle, where arccos alone loses half
        the digits of a small angle (arccos(1 − ε) ≈ √(2ε)). It depends on the subspaces only: x·Q and
        y·R for orthogonal Q, R give the same distance."""
        xp = self._check_point(x, "x")
        self._check_point(y, "y")
        self._check_batch(x, "x", y, "y", 2)
        C = xp.matrix_transpose(x) @ y
        cos = xp.linalg.svdvals(C)  # descending
        sin = xp.flip(xp.linalg.svdvals(y - x @ C), axis=-1)  # ascending: paired with cos
        theta = xp.atan2(sin, cos)
        return self._keepdim(xp.sqrt(xp.sum(theta * theta, axis=-1)), x, keepdim)

    def rgrad(self, Y: Array, dL: Array) -> Array:
        """Riemannian gradient (I − YYᵀ)∇L."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, dL, "dL")
        return dL - Y @ (xp.matrix_transpose(Y) @ dL)

    def omega(self, Y: Array, D: Array) -> Array:
        """:math:`\\Omega(\\Delta) = \\Delta Y^\\top - Y\\Delta^\\top \\in \\mathfrak g^{\\mathrm{hor},Y}`, dense N×N:
        for tests and docs."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, D, "D")
        return D @ xp.matrix_transpose(Y) - Y @ xp.matrix_transpose(D)

    def global_rep(self, lam: HouseholderSection | DenseSection, D: Array) -> GrassmannHorizontal:
        """λ⁻¹Ω(Δ)λ = [[0, −Bᵀ], [B, 0]] with B = Q⊥ᵀΔ (eq. 11 with A = YᵀΔ = 0)."""
        self._check_tangent_shape(lam.Y, D, "D")
        return GrassmannHorizontal(lam.perp_t(D))

    def lift(self, Y: Array, lam: HouseholderSection | DenseSection, dL: Array) -> GrassmannHorizontal:
        """global_rep(λ, rgrad(Y, ∇L)) fused: Q⊥ᵀY = 0 gives B = Q⊥ᵀ(I − YYᵀ)∇L = Q⊥ᵀ∇L."""
        self._check_tangent_shape(Y, dL, "dL")
        return GrassmannHorizontal(lam.perp_t(dL))

    def _check_horizontal(self, W: Any, name: str = "W") -> Any:
        if not isinstance(W, GrassmannHorizontal):
            raise TypeError(f"{name} must be a GrassmannHorizontal for {self!r}, got {type(W).__name__}")
        xp = self._namespace(B=W.B)
        self._check_trailing(W.B, f"{name}.B", (self.N - self.n, self.n))
        return xp

    def _half_a(self, W: GrassmannHorizontal, xp: Any) -> Array:
        n = self.n
        return xp.zeros((*W.B.shape[:-2], n, n), dtype=W.B.dtype, device=_device(W.B))

    def spectral_direction(self, Y: Array, G: Array) -> Array:
        """A* = msign((I − YYᵀ)G): the spectral steepest horizontal direction (closed form); see
        :func:`geoarray.manifolds.spectral.grassmann_spectral_direction`."""
        from .spectral import grassmann_spectral_direction

        self._check_point(Y)
        return grassmann_spectral_direction(Y, G)
