"""Every install hint names the distribution that exists, ``geoarray-ml``, and an extra it defines.

PyPI's ``geoarray`` is an unrelated (geodata) package, so a hint ``pip install 'geoarray[demo]'`` installs
somebody else's code. Checked here: every ``pip install`` line of the package's sources and of the docs
(README.md, docs/**/*.md) that names geoarray with an extra; every ``install_hint(...)`` and
``require(..., extra=...)`` call of the sources; the messages users see when an optional dependency is
missing (``geoarray.torch``, ``geoarray.jax``, the CLI's backends and extras, the digits loader, the
safetensors reader).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from geoarray._install import DISTRIBUTION, EXTRAS, install_hint

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "src" / "geoarray").rglob("*.py"))
# the docs' own pages: not the build, nor the pages sphinx-gallery generates from the gallery scripts
_PAGES = (ROOT / "docs").rglob("*.md")
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in _PAGES if not {"_build", "auto_examples"} & set(p.relative_to(ROOT).parts)),
]
# a distribution named like geoarray (geoarray, geoarray-ml, geoarray_ml, ...) with extras in brackets
_NAMED = re.compile(r"(?<![\w.-])(geoarray[\w.-]*)\[([^\]]*)\]")


def _extras() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["name"] == DISTRIBUTION
    return set(pyproject["project"]["optional-dependencies"])


def test_the_helper_knows_the_extras_of_pyproject():
    assert set(EXTRAS) == _extras()


def _hints(paths: list[Path]) -> list[tuple[str, str, str]]:
    """``(where, distribution, extras)`` of every geoarray-like name with extras on a ``pip install`` line."""
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "pip install" in line:
                where = f"{path.relative_to(ROOT)}:{number}"
                found += [(where, name, extras) for name, extras in _NAMED.findall(line)]
    return found


@pytest.mark.parametrize("paths", [SOURCES, DOCS], ids=["sources", "docs"])
def test_pip_install_lines_name_geoarray_ml_and_a_defined_extra(paths):
    extras = _extras()
    for where, name, given in _hints(paths):
        assert name == DISTRIBUTION, f"{where}: installs {name!r}; the distribution is {DISTRIBUTION!r}"
        for extra in given.split(","):
            assert extra.strip() in extras, f"{where}: extra {extra.strip()!r} is not one of {sorted(extras)}"


def test_install_hints_come_from_one_place():
    """The sources write the command only in geoarray._install; elsewhere they call install_hint (or
    require, which does) with an extra that pyproject.toml defines."""
    extras = _extras()
    own = ROOT / "src" / "geoarray" / "_install.py"
    calls = 0
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        if path != own:
            assert not _hints([path]), f"{path.relative_to(ROOT)} spells out an install hint; call install_hint"
        for extra in re.findall(r"install_hint\(\s*['\"]([^'\"]*)['\"]", text) + re.findall(
            r"\brequire\([^)]*\bextra=['\"]([^'\"]*)['\"]", text
        ):
            assert extra in extras, f"{path.relative_to(ROOT)}: extra {extra!r} is not one of {sorted(extras)}"
            calls += 1
    assert calls >= 5, f"found {calls} install_hint/require calls with a literal extra; the scan lost them"


def test_install_hint_is_the_command():
    assert install_hint("demo") == "pip install 'geoarray-ml[demo]'"
    with pytest.raises(ValueError, match="extra 'bogus' is not one of torch, "):
        install_hint("bogus")


def _without(module: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which ``import <module>`` fails as it does where it is not
    installed (a finder ahead of all others answers ModuleNotFoundError; ``sys.modules[module] = None``
    would not do: code that asks ``module in sys.modules`` would take it for imported)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    prelude = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {module!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("name, title", [("torch", "PyTorch"), ("jax", "JAX")])
def test_host_framework_module_without_it_says_the_install_command(name, title):
    code = (
        "try:\n"
        f"    import geoarray.{name}\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.name, '|', exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    done = _without(name, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ModuleNotFoundError {name} | geoarray.{name} needs {title}: {install_hint(name)}"


def test_cli_messages_name_the_extra(monkeypatch):
    from geoarray.commands._common import CommandError, namespace_for, require

    with pytest.raises(CommandError) as info:
        require("geoarray_no_such_module", extra="gauge")
    assert str(info.value) == f"geoarray_no_such_module is not installed ({install_hint('gauge')})"
    for backend in ("torch", "jax"):
        monkeypatch.setitem(sys.modules, backend, None)
        with pytest.raises(CommandError) as info:
            namespace_for(backend)
        assert str(info.value) == f"backend {backend!r} is not installed ({install_hint(backend)})"


@pytest.mark.parametrize(
    "missing, call, extra",
    [
        ("sklearn", "geoarray.data.images.load_digits()", "demo"),
        ("safetensors", "geoarray.models.language.load_checkpoint('x.safetensors')", "gauge"),
    ],
)
def test_library_messages_name_the_extra(missing, call, extra):
    module = call.split("(")[0].rsplit(".", 1)[0]
    code = f"import {module}\ntry:\n    {call}\nexcept ImportError as exc:\n    print(exc)\n"
    done = _without(missing, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(install_hint(extra)), done.stdout
