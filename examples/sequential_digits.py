"""geotorch's sequential-MNIST example on scikit-learn's 8×8 digits: geotorch against geoarray.torch.

geotorch's ``examples/sequential_mnist.py`` (github.com/lezcano/geotorch) classifies MNIST one pixel per
step with an orthogonal RNN: h_t = modReLU(W h_{t−1} + V x_t + b), logits = A h_T + c, with
modReLU(z) = sign(z)·relu(|z| + β), W orthogonal, initialised on the torus (a block-diagonal rotation
with angles b = −tan(x/2), x ~ U[0, π/2], in [−1, 0]: geotorch's "à la Cayley" angles), and trained by
``torch.optim.RMSprop`` with two groups: lr 1e-3 for the other weights, lr_orth 1e-4 for W. Here the
data are scikit-learn's bundled 8×8 digits (1797 images, no download), as sequences of 64 pixels scaled
to [0, 1] (pixel/16, as torchvision's ``ToTensor`` does for MNIST), one fixed stratified split of
1437 training and 360 test images. Two trainings per seed, with the same initial weights, the same
batch order and the same hyperparameters:

* ``geotorch``: ``geotorch.orthogonal(recurrent_kernel, "weight")`` and ``torch.optim.RMSprop``, as
  geotorch's example (geotorch 0.4.0); its weight is assigned the initial W, as the example assigns its
  torus sample;
* ``geoarray``: ``geoarray.torch.orthogonal_(recurrent_kernel, "weight")`` (W a ManifoldParameter on
  the orthogonal group) and ``geoarray.torch.RMSprop`` (torch's RMSprop with the gradient lifted to
  g^hor and a retraction as the step), the port of the migration guide.

The initial weights of a seed are drawn once (torch's generator seeded with the seed; W by
``geoarray.torch.init.torus_init_`` with geotorch's angles) and copied into both models; each epoch
visits the training set in an order drawn from a generator seeded with the seed, in batches of 128
(the last one partial, as geotorch's ``DataLoader``). geotorch's sizes: hidden 170, batch 128, lr 1e-3,
lr_orth 1e-4. Its 70 epochs are 33,000 steps on MNIST's 60,000 images; on 1437 digits an epoch is 12
steps, and the default is 100 epochs (1,200 steps): on seed 0 the test accuracy rises to 0.95 by epoch 20
and then levels off (mean over epochs 21–50: 0.920, over 51–100: 0.927; geoarray 0.919, 0.926), while
RMSprop keeps it swinging between 0.81 and 0.96 from one epoch to the next and the training loss falls
slowly (0.09 in epochs 41–50, 0.05 in 91–100). The accuracy after the last epoch inherits that swing;
geotorch's example also prints the best epoch's ("Best Accuracy", chosen on the test set), kept here as
``best_test_accuracy``.

Printed per seed: the test accuracy after the last epoch and max|WᵀW − I| of the recurrent weight for
both, and their difference; then mean ± sample standard deviation over the seeds of each, and of the
per-seed difference geoarray − geotorch. ``--json`` writes the table, every run (with its loss and
test-accuracy curves), the command and the commit. Without geotorch installed only geoarray runs.
CPU, float32 (torch's default), one thread (``--threads``).

    OMP_NUM_THREADS=1 PYTHONPATH=src python examples/sequential_digits.py --seeds 8 \
        --json results/sequential_digits.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
from _results import command, commit, stats, write_json
from torch import nn
from torch.nn.utils import parametrize

import geoarray.torch as gt

METHODS = ("geotorch", "geoarray")
N_CLASSES = 10
N_TEST = 360  # of 1797: 1437 training images, 12 batches of 128 (the last of 29)


def digits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's 8×8 digits as 64-step sequences in [0, 1] and their labels, split once (stratified,
    ``random_state=0``) into 1437 training and 360 test images."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    xtr, xte, ytr, yte = train_test_split(
        bunch.data, bunch.target, test_size=N_TEST, stratify=bunch.target, random_state=0
    )

    def tensors(x, y):
        return torch.tensor(x, dtype=torch.float32) / 16.0, torch.tensor(y, dtype=torch.long)

    return tensors(xtr, ytr), tensors(xte, yte)


class ModReLU(nn.Module):
    """sign(z)·relu(|z| + β), one bias β per unit, β ~ U[−0.01, 0.01]."""

    def __init__(self, features: int):
        super().__init__()
        self.b = nn.Parameter(torch.empty(features))
        with torch.no_grad():
            self.b.uniform_(-0.01, 0.01)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sign(z) * torch.relu(z.abs() + self.b)


def cayley_angles_(b: torch.Tensor) -> torch.Tensor:
    """geotorch's angles for the torus initialisation: x ~ U[0, π/2], b = −√((1 − cos x)/(1 + cos x)),
    that is −tan(x/2)."""
    return b.uniform_(0.0, math.pi / 2.0).mul_(0.5).tan_().neg_()


class ExpRNNCell(nn.Module):
    """modReLU(W h + V x + b) with W = ``recurrent_kernel.weight``, constrained by ``constrain`` (geotorch's
    or geoarray's call on the layer) and, when ``torus`` is set, filled with the torus initialisation."""

    def __init__(self, input_size: int, hidden_size: int, constrain, torus: bool):
        super().__init__()
        self.hidden_size = hidden_size
        self.recurrent_kernel = nn.Linear(hidden_size, hidden_size, bias=False)
        self.input_kernel = nn.Linear(input_size, hidden_size)
        self.nonlinearity = ModReLU(hidden_size)
        constrain(self.recurrent_kernel)
        nn.init.kaiming_normal_(self.input_kernel.weight, nonlinearity="relu")
        if torus:
            with torch.no_grad():
                gt.init.torus_init_(self.recurrent_kernel.weight, init_=cayley_angles_)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.nonlinearity(self.input_kernel(x) + self.recurrent_kernel(h))


class Model(nn.Module):
    """geotorch's sequential-MNIST model: the cell reads one pixel per step, a linear layer reads the last
    state."""

    def __init__(self, hidden_size: int, constrain, torus: bool):
        super().__init__()
        self.rnn = ExpRNNCell(1, hidden_size, constrain, torus)
        self.lin = nn.Linear(hidden_size, N_CLASSES)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        h = pixels.new_zeros(pixels.shape[0], self.rnn.hidden_size)
        with parametrize.cached():  # geotorch's W is computed once per forward
            for x in torch.unbind(pixels, dim=1):
                h = self.rnn(x.unsqueeze(1), h)
        return self.lin(h)


def recurrent_weight(model: Model) -> torch.Tensor:
    return model.rnn.recurrent_kernel.weight


def orthogonality_error(model: Model) -> float:
    W = recurrent_weight(model).detach().double()
    return (W.T @ W - torch.eye(W.shape[1], dtype=W.dtype)).abs().max().item()


def geoarray_model(seed: int, hidden: int) -> Model:
    """The port: ``gt.orthogonal_`` on the recurrent layer, then the torus initialisation (in place on the
    ManifoldParameter); every initial weight drawn from torch's generator seeded with ``seed``."""
    torch.manual_seed(seed)
    return Model(hidden, lambda layer: gt.orthogonal_(layer, "weight"), torus=True)


def geotorch_model(start: Model) -> Model:
    """geotorch's model with ``start``'s initial weights: W assigned through the parametrization (geotorch's
    way of setting an orthogonal weight), the others loaded."""
    import geotorch

    model = Model(start.rnn.hidden_size, lambda layer: geotorch.orthogonal(layer, "weight"), torus=False)
    state = {k: v.detach().clone() for k, v in start.state_dict().items()}
    with torch.no_grad():
        model.rnn.recurrent_kernel.weight = state.pop("rnn.recurrent_kernel.weight")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("parametrizations" in k for k in missing), (missing, unexpected)
    return model


def rmsprop(model: Model, method: str, args: argparse.Namespace) -> torch.optim.Optimizer:
    """geotorch's two groups: W (its parametrization's tensors for geotorch) at lr_orth, the rest at lr."""
    orth = list(model.rnn.recurrent_kernel.parameters())
    orth_set = set(orth)
    rest = [p for p in model.parameters() if p not in orth_set]
    RMSprop = gt.RMSprop if method == "geoarray" else torch.optim.RMSprop
    return RMSprop([{"params": rest}, {"params": orth, "lr": args.lr_orth}], lr=args.lr)


def evaluate(model: Model, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Cross-entropy and accuracy on (x, y)."""
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(1) == y).float().mean().item()
    return loss, accuracy


def train(method: str, model: Model, seed: int, data, args: argparse.Namespace) -> dict:
    (xtr, ytr), (xte, yte) = data
    opt = rmsprop(model, method, args)
    order = torch.Generator().manual_seed(seed)  # the same batches for both methods
    curve, test_accuracy, start = [], [], time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xtr), generator=order)
        for i in range(0, len(xtr), args.batch):
            idx = perm[i : i + args.batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            curve.append(value if math.isfinite(value) else None)
        model.eval()
        test_accuracy.append(evaluate(model, xte, yte)[1])
        if args.log_every and (epoch + 1) % args.log_every == 0:
            print(f"  {method:8s} seed {seed} epoch {epoch + 1:4d} loss {value:.4f} test {test_accuracy[-1]:.4f}",
                  flush=True)  # fmt: skip
    loss, accuracy = evaluate(model, xte, yte)
    return {
        "method": method,
        "seed": seed,
        "test_accuracy": accuracy,
        "test_loss": loss if math.isfinite(loss) else None,
        "best_test_accuracy": max(test_accuracy),  # geotorch's "Best Accuracy" (chosen on the test set)
        "orthogonality_error": orthogonality_error(model),
        "seconds": time.perf_counter() - start,
        "curve": curve,
        "test_accuracy_curve": test_accuracy,
    }


def summarise(runs: list[dict]) -> dict:
    table = {}
    for method in METHODS:
        rs = [r for r in runs if r["method"] == method]
        if rs:
            table[method] = {
                "seeds": [r["seed"] for r in rs],
                "test_accuracy": stats([r["test_accuracy"] for r in rs]),
                "best_test_accuracy": stats([r["best_test_accuracy"] for r in rs]),
                "test_loss": stats([r["test_loss"] for r in rs]),
                "orthogonality_error": stats([r["orthogonality_error"] for r in rs]),
                "seconds_per_run": statistics.mean(r["seconds"] for r in rs),
            }
    pairs = {(r["method"], r["seed"]): r["test_accuracy"] for r in runs}
    seeds = [s for m, s in pairs if m == "geotorch" and ("geoarray", s) in pairs]
    diff = [pairs["geoarray", s] - pairs["geotorch", s] for s in seeds]
    if diff:
        table["difference"] = stats(diff)  # geoarray − geotorch, paired by seed
    return table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--epochs", type=int, default=100, help="12 steps each (geotorch: 70 epochs of MNIST)")
    p.add_argument("--hidden", type=int, default=170)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-orth", type=float, default=1e-4, help="the recurrent weight's rate")
    p.add_argument("--log-every", type=int, default=0, help="print the test accuracy every this many epochs")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the table, every run, the command and the commit here")
    p.add_argument("--smoke", action="store_true", help="a few seconds: hidden 16, 2 seeds × 2 epochs (unless given)")
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.smoke:  # smaller defaults; flags given still win
        parser.set_defaults(hidden=16, seeds=2, epochs=2)
        args = parser.parse_args(argv)
    for name in ("seeds", "epochs", "hidden", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    try:
        data = digits()
    except ImportError:
        parser.error("the 8×8 digits come from scikit-learn: pip install scikit-learn")
    try:
        import geotorch  # noqa: F401
    except ImportError:
        methods = ("geoarray",)
        print("geotorch is not installed: only geoarray runs (pip install geotorch==0.4.0 for the comparison)")
    else:
        methods = METHODS
    torch.set_num_threads(args.threads)
    ran = commit()
    runs = []
    for seed in range(args.seeds):
        start = geoarray_model(seed, args.hidden)
        models = {"geotorch": geotorch_model(start)} if "geotorch" in methods else {}
        models["geoarray"] = start
        line = []
        for method in methods:
            runs.append(train(method, models[method], seed, data, args))
            r = runs[-1]
            line.append(f"{method} accuracy {r['test_accuracy']:.4f}, max|WᵀW − I| {r['orthogonality_error']:.1e}"
                        f" ({r['seconds']:.0f} s)")  # fmt: skip
            if args.json:  # after every run: a long sweep cut short keeps what it finished
                write_json(args.json, _result(runs, args, argv, ran))
        if len(methods) == 2:
            line.append(f"difference {runs[-1]['test_accuracy'] - runs[-2]['test_accuracy']:+.4f}")
        print(f"seed {seed}: " + "; ".join(line), flush=True)
    table = summarise(runs)
    print(f"sequential 8×8 digits (1437 train / 360 test), hidden {args.hidden}, {args.epochs} epochs of batch "
          f"{args.batch}, lr {args.lr}, lr_orth {args.lr_orth}, seeds 0..{args.seeds - 1}; test accuracy after the "
          f"last epoch, mean ± sample std")  # fmt: skip
    for method in methods:
        row = table[method]
        acc, err = row["test_accuracy"], row["orthogonality_error"]
        best = row["best_test_accuracy"]
        print(f"{method:10s} accuracy {acc['mean']:.4f} ± {acc['std']:.4f} (range {acc['min']:.4f}–{acc['max']:.4f}), "
              f"best epoch {best['mean']:.4f} ± {best['std']:.4f}, max|WᵀW − I| {err['mean']:.1e} "
              f"(largest {err['max']:.1e})")  # fmt: skip
    if "difference" in table:
        d, spread = table["difference"], table["geotorch"]["test_accuracy"]["std"]
        gap = table["geoarray"]["test_accuracy"]["mean"] - table["geotorch"]["test_accuracy"]["mean"]
        verdict = (
            f", {'within' if abs(gap) <= spread else 'outside'} geotorch's seed std {spread:.4f}" if d["n"] > 1 else ""
        )
        print(f"{'difference':10s} geoarray − geotorch per seed {d['mean']:+.4f} ± {d['std']:.4f}; the means differ "
              f"by {gap:+.4f}{verdict}")  # fmt: skip
    result = _result(runs, args, argv, ran)
    if args.json:
        write_json(args.json, result)
    return result


def _result(runs: list[dict], args: argparse.Namespace, argv: list[str], ran: str | None) -> dict:
    return {
        "command": command("sequential_digits.py", argv),
        "commit": ran,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "log_every")},
        "data": "scikit-learn's bundled 8×8 digits (not MNIST), 64-pixel sequences, 1437/360 stratified split",
        "table": summarise(runs),
        "runs": runs,
    }


if __name__ == "__main__":
    main()
