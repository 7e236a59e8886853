"""Cost of one manifold Adam step relative to plain Adam on the same weights, in the same process.

Weight sets (float32, Stiefel, ``geoarray.optim.Adam`` with its defaults):

* ``vit``: the 336 Q/K/V projections of the vision transformer of Brantner's paper, Stiefel(49, 7), as one
  batched (336, 49, 7) tensor;
* ``1024x64`` and ``4096x128``: one Stiefel weight each;
* ``vit-leaves``: the same 336 projections plus the 33 Euclidean weights of the ViT as 369 separate leaves
  (grouping happens inside the optimizer, by default).

Baselines, per backend: torch — ``torch.optim.Adam`` (its default foreach implementation) on tensors of the
same shapes; JAX — ``optax.adam`` under ``jax.jit`` against ``jax.jit(opt.update)`` (compile time reported
apart); NumPy — geoarray's Adam on the same arrays as Euclidean leaves (plain Adam, the same code path minus
the manifold). geoopt's RiemannianAdam is timed as a peer when geoopt is installed. Median of ``--steps``
timed steps after warm-up. Ratios are what matters: absolute times depend on the machine and its load.

    python benchmarks/optimizer_step.py [--backends torch jax numpy] [--steps 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import optree

import geoarray
from geoarray import optim

SETS = ("vit", "1024x64", "4096x128", "vit-leaves")


def _median_time(step, steps: int, sync=lambda out: None) -> float:
    for _ in range(3):
        sync(step())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        sync(step())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def weights(name: str, xp, dtype):
    if name == "vit":
        M = geoarray.Stiefel(49, 7)
        return {"W": M.random(0, xp=xp, batch_shape=(336,), dtype=dtype)}, {"W": M}
    if name in ("1024x64", "4096x128"):
        N, n = map(int, name.split("x"))
        M = geoarray.Stiefel(N, n)
        return {"W": M.random(0, xp=xp, dtype=dtype)}, {"W": M}
    M = geoarray.Stiefel(49, 7)
    heads = M.random(0, xp=xp, batch_shape=(336,), dtype=dtype)
    params = {
        "heads": [heads[i, ...] for i in range(336)],
        "ff_w": [geoarray.random.normal(i, (49, 49), xp=xp, dtype=dtype, scale=0.1) for i in range(16)],
        "ff_b": [geoarray.random.normal(100 + i, (49,), xp=xp, dtype=dtype, scale=0.1) for i in range(16)],
        "cls": geoarray.random.normal(200, (10, 49), xp=xp, dtype=dtype, scale=0.1),
    }
    return params, {"heads": [M] * 336, "ff_w": [None] * 16, "ff_b": [None] * 16, "cls": None}


def gradients(params, xp, dtype):
    leaves, treedef = optree.tree_flatten(params)
    return treedef.unflatten(
        [geoarray.random.normal(7 + i, tuple(p.shape), xp=xp, dtype=dtype, scale=1e-2) for i, p in enumerate(leaves)]
    )


def time_geoarray(params, manifolds, grads, steps, update_wrapper=lambda f: f, sync=lambda out: None):
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params, manifolds)
    update = update_wrapper(opt.update)
    holder = [params, state]

    def step():
        holder[0], holder[1] = update(holder[0], grads, holder[1])
        return holder[0]

    start = time.perf_counter()
    sync(step())
    first = time.perf_counter() - start
    return _median_time(step, steps, sync), first


def bench_torch(name, steps):
    import torch

    xp = geoarray.as_namespace(torch)
    params, manifolds = weights(name, xp, torch.float32)
    grads = gradients(params, xp, torch.float32)
    t_ga, _ = time_geoarray(params, manifolds, grads, steps)
    leaves = [p.detach().clone().requires_grad_(True) for p in optree.tree_leaves(params)]
    for leaf, g in zip(leaves, optree.tree_leaves(grads), strict=True):
        leaf.grad = g.clone()
    adam = torch.optim.Adam(leaves, lr=1e-3)
    t_ref = _median_time(lambda: adam.step(), steps)
    row = {"set": name, "backend": "torch", "geoarray_ms": t_ga * 1e3, "adam_ms": t_ref * 1e3, "ratio": t_ga / t_ref}
    try:
        import geoopt
    except ImportError:
        row["geoopt"] = "not installed (pip install geoopt)"
    else:
        gparams = [
            geoopt.ManifoldParameter(p.detach().clone(), manifold=geoopt.Stiefel())
            if isinstance(m, geoarray.Stiefel)
            else torch.nn.Parameter(p.detach().clone())
            for p, m in zip(
                optree.tree_leaves(params),
                optree.tree_leaves(manifolds, is_leaf=lambda x: x is None, none_is_leaf=True),
                strict=True,
            )
        ]
        for p, g in zip(gparams, optree.tree_leaves(grads), strict=True):
            p.grad = g.clone()
        radam = geoopt.optim.RiemannianAdam(gparams, lr=1e-3)
        t_geoopt = _median_time(lambda: radam.step(), steps)
        row["geoopt_ms"] = t_geoopt * 1e3
        row["geoopt_over_geoarray"] = t_geoopt / t_ga
    return row


def bench_jax(name, steps):
    import jax
    import jax.numpy as jnp

    params, manifolds = weights(name, jnp, jnp.float32)
    grads = gradients(params, jnp, jnp.float32)
    block = jax.block_until_ready
    compile_start = time.perf_counter()
    t_ga, first = time_geoarray(params, manifolds, grads, steps, jax.jit, block)
    row = {"set": name, "backend": "jax", "geoarray_ms": t_ga * 1e3, "compile_s": first}
    try:
        import optax
    except ImportError:
        row["adam_ms"] = None
        row["note"] = "optax not installed: no baseline"
        return row
    tx = optax.adam(1e-3)
    ostate = tx.init(params)

    @jax.jit
    def optax_step(p, s):
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    holder = [params, ostate]

    def step():
        holder[0], holder[1] = optax_step(*holder)
        return holder[0]

    t_ref = _median_time(step, steps, block)
    row.update(adam_ms=t_ref * 1e3, ratio=t_ga / t_ref)
    del compile_start
    return row


def bench_numpy(name, steps):
    import array_api_compat.numpy as xp

    params, manifolds = weights(name, xp, xp.float32)
    grads = gradients(params, xp, xp.float32)
    t_ga, _ = time_geoarray(params, manifolds, grads, steps)
    t_ref, _ = time_geoarray(params, None, grads, steps)
    return {"set": name, "backend": "numpy", "geoarray_ms": t_ga * 1e3, "adam_ms": t_ref * 1e3, "ratio": t_ga / t_ref}


def drift(steps: int) -> float:
    """max|YᵀY − I| of the ViT projections after ``steps`` float32 Stiefel-Adam steps (torch)."""
    import torch

    xp = geoarray.as_namespace(torch)
    params, manifolds = weights("vit", xp, torch.float32)
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params, manifolds)
    for k in range(steps):
        if k % 100 == 0:  # fresh random gradients every 100 steps
            grads = {"W": geoarray.random.normal(k, (336, 49, 7), xp=xp, dtype=torch.float32, scale=1e-2)}
        params, state = opt.update(params, grads, state)
    Y = params["W"]
    return float(xp.max(xp.abs(xp.matrix_transpose(Y) @ Y - geoarray.linalg.eye(7, Y))))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["torch", "jax", "numpy"], choices=["torch", "jax", "numpy"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--drift-steps", type=int, default=1000)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = []
    for backend in args.backends:
        if backend == "torch":
            import torch

            torch.set_num_threads(args.threads)
        bench = {"torch": bench_torch, "jax": bench_jax, "numpy": bench_numpy}[backend]
        print(f"\n{backend}: geoarray Stiefel-Adam step vs plain Adam on the same weights (median of {args.steps})")
        print(f"{'weights':<12} {'plain Adam':>11} {'geoarray':>11} {'ratio':>7}  notes")
        for name in args.sets:
            row = bench(name, args.steps)
            rows.append(row)
            notes = []
            if "compile_s" in row:
                notes.append(f"first call (compile) {row['compile_s']:.1f} s")
            if "geoopt_ms" in row:
                notes.append(
                    f"geoopt RiemannianAdam {row['geoopt_ms']:.2f} ms = {row['geoopt_over_geoarray']:.1f}× geoarray"
                )
            elif "geoopt" in row:
                notes.append(f"geoopt {row['geoopt']}")
            ref = f"{row['adam_ms']:>9.3f}ms" if row.get("adam_ms") else f"{'—':>11}"
            ratio = f"{row['ratio']:>7.1f}" if "ratio" in row else f"{'—':>7}"
            print(f"{name:<12} {ref} {row['geoarray_ms']:>9.3f}ms {ratio}  {'; '.join(notes)}", flush=True)
    if args.drift_steps and "torch" in args.backends:
        err = drift(args.drift_steps)
        rows.append({"drift_steps": args.drift_steps, "max_abs_YtY_minus_I": err})
        print(
            f"\nViT projections after {args.drift_steps} float32 Stiefel-Adam steps (torch): max|YᵀY − I| = {err:.2e}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
