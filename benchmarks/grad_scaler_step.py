"""What ``torch.amp.GradScaler`` adds to a geoarray.torch optimizer step.

Where host reads are free (``cpu``: the CPU's default policy) the scaler takes its own route: one fused
check-and-unscale pass over the gradients, a read of its flag, then ``opt.step()``. Where they are not
(``never``: a GPU's default) a geoarray.torch optimizer declares ``_step_supports_amp_scaling``, as torch's
fused Adam does: the scaler checks the gradients and hands the step its scale and flag, and the step
unscales in place (one ``_foreach_mul_``) and decides the skip on the device by one of two routes
(``geoarray/torch/_grad_scaler.py``): with the core's default ``on_nonfinite="skip"`` it hands the core
gradients × (NaN or 1) and puts its ``skipped`` count back; with ``on_nonfinite="ignore"`` (or ``"raise"``,
or a partition) it zeroes the gradients and selects the old values and state back, a ``where`` per
parameter and per state tensor. On the CPU the device routes do more work than the read they save (which
costs a load there); on a GPU the read waits for the backward pass. This script times, on the same
weights in one process,

* ``plain``: ``opt.step()`` on the unscaled gradients;
* ``scaled``: ``scaler.step(opt); scaler.update()`` on gradients that carry the scale,

with fixed gradients (each step rewrites ``p.grad``, a copy for both: the copy is in both rows), 3 warm-up
steps, then ``--steps`` rounds interleaved in alternating order (``_timing.interleaved_medians``), one
torch thread unless ``--threads``. It prints the medians and scaled ÷ plain per weight set and route
(host reads policy, ``on_nonfinite``).
Weight sets (float32, ``geoarray.torch.Adam(lr=1e-3)``): ``vit-leaves`` (the paper's ViT Q/K/V as 336
separate Stiefel(49, 7) parameters: the most ``where``s), ``vit`` (the same as one batched parameter),
``1024x64``.

    PYTHONPATH=src python benchmarks/grad_scaler_step.py [--sets vit-leaves vit 1024x64]
        [--routes cpu/skip never/skip never/ignore] [--steps 50] [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import optree
import torch
from _sets import stiefel_set
from _timing import add_timing_arguments, interleaved_medians, machine_info, parse_timing_arguments

import geoarray
import geoarray.torch as gt

SETS = ("vit-leaves", "vit", "1024x64")
ROUTES = ("cpu/skip", "never/skip", "never/ignore")  # host reads policy / the core's on_nonfinite
SCALE = 2.0**16


def _stepper(name: str, scaled: bool, on_nonfinite: str):
    params, mans, grads = stiefel_set(name, torch, torch.float32)
    leaves, manifolds = optree.tree_leaves(params), optree.tree_leaves(mans)
    weights = [gt.ManifoldParameter(p.clone(), m) for p, m in zip(leaves, manifolds, strict=True)]
    fixed = [g * SCALE if scaled else g for g in optree.tree_leaves(grads)]
    opt = gt.Adam(weights, lr=1e-3, on_nonfinite=on_nonfinite)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=10**9) if scaled else None
    if scaler is not None:
        scaler.scale(torch.zeros(()))  # the scale tensor is made at the first scale()

    def step() -> None:
        for w, g in zip(weights, fixed, strict=True):
            w.grad = g.clone()
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()

    return step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", choices=(*SETS, "tiny"), default=list(SETS))
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    add_timing_arguments(parser, steps=50)
    args = parse_timing_arguments(parser, argv)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'set':<11} {'route':<13} {'plain ms':>9} {'scaled ms':>10} {'scaled/plain':>13}")
    for name in args.sets:
        for route in args.routes:
            policy, on_nonfinite = route.split("/")
            previous = geoarray.set_host_reads(policy)
            try:
                steppers = {scaled: _stepper(name, scaled == "scaled", on_nonfinite) for scaled in ("plain", "scaled")}
                medians = interleaved_medians(steppers, args.steps)
            finally:
                geoarray.set_host_reads(previous)
            ratio = medians["scaled"] / medians["plain"]
            rows.append({"set": name, "route": route, **{k: v * 1e3 for k, v in medians.items()}, "ratio": ratio})
            print(f"{name:<11} {route:<13} {medians['plain'] * 1e3:9.3f} {medians['scaled'] * 1e3:10.3f} {ratio:13.2f}")
    result = {"machine": machine_info(args.threads), "steps": args.steps, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
