"""Windowing of trajectories into (input window, prediction window) pairs, shuffling and batching."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import random as _random
from .._backend import array_namespace

__all__ = ["batches", "shuffle", "windows"]

from .._typing import Array


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int ≥ {minimum}, got {value!r}")
    return value


def windows(trajectories: Array, input_len: int, output_len: int = 1, *, stride: int = 1) -> tuple[Array, Array]:
    """All (input, target) pairs of consecutive windows.

    ``trajectories`` (n_traj, N, d) or (N, d). For every start s = 0, stride, … with
    s + input_len + output_len ≤ N: input = traj[s : s + input_len], target =
    traj[s + input_len : s + input_len + output_len]. Returns inputs (M, input_len, d) and targets
    (M, output_len, d), M = n_traj · n_windows, ordered trajectory-major.
    """
    xp = array_namespace(trajectories)
    if trajectories.ndim == 2:
        trajectories = trajectories[None, ...]
    if trajectories.ndim != 3:
        raise ValueError(f"trajectories: expected shape (n_traj, N, d) or (N, d), got {tuple(trajectories.shape)}")
    input_len = _check_int(input_len, "input_len", 1)
    output_len = _check_int(output_len, "output_len", 1)
    stride = _check_int(stride, "stride", 1)
    n_traj, N, d = trajectories.shape
    if input_len + output_len > N:
        raise ValueError(
            f"trajectories: need at least input_len + output_len = {input_len + output_len} time steps, got N={N}"
        )
    if not bool(xp.all(xp.isfinite(trajectories))):
        raise ValueError("trajectories: contains NaN or infinite values")
    starts = range(0, N - input_len - output_len + 1, stride)
    x = xp.stack([trajectories[:, s : s + input_len, :] for s in starts], axis=1)
    y = xp.stack([trajectories[:, s + input_len : s + input_len + output_len, :] for s in starts], axis=1)
    m = n_traj * len(starts)
    return xp.reshape(x, (m, input_len, d)), xp.reshape(y, (m, output_len, d))


def shuffle(inputs: Array, targets: Array, seed: Any) -> tuple[Array, Array]:
    """The same random permutation (from ``seed``, via :mod:`geoarray.random`) of the first axis of both."""
    xp = array_namespace(inputs, targets)
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(f"targets: expected {inputs.shape[0]} samples like inputs, got shape {tuple(targets.shape)}")
    perm_host = _random.generator(seed).permutation(inputs.shape[0])
    perm = xp.asarray(perm_host, device=getattr(inputs, "device", None))
    return xp.take(inputs, perm, axis=0), xp.take(targets, perm, axis=0)


def batches(
    inputs: Array, targets: Array, batch_size: int, *, seed: Any = None, drop_last: bool = False
) -> Iterator[tuple[Array, Array]]:
    """Mini-batches of ``batch_size`` along the first axis, shuffled first when ``seed`` is given."""
    batch_size = _check_int(batch_size, "batch_size", 1)
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(f"targets: expected {inputs.shape[0]} samples like inputs, got shape {tuple(targets.shape)}")
    if seed is not None:
        inputs, targets = shuffle(inputs, targets, seed)
    n = inputs.shape[0]
    stop = n - n % batch_size if drop_last else n
    for i in range(0, stop, batch_size):
        j = min(i + batch_size, n)  # out-of-bounds slice stops are unspecified in the array API
        yield inputs[i:j, ...], targets[i:j, ...]
