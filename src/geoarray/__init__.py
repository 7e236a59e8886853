"""geoarray: structure-preserving machine learning on homogeneous spaces.

Manifold operations, optimizer caches and layers are written once against the Python array API
standard and run unchanged on NumPy, CuPy, PyTorch and JAX. Importing geoarray never imports a
heavy backend: the namespace of the arrays you pass in decides where the work runs.
"""

from . import linalg, manifolds, optim, random
from ._backend import array_namespace, default_float, resolve_dtype
from .manifolds import Euclidean, Grassmann, Stiefel, SymplecticStiefel

__version__ = "0.1.0.dev0"

__all__ = [
    "Euclidean",
    "Grassmann",
    "Stiefel",
    "SymplecticStiefel",
    "__version__",
    "array_namespace",
    "default_float",
    "linalg",
    "manifolds",
    "optim",
    "random",
    "resolve_dtype",
]
