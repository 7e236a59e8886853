"""geoarray.torch's convenience optimizers on the paper's methods: ``Gradient``, ``Momentum``,
``PaperAdam``, ``AdamWithDecay`` (Brantner, *Generalizing Adam to Manifolds for Efficiently Training
Transformers*, eqs. 5–8) and ``ManifoldMuon``/``Muon``: constructors of :class:`geoarray.torch.Optimizer`
that turn their arguments into a param group's defaults and hand it a :class:`~geoarray.torch.Recipe`,
the function that builds a group's core from its hyperparameters. torch's own conventions (``Adam``,
``AdamW``, ``SGD``, …) are in :mod:`geoarray.torch.torch_optimizers`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

import torch

from .. import optim as _optim
from ..optim.riemannian import RiemannianOptimizer
from .optimizer import Optimizer, Recipe
from .param_groups import (
    BOOKKEEPING,
    LiveHyperparameter,
    group_core_options,
    group_defaults,
    is_group_of,
    live,
    register,
)

__all__ = ["AdamWithDecay", "BrantnerAdam", "Gradient", "ManifoldMuon", "Momentum", "Muon", "PaperAdam"]


def _gradient(opt: Any, group: dict) -> RiemannianOptimizer:
    return _optim.Gradient(live(opt, group), **group_core_options(group))


def _momentum(opt: Any, group: dict) -> RiemannianOptimizer:
    return _optim.Momentum(live(opt, group), group["alpha"], **group_core_options(group))


def _paper_adam(opt: Any, group: dict) -> RiemannianOptimizer:
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    return _optim.Adam(
        live(opt, group), betas[0], betas[1], group["delta"], eps=group["eps"], **group_core_options(group)
    )


def _adam_with_decay(opt: Any, group: dict) -> RiemannianOptimizer:
    b1, b2 = group["betas"]
    core = _optim.AdamWithDecay(
        group["n_steps"],
        group["lr_start"],
        group["lr_end"],
        b1,
        b2,
        group["delta"],
        n_epochs=group["n_epochs"],
        steps_per_epoch=group["steps_per_epoch"],
        **group_core_options(group),
    )
    factor = live(opt, group)
    if callable(factor):
        factor.reference = float(group["lr_start"])
        return core.scaled_by(factor)
    return core


GRADIENT_RECIPE = Recipe(_gradient)
MOMENTUM_RECIPE = Recipe(_momentum)
# Adam's state is (count, mu, nu) whatever betas, delta and eps are
PAPER_ADAM_RECIPE = Recipe(_paper_adam, state_free=("lr", "betas", "delta", "eps", "chunk_bytes"))
ADAM_WITH_DECAY_RECIPE = Recipe(_adam_with_decay)


class Gradient(Optimizer):
    """Riemannian gradient descent, W = −η B (:class:`geoarray.optim.Gradient`), as a ``torch.optim.Optimizer``.

    Options ``section``, ``retraction``, ``on_nonfinite``, ``group_same_shape``, ``seed``, ``chunk_bytes`` are those of
    :class:`geoarray.optim.RiemannianOptimizer` and may differ per param group.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        *,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
        capturable: bool = False,
    ):
        defaults = group_defaults(locals(), leave_out=("capturable",))  # capturable: the optimizer's own
        super().__init__(params, GRADIENT_RECIPE, defaults, skip_together=skip_together, capturable=capturable)


