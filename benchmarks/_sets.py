"""Stiefel weight sets shared by the step benchmarks (not part of the library).

``vit``: the paper's ViT Q/K/V, 336 × Stiefel(49, 7) as one batched tensor; ``vit-leaves``: the same as
336 separate leaves; ``NxN``-style names (``1024x64``, ``4096x128``): one Stiefel(N, n) weight; ``gpt2``:
GPT-2 small's per-head Q/K/V, 12 layers × 12 heads × 3 = 432 × Stiefel(768, 64), batched; ``tiny``:
8 × Stiefel(16, 4), for smoke runs. Gradients are fixed normal draws of scale 1e-2.
"""

from __future__ import annotations

from typing import Any

import optree

import geoarray

_BATCHED = {"vit": (49, 7, 336), "vit-leaves": (49, 7, 336), "gpt2": (768, 64, 432), "tiny": (16, 4, 8)}


def stiefel_set(name: str, xp: Any, dtype: Any, device: Any = None) -> tuple[dict, dict, dict]:
    """params, manifolds and fixed gradients of the weight set ``name`` (module docstring)."""
    if name in _BATCHED:
        N, n, b = _BATCHED[name]
        batch: tuple[int, ...] = (b,)
    else:
        (N, n), batch = map(int, name.split("x")), ()
    M = geoarray.Stiefel(N, n)
    Y = M.random(0, xp=xp, batch_shape=batch, dtype=dtype, device=device)
    if name == "vit-leaves":
        params, mans = {"W": [Y[i, ...] for i in range(batch[0])]}, {"W": [M] * batch[0]}
    else:
        params, mans = {"W": Y}, {"W": M}
    leaves, treedef = optree.tree_flatten(params)
    grads = treedef.unflatten(
        [
            geoarray.random.normal(7 + i, tuple(p.shape), xp=xp, dtype=dtype, device=device, scale=1e-2)
            for i, p in enumerate(leaves)
        ]
    )
    return params, mans, grads
