"""The optimisation methods of the paper: caches in g^hor and the velocity (eqs. 5–8), plus BFGS.

Each method is a pair of small pure functions over the horizontal elements of a parameter group
(arrays for Euclidean weights, :class:`~geoarray.manifolds.StiefelHorizontal` & co. for manifolds):
``init_cache(B)`` and ``step_cache(cache, B, t, lr) -> (cache, W)``. The arithmetic is mapped over
the fields of the horizontal elements with ``optree.tree_map``, so exactly the same code serves
vector spaces and manifolds (the paper's point: "the Adam cache and the Adam operations in equations
(5) and (6) are identical for the vector space and the manifold case").
"""

from __future__ import annotations

import math
from typing import Any

import optree

from .._backend import array_namespace
from .._backend import device as _device
from .optimizer import Optimizer
from .schedules import exponential_decay

__all__ = ["BFGS", "Adam", "AdamWithDecay", "Gradient", "Momentum"]

Array = Any


def _map(fn, *trees):
    return optree.tree_map(fn, *trees)


def _check_unit_interval(value: Any, name: str, *, closed: bool = False) -> float:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (0 <= value <= 1 if closed else 0 <= value < 1)
    )
    if not ok:
        raise ValueError(f"{name} must be a number in [0, 1{']' if closed else ')'}, got {value!r}")
    return float(value)


def _check_positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class Gradient(Optimizer):
    """Gradient descent: empty cache, W = −η B (paper, section 2, item 1)."""

    def __init__(self, lr: Any = 1e-3, **kwargs: Any):
        super().__init__(lr, **kwargs)

    def init_cache(self, B: Any) -> tuple:
        return ()

    def step_cache(self, cache: tuple, B: Any, t: Array, lr: Any) -> tuple[tuple, Any]:
        return (), _map(lambda b: -lr * b, B)


class Momentum(Optimizer):
    """Momentum: B_cache ← α B_cache + B (eq. 8), W = −η B_cache.

    The first step equals a gradient step (the cache starts at zero).
    """

    def __init__(self, lr: Any = 1e-3, alpha: float = 0.5, **kwargs: Any):
        super().__init__(lr, **kwargs)
        self.alpha = _check_unit_interval(alpha, "alpha", closed=True)

    def init_cache(self, B: Any) -> Any:
        return _map(lambda b: array_namespace(b).zeros_like(b), B)

    def step_cache(self, cache: Any, B: Any, t: Array, lr: Any) -> tuple[Any, Any]:
        cache = _map(lambda c, b: self.alpha * c + b, cache, B)
        return cache, _map(lambda c: -lr * c, cache)


class Adam(Optimizer):
    """Adam on g^hor (paper, eqs. 5–6), with the bias correction folded into the cache:

        B₁ ← (β₁ − β₁ᵗ)/(1 − β₁ᵗ) · B₁ + (1 − β₁)/(1 − β₁ᵗ) · B
        B₂ ← (β₂ − β₂ᵗ)/(1 − β₂ᵗ) · B₂ + (1 − β₂)/(1 − β₂ᵗ) · B ⊙ B          (eq. 5)
        W  = −η · B₁ / √(B₂ + δ)                                             (eq. 6)

    with δ inside the square root, exactly as printed. B₁ and B₂ are the bias-corrected moments
    m̂ₜ and v̂ₜ of standard Adam, so for Euclidean weights this is Kingma & Ba's Adam with ε² = δ
    under the root. Defaults are the paper's Table 1.
    """

    def __init__(self, lr: Any = 1e-3, beta1: float = 0.9, beta2: float = 0.99, delta: float = 3e-7, **kwargs: Any):
        super().__init__(lr, **kwargs)
        self.beta1 = _check_unit_interval(beta1, "beta1")
        self.beta2 = _check_unit_interval(beta2, "beta2")
        self.delta = _check_positive(delta, "delta")

    def init_cache(self, B: Any) -> tuple[Any, Any]:
        zeros = _map(lambda b: array_namespace(b).zeros_like(b), B)
        return (zeros, zeros)

    def step_cache(self, cache: tuple[Any, Any], B: Any, t: Array, lr: Any) -> tuple[tuple[Any, Any], Any]:
        b1, b2 = self.beta1, self.beta2
        p1, p2 = b1**t, b2**t
        c1_old, c1_new = (b1 - p1) / (1 - p1), (1 - b1) / (1 - p1)
        c2_old, c2_new = (b2 - p2) / (1 - p2), (1 - b2) / (1 - p2)
        B1 = _map(lambda m, g: c1_old * m + c1_new * g, cache[0], B)
        B2 = _map(lambda v, g: c2_old * v + c2_new * (g * g), cache[1], B)
        W = _map(lambda m, v: -lr * m / array_namespace(v).sqrt(v + self.delta), B1, B2)
        return (B1, B2), W


