"""Different optimizers for different parameters (optax's ``multi_transform`` idea).

    opt = geoarray.optim.partition({"muon": ManifoldMuon(lr=5e-3), "adam": Adam(lr=1e-3)}, labels)
    state = opt.init(params, manifolds)            # labels: a tree like params holding the keys
    params, state = opt.update(params, grads, state)

Each member optimizer sees the leaves labelled with its key, as a dict from the leaf's path in
``params`` (e.g. ``"['blocks'][0]['W_q']"``) to the leaf, so its error messages name the user's
parameters. The state is a NamedTuple holding a dict of the members' states: an ordinary pytree.
Members keep their own step counts, non-finite policies and checkpoints of their states.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import optree

from ..manifolds.base import Manifold

__all__ = ["PartitionState", "PartitionedOptimizer", "partition"]


class PartitionState(NamedTuple):
    states: dict  # key → the member optimizer's state


def _is_manifold_leaf(x: Any) -> bool:
    return x is None or isinstance(x, Manifold)


def _path(path: tuple) -> str:
    return "".join(f"[{p!r}]" for p in path)


class PartitionedOptimizer:
    """See :func:`partition`."""

    def __init__(self, optimizers: dict, labels: Any):
        if not isinstance(optimizers, dict) or not optimizers:
            raise TypeError(f"optimizers must be a non-empty dict from label to optimizer, got {optimizers!r}")
        for key, opt in optimizers.items():
            if not isinstance(key, str):
                raise TypeError(f"optimizer labels must be strings, got {key!r}")
            if not (callable(getattr(opt, "init", None)) and callable(getattr(opt, "update", None))):
                raise TypeError(f"optimizers[{key!r}] must have init(params, manifolds) and update(...), got {opt!r}")
        self.optimizers = dict(optimizers)
        self.labels = labels
        self._split: tuple | None = None  # (treedef, paths, label per leaf), recorded by init

    def __repr__(self) -> str:
        return f"partition({self.optimizers!r}, labels)"

    def _assign(self, params: Any) -> tuple[Any, list[str], list[str]]:
        paths, _, treedef = optree.tree_flatten_with_path(params)
        try:
            labels = treedef.flatten_up_to(self.labels)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"labels must have the tree structure of params {treedef}: {exc}") from None
        for path, label in zip(paths, labels, strict=True):
            if label not in self.optimizers:
                raise ValueError(
                    f"labels{_path(path)} is {label!r}, which names none of the optimizers {sorted(self.optimizers)}"
                )
        return treedef, [_path(p) for p in paths], list(labels)

    def _members(self, tree: Any, treedef: Any, paths: list[str], labels: list[str]) -> dict[str, dict]:
        leaves = treedef.flatten_up_to(tree)
        out: dict[str, dict] = {key: {} for key in self.optimizers}
        for path, label, leaf in zip(paths, labels, leaves, strict=True):
            out[label][path] = leaf
        return out

    def init(self, params: Any, manifolds: Any = None) -> PartitionState:
        treedef, paths, labels = self._assign(params)
        sub_params = self._members(params, treedef, paths, labels)
        if manifolds is None:
            sub_mans = {key: None for key in self.optimizers}
        else:
            mans = optree.tree_flatten(manifolds, is_leaf=_is_manifold_leaf, none_is_leaf=True)[0]
            if len(mans) != len(paths):
                raise ValueError(f"manifolds must have the tree structure of params {treedef}")
            sub_mans = {key: {} for key in self.optimizers}
            for path, label, m in zip(paths, labels, mans, strict=True):
                sub_mans[label][path] = m
        states = {
            key: opt.init(sub_params[key], sub_mans[key]) for key, opt in self.optimizers.items() if sub_params[key]
        }
        self._split = (treedef, paths, labels)
        return PartitionState(states)

    def update(self, params: Any, grads: Any, state: PartitionState) -> tuple[Any, PartitionState]:
        if self._split is None:
            raise RuntimeError(f"{self!r} has not been initialised: call state = opt.init(params, manifolds) first")
        if not isinstance(state, PartitionState):
            raise TypeError(f"state must be the PartitionState returned by init, got {type(state).__name__}")
        treedef, paths, labels = self._split
        if optree.tree_structure(params) != treedef:
            raise ValueError(f"params has tree structure {optree.tree_structure(params)}, init saw {treedef}")
        sub_params = self._members(params, treedef, paths, labels)
        sub_grads = self._members(grads, treedef, paths, labels)
        new_params: dict[str, Any] = {}
        new_states = {}
        # members are pure: if one raises on bad input, nothing has changed
        for key, sub in state.states.items():
            new_params_k, new_states[key] = self.optimizers[key].update(sub_params[key], sub_grads[key], sub)
            new_params.update(new_params_k)
        return treedef.unflatten([new_params[p] for p in paths]), PartitionState(new_states)


def partition(optimizers: dict, labels: Any) -> PartitionedOptimizer:
    """One optimizer per label: ``labels`` is a tree like the parameters whose leaves are keys of
    ``optimizers``; each member updates the leaves carrying its key (see the module docstring)."""
    return PartitionedOptimizer(optimizers, labels)
