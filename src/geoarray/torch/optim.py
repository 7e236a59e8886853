"""Every geoarray.torch optimizer in one module, as ``torch.optim`` holds torch's.

The classes live where their kind is written: the one ``torch.optim.Optimizer`` subclass,
:class:`~geoarray.torch.Optimizer` (param groups, ``state_dict``, the step around the array-API core), and
:class:`~geoarray.torch.Recipe`, the data a named optimizer hands it, in :mod:`geoarray.torch.optimizer`; torch's
conventions (:class:`Adam`, :class:`AdamW`, :class:`SGD`, :class:`RMSprop`, :class:`Adagrad`, :class:`Adamax`,
:class:`NAdam`, :class:`RAdam`) in :mod:`geoarray.torch.torch_optimizers`; the
paper's methods and manifold Muon in :mod:`geoarray.torch.paper_optimizers`. This module only gathers them, so
that none of those imports another's importer (the base class no longer re-exports its subclasses).
"""

from __future__ import annotations

from .optimizer import Optimizer, Recipe
from .paper_optimizers import AdamWithDecay, BrantnerAdam, Gradient, ManifoldMuon, Momentum, Muon, PaperAdam
from .torch_optimizers import SGD, Adagrad, Adam, Adamax, AdamW, NAdam, RAdam, RMSprop

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
    "Momentum",
    "Muon",
    "NAdam",
    "Optimizer",
    "PaperAdam",
    "RAdam",
    "RMSprop",
    "Recipe",
]
