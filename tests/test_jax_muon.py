"""ManifoldMuon, Muon and partition(ManifoldMuon + Adam) through geoarray.jax: optax_transform and make_train_step
jit and equal the core ``opt.update`` on jax.grad gradients to 1e-12 over 4 steps (float64); the string names
"muon" / "manifold_muon" build the same optimizers."""

from __future__ import annotations

import numpy as np
import pytest

import geoarray as ga
from _jax_common import require_jax


@pytest.fixture(autouse=True)
def _jax_only(backend):
    require_jax(backend)


STEPS = 4


def _problem():
    """params {"Y": St(6, 2), "W": (2, 3), "w": (3,)}, a batch and loss(params, batch), float64."""
    import jax.numpy as jnp

    M = ga.Stiefel(6, 2)
    params = {
        "Y": M.random(0, xp=jnp, dtype="float64"),
        "W": ga.random.normal(1, (2, 3), xp=jnp, dtype="float64"),
        "w": jnp.ones((3,), dtype=jnp.float64),
    }
    x = ga.random.normal(2, (8, 6), xp=jnp, dtype="float64")
    t = jnp.sin(jnp.arange(8, dtype=jnp.float64))

    def loss(p, b):
        xb, tb = b
        return jnp.mean((jnp.tanh(jnp.tanh(xb @ p["Y"]) @ p["W"]) @ p["w"] - tb) ** 2)

    return params, {"Y": M, "W": None, "w": None}, (x, t), loss


def _core(opt, params, mans, batch, loss):
    """STEPS jitted core updates of ``opt`` on the user's own tree."""
    import jax

    state = opt.init(params, mans)
    update = jax.jit(lambda p, s: opt.update(p, jax.grad(loss)(p, batch), s))
    for _ in range(STEPS):
        params, state = update(params, state)
    return params


def _via_optax(tx, params, batch, loss):
    import jax

    state = tx.init(params)

    @jax.jit
    def step(p, s):
        updates, s = tx.update(jax.grad(loss)(p, batch), s, p)
        return ga.jax.apply_updates(p, updates, s), s

    for _ in range(STEPS):
        params, state = step(params, state)
    return params


def _via_train_step(opt, params, mans, batch, loss):
    step, state = ga.jax.make_train_step(loss, opt, params, mans)
    for _ in range(STEPS):
        params, state, _ = step(params, state, batch)
    return params


def _assert_equal(a, b, keys, start=None):
    for k in keys:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=0, atol=1e-12)
        if start is not None:  # the comparison is not vacuous: the leaf moved
            assert np.abs(np.asarray(a[k]) - np.asarray(start[k])).max() > 1e-4


def _partition(labels):
    return ga.optim.partition({"muon": ga.optim.ManifoldMuon(lr=0.05), "adam": ga.optim.Adam(lr=1e-2)}, labels)


def test_manifold_muon_through_optax_and_make_train_step():
    """ManifoldMuon on Y (Stiefel) and W (Euclidean matrix, Muon's step); w is fixed (dropped from the tree)."""
    full, mans, batch, loss = _problem()
    w = full["w"]
    params, mans = {"Y": full["Y"], "W": full["W"]}, {"Y": mans["Y"], "W": None}

    def loss2(p, b):
        return loss({**p, "w": w}, b)

    ref = _core(ga.optim.ManifoldMuon(lr=0.05), params, mans, batch, loss2)
    tx = ga.jax.optax_transform(mans, ga.optim.ManifoldMuon(lr=0.05))
    _assert_equal(_via_optax(tx, params, batch, loss2), ref, ("Y", "W"), start=params)
    by_name = ga.jax.optax_transform(mans, "manifold_muon", lr=0.05)
    _assert_equal(_via_optax(by_name, params, batch, loss2), ref, ("Y", "W"))
    _assert_equal(_via_train_step(ga.optim.ManifoldMuon(lr=0.05), params, mans, batch, loss2), ref, ("Y", "W"))
    assert mans["Y"].is_point(ref["Y"], atol=1e-12)


def test_muon_through_optax_and_make_train_step():
    """Muon (torch.optim.Muon's algorithm) on the Euclidean matrix W, with Y and w held fixed."""
    full, _, batch, loss = _problem()
    params = {"W": full["W"]}

    def loss1(p, b):
        return loss({**full, "W": p["W"]}, b)

    ref = _core(ga.optim.Muon(lr=0.02), params, None, batch, loss1)
    _assert_equal(_via_optax(ga.jax.optax_transform(None, ga.optim.Muon(lr=0.02)), params, batch, loss1), ref, ["W"],
                  start=params)  # fmt: skip
    _assert_equal(_via_optax(ga.jax.optax_transform(None, "muon", lr=0.02), params, batch, loss1), ref, ["W"])
    _assert_equal(_via_train_step(ga.optim.Muon(lr=0.02), params, None, batch, loss1), ref, ["W"])


def test_partition_of_manifold_muon_and_adam_through_optax_and_make_train_step():
    """The ViT recipe: ``partition({"muon": ManifoldMuon, "adam": Adam}, labels)`` with ``labels`` a tree like the
    user's params (the adapters re-key it by path); also as a callable ``params -> labels`` and as a function
    ``(path, leaf) -> label``."""
    params, mans, batch, loss = _problem()
    labels = {"Y": "muon", "W": "muon", "w": "adam"}
    ref = _core(_partition(labels), params, mans, batch, loss)
    keys = ("Y", "W", "w")
    _assert_equal(_via_optax(ga.jax.optax_transform(mans, _partition(labels)), params, batch, loss), ref, keys,
                  start=params)  # fmt: skip
    _assert_equal(_via_train_step(_partition(labels), params, mans, batch, loss), ref, keys)
    _assert_equal(_via_train_step(_partition(lambda p: labels), params, mans, batch, loss), ref, keys)
    # and as a function of each leaf's path (the tuple of its keys) and the leaf, as in geoarray.optim
    by_path = _partition(lambda path, leaf: "adam" if path == ("w",) else "muon")
    _assert_equal(_via_train_step(by_path, params, mans, batch, loss), ref, keys)
    _assert_equal(_via_optax(ga.jax.optax_transform(mans, by_path), params, batch, loss), ref, keys)
    assert mans["Y"].is_point(ref["Y"], atol=1e-12)
    with pytest.raises(ValueError, match=r"labels have no entry for the parameter\(s\) \['w'\]"):
        ga.jax.make_train_step(loss, _partition({"Y": "muon", "W": "muon"}), params, mans)


def test_muon_refuses_a_vector_naming_it_through_the_adapter():
    params, mans, _, loss = _problem()
    with pytest.raises(ValueError, match=r"'w'.*Muon acts on matrices only.*partition"):
        ga.jax.make_train_step(loss, ga.optim.ManifoldMuon(), params, mans)
