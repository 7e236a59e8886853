"""The README's quick starts and the documentation pages' code run and print what they claim; their
commands name files that exist.

Every ```python block of README.md and of the Markdown pages under docs/ is executed, one namespace per
file (later blocks use earlier names). A block whose first line is ``# runs in the <kind> session`` runs
only in that backend session (the PyTorch, JAX and NumPy-only sections); the others run in every session
with the ``np`` of their ``xp = ...np...`` line pointed at the backend under test. A block's
``print(...)  # claim`` lines are what it must print. The FSDP2 example (``# runs in the fsdp session``)
runs on two ranks in tests/test_torch_fsdp.py.

Where an ``xp`` line offers a choice (``# or torch, jax.numpy, cupy, array_api_strict``) — the README's
quick start, the docs index's example, the getting-started tour — its blocks also run with ``np``
replaced by each module offered, as a reader would edit it, for every one importable in the session
(jax.numpy with x64 enabled, as the pages say; cupy only on a GPU).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# README first; then every docs page with code (the docs build includes README's quick starts itself)
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def _runs_here(block: str, backend) -> bool:
    """A block that starts with ``# runs in the <kind> session`` runs only there (host-framework sections)."""
    match = re.match(r"# runs in the (\w+) session", block)
    return match is None or match.group(1) == backend.kind


# the line that sets the namespace: ``xp = np`` or ``xp = ga.as_namespace(np)``, with an optional comment
_XP_LINE = re.compile(r"^xp = ([^#\n]*?)\bnp\b([^#\n]*)(#[^\n]*)?$", flags=re.M)


def _xp_lines(blocks: list[str]) -> int:
    return sum(len(_XP_LINE.findall(b)) for b in blocks)


def _run_blocks(path: Path, blocks: list[str], xp) -> None:
    namespace = {"__name__": "readme", "_xp_under_test": xp}  # one file: later blocks use earlier names
    for block in blocks:
        block = _XP_LINE.sub(r"xp = \1_xp_under_test\2", block)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(path), "exec"), namespace)
        printed = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
        claimed = [c.strip() for c in re.findall(r"^print\(.*\)\s*#\s*(.+)$", block, flags=re.M)]
        assert printed == claimed, f"{path.name}: a block prints {printed}, claims {claimed}"


def test_readme_python_blocks_run_and_print_true(backend, xp):
    """The quick starts, the array-API one with its ``xp = np`` line pointed at the backend under test,
    print what they claim; the PyTorch and JAX ones run in their own sessions."""
    blocks = [b for b in _python_blocks(README) if _runs_here(b, backend)]
    assert blocks, "README has no python blocks for this session"
    assert _xp_lines(blocks) == 1, "the quick start sets xp from np once"
    _run_blocks(README, blocks, xp)


def _offered(comment: str) -> list[str]:
    """The modules an ``xp`` line's comment offers (``# or torch, jax.numpy (with x64), ...``), numpy first."""
    offered = re.fullmatch(r"#\s*or (.+)", comment.strip())
    assert offered, f"the xp line's comment {comment!r} does not read '# or <module>, <module>, ...'"
    return ["numpy", *(re.match(r"[\w.]+", c.strip()).group(0) for c in offered.group(1).split(","))]


def _choice_block() -> tuple[str, list[str]]:
    """The README block whose ``xp`` line offers a choice of namespaces, and the modules offered."""
    found = [(b, m.group(3)) for b in _python_blocks(README) for m in _XP_LINE.finditer(b) if m.group(3)]
    assert len(found) == 1, "README offers a choice of xp in one block"
    block, comment = found[0]
    return block, _offered(comment)


HOST_READS_DEFAULT = "cpu"  # geoarray.get_host_reads() in a fresh process (a reader's setting)


def _offered_module(name: str, backend, host_reads_policy):
    """The module a reader puts in place of ``np``, with the library's default host reads policy (a
    reader's); a skip when the session cannot run it, and in every session but its library's own: the
    code is the same in each, so ``nox -t cpu`` runs it once per module (numpy in the numpy session,
    array_api_strict in the array-api-strict one, jax.numpy and torch in theirs), not once per session."""
    library = name.split(".")[0]
    if library != backend.kind:
        pytest.skip(f"xp = {name} runs in the {library} session (the same code in every session)")
    host_reads_policy(HOST_READS_DEFAULT)
    if name == "cupy":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no device")
        except Exception as exc:  # ImportError, CUDARuntimeError
            pytest.skip(f"cupy: no usable CUDA GPU ({type(exc).__name__})")
        return cupy
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name.split('.')[0]} is not installed in this session")


@contextlib.contextmanager
def _x64_for(choice: str):
    """jax.numpy as the pages ask for it, with x64 enabled; the session's setting is restored."""
    if not choice.startswith("jax"):
        yield
        return
    import jax

    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", x64)


