"""The ``geoarray`` command line (also ``python -m geoarray``).

    geoarray demo                      Stiefel vs unconstrained vision transformer on digits
    geoarray train vit|vpt|lst|sympnet the papers' experiments, each with --backend, --epochs, --seed, --out
    geoarray gauge table|check|fix     the gauge group of transformer stacks

Each command family lives in a module of :mod:`geoarray.commands` that registers its parsers here.
Errors (a wrong option, an unknown or missing backend, a missing data file) are one line on stderr
and exit code 2, never a traceback; warnings are one line too (``geoarray train vit: warning: ...``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``geoarray train vit: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        from .commands._common import one_line

        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``geoarray`` command line: ``demo``, ``train``, ``gauge`` and their options (``geoarray --help``)."""
    parser = _Parser(
        prog="geoarray",
        description=(
            "geoarray: structure-preserving machine learning on homogeneous spaces "
            "(Stiefel, Grassmann, symplectic Stiefel) on NumPy, CuPy, PyTorch and JAX."
        ),
        epilog="Start with `geoarray demo`. Every command has --help.",
    )
    parser.add_argument("--version", action="version", version=f"geoarray {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)

    vit = importlib.import_module("geoarray.commands.vit")
    vit.add_demo_parser(sub)

    train = sub.add_parser(
        "train",
        help="train one of the papers' models (vit, vpt, lst, sympnet)",
        description="Train one of the papers' models and write metrics JSON and loss plots.",
    )
    train_sub = train.add_subparsers(title="models", metavar="MODEL", parser_class=_Parser)
    train.set_defaults(func=lambda args: _missing_subcommand(train, train_sub))
    vit.add_train_parser(train_sub)
    importlib.import_module("geoarray.commands.dynamics").add_train_parsers(train_sub)
    importlib.import_module("geoarray.commands.gauge").add_parser(sub)
    return parser


def _missing_subcommand(parser: argparse.ArgumentParser, sub: Any) -> int:
    print(f"{parser.prog}: error: choose one of {', '.join(sub.choices)} (see {parser.prog} --help)", file=sys.stderr)
    return 2


def _one_line_warning(prog: str) -> Any:
    """A ``warnings.showwarning`` that writes ``prog: warning: message`` as one line: a user of the command
    line gets no source line of the library (a damaged checkpoint that ``--resume`` skips, a skipped step)."""
    from .commands._common import one_line

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        print(f"{prog}: warning: {one_line(' '.join(str(message).split()))}", file=sys.stderr)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 on success, 2 on a usage or input error, 1 on a
    file-system error), and reports an error in one line on stderr, never a traceback."""
    from .commands._common import CommandError, one_line

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and argparse errors
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    prog = getattr(args, "prog", "geoarray")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(prog)
            return int(func(args) or 0)
    except CommandError as exc:
        print(f"{prog}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as exc:
        # the library's input errors name the argument, the value and the fix: one line, as argparse's
        # (GEOARRAY_TRACEBACK=1 shows the traceback, for a bug report)
        if os.environ.get("GEOARRAY_TRACEBACK"):
            raise
        print(f"{prog}: error: {one_line(' '.join(str(exc).split()))}", file=sys.stderr)
        return 1 if isinstance(exc, OSError) else 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
