"""The manifold contract shared by every manifold (paper, sections 2–3).

A manifold M acts in Algorithm 1 through

=========================================  ===============================================
``M.random(seed, *, xp, batch_shape, …)``  a point (for Stiefel: Algorithm 3)
``M.rgrad(Y, dL)``                         Riemannian gradient from the Euclidean one (eq. 2)
``M.global_section(Y, strategy=…)``       λ(Y) with λ(Y)E = Y (Definition 5)
``M.global_rep(lam, Δ)``                   Δ ∈ T_Y M ↦ λ⁻¹ Ω(Δ) λ ∈ g^hor (eq. 11)
``M.retraction(W, method)``                W ∈ g^hor ↦ exp(W)E or Cayley(W)E (Operation 3)
``M.apply_section(lam, X)``                λ(Y)·X (eq. 13)
``M.metric(Y, Δ₁, Δ₂)``                    the Riemannian metric
``M.is_point(Y)``, ``M.is_tangent(Y, Δ)``  tolerance-based membership
=========================================  ===============================================

so one optimizer step is ``apply_section(lam, retraction(velocity(cache)))`` with
``lam = global_section(Y)`` and the cache fed by ``global_rep(lam, rgrad(Y, dL))``.

Every operation accepts leading batch dimensions ``(..., N, n)``; the namespace, dtype and device
come from the inputs.
"""

from __future__ import annotations

import abc
import operator
from typing import TYPE_CHECKING, Any

from .. import _backend
from .._backend import array_namespace, check_real_floating

__all__ = ["RETRACTIONS", "SECTIONS", "Manifold", "check_batch_shape", "check_choice", "check_size"]

from .._typing import Array

SECTIONS = ("householder", "random", "transported", "rotated")
RETRACTIONS = ("geodesic", "cayley")


