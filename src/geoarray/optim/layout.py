"""The layout of a parameter tree: flatten, group, pack and unpack — pure functions, no optimizer.

Every optimizer of :mod:`geoarray.optim` walks a step the same way::

    leaves  = flatten(params)                 # the user's tree, in optree's order
    packed  = pack(group, leaves)  per group  # same-shaped leaves of one manifold stacked, Euclidean raveled
    ... the optimizer's step on the packed arrays (one batched call per group) ...
    params' = unflatten(unpack(group, packed'))

:func:`make_layout` decides the groups once, in ``init``; the :class:`Layout` it returns lives in the
optimizer's *state* (a static pytree node: no array leaves, part of the tree structure), so an
optimizer object holds configuration only, two identically configured optimizers accept each
other's states, and one optimizer serves any number of parameter trees.

Grouping (``group_same_shape=True``): leaves with the same manifold, shape, dtype and device are
stacked along a new leading axis (e.g. the 336 Stiefel(49, 7) projections of the paper's vision
transformer: Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*,
Table 2 is about this batching); Euclidean leaves of one dtype and device are raveled into one
vector (``ravel_euclidean=True``) or, for optimizers that need their matrix shape (Muon), stacked
by shape like manifold leaves. float16/bfloat16 leaves are packed in float32 and cast back.

The state follows the groups: one value per group. :func:`leaf_states` gives each leaf its part of it
(``{path: {"step": ..., "exp_avg": ...}}``; one leaf's: :func:`leaf_state`), the fields named by the
states themselves (:func:`per_leaf` on a transform's state type, ``per_group_fields`` on an optimizer's
state): ``geoarray.torch``'s ``opt.state[p]`` is :func:`leaf_state`. :func:`state_pieces` cuts every array
of a state per leaf, by its slot (its path in the state), and :func:`state_from_pieces` packs such pieces
back into a state, bit for bit: ``geoarray.torch.checkpoint`` saves and loads a cohort's state through
them, one entry per parameter, so that a checkpoint reshards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, cast

import optree

from .. import _backend
from .._backend import array_namespace
from ..manifolds.base import Manifold
from ..manifolds.euclidean import Euclidean

__all__ = [
    "AS_IS",
    "RAVELED",
    "STACKED",
    "Group",
    "Layout",
    "LeafPath",
    "StatePiece",
    "check_inputs",
    "declared_nodes",
    "declared_paths",
    "flatten_manifolds",
    "flatten_params",
    "frame_pieces",
    "half_dtype",
    "inputs",
    "is_manifold_leaf",
    "leaf_path",
    "leaf_piece",
    "leaf_state",
    "leaf_states",
    "make_layout",
    "map_per_group",
    "pack",
    "pack_pieces",
    "packed_prefix",
    "per_group_nodes",
    "per_leaf",
    "per_leaf_fields",
    "per_unit",
    "piece_of",
    "state_from_pieces",
    "state_pieces",
    "unpack",
    "write_piece",
]

from .._typing import Array

_T = TypeVar("_T")

#: how a group's leaves become one array: the single leaf as it is, stacked on a new leading axis,
#: or raveled and concatenated (Euclidean leaves)
AS_IS, STACKED, RAVELED = "as_is", "stacked", "raveled"


@dataclass(frozen=True)
class Group:
    """Parameter leaves updated by one (batched) call: ``indices`` into the flattened tree, how they are
    packed, their manifold and section strategy, and ``dtype`` for float16/bfloat16 leaves (packed in
    float32 and cast back; None otherwise)."""

    manifold: Manifold
    indices: tuple[int, ...]
    packing: str  # AS_IS, STACKED or RAVELED
    section: str = "householder"  # the section strategy ("householder" for Euclidean groups)
    dtype: Any = None

    @property
    def upcast(self) -> bool:
        return self.dtype is not None


@_backend.register_static_node
@dataclass(frozen=True)
class Layout:
    """What ``init`` learnt about a parameter tree: its structure, leaf paths and shapes, and the groups.

    A static pytree node (no array leaves): it travels inside the optimizer state through
    ``jax.jit``, ``optree`` and ``torch.utils._pytree`` unchanged, and two layouts are equal when
    they describe the same tree.
    """

    treedef: Any
    paths: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    groups: tuple[Group, ...]


class LeafPath(str):
    """A leaf's path already written as subscripts, ``"['blocks'][0]['W']"``: the keys of the dicts of
    leaves that :func:`~geoarray.optim.partition` hands its members. :func:`leaf_path` appends such a key
    as it is, so a member's errors name the user's leaf, ``params['blocks'][0]['W']``, not the key of
    its dict, ``params["['blocks'][0]['W']"]``. Equal to, and hashed as, the plain string."""

    __slots__ = ()


def leaf_path(path: tuple, root: str = "params") -> str:
    """``('blocks', 0, 'W')`` → ``"params['blocks'][0]['W']"``: how error messages name a leaf (a
    :class:`LeafPath` key is appended as the subscripts it holds)."""
    return root + "".join(p if isinstance(p, LeafPath) else f"[{p!r}]" for p in path)


def is_manifold_leaf(x: Any) -> bool:
    """A leaf of a ``manifolds`` tree: a Manifold, or None for a Euclidean parameter."""
    return x is None or isinstance(x, Manifold)


def half_dtype(x: Array) -> Any:
    """The dtype of a float16/bfloat16 leaf (computed in float32 by the optimizers), else None."""
    return x.dtype if _backend.dtype_name(x.dtype) in ("float16", "bfloat16") else None


def check_points(leaves: list, manifolds: list[Manifold], paths: list[str]) -> None:
    """Raise ``ValueError`` unless every constrained leaf is a point of its manifold (``M.is_point`` at
    the default tolerance of the leaf's dtype; float16/bfloat16 leaves in float32 at their own
    rounding's tolerance). One host read per constrained leaf, so never inside a step: leaves traced by
    ``jax.jit`` or ``torch.compile`` are skipped (whoever traces ``init`` checks the values first, as
    ``geoarray.jax.make_train_step`` does). The message gives the measured error, the tolerance and the
    fix."""
    for leaf, m, path in zip(leaves, manifolds, paths, strict=True):
        if m.is_vector_space or _backend.is_traced(leaf):
            continue
        xp = array_namespace(leaf)
        Y = leaf if half_dtype(leaf) is None else xp.astype(leaf, xp.float32)
        atol = Manifold.default_atol(leaf.dtype, xp)
        if m.is_point(Y, atol=atol):
            continue
        err = m.point_error(Y)
        measured = f"its error {err:.3g} is" if err is not None else "M.is_point fails,"
        fix = (
            f"project it first, e.g. {path} = M.nearest_point({path}) (float32 weights cast to float64 "
            "measure ~1e-8 to 1e-6)"
            if m.has_nearest_point
            else "start from a point of the manifold, e.g. M.random(...)"
        )
        raise ValueError(
            f"{path} is not a point of {m!r}: {measured} above the tolerance {atol:g} of "
            f"{_backend.dtype_name(leaf.dtype)}; {fix}"
        )


def flatten_params(params: Any, name: str = "params") -> tuple[list, Any, list[str]]:
    """The leaves of ``params``, its tree structure and the leaves' paths (:func:`leaf_path`)."""
    raw, leaves, treedef = optree.tree_flatten_with_path(params)
    if not leaves:
        raise ValueError(f"{name} has no array leaves")
    return leaves, treedef, [leaf_path(p, name) for p in raw]


def flatten_manifolds(manifolds: Any, params: Any, n_leaves: int) -> list[Manifold]:
    """One Manifold per leaf of ``params`` (``Euclidean()`` for None); ``manifolds=None``: all Euclidean."""
    if manifolds is None:
        return [Euclidean()] * n_leaves
    mans, mdef = optree.tree_flatten(manifolds, is_leaf=is_manifold_leaf, none_is_leaf=True)
    treedef = optree.tree_structure(params, none_is_leaf=True)
    if mdef != treedef:
        raise ValueError(
            f"manifolds must have the tree structure of params (a Manifold or None per leaf): params {treedef}, "
            f"manifolds {mdef}"
        )
    for m in mans:
        if not is_manifold_leaf(m):
            raise TypeError(f"manifolds leaves must be Manifold instances or None, got {type(m).__name__}")
    return [Euclidean() if m is None else m for m in mans]


def make_layout(
    leaves: list,
    treedef: Any,
    paths: list[str],
    mans: list[Manifold],
    *,
    strategies: list[str] | None = None,
    group_same_shape: bool = True,
    ravel_euclidean: bool = True,
    upcast_half: bool = True,
) -> Layout:
    """Group the leaves (module docstring). ``strategies``: the section strategy per leaf (default
    Householder); leaves of different strategies never share a group. ``upcast_half=False`` packs
    float16/bfloat16 Euclidean leaves in their own dtype (Muon's Newton–Schulz chooses its own precision);
    manifold leaves are packed in float32 either way (their QR and ``eigh`` have no half-precision kernels)."""
    strategies = ["householder"] * len(leaves) if strategies is None else strategies
    buckets: dict[tuple, list[int]] = {}
    for i, (leaf, m, s) in enumerate(zip(leaves, mans, strategies, strict=True)):
        if not group_same_shape:
            key: tuple = (i,)
        else:
            where = (str(leaf.dtype), str(_backend.device(leaf)))
            if m.is_vector_space and ravel_euclidean:
                key = (RAVELED, *where)
            else:
                key = (STACKED, m, tuple(leaf.shape), s, *where)
        buckets.setdefault(key, []).append(i)
    groups = []
    for key, idx in buckets.items():
        first = idx[0]
        manifold = mans[first] if key[0] != RAVELED else Euclidean()
        packing = AS_IS if len(idx) == 1 else key[0]
        dtype = half_dtype(leaves[first]) if upcast_half or not manifold.is_vector_space else None
        groups.append(Group(manifold, tuple(idx), packing, strategies[first], dtype))
    return Layout(treedef, tuple(paths), tuple(tuple(x.shape) for x in leaves), tuple(groups))


def pack(group: Group, leaves: list, xp: Any) -> Array:
    """The group's leaves as one array (float32 for half-precision groups)."""
    if group.packing == AS_IS:
        packed = leaves[group.indices[0]]
    elif group.packing == STACKED:
        packed = xp.stack([leaves[i] for i in group.indices], axis=0)
    else:
        packed = xp.concat([xp.reshape(leaves[i], (-1,)) for i in group.indices], axis=0)
    return xp.astype(packed, xp.float32) if group.upcast else packed


def pack_pieces(group: Group, pieces: list, xp: Any) -> Any:
    """One group's packed value from its leaves' pieces, in the order of ``group.indices``: the piece
    itself for a single leaf, the pieces stacked along a new first axis (every array of a pytree such as a
    horizontal element) for stacked leaves, raveled and concatenated for raveled ones. The inverse of
    :func:`leaf_piece`, bit for bit (:func:`pack` packs the parameters themselves, at every step)."""
    if len(pieces) != len(group.indices):
        raise ValueError(
            f"pieces must hold one piece per leaf of the group ({len(group.indices)}, in the order of "
            f"group.indices), got {len(pieces)}"
        )
    if group.packing == AS_IS:
        return pieces[0]
    if group.packing == STACKED:
        return optree.tree_map(lambda *a: xp.stack(a, axis=0), *pieces)
    return xp.concat([xp.reshape(p, (-1,)) for p in pieces], axis=0)


def unpack(group: Group, packed: Array, shapes: tuple, xp: Any, out: list) -> None:
    """Write the group's leaves, taken from ``packed``, into their places in ``out``."""
    if group.upcast:
        packed = xp.astype(packed, group.dtype)
    if group.packing == AS_IS:
        out[group.indices[0]] = packed
    elif group.packing == STACKED:
        for i, leaf in zip(group.indices, xp.unstack(packed, axis=0), strict=True):
            out[i] = leaf
    else:
        parts = _backend.split(packed, [math.prod(shapes[i]) for i in group.indices], xp)
        for i, part in zip(group.indices, parts, strict=True):
            out[i] = xp.reshape(part, shapes[i])


def frame_pieces(group: Group, shapes: tuple, leaves: list, budget: int) -> list:
    """The pieces in which an eager step may take a group of frames larger than ``budget`` bytes of points,
    one after the other: ``[None]`` for the whole group; else whole stacked leaves while two fit the budget
    (``(slice,)`` along the packed leading axis), else rows of each leaf's leading axis (``(k, slice)``: rows
    of the k-th stacked leaf, or ``(slice,)`` of a single leaf); at least one row a piece (a single frame
    larger than the budget is one piece). Every index also cuts the group's packed arrays (``a[(*index,
    ...)]``), so a piece of a state field is that field's rows."""
    shape = shapes[group.indices[0]]
    first = leaves[group.indices[0]]
    leaf_bytes = math.prod(shape) * (array_namespace(first).finfo(first.dtype).bits // 8)
    count = len(group.indices)
    if leaf_bytes * count <= budget or leaf_bytes == 0:
        return [None]
    batch = shape[:-2]
    if group.packing == STACKED and 2 * leaf_bytes <= budget:
        per = budget // leaf_bytes
        return [(slice(a, min(a + per, count)),) for a in range(0, count, per)]
    if not batch:  # single frames: one leaf per piece
        return [(slice(k, k + 1),) for k in range(count)] if group.packing == STACKED else [None]
    rows = batch[0]
    per = max(1, budget // (leaf_bytes // rows))
    if group.packing == STACKED:
        return [(k, slice(a, min(a + per, rows))) for k in range(count) for a in range(0, rows, per)]
    return [(slice(a, min(a + per, rows)),) for a in range(0, rows, per)]


def piece_of(group: Group, index: tuple | None, leaves: list, xp: Any) -> Array:
    """The points (or gradients) of one piece (:func:`frame_pieces`), as the group's packed array holds them:
    a view for rows of one leaf, a stack of whole leaves otherwise (the packed array itself for None)."""
    if index is None:
        return pack(group, leaves, xp)
    if len(index) == 2:  # rows of one stacked leaf: a view
        k, rows = index
        return leaves[group.indices[k]][rows, ...]
    if group.packing == STACKED:
        members = group.indices[index[0]]
        if len(members) == 1:
            return xp.expand_dims(leaves[members[0]], axis=0)
        return xp.stack([leaves[i] for i in members], axis=0)
    return leaves[group.indices[0]][index[0], ...]


def write_piece(group: Group, index: tuple, value: Array, outs: list) -> None:
    """Write one piece's new points (:func:`piece_of`'s shape) into the group's output leaves ``outs``
    (writable arrays)."""
    if len(index) == 2:
        k, rows = index
        outs[group.indices[k]][rows, ...] = value
    elif group.packing == STACKED:
        for t, i in enumerate(group.indices[index[0]]):
            outs[i][...] = value[t, ...]
    else:
        outs[group.indices[0]][index[0], ...] = value


def leaf_piece(group: Group, value: Any, j: int, shapes: tuple) -> Any:
    """The part of a group's packed ``value`` that belongs to leaf ``j`` of the tree: the value itself for
    a single leaf, its row ``k`` (of every array, for a pytree such as a horizontal element) for the k-th
    of stacked leaves, the leaf's slice reshaped to its shape for raveled ones. What :func:`unpack` writes
    for ``j``, for any per-group value of a state (a moment, a buffer), without the cast back to a
    half-precision dtype: the state keeps float32."""
    if j not in group.indices:
        raise ValueError(f"leaf {j} is not in this group (its leaves: {group.indices})")
    if group.packing == AS_IS:
        return value
    if group.packing == STACKED:
        k = group.indices.index(j)
        return optree.tree_map(lambda a: a[k, ...], value)
    offset = 0
    for i in group.indices:
        size = math.prod(shapes[i])
        if i == j:
            return array_namespace(value).reshape(value[offset : offset + size], shapes[j])
        offset += size
    raise AssertionError("unreachable: j is in group.indices")


_PER_LEAF: dict[type, tuple[tuple[str, str], ...]] = {}
_PER_UNIT: dict[type, tuple[str, ...]] = {}


def per_leaf(*fields: tuple[str, str]) -> Callable[[_T], _T]:
    """Class decorator of a transform's state (a NamedTuple): ``fields`` are ``(field, name)`` pairs, each
    a field holding one value per parameter group and the name its per-leaf part goes by in
    :func:`leaf_states` (torch's, where torch has one: ``exp_avg``, ``momentum_buffer``)."""

    def register(cls: _T) -> _T:
        _PER_LEAF[cls] = fields  # type: ignore[index]
        return cls

    return register


def per_unit(*fields: str) -> Callable[[_T], _T]:
    """Class decorator of a transform's state (a NamedTuple): ``fields`` hold one value per parameter group
    whose entries are per *unit* of the group (a frame of a stack, the whole raveled vector of a Euclidean
    group; BFGS's inverse-Hessian estimates). They are cut per leaf only where no group ravels its leaves
    (:func:`unit_paths`, :func:`per_group_nodes`); they have no per-leaf name (not in :func:`leaf_state`)."""

    def register(cls: _T) -> _T:
        _PER_UNIT[cls] = fields  # type: ignore[index]
        return cls

    return register


def unit_paths(tree: Any, path: tuple = ()) -> Iterator[tuple]:
    """The paths of the fields that transform states inside ``tree`` declare with :func:`per_unit` (as
    :func:`declared_paths`)."""
    if isinstance(tree, tuple):
        node: Any = tree
        for field in _PER_UNIT.get(type(tree), ()):
            yield (*path, node._fields.index(field))
        for k, child in enumerate(tree):
            yield from unit_paths(child, (*path, k))


def per_leaf_fields(node: Any) -> tuple[tuple[str, str], ...]:
    """The ``(field, name)`` pairs that ``node``'s type declared with :func:`per_leaf` (none: ``()``)."""
    return _PER_LEAF.get(type(node), ())


def declared_nodes(tree: Any) -> Iterator[Any]:
    """The transform states inside ``tree`` (a chain's tuple, nested chains, wrappers) whose type declares
    fields holding one value per parameter group (:func:`per_leaf`), such as
    :class:`~geoarray.optim.transforms.ScaleByAdamState`."""
    if isinstance(tree, tuple):
        if type(tree) in _PER_LEAF:
            yield tree
        for child in tree:
            yield from declared_nodes(child)


def declared_paths(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """``(path, name)`` of every field that a transform state inside ``tree`` declares with :func:`per_leaf`,
    ``path`` being the field's position in ``tree`` below ``path`` as optree writes it (tuple and NamedTuple
    positions), the same nodes as :func:`declared_nodes`."""
    if isinstance(tree, tuple):
        node: Any = tree
        for field, name in per_leaf_fields(tree):
            yield (*path, node._fields.index(field)), name
        for k, child in enumerate(tree):
            yield from declared_paths(child, (*path, k))


def packed_prefix(layout: Layout, group: Group) -> tuple[int, ...]:
    """The leading shape of a group's packed arrays (:func:`pack`): the batch shape of its points (stacked:
    with the stack's length first), or the raveled length of its Euclidean leaves."""
    k = len(group.manifold.point_shape or ())
    first = layout.shapes[group.indices[0]]
    base = tuple(first[: len(first) - k])
    if group.packing == AS_IS:
        return base
    if group.packing == STACKED:
        return (len(group.indices), *base)
    return (sum(math.prod(layout.shapes[i]) for i in group.indices),)


def _leads_with_prefix(entry: Any, layout: Layout, group: Group) -> bool:
    prefix = packed_prefix(layout, group)
    for leaf in optree.tree_leaves(entry):
        shape = tuple(getattr(leaf, "shape", ()))
        if shape[: len(prefix)] != prefix or (group.packing == RAVELED and shape != prefix):
            return False
        if not prefix and not group.manifold.is_vector_space and not shape:
            return False  # a scalar beside one matrix's state is not that matrix's piece
    return True


def per_group_nodes(state: Any) -> dict[tuple, tuple[int, ...]]:
    """``{path: groups}`` for every node of an optimizer state that holds one entry per parameter group, as
    the state declares them: ``state.per_group_paths()`` yields a path into the state and the layout groups
    its entries belong to, in order (the fields of :func:`per_leaf`, carried sections, momentum buffers);
    ``state.per_unit_paths()``, where the state has it, the fields of :func:`per_unit`, kept where every
    entry leads with its group's packed shape (:func:`packed_prefix`: a stack's H per frame, not a raveled
    group's one H). Only nodes that hold arrays, one entry per named group, are kept (a field a transform
    leaves empty, ``()``, is not). ``TypeError`` for a state that declares none (``partition``'s, optax's
    own). What ``geoarray.torch.checkpoint`` splits into one entry per parameter."""
    paths = getattr(state, "per_group_paths", None)
    if paths is None:
        raise TypeError(
            f"the optimizer state {type(state).__name__} does not declare which of its arrays belong to which "
            "parameter group (per_group_paths)"
        )
    layout = state.layout

    def node_at(path: tuple) -> Any:
        node = state
        for k in path:
            node = node[k]
        return node

    found: dict[tuple, tuple[int, ...]] = {}
    units = getattr(state, "per_unit_paths", None)
    declared = [(path, groups, False) for path, groups in paths()]
    declared += [(path, groups, True) for path, groups in (units() if units is not None else ())]
    for path, groups, unit in declared:
        node = node_at(path)
        if not isinstance(node, (tuple, list)) or len(node) != len(groups) or not optree.tree_leaves(cast(Any, node)):
            continue
        if unit and not all(_leads_with_prefix(e, layout, layout.groups[g]) for e, g in zip(node, groups, strict=True)):
            continue
        found[tuple(path)] = tuple(groups)
    return found


def map_per_group(fn: Callable[..., Any], tree: Any, *others: Any) -> Any:
    """``tree`` (a transform's state: a chain's tuple, nested chains, NamedTuples) with the value of every
    field that its type declares with :func:`per_leaf` (a tuple of one value per parameter group) replaced
    by ``fn(value, *same_field_of_others)``, ``others`` trees of the same structure; everything else as
    ``tree`` has it. How a step cut into pieces (:class:`~geoarray.optim.RiemannianOptimizer`'s
    ``chunk_bytes``) hands the transform one piece of one group's state and puts the new piece back."""
    if not isinstance(tree, tuple):
        return tree
    fields = per_leaf_fields(tree)
    if fields:  # a declared state: a NamedTuple
        node: Any = tree
        return node._replace(**{f: fn(getattr(tree, f), *(getattr(o, f) for o in others)) for f, _ in fields})
    children = [map_per_group(fn, child, *(o[k] for o in others)) for k, child in enumerate(tree)]
    return type(tree)(*children) if hasattr(tree, "_fields") else type(tree)(children)


def leaf_state(state: Any, j: int) -> dict[str, Any]:
    """Leaf ``j``'s part of an optimizer state: ``{"step": ..., name: array, ...}``, or ``{}`` for a state
    that declares no per-group fields (``partition``'s).

    The state keeps one value per *group* of leaves (stacked or raveled, :func:`pack`); this cuts leaf
    ``j``'s piece out of each with :func:`leaf_piece` (only this leaf's: reading every leaf of a group of
    n costs n pieces, not n²). Which fields hold such values is declared by the state itself:
    ``state.per_group_fields()`` yields ``(name, values, groups)`` (the Riemannian optimizers: every field
    that a transform's state declares with :func:`per_leaf`; manifold Muon: its momentum buffers), and
    the names are torch's where it has one (``exp_avg``, ``momentum_buffer``). The arrays are views or
    slices of the state's, as the backend makes them: read, do not write. For a manifold leaf the moments
    live in g^hor (a horizontal element), not in the leaf's shape. ``geoarray.torch``'s ``opt.state[p]``
    is this."""
    fields = getattr(state, "per_group_fields", None)
    if fields is None:
        return {}
    layout = state.layout
    if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < len(layout.paths):
        raise ValueError(f"j must be a leaf index in [0, {len(layout.paths)}) of this state's tree, got {j!r}")
    out: dict[str, Any] = {"step": state.step}
    for name, values, groups in fields():
        for value, g in zip(values, groups, strict=True):
            group = layout.groups[g]
            if j in group.indices:
                out[name] = leaf_piece(group, value, j, layout.shapes)
    return out


def leaf_states(state: Any) -> dict[str, dict[str, Any]]:
    """Every leaf's :func:`leaf_state`, by the leaf's path: ``{path: {"step": ..., name: array}}``
    (``{}`` for a state that declares no per-group fields)."""
    if getattr(state, "per_group_fields", None) is None:
        return {}
    return {path: leaf_state(state, j) for j, path in enumerate(state.layout.paths)}


class StatePiece(NamedTuple):
    """One array of an optimizer state as :func:`state_pieces` cuts it: ``slot`` is the array's path in the
    state with the position of its parameter group written ``*`` (``"2.1.1.*.0"``), ``leaf`` the index of
    the parameter leaf whose piece ``value`` is, or None for an array of the whole state (a step counter)."""

    slot: str
    leaf: int | None
    value: Any


def _state_slots(state: Any) -> tuple[list[tuple[str, int | None, Any]], Any]:
    """Every array of ``state`` as ``(slot, group or None, array)``, in the state's order, and its treedef."""
    if getattr(state, "layout", None) is None or getattr(state, "per_group_paths", None) is None:
        raise TypeError(
            f"the optimizer state {type(state).__name__} has no layout that assigns its arrays to parameter "
            "leaves; only a state of one optimizer with a layout is cut per leaf (not partition's, optax's)"
        )
    nodes = per_group_nodes(state)
    paths, leaves, treedef = optree.tree_flatten_with_path(state)
    out: list[tuple[str, int | None, Any]] = []
    for path, leaf in zip(paths, leaves, strict=True):
        cut = next((n for n in range(len(path)) if path[:n] in nodes), None)
        if cut is None:
            out.append((".".join(map(str, path)), None, leaf))
        else:
            slot = ".".join([*map(str, path[:cut]), "*", *map(str, path[cut + 1 :])])
            out.append((slot, nodes[path[:cut]][path[cut]], leaf))
    return out, treedef


def state_pieces(state: Any) -> list[StatePiece]:
    """Every array of an optimizer state cut per parameter leaf: for each array of a node that holds one
    entry per parameter group (:func:`per_group_nodes`: the transforms' per-leaf fields, the carried
    sections, BFGS's H per frame), one :class:`StatePiece` per leaf of its group (:func:`leaf_piece`);
    for every other array (the step and skip counters), one piece with ``leaf=None``. Ordered by the
    state's leaves, then the group's leaves. :func:`state_from_pieces` is the inverse. What
    ``geoarray.torch.checkpoint`` saves, one entry per parameter and slot. ``TypeError`` for a state with
    no layout."""
    slots, _ = _state_slots(state)
    layout = state.layout
    out: list[StatePiece] = []
    for slot, g, array in slots:
        if g is None:
            out.append(StatePiece(slot, None, array))
        else:
            group = layout.groups[g]
            out += [StatePiece(slot, j, leaf_piece(group, array, j, layout.shapes)) for j in group.indices]
    return out


def state_from_pieces(like: Any, values: Any) -> Any:
    """The state of ``like``'s structure (its layout, its transforms) whose arrays are packed from
    ``values``, a mapping ``{(slot, leaf): array}`` holding every piece that :func:`state_pieces` cuts
    ``like`` into (``leaf`` None for an array of the whole state): each per-group array packed from its
    leaves' pieces (:func:`pack_pieces`), every other array as given. The inverse of
    :func:`state_pieces`, bit for bit. A missing piece is a ``KeyError`` naming the slot and the leaf's path
    (nothing is built); shapes and dtypes are not checked here (the caller knows where they came from)."""
    if not isinstance(values, Mapping):
        raise TypeError(
            "values must be a mapping {(slot, leaf): array} (as built from state_pieces), "
            f"got {type(values).__name__}"
        )
    slots, treedef = _state_slots(like)
    layout = like.layout
    leaves = []
    for slot, g, array in slots:
        if g is None:
            keys = [(slot, None)]
        else:
            keys = [(slot, j) for j in layout.groups[g].indices]
        missing = [k for k in keys if k not in values]
        if missing:
            slot_, j = missing[0]
            where = "the whole state" if j is None else layout.paths[j]
            raise KeyError(f"no piece for slot {slot_!r} of {where} (leaf {j})")
        if g is None:
            leaves.append(values[keys[0]])
        else:
            leaves.append(pack_pieces(layout.groups[g], [values[k] for k in keys], array_namespace(array)))
    return optree.tree_unflatten(treedef, leaves)


def inputs(layout: Layout, params: Any, grads: Any, *, check: bool = True) -> tuple[list, list, Any]:
    """The leaves of ``params`` and ``grads`` and their namespace, checked against ``layout`` unless
    ``check=False`` (the caller checked them already)."""
    if check:
        return check_inputs(layout, params, grads)
    leaves = _backend.tree_leaves(params)
    return leaves, _backend.tree_leaves(grads), array_namespace(*leaves)


def check_inputs(layout: Layout, params: Any, grads: Any) -> tuple[list, list, Any]:
    """Tree structure, shapes, dtypes and devices of ``params`` and ``grads`` against ``layout``;
    returns their leaves and namespace. Raises ``ValueError``/``TypeError`` naming the leaf."""
    leaves, treedef = optree.tree_flatten(params)
    if not leaves:
        raise ValueError("params has no array leaves")
    # torch.compile's optree polyfill cannot compare tree specs; its guards re-trace on a new structure
    if not _backend.is_compiling() and treedef != layout.treedef:
        raise ValueError(
            f"params has tree structure {treedef}, but the optimizer state was initialised for {layout.treedef}; "
            "call opt.init(params, manifolds) for a new tree"
        )
    gleaves, gdef = optree.tree_flatten(grads)
    if not _backend.is_compiling() and gdef != treedef:
        raise ValueError(f"grads must have the tree structure of params {treedef}, got {gdef}")
    xp = array_namespace(*leaves, *gleaves)
    for p, g, path, shape in zip(leaves, gleaves, layout.paths, layout.shapes, strict=True):
        if tuple(p.shape) != shape:
            raise ValueError(f"{path} has shape {tuple(p.shape)}, but the optimizer state was initialised with {shape}")
        if tuple(g.shape) != tuple(p.shape):
            raise ValueError(f"grad of {path} has shape {tuple(g.shape)}, the parameter {tuple(p.shape)}")
        if g.dtype != p.dtype:
            raise TypeError(
                f"grad of {path} has dtype {_backend.dtype_name(g.dtype)}, the parameter {_backend.dtype_name(p.dtype)}"
            )
        if _backend.device(g) != _backend.device(p):
            raise ValueError(f"grad of {path} is on device {_backend.device(g)}, the parameter on {_backend.device(p)}")
    return leaves, gleaves, xp
