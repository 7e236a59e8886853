"""The optimizer step on a GPU: eager, compiled and graph-captured, against torch's fused Adam and optax (#30).

For each weight set (float32, Stiefel, ``geoarray.optim.Adam(lr=1e-3)``, fixed gradients of scale 1e-2):

* ``vit``: the paper's ViT Q/K/V, 336 × Stiefel(49, 7) as one batched tensor; ``vit-leaves``: the same as
  336 separate leaves (the optimizer groups them);
* ``1024x64``, ``4096x128``: one Stiefel weight each;
* ``gpt2``: GPT-2 small's per-head Q/K/V, 12 layers × 12 heads × 3 = 432 × Stiefel(768, 64), batched;
* ``tiny``: 8 × Stiefel(16, 4), for smoke runs on the CPU.

torch variants: ``eager`` (``opt.update``; on a GPU it reads nothing to the host: ``geoarray.set_host_reads``),
``module`` (the same Adam as a torch user runs it: ``geoarray.torch.PaperAdam(...).step()`` on ManifoldParameters;
``module_graph``: ``PaperAdam(capturable=True).step()`` captured in a CUDA graph and replayed, CUDA only),
``compiled`` (``torch.compile(opt.update, fullgraph=True, options={"guard_filter_fn":
geoarray.torch.skip_guards_on_library_globals})``, inductor; compile time apart), ``graph`` (the
compiled-free step captured in a CUDA graph with static inputs, its outputs copied back into them, replayed;
CUDA only); baselines ``torch.optim.Adam(fused=True)`` and ``(foreach=True)`` on tensors of the same shapes.
JAX: ``jax.jit(opt.update, donate_argnums=(0, 2))`` against jitted ``optax.adam``.

Before timing, two eager torch steps (``opt.update``; ``module_syncs``: ``PaperAdam.step``) run under
``torch.cuda.set_sync_debug_mode("warn")``: the row says ``syncs: none`` or how many times, and where in
geoarray, the host waited for the device (CUDA only).

Timing: after warm-up, rounds of ``--inner`` steps between two device synchronisations (so the queue stays
full, as in training), ``--rounds`` rounds per variant, variants interleaved in alternating order; the
tables give the median per step and the ratio to fused Adam (torch) or optax (JAX). TF32 is off unless
``--tf32``. Variants that fail (a capture that meets a synchronisation, a compile error) are reported with
their error instead of a time.

    python benchmarks/gpu.py [--device cuda] [--sets vit vit-leaves 1024x64 4096x128 gpt2] [--rounds 30]
        [--inner 10] [--no-compile | --compile-sets SET...] [--backends torch jax]
        [--section-form auto|block-reflector|…] [--json out.json]

``--section-form block-reflector`` times the GEMM-only route of the Householder section (issue #52: no QR,
LU or triangular solve in the step), against the default rule's form in a run without it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import optree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sets import stiefel_set
from _timing import SECTION_FORM_CHOICES, cuda_sync_sites, format_sync_sites, machine_info, section_form

import geoarray
from geoarray import optim

SETS = ("vit", "vit-leaves", "1024x64", "4096x128", "gpt2")
ALL_SETS = (*SETS, "tiny")


def timed_rounds(fns: dict, sync, rounds: int, inner: int, warmup: int = 3) -> dict:
    """Median seconds per call of each function: ``inner`` calls between two ``sync()``, ``rounds`` rounds,
    interleaved in alternating order. A function that raises is reported by its error."""
    out, live = {}, {}
    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            sync()
            live[name] = fn
        except Exception as exc:  # a variant that cannot run here: report it, time the rest
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    times = {name: [] for name in live}
    names = list(live)
    for k in range(rounds):
        for name in names if k % 2 == 0 else names[::-1]:
            sync()
            start = time.perf_counter()
            for _ in range(inner):
                live[name]()
            sync()
            times[name].append((time.perf_counter() - start) / inner)
    out.update({name: statistics.median(ts) for name, ts in times.items()})
    return out


def _pure_step(opt, params, grads, state):
    holder = [params, state]

    def step():
        holder[0], holder[1] = opt.update(holder[0], grads, holder[1])

    return step


def _graph_step(torch, opt, params, grads, state):
    """The step captured in a CUDA graph: static inputs, outputs copied back into them inside the graph."""
    static_p = optree.tree_map(lambda t: t.clone(), params)
    static_s = optree.tree_map(lambda t: t.clone(), state)

    def body():
        new_p, new_s = opt.update(static_p, grads, static_s)
        for dst, src in zip(optree.tree_leaves((static_p, static_s)), optree.tree_leaves((new_p, new_s)), strict=True):
            dst.copy_(src)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs requires
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph.replay


def _module_step(torch, params, mans, grads, *, capturable: bool):
    """``geoarray.torch.PaperAdam`` (the same Adam as a ``torch.optim.Optimizer``) on ManifoldParameters whose
    ``.grad`` holds the fixed gradients: its ``step``; with ``capturable`` that step captured alone in a
    CUDA graph (after three eager warm-up steps on a side stream, torch's recipe) and replayed."""
    import geoarray.torch as gt

    is_manifold = lambda x: isinstance(x, geoarray.Stiefel)  # noqa: E731
    weights = [
        gt.ManifoldParameter(p.detach().clone(), m)
        for p, m in zip(optree.tree_leaves(params), optree.tree_leaves(mans, is_leaf=is_manifold), strict=True)
    ]
    for w, g in zip(weights, optree.tree_leaves(grads), strict=True):
        w.grad = g.clone()
    opt = gt.PaperAdam(weights, lr=1e-3, capturable=capturable)
    if not capturable:
        return opt.step
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            opt.step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    return graph.replay


def bench_torch(name: str, args) -> dict:
    import torch

    import geoarray.torch as gt

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    xp = geoarray.as_namespace(torch)
    params, mans, grads = stiefel_set(name, xp, torch.float32, device)
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params, mans)
    row = {"set": name, "backend": "torch", "device": str(device)}
    fns = {
        "eager": _pure_step(opt, params, grads, state),
        "module": _module_step(torch, params, mans, grads, capturable=False),
    }
    if cuda:
        row["syncs"] = format_sync_sites(cuda_sync_sites(torch, _pure_step(opt, params, grads, state)))
        row["module_syncs"] = format_sync_sites(cuda_sync_sites(torch, fns["module"]))
    if args.compile and name in args.compile_sets:
        guards = {"guard_filter_fn": gt.skip_guards_on_library_globals}  # fixed library globals: unguarded
        compiled = torch.compile(opt.update, fullgraph=True, options=guards)
        start = time.perf_counter()
        try:
            compiled(params, grads, state)
            sync()
            row["compile_s"] = time.perf_counter() - start
            holder = [params, state]

            def compiled_step():
                holder[0], holder[1] = compiled(holder[0], grads, holder[1])

            fns["compiled"] = compiled_step
        except Exception as exc:
            row["compiled"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if cuda:
        for key, make in (
            ("graph", lambda: _graph_step(torch, opt, params, grads, state)),
            ("module_graph", lambda: _module_step(torch, params, mans, grads, capturable=True)),
        ):
            try:
                fns[key] = make()
            except Exception as exc:
                row[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    for impl in ("fused", "foreach"):
        # row-major copies: a QR's Q comes out column-major, and fused Adam needs a weight and its
        # gradient in the same strides (on the first lease it refused them: "same dtype, device, and layout")
        row_major = {"memory_format": torch.contiguous_format}
        leaves = [p.detach().clone(**row_major).requires_grad_(True) for p in optree.tree_leaves(params)]
        for leaf, g in zip(leaves, optree.tree_leaves(grads), strict=True):
            leaf.grad = g.clone(**row_major)
        try:
            fns[f"adam_{impl}"] = torch.optim.Adam(leaves, lr=1e-3, betas=(0.9, 0.99), **{impl: True}).step
        except (RuntimeError, ValueError) as exc:  # fused Adam needs a device that has it
            row[f"adam_{impl}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    medians = timed_rounds(fns, sync, args.rounds, args.inner)
    base = medians.get("adam_fused") if isinstance(medians.get("adam_fused"), float) else medians.get("adam_foreach")
    for key, value in medians.items():
        if isinstance(value, float):
            row[f"{key}_ms"] = 1e3 * value
            if isinstance(base, float) and not key.startswith("adam"):
                row[f"{key}_over_adam"] = value / base
        else:
            row[key] = value
    return row


def bench_jax(name: str, args) -> dict:
    import jax
    import jax.numpy as jnp

    params, mans, grads = stiefel_set(name, jnp, jnp.float32)
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params, mans)
    row = {"set": name, "backend": "jax", "device": str(jax.devices()[0])}
    step = jax.jit(opt.update, donate_argnums=(0, 2))
    # donated buffers must be distinct: init shares one zero array between moments
    holder = [optree.tree_map(jnp.copy, params), optree.tree_map(jnp.copy, state)]
    start = time.perf_counter()
    holder[0], holder[1] = jax.block_until_ready(step(holder[0], grads, holder[1]))
    row["compile_s"] = time.perf_counter() - start

    def ga():
        holder[0], holder[1] = step(holder[0], grads, holder[1])

    fns = {"jit": ga}
    try:
        import optax
    except ImportError:
        row["optax"] = "optax not installed: no baseline"
    else:
        tx = optax.adam(1e-3, b1=0.9, b2=0.99)

        @jax.jit
        def optax_step(p, s):
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s

        box = [optree.tree_map(jnp.copy, params), tx.init(params)]

        def ox():
            box[0], box[1] = optax_step(box[0], box[1])

        fns["optax"] = ox

    def sync():
        jax.block_until_ready((holder, fns.get("optax") and box))

    medians = timed_rounds(fns, sync, args.rounds, args.inner)
    for key, value in medians.items():
        row[f"{key}_ms" if isinstance(value, float) else key] = 1e3 * value if isinstance(value, float) else value
    if isinstance(medians.get("optax"), float):
        row["jit_over_optax"] = medians["jit"] / medians["optax"]
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device (cuda, or cpu for a smoke run)")
    parser.add_argument("--backends", nargs="+", default=["torch", "jax"], choices=["torch", "jax"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=ALL_SETS)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--inner", type=int, default=10, help="steps between two synchronisations")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="leave out torch.compile")
    parser.add_argument(
        "--compile-sets", nargs="+", default=None, choices=ALL_SETS, help="torch.compile only these sets (default: all)"
    )
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matrix products (default: full float32)")
    parser.add_argument(
        "--section-form",
        default="auto",
        choices=SECTION_FORM_CHOICES,
        help="geoarray.set_section_form for geoarray's steps (block-reflector: the section from matrix products only)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.inner < 1:
        parser.error(f"--rounds and --inner must be at least 1, got {args.rounds} and {args.inner}")
    with section_form(args.section_form):
        return _run(args)


def _run(args: argparse.Namespace) -> list[dict]:
    if args.compile_sets is None:
        args.compile_sets = args.sets
    rows: list[dict] = []

    def emit(row: dict) -> None:  # each row printed and saved at once: a run cut short keeps what it measured
        rows.append(row)
        _print(row)
        if args.json:
            with open(args.json, "w") as f:
                out = {"benchmark": "gpu", "machine": machine_info(), "tf32": args.tf32, "rows": rows}
                json.dump({**out, "section_form": args.section_form}, f, indent=1)

    if "torch" in args.backends:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("gpu.py: torch sees no CUDA GPU; use --device cpu for a smoke run")
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        for name in args.sets:
            emit(bench_torch(name, args))
    if "jax" in args.backends:
        import jax

        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if args.tf32 else "highest")
        for name in args.sets:
            emit(bench_jax(name, args))
    return rows


def _print(row: dict) -> None:
    parts = [f"{row['backend']:5} {row['set']:10} {row['device']:>8}"]
    for key, value in row.items():
        if key.endswith("_ms"):
            parts.append(f"{key[:-3]} {value:.3f} ms")
        elif key.endswith(("_over_adam", "_over_optax")):
            parts.append(f"{key} {value:.2f}×")
        elif key in (
            "syncs",
            "module_syncs",
            "graph",
            "module_graph",
            "compiled",
            "optax",
            "adam_fused",
            "adam_foreach",
            "compile_s",
        ):
            parts.append(f"{key}: {value if not isinstance(value, float) else f'{value:.1f} s'}")
    print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
