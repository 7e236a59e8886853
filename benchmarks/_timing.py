"""Small timing helpers shared by the benchmark scripts (not part of the library)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from geoarray import as_namespace, backend_name


def load_namespace(name: str) -> Any:
    """The array namespace for a backend name (numpy, torch, jax, array-api-strict, cupy)."""
    if name == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
    module = {"array-api-strict": "array_api_strict", "jax": "jax.numpy"}.get(name, name)
    return as_namespace(importlib.import_module(module))


def block(x: Any) -> Any:
    """Wait for asynchronous backends (JAX dispatch, CUDA streams) to finish computing ``x``."""
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    elif backend_name(type(x).__module__ and __import__("array_api_compat").array_namespace(x)) == "torch":
        import torch

        if x.is_cuda:
            torch.cuda.synchronize()
    return x


def best_time(fn: Callable[[], Any], *, repeat: int = 5, number: int | None = None, budget: float = 0.5) -> float:
    """Best-of-``repeat`` seconds per call; ``number`` calls per repeat chosen to fill ``budget`` seconds."""
    out = fn()  # warm-up (JIT compilation, caches)
    block_leaves(out)
    if number is None:
        start = time.perf_counter()
        block_leaves(fn())
        once = max(time.perf_counter() - start, 1e-7)
        number = max(1, int(budget / repeat / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        block_leaves(out)
        best = min(best, (time.perf_counter() - start) / number)
    return best


def block_leaves(tree: Any) -> None:
    import optree

    for leaf in optree.tree_leaves(tree):
        if hasattr(leaf, "shape"):
            block(leaf)
