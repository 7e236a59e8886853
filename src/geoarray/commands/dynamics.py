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

__all__ = ["add_train_parsers", "run"]


def add_train_parsers(train_subparsers: Any) -> None:
    """Register ``vpt``, ``lst`` and ``sympnet`` on the ``train`` subparsers."""
    specs = [
        ("vpt", "volume-preserving transformer on the rigid body", 3),
        ("lst", "linear symplectic transformer on the coupled harmonic oscillator", 3),
        ("sympnet", "G-SympNet on the pendulum or harmonic oscillator", 1),
    ]
    for name, text, seq_len in specs:
        p = train_subparsers.add_parser(name, help=text, description=text + ".")
        add_common_train_options(p, epochs=20)
        p.add_argument("--lr", type=positive_float, default=1e-2, help="Adam learning rate (default: 0.01)")
        p.add_argument("--batch-size", type=positive_int, default=128, help="mini-batch size (default: 128)")
        p.add_argument("--n-traj", type=positive_int, default=16, help="training trajectories (default: 16)")
        p.add_argument("--n-steps", type=positive_int, default=40, help="time steps per trajectory (default: 40)")
        p.add_argument(
            "--rollout", type=positive_int, default=100, help="validation rollout length in steps (default: 100)"
        )
        if name != "sympnet":
            p.add_argument(
                "--seq-len", type=positive_int, default=seq_len, help=f"window length T (default: {seq_len})"
            )
        else:
            p.add_argument(
                "--system", choices=("pendulum", "oscillator"), default="pendulum", help="system (default: pendulum)"
            )
        p.set_defaults(func=run, model_name=name)


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
        model = models.VolumePreservingTransformer(3, args.seq_len, n_blocks=2, n_linear=1, L=1)
        inv = lambda z: systems.rigid_body_invariants(z)[0]  # noqa: E731
        return model, train, val, inv, "norm |z|"
    if name == "lst":
        z0 = systems.coupled_oscillator_initial_conditions(args.n_traj, xp=xp)
        train = systems.coupled_oscillator_trajectories(z0, args.n_steps)
        val0 = xp.asarray([[0.55, 0.0, 0.0, 0.0]], dtype=xp.float64)
        val = systems.coupled_oscillator_trajectories(val0, args.rollout + args.seq_len)
        model = models.LinearSymplecticTransformer(4, args.seq_len, L=1, n_sympnet=2, upscale=4)
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


def run(args: argparse.Namespace) -> int:
    from .. import models, nn, optim, train
    from ..data import windows
    from ._common import checkpoint_options, namespace_for, require, write_json

    xp = namespace_for(args.backend)
    if args.out is not None:
        require("matplotlib")
    model, trajs, val, inv, inv_name = _problem(args, xp)
    T = args.seq_len
    if args.n_steps + 1 < 2 * T:
        raise CommandError(f"--n-steps must be at least {2 * T - 1} for --seq-len {T}, got {args.n_steps}")
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
        **checkpoint_options(args),
    )
    pred = models.iterate(model, result.params, val[:, :T, :], args.rollout)
    ref = val[:, : T + args.rollout, :]
    rel = float(xp.sqrt(xp.sum((pred - ref) ** 2)) / xp.sqrt(xp.sum(ref**2)))
    inv_pred, inv_ref = inv(pred), inv(ref)
    drift = float(xp.max(xp.abs(inv_pred - inv_pred[..., :1])))
    summary = {
        "model": repr(model),
        "backend": args.backend,
        "epochs": args.epochs,
        "final_train_loss": result.history[-1]["train_loss"],
        "rollout_steps": args.rollout,
        "rollout_relative_error": rel,
        f"rollout_max_drift_{inv_name.split()[-1]}": drift,
    }
    print(
        f"{args.model_name}: final train loss {summary['final_train_loss']:.3e}, "
        f"{args.rollout}-step relative error {rel:.3e}, max drift of {inv_name} {drift:.3e}"
    )
    if args.out is not None:
        import numpy as np

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
        P, R = np.asarray(pred[0, ...]), np.asarray(ref[0, ...])
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        for k in range(P.shape[-1]):
            axes[0].plot(R[:, k], color=f"C{k}", label=f"z{k + 1} reference")
            axes[0].plot(P[:, k], "--", color=f"C{k}", label=f"z{k + 1} model")
        axes[0].set(xlabel="step", title="validation rollout")
        axes[0].legend(fontsize=6)
        axes[1].plot(np.asarray(inv_ref[0, ...]), label="reference")
        axes[1].plot(np.asarray(inv_pred[0, ...]), "--", label="model")
        axes[1].set(xlabel="step", ylabel=inv_name, title="invariant drift")
        axes[1].legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "rollout.png"), dpi=100)
        plt.close(fig)
        print(f"wrote {args.out}/metrics.json, loss.png, rollout.png")
    return 0
