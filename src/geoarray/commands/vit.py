"""``geoarray demo`` and ``geoarray train vit``: the vision transformer of Brantner, "Generalizing Adam
to manifolds for efficiently training transformers", on scikit-learn's digits or on MNIST."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import BACKENDS, CommandError, add_common_train_options, nonnegative_int, positive_float, positive_int

__all__ = ["add_demo_parser", "add_train_parser", "run_demo", "run_train"]

_OPTIMIZERS = ("adam", "gradient", "momentum")
_ATTENTION_ADD = "off"  # follows ClassificationTransformer's default add_connection=False


def _add_model_options(parser: argparse.ArgumentParser, *, n_layers: int = 8, lr: float = 3e-3) -> None:
    parser.add_argument(
        "--patch-size", type=positive_int, default=None, help="side of the square patches (default: 4 digits, 7 MNIST)"
    )
    parser.add_argument("--n-heads", type=positive_int, default=None, help="attention heads (default: patch size)")
    parser.add_argument(
        "--n-layers", type=positive_int, default=n_layers, help=f"transformer blocks (default: {n_layers})"
    )
    parser.add_argument(
        "--attention-add",
        choices=("on", "off"),
        default=_ATTENTION_ADD,
        help="add connection after the attention: 'on' (x + attention(x)) or 'off' (attention(x) only, as the "
        f"reference package's Transformer); the feed-forward always adds (default: {_ATTENTION_ADD})",
    )
    parser.add_argument("--batch-size", type=positive_int, default=64, help="mini-batch size (default: 64)")
    parser.add_argument("--lr", type=positive_float, default=lr, help=f"learning rate (default: {lr:g})")
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        metavar="N",
        help="train on the first N training images only (quick runs; default: all)",
    )


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``train vit`` on the ``train`` subparsers."""
    p = subparsers.add_parser(
        "vit",
        help="vision transformer with Stiefel attention on digits or MNIST",
        description=(
            "Train the vision transformer of Brantner's 'Generalizing Adam to manifolds' (no layer norm): "
            "images cut into square patches, L blocks of multi-head attention (Stiefel Q/K/V unless "
            "--unconstrained; no add connection after it unless --attention-add on, as the reference "
            "package) and a tanh feed-forward layer with add connection, classification from the "
            "last patch, the paper's L2 loss. Writes metrics.json and loss.png to --out."
        ),
    )
    add_common_train_options(p, epochs=10)
    p.add_argument("--data", choices=("digits", "mnist"), default="digits", help="data set (default: digits, offline)")
    p.add_argument("--data-dir", metavar="DIR", default=None, help="directory with the MNIST IDX files (--data mnist)")
    _add_model_options(p)
    p.add_argument("--optimizer", choices=_OPTIMIZERS, default="adam", help="optimizer (default: adam)")
    p.add_argument("--unconstrained", action="store_true", help="plain (not Stiefel) Q/K/V weights")
    p.set_defaults(func=run_train, prog=p.prog)
    return p


