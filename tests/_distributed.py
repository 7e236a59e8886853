"""Spawning a small gloo process group for the distributed tests (DDP, ZeRO, FSDP2, HSDP): a free loopback
port, ``world`` forked workers ``worker(rank, port, out_dir)`` that each save ``rank{r}.pt``, and their results."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

# The workers are forked from a server process that imported these once (``forkserver`` start method),
# instead of spawned fresh: a spawned rank spent ~3 s of CPU importing torch, ~6 s of wall time per run
# of 2 or 4 ranks on 2 cores, most of the distributed tests' time (44 → 20 s for ZeRO, FSDP2, HSDP and
# checkpointing). The server starts at the first run in a process and keeps its environment: workers
# see the environment of that moment, not of later runs (no test here sets one for its workers).
PRELOAD = [
    "pytest",
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch.distributed.optim",
    "torch.nn.parallel",
    "geoarray.torch",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leave(*, barrier: bool = True) -> None:
    """End a worker that has saved its results: wait for every rank (``barrier``), then exit the process
    at once, without tearing down its objects. The teardown of gloo process groups, DDP reducers and
    ZeRO optimizers after ``destroy_process_group`` hung now and then (a rank stuck for 240 s in the
    deallocation of its worker's locals, seen on this 2-core machine under load) or aborted ("terminate
    called without an active exception"); the results are on disk by then, so nothing is lost."""
    if barrier:
        import torch.distributed as dist

        dist.barrier()
    os._exit(0)


@contextlib.contextmanager
def process_group(rank: int, port: int, world: int) -> Iterator[None]:
    """A worker's gloo process group of ``world`` ranks on the loopback ``port`` (one thread per rank,
    collectives time out after 60 s). The worker's body runs inside; after it, every rank waits for the
    others and exits (:func:`leave`); an error tears the group down and propagates."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        yield
    except BaseException:
        dist.destroy_process_group()
        raise
    leave()  # every rank has saved its results: exit without the process group's teardown


def _traced(rank: int, worker: Any, port: int, out_dir: str, dump_after: float) -> None:
    """``worker(rank, port, out_dir)``, writing every thread's stack to ``stacks{rank}.txt`` if it is
    still running after ``dump_after`` s (so that a hung run says where it hangs)."""
    import faulthandler

    with open(Path(out_dir) / f"stacks{rank}.txt", "w") as stacks:
        faulthandler.dump_traceback_later(dump_after, repeat=False, file=stacks)
        try:
            worker(rank, port, out_dir)
        finally:
            faulthandler.cancel_dump_traceback_later()


def run_ranks(worker: Any, out_dir: Path, world: int, timeout: float, what: str) -> list:
    """Run ``worker(rank, port, str(out_dir))`` on ``world`` processes (forked from the preloaded server);
    the ``rank{r}.pt`` they saved, loaded with ``weights_only=True``. Fails the test (killing the
    workers) after ``timeout`` s, with the workers' stacks as they were shortly before."""
    import torch
    import torch.multiprocessing as mp

    mp.set_forkserver_preload(PRELOAD)
    ctx = mp.start_processes(
        _traced, args=(worker, free_port(), str(out_dir), max(1.0, timeout - 10.0)), nprocs=world, join=False,
        start_method="forkserver",
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            stacks = "\n".join(
                f"--- rank {r} ---\n" + (out_dir / f"stacks{r}.txt").read_text(errors="replace")[-3000:]
                for r in range(world)
                if (out_dir / f"stacks{r}.txt").exists()
            )
            pytest.fail(f"the {what} run did not finish within {timeout:.0f} s; the workers' stacks:\n{stacks}")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=True) for r in range(world)]
