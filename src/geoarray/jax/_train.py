"""A jitted training step around geoarray's optimizers (or any optax transformation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ..optim import layout
from ._optax import GEOARRAY_OPTIMIZERS, apply_updates, bind_to_params
from ._trees import align_manifolds, check_like, flatten, signature, unflatten

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
    param_sharding: Any = None,
    donate: bool = False,
    state: Any = None,
) -> tuple[Callable[[Any, Any, Any], tuple[Any, Any, Any]], Any]:
    """``train_step, state = make_train_step(loss_fn, optimizer, params, manifolds)``.

    ``train_step(params, state, batch) -> (params, state, loss)`` is one jitted step:
    ``loss, grads = jax.value_and_grad(loss_fn)(params, batch)`` followed by the optimizer's update
    (Algorithm 1 of Brantner, *Generalizing Adam to Manifolds for Efficiently Training
    Transformers*: Riemannian gradient, lift to g^hor, cache update, retraction). ``state`` is the
    initial optimizer state, a pytree of arrays.

    The optimizer is initialised here, outside jit, because ``init`` validates the parameters
    (shapes, dtypes, that constrained weights lie on their manifolds, one host read each). The
    optimizer holds configuration only and the state carries the tree's layout, so the caller's
    optimizer object may serve other models too.

    Parameters
    ----------
    loss_fn
        ``loss_fn(params, batch) -> scalar`` (``(scalar, aux)`` with ``has_aux=True``; the step then
        returns ``(params, state, (loss, aux))``).
    optimizer
        A geoarray optimizer (``geoarray.optim.Adam(lr=...)``, ``ManifoldMuon``, ``Muon``, any
        :class:`~geoarray.optim.RiemannianOptimizer`, or ``geoarray.optim.partition({...}, labels)`` with ``labels`` a
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
    param_sharding
        With ``mesh``: shard the parameters instead of replicating them (FSDP-style) — a tree like
        ``params`` with a ``jax.sharding.PartitionSpec`` (or None: replicated) at every leaf, e.g.
        ``PartitionSpec("data")`` for a stack of frames ``(B, N, n)`` cut along ``B`` or a weight cut
        by rows. The optimizer state is sharded the way XLA's sharding propagation (GSPMD) carries the
        parameters' shardings through the update — found by compiling the update once, here — so a
        stack cut between its frames keeps each device's frames and their state on that device and
        the update gathers neither (tests/test_jax_fsdp.py reads the collectives from the compiled
        step's HLO: none returns the frames or their state; the forward pass, which contracts a batch
        and frames cut along the same axis, gathers whichever XLA finds cheaper — in that test the
        batch); a weight cut inside a matrix is
        all-gathered where the update needs it whole, by the collectives XLA inserts. Put ``params`` on the mesh with
        ``jax.device_put(params, {k: NamedSharding(mesh, spec), ...})``; the returned state is
        already there.
    state
        To resume: an optimizer state saved from an earlier step (e.g. restored from a checkpoint).
        It is checked against the state ``params`` would get (tree structure, shapes and dtypes;
        ``ValueError`` otherwise) and returned instead of a fresh one; the parameters are then not
        checked to lie on their manifold, since trained weights drift off it by rounding (float32:
        of the order of ``is_point``'s tolerance 1e-4 after 10⁴ steps).
    donate
        Donate ``params`` and ``state`` to the step (``jax.jit(donate_argnums=(0, 1))``): their
        buffers are reused, and the arrays passed in must not be used afterwards.
    """
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=has_aux)
    if isinstance(optimizer, GEOARRAY_OPTIMIZERS):
        flat, _, _ = flatten(params, "params")
        opt = bind_to_params(optimizer, params, flat)
        mans = align_manifolds(manifolds, params, flat)
        state = _initial_state(lambda f: opt.init(f, mans), flat, state, lambda f: _check_points(f, mans))
        built_for = signature(flat)

        def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any, Any]:
            # at trace time (shapes and dtypes are static): name the leaf, before jax.grad or the
            # core fail somewhere inside on a tree the step was not built for
            flat_p, paths, treedef = flatten(params, "params")
            check_like(flat_p, built_for, "params", "this train step")
            value, grads = value_and_grad(params, batch)
            flat_g, _, _ = flatten(grads, "grads")
            new, state = opt.update(flat_p, flat_g, state)
            return unflatten(treedef, paths, new), state, value

        def update_like(params: Any, state: Any) -> Any:  # the update alone, gradients like params
            flat_p = flatten(params, "params")[0]
            return opt.update(flat_p, flat_p, state)[1]

    elif callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None)):
        if manifolds is not None:
            raise ValueError(
                "manifolds is for geoarray optimizers; an optax transformation carries its own "
                "(geoarray.jax.optax_transform(manifolds, ...))"
            )
        tx = optimizer
        flat, _, _ = flatten(params, "params")  # the same checks and messages as the geoarray path
        state = _initial_state(tx.init, params, state)
        built_for = signature(flat)

        def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any, Any]:
            check_like(flatten(params, "params")[0], built_for, "params", "this train step")
            value, grads = value_and_grad(params, batch)
            updates, state = tx.update(grads, state, params)
            return apply_updates(params, updates, state), state, value

        def update_like(params: Any, state: Any) -> Any:
            return tx.update(params, state, params)[1]

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
        if param_sharding is not None:
            raise ValueError("param_sharding shards the parameters over a mesh: pass mesh=jax.sharding.Mesh(...) too")
        return jax.jit(step, donate_argnums=donate_argnums), _placed_like(state, params)
    from jax.sharding import NamedSharding, PartitionSpec

    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    axis = mesh.axis_names[0] if batch_axis is None else batch_axis
    if axis not in mesh.axis_names:
        raise ValueError(f"batch_axis must be one of the mesh's axes {mesh.axis_names}, got {batch_axis!r}")
    replicated = NamedSharding(mesh, PartitionSpec())
    split = NamedSharding(mesh, PartitionSpec(axis))
    if param_sharding is None:
        p_shardings, s_shardings = replicated, replicated
    else:
        p_shardings = _param_shardings(mesh, param_sharding, params)
        s_shardings = _state_shardings(update_like, params, state, p_shardings, replicated)
    state = jax.device_put(state, s_shardings)
    jitted = jax.jit(
        step,
        in_shardings=(p_shardings, s_shardings, split),
        out_shardings=(p_shardings, s_shardings, replicated),
        donate_argnums=donate_argnums,
    )
    return jitted, state


def _placed_like(state: Any, params: Any) -> Any:
    """``state`` committed to a device as ``params`` are, or not at all.

    JAX compiles a jitted function again when its arguments change from uncommitted (made by ``jnp``
    on the default device) to committed (placed with ``jax.device_put``, or the output of a call that
    had a committed argument). The core's ``init`` makes its arrays on the parameters' device, which
    commits them, so a first step with uncommitted parameters returned committed ones and the second
    step compiled the whole train step again (seconds). Uncommitted parameters get an uncommitted
    state (one copy through host memory, here, once); parameters committed to one device get their
    state there."""
    import numpy as np

    leaves = [leaf for leaf in jax.tree_util.tree_leaves(params) if isinstance(leaf, jax.Array)]
    committed = [leaf for leaf in leaves if leaf.committed]
    if not leaves or (committed and len(committed[0].sharding.device_set) != 1):
        return state
    if committed:
        return jax.device_put(state, committed[0].sharding)

    def uncommitted(a: Any) -> Any:
        return jax.numpy.asarray(np.asarray(a)) if isinstance(a, jax.Array) and a.committed else a

    return jax.tree_util.tree_map(uncommitted, state)


def _param_shardings(mesh: Any, specs: Any, params: Any) -> Any:
    """``NamedSharding`` s for ``params`` from a tree of PartitionSpecs (None: replicated)."""
    from jax.sharding import NamedSharding, PartitionSpec

    is_spec = lambda x: x is None or isinstance(x, PartitionSpec)  # noqa: E731
    try:
        return jax.tree_util.tree_map(
            lambda spec, _: NamedSharding(mesh, PartitionSpec() if spec is None else spec),
            specs,
            params,
            is_leaf=is_spec,
        )
    except (ValueError, TypeError) as exc:
        raise ValueError(
            "param_sharding must be a tree like params with a jax.sharding.PartitionSpec (or None) at every "
            f"leaf: {exc}"
        ) from None


def _state_shardings(update_like: Callable[[Any, Any], Any], params: Any, state: Any, p_shardings: Any,
                     replicated: Any) -> Any:  # fmt: skip
    """The optimizer state's shardings as XLA propagates the parameters' through one update (the
    update compiled once with abstract arguments, the gradients shaped and sharded like the
    parameters); leaves it leaves unsharded are replicated."""
    abstract = lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)  # noqa: E731
    p_abs = jax.tree_util.tree_map(abstract, params, p_shardings)
    s_abs = jax.tree_util.tree_map(lambda a: abstract(a, replicated), state)
    compiled = jax.jit(update_like, in_shardings=(p_shardings, replicated)).lower(p_abs, s_abs).compile()
    out = compiled.output_shardings
    from jax.sharding import NamedSharding

    mesh = replicated.mesh
    return jax.tree_util.tree_map(
        lambda sh: NamedSharding(mesh, sh.spec) if isinstance(sh, NamedSharding) else replicated,
        out,
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
    )


def _check_points(flat: Any, manifolds: Any) -> None:
    """The optimizers' check of their initial points (:func:`geoarray.optim.layout.check_points`), with
    the paths and messages of their ``init``."""
    leaves, _, paths = layout.flatten_params(flat)
    layout.check_points(leaves, layout.flatten_manifolds(manifolds, flat, len(leaves)), paths)


def _initial_state(
    init: Callable[[Any], Any], params: Any, given: Any, check: Callable[[Any], None] | None = None
) -> Any:
    """``init(params)``, or ``given`` (a resumed state) checked against what ``init`` would return.

    ``init`` runs compiled (``jax.jit``): eagerly, each of its operations — the Householder QR of the
    sections, the packing of the leaves — is compiled on its own, once per shape, which took most of the
    set-up of a small model (~60 compilations, 4.5 s for the two steps of ``examples/jax_sharded.py``).
    Traced, ``init`` cannot read values, so ``check(params)`` first does the one host read per leaf
    that it skips: whether each constrained leaf is a point of its manifold. Without ``check`` (an optax
    transformation, whose ``init`` may hold such checks of its own) ``init`` runs eagerly.

    For a given state, ``init`` is only traced (``jax.eval_shape``): it computes nothing and cannot
    read values, so trained weights are not held to ``is_point``'s tolerance for initial weights;
    the given state must have the structure (layout included) of the one it would return.
    """
    if given is None:
        if check is None:
            return init(params)
        lowered = jax.jit(init).lower(params)  # traced: init's checks of shapes and dtypes raise here
        check(params)
        return lowered.compile()(params)
    like = jax.eval_shape(init, params)
    want, got = jax.tree_util.tree_structure(like), jax.tree_util.tree_structure(given)
    # jaxlib's PyTreeDef is unresolved to mypy (jaxlib.* is ignore_missing_imports), so != looks unsupported
    if want != got:  # type: ignore[operator]
        raise ValueError(
            f"state does not have the structure of this optimizer's state for params:\n  {got}\nexpected\n  {want}"
        )
    for k, (a, b) in enumerate(zip(jax.tree_util.tree_leaves(like), jax.tree_util.tree_leaves(given), strict=True)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            raise ValueError(
                f"state leaf {k} is {tuple(b.shape)} {b.dtype}, this optimizer's state for params has "
                f"{tuple(a.shape)} {a.dtype}"
            )
    return jax.tree_util.tree_map(jax.numpy.asarray, given)
