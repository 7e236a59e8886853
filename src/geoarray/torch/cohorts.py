"""Cohorts: the parameters of a param group that step together, their core and its batched state —
and the form the states take in :meth:`geoarray.torch.Optimizer.state_dict`.

The state of a param group is batched over the parameters that first stepped together (a *cohort*),
so that same-shaped weights of one manifold are updated by one call. In a ``state_dict`` each cohort is
``{"indices", "structure", "leaves"}``: the positions of its parameters in the group, the state's
pytree structure (compared when loading, so the state of another optimizer is refused) and the state's
leaves as tensors with their dtypes and memory layouts (``torch.save`` of them loads with
``weights_only=True``, and resuming is bit-exact).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import optree
import torch

from ..optim.riemannian import RiemannianOptimizer

if TYPE_CHECKING:
    from ..optim.manifold_muon import ManifoldMuon
    from ..optim.partition import PartitionedOptimizer

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Cohort",
    "eager_first_message",
    "probe_point",
    "restore_state",
    "saved_groups",
    "write_state",
]

#: the ``format`` and ``version`` of the ``"geoarray"`` entry of a state_dict
FORMAT = "geoarray.torch.Optimizer"
FORMAT_VERSION = 1

#: what steps a cohort: one of :data:`geoarray.optim.OPTIMIZER_TYPES`
Core: TypeAlias = "RiemannianOptimizer | ManifoldMuon | PartitionedOptimizer"


@dataclass
class Cohort:
    """Parameters of one group that step together, with the core that updates them and its state."""

    indices: tuple[int, ...]  # positions in group["params"]
    shapes: tuple[tuple[int, ...], ...]
    core: Core | None  # None in a pickled copy, until its next step rebuilds it (its key is None too)
    state: Any  # the core's state (RiemannianState, ManifoldMuonState, …), a pytree
    key: Any  # the hyperparameters the core was built from
    # (dtype, device) of each parameter when the state was built: the state lives there
    where: tuple[tuple[torch.dtype, torch.device], ...] = ()
    # True once the state's tensors are fixed buffers, written in place by every step (capturable=True):
    # a CUDA graph replays reads and writes of fixed addresses
    buffers: bool = False
    # True from load_state_dict until the first eager step has checked that the weights lie near their
    # manifolds (Optimizer._check_restored): restoring skips the check of a fresh cohort
    restored: bool = False
    # the core's live hyperparameters (geoarray.torch.param_groups.live): set from the group before every
    # update of the core, which reads them and never the group
    cells: tuple = ()

    def entry(self) -> dict:
        """This cohort's entry in a state_dict (module docstring)."""
        return {
            "indices": list(self.indices),
            "structure": str(optree.tree_structure(self.state)),
            "leaves": optree.tree_leaves(self.state),
        }


def saved_groups(state_dict: dict, n_groups: int) -> list:
    """The per-group cohort entries of a state_dict written by :meth:`geoarray.torch.Optimizer.state_dict`;
    ``ValueError`` if it was written by another optimizer or format, or for another number of groups."""
    geo = state_dict.get("geoarray")
    if not isinstance(geo, dict) or geo.get("format") != FORMAT:
        raise ValueError("state_dict has no 'geoarray' entry: it was not written by a geoarray.torch optimizer")
    if geo.get("version") != FORMAT_VERSION:
        raise ValueError(f"state_dict has geoarray format version {geo.get('version')!r}, this reads {FORMAT_VERSION}")
    groups = geo["groups"]
    if len(groups) != n_groups:
        raise ValueError(f"state_dict has {len(groups)} param groups, this optimizer {n_groups}")
    return groups


def restore_state(cohort: Cohort, entry: dict, gi: int) -> None:
    """Replace ``cohort.state`` (a fresh state of the right structure) by the saved ``entry``'s;
    ``ValueError`` naming the mismatch, changing nothing, if the entry's structure, number, shapes or
    dtypes of tensors differ."""
    like_leaves: list[Any]
    like_leaves, treedef = optree.tree_flatten(cohort.state)
    if entry["structure"] != str(treedef):
        raise ValueError(
            f"state_dict: param group {gi} holds the state of another optimizer or parameter set:\n"
            f"  saved: {entry['structure']}\n  here:  {treedef}"
        )
    leaves = list(entry["leaves"])
    if len(leaves) != len(like_leaves):
        raise ValueError(f"state_dict: param group {gi} has {len(leaves)} state tensors, expected {len(like_leaves)}")
    restored = []
    for k, (t, like) in enumerate(zip(leaves, like_leaves, strict=True)):
        if not isinstance(t, torch.Tensor) or t.shape != like.shape or t.dtype != like.dtype:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"state_dict: state tensor {k} of param group {gi} is {got}, expected {tuple(like.shape)} {like.dtype}"
            )
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            # a damaged or edited file: the next step would write NaN into the parameters (one host read
            # per state tensor, at load)
            raise ValueError(
                f"state_dict: state tensor {k} of param group {gi} holds non-finite values; the optimizer "
                "state is damaged: load an intact checkpoint"
            )
        # keep the saved memory layout: BLAS kernels round differently per layout
        restored.append(t.detach().to(device=like.device).clone(memory_format=torch.preserve_format))
    cohort.state = optree.tree_unflatten(treedef, restored)


def eager_first_message(group: dict, gi: int, item: Any, name: Callable) -> str:
    """Why a compiled step cannot go on: building a core's state (a first step, changed structural
    hyperparameters) runs eagerly — it checks the weights (host reads) and registers the kernels the
    traced update calls."""
    if isinstance(item, tuple):
        names = ", ".join(name(group, gi, i) for i in item)
        what = f"{names} take their first step here"
    else:
        what = f"the hyperparameters of param group {gi} changed (its core is rebuilt)"
    return (
        f"a compiled or graph-captured optimizer step cannot build optimizer state: {what}. Run that step "
        "eagerly (call opt.step() once, uncompiled and outside the capture, before the compiled or captured "
        "steps, and again after changing hyperparameters other than those read at every step such as lr)"
    )


def write_state(cohort: Cohort, state: Any, capturable: bool) -> None:
    """Make ``state`` the cohort's: by reference, or with ``capturable`` by copying it into the
    cohort's fixed state buffers (made at the first such write, which the step refuses inside a capture:
    cloned, so that no two leaves share memory)."""
    if not capturable:
        cohort.state, cohort.buffers = state, False
    elif cohort.buffers:
        torch._foreach_copy_(optree.tree_leaves(cohort.state), optree.tree_leaves(state))
    else:
        cohort.state = optree.tree_map(lambda t: t.clone(memory_format=torch.preserve_format), state)
        cohort.buffers = True


def probe_point(manifold: Any, p: torch.Tensor) -> torch.Tensor:
    """A point of ``manifold`` with the shape, dtype and device of ``p`` (for binding a core's layout)."""
    k = len(manifold.point_shape or ())
    if not k:
        return p.detach()
    return manifold.random(0, xp=torch, batch_shape=tuple(p.shape[: p.ndim - k]), dtype=p.dtype, device=p.device)
