"""Rigid body, over seeds: do long rollouts of the volume-preserving transformer stay on the sphere?

The experiment of the reference tutorial "The Volume-Preserving Transformer for the Rigid Body"
(GeometricMachineLearning.jl) scaled to what a CPU affords. Data as there: Euler's rigid-body
equations (a = 1, b = c = −½) integrated by the implicit midpoint rule with Δt = 0.2 over
t ∈ [0, ``--t-end``] from the 2 × 619 initial conditions (sin v, 0, cos v) and (0, sin v, cos v),
v = 0.1:0.01:2π (every ``--every``-th of them), cut into windows of T = ``--seq-len`` states whose
target is the next T states. Models:

* ``vpt``       ``VolumePreservingTransformer(3, T, n_blocks=2, n_linear=1, L=3)`` — the tutorial's
                  (skew-symmetric volume-preserving attention, L = 3 units, no add connection);
* ``vpff``      ``VolumePreservingFeedForward(3, n_blocks=6, n_linear=1)`` — the one-step
                  volume-preserving network with as many feed-forward blocks as the transformer;
* ``standard``  ``StandardTransformerIntegrator(3, T, n_heads=1, L=3, upscale=4)`` — the
                  unstructured baseline of the same depth.

Training as there: ``AdamWithDecay`` from η = ``--lr-start`` to ``--lr-end`` over the run, the
relative L2 loss ‖ŷ − y‖/‖y‖, float64. The budget is ``--epochs`` × ``--batch-size``-sized updates
(the tutorial: 500,000 epochs of batch 16384 on a GPU); the script states what it ran.

The factors besides the budget, each settable: ``--schedule constant`` (Adam at ``--lr-start``
instead of the decay), ``--seq-len`` T, ``--dtype float32``, ``--init`` (``zero-attention``: every
volume-preserving attention starts at A = 0, i.e. the identity; ``identity``: every A, L, U of the
volume-preserving layers at 0, the whole model the identity map), depth ``--L`` units (the VP
feed-forward network gets ``--L`` × ``--n-blocks`` blocks).

Evaluation: from held-out initial conditions (v off the training grid; the first T true states as
the start) the model is iterated ``--rollout`` steps; reported per seed: the final training loss,
the relative error ‖Z − Z_true‖/‖Z_true‖ over the rollout, the largest |‖z‖ − ‖z₀‖| along it (0 for
the true flow) and, if the rollout left — a non-finite state, or ‖z‖ off by more than 100 % (the
criterion of ``geoarray train vpt``) — the step where it did, instead of the error and drift (which
would then measure the blow-up). Every model starts from the same first T true states, so step n is
the same state for all (a one-step model's first predictions are the window's own states). The table
gives mean ± sample standard deviation over the seeds whose rollouts stayed, and how many diverged.
``--json`` writes it with every run, the command and the commit; ``--figure`` a PNG of seed 0's
rollouts on the unit sphere against the truth and every model's ‖z‖ drift over the rollout (a diverged
rollout drawn up to the step where it left).

    python examples/rigid_body_stability.py [--seeds 4] [--epochs 60] [--batch-size 1024] [--every 2]
                                            [--models vpt vpff standard] [--json results/rigid_body.json]
                                            [--figure results/rigid_body.png]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from _results import command, commit, stats, write_json

import geoarray as ga
from geoarray.commands.dynamics import DIVERGENCE_FACTOR, divergence_step, rollout
from geoarray.data import systems, windows

HELD_OUT_V = (0.555, 1.105, 1.655, 2.205, 3.305, 4.405)  # between the grid points v = 0.1:0.01:2π


INITS = ("random", "zero-attention", "identity")


def build(name: str, T: int, L: int = 3, n_blocks: int = 2):
    if name == "vpt":
        return ga.models.VolumePreservingTransformer(3, T, n_blocks=n_blocks, n_linear=1, L=L)
    if name == "vpff":
        return ga.models.VolumePreservingFeedForward(3, n_blocks=L * n_blocks, n_linear=1)
    if name == "standard":
        return ga.models.StandardTransformerIntegrator(3, T, n_heads=1, L=L, upscale=4)
    raise ValueError(f"--models: unknown model {name!r}; choose from vpt, vpff, standard")


def initial_params(model, seed: int, init: str, xp, dtype):
    """The layers' random init, or with the volume-preserving attention's A set to 0 (Cayley(0) = I: each
    attention starts as the identity), or with every A, L, U of the volume-preserving layers at 0 (the
    whole model starts as the identity map, the nearest volume-preserving map to the short-time flow).
    Only the volume-preserving models' parameters are changed; the standard transformer keeps its init."""
    params = model.init(seed, xp=xp, dtype=dtype)
    if init == "random" or not isinstance(
        model, (ga.models.VolumePreservingTransformer, ga.models.VolumePreservingFeedForward)
    ):
        return params
    zeroed = ("A",) if init == "zero-attention" else ("A", "L", "U")
    return tuple({k: (v * 0 if k in zeroed else v) for k, v in p.items()} for p in params)


