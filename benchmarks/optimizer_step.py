"""Cost of one manifold Adam step relative to plain Adam on the same weights, in the same process.

Weight sets (float32, Stiefel, ``geoarray.optim.Adam`` with its defaults):

* ``vit``: the 336 Q/K/V projections of the vision transformer of Brantner's paper, Stiefel(49, 7), as one
  batched (336, 49, 7) tensor;
* ``1024x64`` and ``4096x128``: one Stiefel weight each;
* ``vit-leaves``: the same 336 projections plus the 33 Euclidean weights of the ViT as 369 separate leaves
  (grouping happens inside the optimizer, by default);
* ``tiny``: 8 × Stiefel(16, 4), batched, for smoke tests (not in the default ``--sets``).

Baselines, per backend: torch — ``torch.optim.Adam`` (its default foreach implementation, β = (0.9, 0.99))
on tensors of the same shapes; JAX — ``optax.adam`` under ``jax.jit`` against ``jax.jit(opt.update)``
(compile time reported apart); NumPy — geoarray's Adam on the same arrays as Euclidean leaves (plain Adam,
the same code path minus the manifold). geoopt's ``RiemannianAdam`` on ``geoopt.Stiefel()`` (its default,
canonical metric) is timed as a peer when geoopt is installed (``pip install geoopt``; else one line says
so), and its float32 orthogonality drift is reported beside geoarray's.

Method: every optimizer gets its own copy of the weights and a fixed random gradient; after 3 warm-up
steps, ``--steps`` rounds call each optimizer once, interleaved in alternating order (so load from other
processes on a shared machine hits all alike), and the tables give the medians. Ratios are what matters:
absolute times depend on the machine and its load.

Latest measurement (main `c577f85`; every library on one thread — ``OMP_NUM_THREADS=1
OPENBLAS_NUM_THREADS=1``, ``--threads 1``, XLA single-threaded —, float32, each run the median of 30,
here the median of six runs for torch and NumPy and of three for JAX; AMD EPYC Zen 4, 2 vCPUs shared
with other jobs, load average 0.4–1.1; the runs, with the previous main alongside, in
benchmarks/README.md), ratio = geoarray / plain Adam:

==========  =====  =====  =====  =================
set         torch  jax    numpy  geoopt / geoarray
==========  =====  =====  =====  =================
vit         6.7×   15.7×  7.4×   5.0×
1024x64     6.8×   9.6×   9.1×   17×
4096x128    8.5×   12.3×  16.7×  70×
vit-leaves  0.6×   1.5×   2.0×   12×
==========  =====  =====  =====  =================

Drift after 1000 float32 steps on the ViT set: geoarray 6.0e-7, geoopt 3.5e-5. JAX compile: 0.7–1.0 s,
vit-leaves 6.6–8.2 s.

    python benchmarks/optimizer_step.py [--backends torch jax numpy] [--steps 30] [--json out.json]
        [--torch-compile [MODE]]   # also torch.compile(opt.update) with inductor
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import optree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import interleaved_medians, machine_info

import geoarray
from geoarray import optim

SETS = ("vit", "1024x64", "4096x128", "vit-leaves")
ALL_SETS = (*SETS, "tiny")


def weights(name: str, xp, dtype):
    if name == "vit":
        M = geoarray.Stiefel(49, 7)
        return {"W": M.random(0, xp=xp, batch_shape=(336,), dtype=dtype)}, {"W": M}
    if name == "tiny":
        M = geoarray.Stiefel(16, 4)
        return {"W": M.random(0, xp=xp, batch_shape=(8,), dtype=dtype)}, {"W": M}
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


def geoarray_step(params, manifolds, grads, update_wrapper=lambda f: f, sync=lambda out: None):
    """A step function of geoarray's Adam on its own copy of the state, and the seconds of its first call."""
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params, manifolds)
    update = update_wrapper(opt.update)
    holder = [params, state]

    def step():
        holder[0], holder[1] = update(holder[0], grads, holder[1])
        sync(holder[0])

    start = time.perf_counter()
    step()
    return step, time.perf_counter() - start


def _geoopt():
    try:
        import geoopt
    except ImportError:
        return None
    return geoopt


GEOOPT_MISSING = "geoopt not installed: pip install geoopt to compare"


