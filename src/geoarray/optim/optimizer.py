"""Algorithm 1 of the paper over parameter trees: the driver shared by every method.

Per step and parameter group::

    Δ  = M.rgrad(Y, ∇L)                     # Riemannian gradient (operation 1)
    λ  = section(Y)                         # global section (Definition 5; strategy of M)
    B  = M.global_rep(λ, Δ)                 # lift to g^hor (operation 2, eq. 11)
    cache, W = method(cache, B, t)          # cache update and velocity (eqs. 5–8)
    Y' = M.apply_section(λ, M.retraction(W))   # retraction (operation 3, eq. 13)

Euclidean leaves take the same path (rgrad and lift are identities, the retraction is addition).
``update`` is a pure function of arrays: it never mutates its inputs and has no Python control
flow on array values, so ``jax.jit(opt.update)`` compiles it and the same code runs on NumPy,
CuPy, PyTorch and JAX.

Sections across steps (the manifold's ``section`` keyword):

* ``"householder"`` — recomputed from Y at every step (deterministic, O(N·n²), O(N·n) memory). The
  cache's g^hor coordinates refer to a frame that is a function of the current point.
* ``"transported"`` — created in ``init`` and carried as Λ ← Λ·exp(W) (GeometricMachineLearning.jl);
  the cache's coordinates refer to a frame that moves with the weights. Dense N×N per weight.
* ``"random"`` — Algorithm 2 at every step, seeded from (``seed``, step, group), so runs are
  reproducible. Draws on the host: not traceable under ``jax.jit``.

Grouping (``group_same_shape=True``): leaves with the same manifold, shape, dtype and device are
stacked along a new leading axis and updated by one batched call (e.g. the 336 Stiefel(49, 7)
projections of the paper's vision transformer), and all Euclidean leaves of one dtype and device are
raveled into one vector, so a step costs a fixed number of array operations instead of one set per
leaf. The cache is then stored per group.

Non-finite gradients (``on_nonfinite``): ``"skip"`` (default) leaves parameters, cache and sections
unchanged for that step and counts it in ``state.skipped`` (traceable); ``"raise"`` raises
``FloatingPointError`` naming the leaf (reads a flag to the host: eager use only); ``"ignore"``
performs no check (cheapest; NaN propagates, as in plain PyTorch optimizers).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import optree

from .. import _backend
from .._backend import array_namespace
from ..manifolds.base import Manifold
from ..manifolds.euclidean import Euclidean
from .schedules import as_schedule
from .state import Group, OptState, Spec, register_with_jax

__all__ = ["Optimizer"]

Array = Any
_POLICIES = ("skip", "raise", "ignore")


def _is_manifold_leaf(x: Any) -> bool:
    return x is None or isinstance(x, Manifold)


def _path(path: tuple) -> str:
    return "params" + "".join(f"[{p!r}]" for p in path)


class Optimizer:
    """Base class: subclasses define ``init_cache(B)`` and ``step_cache(cache, B, t, lr)``.

    ``init_cache`` receives a zero horizontal element (or array) shaped like a group's lifted
    gradient and returns the method's cache (a tree of arrays); ``step_cache`` returns the updated
    cache and the velocity W (same type as B). ``t`` is the step number (1, 2, …) as a floating
    array of the group's dtype; ``lr`` the learning rate at that step.
    """

    def __init__(self, lr: Any, *, group_same_shape: bool = False, on_nonfinite: str = "skip", seed: int = 0):
        self.lr = as_schedule(lr)
        self.group_same_shape = bool(group_same_shape)
        if on_nonfinite not in _POLICIES:
            raise ValueError(f"on_nonfinite must be one of {_POLICIES}, got {on_nonfinite!r}")
        self.on_nonfinite = on_nonfinite
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int (it seeds 'random' sections), got {seed!r}")
        self.seed = seed

    # -- the method ------------------------------------------------------------------------------

    def init_cache(self, B: Any) -> Any:
        raise NotImplementedError

    def step_cache(self, cache: Any, B: Any, t: Array, lr: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    # -- trees and groups --------------------------------------------------------------------------

    def _flatten_params(self, params: Any, name: str = "params") -> tuple[list, Any, list]:
        paths, leaves, treedef = optree.tree_flatten_with_path(params)
        if not leaves:
            raise ValueError(f"{name} has no array leaves")
        return leaves, treedef, paths

    def _flatten_manifolds(self, manifolds: Any, params: Any, n_leaves: int) -> list[Manifold]:
        if manifolds is None:
            return [Euclidean()] * n_leaves
        mans, mdef = optree.tree_flatten(manifolds, is_leaf=_is_manifold_leaf, none_is_leaf=True)
        treedef = optree.tree_structure(params, none_is_leaf=True)
        if mdef != treedef:
            raise ValueError(
                f"manifolds must have the tree structure of params (a Manifold or None per leaf): params {treedef}, "
                f"manifolds {mdef}"
            )
        for m in mans:
            if not _is_manifold_leaf(m):
                raise TypeError(f"manifolds leaves must be Manifold instances or None, got {type(m).__name__}")
        return [Euclidean() if m is None else m for m in mans]

    def _make_groups(self, leaves: list, mans: list[Manifold]) -> tuple[Group, ...]:
        if not self.group_same_shape:
            return tuple(Group(m, (i,), "single") for i, m in enumerate(mans))
        buckets: dict[tuple, list[int]] = {}
        for i, (leaf, m) in enumerate(zip(leaves, mans, strict=True)):
            where = (str(leaf.dtype), str(_backend.device(leaf)))
            key = ("flat", *where) if isinstance(m, Euclidean) else ("stack", m, tuple(leaf.shape), *where)
            buckets.setdefault(key, []).append(i)
        groups = []
        for key, idx in buckets.items():
            manifold = Euclidean() if key[0] == "flat" else key[1]
            kind = "single" if len(idx) == 1 and key[0] == "stack" else key[0]
            groups.append(Group(manifold, tuple(idx), kind))
        return tuple(groups)

    @staticmethod
    def _pack(group: Group, leaves: list, xp: Any) -> Array:
        if group.kind == "single":
            return leaves[group.indices[0]]
        if group.kind == "stack":
            return xp.stack([leaves[i] for i in group.indices], axis=0)
        return xp.concat([xp.reshape(leaves[i], (-1,)) for i in group.indices], axis=0)

    @staticmethod
    def _unpack(group: Group, packed: Array, shapes: list, xp: Any, out: list) -> None:
        if group.kind == "single":
            out[group.indices[0]] = packed
        elif group.kind == "stack":
            for k, i in enumerate(group.indices):
                out[i] = packed[k, ...]
        else:
            offset = 0
            for i in group.indices:
                size = math.prod(shapes[i])
                out[i] = xp.reshape(packed[offset : offset + size], shapes[i])
                offset += size

    # -- sections ------------------------------------------------------------------------------------

    @staticmethod
    def _strategy(M: Manifold) -> str:
        return getattr(M, "section", "householder")

    def _section_seed(self, step: Array, g: int) -> np.random.SeedSequence:
        if _backend.is_traced(step):
            raise TypeError(
                "section='random' draws Algorithm 2's Gaussian on the host at every step, which cannot run inside "
                "jax.jit; use section='householder' or 'transported' under jit"
            )
        return np.random.SeedSequence([self.seed, int(step), g])

    def _section(self, M: Manifold, Y: Array, g: int, step: Array, sections: tuple) -> Any:
        strategy = self._strategy(M)
        if strategy == "transported":
            return sections[g]
        if strategy == "random":
            return M.global_section(Y, seed=self._section_seed(step, g))
        return M.global_section(Y)

    # -- init ------------------------------------------------------------------------------------------

    def init(self, params: Any, manifolds: Any = None) -> OptState:
        """The initial state for ``params`` (a tree of arrays) constrained by ``manifolds``.

        ``manifolds`` has the tree structure of ``params`` with a Manifold or None (Euclidean) per
        leaf; ``None`` altogether means every leaf is Euclidean. Points must have the trailing shape
        of their manifold.
        """
        leaves, treedef, paths = self._flatten_params(params)
        xp = array_namespace(*leaves)
        mans = self._flatten_manifolds(manifolds, params, len(leaves))
        for leaf, m, path in zip(leaves, mans, paths, strict=True):
            _backend.check_real_floating(leaf, _path(path), xp)
            shape = m.point_shape
            if shape is not None and tuple(leaf.shape[-len(shape) :]) != tuple(shape):
                raise ValueError(
                    f"{_path(path)} has shape {tuple(leaf.shape)}, which does not end in {tuple(shape)} as {m!r} needs"
                )
            if self._strategy(m) == "transported" and not hasattr(m, "transport_section"):
                raise ValueError(f"{m!r} does not support section='transported'")
        groups = self._make_groups(leaves, mans)
        device = _backend.device(leaves[0])
        step = xp.zeros((), dtype=xp.int32 if _backend.is_jax(xp) else xp.int64, device=device)
        cache, sections = [], []
        for g, group in enumerate(groups):
            M = group.manifold
            Y = self._pack(group, leaves, xp)
            strategy = self._strategy(M)
            if strategy == "random":
                lam = M.global_section(Y, seed=np.random.SeedSequence([self.seed, 0, g]))
            else:
                lam = M.global_section(Y)
            sections.append(lam if strategy == "transported" else None)
            zero = M.global_rep(lam, xp.zeros_like(Y))
            cache.append(self.init_cache(zero))
        state = OptState(step, xp.zeros_like(step), tuple(cache), tuple(sections), Spec(treedef, groups, self.seed))
        if _backend.is_jax(xp):
            register_with_jax()
        return state

    # -- update ------------------------------------------------------------------------------------------

    def _check_update_inputs(self, params: Any, grads: Any, state: OptState) -> tuple[list, list, Any, list]:
        if not isinstance(state, OptState):
            raise TypeError(f"state must be the OptState returned by init, got {type(state).__name__}")
        leaves, treedef, paths = self._flatten_params(params)
        if treedef != state.spec.treedef:
            raise ValueError(f"params has tree structure {treedef}, but the state was built for {state.spec.treedef}")
        gleaves, gdef = optree.tree_flatten(grads)
        if gdef != treedef:
            raise ValueError(f"grads must have the tree structure of params {treedef}, got {gdef}")
        xp = array_namespace(*leaves, *gleaves)
        for p, g, path in zip(leaves, gleaves, paths, strict=True):
            if tuple(g.shape) != tuple(p.shape):
                raise ValueError(f"grad of {_path(path)} has shape {tuple(g.shape)}, the parameter {tuple(p.shape)}")
            if g.dtype != p.dtype:
                raise TypeError(f"grad of {_path(path)} has dtype {g.dtype}, the parameter {p.dtype}")
        return leaves, gleaves, xp, paths

    def _finite(self, gleaves: list, paths: list, xp: Any) -> Array | None:
        if self.on_nonfinite == "ignore":
            return None
        flags = [xp.all(xp.isfinite(g)) for g in gleaves]
        if self.on_nonfinite == "raise":
            bad = [_path(p) for f, p in zip(flags, paths, strict=True) if not bool(f)]
            if bad:
                raise FloatingPointError(f"non-finite gradient for {', '.join(bad)}; parameters and state unchanged")
            return None
        finite = flags[0]
        for f in flags[1:]:
            finite = xp.logical_and(finite, f)
        return finite

    def update(self, params: Any, grads: Any, state: OptState) -> tuple[Any, OptState]:
        """One step of Algorithm 1: ``params, state = opt.update(params, grads, state)``.

        Pure: the inputs are not modified. ``grads`` are Euclidean gradients ∇L with the tree
        structure, shapes and dtypes of ``params``.
        """
        leaves, gleaves, xp, paths = self._check_update_inputs(params, grads, state)
        finite = self._finite(gleaves, paths, xp)
        if finite is not None:
            # zero the gradients of a skipped step so no NaN reaches LAPACK-backed kernels
            gleaves = [xp.where(finite, g, xp.zeros_like(g)) for g in gleaves]
        # xp.asarray: NumPy turns 0-d arithmetic results into scalars, which are not arrays
        step = xp.asarray(state.step + 1)
        shapes = [tuple(leaf.shape) for leaf in leaves]
        new_leaves: list = [None] * len(leaves)
        new_cache, new_sections = [], []
        for g, group in enumerate(state.spec.groups):
            M = group.manifold
            Y = self._pack(group, leaves, xp)
            G = self._pack(group, gleaves, xp)
            lam = self._section(M, Y, g, step, state.sections)
            B = M.global_rep(lam, M.rgrad(Y, G))
            t = xp.astype(step, Y.dtype)
            cache, W = self.step_cache(state.cache[g], B, t, self.lr(t))
            if self._strategy(M) == "transported":
                lam_new = M.transport_section(lam, W)
                Y_new = lam_new.Y
            else:
                lam_new = None
                Y_new = M.apply_section(lam, M.retraction(W))
            self._unpack(group, Y_new, shapes, xp, new_leaves)
            new_cache.append(cache)
            new_sections.append(lam_new)
        new_state = OptState(step, state.skipped, tuple(new_cache), tuple(new_sections), state.spec)
        if finite is not None:
            keep = lambda new, old: xp.where(finite, new, old)  # noqa: E731
            new_leaves = [keep(n, o) for n, o in zip(new_leaves, leaves, strict=True)]
            new_state = OptState(
                keep(step, state.step),
                xp.asarray(state.skipped + xp.astype(xp.logical_not(finite), state.skipped.dtype)),
                optree.tree_map(keep, new_state.cache, state.cache),
                optree.tree_map(keep, new_state.sections, state.sections),
                state.spec,
            )
        treedef = state.spec.treedef
        return optree.tree_unflatten(treedef, new_leaves), new_state
