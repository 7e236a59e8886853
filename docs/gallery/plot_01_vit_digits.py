"""
Vision transformer on digits: Stiefel vs unconstrained attention
================================================================

Brantner's vision-transformer experiment (*Generalizing Adam to Manifolds for Efficiently Training
Transformers*) on scikit-learn's 8×8 digits: 4 patches of 4×4, 4-head attention whose Q/K/V weights lie
on the Stiefel manifold and are trained by manifold Adam, against the same network with unconstrained
Q/K/V trained by Adam; no layer norm in either. This page runs ``examples/vit_digits.py`` at 8 blocks,
2 seeds and 10 epochs.

The table of :doc:`/results` (10 seeds, 40 epochs, 8 and 16 blocks) comes from::

    python examples/vit_digits.py --seeds 10 --epochs 40 --layers 8 16 --attention-add both \\
        --variants adam adam-free --json results/vit_digits_attention_add_40ep.json
"""

import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from _paths import load_example

vit_digits = load_example("vit_digits")
out = Path(tempfile.mkdtemp()) / "vit.json"
table = vit_digits.main(
    ["--seeds", "2", "--epochs", "10", "--layers", "8", "--variants", "adam", "adam-free", "--json", str(out)]
)

# %%
# The training loss per epoch of every run (``adam``: Stiefel Q/K/V with manifold Adam; ``adam-free``:
# unconstrained Q/K/V with Adam).

runs = json.loads(out.read_text())["results"]
labels = {"adam": "Stiefel Q/K/V + manifold Adam", "adam-free": "unconstrained Q/K/V + Adam"}
fig, ax = plt.subplots(figsize=(6, 3.5))
for run in runs:
    color = "C0" if run["variant"] == "adam" else "C1"
    ax.plot(
        range(1, len(run["losses"]) + 1),
        run["losses"],
        color=color,
        marker="o",
        label=f"{labels[run['variant']]}, seed {run['seed']}",
    )
ax.axhline(0.9**0.5, color="gray", ls="--", lw=1, label="maximum-entropy loss √0.9")
ax.set(xlabel="epoch", ylabel="training loss", title="ViT on digits, 8 blocks")
ax.legend(fontsize=7)
fig.tight_layout()
