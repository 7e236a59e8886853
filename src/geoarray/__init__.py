"""geoarray: structure-preserving machine learning on homogeneous spaces.

Manifold operations, optimizer caches and layers are written once against the Python array API
standard and run unchanged on NumPy, CuPy, PyTorch and JAX. Importing geoarray never imports a
heavy backend: the namespace of the arrays you pass in decides where the work runs.

The public submodules are attributes of the package, imported on first use (PEP 562), so
``import geoarray as ga; ga.nn.Chain`` works while ``import geoarray`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import linalg, manifolds, optim, random
from ._backend import (
    array_namespace,
    as_namespace,
    backend_name,
    default_float,
    get_host_reads,
    get_section_form,
    resolve_dtype,
    set_host_reads,
    set_section_form,
    to_host,
)
from .manifolds import Euclidean, Grassmann, Stiefel, SymplecticStiefel

__version__ = "0.1.0.dev0"

# Submodules imported on first attribute access: they pull in heavier code (layers, models, host
# frameworks) that ``import geoarray`` must not pay for.
_LAZY_SUBMODULES = frozenset({"cli", "data", "gauge", "jax", "models", "nn", "torch", "train"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                raise AttributeError(f"module 'geoarray' has no attribute {name!r}") from None
            raise
        globals()[name] = module
        return module
    raise AttributeError(f"module 'geoarray' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES)


__all__ = [
    "Euclidean",
    "Grassmann",
    "Stiefel",
    "SymplecticStiefel",
    "__version__",
    "array_namespace",
    "as_namespace",
    "backend_name",
    "default_float",
    "get_host_reads",
    "get_section_form",
    "linalg",
    "manifolds",
    "optim",
    "random",
    "resolve_dtype",
    "set_host_reads",
    "set_section_form",
    "to_host",
]
