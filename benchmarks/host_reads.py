"""What a step without host reads costs on the CPU, and how many reads each policy makes.

``geoarray.set_host_reads("never")`` makes an eager step do what it does on a GPU: no value is read to
the host, the non-finite policy is a ``where`` and the retraction runs a fixed route: for Adam the cheapest
Taylor rule covering every step it can take (its velocity bound), for other optimizers the top rule with a
static budget of masked doublings. The default ``"cpu"`` reads where that is free (host memory) and does only
the work the values ask for. This script times both on the same weights, in the same process, and
counts the reads (torch: ``aten._local_scalar_dense``, ``aten.item`` and ``aten.is_nonzero`` seen by a
dispatch mode during one eager step) and all aten operations (on a GPU, about one kernel launch each).

Weight sets (float32, Stiefel, ``geoarray.optim.Adam(lr=1e-3)``, fixed gradients of scale 1e-2):
``vit`` (336 × Stiefel(49, 7), batched), ``1024x64``, ``4096x128``; ``tiny`` (8 × Stiefel(16, 4)) for
smoke tests. Each policy steps its own copy; after 3 warm-up steps ``--steps`` rounds call the two
steps interleaved in alternating order (``_timing.interleaved_medians``), and the table gives the
medians and their ratio, never ÷ cpu.

    python benchmarks/host_reads.py [--backends torch numpy] [--sets vit 1024x64 4096x128] [--steps 30]
        [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sets import stiefel_set
from _timing import add_timing_arguments, interleaved_medians, load_namespace, machine_info, parse_timing_arguments

import geoarray
from geoarray import optim

SETS = ("vit", "1024x64", "4096x128")
ALL_SETS = (*SETS, "tiny")
POLICIES = ("cpu", "never")


def under(policy: str, fn):
    """``fn`` run with the host reads policy ``policy`` (restored afterwards)."""

    def run():
        previous = geoarray.set_host_reads(policy)
        try:
            return fn()
        finally:
            geoarray.set_host_reads(previous)

    return run


def step_function(params, manifolds, grads, policy: str):
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params, manifolds)
    holder = [params, state]

    def step():
        holder[0], holder[1] = opt.update(holder[0], grads, holder[1])

    return under(policy, step), holder


def count_operations(step) -> tuple[int, int]:
    """Host reads and all aten operations (about one kernel launch each on a GPU) during one call of
    ``step`` (torch only)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = {"_local_scalar_dense", "item", "is_nonzero"}

    class Count(TorchDispatchMode):
        reads = 0
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            if func.__name__.split(".")[0] in reads:
                Count.reads += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return Count.reads, Count.ops


def bench(backend: str, name: str, steps: int) -> dict:
    xp = load_namespace(backend)
    dtype = xp.float32
    params, manifolds, grads = stiefel_set(name, xp, dtype)
    fns, holders = {}, {}
    for policy in POLICIES:
        fns[policy], holders[policy] = step_function(params, manifolds, grads, policy)
    counts = {policy: count_operations(fns[policy]) if backend == "torch" else (None, None) for policy in POLICIES}
    times = interleaved_medians(fns, steps)
    Y = {p: geoarray.to_host(holders[p][0]["W"]) for p in POLICIES}
    return {
        "backend": backend,
        "set": name,
        "ms": {p: 1e3 * times[p] for p in POLICIES},
        "ratio_never_over_cpu": times["never"] / times["cpu"],
        "host_reads_per_step": {p: counts[p][0] for p in POLICIES},
        "operations_per_step": {p: counts[p][1] for p in POLICIES},
        "max_abs_difference": float(abs(Y["never"] - Y["cpu"]).max()),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["torch", "numpy"], choices=["torch", "numpy"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=ALL_SETS)
    add_timing_arguments(parser, steps=30)
    args = parse_timing_arguments(parser, argv)
    if "torch" in args.backends:
        import torch

        torch.set_num_threads(args.threads)
    rows = []
    print(
        f"{'backend':8} {'set':9} {'cpu ms':>8} {'never ms':>9} {'never/cpu':>9} {'reads cpu/never':>15} "
        f"{'ops cpu/never':>13}  max|Δ|"
    )
    for backend in args.backends:
        for name in args.sets:
            row = bench(backend, name, args.steps)
            rows.append(row)
            r, o = row["host_reads_per_step"], row["operations_per_step"]
            reads = "—" if r["cpu"] is None else f"{r['cpu']}/{r['never']}"
            ops = "—" if o["cpu"] is None else f"{o['cpu']}/{o['never']}"
            print(
                f"{backend:8} {name:9} {row['ms']['cpu']:8.3f} {row['ms']['never']:9.3f} "
                f"{row['ratio_never_over_cpu']:8.2f}× {reads:>15} {ops:>13}  {row['max_abs_difference']:.1e}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "host_reads", "machine": machine_info(), "steps": args.steps, "rows": rows}, f)
    return rows


if __name__ == "__main__":
    main()
