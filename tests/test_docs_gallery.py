"""The gallery's pages are tutorials of the library: each one runs on its own and calls geoarray itself.

Every ``docs/gallery/plot_*.py`` parses; imports nothing from ``examples/`` nor a helper of the gallery
(a downloaded page must run with only geoarray and its extras installed); calls geoarray's API in its own
code; and runs to the end at its smoke size (``GEOARRAY_GALLERY_SMOKE=1``), as a script in a fresh
interpreter from a directory outside the repository — the NumPy pages in the numpy session, the PyTorch
page in the torch session, the JAX page in the jax session.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GALLERY = ROOT / "docs" / "gallery"
PAGES = sorted(GALLERY.glob("plot_*.py"))
# the session a page runs in, by the host framework it imports (none: the numpy session)
FRAMEWORKS = {"torch": "torch", "jax": "jax", "optax": "jax"}
# what a page may import: geoarray, its declared dependencies and extras, and the standard library
ALLOWED = {"geoarray", "numpy", "matplotlib", "sklearn", "torch", "jax", "optax", "optree"}


def _tree(page: Path) -> ast.Module:
    return ast.parse(page.read_text(encoding="utf-8"), filename=str(page))


def _imports(tree: ast.Module) -> set[str]:
    """Top-level names of every module the page imports (``from . import x`` gives '')."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("" if node.level else (node.module or "").split(".")[0])
    return names


def _geoarray_aliases(tree: ast.Module) -> set[str]:
    """The names the page binds to geoarray or to something imported from it."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "geoarray")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "geoarray":
            aliases.update(a.asname or a.name for a in node.names)
    return aliases


def _geoarray_calls(tree: ast.Module) -> list[str]:
    """Source of every call whose function is a geoarray name or an attribute chain starting at one."""
    aliases = _geoarray_aliases(tree)
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            root = node.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                calls.append(ast.unparse(node.func))
    return calls


def _session(page: Path) -> str:
    kinds = {FRAMEWORKS[name] for name in _imports(_tree(page)) if name in FRAMEWORKS}
    assert len(kinds) <= 1, f"{page.name} imports both torch and jax"
    return kinds.pop() if kinds else "numpy"


def test_there_are_pages():
    assert {_session(p) for p in PAGES} == {"numpy", "torch", "jax"}, [p.name for p in PAGES]
    assert not (GALLERY / "_paths.py").exists(), "the gallery's pages share no helper module"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_is_a_tutorial_of_the_library(page):
    tree = _tree(page)
    doc = ast.get_docstring(tree)
    assert doc and doc.splitlines()[1].startswith("==="), f"{page.name}: no sphinx-gallery title docstring"
    imported = _imports(tree)
    stdlib = set(sys.stdlib_module_names)
    foreign = sorted(imported - ALLOWED - stdlib)
    assert not foreign, f"{page.name} imports {foreign}: not geoarray, its extras or the standard library"
    code = ast.unparse(ast.Module(body=tree.body[1:], type_ignores=[]))  # the code: no docstring, no comments
    for hidden in ("examples", "_paths", "load_example", "runpy", "subprocess", "geoarray.cli", "sys.path"):
        assert hidden not in code, f"{page.name} hides the API behind {hidden!r}"
    source = page.read_text(encoding="utf-8")
    calls = _geoarray_calls(tree)
    assert len(calls) >= 3, f"{page.name} calls geoarray's API {len(calls)} times in its own code: {calls}"
    assert "# %%" in source, f"{page.name} has no text cell"


def test_the_check_finds_a_page_that_runs_a_script():
    """The old gallery's pattern — a page that runs an example script through a helper — fails."""
    old = (
        '"""\nViT\n===\n\nRuns the script.\n"""\n\nfrom _paths import load_example\n\n'
        'table = load_example("vit_digits").main(["--seeds", "2"])\n'
    )
    tree = ast.parse(old)
    assert "_paths" in _imports(tree) and not _geoarray_calls(tree)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_runs_on_its_own_at_the_smoke_size(page, backend, tmp_path):
    session = _session(page)
    if backend.kind != session:
        pytest.skip(f"{page.name} runs in the {session} session")
    missing = [m for m in sorted(_imports(_tree(page)) & ALLOWED) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{page.name} needs {missing}, not installed here")
    env = {
        **os.environ,
        "GEOARRAY_GALLERY_SMOKE": "1",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
    }
    # a fresh interpreter in an empty directory: nothing of the repository but geoarray on the path
    done = subprocess.run(
        [sys.executable, str(page)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{page.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
