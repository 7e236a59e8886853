"""Loss functions with analytic pullbacks.

Every loss is an object with one design::

    value = loss.value(pred, target)            # a 0-d array (same namespace, dtype, device as pred)
    value, pullback = loss.vjp(pred, target)    # reverse mode
    dpred = pullback(dvalue=1.0)                # ∂(dvalue·loss)/∂pred, shaped like pred

``loss(pred, target)`` is ``loss.value(pred, target)``. Gradients are taken with respect to
``pred`` only (targets are data). All reductions run over every element, so any leading batch
dimensions are allowed; the classification losses read the last axis as the class axis and average
over all the others (the batch).

Which loss goes with which output:

=============================  ===========================================  ==============================
loss                           ``pred`` is                                   typical producer
=============================  ===========================================  ==============================
:class:`RelativeL2Loss`        any array, compared with ``target``          regression / sequence models
:class:`MSELoss`               any array                                    regression
:class:`ClassificationL2Loss`  probabilities (..., C) (already softmaxed)   ``ClassificationLayer()``
:class:`SoftmaxCrossEntropy`   logits (..., C) (softmax applied inside)     ``ClassificationLayer(logits=True)``
=============================  ===========================================  ==============================

:class:`~geoarray.nn.classification.ClassificationLayer` applies the softmax of eq. 16 by default,
so its output feeds the paper's L2 loss; feeding it to :class:`SoftmaxCrossEntropy` would apply a
second softmax. Classification targets are one-hot (or any probability) vectors shaped like
``pred``, or integer labels shaped like ``pred.shape[:-1]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._backend import array_namespace, as_array, check_real_floating
from .._backend import device as _device
from .activations import log_softmax, softmax, softmax_pullback  # softmax re-exported: losses.softmax predates it

__all__ = [
    "ClassificationL2Loss",
    "Loss",
    "MSELoss",
    "RelativeL2Loss",
    "SoftmaxCrossEntropy",
    "softmax",
    "softmax_pullback",
]

from .._typing import Array

# ---------------------------------------------------------------------------------------------
# the loss contract
# ---------------------------------------------------------------------------------------------


class Loss:
    """Base class: ``value``, ``vjp`` and ``__call__`` (see the module docstring)."""

    def value(self, pred: Array, target: Array) -> Array:
        return self.vjp(pred, target)[0]

    def vjp(self, pred: Array, target: Array) -> tuple[Array, Callable[..., Array]]:
        raise NotImplementedError

    def __call__(self, pred: Array, target: Array) -> Array:
        return self.value(pred, target)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # -- shared argument handling ---------------------------------------------------------------

    def _same_shape(self, pred: Array, target: Array) -> Any:
        xp = array_namespace(pred=pred, target=target)
        check_real_floating(pred, "pred", xp)
        check_real_floating(target, "target", xp)
        if tuple(pred.shape) != tuple(target.shape):
            raise ValueError(
                f"{self!r}: target must have the shape of pred {tuple(pred.shape)}, got {tuple(target.shape)}"
            )
        return xp

    def _class_target(self, pred: Array, target: Array) -> tuple[Any, Array]:
        """(xp, t) with t shaped like pred: probabilities as given, integer labels made one-hot."""
        xp = array_namespace(pred=pred, target=target)
        check_real_floating(pred, "pred", xp)
        if pred.ndim < 1:
            raise ValueError(f"{self!r}: pred must have a class axis (..., C), got shape {tuple(pred.shape)}")
        C = pred.shape[-1]
        if xp.isdtype(target.dtype, "integral"):
            if tuple(target.shape) != tuple(pred.shape[:-1]):
                raise ValueError(
                    f"{self!r}: integer labels must have shape pred.shape[:-1] = {tuple(pred.shape[:-1])}, "
                    f"got {tuple(target.shape)}"
                )
            classes = xp.arange(C, device=_device(pred))
            return xp, xp.astype(target[..., None] == classes, pred.dtype)
        check_real_floating(target, "target", xp)
        if tuple(target.shape) != tuple(pred.shape):
            raise ValueError(
                f"{self!r}: target must be probabilities shaped like pred {tuple(pred.shape)} or integer labels "
                f"shaped {tuple(pred.shape[:-1])}, got shape {tuple(target.shape)}"
            )
        return xp, target


def _sqrt_zero_safe(sq: Array, xp: Any) -> Array:
    """√sq with derivative 0 (not ∞·0 = NaN) at sq = 0 under torch/JAX autodiff: a saturated
    prediction p = t (exact one-hot softmax outputs in float32) then gets the subgradient 0, as the
    hand-written pullbacks give."""
    positive = sq > 0
    return xp.where(positive, xp.sqrt(xp.where(positive, sq, xp.ones_like(sq))), xp.zeros_like(sq))


def _safe_div(a: Array, b: Array, xp: Any) -> Array:
    """a / b where b > 0, else 0: the subgradient at a minimum of a norm."""
    positive = b > 0
    return xp.where(positive, a / xp.where(positive, b, xp.ones_like(b)), xp.zeros_like(a))


def _batch_size(pred: Array) -> int:
    return math.prod(pred.shape[:-1])


# ---------------------------------------------------------------------------------------------
# regression losses
# ---------------------------------------------------------------------------------------------


class RelativeL2Loss(Loss):
    """‖ŷ − y‖ / ‖y‖ with Frobenius norms over the whole arrays (batch included).

    The default loss of GeometricMachineLearning.jl. Gradient (ŷ − y)/(‖ŷ − y‖‖y‖); at ŷ = y, where
    the norm is not differentiable, the pullback returns 0 (a subgradient).
    """

    def vjp(self, pred: Array, target: Array) -> tuple[Array, Callable[..., Array]]:
        xp = self._same_shape(pred, target)
        r = pred - target
        num = _sqrt_zero_safe(xp.sum(r * r), xp)
        den = xp.sqrt(xp.sum(target * target))
        value = as_array(num / den)

        def pullback(dvalue: Any = 1.0) -> Array:
            return dvalue * _safe_div(r, num * den, xp)

        return value, pullback


class MSELoss(Loss):
    """Mean over all elements of (ŷ − y)²; gradient 2(ŷ − y)/size."""

    def vjp(self, pred: Array, target: Array) -> tuple[Array, Callable[..., Array]]:
        xp = self._same_shape(pred, target)
        r = pred - target
        size = math.prod(pred.shape)
        value = as_array(xp.sum(r * r) / size)

        def pullback(dvalue: Any = 1.0) -> Array:
            return dvalue * (2 / size) * r

        return value, pullback


# ---------------------------------------------------------------------------------------------
# classification losses
# ---------------------------------------------------------------------------------------------


class ClassificationL2Loss(Loss):
    """The paper's classification loss (Brantner's paper, appendix D): mean over the batch of ‖p − t‖₂.

    ``pred`` holds probabilities p (..., C), e.g. the softmax output of
    :class:`~geoarray.nn.classification.ClassificationLayer`; t is one-hot. For the maximum-entropy
    output p = (1/C, …, 1/C) the value is √((1 − 1/C)² + (C − 1)/C²) = √(1 − 1/C), i.e. √0.9 ≈ 0.949
    for C = 10. (Appendix D prints √(0.9 + 9·0.1) ≈ 1.34, squaring neither term: the formula
    gives √(0.81 + 9·0.01).) Gradient (p − t)/(B‖p − t‖) per sample, 0 where p = t.
    """

    def vjp(self, pred: Array, target: Array) -> tuple[Array, Callable[..., Array]]:
        xp, t = self._class_target(pred, target)
        r = pred - t
        norms = _sqrt_zero_safe(xp.sum(r * r, axis=-1, keepdims=True), xp)
        B = _batch_size(pred)
        value = as_array(xp.sum(norms) / B)

        def pullback(dvalue: Any = 1.0) -> Array:
            return (dvalue / B) * _safe_div(r, norms, xp)

        return value, pullback


class SoftmaxCrossEntropy(Loss):
    """Mean over the batch of −Σ_c t_c log softmax(z)_c, from logits z (..., C).

    Computed as a log-sum-exp with the maximum subtracted, so large logits neither overflow nor
    lose the small probabilities. Gradient (softmax(z)·Σ_c t_c − t)/B. Use it with
    ``ClassificationLayer(..., logits=True)``, which returns W·x without the softmax.
    """

    def vjp(self, pred: Array, target: Array) -> tuple[Array, Callable[..., Array]]:
        xp, t = self._class_target(pred, target)
        logp = log_softmax(pred)
        B = _batch_size(pred)
        value = as_array(-xp.sum(t * logp) / B)

        def pullback(dvalue: Any = 1.0) -> Array:
            p = xp.exp(logp)
            return (dvalue / B) * (p * xp.sum(t, axis=-1, keepdims=True) - t)

        return value, pullback
