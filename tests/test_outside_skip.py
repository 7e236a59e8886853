"""A step skipped for a reason outside the optimizer: ``update(..., skip=flag)``.

A ``GradScaler``'s ``found_inf`` is such a reason (``geoarray.torch`` hands it over; see
``tests/test_torch_grad_scaler.py``), and it is not the optimizer's to count. Properties checked on every
backend, for an Algorithm-1 optimizer (Adam) and manifold Muon, with host reads allowed and without:

* ``skip`` true (a bool or a 0-d boolean array) returns the parameters and every array of the state
  unchanged, bit for bit, with ``state.skipped`` unchanged — also when a gradient is NaN (the outside
  reason covers it) and under ``on_nonfinite="raise"`` (nothing is raised);
* ``skip`` false (an array) gives the step without it, to AGREE_RTOL (float64: 1e-12: the step is then
  taken whole and masked, where without a flag it may be read to the host and cut into pieces), and a NaN
  gradient is then the optimizer's to skip and count: ``skipped`` + 1;
* under ``on_nonfinite="ignore"`` a false flag lets the step through as without one;
* a bad ``skip`` (a 1-element vector, a float, a string) is a ``TypeError`` naming it, with nothing changed;
* on JAX the flag is an input of a jitted step: the compiled step skips and takes like the eager one;
* a partition hands the flag to its members that take it and skips a member of the user's (an
  ``(init, update)`` pair without ``skip=``) itself: zeroed gradients, old leaves and state selected back.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

from _helpers import assert_trees_agree, frames_tree, random_like, to_numpy
from geoarray import _backend, optim

OPTIMIZERS = {
    "Adam": lambda **kw: optim.Adam(lr=0.05, **kw),
    "ManifoldMuon": lambda **kw: optim.ManifoldMuon(lr=0.05, **kw),
}


def _grads(params, k, poison=False):
    grads = random_like(params, 50 + 10 * k)
    if poison:
        grads["frames"] = grads["frames"] * float("nan")
    return grads


def _flag(xp, device, value):
    return xp.asarray(value, dtype=xp.bool, device=device)


def _started(name, xp, device, **kw):
    """The optimizer after one ordinary step (so that its state is not all zeros), its params and state."""
    opt = OPTIMIZERS[name](**kw)
    params, mans = frames_tree(xp, device)
    state = opt.init(params, mans)
    params, state = opt.update(params, _grads(params, 0), state)
    return opt, params, state


def _same_bits(a, b):
    for x, y in zip(optree.tree_leaves(a), optree.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(to_numpy(x), to_numpy(y))


@pytest.mark.parametrize("reads", ["always", "never"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_skipped_step_changes_nothing_and_is_not_counted(xp, device, host_reads_policy, name, reads):
    host_reads_policy(reads)
    for on_nonfinite in ("skip", "raise", "ignore"):
        opt, params, state = _started(name, xp, device, on_nonfinite=on_nonfinite)
        for skip in (True, _flag(xp, device, True)):
            for poison in (False, True):
                new, new_state = opt.update(params, _grads(params, 1, poison), state, skip=skip)
                _same_bits(new, params)
                _same_bits(new_state, state)
                assert int(new_state.skipped) == int(state.skipped) == 0


@pytest.mark.parametrize("reads", ["always", "never"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_step_not_skipped_is_the_step_without_the_flag(xp, device, host_reads_policy, name, reads):
    host_reads_policy(reads)
    for on_nonfinite in ("skip", "ignore"):
        opt, params, state = _started(name, xp, device, on_nonfinite=on_nonfinite)
        grads = _grads(params, 1)
        want, want_state = opt.update(params, grads, state)
        got, got_state = opt.update(params, grads, state, skip=_flag(xp, device, False))
        assert_trees_agree((got, got_state), (want, want_state))
        assert float(np.max(np.abs(to_numpy(got["frames"]) - to_numpy(params["frames"])))) > 1e-3  # it moved


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_nan_gradient_under_a_false_flag_is_the_optimizers_to_skip_and_count(xp, device, host_reads_policy, name):
    host_reads_policy("never")  # the flag stays on the device: the masked route
    opt, params, state = _started(name, xp, device)
    new, new_state = opt.update(params, _grads(params, 1, poison=True), state, skip=_flag(xp, device, False))
    _same_bits(new, params)
    assert int(new_state.skipped) == 1
    _same_bits(new_state._replace(skipped=state.skipped), state)


@pytest.mark.parametrize("bad", ["yes", 1.0, "vector"])
def test_a_bad_skip_is_a_type_error_and_changes_nothing(xp, device, bad):
    opt, params, state = _started("Adam", xp, device)
    before = [to_numpy(x).copy() for x in optree.tree_leaves((params, state))]
    value = xp.asarray([True], device=device) if bad == "vector" else bad
    with pytest.raises(TypeError, match="skip must be None, a bool or a 0-d boolean array"):
        opt.update(params, _grads(params, 1), state, skip=value)
    for a, b in zip(optree.tree_leaves((params, state)), before, strict=True):
        np.testing.assert_array_equal(to_numpy(a), b)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_jitted_step_takes_the_flag_as_an_input(backend, xp, device, name):
    if backend.kind != "jax":
        pytest.skip("jax.jit: JAX only")
    import jax

    opt, params, state = _started(name, xp, device)
    grads = _grads(params, 1)
    step = jax.jit(lambda p, g, s, skip: opt.update(p, g, s, skip=skip))
    new, new_state = step(params, grads, state, _flag(xp, device, True))
    _same_bits(new, params)
    _same_bits(new_state, state)
    taken, taken_state = step(params, grads, state, _flag(xp, device, False))
    want, want_state = opt.update(params, grads, state)
    assert_trees_agree((taken, taken_state), (want, want_state))


class _PlainSGD:
    """An (init, update) pair of the user's, which knows nothing of ``skip=``: θ ← θ − 0.1·g, and a count."""

    def init(self, params, manifolds=None):
        (leaf,) = params.values()
        xp = _backend.array_namespace(leaf)
        return {"count": xp.zeros((), dtype=xp.int32, device=_backend.device(leaf))}

    def update(self, params, grads, state, **kwargs):
        return {k: p - 0.1 * grads[k] for k, p in params.items()}, {"count": state["count"] + 1}


