"""Optimizer defaults over many seeds: Adam's ε form × the frame of its caches, mean ± std per variant.

Two tasks (both NumPy, float64 unless stated):

* ``brockett`` — stochastic PCA on St(N, n): minimise −tr(YᵀS_bY) where S_b = XᵀX/m is the sample
  covariance of a fresh minibatch of m Gaussian samples with covariance C (eigenvalues 1/k); the loss
  reported is the gap tr(UᵀCU) − tr(YᵀCY) to the optimum U (the top-n eigenvectors of C), and the
  seed sets C, the start and the minibatches.
* ``vit`` — the vision transformer of Brantner's paper scaled to scikit-learn's digits (4 patches of
  4×4, Stiefel Q/K/V, ResNet tanh feed-forward, no layer norm), trained with
  :func:`geoarray.train.fit`; the seed sets the split, the initialisation and the batch order.

Variants: ``delta`` (δ = 3·10⁻⁷ inside the root, as Brantner's eq. 6 prints it) or ``eps``
(ε = 3·10⁻⁷ outside the root, as GeometricMachineLearning.jl runs it) × the section strategy
``householder``, ``rotated``, ``transported``, ``random``; for the ViT also unconstrained weights and
``manifold-muon`` (Q/K/V with :class:`~geoarray.optim.ManifoldMuon`, the rest with Adam of the given ε
form, through :func:`~geoarray.optim.partition`).
For the Householder frame the script counts the steps where the frame jumps
(‖Q⊥(Y_t)ᵀQ⊥(Y_{t+1}) − I‖_F > 1, a pivot changing sign), per weight.

    python examples/optimizer_sweep.py brockett --seeds 8
    python examples/optimizer_sweep.py vit --seeds 8 --epochs 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import optree

import geoarray
from geoarray import optim

DELTA = 3e-7
FORMS = {"delta": {"delta": DELTA, "eps": 0.0}, "eps": {"delta": 0.0, "eps": DELTA}}
SECTIONS = ("householder", "rotated", "transported", "random")


def _frame_jumps(Y0: np.ndarray, Y1: np.ndarray) -> int:
    """Weights (leading axis) whose Householder completion jumps between two consecutive points."""
    jumps = 0
    for a, b in zip(Y0.reshape(-1, *Y0.shape[-2:]), Y1.reshape(-1, *Y1.shape[-2:]), strict=True):
        qa = np.linalg.qr(a, mode="complete")[0][:, a.shape[1] :]
        qb = np.linalg.qr(b, mode="complete")[0][:, b.shape[1] :]
        jumps += int(np.linalg.norm(qa.T @ qb - np.eye(qa.shape[1])) > 1.0)
    return jumps


# ---------------------------------------------------------------------------------------------
# Brockett / stochastic PCA
# ---------------------------------------------------------------------------------------------


def brockett(seed: int, form: str, section: str, *, N: int, n: int, m: int, steps: int, lr: float) -> dict:
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((N, N)))[0]
    eig = 1.0 / np.arange(1, N + 1)
    C = (Q * eig) @ Q.T
    root = Q * np.sqrt(eig)
    best = eig[:n].sum()
    M = geoarray.Stiefel(N, n)
    params = {"Y": M.random(seed, xp=xp)}
    opt = optim.Adam(lr, section=section, seed=seed, **FORMS[form])
    state = opt.init(params, {"Y": M})
    jumps = 0
    for _ in range(steps):
        X = rng.standard_normal((m, N)) @ root.T
        S = X.T @ X / m
        Y = params["Y"]
        params, state = opt.update(params, {"Y": -2 * S @ Y}, state)
        jumps += _frame_jumps(np.asarray(Y), np.asarray(params["Y"]))
    Y = params["Y"]
    return {"loss": best - float(np.trace(Y.T @ C @ Y)), "jumps": jumps / steps}


# ---------------------------------------------------------------------------------------------
# the vision transformer on digits
# ---------------------------------------------------------------------------------------------


def vit(
    seed: int,
    form: str,
    section: str | None,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    muon_lr: float = 5e-3,
    dual_iterations: int | None = None,
) -> dict:
    import array_api_compat.numpy as xp

    from geoarray import models, nn, train
    from geoarray.data import images

    x, labels = images.load_digits(xp=xp)
    (x_train, l_train), (x_test, l_test) = images.train_test_split(x, labels, test_fraction=0.25, seed=seed)
    data = (images.patches(x_train, 4), images.one_hot(l_train, 10))
    test = (images.patches(x_test, 4), images.one_hot(l_test, 10))
    # add_connection=True: the model the README's optimizer table was measured with
    model = models.ClassificationTransformer(
        16, 4, 10, n_heads=4, n_layers=8, stiefel=section is not None, add_connection=True
    )
    params = model.init(seed, xp=xp)
    if section == "manifold-muon":  # Q/K/V with manifold Muon, everything else with Adam
        labels = optree.tree_map(
            lambda m: "adam" if m is None else "muon", model.manifolds(), is_leaf=lambda m: m is None, none_is_leaf=True
        )
        options = {} if dual_iterations is None else {"dual_iterations": dual_iterations}
        muon = optim.ManifoldMuon(muon_lr, **options)
        opt = optim.partition({"muon": muon, "adam": optim.Adam(lr, **FORMS[form])}, labels)
    else:
        opt = optim.Adam(lr, section=section, seed=seed, **FORMS[form])
    result = train.fit(
        model, params, data, opt, nn.ClassificationL2Loss(), epochs=epochs, batch_size=batch_size, seed=seed,
        progress=False,
    )  # fmt: skip
    return {"loss": result.history[-1]["train_loss"], "acc": train.accuracy(model, result.params, *test)}


# ---------------------------------------------------------------------------------------------


def _summary(values: list[float]) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4g} ± {std:.2g}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=["brockett", "vit"])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=[*SECTIONS, "manifold-muon"])
    parser.add_argument("--muon-lr", type=float, default=5e-3, help="vit, manifold-muon: ManifoldMuon's lr")
    parser.add_argument(
        "--dual-iterations", type=int, default=None, help="vit, manifold-muon: ManifoldMuon's dual_iterations"
    )
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=list(FORMS))
    parser.add_argument("--epochs", type=int, default=15, help="vit: epochs")
    parser.add_argument("--steps", type=int, default=400, help="brockett: steps")
    parser.add_argument("--N", type=int, default=30, help="brockett: ambient dimension")
    parser.add_argument("--n", type=int, default=4, help="brockett: subspace dimension")
    args = parser.parse_args(argv)
    variants = [(f, s) for f in args.forms for s in args.sections]
    if args.task == "vit" and "manifold-muon" not in args.sections:
        variants += [(f, None) for f in args.forms]
    print(f"{args.task}: {args.seeds} seeds per variant")
    header = "loss (mean ± std)" + ("   test acc." if args.task == "vit" else "   frame jumps/step")
    print(f"{'ε form':<7} {'frame':<13} {header}")
    for form, section in variants:
        start = time.perf_counter()
        runs = []
        for seed in range(args.seeds):
            if args.task == "brockett":
                runs.append(brockett(seed, form, section, N=args.N, n=args.n, m=16, steps=args.steps, lr=1e-2))
            else:
                runs.append(
                    vit(
                        seed,
                        form,
                        section,
                        epochs=args.epochs,
                        batch_size=64,
                        lr=1e-3,
                        muon_lr=args.muon_lr,
                        dual_iterations=args.dual_iterations,
                    )
                )
        extra = "acc" if args.task == "vit" else "jumps"
        label = section or "unconstrained"
        print(
            f"{form:<7} {label:<13} {_summary([r['loss'] for r in runs]):<20} "
            f"{_summary([r[extra] for r in runs]):<14} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
