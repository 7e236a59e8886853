"""Frames of the optimizer caches: the "rotated" section strategy, Adam's ε outside the root, torch/optax parity.

The Householder frame λ(Y) = [Y, Q⊥(Y)] is a function of the point and jumps where a pivot changes sign; the
transported frame Λ ← Λ·exp(W) moves continuously but is dense N×N. "rotated" keeps the Householder frame and
re-expresses the caches in each new frame in O(N·n²): linear caches then follow the transported trajectory.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import assert_close, to_numpy
from geoarray import optim
from geoarray.manifolds import DenseSection, Grassmann, Stiefel, StiefelHorizontal, SymplecticStiefel


def _problem(xp, device):
    St, Gr = Stiefel(10, 3), Grassmann(9, 2)
    params = {
        "Y": St.random(0, xp=xp, batch_shape=(2,), device=device),
        "Z": Gr.random(1, xp=xp, device=device),
        "b": geoarray.random.normal(5, (3,), xp=xp, device=device),
    }
    mans = {"Y": St, "Z": Gr, "b": None}
    A = geoarray.random.normal(2, (10, 10), xp=xp, device=device)
    A2 = geoarray.random.normal(3, (9, 9), xp=xp, device=device)
    S, S2 = A + A.T, A2 + A2.T

    def grads(p, t):
        noise = geoarray.random.normal(10 + t, (2, 10, 3), xp=xp, device=device)
        return {"Y": -2 * S @ p["Y"] + 0.3 * noise, "Z": -2 * S2 @ p["Z"], "b": p["b"] - 1}

    return params, mans, grads


def _trajectory(opt, xp, device, steps):
    params, mans, grads = _problem(xp, device)
    state = opt.init(params, mans)
    out = []
    for t in range(steps):
        params, state = opt.update(params, grads(params, t), state)
        out.append(params)
    return out


@pytest.mark.parametrize("retraction", ["geodesic", "cayley"])
def test_rotated_momentum_follows_the_transported_frame(xp, device, retraction):
    """Momentum is linear in its cache, so re-expressing it in each Householder frame reproduces the
    transported frame's trajectory (20 steps, 1e-12), while the plain Householder frame does not."""
    kw = {"alpha": 0.9, "retraction": retraction}
    rotated = _trajectory(optim.Momentum(0.05, section="rotated", **kw), xp, device, 20)
    transported = _trajectory(optim.Momentum(0.05, section="transported", **kw), xp, device, 20)
    householder = _trajectory(optim.Momentum(0.05, section="householder", **kw), xp, device, 20)
    for a, b in zip(rotated, transported, strict=True):
        for x, y in zip(optree.tree_leaves(a), optree.tree_leaves(b), strict=True):
            assert_close(x, y, xp=xp, atol=1e-12)
    gap = np.abs(to_numpy(householder[-1]["Y"]) - to_numpy(transported[-1]["Y"])).max()
    assert gap > 1e-3  # the test can tell frames apart: without rotation the caches are read in turned frames


def test_rotated_adam_first_step_equals_transported_and_stays_on_the_manifold(xp, device):
    rotated = _trajectory(optim.Adam(0.05, section="rotated"), xp, device, 15)
    transported = _trajectory(optim.Adam(0.05, section="transported"), xp, device, 1)
    for x, y in zip(optree.tree_leaves(rotated[0]), optree.tree_leaves(transported[0]), strict=True):
        assert_close(x, y, xp=xp, atol=1e-13)
    assert Stiefel(10, 3).is_point(rotated[-1]["Y"], atol=1e-12)
    assert Grassmann(9, 2).is_point(rotated[-1]["Z"], atol=1e-12)


def test_adam_is_unchanged_by_flipping_the_signs_of_the_frame(xp, device):
    """Re-expressing Adam's moments in a frame whose Q⊥ columns changed sign (what a Householder pivot flip
    does) leaves the Adam step unchanged: elementwise moments are equivariant under signed permutations."""
    M = Stiefel(8, 3)
    Y = M.random(0, xp=xp, device=device)
    lam = M.global_section(Y)
    dense = DenseSection.from_householder(lam)
    signs = xp.asarray([1.0, -1.0, -1.0, 1.0, -1.0], device=device)
    flipped = DenseSection(Y, dense.Qperp * signs)
    mu = M.global_rep(lam, M.rgrad(Y, geoarray.random.normal(1, (8, 3), xp=xp, device=device)))
    nu = mu * mu + 0.1
    zero = mu * 0.0
    move = lambda B: M.reframe(lam, zero, flipped, B)  # noqa: E731  (no step: W = 0)
    mu_f = StiefelHorizontal(mu.A, move(mu.B))
    nu_f = StiefelHorizontal(nu.A, move(xp.sqrt(nu.B)) ** 2)
    assert_close(mu_f.B, signs[:, None] * mu.B, xp=xp, atol=1e-14)
    assert_close(nu_f.B, nu.B, xp=xp, atol=1e-14)
    step = lambda m, v, frame: M.apply_section(frame, M.retraction(-0.1 * m / (v + 1e-8).sqrt()))  # noqa: E731
    assert_close(step(mu_f, nu_f, flipped), step(mu, nu, lam), xp=xp, atol=1e-13)


