"""torch.optim's update rules as pure transforms: ``scale_by_torch_adam`` (Adam, AdamW, amsgrad),
``scale_by_torch_sgd`` (momentum, dampening, Nesterov, weight decay), ``scale_by_torch_rmsprop``,
``scale_by_torch_adagrad``, ``scale_by_torch_adamax``, ``scale_by_torch_nadam``,
``scale_by_torch_radam`` and ``scale``.

They are what :mod:`geoarray.torch`'s ``Adam``, ``AdamW``, ``SGD``, ``RMSprop``, ``Adagrad``, ``Adamax``,
``NAdam`` and ``RAdam`` run, on plain tensors (equal to ``torch.optim`` to 1e-12 in float64) and on the
lifted gradients in g^hor of manifold parameters; the paper's own transforms are in
:mod:`geoarray.optim.transforms`.
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
    _scaled,
    _skip_empty,
    check_nonnegative,
    check_unit_interval,
    count_as_float,
    keep_state,
    scaled_bound,
    zero_count,
    zeros_like_tree,
)

__all__ = [
    "ScaleBySGDState",
    "ScaleByTorchAdagradState",
    "ScaleByTorchAdamState",
    "ScaleByTorchAdamaxState",
    "ScaleByTorchNAdamState",
    "ScaleByTorchRAdamState",
    "ScaleByTorchRMSpropState",
    "scale",
    "scale_by_torch_adagrad",
    "scale_by_torch_adam",
    "scale_by_torch_adamax",
    "scale_by_torch_nadam",
    "scale_by_torch_radam",
    "scale_by_torch_rmsprop",
    "scale_by_torch_sgd",
]

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

    def update(updates: Any, state: EmptyState, params: Any = None, *, donate: bool = False) -> tuple[Any, EmptyState]:
        if factor == 1.0:  # the identity (e.g. maximize=False): no pass over the arrays
            return updates, state
        return optree.tree_map(lambda u: _scaled(u, factor, donate), updates), state

    return GradientTransformation(
        init, update, reframe=keep_state, bound=scaled_bound(factor), elementwise=True, donates=True
    )


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

    def update(
        updates: Any, state: ScaleByTorchAdamState, params: Any = None, *, donate: bool = False
    ) -> tuple[Any, ScaleByTorchAdamState]:
        if uses_decay and params is None:
            raise ValueError("scale_by_torch_adam with weight_decay needs params: call update(updates, state, params)")
        count = state.count + 1
        coefficient = _step_coefficients(count, compute)
        if uses_decay and not decoupled:
            updates = optree.tree_map(_skip_empty(lambda g, p: g + coefficient(g)[7] * p), updates, params)
        # torch: exp_avg.lerp_(grad, 1 − β₁); exp_avg_sq.mul_(β₂).addcmul_(grad, grad, value=1 − β₂), in
        # place where the state was handed over (donate), as torch does
        lerp = _backend.lerp_ if donate else _backend.lerp
        square = _backend.scale_add_square_ if donate else _backend.scale_add_square

        def second_moment(v: Array, g: Array) -> Array:
            c = coefficient(g)
            return square(v, c[1], c[2], g, array_namespace(g))

        exp_avg = optree.tree_map(
            _skip_empty(lambda m, g: lerp(m, g, coefficient(g)[0], array_namespace(g))), state.exp_avg, updates
        )
        exp_avg_sq = optree.tree_map(_skip_empty(second_moment), state.exp_avg_sq, updates)
        if amsgrad:
            if donate:
                top: Any = optree.tree_map(_maximum_, state.max_exp_avg_sq, exp_avg_sq)
            else:
                top = optree.tree_map(lambda a, v: array_namespace(v).maximum(a, v), state.max_exp_avg_sq, exp_avg_sq)
            second = top
        else:
            top, second = (), exp_avg_sq

        def direction(m: Array, v: Array, g: Array) -> Array:
            _, _, _, bc1, bc2, e, d, _ = coefficient(m)
            xp = array_namespace(v)
            no_delta = isinstance(d, float) and d == 0
            if not donate:
                root = xp.sqrt(v / bc2) if no_delta else xp.sqrt(v / bc2 + d)
                return (m / (root + e)) / bc1
            # the same operations written into the handed-over gradient, which the moments have read: no new
            # array (a fresh one of a GPT-2 Q/K/V piece's size cost 5 ms of page faults here, the division
            # itself 0.3 ms). torch's order: m/(√v̂ + ε) before 1/(1 − β₁ᵗ) (its addcdiv_ by lr/(1 − β₁ᵗ))
            root = _backend.divide_into(g, v, bc2, xp)
            if not no_delta:
                root += d
            root = _backend.sqrt_(root, xp)
            root += e
            out = _backend.divide_into(root, m, root, xp)
            out /= bc1
            return out

        out = optree.tree_map(_skip_empty(direction), exp_avg, second, updates)
        if uses_decay and decoupled:
            out = optree.tree_map(_skip_empty(lambda u, p: u + coefficient(u)[7] * p), out, params)
        return out, ScaleByTorchAdamState(_backend.as_array(count), exp_avg, exp_avg_sq, top)

    def reframe(state: ScaleByTorchAdamState, rotate: Callable[[Any, int], Any]) -> ScaleByTorchAdamState:
        top = rotate(state.max_exp_avg_sq, 2) if amsgrad else ()
        return ScaleByTorchAdamState(state.count, rotate(state.exp_avg, 1), rotate(state.exp_avg_sq, 2), top)

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True, donates=True)


def _maximum_(a: Array, v: Array) -> Array:
    """a ← max(a, v) in place (amsgrad's running maximum of a donated state)."""
    xp = array_namespace(a, v)
    if not _backend.writable(xp):  # JAX: the new maximum is the result
        return xp.maximum(a, v)
    a[...] = xp.maximum(a, v)
    return a


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


# ---------------------------------------------------------------------------------------------
# torch.optim's other adaptive methods (geoarray.torch's RMSprop, Adagrad, Adamax, NAdam, RAdam)
# ---------------------------------------------------------------------------------------------


@_layout.per_leaf(("square_avg", "square_avg"), ("grad_avg", "grad_avg"), ("momentum_buffer", "momentum_buffer"))
class ScaleByTorchRMSpropState(NamedTuple):
    """State of :func:`scale_by_torch_rmsprop`: torch.optim.RMSprop's buffers under torch's names."""

    count: Array  # steps taken (integer)
    square_avg: Any  # vₜ, the running mean of g ⊙ g
    grad_avg: Any  # ḡₜ, the running mean of g with centered=True, else () (nothing stored)
    momentum_buffer: Any  # bₜ with momentum > 0, else () (nothing stored)


@_layout.per_leaf(("sum", "sum"))
class ScaleByTorchAdagradState(NamedTuple):
    """State of :func:`scale_by_torch_adagrad`: the step count and torch.optim.Adagrad's ``sum``."""

    count: Array  # steps taken (integer)
    sum: Any  # sₜ = s₀ + Σ g ⊙ g (s₀: initial_accumulator_value)


@_layout.per_leaf(("exp_avg", "exp_avg"), ("exp_inf", "exp_inf"))
class ScaleByTorchAdamaxState(NamedTuple):
    """State of :func:`scale_by_torch_adamax`: torch.optim.Adamax's buffers under torch's names."""

    count: Array  # steps taken (integer)
    exp_avg: Any  # mₜ (not bias-corrected)
    exp_inf: Any  # uₜ = max(β₂ uₜ₋₁, |g| + ε), the exponentially weighted infinity norm


@_layout.per_leaf(("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq"))
class ScaleByTorchNAdamState(NamedTuple):
    """State of :func:`scale_by_torch_nadam`: torch.optim.NAdam's buffers under torch's names."""

    count: Array  # steps taken (integer)
    mu_product: Array  # Π_{s≤t} μ_s, a 0-d array (of the widest dtype of the parameters), one per state
    exp_avg: Any  # mₜ (not bias-corrected)
    exp_avg_sq: Any  # vₜ (not bias-corrected)


@_layout.per_leaf(("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq"))
class ScaleByTorchRAdamState(NamedTuple):
    """State of :func:`scale_by_torch_radam`: torch.optim.RAdam's buffers under torch's names."""

    count: Array  # steps taken (integer)
    exp_avg: Any  # mₜ (not bias-corrected)
    exp_avg_sq: Any  # vₜ (not bias-corrected)


def _needs_params(name: str, uses_decay: bool, params: Any) -> None:
    if uses_decay and params is None:
        raise ValueError(f"{name} with weight_decay needs params: call update(updates, state, params)")


def _needs_eps(name: str, eps: Any, check: Callable[[Any], Any]) -> None:
    """ε > 0 where a zero gradient entry would otherwise divide 0 by 0 (torch accepts ε = 0 and returns NaN)."""
    if not callable(eps) and check(1) == 0:
        raise ValueError(f"{name} needs eps > 0 (a zero gradient entry would divide 0 by 0), got eps={eps!r}")


def _sqrt(x: Array) -> Array:
    return array_namespace(x).sqrt(x)


def _ones_like_scalar(tree: Any) -> Array:
    """A 0-d array of ones in the widest floating dtype of ``tree``'s leaves, on the first leaf's device."""
    leaves = optree.tree_leaves(tree)
    if not leaves:
        raise ValueError("params must hold at least one array")
    xp = array_namespace(leaves[0])
    dtype = xp.result_type(*(leaf.dtype for leaf in leaves))
    return xp.ones((), dtype=dtype, device=_backend.device(leaves[0]))


def scale_by_torch_rmsprop(
    alpha: Any = 0.99, eps: Any = 1e-8, weight_decay: Any = 0.0, momentum: Any = 0.0, centered: bool = False
) -> GradientTransformation:
    """RMSprop as ``torch.optim.RMSprop`` computes it (Hinton, *Neural networks for machine learning*,
    lecture 6e; Graves, *Generating sequences with recurrent neural networks*, eqs. 38–45, for
    ``centered``), without the learning rate::

        g ← g + λ·θ                                   (weight_decay λ, coupled)
        vₜ = α vₜ₋₁ + (1 − α) g ⊙ g
        ḡₜ = α ḡₜ₋₁ + (1 − α) g,   d = √(vₜ − ḡₜ ⊙ ḡₜ) + ε    (centered)      else   d = √vₜ + ε
        bₜ = μ bₜ₋₁ + g ⊘ d,   update = bₜ            (momentum μ > 0)        else   update = g ⊘ d

    so that ``chain(scale_by_torch_rmsprop(...), scale_by_learning_rate(lr))`` is torch's step
    θ ← θ − lr·update. The state holds torch's ``square_avg``, ``grad_avg`` (``centered``) and
    ``momentum_buffer`` (μ > 0). ``alpha``, ``eps``, ``weight_decay`` and ``momentum`` are numbers or
    functions of the step t = 1, 2, …; a ``momentum`` given as the number 0 keeps no buffer. ``alpha``
    lies in [0, 1) (torch takes any α ≥ 0, and α > 1 makes vₜ negative: NaN), and ``eps`` must be > 0
    (a zero gradient entry would divide 0 by 0). Every operation is elementwise, so on a horizontal
    element of g^hor a skew A-block stays skew.
    """
    a = _hyperparameter(alpha, "alpha", check_unit_interval)
    eps_ = _hyperparameter(eps, "eps", check_nonnegative)
    wd = _hyperparameter(weight_decay, "weight_decay", check_nonnegative)
    mu = _hyperparameter(momentum, "momentum", check_nonnegative)
    _needs_eps("scale_by_torch_rmsprop", eps, eps_)
    no_momentum = not callable(momentum) and momentum == 0
    uses_decay = callable(weight_decay) or weight_decay != 0
    centered = bool(centered)

    def init(params: Any) -> ScaleByTorchRMSpropState:
        square_avg = zeros_like_tree(params)
        grad_avg = zeros_like_tree(params) if centered else ()
        return ScaleByTorchRMSpropState(
            zero_count(params), square_avg, grad_avg, () if no_momentum else zeros_like_tree(params)
        )

    def compute(t: Any) -> tuple:
        alpha_ = a(t)
        return alpha_, 1 - alpha_, eps_(t), wd(t), mu(t)

    def update(
        updates: Any, state: ScaleByTorchRMSpropState, params: Any = None
    ) -> tuple[Any, ScaleByTorchRMSpropState]:
        _needs_params("scale_by_torch_rmsprop", uses_decay, params)
        count = state.count + 1
        coefficient = _step_coefficients(count, compute)
        if uses_decay:
            updates = optree.tree_map(lambda g, p: g + coefficient(g)[3] * p, updates, params)
        # torch: square_avg.mul_(α).addcmul_(grad, grad, value=1 − α)
        square_avg = optree.tree_map(
            lambda v, g: coefficient(g)[0] * v + coefficient(g)[1] * (g * g), state.square_avg, updates
        )
        grad_avg: Any = ()
        # torch: grad_avg.lerp_(grad, 1 − α); avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        if centered:
            grad_avg = optree.tree_map(
                lambda m, g: _backend.lerp(m, g, coefficient(g)[1], array_namespace(g)), state.grad_avg, updates
            )
            avg = optree.tree_map(lambda v, m: _sqrt(v - m * m) + coefficient(v)[2], square_avg, grad_avg)
        else:
            avg = optree.tree_map(lambda v: _sqrt(v) + coefficient(v)[2], square_avg)
        if no_momentum:
            out = optree.tree_map(lambda g, d: g / d, updates, avg)
            return out, ScaleByTorchRMSpropState(_backend.as_array(count), square_avg, grad_avg, ())
        # torch: buf.mul_(μ).addcdiv_(grad, avg)
        buf = optree.tree_map(lambda b, g, d: coefficient(g)[4] * b + g / d, state.momentum_buffer, updates, avg)
        return buf, ScaleByTorchRMSpropState(_backend.as_array(count), square_avg, grad_avg, buf)

    def reframe(state: ScaleByTorchRMSpropState, rotate: Callable[[Any, int], Any]) -> ScaleByTorchRMSpropState:
        grad_avg = rotate(state.grad_avg, 1) if centered else ()
        buf = () if no_momentum else rotate(state.momentum_buffer, 1)
        return ScaleByTorchRMSpropState(state.count, rotate(state.square_avg, 2), grad_avg, buf)

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True)


