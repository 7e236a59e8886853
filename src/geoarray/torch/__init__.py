"""PyTorch embedding of geoarray: ``ManifoldParameter``, ``torch.optim`` optimizers, ``nn.Module`` layers.

In use (``x`` a tensor of shape ``(..., 10)``)::

    import geoarray, geoarray.torch as gt
    layer = gt.nn.StiefelLayer(10, 3)                       # layer.params.Y is a ManifoldParameter on Stiefel(10, 3)
    opt = gt.Adam(layer.parameters(), lr=1e-2)              # a torch.optim.Optimizer
    loss = layer(x).square().sum(); loss.backward(); opt.step(); opt.zero_grad()

* :class:`ManifoldParameter` (:mod:`.parameter`): an ``nn.Parameter`` carrying its manifold; weights
  off the manifold are mapped to the nearest point (polar factor) unless ``project=False``;
  ``p.proj_()`` and :func:`project_` project in place.
* :func:`orthogonal_` (:mod:`.constraints`): constrain an existing module's weight to orthonormal
  columns (tall/square) or rows (wide), like ``geotorch.orthogonal``; :mod:`.init`: geotorch's
  initialisers ``torus_init_``, ``uniform_init_`` (Haar), and ``eye_init_``.
* Other optimizers: any ``torch.optim`` optimizer that is not geoarray's warns at its first step on
  ManifoldParameters (its Euclidean steps leave the manifold); :func:`project_after` makes it project
  onto the manifolds after each step (a projected, not Riemannian, method). ``load_state_dict(...,
  assign=True)`` and ``module.weight = nn.Parameter(W)`` keep the manifold (projected); torch's own
  ``fully_shard`` is refused at the first step, naming :func:`fully_shard` (:mod:`._foreign`).
* :class:`Adam`, :class:`AdamW`, :class:`SGD`, :class:`RMSprop`, :class:`Adagrad`, :class:`Adamax`,
  :class:`NAdam`, :class:`RAdam` (:mod:`.torch_optimizers`): ``torch.optim``'s signatures, defaults and
  formulas — equal to ``torch.optim`` on plain tensors, the same formulas in g^hor on
  ManifoldParameters. :class:`PaperAdam` is the paper's variant (δ inside the root, β = (0.9, 0.99);
  it was ``Adam`` before). :class:`Optimizer`, :class:`Momentum`, :class:`Gradient`,
  :class:`AdamWithDecay`, :class:`ManifoldMuon`, :class:`Muon` (:mod:`.optimizer`, :mod:`.paper_optimizers`; all
  gathered in :mod:`.optim`): ``torch.optim.Optimizer``
  subclasses running geoarray's array-API optimizer core (Algorithm 1 of Brantner, *Generalizing Adam to
  Manifolds for Efficiently Training Transformers*). Every one works with every
  ``torch.optim.lr_scheduler`` (every param group carries ``lr``).
* :mod:`.nn`: ``nn.Module`` wrappers of every :mod:`geoarray.nn` layer and a generic :class:`nn.Module`
  for any layer-contract object (models included); analytic pullbacks as an option.
* :func:`skip_guards_on_library_globals` (:mod:`.guards`): a ``guard_filter_fn`` for ``torch.compile``
  that drops the guards on geoarray's and its libraries' fixed module globals, most of a compiled
  step's guards, and keeps those on the arguments and your own globals
  (``torch.compile(opt.update, fullgraph=True, options={"guard_filter_fn": gt.skip_guards_on_library_globals})``).

Distributed training
--------------------
**DistributedDataParallel works and is tested** (2 CPU processes, gloo): DDP averages the gradients
across ranks before ``step``, and the update is a deterministic function of parameters, gradients
and state, so every rank computes the same new weights — bit-identical on identical hardware and
libraries — and they equal a single-process run on the concatenated batch to rounding (1e-12 in
float64). This needs a deterministic section strategy: the default Householder section (and
``"rotated"``, ``"transported"``) is a function of the weights alone; ``section="random"`` draws
from ``seed``, step and group, so give every rank the same ``seed`` (the default 0 is).

**Optimizer-state sharding (ZeRO-1) works and is tested** for every optimizer here:
``torch.distributed.optim.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=geoarray.torch.Adam,
lr=...)`` under DDP gives each rank whole parameters and their state, and broadcasts the updated
weights (2 gloo processes: ranks bit-identical, equal to one process to 1e-12; tests/test_torch_zero.py).
Each rank's optimizer decides a skip (a non-finite gradient) over its own partition; pass
``skip_together=True`` (ZeRO hands it to each rank's optimizer) and the ranks skip together, as one
process does (one 4-byte all-reduce per step; :class:`Optimizer`).

**FSDP2 works and is tested** (``tests/test_torch_fsdp.py``, 2 gloo processes): shard with
:func:`fully_shard` (torch's ``fully_shard``, keeping each ManifoldParameter's manifold, which torch's
drops). A stack of frames sharded along its batch axis is stepped frame by frame on the rank that holds
it, with its state there and no communication; a weight cut inside a matrix (a tall Stiefel weight by
rows; a Euclidean matrix under Muon) is gathered to an owner rank, stepped whole there with its state,
and scattered back; under a core of your own everything is gathered on every rank (:mod:`._dtensor`).
Equal to one process to 1e-12 in float64; HSDP's 2-D meshes (replicas × shards) too, the owner of a
cut matrix then chosen within each replica group (``tests/test_torch_hsdp.py``, 4 processes). Without
host reads (:func:`geoarray.set_host_reads`) the ranks agree after the step whether it was taken (one
4-byte all-reduce), so a step that one rank must skip is skipped on all. A sharded ``state_dict`` holds
this rank's state and resumes on the same world size; :mod:`.checkpoint`'s
``get_optimizer_state_dict``/``set_optimizer_state_dict`` with ``torch.distributed.checkpoint`` resume
on another number of ranks, or in one process (1 ↔ 2 ↔ 4 ranks tested, FSDP2 and ZeRO-1). Tensor
parallelism with other placements goes the same way (cuts between points local,
cuts inside gathered) but is untested.
"""