def add_demo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``demo``."""
    p = subparsers.add_parser(
        "demo",
        help="Stiefel vs unconstrained vision transformer on digits (about a minute on 2 cores: 51-60 s measured)",
        description=(
            "Train the vision transformer on scikit-learn's 8x8 digits twice from the same seed, at the "
            "paper's depth of 16 blocks: Stiefel Q/K/V weights with manifold Adam, and unconstrained "
            "weights with Adam (no layer norm in either). Prints final train loss, test accuracy, "
            "max |Y^T Y - I| over the attention weights and seconds, and writes a loss plot."
        ),
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="numpy",
        help="array backend (default: numpy)",
    )
    p.add_argument("--epochs", type=positive_int, default=40, help="epochs per run (default: 40)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of both runs (default: 0)")
    p.add_argument(
        "--out", metavar="DIR", default="geoarray-demo", help="where the plot goes (default: ./geoarray-demo)"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the tqdm progress bars")
    _add_model_options(p, n_layers=16)
    p.set_defaults(func=run_demo, prog=p.prog)
    return p


# -- shared pieces of both commands ------------------------------------------------------------


def _load(args: argparse.Namespace, xp: Any) -> tuple[tuple[Any, Any], tuple[Any, Any], int]:
    """((x_train, y_train), (x_test, y_test), patch_size) as patch sequences and one-hot rows."""
    from ..data import images

    data = getattr(args, "data", "digits")
    try:
        if data == "mnist":
            if args.data_dir is None:
                raise CommandError(
                    "--data mnist needs --data-dir DIR holding the MNIST IDX files (nothing is downloaded)"
                )
            x_train, l_train = images.load_mnist(args.data_dir, split="train", xp=xp, dtype="float64")
            x_test, l_test = images.load_mnist(args.data_dir, split="test", xp=xp, dtype="float64")
        else:
            x, labels = images.load_digits(xp=xp, dtype="float64")
            (x_train, l_train), (x_test, l_test) = images.train_test_split(x, labels, test_fraction=0.25, seed=0)
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    patch = _heads(args)[0]
    H, W = x_train.shape[-2:]
    if H % patch or W % patch:
        raise CommandError(f"--patch-size {patch} does not divide the {H}x{W} images")
    if args.limit is not None:
        x_train, l_train = x_train[: args.limit, ...], l_train[: args.limit]
    train = (images.patches(x_train, patch), images.one_hot(l_train, 10, dtype="float64"))
    test = (images.patches(x_test, patch), images.one_hot(l_test, 10, dtype="float64"))
    return train, test, patch


#: a guard against a typo such as --n-layers 80000000 (the paper's deepest ViT has 16 blocks), which would
#: allocate gigabytes of weights before the first step
MAX_LAYERS = 1024


def _heads(args: argparse.Namespace) -> tuple[int, int]:
    """(patch size, heads) from the options, checked before any data is read."""
    patch = args.patch_size if args.patch_size is not None else (7 if getattr(args, "data", "digits") == "mnist" else 4)
    n_heads = args.n_heads if args.n_heads is not None else patch
    if (patch * patch) % n_heads:
        raise CommandError(f"--n-heads {n_heads} must divide the patch dimension {patch * patch}")
    if args.n_layers > MAX_LAYERS:
        raise CommandError(f"--n-layers {args.n_layers} is more than the {MAX_LAYERS} blocks this command builds")
    return patch, n_heads


def _model(args: argparse.Namespace, patch: int, n_patches: int, *, stiefel: bool) -> Any:
    from ..models import ClassificationTransformer

    patch_dim = patch * patch
    n_heads = _heads(args)[1]
    return ClassificationTransformer(
        patch_dim,
        n_patches,
        10,
        n_heads=n_heads,
        n_layers=args.n_layers,
        stiefel=stiefel,
        add_connection=args.attention_add == "on",
    )


def _optimizer(name: str, lr: float) -> Any:
    from .. import optim

    # all Q/K/V matrices of one shape update in one batched manifold call (3.7x faster for 8 layers)
    if name == "gradient":
        return optim.Gradient(lr=lr, group_same_shape=True)
    if name == "momentum":
        return optim.Momentum(lr=lr, group_same_shape=True)
    return optim.Adam(lr=lr, group_same_shape=True)


def orthonormality_error(model: Any, params: Any) -> float:
    """max over all attention heads of ‖YᵀY − I‖_F for the Q/K/V projections Y (0 on the Stiefel manifold)."""
    from .._backend import array_namespace, to_host

    worst = 0.0
    for Y in model.stiefel_params(params):
        xp = array_namespace(Y)
        n = Y.shape[-1]
        E = xp.matrix_transpose(Y) @ Y - xp.eye(n, dtype=Y.dtype, device=Y.device)
        worst = max(worst, float(to_host(xp.max(xp.sqrt(xp.sum(E * E, axis=(-2, -1)))))))
    return worst


def _record(args: argparse.Namespace) -> dict:
    """What a ``train vit`` checkpoint must match to be resumed: the flags that decide the model, the
    optimizer and the data (the seed and the batch size are in fit's own meta)."""
    patch, n_heads = _heads(args)
    flags = {
        "--data": args.data,
        "--limit": args.limit,
        "--patch-size": patch,
        "--n-heads": n_heads,
        "--n-layers": args.n_layers,
        "--attention-add": args.attention_add,
        "--unconstrained": args.unconstrained,
        "--optimizer": args.optimizer,
        "--lr": args.lr,
    }
    return {"command": "train vit", "flags": flags}


def _train_one(
    args, xp, train, test, patch, *, stiefel: bool, optimizer: str, out_json: str | None, label: str, checkpoints=None
):
    import time

    from .. import nn
    from ..train import accuracy, fit

    model = _model(args, patch, train[0].shape[-2], stiefel=stiefel)
    params = model.init(args.seed, xp=xp, dtype="float64")
    if not args.no_progress:
        print(label, flush=True)
    t0 = time.perf_counter()
    result = fit(
        model,
        params,
        train,
        _optimizer(optimizer, args.lr),
        nn.ClassificationL2Loss(),
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        val_data=test,
        metrics={"test_accuracy": accuracy},
        out=out_json,
        progress=not args.no_progress,
        **(checkpoints or {}),
    )
    seconds = time.perf_counter() - t0
    row = {
        "run": label,
        "final_train_loss": result.history[-1]["train_loss"] if result.history else float("nan"),
        "test_accuracy": result.history[-1]["test_accuracy"] if result.history else float("nan"),
        "max_orthonormality_error": orthonormality_error(model, result.params),
        "seconds": seconds,
    }
    return result, row


def _plot(histories: dict[str, list[dict]], path: str, title: str) -> str:
    import os

    from ._common import require

    require("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (name, history) in enumerate(histories.items()):
        epochs = [h["epoch"] for h in history]
        color = f"C{i}"
        ax.plot(epochs, [h["train_loss"] for h in history], color=color, label=f"{name} (train)")
        if history and "val_loss" in history[0]:
            ax.plot(epochs, [h["val_loss"] for h in history], color=color, linestyle="--", label=f"{name} (test)")
    ax.axhline(0.9**0.5, color="0.5", linewidth=0.8, linestyle=":", label="max-entropy loss √0.9")
    ax.set_xlabel("epoch")
    ax.set_ylabel("L2 classification loss")
    ax.set_title(title)
    ax.legend(fontsize="small")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _table(rows: list[dict]) -> str:
    head = f"{'run':<34} {'train loss':>10} {'test acc':>9} {'max|YtY-I|':>11} {'seconds':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['run']:<34} {r['final_train_loss']:>10.4f} {r['test_accuracy']:>9.3f} "
            f"{r['max_orthonormality_error']:>11.2e} {r['seconds']:>8.1f}"
        )
    return "\n".join(lines)


# -- the commands ----------------------------------------------------------------------------------


def run_train(args: argparse.Namespace) -> int:
    import os

    from ._common import check_out, checkpoint_options, namespace_for, require, write_json

    _heads(args)
    xp = namespace_for(args.backend)
    if not args.no_progress:
        require("tqdm")
    if args.out is not None:
        require("matplotlib")  # loss.png: missing, it would fail after the training
    check_out(args, _record(args))
    train, test, patch = _load(args, xp)
    out_json = os.path.join(args.out, "metrics.json") if args.out else None
    label = f"{'unconstrained' if args.unconstrained else 'Stiefel'} + {args.optimizer}"
    result, row = _train_one(
        args,
        xp,
        train,
        test,
        patch,
        stiefel=not args.unconstrained,
        optimizer=args.optimizer,
        out_json=out_json,
        label=label,
        checkpoints=checkpoint_options(args, _record(args)),
    )
    print(_table([row]))
    if out_json is not None:
        write_json(
            out_json,
            {"config": _config(args), "summary": row, "history": result.history, "interrupted": result.interrupted},
        )
        png = _plot({label: result.history}, os.path.join(args.out, "loss.png"), f"ViT on {args.data}")
        print(f"metrics: {out_json}\nloss plot: {png}")
    if result.interrupted:
        print("interrupted: the numbers above are those of the last completed epoch")
        return 130
    return 0


def _config(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("func", "prog")}


def run_demo(args: argparse.Namespace) -> int:
    import os

    from ._common import check_out, namespace_for, require, write_json

    require("sklearn")
    require("matplotlib")
    if not args.no_progress:
        require("tqdm")
    args.data = "digits"
    _heads(args)
    xp = namespace_for(args.backend)
    check_out(args)  # a --out that cannot hold the plot fails now, not after both runs
    train, test, patch = _load(args, xp)
    print(
        f"ViT on digits: {train[0].shape[0]} train / {test[0].shape[0]} test images, {train[0].shape[-2]} patches "
        f"of {patch}x{patch}, {args.n_layers} layers (attention add {args.attention_add}), backend {args.backend}, "
        f"seed {args.seed}"
    )
    rows, histories = [], {}
    runs = (("Stiefel Q/K/V + manifold Adam", True), ("unconstrained Q/K/V + Adam", False))
    for label, stiefel in runs:
        result, row = _train_one(
            args, xp, train, test, patch, stiefel=stiefel, optimizer="adam", out_json=None, label=label
        )
        rows.append(row)
        histories[label] = result.history
        if result.interrupted:
            break
    print()
    print(_table(rows))
    png = _plot(histories, os.path.join(args.out, "demo_loss.png"), "ViT on digits: Stiefel vs unconstrained")
    js = write_json(
        os.path.join(args.out, "demo.json"), {"config": _config(args), "runs": rows, "histories": histories}
    )
    print(f"\nloss plot: {png}\nmetrics:   {js}")
    return 130 if len(rows) < len(runs) or any(r is None for r in rows) else 0
