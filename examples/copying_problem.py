"""The copying problem with an orthogonal RNN: geoarray.torch against unconstrained training.

The task (Hochreiter & Schmidhuber, *Long Short-Term Memory*; in this form Arjovsky, Shah & Bengio,
*Unitary Evolution Recurrent Neural Networks*, and geotorch's ``examples/copying_problem.py``): an
input sequence of length L + 2K starts with K = 10 symbols drawn from an alphabet of 8, then L
blanks, a marker, and K − 1 blanks; the target is blank everywhere except the last K steps, which must
reproduce the first K symbols. A model that remembers nothing predicts blanks and then a uniform
guess, with cross-entropy K·log 8 / (L + 2K) — the *memoryless baseline*; beating it requires carrying
information across L steps, where the gradient through the recurrence is a product of L Jacobians.

The model is geotorch's ExpRNN cell: h_t = modReLU(W h_{t−1} + V x_t + b), logits = A h_t + c, with
modReLU(z) = sign(z)·relu(|z| + β). Two trainings share the initial weights (W from Henaff, Szlam &
LeCun, *Recurrent Orthogonal Networks and Long-Memory Tasks*: the exponential of a block-diagonal
skew matrix of 2×2 rotations with angles uniform in [−π, π]), the batches and the optimizer's formulas
(Adam with torch's conventions; geotorch's rates: 2·10⁻⁴ for the recurrent weight, 10⁻³ for the others):

* ``orthogonal``: W is a :class:`geoarray.torch.ManifoldParameter` on Stiefel(n, n) — the orthogonal
  group — via :func:`geoarray.torch.orthogonal_`, trained by :class:`geoarray.torch.Adam`
  (Algorithm 1 of Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*:
  the gradient is lifted to g^hor, Adam's moments are kept there, and the step is a retraction, so
  ‖WᵀW − I‖ stays at rounding level);
* ``unconstrained``: the same model with W a plain ``nn.Parameter`` trained by ``torch.optim.Adam``
  (geoarray.torch.Adam gives the same update on plain tensors).

Both report the cross-entropy and the accuracy on the last K steps of a held-out batch, the mean
training loss of the last 50 iterations (less sensitive to the loss spikes of the copying task), per seed, and
the mean ± std over seeds; ``--json`` writes the table, every run's curves, the command and the
commit; ``--plot`` draws the loss curves (mean over seeds, shaded from the lowest to the highest seed) against
the baseline.

    OMP_NUM_THREADS=1 PYTHONPATH=src python examples/copying_problem.py --length 300 --hidden 64 \
        --batch 64 --iterations 250 --lr-recurrent 1e-3 --seeds 8 \
        --json results/copying_L300.json --plot results/copying_L300.png
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

import geoarray.torch as gt

ALPHABET = 8  # symbols 1..8; 0 is the blank, 9 the marker
K = 10  # symbols to copy
N_INPUTS = ALPHABET + 2
METHODS = ("orthogonal", "unconstrained")


def copy_batch(batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of shape (batch, length + 2K): K symbols, L blanks, the marker, K − 1
    blanks; the targets are L + K blanks followed by the K symbols."""
    seq = torch.randint(1, ALPHABET + 1, (batch, K), generator=generator)
    blanks = torch.zeros(batch, length, dtype=torch.long)
    marker = torch.full((batch, 1), ALPHABET + 1, dtype=torch.long)
    x = torch.cat([seq, blanks, marker, torch.zeros(batch, K - 1, dtype=torch.long)], dim=1)
    y = torch.cat([torch.zeros(batch, length + K, dtype=torch.long), seq], dim=1)
    return x, y


def baseline_loss(length: int) -> float:
    """The memoryless cross-entropy K·log(8)/(L + 2K)."""
    return K * math.log(ALPHABET) / (length + 2 * K)


