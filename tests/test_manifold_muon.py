"""Muon and manifold Muon as optimizers: one step is the spectral direction's polar retraction, long runs stay
on the manifold and converge, Euclidean matrices get Muon, bad leaves are refused, partition composes them."""

from __future__ import annotations

import numpy as np
import optree
import pytest

import geoarray
from _helpers import assert_agree, assert_close, to_numpy
from geoarray import linalg, optim
from geoarray.manifolds import Grassmann, Stiefel, SymplecticStiefel
from geoarray.optim.muon import manifold_muon_step, muon


def _sym_pd(seed, N, xp, device):
    A = geoarray.random.normal(seed, (N, N), xp=xp, device=device)
    return A @ A.T / N


@pytest.mark.parametrize("kind", [Stiefel, Grassmann])
def test_one_step_without_momentum_is_the_polar_retraction_of_the_spectral_direction(xp, device, kind):
    M = kind(10, 3)
    Y = M.random(0, xp=xp, batch_shape=(2,), device=device)
    G = geoarray.random.normal(1, (2, 10, 3), xp=xp, device=device)
    opt = optim.ManifoldMuon(lr=0.05, momentum=0.0, nesterov=False, dual_iterations=50)
    new, _ = opt.update({"Y": Y}, {"Y": G}, opt.init({"Y": Y}, {"Y": M}))
    A = M.spectral_direction(Y, G, n_iter=50)[0] if kind is Stiefel else M.spectral_direction(Y, G)
    assert_close(new["Y"], linalg.polar(Y - 0.05 * A, method="eigh"), xp=xp, atol=1e-12)
    ref, _, _ = manifold_muon_step(M, Y, G, None, lr=0.05, n_iter=50)
    assert_close(new["Y"], ref, xp=xp, atol=1e-12)


@pytest.mark.parametrize("retraction", ["polar", "cayley"])
def test_manifold_muon_on_brockett_stays_orthonormal_and_converges(xp, device, retraction):
    """400 steps of −tr(YᵀSY) on St(10, 3): max|YᵀY − I| ≤ 1e-12 and the cost within 2% of the optimum
    (a fixed spectral step length η = 0.01 cannot settle closer than O(η))."""
    M = Stiefel(10, 3)
    S = _sym_pd(2, 10, xp, device)
    params = {"Y": M.random(0, xp=xp, device=device)}
    opt = optim.ManifoldMuon(lr=0.01, retraction=retraction)
    state = opt.init(params, {"Y": M})
    for _ in range(400):
        params, state = opt.update(params, {"Y": -2 * S @ params["Y"]}, state)
    Y = to_numpy(params["Y"])
    best = np.sort(np.linalg.eigvalsh(to_numpy(S)))[-3:].sum()
    assert np.abs(Y.T @ Y - np.eye(3)).max() <= 1e-12
    assert best - np.trace(Y.T @ to_numpy(S) @ Y) <= 0.02 * best


def test_euclidean_matrices_get_muon(xp, device):
    """The optimizer's Euclidean step equals θ + muon(...).update, the transform checked against torch's
    algorithm in tests/test_muon.py."""
    W = geoarray.random.normal(0, (6, 4), xp=xp, device=device)
    opt = optim.Muon(lr=0.02, weight_decay=0.1)
    tx = muon(lr=0.02, weight_decay=0.1)
    p, state = {"W": W}, opt.init({"W": W}, None)
    q, s = (W,), tx.init((W,))
    for t in range(3):
        g = geoarray.random.normal(10 + t, (6, 4), xp=xp, device=device)
        p, state = opt.update(p, {"W": g}, state)
        u, s = tx.update((g,), s, q)
        q = (q[0] + u[0],)
    assert_close(p["W"], q[0], xp=xp, atol=1e-14)


