"""
Rigid body: the volume-preserving transformer
=============================================

The rigid-body experiment of the *Volume-preserving transformer* chapter (GeometricMachineLearning.jl):
Euler's equations integrated by the implicit midpoint rule, windows of 3 states, and a transformer
whose attention Z ↦ Z·Cayley(ZᵀAZ) and feed-forward layers have det J = 1. This page runs the
``geoarray train vpt`` command for 20 epochs and shows the figures it writes: the training loss, and a
100-step rollout with the drift of ‖z‖ (exactly 1 along the true flow). With seed 0 the rollout leaves
the sphere within 100 steps: 20 epochs are far from the reference tutorial's budget (:doc:`/results`).

The multi-seed tables of :doc:`/results` come from ``examples/rigid_body_stability.py``, e.g.::

    python examples/rigid_body_stability.py --seeds 4 --epochs 60 --every 2 --batch-size 1024 \\
        --json results/rigid_body_stability.json

and ``examples/rigid_body.py --epochs 30`` compares the three models once.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from geoarray.cli import main as geoarray

out = Path(tempfile.mkdtemp())
assert geoarray(["train", "vpt", "--epochs", "20", "--out", str(out)]) == 0

# %%
# The figures the command wrote to ``--out``:

for name in ("loss.png", "rollout.png"):
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.imshow(plt.imread(out / name))
    ax.set_axis_off()
    fig.tight_layout()
