"""Pointwise affine layers: Dense x ↦ σ(Wx + b) and the ResNet layer x ↦ x + σ(Wx + b) (eq. 15).

Both act on the last axis of ``x`` (..., d) and treat every leading axis as a batch axis, so a
sequence (..., T, d) is transformed column by column of the papers' d × T matrix (the papers write a
sequence as d × T; geoarray stores its transpose, time then features). In row form the layers
compute x Wᵀ + b on each row; parameter gradients are summed over all leading axes in one matrix
product over the flattened batch.
"""

from __future__ import annotations

from typing import Any

from ._checks import check_cotangent, check_input, check_params, check_size, glorot_uniform, sum_lead, sum_outer, zeros
from .activations import get_activation
from .base import Layer

__all__ = ["Dense", "ResNetLayer"]

from .._typing import Array


class _Affine(Layer):
    """σ(Wx + b) with its pullback; Dense and ResNetLayer add the residual or not."""

    residual = False

    def __init__(self, in_dim: int, out_dim: int, activation: Any, use_bias: bool):
        self.in_dim = check_size(in_dim, "in_dim")
        self.out_dim = check_size(out_dim, "out_dim")
        self.activation = get_activation(activation)
        self.use_bias = bool(use_bias)

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {"W": (self.out_dim, self.in_dim)}
        if self.use_bias:
            shapes["b"] = (self.out_dim,)
        return shapes

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict[str, Array]:
        """W Glorot-uniform (out × in), b = 0."""
        shape = (self.out_dim, self.in_dim)
        params = {"W": glorot_uniform(seed, shape, self.in_dim, self.out_dim, xp=xp, dtype=dtype, device=device)}
        if self.use_bias:
            params["b"] = zeros((self.out_dim,), xp=xp, dtype=dtype, device=device)
        return params

    def manifolds(self) -> dict[str, None]:
        return dict.fromkeys(self._shapes())

    def _forward(self, params: Any, x: Array) -> tuple[Any, Array, Array]:
        check_params(self, params, self._shapes())
        xp = check_input(self, x, self.in_dim, params=params)
        z = x @ xp.matrix_transpose(params["W"])
        if self.use_bias:
            z = z + params["b"]
        y = self.activation.fn(z)
        return xp, z, (x + y if self.residual else y)

    def apply(self, params: Any, x: Array) -> Array:
        return self._forward(params, x)[2]

    def vjp(self, params: Any, x: Array):
        xp, z, y = self._forward(params, x)
        W = params["W"]

        def pullback(dy: Array) -> tuple[dict[str, Array], Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            dz = dy * self.activation.deriv(z)
            grads = {"W": sum_outer(dz, x, xp)}
            if self.use_bias:
                grads["b"] = sum_lead(dz, xp)
            dx = dz @ W
            return grads, (dx + dy if self.residual else dx)

        return y, pullback


class Dense(_Affine):
    """:math:`x \\mapsto \\sigma(Wx + b)`, :math:`W \\in \\mathbb R^{\\mathrm{out}\\times \\mathrm{in}}`,
    :math:`b \\in \\mathbb R^{\\mathrm{out}}`: a pointwise layer on x (..., in) → (..., out).

    Leading axes are batch axes (a sequence (..., T, in) is mapped row by row; the papers' d × T
    matrices are stored transposed). ``params = {"W": (out, in), "b": (out,)}`` (no ``"b"`` when
    ``use_bias=False``), W Glorot-uniform and b = 0 at init; ``manifolds()`` gives None for both.
    ``activation`` is a name (``"identity"``, ``"tanh"``, …) or an object with ``fn`` and ``deriv``
    (:func:`~geoarray.nn.activations.get_activation`).
    """

    def __init__(self, in_dim: int, out_dim: int, activation: Any = "identity", *, use_bias: bool = True):
        super().__init__(in_dim, out_dim, activation, use_bias)


class ResNetLayer(_Affine):
    """:math:`x \\mapsto x + \\sigma(Wx + b)`, :math:`W \\in \\mathbb R^{\\mathrm{dim}\\times\\mathrm{dim}}`: the
    feed-forward block with add connection (eq. 15 of Brantner's paper).

    Pointwise on x (..., dim); a sequence (..., T, dim) — the transpose of the papers' dim × T
    matrix — is mapped row by row. ``params = {"W": (dim, dim), "b": (dim,)}`` (no ``"b"`` when
    ``use_bias=False``), W Glorot-uniform and b = 0 at init, all unconstrained as in the paper.
    """

    residual = True

    def __init__(self, dim: int, activation: Any = "tanh", *, use_bias: bool = True):
        super().__init__(dim, dim, activation, use_bias)

    @property
    def dim(self) -> int:
        return self.in_dim