class Momentum(Optimizer):
    """Momentum, B_cache ← α B_cache + B, W = −η B_cache (eq. 8; :class:`geoarray.optim.Momentum`)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        alpha: float = 0.5,
        *,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
        capturable: bool = False,
    ):
        defaults = group_defaults(locals(), leave_out=("capturable",))  # capturable: the optimizer's own
        super().__init__(params, MOMENTUM_RECIPE, defaults, skip_together=skip_together, capturable=capturable)


class PaperAdam(Optimizer):
    """Adam on g^hor exactly as Brantner's paper writes it (eqs. 5–6; :class:`geoarray.optim.Adam`)
    as a ``torch.optim.Optimizer``: the paper's variant of :class:`geoarray.torch.Adam`.

    ``betas = (β₁, β₂)`` as in ``torch.optim.Adam``; ``delta`` sits inside the square root as eq. 6
    prints it, ``eps`` outside as in torch (W = −η B₁ / (√(B₂ + δ) + ε)). Defaults are the paper's
    Table 1 (β = (0.9, 0.99), δ = 3·10⁻⁷, ε = 0), chosen by the core's multi-seed measurements (see
    :class:`geoarray.optim.Adam`). Until this release ``geoarray.torch.Adam`` was this class; it now
    takes ``torch.optim.Adam``'s arguments and defaults, and ``PaperAdam(params, lr)`` is the old
    ``Adam(params, lr)`` unchanged. Changing ``betas``/``delta``/``eps`` in a group builds a new core
    (:class:`geoarray.torch.Adam` reads them at every step), which keeps the moments.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.99),
        delta: float = 3e-7,
        eps: float = 0.0,
        *,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
        capturable: bool = False,
    ):
        defaults = group_defaults(locals(), leave_out=("capturable",))  # capturable: the optimizer's own
        super().__init__(params, PAPER_ADAM_RECIPE, defaults, skip_together=skip_together, capturable=capturable)


#: the name of the paper's variant before ``geoarray.torch.Adam`` took torch's conventions
BrantnerAdam = PaperAdam


class AdamWithDecay(Optimizer):
    """Adam with a learning rate decaying geometrically from ``lr_start`` to ``lr_end``
    (:class:`geoarray.optim.AdamWithDecay`): give ``n_steps``, or ``n_epochs`` with ``steps_per_epoch``.

    The decay is part of the optimizer state (its step counter). Param groups carry ``lr``, which
    starts at ``lr_start`` and scales the whole curve: η_t = decay(t)·lr/lr_start, so a torch LR
    scheduler (which edits ``lr``) multiplies the decayed rate.
    """

    def __init__(
        self,
        params: Iterable[Any],
        n_steps: int | None = None,
        lr_start: float = 1e-2,
        lr_end: float = 1e-6,
        betas: tuple[float, float] = (0.9, 0.99),
        delta: float = 3e-7,
        *,
        n_epochs: int | None = None,
        steps_per_epoch: int | None = None,
        section: str | None = None,
        retraction: str | None = None,
        on_nonfinite: str = "skip",
        group_same_shape: bool = True,
        seed: int = 0,
        chunk_bytes: int | str | None = "default",
        skip_together: bool = False,
        capturable: bool = False,
    ):
        defaults = {"lr": lr_start, **group_defaults(locals(), leave_out=("capturable",))}  # lr scales the curve
        super().__init__(params, ADAM_WITH_DECAY_RECIPE, defaults, skip_together=skip_together, capturable=capturable)


def _muon_defaults(core: type[_optim.ManifoldMuon], lr: Any, kwargs: dict, name: str) -> dict:
    """The param group's defaults of a Muon optimizer: every keyword of the core's constructor, with its
    default; an unknown keyword is a ``TypeError`` and a bad value fails here, with the core's message (a
    tensor lr, read on the device at every step, is checked by its value once)."""
    import inspect

    signature = inspect.signature(core)  # the constructor's, without self
    defaults = {
        key: par.default
        for key, par in signature.parameters.items()
        if key != "lr" and par.default is not inspect.Parameter.empty
    }
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise TypeError(f"{name} got unexpected keyword arguments {unknown}; it takes {sorted(defaults)}")
    core(lr.item() if isinstance(lr, torch.Tensor) else lr, **kwargs)
    return {"lr": lr, **defaults, **kwargs}


@dataclasses.dataclass(frozen=True)
class _MuonCore:
    """The ``build`` of a Muon recipe: the core class, built from the group's keys (a module-level class, so that
    the recipe pickles and a copy's recipe equals the original's)."""

    core: type[_optim.ManifoldMuon]

    def __call__(self, opt: Any, group: dict) -> _optim.ManifoldMuon:
        skip = BOOKKEEPING | {"lr", "capturable"}
        kwargs = {k: v for k, v in group.items() if k not in skip and k in opt._known}
        return self.core(_Rate.of(opt, group), **kwargs)


