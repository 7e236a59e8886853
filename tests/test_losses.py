"""Losses and the shared softmax, every backend, float64.

Properties and tolerances:

* known values: the paper's L2 loss of the maximum-entropy output (1/C, …, 1/C) against a one-hot
  target is √((1 − 1/C)² + (C − 1)/C²) = √(1 − 1/C) exactly (√0.9 ≈ 0.949 for C = 10, not the
  1.34 printed in appendix D) to 1e-15; relative L2 of 2y against y is 1; MSE of a constant
  offset c is c²; cross-entropy of equal logits is log C (all 1e-15 relative);
* integer labels and one-hot targets give the same value and gradient (1e-15);
* cross-entropy equals a NumPy log-sum-exp reference (1e-13) and is finite and shift-invariant for
  logits of size 1e4 (where exp overflows);
* pullback = torch.autograd / jax.vjp of ``value`` to 1e-10 (central differences to 1e-7), batched
  and unbatched; pullback(s) = s·pullback(1) (1e-15); zero residual gives a zero (sub)gradient;
* softmax (geoarray.nn.activations, also importable from losses and geoarray.nn): rows sum to 1
  (1e-15), matches NumPy (1e-15), is finite for logits of size 1e4;
* mismatched shapes and dtypes raise naming the argument.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import geoarray
from _helpers import asarray, assert_close, to_numpy
from _layer_checks import check_pullback
from geoarray.nn import losses
from geoarray.nn.activations import softmax
from geoarray.nn.losses import ClassificationL2Loss, MSELoss, RelativeL2Loss, SoftmaxCrossEntropy


def _normal(seed, shape, xp, device):
    return geoarray.random.normal(seed, shape, xp=xp, device=device)


def _labels(values, xp, device):
    return xp.asarray(np.asarray(values), dtype=xp.int64, device=device)


class LossAsLayer:
    """A loss with a fixed target seen as a parameter-free layer pred ↦ [loss(pred, target)].

    The value is returned with shape (1,): on NumPy, arithmetic on 0-d arrays gives NumPy scalars,
    which the finite-difference branch of ``check_pullback`` cannot convert.
    """

    def __init__(self, loss, target):
        self.loss, self.target = loss, target

    def apply(self, params, x):
        xp = geoarray.array_namespace(x)
        return xp.reshape(self.loss.value(x, self.target), (1,))

    def vjp(self, params, x):
        xp = geoarray.array_namespace(x)
        value, pullback = self.loss.vjp(x, self.target)
        return xp.reshape(value, (1,)), lambda dvalue: ({}, pullback(xp.reshape(dvalue, ())))


def _case(kind, xp, device, shape):
    """(loss, pred, target) with a well-conditioned random prediction."""
    pred = _normal(1, shape, xp, device)
    if kind == "relative-l2":
        return RelativeL2Loss(), pred, _normal(2, shape, xp, device)
    if kind == "mse":
        return MSELoss(), pred, _normal(2, shape, xp, device)
    labels = _labels(np.arange(math.prod(shape[:-1])).reshape(shape[:-1]) % shape[-1], xp, device)
    if kind == "cross-entropy":
        return SoftmaxCrossEntropy(), 3 * pred, labels
    if kind == "cross-entropy-soft":
        return SoftmaxCrossEntropy(), pred, softmax(_normal(2, shape, xp, device))
    return ClassificationL2Loss(), softmax(pred), labels


KINDS = ["relative-l2", "mse", "cross-entropy", "cross-entropy-soft", "classification-l2"]


# ---------------------------------------------------------------------------------------------
# known values
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("C", [10, 3])
def test_classification_l2_of_the_maximum_entropy_output(xp, device, C):
    B = 4
    uniform = asarray(np.full((B, C), 1 / C), xp, device)
    labels = _labels(np.arange(B) % C, xp, device)
    exact = math.sqrt((1 - 1 / C) ** 2 + (C - 1) / C**2)
    assert math.isclose(exact, math.sqrt(1 - 1 / C), rel_tol=1e-15)
    value = float(ClassificationL2Loss().value(uniform, labels))
    assert math.isclose(value, exact, rel_tol=1e-15)
    if C == 10:
        # appendix D prints √(0.9 + 9·0.1) ≈ 1.34 = √1.8; the formula gives √(0.81 + 9·0.01) = √0.9
        assert math.isclose(value, math.sqrt(0.9), rel_tol=1e-15)
        assert abs(value - 1.34) > 0.3


def test_regression_losses_known_values(xp, device):
    y = _normal(0, (3, 4), xp, device)
    assert math.isclose(float(RelativeL2Loss().value(2 * y, y)), 1.0, rel_tol=1e-15)
    assert math.isclose(float(RelativeL2Loss()(y, y)), 0.0, abs_tol=0.0)
    assert math.isclose(float(MSELoss().value(y + 0.25, y)), 0.0625, rel_tol=1e-14)


def test_cross_entropy_known_values_and_reference(xp, device):
    B, C = 5, 7
    equal = asarray(np.full((B, C), 2.5), xp, device)
    labels = _labels(np.arange(B) % C, xp, device)
    assert math.isclose(float(SoftmaxCrossEntropy().value(equal, labels)), math.log(C), rel_tol=1e-15)
    z = _normal(1, (B, C), xp, device)
    zh = to_numpy(z)
    lse = zh.max(-1) + np.log(np.exp(zh - zh.max(-1, keepdims=True)).sum(-1))
    ref = np.mean(lse - zh[np.arange(B), np.arange(B) % C])
    assert math.isclose(float(SoftmaxCrossEntropy().value(z, labels)), ref, rel_tol=1e-13)


def test_cross_entropy_is_stable_and_shift_invariant(xp, device):
    z = _normal(1, (4, 6), xp, device)
    labels = _labels([0, 1, 2, 3], xp, device)
    loss = SoftmaxCrossEntropy()
    big = 1e4 * z  # exp overflows without the max shift; log-softmax stays exact
    value = float(loss.value(big, labels))
    assert math.isfinite(value) and value >= 0
    assert math.isclose(float(loss.value(z + 1e4, labels)), float(loss.value(z, labels)), rel_tol=1e-10)
    _, pb = loss.vjp(big, labels)
    assert np.all(np.isfinite(to_numpy(pb())))


@pytest.mark.parametrize("kind", ["cross-entropy", "classification-l2"])
def test_integer_labels_equal_one_hot_targets(xp, device, kind):
    loss, pred, labels = _case(kind, xp, device, (6, 4))
    one_hot = asarray(np.eye(4)[to_numpy(labels)], xp, device)
    v1, pb1 = loss.vjp(pred, labels)
    v2, pb2 = loss.vjp(pred, one_hot)
    assert math.isclose(float(v1), float(v2), rel_tol=1e-15)
    assert_close(pb1(), pb2(), xp=xp, rtol=1e-15, atol=1e-16)


# ---------------------------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5,), (2, 3, 5)])
@pytest.mark.parametrize("kind", KINDS)
def test_pullback_matches_autodiff(backend, xp, device, kind, shape):
    loss, pred, target = _case(kind, xp, device, shape)
    check_pullback(LossAsLayer(loss, target), {}, pred, backend)


@pytest.mark.parametrize("kind", KINDS)
def test_pullback_is_linear_in_dvalue_and_keeps_dtype_device(xp, device, kind):
    loss, pred, target = _case(kind, xp, device, (4, 5))
    value, pb = loss.vjp(pred, target)
    assert tuple(value.shape) == ()
    assert math.isclose(float(value), float(loss(pred, target)), rel_tol=0, abs_tol=0)
    assert_close(pb(2.5), 2.5 * pb(), xp=xp, rtol=1e-15, device=device, dtype=pred.dtype)


@pytest.mark.parametrize("loss", [RelativeL2Loss(), ClassificationL2Loss()], ids=repr)
def test_zero_residual_gives_zero_subgradient(xp, device, loss):
    y = softmax(_normal(0, (3, 4), xp, device))
    value, pb = loss.vjp(y, y)
    assert float(value) == 0.0
    g = to_numpy(pb())
    assert np.all(g == 0)


@pytest.mark.parametrize("loss", [RelativeL2Loss(), ClassificationL2Loss()], ids=repr)
def test_autodiff_of_the_value_is_finite_where_prediction_equals_target(backend, xp, device, loss):
    """torch/JAX autodiff of ``loss(p, t)`` at p = t (a saturated float32 softmax) gives the subgradient 0
    of the pullback, not √'(0)·0 = NaN, which made every step of the paper-sized ViT non-finite."""
    if backend.kind not in ("torch", "jax"):
        pytest.skip("autodiff of the value needs torch or JAX")
    y = softmax(_normal(0, (3, 4), xp, device))
    t = xp.concat([y[:1, ...], softmax(_normal(1, (2, 4), xp, device))], axis=0)  # row 0: p = t
    if backend.kind == "torch":
        p = y.clone().requires_grad_(True)
        loss(p, t).backward()
        grad = p.grad
    else:
        import jax

        grad = jax.grad(lambda p: loss(p, t))(y)
    _, pb = loss.vjp(y, t)
    assert np.all(np.isfinite(to_numpy(grad)))
    assert_close(grad, pb(), xp=xp, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, -2])
