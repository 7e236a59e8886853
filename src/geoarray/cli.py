"""The ``geoarray`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geoarray",
        description=(
            "geoarray: structure-preserving machine learning on homogeneous spaces "
            "(Stiefel, Grassmann, symplectic Stiefel) on NumPy, CuPy, PyTorch and JAX."
        ),
    )
    parser.add_argument("--version", action="version", version=f"geoarray {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
