"""One optimizer step on a square orthogonal weight: geoarray.torch.Adam against torch and geoopt.

The copying task's recurrent weight (``examples/copying_problem.py``; issue #28 measured it at 128×128):
W ∈ Stiefel(n, n) = O(n). Steps timed, interleaved in one process (``_timing.interleaved_medians``:
alternating order, medians), on the same fixed gradient:

* ``geoarray``: :class:`geoarray.torch.Adam` (torch's conventions) on a ManifoldParameter — Algorithm 1
  of Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers* (Riemannian
  gradient, lift to g^hor, Adam's moments there, retraction);
* ``geoarray-paper``: :class:`geoarray.torch.PaperAdam` (the paper's variant, same algorithm);
* ``torch``: ``torch.optim.Adam`` on the plain weight (no constraint: the floor of an Adam step);
* ``geoopt``: ``geoopt.optim.RiemannianAdam`` on a ``geoopt.ManifoldParameter`` on
  ``geoopt.Stiefel()`` (its default canonical metric and Cayley retraction), if geoopt is installed.

Every optimizer steps its own copy of the weight; the gradient is a fixed random matrix (its
magnitude does not change the work). Printed: the median step in ms and the ratio to torch's Adam
and to geoopt's; ``--json`` writes them with the command and the machine.

Square weights take their own path (:class:`geoarray.manifolds.SquareSection`, λ = Y through one
Newton–Schulz polar step, and :func:`geoarray.manifolds.retraction.retract_square`, exp(A) from the n×n
block). Measured 2026-11-25 (torch 2.13 CPU, ``OMP_NUM_THREADS=1 --steps 200``, 2 shared cores, five runs):
float32 geoarray 0.80–0.88 ms = 0.98–1.07× geoopt and 4.3–4.7× torch.optim.Adam (before: 2.25 ms, 2.8×
geoopt); float64 1.16–1.21× geoopt. The step is nine n×n products (section 2, lift 1, exp 3–5,
application 1): ≤ 2× torch's Adam is out of reach for any retraction-based step at this size
(geoopt's is 4.2–4.6×).

With ``--floor`` (2026-11-27, ``OMP_NUM_THREADS=1 --floor --steps 400``, four runs, float32, one other job
on the second core): geoarray 1.39–1.51 ms = 4.41–4.73× torch.optim.Adam (0.30–0.33 ms) and 0.65–0.69×
geoopt (6.65–7.08×); ``floor`` 1.69–1.81× but max|YᵀY − I| = 1.7e-5 after 403 steps (it drifts);
``floor-bjorck`` 2.05–2.22× with 7.2e-7 (geoarray: 6.0e-7), 3.3e-7 from geoarray's weight. So an eager
step with the library's accuracy is above 2× torch's Adam even written out by hand, with no checks and
no tree handling; what geoarray adds on top of it (~0.8 ms: the non-finite policy, the layout, ~45 more
small operations and their dispatch) is what a fused kernel would remove.

``--floor`` also times two hand-written steps of the same update, the cheapest an eager step can be
(not library code; they exist to show where ≤ 2× torch's Adam stands): ``floor``, the lift
A = YᵀG − GᵀY (1 product), Adam's moments on A in place with torch's conventions, exp(D) by its
degree-3 Taylor polynomial (2 products; at lr 1e-4 the step D has ‖D‖₁ ≤ 0.04, so the truncation is
≤ ‖D‖₁⁴/24 ≈ 1e-7) and Y ← Y·exp(D) (1 product): 4 products and 12 elementwise operations, no checks
— but nothing holds Y on the manifold against float32 rounding; ``floor-bjorck``, the same plus the one
Björck step Y(3I − YᵀY)/2 that the library's square path applies each step (2 products). After the
timing (every stepper took the same number of steps from the same start and gradient) the script
prints each floor's max|YᵀY − I| and its distance to geoarray's weight (the same algorithm: with an
exact exp it equals ``gt.Adam`` to 7e-16 in float64).

``--kernels`` also times, interleaved, the pieces of the general (N > n) step on this shape and the n×n
kernel the square path uses instead (for n = N the horizontal part B is empty and exp(W)E = exp(A)):

* ``section-householder``: the Householder section of the weight (QR of the n×n point, compact WY), the
  general path's;
* ``section-square``: the square path's section (two n×n products);
* ``retraction-2n``: the general path's retraction kernel, φ₁ of the 2n×2n matrix X of eq. 21 with
  G = 0 (:func:`geoarray.manifolds.retraction.retract_e`);
* ``exp-n``: the square path's exp(A) on the n×n skew block alone (``retract_square``);
* ``matmul-n``: one n×n product, the unit of the step's cost (the square step has nine);
* ``torch-adam``: torch.optim.Adam's step, for scale.

``--anatomy`` counts, after the timing, what one step of each optimizer dispatches: the torch operations
that reach torch's dispatcher from Python (a ``TorchDispatchMode``; views included) and the Python
functions it calls (``sys.setprofile``). Issue #51's overhead in those terms (2026-11-30, float32, n = 128):
geoarray.torch.Adam 48 operations and 419 Python calls (365 once a step reused an unchanged param group's
key; 40 and 361 once exp(A) took A itself and made one identity), ``floor-bjorck`` 23 and 10, torch.optim.Adam
11 and 59; a py-spy profile (``--native``) of the same
eager step put 32% of its samples in the Python interpreter, ~39% in dispatch (ATen's dispatcher, torch's
Python bindings and their allocations) and 26% in the kernels (GEMM 17%, elementwise 10%).

``--replay`` splits each step into its torch operations and the Python around them: one step of each
optimizer is recorded (every ATen operation that reaches torch's dispatcher from Python, with copies of its
arguments; torch.optim's profiler markers left out) and its operations are replayed back to back from
Python, one call each and nothing else, timed interleaved with the steps themselves. ``replay_ms`` is
then what the optimizer's own sequence of operations costs without its library code around it: no
implementation of that sequence in eager Python can be faster, so ``step ÷ replay`` is the share the
Python adds and ``replay ÷ floor-bjorck's replay`` what the sequence itself costs over the floor's. In-place
operations of a replay act on their recorded copies at every repetition (values drift; shapes and work do
not). Issue #51 asks for the square step within 1.25× of ``floor-bjorck``; measured (2026-11-30,
``OMP_NUM_THREADS=1 --floor --replay --steps 300``, three runs, float32, n = 128) geoarray's step took
2.11–2.13× ``floor-bjorck``'s, its 38 operations replayed alone 1.26–1.33× the floor's 23 replayed alone, and
the step 1.27–1.37× its own replay: with no Python at all the sequence would still miss 1.25×, so the goal
needs fewer passes over memory (a fused step), not only less Python.

    OMP_NUM_THREADS=1 python benchmarks/square_step.py [--n 128] [--dtype float32] [--steps 200]
        [--kernels] [--floor] [--anatomy] [--replay] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import geoarray
import geoarray.torch as gt

try:
    from _timing import interleaved_medians, machine_info
except ImportError:  # imported as benchmarks._timing or by path
    import importlib.util
    import os

    _spec = importlib.util.spec_from_file_location("_timing", os.path.join(os.path.dirname(__file__), "_timing.py"))
    _timing = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_timing)
    interleaved_medians, machine_info = _timing.interleaved_medians, _timing.machine_info


def _steppers(n: int, dtype: torch.dtype, lr: float) -> tuple[dict, dict]:
    """The timed optimizer steps by name, and geoarray's weight (compared with the floors after timing)."""
    M = geoarray.Stiefel(n, n)
    start = M.random(0, xp=torch, dtype=dtype)
    grad = torch.randn(n, n, generator=torch.Generator().manual_seed(1), dtype=dtype)
    out = {}

    def make(param: torch.Tensor, opt: torch.optim.Optimizer):
        param.grad = grad.clone()

        def step() -> None:
            opt.step()  # on the CPU: synchronous

        return step

    W = gt.ManifoldParameter(start.clone(), M)
    out["geoarray"] = make(W, gt.Adam([W], lr=lr))
    Wp = gt.ManifoldParameter(start.clone(), M)
    out["geoarray-paper"] = make(Wp, gt.PaperAdam([Wp], lr=lr))
    T = torch.nn.Parameter(start.clone())
    out["torch"] = make(T, torch.optim.Adam([T], lr=lr))
    try:
        import geoopt
    except ImportError:
        geoopt = None
    if geoopt is not None:
        G = geoopt.ManifoldParameter(start.clone(), manifold=geoopt.Stiefel())
        out["geoopt"] = make(G, geoopt.optim.RiemannianAdam([G], lr=lr))
    return out, {"geoarray": W}


