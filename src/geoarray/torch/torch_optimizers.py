"""``geoarray.torch.Adam``, ``AdamW``, ``SGD``, ``RMSprop``, ``Adagrad``, ``Adamax``, ``NAdam`` and
``RAdam``: torch's signatures, defaults and formulas.

A ``torch.optim.Adam(...)``/``AdamW(...)``/``SGD(...)``/``RMSprop(...)``/… line changed only in its
module gives torch's results on plain tensors (tested equal to ``torch.optim`` to 1e-12 relative in
float64, several steps, every option below) and runs the same formulas on the lifted gradient B ∈ g^hor
of every :class:`~geoarray.torch.ManifoldParameter` (Algorithm 1 of Brantner, *Generalizing Adam to
Manifolds for Efficiently Training Transformers*: Riemannian gradient → lift → torch's cache update →
retraction). The transforms are :func:`geoarray.optim.torch_rules.scale_by_torch_adam`,
:func:`~geoarray.optim.torch_rules.scale_by_torch_sgd`,
:func:`~geoarray.optim.torch_rules.scale_by_torch_rmsprop`,
:func:`~geoarray.optim.torch_rules.scale_by_torch_adagrad`,
:func:`~geoarray.optim.torch_rules.scale_by_torch_adamax`,
:func:`~geoarray.optim.torch_rules.scale_by_torch_nadam` and
:func:`~geoarray.optim.torch_rules.scale_by_torch_radam` (their docstrings hold the update rules).

* **weight decay** — coupled (``Adam``/``SGD``: λθ added to the gradient) or decoupled (``AdamW``,
  ``decoupled_weight_decay=True``: θ ← θ(1 − lr·λ)); on a manifold parameter θ is the lift of the
  gradient of ½‖Y‖², a tangent direction (on Stiefel and Grassmann ‖Y‖ is constant and the decay
  vanishes, so it reaches plain tensors only).
* ``amsgrad``, ``maximize``, ``nesterov``, ``dampening``, ``centered``, ``initial_accumulator_value``:
  torch's meanings.
* ``lr``, ``betas``, ``eps``, ``weight_decay``, ``momentum``, ``dampening`` (and ``delta``; RMSprop's
  ``alpha``, Adagrad's ``lr_decay``, NAdam's ``momentum_decay``) are read from the param group at every
  step: LR schedulers, OneCycleLR's and CyclicLR's momentum cycling and
  edits of ``param_groups`` take effect at the next step without building a new core. Changing
  ``amsgrad``, ``maximize``, ``nesterov``, ``decoupled_weight_decay``, ``centered``, ``foreach`` or the
  core's options, or a weight decay or momentum from zero to non-zero, builds a new core for the group
  and keeps its state (a change that needs another state — ``amsgrad``, ``centered``, momentum switched
  on — is refused).
* ``foreach``: the core always updates same-shaped parameters in batched calls (what foreach does);
  ``foreach=False`` updates every parameter by its own call (``group_same_shape=False``).
  ``fused=True`` and ``differentiable=True`` are not supported and raise a ``ValueError`` saying why;
  their ``False``/``None`` values are accepted.
* ``capturable=True``: torch's meaning, for every geoarray.torch optimizer
  (:class:`geoarray.torch.Optimizer`); ``SGD`` and ``Adagrad`` take it in a param group, as torch's
  have no such argument.
* ``stabilize`` (geoopt's option, so that geoopt code ports by swapping the classes): every
  ``stabilize`` steps of a group its ManifoldParameters are projected to the nearest point
  (:func:`geoarray.torch.project_`). Rarely needed: the retraction keeps them on the manifold to
  rounding; the caches live in g^hor and need no projection.

**The paper's variant** is :class:`geoarray.torch.PaperAdam` (the paper's β = (0.9, 0.99), δ = 3·10⁻⁷
inside the root, ε = 0, the core's measured defaults; it was ``geoarray.torch.Adam`` before this
class took torch's conventions). ``Adam(..., delta=3e-7, eps=0, betas=(0.9, 0.99))`` computes the
same update. Learning rates: the second moment is kept per coordinate of g^hor, as torch keeps it per
entry; geoopt's ``RiemannianAdam`` keeps one per matrix, so its rates do not carry over (see the
migration guide, docs/migrating_from_geoopt_geotorch.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import optim as _optim
from ..optim import torch_rules as _rules
from ..optim import transforms as _t
from ..optim.riemannian import RiemannianOptimizer
from .optimizer import Optimizer, Recipe
from .param_groups import group_core_options, group_defaults, live, live_or_zero

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop"]


def _check_flags(group: dict, name: str) -> None:
    """torch's implementation switches: accepted where they mean something here, else a clear error."""
    if group.get("fused"):
        raise ValueError(
            f"{name}(fused=True) is not supported: torch's fused kernels update plain CUDA tensors entrywise, "
            "while geoarray's step lifts manifold gradients to g^hor and retracts; leave fused=None (the core "
            "already updates same-shaped parameters in batched calls)"
        )
    if group.get("differentiable"):
        raise ValueError(
            f"{name}(differentiable=True) is not supported: the step runs under torch.no_grad() and writes the "
            "parameters in place, so autograd cannot differentiate through it; leave differentiable=False"
        )
    foreach = group.get("foreach")
    if foreach not in (None, True, False):
        raise ValueError(f"foreach must be None, True or False, got {foreach!r}")


