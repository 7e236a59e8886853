"""Helpers shared by the subcommands: common options, backend selection, errors, JSON output."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .._install import install_hint

__all__ = [
    "BACKENDS",
    "CommandError",
    "add_common_train_options",
    "check_out",
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
        help="continue the run whose checkpoints are in DIR/checkpoints (--out DIR, which must exist), "
        "bit-identically, with the flags it was started with; without it a run with --out starts over and "
        "replaces them",
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


def check_out(args: argparse.Namespace, record: dict | None = None) -> str | None:
    """``--out DIR`` and ``--resume`` checked before any data is read or anything trained, each refusal one
    line: DIR a file, DIR that cannot be created or written, ``--resume`` with a DIR that does not exist
    (a mistyped path would start a new run), every checkpoint in DIR/checkpoints damaged, or checkpoints
    of another run — another command (``record["command"]``), another value of a flag in
    ``record["flags"]`` (``{"--n-layers": 8, ...}``, as :func:`checkpoint_options` saved them), another
    ``--seed`` or ``--batch-size``. Creates DIR; returns it (None without ``--out``)."""
    out = getattr(args, "out", None)
    resume = bool(getattr(args, "resume", False))
    if out is None:
        return None
    if os.path.exists(out) and not os.path.isdir(out):
        raise CommandError(f"--out {out!r} is a file; give a directory (the command writes its files there)")
    if resume and not os.path.isdir(out):
        raise CommandError(
            f"--resume: --out {out!r} does not exist, so there is no run to resume; check the path, or drop "
            "--resume to start a new run there"
        )
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"--out {out!r} cannot be created ({exc.strerror}); give a writable directory") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CommandError(f"--out {out!r} is not writable; give a writable directory")
    path = os.path.join(out, "checkpoints")
    if os.path.exists(path) and not os.path.isdir(path):
        raise CommandError(f"{path!r} is a file; remove it or choose another --out")
    if resume:
        from .._checkpoints import newest_intact

        newest, meta, damaged = newest_intact(path)
        if newest is None and damaged:
            raise CommandError(
                f"--resume: no checkpoint in {path!r} is intact ({len(damaged)} damaged, the newest: "
                f"{damaged[0][1]}); drop --resume to start the run over"
            )
        if newest is not None:
            _check_same_run(args, path, meta, record)
    return out


def _given(flag: str, value: Any) -> str:
    """How a flag's value reads in a message: ``--n-layers 8``, ``--unconstrained``, ``no --limit``."""
    if value is True:
        return flag
    if value is False or value is None:
        return f"no {flag}"
    return f"{flag} {value}"


def _check_same_run(args: argparse.Namespace, path: str, meta: dict, record: dict | None) -> None:
    """Refuse, naming the command or the flag, to resume checkpoints of another run: they would not load
    (another model's layout) or not continue that run (other data or batches)."""
    saved = meta.get("checkpoint_meta")
    # checkpoints written before the record was kept have none: then fit's own checks refuse another layout
    if record is not None and isinstance(saved, dict):
        if saved.get("command") != record["command"]:
            raise CommandError(
                f"--resume: {path!r} holds the checkpoints of a `geoarray {saved.get('command')}` run, not "
                f"of `geoarray {record['command']}`; resume it with `geoarray {saved.get('command')}`, or "
                "give another --out"
            )
        flags = saved.get("flags")
        if not isinstance(flags, dict):
            flags = {}
        for flag, value in record["flags"].items():
            if flag in flags and flags[flag] != value:
                old = flags[flag]
                fix = f"drop {flag}" if old is None or old is False else f"give {_given(flag, old)}"
                raise CommandError(
                    f"--resume: the run in {path!r} used {_given(flag, old)}, not {_given(flag, value)}; "
                    f"{fix} to continue it"
                )
        # another backend continues the same run (the state converts; kernels round differently): said, not refused
        then, now = saved.get("backend"), record.get("backend")
        if then is not None and now is not None and then != now:
            prog = getattr(args, "prog", "geoarray")
            print(
                f"{prog}: note: --resume: the run in {path!r} was trained with --backend {then}; it continues with "
                f"--backend {now} (its numbers agree with {then}'s to rounding, not bit for bit)",
                file=sys.stderr,
            )
    for key in ("seed", "batch_size"):
        if key in meta and getattr(args, key, meta[key]) != meta[key]:
            flag = "--" + key.replace("_", "-")
            raise CommandError(
                f"--resume: the run in {path!r} used {flag} {meta[key]}, not {getattr(args, key)}; "
                f"give {flag} {meta[key]} to continue it"
            )


def checkpoint_options(args: argparse.Namespace, record: dict | None = None) -> dict:
    """The checkpoint keywords of :func:`geoarray.train.fit` for ``--out``, ``--resume``,
    ``--checkpoint-every`` and ``--checkpoint-every-seconds`` (none for a parser without them):
    checkpoints go to ``OUT/checkpoints``, each with ``record`` (``{"command": "train vit", "flags":
    {flag: value}}``: what :func:`check_out` compares on ``--resume``) in its meta.json.

    Runs :func:`check_out`. Without ``--resume`` earlier checkpoints are removed (the run starts over, as
    metrics.json is rewritten); with it and no checkpoint yet, a note on stderr says the run starts afresh,
    and with a run that has trained ``--epochs`` or more already, a note says nothing is trained.
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

    if record is not None and getattr(args, "backend", None) is not None:
        record = {**record, "backend": args.backend}
    check_out(args, record)
    path = os.path.join(args.out, "checkpoints")
    newest = latest_checkpoint(path)
    if newest is not None and not args.resume:
        shutil.rmtree(path)
    elif newest is None and args.resume:
        prog = getattr(args, "prog", "geoarray")
        print(f"{prog}: note: --resume: no checkpoint in {path!r} yet; the run starts at epoch 1", file=sys.stderr)
    elif args.resume:
        from .._checkpoints import newest_intact

        done = newest_intact(path)[1].get("epoch")
        epochs = getattr(args, "epochs", None)
        if isinstance(done, int) and isinstance(epochs, int) and done >= epochs:
            prog = getattr(args, "prog", "geoarray")
            print(
                f"{prog}: note: --resume: the run in {path!r} has trained {done} epoch{'s' * (done != 1)}, so "
                f"--epochs {epochs} trains none (give --epochs above {done} to continue it)",
                file=sys.stderr,
            )
    options = {
        "checkpoint_path": path,
        "checkpoint_every": args.checkpoint_every,
        "checkpoint_every_seconds": args.checkpoint_every_seconds,
        "resume": bool(args.resume),
    }
    if record is not None:
        options["checkpoint_meta"] = record
    return options


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
            raise CommandError(f"backend 'torch' is not installed ({install_hint('torch')})") from None
        import array_api_compat.torch as torch_xp

        # small matrices: intra-op threads cost more in wake-ups than they save
        torch.set_num_threads(1)
        return torch_xp
    if backend == "jax":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        try:
            import jax
        except ImportError:
            raise CommandError(f"backend 'jax' is not installed ({install_hint('jax')})") from None
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
        raise CommandError(f"{module.split('.')[0]} is not installed ({install_hint(extra)})") from None
