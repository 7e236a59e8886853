"""geoarray inside JAX: jitted training steps, an optax entry point, equinox/flax parameter trees, sharding.

geoarray's optimizers are already pure functions of pytrees (``jax.jit(opt.update)`` compiles);
this module embeds them the way JAX code is written::

    import geoarray as ga, geoarray.jax as gj

    train_step, state = gj.make_train_step(loss_fn, ga.optim.Adam(lr=1e-3), params, manifolds)
    params, state, loss = train_step(params, state, batch)          # jitted

    tx = optax.chain(optax.clip_by_global_norm(1.0), gj.optax_transform(manifolds, "adam", lr=1e-3))
    updates, opt_state = tx.update(grads, opt_state, params)
    params = gj.apply_updates(params, updates, opt_state)            # exactly on the manifold

* :func:`make_train_step` — the jitted step (``value_and_grad`` + update), optionally data-parallel
  over a ``jax.sharding.Mesh``.
* :func:`optax_transform` / :func:`apply_updates` — an ``optax.GradientTransformation`` (optax is an
  optional dependency) and the exact way to apply its updates.
* :func:`manifolds_like`, :func:`init_on_manifolds`, :func:`path_str` — manifold trees for any JAX
  pytree by path rules: flax linen ``params`` dicts, flax ``nnx.State`` (``nnx.split(model,
  nnx.Param, ...)``, or the plain-array state that ``nnx.Optimizer`` hands to optax), equinox
  modules (``eqx.partition(model, eqx.is_inexact_array)``). Parameters are matched to manifolds by
  path (``"blocks/0/attn/kernel"``), and errors name the parameter by that path.

Importing ``geoarray`` does not import JAX; ``geoarray.jax`` does (it is reached lazily).
"""

from __future__ import annotations

try:
    import jax as _jax  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "jax":  # a broken install (a dependency of jax missing) says so itself
        raise
    from .._install import install_hint

    # a ModuleNotFoundError naming jax, as the one replaced: code that tells a missing dependency from a
    # bug by the exception's name (docs/_ext/public_api.py) keeps working
    raise ModuleNotFoundError(f"geoarray.jax needs JAX: {install_hint('jax')}", name="jax") from None

from .._backend import ensure_static_nodes as _ensure_static_nodes
from ._optax import RiemannianOptaxState, apply_updates, optax_transform
from ._train import make_train_step
from ._trees import init_on_manifolds, manifolds_like, path_str

__all__ = [
    "RiemannianOptaxState",
    "apply_updates",
    "init_on_manifolds",
    "make_train_step",
    "manifolds_like",
    "optax_transform",
    "path_str",
]

_ensure_static_nodes()  # optimizer states carry static layout nodes: register them with jax.tree_util
