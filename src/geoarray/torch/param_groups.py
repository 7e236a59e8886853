"""How a ``torch.optim`` param group drives a geoarray optimizer core.

A param group is a dict of hyperparameters. Some of its keys are the core's options
(:data:`CORE_OPTIONS`), some are torch's bookkeeping (:data:`BOOKKEEPING`: the parameters, their names,
and what LR schedulers add), the rest are the method's hyperparameters. Those read at every step
(``lr``, and for the torch-convention optimizers ``betas``, ``eps``, …) reach the core through a
:class:`LiveHyperparameter`, which the optimizer sets from the group before every update (the core never
reads the group), so a scheduler's change needs no new core; a change of any other key builds a new core
that keeps the state (:class:`geoarray.torch.Optimizer`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "BOOKKEEPING",
    "CORE_OPTIONS",
    "NOT_HYPERPARAMETERS",
    "NOT_IN_KEY",
    "LiveHyperparameter",
    "check_capturable",
    "check_lr",
    "core_lr",
    "core_options",
    "group_core_options",
    "is_group_of",
    "live",
    "live_or_zero",
    "register",
]

#: the options of :class:`geoarray.optim.RiemannianOptimizer` a param group may carry
CORE_OPTIONS = ("section", "retraction", "on_nonfinite", "group_same_shape", "seed", "chunk_bytes")
#: keys that are not compared when a saved state_dict is matched to the optimizer's groups
#: (``capturable`` changes where the state lives, not what it holds: the states of both load into either)
# chunk_bytes: how much of a step's memory is alive at once, not how it steps (and not in checkpoints
# written before it existed: loading one fills in the default)
NOT_HYPERPARAMETERS = frozenset(
    {"params", "param_names", "lr", "initial_lr", "skip_together", "capturable", "chunk_bytes"}
)
# keys torch's LR schedulers add to a param group (OneCycleLR, CyclicLR, every LRScheduler): bookkeeping,
# neither hyperparameters of the core nor unknown keys
_SCHEDULER_KEYS = frozenset({"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"})
#: keys of a param group that are neither hyperparameters of the core nor unknown keys: torch's, and
#: ``skip_together``, an option of the step around the core (geoarray.torch._rank_agreement)
BOOKKEEPING = frozenset({"params", "param_names", "skip_together"}) | _SCHEDULER_KEYS
# not part of a core's identity: torch.compile's optimizer support shows every param group with
# capturable=True while it traces a step (torch/_dynamo/variables/optimizer.py, _set_capturable), so a
# key holding it would rebuild every core inside the compiled step; its value is checked eagerly
#: keys left out of the key that identifies a group's core
NOT_IN_KEY = BOOKKEEPING | {"capturable"}


def core_options(
    section: Any, retraction: Any, on_nonfinite: str, group_same_shape: bool, seed: int, chunk_bytes: Any = "default"
) -> dict:
    """The :data:`CORE_OPTIONS` as a param group's defaults (the convenience optimizers' keywords)."""
    return {
        "section": section,
        "retraction": retraction,
        "on_nonfinite": on_nonfinite,
        "group_same_shape": group_same_shape,
        "seed": seed,
        "chunk_bytes": chunk_bytes,
    }


def group_defaults(arguments: dict, *, leave_out: tuple[str, ...] = ()) -> dict:
    """A named optimizer's param-group defaults from its constructor's arguments (``locals()`` as its body
    starts): every argument but ``params``, the optimizer-wide ``skip_together`` and ``leave_out``, in the
    signature's order, the :data:`CORE_OPTIONS` among them; ``betas`` given as a list becomes a tuple, as
    torch keeps it."""
    skip = ("self", "__class__", "params", "skip_together", *leave_out)
    defaults = {k: v for k, v in arguments.items() if k not in skip}
    if isinstance(defaults.get("betas"), list):
        defaults["betas"] = tuple(defaults["betas"])
    return defaults


def group_core_options(group: dict) -> dict:
    """The group's :data:`CORE_OPTIONS`, the keywords of the core it builds; ``foreach=False`` (torch's
    switch, in the groups of the torch-convention optimizers) updates every parameter by its own call."""
    opts = {k: group[k] for k in CORE_OPTIONS}
    if group.get("foreach") is False:
        opts["group_same_shape"] = False
    return opts


def live(optimizer: Any, group: dict, key: str = "lr", index: int | None = None) -> Any:
    """``group[key]`` (or ``group[key][index]``) for a core, as the group holds it at every step: a
    :class:`LiveHyperparameter` that :class:`geoarray.torch.Optimizer` sets from the group before each update
    of the core. Called by a :class:`geoarray.torch.Recipe`'s ``build``. While a group is being added it is
    not one of the optimizer's groups yet, and its constant value builds the probe core."""
    if not is_group_of(optimizer, group):
        value = group[key] if index is None else group[key][index]
        return value.item() if isinstance(value, torch.Tensor) else float(value)
    return register(optimizer, group, LiveHyperparameter(key, index))


def live_or_zero(optimizer: Any, group: dict, key: str, index: int | None = None) -> Any:
    """:func:`live`, or the number 0 where the value is zero (no decay, no momentum buffer: another chain,
    which a recipe's ``zero_matters`` makes another core)."""
    if index is None and bool(group[key] == 0):
        return 0.0
    return live(optimizer, group, key, index)


def is_group_of(optimizer: Any, group: dict) -> bool:
    """Whether ``group`` is one of ``optimizer.param_groups`` (the dict itself, not an equal one)."""
    return any(g is group for g in optimizer.param_groups)


