"""A vision transformer with Stiefel attention weights, trained on scikit-learn's digits in JAX.

The experiment of Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*
(the MNIST vision transformer) scaled to the 8×8 digits: 4 patches of 4×4 pixels (patch dimension
16), 4 heads whose query/key/value projections are points of St(16, 4), L blocks of [multi-head
attention (without add connection, the reference package's choice, unless ``--attention-add on``), tanh
feed-forward with add connection], classification from the last
patch with a softmax, the paper's L2 loss. The model is geoarray's (``geoarray.models.
ClassificationTransformer``, or the same chain of ``geoarray.nn`` layers where that module is absent),
written once against the array API. JAX differentiates it and ``geoarray.jax.make_train_step`` jits
the step: ``jax.value_and_grad`` followed by manifold Adam (Algorithm 1) on every weight. ``--optax``
runs the same optimizer through optax instead — ``optax.chain(optax.clip_by_global_norm(...),
geoarray.jax.optax_transform(...))`` — applied with ``geoarray.jax.apply_updates``.

Printed per epoch: training loss and test accuracy (25 % of the digits held out); at the end the
largest orthonormality error max |YᵀY − I| over all Stiefel weights.

    python examples/jax_stiefel_vit.py [--epochs 30] [--layers 4] [--seed 0] [--optax] [--attention-add on|off]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

import geoarray as ga
import geoarray.jax as gj
from geoarray import nn


def digits(seed: int):
    """(train, test): patches (B, 4, 16) in [0, 1] and one-hot labels (B, 10), 75/25 split (seeded)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = data.images.astype(np.float64) / 16.0  # (1797, 8, 8)
    # 4×4 patches in reading order: (B, 2, 4, 2, 4) → (B, 2, 2, 4, 4) → (B, 4, 16)
    x = images.reshape(-1, 2, 4, 2, 4).transpose(0, 1, 3, 2, 4).reshape(-1, 4, 16)
    t = np.eye(10)[data.target]
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 4
    test, train = order[:n_test], order[n_test:]
    return (x[train], t[train]), (x[test], t[test])


def vision_transformer(layers: int, add_connection: bool):
    """``geoarray.models.ClassificationTransformer`` where it exists, else the same chain of geoarray.nn layers."""
    try:
        from geoarray.models import ClassificationTransformer
    except ImportError:
        pass
    else:
        return ClassificationTransformer(
            16, 4, 10, n_heads=4, n_layers=layers, stiefel=True, add_connection=add_connection
        )
    blocks = []
    for _ in range(layers):
        blocks += [nn.MultiHeadAttention(16, 4, add_connection=add_connection), nn.ResNetLayer(16, "tanh")]
    return nn.Chain(*blocks, nn.ClassificationLayer(16, 10))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument(
        "--attention-add",
        choices=("on", "off"),
        default="off",
        help="add connection after the attention (default off, as geoarray's ClassificationTransformer and the "
        "reference package's Transformer)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optax", action="store_true", help="optimizer through optax (chain with gradient clipping)")
    p.add_argument("--float32", action="store_true", help="train in float32 (default float64)")
    args = p.parse_args(argv)
    dtype = "float32" if args.float32 else "float64"
    jax.config.update("jax_enable_x64", not args.float32)

    (xtr, ttr), (xte, tte) = digits(args.seed)
    model = vision_transformer(args.layers, args.attention_add == "on")
    params = model.init(args.seed, xp=jnp, dtype=dtype)
    manifolds = model.manifolds()
    loss_fn = nn.ClassificationL2Loss()

    def loss(params, batch):
        x, t = batch
        return loss_fn(model.apply(params, x), t)

    if args.optax:
        import optax

        opt = optax.chain(optax.clip_by_global_norm(1.0), gj.optax_transform(manifolds, "adam", lr=args.lr))
        train_step, state = gj.make_train_step(loss, opt, params)
    else:
        train_step, state = gj.make_train_step(loss, ga.optim.Adam(lr=args.lr), params, manifolds)
    predict = jax.jit(lambda params, x: jnp.argmax(model.apply(params, x), axis=-1))

    xte_j, labels_te = jnp.asarray(xte, dtype=dtype), np.argmax(tte, axis=-1)
    n_batches = len(xtr) // args.batch_size  # full batches only: one compilation
    rng = np.random.default_rng(args.seed + 1)
    print(
        f"ViT on digits in JAX: {args.layers} blocks (attention add {args.attention_add}), 4 heads on St(16, 4), "
        f"{len(xtr)} train / {len(xte)} test, "
        f"batch {args.batch_size}, Adam lr {args.lr}{' via optax' if args.optax else ''}, {dtype}, seed {args.seed}"
    )
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(xtr))
        total = 0.0
        for b in range(n_batches):
            idx = order[b * args.batch_size : (b + 1) * args.batch_size]
            batch = (jnp.asarray(xtr[idx], dtype=dtype), jnp.asarray(ttr[idx], dtype=dtype))
            params, state, value = train_step(params, state, batch)
            total += float(value)
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            acc = float(np.mean(np.asarray(predict(params, xte_j)) == labels_te))
            print(
                f"epoch {epoch:3d}  train loss {total / n_batches:.4f}  test accuracy {acc:.3f}  "
                f"({time.perf_counter() - t0:.0f} s)"
            )
    is_manifold = lambda m: m is None or isinstance(m, ga.manifolds.base.Manifold)  # noqa: E731
    orth = 0.0
    mans = jax.tree_util.tree_leaves(manifolds, is_leaf=is_manifold)
    for Y, M in zip(jax.tree_util.tree_leaves(params), mans, strict=True):
        if M is not None:
            Y = np.asarray(Y, dtype=np.float64)
            orth = max(orth, float(np.max(np.abs(np.swapaxes(Y, -1, -2) @ Y - np.eye(Y.shape[-1])))))
    print(f"max |YᵀY − I| over the Stiefel weights: {orth:.1e}; max-entropy loss √0.9 = {0.9**0.5:.3f}")


if __name__ == "__main__":
    main()
