"""Constrain the weights of existing modules: ``geoarray.torch.orthogonal_(module, "weight")``.

geotorch's ``geotorch.orthogonal(layer, "weight")`` in geoarray's terms: the weight becomes a
:class:`~geoarray.torch.ManifoldParameter` on a Stiefel manifold (projected to the nearest point, the
polar factor of the current weight), which geoarray.torch's optimizers keep on the manifold by
Algorithm 1 of Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*
(lifted gradient, cache update in g^hor, retraction), not by a parametrization in the forward pass.

* **tall or square** weights (rows ≥ columns, e.g. ``nn.Linear(10, 20).weight`` of shape 20×10, the
  recurrent 128×128 weight of an orthogonal RNN): orthonormal columns, ``Stiefel(rows, cols)``
  (``Stiefel(n, n)`` is the orthogonal group O(n)); the module's attribute is replaced by the
  ManifoldParameter, so ``module.weight`` and ``state_dict`` keys are unchanged.
* **wide** weights (rows < columns, e.g. ``nn.Linear(20, 10).weight``, 10×20): orthonormal *rows*,
  WWᵀ = I. The stored parameter is the tall Wᵀ on ``Stiefel(cols, rows)``, and the module's weight is
  its transpose through ``torch.nn.utils.parametrize`` (a view: no copy in the forward pass, autograd
  transposes the gradient). The parameter lives at ``module.parametrizations.weight.original``, as with
  geotorch and ``torch.nn.utils.parametrizations.orthogonal``, so ``state_dict`` keys change
  accordingly.
* **geotorch checkpoints**: ``orthogonal_`` on a weight that geotorch (or torch's own orthogonal
  parametrization) constrains takes the parametrization's current value (:func:`orthogonal_`).
* **assignment**: ``module.weight = W`` with a tensor of the weight's shape writes the nearest point of
  the manifold to W (the polar factor; W itself where it is on the manifold) into the parameter, in
  place, as geotorch's assignment does: for a tall or square weight through the ``__setattr__`` of the
  module (``geoarray.torch._foreign``), for a wide one through ``_Transpose.right_inverse``.
* **the meta device**: a module built there (``with torch.device("meta")``, FSDP2's recipe) has no values
  to project; its weight becomes a ManifoldParameter unchecked, ``module.to_empty(device=...)`` keeps
  it one, and a geoarray optimizer's first step refuses it until it is initialised on the manifold
  (``geoarray.torch.init.uniform_init_``, or ``load_state_dict``).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.nn.utils import parametrize

from ..manifolds.grassmann import Grassmann
from ..manifolds.stiefel import OrthonormalFrames, Stiefel
from .parameter import ManifoldParameter

__all__ = ["orthogonal_"]


class _Transpose(torch.nn.Module):
    """W = Xᵀ: a wide weight with orthonormal rows from a tall point X with orthonormal columns.

    ``right_inverse`` (what ``module.weight = W`` calls through ``torch.nn.utils.parametrize``) stores the
    nearest point of the manifold to Wᵀ (the polar factor), so an assigned weight lands on the manifold, as
    geotorch's assignment does."""

    def __init__(self, manifold: OrthonormalFrames | None = None) -> None:
        super().__init__()
        self.manifold = manifold

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X.mT

    def right_inverse(self, W: torch.Tensor) -> torch.Tensor:
        manifold = getattr(self, "manifold", None)  # None: pickled before it was kept, or orthogonal_ itself
        X = W.detach().mT
        if manifold is None or not X.numel():
            return X.contiguous()
        return manifold.nearest_point(X).contiguous()


def orthogonal_(module: torch.nn.Module, name: str = "weight", *, grassmann: bool = False) -> torch.nn.Module:
    """Constrain ``module.<name>`` to have orthonormal columns (tall/square) or rows (wide), in place.

    The current values are mapped to the nearest such matrix (polar factor). ``grassmann=True`` uses
    ``Grassmann`` (only the column space matters) instead of ``Stiefel``. Leading axes of a weight with
    more than two dimensions are a batch of matrices. Returns ``module``. Train it with a
    geoarray.torch optimizer (``geoarray.torch.Adam(model.parameters(), ...)``); a plain
    ``torch.optim`` optimizer does not keep the constraint.

    A weight already constrained by a parametrization — ``geotorch.orthogonal``,
    ``torch.nn.utils.parametrizations.orthogonal`` — is replaced by the parametrization's current value.
    This loads a geotorch checkpoint: build the model with geotorch as it was trained,
    ``model.load_state_dict(...)``, then ``orthogonal_`` each constrained weight.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if parametrize.is_parametrized(module, name):
        # geotorch.orthogonal, torch.nn.utils.parametrizations.orthogonal or an earlier orthogonal_: the
        # parametrization's current value becomes the plain weight (projected below like any other)
        parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    weight = getattr(module, name, None)
    if not isinstance(weight, torch.nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no parameter {name!r} (got {type(weight).__name__})")
    if weight.ndim < 2:
        raise ValueError(
            f"{type(module).__name__}.{name} has shape {tuple(weight.shape)}; orthogonal_ needs a matrix (or a batch)"
        )
    rows, cols = weight.shape[-2:]
    kind = Grassmann if grassmann else Stiefel
    check = not weight.is_meta  # on the meta device there is nothing to check or project (module docstring)
    if rows >= cols:
        setattr(module, name, ManifoldParameter(weight.detach(), kind(rows, cols), weight.requires_grad, check=check))
        return module
    transpose = _Transpose()
    parametrize.register_parametrization(module, name, transpose, unsafe=True)
    # register_parametrization made module.parametrizations a ModuleDict (torch types it as Tensor | Module)
    plist: Any = cast(torch.nn.ModuleDict, module.parametrizations)[name]
    original = plist.original
    plist.original = ManifoldParameter(original.detach(), kind(cols, rows), original.requires_grad, check=check)
    transpose.manifold = plist.original.manifold  # from now on, module.<name> = W projects onto it
    return module