def test_bad_leaves_are_refused_naming_them(xp, device):
    b = xp.zeros(3, device=device)
    with pytest.raises(ValueError, match=r"params\['b'\] has shape \(3,\); Muon acts on matrices only.*partition"):
        optim.Muon().init({"b": b}, None)
    M = Stiefel(5, 2)
    Y = M.random(0, xp=xp, device=device)
    with pytest.raises(ValueError, match=r"params\['Y'\] lives on Stiefel\(5, 2\).*use ManifoldMuon"):
        optim.Muon().init({"Y": Y}, {"Y": M})
    Sp = SymplecticStiefel(4, 2)
    with pytest.raises(ValueError, match="ManifoldMuon supports Stiefel and Grassmann"):
        optim.ManifoldMuon().init({"S": Sp.random(0, xp=xp, device=device)}, {"S": Sp})
    with pytest.raises(ValueError, match="retraction must be one of"):
        optim.ManifoldMuon(retraction="qr")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="dual_iterations must be a non-negative int"):
            optim.ManifoldMuon(dual_iterations=bad)
    for cls in (optim.ManifoldMuon, optim.Muon):
        with pytest.raises(ValueError, match="lr must be a non-negative finite number"):
            cls(lr=-1e-3)
    from geoarray.manifolds.spectral import stiefel_spectral_step

    G = geoarray.random.normal(1, (5, 2), xp=xp, device=device)
    for bad, message in ((-1e-3, "got -0.001"), (True, "or a 0-d array, got True"), (None, "got None")):
        with pytest.raises(ValueError, match=rf"lr must be a non-negative number.*{message}"):
            stiefel_spectral_step(Y, G, lr=bad)


@pytest.mark.parametrize("lr", [1e-2, 0.3], ids=["series", "eigh"])
def test_a_schedule_steps_as_the_optimizers_built_at_its_rates(xp, device, lr):
    """``lr`` may be a schedule of t = 1, 2, … (:mod:`geoarray.optim.schedules`): four steps equal those of
    optimizers built at each step's rate, the state carried (AGREE_RTOL: a rate held in an array picks the
    retraction's series degree where it lives, a number on the host), on a Stiefel, a Grassmann and a
    Euclidean matrix leaf; ``lr`` 0.3 takes the ``eigh`` route (beyond the series' degrees)."""
    S, Gr = Stiefel(8, 3), Grassmann(7, 2)
    params = {"S": S.random(0, xp=xp, device=device), "G": Gr.random(1, xp=xp, device=device)}
    params["E"] = geoarray.random.normal(2, (5, 4), xp=xp, device=device)
    mans = {"S": S, "G": Gr, "E": None}
    schedule = optim.schedules.exponential_decay(lr, lr / 4, 3)
    opt = optim.ManifoldMuon(lr=schedule, weight_decay=0.1)
    p, q = params, params
    state = opt.init(p, mans)
    ref_state = optim.ManifoldMuon(lr=lr, weight_decay=0.1).init(q, mans)
    for t in range(4):
        g = {
            k: geoarray.random.normal(10 + 3 * t + i, tuple(v.shape), xp=xp, device=device)
            for i, (k, v) in enumerate(params.items())
        }
        p, state = opt.update(p, g, state)
        rate = float(to_numpy(schedule(xp.asarray(float(t + 1), device=device))))
        q, ref_state = optim.ManifoldMuon(lr=rate, weight_decay=0.1).update(q, g, ref_state)
        for k in params:
            assert_agree(p[k], q[k], what=f"{k}, step {t}")
    assert S.is_point(p["S"], atol=1e-12) and Gr.is_point(p["G"], atol=1e-12)


def test_a_large_drift_is_removed_in_two_steps(xp, device):
    """The series for (XᵀX)^{-1/2} is exact to rounding only while ‖YᵀY − I‖ ≲ √ε; a larger drift d is
    reduced to O((2d)^{k+1}) by one step and to rounding by the next (d = 1e-2, lr = 1e-3: degree 2)."""
    from geoarray.manifolds.spectral import stiefel_spectral_step

    Y = Stiefel(30, 5).random(0, xp=xp, device=device) * (1 + 1e-2)
    G = geoarray.random.normal(1, (30, 5), xp=xp, device=device)
    errors, P = [], None
    for _ in range(2):
        Y, P = stiefel_spectral_step(Y, G, lr=1e-3, P0=P, n_iter=1)
        errors.append(float(np.abs(to_numpy(xp.matrix_transpose(Y) @ Y) - np.eye(5)).max()))
    assert errors[0] < 1e-4
    assert errors[1] < 1e-13


