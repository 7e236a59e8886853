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
call, as in :class:`~geoarray.optim.riemannian.RiemannianOptimizer`. The state is a NamedTuple of arrays.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import optree

from .. import _backend, linalg
from .._backend import array_namespace
from ..manifolds.euclidean import Euclidean
from ..manifolds.grassmann import Grassmann
from ..manifolds.spectral import stiefel_spectral_step
from ..manifolds.stiefel import Stiefel
from .muon import NS_COEFFICIENTS, muon
from .riemannian import Group, Layout, NoSection, RiemannianOptimizer, _path
from .transforms import _check_unit_interval, _zero_count

__all__ = ["ManifoldMuon", "ManifoldMuonState", "Muon"]

Array = Any
_RETRACTIONS = ("polar", "geodesic", "cayley")


class ManifoldMuonState(NamedTuple):
    step: Array
    buffers: tuple  # per group: the EMA momentum buffer (ambient coordinates, shaped like the group)
    duals: tuple  # per group: the Stiefel dual variable P (..., n, n), or NoSection()
    muon: Any  # the Muon transform's state over the Euclidean matrix groups


class _MatrixGrouping(RiemannianOptimizer):
    """The tree and grouping machinery of the Riemannian wrapper, with Euclidean leaves stacked by shape
    (Muon needs their matrix shape) instead of raveled."""

    def _groups(self, leaves: list, mans: list, paths: list[str]) -> tuple[Group, ...]:
        buckets: dict[tuple, list[int]] = {}
        for i, (leaf, m) in enumerate(zip(leaves, mans, strict=True)):
            key = (m, tuple(leaf.shape), str(leaf.dtype), str(_backend.device(leaf)))
            buckets.setdefault(key if self.group_same_shape else (i,), []).append(i)
        return tuple(
            Group(mans[idx[0]], tuple(idx), "single" if len(idx) == 1 else "stack", "householder")
            for idx in buckets.values()
        )

    def _check_leaves(self, leaves: list, mans: list, paths: list[str]) -> None:
        for leaf, m, path in zip(leaves, mans, paths, strict=True):
            if isinstance(m, Euclidean) and leaf.ndim < 2:
                raise ValueError(
                    f"{path} has shape {tuple(leaf.shape)}; Muon acts on matrices only. Give vectors and scalars "
                    "their own optimizer: geoarray.optim.partition({'muon': ..., 'adam': Adam(...)}, labels)"
                )

    def _layout_for(self, params: Any, manifolds: Any) -> tuple[list, Any]:
        leaves, treedef, raw = self._flatten_params(params)
        paths = [_path(p) for p in raw]
        xp = array_namespace(*leaves)
        mans = self._flatten_manifolds(manifolds, params, len(leaves))
        for leaf, m, path in zip(leaves, mans, paths, strict=True):
            _backend.check_real_floating(leaf, path, xp)
            if m.point_shape is not None and tuple(leaf.shape[-2:]) != tuple(m.point_shape):
                raise ValueError(f"{path} has shape {tuple(leaf.shape)}, which does not end in {m.point_shape}")
            if not isinstance(m, Euclidean) and not _backend.is_traced(leaf) and not m.is_point(leaf):
                raise ValueError(f"{path} is not a point of {m!r} (M.is_point at its default tolerance)")
        self._check_leaves(leaves, mans, paths)
        groups = self._groups(leaves, mans, paths)
        self._layout = Layout(treedef, tuple(paths), tuple(tuple(x.shape) for x in leaves), groups)
        return leaves, xp


