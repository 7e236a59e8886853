"""Architectures of the papers, each a layer-contract object (``init``, ``apply``, ``vjp``, ``manifolds``)
composed from the layers of :mod:`geoarray.nn`."""

from .classification import ClassificationTransformer

__all__ = ["ClassificationTransformer"]