def scale_by_torch_adagrad(
    lr_decay: Any = 0.0, weight_decay: Any = 0.0, initial_accumulator_value: float = 0.0, eps: Any = 1e-10
) -> GradientTransformation:
    """Adagrad as ``torch.optim.Adagrad`` computes it (Duchi, Hazan & Singer, *Adaptive subgradient
    methods for online learning and stochastic optimization*), without the learning rate::

        g ← g + λ·θ                                   (weight_decay λ, coupled)
        sₜ = sₜ₋₁ + g ⊙ g,   s₀ = initial_accumulator_value
        update = (g ⊘ (√sₜ + ε)) / (1 + (t − 1)·η_decay)      (lr_decay η_decay)

    so that ``chain(scale_by_torch_adagrad(...), scale_by_learning_rate(lr))`` is torch's step
    θ ← θ − clr·g ⊘ (√sₜ + ε) with clr = lr / (1 + (t − 1)·η_decay): the decay of the rate depends on the
    step count only. The state holds torch's ``sum``. ``lr_decay``, ``weight_decay`` and ``eps`` are
    numbers or functions of the step t; ``initial_accumulator_value`` (≥ 0) is read once, by ``init``.
    ``eps`` may be 0 only with a positive ``initial_accumulator_value`` (else a zero gradient entry
    divides 0 by 0). Elementwise: on a horizontal element a skew A-block stays skew.
    """
    decay = _hyperparameter(lr_decay, "lr_decay", check_nonnegative)
    wd = _hyperparameter(weight_decay, "weight_decay", check_nonnegative)
    eps_ = _hyperparameter(eps, "eps", check_nonnegative)
    start = check_nonnegative(initial_accumulator_value, "initial_accumulator_value")
    if start == 0:
        _needs_eps("scale_by_torch_adagrad with initial_accumulator_value=0", eps, eps_)
    uses_decay = callable(weight_decay) or weight_decay != 0
    no_lr_decay = not callable(lr_decay) and lr_decay == 0

    def init(params: Any) -> ScaleByTorchAdagradState:
        total = optree.tree_map(lambda x: array_namespace(x).full_like(x, start), params)
        return ScaleByTorchAdagradState(zero_count(params), total)

    def compute(t: Any) -> tuple:
        factor = 1.0 if no_lr_decay else 1 / (1 + (t - 1) * decay(t))
        return eps_(t), wd(t), factor

    def update(
        updates: Any, state: ScaleByTorchAdagradState, params: Any = None
    ) -> tuple[Any, ScaleByTorchAdagradState]:
        _needs_params("scale_by_torch_adagrad", uses_decay, params)
        count = state.count + 1
        coefficient = _step_coefficients(count, compute)
        if uses_decay:
            updates = optree.tree_map(lambda g, p: g + coefficient(g)[1] * p, updates, params)
        total = optree.tree_map(lambda s, g: s + g * g, state.sum, updates)  # torch: state_sum.addcmul_(grad, grad)

        def direction(g: Array, s: Array) -> Array:
            e, _, factor = coefficient(g)
            out = g / (_sqrt(s) + e)
            return out if no_lr_decay else out * factor

        out = optree.tree_map(direction, updates, total)
        return out, ScaleByTorchAdagradState(_backend.as_array(count), total)

    def reframe(state: ScaleByTorchAdagradState, rotate: Callable[[Any, int], Any]) -> ScaleByTorchAdagradState:
        return ScaleByTorchAdagradState(state.count, rotate(state.sum, 2))

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True)


