"""The classification layer of the vision transformer of Brantner, *Generalizing Adam to Manifolds for
Efficiently Training Transformers* (eq. 16)."""

from __future__ import annotations

from typing import Any

from .._backend import device as _device
from ._checks import check_cotangent, check_input, check_params, check_size, glorot_uniform, sum_outer
from .activations import softmax, softmax_pullback
from .base import Layer

__all__ = ["ClassificationLayer"]

from .._typing import Array


class ClassificationLayer(Layer):
    """X ↦ softmax(W x_T) (eq. 16 of Brantner's paper), or softmax(W · (1/T)Σ_t x_t) with ``average=True``.

    Input a sequence x (..., T, dim) — the transpose of the papers' dim × T matrix X, so the papers'
    last column X[1:dim, end] is ``x[..., -1, :]`` — output (..., n_classes): one probability vector
    per batch element. W ∈ R^{n_classes×dim} is unconstrained and Glorot-uniform at init; there is
    no bias, as in eq. 16. ``params = {"W": (n_classes, dim)}``.

    ``logits=True`` drops the softmax and returns W x_T itself. Losses: the default (probabilities)
    output goes with :class:`~geoarray.nn.losses.ClassificationL2Loss` (the paper's loss, appendix D),
    the ``logits=True`` output with :class:`~geoarray.nn.losses.SoftmaxCrossEntropy`.
    """

    def __init__(self, dim: int, n_classes: int, *, average: bool = False, logits: bool = False):
        self.dim = check_size(dim, "dim")
        self.n_classes = check_size(n_classes, "n_classes")
        self.average = bool(average)
        self.logits = bool(logits)

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W": (self.n_classes, self.dim)}

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict[str, Array]:
        shape = (self.n_classes, self.dim)
        return {"W": glorot_uniform(seed, shape, self.dim, self.n_classes, xp=xp, dtype=dtype, device=device)}

    def manifolds(self) -> dict[str, None]:
        return {"W": None}

    def _forward(self, params: Any, x: Array) -> tuple[Any, Array, Array]:
        check_params(self, params, self._shapes())
        xp = check_input(self, x, self.dim, params=params, sequence=True)
        h = xp.mean(x, axis=-2) if self.average else x[..., -1, :]
        z = h @ xp.matrix_transpose(params["W"])
        return xp, h, (z if self.logits else softmax(z, axis=-1))

    def apply(self, params: Any, x: Array) -> Array:
        return self._forward(params, x)[2]

    def vjp(self, params: Any, x: Array):
        xp, h, y = self._forward(params, x)
        W = params["W"]
        T = x.shape[-2]

        def pullback(dy: Array) -> tuple[dict[str, Array], Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            dz = dy if self.logits else softmax_pullback(y, dy, axis=-1)
            dW = sum_outer(dz, h, xp)
            dh = dz @ W
            if self.average:
                dx = xp.broadcast_to(dh[..., None, :] / T, x.shape)
            else:
                # only the last time step reaches the output
                zeros = xp.zeros((*x.shape[:-2], T - 1, self.dim), dtype=dh.dtype, device=_device(dh))
                dx = xp.concat([zeros, dh[..., None, :]], axis=-2)
            return {"W": dW}, dx

        return y, pullback
