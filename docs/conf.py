"""Sphinx configuration of the geoarray documentation: ``nox -s docs`` (or ``sphinx-build -W -b html docs
docs/_build/html`` in an environment with ``.[docs]``) builds it; warnings are errors.

Formulas are typeset by MathJax 3 served from ``_static/mathjax`` — a copy of the files that the
``sphinx-mathjax-offline`` package ships — so the pages render on a machine without network access.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent / "src"))  # the source tree, also when geoarray is not installed

import geoarray  # noqa: E402

project = "geoarray"
author = "The geoarray developers"
copyright = "2026, The geoarray developers"
release = geoarray.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
    "public_api",  # docs/_ext: one page per public module; fails the build on an undocumented public name
    "table_code_breaks",  # docs/_ext: code in table cells breaks at its punctuation, so tables fit the column
]
# viewcode: the highlighted source pages behind every [source] link, 75 more pages, each with furo's navigation
# (~10 s of a 40 s build). It logs no warning of its own, so the check that -W makes of the build loses
# nothing without them: GEOARRAY_DOCS_SOURCE=0 (nox -s docs-fast, CI's check, whose HTML is discarded).
if os.environ.get("GEOARRAY_DOCS_SOURCE", "1") != "0":
    extensions.append("sphinx.ext.viewcode")
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# geoarray._typing.Array is Any to a type checker; the pages name it (api/index.md says what it is)
autodoc_type_aliases = {"Array": "Array"}
autosummary_generate = False  # the API pages are written by public_api, not by autosummary
autodoc_mock_imports: list[str] = []
# Every cross-reference must resolve (warnings are errors). References to geoarray's own objects resolve to
# their API pages (public_api links an implementation module or object to the page of the public module
# that contains it; `Array` to its description on api/index). What cannot resolve is ignored here, by
# group and with the reason:
nitpicky = True
nitpick_ignore_regex = [
    # The standard library, NumPy, PyTorch and JAX have no inventory here: intersphinx downloads objects.inv
    # at build time, and the machines that build these docs have no network. Their types stay plain text.
    ("py:.*", r"(collections\.abc|abc|os|argparse|typing|types|pathlib|numbers|enum|datetime)\..*"),
    ("py:.*", r"(numpy|torch|jax|jaxlib|optax|flax|equinox|array_api_strict|cupy)(\..*)?"),
    # Private helpers and base classes (a component starting with "_"), shown by show-inheritance or named
    # by a docstring: not part of the API pages by design; the public class documents the inherited members.
    ("py:.*", r"(.*\.)?_\w+(\..*)?"),
    # GaugeFixedLM.fixed is an instance attribute assigned in __init__: autodoc makes no target for it
    ("py:attr", r"fixed"),
]

# The gallery: docs/gallery/plot_*.py, tutorials that each run on their own with geoarray installed
# (the torch and JAX pages need those; the docs session installs both), run at small sizes during the
# build (their output is cached in docs/auto_examples and rerun only when a script changes);
# GEOARRAY_DOCS_GALLERY=0 is the fast mode that writes the pages without running them.
os.environ.setdefault("MPLBACKEND", "agg")
sphinx_gallery_conf = {
    "examples_dirs": "gallery",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",  # plot_01_... the papers' order, then the framework scripts
    "plot_gallery": os.environ.get("GEOARRAY_DOCS_GALLERY", "1") != "0",
    "abort_on_example_error": True,
    "download_all_examples": False,
    "min_reported_time": 1,
    "image_scrapers": ("matplotlib",),
    "reset_modules": ("matplotlib",),
}

html_theme = "furo"
html_title = f"geoarray {release}"
html_static_path = ["_static"]
html_css_files = ["tables.css"]  # wide tables wrap their cells or scroll, never cut

# MathJax without network: the package's files are copied into _static/mathjax (what the pages load)
_MATHJAX_PARTS = ("tex-chtml.js", "input", "output/chtml", "output/chtml.js", "ui", "a11y", "adaptors")


def _copy_mathjax() -> None:
    dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    source = Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))
    if not (source / "tex-chtml.js").is_file():
        raise RuntimeError(f"sphinx-mathjax-offline has no tex-chtml.js under {source}: reinstall it")
    target = HERE / "_static" / "mathjax"
    if (target / "tex-chtml.js").is_file():
        return
    for part in _MATHJAX_PARTS:
        src = source / part
        dst = target / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, dst)


_copy_mathjax()
mathjax_path = "mathjax/tex-chtml.js"
