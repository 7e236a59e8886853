"""geoarray.torch optimizers: torch.optim.Optimizer subclasses that equal the array-API core.

Properties: a step equals ``geoarray.optim``'s update on the same weights and gradients (to
``_helpers.AGREE_RTOL``: two code paths, which round differently on CPUs with and without AVX-512;
per param group with its own hyperparameters, plain tensors Euclidean); parameters stay leaves and
backward works after a step; grads that are None are skipped; state_dict resumes bit-exactly (also
through ``torch.save``/``torch.load(weights_only=True)``); a non-finite gradient skips the step
(under a GradScaler: ``tests/test_torch_grad_scaler.py``); a compiled model trains like the eager one
(1e-12); bad input raises naming the parameter and changes nothing.
"""

from __future__ import annotations

import copy
import io

import pytest

import geoarray
from _helpers import assert_agree
from geoarray import Grassmann, Stiefel, optim

# torch_only, torch and gt: tests/conftest.py
pytestmark = pytest.mark.usefixtures("torch_only")


MANIFOLDS = [Stiefel(6, 2), Stiefel(6, 2), Grassmann(5, 2), None, None]
SHAPES = [(6, 2), (6, 2), (5, 2), (3, 4), (4,)]


def _weights(torch, gt, device, seed=0):
    """Two same-shape Stiefel weights (stacked by the core), a Grassmann weight, a matrix and a bias."""
    out = []
    for k, (m, shape) in enumerate(zip(MANIFOLDS, SHAPES, strict=True)):
        if m is None:
            g = torch.Generator().manual_seed(seed * 100 + k)
            out.append(torch.nn.Parameter(torch.randn(shape, generator=g, dtype=torch.float64).to(device)))
        else:
            y = m.random(seed * 100 + k, xp=torch, dtype=torch.float64, device=device)
            out.append(gt.ManifoldParameter(y, m))
    return out


def _grads(torch, params, step, scale=1.0):
    g = torch.Generator().manual_seed(1000 + step)
    return [scale * torch.randn(tuple(p.shape), generator=g, dtype=p.dtype).to(p.device) for p in params]


def _run_core(core, params, n_steps, manifolds, start=0, state=None):
    leaves = [p.detach().clone() for p in params]
    state = core.init(leaves, manifolds) if state is None else state
    import torch

    for t in range(start, start + n_steps):
        leaves, state = core.update(leaves, _grads(torch, leaves, t), state)
    return leaves, state


def _run_torch(opt, params, n_steps, start=0):
    import torch

    for t in range(start, start + n_steps):
        for p, g in zip(params, _grads(torch, params, t), strict=True):
            p.grad = g
        opt.step()


