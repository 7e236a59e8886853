"""Muon transforms (torch.optim.Muon's algorithm) and the manifold-Muon step.

Every backend, float64 unless stated. Properties and tolerances:

* ``muon`` equals a float64 NumPy re-implementation of torch.optim.Muon's update (EMA momentum,
  Nesterov, Frobenius pre-normalisation, transposition of tall matrices, adjust_lr_fn, decoupled weight
  decay) over 10 steps to 1e-10, for both ``adjust_lr_fn`` choices and without Nesterov; a batched
  leaf (..., rows, cols) equals its matrices run separately (1e-12);
* torch backend, float32: ``muon(ns_dtype="bfloat16")`` follows ``torch.optim.Muon`` itself over 10
  steps to bfloat16 precision: the displacement θ₁₀ − θ₀ agrees to 5e-2 relative (bfloat16 has
  unit roundoff 4e-3, amplified by the five Newton–Schulz steps; the two differ only in rounding
  order — torch fuses them in addmm —, measured 1.7e-2);
* ``orthogonalize_by_newton_schulz`` = ``linalg.newton_schulz`` per leaf; ``ns_dtype="bfloat16"`` on a
  backend without bfloat16 keeps the leaf's dtype;
* a non-matrix leaf raises ValueError naming its tree path and ``partition``;
* ``manifold_muon_step``: equals polar(Y − lr·A*) with A* the converged spectral direction (1e-10);
  400 steps with EMA/Nesterov momentum on the Brockett cost −tr(YᵀSY) (Stiefel and Grassmann,
  10×3, spectrum 10, 9, …, 1, lr 0.1 → 0.001) keep YᵀY = I to 1e-12 and end within 1e-3 of the
  optimum −(10 + 9 + 8) (measured ≈ 2e-5);
* on JAX, ``jax.jit`` of the step equals the eager step (1e-12).
"""

from __future__ import annotations

import math

import numpy as np
import optree
import pytest

from _helpers import asarray, assert_close, to_numpy
from geoarray import linalg
from geoarray._backend import backend_name
from geoarray.manifolds import Grassmann, Stiefel
from geoarray.manifolds.spectral import stiefel_spectral_direction
from geoarray.optim.muon import manifold_muon_step, muon, orthogonalize_by_newton_schulz, scale_by_muon

ABC = (3.4445, -4.7750, 2.0315)


def _ns(X, steps=5, eps=1e-7):
    a, b, c = ABC
    tall = X.shape[0] > X.shape[1]
    Z = X.T if tall else X
    Z = Z / max(np.linalg.norm(Z), eps)
    for _ in range(steps):
        S = Z @ Z.T
        Z = a * Z + (b * S + c * S @ S) @ Z
    return Z.T if tall else Z


def _torch_muon_reference(params, grads_seq, lr, wd, mom, nesterov, adjust):
    """torch.optim._muon._single_tensor_muon, transcribed to float64 NumPy."""
    params = {k: v.copy() for k, v in params.items()}
    bufs = {k: np.zeros_like(v) for k, v in params.items()}
    for grads in grads_seq:
        for k, p in params.items():
            g = grads[k]
            bufs[k] = bufs[k] + (1 - mom) * (g - bufs[k])
            u = g + mom * (bufs[k] - g) if nesterov else bufs[k]
            o = _ns(u)
            A, B = p.shape
            ratio = math.sqrt(max(1, A / B)) if adjust in (None, "original") else 0.2 * math.sqrt(max(A, B))
            p = p * (1 - lr * wd)
            params[k] = p - lr * ratio * o
    return params


def _problem(rng, steps=10):
    shapes = {"w1": (12, 5), "w2": (4, 9), "w3": (6, 6)}
    params = {k: rng.standard_normal(s) for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s) for k, s in shapes.items()} for _ in range(steps)]
    return params, grads


def _run(tr, params, grads_seq, xp, device):
    p = {k: asarray(v, xp, device) for k, v in params.items()}
    state = tr.init(p)
    for grads in grads_seq:
        g = {k: asarray(v, xp, device) for k, v in grads.items()}
        u, state = tr.update(g, state, p)
        p = optree.tree_map(lambda a, b: a + b, p, u)
    return p


