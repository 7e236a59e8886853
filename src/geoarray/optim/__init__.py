"""Optimizers over parameter trees: Algorithm 1 of Brantner's paper as a wrapper around transforms.

In use::

    opt = geoarray.optim.Adam(lr=1e-3, beta1=0.9, beta2=0.99, delta=3e-7)
    state = opt.init(params, manifolds)          # manifolds: same tree, a Manifold or None per leaf
    params, state = opt.update(params, grads, state)

Underneath, the cache logic is a chain of vector-space transforms (:mod:`geoarray.optim.transforms`:
``scale_by_adam``, ``scale_by_momentum``, ``scale_by_learning_rate``, ``add_decayed_weights``,
``clip_by_global_norm``, ``chain``), and :func:`riemannian` performs Algorithm 1 around them
(rgrad → lift to g^hor → transform → retraction)::

    opt = geoarray.optim.riemannian(chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(1e-3)))

``Gradient``, ``Momentum``, ``Adam``, ``AdamWithDecay`` and ``BFGS`` are such chains; learning-rate
schedules are in :mod:`geoarray.optim.schedules`; ``save_state``/``load_state`` checkpoint a state
bit-exactly.
"""

from . import layout, muon, schedules, torch_rules, transforms
from .inject import InjectedOptimizer, InjectHyperparamsState, inject_hyperparams
from .manifold_muon import ManifoldMuon, ManifoldMuonState, Muon
from .methods import BFGS, Adam, AdamWithDecay, Gradient, Momentum
from .partition import PartitionedOptimizer, PartitionState, partition
from .riemannian import NonFiniteGradientWarning, RiemannianOptimizer, RiemannianState, riemannian
from .state import STATE_TYPES, load_state, save_state
from .transforms import (
    GradientTransformation,
    add_decayed_weights,
    chain,
    clip_by_global_norm,
    global_norm,
    scale_by_adam,
    scale_by_bfgs,
    scale_by_learning_rate,
    scale_by_momentum,
)

#: the optimizer classes of this package: ``init(params, manifolds)`` / ``update(params, grads, state,
#: check=True)``, configuration only (the state carries the layout of the tree)
OPTIMIZER_TYPES = (RiemannianOptimizer, ManifoldMuon, PartitionedOptimizer)

__all__ = [
    "BFGS",
    "OPTIMIZER_TYPES",
    "STATE_TYPES",
    "Adam",
    "AdamWithDecay",
    "Gradient",
    "GradientTransformation",
    "InjectHyperparamsState",
    "InjectedOptimizer",
    "ManifoldMuon",
    "ManifoldMuonState",
    "Momentum",
    "Muon",
    "NonFiniteGradientWarning",
    "PartitionState",
    "PartitionedOptimizer",
    "RiemannianOptimizer",
    "RiemannianState",
    "add_decayed_weights",
    "chain",
    "clip_by_global_norm",
    "global_norm",
    "inject_hyperparams",
    "layout",
    "load_state",
    "muon",
    "partition",
    "riemannian",
    "save_state",
    "scale_by_adam",
    "scale_by_bfgs",
    "scale_by_learning_rate",
    "scale_by_momentum",
    "schedules",
    "torch_rules",
    "transforms",
]