CASES = {
    "Adam": (
        lambda gt, ps, **kw: gt.PaperAdam(ps, lr=0.05, betas=(0.8, 0.95), **kw),
        lambda: geoarray.optim.Adam(0.05, 0.8, 0.95),
    ),
    "Momentum": (
        lambda gt, ps, **kw: gt.Momentum(ps, lr=0.1, alpha=0.7, **kw),
        lambda: geoarray.optim.Momentum(0.1, 0.7),
    ),
    "Gradient": (lambda gt, ps, **kw: gt.Gradient(ps, lr=0.1, **kw), lambda: geoarray.optim.Gradient(0.1)),
    "AdamWithDecay": (
        lambda gt, ps, **kw: gt.AdamWithDecay(ps, n_steps=3, lr_start=0.1, lr_end=0.01, **kw),
        lambda: geoarray.optim.AdamWithDecay(n_steps=3, lr_start=0.1, lr_end=0.01),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_step_equals_core_update(torch, gt, device, name):
    make_torch, make_core = CASES[name]
    params = _weights(torch, gt, device)
    ref, _ = _run_core(make_core(), params, 4, MANIFOLDS)
    opt = make_torch(gt, params)
    _run_torch(opt, params, 4)
    for k, (p, r) in enumerate(zip(params, ref, strict=True)):
        assert_agree(p.detach(), r, what=f"{name}: parameter {k} against the core")
        assert p.grad_fn is None and p.is_leaf
    for p, m in zip(params, MANIFOLDS, strict=True):
        if m is not None:
            assert m.is_point(p.detach())


def test_param_groups_have_their_own_hyperparameters(torch, gt, device):
    params = _weights(torch, gt, device)
    opt = gt.PaperAdam([{"params": params[:3]}, {"params": params[3:], "lr": 0.2, "betas": (0.5, 0.9)}], lr=0.05)
    _run_torch(opt, params, 3)
    exp_a, exp_b = _split_reference(torch, gt, device)
    for p, r in zip(params, exp_a + exp_b, strict=True):
        assert_agree(p.detach(), r)


def _split_reference(torch, gt, device):
    """The two groups run by two cores on the gradients the torch run saw."""
    start = _weights(torch, gt, device)
    cores = [(geoarray.optim.Adam(0.05), slice(0, 3)), (geoarray.optim.Adam(0.2, 0.5, 0.9), slice(3, 5))]
    leaves = [p.detach().clone() for p in start]
    states = [c.init(leaves[s], MANIFOLDS[s]) for c, s in cores]
    for t in range(3):
        grads = _grads(torch, leaves, t)
        for k, (c, s) in enumerate(cores):
            leaves[s], states[k] = c.update(leaves[s], grads[s], states[k])
    return leaves[:3], leaves[3:]


def test_lr_is_read_at_every_step_and_other_changes_rebuild_the_core(torch, gt, device):
    params = _weights(torch, gt, device)
    opt = gt.PaperAdam(params, lr=0.05)
    _run_torch(opt, params, 2)
    opt.param_groups[0]["lr"] = 0.01  # what torch's LR schedulers do
    opt.param_groups[0]["delta"] = 1e-4  # rebuilds the core, keeps the moments
    _run_torch(opt, params, 2, start=2)

    start = _weights(torch, gt, device)
    leaves, state = _run_core(geoarray.optim.Adam(0.05), start, 2, MANIFOLDS)
    core = geoarray.optim.Adam(0.01, delta=1e-4)
    core.init(leaves, MANIFOLDS)
    for t in (2, 3):
        leaves, state = core.update(leaves, _grads(torch, leaves, t), state)
    for p, r in zip(params, leaves, strict=True):
        assert_agree(p.detach(), r)


def test_lr_scheduler_drives_the_rate(torch, gt, device):
    params = _weights(torch, gt, device)
    opt = gt.Gradient(params, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for t in range(3):
        _run_torch(opt, params, 1, start=t)
        sched.step()
    leaves = [p.detach().clone() for p in _weights(torch, gt, device)]
    for t, lr in enumerate((0.1, 0.05, 0.025)):
        core = geoarray.optim.Gradient(lr)
        state = core.init(leaves, MANIFOLDS)
        leaves, state = core.update(leaves, _grads(torch, leaves, t), state)
    for p, r in zip(params, leaves, strict=True):
        assert_agree(p.detach(), r)


def test_backward_works_after_steps_and_params_stay_leaves(torch, gt, device):
    model = torch.nn.Sequential(gt.nn.StiefelLayer(8, 3, device=device), gt.nn.Dense(8, 2, "tanh", device=device))
    opt = gt.PaperAdam(model.parameters(), lr=1e-2)
    x = torch.randn(16, 3, dtype=torch.float64, device=device)
    losses = []
    for _ in range(5):
        loss = model(x).square().mean()
        loss.backward()  # the failure: a weight with a grad_fn (geqrf) broke this on step 2
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    for p in model.parameters():
        assert p.is_leaf and p.grad_fn is None and p.requires_grad and p.grad is None
    assert losses[-1] < losses[0]
    Y = model[0].params.Y
    assert isinstance(Y, gt.ManifoldParameter) and Stiefel(8, 3).is_point(Y.detach())


def test_zero_grad(torch, gt, device):
    params = _weights(torch, gt, device)
    opt = gt.Momentum(params, lr=0.1)
    _run_torch(opt, params, 1)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_params_without_grad_are_skipped_and_join_later(torch, gt, device):
    params = _weights(torch, gt, device)
    frozen_before = params[2].detach().clone()
    opt = gt.PaperAdam(params, lr=0.05)
    # step 1: parameter 2 has no gradient
    grads = _grads(torch, params, 0)
    for k, (p, g) in enumerate(zip(params, grads, strict=True)):
        p.grad = None if k == 2 else g
    opt.step()
    assert torch.equal(params[2].detach(), frozen_before)
    # step 2: all have gradients; parameter 2 takes its first Adam step with its own state
    grads2 = _grads(torch, params, 1)
    before = [p.detach().clone() for p in params]
    for p, g in zip(params, grads2, strict=True):
        p.grad = g
    opt.step()
    core = geoarray.optim.Adam(0.05)
    state = core.init([before[2]], [MANIFOLDS[2]])
    (expected,), _ = core.update([before[2]], [grads2[2]], state)
    assert_agree(params[2].detach(), expected)
    # a step where only part of a cohort has gradients is refused, naming the missing one, nothing changed
    snapshot = [p.detach().clone() for p in params]
    sd = copy.deepcopy(opt.state_dict())
    params[0].grad = None
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] had a gradient"):
        opt.step()
    assert all(torch.equal(p.detach(), s) for p, s in zip(params, snapshot, strict=True))
    _assert_state_equal(torch, opt.state_dict(), sd)


def _assert_state_equal(torch, a, b):
    ga, gb = a["geoarray"]["groups"], b["geoarray"]["groups"]
    assert len(ga) == len(gb)
    for ca, cb in zip(ga, gb, strict=True):
        assert len(ca) == len(cb)
        for ea, eb in zip(ca, cb, strict=True):
            assert ea["structure"] == eb["structure"] and ea["indices"] == eb["indices"]
            for x, y in zip(ea["leaves"], eb["leaves"], strict=True):
                assert torch.equal(x, y)


def test_state_dict_resumes_bit_exactly_through_torch_save(torch, gt, device):
    params = _weights(torch, gt, device)
    opt = gt.PaperAdam([{"params": params[:3]}, {"params": params[3:], "lr": 0.2}], lr=0.05, section="rotated")
    _run_torch(opt, params, 3)
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "w": [p.detach() for p in params]}, buf)
    _run_torch(opt, params, 3, start=3)

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    fresh = _weights(torch, gt, device, seed=7)  # other values, overwritten by the checkpoint
    with torch.no_grad():
        for p, w in zip(fresh, ckpt["w"], strict=True):
            p.copy_(w)
    opt2 = gt.PaperAdam([{"params": fresh[:3]}, {"params": fresh[3:]}], lr=0.05, section="rotated")
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[1]["lr"] == 0.2
    _run_torch(opt2, fresh, 3, start=3)
    for p, q in zip(params, fresh, strict=True):
        assert torch.equal(p.detach(), q.detach())


