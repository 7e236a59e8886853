"""Pointwise affine layers: Dense x ↦ σ(Wx + b) and the ResNet layer x ↦ x + σ(Wx + b) (eq. 15).

Both act on the last axis of ``x`` (..., d) and treat every leading axis as a batch axis, so a
sequence (..., T, d) is transformed column by column of the seeds' d × T matrix (the seeds write a
sequence as d × T; geoarray stores its transpose, time then features). In row form the layers
compute x Wᵀ + b on each row; parameter gradients are summed over all leading axes in one matrix
product over the flattened batch.
"""

from __future__ import annotations

import math
from typing import Any

from .. import random as _random
from .._backend import array_namespace, check_real_floating
from .._backend import device as _device
from ..manifolds.base import _check_size
from .activations import get_activation
from .base import Layer

__all__ = ["Dense", "ResNetLayer"]

Array = Any


# ---------------------------------------------------------------------------------------------
# argument checks shared by the layers of this package
# ---------------------------------------------------------------------------------------------


def _check_params(layer: Layer, params: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """``params`` is a dict with exactly the keys of ``shapes`` and arrays of those shapes."""
    if not isinstance(params, dict) or set(params) != set(shapes):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"params of {layer!r} must be a dict with keys {sorted(shapes)}, got {got}")
    for key, shape in shapes.items():
        if tuple(params[key].shape) != tuple(shape):
            raise ValueError(
                f"params[{key!r}] of {layer!r} must have shape {tuple(shape)}, got {tuple(params[key].shape)}"
            )


def _check_input(layer: Layer, x: Array, d: int, *, sequence: bool = False, **params: Array) -> Any:
    """The namespace of x and params; x real floating with last axis d (and a time axis if ``sequence``)."""
    xp = array_namespace(x=x, **params)
    check_real_floating(x, "x", xp)
    min_ndim, layout = (2, "(..., T, d)") if sequence else (1, "(..., d)")
    if x.ndim < min_ndim or x.shape[-1] != d:
        raise ValueError(f"x must have shape {layout} with d = {d} for {layer!r}, got shape {tuple(x.shape)}")
    return xp


def _glorot(seed: Any, shape: tuple[int, ...], fan_in: int, fan_out: int, *, xp: Any, dtype: Any, device: Any):
    """U(−a, a) with a = √(6/(fan_in + fan_out)) (Glorot uniform, the GeometricMachineLearning.jl default)."""
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return _random.uniform(seed, shape, xp=xp, low=-a, high=a, dtype=dtype, device=device)


def _flat(x: Array, xp: Any) -> Array:
    """(..., d) → (B, d) with B the product of the leading axes (1 for a single vector)."""
    return xp.reshape(x, (math.prod(x.shape[:-1]), x.shape[-1]))


# ---------------------------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------------------------


class _Affine(Layer):
    """σ(Wx + b) with its pullback; Dense and ResNetLayer add the residual or not."""

    residual = False

    def __init__(self, in_dim: int, out_dim: int, activation: Any, use_bias: bool):
        self.in_dim = _check_size(in_dim, "in_dim")
        self.out_dim = _check_size(out_dim, "out_dim")
        self.activation = get_activation(activation)
        self.use_bias = bool(use_bias)

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"W": (self.out_dim, self.in_dim)}
        if self.use_bias:
            shapes["b"] = (self.out_dim,)
        return shapes

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict[str, Array]:
        """W Glorot-uniform (out × in), b = 0."""
        W = _glorot(seed, (self.out_dim, self.in_dim), self.in_dim, self.out_dim, xp=xp, dtype=dtype, device=device)
        params = {"W": W}
        if self.use_bias:
            params["b"] = array_namespace(W=W).zeros((self.out_dim,), dtype=W.dtype, device=_device(W))
        return params

    def manifolds(self) -> dict[str, None]:
        return dict.fromkeys(self._shapes())

    def _forward(self, params: Any, x: Array) -> tuple[Any, Array, Array]:
        _check_params(self, params, self._shapes())
        xp = _check_input(self, x, self.in_dim, **params)
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
            dz = dy * self.activation.deriv(z)
            dz_flat = _flat(dz, xp)
            grads = {"W": xp.matrix_transpose(dz_flat) @ _flat(x, xp)}
            if self.use_bias:
                grads["b"] = xp.sum(dz_flat, axis=0)
            dx = dz @ W
            return grads, (dx + dy if self.residual else dx)

        return y, pullback


class Dense(_Affine):
    """x ↦ σ(Wx + b), W ∈ R^{out×in}, b ∈ R^{out}: a pointwise layer on x (..., in) → (..., out).

    Leading axes are batch axes (a sequence (..., T, in) is mapped row by row; the seeds' d × T
    matrices are stored transposed). ``params = {"W": (out, in), "b": (out,)}`` (no ``"b"`` when
    ``use_bias=False``), W Glorot-uniform and b = 0 at init; ``manifolds()`` gives None for both.
    ``activation`` is a name (``"identity"``, ``"tanh"``, …) or an object with ``fn`` and ``deriv``
    (:func:`~geoarray.nn.activations.get_activation`).
    """

    def __init__(self, in_dim: int, out_dim: int, activation: Any = "identity", *, use_bias: bool = True):
        super().__init__(in_dim, out_dim, activation, use_bias)

    def __repr__(self) -> str:
        bias = "" if self.use_bias else ", use_bias=False"
        return f"Dense({self.in_dim}, {self.out_dim}, {self.activation.name!r}{bias})"


class ResNetLayer(_Affine):
    """x ↦ x + σ(Wx + b), W ∈ R^{dim×dim}: the feed-forward block with add connection (eq. 15 of seed 002).

    Pointwise on x (..., dim); a sequence (..., T, dim) — the transpose of the seeds' dim × T
    matrix — is mapped row by row. ``params = {"W": (dim, dim), "b": (dim,)}`` (no ``"b"`` when
    ``use_bias=False``), W Glorot-uniform and b = 0 at init, all unconstrained as in the paper.
    """

    residual = True

    def __init__(self, dim: int, activation: Any = "tanh", *, use_bias: bool = True):
        super().__init__(dim, dim, activation, use_bias)

    @property
    def dim(self) -> int:
        return self.in_dim

    def __repr__(self) -> str:
        bias = "" if self.use_bias else ", use_bias=False"
        return f"ResNetLayer({self.dim}, {self.activation.name!r}{bias})"
