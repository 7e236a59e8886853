"""Ranks that take a step together: the ``skip_together`` option of :class:`geoarray.torch.Optimizer`.

An optimizer step may be skipped — a non-finite gradient (``on_nonfinite="skip"``), and without host
reads (:func:`geoarray.set_host_reads`) also a step whose new points are not finite, one beyond the
retraction's fixed doubling budget. Each optimizer decides that from the parameters it holds. Under
ZeRO (``torch.distributed.optim.ZeroRedundancyOptimizer``) each rank's optimizer holds a partition of
the model, so the rank whose partition holds the NaN skips while the others step: a partial step, where
one process — and ``GradScaler`` over the ZeRO optimizer — skips the whole step.

With ``skip_together=True`` in a param group, the ranks of the default process group agree after
computing their updates and before writing them: one all-reduce (MIN) of a 0-dimensional int32 "every
such cohort of this rank took its step", and where any rank's did not, every such cohort on every rank
keeps its old values and state and counts the step in its ``skipped`` (selected on the device: no host
read). The option is a param-group key holding a bool, not a process group, because ZeRO copies its
keywords into its own param groups, which its ``state_dict`` saves (a process group cannot be pickled).
The agreement spans all ranks of the default group: under data parallelism they all step each time.
A cohort of FSDP2's DTensors (``geoarray.torch._dtensor``) agrees through the same :func:`agree_on_step`,
over the groups of its device mesh.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optree
import torch

__all__ = ["agree_on_step", "check_skip_together", "keep_where_taken"]


def check_skip_together(group: dict, gi: Any) -> None:
    """``TypeError`` unless the group's ``skip_together`` is a bool; ``ValueError`` if it is True without
    an initialised default process group, or with ``on_nonfinite="raise"`` (the rank that raised would
    leave the others waiting in the all-reduce)."""
    value = group.get("skip_together", False)
    if not isinstance(value, bool):
        raise TypeError(
            f"param_groups[{gi}]['skip_together'] must be True or False, got {value!r} (the agreement is over "
            "the default process group, torch.distributed.group.WORLD)"
        )
    if not value:
        return
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"param_groups[{gi}] has skip_together=True, which needs torch.distributed's default process group: "
            "call torch.distributed.init_process_group first, or set skip_together=False"
        )
    if group.get("on_nonfinite") == "raise":
        raise ValueError(
            f"param_groups[{gi}] has skip_together=True with on_nonfinite='raise': the rank that raised would "
            "leave the others waiting in the all-reduce; use on_nonfinite='skip' (the ranks skip together) "
            "or skip_together=False"
        )


def agree_on_step(results: list, device: torch.device, groups: Sequence[Any] = (None,)) -> list:
    """The values and states to write after the ranks agreed on taking the step: the one agreement of
    geoarray.torch's steps, for ZeRO's ``skip_together`` (the default process group, over every such cohort
    of the rank) and for a cohort of FSDP2's DTensors (``_dtensor.Views.agree``: the groups of its device
    mesh, one per dimension).

    ``results`` holds, per cohort, ``(leaves, new, old_state, new_state)`` — its old values, its computed
    values, its state before and after the core's update — or None for a cohort outside the agreement.
    One all-reduce (MIN) per process group in ``groups`` (None: the default group) of a 0-d int32 on
    ``device``, "every cohort of this rank took its step" (its ``skipped`` count did not grow). Returns
    ``(values, state)`` per agreeing cohort, None for the others."""
    import torch.distributed as dist

    took = torch.ones((), dtype=torch.int32, device=device)
    for r in results:
        if r is not None:
            took = took * (r[3].skipped == r[2].skipped).to(device=device, dtype=torch.int32)
    for group in groups:
        dist.all_reduce(took, op=dist.ReduceOp.MIN, group=group)
    every = took.bool()
    return [None if r is None else keep_where_taken(every, r[0], r[1], r[2], r[3], count_skip=True) for r in results]


def keep_where_taken(
    taken: torch.Tensor, leaves: list, new: list, old_state: Any, new_state: Any, *, count_skip: bool
) -> tuple[list, Any]:
    """The new values and state where ``taken`` (a 0-d bool tensor), the old ones elsewhere, selected on
    each tensor's device: no host read. The one selection of every step that is taken or not as a whole —
    the ranks' agreement (:func:`agree_on_step`, and FSDP's in ``_dtensor.Views.agree``) and a GradScaler's
    skip (``_grad_scaler``). With ``count_skip`` a step not taken is counted in ``skipped`` once
    (``old + 1``: a cohort whose core skipped by itself had counted it already); without, the count is
    selected like the rest (the scaler's skip is not the core's to count)."""

    def keep(n: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return torch.where(taken.to(n.device), n, o)

    values = [keep(n, o) for n, o in zip(new, leaves, strict=True)]
    if not count_skip:
        return values, optree.tree_map(keep, new_state, old_state)
    # the count is left out of the selection (None is an empty subtree) and counted instead
    kept: Any = optree.tree_map(keep, new_state._replace(skipped=None), old_state._replace(skipped=None))
    old = old_state.skipped
    return values, kept._replace(skipped=old + torch.logical_not(taken).to(device=old.device, dtype=old.dtype))
