"""Optimizers over parameter trees: Algorithm 1 of the paper with caches in g^hor.

    opt = geoarray.optim.Adam(lr=1e-3, beta1=0.9, beta2=0.99, delta=3e-7)
    state = opt.init(params, manifolds)          # manifolds: same tree, a Manifold or None per leaf
    params, state = opt.update(params, grads, state)

``Gradient``, ``Momentum``, ``Adam``, ``AdamWithDecay`` and ``BFGS`` share the driver in
:mod:`geoarray.optim.optimizer`; learning-rate schedules are in :mod:`geoarray.optim.schedules`;
``save_state``/``load_state`` checkpoint a state bit-exactly.
"""

from . import schedules
from .methods import BFGS, Adam, AdamWithDecay, Gradient, Momentum
from .optimizer import Optimizer
from .state import OptState, load_state, save_state

__all__ = [
    "BFGS",
    "Adam",
    "AdamWithDecay",
    "Gradient",
    "Momentum",
    "OptState",
    "Optimizer",
    "load_state",
    "save_state",
    "schedules",
]
