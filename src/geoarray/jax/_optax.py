"""geoarray's Riemannian optimizers as an optax ``GradientTransformation``.

optax's protocol adds updates to parameters: ``params = optax.apply_updates(params, updates)``,
i.e. ``p + u`` leaf by leaf. A Riemannian step does not add: it retracts, Y' = λ(Y)·exp(W)·E
(Brantner, *Generalizing Adam to Manifolds for Efficiently Training Transformers*, Algorithm 1).
:func:`optax_transform` returns ``u = Y' − Y``, so that ``Y + u`` is Y' up to the rounding of one
subtraction and one addition (a few units in the last place of Y'; measured below), and keeps Y'
in its state, so that :func:`apply_updates` can return Y' exactly.

This rounding is of the size of the core's own: the retraction keeps Y on the manifold to
working precision per step, and in both cases |YᵀY − I| drifts slowly as rounding accumulates over
steps. Measured (``Adam(lr=1e-2)`` on Stiefel(8, 3), loss −tr(YᵀCY), one ``lax.scan``; max |YᵀY − I|
over the first 100 / 1000 / 10000 steps):

=========  ===============================  ===============================
dtype      ``optax.apply_updates``          :func:`apply_updates` (= core)
=========  ===============================  ===============================
float64    1.6e-15 / 6.4e-15 / 1.6e-14      1.6e-15 / 6.4e-15 / 1.6e-14
float32    8.3e-7 / 1.3e-5 / 1.9e-4         1.4e-6 / 2.0e-6 / 1.2e-4
=========  ===============================  ===============================

In float64 the run with ``optax.apply_updates`` ended bit for bit on the exact run's point after
1000 steps (when Y and Y' are within a factor 2 of each other, Y' − Y is exact by Sterbenz's lemma
and so is Y + (Y' − Y)); in float32 the trajectories part after a few
hundred steps and the drift is of the same order. ``tests/test_jax_optax.py`` checks the bounds.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..optim import (
    BFGS,
    OPTIMIZER_TYPES,
    Adam,
    AdamWithDecay,
    Gradient,
    InjectedOptimizer,
    ManifoldMuon,
    Momentum,
    Muon,
    PartitionedOptimizer,
    RiemannianOptimizer,
    riemannian,
)
from ._trees import align_labels, align_manifolds, check_like, flatten, signature, unflatten

__all__ = ["RiemannianOptaxState", "apply_updates", "optax_transform"]

_METHODS = {
    "gradient": Gradient,
    "sgd": Gradient,
    "momentum": Momentum,
    "adam": Adam,
    "adam_with_decay": AdamWithDecay,
    "bfgs": BFGS,
    "muon": Muon,
    "manifold_muon": ManifoldMuon,
}

#: what the adapters take as a geoarray optimizer (``init(params, manifolds)``, ``update(params, grads, state)``):
#: the optimizer classes, and an optimizer whose rate is in its state (:func:`geoarray.optim.inject_hyperparams`)
GEOARRAY_OPTIMIZERS = (*OPTIMIZER_TYPES, InjectedOptimizer)


class RiemannianOptaxState(NamedTuple):
    """The state of :func:`optax_transform`: arrays only (a pytree).

    ``inner`` is the core :class:`~geoarray.optim.RiemannianState` (over the parameters flattened
    to a dict keyed by path); ``points`` holds the parameters the last update moved to, keyed by
    path, for :func:`apply_updates` (zeros before the first update).
    """

    inner: Any
    points: dict


def build_optimizer(
    method: Any, kwargs: dict
) -> RiemannianOptimizer | ManifoldMuon | PartitionedOptimizer | InjectedOptimizer:
    """A private :class:`RiemannianOptimizer` from a method name, an optimizer or a transform."""
    if isinstance(method, str):
        cls = _METHODS.get(method.lower())
        if cls is None:
            raise ValueError(f"method must be one of {sorted(_METHODS)}, an optimizer or a transform, got {method!r}")
        return cls(**kwargs)
    if isinstance(method, GEOARRAY_OPTIMIZERS):
        if kwargs:
            raise TypeError(
                f"options {sorted(kwargs)} go to the optimizer's constructor, not with an optimizer instance"
            )
        return method  # configuration only (its state carries the layout); a partition's labels are
        # re-keyed to the parameters' paths by bind_to_params
    if callable(getattr(method, "init", None)) and callable(getattr(method, "update", None)):
        return riemannian(method, **kwargs)
    raise TypeError(
        "method_or_transform must be a method name, a geoarray optimizer or a gradient transformation "
        f"(init, update), got {type(method).__name__}"
    )


def bind_to_params(opt: Any, params: Any, flat: dict) -> Any:
    """The geoarray optimizer ``opt`` for the path-keyed dict ``flat`` of ``params``.

    The adapters hand optimizers ``{path: leaf}`` instead of the user's tree, so a
    :func:`~geoarray.optim.partition`'s labels (a tree like ``params``) are re-keyed by path; any
    other optimizer is returned as it is (it holds configuration only).
    """
    if isinstance(opt, PartitionedOptimizer):
        return PartitionedOptimizer(opt.optimizers, align_labels(opt.labels, params, flat))
    return opt


def optax_transform(manifolds: Any, method_or_transform: Any = "adam", **options: Any) -> Any:
    """An ``optax.GradientTransformation`` performing geoarray's Riemannian update (Algorithm 1).

    ``tx = geoarray.jax.optax_transform(manifolds, "adam", lr=1e-3)``; then ``state = tx.init(params)``,
    ``updates, state = tx.update(grads, state, params)`` and ``params = optax.apply_updates(params,
    updates)`` (Y' up to rounding, see the module docstring) or ``geoarray.jax.apply_updates(params,
    updates, state)`` (Y' exactly).

    Parameters
    ----------
    manifolds
        A tree with a Manifold or None (Euclidean) at the path of every parameter
        (:func:`~geoarray.jax.manifolds_like` builds one), or a callable ``params -> tree``
        evaluated at ``init`` (handy when optax sees a transformed tree, e.g. ``nnx.Optimizer``).
    method_or_transform
        ``"gradient"``, ``"momentum"``, ``"adam"``, ``"adam_with_decay"``, ``"bfgs"``, ``"muon"`` or
        ``"manifold_muon"`` (the geoarray class of that name — :class:`~geoarray.optim.Muon`,
        :class:`~geoarray.optim.ManifoldMuon` for the last two — built with ``**options``, e.g.
        ``lr=``, ``section=``); a geoarray optimizer instance (copied), including
        ``geoarray.optim.partition({...}, labels)`` with ``labels`` a tree like the parameters; or a
        vector-space gradient transformation — geoarray's (``geoarray.optim.chain(...)``) or optax's
        (``optax.adam(1e-3)``) — run on the lifted
        gradients in g^hor by :func:`geoarray.optim.riemannian` with ``**options``.

    Limits
    ------
    * ``update`` needs ``params`` (it retracts from them): ``tx.update(grads, state, params)``.
    * It must be the **last** transformation of a chain: a transformation after it changes the
      updates, and ``params + updates`` leaves the manifold. Transformations *before* it act on
      Euclidean gradients: ``optax.clip_by_global_norm(c)`` clips ‖∇L‖ (Frobenius, over all leaves),
      not the Riemannian gradient lifted to g^hor as ``geoarray.optim.clip_by_global_norm`` inside
      the chain does (there the norm is the metric of g^hor, ½‖A‖² + ‖B‖² per Stiefel weight).
    * Wrappers that replace updates (``optax.apply_if_finite`` skipping a step, ``optax.MultiSteps``
      returning zeros between accumulations) keep points on the manifold (zero updates). Wrappers that
      scale or average the updates themselves (``optax.inject_hyperparams`` of the learning rate is
      not supported; give ``lr`` a schedule instead) do not.
    * ``init`` and ``update`` behave as pure functions: one transformation may serve several
      parameter trees, and ``update`` accepts a state from ``jax.jit(tx.init)``,
      ``jax.eval_shape(tx.init, ...)`` + a restored checkpoint, or another ``optax_transform`` with
      the same options: the geoarray optimizer underneath holds configuration only, and its state
      carries the tree's layout (paths, shapes, groups, manifolds) as a static pytree node.
    * Whether constrained weights lie on their manifold is checked by an eager ``init`` only (one
      host read per weight). A traced ``init`` (``jax.jit``, ``jax.eval_shape``, ``jax.vmap``), and
      ``update`` with a state this object did not initialise (restored weights may have drifted off
      the manifold by rounding), check shapes and dtypes only.
    * Parameters whose shapes or dtypes differ from those ``state`` was built for (e.g. float32
      weights with a float64 state), and gradients missing a leaf, raise naming the leaf;
      a gradient of another dtype or shape than its parameter too (``TypeError``/``ValueError``,
      before any state is returned).
    * The state carries one copy of the parameters (``points``) for :func:`apply_updates`.
    """
    try:
        import optax
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "geoarray.jax.optax_transform returns an optax.GradientTransformation: pip install optax"
        ) from exc
    proto = build_optimizer(method_or_transform, options)

    def init(params: Any) -> RiemannianOptaxState:
        flat, _, _ = flatten(params, "params")
        opt = bind_to_params(proto, params, flat)
        # validates the parameters (eagerly: also that points are on their manifold)
        inner = opt.init(flat, align_manifolds(manifolds, params, flat))
        return RiemannianOptaxState(inner, {k: jnp.zeros_like(v) for k, v in flat.items()})

    def update(grads: Any, state: RiemannianOptaxState, params: Any = None) -> tuple[Any, RiemannianOptaxState]:
        if params is None:
            raise ValueError(
                "geoarray.jax.optax_transform retracts from the parameters: call tx.update(grads, state, params)"
            )
        if not isinstance(state, RiemannianOptaxState):
            raise TypeError(f"state must be the RiemannianOptaxState from tx.init, got {type(state).__name__}")
        flat_p, paths, treedef = flatten(params, "params")
        flat_g, _, _ = flatten(grads, "grads")
        # the state's points have the shape and dtype of the parameters it was built for
        check_like(flat_p, signature(state.points), "params", "the optimizer state")
        if list(flat_g) != paths:
            missing, extra = [k for k in paths if k not in flat_g], [k for k in flat_g if k not in flat_p]
            raise ValueError(f"grads must have the leaves of params: missing {missing[:5]}, unexpected {extra[:5]}")
        # the layout is the state's: a state from another transformation object, a checkpoint or a
        # traced init needs nothing from this object but its configuration
        new, inner = bind_to_params(proto, params, flat_p).update(flat_p, flat_g, state.inner)
        updates = {k: new[k] - flat_p[k] for k in paths}
        return unflatten(treedef, paths, updates), RiemannianOptaxState(inner, new)

    tx = optax.GradientTransformation(init, update)
    return tx


def _states(tree: Any) -> list[RiemannianOptaxState]:
    is_state = lambda x: isinstance(x, RiemannianOptaxState)  # noqa: E731
    return [x for x in jax.tree_util.tree_leaves(tree, is_leaf=is_state) if is_state(x)]


def apply_updates(params: Any, updates: Any, state: Any) -> Any:
    """``optax.apply_updates`` that lands exactly on the points of :func:`optax_transform`'s last update.

    ``state`` is the optimizer state returned together with ``updates`` (the transformation's own
    state or any optax state containing it, e.g. of ``optax.chain``). Where ``updates`` is exactly
    what the transformation returned (u = Y' − Y), the result is Y' bit for bit; elsewhere — leaves
    no :func:`optax_transform` updates, or updates changed afterwards — it is ``p + u`` cast to the
    parameter's dtype, as ``optax.apply_updates``. Jittable (an elementwise select, no host read).
    """
    points: dict[str, Any] = {}
    for s in _states(state):
        for k, v in s.points.items():
            if k in points:
                raise ValueError(f"two geoarray optax transformations in state update the parameter {k!r}")
            points[k] = v
    flat_p, paths, treedef = flatten(params, "params")
    flat_u, upaths, _ = flatten(updates, "updates")
    if upaths != paths:
        raise ValueError(f"updates must have the parameter paths {paths[:8]}, got {upaths[:8]}")
    out = {}
    for k in paths:
        p, u = flat_p[k], flat_u[k]
        added = jnp.asarray(p + u).astype(p.dtype)
        y = points.get(k)
        if y is None or y.shape != p.shape or y.dtype != p.dtype:
            out[k] = added
        else:
            out[k] = jnp.where(u == y - p, y, added)
    return unflatten(treedef, paths, out)