def test_softmax_sums_to_one_and_matches_numpy(xp, device, axis):
    z = _normal(0, (3, 4, 5), xp, device)
    p = softmax(z, axis=axis)
    e = np.exp(to_numpy(z))
    assert_close(p, e / e.sum(axis=axis, keepdims=True), xp=xp, rtol=1e-15, atol=1e-16)
    assert_close(xp.sum(p, axis=axis), np.ones((3, 5) if axis == -2 else (3, 4)), xp=xp, atol=1e-15)


def test_softmax_is_finite_for_huge_logits(xp, device):
    z = asarray([[1e4, 0.0, -1e4], [1e4, 1e4, 0.0]], xp, device)
    assert_close(softmax(z), np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]), xp=xp, atol=1e-15)


def test_softmax_lives_in_activations_and_keeps_its_old_names():
    """geoarray.nn.softmax and geoarray.nn.losses.softmax (the name before the move) are activations.softmax."""
    assert geoarray.nn.softmax is softmax and losses.softmax is softmax
    assert losses.softmax_pullback is geoarray.nn.activations.softmax_pullback


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def test_mismatched_shapes_raise(xp, device):
    pred = _normal(0, (4, 5), xp, device)
    with pytest.raises(ValueError, match=r"target must have the shape of pred \(4, 5\), got \(5, 4\)"):
        MSELoss().value(pred, _normal(1, (5, 4), xp, device))
    with pytest.raises(ValueError, match=r"integer labels must have shape pred.shape\[:-1\] = \(4,\), got \(5,\)"):
        SoftmaxCrossEntropy().value(pred, _labels([0, 1, 2, 3, 4], xp, device))
    with pytest.raises(ValueError, match=r"probabilities shaped like pred \(4, 5\).*got shape \(4, 4\)"):
        ClassificationL2Loss().vjp(pred, _normal(1, (4, 4), xp, device))


def test_integer_targets_for_regression_raise(xp, device):
    pred = _normal(0, (4,), xp, device)
    with pytest.raises(TypeError, match="target must have a real floating dtype"):
        RelativeL2Loss().value(pred, _labels([0, 1, 2, 3], xp, device))
