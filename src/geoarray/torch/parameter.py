"""``ManifoldParameter``: an ``nn.Parameter`` that knows the manifold its values live on."""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..manifolds.base import Manifold
from ..manifolds.euclidean import Euclidean

__all__ = ["ManifoldParameter", "check_manifold_tensor", "manifold_of"]


def check_manifold_tensor(tensor: Any, manifold: Manifold, name: str, *, on_manifold: bool = False) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``name`` unless ``tensor`` can be a point of ``manifold``.

    Static checks (a real floating dtype; float16/bfloat16 weights are stepped in float32 by the optimizers,
    a shape ending in ``manifold.point_shape``) always; with
    ``on_manifold=True`` also ``manifold.is_point`` at its default tolerance (one host read).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise TypeError(f"{name} lives on {manifold!r} and must have a real floating dtype, got {tensor.dtype}")
    shape = manifold.point_shape
    if shape is not None and tuple(tensor.shape[-len(shape) :]) != tuple(shape):
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}, which does not end in {tuple(shape)} as {manifold!r} needs"
        )
    if (
        on_manifold
        and not isinstance(manifold, Euclidean)
        and tensor.numel()
        and not manifold.is_point(tensor.detach())
    ):
        raise ValueError(
            f"{name} is not a point of {manifold!r} (M.is_point at its default tolerance); start from a point of the "
            "manifold, e.g. M.random(...) or the Q factor of a QR decomposition"
        )


def manifold_of(p: torch.Tensor) -> Manifold | None:
    """The manifold of a parameter: its ``manifold`` for a :class:`ManifoldParameter`, None otherwise."""
    m = getattr(p, "manifold", None)
    return None if m is None or isinstance(m, Euclidean) else m


def _rebuild(data: torch.Tensor, manifold: Manifold | None, requires_grad: bool, state: dict) -> ManifoldParameter:
    p = ManifoldParameter(data, manifold, requires_grad=requires_grad, check=False)
    extra = {k: v for k, v in state.items() if k != "manifold"}
    p.__dict__.update(extra)
    return p


class ManifoldParameter(torch.nn.Parameter):
    """A parameter constrained to ``manifold``: ``ManifoldParameter(tensor, geoarray.Stiefel(10, 3))``.

    It behaves as an ``nn.Parameter`` everywhere (``nn.Module`` registration, autograd, ``state_dict``;
    operations on it return plain tensors) and carries ``.manifold``, which
    :class:`geoarray.torch.Optimizer` reads to run Algorithm 1 of Brantner's paper (Riemannian
    gradient, lift, cache update, retraction) instead of a Euclidean update. The manifold survives
    ``copy.deepcopy``, pickling and ``torch.save``/``torch.load`` (``weights_only=False``; a
    ``state_dict`` stores plain tensors, and ``load_state_dict`` copies into the existing
    parameter, which keeps its manifold), and ``module.to(device/dtype)`` (which replaces the data
    of the same object).

    The tensor's shape must end in ``manifold.point_shape`` (leading axes are a batch of points,
    e.g. the stacked heads of an attention layer) and its dtype real floating (float16/bfloat16 weights
    are stepped in float32 and cast back); ``check=True``
    (the default) also refuses values off the manifold (``manifold.is_point``; one host read).
    ``manifold=None`` or ``Euclidean()`` means unconstrained.
    """

    def __new__(
        cls,
        data: torch.Tensor | None = None,
        manifold: Manifold | None = None,
        requires_grad: bool = True,
        *,
        check: bool = True,
    ):
        if data is None:
            data = torch.empty(0)
        if manifold is not None and not isinstance(manifold, Manifold):
            raise TypeError(f"manifold must be a geoarray Manifold or None, got {type(manifold).__name__}")
        if manifold is not None and check:
            check_manifold_tensor(data, manifold, "data", on_manifold=True)
        if type(data) is not torch.Tensor and isinstance(data, torch.Tensor):
            data = data.detach()
            if type(data) is not torch.Tensor:  # a Parameter: its plain-tensor view
                data = data.as_subclass(torch.Tensor)
        p = torch.Tensor._make_subclass(cls, data, requires_grad)
        p.manifold = manifold
        return p

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # everything happens in __new__
        pass

    def __deepcopy__(self, memo: dict) -> ManifoldParameter:
        if id(self) in memo:
            return memo[id(self)]
        result = ManifoldParameter(
            self.data.clone(memory_format=torch.preserve_format),
            copy.deepcopy(self.manifold, memo),
            self.requires_grad,
            check=False,
        )
        memo[id(self)] = result
        return result

    def __reduce_ex__(self, proto: int) -> tuple:
        # nn.Parameter rebuilds a plain Parameter; hooks are not serialised (as in torch)
        state = dict(self.__dict__)
        return (_rebuild, (self.data, self.manifold, self.requires_grad, state))

    def __repr__(self) -> str:
        return f"ManifoldParameter on {self.manifold!r} containing:\n" + torch.Tensor.__repr__(self.data)
