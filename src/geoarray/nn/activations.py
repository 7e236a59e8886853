"""Activation functions with their derivatives, for analytic pullbacks, and the stable softmax.

A layer takes its activation by name (``"tanh"``, ``"sigmoid"``, ``"relu"``, ``"gelu"``,
``"identity"``) or as any object with ``fn(x)`` and ``deriv(x)`` methods (σ and σ′, elementwise,
array-API). ``gelu`` is the tanh approximation
½x(1 + tanh(√(2/π)(x + 0.044715x³))), because the array API standard has no ``erf``.

:func:`softmax` (along an axis, not elementwise) and its pullback :func:`softmax_pullback` are
shared by the attention and classification layers and the losses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._backend import array_namespace

__all__ = ["Activation", "gelu_tanh", "get_activation", "log_softmax", "softmax", "softmax_pullback"]

from .._typing import Array


@dataclass(frozen=True)
class Activation:
    """An elementwise σ with its derivative σ′ (both array → array)."""

    name: str
    fn: Callable[[Array], Array]
    deriv: Callable[[Array], Array]

    def __call__(self, x: Array) -> Array:
        return self.fn(x)


def _tanh(x):
    return array_namespace(x).tanh(x)


def _tanh_d(x):
    t = array_namespace(x).tanh(x)
    return 1 - t * t


def _sigmoid(x):
    xp = array_namespace(x)
    # 1/(1 + e^{−x}) written through tanh: no overflow for large |x|
    return (1 + xp.tanh(x / 2)) / 2


def _sigmoid_d(x):
    s = _sigmoid(x)
    return s * (1 - s)


def _relu(x):
    xp = array_namespace(x)
    return xp.where(x > 0, x, xp.zeros_like(x))


def _relu_d(x):
    xp = array_namespace(x)
    return xp.where(x > 0, xp.ones_like(x), xp.zeros_like(x))


_GELU_C = math.sqrt(2 / math.pi)


def gelu_tanh(x: Array) -> Array:
    """The tanh approximation of GELU: x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))/2 (GPT-2's ``gelu_new``)."""
    xp = array_namespace(x)
    return x * (1 + xp.tanh(_GELU_C * (x + 0.044715 * x**3))) / 2


_gelu = gelu_tanh


def _gelu_d(x):
    xp = array_namespace(x)
    t = xp.tanh(_GELU_C * (x + 0.044715 * x**3))
    return (1 + t) / 2 + x * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * x**2) / 2


def _identity(x):
    return x


def _identity_d(x):
    return array_namespace(x).ones_like(x)


_ACTIVATIONS = {
    "tanh": Activation("tanh", _tanh, _tanh_d),
    "sigmoid": Activation("sigmoid", _sigmoid, _sigmoid_d),
    "relu": Activation("relu", _relu, _relu_d),
    "gelu": Activation("gelu", _gelu, _gelu_d),
    "identity": Activation("identity", _identity, _identity_d),
}


def get_activation(activation: str | Any) -> Activation:
    """The :class:`Activation` for a name, or wrap an object that has ``fn`` and ``deriv``."""
    if isinstance(activation, Activation):
        return activation
    if isinstance(activation, str):
        try:
            return _ACTIVATIONS[activation]
        except KeyError:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)} or an object with fn and deriv, got {activation!r}"
            ) from None
    fn, deriv = getattr(activation, "fn", None), getattr(activation, "deriv", None)
    if not (callable(fn) and callable(deriv)):
        raise TypeError(
            f"activation must be a name ({', '.join(sorted(_ACTIVATIONS))}) or an object with callable fn and "
            f"deriv, got {activation!r}"
        )
    return Activation(getattr(activation, "name", type(activation).__name__), fn, deriv)


# ---------------------------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------------------------


def softmax(z: Array, axis: int = -1) -> Array:
    """softmax(z)_i = exp(z_i) / Σ_j exp(z_j) along ``axis`` (eq. 22 of Brantner's paper).

    The maximum along ``axis`` is subtracted first: the result is unchanged (softmax is invariant
    under shifts) and exp never overflows, whatever the size of the logits.
    """
    xp = array_namespace(z=z)
    e = xp.exp(z - xp.max(z, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def log_softmax(z: Array, axis: int = -1) -> Array:
    """log softmax(z) as a max-shifted log-sum-exp (finite for huge logits)."""
    xp = array_namespace(z)
    s = z - xp.max(z, axis=axis, keepdims=True)
    return s - xp.log(xp.sum(xp.exp(s), axis=axis, keepdims=True))


def softmax_pullback(p: Array, dp: Array, axis: int = -1) -> Array:
    """Pullback of p = softmax(z) along ``axis``: dz = p ⊙ (dp − ⟨dp, p⟩), from the output ``p``."""
    xp = array_namespace(p=p, dp=dp)
    return p * (dp - xp.sum(dp * p, axis=axis, keepdims=True))
