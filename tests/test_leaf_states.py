"""``geoarray.optim.layout.leaf_states``: each parameter leaf's part of an optimizer's grouped state.

The state keeps one value per group of leaves (same-shaped manifold leaves stacked, Euclidean leaves
raveled); ``leaf_states`` cuts it per leaf, the fields named by the state's own declarations (what
the transform states declare with ``layout.per_leaf``, manifold Muon's buffers). The property checked
on every backend: the per-leaf pieces pack back into the grouped value bit for bit, for stacked, single and raveled
groups, Riemannian and manifold-Muon states; the names are the declared ones; ``step`` is the state's.
"""

from __future__ import annotations

import re

import numpy as np
import optree
import pytest

import geoarray
from _helpers import to_numpy
from geoarray import _backend, optim
from geoarray.manifolds import Stiefel
from geoarray.optim import layout as _layout


def _tree(xp, device):
    """Three Stiefel(6, 3) leaves (one stacked group), one Stiefel(5, 2) (a group of its own) and three
    Euclidean matrices (raveled for the Riemannian optimizers, stacked by shape for manifold Muon)."""
    rnd = geoarray.random
    params = {
        "Y": [Stiefel(6, 3).random(k, xp=xp, device=device) for k in range(3)],
        "Z": Stiefel(5, 2).random(7, xp=xp, device=device),
        "w": [rnd.normal(8, (4, 3), xp=xp, device=device), rnd.normal(9, (4, 3), xp=xp, device=device)],
        "b": rnd.normal(10, (2, 5), xp=xp, device=device),
    }
    mans = {"Y": [Stiefel(6, 3)] * 3, "Z": Stiefel(5, 2), "w": [None, None], "b": None}
    return params, mans


def _grads(params, k):
    leaves, spec = optree.tree_flatten(params)
    xp = _backend.array_namespace(*leaves)
    out = [
        geoarray.random.normal(100 + 10 * k + i, tuple(x.shape), xp=xp, dtype=x.dtype, device=_backend.device(x))
        for i, x in enumerate(leaves)
    ]
    return optree.tree_unflatten(spec, out)


def _stepped(opt, xp, device, steps=2):
    """The test tree and ``opt``'s state after ``steps`` steps of fixed gradients from it."""
    params, mans = _tree(xp, device)
    state = opt.init(params, mans)
    for k in range(steps):
        params, state = opt.update(params, _grads(params, k), state)
    return params, mans, state


def _repack(group, pieces, xp):
    """The test's inverse of leaf_piece: a single leaf's value as it is, stacked leaves stacked (every
    array of a pytree such as a horizontal element), raveled leaves raveled and concatenated."""
    if group.packing == _layout.AS_IS:
        (piece,) = pieces
        return piece
    if group.packing == _layout.STACKED:
        return optree.tree_map(lambda *a: xp.stack(a, axis=0), *pieces)
    return xp.concat([xp.reshape(p, (-1,)) for p in pieces], axis=0)


def _same(a, b):
    la, lb = optree.tree_leaves(a), optree.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(to_numpy(x), to_numpy(y)) for x, y in zip(la, lb, strict=True))


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: optim.Adam(1e-2), {"mu", "nu"}),
        (lambda: optim.Momentum(1e-2), {"momentum_buffer"}),
        (lambda: optim.ManifoldMuon(lr=1e-2), {"momentum_buffer"}),
    ],
    ids=["Adam", "Momentum", "ManifoldMuon"],
)
def test_leaf_pieces_pack_back_into_the_grouped_state(xp, device, make, names):
    _, _, state = _stepped(make(), xp, device)
    layout = state.layout
    per_leaf = _layout.leaf_states(state)
    assert set(per_leaf) == set(layout.paths)
    packings = {group.packing for group in layout.groups}
    assert _layout.STACKED in packings and _layout.AS_IS in packings, packings  # the tree exercises both
    for path in layout.paths:
        assert set(per_leaf[path]) == {"step", *names}, (path, set(per_leaf[path]))
        assert int(per_leaf[path]["step"]) == int(state.step) == 2
    checked = 0
    for name, values, groups in state.per_group_fields():
        for value, g in zip(values, groups, strict=True):
            group = layout.groups[g]
            pieces = [per_leaf[layout.paths[j]][name] for j in group.indices]
            for j, piece in zip(group.indices, pieces, strict=True):
                if group.manifold.is_vector_space and optree.tree_leaves(piece):
                    assert tuple(optree.tree_leaves(piece)[0].shape) == layout.shapes[j]  # the leaf's shape
            assert _same(_repack(group, pieces, xp), value), (name, g, group.packing)
            checked += 1
    assert checked >= len(layout.groups) - 1  # ManifoldMuon's Euclidean buffers live in its Muon state


