"""Soak: many float32 Stiefel-Adam steps on the ViT weight set — orthonormality drift and resident memory.

The weight set is the vision transformer of Brantner's paper: its 336 Q/K/V projections, Stiefel(49, 7),
as one batched (336, 49, 7) float32 array, stepped by ``geoarray.optim.Adam`` with its defaults (lr 1e-3;
under ``jax.jit`` on JAX). The gradient of every step is one of 16 fixed Gaussian arrays (cycled, already
on the backend, so no host work enters the loop). Issue #29 asks that 100,000 steps stay orthonormal to
max|YᵀY − I| ≤ 2e-6 and that the resident memory stay flat (within a few MB) over 10,000 steps: no
growing jit cache, retained autograd graph or accumulating state copies.

Printed every ``--every`` steps: the step, max|YᵀY − I| over all 336 weights (in float64 on the host), the
resident set size (``/proc/self/statm``, else ``resource``'s peak) and the seconds so far. At the end:
the largest drift seen, its growth law (the least-squares slope p of log drift against log step over
the reports: p ≈ 1 linear accumulation, ½ a random walk, 0 a floor that does not grow), and the memory
growth from the first report after ``--warmup`` steps to the last (steady state: warm-up allocates the
optimizer state, the kernels and, on JAX, the compiled step).

Where the drift comes from: each step applies the Householder section of the current point,
Q = I − VTVᵀ (orthogonal to rounding, rebuilt from every point), to g(W)E. In float32 that application
cancels O(1) terms into entries of size N^-½ and leaves max|YᵀY − I| ≈ 2e-6 on this set from the first
step on, a floor that does not accumulate (p ≈ 0); g(W)E itself is orthonormal to 1.2e-7. The Stiefel
retraction therefore ends a float32 step with one Björck step (``manifolds.retraction.bjorck_step``,
float64 untouched). ``--compare`` runs the same steps first without it (the step replaced by the
identity in this process) and prints the drift of both and the ratio of their times per step
(measured apart, in interleaved blocks of steps, since the soak's own times drift with the load).

    OMP_NUM_THREADS=1 python benchmarks/soak.py --backend numpy --steps 100000 --every 5000 [--json out.json]
    OMP_NUM_THREADS=1 python benchmarks/soak.py --backend numpy --steps 3000 --every 250 --compare

Not part of CI (a smoke run with tiny sizes is in tests/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from typing import Any
from unittest import mock

import numpy as np

import geoarray
from geoarray.manifolds import Stiefel

#: the ViT weight set of the paper (336 × Stiefel(49, 7)) and a tiny one for the smoke test
SETS = {"vit": (336, 49, 7), "tiny": (4, 6, 2)}


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux: /proc/self/statm; elsewhere the peak RSS)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**20 if sys.platform == "darwin" else 2**10)


def _namespace(name: str):
    if name == "numpy":
        import array_api_compat.numpy as xp

        return xp, None
    if name == "torch":
        import array_api_compat.torch as xp

        return xp, "cpu"
    if name == "jax":
        import jax.numpy as jnp

        return jnp, None
    raise SystemExit(f"soak.py: --backend must be numpy, torch or jax, got {name!r}")


def drift(Y) -> float:
    """max |YᵀY − I| over the batch, in float64 on the host."""
    Yh = np.asarray(geoarray._backend.to_host(Y), dtype=np.float64)
    return float(np.max(np.abs(np.swapaxes(Yh, -1, -2) @ Yh - np.eye(Yh.shape[-1]))))


def growth_exponent(rows: list[dict]) -> float | None:
    """The least-squares slope of log(drift) against log(step) over the reports after step 0 (None for
    fewer than two): 1 for drift growing linearly with the steps, ½ for a random walk, 0 for a floor."""
    pts = [(math.log(r["step"]), math.log(r["drift"])) for r in rows if r["step"] > 0 and r["drift"] > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx > 0 else None


def _no_bjorck_step(Y: Any, xp: Any, out: Any = None) -> Any:
    """The Björck step's stand-in for ``bjorck=False``: Y itself (written into ``out`` where one is given)."""
    if out is None:
        return Y
    out[...] = Y
    return out


def run(
    backend: str, shape: tuple[int, int, int], steps: int, every: int, warmup: int, lr: float, bjorck: bool = True
) -> dict:
    """The soak; ``bjorck=False`` replaces the Björck step that ends a float32 retraction by the identity
    (the behaviour before it, for ``--compare``)."""
    identity = mock.patch("geoarray.manifolds.stiefel.bjorck_step", _no_bjorck_step)
    with contextlib.nullcontext() if bjorck else identity:
        return _run(backend, shape, steps, every, warmup, lr, "" if bjorck else " (without the Björck step)")


