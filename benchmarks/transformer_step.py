"""Transformer-sized Stiefel steps: the Q/K/V weights of GPT-2 small, medium and large as Stiefel frames.

Each attention head's query, key and value projection is a frame on St(d_model, 64): GPT-2 small has
12 layers × 12 heads × 3 = 432 frames of St(768, 64) (21 M parameters), medium 24 × 16 × 3 = 1,152 of
St(1024, 64) (75 M), large 36 × 20 × 3 = 2,160 of St(1280, 64) (177 M). ``--layout stacks`` (default)
holds one (3·heads, d_model, 64) tensor per layer, ``leaves`` one (d_model, 64) tensor per frame.
Gradients are fixed normal draws of scale 1e-2; the rate is 1e-3 everywhere.

Contenders per backend, each against the backend's Euclidean Adam on the same arrays:

=======  ==========================================================  ==============================================
backend  geoarray                                                    baseline
=======  ==========================================================  ==============================================
torch    ``geoarray.torch.Adam`` on ``ManifoldParameter`` s            ``torch.optim.Adam(foreach=True)``
numpy    ``geoarray.optim.Adam().update(..., donate=True)``           Adam written in place with NumPy's ufuncs
jax      ``jax.jit(opt.update, donate_argnums=(0, 2))``               ``optax.adam`` under ``jax.jit``, donated
=======  ==========================================================  ==============================================

``--optimizer ManifoldMuon`` (torch): ``geoarray.torch.ManifoldMuon`` (manifold Muon, its default dual
iterations and retraction) against ``torch.optim.Muon``, which takes 2-D parameters only and so holds one
(d_model, 64) tensor per frame whatever the layout (its Newton–Schulz steps run frame by frame either way);
both at torch's defaults otherwise (momentum 0.95, Nesterov), ``torch.optim.Muon`` without weight decay
(geoarray's has none).

Time: one process, the contenders' steps interleaved (``_timing.interleaved_medians``), median of
``--steps`` after warm-up steps, on ``--threads`` threads. Memory: every contender in a fresh process of
its own (this script with ``--memory-of``): the growth of the peak resident set (``VmHWM``, reset before
the optimizer is built) over the resident set with parameters and gradients in place, through the
optimizer's construction and ``--memory-steps`` steps: state and working set together, as
``torch.optim.Adam``'s two moments count in its figure.

    PYTHONPATH=src python benchmarks/transformer_step.py [--sets small medium large] [--layers L]
        [--layout stacks|leaves] [--backends torch numpy jax] [--optimizer Adam|ManifoldMuon] [--steps 5] [--threads 1]
        [--memory-steps 3] [--no-memory] [--chunk-bytes B] [--drift-steps 10000] [--drift-frames 8]
        [--section-form auto|compact-wy|reconstructed|packed|block-reflector] [--json out.json]

``--drift-steps``: the largest max|YᵀY − I| of ``geoarray.torch.Adam`` on ``--drift-frames`` frames of
St(768, 64) in float32, sampled every 100 steps of fresh gradients (a frame's drift does not depend on
how many frames share its step: the pieces are computed frame by frame).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import (
    SECTION_FORM_CHOICES,
    add_timing_arguments,
    block_leaves,
    interleaved_medians,
    machine_info,
    parse_timing_arguments,
    section_form,
)

#: (d_model, heads, layers) of GPT-2's sizes; every head has a 64-dimensional query, key and value
SETS = {"small": (768, 12, 12), "medium": (1024, 16, 24), "large": (1280, 20, 36), "tiny": (64, 2, 2)}
HEAD = 64
LR = 1e-3
BACKENDS = ("torch", "numpy", "jax")
OPTIMIZERS = ("Adam", "ManifoldMuon")


def torch_ours(optimizer: str, params: list, kw: dict) -> Any:
    """geoarray's torch optimizer ``optimizer`` on ``params`` (ManifoldParameters)."""
    import geoarray.torch as gt

    return gt.Adam(params, lr=LR, **kw) if optimizer == "Adam" else gt.ManifoldMuon(params, lr=LR, **kw)


def torch_baseline(optimizer: str, params: list) -> Any:
    """torch's own optimizer for ``optimizer`` on plain ``params``: ``torch.optim.Adam(foreach=True)``, or
    ``torch.optim.Muon`` on one 2-D parameter per frame (it refuses 3-D ones): the frames of a stack are then
    new leaf parameters carrying the frames of its gradient."""
    import torch

    if optimizer == "Adam":
        return torch.optim.Adam(params, lr=LR, foreach=True)
    frames = []
    for q in params:
        if q.ndim == 2:
            frames.append(q)
            continue
        for k in range(q.shape[0]):
            f = torch.nn.Parameter(q.detach()[k].clone())
            f.grad = None if q.grad is None else q.grad[k].clone()
            frames.append(f)
    return torch.optim.Muon(frames, lr=LR, weight_decay=0.0)


