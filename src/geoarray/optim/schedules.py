"""Learning-rate schedules: functions of the step counter t = 1, 2, … (an array, traceable).

Any optimizer's ``lr`` may be a number or such a function. A schedule receives t as a floating array
of the parameters' dtype and returns a number or a 0-d array.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import _backend
from .._backend import array_namespace

__all__ = ["constant", "exponential_decay"]

Schedule = Callable[[Any], Any]


def constant(lr: float) -> Schedule:
    """η(t) = lr."""
    check_positive(lr, "lr")
    return lambda t: lr


def exponential_decay(lr_start: float, lr_end: float, n: int, *, steps_per_epoch: int | None = None) -> Schedule:
    """Geometric decay from ``lr_start`` to ``lr_end`` over ``n`` steps or ``n`` epochs, then constant.

    η(t) = lr_start · (lr_end / lr_start)^{min(k, n)/n} with

    * k = t − 1, the number of steps already taken, when ``steps_per_epoch`` is None (the rate
      changes at every optimizer step and reaches ``lr_end`` at step n + 1);
    * k = ⌊(t − 1) / steps_per_epoch⌋, the number of completed epochs, otherwise (the rate is
      constant within an epoch and reaches ``lr_end`` in epoch n + 1).

    (GeometricMachineLearning.jl's ``AdamOptimizerWithDecay`` takes ``n_epochs`` but decays at every
    update call, i.e. per batch step; here the unit is explicit.)
    """
    check_positive(lr_start, "lr_start")
    check_positive(lr_end, "lr_end")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (steps or epochs), got {n!r}")
    if steps_per_epoch is not None and (
        isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) or steps_per_epoch < 1
    ):
        raise ValueError(f"steps_per_epoch must be a positive int or None, got {steps_per_epoch!r}")
    log_ratio = math.log(lr_end / lr_start)

    def schedule(t: Any) -> Any:
        xp = array_namespace(t=t)
        k = t - 1 if steps_per_epoch is None else xp.floor((t - 1) / steps_per_epoch)
        frac = _backend.clip(k / n, xp, min=0.0, max=1.0)
        return lr_start * xp.exp(log_ratio * frac)

    return schedule


def as_schedule(lr: float | Schedule, name: str = "lr") -> Schedule:
    if callable(lr):
        return lr
    check_positive(lr, name)
    return constant(lr)


def check_positive(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
