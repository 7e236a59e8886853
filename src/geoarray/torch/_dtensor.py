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
  independently, so each rank steps its own frames with its own state — **no communication**, and
  each rank holds the optimizer state of its frames only (``"local"``). The same holds for
  Euclidean tensors under element-wise updates (Adam, SGD, …: any cut), and for Euclidean matrices
  under Muon when the cut is in a leading batch dimension.
* **the cut is inside a point** — a single tall ``N×n`` weight sharded by rows, a Euclidean matrix
  under Muon (Newton–Schulz couples every entry): the rank gathers the whole matrix and its
  gradient (an all-gather of parameter and gradient, ``DTensor.full_tensor``), takes the step on
  the whole matrix with a state of the whole matrix, and keeps its own rows (``"full"``). Every rank
  computes the same update from the same inputs, so the ranks agree bit for bit without a second
  collective. Cost per step: 2·(W−1)/W of the matrix received per rank; the state of that matrix is
  replicated. (The alternative, a tall-skinny QR over the row shards with all-reduces of the n×n
  pieces, would keep the state sharded; it is not implemented.)
* **optimizers whose update is not known to separate** (a :class:`geoarray.torch.Optimizer` around
  a core of your own, which may clip by a global norm; ``section="random"``, whose draws depend on
  the shape of the batch) get every DTensor parameter gathered (``"full"``): exact, not sharded.

``fully_shard`` below is torch's with the manifolds kept: FSDP2 builds new ``nn.Parameter`` objects,
dropping the :class:`~geoarray.torch.ManifoldParameter` class and its ``manifold``, which it puts
back on the sharded parameters (a parameter without it would take Euclidean steps off the manifold),
also after ``module.to_empty(device=...)`` (FSDP2's initialisation on the meta device), which
registers new parameter objects.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from .parameter import ManifoldParameter, manifold_of

__all__ = ["Views", "fully_shard", "views"]

# update rules that treat every entry (Euclidean) and every frame of a stack (manifold) separately;
# names of geoarray.torch's classes, so that this module needs no import of them
_ELEMENTWISE = frozenset({"Adam", "AdamW", "SGD", "PaperAdam", "BrantnerAdam", "Momentum", "Gradient", "AdamWithDecay"})
_MATRIXWISE = frozenset({"ManifoldMuon", "Muon"})  # Euclidean matrices whole (Newton–Schulz), frames separately


def fully_shard(module: Any, **kwargs: Any) -> Any:
    """``torch.distributed.fsdp.fully_shard(module, **kwargs)`` keeping the manifolds of the
    :class:`~geoarray.torch.ManifoldParameter` s it shards (module docstring). Call it wherever you
    would call torch's (per block, then on the root); ``module`` may be a list of modules, as there."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    modules = list(module) if isinstance(module, (list, tuple)) else [module]
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


def _whole(p: Any, optimizer: Any, group: dict) -> bool:
    """True when ``p`` (a DTensor) must be gathered to be stepped exactly (module docstring)."""
    from torch.distributed.tensor import Replicate, Shard

    name = type(optimizer).__name__
    if name not in _ELEMENTWISE | _MATRIXWISE or group.get("section") == "random":
        return any(not isinstance(pl, Replicate) for pl in p.placements)
    m = manifold_of(p)
    if m is not None:
        point_ndim = len(m.point_shape or ())
    else:
        point_ndim = 2 if name in _MATRIXWISE else 0
    for pl in p.placements:
        if isinstance(pl, Replicate):
            continue
        if not isinstance(pl, Shard):  # Partial: the values are not there yet
            return True
        if pl.dim % p.ndim >= p.ndim - point_ndim:
            return True
    return False


class Views:
    """What the core steps for one cohort of DTensor parameters: ``leaves`` and ``grads`` (local
    shards or gathered wholes, plain tensors), and :meth:`write` to put the new values back."""

    def __init__(self, params: list, whole: list[bool], *, grads: bool, check_finite: bool = True):
        self.params, self.whole = params, whole
        self.leaves = [_plain(p, w) for p, w in zip(params, whole, strict=True)]
        self.grads = None
        if grads:
            self.grads = [_grad(p, w) for p, w in zip(params, whole, strict=True)]
            if check_finite:
                self._agree_on_finiteness()

    def _agree_on_finiteness(self) -> None:
        """Make a non-finite gradient on one rank non-finite on all: the core skips (or refuses) a step
        with a non-finite gradient, and a rank that skipped while the others stepped would leave a
        gathered weight with old and new rows mixed. One all-reduce (MIN) of a flag over the mesh, no
        host read; a rank whose own shards are finite adds NaN to its first gradient when another's
        are not."""
        import torch.distributed as dist

        local = [k for k, (p, w) in enumerate(zip(self.params, self.whole, strict=True)) if _is_dtensor(p) and not w]
        if not local:
            return  # gathered gradients are the same on every rank: so is their finiteness
        flags = torch.stack([torch.isfinite(self.grads[k]).all() for k in local])
        flag = flags.all().to(torch.int32)
        mesh = self.params[local[0]].device_mesh
        for d in range(mesh.ndim):
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=mesh.get_group(d))
        k = local[0]
        g = self.grads[k]
        self.grads[k] = g + torch.where(flag.bool(), 0.0, float("nan")).to(g.dtype)

    def write(self, new: list) -> None:
        targets, values = [], []
        for p, w, v in zip(self.params, self.whole, new, strict=True):
            if not _is_dtensor(p):
                targets.append(p)
                values.append(v)
                continue
            if w:  # every rank computed the same whole matrix: its own shard is a local slice
                from torch.distributed.tensor import DTensor, Replicate

                full = DTensor.from_local(v, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
                v = full.redistribute(p.device_mesh, p.placements).to_local()
            targets.append(p.to_local())
            values.append(v)
        torch._foreach_copy_(targets, values)


def _is_dtensor(t: Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def _plain(p: Any, whole: bool) -> torch.Tensor:
    if not _is_dtensor(p):
        return p.detach()
    return p.detach().full_tensor() if whole else p.detach().to_local()


def _grad(p: Any, whole: bool) -> torch.Tensor:
    g = p.grad
    if not _is_dtensor(p):
        return g
    if whole:
        return g.full_tensor()
    if g.placements != p.placements:  # the shards must be those of the parameter
        g = g.redistribute(p.device_mesh, p.placements)
    return g.to_local()


def views(optimizer: Any, group: dict, params: list, *, grads: bool = True) -> Views | None:
    """The :class:`Views` of ``params`` (one cohort), or None when none of them is a DTensor."""
    cls = _dtensor_type()
    if cls is None or not any(isinstance(p, cls) for p in params):
        return None
    whole = [isinstance(p, cls) and _whole(p, optimizer, group) for p in params]
    return Views(params, whole, grads=grads, check_finite=group.get("on_nonfinite") != "ignore")