def shapes(name: str, layers: int | None, layout: str) -> tuple[int, list[tuple[int, ...]]]:
    """(d_model, the leaf shapes) of a set with ``layers`` layers (None: all of the model's)."""
    d, heads, n_layers = SETS[name]
    n_layers = n_layers if layers is None else min(layers, n_layers)
    if layout == "stacks":
        return d, [(3 * heads, d, HEAD)] * n_layers
    return d, [(d, HEAD)] * (3 * heads * n_layers)


def build(backend: str, name: str, layers: int | None, layout: str) -> tuple[Any, list, list, Any]:
    """(the Stiefel manifold, points, gradients, namespace) of a set on ``backend`` (float32)."""
    import geoarray

    d, leaf_shapes = shapes(name, layers, layout)
    M = geoarray.Stiefel(d, HEAD)
    if backend == "torch":
        import torch

        xp: Any = torch
    elif backend == "jax":
        import jax.numpy as jnp

        xp = jnp
    else:
        import numpy as np

        xp = np
    points, grads = [], []
    for i, shape in enumerate(leaf_shapes):
        Y = M.random(i, xp=xp, batch_shape=shape[:-2], dtype=xp.float32)
        points.append(Y)
        grads.append(geoarray.random.normal(1000 + i, shape, xp=xp, dtype=xp.float32, scale=1e-2))
    return M, points, grads, xp


def contenders(
    backend: str, name: str, layers: int | None, layout: str, chunk_bytes: int | None, optimizer: str = "Adam"
) -> dict:
    """``{name: step}`` for geoarray's optimizer and the baseline, each on its own copy of the weights."""
    import geoarray
    from geoarray import optim

    M, points, grads, xp = build(backend, name, layers, layout)
    kw = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes if chunk_bytes > 0 else None}
    if backend == "torch":
        import torch

        import geoarray.torch as gt

        ours = [gt.ManifoldParameter(Y.clone(), M) for Y in points]
        theirs = [torch.nn.Parameter(Y.clone()) for Y in points]
        for p, q, G in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = G.clone(), G.clone()
        opt_ours, opt_theirs = torch_ours(optimizer, ours, kw), torch_baseline(optimizer, theirs)
        if optimizer != "Adam":
            return {"geoarray": opt_ours.step, "adam": opt_theirs.step}
        # the kernels' floor (issue #52): per layer's stack of frames one Householder QR (geqrf) and six
        # (N×n)·(n×n) products, the least a section, a lift and a retraction of every frame take
        heads = 3 * SETS[name][1]
        stacks = [
            torch.stack(points[i : i + heads]) if points[i].ndim == 2 else points[i]
            for i in range(0, len(points), heads if points[0].ndim == 2 else 1)
        ]
        factors = [torch.randn(*Y.shape[:-2], HEAD, HEAD, dtype=Y.dtype) for Y in stacks]

        def floor() -> None:
            for Y, F in zip(stacks, factors, strict=True):
                torch.geqrf(Y)
                for _ in range(6):
                    torch.bmm(Y, F)

        return {"geoarray": opt_ours.step, "adam": opt_theirs.step, "floor": floor}
    if backend == "numpy":
        import numpy as np

        opt = optim.Adam(lr=LR, **kw)
        holder = [list(points), opt.init(list(points), [M] * len(points))]

        def ours_step() -> None:
            holder[0], holder[1] = opt.update(holder[0], grads, holder[1], donate=True)

        weights = [np.array(Y) for Y in points]
        moments = [(np.zeros_like(Y), np.zeros_like(Y)) for Y in points]
        count = [0]

        def adam_step() -> None:  # torch.optim.Adam's update, in place with NumPy's ufuncs
            count[0] += 1
            t = count[0]
            b1, b2, eps = 0.9, 0.999, 1e-8
            for W, G, (m, v) in zip(weights, grads, moments, strict=True):
                m *= b1
                m += (1 - b1) * G
                v *= b2
                v += (1 - b2) * G * G
                denom = np.sqrt(v / (1 - b2**t))
                denom += eps
                W -= (LR / (1 - b1**t)) * m / denom

        return {"geoarray": ours_step, "adam": adam_step}
    import jax
    import optax

    opt = optim.Adam(lr=LR, **kw)
    state = opt.init(list(points), [M] * len(points))
    update = jax.jit(opt.update, donate_argnums=(0, 2))
    holder: list = [[xp.array(Y) for Y in points], state]

    def jax_ours() -> None:
        holder[0], holder[1] = update(holder[0], grads, holder[1])
        block_leaves(holder[0])

    tx = optax.adam(LR)

    @jax.jit
    def optax_step(p: Any, s: Any) -> tuple:
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    donated = jax.jit(optax_step, donate_argnums=(0, 1))
    theirs: list = [[xp.array(Y) for Y in points], None]
    theirs[1] = tx.init(theirs[0])

    def jax_theirs() -> None:
        theirs[0], theirs[1] = donated(*theirs)
        block_leaves(theirs[0])

    # the kernels' floor as on torch: per layer's stack one geqrf and six (N×n)·(n×n) products, chained so
    # that XLA cannot merge them
    stacks = [xp.stack(points[i : i + 3 * SETS[name][1]]) for i in range(0, len(points), 3 * SETS[name][1])]
    stacks = stacks if points[0].ndim == 2 else list(points)
    factors = [xp.eye(HEAD, dtype=Y.dtype) + 1e-3 * xp.ones((*Y.shape[:-2], HEAD, HEAD), dtype=Y.dtype) for Y in stacks]

    @jax.jit
    def floor_kernels(stacks: list, factors: list) -> list:
        out = []
        for Y, F in zip(stacks, factors, strict=True):
            out.append(xp.linalg.qr(Y, mode="r"))
            Z = Y
            for _ in range(6):
                Z = Z @ F
            out.append(Z)
        return out

    def floor() -> None:
        block_leaves(floor_kernels(stacks, factors))

    del geoarray
    return {"geoarray": jax_ours, "adam": jax_theirs, "floor": floor}


