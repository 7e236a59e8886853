"""Transforms that write into what they are handed (``update(..., donate=True)``), as torch.optim does.

A transform whose ``donates`` flag is set accepts ``donate=True``: the caller hands over the updates and the
state, and the transform writes its new moments where they are and its result into the updates' arrays
instead of allocating new ones (at GPT-2 small's Q/K/V a fresh array of a piece's size cost more in page
faults than the arithmetic itself; benchmarks/transformer_step.py). Properties checked, on every backend
(JAX has no writable arrays: there the same call returns new arrays):

* the donated update computes exactly the pure one: bitwise equal results and states over several steps,
  for the paper's Adam, torch's Adam (amsgrad, δ, coupled and decoupled weight decay, maximize) and
  learning rates, constant and scheduled, on plain arrays and on horizontal elements of g^hor;
* the moments are written in place (the state's arrays are the very ones handed over, on writable
  backends), and a chain hands a member's result on only after members that donate;
* a Riemannian step with ``donate=True`` never writes into the caller's gradients, also where a
  Euclidean leaf's lift is its gradient itself, whole or in pieces;
* ``apply_retraction(..., out=)`` writes the new point into ``out`` and returns it, equal to the point
  returned without ``out`` (bitwise in float64; in float32 to 2e-7, where the Björck step's product
  goes into ``out`` as Y·(I − ½E) instead of Y − ½·Y·E).
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import to_numpy
from geoarray import _backend, optim
from geoarray.manifolds import Stiefel
from geoarray.manifolds.horizontal import StiefelHorizontal
from geoarray.optim import torch_rules as R
from geoarray.optim import transforms as T


@pytest.fixture(autouse=True)
def _reads(host_reads_policy):
    host_reads_policy("always")  # the eager steps below read their counters and flags to the host


def _chains():
    return {
        "paper Adam": lambda: T.chain(T.scale_by_adam(), T.scale_by_learning_rate(1e-2)),
        "paper Adam, eps outside": lambda: T.chain(T.scale_by_adam(delta=0.0, eps=1e-8), T.scale_by_learning_rate(0.1)),
        "torch Adam, maximize": lambda: T.chain(R.scale(-1.0), R.scale_by_torch_adam(), T.scale_by_learning_rate(1e-2)),
        "torch Adam, amsgrad, delta, schedule": lambda: T.chain(
            R.scale_by_torch_adam(amsgrad=True, delta=1e-9, eps=1e-7),
            T.scale_by_learning_rate(lambda t: 1e-2 / (1.0 + t)),
        ),
        "torch AdamW": lambda: T.chain(
            R.scale_by_torch_adam(weight_decay=0.1, decoupled_weight_decay=True), T.scale_by_learning_rate(1e-2)
        ),
        "torch Adam, coupled decay": lambda: T.chain(R.scale_by_torch_adam(weight_decay=0.1), R.scale(-0.01)),
    }


def _tree(xp, device, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((2, 3, 3))
    return {
        "w": xp.asarray(rng.standard_normal((4, 3)), device=device),
        "h": StiefelHorizontal(
            xp.asarray(A - np.swapaxes(A, -1, -2), device=device),
            xp.asarray(rng.standard_normal((2, 5, 3)), device=device),
        ),
    }


def _copy(tree, xp):
    return optree.tree_map(lambda a: xp.asarray(a, copy=True), tree)


@pytest.mark.parametrize("name", list(_chains()))
def test_donated_update_equals_the_pure_one(xp, device, name):
    transform = _chains()[name]()
    assert transform.donates
    params = _tree(xp, device, 0)
    pure, given = transform.init(params), transform.init(_copy(params, xp))
    for k in range(4):
        g = _tree(xp, device, 10 + k)
        u_pure, pure = transform.update(g, pure, params)
        u_given, given = transform.update(_copy(g, xp), given, params, donate=True)
        for a, b in zip(optree.tree_leaves(u_pure), optree.tree_leaves(u_given), strict=True):
            np.testing.assert_array_equal(to_numpy(b), to_numpy(a))
    for a, b in zip(optree.tree_leaves(pure), optree.tree_leaves(given), strict=True):
        np.testing.assert_array_equal(to_numpy(b), to_numpy(a))


def test_donated_moments_are_written_where_they_are(xp, device):
    if not _backend.writable(xp):
        pytest.skip("JAX's arrays are immutable: a donated update returns new arrays (checked equal above)")
    transform = T.chain(R.scale_by_torch_adam(amsgrad=True), T.scale_by_learning_rate(1e-2))
    params = _tree(xp, device, 0)
    state = transform.init(params)
    before = [id(a) for a in optree.tree_leaves(state[0])]
    g = _tree(xp, device, 1)
    out, new = transform.update(g, state, params, donate=True)
    # the same array objects, now holding the new moments (count is a new 0-d array)
    assert [id(a) for a in optree.tree_leaves((new[0].exp_avg, new[0].exp_avg_sq, new[0].max_exp_avg_sq))] == before[1:]
    # the result was written into the handed-over updates: torch's Adam divides in the gradient's array
    assert [id(a) for a in optree.tree_leaves(out)] == [id(a) for a in optree.tree_leaves(g)]


def test_a_chain_donates_only_after_donating_members(xp, device):
    """A member that does not donate may return its own state as its result (momentum's trace): the
    members after it must not write into that, so the chain stops handing over there."""
    seen = []

    def spy(name, transform):
        def update(updates, state, params=None, **kw):
            seen.append((name, kw.get("donate", False)))
            return transform.update(updates, state, params, **kw)

        return transform._replace(update=update)

    chain = T.chain(
        spy("torch adam", R.scale_by_torch_adam()),
        spy("momentum", T.scale_by_momentum(0.5)),  # pure: returns its trace
        spy("rate", T.scale_by_learning_rate(1e-2)),
    )
    assert not chain.donates  # the Riemannian wrapper then never hands it over
    params = _tree(xp, device, 0)
    state = chain.init(params)
    _, new = chain.update(_tree(xp, device, 1), state, params, donate=True)
    assert seen == [("torch adam", True), ("momentum", False), ("rate", False)]
    trace = optree.tree_leaves(new[1])
    assert all(bool(xp.all(xp.isfinite(t))) for t in trace)


def _mixed(xp, device):
    S = Stiefel(12, 3)
    params = {
        "stack": S.random(0, xp=xp, batch_shape=(4,), device=device),
        "frame": S.random(1, xp=xp, device=device),
        "w": geoarray.random.normal(2, (5, 3), xp=xp, device=device),
    }
    return params, {"stack": S, "frame": S, "w": None}


_STEPS = {
    "Adam": lambda cb: optim.Adam(lr=0.05, chunk_bytes=cb),
    "torch Adam": lambda cb: optim.RiemannianOptimizer(
        T.chain(R.scale_by_torch_adam(), T.scale_by_learning_rate(0.05)), chunk_bytes=cb
    ),
}


@pytest.mark.parametrize("chunk_bytes", [None, 600], ids=["whole", "pieces"])
@pytest.mark.parametrize("name", list(_STEPS))
def test_a_donated_step_never_writes_into_the_gradients(xp, device, chunk_bytes, name):
    params, mans = _mixed(xp, device)
    opt = _STEPS[name](chunk_bytes)
    state = opt.init(params, mans)
    ref_params, ref_state = _copy(params, xp), opt.init(_copy(params, xp), mans)
    for k in range(3):
        leaves, spec = optree.tree_flatten(params)
        grads = spec.unflatten(
            [
                geoarray.random.normal(20 + 5 * k + i, tuple(a.shape), xp=xp, device=device, scale=0.1)
                for i, a in enumerate(leaves)
            ]
        )
        kept = [to_numpy(a).copy() for a in optree.tree_leaves(grads)]
        params, state = opt.update(params, grads, state, donate=True)
        ref_params, ref_state = opt.update(ref_params, grads, ref_state)
        for a, b in zip(kept, optree.tree_leaves(grads), strict=True):
            np.testing.assert_array_equal(to_numpy(b), a)
    for a, b in zip(optree.tree_leaves(ref_params), optree.tree_leaves(params), strict=True):
        np.testing.assert_allclose(to_numpy(b), to_numpy(a), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_apply_retraction_writes_into_out(xp, device, dtype_name):
    if not _backend.writable(xp):
        pytest.skip("JAX's arrays are immutable: there is no out to write into")
    dtype = getattr(xp, dtype_name)
    M = Stiefel(40, 5)
    Y = M.random(3, xp=xp, batch_shape=(6,), dtype=dtype, device=device)
    lam = M.global_section(Y)
    W = M.lift(Y, lam, geoarray.random.normal(4, tuple(Y.shape), xp=xp, dtype=dtype, device=device, scale=0.05))
    plain = M.apply_retraction(lam, W)
    out = xp.zeros_like(Y)
    written = M.apply_retraction(lam, W, out=out)
    assert written is out
    tol = 0.0 if dtype_name == "float64" else 2e-7
    np.testing.assert_allclose(to_numpy(out), to_numpy(plain), rtol=0, atol=tol)
    assert M.point_error(out) <= (1e-14 if dtype_name == "float64" else 1e-6)
    # the point's own memory may be the destination: the section has read it by then
    again = M.apply_retraction(lam, W, out=Y)
    assert again is Y
    np.testing.assert_allclose(to_numpy(Y), to_numpy(plain), rtol=0, atol=tol)


def test_a_whole_step_donates_from_a_size_on(xp, device):
    """Below ``DONATE_ENTRIES`` entries per group a whole step keeps its transform pure (strided in-place
    writes on small arrays cost more than the allocation they save); from it on, it hands them over —
    on backends with writable arrays only."""
    from geoarray.optim.riemannian import DONATE_ENTRIES

    seen = []
    inner = T.chain(R.scale_by_torch_adam(), T.scale_by_learning_rate(1e-2))

    def update(updates, state, params=None, **kw):
        seen.append(kw.get("donate", False))
        return inner.update(updates, state, params, **kw)

    opt = optim.RiemannianOptimizer(inner._replace(update=update), chunk_bytes=None)
    for frames, expected in ((4, False), (-(-DONATE_ENTRIES // (40 * 8)), True)):
        M = Stiefel(40, 8)
        params = {"w": M.random(0, xp=xp, batch_shape=(frames,), device=device)}
        state = opt.init(params, {"w": M})
        grads = {"w": geoarray.random.normal(1, tuple(params["w"].shape), xp=xp, device=device, scale=0.1)}
        seen.clear()
        opt.update(params, grads, state, donate=True)
        assert seen == [expected and _backend.writable(xp)], (frames, seen)


def test_apply_retraction_refuses_a_bad_out(xp, device):
    """A wrong shape or dtype is a ValueError naming ``out`` (nothing written); on JAX, whose arrays are
    immutable, any ``out`` is a TypeError saying to use the returned point."""
    M = Stiefel(20, 4)
    Y = M.random(3, xp=xp, batch_shape=(2,), device=device)
    lam = M.global_section(Y)
    W = M.lift(Y, lam, geoarray.random.normal(4, tuple(Y.shape), xp=xp, device=device, scale=0.05))
    if not _backend.writable(xp):
        with pytest.raises(TypeError, match="immutable"):
            M.apply_retraction(lam, W, out=xp.zeros_like(Y))
        return
    wrong = xp.zeros((2, 20, 5), dtype=Y.dtype, device=device)
    with pytest.raises(ValueError, match="out must be"):
        M.apply_retraction(lam, W, out=wrong)
    assert not bool(xp.any(wrong != 0))
    with pytest.raises(ValueError, match="dtype"):
        M.apply_retraction(lam, W, out=xp.zeros(tuple(Y.shape), dtype=xp.float32, device=device))
