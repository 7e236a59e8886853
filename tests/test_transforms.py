"""Optimizers as chains of vector-space transforms inside the Riemannian wrapper (Algorithm 1).

Every backend, float64: the convenience optimizers reproduce the numbers of the first implementation and
equal their explicit chains; clipping and weight decay compose with manifold leaves and keep them on their
manifolds; the state is an ordinary pytree of arrays (optree, jax.tree_util, torch.utils._pytree); optax
transforms run inside the wrapper; checkpoints are versioned, atomic and refuse damaged or foreign files.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import optree
import pytest

import _optim_reference as ref
import geoarray
from _helpers import assert_close, to_numpy
from geoarray import optim
from geoarray.manifolds import Grassmann, Manifold, Stiefel, SymplecticStiefel
from geoarray.optim import (
    add_decayed_weights,
    chain,
    clip_by_global_norm,
    global_norm,
    riemannian,
    scale_by_adam,
    scale_by_bfgs,
    scale_by_learning_rate,
    scale_by_momentum,
)

# ---------------------------------------------------------------------------------------------
# the convenience optimizers: same numbers as before, and equal to their chains
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ref.optimizers()))
def test_convenience_optimizers_reproduce_the_first_implementation(xp, device, name):
    """Six steps on Stiefel, Grassmann, symplectic Stiefel and Euclidean leaves equal the stored outputs of
    the single-class driver the transforms replaced (tests/data/optim_reference_v0.npz) to 1e-12."""
    stored = np.load(ref.PATH)
    opt, section = ref.optimizers()[name]
    out = ref.run(opt, section, xp, device)
    paths, leaves, _ = optree.tree_flatten_with_path(out)
    for path, leaf in zip(paths, leaves, strict=True):
        assert_close(leaf, stored[ref.key(name, path)], xp=xp, device=device, atol=1e-12, err_msg=ref.key(name, path))


def _explicit_chains():
    return {
        "gradient": (optim.Gradient(0.05), riemannian(scale_by_learning_rate(0.05))),
        "momentum": (
            optim.Momentum(0.05, alpha=0.7),
            riemannian(chain(scale_by_momentum(0.7), scale_by_learning_rate(0.05))),
        ),
        "adam": (
            optim.Adam(0.02, beta1=0.85, beta2=0.97, delta=1e-6, eps=1e-8),
            riemannian(chain(scale_by_adam(0.85, 0.97, delta=1e-6, eps=1e-8), scale_by_learning_rate(0.02))),
        ),
        "adam_decay": (
            optim.AdamWithDecay(n_steps=4, lr_start=0.05, lr_end=0.005),
            riemannian(
                chain(scale_by_adam(), scale_by_learning_rate(optim.schedules.exponential_decay(0.05, 0.005, 4)))
            ),
        ),
        "bfgs": (optim.BFGS(0.05), riemannian(scale_by_bfgs(0.05), section="transported", group_same_shape=False)),
    }


@pytest.mark.parametrize("name", sorted(_explicit_chains()))
def test_each_convenience_optimizer_equals_its_explicit_chain(xp, device, name):
    convenience, explicit = _explicit_chains()[name]
    a = ref.run(convenience, "householder", xp, device)
    b = ref.run(explicit, "householder", xp, device)
    for x, y in zip(optree.tree_leaves(a), optree.tree_leaves(b), strict=True):
        assert_close(x, y, xp=xp, atol=1e-13)


def test_grouped_equals_ungrouped(xp, device):
    """Grouping (the default) stacks same-shaped manifold leaves and ravels Euclidean ones: same numbers."""
    a = ref.run(optim.Adam(0.02, group_same_shape=True), "householder", xp, device)
    b = ref.run(optim.Adam(0.02, group_same_shape=False), "householder", xp, device)
    for x, y in zip(optree.tree_leaves(a), optree.tree_leaves(b), strict=True):
        assert_close(x, y, xp=xp, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# clipping and weight decay on manifold leaves
# ---------------------------------------------------------------------------------------------


def test_global_norm_of_a_lift_is_the_canonical_metric(xp, device):
    """‖global_rep(λ, Δ)‖ of g^hor = √g_Y(Δ, Δ) for Stiefel (eq. 3) and Grassmann, batched."""
    for M in (Stiefel(9, 3), Grassmann(9, 3)):
        Y = M.random(0, xp=xp, batch_shape=(4,), device=device)
        D = M.rgrad(Y, geoarray.random.normal(1, (4, 9, 3), xp=xp, device=device))
        lifted = M.global_rep(M.global_section(Y), D)
        want = xp.sqrt(xp.sum(M.metric(Y, D, D)))
        assert_close(global_norm((lifted, xp.zeros(2, device=device))), want, xp=xp, rtol=1e-13)


def test_clip_by_global_norm_on_horizontal_elements(xp, device):
    M = Stiefel(8, 2)
    Y = M.random(0, xp=xp, batch_shape=(3,), device=device)
    B = M.global_rep(M.global_section(Y), M.rgrad(Y, geoarray.random.normal(1, (3, 8, 2), xp=xp, device=device)))
    tree = {"B": B, "w": geoarray.random.normal(2, (5,), xp=xp, device=device)}
    norm = float(to_numpy(global_norm(tree)))
    clip = clip_by_global_norm(0.25 * norm)
    clipped, _ = clip.update(tree, clip.init(tree))
    assert_close(global_norm(clipped), xp.asarray(0.25 * norm, device=device), xp=xp, rtol=1e-13)
    assert_close(clipped["B"].A, 0.25 * B.A, xp=xp, atol=1e-15)  # a pure rescaling: still skew, still horizontal
    loose = clip_by_global_norm(2 * norm)
    same, _ = loose.update(tree, loose.init(tree))
    for x, y in zip(optree.tree_leaves(same), optree.tree_leaves(tree), strict=True):
        assert_close(x, y, xp=xp, atol=0)


def test_clipped_adam_keeps_every_manifold_leaf_on_its_manifold(xp, device):
    params, mans = ref.problem(xp, device)
    opt = riemannian(chain(clip_by_global_norm(0.1), scale_by_adam(), scale_by_learning_rate(0.5)))
    state = opt.init(params, mans)
    for t in range(1, 6):
        params, state = opt.update(params, ref.grads_at(params, t, xp, device), state)
    for M, Y in ((mans["heads"][0], params["heads"][0]), (mans["sub"], params["sub"]), (mans["sp"], params["sp"])):
        assert M.is_point(Y, atol=1e-12), M


def test_clipping_bounds_the_velocity(xp, device):
    """With clipping after the learning-rate scale, one Gradient step moves Y by at most the clip norm
    along the geodesic: ‖W‖ = min(η‖B‖, c), and the retraction of a clipped W equals exp(W)E."""
    M = Stiefel(10, 3)
    Y = M.random(0, xp=xp, device=device)
    G = geoarray.random.normal(1, (10, 3), xp=xp, device=device)
    c = 1e-3
    opt = riemannian(chain(scale_by_learning_rate(1.0), clip_by_global_norm(c)))
    new, _ = opt.update({"Y": Y}, {"Y": G}, opt.init({"Y": Y}, {"Y": M}))
    D = M.rgrad(Y, G)
    scale = c / float(np.sqrt(to_numpy(M.metric(Y, D, D))))
    want = geoarray.linalg.expm(-scale * M.omega(Y, D)) @ Y
    assert_close(new["Y"], want, xp=xp, atol=1e-14)


def test_weight_decay_on_manifold_and_euclidean_leaves(xp, device):
    """add_decayed_weights sees a manifold leaf as the lift of grad ½‖Y‖², which vanishes on Stiefel and
    Grassmann (‖Y‖_F is constant there): decayed Adam equals plain Adam on those leaves, while a Euclidean
    leaf gets L2 decay (with gradient zero and one Gradient step: w ← w − η·λ·w)."""
    params, mans = ref.problem(xp, device)
    params = {k: v for k, v in params.items() if k != "sp"}
    mans = {k: v for k, v in mans.items() if k != "sp"}
    plain = riemannian(chain(scale_by_adam(), scale_by_learning_rate(0.02)))
    decayed = riemannian(chain(scale_by_adam(), add_decayed_weights(0.1), scale_by_learning_rate(0.02)))
    p1, p2 = params, params
    s1, s2 = plain.init(p1, mans), decayed.init(p2, mans)
    for t in range(1, 4):
        p1, s1 = plain.update(p1, ref.grads_at(p1, t, xp, device), s1)
        p2, s2 = decayed.update(p2, ref.grads_at(p2, t, xp, device), s2)
    for key in ("heads", "sub"):
        for x, y in zip(optree.tree_leaves(p1[key]), optree.tree_leaves(p2[key]), strict=True):
            assert_close(x, y, xp=xp, atol=1e-13)
    assert Stiefel(9, 3).is_point(p2["heads"][1], atol=1e-13)
    # Euclidean decay, checked on its own
    opt = riemannian(chain(add_decayed_weights(0.1), scale_by_learning_rate(0.5)))
    w = {"w": params["w"]}
    new, _ = opt.update(w, {"w": xp.zeros_like(params["w"])}, opt.init(w))
    assert_close(new["w"], (1 - 0.5 * 0.1) * params["w"], xp=xp, atol=1e-15)


def test_weight_decay_on_symplectic_stiefel_stays_on_the_manifold(xp, device):
    """On SpSt(2N, 2n) ‖Y‖_F is not constant, so the decay is a genuine tangent direction; it still
    retracts onto the manifold and lowers ‖Y‖_F."""
    M = SymplecticStiefel(8, 4)
    Y = M.random(3, xp=xp, device=device)
    opt = riemannian(chain(add_decayed_weights(1.0), scale_by_learning_rate(0.05)))
    p, state = {"Y": Y}, opt.init({"Y": Y}, {"Y": M})
    for _ in range(5):
        p, state = opt.update(p, {"Y": xp.zeros_like(Y)}, state)
    assert M.is_point(p["Y"], atol=1e-11)
    assert float(to_numpy(xp.sum(p["Y"] ** 2))) < float(to_numpy(xp.sum(Y**2)))


# ---------------------------------------------------------------------------------------------
# the state is an ordinary pytree
# ---------------------------------------------------------------------------------------------


def _is_array(x, xp):
    return geoarray.array_namespace(x) is not None and hasattr(x, "shape") and hasattr(x, "dtype")


def test_state_leaves_are_arrays_for_optree_and_the_host_framework(xp, device, backend):
    params, mans = ref.problem(xp, device, "transported")
    params.pop("sp"), mans.pop("sp")
    opt = riemannian(chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(1e-2)))
    state = opt.init(params, mans)
    leaves = optree.tree_leaves(state)
    assert leaves and all(_is_array(x, xp) for x in leaves)
    # the moments of two Stiefel leaves (stacked), Grassmann, raveled Euclidean + counts + the sections
    assert len(leaves) == 3 + 2 * (2 + 1 + 1) + 2 * 2
    if backend.kind == "torch":
        import torch.utils._pytree as pytree

        assert len(pytree.tree_leaves(state)) == len(leaves)
    if backend.kind == "jax":
        import jax

        assert len(jax.tree_util.tree_leaves(state)) == len(leaves)


def test_jit_of_a_chain_equals_eager(backend, xp, device):
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    params, mans = ref.problem(xp, device)
    opt = riemannian(chain(clip_by_global_norm(0.5), scale_by_adam(eps=1e-8), scale_by_learning_rate(1e-2)))
    state = opt.init(params, mans)
    jitted = jax.jit(opt.update)
    pe, se, pj, sj = params, state, params, state
    for t in range(1, 4):
        pe, se = opt.update(pe, ref.grads_at(pe, t, xp, device), se)
        pj, sj = jitted(pj, ref.grads_at(pj, t, xp, device), sj)
    for a, b in zip(optree.tree_leaves((pe, se)), optree.tree_leaves((pj, sj)), strict=True):
        assert_close(a, b, xp=xp, atol=1e-12)


def test_an_optax_transform_inside_the_wrapper_equals_adam(backend, xp, device):
    """optax.scale_by_adam(eps=0, eps_root=δ) and a learning-rate scale, wrapped: geoarray's Adam to 1e-12."""
    if backend.kind != "jax":
        pytest.skip("optax transforms run on JAX arrays only")
    optax = pytest.importorskip("optax", reason="optax is not installed (pip install optax)")
    wrapped = riemannian(optax.chain(optax.scale_by_adam(b1=0.85, b2=0.97, eps=0.0, eps_root=1e-6), optax.scale(-0.02)))
    native = optim.Adam(0.02, beta1=0.85, beta2=0.97, delta=1e-6)
    a = ref.run(wrapped, "householder", xp, device)
    b = ref.run(native, "householder", xp, device)
    for x, y in zip(optree.tree_leaves(a), optree.tree_leaves(b), strict=True):
        assert_close(x, y, xp=xp, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# the manifold contract and bad input
# ---------------------------------------------------------------------------------------------


def test_manifold_is_an_abstract_contract():
    class Incomplete(Manifold):
        def rgrad(self, Y, dL):
            return dL

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()


def test_bad_transform_arguments_raise():
    with pytest.raises(ValueError, match="chain needs at least one transform"):
        chain()
    with pytest.raises(TypeError, match="chain argument 1 must be a gradient transformation"):
        chain(scale_by_adam(), 3.0)
    with pytest.raises(ValueError, match=r"delta > 0 .* or eps > 0"):
        scale_by_adam(delta=0.0, eps=0.0)
    with pytest.raises(ValueError, match="max_norm must be a positive"):
        clip_by_global_norm(0.0)
    with pytest.raises(ValueError, match="weight_decay must be a non-negative"):
        add_decayed_weights(-1.0)
    with pytest.raises(ValueError, match="alpha must be a number in"):
        scale_by_momentum(1.5)
    with pytest.raises(TypeError, match="transform must be a gradient transformation"):
        riemannian(lambda g: g)
    with pytest.raises(ValueError, match="section must be one of"):
        riemannian(scale_by_learning_rate(1.0), section="qr")
    with pytest.raises(ValueError, match="retraction must be one of"):
        riemannian(scale_by_learning_rate(1.0), retraction="polar")


def test_a_section_the_manifold_lacks_is_refused_naming_the_leaf(xp, device):
    params, mans = ref.problem(xp, device)
    opt = optim.Adam(section="transported")
    msg = r"params\['sp'\] lives on SymplecticStiefel.*no section strategy 'transported'"
    with pytest.raises(ValueError, match=msg):
        opt.init(params, mans)


def test_update_before_init_and_for_another_tree_raise(xp, device):
    params, mans = ref.problem(xp, device)
    opt = optim.Adam()
    with pytest.raises(TypeError, match=r"state must be the RiemannianState returned by opt.init"):
        opt.update(params, params, None)
    state = opt.init(params, mans)
    small = {"w": params["w"]}
    with pytest.raises(ValueError, match="was initialised for"):
        opt.update(small, small, state)


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------


def _trained(xp, device, opt):
    params, mans = ref.problem(xp, device)
    state = opt.init(params, mans)
    for t in range(1, 3):
        params, state = opt.update(params, ref.grads_at(params, t, xp, device), state)
    return params, mans, state


def test_checkpoint_of_another_optimizer_kind_is_refused(xp, device, tmp_path):
    """An Adam state does not load into AdamWithDecay (its schedule keeps a step count): the structure
    recorded in the file names the transform states."""
    path = tmp_path / "adam.npz"
    _, _, state = _trained(xp, device, optim.Adam(1e-2))
    optim.save_state(path, state)
    params, mans = ref.problem(xp, device)
    like = optim.AdamWithDecay(n_steps=10).init(params, mans)
    with pytest.raises(ValueError, match="another optimizer or parameter tree"):
        optim.load_state(path, like=like)
    adam = optim.Adam(1e-2)
    optim.save_state(path, state, optimizer=adam)
    with pytest.raises(ValueError, match="state of a Adam optimizer, not of Momentum"):
        optim.load_state(path, like=state, optimizer=optim.Momentum())


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign_npz", "foreign_zip", "future_version", "empty"])
def test_damaged_or_foreign_checkpoints_raise_one_valueerror(xp, device, tmp_path, damage):
    path = tmp_path / "state.npz"
    _, _, state = _trained(xp, device, optim.Adam(1e-2))
    optim.save_state(path, state)
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\x01not a checkpoint" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "foreign_npz":
        np.savez(path, a=np.zeros(3))
    elif damage == "foreign_zip":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("readme.txt", "hello")
    elif damage == "future_version":
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays["__meta__"]))
        meta["version"] = 99
        arrays["__meta__"] = np.array(json.dumps(meta))
        np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"state\.npz"):
        optim.load_state(path, like=state)


