"""Optimizer checkpoints that resume on another number of ranks, through ``torch.distributed.checkpoint``.

A :class:`geoarray.torch.Optimizer` keeps its state per *cohort* (the parameters that first stepped
together, their same-shaped manifold weights stacked and Euclidean tensors raveled: the batched
updates of Algorithm 1 of Brantner, *Generalizing Adam to Manifolds for Efficiently Training
Transformers*), and under FSDP2 each rank holds the state of what it steps (``geoarray.torch._dtensor``:
its frames of a stack, its rows of an element-wise-updated tensor, or a whole matrix it owns). Its
``state_dict()`` is that rank's cohort state: it resumes bit for bit on the same ranks, not on others.

torch's ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` reads per-parameter
dicts from ``optimizer.state_dict()["state"]`` (geoarray's is empty: the state lives under
``"geoarray"``) and initialises a stateless optimizer by a step with zero gradients and ``lr=0``
(which would move geoarray's moments and step counters), so it cannot carry geoarray's state. The two
functions here have its contract instead::

    import torch.distributed.checkpoint as dcp
    from geoarray.torch.checkpoint import get_optimizer_state_dict, set_optimizer_state_dict

    dcp.save({"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)

    # later, on any number of ranks (or one process without FSDP): a fresh model and optimizer
    state = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}  # the templates
    dcp.load(state, checkpoint_id=path)                       # reshards to this run's placements
    model.load_state_dict(state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])

``get_optimizer_state_dict`` splits each cohort state into **one entry per parameter and state
tensor**, keyed by the parameter's name in ``model`` (``state[fqn][slot]``), each a DTensor placed as
the parameter is (for a rank's frames, rows or elements: ``DTensor.from_local`` of what the rank
holds — no communication), a DTensor in the parameter's row blocks scattered from the owner (a
matrix stepped whole on one rank), or a plain tensor (a parameter that is not a DTensor, or gathered
on every rank). A *slot* is the state tensor's path in the cohort state with the group index
replaced by ``*`` (``"2.1.1.*.0"``: the A block of Adam's first moment); a state tensor of the whole
cohort (step and skip counters) is repeated under every parameter. ``dcp.load`` then reads into each
template the part of the saved tensors its rank needs, and ``set_optimizer_state_dict`` packs the
parts back into cohort states (stacking and raveling as the new run's layout does). The same
checkpoint therefore loads on W' ≠ W ranks, or in one process, and the resumed run equals the
uninterrupted one to rounding (on different ranks the gradients are reduce-scattered means, which
round differently) — bit for bit only on the same ranks, where ``optimizer.state_dict()`` also serves.

The core cuts a cohort state into these pieces and packs them back
(:func:`geoarray.optim.layout.state_pieces` and :func:`~geoarray.optim.layout.state_from_pieces`, on every
backend); the per-group entries are those the state declares
(:func:`geoarray.optim.layout.per_group_nodes`: its ``per_group_paths``, each transform's per-group
fields declared with :func:`~geoarray.optim.layout.per_leaf`): a tuple with one entry per layout group
(or per Euclidean group), each entry's tensors leading with that group's packed shape. Every core of
geoarray.optim that keeps a ``layout`` declares them (Adam, SGD, Momentum, PaperAdam, BFGS,
ManifoldMuon, Muon, ``riemannian(...)``); a core whose state has no layout is refused (``TypeError``).

Under ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO-1) both functions take the ZeRO
optimizer: each rank saves and loads the state of its own partition (ZeRO's ``consolidate_state_dict``
gathers torch's per-parameter ``"state"`` only, which geoarray's optimizers leave empty, and its
``load_state_dict`` then leaves them without state); cohorts are then one per param group.

A template from an optimizer that has not stepped assumes one cohort per param group (every
parameter of the group stepped at the first step, the usual case); a checkpoint whose cohorts differ
is refused with a ``ValueError`` naming them. Memory: a matrix owned by one rank is gathered whole on
every rank while it is loaded (``full_tensor``), one matrix at a time.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..optim.layout import state_from_pieces, state_pieces
from . import _dtensor

__all__ = ["get_optimizer_state_dict", "set_optimizer_state_dict"]

_HYPER_SKIP = frozenset({"params", "param_names"})
_NOT_HYPER = _HYPER_SKIP | {"initial_lr"}  # an LR scheduler's bookkeeping


def _pieces(state: Any) -> list:
    """The cohort state cut per parameter by the core (:func:`geoarray.optim.layout.state_pieces`)."""
    try:
        return state_pieces(state)
    except TypeError as exc:
        raise TypeError(f"{exc}: save it with optimizer.state_dict() and resume on the same ranks") from None


# -- one piece, as this rank holds it ↔ as dcp saves it ------------------------------------------------


def _distinct(t: torch.Tensor, seen: set) -> torch.Tensor:
    """``t`` contiguous, and a copy where its memory is another entry's: a fresh state's moments may share
    one zero tensor, and ``dcp.load`` writes into the template's memory in place."""
    key = (t.untyped_storage().data_ptr(), t.storage_offset())
    if key in seen or not t.is_contiguous():
        t = t.clone(memory_format=torch.contiguous_format)
    seen.add((t.untyped_storage().data_ptr(), t.storage_offset()))
    return t


