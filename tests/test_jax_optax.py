"""geoarray.jax.optax_transform: an optax GradientTransformation whose updates land on the manifold."""

from __future__ import annotations

import numpy as np
import pytest

import geoarray as ga
from _jax_common import problem, require_jax


@pytest.fixture(autouse=True)
def _jax_only(backend):
    require_jax(backend)


optax = pytest.importorskip("optax", reason="optax is not installed (pip install optax); geoarray.jax tests need it")


def test_updates_land_on_the_manifold_and_apply_updates_is_exact():
    """One step: ``gj.apply_updates`` returns the retracted point bit for bit; ``optax.apply_updates`` (Y + (Y'−Y))
    is within 4 ulp of it; both are points of St(6, 2) to 1e-13. (That the step is the core optimizer's:
    test_jax_train.py.)"""
    import jax

    params, mans, batch, loss = problem()
    tx = ga.jax.optax_transform(mans, "adam", lr=1e-2)
    state = tx.init(params)
    grads = jax.grad(loss)(params, batch)
    updates, state = jax.jit(tx.update)(grads, state, params)
    exact = ga.jax.apply_updates(params, updates, state)
    added = optax.apply_updates(params, updates)
    Yp = np.asarray(state.points["Y"])
    assert np.array_equal(np.asarray(exact["Y"]), Yp)
    assert np.max(np.abs(np.asarray(added["Y"]) - Yp)) <= 4 * np.finfo(np.float64).eps
    assert mans["Y"].is_point(exact["Y"], atol=1e-13) and mans["Y"].is_point(added["Y"], atol=1e-13)


@pytest.mark.parametrize(("dtype", "bound"), [("float64", 1e-13), ("float32", 1e-4)])
def test_orthonormality_after_1000_steps(dtype, bound):
    """max |YᵀY − I| after 1000 Adam steps on −tr(YᵀCY), St(8, 3): ≤ 1e-13 (float64) / 1e-4 (float32) both with
    ``optax.apply_updates`` and with ``gj.apply_updates`` (measured: 6.4e-15 / 1.3e-5 and 6.4e-15 / 2.0e-6)."""
    import jax
    import jax.numpy as jnp

    M = ga.Stiefel(8, 3)
    params = {"Y": M.random(0, xp=jnp, dtype=dtype)}
    C = ga.random.normal(1, (8, 8), xp=jnp, dtype=dtype)
    C = C + C.T
    tx = ga.jax.optax_transform({"Y": M}, "adam", lr=1e-2)

    def loss(p):
        return -jnp.trace(p["Y"].T @ C @ p["Y"])

    def body(carry, _):
        (pa, sa), (pb, sb) = carry
        ua, sa = tx.update(jax.grad(loss)(pa), sa, pa)
        ub, sb = tx.update(jax.grad(loss)(pb), sb, pb)
        return ((optax.apply_updates(pa, ua), sa), (ga.jax.apply_updates(pb, ub, sb), sb)), None

    state = tx.init(params)
    run = jax.jit(lambda c: jax.lax.scan(body, c, None, length=1000)[0])
    (pa, _), (pb, _) = run(((params, state), (params, state)))
    eye = np.eye(3)
    for p in (pa, pb):
        Y = np.asarray(p["Y"], dtype=np.float64)
        assert np.max(np.abs(Y.T @ Y - eye)) <= bound
    assert float(loss(pb)) < float(loss(params))


def test_chain_after_clip_by_global_norm_clips_euclidean_gradients():
    """``optax.chain(optax.clip_by_global_norm(c), tx)`` = the core step on the Euclidean gradients scaled by
    c/‖∇L‖ (Frobenius over all leaves), to 1e-14; the clipping is active (‖∇L‖ > c) and changes the step."""
    import jax
    import jax.numpy as jnp

    params, mans, batch, loss = problem()
    grads = jax.grad(loss)(params, batch)
    norm = float(jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads))))
    c = 0.25 * norm
    chained = optax.chain(optax.clip_by_global_norm(c), ga.jax.optax_transform(mans, "gradient", lr=0.5))
    state = chained.init(params)
    updates, state = chained.update(grads, state, params)
    new = ga.jax.apply_updates(params, updates, state)
    core = ga.optim.Gradient(lr=0.5)
    clipped = jax.tree_util.tree_map(lambda g: g * (c / norm), grads)
    ref, _ = core.update(params, clipped, core.init(params, mans))
    unclipped, _ = core.update(params, grads, core.init(params, mans))
    for k in ("Y", "w"):
        np.testing.assert_allclose(np.asarray(new[k]), np.asarray(ref[k]), rtol=0, atol=1e-14)
    assert np.max(np.abs(np.asarray(new["Y"]) - np.asarray(unclipped["Y"]))) > 1e-3
    assert mans["Y"].is_point(new["Y"], atol=1e-13)


def test_an_optax_inner_transform_runs_on_the_lifted_gradients():
    """``optax_transform(manifolds, optax.sgd(0.1, momentum=0.5))`` = ``geoarray.optim.Momentum(0.1, 0.5)`` over 3
    steps to 1e-13: optax's cache logic runs unchanged on horizontal elements of g^hor."""
    import jax

    params, mans, batch, loss = problem()
    tx = ga.jax.optax_transform(mans, optax.sgd(0.1, momentum=0.5))
    core = ga.optim.Momentum(lr=0.1, alpha=0.5)
    p, s = params, tx.init(params)
    q, r = params, core.init(params, mans)
    for _ in range(3):
        u, s = tx.update(jax.grad(loss)(p, batch), s, p)
        p = ga.jax.apply_updates(p, u, s)
        q, r = core.update(q, jax.grad(loss)(q, batch), r)
    for k in ("Y", "w"):
        np.testing.assert_allclose(np.asarray(p[k]), np.asarray(q[k]), rtol=0, atol=1e-13)


def test_updates_changed_after_the_transform_are_added_as_optax_does():
    """A transformation after the geoarray one (here ``optax.scale(0.5)``) changes the updates; ``gj.apply_updates``
    then falls back to p + u, bit-equal to ``optax.apply_updates`` (and the documented limit: off the manifold)."""
    import jax

    params, mans, batch, loss = problem()
    tx = optax.chain(ga.jax.optax_transform(mans, "gradient", lr=0.5), optax.scale(0.5))
    state = tx.init(params)
    updates, state = tx.update(jax.grad(loss)(params, batch), state, params)
    ours, theirs = ga.jax.apply_updates(params, updates, state), optax.apply_updates(params, updates)
    assert np.array_equal(np.asarray(ours["Y"]), np.asarray(theirs["Y"]))
    assert not mans["Y"].is_point(ours["Y"], atol=1e-8)


def test_bad_calls_are_refused():
    import jax.numpy as jnp

    params, mans, _, _ = problem()
    tx = ga.jax.optax_transform(mans, "adam", lr=1e-2)
    state = tx.init(params)
    grads = {"Y": jnp.zeros((6, 2)), "w": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"call tx.update\(grads, state, params\)"):
        tx.update(grads, state)
    with pytest.raises(TypeError, match="state must be the RiemannianOptaxState"):
        tx.update(grads, state.inner, params)
    with pytest.raises(ValueError, match="method must be one of"):
        ga.jax.optax_transform(mans, "adamw")
    with pytest.raises(TypeError, match="go to the optimizer's constructor"):
        ga.jax.optax_transform(mans, ga.optim.Adam(), lr=1e-3)
    with pytest.raises(ValueError, match=r"params\['Y'\] is not a point of Stiefel\(6, 2\)"):
        tx.init({**params, "Y": 2 * params["Y"]})
