"""Manifold weights and their optimizer state sharded over a JAX mesh (FSDP-style), on host CPU devices.

A regression model with the shapes of attention projections: ``heads`` per-head Stiefel(d, k) frames
stored as one ``(heads, d, k)`` stack, a tall Stiefel(heads·k, m) mixing weight and a plain readout.
``geoarray.jax.make_train_step(..., mesh=mesh, param_sharding=specs)`` compiles one step in which

* the stack of frames is cut *between* frames (``PartitionSpec("data")``): each device holds
  heads/devices whole frames and the optimizer state of those frames, and steps them where they are
  (Algorithm 1 of Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*,
  treats the frames of a stack independently: nothing is gathered);
* the tall weight is cut by rows (``PartitionSpec("data", None)``): the retraction needs the whole
  matrix, and XLA gathers it where the update needs it;
* the batch is split over the same mesh axis; XLA inserts the reductions of the gradients. The
  forward pass contracts the batch with the frames, both cut along that axis, so XLA gathers one of
  them: the smaller (with 4 examples per device, the batch; with a batch larger than the stack it
  would be the frames, as FSDP gathers weights for the forward pass). The optimizer's update needs
  neither.

Printed: the collectives XLA put into the compiled step (read from its HLO: the frames and their
state appear in none, the tall weight is all-gathered whole); the loss every few steps; what each
device holds (parameters and the frames' Adam moments); the largest orthonormality error
max |YᵀY − I|; and with ``--check`` the largest difference of the parameters, the optimizer state and
the loss from the same steps on one device (float64: equal to rounding, ~1e-15).

JAX fixes its number of CPU devices when it is first imported, so this script sets
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before importing it (``--devices N``); on a
machine with accelerators, drop that and build the mesh from ``jax.devices()``.

    python examples/jax_sharded.py [--devices 4] [--heads 8] [--steps 30] [--check]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4, help="host CPU devices in the mesh")
    ap.add_argument("--heads", type=int, default=8, help="frames in the stack (a multiple of --devices)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--check", action="store_true", help="also run one device and print the difference")
    args = ap.parse_args(argv)
    if args.devices < 1 or args.heads % args.devices:
        ap.error(f"--heads ({args.heads}) must be a positive multiple of --devices ({args.devices})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if "jax" not in sys.modules:  # the device count is read once, when JAX initialises
        # the caller's other XLA flags kept (the test sessions' compiler settings, say)
        kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT)]
        os.environ["XLA_FLAGS"] = " ".join([*kept, f"{_DEVICE_COUNT}={args.devices}"])
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import geoarray as ga
    import geoarray.jax

    jax.config.update("jax_enable_x64", True)
    if len(jax.devices()) < args.devices:
        # JAX was initialised before this function set the device count (imported by the caller)
        print(f"error: JAX has {len(jax.devices())} devices, --devices asks for {args.devices}", file=sys.stderr)
        raise SystemExit(2)

    d, k, m, out_dim, batch = 16, 4, 8, 4, 4 * args.devices
    F, S = ga.Stiefel(d, k), ga.Stiefel(args.heads * k, m)
    params = {
        "frames": F.random(0, xp=jnp, batch_shape=(args.heads,), dtype="float64"),
        "mix": S.random(1, xp=jnp, dtype="float64"),
        "readout": 0.3 * ga.random.normal(2, (m, out_dim), xp=jnp, dtype="float64"),
    }
    manifolds = {"frames": F, "mix": S, "readout": None}
    specs = {"frames": P("data"), "mix": P("data", None), "readout": P()}

    def model(p, x):
        heads = jnp.einsum("bi,hik->bhk", x, p["frames"]).reshape(x.shape[0], -1)
        return jnp.tanh(heads @ p["mix"]) @ p["readout"]

    def loss(p, b):
        return jnp.mean((model(p, b[0]) - b[1]) ** 2)

    # a teacher of the same form: the targets are reachable
    teacher = {
        "frames": F.random(10, xp=jnp, batch_shape=(args.heads,), dtype="float64"),
        "mix": S.random(11, xp=jnp, dtype="float64"),
        "readout": ga.random.normal(12, (m, out_dim), xp=jnp, dtype="float64"),
    }
    xs = ga.random.normal(3, (args.steps, batch, d), xp=jnp, dtype="float64")
    batches = [(x, model(teacher, x)) for x in xs]

    mesh = Mesh(np.array(jax.devices()[: args.devices]), ("data",))
    opt = ga.optim.Adam(lr=args.lr)
    step, state = ga.jax.make_train_step(loss, opt, params, manifolds, mesh=mesh, param_sharding=specs)
    p = jax.device_put(params, {key: NamedSharding(mesh, spec) for key, spec in specs.items()})
    split = NamedSharding(mesh, P("data"))
    # compiled ahead of time to read what it communicates; the same executable then runs the steps
    step = step.lower(p, state, jax.device_put(batches[0], split)).compile()
    print("collectives in the compiled step (result shape, kind, count):")
    for (shape, kind), n in sorted(collectives(step.as_text()).items(), key=lambda item: item[0][::-1]):
        print(f"  {kind:18s} {shape:14s} ×{n}")
    every = max(1, args.steps // 5)
    for t, b in enumerate(batches):
        p, state, value = step(p, state, jax.device_put(b, split))
        if t % every == 0 or t == args.steps - 1:
            print(f"step {t + 1:4d}  loss {float(value):.6f}")

    print(f"mesh: {args.devices} devices along 'data'")
    for key, leaf in p.items():
        shards = sorted({tuple(s.data.shape) for s in leaf.addressable_shards})
        print(f"  {key:8s} {tuple(leaf.shape)} → per device {shards}")
    frames_state = [leaf for leaf in jax.tree_util.tree_leaves(state) if leaf.ndim == 3 and leaf.shape[0] == args.heads]
    for leaf in frames_state:
        shards = sorted({tuple(s.data.shape) for s in leaf.addressable_shards})
        print(f"  state of the frames {tuple(leaf.shape)} → per device {shards}")
    errors = [
        float(jnp.max(jnp.abs(jnp.swapaxes(Y, -1, -2) @ Y - jnp.eye(Y.shape[-1])))) for Y in (p["frames"], p["mix"])
    ]
    print(f"max|YᵀY − I| = {max(errors):.2e}")

    if args.check:
        one, s1 = ga.jax.make_train_step(loss, opt, params, manifolds)
        p1 = params
        for b in batches:
            p1, s1, v1 = one(p1, s1, b)
        diff = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(c))))
            for a, c in zip(
                jax.tree_util.tree_leaves((p1, s1, v1)), jax.tree_util.tree_leaves((p, state, value)), strict=True
            )
        )
        print(f"max difference from one device (parameters, state, loss) = {diff:.2e}")


def collectives(hlo: str) -> collections.Counter:
    """``{(result shape, kind): count}`` of the collective operations in a compiled HLO module's text
    (``f64[32,8]``, ``all-gather``; the asynchronous ``-start`` halves counted as their operation)."""
    found = re.findall(
        r"= (\w+\[[\d,]*\])\S* (all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)(?:-start)?\(", hlo
    )
    return collections.Counter(found)


if __name__ == "__main__":
    main()
