"""Where the repository's examples are, for the gallery scripts (sphinx-gallery runs them from docs/gallery)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def repository_root() -> Path:
    here = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
    for folder in (here, *here.parents):
        if (folder / "examples").is_dir() and (folder / "pyproject.toml").is_file():
            return folder
    raise FileNotFoundError(f"no repository root (with examples/ and pyproject.toml) above {here}")


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module (the examples are scripts, not a package), with
    ``examples/`` on ``sys.path`` as when it runs as a script (its ``from _results import ...``)."""
    examples = str(repository_root() / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    path = repository_root() / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