def test_save_is_atomic(xp, device, tmp_path, monkeypatch):
    """A save that fails midway leaves the previous checkpoint intact and no temporary file behind."""
    path = tmp_path / "state.npz"
    _, _, state = _trained(xp, device, optim.Adam(1e-2))
    optim.save_state(path, state)
    before = path.read_bytes()

    def broken_savez(fh, **arrays):
        fh.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        optim.save_state(path, state)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.npz"]
    monkeypatch.undo()
    loaded = optim.load_state(path, like=state)
    for a, b in zip(optree.tree_leaves(loaded), optree.tree_leaves(state), strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_missing_checkpoint_is_a_file_not_found_error(xp, device, tmp_path):
    _, _, state = _trained(xp, device, optim.Adam(1e-2))
    with pytest.raises(FileNotFoundError):
        optim.load_state(tmp_path / "nope.npz", like=state)


@pytest.mark.parametrize("section", ["householder", "transported", "random"])
def test_fused_lift_equals_global_rep_of_rgrad(xp, device, section):
    """M.lift(Y, λ, ∇L), the optimizer's fused operations 1–2, equals global_rep(λ, rgrad(Y, ∇L)) to 1e-13."""
    for M in (Stiefel(9, 3), Grassmann(9, 3)):
        Y = M.random(0, xp=xp, batch_shape=(2,), device=device)
        G = geoarray.random.normal(1, (2, 9, 3), xp=xp, device=device)
        lam = M.global_section(Y, strategy=section, seed=3)
        fused, composed = M.lift(Y, lam, G), M.global_rep(lam, M.rgrad(Y, G))
        for a, b in zip(fused, composed, strict=True):
            assert_close(a, b, xp=xp, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# partition
# ---------------------------------------------------------------------------------------------


def test_partition_equals_running_its_members_separately(xp, device, backend):
    params, mans = ref.problem(xp, device)
    labels = {"heads": ["fast", "fast"], "sub": "slow", "sp": "slow", "w": "fast", "b": "slow"}
    opt = optim.partition({"fast": optim.Adam(0.05), "slow": optim.Momentum(0.01, alpha=0.8)}, labels)
    state = opt.init(params, mans)
    assert all(_is_array(x, xp) for x in optree.tree_leaves(state))
    fast, slow = optim.Adam(0.05), optim.Momentum(0.01, alpha=0.8)
    pick = lambda tree, keys: {k: tree[k] for k in keys}  # noqa: E731
    fk, sk = ("heads", "w"), ("sub", "sp", "b")
    pf, pslow = pick(params, fk), pick(params, sk)
    sf, ss = fast.init(pf, pick(mans, fk)), slow.init(pslow, pick(mans, sk))
    update = opt.update
    if backend.kind == "jax":
        import jax

        update = jax.jit(opt.update)
    p = params
    for t in range(1, 4):
        g = ref.grads_at(p, t, xp, device)
        p, state = update(p, g, state)
        pf, sf = fast.update(pf, pick(g, fk), sf)
        pslow, ss = slow.update(pslow, pick(g, sk), ss)
    for x, y in zip(optree.tree_leaves(p), optree.tree_leaves({**pf, **pslow}), strict=True):
        assert_close(x, y, xp=xp, atol=1e-13)


def test_partition_refuses_unknown_labels_and_other_trees(xp, device):
    params, mans = ref.problem(xp, device)
    labels = {"heads": ["a", "a"], "sub": "a", "sp": "a", "w": "a", "b": "typo"}
    with pytest.raises(ValueError, match=r"labels\['b'\] is 'typo', which names none of the optimizers \['a'\]"):
        optim.partition({"a": optim.Adam()}, labels).init(params, mans)
    with pytest.raises(TypeError, match="optimizers must be a non-empty dict"):
        optim.partition([optim.Adam()], labels)
    with pytest.raises(ValueError, match="labels must have the tree structure"):
        optim.partition({"a": optim.Adam()}, {"heads": "a"}).init(params, mans)


# ---------------------------------------------------------------------------------------------
# empty leaves (the B block of a square frame's g^hor is (0, n))
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("donate", [False, True], ids=["pure", "donated"])
@pytest.mark.parametrize("name", ["adam", "torch_adam", "torch_adamw", "lr", "lr_schedule"])
def test_elementwise_transforms_pass_an_empty_leaf_through_and_the_rest_unchanged(xp, device, name, donate):
    """An elementwise transform passes an empty leaf through (an elementwise operation of an empty array is
    an empty array: it runs none), as an empty array of the leaf's shape and dtype in the update and the
    state, and gives the other leaves bitwise as it gives them without the empty leaf (the same
    computation, repeated)."""
    from geoarray.optim import torch_rules

    make = {
        "adam": lambda: scale_by_adam(),
        "torch_adam": lambda: torch_rules.scale_by_torch_adam(),
        "torch_adamw": lambda: torch_rules.scale_by_torch_adam(weight_decay=0.1, decoupled_weight_decay=True),
        "lr": lambda: scale_by_learning_rate(1e-2),
        "lr_schedule": lambda: scale_by_learning_rate(lambda t: 1e-2 / t),
    }[name]

    def tree(seed, empty):
        full = {"a": geoarray.random.normal(seed, (4, 3), xp=xp, dtype=xp.float64, device=device)}
        if empty:
            full["b"] = xp.zeros((0, 3), dtype=xp.float64, device=device)
        return full

    kw = {"donate": True} if donate else {}
    with_empty, without = make(), make()
    params, params_ = tree(0, True), tree(0, False)
    state, state_ = with_empty.init(params), without.init(params_)
    for k in range(1, 4):
        out, state = with_empty.update(tree(k, True), state, params, **kw)
        out_, state_ = without.update(tree(k, False), state_, params_, **kw)
        assert tuple(out["b"].shape) == (0, 3) and out["b"].dtype == xp.float64
        assert np.array_equal(to_numpy(out["a"]), to_numpy(out_["a"]))
        leaves, leaves_ = optree.tree_leaves(state), optree.tree_leaves(state_)
        assert len(leaves) == len(leaves_) + (len(leaves) - len(leaves_))  # one empty entry per moment
        full = [x for x in leaves if tuple(x.shape) != (0, 3)]
        assert all(np.array_equal(to_numpy(x), to_numpy(y)) for x, y in zip(full, leaves_, strict=True))


def _square_torch_adam_step(backend, mode_of):
    """(M, W, mode): a 128×128 orthogonal weight (geotorch's copying task) after one eager
    ``geoarray.torch.Adam`` step, and the mode ``mode_of(torch)`` that watched a second step."""
    if backend.kind != "torch":
        pytest.skip("counts torch operations: geoarray.torch runs on torch tensors only")
    import torch

    import geoarray.torch as gt

    M = Stiefel(128, 128)
    W = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float32), M)
    opt = gt.Adam([W], lr=1e-4)
    W.grad = 1e-2 * torch.randn(128, 128, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    opt.step()
    mode = mode_of(torch)
    with mode:
        opt.step()
    return M, W, mode


def test_a_square_frames_torch_adam_step_runs_no_operation_on_an_empty_tensor(backend):
    """The eager ``geoarray.torch.Adam`` step of a 128×128 orthogonal weight (geotorch's copying task): its
    g^hor has an empty B block (0 × 128), on which no torch operation runs (they were 15 of its 64)."""

    def empty_mode(torch):
        from torch.overrides import TorchFunctionMode

        class Empty(TorchFunctionMode):
            def __init__(self):
                super().__init__()
                self.seen = []

            def __torch_function__(self, func, types, args=(), kwargs=None):
                tensors = [a for a in optree.tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
                if tensors and all(t.numel() == 0 for t in tensors):
                    self.seen.append(getattr(func, "__name__", str(func)))
                return func(*args, **(kwargs or {}))

        return Empty()

    M, W, mode = _square_torch_adam_step(backend, empty_mode)
    # creating the empty block, and reading its attributes (__get__: .shape, .dtype), are not operations on it
    allowed = {"zeros", "empty", "new_zeros", "new_empty", "detach", "__get__"}
    assert [f for f in mode.seen if f not in allowed] == [], mode.seen
    assert M.point_error(W.detach()) < 1e-5


def test_a_square_frames_torch_adam_step_dispatches_at_most_40_torch_operations(backend):
    """The same eager ``geoarray.torch.Adam`` step of a 128×128 orthogonal weight dispatches at most 40 torch
    operations (a ``TorchDispatchMode``; 48 before #51's square-path trims): exp(A) takes A as W holds it
    (½A was halved and doubled back), its identity is made once, the largest of one bound is that bound,
    exp's 1·X is X, c·I is added in one operation, and a param group's rate does not cast the step it
    ignores. The count is of operations, not of time; the weight stays orthonormal to float32 rounding."""

    def count_mode(torch):
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))

        return Count()

    M, W, mode = _square_torch_adam_step(backend, count_mode)
    assert len(mode.ops) <= 40, mode.ops
    assert mode.ops.count("aten.eye.m") <= 2, mode.ops  # the Björck step's and the exp's
    assert M.point_error(W.detach()) < 1e-5


