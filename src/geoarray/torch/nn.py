"""``nn.Module`` wrappers of geoarray layers: constrained weights registered as ``ManifoldParameter``.

In use::

    attn = geoarray.torch.nn.MultiHeadAttention(49, 7)       # the layer's arguments, plus seed/dtype/device
    y = attn(x)                                              # x: (..., T, 49)
    model = geoarray.torch.nn.Module(any_layer)              # any object with init/manifolds/apply(/vjp)

Every layer class of :mod:`geoarray.nn` has a wrapper of the same name here (``StiefelLayer``,
``MultiHeadAttention``, ``Chain``, …), taking the layer's own arguments plus the keywords ``seed``,
``dtype``, ``device`` and ``analytic``; :class:`Module` wraps any object that follows the layer
contract (``init``, ``manifolds``, ``apply``, and ``vjp`` for ``analytic=True``), e.g. the models of
``geoarray.models``, whose classes are also reachable here by name once that module exists.

The layer's parameter tree (``layer.init``) is registered under ``params``: dict keys and sequence
positions become submodule and parameter names (``params.Y``, ``params.0.PQ``), and each weight whose
entry in ``layer.manifolds()`` is a manifold becomes a :class:`~geoarray.torch.ManifoldParameter` on it,
so :mod:`geoarray.torch.optim` keeps it on the manifold. The parameters are contiguous, and keep their
manifolds under torch's own ``fully_shard`` (FSDP2), with or without a ``MixedPrecisionPolicy``.

Gradients: by default torch's autograd differentiates ``layer.apply``; ``analytic=True`` uses the
layer's hand-written pullback (``layer.vjp``) through a ``torch.autograd.Function`` instead (first
order only). The two agree to rounding (tested to 1e-10 in float64 for every layer). Inside a
``torch.func`` transform (``vmap`` of ``functional_call`` over an ensemble, ``grad``, ``jacrev``) the
pullback runs from the saved inputs, recomputing the forward once per backward; reverse-over-reverse
derivatives work there, forward mode (``jvp``, ``jacfwd``, ``hessian``) needs ``analytic=False``.

Under ``torch.autocast`` a layer runs in its parameters' dtype with autocast switched off inside it (as
torch runs its linear algebra and softmax in float32 there): a half-precision input is cast to that
dtype, differentiably, and the output keeps it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import array_api_compat.torch as _xp
import optree
import torch

from .. import nn as _ga_nn
from ._autograd import analytic_apply
from .parameter import ManifoldParameter

__all__ = ["Module", "wrapper"]


class _Node(torch.nn.Module):
    """A container of parameters and child nodes mirroring a node of the parameter tree.

    It keeps the manifold of each of its parameters: a parameter put in a manifold's place without one
    gets it back. torch's ``fully_shard`` (FSDP2) replaces every parameter by a plain ``nn.Parameter``
    holding a DTensor, which would otherwise take Euclidean steps off the manifold; it does so through
    ``setattr`` on a module that defines its own (:func:`geoarray.torch.fully_shard` does the same for
    any module)."""

    # torch declares values that may be None (a registered None); this container only ever holds nodes and
    # parameters, and dict's invariance makes the narrower declaration an "incompatible" override
    _modules: dict[str, _Node]  # type: ignore[assignment]
    _parameters: dict[str, torch.nn.Parameter]  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self._manifold_of: dict[str, Any] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        m = self.__dict__.get("_manifold_of", {}).get(name)
        if m is not None and isinstance(value, torch.nn.Parameter) and getattr(value, "manifold", None) is None:
            value.manifold = m  # type: ignore[attr-defined]  # the attribute ManifoldParameter reads

    def forward(self, *args: Any) -> Any:  # pragma: no cover - a container, never called
        raise RuntimeError("a parameter container is not callable")


class Module(torch.nn.Module):
    """An ``nn.Module`` around a geoarray layer (or model): ``Module(layer, seed=0, dtype=None, device=None,
    analytic=False, params=None)``.

    ``params`` (a tree of tensors shaped like ``layer.init``'s) replaces the initialisation. ``dtype``
    defaults to ``torch.get_default_dtype()``. ``forward(x)`` is ``layer.apply(params, x)``.
    """

    def __init__(
        self,
        layer: Any,
        *,
        seed: Any = 0,
        dtype: torch.dtype | None = None,
        device: Any = None,
        analytic: bool = False,
        params: Any = None,
    ):
        super().__init__()
        for method in ("init", "manifolds", "apply") + (("vjp",) if analytic else ()):
            if not callable(getattr(layer, method, None)):
                needed = "init, manifolds, apply" + (", vjp" if analytic else "")
                raise TypeError(
                    f"layer must follow the layer contract ({needed}); {type(layer).__name__} has no {method}()"
                )
        self.layer = layer
        self.analytic = bool(analytic)
        if params is None:
            dtype = torch.get_default_dtype() if dtype is None else dtype
            params = layer.init(seed, xp=_xp, dtype=dtype, device=device)
        paths, leaves, treedef = optree.tree_flatten_with_path(params)
        if not all(isinstance(t, torch.Tensor) for t in leaves):
            raise TypeError("params must be a tree of torch tensors")
        manifolds = optree.tree_structure(params, none_is_leaf=True).flatten_up_to(layer.manifolds())
        # the tree with each parameter's slot number for a leaf: param_tree maps it (dynamo traces tree_map,
        # where it breaks the graph at the eager treedef's unflatten: a compiled forward was cut into pieces)
        self._slot_tree = treedef.unflatten(list(range(len(leaves))))
        self._slots: list[tuple[tuple[str, ...], str]] = []
        self._manifolds = tuple(manifolds)
        self.params = _Node()
        for path, leaf, m in zip(paths, leaves, manifolds, strict=True):
            names = tuple(str(k) for k in path) or ("param",)
            node = self.params
            for name in names[:-1]:
                if name not in node._modules:
                    node.add_module(name, _Node())
                node = node._modules[name]
            # contiguous, as torch's parameters are: FSDP2 shards no other, and QR gives column-major frames
            # (a step is no slower on them: the whole paper-ViT training step 0.99×, PaperAdam's step 0.96–0.98×)
            data = leaf.detach().contiguous()
            p = ManifoldParameter(data, m, check=False) if m is not None else torch.nn.Parameter(data)
            node.register_parameter(names[-1], p)
            if m is not None:
                node._manifold_of[names[-1]] = m
            self._slots.append((names[:-1], names[-1]))

    def extra_repr(self) -> str:
        return f"{self.layer!r}" + (", analytic=True" if self.analytic else "")

    def _node(self, path: tuple[str, ...]) -> _Node:
        node = self.params
        for name in path:
            node = node._modules[name]
        return node

    def param_tree(self) -> Any:
        """The layer's parameter tree, holding this module's current parameters."""
        leaves = [self._node(path)._parameters[name] for path, name in self._slots]
        return optree.tree_map(lambda slot: leaves[slot], self._slot_tree)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = self.param_tree()
        device_type = x.device.type if isinstance(x, torch.Tensor) else None
        if device_type is not None and torch.is_autocast_enabled(device_type):
            # under torch.autocast the layer runs in its parameters' dtype, as torch runs its linear algebra,
            # softmax and norms in float32 there: a half-precision matrix product would break the structure
            # the layer preserves (symplecticity, volume, orthonormality) at the 1e-2 level, and its pullback
            # would meet half-precision cotangents beside float32 weights. The input is cast (differentiably)
            # to that dtype, the output keeps it.
            with torch.autocast(device_type, enabled=False):
                return self._apply_layer(params, _in_dtype_of(x, self.parameters()))
        return self._apply_layer(params, x)

    def _apply_layer(self, params: Any, x: Any) -> Any:
        if self.analytic:
            return analytic_apply(self.layer, params, x)
        return self.layer.apply(params, x)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # torch's swap/overwrite conversion modes (torch.__future__) rebuild parameters as plain
        # nn.Parameter; put the manifold back on them
        out = super()._apply(fn, recurse)
        for (path, name), m in zip(self._slots, self._manifolds, strict=True):
            node = self._node(path)
            p = node._parameters[name]
            if m is not None and not isinstance(p, ManifoldParameter):
                node._parameters[name] = ManifoldParameter(p.detach(), m, p.requires_grad, check=False)
        return out


def _in_dtype_of(x: torch.Tensor, parameters: Any) -> torch.Tensor:
    """``x`` cast to the dtype of the first floating parameter (``x`` itself for a layer without one, or
    for an input that is not floating)."""
    if not x.is_floating_point():
        return x
    for p in parameters:
        if p.is_floating_point():
            return x if x.dtype == p.dtype else x.to(p.dtype)
    return x


def wrapper(layer_cls: type) -> type:
    """An ``nn.Module`` class around a layer class: its constructor takes the layer's arguments plus
    ``seed``, ``dtype``, ``device``, ``analytic`` (see :class:`Module`)."""
    name = layer_cls.__name__

    def __init__(
        self, *args: Any, seed: Any = 0, dtype: Any = None, device: Any = None, analytic: bool = False, **kwargs: Any
    ):
        Module.__init__(self, layer_cls(*args, **kwargs), seed=seed, dtype=dtype, device=device, analytic=analytic)

    doc = (
        f"``nn.Module`` wrapper of :class:`{layer_cls.__module__}.{name}`; arguments are the layer's plus "
        f"``seed``, ``dtype``, ``device``, ``analytic`` (see :class:`geoarray.torch.nn.Module`).\n\n"
        + inspect.cleandoc(layer_cls.__doc__ or "")
    )
    return type(name, (Module,), {"__init__": __init__, "__doc__": doc, "__module__": __name__, "__qualname__": name})


def _layer_classes(module: Any) -> dict[str, type]:
    out = {}
    for name in getattr(module, "__all__", dir(module)):
        obj = getattr(module, name, None)
        if inspect.isclass(obj) and issubclass(obj, _ga_nn.Layer) and obj is not _ga_nn.Layer:
            out[name] = obj
    return out


#: the geoarray.nn layer classes wrapped here, by name
LAYERS: dict[str, type] = {}
for _name, _cls in _layer_classes(_ga_nn).items():
    LAYERS[_name] = globals()[_name] = wrapper(_cls)
    __all__.append(_name)
del _name, _cls


def __getattr__(name: str) -> Any:
    """Wrappers of ``geoarray.models`` classes, created on first access (models import more than layers)."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = getattr(importlib.import_module("geoarray.models"), name, None)
    if cls is None or not inspect.isclass(cls) or not all(callable(getattr(cls, m, None)) for m in ("init", "apply")):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    wrapped = globals()[name] = wrapper(cls)
    return wrapped
