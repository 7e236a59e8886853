"""An optimizer step against the library kernels it calls, each timed alone (#30, item 3).

A Stiefel-Adam step is bound by its N×n×n products and one QR when its weights are large; for batches of
small frames, the hundred-odd small operations around them (and Python) can cost more than the kernels.
This script finds out which: it records, with a torch dispatch mode, every call to a LAPACK or GEMM kernel
(``geqrf``, ``ormqr``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``, …) during one eager step, together with
copies of its actual arguments (shapes, dtypes and strides as the step made them); it then times the
step and each recorded call alone, interleaved (``_timing.interleaved_medians``), and prints

    step ÷ Σ kernels

with the kernels summed from their medians, and the biggest kernels. A ratio near 1 means the step is
bound by its kernels; the issue's target is ≤ 1.5.

Weight sets (float32, ``geoarray.optim.Adam(lr=1e-3)``, fixed gradients of scale 1e-2): ``vit``
(336 × Stiefel(49, 7), batched), ``1024x64``, ``4096x128``; ``tiny`` (8 × Stiefel(16, 4)) for smoke tests.
torch only (the dispatch mode is torch's). ``--host-reads never`` times the fixed-work step a GPU runs.

    python benchmarks/step_kernels.py [--sets vit 1024x64 4096x128] [--steps 30] [--threads 1]
        [--host-reads cpu|never] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sets import stiefel_set
from _timing import interleaved_medians, load_namespace, machine_info

import geoarray
from geoarray import optim

SETS = ("vit", "1024x64", "4096x128")
ALL_SETS = (*SETS, "tiny")
KERNELS = frozenset(
    {
        "geqrf",
        "ormqr",
        "linalg_householder_product",
        "linalg_solve_triangular",
        "linalg_solve",
        "linalg_lu_factor_ex",
        "linalg_lu_solve",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "dot",
        "mv",
    }
)


def _copy(x):
    import torch

    if isinstance(x, torch.Tensor):
        if 0 in x.stride():  # a broadcast operand (an expanded identity): its values, densely
            return x.clone()
        out = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device=x.device)
        return out.copy_(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(v) for v in x)
    return x


def record_kernels(step) -> list:
    """(name, shapes, call) for every kernel call of one ``step()``, with copies of its arguments."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            if name in KERNELS:
                a, k = _copy(args), _copy(kwargs)
                shapes = [tuple(x.shape) for x in args if isinstance(x, torch.Tensor)]
                calls.append((name, shapes, lambda f=func, a=a, k=k: f(*a, **k)))
            return func(*args, **kwargs)

    with Record():
        step()
    return calls


def bench(name: str, steps: int, host_reads: str) -> dict:
    import torch

    xp = load_namespace("torch")
    params, manifolds, grads = stiefel_set(name, xp, torch.float32)
    opt = optim.Adam(lr=1e-3)
    holder = [params, opt.init(params, manifolds)]
    previous = geoarray.set_host_reads(host_reads)
    try:

        def step():
            holder[0], holder[1] = opt.update(holder[0], grads, holder[1])

        step()
        calls = record_kernels(step)
        fns = {"step": step, **{f"{i}:{c[0]}": c[2] for i, c in enumerate(calls)}}
        times = interleaved_medians(fns, steps)
    finally:
        geoarray.set_host_reads(previous)
    kernels = [(c[0], c[1], times[f"{i}:{c[0]}"]) for i, c in enumerate(calls)]
    total = sum(t for _, _, t in kernels)
    return {
        "set": name,
        "host_reads": host_reads,
        "step_ms": 1e3 * times["step"],
        "kernels_ms": 1e3 * total,
        "n_kernels": len(kernels),
        "ratio_step_over_kernels": times["step"] / total,
        "kernels": [{"name": n, "shapes": s, "ms": 1e3 * t} for n, s, t in kernels],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=ALL_SETS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--host-reads", default="cpu", choices=["cpu", "never"])
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    print(f"host reads {args.host_reads!r}, {args.threads} thread(s), float32, median of {args.steps} interleaved")
    print(f"{'set':9} {'step ms':>8} {'kernels ms':>10} {'kernels':>7} {'step/kernels':>12}   largest kernels (ms)")
    for name in args.sets:
        row = bench(name, args.steps, args.host_reads)
        rows.append(row)
        top = sorted(row["kernels"], key=lambda k: -k["ms"])[:3]
        largest = ", ".join(f"{k['name']}{k['shapes'][0] if k['shapes'] else ''} {k['ms']:.3f}" for k in top)
        print(
            f"{name:9} {row['step_ms']:8.3f} {row['kernels_ms']:10.3f} {row['n_kernels']:7d} "
            f"{row['ratio_step_over_kernels']:11.2f}×   {largest}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "step_kernels", "machine": machine_info(args.threads), "rows": rows}, f)
    return rows


if __name__ == "__main__":
    main()