def _floors(n: int, dtype: torch.dtype, lr: float) -> tuple[dict, dict]:
    """The two hand-written floor steps of the module docstring, and their weights (read after timing)."""
    M = geoarray.Stiefel(n, n)
    start = M.random(0, xp=torch, dtype=dtype)
    grad = torch.randn(n, n, generator=torch.Generator().manual_seed(1), dtype=dtype)
    eye = torch.eye(n, dtype=dtype)
    beta1, beta2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults, as geoarray.torch.Adam's
    fns, weights = {}, {}
    for name, bjorck in (("floor", False), ("floor-bjorck", True)):
        Y, m, v, t = start.clone(), torch.zeros_like(start), torch.zeros_like(start), [0]

        @torch.no_grad()
        def step(Y=Y, m=m, v=v, t=t, bjorck=bjorck) -> None:
            t[0] += 1
            Q = torch.addmm(Y, Y, Y.mT @ Y - eye, alpha=-0.5) if bjorck else Y  # Y(3I − YᵀY)/2
            A = Q.mT @ grad
            A = A - A.mT  # the lift to the Lie algebra: YᵀG − GᵀY
            m.lerp_(A, 1 - beta1)
            v.mul_(beta2).addcmul_(A, A, value=1 - beta2)
            D = torch.div(m, (v / (1 - beta2 ** t[0])).sqrt_().add_(eps)).mul_(-lr / (1 - beta1 ** t[0]))
            E = torch.addmm(eye + D, D @ D, (D / 6).add_(eye, alpha=0.5))  # I + D + D²(I/2 + D/6)
            Y.copy_(Q @ E)

        fns[name], weights[name] = step, Y
    return fns, weights


