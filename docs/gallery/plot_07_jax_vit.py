"""
A JAX training script: a Stiefel vision transformer with optax
==============================================================

``examples/jax_stiefel_vit.py`` trains a vision transformer with Stiefel Q/K/V weights on the digits in
JAX: parameters and optimizer state are pytrees, ``geoarray.jax.make_train_step`` jits the step, and
``--optax`` puts the manifold Adam in an optax chain after gradient clipping. This page runs it for
10 epochs with 2 blocks and plots the loss it prints per epoch.
"""

import contextlib
import io
import re

import matplotlib.pyplot as plt
from _paths import load_example

printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    load_example("jax_stiefel_vit").main(["--epochs", "10", "--layers", "2", "--optax"])
print(printed.getvalue())

# %%
# The training loss of each epoch, read from the lines the script printed:

rows = re.findall(r"epoch +(\d+) +train loss ([0-9.]+) +test accuracy ([0-9.]+)", printed.getvalue())
assert rows, "the script printed no epoch lines: has its output format changed?"
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([int(r[0]) for r in rows], [float(r[1]) for r in rows], marker="o", label="training loss")
ax.plot([int(r[0]) for r in rows], [float(r[2]) for r in rows], marker="s", label="test accuracy")
ax.legend()
ax.set(xlabel="epoch", title="JAX, Stiefel ViT on digits")
fig.tight_layout()
