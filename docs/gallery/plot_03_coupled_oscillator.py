"""
Coupled oscillator: symplectic transformers
===========================================

The coupled-oscillator experiment of the *Linear Symplectic Attention* and *Symplectic Attention*
chapters: two masses with a sigmoid coupling, Störmer–Verlet trajectories, and models whose maps satisfy
Jᵀ𝕁J = 𝕁 (linear symplectic transformer, symplectic transformer, G-SympNet) against a standard
transformer. This page runs ``examples/oscillator_stability.py`` for one seed at the table's training
size (300 epochs on 20 trajectories) with 200-step rollouts, and shows its figure: the energy drift of
every model along a rollout and phase portraits against the truth.

The table of :doc:`/results` (8 seeds, 300 epochs, 500-step rollouts) comes from::

    python examples/oscillator_stability.py --seeds 8 --epochs 300 \\
        --json results/oscillator_stability.json --figure results/oscillator_stability.png
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from _paths import load_example

figure = Path(tempfile.mkdtemp()) / "oscillator.png"
table = load_example("oscillator_stability").main(
    ["--seeds", "1", "--epochs", "300", "--rollout", "200", "--figure", str(figure)]
)

# %%
# The figure the example wrote:

fig, ax = plt.subplots(figsize=(9, 5))
ax.imshow(plt.imread(figure))
ax.set_axis_off()
fig.tight_layout()