class AdamWithDecay(Adam):
    """Adam whose learning rate decays geometrically from ``lr_start`` to ``lr_end``.

    Give either ``n_steps`` (the rate changes at every optimizer step) or ``n_epochs`` together
    with ``steps_per_epoch`` (the rate is constant within an epoch):
    η = lr_start·(lr_end/lr_start)^{min(k, n)/n}, k = steps (or whole epochs) already completed;
    after n it stays at ``lr_end``. See :func:`geoarray.optim.schedules.exponential_decay`.
    """

    def __init__(
        self,
        n_steps: int | None = None,
        lr_start: float = 1e-2,
        lr_end: float = 1e-6,
        beta1: float = 0.9,
        beta2: float = 0.99,
        delta: float = 3e-7,
        *,
        n_epochs: int | None = None,
        steps_per_epoch: int | None = None,
        **kwargs: Any,
    ):
        if (n_steps is None) == (n_epochs is None):
            raise ValueError("give exactly one of n_steps (decay per step) or n_epochs (decay per epoch)")
        if n_epochs is not None and steps_per_epoch is None:
            raise ValueError("n_epochs needs steps_per_epoch (how many updates make one epoch)")
        if n_steps is not None and steps_per_epoch is not None:
            raise ValueError("steps_per_epoch goes with n_epochs, not with n_steps")
        schedule = (
            exponential_decay(lr_start, lr_end, n_steps)
            if n_steps is not None
            else exponential_decay(lr_start, lr_end, n_epochs, steps_per_epoch=steps_per_epoch)
        )
        super().__init__(schedule, beta1, beta2, delta, **kwargs)
        self.lr_start, self.lr_end = lr_start, lr_end
        self.n_steps, self.n_epochs, self.steps_per_epoch = n_steps, n_epochs, steps_per_epoch


# ---------------------------------------------------------------------------------------------
# BFGS
# ---------------------------------------------------------------------------------------------


def _metric_weights(B: Any) -> tuple[float, ...]:
    """Per-field weights w with ⟨X, Y⟩ = Σ_fields w Σ x⊙y (the canonical metric of g^hor)."""
    fields = optree.tree_leaves(B)
    weights = getattr(type(B), "metric_weights", None)
    return tuple(weights) if weights is not None else (1.0,) * len(fields)


def _batch_ndim(B: Any) -> int:
    """Leading dims that index separate weights: those of a manifold group; none for Euclidean arrays."""
    return len(B.batch_shape) if hasattr(B, "batch_shape") else 0


def _to_vector(B: Any, xp: Any) -> Array:
    """Coordinates x̃ (..., d) in which the g^hor metric is the Euclidean dot product."""
    k = _batch_ndim(B)
    parts = []
    for leaf, w in zip(optree.tree_leaves(B), _metric_weights(B), strict=True):
        batch = tuple(leaf.shape[:k])
        parts.append(math.sqrt(w) * xp.reshape(leaf, (*batch, -1)))
    return xp.concat(parts, axis=-1)


def _from_vector(x: Array, like: Any, xp: Any) -> Any:
    k = _batch_ndim(like)
    leaves, treedef = optree.tree_flatten(like)
    out, offset = [], 0
    for leaf, w in zip(leaves, _metric_weights(like), strict=True):
        size = math.prod(leaf.shape[k:])
        out.append(xp.reshape(x[..., offset : offset + size], tuple(leaf.shape)) / math.sqrt(w))
        offset += size
    return optree.tree_unflatten(treedef, out)


