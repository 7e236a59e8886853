"""Loading ``examples/<name>.py`` in a test as ``python examples/<name>.py`` runs it: with ``examples/`` on
``sys.path``, so that its ``from _results import ...`` (the shared JSON/statistics helpers) resolves; and
``benchmarks/<name>.py`` (each puts its own folder on ``sys.path`` for ``_timing`` and ``_sets``)."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def load_example(name: str, module_name: str | None = None):
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    path = os.path.join(EXAMPLES, f"{name}.py")
    spec = importlib.util.spec_from_file_location(module_name or f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (its ``main(argv)`` runs it in the test's process)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
