"""Loading ``examples/<name>.py`` in a test as ``python examples/<name>.py`` runs it: with ``examples/`` on
``sys.path``, so that its ``from _results import ...`` (the shared JSON/statistics helpers) resolves."""

from __future__ import annotations

import importlib.util
import os
import sys

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def load_example(name: str, module_name: str | None = None):
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    path = os.path.join(EXAMPLES, f"{name}.py")
    spec = importlib.util.spec_from_file_location(module_name or f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
