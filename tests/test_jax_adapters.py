"""Manifold trees for JAX pytrees by path rules; equinox modules and flax nnx/linen parameter trees end to end."""

from __future__ import annotations

import numpy as np
import pytest

import geoarray as ga
from _jax_common import require_jax


@pytest.fixture(autouse=True)
def _jax_only(backend):
    require_jax(backend)


def _tree():
    import jax.numpy as jnp

    return {
        "attn": {"kernel": jnp.zeros((4, 8, 2)), "bias": jnp.zeros(2)},
        "proj": [jnp.zeros((5, 3)), jnp.zeros((3, 5))],
        "steps": jnp.zeros((), dtype=jnp.int32),
    }


def test_manifolds_like_rules():
    """Regex rules (first match wins), classes and names built from the trailing shape (leading axes a batch),
    callables; integer leaves and unmatched paths get None."""
    tree = _tree()
    mans = ga.jax.manifolds_like(tree, {r"attn/kernel$": "stiefel", r"^proj/0$": ga.Grassmann, r"kernel": None})
    assert mans["attn"]["kernel"] == ga.Stiefel(8, 2)
    assert mans["proj"] == [ga.Grassmann(5, 3), None]
    assert mans["attn"]["bias"] is None and mans["steps"] is None
    seen = []
    mans = ga.jax.manifolds_like(tree, lambda path, leaf: seen.append(path) or None)
    assert sorted(seen) == ["attn/bias", "attn/kernel", "proj/0", "proj/1"]


@pytest.mark.parametrize(
    ("rule", "pattern"),
    [
        ({r"proj/1": "stiefel"}, r"'proj/1' of shape \(3, 5\) cannot be a point of Stiefel.*transposed"),
        ({r"proj/0": ga.Stiefel(4, 3)}, r"'proj/0' has shape \(5, 3\), which does not end in \(4, 3\)"),
        ({r"attn/bias": "stiefel"}, r"'attn/bias' has shape \(2,\); Stiefel needs a matrix"),
        ({r"proj/0": "orthogonal"}, r"rule for 'proj/0' gave 'orthogonal'"),
    ],
)
def test_manifolds_like_refuses_shapes_that_do_not_fit(rule, pattern):
    with pytest.raises((ValueError, TypeError), match=pattern):
        ga.jax.manifolds_like(_tree(), rule)


def test_init_on_manifolds():
    """Constrained leaves become points of their manifold (batch shape and dtype kept, reproducible by seed);
    the other leaves are returned as they are."""
    import jax.numpy as jnp

    tree = {"attn": {"kernel": jnp.zeros((4, 8, 2), dtype=jnp.float32), "bias": jnp.ones(2)}}
    mans = ga.jax.manifolds_like(tree, {"kernel": "stiefel"})
    out = ga.jax.init_on_manifolds(tree, mans, seed=3)
    K = out["attn"]["kernel"]
    assert K.shape == (4, 8, 2) and K.dtype == jnp.float32
    assert ga.Stiefel(8, 2).is_point(K, atol=1e-5)
    assert out["attn"]["bias"] is tree["attn"]["bias"]
    again = ga.jax.init_on_manifolds(tree, mans, seed=3)["attn"]["kernel"]
    assert np.array_equal(np.asarray(K), np.asarray(again))


def _regression(n_in=6, n_out=3, batch=16):
    import jax.numpy as jnp

    x = ga.random.normal(0, (batch, n_in), xp=jnp, dtype="float64")
    t = jnp.tanh(jnp.cumsum(x, axis=1)[:, :n_out])
    return x, t


