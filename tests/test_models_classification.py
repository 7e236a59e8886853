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
* ``add_connection`` (default False, the reference package's): with True a block is
  x ↦ F(x + A(x)), with False x ↦ F(A(x)) — A the heads' attention output [V_i softmax(Q_iᵀK_i)]_i,
  F the ResNet feed-forward x ↦ x + tanh(Wx + b) — checked against the layers composed by hand to
  1e-12 (A(x) taken as the add-connection attention minus x, so the two paths are different
  computations); the pullback without the add connection agrees with autodiff as above; a
  non-boolean ``add_connection`` raises ValueError naming it;
* a wrong input shape raises ValueError naming the expected shape.
"""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import to_numpy
from _layer_checks import check_pullback, perturbed_params, random_input
from geoarray.manifolds import Stiefel
from geoarray.models import ClassificationTransformer
from geoarray.nn import ClassificationLayer, MultiHeadAttention, ResNetLayer


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


@pytest.mark.parametrize("add_connection", [True, False], ids=["attention-add", "no-attention-add"])
@pytest.mark.parametrize("average", [False, True], ids=["last-token", "mean"])
def test_pullback(xp, device, backend, average, add_connection):
    m = ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=2, average=average, add_connection=add_connection)
    params = perturbed_params(m, xp, device, seed=2, scale=0.1)
    check_pullback(m, params, random_input(xp, device, (2, 3, 4)), backend)


@pytest.mark.parametrize("add_connection", [True, False], ids=["attention-add", "no-attention-add"])
def test_add_connection_is_the_stated_map(xp, device, add_connection):
    """Two blocks and the readout composed by hand: A(x) = attention-with-add(x) − x, then F."""
    m = ClassificationTransformer(8, 3, 5, n_heads=2, n_layers=2, add_connection=add_connection, logits=True)
    assert m.add_connection is add_connection
    assert ("add_connection=True" in repr(m)) is add_connection
    params = perturbed_params(m, xp, device, seed=3, scale=0.3)
    x = random_input(xp, device, (2, 4, 3, 8))
    attention_plus_x, feed_forward = MultiHeadAttention(8, 2, add_connection=True), ResNetLayer(8, "tanh")
    h = x
    for block in range(2):
        a = attention_plus_x.apply(params[2 * block], h) - h
        h = feed_forward.apply(params[2 * block + 1], h + a if add_connection else a)
    expected = to_numpy(ClassificationLayer(8, 5, logits=True).apply(params[4], h))
    np.testing.assert_allclose(to_numpy(m.apply(params, x)), expected, rtol=0, atol=1e-12)
    other = ClassificationTransformer(8, 3, 5, n_heads=2, n_layers=2, add_connection=not add_connection, logits=True)
    assert np.max(np.abs(to_numpy(other.apply(params, x)) - expected)) > 1e-3  # the flag changes the map


@pytest.mark.parametrize("bad", ["false", 0, None, 1.0])
def test_add_connection_must_be_boolean(bad):
    assert ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=1).add_connection is False  # the reference's
    with pytest.raises(ValueError, match="add_connection must be True or False"):
        ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=1, add_connection=bad)
    assert ClassificationTransformer(4, 3, 3, n_heads=2, n_layers=1, add_connection=np.False_).add_connection is False


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
