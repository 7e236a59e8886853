"""Pointwise layers: Dense, ResNetLayer (eq. 15), ClassificationLayer (eq. 16), StiefelLayer, GrassmannLayer.

Every backend, float64. Properties and tolerances:

* analytic pullback = torch.autograd / jax.vjp of ``apply`` to 1e-10 of the largest gradient entry
  (central differences to 1e-7 on NumPy and array-api-strict), via ``_layer_checks.check_pullback``;
* ``manifolds()`` has the tree structure of ``init()`` (None counted as a leaf);
* outputs equal dense NumPy references of the documented formulas to 1e-13;
* a batch equals the loop over its samples (outputs, input gradients, and parameter gradients
  summed over the batch) to 1e-13 relative;
* Stiefel weights satisfy YᵀY = I (``Stiefel.is_point``, 1e-12); ‖Yx‖ = ‖x‖; the Grassmann layer is
  an idempotent projection that depends on span(Y) only and has YᵀG symmetric;
* ClassificationLayer outputs probability vectors (sum 1 to 1e-14) that see only the last time step;
* bad shapes, parameters (keys, shapes, a dtype other than x's), cotangents and options raise
  ValueError/TypeError naming the layer, the argument, the expected and the actual shape/dtype.
"""

from __future__ import annotations

import math

import numpy as np
import optree
import pytest

import geoarray
from _helpers import asarray, assert_close, to_numpy
from _layer_checks import check_batched_equals_looped, check_pullback
from geoarray._backend import device as _device
from geoarray.manifolds import Grassmann, Stiefel
from geoarray.nn.classification import ClassificationLayer
from geoarray.nn.dense import Dense, ResNetLayer
from geoarray.nn.manifold_layers import GrassmannLayer, StiefelLayer

# (layer, input shape): leading axes are batch (and time) axes
LAYERS = {
    "dense-tanh": (lambda: Dense(4, 3, "tanh"), (2, 5, 4)),
    "dense-gelu-nobias": (lambda: Dense(4, 6, "gelu", use_bias=False), (7, 4)),
    "dense-vector": (lambda: Dense(3, 2, "sigmoid"), (3,)),
    "resnet-tanh": (lambda: ResNetLayer(5), (3, 4, 5)),
    "resnet-identity-nobias": (lambda: ResNetLayer(5, "identity", use_bias=False), (4, 5)),
    "classification-last": (lambda: ClassificationLayer(6, 4), (3, 5, 6)),
    "classification-average": (lambda: ClassificationLayer(6, 4, average=True), (2, 2, 5, 6)),
    "classification-logits": (lambda: ClassificationLayer(6, 4, logits=True), (5, 6)),
    "stiefel": (lambda: StiefelLayer(7, 3), (4, 3)),
    "stiefel-transpose": (lambda: StiefelLayer(7, 3, transpose=True), (2, 4, 7)),
    "grassmann": (lambda: GrassmannLayer(7, 3), (4, 7)),
}


def _normal(seed, shape, xp, device):
    return geoarray.random.normal(seed, shape, xp=xp, device=device)


def _setup(name, xp, device, seed=0):
    make, shape = LAYERS[name]
    layer = make()
    return layer, layer.init(seed, xp=xp, device=device), _normal(seed + 1, shape, xp, device)


# ---------------------------------------------------------------------------------------------
# the layer contract
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LAYERS)
def test_pullback_matches_autodiff(backend, xp, device, name):
    layer, params, x = _setup(name, xp, device)
    check_pullback(layer, params, x, backend)


@pytest.mark.parametrize("name", LAYERS)
def test_manifolds_mirror_init_and_params_keep_dtype_and_device(xp, device, name):
    layer, params, _ = _setup(name, xp, device)
    assert optree.tree_structure(layer.manifolds(), none_is_leaf=True) == optree.tree_structure(
        params, none_is_leaf=True
    )
    dt = geoarray.resolve_dtype(xp, None, device)
    for leaf in optree.tree_leaves(params):
        assert leaf.dtype == dt and _device(leaf) == device
    p32 = layer.init(0, xp=xp, dtype="float32", device=device)
    assert all(leaf.dtype == xp.float32 for leaf in optree.tree_leaves(p32))


# the layers whose first input axis is a batch axis (not time, not features)
BATCHED = ["dense-tanh", "resnet-tanh", "classification-last", "classification-average", "stiefel-transpose"]


