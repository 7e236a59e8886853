"""geoarray.jax.make_train_step: a jitted step equal to the core optimizer's, and errors naming the parameter."""

from __future__ import annotations

import re

import numpy as np
import pytest

import geoarray as ga
from _jax_common import problem, require_jax


@pytest.fixture(autouse=True)
def _jax_only(backend):
    require_jax(backend)


def test_import_geoarray_does_not_import_jax():
    """``import geoarray`` stays free of JAX; ``geoarray.jax`` is reached lazily (checked in a fresh interpreter)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(ga.__file__).resolve().parents[1])
    code = "import sys, geoarray; assert 'jax' not in sys.modules; import geoarray.jax; assert 'jax' in sys.modules"
    # the interpreter's own path carried over: a machine may provide the dependencies through PYTHONPATH
    env = {"PYTHONPATH": os.pathsep.join([src, *sys.path]), "JAX_PLATFORMS": "cpu", "PATH": ""}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)


def test_train_step_equals_core_updates_and_stays_on_the_manifold():
    """5 jitted steps = 5 core ``opt.update`` calls on jax.grad gradients (to 1e-12), Y on St(6, 2) to 1e-12,
    the loss decreases; the caller's optimizer holds configuration only (the state carries the layout). With
    ``optax_transform`` in place of the optimizer (applied exactly), the step is the same to 1e-12."""
    import jax

    params, mans, batch, loss = problem()
    opt = ga.optim.Adam(lr=1e-2)
    step, state = ga.jax.make_train_step(loss, opt, params, mans)
    assert not hasattr(opt, "layout")  # configuration only: the state carries the layout

    ref_opt = ga.optim.Adam(lr=1e-2)
    ref_p, ref_s = params, ref_opt.init(params, mans)
    ref_update = jax.jit(lambda p, s: ref_opt.update(p, jax.grad(loss)(p, batch), s))
    p, s, losses = params, state, []
    for _ in range(5):
        p, s, value = step(p, s, batch)
        losses.append(float(value))
        ref_p, ref_s = ref_update(ref_p, ref_s)
    for k in ("Y", "w"):
        np.testing.assert_allclose(np.asarray(p[k]), np.asarray(ref_p[k]), rtol=0, atol=1e-12)
    assert int(s.step) == 5
    assert mans["Y"].is_point(p["Y"], atol=1e-12)
    assert losses[-1] < losses[0]

    try:
        import optax  # noqa: F401
    except ImportError:
        pytest.skip("optax is not installed (pip install optax): the optax half of this test did not run")
    step_x, s_x = ga.jax.make_train_step(loss, ga.jax.optax_transform(mans, "adam", lr=1e-2), params)
    q = params
    for _ in range(5):
        q, s_x, value_x = step_x(q, s_x, batch)
    for k in ("Y", "w"):
        np.testing.assert_allclose(np.asarray(q[k]), np.asarray(p[k]), rtol=0, atol=1e-12)
    assert float(value_x) == pytest.approx(losses[-1], abs=1e-12)


def _compiles(caplog, name: str) -> int:
    """How many times XLA compiled ``jit(name)`` in the records ``jax.log_compiles`` left in caplog."""
    return sum(f"Finished XLA compilation of jit({name})" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("placed", [False, True], ids=["uncommitted", "committed"])
def test_the_train_step_compiles_once(caplog, placed):
    """JAX compiles a jitted function again when its arguments change from uncommitted to committed to a
    device. The core's init commits its arrays, so with parameters made by jnp (uncommitted) the first
    step's outputs were committed and the second step compiled the train step again; the returned state
    now matches the parameters' placement: 4 steps, one compilation, whether the parameters are committed
    (jax.device_put to a device) or not."""
    import logging

    import jax

    params, mans, batch, loss = problem()
    if placed:
        params = jax.device_put(params, jax.devices()[0])
    step, state = ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), params, mans)
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        p, s = params, state
        for _ in range(4):
            p, s, _ = step(p, s, batch)
    assert _compiles(caplog, "step") == 1, [r.getMessage()[:80] for r in caplog.records]


def test_fit_compiles_its_gradient_and_update_once(caplog):
    """fit's jitted gradient and update on JAX: parameters from model.init (uncommitted) and batches
    taken with indices made on the data's device (committed) compiled each function twice (the first
    call with uncommitted, the later ones with committed parameters); fit commits what it carries
    before the first step: 2 epochs of 3 batches, one compilation each."""
    import logging

    import jax

    from geoarray import nn
    from geoarray.models import ClassificationTransformer
    from geoarray.train import fit

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 2, 4))
    y = np.eye(3)[np.argmax(x[:, -1, :3], axis=-1)]
    model = ClassificationTransformer(4, 2, 3, n_heads=2, n_layers=1)
    params = model.init(0, xp=jax.numpy)
    data = (jax.numpy.asarray(x), jax.numpy.asarray(y))
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        fit(
            model,
            params,
            data,
            ga.optim.Adam(lr=0.05),
            nn.ClassificationL2Loss(),
            epochs=2,
            batch_size=4,
            progress=False,
        )
    assert _compiles(caplog, "<lambda>") == 1 and _compiles(caplog, "update") == 1, [
        r.getMessage()[:80] for r in caplog.records if "Finished XLA compilation" in r.getMessage()
    ]


@pytest.mark.parametrize("section", ["householder", "transported", "rotated", "random"])
def test_the_compiled_initial_state_equals_the_eager_init(section):
    """make_train_step compiles the optimizer's init (one program, not one per operation): its state
    equals ``opt.init`` run eagerly, leaf by leaf, to 1e-12 in float64 (a different compilation of the
    same computation), for every section strategy, and has the same tree structure (layout included)."""
    import jax

    params, mans, _, loss = problem()
    opt = ga.optim.Adam(lr=1e-2, section=section)
    _, compiled = ga.jax.make_train_step(loss, opt, params, mans)
    eager = opt.init(params, mans)
    assert jax.tree_util.tree_structure(compiled) == jax.tree_util.tree_structure(eager)
    for a, b in zip(jax.tree_util.tree_leaves(compiled), jax.tree_util.tree_leaves(eager), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)


def test_rebinding_the_callers_optimizer_leaves_a_built_step_alone():
    """After ``opt.init`` for another tree, the step built from ``opt`` still updates its own tree."""
    import jax.numpy as jnp

    params, mans, batch, loss = problem()
    opt = ga.optim.Gradient(lr=0.1)
    step, state = ga.jax.make_train_step(loss, opt, params, mans)
    opt.init({"other": jnp.zeros(3)})
    p, _, _ = step(params, state, batch)
    assert set(p) == {"Y", "w"} and mans["Y"].is_point(p["Y"], atol=1e-12)


def test_has_aux_tuple_params_and_donation():
    """``has_aux=True`` returns (loss, aux); params may be any pytree (here a tuple of dicts); ``donate=True``
    hands the buffers of params and state to the step (the inputs are deleted afterwards)."""
    import jax.numpy as jnp

    params, mans, batch, loss = problem()
    tree, tree_mans = (params, {"s": jnp.ones(())}), (mans, {"s": None})

    def loss_aux(t, b):
        value = loss(t[0], b) * t[1]["s"]
        return value, {"double": 2 * value}

    step, state = ga.jax.make_train_step(loss_aux, ga.optim.Adam(lr=0.05), tree, tree_mans, has_aux=True, donate=True)
    old_state = state
    new, state, (value, aux) = step(tree, state, batch)
    assert tree[0]["Y"].is_deleted() and old_state.step.is_deleted()
    assert float(aux["double"]) == 2 * float(value)
    assert isinstance(new, tuple) and mans["Y"].is_point(new[0]["Y"], atol=1e-12)


# -- bad input: errors name the parameter, raised at make_train_step (before any step) -----------------


def _bad(kind):
    import jax.numpy as jnp

    params, mans, _, loss = problem()
    if kind == "shape":
        params = {**params, "Y": params["Y"][:5]}  # (5, 2) for Stiefel(6, 2)
    elif kind == "off-manifold":
        params = {**params, "Y": 2.0 * params["Y"]}
    elif kind == "dtype":
        params = {**params, "Y": jnp.zeros((6, 2), dtype=jnp.int32)}
    elif kind == "not-an-array":
        params = {**params, "act": "tanh"}
        mans = {**mans, "act": None}
    elif kind == "missing-manifold":
        mans = {"w": None}
    elif kind == "stray-manifold":
        mans = {**mans, "Z": ga.Stiefel(3, 1)}
    return params, mans, loss


@pytest.mark.parametrize(
    ("kind", "error", "pattern"),
    [
        ("shape", ValueError, r"params\['Y'\] has shape \(5, 2\), which does not end in \(6, 2\)"),
        ("off-manifold", ValueError, r"params\['Y'\] is not a point of Stiefel\(6, 2\)"),
        ("dtype", TypeError, r"params\['Y'\] must have a real floating dtype"),
        ("not-an-array", TypeError, r"params\['act'\] is a str, not a JAX array"),
        ("missing-manifold", ValueError, r"manifolds has no entry for the parameter\(s\) \['Y'\]"),
        ("stray-manifold", ValueError, r"manifolds names a manifold at \['Z'\], where params has no array"),
    ],
)
def test_bad_parameters_raise_naming_the_parameter(kind, error, pattern):
    params, mans, loss = _bad(kind)
    opt = ga.optim.Adam(lr=1e-2)
    with pytest.raises(error, match=pattern):
        ga.jax.make_train_step(loss, opt, params, mans)


def test_a_gradient_of_another_dtype_is_refused_naming_the_parameter():
    """A float32 gradient for a float64 weight (autodiff cannot produce one, so through the optax entry point,
    where users pass gradients themselves): TypeError naming the leaf, raised before the state changes."""
    pytest.importorskip("optax", reason="optax is not installed (pip install optax)")
    import jax.numpy as jnp

    params, mans, _, _ = problem()
    tx = ga.jax.optax_transform(mans, "gradient", lr=0.1)
    state = tx.init(params)
    grads = {"Y": jnp.ones((6, 2), dtype=jnp.float32), "w": jnp.ones((2,))}
    with pytest.raises(TypeError, match=re.escape("grad of params['Y'] has dtype float32, the parameter float64")):
        tx.update(grads, state, params)


def test_float32_parameters_keep_their_dtype_and_a_step_refuses_another_dtype_by_name():
    """A float32 tree (with jax_enable_x64 on) trains in float32: parameters, optimizer state and loss stay float32
    and Y stays on St(6, 2) to 1e-5. Handing the step float64 parameters raises ``TypeError`` naming ``params['Y']``
    at trace time (before: a dtype clash inside the manifold code, naming no parameter)."""
    import jax
    import jax.numpy as jnp

    params, mans, batch, loss = problem()
    p32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)
    b32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), batch)
    step, state = ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), p32, mans)
    p, s = p32, state
    for _ in range(3):
        p, s, value = step(p, s, b32)
    floats = [a for a in jax.tree_util.tree_leaves((p, s, value)) if jnp.issubdtype(a.dtype, jnp.floating)]
    assert {str(a.dtype) for a in floats} == {"float32"}
    assert mans["Y"].is_point(p["Y"], atol=1e-5)
    with pytest.raises(TypeError, match=re.escape("params['Y'] has dtype float64, but this train step was built for")):
        step(params, s, batch)
    message = "params is not the tree this train step was built for: missing ['w']"
    with pytest.raises(ValueError, match=re.escape(message)):
        step({"Y": p["Y"]}, s, b32)


def test_resuming_with_a_saved_state_continues_bit_for_bit_and_accepts_drifted_weights():
    """``make_train_step(..., state=saved)`` (a state after 2 steps, through NumPy as a checkpoint) continues exactly
    like the original run (bit for bit, 2 more steps). Trained weights that drifted off St(6, 2) by more than
    ``is_point``'s tolerance (here 2e-8 > 1e-10 in float64) are refused as *initial* weights but accepted with a
    saved state; a state of another structure or dtype raises ``ValueError``."""
    import jax
    import jax.numpy as jnp

    params, mans, batch, loss = problem()
    step, state = ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), params, mans)
    p = params
    for _ in range(2):
        p, state, _ = step(p, state, batch)
    saved_p, saved_state = jax.tree_util.tree_map(np.asarray, (p, state))
    resumed, s2 = ga.jax.make_train_step(
        loss, ga.optim.Adam(lr=1e-2), jax.tree_util.tree_map(jnp.asarray, saved_p), mans, state=saved_state
    )
    q = jax.tree_util.tree_map(jnp.asarray, saved_p)
    for _ in range(2):
        p, state, _ = step(p, state, batch)
        q, s2, _ = resumed(q, s2, batch)
    for a, b in zip(jax.tree_util.tree_leaves((p, state)), jax.tree_util.tree_leaves((q, s2)), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))

    drifted = {**p, "Y": p["Y"] * (1 + 1e-8)}
    assert not mans["Y"].is_point(drifted["Y"]) and mans["Y"].is_point(drifted["Y"], atol=1e-7)
    with pytest.raises(ValueError, match=r"params\['Y'\] is not a point of Stiefel\(6, 2\)"):
        ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), drifted, mans)
    again, s3 = ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), drifted, mans, state=state)
    r, s3, _ = again(drifted, s3, batch)
    assert int(s3.step) == int(state.step) + 1 and mans["Y"].is_point(r["Y"], atol=1e-7)
    with pytest.raises(ValueError, match="state does not have the structure"):
        ga.jax.make_train_step(loss, ga.optim.Momentum(lr=1e-2), params, mans, state=state)
    as32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32) if a.dtype == jnp.float64 else a, state)
    with pytest.raises(ValueError, match=r"state leaf \d+ is .* float32, this optimizer's state for params has"):
        ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), params, mans, state=as32)


def test_donation_with_an_optax_chain():
    """``make_train_step(loss, optax.chain(clip_by_global_norm, optax_transform), params, donate=True)``: 3 steps
    run with donated buffers (the inputs are deleted, every state leaf its own buffer), Y on St(6, 2) to 1e-12."""
    optax = pytest.importorskip("optax", reason="optax is not installed (pip install optax)")
    import jax
    import jax.numpy as jnp

    params, mans, batch, loss = problem()
    tx = optax.chain(optax.clip_by_global_norm(1.0), ga.jax.optax_transform(mans, "adam", lr=1e-2))
    step, state = ga.jax.make_train_step(loss, tx, params, donate=True)
    p = jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), params)
    first = p
    for _ in range(3):
        p, state, _ = step(p, state, batch)
    assert first["Y"].is_deleted()
    assert mans["Y"].is_point(p["Y"], atol=1e-12)


@pytest.mark.parametrize("name", ["Adam with a schedule", "ManifoldMuon with a schedule, and Adam", "optax chain"])
def test_a_train_step_moves_nothing_between_host_and_device(caplog, name):
    """The whole jitted step (gradient and update, parameters and state donated) holds no host callback and,
    once compiled, runs under ``jax.transfer_guard("disallow")``: what a GPU needs to keep its queue full.
    With a learning-rate schedule (an optax schedule of the step count, which the state carries as an array;
    manifold Muon's with it) the 5 steps compile once."""
    import logging

    import jax

    params, mans, batch, loss = problem()
    manifolds = mans
    if name == "Adam with a schedule":
        optax = pytest.importorskip("optax", reason="the schedule is optax's")
        opt = ga.optim.Adam(lr=optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10))
    elif name == "ManifoldMuon with a schedule, and Adam":
        optax = pytest.importorskip("optax", reason="the schedule is optax's")
        labels = {"Y": "muon", "w": "adam"}  # manifold Muon takes matrices: the vector gets Adam
        muon = ga.optim.ManifoldMuon(lr=optax.cosine_decay_schedule(1e-2, 10))  # the degree picked by lax.switch
        opt = ga.optim.partition({"muon": muon, "adam": ga.optim.Adam(1e-2)}, labels)
    else:
        optax = pytest.importorskip("optax", reason="the chain is optax's")
        opt, manifolds = (
            optax.chain(optax.clip_by_global_norm(1.0), ga.jax.optax_transform(mans, "adam", lr=1e-2)),
            None,
        )
    step, state = ga.jax.make_train_step(loss, opt, params, manifolds, donate=True)
    jaxpr = str(jax.make_jaxpr(step)(params, state, batch))
    for primitive in ("callback", "io_callback", "pure_callback", "debug_callback"):
        assert primitive not in jaxpr, f"{name}: {primitive} in the jitted step"
    p, s = jax.tree_util.tree_map(lambda a: a.copy(), params), state
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        p, s, first = step(p, s, batch)
        jax.block_until_ready(p)
        with jax.transfer_guard("disallow"):
            for _ in range(4):
                p, s, value = step(p, s, batch)
            jax.block_until_ready((p, s, value))
    assert _compiles(caplog, "step") == 1, [r.getMessage()[:80] for r in caplog.records]
    assert float(value) < float(first)
    assert mans["Y"].is_point(p["Y"], atol=1e-10)
