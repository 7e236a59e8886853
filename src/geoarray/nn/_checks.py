"""Private helpers shared by the layers of :mod:`geoarray.nn`: argument checks, reductions, initialisers.

Every check raises with one message pattern, ``"{layer!r}: <argument> must <expected>, got <actual>"``
(constructor checks, which run before there is a layer, name the argument alone), so an error names
the layer, the argument, and the expected and actual shape or dtype.

Layers are pointwise on the last axis of ``x`` (..., d) or take sequences (..., T, d); every other
leading axis is a batch axis, and a parameter gradient is a sum over all leading axes, written as
one matrix product over the flattened batch (:func:`sum_outer`, :func:`sum_lead`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .. import random as _random
from .._backend import array_namespace, as_namespace, check_real_floating, resolve_dtype
from ..manifolds.base import check_size

__all__ = [
    "check_cotangent",
    "check_even_size",
    "check_input",
    "check_params",
    "check_size",
    "flat",
    "glorot_uniform",
    "scaled_normal",
    "sum_lead",
    "sum_outer",
    "zeros",
]

from .._typing import Array

# ---------------------------------------------------------------------------------------------
# sizes (constructor arguments)
# ---------------------------------------------------------------------------------------------

# check_size(value, name): a positive int (ints and NumPy integers); TypeError for bools, floats and
# other types, ValueError for values < 1. It is the manifolds' check, re-exported so that sizes of
# layers and of their manifolds are validated alike.


def check_even_size(value: Any, name: str) -> int:
    """A positive even int: the size of a phase-space vector [q, p]."""
    value = check_size(value, name)
    if value % 2:
        raise ValueError(f"{name} must be even (the feature axis is split into [q, p] halves), got {name}={value}")
    return value


# ---------------------------------------------------------------------------------------------
# arguments of apply / vjp / pullback
# ---------------------------------------------------------------------------------------------


def check_params(layer: Any, params: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """``params`` is a dict with exactly the keys of ``shapes``, holding arrays of those shapes."""
    if not isinstance(params, Mapping) or set(params) != set(shapes):
        got = sorted(params) if isinstance(params, Mapping) else type(params).__name__
        raise ValueError(f"{layer!r}: params must be a dict with keys {sorted(shapes)}, got {got}")
    for key, shape in shapes.items():
        actual = getattr(params[key], "shape", None)
        if actual is None:
            raise TypeError(
                f"{layer!r}: params[{key!r}] must be an array of shape {tuple(shape)}, got {type(params[key]).__name__}"
            )
        if tuple(actual) != tuple(shape):
            raise ValueError(f"{layer!r}: params[{key!r}] must have shape {tuple(shape)}, got shape {tuple(actual)}")


def check_input(
    layer: Any, x: Array, dim: int, *, params: Mapping[str, Array], sequence: bool = False, seq_len: int | None = None
) -> Any:
    """The namespace of ``x`` and ``params``, after checking ``x`` against them.

    ``x`` must be real floating with shape (..., dim), or (..., T, dim) when ``sequence`` (T =
    ``seq_len`` when given), and every parameter must have the dtype of ``x``: mixing dtypes would
    promote the output away from the input's dtype. Call :func:`check_params` first.
    """
    xp = array_namespace(x=x, **{f"params[{key!r}]": value for key, value in params.items()})
    check_real_floating(x, "x", xp)
    if sequence:
        expected = f"(..., {'T' if seq_len is None else seq_len}, {dim})"
        if seq_len is not None:
            expected += f" (seq_len={seq_len})"
        ok = x.ndim >= 2 and x.shape[-1] == dim and (seq_len is None or x.shape[-2] == seq_len)
    else:
        expected = f"(..., {dim})"
        ok = x.ndim >= 1 and x.shape[-1] == dim
    if not ok:
        raise ValueError(f"{layer!r}: x must have shape {expected}, got shape {tuple(x.shape)}")
    for key, value in params.items():
        if value.dtype != x.dtype:
            raise TypeError(
                f"{layer!r}: params[{key!r}] must have the dtype of x ({x.dtype}), got {value.dtype}; "
                "cast one of them so that the result keeps the input dtype"
            )
    return xp


def check_cotangent(layer: Any, dy: Array, y_shape: tuple[int, ...], y_dtype: Any = None) -> None:
    """The cotangent ``dy`` handed to a pullback is an array of the layer output's shape (and dtype:
    a float32 ``dy`` for a float64 output would be promoted silently by NumPy and refused by torch's
    matmul with a RuntimeError)."""
    if getattr(dy, "shape", None) is None or getattr(dy, "dtype", None) is None:
        raise TypeError(
            f"{layer!r}: dy must be an array of the output's shape {tuple(y_shape)}, got {type(dy).__name__}"
        )
    if tuple(dy.shape) != tuple(y_shape):
        raise ValueError(f"{layer!r}: dy must have the output's shape {tuple(y_shape)}, got shape {tuple(dy.shape)}")
    if y_dtype is not None and dy.dtype != y_dtype:
        raise TypeError(f"{layer!r}: dy must have the output's dtype {y_dtype}, got {dy.dtype}; cast it")


# ---------------------------------------------------------------------------------------------
# sums over the leading (batch, time) axes
# ---------------------------------------------------------------------------------------------


def flat(a: Array, xp: Any) -> Array:
    """(..., m) → (B, m) with B the product of the leading axes (1 for a single vector)."""
    return xp.reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))


def sum_outer(a: Array, b: Array, xp: Any) -> Array:
    """Σ over the leading axes of a[..., :, None] · b[..., None, :] (m, k), as one matmul flat(a)ᵀ flat(b)."""
    return xp.matrix_transpose(flat(a, xp)) @ flat(b, xp)


def sum_lead(a: Array, xp: Any) -> Array:
    """Σ over all leading axes of a (..., m): (m,)."""
    return xp.sum(flat(a, xp), axis=0)


# ---------------------------------------------------------------------------------------------
# initialisers (same numbers on every backend: drawn by geoarray.random)
# ---------------------------------------------------------------------------------------------


def glorot_uniform(
    seed: Any, shape: tuple[int, ...], fan_in: int, fan_out: int, *, xp: Any, dtype: Any, device: Any
) -> Array:
    """U(−a, a) with a = √(6/(fan_in + fan_out)) (Glorot uniform, the GeometricMachineLearning.jl default)."""
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return _random.uniform(seed, shape, xp=xp, low=-a, high=a, dtype=dtype, device=device)


def scaled_normal(seed: Any, shape: tuple[int, ...], fan_in: int, *, xp: Any, dtype: Any, device: Any) -> Array:
    """N(0, 1/fan_in) entrywise: a unit-variance input gives O(1) pre-activations."""
    return _random.normal(seed, shape, xp=xp, dtype=dtype, device=device, scale=1 / math.sqrt(fan_in))


def zeros(shape: tuple[int, ...], *, xp: Any, dtype: Any, device: Any) -> Array:
    """Zeros with the dtype policy of :func:`geoarray._backend.resolve_dtype` (None → the default float)."""
    xp = as_namespace(xp)
    dt = resolve_dtype(xp, dtype, device)
    return xp.zeros(shape, dtype=dt) if device is None else xp.zeros(shape, dtype=dt, device=device)
