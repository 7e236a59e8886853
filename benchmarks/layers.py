"""Forward + pullback time of VolumePreservingAttention: analytic vjp against torch autograd.

For a batch of 1024 sequences, d = 32 and T ∈ {4, 16, 64}, in one process:

* ``analytic``  — ``layer.vjp(params, x)`` then ``pullback(dy)`` on torch tensors (geoarray's hand-written
  reverse mode, array-API code only);
* ``autograd``  — ``layer.apply`` on tensors with ``requires_grad`` then ``torch.autograd.grad`` (the same
  forward code, torch's tape for the backward);
* ``numpy``     — the analytic vjp on NumPy arrays (what NumPy/CuPy users train with).

The three are timed interleaved (one call of each per round) and the best round of each is kept, so
that load from other processes on a shared machine hits them alike. Ratios are autograd / analytic and
numpy / analytic (> 1: the analytic torch path is faster). float64, CPU.

    python benchmarks/layers.py              # torch on 1 thread (stable on a busy 2-core machine)
    python benchmarks/layers.py --threads 2
"""

from __future__ import annotations

import argparse
import time

import array_api_compat.numpy as np_xp
import numpy as np

from geoarray import random
from geoarray.nn.volume_preserving import VolumePreservingAttention

BATCH, DIM, SEQ_LENS = 1024, 32, (4, 16, 64)


def _best_times(fns: dict, rounds: int) -> dict:
    for fn in fns.values():  # warm-up
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per T (default 15)")
    args = parser.parse_args()

    import array_api_compat.torch as torch_xp
    import torch

    torch.set_num_threads(args.threads)
    print(
        f"VolumePreservingAttention (skew A), batch {BATCH}, d = {DIM}, float64, torch {torch.__version__} on "
        f"{args.threads} thread(s); forward + pullback, best of {args.rounds} interleaved rounds, ms"
    )
    print(f"{'T':>4} {'analytic':>10} {'autograd':>10} {'numpy':>10} {'autograd/analytic':>18} {'numpy/analytic':>15}")
    for T in SEQ_LENS:
        layer = VolumePreservingAttention(DIM, T)
        p_t = layer.init(0, xp=torch_xp, dtype="float64")
        x_t = random.normal(1, (BATCH, T, DIM), xp=torch_xp, dtype="float64")
        dy_t = random.normal(2, (BATCH, T, DIM), xp=torch_xp, dtype="float64")
        p_n = layer.init(0, xp=np_xp)
        x_n, dy_n = np.asarray(x_t), np.asarray(dy_t)

        def analytic(layer=layer, p_t=p_t, x_t=x_t, dy_t=dy_t):
            _, pullback = layer.vjp(p_t, x_t)
            return pullback(dy_t)

        def autograd(layer=layer, p_t=p_t, x_t=x_t, dy_t=dy_t):
            A = p_t["A"].detach().requires_grad_(True)
            x = x_t.detach().requires_grad_(True)
            y = layer.apply({"A": A}, x)
            return torch.autograd.grad(y, (A, x), grad_outputs=dy_t)

        def numpy_analytic(layer=layer, p_n=p_n, x_n=x_n, dy_n=dy_n):
            _, pullback = layer.vjp(p_n, x_n)
            return pullback(dy_n)

        # the paths compute the same gradients
        (dA, dx), (gA, gx) = analytic(), autograd()
        assert torch.allclose(dA["A"], gA, rtol=1e-9, atol=1e-9) and torch.allclose(dx, gx, rtol=1e-9, atol=1e-9)
        assert np.allclose(numpy_analytic()[1], dx.numpy(), rtol=1e-9, atol=1e-9)

        t = _best_times({"an": analytic, "ag": autograd, "np": numpy_analytic}, args.rounds)
        print(
            f"{T:>4} {1e3 * t['an']:>10.2f} {1e3 * t['ag']:>10.2f} {1e3 * t['np']:>10.2f} "
            f"{t['ag'] / t['an']:>18.2f} {t['np'] / t['an']:>15.2f}"
        )


if __name__ == "__main__":
    main()
