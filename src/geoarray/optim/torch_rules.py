"""torch.optim's update rules as pure transforms: ``scale_by_torch_adam`` (Adam, AdamW, amsgrad),
``scale_by_torch_sgd`` (momentum, dampening, Nesterov, weight decay) and ``scale``.

They are what :mod:`geoarray.torch`'s ``Adam``, ``AdamW`` and ``SGD`` run, on plain tensors (equal to
``torch.optim`` to 1e-12 in float64) and on the lifted gradients in g^hor of manifold parameters; the
paper's own transforms are in :mod:`geoarray.optim.transforms`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import optree

from .. import _backend
from .._backend import array_namespace
from . import layout as _layout
from .transforms import (
    EmptyState,
    GradientTransformation,
    check_nonnegative,
    check_unit_interval,
    count_as_float,
    keep_state,
    scaled_bound,
    zero_count,
    zeros_like_tree,
)

__all__ = ["ScaleBySGDState", "ScaleByTorchAdamState", "scale", "scale_by_torch_adam", "scale_by_torch_sgd"]

from .._typing import Array

# ---------------------------------------------------------------------------------------------
# torch.optim's formulas (geoarray.torch's Adam, AdamW and SGD)
# ---------------------------------------------------------------------------------------------


@_layout.per_leaf(("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq"), ("max_exp_avg_sq", "max_exp_avg_sq"))
class ScaleByTorchAdamState(NamedTuple):
    """State of :func:`scale_by_torch_adam`: torch.optim.Adam's buffers under torch's names."""

    count: Array  # steps taken (integer)
    exp_avg: Any  # mₜ, torch's exp_avg (not bias-corrected)
    exp_avg_sq: Any  # vₜ, torch's exp_avg_sq (not bias-corrected)
    max_exp_avg_sq: Any  # max_{s≤t} v_s with amsgrad, else () (nothing stored)


@_layout.per_leaf(("momentum_buffer", "momentum_buffer"))
class ScaleBySGDState(NamedTuple):
    """State of :func:`scale_by_torch_sgd`: the step count and torch.optim.SGD's momentum buffer."""

    count: Array  # steps taken (integer)
    momentum_buffer: Any  # torch's momentum_buffer, or () when momentum is 0 (nothing stored)


def _hyperparameter(value: Any, name: str, check: Callable[[Any, str], float]) -> Callable[[Any], Any]:
    """A number (checked now) or a function of the step t (read at every step, as schedules are)."""
    if callable(value):
        return value
    number = check(value, name)
    return lambda t: number


def _step_coefficients(count: Array, compute: Callable[[Any], tuple]) -> Callable[[Array], tuple]:
    """``compute(t)`` once per step: with t a Python int when eager (the counter read to the host once,
    as ``scale_by_adam`` does), a 0-d float array per dtype and device when traced."""
    if _backend.host_reads_allowed(count):
        host = compute(int(count))
        return lambda g: host
    cache: dict = {}

    def coefficients(g: Array) -> tuple:
        key = (str(g.dtype), str(_backend.device(g)))
        if key not in cache:
            cache[key] = compute(count_as_float(count, g))
        return cache[key]

    return coefficients


def scale(step_size: float) -> GradientTransformation:
    """updates ← step_size · updates (stateless; ``scale(-1.0)`` turns descent into ascent: torch's
    ``maximize=True``)."""
    if isinstance(step_size, bool) or not isinstance(step_size, (int, float)) or not math.isfinite(step_size):
        raise ValueError(f"step_size must be a finite number, got {step_size!r}")
    factor = float(step_size)

    def init(params: Any) -> EmptyState:
        return EmptyState()

    def update(updates: Any, state: EmptyState, params: Any = None) -> tuple[Any, EmptyState]:
        if factor == 1.0:  # the identity (e.g. maximize=False): no pass over the arrays
            return updates, state
        return optree.tree_map(lambda u: factor * u, updates), state

    return GradientTransformation(init, update, reframe=keep_state, bound=scaled_bound(factor), elementwise=True)


