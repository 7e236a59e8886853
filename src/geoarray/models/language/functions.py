"""The elementwise and normalising pieces of the language models: GELU (tanh and erf), SiLU, LayerNorm,
RMSNorm and rotary position embeddings, written once against the array API."""

from __future__ import annotations

import math
from typing import Any

from ... import _backend
from ..._backend import array_namespace
from ..._typing import Array
from ...nn.activations import gelu_tanh

# ---------------------------------------------------------------------------------------------
# elementwise functions (the array API has no erf; GELU variants, SiLU)
# ---------------------------------------------------------------------------------------------

_GELU_C = math.sqrt(2 / math.pi)
_ERF_TERMS = 110  # enough for |x| ≤ 6 to float64 accuracy (next term < 1e-18 of the sum)


def erf(x: Array) -> Array:
    """The error function to float64 accuracy, from standard array-API operations only.

    erf(x) = (2/√π) x e^{−x²} Σ_{n≥0} (2x²)ⁿ / (1·3·…·(2n+1)) (Abramowitz & Stegun 7.1.6): every term
    is positive, so the sum has no cancellation; |x| is clipped at 6, where erf = 1 to float64
    precision (1 − erf(6) = 2·10⁻¹⁷), and 110 terms then reach relative accuracy 1e-18.
    """
    xp = array_namespace(x)
    z = _backend.clip(x, xp, min=-6.0, max=6.0)
    z2 = 2 * z * z
    term = xp.ones_like(z)
    total = xp.ones_like(z)
    for n in range(1, _ERF_TERMS):
        term = term * z2 / (2 * n + 1)
        total = total + term
    return (2 / math.sqrt(math.pi)) * z * xp.exp(-z * z) * total


def activation(name: str, x: Array) -> Array:
    xp = array_namespace(x)
    if name == "gelu_new":
        return gelu_tanh(x)
    if name == "gelu":
        return x * (1 + erf(x / math.sqrt(2))) / 2
    if name == "relu":
        return xp.where(x > 0, x, xp.zeros_like(x))
    raise ValueError(f"unknown activation {name!r}")


def silu(x: Array) -> Array:
    xp = array_namespace(x)
    return x * (1 + xp.tanh(x / 2)) / 2  # x·sigmoid(x) without overflow for large |x|


def layer_norm(x: Array, scale: Array | None, shift: Array | None, eps: float) -> Array:
    """γ ⊙ (x − mean x)/√(var x + ε) + β over the last axis (``scale``/``shift`` may be None)."""
    xp = array_namespace(x)
    xc = x - xp.mean(x, axis=-1, keepdims=True)
    n = xc / xp.sqrt(xp.mean(xc * xc, axis=-1, keepdims=True) + eps)
    if scale is not None:
        n = n * scale
    if shift is not None:
        n = n + shift
    return n


def rms_norm(x: Array, scale: Array | None, eps: float) -> Array:
    """γ ⊙ x/√(mean x² + ε) over the last axis."""
    xp = array_namespace(x)
    n = x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
    return n if scale is None else n * scale


def rope_tables(T: int, d_head: int, theta: float, *, xp: Any, dtype: Any, device: Any) -> tuple[Array, Array]:
    """cos and sin of the rotary angles t·θ^{−2k/d_head}, each ``(T, d_head)`` in the rotate-half layout."""
    half = d_head // 2
    k = xp.arange(half, dtype=dtype, device=device)
    inv_freq = xp.exp(-(2 * k / d_head) * math.log(theta))
    t = xp.arange(T, dtype=dtype, device=device)
    ang = t[:, None] * inv_freq[None, :]
    ang = xp.concat([ang, ang], axis=-1)
    return xp.cos(ang), xp.sin(ang)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate feature pairs (k, k + d_head/2) of ``x`` (..., T, d_head) by the angles of ``cos``/``sin``."""
    xp = array_namespace(x)
    half = x.shape[-1] // 2
    rotated = xp.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
