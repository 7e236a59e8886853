"""Manifolds as homogeneous spaces, with the global tangent space representation of the paper.

``Stiefel``, ``Grassmann``, ``SymplecticStiefel`` and ``Euclidean`` share one contract
(:mod:`geoarray.manifolds.base`): ``random``, ``rgrad``, ``metric``, ``global_section``,
``global_rep``, ``retraction``, ``apply_section``, ``is_point``, ``is_tangent``.
"""

from .base import Manifold
from .euclidean import Euclidean
from .grassmann import Grassmann
from .horizontal import GrassmannHorizontal, HorizontalElement, StiefelHorizontal, SymplecticStiefelHorizontal
from .sections import (
    BlockReflectorSection,
    DenseSection,
    HouseholderSection,
    PackedHouseholderSection,
    SquareSection,
    SymplecticSection,
)
from .stiefel import Stiefel
from .symplectic_stiefel import SymplecticStiefel

__all__ = [
    "BlockReflectorSection",
    "DenseSection",
    "Euclidean",
    "Grassmann",
    "GrassmannHorizontal",
    "HorizontalElement",
    "HouseholderSection",
    "Manifold",
    "PackedHouseholderSection",
    "SquareSection",
    "Stiefel",
    "StiefelHorizontal",
    "SymplecticSection",
    "SymplecticStiefel",
    "SymplecticStiefelHorizontal",
]
