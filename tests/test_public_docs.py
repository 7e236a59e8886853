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


# geoarray.optim's module docstring before the fix: its example rendered as a paragraph of prose
_OLD_OPTIM_DOC = """Optimizers over parameter trees: Algorithm 1 of Brantner's paper as a wrapper around transforms.

    opt = geoarray.optim.Adam(lr=1e-3, beta1=0.9, beta2=0.99, delta=3e-7)
    state = opt.init(params, manifolds)          # manifolds: same tree, a Manifold or None per leaf
    params, state = opt.update(params, grads, state)

Underneath, the cache logic is a chain of vector-space transforms, and :func:`riemannian` performs
Algorithm 1 around them (rgrad → lift to g^hor → transform → retraction)::

    opt = geoarray.optim.riemannian(chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(1e-3)))
"""


def test_docstring_examples_render_as_code():
    """Every code example in a public docstring is a literal block (after a line ending in ``::`` or a
    code directive) or a doctest block, so the API pages show it as code, not as a paragraph."""
    problems = public_api.unrendered_examples(public_api.public_modules({}))
    assert not problems, "docstring examples rendered as prose:\n" + "\n".join(problems)


def test_the_check_finds_an_example_rendered_as_prose():
    """The check fails on geoarray.optim's docstring as it was, and passes once the block is opened by
    ``::``; formulas written as text, prose about code and doctest blocks are not flagged."""
    assert public_api.code_outside_literal_blocks(_OLD_OPTIM_DOC) == [
        "opt = geoarray.optim.Adam(lr=1e-3, beta1=0.9, beta2=0.99, delta=3e-7)"
    ]
    fixed = _OLD_OPTIM_DOC.replace("transforms.\n\n    opt", "transforms.\n\nIn use::\n\n    opt")
    assert public_api.code_outside_literal_blocks(fixed) == []
    directive = "Example.\n\n.. code-block:: python\n\n    import geoarray as ga\n    M = ga.Stiefel(5, 2)\n"
    assert public_api.code_outside_literal_blocks(directive) == []
    not_code = (
        "The update, with the bias correction folded into the cache:\n\n"
        "    W  = −η · B₁ / (√(B₂ + δ) + ε)\n    Y_new = polar(Y − lr·A*),\n\n"
        "A doctest block renders as code by itself:\n\n"
        ">>> import geoarray as ga\n>>> ga.Stiefel(5, 2)\nStiefel(5, 2)\n\n"
        'with d = d_in for ``side="input"`` and d = d_out for ``side="output"``:\n'
    )
    assert public_api.code_outside_literal_blocks(not_code) == []
    assert public_api.code_outside_literal_blocks("Summary.\n\n    import geoarray as ga\n    ga.Stiefel(5, 2)\n") == [
        "import geoarray as ga"
    ]
