"""Errors of the members of ``geoarray.optim.partition`` name the user's leaf as the rest of the library
does, ``params['blocks'][0]['W']``, not by the key of the member's dict of leaves
(``params["['blocks'][0]['W']"]``, which they read before ``optim.layout.LeafPath``).

One test per error path a member reaches: a gradient of the wrong shape or dtype, a starting point off
its manifold, a non-finite gradient under ``on_nonfinite="raise"``, a leaf Muon cannot take, an integer
leaf; and a partition of a single array (its leaf is ``params``). Every backend.
"""

from __future__ import annotations

import re

import numpy as np
import optree
import pytest

import geoarray
from _helpers import to_numpy
from geoarray import optim
from geoarray.manifolds import Stiefel

LABELS = {"blocks": [{"W": "m", "b": "a"}], "head": "mu"}


def _tree(xp, device, **replace):
    W = Stiefel(5, 3).random(0, xp=xp, dtype=xp.float64, device=device)
    tree = {
        "blocks": [{"W": W, "b": xp.zeros((3,), dtype=xp.float64, device=device)}],
        "head": xp.ones((4, 3), dtype=xp.float64, device=device),
    }
    for name, value in replace.items():
        if name == "W":
            tree["blocks"][0]["W"] = value
        else:
            tree[name] = value
    return tree


MANIFOLDS = {"blocks": [{"W": Stiefel(5, 3), "b": None}], "head": None}


def _grads(xp, device, **replace):
    return _tree(xp, device, W=xp.zeros((5, 3), dtype=xp.float64, device=device), **replace)


def _readable(message: str, leaf: str) -> None:
    assert leaf in message, message
    assert not re.search(r"params\[\"\[", message), message  # the old params["['…']"]


def _adams():
    return optim.partition({"m": optim.Adam(lr=1e-3), "a": optim.Adam(lr=1e-3), "mu": optim.Adam(lr=1e-3)}, LABELS)


def test_gradient_of_the_wrong_shape(xp, device):
    opt = _adams()
    state = opt.init(_tree(xp, device), MANIFOLDS)
    grads = _grads(xp, device, head=xp.zeros((3, 4), dtype=xp.float64, device=device))
    with pytest.raises(ValueError, match="shape") as info:
        opt.update(_tree(xp, device), grads, state)
    _readable(str(info.value), "grad of params['head'] has shape (3, 4)")


def test_gradient_of_the_wrong_dtype(xp, device):
    opt = _adams()
    state = opt.init(_tree(xp, device), MANIFOLDS)
    grads = _grads(xp, device)
    grads["blocks"][0]["W"] = xp.zeros((5, 3), dtype=xp.float32, device=device)
    with pytest.raises(TypeError, match="dtype") as info:
        opt.update(_tree(xp, device), grads, state)
    _readable(str(info.value), "grad of params['blocks'][0]['W'] has dtype float32")


@pytest.mark.parametrize("member", ["Adam", "ManifoldMuon"])
def test_start_off_the_manifold(xp, device, member):
    opt = optim.partition({"m": getattr(optim, member)(lr=1e-3), "a": optim.Adam(), "mu": optim.Adam()}, LABELS)
    bad = _tree(xp, device, W=xp.ones((5, 3), dtype=xp.float64, device=device))
    with pytest.raises(ValueError, match="not a point") as info:
        opt.init(bad, MANIFOLDS)
    _readable(str(info.value), "params['blocks'][0]['W'] is not a point of Stiefel(5, 3)")


def test_non_finite_gradient_raised(xp, device):
    opt = optim.partition(
        {"m": optim.Adam(lr=1e-3), "a": optim.Adam(lr=1e-3, on_nonfinite="raise"), "mu": optim.Adam()}, LABELS
    )
    params = _tree(xp, device)
    state = opt.init(params, MANIFOLDS)
    grads = _grads(xp, device)
    grads["blocks"][0]["b"] = xp.asarray(np.full(3, np.nan), device=device)
    with pytest.raises(FloatingPointError, match="non-finite") as info:
        opt.update(params, grads, state)
    _readable(str(info.value), "non-finite gradient for params['blocks'][0]['b']")


def test_a_leaf_muon_cannot_take(xp, device):
    opt = optim.partition({"m": optim.Adam(), "a": optim.Adam(), "mu": optim.Muon(lr=1e-2)}, LABELS)
    with pytest.raises(ValueError, match="Muon acts on matrices") as info:
        opt.init(_tree(xp, device, head=xp.ones((3,), dtype=xp.float64, device=device)), MANIFOLDS)
    _readable(str(info.value), "params['head'] has shape (3,)")


