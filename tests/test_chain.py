"""A Chain of the paper's vision-transformer blocks: ResNetLayer → MultiHeadAttention → ClassificationLayer.

(All tests use one input shape, that of test_attention.py: on JAX each new shape recompiles every eager op.)

Every backend, float64. Properties and tolerances:

* the Chain's analytic pullback = torch.autograd / jax.vjp of ``apply`` to 1e-10 (central
  differences to 1e-7 on NumPy and array-api-strict), also with the paper's L2 loss on top
  (the full training gradient of loss ∘ chain);
* ``manifolds()`` mirrors ``init()`` (one entry per layer, None counted as a leaf) and every
  Stiefel leaf is a point of its manifold (YᵀY = I to 1e-12);
* the Chain equals the layers applied by hand (exactly) and a batch equals the loop (1e-13);
* a wrong params tree raises ValueError naming the expected length.
"""

from __future__ import annotations

import optree
import pytest

import geoarray
from _helpers import assert_close
from _layer_checks import check_batched_equals_looped, check_pullback
from geoarray.manifolds import Stiefel
from geoarray.nn import Chain
from geoarray.nn.attention import MultiHeadAttention
from geoarray.nn.classification import ClassificationLayer
from geoarray.nn.dense import ResNetLayer
from geoarray.nn.losses import ClassificationL2Loss

DIM, HEADS, T, CLASSES = 6, 2, 5, 3


def _model(**mha):
    return Chain(
        ResNetLayer(DIM, "tanh"),
        MultiHeadAttention(DIM, HEADS, **mha),
        ClassificationLayer(DIM, CLASSES),
    )


def _setup(xp, device, **mha):
    model = _model(**mha)
    params = model.init(0, xp=xp, device=device)
    x = geoarray.random.normal(1, (2, T, DIM), xp=xp, device=device)
    return model, params, x


class WithLoss:
    """x ↦ loss(model(x), labels) as a layer over the model's params."""

    def __init__(self, model, loss, labels):
        self.model, self.loss, self.labels = model, loss, labels

    def apply(self, params, x):
        xp = geoarray.array_namespace(x)
        return xp.reshape(self.loss.value(self.model.apply(params, x), self.labels), (1,))

    def vjp(self, params, x):
        xp = geoarray.array_namespace(x)
        y, model_pb = self.model.vjp(params, x)
        value, loss_pb = self.loss.vjp(y, self.labels)
        return xp.reshape(value, (1,)), lambda dv: model_pb(loss_pb(xp.reshape(dv, ())))


@pytest.mark.parametrize("stiefel", [True, False])
def test_chain_pullback_matches_autodiff(backend, xp, device, stiefel):
    model, params, x = _setup(xp, device, stiefel=stiefel)
    check_pullback(model, params, x, backend)


def test_loss_of_chain_gradient_matches_autodiff(backend, xp, device):
    model, params, x = _setup(xp, device)
    labels = xp.asarray([2, 1], dtype=xp.int64, device=device)
    check_pullback(WithLoss(model, ClassificationL2Loss(), labels), params, x, backend)


def test_manifolds_mirror_init_and_stiefel_leaves_are_points(xp, device):
    model, params, _ = _setup(xp, device)
    manifolds = model.manifolds()
    assert optree.tree_structure(manifolds, none_is_leaf=True) == optree.tree_structure(params, none_is_leaf=True)
    pairs = zip(
        optree.tree_leaves(manifolds, none_is_leaf=True), optree.tree_leaves(params, none_is_leaf=True), strict=True
    )
    stiefel = [(M, p) for M, p in pairs if M is not None]
    assert len(stiefel) == 3  # PQ, PK, PV of the attention layer
    for M, p in stiefel:
        assert M == Stiefel(DIM, DIM // HEADS) and M.is_point(p, atol=1e-12)


def test_chain_equals_layers_by_hand_and_batch_equals_loop(xp, device):
    model, params, x = _setup(xp, device)
    y = x
    for layer, p in zip(model.layers, params, strict=True):
        y = layer.apply(p, y)
    assert_close(model.apply(params, x), y, xp=xp)
    check_batched_equals_looped(model, params, x, xp)


def test_wrong_params_tree_raises(xp, device):
    model, params, x = _setup(xp, device)
    with pytest.raises(ValueError, match=r"one entry per layer \(3\).*length 2"):
        model.apply(params[:2], x)
