"""JAX pytrees (equinox modules, flax ``nnx.State``, flax linen dicts, plain dicts/tuples) as the core sees them.

The core optimizer flattens trees with optree, which knows dicts, lists, tuples and NamedTuples
but not the classes JAX libraries register with ``jax.tree_util`` (``eqx.Module``, ``nnx.State``,
``nnx.Variable``). Here every JAX pytree is flattened with ``jax.tree_util`` into a flat dict keyed
by a readable path (``"blocks/0/attn/kernel"``) and rebuilt afterwards, so the core works on any
of them and its error messages name the parameter by that path.

Manifold trees are matched to parameter trees **by path**, not by tree structure, so that
* the ``None`` placeholders of ``eqx.filter``/``eqx.partition`` (non-array fields) are ignored,
* a manifolds tree built on an ``nnx.State`` of ``Variable`` objects fits the plain-array state
  that ``nnx.Optimizer`` passes to optax (a trailing ``.value`` attribute is not part of the path).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax

from .. import _backend
from ..manifolds import Grassmann, Stiefel, SymplecticStiefel
from ..manifolds.base import Manifold
from ..optim.layout import is_manifold_leaf
from ..optim.partition import _arity

__all__ = ["init_on_manifolds", "manifolds_like", "path_str"]

_ROOT = "(root)"
_BY_NAME: dict[str, type[Manifold]] = {
    "stiefel": Stiefel,
    "grassmann": Grassmann,
    "symplectic_stiefel": SymplecticStiefel,
}


def path_str(path: tuple) -> str:
    """A ``jax.tree_util`` key path as ``"a/0/b"``: dict keys, sequence indices and attribute names
    joined by ``/``. A final ``.value`` attribute (flax ``nnx.Variable``'s payload) is dropped, so a
    state of Variables and its plain-array form have the same paths."""
    parts = []
    last = len(path) - 1
    for i, k in enumerate(path):
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            if k.name == "value" and i == last and i > 0:
                continue
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:  # a key type of some other library
            parts.append(str(k))
    return "/".join(parts) if parts else _ROOT


def _is_jax_array(x: Any) -> bool:
    return isinstance(x, jax.Array)  # tracers included


def _key_tuple(path: tuple) -> tuple:
    """A ``jax.tree_util`` key path as the tuple of its keys, ``('blocks', 0, 'W')``, as
    :func:`geoarray.optim.partition` hands a ``labels(path, leaf)`` function."""
    out: list[Any] = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out.append(k.key)
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(k.idx)
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
        else:  # FlattenedIndexKey
            out.append(getattr(k, "key", k))
    return tuple(out)


def _is_function(x: Any) -> bool:
    """A callable that is not itself a tree (an equinox module is callable, and a tree of manifolds)."""
    if not callable(x) or isinstance(x, Manifold):
        return False
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x, is_leaf=is_manifold_leaf))


def flatten(tree: Any, name: str) -> tuple[dict[str, Any], list[str], Any]:
    """``tree`` as ``({path: leaf}, paths in tree order, treedef)``; every leaf must be a JAX array."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if not pairs:
        raise ValueError(f"{name} has no array leaves (got {type(tree).__name__})")
    flat: dict[str, Any] = {}
    for path, leaf in pairs:
        key = path_str(path)
        if key in flat:
            raise ValueError(f"{name}: two leaves have the path {key!r}; rename one (keys are joined with '/')")
        if not _is_jax_array(leaf):
            raise TypeError(
                f"{name}[{key!r}] is a {type(leaf).__name__}, not a JAX array: geoarray.jax needs JAX arrays; "
                "keep only the trainable arrays (eqx.partition(model, eqx.is_inexact_array), nnx.split(model, "
                "nnx.Param, ...), or jax.numpy.asarray for NumPy arrays)"
            )
        flat[key] = leaf
    return flat, list(flat), treedef


def unflatten(treedef: Any, paths: list[str], flat: Mapping[str, Any]) -> Any:
    return jax.tree_util.tree_unflatten(treedef, [flat[p] for p in paths])


def signature(flat: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """``{path: (shape, dtype)}`` of a flattened tree: what a state built for it depends on."""
    return {k: (tuple(v.shape), v.dtype) for k, v in flat.items()}


def _listed(keys: list[str]) -> str:
    return f"{keys[:5]}{' …' if len(keys) > 5 else ''}"


def check_like(flat: Mapping[str, Any], expected: Mapping[str, tuple], name: str, what: str) -> None:
    """Raise naming the leaf unless ``flat`` has the paths, shapes and dtypes of ``expected``.

    ``ValueError`` for missing or unexpected paths and for shapes, ``TypeError`` for dtypes, e.g.
    ``params['Y'] has dtype float32, but the optimizer state was built for float64`` (``what`` =
    "the optimizer state"). Static information only (shapes and dtypes): free under ``jax.jit``.
    """
    missing = [k for k in expected if k not in flat]
    extra = [k for k in flat if k not in expected]
    if missing or extra:
        raise ValueError(
            f"{name} is not the tree {what} was built for: missing {_listed(missing)}, unexpected {_listed(extra)}"
        )
    for k, (shape, dtype) in expected.items():
        leaf = flat[k]
        if tuple(leaf.shape) != tuple(shape):
            raise ValueError(f"{name}[{k!r}] has shape {tuple(leaf.shape)}, but {what} was built for {tuple(shape)}")
        if leaf.dtype != dtype:
            raise TypeError(
                f"{name}[{k!r}] has dtype {_backend.dtype_name(leaf.dtype)}, but {what} was built for "
                f"{_backend.dtype_name(dtype)}"
            )


def align_labels(labels: Any, params: Any, flat_params: Mapping[str, Any]) -> dict[str, Any]:
    """The label of every parameter path, for :func:`geoarray.optim.partition` run on the path-keyed dict.

    ``labels`` is a tree like ``params`` holding the keys of the partition's optimizers (or a
    callable ``params -> tree``, as optax's ``multi_transform`` accepts); it is re-keyed by path so
    that the partition sees the same ``{path: leaf}`` dict as every geoarray optimizer here.
    """
    if _is_function(labels) and _arity(labels) == 2:  # labels(path, leaf) -> key, the path as a tuple of keys
        labels = jax.tree_util.tree_map_with_path(lambda path, leaf: labels(_key_tuple(path), leaf), params)
    elif _is_function(labels):
        labels = labels(params)
    pairs, _ = jax.tree_util.tree_flatten_with_path(labels)
    found = {path_str(path): label for path, label in pairs}
    missing = [p for p in flat_params if p not in found]
    if missing:
        raise ValueError(
            f"partition labels have no entry for the parameter(s) {missing[:5]}{' …' if len(missing) > 5 else ''}; "
            "give labels the tree structure of params"
        )
    return {p: found[p] for p in flat_params}


def align_manifolds(manifolds: Any, params: Any, flat_params: Mapping[str, Any]) -> dict[str, Manifold | None]:
    """The manifold of every parameter path (None: Euclidean), checked against the parameters.

    ``manifolds`` is a tree with a Manifold or None at (at least) the path of every parameter, a
    single Manifold when ``params`` is one array, a callable ``params -> tree``, or None (all
    Euclidean). Entries at paths without a parameter must be None (e.g. the static fields of an
    equinox module); a Manifold there means the trees do not fit and raises ``ValueError``. A
    parameter in float16/bfloat16 is stepped in float32 by the optimizer and cast back.
    """
    if manifolds is None:
        return dict.fromkeys(flat_params)
    if _is_function(manifolds):
        manifolds = manifolds(params)
    pairs, _ = jax.tree_util.tree_flatten_with_path(manifolds, is_leaf=is_manifold_leaf)
    found: dict[str, Any] = {}
    for path, m in pairs:
        key = path_str(path)
        if not is_manifold_leaf(m):
            raise TypeError(f"manifolds[{key!r}] must be a Manifold or None, got {type(m).__name__}")
        if key in found:
            if m is not None and found[key] is not None:
                raise ValueError(f"manifolds: two entries have the path {key!r}")
            if m is None:
                continue
        found[key] = m
    missing = [p for p in flat_params if p not in found]
    if missing:
        raise ValueError(
            f"manifolds has no entry for the parameter(s) {missing[:5]}{' …' if len(missing) > 5 else ''}; "
            "give a Manifold or None for every parameter (geoarray.jax.manifolds_like(params, rule) builds the tree)"
        )
    stray = [p for p, m in found.items() if m is not None and p not in flat_params]
    if stray:
        raise ValueError(
            f"manifolds names a manifold at {stray[:5]}, where params has no array; the manifolds tree does not fit "
            f"the parameters (parameter paths: {list(flat_params)[:8]}{' …' if len(flat_params) > 8 else ''})"
        )
    out = {p: found[p] for p in flat_params}
    return out


def _manifold_for(spec: Any, leaf: Any, key: str) -> Manifold | None:
    if spec is None or isinstance(spec, Manifold):
        M = spec
    else:
        cls = _BY_NAME.get(spec.lower()) if isinstance(spec, str) else spec
        if not (isinstance(cls, type) and issubclass(cls, Manifold)):
            raise TypeError(
                f"rule for {key!r} gave {spec!r}; expected a Manifold, None, a manifold class or one of "
                f"{sorted(_BY_NAME)}"
            )
        if len(leaf.shape) < 2:
            raise ValueError(f"{key!r} has shape {tuple(leaf.shape)}; {cls.__name__} needs a matrix (..., N, n)")
        try:
            M = cls(*leaf.shape[-2:])
        except ValueError as exc:
            raise ValueError(
                f"{key!r} of shape {tuple(leaf.shape)} cannot be a point of {cls.__name__}: {exc} "
                "(store the weight as (..., N, n) with N ≥ n, e.g. transposed)"
            ) from None
    if M is not None and M.point_shape is not None:
        k = len(M.point_shape)
        if tuple(leaf.shape[-k:]) != tuple(M.point_shape):
            raise ValueError(
                f"{key!r} has shape {tuple(leaf.shape)}, which does not end in {M.point_shape} as {M!r} needs"
            )
    return M


def manifolds_like(tree: Any, rule: Any) -> Any:
    """A tree shaped like ``tree`` with a Manifold or None at every leaf, for the optimizer's ``manifolds``.

    ``tree`` is any JAX pytree: a parameter dict, flax linen ``variables["params"]``, an
    ``nnx.State``, an equinox module (non-array leaves get None). ``rule`` decides per floating-point
    array leaf, given its path (``"blocks/0/attn/kernel"``, see :func:`path_str`):

    * a mapping ``{regex: spec}``: the first pattern that ``re.search``-es the path wins (none: None);
    * a callable ``rule(path, leaf) -> spec``.

    A spec is a Manifold instance, None (Euclidean), a manifold class (``geoarray.Stiefel``) or a name
    (``"stiefel"``, ``"grassmann"``, ``"symplectic_stiefel"``), the last two built from the leaf's
    trailing shape (N, n) — leading axes are a batch of points. A leaf whose shape does not fit its
    manifold raises ``ValueError`` naming the path.
    """
    if isinstance(rule, Mapping):
        compiled = [(re.compile(p), s) for p, s in rule.items()]

        def decide(key: str, leaf: Any) -> Any:
            return next((s for pat, s in compiled if pat.search(key)), None)
    elif callable(rule):
        decide = rule
    else:
        raise TypeError(f"rule must be a mapping {{regex: manifold}} or a callable (path, leaf), got {rule!r}")

    def manifold_of(path: tuple, leaf: Any) -> Manifold | None:
        if not (_is_jax_array(leaf) and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating)):
            return None
        key = path_str(path)
        return _manifold_for(decide(key, leaf), leaf, key)

    return jax.tree_util.tree_map_with_path(manifold_of, tree)


def init_on_manifolds(params: Any, manifolds: Any, seed: Any = 0) -> Any:
    """``params`` with every constrained leaf replaced by a random point of its manifold.

    Framework initialisers (flax's lecun-normal kernels, equinox's uniform weights) do not produce
    points of the Stiefel manifold, and the optimizer refuses to start off the manifold. Each
    constrained leaf becomes ``M.random(...)`` (Haar-distributed for Stiefel, Algorithm 3 of
    Brantner's paper) with the leaf's batch shape, dtype and sharding; the other leaves are
    returned as they are. ``seed`` is an int or ``numpy.random.SeedSequence``; leaf i draws from its
    i-th child seed (in path order), so the result does not depend on which leaves are constrained
    elsewhere in the tree.
    """
    import jax.numpy as jnp

    from .. import random as _random

    flat, paths, treedef = flatten(params, "params")
    mans = align_manifolds(manifolds, params, flat)
    seeds = _random.spawn(seed, len(paths))
    out = {}
    for s, key in zip(seeds, paths, strict=True):
        leaf, M = flat[key], mans[key]
        if M is None or M.point_shape is None:
            out[key] = leaf
            continue
        k = len(M.point_shape)
        if tuple(leaf.shape[-k:]) != tuple(M.point_shape):
            raise ValueError(f"params[{key!r}] has shape {tuple(leaf.shape)}, which does not end in {M.point_shape}")
        point = M.random(s, xp=jnp, batch_shape=tuple(leaf.shape[:-k]), dtype=leaf.dtype)
        out[key] = jax.device_put(point, leaf.sharding) if not _backend.is_traced(leaf) else point
    return unflatten(treedef, paths, out)
