"""docs/table_widths.py: the rule that decides whether a measured table fits its column.

The measuring itself needs Qt's browser engine (PyQt6-WebEngine, ~550 MiB), which no session installs;
what is tested here is the verdict on measured geometry, and the script's answer to a missing build.
The rule is the same on every backend (no arrays), so it runs in each session.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "table_widths.py"


@pytest.fixture(scope="module")
def table_widths():
    spec = importlib.util.spec_from_file_location("table_widths", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(header="model", width=736.0, beyond=0.0, scrolls=0.0, visible=True):
    return {"header": header, "width": width, "beyond_column": beyond, "scrolls_by": scrolls, "visible": visible}


def _page(tables, scrolls=0.0, page="results.html", window=1280):
    return {"page": page, "window": window, "page_scrolls_by": scrolls, "tables": tables, "typeset": True}


def test_tables_inside_their_column_fit(table_widths):
    # within half a pixel of the column's edge is layout rounding, not a cut
    assert table_widths.misfits([_page([_table(), _table(beyond=0.4), _table(scrolls=0.5)])]) == []


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (_table(header="blocks", beyond=3.2), "results.html at 1280 px: table 'blocks' is 736 px wide, 3 px more"),
        (_table(header="ε form", width=990.0, scrolls=254.0), "table 'ε form' is 990 px wide, 254 px more"),
    ],
)
def test_a_table_beyond_its_column_or_scrolling_is_reported(table_widths, table, expected):
    lines = table_widths.misfits([_page([_table(header="fits"), table])])
    assert len(lines) == 1 and expected in lines[0], lines


def test_hidden_tables_are_ignored_and_a_sideways_page_is_reported(table_widths):
    # a table in a collapsed block has no width: nothing to see, nothing cut
    assert table_widths.misfits([_page([_table(width=0.0, beyond=50.0, visible=False)])]) == []
    lines = table_widths.misfits([_page([], scrolls=12.0, page="index.html", window=1600)])
    assert lines == ["index.html at 1600 px: the page scrolls sideways by 12 px"]


def test_a_page_that_did_not_load_is_reported(table_widths):
    lines = table_widths.misfits([{"page": "api/x.html", "window": 1280, "error": "did not load"}])
    assert lines == ["api/x.html at 1280 px: did not load"]


def test_a_missing_build_is_a_one_line_error(table_widths, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        table_widths.main(["--html", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--html {tmp_path}: no index.html there; build the docs first" in err
