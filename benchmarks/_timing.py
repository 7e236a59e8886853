"""Small timing helpers shared by the benchmark scripts (not part of the library)."""

from __future__ import annotations

import contextlib
import importlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from geoarray import as_namespace, backend_name, set_section_form
from geoarray._backend import SECTION_FORMS as SECTION_FORM_CHOICES  # noqa: F401  (--section-form choices)


@contextlib.contextmanager
def section_form(form: str) -> Iterator[None]:
    """``geoarray.set_section_form(form)`` while inside, the previous setting restored after (a jitted step
    keeps the form of its trace)."""
    previous = set_section_form(form)
    try:
        yield
    finally:
        set_section_form(previous)


def load_namespace(name: str) -> Any:
    """The array namespace for a backend name (numpy, torch, jax, array-api-strict, cupy)."""
    if name == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
    module = {"array-api-strict": "array_api_strict", "jax": "jax.numpy"}.get(name, name)
    return as_namespace(importlib.import_module(module))


def block(x: Any) -> Any:
    """Wait for asynchronous backends (JAX dispatch, CUDA streams) to finish computing ``x``."""
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    elif backend_name(type(x).__module__ and __import__("array_api_compat").array_namespace(x)) == "torch":
        import torch

        if x.is_cuda:
            torch.cuda.synchronize()
    return x


def best_time(fn: Callable[[], Any], *, repeat: int = 5, number: int | None = None, budget: float = 0.5) -> float:
    """Best-of-``repeat`` seconds per call; ``number`` calls per repeat chosen to fill ``budget`` seconds."""
    out = fn()  # warm-up (JIT compilation, caches)
    block_leaves(out)
    if number is None:
        start = time.perf_counter()
        block_leaves(fn())
        once = max(time.perf_counter() - start, 1e-7)
        number = max(1, int(budget / repeat / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        block_leaves(out)
        best = min(best, (time.perf_counter() - start) / number)
    return best


def block_leaves(tree: Any) -> None:
    import optree

    for leaf in optree.tree_leaves(tree):
        if hasattr(leaf, "shape"):
            block(leaf)


def interleaved_medians(fns: dict[str, Callable[[], Any]], steps: int, *, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of every function in ``fns``, measured interleaved.

    Each function is called ``warmup`` times (not timed; JIT compilation and allocator caches), then
    ``steps`` rounds call each function once, in an order that alternates between rounds (forward,
    then reversed), so that load from other processes on a shared machine and any order effect hit
    all of them alike. A function must wait for its own result (``block_leaves``) before returning.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for k in range(steps):
        for name in names if k % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def add_timing_arguments(parser: Any, *, steps: int) -> None:
    """``--steps`` (timed rounds, default ``steps``), ``--threads`` (torch.set_num_threads, default 1) and
    ``--json``, as the interleaved step benchmarks take them; :func:`parse_timing_arguments` checks them."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")


def parse_timing_arguments(parser: Any, argv: list[str] | None) -> Any:
    """``parser.parse_args(argv)``, with a one-line error (exit code 2) for fewer than one timed step."""
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    return args


def machine_info(threads: int | None = None) -> dict[str, Any]:
    """CPU model, logical cores, the requested torch threads and library versions (without importing them)."""
    import os
    import platform
    from importlib import metadata

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for dist in ("numpy", "torch", "jax", "jaxlib", "optax", "geoopt", "cupy-cuda13x", "cupy-cuda12x"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    import subprocess

    try:
        here = os.path.dirname(os.path.abspath(__file__))
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=os.path.dirname(here),
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    return {
        "git_commit": (commit or None) and commit + ("+dirty src" if dirty else ""),
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "threads": threads,
        "load_average_1_5_15min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "gpu": _gpu_name(),
        **versions,
    }


def _gpu_name() -> str | None:
    """The CUDA device torch uses, when torch is already imported and sees one (imports nothing)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, torch {torch.__version__})"


def cuda_sync_sites(torch: Any, step: Callable[[], Any], *, repeats: int = 2, warmup: int = 1) -> dict[str, int]:
    """Where ``step`` makes the host wait for the CUDA device: ``{site: count}``, empty when it never does.

    ``step`` runs ``warmup`` times unwatched (a torch optimizer's first step builds its state and checks
    its parameters, once), then ``repeats`` times under ``torch.cuda.set_sync_debug_mode("warn")``, which warns at every
    operation that synchronises (a ``.item()``, a ``bool()`` of a tensor, a copy to the host, ``nonzero``);
    "warn" rather than "error" so that one run finds every site, not only the first. A site is the
    innermost frame of geoarray's source (else of the caller) at the warning, as ``path:line (function)``.
    """
    import traceback
    import warnings

    import geoarray

    package = os.path.dirname(os.path.abspath(geoarray.__file__))
    sites: dict[str, int] = {}

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        stack = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith(("warnings.py", "_timing.py"))]
        if any(f.name == "set_sync_debug_mode" for f in stack):
            # switching the mode itself (the first switch in a process warned once on an H200): not the step
            return
        ours = [f for f in stack if f.filename.startswith(package)] or stack
        frame = ours[-1]
        where = os.path.basename(frame.filename)
        if frame.filename.startswith(package):
            where = os.path.relpath(frame.filename, os.path.dirname(package))
        key = f"{where}:{frame.lineno} ({frame.name})"
        sites[key] = sites.get(key, 0) + 1

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(repeats):
                step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    return sites


def format_sync_sites(sites: dict[str, int]) -> str:
    """``"none"`` or ``"N: site ×k; ..."`` for a table cell."""
    if not sites:
        return "none"
    return f"{sum(sites.values())}: " + "; ".join(f"{site} ×{n}" for site, n in sites.items())
