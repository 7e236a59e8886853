"""Bytes communicated and memory per rank of a manifold-Adam step under FSDP2 or ZeRO-1, against the
same with ``torch.optim.Adam`` on the same model (the baseline, which ignores the manifold).

``--parallel zero`` replaces FSDP2 by ``DistributedDataParallel`` with
``torch.distributed.optim.ZeroRedundancyOptimizer``: every rank holds the whole model, its optimizer the
state of its partition of the parameters (whole weights), and the updated weights are broadcast from
their owners.

For 1, 2 and 4 gloo ranks on the CPU (``--worlds``), each weight set is built on the meta device,
sharded per layer and at the root with :func:`geoarray.torch.fully_shard` (``Shard(0)`` DTensors),
materialised shard by shard, and trained for ``--steps`` steps after one warm-up step (the first step,
which creates the optimizer state). Sets (``--sets``):

* ``vit``: the paper's vision transformer (Brantner, *Generalizing Adam to Manifolds for Efficiently
  Training Transformers*): 16 layers, each a ``(21, 49, 7)`` stack of Stiefel(49, 7) Q/K/V frames (7
  heads × 3) and a 49×49 feed-forward matrix; the stacks are cut between frames (local step);
* ``gpt``: GPT-2-small-sized Stiefel Q/K/V: 12 layers, each a ``(36, 768, 64)`` stack (12 heads × 3);
* ``gpt-tall``: the same 432 frames as separate ``768×64`` parameters, cut by rows: each is gathered
  to its owner rank for the step and scattered back (the owners spread over the ranks).

Printed per set, rank count and optimizer (one fresh process group per row):

* ``step comm``: bytes received per rank in ``opt.step()``, per step; ``fwd+bwd comm``: the same for
  FSDP2's forward and backward (its all-gathers and reduce-scatters, equal for both optimizers). Every
  collective is intercepted (a ``TorchDispatchMode`` on the ``c10d`` and ``_c10d_functional`` ops) and
  counted as the bytes this rank receives, a ring algorithm for the symmetric ones: all-gather (W−1)/W
  of the output, reduce-scatter (W−1)/W of the input, all-reduce 2(W−1)/W of the tensor; gather: the
  root (W−1) chunks, scatter: each other rank its chunk; broadcast: each rank but the root the tensor;
* ``state``: optimizer-state bytes held by each rank (max over ranks; the tensors of
  ``opt.state_dict()``); the comm columns are the max over ranks too;
* ``peak``: growth of the process's peak resident memory (``ru_maxrss``) from after initialisation to
  after the steps, max over ranks: what forward, backward and step added at their peak;
* ``step ms``: median ``opt.step()`` time — indicative only on a shared 2-core machine (ranks share it).

``--host-reads never`` runs every rank under ``geoarray.set_host_reads("never")``: the step does the
fixed, masked work it does on a GPU, and the ranks agree on the step's outcome after it (one 4-byte
all-reduce, as with reads on the gradients before it; ``geoarray.torch._dtensor.Views.agree``).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/sharded_step.py [--worlds 1 2 4]
        [--sets vit gpt gpt-tall] [--steps 2] [--batch 8] [--dtype float32] [--host-reads cpu|never]
        [--parallel fsdp2|zero] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch

SETS = {
    # name: (layers, frames per layer, N, n, stacked, feed-forward matrix size or 0)
    "vit": (16, 21, 49, 7, True, 49),
    "gpt": (12, 36, 768, 64, True, 0),
    "gpt-tall": (12, 36, 768, 64, False, 0),
    "tiny": (2, 3, 12, 3, True, 12),  # the smoke test's
    "tiny-tall": (2, 3, 12, 3, False, 0),
}
OPTIMIZERS = ("geoarray.torch.Adam", "torch.optim.Adam")


class _Comm:
    """Bytes received per rank by the collectives run while active (ring model; module docstring)."""

    def __init__(self, world: int):
        from torch.utils._python_dispatch import TorchDispatchMode

        comm = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                comm.count(func, args)
                return func(*args, **(kwargs or {}))

        import torch.distributed as dist

        self.world, self.bytes, self.mode = world, 0.0, Mode()
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    def count(self, func, args) -> None:
        if func.namespace not in ("c10d", "_c10d_functional"):
            return
        name, w = func.__name__.split(".")[0], self.world
        if name in ("gather_", "scatter_"):  # (outputs, inputs, ...): nested lists, filled on one side only
            outputs, inputs = _tensors(args[0]), _tensors(args[1])
            if name == "gather_" and outputs:  # the root receives the other ranks' chunks
                self.bytes += (len(outputs) - 1) * outputs[0].numel() * outputs[0].element_size()
            elif name == "scatter_" and not inputs:  # a non-root receives its chunk
                self.bytes += sum(t.numel() * t.element_size() for t in outputs)
            return
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        if not tensors or w == 1:
            return
        size = max(t.numel() * t.element_size() for t in tensors)
        if "gather" in name:  # the output is the largest tensor; the functional one gets the input only
            full = size * (w if name == "all_gather_into_tensor" else 1)
            self.bytes += (w - 1) / w * full
        elif "reduce_scatter" in name:
            self.bytes += (w - 1) / w * size
        elif "allreduce" in name or "all_reduce" in name:
            self.bytes += 2 * (w - 1) / w * size
        elif name.startswith("broadcast"):  # (tensors, group, root, …) or functional (input, src, group)
            root = args[1] if func.namespace == "_c10d_functional" else args[2]
            if root != self.rank:  # the root sends, the others receive the whole tensor
                self.bytes += size
        elif name not in ("wait_tensor", "_wrap_tensor_autograd"):
            self.bytes += size  # the rest: the whole tensor

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _model(kind: str, dtype: torch.dtype):
    import geoarray as ga
    import geoarray.torch as gt

    layers, k, N, n, stacked, ff = SETS[kind]
    M = ga.Stiefel(N, n)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if stacked:
                self.qkv = gt.ManifoldParameter(torch.empty(k, N, n, dtype=dtype), M, check=False)
            else:
                self.heads = torch.nn.ParameterList(
                    [gt.ManifoldParameter(torch.empty(N, n, dtype=dtype), M, check=False) for _ in range(k)]
                )
            if ff:
                self.ff = torch.nn.Parameter(torch.empty(ff, ff, dtype=dtype))

        def frames(self):
            return self.qkv if stacked else torch.stack(list(self.heads))

        def forward(self, x):
            Q = self.frames()
            h = torch.tanh(torch.einsum("bi,kin->bkn", x, Q))
            x = x + torch.einsum("bkn,kin->bi", h, Q) / k
            return torch.tanh(x @ self.ff) if ff else x

    return torch.nn.Sequential(*[Layer() for _ in range(layers)])


def _initial(i: int, p: torch.Tensor, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """The seeded initial value of the model's ``i``-th parameter (whole)."""
    import geoarray as ga

    _, _, N, n, _, _ = SETS[kind]
    if p.ndim == 2 and p.shape[0] == p.shape[1] and getattr(p, "manifold", None) is None:
        g = torch.Generator().manual_seed(1000 + i)
        return torch.randn(tuple(p.shape), generator=g, dtype=dtype) / p.shape[0] ** 0.5
    return ga.Stiefel(N, n).random(i, xp=torch, batch_shape=tuple(p.shape[:-2]), dtype=dtype).contiguous()