def test_rotated_state_is_order_n_times_n(xp, device):
    """No N×N array in the state: the carried frame is the compact-WY section and the last velocity."""
    M = Stiefel(60, 3)
    opt = optim.Adam(section="rotated")
    state = opt.init({"Y": M.random(0, xp=xp, device=device)}, {"Y": M})
    sizes = [int(np.prod(x.shape)) for x in optree.tree_leaves(state)]
    assert max(sizes) <= 60 * 3 and sum(sizes) <= 10 * 60 * 3


def test_rotated_is_refused_where_no_reframe_rule_exists(xp, device):
    params, mans, _ = _problem(xp, device)
    with pytest.raises(ValueError, match=r"BFGS needs g\^hor coordinates that are consistent"):
        optim.BFGS(section="random")
    with pytest.raises(ValueError, match="has no reframe rule"):
        optim.BFGS(section="rotated").init(params, mans)
    Sp = SymplecticStiefel(8, 4)
    with pytest.raises(ValueError, match="no section strategy 'rotated'"):
        optim.Adam(section="rotated").init({"S": Sp.random(0, xp=xp, device=device)}, {"S": Sp})


def test_jit_of_rotated_adam_equals_eager(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    params, mans, grads = _problem(xp, device)
    opt = optim.Adam(0.05, section="rotated", eps=1e-8)
    state = opt.init(params, mans)
    jitted = jax.jit(opt.update)
    pe, se, pj, sj = params, state, params, state
    for t in range(4):
        pe, se = opt.update(pe, grads(pe, t), se)
        pj, sj = jitted(pj, grads(pj, t), sj)
    for a, b in zip(optree.tree_leaves((pe, se)), optree.tree_leaves((pj, sj)), strict=True):
        assert_close(a, b, xp=xp, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# ε outside the root, as torch, optax and the reference implementation run it
# ---------------------------------------------------------------------------------------------


def test_adam_with_eps_outside_equals_torch_adam(backend, xp, device):
    """delta=0, eps=1e-8: geoarray's Adam on Euclidean leaves is torch.optim.Adam (50 steps, float64, 1e-12)."""
    if backend.kind != "torch":
        pytest.skip("torch.optim.Adam runs on torch tensors only")
    import torch

    w0 = geoarray.random.normal(0, (4, 3), xp=xp, device=device)
    ours = optim.Adam(lr=0.01, beta1=0.9, beta2=0.999, delta=0.0, eps=1e-8)
    params, state = {"w": w0}, ours.init({"w": w0})
    ref = torch.nn.Parameter(w0.clone())
    torch_opt = torch.optim.Adam([ref], lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    for t in range(50):
        g = geoarray.random.normal(100 + t, (4, 3), xp=xp, device=device) + params["w"]
        params, state = ours.update(params, {"w": g}, state)
        ref.grad = g.clone()
        torch_opt.step()
    assert_close(params["w"], ref.detach(), xp=xp, atol=1e-12)


def test_optax_adam_with_eps_and_eps_root_equals_geoarray_adam(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("optax transforms run on JAX arrays only")
    optax = pytest.importorskip("optax", reason="optax is not installed (pip install optax)")
    params, mans, grads = _problem(xp, device)
    wrapped = optim.riemannian(
        optax.chain(optax.scale_by_adam(b1=0.9, b2=0.99, eps=1e-8, eps_root=1e-10), optax.scale(-0.05))
    )
    native = optim.Adam(0.05, delta=1e-10, eps=1e-8)
    pa, pb = params, params
    sa, sb = wrapped.init(pa, mans), native.init(pb, mans)
    for t in range(5):
        pa, sa = wrapped.update(pa, grads(pa, t), sa)
        pb, sb = native.update(pb, grads(pb, t), sb)
    for x, y in zip(optree.tree_leaves(pa), optree.tree_leaves(pb), strict=True):
        assert_close(x, y, xp=xp, atol=1e-12)
