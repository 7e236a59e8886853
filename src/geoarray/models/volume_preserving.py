"""The volume-preserving transformer and the volume-preserving feed-forward network.

Brantner, Hesthaven, Oyarzún, "Volume-preserving transformers for learning time series data with
structure" (the volume-preserving transformer chapter of GeometricMachineLearning.jl).
"""

from __future__ import annotations

from typing import Any

from ..nn import Chain, VolumePreservingAttention, VolumePreservingLowerLayer, VolumePreservingUpperLayer
from ._composite import ComposedModel, check_int

__all__ = ["VolumePreservingFeedForward", "VolumePreservingTransformer"]


def _vp_feed_forward_layers(dim: int, n_blocks: int, n_linear: int, activation: Any) -> list:
    layers: list = []
    for _ in range(n_blocks):
        for _ in range(n_linear):
            layers.append(VolumePreservingLowerLayer(dim, "identity", use_bias=False))
            layers.append(VolumePreservingUpperLayer(dim, "identity", use_bias=False))
        layers.append(VolumePreservingLowerLayer(dim, activation, use_bias=True))
        layers.append(VolumePreservingUpperLayer(dim, activation, use_bias=True))
    return layers


class VolumePreservingFeedForward(ComposedModel):
    r"""Volume-preserving feed-forward network: n_blocks × [n_linear × (linear lower, linear upper),
    nonlinear lower, nonlinear upper].

    A linear lower layer is x ↦ x + Lx (L strictly lower triangular), a nonlinear one
    x ↦ x + σ(Lx + b); each Jacobian is unit triangular, so det J = 1 for the composition. Pointwise
    on (..., dim): as an integrator it maps z_n to z_{n+1} (a sequence (..., T, dim) is mapped row
    by row).
    """

    def __init__(self, dim: int, *, n_blocks: int = 2, n_linear: int = 1, activation: Any = "tanh"):
        self.dim = check_int(dim, "dim")
        self.n_blocks = check_int(n_blocks, "n_blocks")
        self.n_linear = check_int(n_linear, "n_linear", 0)
        self.seq_len = None
        self.chain = Chain(*_vp_feed_forward_layers(self.dim, self.n_blocks, self.n_linear, activation))

    def __repr__(self) -> str:
        return f"VolumePreservingFeedForward({self.dim}, n_blocks={self.n_blocks}, n_linear={self.n_linear})"


class VolumePreservingTransformer(ComposedModel):
    r"""Volume-preserving transformer: L × [volume-preserving attention, volume-preserving feed-forward].

    Input and output (..., T, dim) with T = ``seq_len``: the model maps the window z_{n−T+1…n} to
    the next window z_{n+1…n+T}. Attention is Z ↦ ZΛ(Z), Λ(Z) = Cayley(ZᵀAZ) with A skew (the chapter's
    eq. "LambdaRight"; the chapter's factor ½ in front of the Cayley transform is a typo), the
    feed-forward part is :class:`VolumePreservingFeedForward` (``n_blocks``, ``n_linear``,
    ``activation``). There is no add connection (adding the input is not volume-preserving), so
    det ∂vec(y)/∂vec(x) = 1 for the whole model.
    """

    def __init__(
        self, dim: int, seq_len: int, *, n_blocks: int = 2, n_linear: int = 1, L: int = 1, activation: Any = "tanh"
    ):
        self.dim = check_int(dim, "dim")
        self.seq_len = check_int(seq_len, "seq_len")
        self.n_blocks = check_int(n_blocks, "n_blocks")
        self.n_linear = check_int(n_linear, "n_linear", 0)
        self.L = check_int(L, "L")
        layers = []
        for _ in range(self.L):
            layers.append(VolumePreservingAttention(self.dim, self.seq_len))
            layers.extend(_vp_feed_forward_layers(self.dim, self.n_blocks, self.n_linear, activation))
        self.chain = Chain(*layers)

    def __repr__(self) -> str:
        return (
            f"VolumePreservingTransformer({self.dim}, {self.seq_len}, n_blocks={self.n_blocks}, "
            f"n_linear={self.n_linear}, L={self.L})"
        )
