"""Spawning a small gloo process group for the distributed tests (DDP, ZeRO): a free loopback port,
``world`` spawned workers ``worker(rank, port, out_dir)`` that each save ``rank{r}.pt``, and their results."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: Any, out_dir: Path, world: int, timeout: float, what: str) -> list:
    """Run ``worker(rank, port, str(out_dir))`` on ``world`` spawned processes; the ``rank{r}.pt`` they
    saved, loaded with ``weights_only=True``. Fails the test (killing the workers) after ``timeout`` s."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=(free_port(), str(out_dir)), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {what} run did not finish within {timeout:.0f} s")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=True) for r in range(world)]