class ManifoldMuon(_MatrixGrouping):
    """Manifold Muon on Stiefel and Grassmann leaves, Muon on Euclidean matrix leaves (module docstring).

    Parameters
    ----------
    lr : float
        η, the spectral length of a step (default 5e-3, the best of the rates measured on the vision
        transformer on digits: 3e-3, 5e-3, 1e-2, 2e-2; see the README's optimizer table).
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
    """

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
    ):
        # lr = 0 is a valid rate (the buffers advance, the weights stay): schedulers such as
        # CosineAnnealingLR reach it
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr >= 0:
            raise ValueError(f"lr must be a non-negative number, got {lr!r}")
        if retraction not in _RETRACTIONS:
            raise ValueError(f"retraction must be one of {_RETRACTIONS}, got {retraction!r}")
        if isinstance(dual_iterations, bool) or not isinstance(dual_iterations, int) or dual_iterations < 0:
            raise ValueError(f"dual_iterations must be a non-negative int, got {dual_iterations!r}")
        self.lr, self.momentum, self.nesterov = float(lr), _check_unit_interval(momentum, "momentum"), bool(nesterov)
        self.weight_decay, self.dual_iterations, self.retraction_name = float(weight_decay), dual_iterations, retraction
        euclidean = muon(
            lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps, adjust_lr_fn, ns_dtype
        )  # fmt: skip
        super().__init__(euclidean, on_nonfinite="ignore", group_same_shape=group_same_shape)

    def _check_leaves(self, leaves: list, mans: list, paths: list[str]) -> None:
        super()._check_leaves(leaves, mans, paths)
        for m, path in zip(mans, paths, strict=True):
            if not isinstance(m, (Euclidean, Stiefel, Grassmann)):
                raise ValueError(
                    f"{path} lives on {m!r}: ManifoldMuon supports Stiefel and Grassmann leaves (and Euclidean "
                    "matrices); use geoarray.optim.partition to give it another optimizer"
                )

    def init(self, params: Any, manifolds: Any = None) -> ManifoldMuonState:
        leaves, xp = self._layout_for(params, manifolds)
        buffers, duals, euclid = [], [], []
        for group in self.layout.groups:
            Y = self._pack(group, leaves, xp)
            buffers.append(xp.zeros_like(Y))
            if isinstance(group.manifold, Stiefel):
                n = group.manifold.n
                duals.append(xp.zeros((*Y.shape[:-2], n, n), dtype=Y.dtype, device=_backend.device(Y)))
            else:
                duals.append(NoSection())
            if isinstance(group.manifold, Euclidean):
                euclid.append(Y)
        return ManifoldMuonState(_zero_count(leaves), tuple(buffers), tuple(duals), self.transform.init(tuple(euclid)))

    def update(self, params: Any, grads: Any, state: ManifoldMuonState) -> tuple[Any, ManifoldMuonState]:
        """One step (module docstring); pure, and nothing is computed before the inputs are checked."""
        if not isinstance(state, ManifoldMuonState):
            raise TypeError(f"state must be the ManifoldMuonState returned by init, got {type(state).__name__}")
        leaves, gleaves, xp = self._check_params_and_grads(params, grads, len(state.duals))
        layout = self.layout
        mu = self.momentum
        new_leaves: list = [None] * len(leaves)
        buffers, duals, e_points, e_grads, e_groups = [], [], [], [], []
        for group, buf, P in zip(layout.groups, state.buffers, state.duals, strict=True):
            Y, G = self._pack(group, leaves, xp), self._pack(group, gleaves, xp)
            M = group.manifold
            if isinstance(M, Euclidean):
                e_points.append(Y)
                e_grads.append(G)
                e_groups.append(group)
                buffers.append(buf)  # Muon keeps its own buffer
                duals.append(P)
                continue
            # B ← B + (1 − μ)(G − B) and U = G + μ(B − G), as torch.optim.Muon writes them
            buf = _backend.lerp(buf, G, 1.0 - mu, xp)
            U = _backend.lerp(G, buf, mu, xp) if self.nesterov else buf
            if isinstance(M, Stiefel) and self.retraction_name == "polar":
                # direction and polar retraction in the compressed n×n coordinates: equal to
                # polar(Y − lr·A*) (tests/test_manifold_muon.py), six O(N·n²) products instead of seven
                Y_new, P = stiefel_spectral_step(Y, U, lr=self.lr, P0=P, n_iter=self.dual_iterations)
                self._unpack(group, Y_new, layout.shapes, xp, new_leaves)
                buffers.append(buf)
                duals.append(P)
                continue
            if isinstance(M, Stiefel):
                A, P = M.spectral_direction(Y, U, P0=P, n_iter=self.dual_iterations)
            else:
                A = M.spectral_direction(Y, U)
            if self.retraction_name == "polar":
                Y_new = linalg.polar(Y - self.lr * A, method="eigh")
            else:
                lam = M.global_section(Y, strategy="householder")
                Y_new = M.apply_retraction(lam, M.global_rep(lam, -self.lr * A), self.retraction_name)
            self._unpack(group, Y_new, layout.shapes, xp, new_leaves)
            buffers.append(buf)
            duals.append(P)
        updates, muon_state = self.transform.update(tuple(e_grads), state.muon, tuple(e_points))
        for group, Y, W in zip(e_groups, e_points, updates, strict=True):
            self._unpack(group, Y + W, layout.shapes, xp, new_leaves)
        new_state = ManifoldMuonState(_backend.as_array(state.step + 1), tuple(buffers), tuple(duals), muon_state)
        return optree.tree_unflatten(layout.treedef, new_leaves), new_state


class Muon(ManifoldMuon):
    """``torch.optim.Muon``'s algorithm on Euclidean matrix leaves (same argument names and defaults).

    θ ← θ(1 − lr·λ) − lr·r·NS(B̃) with B̃ the (Nesterov) EMA momentum and NS the quintic Newton–Schulz
    iteration (:func:`geoarray.optim.muon.muon`). Vectors and scalars are refused (give them Adam
    through :func:`geoarray.optim.partition`); so are manifold leaves (use :class:`ManifoldMuon`).
    """

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
    ):
        super().__init__(
            lr, momentum, nesterov, weight_decay, ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype, group_same_shape=group_same_shape,
        )  # fmt: skip

    def _check_leaves(self, leaves: list, mans: list, paths: list[str]) -> None:
        for m, path in zip(mans, paths, strict=True):
            if not isinstance(m, Euclidean):
                raise ValueError(
                    f"{path} lives on {m!r}: Muon updates Euclidean matrices; use ManifoldMuon for manifold leaves"
                )
        super()._check_leaves(leaves, mans, paths)
