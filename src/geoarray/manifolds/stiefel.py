"""The Stiefel manifold St(N, n) = {Y ∈ R^{N×n} : YᵀY = I} as the homogeneous space O(N)/O(N−n).

Paper (Brantner), sections 2–3 and appendices A–C:

* canonical metric g_Y(V₁, V₂) = tr(V₁ᵀ(I − ½YYᵀ)V₂)                                    (eq. 3)
* Riemannian gradient rgrad(Y, ∇L) = ∇L − Y ∇Lᵀ Y                                       (eq. 4)
* Ω(Δ) = (I − ½YYᵀ)ΔYᵀ − YΔᵀ(I − ½YYᵀ) ∈ g^{hor,Y}, Ω(Δ)Y = Δ                     (eqs. 10, 17)
* global representation λ⁻¹Ω(Δ)λ = [[A, −Bᵀ], [B, 0]], A = YᵀΔ, B = Q⊥ᵀΔ                (eqs. 11-12)
* geodesic retraction exp(W)E through the N×2n factorisation W = B′B″ᵀ               (eqs. 18–21)

Retraction. With W = [[A, −Bᵀ], [B, 0]] = B′B″ᵀ, B′ = [[½A, I], [B, 0]], B″ᵀ = [[I, 0], [½A, −Bᵀ]],
every function of W that the optimizer needs is I + B′ K B″ᵀ with a 2n×2n matrix K of
X = B″ᵀB′ = [[½A, I], [¼A² − BᵀB, ½A]]:

* geodesic: exp(W) = I + B′ φ₁(X) B″ᵀ with φ₁(X) = Σ_k X^k/(k+1)! (eqs. 19–20). φ₁ is evaluated
  by balancing, scaling and doubling instead of the paper's open Taylor loop (Algorithm 4, which
  loses orthogonality for ‖B‖ ≳ 40 and overflows near 700): with X_s = X/2ˢ, ‖X_s‖₁ ≤ θ, a
  Taylor polynomial (float64: degree 19, 7 matrix products; float32: degree 8, 4 products;
  Paterson–Stockmeyer; an eager step of optimizer size, ‖X‖₁ ≤ 0.04 in float32 or 0.02 in
  float64, takes degree 3 or 6 and no scaling) gives φ₁(X_s) to unit roundoff, and the doubling identity
  φ₁(2Z) = φ₁(Z) + ½ φ₁(Z) Z φ₁(Z) undoes the scaling s times (see :func:`geoarray.manifolds.retraction.phi1`).
* Cayley: Cay(W) = (I − ½W)⁻¹(I + ½W) = I + B′(I − ½X)⁻¹B″ᵀ (Woodbury), one 2n×2n solve.

So exp(W)E = E + B′ K [I; ½A] costs O(N·n²) and never forms anything N×N.
"""

from __future__ import annotations

import abc
import math
from typing import Any

from .. import _backend, linalg
from .. import random as _random
from .._backend import array_namespace, as_namespace
from .._backend import device as _device
from .base import REQUIRED, RETRACTIONS, SECTIONS, Manifold, check_batch_shape, check_choice, check_size
from .horizontal import StiefelHorizontal
from .retraction import _exp_skew, bjorck_step, kernel_norm_bound, retract_e, retract_square, retraction_kernel
from .sections import (
    BlockReflectorSection,
    DenseSection,
    HouseholderSection,
    PackedHouseholderSection,
    SquareSection,
    householder_section,
)

__all__ = ["OrthonormalFrames", "Stiefel"]

from .._typing import Array


def _retract_e(halfA: Array, B: Array, *, xp: Any, method: str, max_doublings: int) -> Array:
    """g(W)E as an (..., N, n) array (½A = 0 for Grassmann); see :mod:`~geoarray.manifolds.retraction`."""
    return xp.concat(list(_retract_blocks(halfA, B, xp=xp, method=method, max_doublings=max_doublings)), axis=-2)