def test_deepcopy_of_model_and_optimizer_continues_identically(torch, gt, device):
    params = _weights(torch, gt, device)
    opt = gt.PaperAdam([{"params": params[:3]}, {"params": params[3:], "lr": 0.2}], lr=0.05)
    _run_torch(opt, params, 2)
    opt2 = copy.deepcopy(opt)  # copies the parameters it holds, and the state with them
    params2 = [p for g in opt2.param_groups for p in g["params"]]
    assert all(p2 is not p and torch.equal(p2, p) for p, p2 in zip(params, params2, strict=True))
    _run_torch(opt, params, 2, start=2)
    _run_torch(opt2, params2, 2, start=2)
    assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(params, params2, strict=True))


def test_step_with_closure_returns_its_loss(torch, gt, device):
    W = gt.ManifoldParameter(Stiefel(5, 2).random(0, xp=torch, dtype=torch.float64, device=device), Stiefel(5, 2))
    opt = gt.Gradient([W], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = -W[:2].diagonal().sum()
        loss.backward()
        return loss

    first = opt.step(closure).item()
    for _ in range(20):
        last = opt.step(closure).item()
    assert last < first and Stiefel(5, 2).is_point(W.detach())


def test_load_state_dict_of_another_optimizer_raises_and_changes_nothing(torch, gt, device):
    params = _weights(torch, gt, device)
    mom = gt.Momentum(params, lr=0.1)
    _run_torch(mom, params, 1)
    adam = gt.PaperAdam(params, lr=0.05)
    _run_torch(adam, params, 1)
    before = copy.deepcopy(adam.state_dict())
    with pytest.raises(ValueError, match="another optimizer"):
        adam.load_state_dict(mom.state_dict())
    _assert_state_equal(torch, adam.state_dict(), before)
    assert adam.param_groups[0]["lr"] == 0.05
    with pytest.raises(ValueError, match=r"not written by a geoarray\.torch optimizer"):
        adam.load_state_dict(torch.optim.Adam(params).state_dict())


def test_nonfinite_grad_without_scaler_is_skipped_by_the_core(torch, gt, device, host_reads_policy):
    host_reads_policy("always")  # the warning reads the flag (a GPU's default counts without warning)
    params = _weights(torch, gt, device)
    opt = gt.PaperAdam(params, lr=0.05)
    _run_torch(opt, params, 1)
    snapshot = [p.detach().clone() for p in params]
    grads = _grads(torch, params, 1)
    grads[3][0, 0] = float("nan")
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    with pytest.warns(geoarray.optim.NonFiniteGradientWarning):
        opt.step()
    assert all(torch.equal(p.detach(), s) for p, s in zip(params, snapshot, strict=True))


@pytest.mark.filterwarnings("error:Dynamo detected:UserWarning")
def test_compiled_model_trains_like_the_eager_one(torch, gt, device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(gt.nn.StiefelLayer(8, 3, device=device), gt.nn.Dense(8, 2, "tanh", device=device))
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=False)
    opt, opt_twin = gt.PaperAdam(model.parameters(), lr=1e-2), gt.PaperAdam(twin.parameters(), lr=1e-2)
    x = torch.randn(16, 3, dtype=torch.float64, device=device)
    for _ in range(3):
        for net, o in ((compiled, opt), (twin, opt_twin)):
            net(x).square().mean().backward()
            o.step()
            o.zero_grad()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-12)
    assert isinstance(model[0].params.Y, gt.ManifoldParameter)


