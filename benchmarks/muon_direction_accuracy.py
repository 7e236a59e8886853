"""How close manifold Muon's warm-started direction comes to the exact spectral steepest direction.

    python benchmarks/muon_direction_accuracy.py [--task brockett|vit|both] [--seeds 3]

For each number of dual iterations per step (``n_iter``, ManifoldMuon's ``dual_iterations``) the
optimizer runs as users run it (EMA momentum 0.95 with Nesterov, dual variable warm-started from the
previous step, polar retraction), and at every step the direction A* it took is compared with the
optimum A_opt of the same momentum U (400 dual iterations from P = 0, converged to ~1e-15):

* ``brockett`` — NumPy, float64, noisy Brockett cost −tr(YᵀS_bY) on St(N, n) (S_b the covariance of a
  fresh minibatch of 16 samples, eigenvalues 1/k), lr 0.01, steps 10–60: the median relative
  suboptimality (⟨U, A_opt⟩ − ⟨U, A*⟩)/⟨U, A_opt⟩;
* ``vit`` — the digits vision transformer of the README (Q/K/V on St(16, 4) with ManifoldMuon lr 5e-3,
  the rest Adam), seed 0, epochs 1–3: the median and 10 % quantile of ⟨U, A*⟩/⟨U, A_opt⟩ over every
  Q/K/V matrix and step.

The numbers are quoted in the docstring of :func:`geoarray.optim.muon.manifold_muon_step`.
"""

from __future__ import annotations

import argparse

import numpy as np

ITERATIONS = (0, 1, 2, 3, 5, 10)


def _optimum(Y, U):
    from geoarray.manifolds import spectral

    _, P = spectral.stiefel_spectral_direction(Y, U, n_iter=400)
    return np.asarray(spectral.stiefel_spectral_dual(Y, U, P))


def brockett(N: int, n: int, n_iter: int, seeds: int) -> float:
    import array_api_compat.numpy as xp

    import geoarray
    from geoarray.optim.muon import manifold_muon_step

    subopt = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        Q = np.linalg.qr(rng.standard_normal((N, N)))[0]
        root = Q * np.sqrt(1.0 / np.arange(1, N + 1))
        M = geoarray.Stiefel(N, n)
        Y, P, buf = np.asarray(M.random(seed, xp=xp)), None, np.zeros((N, n))
        for t in range(61):
            X = rng.standard_normal((16, N)) @ root.T
            G = -2 * (X.T @ X / 16) @ Y
            buf = buf + 0.05 * (G - buf)  # the optimizer's EMA momentum and Nesterov form
            U = G + 0.95 * (buf - G)
            Y_new, A, P = manifold_muon_step(M, Y, U, P, lr=0.01, n_iter=n_iter)
            if t >= 10:
                best = float(_optimum(Y, U))
                subopt.append((best - float(np.sum(U * A))) / best)
            Y = Y_new
    return float(np.median(subopt))


def vit(n_iter: int) -> tuple[float, float]:
    import array_api_compat.numpy as xp
    import optree

    import geoarray.optim.manifold_muon as manifold_muon
    from geoarray import models, nn, optim, train
    from geoarray.data import images

    ratios = []
    step = manifold_muon.stiefel_spectral_step

    def recording_step(Y, U, **kw):
        Y_new, A, P = step(Y, U, return_direction=True, **kw)
        ratios.append(np.sum(U * A, axis=(-2, -1)) / _optimum(Y, U))
        return Y_new, P

    x, labels = images.load_digits(xp=xp)
    (x_train, l_train), _ = images.train_test_split(x, labels, test_fraction=0.25, seed=0)
    data = (images.patches(x_train, 4), images.one_hot(l_train, 10))
    # add_connection=True: the model benchmarks/README's figures were measured with
    model = models.ClassificationTransformer(16, 4, 10, n_heads=4, n_layers=8, stiefel=True, add_connection=True)
    labels = optree.tree_map(
        lambda m: "adam" if m is None else "muon", model.manifolds(), is_leaf=lambda m: m is None, none_is_leaf=True
    )
    muon = optim.ManifoldMuon(5e-3, dual_iterations=n_iter)
    opt = optim.partition({"muon": muon, "adam": optim.Adam(1e-3, eps=3e-7)}, labels)
    manifold_muon.stiefel_spectral_step = recording_step
    try:
        train.fit(model, model.init(0, xp=xp), data, opt, nn.ClassificationL2Loss(), epochs=3, batch_size=64,
                  seed=0, progress=False)  # fmt: skip
    finally:
        manifold_muon.stiefel_spectral_step = step
    r = np.concatenate([np.ravel(a) for a in ratios[5:]])
    return float(np.median(r)), float(np.quantile(r, 0.1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["brockett", "vit", "both"], default="both")
    ap.add_argument("--seeds", type=int, default=3, help="brockett: seeds per cell")
    args = ap.parse_args()
    if args.task in ("brockett", "both"):
        print("relative suboptimality, noisy Brockett (median over steps 10-60)")
        print(f"{'N×n':<9}" + "".join(f"{f'{k} it.':>9}" for k in ITERATIONS))
        for N, n in ((49, 7), (256, 32)):
            cells = [f"{brockett(N, n, k, args.seeds):>9.0e}" for k in ITERATIONS]
            print(f"{f'{N}×{n}':<9}" + "".join(cells), flush=True)
    if args.task in ("vit", "both"):
        print("⟨U, A*⟩ / ⟨U, A_opt⟩ on the digits ViT's Q/K/V (St(16, 4)), seed 0, epochs 1-3")
        for k in ITERATIONS[:3]:
            median, q10 = vit(k)
            print(f"{k} it.: median {median:.3f}, 10 % quantile {q10:.3f}", flush=True)


if __name__ == "__main__":
    main()
