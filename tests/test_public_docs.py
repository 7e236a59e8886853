"""Every public name has documentation: the check that fails the docs build, run in every test session.

The public API is what the ``__all__`` lists reachable from ``geoarray`` name (docs/_ext/public_api.py,
which also writes the API pages). A class or function there without its own docstring, a constant without
a ``#:`` doc-comment, or a public module without a docstring or ``__all__`` fails this test, so a broken
API page is caught by ``nox -t cpu`` without building the site (``nox -s docs`` builds it).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "_ext"))
import public_api


def test_every_public_name_is_documented():
    missing: dict[str, str] = {}
    modules = public_api.public_modules(missing)
    assert "geoarray.optim" in modules and "geoarray.nn" in modules, modules
    problems = public_api.undocumented(modules)
    assert not problems, "undocumented public names:\n" + "\n".join(problems)
    if missing:  # the rest was checked; say what this session could not import
        pytest.skip(f"checked {len(modules)} public modules; not importable here: {missing}")


def test_the_check_finds_an_undocumented_name(monkeypatch):
    """The check can fail: a public function that loses its docstring is reported by name."""
    import geoarray.linalg

    monkeypatch.setattr(geoarray.linalg.skew, "__doc__", None)
    problems = public_api.undocumented(["geoarray.linalg"])
    assert problems == ["geoarray.linalg.skew: the function has no docstring"], problems


def test_api_pages_cover_every_public_name():
    """One page per public module, naming every entry of its __all__ (described or linked)."""
    modules = public_api.public_modules({})
    for module_name in modules:
        page = public_api.render(module_name, modules)
        for name in importlib.import_module(module_name).__all__:
            assert name in page, f"{module_name}.{name} is missing from its API page"


def test_docstring_references_resolve():
    """Every :func:/:class:/:meth: reference in a public docstring names an existing object, resolved as
    Sphinx resolves it (absolute, then relative to the class and module)."""
    problems = public_api.broken_references(public_api.public_modules({}))
    assert not problems, "broken references in docstrings:\n" + "\n".join(problems)


def test_the_check_finds_a_broken_reference(monkeypatch):
    """The check can fail: a reference to a renamed function is reported with where it is."""
    import geoarray.linalg

    doc = geoarray.linalg.skew.__doc__ + "\n\nSee :func:`geoarray.linalg.skew_symmetric_part`."
    monkeypatch.setattr(geoarray.linalg.skew, "__doc__", doc)
    problems = public_api.broken_references(["geoarray.linalg"])
    assert problems == ["geoarray.linalg.skew: :func:`geoarray.linalg.skew_symmetric_part` names nothing"], problems
