"""The non-finite gradient policy (``on_nonfinite``) of every optimizer, written once.

``"skip"`` (the default, like torch's GradScaler) leaves the parameters and the whole state unchanged
for a step whose gradients are not all finite and counts it in ``state.skipped``; ``"raise"`` raises
``FloatingPointError`` naming the leaves (a host read: eager use only); ``"ignore"`` checks nothing.
An optimizer's ``update`` calls the two halves of the policy around its own step:

1. :func:`gate` before the step. Where the flag may be read to the host (eager, by the host reads
   policy of :func:`geoarray.set_host_reads`) it is read once: a skipped step returns at once with its
   count raised (and warns at the first of a state's history, :class:`NonFiniteGradientWarning`), a
   finite one runs with no masks. Elsewhere (``jax.jit``, ``torch.compile``, eager on a GPU) the flag
   stays on the device, and the gradients of a step to be skipped are zeroed so that no NaN reaches a
   LAPACK-backed kernel.
2. :func:`keep_where_finite` after it, where the flag stayed on the device: the old value of every
   array of the state where the flag is false, bit for bit, and the skip counted; the optimizer selects
   its new parameters with :func:`chooser` the same way (per group, before they are unpacked and cast
   back to a half-precision dtype).

A step may also be skipped for a reason outside the optimizer: ``update(..., skip=flag)`` (a
``GradScaler``'s ``found_inf``, which :mod:`geoarray.torch` hands over). :func:`gate` then takes the step
where ``not flag`` (and, under ``"skip"``, every gradient finite) on the device, and
:func:`keep_where_finite` keeps the old state there without counting it in ``skipped``: the flag's owner
counts it. One mechanism, so that no caller has to poison gradients to make the optimizer skip.

Used by :class:`~geoarray.optim.RiemannianOptimizer` (every Algorithm-1 optimizer) and
:class:`~geoarray.optim.ManifoldMuon`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import optree

from .. import _backend
from .._typing import Array
from .layout import Layout

__all__ = [
    "ON_NONFINITE",
    "NonFiniteGradientWarning",
    "check_policy",
    "check_skip",
    "chooser",
    "gate",
    "keep_where_finite",
]

ON_NONFINITE = ("skip", "raise", "ignore")


class NonFiniteGradientWarning(UserWarning):
    """Some optimizer updates were skipped because a gradient was not finite (``on_nonfinite="skip"``)."""


def check_policy(on_nonfinite: Any) -> str:
    """``on_nonfinite`` itself, or a ``ValueError`` naming the choices."""
    if on_nonfinite not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
    return on_nonfinite


def _readable(flag: Array) -> bool:
    """Whether the flag may be read to the host (eager, where the host reads policy allows it) or must
    be masked on the device (traced, or no host reads). A seam of its own: the tests force the masked
    route with everything else unchanged."""
    return _backend.host_reads_allowed(flag)


def finiteness(on_nonfinite: str, layout: Layout, gleaves: list, packed: list, xp: Any) -> Array | bool | None:
    """Whether every gradient is finite, for the policy ``on_nonfinite``: a Python bool when the value
    may be read to the host (eager, :func:`geoarray.set_host_reads`), a 0-d boolean array to mask with
    otherwise, None for no check. Checked on the packed groups, so a tree of many leaves costs a few
    reductions (369 ViT leaves: 2), not one per leaf; ``"raise"`` checks per leaf to name the culprits
    (a host read by design)."""
    if on_nonfinite == "ignore":
        return None
    if on_nonfinite == "raise":
        flags = [xp.all(xp.isfinite(g)) for g in gleaves]
        bad = [p for f, p in zip(flags, layout.paths, strict=True) if not bool(f)]
        if bad:
            raise FloatingPointError(f"non-finite gradient for {', '.join(bad)}; parameters and state unchanged")
        return None
    if _readable(packed[0]):
        return _backend.all_finite_on_host(packed, xp)
    finite = None
    for G in packed:
        flag = _backend.all_finite(G, xp)
        finite = flag if finite is None else xp.logical_and(finite, flag)
    return finite


def gate(
    on_nonfinite: str,
    layout: Layout,
    gleaves: list,
    packed: list,
    state: Any,
    xp: Any,
    *,
    depth: int = 1,
    skip: Any = None,
) -> tuple[Any, list, Any]:
    """The policy before a step: ``(finite, packed, skipped)``.

    ``skipped`` is not None when the step is skipped on the host's word: it is ``state`` with its
    ``skipped`` count raised by one, to be returned with the old parameters, nothing computed.
    Otherwise ``finite`` is None (no masks needed: the flag was read and true, or the policy checks
    nothing) or a 0-d boolean array on the device, and ``packed`` are the gradients, zeroed where that
    flag is false. ``state`` is a NamedTuple with a ``skipped`` field. ``depth``: the frames between the
    caller of ``gate`` and the user's call of ``update`` (1: ``gate`` is called in ``update`` itself), so
    that the warning of a first skipped step points at the user's line.

    ``skip``: a reason to skip the step that comes from outside the optimizer (a ``GradScaler``'s
    ``found_inf``; see :func:`check_skip`), a 0-d boolean array or a bool. A step it skips is not taken
    and not counted in ``skipped`` (its owner counts it). It is combined with the finiteness flag on the
    device and never read to the host, except under ``"raise"``, whose check reads anyway: a skipped
    step then raises nothing (its gradients are the outside reason's to judge) and returns ``state``
    unchanged."""
    if skip is not None and not isinstance(skip, bool):
        return _gate_with_skip(on_nonfinite, layout, gleaves, packed, state, xp, skip)
    if skip:
        return None, packed, state
    finite = finiteness(on_nonfinite, layout, gleaves, packed, xp)
    if isinstance(finite, bool):
        if finite:
            return None, packed, None
        skipped = state._replace(skipped=_backend.as_array(state.skipped + 1))
        _warn_skipped(state, skipped, stacklevel=3 + depth)
        return None, packed, skipped
    if finite is not None:
        packed = [xp.where(finite, G, xp.zeros((), dtype=G.dtype, device=_backend.device(G))) for G in packed]
    return finite, packed, None


def check_skip(skip: Any) -> Any:
    """``skip`` itself (None, a bool or a 0-d boolean array: an optimizer's ``update(..., skip=)``), or a
    ``TypeError`` naming what it got."""
    if skip is None or isinstance(skip, bool):
        return skip
    shape, dtype = getattr(skip, "shape", None), getattr(skip, "dtype", None)
    if shape is None or tuple(shape) != () or dtype is None or "bool" not in str(dtype):
        raise TypeError(
            "skip must be None, a bool or a 0-d boolean array (true: the step is skipped for a reason outside the "
            f"optimizer, such as a GradScaler's found_inf), got {type(skip).__name__} "
            f"{'with shape ' + str(tuple(shape)) + ' and dtype ' + str(dtype) if shape is not None else repr(skip)}"
        )
    return skip


def _gate_with_skip(
    on_nonfinite: str, layout: Layout, gleaves: list, packed: list, state: Any, xp: Any, skip: Array
) -> tuple[Any, list, Any]:
    """:func:`gate` with an outside skip flag on the device: the flag to take the step by is ``not skip``
    (and, under ``"skip"``, every gradient finite), and the gradients are zeroed where it is false."""
    if on_nonfinite == "raise":
        if bool(skip):
            return None, packed, state
        finiteness(on_nonfinite, layout, gleaves, packed, xp)
        return None, packed, None
    where = _backend.device(packed[0]) if packed else None
    take = xp.logical_not(xp.asarray(skip, device=where) if where is not None else skip)
    if on_nonfinite == "skip":
        for G in packed:
            take = xp.logical_and(take, _backend.all_finite(G, xp))
    packed = [xp.where(take, G, xp.zeros((), dtype=G.dtype, device=_backend.device(G))) for G in packed]
    return take, packed, None


def chooser(finite: Array | None, xp: Any) -> Callable[[Any, Any], Any]:
    """``keep(new, old)``: ``new`` where ``finite`` (or always, for None), else ``old``, bit for bit."""
    if finite is None:
        return lambda new, old: new
    return lambda new, old: _backend.where(finite, new, old, xp)


def keep_where_finite(finite: Array | None, new_state: Any, old_state: Any, xp: Any, *, skip: Any = None) -> Any:
    """The policy after a step whose flag stayed on the device: every array of ``new_state`` (a
    NamedTuple pytree with a ``skipped`` count; its static nodes, such as the layout, untouched) where
    ``finite``, else the array of ``old_state``; ``skipped`` raised by one where not, unless an outside
    ``skip`` flag (:func:`gate`) is what made it false. ``new_state`` itself for ``finite`` None."""
    if finite is None:
        return new_state
    keep = chooser(finite, xp)
    # the count is left out of the selection (None is an empty subtree) and counted instead
    masked: Any = optree.tree_map(keep, new_state._replace(skipped=None), old_state._replace(skipped=None))
    count = old_state.skipped
    counted = xp.logical_not(finite)
    if skip is not None and not isinstance(skip, bool):
        counted = xp.logical_and(counted, xp.logical_not(xp.asarray(skip, device=_backend.device(counted))))
    return masked._replace(skipped=_backend.as_array(count + xp.astype(counted, count.dtype)))


def _warn_skipped(before: Any, after: Any, *, stacklevel: int) -> None:
    """Warn at the first skipped eager update of a state's history (``before.skipped`` is zero; traced
    updates cannot warn: ``state.skipped`` counts them), at the user's call of ``update`` (``stacklevel``:
    this, :func:`gate`, the optimizer's frames, the user's)."""
    if int(before.skipped) != 0:
        return
    skipped = int(after.skipped)
    warnings.warn(
        f"{skipped} of {int(after.step) + skipped} optimizer updates were skipped because a gradient was not "
        "finite; parameters and optimizer state were left unchanged for those steps. state.skipped counts "
        "them; on_nonfinite='raise' stops at the first one, 'ignore' lets NaN through.",
        NonFiniteGradientWarning,
        stacklevel=stacklevel,
    )