def run_one(name: str, seed: int, trajectories, reference, args) -> tuple[dict, np.ndarray]:
    import array_api_compat.numpy as xp

    model = build(name, args.seq_len, args.L, args.n_blocks)
    T = args.seq_len if model.seq_len is not None else 1
    dtype = getattr(xp, args.dtype)
    x, y = windows(xp.astype(trajectories, dtype), T, T)
    steps_per_epoch = math.ceil(x.shape[0] / args.batch_size)
    if args.schedule == "decay":
        opt = ga.optim.AdamWithDecay(
            lr_start=args.lr_start, lr_end=args.lr_end, n_epochs=args.epochs, steps_per_epoch=steps_per_epoch
        )
    else:
        opt = ga.optim.Adam(lr=args.lr_start)
    t0 = time.perf_counter()
    result = ga.train.fit(
        model,
        initial_params(model, seed, args.init, xp, dtype),
        (x, y),
        opt,
        ga.nn.RelativeL2Loss(),
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=seed,
        progress=False,
    )
    with np.errstate(over="ignore", invalid="ignore"):
        start = xp.astype(reference[:, :T, :], dtype)
        pred = np.asarray(rollout(model, result.params, start, args.rollout + args.seq_len - T)).astype(np.float64)
        R = np.asarray(reference)
        norms = np.linalg.norm(pred, axis=-1)
        # every model starts from the same first T0 = --seq-len true states (a one-step model predicts
        # the states after its first): step n is state T0 − 1 + n for every model
        T0 = args.seq_len
        diverged = divergence_step(pred[:, T0 - 1 :, :], norms[:, T0 - 1 :], 1)
        rel = float(np.linalg.norm(pred - R) / np.linalg.norm(R))
        drift = float(np.max(np.abs(norms - norms[..., :1])))
    run = {
        "model": name,
        "repr": repr(model),
        "seed": seed,
        "train_loss": result.history[-1]["train_loss"],
        "diverged_at_step": diverged,
        "rollout_relative_error": rel if diverged is None else None,
        "max_norm_drift": drift if diverged is None else None,
        "window": T,
        "updates": steps_per_epoch * args.epochs,
        "seconds": time.perf_counter() - t0,
    }
    return run, pred


def summarise(results: list[dict], models: list[str]) -> list[dict]:
    rows = []
    for name in models:
        rs = [r for r in results if r["model"] == name]
        stayed = [r for r in rs if r["diverged_at_step"] is None]
        rows.append(
            {
                "model": name,
                "repr": rs[0]["repr"],
                "seeds": [r["seed"] for r in rs],
                "final_train_loss": stats([r["train_loss"] for r in rs]),
                "diverged": len(rs) - len(stayed),
                "diverged_at_steps": [r["diverged_at_step"] for r in rs if r["diverged_at_step"] is not None],
                "rollout_relative_error": stats([r["rollout_relative_error"] for r in stayed]),
                "max_norm_drift": stats([r["max_norm_drift"] for r in stayed]),
            }
        )
    return rows


def _fmt(s: dict | None, spec: str) -> str:
    return "—" if s is None else f"{s['mean']:{spec}} ± {s['std']:{spec}}"