def pin_threads(threads: int) -> None:
    """Every library of this process (and of the memory runs it starts) on ``threads`` threads, set before
    JAX and SciPy's OpenBLAS (JAX's LAPACK on the CPU) are loaded; a caller's settings win. Run as a
    script only: ``main`` called from a test leaves the test process's environment alone (its memory runs
    are pinned by :func:`memory_row`)."""
    os.environ.update(pinned_env(threads, os.environ))


def pinned_env(threads: int, env: Any) -> dict:
    """The variables that put OpenMP, OpenBLAS, MKL and XLA's CPU client on ``threads`` threads, less those
    that ``env`` sets already."""
    wanted = {var: str(threads) for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads == 1:
        wanted["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return {k: v for k, v in wanted.items() if k not in env}


def _rss_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure_memory(args: argparse.Namespace) -> dict:
    """In this (fresh) process: the peak RSS growth of one contender (module docstring), in MiB."""
    backend, who = args.memory_of.split(":")
    M, points, grads, _ = build(backend, args.sets[0], args.layers, args.layout)
    kw = {} if args.chunk_bytes is None else {"chunk_bytes": args.chunk_bytes if args.chunk_bytes > 0 else None}
    if backend == "torch":
        import torch

        import geoarray.torch as gt

        torch.set_num_threads(args.threads)
        if who == "geoarray":
            params = [gt.ManifoldParameter(Y, M) for Y in points]
        else:
            params = [torch.nn.Parameter(Y) for Y in points]
        for p, G in zip(params, grads, strict=True):
            p.grad = G
        del points
        if who != "geoarray":  # built now: torch's Muon copies the frames of stacks into parameters of their own
            baseline = torch_baseline(args.optimizer, params)
    if backend == "jax":  # compiled first, from shapes alone: XLA's compiler memory is not the step's
        steps = jax_memory_step(who, M, points, grads, kw)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:  # resets VmHWM to the current RSS
        fh.write("5")
    base = _rss_kib("VmRSS")
    if backend == "torch":
        opt = torch_ours(args.optimizer, params, kw) if who == "geoarray" else baseline
        for _ in range(args.memory_steps):
            opt.step()
    elif backend == "numpy":
        steps = contenders_numpy_memory(who, M, points, grads, kw)
        for _ in range(args.memory_steps):
            steps()
    else:
        for _ in range(args.memory_steps):
            steps()
    return {"contender": args.memory_of, "growth_mib": (_rss_kib("VmHWM") - base) / 1024}


def contenders_numpy_memory(who: str, M: Any, points: list, grads: list, kw: dict) -> Any:
    """One NumPy contender's step on ``points`` themselves (no copies kept), for the memory figure."""
    import numpy as np

    from geoarray import optim

    if who == "geoarray":
        opt = optim.Adam(lr=LR, **kw)
        holder = [points, opt.init(points, [M] * len(points))]

        def step() -> None:
            holder[0], holder[1] = opt.update(holder[0], grads, holder[1], donate=True)

        return step
    moments = [(np.zeros_like(Y), np.zeros_like(Y)) for Y in points]

    def adam() -> None:
        for W, G, (m, v) in zip(points, grads, moments, strict=True):
            m *= 0.9
            m += 0.1 * G
            v *= 0.999
            v += 0.001 * G * G
            denom = np.sqrt(v)
            denom += 1e-8
            W -= LR * m / denom

    return adam


def jax_memory_step(who: str, M: Any, points: list, grads: list, kw: dict) -> Any:
    """A JAX contender's donated, jitted step compiled from abstract shapes; its state is made at the first
    call (after the memory baseline), as torch's optimizers make theirs."""
    import jax
    import optax

    from geoarray import optim

    if who == "geoarray":
        opt = optim.Adam(lr=LR, **kw)
        init = lambda p: opt.init(p, [M] * len(p))  # noqa: E731
        update = jax.jit(opt.update, donate_argnums=(0, 2))
        shapes = jax.eval_shape(init, points)
        compiled = update.lower(points, grads, shapes).compile()
        step = lambda p, s: compiled(p, grads, s)  # noqa: E731
    else:
        tx = optax.adam(LR)
        init = tx.init

        def raw(p: Any, s: Any) -> tuple:
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        compiled = jax.jit(raw, donate_argnums=(0, 1)).lower(points, jax.eval_shape(init, points)).compile()
        step = compiled
    holder: list = [points, None]

    def run() -> None:
        if holder[1] is None:
            holder[1] = init(holder[0])
        holder[0], holder[1] = step(holder[0], holder[1])
        block_leaves(holder[0])

    return run


def memory_row(args: argparse.Namespace, backend: str, name: str, who: str) -> float | None:
    """The peak RSS growth of ``who`` in a fresh process (MiB), or None where it cannot be measured."""
    if not Path("/proc/self/clear_refs").exists():
        return None
    cmd = [sys.executable, __file__, "--memory-of", f"{backend}:{who}", "--sets", name, "--layout", args.layout]
    cmd += ["--memory-steps", str(args.memory_steps), "--threads", str(args.threads), "--optimizer", args.optimizer]
    cmd += [] if args.layers is None else ["--layers", str(args.layers)]
    cmd += [] if args.chunk_bytes is None else ["--chunk-bytes", str(args.chunk_bytes)]
    cmd += ["--section-form", args.section_form]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    env.update(pinned_env(args.threads, env))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the memory run of {who} on {backend} failed: {out.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["growth_mib"])


def bench(args: argparse.Namespace, backend: str, name: str) -> dict:
    _, leaf_shapes = shapes(name, args.layers, args.layout)
    n_params = sum(math.prod(s) for s in leaf_shapes)
    start = time.perf_counter()
    fns = contenders(backend, name, args.layers, args.layout, args.chunk_bytes, args.optimizer)
    setup = time.perf_counter() - start
    med = interleaved_medians(fns, args.steps, warmup=2)
    row = {
        "set": name,
        "layout": args.layout,
        "backend": backend,
        "optimizer": args.optimizer,
        "frames": sum(math.prod(s[:-2]) for s in leaf_shapes),
        "params_m": n_params / 1e6,
        "geoarray_ms": 1e3 * med["geoarray"],
        "adam_ms": 1e3 * med["adam"],
        "ratio": med["geoarray"] / med["adam"],
        "geoarray_ms_per_m": 1e3 * med["geoarray"] / (n_params / 1e6),
        "setup_s": setup,
    }
    if "floor" in med:  # torch: the QR-and-products floor timed among them
        row.update(floor_ms=1e3 * med["floor"], floor_ratio=med["geoarray"] / med["floor"])
    if not args.no_memory:
        ours, theirs = memory_row(args, backend, name, "geoarray"), memory_row(args, backend, name, "adam")
        row.update(geoarray_mib=ours, adam_mib=theirs)
        row["memory_ratio"] = ours / theirs if ours is not None and theirs else None
        row["geoarray_mib_per_m"] = None if ours is None else ours / (n_params / 1e6)
    return row


def drift(steps: int, frames: int, every: int = 100) -> dict:
    """float32 drift of ``geoarray.torch.Adam`` on ``frames`` frames of St(768, 64) (GPT-2 small's shape)
    over ``steps`` steps with fresh gradients (normal, scale 1e-2, seeded): the largest max|YᵀY − I| seen
    every ``every`` steps and at the end."""
    import torch

    import geoarray
    import geoarray.torch as gt

    M = geoarray.Stiefel(SETS["small"][0], HEAD)
    p = gt.ManifoldParameter(M.random(0, xp=torch, batch_shape=(frames,), dtype=torch.float32), M)
    opt = gt.Adam([p], lr=LR)
    gen = torch.Generator().manual_seed(0)
    eye = torch.eye(HEAD, dtype=torch.float32)
    worst = 0.0
    for k in range(1, steps + 1):
        p.grad = 1e-2 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        opt.step()
        if k % every == 0 or k == steps:
            with torch.no_grad():
                worst = max(worst, float((p.mT @ p - eye).abs().max()))
    return {"drift_steps": steps, "drift_frames": frames, "max_abs_YtY_minus_I": worst}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["small"], choices=list(SETS))
    parser.add_argument("--layers", type=int, default=None, help="take only the first L layers of each set")
    parser.add_argument("--layout", choices=["stacks", "leaves"], default="stacks")
    parser.add_argument("--backends", nargs="+", default=["torch"], choices=list(BACKENDS))
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="Adam",
        help="Adam: geoarray's against the backend's Euclidean Adam; ManifoldMuon (torch only): "
        "geoarray.torch.ManifoldMuon against torch.optim.Muon",
    )
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="time only")
    parser.add_argument("--chunk-bytes", type=int, default=None, help="geoarray's chunk_bytes (0: whole groups)")
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--drift-steps", type=int, default=0, help="also: float32 drift over this many torch steps")
    parser.add_argument("--drift-frames", type=int, default=8, help="frames of St(768, 64) for --drift-steps")
    parser.add_argument(
        "--section-form",
        default="auto",
        choices=SECTION_FORM_CHOICES,
        help="geoarray.set_section_form for geoarray's steps (auto: the measured rule; block-reflector: matrix "
        "products only)",
    )
    add_timing_arguments(parser, steps=5)
    args = parse_timing_arguments(parser, argv)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be at least 1, got {args.layers}")
    if args.optimizer != "Adam" and set(args.backends) != {"torch"}:
        parser.error(f"--optimizer {args.optimizer} runs on torch only (against torch.optim.Muon): --backends torch")
    with section_form(args.section_form):
        return _run(args)


