"""geoarray: structure-preserving machine learning on homogeneous spaces.

Manifold operations, optimizer caches and layers are written once against the Python array API
standard and run unchanged on NumPy, CuPy, PyTorch and JAX. Importing geoarray never imports a
heavy backend: the namespace of the arrays you pass in decides where the work runs.
"""

from . import linalg, random
from ._backend import array_namespace, default_float, resolve_dtype

__version__ = "0.1.0.dev0"

__all__ = ["__version__", "array_namespace", "default_float", "linalg", "random", "resolve_dtype"]
