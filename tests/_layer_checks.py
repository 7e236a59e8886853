"""Shared checks for layers: pullback against autodiff, Jacobians, volume and symplecticity.

* :func:`check_pullback` — the layer's analytic ``vjp`` against ``torch.autograd`` of ``apply``
  (torch backends), ``jax.vjp`` of ``apply`` (jax backends), or central finite differences along
  random directions (NumPy, array-api-strict, CuPy) as a third opinion.
* :func:`jacobian` — the Jacobian of x ↦ apply(params, x) for one sample, built from the analytic
  pullback of the unit covectors (one batched call), so it works on every backend.
* :func:`symplectic_form` — 𝕁̂ = I_T ⊗ 𝕁_d for the product-space form Σ_t z_tᵀ 𝕁 z̃_t with
  z_t = [q_t; p_t] and 𝕁_{2k} = [[0, I_k], [−I_k, 0]].
* :func:`check_batched_equals_looped` — a batch gives the per-sample outputs and input gradients,
  and parameter gradients equal to the sum of the per-sample ones.
* :func:`check_jit_matches_eager` — ``jax.jit`` of apply and of vjp + pullback equals eager (JAX only).
* :func:`perturbed_params`, :func:`random_input` — generic parameters and inputs for a layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optree

from _helpers import assert_close, to_numpy
from geoarray import random


def _leaves(tree: Any) -> list:
    return optree.tree_leaves(tree, none_is_leaf=False)


def _tree_vdot(a: Any, b: Any) -> float:
    return float(sum(np.vdot(to_numpy(x), to_numpy(y)) for x, y in zip(_leaves(a), _leaves(b), strict=True)))


def _random_like(tree: Any, seed: int, xp: Any) -> Any:
    rng = np.random.default_rng(seed)

    def draw(leaf):
        host = rng.normal(size=tuple(leaf.shape))
        return xp.asarray(host, dtype=leaf.dtype, device=_device(leaf))

    return optree.tree_map(draw, tree)


def _device(x):
    from geoarray._backend import device

    return device(x)


def check_pullback(
    layer: Any, params: Any, x: Any, backend: Any, *, rtol: float = 1e-10, fd_rtol: float = 1e-7, seed: int = 0
) -> None:
    """Assert that ``layer.vjp`` agrees with the backend's autodiff of ``layer.apply``.

    Tolerances: ``rtol`` relative to the largest entry of each gradient (torch/jax, float64);
    ``fd_rtol`` for the directional derivative from central differences (other backends).
    """
    xp = backend.xp
    y, pullback = layer.vjp(params, x)
    y_apply = layer.apply(params, x)
    np.testing.assert_allclose(
        to_numpy(y), to_numpy(y_apply), rtol=1e-13, atol=1e-13, err_msg="vjp's primal output differs from apply"
    )
    dy = _random_like(y, seed, xp)
    dparams, dx = pullback(dy)
    assert optree.tree_structure(dparams, none_is_leaf=False) == optree.tree_structure(params, none_is_leaf=False), (
        "dparams must have the tree structure of params"
    )
    assert tuple(dx.shape) == tuple(x.shape)

    if backend.kind == "torch":
        import torch

        leaves, spec = optree.tree_flatten(params, none_is_leaf=False)
        t_leaves = [leaf.detach().clone().requires_grad_(True) for leaf in leaves]
        t_x = x.detach().clone().requires_grad_(True)
        out = layer.apply(optree.tree_unflatten(spec, t_leaves), t_x)
        grads = torch.autograd.grad(out, [*t_leaves, t_x], grad_outputs=dy, allow_unused=True)
        ref_params = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads[:-1], leaves, strict=True)]
        ref_dx = grads[-1]
        _compare(dparams, optree.tree_unflatten(spec, ref_params), dx, ref_dx, rtol, "torch.autograd")
    elif backend.kind == "jax":
        import jax

        # one compiled program: eager, every operation of apply's forward and backward pass would compile
        # for its shapes (about 590 programs over the layer tests); the reference stays JAX's own autodiff
        ref_dparams, ref_dx = jax.jit(lambda p, a, d: jax.vjp(layer.apply, p, a)[1](d))(params, x, dy)
        _compare(dparams, ref_dparams, dx, ref_dx, rtol, "jax.vjp")
    else:
        # directional derivative: ⟨dy, f(p + εu, x + εv) − f(p − εu, x − εv)⟩ / 2ε = ⟨dp, u⟩ + ⟨dx, v⟩
        u = _random_like(params, seed + 1, xp)
        v = _random_like(x, seed + 2, xp)
        eps = 1e-6
        plus = layer.apply(optree.tree_map(lambda p, d: p + eps * d, params, u), x + eps * v)
        minus = layer.apply(optree.tree_map(lambda p, d: p - eps * d, params, u), x - eps * v)
        fd = _tree_vdot(dy, (plus - minus) / (2 * eps))
        an = _tree_vdot(dparams, u) + _tree_vdot(dx, v)
        scale = (
            abs(_tree_vdot(dparams, dparams)) ** 0.5 * abs(_tree_vdot(u, u)) ** 0.5
            + abs(_tree_vdot(dx, dx)) ** 0.5 * abs(_tree_vdot(v, v)) ** 0.5
        )
        assert abs(fd - an) <= fd_rtol * max(scale, 1e-300), (
            f"finite differences {fd!r} vs analytic pullback {an!r} (scale {scale:.3e})"
        )


def _compare(dparams, ref_dparams, dx, ref_dx, rtol, name):
    for path_leaf, (got, ref) in enumerate(zip(_leaves(dparams), _leaves(ref_dparams), strict=True)):
        g, r = to_numpy(got), to_numpy(ref)
        scale = max(np.max(np.abs(r)) if r.size else 0.0, 1e-300)
        np.testing.assert_allclose(
            g, r, rtol=0, atol=rtol * scale, err_msg=f"parameter gradient #{path_leaf} differs from {name}"
        )
    g, r = to_numpy(dx), to_numpy(ref_dx)
    np.testing.assert_allclose(
        g, r, rtol=0, atol=rtol * max(np.max(np.abs(r)), 1e-300), err_msg=f"input gradient differs from {name}"
    )


def jacobian(layer: Any, params: Any, x: Any, xp: Any) -> np.ndarray:
    """dy/dx (flattened, M×K) for one unbatched sample ``x``, via the analytic pullback."""
    y = layer.apply(params, x)
    M, K = int(np.prod(y.shape)), int(np.prod(x.shape))
    xs = xp.broadcast_to(x[None, ...], (M, *x.shape))
    _, pullback = layer.vjp(params, xs)
    basis = xp.reshape(xp.eye(M, dtype=x.dtype, device=_device(x)), (M, *y.shape))
    _, dx = pullback(basis)
    return to_numpy(xp.reshape(dx, (M, K)))


def symplectic_form(T: int, d: int) -> np.ndarray:
    """𝕁̂ = I_T ⊗ 𝕁_d for sequences (T, d) flattened row-major, d = 2k with [q, p] halves."""
    if d % 2:
        raise ValueError("d must be even")
    k = d // 2
    J = np.block([[np.zeros((k, k)), np.eye(k)], [-np.eye(k), np.zeros((k, k))]])
    return np.kron(np.eye(T), J)


def check_batched_equals_looped(
    layer: Any, params: Any, x: Any, xp: Any, *, batch_ndim: int = 1, rtol: float = 1e-13
) -> None:
    """apply/vjp on a batch equal the loop over its samples; parameter gradients equal the looped sum.

    The first ``batch_ndim`` axes of ``x`` are looped over. Tolerance: ``rtol`` times max(1, largest
    entry of the looped reference), entrywise.
    """
    y, pullback = layer.vjp(params, x)
    dy = random.normal(7, tuple(y.shape), xp=xp, dtype=x.dtype, device=_device(x))
    dparams, dx = pullback(dy)
    ys, dxs, dps = [], [], []
    for idx in np.ndindex(*x.shape[:batch_ndim]):
        yb, pb = layer.vjp(params, x[(*idx, ...)])
        dpb, dxb = pb(dy[(*idx, ...)])
        ys.append(to_numpy(yb))
        dxs.append(to_numpy(dxb))
        dps.append([to_numpy(g) for g in _leaves(dpb)])
    looped_dp = [sum(g) for g in zip(*dps, strict=True)]
    pairs = [
        (to_numpy(y), np.stack(ys).reshape(tuple(y.shape)), "output"),
        (to_numpy(dx), np.stack(dxs).reshape(tuple(dx.shape)), "input gradient"),
    ]
    pairs += [(to_numpy(g), r, "parameter gradient") for g, r in zip(_leaves(dparams), looped_dp, strict=True)]
    for got, ref, what in pairs:
        np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * max(1.0, np.max(np.abs(ref))), err_msg=what)


def check_jit_matches_eager(layer: Any, params: Any, x: Any, xp: Any, *, atol: float = 1e-13) -> None:
    """``jax.jit`` of apply, and of vjp followed by the pullback of dy = y, equal the eager results to ``atol``.

    Only for the jax backend (the caller skips the others); it shows that the layer is pure and traceable.
    """
    import jax

    def step(params, x):
        y, pullback = layer.vjp(params, x)
        return layer.apply(params, x), y, pullback(y)

    jitted, eager = jax.jit(step)(params, x), step(params, x)
    for a, b in zip(_leaves(jitted), _leaves(eager), strict=True):
        assert_close(a, b, xp=xp, atol=atol)


def perturbed_params(layer: Any, xp: Any, device: Any, seed: int = 0, scale: float = 0.3) -> Any:
    """The layer's init plus N(0, scale²) noise on every leaf: non-zero biases, and the parts a layer projects away."""
    params = layer.init(seed, xp=xp, device=device)
    leaves, spec = optree.tree_flatten(params)
    noise = [
        random.normal(1000 + seed + i, tuple(leaf.shape), xp=xp, device=device, scale=scale)
        for i, leaf in enumerate(leaves)
    ]
    return optree.tree_unflatten(spec, [leaf + n for leaf, n in zip(leaves, noise, strict=True)])


def random_input(xp: Any, device: Any, shape: tuple[int, ...], seed: int = 7, scale: float = 1.0) -> Any:
    """N(0, scale²) entries of the given shape (float64), the same numbers on every backend."""
    return random.normal(seed, shape, xp=xp, device=device, scale=scale)
