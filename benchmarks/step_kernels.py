"""An optimizer step against the library kernels it calls, each timed alone (#30, item 3).

A Stiefel-Adam step is bound by its N×n×n products and one QR when its weights are large; for batches of
small frames, the hundred-odd small operations around them (and Python) can cost more than the kernels.
This script finds out which: it records, with a torch dispatch mode, every call to a LAPACK or GEMM kernel
(``geqrf``, ``ormqr``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``, …) during one eager step, together with
copies of its actual arguments (shapes, dtypes and strides as the step made them); it then times the
step and each recorded call alone, interleaved (``_timing.interleaved_medians``), and prints

    step ÷ Σ kernels

with the kernels summed from their medians, and the biggest kernels. A ratio near 1 means the step is
bound by its kernels; the issue's target is ≤ 1.5.

Weight sets (float32, ``geoarray.optim.Adam(lr=1e-3)``, fixed gradients of scale 1e-2): ``vit``
(336 × Stiefel(49, 7), batched), ``1024x64``, ``4096x128``; ``tiny`` (8 × Stiefel(16, 4)) for smoke tests.
torch only (the dispatch mode is torch's). ``--host-reads never`` times the fixed-work step a GPU runs.

``--floor`` also times, interleaved with the rest, a hand-written torch step of the same update on its own
copy of the weights (not library code; it shows how close to its kernels an eager step can come at all):
the same QR and section form as geoarray picks (LAPACK's packed reflectors applied by ormqr for batches
of ≥ 16 small frames, compact WY with one Björck step otherwise), the lift, Adam's moments *in place*
with the bias corrections as Python floats and the learning rate folded into the root, the balanced
retraction kernel with φ₁'s Taylor polynomial of the degree geoarray's eager step picks from the same
bound (3 for ‖X‖₁ ≤ 0.04, 5 up to 0.2, which covers Adam's steps at lr 1e-3), and the application to
the section: the same kernels, the fewest elementwise operations, no checks, no trees. It prints
``floor/kernels`` and, after the timing (both took the same number of steps from the same start), the
floor's largest distance to geoarray's weight.

``--compile`` also times ``torch.compile(opt.update, fullgraph=True)`` with inductor (the one-line compile
of #30, item 3) on its own copy of the state, interleaved with the rest: ``compiled/kernels`` against the
eager step's kernels (the compiled step calls the same LAPACK and GEMM kernels: the packed section's geqrf
and ormqr through geoarray's custom operators), its distance to the eager weight after the timing, and
the compilation's seconds; and, without a MODE, the same compile with
``options={"guard_filter_fn": geoarray.torch.skip_guards_on_library_globals}``
(``lib-guards-skipped/kernels``), each in its own dynamo cache.

Measured 2026-11-28 (torch 2.13 CPU, AMD EPYC, 2 cores, nothing else running; ``OMP_NUM_THREADS=1
--floor --compile``, default sets and steps, three runs), on three machines of the kind; the second ran
after the compiled step stopped re-evaluating scalars per vector, the third after the guard filter, the
fixed φ₁ route under ``torch.compile`` and unaliased fresh states (below):

=========  ==================  ===============  ==================  ===========================  =====================
set        geoarray ÷ kernels  floor ÷ kernels  compiled ÷ kernels  compiled, library guards      max|floor − geoarray|
                                                                    skipped, ÷ kernels
=========  ==================  ===============  ==================  ===========================  =====================
first machine
vit        1.62–1.74×          1.48–1.55×       2.05–2.16×          —                            1.1e-6
1024x64    1.42–1.54×          1.25–1.30×       1.44–1.51×          —                            1.1e-6
4096x128   1.09–1.12×          1.09–1.14×       1.07–1.10×          —                            1.0e-6
second machine
vit        1.67–1.84×          1.58–1.65×       1.78–1.94×          —                            1.1e-6
1024x64    1.48–1.56×          1.28–1.31×       1.46–1.50×          —                            1.1e-6
4096x128   1.10–1.11×          1.12×            1.07–1.08×          —                            1.0e-6
third machine
vit        1.68–1.81×          1.56–1.64×       1.55–1.63×          1.41–1.48×                   1.1e-6
1024x64    1.43–1.48×          1.25–1.28×       1.32–1.36×          1.16–1.20×                   1.1e-6
4096x128   1.10–1.11×          1.10–1.11×       1.06–1.07×          1.04×                        1.0e-6
=========  ==================  ===============  ==================  ===========================  =====================

A ratio can rise when the step gets faster: the ViT step lost a kernel (a² − BᵀB as one product,
``_backend.skew_square_minus_gram``) and an ormqr's layout copy (its argument assembled column-major),
which made it 5–7% faster (``ab_step.py``, three runs, 0.93–0.95× of the step before) and its kernels'
sum 0.1–0.15 ms smaller; the same day, before those two changes, the three runs gave 1.57–1.65× (vit),
1.47–1.58× and 1.10–1.12×, floor 1.44–1.53×, 1.27–1.32×, 1.09–1.12×. On 2026-11-27, another machine of
the kind: 1.68–1.81×, 1.71–1.81×, 1.14–1.17×. The kernels' sums move by up to 2× between runs on a shared
machine, so compare ratios from one run only.

So on the ViT set even a hand-written eager step of this update is at #30's 1.5× of its kernels, not
within it (each LAPACK call loops over 336 small matrices, and a dozen elementwise passes over the batch
lie between them), while on a single 1024×64 frame it is well within (1.3×). What geoarray adds on
top of the floor there (0.31–0.46 ms, 12–16% of its step) is spread thin over many pieces: the non-finite
policy and the Taylor rule's bound (two reductions and two scalar reads), the compact-WY factors and the
signs built from the QR (about a dozen n×n and n-vector operations), Adam's pure updates (new arrays
instead of in-place moments) and the separate learning-rate pass, and the layout, tree and shape
handling of the optimizer around them.

Compiling removes Python's and the dispatcher's work (which a GPU step pays per launch,
``benchmarks/gpu.py``) and meets #30's 1.5× on both single frames, but not on the ViT set. There,
inductor's code had re-evaluated small scalar results inside its loops: Adam's bias corrections (two
``pow`` per 16 entries of each moment), a section's signs (a strided gather and a NaN test per row), and
the Taylor polynomial's contraction over stacked powers had become a (3×2)·(2×65 856) GEMM that MKL ran
in 0.47 ms. With those stored once (``_backend.computed_once``) and the polynomial's chunks formed by
scalings under ``torch.compile``, the compiled ViT step went, on the second machine, from 4.71–4.94 ms
(2.27–2.32× its kernels, 1.23–1.30× the eager step; three runs of this script before the change) to
3.43–4.05 ms (1.78–1.94×, 1.05–1.07× the eager step), and 1024×64 from 1.52–1.55× to 1.46–1.50×.

What remained on the ViT set was mostly dynamo's guard evaluation per call (what
``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` saves: 3.29–3.37 against 3.60–3.67 ms, three
pairs). Timed alone in a tight loop the guards take 22 µs, which is why a first try of
``skip_guard_on_globals_unsafe`` measured no gain; between other work, as here and in training, checking
the guards on module globals (624 of the step's 790 then, 461 of 604 now) costs 0.2–0.3 ms. Before the
changes below, the inductor graph of the ViT step alone, called with the step's tensors, took 2.63–2.67
ms, the whole compiled call 3.11–3.21 ms with all guards and 2.79–2.87 ms with none (three interleaved
runs of 300 calls): 0.3 ms of guards and 0.15–0.2 ms of dynamo's and AOT autograd's wrappers. The
globals belong to geoarray, ``array_api_compat``, optree and torch, which a training loop does not
reassign, and ``geoarray.torch.skip_guards_on_library_globals`` drops exactly their guards. At the same time the
compiled step stopped tracing φ₁'s top Taylor rule and a ``while_loop`` of doublings where Adam's step
bound names a cheaper fixed route (degree 5 on the ViT weights; on the CPU only routes without
doublings, since the loop reads its trip count for free there), small identities entered its graph as
constants instead of ``torch.eye`` (whose index comparison kept inductor's loops over 336 × 14×14
three-dimensional with masked loads: 0.96–0.97× the compiled ViT step, three interleaved runs of 300
steps against the same compile with ``torch.eye``), geoarray's LAPACK operators were defined through
``torch.library.Library`` instead of ``custom_op`` (7.7 instead of 16.3 µs per call, three per step),
and a fresh Adam state stopped sharing one zero buffer between its two moments, which had made dynamo
compile the first step apart (the ViT step compiles in 3.2–3.4 s, once). On the third machine the
compiled ViT step took 3.01–3.22 ms with all guards and 2.72–2.93 ms with the library's skipped, against
3.26–3.57 ms eagerly: within #30's 1.5× of its kernels on all three sets with the filter, and faster than
the hand-written eager floor. What remains there: the wrappers around the graph, the scalar loops of the
7-wide norms, and the two masks of the non-finite policy over the whole batch.

    python benchmarks/step_kernels.py [--sets vit 1024x64 4096x128] [--steps 30] [--threads 1]
        [--host-reads cpu|never] [--floor] [--compile [MODE]] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _sets import stiefel_set
from _timing import add_timing_arguments, interleaved_medians, load_namespace, machine_info, parse_timing_arguments

import geoarray
from geoarray import optim

SETS = ("vit", "1024x64", "4096x128")
ALL_SETS = (*SETS, "tiny")
KERNELS = frozenset(
    {
        "geqrf",
        "ormqr",
        "linalg_householder_product",
        "linalg_solve_triangular",
        "linalg_solve",
        "linalg_lu_factor_ex",
        "linalg_lu_solve",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "dot",
        "mv",
    }
)


def _copy(x):
    import torch

    if isinstance(x, torch.Tensor):
        if 0 in x.stride():  # a broadcast operand (an expanded identity): its values, densely
            return x.clone()
        out = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device=x.device)
        return out.copy_(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(v) for v in x)
    return x


def record_kernels(step) -> list:
    """(name, shapes, call) for every kernel call of one ``step()``, with copies of its arguments."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            if name in KERNELS:
                a, k = _copy(args), _copy(kwargs)
                shapes = [tuple(x.shape) for x in args if isinstance(x, torch.Tensor)]
                calls.append((name, shapes, lambda f=func, a=a, k=k: f(*a, **k)))
            return func(*args, **kwargs)

    with Record():
        step()
    return calls


