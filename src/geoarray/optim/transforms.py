"""Vector-space gradient transforms: pure ``(init, update)`` pairs over trees, as in optax.

The paper's observation (Brantner, *Generalizing Adam to Manifolds for Efficiently Training
Transformers*, Algorithm 1 and fig. 1) is that the cache logic of an optimizer — ``update`` and
``velocity`` — is the same for vector spaces and homogeneous spaces once gradients are lifted to the
global tangent space representation g^hor. This module holds that cache logic and nothing else::

    transform = chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(1e-3))
    state = transform.init(updates_like)                 # a NamedTuple of arrays
    updates, state = transform.update(grads, state, params)

``grads``/``updates`` are trees whose leaves are arrays or horizontal elements of g^hor
(:class:`~geoarray.manifolds.HorizontalElement`, NamedTuples of arrays and therefore pytrees
themselves). The returned updates are *added* to the parameters (optax's sign convention: the
learning-rate scale multiplies by −η); :func:`geoarray.optim.riemannian` adds them on manifolds
through the retraction. Every transform is written once against the array API, keeps its
configuration out of the state (states hold arrays only) and reads no array value on the host when
traced, so ``jax.jit`` and ``torch.compile`` trace it (eager, and only where
:func:`geoarray.set_host_reads` allows it, ``scale_by_adam`` reads its step counter, one scalar).
Any optax transform obeys the same protocol and can be used instead.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import optree

from .. import _backend
from .._backend import array_namespace
from ..manifolds.horizontal import HorizontalElement
from . import layout as _layout
from .schedules import as_schedule, check_positive

__all__ = [
    "AddDecayedWeightsState",
    "ClipByGlobalNormState",
    "EmptyState",
    "GradientTransformation",
    "ScaleByAdamState",
    "ScaleByBFGSState",
    "ScaleByMomentumState",
    "ScaleByScheduleState",
    "adam_ratio_bound",
    "add_decayed_weights",
    "chain",
    "clip_by_global_norm",
    "global_norm",
    "scale_by_adam",
    "scale_by_bfgs",
    "scale_by_factor",
    "scale_by_learning_rate",
    "scale_by_momentum",
]

from .._typing import Array


class GradientTransformation(NamedTuple):
    """A pair of pure functions (optax's protocol).

    ``init(params) -> state`` and ``update(updates, state, params=None) -> (updates, state)``.
    ``uses_params`` says whether ``update`` reads ``params`` (the Riemannian wrapper lifts the
    parameters only for transforms that do; foreign transforms are assumed to).

    ``reframe(state, rotate) -> state`` re-expresses the state in a new frame of g^hor (the
    ``section="rotated"`` strategy of :func:`~geoarray.optim.riemannian`): ``rotate(tree, degree)``
    maps a tree shaped like the updates to the new frame, exactly for quantities linear in the
    gradients (``degree=1``) and for elementwise second moments (``degree=2``) through their square
    root. ``None``: the state cannot be re-expressed (the strategy is then refused).

    ``bound(b) -> float | None`` is a bound on the entries of the updates ``update`` returns, given the
    bound ``b`` on those of its input updates (``None``: unbounded or unknown), valid at every step for
    any gradients; a Python float computed on the host from the configuration (and a rate that holds now,
    :func:`scale_by_learning_rate`), never from array values. Adam's direction is bounded whatever its
    gradients (:func:`adam_ratio_bound`), so ``chain(scale_by_adam(), scale_by_learning_rate(η))``
    bounds every entry of its velocity by η·C(β₁, β₂): the retraction then knows, without reading any
    array, the cheapest φ₁ polynomial that covers every step (:func:`~geoarray.optim.riemannian`).
    ``None`` (the default, and any transform without the field): no bound is known.

    ``elementwise``: ``update`` treats every entry of the updates, and of the state's per-group fields
    (those its state type declares with :func:`~geoarray.optim.layout.per_leaf`), on its own, and its
    other state fields (a step count) do not depend on the updates' values. Then any piece of a group
    may be updated alone with the same result, and the Riemannian wrapper cuts a large group into
    pieces of bounded memory (``chunk_bytes`` of :class:`~geoarray.optim.RiemannianOptimizer`). False
    (the default, and every transform without the field, optax's): the wrapper hands it the whole tree.

    ``donates``: ``update`` also accepts ``donate=True``, with which the caller hands over the arrays of
    ``updates`` and ``state`` (as ``jax.jit``'s ``donate_argnums`` do): the transform may then write its
    new state and its result into them, as ``torch.optim`` updates its buffers in place, instead of
    allocating new arrays of the same size; its result then aliases none of its new state (the next
    transform of a chain may write into it). The results are those of ``donate=False``. The Riemannian
    wrapper donates where it owns both (the lifted gradients of manifold leaves and, in a step taken in
    pieces, the state's copies or the state that ``update(..., donate=True)`` was handed); a backend
    whose arrays are immutable (JAX) is never handed them. False (the default, optax's): always pure.
    """

    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]
    uses_params: bool = False
    reframe: Callable[[Any, Callable[[Any, int], Any]], Any] | None = None
    bound: Callable[[float | None], float | None] | None = None
    elementwise: bool = False
    donates: bool = False


class EmptyState(NamedTuple):
    """The state of a stateless transform."""


@_layout.per_leaf(("mu", "mu"), ("nu", "nu"))
class ScaleByAdamState(NamedTuple):
    """State of :func:`scale_by_adam`: the step count and the moments B₁, B₂ of eq. 5."""

    count: Array  # steps taken (integer)
    mu: Any  # B₁: bias-corrected first moment (eq. 5)
    nu: Any  # B₂: bias-corrected second moment (eq. 5)


@_layout.per_leaf(("trace", "momentum_buffer"))
class ScaleByMomentumState(NamedTuple):
    """State of :func:`scale_by_momentum`: the momentum cache of eq. 8."""

    trace: Any  # the momentum cache of eq. 8


class ScaleByScheduleState(NamedTuple):
    """State of :func:`scale_by_learning_rate` with a schedule: the step count it is evaluated at."""

    count: Array


class AddDecayedWeightsState(NamedTuple):
    """State of :func:`add_decayed_weights`: none (the decay is memoryless)."""


class ClipByGlobalNormState(NamedTuple):
    """State of :func:`clip_by_global_norm`: none (the clipping is memoryless)."""


@_layout.per_leaf(("prev_grad", "prev_grad"), ("prev_step", "prev_step"))
@_layout.per_unit("hessian_inv")  # one H per frame of a stack, one for a raveled group's whole vector
class ScaleByBFGSState(NamedTuple):
    """State of :func:`scale_by_bfgs`: the previous gradient and step and the inverse-Hessian estimate H."""

    count: Array
    prev_grad: Any  # B at the previous step
    prev_step: Any  # the previous step W (which led to the current point)
    hessian_inv: Any  # H per unit, in coordinates where the metric of g^hor is Euclidean


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _is_unit(x: Any) -> bool:
    return isinstance(x, HorizontalElement)


def _units(tree: Any) -> tuple[list, Any]:
    """Leaves of a tree with horizontal elements kept whole: the units that carry one metric."""
    return optree.tree_flatten(tree, is_leaf=_is_unit)


def _first_leaf(tree: Any, name: str) -> Array:
    leaves = optree.tree_leaves(tree)
    if not leaves:
        raise ValueError(f"{name} has no array leaves")
    return leaves[0]


def zero_count(tree: Any) -> Array:
    """A 0-d integer step counter on the device of the tree's arrays (int32 under JAX's default)."""
    leaf = _first_leaf(tree, "params")
    xp = array_namespace(leaf)
    return xp.zeros((), dtype=_backend.index_dtype(xp), device=_backend.device(leaf))


def count_as_float(count: Array, like: Array) -> Array:
    """The step counter as a 0-d array of ``like``'s floating dtype (for bias corrections)."""
    xp = array_namespace(like)
    # xp.asarray: NumPy turns 0-d arithmetic results into scalars, which are not arrays
    return xp.astype(xp.asarray(count), like.dtype)


def _skip_empty(fn: Callable[..., Array]) -> Callable[..., Array]:
    """``fn`` for an elementwise map over leaves, returning its first argument itself where that is empty.

    An elementwise operation of an empty array is that array: skipping it keeps every result and saves
    its dispatches. The B block of a square frame's g^hor is (0, n), and Adam's moments, direction and
    rate scaling of it were 15 of the 64 torch operations of a 128×128 eager ``geoarray.torch.Adam`` step.
    """

    def skipping(x: Array, *rest: Any) -> Array:
        return x if math.prod(x.shape) == 0 else fn(x, *rest)

    return skipping


def check_unit_interval(value: Any, name: str, *, closed: bool = False) -> float:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (0 <= value <= 1 if closed else 0 <= value < 1)
    )
    if not ok:
        raise ValueError(f"{name} must be a number in [0, 1{']' if closed else ')'}, got {value!r}")
    return float(value)


def check_nonnegative(value: Any, name: str) -> float:
    """``value`` as a float; ``ValueError`` naming ``name`` unless it is a non-negative finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return float(value)


def zeros_like_tree(tree: Any) -> Any:
    """A tree of zero arrays shaped like ``tree``'s leaves (a transform's fresh buffers).

    Call it once per state field: fields that share one zero array alias each other, and
    ``torch.compile`` traces aliased inputs as a graph of their own, so a compiled step would compile
    twice, once for ``init``'s state and once for every later one."""
    return optree.tree_map(lambda a: array_namespace(a).zeros_like(a), tree)


# ---------------------------------------------------------------------------------------------
# chain
# ---------------------------------------------------------------------------------------------


def chain(*transforms: Any) -> GradientTransformation:
    """Apply ``transforms`` one after the other; the state is the tuple of their states.

    Accepts geoarray and optax transforms alike (anything with ``init`` and ``update``).
    """
    if not transforms:
        raise ValueError("chain needs at least one transform")
    for i, t in enumerate(transforms):
        if not (callable(getattr(t, "init", None)) and callable(getattr(t, "update", None))):
            raise TypeError(f"chain argument {i} must be a gradient transformation (init, update), got {t!r}")
    uses_params = any(getattr(t, "uses_params", True) for t in transforms)
    reframes = [getattr(t, "reframe", None) for t in transforms]
    # the chain's reframe below is offered only when every transform has one (all(reframes))
    rules = cast("list[Callable[[Any, Callable[[Any, int], Any]], Any]]", reframes)

    def init(params: Any) -> tuple:
        return tuple(t.init(params) for t in transforms)

    def update(updates: Any, state: tuple, params: Any = None, *, donate: bool = False) -> tuple[Any, tuple]:
        if not isinstance(state, tuple) or len(state) != len(transforms):
            raise ValueError(f"state must be a tuple of {len(transforms)} transform states, got {type(state).__name__}")
        new_state = []
        for t, s in zip(transforms, state, strict=True):
            # a donating member's result aliases none of its state, so the next one may write into it; after
            # a member that does not donate (its result may be its state, as a momentum trace is) none may
            donate = donate and bool(getattr(t, "donates", False))
            updates, s = t.update(updates, s, params, donate=True) if donate else t.update(updates, s, params)
            new_state.append(s)
        return updates, tuple(new_state)

    def reframe(state: tuple, rotate: Callable[[Any, int], Any]) -> tuple:
        return tuple(r(s, rotate) for r, s in zip(rules, state, strict=True))

    bounds = [getattr(t, "bound", None) for t in transforms]

    def bound(b: float | None) -> float | None:
        for rule in bounds:  # a transform without a bound rule knows nothing of its output
            b = rule(b) if rule is not None else None
        return b

    elementwise = all(getattr(t, "elementwise", False) for t in transforms)
    donates = all(getattr(t, "donates", False) for t in transforms)
    return GradientTransformation(
        init, update, uses_params, reframe if all(reframes) else None, bound, elementwise, donates
    )


def scaled_bound(factor: float) -> Callable[[float | None], float | None]:
    """The bound rule of a transform that multiplies its updates by ``factor``: b ↦ |factor|·b."""
    return lambda b: None if b is None else abs(factor) * b


def keep_bound(b: float | None) -> float | None:
    """The bound rule of a transform that never enlarges an entry (clipping): b ↦ b."""
    return b


@functools.cache
def adam_ratio_bound(beta1: float, beta2: float) -> float | None:
    """C(β₁, β₂) = sup over steps t and all gradient sequences of ``|m̂ₜ|/√v̂ₜ``, Adam's bias-corrected moments
    (each entry separately; ``None`` where β₁² ≥ β₂, when no such bound exists).

    With mₜ = (1−β₁)Σₖ β₁ᵏ g₍ₜ₋ₖ₎ and vₜ = (1−β₂)Σₖ β₂ᵏ g²₍ₜ₋ₖ₎ (k < t), Cauchy–Schwarz on
    β₁ᵏ = (β₁/√β₂)ᵏ·√β₂ᵏ gives ``|mₜ| ≤ (1−β₁)·√((1−ρᵗ)/(1−ρ))·√(vₜ/(1−β₂))``, ρ = β₁²/β₂, so::

        |m̂ₜ|/√v̂ₜ ≤ f(t) = (1−β₁)/√(1−β₂) · √((1−ρᵗ)/(1−ρ)) · √(1−β₂ᵗ)/(1−β₁ᵗ),

    attained by gradients proportional to (β₁/β₂)ᵏ. f(1) = 1; f(∞) = (1−β₁)/√((1−β₂)(1−ρ)), 2.345 for
    the paper's β = (0.9, 0.99) and 7.27 for (0.9, 0.999). The supremum over integer t is taken on the
    host, t = 1, 2, … until ρᵗ, β₁ᵗ and β₂ᵗ are below 10⁻⁶, beyond which f stays within 10⁻⁶ of f(∞).
    A regulariser (δ inside the root, ε outside) only shrinks the ratio.
    """
    if not beta2 > beta1 * beta1:
        return None
    rho = beta1 * beta1 / beta2
    scale = (1 - beta1) / math.sqrt((1 - beta2) * (1 - rho))
    largest = max(rho, beta1, beta2)
    steps = 1 if largest == 0 else math.ceil(math.log(1e-6) / math.log(largest))
    best = 1.0
    for t in range(1, steps + 1):
        best = max(best, scale * math.sqrt((1 - rho**t) * (1 - beta2**t)) / (1 - beta1**t))
    return max(best, scale / (1 - 1e-6))


def keep_state(state: Any, rotate: Callable[[Any, int], Any]) -> Any:
    """The reframe rule of a transform whose state holds nothing in g^hor coordinates."""
    return state


# ---------------------------------------------------------------------------------------------
# the caches of the paper (eqs. 5–8)
# ---------------------------------------------------------------------------------------------


def scale_by_adam(
    beta1: float = 0.9, beta2: float = 0.99, delta: float = 3e-7, eps: float = 0.0
) -> GradientTransformation:
    """Adam's direction with the bias correction folded into the cache (eqs. 5–6 of Brantner's paper)::

        B₁ ← (β₁ − β₁ᵗ)/(1 − β₁ᵗ) · B₁ + (1 − β₁)/(1 − β₁ᵗ) · B
        B₂ ← (β₂ − β₂ᵗ)/(1 − β₂ᵗ) · B₂ + (1 − β₂)/(1 − β₂ᵗ) · B ⊙ B          (eq. 5)
        update = B₁ / (√(B₂ + δ) + ε)                                       (eq. 6, without −η)

    B₁ and B₂ are the bias-corrected moments m̂ₜ, v̂ₜ of Kingma & Ba. Two regularisers, under the
    names the ecosystem uses:

    * ``delta`` sits *inside* the root, as eq. 6 prints it (optax calls it ``eps_root``);
    * ``eps`` sits *outside* the root, as in ``torch.optim.Adam``, optax's ``eps`` and the reference
      implementation GeometricMachineLearning.jl, whose runs produced the paper's figures.

    With the paper's δ = 3·10⁻⁷ inside the root the effective ε is √δ ≈ 5.5·10⁻⁴.
    Elementwise arithmetic on a horizontal element treats a_ij and a_ji alike, so the direction of a
    skew A-block stays skew. Every entry of the direction is at most :func:`adam_ratio_bound` (β₁, β₂)
    in magnitude, whatever the gradients (the transform's ``bound``; a state rotated by a reframe rule
    is no longer such a pair of averages, and the Riemannian wrapper then ignores the bound).
    """
    b1 = check_unit_interval(beta1, "beta1")
    b2 = check_unit_interval(beta2, "beta2")
    delta = check_nonnegative(delta, "delta")
    eps = check_nonnegative(eps, "eps")
    if delta == 0 and eps == 0:
        raise ValueError("scale_by_adam needs delta > 0 (inside the root) or eps > 0 (outside): both are 0")

    def init(params: Any) -> ScaleByAdamState:
        return ScaleByAdamState(zero_count(params), zeros_like_tree(params), zeros_like_tree(params))

    def update(
        updates: Any, state: ScaleByAdamState, params: Any = None, *, donate: bool = False
    ) -> tuple[Any, ScaleByAdamState]:
        count = state.count + 1
        # B ← (β − βᵗ)/(1 − βᵗ)·B + (1 − β)/(1 − βᵗ)·g: the two factors sum to 1, so eq. 5 is the
        # interpolation B + c·(g − B) with c = (1 − β)/(1 − βᵗ) (one fused pass on torch: lerp).
        # Eager: the step counter read to the host once (Python floats, instead of ten 0-d array
        # operations per step); traced: computed on the device, once per dtype and device
        traced = not _backend.host_reads_allowed(count)
        if not traced:
            t = int(count)
            host = ((1 - b1) / (1 - b1**t), (1 - b2) / (1 - b2**t))
        coefficients: dict = {}

        def coefficient(g: Array) -> tuple:
            if not traced:
                return host
            key = (str(g.dtype), str(_backend.device(g)))
            if key not in coefficients:
                t = count_as_float(count, g)
                # computed_once: compiled, not two pows per vector of each moment's loop (eagerly nothing)
                c1, c2 = (1 - b1) / (1 - b1**t), (1 - b2) / (1 - b2**t)
                coefficients[key] = (_backend.computed_once(c1), _backend.computed_once(c2))
            return coefficients[key]

        def first(m: Array, g: Array) -> Array:
            return _backend.lerp(m, g, coefficient(g)[0], array_namespace(g))

        def second(v: Array, g: Array) -> Array:
            return _backend.lerp(v, g * g, coefficient(g)[1], array_namespace(g))

        if donate:  # the same operations in place: the moments, then the direction in the gradient's array
            return _adam_in_place(updates, state, count, coefficient, delta, eps)
        # two maps rather than one map + unflatten_up_to: torch.compile traces tree_map, not tree specs
        mu = optree.tree_map(_skip_empty(first), state.mu, updates)
        nu = optree.tree_map(_skip_empty(second), state.nu, updates)

        def direction(m: Array, v: Array) -> Array:
            root = array_namespace(v).sqrt(v + delta) if delta else array_namespace(v).sqrt(v)
            return m / (root + eps) if eps else m / root

        return optree.tree_map(_skip_empty(direction), mu, nu), ScaleByAdamState(_backend.as_array(count), mu, nu)

    def reframe(state: ScaleByAdamState, rotate: Callable[[Any, int], Any]) -> ScaleByAdamState:
        return ScaleByAdamState(state.count, rotate(state.mu, 1), rotate(state.nu, 2))

    ratio = adam_ratio_bound(b1, b2)  # whatever the input's scale: the direction is scale-free
    return GradientTransformation(init, update, reframe=reframe, bound=lambda b: ratio, elementwise=True, donates=True)


def _adam_in_place(
    updates: Any, state: ScaleByAdamState, count: Array, coefficient: Callable, delta: float, eps: float
) -> tuple[Any, ScaleByAdamState]:
    """:func:`scale_by_adam`'s update with its state and updates handed over: B₁ and B₂ written where they
    are, the gradient squared in place, then the direction written into it (the same operations, so the
    same values, as the pure update)."""

    def step(m: Array, v: Array, g: Array) -> tuple[Array, Array, Array]:
        if math.prod(g.shape) == 0:  # nothing to write (_skip_empty)
            return g, m, v
        xp = array_namespace(g)
        c1, c2 = coefficient(g)
        m = _backend.lerp_(m, g, c1, xp)
        g *= g
        v = _backend.lerp_(v, g, c2, xp)
        root = _backend.sqrt_(_backend.add_into(g, v, delta, xp), xp)  # δ = 0: √v of a copy of v
        if eps:
            root += eps
        return _backend.divide_into(root, m, root, xp), m, v

    # the returned arrays (JAX, whose arrays are immutable, returns new ones)
    triples = optree.tree_map(step, state.mu, state.nu, updates)
    spec = optree.tree_structure(updates)
    out, mu, nu = (spec.unflatten([t[k] for t in spec.flatten_up_to(triples)]) for k in range(3))
    return out, ScaleByAdamState(_backend.as_array(count), mu, nu)


def scale_by_momentum(alpha: float = 0.5) -> GradientTransformation:
    """The momentum cache of eq. 8: B_cache ← α·B_cache + B; the update is B_cache.

    The first step equals a gradient step (the cache starts at zero).
    """
    alpha = check_unit_interval(alpha, "alpha", closed=True)

    def init(params: Any) -> ScaleByMomentumState:
        return ScaleByMomentumState(zeros_like_tree(params))

    def update(updates: Any, state: ScaleByMomentumState, params: Any = None) -> tuple[Any, ScaleByMomentumState]:
        trace = optree.tree_map(lambda c, g: alpha * c + g, state.trace, updates)
        return trace, ScaleByMomentumState(trace)

    def reframe(state: ScaleByMomentumState, rotate: Callable[[Any, int], Any]) -> ScaleByMomentumState:
        return ScaleByMomentumState(rotate(state.trace, 1))

    return GradientTransformation(init, update, reframe=reframe, elementwise=True)


def scale_by_factor(transform: GradientTransformation, factor: Callable[[], Any]) -> GradientTransformation:
    """``transform`` with its output multiplied by ``factor()``, called at every update: updates ← f·T(updates),
    with ``transform``'s state (the same structure: a factor that changes between steps, such as a learning rate
    relative to the one a chain was built with, needs no new state).

    ``factor()`` is a number, or a 0-d array on the updates' device, which is never read to the host (a graph
    replayed or a jitted step takes its value of the moment). The bound of the output is ``|f|``·(the transform's
    bound) for a number, none for an array (:class:`GradientTransformation`'s ``bound``); a number 1 passes the
    updates through untouched. Elementwise if ``transform`` is (a scalar keeps entries apart)."""

    def _number(f: Any) -> bool:
        return isinstance(f, numbers.Real) and not isinstance(f, bool)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        out, state = transform.update(updates, state, params)
        f = factor()
        if _number(f) and f == 1.0:  # an array factor is not compared: that would read it
            return out, state
        return optree.tree_map(lambda u: f * u, out), state

    inner = getattr(transform, "bound", None)

    def bound(b: float | None) -> float | None:
        out = inner(b) if inner is not None else None
        if out is None:
            return None
        f = factor()
        return abs(float(f)) * out if _number(f) else None

    return GradientTransformation(
        transform.init,
        update,
        getattr(transform, "uses_params", True),
        getattr(transform, "reframe", None),
        bound,
        getattr(transform, "elementwise", False),
    )


def scale_by_learning_rate(lr: float | Callable[[Array], Any]) -> GradientTransformation:
    """updates ← −η(t)·updates: the velocity W = −η·direction of Algorithm 1.

    ``lr`` is a positive number or a schedule, a function of the step t = 1, 2, … (a floating 0-d
    array of each leaf's dtype; see :mod:`geoarray.optim.schedules`). A constant rate scales the
    transform's ``bound`` by η; a schedule keeps no bound, unless it has a ``host_value()`` method that
    gives the rate in force as a Python float (``geoarray.torch``'s rate read from a param group; None where
    that rate is a tensor, which stays on its device: no bound then). A schedule whose ``reads_step``
    attribute is False (that rate again: the value of the moment, whatever the step) is called with None.
    """
    if callable(lr):
        schedule = lr
        reads_step = getattr(schedule, "reads_step", True)

        def init(params: Any) -> ScaleByScheduleState:
            return ScaleByScheduleState(zero_count(params))

        def update(
            updates: Any, state: ScaleByScheduleState, params: Any = None, *, donate: bool = False
        ) -> tuple[Any, Any]:
            count = state.count + 1
            if reads_step:
                out = optree.tree_map(
                    _skip_empty(lambda u: _scaled(u, -schedule(count_as_float(count, u)), donate)), updates
                )
            else:  # a rate of the moment (a torch param group's): the step, cast per dtype, would go unread
                rate = schedule(None)
                out = optree.tree_map(_skip_empty(lambda u: _scaled(u, -rate, donate)), updates)
            return out, ScaleByScheduleState(_backend.as_array(count))

        host_value = getattr(schedule, "host_value", None)
        bound = None
        if callable(host_value):  # the rate that holds now, on the host: b ↦ |η|·b at this step

            def bound(b: float | None) -> float | None:
                if b is None:
                    return None
                rate = host_value()  # None: a rate kept on the device (no bound)
                return None if rate is None else abs(float(rate)) * b

        return GradientTransformation(init, update, reframe=keep_state, bound=bound, elementwise=True, donates=True)

    rate = float(as_schedule(lr)(1))

    def init_const(params: Any) -> EmptyState:
        return EmptyState()

    def update_const(
        updates: Any, state: EmptyState, params: Any = None, *, donate: bool = False
    ) -> tuple[Any, EmptyState]:
        return optree.tree_map(_skip_empty(lambda u: _scaled(u, -rate, donate)), updates), state

    return GradientTransformation(
        init_const, update_const, reframe=keep_state, bound=scaled_bound(rate), elementwise=True, donates=True
    )


def _scaled(u: Array, factor: Any, donate: bool) -> Array:
    """factor·u, written into u where it was handed over (``donate``)."""
    if not donate:
        return factor * u
    u *= factor
    return u


def add_decayed_weights(weight_decay: float) -> GradientTransformation:
    """updates ← updates + λ·params: the gradient of (λ/2)‖params‖² added to the direction.

    Chained before the learning-rate scale this is L2 regularisation folded into the direction
    (after ``scale_by_adam``: decoupled weight decay as in AdamW). Inside
    :func:`~geoarray.optim.riemannian` a manifold leaf's ``params`` is the lift of the Riemannian
    gradient of ½‖Y‖²_F, so the decay is a tangent direction and the retraction keeps the weight on
    its manifold (on Stiefel and Grassmann ‖Y‖_F is constant and the decay vanishes).
    """
    wd = check_nonnegative(weight_decay, "weight_decay")

    def init(params: Any) -> AddDecayedWeightsState:
        return AddDecayedWeightsState()

    def update(updates: Any, state: AddDecayedWeightsState, params: Any = None) -> tuple[Any, Any]:
        if params is None:
            raise ValueError("add_decayed_weights needs params: call update(updates, state, params)")
        return optree.tree_map(lambda u, p: u + wd * p, updates, params), state

    return GradientTransformation(init, update, uses_params=True, reframe=keep_state, elementwise=True)


def global_norm(tree: Any) -> Array:
    """‖tree‖ = √(Σ ⟨u, u⟩) over its units: the canonical metric of g^hor on horizontal elements
    (½tr(XᵀX), every independent entry once), the Euclidean one on arrays."""
    units, _ = _units(tree)
    if not units:
        raise ValueError("global_norm of a tree without arrays")
    total = None
    for u in units:
        if isinstance(u, HorizontalElement):
            sq = array_namespace(*u).sum(u.inner(u))
        else:
            sq = array_namespace(u).sum(u * u)
        total = _backend.as_array(sq if total is None else total + sq)
    return _backend.as_array(array_namespace(total).sqrt(total))


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """updates ← updates · min(1, max_norm / ‖updates‖) with :func:`global_norm`.

    On manifold leaves the norm is the metric of g^hor, so clipping a lifted gradient clips its
    Riemannian norm and the clipped update stays horizontal (the retraction keeps the weight on its
    manifold).
    """
    check_positive(max_norm, "max_norm")
    max_norm = float(max_norm)

    def init(params: Any) -> ClipByGlobalNormState:
        return ClipByGlobalNormState()

    def update(updates: Any, state: ClipByGlobalNormState, params: Any = None) -> tuple[Any, Any]:
        norm = global_norm(updates)
        xp = array_namespace(norm)
        # where() keeps the division away from a zero norm without a host branch
        safe = xp.where(norm > max_norm, norm, xp.ones_like(norm) * max_norm)
        factor = max_norm / safe
        return optree.tree_map(lambda u: u * xp.astype(factor, u.dtype), updates), state

    return GradientTransformation(init, update, reframe=keep_state, bound=keep_bound)


# ---------------------------------------------------------------------------------------------
# BFGS
# ---------------------------------------------------------------------------------------------


def _metric_weights(u: Any) -> tuple[float, ...]:
    return tuple(u.metric_weights) if isinstance(u, HorizontalElement) else (1.0,)


def _batch_ndim(u: Any) -> int:
    """Leading dims that index separate weights (a stacked manifold group); none for arrays."""
    return len(u.batch_shape) if isinstance(u, HorizontalElement) else 0


def _to_vector(u: Any, xp: Any) -> Array:
    """Coordinates x̃ (..., d) in which the metric of g^hor is the Euclidean dot product."""
    k = _batch_ndim(u)
    fields = tuple(u) if isinstance(u, HorizontalElement) else (u,)
    parts = [
        math.sqrt(w) * xp.reshape(f, (*tuple(f.shape[:k]), -1)) for f, w in zip(fields, _metric_weights(u), strict=True)
    ]
    return xp.concat(parts, axis=-1)


def _from_vector(x: Array, like: Any, xp: Any) -> Any:
    k = _batch_ndim(like)
    fields = tuple(like) if isinstance(like, HorizontalElement) else (like,)
    out, offset = [], 0
    for f, w in zip(fields, _metric_weights(like), strict=True):
        size = math.prod(f.shape[k:])
        out.append(xp.reshape(x[..., offset : offset + size], tuple(f.shape)) / math.sqrt(w))
        offset += size
    return type(like)(*out) if isinstance(like, HorizontalElement) else out[0]


def scale_by_bfgs(lr: float | Callable[[Array], Any], curvature_eps: float = 1e-10) -> GradientTransformation:
    """BFGS in the coordinates of g^hor: the step W = −η·H·B (the learning rate is part of it).

    The state holds the previous lifted gradient B_prev, the previous step s = W_prev (the step that
    led to the current point, so (s, y) with y = B − B_prev are correctly paired) and the inverse
    Hessian approximation H per unit, in coordinates where the canonical metric of g^hor is
    Euclidean. At step t ≥ 2,

        ρ = 1/⟨s, y⟩,   H ← (I − ρ s yᵀ) H (I − ρ y sᵀ) + ρ s sᵀ

    when the curvature condition ⟨s, y⟩ > ``curvature_eps``·‖s‖‖y‖ holds (otherwise H is kept);
    before the first update H is scaled to ⟨s, y⟩/⟨y, y⟩·I (Nocedal & Wright, eq. 6.20). The first
    step is a gradient step. η belongs inside the transform because s must be the step actually
    taken: the update of H is not invariant under rescaling s.

    Frames: no ``reframe`` rule — s and y would rotate exactly, but H lives in the vectorised
    coordinates and would need the dense (N−n)×(N−n) rotation; use the transported section.
    """
    schedule = as_schedule(lr)
    check_positive(curvature_eps, "curvature_eps")
    curvature_eps = float(curvature_eps)

    def init(params: Any) -> ScaleByBFGSState:
        units, treedef = _units(params)
        hs = []
        for u in units:
            xp = array_namespace(*optree.tree_leaves(u))
            x = _to_vector(u, xp)
            d = x.shape[-1]
            dev = _backend.device(x)
            eye = xp.eye(d, dtype=x.dtype, device=dev)
            blank = xp.zeros((*x.shape[:-1], d, d), dtype=x.dtype, device=dev)
            hs.append(xp.broadcast_to(eye, (*x.shape[:-1], d, d)) + blank)
        prev_grad, prev_step = zeros_like_tree(params), zeros_like_tree(params)
        return ScaleByBFGSState(zero_count(params), prev_grad, prev_step, treedef.unflatten(hs))

    def unit_step(B: Any, B_prev: Any, S_prev: Any, H: Array, count: Array) -> tuple[Any, Array]:
        xp = array_namespace(*optree.tree_leaves(B))
        g = _to_vector(B, xp)
        t = count_as_float(count, g)
        s = _to_vector(S_prev, xp)
        y = g - _to_vector(B_prev, xp)
        sy = xp.sum(s * y, axis=-1)
        yy = xp.sum(y * y, axis=-1)
        ss = xp.sum(s * s, axis=-1)
        do_update = xp.logical_and(t > 1, sy > curvature_eps * xp.sqrt(ss * yy))
        safe_sy = xp.where(do_update, sy, xp.ones_like(sy))
        rho = (1 / safe_sy)[..., None, None]
        first = xp.logical_and(do_update, t < 2.5)  # the first update scales H₀ = (sᵀy / yᵀy) I
        scale = xp.where(first, safe_sy / xp.where(first, yy, xp.ones_like(yy)), xp.ones_like(sy))
        H0 = H * scale[..., None, None]
        Hy = (H0 @ y[..., None])[..., 0]
        yHy = xp.sum(y * Hy, axis=-1)[..., None, None]
        s_col, Hy_col = s[..., :, None], Hy[..., :, None]
        mT = xp.matrix_transpose
        # (I − ρsyᵀ)H(I − ρysᵀ) + ρssᵀ, expanded: H − ρ(s(Hy)ᵀ + (Hy)sᵀ) + (ρ²yᵀHy + ρ)ssᵀ
        H_new = H0 - rho * (s_col @ mT(Hy_col) + Hy_col @ mT(s_col)) + (rho * rho * yHy + rho) * (s_col @ mT(s_col))
        H = xp.where(do_update[..., None, None], H_new, H)
        direction = -schedule(t) * (H @ g[..., None])[..., 0]
        return _from_vector(direction, B, xp), H

    def update(updates: Any, state: ScaleByBFGSState, params: Any = None) -> tuple[Any, ScaleByBFGSState]:
        count = state.count + 1
        units, treedef = _units(updates)
        prev_g = treedef.flatten_up_to(state.prev_grad)
        prev_s = treedef.flatten_up_to(state.prev_step)
        hs = treedef.flatten_up_to(state.hessian_inv)
        steps, new_h = [], []
        for u, bp, sp, h in zip(units, prev_g, prev_s, hs, strict=True):
            w, h = unit_step(u, bp, sp, h, count)
            steps.append(w)
            new_h.append(h)
        W = treedef.unflatten(steps)
        return W, ScaleByBFGSState(_backend.as_array(count), updates, W, treedef.unflatten(new_h))

    return GradientTransformation(init, update)
