"""The argument checks of :func:`geoarray.train.fit`: each refuses a bad value before anything is trained
or written, naming the argument, the value and the fix."""

from __future__ import annotations

import datetime
import json
import math
import os
from collections.abc import Mapping
from typing import Any, Literal, overload

import numpy as np

from . import _backend
from ._typing import Array


@overload
def positive_int(value: Any, name: str, *, allow_none: Literal[False] = False) -> int: ...
@overload
def positive_int(value: Any, name: str, *, allow_none: bool) -> int | None: ...
def positive_int(value: Any, name: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"fit: {name} must be a positive int, got {value!r}")
    return int(value)


def interval_seconds(value: Any) -> float | None:
    """``checkpoint_every_seconds``: None, a finite number of seconds > 0, or a ``datetime.timedelta``
    (Lightning's ``train_time_interval``)."""
    if value is None:
        return None
    fix = "give a finite number of seconds > 0 (e.g. 600 or datetime.timedelta(minutes=10)), or None"
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"fit: checkpoint_every_seconds must be a number of seconds, got {value!r}; {fix}")
    else:
        seconds = float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"fit: checkpoint_every_seconds must be positive and finite, got {value!r}; {fix}")
    return seconds


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"fit: {name} must be True or False, got {value!r}")
    return bool(value)


def json_dict(value: Any, name: str) -> dict | None:
    """``checkpoint_meta``: None, or a dict with str keys that JSON can write (checked now, not at the
    first checkpoint)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"fit: {name} must be a dict with str keys (saved as JSON) or None, got {value!r:.200}")
    try:
        json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"fit: {name} must hold JSON values (str, numbers, bools, None, lists, dicts): {exc}") from None
    return dict(value)


def path_arg(value: Any, name: str, what: str) -> str | None:
    """``out`` or ``checkpoint_path``: None, or a non-empty str / bytes / os.PathLike (as a str)."""
    if value is None:
        return None
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"fit: {name} must be a path ({what}: a str or os.PathLike) or None, got {value!r}")
    path = os.fsdecode(os.fspath(value))
    if not path:
        raise ValueError(f"fit: {name} must be a path ({what}), got an empty one; give a path or None")
    return path


def check_pair(data: Any, name: str) -> tuple[Array, Array, Any, int]:
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"fit: {name} must be a pair (inputs, targets), got {type(data).__name__}")
    inputs, targets = data
    xp = _backend.array_namespace(**{f"{name}[0]": inputs, f"{name}[1]": targets})
    if inputs.ndim < 1 or targets.ndim < 1:
        raise ValueError(f"fit: {name} arrays need a sample axis first, got shapes {inputs.shape} and {targets.shape}")
    n = inputs.shape[0]
    if targets.shape[0] != n:
        raise ValueError(
            f"fit: {name} inputs and targets must have the same number of samples (axis 0), "
            f"got {inputs.shape[0]} and {targets.shape[0]}"
        )
    if n < 1:
        raise ValueError(f"fit: {name} holds no samples")
    return inputs, targets, xp, int(n)
