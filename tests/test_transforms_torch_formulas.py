"""``scale_by_torch_adam``, ``scale_by_torch_sgd`` and ``scale``: torch.optim's formulas as pure transforms.

Every backend, float64: six steps of ``chain(scale(±1), transform, scale_by_learning_rate(lr))`` on a
tree of arrays equal an independent NumPy transcription of ``torch.optim.Adam``/``SGD``'s documented
algorithm (coupled and decoupled weight decay, amsgrad, maximize, momentum with dampening, Nesterov,
hyperparameters that change between steps) to 1e-12 relative; under ``jax.jit`` (the traced path, no
host reads) the same to 1e-12; inside the Riemannian wrapper a Stiefel leaf stays on its manifold;
bad hyperparameters raise naming the argument.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import assert_close, to_numpy
from geoarray import Stiefel
from geoarray.optim import chain, riemannian, scale_by_learning_rate
from geoarray.optim.torch_rules import scale, scale_by_torch_adam, scale_by_torch_sgd

SHAPES = {"w": (4, 3), "b": (5,)}
LR = 0.05


def _tree(rng, xp, device):
    return {k: xp.asarray(rng.standard_normal(s), device=device) for k, s in SHAPES.items()}


def _reference_adam(p, grads, *, betas, eps, wd, amsgrad, maximize, decoupled):
    """torch.optim.Adam's algorithm box (torch docs), one array, in NumPy; betas: a function of t."""
    m, v, vmax = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        b1, b2 = betas(t)
        g = -g if maximize else g
        if wd and decoupled:
            p = p * (1 - LR * wd)
        elif wd:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = np.maximum(vmax, v)
        second = vmax if amsgrad else v
        p = p - LR * (m / (1 - b1**t)) / (np.sqrt(second / (1 - b2**t)) + eps)
    return p


def _reference_sgd(p, grads, *, momentum, dampening, wd, nesterov, maximize):
    """torch.optim.SGD's algorithm box (torch docs), one array, in NumPy."""
    buf = None
    for g in grads:
        g = -g if maximize else g
        if wd:
            g = g + wd * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - LR * g
    return p


_ADAM_KEYS = ("betas", "eps", "wd", "amsgrad", "maximize", "decoupled")
ADAM_CASES = {
    name: dict(zip(_ADAM_KEYS, values, strict=True))
    for name, values in {
        "plain": ((0.9, 0.999), 1e-8, 0.0, False, False, False),
        "coupled-decay": ((0.8, 0.99), 1e-8, 0.3, False, False, False),
        "adamw-amsgrad": ((0.9, 0.95), 1e-6, 0.2, True, False, True),
        "maximize-amsgrad": ((0.7, 0.9), 1e-8, 0.1, True, True, False),
    }.items()
}

SGD_CASES = {
    "plain": {"momentum": 0.0, "dampening": 0.0, "wd": 0.0, "nesterov": False, "maximize": False},
    "momentum-dampening-decay": {"momentum": 0.9, "dampening": 0.3, "wd": 0.1, "nesterov": False, "maximize": False},
    "nesterov-maximize": {"momentum": 0.8, "dampening": 0.0, "wd": 0.05, "nesterov": True, "maximize": True},
}


def _run(transform, xp, device, n_steps=6, jit=None):
    rng = np.random.default_rng(0)
    params = _tree(rng, xp, device)
    grads = [_tree(rng, xp, device) for _ in range(n_steps)]
    start = {k: to_numpy(v) for k, v in params.items()}
    state = transform.init(params)

    def step(params, g, state):
        updates, state = transform.update(g, state, params)
        return optree.tree_map(lambda p, u: p + u, params, updates), state

    step = jit(step) if jit else step
    for g in grads:
        params, state = step(params, g, state)
    return start, [{k: to_numpy(v) for k, v in g.items()} for g in grads], params, state


def _adam(case, betas=None):
    c = ADAM_CASES[case]
    b1, b2 = betas or c["betas"]
    adam = scale_by_torch_adam(
        b1, b2, c["eps"], amsgrad=c["amsgrad"], weight_decay=c["wd"], decoupled_weight_decay=c["decoupled"]
    )
    return chain(scale(-1.0 if c["maximize"] else 1.0), adam, scale_by_learning_rate(LR))


@pytest.mark.parametrize("case", list(ADAM_CASES))
def test_scale_by_torch_adam_is_torchs_adam(xp, device, case):
    start, grads, out, state = _run(_adam(case), xp, device)
    c = ADAM_CASES[case]
    for k in SHAPES:
        want = _reference_adam(
            start[k], [g[k] for g in grads], betas=lambda t, c=c: c["betas"], eps=c["eps"], wd=c["wd"],
            amsgrad=c["amsgrad"], maximize=c["maximize"], decoupled=c["decoupled"],
        )  # fmt: skip
        assert_close(out[k], want, xp=xp, device=device, rtol=1e-12, atol=1e-14, err_msg=f"{case}: {k}")
    # torch's names and meanings: exp_avg is the uncorrected first moment; max_exp_avg_sq only with amsgrad
    adam_state = state[1]
    assert int(adam_state.count) == 6
    assert (adam_state.max_exp_avg_sq == ()) is (not c["amsgrad"])