def scale_by_torch_adam(
    beta1: Any = 0.9,
    beta2: Any = 0.999,
    eps: Any = 1e-8,
    *,
    delta: Any = 0.0,
    amsgrad: bool = False,
    weight_decay: Any = 0.0,
    decoupled_weight_decay: bool = False,
) -> GradientTransformation:
    """Adam as ``torch.optim.Adam`` computes it (Kingma & Ba, *Adam: A method for stochastic
    optimization*, Algorithm 1; Loshchilov & Hutter, *Decoupled weight decay regularization*, for
    ``decoupled_weight_decay``), without the learning rate::

        g ← g + λ·θ                                  (weight_decay λ, coupled: L2 regularisation)
        mₜ = β₁ mₜ₋₁ + (1 − β₁) g,   vₜ = β₂ vₜ₋₁ + (1 − β₂) g ⊙ g
        v̄ₜ = max(v̄ₜ₋₁, vₜ)  with amsgrad, else v̄ₜ = vₜ
        update = (mₜ/(1 − β₁ᵗ)) / (√(v̄ₜ/(1 − β₂ᵗ) + δ) + ε)   (+ λ·θ when decoupled)

    so that ``chain(scale_by_torch_adam(...), scale_by_learning_rate(lr))`` is torch's step
    θ ← θ − lr·(…) (decoupled: θ(1 − lr·λ) − lr·m̂/(√v̂ + ε), AdamW). The state holds torch's
    ``exp_avg``, ``exp_avg_sq`` and ``max_exp_avg_sq`` (uncorrected), and the bias corrections use the
    current β at every step, as torch does — so β may change between steps (OneCycleLR's momentum
    cycling). Unlike :func:`scale_by_adam` (the paper's eq. 5–6, bias correction folded into the
    cache), δ inside the root defaults to 0 and ε outside to torch's 1e-8.

    ``beta1``, ``beta2``, ``eps``, ``delta`` and ``weight_decay`` are numbers or functions of the step
    t = 1, 2, … (a Python int when eager, a 0-d array when traced). Inside
    :func:`~geoarray.optim.riemannian` a manifold leaf's θ is the lift of the gradient of ½‖Y‖²
    (see :func:`add_decayed_weights`). Elementwise arithmetic on a horizontal element treats a_ij and
    a_ji alike, so a skew A-block stays skew.
    """
    b1 = _hyperparameter(beta1, "beta1", check_unit_interval)
    b2 = _hyperparameter(beta2, "beta2", check_unit_interval)
    eps_ = _hyperparameter(eps, "eps", check_nonnegative)
    delta_ = _hyperparameter(delta, "delta", check_nonnegative)
    wd = _hyperparameter(weight_decay, "weight_decay", check_nonnegative)
    if not callable(eps) and not callable(delta) and eps_(1) == 0 and delta_(1) == 0:
        raise ValueError("scale_by_torch_adam needs eps > 0 (outside the root) or delta > 0 (inside): both are 0")
    uses_decay = callable(weight_decay) or weight_decay != 0
    amsgrad, decoupled = bool(amsgrad), bool(decoupled_weight_decay)

    def init(params: Any) -> ScaleByTorchAdamState:
        mu, nu = zeros_like_tree(params), zeros_like_tree(params)
        return ScaleByTorchAdamState(zero_count(params), mu, nu, zeros_like_tree(params) if amsgrad else ())

    def compute(t: Any) -> tuple:
        beta1_, beta2_ = b1(t), b2(t)
        return (1 - beta1_, beta2_, 1 - beta2_, 1 - beta1_**t, 1 - beta2_**t, eps_(t), delta_(t), wd(t))

    def update(updates: Any, state: ScaleByTorchAdamState, params: Any = None) -> tuple[Any, ScaleByTorchAdamState]:
        if uses_decay and params is None:
            raise ValueError("scale_by_torch_adam with weight_decay needs params: call update(updates, state, params)")
        count = state.count + 1
        coefficient = _step_coefficients(count, compute)
        if uses_decay and not decoupled:
            updates = optree.tree_map(lambda g, p: g + coefficient(g)[7] * p, updates, params)
        # torch: exp_avg.lerp_(grad, 1 − β₁); exp_avg_sq.mul_(β₂).addcmul_(grad, grad, value=1 − β₂)
        exp_avg = optree.tree_map(
            lambda m, g: _backend.lerp(m, g, coefficient(g)[0], array_namespace(g)), state.exp_avg, updates
        )
        exp_avg_sq = optree.tree_map(
            lambda v, g: coefficient(g)[1] * v + coefficient(g)[2] * (g * g), state.exp_avg_sq, updates
        )
        if amsgrad:
            top: Any = optree.tree_map(lambda a, v: array_namespace(v).maximum(a, v), state.max_exp_avg_sq, exp_avg_sq)
            second = top
        else:
            top, second = (), exp_avg_sq

        def direction(m: Array, v: Array) -> Array:
            _, _, _, bc1, bc2, e, d, _ = coefficient(m)
            xp = array_namespace(v)
            root = xp.sqrt(v / bc2 + d) if not (isinstance(d, float) and d == 0) else xp.sqrt(v / bc2)
            return (m / bc1) / (root + e)

        out = optree.tree_map(direction, exp_avg, second)
        if uses_decay and decoupled:
            out = optree.tree_map(lambda u, p: u + coefficient(u)[7] * p, out, params)
        return out, ScaleByTorchAdamState(_backend.as_array(count), exp_avg, exp_avg_sq, top)

    def reframe(state: ScaleByTorchAdamState, rotate: Callable[[Any, int], Any]) -> ScaleByTorchAdamState:
        top = rotate(state.max_exp_avg_sq, 2) if amsgrad else ()
        return ScaleByTorchAdamState(state.count, rotate(state.exp_avg, 1), rotate(state.exp_avg_sq, 2), top)

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True)