def _kernels(n: int, dtype: torch.dtype) -> dict:
    from geoarray.manifolds.retraction import retract_e, retract_square
    from geoarray.manifolds.sections import householder_section

    xp = geoarray.as_namespace(torch)
    M = geoarray.Stiefel(n, n)
    Y = M.random(0, xp=torch, dtype=dtype)
    g = torch.Generator().manual_seed(2)
    A = torch.randn(n, n, generator=g, dtype=dtype)
    A = A - A.mT
    A = A * (0.05 / A.abs().sum(-2).max())  # ‖A‖₁ of an Adam step at lr 1e-3
    halfA, gram, B = A / 2, torch.zeros(n, n, dtype=dtype), torch.zeros(0, n, dtype=dtype)
    T = torch.nn.Parameter(Y.clone())
    T.grad = torch.randn(n, n, generator=g, dtype=dtype)
    adam = torch.optim.Adam([T], lr=1e-4)
    top, _ = retract_e(halfA, gram, B, xp=xp, method="geodesic", max_doublings=8)
    fast = retract_square(halfA, xp=xp, method="geodesic", max_doublings=8)
    # the two kernels compute the same exp(A): the square path changes rounding only
    agree = float((top - fast).abs().max())
    fns = {
        "section-householder": lambda: householder_section(Y),
        "section-square": lambda: M.global_section(Y),
        "retraction-2n": lambda: retract_e(halfA, gram, B, xp=xp, method="geodesic", max_doublings=8),
        "exp-n": lambda: retract_square(halfA, xp=xp, method="geodesic", max_doublings=8),
        "matmul-n": lambda: Y @ A,
        "torch-adam": adam.step,
    }
    return fns, agree


