"""Adam's velocity is bounded whatever its gradients, and a step without host reads uses that (#30).

Adam's bias-corrected moments average one sequence of gradients each, so by Cauchy–Schwarz every entry
of its direction m̂ₜ/√v̂ₜ is at most C(β₁, β₂) (``adam_ratio_bound``: 2.345 for β = (0.9, 0.99)), attained
by gradients growing like (β₂/β₁)ᵗ. The velocity W = −η·direction is then bounded by η·C on the host,
without reading an array (``GradientTransformation.bound``), and so is the norm of the retraction's
balanced kernel (``kernel_norm_bound``). A step that may not read (a GPU's; ``set_host_reads("never")``
on the CPU) evaluates φ₁ by the cheapest fixed route covering that norm instead of the top Taylor rule
with four masked doublings: on the paper's ViT weights in float32, 3 products instead of 12.

What is checked: the bound is valid on adversarial and heavy-tailed gradient sequences and attained to
0.1%; the kernel bound covers the worst velocities and is within 2× of them; Adam steps without reads
take the static route (φ₁'s scaled route never runs, fewer products) and equal the reading steps to
AGREE_RTOL; a transform that breaks its promised bound gets its step skipped and counted, never taken
inaccurately; the geoarray.torch optimizers with a fixed β pass their param-group rate on.
"""

from __future__ import annotations

import math

import numpy as np
import optree
import pytest

import geoarray
from _helpers import assert_agree, to_numpy
from geoarray import Grassmann, Stiefel, optim
from geoarray.manifolds import retraction
from geoarray.optim import chain, clip_by_global_norm, scale_by_adam, scale_by_learning_rate, scale_by_momentum
from geoarray.optim.transforms import GradientTransformation, adam_ratio_bound

BETAS = [(0.9, 0.99), (0.9, 0.999), (0.5, 0.3), (0.0, 0.5), (0.9, 0.85), (0.99, 0.999)]


@pytest.fixture
def policy(host_reads_policy):
    return host_reads_policy


@pytest.mark.parametrize(("beta1", "beta2"), BETAS)
def test_adams_direction_is_bounded_whatever_the_gradients(xp, device, beta1, beta2):
    """max over steps of |update| ≤ η·C(β₁, β₂) (float64, relative slack 1e-9) on heavy-tailed gradients whose
    scale jumps by up to 10⁶, and the adversarial sequence gₖ ∝ (β₂/β₁)ᵏ attains η·C to 0.1% once the
    powers of ρ, β₁, β₂ are below 1e-5 (where that takes ≤ 3000 steps). C ≥ its closed-form limit."""
    lr = 1e-3
    C = adam_ratio_bound(beta1, beta2)
    rho = beta1**2 / beta2
    assert C >= (1 - beta1) / math.sqrt((1 - beta2) * (1 - rho)) * (1 - 1e-12)
    tx = chain(scale_by_adam(beta1, beta2, delta=1e-300, eps=0.0), scale_by_learning_rate(lr))
    assert tx.bound(None) == pytest.approx(lr * C, rel=1e-15)
    rng = np.random.default_rng(3)
    shape = (64,)
    state = tx.init({"w": xp.zeros(shape, dtype=xp.float64, device=device)})
    worst = 0.0
    for _ in range(300):
        g = rng.standard_cauchy(shape) * 10.0 ** rng.uniform(-3, 3, shape)
        u, state = tx.update({"w": xp.asarray(g, dtype=xp.float64, device=device)}, state)
        worst = max(worst, float(np.max(np.abs(to_numpy(u["w"])))))
    assert worst <= lr * C * (1 + 1e-9)
    # the adversarial sequence: gradients growing by β₂/β₁ each step (β₁ = 0: a jump from 0 to 1), long
    # enough for ρᵗ, β₁ᵗ, β₂ᵗ < 1e-5 (β₂ = 0.999 would take 11 500 steps: the random check above only)
    steps = math.ceil(math.log(1e-5) / math.log(max(rho, beta2, beta1, 1e-300))) + 1
    if steps > 3000:
        return
    state = tx.init({"w": xp.zeros((1,), dtype=xp.float64, device=device)})
    for t in range(steps):
        g = (beta1 / beta2) ** (steps - 1 - t)  # the last gradient is 1 (β₁ = 0: the only nonzero one)
        u, state = tx.update({"w": xp.asarray([g], dtype=xp.float64, device=device)}, state)
    attained = abs(float(to_numpy(u["w"])[0]))
    assert lr * C * 0.999 <= attained <= lr * C * (1 + 1e-9)