def test_generic_optimizer_takes_a_core_or_a_transform(torch, gt, device):
    from geoarray.optim import chain, clip_by_global_norm, scale_by_adam, scale_by_learning_rate

    transform = chain(clip_by_global_norm(1.0), scale_by_adam(), scale_by_learning_rate(0.05))
    params = _weights(torch, gt, device)
    opt = gt.Optimizer(params, transform)
    _run_torch(opt, params, 2)
    ref, _ = _run_core(geoarray.optim.riemannian(transform), _weights(torch, gt, device), 2, MANIFOLDS)
    for p, r in zip(params, ref, strict=True):
        assert_agree(p.detach(), r)

    params = _weights(torch, gt, device)
    opt = gt.Optimizer(params, geoarray.optim.Momentum(0.1, 0.5))
    _run_torch(opt, params, 2)
    ref, _ = _run_core(geoarray.optim.Momentum(0.1, 0.5), _weights(torch, gt, device), 2, MANIFOLDS)
    for p, r in zip(params, ref, strict=True):
        assert_agree(p.detach(), r)
    with pytest.raises(TypeError, match="core must be"):
        gt.Optimizer(params, 3)


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Adam", "SGD", "Gradient", "ManifoldMuon"])
def test_skip_together_is_refused_without_a_process_group_or_a_bool(torch, gt, device, name):
    """skip_together=True needs torch.distributed's default group (the ZeRO test exercises it with 2
    ranks, tests/test_torch_zero.py); here, in one process without one, it and a non-bool are refused at
    construction, naming the key and the fix."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    params = [p for p in _weights(torch, gt, device) if p.ndim == 2]
    with pytest.raises(ValueError, match=r"skip_together=True, which needs .*init_process_group"):
        getattr(gt, name)(params, lr=0.1, skip_together=True)
    with pytest.raises(TypeError, match=r"\['skip_together'\] must be True or False, got 'yes'"):
        getattr(gt, name)(params, lr=0.1, skip_together="yes")
    opt = getattr(gt, name)(params, lr=0.1)
    assert opt.param_groups[0]["skip_together"] is False
    with pytest.raises(ValueError, match="skip_together=True"):
        opt.add_param_group(
            {"params": [torch.nn.Parameter(torch.zeros(2, 2, dtype=params[0].dtype))], "skip_together": True}
        )
    assert len(opt.param_groups) == 1  # nothing added


def test_wrong_shape_dtype_or_off_manifold_weights_are_refused_by_name(torch, gt, device):
    M = Stiefel(6, 2)
    good = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    wrong_shape = gt.ManifoldParameter(torch.zeros(6, 3, dtype=torch.float64, device=device), M, check=False)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\] has shape \(6, 3\)"):
        gt.PaperAdam([good, wrong_shape])
    with pytest.raises(ValueError, match=r"'head' has shape \(6, 3\)"):
        gt.PaperAdam([("w", good), ("head", wrong_shape)])
    cplx = gt.ManifoldParameter(torch.zeros(6, 2, dtype=torch.complex128, device=device), M, check=False)
    with pytest.raises(TypeError, match=r"\[0\] lives on Stiefel\(6, 2\) and must have a real floating dtype"):
        gt.PaperAdam([cplx])
    skewed = gt.ManifoldParameter(2 * M.random(1, xp=torch, dtype=torch.float64, device=device), M, check=False)
    opt = gt.Gradient([{"params": [good]}, {"params": [skewed]}])  # values are checked at the first step
    good.grad, skewed.grad = torch.ones_like(good), torch.ones_like(skewed)
    before = [good.detach().clone(), skewed.detach().clone()]
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] is not a point of Stiefel\(6, 2\)"):
        opt.step()
    assert torch.equal(good.detach(), before[0]) and torch.equal(skewed.detach(), before[1])
    with pytest.raises(ValueError, match=r"data is not a point of Stiefel.*max\|YᵀY − I\| = 3, above the tolerance"):
        gt.ManifoldParameter(2 * M.random(1, xp=torch, dtype=torch.float64, device=device), M, project=False)
    with pytest.raises(ValueError, match="beta2 must be"):
        gt.PaperAdam([good], betas=(0.9, 1.5))


def test_grad_of_another_dtype_raises_by_name_before_anything_changes(torch, gt, device):
    params = _weights(torch, gt, device)
    opt = gt.PaperAdam([{"params": params[:3]}, {"params": params[3:]}], lr=0.05)
    snapshot = [p.detach().clone() for p in params]
    for p, g in zip(params, _grads(torch, params, 0), strict=True):
        p.grad = g
    params[4].grad_dtype = None  # torch refuses the assignment otherwise
    params[4].grad = params[4].grad.to(torch.float32)
    with pytest.raises(TypeError, match=r"gradient of param_groups\[1\]\['params'\]\[1\] has dtype torch.float32"):
        opt.step()
    assert all(torch.equal(p.detach(), s) for p, s in zip(params, snapshot, strict=True))
    assert opt.state_dict()["geoarray"]["groups"] == [[], []]


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_precision_manifold_weights_step_in_float32(torch, gt, device, half):
    """A Stiefel ManifoldParameter in float16/bfloat16 (built directly or by ``module.to`` before the first step)
    is stepped in float32 and written back in its dtype: it moves, stays orthonormal to its own rounding
    (4e-3 / 3e-2), and equals the core optimizer on the same half-precision tensors (to AGREE_RTOL of the dtype)."""
    dtype = getattr(torch, half)
    M = Stiefel(6, 2)
    point = M.random(0, xp=torch, dtype=torch.float64, device=device)
    direct = gt.ManifoldParameter(point.to(dtype), M)
    module = torch.nn.Module()
    module.w = gt.ManifoldParameter(point.to(torch.float32), M)
    module.b = torch.nn.Parameter(torch.zeros(3, dtype=dtype, device=device))
    opt = gt.PaperAdam(module.named_parameters(), lr=0.05)
    module.to(dtype)
    assert torch.equal(module.w.detach(), direct.detach())
    core = optim.Adam(lr=0.05)
    ref = {"w": direct.detach().clone(), "b": torch.zeros(3, dtype=dtype, device=device)}
    ref_state = core.init(ref, {"w": M, "b": None})
    before = module.w.detach().clone()
    for k in range(5):
        grads = {"w": torch.full_like(module.w, 0.1 * (k + 1)), "b": torch.ones_like(module.b)}
        module.w.grad, module.b.grad = grads["w"], grads["b"]
        opt.step()
        ref, ref_state = core.update(ref, grads, ref_state)
    w = module.w.detach()
    assert w.dtype == dtype and module.b.dtype == dtype
    assert_agree(w, ref["w"], what="w")
    assert_agree(module.b.detach(), ref["b"], what="b")
    assert float((w.float() - before.float()).abs().max()) > 1e-2
    err = float((w.float().mT @ w.float() - torch.eye(2, device=device)).abs().max())
    assert err <= {"float16": 4e-3, "bfloat16": 3e-2}[half], err


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_precision_manifold_muon_steps_in_float32(torch, gt, device, half):
    """``geoarray.torch.ManifoldMuon`` on a float16/bfloat16 Stiefel ManifoldParameter (its dual ascent's
    ``eigh`` has no half-precision kernel: the step raised torch's NotImplementedError) steps in float32,
    writes the weight back in its dtype, equals the core optimizer on the same tensors (AGREE_RTOL of the
    dtype), moves it and keeps it orthonormal to its own rounding (4e-3 / 3e-2); ``opt.state`` holds the
    momentum in float32."""
    dtype = getattr(torch, half)
    M = Stiefel(6, 2)
    w = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device).to(dtype), M)
    opt = gt.ManifoldMuon([w], lr=0.05)
    core = optim.ManifoldMuon(lr=0.05)
    ref = {"w": w.detach().clone()}
    ref_state = core.init(ref, {"w": M})
    before = w.detach().clone()
    for k in range(5):
        g = torch.Generator().manual_seed(k)
        w.grad = torch.randn(6, 2, generator=g).to(device=device, dtype=dtype)
        opt.step()
        ref, ref_state = core.update(ref, {"w": w.grad}, ref_state)
    assert w.dtype == dtype
    assert_agree(w.detach(), ref["w"], what="w")
    assert float((w.detach().float() - before.float()).abs().max()) > 1e-2
    err = float((w.detach().float().mT @ w.detach().float() - torch.eye(2, device=device)).abs().max())
    assert err <= {"float16": 4e-3, "bfloat16": 3e-2}[half], err
    assert opt.state[w]["momentum_buffer"].dtype == torch.float32


def test_resuming_a_drifted_float32_weight_is_not_refused(torch, gt, device):
    """A trained float32 weight drifts off St(6, 2) by rounding (|YᵀY − I| ~ 1e-4 after 10⁴ steps, is_point's float32
    tolerance); here it is pushed to 3e-4. A *new* optimizer refuses it (an initial weight must be a point), but
    ``load_state_dict`` into a new optimizer, a deepcopy, and a changed hyperparameter (core rebuilt) resume without
    the check, and the resumed step equals the original optimizer's step bit for bit."""
    M = Stiefel(6, 2)
    module = torch.nn.Module()
    module.w = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float32, device=device), M)
    opt = gt.PaperAdam(module.named_parameters(), lr=0.05)
    module.w.grad = _grads(torch, [module.w], 0)[0].float()
    opt.step()
    with torch.no_grad():
        module.w.mul_(1 + 1.5e-4)  # |YᵀY − I| ≈ 3e-4 on the diagonal
    assert not M.is_point(module.w.detach()) and M.is_point(module.w.detach(), atol=1e-3)
    fresh = gt.PaperAdam(module.named_parameters(), lr=0.05)
    module.w.grad = torch.ones_like(module.w)
    with pytest.raises(ValueError, match=r"'w' is not a point of Stiefel\(6, 2\)"):
        fresh.step()

    twin = copy.deepcopy(module)
    loaded = gt.PaperAdam(twin.named_parameters(), lr=0.05)
    loaded.load_state_dict(copy.deepcopy(opt.state_dict()))
    copied_module = copy.deepcopy(module)
    copied = copy.deepcopy(opt)
    copied.param_groups[0]["params"] = [copied_module.w]
    grad = _grads(torch, [module.w], 1)[0].float()
    for m in (module, twin, copied_module):
        m.w.grad = grad.clone()
    opt.param_groups[0]["betas"] = (0.9, 0.99)  # a new core for the original, carrying its state
    for o in (opt, loaded, copied):
        o.step()
    assert torch.equal(twin.w.detach(), module.w.detach())
    assert torch.equal(copied_module.w.detach(), module.w.detach())