def _export(piece: torch.Tensor, p: Any, mode: str, owner: int | None, seen: set) -> Any:
    piece = _distinct(piece, seen)
    if mode in ("plain", "all"):
        return piece
    from torch.distributed.tensor import DTensor, Shard

    mesh = p.device_mesh
    if mode == "local":  # the cut is in the dims the piece shares with the parameter: placed as it is
        full = list(piece.shape)
        for pl in p.placements:
            if isinstance(pl, Shard):
                full[pl.dim % p.ndim] = p.shape[pl.dim % p.ndim]
        strides = [math.prod(full[d + 1 :]) for d in range(len(full))]
        return DTensor.from_local(
            piece, mesh, p.placements, run_check=False, shape=torch.Size(full), stride=tuple(strides)
        )
    # "owner": the whole piece on one rank (of each replica group), an empty batch (0, …) elsewhere;
    # saved in the parameter's row blocks, scattered from the owner
    assert owner is not None, "an owned parameter has an owner rank"
    d = _dtensor._shard_dim(p)
    mine = mesh.get_local_rank(d) == owner
    shape = tuple(piece.shape) if mine else tuple(piece.shape[1:])
    if not shape:
        import torch.distributed as dist

        whole = piece.clone() if mine else piece.new_zeros(())
        group = mesh.get_group(d)
        dist.broadcast(whole, dist.get_global_rank(group, owner), group=group)
        return whole
    rows = _dtensor.scatter_rows(owner, piece if mine else None, shape, p, like=piece)
    stride = tuple(math.prod(shape[k + 1 :]) for k in range(len(shape)))
    return DTensor.from_local(rows, mesh, p.placements, run_check=False, shape=torch.Size(shape), stride=stride)


def _import(value: Any, like: torch.Tensor, p: Any, mode: str, owner: int | None, where: str) -> torch.Tensor:
    if _dtensor._is_dtensor(value):
        if mode == "local":
            value = value.to_local()
        else:
            value = value.full_tensor()
    if mode == "owner" and p.device_mesh.get_local_rank(_dtensor._shard_dim(p)) != owner:
        value = value.new_empty((0, *value.shape))
    if not isinstance(value, torch.Tensor) or value.shape != like.shape or value.dtype != like.dtype:
        got = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"optimizer state dict: {where} is {got}, this run needs {tuple(like.shape)} {like.dtype}")
    return value.to(like.device)


# -- the public pair -----------------------------------------------------------------------------------


def _names(model: Any, optimizer: Any) -> list[list[str]]:
    by_id = {id(p): fqn for fqn, p in model.named_parameters(remove_duplicate=False)}
    out = []
    for gi, group in enumerate(optimizer.param_groups):
        missing = [i for i, p in enumerate(group["params"]) if id(p) not in by_id]
        if missing:
            raise ValueError(
                f"param_groups[{gi}]['params'][{missing[0]}] is not a parameter of model: pass the model whose "
                "parameters the optimizer steps"
            )
        out.append([by_id[id(p)] for p in group["params"]])
    return out


def _modes(optimizer: Any, group: dict, params: list) -> tuple[list, dict]:
    modes = [_dtensor._mode(p, optimizer, group) if _dtensor._is_dtensor(p) else "plain" for p in params]
    owners = _dtensor._owners(optimizer, group, params, modes) if "owner" in modes else {}
    return modes, owners