@pytest.mark.parametrize(
    "adjust,nesterov,wd", [(None, True, 0.1), ("match_rms_adamw", True, 0.0), ("original", False, 0.05)]
)
def test_muon_equals_torch_algorithm_float64(xp, device, adjust, nesterov, wd):
    rng = np.random.default_rng(0)
    params, grads = _problem(rng)
    ref = _torch_muon_reference(params, grads, 0.02, wd, 0.95, nesterov, adjust)
    out = _run(muon(lr=0.02, weight_decay=wd, nesterov=nesterov, adjust_lr_fn=adjust), params, grads, xp, device)
    for k in params:
        assert_close(out[k], ref[k], xp=xp, atol=1e-10, err_msg=k)


def test_scale_by_muon_batched_equals_per_matrix(xp, device):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((3, 7, 4))
    grads = [rng.standard_normal((3, 7, 4)) for _ in range(3)]
    tr = scale_by_muon()
    state = tr.init(asarray(W, xp, device))
    outs = []
    for g in grads:
        u, state = tr.update(asarray(g, xp, device), state)
        outs.append(u)
    for i in range(3):
        state_i = tr.init(asarray(W[i], xp, device))
        for t, g in enumerate(grads):
            u, state_i = tr.update(asarray(g[i], xp, device), state_i)
            assert_close(outs[t][i, ...], u, xp=xp, atol=1e-12)


def test_muon_matches_torch_optim_muon_in_bfloat16(backend, xp, device):
    if backend.kind != "torch":
        pytest.skip("compares against torch.optim.Muon, which runs on torch tensors only")
    import torch

    rng = np.random.default_rng(2)
    params, grads = _problem(rng)
    f32 = torch.float32
    ps = {k: torch.nn.Parameter(torch.tensor(v, dtype=f32, device=device)) for k, v in params.items()}
    opt = torch.optim.Muon(list(ps.values()), lr=0.02, weight_decay=0.1)
    p = {k: torch.tensor(v, dtype=f32, device=device) for k, v in params.items()}
    tr = muon(lr=0.02, weight_decay=0.1, ns_dtype="bfloat16")
    state = tr.init(p)
    for g in grads:
        for k in ps:
            ps[k].grad = torch.tensor(g[k], dtype=f32, device=device)
        opt.step()
        u, state = tr.update({k: torch.tensor(v, dtype=f32, device=device) for k, v in g.items()}, state, p)
        p = {k: p[k] + u[k] for k in p}
    for k in params:
        assert p[k].dtype == f32
        d_ours = to_numpy(p[k]).astype(np.float64) - params[k]
        d_torch = ps[k].detach().cpu().numpy().astype(np.float64) - params[k]
        assert np.linalg.norm(d_ours - d_torch) <= 5e-2 * np.linalg.norm(d_torch), k


def test_orthogonalize_by_newton_schulz(xp, device):
    rng = np.random.default_rng(3)
    tree = {"a": rng.standard_normal((5, 3)), "b": [rng.standard_normal((2, 4, 6))]}
    xtree = optree.tree_map(lambda v: asarray(v, xp, device), tree)
    tr = orthogonalize_by_newton_schulz()
    out, _ = tr.update(xtree, tr.init(xtree))
    assert_close(out["a"], _ns(tree["a"]), xp=xp, atol=1e-12)
    assert_close(out["b"][0], np.stack([_ns(m) for m in tree["b"][0]]), xp=xp, atol=1e-12)
    out16, _ = orthogonalize_by_newton_schulz(ns_dtype="bfloat16").update(xtree, None)
    assert out16["a"].dtype == xtree["a"].dtype
    if getattr(xp, "bfloat16", None) is None:  # no bfloat16 here: the float64 iteration runs
        assert_close(out16["a"], _ns(tree["a"]), xp=xp, atol=1e-12)
    else:  # bfloat16 precision: unit roundoff 4e-3, amplified by five steps (measured ≈ 0.05 relative)
        ref = _ns(tree["a"])
        assert np.linalg.norm(to_numpy(out16["a"]) - ref) <= 0.15 * np.linalg.norm(ref)


def test_non_matrix_leaf_is_named(xp, device):
    params = {"layer": {"W": asarray(np.ones((3, 2)), xp, device), "b": asarray(np.ones(3), xp, device)}}
    for tr in (scale_by_muon(), muon(), orthogonalize_by_newton_schulz()):
        with pytest.raises(ValueError, match=r"\['layer'\]\['b'\].*\(3,\).*partition"):
            tr.init(params)
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        scale_by_muon(adjust_lr_fn="rms")


# ------------------------------------------------------------------------------------------
# manifold Muon
# ------------------------------------------------------------------------------------------


def _frame(rng, N, n):
    return np.linalg.qr(rng.standard_normal((N, n)))[0]


