"""ClassificationTransformer (Brantner's vision transformer) on every backend, float64.

Properties and tolerances:

* structure: 2L + 1 sublayers; ``manifolds()`` has the tree of ``init()`` and is Stiefel(d, d/h) for
  the Q/K/V leaves exactly when ``stiefel=True``, None elsewhere; the Stiefel init is on the
  manifold (YᵀY = I to 1e-12), the unconstrained one is not (‖YᵀY − I‖ > 0.1);
* outputs are probability vectors (rows sum to 1 to 1e-12) of shape (..., n_classes);
* analytic pullback = torch.autograd / jax.vjp to 1e-10 (central differences to 1e-7 elsewhere),
  for the last-token and the mean readout;
* ``average=True`` is invariant under permutations of the patches (1e-12); the last-token readout
  is not (the patches' order matters for it);
* a wrong input shape raises ValueError naming the expected shape.
"""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import to_numpy
from _layer_checks import check_pullback, perturbed_params, random_input
from geoarray.manifolds import Stiefel
from geoarray.models import ClassificationTransformer


def test_structure_manifolds_and_init(xp, device):
    m = ClassificationTransformer(8, 3, 5, n_heads=2, n_layers=2)
    params = m.init(0, xp=xp, device=device)
    mans = m.manifolds()
    assert len(params) == len(mans) == 5
    for i in (0, 2):
        assert set(params[i]) == set(mans[i]) == {"PQ", "PK", "PV"}
        for k in ("PQ", "PK", "PV"):
            assert mans[i][k] == Stiefel(8, 4)
            Y = to_numpy(params[i][k])
            assert Y.shape == (2, 8, 4)
            np.testing.assert_allclose(np.swapaxes(Y, -1, -2) @ Y, np.broadcast_to(np.eye(4), (2, 4, 4)), atol=1e-12)
    assert all(v is None for i in (1, 3, 4) for v in mans[i].values())
    free = ClassificationTransformer(8, 3, 5, n_heads=2, n_layers=2, stiefel=False)
    assert all(v is None for d in free.manifolds() for v in d.values())
    Y = to_numpy(free.init(0, xp=xp, device=device)[0]["PQ"])
    assert np.max(np.abs(np.swapaxes(Y, -1, -2) @ Y - np.eye(4))) > 0.1
    assert len(m.stiefel_params(params)) == 6


def test_outputs_are_probabilities(xp, device):
    m = ClassificationTransformer(4, 3, 6, n_heads=2, n_layers=2)
    y = to_numpy(m.apply(m.init(1, xp=xp, device=device), random_input(xp, device, (2, 5, 3, 4))))
    assert y.shape == (2, 5, 6)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    assert y.min() >= 0.0


@pytest.mark.parametrize("average", [False, True], ids=["last-token", "mean"])
def test_pullback(xp, device, backend, average):
    m = ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=2, average=average)
    params = perturbed_params(m, xp, device, seed=2, scale=0.1)
    check_pullback(m, params, random_input(xp, device, (2, 3, 4)), backend)


def test_readout_and_patch_permutations(xp, device):
    x = random_input(xp, device, (2, 3, 4))
    perm = xp.asarray(np.array([2, 0, 1]), device=device)
    xperm = xp.take(x, perm, axis=-2)
    mean = ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=2, average=True)
    p = mean.init(0, xp=xp, device=device)
    np.testing.assert_allclose(to_numpy(mean.apply(p, xperm)), to_numpy(mean.apply(p, x)), rtol=0, atol=1e-12)
    last = ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=2)
    q = last.init(0, xp=xp, device=device)
    assert np.max(np.abs(to_numpy(last.apply(q, xperm)) - to_numpy(last.apply(q, x)))) > 1e-6


def test_bad_input_shape(xp, device):
    m = ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=1)
    p = m.init(0, xp=xp, device=device)
    with pytest.raises(ValueError, match="n_patches=3, patch_dim=4"):
        m.apply(p, random_input(xp, device, (2, 4, 4)))
    with pytest.raises(ValueError, match="n_patches=3, patch_dim=4"):
        m.vjp(p, random_input(xp, device, (3,)))
    with pytest.raises(ValueError, match="divisible"):
        ClassificationTransformer(5, 3, 3, n_heads=2, n_layers=1)
