"""An optimizer step of this checkout against the same step at another git revision, interleaved in one process.

For changes whose effect on a step is a few percent: two runs of a script a minute apart on a shared
machine differ by more than that (the kernel sums of ``step_kernels.py`` moved by 2× within an hour here),
so before and after are timed side by side instead. The revision's ``src/geoarray`` is exported with
``git archive`` into a temporary folder and imported as the package ``geoarray_base`` (the library's
imports are relative, so the two copies do not meet); both build ``optim.Adam(lr=1e-3)`` (or
``--optimizer``; with ``--torch`` :mod:`geoarray.torch`'s optimizer of that name on a ``ManifoldParameter``,
whose ``opt.step()`` is timed) on the same weights and fixed gradients (``_sets.stiefel_set``, float32 or
``--dtype``), and ``_timing.interleaved_medians`` times their steps alternately. Printed per set: both
medians, the ratio this checkout ÷ revision, and the largest difference of the two weights after the same
number of steps: 0 when the two compute the same, rounding-sized when a change reorders arithmetic — or, in float32 over
tens of steps, as large as a step: the Householder section's completion Q⊥ flips where a pivot of Y's QR
crosses zero, Adam's moments are kept in the section's coordinates, and two roundings can cross at
different steps (St(4096, 128), against a2ed7c2: 1e-6 for 52 steps, 2.6e-3 at step 53, where one run's
smallest |τ − 1| was 1.8e-6). ``--dtype float64`` then shows whether the update itself changed.

The sets are the ones ``step_kernels.py`` times, and ``128x128``, the square weight of ``square_step.py``. On
torch by default; ``--backend numpy`` or ``array-api-strict`` times the core's step there (array-api-strict
stands for a backend without native LAPACK factorisations, as CuPy is for some: the generic paths), and
``--host-reads never`` the fixed-work route a GPU takes (``geoarray.set_host_reads``, set in both copies).

    python benchmarks/ab_step.py --base a2ed7c2 [--sets vit 1024x64 4096x128] [--steps 60] [--threads 1]
        [--optimizer Adam|Momentum|Gradient] [--torch] [--dtype float32|float64]
        [--backend torch|numpy|array-api-strict] [--host-reads cpu|never] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sets import stiefel_set
from _timing import add_timing_arguments, interleaved_medians, load_namespace, machine_info, parse_timing_arguments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = ("vit", "1024x64", "4096x128", "tiny", "128x128")
OPTIMIZERS = ("Adam", "Momentum", "Gradient")
BACKENDS = ("torch", "numpy", "array-api-strict")


def _host(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.from_dlpack(x)


def import_revision(rev: str, folder: str):
    """``src/geoarray`` at git revision ``rev`` of this repository, imported as ``geoarray_base``."""
    try:
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", rev, "src/geoarray"], check=True, capture_output=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        detail = e.stderr.decode().strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
        raise ValueError(f"cannot export src/geoarray at --base {rev!r} with git: {detail}") from e
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        try:
            tar.extractall(folder, filter="data")
        except TypeError:  # Python < 3.11.4 has no extraction filters; the archive is git's own output
            tar.extractall(folder)
    os.rename(os.path.join(folder, "src", "geoarray"), os.path.join(folder, "geoarray_base"))
    sys.path.insert(0, folder)
    return importlib.import_module("geoarray_base")


def _stepper(lib, name: str, optimizer: str, xp, dtype, adapter: bool = False):
    params, _, grads = stiefel_set(name, xp, dtype)  # the same values for both (seeded draws)
    # each library steps its own manifold objects (a revision's classes are not this checkout's)
    mans = {"W": lib.Stiefel(*params["W"].shape[-2:])}
    if adapter:  # geoarray.torch's optimizer on a ManifoldParameter: the step a torch user calls
        gt = importlib.import_module(f"{lib.__name__}.torch")
        # the revision's optimizer is geoarray's too, but another copy's class, which this checkout's warning
        # about foreign optimizers on ManifoldParameters does not know (it warns once per optimizer)
        warnings.filterwarnings("ignore", message=r".* is not a geoarray optimizer", category=UserWarning)
        W = gt.ManifoldParameter(params["W"].clone(), mans["W"])
        W.grad = grads["W"].clone()
        opt = getattr(gt, optimizer)([W], lr=1e-3)
        return opt.step, [{"W": W.detach()}]
    opt = getattr(lib.optim, optimizer)(lr=1e-3)
    holder = [params, opt.init(params, mans)]

    def step() -> None:
        holder[0], holder[1] = opt.update(holder[0], grads, holder[1])

    return step, holder


def bench(
    base,
    name: str,
    optimizer: str,
    steps: int,
    dtype: str = "float32",
    adapter: bool = False,
    backend: str = "torch",
) -> dict:
    import geoarray

    xp = load_namespace(backend)
    new_step, new = _stepper(geoarray, name, optimizer, xp, getattr(xp, dtype), adapter)
    base_step, old = _stepper(base, name, optimizer, xp, getattr(xp, dtype), adapter)
    times = interleaved_medians({"new": new_step, "base": base_step}, steps)
    return {
        "set": name,
        "optimizer": f"geoarray.torch.{optimizer}" if adapter else optimizer,
        "backend": backend,
        "dtype": dtype,
        "new_ms": 1e3 * times["new"],
        "base_ms": 1e3 * times["base"],
        "ratio_new_over_base": times["new"] / times["base"],
        "max_abs_difference": float(np.max(np.abs(_host(new[0]["W"]) - _host(old[0]["W"])))),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with (a commit, tag or branch)")
    parser.add_argument("--sets", nargs="+", default=["vit", "1024x64", "4096x128"], choices=SETS)
    parser.add_argument("--optimizer", default="Adam", choices=OPTIMIZERS)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument(
        "--torch", action="store_true", help="time geoarray.torch's optimizer of that name (opt.step()) instead"
    )
    parser.add_argument("--backend", default="torch", choices=BACKENDS, help="the core's step on this backend")
    parser.add_argument(
        "--host-reads", default="cpu", choices=["cpu", "never"], help="geoarray.set_host_reads, in both copies"
    )
    add_timing_arguments(parser, steps=60)
    args = parse_timing_arguments(parser, argv)
    if args.torch and args.backend != "torch":
        parser.error(
            f"--torch times geoarray.torch's optimizer, which runs on torch: leave out --backend {args.backend}"
        )
    if args.backend == "torch":
        import torch

        torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        try:
            base = import_revision(args.base, folder)
        except ValueError as e:
            parser.exit(2, f"ab_step.py: error: {e}\n")
        if args.torch:
            try:
                getattr(importlib.import_module(f"{base.__name__}.torch"), args.optimizer)
            except (ImportError, AttributeError):
                parser.exit(
                    2,
                    f"ab_step.py: error: --torch: revision {args.base!r} has no geoarray.torch.{args.optimizer}; "
                    "leave out --torch (the core's optimizer) or pick a later revision\n",
                )
        try:
            import geoarray

            for lib in (geoarray, base):
                if hasattr(lib, "set_host_reads"):
                    lib.set_host_reads(args.host_reads)
                elif args.host_reads != "cpu":  # older revisions read on the CPU, the library's default
                    parser.exit(
                        2, f"ab_step.py: error: revision {args.base!r} has no set_host_reads; leave out --host-reads\n"
                    )
            what = f"geoarray.torch.{args.optimizer}" if args.torch else args.optimizer
            threads = f"{args.threads} thread(s), " if args.backend == "torch" else ""
            print(
                f"this checkout against {args.base}: {what} on {args.backend}, {args.dtype}, {threads}"
                f"host reads {args.host_reads}, median of {args.steps} interleaved"
            )
            print(f"{'set':9} {'new ms':>8} {'base ms':>8} {'new/base':>8} {'max|ΔW|':>9}")
            for name in args.sets:
                row = bench(base, name, args.optimizer, args.steps, args.dtype, args.torch, args.backend)
                rows.append(row)
                print(
                    f"{name:9} {row['new_ms']:8.3f} {row['base_ms']:8.3f} {row['ratio_new_over_base']:8.3f} "
                    f"{row['max_abs_difference']:9.1e}"
                )
        finally:
            sys.path.remove(folder)
            for module in [m for m in sys.modules if m == "geoarray_base" or m.startswith("geoarray_base.")]:
                del sys.modules[module]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"benchmark": "ab_step", "base": args.base, "machine": machine_info(args.threads), "rows": rows}, f
            )
    return rows


if __name__ == "__main__":
    main()