def _number(group: dict, key: str, gi: Any, *, unit: bool = False, index: int | None = None) -> float:
    value = group[key] if index is None else group[key][index]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    where = f"param_groups[{gi}]['{key}']" + ("" if index is None else f"[{index}]")
    # comparisons, not math.isfinite: under torch.compile a value can be a SymFloat (dynamo makes a float
    # symbolic once it has seen it change, as when two optimizers' steps are compiled in one process)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
    if not ok or (unit and not value < 1):
        raise ValueError(f"{where} must be a number in {'[0, 1)' if unit else '[0, ∞)'}, got {value!r}")
    return float(value)


def _flag(group: dict, key: str, gi: Any) -> None:
    # torch.optim takes any truthy value here; a string such as "no" would switch the flag on silently
    if not isinstance(group[key], bool):
        raise TypeError(f"param_groups[{gi}]['{key}'] must be a bool, got {group[key]!r}")


#: read from the param group at every step (schedulers, momentum cycling): no new core when they change
_LIVE = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "delta", "stabilize")
#: zero or not: the shape of the chain (no decay, no momentum buffer, no δ), so two cores
_ZERO_MATTERS = ("weight_decay", "momentum", "delta")


@dataclasses.dataclass(frozen=True)
class _TorchChecks:
    """A torch-convention recipe's ``check``: torch's implementation switches (``fused``, ``differentiable``,
    ``foreach``; not while dynamo traces, which shows them otherwise), the method's own hyperparameters
    (``live(group, gi)``) and ``stabilize``. A module-level class, so that the recipe pickles."""

    live: Callable[[dict, Any], None]

    def __call__(self, group: dict, gi: Any, name: str) -> None:
        if not torch.compiler.is_compiling():
            # capturable is not in the key (torch.compile shows it True while tracing): checked here
            _check_flags(group, name)
        self.live(group, gi)
        every = group.get("stabilize")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            where = "stabilize" if gi == "new" else f"param_groups[{gi}]['stabilize']"  # "new": the constructor's
            raise ValueError(f"{where} must be None or a positive int (project every that many steps), got {every!r}")


def _check_betas(group: dict, gi: Any) -> None:
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"param_groups[{gi}]['betas'] must be a pair (beta1, beta2), got {betas!r}")
    _number(group, "betas", gi, unit=True, index=0)
    _number(group, "betas", gi, unit=True, index=1)


def _check_eps(group: dict, gi: Any) -> None:
    """ε > 0: with ε = 0 a zero gradient entry divides 0 by 0 (torch accepts it and writes NaN)."""
    if _number(group, "eps", gi) == 0:
        raise ValueError(f"param_groups[{gi}]['eps'] must be > 0 (a zero gradient entry would divide 0 by 0), got 0")


