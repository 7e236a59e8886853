"""Cost of one geoarray Stiefel-Adam step relative to a plain ``torch.optim.Adam`` step, same process.

Two weight sets:

* the paper's vision transformer (section 4): 16 layers × 7 heads × {Q, K, V} = 336 projections on
  Stiefel(49, 7), plus the Euclidean weights (16 feed-forward 49×49 matrices and biases, a 10×49
  classification matrix);
* one large weight on Stiefel(4096, 128).

The baseline is ``torch.optim.Adam`` (its default multi-tensor implementation) on tensors of the same
shapes, all Euclidean. geoarray runs Algorithm 1 with Adam, Householder sections and the geodesic
retraction, with ``group_same_shape=True`` (one batched call for the 336 heads) and, for comparison,
without grouping. Gradients are fixed random tensors; only the optimizer step is timed.

Also prints the orthonormality drift max‖YᵀY − I‖ of the ViT projections after 1000 float32 steps.

    python benchmarks/optimizer_step.py [--dtype float32|float64] [--drift-steps 1000]
"""

from __future__ import annotations

import argparse
import time

import optree
import torch
from _timing import best_time

import geoarray
from geoarray import as_namespace, optim
from geoarray.manifolds import Stiefel


def vit_weights(xp, dtype):
    M = Stiefel(49, 7)
    seeds = geoarray.random.spawn(0, 4)
    heads = M.random(seeds[0], xp=xp, batch_shape=(336,), dtype=dtype)
    params = {
        "heads": [heads[i, ...] for i in range(336)],
        "ff_w": [
            geoarray.random.normal(s, (49, 49), xp=xp, dtype=dtype, scale=0.1)
            for s in geoarray.random.spawn(seeds[1], 16)
        ],
        "ff_b": [
            geoarray.random.normal(s, (49,), xp=xp, dtype=dtype, scale=0.1) for s in geoarray.random.spawn(seeds[2], 16)
        ],
        "cls": geoarray.random.normal(seeds[3], (10, 49), xp=xp, dtype=dtype, scale=0.1),
    }
    manifolds = {"heads": [M] * 336, "ff_w": [None] * 16, "ff_b": [None] * 16, "cls": None}
    return params, manifolds


def large_weight(xp, dtype):
    M = Stiefel(4096, 128)
    return {"W": M.random(0, xp=xp, dtype=dtype)}, {"W": M}


def _grads(params, dtype, xp, seed=99):
    leaves = optree.tree_leaves(params)
    seeds = iter(geoarray.random.spawn(seed, len(leaves)))
    return optree.tree_map(
        lambda p: geoarray.random.normal(next(seeds), tuple(p.shape), xp=xp, dtype=dtype, scale=1e-2), params
    )


def time_geoarray(params, manifolds, grads, group):
    opt = optim.Adam(lr=1e-3, group_same_shape=group, on_nonfinite="ignore")
    state = opt.init(params, manifolds)
    holder = {"p": params, "s": state}

    def step():
        holder["p"], holder["s"] = opt.update(holder["p"], grads, holder["s"])
        return holder["p"]

    return best_time(step, repeat=5)


def time_torch_adam(params, grads):
    leaves = [p.detach().clone().requires_grad_(True) for p in optree.tree_leaves(params)]
    for leaf, g in zip(leaves, optree.tree_leaves(grads), strict=True):
        leaf.grad = g.clone()
    opt = torch.optim.Adam(leaves, lr=1e-3, betas=(0.9, 0.99), eps=3e-7**0.5)

    def step():
        opt.step()
        return leaves[0]

    return best_time(step, repeat=5)


def drift(dtype, steps, xp):
    params, manifolds = vit_weights(xp, dtype)
    opt = optim.Adam(lr=1e-3, group_same_shape=True, on_nonfinite="ignore")
    state = opt.init(params, manifolds)
    for k in range(steps):
        if k % 100 == 0:  # fresh random gradients every 100 steps
            grads = _grads(params, dtype, xp, seed=k)
        params, state = opt.update(params, grads, state)
    Y = xp.stack(params["heads"])
    return float(xp.max(xp.abs(xp.matrix_transpose(Y) @ Y - geoarray.linalg.eye(7, Y))))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--drift-steps", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    xp = as_namespace(torch)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, CPU")
    print(f"{'weight set':<34} {'torch Adam':>11} {'geoarray':>11} {'ratio':>7}")
    for name, make in [("ViT: 336×St(49,7) + Euclidean", vit_weights), ("St(4096,128)", large_weight)]:
        params, manifolds = make(xp, dtype)
        grads = _grads(params, dtype, xp)
        t_ref = time_torch_adam(params, grads)
        for group in (True, False):
            if not group and name.startswith("St("):
                continue
            t = time_geoarray(params, manifolds, grads, group)
            label = f"{name}{' (grouped)' if group else ' (per leaf)'}"
            print(f"{label:<34} {t_ref * 1e3:>9.2f}ms {t * 1e3:>9.2f}ms {t / t_ref:>7.1f}")
    start = time.perf_counter()
    err = drift(dtype, args.drift_steps, xp)
    print(
        f"ViT projections after {args.drift_steps} {args.dtype} Adam steps: max|YᵀY − I| = {err:.2e} "
        f"({time.perf_counter() - start:.1f}s)"
    )


if __name__ == "__main__":
    main()
