"""The standard transformer integrator: the unstructured baseline of the volume-preserving and
symplectic transformer papers."""

from __future__ import annotations

from typing import Any

from ..nn import Chain, Dense, MultiHeadAttention, ResNetLayer
from ._composite import ComposedModel, check_int

__all__ = ["StandardTransformerIntegrator"]


class StandardTransformerIntegrator(ComposedModel):
    """Upscale (Dense dim → dim·upscale), L × [multi-head attention with add connection (unconstrained
    weights, no layer norm), feed-forward x + σ(Wx + b)], downscale (Dense back to dim, linear).

    Neither volume-preserving nor symplectic. Input/output (..., T, dim): window ↦ next window.
    """

    def __init__(
        self, dim: int, seq_len: int, *, n_heads: int = 1, L: int = 2, upscale: int = 4, activation: Any = "tanh"
    ):
        self.dim = check_int(dim, "dim")
        self.seq_len = check_int(seq_len, "seq_len")
        self.n_heads = check_int(n_heads, "n_heads")
        self.L = check_int(L, "L")
        self.upscale = check_int(upscale, "upscale")
        width = self.dim * self.upscale
        layers: list = [Dense(self.dim, width, "identity")]
        for _ in range(self.L):
            layers += [MultiHeadAttention(width, self.n_heads, stiefel=False), ResNetLayer(width, activation)]
        layers.append(Dense(width, self.dim, "identity"))
        self.chain = Chain(*layers)

    def __repr__(self) -> str:
        return f"StandardTransformerIntegrator({self.dim}, {self.seq_len}, n_heads={self.n_heads}, L={self.L})"