def _anatomy(steppers: dict) -> dict:
    """Per stepper, what one more step dispatches: ``torch_ops``, the ATen operations that reach torch's
    dispatcher from Python (views such as a transpose included: each is a dispatch, and a composite such as
    ``matmul`` counts as the kernels it becomes), and ``python_calls``, the Python functions it calls (its
    own, the library's and torch.optim's). Two more steps per stepper, after the timing and the weights'
    comparison; the counting itself is not timed."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    out = {}
    for name, step in steppers.items():
        counter = _Count()
        with counter:
            step()
        calls = [0]

        def count_calls(frame, event, arg, calls=calls):
            if event == "call":
                calls[0] += 1

        sys.setprofile(count_calls)
        try:
            step()
        finally:
            sys.setprofile(None)
        out[name] = {"torch_ops": counter.ops, "python_calls": calls[0]}
    return out


def _copies(x: object) -> object:
    """``x`` with every strided tensor in it copied (a recorded operation's arguments)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone() if x.layout == torch.strided else x
    if isinstance(x, (list, tuple)):
        return type(x)(_copies(v) for v in x)
    if isinstance(x, dict):
        return {k: _copies(v) for k, v in x.items()}
    return x


def _replays(steppers: dict) -> dict:
    """Per stepper, ``(replay, count)``: a function that calls, back to back, the ATen operations of its third
    step (the first builds the optimizer's state; recorded with a ``TorchDispatchMode``, each with copies of
    its arguments), and how many there are; torch.optim's ``profiler`` markers are not recorded (bookkeeping
    of its step wrapper, no work). Every stepper takes the same three steps here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    out = {}
    for name, step in steppers.items():
        step()
        step()
        calls: list = []

        class _Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None, calls=calls):
                kwargs = kwargs or {}
                if func.namespace != "profiler":
                    calls.append((func, _copies(args), _copies(kwargs)))
                return func(*args, **kwargs)

        with _Record():
            step()

        def replay(calls=calls) -> None:
            for func, args, kwargs in calls:
                func(*args, **kwargs)

        out[name] = (replay, len(calls))
    return out


def main(argv: list[str] | None = None) -> dict:
    import shlex

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kernels", action="store_true", help="also time the pieces of the square step")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the hand-written floor steps (their degree-3 exp is meant for --lr up to 1e-4)",
    )
    parser.add_argument(
        "--anatomy",
        action="store_true",
        help="also count, per optimizer, the torch operations and Python calls of one step (untimed)",
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="also time each step's own torch operations replayed without its Python (the op sequence's cost)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.n < 1 or args.steps < 1:
        parser.error(f"--n and --steps must be at least 1, got {args.n} and {args.steps}")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    steppers, weights = _steppers(args.n, dtype, args.lr)
    if args.floor:
        floor_fns, floor_weights = _floors(args.n, dtype, args.lr)
        steppers.update(floor_fns)
        weights.update(floor_weights)
    timed = dict(steppers)
    replays = {}
    if args.replay:
        replays = _replays(steppers)
        timed.update({f"{name} (replay)": fn for name, (fn, _) in replays.items()})
    medians = interleaved_medians(timed, args.steps)
    replay_ms = {name: medians.pop(f"{name} (replay)") for name in replays}
    rows = []
    print(f"one Adam step on a {args.n}×{args.n} orthogonal weight, {args.dtype}, {args.threads} thread(s), "
          f"median of {args.steps} interleaved steps")  # fmt: skip
    for name, t in medians.items():
        row = {"optimizer": name, "median_ms": 1e3 * t, "vs_torch": t / medians["torch"]}
        if "geoopt" in medians:
            row["vs_geoopt"] = t / medians["geoopt"]
        replayed = ""
        if name in replay_ms:
            row["replay_ms"] = 1e3 * replay_ms[name]
            row["replay_ops"] = replays[name][1]
            row["step_over_replay"] = t / replay_ms[name]
            replayed = (
                f"  ops replayed {row['replay_ms']:7.3f} ms ({row['replay_ops']} ops, "
                f"step {row['step_over_replay']:4.2f}×)"
            )
            if "floor-bjorck" in replay_ms:
                row["replay_vs_floor_bjorck_replay"] = replay_ms[name] / replay_ms["floor-bjorck"]
                replayed += f", {row['replay_vs_floor_bjorck_replay']:4.2f}× floor-bjorck's replay"
        rows.append(row)
        vs_geoopt = f"  {row['vs_geoopt']:5.2f}× geoopt" if "vs_geoopt" in row else ""
        print(f"{name:15s} {row['median_ms']:7.3f} ms  {row['vs_torch']:5.2f}× torch.optim.Adam{vs_geoopt}{replayed}")
    floor = None
    if args.floor:
        eye = torch.eye(args.n, dtype=dtype)
        with torch.no_grad():
            Yg = weights["geoarray"].detach()
            floor = {
                name: {
                    "max_abs_orthogonality_error": float((Y.mT @ Y - eye).abs().max()),
                    "max_abs_difference_to_geoarray": float((Y - Yg).abs().max()),
                }
                for name, Y in weights.items()
            }
        print(f"after {args.steps + 3 + (3 if args.replay else 0)} steps from the same start:")
        for name, f in floor.items():
            print(f"  {name:15s} max|YᵀY − I| {f['max_abs_orthogonality_error']:.1e}   "
                  f"max|Y − Y_geoarray| {f['max_abs_difference_to_geoarray']:.1e}")  # fmt: skip
    anatomy = None
    if args.anatomy:
        anatomy = _anatomy(steppers)
        base = "floor-bjorck" if "floor-bjorck" in anatomy else "torch"
        print(f"one step's dispatches (× {base}'s):")
        for name, a in anatomy.items():
            ops, calls = a["torch_ops"], a["python_calls"]
            print(f"  {name:15s} {ops:4d} torch operations ({ops / anatomy[base]['torch_ops']:4.1f}×)  "
                  f"{calls:5d} Python calls ({calls / anatomy[base]['python_calls']:5.1f}×)")  # fmt: skip
    kernels = None
    if args.kernels:
        fns, agree = _kernels(args.n, dtype)
        km = interleaved_medians(fns, args.steps)
        kernels = {name: {"median_ms": 1e3 * t, "vs_torch_adam": t / km["torch-adam"]} for name, t in km.items()}
        kernels["max_abs_difference_retraction_2n_vs_exp_n"] = agree
        print(f"pieces of the step (max |retraction-2n − exp-n| = {agree:.1e}):")
        for name, t in km.items():
            print(f"  {name:19s} {1e3 * t:7.3f} ms  {t / km['torch-adam']:6.2f}× torch.optim.Adam's step")
    result = {
        "command": "python benchmarks/square_step.py " + shlex.join(argv),
        "anatomy": anatomy,
        "kernels": kernels,
        "floor": floor,
        "machine": machine_info(args.threads),
        "n": args.n,
        "dtype": args.dtype,
        "steps": args.steps,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
