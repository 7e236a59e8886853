"""Global sections λ(Y) with λ(Y)E = Y (Definition 5 of Brantner's paper).

:class:`HouseholderSection` and :class:`DenseSection` serve the Stiefel and Grassmann manifolds
(λ(Y) ∈ O(N)); :class:`SymplecticSection` the symplectic Stiefel manifold (λ(Y) ∈ Sp(2N), the
symplectic Householder completion described in :mod:`geoarray.manifolds.symplectic_stiefel`).

A section completes an orthonormal Y (N×n) to an orthogonal matrix λ(Y) = [Y, Q⊥] (Definition 5
of the paper). The optimizer needs only three things from it:

* ``section.Y``: the point itself, the first n columns;
* ``section.perp_t(Δ)`` = Q⊥ᵀΔ, the B-block of the global representation (eq. 11);
* ``section.perp(X)`` = Q⊥X, to apply the section to a retracted point (eq. 13).

Strategies (the manifold's ``section`` keyword chooses):

``"householder"`` → :class:`HouseholderSection`
    Q⊥ = the last N − n columns of the Householder Q of Y in compact-WY form Q = I − V T Vᵀ, and
    λ = Q·diag(S, I) with the signs S of R's diagonal. Deterministic, O(N·n²) to build, O(N·n)
    memory, applied (λX, λᵀD) through Q in two N×n×k products. Never N×N. Retracted points are
    orthonormal to rounding at every step, whatever the accumulated error of Y. The same section comes
    in other forms (:func:`geoarray.set_section_form`): :class:`PackedHouseholderSection` (LAPACK's
    packed reflectors) and :class:`BlockReflectorSection` (Q = I − W M Wᵀ, matrix products only).
``"random"`` → :class:`DenseSection`
    The paper's Algorithm 2: sample A ∈ R^{N×(N−n)}, remove its Y-component, QR. Dense
    N×(N−n) storage and an O(N²(N−n)) QR per call; explicitly seeded.
``"transported"`` → :class:`DenseSection`
    Created once (from the Householder section) and carried along the optimisation as
    Λ ← Λ·exp(V) (the GeometricMachineLearning.jl behaviour), so the g^hor coordinates of the
    optimizer cache refer to a frame that moves with the weights. Dense N×N memory and an
    O(N²·n) update per step.

Square weights (N = n, the orthogonal group O(n)) have one section, λ = Y (E = I): every strategy
but ``"transported"`` gives :class:`SquareSection`, applied through one Newton–Schulz polar step of Y
instead of a QR, and the retraction exponentiates (or solves with) the n×n block A alone.

The retracted point Λ·retraction(W) does not depend on the section (Λ exp(Λ⁻¹ΩΛ) E = exp(Ω) Y); the
g^hor coordinates of a cache do, which is why the strategy is a visible choice.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import _backend, linalg
from .._backend import array_namespace
from .._backend import device as _device
from ._symplectic import rows, stack_rows, symplectic_inverse
from .retraction import bjorck_step

__all__ = [
    "BlockReflectorSection",
    "DenseSection",
    "HouseholderSection",
    "PackedHouseholderSection",
    "SquareSection",
    "SymplecticSection",
    "householder_section",
]

from .._typing import Array


class HouseholderSection(NamedTuple):
    """λ(Y) = [Y, Q⊥] = Q·diag(S, I) from the Householder QR Y = Q[:, :n]·R, Q = I − V T Vᵀ.

    For orthonormal Y the triangular R is orthogonal, hence diagonal with entries ±1, and
    S = sign(diag R) gives Q·E·S = Y. The section is therefore applied and inverted through Q alone,

        λX = Q [S·X_top; X_bot],        λᵀD = [S·(QᵀD)_top; (QᵀD)_bot],

    two N×n×k products each (Y itself is never multiplied). Because the Householder Q is
    orthogonal to rounding whatever the accuracy of Y, a retracted point λ·g(W)E is orthonormal to
    rounding at every step: orthogonality errors of Y (e.g. float32 drift) are not carried over.
    λE = Q·E·S equals Y up to Y's own orthogonality error.
    """

    Y: Array
    V: Array
    T: Array
    signs: Array  # S = sign(diag R), (..., n), entries ±1

    @classmethod
    def of(cls, Y: Array, *, reconstruct: bool = False) -> HouseholderSection:
        """The section of Y, from a Householder QR of Y (geqrf) or, with ``reconstruct=True``, from the
        factors reconstructed out of Y's orthonormality (:func:`geoarray.linalg.householder_of_orthonormal`:
        an n×n LU instead of an N×n QR; the same section to rounding)."""
        qr = linalg.householder_of_orthonormal(Y) if reconstruct else linalg.householder_qr(Y)
        xp = array_namespace(Y)
        return cls(Y, qr.V, qr.T, _signs(xp.linalg.diagonal(qr.R), xp))

    def coords(self, D: Array) -> Array:
        """λᵀD = [S·(QᵀD)_top; (QᵀD)_bot] for D (..., N, k): the top block is YᵀD, the bottom Q⊥ᵀD."""
        return _concat_rows(self.coords_blocks(D))

    def coords_blocks(self, D: Array) -> tuple[Array, Array]:
        """(YᵀD, Q⊥ᵀD) = (S·(QᵀD)_top, (QᵀD)_bot): the two row blocks of :meth:`coords`, unassembled."""
        xp = array_namespace(D=D, V=self.V)
        mT = xp.matrix_transpose
        n = self.Y.shape[-1]
        QtD = _backend.addmm(D, self.V, mT(self.T) @ (mT(self.V) @ D), xp, alpha=-1.0)
        return self.signs[..., :, None] * QtD[..., :n, :], QtD[..., n:, :]

    def apply(self, X: Array) -> Array:
        """λX = Q [S·X_top; X_bot] for X (..., N, k), in O(N·n·k)."""
        n = self.Y.shape[-1]
        return self.apply_blocks(X[..., :n, :], X[..., n:, :])

    def apply_blocks(self, top: Array, bottom: Array) -> Array:
        """λ[top; bottom] = Q [S·top; bottom] for blocks of n and N − n rows (one assembly, not two)."""
        xp = array_namespace(top=top, bottom=bottom, V=self.V)
        Z = xp.concat([self.signs[..., :, None] * top, bottom], axis=-2)
        if _backend.writable(xp) and not _backend.is_traced(Z):  # Z is ours: Q·Z written into it
            return _backend.addmm_(Z, self.V, self.T @ (xp.matrix_transpose(self.V) @ Z), xp, alpha=-1.0)
        return _backend.addmm(Z, self.V, self.T @ (xp.matrix_transpose(self.V) @ Z), xp, alpha=-1.0)

    def perp_t(self, D: Array) -> Array:
        """Q⊥ᵀ D for D (..., N, k): the last N − n rows of Qᵀ D, in O(N·n·k)."""
        xp = array_namespace(D=D, V=self.V)
        n = self.Y.shape[-1]
        # rows n: of Qᵀ D = D − V Tᵀ (Vᵀ D); the top n rows are never formed
        mT = xp.matrix_transpose
        return _backend.addmm(D[..., n:, :], self.V[..., n:, :], mT(self.T) @ (mT(self.V) @ D), xp, alpha=-1.0)

    def perp(self, X: Array) -> Array:
        """Q⊥ X for X (..., N − n, k) = Q [0; X], in O(N·n·k)."""
        xp = array_namespace(X=X, V=self.V)
        n = self.Y.shape[-1]
        V, T = self.V, self.T
        # Q [0; X] = [0; X] − V T (V[n:]ᵀ X): only the lower block of V meets X
        zeros = xp.zeros((*X.shape[:-2], n, X.shape[-1]), dtype=X.dtype, device=_device(X))
        return _backend.addmm(
            xp.concat([zeros, X], axis=-2), V, T @ (xp.matrix_transpose(V[..., n:, :]) @ X), xp, alpha=-1.0
        )


class PackedHouseholderSection(NamedTuple):
    """The section of :class:`HouseholderSection`, λ(Y) = Q·diag(S, I), with Q kept as LAPACK's packed
    reflectors (``a``, ``tau``) of geqrf and applied by ormqr: one library call per application and no
    T factor to build. torch only; chosen by :func:`householder_section` for batches of small frames,
    where it is the faster form (336 × St(49, 7), one thread: an application 0.41 ms instead of 0.71 ms,
    and the 0.5 ms of building T saved). Equal to :class:`HouseholderSection` to rounding (tested).
    """

    Y: Array
    a: Array  # (..., N, n): R on and above the diagonal, the reflectors below it (LAPACK's geqrf)
    tau: Array  # (..., n)
    signs: Array  # S = sign(diag R), (..., n)

    @classmethod
    def of(cls, Y: Array) -> PackedHouseholderSection:
        xp = array_namespace(Y)
        a, tau = _backend.torch_packed_qr(Y)
        return cls(Y, a, tau, _signs(xp.linalg.diagonal(a), xp))

    def _q(self, X: Array, transpose: bool) -> Array:
        return _backend.torch_apply_packed_q(self.a, self.tau, X, transpose)

    def coords(self, D: Array) -> Array:
        """λᵀD = [S·(QᵀD)_top; (QᵀD)_bot]."""
        return _scale_top_rows(self._q(D, True), self.signs, self.Y.shape[-1])

    def coords_blocks(self, D: Array) -> tuple[Array, Array]:
        """(YᵀD, Q⊥ᵀD): the two row blocks of :meth:`coords`, unassembled."""
        QtD, n = self._q(D, True), self.Y.shape[-1]
        return self.signs[..., :, None] * QtD[..., :n, :], QtD[..., n:, :]

    def apply(self, X: Array) -> Array:
        """λX = Q [S·X_top; X_bot]."""
        return self._q(_scale_top_rows(X, self.signs, self.Y.shape[-1]), False)

    def apply_blocks(self, top: Array, bottom: Array) -> Array:
        """λ[top; bottom] = Q [S·top; bottom]."""
        xp = array_namespace(top=top, bottom=bottom, Y=self.Y)
        # assembled column-major, the layout ormqr works in: the retraction's bottom block arrives
        # transposed, so the assembly reads it contiguously and ormqr copies nothing (ViT set, one
        # thread: 0.04 ms of a 0.47 ms application)
        mT = xp.matrix_transpose
        return self._q(mT(xp.concat([mT(self.signs[..., :, None] * top), mT(bottom)], axis=-1)), False)

    def perp_t(self, D: Array) -> Array:
        """Q⊥ᵀD: the last N − n rows of QᵀD."""
        return self._q(D, True)[..., self.Y.shape[-1] :, :]

    def perp(self, X: Array) -> Array:
        """Q⊥X = Q [0; X]."""
        xp = array_namespace(X=X, Y=self.Y)
        zeros = xp.zeros((*X.shape[:-2], self.Y.shape[-1], X.shape[-1]), dtype=X.dtype, device=_device(X))
        return self._q(xp.concat([zeros, X], axis=-2), False)


class BlockReflectorSection(NamedTuple):
    """λ(Y) = [Y, Q⊥] = Q·diag(S, I) with Householder's Q as one block reflector, Q = I − W M Wᵀ,
    W = Y − E·S (:func:`geoarray.linalg.householder_block_reflector`): the same section as
    :class:`HouseholderSection` to rounding, built and applied with matrix products and elementwise
    operations only (the GEMM-only route, ``set_section_form("block-reflector")``).

    W is never formed: WᵀX = YᵀX − S·X_top and W·Z = Y·Z − E·S·Z, so every product is with Y itself and
    the section stores only the n×n matrix M and the signs beside Y. Applied like compact WY, two N×n×k
    products per use::

        λᵀD = [S·(QᵀD)_top; D_bot − Y₂·P],  P = Mᵀ(YᵀD − S·D_top)
        λ[t; b] = Z − Y·R + E·S·R,  Z = [S·t; b],  R = M(YᵀZ − t)
    """

    Y: Array
    M: Array
    signs: Array  # S = sign(diag R) of geqrf's R, (..., n), entries ±1

    @classmethod
    def of(cls, Y: Array) -> BlockReflectorSection:
        """The section of Y (orthonormal up to a drift of about 1e-3): no QR, LU or triangular solve."""
        M, signs = linalg.householder_block_reflector(Y)
        return cls(Y, M, signs)

    def _p(self, D: Array, xp: Any) -> Array:
        """P = Mᵀ·WᵀD = Mᵀ(YᵀD − S·D_top) for D (..., N, k)."""
        n = self.Y.shape[-1]
        mT = xp.matrix_transpose
        return mT(self.M) @ (mT(self.Y) @ D - self.signs[..., :, None] * D[..., :n, :])

    def coords(self, D: Array) -> Array:
        """λᵀD = [S·(QᵀD)_top; (QᵀD)_bot] for D (..., N, k): the top block is YᵀD, the bottom Q⊥ᵀD."""
        return _concat_rows(self.coords_blocks(D))

    def coords_blocks(self, D: Array) -> tuple[Array, Array]:
        """(S·(QᵀD)_top, (QᵀD)_bot) with QᵀD = D − W·P: the two row blocks of :meth:`coords`."""
        xp = array_namespace(D=D, Y=self.Y)
        n = self.Y.shape[-1]
        P = self._p(D, xp)
        S = self.signs[..., :, None]
        # S·(D_top − (Y₁ − S)·P) = S·D_top − S·Y₁·P + P
        top = S * D[..., :n, :] - S * (self.Y[..., :n, :] @ P) + P
        return top, _backend.addmm(D[..., n:, :], self.Y[..., n:, :], P, xp, alpha=-1.0)

    def apply(self, X: Array) -> Array:
        """λX = Q [S·X_top; X_bot] for X (..., N, k), in O(N·n·k)."""
        n = self.Y.shape[-1]
        return self.apply_blocks(X[..., :n, :], X[..., n:, :])

    def apply_blocks(self, top: Array, bottom: Array) -> Array:
        """λ[top; bottom] = Q·Z, Z = [S·top; bottom]: Z − Y·R with S·R added to the top rows,
        R = M·WᵀZ = M(YᵀZ − top)."""
        xp = array_namespace(top=top, bottom=bottom, Y=self.Y)
        n = self.Y.shape[-1]
        Z = xp.concat([self.signs[..., :, None] * top, bottom], axis=-2)
        R = self.M @ (xp.matrix_transpose(self.Y) @ Z - top)
        ESR = self.signs[..., :, None] * R
        if _backend.writable(xp) and not _backend.is_traced(Z):  # Z is ours: Q·Z written into it
            out = _backend.addmm_(Z, self.Y, R, xp, alpha=-1.0)
            out[..., :n, :] = out[..., :n, :] + ESR
            return out
        out = _backend.addmm(Z, self.Y, R, xp, alpha=-1.0)
        return xp.concat([out[..., :n, :] + ESR, out[..., n:, :]], axis=-2)

    def perp_t(self, D: Array) -> Array:
        """Q⊥ᵀ D = D_bot − Y₂·P for D (..., N, k), in O(N·n·k)."""
        xp = array_namespace(D=D, Y=self.Y)
        n = self.Y.shape[-1]
        return _backend.addmm(D[..., n:, :], self.Y[..., n:, :], self._p(D, xp), xp, alpha=-1.0)

    def perp(self, X: Array) -> Array:
        """Q⊥ X for X (..., N − n, k) = λ[0; X], in O(N·n·k)."""
        xp = array_namespace(X=X, Y=self.Y)
        n = self.Y.shape[-1]
        zeros = xp.zeros((*X.shape[:-2], n, X.shape[-1]), dtype=X.dtype, device=_device(X))
        return self.apply_blocks(zeros, X)


def householder_section(Y: Array) -> HouseholderSection | PackedHouseholderSection | BlockReflectorSection:
    """The Householder section of Y in the form :func:`geoarray.set_section_form` sets, by default the
    cheaper one for this backend and shape (:func:`geoarray._backend.householder_section_form` says which
    and why): packed reflectors applied by ormqr, the compact-WY form with the reflectors from a QR or
    rebuilt from Y's orthonormality, or one block reflector made of matrix products only.
    """
    form = _backend.householder_section_form(tuple(Y.shape), array_namespace(Y), _device(Y))
    if form == "packed":
        return PackedHouseholderSection.of(Y)
    if form == "block-reflector":
        return BlockReflectorSection.of(Y)
    return HouseholderSection.of(Y, reconstruct=form == "reconstructed")


def _signs(d: Array, xp: Any) -> Array:
    """S = sign(diag R), entries ±1: R's diagonal for an orthonormal Y is ±1 up to rounding (0 only for
    a rank-deficient Y, which no section completes). One operation (two on torch, whose NaN needs a
    select: :func:`geoarray._backend.sign`), where a comparison and a select were five. Stored once under
    ``torch.compile`` (:func:`geoarray._backend.computed_once`), not recomputed in every loop that reads S."""
    return _backend.computed_once(_backend.sign(d, xp))


def _concat_rows(blocks: tuple[Array, Array]) -> Array:
    return array_namespace(*blocks).concat(list(blocks), axis=-2)


def _scale_top_rows(X: Array, signs: Array, n: int) -> Array:
    """diag(S, I)·X: the first n rows of X times the signs S (..., n)."""
    xp = array_namespace(X=X, signs=signs)
    return xp.concat([signs[..., :, None] * X[..., :n, :], X[..., n:, :]], axis=-2)


class DenseSection(NamedTuple):
    """λ(Y) = [Y, Q⊥] stored densely: Q⊥ is (..., N, N − n)."""

    Y: Array
    Qperp: Array

    @classmethod
    def from_householder(
        cls, lam: HouseholderSection | PackedHouseholderSection | BlockReflectorSection
    ) -> DenseSection:
        N, n = lam.Y.shape[-2], lam.Y.shape[-1]
        xp = array_namespace(lam.Y)
        eye = xp.broadcast_to(linalg.eye(N - n, lam.Y), (*lam.Y.shape[:-2], N - n, N - n))
        return cls(lam.Y, lam.perp(eye))

    def coords(self, D: Array) -> Array:
        """λᵀD = [YᵀD; Q⊥ᵀD] for D (..., N, k)."""
        return _concat_rows(self.coords_blocks(D))

    def coords_blocks(self, D: Array) -> tuple[Array, Array]:
        """(YᵀD, Q⊥ᵀD): the two row blocks of :meth:`coords`, unassembled."""
        xp = array_namespace(D=D, Y=self.Y)
        mT = xp.matrix_transpose
        return mT(self.Y) @ D, mT(self.Qperp) @ D

    def apply(self, X: Array) -> Array:
        """λX = Y·X_top + Q⊥·X_bot for X (..., N, k)."""
        n = self.Y.shape[-1]
        return self.apply_blocks(X[..., :n, :], X[..., n:, :])

    def apply_blocks(self, top: Array, bottom: Array) -> Array:
        """λ[top; bottom] = Y·top + Q⊥·bottom."""
        return self.Y @ top + self.Qperp @ bottom

    def perp_t(self, D: Array) -> Array:
        return array_namespace(self.Qperp).matrix_transpose(self.Qperp) @ D

    def perp(self, X: Array) -> Array:
        return self.Qperp @ X

    def to_dense(self) -> Array:
        """Λ = [Y, Q⊥] as an (..., N, N) array."""
        return array_namespace(self.Y).concat([self.Y, self.Qperp], axis=-1)


class SquareSection(NamedTuple):
    """λ(Y) for N = n (the orthogonal group O(n)): E = I, so λE = λ and the section is Y itself.

    It is applied through Q = Y(3I − YᵀY)/2, one Newton–Schulz (Björck) step of the polar iteration from Y,
    whose orthonormality error is O(‖YᵀY − I‖²): as with :class:`HouseholderSection`'s Q, an
    orthogonality error of Y (float32 drift) is not carried over to the retracted point, and λE = Q
    equals Y up to Y's own orthogonality error. Two n×n products instead of a QR; there is no Q⊥
    (the horizontal part B of g^hor has no rows).
    """

    Y: Array
    Q: Array

    @classmethod
    def of(cls, Y: Array) -> SquareSection:
        return cls(Y, bjorck_step(Y, array_namespace(Y)))  # Y(3I − YᵀY)/2 = Y − ½Y(YᵀY − I)

    def _empty_rows(self, D: Array) -> Array:
        xp = array_namespace(D=D, Q=self.Q)
        return xp.zeros((*D.shape[:-2], 0, D.shape[-1]), dtype=D.dtype, device=_device(D))

    def coords(self, D: Array) -> Array:
        """λᵀD = QᵀD for D (..., n, k)."""
        return array_namespace(self.Q).matrix_transpose(self.Q) @ D

    def coords_blocks(self, D: Array) -> tuple[Array, Array]:
        """(QᵀD, an empty Q⊥ᵀD of 0 rows)."""
        return self.coords(D), self._empty_rows(D)

    def apply(self, X: Array) -> Array:
        """λX = QX for X (..., n, k)."""
        return self.Q @ X

    def apply_blocks(self, top: Array, bottom: Array) -> Array:
        """λ[top; bottom] = Q·top (``bottom`` has no rows)."""
        return self.Q @ top

    def perp_t(self, D: Array) -> Array:
        """Q⊥ᵀD: no rows."""
        return self._empty_rows(D)

    def perp(self, X: Array) -> Array:
        """Q⊥X for X (..., 0, k): zeros of n rows."""
        xp = array_namespace(X=X, Q=self.Q)
        return xp.zeros((*X.shape[:-2], self.Q.shape[-2], X.shape[-1]), dtype=X.dtype, device=_device(X))


class SymplecticSection(NamedTuple):
    """λ(Y) = Q·(λ_c ⊕ I) ∈ Sp(2N) with λE = Y (see the module docstring).

    Fields: ``Y`` (..., 2N, 2n) the point; ``V`` (..., 2N, 2k), ``T`` (..., 2k, 2k): the
    orthogonal-symplectic Q = I − V T Vᵀ; ``core`` (..., 2r, 2r): λ_c ∈ Sp(2r) on the core
    coordinates (q₁…q_r, p₁…p_r). Memory O(N·n).
    """

    Y: Array
    V: Array
    T: Array
    core: Array

    def apply(self, X: Array) -> Array:
        """λX for X (..., 2N, k), in O(N·n·k)."""
        xp = array_namespace(X=X, Y=self.Y)
        return _backend.compiled(_lam_apply, xp, "xp")(self.V, self.T, self.core, X, xp=xp)

    def apply_inv(self, X: Array) -> Array:
        """λ⁻¹X = 𝕁ᵀλᵀ𝕁X for X (..., 2N, k), in O(N·n·k)."""
        xp = array_namespace(X=X, Y=self.Y)
        return _backend.compiled(lam_apply_inv, xp, "xp")(self.V, self.T, self.core, X, xp=xp)

    def to_dense(self) -> Array:
        """λ as a (..., 2N, 2N) array (tests and docs; O(N²) memory)."""
        xp = array_namespace(self.Y)
        N2 = self.Y.shape[-2]
        eye = xp.broadcast_to(linalg.eye(N2, self.Y), (*self.core.shape[:-2], N2, N2))
        return self.apply(eye)


def _lam_apply(V: Array, T: Array, core: Array, X: Array, *, xp: Any) -> Array:
    N, r = X.shape[-2] // 2, core.shape[-1] // 2
    Xc = core @ rows(X, 0, r, xp)
    Z = stack_rows([Xc, rows(X, r, N, xp)], xp) if r < N else Xc
    return linalg.apply_q(V, T, Z)


def lam_apply_inv(V: Array, T: Array, core: Array, X: Array, *, xp: Any) -> Array:
    N, r = X.shape[-2] // 2, core.shape[-1] // 2
    Z = linalg.apply_qt(V, T, X)
    Zc = symplectic_inverse(core, xp) @ rows(Z, 0, r, xp)
    return stack_rows([Zc, rows(Z, r, N, xp)], xp) if r < N else Zc