def _retract_blocks(
    halfA: Array, B: Array, *, xp: Any, method: str, max_doublings: int, static_bound: float | None = None
) -> tuple[Array, Array]:
    """The E-rows and the other rows of g(W)E, unassembled (for :meth:`OrthonormalFrames.apply_retraction`)."""
    if B.shape[-2] == 0:  # N = n: no other rows, g(W)E = g(A) is n×n (no 2n×2n kernel)
        return retract_square(halfA, xp=xp, method=method, max_doublings=max_doublings), B
    if method == "geodesic":  # c = a² − BᵀB for the skew a = ½A, by the backend's cheaper route
        low = _backend.skew_square_minus_gram(halfA, B, xp)
        return retract_e(
            halfA, None, B, xp=xp, method=method, max_doublings=max_doublings, static_bound=static_bound, low=low
        )
    gram = xp.matrix_transpose(B) @ B
    return retract_e(halfA, gram, B, xp=xp, method=method, max_doublings=max_doublings, static_bound=static_bound)


def _transport(
    Y: Array, Qperp: Array, halfA: Array, B: Array, *, xp: Any, method: str, max_doublings: int
) -> tuple[Array, Array]:
    """Λ·g(W) for a dense Λ = [Y, Q⊥]: Λ + (ΛB′) K B″ᵀ, in O(N²·n)."""
    n = B.shape[-1]
    K = retraction_kernel(halfA, xp.matrix_transpose(B) @ B, xp, method, max_doublings)
    LB = xp.concat([Y @ halfA + Qperp @ B, xp.broadcast_to(Y, (*halfA.shape[:-2], *Y.shape[-2:]))], axis=-1)
    P = LB @ K  # (..., N, 2n)
    Y_new = Y + P[..., :, :n] + P[..., :, n:] @ halfA
    Qperp_new = Qperp - P[..., :, n:] @ xp.matrix_transpose(B)
    return Y_new, Qperp_new


def _moved_rows(halfA: Array, BW: Array, B: Array, *, xp: Any, method: str, max_doublings: int) -> Array:
    """g(W)·[0; B] for the g^hor element W = (½A, B_W): [0; B] + B′ K B″ᵀ[0; B] with B″ᵀ[0; B] =
    [0; −B_Wᵀ B] (the rows that :meth:`OrthonormalFrames.reframe` carries to the next frame)."""
    n = halfA.shape[-1]
    K = retraction_kernel(halfA, xp.matrix_transpose(BW) @ BW, xp, method, max_doublings)
    zeros = xp.zeros((*B.shape[:-2], n, B.shape[-1]), dtype=B.dtype, device=_device(B))
    D = K @ xp.concat([zeros, -xp.matrix_transpose(BW) @ B], axis=-2)
    return xp.concat([halfA @ D[..., :n, :] + D[..., n:, :], B + BW @ D[..., :n, :]], axis=-2)


def _check_out(out: Any, Y: Array, xp: Any) -> None:
    """``apply_retraction``'s ``out``: a writable array of the point's namespace, shape and dtype."""
    if not _backend.writable(xp):
        raise TypeError(
            f"out= needs arrays that take in-place writes; {_backend.backend_name(xp)}'s are immutable: "
            "leave out=None and use the returned point"
        )
    if array_namespace(out) is not array_namespace(Y) or tuple(out.shape) != tuple(Y.shape) or out.dtype != Y.dtype:
        raise ValueError(
            f"out must be an array of the point's kind, shape {tuple(Y.shape)} and dtype {Y.dtype}, got "
            f"{type(out).__name__} of shape {tuple(getattr(out, 'shape', ()))} and dtype "
            f"{getattr(out, 'dtype', None)}; pass out=xp.empty_like(point) or leave it out"
        )


def _written(Y: Array, out: Array | None) -> Array:
    """Y, or Y written into ``out`` (``apply_retraction``'s ``out``)."""
    if out is None:
        return Y
    out[...] = Y
    return out


# Eager JAX compiles every operation of a new shape on its first call (~10 ms each on a CPU): these small
# computations, run on weights of many shapes, are one program each there (_backend.compiled); elsewhere
# they are the functions themselves.


