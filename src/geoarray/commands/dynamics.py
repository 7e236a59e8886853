"""``geoarray train vpt|lst|sympnet``: structure-preserving integrators learned from simulated data.

- ``vpt``: volume-preserving transformer on the rigid body (implicit midpoint, Δt = 0.2);
- ``lst``: linear symplectic transformer on the coupled harmonic oscillator (Störmer–Verlet, Δt = 0.3);
- ``sympnet``: G-SympNet on the pendulum or the harmonic oscillator (Störmer–Verlet, Δt = 0.1).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ._common import CommandError, add_common_train_options, positive_float, positive_int

__all__ = ["DIVERGENCE_FACTOR", "add_train_parsers", "divergence_step", "rollout", "run"]

# A rollout has diverged at the first predicted state that is non-finite or whose invariant I is off
# by more than this multiple of |I(z_0)| (for the rigid body ‖z‖ doubled or collapsed to 0): past that
# point the error and drift measure the blow-up, not the model, and are not reported as numbers.
DIVERGENCE_FACTOR = 1.0


def divergence_step(states: Any, invariant: Any, T: int, factor: float = DIVERGENCE_FACTOR) -> int | None:
    """The first predicted step n = 1, 2, … (state T − 1 + n of the rollout) at which any sample is
    non-finite or has |I(z) − I(z_0)| > factor · |I(z_0)|; None if the rollout never leaves.

    ``states`` (..., T + n_steps, d) is the rollout (the true initial window first), ``invariant``
    (..., T + n_steps) its invariant I, compared with I at the window's first state.
    """
    import numpy as np

    from .._backend import to_host

    z = np.asarray(to_host(states), dtype=np.float64)
    inv = np.asarray(to_host(invariant), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.all(np.isfinite(z), axis=-1) | ~np.isfinite(inv)
        bad |= np.abs(inv - inv[..., :1]) > factor * np.abs(inv[..., :1])
    bad = bad.reshape(-1, bad.shape[-1]).any(axis=0)[T:]
    hits = np.flatnonzero(bad)
    return int(hits[0]) + 1 if hits.size else None


def _singular_errors() -> tuple:
    import sys

    import numpy as np

    errors = [np.linalg.LinAlgError]
    if "torch" in sys.modules:  # torch.linalg.inv raises its own (a RuntimeError) on a singular matrix
        errors.append(sys.modules["torch"].linalg.LinAlgError)
    return tuple(errors)


def rollout(model: Any, params: Any, initial_window: Any, n_steps: int) -> Any:
    """:func:`geoarray.models.iterate`, and for a rollout that blew up so far that a layer cannot be
    evaluated any more (the volume-preserving attention's Cayley transform of a non-finite window is
    singular: NumPy and torch raise) the states computed up to there followed by NaN — it has diverged
    long before, and :func:`divergence_step` says where."""
    from .. import models
    from .._backend import array_namespace

    errors = _singular_errors()
    try:
        return models.iterate(model, params, initial_window, n_steps)
    except errors:
        xp = array_namespace(initial_window)
        T = initial_window.shape[-2]
        parts, window, produced = [initial_window], initial_window, 0
        try:
            while produced < n_steps:
                window = model.apply(params, window)
                parts.append(window)
                produced += T
        except errors:
            pass
        done = xp.concat(parts, axis=-2)
        if done.shape[-2] > T + n_steps:  # the last window ran past the end (strict: no slicing past it)
            done = done[..., : T + n_steps, :]
        shape = (*done.shape[:-2], T + n_steps - done.shape[-2], done.shape[-1])
        gap = xp.full(shape, float("nan"), dtype=done.dtype, device=getattr(done, "device", None))
        return xp.concat([done, gap], axis=-2)


def add_train_parsers(train_subparsers: Any) -> None:
    """Register ``vpt``, ``lst`` and ``sympnet`` on the ``train`` subparsers."""
    # (name, help, T, defaults: epochs, lr, batch size, trajectories, steps per trajectory). lst's are
    # the configuration of examples/oscillator_stability.py whose rollouts stayed bounded for 8 of 8
    # seeds (model "lst0", results/oscillator_stability.json); at its former defaults (20 epochs of 5
    # updates, a model with L = 1, upscale 4) the rollouts diverged even with the zero attention init.
    specs = [
        ("vpt", "volume-preserving transformer on the rigid body", 3, (20, 1e-2, 128, 16, 40)),
        ("lst", "linear symplectic transformer on the coupled harmonic oscillator", 3, (300, 3e-3, 64, 20, 60)),
        ("sympnet", "G-SympNet on the pendulum or harmonic oscillator", 1, (20, 1e-2, 128, 16, 40)),
    ]
    for name, text, seq_len, (epochs, lr, batch_size, n_traj, n_steps) in specs:
        p = train_subparsers.add_parser(name, help=text, description=text + ".")
        add_common_train_options(p, epochs=epochs)
        p.add_argument("--lr", type=positive_float, default=lr, help=f"Adam learning rate (default: {lr:g})")
        p.add_argument(
            "--batch-size", type=positive_int, default=batch_size, help=f"mini-batch size (default: {batch_size})"
        )
        p.add_argument("--n-traj", type=positive_int, default=n_traj, help=f"training trajectories (default: {n_traj})")
        p.add_argument(
            "--n-steps", type=positive_int, default=n_steps, help=f"time steps per trajectory (default: {n_steps})"
        )
        p.add_argument(
            "--rollout", type=positive_int, default=100, help="validation rollout length in steps (default: 100)"
        )
        if name != "sympnet":
            p.add_argument(
                "--seq-len", type=positive_int, default=seq_len, help=f"window length T (default: {seq_len})"
            )
        if name == "lst":
            # measured over 8 seeds (README, results/oscillator_*.json): the attention started at Ā = 0
            # gives bounded rollouts where the layers' random init diverges
            p.add_argument(
                "--attention-init",
                choices=("zero", "normal"),
                default="zero",
                help="initial attention matrices: zero (Ā = 0, the default) or normal (random)",
            )
        if name == "sympnet":  # vpt learns the rigid body only: a --system there would be ignored
            p.add_argument(
                "--system", choices=("pendulum", "oscillator"), default="pendulum", help="system (default: pendulum)"
            )
        p.set_defaults(func=run, model_name=name, prog=p.prog)


def _problem(args: argparse.Namespace, xp: Any) -> tuple:
    """(model, train trajectories, validation trajectory batch, invariant fn, invariant name)."""
    from .. import models
    from ..data import systems

    name = args.model_name
    if name == "vpt":
        z0 = systems.rigid_body_initial_conditions(xp=xp)
        idx = xp.asarray([round(i * (z0.shape[0] - 1) / max(args.n_traj - 1, 1)) for i in range(args.n_traj)])
        train = systems.rigid_body_trajectories(xp.take(z0, idx, axis=0), args.n_steps)
        val0 = xp.asarray([[0.8912073600614354, 0.0, 0.4535961214255773]], dtype=xp.float64)  # v = 1.1
        val = systems.rigid_body_trajectories(val0, args.rollout + args.seq_len)
        model: Any = models.VolumePreservingTransformer(3, args.seq_len, n_blocks=2, n_linear=1, L=1)
        inv = lambda z: systems.rigid_body_invariants(z)[0]  # noqa: E731
        return model, train, val, inv, "norm |z|"
    if name == "lst":
        z0 = systems.coupled_oscillator_initial_conditions(args.n_traj, xp=xp)
        train = systems.coupled_oscillator_trajectories(z0, args.n_steps)
        val0 = xp.asarray([[0.55, 0.0, 0.0, 0.0]], dtype=xp.float64)
        val = systems.coupled_oscillator_trajectories(val0, args.rollout + args.seq_len)
        model = models.LinearSymplecticTransformer(
            4, args.seq_len, L=2, n_sympnet=2, upscale=8, attention_init=args.attention_init
        )
        return model, train, val, systems.coupled_oscillator_hamiltonian, "energy H"
    q0 = xp.linspace(-1.5, 1.5, args.n_traj, dtype=xp.float64)
    z0 = xp.stack([q0, xp.zeros_like(q0)], axis=-1)
    traj = systems.pendulum_trajectories if args.system == "pendulum" else systems.harmonic_oscillator_trajectories
    train = traj(z0, args.n_steps)
    val = traj(xp.asarray([[0.77, 0.1]], dtype=xp.float64), args.rollout + 1)
    args.seq_len = 1
    model = models.GSympNet(2, n_layers=4, upscale=8)
    if args.system == "pendulum":
        inv = lambda z: z[..., 1] ** 2 / 2 - xp.cos(z[..., 0])  # noqa: E731
    else:
        inv = lambda z: z[..., 1] ** 2 / 2 + z[..., 0] ** 2 / 2  # noqa: E731
    return model, train, val, inv, "energy H"


#: states the command integrates in memory (training set and rollout each): 10⁷ float64 states of
#: dimension ≤ 4 are 320 MB; beyond, a typo such as --n-traj 10000000000 would run for hours or exhaust memory
MAX_STATES = 10_000_000


def _check_sizes(args: argparse.Namespace) -> None:
    """The window length against --n-steps and the sizes against :data:`MAX_STATES`, before anything is
    integrated (the first check used to come after the trajectories were generated)."""
    T = getattr(args, "seq_len", 1)
    if args.n_steps + 1 < 2 * T:
        raise CommandError(f"--n-steps must be at least {2 * T - 1} for --seq-len {T}, got {args.n_steps}")
    states = args.n_traj * (args.n_steps + 1)
    if states > MAX_STATES:
        raise CommandError(
            f"--n-traj {args.n_traj} × (--n-steps {args.n_steps} + 1) = {states:,} states exceed the "
            f"{MAX_STATES:,} this command integrates in memory; use fewer trajectories or steps"
        )
    if args.rollout + T > MAX_STATES:
        raise CommandError(f"--rollout {args.rollout} exceeds the {MAX_STATES:,} states of a validation rollout")


def _record(args: argparse.Namespace) -> dict:
    """What a ``train vpt|lst|sympnet`` checkpoint must match to be resumed: the command and the flags
    that decide the model, the data and the optimizer (the seed and the batch size are in fit's meta)."""
    name = args.model_name
    flags: dict[str, Any] = {"--n-traj": args.n_traj, "--n-steps": args.n_steps, "--lr": args.lr}
    if name == "sympnet":
        flags["--system"] = args.system
    else:
        flags["--seq-len"] = args.seq_len
    return {"command": f"train {name}", "flags": flags}


def run(args: argparse.Namespace) -> int:
    from .. import nn, optim, train
    from ..data import windows
    from ._common import check_out, checkpoint_options, namespace_for, require, write_json

    _check_sizes(args)
    xp = namespace_for(args.backend)
    if args.out is not None:
        require("matplotlib")
    record = _record(args)
    check_out(args, record)
    model, trajs, val, inv, inv_name = _problem(args, xp)
    T = args.seq_len
    x, y = windows(trajs, T, T)
    params = model.init(args.seed, xp=xp, dtype=xp.float64)
    result = train.fit(
        model,
        params,
        (x, y),
        optim.Adam(lr=args.lr),
        nn.MSELoss(),
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.no_progress,
        **checkpoint_options(args, record),
    )
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):  # a diverging NumPy rollout is reported below
        pred = rollout(model, result.params, val[:, :T, :], args.rollout)
        ref = val[:, : T + args.rollout, :]
        inv_pred, inv_ref = inv(pred), inv(ref)
        diverged = divergence_step(pred, inv_pred, T)
        rel = float(xp.sqrt(xp.sum((pred - ref) ** 2)) / xp.sqrt(xp.sum(ref**2)))
        drift = float(xp.max(xp.abs(inv_pred - inv_pred[..., :1])))
    inv_key = inv_name.split()[-1]
    summary = {
        "model": repr(model),
        "backend": args.backend,
        "epochs": args.epochs,
        "final_train_loss": result.history[-1]["train_loss"],
        "rollout_steps": args.rollout,
        "rollout_diverged_at_step": diverged,
        "divergence_criterion": f"non-finite or |I - I0| > {DIVERGENCE_FACTOR:g} |I0| for I = {inv_name}",
        # past divergence both numbers measure the blow-up, so they are not reported
        "rollout_relative_error": rel if diverged is None else None,
        f"rollout_max_drift_{inv_key}": drift if diverged is None else None,
    }
    if diverged is None:
        outcome = f"{args.rollout}-step relative error {rel:.3f}, max drift of {inv_name} {drift:.2g}"
    else:
        outcome = (
            f"{args.rollout}-step rollout DIVERGED at step {diverged} "
            f"({inv_name} off by more than {DIVERGENCE_FACTOR:.0%} of its initial value, or not finite)"
        )
    print(f"{args.model_name}: final train loss {summary['final_train_loss']:.3g}, {outcome}")
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, "metrics.json"), {"summary": summary, "history": result.history})
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.semilogy([h["train_loss"] for h in result.history])
        ax.set(xlabel="epoch", ylabel="train loss (MSE)", title=args.model_name)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "loss.png"), dpi=100)
        plt.close(fig)
        _plot_rollout(pred, ref, inv_pred, inv_ref, inv_name, T, diverged, os.path.join(args.out, "rollout.png"))
        print(f"wrote {args.out}/metrics.json, loss.png, rollout.png")
    return 0


