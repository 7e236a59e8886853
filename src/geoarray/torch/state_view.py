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
                          (:class:`~geoarray.torch.Momentum`), manifold Muon's buffer
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

import optree
import torch

from ..manifolds.horizontal import HorizontalElement
from ..optim.layout import AS_IS, STACKED
from ..optim.manifold_muon import ManifoldMuonState
from ..optim.muon import ScaleByMuonState
from ..optim.riemannian import RiemannianState
from ..optim.torch_rules import ScaleBySGDState, ScaleByTorchAdamState
from ..optim.transforms import ScaleByAdamState, ScaleByMomentumState

__all__ = ["StateView"]

# (state type, field, torch's name): per-group tuples found anywhere in a core's transform state
_FIELDS = (
    (ScaleByTorchAdamState, "exp_avg", "exp_avg"),
    (ScaleByTorchAdamState, "exp_avg_sq", "exp_avg_sq"),
    (ScaleByTorchAdamState, "max_exp_avg_sq", "max_exp_avg_sq"),
    (ScaleBySGDState, "momentum_buffer", "momentum_buffer"),
    (ScaleByMomentumState, "trace", "momentum_buffer"),
    (ScaleByAdamState, "mu", "mu"),
    (ScaleByAdamState, "nu", "nu"),
)


def _named_nodes(tree: Any) -> Iterator[Any]:
    """NamedTuple states inside a transform state (a chain's tuple, nested chains, wrappers)."""
    if isinstance(tree, tuple) and not isinstance(tree, HorizontalElement):
        if hasattr(tree, "_fields"):
            yield tree
        for child in tree:
            yield from _named_nodes(child)


def _piece(value: Any, group: Any, j: int, shapes: tuple) -> Any:
    """The part of a group's value (array or horizontal element) that belongs to leaf ``j``."""
    if group.packing == AS_IS:
        return value
    if group.packing == STACKED:
        k = group.indices.index(j)
        return optree.tree_map(lambda a: a[k], value)
    offset = 0
    for i in group.indices:
        size = 1
        for s in shapes[i]:
            size *= s
        if i == j:
            return value[offset : offset + size].reshape(shapes[j])
        offset += size
    raise KeyError(j)


def _layout(cohort: Any) -> Any:
    return cohort.state.layout  # the core keeps the layout of the tree in its state


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
        if not isinstance(cohort.state, (RiemannianState, ManifoldMuonState)):
            return {}  # another core's state (geoarray.optim.partition): not mapped
        layout = _layout(cohort)
        g = next(k for k, group in enumerate(layout.groups) if j in group.indices)
        group, state = layout.groups[g], cohort.state
        out: dict = {}
        if isinstance(state, RiemannianState):
            out["step"] = state.step
            for node in _named_nodes(state.inner):
                for cls, field, name in _FIELDS:
                    if isinstance(node, cls):
                        value = getattr(node, field)
                        if isinstance(value, tuple) and len(value) == len(layout.groups):
                            out[name] = _piece(value[g], group, j, layout.shapes)
        elif isinstance(state, ManifoldMuonState):
            out["step"] = state.step

            if group.manifold.is_vector_space:
                euclid = [k for k, grp in enumerate(layout.groups) if grp.manifold.is_vector_space]
                muon = [n for n in _named_nodes(state.muon) if isinstance(n, ScaleByMuonState)]
                if muon:
                    out["momentum_buffer"] = _piece(muon[0].mu[euclid.index(g)], group, j, layout.shapes)
            else:
                out["momentum_buffer"] = _piece(state.buffers[g], group, j, layout.shapes)
        return out

    def __contains__(self, p: object) -> bool:
        return id(p) in self._where()

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter([p for p, _, _ in self._where().values()])

    def __len__(self) -> int:
        return len(self._where())

    def __repr__(self) -> str:
        return f"StateView({len(self)} parameters with state; torch's names, read-only)"
