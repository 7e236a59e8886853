"""Cost of a ``geoarray.torch.PaperAdam`` step relative to the core's batched update on the same weights.

``PaperAdam`` runs the core's own algorithm (``geoarray.optim.Adam``, the paper's variant), so the
difference is the wrapper.

The weights are the paper's vision transformer (Brantner, *Generalizing Adam to Manifolds for
Efficiently Training Transformers*, section 4): 16 layers × 7 heads × {Q, K, V} = 336 projections
on Stiefel(49, 7), 16 feed-forward 49×49 matrices and biases and a 10×49 classification matrix,
in two layouts:

* ``per-head``: 336 separate (49, 7) ManifoldParameters (the worst case for per-parameter overhead);
* ``stacked``: 48 ManifoldParameters of shape (7, 49, 7), as ``geoarray.torch.nn.MultiHeadAttention``
  registers them.

Both sides run Algorithm 1 with Adam, Householder sections, the geodesic retraction and
``group_same_shape=True``. The core is ``geoarray.optim.Adam.update`` on plain tensors (pure: it
returns new tensors); the torch optimizer additionally checks the gradients, reads ``lr`` from the
param group and writes the results into the parameters (``torch._foreach_copy_``). Gradients are
fixed random tensors; after 3 warm-up steps the two alternate for 30 timed steps each and
the medians are reported.

    python benchmarks/torch_optimizer.py [--dtype float32|float64] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import geoarray
import geoarray.torch as gt
from geoarray import Stiefel


def weights(layout: str, dtype: torch.dtype):
    M = Stiefel(49, 7)
    seeds = geoarray.random.spawn(0, 4)
    heads = M.random(seeds[0], xp=torch, batch_shape=(336,), dtype=dtype)
    if layout == "per-head":
        stiefel = [heads[i] for i in range(336)]
    else:
        stiefel = [heads[7 * i : 7 * (i + 1)] for i in range(48)]
    euclid = [
        geoarray.random.normal(s, (49, 49), xp=torch, dtype=dtype, scale=0.1)
        for s in geoarray.random.spawn(seeds[1], 16)
    ]
    euclid += [
        geoarray.random.normal(s, (49,), xp=torch, dtype=dtype, scale=0.1) for s in geoarray.random.spawn(seeds[2], 16)
    ]
    euclid += [geoarray.random.normal(seeds[3], (10, 49), xp=torch, dtype=dtype, scale=0.1)]
    leaves = [t.clone() for t in stiefel + euclid]
    manifolds = [M] * len(stiefel) + [None] * len(euclid)
    return leaves, manifolds


def _timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(layout: str, dtype: torch.dtype) -> tuple[float, float]:
    leaves, manifolds = weights(layout, dtype)
    g = torch.Generator().manual_seed(1)
    grads = [1e-3 * torch.randn(tuple(x.shape), generator=g, dtype=dtype) for x in leaves]

    core = geoarray.optim.Adam(lr=1e-3)
    box = {"leaves": [x.clone() for x in leaves]}
    box["state"] = core.init(box["leaves"], manifolds)

    def core_step():
        box["leaves"], box["state"] = core.update(box["leaves"], grads, box["state"])

    params = [
        gt.ManifoldParameter(x.clone(), m) if m is not None else torch.nn.Parameter(x.clone())
        for x, m in zip(leaves, manifolds, strict=True)
    ]
    for p, gr in zip(params, grads, strict=True):
        p.grad = gr.clone()
    opt = gt.PaperAdam(params, lr=1e-3)  # the core's algorithm: the difference is the wrapper

    for _ in range(3):  # warm-up
        core_step()
        opt.step()
    # alternate the two, step by step, so that load from other processes hits both alike
    t_core, t_torch = [], []
    for _ in range(30):
        t_core.append(_timed(core_step))
        t_torch.append(_timed(opt.step))
    return statistics.median(t_core), statistics.median(t_torch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {args.dtype}, {args.threads} thread(s); median of 30 steps each")
    for layout in ("per-head", "stacked"):
        t_core, t_torch = measure(layout, dtype)
        print(
            f"{layout:>9}: core update {1e3 * t_core:7.2f} ms   "
            f"geoarray.torch.PaperAdam.step {1e3 * t_torch:7.2f} ms   ratio {t_torch / t_core:.3f}"
        )


if __name__ == "__main__":
    main()
