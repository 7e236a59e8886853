"""The optimizer state: a tree of arrays plus a static description of the parameter groups.

``OptState`` holds

* ``step``      the number of steps taken (an integer array on the parameters' device),
* ``skipped``   how many updates were skipped because a gradient was not finite,
* ``cache``     one entry per parameter group: the method's cache (for Adam the pair (B₁, B₂) of
                horizontal elements, eq. 5), a tree of arrays,
* ``sections``  one entry per group: the transported section Λ (``section="transported"``) or None,
* ``spec``      static: the manifolds, how parameter leaves are grouped, the parameter tree structure.

``spec`` is auxiliary data of the tree node: ``optree`` (namespace ``"geoarray"``) and
``jax.tree_util`` (registered as soon as a state is built from JAX arrays) see only the arrays, so a
state passes through ``jax.jit`` and checkpointing as an ordinary tree.

:func:`save_state` / :func:`load_state` write and read the arrays of a state as an ``.npz`` file;
the round trip is bit-exact on every backend, and a run resumed from a saved state continues
exactly as the uninterrupted run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import optree

from .. import _backend
from ..manifolds.base import Manifold

__all__ = ["Group", "OptState", "load_state", "save_state"]

Array = Any


@dataclass(frozen=True)
class Group:
    """Parameter leaves updated by one (batched) manifold call.

    ``kind`` is ``"single"`` (one leaf as it is), ``"stack"`` (same-shape leaves of one manifold
    stacked along a new leading axis) or ``"flat"`` (Euclidean leaves raveled and concatenated).
    """

    manifold: Manifold
    indices: tuple[int, ...]
    kind: str


@dataclass(frozen=True)
class Spec:
    """Static description of an optimizer state (hashable: it is the tree node's auxiliary data)."""

    treedef: Any
    groups: tuple[Group, ...]
    seed: int | None


class OptState:
    """State of a geoarray optimizer (see the module docstring)."""

    __slots__ = ("cache", "sections", "skipped", "spec", "step")

    def __init__(self, step: Array, skipped: Array, cache: tuple, sections: tuple, spec: Spec):
        self.step = step
        self.skipped = skipped
        self.cache = cache
        self.sections = sections
        self.spec = spec

    def __repr__(self) -> str:
        kinds = ", ".join(f"{g.manifold!r}×{len(g.indices)}" for g in self.spec.groups)
        return f"OptState(step={self.step!r}, groups=[{kinds}])"

    def replace(self, **changes: Any) -> OptState:
        fields = {k: getattr(self, k) for k in self.__slots__}
        fields.update(changes)
        return OptState(**fields)

    def tree_flatten(self) -> tuple[tuple, Spec]:
        return (self.step, self.skipped, self.cache, self.sections), self.spec

    @classmethod
    def tree_unflatten(cls, spec: Spec, children: Any) -> OptState:
        step, skipped, cache, sections = children
        return cls(step, skipped, cache, sections, spec)


def _flatten(state: OptState) -> tuple[tuple, Spec, tuple]:
    children, spec = state.tree_flatten()
    return children, spec, ("step", "skipped", "cache", "sections")


optree.register_pytree_node(
    OptState,
    _flatten,
    lambda spec, children: OptState.tree_unflatten(spec, children),
    namespace="geoarray",
)


def register_with_jax() -> None:
    _backend.register_jax_pytree(OptState, OptState.tree_flatten, OptState.tree_unflatten)


def state_leaves(state: OptState) -> tuple[list, Any]:
    """The arrays of a state and the tree structure to rebuild it."""
    return optree.tree_flatten(state, namespace="geoarray")


# ---------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------


def _fingerprint(state: OptState) -> str:
    groups = [[repr(g.manifold), list(g.indices), g.kind] for g in state.spec.groups]
    return json.dumps({"groups": groups, "seed": state.spec.seed})


def save_state(path: str | os.PathLike, state: OptState) -> None:
    """Write the arrays of ``state`` to ``path`` (an ``.npz`` file), bit-exactly.

    The arrays are copied to the host (NumPy) to be written; the group description is stored
    alongside so :func:`load_state` can refuse a state of a different optimizer layout.
    """
    if not isinstance(state, OptState):
        raise TypeError(f"state must be an OptState, got {type(state).__name__}")
    leaves, _ = state_leaves(state)
    arrays = {f"leaf_{i:05d}": _backend.to_host(leaf) for i, leaf in enumerate(leaves)}
    arrays["__layout__"] = np.array(_fingerprint(state))
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_state(path: str | os.PathLike, like: OptState) -> OptState:
    """Read a state written by :func:`save_state`, on the namespace, dtypes and devices of ``like``.

    ``like`` is a state of the same optimizer for the same parameters (e.g. from ``opt.init``); its
    leaves give the expected shapes, dtypes and devices. A layout or shape mismatch raises
    ``ValueError`` and nothing is returned half-loaded.
    """
    if not isinstance(like, OptState):
        raise TypeError(f"like must be an OptState, got {type(like).__name__}")
    leaves, treedef = state_leaves(like)
    with np.load(path, allow_pickle=False) as data:
        layout = str(data["__layout__"]) if "__layout__" in data else None
        if layout != _fingerprint(like):
            raise ValueError(f"{os.fspath(path)!r} holds the state of a different optimizer layout: {layout}")
        host = [data[f"leaf_{i:05d}"] for i in range(len(leaves))] if len(data.files) == len(leaves) + 1 else None
    if host is None:
        raise ValueError(f"{os.fspath(path)!r} has a different number of arrays than like ({len(leaves)})")
    out = []
    for i, (h, ref) in enumerate(zip(host, leaves, strict=True)):
        if tuple(h.shape) != tuple(ref.shape):
            raise ValueError(f"array {i} of {os.fspath(path)!r} has shape {h.shape}, like has {tuple(ref.shape)}")
        if h.dtype.name != str(ref.dtype).rsplit(".", 1)[-1]:
            raise ValueError(f"array {i} of {os.fspath(path)!r} has dtype {h.dtype.name}, like has {ref.dtype}")
        xp = _backend.array_namespace(ref)
        out.append(xp.asarray(h, dtype=ref.dtype, device=_backend.device(ref)))
    return optree.tree_unflatten(treedef, out)
