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
import sys
from typing import TYPE_CHECKING, Any

from .. import _backend
from .._backend import array_namespace, check_real_floating

__all__ = ["RETRACTIONS", "SECTIONS", "Manifold", "check_batch_shape", "check_choice", "check_size"]

from .._typing import Array

SECTIONS = ("householder", "random", "transported", "rotated")
RETRACTIONS = ("geodesic", "cayley")


class _Required:
    """The default of a required size argument, so that a shapeless call (geoopt's ``Stiefel()``) gets its
    own error, while an explicit bad value (``None``, ``8.0``) gets :func:`check_size`'s."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


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

    def random(
        self,
        *size: Any,
        xp: Any = None,
        seed: Any = None,
        batch_shape: Any = REQUIRED,
        dtype: Any = None,
        device: Any = None,
        **kwargs: Any,
    ) -> Array:
        """A random point (for Stiefel: Algorithm 3), called geoarray's way or geoopt's.

        * geoarray's (the contract): ``M.random(seed, *, xp, batch_shape=(), dtype=None, device=None)``, a
          batch of ``batch_shape`` points of namespace ``xp`` drawn from ``seed`` (an int, a NumPy
          ``SeedSequence``/``Generator`` or a ``torch.Generator``; ``None`` with ``xp=torch``: torch's default
          generator). A call with ``xp`` and one positional argument that is not a tuple is this form.
        * geoopt's (``geoopt.Manifold.random(*size, dtype=None, device=None)``): ``M.random(10, 3)`` or
          ``M.random((5, 10, 3))``, the full shape, which must end in :attr:`point_shape` (its leading axes
          are the batch); ``xp`` defaults to torch (geoopt is a torch library) and ``seed`` to torch's default
          generator, so ``torch.manual_seed`` makes it reproducible as it makes geoopt's. It returns a plain
          array (geoopt returns a ``ManifoldTensor``; wrap it in ``geoarray.torch.ManifoldParameter``).

        Both draw the manifold's law: Haar (uniform) for Stiefel and Grassmann (Algorithm 3: QR of a
        Gaussian, signs fixed by diag(R), Mezzadri 2006), standard normal entries for Euclidean, Q·Cay(W)E
        for SymplecticStiefel (its ``_random_point``); extra keywords (SymplecticStiefel's ``scale``) pass
        through.
        """
        if xp is not None and (not size or (len(size) == 1 and not isinstance(size[0], (tuple, list)))):
            if size and seed is not None:
                raise TypeError(f"{self!r}.random got the seed twice (positionally and as seed=); pass one")
            return self._random_point(
                size[0] if size else seed,
                xp=xp,
                # REQUIRED: not given; an explicit None is refused by check_batch_shape, as it was
                batch_shape=() if batch_shape is REQUIRED else batch_shape,
                dtype=dtype,
                device=device,
                **kwargs,
            )
        if batch_shape is not REQUIRED:
            raise TypeError(
                f"{self!r}.random({', '.join(map(repr, size))}, ...) is geoopt's form, which takes the whole "
                "shape, not batch_shape; write M.random(*batch_shape, *M.point_shape) or geoarray's "
                "M.random(seed, xp=..., batch_shape=...)"
            )
        shape = check_batch_shape(size[0] if len(size) == 1 else size, "size")
        point = () if self.point_shape is None else tuple(self.point_shape)
        k = len(point)
        if k and (len(shape) < k or shape[len(shape) - k :] != point):
            raise ValueError(
                f"size {shape} does not end in the point shape {point} of {self!r}: geoopt's form "
                f"M.random(*size) takes the whole shape (e.g. M.random(*{point})); geoarray's form is "
                "M.random(seed, xp=...)"
            )
        if xp is None:
            xp = _backend.torch_module()
            if xp is None:
                raise TypeError(
                    f"{self!r}.random(*size) without xp draws torch tensors, as geoopt does, but torch is not "
                    "installed; pass the namespace, e.g. M.random(*size, xp=numpy, seed=0)"
                )
        batch = shape[: len(shape) - k] if k else shape
        return self._random_point(seed, xp=xp, batch_shape=batch, dtype=dtype, device=device, **kwargs)

    def _random_point(
        self, seed: Any, *, xp: Any, batch_shape: tuple[int, ...] = (), dtype: Any = None, device: Any = None
    ) -> Array:
        """The law of :meth:`random`, geoarray's form; a concrete manifold implements it."""
        raise NotImplementedError(f"{type(self).__name__} implements no random points (_random_point)")

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

    def project(self, Y: Array, G: Array) -> Array:
        """The orthogonal projection of an ambient G onto the tangent space T_Y M (each manifold states its
        metric); concrete manifolds implement it."""
        raise NotImplementedError(f"{type(self).__name__} implements no tangent projection (project)")

    # -- geoopt's vocabulary ---------------------------------------------------------------------------
    # Thin aliases with geoopt's names and argument order (geoopt.manifolds.Manifold): geoopt code calls
    # these on a manifold, and each is one call of the contract above, nothing recomputed differently.

    def projx(self, x: Array) -> Array:
        """geoopt-compatible ``projx(x)``: the point of the manifold nearest to x, :meth:`nearest_point`
        (for orthonormal frames the polar factor U Vᵀ of x = U Σ Vᵀ, as geoopt's Stiefel computes it by an
        SVD). A manifold without a closed-form projection (SymplecticStiefel) raises
        ``NotImplementedError`` naming the fix."""
        if not self.has_nearest_point:
            raise NotImplementedError(
                f"{self!r} has no closed-form projection onto the manifold (projx): start from a point, "
                "M.random(seed, xp=...), and keep it there with a Riemannian optimizer (geoarray.optim, "
                "geoarray.torch.Adam)"
            )
        return self.nearest_point(x)

    def proju(self, x: Array, u: Array) -> Array:
        """geoopt-compatible ``proju(x, u)``: the orthogonal projection of u onto the tangent space at x,
        :meth:`project` (Stiefel: u − x sym(xᵀu), as geoopt's ``EuclideanStiefel.proju``; Grassmann:
        (I − xxᵀ)u). Idempotent. geoopt's default ``Stiefel()`` (canonical) defines ``proju`` as its
        ``egrad2rgrad``, u − x uᵀx, which is not a projection (it doubles the x·skew part of a tangent
        vector); geoopt code that wants that map calls :meth:`egrad2rgrad`, which is it."""
        return self.project(x, u)

    def egrad2rgrad(self, x: Array, u: Array) -> Array:
        """geoopt-compatible ``egrad2rgrad(x, u)``: the Riemannian gradient at x of a function whose
        Euclidean gradient is u, :meth:`rgrad` itself (Stiefel, canonical metric: u − x uᵀx, eq. 4 of
        Brantner, as geoopt's default ``Stiefel()``, i.e. ``CanonicalStiefel``)."""
        return self.rgrad(x, u)

    def retr(self, x: Array, u: Array) -> Array:
        """geoopt-compatible ``retr(x, u)``: a retraction, the point reached from x along the tangent vector
        u, R_x(0) = x and d/dt R_x(tu)|₀ = u.

        It is Algorithm 1's step with a given tangent vector: λ(x)·Retraction(λ(x)⁻¹Ω(u)λ(x))·E
        (:meth:`global_section`, :meth:`global_rep`, :meth:`apply_retraction`; eqs. 11 and 13 of Brantner),
        i.e. exp(Ω(u))x or Cay(Ω(u))x by the manifold's ``retraction_method``, with Ω(u)x = u. The part
        of u normal to the manifold is dropped (global_rep reads the tangent part). For Stiefel with
        ``retraction_method="cayley"`` and xᵀu = 0 this is geoopt's ``CanonicalStiefel.retr``,
        (I − ½A)⁻¹(I + ½A)x with A = uxᵀ − xuᵀ; geoopt's map has initial velocity u + x xᵀu instead of u
        where xᵀu ≠ 0."""
        lam = self.global_section(x)
        return self.apply_retraction(lam, self.global_rep(lam, u))

    def inner(self, x: Array, u: Array, v: Array | None = None, *, keepdim: bool = False) -> Array:
        """geoopt-compatible ``inner(x, u, v=None, *, keepdim=False)``: the Riemannian metric g_x(u, v)
        (g_x(u, u) when v is None), :meth:`metric`; one value per point of a batch, with the point axes
        kept as size-1 axes when ``keepdim`` (as geoopt's sum over them). Euclidean sums over every axis
        (geoarray's Euclidean has no batch axes; geoopt's ``Euclidean()`` of ``ndim=0`` multiplies
        elementwise)."""
        return self._keepdim(self.metric(x, u, u if v is None else v), x, keepdim)

    def dist(self, x: Array, y: Array, *, keepdim: bool = False) -> Array:
        """geoopt-compatible ``dist(x, y, *, keepdim=False)``: the geodesic distance between two points, one
        value per point of a batch (the point axes kept as size-1 axes when ``keepdim``). Where the metric's
        geodesic distance has a closed form it is computed (Grassmann: the norm of the principal angles;
        Euclidean: the Frobenius norm of x − y). Stiefel's canonical metric has none (geoopt's ``Stiefel()``
        has no ``dist`` either), nor has SymplecticStiefel: they raise ``NotImplementedError`` naming what to
        compute instead."""
        raise NotImplementedError(
            f"{self!r} has no closed-form geodesic distance (dist), as geoopt's Stiefel has none: for the "
            "distance between the spanned subspaces use Grassmann(N, n).dist(x, y) (principal angles), for the "
            "chordal distance the Frobenius norm of x − y, xp.linalg.matrix_norm(x - y)"
        )

    def _keepdim(self, out: Array, x: Array, keepdim: bool) -> Array:
        """``out`` (one value per point) with the point axes of x appended as size-1 axes when ``keepdim``."""
        if not keepdim:
            return out
        xp = array_namespace(x=x)
        k = x.ndim if self.point_shape is None else len(self.point_shape)
        return xp.reshape(out, (*out.shape, *(1,) * k))

    def transp(self, x: Array, y: Array, v: Array) -> Array:
        """geoopt's ``transp(x, y, v)`` (a vector transport) has no counterpart here: geoarray's optimizers
        keep their caches in the global tangent representation g^hor (:meth:`global_rep`), which needs
        no transport between tangent spaces (geoopt's default canonical ``Stiefel()`` has none either).
        Raises ``NotImplementedError`` naming the replacement."""
        raise NotImplementedError(
            f"{self!r} has no vector transport (transp): geoarray's optimizers keep caches in g^hor, which "
            "needs none; to move v into the tangent space at y, project it: M.proju(y, v)"
        )

    def _check_point_on_manifold(self, x: Array, *, atol: float = 1e-5, rtol: float = 1e-5) -> tuple[bool, str | None]:
        """geoopt-compatible ``_check_point_on_manifold(x, *, atol, rtol)``: ``(ok, reason)``, ``reason``
        None when ok. ``ok`` is :meth:`is_point` at ``atol`` (orthonormal frames: max|xᵀx − I| ≤ atol, which
        is geoopt's ``allclose(xᵀx − I, 0, atol, rtol)``: compared with zero, ``rtol`` has no effect there
        nor here). A shape that does not end in :attr:`point_shape` is ``(False, reason)``, not an error."""
        shape = self.point_shape
        if shape is not None and (x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape) :]) != tuple(shape)):
            return False, f"x has shape {tuple(x.shape)}, which does not end in {tuple(shape)} as {self!r} needs"
        if self.is_point(x, atol=atol):
            return True, None
        err = self.point_error(x)
        measured = "" if err is None else f" (measured {err:.3g})"
        return False, f"x is not a point of {self!r} within atol={atol}, rtol={rtol}{measured}"

    def check_point_on_manifold(
        self, x: Array, *, explain: bool = False, atol: float = 1e-5, rtol: float = 1e-5
    ) -> bool | tuple[bool, str | None]:
        """geoopt-compatible ``check_point_on_manifold(x, *, explain=False, atol=1e-5, rtol=1e-5)``: whether
        x lies on the manifold (:meth:`_check_point_on_manifold`, geoopt's defaults); with ``explain`` the
        pair ``(ok, reason)``."""
        ok, reason = self._check_point_on_manifold(x, atol=atol, rtol=rtol)
        return (ok, reason) if explain else ok

    def _strategy(self, strategy: str | None) -> str:
        strategy = getattr(self, "section", "householder") if strategy is None else strategy
        if strategy not in self.section_strategies:
            raise ValueError(f"strategy must be one of {self.section_strategies} for {self!r}, got {strategy!r}")
        return strategy

    def _namespace(self, **arrays: Array) -> Any:
        """The namespace of the named arrays, which must agree in library, dtype (real floating) and
        device. Static checks only: no value is read, so jitted callers pay nothing."""
        torch = sys.modules.get("torch")
        if torch is not None:
            # torch tensors of one floating dtype on one device (an optimizer step's every call): answered in
            # one pass, without the lookups below per array (under torch.compile ~290 traced instructions
            # per call, nine calls per step of a Stiefel weight); anything else takes the checks that name it
            values = list(arrays.values())
            first = values[0]
            if isinstance(first, torch.Tensor) and first.dtype.is_floating_point:
                for a in values:
                    if not isinstance(a, torch.Tensor) or a.dtype != first.dtype or a.device != first.device:
                        break
                else:
                    return array_namespace(first)
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
            # under jax.vmap a batched tracer reports no device: compare the others (torch.compile's fake
            # tensors keep theirs, and asking torch whether it compiles costs two calls each time)
            if first_traced is None:
                first_traced = _backend.is_jax_tracer(first)
                first_device = None if first_traced else _backend.device(first)
            if not (first_traced or _backend.is_jax_tracer(a)) and _backend.device(a) != first_device:
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