def test_a_model_converted_after_the_first_step_is_refused_by_name(torch, gt, device):
    """``module.to(float32)`` after the optimizer stepped: the state stayed float64, so the next step raises
    ``TypeError`` naming ``'w'`` (before: a dtype clash inside the manifold code naming no parameter); parameter
    and optimizer state unchanged (exactly). The same for a parameter moved to another device (``ValueError``),
    checked by recording another device for the state (a CPU-only machine has no second device, and ``meta``
    tensors are not converted in place by ``module.to``)."""
    M = Stiefel(6, 2)
    module = torch.nn.Module()
    module.w = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    opt = gt.PaperAdam(module.named_parameters(), lr=0.05)
    module.w.grad = _grads(torch, [module.w], 0)[0]
    opt.step()
    saved = copy.deepcopy(opt.state_dict()["geoarray"]["groups"][0][0]["leaves"])
    module.to(torch.float32)
    assert isinstance(module.w, gt.ManifoldParameter) and module.w.dtype == torch.float32  # converted in place
    module.w.grad = torch.ones_like(module.w)
    before = module.w.detach().clone()
    with pytest.raises(
        TypeError, match=r"'w' has dtype torch\.float32, but the optimizer state was built for torch\.float64"
    ):
        opt.step()
    assert torch.equal(module.w.detach(), before)
    after = opt.state_dict()["geoarray"]["groups"][0][0]["leaves"]
    assert all(torch.equal(a, b) for a, b in zip(after, saved, strict=True))

    module.to(torch.float64)
    module.w.grad = torch.ones_like(module.w)
    opt._cohorts[0][0].where = ((torch.float64, torch.device("meta")),)  # the state "lives" on another device
    with pytest.raises(ValueError, match=r"'w' is on device \S+, but the optimizer state was built on meta"):
        opt.step()