def test_manifold_muon_step_is_polar_of_spectral_step(xp, device):
    rng = np.random.default_rng(4)
    Y, G = _frame(rng, 9, 3), rng.standard_normal((9, 3))
    Yx, Gx = asarray(Y, xp, device), asarray(G, xp, device)
    A_star, _ = stiefel_spectral_direction(Yx, Gx, n_iter=200)
    Y1, A, P = manifold_muon_step(Stiefel(9, 3), Yx, Gx, None, lr=0.05, n_iter=200)
    assert_close(A, A_star, xp=xp, atol=1e-10)
    assert tuple(P.shape) == (3, 3)
    assert_close(Y1, to_numpy(linalg.polar(Yx - 0.05 * A_star)), xp=xp, atol=1e-10)
    Yg, Ag, Pg = manifold_muon_step(Grassmann(9, 3), Yx, Gx, None, lr=0.05)
    assert Pg is None
    assert_close(Yg, to_numpy(linalg.polar(Yx - 0.05 * Ag)), xp=xp, atol=1e-10)
    with pytest.raises(TypeError, match="Stiefel or Grassmann"):
        manifold_muon_step(object(), Yx, Gx, None, lr=0.1)


@pytest.mark.parametrize("manifold", [Stiefel(10, 3), Grassmann(10, 3)], ids=["stiefel", "grassmann"])
def test_manifold_muon_brockett(xp, device, manifold):
    rng = np.random.default_rng(5)
    N, n = 10, 3
    Qs = _frame(rng, N, N)
    ev = np.arange(N, 0, -1.0)
    S = asarray((Qs * ev) @ Qs.T, xp, device)
    Y = asarray(_frame(rng, N, n), xp, device)
    buf, P, worst = xp.zeros_like(Y), None, 0.0
    for t in range(400):
        G = -2 * (S @ Y)
        buf = buf + 0.1 * (G - buf)
        U = G + 0.9 * (buf - G)  # torch's Nesterov form of EMA momentum 0.9
        Y, _, P = manifold_muon_step(manifold, Y, U, P, lr=0.1 * (1 - t / 400) + 1e-3)
        if t % 50 == 49:
            Yn = to_numpy(Y)
            worst = max(worst, np.abs(Yn.T @ Yn - np.eye(n)).max())
    assert worst < 1e-12
    Yn = to_numpy(Y)
    cost = -np.trace(Yn.T @ to_numpy(S) @ Yn)
    assert 0 <= cost + ev[:n].sum() < 1e-3


def test_manifold_muon_step_jits(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit exists on the jax backend only")
    import jax

    rng = np.random.default_rng(6)
    Y = asarray(np.stack([_frame(rng, 8, 2) for _ in range(2)]), xp, device)
    G = asarray(rng.standard_normal((2, 8, 2)), xp, device)
    P = xp.zeros((2, 2, 2), dtype=Y.dtype)
    man = Stiefel(8, 2)
    step = jax.jit(lambda Y, G, P: manifold_muon_step(man, Y, G, P, lr=0.1))
    for a, b in zip(step(Y, G, P), manifold_muon_step(man, Y, G, P, lr=0.1), strict=True):
        assert_close(a, b, xp=xp, atol=1e-12)
    assert backend_name(xp) == "jax"


def test_the_muon_signatures_agree_with_each_other_and_with_torch():
    """Muon's options are spelled out in four public signatures (optax's and torch's convention: every
    alias lists its keywords): scale_by_muon, muon, Muon and ManifoldMuon. They must not drift apart —
    the shared keywords carry the same defaults everywhere, and torch.optim.Muon's where torch has it."""
    import inspect

    from geoarray.optim import ManifoldMuon, Muon
    from geoarray.optim.muon import muon, scale_by_muon

    shared = ("momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn", "ns_dtype")
    signatures = {f.__name__: inspect.signature(f).parameters for f in (scale_by_muon, muon, Muon, ManifoldMuon)}
    for name in shared:
        defaults = {owner: params[name].default for owner, params in signatures.items()}
        assert len(set(map(repr, defaults.values()))) == 1, f"{name}: {defaults}"
    assert signatures["muon"]["weight_decay"].default == signatures["Muon"]["weight_decay"].default
    torch = pytest.importorskip("torch")
    theirs = inspect.signature(torch.optim.Muon.__init__).parameters
    for name in ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn"):
        assert repr(signatures["Muon"][name].default) == repr(theirs[name].default), name