def _cohorts_or_templates(optimizer: Any) -> list[list]:
    """The optimizer's cohorts; for a param group that has not stepped, one fresh cohort of all its
    parameters (what its first step builds when every parameter has a gradient)."""
    out = []
    for gi, group in enumerate(optimizer.param_groups):
        cohorts = optimizer._cohorts[gi]
        if not cohorts and group["params"]:
            cohorts = [optimizer._new_cohort(group, gi, tuple(range(len(group["params"]))), restoring=True)]
        out.append(cohorts)
    return out


@torch.no_grad()
def get_optimizer_state_dict(model: Any, optimizer: Any) -> dict:
    """The optimizer state as one entry per parameter of ``model`` and state tensor, placed as the
    parameter is (module docstring), with the param groups' hyperparameters and the cohorts — for
    ``torch.distributed.checkpoint.save``, or as the template ``dcp.load`` fills. Collective where the
    parameters are DTensors: every rank calls it, in the same order."""
    outer, optimizer = optimizer, _local(optimizer)
    names = _names(model, optimizer)
    state: dict = {}
    cohorts_out: list = []
    seen: set = set()
    for gi, (group, cohorts) in enumerate(zip(optimizer.param_groups, _cohorts_or_templates(optimizer), strict=True)):
        listed = []
        for cohort in cohorts:
            params = [group["params"][i] for i in cohort.indices]
            modes, owners = _modes(optimizer, group, params)
            pieces = []
            for slot, j, value in _pieces(cohort.state):
                if j is None:
                    shared = _distinct(value, seen)  # one tensor under every parameter
                    for i in cohort.indices:
                        state.setdefault(names[gi][i], {})[slot] = shared
                else:
                    pieces.append((j, slot, value))
            # in the same order on every rank (the collectives of owned matrices must pair up): the
            # layout's groups are not — they stack the matrices a rank owns apart from those it does not
            for j, slot, piece in sorted(pieces, key=lambda t: (t[0], t[1])):
                p = params[j]
                entry = state.setdefault(names[gi][cohort.indices[j]], {})
                entry[slot] = _export(piece, p, modes[j], owners.get(id(p)), seen)
            listed.append([names[gi][i] for i in cohort.indices])
        cohorts_out.append(listed)
    saved_cohorts: list | None = cohorts_out
    if outer is not optimizer:  # ZeRO: this rank's part of each group; the cohorts are the default ones
        saved_cohorts = None
    outer_names = _names(model, outer)
    groups = [
        {**{k: v for k, v in g.items() if k not in _HYPER_SKIP}, "params": outer_names[gi]}
        for gi, g in enumerate(outer.param_groups)
    ]
    return {"state": state, "param_groups": groups, "cohorts": saved_cohorts}


def _local(optimizer: Any) -> Any:
    """The geoarray optimizer that holds the state: ``ZeroRedundancyOptimizer``'s ``optim`` (this
    rank's partition of every param group, in the same group order), else ``optimizer``."""
    if type(optimizer).__name__ == "ZeroRedundancyOptimizer" and hasattr(optimizer, "optim"):
        return optimizer.optim
    return optimizer