LR, BETA1, BETA2, DELTA = 1e-3, 0.9, 0.99, 3e-7  # geoarray.optim.Adam(lr=1e-3)'s update


def floor_step(Y0, G, *, lr: float = LR, beta1: float = BETA1, beta2: float = BETA2, delta: float = DELTA):
    """(step, state): the hand-written floor of the module docstring on a copy of ``Y0`` (..., N, n),
    float32, with N > n; ``state["Y"]`` is its current weight."""
    import torch

    N, n = Y0.shape[-2:]
    batch = tuple(Y0.shape[:-2])
    packed = geoarray._backend.householder_section_form(tuple(Y0.shape), load_namespace("torch")) == "packed"
    small_frames = n <= 7 and len(batch) > 0 and math.prod(batch) >= 16  # _backend.skew_square_minus_gram's rule
    zeros = lambda rows: torch.zeros(*batch, rows, n, dtype=Y0.dtype)  # noqa: E731
    state = {"Y": Y0.clone(), "t": 0, "m": (zeros(n), zeros(N - n)), "v": (zeros(n), zeros(N - n))}
    eye, eye2, one = torch.eye(n, dtype=Y0.dtype), torch.eye(2 * n, dtype=Y0.dtype), torch.ones((), dtype=Y0.dtype)
    tiny = torch.finfo(Y0.dtype).smallest_normal

    def addmm(C, A, B, alpha=1.0):  # C + α·A@B with the addition inside the GEMM
        return torch.addmm(C, A, B, alpha=alpha) if C.ndim == 2 else torch.baddbmm(C, A, B, alpha=alpha)

    @torch.no_grad()
    def step() -> None:
        Y = state["Y"]
        state["t"] += 1
        t = state["t"]
        c1, c2 = (1 - beta1) / (1 - beta1**t), (1 - beta2) / (1 - beta2**t)
        a, tau = torch.geqrf(Y)
        s = torch.copysign(one, a.diagonal(dim1=-2, dim2=-1)).unsqueeze(-1)  # S = sign(diag R)
        if packed:
            QtG = torch.ormqr(a, tau, G, left=True, transpose=True)
        else:  # compact WY: Q = I − V T Vᵀ, T⁻¹ = diag(1/τ) + striu(VᵀV)
            V = a.tril(-1)
            V.diagonal(dim1=-2, dim2=-1).fill_(1)
            T_inv = torch.triu(V.mT @ V, 1) + torch.diag_embed(1 / tau)
            T = torch.linalg.solve_triangular(T_inv, eye.expand_as(T_inv), upper=True)
            QtG = addmm(G, V, T.mT @ (V.mT @ G), alpha=-1.0)
        top = s * QtG[..., :n, :]
        lifted = (top - top.mT, QtG[..., n:, :])  # the lift [A; B] = [YᵀG − GᵀY; Q⊥ᵀG]
        for m, v, g in zip(state["m"], state["v"], lifted, strict=True):
            m.lerp_(g, c1)
            v.lerp_(g * g, c2)
        (mA, mB), (vA, vB) = state["m"], state["v"]
        ha = torch.div(mA, (vA + delta).sqrt_().mul_(-2 / lr))  # ½A of the velocity W = −lr·m/√(v + δ)
        B = torch.div(mB, (vB + delta).sqrt_().mul_(-1 / lr))
        if small_frames:  # c = a² − BᵀB = −[a; B]ᵀ[a; B] (a skew), one product, as geoarray takes it here
            stacked_t = torch.cat([ha.mT, B.mT], -1)
            low = -(stacked_t @ stacked_t.mT)
        else:
            low = addmm(ha @ ha, B.mT, B, alpha=-1.0)  # c = a² − BᵀB
        alpha = (low.abs().sum(-2).amax(-1) + tiny).sqrt_()[..., None, None]
        X = torch.cat([torch.cat([ha, alpha * eye], -1), torch.cat([low / alpha, ha], -1)], -2)
        # φ₁'s Taylor polynomial of the degree geoarray's eager step picks for the largest bound
        # ‖½A‖₁ + α ≥ ‖X‖₁ (one host read, as geoarray's): 3 on θ = 0.04 (2 products), 5 on 0.2 (3)
        bound = float((ha.abs().sum(-2).amax(-1) + alpha[..., 0, 0]).max())
        X2 = X @ X
        if bound <= 0.04:  # I + X/2 + X²(I/6 + X/24)
            U = addmm(X * 0.5 + eye2, X2, X * (1 / 24) + eye2 * (1 / 6))
        elif bound <= 0.2:  # I + X/2 + X²/6 + X³(I/24 + X/120 + X²/720)
            q1 = X * (1 / 120) + X2 * (1 / 720) + eye2 * (1 / 24)
            U = addmm(X * 0.5 + X2 * (1 / 6) + eye2, X2 @ X, q1)
        else:
            raise ValueError(f"the floor step covers ‖X‖₁ ≤ 0.2 (Adam at lr 1e-3), got a bound of {bound:.3g}")
        D = addmm(U[..., :n], U[..., n:], ha / alpha)
        D_top = D[..., :n, :]
        E_rows = addmm(alpha * D[..., n:, :] + eye, ha, D_top)
        # B·D_top as the plain product: B is row-major here, and (D_topᵀ Bᵀ)ᵀ on two transposed views is torch's
        # 10–20× slower CPU bmm (the ViT set's: 1.0 ms against 0.05 ms; _backend.matmul's comment)
        Z = torch.cat([s * E_rows, B @ D_top], -2)  # S-scaled [g(W)E]: λ·g(W)E = Q·Z
        if packed:
            state["Y"] = torch.ormqr(a, tau, Z, left=True, transpose=False)
        else:
            QZ = addmm(Z, V, T @ (V.mT @ Z), alpha=-1.0)
            state["Y"] = addmm(QZ, QZ, QZ.mT @ QZ - eye, alpha=-0.5)  # Björck: Y(3I − YᵀY)/2

    return step, state