def check_size(value: Any, name: str) -> int:
    """A positive integer size (ints and NumPy integers; bools and floats are refused)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def check_batch_shape(value: Any, name: str = "batch_shape") -> tuple[int, ...]:
    """A tuple (or list) of non-negative ints; ``random(..., batch_shape=3)`` is refused with the fix
    ``(3,)`` rather than failing inside the random-number generator (or a float 2.0 taken as 2)."""
    if isinstance(value, (tuple, list)) and not any(isinstance(v, bool) for v in value):
        try:
            out = tuple(operator.index(v) for v in value)
        except TypeError:
            out = None
        if out is not None and all(v >= 0 for v in out):
            return out
    hint = f"; pass ({value},)" if isinstance(value, int) and not isinstance(value, bool) else ""
    raise TypeError(f"{name} must be a tuple of non-negative ints, got {value!r}{hint}")


def check_choice(value: str, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


class Manifold(abc.ABC):
    """The operators Algorithm 1 calls, and the argument checking shared by the concrete manifolds.

    A concrete manifold implements every abstract method below. The optimizers of
    :mod:`geoarray.optim` call exactly these members, and nothing else:

    * everywhere: :attr:`is_vector_space` (a vector space's leaves are stepped additively, raveled
      together, with no section, lift or retraction);
    * at ``init``: :attr:`point_shape`, :attr:`section_strategies` and the optional ``section``
      attribute (the manifold's own default strategy), :meth:`default_atol` and :meth:`is_point`,
      :meth:`global_section` and :meth:`global_rep` (the zero element that starts the caches);
    * in every step: :meth:`global_section`, :meth:`lift` (rgrad and global_rep in one call) and
      :meth:`apply_retraction`; with ``section="transported"`` :meth:`transport_section`, with
      ``section="rotated"`` :meth:`reframe` (only manifolds listing ``"rotated"`` in
      :attr:`section_strategies` implement it);
    * ManifoldMuon: the step registered for the manifold's class with
      ``geoarray.optim.muon.register_manifold_muon`` (Stiefel and Grassmann: their ``spectral_direction``, and
      :meth:`global_section`, :meth:`global_rep` and :meth:`apply_retraction` for its g^hor retractions).

    The torch adapter also calls :meth:`point_error` (in its error messages) and, where
    :attr:`has_nearest_point`, :meth:`nearest_point` (``geoarray.torch.project_``).
    """

    if TYPE_CHECKING:
        # read-only to a type checker: a subclass may compute it (Stiefel's is a property, (N, n))
        @property
        def point_shape(self) -> tuple[int, ...] | None: ...
    else:
        #: trailing shape of a point, e.g. (N, n); ``None`` for shape-agnostic manifolds (Euclidean)
        point_shape = None
    #: the section strategies :meth:`global_section` supports (see :mod:`geoarray.optim.riemannian`)
    section_strategies: tuple[str, ...] = ("householder",)
    #: a vector space (Euclidean): the optimizers update its points by addition, g^hor is the space itself
    is_vector_space: bool = False
    #: :meth:`nearest_point` has a closed form (orthonormal frames: the polar factor)
    has_nearest_point: bool = False

    @abc.abstractmethod
    def random(
        self, seed: Any, *, xp: Any, batch_shape: tuple[int, ...] = (), dtype: Any = None, device: Any = None
    ) -> Array:
        """A random point (for Stiefel: Algorithm 3)."""

    @abc.abstractmethod
    def rgrad(self, Y: Array, dL: Array) -> Array:
        """The Riemannian gradient at Y of a function with Euclidean gradient dL (operation 1)."""

    @abc.abstractmethod
    def metric(self, Y: Array, D1: Array, D2: Array) -> Array:
        """The Riemannian metric g_Y(Δ₁, Δ₂)."""

    @abc.abstractmethod
    def global_section(self, Y: Array, *, strategy: str | None = None, seed: Any = None) -> Any:
        """λ(Y) with λ(Y)E = Y (Definition 5) by ``strategy`` (one of :attr:`section_strategies`;
        None: the manifold's default). ``"random"`` needs ``seed``."""

    @abc.abstractmethod
    def global_rep(self, lam: Any, D: Array) -> Any:
        """Δ ∈ T_Y M ↦ λ⁻¹Ω(Δ)λ ∈ g^hor (operation 2, eq. 11)."""

    @abc.abstractmethod
    def retraction(self, W: Any, method: str | None = None) -> Array:
        """W ∈ g^hor ↦ exp(W)E or Cay(W)E as a point of the manifold at E (operation 3)."""

    @abc.abstractmethod
    def apply_section(self, lam: Any, X: Array) -> Array:
        """λ(Y)·X: moves a point at E to the point at Y (eq. 13)."""

    def apply_retraction(self, lam: Any, W: Any, method: str | None = None) -> Array:
        """λ(Y)·Retraction(W)·E = ``apply_section(lam, retraction(W, method))``: operation 3 of
        Algorithm 1 in one call (the new point). Manifolds override it where the composition is cheaper."""
        return self.apply_section(lam, self.retraction(W, method))

    def lift(self, Y: Array, lam: Any, dL: Array) -> Any:
        """global_rep(λ, rgrad(Y, ∇L)): operations 1 and 2 of Algorithm 1 in one call.

        Manifolds override it with a fused expression where the composition simplifies."""
        return self.global_rep(lam, self.rgrad(Y, dL))

    def transport_section(self, lam: Any, W: Any, method: str | None = None) -> Any:
        """Λ ← Λ·g(W): the ``"transported"`` strategy's update (only where it is supported)."""
        raise NotImplementedError(f"{self!r} has no 'transported' section strategy")

    def reframe(self, lam_old: Any, W: Any, lam_new: Any, B: Array, method: str | None = None) -> Array:
        """Re-express a cache's B block from the frame λ_old·exp(W) in the frame λ_new (the optimizers'
        ``section="rotated"``); implemented by manifolds that list ``"rotated"`` in
        :attr:`section_strategies`."""
        raise NotImplementedError(
            f"{self!r} has no 'rotated' section strategy (it supports {self.section_strategies}); "
            "choose section='householder' or 'transported'"
        )

    @abc.abstractmethod
    def is_point(self, Y: Array, atol: float | None = None) -> bool:
        """Whether Y lies on the manifold within atol."""

    def point_error(self, Y: Array) -> float | None:
        """The distance from the manifold that :meth:`is_point` compares with its tolerance, over the
        whole batch, as a Python float (one host read); None where the manifold has no such measure."""
        return None

    def nearest_point(self, Y: Array) -> Array:
        """The point of the manifold nearest to Y (Frobenius norm), where it has a closed form
        (:attr:`has_nearest_point`); ``NotImplementedError`` otherwise."""
        raise NotImplementedError(
            f"{self!r} has no closed-form nearest point: start from a point of the manifold, e.g. M.random(...)"
        )

    @abc.abstractmethod
    def is_tangent(self, Y: Array, D: Array, atol: float | None = None) -> bool:
        """Whether D is tangent at Y within atol."""

    def _strategy(self, strategy: str | None) -> str:
        strategy = getattr(self, "section", "householder") if strategy is None else strategy
        if strategy not in self.section_strategies:
            raise ValueError(f"strategy must be one of {self.section_strategies} for {self!r}, got {strategy!r}")
        return strategy

    def _namespace(self, **arrays: Array) -> Any:
        """The namespace of the named arrays, which must agree in library, dtype (real floating) and
        device. Static checks only: no value is read, so jitted callers pay nothing."""
        for name, a in arrays.items():
            if a is None:
                raise TypeError(f"{name} must be an array for {self!r}, got None")
        xp = array_namespace(**arrays)
        # every manifold method checks its inputs (about eight times per optimizer step): the first
        # array's dtype, device and tracing are looked up once, not once per pair
        items = iter(arrays.items())
        first_name, first = next(items)
        check_real_floating(first, first_name, xp)
        first_device, first_traced = None, None
        for name, a in items:
            if a.dtype != first.dtype:
                check_real_floating(a, name, xp)  # an integer array is named as such, not as a mismatch
                raise TypeError(
                    f"{name} has dtype {_backend.dtype_name(a.dtype)} but {first_name} has "
                    f"{_backend.dtype_name(first.dtype)}: {self!r} does not promote "
                    "silently; cast one of them"
                )
            if first_traced is None:
                first_traced = _backend.is_traced(first)
                first_device = None if first_traced else _backend.device(first)
            # under jax.vmap a batched tracer reports no device: compare concrete arrays only
            if not (first_traced or _backend.is_traced(a)) and _backend.device(a) != first_device:
                raise ValueError(
                    f"{name} is on device {_backend.device(a)} but {first_name} on {first_device}; "
                    "move them to one device"
                )
        return xp

    @staticmethod
    def _check_batch(x: Array, x_name: str, y: Array, y_name: str, core: int) -> None:
        """The leading (batch) shapes of x and y, before their last ``core`` axes, must broadcast."""
        bx, by = tuple(x.shape[: x.ndim - core]), tuple(y.shape[: y.ndim - core])
        for dx, dy in zip(reversed(bx), reversed(by), strict=False):
            if dx != dy and 1 not in (dx, dy):
                raise ValueError(
                    f"{y_name} has batch shape {by}, which does not broadcast with the batch shape {bx} of {x_name}"
                )

    def _check_trailing(self, x: Array, name: str, trailing: tuple[int, ...]) -> None:
        k = len(trailing)
        if x.ndim < k or tuple(x.shape[-k:]) != tuple(trailing):
            raise ValueError(
                f"{name} must have trailing shape {tuple(trailing)} for {self!r}, got shape {tuple(x.shape)}"
            )

    def _check_point(self, Y: Array, name: str = "Y") -> Any:
        xp = self._namespace(**{name: Y})
        if self.point_shape is not None:
            self._check_trailing(Y, name, self.point_shape)
        if getattr(self, "validate", False) and not self.is_point(Y):
            raise ValueError(f"{name} is not a point of {self!r} (validate=True)")
        return xp

    @staticmethod
    def _check_full_precision(Y: Array, name: str = "Y") -> None:
        """Sections factorise Y (QR, LU), which no backend offers in half precision: refuse it here
        rather than with the backend's NotImplementedError from inside the kernel."""
        name_ = _backend.dtype_name(Y.dtype)
        if name_ in ("float16", "bfloat16"):
            raise TypeError(
                f"{name} has dtype {name_}: sections need float32 or float64 (no backend factorises half "
                f"precision); cast it first, e.g. xp.astype({name}, xp.float32) (geoarray.optim steps "
                "half-precision leaves in float32 for you)"
            )

    def _check_tangent_shape(self, Y: Array, D: Array, name: str) -> Any:
        xp = self._namespace(Y=Y, **{name: D})
        if self.point_shape is not None:
            self._check_trailing(D, name, self.point_shape)
            self._check_batch(Y, "Y", D, name, len(self.point_shape))
        elif tuple(D.shape) != tuple(Y.shape):
            raise ValueError(f"{name} must have the shape of Y {tuple(Y.shape)}, got {tuple(D.shape)}")
        return xp

    @staticmethod
    def default_atol(dtype: Any, xp: Any) -> float:
        """Tolerance of ``is_point``/``is_tangent`` by dtype: a few roundoffs of a rounded orthonormal frame."""
        if dtype == xp.float64:
            return 1e-10
        return {"float16": 4e-3, "bfloat16": 3e-2}.get(_backend.dtype_name(dtype), 1e-4)