def test_the_bound_composes_through_chains():
    """A chain's bound is its transforms' rules in order: Adam forgets its input's scale, clipping keeps
    a bound, the rate multiplies it; momentum, a schedule without a host value, optax transforms and
    β₁² ≥ β₂ (no finite supremum) give None."""
    C = adam_ratio_bound(0.9, 0.99)
    assert chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(2e-3)).bound(None) == 2e-3 * C
    assert chain(scale_by_adam(), clip_by_global_norm(1.0), scale_by_learning_rate(1e-3)).bound(None) == 1e-3 * C
    assert chain(scale_by_momentum(0.9), scale_by_learning_rate(1e-3)).bound(None) is None
    assert chain(scale_by_adam(), scale_by_learning_rate(lambda t: 1e-3 / t)).bound(None) is None
    assert adam_ratio_bound(0.9, 0.8) is None
    assert chain(scale_by_adam(0.9, 0.8), scale_by_learning_rate(1e-3)).bound(None) is None
    plain = GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))  # like an optax transform
    assert chain(scale_by_adam(), plain).bound(None) is None
    assert optim.Adam(1e-3).transform.bound(None) == pytest.approx(1e-3 * C, rel=1e-15)

    class Live:  # geoarray.torch's param-group rate: a schedule that knows its value on the host
        value = 1e-3

        def __call__(self, t):
            return self.value

        def host_value(self):
            return self.value

    live = Live()
    tx = chain(scale_by_adam(), scale_by_learning_rate(live))
    assert tx.bound(None) == pytest.approx(1e-3 * C, rel=1e-15)
    live.value = 5e-2
    assert tx.bound(None) == pytest.approx(5e-2 * C, rel=1e-15)


@pytest.mark.parametrize(("N", "n"), [(12, 3), (8, 2), (49, 7), (5, 1)])
def test_the_kernel_bound_covers_every_bounded_velocity(N, n):
    """kernel_norm_bound(N, n, b) ≥ ‖½A‖₁ + ‖(½A)² − BᵀB‖₁^½ — the bound retract_e evaluates φ₁ for — for
    velocities with entries in [−b, b]: random ones, the worst sign patterns, and B of equal entries (for
    which ‖BᵀB‖₁ = n(N−n)b², the estimate's own worst case), where it is within 1.5× of the bound (the
    ½A term allows for a diagonal, which a skew A has not: at n = 1 that is the whole gap)."""
    rng = np.random.default_rng(N * 100 + n)
    b = 0.37
    theta = retraction.kernel_norm_bound(N, n, b)

    def kernel_bound(A, B):
        half = A / 2
        c = half @ half - B.T @ B
        return np.abs(half).sum(0).max() + math.sqrt(np.abs(c).sum(0).max())

    worst = 0.0
    for trial in range(200):
        A = rng.uniform(-b, b, (n, n)) if trial % 2 else b * rng.choice([-1.0, 1.0], (n, n))
        A = np.triu(A, 1) - np.triu(A, 1).T  # skew, as the lift makes it
        B = rng.uniform(-b, b, (N - n, n)) if trial % 3 else b * np.ones((N - n, n))
        worst = max(worst, kernel_bound(A, B))
    assert worst <= theta
    assert worst >= theta / 1.5