@pytest.mark.parametrize("dual_iterations", [0, 1, 3])
def test_the_dual_variable_is_carried_between_steps(xp, device, dual_iterations):
    """ManifoldMuon (momentum 0) over three steps equals chaining ``manifold_muon_step`` by hand with the
    returned P passed back in: the state's dual warm-starts the next step, for any number of iterations."""
    M = Stiefel(9, 3)
    Y = M.random(3, xp=xp, batch_shape=(2,), device=device)
    opt = optim.ManifoldMuon(lr=0.03, momentum=0.0, nesterov=False, dual_iterations=dual_iterations)
    params, state = {"Y": Y}, opt.init({"Y": Y}, {"Y": M})
    Y_ref, P = Y, None
    for t in range(3):
        G = geoarray.random.normal(20 + t, (2, 9, 3), xp=xp, device=device)
        params, state = opt.update(params, {"Y": G}, state)
        Y_ref, _, P = manifold_muon_step(M, Y_ref, G, P, lr=0.03, n_iter=dual_iterations)
        assert_close(params["Y"], Y_ref, xp=xp, atol=1e-13)
        assert_close(state.duals[0], P, xp=xp, atol=1e-13)


def test_partition_of_manifold_muon_and_adam(xp, device, backend):
    """The ViT recipe: Stiefel leaves with ManifoldMuon, the rest with Adam; the state is a pytree of arrays
    and the step jits on JAX."""
    M = Stiefel(8, 2)
    params = {
        "q": M.random(0, xp=xp, batch_shape=(3,), device=device),
        "w": geoarray.random.normal(1, (4, 4), xp=xp, device=device),
        "b": xp.zeros(4, device=device),
    }
    mans = {"q": M, "w": None, "b": None}
    labels = {"q": "muon", "w": "adam", "b": "adam"}
    opt = optim.partition({"muon": optim.ManifoldMuon(lr=0.01), "adam": optim.Adam(1e-2)}, labels)
    state = opt.init(params, mans)
    assert all(hasattr(x, "shape") for x in optree.tree_leaves(state))
    update = opt.update
    if backend.kind == "jax":
        import jax

        update = jax.jit(opt.update)
    S = _sym_pd(3, 8, xp, device)
    for _ in range(5):
        grads = {"q": -2 * S @ params["q"], "w": params["w"] - 1, "b": params["b"] + 1}
        params, state = update(params, grads, state)
    assert M.is_point(params["q"], atol=1e-12)
    assert float(to_numpy(xp.max(xp.abs(params["b"] + 1)))) < 1.0


@pytest.mark.parametrize("n_iter", [0, 2, 30])
def test_compressed_polar_step_equals_the_generic_path(xp, device, n_iter):
    """``stiefel_spectral_step`` (the polar retraction assembled from n×n blocks, ManifoldMuon's fast path)
    equals the generic route polar(Y − lr·A) on N×n with A, P from ``stiefel_spectral_direction``, to 1e-12
    (and the step without ``return_direction`` equals the step with it to 1e-13):
    batched, warm-started from a random symmetric P0, for learning rates whose (XᵀX)^{-1/2} is the series of
    degree 4 and 8 and the eigh (lr = 0.003, 0.07, 0.4 in float64), and for a Y that has drifted off the
    manifold (YᵀY = (1 + 1e-6)²I, which the N×n polar removes and so must the compressed one)."""
    from geoarray.manifolds.spectral import _series_degree, stiefel_spectral_direction, stiefel_spectral_step

    M = Stiefel(12, 4)
    Y = M.random(0, xp=xp, batch_shape=(3,), device=device)
    G = geoarray.random.normal(1, (3, 12, 4), xp=xp, device=device)
    B = geoarray.random.normal(2, (3, 4, 4), xp=xp, device=device)
    P0 = 0.1 * (B + xp.matrix_transpose(B))
    eps = float(np.finfo(np.float64).eps)
    assert [_series_degree(lr, eps) for lr in (0.003, 0.07, 0.4)] == [4, 8, None]
    for lr in (0.003, 0.07, 0.4):
        for Yk in (Y, Y * (1 + 1e-6)):
            A, P = stiefel_spectral_direction(Yk, G, P0=P0, n_iter=n_iter)
            Y1, A1, P1 = stiefel_spectral_step(Yk, G, lr=lr, P0=P0, n_iter=n_iter, return_direction=True)
            assert_close(Y1, linalg.polar(Yk - lr * A, method="eigh"), xp=xp, atol=1e-12)
            assert_close(A1, A, xp=xp, atol=1e-12)
            assert_close(P1, P, xp=xp, atol=1e-12)
            # without return_direction: the same point, but on JAX another compiled program (the direction's
            # outputs dropped), which XLA may fuse and contract into FMAs differently; so to 1e-13 (|Y| ≤ 1),
            # not bit for bit — still far below any change of the step itself
            Y0 = stiefel_spectral_step(Yk, G, lr=lr, P0=P0, n_iter=n_iter)[0]
            assert_close(Y0, Y1, xp=xp, atol=1e-13)
    assert M.is_point(Y1, atol=1e-12)


