"""The one ``torch.optim.Optimizer`` of geoarray.torch, driven by geoarray's array-API optimizer core.

The named optimizers (:mod:`geoarray.torch.torch_optimizers`: ``Adam``, ``SGD``, …;
:mod:`geoarray.torch.paper_optimizers`: ``PaperAdam``, ``ManifoldMuon``, …; all gathered in
:mod:`geoarray.torch.optim`) are thin constructors: each
turns its arguments into a param group's defaults and hands :class:`Optimizer` a :class:`Recipe`, the data
that says how a group's core is built from its hyperparameters, which of them are read at every step and
how they are checked. No subclass overrides a step, a hook or a flag.

    model = geoarray.torch.nn.StiefelLayer(10, 3)          # its weight is a ManifoldParameter
    opt = geoarray.torch.Adam(model.parameters(), lr=1e-2)
    loss(model(x)).backward(); opt.step(); opt.zero_grad()

Each step runs Algorithm 1 of Brantner, *Generalizing Adam to Manifolds for Efficiently Training
Transformers* (Riemannian gradient → lift to g^hor → cache update → retraction) on every
:class:`~geoarray.torch.ManifoldParameter` and the ordinary (Euclidean) update on every other tensor,
by calling :class:`geoarray.optim.RiemannianOptimizer` — the same code that runs on NumPy and JAX —
on the parameters of a param group as one tree. Same-shaped parameters of one manifold are stacked
and updated by one batched call (``group_same_shape=True``), so the 336 attention projections of
the paper's vision transformer cost one call, not 336.

What it does as a ``torch.optim.Optimizer``:

* **param groups** with per-group hyperparameters (``lr``, ``betas``, …, and the core's options
  ``section``, ``retraction``, ``on_nonfinite``, ``group_same_shape``, ``seed``, ``chunk_bytes``); every group carries
  ``lr``, read at every step, so every ``torch.optim.lr_scheduler`` works (:class:`Adam`, :class:`AdamW`,
  :class:`SGD` also read ``betas``, ``eps``, ``weight_decay``, ``momentum``, ``dampening`` at every
  step: OneCycleLR's momentum cycling builds nothing new); changing another hyperparameter rebuilds
  the group's core and keeps its state (which must keep its structure: checked on a fresh state, except
  for the keys a recipe's ``state_free`` names, a scheduler's ``lr`` among them); a key the optimizer does
  not know is refused.
* **in place**: the step runs under ``torch.no_grad()`` and writes the new values into each
  parameter's storage (``copy_``), so parameters stay leaves without ``grad_fn`` and the next
  ``backward()`` works.
* **no grad, no update**: parameters whose ``grad`` is None are skipped, with their state. The state
  of a group is batched over the parameters that first stepped together (a *cohort*); a later step
  in which only part of a cohort has gradients is refused with a ``ValueError`` naming the missing
  ones (put parameters that are used only sometimes in their own param group).
* **state_dict / load_state_dict** resume bit-exactly: the core's state leaves are stored as tensors
  (under the key ``"geoarray"`` beside torch's ``"state"`` and ``"param_groups"``) with their dtypes
  and memory layouts, so ``torch.save(opt.state_dict())`` loads with ``weights_only=True``.
* **GradScaler**: ``torch.amp.GradScaler`` skips a step whose scaled gradients hold an inf or NaN,
  leaving parameters and state untouched. Where host reads are free (the CPU) it unscales the
  gradients and reads its flag itself; elsewhere (a GPU) it hands the step its scale and flag, as to
  torch's fused Adam (``_step_supports_amp_scaling``), and the step unscales in place and decides the
  skip on the device, so ``scaler.step(opt)`` reads nothing to the host
  (``geoarray/torch/_grad_scaler.py``). Without a scaler, the core's ``on_nonfinite="skip"``
  (default) does the same for a non-finite gradient and counts it.
* **torch.compile**: compile the model (``torch.compile(model)``), the step
  (``torch.compile(opt.step, fullgraph=True)``: one graph, no host reads, one compilation for every
  later step; tested with ``backend="aot_eager"`` equal to the eager step), or both. The first step of
  the parameters runs eagerly (``opt.step()`` once, uncompiled): it builds the state, checks the weights
  and registers the kernels the traced update calls; a compiled step that would build state (a first
  step, a structural hyperparameter changed) raises ``RuntimeError`` saying so. A compiled step checks
  no values; :meth:`Optimizer.validate` checks them on request. A float ``lr`` changed by a scheduler is
  a new constant to the compiled graph: torch recompiles, as for its own optimizers.
* **bad input** — a ManifoldParameter whose shape or dtype does not fit its manifold, an initial
  weight off the manifold, a gradient of another dtype, device or shape, a parameter converted
  (``module.to``) to another dtype or device after its state was built — raises ``TypeError`` or
  ``ValueError`` naming the parameter (``'layer.weight'`` when the optimizer was given
  ``model.named_parameters()``, else ``param_groups[g]['params'][i]``) before anything is changed.
  Shapes and dtypes are checked when the parameters are added; that the weights lie on their
  manifold when their state is created (one host read per weight, at their first step; after
  ``load_state_dict``, at the first eager step, only beyond 1,000 times ``is_point``'s tolerance, at most
  0.1: trained float32 weights drift off by ~1e-4 in 10⁴ steps, the size of the tolerance, while a weight
  that the model's ``load_state_dict(..., strict=False)`` left out keeps what ``module.to_empty()`` or
  the initialisation left); the refusal gives the measured error, the tolerance and the fix
  (``geoarray.torch.project_``). A weight moved off its manifold later, by the user, is not detected.

Distributed use is described in :mod:`geoarray.torch`.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from collections.abc import Callable, Iterable
from typing import Any, cast

import optree
import torch

from .. import optim as _optim
from .._backend import host_reads_allowed
from ..optim.riemannian import RiemannianOptimizer
from ..optim.transforms import GradientTransformation
from . import _dtensor, _foreign
from ._grad_scaler import scaler_flags, takes_skip_flag, unscale_, zero_where_found
from ._rank_agreement import agree_on_step, check_skip_together, keep_where_taken
from .cohorts import (
    FORMAT,
    FORMAT_VERSION,
    Cohort,
    Core,
    eager_first_message,
    probe_point,
    restore_state,
    saved_groups,
    write_state,
)
from .param_groups import (
    BOOKKEEPING,
    CORE_OPTIONS,
    NOT_HYPERPARAMETERS,
    NOT_IN_KEY,
    LiveHyperparameter,
    check_capturable,
    check_lr,
    core_lr,
    is_group_of,
)
from .parameter import _tolerance, check_manifold_tensor, manifold_of, project_
from .state_view import StateView

__all__ = ["Optimizer", "Recipe"]

#: how far from its manifold a restored weight may be at its first step: this multiple of is_point's
#: tolerance, at most the second (Optimizer._check_restored)
_RESTORED_FACTOR, _RESTORED_MAX = 1e3, 0.1


def _key_value(value: Any) -> Any:
    """A hyperparameter as a cohort's key holds it: numbers (and tuples of them) as they are, anything else by
    its repr. Under torch.compile a number can be a SymFloat (dynamo makes a float symbolic once it has seen it
    change, as when two optimizers' steps are compiled in one process): it has no repr there, and comparing
    it with the key's value (:func:`_same_key`) guards on that comparison: a changed value recompiles, and
    the new trace sees the change (and refuses it, as a compiled step does: run that step eagerly)."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_key_value(v) for v in value)
    return repr(value)


def _immutable(value: Any) -> bool:
    """Whether a hyperparameter cannot change without a new object: None, a bool, number or string, or a tuple
    of those (a list or a tensor can change in place)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return type(value) is tuple and all(v is None or isinstance(v, (bool, int, float, str)) for v in value)


def _same_key(a: Any, b: Any) -> bool:
    """Whether two cohort keys are equal, one entry at a time: each comparison is an ``if``, which dynamo
    answers for a symbolic number by guarding on it (it cannot compare tuples that hold symbolic ones).
    Nested tuples recurse; scalar entries are compared in the loop, not by a call each (dynamo inlines
    every call it traces: with a call per entry, comparing the keys of a step's two cohorts took
    3,076 of the 33,686 instructions dynamo traced for a geoarray.torch.Adam step, now 1,426)."""
    if not torch.compiler.is_compiling():
        return bool(a == b)
    if not isinstance(a, tuple) or not isinstance(b, tuple):
        return a == b
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, tuple) or isinstance(y, tuple):
            if not _same_key(x, y):
                return False
        elif x != y:
            return False
    return True


def _differ_only_in(a: tuple, b: tuple, names: tuple[str, ...]) -> bool:
    """Whether two cohort keys ((name, value) pairs in the same order) differ in the entries ``names`` alone."""
    return len(a) == len(b) and all(x == y or (x[0] == y[0] and x[0] in names) for x, y in zip(a, b, strict=True))


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a named optimizer builds the core of a param group (its constructor hands it to
    :class:`Optimizer` as ``core``): data, where subclasses used to override hooks.

    * ``build(optimizer, group) -> core``: a :class:`geoarray.optim.RiemannianOptimizer` (or ManifoldMuon,
      a partition) for the group's hyperparameters; the keys in ``live`` it reads through
      :func:`geoarray.torch.param_groups.live`, which reads them from the group at every step;
    * ``live``: the keys read at every step (a change builds no new core: LR schedulers, momentum cycling);
    * ``state_free``: keys whose change builds a new core that keeps the state without building a fresh
      state to compare its structure with (tests/test_torch_schedulers.py checks that each is in no state);
      a change of any other key is checked on a fresh state;
    * ``check(group, gi, name)``: validates the group's hyperparameters, before a core is built and at every
      step (the live ones change between steps); ``gi`` is the group's index (``"new"`` while it is added),
      ``name`` the optimizer's class name for the messages;
    * ``zero_matters``: keys whose being zero or not changes the core's chain (no decay, no momentum buffer):
      zero and non-zero are two cores, while the non-zero value is read live.

    Every function must be a module-level function (or an instance of a module-level class): the recipe is
    pickled with the optimizer (``copy.deepcopy``, ``torch.save(opt)``).
    """

    build: Callable[[Any, dict], Core]
    live: tuple[str, ...] = ("lr",)
    state_free: tuple[str, ...] = ("lr", "chunk_bytes")
    check: Callable[[dict, Any, str], None] | None = None
    zero_matters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.build):
            raise TypeError(f"Recipe(build=...) must be a function (optimizer, group) -> core, got {self.build!r}")
        if self.check is not None and not callable(self.check):
            raise TypeError(f"Recipe(check=...) must be None or a function (group, gi, name), got {self.check!r}")
        for field in ("live", "state_free", "zero_matters"):
            keys = getattr(self, field)
            if not isinstance(keys, tuple) or not all(isinstance(k, str) for k in keys):
                raise TypeError(f"Recipe({field}=...) must be a tuple of param-group keys (str), got {keys!r}")


class Optimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` around a geoarray optimizer core (see the module docstring).

    ``core`` is one of

    * a :class:`Recipe` (what geoarray.torch's named optimizers pass: ``Adam``, ``SGD``, ``ManifoldMuon``, …);
    * a :class:`geoarray.optim.RiemannianOptimizer` (e.g. ``geoarray.optim.Adam(lr=1e-3)`` or
      ``geoarray.optim.riemannian(chain(clip_by_global_norm(1.0), scale_by_adam(), ...))``): every
      param group gets its own copy;
    * a gradient transformation (``init``/``update``, geoarray's or optax's): wrapped by
      :func:`geoarray.optim.riemannian` with the options in ``defaults``;
    * a callable ``core(group) -> RiemannianOptimizer`` receiving the param group dict, for per-group
      hyperparameters: it is called again when a hyperparameter of the group (any key but ``params``,
      ``param_names``) changes.

    ``defaults`` are the default group hyperparameters, as in ``torch.optim.Optimizer``. A key in a
    param group that is neither in ``defaults`` nor one of the core's options above is refused
    (``ValueError``) — except with a callable ``core`` and no ``defaults``, whose groups are the
    factory's to read.

    ``skip_together`` (keyword, default False; every subclass takes it, and a param group may set its
    own): the parameters of such groups, on every rank of the default process group, take or skip
    each step together. Under ``ZeroRedundancyOptimizer`` each rank's optimizer holds a partition of the
    model, and a NaN gradient in one partition would skip that partition's step only; with
    ``skip_together=True`` (ZeRO hands its keywords to each rank's optimizer) it skips the step on every
    rank, as one process does. After computing their updates and before writing them the ranks
    all-reduce (MIN) a 4-byte "every such cohort here took its step"; where one did not, every such
    cohort on every rank keeps its values and state and counts the step in ``skipped`` (selected on the
    device, no host read). Every rank must call ``step()`` each time (ZeRO's ranks do);
    ``on_nonfinite="raise"`` is refused with it (``ValueError``): the rank that raised would leave the
    others waiting.

    ``capturable`` (keyword, default False; every subclass takes it, a param group may set its own), as
    in ``torch.optim.Adam(capturable=True)``: the step can be captured in a CUDA graph together with the
    forward and backward. After the first step, which runs eagerly and makes them, the state's tensors
    are fixed buffers that every step writes in place (as it writes the parameters), so a replay reads and
    writes the same addresses and nothing on the Python side changes; on a GPU the step reads nothing to
    the host (:func:`geoarray.set_host_reads`). The lr must be a float, baked into a captured graph
    (capture again after changing it), and ``stabilize`` is refused (its count lives in Python). A
    step inside a capture that would build state or make the buffers raises ``RuntimeError``.

    **Learning rate.** Every param group carries ``lr``, so every ``torch.optim.lr_scheduler`` works.
    For a core whose update is the Riemannian wrapper's (geoarray's Adam, Momentum, Gradient, BFGS,
    ``riemannian(...)``), the group's ``lr`` scales the velocity W = −η·direction relative to the rate
    the core was built with, read at every step without rebuilding it: ``lr`` starts at the core's
    own rate (``core.lr``) where it has a constant one, else at 1.0 (a pure factor; for a factory,
    relative to the group's ``lr`` when the core was built). Halving ``group["lr"]`` halves the step.
    Other cores (ManifoldMuon, Muon) are rebuilt from a factory when ``lr`` changes; a core instance
    of that kind cannot take a new rate and a change is refused with a ``ValueError`` (use
    :class:`ManifoldMuon`/:class:`Muon` of this module, or a factory).
    """

    #: the named optimizer's recipe, or None for a core given by the user (then ``_factory`` builds it)
    _recipe: Recipe | None
    #: ``_factory(group)``: the core for a group's hyperparameters, for a core given by the user (set by
    #: __init__ and __setstate__; ``...``: the lambdas of __init__ bind their other arguments as defaults)
    _factory: Callable[..., Core]
    #: torch.optim.Optimizer's (declared here too for type checkers that run without torch)
    param_groups: list[dict[str, Any]]

    def __init__(
        self,
        params: Iterable[Any],
        core: Recipe | Core | GradientTransformation | Callable[[dict], Core],
        defaults: dict | None = None,
        *,
        skip_together: bool = False,
        capturable: bool = False,
    ):
        defaults = dict(defaults or {})
        defaults.setdefault("capturable", capturable)  # torch's convention classes pass their own
        # the keys a group may hold (None: any; a factory without defaults reads what it likes)
        self._known: frozenset | None = frozenset(defaults) | {"lr"}
        self._lr_reference: float | None = None  # None: the group's lr when the core was built
        self._lr_rebuilds = False  # True: lr changes rebuild the core (it cannot be scaled)
        self._recipe = core if isinstance(core, Recipe) else None
        if isinstance(core, _optim.InjectedOptimizer):
            raise TypeError(
                f"{core!r} keeps its rate in its own state, and a torch optimizer keeps it in its param groups "
                "(where torch's LR schedulers write it): pass the optimizer without inject_hyperparams, e.g. "
                "geoarray.torch.Optimizer(params, geoarray.optim.Adam(lr=1e-3)), and change param_groups[i]['lr']"
            )
        if self._recipe is not None:
            pass  # _make_core builds each group's core by the recipe
        elif isinstance(core, _optim.OPTIMIZER_TYPES):
            self._lr_reference = core_lr(core) or 1.0
            self._factory = lambda group, proto=core: self._copy_core(proto, group)
        elif callable(getattr(core, "init", None)) and callable(getattr(core, "update", None)):
            self._lr_reference = 1.0
            self._known |= set(CORE_OPTIONS)
            self._factory = lambda group, t=core: _optim.riemannian(
                t, **{k: group[k] for k in CORE_OPTIONS if k in group}
            )
        elif callable(core):
            self._factory = core
            if not defaults:
                self._known = None
        else:
            raise TypeError(
                "core must be a geoarray.optim.RiemannianOptimizer, a gradient transformation or a callable "
                f"group -> RiemannianOptimizer, got {type(core).__name__}"
            )
        if self._recipe is None:
            defaults.setdefault("lr", self._lr_reference or 1.0)
        defaults["skip_together"] = skip_together
        self._cohorts: list[list[Cohort]] = []
        super().__init__(params, defaults)

    # torch types Optimizer.state as the per-parameter dict it keeps; here the state lives in the cohorts
    # and this is a read-only view of it
    @property  # type: ignore[override]
    def state(self) -> StateView:
        """Each parameter's state under torch's names (``step``, ``exp_avg``, ``exp_avg_sq``,
        ``momentum_buffer``, …): a read-only mapping of views into the grouped state
        (:mod:`geoarray.torch.state_view`)."""
        return StateView(self)

    @state.setter
    def state(self, value: Any) -> None:
        # torch.optim.Optimizer assigns its per-parameter dict here (__init__, load_state_dict); the
        # state lives in the cohorts instead, so there is nothing to keep
        pass

    def _copy_core(self, proto: Core, group: dict) -> Core:
        core = copy.copy(proto)
        if not getattr(core, "takes_rate_factor", False):
            lr = group.get("lr", self._lr_reference)
            if isinstance(lr, torch.Tensor):
                lr = lr.item()
            if lr != self._lr_reference:
                raise ValueError(
                    f"param group lr was changed to {lr!r}, but the core {type(proto).__name__} took its learning "
                    f"rate ({self._lr_reference!r}) at construction and cannot take another; use "
                    f"geoarray.torch.{type(proto).__name__} (its param groups carry lr) or a factory core(group)"
                )
        return core

    # -- groups ------------------------------------------------------------------------------------

    def _make_core(self, group: dict, group_index: int) -> tuple[Core, tuple[LiveHyperparameter, ...]]:
        """The group's core, and the live hyperparameters its build made (:func:`~geoarray.torch.param_groups.live`),
        which :meth:`_step` sets from the group before every update of that core."""
        recipe = self._recipe
        cells: list[LiveHyperparameter] = []
        self.__dict__["_building_cells"] = cells  # live() hands its cells here (param_groups.register)
        try:
            if recipe is not None:
                if recipe.check is not None:
                    recipe.check(group, "new", type(self).__name__)
                core = recipe.build(self, group)
            else:
                core = self._factory(group)
        finally:
            del self.__dict__["_building_cells"]
        if not isinstance(core, _optim.OPTIMIZER_TYPES):
            raise TypeError(f"the core factory must return a geoarray.optim.RiemannianOptimizer, got {core!r}")
        if recipe is not None:
            return core, tuple(cells)
        if not getattr(core, "takes_rate_factor", False):  # ManifoldMuon, partitions: their rate is their own
            self._lr_rebuilds = True  # changes rebuild the core
            return core, tuple(cells)
        core = cast(RiemannianOptimizer, core)
        if not is_group_of(self, group):
            return core, tuple(cells)  # the probe core of a group being added
        reference = self._lr_reference
        if reference is None:
            reference = group["lr"].item() if isinstance(group["lr"], torch.Tensor) else float(group["lr"])
        rate = LiveHyperparameter(reference=reference)
        rate.read(group)
        return core.scaled_by(rate), (*cells, rate)

    def _live_keys(self) -> tuple[str, ...]:
        """Hyperparameters read at every step (their changes need no new core)."""
        if self._recipe is not None:
            return self._recipe.live
        return () if self._lr_rebuilds else ("lr",)

    def _hyper_key(self, group: dict) -> tuple:
        """What identifies the group's core: its hyperparameters but the live ones (checked here, at every
        step, by the recipe: a scheduler or the user may have changed them)."""
        recipe = self._recipe
        if recipe is not None and recipe.check is not None:
            recipe.check(
                group, next((i for i, g in enumerate(self.param_groups) if g is group), "new"), type(self).__name__
            )
        live = self._live_keys()
        key = tuple((k, _key_value(group[k])) for k in sorted(group) if k not in NOT_IN_KEY and k not in live)
        if recipe is None or not recipe.zero_matters:
            return key
        # ``if``, not bool(): dynamo answers an ``if`` on a symbolic number (a SymFloat) with a guard and a
        # plain bool, where bool() left a symbolic one in the key
        return key + tuple((k, True if group[k] != 0 else False) for k in recipe.zero_matters if k in group)

    def _step_key(self, group: dict, gi: int) -> tuple:
        """:meth:`_hyper_key` of ``param_groups[gi]`` at a step. Eagerly, the last step's key again while the
        group is the same dict and every value of it is the very object it was then and an immutable number,
        string, None or tuple of numbers (the ``params`` list aside): the group is then unchanged, so neither
        checked nor keyed again (a square step's Python calls 419 → 377). A scheduler's or the user's
        assignment makes a new object; a value that could change in place (a list, a tensor) is checked and
        keyed at every step, as before. One entry per group index: a group replaced (``load_state_dict``)
        overwrites its own."""
        if torch.compiler.is_compiling():
            return self._hyper_key(group)
        cache = self.__dict__.setdefault("_step_keys", {})
        names, values = tuple(group), tuple(group.values())
        last = cache.get(gi)
        if last is not None and last[0] is group and last[1] == names and all(map(operator.is_, last[2], values)):
            return last[3]
        key = self._hyper_key(group)
        if all(_immutable(v) for k, v in group.items() if k not in ("params", "param_names")):
            cache[gi] = (group, names, values, key)
        else:
            cache.pop(gi, None)
        return key

    def _check_group_keys(self, group: dict, gi: int) -> None:
        if self._known is None:
            return
        unknown = sorted(k for k in group if k not in self._known and k not in BOOKKEEPING and k != "params")
        if unknown:
            raise ValueError(
                f"param_groups[{gi}] has keys {unknown} that {type(self).__name__} does not know (it takes "
                f"{sorted(self._known)}); remove them or fix their spelling"
            )

    @staticmethod
    def _name(group: dict, group_index: int, i: int) -> str:
        names = group.get("param_names")
        if names is not None and i < len(names):
            return repr(names[i])
        return f"param_groups[{group_index}]['params'][{i}]"

    def add_param_group(self, param_group: dict) -> None:
        gi = len(self.param_groups)
        param_group = dict(param_group)
        items = param_group["params"]
        items = [items] if isinstance(items, torch.Tensor) else list(items)  # may be a generator
        param_group["params"] = items
        self._check_group_keys(param_group, gi)
        probe = dict(self.defaults, **{k: v for k, v in param_group.items() if k != "params"})
        check_skip_together(probe, gi)
        if "lr" in probe:
            check_lr(probe["lr"], f"param_groups[{gi}]['lr']")
        check_capturable(probe, gi, type(self).__name__, live_lr="lr" in self._live_keys())
        names = [it[0] if isinstance(it, tuple) and len(it) == 2 else None for it in items]
        params = [it[1] if isinstance(it, tuple) and len(it) == 2 else it for it in items]
        if all(n is not None for n in names) and "param_names" not in probe:
            probe["param_names"] = names
        for i, p in enumerate(params):
            name = self._name(probe, gi, i)
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
            m = manifold_of(p)
            if m is not None:
                # that the values lie on the manifold is checked when a state is first created (the
                # first step), not here: load_state_dict may follow, with trained weights that drifted
                check_manifold_tensor(p, m, name)
            elif not p.dtype.is_floating_point or p.dtype.is_complex:
                raise TypeError(f"{name} must have a real floating dtype, got {p.dtype}")
        # build a core once so that bad hyperparameters fail here, not at the first step
        probe["params"] = params
        self._make_core(probe, gi)
        super().add_param_group(param_group)
        self._cohorts.append([])

    # -- one step ----------------------------------------------------------------------------------

    def _check_grads(self, group: dict, gi: int, active: list[int]) -> None:
        for i in active:
            p = group["params"][i]
            g = p.grad
            if g.is_sparse or g.dtype != p.dtype or g.device != p.device or g.shape != p.shape:
                # the name is formatted only for the error (it costs more than the checks, every step)
                name = self._name(group, gi, i)
                if g.is_sparse:
                    raise TypeError(f"the gradient of {name} is sparse; geoarray optimizers need dense gradients")
                if g.dtype != p.dtype:
                    raise TypeError(f"the gradient of {name} has dtype {g.dtype}, the parameter {p.dtype}")
                if g.device != p.device:
                    raise ValueError(f"the gradient of {name} is on device {g.device}, the parameter on {p.device}")
                raise ValueError(f"the gradient of {name} has shape {tuple(g.shape)}, the parameter {tuple(p.shape)}")

    # Host bookkeeping, never traced: a compiled step refuses to build or rebuild a cohort (eager_first_message),
    # but where a compiled caller runs this step eagerly after a graph break (a function that calls
    # opt.step() and a scheduler's wrapper of it, compiled without fullgraph), dynamo still compiles these
    # frames, and its optree polyfills spell the layouts' treedefs differently (namespace=''): the state
    # built or checked there no longer matched the eager state's structure
    @torch.compiler.disable
    def _new_cohort(self, group: dict, gi: int, indices: tuple[int, ...], *, restoring: bool = False) -> Cohort:
        """A cohort with a fresh core and state for ``group["params"][i] for i in indices``.

        ``restoring=True`` (a saved or carried state is about to replace the fresh one: load_state_dict,
        a core rebuilt after a copy or a hyperparameter change) skips the check that the weights lie on
        their manifold: trained weights drift off it by rounding (in float32 of the order of
        ``is_point``'s tolerance 1e-4 after 10⁴ steps), and resuming must not be refused for that. The
        core then records its layout on random points of the same shapes, dtypes and devices.
        """
        params = [group["params"][i] for i in indices]
        # torch's own fully_shard dropped a manifold: refuse rather than step it as Euclidean (free without DTensors)
        _foreign.refuse_torch_sharded(params, lambda k: self._name(group, gi, indices[k]))
        manifolds = [manifold_of(p) for p in params]
        sharded = _dtensor.views(self, group, params, grads=False)  # DTensors (FSDP2): what this rank steps
        tensors = params if sharded is None else sharded.leaves
        for i, p, m in zip(indices, tensors, manifolds, strict=True):
            if m is not None:
                # while torch.compile traces the step, is_point's host read would break the graph:
                # the values are then checked by validate() or an eager first step, not here
                on_manifold = not restoring and not torch.compiler.is_compiling()
                check_manifold_tensor(p, m, self._name(group, gi, i), on_manifold=on_manifold)
        leaves = [
            p.detach() if m is None or not restoring else probe_point(m, p)
            for p, m in zip(tensors, manifolds, strict=True)
        ]
        core, cells = self._make_core(group, gi)
        fresh = core.init(leaves, manifolds)
        return Cohort(
            indices,
            tuple(tuple(p.shape) for p in params),
            core,
            fresh,
            None,
            tuple((p.dtype, p.device) for p in params),
            cells=cells,
        )

    def _plan(self, group: dict, gi: int) -> list[Cohort | tuple[int, ...]]:
        """The cohorts to update in this step (existing ones, or index tuples of new ones); raises on
        partially active cohorts before anything is changed."""
        params = group["params"]
        active = [i for i, p in enumerate(params) if p.grad is not None]
        if not active:
            return []
        self._check_grads(group, gi, active)
        if "lr" in group and not isinstance(group["lr"], torch.Tensor):  # edited by hand or by a scheduler
            check_lr(group["lr"], f"param_groups[{gi}]['lr']")
        if not torch.compiler.is_compiling():  # which shows capturable=True while it traces (NOT_IN_KEY)
            check_capturable(group, gi, type(self).__name__, live_lr="lr" in self._live_keys())
        active_set = set(active)
        plan: list = []
        covered: set[int] = set()
        for cohort in self._cohorts[gi]:
            covered.update(cohort.indices)
            present = [i for i in cohort.indices if i in active_set]
            if not present:
                continue
            if len(present) != len(cohort.indices):
                missing = ", ".join(self._name(group, gi, i) for i in cohort.indices if i not in active_set)
                raise ValueError(
                    f"{missing} had a gradient when this param group first stepped but has none now, while other "
                    "parameters of the group do: the optimizer state is batched over the parameters that step "
                    "together. Put parameters that are used only in some steps in a param group of their own."
                )
            for i, shape in zip(cohort.indices, cohort.shapes, strict=True):
                if tuple(params[i].shape) != shape:
                    raise ValueError(
                        f"{self._name(group, gi, i)} has shape {tuple(params[i].shape)}, but the optimizer state was "
                        f"built for {shape}"
                    )
            # a model converted (module.to) after the first step: the state stayed behind, and the core
            # would fail on mixed dtypes deep inside, or promote silently, instead of naming the parameter
            for i, (dtype, dev) in zip(cohort.indices, cohort.where, strict=False):
                p = params[i]
                if p.dtype == dtype and p.device == dev:
                    continue
                name = self._name(group, gi, i)
                advice = "create the optimizer after converting the model (module.to(...))"
                if p.dtype != dtype:
                    raise TypeError(
                        f"{name} has dtype {p.dtype}, but the optimizer state was built for {dtype}; {advice}"
                    )
                if p.device != dev:
                    raise ValueError(
                        f"{name} is on device {p.device}, but the optimizer state was built on {dev}; {advice}"
                    )
            plan.append(cohort)
        new = tuple(i for i in active if i not in covered)
        if new:
            plan.append(new)
        return plan

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """Whether torch.amp.GradScaler hands ``step`` its scale and inf flag to unscale and skip on the device,
        as for torch's fused Adam (``geoarray/torch/_grad_scaler.py``): where a host read of the flag is not
        free (:func:`geoarray.set_host_reads`: on a GPU by default); elsewhere the scaler reads it itself."""
        return not any(host_reads_allowed(p) for group in self.param_groups for p in group["params"][:1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns ``closure()`` if given. Then geoopt's
        ``stabilize`` where a group sets it: every ``stabilize`` steps of that group, its ManifoldParameters
        are projected to the nearest point (:func:`geoarray.torch.project_`)."""
        grad_scale, found_inf = scaler_flags(self)
        if grad_scale is None and found_inf is None:
            loss = self._step(closure, None, None)
        else:
            try:
                loss = self._step(closure, grad_scale, found_inf)
            except BaseException:
                # GradScaler deletes the two after a step that returned: a step that raised would leave them
                # to scale the next step taken without the scaler
                self.__dict__.pop("grad_scale", None)
                self.__dict__.pop("found_inf", None)
                raise
        for gi, group in enumerate(self.param_groups):
            every = group.get("stabilize")
            if not every:
                continue
            counts = self.__dict__.setdefault("_stabilize_counts", {})
            counts[gi] = counts.get(gi, 0) + 1
            if counts[gi] % every == 0:
                project_(p for p in group["params"] if p.grad is not None)
        return loss

    def _step(
        self, closure: Callable[[], Any] | None, grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None
    ) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        together = False
        for gi, group in enumerate(self.param_groups):
            if group.get("skip_together", False) is not False:
                check_skip_together(group, gi)
                together = True
        plans = [(gi, group, self._plan(group, gi)) for gi, group in enumerate(self.param_groups)]
        # a CUDA graph records this step once and replays its kernels: like a compiled step, it cannot
        # build state (the host work of a first step would not be replayed)
        tracing = torch.compiler.is_compiling()
        # dynamo cannot trace is_current_stream_capturing (it returns a bool, not a tensor): under a
        # trace the check is the trace's own
        capturing = not tracing and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        compiling = tracing or capturing
        # all checks passed: build new cohorts, unscale (GradScaler), then compute every update, then write
        # them all
        work = []
        for gi, group, plan in plans:
            key = self._step_key(group, gi)
            for item in plan:
                if compiling and (isinstance(item, tuple) or not _same_key(item.key, key)):
                    raise RuntimeError(eager_first_message(group, gi, item, self._name))
                if capturing and group.get("capturable") and isinstance(item, Cohort) and not item.buffers:
                    raise RuntimeError(
                        f"param group {gi}: a graph-captured step cannot make the state buffers of "
                        "capturable=True; run one step with capturable=True eagerly, outside the capture, first"
                    )
                if isinstance(item, tuple):
                    cohort = self._new_cohort(group, gi, item)
                    cohort.key = key
                    self._cohorts[gi].append(cohort)
                elif not compiling and not _same_key(item.key, key):  # compiling: compared above
                    cohort = self._rebuild(group, gi, item, key)
                else:
                    cohort = item
                if cohort.restored and not compiling:
                    self._check_restored(group, gi, cohort)
                work.append((group, cohort))
        if grad_scale is not None:
            unscale_(self.param_groups, grad_scale)
        skip = None if found_inf is None else found_inf.reshape(()) != 0
        results = []
        for group, cohort in work:
            params = [group["params"][i] for i in cohort.indices]
            sharded = _dtensor.views(self, group, params)  # DTensors (FSDP2): local shards or gathered wholes
            if sharded is None:
                grads = [p.grad for p in params]
                leaves = [p.detach() for p in params]
            else:
                grads, leaves = sharded.grads, sharded.leaves
            assert cohort.core is not None  # built or rebuilt above
            # shapes, dtypes and devices were checked by _plan against this cohort's state: the
            # core's own check of the same (about 0.1 ms on 41 parameters) is skipped
            # a core that takes the scaler's flag (skip=) masks the step on the device itself; any other
            # is handed zeros where the flag is set, and its old values are selected back below
            itself = skip is not None and takes_skip_flag(cohort.core)
            if skip is not None and not itself:
                grads = zero_where_found(grads, skip)
            # in place, as torch.optim steps, where nothing needs the old values afterwards (no selection
            # between old and new for a GradScaler's skip or the ranks' agreement; not traced): the core
            # then writes a step it takes in pieces into the parameters and the state (RiemannianOptimizer.update)
            donate = self._recipe is not None and not compiling and skip is None and sharded is None and not together
            extra: dict[str, Any] = {"donate": True} if donate else {}
            if itself:
                extra["skip"] = skip
            for cell in cohort.cells:  # the group's values at this step: the core reads these, not the group
                cell.read(group)
            new, state = cohort.core.update(leaves, grads, cohort.state, check=False, **extra)
            if skip is not None and not itself:
                new, state = keep_where_taken(~skip, leaves, new, cohort.state, state, count_skip=False)
            if sharded is not None:  # the ranks agree on whether the step was taken (no host reads)
                new, state = sharded.agree(cohort.state, new, state)
            # torch.compile shows every group with capturable=True while it traces (param_groups.NOT_IN_KEY):
            # a compiled step keeps the form the eager steps gave the state
            capturable = cohort.buffers if tracing else bool(group.get("capturable"))
            results.append((params, leaves, new, cohort, state, sharded, bool(group.get("skip_together")), capturable))
        if together:
            agreed = agree_on_step(
                [(r[1], r[2], r[3].state, r[4]) if r[6] else None for r in results], self._agreement_device()
            )
            results = [
                r if a is None else (r[0], r[1], a[0], r[3], a[1], *r[5:]) for r, a in zip(results, agreed, strict=True)
            ]
        for params, leaves, new, cohort, state, sharded, _, capturable in results:
            if sharded is None:
                # a donated leaf written in place comes back as itself: nothing to copy
                moved = [(p, t) for p, leaf, t in zip(params, leaves, new, strict=True) if t is not leaf]
                if moved:
                    torch._foreach_copy_([p for p, _ in moved], [t for _, t in moved])
            else:
                sharded.write(new)
            write_state(cohort, state, capturable)
        return loss

    def _agreement_device(self) -> torch.device:
        """Where the ranks' flag lives: the parameters' device (NCCL reduces CUDA tensors only)."""
        for group in self.param_groups:
            for p in group["params"]:
                return p.device
        return torch.device("cpu")

    def _check_restored(self, group: dict, gi: int, cohort: Cohort) -> None:
        """At the first eager step of a cohort restored by ``load_state_dict`` (whose ``_new_cohort`` skipped
        the check of a fresh one), refuse a weight far from its manifold: beyond 1,000 times ``is_point``'s
        tolerance, at most 0.1 (float32: 0.1, float64: 1e-7). Training drifts far less (float32: ~1e-4 in
        10⁴ steps); weights that were never loaded measure more — a key the model's
        ``load_state_dict(..., strict=False)`` left out keeps what ``module.to_empty()`` left (uninitialised
        memory; zeros measure max|YᵀY − I| = 1) or torch's initialisation (``nn.Linear(64, 256)``'s: 0.5),
        which the optimizer would otherwise step on, off the manifold, without a word."""
        params = [group["params"][i] for i in cohort.indices]
        sharded = _dtensor.views(self, group, params, grads=False)  # DTensors: the points this rank steps
        tensors = params if sharded is None else sharded.leaves
        for i, p, t in zip(cohort.indices, params, tensors, strict=True):
            m = manifold_of(p)
            if m is None or m.is_vector_space or not t.numel():
                continue
            Y = t.detach() if t.dtype not in (torch.float16, torch.bfloat16) else t.detach().float()
            atol = min(_RESTORED_FACTOR * _tolerance(t, m), _RESTORED_MAX)
            if not m.is_point(Y, atol=atol):
                err = m.point_error(Y)
                measured = f"max|YᵀY − I| = {err:.3g}" if err is not None else "not within the tolerance"
                raise ValueError(
                    f"{self._name(group, gi, i)} is off {m!r} ({measured}, above {atol:g}, which the drift of "
                    f"training stays far below in {t.dtype}) at the first step after load_state_dict: its "
                    "optimizer state was restored but not its values — a weight that the model's "
                    "load_state_dict(..., strict=False) left out keeps what module.to_empty() or the "
                    "initialisation left. Load it too, or initialise it on the manifold: "
                    "geoarray.torch.init.uniform_init_(p) or p.proj_()"
                )
        cohort.restored = False

    @torch.no_grad()
    def validate(self) -> None:
        """Check that every ManifoldParameter of every param group lies on its manifold (at
        ``is_point``'s default tolerance; one host read per weight); ``ValueError`` with the measured
        error, the tolerance and the fix otherwise.

        The first eager step of a parameter does this once; a compiled step
        (``torch.compile(opt.step, fullgraph=True)``) reads nothing to the host and checks nothing
        of the values, so call this where a check is wanted (after loading or editing weights)."""
        for gi, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                m = manifold_of(p)
                if m is not None:
                    check_manifold_tensor(p, m, self._name(group, gi, i), on_manifold=True)

    @torch.compiler.disable  # host bookkeeping (_new_cohort)
    def _rebuild(self, group: dict, gi: int, cohort: Cohort, key: Any) -> Cohort:
        """A new core for changed hyperparameters, keeping the cohort's state (which must keep its structure)."""
        recipe = self._recipe
        if recipe is not None and cohort.key is not None and _differ_only_in(cohort.key, key, recipe.state_free):
            # a new rate, as a scheduler sets at every step (or another argument of geoarray's own cores that
            # is in no state): the state keeps its structure. The check below builds a fresh state on random
            # points (ManifoldMuon on the ViT weights: +2.9 ms per step, a third of the step)
            (cohort.core, cohort.cells), cohort.key = self._make_core(group, gi), key
            return cohort
        fresh = self._new_cohort(group, gi, cohort.indices, restoring=True)
        if optree.tree_structure(fresh.state) != optree.tree_structure(cohort.state):
            raise ValueError(
                f"changing the hyperparameters of param group {gi} changed the structure of its optimizer state "
                f"({optree.tree_structure(cohort.state)} → {optree.tree_structure(fresh.state)}); create a new "
                "optimizer instead"
            )
        cohort.core, cohort.cells, cohort.key = fresh.core, fresh.cells, key
        return cohort

    # -- copies and pickles --------------------------------------------------------------------------

    #: what a copy or a pickle carries beside torch's own (defaults, state, param_groups) and the cohorts
    _CARRIED = ("_recipe", "_known", "_lr_reference", "_lr_rebuilds", "_stabilize_counts")

    def __getstate__(self) -> dict:
        # the cores (and their live hyperparameters) are rebuilt on the next step; the states travel with the copy
        state = super().__getstate__()
        state["state"] = {}  # the view (opt.state) is rebuilt from the cohorts
        state["_cohorts"] = [
            [Cohort(c.indices, c.shapes, None, c.state, None, c.where) for c in cs] for cs in self._cohorts
        ]
        state.update({k: self.__dict__[k] for k in self._CARRIED if k in self.__dict__})
        if self._recipe is None:
            state["_factory"] = self._factory
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        # torch's load_state_dict also calls __setstate__, with only "state" and "param_groups": what it
        # leaves out stays as it is
        has_factory = "_factory" in state
        cohorts, factory = state.pop("_cohorts", None), state.pop("_factory", None)
        super().__setstate__(state)
        if has_factory:
            self._factory = factory
        self._cohorts = cohorts if cohorts is not None else [[] for _ in self.param_groups]

    # -- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """torch's ``state_dict`` plus the core's state leaves under ``"geoarray"`` (tensors, bit-exact)."""
        out = super().state_dict()
        out["state"] = {}  # torch's per-parameter entry: the views of opt.state would duplicate "geoarray"
        out["geoarray"] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "groups": [[c.entry() for c in cohorts] for cohorts in self._cohorts],
        }
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyperparameters and the core's state; the parameters must be those of the saved run
        (same groups, shapes, dtypes). Raises ``ValueError`` naming the mismatch, changing nothing."""
        groups = saved_groups(state_dict, len(self.param_groups))
        saved = {k: v for k, v in state_dict.items() if k != "geoarray"}
        if not isinstance(saved.get("param_groups"), list):
            raise ValueError(
                "state_dict has no 'param_groups' list (torch's hyperparameters of each group): pass the whole "
                f"dict that opt.state_dict() returned, got keys {sorted(map(str, state_dict))}"
            )
        for gi, (mine, theirs) in enumerate(zip(self.param_groups, saved.get("param_groups", ()), strict=False)):
            keys_mine, keys_theirs = set(mine) - NOT_HYPERPARAMETERS, set(theirs) - NOT_HYPERPARAMETERS
            if keys_mine != keys_theirs:
                raise ValueError(
                    f"state_dict: param group {gi} holds the state of another optimizer: hyperparameters "
                    f"{sorted(keys_theirs)}, this optimizer's {sorted(keys_mine)}"
                )
        old = (self.param_groups, self.state, self._cohorts)
        super().load_state_dict(saved)
        for group in self.param_groups:
            # a checkpoint from before a key existed (AdamWithDecay's groups had no lr): the default
            # (only the optimizer's own keys: torch's __setstate__ adds "differentiable" to defaults)
            for k, v in self.defaults.items():
                if self._known is None or k in self._known:
                    group.setdefault(k, v)
        try:
            for gi, group in enumerate(self.param_groups):
                # validated now, not at the first step: building the group's core checks every
                # hyperparameter it takes (a state_dict edited to lr="oops" is refused here)
                if "lr" in group and not isinstance(group["lr"], torch.Tensor):
                    check_lr(group["lr"], f"state_dict['param_groups'][{gi}]['lr']")
                self._make_core(group, gi)
            self._cohorts = [self._load_group(gi, entries) for gi, entries in enumerate(groups)]
        except BaseException:
            self.param_groups, self.state, self._cohorts = old
            raise

    def _load_group(self, gi: int, entries: list) -> list[Cohort]:
        group = self.param_groups[gi]
        n = len(group["params"])
        cohorts = []
        for entry in entries:
            raw = entry["indices"]
            if not isinstance(raw, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in raw
            ):
                raise ValueError(f"state_dict: param group {gi} refers to parameters {raw!r}; expected a list of ints")
            indices = tuple(raw)
            if not indices or any(not 0 <= i < n for i in indices):
                raise ValueError(f"state_dict: param group {gi} refers to parameters {indices}; the group has {n}")
            cohort = self._new_cohort(group, gi, indices, restoring=True)
            restore_state(cohort, entry, gi)
            cohort.key = self._hyper_key(group)
            cohort.restored = True
            cohorts.append(cohort)
        return cohorts
