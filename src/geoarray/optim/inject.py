"""Hyperparameters in the optimizer's state, as arrays: :func:`inject_hyperparams` (optax's name and idea).

An optimizer's rate is fixed when it is built: a number, or a schedule of the step. ``opt =
inject_hyperparams(optim.Adam)(lr=1e-3)`` builds the same optimizer with the rate read from its state
instead: ``state.hyperparams["lr"]`` is a 0-d array on the parameters' device, and whoever holds the state
may put another value there between steps —

    state = state._replace(hyperparams={**state.hyperparams, "lr": xp.asarray(1e-4)})

(or, as with optax, ``state.hyperparams["lr"] = 1e-4``: the dict is the caller's) — for a rule that
decides the rate as training goes (a plateau, a warm restart, a rate found by a line search). Nothing
outside the state holds the value, so the update stays a pure function of its inputs: under ``jax.jit`` the
rate is an input of the compiled step and a new value compiles nothing; saved with
:func:`geoarray.optim.save_state`, the rate in force is saved with the moments.

Any hyperparameter that the optimizer takes as a schedule (a callable of the step t = 1, 2, …) can be
injected: ``lr`` of :class:`~geoarray.optim.Gradient`, :class:`~geoarray.optim.Momentum`,
:class:`~geoarray.optim.Adam`, :class:`~geoarray.optim.BFGS` and :class:`~geoarray.optim.ManifoldMuon`.
The optimizer is built with a schedule that returns the state's value (cast to each leaf's dtype), so the
step is the one that optimizer takes with that rate as a schedule's value: equal to the step with the
same constant rate to rounding (float64: 1e-12, tested). Hyperparameters fixed at construction (Adam's
``beta1``) are refused with a ``TypeError`` naming them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import optree

from .. import _backend
from .._backend import array_namespace

__all__ = ["InjectHyperparamsState", "InjectedOptimizer", "inject_hyperparams"]


class InjectHyperparamsState(NamedTuple):
    """``hyperparams``: the injected values in force at the next update, each a 0-d floating array;
    ``inner``: the optimizer's own state."""

    hyperparams: dict
    inner: Any


class _StateValue:
    """The schedule an injected hyperparameter is built with: the state's value at this update, as a 0-d
    array of the step's dtype (t is a 0-d array of each leaf's floating dtype)."""

    def __init__(self, value: Any):
        self.value = value

    def __call__(self, t: Any) -> Any:
        xp = array_namespace(t)
        return xp.astype(xp.reshape(xp.asarray(self.value), ()), t.dtype)


def _as_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(
            f"inject_hyperparams: {name} must be a finite number (its first value, put in the state), got {value!r}; "
            "a schedule goes to the optimizer itself (e.g. optim.Adam(lr=schedule)), without inject_hyperparams"
        )
    return float(value)