def _torch_chain(opt: Any, group: dict, rule: _t.GradientTransformation) -> RiemannianOptimizer:
    """Algorithm 1 around torch's sign, rule and learning rate: scale(±1) in every chain, so that switching
    ``maximize`` keeps the state's structure."""
    sign = _rules.scale(-1.0 if group["maximize"] else 1.0)
    transform = _t.chain(sign, rule, _t.scale_by_learning_rate(live(opt, group)))
    return _optim.riemannian(transform, **group_core_options(group))


def _adam_live(group: dict, gi: Any) -> None:
    _check_betas(group, gi)
    eps, delta = _number(group, "eps", gi), _number(group, "delta", gi)
    _number(group, "weight_decay", gi)
    if eps == 0 and delta == 0:
        raise ValueError(f"param_groups[{gi}]: eps (outside the root) or delta (inside) must be > 0; both are 0")
    for key in ("amsgrad", "maximize", "decoupled_weight_decay"):
        _flag(group, key, gi)


def _adam_core(opt: Any, group: dict) -> RiemannianOptimizer:
    adam = _rules.scale_by_torch_adam(
        live(opt, group, "betas", 0),
        live(opt, group, "betas", 1),
        live(opt, group, "eps"),
        delta=live_or_zero(opt, group, "delta"),
        amsgrad=bool(group["amsgrad"]),
        weight_decay=live_or_zero(opt, group, "weight_decay"),
        decoupled_weight_decay=bool(group["decoupled_weight_decay"]),
    )
    return _torch_chain(opt, group, adam)


ADAM_RECIPE = Recipe(_adam_core, live=_LIVE, check=_TorchChecks(_adam_live), zero_matters=_ZERO_MATTERS)


class Adam(Optimizer):
    """``torch.optim.Adam`` (same signature, defaults and update) on plain tensors and ManifoldParameters.

    θ ← θ − lr·m̂ₜ/(√v̂ₜ + ε) with torch's bias corrections, coupled weight decay (``weight_decay``),
    or decoupled (``decoupled_weight_decay=True``, AdamW), ``amsgrad`` and ``maximize``; on a
    ManifoldParameter the same formulas run in g^hor and the step is a retraction (module docstring).
    ``delta`` (keyword only, default 0) adds δ inside the square root as eq. 6 of Brantner's paper
    prints it; :class:`geoarray.torch.PaperAdam` is the paper's variant with its defaults. The options
    ``section``, ``retraction``, ``on_nonfinite``, ``group_same_shape``, ``seed``, ``chunk_bytes`` are those of
    :class:`geoarray.optim.RiemannianOptimizer`.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
        delta: float = 0.0,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(params, ADAM_RECIPE, group_defaults(locals()), skip_together=skip_together)


class AdamW(Adam):
    """``torch.optim.AdamW``: :class:`Adam` with decoupled weight decay θ ← θ(1 − lr·λ), λ = 1e-2 by
    default (Loshchilov & Hutter, *Decoupled weight decay regularization*). On a ManifoldParameter
    the decay is the lift of the gradient of ½‖Y‖² (zero on Stiefel and Grassmann)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        delta: float = 0.0,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
            capturable=capturable, differentiable=differentiable, fused=fused, decoupled_weight_decay=True,
            delta=delta, stabilize=stabilize, section=section, retraction=retraction, on_nonfinite=on_nonfinite,
            group_same_shape=group_same_shape, seed=seed, chunk_bytes=chunk_bytes, skip_together=skip_together,
        )  # fmt: skip


def _sgd_live(group: dict, gi: Any) -> None:
    momentum, dampening = _number(group, "momentum", gi), _number(group, "dampening", gi)
    _number(group, "weight_decay", gi)
    _flag(group, "nesterov", gi)
    _flag(group, "maximize", gi)
    if group["nesterov"] and (momentum <= 0 or dampening != 0):
        raise ValueError(f"param_groups[{gi}]: nesterov momentum requires a momentum > 0 and zero dampening")


def _sgd_core(opt: Any, group: dict) -> RiemannianOptimizer:
    sgd = _rules.scale_by_torch_sgd(
        live_or_zero(opt, group, "momentum"),
        live(opt, group, "dampening"),
        bool(group["nesterov"]),
        live_or_zero(opt, group, "weight_decay"),
    )
    return _torch_chain(opt, group, sgd)


