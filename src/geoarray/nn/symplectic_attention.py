"""Symplectic attention: shears of the [q, p] halves by gradients of potentials over the sequence.

Layout. Sequences are ``(..., T, d)`` with d = 2k and the feature axis split into halves
x = [q, p], q = x[..., :k], p = x[..., k:]. The seeds (linear symplectic attention, symplectic
attention chapters) write the halves as k×T matrices Q = qᵀ, P = pᵀ.

Symplecticity is on the product space: the form Σ_t z_tᵀ 𝕁 z̃_t with 𝕁 = [[0, I_k], [−I_k, 0]],
i.e. the flattened map has Jᵀ 𝕁̂ J = 𝕁̂ with 𝕁̂ = I_T ⊗ 𝕁. Every layer here is a shear
q ← q + ∇_p F(p) (the "Q" layers) or p ← p + ∇_q F(q) (the "P" layers): its Jacobian is
[[I, H], [0, I]] (resp. [[I, 0], [H, I]]) with H the symmetric Hessian of F, hence symplectic.
The potential depends only on the half that is *not* updated; this is the convention of the
reference package (GeometricMachineLearning.jl) for both the linear and the non-linear layers.
"""

from __future__ import annotations

from typing import Any

from .. import _backend
from .. import random as _random
from ..linalg import sym
from ._checks import check_cotangent, check_even_size, check_input, check_params, check_size, sum_outer
from .base import Layer

__all__ = [
    "LinearSymplecticAttentionP",
    "LinearSymplecticAttentionQ",
    "SymplecticAttentionP",
    "SymplecticAttentionQ",
]

from .._typing import Array


def _halves(x: Array, k: int) -> tuple[Array, Array]:
    return x[..., :k], x[..., k:]


# --------------------------------------------------------------------------------------------
# Linear symplectic attention
# --------------------------------------------------------------------------------------------