def henaff_init(n: int, generator: torch.Generator) -> torch.Tensor:
    """exp(A) for A block-diagonal with 2×2 blocks [[0, θ], [−θ, 0]], θ ~ U[−π, π] (Henaff et al.)."""
    A = torch.zeros(n, n, dtype=torch.float64)
    theta = (torch.rand(n // 2, generator=generator, dtype=torch.float64) * 2 - 1) * math.pi
    i = torch.arange(0, 2 * (n // 2), 2)
    A[i, i + 1], A[i + 1, i] = theta, -theta
    return torch.linalg.matrix_exp(A)


class ModReLU(nn.Module):
    """sign(z)·relu(|z| + β) with a learned bias β per unit (Arjovsky et al.)."""

    def __init__(self, features: int, generator: torch.Generator):
        super().__init__()
        self.b = nn.Parameter((torch.rand(features, generator=generator) * 2 - 1) * 0.01)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sign(z) * torch.relu(z.abs() + self.b)


class CopyRNN(nn.Module):
    """h_t = modReLU(W h_{t−1} + V x_t + b); logits_t = A h_t + c (geotorch's ExpRNN cell)."""

    def __init__(self, hidden: int, generator: torch.Generator):
        super().__init__()
        self.recurrent = nn.Linear(hidden, hidden, bias=False)
        self.inputs = nn.Linear(N_INPUTS, hidden)
        self.readout = nn.Linear(hidden, ALPHABET + 1)
        with torch.no_grad():
            self.recurrent.weight.copy_(henaff_init(hidden, generator))
            self.inputs.weight.normal_(0.0, math.sqrt(2.0 / N_INPUTS), generator=generator)  # Kaiming, relu
            self.inputs.bias.zero_()
            bound = 1 / math.sqrt(hidden)
            self.readout.weight.uniform_(-bound, bound, generator=generator)
            self.readout.bias.uniform_(-bound, bound, generator=generator)
        self.nonlinearity = ModReLU(hidden, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        onehot = nn.functional.one_hot(x, N_INPUTS).to(self.inputs.weight.dtype)
        driven = self.inputs(onehot)  # V x_t + b for every t at once
        W = self.recurrent.weight
        h = driven.new_zeros(x.shape[0], W.shape[0])
        states = []
        for t in range(x.shape[1]):
            h = self.nonlinearity(driven[:, t] + h @ W.T)
            states.append(h)
        return self.readout(torch.stack(states, dim=1))


def evaluate(model: CopyRNN, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Cross-entropy over all steps and accuracy over the last K (the copied symbols)."""
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
        accuracy = (logits[:, -K:].argmax(-1) == y[:, -K:]).float().mean().item()
    return loss, accuracy


def orthogonality_error(model: CopyRNN) -> float:
    W = model.recurrent.weight.detach().double()
    return (W.T @ W - torch.eye(W.shape[0], dtype=W.dtype)).abs().max().item()


def train(method: str, seed: int, args: argparse.Namespace) -> dict:
    """One run; the initial weights and the batches depend on ``seed`` only, not on ``method``."""
    init = torch.Generator().manual_seed(seed)
    model = CopyRNN(args.hidden, init)
    if method == "orthogonal":
        gt.orthogonal_(model.recurrent)  # Stiefel(n, n): the initial W is already orthogonal (kept)
    # geotorch's rates: the recurrent weight at a fifth of the others' (both methods alike)
    recurrent = [model.recurrent.weight]
    rest = [p for p in model.parameters() if p is not model.recurrent.weight]
    groups = [{"params": recurrent, "lr": args.lr_recurrent}, {"params": rest}]
    if method == "orthogonal":
        opt: torch.optim.Optimizer = gt.Adam(groups, lr=args.lr)
    else:
        opt = torch.optim.Adam(groups, lr=args.lr)
    data = torch.Generator().manual_seed(10_000 + seed)
    held_out = copy_batch(args.eval_batch, args.length, torch.Generator().manual_seed(20_000 + seed))
    curve, start = [], time.perf_counter()
    for it in range(args.iterations):
        x, y = copy_batch(args.batch, args.length, data)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        if args.clip:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        value = loss.item()
        curve.append(value if math.isfinite(value) else None)
        if args.log_every and (it + 1) % args.log_every == 0:
            print(f"  {method:13s} seed {seed} it {it + 1:5d} loss {value:.5f}", flush=True)
    loss, accuracy = evaluate(model, *held_out)
    return {
        "method": method,
        "seed": seed,
        "final_loss": loss if math.isfinite(loss) else None,
        "accuracy": accuracy,
        "last50_train_loss": _mean_finite(curve[-50:]),
        "orthogonality_error": orthogonality_error(model),
        "seconds": time.perf_counter() - start,
        "curve": curve,
    }


def _mean_finite(values: list) -> float | None:
    finite = [v for v in values if v is not None]
    return statistics.mean(finite) if finite else None


def _stats(values: list) -> dict:
    """:func:`_results.stats`, and a row with no finite value says so (its mean None) rather than None."""
    return stats(values) or {"mean": None, "std": 0.0, "n": 0, "non_finite": len(values)}


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    for method in METHODS:
        rs = [r for r in runs if r["method"] == method]
        if rs:
            rows.append(
                {
                    "method": method,
                    "seeds": [r["seed"] for r in rs],
                    "final_loss": _stats([r["final_loss"] for r in rs]),
                    "accuracy": _stats([r["accuracy"] for r in rs]),
                    "last50_train_loss": _stats([r["last50_train_loss"] for r in rs]),
                    "orthogonality_error": _stats([r["orthogonality_error"] for r in rs]),
                    "seconds_per_run": statistics.mean(r["seconds"] for r in rs),
                }
            )
    return rows


def plot(runs: list[dict], args: argparse.Namespace, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for method, color in zip(METHODS, ("C0", "C3"), strict=True):
        curves = [r["curve"] for r in runs if r["method"] == method]
        if not curves:
            continue
        t = torch.tensor([[math.nan if v is None else v for v in c] for c in curves], dtype=torch.float64)
        steps = range(1, t.shape[1] + 1)
        ax.plot(steps, t.nanmean(0), color=color, label=f"{method} (mean of {len(curves)} seeds; band: min–max)")
        # min–max rather than mean ± std: the band stays positive on the log axis
        low, high = t.nan_to_num(math.inf).min(0).values, t.nan_to_num(-math.inf).max(0).values
        ax.fill_between(steps, low, high, color=color, alpha=0.2)
    ax.axhline(baseline_loss(args.length), color="k", ls="--", lw=1, label="memoryless baseline")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cross-entropy (training batch)")
    ax.set_title(f"copying problem, L = {args.length}, hidden {args.hidden}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=300, help="L, the number of blanks to remember across")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--eval-batch", type=int, default=256)
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-recurrent", type=float, default=2e-4, help="the recurrent weight's rate")
    p.add_argument("--clip", type=float, default=0.0, help="clip the gradient norm (0: off, as geotorch)")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--log-every", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the table, every run, the command and the commit here")
    p.add_argument("--plot", default=None, help="write the loss curves here (PNG)")
    p.add_argument("--smoke", action="store_true", help="a few seconds: L = 8, hidden 16, 2 seeds × 5 iterations")
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.smoke:
        args.length, args.hidden, args.batch, args.eval_batch = 8, 16, 8, 16
        args.iterations, args.seeds = 5, 2
    for name in ("length", "hidden", "batch", "eval_batch", "iterations", "seeds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    ran = commit()  # the code that runs, not the HEAD at the end of a long run
    runs = []
    for seed in range(args.seeds):
        for method in args.methods:
            runs.append(train(method, seed, args))
            r = runs[-1]
            # after every run: a long sweep cut short keeps what it finished
            if args.json:
                write_json(args.json, _result(runs, args, argv, ran))
            if args.plot:
                plot(runs, args, args.plot)
            print(
                f"{method:13s} seed {seed}: loss {r['final_loss']}, accuracy {r['accuracy']:.3f}, "
                f"‖WᵀW − I‖ {r['orthogonality_error']:.1e}, {r['seconds']:.0f} s",
                flush=True,
            )
    table = summarise(runs)
    print(f"copying problem L = {args.length}, hidden {args.hidden}, {args.iterations} iterations of batch "
          f"{args.batch}, lr {args.lr}, seeds 0..{args.seeds - 1}; memoryless baseline "
          f"{baseline_loss(args.length):.4f}")  # fmt: skip
    for row in table:
        fl, acc, err = row["final_loss"], row["accuracy"], row["orthogonality_error"]
        print(
            f"{row['method']:13s} final loss {_fmt(fl['mean'], '.4g')} ± {fl['std']:.2g} "
            f"(non-finite {fl['non_finite']}), "
            f"accuracy {acc['mean']:.3f} ± {acc['std']:.3f}, ‖WᵀW − I‖ {err['mean']:.1e}"
        )
    result = _result(runs, args, argv, ran)
    if args.json:
        write_json(args.json, result)
    return result


def _result(runs: list[dict], args: argparse.Namespace, argv: list[str], ran: str | None) -> dict:
    return {
        "command": command("copying_problem.py", argv),
        "commit": ran,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "plot", "log_every")},
        "baseline_loss": baseline_loss(args.length),
        "table": summarise(runs),
        "runs": runs,
    }


if __name__ == "__main__":
    main()
