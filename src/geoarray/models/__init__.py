"""Architectures of the papers, each a layer-contract object (``init``, ``apply``, ``vjp``, ``manifolds``)
composed from the layers of :mod:`geoarray.nn`."""

from .classification import ClassificationTransformer
from .rollout import iterate
from .standard import StandardTransformerIntegrator
from .symplectic import GSympNet, LASympNet, LinearSymplecticTransformer, SymplecticTransformer
from .volume_preserving import VolumePreservingFeedForward, VolumePreservingTransformer

__all__ = [
    "ClassificationTransformer",
    "GSympNet",
    "LASympNet",
    "LinearSymplecticTransformer",
    "StandardTransformerIntegrator",
    "SymplecticTransformer",
    "VolumePreservingFeedForward",
    "VolumePreservingTransformer",
    "iterate",
]
