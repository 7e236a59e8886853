"""What every experiment script in ``examples/`` writes with its table: the commit that ran, the mean ±
sample standard deviation and range over seeds, the command that reproduces it, and the JSON file.

Imported as ``from _results import ...``: ``python examples/x.py`` puts ``examples/`` on ``sys.path``
(the tests load the examples the same way, ``tests/_examples.py``).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
from typing import Any

__all__ = ["command", "commit", "stats", "write_json"]


def commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout holding this file, with ``+dirty`` when tracked files differ
    from it (the code that ran is then not exactly that commit); None outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def stats(values: list[float | None]) -> dict | None:
    """Mean, sample standard deviation (n − 1; 0 for one value), count and range of the values that are
    not None, and ``non_finite``: how many were None (a run that diverged or ended in NaN has no number).
    None when no value is left, so that a table says "—" rather than a mean of nothing."""
    finite = [float(v) for v in values if v is not None]
    if not finite:
        return None
    return {
        "mean": statistics.mean(finite),
        "std": statistics.stdev(finite) if len(finite) > 1 else 0.0,
        "n": len(finite),
        "min": min(finite),
        "max": max(finite),
        "non_finite": len(values) - len(finite),
    }


def command(script: str, argv: list[str] | None) -> str:
    """The shell command that reruns ``examples/<script>`` with ``argv`` (``sys.argv[1:]`` when None)."""
    return f"python examples/{script} " + shlex.join(sys.argv[1:] if argv is None else argv)


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` (its folder made if needed) through a temporary file, so that an
    interrupted run never leaves half a JSON where the last complete one was."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1)
    os.replace(path + ".tmp", path)
