"""Release metadata: one version, a changelog entry for it, the distribution name, typed, extras that exist.

Building and installing the wheel is ``nox -s package`` (python -m build, twine check, a fresh venv,
``geoarray --help`` and tests/wheel_smoke.py from outside the source tree); this test keeps the cheap
invariants in every session.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import geoarray

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_version_is_single_sourced_pep440():
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"], "the version lives in __init__.py only"
    assert _pyproject()["tool"]["hatch"]["version"]["path"] == "src/geoarray/__init__.py"
    pep440 = r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?"
    assert re.fullmatch(pep440, geoarray.__version__), geoarray.__version__


def test_changelog_has_an_entry_for_this_version():
    release = re.sub(r"\.dev\d+$", "", geoarray.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[?{re.escape(release)}\]?", changelog, flags=re.M), f"CHANGELOG.md: no '## {release}'"


def test_distribution_name_and_readme_install_line():
    name = _pyproject()["project"]["name"]
    assert name == "geoarray-ml", "'geoarray' on PyPI is an unrelated project; keep the checked free name"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"pip install {name}" in readme, f"the README's install line must name {name}"


def test_package_is_typed_and_licensed():
    assert (ROOT / "src" / "geoarray" / "py.typed").is_file()
    assert (ROOT / "LICENSE").is_file() and _pyproject()["project"]["license"] == "MIT"


def test_readme_extras_exist():
    extras = set(_pyproject()["project"]["optional-dependencies"])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\.\[([a-z,]+)\]", readme))
    for group in named:
        for extra in group.split(","):
            assert extra in extras, f"README names the extra [{extra}], pyproject.toml has {sorted(extras)}"
    assert "optax" in " ".join(_pyproject()["project"]["optional-dependencies"]["jax"]), (
        "README's JAX code imports optax"
    )


RELEASE_URLS = {"Homepage", "Documentation", "Source", "Changelog"}


def _missing_urls(version: str, project: dict) -> list[str]:
    """The project URLs a release lacks; none are required of a development version (``.devN``), which may
    not have a public address yet (CHANGELOG.md, version scheme)."""
    if ".dev" in version:
        return []
    return sorted(RELEASE_URLS - set(project.get("urls", {})))


def test_a_release_version_has_project_urls():
    missing = _missing_urls(geoarray.__version__, _pyproject()["project"])
    assert not missing, f"pyproject.toml [project.urls] lacks {missing} for release {geoarray.__version__}"


def test_the_url_check_fails_for_a_release_without_urls():
    project = {k: v for k, v in _pyproject()["project"].items() if k != "urls"}
    assert _missing_urls("0.1.0", project) == sorted(RELEASE_URLS)
    assert _missing_urls("0.1.0.dev0", project) == []
    assert _missing_urls("0.1.0", {"urls": dict.fromkeys(RELEASE_URLS, "https://example.org")}) == []