@pytest.mark.parametrize("choice", _choice_block()[1])
def test_readme_choice_of_xp_runs_with_every_module_offered(choice, backend, host_reads_policy):
    """The any-array-library quick start, with ``np`` in its ``xp`` line replaced by each module its
    comment offers (the raw module, as a reader types it), prints what it claims."""
    block, _ = _choice_block()
    module = _offered_module(choice, backend, host_reads_policy)
    with _x64_for(choice):
        _run_blocks(README, [block], module)


def _generic_blocks(page: Path) -> list[str]:
    """A page's blocks that are not marked for one session (those run on every backend)."""
    return [b for b in _python_blocks(page) if not re.match(r"# runs in the \w+ session", b)]


def _docs_choices() -> list:
    """``(page, module)`` for each module offered by an ``xp`` line of a docs page (index, tour, ...)."""
    cases = []
    for page in DOCUMENTS[1:]:
        comments = [m.group(3) for b in _generic_blocks(page) for m in _XP_LINE.finditer(b) if m.group(3)]
        assert len(comments) <= 1, f"{page.name} sets xp with a choice twice"
        cases += [pytest.param(page, name, id=f"{page.name}-{name}") for c in comments for name in _offered(c)]
    return cases


@pytest.mark.parametrize(("page", "choice"), _docs_choices())
def test_docs_choice_of_xp_runs_with_every_module_offered(page, choice, backend, host_reads_policy):
    """A docs page whose ``xp = ...np...`` line offers a choice (the index page's dozen lines, the
    getting-started tour) prints what it claims with each module offered in place of ``np``, the raw
    module as a reader types it: ``xp = torch`` with ``torch.sort`` returning a tuple included."""
    module = _offered_module(choice, backend, host_reads_policy)
    with _x64_for(choice):
        _run_blocks(page, _generic_blocks(page), module)


def test_docs_index_has_the_install_lines_and_a_short_example():
    """The site's front page: how to install (from a clone, and the distribution's name) and a dozen lines
    of code after the imports (the example itself runs in the tests above)."""
    index = ROOT / "docs" / "index.md"
    bash = "\n".join(re.findall(r"```bash\n(.*?)```", index.read_text(encoding="utf-8"), flags=re.S))
    assert 'pip install -e ".[demo]"' in bash and "pip install geoarray-ml " in bash, bash
    block = _python_blocks(index)[0]
    code = [line for line in block.splitlines() if line.strip() and not re.match(r"(import|from) ", line)]
    assert len(code) <= 12, f"the index page's example has {len(code)} lines after its imports"
    assert _offered(_XP_LINE.search(block).group(3))[1:], "the index page's example offers no other namespace"


@pytest.mark.parametrize("page", [p for p in DOCUMENTS[1:] if _python_blocks(p)], ids=lambda p: p.name)
def test_docs_python_blocks_run_and_print_what_they_claim(page, backend, xp):
    blocks = [b for b in _python_blocks(page) if _runs_here(b, backend)]
    if not blocks:
        pytest.skip(f"{page.name}: no block runs in the {backend.kind} session")
    # a page that uses the tour's namespace sets it once (then that line is pointed at the backend)
    assert _xp_lines(blocks) <= 1, f"{page.name} sets xp twice"
    _run_blocks(page, blocks, xp)


def test_every_python_block_runs_somewhere():
    """A block is marked for a session that exists (a typo would silently never run it)."""
    kinds = {"numpy", "array_api_strict", "torch", "jax", "cupy", "fsdp"}
    for path in DOCUMENTS:
        for block in _python_blocks(path):
            match = re.match(r"# runs in the (\S+) session", block)
            assert match is None or match.group(1) in kinds, f"{path.name}: unknown session {match.group(1)!r}"


def test_readme_commands_exist():
    text = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    test_command = re.search(r"^nox .*$", ci, flags=re.M).group(0)
    assert f"```bash\n{test_command}\n```" in text, ".ci/run must run the README's test command"
    for path in DOCUMENTS:
        for script in re.findall(r"python (examples/\S+\.py|benchmarks/\S+\.py)", path.read_text(encoding="utf-8")):
            assert (ROOT / script).is_file(), f"{path.name} names {script}, which does not exist"


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub (and MyST's heading_anchors) give a Markdown file: lower case, spaces to
    hyphens, punctuation dropped."""
    headings = re.findall(r"^#{1,6} +(.+)$", path.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_readme_links_resolve():
    """Every relative link of the README names a file of the repository, and a #section of a Markdown
    file names one of its headings (the Results list points into the docs pages)."""
    text = README.read_text(encoding="utf-8")
    for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]*))?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
        if anchor and target.endswith(".md"):
            assert anchor in _anchors(ROOT / target), f"README links to {target}#{anchor}: no such heading"