class BFGS(Optimizer):
    """BFGS on g^hor: a quasi-Newton direction W = −η H B in the coordinates of g^hor.

    The cache holds the previous lifted gradient B_prev, the previous step s = W_prev (the step that
    led to the current point, so (s, y) with y = B − B_prev are correctly paired) and the inverse
    Hessian approximation H in coordinates where the canonical metric of g^hor is Euclidean
    (A-blocks weighted by ½, each independent entry counted once). At step t ≥ 2,

        ρ = 1/⟨s, y⟩,   H ← (I − ρ s yᵀ) H (I − ρ y sᵀ) + ρ s sᵀ

    when the curvature condition ⟨s, y⟩ > ``curvature_eps``·‖s‖‖y‖ holds (otherwise H is kept);
    before the first update H is scaled to ⟨s, y⟩/⟨y, y⟩·I (Nocedal & Wright, eq. 6.20). The first
    step is a gradient step W = −η B.

    Frames: (s, y) compare lifted gradients of consecutive steps, so the g^hor coordinates must
    refer to a frame that moves continuously with the weights. Use ``section="transported"`` on the
    manifolds: the Householder completion is recomputed from Y and flips where a pivot changes sign
    (measured on −tr(YᵀSY), Stiefel(20, 3): transported converges for η from 0.03 to 0.3 on NumPy
    and PyTorch alike, Householder only erratically), and ``"random"`` sections (a new frame each
    step) are refused.

    Memory: H is dense, d×d per weight with d = dim g^hor (N·n for Stiefel(N, n)); use it for small
    weights, Adam for large ones.
    """

    def __init__(self, lr: Any = 1e-2, curvature_eps: float = 1e-10, **kwargs: Any):
        super().__init__(lr, **kwargs)
        self.curvature_eps = _check_positive(curvature_eps, "curvature_eps")

    def init(self, params: Any, manifolds: Any = None):
        state = super().init(params, manifolds)
        for group in state.spec.groups:
            if self._strategy(group.manifold) == "random":
                raise ValueError(
                    f"BFGS needs g^hor coordinates that are consistent between steps, but {group.manifold!r} draws a "
                    "new random section every step; use section='transported'"
                )
        return state

    def init_cache(self, B: Any) -> tuple[Any, Any, Array]:
        xp = array_namespace(*optree.tree_leaves(B))
        x = _to_vector(B, xp)
        d = x.shape[-1]
        eye = xp.eye(d, dtype=x.dtype, device=_device(x))
        H = xp.broadcast_to(eye, (*x.shape[:-1], d, d)) + xp.zeros(
            (*x.shape[:-1], d, d), dtype=x.dtype, device=_device(x)
        )
        zeros = _map(lambda b: xp.zeros_like(b), B)
        return (zeros, zeros, H)

    def step_cache(self, cache: tuple, B: Any, t: Array, lr: Any) -> tuple[tuple, Any]:
        B_prev, S_prev, H = cache
        xp = array_namespace(*optree.tree_leaves(B))
        g = _to_vector(B, xp)
        s = _to_vector(S_prev, xp)
        y = g - _to_vector(B_prev, xp)
        sy = xp.sum(s * y, axis=-1)
        yy = xp.sum(y * y, axis=-1)
        ss = xp.sum(s * s, axis=-1)
        update = xp.logical_and(t > 1, sy > self.curvature_eps * xp.sqrt(ss * yy))
        safe_sy = xp.where(update, sy, xp.ones_like(sy))
        rho = (1 / safe_sy)[..., None, None]
        # first update: H₀ = (sᵀy / yᵀy) I
        first = xp.logical_and(update, t < 2.5)
        scale = xp.where(first, safe_sy / xp.where(first, yy, xp.ones_like(yy)), xp.ones_like(sy))
        H0 = H * scale[..., None, None]
        Hy = (H0 @ y[..., None])[..., 0]
        yHy = xp.sum(y * Hy, axis=-1)[..., None, None]
        s_col, Hy_col = s[..., :, None], Hy[..., :, None]
        # (I − ρsyᵀ)H(I − ρysᵀ) + ρssᵀ, expanded: H − ρ(s(Hy)ᵀ + (Hy)sᵀ) + (ρ²yᵀHy + ρ)ssᵀ
        mT = xp.matrix_transpose
        H_new = H0 - rho * (s_col @ mT(Hy_col) + Hy_col @ mT(s_col)) + (rho * rho * yHy + rho) * (s_col @ mT(s_col))
        H = xp.where(update[..., None, None], H_new, H)
        direction = -lr * (H @ g[..., None])[..., 0]
        W = _from_vector(direction, B, xp)
        return (B, W, H), W
