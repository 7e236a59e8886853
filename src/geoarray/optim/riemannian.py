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

**Grouping** (``group_same_shape=True``, the default; :mod:`geoarray.optim.layout`): leaves with
the same manifold, shape, dtype and device are stacked along a new leading axis and updated by one
batched call (e.g. the 336 Stiefel(49, 7) projections of the paper's vision transformer), and all
Euclidean leaves of one dtype and device are raveled into one vector, so a step costs a fixed number
of array operations instead of one set per leaf. The user sees their own tree; the transform's
state is stored per group.

**Pieces** (``chunk_bytes``; :data:`DEFAULT_CHUNK_BYTES`): a group larger than the budget is updated
piece by piece where the result is the same — an eager step on a backend with writable arrays (NumPy,
PyTorch, CuPy, array-api-strict; not JAX), whose non-finite flag was read to the host, with an
``elementwise`` transform (geoarray's Adam, momentum, SGD, weight decay and learning rates; not optax's,
BFGS or clipping by a global norm) and no ``"rotated"`` section. Each piece (whole stacked leaves, or rows
of a leaf's leading axis: a view, not a copy) is sectioned, lifted, updated by the transform with its
part of the state and retracted before the next, so the step's temporaries are those of one piece: at
GPT-2 small's Q/K/V (432 × St(768, 64), 21 M parameters) the peak memory growth of a step is 64–71 MiB
over the moments instead of about 1.2 GiB, and ``update(..., donate=True)`` writes the new points and
moments into the donated arrays, as ``torch.optim`` does (``geoarray.torch`` donates), so that a step
keeps one copy of each (benchmarks/transformer_step.py). Every frame is computed by the same batched
kernels either way; the pieces change nothing but the batch sizes. A transform that ``donates``
(:class:`~geoarray.optim.transforms.GradientTransformation`: geoarray's Adam, torch's Adam and the
learning rates) is handed each piece's state and lifted gradient and updates them in place, and a
float32 piece's Björck step writes the new points straight into the parameters (``apply_retraction``'s
``out``): at GPT-2 small's Q/K/V a step then allocates no array of a piece's size for Adam's arithmetic
(a fresh one cost 1–6 ms of page faults here, the pass itself 0.3 ms). A whole-group step given
``donate=True`` hands the transform its state and lifted gradients too, where no leaf is Euclidean (whose
lift is the caller's gradient itself).

**Non-finite gradients** (``on_nonfinite``): ``"skip"`` (default, like torch's GradScaler) leaves
parameters, transform state and sections unchanged for that step and counts it in ``state.skipped``
(traceable). An eager update on the CPU reads the finiteness flag to the host (one scalar, as its
retraction does): a skipped step then computes nothing, a finite one needs no masking, and the first
skipped step of a state's history warns (:class:`NonFiniteGradientWarning`, once: when
``state.skipped`` leaves zero). Where nothing may be read — under ``jax.jit`` or ``torch.compile``,
and eagerly on a GPU (:func:`geoarray.set_host_reads`: a read there is a stream synchronisation) —
the step is computed and the old parameters and state are selected where the flag is false; the flag
then also covers the new points, so a step that the retraction's fixed doubling budget cannot take
is skipped and counted the same way (without a warning, which would need a read). A transform whose
velocity is bounded whatever its gradients (its ``bound``: Adam at a constant or param-group rate,
:func:`~geoarray.optim.transforms.adam_ratio_bound`) hands that bound to the retraction
(``velocity_bound`` of :meth:`~geoarray.manifolds.Stiefel.apply_retraction`), whose fixed route is
then the cheapest one covering every step Adam can take (on the paper's ViT weights in float32: φ₁'s
degree-5 polynomial, 3 products, where the budget's route takes 12 and ~30 small operations). ``"raise"``
raises ``FloatingPointError`` naming the leaf (reads a flag to the host: eager use only);
``"ignore"`` performs no check (cheapest; NaN propagates, as in plain PyTorch optimizers). The policy
is written once, in ``geoarray.optim.nonfinite``, for every optimizer that has it (ManifoldMuon too).

**Precision.** float16/bfloat16 leaves are stepped in float32 (lift, transform state, retraction)
and cast back to their dtype; the state holds float32 arrays. With Householder sections every
retracted point is λ(Y)·g(W)E applied through an orthogonal Q, so orthogonality errors do not
accumulate: after 1000 float32 Adam steps max|YᵀY − I| stays at a few roundoffs (≈2e-6 on the
336 Stiefel(49, 7) ViT weights), and a half-precision weight stays at the accuracy of its own
rounding (≈3e-3 bfloat16, ≈4e-4 float16).

**Compilation.** ``jax.jit(opt.update)`` and ``torch.compile(opt.update, fullgraph=True)`` trace a
whole step (tested equal to eager); compile after ``init`` (which registers torch's traceable geqrf).

**State.** The optimizer object holds configuration only. ``init(params, manifolds)`` returns a
:class:`RiemannianState` that carries, beside its arrays, the :class:`~geoarray.optim.layout.Layout`
of the tree (paths, groups, manifolds: a static pytree node with no array leaves), so ``update``
needs nothing but its arguments: two identically configured optimizers accept each other's states,
one optimizer serves several parameter trees, ``jax.jit(opt.update)`` closes over nothing mutable,
and optree, ``jax.tree_util`` and ``torch.utils._pytree`` flatten the state into its arrays.

**The walk of a gradient through one step**, one way: ``check_inputs`` (tree, shapes, dtypes,
devices against the state's layout; skipped with ``check=False`` by adapters that validated once)
→ ``pack`` per group → the finiteness flag → per group rgrad, section and lift
(``M.lift``) → ``transform.update`` on the tuple of lifted groups → per group the retraction
(``M.apply_retraction``) → ``unpack`` → the user's tree.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import numpy as np
import optree

from .. import _backend
from .._backend import array_namespace
from .._typing import Array
from ..manifolds.base import RETRACTIONS, SECTIONS, Manifold
from ..manifolds.stiefel import OrthonormalFrames
from . import layout as _layout
from . import nonfinite as _nonfinite
from .layout import Layout
from .nonfinite import NonFiniteGradientWarning, check_policy, chooser, gate, keep_where_finite
from .transforms import GradientTransformation, scale_by_factor

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "NoSection",
    "NonFiniteGradientWarning",
    "RiemannianOptimizer",
    "RiemannianState",
    "RotatedFrame",
    "riemannian",
]


#: bytes of points per piece of an eager step (``chunk_bytes="default"``, read when an optimizer is made):
#: 8 MiB, one piece per layer of GPT-2 small's Q/K/V (a stack of 36 frames of St(768, 64), 7 MiB in
#: float32). Measured there (benchmarks/transformer_step.py, torch, one thread): the step's peak memory
#: growth over the state 64–71 MiB with pieces of 1–8 MiB, 245 MiB with 16 MiB (pieces of two stacked
#: layers, copied), 1.2 GiB whole
DEFAULT_CHUNK_BYTES = 8 * 2**20

#: entries of points per group (2¹⁸: a MiB in float32) from which a whole step hands its transform the state
#: and the lifted gradients to write into (:meth:`RiemannianOptimizer._worth_donating`; pieces always are)
DONATE_ENTRIES = 2**18


class NoSection(NamedTuple):
    """Stands for "no carried section" in the state: an empty node, where None would be a leaf to
    ``torch.utils._pytree``."""


class RotatedFrame(NamedTuple):
    """What the ``"rotated"`` strategy carries to the next step: the section and the velocity of this one."""

    section: Any
    velocity: Any


class RiemannianState(NamedTuple):
    """The optimizer state: arrays, and the static layout of the parameter tree (no array leaves)."""

    step: Array  # steps taken (an integer 0-d array on the parameters' device)
    skipped: Array  # updates skipped because a gradient was not finite
    inner: Any  # the transform's state, over the tuple of lifted parameter groups
    sections: tuple  # per group: the carried section ("transported"), RotatedFrame ("rotated") or NoSection()
    layout: Layout  # paths, shapes and groups of the tree (geoarray.optim.layout)

    def per_group_fields(self) -> Iterator[tuple[str, tuple, tuple[int, ...]]]:
        """``(name, values, groups)`` for every field of the transform's state that holds one value per
        parameter group, as its state declares them (:func:`~geoarray.optim.layout.per_leaf`): what
        :func:`~geoarray.optim.layout.leaf_states` cuts per leaf."""
        groups = tuple(range(len(self.layout.groups)))
        for node in _layout.declared_nodes(self.inner):
            for field, name in _layout.per_leaf_fields(node):
                value = getattr(node, field)
                if isinstance(value, tuple) and len(value) == len(groups):  # () where nothing is stored
                    yield name, value, groups

    def per_group_paths(self) -> Iterator[tuple[tuple, tuple[int, ...]]]:
        """``(path, groups)`` of every node holding one entry per parameter group: the fields the transform's
        state declares (:func:`~geoarray.optim.layout.per_leaf`) and the carried sections, every group's
        (:func:`~geoarray.optim.layout.per_group_nodes`; what ``geoarray.torch.checkpoint`` splits per
        parameter)."""
        groups = tuple(range(len(self.layout.groups)))
        inner = (self._fields.index("inner"),)
        for path, _ in _layout.declared_paths(self.inner, inner):
            yield path, groups
        yield (self._fields.index("sections"),), groups

    def per_unit_paths(self) -> Iterator[tuple[tuple, tuple[int, ...]]]:
        """``(path, groups)`` of the fields declared per unit (:func:`~geoarray.optim.layout.per_unit`:
        BFGS's H), per group where their entries lead with the groups' packed shapes
        (:func:`~geoarray.optim.layout.per_group_nodes`)."""
        groups = tuple(range(len(self.layout.groups)))
        for path in _layout.unit_paths(self.inner, (self._fields.index("inner"),)):
            yield path, groups


def check_chunk_bytes(chunk_bytes: Any, default: int | None = None) -> int | None:
    """An optimizer's ``chunk_bytes`` as it keeps it: ``default`` (:data:`DEFAULT_CHUNK_BYTES`, read now, where
    None) for ``"default"``, a positive int or None as given; a ``ValueError`` naming the choices otherwise."""
    if isinstance(chunk_bytes, str) and chunk_bytes == "default":
        return DEFAULT_CHUNK_BYTES if default is None else default
    if chunk_bytes is None or (isinstance(chunk_bytes, int) and not isinstance(chunk_bytes, bool) and chunk_bytes >= 1):
        return chunk_bytes
    raise ValueError(
        f"chunk_bytes must be a positive int (bytes of points per piece of a step), 'default' or None "
        f"(whole groups), got {chunk_bytes!r}"
    )


class RiemannianOptimizer:
    """Algorithm 1 around a vector-space transform (see the module docstring).

    Parameters
    ----------
    transform : GradientTransformation
        Any ``(init, update)`` pair over pytrees — :mod:`geoarray.optim.transforms` or optax. Its
        output is the velocity W, *added* through the retraction (so it should end with a
        learning-rate scale, which multiplies by −η).
    section : {"householder", "rotated", "transported", "random"} or None
        The section strategy for every manifold leaf (None: each manifold's own setting).
    retraction : {"geodesic", "cayley"} or None
        exp(W)E or Cay(W)E (None: each manifold's own ``retraction_method``).
    on_nonfinite : {"skip", "raise", "ignore"}
        What a non-finite gradient does (module docstring).
    group_same_shape : bool
        Update same-shaped leaves of one manifold in one batched call (default True).
    seed : int
        Seeds the ``"random"`` section strategy.
    consistent_frames : bool
        The transform compares g^hor coordinates across steps (BFGS's (s, y) pairs), so a section
        drawn anew at every step (``"random"``) is refused at ``init``, naming the leaf.
    chunk_bytes : int, "default" or None
        An eager step on a backend with writable arrays updates a group of Householder-section points
        larger than this many bytes in pieces of at most this size (whole leaves, or rows of a leaf's
        leading axis), for an elementwise transform (module docstring, *Pieces*); ``"default"``:
        :data:`DEFAULT_CHUNK_BYTES` as it is when the optimizer is made. None: every group in one batched call.
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
        consistent_frames: bool = False,
        chunk_bytes: int | str | None = "default",
    ):
        if not (callable(getattr(transform, "init", None)) and callable(getattr(transform, "update", None))):
            raise TypeError(f"transform must be a gradient transformation (init, update), got {transform!r}")
        if section is not None and section not in SECTIONS:
            raise ValueError(f"section must be one of {SECTIONS} or None, got {section!r}")
        if retraction is not None and retraction not in RETRACTIONS:
            raise ValueError(f"retraction must be one of {RETRACTIONS} or None, got {retraction!r}")
        check_policy(on_nonfinite)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int (it seeds 'random' sections), got {seed!r}")
        if not isinstance(group_same_shape, bool):  # bool("no") is True: a string would group silently
            raise TypeError(f"group_same_shape must be a bool, got {group_same_shape!r}")
        if consistent_frames and section == "random":
            raise ValueError(
                f"{type(self).__name__} needs g^hor coordinates that are consistent between steps, but "
                "section='random' draws a new frame every step; use section='transported'"
            )
        chunk_bytes = check_chunk_bytes(chunk_bytes)
        self.transform = transform
        self.section = section
        self.retraction = retraction
        self.on_nonfinite = on_nonfinite
        self.group_same_shape = bool(group_same_shape)
        self.seed = seed
        self.consistent_frames = bool(consistent_frames)
        self.chunk_bytes = chunk_bytes

    def __repr__(self) -> str:
        opts = [f"section={self.section!r}"] if self.section else []
        opts += [f"retraction={self.retraction!r}"] if self.retraction else []
        opts += [f"on_nonfinite={self.on_nonfinite!r}", f"group_same_shape={self.group_same_shape}"]
        return f"{type(self).__name__}({', '.join(opts)})"

    # -- sections ------------------------------------------------------------------------------------

    def _strategy(self, M: Manifold, path: str) -> str:
        if M.is_vector_space:
            return "householder"  # a translation: every strategy is the same
        strategy = self.section or getattr(M, "section", None) or "householder"
        if strategy not in M.section_strategies:
            raise ValueError(
                f"{path} lives on {M!r}, which has no section strategy {strategy!r} "
                f"(it supports {M.section_strategies}); choose section= accordingly"
            )
        if self.consistent_frames and strategy == "random":
            raise ValueError(
                f"{type(self).__name__} needs g^hor coordinates that are consistent between steps, but {path} on {M!r} "
                "draws a new random section every step; use section='transported'"
            )
        return strategy

    def _section_seed(self, step: Array, g: int) -> np.random.SeedSequence:
        if _backend.is_traced(step):
            raise TypeError(
                "section='random' draws Algorithm 2's Gaussian on the host at every step, which cannot run inside "
                "jax.jit; use section='householder' or 'transported' under jit"
            )
        return np.random.SeedSequence([self.seed, int(step), g])

    def _section(self, group: _layout.Group, Y: Array, g: int, step: Array, sections: tuple) -> Any:
        if group.section == "transported":
            return sections[g]
        if group.section == "random":
            return group.manifold.global_section(Y, strategy="random", seed=self._section_seed(step, g))
        return group.manifold.global_section(Y, strategy="householder")

    # -- init ------------------------------------------------------------------------------------------

    def init(self, params: Any, manifolds: Any = None) -> RiemannianState:
        """The initial state for ``params`` (a tree of arrays) constrained by ``manifolds``.

        ``manifolds`` has the tree structure of ``params`` with a Manifold or None (Euclidean) per
        leaf; ``None`` altogether means every leaf is Euclidean. Points must have the trailing shape
        of their manifold. The state carries the layout of this tree (module docstring).
        """
        leaves, treedef, paths = _layout.flatten_params(params)
        xp = array_namespace(*leaves)
        mans = _layout.flatten_manifolds(manifolds, params, len(leaves))
        for leaf, m, path in zip(leaves, mans, paths, strict=True):
            _backend.check_real_floating(leaf, path, xp)
            shape = m.point_shape
            if shape is not None and tuple(leaf.shape[-len(shape) :]) != tuple(shape):
                raise ValueError(
                    f"{path} has shape {tuple(leaf.shape)}, which does not end in {tuple(shape)} as {m!r} needs"
                )
        _layout.check_points(leaves, mans, paths)  # one host read per leaf, at init only, never traced
        strategies = [self._strategy(m, p) for m, p in zip(mans, paths, strict=True)]
        layout = _layout.make_layout(
            leaves, treedef, paths, mans, strategies=strategies, group_same_shape=self.group_same_shape
        )
        if any(g.section == "rotated" for g in layout.groups) and getattr(self.transform, "reframe", None) is None:
            raise ValueError(
                "section='rotated' re-expresses the transform's state in each new frame, but this transform has no "
                "reframe rule (optax transforms and BFGS have none); use section='householder' or 'transported'"
            )
        _backend.ensure_static_nodes()
        device = _backend.device(leaves[0])
        step = xp.zeros((), dtype=_backend.index_dtype(xp), device=device)
        lifted: list[Any] = []
        sections: list[Any] = []
        for g, group in enumerate(layout.groups):
            M = group.manifold
            zero = self._zero_lift(group, leaves, xp)
            if zero is not None:  # no section or packed copy needed: the moments start at zero
                lifted.append(zero)
                sections.append(NoSection())
                continue
            Y = _layout.pack(group, leaves, xp)
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
        return RiemannianState(step, xp.zeros_like(step), inner, tuple(sections), layout)

    @staticmethod
    def _zero_lift(group: _layout.Group, leaves: list, xp: Any) -> Any:
        """The zero of g^hor in the group's packed shape, from one frame's lift, or None (then ``init`` lifts
        the packed zero): a ``"householder"`` group needs no section of its own at ``init``, and at GPT-2
        size the section and the packed copy of every frame would be the largest memory of the whole run
        (two arrays of the weights' size beside the moments)."""
        M, first = group.manifold, leaves[group.indices[0]]
        k = len(M.point_shape or ())
        if M.is_vector_space or group.section != "householder" or not k or group.packing == _layout.RAVELED:
            return None
        batch = tuple(first.shape[: first.ndim - k])
        if math.prod(batch) == 0:
            return None
        frame = first[(0,) * len(batch) + (Ellipsis,)]
        if group.upcast:
            frame = xp.astype(frame, xp.float32)
        one = M.global_rep(M.global_section(frame, strategy="householder"), xp.zeros_like(frame))
        packed = (len(group.indices), *batch) if group.packing == _layout.STACKED else batch
        # the moments in the layout the step's lifts come in, so that the transform's passes read both alike:
        # the packed section's lifts are LAPACK's, column-major (the ViT set's 336 × St(49, 7): mixed layouts
        # made every pass over B slower, and the velocity's products took torch's slow transposed bmm)
        shape = (*packed, *frame.shape)
        lapack = _backend.householder_section_form(shape, xp, _backend.device(first)) == "packed"

        def zeros(a: Any) -> Any:
            where = _backend.device(a)
            if lapack and a.ndim == 2:
                return xp.matrix_transpose(xp.zeros((*packed, *a.shape[::-1]), dtype=a.dtype, device=where))
            return xp.zeros((*packed, *a.shape), dtype=a.dtype, device=where)

        return optree.tree_map(zeros, one)

    #: ``update`` takes an outside skip flag (``skip=``: a GradScaler's ``found_inf``)
    takes_skip_flag = True

    @property
    def takes_rate_factor(self) -> bool:
        """Whether :meth:`scaled_by` can scale this optimizer's steps: its ``update`` is Algorithm 1's, which runs
        ``self.transform`` (a subclass with its own ``update`` may not)."""
        return type(self).update is RiemannianOptimizer.update

    def scaled_by(self, factor: Callable[[], Any]) -> RiemannianOptimizer:
        """A copy of this optimizer whose velocity W is multiplied by ``factor()`` at every step
        (:func:`~geoarray.optim.transforms.scale_by_factor` around its transform), with the same state: a learning
        rate that changes between steps, relative to the one it was built with (``geoarray.torch`` scales by the
        param group's ``lr`` so). ``TypeError`` where :attr:`takes_rate_factor` is False."""
        if not self.takes_rate_factor:
            raise TypeError(
                f"{type(self).__name__} has its own update, which need not run its transform: it cannot be scaled by "
                "a rate factor; build it with the rate (or a schedule) instead"
            )
        out = copy.copy(self)
        out.transform = scale_by_factor(self.transform, factor)
        return out

    # -- update ------------------------------------------------------------------------------------------

    def update(
        self,
        params: Any,
        grads: Any,
        state: RiemannianState,
        *,
        check: bool = True,
        donate: bool = False,
        skip: Any = None,
    ) -> tuple[Any, RiemannianState]:
        """One step of Algorithm 1: ``params, state = opt.update(params, grads, state)``.

        Pure unless ``donate``: the inputs are not modified. ``grads`` are Euclidean gradients ∇L with the
        tree structure, shapes and dtypes of ``params``. ``check=False`` skips the comparison of params
        and grads with the state's layout (tree structure, shapes, dtypes, devices) for callers that
        checked them already (``geoarray.torch``'s optimizers do, once per step for all groups).

        ``donate=True`` hands over the buffers of ``params`` and ``state``, as ``jax.jit``'s
        ``donate_argnums`` does: a step taken in pieces (``chunk_bytes``) on a backend with writable arrays
        writes its new points and moments into them, in place like ``torch.optim``, instead of keeping a
        second copy of both (the caller must use only the returned values afterwards; the returned leaves
        of those groups are the donated arrays themselves). Elsewhere it changes nothing.

        ``skip``: true (a bool, or a 0-d boolean array on the device) for a step skipped for a reason
        outside the optimizer — a ``GradScaler``'s ``found_inf`` (``geoarray.torch`` hands it over):
        parameters and state come back unchanged, bit for bit, and ``state.skipped`` does not count it
        (:func:`geoarray.optim.nonfinite.gate`). An array is combined with the finiteness flag on the
        device, not read to the host (the step is then taken whole and masked).
        """
        if not isinstance(state, RiemannianState):
            raise TypeError(
                f"state must be the RiemannianState returned by opt.init(params, manifolds), got {type(state).__name__}"
            )
        if not isinstance(donate, bool):  # "no" is truthy: a string would hand the buffers over silently
            raise TypeError(f"donate must be a bool (True hands params' and state's buffers over), got {donate!r}")
        skip = _nonfinite.check_skip(skip)
        layout = state.layout
        leaves, gleaves, xp = _layout.inputs(layout, params, grads, check=check)
        new_leaves, new_state = self._step(layout, leaves, gleaves, state, xp, donate=donate, skip=skip)
        new_leaves = _backend.in_layouts_of(new_leaves, leaves)  # a compiled step: one graph for every call
        # the structure of this call's params (= layout.treedef, checked): under torch.compile a spec
        # made inside the traced call can rebuild the tree, one carried by the state cannot
        return _backend.like_tree(params, new_leaves), new_state

    def _step(
        self,
        layout: Layout,
        leaves: list,
        gleaves: list,
        state: RiemannianState,
        xp: Any,
        *,
        donate: bool = False,
        skip: Any = None,
    ) -> tuple[list, Any]:
        """The step of :meth:`update` on the flattened leaves, already checked against the layout."""
        if len(state.sections) != len(layout.groups):
            raise ValueError(
                f"state has {len(state.sections)} parameter groups but its layout {len(layout.groups)}: "
                "the state was assembled from parts of different optimizer states"
            )
        # an outside skip flag on the device masks the step: it is taken whole
        pieces = None if skip is not None and not isinstance(skip, bool) else self._pieces(layout, leaves, state, xp)
        if pieces is None:
            packed_grads: list = [_layout.pack(group, gleaves, xp) for group in layout.groups]
            checked = packed_grads
        else:  # a group cut into pieces is never packed whole: its gradients are checked leaf by leaf
            packed_grads = [
                _layout.pack(g, gleaves, xp) if p == [None] else None
                for g, p in zip(layout.groups, pieces, strict=True)
            ]
            checked = [G for G in packed_grads if G is not None]
            checked += [
                gleaves[i] for g, p in zip(layout.groups, pieces, strict=True) if p != [None] for i in g.indices
            ]
        # eager with host reads, the flag is read (one scalar; a retraction reads one anyway): a skipped
        # step computes nothing and a finite one needs no masks (about 30 operations); otherwise the
        # step is computed and masked (geoarray.optim.nonfinite)
        finite, checked, skipped = gate(self.on_nonfinite, layout, gleaves, checked, state, xp, depth=2, skip=skip)
        if skipped is not None:
            return list(leaves), skipped
        if pieces is not None:  # _pieces cuts only where the flag is read to the host: finite is None
            return self._step_in_pieces(layout, leaves, gleaves, packed_grads, pieces, state, xp, donate)
        packed_grads = checked
        step = _backend.as_array(state.step + 1)
        uses_params = getattr(self.transform, "uses_params", True)
        points, lams, lifted, lifted_params = [], [], [], []
        latest = None  # the last section computed, which the next one is ordered after
        for g, (group, G) in enumerate(zip(layout.groups, packed_grads, strict=True)):
            Y = _layout.pack(group, leaves, xp)
            # under jax.jit one group's section (a batched geqrf) after the last one's: two at once can
            # hang jaxlib's CPU LAPACK kernels (_backend.ordered_after)
            lam = self._section(group, _backend.ordered_after(Y, latest), g, step, state.sections)
            latest = _backend.ordering_token(lam, latest, xp)
            points.append(Y)
            lams.append(lam)
            lifted.append(group.manifold.lift(Y, lam, G))
            if uses_params:
                lifted_params.append(self._lifted_param(group, Y, lam))
        transform_params = tuple(lifted_params) if uses_params else None
        inner = state.inner
        if any(group.section == "rotated" for group in layout.groups):
            # init refuses a "rotated" section for a transform without a reframe rule
            reframe = cast("Callable[[Any, Callable[[Any, int], Any]], Any]", self.transform.reframe)
            inner = reframe(inner, self._rotation(layout.groups, state.sections, lams))
        # handed over (donate, with the flag read: no selection between old and new state follows): the
        # state, and the lifted gradients, which the lifts made (a vector space's is the gradient itself)
        if (
            donate
            and finite is None
            and _backend.writable(xp)
            and getattr(self.transform, "donates", False)
            and not any(group.manifold.is_vector_space for group in layout.groups)
            and self._worth_donating(layout)
        ):
            velocity, inner = self.transform.update(tuple(lifted), inner, transform_params, donate=True)
        else:
            velocity, inner = self.transform.update(tuple(lifted), inner, transform_params)
        bound = self._velocity_bound(layout)
        new_points: list = []
        new_sections: list = []
        for group, lam, W in zip(layout.groups, lams, velocity, strict=True):
            # (as the sections above; the first after the last section: the transform works leaf by leaf)
            W = _backend.ordered_after(W, new_points[-1] if new_points else latest)
            Y_new, lam_new = self._retract(group, lam, W, bound)
            new_points.append(Y_new)
            new_sections.append(lam_new)
        if finite is not None and self.on_nonfinite == "skip" and not _backend.is_traced(finite):
            # eager without host reads: a step whose new point is not finite (one beyond the
            # retraction's fixed doubling budget) is skipped like a non-finite gradient. Traced
            # steps choose their doublings on the device (up to max_doublings) and need no check
            for Y_new in new_points:
                finite = xp.logical_and(finite, _backend.all_finite(Y_new, xp))
        new_leaves: list = [None] * len(leaves)
        keep = chooser(finite, xp)
        for group, Y_new, Y in zip(layout.groups, new_points, points, strict=True):
            # per group, before unpacking (and before a half-precision group is cast back): the old
            # leaves come back unchanged, bit for bit, where the step is skipped on the device
            _layout.unpack(group, keep(Y_new, Y), layout.shapes, xp, new_leaves)
        new_state = RiemannianState(step, state.skipped, inner, tuple(new_sections), layout)
        return new_leaves, keep_where_finite(finite, new_state, state, xp, skip=skip)

    @staticmethod
    def _worth_donating(layout: Layout) -> bool:
        """Whether a whole step's transform is handed its state and lifted gradients: where a group holds at
        least :data:`DONATE_ENTRIES` entries of points. Writing in place saves an allocation per array; on
        small arrays the writes into the lifted gradient's strided rows cost more than that (torch, one
        thread, against the pure step: the ViT set, 336 × St(49, 7), 1.06–1.09×; St(4096, 128) 0.83×)."""
        return any(sum(math.prod(layout.shapes[i]) for i in group.indices) >= DONATE_ENTRIES for group in layout.groups)

    @staticmethod
    def _lifted_param(group: _layout.Group, Y: Array, lam: Any) -> Any:
        """The parameter a transform sees: on a manifold the lift of grad ½‖Y‖² (module docstring of
        add_decayed_weights), on a vector space the parameter itself."""
        return Y if group.manifold.is_vector_space else group.manifold.lift(Y, lam, Y)

    def _retract(
        self, group: _layout.Group, lam: Any, W: Any, bound: float | None, out: Array | None = None
    ) -> tuple[Array, Any]:
        """(the new point λ·g(W)·E, the section carried to the next step) for one group or piece; ``out``:
        where a piece's new point goes (a Householder section's group only, see :meth:`_piece_target`)."""
        M = group.manifold
        if group.section == "transported":
            lam_new = M.transport_section(lam, W, self.retraction)
            return lam_new.Y, lam_new
        carried = RotatedFrame(lam, W) if group.section == "rotated" else NoSection()
        if isinstance(M, OrthonormalFrames) and (bound is not None or out is not None):
            return M.apply_retraction(lam, W, self.retraction, velocity_bound=bound, out=out), carried
        return M.apply_retraction(lam, W, self.retraction), carried

    # -- a step in pieces ------------------------------------------------------------------------------

    def _pieces(self, layout: Layout, leaves: list, state: RiemannianState, xp: Any) -> list | None:
        """Per group, the pieces an eager step takes one after the other (``chunk_bytes``): ``[None]`` for
        the whole group, else indices into the group's packed arrays (``(slice,)`` along the packed leading
        axis, or ``(k, slice)``: rows of the k-th stacked leaf). None, the whole step at once, unless a group
        exceeds the budget and the step may be cut: eager, writable arrays, the non-finite flag read to the
        host (a masked step selects between whole states), an elementwise transform whose per-group state
        is declared (:func:`~geoarray.optim.layout.per_leaf`), and no ``"rotated"`` section (its reframe
        rule re-expresses the whole state)."""
        if self.chunk_bytes is None or not getattr(self.transform, "elementwise", False):
            return None
        if not _backend.writable(xp) or _backend.is_traced(leaves[0]):
            return None
        # every point fits in the budget even at 8 bytes an entry: nothing to cut (the common case, and
        # the cheapest test; after the trace check, so that no traced step reads its shapes here)
        if sum(math.prod(x.shape) for x in leaves) * 8 <= self.chunk_bytes:
            return None
        if self.on_nonfinite == "skip" and not _nonfinite._readable(leaves[0]):
            return None
        if any(group.section == "rotated" for group in layout.groups):
            return None
        n, fits = len(layout.groups), []
        _layout.map_per_group(lambda v: fits.append(isinstance(v, tuple) and len(v) in (0, n)), state.inner)
        if not all(fits):
            return None
        pieces = [self._group_pieces(group, layout.shapes, leaves) for group in layout.groups]
        return pieces if any(p != [None] for p in pieces) else None

    def _group_pieces(self, group: _layout.Group, shapes: tuple, leaves: list) -> list:
        """The pieces of one group (see :meth:`_pieces` and :func:`geoarray.optim.layout.frame_pieces`): a
        Householder section's frames only."""
        assert self.chunk_bytes is not None
        if not isinstance(group.manifold, OrthonormalFrames) or group.upcast or group.section != "householder":
            return [None]
        return _layout.frame_pieces(group, shapes, leaves, self.chunk_bytes)

    @staticmethod
    def _piece_target(group: _layout.Group, index: tuple, outs: list) -> Array | None:
        """The view of the output leaves that a piece's new points fill, where it is one (rows of one leaf),
        for the retraction to write into; None for a piece of several stacked leaves."""
        if len(index) == 2:
            k, rows = index
            return outs[group.indices[k]][rows, ...]
        if group.packing == _layout.STACKED:
            return None
        return outs[group.indices[0]][index[0], ...]

    def _step_in_pieces(
        self,
        layout: Layout,
        leaves: list,
        gleaves: list,
        packed_grads: list,
        pieces: list,
        state: RiemannianState,
        xp: Any,
        donate: bool,
    ) -> tuple[list, RiemannianState]:
        """The finite step of :meth:`_step`, one piece at a time (module docstring, *Pieces*): the transform
        updates a 1-tuple holding the piece's lifted gradient, with the state's per-group fields cut to the
        piece; the new values are written into the group's arrays (the donated ones, or copies)."""
        step = _backend.as_array(state.step + 1)
        uses_params = getattr(self.transform, "uses_params", True)
        donates = bool(getattr(self.transform, "donates", False))
        bound = self._velocity_bound(layout)
        cut = {g for g, p in enumerate(pieces) if p != [None]}

        def copy(value: Any) -> Any:
            return value if donate else optree.tree_map(lambda a: xp.asarray(a, copy=True), value)

        # per declared field, a list of one value per group: the cut groups' arrays (written piece by
        # piece), the others' filled in by their single update
        gathered = _layout.map_per_group(
            lambda v: [copy(v[g]) if g in cut else None for g in range(len(v))], state.inner
        )
        outs = list(leaves)
        if not donate:
            for g in cut:
                for i in layout.groups[g].indices:
                    outs[i] = xp.empty_like(leaves[i])
        new_leaves: list = [None] * len(leaves)
        sections = list(state.sections)
        last = state.inner
        for g, group in enumerate(layout.groups):
            M = group.manifold
            for index in pieces[g]:
                Y = _layout.piece_of(group, index, leaves, xp)
                G = packed_grads[g] if index is None else _layout.piece_of(group, index, gleaves, xp)
                lam = self._section(group, Y, g, step, state.sections)
                params = (self._lifted_param(group, Y, lam),) if uses_params else None
                # a piece's state is cut from the group's copies (or from the donated state): the transform
                # may write into it, and into the lifted gradient, which the lift made (not a vector space's)
                inner = _layout.map_per_group(
                    lambda v, mine: v if not v else (v[g] if index is None else _cut(mine[g], index),),  # noqa: B023
                    state.inner,
                    gathered,
                )
                handed = donates and (index is not None or (donate and not M.is_vector_space))
                lifted = (M.lift(Y, lam, G),)
                if handed:
                    (W,), last = self.transform.update(lifted, inner, params, donate=True)
                else:
                    (W,), last = self.transform.update(lifted, inner, params)
                _layout.map_per_group(lambda new, into, old: _put(new, into, g, index, old), last, gathered, inner)  # noqa: B023
                target = None if index is None else self._piece_target(group, index, outs)
                Y_new, sections[g] = self._retract(group, lam, W, bound, target)
                if index is None:
                    _layout.unpack(group, Y_new, layout.shapes, xp, new_leaves)
                elif target is None:
                    _layout.write_piece(group, index, Y_new, outs)
        for g in cut:
            for i in layout.groups[g].indices:
                new_leaves[i] = outs[i]
        # the fields that are not per group (a step count) are the same after every piece: the last one's
        inner = _layout.map_per_group(lambda new, into: tuple(into) if new else new, last, gathered)
        return new_leaves, RiemannianState(step, state.skipped, inner, tuple(sections), layout)

    def _velocity_bound(self, layout: Layout) -> float | None:
        """b ≥ the magnitude of every entry of this step's velocity, from the transform's ``bound`` rule (a
        Python float, read from its configuration and rate, not from arrays), or None. Adam's bound holds
        for moments that average one sequence of gradients each; a ``"rotated"`` section re-expresses them
        in a new frame at every step, which breaks that, so a state with such a group gets none."""
        rule = getattr(self.transform, "bound", None)
        if rule is None or any(group.section == "rotated" for group in layout.groups):
            return None
        b = rule(None)
        return float(b) if b is not None and 0 < b < float("inf") else None

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


def riemannian(
    transform: GradientTransformation,
    *,
    section: str | None = None,
    retraction: str | None = None,
    on_nonfinite: str = "skip",
    group_same_shape: bool = True,
    seed: int = 0,
    chunk_bytes: int | str | None = "default",
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
        chunk_bytes=chunk_bytes,
    )


def _cut(value: Any, index: tuple) -> Any:
    """One piece of a group's per-group value (a pytree of arrays with the group's leading axes)."""
    key = (*index, Ellipsis)
    return optree.tree_map(lambda a: a[key], value)


def _put(new: tuple, into: list, g: int, index: tuple | None, old: Any = ()) -> None:
    """Put a piece's new per-group value (a 1-tuple; ``()`` where the field stores nothing) into group
    ``g``'s place in ``into``: as it is for a whole group, written into the group's arrays for a piece,
    except where it is the piece ``old`` itself (a donating transform wrote it in place)."""
    if not new:
        return
    if index is None:
        into[g] = new[0]
        return

    key = (*index, Ellipsis)

    def write(target: Array, value: Array, given: Array) -> None:
        if value is not given:
            target[key] = value

    olds = old[0] if old else optree.tree_map(lambda a: None, new[0])
    optree.tree_map(write, into[g], new[0], olds, none_is_leaf=True)
