"""Structure-preserving layers with analytic pullbacks, written once against the array API.

Every layer follows the contract of :mod:`geoarray.nn.base`: ``init``, ``manifolds``, ``apply``,
``vjp``; :class:`Chain` composes them. Sequence layers take ``(..., T, d)`` (time, then features;
the papers write d × T), pointwise layers ``(..., d)``; symplectic layers split the features into
``[q, p]`` halves.
"""

from .activations import Activation, get_activation, softmax
from .attention import MultiHeadAttention
from .base import Chain, Layer
from .classification import ClassificationLayer
from .dense import Dense, ResNetLayer
from .losses import ClassificationL2Loss, MSELoss, RelativeL2Loss, SoftmaxCrossEntropy
from .manifold_layers import GrassmannLayer, StiefelLayer
from .symplectic_attention import (
    LinearSymplecticAttentionP,
    LinearSymplecticAttentionQ,
    SymplecticAttentionP,
    SymplecticAttentionQ,
)
from .sympnet import (
    ActivationLayerP,
    ActivationLayerQ,
    BiasLayer,
    GradientLayerP,
    GradientLayerQ,
    LinearLayerP,
    LinearLayerQ,
    PSDLayer,
)
from .volume_preserving import VolumePreservingAttention, VolumePreservingLowerLayer, VolumePreservingUpperLayer

__all__ = [
    "Activation",
    "ActivationLayerP",
    "ActivationLayerQ",
    "BiasLayer",
    "Chain",
    "ClassificationL2Loss",
    "ClassificationLayer",
    "Dense",
    "GradientLayerP",
    "GradientLayerQ",
    "GrassmannLayer",
    "Layer",
    "LinearLayerP",
    "LinearLayerQ",
    "LinearSymplecticAttentionP",
    "LinearSymplecticAttentionQ",
    "MSELoss",
    "MultiHeadAttention",
    "PSDLayer",
    "RelativeL2Loss",
    "ResNetLayer",
    "SoftmaxCrossEntropy",
    "StiefelLayer",
    "SymplecticAttentionP",
    "SymplecticAttentionQ",
    "VolumePreservingAttention",
    "VolumePreservingLowerLayer",
    "VolumePreservingUpperLayer",
    "get_activation",
    "softmax",
]