def bench_torch(name, steps, compile_mode=None):
    import torch

    xp = geoarray.as_namespace(torch)
    params, manifolds = weights(name, xp, torch.float32)
    grads = gradients(params, xp, torch.float32)
    ga_step, _ = geoarray_step(params, manifolds, grads)
    compiled = None
    if compile_mode is not None:
        # torch.compile(opt.update) with inductor: the first call (compilation) is reported apart
        compiled, compile_s = geoarray_step(
            params, manifolds, grads, lambda f: torch.compile(f, fullgraph=True, mode=compile_mode)
        )
    leaves = [p.detach().clone().requires_grad_(True) for p in optree.tree_leaves(params)]
    for leaf, g in zip(leaves, optree.tree_leaves(grads), strict=True):
        leaf.grad = g.clone()
    adam = torch.optim.Adam(leaves, lr=1e-3, betas=(0.9, 0.99))
    fns = {"geoarray": ga_step, "adam": adam.step}
    geoopt = _geoopt()
    if geoopt is not None:
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
        geoopt_step = geoopt.optim.RiemannianAdam(gparams, lr=1e-3, betas=(0.9, 0.99)).step
    # interleaved, alternating order: load from other processes hits all optimizers alike; geoopt in a
    # pass of its own, so that its much larger working set does not evict the others' caches
    med = interleaved_medians(fns, steps)
    if geoopt is not None:
        med["geoopt"] = interleaved_medians({"geoopt": geoopt_step, "adam": adam.step}, steps)["geoopt"]
    t_ga, t_ref = med["geoarray"], med["adam"]
    row = {"set": name, "backend": "torch", "geoarray_ms": t_ga * 1e3, "adam_ms": t_ref * 1e3, "ratio": t_ga / t_ref}
    if compiled is not None:
        cmed = interleaved_medians({"compiled": compiled, "adam": adam.step}, steps)
        row.update(
            compiled_ms=cmed["compiled"] * 1e3,
            compiled_ratio=cmed["compiled"] / cmed["adam"],
            compiled_compile_s=compile_s,
        )
    if geoopt is None:
        row["geoopt"] = GEOOPT_MISSING
    else:
        row["geoopt_ms"] = med["geoopt"] * 1e3
        row["geoopt_over_adam"] = med["geoopt"] / t_ref
        row["geoopt_over_geoarray"] = med["geoopt"] / t_ga
    return row


def bench_jax(name, steps):
    import jax
    import jax.numpy as jnp

    params, manifolds = weights(name, jnp, jnp.float32)
    grads = gradients(params, jnp, jnp.float32)
    ga_step, first = geoarray_step(params, manifolds, grads, jax.jit, jax.block_until_ready)
    row = {"set": name, "backend": "jax", "compile_s": first}
    fns = {"geoarray": ga_step}
    try:
        import optax
    except ImportError:
        optax = None
        row["adam_ms"] = None
        row["note"] = "optax not installed: no baseline"
    else:
        tx = optax.adam(1e-3, b1=0.9, b2=0.99)

        @jax.jit
        def optax_step(p, s):
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        holder = [params, tx.init(params)]

        def step():
            holder[0], holder[1] = optax_step(*holder)
            jax.block_until_ready(holder[0])

        fns["adam"] = step
    med = interleaved_medians(fns, steps)
    row["geoarray_ms"] = med["geoarray"] * 1e3
    if "adam" in med:
        row.update(adam_ms=med["adam"] * 1e3, ratio=med["geoarray"] / med["adam"])
    return row


def bench_numpy(name, steps):
    import array_api_compat.numpy as xp

    params, manifolds = weights(name, xp, xp.float32)
    grads = gradients(params, xp, xp.float32)
    fns = {"geoarray": geoarray_step(params, manifolds, grads)[0], "adam": geoarray_step(params, None, grads)[0]}
    med = interleaved_medians(fns, steps)
    t_ga, t_ref = med["geoarray"], med["adam"]
    return {"set": name, "backend": "numpy", "geoarray_ms": t_ga * 1e3, "adam_ms": t_ref * 1e3, "ratio": t_ga / t_ref}


def _drift_gradients(k, xp, dtype):
    # fresh random gradients every 100 steps, the same sequence for every optimizer
    return geoarray.random.normal(k, (336, 49, 7), xp=xp, dtype=dtype, scale=1e-2)


def _max_orthonormality_error(Y, xp) -> float:
    return float(xp.max(xp.abs(xp.matrix_transpose(Y) @ Y - geoarray.linalg.eye(Y.shape[-1], Y))))


