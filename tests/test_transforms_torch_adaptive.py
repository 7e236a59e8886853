"""``scale_by_torch_rmsprop``, ``scale_by_torch_adagrad``, ``scale_by_torch_adamax``, ``scale_by_torch_nadam`` and
``scale_by_torch_radam``: torch.optim's formulas as pure array-API transforms.

Every backend, float64: 8 steps of ``chain(scale(±1), transform, scale_by_learning_rate(lr))`` on a tree of
arrays equal an independent NumPy transcription of the algorithm box of ``torch.optim.RMSprop``/``Adagrad``/
``Adamax``/``NAdam``/``RAdam`` (torch's documentation) to 1e-12 relative, for their options (centered,
momentum, lr_decay, initial_accumulator_value, coupled and decoupled weight decay, momentum_decay, RAdam's
rectified and unrectified steps, maximize) and a β₁ that changes at every step (NAdam's μ-product); the
device path — under ``jax.jit`` on JAX, with ``set_host_reads("never")`` elsewhere: the step count and
NAdam's μ-product read on the device, RAdam's switch a 0/1 factor — gives the same numbers to 1e-12; inside
the Riemannian wrapper a Stiefel leaf stays on its manifold to 1e-12; the states hold torch's names; bad
hyperparameters raise naming the argument. (torch's own optimizers on torch tensors:
``tests/test_torch_adaptive_optimizers.py``.)
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import assert_close, to_numpy
from geoarray import Stiefel
from geoarray.optim import chain, riemannian, scale_by_learning_rate
from geoarray.optim.torch_rules import (
    scale,
    scale_by_torch_adagrad,
    scale_by_torch_adamax,
    scale_by_torch_nadam,
    scale_by_torch_radam,
    scale_by_torch_rmsprop,
)

SHAPES = {"w": (4, 3), "b": (5,)}
LR = 0.05
N_STEPS = 8


def _tree(rng, xp, device):
    return {k: xp.asarray(rng.standard_normal(s), device=device) for k, s in SHAPES.items()}


# -- torch's algorithm boxes, one array, in NumPy (hyperparameters as functions of the step t) -------------


def _reference_rmsprop(p, grads, *, alpha, eps, wd, momentum, centered, maximize):
    v, g_avg, buf = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    for g in grads:
        g = -g if maximize else g
        g = g + wd * p
        v = alpha * v + (1 - alpha) * g * g
        denom = v
        if centered:
            g_avg = alpha * g_avg + (1 - alpha) * g
            denom = v - g_avg**2
        step = g / (np.sqrt(denom) + eps)
        if momentum > 0:
            buf = momentum * buf + step
            step = buf
        p = p - LR * step
    return p


def _reference_adagrad(p, grads, *, lr_decay, wd, start, eps, maximize):
    s = np.full_like(p, start)
    for t, g in enumerate(grads, start=1):
        g = -g if maximize else g
        clr = LR / (1 + (t - 1) * lr_decay)
        g = g + wd * p
        s = s + g * g
        p = p - clr * g / (np.sqrt(s) + eps)
    return p


def _reference_adamax(p, grads, *, betas, eps, wd, maximize):
    m, u = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        b1, b2 = betas(t)
        g = -g if maximize else g
        g = g + wd * p
        m = b1 * m + (1 - b1) * g
        u = np.maximum(b2 * u, np.abs(g) + eps)
        p = p - LR * m / ((1 - b1**t) * u)
    return p


def _reference_nadam(p, grads, *, betas, eps, wd, psi, decoupled, maximize):
    m, v, product = np.zeros_like(p), np.zeros_like(p), 1.0
    for t, g in enumerate(grads, start=1):
        b1, b2 = betas(t)
        g = -g if maximize else g
        if decoupled:
            p = p * (1 - LR * wd)
        else:
            g = g + wd * p
        mu, mu_next = b1 * (1 - 0.5 * 0.96 ** (t * psi)), b1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
        product *= mu
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = np.sqrt(v / (1 - b2**t)) + eps
        p = p - LR * (1 - mu) / (1 - product) * g / denom - LR * mu_next / (1 - product * mu_next) * m / denom
    return p


def _reference_radam(p, grads, *, betas, eps, wd, decoupled, maximize):
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        b1, b2 = betas(t)
        g = -g if maximize else g
        if decoupled:
            p = p * (1 - LR * wd)
        else:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        rho_inf = 2 / (1 - b2) - 1
        rho = rho_inf - 2 * t * b2**t / (1 - b2**t)
        if rho > 5:
            r = np.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
            p = p - LR * m_hat * r * np.sqrt(1 - b2**t) / (np.sqrt(v) + eps)
        else:
            p = p - LR * m_hat
    return p


def _cycling(t):
    """β₁ changing at every step, as OneCycleLR's momentum cycling changes it (t an int, or a 0-d array on the
    device path)."""
    return 0.95 - 0.05 * (t % 3)


CASES = {
    "rmsprop": (
        lambda: scale_by_torch_rmsprop(0.9, 1e-6),
        lambda p, gs: _reference_rmsprop(p, gs, alpha=0.9, eps=1e-6, wd=0.0, momentum=0.0, centered=False,
                                         maximize=False),
        False,
    ),
    "rmsprop-centered-momentum-decay-maximize": (
        lambda: scale_by_torch_rmsprop(0.8, 1e-8, 0.1, 0.5, True),
        lambda p, gs: _reference_rmsprop(p, gs, alpha=0.8, eps=1e-8, wd=0.1, momentum=0.5, centered=True,
                                         maximize=True),
        True,
    ),
    "adagrad": (lambda: scale_by_torch_adagrad(), lambda p, gs: _reference_adagrad(
        p, gs, lr_decay=0.0, wd=0.0, start=0.0, eps=1e-10, maximize=False), False),
    "adagrad-lr_decay-decay-accumulator-maximize": (
        lambda: scale_by_torch_adagrad(0.3, 0.1, 0.5, 1e-8),
        lambda p, gs: _reference_adagrad(p, gs, lr_decay=0.3, wd=0.1, start=0.5, eps=1e-8, maximize=True),
        True,
    ),
    "adamax": (lambda: scale_by_torch_adamax(0.8, 0.95, 1e-6), lambda p, gs: _reference_adamax(
        p, gs, betas=lambda t: (0.8, 0.95), eps=1e-6, wd=0.0, maximize=False), False),
    "adamax-cycling-decay-maximize": (
        lambda: scale_by_torch_adamax(_cycling, 0.9, 1e-8, 0.2),
        lambda p, gs: _reference_adamax(p, gs, betas=lambda t: (_cycling(t), 0.9), eps=1e-8, wd=0.2, maximize=True),
        True,
    ),
    "nadam": (lambda: scale_by_torch_nadam(0.8, 0.95, 1e-6, momentum_decay=0.02), lambda p, gs: _reference_nadam(
        p, gs, betas=lambda t: (0.8, 0.95), eps=1e-6, wd=0.0, psi=0.02, decoupled=False, maximize=False), False),
    "nadam-cycling-coupled-decay": (
        lambda: scale_by_torch_nadam(_cycling, 0.99, 1e-8, 0.1),
        lambda p, gs: _reference_nadam(p, gs, betas=lambda t: (_cycling(t), 0.99), eps=1e-8, wd=0.1, psi=4e-3,
                                       decoupled=False, maximize=False),
        False,
    ),
    "nadam-decoupled-maximize": (
        lambda: scale_by_torch_nadam(0.9, 0.999, 1e-8, 0.2, 4e-3, True),
        lambda p, gs: _reference_nadam(p, gs, betas=lambda t: (0.9, 0.999), eps=1e-8, wd=0.2, psi=4e-3,
                                       decoupled=True, maximize=True),
        True,
    ),
    "radam-default": (lambda: scale_by_torch_radam(), lambda p, gs: _reference_radam(
        p, gs, betas=lambda t: (0.9, 0.999), eps=1e-8, wd=0.0, decoupled=False, maximize=False), False),
    "radam-rectified-from-step-3-coupled-decay": (
        lambda: scale_by_torch_radam(0.8, 0.9, 1e-6, 0.1),
        lambda p, gs: _reference_radam(p, gs, betas=lambda t: (0.8, 0.9), eps=1e-6, wd=0.1, decoupled=False,
                                       maximize=False),
        False,
    ),
    "radam-never-rectified-decoupled-maximize": (
        lambda: scale_by_torch_radam(0.9, 0.6, 1e-8, 0.2, True),
        lambda p, gs: _reference_radam(p, gs, betas=lambda t: (0.9, 0.6), eps=1e-8, wd=0.2, decoupled=True,
                                       maximize=True),
        True,
    ),
}  # fmt: skip


def _transform(case):
    make, _, maximize = CASES[case]
    return chain(scale(-1.0 if maximize else 1.0), make(), scale_by_learning_rate(LR))


def _run(transform, xp, device, jit=None):
    rng = np.random.default_rng(0)
    params = _tree(rng, xp, device)
    grads = [_tree(rng, xp, device) for _ in range(N_STEPS)]
    start = {k: to_numpy(v) for k, v in params.items()}
    state = transform.init(params)

    def step(params, g, state):
        updates, state = transform.update(g, state, params)
        return optree.tree_map(lambda p, u: p + u, params, updates), state

    step = jit(step) if jit else step
    for g in grads:
        params, state = step(params, g, state)
    return start, [{k: to_numpy(v) for k, v in g.items()} for g in grads], params, state


def _without_host_reads(step):
    def run(*args):
        previous = geoarray.set_host_reads("never")
        try:
            return step(*args)
        finally:
            geoarray.set_host_reads(previous)

    return run


@pytest.mark.parametrize("case", list(CASES))
def test_transform_is_torchs_algorithm(xp, device, case):
    start, grads, out, _ = _run(_transform(case), xp, device)
    reference = CASES[case][1]
    for k in SHAPES:
        want = reference(start[k], [g[k] for g in grads])
        assert_close(out[k], want, xp=xp, device=device, rtol=1e-12, atol=1e-14, err_msg=f"{case}: {k}")


@pytest.mark.parametrize("case", list(CASES))
def test_device_path_equals_eager(backend, xp, device, case):
    """No host reads: under jax.jit on JAX, with ``set_host_reads("never")`` elsewhere; the same numbers."""
    if backend.kind == "jax":
        import jax

        device_path = jax.jit
    else:
        device_path = _without_host_reads
    _, _, eager, _ = _run(_transform(case), xp, device)
    _, _, traced, _ = _run(_transform(case), xp, device, jit=device_path)
    for k in SHAPES:
        assert_close(traced[k], to_numpy(eager[k]), xp=xp, device=device, rtol=1e-12, atol=1e-14, err_msg=case)


def test_states_hold_torchs_buffers(xp, device):
    """The state fields under torch's names; the optional buffers are () when not kept; NAdam's μ-product is a
    0-d array equal to Π μₜ."""
    runs = {
        "plain": scale_by_torch_rmsprop(),
        "full": scale_by_torch_rmsprop(momentum=0.9, centered=True),
        "adagrad": scale_by_torch_adagrad(initial_accumulator_value=0.5),
        "adamax": scale_by_torch_adamax(),
        "nadam": scale_by_torch_nadam(0.9, momentum_decay=0.02),
        "radam": scale_by_torch_radam(),
    }
    states = {name: _run(chain(t, scale_by_learning_rate(LR)), xp, device)[3][0] for name, t in runs.items()}
    assert states["plain"].grad_avg == () and states["plain"].momentum_buffer == ()
    assert set(states["full"].grad_avg) == set(SHAPES) and set(states["full"].momentum_buffer) == set(SHAPES)
    assert all(float(xp.min(s)) >= 0.5 for s in states["adagrad"].sum.values())
    assert all(float(xp.min(u)) >= 1e-8 for u in states["adamax"].exp_inf.values())
    want = np.prod([0.9 * (1 - 0.5 * 0.96 ** (t * 0.02)) for t in range(1, N_STEPS + 1)])
    assert tuple(states["nadam"].mu_product.shape) == ()
    assert abs(float(states["nadam"].mu_product) - want) <= 1e-15
    for s in states.values():
        assert int(s.count) == N_STEPS


def test_riemannian_wrapper_keeps_a_stiefel_leaf_on_its_manifold(xp, device):
    M = Stiefel(6, 2)
    rng = np.random.default_rng(1)
    params = {
        "Y": M.random(3, xp=xp, dtype=xp.float64, device=device),
        "b": xp.asarray(rng.standard_normal(3), device=device),
    }
    cases = [case for case in CASES if CASES[case][2] or case.startswith("radam-rectified")]  # one of each
    for case in cases:
        opt = riemannian(_transform(case))
        state = opt.init(params, {"Y": M, "b": None})
        p = params
        for _ in range(N_STEPS):
            grads = {
                "Y": xp.asarray(rng.standard_normal((6, 2)), device=device),
                "b": xp.asarray(rng.standard_normal(3), device=device),
            }
            p, state = opt.update(p, grads, state)
        assert M.is_point(p["Y"], atol=1e-12), case


def test_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        scale_by_torch_rmsprop(alpha=1.5)
    with pytest.raises(ValueError, match="needs eps > 0"):
        scale_by_torch_rmsprop(eps=0.0)
    with pytest.raises(ValueError, match="momentum"):
        scale_by_torch_rmsprop(momentum=-0.1)
    with pytest.raises(ValueError, match="lr_decay"):
        scale_by_torch_adagrad(lr_decay=-1.0)
    with pytest.raises(ValueError, match="initial_accumulator_value=0 needs eps > 0"):
        scale_by_torch_adagrad(eps=0.0)
    scale_by_torch_adagrad(initial_accumulator_value=0.1, eps=0.0)  # the accumulator keeps the root positive
    with pytest.raises(ValueError, match="beta2"):
        scale_by_torch_adamax(beta2=1.0)
    with pytest.raises(ValueError, match="momentum_decay"):
        scale_by_torch_nadam(momentum_decay=-1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        scale_by_torch_radam(weight_decay=-1.0)
    with pytest.raises(ValueError, match="with weight_decay needs params"):
        t = scale_by_torch_nadam(weight_decay=0.1)
        t.update({"w": np.ones(2)}, t.init({"w": np.ones(2)}))