def register(optimizer: Any, group: dict, cell: LiveHyperparameter) -> LiveHyperparameter:
    """``cell``, set from ``group`` now and handed to the optimizer, which sets it again before every update of
    the core being built (:meth:`geoarray.torch.Optimizer._make_core` collects the cells of one build)."""
    cells = optimizer.__dict__.get("_building_cells")
    if cells is None:
        raise RuntimeError(
            f"a live hyperparameter ({cell.key!r}) was made outside the build of a core: call "
            "geoarray.torch.param_groups.live(optimizer, group, ...) inside a Recipe's build function, which "
            "geoarray.torch.Optimizer calls while it builds a param group's core"
        )
    cell.read(group)
    cells.append(cell)
    return cell


class LiveHyperparameter:
    """A hyperparameter of a param group as it is at every step — by default ``lr``, so that torch's LR
    schedulers (which write ``group["lr"]``) drive the core without rebuilding it. It is a callable of
    the step, as the core's schedules are.

    The value flows one way: :class:`geoarray.torch.Optimizer` reads the group and sets the cell
    (:meth:`read`) before it calls the core's update, and the core calls the cell; nothing in the core reads
    the optimizer or its param groups.

    ``key``/``index`` read another hyperparameter the same way (``group["betas"][0]``: OneCycleLR's
    momentum cycling); ``reference`` divides the value (a factor relative to the rate a core was built
    with).

    A tensor ``lr`` (torch's recipe for graph-captured and compiled steps under a scheduler, which
    writes it in place with ``fill_``) is returned as the tensor: the step multiplies by it on its device and reads
    nothing to the host, a CUDA graph replays it with the value of the moment, and a compiled step takes
    it as an input (no recompilation at a new rate). Other tensor hyperparameters are read with ``.item()``.
    """

    #: the value does not depend on the step t it is called with (the core then passes None)
    reads_step = False

    def __init__(self, key: str = "lr", index: int | None = None, reference: float = 1.0):
        self.key, self.index, self.reference = key, index, reference
        self.value: Any = None

    def read(self, group: dict) -> None:
        """Take the group's value of this hyperparameter (the optimizer calls this before every update)."""
        self.value = group[self.key]

    def __call__(self, t: Any = None) -> Any:
        value = self.value
        if value is None:
            raise RuntimeError(f"the live hyperparameter {self.key!r} was called before its optimizer set it")
        if self.index is not None:
            value = value[self.index]
        if isinstance(value, torch.Tensor) and self.key != "lr":
            value = value.item()
        elif isinstance(value, torch.Tensor) and value.ndim:  # one element (check_lr), as a scalar: a view
            value = value.reshape(())
        return value if self.reference == 1.0 else value / self.reference

    def host_value(self) -> float | None:
        """The value in force now, a Python float: the step's rate for the bound a transform gives its
        updates (:class:`geoarray.optim.transforms.GradientTransformation`'s ``bound``); None for a tensor
        ``lr``, which stays on its device (the step then has no bound: see :func:`scaled`)."""
        value = self()
        return None if isinstance(value, torch.Tensor) else float(value)


def core_lr(core: Any) -> float | None:
    """The constant learning rate a core was built with, where it says (``core.lr``), else None."""
    lr = getattr(core, "lr", None)
    value: Any
    try:
        value = lr(1) if callable(lr) else lr
        value = float(value)
    except Exception:  # a schedule that needs an array step: no constant rate
        return None
    return value if value > 0 and value != float("inf") else None


def check_capturable(group: dict, gi: Any, optimizer: str, *, live_lr: bool = True) -> None:
    """``TypeError``/``ValueError`` unless the group's ``capturable`` is a bool whose step a CUDA graph
    can capture: with ``capturable=True`` a tensor lr is on the parameters' device and read there at every
    step (``live_lr``: the optimizer reads the rate at every step, :class:`LiveHyperparameter`; one whose rate
    is inside its core, ``live_lr=False``, reads a tensor with ``.item()`` and takes a float only), and
    ``stabilize`` is off (its count lives in Python, outside a captured graph)."""
    capturable = group.get("capturable", False)
    if not isinstance(capturable, bool):
        raise TypeError(f"param_groups[{gi}]['capturable'] must be True or False, got {capturable!r}")
    if not capturable:
        return
    lr = group.get("lr")
    if isinstance(lr, torch.Tensor) and not live_lr:
        raise ValueError(
            f"{optimizer}(capturable=True) takes a float lr, got a tensor: its rate is inside its core, which "
            "reads a tensor lr to the host (.item()) at every step, and a CUDA graph cannot capture that; give a "
            "float (a captured step keeps the lr it was captured with: capture again after changing it)"
        )
    if isinstance(lr, torch.Tensor):
        devices = {p.device for p in group.get("params", ()) if isinstance(p, torch.Tensor)}
        if devices and lr.device not in devices:
            where = ", ".join(map(str, sorted(devices, key=str)))
            raise ValueError(
                f"{optimizer}(capturable=True) takes a tensor lr on the parameters' device ({where}), got one on "
                f"{lr.device}: a captured step would read a {lr.device} scalar once, when it is captured, and miss "
                "a scheduler's later values; create it there (torch.tensor(lr, device=...))"
            )
    if group.get("stabilize"):
        raise ValueError(
            f"{optimizer}(capturable=True) cannot take stabilize={group['stabilize']!r}: the projection every "
            "k steps is counted in Python, outside a captured graph; leave stabilize=None"
        )


def check_lr(lr: Any, name: str = "lr") -> None:
    """``ValueError`` naming ``name`` unless ``lr`` is a non-negative finite number (or a one-element tensor)."""
    value = lr.item() if isinstance(lr, torch.Tensor) and lr.numel() == 1 else lr
    # 0 is a rate, as in torch.optim (CosineAnnealingLR reaches it)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise ValueError(f"{name} must be a non-negative finite number, got {lr!r}")
