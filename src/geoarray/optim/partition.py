"""Different optimizers for different parameters (optax's ``multi_transform`` idea).

    opt = geoarray.optim.partition({"muon": ManifoldMuon(lr=5e-3), "adam": Adam(lr=1e-3)}, labels)
    state = opt.init(params, manifolds)            # labels: a tree like params holding the keys
    params, state = opt.update(params, grads, state)

``labels`` may also be a function, called by ``init`` (which records the labels in the state; ``update``
never calls it): of one argument, ``labels(params)`` returns the tree of labels, as optax's
``multi_transform`` takes it; of two, ``labels(path, leaf)`` labels one leaf from its path (the tuple of its
keys) and the leaf itself::

    labels = lambda path, leaf: "muon" if path[-1] == "W" else "adam"   # path: ('blocks', 0, 'W')

Each member optimizer sees the leaves labelled with its key, as a dict from the leaf's path in
``params`` (a :class:`~geoarray.optim.layout.LeafPath`, e.g. ``"['blocks'][0]['W_q']"``) to the leaf,
so its error messages name the user's parameters as the rest of the library does
(``params['blocks'][0]['W_q']``). The state is a NamedTuple holding a dict of the members' states and the static
assignment of leaves to members (:class:`PartitionLayout`): the optimizer object holds configuration
only. Members keep their own step counts, non-finite policies and checkpoints of their states.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import optree

from .. import _backend
from .layout import LeafPath, is_manifold_leaf, leaf_path
from .nonfinite import check_skip

__all__ = ["PartitionLayout", "PartitionState", "PartitionedOptimizer", "partition"]


@_backend.register_static_node
@dataclass(frozen=True)
class PartitionLayout:
    """Which member updates which leaf: the tree structure, the leaves' paths and their labels (static)."""

    treedef: Any
    paths: tuple[str, ...]
    labels: tuple[str, ...]


class PartitionState(NamedTuple):
    """State of :func:`partition`: each member optimizer's state by key, and the labelled layout of the tree."""

    states: dict  # key → the member optimizer's state
    layout: PartitionLayout


def _path(path: tuple) -> LeafPath:
    return LeafPath(leaf_path(path, root=""))