def compiled_step(opt, params, grads, state, mode: str | None, skip_library_guards: bool = False):
    """(step, holder, seconds of the first call): ``torch.compile(opt.update, fullgraph=True)`` with
    inductor on its own copy of the state, stepped once (the compilation) before the timing; with
    ``skip_library_guards``, ``options={"guard_filter_fn": geoarray.torch.skip_guards_on_library_globals}``.
    Each call compiles into its own cache (``isolate_recompiles``), so the two variants never share a graph."""
    import time

    import torch

    import geoarray.torch as gt

    options = {"guard_filter_fn": gt.skip_guards_on_library_globals} if skip_library_guards else None
    update = torch.compile(opt.update, fullgraph=True, mode=mode, options=options, isolate_recompiles=True)
    holder = [dict(params), state]

    @torch.no_grad()
    def step():
        holder[0], holder[1] = update(holder[0], grads, holder[1])

    start = time.perf_counter()
    step()
    step()  # a second compilation, if the first step's state differs in kind from the later ones', here
    return step, holder, time.perf_counter() - start


def bench(name: str, steps: int, host_reads: str, floor: bool = False, compile_mode: str | None = None) -> dict:
    import torch

    xp = load_namespace("torch")
    params, manifolds, grads = stiefel_set(name, xp, torch.float32)
    opt = optim.Adam(lr=LR)
    holder = [params, opt.init(params, manifolds)]
    previous = geoarray.set_host_reads(host_reads)
    try:

        def step():
            holder[0], holder[1] = opt.update(holder[0], grads, holder[1])

        fns = {"step": step}
        if floor:
            floor_fn, floor_state = floor_step(params["W"], grads["W"])
            fns["floor"] = floor_fn
            floor_fn(), floor_fn()  # as many steps as geoarray's two below
        if compile_mode is not None:
            torch._dynamo.reset()  # dynamo caches by code object: another set's graph would be reused, shape-generic
            compiled_fn, compiled_holder, compile_s = compiled_step(opt, params, grads, holder[1], compile_mode or None)
            fns["compiled"] = compiled_fn
            if not compile_mode:  # torch.compile takes a mode or options, not both
                fns["compiled_lg"], lg_holder, _ = compiled_step(opt, params, grads, holder[1], None, True)
        step()
        calls = record_kernels(step)
        fns.update({f"{i}:{c[0]}": c[2] for i, c in enumerate(calls)})
        times = interleaved_medians(fns, steps)
    finally:
        geoarray.set_host_reads(previous)
    kernels = [(c[0], c[1], times[f"{i}:{c[0]}"]) for i, c in enumerate(calls)]
    total = sum(t for _, _, t in kernels)
    extra = {}
    if floor:
        extra = {
            "floor_ms": 1e3 * times["floor"],
            "ratio_floor_over_kernels": times["floor"] / total,
            "floor_max_abs_difference_to_geoarray": float((floor_state["Y"] - holder[0]["W"]).abs().max()),
        }
    if compile_mode is not None:
        extra |= {
            "compiled_ms": 1e3 * times["compiled"],
            "ratio_compiled_over_kernels": times["compiled"] / total,
            "compile_s": compile_s,
            "compiled_max_abs_difference_to_geoarray": float((compiled_holder[0]["W"] - holder[0]["W"]).abs().max()),
        }
        if "compiled_lg" in fns:
            extra |= {
                "compiled_skip_library_guards_ms": 1e3 * times["compiled_lg"],
                "ratio_compiled_skip_library_guards_over_kernels": times["compiled_lg"] / total,
                "compiled_skip_library_guards_max_abs_difference_to_geoarray": float(
                    (lg_holder[0]["W"] - holder[0]["W"]).abs().max()
                ),
            }
    return {
        "set": name,
        "host_reads": host_reads,
        "step_ms": 1e3 * times["step"],
        "kernels_ms": 1e3 * total,
        "n_kernels": len(kernels),
        "ratio_step_over_kernels": times["step"] / total,
        **extra,
        "kernels": [{"name": n, "shapes": s, "ms": 1e3 * t} for n, s, t in kernels],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=ALL_SETS)
    parser.add_argument("--host-reads", default="cpu", choices=["cpu", "never"])
    parser.add_argument("--floor", action="store_true", help="also time the hand-written floor step")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="",
        default=None,
        metavar="MODE",
        help="also time torch.compile(opt.update, fullgraph=True[, mode=MODE]) with inductor, and without MODE "
        "the same with options={'guard_filter_fn': geoarray.torch.skip_guards_on_library_globals} (a minute)",
    )
    add_timing_arguments(parser, steps=30)
    args = parse_timing_arguments(parser, argv)
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    print(f"host reads {args.host_reads!r}, {args.threads} thread(s), float32, median of {args.steps} interleaved")
    floor_head = f" {'floor ms':>8} {'floor/kernels':>13} {'|floor − step|':>14}" if args.floor else ""
    if args.compile is not None:
        floor_head += f" {'compiled ms':>11} {'compiled/kernels':>16} {'|compiled − step|':>17} {'compile s':>9}"
        if not args.compile:
            floor_head += f" {'lib-guards-skipped/kernels':>26}"
    print(
        f"{'set':9} {'step ms':>8} {'kernels ms':>10} {'kernels':>7} {'step/kernels':>12}{floor_head}   "
        "largest kernels (ms)"
    )
    for name in args.sets:
        row = bench(name, args.steps, args.host_reads, args.floor, args.compile)
        rows.append(row)
        top = sorted(row["kernels"], key=lambda k: -k["ms"])[:3]
        largest = ", ".join(f"{k['name']}{k['shapes'][0] if k['shapes'] else ''} {k['ms']:.3f}" for k in top)
        floor_cols = (
            f" {row['floor_ms']:8.3f} {row['ratio_floor_over_kernels']:12.2f}× "
            f"{row['floor_max_abs_difference_to_geoarray']:14.1e}"
            if args.floor
            else ""
        )
        if args.compile is not None:
            floor_cols += (
                f" {row['compiled_ms']:11.3f} {row['ratio_compiled_over_kernels']:15.2f}× "
                f"{row['compiled_max_abs_difference_to_geoarray']:17.1e} {row['compile_s']:9.1f}"
            )
            if "ratio_compiled_skip_library_guards_over_kernels" in row:
                floor_cols += f" {row['ratio_compiled_skip_library_guards_over_kernels']:25.2f}×"
        print(
            f"{name:9} {row['step_ms']:8.3f} {row['kernels_ms']:10.3f} {row['n_kernels']:7d} "
            f"{row['ratio_step_over_kernels']:11.2f}×{floor_cols}   {largest}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "step_kernels", "machine": machine_info(args.threads), "rows": rows}, f)
    return rows


if __name__ == "__main__":
    main()
