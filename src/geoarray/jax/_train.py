"""A jitted training step around geoarray's optimizers (or any optax transformation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ._optax import GEOARRAY_OPTIMIZERS, apply_updates, bind_to_params
from ._trees import align_manifolds, flatten, unflatten

__all__ = ["make_train_step"]


def make_train_step(
    loss_fn: Callable[[Any, Any], Any],
    optimizer: Any,
    params: Any,
    manifolds: Any = None,
    *,
    has_aux: bool = False,
    mesh: Any = None,
    batch_axis: str | None = None,
    donate: bool = False,
) -> tuple[Callable[[Any, Any, Any], tuple[Any, Any, Any]], Any]:
    """``train_step, state = make_train_step(loss_fn, optimizer, params, manifolds)``.

    ``train_step(params, state, batch) -> (params, state, loss)`` is one jitted step:
    ``loss, grads = jax.value_and_grad(loss_fn)(params, batch)`` followed by the optimizer's update
    (Algorithm 1 of Brantner, *Generalizing Adam to Manifolds for Efficiently Training
    Transformers*: Riemannian gradient, lift to g^hor, cache update, retraction). ``state`` is the
    initial optimizer state, a pytree of arrays.

    The optimizer is initialised here, outside jit, because ``init`` validates the parameters
    (shapes, dtypes, that constrained weights lie on their manifolds, one host read each) and
    records the tree's layout. The step uses a private copy of ``optimizer``, so initialising the
    caller's object again for another model cannot change a step already built.

    Parameters
    ----------
    loss_fn
        ``loss_fn(params, batch) -> scalar`` (``(scalar, aux)`` with ``has_aux=True``; the step then
        returns ``(params, state, (loss, aux))``).
    optimizer
        A geoarray optimizer (``geoarray.optim.Adam(lr=...)``, ``ManifoldMuon``, ``Muon``, any
        :class:`RiemannianOptimizer`, or ``geoarray.optim.partition({...}, labels)`` with ``labels`` a
        tree like ``params``), constrained by ``manifolds``; or an optax transformation (e.g. from
        :func:`~geoarray.jax.optax_transform`, alone or in ``optax.chain``), initialised with
        ``optimizer.init(params)`` and applied with :func:`~geoarray.jax.apply_updates` (exact on
        geoarray's points); ``manifolds`` must then be None.
    params
        Any JAX pytree of floating-point arrays: a dict, flax linen ``variables["params"]``, an
        ``nnx.State``, the array part of an equinox module (``eqx.partition(model,
        eqx.is_inexact_array)[0]``).
    manifolds
        A Manifold or None at the path of every parameter (:func:`~geoarray.jax.manifolds_like`),
        a callable ``params -> tree``, or None (all Euclidean).
    mesh, batch_axis
        Data parallelism: with a ``jax.sharding.Mesh``, parameters and optimizer state are
        replicated over the mesh and the batch's leading axis is split along ``batch_axis`` (default
        the mesh's first axis); XLA inserts the all-reduce of the gradients. The returned state is
        already replicated; put ``params`` there with ``jax.device_put(params,
        NamedSharding(mesh, PartitionSpec()))``. Every device then computes the same update from the
        same reduced gradient (the default Householder section is deterministic), so replicas never
        diverge.
    donate
        Donate ``params`` and ``state`` to the step (``jax.jit(donate_argnums=(0, 1))``): their
        buffers are reused, and the arrays passed in must not be used afterwards.
    """
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=has_aux)
    if isinstance(optimizer, GEOARRAY_OPTIMIZERS):
        flat, _, _ = flatten(params, "params")
        opt = bind_to_params(optimizer, params, flat)
        state = opt.init(flat, align_manifolds(manifolds, params, flat))

        def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any, Any]:
            value, grads = value_and_grad(params, batch)
            flat_p, paths, treedef = flatten(params, "params")
            flat_g, _, _ = flatten(grads, "grads")
            new, state = opt.update(flat_p, flat_g, state)
            return unflatten(treedef, paths, new), state, value

    elif callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None)):
        if manifolds is not None:
            raise ValueError(
                "manifolds is for geoarray optimizers; an optax transformation carries its own "
                "(geoarray.jax.optax_transform(manifolds, ...))"
            )
        tx = optimizer
        flatten(params, "params")  # the same checks and messages as the geoarray path
        state = tx.init(params)

        def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any, Any]:
            value, grads = value_and_grad(params, batch)
            updates, state = tx.update(grads, state, params)
            return apply_updates(params, updates, state), state, value

    else:
        raise TypeError(
            "optimizer must be a geoarray optimizer (geoarray.optim.Adam(...)) or an optax transformation "
            f"(init, update), got {type(optimizer).__name__}"
        )

    donate_argnums = (0, 1) if donate else ()
    if donate:
        # states may hold one buffer in two places (e.g. Adam's two zero moments), and XLA refuses to
        # take a buffer donated twice: give every leaf its own
        state = jax.tree_util.tree_map(lambda a: jax.numpy.array(a, copy=True), state)
    if mesh is None:
        return jax.jit(step, donate_argnums=donate_argnums), state
    from jax.sharding import NamedSharding, PartitionSpec

    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    axis = mesh.axis_names[0] if batch_axis is None else batch_axis
    if axis not in mesh.axis_names:
        raise ValueError(f"batch_axis must be one of the mesh's axes {mesh.axis_names}, got {batch_axis!r}")
    replicated = NamedSharding(mesh, PartitionSpec())
    split = NamedSharding(mesh, PartitionSpec(axis))
    state = jax.device_put(state, replicated)
    jitted = jax.jit(
        step,
        in_shardings=(replicated, replicated, split),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=donate_argnums,
    )
    return jitted, state