def test_scale_by_torch_adam_reads_changing_betas_at_every_step(xp, device):
    """β₁ as a function of the step (what OneCycleLR's momentum cycling does) enters the moment update
    and the bias correction of that step, as in torch."""
    beta1 = lambda t: 0.95 - 0.05 * (int(t) % 3)  # noqa: E731
    transform = chain(scale(1.0), scale_by_torch_adam(beta1, 0.99, 1e-8), scale_by_learning_rate(LR))
    start, grads, out, _ = _run(transform, xp, device)
    for k in SHAPES:
        want = _reference_adam(
            start[k], [g[k] for g in grads], betas=lambda t: (beta1(t), 0.99), eps=1e-8, wd=0.0, amsgrad=False,
            maximize=False, decoupled=False,
        )  # fmt: skip
        assert_close(out[k], want, xp=xp, device=device, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", list(SGD_CASES))
def test_scale_by_torch_sgd_is_torchs_sgd(xp, device, case):
    c = SGD_CASES[case]
    sgd = scale_by_torch_sgd(c["momentum"], c["dampening"], c["nesterov"], c["wd"])
    transform = chain(scale(-1.0 if c["maximize"] else 1.0), sgd, scale_by_learning_rate(LR))
    start, grads, out, state = _run(transform, xp, device)
    for k in SHAPES:
        want = _reference_sgd(
            start[k], [g[k] for g in grads], momentum=c["momentum"], dampening=c["dampening"], wd=c["wd"],
            nesterov=c["nesterov"], maximize=c["maximize"],
        )  # fmt: skip
        assert_close(out[k], want, xp=xp, device=device, rtol=1e-12, atol=1e-14, err_msg=f"{case}: {k}")
    assert (state[1].momentum_buffer == ()) is (c["momentum"] == 0)


def _without_host_reads(step):
    def run(*args):
        previous = geoarray.set_host_reads("never")
        try:
            return step(*args)
        finally:
            geoarray.set_host_reads(previous)

    return run


def test_traced_step_equals_eager(backend, xp, device):
    """The device path (no host reads: bias corrections and SGD's first-step coefficient computed on the
    device) gives the eager numbers: under jax.jit on JAX, with ``set_host_reads("never")`` elsewhere."""
    if backend.kind == "jax":
        import jax

        device_path = jax.jit
    else:
        device_path = _without_host_reads
    sgd = chain(scale_by_torch_sgd(0.9, 0.3, False, 0.1), scale_by_learning_rate(LR))
    for transform in (_adam("adamw-amsgrad"), _adam("maximize-amsgrad"), sgd):
        _, _, eager, _ = _run(transform, xp, device)
        _, _, traced, _ = _run(transform, xp, device, jit=device_path)
        for k in SHAPES:
            assert_close(traced[k], to_numpy(eager[k]), xp=xp, device=device, rtol=1e-12, atol=1e-14)


def test_riemannian_wrapper_keeps_a_stiefel_leaf_on_its_manifold(xp, device):
    M = Stiefel(6, 2)
    rng = np.random.default_rng(1)
    params = {
        "Y": M.random(3, xp=xp, dtype=xp.float64, device=device),
        "b": xp.asarray(rng.standard_normal(3), device=device),
    }
    manifolds = {"Y": M, "b": None}
    for transform in (
        _adam("adamw-amsgrad"),
        chain(scale_by_torch_sgd(0.9, 0.0, True, 0.1), scale_by_learning_rate(0.1)),
    ):
        opt = riemannian(transform)
        state = opt.init(params, manifolds)
        p = params
        for _ in range(4):
            grads = {
                "Y": xp.asarray(rng.standard_normal((6, 2)), device=device),
                "b": xp.asarray(rng.standard_normal(3), device=device),
            }
            p, state = opt.update(p, grads, state)
        assert M.is_point(p["Y"], atol=1e-12)


def test_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="beta1"):
        scale_by_torch_adam(1.5)
    with pytest.raises(ValueError, match="both are 0"):
        scale_by_torch_adam(eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        scale_by_torch_adam(weight_decay=-1.0)
    with pytest.raises(ValueError, match="nesterov"):
        scale_by_torch_sgd(0.0, 0.0, nesterov=True)
    with pytest.raises(ValueError, match="nesterov"):
        scale_by_torch_sgd(0.9, 0.1, nesterov=True)
    with pytest.raises(ValueError, match="step_size"):
        scale(float("nan"))