def scale_by_torch_adamax(
    beta1: Any = 0.9, beta2: Any = 0.999, eps: Any = 1e-8, weight_decay: Any = 0.0
) -> GradientTransformation:
    """Adamax as ``torch.optim.Adamax`` computes it (Kingma & Ba, *Adam: A method for stochastic
    optimization*, Algorithm 2), without the learning rate::

        g ← g + λ·θ                                   (weight_decay λ, coupled)
        mₜ = β₁ mₜ₋₁ + (1 − β₁) g,   uₜ = max(β₂ uₜ₋₁, |g| + ε)
        update = (mₜ/(1 − β₁ᵗ)) ⊘ uₜ

    so that ``chain(scale_by_torch_adamax(...), scale_by_learning_rate(lr))`` is torch's step. The state
    holds torch's ``exp_avg`` and ``exp_inf``; the bias correction uses the current β₁ at every step, as
    torch does. ``beta1``, ``beta2``, ``eps`` and ``weight_decay`` are numbers or functions of the step t;
    ``eps`` must be > 0. Elementwise (the absolute value and the max act on a_ij and a_ji alike): on a
    horizontal element a skew A-block of mₜ stays skew and uₜ symmetric.
    """
    b1 = _hyperparameter(beta1, "beta1", check_unit_interval)
    b2 = _hyperparameter(beta2, "beta2", check_unit_interval)
    eps_ = _hyperparameter(eps, "eps", check_nonnegative)
    wd = _hyperparameter(weight_decay, "weight_decay", check_nonnegative)
    _needs_eps("scale_by_torch_adamax", eps, eps_)
    uses_decay = callable(weight_decay) or weight_decay != 0

    def init(params: Any) -> ScaleByTorchAdamaxState:
        return ScaleByTorchAdamaxState(zero_count(params), zeros_like_tree(params), zeros_like_tree(params))

    def compute(t: Any) -> tuple:
        beta1_ = b1(t)
        return 1 - beta1_, b2(t), 1 - beta1_**t, eps_(t), wd(t)

    def update(updates: Any, state: ScaleByTorchAdamaxState, params: Any = None) -> tuple[Any, ScaleByTorchAdamaxState]:
        _needs_params("scale_by_torch_adamax", uses_decay, params)
        count = state.count + 1
        coefficient = _step_coefficients(count, compute)
        if uses_decay:
            updates = optree.tree_map(lambda g, p: g + coefficient(g)[4] * p, updates, params)
        exp_avg = optree.tree_map(
            lambda m, g: _backend.lerp(m, g, coefficient(g)[0], array_namespace(g)), state.exp_avg, updates
        )

        def norm(u: Array, g: Array) -> Array:  # torch: torch.maximum(exp_inf.mul_(β₂), grad.abs().add_(ε))
            xp = array_namespace(g)
            return xp.maximum(coefficient(g)[1] * u, xp.abs(g) + coefficient(g)[3])

        exp_inf = optree.tree_map(norm, state.exp_inf, updates)
        out = optree.tree_map(lambda m, u: (m / coefficient(m)[2]) / u, exp_avg, exp_inf)
        return out, ScaleByTorchAdamaxState(_backend.as_array(count), exp_avg, exp_inf)

    def reframe(state: ScaleByTorchAdamaxState, rotate: Callable[[Any, int], Any]) -> ScaleByTorchAdamaxState:
        # uₜ is a magnitude of first order in the gradients: moved as one, then |·| (the next step's
        # max(β₂u, |g| + ε) ≥ ε keeps the denominator positive)
        exp_inf = optree.tree_map(lambda u: array_namespace(u).abs(u), rotate(state.exp_inf, 1))
        return ScaleByTorchAdamaxState(state.count, rotate(state.exp_avg, 1), exp_inf)

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True)