SGD_RECIPE = Recipe(_sgd_core, live=_LIVE, check=_TorchChecks(_sgd_live), zero_matters=_ZERO_MATTERS)


class SGD(Optimizer):
    """``torch.optim.SGD`` (same signature, defaults and update) on plain tensors and ManifoldParameters.

    d = g + λθ; with momentum μ: b₁ = d, bₜ = μbₜ₋₁ + (1 − τ)d, and the step −lr·(d + μbₜ) (Nesterov)
    or −lr·bₜ (:func:`geoarray.optim.torch_rules.scale_by_torch_sgd`); ``maximize`` ascends. On a
    ManifoldParameter d is the lifted gradient in g^hor and the step a retraction. (The paper's
    momentum, eq. 8 without dampening or Nesterov, is :class:`geoarray.torch.Momentum`.)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(params, SGD_RECIPE, group_defaults(locals()), skip_together=skip_together)


# -- torch.optim's other adaptive methods: RMSprop, Adagrad, Adamax, NAdam, RAdam ------------------------------


def _rmsprop_live(group: dict, gi: Any) -> None:
    _number(group, "alpha", gi, unit=True)
    _check_eps(group, gi)
    _number(group, "weight_decay", gi)
    _number(group, "momentum", gi)
    for key in ("centered", "maximize"):
        _flag(group, key, gi)


def _rmsprop_core(opt: Any, group: dict) -> RiemannianOptimizer:
    rule = _rules.scale_by_torch_rmsprop(
        live(opt, group, "alpha"),
        live(opt, group, "eps"),
        live_or_zero(opt, group, "weight_decay"),
        live_or_zero(opt, group, "momentum"),
        bool(group["centered"]),
    )
    return _torch_chain(opt, group, rule)


RMSPROP_RECIPE = Recipe(
    _rmsprop_core, live=(*_LIVE, "alpha"), check=_TorchChecks(_rmsprop_live), zero_matters=_ZERO_MATTERS
)


class RMSprop(Optimizer):
    """``torch.optim.RMSprop`` (same signature, defaults and update) on plain tensors and ManifoldParameters.

    vₜ = αvₜ₋₁ + (1 − α)g⊙g, the step −lr·g ⊘ (√vₜ + ε); ``centered`` subtracts the square of the running
    mean of g inside the root, ``momentum`` μ > 0 accumulates bₜ = μbₜ₋₁ + g ⊘ (…) and steps −lr·bₜ,
    ``weight_decay`` is coupled and ``maximize`` ascends
    (:func:`geoarray.optim.torch_rules.scale_by_torch_rmsprop`). On a ManifoldParameter g is the lifted
    gradient in g^hor, the state (``square_avg``, ``grad_avg``, ``momentum_buffer``) lives there and the
    step is a retraction (Algorithm 1; module docstring). ``lr``, ``alpha``, ``eps``, ``weight_decay`` and
    ``momentum`` are read from the param group at every step (LR schedulers; OneCycleLR's and CyclicLR's
    momentum cycling, which writes ``momentum``); switching ``momentum`` between 0 and non-zero, or
    ``centered``, after the first step needs another state and is refused, as torch's RMSprop fails then.
    ``alpha`` lies in [0, 1) and ``eps`` must be > 0 (torch takes α > 1 and ε = 0, which give NaN).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        *,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(params, RMSPROP_RECIPE, group_defaults(locals()), skip_together=skip_together)


def _adagrad_live(group: dict, gi: Any) -> None:
    _number(group, "lr_decay", gi)
    _number(group, "weight_decay", gi)
    start = _number(group, "initial_accumulator_value", gi)
    if _number(group, "eps", gi) == 0 and start == 0:
        raise ValueError(
            f"param_groups[{gi}]: eps and initial_accumulator_value are both 0, so a zero gradient entry would "
            "divide 0 by 0; make one of them > 0"
        )
    _flag(group, "maximize", gi)