def test_a_gradient_on_another_device_is_refused_by_name(torch, gt, device):
    """torch itself refuses to assign ``p.grad`` on another device (RuntimeError at the assignment); the optimizer's
    own check — reached by gradients that bypass the setter — raises ``ValueError`` naming the parameter. Checked
    on a stand-in parameter (a CPU-only machine has no second real device)."""
    from types import SimpleNamespace

    M = Stiefel(6, 2)
    p = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    with pytest.raises(RuntimeError, match="device"):
        p.grad = torch.empty(6, 2, dtype=torch.float64, device="meta")
    opt = gt.PaperAdam([p])
    stand_in = SimpleNamespace(
        grad=torch.empty(6, 2, dtype=torch.float64, device="meta"), dtype=p.dtype, device=p.device, shape=p.shape
    )
    group = {"params": [stand_in]}
    with pytest.raises(ValueError, match=r"gradient of param_groups\[0\]\['params'\]\[0\] is on device meta"):
        opt._check_grads(group, 0, [0])


def test_manifold_muon_as_a_torch_optimizer_equals_the_core_and_resumes(torch, gt, device):
    """geoarray.torch.ManifoldMuon on Stiefel/Grassmann ManifoldParameters and a plain matrix (the bias goes to
    Adam in a second optimizer): equal to the core's update (AGREE_RTOL), and a state_dict round trip resumes
    bit-exactly."""
    params = _weights(torch, gt, device)[:4]
    core = geoarray.optim.ManifoldMuon(lr=0.02)
    tree = [p.detach().clone() for p in params]
    state = core.init(tree, [gt.manifold_of(p) for p in params])
    opt = gt.ManifoldMuon(params, lr=0.02)
    for step in range(3):
        grads = _grads(torch, params, step)
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        tree, state = core.update(tree, [g.clone() for g in grads], state)
    for p, q in zip(params, tree, strict=True):
        assert_agree(p.detach(), q)
    saved = opt.state_dict()
    twin = [
        torch.nn.Parameter(p.detach().clone())
        if gt.manifold_of(p) is None
        else gt.ManifoldParameter(p.detach().clone(), gt.manifold_of(p))
        for p in params
    ]
    resumed = gt.ManifoldMuon(twin, lr=0.02)
    resumed.load_state_dict(saved)
    grads = _grads(torch, params, 7)
    for a, b, g in zip(params, twin, grads, strict=True):
        a.grad, b.grad = g.clone(), g.clone()
    opt.step()
    resumed.step()
    for a, b in zip(params, twin, strict=True):
        assert torch.equal(a.detach(), b.detach())
    bias = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64, device=device))
    bias.grad = torch.ones_like(bias)
    with pytest.raises(ValueError, match="Muon acts on matrices only"):
        gt.Muon([bias]).step()