@torch.no_grad()
def _materialise(model, kind: str, dtype: torch.dtype) -> None:
    """Fill every shard with its part of a seeded initial weight, one parameter at a time (never the
    whole model on one rank)."""
    from torch.distributed.tensor import DTensor, Replicate

    for i, (_name, p) in enumerate(model.named_parameters()):
        full = _initial(i, p, kind, dtype)
        if not isinstance(p, DTensor):  # ZeRO: whole parameters on every rank
            p.copy_(full)
            continue
        whole = DTensor.from_local(full, p.device_mesh, [Replicate()], run_check=False)
        p.to_local().copy_(whole.redistribute(p.device_mesh, p.placements).to_local())


def _state_bytes(opt) -> int:
    import optree

    sd = opt.state_dict()
    leaves = optree.tree_leaves(sd.get("geoarray", {}).get("groups", [])) + optree.tree_leaves(sd["state"])
    seen, total = set(), 0
    for t in leaves:
        if isinstance(t, torch.Tensor):
            t = t.to_local() if hasattr(t, "to_local") else t
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
            if key not in seen and t.numel():
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def _worker(rank: int, world: int, port: int, kind: str, which: str, args: dict, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import geoarray as ga
    import geoarray.torch as gt

    torch.set_num_threads(1)
    ga.set_host_reads(args["host_reads"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    try:
        dtype = getattr(torch, args["dtype"])
        cls = torch.optim.Adam if which == "torch.optim.Adam" else gt.Adam
        if args["parallel"] == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            from torch.nn.parallel import DistributedDataParallel

            module = _model(kind, dtype)
            _materialise(module, kind, dtype)
            model = DistributedDataParallel(module)
            opt = ZeroRedundancyOptimizer(module.parameters(), optimizer_class=cls, lr=1e-3)
            held = opt.optim  # this rank's optimizer, over its partition
        else:
            mesh = init_device_mesh("cpu", (world,))
            with torch.device("meta"):
                model = _model(kind, dtype)
            for layer in model:
                gt.fully_shard(layer, mesh=mesh)
            gt.fully_shard(model, mesh=mesh)
            model.to_empty(device="cpu")
            _materialise(model, kind, dtype)
            opt = held = cls(model.parameters(), lr=1e-3)
        N = SETS[kind][2]
        x = torch.randn(args["batch"], N, generator=torch.Generator().manual_seed(rank), dtype=dtype)
        # one forward and backward before the baseline: the first calls' one-time allocations are not
        # the optimizer's (the gradients are freed by zero_grad)
        model(x).square().mean().backward()
        opt.zero_grad()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fwd_bwd, step, times = _Comm(world), _Comm(world), []
        for s in range(1 + args["steps"]):
            with fwd_bwd if s else _Comm(world):
                model(x).square().mean().backward()
            t0 = time.perf_counter()
            with step if s else _Comm(world):
                opt.step()
            if s:
                times.append(time.perf_counter() - t0)
            opt.zero_grad()
        out = {
            "step_bytes": step.bytes / args["steps"],
            "fwd_bwd_bytes": fwd_bwd.bytes / args["steps"],
            "state_bytes": _state_bytes(held),
            "param_bytes": sum(_local(p).numel() * p.element_size() for p in model.parameters()),
            "peak_growth": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024,
            "step_s": statistics.median(times),
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()


def _spawn(rank: int, *args) -> None:  # torch.multiprocessing passes the rank first
    _worker(rank, *args)


def run(kind: str, world: int, which: str, args: dict) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_spawn, args=(world, port, kind, which, args, out_dir), nprocs=world, start_method="spawn")
        ranks = []
        for r in range(world):
            with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    return {key: max(r[key] for r in ranks) for key in ranks[0]}


def _mib(b: float) -> str:
    return f"{b / 2**20:.3f}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sets", nargs="+", default=["vit", "gpt", "gpt-tall"], choices=sorted(SETS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--parallel",
        default="fsdp2",
        choices=["fsdp2", "zero"],
        help="fsdp2: geoarray.torch.fully_shard (Shard(0) DTensors); zero: DistributedDataParallel with "
        "ZeroRedundancyOptimizer (whole parameters on every rank, each rank's optimizer over its partition)",
    )
    parser.add_argument(
        "--host-reads",
        default="cpu",
        choices=["cpu", "never"],
        help="geoarray.set_host_reads in every rank ('never': the masked steps of a GPU)",
    )
    a = parser.parse_args(argv)
    args = {"steps": a.steps, "batch": a.batch, "dtype": a.dtype, "host_reads": a.host_reads, "parallel": a.parallel}
    rows = []
    for kind in a.sets:
        layers, k, N, n, stacked, ff = SETS[kind]
        shape = f"{layers} × ({k}, {N}, {n})" if stacked else f"{layers * k} × ({N}, {n})"
        print(
            f"\n{kind} ({a.parallel}): Stiefel({N}, {n}) weights {shape}" + (f" + {layers} × {ff}×{ff}" if ff else "")
        )
        print(
            f"{'ranks':>5}  {'optimizer':<20} {'step comm MiB':>13} {'fwd+bwd MiB':>11} {'params MiB':>10} "
            f"{'state MiB':>9} {'peak MiB':>8} {'step ms':>8}"
        )
        for world in a.worlds:
            for which in OPTIMIZERS:
                r = run(kind, world, which, args)
                rows.append({"set": kind, "world": world, "optimizer": which, **r})
                print(
                    f"{world:>5}  {which:<20} {_mib(r['step_bytes']):>13} {_mib(r['fwd_bwd_bytes']):>11} "
                    f"{_mib(r['param_bytes']):>10} {_mib(r['state_bytes']):>9} {_mib(r['peak_growth']):>8} "
                    f"{1e3 * r['step_s']:>8.1f}",
                    flush=True,
                )
    out = {"benchmark": "sharded_step", "config": {**args, "worlds": a.worlds, "sets": a.sets}, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(main() and 0)
