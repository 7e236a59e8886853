"""Cost of a torch LR scheduler that also cycles the momentum, per geoarray.torch optimizer step.

OneCycleLR (``cycle_momentum=True``) writes ``lr`` and ``betas`` into every param group at every step.
``geoarray.torch.Adam`` reads both at every step from the group (no new core); ``PaperAdam`` reads
``lr`` but builds a new core whenever ``betas`` change, i.e. at every step (no fresh state: betas enter
none: its recipe's ``state_free``). ``ManifoldMuon`` reads ``lr`` at every step too (its core takes it as a
schedule): a new ``lr`` builds nothing (its momentum is not cycled here, ``cycle_momentum=False``; it takes
the matrices only).
The weights are the orthogonal RNN of the copying task (geotorch's example, issue #28): a recurrent
128×128 weight on Stiefel(128, 128), a 10×128 input and a 128×10 output matrix and their biases. Each
optimizer runs with and without the scheduler in alternation (fixed random gradients, 3 warm-up steps,
then ``--steps`` timed steps each); the medians and their ratio are printed.

    PYTHONPATH=src python benchmarks/torch_scheduler_step.py [--steps 50] [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import geoarray.torch as gt
from geoarray import Stiefel


def _params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    M = Stiefel(128, 128)
    W = gt.ManifoldParameter(M.random(g, xp=torch, dtype=torch.float32), M)
    shapes = [(10, 128), (128,), (128, 10), (10,)]
    return [W] + [torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float32)) for s in shapes]


def _setup(name: str, scheduled: bool, total: int):
    params = _params()
    if name == "ManifoldMuon":  # matrices only: manifold Muon refuses vectors
        params = [p for p in params if p.ndim == 2]
    opt = getattr(gt, name)(params, lr=1e-3)
    cycle = name != "ManifoldMuon"  # it has no betas; its lr alone
    sched = (
        torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=total, cycle_momentum=cycle)
        if scheduled
        else None
    )
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]

    def step() -> float:
        for p, gr in zip(params, grads, strict=True):
            p.grad = gr
        start = time.perf_counter()
        opt.step()
        if sched is not None:
            sched.step()
        return time.perf_counter() - start

    return step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    total = args.steps + 10
    out = {}
    print(f"torch {torch.__version__}, float32, {args.threads} thread(s); median ms of {args.steps} steps")
    for name in ("Adam", "PaperAdam", "ManifoldMuon"):
        plain, scheduled = _setup(name, False, total), _setup(name, True, total)
        for _ in range(3):
            plain(), scheduled()
        times: dict[str, list[float]] = {"plain": [], "scheduled": []}
        for _ in range(args.steps):
            times["plain"].append(plain())
            times["scheduled"].append(scheduled())
        med = {k: statistics.median(v) for k, v in times.items()}
        out[name] = {"plain_ms": 1e3 * med["plain"], "onecycle_ms": 1e3 * med["scheduled"]}
        out[name]["ratio"] = med["scheduled"] / med["plain"]
        print(
            f"geoarray.torch.{name:12s}: step {1e3 * med['plain']:6.3f} ms, with OneCycleLR "
            f"({'lr and betas' if name != 'ManifoldMuon' else 'lr'}) "
            f"{1e3 * med['scheduled']:6.3f} ms, ratio {out[name]['ratio']:.2f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