def _problem(xp, device, dtype):
    """ViT-like batched Stiefel heads, one larger frame and a Grassmann leaf, with fixed gradients."""
    mans = {"heads": Stiefel(49, 7), "frame": Stiefel(40, 6), "sub": Grassmann(10, 3)}
    kw = {"xp": xp, "device": device, "dtype": dtype}
    params = {
        "heads": mans["heads"].random(0, batch_shape=(6,), **kw),
        "frame": mans["frame"].random(1, **kw),
        "sub": mans["sub"].random(2, **kw),
    }
    grads = {k: geoarray.random.normal(10 + i, tuple(v.shape), **kw) for i, (k, v) in enumerate(params.items())}
    return params, mans, grads


def _run(opt, params, mans, grads, steps):
    state = opt.init(params, mans)
    for t in range(steps):
        g = optree.tree_map(lambda x: x * (1.0 + 0.3 * t), grads)  # noqa: B023
        params, state = opt.update(params, g, state)
    return params, state


def _unbounded(opt):
    """The same optimizer with its transform's bound rule removed (the route every step took before)."""
    t = opt.transform
    return optim.riemannian(GradientTransformation(t.init, t.update, t.uses_params, t.reframe))


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_adam_without_host_reads_takes_the_static_route(backend, xp, device, policy, monkeypatch, dtype_name):
    """Without host reads, Adam's steps never run φ₁'s scaled route (its bound names a fixed one) while
    Momentum's do (no bound); 5 steps equal the reading steps and the unbounded no-read steps to
    AGREE_RTOL; on torch the bounded step calls fewer matrix products."""
    if backend.kind == "jax":
        pytest.skip("JAX chooses φ₁'s Taylor rule on the device (lax.switch); the static route is for eager steps")
    dtype = getattr(xp, dtype_name)
    params, mans, grads = _problem(xp, device, dtype)
    policy("always")
    reference, _ = _run(optim.Adam(1e-3), params, mans, grads, 5)
    policy("never")
    scaled_calls = []
    original = retraction._phi1_scaled
    monkeypatch.setattr(retraction, "_phi1_scaled", lambda *a, **k: scaled_calls.append(1) or original(*a, **k))
    fixed, fixed_state = _run(optim.Adam(1e-3), params, mans, grads, 5)
    assert scaled_calls == []
    assert int(to_numpy(fixed_state.skipped)) == 0
    _run(optim.Momentum(1e-3), params, mans, grads, 1)
    assert scaled_calls
    unbounded, _ = _run(_unbounded(optim.Adam(1e-3)), params, mans, grads, 5)
    for a, b, c in zip(optree.tree_leaves(fixed), optree.tree_leaves(reference), optree.tree_leaves(unbounded),
                       strict=True):  # fmt: skip
        assert_agree(a, b, what="static route vs reads")
        assert_agree(a, c, what="static route vs the budget's route")
    if backend.kind == "torch":
        from torch.utils._python_dispatch import TorchDispatchMode

        def products(opt):
            state = opt.init(params, mans)
            seen = []

            class Count(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    if func.__name__.split(".")[0] in ("mm", "bmm", "addmm", "baddbmm"):
                        seen.append(func.__name__)
                    return func(*args, **(kwargs or {}))

            with Count():
                opt.update(params, grads, state)
            return len(seen)

        bounded, free = products(optim.Adam(1e-3)), products(_unbounded(optim.Adam(1e-3)))
        assert bounded < free, (bounded, free)


def test_a_velocity_beyond_its_promised_bound_is_skipped_and_counted(backend, xp, device, policy):
    """A transform whose velocity exceeds the bound it declares (1000× Adam's, declared as Adam's) cannot
    make a step without host reads inaccurate: the static route's reach is exceeded, the new points come
    out NaN and the step is skipped and counted, parameters unchanged. With host reads the bound is not
    used and the same step is taken."""
    if backend.kind == "jax":
        pytest.skip("JAX chooses φ₁'s Taylor rule on the device (lax.switch); the static route is for eager steps")
    params, mans, grads = _problem(xp, device, xp.float64)
    adam = optim.Adam(1e-3).transform

    def update(u, s, p=None):
        out, s = adam.update(u, s, p)
        return optree.tree_map(lambda x: 1000.0 * x, out), s

    liar = optim.riemannian(GradientTransformation(adam.init, update, adam.uses_params, adam.reframe, adam.bound))
    policy("never")
    new, state = _run(liar, params, mans, grads, 1)
    assert int(to_numpy(state.skipped)) == 1
    for a, b in zip(optree.tree_leaves(new), optree.tree_leaves(params), strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    policy("always")
    taken, state = _run(liar, params, mans, grads, 1)
    assert int(to_numpy(state.skipped)) == 0
    moved = [float(np.max(np.abs(to_numpy(a) - to_numpy(b)))) for a, b in zip(
        optree.tree_leaves(taken), optree.tree_leaves(params), strict=True)]  # fmt: skip
    assert min(moved) > 1e-2
    for name, M in mans.items():
        assert M.is_point(taken[name], atol=1e-10)


@pytest.mark.parametrize(
    ("bound", "error", "match"),
    [
        ("1.0", TypeError, r"velocity_bound must be a Python float .* got str '1.0'; pass float\(b\)"),
        (True, TypeError, r"velocity_bound must be a Python float .* got bool True"),
        (-1.0, ValueError, r"velocity_bound must be a finite number >= 0, got -1.0"),
        (float("nan"), ValueError, r"velocity_bound must be a finite number >= 0, got nan"),
    ],
)
def test_a_bad_velocity_bound_is_refused_by_name(xp, device, bound, error, match):
    """apply_retraction names velocity_bound, its value and the fix, before it computes anything."""
    M = Stiefel(6, 2)
    Y = M.random(0, xp=xp, device=device)
    lam = M.global_section(Y)
    W = M.global_rep(lam, M.rgrad(Y, geoarray.random.normal(1, (6, 2), xp=xp, device=device, scale=1e-2)))
    with pytest.raises(error, match=match):
        M.apply_retraction(lam, W, velocity_bound=bound)
    assert M.is_point(M.apply_retraction(lam, W, velocity_bound=2.0), atol=1e-10)  # a valid bound is taken


def test_the_torch_optimizers_pass_their_rate_on(backend, device):
    """geoarray.torch.PaperAdam (fixed β) bounds its velocity by the param group's current lr·C, read at
    every step (a scheduler's change included); geoarray.torch.Adam, whose β are read live from the
    group (OneCycleLR cycles β₁), and SGD declare none."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch runs on the torch backend")
    import torch

    import geoarray.torch as gt

    M = Stiefel(20, 4)
    C = adam_ratio_bound(0.9, 0.99)

    def velocity_bound(opt):
        W = opt.param_groups[0]["params"][0]
        W.grad = torch.ones_like(W)
        opt.step()  # builds the cohort's core and state
        cohort = opt._cohorts[0][0]
        return cohort.core._velocity_bound(cohort.state.layout)

    W = gt.ManifoldParameter(M.random(0, xp=torch, device=device), M)
    opt = gt.PaperAdam([W], lr=1e-3)
    assert velocity_bound(opt) == pytest.approx(1e-3 * C, rel=1e-12)
    opt.param_groups[0]["lr"] = 4e-3
    assert velocity_bound(opt) == pytest.approx(4e-3 * C, rel=1e-12)
    for make in (lambda ps: gt.Adam(ps, lr=1e-3), lambda ps: gt.SGD(ps, lr=1e-3, momentum=0.9)):
        W = gt.ManifoldParameter(M.random(0, xp=torch, device=device), M)
        assert velocity_bound(make([W])) is None
