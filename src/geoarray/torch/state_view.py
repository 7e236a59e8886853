"""``opt.state[p]``: each parameter's optimizer state under torch's names, as views into the grouped state.

geoarray's optimizers keep one state per *cohort* of parameters (same-shaped manifold weights
stacked, Euclidean tensors raveled into one vector: the batched updates of Algorithm 1), so
``torch.optim.Optimizer.state`` — a dict per parameter — is not where the state lives. This mapping
gives, for each parameter with a state, a new dict of views into that grouped state:

========================  ======================================================================
``step``                  steps taken (an integer 0-d tensor; torch's is a float tensor)
``exp_avg``               Adam's first moment mₜ (:class:`~geoarray.torch.Adam`/``AdamW``, torch's meaning)
``exp_avg_sq``            Adam's second moment vₜ
``max_exp_avg_sq``        max of vₜ (``amsgrad=True``)
``momentum_buffer``       SGD's buffer (:class:`~geoarray.torch.SGD`), the momentum cache of eq. 8
                          (:class:`~geoarray.torch.Momentum`), manifold Muon's buffer, RMSprop's
                          (``momentum`` > 0)
``square_avg``            RMSprop's running mean of g ⊙ g (:class:`~geoarray.torch.RMSprop`)
``grad_avg``              RMSprop's running mean of g (``centered=True``)
``sum``                   Adagrad's accumulated g ⊙ g (:class:`~geoarray.torch.Adagrad`)
``exp_inf``               Adamax's exponentially weighted infinity norm (:class:`~geoarray.torch.Adamax`);
                          its ``exp_avg`` as Adam's, as are NAdam's and RAdam's moments
``mu``, ``nu``            :class:`~geoarray.torch.PaperAdam`'s bias-corrected moments B₁ = m̂ₜ, B₂ = v̂ₜ
                          (eq. 5 of Brantner's paper: the paper's cache, not torch's exp_avg)
========================  ======================================================================

For a plain tensor the values have the parameter's shape. For a
:class:`~geoarray.torch.ManifoldParameter` the moments live in g^hor, the coordinates the optimizer
keeps (Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*, Algorithm 1):
a horizontal element, a NamedTuple of tensors (``A``: n×n skew, ``B``: (N−n)×n for Stiefel), not a
tensor shaped like the weight. Manifold Muon's buffer is in ambient coordinates (the weight's shape).

Cores other than the Riemannian wrapper and manifold Muon (``geoarray.optim.partition`` given to
:class:`geoarray.torch.Optimizer`) are not mapped: their parameters read ``{}``.

**Read-only**: the dicts are rebuilt at every access and assigning to them changes nothing; the
tensors are views of the optimizer's state as it is at the access (a step computes new state arrays:
read ``opt.state[p]`` again after it), so do not modify them in place. Checkpoints go through
``state_dict()`` (whose ``"state"`` entry stays empty: the grouped state is saved under
``"geoarray"``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..optim.layout import leaf_state

__all__ = ["StateView"]


class StateView(Mapping):
    """``opt.state`` of a :class:`geoarray.torch.Optimizer` (module docstring). Like torch's
    defaultdict, a parameter without a state (not stepped yet, or not of this optimizer) reads ``{}``."""

    def __init__(self, optimizer: Any):
        self._optimizer = weakref.ref(optimizer)

    def _where(self) -> dict[int, tuple]:
        opt = self._optimizer()
        if opt is None:
            raise RuntimeError("the optimizer of this state view was deleted")
        out = {}
        for gi, cohorts in enumerate(opt._cohorts):
            params = opt.param_groups[gi]["params"]
            for cohort in cohorts:
                for j, i in enumerate(cohort.indices):
                    out[id(params[i])] = (params[i], cohort, j)
        return out

    def __getitem__(self, p: Any) -> dict:
        found = self._where().get(id(p))
        if found is None:
            return {}
        _, cohort, j = found
        # the core cuts this leaf's piece of its grouped state (geoarray.optim.layout.leaf_state); another
        # core's state (geoarray.optim.partition) declares no per-group fields and reads {}
        return leaf_state(cohort.state, j)

    def __contains__(self, p: object) -> bool:
        return id(p) in self._where()

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter([p for p, _, _ in self._where().values()])

    def __len__(self) -> int:
        return len(self._where())

    def __repr__(self) -> str:
        return f"StateView({len(self)} parameters with state; torch's names, read-only)"