def _run(args: argparse.Namespace) -> list[dict]:
    if args.memory_of is not None:
        print(json.dumps(measure_memory(args)))
        return []
    if "torch" in args.backends:
        import torch

        torch.set_num_threads(args.threads)
    rows = []
    print(
        f"{'set':7} {'layout':6} {'backend':7} {'frames':>6} {'M params':>8} {'geoarray ms':>11} "
        f"{'Adam ms' if args.optimizer == 'Adam' else 'Muon ms':>8} "
        f"{'ratio':>6} {'ms/M':>6} {'geoarray MiB':>12} {'Adam MiB':>8} {'mem ratio':>9} {'floor ms':>8} {'÷ floor':>7}"
    )
    for name in args.sets:
        for backend in args.backends:
            row = bench(args, backend, name)
            rows.append(row)

            def fmt(v: Any, spec: str) -> str:
                return format(v, spec) if isinstance(v, (int, float)) else format("—", spec.split(".")[0].rstrip("f"))

            print(
                f"{name:7} {args.layout:6} {backend:7} {row['frames']:6d} {row['params_m']:8.1f} "
                f"{row['geoarray_ms']:11.1f} {row['adam_ms']:8.1f} {row['ratio']:5.2f}× "
                f"{row['geoarray_ms_per_m']:6.1f} "
                f"{fmt(row.get('geoarray_mib'), '12.0f')} {fmt(row.get('adam_mib'), '8.0f')} "
                f"{fmt(row.get('memory_ratio'), '8.2f')}{'×' if row.get('memory_ratio') else ''} "
                f"{fmt(row.get('floor_ms'), '8.1f')} {fmt(row.get('floor_ratio'), '6.2f')}"
                f"{'×' if row.get('floor_ratio') else ''}",
                flush=True,
            )
    if args.drift_steps > 0:
        row = drift(args.drift_steps, args.drift_frames)
        rows.append(row)
        print(
            f"float32 drift, geoarray.torch.Adam, {args.drift_frames} × St(768, 64), {args.drift_steps} steps: "
            f"max|YᵀY − I| ≤ {row['max_abs_YtY_minus_I']:.2e}"
        )
    if args.json:
        out = {
            "benchmark": "transformer_step",
            "rows": rows,
            "config": vars(args),
            "machine": machine_info(args.threads),
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return rows


if __name__ == "__main__":
    _threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv[:-1] else "1"  # its default
    if _threads.isdigit():
        pin_threads(int(_threads))
    main()
