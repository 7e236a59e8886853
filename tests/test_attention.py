"""Multi-head attention (eq. 14 of seed 002) on every backend, float64.

Properties and tolerances:

* analytic pullback = torch.autograd / jax.vjp of ``apply`` to 1e-10 (central differences to 1e-7
  on NumPy and array-api-strict) for Stiefel and Euclidean projections, with and without the add
  connection, with a non-default scale, with 0, 1 and 2 batch axes;
* init: PQ/PK/PV of shape (n_heads, dim, d_h) are points of St(dim, d_h) (YᵀY = I to 1e-12);
  ``manifolds()`` says Stiefel(dim, d_h) (None with ``stiefel=False``) with the tree of ``init()``;
* the output equals the paper's d × T formula (V_i softmax_col(Q_iᵀK_i), heads stacked) evaluated
  in NumPy on the transposed input, to 1e-12;
* attention weights are probability vectors (rows sum to 1 to 1e-14, entries ≥ 0);
* identity-like settings behave as documented: zero query/key projections average the values
  uniformly (1e-14); orthonormal inputs with huge logits (qᵀk = 1000, exp would overflow without
  the max shift) attend to themselves, so the layer is x ↦ x without add connection (1e-12);
* ``scale`` s acts as W^Q ↦ sW^Q (1e-13); batched = looped (1e-13); 2 batch axes = flattened;
* jax.jit traces the layer and its pullback (JAX only);
* dim not divisible by n_heads, a wrong feature size, a missing time axis, a bad scale raise.
"""

from __future__ import annotations

import math

import numpy as np
import optree
import pytest

import geoarray
from _helpers import asarray, assert_close, to_numpy
from _layer_checks import check_batched_equals_looped, check_jit_matches_eager, check_pullback
from geoarray.manifolds import Stiefel
from geoarray.nn.attention import MultiHeadAttention


def _normal(seed, shape, xp, device):
    return geoarray.random.normal(seed, shape, xp=xp, device=device)


CASES = {
    "stiefel-add": (dict(dim=6, n_heads=2), (2, 5, 6)),
    "stiefel-noadd-1head": (dict(dim=4, n_heads=1, add_connection=False), (3, 4)),
    "euclidean-scaled": (dict(dim=6, n_heads=3, stiefel=False, scale=1 / math.sqrt(2)), (2, 2, 4, 6)),
}


def _setup(name, xp, device, seed=0):
    kwargs, shape = CASES[name]
    layer = MultiHeadAttention(**kwargs)
    return layer, layer.init(seed, xp=xp, device=device), _normal(seed + 1, shape, xp, device)


def _paper_reference(params, x, n_heads, scale=1.0, add_connection=True):
    """Eq. 14 in the seeds' layout: X = xᵀ (dim × T), Q_i = W_iᵀX, P = column softmax of s·Q_iᵀK_i."""
    PQ, PK, PV = (to_numpy(params[k]) for k in ("PQ", "PK", "PV"))
    xs = to_numpy(x)
    out = np.empty_like(xs)
    for idx in np.ndindex(*xs.shape[:-2]):
        X = xs[idx].T
        heads = []
        for i in range(n_heads):
            Q, K, V = PQ[i].T @ X, PK[i].T @ X, PV[i].T @ X
            C = scale * (Q.T @ K)
            P = np.exp(C - C.max(axis=0, keepdims=True))
            P /= P.sum(axis=0, keepdims=True)  # column softmax
            heads.append(V @ P)
        Y = np.concatenate(heads, axis=0)  # vcat of the heads
        out[idx] = (X + Y).T if add_connection else Y.T
    return out


# ---------------------------------------------------------------------------------------------
# contract
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_pullback_matches_autodiff(backend, xp, device, name):
    layer, params, x = _setup(name, xp, device)
    check_pullback(layer, params, x, backend)


@pytest.mark.parametrize("stiefel", [True, False])
def test_init_shapes_manifolds_and_stiefel_points(xp, device, stiefel):
    layer = MultiHeadAttention(12, 3, stiefel=stiefel)
    params = layer.init(0, xp=xp, device=device)
    manifolds = layer.manifolds()
    assert optree.tree_structure(manifolds, none_is_leaf=True) == optree.tree_structure(params, none_is_leaf=True)
    for key in ("PQ", "PK", "PV"):
        assert tuple(params[key].shape) == (3, 12, 4)
        if stiefel:
            assert manifolds[key] == Stiefel(12, 4)
            assert manifolds[key].is_point(params[key], atol=1e-12)  # all heads in one batched call
        else:
            assert manifolds[key] is None
    # the three projections and the heads are drawn independently
    assert np.max(np.abs(to_numpy(params["PQ"]) - to_numpy(params["PK"]))) > 1e-2
    assert np.max(np.abs(to_numpy(params["PQ"])[0] - to_numpy(params["PQ"])[1])) > 1e-2


@pytest.mark.parametrize("name", CASES)
def test_matches_the_papers_column_layout_formula(xp, device, name):
    layer, params, x = _setup(name, xp, device)
    ref = _paper_reference(params, x, layer.n_heads, layer.scale, layer.add_connection)
    assert_close(layer.apply(params, x), ref, xp=xp, rtol=1e-12, atol=1e-12)


