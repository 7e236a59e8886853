"""Every optimizer is configuration plus a pure ``(init, update)`` pair whose state carries the layout.

Properties, on every backend:

* two identically configured optimizer objects accept each other's states, and one object serves two
  parameter trees in any order: the results equal one object per tree (the same computation repeated,
  so bit for bit);
* the state's layout is a static pytree node: optree flattens the state into its arrays only, and the
  layout comes back unchanged through ``tree_map``;
* every optimizer state the library returns (Gradient, Momentum, Adam, AdamWithDecay, BFGS, a bare
  ``riemannian`` chain, Muon, ManifoldMuon, partition) saves and loads bit-exactly, and the resumed run
  equals the uninterrupted one bit for bit; a state of another optimizer is refused by name;
* ``update(..., check=False)`` computes what ``update`` computes (the same code without the checks);
* no two arrays of a fresh state are one object (aliased buffers make ``torch.compile`` trace the first
  step as a graph of its own, and would let an in-place update of one field write another);
* :mod:`geoarray.optim.layout` packs and unpacks exactly (a permutation of the leaves' entries).
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import to_numpy
from geoarray import Grassmann, Stiefel, optim
from geoarray.optim import layout as L


def _problem(xp, device, seed=0):
    """Two stacked Stiefel weights, a Grassmann weight and two Euclidean matrices (Muon needs matrices)."""
    M, G = Stiefel(7, 2), Grassmann(5, 2)
    params = {
        "heads": [M.random(seed, xp=xp, device=device), M.random(seed + 1, xp=xp, device=device)],
        "g": G.random(seed + 2, xp=xp, device=device),
        "W": geoarray.random.normal(seed + 3, (3, 4), xp=xp, device=device),
        "V": geoarray.random.normal(seed + 4, (4, 3), xp=xp, device=device),
    }
    mans = {"heads": [M, M], "g": G, "W": None, "V": None}
    return params, mans


def _grads(params, t, xp, device):
    leaves, treedef = optree.tree_flatten(params)
    out = [
        0.3 * geoarray.random.normal(100 * t + k, tuple(p.shape), xp=xp, device=device) + 0.1 * p
        for k, p in enumerate(leaves)
    ]
    return optree.tree_unflatten(treedef, out)


OPTIMIZERS = {
    "Gradient": lambda: optim.Gradient(0.05),
    "Momentum": lambda: optim.Momentum(0.05, 0.7),
    "Adam": lambda: optim.Adam(0.02),
    "AdamWithDecay": lambda: optim.AdamWithDecay(n_steps=5, lr_start=0.05, lr_end=0.005),
    "BFGS": lambda: optim.BFGS(0.02),
    "riemannian": lambda: optim.riemannian(
        optim.chain(optim.clip_by_global_norm(1.0), optim.scale_by_adam(), optim.scale_by_learning_rate(0.02))
    ),
    "ManifoldMuon": lambda: optim.ManifoldMuon(0.02),
    "Muon": lambda: optim.Muon(0.02),
    "partition": lambda: optim.partition(
        {"muon": optim.ManifoldMuon(0.02), "adam": optim.Adam(0.02)},
        {"heads": ["muon", "muon"], "g": "muon", "W": "adam", "V": "muon"},
    ),
}


def _setup(name, xp, device):
    params, mans = _problem(xp, device)
    if name == "Muon":  # Euclidean matrices only
        params, mans = {"W": params["W"], "V": params["V"]}, {"W": None, "V": None}
    return params, mans


def _run(opt, params, state, steps, xp, device, start=0):
    for t in range(start, start + steps):
        params, state = opt.update(params, _grads(params, t, xp, device), state)
    return params, state


def _host(tree):
    return [to_numpy(x) for x in optree.tree_leaves(tree)]


def _assert_bit_equal(a, b):
    ha, hb = _host(a), _host(b)
    assert len(ha) == len(hb)
    for x, y in zip(ha, hb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_state_saves_and_loads_bit_exactly_and_resumes(xp, device, tmp_path, name):
    params, mans = _setup(name, xp, device)
    opt = OPTIMIZERS[name]()
    state = opt.init(params, mans)
    p_ref, s_ref = _run(opt, params, state, 4, xp, device)
    p, s = _run(opt, params, state, 2, xp, device)
    path = tmp_path / f"{name}.npz"
    optim.save_state(path, s)
    # a *new*, identically configured optimizer object, as after a restart
    fresh = OPTIMIZERS[name]()
    loaded = optim.load_state(path, like=fresh.init(params, mans))
    _assert_bit_equal(loaded, s)
    assert optree.tree_structure(loaded) == optree.tree_structure(s)
    p, loaded = _run(fresh, p, loaded, 2, xp, device, start=2)
    _assert_bit_equal(p, p_ref)
    _assert_bit_equal(loaded, s_ref)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(_host(p_ref), _host(params), strict=True))
    assert moved > 1e-3, "the optimizer did not move the parameters: the comparison would be vacuous"


def test_a_state_of_another_optimizer_is_refused_by_name(xp, device, tmp_path):
    params, mans = _problem(xp, device)
    path = tmp_path / "muon.npz"
    optim.save_state(path, optim.ManifoldMuon(0.02).init(params, mans))
    with pytest.raises(ValueError, match="another optimizer or parameter tree"):
        optim.load_state(path, like=optim.Adam().init(params, mans))
    with pytest.raises(TypeError, match=r"state must be an optimizer state returned by opt.init.*got dict"):
        optim.save_state(path, {"step": 0})


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_identically_configured_optimizers_accept_each_others_states(xp, device, name):
    params, mans = _setup(name, xp, device)
    a, b = OPTIMIZERS[name](), OPTIMIZERS[name]()
    state = a.init(params, mans)
    pa, sa = _run(a, params, state, 3, xp, device)
    pb, sb = _run(b, params, state, 3, xp, device)  # b never ran init
    _assert_bit_equal(pa, pb)
    _assert_bit_equal(sa, sb)


@pytest.mark.parametrize("name", ["Adam", "ManifoldMuon", "partition"])
def test_one_optimizer_serves_two_trees_in_any_order(xp, device, name):
    params_a, mans_a = _setup(name, xp, device)
    M = Stiefel(6, 3)
    params_b = {"Y": M.random(9, xp=xp, device=device), "W": geoarray.random.normal(8, (2, 3), xp=xp, device=device)}
    mans_b = {"Y": M, "W": None}
    if name == "partition":
        opt_b = optim.partition(
            {"muon": optim.ManifoldMuon(0.02), "adam": optim.Adam(0.02)}, {"Y": "muon", "W": "adam"}
        )
    else:
        opt_b = OPTIMIZERS[name]()
    opt = OPTIMIZERS[name]()
    shared = opt_b if name == "partition" else opt  # a partition's labels are tied to one tree
    state_a, state_b = opt.init(params_a, mans_a), shared.init(params_b, mans_b)  # the second init after the first
    pa, sa = _run(opt, params_a, state_a, 2, xp, device)
    pb, _ = _run(shared, params_b, state_b, 2, xp, device)
    alone_a = OPTIMIZERS[name]()
    ra, _ = _run(alone_a, params_a, alone_a.init(params_a, mans_a), 2, xp, device)
    alone_b = opt_b if name == "partition" else OPTIMIZERS[name]()
    rb, _ = _run(alone_b, params_b, alone_b.init(params_b, mans_b), 2, xp, device)
    _assert_bit_equal(pa, ra)
    _assert_bit_equal(pb, rb)
    # a state of tree A handed an update of tree B is refused, naming the structures
    with pytest.raises(ValueError, match="tree structure"):
        opt.update(params_b, _grads(params_b, 0, xp, device), sa)


@pytest.mark.parametrize("name", ["Adam", "ManifoldMuon", "partition", "BFGS"])
def test_update_without_checks_is_the_same_computation(xp, device, name):
    params, mans = _setup(name, xp, device)
    opt = OPTIMIZERS[name]()
    state = opt.init(params, mans)
    g = _grads(params, 0, xp, device)
    checked = opt.update(params, g, state)
    unchecked = opt.update(params, g, state, check=False)
    _assert_bit_equal(checked, unchecked)


@pytest.mark.parametrize("name", [*sorted(OPTIMIZERS), "torch-rules Adam (amsgrad)"])
def test_no_two_arrays_of_a_fresh_state_are_one_object(xp, device, name):
    if name in OPTIMIZERS:
        opt = OPTIMIZERS[name]()
    else:  # the rule behind geoarray.torch.Adam, with all three of its buffers
        opt = optim.riemannian(
            optim.chain(optim.torch_rules.scale_by_torch_adam(amsgrad=True), optim.scale_by_learning_rate(0.02))
        )
    params, mans = _setup(name, xp, device)
    leaves = optree.tree_leaves(opt.init(params, mans))
    ids = [id(x) for x in leaves]
    assert len(leaves) > 1 and len(set(ids)) == len(ids), [type(x).__name__ for x in leaves]


def test_the_layout_is_a_static_node_of_the_state(xp, device):
    params, mans = _problem(xp, device)
    state = optim.Adam().init(params, mans)
    leaves = optree.tree_leaves(state)
    assert all(hasattr(x, "shape") and hasattr(x, "dtype") for x in leaves)  # arrays only
    doubled = optree.tree_map(lambda x: 2 * x, state)
    assert doubled.layout is state.layout
    assert state.layout == optim.Adam().init(params, mans).layout  # equal layouts for equal trees
    assert [g.packing for g in state.layout.groups] == [L.RAVELED, L.AS_IS, L.STACKED]  # V and W, g, heads
    assert state.layout.paths[0] == "params['V']"  # optree sorts dict keys


def test_pack_and_unpack_are_exact_inverses(xp, device):
    params, mans = _problem(xp, device)
    leaves, treedef, paths = L.flatten_params(params)
    mlist = L.flatten_manifolds(mans, params, len(leaves))
    for ravel in (True, False):
        layout = L.make_layout(leaves, treedef, paths, mlist, ravel_euclidean=ravel)
        out: list = [None] * len(leaves)
        for group in layout.groups:
            packed = L.pack(group, leaves, xp)
            n = sum(int(np.prod(layout.shapes[i])) for i in group.indices)
            assert int(np.prod(packed.shape)) == n
            L.unpack(group, packed, layout.shapes, xp, out)
        for a, b in zip(out, leaves, strict=True):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert sorted(i for g in layout.groups for i in g.indices) == list(range(len(leaves)))


def test_layout_errors_name_the_leaf(xp, device):
    params, mans = _problem(xp, device)
    with pytest.raises(ValueError, match="manifolds must have the tree structure of params"):
        L.flatten_manifolds({"heads": mans["heads"]}, params, 5)
    with pytest.raises(TypeError, match="manifolds leaves must be Manifold instances or None, got str"):
        L.flatten_manifolds({**mans, "g": "grassmann"}, params, 5)
    with pytest.raises(ValueError, match="params has no array leaves"):
        L.flatten_params({})
    state = optim.Adam().init(params, mans)
    bad = dict(params, W=params["W"][:2, ...])
    with pytest.raises(ValueError, match=r"params\['W'\] has shape \(2, 4\), but the optimizer state"):
        L.check_inputs(state.layout, bad, bad)
