"""Rolling a one-step or sequence model forward in time."""

from __future__ import annotations

from typing import Any

from .._backend import array_namespace

__all__ = ["iterate"]


def iterate(model: Any, params: Any, initial_window: Any, n_steps: int) -> Any:
    """Predict ``n_steps`` new states after ``initial_window`` (..., T, d).

    The model maps a window of T states to the next T states (one-step models have T = 1 and act
    pointwise); it is applied ⌈n_steps / T⌉ times, each time to its own last output. Returns
    (..., T + n_steps, d): the initial window followed by the predictions.
    """
    xp = array_namespace(initial_window)
    if initial_window.ndim < 2:
        raise ValueError(f"initial_window: expected shape (..., T, d), got {tuple(initial_window.shape)}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"n_steps: expected a non-negative int, got {n_steps!r}")
    T = initial_window.shape[-2]
    seq_len = getattr(model, "seq_len", None)
    if seq_len is not None and seq_len != T:
        raise ValueError(
            f"initial_window: model expects T={seq_len} time steps, got shape {tuple(initial_window.shape)}"
        )
    parts = [initial_window]
    window = initial_window
    produced = 0
    while produced < n_steps:
        window = model.apply(params, window)
        parts.append(window)
        produced += T
    out = xp.concat(parts, axis=-2)
    return out[..., : T + n_steps, :]
