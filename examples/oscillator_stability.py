"""Coupled oscillator, over seeds: do long rollouts of the symplectic transformers stay bounded?

The experiment of the "Linear Symplectic Attention" and "Symplectic Attention" chapters
(GeometricMachineLearning.jl): the coupled harmonic oscillator (m₁ = 2, m₂ = 1, k₁ = 1.5, k₂ = 0.3,
k = 1, sigmoid coupling) integrated by Störmer–Verlet with Δt = 0.3 from ``--n-traj`` initial
conditions q₁ ∈ [−1, 1], q₂ = p = 0 over ``--n-steps`` steps, cut into windows of T = ``--seq-len``
states whose target is the next T states. Models (``--models``):

* ``lst``       ``LinearSymplecticTransformer(4, T, L=2, n_sympnet=2, upscale=8, attention_init="normal")``, the
                  attention layers' own init (Ā ~ N(0, 1/T) symmetrised);
* ``lst0``      the same with ``attention_init="zero"``: Ā = 0, so every attention starts as the
                  identity (the true window map z_t ↦ φ^T(z_t) does not mix the time steps);
* ``st``        ``SymplecticTransformer(4, T, L=2, n_sympnet=2, upscale=8)`` (matrix softmax);
* ``gsympnet``  ``GSympNet(4, n_layers=4, upscale=8)`` — one step z_n ↦ z_{n+1};
* ``standard``  ``StandardTransformerIntegrator(4, T, n_heads=1, L=2, upscale=4)`` — the
                  unstructured baseline.

Training: Adam (η = ``--lr``), mean-squared error, batch ``--batch-size``, float64, ``--epochs``.

Evaluation: from ``len(HELD_OUT_Q1)`` held-out initial conditions (q₁ off the training grid; the first
T true states as the start) each model is iterated ``--rollout`` steps. Reported per seed: the final
training loss; the relative error ‖Z − Z_true‖/‖Z_true‖ over the first 50 steps and over the whole
rollout; the largest |H − H₀| along it (H the energy; the Störmer–Verlet truth keeps it to O(Δt²));
and, if the rollout left — a non-finite state or H off by more than 100 % of H₀ (the criterion of
``geoarray train lst``) — the step where it did, instead of the numbers that would then measure the
blow-up (the 50-step error is still given when the rollout left after step 50). The table gives
mean ± sample standard deviation over the seeds whose rollouts stayed, and how many diverged.

``--json`` writes the table with every run, the command and the commit; ``--figure`` a PNG with the
energy drift over time of every model (seed 0) and phase portraits (q₁, p₁), (q₂, p₂) of a held-out
rollout against the truth, the axes clipped to the truth's range and a diverged rollout drawn up to
the step where it left.

    python examples/oscillator_stability.py [--seeds 8] [--epochs 300] [--models lst lst0 st gsympnet standard]
                                            [--json results/oscillator_stability.json] [--figure F.png]
    python examples/oscillator_stability.py --smoke   # seconds: 2 seeds, 20 epochs, small data, 60-step rollouts
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _results import command, commit, stats
from _results import write_json as _write

import geoarray as ga
from geoarray.commands.dynamics import DIVERGENCE_FACTOR, divergence_step
from geoarray.data import systems, windows

HELD_OUT_Q1 = (-0.93, -0.55, -0.17, 0.31, 0.55, 0.88)  # between the points of the training grids used
SHORT = 50  # the short horizon of the table (steps)
SMOKE_EPOCHS = 20
PORTRAIT = 100  # steps drawn in the phase portraits
MODELS = ("lst", "lst0", "st", "gsympnet", "standard")


def build(name: str, T: int):
    if name == "lst":
        return ga.models.LinearSymplecticTransformer(4, T, L=2, n_sympnet=2, upscale=8, attention_init="normal")
    if name == "lst0":
        return ga.models.LinearSymplecticTransformer(4, T, L=2, n_sympnet=2, upscale=8, attention_init="zero")
    if name == "st":
        return ga.models.SymplecticTransformer(4, T, L=2, n_sympnet=2, upscale=8)
    if name == "gsympnet":
        return ga.models.GSympNet(4, n_layers=4, upscale=8)
    if name == "standard":
        return ga.models.StandardTransformerIntegrator(4, T, n_heads=1, L=2, upscale=4)
    raise ValueError(f"--models: unknown model {name!r}; choose from {', '.join(MODELS)}")


def _rel(P: np.ndarray, R: np.ndarray) -> float:
    return float(np.linalg.norm(P - R) / np.linalg.norm(R))


def run_one(name: str, seed: int, trajectories, reference, args) -> tuple[dict, np.ndarray]:
    import array_api_compat.numpy as xp

    model = build(name, args.seq_len)
    T = args.seq_len if model.seq_len is not None else 1
    t0 = time.perf_counter()
    result = ga.train.fit(
        model,
        model.init(seed, xp=xp, dtype=xp.float64),
        windows(trajectories, T, T),
        ga.optim.Adam(lr=args.lr),
        ga.nn.MSELoss(),
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=seed,
        progress=False,
    )
    # every model starts from the same first T0 = --seq-len true states; a one-step model predicts
    # the states after its first, so all rollouts are compared over the same steps T0 … T0 + rollout − 1
    T0 = args.seq_len
    with np.errstate(over="ignore", invalid="ignore"):
        pred = np.asarray(ga.models.iterate(model, result.params, reference[:, :T, :], args.rollout + T0 - T))
        R = np.asarray(reference)
        H = np.asarray(systems.coupled_oscillator_hamiltonian(pred))
        diverged = divergence_step(pred[:, T0 - 1 :, :], H[:, T0 - 1 :], 1)
        short = _rel(pred[:, : T0 + SHORT, :], R[:, : T0 + SHORT, :])
        rel = _rel(pred, R)
        drift = float(np.max(np.abs(H - H[:, :1])))
        joins = join_error_ratio(pred[:, : T0 + SHORT, :], R[:, : T0 + SHORT, :], T) if T > 1 else None
    run = {
        "model": name,
        "repr": repr(model),
        "seed": seed,
        "train_loss": result.history[-1]["train_loss"],
        "diverged_at_step": diverged,
        f"relative_error_{SHORT}": short if diverged is None or diverged > SHORT else None,
        "relative_error": rel if diverged is None else None,
        "max_energy_drift": drift if diverged is None else None,
        "join_error_ratio": joins if diverged is None or diverged > SHORT else None,
        "seconds": time.perf_counter() - t0,
    }
    return run, pred


def join_error_ratio(P: np.ndarray, R: np.ndarray, T: int) -> float:
    """How much rougher the rollout is at the joins between predicted windows than inside them: the mean
    error of the second differences ‖Δ²P − Δ²R‖ centred on a window's first or last state (they straddle
    a join) over the mean centred on its inner states. 1: no join effect; the symplectic transformer's
    zig-zag (README) is a ratio of 2–3. ``P`` and ``R`` (n, T + steps, d), the first T states given."""
    e = np.linalg.norm(np.diff(P, 2, axis=1) - np.diff(R, 2, axis=1), axis=-1)  # centred on states 1 … N − 2
    centres = np.arange(1, P.shape[1] - 1)
    position = (centres - T) % T  # the centre's place in its predicted window (the given window: T − 1 …)
    predicted = centres >= T
    at_join = predicted & ((position == 0) | (position == T - 1))
    inside = predicted & ~at_join
    return float(e[:, at_join].mean() / e[:, inside].mean())


def summarise(results: list[dict], models: list[str]) -> list[dict]:
    rows = []
    for name in models:
        rs = [r for r in results if r["model"] == name]
        if not rs:  # not run yet (a partial table written during the run)
            continue
        stayed = [r for r in rs if r["diverged_at_step"] is None]
        rows.append(
            {
                "model": name,
                "repr": rs[0]["repr"],
                "seeds": [r["seed"] for r in rs],
                "final_train_loss": stats([r["train_loss"] for r in rs]),
                "diverged": len(rs) - len(stayed),
                "diverged_at_steps": [r["diverged_at_step"] for r in rs if r["diverged_at_step"] is not None],
                f"relative_error_{SHORT}": stats(
                    [r[f"relative_error_{SHORT}"] for r in rs if r[f"relative_error_{SHORT}"] is not None]
                ),
                "relative_error": stats([r["relative_error"] for r in stayed]),
                "max_energy_drift": stats([r["max_energy_drift"] for r in stayed]),
                "join_error_ratio": stats([r["join_error_ratio"] for r in rs]),
            }
        )
    return rows


def _fmt(s: dict | None, spec: str, total: int | None = None) -> str:
    """mean ± std, and over how many runs when that is fewer than ``total``."""
    if s is None:
        return "—"
    over = f" ({s['n']} of {total})" if total is not None and s["n"] < total else ""
    return f"{s['mean']:{spec}} ± {s['std']:{spec}}{over}"


def plot(path: str, rollouts: dict, runs: dict, reference: np.ndarray, T0: int, sample: int = 0) -> None:
    """Energy drift |H − H₀| over the whole rollout for every model (the worst held-out start at each
    step) and the phase portraits of held-out start ``sample`` over the first ``PORTRAIT`` steps (the
    whole rollout fills the annulus); a diverged rollout is drawn up to the step where it left (×)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from geoarray.commands._dynamics_plots import Rollout, draw_invariant_drift, draw_phase_portrait

    R = reference
    with np.errstate(over="ignore", invalid="ignore"):
        drawn = [
            Rollout(
                name,
                P,
                np.asarray(systems.coupled_oscillator_hamiltonian(P)),
                runs[name]["diverged_at_step"],
                offset=T0 - 1,
            )
            for name, P in rollouts.items()
        ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    H_ref = np.asarray(systems.coupled_oscillator_hamiltonian(R))
    draw_invariant_drift(axes[0], H_ref, drawn, offset=T0 - 1, ceiling=10.0, floor=1e-8)
    axes[0].set(ylabel="max |H − H₀| over held-out starts", title="energy drift (seed 0)")
    axes[0].legend(fontsize=7)
    n = min(T0 + PORTRAIT, R.shape[1])
    for ax, (iq, ip), lab in zip(axes[1:], ((0, 2), (1, 3)), ("1", "2"), strict=True):
        draw_phase_portrait(ax, R, drawn, iq, ip, n_states=n, sample=sample)
        ax.set(
            xlabel=f"q{lab}",
            ylabel=f"p{lab}",
            title=f"(q{lab}, p{lab}), first {n - T0 + 1} steps, q1(0) = {R[sample, 0, 0]:g}, seed 0",
        )
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_json(args, argv, ran, rows, results, total, *, complete: bool) -> None:
    _write(
        args.json,
        {
            "command": command("oscillator_stability.py", argv),
            "commit": ran,
            "complete": complete,
            "config": vars(args),
            "divergence_criterion": f"non-finite or |H - H0| > {DIVERGENCE_FACTOR:g} |H0|",
            "held_out_q1": list(HELD_OUT_Q1),
            "figures": [args.figure] if args.figure and complete else [],
            "total_seconds": total,
            "table": rows,
            "results": results,
        },
    )


def main(argv: list[str] | None = None) -> list[dict]:
    import array_api_compat.numpy as xp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--n-traj", type=int, default=20, help="training trajectories (default 20)")
    p.add_argument("--n-steps", type=int, default=60, help="Störmer–Verlet steps per trajectory (default 60)")
    p.add_argument("--seq-len", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--rollout", type=int, default=500)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--json", default=None)
    p.add_argument("--figure", default=None, help="PNG: energy drift and phase portraits (needs matplotlib)")
    p.add_argument(
        "--smoke", action="store_true", help="2 seeds, 20 epochs, 6 trajectories of 12 steps, 60-step rollouts"
    )
    if "--smoke" in (sys.argv[1:] if argv is None else argv):  # smoke sizes, each still settable
        p.set_defaults(seeds=2, epochs=SMOKE_EPOCHS, n_traj=6, n_steps=12, rollout=60)
    args = p.parse_args(argv)
    for name in args.models:
        build(name, args.seq_len)  # unknown names fail before any training
    if args.rollout < SHORT:
        raise ValueError(f"--rollout: expected at least {SHORT} steps, got {args.rollout}")

    ran = commit()  # the code that runs, not the HEAD at the end of a long run
    T0 = args.seq_len
    trajectories = systems.coupled_oscillator_trajectories(
        systems.coupled_oscillator_initial_conditions(args.n_traj, xp=xp), args.n_steps
    )
    val0 = xp.asarray([[q, 0.0, 0.0, 0.0] for q in HELD_OUT_Q1], dtype=xp.float64)
    reference = systems.coupled_oscillator_trajectories(val0, args.rollout + T0 - 1)
    print(
        f"coupled oscillator: {args.n_traj} trajectories of {args.n_steps} Störmer–Verlet steps (Δt = 0.3), "
        f"windows of {T0}, {args.epochs} epochs of batch {args.batch_size}, Adam {args.lr:g}, MSE; "
        f"{len(HELD_OUT_Q1)} held-out rollouts of {args.rollout} steps; seeds 0..{args.seeds - 1}",
        flush=True,
    )
    if args.smoke:
        print(
            "smoke size: too little data and training for the models to learn the flow; rollouts that diverge "
            "here check the reporting, not the models (the table comes from a run without --smoke)",
            flush=True,
        )
    t0 = time.perf_counter()
    results, first = [], {}
    for seed in range(args.seeds):
        for name in args.models:
            r, pred = run_one(name, seed, trajectories, reference, args)
            results.append(r)
            if args.json:  # after every run, so that a long run interrupted keeps what it measured
                write_json(args, argv, ran, summarise(results, args.models), results, None, complete=False)
            if seed == 0:
                first[name] = (r, pred)
            short, joins = r[f"relative_error_{SHORT}"], r["join_error_ratio"]
            outcome = (
                f"{SHORT}-step rel. error {'—' if short is None else f'{short:.3f}'}, "
                + ("" if joins is None else f"joins/inside {joins:.2f}, ")
                + (
                    f"DIVERGED at step {r['diverged_at_step']}"
                    if r["diverged_at_step"] is not None
                    else f"{args.rollout}-step {r['relative_error']:.3f}, max |H−H0| {r['max_energy_drift']:.3g}"
                )
            )
            print(f"  seed {seed} {name:<9} loss {r['train_loss']:.3g}  {outcome}  ({r['seconds']:.1f} s)", flush=True)
    rows = summarise(results, args.models)
    print(
        f"\n| model | final train loss | rel. error ({SHORT} steps) | rel. error ({args.rollout} steps) "
        f"| max abs(H − H₀) | joins/inside ({SHORT} steps) | diverged |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        steps = ", ".join(map(str, row["diverged_at_steps"]))
        n = len(row["seeds"])
        print(
            f"| {row['model']} | {_fmt(row['final_train_loss'], '.3g')}"
            f" | {_fmt(row[f'relative_error_{SHORT}'], '.3f', n)} | {_fmt(row['relative_error'], '.3f', n)}"
            f" | {_fmt(row['max_energy_drift'], '.3g', n)} | {_fmt(row['join_error_ratio'], '.2f', n)}"
            f" | {row['diverged']}/{len(row['seeds'])}{f' (steps {steps})' if steps else ''} |"
        )
    total = time.perf_counter() - t0
    print(f"total {total:.0f} s")
    if args.figure and first:
        plot(
            args.figure,
            {n: pr for n, (_, pr) in first.items()},
            {n: r for n, (r, _) in first.items()},
            np.asarray(reference),
            T0,
        )
        print(f"wrote {args.figure}")
    if args.json:
        write_json(args, argv, ran, rows, results, total, complete=True)
    return rows


if __name__ == "__main__":
    main()