@pytest.mark.parametrize("name", BATCHED)
def test_batched_equals_looped(xp, device, name):
    layer, params, x = _setup(name, xp, device)
    check_batched_equals_looped(layer, params, x, xp)


def test_init_is_reproducible_and_seed_dependent(xp, device):
    layer = Dense(4, 3)
    a, b, c = (layer.init(s, xp=xp, device=device)["W"] for s in (5, 5, 6))
    assert_close(a, b, xp=xp)
    assert np.max(np.abs(to_numpy(a) - to_numpy(c))) > 1e-3
    bound = math.sqrt(6 / 7)  # Glorot: U(−√(6/(in+out)), √(6/(in+out)))
    assert np.max(np.abs(to_numpy(a))) <= bound


# ---------------------------------------------------------------------------------------------
# Dense and ResNet: formulas
# ---------------------------------------------------------------------------------------------


def test_dense_and_resnet_match_formula(xp, device):
    dense = Dense(5, 5, "tanh")
    params = dense.init(0, xp=xp, device=device)
    params["b"] = _normal(3, (5,), xp, device)
    x = _normal(1, (2, 3, 5), xp, device)
    W, b, xh = to_numpy(params["W"]), to_numpy(params["b"]), to_numpy(x)
    ref = np.tanh(xh @ W.T + b)
    assert_close(dense.apply(params, x), ref, xp=xp, rtol=1e-13, atol=1e-14, device=device)
    # eq. 15: x + σ(Wx + b), the same parameters
    assert_close(ResNetLayer(5, "tanh").apply(params, x), xh + ref, xp=xp, rtol=1e-13, atol=1e-14)