from __future__ import annotations

try:
    import torch as _torch
except ModuleNotFoundError as exc:
    if exc.name != "torch":  # a broken install (a dependency of torch missing) says so itself
        raise
    from .._install import install_hint

    # a ModuleNotFoundError naming torch, as the one replaced: code that tells a missing dependency from a
    # bug by the exception's name (docs/_ext/public_api.py) keeps working
    raise ModuleNotFoundError(f"geoarray.torch needs PyTorch: {install_hint('torch')}", name="torch") from None

from .. import _backend
from . import _foreign, adapters, checkpoint, guards, init, nn
from ._dtensor import fully_shard
from ._foreign import project_after
from .constraints import orthogonal_
from .guards import skip_guards_on_library_globals
from .optim import (
    SGD,
    Adagrad,
    Adam,
    Adamax,
    AdamW,
    AdamWithDecay,
    BrantnerAdam,
    Gradient,
    ManifoldMuon,
    Momentum,
    Muon,
    NAdam,
    Optimizer,
    PaperAdam,
    RAdam,
    Recipe,
    RMSprop,
)
from .parameter import ManifoldParameter, manifold_of, nearest_point, project_

_backend.as_namespace(_torch)  # registers torch.Tensor's namespace: a first call inside torch.compile finds it
# torch's global hooks: foreign optimizers warn, replaced ManifoldParameters keep their manifold
_foreign.install(Optimizer)
# the optimizer states' static layout nodes, registered with torch.utils._pytree now rather than at the first
# step: that would grow the registry, whose size dynamo guards, and recompile a model compiled before it
_backend.ensure_static_nodes()

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "AdamWithDecay",
    "Adamax",
    "BrantnerAdam",
    "Gradient",
    "ManifoldMuon",
    "ManifoldParameter",
    "Momentum",
    "Muon",
    "NAdam",
    "Optimizer",
    "PaperAdam",
    "RAdam",
    "RMSprop",
    "Recipe",
    "adapters",
    "checkpoint",
    "fully_shard",
    "guards",
    "init",
    "manifold_of",
    "nearest_point",
    "nn",
    "orthogonal_",
    "project_",
    "project_after",
    "skip_guards_on_library_globals",
]
