"""SympNet layers and the PSD layer of symplectic autoencoders, with analytic pullbacks.

Every layer here acts pointwise on a phase-space vector z = [q; p] ∈ R^{2k}: the input is
``(..., d)`` with d = 2k, the first k features are q and the last k are p. Sequences ``(..., T, d)``
(time, then features — the papers write d × T) are just more leading dimensions: each z_t is mapped on
its own, so the map is symplectic for the product-space form Σ_t z_tᵀ 𝕁 z̃_t,
𝕁_{2k} = [[0, I_k], [−I_k, 0]].

The SympNet layers are shears: one half is moved by a function of the other,

* ``GradientLayerQ``   q ← q + Kᵀ(a ⊙ σ(Kp + b)),   ``GradientLayerP``   p ← p + Kᵀ(a ⊙ σ(Kq + b)),
* ``LinearLayerQ``     q ← q + S p,                  ``LinearLayerP``     p ← p + S q,
* ``ActivationLayerQ`` q ← q + a ⊙ σ(p),             ``ActivationLayerP`` p ← p + a ⊙ σ(q),
* ``BiasLayer``        z ← z + b.

Each increment is the gradient of a scalar function of the other half (V(p) = aᵀΣ(Kp + b) with
Σ′ = σ, ½pᵀSp, Σ_i a_i Σ(p_i)), so the Jacobian is [[I, H], [0, I]] (or [[I, 0], [H, I]]) with H
symmetric, and Jᵀ𝕁J = 𝕁. G-SympNets alternate gradient layers Q/P; LA-SympNets alternate linear
and activation layers (build them with :class:`geoarray.nn.Chain`).

``PSDLayer`` is the cotangent-lift matrix A = blockdiag(Φ, Φ) of the proper symplectic
decomposition, Φ ∈ St(N, n). Lifting (R^{2n} → R^{2N}) it is symplectic in the sense
Aᵀ𝕁_{2N}A = 𝕁_{2n}; reducing (R^{2N} → R^{2n}) it applies the symplectic inverse
A⁺ = 𝕁_{2n}ᵀAᵀ𝕁_{2N} = blockdiag(Φᵀ, Φᵀ), which satisfies A⁺A = I and A⁺𝕁_{2N}A⁺ᵀ = 𝕁_{2n}.

Parameter gradients are summed over all leading dimensions of the input.
"""

from __future__ import annotations

from typing import Any

from .. import random as _random
from ..manifolds import Stiefel
from ._checks import (
    check_cotangent,
    check_even_size,
    check_input,
    check_params,
    check_size,
    scaled_normal,
    sum_lead,
    sum_outer,
    zeros,
)
from .activations import get_activation
from .base import Layer, Pullback

__all__ = [
    "ActivationLayerP",
    "ActivationLayerQ",
    "BiasLayer",
    "GradientLayerP",
    "GradientLayerQ",
    "LinearLayerP",
    "LinearLayerQ",
    "PSDLayer",
]

from .._typing import Array


class _PointwiseLayer(Layer):
    """Shared checks of layers acting on the last axis of ``(..., dim)`` inputs."""

    #: parameter name → shape (filled in by __init__ of the concrete layer)
    _shapes: dict[str, tuple[int, ...]]
    in_dim: int

    def _check_input(self, params: Any, x: Array) -> Any:
        check_params(self, params, self._shapes)
        return check_input(self, x, self.in_dim, params=params)

    def manifolds(self) -> dict:
        return dict.fromkeys(self._shapes)

    def apply(self, params: Any, x: Array) -> Array:
        return self.vjp(params, x)[0]


