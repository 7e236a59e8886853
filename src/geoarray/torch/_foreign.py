"""What torch does to a :class:`~geoarray.torch.ManifoldParameter` outside geoarray's code, caught with
torch's public global hooks (installed once, when ``geoarray.torch`` is imported):

* **a foreign optimizer** — any ``torch.optim.Optimizer`` that is not geoarray's (``torch.optim.RMSprop``,
  ``Adagrad``, LBFGS, a third-party one) takes Euclidean steps, which leave the manifold (geotorch's
  sequential-MNIST example with ``torch.optim.RMSprop`` on geoarray weights ends 9.4e-3 off orthonormal).
  A global step pre-hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``) warns on the first
  step of such an optimizer that holds ManifoldParameters, naming them, their manifolds and the two fixes:
  a geoarray optimizer (Riemannian), or :func:`project_after` (projected). The check runs once per
  optimizer (again only when param groups are added); every later step of every optimizer, geoarray's
  included, costs the hook one dictionary lookup, ≈0.5 µs of Python on a 2-core CPU against ≈70 µs for
  the smallest ``torch.optim.SGD`` step. Not zero for geoarray's own optimizers: torch's step wrapper runs
  every global hook for every optimizer, and torch offers no construction hook that could check an
  optimizer once (a check at ``ManifoldParameter`` level cannot tell which optimizer changes it).
* **replacing a ManifoldParameter by a plain parameter** — ``module.load_state_dict(sd, assign=True)`` and
  ``module.weight = nn.Parameter(W)`` go through ``Module.register_parameter``, whose global hook
  (``torch.nn.modules.module.register_module_parameter_registration_hook``) turns the new parameter into
  a ManifoldParameter on the old one's manifold, projected to the nearest point where it is off it (values
  within the tolerance are kept bit for bit, sharing the new tensor's storage). To drop a constraint,
  ``del module.weight`` first. The hook also records, on the module, which of its parameters live on
  which manifold (``module.__dict__["_geoarray_manifolds"]``, copied by ``copy.deepcopy``), for the next points.
* **what torch does inside a module's own methods**, where no global hook runs: ``module.weight = W``
  with a bare tensor (geotorch's idiom; torch's ``__setattr__`` refuses it with a ``TypeError`` before
  any hook), and ``Module._apply`` and ``_load_from_state_dict``, which build new plain ``nn.Parameter``
  objects — ``module.to_empty(device=...)`` and ``.to(...)`` across device types (to or from ``meta``),
  and every conversion and ``load_state_dict`` under ``torch.__future__``'s swap or overwrite flags
  (``swap_tensors`` takes the class and the manifold of the old object) — dropping the manifold without a
  word. So a module that holds a ManifoldParameter gets, at its registration, a subclass of its own class
  (same name and module, one per class; as ``torch.nn.utils.parametrize`` and FSDP2 give theirs) whose
  ``__setattr__`` writes the nearest point of the manifold to a bare tensor into the ManifoldParameter (in
  place, as geotorch's assignment writes its parametrization's original), and whose ``_apply`` and
  ``_load_from_state_dict`` turn a rebuilt parameter back into a ManifoldParameter on the recorded manifold
  (in place: swap mode keeps the object an optimizer holds). Values that ``to_empty`` leaves uninitialised
  are refused by the first step of a geoarray optimizer, naming the initialisation. Pickling rebuilds the
  subclass; a module that ``torch.nn.utils.parametrize`` has already parametrized keeps its class (its
  ``remove_parametrizations`` restores ``__bases__[0]``). torch's FSDP2 sets the parameters of such a
  module by ``setattr`` instead of writing ``_parameters``, as for any module with its own ``__setattr__``
  (geoarray.torch.nn's containers too): ≈7 µs per parameter and change of state (4 per step) instead of
  ≈0.2 µs, measured on a 2-core CPU.
* **torch's own FSDP2** — ``torch.distributed.fsdp.fully_shard`` builds new ``nn.Parameter`` objects
  (without ``register_parameter``), dropping the manifold. geoarray's optimizers refuse such a parameter at
  their first step (:func:`refuse_torch_sharded`), naming ``geoarray.torch.fully_shard``, which keeps the
  manifolds; a foreign optimizer's warning names them too. The parameter is found through the record
  above and FSDP2's registry of sharded modules.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from torch.nn.utils import parametrize

from ..manifolds.base import Manifold
from . import _dtensor
from .parameter import ManifoldParameter, manifold_of

__all__ = ["install", "project_after", "refuse_torch_sharded"]

_RECORD = "_geoarray_manifolds"  # module.__dict__ key: {parameter name: manifold}
_CHECKED = "_geoarray_checked_groups"  # optimizer.__dict__ key: number of param groups checked
_PROJECTION = "_geoarray_projection"  # optimizer.__dict__ key: the handle of project_after's hook
#: torch.optim's optimizers that geoarray.torch has under the same name, signature and defaults
_FIX = {name: name for name in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam")}


def _is_geoarray(optimizer: Any) -> bool:
    if isinstance(optimizer, _OWN):
        return True
    # wrappers that step through an inner optimizer (ZeroRedundancyOptimizer's .optim, PostLocalSGD's .optim)
    inner = getattr(optimizer, "optim", None)
    return isinstance(inner, _OWN)


def _name(group: dict, gi: int, i: int, p: torch.Tensor) -> str:
    names = group.get("param_names")
    if isinstance(names, (list, tuple)) and i < len(names):
        return repr(names[i])
    return f"param_groups[{gi}]['params'][{i}] of shape {tuple(p.shape)}"


# -- foreign optimizers ---------------------------------------------------------------------------------


def _constrained(optimizer: Any) -> list[tuple[str, Manifold]]:
    """(name, manifold) of every trainable parameter of ``optimizer`` that lives on a manifold, including
    those whose manifold torch's fully_shard dropped."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    dropped = torch_sharded(params)
    out = []
    for gi, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            m = manifold_of(p)
            if m is None and id(p) in dropped:
                m = dropped[id(p)][1]
            if m is not None and p.requires_grad:
                out.append((_name(group, gi, i, p), m))
    return out


