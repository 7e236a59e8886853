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
    assert isinstance(tx, optax.GradientTransformation)
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


def _same(a, b) -> bool:
    """Two pytrees with the same structure and bit-identical leaves."""
    import jax

    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))


def test_init_and_update_are_pure_one_transformation_serves_two_trees():
    """``tx`` initialised for tree A, then for tree B (other shapes), updates both: each update equals (bit for bit)
    that of a transformation used for that tree alone. (geoarray's optimizers record a tree's layout in ``init``;
    before, the second ``init`` rebound ``tx`` and the update of A raised.)"""
    import jax
    import jax.numpy as jnp

    rule = lambda p: ga.jax.manifolds_like(p, {"^Y$": "stiefel"})  # noqa: E731
    pa, _, _, _ = problem()
    pb = {"Y": ga.Stiefel(5, 3).random(1, xp=jnp, dtype="float64"), "w": jnp.ones((3,), dtype=jnp.float64)}
    ga_ = jax.tree_util.tree_map(lambda a: jnp.full_like(a, 0.3), pa)
    gb = jax.tree_util.tree_map(lambda a: jnp.full_like(a, -0.2), pb)
    tx = ga.jax.optax_transform(rule, "adam", lr=1e-2)
    sa, sb = tx.init(pa), tx.init(pb)
    ua, _ = tx.update(ga_, sa, pa)
    ub, _ = tx.update(gb, sb, pb)
    alone_a, alone_b = ga.jax.optax_transform(rule, "adam", lr=1e-2), ga.jax.optax_transform(rule, "adam", lr=1e-2)
    assert _same(ua, alone_a.update(ga_, alone_a.init(pa), pa)[0])
    assert _same(ub, alone_b.update(gb, alone_b.init(pb), pb)[0])


def test_update_accepts_a_traced_init_or_a_restored_state_on_a_fresh_transformation():
    """A state from ``jax.jit(tx.init)`` equals the eager one; a state saved after 2 steps (to NumPy and back, as a
    checkpoint) continues on a *new* ``optax_transform`` object — never initialised — bit for bit like the
    original run. (Before, the new object raised "has not been initialised".)"""
    import jax
    import jax.numpy as jnp

    params, mans, batch, loss = problem()
    tx = ga.jax.optax_transform(mans, "adam", lr=1e-2)
    state = tx.init(params)
    assert _same(jax.jit(ga.jax.optax_transform(mans, "adam", lr=1e-2).init)(params), state)
    p = params
    for _ in range(2):
        u, state = tx.update(jax.grad(loss)(p, batch), state, p)
        p = ga.jax.apply_updates(p, u, state)
    saved = jax.tree_util.tree_map(np.asarray, (p, state))
    restored_p, restored_state = jax.tree_util.tree_map(jnp.asarray, saved)
    fresh = ga.jax.optax_transform(mans, "adam", lr=1e-2)
    u1, s1 = tx.update(jax.grad(loss)(p, batch), state, p)
    u2, s2 = fresh.update(jax.grad(loss)(restored_p, batch), restored_state, restored_p)
    assert _same((u1, s1), (u2, s2))


def test_params_that_do_not_fit_the_state_or_grads_missing_a_leaf_raise_naming_the_leaf():
    """float32 weights with a state built for float64, a weight of another shape, and grads without ``w`` raise
    ``TypeError``/``ValueError`` naming the leaf (not a dtype clash deep inside the manifold code)."""
    import jax
    import jax.numpy as jnp

    params, mans, _, _ = problem()
    tx = ga.jax.optax_transform(mans, "adam", lr=1e-2)
    state = tx.init(params)
    p32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)
    message = r"params\['Y'\] has dtype float32, but the optimizer state was built for float64"
    with pytest.raises(TypeError, match=message):
        tx.update(jax.tree_util.tree_map(jnp.ones_like, p32), state, p32)
    wide = {"Y": ga.Stiefel(6, 3).random(0, xp=jnp, dtype="float64"), "w": params["w"]}
    with pytest.raises(ValueError, match=r"params\['Y'\] has shape \(6, 3\), but the optimizer state was built for"):
        tx.update(jax.tree_util.tree_map(jnp.ones_like, wide), state, wide)
    with pytest.raises(ValueError, match=r"grads must have the leaves of params: missing \['w'\]"):
        tx.update({"Y": jnp.ones((6, 2))}, state, params)


def test_multi_transform_gives_the_stiefel_leaf_to_geoarray_and_the_rest_to_optax_adamw():
    """``optax.multi_transform({"geo": optax_transform, "euc": optax.adamw}, labels)``: the geoarray transformation
    sees only ``Y`` (the other leaf is masked) and its 3 steps equal the core Adam on ``{"Y": Y}`` to 1e-13, Y on
    St(6, 2) to 1e-13; ``w`` moves by adamw."""
    import jax

    params, mans, batch, loss = problem()
    tx = optax.multi_transform(
        {"geo": ga.jax.optax_transform(mans, "adam", lr=1e-2), "euc": optax.adamw(1e-2)}, {"Y": "geo", "w": "euc"}
    )
    core = ga.optim.Adam(lr=1e-2)
    p, s = params, tx.init(params)
    q, r = {"Y": params["Y"]}, core.init({"Y": params["Y"]}, {"Y": mans["Y"]})
    for _ in range(3):
        grads = jax.grad(loss)(p, batch)
        q, r = core.update(q, {"Y": jax.grad(loss)({"Y": q["Y"], "w": p["w"]}, batch)["Y"]}, r)
        u, s = tx.update(grads, s, p)
        p = ga.jax.apply_updates(p, u, s)
    np.testing.assert_allclose(np.asarray(p["Y"]), np.asarray(q["Y"]), rtol=0, atol=1e-13)
    assert mans["Y"].is_point(p["Y"], atol=1e-13)
    assert not np.allclose(np.asarray(p["w"]), np.asarray(params["w"]))