class _SymplecticShear(Layer):
    """Shared plumbing of the Q/P shears: which half is read, which half is updated."""

    _update: str  # "q" or "p": the half that is changed
    dim: int

    def _combine(self, fixed: Array, moved: Array, xp: Any) -> Array:
        """[q, p] from the half that is kept (``fixed``) and the one that is updated (``moved``)."""
        return xp.concat([moved, fixed] if self._update == "q" else [fixed, moved], axis=-1)

    def _split(self, x: Array) -> tuple[Array, Array]:
        """(source, target): the half the update is computed from and the half it is added to."""
        q, p = _halves(x, self.dim // 2)
        return (p, q) if self._update == "q" else (q, p)


class _LinearSymplecticAttention(_SymplecticShear):
    def __init__(self, dim: int, seq_len: int):
        self.dim = check_even_size(dim, "dim")
        self.seq_len = check_size(seq_len, "seq_len")

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict:
        """A symmetric, entries ~ N(0, 1/T) before symmetrisation."""
        xp = _backend.as_namespace(xp)
        T = self.seq_len
        A = _random.normal(seed, (T, T), xp=xp, dtype=dtype, device=device, scale=T**-0.5)
        return {"A": sym(A)}

    def manifolds(self) -> dict:
        return {"A": None}

    def _prepare(self, params: Any, x: Array) -> tuple[Any, Array]:
        check_params(self, params, {"A": (self.seq_len, self.seq_len)})
        xp = check_input(self, x, self.dim, params=params, sequence=True, seq_len=self.seq_len)
        return xp, sym(params["A"])

    def apply(self, params: Any, x: Array) -> Array:
        xp, Abar = self._prepare(params, x)
        s, t = self._split(x)
        return self._combine(s, t + Abar @ s, xp)

    def vjp(self, params: Any, x: Array) -> tuple[Array, Any]:
        xp, Abar = self._prepare(params, x)
        s, t = self._split(x)
        y = self._combine(s, t + Abar @ s, xp)

        def pullback(dy: Array) -> tuple[dict, Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            ds, dt = self._split(dy)
            dx = self._combine(ds + Abar @ dt, dt, xp)  # Ā is symmetric: Āᵀ dt = Ā dt
            # ⟨dt, Ā s⟩ summed over batch and features → Σ dt sᵀ (T×T), projected by sym (self-adjoint)
            dAbar = sum_outer(xp.matrix_transpose(dt), xp.matrix_transpose(s), xp)
            return {"A": sym(dAbar)}, dx

        return y, pullback


class LinearSymplecticAttentionQ(_LinearSymplecticAttention):
    """Linear symplectic attention, Q version: q ← q + Ā p, p unchanged.

    From the "Linear Symplectic Attention" chapter of the GeometricMachineLearning.jl documentation.

    ``x`` is ``(..., T, dim)`` = [q, p] halves; Ā (T×T, symmetric) mixes the time steps:
    q_t ← q_t + Σ_s Ā_ts p_s. In the chapter's k×T layout this is Q ← Q + P Ā, the gradient of
    F(P) = ½ Tr(P A Pᵀ): ∇_P F = ½ P (A + Aᵀ) = P Ā. The chapter says A ∈ 𝒮_skew(T); that is a typo
    (for skew A the gradient vanishes): Ā is the symmetric part of A, and the Jacobian
    [[I, Ā ⊗ I_k], [0, I]] is symplectic exactly because Ā is symmetric.

    Parameters ``{"A": (T, T)}``, stored full; the layer uses Ā = sym(A) = ½(A + Aᵀ), so the gradient
    is symmetric and ``init`` returns a symmetric A. ``seq_len`` is required: inputs with another T
    raise ``ValueError``; odd ``dim`` raises ``ValueError``.
    """

    _update = "q"


class LinearSymplecticAttentionP(_LinearSymplecticAttention):
    """Linear symplectic attention, P version: p ← p + Ā q, q unchanged.

    From the "Linear Symplectic Attention" chapter of the GeometricMachineLearning.jl documentation.

    ``x`` is ``(..., T, dim)`` = [q, p] halves; the chapter's k×T form is P ← P + Q Ā with
    Ā = ½(A + Aᵀ) (the chapter's "A ∈ 𝒮_skew" is a typo: skew A gives a zero update). Parameters and
    checks as in :class:`LinearSymplecticAttentionQ`.
    """

    _update = "p"


# --------------------------------------------------------------------------------------------
# Symplectic attention with matrix / vector softmax
# --------------------------------------------------------------------------------------------

_SOFTMAX = ("matrix", "vector")


class _SymplecticAttention(_SymplecticShear):
    def __init__(self, dim: int, *, symmetric: bool = False, softmax: str = "matrix"):
        self.dim = check_even_size(dim, "dim")
        if not isinstance(symmetric, bool):
            raise TypeError(f"symmetric must be a bool, got {symmetric!r}")
        if softmax not in _SOFTMAX:
            raise ValueError(f"softmax must be one of {_SOFTMAX}, got {softmax!r}")
        self.symmetric = symmetric
        self.softmax = softmax

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict:
        """A (k×k) ~ N(0, 1/k²), symmetrised when ``symmetric``: C = s A sᵀ is O(1) for unit-scale s."""
        xp = _backend.as_namespace(xp)
        k = self.dim // 2
        A = _random.normal(seed, (k, k), xp=xp, dtype=dtype, device=device, scale=1.0 / k)
        return {"A": sym(A) if self.symmetric else A}

    def manifolds(self) -> dict:
        return {"A": None}

    def _prepare(self, params: Any, x: Array) -> tuple[Any, Array]:
        k = self.dim // 2
        check_params(self, params, {"A": (k, k)})
        xp = check_input(self, x, self.dim, params=params, sequence=True)
        A = params["A"]
        return xp, sym(A) if self.symmetric else A

    # -- the potential and its derivatives ----------------------------------------------------

    def _axes(self) -> tuple[int, ...]:
        # matrix softmax normalises over all T² entries of C, vector softmax over m in each column n
        return (-2, -1) if self.softmax == "matrix" else (-2,)

    def _logsumexp(self, C: Array, xp: Any) -> tuple[Array, Array]:
        """(log(1 + Σ exp C) over the softmax axes (keepdims), weights w = ∂/∂C of it).

        The "1 +" is the logit 0 joining the others; the maximum m = max(0, max C) is subtracted
        before exponentiating, so nothing overflows: log(e^{−m} + Σ e^{C−m}) + m.
        """
        axes = self._axes()
        mx = xp.max(C, axis=axes, keepdims=True)
        m = xp.where(mx > 0, mx, xp.zeros_like(mx))
        e = xp.exp(C - m)
        Z = xp.exp(-m) + xp.sum(e, axis=axes, keepdims=True)
        return m + xp.log(Z), e / Z

    def _weights(self, s: Array, Ae: Array, xp: Any) -> tuple[Array, Array, Array]:
        sA = s @ Ae  # (..., T, k)
        C = sA @ xp.matrix_transpose(s)  # s Ae sᵀ: the chapter's ZᵀAZ in the (T, k) layout
        lse, w = self._logsumexp(C, xp)
        return sA, lse, w

    def _gradient(self, s: Array, Ae: Array, xp: Any) -> tuple[Array, tuple]:
        # Σ depends on s through C = s Ae sᵀ: ∇_s Σ = w s Aeᵀ + wᵀ s Ae (seed: A Z wᵀ + Aᵀ Z w, transposed)
        sA, _, w = self._weights(s, Ae, xp)
        sAt = s @ xp.matrix_transpose(Ae)
        return w @ sAt + xp.matrix_transpose(w) @ sA, (sA, sAt, w)

    def potential(self, params: Any, x: Array) -> Array:
        """Σ (shape ``x.shape[:-2]``) of the half that drives the update (p for Q layers, q for P layers).

        matrix: Σ = log(1 + Σ_{m,n} exp C_mn); vector: Σ = Σ_n log(1 + Σ_m exp C_mn); C = s A sᵀ.
        """
        xp, Ae = self._prepare(params, x)
        s, _ = self._split(x)
        _, lse, _ = self._weights(s, Ae, xp)
        return xp.sum(lse, axis=(-2, -1))

    def potential_gradient(self, params: Any, x: Array) -> Array:
        """∇_s Σ (..., T, k): the increment the layer adds to the other half."""
        xp, Ae = self._prepare(params, x)
        s, _ = self._split(x)
        return self._gradient(s, Ae, xp)[0]

    # -- contract ---------------------------------------------------------------------------

    def apply(self, params: Any, x: Array) -> Array:
        xp, Ae = self._prepare(params, x)
        s, t = self._split(x)
        return self._combine(s, t + self._gradient(s, Ae, xp)[0], xp)

    def vjp(self, params: Any, x: Array) -> tuple[Array, Any]:
        xp, Ae = self._prepare(params, x)
        s, t = self._split(x)
        g, (sA, sAt, w) = self._gradient(s, Ae, xp)
        y = self._combine(s, t + g, xp)
        axes = self._axes()
        mT = xp.matrix_transpose

        def pullback(dy: Array) -> tuple[dict, Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            ds, v = self._split(dy)
            # φ = ⟨v, ∇_s Σ⟩ = ⟨w, Ċ⟩ with Ċ = v Ae sᵀ + s Ae vᵀ (C differentiated along v). Its
            # gradients are the Hessian-vector product H v (w.r.t. s) and the cotangent of Ae:
            #   dφ = ⟨Dw[dC], Ċ⟩ + ⟨w, dĊ⟩,  Dw[X] = w⊙X − w⊙Σ_axes(w⊙X) (the log-sum-exp Hessian),
            # and Dw is self-adjoint, so ⟨Dw[dC], Ċ⟩ = ⟨dC, R⟩ with R = Dw[Ċ].
            Cdot = v @ mT(sAt) + sA @ mT(v)
            wC = w * Cdot
            R = wC - w * xp.sum(wC, axis=axes, keepdims=True)
            Hv = R @ sAt + mT(R) @ sA + w @ (v @ mT(Ae)) + mT(w) @ (v @ Ae)
            # Ae enters through C (⟨R, s dA sᵀ⟩) and through Ċ (⟨w, v dA sᵀ + s dA vᵀ⟩)
            dAe = sum_outer(s, R @ s + w @ v, xp) + sum_outer(v, w @ s, xp)
            dx = self._combine(ds + Hv, v, xp)
            return {"A": sym(dAe) if self.symmetric else dAe}, dx

        return y, pullback


class SymplecticAttentionQ(_SymplecticAttention):
    r"""Symplectic attention, Q version: q ← q + ∇_p Σ(p), p unchanged.

    From the "Symplectic Attention" chapter of the GeometricMachineLearning.jl documentation.

    ``x`` is ``(..., T, dim)`` = [q, p] halves (dim = 2k even, else ``ValueError``); any T. With the
    chapter's k×T matrix Z = pᵀ, the correlation C = ZᵀAZ is p A pᵀ (T×T) and the potential is

    * ``softmax="matrix"``: Σ(p) = log(1 + Σ_{m,n} exp C_mn) (the chapter's display puts the sum inside
      the exp; its gradient formula, used here, has it outside);
    * ``softmax="vector"``: Σ(p) = Σ_n log(1 + Σ_m exp C_mn) (a softmax per column of C).

    The update is the exact gradient ∇_p Σ = w p Aᵀ + wᵀ p A (seed: A Z wᵀ + Aᵀ Z w), with
    w = ∂Σ/∂C = exp(C)/(1 + Σ exp C) over all entries (matrix) or per column (vector), computed
    with the maximum (and the 0 logit of the "1 +") subtracted. For symmetric A and the matrix
    softmax this is the chapter's 2 A Z w; for the vector softmax w is not symmetric and the chapter's
    one-term simplification A Z softmax(C) is not the gradient, so the exact two-term form is used
    for every option. Being a gradient shear, the layer is symplectic (Jacobian [[I, H], [0, I]],
    H the symmetric Hessian of Σ); the pullback uses the exact Hessian-vector product H·q̄.

    The potential depends on p only, following the linear layer's convention (Q layer: q ← q + Ā p)
    and the reference package. Parameters ``{"A": (k, k)}`` stored full; with ``symmetric=True``
    the layer uses sym(A) (gradient symmetric, ``init`` symmetric), else A as it is.
    ``potential(params, x)`` and ``potential_gradient(params, x)`` expose Σ and ∇_p Σ.
    """

    _update = "q"


class SymplecticAttentionP(_SymplecticAttention):
    r"""Symplectic attention, P version: p ← p + ∇_q Σ(q), q unchanged.

    From the "Symplectic Attention" chapter of the GeometricMachineLearning.jl documentation.

    As :class:`SymplecticAttentionQ` with the roles of the halves exchanged: C = q A qᵀ (the chapter's
    QᵀAQ, T×T), Σ(q) the matrix- or vector-softmax potential, and the update the exact gradient
    w q Aᵀ + wᵀ q A. ``x`` is ``(..., T, dim)`` = [q, p] halves, dim even.
    """

    _update = "p"
