"""``torch.amp.GradScaler`` on the device: a geoarray.torch step under a scaler reads nothing to the host.

For an optimizer without ``_step_supports_amp_scaling``, ``scaler.step(opt)`` unscales the gradients and
then reads whether they held an inf or NaN to the host (``found_inf.item()``) to decide whether to call
``opt.step()``: one host read per step, which on a GPU waits for the whole backward pass. torch's fused
Adam declares ``_step_supports_amp_scaling``; :class:`geoarray.torch.Optimizer` declares it where such a
read is not free — where :func:`geoarray.set_host_reads` allows no read on its parameters' device (on a
GPU by default) — and leaves the scaler its own route elsewhere (on the CPU a read is a load, and the
scaler's fused check-and-unscale is one pass over the gradients, where this route takes two). The scaler
then checks the gradients on the device, sets two tensors on the optimizer — ``grad_scale`` (the scale
the gradients still carry, None where ``scaler.unscale_(opt)`` already removed it) and ``found_inf``
(nonzero when a gradient was not finite) — calls ``opt.step()`` and deletes them. The step

1. divides the gradients by ``grad_scale`` in place (multiplies by its reciprocal, formed in float64 and
   rounded to float32 as ``GradScaler.unscale_`` does), so that after ``scaler.step`` every ``p.grad``
   holds the unscaled gradient, as on the scaler's own route;
2. decides on the device. A core that takes an outside skip flag (``update(..., skip=)``: every
   Algorithm-1 optimizer, manifold Muon and a partition of them, whatever their ``on_nonfinite``) is
   handed ``found_inf != 0`` and masks the step itself (:func:`geoarray.optim.nonfinite.gate`): parameters
   and state unchanged where it is set, its ``skipped`` count untouched. Any other core (an optimizer of
   the user's) is handed gradients zeroed where ``found_inf`` is set (no inf or NaN reaches its linear
   algebra) and the old parameters and state are selected back: a ``where`` per parameter and per state
   tensor.
   ``benchmarks/grad_scaler_step.py`` times both routes.

A step skipped for the scaler is not counted in the state's ``skipped`` (the scaler counts it, in its scale);
the core's own ``on_nonfinite`` policy still applies to non-finite gradients the scaler did not see.
"""

from __future__ import annotations

from typing import Any

import torch

from ._dtensor import _dtensor_type

__all__ = ["scaler_flags", "takes_skip_flag", "unscale_", "zero_where_found"]


def scaler_flags(optimizer: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(grad_scale, found_inf)`` as ``GradScaler.step`` set them on the optimizer (None, None outside)."""
    return getattr(optimizer, "grad_scale", None), getattr(optimizer, "found_inf", None)


def unscale_(param_groups: list[dict], grad_scale: torch.Tensor) -> None:
    """Divide every gradient of ``param_groups`` by ``grad_scale`` in place (DTensor gradients: their
    local shards; a scalar factor commutes with any placement)."""
    inv = grad_scale.double().reciprocal().float()
    cls = _dtensor_type()
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for group in param_groups:
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if cls is not None and isinstance(g, cls):
                g = g.to_local()
            by_device.setdefault(g.device, []).append(g)
    for device, grads in by_device.items():
        torch._foreach_mul_(grads, inv.to(device).reshape(()))


def takes_skip_flag(core: Any) -> bool:
    """Whether the core masks a step on an outside skip flag itself (module docstring, 2): its ``update``
    takes ``skip=`` (``takes_skip_flag``: geoarray's optimizers, partitions of them included)."""
    return bool(getattr(core, "takes_skip_flag", False))


def zero_where_found(grads: list[torch.Tensor], skip: torch.Tensor) -> list[torch.Tensor]:
    """The gradients, zeros where ``skip``: a skipped step computes on finite numbers."""
    out = []
    for g in grads:
        s = skip.to(g.device)
        out.append(torch.where(s, torch.zeros((), dtype=g.dtype, device=g.device), g))
    return out
