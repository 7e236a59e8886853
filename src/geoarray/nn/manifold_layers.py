"""Linear layers whose weight is a point of the Stiefel or the Grassmann manifold.

Both are pointwise on the last axis of x (..., d); leading axes (batch, and time for a sequence
(..., T, d), the transpose of the papers' d × T matrices) are vectorised, and the gradient of Y is
summed over them. The Euclidean gradient returned by the pullback is what an optimizer turns into
a Riemannian one (``manifolds()`` names the manifold), so Y stays on the manifold during training.
"""

from __future__ import annotations

from typing import Any

from ..manifolds import Grassmann, Stiefel
from ._checks import check_cotangent, check_input, check_params, check_size, sum_outer
from .base import Layer

__all__ = ["GrassmannLayer", "StiefelLayer"]

from .._typing import Array


class _FrameLayer(Layer):
    manifold_type: type = Stiefel

    def __init__(self, N: int, n: int):
        self.N = check_size(N, "N")
        self.n = check_size(n, "n")
        # the manifold validates n ≤ N with a message naming both
        self._manifold = self.manifold_type(self.N, self.n)

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict[str, Array]:
        """Y drawn uniformly (Haar) on the manifold: QR of a Gaussian N×n matrix (Algorithm 3)."""
        return {"Y": self._manifold.random(seed, xp=xp, dtype=dtype, device=device)}

    def manifolds(self) -> dict[str, Any]:
        return {"Y": self._manifold}


class StiefelLayer(_FrameLayer):
    """:math:`x \\mapsto Yx` with
    :math:`Y \\in \\mathrm{St}(N, n) = \\{Y \\in \\mathbb R^{N\\times n} : Y^\\top Y = I\\}`: an isometric embedding
    :math:`\\mathbb R^n \\to \\mathbb R^N`.

    ``transpose=True`` gives the adjoint x ↦ Yᵀx, R^N → R^n: the coordinates of x in the frame Y
    (the form the paper's attention projections W_iᵀX take). Either way ‖Yx‖ = ‖x‖ and ‖Yᵀx‖ ≤ ‖x‖.
    Row form on x (..., n): y = x Yᵀ (resp. y = x Y on x (..., N)). ``params = {"Y": (N, n)}``,
    ``manifolds() = {"Y": Stiefel(N, n)}``.
    """

    manifold_type = Stiefel

    def __init__(self, N: int, n: int, *, transpose: bool = False):
        super().__init__(N, n)
        self.transpose = bool(transpose)

    def _forward(self, params: Any, x: Array) -> tuple[Any, Array]:
        check_params(self, params, {"Y": (self.N, self.n)})
        xp = check_input(self, x, self.N if self.transpose else self.n, params=params)
        Y = params["Y"]
        return xp, (x @ Y if self.transpose else x @ xp.matrix_transpose(Y))

    def apply(self, params: Any, x: Array) -> Array:
        return self._forward(params, x)[1]

    def vjp(self, params: Any, x: Array):
        xp, y = self._forward(params, x)
        Y = params["Y"]

        def pullback(dy: Array) -> tuple[dict[str, Array], Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            if self.transpose:
                return {"Y": sum_outer(x, dy, xp)}, dy @ xp.matrix_transpose(Y)
            return {"Y": sum_outer(dy, x, xp)}, dy @ Y

        return y, pullback


class GrassmannLayer(_FrameLayer):
    """x ↦ Y Yᵀ x, the orthogonal projection of R^N onto the subspace span(Y) ∈ Gr(N, n).

    A Grassmann point is a subspace, represented by any orthonormal basis Y (N×n); Y Yᵀ does not
    change under Y ↦ YO for orthogonal O, so the layer is a function of the subspace alone (unlike
    x ↦ Yx, which depends on the basis). Output in R^N, idempotent. Row form on x (..., N):
    y = x Y Yᵀ. ``params = {"Y": (N, n)}``, ``manifolds() = {"Y": Grassmann(N, n)}``. Because of
    that invariance the Euclidean gradient G = xᵀ(dy Y) + dyᵀ(x Y) has YᵀG symmetric (no component
    along the rotations YΩ, Ω skew); its part Y·YᵀG does not move the subspace and the Grassmann
    rgrad (I − YYᵀ)G removes it.
    """

    manifold_type = Grassmann

    def _forward(self, params: Any, x: Array) -> tuple[Any, Array, Array]:
        check_params(self, params, {"Y": (self.N, self.n)})
        xp = check_input(self, x, self.N, params=params)
        Y = params["Y"]
        c = x @ Y  # coordinates in the basis
        return xp, c, c @ xp.matrix_transpose(Y)

    def apply(self, params: Any, x: Array) -> Array:
        return self._forward(params, x)[2]

    def vjp(self, params: Any, x: Array):
        xp, c, y = self._forward(params, x)
        Y = params["Y"]

        def pullback(dy: Array) -> tuple[dict[str, Array], Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            dc = dy @ Y
            dY = sum_outer(x, dc, xp) + sum_outer(dy, c, xp)
            return {"Y": dY}, dc @ xp.matrix_transpose(Y)

        return y, pullback