def _adagrad_core(opt: Any, group: dict) -> RiemannianOptimizer:
    rule = _rules.scale_by_torch_adagrad(
        live_or_zero(opt, group, "lr_decay"),
        live_or_zero(opt, group, "weight_decay"),
        _number(group, "initial_accumulator_value", "new"),
        live(opt, group, "eps"),
    )
    return _torch_chain(opt, group, rule)


ADAGRAD_RECIPE = Recipe(
    _adagrad_core,
    live=(*_LIVE, "lr_decay"),
    check=_TorchChecks(_adagrad_live),
    zero_matters=(*_ZERO_MATTERS, "lr_decay"),  # zero: no pass that divides by 1 + (t − 1)·0
)


class Adagrad(Optimizer):
    """``torch.optim.Adagrad`` (same signature, defaults and update) on plain tensors and ManifoldParameters.

    sₜ = sₜ₋₁ + g⊙g from s₀ = ``initial_accumulator_value``, the step −clr·g ⊘ (√sₜ + ε) with
    clr = lr/(1 + (t − 1)·``lr_decay``) (a function of the step count only), coupled ``weight_decay``,
    ``maximize`` (:func:`geoarray.optim.torch_rules.scale_by_torch_adagrad`). On a ManifoldParameter g
    is the lifted gradient in g^hor, ``sum`` lives there and the step is a retraction (module docstring).
    ``lr``, ``lr_decay``, ``eps`` and ``weight_decay`` are read from the param group at every step;
    ``initial_accumulator_value`` fills the state when it is made, as in torch. As torch's ``SGD``,
    torch's Adagrad has no ``capturable`` argument: a param group may set it. ``fused=True`` is refused
    (module docstring); ``eps`` may be 0 only with a positive ``initial_accumulator_value``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(params, ADAGRAD_RECIPE, group_defaults(locals()), skip_together=skip_together)


def _adamax_live(group: dict, gi: Any) -> None:
    _check_betas(group, gi)
    _check_eps(group, gi)
    _number(group, "weight_decay", gi)
    _flag(group, "maximize", gi)


def _adamax_core(opt: Any, group: dict) -> RiemannianOptimizer:
    rule = _rules.scale_by_torch_adamax(
        live(opt, group, "betas", 0),
        live(opt, group, "betas", 1),
        live(opt, group, "eps"),
        live_or_zero(opt, group, "weight_decay"),
    )
    return _torch_chain(opt, group, rule)


ADAMAX_RECIPE = Recipe(_adamax_core, live=_LIVE, check=_TorchChecks(_adamax_live), zero_matters=_ZERO_MATTERS)


class Adamax(Optimizer):
    """``torch.optim.Adamax`` (same signature, defaults and update) on plain tensors and ManifoldParameters.

    mₜ = β₁mₜ₋₁ + (1 − β₁)g, uₜ = max(β₂uₜ₋₁, abs(g) + ε), the step −lr·(mₜ/(1 − β₁ᵗ)) ⊘ uₜ; coupled
    ``weight_decay``, ``maximize`` (:func:`geoarray.optim.torch_rules.scale_by_torch_adamax`; Kingma & Ba,
    *Adam*, Algorithm 2). On a ManifoldParameter g is the lifted gradient in g^hor, ``exp_avg`` and
    ``exp_inf`` live there and the step is a retraction (module docstring). ``lr``, ``betas``, ``eps`` and
    ``weight_decay`` are read from the param group at every step; ``eps`` must be > 0.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(params, ADAMAX_RECIPE, group_defaults(locals()), skip_together=skip_together)


def _nadam_live(group: dict, gi: Any) -> None:
    _check_betas(group, gi)
    _check_eps(group, gi)
    _number(group, "weight_decay", gi)
    _number(group, "momentum_decay", gi)
    for key in ("maximize", "decoupled_weight_decay"):
        _flag(group, key, gi)


def _nadam_core(opt: Any, group: dict) -> RiemannianOptimizer:
    rule = _rules.scale_by_torch_nadam(
        live(opt, group, "betas", 0),
        live(opt, group, "betas", 1),
        live(opt, group, "eps"),
        live_or_zero(opt, group, "weight_decay"),
        live(opt, group, "momentum_decay"),
        bool(group["decoupled_weight_decay"]),
    )
    return _torch_chain(opt, group, rule)