def _haar_factor(A: Array, xp: Any) -> Array:
    """Q·diag(sign(diag R)) for A = QR: with A Gaussian, a Haar-distributed point (Mezzadri 2006)."""
    Q, R = xp.linalg.qr(A)
    d = xp.linalg.diagonal(R)
    signs = xp.where(d < 0, -xp.ones_like(d), xp.ones_like(d))
    return Q * signs[..., None, :]


def _orthonormal_within(Y: Array, atol: Any, xp: Any) -> Array:
    """Whether |YᵀY − I| ≤ atol entrywise over the whole stack (a 0-d bool array; True for an empty one)."""
    return xp.all(xp.abs(xp.matrix_transpose(Y) @ Y - linalg.eye(Y.shape[-1], Y)) <= atol)


def _orthonormality_error(Y: Array, xp: Any) -> Array:
    """max |YᵀY − I| over a non-empty stack (a 0-d array)."""
    return xp.max(xp.abs(xp.matrix_transpose(Y) @ Y - linalg.eye(Y.shape[-1], Y)))


# ---------------------------------------------------------------------------------------------
# The manifold
# ---------------------------------------------------------------------------------------------


class OrthonormalFrames(Manifold):
    """Shared machinery of :class:`Stiefel` and :class:`~geoarray.manifolds.Grassmann`.

    Points are orthonormal N×n frames and the group is O(N): construction and validation, random
    points, sections, retraction and its application are common; the two manifolds differ in the
    metric, the gradient and the horizontal space (see :class:`Stiefel` for the parameters).
    """

    section_strategies = SECTIONS
    has_nearest_point = True

    def __init__(
        self,
        N: int = REQUIRED,
        n: int = REQUIRED,
        *,
        section: str = "householder",
        retraction_method: str = "geodesic",
        validate: bool = False,
        max_doublings: int = 64,
        canonical: bool = True,
    ):
        if N is REQUIRED or n is REQUIRED:
            # geoopt's Stiefel() is shapeless; say what to write instead of Python's "missing argument"
            name = type(self).__name__
            raise TypeError(
                f"{name}() needs its shape: geoarray checks every point and tangent against (N, n) and batches "
                f"all weights of one manifold into one update, so write {name}(N, n) for N×n frames (n ≤ N), "
                f"e.g. {name}(*weight.shape[-2:]) for a tall weight"
            )
        self.N = check_size(N, "N")
        self.n = check_size(n, "n")
        if self.n > self.N:
            raise ValueError(f"{type(self).__name__} needs n ≤ N, got N={self.N}, n={self.n}")
        self.section = check_choice(section, "section", SECTIONS)
        self.retraction_method = check_choice(retraction_method, "retraction_method", RETRACTIONS)
        self.validate = bool(validate)
        self.max_doublings = check_size(max_doublings, "max_doublings")
        if canonical is not True:
            # geoopt's Stiefel(canonical=False) is its EuclideanStiefel: the other metric, another rgrad
            raise ValueError(
                f"{type(self).__name__}(canonical={canonical!r}): geoarray's {type(self).__name__} has the canonical "
                "metric only, the one whose global tangent space Algorithm 1 (and every geoarray optimizer) "
                "works in; geoopt's EuclideanStiefel differs in the Riemannian gradient, which is "
                "M.proju(x, u) there (the tangent projection), M.egrad2rgrad(x, u) = u − x uᵀx here; drop canonical="
            )

    # -- the horizontal space (g^hor differs between Stiefel and Grassmann) -------------------

    @abc.abstractmethod
    def _check_horizontal(self, W: Any, name: str = "W") -> Any:
        """The namespace of W, after checking that it is an element of this manifold's g^hor."""

    @abc.abstractmethod
    def _half_a(self, W: Any, xp: Any) -> Array:
        """½A, the (..., n, n) top block of W (zero on the Grassmann manifold)."""

    def _a(self, W: Any, xp: Any) -> Array:
        """A itself (the square frames' exp(A) takes it whole): 2·½A unless a subclass holds A."""
        return 2 * self._half_a(W, xp)

    # -- identity --------------------------------------------------------------------------

    def _key(self) -> tuple:
        return (type(self), self.N, self.n, self.section, self.retraction_method, self.validate, self.max_doublings)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifold):
            return False
        other_key = getattr(other, "_key", None)
        return other_key is not None and self._key() == other_key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        extra = "" if self.section == "householder" else f", section={self.section!r}"
        extra += "" if self.retraction_method == "geodesic" else f", retraction_method={self.retraction_method!r}"
        return f"{type(self).__name__}({self.N}, {self.n}{extra})"

    @property
    def point_shape(self) -> tuple[int, int]:
        return (self.N, self.n)

    # -- points ------------------------------------------------------------------------------

    def _random_point(
        self, seed: Any, *, xp: Any, batch_shape: tuple[int, ...] = (), dtype: Any = None, device: Any = None
    ) -> Array:
        """A Haar-distributed point (Algorithm 3: QR of a Gaussian N×n matrix).

        The columns of Q are multiplied by the signs of diag(R) so that the factorisation is
        unique and the distribution is the uniform (Haar) one (Mezzadri 2006).
        """
        xp = as_namespace(xp)
        A = _random.normal(seed, (*check_batch_shape(batch_shape), self.N, self.n), xp=xp, dtype=dtype, device=device)
        return _backend.compiled(_haar_factor, xp, "xp")(A, xp=xp)

    def is_point(self, Y: Array, atol: float | None = None) -> bool:
        """``max |YᵀY − I| ≤ atol`` over the whole batch (default 1e-10 in float64, 1e-4 in float32, 4e-3 in
        float16, 3e-2 in bfloat16; half precision is checked in float32 arithmetic)."""
        xp = self._namespace(Y=Y)
        self._check_trailing(Y, "Y", self.point_shape)
        atol = self.default_atol(Y.dtype, xp) if atol is None else atol
        if _backend.dtype_name(Y.dtype) in ("float16", "bfloat16"):
            Y = xp.astype(Y, xp.float32)
        return bool(_backend.compiled(_orthonormal_within, xp, "xp")(Y, atol, xp=xp))

    def point_error(self, Y: Array) -> float:
        """``max |YᵀY − I|`` over the batch (0 for an empty batch), in float32 at least."""
        xp = self._namespace(Y=Y)
        self._check_trailing(Y, "Y", self.point_shape)
        if _backend.dtype_name(Y.dtype) in ("float16", "bfloat16"):
            Y = xp.astype(Y, xp.float32)
        if math.prod(Y.shape) == 0:
            return 0.0
        return float(_backend.compiled(_orthonormality_error, xp, "xp")(Y, xp=xp))

    def nearest_point(self, Y: Array) -> Array:
        """The orthogonal polar factor U Vᵀ of Y = U Σ Vᵀ: the nearest matrix with orthonormal columns in
        the Frobenius (and every unitarily invariant) norm (Higham, *Functions of Matrices*, Theorem
        8.4), by :func:`geoarray.linalg.polar`; half precision is projected in float32. Unique where Y
        has full column rank."""
        xp = self._namespace(Y=Y)
        self._check_trailing(Y, "Y", self.point_shape)
        if _backend.dtype_name(Y.dtype) in ("float16", "bfloat16"):
            return xp.astype(linalg.polar(xp.astype(Y, xp.float32)), Y.dtype)
        return linalg.polar(Y)

    # -- sections and the global representation ------------------------------------------------

    def global_section(
        self, Y: Array, *, strategy: str | None = None, seed: Any = None
    ) -> HouseholderSection | PackedHouseholderSection | BlockReflectorSection | DenseSection | SquareSection:
        """λ(Y) = [Y, Q⊥] by ``strategy`` (default: the manifold's ``section``; see
        :mod:`~geoarray.manifolds.sections`).

        ``"random"`` needs ``seed`` (an int, SeedSequence or Generator): Algorithm 2 draws
        A ∈ R^{N×(N−n)}, removes its Y-component and orthonormalises it. For ``"transported"``
        this is the initial section; the optimizer carries it on with :meth:`transport_section`.
        """
        xp = self._check_point(Y)
        self._check_full_precision(Y)
        strategy = self._strategy(strategy)
        if strategy == "random" and seed is None:
            raise TypeError(f"{self!r} with section='random' needs a seed for global_section (Algorithm 2)")
        if self.N == self.n and strategy != "transported":
            return SquareSection.of(Y)  # the only section of O(n) (the transported one is carried densely)
        if strategy == "random":
            A = _random.normal(seed, (*Y.shape[:-2], self.N, self.N - self.n), xp=xp, dtype=Y.dtype, device=_device(Y))
            A = A - Y @ (xp.matrix_transpose(Y) @ A)
            Qperp, _ = xp.linalg.qr(A)
            # one re-orthogonalisation against Y keeps YᵀQ⊥ at rounding level even for N ≫ n
            Qperp = Qperp - Y @ (xp.matrix_transpose(Y) @ Qperp)
            Qperp, _ = xp.linalg.qr(Qperp)
            return DenseSection(Y, Qperp)
        lam = householder_section(Y)  # "householder" and "rotated" (which re-expresses caches between steps)
        if strategy == "transported":
            return DenseSection.from_householder(lam)
        return lam

    def reframe(self, lam_old: Any, W: Any, lam_new: Any, B: Array, method: str | None = None) -> Array:
        """The B-block of a g^hor element of frame λ_old, re-expressed in the frame λ_new of the next point.

        After a step Y' = λ_old·g(W)·E the frame carried along is Λ = λ_old·g(W) (what the
        ``"transported"`` strategy stores) and the new Householder frame is λ_new = [Y', Q⊥(Y')];
        both have the first n columns Y', so λ_newᵀΛ = diag(I, S) with S = Q⊥(Y')ᵀΛ[:, n:] ∈ O(N−n)
        and an element [[A, −Bᵀ], [B, 0]] becomes [[A, −(SB)ᵀ], [SB, 0]]. S is never formed:
        S·B = Q⊥(Y')ᵀ·λ_old·g(W)·[0; B] through the low-rank g(W) = I + B′KB″ᵀ and the compact-WY
        sections, O(N·n·k) for B of k columns. ``method`` must be the retraction the step used.
        """
        xp = self._check_horizontal(W)
        method = self._method(method)
        # one compiled call on JAX: eagerly, the retraction kernel's device-side choice of route
        # (lax.switch over closures) would be traced and compiled anew at every call
        kernel = _backend.compiled(_moved_rows, xp, "xp", "method", "max_doublings")
        moved = kernel(self._half_a(W, xp), W.B, B, xp=xp, method=method, max_doublings=self.max_doublings)
        return lam_new.perp_t(self.apply_section(lam_old, moved))

    def _method(self, method: str | None) -> str:
        return self.retraction_method if method is None else check_choice(method, "method", RETRACTIONS)

    def retraction(self, W: Any, method: str | None = None) -> Array:
        """exp(W)E (``"geodesic"``) or Cay(W)E = (I − ½W)⁻¹(I + ½W)E (``"cayley"``), (..., N, n).

        Only 2n×2n matrices are exponentiated or solved (eqs. 19–21, see the module docstring);
        cost O(N·n²). The result is orthonormal to ~1e-13 in float64 for ‖W‖ up to 1e3.
        """
        xp = self._check_horizontal(W)
        method = self._method(method)
        kernel = _backend.compiled(_retract_e, xp, "xp", "method", "max_doublings")
        return kernel(self._half_a(W, xp), W.B, xp=xp, method=method, max_doublings=self.max_doublings)

    def apply_retraction(
        self,
        lam: Any,
        W: Any,
        method: str | None = None,
        *,
        velocity_bound: float | None = None,
        out: Array | None = None,
    ) -> Array:
        """λ(Y)·g(W)·E = ``apply_section(lam, retraction(W, method))`` (operation 3 of Algorithm 1, eq. 13),
        with g(W)E's two row blocks handed to the section unassembled: one N×n array fewer per step. A
        float32 result ends with one Björck step (:func:`~geoarray.manifolds.retraction.bjorck_step`),
        except from a packed section, whose application is accurate enough without it, and from the
        square section, which took that step on Y already.

        ``velocity_bound``: a Python float b ≥ the magnitude of every entry of W's A and B (an optimizer
        whose steps are bounded whatever its gradients says so: :class:`~geoarray.optim.RiemannianOptimizer`),
        with which a step without host reads (a GPU's) evaluates φ₁ by the cheapest fixed route that covers
        every such W (:func:`~geoarray.manifolds.retraction.kernel_norm_bound`); a W beyond it comes out NaN.

        ``out``: a writable array of the point's shape and dtype to write the new point into and return
        (the optimizer's parameter itself, in a step taken in pieces): the float32 Björck step's product
        then goes straight into it, with no temporary of the point's size. It may be the memory of
        ``lam.Y``, which the section's application has read by then."""
        if velocity_bound is not None and not _backend.is_compiling():  # dynamo cannot run math.isfinite
            if isinstance(velocity_bound, bool) or not isinstance(velocity_bound, (int, float)):
                raise TypeError(
                    f"velocity_bound must be a Python float (a bound on W's entries) or None, got "
                    f"{type(velocity_bound).__name__} {velocity_bound!r}; pass float(b) or leave it out"
                )
            if not math.isfinite(velocity_bound) or velocity_bound < 0:
                raise ValueError(
                    f"velocity_bound must be a finite number >= 0, got {velocity_bound!r}; leave it out (None) "
                    "when the step is not bounded"
                )
        if not isinstance(
            lam, (HouseholderSection, PackedHouseholderSection, BlockReflectorSection, DenseSection, SquareSection)
        ):
            return _written(super().apply_retraction(lam, W, method), out)
        xp = self._check_horizontal(W)
        self._namespace(W_B=W.B, Y=lam.Y)
        self._check_trailing(lam.Y, "lam.Y", (self.N, self.n))  # a section of another manifold
        if out is not None:
            _check_out(out, lam.Y, xp)
        method = self._method(method)
        static = None
        # the fixed-work routes use it, eager without host reads and torch.compile (which cannot choose a
        # Taylor rule on the device and would otherwise run the top one with a doubling loop); a backend
        # that chooses on the device (JAX) leaves it out of the jitted kernel's static arguments, which it
        # would only multiply
        fixed = not _backend.selects_on_device(xp) and (not _backend.is_traced(W.B) or _backend.is_compiling())
        if velocity_bound is not None and method == "geodesic" and fixed:
            static = kernel_norm_bound(self.N, self.n, float(velocity_bound))
        if self.N == self.n and method == "geodesic":  # g(W)E = exp(A), from A as W holds it (not ½A doubled back)
            square = _backend.compiled(_exp_skew, xp, "xp", "max_doublings")
            top, bottom = square(self._a(W, xp), xp=xp, max_doublings=self.max_doublings), W.B
        else:
            kernel = _backend.compiled(_retract_blocks, xp, "xp", "method", "max_doublings", "static_bound")
            top, bottom = kernel(
                self._half_a(W, xp), W.B, xp=xp, method=method, max_doublings=self.max_doublings, static_bound=static
            )
        Y = lam.apply_blocks(top, bottom)
        # float32: applying the compact-WY section leaves |YᵀY − I| ≈ 30 roundoffs at every step, the
        # Björck step ≈ 6; LAPACK's packed application (ormqr) ≈ 10 already, where it is not worth its cost
        if Y.dtype == xp.float32 and not isinstance(lam, (PackedHouseholderSection, SquareSection)):
            return bjorck_step(Y, xp, out=out)
        return _written(Y, out)

    def apply_section(self, lam: HouseholderSection | DenseSection, X: Array) -> Array:
        """λ(Y)·X = Y·X[:n] + Q⊥·X[n:] for X (..., N, k), in O(N·n·k) (dense sections: O(N²k)).

        A Householder section applies Q·diag(S, I) instead (:class:`~geoarray.manifolds.HouseholderSection`),
        which keeps the result orthonormal to rounding even when Y has drifted."""
        self._namespace(X=X, Y=lam.Y)
        if X.ndim < 2 or X.shape[-2] != self.N:
            raise ValueError(f"X must have {self.N} rows for {self!r}, got shape {tuple(X.shape)}")
        return lam.apply(X)

    def transport_section(self, lam: DenseSection, W: Any, method: str | None = None) -> DenseSection:
        """Λ ← Λ·g(W) with g = exp (geodesic) or Cay: the ``"transported"`` strategy's update.

        The new point is the first n columns, Λ·g(W)·E, the same point that
        ``apply_section(lam, retraction(W))`` gives. Dense: O(N²·n) time, O(N²) memory.
        """
        if not isinstance(lam, DenseSection):
            raise TypeError(f"transport_section needs a DenseSection, got {type(lam).__name__}")
        xp = self._check_horizontal(W)
        method = self._method(method)
        kernel = _backend.compiled(_transport, xp, "xp", "method", "max_doublings")
        Y, Qperp = kernel(
            lam.Y, lam.Qperp, self._half_a(W, xp), W.B, xp=xp, method=method, max_doublings=self.max_doublings
        )
        return DenseSection(Y, Qperp)