def test_an_integer_leaf(xp, device):
    with pytest.raises(TypeError, match="real floating") as info:
        _adams().init(_tree(xp, device, head=xp.ones((4, 3), dtype=xp.int64, device=device)), MANIFOLDS)
    _readable(str(info.value), "params['head'] must have a real floating dtype")


def test_a_single_array(xp, device):
    opt = optim.partition({"a": optim.Adam(lr=1e-3)}, "a")
    state = opt.init(xp.zeros((3,), dtype=xp.float64, device=device))
    with pytest.raises(ValueError, match="shape") as info:
        opt.update(
            xp.zeros((3,), dtype=xp.float64, device=device), xp.zeros((4,), dtype=xp.float64, device=device), state
        )
    _readable(str(info.value), "grad of params has shape (4,)")


def test_labels_name_the_leaf(xp, device):
    opt = optim.partition({"a": optim.Adam()}, {"blocks": [{"W": "a", "b": "a"}], "head": "typo"})
    with pytest.raises(ValueError, match="names none of the optimizers") as info:
        opt.init(_tree(xp, device), MANIFOLDS)
    assert "labels['head'] is 'typo'" in str(info.value)


def geoarray_normal(seed, xp, device):
    return 0.1 * geoarray.random.normal(seed, (5, 3), xp=xp, dtype=xp.float64, device=device)


def _by_path(path, leaf):
    return {"W": "m", "b": "a"}[path[-1]] if path[0] == "blocks" else "mu"


def test_labels_as_a_function_of_the_path_step_as_the_tree_of_labels(xp, device):
    """``labels(path, leaf)`` labels the leaves as the tree LABELS does: the same computation, so the
    parameters and states after three steps are bitwise equal; the function sees each leaf's key tuple."""
    seen = []

    def labels(path, leaf):
        seen.append((path, tuple(leaf.shape)))
        return _by_path(path, leaf)

    members = {"m": optim.Adam(lr=1e-2), "a": optim.Gradient(lr=1e-2), "mu": optim.Adam(lr=3e-3)}
    by_tree, by_function = optim.partition(members, LABELS), optim.partition(members, labels)
    results = []
    for opt in (by_tree, by_function):
        params = _tree(xp, device)
        state = opt.init(params, MANIFOLDS)
        for k in range(3):
            grads = _tree(xp, device, W=geoarray_normal(k, xp, device))
            params, state = opt.update(params, grads, state)
        results.append((params, state))
    assert sorted(seen) == [(("blocks", 0, "W"), (5, 3)), (("blocks", 0, "b"), (3,)), (("head",), (4, 3))]
    assert state.layout.labels == results[0][1].layout.labels
    (p1, s1), (p2, s2) = results
    for a, b in zip(optree.tree_leaves(p1), optree.tree_leaves(p2), strict=True):
        assert np.array_equal(to_numpy(a), to_numpy(b))
    for a, b in zip(optree.tree_leaves(s1.states), optree.tree_leaves(s2.states), strict=True):
        assert np.array_equal(to_numpy(a), to_numpy(b))


def test_a_label_function_returning_an_unknown_key_names_the_leaf(xp, device):
    opt = optim.partition({"a": optim.Adam()}, lambda path, leaf: "a" if path[0] == "blocks" else "typo")
    with pytest.raises(ValueError, match="names none of the optimizers") as info:
        opt.init(_tree(xp, device), MANIFOLDS)
    assert "labels(params['head'], leaf) returned 'typo'" in str(info.value)


def test_a_label_function_of_the_params_is_optaxs_convention(xp, device):
    """``labels(params) -> tree`` (optax's ``multi_transform``) labels as the tree it returns: the same layout."""
    opt = optim.partition({"m": optim.Adam(), "a": optim.Adam(), "mu": optim.Adam()}, lambda params: LABELS)
    state = opt.init(_tree(xp, device), MANIFOLDS)
    assert state.layout.labels == _adams().init(_tree(xp, device), MANIFOLDS).layout.labels == ("m", "a", "mu")


def test_a_label_function_of_neither_one_nor_two_arguments_is_refused_when_built():
    with pytest.raises(TypeError, match=r"function \(path, leaf\) -> key.*cannot be called with one argument nor"):
        optim.partition({"a": optim.Adam()}, lambda: "a")
    with pytest.raises(TypeError, match="cannot be called with one argument nor with two"):
        optim.partition({"a": optim.Adam()}, lambda a, b, c: "a")
