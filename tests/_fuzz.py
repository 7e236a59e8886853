"""Shared machinery of the public-API fuzz targets (``tests/test_fuzz_*.py``).

A fuzz case calls one public entry point on drawn inputs; :func:`outcome` enforces the contract of
issue #29: a result, or a ``ValueError``/``TypeError`` whose message names the argument — never another
exception type — and the inputs unchanged bit for bit either way.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import optree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _helpers import to_numpy

#: derandomized (CI is reproducible), no example database, no deadline (the first case pays for imports)
SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
}

#: JAX compiles each kernel once per shape and dtype (about a second per case; op-by-op dispatch under
#: jax.disable_jit was measured no faster): its targets run 1/JAX_SHARE of the cases
JAX_SHARE = 10


def cases(n: int, backend: Any) -> int:
    """How many cases a target of ``n`` runs on ``backend`` (n, or n/JAX_SHARE on JAX)."""
    return n if backend.kind != "jax" else max(10, n // JAX_SHARE)


def fuzz(n: int, backend: Any) -> Callable:
    """Decorator: run ``f(data)`` as a hypothesis test of :func:`cases` ``(n, backend)`` examples (used on
    a function defined inside the test, so the count can depend on the backend fixture)."""

    def wrap(f: Callable) -> Callable:
        count = [0]

        def counted(data: Any) -> None:
            f(data)
            count[0] += 1

        test = settings(max_examples=cases(n, backend), **SETTINGS)(given(data=st.data())(counted))

        def run() -> None:
            test()
            record(count[0])

        return run

    return wrap


def record(count: int) -> None:
    """Append the number of cases the current test ran to $GEOARRAY_FUZZ_COUNTS (a JSON-lines file), if set."""
    path = os.environ.get("GEOARRAY_FUZZ_COUNTS")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": test, "cases": count}) + "\n")


#: dtypes a fuzzed array may have (a backend without one, such as array-api-strict's float16, skips it)
DTYPES = ("float64", "float32", "float16", "int64", "complex128", "bool")

#: values a fuzzed scalar hyperparameter may take: valid ones and every kind of wrong one
BAD_SCALARS = st.sampled_from(
    [0.0, 0.5, 1.0, 2.0, 1e-3, -1.0, -1e-3, float("nan"), float("inf"), -float("inf"), 1e6,
     "oops", "0.1", True, False, None, [0.1], (0.1,), 1j, 3]
)  # fmt: skip


def snapshot(tree: Any) -> list[np.ndarray]:
    """Host copies of every array leaf of ``tree`` (for the bit-for-bit "not mutated" check)."""
    leaves = optree.tree_leaves(tree, none_is_leaf=False)
    return [to_numpy(x).copy() for x in leaves if hasattr(x, "shape") and hasattr(x, "dtype")]


def unchanged(before: list[np.ndarray], after: list[np.ndarray]) -> bool:
    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    return len(before) == len(after) and all(same(a, b) for a, b in zip(before, after, strict=True))


def outcome(call: Callable[[], Any], names: Iterable[str], inputs: Any = ()) -> tuple[Any, BaseException | None]:
    """``(result, None)`` or ``(None, error)`` for a ValueError/TypeError naming one of ``names``.

    Any other exception propagates (the test fails with its traceback); the array leaves of
    ``inputs`` must be bit-for-bit unchanged afterwards in both cases.
    """
    names = tuple(names)
    before = snapshot(inputs)
    try:
        # NumPy warns on NaN/inf arithmetic (an error under the suite's filter); non-finite results
        # from finite input are caught by the callers' finiteness checks instead
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            result, err = call(), None
    except (ValueError, TypeError) as exc:
        result, err = None, exc
        msg = str(exc)
        assert any(name in msg for name in names), f"{type(exc).__name__} does not name any of {names}: {msg}"
    assert unchanged(before, snapshot(inputs)), "an input was changed"
    return result, err


def finite(tree: Any) -> bool:
    return all(bool(np.all(np.isfinite(a))) for a in snapshot(tree) if a.dtype.kind in "fc")


def is_valid_number(v: Any, *, low: float = 0.0, high: float = math.inf, low_open: bool = False) -> bool:
    """A real (not bool) finite number within [low, high] (or (low, high] with ``low_open``)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    return (v > low if low_open else v >= low) and v <= high


def host_array(rng: np.random.Generator, shape: tuple[int, ...], special: str) -> np.ndarray:
    """A float64 host array of ``shape``: Gaussian, or with one NaN / ±inf / huge entry."""
    a = rng.normal(size=shape)
    if special != "finite" and a.size:
        a.reshape(-1)[rng.integers(a.size)] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "huge": 1e300}[special]
    return a


def to_backend(a: np.ndarray, xp: Any, device: Any, dtype: str) -> Any:
    """``a`` as an array of ``xp`` with dtype ``dtype`` (a name of :data:`DTYPES`), or None when the
    backend has no such dtype."""
    dt = getattr(xp, dtype, None)
    if dt is None:
        return None
    with np.errstate(all="ignore"):  # 1e30 or inf cast to an integer or to float16
        return _to_backend(a, xp, device, dtype, dt)


def _to_backend(a: np.ndarray, xp: Any, device: Any, dtype: str, dt: Any) -> Any:
    if dtype == "bool":
        a = a > 0
    elif dtype == "int64":
        a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0).round().astype(np.int64)
    elif dtype == "complex128":
        a = a.astype(np.complex128)
    if dtype in ("float16", "float32", "float64"):
        # rounded on the host (as every backend rounds: to nearest even): JAX would compile a conversion
        # program for every new shape
        a = a.astype(dtype)
    return xp.asarray(a, dtype=dt, device=device)