def scale_by_torch_sgd(
    momentum: Any = 0.0, dampening: Any = 0.0, nesterov: bool = False, weight_decay: Any = 0.0
) -> GradientTransformation:
    """SGD's direction as ``torch.optim.SGD`` computes it (Sutskever et al., *On the importance of
    initialization and momentum in deep learning*, for ``nesterov``), without the learning rate::

        d ← g + λ·θ                                            (weight_decay λ, coupled)
        b₁ = d;   bₜ = μ bₜ₋₁ + (1 − τ) d  for t > 1            (momentum μ, dampening τ)
        update = d + μ bₜ  (nesterov)   or   bₜ                 (μ = 0: update = d, no buffer)

    The first step stores d undamped, as torch does. ``momentum``, ``dampening`` and
    ``weight_decay`` are numbers or functions of the step t; a ``momentum`` given as the number 0
    keeps no buffer. Nesterov needs μ > 0 and τ = 0 (torch's rule).
    """
    no_momentum = not callable(momentum) and momentum == 0
    mu = _hyperparameter(momentum, "momentum", check_nonnegative)
    tau = _hyperparameter(dampening, "dampening", check_nonnegative)
    wd = _hyperparameter(weight_decay, "weight_decay", check_nonnegative)
    nesterov = bool(nesterov)
    if nesterov and (no_momentum or (not callable(dampening) and tau(1) != 0)):
        raise ValueError("nesterov momentum requires a momentum > 0 and zero dampening (torch.optim.SGD's rule)")
    uses_decay = callable(weight_decay) or weight_decay != 0

    def init(params: Any) -> ScaleBySGDState:
        return ScaleBySGDState(zero_count(params), () if no_momentum else zeros_like_tree(params))

    def compute(t: Any) -> tuple:
        if isinstance(t, int):
            first = 1.0 if t == 1 else 1.0 - tau(t)
        else:  # traced: 1 at t = 1, 1 − τ after, without a host branch
            first = 1.0 - tau(t) * array_namespace(t).minimum(t - 1, array_namespace(t).ones_like(t))
        return mu(t), first, wd(t)

    def update(updates: Any, state: ScaleBySGDState, params: Any = None) -> tuple[Any, ScaleBySGDState]:
        if uses_decay and params is None:
            raise ValueError("scale_by_torch_sgd with weight_decay needs params: call update(updates, state, params)")
        count = state.count + 1
        coefficient = _step_coefficients(count, compute)
        if uses_decay:
            updates = optree.tree_map(lambda g, p: g + coefficient(g)[2] * p, updates, params)
        if no_momentum:
            return updates, ScaleBySGDState(_backend.as_array(count), ())
        buf = optree.tree_map(
            lambda b, d: coefficient(d)[0] * b + coefficient(d)[1] * d, state.momentum_buffer, updates
        )
        out = optree.tree_map(lambda d, b: d + coefficient(d)[0] * b, updates, buf) if nesterov else buf
        return out, ScaleBySGDState(_backend.as_array(count), buf)

    def reframe(state: ScaleBySGDState, rotate: Callable[[Any, int], Any]) -> ScaleBySGDState:
        return state if no_momentum else ScaleBySGDState(state.count, rotate(state.momentum_buffer, 1))

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True)