def test_raveled_euclidean_leaves_are_cut_to_their_shapes(xp, device):
    """Adam ravels the Euclidean leaves of one dtype into one vector: each leaf's moments come back in
    the leaf's own shape, equal to the vector's slice."""
    params, mans = _tree(xp, device)
    opt = optim.Adam(1e-2)
    state = opt.init(params, mans)
    params, state = opt.update(params, _grads(params, 0), state)
    layout = state.layout
    raveled = [g for g, group in enumerate(layout.groups) if group.packing == _layout.RAVELED]
    assert len(raveled) == 1 and len(layout.groups[raveled[0]].indices) == 3
    per_leaf = _layout.leaf_states(state)
    for j in layout.groups[raveled[0]].indices:
        assert tuple(per_leaf[layout.paths[j]]["mu"].shape) == layout.shapes[j]


def test_a_state_without_per_group_fields_has_no_leaf_states(xp, device):
    """``partition``'s state holds its members' states, each with its own layout: it declares no per-group
    fields of its own, and reads {} (as geoarray.torch's opt.state[p] does for such a core)."""
    params, mans = _tree(xp, device)
    labels = {"Y": ["a"] * 3, "Z": "a", "w": ["b", "b"], "b": "b"}
    opt = optim.partition({"a": optim.Adam(1e-2), "b": optim.Momentum(1e-2)}, labels)
    state = opt.init(params, mans)
    assert _layout.leaf_states(state) == {}


def test_one_leafs_state_is_its_entry_of_all_and_a_bad_index_is_refused(xp, device):
    """``leaf_state(state, j)`` (what ``opt.state[p]`` reads: one leaf's pieces, not the whole group's)
    equals ``leaf_states(state)[path_j]`` bit for bit; an index outside the tree is a ValueError naming it."""
    params, mans = _tree(xp, device)
    opt = optim.Adam(1e-2)
    state = opt.init(params, mans)
    params, state = opt.update(params, _grads(params, 0), state)
    every = _layout.leaf_states(state)
    for j, path in enumerate(state.layout.paths):
        one = _layout.leaf_state(state, j)
        assert set(one) == set(every[path]) and all(_same(one[k], every[path][k]) for k in one)
    n = len(state.layout.paths)
    for bad in (n, -1, True, 1.0):
        with pytest.raises(ValueError, match=rf"j must be a leaf index in \[0, {n}\)"):
            _layout.leaf_state(state, bad)


def test_leaf_piece_refuses_a_leaf_of_another_group(xp, device):
    params, mans = _tree(xp, device)
    state = optim.Adam(1e-2).init(params, mans)
    group = state.layout.groups[0]
    other = next(j for j in range(len(state.layout.paths)) if j not in group.indices)
    with pytest.raises(ValueError, match=f"leaf {other} is not in this group"):
        _layout.leaf_piece(group, None, other, state.layout.shapes)


def _find(tree, kind, path=()):
    """The path (tuple positions, as optree writes them) of the first node of type ``kind`` in ``tree``."""
    if isinstance(tree, kind):
        return path
    if isinstance(tree, tuple):
        for k, child in enumerate(tree):
            found = _find(child, kind, (*path, k))
            if found is not None:
                return found
    return None


@pytest.mark.parametrize("tree", ["frames only", "with matrices"])
def test_per_group_nodes_are_what_the_state_declares(xp, device, tree):
    """``layout.per_group_nodes`` (what geoarray.torch.checkpoint splits into one entry per parameter) holds
    exactly the state's declared per-group nodes: the fields ``leaf_states`` cuts (BFGS's previous gradient
    and step), the carried sections, and BFGS's inverse Hessians (declared per unit) where each entry leads
    with its group's packed shape: one H per frame for a tree of stacked frames; beside a raveled group
    (one H over its whole vector) the node stays whole, as a cohort-wide entry."""
    from geoarray.optim.transforms import ScaleByBFGSState

    params, mans = _tree(xp, device)
    if tree == "frames only":
        params, mans = {"Y": params["Y"], "Z": params["Z"]}, {"Y": mans["Y"], "Z": mans["Z"]}
    opt = optim.BFGS(1e-2, section="transported")
    state = opt.init(params, mans)
    for k in range(2):
        params, state = opt.update(params, _grads(params, k), state)
    matrices = any(group.manifold.is_vector_space for group in state.layout.groups)
    assert matrices == (tree == "with matrices")
    assert {group.packing for group in state.layout.groups} == {_layout.AS_IS}
    bfgs = (state._fields.index("inner"), *_find(state.inner, ScaleByBFGSState))
    fields = ScaleByBFGSState._fields
    every = tuple(range(len(state.layout.groups)))
    expected = {
        (*bfgs, fields.index("prev_grad")): every,
        (*bfgs, fields.index("prev_step")): every,
        (state._fields.index("sections"),): every,
    }
    if not matrices:
        expected[(*bfgs, fields.index("hessian_inv"))] = every
    assert _layout.per_group_nodes(state) == expected
    per_leaf = _layout.leaf_states(state)
    node = state.inner
    for k in bfgs[1:]:
        node = node[k]
    for g, group in enumerate(state.layout.groups):
        (j,) = group.indices
        path = state.layout.paths[j]
        assert set(per_leaf[path]) == {"step", "prev_grad", "prev_step"}
        assert _same(per_leaf[path]["prev_grad"], node.prev_grad[g]) and _same(
            per_leaf[path]["prev_step"], node.prev_step[g]
        )


