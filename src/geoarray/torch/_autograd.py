"""The analytic pullback of a geoarray layer as a ``torch.autograd.Function``."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

__all__ = ["analytic_apply"]


class _AnalyticLayer(torch.autograd.Function):
    """y = layer.apply(params, x) forward; backward through ``layer.vjp``'s hand-written pullback
    instead of torch's autograd of ``apply``. First-order only (no double backward)."""

    @staticmethod
    def forward(ctx: Any, layer: Any, treedef: Any, x: torch.Tensor, *leaves: torch.Tensor) -> torch.Tensor:
        y, pullback = layer.vjp(treedef.unflatten([p.detach() for p in leaves]), x.detach())
        ctx.pullback, ctx.treedef = pullback, treedef
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        dparams, dx = ctx.pullback(dy)
        ctx.pullback = None  # the saved forward quantities are not needed again
        return (None, None, dx, *ctx.treedef.flatten_up_to(dparams))


def analytic_apply(layer: Any, params: Any, x: torch.Tensor) -> torch.Tensor:
    """``layer.apply(params, x)`` whose gradients come from ``layer.vjp`` (the analytic pullback)."""
    import optree

    leaves, treedef = optree.tree_flatten(params)
    return _AnalyticLayer.apply(layer, treedef, x, *leaves)