@pytest.mark.parametrize("name", ["Adam", "PaperAdam", "SGD", "Momentum", "ManifoldMuon"])
def test_a_state_dict_with_a_bad_hyperparameter_is_refused_at_load(torch, gt, device, name):
    """A state_dict edited to lr="oops" (or betas out of range) is refused by load_state_dict with a
    ValueError naming the key, and the optimizer keeps its groups and state; editing a group's lr to a
    bad value is refused at the next step, before any parameter changes."""
    params = _weights(torch, gt, device)[:4]
    make = lambda ps: getattr(gt, name)(ps, lr=0.02)  # noqa: E731
    opt = make(params)
    _run_torch(opt, params, 1)
    saved = copy.deepcopy(opt.state_dict())
    target = make(params)
    _run_torch(target, params, 1)
    before = copy.deepcopy(target.state_dict())
    bad = copy.deepcopy(saved)
    bad["param_groups"][0]["lr"] = "oops"
    with pytest.raises(ValueError, match=r"state_dict\['param_groups'\]\[0\]\['lr'\] must be a non-negative"):
        target.load_state_dict(bad)
    assert target.param_groups[0]["lr"] == 0.02
    _assert_state_equal(torch, target.state_dict(), before)
    if "betas" in saved["param_groups"][0]:
        bad = copy.deepcopy(saved)
        bad["param_groups"][0]["betas"] = (0.9, 2.0)
        with pytest.raises(ValueError, match=r"2\.0"):
            target.load_state_dict(bad)
    target.param_groups[0]["lr"] = "oops"
    snapshot = [p.detach().clone() for p in params]
    for p, g in zip(params, _grads(torch, params, 5), strict=True):
        p.grad = g
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['lr'\] must be a non-negative"):
        target.step()
    assert all(torch.equal(p.detach(), s) for p, s in zip(params, snapshot, strict=True))


