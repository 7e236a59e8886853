"""A small vision transformer with Stiefel attention projections, trained on scikit-learn's digits in plain PyTorch.

The architecture of Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*
(section 4), scaled to the 8×8 digits: each image is cut into 4 patches of 4×4 pixels, a sequence
of T = 4 vectors of dim 16; ``--layers`` blocks of multi-head attention (4 heads, projections on
Stiefel(16, 4), eq. 14; without add connection, as the reference package's ``Transformer``, unless
``--attention-add on``) followed by a ResNet feed-forward layer (eq. 15); the
classification layer of eq. 16 on the last token, trained with the paper's L2 loss on the softmax
output (appendix D).

Everything is ordinary PyTorch: the layers are ``geoarray.torch.nn`` modules (the Stiefel weights
are ``ManifoldParameter``), the optimizer is ``geoarray.torch.Adam`` (a ``torch.optim.Optimizer``
running Algorithm 1 on the manifold weights and plain Adam on the others), and the loop is the usual
``loss.backward(); opt.step(); opt.zero_grad()``. At the end the script prints the accuracies and
the orthonormality error max|YᵀY − I| over all projections.

    python examples/torch_stiefel_vit.py [--epochs 30] [--seed 0] [--layers 2] [--lr 0.01] [--analytic]
                                     [--attention-add on|off]
"""

from __future__ import annotations

import argparse
import time

import torch

import geoarray
import geoarray.nn as gnn
import geoarray.torch as gt


def load_digits(seed: int) -> tuple[torch.Tensor, ...]:
    """Digits as sequences of 4 patches of 4×4 pixels (T = 4, dim = 16), scaled to [0, 1]; a 75/25 split."""
    from sklearn.datasets import load_digits as _load
    from sklearn.model_selection import train_test_split

    data = _load()
    x = torch.as_tensor(data.images, dtype=torch.float64) / 16.0  # (n, 8, 8)
    patches = x.reshape(-1, 2, 4, 2, 4).permute(0, 1, 3, 2, 4).reshape(-1, 4, 16)  # row-major patch order
    y = torch.as_tensor(data.target)
    idx_train, idx_test = train_test_split(range(len(y)), test_size=0.25, random_state=seed, stratify=data.target)
    return patches[idx_train], y[idx_train], patches[idx_test], y[idx_test]


def build(layers: int, seed: int, analytic: bool, add_connection: bool = False) -> torch.nn.Sequential:
    seeds = iter(geoarray.random.spawn(seed, 2 * layers + 1))
    kw = {"dtype": torch.float64, "analytic": analytic}
    blocks = []
    for _ in range(layers):
        blocks.append(gt.nn.MultiHeadAttention(16, 4, add_connection=add_connection, seed=next(seeds), **kw))
        blocks.append(gt.nn.ResNetLayer(16, "tanh", seed=next(seeds), **kw))
    blocks.append(gt.nn.ClassificationLayer(16, 10, seed=next(seeds), **kw))
    return torch.nn.Sequential(*blocks)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(-1) == y).double().mean().item()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--attention-add",
        choices=("on", "off"),
        default="off",
        help="add connection after the attention (default off, as geoarray's ClassificationTransformer and the "
        "reference package's Transformer)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--analytic", action="store_true", help="use the layers' analytic pullbacks, not autograd")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    model = build(args.layers, args.seed, args.analytic, args.attention_add == "on")
    opt = gt.Adam(model.named_parameters(), lr=args.lr)
    loss_fn = gnn.ClassificationL2Loss()
    n_manifold = sum(isinstance(p, gt.ManifoldParameter) for p in model.parameters())
    print(
        f"{len(y_train)} training and {len(y_test)} test digits; {sum(p.numel() for p in model.parameters())} "
        f"parameters in {len(list(model.parameters()))} tensors, {n_manifold} on Stiefel(16, 4) (4 heads each)"
    )
    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(y_train), generator=generator)
        total = 0.0
        for i in range(0, len(order), args.batch_size):
            batch = order[i : i + args.batch_size]
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            opt.step()
            opt.zero_grad()
            total += loss.item() * len(batch)
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            train_acc = accuracy(model, x_train, y_train)
            print(
                f"epoch {epoch:3d}  loss {total / len(y_train):.4f}  train acc {train_acc:.3f}  "
                f"test acc {accuracy(model, x_test, y_test):.3f}  ({time.perf_counter() - start:.1f} s)"
            )
    drift = max(
        (p.detach().mT @ p.detach() - torch.eye(p.shape[-1], dtype=p.dtype)).abs().max().item()
        for p in model.parameters()
        if isinstance(p, gt.ManifoldParameter)
    )
    print(f"test accuracy {accuracy(model, x_test, y_test):.3f}; max |YᵀY − I| over the projections: {drift:.1e}")


if __name__ == "__main__":
    main()
