"""Automatic differentiation and vectorised compilation where the backend has them (torch.func, JAX).

NumPy, CuPy and array-api-strict have no autodiff: the library's layers carry analytic pullbacks
(``layer.vjp``) for them, and these functions raise a ``ValueError`` naming the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._typing import Array
from .namespace import backend_name, is_jax, is_torch

Namespace = Any


def has_autodiff(xp: Namespace) -> bool:
    """Whether ``xp`` is a backend with automatic differentiation (torch, JAX)."""
    return is_torch(xp) or is_jax(xp)


def _refuse(what: str, xp: Namespace) -> ValueError:
    return ValueError(f"{what} needs PyTorch or JAX arrays (automatic differentiation), got {backend_name(xp)}")


def value_and_grad(fn: Callable[[Any], Array], params: Any, xp: Namespace) -> tuple[Array, Any]:
    """``(fn(params), ∇fn(params))`` for a scalar ``fn`` of a pytree: ``torch.func.grad_and_value`` on
    torch, ``jax.value_and_grad`` on JAX. The gradient has the tree structure of ``params``."""
    if is_torch(xp):
        import torch.func

        grads, value = torch.func.grad_and_value(fn)(params)
        return value, grads
    if is_jax(xp):
        import jax

        return jax.value_and_grad(fn)(params)
    raise _refuse("value_and_grad", xp)


def jacfwd(fn: Callable[[Array], Array], x: Array, xp: Namespace) -> Array:
    """The Jacobian ∂fn/∂x of ``fn`` at the vector ``x`` by forward mode (jitted on JAX), shape
    ``fn(x).shape + x.shape``."""
    if is_jax(xp):
        import jax

        return jax.jit(jax.jacfwd(fn))(x)
    if is_torch(xp):
        import torch.func

        return torch.func.jacfwd(fn)(x)
    raise _refuse("jacfwd", xp)


def vmap_compiled(fn: Callable[[Array], Array], xp: Namespace) -> Callable[[Array], Array] | None:
    """``fn`` mapped over the leading axis and compiled as one program (``jax.jit(jax.vmap(fn))``) where
    that pays (JAX, whose eager dispatch costs per operation); None elsewhere (loop instead)."""
    if not is_jax(xp):
        return None
    import jax

    return jax.jit(jax.vmap(fn))


def jit_with_fallback(fn: Callable[..., Any], xp: Namespace) -> Callable[..., Any]:
    """``jax.jit(fn)`` on JAX (eager JAX dispatches every small op: a ViT step is ~40× slower), else ``fn``.

    If tracing fails (Python control flow on array values, or a host draw such as the optimizers'
    ``section="random"``), the call is repeated eagerly and ``fn`` is used from then on.
    """
    if not is_jax(xp):
        return fn
    import jax

    current: list[Callable[..., Any]] = [jax.jit(fn)]

    def call(*args: Any) -> Any:
        if current[0] is not fn:
            try:
                return current[0](*args)
            except TypeError:  # jax's ConcretizationTypeError and friends are TypeErrors
                current[0] = fn
        return fn(*args)

    return call
