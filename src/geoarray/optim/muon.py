"""Muon and manifold Muon: spectral-norm steepest descent for matrix parameters.

Vector-space transforms in the composable ``GradientTransformation`` convention (optax's: a pair
``init(params) -> state`` / ``update(updates, state, params) -> (updates, state)``, the final update
is *added* to the parameters, states are NamedTuples of arrays, configuration is closed over):

``orthogonalize_by_newton_schulz``
    replaces every matrix leaf by Muon's quintic Newton–Schulz approximation of msign(leaf);
``scale_by_muon``
    ``torch.optim.Muon``'s direction: EMA momentum, Nesterov, Newton–Schulz, learning-rate
    adjustment by shape (the update still has to be multiplied by −lr);
``muon``
    the whole ``torch.optim.Muon`` step, decoupled weight decay and −lr included.

``manifold_muon_step`` is the pure step of manifold Muon on the Stiefel and Grassmann manifolds:
the spectral steepest direction A* of the (momentum-averaged) gradient on the tangent space and
the polar retraction of Y − lr·A*.

References: K. Jordan et al., "Muon: an optimizer for hidden layers in neural networks" (2024);
J. Liu et al., "Muon is scalable for LLM training" (2025) for ``adjust_lr_fn="match_rms_adamw"``;
J. Bernstein, "Modular Manifolds" (Thinking Machines Lab, 2025) for the manifold version.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import optree

from .. import _backend, linalg
from .._backend import array_namespace
from ..manifolds.grassmann import Grassmann
from ..manifolds.spectral import is_number
from ..manifolds.stiefel import Stiefel
from . import layout as _layout
from .layout import leaf_path
from .transforms import GradientTransformation, check_nonnegative, check_unit_interval

__all__ = [
    "MANIFOLD_MUON_RETRACTIONS",
    "NS_COEFFICIENTS",
    "GradientTransformation",
    "MuonState",
    "NewtonSchulzState",
    "ScaleByMuonState",
    "dual_shape",
    "manifold_muon_step",
    "muon",
    "orthogonalize_by_newton_schulz",
    "register_manifold_muon",
    "scale_by_muon",
    "supports_manifold_muon",
]

from .._typing import Array

#: the retractions of manifold Muon: polar(Y − lr·A*), or exp/Cayley through g^hor
MANIFOLD_MUON_RETRACTIONS = ("polar", "geodesic", "cayley")

# Keller Jordan's coefficients, also torch.optim.Muon's defaults
#: The quintic Newton–Schulz coefficients (a, b, c) of Muon's orthogonalisation X ← aX + b(XXᵀ)X + c(XXᵀ)²X
#: (Keller Jordan's tuned values, as torch.optim.Muon).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


class NewtonSchulzState(NamedTuple):
    """No state: the orthogonalisation is memoryless."""


@_layout.per_leaf(("mu", "momentum_buffer"))
class ScaleByMuonState(NamedTuple):
    """``mu``: the EMA momentum buffer B_t, a tree like the parameters."""

    mu: Any


class MuonState(NamedTuple):
    """State of :func:`muon`: that of its :func:`scale_by_muon`."""

    inner: ScaleByMuonState


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _flatten(tree: Any) -> tuple[list[tuple], list[Any], Any]:
    paths, leaves, treedef = optree.tree_flatten_with_path(tree)
    return paths, leaves, treedef


def _check_matrix_leaves(tree: Any, who: str) -> None:
    for path, leaf in zip(*_flatten(tree)[:2], strict=True):
        ndim = getattr(leaf, "ndim", None)
        if ndim is None or ndim < 2:
            shape = tuple(getattr(leaf, "shape", ()))
            raise ValueError(
                f"{who}: leaf {leaf_path(path)} has shape {shape}; Muon acts on matrices (..., rows, cols) only. "
                "Give vectors, scalars and other non-matrix leaves their own optimizer with "
                "geoarray.optim.partition({'muon': ..., 'adam': ...}, labels)"
            )


def _ns_dtype(x: Array, xp: Any, ns_dtype: Any) -> Any:
    if ns_dtype is None:
        return x.dtype
    if isinstance(ns_dtype, str):
        # a backend without bfloat16 (NumPy, array-api-strict) keeps the leaf's own dtype
        return getattr(xp, ns_dtype, None) or x.dtype
    return ns_dtype


def _adjust_ratio(shape: tuple, adjust_lr_fn: str | None) -> float:
    rows, cols = shape[-2], shape[-1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1.0, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols))


def _check_common(momentum: float, ns_coefficients: tuple, eps: float, ns_steps: int, adjust_lr_fn: Any) -> None:
    # each check refuses bools, strings and non-finite numbers itself (a comparison would raise Python's
    # "'<=' not supported" TypeError, naming nothing, or let inf through)
    check_unit_interval(momentum, "momentum")
    try:
        coefficients = tuple(ns_coefficients)
    except TypeError:
        coefficients = ()
    if len(coefficients) != 3 or not all(_finite_number(c) for c in coefficients):
        raise ValueError(f"ns_coefficients must be three finite numbers (a, b, c), got {ns_coefficients!r}")
    if not _finite_number(eps) or not eps > 0:
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or not 0 <= ns_steps < 100:
        raise ValueError(f"ns_steps must be an int in [0, 100), got {ns_steps!r}")
    if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
        raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _orthogonalize(g: Array, ns_coefficients: tuple, eps: float, ns_steps: int, ns_dtype: Any) -> Array:
    xp = array_namespace(g=g)
    dt = _ns_dtype(g, xp, ns_dtype)
    out = linalg.newton_schulz(xp.astype(g, dt), steps=ns_steps, coefficients=tuple(ns_coefficients), eps=eps)
    return xp.astype(out, g.dtype)


# --------------------------------------------------------------------------------------------
# transforms
# --------------------------------------------------------------------------------------------


def orthogonalize_by_newton_schulz(
    ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    ns_steps: int = 5,
    ns_dtype: Any = None,
) -> GradientTransformation:
    """Replace every matrix leaf U (..., rows, cols) by ``linalg.newton_schulz(U)`` ≈ msign(U).

    ``ns_dtype`` (``None``: the leaf's dtype; ``"bfloat16"``: bfloat16 where the backend has it, as
    ``torch.optim.Muon`` always does — NumPy and array-api-strict have none and keep the leaf's
    dtype; or a dtype object) is the dtype of the iteration; the result is cast back.
    A leaf with fewer than two dimensions raises ``ValueError`` naming it.
    """
    _check_common(0.0, ns_coefficients, eps, ns_steps, None)

    def init(params: Any) -> NewtonSchulzState:
        _check_matrix_leaves(params, "orthogonalize_by_newton_schulz")
        return NewtonSchulzState()

    def update(updates: Any, state: NewtonSchulzState, params: Any = None) -> tuple[Any, NewtonSchulzState]:
        _check_matrix_leaves(updates, "orthogonalize_by_newton_schulz")
        out = optree.tree_map(lambda g: _orthogonalize(g, ns_coefficients, eps, ns_steps, ns_dtype), updates)
        return out, state

    return GradientTransformation(init, update)


def scale_by_muon(
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    ns_steps: int = 5,
    adjust_lr_fn: str | None = None,
    ns_dtype: Any = None,
) -> GradientTransformation:
    """Muon's direction, exactly as ``torch.optim.Muon`` forms it (without −lr and weight decay).

    Per matrix leaf g (..., rows, cols), with μ = ``momentum`` and B₀ = 0:

        B_t = B_{t−1} + (1 − μ)(g_t − B_{t−1})                (EMA, torch's ``lerp_``)
        B̃_t = g_t + μ(B_t − g_t) if ``nesterov`` else B_t
        O_t = NS(B̃_t) · r(rows, cols)

    NS is :func:`geoarray.linalg.newton_schulz` (Frobenius pre-normalisation, tall matrices
    transposed, ``ns_steps`` quintic steps with ``ns_coefficients``), run in ``ns_dtype``
    (see :func:`orthogonalize_by_newton_schulz`). r is ``adjust_lr_fn``'s ratio:
    ``None``/``"original"``: √max(1, rows/cols) (Jordan); ``"match_rms_adamw"``: 0.2·√max(rows, cols)
    (Liu et al.). Leading dimensions are a batch of independent matrices. Chain with −lr (and
    decoupled weight decay, see :func:`muon`) to obtain the parameter update.
    """
    _check_common(momentum, ns_coefficients, eps, ns_steps, adjust_lr_fn)
    mom = float(momentum)

    def init(params: Any) -> ScaleByMuonState:
        _check_matrix_leaves(params, "scale_by_muon")

        def zeros(p: Array) -> Array:
            return array_namespace(p=p).zeros_like(p)

        return ScaleByMuonState(optree.tree_map(zeros, params))

    def update(updates: Any, state: ScaleByMuonState, params: Any = None) -> tuple[Any, ScaleByMuonState]:
        _check_matrix_leaves(updates, "scale_by_muon")

        def leaf(g: Array, buf: Array) -> tuple[Array, Array]:
            xp = array_namespace(g=g)
            buf = _backend.lerp(buf, g, 1.0 - mom, xp)
            u = _backend.lerp(g, buf, mom, xp) if nesterov else buf
            o = _orthogonalize(u, ns_coefficients, eps, ns_steps, ns_dtype)
            return o * _adjust_ratio(tuple(g.shape), adjust_lr_fn), buf

        pairs = optree.tree_map(leaf, updates, state.mu)
        out = optree.tree_map(lambda _, p: p[0], updates, pairs)
        mu = optree.tree_map(lambda _, p: p[1], updates, pairs)
        return out, ScaleByMuonState(mu)

    return GradientTransformation(init, update)


def muon(
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    ns_steps: int = 5,
    adjust_lr_fn: str | None = None,
    ns_dtype: Any = None,
) -> GradientTransformation:
    """``torch.optim.Muon``'s full step (same argument names and defaults) as one transform.

    The update added to θ is −lr·(λ·θ + O_t) with O_t from :func:`scale_by_muon` (λ = ``weight_decay``):
    torch's θ ← θ(1 − lr·λ) − lr·r·NS(B̃_t), where the decay uses the unadjusted lr. ``params``
    must be passed to ``update`` when ``weight_decay`` ≠ 0. Set ``ns_dtype="bfloat16"`` to
    reproduce torch's bfloat16 iteration.
    """
    check_nonnegative(lr, "lr")
    check_nonnegative(weight_decay, "weight_decay")
    inner = scale_by_muon(momentum, nesterov, ns_coefficients, eps, ns_steps, adjust_lr_fn, ns_dtype)
    lr_, wd = float(lr), float(weight_decay)

    def init(params: Any) -> MuonState:
        return MuonState(inner.init(params))

    def update(updates: Any, state: MuonState, params: Any = None) -> tuple[Any, MuonState]:
        if wd != 0.0 and params is None:
            raise ValueError("muon: update needs params when weight_decay != 0 (decoupled weight decay)")
        out, s = inner.update(updates, state.inner, params)
        if wd != 0.0:
            out = optree.tree_map(lambda o, p: -lr_ * (o + wd * p), out, params)
        else:
            out = optree.tree_map(lambda o: -lr_ * o, out)
        return out, MuonState(s)

    return GradientTransformation(init, update, uses_params=wd != 0.0)


# --------------------------------------------------------------------------------------------
# manifold Muon
# --------------------------------------------------------------------------------------------


def manifold_muon_step(
    manifold: Any,
    Y: Array,
    G: Array,
    P: Array | None,
    *,
    lr: Any,
    n_iter: int = 1,
    retraction: str = "polar",
    return_direction: bool = True,
) -> tuple[Array, Array | None, Array | None]:
    """One manifold-Muon step on a Stiefel or Grassmann point: (Y_new, A*, P_new).

    :class:`~geoarray.optim.ManifoldMuon` calls it once per group of stacked leaves.

    A* = ``manifold.spectral_direction(Y, G)`` is the unit-spectral-norm tangent direction of
    steepest ascent for G (the caller's momentum-averaged Euclidean gradient), and

        Y_new = polar(Y − lr·A*),

    so ``lr`` is the spectral length of the step. The polar retraction stays on the manifold: the
    polar factor of any full-rank N×n matrix has orthonormal columns, and Y − lr·A* is always full
    rank because its Gram matrix is I + lr²A*ᵀA* ⪰ I (the cross terms −lr(YᵀA* + A*ᵀY) vanish for a
    Stiefel tangent and YᵀA* = 0 on Grassmann). Its singular values lie in [1, (1 + lr²)^{1/2}],
    so the fast Gram-matrix route of :func:`geoarray.linalg.polar` (``method="eigh"``) is exact to
    rounding here, and Y_new is orthonormal to rounding whatever the drift of Y on Grassmann. On
    Stiefel (XᵀX)^{-1/2} is a truncated series near I (:func:`geoarray.manifolds.spectral.stiefel_spectral_step`):
    exact to rounding while ‖YᵀY − I‖ ≲ √ε, and a larger drift is gone after two steps.

    Stiefel: the dual variable P (None or (..., n, n)) warm-starts ``n_iter`` dual iterations, the
    direction is evaluated at the last iterate, and the P returned has taken one more gradient step
    (free: it comes from the same msign evaluation), so each step advances the dual ``n_iter + 1``
    times at the cost of ``n_iter + 1`` n×n ``eigh``; see
    :func:`geoarray.manifolds.spectral.stiefel_spectral_direction` for the accuracy from a cold start.
    A* is always feasible (tangent, ‖A*‖₂ ≤ 1). Warm-started, its relative suboptimality
    (⟨G, A_opt⟩ − ⟨G, A*⟩)/⟨G, A_opt⟩ against the optimum A_opt (400 cold-started iterations) was measured
    (``python benchmarks/muon_direction_accuracy.py``; float64, noisy Brockett run with EMA momentum 0.95
    and lr 0.01, median over steps 10–60 of 3 seeds) at

    ===========  =======  =======  =======  =======  =======  =======
    N×n          0 it.    1 it.    2 it.    3 it.    5 it.    10 it.
    ===========  =======  =======  =======  =======  =======  =======
    49×7         2e-7     1e-7     6e-8     4e-8     2e-8     7e-9
    256×32       2e-6     9e-7     5e-7     3e-7     2e-7     7e-8
    ===========  =======  =======  =======  =======  =======  =======

    so the default ``n_iter=1`` gives up about 1e-6 of the attainable ⟨G, A⟩ at a cost of two n×n
    ``eigh`` per step. On the momentum of the digits ViT's Q/K/V weights (St(16, 4), which change faster
    relative to their size) it is rougher: ⟨G, A*⟩ reaches a median 94.6 %, 96.6 % and 97.4 % of the
    optimum after 0, 1 and 2 warm-started iterations (10 % quantile 91.9 %, 93.6 %, 94.4 %; seed 0,
    epochs 1–3); the final training loss over 32 seeds did not get worse with fewer iterations (README).

    Stiefel with the polar retraction runs :func:`geoarray.manifolds.spectral.stiefel_spectral_step`
    (the retraction in the compressed n×n coordinates, equal to polar(Y − lr·A*) to rounding); there
    ``return_direction=False`` saves the two N×n products that assemble A* and returns None for it.
    Grassmann: closed form, P is returned unchanged.

    ``retraction="geodesic"`` or ``"cayley"`` instead lifts −lr·A* to g^hor with a Householder
    section and retracts there (Brantner, eq. 13): λ(Y)·exp(−lr·Ω(A*))E or its Cayley version.
    """
    if is_number(lr) and not lr >= 0:  # an array or a traced rate is the caller's to check
        raise ValueError(f"lr must be non-negative, got {lr!r}")
    if retraction not in MANIFOLD_MUON_RETRACTIONS:
        raise ValueError(f"retraction must be one of {MANIFOLD_MUON_RETRACTIONS}, got {retraction!r}")
    step = _registered(_SPECTRAL_STEPS, manifold)
    if step is None:
        raise TypeError(f"manifold must be a Stiefel or Grassmann manifold, got {type(manifold).__name__}")
    return step(manifold, Y, G, P, lr=lr, n_iter=n_iter, retraction=retraction, return_direction=return_direction)


# the manifold-specific steps of manifold Muon and the shapes of their duals, by manifold class. A plain
# registry looked up along the MRO (not functools.singledispatch, whose dispatch torch.compile cannot trace)
_SPECTRAL_STEPS: dict[type, Callable[..., tuple]] = {}
_DUAL_SHAPES: dict[type, Callable[[Any], tuple[int, ...]]] = {}


def _registered(registry: dict, manifold: Any) -> Any:
    for cls in type(manifold).__mro__:
        if cls in registry:
            return registry[cls]
    return None


def register_manifold_muon(
    cls: type, spectral_step: Callable[..., tuple], dual_shape: Callable[[Any], tuple[int, ...]] | None = None
) -> None:
    """Make :class:`~geoarray.optim.ManifoldMuon` update points of manifold class ``cls`` (and its subclasses).

    ``spectral_step(manifold, Y, G, P, *, lr, n_iter, retraction, return_direction) -> (Y_new, A*, P_new)``
    is the manifold-specific part of :func:`manifold_muon_step` (Stiefel and Grassmann are registered);
    ``dual_shape(manifold)`` the trailing shape of the dual variable that warm-starts its direction, kept
    in the optimizer state per group (None: no dual; ``P`` is then None)."""
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a manifold class, got {cls!r}")
    _SPECTRAL_STEPS[cls] = spectral_step
    if dual_shape is not None:
        _DUAL_SHAPES[cls] = dual_shape


def supports_manifold_muon(manifold: Any) -> bool:
    """Whether :class:`~geoarray.optim.ManifoldMuon` can update points of ``manifold``: a vector space
    (Muon on matrices) or a manifold with a registered step (:func:`register_manifold_muon`)."""
    return manifold.is_vector_space or _registered(_SPECTRAL_STEPS, manifold) is not None


def dual_shape(manifold: Any) -> tuple[int, ...] | None:
    """The trailing shape of the dual variable of ``manifold``'s manifold-Muon direction (the state
    :class:`~geoarray.optim.ManifoldMuon` keeps per group); None where there is none."""
    shape = _registered(_DUAL_SHAPES, manifold)
    return None if shape is None else tuple(shape(manifold))


def _finish(manifold: Any, Y: Array, A: Array, P_new: Any, lr: Any, retraction: str) -> tuple:
    """Y_new by the polar retraction of Y − lr·A*, or through g^hor (exp/Cayley)."""
    if retraction == "polar":
        Y_new = linalg.polar(Y - lr * A, method="eigh")
    else:
        lam = manifold.global_section(Y, strategy="householder")
        Y_new = manifold.apply_retraction(lam, manifold.global_rep(lam, -lr * A), retraction)
    return Y_new, A, P_new


def _stiefel_step(manifold: Stiefel, Y: Array, G: Array, P: Array | None, *, lr: Any, n_iter: int,
                  retraction: str, return_direction: bool) -> tuple:  # fmt: skip
    if retraction == "polar":
        from ..manifolds.spectral import stiefel_spectral_step

        manifold._check_point(Y)
        # the polar retraction in the compressed coordinates (same result, fewer N×n products)
        out = stiefel_spectral_step(Y, G, lr=lr, P0=P, n_iter=n_iter, return_direction=return_direction)
        return out if return_direction else (out[0], None, out[1])
    A, P_new = manifold.spectral_direction(Y, G, P0=P, n_iter=n_iter)
    return _finish(manifold, Y, A, P_new, lr, retraction)


def _grassmann_step(manifold: Grassmann, Y: Array, G: Array, P: Array | None, *, lr: Any, n_iter: int,
                    retraction: str, return_direction: bool) -> tuple:  # fmt: skip
    return _finish(manifold, Y, manifold.spectral_direction(Y, G), P, lr, retraction)


register_manifold_muon(Stiefel, _stiefel_step, dual_shape=lambda m: (m.n, m.n))
register_manifold_muon(Grassmann, _grassmann_step)