class Stiefel(OrthonormalFrames):
    r""":math:`\mathrm{St}(N, n) = \{Y \in \mathbb R^{N\times n} : Y^\top Y = I_n\}`, a homogeneous space of O(N).

    The operations of Algorithm 1 (Brantner, *Generalizing Adam to Manifolds for Efficiently Training
    Transformers*, eqs. 2, 11, 13 and 17), with the canonical metric and the section λ(Y) = [Y, Q⊥]:

    .. math::

        \operatorname{grad}_Y L = \nabla L - Y \nabla L^\top Y, \qquad
        \Omega(\Delta) = \left(I - \tfrac12 YY^\top\right)\Delta Y^\top
            - Y\Delta^\top\left(I - \tfrac12 YY^\top\right),

        \lambda(Y)^{-1}\,\Omega(\Delta)\,\lambda(Y) = \begin{pmatrix} A & -B^\top \\ B & 0 \end{pmatrix}
            \in \mathfrak g^{\mathrm{hor}},\quad A = Y^\top\Delta,\ B = Q_\perp^\top\Delta,
        \qquad Y_{\text{new}} = \lambda(Y)\,\exp(W)\,E .

    Parameters
    ----------
    N, n : int
        Ambient rows and columns, 1 ≤ n ≤ N.
    section : {"householder", "random", "transported"}
        How λ(Y) completes Y to an orthogonal matrix (see :mod:`geoarray.manifolds.sections`):
        Householder compact-WY (default; deterministic, O(N·n) memory), the paper's Algorithm 2
        (seeded; dense N×(N−n)), or created once and transported by the optimizer (dense N×N,
        the GeometricMachineLearning.jl behaviour).
    retraction_method : {"geodesic", "cayley"}
        Default of :meth:`retraction`.
    validate : bool
        Check that points passed in satisfy YᵀY = I (costs a reduction and a host sync per call).
    max_doublings : int
        Bound on the doublings of the geodesic kernel; 64 covers ‖W‖ far beyond any optimizer step
        (‖W‖ ≈ 1e3 needs about 21). Elements that would need more come out NaN.
    canonical : bool
        geoopt's keyword: ``True`` (the default, the canonical metric, geoopt's default ``Stiefel()``) is
        the only metric here; ``False`` (geoopt's ``EuclideanStiefel``) raises a ``ValueError`` saying how the
        two differ.
    """

    @property
    def dim(self) -> int:
        """Manifold dimension N·n − n(n+1)/2."""
        return self.N * self.n - self.n * (self.n + 1) // 2

    def is_tangent(self, Y: Array, D: Array, atol: float | None = None) -> bool:
        """YᵀΔ + ΔᵀY = 0 within atol."""
        xp = self._check_tangent_shape(Y, D, "D")
        atol = self.default_atol(D.dtype, xp) if atol is None else atol
        YtD = xp.matrix_transpose(Y) @ D
        return bool(xp.all(xp.abs(YtD + xp.matrix_transpose(YtD)) <= atol))

    def project(self, Y: Array, G: Array) -> Array:
        """Orthogonal projection of G onto T_Y St: G − Y sym(YᵀG)."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, G, "G")
        return G - Y @ linalg.sym(xp.matrix_transpose(Y) @ G)

    # -- metric and gradient -------------------------------------------------------------------

    def metric(self, Y: Array, D1: Array, D2: Array) -> Array:
        """g_Y(Δ₁, Δ₂) = tr(Δ₁ᵀ(I − ½YYᵀ)Δ₂) (eq. 3), per batch element."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, D1, "D1")
        self._check_tangent_shape(Y, D2, "D2")
        Yt = xp.matrix_transpose(Y)
        return xp.sum(D1 * D2, axis=(-2, -1)) - xp.sum((Yt @ D1) * (Yt @ D2), axis=(-2, -1)) / 2

    def rgrad(self, Y: Array, dL: Array) -> Array:
        """Riemannian gradient for the canonical metric: ∇L − Y ∇Lᵀ Y (eq. 4)."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, dL, "dL")
        return dL - Y @ (xp.matrix_transpose(dL) @ Y)

    def omega(self, Y: Array, D: Array) -> Array:
        """:math:`\\Omega(\\Delta) = (I - \\tfrac12 YY^\\top)\\Delta Y^\\top - Y\\Delta^\\top(I - \\tfrac12 YY^\\top)
        \\in \\mathfrak g^{\\mathrm{hor},Y}` (eq. 10), dense N×N: for tests and docs."""
        xp = self._check_point(Y)
        self._check_tangent_shape(Y, D, "D")
        Yt = xp.matrix_transpose(Y)
        PD = D - Y @ (Yt @ D) / 2  # (I − ½YYᵀ)Δ
        return PD @ Yt - Y @ xp.matrix_transpose(PD)

    def global_rep(self, lam: HouseholderSection | DenseSection, D: Array) -> StiefelHorizontal:
        """λ⁻¹Ω(Δ)λ = [[A, −Bᵀ], [B, 0]] with A = skew(YᵀΔ), B = Q⊥ᵀΔ (eq. 11)."""
        self._check_tangent_shape(lam.Y, D, "D")
        YtD, B = lam.coords_blocks(D)  # λᵀΔ = [YᵀΔ; Q⊥ᵀΔ]
        return StiefelHorizontal(linalg.skew(YtD), B)

    def lift(self, Y: Array, lam: HouseholderSection | DenseSection, dL: Array) -> StiefelHorizontal:
        """global_rep(λ, rgrad(Y, ∇L)) fused: with Δ = ∇L − Y∇LᵀY, YᵀΔ = Yᵀ∇L − ∇LᵀY is already
        skew, so A = Yᵀ∇L − ∇LᵀY, and Q⊥ᵀY = 0 gives B = Q⊥ᵀ∇L (two products fewer than the composition)."""
        xp = self._check_tangent_shape(Y, dL, "dL")
        YtG, B = lam.coords_blocks(dL)  # λᵀ∇L = [Yᵀ∇L; Q⊥ᵀ∇L]: two products for a Householder section
        return StiefelHorizontal(YtG - xp.matrix_transpose(YtG), B)

    def _check_horizontal(self, W: Any, name: str = "W") -> Any:
        if not isinstance(W, StiefelHorizontal):
            raise TypeError(f"{name} must be a StiefelHorizontal for {self!r}, got {type(W).__name__}")
        xp = self._namespace(A=W.A, B=W.B)
        self._check_trailing(W.A, f"{name}.A", (self.n, self.n))
        self._check_trailing(W.B, f"{name}.B", (self.N - self.n, self.n))
        return xp

    def _half_a(self, W: StiefelHorizontal, xp: Any) -> Array:
        return W.A / 2

    def _a(self, W: StiefelHorizontal, xp: Any) -> Array:
        return W.A

    def spectral_direction(self, Y: Array, G: Array, **kw: Any) -> tuple[Array, Array]:
        """(A*, P): the spectral steepest direction argmax ⟨G, A⟩ over tangent A with ‖A‖₂ ≤ 1, and
        its dual variable (pass it back as ``P0`` to warm-start); see
        :func:`geoarray.manifolds.spectral.stiefel_spectral_direction`."""
        from .spectral import stiefel_spectral_direction

        self._check_point(Y)
        return stiefel_spectral_direction(Y, G, **kw)