class PartitionedOptimizer:
    """See :func:`partition`."""

    #: ``update`` takes an outside skip flag (``skip=``), handed on to the members
    takes_skip_flag = True

    def __init__(self, optimizers: dict, labels: Any):
        if not isinstance(optimizers, dict) or not optimizers:
            raise TypeError(f"optimizers must be a non-empty dict from label to optimizer, got {optimizers!r}")
        for key, opt in optimizers.items():
            if not isinstance(key, str):
                raise TypeError(f"optimizer labels must be strings, got {key!r}")
            if not (callable(getattr(opt, "init", None)) and callable(getattr(opt, "update", None))):
                raise TypeError(f"optimizers[{key!r}] must have init(params, manifolds) and update(...), got {opt!r}")
        if callable(labels) and _arity(labels) is None:
            raise TypeError(
                f"labels must be a tree of optimizer keys like params, a function params -> that tree (optax's "
                f"multi_transform), or a function (path, leaf) -> key; got {labels!r}, which cannot be called "
                "with one argument nor with two"
            )
        self.optimizers = dict(optimizers)
        self.labels = labels

    def __repr__(self) -> str:
        return f"partition({self.optimizers!r}, labels)"

    def _assign(self, params: Any) -> tuple[Any, list[str], list[str]]:
        paths, leaves, treedef = optree.tree_flatten_with_path(params)
        if callable(self.labels) and _arity(self.labels) == 2:
            labels = [self.labels(path, leaf) for path, leaf in zip(paths, leaves, strict=True)]
            named = "labels(params{}, leaf) returned {!r}"
        else:
            tree = self.labels(params) if callable(self.labels) else self.labels
            try:
                labels = treedef.flatten_up_to(tree)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"labels must have the tree structure of params {treedef}: {exc}") from None
            named = "labels{} is {!r}"
        for path, label in zip(paths, labels, strict=True):
            if not isinstance(label, str) or label not in self.optimizers:
                raise ValueError(
                    named.format(_path(path), label) + f", which names none of the optimizers {sorted(self.optimizers)}"
                )
        # every label is a key of self.optimizers (checked above), and those are strings
        return treedef, [_path(p) for p in paths], cast("list[str]", list(labels))

    def _members(self, tree: Any, treedef: Any, paths: list[str], labels: list[str]) -> dict[str, dict]:
        # dynamo cannot trace PyTreeSpec.flatten_up_to (torch.compile of a step); there tree_leaves, whose count
        # zip(strict=True) checks (the eager step before it checked the structure)
        leaves = optree.tree_leaves(tree) if _backend.is_compiling() else treedef.flatten_up_to(tree)
        out: dict[str, dict] = {key: {} for key in self.optimizers}
        for path, label, leaf in zip(paths, labels, leaves, strict=True):
            out[label][path] = leaf
        return out

    def init(self, params: Any, manifolds: Any = None) -> PartitionState:
        treedef, paths, labels = self._assign(params)
        sub_params = self._members(params, treedef, paths, labels)
        sub_mans: Mapping[str, dict[str, Any] | None]
        if manifolds is None:
            sub_mans = {key: None for key in self.optimizers}
        else:
            mans = optree.tree_flatten(manifolds, is_leaf=is_manifold_leaf, none_is_leaf=True)[0]
            if len(mans) != len(paths):
                raise ValueError(f"manifolds must have the tree structure of params {treedef}")
            by_label: dict[str, dict[str, Any]] = {key: {} for key in self.optimizers}
            for path, label, m in zip(paths, labels, mans, strict=True):
                by_label[label][path] = m
            sub_mans = by_label
        states = {
            key: opt.init(sub_params[key], sub_mans[key]) for key, opt in self.optimizers.items() if sub_params[key]
        }
        _backend.ensure_static_nodes()
        return PartitionState(states, PartitionLayout(treedef, tuple(paths), tuple(labels)))

    def update(
        self,
        params: Any,
        grads: Any,
        state: PartitionState,
        *,
        check: bool = True,
        donate: bool = False,
        skip: Any = None,
    ) -> tuple[Any, PartitionState]:
        """Each member's ``update`` on its leaves (``check`` and ``donate`` are passed on to the members).

        ``skip``: a step skipped for a reason outside the optimizer (:meth:`RiemannianOptimizer.update
        <geoarray.optim.RiemannianOptimizer.update>`), handed to the members that take it (geoarray's
        optimizers); a member of another kind (an ``(init, update)`` pair of the user's) is handed gradients
        zeroed where the flag is set and its old leaves and state are selected back, so the whole step is
        skipped, none of it counted as the members' own."""
        if not isinstance(state, PartitionState):
            raise TypeError(f"state must be the PartitionState returned by init, got {type(state).__name__}")
        skip = check_skip(skip)
        treedef, paths, labels = state.layout.treedef, list(state.layout.paths), list(state.layout.labels)
        if check and optree.tree_structure(params) != treedef:
            raise ValueError(f"params has tree structure {optree.tree_structure(params)}, init saw {treedef}")
        if skip is True:  # checked like any step, then nothing to do
            return params, state
        sub_params = self._members(params, treedef, paths, labels)
        sub_grads = self._members(grads, treedef, paths, labels)
        new_params: dict[str, Any] = {}
        new_states = {}
        # members are pure: if one raises on bad input, nothing has changed
        skip = None if skip is False else skip
        for key, sub in state.states.items():
            # members may be any (init, update) pair: only geoarray's take check=, donate= and skip=
            member = self.optimizers[key]
            own_skip = skip is not None and getattr(member, "takes_skip_flag", False)
            kwargs: dict[str, Any] = {} if check else {"check": False}
            if donate and (skip is None or own_skip):  # a selection of old values (below) needs them kept
                kwargs["donate"] = True
            if own_skip:
                kwargs["skip"] = skip
            args = (sub_params[key], sub_grads[key], sub)
            if skip is not None and not own_skip:
                new_params_k, new_states[key] = _skipped_where(member, *args, skip, kwargs)
            else:
                new_params_k, new_states[key] = member.update(*args, **kwargs)
            new_params.update(new_params_k)
        # traced, the treedef made eagerly is not the one dynamo's optree takes: params' own (the same tree)
        out = optree.tree_structure(params) if _backend.is_compiling() else treedef
        return out.unflatten([new_params[p] for p in paths]), PartitionState(new_states, state.layout)


def _skipped_where(member: Any, params: dict, grads: dict, state: Any, skip: Any, kwargs: dict) -> tuple[dict, Any]:
    """A member without ``skip=``: its update on gradients zeroed where ``skip``, and its old leaves and state
    where ``skip`` (a 0-d boolean array), selected leaf by leaf on the device."""
    leaves = [x for x in params.values() if hasattr(x, "dtype")]  # a member's params: {path: leaf}
    if not leaves:
        return member.update(params, grads, state, **kwargs)
    xp = _backend.array_namespace(*leaves)

    def on(x: Any) -> Any:
        return xp.asarray(skip, device=_backend.device(x))

    zeroed = {k: xp.where(on(g), xp.zeros((), dtype=g.dtype, device=_backend.device(g)), g) for k, g in grads.items()}
    new_params, new_state = member.update(params, zeroed, state, **kwargs)
    kept = {k: xp.where(on(v), params[k], v) for k, v in new_params.items()}
    return kept, optree.tree_map(lambda n, o: xp.where(on(n), o, n) if hasattr(n, "dtype") else n, new_state, state)


def _arity(fn: Any) -> int | None:
    """2 if ``fn`` takes two positional arguments (a per-leaf labelling), 1 if one (optax's ``params -> tree``),
    else None; a callable without a signature (a builtin) counts as 1, and its call says what is wrong."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    for arity in (2, 1):
        try:
            signature.bind(*(None,) * arity)
        except TypeError:
            continue
        return arity
    return None


def partition(optimizers: dict, labels: Any) -> PartitionedOptimizer:
    """One optimizer per label: ``labels`` is a tree like the parameters whose leaves are keys of
    ``optimizers``, a function ``labels(params)`` returning that tree (optax's ``multi_transform``), or a
    function ``labels(path, leaf) -> key`` of a leaf's path (the tuple of its keys, ``('blocks', 0, 'W')``)
    and the leaf; each member updates the leaves carrying its key (see the module docstring)."""
    return PartitionedOptimizer(optimizers, labels)
