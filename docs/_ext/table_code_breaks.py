"""Break points inside the code of table cells, so that a table fits the content column.

docs/_static/tables.css lets a cell's text wrap at any point, so that no table is wider than the column;
a code literal there wraps only between words (a class name like ``SymplecticStiefel`` stays whole). A long
path or command (``benchmarks/transformer_step.py``, ``opt.state_dict()["state"]``) would then be one word
wider than its column: this transform puts an HTML ``<wbr>`` (a break opportunity that copying leaves out)
after each ``/ . _ , ( [ =`` in the code literals of tables, so such a literal breaks at its punctuation
instead. Measured by docs/table_widths.py.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

AFTER = re.compile(r"(?<=[/._,(\[=])(?=.)")


def _break_points(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    if app.builder.format != "html":
        return
    for table in doctree.findall(nodes.table):
        for literal in list(table.findall(nodes.literal)):
            if len(literal.children) != 1 or not isinstance(literal.children[0], nodes.Text):
                continue
            pieces = AFTER.split(literal.astext())
            if len(pieces) == 1:
                continue
            children: list[nodes.Node] = []
            for i, piece in enumerate(pieces):
                if i:
                    children.append(nodes.raw("", "<wbr>", format="html"))
                children.append(nodes.Text(piece))
            literal.children = []
            literal.extend(children)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("doctree-resolved", _break_points)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
