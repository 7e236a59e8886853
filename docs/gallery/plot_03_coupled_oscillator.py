"""
Coupled oscillator: the linear symplectic transformer
=====================================================

The coupled-oscillator experiment of the *Linear Symplectic Attention* chapter of
GeometricMachineLearning.jl's documentation: two masses on springs, coupled by a nonlinear (sigmoid)
spring, a Hamiltonian system in :math:`z = (q_1, q_2, p_1, p_2)`. Its flow is symplectic,
:math:`J^\\top \\mathbb J J = \\mathbb J` for the Jacobian :math:`J` and
:math:`\\mathbb J = \\begin{pmatrix} 0 & I \\\\ -I & 0 \\end{pmatrix}`, and conserves the energy
:math:`H`. The linear symplectic transformer maps a window of :math:`T` states to the next with a map that
is symplectic on the product space of the window: its attention is a shear of the :math:`p` (or
:math:`q`) part by the gradient of :math:`\\tfrac12\\operatorname{tr}(Q A Q^\\top)`, followed by SympNet
layers. The page trains it and a standard transformer with :func:`geoarray.train.fit` and compares their
rollouts' energy.
"""

import os

import matplotlib.pyplot as plt
import numpy as np

import geoarray as ga
from geoarray.data import systems

SMOKE = os.environ.get("GEOARRAY_GALLERY_SMOKE") == "1"  # the tests run every page at a tiny size

# %%
# The data
# --------
# :mod:`geoarray.data.systems` integrates the oscillator with the Störmer–Verlet method (itself
# symplectic) from initial conditions :math:`q_1 \in [-1, 1]`, :math:`q_2 = p_1 = p_2 = 0`;
# :func:`geoarray.data.windows` cuts the trajectories into (window, next window) pairs of 3 states.

T = 3
z0 = systems.coupled_oscillator_initial_conditions(4 if SMOKE else 20, xp=np)
x, y = ga.data.windows(systems.coupled_oscillator_trajectories(z0, 10 if SMOKE else 60), T, T)
print(f"{z0.shape[0]} trajectories, {x.shape[0]} training windows of shape {x.shape[1:]}")

steps = 10 if SMOKE else 200
held_out = np.asarray([[q, 0.0, 0.0, 0.0] for q in (-0.73, 0.31, 0.88)])
truth = systems.coupled_oscillator_trajectories(held_out, steps + T - 1)
H0 = systems.coupled_oscillator_hamiltonian(truth[:, :1])

# %%
# Training
# --------
# :class:`geoarray.models.LinearSymplecticTransformer` is a pure (``init``, ``apply``) pair like every
# geoarray model; its weights are Euclidean (the structure is in the layers), so plain
# :class:`~geoarray.optim.Adam` trains it.

models = {
    "linear symplectic transformer": ga.models.LinearSymplecticTransformer(4, T, L=2, n_sympnet=2, upscale=8),
    "standard transformer": ga.models.StandardTransformerIntegrator(4, T, n_heads=1, L=2, upscale=4),
}
results = {
    name: ga.train.fit(
        model,
        model.init(0, xp=np, dtype=np.float64),
        (x, y),
        ga.optim.Adam(lr=3e-3),
        ga.nn.MSELoss(),
        epochs=3 if SMOKE else 100,
        batch_size=64,
        seed=0,
        progress=False,
    )
    for name, model in models.items()
}

# %%
# Rollout
# -------
# :func:`geoarray.models.iterate` feeds each predicted window back in. The energy of the true
# trajectory is constant; a learned map that is not symplectic tends to pump energy in or out.

rollouts = {name: ga.models.iterate(model, results[name].params, truth[:, :T], steps) for name, model in models.items()}
for name, z in rollouts.items():
    error = np.linalg.norm(z - truth) / np.linalg.norm(truth)
    drift = np.abs(systems.coupled_oscillator_hamiltonian(z) - H0).max()
    loss = results[name].history[-1]["train_loss"]
    print(f"{name:>30}: training loss {loss:.1e}, relative error {error:.3f}, max |H − H₀| {drift:.3f}")

# %%
# The energy error along the rollouts and the phase portrait :math:`(q_1, p_1)` of one held-out
# trajectory.

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
for (name, z), color in zip(rollouts.items(), ("C0", "C1"), strict=True):
    ax1.plot(np.abs(systems.coupled_oscillator_hamiltonian(z) - H0).T, color=color, lw=1)
    ax1.plot([], [], color=color, label=name)
    ax2.plot(z[2, :, 0], z[2, :, 2], color=color, lw=1, label=name)
ax2.plot(truth[2, :, 0], truth[2, :, 2], "k--", lw=1, label="truth")
ax1.set(xlabel="step", ylabel="|H − H₀|", title="energy error along the rollouts")
ax2.set(xlabel="q₁", ylabel="p₁", title=f"phase portrait, q₁(0) = {held_out[2, 0]}")
ax1.legend(fontsize=8)
ax2.legend(fontsize=8)
fig.tight_layout()

# %%
# One seed is a picture; the comparison over 8 seeds, with the symplectic transformer and G-SympNet, is
# in :doc:`/results` (``python examples/oscillator_stability.py``).