def scale_by_torch_nadam(
    beta1: Any = 0.9,
    beta2: Any = 0.999,
    eps: Any = 1e-8,
    weight_decay: Any = 0.0,
    momentum_decay: Any = 4e-3,
    decoupled_weight_decay: bool = False,
) -> GradientTransformation:
    """NAdam as ``torch.optim.NAdam`` computes it (Dozat, *Incorporating Nesterov momentum into Adam*),
    without the learning rate::

        g ← g + λ·θ                                   (weight_decay λ, coupled; decoupled: below)
        μₜ = β₁(1 − ½·0.96^(t·ψ)),   μₜ₊₁ = β₁(1 − ½·0.96^((t+1)·ψ))     (momentum_decay ψ)
        Πₜ = Πₜ₋₁·μₜ  (Π₀ = 1, torch's mu_product)
        mₜ = β₁ mₜ₋₁ + (1 − β₁) g,   vₜ = β₂ vₜ₋₁ + (1 − β₂) g ⊙ g,   d = √(vₜ/(1 − β₂ᵗ)) + ε
        update = (1 − μₜ)/(1 − Πₜ) · g ⊘ d + μₜ₊₁/(1 − Πₜ·μₜ₊₁) · mₜ ⊘ d   (+ λ·θ when decoupled)

    so that ``chain(scale_by_torch_nadam(...), scale_by_learning_rate(lr))`` is torch's step (decoupled:
    θ(1 − lr·λ) − lr·(…), torch's ``decoupled_weight_decay=True``, NAdamW). The state holds torch's
    ``exp_avg``, ``exp_avg_sq`` and ``mu_product`` (a 0-d array of the parameters' widest dtype; torch
    keeps it in its default scalar dtype, float32 unless the default dtype is float64). Πₜ multiplies the
    μ of every step, so a β₁ that changes between steps (OneCycleLR's momentum cycling) enters as torch's
    does. ``beta1``, ``beta2``, ``eps``, ``weight_decay`` and ``momentum_decay`` are numbers or functions
    of the step t; ``eps`` must be > 0. The coefficients depend on the step count only: on a horizontal
    element the update is elementwise, and a skew A-block stays skew.
    """
    b1 = _hyperparameter(beta1, "beta1", check_unit_interval)
    b2 = _hyperparameter(beta2, "beta2", check_unit_interval)
    eps_ = _hyperparameter(eps, "eps", check_nonnegative)
    wd = _hyperparameter(weight_decay, "weight_decay", check_nonnegative)
    psi = _hyperparameter(momentum_decay, "momentum_decay", check_nonnegative)
    _needs_eps("scale_by_torch_nadam", eps, eps_)
    uses_decay = callable(weight_decay) or weight_decay != 0
    decoupled = bool(decoupled_weight_decay)

    def init(params: Any) -> ScaleByTorchNAdamState:
        return ScaleByTorchNAdamState(
            zero_count(params), _ones_like_scalar(params), zeros_like_tree(params), zeros_like_tree(params)
        )

    def compute(t: Any, mu_product: Array) -> tuple:
        beta1_, beta2_, decay = b1(t), b2(t), psi(t)
        mu = beta1_ * (1.0 - 0.5 * 0.96 ** (t * decay))
        mu_next = beta1_ * (1.0 - 0.5 * 0.96 ** ((t + 1) * decay))
        # eagerly the product is read to the host (one scalar, as the step count is); traced, cast to g's dtype
        before = float(mu_product) if isinstance(t, int) else array_namespace(t).astype(mu_product, t.dtype)
        product = before * mu
        c_grad = (1.0 - mu) / (1.0 - product)
        c_avg = mu_next / (1.0 - product * mu_next)
        return 1 - beta1_, beta2_, 1 - beta2_, 1 - beta2_**t, eps_(t), wd(t), c_grad, c_avg, mu

    def update(updates: Any, state: ScaleByTorchNAdamState, params: Any = None) -> tuple[Any, ScaleByTorchNAdamState]:
        _needs_params("scale_by_torch_nadam", uses_decay, params)
        count = state.count + 1
        coefficient = _step_coefficients(count, lambda t: compute(t, state.mu_product))
        if uses_decay and not decoupled:
            updates = optree.tree_map(lambda g, p: g + coefficient(g)[5] * p, updates, params)
        exp_avg = optree.tree_map(
            lambda m, g: _backend.lerp(m, g, coefficient(g)[0], array_namespace(g)), state.exp_avg, updates
        )
        exp_avg_sq = optree.tree_map(
            lambda v, g: coefficient(g)[1] * v + coefficient(g)[2] * (g * g), state.exp_avg_sq, updates
        )

        def direction(g: Array, m: Array, v: Array) -> Array:
            _, _, _, bc2, e, _, c_grad, c_avg, _ = coefficient(g)
            d = _sqrt(v / bc2) + e  # torch: exp_avg_sq.div(bias_correction2).sqrt().add_(eps)
            return c_grad * (g / d) + c_avg * (m / d)

        out = optree.tree_map(direction, updates, exp_avg, exp_avg_sq)
        if uses_decay and decoupled:
            out = optree.tree_map(lambda u, p: u + coefficient(u)[5] * p, out, params)
        # Πₜ = Πₜ₋₁·μₜ, with μₜ in the product's dtype (the host's float when eager: torch's mu_product *= mu)
        mu_product = state.mu_product * coefficient(state.mu_product)[8]
        return out, ScaleByTorchNAdamState(_backend.as_array(count), _backend.as_array(mu_product), exp_avg, exp_avg_sq)

    def reframe(state: ScaleByTorchNAdamState, rotate: Callable[[Any, int], Any]) -> ScaleByTorchNAdamState:
        return state._replace(exp_avg=rotate(state.exp_avg, 1), exp_avg_sq=rotate(state.exp_avg_sq, 2))

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True)


