"""``ManifoldParameter``: an ``nn.Parameter`` that knows the manifold its values live on; projections.

* ``ManifoldParameter(data, manifold)`` maps weights that are off the manifold to the nearest point
  (``project=True``, the default) or refuses them (``project=False``) with the measured error, the
  tolerance and the fix; ``p.proj_()`` and :func:`project_` project in place (geoopt's ``proj_()``).
* :func:`nearest_point`: for orthonormal frames (``Stiefel``, ``Grassmann``, the orthogonal group
  ``Stiefel(n, n)``) the orthogonal polar factor U Vᵀ of Y = U Σ Vᵀ, the nearest matrix with
  orthonormal columns in the Frobenius (and every unitarily invariant) norm (Higham, *Functions of
  Matrices*, Theorem 8.4), computed by :func:`geoarray.linalg.polar`. Symplectic Stiefel has no
  closed-form nearest point: such weights must start on the manifold.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..manifolds.base import Manifold

__all__ = ["ManifoldParameter", "check_manifold_tensor", "manifold_of", "nearest_point", "point_error", "project_"]


def point_error(tensor: torch.Tensor, manifold: Manifold) -> float | None:
    """``manifold.point_error``: the distance from the manifold that ``is_point`` compares with its
    tolerance (for frames max |YᵀY − I|, in float32 at least); None for manifolds without such a measure."""
    return manifold.point_error(tensor.detach())


def nearest_point(tensor: torch.Tensor, manifold: Manifold) -> torch.Tensor | None:
    """The nearest point of ``manifold`` to ``tensor`` (``manifold.nearest_point``, module docstring), a
    new tensor of its dtype and device; None where the manifold has no closed-form projection."""
    if not manifold.has_nearest_point:
        return None
    return manifold.nearest_point(tensor.detach())


def _tolerance(tensor: torch.Tensor, manifold: Manifold) -> float:
    import array_api_compat.torch as xp

    return Manifold.default_atol(tensor.dtype, xp)


def _off_manifold_message(name: str, tensor: torch.Tensor, manifold: Manifold, *, projected: bool = False) -> str:
    err, tol = point_error(tensor, manifold), _tolerance(tensor, manifold)
    measured = f"max|YᵀY − I| = {err:.3g}" if err is not None else "M.is_point fails"
    if projected:
        return (
            f"{name} is not a point of {manifold!r} ({measured} after projecting, tolerance {tol:g} for "
            f"{tensor.dtype}): its nearest point is not unique (the matrix is rank-deficient); start from a "
            "full-rank matrix or M.random(...)"
        )
    if manifold.has_nearest_point:
        fix = (
            "project it to the nearest point: ManifoldParameter(data, M) (project=True, the default), "
            "p.proj_() or geoarray.torch.project_(model); or initialise it (after module.to_empty(), whose "
            "values are uninitialised): geoarray.torch.init.uniform_init_(p)"
        )
    else:
        fix = f"{manifold!r} has no projection: start from a point of the manifold, e.g. M.random(...)"
    return (
        f"{name} is not a point of {manifold!r}: {measured}, above the tolerance {tol:g} of {tensor.dtype} "
        f"(float32 weights converted to float64 typically measure ~1e-7); {fix}"
    )


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
    if on_manifold and not manifold.is_vector_space and tensor.numel() and not manifold.is_point(tensor.detach()):
        raise ValueError(_off_manifold_message(name, tensor, manifold))


def manifold_of(p: torch.Tensor) -> Manifold | None:
    """The manifold of a parameter: its ``manifold`` for a :class:`ManifoldParameter`, None otherwise."""
    m = getattr(p, "manifold", None)
    return None if m is None or m.is_vector_space else m


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
    of the same object); where torch builds a new parameter object instead (``module.to_empty``, ``.to``
    to or from ``meta``, ``torch.__future__``'s conversion flags) the module puts it back
    (``geoarray.torch._foreign``).

    The tensor's shape must end in ``manifold.point_shape`` (leading axes are a batch of points,
    e.g. the stacked heads of an attention layer) and its dtype real floating (float16/bfloat16 weights
    are stepped in float32 and cast back). Values off the manifold (``manifold.is_point`` at its
    default tolerance; one host read) are replaced by the nearest point (:func:`nearest_point`: the
    polar factor for Stiefel, Grassmann and the orthogonal group) with ``project=True`` (the default),
    in a new tensor (the caller's is not changed); values already within the tolerance are kept bit
    for bit. ``project=False`` refuses them with a ``ValueError`` giving the measured error, the
    tolerance and the fix, as does a manifold without a projection (symplectic Stiefel).
    ``check=False`` skips all of this (for values known to lie on the manifold).
    ``manifold=None`` or ``Euclidean()`` means unconstrained.

    **Only geoarray.torch's optimizers keep it on its manifold.** A plain ``torch.optim`` optimizer
    sees an ordinary tensor and takes Euclidean steps that leave the manifold (‖YᵀY − I‖ grows with
    every step); give ManifoldParameters to ``geoarray.torch.Adam``/``SGD``/…, or call ``proj_()``
    after each step of another optimizer.
    """

    #: set by __new__ (None: unconstrained)
    manifold: Manifold | None

    def __new__(
        cls,
        data: torch.Tensor | None = None,
        manifold: Manifold | None = None,
        requires_grad: bool = True,
        *,
        project: bool = True,
        check: bool = True,
    ):
        if data is None:
            data = torch.empty(0)
        if manifold is not None and not isinstance(manifold, Manifold):
            raise TypeError(f"manifold must be a geoarray Manifold or None, got {type(manifold).__name__}")
        if manifold is not None and check:
            if isinstance(data, torch.Tensor) and data.is_meta:
                # no values to check or project (check=False leaves that to the first step, after to_empty)
                raise ValueError(
                    f"data is on the meta device, where {manifold!r} cannot be checked; create it on a real "
                    "device, or, to initialise it after module.to_empty() (FSDP2's meta-device recipe), pass "
                    "check=False: registered on a module it stays a ManifoldParameter through to_empty, and a "
                    "geoarray optimizer's first step refuses it until it is initialised on the manifold "
                    "(geoarray.torch.init.uniform_init_(p)); shard with geoarray.torch.fully_shard, which keeps "
                    "the manifolds"
                )
            check_manifold_tensor(data, manifold, "data")
            if not _on_manifold(data, manifold):
                nearest = nearest_point(data, manifold) if project else None
                if nearest is None:
                    raise ValueError(_off_manifold_message("data", data, manifold))
                if not _on_manifold(nearest, manifold):
                    raise ValueError(_off_manifold_message("data", nearest, manifold, projected=True))
                data = nearest
        if type(data) is not torch.Tensor and isinstance(data, torch.Tensor):
            data = data.detach()
            if type(data) is not torch.Tensor:  # a Parameter: its plain-tensor view
                data = data.as_subclass(torch.Tensor)
        p = torch.Tensor._make_subclass(cls, data, requires_grad)
        p.manifold = manifold
        return p

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # everything happens in __new__
        pass

    @torch.no_grad()
    def proj_(self) -> ManifoldParameter:
        """Replace the values by the nearest point of the manifold, in place (geoopt's ``proj_``);
        returns ``self``. A no-op for unconstrained parameters; ``ValueError`` for a manifold without a
        projection or a rank-deficient matrix (no unique nearest point)."""
        manifold = manifold_of(self)  # self.manifold, or None where unconstrained
        if manifold is None or not self.numel():
            return self
        nearest = nearest_point(self, manifold)
        if nearest is None:
            if _on_manifold(self, manifold):
                return self
            raise ValueError(_off_manifold_message("this parameter", self, manifold))
        if not _on_manifold(nearest, manifold):
            raise ValueError(_off_manifold_message("this parameter", nearest, manifold, projected=True))
        self.copy_(nearest)
        return self

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

    def __reduce_ex__(self, proto: Any) -> tuple:
        # nn.Parameter rebuilds a plain Parameter; hooks are not serialised (as in torch)
        state = dict(self.__dict__)
        return (_rebuild, (self.data, self.manifold, self.requires_grad, state))

    # torch's Tensor.__repr__ takes a tensor_contents keyword for its own printing, which this never receives
    def __repr__(self) -> str:  # type: ignore[override]
        return f"ManifoldParameter on {self.manifold!r} containing:\n" + torch.Tensor.__repr__(self.data)


def _on_manifold(tensor: torch.Tensor, manifold: Manifold) -> bool:
    if manifold.is_vector_space or not tensor.numel():
        return True
    Y = tensor.detach()
    return bool(manifold.is_point(Y if Y.dtype not in (torch.float16, torch.bfloat16) else Y.float(),
                                  atol=_tolerance(tensor, manifold)))  # fmt: skip


def project_(target: Any) -> Any:
    """Project in place: a :class:`ManifoldParameter` (``proj_()``), or every ManifoldParameter of an
    ``nn.Module`` or an iterable of tensors (plain tensors are left alone). Returns ``target``.

    Use it after converting a model (``model.to(torch.float64)`` keeps float32's ~1e-7 orthonormality
    error, above float64's tolerance) or after a step of an optimizer that does not know the
    manifold."""
    if isinstance(target, ManifoldParameter):
        return target.proj_()
    params = target.parameters() if isinstance(target, torch.nn.Module) else target
    for p in params:
        if isinstance(p, ManifoldParameter):
            p.proj_()
    return target
