"""The small training problem of the checkpoint tests (crash, faults, time interval): a one-layer
classification transformer on 24 random sequences of 2 tokens, 3 classes, trained by ``fit`` with Adam
(3 steps per epoch at batch size 8), float64."""

from __future__ import annotations

import numpy as np

from geoarray import nn, optim
from geoarray.models import ClassificationTransformer
from geoarray.train import fit

N, T, D, C = 24, 2, 4, 3


def problem(xp, device):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, T, D))
    y = np.eye(C)[np.argmax(x[:, -1, :C] + 0.5 * x[:, 0, :C], axis=-1)]
    return xp.asarray(x, dtype=xp.float64, device=device), xp.asarray(y, dtype=xp.float64, device=device)


def run(xp, device, *, epochs: int, batch_size: int = 8, **kw):
    """``fit`` of the problem from the same initial weights; ``kw`` are fit's other options."""
    model = ClassificationTransformer(D, T, C, n_heads=2, n_layers=1)
    params = model.init(0, xp=xp, dtype="float64", device=device)
    kw = {"epochs": epochs, "batch_size": batch_size, "progress": False, "jit": False, **kw}
    return fit(model, params, problem(xp, device), optim.Adam(lr=0.05), nn.ClassificationL2Loss(), **kw)


def like(xp, device) -> dict:
    """Templates of the parameters and the optimizer state (``load_checkpoint``'s ``like_*``)."""
    model = ClassificationTransformer(D, T, C, n_heads=2, n_layers=1)
    params = model.init(0, xp=xp, dtype="float64", device=device)
    return {"like_params": params, "like_state": optim.Adam(lr=0.05).init(params, model.manifolds())}