class _Shear(_PointwiseLayer):
    """q ← q + f(p) (``_update = "q"``) or p ← p + f(q) (``_update = "p"``).

    Concrete layers implement :meth:`_increment`: f(src) and its pullback
    dt ↦ (dparams, ∂f/∂src ᵀ dt).
    """

    _update: str

    def __init__(self, dim: int):
        self.dim = check_even_size(dim, "dim")
        self.in_dim = self.dim
        self.k = self.dim // 2

    def _increment(self, params: Any, src: Array, xp: Any) -> tuple[Array, Pullback]:
        raise NotImplementedError

    def vjp(self, params: Any, x: Array) -> tuple[Array, Pullback]:
        xp = self._check_input(params, x)
        k = self.k
        q, p = x[..., :k], x[..., k:]
        src = p if self._update == "q" else q
        inc, inc_pullback = self._increment(params, src, xp)
        y = xp.concat([q + inc, p] if self._update == "q" else [q, p + inc], axis=-1)

        def pullback(dy: Array) -> tuple[dict, Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            dq, dp = dy[..., :k], dy[..., k:]
            dtarget, dsrc = (dq, dp) if self._update == "q" else (dp, dq)
            dparams, dsrc_inc = inc_pullback(dtarget)
            dsrc = dsrc + dsrc_inc
            dx = xp.concat([dtarget, dsrc] if self._update == "q" else [dsrc, dtarget], axis=-1)
            return dparams, dx

        return y, pullback


# --------------------------------------------------------------------------------------------
# gradient layers
# --------------------------------------------------------------------------------------------


class _GradientLayer(_Shear):
    def __init__(self, dim: int, upscale: int, activation: Any = "tanh"):
        super().__init__(dim)
        self.upscale = check_size(upscale, "upscale")
        self.activation = get_activation(activation)
        self._shapes = {"K": (self.upscale, self.k), "a": (self.upscale,), "b": (self.upscale,)}

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict:
        """K ~ N(0, 1/k), a ~ N(0, 1/upscale), b = 0."""
        s_K, s_a = _random.spawn(seed, 2)
        m, k = self.upscale, self.k
        return {
            "K": scaled_normal(s_K, (m, k), k, xp=xp, dtype=dtype, device=device),
            "a": scaled_normal(s_a, (m,), m, xp=xp, dtype=dtype, device=device),
            "b": zeros((m,), xp=xp, dtype=dtype, device=device),
        }

    def _increment(self, params: Any, src: Array, xp: Any) -> tuple[Array, Pullback]:
        K, a, b = params["K"], params["a"], params["b"]
        z = src @ xp.matrix_transpose(K) + b  # (..., m): K src + b for every sample
        s = self.activation.fn(z)
        inc = (a * s) @ K  # Kᵀ(a ⊙ σ(z))

        def pullback(dt: Array) -> tuple[dict, Array]:
            w = dt @ xp.matrix_transpose(K)  # K dt, (..., m)
            g = w * a * self.activation.deriv(z)
            dK = sum_outer(a * s, dt, xp) + sum_outer(g, src, xp)
            return {"K": dK, "a": sum_lead(w * s, xp), "b": sum_lead(g, xp)}, g @ K

        return inc, pullback


class GradientLayerQ(_GradientLayer):
    """G-SympNet layer on q: q ← q + Kᵀ(a ⊙ σ(Kp + b)), p unchanged.

    The increment is ∇_p V(p) with V(p) = aᵀΣ(Kp + b), Σ′ = σ, so the map is symplectic.

    Parameters
    ----------
    dim : int
        d = 2k, the size of z = [q; p] (even); inputs are ``(..., d)`` or ``(..., T, d)``.
    upscale : int
        m, the width of the hidden layer: K is m × k, a and b have m entries.
    activation : str or object
        σ by name (see :func:`geoarray.nn.get_activation`) or an object with ``fn`` and ``deriv``.

    ``params = {"K": (m, k), "a": (m,), "b": (m,)}``, all unconstrained (``manifolds()`` gives None).
    """

    _update = "q"


class GradientLayerP(_GradientLayer):
    """G-SympNet layer on p: p ← p + Kᵀ(a ⊙ σ(Kq + b)), q unchanged (mirror of :class:`GradientLayerQ`)."""

    _update = "p"


# --------------------------------------------------------------------------------------------
# linear layers
# --------------------------------------------------------------------------------------------


class _LinearLayer(_Shear):
    def __init__(self, dim: int):
        super().__init__(dim)
        self._shapes = {"S": (self.k, self.k)}

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict:
        """S ~ N(0, 1/k) entrywise (the layer uses its symmetric part)."""
        k = self.k
        return {"S": scaled_normal(seed, (k, k), k, xp=xp, dtype=dtype, device=device)}

    def _increment(self, params: Any, src: Array, xp: Any) -> tuple[Array, Pullback]:
        S = params["S"]
        S_sym = (S + xp.matrix_transpose(S)) / 2
        inc = src @ S_sym  # S_sym symmetric: the row form of S_sym src

        def pullback(dt: Array) -> tuple[dict, Array]:
            G = sum_outer(src, dt, xp)
            return {"S": (G + xp.matrix_transpose(G)) / 2}, dt @ S_sym

        return inc, pullback


class LinearLayerQ(_LinearLayer):
    """LA-SympNet linear layer on q: q ← q + sym(S) p, p unchanged, sym(S) = ½(S + Sᵀ).

    S is stored as a full k × k matrix (``params = {"S": (k, k)}``, unconstrained) and only its
    symmetric part acts, which is what makes the shear symplectic (the increment is ∇_p ½pᵀSp).
    The gradient with respect to the stored S is therefore symmetric: sym(Σ p dqᵀ).
    Inputs are ``(..., d)`` or ``(..., T, d)`` with d = 2k.
    """

    _update = "q"


class LinearLayerP(_LinearLayer):
    """LA-SympNet linear layer on p: p ← p + sym(S) q, q unchanged (mirror of :class:`LinearLayerQ`)."""

    _update = "p"


# --------------------------------------------------------------------------------------------
# activation layers
# --------------------------------------------------------------------------------------------


class _ActivationLayer(_Shear):
    def __init__(self, dim: int, activation: Any = "tanh"):
        super().__init__(dim)
        self.activation = get_activation(activation)
        self._shapes = {"a": (self.k,)}

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict:
        """a ~ N(0, 1/k)."""
        k = self.k
        return {"a": scaled_normal(seed, (k,), k, xp=xp, dtype=dtype, device=device)}

    def _increment(self, params: Any, src: Array, xp: Any) -> tuple[Array, Pullback]:
        a = params["a"]
        s = self.activation.fn(src)

        def pullback(dt: Array) -> tuple[dict, Array]:
            return {"a": sum_lead(dt * s, xp)}, dt * a * self.activation.deriv(src)

        return a * s, pullback


class ActivationLayerQ(_ActivationLayer):
    """LA-SympNet activation layer on q: q ← q + a ⊙ σ(p), p unchanged.

    ``params = {"a": (k,)}``, unconstrained. The increment is ∇_p Σ_i a_i Σ(p_i) with Σ′ = σ.
    Inputs are ``(..., d)`` or ``(..., T, d)`` with d = 2k.
    """

    _update = "q"


class ActivationLayerP(_ActivationLayer):
    """LA-SympNet activation layer on p: p ← p + a ⊙ σ(q), q unchanged (mirror of :class:`ActivationLayerQ`)."""

    _update = "p"


# --------------------------------------------------------------------------------------------
# bias
# --------------------------------------------------------------------------------------------


class BiasLayer(_PointwiseLayer):
    """z ← z + b on the whole phase-space vector (a translation, symplectic).

    ``params = {"b": (d,)}``, unconstrained, initialised to 0. Inputs ``(..., d)`` or ``(..., T, d)``, d even.
    """

    def __init__(self, dim: int):
        self.dim = check_even_size(dim, "dim")
        self.in_dim = self.dim
        self._shapes = {"b": (self.dim,)}

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict:
        _random.generator(seed)  # the seed is unused, but a bad one is still an error
        return {"b": zeros((self.dim,), xp=xp, dtype=dtype, device=device)}

    def vjp(self, params: Any, x: Array) -> tuple[Array, Pullback]:
        xp = self._check_input(params, x)

        y = x + params["b"]

        def pullback(dy: Array) -> tuple[dict, Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            return {"b": sum_lead(dy, xp)}, dy

        return y, pullback


# --------------------------------------------------------------------------------------------
# PSD layer
# --------------------------------------------------------------------------------------------


class PSDLayer(_PointwiseLayer):
    """Cotangent-lift layer of symplectic autoencoders (proper symplectic decomposition).

    With n = min(in_dim, out_dim)/2, N = max(in_dim, out_dim)/2 and Φ ∈ St(N, n) (ΦᵀΦ = I_n):

    * lifting, in_dim ≤ out_dim: [q; p] ↦ [Φq; Φp] = A z, A = blockdiag(Φ, Φ) ∈ R^{2N×2n}. It is
      symplectic in the sense Aᵀ𝕁_{2N}A = 𝕁_{2n} (because ΦᵀΦ = I).
    * reducing, in_dim > out_dim: [q; p] ↦ [Φᵀq; Φᵀp] = A⁺ z, the symplectic inverse
      A⁺ = 𝕁_{2n}ᵀAᵀ𝕁_{2N} = blockdiag(Φᵀ, Φᵀ) of the lift: A⁺A = I_{2n} and A⁺𝕁_{2N}A⁺ᵀ = 𝕁_{2n}
      (a Poisson map); A⁺ᵀ𝕁_{2n}A⁺ = 𝕁_{2N} cannot hold since A⁺ has rank 2n < 2N.

    ``params = {"Phi": (N, n)}`` with ``manifolds() == {"Phi": Stiefel(N, n)}`` (Algorithm 3 init).
    Inputs are ``(..., in_dim)`` or ``(..., T, in_dim)``; outputs ``(..., out_dim)``.
    """

    def __init__(self, in_dim: int, out_dim: int):
        self.in_dim = check_even_size(in_dim, "in_dim")
        self.out_dim = check_even_size(out_dim, "out_dim")
        self.lifting = self.in_dim <= self.out_dim
        self.N = max(self.in_dim, self.out_dim) // 2
        self.n = min(self.in_dim, self.out_dim) // 2
        self._shapes = {"Phi": (self.N, self.n)}

    def manifolds(self) -> dict:
        return {"Phi": Stiefel(self.N, self.n)}

    def init(self, seed: Any, *, xp: Any, dtype: Any = None, device: Any = None) -> dict:
        """Φ uniform on St(N, n) (Algorithm 3)."""
        return {"Phi": Stiefel(self.N, self.n).random(seed, xp=xp, dtype=dtype, device=device)}

    def vjp(self, params: Any, x: Array) -> tuple[Array, Pullback]:
        xp = self._check_input(params, x)
        Phi = params["Phi"]
        lead = tuple(x.shape[:-1])
        half_in, half_out = self.in_dim // 2, self.out_dim // 2
        # q and p as the two rows of (..., 2, half): one matmul maps both halves
        z = xp.reshape(x, (*lead, 2, half_in))
        M = xp.matrix_transpose(Phi) if self.lifting else Phi  # row form: z @ Φᵀ = (Φ z)ᵀ
        y = xp.reshape(z @ M, (*lead, self.out_dim))

        def pullback(dy: Array) -> tuple[dict, Array]:
            check_cotangent(self, dy, y.shape, y.dtype)
            dz = xp.reshape(dy, (*lead, 2, half_out))
            dPhi = sum_outer(dz, z, xp) if self.lifting else sum_outer(z, dz, xp)
            dx = xp.reshape(dz @ xp.matrix_transpose(M), (*lead, self.in_dim))
            return {"Phi": dPhi}, dx

        return y, pullback
