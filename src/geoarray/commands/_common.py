"""Helpers shared by the subcommands: common options, backend selection, errors, JSON output."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

__all__ = [
    "BACKENDS",
    "CommandError",
    "add_common_train_options",
    "namespace_for",
    "positive_float",
    "positive_int",
    "write_json",
]

BACKENDS = ("numpy", "torch", "jax", "array-api-strict")


class CommandError(Exception):
    """An error the CLI reports as one line on stderr with exit code 2 (no traceback)."""


def positive_int(text: str) -> int:
    """argparse ``type=``: an int ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse ``type=``: an int ≥ 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse ``type=``: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_common_train_options(parser: argparse.ArgumentParser, *, epochs: int = 10, seed: int = 0) -> None:
    """``--backend``, ``--epochs``, ``--seed``, ``--out DIR`` and ``--no-progress``."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="numpy",
        help="array backend to run on (default: numpy; torch and jax use CPU float64)",
    )
    parser.add_argument("--epochs", type=positive_int, default=epochs, help=f"training epochs (default: {epochs})")
    parser.add_argument("--seed", type=nonnegative_int, default=seed, help=f"random seed (default: {seed})")
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="directory for metrics.json and the PNG plots (default: none written)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the tqdm progress bar")


def namespace_for(backend: str) -> Any:
    """The array namespace of a backend name, set up for float64 on the CPU.

    Raises :class:`CommandError` for an unknown name or a backend that is not installed.
    """
    if backend == "numpy":
        import array_api_compat.numpy as xp

        return xp
    if backend == "torch":
        try:
            import torch
        except ImportError:
            raise CommandError("backend 'torch' is not installed (pip install 'geoarray[torch]')") from None
        import array_api_compat.torch as xp

        # small matrices: intra-op threads cost more in wake-ups than they save
        torch.set_num_threads(1)
        return xp
    if backend == "jax":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        try:
            import jax
        except ImportError:
            raise CommandError("backend 'jax' is not installed (pip install 'geoarray[jax]')") from None
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as xp

        return xp
    if backend == "array-api-strict":
        try:
            import array_api_strict as xp
        except ImportError:
            raise CommandError("backend 'array-api-strict' is not installed (pip install array-api-strict)") from None
        return xp
    raise CommandError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def write_json(path: str | os.PathLike, obj: Any) -> str:
    """Write ``obj`` as indented JSON to ``path`` (parent directories created); returns the path."""
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")
    return path


def require(module: str, extra: str = "demo") -> Any:
    """Import an optional dependency or raise :class:`CommandError` naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise CommandError(f"{module.split('.')[0]} is not installed (pip install 'geoarray[{extra}]')") from None