MANIFOLD_MUON_RECIPE = Recipe(_MuonCore(_optim.ManifoldMuon))
MUON_RECIPE = Recipe(_MuonCore(_optim.Muon))


class ManifoldMuon(Optimizer):
    """:class:`geoarray.optim.ManifoldMuon` as a ``torch.optim.Optimizer``: manifold Muon on
    ManifoldParameters (Stiefel, Grassmann), Muon on plain matrix tensors; the core's arguments.

    Every argument is a param-group hyperparameter (``lr``, ``momentum``, ``nesterov``,
    ``weight_decay``, …, as in ``torch.optim.Muon``), so torch's LR schedulers work. ``lr`` is read at
    every step (the core takes it as a schedule, :class:`~geoarray.optim.ManifoldMuon`): a scheduler's new
    rate builds nothing, and a compiled step takes it as an input once dynamo has seen it change (the
    Stiefel retraction then picks its series degree on the device: the ``eigh`` route under
    ``torch.compile``); a change of any other key builds a new core for the group, keeping its state.
    Vectors and scalars are refused with a pointer to a second optimizer: give them ``geoarray.torch.Adam``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 5e-3,
        *,
        skip_together: bool = False,
        capturable: bool = False,
        **kwargs: Any,
    ):
        defaults = _muon_defaults(_optim.ManifoldMuon, lr, kwargs, type(self).__name__)
        super().__init__(params, MANIFOLD_MUON_RECIPE, defaults, skip_together=skip_together, capturable=capturable)


class _Rate(LiveHyperparameter):
    """The param group's ``lr`` as the schedule of a manifold-Muon core, read at every step. Eagerly a float
    is passed as the number it is (the Stiefel retraction picks its series degree from it on the host). In a
    compiled step the rate the core was built with is passed as that constant (the series route, as for a
    fixed rate), and a rate a scheduler changed as a 0-d tensor: an input of the graph, whose degree is
    picked on the device (``stiefel_spectral_step``), so that new rates compile nothing again. A tensor
    ``lr`` is passed as it is."""

    def __init__(self, built: float, params: list):
        super().__init__("lr")
        self.built = built
        # a changed rate is made where the parameters live (a CPU input would keep a CUDA step out of CUDA
        # graphs, mode="reduce-overhead"), in the widest of their dtypes (float64 is not on every device)
        self.device = params[0].device
        self.dtype = functools.reduce(torch.promote_types, [p.dtype for p in params])

    @classmethod
    def of(cls, optimizer: Any, group: dict) -> Any:
        if not is_group_of(optimizer, group):
            return live(optimizer, group)  # the probe core of a group being added: its constant rate
        value = group["lr"]
        built = value.item() if isinstance(value, torch.Tensor) else float(value)
        return register(optimizer, group, cls(built, group["params"]))

    def __call__(self, t: Any = None) -> Any:
        value = super().__call__(t)
        if isinstance(value, torch.Tensor) or not torch.compiler.is_compiling():
            return value
        if value == self.built:  # a guard on this comparison, not on the value
            return self.built
        return value * torch.ones((), dtype=self.dtype, device=self.device)


class Muon(Optimizer):
    """:class:`geoarray.optim.Muon` — ``torch.optim.Muon``'s algorithm through the array-API core — as a
    ``torch.optim.Optimizer``, for plain matrix tensors (see :class:`ManifoldMuon`: the same keywords, those
    of the core, as param-group hyperparameters; ``lr`` read at every step)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        *,
        skip_together: bool = False,
        capturable: bool = False,
        **kwargs: Any,
    ):
        defaults = _muon_defaults(_optim.Muon, lr, kwargs, type(self).__name__)
        super().__init__(params, MUON_RECIPE, defaults, skip_together=skip_together, capturable=capturable)