NADAM_RECIPE = Recipe(
    _nadam_core, live=(*_LIVE, "momentum_decay"), check=_TorchChecks(_nadam_live), zero_matters=_ZERO_MATTERS
)


class NAdam(Optimizer):
    """``torch.optim.NAdam`` (same signature, defaults and update) on plain tensors and ManifoldParameters.

    Adam's moments with Nesterov's look-ahead: μₜ = β₁(1 − ½·0.96^(t·ψ)) (ψ = ``momentum_decay``), and the
    step −lr·[(1 − μₜ)/(1 − Πₜ)·g + μₜ₊₁/(1 − Πₜμₜ₊₁)·mₜ] ⊘ (√v̂ₜ + ε) with Πₜ = μ₁⋯μₜ; coupled
    ``weight_decay`` or decoupled (``decoupled_weight_decay=True``: θ ← θ(1 − lr·λ), NAdamW),
    ``maximize`` (:func:`geoarray.optim.torch_rules.scale_by_torch_nadam`; Dozat, *Incorporating Nesterov
    momentum into Adam*). On a ManifoldParameter g is the lifted gradient in g^hor, the moments live
    there and the step is a retraction (module docstring). ``lr``, ``betas``, ``eps``, ``weight_decay``
    and ``momentum_decay`` are read from the param group at every step (a β₁ cycled by OneCycleLR enters
    Πₜ step by step, as in torch). ``opt.state[p]`` holds ``exp_avg``, ``exp_avg_sq`` and ``step``;
    torch's ``mu_product`` is one 0-d tensor per batched state (all parameters of a cohort share it:
    they step together), kept in the parameters' dtype — torch keeps it in its default scalar dtype
    (float32 unless the default dtype is float64), so float64 parameters under a float32 default differ
    from torch.optim.NAdam's by about 1e-9 (measured 9.9e-10 over 8 and 100 steps at lr 0.05), not 1e-12.
    ``eps`` must be > 0.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(params, NADAM_RECIPE, group_defaults(locals()), skip_together=skip_together)


def _radam_live(group: dict, gi: Any) -> None:
    _check_betas(group, gi)
    _check_eps(group, gi)
    _number(group, "weight_decay", gi)
    for key in ("maximize", "decoupled_weight_decay"):
        _flag(group, key, gi)


def _radam_core(opt: Any, group: dict) -> RiemannianOptimizer:
    rule = _rules.scale_by_torch_radam(
        live(opt, group, "betas", 0),
        live(opt, group, "betas", 1),
        live(opt, group, "eps"),
        live_or_zero(opt, group, "weight_decay"),
        bool(group["decoupled_weight_decay"]),
    )
    return _torch_chain(opt, group, rule)


RADAM_RECIPE = Recipe(_radam_core, live=_LIVE, check=_TorchChecks(_radam_live), zero_matters=_ZERO_MATTERS)


class RAdam(Optimizer):
    """``torch.optim.RAdam`` (same signature, defaults and update) on plain tensors and ManifoldParameters.

    Adam's moments with the variance rectification of Liu et al. (*On the variance of the adaptive learning
    rate and beyond*): while the length ρₜ of the approximated simple moving average is ≤ 5 the step is
    −lr·m̂ₜ (with torch's β₂ = 0.999 the first 5 steps), after it −lr·rₜ·m̂ₜ·√(1 − β₂ᵗ) ⊘ (√vₜ + ε), where
    ρₜ and rₜ depend on the step count and β₂ only; coupled ``weight_decay`` or decoupled
    (``decoupled_weight_decay=True``: θ ← θ(1 − lr·λ)), ``maximize``
    (:func:`geoarray.optim.torch_rules.scale_by_torch_radam`). On a ManifoldParameter g is the lifted
    gradient in g^hor, the moments live there and the step is a retraction (module docstring). ``lr``,
    ``betas``, ``eps`` and ``weight_decay`` are read from the param group at every step; ``eps`` must be > 0.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        stabilize: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
    ):
        super().__init__(params, RADAM_RECIPE, group_defaults(locals()), skip_together=skip_together)