def test_custom_activation_object(xp, device):
    class Cube:
        name = "cube"

        @staticmethod
        def fn(x):
            return x**3

        @staticmethod
        def deriv(x):
            return 3 * x**2

    layer = Dense(3, 2, Cube())
    params = layer.init(0, xp=xp, device=device)
    x = _normal(1, (4, 3), xp, device)
    ref = (to_numpy(x) @ to_numpy(params["W"]).T) ** 3
    assert_close(layer.apply(params, x), ref, xp=xp, rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# Classification (eq. 16)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("average", [False, True])
def test_classification_matches_eq16(xp, device, average):
    layer = ClassificationLayer(6, 4, average=average)
    params = layer.init(0, xp=xp, device=device)
    x = _normal(1, (3, 5, 6), xp, device)
    xh, W = to_numpy(x), to_numpy(params["W"])
    h = xh.mean(axis=-2) if average else xh[:, -1, :]  # the seeds' X[1:dim, end] is the last time step
    z = h @ W.T
    ref = np.exp(z - z.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    y = layer.apply(params, x)
    assert_close(y, ref, xp=xp, rtol=1e-13, atol=1e-15)
    assert_close(xp.sum(y, axis=-1), np.ones(3), xp=xp, atol=1e-14)
    logits = ClassificationLayer(6, 4, average=average, logits=True).apply(params, x)
    assert_close(logits, z, xp=xp, rtol=1e-13, atol=1e-14)


def test_classification_sees_only_the_last_time_step(xp, device):
    layer = ClassificationLayer(6, 4)
    params = layer.init(0, xp=xp, device=device)
    x = _normal(1, (5, 6), xp, device)
    x2 = xp.concat([_normal(2, (4, 6), xp, device), x[-1:, :]], axis=0)
    assert_close(layer.apply(params, x2), layer.apply(params, x), xp=xp)
    _, pb = layer.vjp(params, x)
    _, dx = pb(_normal(3, (4,), xp, device))
    assert np.all(to_numpy(dx)[:-1, :] == 0)


def test_classification_softmax_is_stable_for_huge_logits(xp, device):
    layer = ClassificationLayer(3, 3)
    params = {"W": asarray(np.eye(3), xp, device)}
    x = asarray([[[1e4, 0.0, -1e4]]], xp, device)  # exp(1e4) overflows without the max shift
    assert_close(layer.apply(params, x), np.array([[1.0, 0.0, 0.0]]), xp=xp, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# Stiefel and Grassmann layers
# ---------------------------------------------------------------------------------------------


def test_stiefel_layer_weight_on_manifold_and_isometric(xp, device):
    layer = StiefelLayer(9, 4)
    params = layer.init(0, xp=xp, device=device)
    assert layer.manifolds() == {"Y": Stiefel(9, 4)}
    assert Stiefel(9, 4).is_point(params["Y"], atol=1e-12)
    x = _normal(1, (6, 4), xp, device)
    y = layer.apply(params, x)  # Yx: R^4 → R^9
    assert tuple(y.shape) == (6, 9)
    assert_close(xp.sum(y * y, axis=-1), xp.sum(x * x, axis=-1), xp=xp, rtol=1e-13)
    # the transpose is the left inverse: Yᵀ(Yx) = x
    back = StiefelLayer(9, 4, transpose=True).apply(params, y)
    assert_close(back, x, xp=xp, rtol=1e-13, atol=1e-14)


def test_grassmann_layer_projects_and_depends_on_the_subspace_only(xp, device):
    layer = GrassmannLayer(8, 3)
    params = layer.init(0, xp=xp, device=device)
    assert layer.manifolds() == {"Y": Grassmann(8, 3)}
    assert Grassmann(8, 3).is_point(params["Y"], atol=1e-12)
    x = _normal(1, (5, 8), xp, device)
    y = layer.apply(params, x)
    assert_close(layer.apply(params, y), y, xp=xp, rtol=1e-13, atol=1e-14)  # idempotent
    assert abs(float(xp.sum(y * (x - y)))) < 1e-13  # orthogonal projection: y ⟂ x − y
    # another basis of the same subspace: Y ↦ YO, O orthogonal
    O = Stiefel(3, 3).random(4, xp=xp, device=device)
    rotated = {"Y": params["Y"] @ O}
    assert_close(layer.apply(rotated, x), y, xp=xp, rtol=1e-13, atol=1e-14)
    # so the Euclidean gradient has no component along the rotations YΩ: YᵀG symmetric
    _, pb = layer.vjp(params, x)
    G = pb(_normal(2, (5, 8), xp, device))[0]["Y"]
    YtG = xp.matrix_transpose(params["Y"]) @ G
    assert_close(YtG, xp.matrix_transpose(YtG), xp=xp, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def test_wrong_input_shape_raises(xp, device):
    layer, params, _ = _setup("dense-tanh", xp, device)
    with pytest.raises(
        ValueError, match=r"Dense\(in_dim=4, out_dim=3, .*\): x must have shape \(\.\.\., 4\), got shape \(2, 3\)"
    ):
        layer.apply(params, _normal(0, (2, 3), xp, device))
    cls, cparams, _ = _setup("classification-last", xp, device)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, 6\), got shape \(6,\)"):
        cls.apply(cparams, _normal(0, (6,), xp, device))
    st, sparams, _ = _setup("stiefel", xp, device)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 3\), got shape \(4, 7\)"):
        st.vjp(sparams, _normal(0, (4, 7), xp, device))


def test_wrong_params_raise(xp, device):
    layer, params, x = _setup("dense-tanh", xp, device)
    with pytest.raises(ValueError, match=r"params\['W'\] must have shape \(3, 4\), got shape \(4, 3\)"):
        layer.apply({"W": xp.matrix_transpose(params["W"]), "b": params["b"]}, x)
    with pytest.raises(ValueError, match=r"params must be a dict with keys \['W', 'b'\], got \['W'\]"):
        layer.apply({"W": params["W"]}, x)
    with pytest.raises(TypeError, match=r"params\['b'\] must have the dtype of x"):
        layer.apply({**params, "b": xp.astype(params["b"], xp.float32)}, x)
    _, pullback = layer.vjp(params, x)
    with pytest.raises(ValueError, match=r"dy must have the output's shape \(2, 5, 3\), got shape \(5, 3\)"):
        pullback(_normal(0, (5, 3), xp, device))


def test_integer_input_raises(xp, device):
    layer, params, _ = _setup("dense-tanh", xp, device)
    with pytest.raises(TypeError, match="x must have a real floating dtype"):
        layer.apply(params, xp.ones((2, 4), dtype=xp.int64, device=device))


def test_bad_constructor_arguments_raise():
    with pytest.raises(ValueError, match="in_dim must be positive"):
        Dense(0, 3)
    with pytest.raises(TypeError, match="out_dim must be an int"):
        Dense(3, 2.5)
    with pytest.raises(ValueError, match="activation must be one of"):
        ResNetLayer(3, "swish")
    with pytest.raises(ValueError, match=r"n ≤ N, got N=3, n=4"):
        StiefelLayer(3, 4)
    with pytest.raises(ValueError, match="n_classes must be positive"):
        ClassificationLayer(3, 0)
