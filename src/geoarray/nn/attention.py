"""Multi-head attention with Stiefel projections.

Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*, section 4, eq. 14 and
appendix E."""

from __future__ import annotations

import math
from typing import Any

from .. import random as _random
from ..manifolds import Stiefel
from ._checks import check_cotangent, check_input, check_params, check_size, glorot_uniform, sum_outer
from .activations import softmax, softmax_pullback
from .base import Layer

__all__ = ["MultiHeadAttention"]

from .._typing import Array

_KEYS = ("PQ", "PK", "PV")


class MultiHeadAttention(Layer):
    """Multi-head attention, eq. 14 of Brantner's paper: Attention(Q_i, K_i, V_i) = V_i softmax(Q_iᵀK_i).

    In the paper's layout a sequence is a matrix X ∈ R^{dim×T} (one column per time step) and head
    i = 1…n_heads computes Q_i = W_i^{Qᵀ}X, K_i = W_i^{Kᵀ}X, V_i = W_i^{Vᵀ}X ∈ R^{d_h×T}
    (d_h = dim/n_heads), the correlation matrix Q_iᵀK_i ∈ R^{T×T}, its softmax column by column
    (each column a probability vector, eq. 24) and V_i times it: output column n is the convex
    combination Σ_m P[m, n] v_m with P[:, n] = softmax_m(q_mᵀ k_n) (eq. 25). The heads' d_h×T outputs
    are stacked into a dim×T matrix (head i in rows i·d_h … (i+1)·d_h − 1) and, with
    ``add_connection=True``, X is added.

    geoarray stores sequences transposed, x (..., T, dim): with Q_i = x W_i^Q (T×d_h) etc. the same
    map reads y_i = softmax_row(s · K_i Q_iᵀ) V_i, whose row n is the paper's column n; heads are
    concatenated along the feature axis, y = [y_1, …, y_h] (+ x). Appendix E writes the
    correlations as K_iᵀQ_i (eq. 23), i.e. with the names of W^Q and W^K exchanged; the layer follows
    eq. 14 (and GeometricMachineLearning.jl). No causal mask.

    Scaling inside the softmax: ``scale`` s = 1 by default, as in eq. 14 and the reference
    implementation, so results compare with the paper. The usual 1/√d_h keeps logits O(1) for
    unit-variance weights; with Stiefel projections ``|q_mᵀk_n|`` ≤ ‖x_m‖‖x_n‖ already, independent of
    d_h and of the weights, so the input's scale sets the temperature. Pass
    ``scale=1/math.sqrt(dim // n_heads)`` for the Vaswani et al. convention. The softmax subtracts
    the row maximum, so large logits do not overflow.

    Parameters ``{"PQ", "PK", "PV"}``, each of shape (n_heads, dim, d_h): the per-head projections
    stacked so that one batched manifold call updates all heads. With ``stiefel=True`` each is a
    batch of points of St(dim, d_h) (Haar-random at init; ``manifolds()`` gives
    ``Stiefel(dim, d_h)`` for each), with ``stiefel=False`` unconstrained (Glorot-uniform at init;
    ``manifolds()`` gives None). ``dim`` must be divisible by ``n_heads``.
    """

    def __init__(
        self, dim: int, n_heads: int, *, stiefel: bool = True, add_connection: bool = True, scale: float = 1.0
    ):
        self.dim = check_size(dim, "dim")
        self.n_heads = check_size(n_heads, "n_heads")
        if self.dim % self.n_heads:
            raise ValueError(
                f"MultiHeadAttention: dim must be divisible by n_heads (head dimension dim/n_heads), "
                f"got dim={self.dim}, n_heads={self.n_heads}"
            )
        self.head_dim = self.dim // self.n_heads
        self.stiefel = bool(stiefel)
        self.add_connection = bool(add_connection)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"MultiHeadAttention: scale must be a positive finite number, got {scale!r}")
        self.scale = float(scale)

    def _shapes(self) -> dict[str, tuple[int, int, int]]:
        return dict.fromkeys(_KEYS, (self.n_heads, self.dim, self.head_dim))

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict[str, Array]:
        seeds = _random.spawn(seed, len(_KEYS))
        shape = (self.n_heads, self.dim, self.head_dim)
        if self.stiefel:
            M = Stiefel(self.dim, self.head_dim)
            draw = [M.random(s, xp=xp, batch_shape=(self.n_heads,), dtype=dtype, device=device) for s in seeds]
        else:
            draw = [glorot_uniform(s, shape, self.dim, self.head_dim, xp=xp, dtype=dtype, device=device) for s in seeds]
        return dict(zip(_KEYS, draw, strict=True))

    def manifolds(self) -> dict[str, Any]:
        M = Stiefel(self.dim, self.head_dim) if self.stiefel else None
        return dict.fromkeys(_KEYS, M)

    # -- forward ---------------------------------------------------------------------------------

    def _swap(self, nb: int) -> tuple[int, ...]:
        """Permutation (..., a, b, c) ↔ (..., b, a, c) after ``nb`` batch axes (its own inverse)."""
        return (*range(nb), nb + 1, nb, nb + 2)

    def _projections(self, params: Any, xp: Any) -> Array:
        """[W^Q | W^K | W^V] of all heads as one (dim, n_heads·3d_h) matrix: one GEMM projects x."""
        W = xp.concat([params[k] for k in _KEYS], axis=-1)  # (h, dim, 3d_h)
        return xp.reshape(xp.permute_dims(W, (1, 0, 2)), (self.dim, self.n_heads * 3 * self.head_dim))

    def _forward(self, params: Any, x: Array):
        check_params(self, params, self._shapes())
        xp = check_input(self, x, self.dim, params=params, sequence=True)
        h, dh = self.n_heads, self.head_dim
        batch, T = tuple(x.shape[:-2]), x.shape[-2]
        swap = self._swap(len(batch))
        Wf = self._projections(params, xp)
        P = xp.permute_dims(xp.reshape(x @ Wf, (*batch, T, h, 3 * dh)), swap)  # (..., h, T, 3d_h)
        Q, K, V = P[..., :dh], P[..., dh : 2 * dh], P[..., 2 * dh :]
        S = K @ xp.matrix_transpose(Q)  # S[n, m] = k_nᵀq_m = (Q_iᵀK_i)[m, n] of eq. 14
        A = softmax(S * self.scale if self.scale != 1.0 else S, axis=-1)
        O = A @ V
        y = xp.reshape(xp.permute_dims(O, swap), (*batch, T, self.dim))
        if self.add_connection:
            y = x + y
        return xp, (Wf, Q, K, V, A), y

    def apply(self, params: Any, x: Array) -> Array:
        return self._forward(params, x)[2]

    def attention_weights(self, params: Any, x: Array) -> Array:
        """A (..., n_heads, T, T) with ``A[..., i, n, m]`` = :math:`[P_i]_{mn}` of eq. 24: the weight of value m in
        output n.

        Each row A[..., i, n, :] is a probability vector (the paper's column softmax, transposed).
        """
        return self._forward(params, x)[1][4]

    def vjp(self, params: Any, x: Array):
        xp, (Wf, Q, K, V, A), y = self._forward(params, x)
        h, dh = self.n_heads, self.head_dim
        batch, T = tuple(x.shape[:-2]), x.shape[-2]
        BT = math.prod(batch) * T
        swap = self._swap(len(batch))

        def pullback(dy: Array) -> tuple[dict[str, Array], Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            dO = xp.permute_dims(xp.reshape(dy, (*batch, T, h, dh)), swap)  # (..., h, T, d_h)
            dA = dO @ xp.matrix_transpose(V)
            dV = xp.matrix_transpose(A) @ dO
            dS = softmax_pullback(A, dA, axis=-1)
            if self.scale != 1.0:
                dS = dS * self.scale
            dK = dS @ Q
            dQ = xp.matrix_transpose(dS) @ K
            # back to rows of x: (BT, h·3d_h), the layout of x @ Wf
            dP = xp.reshape(xp.permute_dims(xp.concat([dQ, dK, dV], axis=-1), swap), (BT, h * 3 * dh))
            dWf = sum_outer(x, dP, xp)  # summed over batch and time
            dW = xp.permute_dims(xp.reshape(dWf, (self.dim, h, 3 * dh)), (1, 0, 2))  # (h, dim, 3d_h)
            grads = {k: dW[..., i * dh : (i + 1) * dh] for i, k in enumerate(_KEYS)}
            dx = xp.reshape(dP @ xp.matrix_transpose(Wf), x.shape)
            if self.add_connection:
                dx = dx + dy
            return grads, dx

        return y, pullback