def plot(path: str, rollouts: dict, runs: dict, reference: np.ndarray, T0: int, sample: int = 0) -> None:
    """Seed 0: held-out start ``sample`` on the unit sphere (truth and every model's 500-step rollout)
    and the largest |‖z‖ − ‖z₀‖| over the held-out starts against the rollout step for every model; a
    diverged rollout is drawn up to the step where it left (×), the axes at the truth's scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from geoarray.commands._dynamics_plots import Rollout, draw_invariant_drift, draw_sphere

    drawn = [
        Rollout(
            name,
            P,
            np.linalg.norm(P, axis=-1),
            runs[name]["diverged_at_step"],
            offset=T0 - 1,
        )
        for name, P in rollouts.items()
    ]
    fig = plt.figure(figsize=(13, 5))
    ax = fig.add_subplot(1, 2, 1, projection="3d")
    draw_sphere(ax, reference, drawn, sample=sample)
    v = reference[sample, 0]
    ax.set_title(f"held-out start z0 = ({v[0]:.2f}, {v[1]:.2f}, {v[2]:.2f}), seed 0")
    ax.legend(fontsize=7)
    ax = fig.add_subplot(1, 2, 2)
    draw_invariant_drift(
        ax, np.linalg.norm(reference, axis=-1), drawn, offset=T0 - 1, ceiling=2 * DIVERGENCE_FACTOR, floor=1e-8
    )
    ax.axhline(DIVERGENCE_FACTOR, color="red", linewidth=0.8, label="divergence threshold")
    ax.set(ylabel="max |‖z‖ − ‖z₀‖| over held-out starts", title="drift of ‖z‖ (truth: 0 to rounding), seed 0")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    import array_api_compat.numpy as xp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=1024, help="the tutorial: 16384 (default 1024)")
    p.add_argument("--every", type=int, default=2, help="use every k-th of the 1238 initial conditions (default 2)")
    p.add_argument("--t-end", type=float, default=20.0, help="training trajectories over [0, t_end] (default 20)")
    p.add_argument("--seq-len", type=int, default=3)
    p.add_argument("--lr-start", type=float, default=1e-2)
    p.add_argument("--lr-end", type=float, default=1e-6)
    p.add_argument("--rollout", type=int, default=500)
    p.add_argument(
        "--schedule",
        choices=("decay", "constant"),
        default="decay",
        help="decay: AdamWithDecay --lr-start -> --lr-end over the run (the tutorial's); constant: Adam at --lr-start",
    )
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--init", choices=INITS, default="random", help="see initial_params (default: random)")
    p.add_argument("--L", type=int, default=3, help="transformer units (the VP feed-forward gets L × n_blocks blocks)")
    p.add_argument("--n-blocks", type=int, default=2)
    p.add_argument("--models", nargs="+", default=["vpt", "vpff", "standard"])
    p.add_argument("--json", default=None)
    p.add_argument("--figure", default=None, help="PNG: seed 0's rollouts on the sphere and ‖z‖ drift of every model")
    args = p.parse_args(argv)
    for name in args.models:
        build(name, args.seq_len, args.L, args.n_blocks)  # unknown names fail before any training

    ran = commit()  # the code that runs, not the HEAD at the end of a long run
    z0 = systems.rigid_body_initial_conditions(xp=xp)[:: args.every, ...]
    trajectories = systems.rigid_body_trajectories(z0, round(args.t_end / 0.2))
    val0 = xp.asarray(
        [[math.sin(v), 0.0, math.cos(v)] for v in HELD_OUT_V] + [[0.0, math.sin(v), math.cos(v)] for v in HELD_OUT_V],
        dtype=xp.float64,
    )
    reference = systems.rigid_body_trajectories(val0, args.rollout + args.seq_len - 1)
    print(
        f"rigid body: {z0.shape[0]} trajectories of {trajectories.shape[1]} states (t in [0, {args.t_end:g}]), "
        f"{args.epochs} epochs of batch {args.batch_size}, "
        + (
            f"AdamWithDecay {args.lr_start:g} -> {args.lr_end:g}"
            if args.schedule == "decay"
            else f"Adam {args.lr_start:g} (constant)"
        )
        + f", {args.dtype}, init {args.init}, L = {args.L}, T = {args.seq_len}, relative L2 loss; "
        f"{val0.shape[0]} held-out rollouts of {args.rollout} steps; seeds 0..{args.seeds - 1}",
        flush=True,
    )
    t0 = time.perf_counter()
    results, first = [], {}
    for seed in range(args.seeds):
        for name in args.models:
            r, pred = run_one(name, seed, trajectories, reference, args)
            results.append(r)
            if seed == 0:
                first[name] = (r, pred)
            outcome = (
                f"diverged at step {r['diverged_at_step']}"
                if r["diverged_at_step"] is not None
                else f"rel. error {r['rollout_relative_error']:.3f}, max |‖z‖−‖z0‖| {r['max_norm_drift']:.3g}"
            )
            print(f"  seed {seed} {name:<9} loss {r['train_loss']:.3g}  {outcome}  ({r['seconds']:.0f} s)", flush=True)
    rows = summarise(results, args.models)
    print(f"\n| model | final train loss | rel. error ({args.rollout} steps) | max abs(‖z‖ − ‖z₀‖) | diverged |")
    print("|---|---|---|---|---|")
    for row in rows:
        steps = ", ".join(map(str, row["diverged_at_steps"]))
        print(
            f"| {row['model']} | {_fmt(row['final_train_loss'], '.3g')} | {_fmt(row['rollout_relative_error'], '.3f')}"
            f" | {_fmt(row['max_norm_drift'], '.3g')} | {row['diverged']}/{len(row['seeds'])}"
            f"{f' (steps {steps})' if steps else ''} |"
        )
    total = time.perf_counter() - t0
    print(f"total {total:.0f} s")
    if args.figure and first:
        plot(
            args.figure,
            {n: pr for n, (_, pr) in first.items()},
            {n: r for n, (r, _) in first.items()},
            np.asarray(reference),
            args.seq_len,
        )
        print(f"wrote {args.figure}")
    if args.json:
        write_json(
            args.json,
            {
                "command": command("rigid_body_stability.py", argv),
                "commit": ran,
                "config": vars(args),
                "divergence_criterion": f"non-finite or |‖z‖ - ‖z0‖| > {DIVERGENCE_FACTOR:g} ‖z0‖",
                "figures": [args.figure] if args.figure else [],
                "total_seconds": total,
                "table": rows,
                "results": results,
            },
        )
    return rows


if __name__ == "__main__":
    main()
