"""Muon and manifold Muon as optimizers: ``init(params, manifolds)`` / ``update(params, grads, state)``.

* :class:`Muon` — ``torch.optim.Muon``'s algorithm (:func:`geoarray.optim.muon.muon`, same argument
  names and defaults) on Euclidean matrix leaves; manifold leaves and non-matrix leaves are refused
  with a pointer to :class:`ManifoldMuon` and :func:`geoarray.optim.partition`.
* :class:`ManifoldMuon` — spectral-norm steepest descent on the Stiefel and Grassmann manifolds
  (Bernstein, "Modular Manifolds", 2025; Su, "Steepest descent on manifolds"): per constrained leaf

      B ← B + (1 − μ)(G − B),   U = G + μ(B − G) (Nesterov) or B,
      A* = argmax ⟨U, A⟩ s.t. ‖A‖₂ ≤ 1, A tangent at Y     (:meth:`Stiefel.spectral_direction`),
      Y ← polar(Y − η·A*)                                   (or exp/Cayley through g^hor),

  so η is the spectral length of the step; Euclidean matrix leaves take Muon's step with the same
  momentum and η. The Stiefel dual variable P lives in the state and warm-starts the next step, so a
  step costs a few small n×n eigendecompositions and the retraction, O(N·n²).

Leaves of one manifold (or Euclidean), shape, dtype and device are stacked and updated in one batched
call (:mod:`geoarray.optim.layout`, Euclidean matrices stacked by shape rather than raveled: Muon
needs their matrix shape); each manifold group takes :func:`geoarray.optim.muon.manifold_muon_step`.
The state is a NamedTuple of arrays and the static layout of the tree.

**Precision.** float16/bfloat16 manifold leaves are stepped in float32 (momentum, dual, spectral direction
and retraction; the ``eigh`` of the dual ascent has no half-precision kernel) and written back in their own
dtype, as in :class:`geoarray.optim.RiemannianOptimizer`; Euclidean matrix leaves keep Muon's buffer in their
own dtype, and ``ns_dtype`` chooses the precision of its Newton–Schulz iteration, as in ``torch.optim.Muon``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import optree

from .. import _backend
from .._backend import array_namespace
from ..manifolds.spectral import is_number, rate_array
from . import layout as _layout
from .layout import Layout
from .muon import (
    MANIFOLD_MUON_RETRACTIONS,
    NS_COEFFICIENTS,
    dual_shape,
    manifold_muon_step,
    muon,
    supports_manifold_muon,
)
from .nonfinite import check_policy, chooser, gate, keep_where_finite
from .transforms import check_nonnegative, check_unit_interval, count_as_float, zero_count

__all__ = ["ManifoldMuon", "ManifoldMuonState", "Muon", "NoDual"]

from .._typing import Array


class NoDual(NamedTuple):
    """Stands for "no dual variable" (Grassmann and Euclidean groups): an empty pytree node."""


class ManifoldMuonState(NamedTuple):
    """State of :class:`ManifoldMuon`: step count, momentum buffers and warm-started duals per group,
    the Muon state of the Euclidean matrices, and the layout of the tree."""

    step: Array
    skipped: Array  # updates skipped for a non-finite gradient (on_nonfinite="skip")
    buffers: tuple  # per group: the EMA momentum buffer (ambient coordinates, shaped like the group)
    duals: tuple  # per group: the Stiefel dual variable P (..., n, n), or NoDual()
    muon: Any  # the Muon transform's state over the Euclidean matrix groups
    layout: Layout  # paths, shapes and groups of the tree (geoarray.optim.layout)

    def per_group_fields(self) -> Iterator[tuple[str, tuple, tuple[int, ...]]]:
        """``(name, values, groups)``: the manifold groups' momentum buffers, and the fields of the Muon
        state over the Euclidean groups that it declares per group (:func:`~geoarray.optim.layout.per_leaf`); what
        :func:`~geoarray.optim.layout.leaf_states` cuts per leaf."""
        groups = self.layout.groups
        manifold = tuple(g for g, group in enumerate(groups) if not group.manifold.is_vector_space)
        euclid = tuple(g for g, group in enumerate(groups) if group.manifold.is_vector_space)
        yield "momentum_buffer", tuple(self.buffers[g] for g in manifold), manifold
        for node in _layout.declared_nodes(self.muon):
            for field, name in _layout.per_leaf_fields(node):
                value = getattr(node, field)
                if isinstance(value, tuple) and len(value) == len(euclid):
                    yield name, value, euclid

    def per_group_paths(self) -> Iterator[tuple[tuple, tuple[int, ...]]]:
        """``(path, groups)`` of every node holding one entry per group: the momentum buffers and duals of
        every group, and the per-group fields of the Muon state over the Euclidean groups
        (:func:`~geoarray.optim.layout.per_group_nodes`)."""
        groups = self.layout.groups
        every = tuple(range(len(groups)))
        euclid = tuple(g for g, group in enumerate(groups) if group.manifold.is_vector_space)
        yield (self._fields.index("buffers"),), every
        yield (self._fields.index("duals"),), every
        for path, _ in _layout.declared_paths(self.muon, (self._fields.index("muon"),)):
            yield path, euclid


class ManifoldMuon:
    """Manifold Muon on Stiefel and Grassmann leaves, Muon on Euclidean matrix leaves (module docstring).

    Parameters
    ----------
    lr : float or schedule
        η, the spectral length of a step (default 5e-3, the best of the rates measured on the vision
        transformer on digits: 3e-3, 5e-3, 1e-2, 2e-2; see the README's optimizer table), or a schedule of
        t = 1, 2, … (:mod:`geoarray.optim.schedules`, or an optax schedule), evaluated at every step on the
        device: the Stiefel retraction then picks its series degree where the rate lives
        (:func:`geoarray.manifolds.spectral.stiefel_spectral_step`), so a jitted step compiles once.
    momentum, nesterov : float, bool
        torch.optim.Muon's EMA momentum and Nesterov variant (defaults 0.95, True).
    weight_decay : float
        Decoupled weight decay on the Euclidean matrix leaves (on Stiefel and Grassmann ‖Y‖_F is
        constant, so there is nothing to decay).
    retraction : {"polar", "geodesic", "cayley"}
        polar(Y − ηA*) (default), or exp/Cay of the lift of −ηA* to g^hor with a Householder section.
    dual_iterations : int
        Warm-started dual iterations per Stiefel step before the direction is taken (default 1; 0 takes
        it at the warm start). The dual advances once more from the direction's own msign, so a step
        costs ``dual_iterations + 1`` n×n ``eigh``; see :func:`geoarray.optim.muon.manifold_muon_step`
        for the accuracy this buys.
    ns_coefficients, eps, ns_steps, adjust_lr_fn, ns_dtype :
        Muon's Newton–Schulz options for the Euclidean matrix leaves.
    on_nonfinite : {"skip", "raise", "ignore"}
        What a non-finite gradient does, as in :class:`~geoarray.optim.RiemannianOptimizer`: ``"skip"``
        (default) leaves parameters, buffers, duals and the Muon state unchanged and counts the step in
        ``state.skipped`` (warning at the first); ``"raise"`` raises ``FloatingPointError`` naming the
        leaf; ``"ignore"`` lets NaN through, as ``torch.optim.Muon`` does.
    """

    #: which leaves this optimizer takes: Stiefel, Grassmann and Euclidean matrices (Muon: matrices only)
    matrices_only = False

    def __init__(
        self,
        lr: float = 5e-3,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        *,
        retraction: str = "polar",
        dual_iterations: int = 1,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        ns_dtype: Any = None,
        group_same_shape: bool = True,
        on_nonfinite: str = "skip",
    ):
        # lr = 0 is a valid rate (the buffers advance, the weights stay): schedulers such as
        # CosineAnnealingLR reach it
        if not callable(lr):
            check_nonnegative(lr, "lr")
        check_nonnegative(weight_decay, "weight_decay")
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be a bool, got {nesterov!r}")
        if not isinstance(group_same_shape, bool):
            raise TypeError(f"group_same_shape must be a bool, got {group_same_shape!r}")
        self.on_nonfinite = check_policy(on_nonfinite)
        if retraction not in MANIFOLD_MUON_RETRACTIONS:
            raise ValueError(f"retraction must be one of {MANIFOLD_MUON_RETRACTIONS}, got {retraction!r}")
        if isinstance(dual_iterations, bool) or not isinstance(dual_iterations, int) or dual_iterations < 0:
            raise ValueError(f"dual_iterations must be a non-negative int, got {dual_iterations!r}")
        self.lr: Any = lr if callable(lr) else float(lr)
        self.momentum, self.nesterov = check_unit_interval(momentum, "momentum"), bool(nesterov)
        self.weight_decay, self.dual_iterations, self.retraction_name = float(weight_decay), dual_iterations, retraction
        self.group_same_shape = bool(group_same_shape)
        # Muon's step at unit rate, −(O + λθ), scaled by the step's rate in update: a schedule's rate is known
        # only then (the same products as muon(lr): −lr·x = lr·(−x) exactly)
        self.transform = muon(
            1.0, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps, adjust_lr_fn, ns_dtype
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lr={self.lr}, momentum={self.momentum}, retraction={self.retraction_name!r})"

    def _check_leaves(self, leaves: list, mans: list, paths: list[str], xp: Any) -> None:
        for leaf, m, path in zip(leaves, mans, paths, strict=True):
            _backend.check_real_floating(leaf, path, xp)
            if self.matrices_only and not m.is_vector_space:
                raise ValueError(
                    f"{path} lives on {m!r}: Muon updates Euclidean matrices; use ManifoldMuon for manifold leaves"
                )
            if not supports_manifold_muon(m):
                raise ValueError(
                    f"{path} lives on {m!r}: ManifoldMuon supports Stiefel and Grassmann leaves (and Euclidean "
                    "matrices); use geoarray.optim.partition to give it another optimizer"
                )
            if m.is_vector_space and leaf.ndim < 2:
                raise ValueError(
                    f"{path} has shape {tuple(leaf.shape)}; Muon acts on matrices only. Give vectors and scalars "
                    "their own optimizer: geoarray.optim.partition({'muon': ..., 'adam': Adam(...)}, labels)"
                )
            if m.point_shape is not None and tuple(leaf.shape[-2:]) != tuple(m.point_shape):
                raise ValueError(f"{path} has shape {tuple(leaf.shape)}, which does not end in {m.point_shape}")
        _layout.check_points(leaves, mans, paths)

    def init(self, params: Any, manifolds: Any = None) -> ManifoldMuonState:
        """The initial state for ``params`` constrained by ``manifolds`` (a Manifold or None per leaf)."""
        leaves, treedef, paths = _layout.flatten_params(params)
        xp = array_namespace(*leaves)
        mans = _layout.flatten_manifolds(manifolds, params, len(leaves))
        self._check_leaves(leaves, mans, paths, xp)
        layout = _layout.make_layout(
            leaves, treedef, paths, mans, group_same_shape=self.group_same_shape, ravel_euclidean=False,
            upcast_half=False,
        )  # fmt: skip
        _backend.ensure_static_nodes()
        buffers, duals, euclid = [], [], []
        for group in layout.groups:
            Y = _layout.pack(group, leaves, xp)
            buffers.append(xp.zeros_like(Y))
            shape = None if group.manifold.is_vector_space else dual_shape(group.manifold)
            if shape is None:
                duals.append(NoDual())
            else:
                duals.append(xp.zeros((*Y.shape[:-2], *shape), dtype=Y.dtype, device=_backend.device(Y)))
            if group.manifold.is_vector_space:
                euclid.append(Y)
        count = zero_count(leaves)
        return ManifoldMuonState(
            count, xp.zeros_like(count), tuple(buffers), tuple(duals), self.transform.init(tuple(euclid)), layout
        )

    def update(
        self, params: Any, grads: Any, state: ManifoldMuonState, *, check: bool = True, donate: bool = False
    ) -> tuple[Any, ManifoldMuonState]:
        """One step (module docstring); pure, and nothing is computed before the inputs are checked
        (``check=False``: the caller checked params and grads against ``state.layout``). ``donate`` is
        accepted for the protocol of :meth:`~geoarray.optim.RiemannianOptimizer.update` and changes
        nothing here: this step always returns new arrays."""
        if not isinstance(state, ManifoldMuonState):
            raise TypeError(f"state must be the ManifoldMuonState returned by init, got {type(state).__name__}")
        layout = state.layout
        leaves, gleaves, xp = _layout.inputs(layout, params, grads, check=check)
        packed_grads = [_layout.pack(group, gleaves, xp) for group in layout.groups]
        # a non-finite gradient: as RiemannianOptimizer does (geoarray.optim.nonfinite: read to the host
        # where that is free, a skipped step then computes nothing; masked on the device otherwise, with
        # zeros instead of NaN through Newton–Schulz and the retraction)
        finite, packed_grads, skipped = gate(self.on_nonfinite, layout, gleaves, packed_grads, state, xp)
        if skipped is not None:
            return optree.tree_unflatten(optree.tree_structure(params), list(leaves)), skipped
        keep = chooser(finite, xp)  # the new parameters where the flag is true, else the old, bit for bit
        mu = self.momentum
        # the rate of this step: a number, or a schedule's value at t = step + 1 (a 0-d array per group's dtype)
        schedule = self.lr if callable(self.lr) else None
        new_leaves: list = [None] * len(leaves)
        buffers, duals, e_points, e_grads, e_groups = [], [], [], [], []
        for group, G, buf, P in zip(layout.groups, packed_grads, state.buffers, state.duals, strict=True):
            Y = _layout.pack(group, leaves, xp)
            M = group.manifold
            if M.is_vector_space:
                e_points.append(Y)
                e_grads.append(G)
                e_groups.append(group)
                buffers.append(buf)  # Muon keeps its own buffer
                duals.append(P)
                continue
            # B ← B + (1 − μ)(G − B) and U = G + μ(B − G), as torch.optim.Muon writes them
            buf_new = _backend.lerp(buf, G, 1.0 - mu, xp)
            U = _backend.lerp(G, buf_new, mu, xp) if self.nesterov else buf_new
            Y_new, _, P_new = manifold_muon_step(
                M, Y, U, None if isinstance(P, NoDual) else P, lr=self._rate(schedule, state.step, Y, xp),
                n_iter=self.dual_iterations, retraction=self.retraction_name, return_direction=False,
            )  # fmt: skip
            _layout.unpack(group, keep(Y_new, Y), layout.shapes, xp, new_leaves)
            buffers.append(buf_new)
            duals.append(P if P_new is None else P_new)
        updates, muon_state = self.transform.update(tuple(e_grads), state.muon, tuple(e_points))
        for group, Y, W in zip(e_groups, e_points, updates, strict=True):
            W = self._rate(schedule, state.step, Y, xp) * W
            _layout.unpack(group, keep(Y + W, Y), layout.shapes, xp, new_leaves)
        step = _backend.as_array(state.step + 1)
        new_state = ManifoldMuonState(step, state.skipped, tuple(buffers), tuple(duals), muon_state, layout)
        new_state = keep_where_finite(finite, new_state, state, xp)
        # the structure of this call's params (= layout.treedef, checked): under torch.compile a spec made
        # inside the traced call can rebuild the tree, one carried by the state cannot
        return optree.tree_unflatten(optree.tree_structure(params), new_leaves), new_state

    def _rate(self, schedule: Any, step: Array, like: Array, xp: Any) -> Any:
        """This step's rate for a group like ``like``: ``lr``, or the schedule's value at t = step + 1 (a 0-d
        array of ``like``'s dtype, as :mod:`geoarray.optim.schedules` defines t)."""
        if schedule is None:
            return self.lr
        value = schedule(count_as_float(step + 1, like))
        return value if is_number(value) else rate_array(value, like, xp)


class Muon(ManifoldMuon):
    """``torch.optim.Muon``'s algorithm on Euclidean matrix leaves (same argument names and defaults).

    θ ← θ(1 − lr·λ) − lr·r·NS(B̃) with B̃ the (Nesterov) EMA momentum and NS the quintic Newton–Schulz
    iteration (:func:`geoarray.optim.muon.muon`). Vectors and scalars are refused (give them Adam
    through :func:`geoarray.optim.partition`); so are manifold leaves (use :class:`ManifoldMuon`).
    A configuration of :class:`ManifoldMuon` (``matrices_only``), overriding nothing.
    """

    matrices_only = True

    def __init__(
        self,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        *,
        ns_dtype: Any = None,
        group_same_shape: bool = True,
        on_nonfinite: str = "skip",
    ):
        super().__init__(
            lr, momentum, nesterov, weight_decay, ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype, group_same_shape=group_same_shape,
            on_nonfinite=on_nonfinite,
        )  # fmt: skip
