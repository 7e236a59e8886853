"""Seeded random arrays that are the same on every backend.

The numbers are drawn on the host with :class:`numpy.random.Generator` (PCG64) in float64 and then
moved once to the requested namespace, dtype and device. So ``normal(0, (3, 4), xp=torch)`` and
``normal(0, (3, 4), xp=jax.numpy)`` hold the same values (up to the rounding of the requested
dtype), which is what makes results comparable across backends and runs reproducible.

Cost: one host draw plus one host→device copy of the result. That is negligible for initialising
weights and for the per-step sampling of the paper's Algorithm 2 at the sizes of its experiments;
for large per-step samples on a GPU a native generator would avoid the copy (not provided yet).

A ``seed`` is an ``int`` ≥ 0, a :class:`numpy.random.SeedSequence` or a
:class:`numpy.random.Generator`. Passing a Generator advances it, so successive calls give fresh
numbers; an int or SeedSequence gives the same numbers every time. Use :func:`spawn` to derive
independent child seeds.

For torch users (any backend): a ``torch.Generator`` is accepted as a seed — one 63-bit integer is
drawn from it (advancing it) and seeds the host draw, so ``torch.manual_seed(s)`` or
``torch.Generator().manual_seed(s)`` make the numbers reproducible; ``seed=None`` with ``xp=torch``
draws that integer from torch's default generator (the one ``torch.manual_seed`` sets).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

from . import _backend
from ._backend import as_namespace, resolve_dtype

__all__ = ["generator", "normal", "spawn", "uniform"]


def generator(seed: Any) -> np.random.Generator:
    """A :class:`numpy.random.Generator` for ``seed`` (an existing Generator is returned as is; a
    ``torch.Generator`` seeds a new one with an integer drawn from it)."""
    seed = _backend.host_seed(seed)
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, np.random.SeedSequence):
        return np.random.default_rng(seed)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(
            "seed must be a non-negative int, a numpy.random.SeedSequence, a numpy.random.Generator or a "
            f"torch.Generator (None only with xp=torch: torch's default generator), got {type(seed).__name__}"
        )
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return np.random.default_rng(int(seed))


def spawn(seed: Any, n: int) -> list[np.random.SeedSequence]:
    """``n`` statistically independent child seeds derived from ``seed``."""
    seed = _backend.host_seed(seed)
    if isinstance(seed, np.random.Generator):
        # numpy types seed_seq as the ISeedSequence interface; a Generator's bit generator seeded by
        # default_rng (or by any int or SeedSequence) holds a SeedSequence
        return list(cast(np.random.SeedSequence, seed.bit_generator.seed_seq).spawn(n))
    if isinstance(seed, np.random.SeedSequence):
        return list(seed.spawn(n))
    generator(seed)  # validates
    return list(np.random.SeedSequence(int(seed)).spawn(n))


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)):
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        # a bool (or anything else that is not a sequence of ints) fails here, and that is the check
        out = tuple(int(s) for s in cast("Iterable[Any]", shape))
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in out):
        raise ValueError(f"shape must be non-negative, got {out}")
    return out


def _to_backend(host: np.ndarray, xp: Any, dtype: Any, device: Any) -> Any:
    xp = as_namespace(xp)
    return _backend.from_host(host, xp, resolve_dtype(xp, dtype, device), device)


def normal(
    seed: Any,
    shape: int | Sequence[int],
    *,
    xp: Any,
    dtype: Any = None,
    device: Any = None,
    loc: float = 0.0,
    scale: float = 1.0,
) -> Any:
    """Standard normal samples (times ``scale`` plus ``loc``) as an array of ``xp``."""
    host = generator(_backend.host_seed(seed, xp)).normal(loc, scale, size=_shape(shape))
    return _to_backend(host, xp, dtype, device)


def uniform(
    seed: Any,
    shape: int | Sequence[int],
    *,
    xp: Any,
    low: float = 0.0,
    high: float = 1.0,
    dtype: Any = None,
    device: Any = None,
) -> Any:
    """Samples from U[low, high) as an array of ``xp``."""
    if not high > low:
        raise ValueError(f"uniform needs high > low, got low={low}, high={high}")
    host = generator(_backend.host_seed(seed, xp)).uniform(low, high, size=_shape(shape))
    return _to_backend(host, xp, dtype, device)
