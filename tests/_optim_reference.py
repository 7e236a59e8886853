"""The fixed problem behind tests/data/optim_reference_v0.npz: the outputs of the optimizers as they were
before they became chains of transforms (geoarray commit 25646ef, the single-class driver), on a mixed tree
of Stiefel, Grassmann, symplectic Stiefel and Euclidean leaves, float64. tests/test_transforms.py checks on
every backend that the convenience optimizers still produce these numbers.

    python tests/_optim_reference.py      # regenerates the file (meaningful only on that commit)
"""

from __future__ import annotations

from pathlib import Path

import optree

import geoarray
from geoarray import optim
from geoarray.manifolds import Grassmann, Stiefel, SymplecticStiefel

N_STEPS = 6
PATH = Path(__file__).with_name("data") / "optim_reference_v0.npz"


def problem(xp, device=None, section="householder"):
    """Stiefel (two same-shape leaves), Grassmann, symplectic Stiefel and Euclidean leaves."""
    St, Gr, Sp = Stiefel(9, 3, section=section), Grassmann(8, 2, section=section), SymplecticStiefel(8, 4)
    params = {
        "heads": [St.random(0, xp=xp, device=device), St.random(1, xp=xp, device=device)],
        "sub": Gr.random(2, xp=xp, device=device),
        "sp": Sp.random(3, xp=xp, device=device),
        "w": geoarray.random.normal(4, (3, 4), xp=xp, device=device),
        "b": geoarray.random.normal(5, (4,), xp=xp, device=device),
    }
    mans = {"heads": [St, St], "sub": Gr, "sp": Sp, "w": None, "b": None}
    return params, mans


def grads_at(params, t, xp, device=None):
    """Gradients that depend on the point and the step (a quadratic plus step-seeded noise)."""
    leaves, treedef = optree.tree_flatten(params)
    out = []
    for i, leaf in enumerate(leaves):
        noise = geoarray.random.normal(100 * t + i, tuple(leaf.shape), xp=xp, device=device)
        out.append(2.0 * leaf + 0.3 * noise - 1.0)
    return optree.tree_unflatten(treedef, out)


def optimizers():
    """name → (optimizer, section of the manifolds); as configured when the file was written."""
    return {
        "gradient": (optim.Gradient(0.05), "householder"),
        "momentum": (optim.Momentum(0.05, alpha=0.7), "householder"),
        "adam": (optim.Adam(0.02, beta1=0.85, beta2=0.97, delta=1e-6), "householder"),
        "adam_grouped": (optim.Adam(0.02, group_same_shape=True), "householder"),
        "adam_transported": (optim.Adam(0.02), "transported"),
        "adam_decay": (optim.AdamWithDecay(n_steps=4, lr_start=0.05, lr_end=0.005), "householder"),
        "bfgs": (optim.BFGS(0.05), "transported"),
    }


def run(opt, section, xp, device=None):
    params, mans = problem(xp, device, section)
    if isinstance(opt, optim.BFGS) or opt.section == "transported":  # SpSt has Householder sections only
        params = {k: v for k, v in params.items() if k != "sp"}
        mans = {k: v for k, v in mans.items() if k != "sp"}
    state = opt.init(params, mans)
    for t in range(1, N_STEPS + 1):
        params, state = opt.update(params, grads_at(params, t, xp, device), state)
    return params


def key(name, path):
    return name + "/" + "/".join(map(str, path))


if __name__ == "__main__":
    import array_api_compat.numpy as xp
    import numpy as np

    out = {}
    for name, (opt, section) in optimizers().items():
        paths, leaves, _ = optree.tree_flatten_with_path(run(opt, section, xp))
        out.update({key(name, p): np.asarray(leaf) for p, leaf in zip(paths, leaves, strict=True)})
    np.savez(PATH, **out)
    print(f"{len(out)} arrays written to {PATH}")
