"""A Riemannian step taken in pieces (``chunk_bytes``) and written in place (``donate=True``).

An eager step on a backend with writable arrays cuts a group larger than ``chunk_bytes`` into pieces
(whole stacked leaves, or rows of a leaf's leading axis) and runs section, lift, an elementwise transform
and retraction on one piece at a time. Properties checked, on every backend where the path exists (not
JAX, whose arrays are immutable: there every group is whole, which is checked):

* the parameters and every array of the state equal the whole step's (``chunk_bytes=None``) to 1e-12 in
  float64 over three steps — the same batched kernels per frame, only the batch sizes differ — for Adam,
  momentum, gradient descent with a schedule and geoarray.torch's torch-style Adam, on a tree that mixes
  stacked frames, a leaf with two batch axes, a Grassmann group, a transported-section group and
  Euclidean leaves;
* the transform runs once per piece (a counting elementwise transform), so the path is the one taken;
* ``donate=False`` leaves the inputs unchanged; ``donate=True`` writes the new points and moments into the
  donated arrays and returns those very arrays for the cut groups;
* a non-finite gradient skips the step before anything is written, donated or not;
* a bad ``chunk_bytes`` is a ``ValueError`` naming it.

:class:`~geoarray.optim.ManifoldMuon` takes its Stiefel and Grassmann groups in the same pieces (momentum,
dual ascent, retraction and dual per piece): its parameters, buffers and duals equal the whole step's to
1e-12, donated or not, and ``donate=True`` writes them into the donated arrays; a non-finite gradient skips
before anything is written; through geoarray.torch its default (4 MiB) cuts a stack of GPT-2-sized frames and
the parameters keep their storage.
"""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import to_numpy
from geoarray import _backend, optim
from geoarray.manifolds import Grassmann, Stiefel
from geoarray.optim import transforms as T
from geoarray.optim.torch_rules import scale, scale_by_torch_adam

TOL = 1e-12  # float64: the pieces run the whole step's batched kernels on fewer frames


@pytest.fixture(autouse=True)
def _reads(host_reads_policy):
    # the pieces need the non-finite flag on the host (a masked step selects between whole states); the
    # array-api-strict session runs with host reads off, as a GPU would
    host_reads_policy("always")


def _tree(xp, device):
    """Stiefel(12, 3) frames: four stacked leaves of batch (2,), one leaf of batch (3, 2); a Grassmann(10, 2)
    leaf of batch (4,); a transported-section Stiefel(6, 2) leaf; two Euclidean leaves."""
    S, G, St = Stiefel(12, 3), Grassmann(10, 2), Stiefel(6, 2, section="transported")
    params = {
        "stack": [S.random(k, xp=xp, batch_shape=(2,), device=device) for k in range(4)],
        "deep": S.random(9, xp=xp, batch_shape=(3, 2), device=device),
        "grass": G.random(11, xp=xp, batch_shape=(4,), device=device),
        "moving": St.random(12, xp=xp, device=device),
        "w": [
            geoarray.random.normal(13, (5, 3), xp=xp, device=device),
            geoarray.random.normal(14, (4,), xp=xp, device=device),
        ],
    }
    mans = {"stack": [S] * 4, "deep": S, "grass": G, "moving": St, "w": [None, None]}
    return params, mans


def _grads(params, k):
    leaves, spec = optree.tree_flatten(params)
    xp = _backend.array_namespace(*leaves)
    out = [
        geoarray.random.normal(
            100 + 10 * k + i, tuple(x.shape), xp=xp, dtype=x.dtype, device=_backend.device(x), scale=0.1
        )
        for i, x in enumerate(leaves)
    ]
    return optree.tree_unflatten(spec, out)


def _host(tree):
    return [to_numpy(x) for x in optree.tree_leaves(tree)]


def _copy(tree, xp):
    return optree.tree_map(lambda a: xp.asarray(a, copy=True), tree)


#: the budget that cuts every group of _tree above: one frame of Stiefel(12, 3) in float64 is 288 bytes,
#: a stacked leaf of two frames 576, "deep"'s rows (two frames each) 576, a Grassmann frame 160
SMALL = 600


def _optimizers():
    return {
        "Adam": lambda cb: optim.Adam(lr=0.05, chunk_bytes=cb),
        "Momentum": lambda cb: optim.Momentum(lr=0.05, alpha=0.7, chunk_bytes=cb),
        "Gradient, schedule": lambda cb: optim.Gradient(
            lr=optim.schedules.exponential_decay(0.1, 0.01, 5), chunk_bytes=cb
        ),
        "torch-style Adam with decay": lambda cb: optim.RiemannianOptimizer(
            T.chain(scale_by_torch_adam(0.9, 0.999, 1e-8, weight_decay=0.01), scale(-0.05)), chunk_bytes=cb
        ),
    }