def _plot_rollout(pred, ref, inv_pred, inv_ref, inv_name: str, T: int, diverged: int | None, path: str) -> None:
    """The first validation rollout against the truth in the system's geometry — on the unit sphere for
    the rigid body (3 dimensions), the phase portraits (q_i, p_i) for a Hamiltonian system — and the
    invariant's drift over the rollout; the axes keep the truth's range and a diverged rollout is drawn
    up to the step where it left, marked (see :mod:`._dynamics_plots`)."""
    import matplotlib
    import numpy as np

    from .._backend import to_host
    from ._dynamics_plots import Rollout, draw_invariant_drift, draw_phase_portrait, draw_sphere

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    P, R = (np.asarray(to_host(a[:1, ...]), dtype=np.float64) for a in (pred, ref))
    Ip, Ir = (np.asarray(to_host(a[:1, ...]), dtype=np.float64) for a in (inv_pred, inv_ref))
    run = [Rollout("model", P, Ip, diverged, offset=T - 1)]
    d = R.shape[-1]
    n_geo = 1 if d == 3 else d // 2
    fig = plt.figure(figsize=(5 * (n_geo + 1), 4.2))
    if d == 3:
        ax = fig.add_subplot(1, 2, 1, projection="3d")
        draw_sphere(ax, R, run)
        ax.set_title("validation rollout on the sphere |z| = 1")
        ax.legend(fontsize=7)
    else:
        for i in range(n_geo):
            ax = fig.add_subplot(1, n_geo + 1, i + 1)
            draw_phase_portrait(ax, R, run, i, d // 2 + i)
            q, p = ("q", "p") if n_geo == 1 else (f"q{i + 1}", f"p{i + 1}")
            ax.set(xlabel=q, ylabel=p, title=f"phase portrait ({q}, {p})")
        fig.axes[0].legend(fontsize=7)
    ax = fig.add_subplot(1, n_geo + 1, n_geo + 1)
    ceiling = 2 * DIVERGENCE_FACTOR * max(float(np.abs(Ir[..., 0]).max()), 1e-3)
    draw_invariant_drift(ax, Ir, run, offset=T - 1, ceiling=ceiling, floor=1e-8)
    ax.axhline(DIVERGENCE_FACTOR * abs(float(Ir[0, 0])), color="red", linewidth=0.8, label="divergence threshold")
    ax.set(ylabel=f"|{inv_name} − its initial value|", title=f"drift of {inv_name}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
