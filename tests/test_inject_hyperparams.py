"""Hyperparameters in the state: ``geoarray.optim.inject_hyperparams`` (optax's ``inject_hyperparams``).

Properties checked on every backend:

* ``inject_hyperparams(make)(lr=η)`` takes the steps of ``make(lr=η)`` (Adam, Momentum, gradient descent,
  BFGS, manifold Muon), parameters and state to AGREE_RTOL (float64: 1e-12) over three steps;
* a rate put in the state between steps (an array, or a number as optax's users write it) is the rate of the
  next steps: equal to the optimizer built with the same rates as a schedule of the step;
* the state saves and loads bit-exactly, the rate in force with it, and the loaded state steps on bit for bit;
* ``skip=`` and the other keywords of the optimizer's update pass through;
* bad input: a missing or non-numeric first value, a hyperparameter the optimizer does not take as a
  schedule (Adam's ``beta1``), a state with other keys, a value that is not one number, another state —
  each a ``TypeError`` or ``ValueError`` naming it;
* on JAX the rate is an input of a jitted update: two rates, one trace.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

from _helpers import assert_trees_agree, frames_tree, random_like, to_numpy
from geoarray import optim
from geoarray.manifolds import Stiefel

MAKERS = {
    "Adam": optim.Adam,
    "Momentum": optim.Momentum,
    "Gradient": optim.Gradient,
    "BFGS": optim.BFGS,
    "ManifoldMuon": optim.ManifoldMuon,
}


def _grads(params, k):
    return random_like(params, 70 + 10 * k)


def _run(opt, params, mans, rates=None, state=None):
    state = opt.init(params, mans) if state is None else state
    for k in range(3):
        if rates is not None and k in rates:
            state = rates[k](state)
        params, state = opt.update(params, _grads(params, k), state)
    return params, state


@pytest.mark.parametrize("name", list(MAKERS))
def test_an_injected_rate_takes_the_steps_of_the_same_constant_rate(xp, device, name):
    params, mans = frames_tree(xp, device)
    lr = 0.03
    got, got_state = _run(optim.inject_hyperparams(MAKERS[name])(lr=lr), params, mans)
    schedule_built = MAKERS[name](lr=lambda t: lr * xp.ones_like(t))  # the same rate as a schedule: same state
    want, want_state = _run(schedule_built, params, mans)
    assert_trees_agree(got, want)
    assert_trees_agree(got_state.inner, want_state)
    constant, _ = _run(MAKERS[name](lr=lr), params, mans)
    assert_trees_agree(got, constant)
    assert float(np.max(np.abs(to_numpy(got["frames"]) - to_numpy(params["frames"])))) > 1e-3


@pytest.mark.parametrize("as_number", [False, True], ids=["array", "number"])
def test_a_rate_put_in_the_state_is_the_rate_of_the_next_steps(xp, device, as_number):
    params, mans = frames_tree(xp, device)
    opt = optim.inject_hyperparams(optim.Adam)(lr=0.05)

    def lower(state):
        if as_number:  # as optax's users write it: the dict is the caller's
            state.hyperparams["lr"] = 0.01
            return state
        return state._replace(hyperparams={"lr": xp.asarray(0.01, dtype=xp.float64, device=device)})

    got, got_state = _run(opt, params, mans, rates={2: lower})

    def piecewise(t):  # 0.05 for the first two steps, 0.01 from the third
        return 0.05 - 0.04 * xp.astype(t > 2, t.dtype)

    want, want_state = _run(optim.Adam(lr=piecewise), params, mans)
    assert_trees_agree(got, want)
    assert_trees_agree(got_state.inner, want_state)
    assert float(to_numpy(got_state.hyperparams["lr"])) == 0.01
    assert hasattr(got_state.hyperparams["lr"], "shape")  # a number put there comes back as an array


def test_the_state_saves_and_loads_bit_exactly_with_the_rate_in_force(xp, device, tmp_path):
    params, mans = frames_tree(xp, device)
    opt = optim.inject_hyperparams(optim.Adam)(lr=0.05)
    params, state = _run(opt, params, mans)
    state = state._replace(hyperparams={"lr": xp.asarray(0.02, dtype=xp.float64, device=device)})
    path = tmp_path / "state.npz"
    optim.save_state(path, state)
    loaded = optim.load_state(path, opt.init(params, mans))
    for a, b in zip(optree.tree_leaves(loaded), optree.tree_leaves(state), strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    grads = _grads(params, 5)
    a, sa = opt.update(params, grads, state)
    b, sb = opt.update(params, grads, loaded)
    for x, y in zip(optree.tree_leaves((a, sa)), optree.tree_leaves((b, sb)), strict=True):
        np.testing.assert_array_equal(to_numpy(x), to_numpy(y))


def test_the_optimizers_keywords_pass_through(xp, device):
    params, mans = frames_tree(xp, device)
    opt = optim.inject_hyperparams(optim.Adam)(lr=0.05, beta1=0.8, on_nonfinite="skip")
    assert opt.static == {"beta1": 0.8, "on_nonfinite": "skip"}
    state = opt.init(params, mans)
    new, new_state = opt.update(params, _grads(params, 0), state, skip=True)
    for a, b in zip(optree.tree_leaves((new, new_state)), optree.tree_leaves((params, state)), strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_bad_input_is_named(xp, device):
    params, mans = frames_tree(xp, device)
    with pytest.raises(TypeError, match="give the first value of lr"):
        optim.inject_hyperparams(optim.Adam)(beta1=0.9)
    with pytest.raises(TypeError, match="lr must be a finite number"):
        optim.inject_hyperparams(optim.Adam)(lr=lambda t: 0.1)
    with pytest.raises(TypeError, match="does not take beta1 as a schedule"):
        optim.inject_hyperparams(optim.Adam, injected=("lr", "beta1"))(lr=0.1, beta1=0.9)
    with pytest.raises(TypeError, match="injected must be a non-empty tuple"):
        optim.inject_hyperparams(optim.Adam, injected="lr")
    opt = optim.inject_hyperparams(optim.Adam)(lr=0.05)
    state = opt.init(params, mans)
    grads = _grads(params, 0)
    with pytest.raises(ValueError, match="keep the keys"):
        opt.update(params, grads, state._replace(hyperparams={"learning_rate": state.hyperparams["lr"]}))
    with pytest.raises(TypeError, match="a number or a one-element array"):
        opt.update(params, grads, state._replace(hyperparams={"lr": xp.ones((2,), device=device)}))
    with pytest.raises(TypeError, match="InjectHyperparamsState"):
        opt.update(params, grads, state.inner)


def test_a_jitted_update_takes_the_rate_as_an_input(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit: JAX only")
    import jax

    params, mans = frames_tree(xp, device)
    opt = optim.inject_hyperparams(optim.Adam)(lr=0.05)
    traces = []

    def update(p, g, s):
        traces.append(1)
        return opt.update(p, g, s)

    step = jax.jit(update)
    state = opt.init(params, mans)
    grads = _grads(params, 0)
    out = {}
    for lr in (0.05, 0.01):
        s = state._replace(hyperparams={"lr": xp.asarray(lr, dtype=xp.float64)})
        out[lr] = step(params, grads, s)
        assert_trees_agree(out[lr], opt.update(params, grads, s))
    assert len(traces) == 1
    assert float(np.max(np.abs(to_numpy(out[0.05][0]["w"]) - to_numpy(out[0.01][0]["w"])))) > 1e-3


def test_make_train_step_takes_an_injected_optimizer(backend):
    """geoarray.jax.make_train_step with the rate in the state: a rate put there between jitted steps is the
    rate of the next step (equal to the same rates as a schedule to AGREE_RTOL), with one trace."""
    if backend.kind != "jax":
        pytest.skip("geoarray.jax: JAX only")
    import jax.numpy as jnp

    from _jax_common import problem
    from geoarray.jax import make_train_step

    params, mans, batch, loss = problem()
    step, state = make_train_step(loss, optim.inject_hyperparams(optim.Adam)(lr=0.05), params, mans)
    got = params
    for k in range(3):
        if k == 2:
            state = state._replace(hyperparams={"lr": jnp.asarray(0.01, dtype=jnp.float64)})
        got, state, _ = step(got, state, batch)
    assert step._cache_size() == 1

    def piecewise(t):
        return 0.05 - 0.04 * jnp.astype(t > 2, t.dtype)

    ref_step, ref_state = make_train_step(loss, optim.Adam(lr=piecewise), params, mans)
    want = params
    for _ in range(3):
        want, ref_state, _ = ref_step(want, ref_state, batch)
    assert_trees_agree(got, want)


def test_geoarray_torch_refuses_it_and_names_the_param_groups_lr(backend, xp, device):
    """A torch optimizer keeps its rate in param_groups (torch's schedulers write it there): an optimizer whose
    rate is in its state is refused with a TypeError that says so, not wrapped as a gradient transformation."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch needs torch tensors")
    import geoarray.torch as gt

    M = Stiefel(6, 2)
    W = gt.ManifoldParameter(M.random(0, xp=xp, device=device), M)
    with pytest.raises(TypeError, match=r"param_groups\[i\]\['lr'\]"):
        gt.Optimizer([W], optim.inject_hyperparams(optim.Adam)(lr=0.05))