def test_equinox_module_trains_with_a_stiefel_weight():
    """eqx.partition → manifolds by path (built on the whole module: static fields get None) → init on the manifold
    → make_train_step: after 5 steps the weight is on St(6, 3) to 1e-12 and the loss decreased."""
    eqx = pytest.importorskip("equinox", reason="equinox is not installed (pip install equinox)")
    import jax
    import jax.numpy as jnp

    class Net(eqx.Module):
        embed: eqx.nn.Linear
        head: eqx.nn.Linear
        act: callable = eqx.field(static=False, default=jnp.tanh)

        def __call__(self, x):
            return self.head(self.act(self.embed(x)))

    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    model = Net(eqx.nn.Linear(3, 6, key=k1, dtype=jnp.float64), eqx.nn.Linear(6, 3, key=k2, dtype=jnp.float64))
    mans = ga.jax.manifolds_like(model, {r"^embed/weight$": "stiefel"})  # weight (6, 3): x ↦ Wx, an isometry
    assert mans.embed.weight == ga.Stiefel(6, 3) and mans.act is None
    params, static = eqx.partition(model, eqx.is_inexact_array)
    params = ga.jax.init_on_manifolds(params, mans, seed=1)
    x, t = _regression(n_in=3)

    def loss(p, batch):
        m = eqx.combine(p, static)
        xb, tb = batch
        return jnp.mean((jax.vmap(m)(xb) - tb) ** 2)

    step, state = ga.jax.make_train_step(loss, ga.optim.Adam(lr=2e-2), params, mans)
    loss = jax.jit(loss)
    p, first = params, float(loss(params, (x, t)))
    for _ in range(5):
        p, state, _ = step(p, state, (x, t))
    assert ga.Stiefel(6, 3).is_point(p.embed.weight, atol=1e-12)
    assert float(loss(p, (x, t))) < first
    assert not np.allclose(np.asarray(p.head.bias), np.asarray(params.head.bias))


def test_flax_nnx_optimizer_with_optax_transform():
    """nnx.Optimizer drives ``optax_transform`` (manifolds from a rule evaluated on the state it sees): the
    kernel of St(6, 3) stays on the manifold (optax.apply_updates inside nnx: 1e-12) and the loss decreases."""
    pytest.importorskip("optax", reason="optax is not installed (pip install optax)")
    nnx = pytest.importorskip("flax.nnx", reason="flax is not installed (pip install flax)")
    import jax.numpy as jnp

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Linear(6, 3, rngs=rngs, param_dtype=jnp.float64)  # kernel (6, 3): x ↦ xK
            self.head = nnx.Linear(3, 3, rngs=rngs, param_dtype=jnp.float64)

        def __call__(self, x):
            return self.head(jnp.tanh(self.embed(x)))

    model = Net(nnx.Rngs(0))
    rule = {r"embed/kernel$": "stiefel"}
    state = nnx.state(model, nnx.Param)
    nnx.update(model, ga.jax.init_on_manifolds(state, ga.jax.manifolds_like(state, rule), seed=2))
    tx = ga.jax.optax_transform(lambda p: ga.jax.manifolds_like(p, rule), "adam", lr=2e-2)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    x, t = _regression()

    def loss(m):
        return jnp.mean((m(x) - t) ** 2)

    evaluate = nnx.jit(loss)

    @nnx.jit
    def train(m, opt):
        value, grads = nnx.value_and_grad(loss)(m)
        opt.update(m, grads)
        return value

    first = float(evaluate(model))
    for _ in range(5):
        train(model, optimizer)
    assert ga.Stiefel(6, 3).is_point(model.embed.kernel[...], atol=1e-12)
    assert float(evaluate(model)) < first


def test_flax_linen_params_with_make_train_step():
    """A flax linen ``variables["params"]`` dict: kernel of St(6, 3) after 5 steps to 1e-12, loss decreased."""
    nn = pytest.importorskip("flax.linen", reason="flax is not installed (pip install flax)")
    import jax
    import jax.numpy as jnp

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            hidden = jnp.tanh(nn.Dense(3, param_dtype=jnp.float64, name="embed")(x))  # kernel (6, 3): x ↦ xK
            return nn.Dense(3, param_dtype=jnp.float64, name="head")(hidden)

    model = Net()
    x, t = _regression()
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    mans = ga.jax.manifolds_like(params, {r"^embed/kernel$": "stiefel"})
    params = ga.jax.init_on_manifolds(params, mans, seed=4)

    def loss(p, batch):
        return jnp.mean((model.apply({"params": p}, batch[0]) - batch[1]) ** 2)

    step, state = ga.jax.make_train_step(loss, ga.optim.Adam(lr=2e-2), params, mans)
    loss = jax.jit(loss)
    p, first = params, float(loss(params, (x, t)))
    for _ in range(5):
        p, state, _ = step(p, state, (x, t))
    assert ga.Stiefel(6, 3).is_point(p["embed"]["kernel"], atol=1e-12)
    assert float(loss(p, (x, t))) < first