def test_named_optimizers_are_constructors_of_the_one_optimizer_class(torch, gt):
    """geoarray.torch has one ``torch.optim.Optimizer`` subclass: every named optimizer derives from it
    directly (``AdamW`` from ``Adam``, as torch's ``AdamW`` does) and defines nothing but its constructor and
    docstring — no step, no hook, no class flag; what differs between them is the :class:`Recipe` its
    constructor passes, and that recipe survives a copy (the copy steps like the original, to 1e-12, and
    takes a new param group)."""
    names = [n for n in gt.optim.__all__ if n not in ("Optimizer", "Recipe")]
    allowed = {"__module__", "__doc__", "__init__", "__qualname__", "__firstlineno__", "__static_attributes__"}
    for name in names:
        cls = getattr(gt, name)
        chain = cls.__mro__[: cls.__mro__.index(gt.Optimizer)]
        assert chain == ((cls, gt.Adam) if name == "AdamW" else (cls,)), (name, chain)
        # torch.optim.Optimizer.__init__ wraps a class's step in its profiling hook (marked ``hooked``) where
        # the class has not got one yet: that wrapper is torch's, around the inherited step
        extra = sorted(k for k in set(vars(cls)) - allowed if not (k == "step" and getattr(vars(cls)[k], "hooked", 0)))
        assert not extra, f"{name} defines {extra} beyond its constructor"
    for name in names:
        cls = getattr(gt, name)
        w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 12, dtype=torch.float64).reshape(4, 3))
        kwargs = {"n_steps": 10} if name == "AdamWithDecay" else {}
        opt = cls([w], lr=1e-2, **kwargs) if name != "AdamWithDecay" else cls([w], **kwargs)
        assert isinstance(opt._recipe, gt.Recipe), name
        w.grad = torch.ones_like(w)
        opt.step()
        twin = copy.deepcopy((w, opt))
        for p, o in ((w, opt), twin):
            p.grad = torch.full_like(p, 0.5)
            o.step()
        assert twin[1]._recipe == opt._recipe, name
        assert torch.allclose(twin[0].detach(), w.detach(), rtol=0, atol=1e-12), name
        # the copy knows its groups' keys (it lost them before: AttributeError '_known' on add_param_group)
        twin[1].add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.float64))]})
        assert len(twin[1].param_groups) == 2, name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"build": "adam"}, r"Recipe\(build=\.\.\.\) must be a function"),
        ({"build": print, "check": 3}, r"Recipe\(check=\.\.\.\) must be None or a function"),
        ({"build": print, "live": "lr"}, r"Recipe\(live=\.\.\.\) must be a tuple of param-group keys"),
        ({"build": print, "state_free": ("lr", 1)}, r"Recipe\(state_free=\.\.\.\) must be a tuple"),
    ],
)
def test_a_bad_recipe_is_refused_when_made(torch, gt, kwargs, message):
    """A recipe is checked when it is made, naming the field and the fix, before any optimizer uses it."""
    with pytest.raises(TypeError, match=message):
        gt.Recipe(**kwargs)


@pytest.mark.parametrize(
    "name",
    ["Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "Gradient", "Momentum", "PaperAdam"],
)
def test_a_named_optimizers_defaults_are_its_arguments(torch, gt, device, name):
    """Every argument of a named optimizer's constructor but ``params``, ``skip_together`` (the optimizer's own)
    and, for the paper's methods, ``capturable`` (also the optimizer's) is a param-group default holding the
    value given, and no other key is, ``betas`` as a tuple (``param_groups.group_defaults``); AdamW's
    ``decoupled_weight_decay`` is set, not an argument. Each is given a value other than its default, so a
    key taken from the wrong argument shows."""
    import inspect

    cls = getattr(gt, name)
    signature = inspect.signature(cls.__init__)
    own = {"self", "params", "skip_together"} | (
        {"capturable"} if name in ("Gradient", "Momentum", "PaperAdam") else set()
    )
    given = {"lr": 0.25, "betas": [0.5, 0.75], "stabilize": 3, "seed": 7, "on_nonfinite": "raise"}
    kwargs = {k: v for k, v in given.items() if k in signature.parameters}
    opt = cls([torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.float64, device=device))], **kwargs)
    expected = {k: p.default for k, p in signature.parameters.items() if k not in own}
    expected.update({k: tuple(v) if k == "betas" else v for k, v in kwargs.items()})
    if name == "AdamW":
        expected["decoupled_weight_decay"] = True
    assert {k: opt.defaults.get(k, "missing") for k in expected} == expected
    # the optimizer's own options, which geoarray.torch.Optimizer adds to every group
    assert set(opt.defaults) - set(expected) <= {"capturable", "skip_together"}, sorted(opt.defaults)
    group = opt.param_groups[0]
    assert {k: group.get(k, "missing") for k in expected} == expected


def test_a_group_edited_between_steps_is_checked_again(torch, gt, device):
    """A step reuses a param group's key while none of its values changed (``Optimizer._step_key``): a value
    assigned anew, or a list changed in place, is checked at the next step, and the step that refuses it
    changes nothing."""
    W = torch.nn.Parameter(torch.ones(3, 2, dtype=torch.float64, device=device))
    opt = gt.Adam([W], lr=0.1)
    W.grad = torch.full_like(W, 0.5)
    opt.step()
    opt.step()
    group = opt.param_groups[0]
    group["eps"] = -1.0
    before = W.detach().clone()
    with pytest.raises(ValueError, match="eps"):
        opt.step()
    assert torch.equal(W.detach(), before)
    group["eps"] = 1e-8
    opt.step()
    group["betas"] = [0.9, 0.999]  # a list: it can change in place
    opt.step()
    group["betas"][0] = 1.5
    before = W.detach().clone()
    with pytest.raises(ValueError, match="betas"):
        opt.step()
    assert torch.equal(W.detach(), before)
