"""Helpers shared by the subcommands: common options, backend selection, errors, JSON output."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = [
    "BACKENDS",
    "CommandError",
    "add_common_train_options",
    "checkpoint_options",
    "namespace_for",
    "one_line",
    "positive_float",
    "positive_int",
    "write_json",
]

BACKENDS = ("numpy", "torch", "jax", "array-api-strict")


def one_line(text: str) -> str:
    """``text`` as one line: a line break or another control character (which an argument echoed in an
    error may carry, e.g. ``$'\\r'``) is written as its escape, so an error stays one line on stderr."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(text))


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
        help="directory for metrics.json, the PNG plots and checkpoints/ (default: none written)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the tqdm progress bar")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run whose checkpoints are in DIR/checkpoints (--out DIR), bit-identically; "
        "without it a run with --out starts over and replaces them",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=None,
        metavar="STEPS",
        help="with --out: commit a checkpoint every STEPS optimizer steps (default: at the end of every epoch)",
    )
    parser.add_argument(
        "--checkpoint-every-seconds",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="with --out: commit a checkpoint after the first step that ends SECONDS after the last one "
        "(with --checkpoint-every: whichever comes first)",
    )


def checkpoint_options(args: argparse.Namespace) -> dict:
    """The checkpoint keywords of :func:`geoarray.train.fit` for ``--out``, ``--resume``,
    ``--checkpoint-every`` and ``--checkpoint-every-seconds`` (none for a parser without them):
    checkpoints go to ``OUT/checkpoints``.

    Without ``--resume`` earlier checkpoints there are removed (the run starts over, as metrics.json is
    rewritten); with it, a run of another ``--seed`` or ``--batch-size`` is refused here in one line.
    """
    if not hasattr(args, "resume"):
        return {}
    if args.out is None:
        given = [
            flag
            for flag, on in (
                ("--resume", args.resume),
                ("--checkpoint-every", args.checkpoint_every is not None),
                ("--checkpoint-every-seconds", args.checkpoint_every_seconds is not None),
            )
            if on
        ]
        if given:
            raise CommandError(f"{given[0]} needs --out DIR (the checkpoints are kept in DIR/checkpoints)")
        return {}
    import shutil

    from ..train import latest_checkpoint

    path = os.path.join(args.out, "checkpoints")
    newest = latest_checkpoint(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise CommandError(f"{path!r} is a file; remove it or choose another --out")
    if newest is not None and not args.resume:
        shutil.rmtree(path)
    elif newest is not None:
        from .._io import read_json

        try:
            meta = read_json(os.path.join(newest, "meta.json"), what="checkpoint meta.json")
        except (OSError, ValueError):
            meta = {}  # damaged: fit skips it and resumes from the newest intact one
        for key in ("seed", "batch_size"):
            if isinstance(meta, dict) and key in meta and getattr(args, key, meta[key]) != meta[key]:
                flag = "--" + key.replace("_", "-")
                raise CommandError(
                    f"--resume: the run in {path!r} used {flag} {meta[key]}, not {getattr(args, key)}; "
                    f"give {flag} {meta[key]} to continue it"
                )
    return {
        "checkpoint_path": path,
        "checkpoint_every": args.checkpoint_every,
        "checkpoint_every_seconds": args.checkpoint_every_seconds,
        "resume": bool(args.resume),
    }


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
        import array_api_compat.torch as torch_xp

        # small matrices: intra-op threads cost more in wake-ups than they save
        torch.set_num_threads(1)
        return torch_xp
    if backend == "jax":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        try:
            import jax
        except ImportError:
            raise CommandError("backend 'jax' is not installed (pip install 'geoarray[jax]')") from None
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        return jnp
    if backend == "array-api-strict":
        try:
            import array_api_strict
        except ImportError:
            raise CommandError("backend 'array-api-strict' is not installed (pip install array-api-strict)") from None
        return array_api_strict
    raise CommandError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def write_json(path: str | os.PathLike, obj: Any) -> str:
    """Write ``obj`` as indented JSON to ``path`` (parent directories created, replaced atomically:
    :func:`geoarray._io.write_json`); returns the path."""
    from .._io import write_json as _write_json

    return _write_json(path, obj)


def require(module: str, extra: str = "demo") -> Any:
    """Import an optional dependency or raise :class:`CommandError` naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise CommandError(f"{module.split('.')[0]} is not installed (pip install 'geoarray[{extra}]')") from None