def _muon_problem(xp, device):
    M = Stiefel(10, 3)
    params = {"Y": M.random(0, xp=xp, device=device), "W": geoarray.random.normal(1, (4, 3), xp=xp, device=device)}
    grads = {"Y": geoarray.random.normal(2, (10, 3), xp=xp, device=device), "W": params["W"] * 0.5}
    return params, {"Y": M, "W": None}, grads


@pytest.mark.parametrize("host_reads", ["cpu", "never"])
def test_a_non_finite_gradient_is_skipped_and_counted(xp, device, host_reads):
    """ManifoldMuon (and Muon, its subclass) skip a step with a NaN gradient like the Riemannian optimizers:
    parameters, buffers, duals and the Muon state unchanged bit for bit, state.skipped = 1, the step
    counter unchanged; eager with host reads it warns once, without host reads (a GPU) it counts only;
    the next finite step equals the one taken as if the bad one never came."""
    import warnings

    params, mans, grads = _muon_problem(xp, device)
    previous = geoarray.set_host_reads(host_reads)
    try:
        opt = optim.ManifoldMuon(lr=0.05)
        state = opt.init(params, mans)
        params, state = opt.update(params, grads, state)
        bad = {"Y": grads["Y"], "W": grads["W"] * float("nan")}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            same, skipped = opt.update(params, bad, state)
        warned = [w for w in caught if issubclass(w.category, optim.NonFiniteGradientWarning)]
        # "cpu" reads (and so warns) where the arrays live in host memory, not on a GPU
        assert len(warned) == (1 if geoarray._backend.host_reads_allowed(grads["W"]) else 0)
        assert int(skipped.skipped) == 1 and int(skipped.step) == int(state.step)
        for a, b in zip(optree.tree_leaves((same, skipped._replace(skipped=state.skipped))),
                        optree.tree_leaves((params, state)), strict=True):  # fmt: skip
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
        after, _ = opt.update(params, grads, skipped)
        direct, _ = opt.update(params, grads, state)
        for a, b in zip(optree.tree_leaves(after), optree.tree_leaves(direct), strict=True):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    finally:
        geoarray.set_host_reads(previous)


def test_on_nonfinite_raise_and_ignore(xp, device):
    """``"raise"`` names the leaf and changes nothing; ``"ignore"`` lets NaN through (torch.optim.Muon's
    behaviour); a bad policy is refused naming it."""
    params, mans, grads = _muon_problem(xp, device)
    bad = {"Y": grads["Y"], "W": grads["W"] * float("nan")}
    opt = optim.Muon(lr=0.05, on_nonfinite="raise")
    state = opt.init({"W": params["W"]})
    with pytest.raises(FloatingPointError, match=r"non-finite gradient for params\['W'\]"):
        opt.update({"W": params["W"]}, {"W": bad["W"]}, state)
    loose = optim.ManifoldMuon(lr=0.05, on_nonfinite="ignore")
    out, _ = loose.update(params, bad, loose.init(params, mans))
    assert np.isnan(to_numpy(out["W"])).all() and np.isfinite(to_numpy(out["Y"])).all()
    with pytest.raises(ValueError, match="on_nonfinite must be one of"):
        optim.ManifoldMuon(on_nonfinite="drop")


class _FramesWithDual(Grassmann):
    """A Grassmann manifold to which a test gives its own manifold-Muon step and dual (the extension point)."""


