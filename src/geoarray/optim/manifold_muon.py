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
from .._typing import Array
from ..manifolds.spectral import is_number, rate_array
from . import layout as _layout
from . import nonfinite as _nonfinite
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
from .riemannian import check_chunk_bytes
from .transforms import check_nonnegative, check_unit_interval, count_as_float, zero_count

__all__ = ["DEFAULT_CHUNK_BYTES", "ManifoldMuon", "ManifoldMuonState", "Muon", "NoDual"]

#: bytes of points per piece of an eager manifold-Muon step (``chunk_bytes="default"``, read when an optimizer
#: is made): half of Adam's (:data:`geoarray.optim.riemannian.DEFAULT_CHUNK_BYTES`), for a piece's dual ascent
#: and retraction keep more temporaries than Adam's elementwise moments. Measured on GPT-2 small's Q/K/V,
#: 432 × St(768, 64) in float32 (``benchmarks/transformer_step.py --optimizer ManifoldMuon``, torch, one thread,
#: two runs each, alternating): 4 MiB 504–551 ms and a peak growth of 86–90 MiB, 8 MiB 516–533 ms and 140 MiB,
#: ``torch.optim.Muon`` 91–92 MiB; whole groups 725 ms and 870 MiB.
DEFAULT_CHUNK_BYTES = 4 * 2**20


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
    chunk_bytes : int, "default" or None
        The most bytes of points an eager step works on at once (``"default"``: :data:`DEFAULT_CHUNK_BYTES`,
        4 MiB, read when the optimizer is made; None: whole groups), as in
        :class:`~geoarray.optim.RiemannianOptimizer`: on a backend with writable arrays, with
        the non-finite flag read to the host, a Stiefel or Grassmann group (float32 or float64) larger than
        that is stepped in pieces (whole stacked leaves, or rows of a leaf's leading axis), each piece's
        momentum, dual, direction and retraction computed and written before the next, so the temporaries
        of the dual ascent and the retraction live for one piece at a time; ``update(..., donate=True)``
        then writes the new points, buffers and duals into the donated arrays. Every frame's arithmetic is
        the whole step's (the batched kernels on fewer frames). Traced and masked steps take whole groups.
    on_nonfinite : {"skip", "raise", "ignore"}
        What a non-finite gradient does, as in :class:`~geoarray.optim.RiemannianOptimizer`: ``"skip"``
        (default) leaves parameters, buffers, duals and the Muon state unchanged and counts the step in
        ``state.skipped`` (warning at the first); ``"raise"`` raises ``FloatingPointError`` naming the
        leaf; ``"ignore"`` lets NaN through, as ``torch.optim.Muon`` does.
    """

    #: ``update`` takes an outside skip flag (``skip=``: a GradScaler's ``found_inf``)
    takes_skip_flag = True

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
        chunk_bytes: int | str | None = "default",
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
        self.chunk_bytes = check_chunk_bytes(chunk_bytes, DEFAULT_CHUNK_BYTES)
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
            if group.manifold.is_vector_space:
                Y = _layout.pack(group, leaves, xp)
                buffers.append(xp.zeros_like(Y))
                duals.append(NoDual())
                euclid.append(Y)
                continue
            # zeros of the packed shape, without packing the points (a stack of a GPT-2's frames is a copy
            # of all its weights, alive beside the new buffer)
            first = leaves[group.indices[0]]
            prefix, where = _layout.packed_prefix(layout, group), _backend.device(first)
            dtype = xp.float32 if group.upcast else first.dtype  # as _layout.pack gives the group's points
            buffers.append(xp.zeros((*prefix, *first.shape[-2:]), dtype=dtype, device=where))
            shape = dual_shape(group.manifold)
            duals.append(NoDual() if shape is None else xp.zeros((*prefix, *shape), dtype=dtype, device=where))
        count = zero_count(leaves)
        return ManifoldMuonState(
            count, xp.zeros_like(count), tuple(buffers), tuple(duals), self.transform.init(tuple(euclid)), layout
        )

    def update(
        self,
        params: Any,
        grads: Any,
        state: ManifoldMuonState,
        *,
        check: bool = True,
        donate: bool = False,
        skip: Any = None,
    ) -> tuple[Any, ManifoldMuonState]:
        """One step (module docstring); pure, and nothing is computed before the inputs are checked
        (``check=False``: the caller checked params and grads against ``state.layout``). ``donate=True``
        hands over the buffers of ``params`` and ``state``, as in
        :meth:`~geoarray.optim.RiemannianOptimizer.update`: a group stepped in pieces (``chunk_bytes``) writes
        its new points, momentum buffer and dual into them (the caller must use only the returned values
        afterwards); elsewhere it changes nothing and the step returns new arrays. ``skip``: a step skipped
        for a reason outside the optimizer, unchanged and not counted, as in
        :meth:`~geoarray.optim.RiemannianOptimizer.update`."""
        if not isinstance(state, ManifoldMuonState):
            raise TypeError(f"state must be the ManifoldMuonState returned by init, got {type(state).__name__}")
        skip = _nonfinite.check_skip(skip)
        layout = state.layout
        leaves, gleaves, xp = _layout.inputs(layout, params, grads, check=check)
        masked = skip is not None and not isinstance(skip, bool)  # an outside flag on the device: whole groups
        pieces = [[None]] * len(layout.groups) if masked else self._pieces(layout, leaves, xp)
        # a group cut into pieces is never packed whole: its gradients are checked leaf by leaf
        packed_grads = [
            _layout.pack(g, gleaves, xp) if p == [None] else None for g, p in zip(layout.groups, pieces, strict=True)
        ]
        checked = [G for G in packed_grads if G is not None]
        checked += [gleaves[i] for g, p in zip(layout.groups, pieces, strict=True) if p != [None] for i in g.indices]
        # a non-finite gradient: as RiemannianOptimizer does (geoarray.optim.nonfinite: read to the host
        # where that is free, a skipped step then computes nothing; masked on the device otherwise, with
        # zeros instead of NaN through Newton–Schulz and the retraction)
        finite, checked, skipped = gate(self.on_nonfinite, layout, gleaves, checked, state, xp, skip=skip)
        if skipped is not None:
            return optree.tree_unflatten(optree.tree_structure(params), list(leaves)), skipped
        if finite is not None:  # masked (no pieces then): the zeroed gradients
            packed_grads = checked
        keep = chooser(finite, xp)  # the new parameters where the flag is true, else the old, bit for bit
        mu = self.momentum
        # the rate of this step: a number, or a schedule's value at t = step + 1 (a 0-d array per group's dtype)
        schedule = self.lr if callable(self.lr) else None
        new_leaves: list = [None] * len(leaves)
        buffers, duals, e_points, e_grads, e_groups = [], [], [], [], []
        for group, G, buf, P, cuts in zip(layout.groups, packed_grads, state.buffers, state.duals, pieces, strict=True):
            if cuts != [None]:
                rate = self._rate(schedule, state.step, buf, xp)
                buf_new, P_new = self._group_in_pieces(
                    group, cuts, leaves, gleaves, buf, P, rate, new_leaves, donate, xp
                )
                buffers.append(buf_new)
                duals.append(P_new)
                continue
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
        new_state = keep_where_finite(finite, new_state, state, xp, skip=skip)
        new_leaves = _backend.in_layouts_of(new_leaves, leaves)  # a compiled step: one graph for every call
        # the structure of this call's params (= layout.treedef, checked): under torch.compile a spec made
        # inside the traced call can rebuild the tree, one carried by the state cannot
        return optree.tree_unflatten(optree.tree_structure(params), new_leaves), new_state

    def _pieces(self, layout: Layout, leaves: list, xp: Any) -> list:
        """Per group, the pieces an eager step takes one after the other (``chunk_bytes``): ``[None]`` for a
        whole group, else :func:`geoarray.optim.layout.frame_pieces` of a Stiefel or Grassmann group in
        float32 or float64; every group whole unless the step may be cut: eager, writable arrays and the
        non-finite flag read to the host (a masked step selects between whole states)."""
        whole = [[None]] * len(layout.groups)
        if self.chunk_bytes is None or not leaves or not _backend.writable(xp) or _backend.is_traced(leaves[0]):
            return whole
        if self.on_nonfinite == "skip" and not _nonfinite._readable(leaves[0]):
            return whole
        out = []
        for group in layout.groups:
            first = leaves[group.indices[0]]
            if group.manifold.is_vector_space or group.upcast or first.dtype not in (xp.float32, xp.float64):
                out.append([None])
            else:
                out.append(_layout.frame_pieces(group, layout.shapes, leaves, self.chunk_bytes))
        return out

    def _group_in_pieces(
        self, group: Any, cuts: list, leaves: list, gleaves: list, buf: Array, P: Any, rate: Any, new_leaves: list,
        donate: bool, xp: Any,
    ) -> tuple[Array, Any]:  # fmt: skip
        """One manifold group's step, piece by piece (``chunk_bytes``): each piece's momentum, direction,
        retraction and dual computed from the piece's rows and written into the group's new arrays (the
        donated ones, or new) before the next piece; returns the group's new buffer and dual."""
        mu = self.momentum
        dual = not isinstance(P, NoDual)
        buf_out = buf if donate else xp.empty_like(buf)
        P_out = P if donate or not dual else xp.empty_like(P)
        outs = {i: leaves[i] if donate else xp.empty_like(leaves[i]) for i in group.indices}
        targets = [outs.get(i) for i in range(len(leaves))]
        for index in cuts:
            key = (*index, Ellipsis)
            Y = _layout.piece_of(group, index, leaves, xp)
            G = _layout.piece_of(group, index, gleaves, xp)
            b = _backend.lerp(buf[key], G, 1.0 - mu, xp)
            U = _backend.lerp(G, b, mu, xp) if self.nesterov else b
            Y_new, _, P_new = manifold_muon_step(
                group.manifold, Y, U, P[key] if dual else None, lr=rate, n_iter=self.dual_iterations,
                retraction=self.retraction_name, return_direction=False,
            )  # fmt: skip
            buf_out[key] = b
            if dual and P_new is not None:
                P_out[key] = P_new
            elif dual and not donate:
                P_out[key] = P[key]
            _layout.write_piece(group, index, Y_new, targets)
        for i in group.indices:
            new_leaves[i] = outs[i]
        return buf_out, P_out

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