@pytest.mark.parametrize("name", list(_optimizers()))
@pytest.mark.parametrize("donate", [False, True], ids=["pure", "donated"])
def test_pieces_equal_the_whole_step(xp, device, backend, name, donate):
    make = _optimizers()[name]
    params, mans = _tree(xp, device)
    whole, cut = make(None), make(SMALL)
    sw, sc = whole.init(params, mans), cut.init(_copy(params, xp), mans)
    if not _backend.writable(xp):  # JAX: immutable arrays, no pieces: the same step as chunk_bytes=None
        assert backend.kind == "jax" and cut._pieces(sc.layout, optree.tree_leaves(params), sc, xp) is None
        return
    pw, pc = params, _copy(params, xp)
    for k in range(3):
        g = _grads(params, k)
        pw, sw = whole.update(pw, g, sw)
        pc, sc = cut.update(pc, g, sc, donate=donate)
    for a, b in zip(_host(pw), _host(pc), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=TOL)
    assert optree.tree_structure(sw) == optree.tree_structure(sc)
    for a, b in zip(_host(sw), _host(sc), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=TOL)
    assert int(sc.step) == 3 and int(sc.skipped) == 0


def _counting(transform, calls):
    def update(updates, state, params=None, **kw):
        calls.append(len(updates))
        return transform.update(updates, state, params, **kw)

    return transform._replace(update=update)


def test_the_transform_runs_once_per_piece(xp, device, backend):
    """Pieces of the budget: 4 stacked leaves → 4 pieces (two leaves do not fit in one), "deep" 3 rows of
    two frames → 3, Grassmann 4 frames → 2 pieces (3 frames, 480 bytes ≤ 600, and 1), the transported and
    Euclidean groups whole."""
    params, mans = _tree(xp, device)
    calls: list = []
    opt = optim.RiemannianOptimizer(
        _counting(T.chain(T.scale_by_adam(), T.scale_by_learning_rate(0.05)), calls), chunk_bytes=SMALL
    )
    state = opt.init(params, mans)
    opt.update(params, _grads(params, 0), state)
    groups = len(state.layout.groups)
    if not _backend.writable(xp):  # JAX: the whole step, one call for every group
        assert calls == [groups] and backend.kind == "jax"
        return
    assert calls == [1] * len(calls)  # one piece (or whole group) per call
    assert len(calls) == 4 + 3 + 2 + (groups - 3)


def test_donated_arrays_are_written_in_place(xp, device):
    params, mans = _tree(xp, device)
    opt = optim.Adam(lr=0.05, chunk_bytes=SMALL)
    state = opt.init(params, mans)
    before = _host(params)
    g = _grads(params, 0)
    new, _ = opt.update(params, g, state)  # pure: the inputs keep their values
    for a, b in zip(before, _host(params), strict=True):
        np.testing.assert_array_equal(a, b)
    if not _backend.writable(xp):
        pytest.skip("JAX arrays are immutable: donate=True changes nothing there (jax.jit donates instead)")
    stack = params["stack"]
    mu_before = state.inner[0].mu
    new, state2 = opt.update(params, g, state, donate=True)
    assert all(a is b for a, b in zip(new["stack"], stack, strict=True))  # the donated leaves themselves
    for a, b in zip(_host(new["stack"]), _host(stack), strict=True):
        np.testing.assert_array_equal(a, b)
    mu_after = state2.inner[0].mu
    g_stack = next(g for g, grp in enumerate(state.layout.groups) if len(grp.indices) == 4)
    assert mu_after[g_stack].B is mu_before[g_stack].B  # the moments written into the donated arrays
    assert float(xp.max(xp.abs(mu_after[g_stack].B))) > 0