def _check_foreign_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Global step pre-hook: warn once per optimizer that is not geoarray's and steps ManifoldParameters."""
    state = optimizer.__dict__
    n = len(optimizer.param_groups)
    if state.get(_CHECKED) == n:  # every later step: one lookup
        return
    state[_CHECKED] = n
    if state.get(_PROJECTION) is not None or _is_geoarray(optimizer):
        return
    found = _constrained(optimizer)
    if not found:
        return
    kind = type(optimizer).__name__
    listed = ", ".join(f"{name} on {m!r}" for name, m in found[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    same = f"geoarray.torch.{_FIX[kind]}" if kind in _FIX else "geoarray.torch.Adam, AdamW or SGD"
    warnings.warn(
        f"{kind} is not a geoarray optimizer: its Euclidean steps move {listed}{more} off the manifold; use "
        f"{same} (Riemannian), or keep {kind} and project after each step with "
        "geoarray.torch.project_after(optimizer) (a projected method, not a Riemannian one)",
        UserWarning,
        stacklevel=3,  # the caller of optimizer.step(), through torch's step wrapper
    )


def project_after(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make a foreign ``torch.optim`` optimizer keep its ManifoldParameters on their manifolds; returns it.

    After each step (``optimizer.register_step_post_hook``) every ManifoldParameter it holds that has a
    gradient is replaced in place by its nearest point on the manifold (``M.nearest_point``: for orthonormal
    frames the polar factor U Vᵀ of Y = U Σ Vᵀ, Higham, *Functions of Matrices*, Theorem 8.4). This is a
    **projected** method — a Euclidean step followed by a projection (Absil, Mahony & Sepulchre,
    *Optimization Algorithms on Matrix Manifolds*, 2008, §4.1: the projection is a retraction, so a step
    along the *Riemannian* gradient followed by it is first-order Riemannian; the optimizer's own state —
    RMSprop's squares, Adagrad's sums, momentum — is a Euclidean quantity that is neither lifted nor
    transported, unlike geoarray's optimizers, which keep it in g^hor). The weights stay on the manifold to
    rounding (float32: max|YᵀY − I| ~ 1e-6). It silences the foreign-optimizer warning; calling it again
    is a no-op. Use ``optimizer = geoarray.torch.project_after(torch.optim.RMSprop(model.parameters()))``.

    Refused (``TypeError``/``ValueError`` naming the parameter): a geoarray optimizer (already on the
    manifold), a manifold without a closed-form projection (SymplecticStiefel), a sharded (DTensor) weight.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if _is_geoarray(optimizer):
        raise TypeError(
            f"{type(optimizer).__name__} is a geoarray optimizer, which keeps ManifoldParameters on their "
            "manifolds by Riemannian steps already; project_after is for other torch.optim optimizers"
        )
    if optimizer.__dict__.get(_PROJECTION) is not None:
        return optimizer
    for gi, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            _check_projectable(group, gi, i, p)
    optimizer.__dict__[_PROJECTION] = optimizer.register_step_post_hook(_project_after_step)
    return optimizer


def _check_projectable(group: dict, gi: int, i: int, p: torch.Tensor) -> Manifold | None:
    m = manifold_of(p)
    if m is None:
        return None
    if not m.has_nearest_point:
        raise ValueError(
            f"{_name(group, gi, i, p)} lives on {m!r}, which has no closed-form projection: project_after "
            "cannot keep it there; train it with a geoarray optimizer (geoarray.torch.Adam, AdamW, SGD)"
        )
    if _dtensor._is_dtensor(p):
        raise ValueError(
            f"{_name(group, gi, i, p)} is sharded (a DTensor): the projection needs whole matrices; train it "
            "with a geoarray optimizer (geoarray.torch.Adam, AdamW, SGD), which gathers what it needs"
        )
    return m


@torch.no_grad()
def _project_after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    for gi, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            if p.grad is None:  # not stepped: left bit for bit
                continue
            m = _check_projectable(group, gi, i, p)  # also for groups added after project_after
            if m is not None and p.numel():
                p.copy_(m.nearest_point(p.detach()))


# -- parameters replaced by torch ------------------------------------------------------------------------


def _on_register_parameter(module: torch.nn.Module, name: str, param: Any) -> Any:
    """Global parameter registration hook: record manifolds, keep them across replacement."""
    if param is None:
        return None
    record = module.__dict__.get(_RECORD)
    m = manifold_of(param)
    if m is not None:
        if record is None:
            record = module.__dict__[_RECORD] = {}
        record[name] = m
        _hold(module)
        return None
    old = module._parameters.get(name)
    old_m = manifold_of(old) if isinstance(old, ManifoldParameter) else None
    if old_m is None or _dtensor._is_dtensor(param):
        if record is not None and old is None:
            record.pop(name, None)  # a fresh plain parameter under this name (after del module.<name>)
        return None
    # load_state_dict(assign=True), module.<name> = nn.Parameter(W): the constraint stays, values projected
    where = f"{type(module).__name__}.{name} (on {old_m!r})"
    try:
        return ManifoldParameter(param.detach(), old_m, param.requires_grad)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where} cannot take the new parameter: {exc}; to drop the constraint, del it first") from None


# -- modules that hold ManifoldParameters ----------------------------------------------------------------


class _KeepsManifolds(torch.nn.Module):
    """The methods a module holding a ManifoldParameter gets (module docstring), first in its class's MRO."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            p = self.__dict__.get("_parameters", {}).get(name)
            m = manifold_of(p) if isinstance(p, ManifoldParameter) else None
            if m is not None:
                _assign(self, name, p, m, value)
                return
        super().__setattr__(name, value)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)
        _reattach(self)
        return out

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        _reattach(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        base = type(self).__dict__.get("_geoarray_base")
        if base is None:  # a class made on top of this one (FSDP2's): pickled as it is
            return super().__reduce_ex__(protocol)
        # the class is made at run time, so pickle cannot name it: its base, made again on loading
        return (_remake, (base,), self.__getstate__())


_CLASSES: dict[type[torch.nn.Module], type[torch.nn.Module]] = {}  # a module class → its subclass with them


def _holding(cls: type[torch.nn.Module]) -> type[torch.nn.Module]:
    holder = _CLASSES.get(cls)
    if holder is None:
        # the name and module of cls: repr, torch.fx's leaf modules (torch.nn's) and error messages unchanged
        attrs = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_geoarray_base": cls}
        holder = _CLASSES[cls] = type(cls.__name__, (_KeepsManifolds, cls), attrs)
    return holder


def _remake(base: type[torch.nn.Module]) -> torch.nn.Module:
    cls: Any = _holding(base)  # a Module subclass; without torch's stubs (nox -s lint) mypy sees type.__new__
    return cls.__new__(cls)  # pickle then sets its state (Module.__setstate__), as for any module


def _hold(module: torch.nn.Module) -> None:
    if isinstance(module, _KeepsManifolds) or parametrize.is_parametrized(module):
        return
    try:
        module.__class__ = _holding(type(module))
    except TypeError:  # a class whose instances cannot change class (a layout of its own): left as it is
        pass


def _reattach(module: torch.nn.Module) -> None:
    for name, m in module.__dict__.get(_RECORD, {}).items():
        p = module._parameters.get(name)
        if type(p) is torch.nn.Parameter:  # rebuilt by torch (a DTensor of FSDP2's is not: see fully_shard)
            p.__class__ = ManifoldParameter
            cast(ManifoldParameter, p).manifold = m


@torch.no_grad()
def _assign(module: torch.nn.Module, name: str, p: ManifoldParameter, m: Manifold, value: torch.Tensor) -> None:
    """``module.<name> = value`` for a bare tensor: its nearest point on ``m`` written into ``p``."""
    where = f"{type(module).__name__}.{name} (a ManifoldParameter of shape {tuple(p.shape)} on {m!r})"
    if tuple(value.shape) != tuple(p.shape):
        raise ValueError(
            f"{where} cannot take a tensor of shape {tuple(value.shape)}: assign one of shape {tuple(p.shape)}, "
            f"which is projected onto the manifold; to drop the constraint, del module.{name} first"
        )
    try:  # values within the tolerance are kept bit for bit, others projected (polar factor), as on registration
        new = ManifoldParameter(value.detach().to(device=p.device, dtype=p.dtype), m, requires_grad=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where} cannot take the tensor: {exc}") from None
    p.copy_(new)


# -- torch's fully_shard ---------------------------------------------------------------------------------


def torch_sharded(params: list) -> dict[int, tuple[str, Manifold]]:
    """``{id(p): (module.name, manifold)}`` for the DTensor parameters among ``params`` that were
    ManifoldParameters before ``torch.distributed.fsdp.fully_shard`` replaced them (without a manifold).
    Empty, at no cost, when no DTensor exists or none lacks a manifold."""
    cls = _dtensor._dtensor_type()
    if cls is None:
        return {}
    wanted = {id(p) for p in params if isinstance(p, cls) and manifold_of(p) is None}
    if not wanted:
        return {}
    try:  # FSDP2's registry of the modules it manages (torch >= 2.4)
        from torch.distributed._composable_state import _module_state_mapping
    except ImportError:
        return {}
    out = {}
    for root in list(_module_state_mapping.keys()):
        for path, module in root.named_modules():
            for name, m in module.__dict__.get(_RECORD, {}).items():
                p = module._parameters.get(name)
                if p is not None and id(p) in wanted:
                    out[id(p)] = (f"{path}.{name}" if path else name, m)
    return out


def refuse_torch_sharded(params: list, name_of: Callable[[int], str]) -> None:
    """Raise ``ValueError`` if one of ``params`` is a ManifoldParameter that torch's ``fully_shard`` sharded
    (so that it lost its manifold): a geoarray optimizer would step it as Euclidean. Called when a geoarray
    optimizer first creates state for ``params`` (its first step), ``name_of(k)`` naming ``params[k]`` (formatted
    only for the error); free when no DTensor exists."""
    dropped = torch_sharded(params)
    for k, p in enumerate(params):
        if id(p) in dropped:
            where, m = dropped[id(p)]
            raise ValueError(
                f"{name_of(k)} ({where}) was a ManifoldParameter on {m!r} until torch.distributed.fsdp.fully_shard "
                "replaced it by a plain parameter, which would take Euclidean steps off the manifold; shard "
                "with geoarray.torch.fully_shard(module, ...) instead (same arguments, manifolds kept)"
            )


_HANDLES: list = []
#: geoarray's optimizer class, handed over by install(): the step hook leaves its instances alone (given,
#: not imported, because geoarray.torch.optimizer imports this module)
_OWN: tuple[type, ...] = ()


def install(own: type) -> None:
    """Register the two global hooks (idempotent; called when ``geoarray.torch`` is imported); ``own``: the
    class of geoarray's optimizers (:class:`geoarray.torch.Optimizer`), whose steps are not foreign."""
    global _OWN
    _OWN = (own,)
    if _HANDLES:
        return
    from torch.nn.modules.module import register_module_parameter_registration_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _HANDLES.append(register_optimizer_step_pre_hook(_check_foreign_step))
    _HANDLES.append(register_module_parameter_registration_hook(_on_register_parameter))
