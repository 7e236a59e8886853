"""
Manifold Muon and Adam on the Stiefel manifold: stochastic PCA
==============================================================

The noisy Brockett problem of ``examples/optimizer_sweep.py brockett``: minimise −tr(YᵀS_bY) over
Y ∈ St(30, 4), where S_b is the covariance of 16 fresh samples per step, so the minimiser is the top-4
eigenspace of the population covariance. Brantner's Adam (Algorithm 1, moments kept in g^hor) and
manifold Muon (the steepest-descent step under the spectral norm on the tangent space, retracted by the
polar factor) start from the same point and see the same samples; the gap to the optimum is measured
on the population covariance. One seed: a picture, not a measurement.

The 32-seed comparisons of :doc:`/optimizers` come from::

    python examples/optimizer_sweep.py brockett --seeds 32
    python examples/optimizer_sweep.py vit --seeds 32 --sections manifold-muon
"""

import os

import matplotlib.pyplot as plt
import numpy as np

import geoarray as ga
from geoarray import optim

SMOKE = os.environ.get("GEOARRAY_GALLERY_SMOKE") == "1"  # the tests run every page at a tiny size

# %%
# The problem: :math:`\min_Y -\operatorname{tr}(Y^\top S_b Y)` on :math:`\mathrm{St}(30, 4)`, with a fresh
# minibatch covariance :math:`S_b` at every step; the Euclidean gradient is :math:`-2 S_b Y`. Both
# optimizers take a tree of parameters and a matching tree of manifolds, and ``update`` returns the new
# point on the manifold.

N, n, steps = 30, 4, 30 if SMOKE else 300
rng = np.random.default_rng(0)
scales = np.linspace(2.0, 0.2, N)  # population covariance C = diag(scales²) in a random basis
basis = np.linalg.qr(rng.standard_normal((N, N)))[0]
C = basis @ np.diag(scales**2) @ basis.T
best = float(np.sort(np.linalg.eigvalsh(C))[-n:].sum())
M = ga.Stiefel(N, n)
samples = [basis @ (scales[:, None] * rng.standard_normal((N, 16))) for _ in range(steps)]


def run(opt):
    params, manifolds = {"Y": M.random(1, xp=np)}, {"Y": M}
    state = opt.init(params, manifolds)
    gaps = []
    for X in samples:
        S_b = X @ X.T / X.shape[1]
        params, state = opt.update(params, {"Y": -2 * S_b @ params["Y"]}, state)
        gaps.append(best - float(np.trace(params["Y"].T @ C @ params["Y"])))
    assert M.is_point(params["Y"], atol=1e-10)
    return gaps


gaps = {"Adam (lr 1e-2)": run(optim.Adam(lr=1e-2)), "ManifoldMuon (lr 2e-2)": run(optim.ManifoldMuon(lr=2e-2))}
for name, g in gaps.items():
    print(f"{name}: gap after {steps} steps {np.mean(g[-50:]):.4f} (mean of the last 50)")

# %%
# The gap to the optimum, tr of the top-4 eigenvalues minus tr(YᵀCY), per step:

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, g in gaps.items():
    ax.semilogy(g, label=name)
ax.set(xlabel="step", ylabel="gap to the optimum", title="stochastic PCA on St(30, 4)")
ax.legend()
fig.tight_layout()
