"""The layer contract and the Chain that composes layers.

A layer is data (its sizes and options) plus four pure functions::

    params = layer.init(seed, xp=np, dtype="float64", device=None)   # a tree (dict) of arrays
    manifolds = layer.manifolds()            # the same tree: a Manifold where a weight is constrained, else None
    y = layer.apply(params, x)               # x: (..., T, d) for sequence layers, (..., d) for pointwise ones
    y, pullback = layer.vjp(params, x)       # analytic reverse mode, array-API only
    dparams, dx = pullback(dy)               # dparams has the tree structure of params

Pullbacks are written by hand so that NumPy and CuPy can train without an autodiff framework; on
torch and JAX the native autodiff of ``apply`` must agree with them (the tests check it). Leading
batch dimensions of ``x`` are vectorised; parameter gradients are summed over them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .. import random as _random
from .activations import Activation

__all__ = ["Chain", "Layer"]

from .._typing import Array

Pullback = Callable[[Array], tuple[Any, Array]]


class Layer:
    """Base class of all layers (see the module docstring for the contract)."""

    def __repr__(self) -> str:
        """``Name(arg=value, ...)`` for every constructor argument the layer stores under its own name."""
        parts = []
        for name, param in inspect.signature(type(self).__init__).parameters.items():
            if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or not hasattr(self, name):
                continue
            value = getattr(self, name)
            parts.append(
                f"{name}={getattr(value, 'name', value)!r}" if isinstance(value, Activation) else f"{name}={value!r}"
            )
        return f"{type(self).__name__}({', '.join(parts)})"

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> Any:
        raise NotImplementedError

    def manifolds(self) -> Any:
        raise NotImplementedError

    def apply(self, params: Any, x: Array) -> Array:
        raise NotImplementedError

    def vjp(self, params: Any, x: Array) -> tuple[Array, Pullback]:
        raise NotImplementedError

    def __call__(self, params: Any, x: Array) -> Array:
        return self.apply(params, x)


class Chain(Layer):
    """Layers applied one after another; ``params`` is a tuple with one entry per layer."""

    def __init__(self, *layers: Layer):
        if not layers:
            raise ValueError("Chain needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"Chain argument {i} must be a Layer, got {type(layer).__name__}")
        self.layers = tuple(layers)

    def __repr__(self) -> str:
        return f"Chain({', '.join(map(repr, self.layers))})"

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> Layer:
        return self.layers[i]

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> tuple:
        """Each layer initialised from its own child seed (``geoarray.random.spawn``)."""
        seeds = _random.spawn(seed, len(self.layers))
        return tuple(
            layer.init(s, xp=xp, dtype=dtype, device=device) for layer, s in zip(self.layers, seeds, strict=True)
        )

    def manifolds(self) -> tuple:
        return tuple(layer.manifolds() for layer in self.layers)

    def _check_params(self, params: Any) -> None:
        if not isinstance(params, (tuple, list)) or len(params) != len(self.layers):
            raise ValueError(
                f"params must be a tuple with one entry per layer ({len(self.layers)}), got {type(params).__name__}"
                + (f" of length {len(params)}" if isinstance(params, (tuple, list)) else "")
            )

    def apply(self, params: Any, x: Array) -> Array:
        self._check_params(params)
        for layer, p in zip(self.layers, params, strict=True):
            x = layer.apply(p, x)
        return x

    def vjp(self, params: Any, x: Array) -> tuple[Array, Pullback]:
        self._check_params(params)
        pullbacks = []
        for layer, p in zip(self.layers, params, strict=True):
            x, pb = layer.vjp(p, x)
            pullbacks.append(pb)

        def pullback(dy: Array) -> tuple[tuple, Array]:
            grads = []
            for pb in reversed(pullbacks):
                dp, dy = pb(dy)
                grads.append(dp)
            return tuple(reversed(grads)), dy

        return x, pullback
