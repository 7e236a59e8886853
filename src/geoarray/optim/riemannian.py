"""Algorithm 1 of Brantner's paper as a wrapper around a vector-space transform.

Per step and parameter group (Brantner, *Generalizing Adam to Manifolds for Efficiently Training
Transformers*, Algorithm 1)::

    Δ  = M.rgrad(Y, ∇L)                        # Riemannian gradient (operation 1, eq. 4 for Stiefel)
    λ  = M.global_section(Y)                   # global section (Definition 5; the optimizer's strategy)
    B  = M.global_rep(λ, Δ)                    # lift to g^hor (operation 2, eq. 11)
    W, state = transform.update(B, state)      # cache update and velocity: vector-space code (eqs. 5–8)
    Y' = M.apply_retraction(λ, W)              # λ·retraction(W)·E (operation 3, eq. 13)

The transform sees a tuple with one horizontal element (or array) per group; horizontal elements
are NamedTuples of arrays, so any pytree transform — geoarray's or optax's — runs on them unchanged.
Euclidean leaves take the same path (rgrad and the lift are identities, the retraction is addition).
``update`` is a pure function of arrays with no Python control flow on array values, so
``jax.jit(opt.update)`` compiles it and the same code runs on NumPy, CuPy, PyTorch and JAX.

**Sections** (``section=``) are the optimizer's choice, because the g^hor coordinates of its caches
depend on them (the retracted point does not):

* ``"householder"`` — λ(Y) recomputed from Y at every step: deterministic, O(N·n²) work and O(N·n)
  memory; the frame jumps where a Householder pivot changes sign.
* ``"rotated"`` — the Householder frame, with the transform's state re-expressed in each new frame
  (B ← S·B with S = Q⊥(Y_{t+1})ᵀ·(λ_t·exp(W_t))[:, n:], applied through the WY form and the low-rank
  exp(W), never formed): O(N·n²) work and O(N·n) memory like ``"householder"``, while linear caches
  (momentum, Adam's first moment) follow the transported frame exactly; Adam's second moment is
  rotated through its square root, exact for the signed permutations of a Householder pivot flip.
  Needs a transform with a ``reframe`` rule (geoarray's have one; optax's do not).
* ``"transported"`` — created in ``init`` and carried as Λ ← Λ·exp(W) (GeometricMachineLearning.jl):
  a frame that moves with the weights; dense N×N per weight, O(N²·n) per step.
* ``"random"`` — Algorithm 2 at every step, seeded from (``seed``, step, group); draws on the host,
  so it cannot run under ``jax.jit``.

``None`` (the default) takes each manifold's own ``section`` setting (Householder unless the
manifold was built otherwise).

**Grouping** (``group_same_shape=True``, the default): leaves with the same manifold, shape, dtype
and device are stacked along a new leading axis and updated by one batched call (e.g. the 336
Stiefel(49, 7) projections of the paper's vision transformer), and all Euclidean leaves of one dtype
and device are raveled into one vector, so a step costs a fixed number of array operations instead of
one set per leaf. The user sees their own tree; the transform's state is stored per group.

**Non-finite gradients** (``on_nonfinite``): ``"skip"`` (default, like torch's GradScaler) leaves
parameters, transform state and sections unchanged for that step and counts it in ``state.skipped``
(traceable). An eager update reads the finiteness flag to the host (one scalar, as its retraction
does): a skipped step then computes nothing, a finite one needs no masking, and the first skipped
step warns (:class:`NonFiniteGradientWarning`, once). Under ``jax.jit`` or ``torch.compile`` nothing is
read: the step is computed and the old parameters and state are selected where the flag is false;
``"raise"``
raises ``FloatingPointError`` naming the leaf (reads a flag to the host: eager use only);
``"ignore"`` performs no check (cheapest; NaN propagates, as in plain PyTorch optimizers).

**Precision.** float16/bfloat16 leaves are stepped in float32 (lift, transform state, retraction)
and cast back to their dtype; the state holds float32 arrays. With Householder sections every
retracted point is λ(Y)·g(W)E applied through an orthogonal Q, so orthogonality errors do not
accumulate: after 1000 float32 Adam steps max|YᵀY − I| stays at a few roundoffs (≈2e-6 on the
336 Stiefel(49, 7) ViT weights), and a half-precision weight stays at the accuracy of its own
rounding (≈3e-3 bfloat16, ≈4e-4 float16).

**Compilation.** ``jax.jit(opt.update)`` and ``torch.compile(opt.update, fullgraph=True)`` trace a
whole step (tested equal to eager); compile after ``init`` (which registers torch's traceable geqrf).

**Binding.** ``init(params, manifolds)`` records the manifolds and the grouping of this parameter
tree on the optimizer (as ``torch.optim`` binds its parameters); ``update`` finds them there, so the
state itself is an ordinary pytree of arrays — a NamedTuple that optree, ``jax.tree_util`` and
``torch.utils._pytree`` flatten into arrays with no registration.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import optree

from .. import _backend
from .._backend import array_namespace
from ..manifolds.base import Manifold
from ..manifolds.euclidean import Euclidean
from .transforms import GradientTransformation

__all__ = [
    "NoSection",
    "NonFiniteGradientWarning",
    "RiemannianOptimizer",
    "RiemannianState",
    "RotatedFrame",
    "riemannian",
]

Array = Any
_POLICIES = ("skip", "raise", "ignore")
_SECTIONS = ("householder", "rotated", "transported", "random")
_RETRACTIONS = ("geodesic", "cayley")


class NonFiniteGradientWarning(UserWarning):
    """Some optimizer updates were skipped because a gradient was not finite (``on_nonfinite="skip"``)."""


class NoSection(NamedTuple):
    """Stands for "no carried section" in the state: an empty node, where None would be a leaf to
    ``torch.utils._pytree``."""


class RotatedFrame(NamedTuple):
    """What the ``"rotated"`` strategy carries to the next step: the section and the velocity of this one."""

    section: Any
    velocity: Any


class RiemannianState(NamedTuple):
    """The optimizer state: arrays only (an ordinary pytree)."""

    step: Array  # steps taken (an integer 0-d array on the parameters' device)
    skipped: Array  # updates skipped because a gradient was not finite
    inner: Any  # the transform's state, over the tuple of lifted parameter groups
    sections: tuple  # per group: the carried section ("transported"), RotatedFrame ("rotated") or NoSection()


@dataclass(frozen=True)
class Group:
    """Parameter leaves updated by one (batched) manifold call.

    ``kind`` is ``"single"`` (one leaf as it is), ``"stack"`` (same-shape leaves of one manifold
    stacked along a new leading axis) or ``"flat"`` (Euclidean leaves raveled and concatenated).
    """

    manifold: Manifold
    indices: tuple[int, ...]
    kind: str
    section: str  # the section strategy of this group ("householder" for Euclidean groups)
    dtype: Any = None  # float16/bfloat16 leaves: their dtype; the step is computed in float32 and cast back

    @property
    def upcast(self) -> bool:
        return self.dtype is not None


@dataclass(frozen=True)
class Layout:
    """What ``init`` learnt about a parameter tree: its structure, leaf paths and groups."""

    treedef: Any
    paths: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    groups: tuple[Group, ...]


def _half_dtype(x: Array) -> Any:
    """The dtype of a float16/bfloat16 leaf (computed in float32 by the optimizer), else None."""
    return x.dtype if _backend.dtype_name(x.dtype) in ("float16", "bfloat16") else None


def _is_manifold_leaf(x: Any) -> bool:
    return x is None or isinstance(x, Manifold)


def _readable(flag: Array) -> bool:
    """Whether ``update`` may read the finiteness flag to the host (eager) or must mask (traced)."""
    return not _backend.is_traced(flag)


def _path(path: tuple) -> str:
    return "params" + "".join(f"[{p!r}]" for p in path)


class RiemannianOptimizer:
    """Algorithm 1 around a vector-space transform (see the module docstring).

    Parameters
    ----------
    transform : GradientTransformation
        Any ``(init, update)`` pair over pytrees — :mod:`geoarray.optim.transforms` or optax. Its
        output is the velocity W, *added* through the retraction (so it should end with a
        learning-rate scale, which multiplies by −η).
    section : {"householder", "transported", "random"} or None
        The section strategy for every manifold leaf (None: each manifold's own setting).
    retraction : {"geodesic", "cayley"} or None
        exp(W)E or Cay(W)E (None: each manifold's own ``retraction_method``).
    on_nonfinite : {"skip", "raise", "ignore"}
        What a non-finite gradient does (module docstring).
    group_same_shape : bool
        Update same-shaped leaves of one manifold in one batched call (default True).
    seed : int
        Seeds the ``"random"`` section strategy.
    """

    def __init__(
        self,
        transform: GradientTransformation,
        *,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
    ):
        if not (callable(getattr(transform, "init", None)) and callable(getattr(transform, "update", None))):
            raise TypeError(f"transform must be a gradient transformation (init, update), got {transform!r}")
        if section is not None and section not in _SECTIONS:
            raise ValueError(f"section must be one of {_SECTIONS} or None, got {section!r}")
        if retraction is not None and retraction not in _RETRACTIONS:
            raise ValueError(f"retraction must be one of {_RETRACTIONS} or None, got {retraction!r}")
        if on_nonfinite not in _POLICIES:
            raise ValueError(f"on_nonfinite must be one of {_POLICIES}, got {on_nonfinite!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int (it seeds 'random' sections), got {seed!r}")
        self.transform = transform
        self.section = section
        self.retraction = retraction
        self.on_nonfinite = on_nonfinite
        self.group_same_shape = bool(group_same_shape)
        self.seed = seed
        self._layout: Layout | None = None
        self._warned_nonfinite = False

    def __repr__(self) -> str:
        opts = [f"section={self.section!r}"] if self.section else []
        opts += [f"retraction={self.retraction!r}"] if self.retraction else []
        opts += [f"on_nonfinite={self.on_nonfinite!r}", f"group_same_shape={self.group_same_shape}"]
        return f"{type(self).__name__}({', '.join(opts)})"

    # -- trees and groups --------------------------------------------------------------------------

    @staticmethod
    def _flatten_params(params: Any, name: str = "params") -> tuple[list, Any, list]:
        paths, leaves, treedef = optree.tree_flatten_with_path(params)
        if not leaves:
            raise ValueError(f"{name} has no array leaves")
        return leaves, treedef, paths

    @staticmethod
    def _flatten_manifolds(manifolds: Any, params: Any, n_leaves: int) -> list[Manifold]:
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

    def _strategy(self, M: Manifold, path: str) -> str:
        if isinstance(M, Euclidean):
            return "householder"  # a translation: every strategy is the same
        strategy = self.section or getattr(M, "section", None) or "householder"
        if strategy not in M.section_strategies:
            raise ValueError(
                f"{path} lives on {M!r}, which has no section strategy {strategy!r} "
                f"(it supports {M.section_strategies}); choose section= accordingly"
            )
        return strategy

    def _make_groups(self, leaves: list, mans: list[Manifold], paths: list[str]) -> tuple[Group, ...]:
        strategies = [self._strategy(m, p) for m, p in zip(mans, paths, strict=True)]
        if not self.group_same_shape:
            return tuple(
                Group(m, (i,), "single", s, _half_dtype(leaves[i]))
                for i, (m, s) in enumerate(zip(mans, strategies, strict=True))
            )
        buckets: dict[tuple, list[int]] = {}
        for i, (leaf, m) in enumerate(zip(leaves, mans, strict=True)):
            where = (str(leaf.dtype), str(_backend.device(leaf)))
            key = ("flat", *where) if isinstance(m, Euclidean) else ("stack", m, tuple(leaf.shape), *where)
            buckets.setdefault(key, []).append(i)
        groups = []
        for key, idx in buckets.items():
            manifold = Euclidean() if key[0] == "flat" else key[1]
            kind = "single" if len(idx) == 1 else key[0]
            groups.append(Group(manifold, tuple(idx), kind, strategies[idx[0]], _half_dtype(leaves[idx[0]])))
        return tuple(groups)

    @staticmethod
    def _pack(group: Group, leaves: list, xp: Any) -> Array:
        if group.kind == "single":
            packed = leaves[group.indices[0]]
        elif group.kind == "stack":
            packed = xp.stack([leaves[i] for i in group.indices], axis=0)
        else:
            packed = xp.concat([xp.reshape(leaves[i], (-1,)) for i in group.indices], axis=0)
        return xp.astype(packed, xp.float32) if group.upcast else packed

    @staticmethod
    def _unpack(group: Group, packed: Array, shapes: tuple, xp: Any, out: list) -> None:
        if group.upcast:
            packed = xp.astype(packed, group.dtype)
        if group.kind == "single":
            out[group.indices[0]] = packed
        elif group.kind == "stack":
            for i, leaf in zip(group.indices, xp.unstack(packed, axis=0), strict=True):
                out[i] = leaf
        else:
            parts = _backend.split(packed, [math.prod(shapes[i]) for i in group.indices], xp)
            for i, part in zip(group.indices, parts, strict=True):
                out[i] = xp.reshape(part, shapes[i])

    # -- sections ------------------------------------------------------------------------------------

    def _section_seed(self, step: Array, g: int) -> np.random.SeedSequence:
        if _backend.is_traced(step):
            raise TypeError(
                "section='random' draws Algorithm 2's Gaussian on the host at every step, which cannot run inside "
                "jax.jit; use section='householder' or 'transported' under jit"
            )
        return np.random.SeedSequence([self.seed, int(step), g])

    def _section(self, group: Group, Y: Array, g: int, step: Array, sections: tuple) -> Any:
        if group.section == "transported":
            return sections[g]
        if group.section == "random":
            return group.manifold.global_section(Y, strategy="random", seed=self._section_seed(step, g))
        return group.manifold.global_section(Y, strategy="householder")

    # -- init ------------------------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """The layout recorded by the last :meth:`init` (raises before the first one)."""
        if self._layout is None:
            raise RuntimeError(f"{self!r} has not been initialised: call state = opt.init(params, manifolds) first")
        return self._layout

    def init(self, params: Any, manifolds: Any = None) -> RiemannianState:
        """The initial state for ``params`` (a tree of arrays) constrained by ``manifolds``.

        ``manifolds`` has the tree structure of ``params`` with a Manifold or None (Euclidean) per
        leaf; ``None`` altogether means every leaf is Euclidean. Points must have the trailing shape
        of their manifold. Records the layout of this tree on the optimizer (module docstring).
        """
        leaves, treedef, raw_paths = self._flatten_params(params)
        paths = [_path(p) for p in raw_paths]
        xp = array_namespace(*leaves)
        mans = self._flatten_manifolds(manifolds, params, len(leaves))
        for leaf, m, path in zip(leaves, mans, paths, strict=True):
            _backend.check_real_floating(leaf, path, xp)
            shape = m.point_shape
            if shape is not None and tuple(leaf.shape[-len(shape) :]) != tuple(shape):
                raise ValueError(
                    f"{path} has shape {tuple(leaf.shape)}, which does not end in {tuple(shape)} as {m!r} needs"
                )
            # one host read per leaf, at init only (never inside a step, never under tracing); half
            # precision leaves are checked in float32 at the accuracy of their own rounding
            if (
                not isinstance(m, Euclidean)
                and not _backend.is_traced(leaf)
                and not m.is_point(
                    leaf if _half_dtype(leaf) is None else xp.astype(leaf, xp.float32),
                    atol=Manifold._default_atol(leaf.dtype, xp),
                )
            ):
                raise ValueError(
                    f"{path} is not a point of {m!r} (M.is_point at its default tolerance); start from a point "
                    "of the manifold, e.g. M.random(...) or the Q factor of a QR decomposition"
                )
        groups = self._make_groups(leaves, mans, paths)
        if any(g.section == "rotated" for g in groups) and getattr(self.transform, "reframe", None) is None:
            raise ValueError(
                "section='rotated' re-expresses the transform's state in each new frame, but this transform has no "
                "reframe rule (optax transforms and BFGS have none); use section='householder' or 'transported'"
            )
        device = _backend.device(leaves[0])
        step = xp.zeros((), dtype=_backend.index_dtype(xp), device=device)
        lifted, sections = [], []
        for g, group in enumerate(groups):
            M = group.manifold
            Y = self._pack(group, leaves, xp)
            if group.section == "random":
                lam = M.global_section(Y, strategy="random", seed=np.random.SeedSequence([self.seed, 0, g]))
            else:
                lam = M.global_section(Y, strategy=group.section)
            zero = M.global_rep(lam, xp.zeros_like(Y))
            if group.section == "transported":
                sections.append(lam)
            elif group.section == "rotated":
                sections.append(RotatedFrame(lam, zero))
            else:
                sections.append(NoSection())
            lifted.append(zero)
        inner = self.transform.init(tuple(lifted))
        self._layout = Layout(treedef, tuple(paths), tuple(tuple(x.shape) for x in leaves), groups)
        return RiemannianState(step, xp.zeros_like(step), inner, tuple(sections))

    # -- update ------------------------------------------------------------------------------------------

    def _check_update_inputs(self, params: Any, grads: Any, state: Any) -> tuple[list, list, Any]:
        self.layout  # noqa: B018  (raises before the first init)
        if not isinstance(state, RiemannianState):
            raise TypeError(f"state must be the RiemannianState returned by init, got {type(state).__name__}")
        return self._check_params_and_grads(params, grads, len(state.sections))

    def _check_params_and_grads(self, params: Any, grads: Any, n_groups: int) -> tuple[list, list, Any]:
        """Tree structure, shapes, dtypes and devices of params and grads against the recorded layout."""
        layout = self.layout
        leaves, treedef, _ = self._flatten_params(params)
        # torch.compile's optree polyfill cannot compare tree specs; its guards re-trace on a new structure
        if not _backend.is_compiling() and treedef != layout.treedef:
            raise ValueError(
                f"params has tree structure {treedef}, but this optimizer was initialised for {layout.treedef}; "
                "call opt.init(params, manifolds) for a new tree"
            )
        gleaves, gdef = optree.tree_flatten(grads)
        if not _backend.is_compiling() and gdef != treedef:
            raise ValueError(f"grads must have the tree structure of params {treedef}, got {gdef}")
        xp = array_namespace(*leaves, *gleaves)
        for p, g, path, shape in zip(leaves, gleaves, layout.paths, layout.shapes, strict=True):
            if tuple(p.shape) != shape:
                raise ValueError(f"{path} has shape {tuple(p.shape)}, but the optimizer was initialised with {shape}")
            if tuple(g.shape) != tuple(p.shape):
                raise ValueError(f"grad of {path} has shape {tuple(g.shape)}, the parameter {tuple(p.shape)}")
            if g.dtype != p.dtype:
                raise TypeError(
                    f"grad of {path} has dtype {_backend.dtype_name(g.dtype)}, the parameter "
                    f"{_backend.dtype_name(p.dtype)}"
                )
            if _backend.device(g) != _backend.device(p):
                raise ValueError(
                    f"grad of {path} is on device {_backend.device(g)}, the parameter on {_backend.device(p)}"
                )
        if n_groups != len(layout.groups):
            raise ValueError(
                f"state has {n_groups} parameter groups, this optimizer's layout {len(layout.groups)}: "
                "the state was built by another optimizer or for other parameters"
            )
        return leaves, gleaves, xp

    def _finite(self, gleaves: list, packed: list, xp: Any) -> Array | bool | None:
        """Whether every gradient is finite: a Python bool when eager (read to the host), a 0-d boolean
        array when traced, None for no check. Checked on the packed groups, so a tree of many leaves
        costs a few reductions (369 ViT leaves: 2), not one per leaf; ``"raise"`` checks per leaf to
        name the culprits (eager only)."""
        if self.on_nonfinite == "ignore":
            return None
        if self.on_nonfinite == "raise":
            flags = [xp.all(xp.isfinite(g)) for g in gleaves]
            bad = [p for f, p in zip(flags, self.layout.paths, strict=True) if not bool(f)]
            if bad:
                raise FloatingPointError(f"non-finite gradient for {', '.join(bad)}; parameters and state unchanged")
            return None
        if _readable(packed[0]):
            return _backend.all_finite_on_host(packed, xp)
        finite = None
        for G in packed:
            flag = _backend.all_finite(G, xp)
            finite = flag if finite is None else xp.logical_and(finite, flag)
        return finite

    def update(self, params: Any, grads: Any, state: RiemannianState) -> tuple[Any, RiemannianState]:
        """One step of Algorithm 1: ``params, state = opt.update(params, grads, state)``.

        Pure: the inputs are not modified. ``grads`` are Euclidean gradients ∇L with the tree
        structure, shapes and dtypes of ``params``.
        """
        leaves, gleaves, xp = self._check_update_inputs(params, grads, state)
        new_leaves, new_state = self._update_leaves(leaves, gleaves, state, xp)
        # the structure of this call's params (= layout.treedef, checked): under torch.compile a spec
        # made inside the traced call can rebuild the tree, one recorded by init cannot
        return optree.tree_unflatten(optree.tree_structure(params), new_leaves), new_state

    def _update_leaves(self, leaves: list, gleaves: list, state: RiemannianState, xp: Any) -> tuple[list, Any]:
        """The step of :meth:`update` on the flattened leaves, already checked against the layout
        (``geoarray.torch``'s optimizers check their parameters themselves, once)."""
        layout = self.layout
        packed_grads = [self._pack(group, gleaves, xp) for group in layout.groups]
        finite = self._finite(gleaves, packed_grads, xp)
        if isinstance(finite, bool):
            # eager: the flag was read to the host (one scalar; a retraction reads one anyway), so a
            # skipped step computes nothing and a finite one needs no masks (about 30 operations)
            if not finite:
                skipped = RiemannianState(state.step, _backend.as_array(state.skipped + 1), state.inner, state.sections)
                self._warn_skipped(skipped)
                return list(leaves), skipped
            finite = None
        if finite is not None:
            # traced (jax.jit, torch.compile): no host reads; the step is computed and masked.
            # Zero the gradients of a skipped step so no NaN reaches LAPACK-backed kernels
            packed_grads = [
                xp.where(finite, G, xp.zeros((), dtype=G.dtype, device=_backend.device(G))) for G in packed_grads
            ]
        step = _backend.as_array(state.step + 1)
        uses_params = getattr(self.transform, "uses_params", True)
        points, lams, lifted, lifted_params = [], [], [], []
        for g, (group, G) in enumerate(zip(layout.groups, packed_grads, strict=True)):
            M = group.manifold
            Y = self._pack(group, leaves, xp)
            lam = self._section(group, Y, g, step, state.sections)
            points.append(Y)
            lams.append(lam)
            lifted.append(M.lift(Y, lam, G))
            if uses_params:
                # the parameter a transform sees on a manifold: the lift of grad ½‖Y‖² (module
                # docstring of add_decayed_weights); on a vector space the parameter itself
                lifted_params.append(Y if isinstance(M, Euclidean) else M.lift(Y, lam, Y))
        transform_params = tuple(lifted_params) if uses_params else None
        inner = state.inner
        if any(group.section == "rotated" for group in layout.groups):
            inner = self.transform.reframe(inner, self._rotation(layout.groups, state.sections, lams))
        velocity, inner = self.transform.update(tuple(lifted), inner, transform_params)
        new_leaves: list = [None] * len(leaves)
        new_sections = []
        keep = lambda new, old: xp.where(finite, new, old)  # noqa: E731
        for group, lam, W, Y in zip(layout.groups, lams, velocity, points, strict=True):
            M = group.manifold
            if group.section == "transported":
                lam_new = M.transport_section(lam, W, self.retraction)
                Y_new = lam_new.Y
            else:
                lam_new = RotatedFrame(lam, W) if group.section == "rotated" else NoSection()
                Y_new = M.apply_retraction(lam, W, self.retraction)
            if finite is not None:
                # per group, before unpacking (and before a half-precision group is cast back): the old
                # leaves come back unchanged, bit for bit
                Y_new = keep(Y_new, Y)
            self._unpack(group, Y_new, layout.shapes, xp, new_leaves)
            new_sections.append(lam_new)
        new_state = RiemannianState(step, state.skipped, inner, tuple(new_sections))
        if finite is not None:
            new_state = RiemannianState(
                keep(step, state.step),
                _backend.as_array(state.skipped + xp.astype(xp.logical_not(finite), state.skipped.dtype)),
                optree.tree_map(keep, new_state.inner, state.inner),
                optree.tree_map(keep, new_state.sections, state.sections),
            )
        return new_leaves, new_state

    def _rotation(self, groups: tuple, carried: tuple, lams: list) -> Any:
        """The ``rotate(tree, degree)`` of the transforms' reframe rules: each ``"rotated"`` group's
        element moves from the frame of the previous step to ``lams[g]`` (module docstring)."""
        xp_sqrt = lambda a: _backend.array_namespace(a).sqrt(a)  # noqa: E731

        def rotate(tree: tuple, degree: int) -> tuple:
            if degree not in (1, 2):
                raise ValueError(f"reframe degree must be 1 (linear) or 2 (second moment), got {degree!r}")
            out = []
            for group, frame, lam, h in zip(groups, carried, lams, tree, strict=True):
                if group.section != "rotated":
                    out.append(h)
                    continue
                move = lambda B: group.manifold.reframe(frame.section, frame.velocity, lam, B, self.retraction)  # noqa: E731,B023
                B = move(h.B) if degree == 1 else move(xp_sqrt(h.B)) ** 2
                out.append(h._replace(B=B))
            return tuple(out)

        return rotate

    def _warn_skipped(self, state: RiemannianState) -> None:
        """Warn at the first skipped eager update (traced updates cannot: ``state.skipped`` counts them)."""
        if self._warned_nonfinite:
            return
        self._warned_nonfinite = True
        skipped = int(state.skipped)
        warnings.warn(
            f"{skipped} of {int(state.step) + skipped} optimizer updates were skipped because a gradient was not "
            "finite; parameters and optimizer state were left unchanged for those steps. state.skipped counts "
            "them; on_nonfinite='raise' stops at the first one, 'ignore' lets NaN through.",
            NonFiniteGradientWarning,
            stacklevel=4,
        )


def riemannian(
    transform: GradientTransformation,
    *,
    section: str | None = None,
    retraction: str | None = None,
    on_nonfinite: str = "skip",
    group_same_shape: bool = True,
    seed: int = 0,
) -> RiemannianOptimizer:
    """Algorithm 1 around ``transform``: ``opt = riemannian(chain(clip_by_global_norm(1.0), scale_by_adam(),
    scale_by_learning_rate(1e-3)))``, then ``opt.init(params, manifolds)`` / ``opt.update(params, grads, state)``.

    See :class:`RiemannianOptimizer` for the options.
    """
    return RiemannianOptimizer(
        transform,
        section=section,
        retraction=retraction,
        on_nonfinite=on_nonfinite,
        group_same_shape=group_same_shape,
        seed=seed,
    )