def scale_by_torch_radam(
    beta1: Any = 0.9,
    beta2: Any = 0.999,
    eps: Any = 1e-8,
    weight_decay: Any = 0.0,
    decoupled_weight_decay: bool = False,
) -> GradientTransformation:
    """RAdam as ``torch.optim.RAdam`` computes it (Liu et al., *On the variance of the adaptive learning
    rate and beyond*, Algorithm 2), without the learning rate::

        g ← g + λ·θ                                   (weight_decay λ, coupled; decoupled: below)
        mₜ = β₁ mₜ₋₁ + (1 − β₁) g,   vₜ = β₂ vₜ₋₁ + (1 − β₂) g ⊙ g
        ρ∞ = 2/(1 − β₂) − 1,   ρₜ = ρ∞ − 2t·β₂ᵗ/(1 − β₂ᵗ)
        rₜ = √((ρₜ − 4)(ρₜ − 2)ρ∞ / ((ρ∞ − 4)(ρ∞ − 2)ρₜ))
        update = (mₜ/(1 − β₁ᵗ)) · rₜ·√(1 − β₂ᵗ) ⊘ (√vₜ + ε)    if ρₜ > 5
        update = mₜ/(1 − β₁ᵗ)                                 otherwise   (+ λ·θ when decoupled)

    so that ``chain(scale_by_torch_radam(...), scale_by_learning_rate(lr))`` is torch's step (decoupled:
    θ(1 − lr·λ) − lr·(…), torch's ``decoupled_weight_decay=True``). The rectification rₜ and the switch
    ρₜ > 5 depend on the step count and β₂ only (with torch's β = 0.999 the first 5 steps are SGD with
    momentum): eagerly a branch on the host, traced a 0/1 factor computed on the device, so the update
    is elementwise either way and a skew A-block of a horizontal element stays skew. The state holds
    torch's ``exp_avg`` and ``exp_avg_sq``. ``beta1``, ``beta2``, ``eps`` and ``weight_decay`` are numbers
    or functions of the step t; ``eps`` must be > 0.
    """
    b1 = _hyperparameter(beta1, "beta1", check_unit_interval)
    b2 = _hyperparameter(beta2, "beta2", check_unit_interval)
    eps_ = _hyperparameter(eps, "eps", check_nonnegative)
    wd = _hyperparameter(weight_decay, "weight_decay", check_nonnegative)
    _needs_eps("scale_by_torch_radam", eps, eps_)
    uses_decay = callable(weight_decay) or weight_decay != 0
    decoupled = bool(decoupled_weight_decay)

    def init(params: Any) -> ScaleByTorchRAdamState:
        return ScaleByTorchRAdamState(zero_count(params), zeros_like_tree(params), zeros_like_tree(params))

    def compute(t: Any) -> tuple:
        beta1_, beta2_ = b1(t), b2(t)
        bc1, bc2 = 1 - beta1_**t, 1 - beta2_**t
        rho_inf = 2 / (1 - beta2_) - 1
        # the factor of the rectified step, rₜ·√(1 − β₂ᵗ) (None: not rectified), and, traced, the 0/1 factor
        # "not rectified" (None when eager: the branch is taken on the host)
        scale_: Any = None
        plain: Any = None
        # else ρₜ ≤ ρ∞ ≤ 5 at every step (a β₂ known only on the device takes the traced route)
        if not isinstance(rho_inf, (int, float)) or rho_inf > 5:
            rho_t = rho_inf - 2 * t * beta2_**t / bc2
            denominator = (rho_inf - 4) * (rho_inf - 2)
            if isinstance(t, int):  # eager: torch's branch on the host
                if rho_t > 5:
                    rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / (denominator * rho_t)) ** 0.5
                    scale_ = rect * bc2**0.5
            else:  # traced: ρₜ > 0 from t = 1 on (ρ₁ = 1), so the ratio is finite; below 5 it is zeroed
                xp = array_namespace(t)
                on = xp.astype(rho_t > 5, t.dtype)
                ratio = (rho_t - 4) * (rho_t - 2) * rho_inf / (denominator * rho_t)
                scale_, plain = xp.sqrt(ratio * on) * xp.sqrt(bc2), 1 - on
        return 1 - beta1_, beta2_, 1 - beta2_, bc1, eps_(t), wd(t), scale_, plain

    def update(updates: Any, state: ScaleByTorchRAdamState, params: Any = None) -> tuple[Any, ScaleByTorchRAdamState]:
        _needs_params("scale_by_torch_radam", uses_decay, params)
        count = state.count + 1
        coefficient = _step_coefficients(count, compute)
        if uses_decay and not decoupled:
            updates = optree.tree_map(lambda g, p: g + coefficient(g)[5] * p, updates, params)
        exp_avg = optree.tree_map(
            lambda m, g: _backend.lerp(m, g, coefficient(g)[0], array_namespace(g)), state.exp_avg, updates
        )
        exp_avg_sq = optree.tree_map(
            lambda v, g: coefficient(g)[1] * v + coefficient(g)[2] * (g * g), state.exp_avg_sq, updates
        )

        def direction(m: Array, v: Array) -> Array:
            _, _, _, bc1, e, _, scale_, plain = coefficient(m)
            corrected = m / bc1
            if scale_ is None:  # not rectified at this step (eager), or never (ρ∞ ≤ 5)
                return corrected
            if plain is None:  # eager, rectified
                return corrected * (scale_ / (_sqrt(v) + e))
            return corrected * (scale_ / (_sqrt(v) + e) + plain)  # traced: one of the two terms is 0

        out = optree.tree_map(direction, exp_avg, exp_avg_sq)
        if uses_decay and decoupled:
            out = optree.tree_map(lambda u, p: u + coefficient(u)[5] * p, out, params)
        return out, ScaleByTorchRAdamState(_backend.as_array(count), exp_avg, exp_avg_sq)

    def reframe(state: ScaleByTorchRAdamState, rotate: Callable[[Any, int], Any]) -> ScaleByTorchRAdamState:
        return ScaleByTorchRAdamState(state.count, rotate(state.exp_avg, 1), rotate(state.exp_avg_sq, 2))

    return GradientTransformation(init, update, uses_params=uses_decay, reframe=reframe, elementwise=True)
