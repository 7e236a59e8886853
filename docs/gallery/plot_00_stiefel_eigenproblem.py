"""
Stiefel Adam on an eigenvalue problem
=====================================

The first thing to try with a manifold optimizer: the dominant eigenspace of a symmetric matrix as an
optimization problem on the Stiefel manifold

.. math::

    \\max_{Y \\in \\mathrm{St}(n, k)} \\operatorname{tr}(Y^\\top S Y), \\qquad
    \\mathrm{St}(n, k) = \\{Y \\in \\mathbb R^{n \\times k} : Y^\\top Y = I_k\\}.

By Ky Fan's theorem the maximum is :math:`\\lambda_1 + \\dots + \\lambda_k`, the sum of the :math:`k`
largest eigenvalues of :math:`S`, attained exactly when the columns of :math:`Y` span the dominant
eigenspace. The page solves it with :class:`geoarray.optim.Adam`, the manifold Adam of Brantner,
*Generalizing Adam to Manifolds for Efficiently Training Transformers* (Algorithm 1), and checks the
answer against ``numpy.linalg.eigvalsh``.
"""

import os

import matplotlib.pyplot as plt
import numpy as np

import geoarray as ga

SMOKE = os.environ.get("GEOARRAY_GALLERY_SMOKE") == "1"  # the tests run every page at a tiny size

# %%
# The problem
# -----------
# A random symmetric positive semi-definite :math:`S \in \mathbb R^{50 \times 50}`, and the answer
# ``eigvalsh`` gives: the sum of its four largest eigenvalues.

n, k = 50, 4
steps = 40 if SMOKE else 400
rng = np.random.default_rng(0)
A = rng.standard_normal((n, n))
S = A @ A.T / n
best = np.linalg.eigvalsh(S)[-k:].sum()  # eigvalsh sorts ascending
print(f"λ1 + … + λ{k} = {best:.6f}")

# %%
# The optimizer
# -------------
# geoarray's optimizers work on *trees* of parameters (here a dict with one entry) with a matching tree
# of manifolds: ``init`` creates the optimizer state, ``update`` takes the Euclidean gradient and returns
# the new point and state. Each step of Algorithm 1 turns the Euclidean gradient
# :math:`\nabla f(Y)` into the Riemannian gradient
# :math:`\operatorname{grad} f = \nabla f - Y\,\nabla f^\top Y`, lifts it to the global tangent space
# representation :math:`\mathfrak g^{\mathrm{hor}}` (one fixed vector space for every point), updates
# Adam's two moments there, and moves along a retraction, so :math:`Y^\top Y = I` holds after every step
# to rounding — no projection, no penalty.
#
# We minimise :math:`f(Y) = -\operatorname{tr}(Y^\top S Y)`, whose Euclidean gradient is
# :math:`\nabla f(Y) = -2SY`.

St = ga.Stiefel(n, k)


def solve(optimizer, steps):
    params, manifolds = {"Y": St.random(xp=np, seed=1)}, {"Y": St}
    state = optimizer.init(params, manifolds)
    values, orthogonality = [], []
    for _ in range(steps):
        Y = params["Y"]
        params, state = optimizer.update(params, {"Y": -2 * S @ Y}, state)
        Y = params["Y"]
        values.append(np.trace(Y.T @ S @ Y))
        orthogonality.append(np.abs(Y.T @ Y - np.eye(k)).max())
    return params["Y"], np.asarray(values), np.asarray(orthogonality)


runs = {
    "Adam (lr 0.02)": solve(ga.optim.Adam(lr=0.02), steps),
    "gradient descent (lr 0.05)": solve(ga.optim.Gradient(lr=0.05), steps),
}
for name, (_, values, orth) in runs.items():
    print(f"{name:>27}: tr(YᵀSY) = {values[-1]:.6f}, gap {best - values[-1]:.1e}, max |YᵀY − I| = {orth.max():.1e}")

# %%
# The answer
# ----------
# The eigenvalues of the small matrix :math:`Y^\top S Y` are the Ritz values of the subspace; at the
# optimum they are the :math:`k` largest eigenvalues of :math:`S`. The cosines of the principal angles
# between ``span(Y)`` and the dominant eigenspace (the singular values of :math:`V_k^\top Y`) are 1.

Y = runs["Adam (lr 0.02)"][0]
eigenvalues, V = np.linalg.eigh(S)
print("Ritz values of Y:       ", np.round(np.linalg.eigvalsh(Y.T @ S @ Y)[::-1], 5))
print("largest eigenvalues of S:", np.round(eigenvalues[::-1][:k], 5))
print("cos of principal angles: ", np.round(np.linalg.svd(V[:, -k:].T @ Y, compute_uv=False), 6))

# %%
# The gap :math:`\lambda_1 + \dots + \lambda_k - \operatorname{tr}(Y^\top S Y)` per step, and the
# constraint :math:`\max|Y^\top Y - I|` that every iterate satisfies.

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
for name, (_, values, orth) in runs.items():
    ax1.semilogy(np.maximum(best - values, 1e-15), label=name)  # below 1e-15: rounding
    ax2.semilogy(np.maximum(orth, 1e-17), label=name)
ax1.set(xlabel="step", ylabel="gap to λ1 + … + λk", title=f"max tr(YᵀSY) on St({n}, {k})")
ax2.set(xlabel="step", ylabel="max |YᵀY − I|", title="the constraint along the run")
ax1.legend()
fig.tight_layout()