def step_cost(backend: str, shape: tuple[int, int, int], lr: float, rounds: int = 30, block: int = 20) -> dict:
    """The time per optimizer step with and without the Björck step, interleaved: ``rounds`` rounds of
    ``block`` steps of each, in alternating order (so that a change of the machine's load meets both
    alike), medians. Where no Björck step is taken (torch's packed section) the ratio shows the noise."""
    xp, device = _namespace(backend)
    batch, N, n = shape
    M = Stiefel(N, n)
    identity = mock.patch("geoarray.manifolds.stiefel.bjorck_step", _no_bjorck_step)
    rng = np.random.default_rng(1)
    grads = {"w": xp.asarray(rng.normal(size=shape).astype(np.float32), device=device)}
    runs = {}
    for name in ("without", "with"):
        params = {"w": M.random(0, xp=xp, batch_shape=(batch,), dtype=xp.float32, device=device)}
        opt = geoarray.optim.Adam(lr=lr)  # one per variant: jax.jit caches per bound method
        update = opt.update
        if backend == "jax":
            import jax

            update = jax.jit(opt.update)
        runs[name] = [update, params, opt.init(params, {"w": M}), []]
    for r in range(rounds + 1):  # the first round warms up (allocations, and the compiles on JAX)
        # ABBA: which variant runs first alternates, so that an advantage of the first (or second) block
        # of a round falls on both alike
        for name in ("without", "with") if r % 2 == 0 else ("with", "without"):
            run_ = runs[name]
            update, params, state, times = run_
            with identity if name == "without" else contextlib.nullcontext():
                t = time.perf_counter()
                for _ in range(block):
                    params, state = update(params, grads, state)
                geoarray._backend.to_host(params["w"][0, 0, 0])  # wait for asynchronous backends
                times.append((time.perf_counter() - t) / block)
            run_[1:3] = params, state
    ms = {name: 1e3 * float(np.median(run_[3][1:])) for name, run_ in runs.items()}
    return {"ms_per_step_without": ms["without"], "ms_per_step_with": ms["with"], "ratio": ms["with"] / ms["without"]}


def _run(backend: str, shape: tuple[int, int, int], steps: int, every: int, warmup: int, lr: float, tag: str) -> dict:
    xp, device = _namespace(backend)
    batch, N, n = shape
    M = Stiefel(N, n)
    params = {"w": M.random(0, xp=xp, batch_shape=(batch,), dtype=xp.float32, device=device)}
    manifolds = {"w": M}
    rng = np.random.default_rng(1)
    pool = [
        {"w": xp.asarray(rng.normal(size=shape).astype(np.float32), device=device)} for _ in range(16)
    ]  # fmt: skip
    opt = geoarray.optim.Adam(lr=lr)
    state = opt.init(params, manifolds)
    update = opt.update
    if backend == "jax":
        import jax

        update = jax.jit(opt.update)
    rows = [{"step": 0, "drift": drift(params["w"]), "rss_mb": rss_mb(), "seconds": 0.0}]
    print(f"{backend}: step       0  max|YᵀY−I| {rows[0]['drift']:.2e}  RSS {rows[0]['rss_mb']:8.1f} MB", flush=True)
    t0 = time.perf_counter()
    for k in range(1, steps + 1):
        params, state = update(params, pool[k % 16], state)
        if k % every == 0 or k == steps:
            row = {"step": k, "drift": drift(params["w"]), "rss_mb": rss_mb(), "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(
                f"{backend}: step {k:>7}  max|YᵀY−I| {row['drift']:.2e}  RSS {row['rss_mb']:8.1f} MB  "
                f"{row['seconds']:8.1f} s",
                flush=True,
            )
    steady = [r for r in rows if r["step"] >= warmup] or rows[-1:]
    # the drift after steps (step 0 is the float32 QR of the initial point)
    summary = {
        "backend": backend,
        "shape": list(shape),
        "steps": steps,
        "bjorck": not tag,
        "max_drift": max(r["drift"] for r in rows),
        "final_drift": rows[-1]["drift"],
        "growth_exponent": growth_exponent(rows),
        "rss_first_mb": steady[0]["rss_mb"],
        "rss_last_mb": steady[-1]["rss_mb"],
        "rss_growth_mb": steady[-1]["rss_mb"] - steady[0]["rss_mb"],
        "rss_growth_from_step": steady[0]["step"],
        "ms_per_step": 1e3 * rows[-1]["seconds"] / steps,
        "rows": rows,
    }
    p = summary["growth_exponent"]
    law = "?" if p is None else f"{p:.2f}"
    print(
        f"{backend}: {steps} steps of Adam on {batch} × Stiefel({N}, {n}) float32{tag}: "
        f"max drift {summary['max_drift']:.2e} (final {summary['final_drift']:.2e}; drift ∝ steps^{law}); "
        f"RSS {summary['rss_first_mb']:.1f} → {summary['rss_last_mb']:.1f} MB "
        f"from step {summary['rss_growth_from_step']} ({summary['rss_growth_mb']:+.1f} MB); "
        f"{summary['ms_per_step']:.2f} ms/step",
        flush=True,
    )
    return summary


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="numpy", choices=("numpy", "torch", "jax"))
    p.add_argument("--set", default="vit", choices=sorted(SETS), help="weight set (default: vit, 336 × St(49, 7))")
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--every", type=int, default=1000, help="report every this many steps")
    p.add_argument("--warmup", type=int, default=1000, help="memory growth is measured from this step on")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument(
        "--compare",
        action="store_true",
        help="first run the same steps without the Björck step of float32 retractions (the baseline), and "
        "print the ratio of drift and of time per step (interleaved blocks)",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.every < 1:
        p.error("--steps and --every must be positive")
    config = (args.backend, SETS[args.set], args.steps, args.every, args.warmup, args.lr)
    baseline = run(*config, bjorck=False) if args.compare else None
    summary = run(*config)
    if baseline is not None:
        summary["without_bjorck"] = baseline
        summary["max_drift_ratio"] = summary["max_drift"] / baseline["max_drift"]
        cost = summary["step_cost"] = step_cost(args.backend, SETS[args.set], args.lr)
        print(
            f"{args.backend}: with the Björck step / without: max drift ×{summary['max_drift_ratio']:.2f} "
            f"({summary['max_drift']:.2e} / {baseline['max_drift']:.2e}); time per step ×{cost['ratio']:.2f} "
            f"({cost['ms_per_step_with']:.2f} / {cost['ms_per_step_without']:.2f} ms, medians of interleaved blocks)",
            flush=True,
        )
    summary["machine"] = {"omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpu_count": os.cpu_count()}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
    return summary


if __name__ == "__main__":
    main()
