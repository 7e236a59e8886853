"""The install command of an optional dependency: every message of the package that names one comes from here.

The distribution is ``geoarray-ml``; the import name is ``geoarray``, and PyPI's ``geoarray`` is an
unrelated (geodata) package: a hint naming the import name would install somebody else's code.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "EXTRAS", "install_hint"]

DISTRIBUTION = "geoarray-ml"
#: the extras of pyproject.toml's [project.optional-dependencies] (tests/test_install_hints.py keeps them equal)
EXTRAS = ("torch", "jax", "cupy", "scipy", "demo", "gauge", "test", "dev", "docs", "bench", "hf")


def install_hint(extra: str) -> str:
    """The command that installs the optional dependencies of ``extra`` (for ``"demo"``:
    ``pip install 'geoarray-ml[demo]'``); an extra the distribution does not define raises ``ValueError``."""
    if extra not in EXTRAS:
        raise ValueError(f"install_hint: extra {extra!r} is not one of {', '.join(EXTRAS)}")
    return f"pip install '{DISTRIBUTION}[{extra}]'"
