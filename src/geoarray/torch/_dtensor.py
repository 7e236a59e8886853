"""DTensor parameters (torch FSDP2's ``fully_shard``, tensor parallelism) in geoarray.torch's optimizers.

FSDP2 replaces every parameter by an ``nn.Parameter`` holding a DTensor sharded along dim 0
(``Shard(0)``): each rank holds rows ``r·⌈D/W⌉ … (r+1)·⌈D/W⌉`` of the parameter's first dimension.
A manifold update is a function of whole points of the manifold (the Stiefel retraction needs the
whole N×n frame: its Householder section and the n×n and 2n×2n blocks of eq. 21 of Brantner,
*Generalizing Adam to Manifolds for Efficiently Training Transformers*), so what a rank may do with
its shard depends on *where* the cut is:

* **the cut is between points** — a stack of frames ``(B, N, n)`` (the vision transformer's 336
  attention projections as one parameter, a GPT's per-head projections) sharded along ``B``: each
  local frame is a whole frame, and the batched update of Algorithm 1 treats the frames of a stack
  independently, so each rank steps its own frames with its own state — **no communication** (but a
  4-byte flag: below), and each rank holds the optimizer state of its frames only (``"local"``). The same holds for
  Euclidean tensors under element-wise updates (Adam, SGD, …: any cut), and for Euclidean matrices
  under Muon when the cut is in a leading batch dimension.
* **the cut is inside a point** — a single tall ``N×n`` weight sharded by rows, a Euclidean matrix
  under Muon (Newton–Schulz couples every entry): the matrix has an *owner* rank (the least loaded,
  by elements, in the order of the param groups: fixed for the optimizer's life), which gathers the
  weight and its gradient (``dist.gather`` of the row shards), takes the step on the whole matrix with
  the state of the whole matrix, and scatters the new rows back (``dist.scatter``) — as the
  distributed Muon implementations spread their matrices over ranks. The other ranks step an empty
  batch in its place and hold no state for it (``"owner"``). Per step, the owner receives
  2·(W−1)/W of the matrix and each other rank 1/W of it. (A tall-skinny QR over the row shards,
  with all-reduces of the n×n pieces, would spread the work of one matrix too; not implemented.)
  On a 2-D mesh of HSDP (``(Replicate(), Shard(0))``) the same happens within each replica group
  (each group's owner steps the matrix, as each replica steps its copy). A cut in another dimension,
  or cuts along two mesh dimensions, are gathered on every rank instead (``"all"``:
  ``DTensor.full_tensor``, a replicated step and state).
* **optimizers whose update is not known to separate** (a :class:`geoarray.torch.Optimizer` around
  a core of your own, which may clip by a global norm; ``section="random"``, whose draws depend on
  the shape of the batch) get every sharded parameter gathered on every rank (``"all"``): exact, the
  state not sharded.

A non-finite gradient skips the step (``on_nonfinite="skip"``); where ranks step different parts,
they agree on it: one all-reduce of a 4-byte flag per cohort and step, without a host read — on the
gradients before the step where host reads are allowed, and on the step's outcome after it where
they are not (:func:`geoarray.set_host_reads`: the core then also skips a step whose new points are
not finite, beyond the retraction's fixed doubling budget, which each rank sees for its own points
only; :meth:`Views.agree`).

``fully_shard`` below is torch's with the manifolds kept: FSDP2 builds new ``nn.Parameter`` objects,
dropping the :class:`~geoarray.torch.ManifoldParameter` class and its ``manifold``, which it puts
back on the sharded parameters (a parameter without it would take Euclidean steps off the manifold),
also after ``module.to_empty(device=...)`` (FSDP2's initialisation on the meta device), which
registers new parameter objects.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

from ._rank_agreement import agree_on_step
from .parameter import ManifoldParameter, manifold_of

__all__ = ["Views", "fully_shard", "views"]

# update rules that treat every entry (Euclidean) and every frame of a stack (manifold) separately;
# names of geoarray.torch's classes, so that this module needs no import of them
_ELEMENTWISE = frozenset({"Adam", "AdamW", "SGD", "PaperAdam", "BrantnerAdam", "Momentum", "Gradient", "AdamWithDecay"})
_MATRIXWISE = frozenset({"ManifoldMuon", "Muon"})  # Euclidean matrices whole (Newton–Schulz), frames separately


def fully_shard(module: Any, **kwargs: Any) -> Any:
    """``torch.distributed.fsdp.fully_shard(module, **kwargs)`` keeping the manifolds of the
    :class:`~geoarray.torch.ManifoldParameter` s it shards (module docstring), with non-contiguous
    parameters (QR's column-major frames), which FSDP2 refuses, made contiguous first. Call it wherever
    you would call torch's (per block, then on the root); ``module`` may be a list of modules, as there."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    modules = list(module) if isinstance(module, (list, tuple)) else [module]
    for m in modules:
        for p in m.parameters():
            if not p.is_contiguous():  # FSDP2 shards contiguous parameters only; QR gives column-major frames
                p.data = p.data.contiguous()
    found = [
        (owner, name, p.manifold)
        for m in modules
        for owner in m.modules()
        for name, p in owner._parameters.items()
        if isinstance(p, ManifoldParameter) and manifold_of(p) is not None
    ]
    out = torch_fully_shard(module, **kwargs)
    _attach(found)
    for m in modules:
        # module.to_empty() / .to() after sharding (FSDP2's meta-device initialisation) registers new
        # parameter objects: give them the manifolds again
        _reattach_after_apply(m, found)
    return out


def _attach(found: list) -> None:
    for owner, name, manifold in found:
        p = owner._parameters.get(name)
        if p is not None and getattr(p, "manifold", None) is None:
            p.manifold = manifold


def _reattach_after_apply(module: Any, found: list) -> None:
    original = module._apply  # FSDP2's: reshards, converts, re-pads the shards

    def _apply(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        _attach(found)
        return out

    object.__setattr__(module, "_apply", _apply)


def _dtensor_type() -> Any:
    # no DTensor exists before torch.distributed.tensor is imported: nothing to import on the plain path
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def _mode(p: Any, optimizer: Any, group: dict) -> str:
    """How this rank steps ``p`` (a DTensor): ``"local"`` (its shard), ``"owner"`` (gathered to one
    rank, stepped there, scattered back) or ``"all"`` (gathered on every rank) — module docstring."""
    from torch.distributed.tensor import Replicate, Shard

    name = type(optimizer).__name__
    if name not in _ELEMENTWISE | _MATRIXWISE or group.get("section") == "random":
        # not known to treat parameters independently (a global-norm clip couples them): every rank
        # steps the whole tree
        return "local" if all(isinstance(pl, Replicate) for pl in p.placements) else "all"
    m = manifold_of(p)
    if m is not None:
        point_ndim = len(m.point_shape or ())
    else:
        point_ndim = 2 if name in _MATRIXWISE else 0
    cut_inside = False
    for pl in p.placements:
        if isinstance(pl, Replicate):
            continue
        if not isinstance(pl, Shard):  # Partial: the values are not there yet
            return "all"
        if pl.dim % p.ndim >= p.ndim - point_ndim:
            cut_inside = True
    if not cut_inside:
        return "local"
    if _shard_dim(p) is not None:
        return "owner"
    return "all"


def _shard_dim(p: Any) -> int | None:
    """The mesh dimension along which ``p`` is cut into row blocks, where that is its only cut (FSDP2's
    ``Shard(0)``; HSDP's ``(Replicate(), Shard(0))``: each replica group holds the whole in row blocks),
    else None. Owner-stepped parameters are gathered and scattered along it."""
    from torch.distributed.tensor import Replicate, Shard

    shards = [d for d, pl in enumerate(p.placements) if isinstance(pl, Shard)]
    if len(shards) != 1 or p.placements[shards[0]].dim % p.ndim != 0:
        return None
    if not all(isinstance(pl, Replicate) for d, pl in enumerate(p.placements) if d != shards[0]):
        return None
    return shards[0]


def _owners(optimizer: Any, group: dict, params: list, modes: list) -> dict:
    """Owner rank of each ``"owner"`` parameter: the least-loaded rank (by elements) in the order of
    the optimizer's param groups — the same on every rank, and fixed for the optimizer's life."""
    table = _OWNER_TABLES.get(optimizer)
    if table is None:
        table = _OWNER_TABLES[optimizer] = {}
    missing = [p for p, mode in zip(params, modes, strict=True) if mode == "owner" and id(p) not in table]
    if missing:
        table.clear()
        loads: dict = {}
        for g in optimizer.param_groups:
            for q in g["params"]:
                if _is_dtensor(q) and _mode(q, optimizer, g) == "owner":
                    world = q.device_mesh.size(_shard_dim(q))
                    load = loads.setdefault(world, [0] * world)
                    r = min(range(world), key=lambda i: (load[i], i))
                    load[r] += q.numel()
                    table[id(q)] = r
    return table


_OWNER_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _chunk_rows(d: int, world: int) -> int:
    return -(-d // world)  # torch.chunk's (and FSDP2's Shard(0)'s) rows per rank


def _gather_to(owner: int, local: torch.Tensor, p: Any) -> torch.Tensor:
    """The whole of ``p``'s dim-0-sharded tensor on rank ``owner`` of its mesh (``dist.gather`` of the
    padded shards); elsewhere an empty batch ``(0, *shape)`` for the core to step nothing."""
    import torch.distributed as dist

    d = _shard_dim(p)
    group = p.device_mesh.get_group(d)
    world, me = p.device_mesh.size(d), p.device_mesh.get_local_rank(d)
    rows = _chunk_rows(p.shape[0], world)
    padded = local.new_zeros((rows, *p.shape[1:]))
    padded[: local.shape[0]].copy_(local)
    chunks = [torch.empty_like(padded) for _ in range(world)] if me == owner else None
    dist.gather(padded, chunks, dst=dist.get_global_rank(group, owner), group=group)
    if me != owner:
        return local.new_empty((0, *p.shape))
    assert chunks is not None  # allocated on the owner
    return torch.cat(chunks)[: p.shape[0]]


def _scatter_from(owner: int, whole: torch.Tensor, p: Any) -> torch.Tensor:
    """This rank's rows of the whole tensor held by rank ``owner`` (``dist.scatter`` of padded chunks)."""
    return scatter_rows(owner, whole, tuple(p.shape), p, like=p.to_local())


def scatter_rows(owner: int, whole: torch.Tensor | None, shape: tuple, p: Any, like: torch.Tensor) -> torch.Tensor:
    """This rank's ``Shard(0)`` rows (torch.chunk's blocks) of a tensor of ``shape`` held whole by rank
    ``owner`` along ``p``'s cut mesh dimension (``dist.scatter`` of padded blocks); ``like`` gives the
    dtype and device."""
    import torch.distributed as dist

    d = _shard_dim(p)
    group = p.device_mesh.get_group(d)
    world, me = p.device_mesh.size(d), p.device_mesh.get_local_rank(d)
    rows = _chunk_rows(shape[0], world)
    out = like.new_empty((rows, *shape[1:]))
    chunks = None
    if me == owner:
        assert whole is not None, "the owner rank holds the whole tensor"
        padded = whole.new_zeros((rows * world, *shape[1:]))
        padded[: shape[0]].copy_(whole)
        chunks = list(padded.split(rows))
    dist.scatter(out, chunks, src=dist.get_global_rank(group, owner), group=group)
    return out[: max(0, min(rows, shape[0] - me * rows))]


class Views:
    """What the core steps for one cohort of DTensor parameters: ``leaves`` and ``grads`` (plain
    tensors: local shards, wholes, or empty batches where another rank owns the parameter), and
    :meth:`write` to put the new values back."""

    def __init__(self, params: list, modes: list, owners: dict, *, grads: bool, check_finite: bool = True):
        self.params, self.modes, self.owners = params, modes, owners
        self.leaves = [self._plain(p, mode, p.detach()) for p, mode in zip(params, modes, strict=True)]
        self.grads: list = []
        self._agree_after = False  # True: the ranks agree on taking the step after it (agree())
        if grads:
            self.grads = [self._plain(p, mode, p.grad) for p, mode in zip(params, modes, strict=True)]
            if check_finite and any(mode in ("local", "owner") for mode in modes):
                from .._backend import host_reads_allowed

                if host_reads_allowed(self.grads[0]):
                    self._agree_on_finiteness()
                else:
                    self._agree_after = True

    def _plain(self, p: Any, mode: str, t: Any) -> torch.Tensor:
        if mode == "plain":
            return t
        if mode == "all":
            return t.full_tensor()
        if t.placements != p.placements:  # a gradient's shards must be those of the parameter
            t = t.redistribute(p.device_mesh, p.placements)
        if mode == "local":
            return t.to_local()
        return _gather_to(self.owners[id(p)], t.to_local(), p)

    def _agree_on_finiteness(self) -> None:
        """Make a non-finite gradient on one rank non-finite on all: the core skips (or refuses) a step
        with a non-finite gradient, and a rank that skipped while the others stepped would leave the
        ranks' parts of the model at different steps. One all-reduce (MIN) of a flag over the mesh, no
        host read; a rank whose own gradients are finite adds NaN to its first one when another's are
        not. Gradients gathered on every rank are the same everywhere: so is their finiteness."""
        import torch.distributed as dist

        own = [k for k, mode in enumerate(self.modes) if mode in ("local", "owner")]
        if not own:
            return
        flags = torch.stack([torch.isfinite(self.grads[k]).all() for k in own])
        flag = flags.all().to(torch.int32)
        mesh = self.params[own[0]].device_mesh
        for d in range(mesh.ndim):
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=mesh.get_group(d))
        k = next((k for k in own if self.grads[k].numel()), own[0])
        g = self.grads[k]
        self.grads[k] = g + torch.where(flag.bool(), 0.0, float("nan")).to(g.dtype)

    def agree(self, old_state: Any, new: list, new_state: Any) -> tuple[list, Any]:
        """Without host reads (:func:`geoarray.set_host_reads`), the core also skips a step whose new
        points are not finite — one beyond the retraction's fixed doubling budget — and decides that
        from this rank's points only: a rank that skipped while the others stepped would leave its
        parts of the model, and its step counter, behind. So the ranks agree after the step, not on
        the gradients before it: one all-reduce (MIN) of "this rank took its step" (its ``skipped``
        count did not grow: a non-finite gradient or new point), and where any rank did not, every
        rank keeps its old values and state and counts the step skipped — selected on the device, no
        host read. Returns the values and state to keep."""
        if not self._agree_after:
            return new, new_state
        own = next(k for k, mode in enumerate(self.modes) if mode in ("local", "owner"))
        mesh = self.params[own].device_mesh
        groups = [mesh.get_group(d) for d in range(mesh.ndim)]
        (kept,) = agree_on_step([(self.leaves, new, old_state, new_state)], new_state.skipped.device, groups)
        return kept

    def write(self, new: list) -> None:
        targets, values = [], []
        for p, mode, v in zip(self.params, self.modes, new, strict=True):
            if mode == "all":  # every rank computed the same whole matrix: its own shard is a local slice
                from torch.distributed.tensor import DTensor, Replicate

                full = DTensor.from_local(v, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
                v = full.redistribute(p.device_mesh, p.placements).to_local()
            elif mode == "owner":
                v = _scatter_from(self.owners[id(p)], v, p)
            targets.append(p if mode == "plain" else p.to_local())
            values.append(v)
        torch._foreach_copy_(targets, values)


def _is_dtensor(t: Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def views(optimizer: Any, group: dict, params: list, *, grads: bool = True) -> Views | None:
    """The :class:`Views` of ``params`` (one cohort), or None when none of them is a DTensor."""
    cls = _dtensor_type()
    if cls is None or not any(isinstance(p, cls) for p in params):
        return None
    modes = [_mode(p, optimizer, group) if isinstance(p, cls) else "plain" for p in params]
    owners = _owners(optimizer, group, params, modes) if "owner" in modes else {}
    return Views(params, modes, owners, grads=grads, check_finite=group.get("on_nonfinite") != "ignore")