def drift(steps: int) -> float:
    """max|YᵀY − I| of the ViT projections after ``steps`` float32 Stiefel-Adam steps (torch)."""
    import torch

    xp = geoarray.as_namespace(torch)
    params, manifolds = weights("vit", xp, torch.float32)
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params, manifolds)
    for k in range(steps):
        if k % 100 == 0:
            grads = {"W": _drift_gradients(k, xp, torch.float32)}
        params, state = opt.update(params, grads, state)
    return _max_orthonormality_error(params["W"], xp)


def drift_geoopt(steps: int) -> float | None:
    """The same for geoopt's RiemannianAdam on geoopt.Stiefel() (canonical); None without geoopt."""
    geoopt = _geoopt()
    if geoopt is None:
        return None
    import torch

    xp = geoarray.as_namespace(torch)
    params, _ = weights("vit", xp, torch.float32)
    W = geoopt.ManifoldParameter(params["W"].detach().clone(), manifold=geoopt.Stiefel())
    opt = geoopt.optim.RiemannianAdam([W], lr=1e-3, betas=(0.9, 0.99))
    for k in range(steps):
        if k % 100 == 0:
            g = _drift_gradients(k, xp, torch.float32)
        W.grad = g.clone()
        opt.step()
    with torch.no_grad():
        return _max_orthonormality_error(W.detach(), xp)


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["torch", "jax", "numpy"], choices=["torch", "jax", "numpy"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=ALL_SETS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--drift-steps", type=int, default=1000)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument(
        "--torch-compile",
        nargs="?",
        const="default",
        default=None,
        metavar="MODE",
        help="also time torch.compile(opt.update, fullgraph=True, mode=MODE) with inductor (minutes of compilation)",
    )
    args = parser.parse_args(argv)
    rows = []
    for backend in args.backends:
        if backend == "torch":
            import torch

            torch.set_num_threads(args.threads)
        bench = {"torch": bench_torch, "jax": bench_jax, "numpy": bench_numpy}[backend]
        print(f"\n{backend}: geoarray Stiefel-Adam step vs plain Adam on the same weights (median of {args.steps})")
        if backend == "torch" and _geoopt() is None:
            print(GEOOPT_MISSING)
        print(f"{'weights':<12} {'plain Adam':>11} {'geoarray':>11} {'ratio':>7}  notes")
        for name in args.sets:
            row = bench(name, args.steps, args.torch_compile) if backend == "torch" else bench(name, args.steps)
            rows.append(row)
            notes = []
            if "compile_s" in row:
                notes.append(f"first call (compile) {row['compile_s']:.1f} s")
            if "compiled_ms" in row:
                notes.append(
                    f"torch.compile {row['compiled_ms']:.2f} ms = {row['compiled_ratio']:.1f}× Adam "
                    f"(compile {row['compiled_compile_s']:.0f} s)"
                )
            if "geoopt_ms" in row:
                notes.append(
                    f"geoopt RiemannianAdam {row['geoopt_ms']:.2f} ms = {row['geoopt_over_adam']:.1f}× Adam, "
                    f"{row['geoopt_over_geoarray']:.2f}× geoarray"
                )
            ref = f"{row['adam_ms']:>9.3f}ms" if row.get("adam_ms") else f"{'—':>11}"
            ratio = f"{row['ratio']:>7.1f}" if "ratio" in row else f"{'—':>7}"
            print(f"{name:<12} {ref} {row['geoarray_ms']:>9.3f}ms {ratio}  {'; '.join(notes)}", flush=True)
    if args.drift_steps and "torch" in args.backends:
        err = drift(args.drift_steps)
        row = {"drift_steps": args.drift_steps, "max_abs_YtY_minus_I": err}
        print(
            f"\nViT projections after {args.drift_steps} float32 Stiefel-Adam steps (torch): max|YᵀY − I| = {err:.2e}"
        )
        err_geoopt = drift_geoopt(args.drift_steps)
        if err_geoopt is None:
            row["geoopt"] = GEOOPT_MISSING
            print(GEOOPT_MISSING)
        else:
            row["geoopt_max_abs_YtY_minus_I"] = err_geoopt
            print(f"the same with geoopt RiemannianAdam (geoopt.Stiefel(), canonical): max|YᵀY − I| = {err_geoopt:.2e}")
        rows.append(row)
    if args.json:
        out = {"benchmark": "optimizer_step", "config": vars(args), "machine": machine_info(args.threads), "rows": rows}
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return rows


if __name__ == "__main__":
    main()