def test_a_nonfinite_gradient_skips_before_anything_is_written(xp, device):
    params, mans = _tree(xp, device)
    opt = optim.Adam(lr=0.05, chunk_bytes=SMALL)
    state = opt.init(params, mans)
    params, state = opt.update(params, _grads(params, 0), state, donate=True)
    before = _host(params)
    g = _grads(params, 1)
    leaves, spec = optree.tree_flatten(g)
    leaves[-3] = leaves[-3] * float(
        "nan"
    )  # the last stacked Stiefel leaf (dict keys sort: deep, grass, moving, stack, w)
    with pytest.warns(optim.NonFiniteGradientWarning):
        new, state2 = opt.update(params, optree.tree_unflatten(spec, leaves), state, donate=True)
    for a, b in zip(before, _host(new), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_host(params), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(state2.skipped) == 1 and int(state2.step) == 1
    for a, b in zip(_host(state.inner), _host(state2.inner), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [0, -8, 1.5, True, "auto"])
def test_a_bad_chunk_bytes_is_refused(bad):
    with pytest.raises(ValueError, match="chunk_bytes must be a positive int"):
        optim.Adam(chunk_bytes=bad)


def test_a_donate_that_is_not_a_bool_is_refused_before_anything_is_written(xp, device):
    params, mans = _tree(xp, device)
    opt = optim.Adam(lr=0.05, chunk_bytes=SMALL)
    state = opt.init(params, mans)
    before = _host(params)
    with pytest.raises(TypeError, match="donate must be a bool"):
        opt.update(params, _grads(params, 0), state, donate="no")
    for a, b in zip(before, _host(params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_geoarray_torch_steps_in_pieces_in_place(gt, torch, monkeypatch):
    """geoarray.torch donates: with ``chunk_bytes`` small enough to cut its group (a param-group option, as
    torch's ``foreach``), gt.Adam takes its steps in pieces, writes the parameters and the moments in place
    (the same storage at every step) and ends where the whole step ends, to 1e-12 in float64; setting the
    group's key between steps takes effect at the next step, and a checkpoint written without the key loads
    with the default."""
    import importlib

    riemannian = importlib.import_module("geoarray.optim.riemannian")
    S = Stiefel(12, 3)
    pieces: list = []
    original = riemannian.RiemannianOptimizer._step_in_pieces

    def spy(self, *args, **kwargs):
        pieces.append(args[-1])  # donate
        return original(self, *args, **kwargs)

    monkeypatch.setattr(riemannian.RiemannianOptimizer, "_step_in_pieces", spy)

    def run(chunk_bytes, steps: int = 3, switch_off_at: int | None = None):
        params = [
            gt.ManifoldParameter(S.random(k, xp=torch, batch_shape=(2,), dtype=torch.float64), S) for k in range(4)
        ]
        opt = gt.Adam(params, lr=0.05, chunk_bytes=chunk_bytes)
        storage = []
        for k in range(steps):
            if k == switch_off_at:
                opt.param_groups[0]["chunk_bytes"] = None
            for i, p in enumerate(params):
                p.grad = 0.1 * torch.randn(p.shape, dtype=p.dtype, generator=torch.Generator().manual_seed(10 * k + i))
            opt.step()
            storage.append(([p.data_ptr() for p in params], opt.state[params[0]]["exp_avg"].B.data_ptr()))
        return [p.detach().clone() for p in params], storage, opt

    whole, _, _ = run("default")  # 4 leaves of 576 bytes: one piece at the default budget
    assert pieces == []
    cut, storage, opt = run(SMALL)
    assert pieces == [True, True, True]  # every step in pieces, donated
    assert storage[0] == storage[1] == storage[2]  # parameters and moments written in place
    for a, b in zip(whole, cut, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=TOL)
    pieces.clear()
    switched, _, _ = run(SMALL, switch_off_at=2)
    assert pieces == [True, True]  # the third step whole, as its group now says
    for a, b in zip(whole, switched, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=TOL)
    saved = opt.state_dict()
    assert saved["param_groups"][0]["chunk_bytes"] == SMALL
    del saved["param_groups"][0]["chunk_bytes"]  # a checkpoint from before the option
    params = [gt.ManifoldParameter(p.detach().clone(), S) for p in cut]
    fresh = gt.Adam(params, lr=0.05)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["chunk_bytes"] == "default"
    with pytest.raises(ValueError, match="chunk_bytes must be a positive int"):
        gt.Adam(params, chunk_bytes=0)


def _muon_tree(xp, device):
    """_tree without its transported-section leaf (ManifoldMuon has no sections): Stiefel stacks, a leaf of
    batch (3, 2), a Grassmann leaf and a Euclidean matrix."""
    params, mans = _tree(xp, device)
    for key in ("moving",):
        del params[key], mans[key]
    params["w"], mans["w"] = params["w"][0], None  # Muon takes matrices only
    return params, mans


@pytest.mark.parametrize("donate", [False, True], ids=["pure", "donated"])
def test_manifold_muon_in_pieces_equals_the_whole_step(xp, device, backend, donate):
    params, mans = _muon_tree(xp, device)
    whole, cut = optim.ManifoldMuon(lr=0.05, chunk_bytes=None), optim.ManifoldMuon(lr=0.05, chunk_bytes=SMALL)
    sw, sc = whole.init(params, mans), cut.init(_copy(params, xp), mans)
    cuts = cut._pieces(sc.layout, optree.tree_leaves(params), xp)
    if not _backend.writable(xp):  # JAX: immutable arrays, every group whole (the same step as chunk_bytes=None)
        assert backend.kind == "jax" and all(c == [None] for c in cuts)
        return
    assert sorted(len(c) for c in cuts) == [1, 2, 3, 4], cuts  # stack 4 pieces, deep 3, Grassmann 2, w whole
    pw, pc = params, _copy(params, xp)
    for k in range(3):
        g = _grads(params, k)
        pw, sw = whole.update(pw, g, sw)
        pc, sc = cut.update(pc, g, sc, donate=donate)
    assert optree.tree_structure(sw) == optree.tree_structure(sc)
    for a, b in zip(_host((pw, sw)), _host((pc, sc)), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=TOL)
    assert int(sc.step) == 3 and int(sc.skipped) == 0


def test_manifold_muon_donated_pieces_are_written_in_place_and_a_nonfinite_step_writes_nothing(xp, device):
    if not _backend.writable(xp):
        pytest.skip("JAX arrays are immutable: donate=True changes nothing there (jax.jit donates instead)")
    params, mans = _muon_tree(xp, device)
    opt = optim.ManifoldMuon(lr=0.05, chunk_bytes=SMALL)
    state = opt.init(params, mans)
    g_stack = next(g for g, grp in enumerate(state.layout.groups) if len(grp.indices) == 4)
    buf, dual, stack = state.buffers[g_stack], state.duals[g_stack], params["stack"]
    new, state2 = opt.update(params, _grads(params, 0), state, donate=True)
    assert all(a is b for a, b in zip(new["stack"], stack, strict=True))  # the donated leaves themselves
    assert state2.buffers[g_stack] is buf and state2.duals[g_stack] is dual
    assert float(xp.max(xp.abs(buf))) > 0
    before = _host((new, state2))
    g = _grads(new, 1)
    g["stack"][3] = g["stack"][3] * float("nan")
    with pytest.warns(optim.NonFiniteGradientWarning):
        new2, state3 = opt.update(new, g, state2, donate=True)
    after = _host((new2, state3._replace(skipped=state2.skipped)))
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(state3.skipped) == 1


@pytest.mark.parametrize("bad", [0, -8, 1.5, True, "auto"])
def test_manifold_muon_refuses_a_bad_chunk_bytes(bad):
    with pytest.raises(ValueError, match="chunk_bytes must be a positive int"):
        optim.ManifoldMuon(chunk_bytes=bad)


def test_geoarray_torch_manifold_muon_steps_a_stack_in_pieces_in_place(gt, torch):
    """gt.ManifoldMuon's groups carry ``chunk_bytes`` (default
    :data:`geoarray.optim.manifold_muon.DEFAULT_CHUNK_BYTES`): on a stack larger than the budget (18 frames of
    St(768, 64) in float32, 3.4 MiB, against 1 MiB) it steps in pieces, in place (the parameter keeps its
    storage), and equals the whole step to 1e-5 (float32)."""
    from geoarray.optim.manifold_muon import DEFAULT_CHUNK_BYTES

    S = Stiefel(768, 64)
    start = S.random(0, xp=torch, batch_shape=(18,), dtype=torch.float32)
    grad = 0.01 * torch.randn(start.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    out = {}
    for chunk_bytes in (None, 2**20):
        p = gt.ManifoldParameter(start.clone(), S)
        opt = gt.ManifoldMuon([p], lr=0.01, chunk_bytes=chunk_bytes)
        ptr = p.data_ptr()
        for _ in range(2):
            p.grad = grad.clone()
            opt.step()
        assert p.data_ptr() == ptr
        out[chunk_bytes] = p.detach()
    assert gt.ManifoldMuon([gt.ManifoldParameter(start.clone(), S)]).param_groups[0]["chunk_bytes"] == "default"
    assert DEFAULT_CHUNK_BYTES == 4 * 2**20
    assert float((out[None] - out[2**20]).abs().max()) < 1e-5
