"""Structure-preserving layers with analytic pullbacks, written once against the array API."""

from .activations import Activation, get_activation
from .base import Chain, Layer

__all__ = ["Activation", "Chain", "Layer", "get_activation"]
