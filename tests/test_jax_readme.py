"""The README's JAX section runs as written and prints what it claims (jax session only)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from _jax_common import require_jax

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _jax_only(backend):
    require_jax(backend)


def _jax_section() -> tuple[Path, str]:
    """The "## JAX" section of README.md, or the fragment it is merged from while it is not there yet."""
    readme = ROOT / "README.md"
    match = re.search(r"^## JAX\b.*?(?=^## |\Z)", readme.read_text(encoding="utf-8"), flags=re.M | re.S)
    if match and "```python" in match.group(0):
        return readme, match.group(0)
    fragment = ROOT / "README_fragment_jax.md"
    return fragment, fragment.read_text(encoding="utf-8")


def test_readme_jax_section_runs_and_prints_true():
    pytest.importorskip("optax", reason="the README's JAX section uses optax (pip install optax)")
    path, text = _jax_section()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{path.name} has no python block in its JAX section"
    namespace: dict = {"__name__": "readme_jax"}
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(path), "exec"), namespace)
        printed = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
        claimed = [c.strip() for c in re.findall(r"^print\(.*\)\s*#\s*(.+)$", block, flags=re.M)]
        assert claimed and printed == claimed, f"{path.name} JAX block prints {printed}, claims {claimed}"
    for script in re.findall(r"python (examples/\S+\.py)", text):
        assert (ROOT / script).is_file(), script