def test_a_manifold_joins_manifold_muon_by_registering_its_step(xp, device):
    """``register_manifold_muon`` is how a manifold joins ManifoldMuon: the
    optimizer then accepts its leaves, keeps a zero dual of the registered shape, and calls the registered
    step with the momentum buffer (momentum 0: the gradient), the rate and the dual; a manifold without a
    registered step (symplectic Stiefel) is refused with the pointer to ``partition``."""
    from geoarray.optim.muon import register_manifold_muon, supports_manifold_muon

    calls = []

    def step(manifold, Y, G, P, *, lr, n_iter, retraction, return_direction):
        calls.append((G, P, lr))
        return Y, None, P + 1.0

    register_manifold_muon(_FramesWithDual, step, dual_shape=lambda m: (2,))
    with pytest.raises(TypeError, match="manifold class"):
        register_manifold_muon(_FramesWithDual(5, 2), step)
    M = _FramesWithDual(5, 2)
    assert (
        supports_manifold_muon(M) and supports_manifold_muon(Stiefel(5, 2)) and supports_manifold_muon(Grassmann(5, 2))
    )
    assert not supports_manifold_muon(SymplecticStiefel(4, 2))
    Y = M.random(0, xp=xp, batch_shape=(3,), device=device)
    G = geoarray.random.normal(1, (3, 5, 2), xp=xp, device=device)
    opt = optim.ManifoldMuon(lr=0.25, momentum=0.0, nesterov=False)
    state = opt.init({"Y": Y}, {"Y": M})
    assert tuple(state.duals[0].shape) == (3, 2) and float(np.abs(to_numpy(state.duals[0])).max()) == 0.0
    new, state = opt.update({"Y": Y}, {"Y": G}, state)
    assert len(calls) == 1 and calls[0][2] == 0.25
    assert_close(new["Y"], Y, xp=xp, atol=0.0)  # the registered step's point
    assert_close(calls[0][0], G, xp=xp, atol=0.0)
    assert_close(state.duals[0], xp.ones((3, 2), dtype=Y.dtype, device=device), xp=xp, atol=0.0)
    S = SymplecticStiefel(4, 2)
    with pytest.raises(ValueError, match="partition"):
        opt.init({"Z": S.random(0, xp=xp, device=device)}, {"Z": S})


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_precision_manifold_leaves_step_in_float32(xp, device, backend, name):
    """float16/bfloat16 weights, as for the Riemannian optimizers: the manifold leaves' momentum and dual
    are float32 and the step runs in float32 (``eigh`` has no half-precision kernel: torch's step raised
    NotImplementedError), the weights come back in their own dtype, orthonormal to their own rounding after
    150 steps of the Brockett cost on St(12, 3) and within 3 % of its optimum; a Euclidean matrix leaf keeps
    Muon's buffer in its own dtype (Newton–Schulz chooses its own precision, as torch's Muon)."""
    dtype = getattr(xp, name, None)  # NumPy and CuPy have no bfloat16, array-api-strict neither half type
    if dtype is None:
        pytest.skip(f"{backend.kind} has no {name}")
    M, Gr = Stiefel(12, 3), Grassmann(7, 2)
    S = _sym_pd(2, 12, xp, device)
    Sh = xp.astype(S, dtype)
    params = {
        "Y": xp.astype(M.random(0, xp=xp, device=device), dtype),
        "G": xp.astype(Gr.random(1, xp=xp, device=device), dtype),
        "E": xp.astype(geoarray.random.normal(3, (5, 4), xp=xp, device=device), dtype),
    }
    mans = {"Y": M, "G": Gr, "E": None}
    opt = optim.ManifoldMuon(lr=0.01)
    state = opt.init(params, mans)
    kept = {type(g.manifold).__name__: b.dtype for g, b in zip(state.layout.groups, state.buffers, strict=True)}
    assert kept == {"Euclidean": dtype, "Grassmann": xp.float32, "Stiefel": xp.float32}, kept
    duals = [d for d in state.duals if hasattr(d, "dtype")]
    assert duals and all(d.dtype == xp.float32 for d in duals), "the Stiefel dual is float32"
    for _ in range(150):
        grads = {"Y": -2 * Sh @ params["Y"], "G": params["G"], "E": params["E"]}
        params, state = opt.update(params, grads, state)
    assert all(params[k].dtype == dtype for k in params)
    for k, m in (("Y", M), ("G", Gr)):
        Y32 = xp.astype(params[k], xp.float32)
        err = float(to_numpy(xp.max(xp.abs(xp.matrix_transpose(Y32) @ Y32 - linalg.eye(m.point_shape[1], Y32)))))
        assert err <= m.default_atol(dtype, xp), f"{k}: max |YᵀY − I| = {err:.1e}"
    Y = to_numpy(xp.astype(params["Y"], xp.float64))
    best = np.sort(np.linalg.eigvalsh(to_numpy(S)))[-3:].sum()
    assert best - np.trace(Y.T @ to_numpy(S) @ Y) <= 0.03 * best