def test_attention_weights_are_probability_vectors(xp, device):
    layer, params, x = _setup("stiefel-add", xp, device)
    A = layer.attention_weights(params, 3 * x)
    assert tuple(A.shape) == (2, 2, 5, 5)
    assert_close(xp.sum(A, axis=-1), np.ones((2, 2, 5)), xp=xp, atol=1e-14)
    assert bool(xp.all(A >= 0))


# ---------------------------------------------------------------------------------------------
# identity-like settings
# ---------------------------------------------------------------------------------------------


def _block_identity(dim, n_heads, xp, device):
    """PV_i = columns i·d_h … (i+1)·d_h − 1 of I: the concatenated values are x itself."""
    dh = dim // n_heads
    E = np.stack([np.eye(dim)[:, i * dh : (i + 1) * dh] for i in range(n_heads)])
    return asarray(E, xp, device)


@pytest.mark.parametrize("add_connection", [False, True])
def test_zero_queries_and_keys_average_the_values(xp, device, add_connection):
    layer = MultiHeadAttention(6, 2, stiefel=False, add_connection=add_connection)
    E = _block_identity(6, 2, xp, device)
    zero = xp.zeros_like(E)
    x = _normal(1, (3, 4, 6), xp, device)
    y = layer.apply({"PQ": zero, "PK": E, "PV": E}, x)
    # QᵀK = 0: each column softmax is uniform, every output step is the mean of the values
    mean = np.broadcast_to(to_numpy(x).mean(axis=-2, keepdims=True), (3, 4, 6))
    assert_close(y, mean + (to_numpy(x) if add_connection else 0), xp=xp, rtol=1e-14, atol=1e-14)


def test_orthonormal_inputs_with_huge_logits_attend_to_themselves(xp, device):
    layer = MultiHeadAttention(8, 2, add_connection=False)
    E = _block_identity(8, 2, xp, device)  # points of St(8, 4)
    params = {"PQ": E, "PK": E, "PV": E}
    assert Stiefel(8, 4).is_point(E)
    # T = 4 steps whose halves are orthonormal: per head q_mᵀk_n = 1000·δ_mn, exp(1000) = inf unshifted
    U = np.kron(np.eye(2), to_numpy(Stiefel(4, 4).random(3, xp=xp)))[:4, :]
    U[:, 4:] = np.roll(U[:, :4], 1, axis=0)
    x = asarray(math.sqrt(1000) * U, xp, device)
    y = layer.apply(params, x)
    assert_close(y, x, xp=xp, rtol=1e-12, atol=1e-12)
    A = layer.attention_weights(params, x)
    assert_close(A, np.broadcast_to(np.eye(4), (2, 4, 4)), xp=xp, atol=1e-14)


def test_scale_acts_as_scaling_the_query_projections(xp, device):
    s = 0.37
    x = _normal(1, (2, 5, 6), xp, device)
    plain = MultiHeadAttention(6, 2)
    params = plain.init(0, xp=xp, device=device)
    scaled = MultiHeadAttention(6, 2, scale=s).apply(params, x)
    assert_close(scaled, plain.apply({**params, "PQ": s * params["PQ"]}, x), xp=xp, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# batching and tracing
# ---------------------------------------------------------------------------------------------


def test_batched_equals_looped(xp, device):
    layer, params, x = _setup("stiefel-add", xp, device)
    check_batched_equals_looped(layer, params, x, xp)


def test_two_batch_axes_equal_the_flattened_batch(xp, device):
    layer, params, x = _setup("euclidean-scaled", xp, device)
    flat = layer.apply(params, xp.reshape(x, (4, 4, 6)))
    assert_close(layer.apply(params, x), xp.reshape(flat, (2, 2, 4, 6)), xp=xp, rtol=1e-13, atol=1e-13)


def test_jax_jit_traces_apply_and_pullback(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    layer, params, x = _setup("stiefel-add", xp, device)
    check_jit_matches_eager(layer, params, x, xp, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def test_dim_not_divisible_by_heads_raises():
    with pytest.raises(ValueError, match=r"dim must be divisible by n_heads.*dim=10, n_heads=4"):
        MultiHeadAttention(10, 4)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), "1", True])
def test_bad_scale_raises(scale):
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        MultiHeadAttention(4, 2, scale=scale)


def test_bad_input_shapes_raise(xp, device):
    layer, params, _ = _setup("stiefel-add", xp, device)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, 6\), got shape \(2, 5, 4\)"):
        layer.apply(params, _normal(0, (2, 5, 4), xp, device))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, 6\), got shape \(6,\)"):
        layer.vjp(params, _normal(0, (6,), xp, device))
    with pytest.raises(ValueError, match=r"params\['PK'\] must have shape \(2, 6, 3\), got shape \(6, 3\)"):
        layer.apply({**params, "PK": params["PK"][0, ...]}, _normal(0, (5, 6), xp, device))
