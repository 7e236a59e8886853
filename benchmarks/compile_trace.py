"""What dynamo traces for ``torch.compile(opt.step, fullgraph=True)``: bytecode instructions and seconds,
against ``torch.optim.Adam``'s compiled step in the same process.

A compiled step's first call runs dynamo's symbolic interpreter over every Python instruction the step
executes (the skin, the core's update, the transforms, the manifold's kernels and their checks), each one
costing far more than running it; that is most of a compile with ``backend="eager"`` or ``"aot_eager"``,
what a torch user waits for once per process, and most of ``tests/test_torch_compile.py``'s time in the
test matrix (issue #50). The instruction count does not depend on the machine's speed, which on the
project's shared CI machine moved by 2× within an hour: it is the measure to compare revisions by.

The model is ``tests/test_torch_compile.py``'s: a ``Stiefel(6, 3)`` ManifoldParameter and a plain bias
(float64, one thread). For each optimizer: a fresh dynamo cache (``torch._dynamo.reset()``), one eager step
(it builds the state), then the compiled step's first call with ``backend="eager"`` (dynamo's capture
alone: no AOT autograd, no inductor), timed, while counting the instructions dynamo's interpreter steps
through (``InstructionTranslatorBase.step``, an internal of torch 2.13; counted per call, inlined frames
included), after one untimed compile (dynamo imports much of itself at its first compile in a
process). ``torch.optim.Adam`` on the same two tensors, plain, is the baseline (compiled without
``fullgraph``: torch breaks the graph around its own steps on purpose, ``torch.optim.optimizer._use_grad``).
``--repeat`` rounds, interleaved (the optimizers in turn within a round); printed: the instructions (the
same every round) and the median seconds, each with its ratio to torch's.

Measured 2026-11-30 (torch 2.13 CPU, 2-core Xeon, ``--repeat 3``), at the session's start (cf427d6) and
after that day's trace diet (``_same_key`` compared once and without a call per entry, no tree walk for
JAX's ordering or for a flat list of tensors under ``torch.compile``, ``torch.where`` without
array_api_compat's promotion when both sides share a dtype, torch's dtype test without ``isdtype``'s
dispatch, small identities by list arithmetic, agreeing torch tensors accepted by a manifold's argument
check in one pass): ``Adam`` 33,686 → 24,617 instructions, ``PaperAdam`` 26,198 → 17,855, ``SGD`` 30,487 →
21,788, ``ManifoldMuon`` 15,768 → 12,577 (``torch.optim.Adam``: 1,087); the seconds, medians of three
alternating processes: 1.80 → 1.56, 1.31 → 1.07, 1.69 → 1.61, 1.10 → 1.00 (torch's 0.2 s).

    python benchmarks/compile_trace.py [--optimizers Adam PaperAdam SGD ManifoldMuon] [--repeat 3]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import geoarray
import geoarray.torch as gt

OPTIMIZERS: dict[str, Callable[[list], torch.optim.Optimizer]] = {
    "torch.optim.Adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3),
    "Adam": lambda ps: gt.Adam(ps, lr=1e-2, weight_decay=1e-3),
    "PaperAdam": lambda ps: gt.PaperAdam(ps, lr=1e-2),
    "SGD": lambda ps: gt.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
    "ManifoldMuon": lambda ps: gt.ManifoldMuon(ps[:1], lr=1e-2),
}
BASELINE = "torch.optim.Adam"


class _Counter:
    """Counts the instructions dynamo's symbolic interpreter steps through while installed."""

    def __init__(self) -> None:
        from torch._dynamo import symbolic_convert

        self._cls = symbolic_convert.InstructionTranslatorBase
        self._step = self._cls.step
        self.count = 0

    def __enter__(self) -> _Counter:
        original = self._step

        def step(translator: Any) -> Any:
            self.count += 1
            return original(translator)

        self._cls.step = step
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.step = self._step


def _params(plain: bool) -> list[torch.Tensor]:
    M = geoarray.Stiefel(6, 3)
    Y = M.random(0, xp=torch, dtype=torch.float64)
    W = torch.nn.Parameter(Y) if plain else gt.ManifoldParameter(Y, M)
    b = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 3, dtype=torch.float64))
    return [W, b]


def _backward(W: torch.Tensor, b: torch.Tensor) -> None:
    x = torch.linspace(-1.0, 1.0, 48, dtype=torch.float64).reshape(8, 6)
    (torch.tanh(x @ W + b) - 0.5).square().sum().backward()


def trace_once(name: str) -> tuple[int, float]:
    """(instructions, seconds) of the first compiled call of ``name``'s step, after one eager step."""
    import torch._dynamo

    torch._dynamo.reset()
    params = _params(plain=name == BASELINE)
    opt = OPTIMIZERS[name](params)
    _backward(*params)
    opt.step()  # eagerly: geoarray's first step builds the state
    opt.zero_grad()
    _backward(*params)
    # torch's own step breaks the graph around itself by design (torch.optim.optimizer._use_grad): whole
    # graphs for geoarray's steps only
    step = torch.compile(opt.step, fullgraph=name != BASELINE, backend="eager")
    with _Counter() as counter:
        start = time.perf_counter()
        step()
        seconds = time.perf_counter() - start
    return counter.count, seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizers", nargs="+", default=["Adam", "PaperAdam", "SGD", "ManifoldMuon"])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    unknown = [n for n in args.optimizers if n not in OPTIMIZERS or n == BASELINE]
    if unknown:
        choices = sorted(set(OPTIMIZERS) - {BASELINE})
        parser.exit(2, f"compile_trace.py: unknown optimizers {unknown}; choose from {choices}\n")
    if args.repeat < 1:
        parser.exit(2, f"compile_trace.py: --repeat must be ≥ 1, got {args.repeat}\n")
    torch.set_num_threads(1)
    names = [BASELINE, *args.optimizers]
    counts: dict[str, set[int]] = {n: set() for n in names}
    seconds: dict[str, list[float]] = {n: [] for n in names}
    trace_once(BASELINE)  # untimed: dynamo imports much of itself at its first compile in a process
    for _ in range(args.repeat):
        for name in names:
            count, took = trace_once(name)
            counts[name].add(count)
            seconds[name].append(took)
    base_count = min(counts[BASELINE])
    base_s = statistics.median(seconds[BASELINE])
    rows = []
    print(f"{'optimizer':18} {'instructions':>12} {'÷ torch':>8} {'compile s':>10} {'÷ torch':>8}")
    for name in names:
        count, median = min(counts[name]), statistics.median(seconds[name])
        row = {
            "optimizer": name,
            "instructions": count,
            "instructions_vary": len(counts[name]) > 1,
            "ratio_instructions": count / base_count,
            "compile_s": median,
            "ratio_compile_s": median / base_s,
        }
        rows.append(row)
        print(f"{name:18} {count:12,d} {row['ratio_instructions']:7.1f}× {median:10.2f} {row['ratio_compile_s']:7.1f}×")
    out = {
        "command": " ".join(["python", "benchmarks/compile_trace.py", *(argv if argv is not None else sys.argv[1:])]),
        "torch": torch.__version__,
        "repeat": args.repeat,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