def test_a_schedule_that_does_not_read_the_step_is_called_with_none(xp, device):
    """``scale_by_learning_rate(schedule)`` with ``schedule.reads_step = False`` (geoarray.torch's rate of the
    moment) calls it with None, and steps exactly as the same rate given as a schedule of t; its state
    still counts the steps (float64, two steps)."""

    class Moment:
        reads_step = False

        def __init__(self):
            self.calls = []

        def __call__(self, t):
            self.calls.append(t)
            return 0.25

    moment = Moment()
    u = {"w": xp.asarray(np.arange(6.0).reshape(2, 3), dtype=xp.float64, device=device)}
    a, b = scale_by_learning_rate(moment), scale_by_learning_rate(lambda t: 0.25)
    sa, sb = a.init(u), b.init(u)
    for _ in range(2):
        ua, sa = a.update(u, sa)
        ub, sb = b.update(u, sb)
        assert np.array_equal(to_numpy(ua["w"]), to_numpy(ub["w"]))
    assert moment.calls == [None, None]
    assert int(sa.count) == int(sb.count) == 2


# ---------------------------------------------------------------------------------------------
# a rate factor read at every step (what geoarray.torch's param groups drive)
# ---------------------------------------------------------------------------------------------


def test_scaled_by_a_rate_factor_steps_as_the_scaled_rate(xp, device):
    """``opt.scaled_by(f)`` multiplies the velocity by ``f()`` at every step, with the same state: Adam at rate η
    scaled by 0.5 equals Adam at 0.5·η to 1e-12 (float64, three steps; the same products, rounded once more);
    a factor of 1 is the unscaled step bit for bit; a 0-d array factor equals the number to 1e-15 and gives
    no velocity bound (it is not read to the host); the factor is read at each step (a change between steps
    is taken); a subclass with its own update is refused, naming why."""
    from geoarray.optim.transforms import scale_by_factor

    M = Stiefel(7, 3)
    Y = M.random(0, xp=xp, device=device, batch_shape=(2,))
    grads = [geoarray.random.normal(10 + k, tuple(Y.shape), xp=xp, device=device, scale=0.3) for k in range(3)]

    def run(opt):
        p, state = Y, opt.init(Y, M)
        for G in grads:
            p, state = opt.update(p, G, state)
        return to_numpy(p), state

    value = [0.5]
    half, state = run(optim.Adam(lr=0.02).scaled_by(lambda: value[0]))
    reference, ref_state = run(optim.Adam(lr=0.01))
    np.testing.assert_allclose(half, reference, rtol=0, atol=1e-12)
    assert optree.tree_structure(state) == optree.tree_structure(ref_state)
    one, _ = run(optim.Adam(lr=0.01).scaled_by(lambda: 1.0))
    np.testing.assert_array_equal(one, reference)
    factor = xp.asarray(0.5, dtype=xp.float64, device=device)
    array, _ = run(optim.Adam(lr=0.02).scaled_by(lambda: factor))
    np.testing.assert_allclose(array, half, rtol=0, atol=1e-15)
    assert scale_by_factor(scale_by_learning_rate(0.1), lambda: factor).bound(1.0) is None
    assert scale_by_factor(scale_by_learning_rate(0.1), lambda: -2.0).bound(1.0) == pytest.approx(0.2)
    value[0] = 0.0  # read at every step: a zero factor leaves the point where it is
    opt = optim.Gradient(lr=0.1).scaled_by(lambda: value[0])
    p, _ = opt.update(Y, grads[0], opt.init(Y, M))
    np.testing.assert_allclose(to_numpy(p), to_numpy(Y), rtol=0, atol=1e-15)

    class OwnUpdate(optim.Gradient):
        def update(self, params, grads, state, **kw):
            return super().update(params, grads, state, **kw)

    assert optim.Gradient(lr=0.1).takes_rate_factor and not OwnUpdate(lr=0.1).takes_rate_factor
    with pytest.raises(TypeError, match="has its own update"):
        OwnUpdate(lr=0.1).scaled_by(lambda: 0.5)