@torch.no_grad()
def set_optimizer_state_dict(model: Any, optimizer: Any, state_dict: dict) -> None:
    """Load a :func:`get_optimizer_state_dict` (after ``dcp.load`` into this run's template) into
    ``optimizer``: hyperparameters, and every cohort's state packed from the parameters' pieces.
    Raises ``ValueError`` naming the mismatch before the optimizer is changed. Collective where the
    parameters are DTensors. Under ``ZeroRedundancyOptimizer`` each rank loads the state of its own
    partition (the checkpoint may come from another number of ranks, or from FSDP or one process)."""
    outer, local = optimizer, _local(optimizer)
    names = _names(model, optimizer)
    saved_groups, saved_cohorts = state_dict.get("param_groups"), state_dict.get("cohorts")
    if not isinstance(saved_groups, list) or len(saved_groups) != len(optimizer.param_groups):
        got = len(saved_groups) if isinstance(saved_groups, list) else saved_groups
        raise ValueError(
            f"optimizer state dict has {got} param groups, this optimizer {len(optimizer.param_groups)}: "
            "build the optimizer over the same param groups as the saved one"
        )
    for gi, (saved, mine) in enumerate(zip(saved_groups, names, strict=True)):
        if list(saved["params"]) != mine:
            raise ValueError(f"optimizer state dict: param group {gi} holds {list(saved['params'])}, this one {mine}")
        theirs, ours = set(saved) - _NOT_HYPER, set(optimizer.param_groups[gi]) - _NOT_HYPER
        if theirs != ours:
            raise ValueError(
                f"optimizer state dict: param group {gi} holds the state of another optimizer: hyperparameters "
                f"{sorted(theirs)}, this optimizer's {sorted(ours)}"
            )
    local_names = _names(model, local)
    if saved_cohorts is None or local is not outer:
        # written or read under ZeRO: one cohort per param group (of this rank's partition), as the
        # first step builds when every parameter has a gradient
        saved_cohorts = [[listed] if listed else [] for listed in local_names]
    # the saved hyperparameters first (the cohorts' cores are built from them); put back on a refusal
    groups = [*outer.param_groups, *(local.param_groups if local is not outer else ())]
    before = [dict(group) for group in groups]
    for group, saved in zip(groups, [*saved_groups, *saved_groups], strict=False):
        group.update({k: v for k, v in saved.items() if k not in _HYPER_SKIP})
    try:
        local._cohorts = _build(local, local_names, state_dict, saved_cohorts)
    except BaseException:
        for group, old in zip(groups, before, strict=True):
            group.clear()
            group.update(old)
        raise


def _build(optimizer: Any, names: list, state_dict: dict, saved_cohorts: list) -> list:
    """The cohorts of ``saved_cohorts`` with their states packed from ``state_dict``'s pieces."""
    built = []
    for gi, group in enumerate(optimizer.param_groups):
        position = {fqn: i for i, fqn in enumerate(names[gi])}
        cohorts = []
        for listed in saved_cohorts[gi]:
            indices = tuple(position[fqn] for fqn in listed)
            cohort = optimizer._new_cohort(group, gi, indices, restoring=True)
            params = [group["params"][i] for i in indices]
            modes, owners = _modes(optimizer, group, params)
            values, wanted = {}, []
            for slot, j, like in _pieces(cohort.state):
                if j is None:
                    values[slot, None] = _shared(state_dict, [names[gi][i] for i in indices], slot, like)
                else:
                    wanted.append((j, slot, like))
            for j, slot, like in sorted(wanted, key=lambda t: (t[0], t[1])):  # as in get_…
                fqn, p = names[gi][indices[j]], params[j]
                entry = state_dict["state"].get(fqn, {})
                if slot not in entry:
                    raise ValueError(
                        f"optimizer state dict has no state {slot!r} for {fqn!r}: it was written by another "
                        "optimizer, or with other cohorts"
                    )
                values[slot, j] = _import(entry[slot], like, p, modes[j], owners.get(id(p)), f"{fqn}[{slot!r}]")
            cohort.state = state_from_pieces(cohort.state, values)  # the core packs the pieces back
            cohort.buffers = False  # leaves may share memory: capturable=True makes its buffers afresh
            cohort.key = optimizer._hyper_key(group)
            cohort.restored = True  # its weights are checked at the first eager step (Optimizer._check_restored)
            cohorts.append(cohort)
        built.append(cohorts)
    return built


def _shared(state_dict: dict, fqns: list, slot: str, like: torch.Tensor) -> torch.Tensor:
    """A state tensor of the whole cohort (a step counter), stored under each of its parameters."""
    found = [state_dict["state"].get(fqn, {}).get(slot) for fqn in fqns]
    if any(v is None for v in found):
        raise ValueError(f"optimizer state dict has no {slot!r} for {fqns}: it was written with other cohorts")
    first = found[0]
    if any(not torch.equal(v, first) for v in found[1:]):
        raise ValueError(
            f"optimizer state dict: {slot!r} differs between {fqns}, which this run steps together: it was written "
            "with other cohorts"
        )
    if first.shape != like.shape or first.dtype != like.dtype:
        raise ValueError(f"optimizer state dict: {slot!r} is {tuple(first.shape)} {first.dtype}, expected {like.dtype}")
    return first.to(like.device).clone()