@pytest.mark.parametrize("reads", ["always", "never"])
def test_a_partition_hands_the_flag_to_its_members_and_skips_the_others_itself(xp, device, host_reads_policy, reads):
    """A partition of Adam (the manifold leaves) and a user's pair without ``skip=`` (the matrix): a true flag
    leaves every leaf and both members' states unchanged, bit for bit, Adam's ``skipped`` at 0; a false
    one is the step without it."""
    host_reads_policy(reads)
    params, mans = frames_tree(xp, device)
    opt = optim.partition(
        {"adam": optim.Adam(lr=0.05), "plain": _PlainSGD()},
        lambda path, leaf: "plain" if path[-1] == "w" else "adam",
    )
    state = opt.init(params, mans)
    params, state = opt.update(params, _grads(params, 0), state)
    grads = _grads(params, 1)
    for skip in (True, _flag(xp, device, True)):
        new, new_state = opt.update(params, grads, state, skip=skip)
        _same_bits(new, params)
        _same_bits(new_state, state)
        assert int(new_state.states["adam"].skipped) == 0
    with pytest.raises(ValueError, match="tree structure"):  # a skipped step checks its input like any other
        opt.update({"w": params["w"]}, {"w": grads["w"]}, state, skip=True)
    with pytest.raises(TypeError, match="skip must be None, a bool or a 0-d boolean array"):
        opt.update(params, grads, state, skip="yes")
    got = opt.update(params, grads, state, skip=_flag(xp, device, False))
    assert_trees_agree(got, opt.update(params, grads, state))
    assert float(np.max(np.abs(to_numpy(got[0]["w"]) - to_numpy(params["w"])))) > 1e-3
