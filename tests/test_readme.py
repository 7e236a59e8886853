"""The README's tour runs and prints what it claims; its commands name files that exist."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _runs_here(block: str, backend) -> bool:
    """A block that starts with ``# runs in the <kind> session`` runs only there (host-framework sections)."""
    match = re.match(r"# runs in the (\w+) session", block)
    return match is None or match.group(1) == backend.kind


def test_readme_python_blocks_run_and_print_true(backend, xp):
    """The tour, with its ``xp = np`` line pointed at the backend under test, prints what it claims;
    the PyTorch and JAX sections run in their own sessions."""
    blocks = _python_blocks()
    assert blocks, "README has no python blocks"
    blocks = [b for b in blocks if _runs_here(b, backend)]
    assert sum(len(re.findall(r"^xp = np\b", b, flags=re.M)) for b in blocks) == 1, "the tour sets xp = np once"
    namespace = {"__name__": "readme", "_xp_under_test": xp}  # one session: later blocks use earlier names
    for block in blocks:
        block = re.sub(r"^xp = np\b.*$", "xp = _xp_under_test", block, flags=re.M)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(README), "exec"), namespace)
        printed = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
        claimed = [c.strip() for c in re.findall(r"^print\(.*\)\s*#\s*(.+)$", block, flags=re.M)]
        assert printed == claimed, f"README block prints {printed}, claims {claimed}"


def test_readme_commands_exist():
    text = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_command = re.search(r"^nox .*$", ci, flags=re.M).group(0)
    assert f"```bash\n{test_command}\n```" in text, ".ci/run must run the README's test command"
    for script in re.findall(r"python (examples/\S+\.py)", text):
        assert (README.parent / script).is_file(), script