def test_a_state_that_declares_nothing_is_refused_by_per_group_nodes(xp, device):
    params, mans = _tree(xp, device)
    opt = optim.partition(
        {"a": optim.Adam(1e-2), "m": optim.Momentum(1e-2)}, {"Y": ["a"] * 3, "Z": "m", "w": ["a", "a"], "b": "m"}
    )
    state = opt.init(params, mans)
    with pytest.raises(TypeError, match="does not declare"):
        _layout.per_group_nodes(state)


_OPTIMIZERS = {
    "Adam": lambda: optim.Adam(1e-2),
    "Momentum": lambda: optim.Momentum(1e-2),
    "BFGS": lambda: optim.BFGS(1e-2),  # its H per frame: declared per unit
    "ManifoldMuon": lambda: optim.ManifoldMuon(lr=1e-2),
}


@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_state_pieces_pack_back_into_the_state_bit_for_bit(xp, device, name):
    """``state_pieces`` cuts every array of a state per parameter leaf (the arrays of the whole state once,
    with ``leaf=None``) and ``state_from_pieces`` packs them back: the same tree structure and every array
    equal bit for bit, and the next step from the rebuilt state equals the step from the original bit for
    bit (the same computation). Stacked, single and raveled groups; BFGS's H per frame and the carried
    sections among the slots. The per-leaf ``pack_pieces`` inverts ``leaf_piece`` as the test's own
    reference does."""
    opt = _OPTIMIZERS[name]()
    params, _, state = _stepped(opt, xp, device)
    layout = state.layout
    pieces = _layout.state_pieces(state)
    shared = [p for p in pieces if p.leaf is None]
    per_leaf = [p for p in pieces if p.leaf is not None]
    assert shared and per_leaf, (len(shared), len(per_leaf))
    slots = {p.slot for p in per_leaf}
    for slot in slots:  # a per-group slot has a piece for every leaf of a group, each once
        leaves = [p.leaf for p in per_leaf if p.slot == slot]
        assert len(leaves) == len(set(leaves)), slot
    assert {p.leaf for p in per_leaf} == set(range(len(layout.paths)))  # every leaf holds state
    values = {(p.slot, p.leaf): p.value for p in pieces}
    assert len(values) == len(pieces)  # (slot, leaf) names each piece once
    rebuilt = _layout.state_from_pieces(state, values)
    assert optree.tree_structure(rebuilt) == optree.tree_structure(state)
    assert _same(rebuilt, state)
    grads = _grads(params, 2)
    p1, s1 = opt.update(params, grads, state)
    p2, s2 = opt.update(params, grads, rebuilt)
    assert _same(p1, p2) and _same(s1, s2)
    # one group's pieces of one slot, packed: the grouped array, as the test's own inverse packs them
    for slot in slots:
        group = next(g for g in layout.groups if any(values.get((slot, j)) is not None for j in g.indices))
        group_pieces = [values[slot, j] for j in group.indices]
        assert _same(_layout.pack_pieces(group, group_pieces, xp), _repack(group, group_pieces, xp)), slot


def test_state_from_pieces_names_a_missing_piece_and_refuses_a_state_without_layout(xp, device):
    """A piece left out is a ``KeyError`` naming its slot and its leaf's path, ``values`` that is not a mapping
    a ``TypeError`` and a wrong number of pieces for a group a ``ValueError``; ``partition``'s state (its
    members' states each with their own layout) is a ``TypeError``: it has no layout to cut by."""
    params, mans, state = _stepped(optim.Adam(1e-2), xp, device, steps=1)
    pieces = _layout.state_pieces(state)
    values = {(p.slot, p.leaf): p.value for p in pieces}
    dropped = next(p for p in pieces if p.leaf is not None)
    del values[dropped.slot, dropped.leaf]
    path = state.layout.paths[dropped.leaf]
    with pytest.raises(KeyError, match=re.escape(f"no piece for slot {dropped.slot!r} of {path}")):
        _layout.state_from_pieces(state, values)
    with pytest.raises(TypeError, match=r"values must be a mapping \{\(slot, leaf\): array\}.*got list"):
        _layout.state_from_pieces(state, list(pieces))
    group = state.layout.groups[0]
    with pytest.raises(ValueError, match=rf"pieces must hold one piece per leaf of the group \({len(group.indices)},"):
        _layout.pack_pieces(group, [], xp)
    labels = {"Y": ["a"] * 3, "Z": "a", "w": ["b", "b"], "b": "b"}
    whole = optim.partition({"a": optim.Adam(1e-2), "b": optim.Momentum(1e-2)}, labels)
    with pytest.raises(TypeError, match="has no layout"):
        _layout.state_pieces(whole.init(params, mans))