class InjectedOptimizer:
    """``make(**static, **injected)`` with the injected hyperparameters read from the state (module
    docstring). ``init(params, manifolds)`` and ``update(params, grads, state, **kwargs)`` as the optimizer's
    own (``kwargs``: its ``check``, ``donate``, ``skip``)."""

    def __init__(self, make: Callable[..., Any], injected: dict[str, float], static: dict[str, Any]):
        self.make, self.injected, self.static = make, dict(injected), dict(static)
        #: ``update`` takes an outside skip flag (``skip=``) where the optimizer it builds does
        self.takes_skip_flag = bool(getattr(make(**self.static, **self.injected), "takes_skip_flag", False))
        for name in self.injected:  # refuse now, naming it, what make does not take as a schedule
            values: dict[str, Any] = {**self.injected, name: _StateValue(self.injected[name])}
            try:
                make(**self.static, **values)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"inject_hyperparams({getattr(make, '__name__', make)}): it does not take {name} as a schedule, "
                    f"so {name} cannot be read from the state ({type(exc).__name__}: {exc}); inject only "
                    "hyperparameters that take a schedule (lr), and pass the others as they are"
                ) from exc

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in {**self.injected, **self.static}.items())
        return f"inject_hyperparams({getattr(self.make, '__name__', repr(self.make))})({args})"

    def _build(self, values: dict[str, Any]) -> Any:
        return self.make(**self.static, **{k: _StateValue(v) for k, v in values.items()})

    def init(self, params: Any, manifolds: Any) -> InjectHyperparamsState:
        hyperparams = {k: _array_beside(v, params, k) for k, v in self.injected.items()}
        return InjectHyperparamsState(hyperparams, self._build(hyperparams).init(params, manifolds))

    def update(self, params: Any, grads: Any, state: InjectHyperparamsState, **kwargs: Any) -> tuple[Any, Any]:
        if not isinstance(state, InjectHyperparamsState):
            raise TypeError(f"state must be the InjectHyperparamsState returned by init, got {type(state).__name__}")
        if set(state.hyperparams) != set(self.injected):
            raise ValueError(
                f"state.hyperparams has {sorted(state.hyperparams)}, this optimizer injects {sorted(self.injected)}: "
                "replace the values, keep the keys"
            )
        hyperparams = {}
        for k, v in state.hyperparams.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):  # a number the caller put there
                v = _array_beside(_as_number(v, f"state.hyperparams[{k!r}]"), params, k)
            elif getattr(v, "shape", None) is None or math.prod(v.shape) != 1:
                raise TypeError(f"state.hyperparams[{k!r}] must be a number or a one-element array, got {v!r}")
            hyperparams[k] = v
        new_params, inner = self._build(hyperparams).update(params, grads, state.inner, **kwargs)
        return new_params, InjectHyperparamsState(hyperparams, inner)


def _array_beside(value: float, params: Any, name: str) -> Any:
    """``value`` as a 0-d array on the parameters' namespace and (first floating leaf's) device, in their
    widest floating dtype and at least float32 (a rate of 1e-4 in float16 would be 1.0002e-4)."""
    leaves = [x for x in optree.tree_leaves(params) if hasattr(x, "dtype")]
    xp = array_namespace(*leaves) if leaves else None
    floating = [x for x in leaves if xp is not None and xp.isdtype(x.dtype, "real floating")]
    if xp is None or not floating:
        raise ValueError(f"inject_hyperparams: params has no floating arrays to keep {name} beside")
    widest = max((x.dtype for x in floating), key=lambda dt: xp.finfo(dt).bits)
    dtype = widest if xp.finfo(widest).bits >= 32 else xp.float32
    return xp.asarray(value, dtype=dtype, device=_backend.device(floating[0]))


def inject_hyperparams(make: Callable[..., Any], *, injected: tuple[str, ...] = ("lr",)) -> Callable[..., Any]:
    """``inject_hyperparams(make)(**hyperparams)``: the optimizer ``make(**hyperparams)`` with the hyperparameters
    named in ``injected`` (by default ``lr``) kept in its state as 0-d arrays that the caller may change
    between steps (module docstring). The others are passed to ``make`` as they are.

    ``make`` is an optimizer class or factory of :mod:`geoarray.optim` (``optim.Adam``, ``optim.ManifoldMuon``,
    …); an injected hyperparameter must be given, as a number."""
    if not callable(make):
        raise TypeError(f"inject_hyperparams takes an optimizer class or factory, got {make!r}")
    if isinstance(injected, str) or not all(isinstance(k, str) for k in injected) or not injected:
        raise TypeError(f"injected must be a non-empty tuple of hyperparameter names, got {injected!r}")

    def build(**hyperparams: Any) -> InjectedOptimizer:
        missing = [k for k in injected if k not in hyperparams]
        if missing:
            raise TypeError(
                f"inject_hyperparams({getattr(make, '__name__', make)}): give the first value of {', '.join(missing)} "
                f"(e.g. {missing[0]}=1e-3)"
            )
        values = {k: _as_number(hyperparams[k], k) for k in injected}
        static = {k: v for k, v in hyperparams.items() if k not in values}
        return InjectedOptimizer(make, values, static)

    return build
