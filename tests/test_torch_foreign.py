"""torch code that is not geoarray's, on ManifoldParameters: no silent step off the manifold.

* a foreign optimizer (``torch.optim.RMSprop``) warns once, at its first step, naming the parameter, its
  manifold and both fixes (geoarray.torch's optimizer of the same name where there is one, RMSprop here;
  else Adam, AdamW or SGD); geoarray's own optimizers (and ZeRO around one) never warn;
* ``geoarray.torch.project_after(opt)`` keeps RMSprop's Stiefel weight orthonormal (max|WᵀW − I| ≤ 1e-5 in
  float32 after 50 steps, while the loss decreases) and silences the warning;
* module operations: ``load_state_dict(assign=True)`` and ``module.weight = nn.Parameter(W)`` keep the
  manifold (off-manifold values projected to 1e-12 in float64, on-manifold ones kept bit for bit and
  storage-shared); ``copy.deepcopy`` keeps it; ``torch.nn.utils.parametrize`` keeps the ManifoldParameter
  as ``parametrizations.<name>.original``; ``module.to_empty`` keeps it and the first geoarray step refuses
  the uninitialised values with the fix; a meta-device ManifoldParameter is refused with the fix; assigning
  to a wide ``orthogonal_`` weight projects;
* torch's own ``fully_shard`` (a 1-rank gloo group in this process) is refused at the first step of a
  geoarray optimizer with the fix, ``geoarray.torch.fully_shard``, which steps.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest

import geoarray as ga

pytestmark = pytest.mark.usefixtures("torch_only")


def _err(W):
    import torch

    W = W.detach().double()
    return float((W.mT @ W - torch.eye(W.shape[-1], dtype=W.dtype)).abs().max())


def _model(torch, gt, dtype=None):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 8, bias=False)
    if dtype is not None:
        lin = lin.to(dtype)
    return gt.orthogonal_(lin)  # lin.weight: ManifoldParameter on Stiefel(8, 4)


def _loss(torch, lin):
    x = torch.linspace(-1, 1, 12, dtype=lin.weight.dtype).reshape(3, 4)
    target = torch.linspace(1, -1, 24, dtype=lin.weight.dtype).reshape(3, 8)
    return (lin(x) - target).square().sum()


def _steps(torch, lin, opt, n):
    losses = []
    for _ in range(n):
        opt.zero_grad()
        loss = _loss(torch, lin)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_foreign_optimizer_warns_once_naming_parameter_manifold_and_fix(torch, gt):
    lin = _model(torch, gt)
    opt = torch.optim.RMSprop(lin.parameters(), lr=1e-2)
    with pytest.warns(UserWarning) as record:
        _steps(torch, lin, opt, 3)
    messages = [str(w.message) for w in record if "not a geoarray optimizer" in str(w.message)]
    assert len(messages) == 1  # once, at the first step
    msg = messages[0]
    assert "RMSprop is not a geoarray optimizer" in msg
    assert "param_groups[0]['params'][0] of shape (8, 4) on Stiefel(8, 4)" in msg
    # geoarray.torch has an RMSprop of torch's signature: the warning names it
    assert "use geoarray.torch.RMSprop (Riemannian)" in msg and "geoarray.torch.project_after(optimizer)" in msg
    assert _err(lin.weight) > 1e-4  # what the warning is about: the steps left the manifold
    # an optimizer geoarray.torch has no namesake of: the warning names the Adam/AdamW/SGD route
    lin = _model(torch, gt)
    opt = torch.optim.Adadelta(lin.parameters())
    with pytest.warns(UserWarning, match=r"Adadelta is not a geoarray.*geoarray\.torch\.Adam, AdamW or SGD"):
        _steps(torch, lin, opt, 1)
    # named parameters (torch's named param groups) are named
    lin = _model(torch, gt)
    opt = torch.optim.SGD(lin.named_parameters(), lr=1e-2)
    with pytest.warns(UserWarning, match=r"SGD is not a geoarray.*'weight' on Stiefel\(8, 4\).*geoarray\.torch\.SGD "):
        _steps(torch, lin, opt, 1)


def test_project_after_keeps_rmsprop_on_the_manifold_without_warning(torch, gt):
    lin = _model(torch, gt, torch.float32)
    opt = gt.project_after(torch.optim.RMSprop(lin.parameters(), lr=1e-2))
    assert gt.project_after(opt) is opt  # idempotent: one projection per step
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = _steps(torch, lin, opt, 50)
    assert isinstance(lin.weight, gt.ManifoldParameter)
    assert _err(lin.weight) <= 1e-5
    assert losses[-1] < 0.9 * losses[0]


def test_project_after_refuses_what_it_cannot_project(torch, gt):
    M = ga.SymplecticStiefel(4, 2)
    p = gt.ManifoldParameter(M.random(0, xp=torch), M)
    with pytest.raises(ValueError, match=r"SymplecticStiefel\(4, 2\), which has no closed-form projection.*geoarray"):
        gt.project_after(torch.optim.SGD([p], lr=0.1))
    with pytest.raises(TypeError, match="is a geoarray optimizer"):
        gt.project_after(gt.Adam(_model(torch, gt).parameters()))


def test_geoarray_optimizers_never_warn(torch, gt):
    for make in (gt.Adam, gt.AdamW, gt.SGD, gt.PaperAdam, gt.ManifoldMuon, gt.RMSprop, gt.Adagrad, gt.NAdam):
        lin = _model(torch, gt)
        opt = make(lin.parameters(), lr=1e-2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _steps(torch, lin, opt, 2)
        assert _err(lin.weight) <= 1e-10


def test_load_state_dict_assign_and_parameter_assignment_keep_the_manifold(torch, gt):
    lin = _model(torch, gt, torch.float64)
    M = lin.weight.manifold
    sd = {"weight": M.random(1, xp=torch)}
    lin.load_state_dict(sd, assign=True)
    assert isinstance(lin.weight, gt.ManifoldParameter) and lin.weight.manifold == M
    assert lin.weight.data_ptr() == sd["weight"].data_ptr()  # on the manifold: assigned as is (bit for bit)
    off = torch.linspace(-1, 1, 32, dtype=torch.float64).reshape(8, 4) + torch.eye(8, 4, dtype=torch.float64)
    lin.load_state_dict({"weight": off}, assign=True)
    assert isinstance(lin.weight, gt.ManifoldParameter) and _err(lin.weight) <= 1e-12
    assert torch.allclose(lin.weight.detach(), M.nearest_point(off), atol=1e-12)  # projected: the polar factor
    lin.weight = torch.nn.Parameter(off.clone())  # a new Parameter (a bare tensor: tests/test_torch_module_routes.py)
    assert isinstance(lin.weight, gt.ManifoldParameter) and _err(lin.weight) <= 1e-12
    with pytest.raises(ValueError, match=r"Linear.weight \(on Stiefel\(8, 4\)\) cannot take.*del it first"):
        lin.weight = torch.nn.Parameter(torch.ones(3, 3, dtype=torch.float64))
    del lin.weight  # dropping the constraint is explicit
    lin.weight = torch.nn.Parameter(off.clone())
    assert not isinstance(lin.weight, gt.ManifoldParameter)


def test_assigning_to_a_wide_orthogonal_weight_projects(torch, gt):
    wide = gt.orthogonal_(torch.nn.Linear(8, 4, bias=False).double())  # 4×8: orthonormal rows via parametrize
    W0 = torch.linspace(-1, 1, 32, dtype=torch.float64).reshape(4, 8) + torch.eye(4, 8, dtype=torch.float64)
    wide.weight = W0
    original = wide.parametrizations.weight.original
    assert isinstance(original, gt.ManifoldParameter) and _err(original) <= 1e-12
    assert torch.allclose(wide.weight, original.manifold.nearest_point(W0.mT).mT, atol=1e-12)


def test_deepcopy_parametrize_and_to_empty_keep_the_manifold(torch, gt):
    lin = _model(torch, gt)
    clone = copy.deepcopy(lin)
    assert isinstance(clone.weight, gt.ManifoldParameter) and clone.weight.manifold == lin.weight.manifold
    assert clone.weight is not lin.weight and torch.equal(clone.weight, lin.weight)

    class Double(torch.nn.Module):
        def forward(self, X):
            return 2 * X

    p = lin.weight
    torch.nn.utils.parametrize.register_parametrization(lin, "weight", Double())
    assert lin.parametrizations.weight.original is p and p.manifold == ga.Stiefel(8, 4)
    assert torch.equal(lin.weight, 2 * p)
    opt = gt.Adam(lin.parameters(), lr=1e-2)
    _steps(torch, lin, opt, 2)
    assert _err(p) <= 1e-10  # stepped on its manifold through the parametrization

    lin = _model(torch, gt)
    lin.to_empty(device="cpu")
    assert isinstance(lin.weight, gt.ManifoldParameter)
    with torch.no_grad():
        lin.weight.fill_(1.0)  # what uninitialised memory may hold: rank one, off the manifold
    opt = gt.Adam(lin.parameters(), lr=1e-2)
    with pytest.raises(ValueError, match=r"is not a point of Stiefel\(8, 4\).*uniform_init_"):
        _steps(torch, lin, opt, 1)
    gt.init.uniform_init_(lin.weight)  # the fix the error names
    _steps(torch, lin, opt, 1)
    assert _err(lin.weight) <= 1e-10


def test_meta_device_manifold_parameter_is_refused_with_the_fix(torch, gt):
    with pytest.raises(ValueError, match=r"meta device.*to_empty.*check=False.*geoarray.torch.fully_shard"):
        gt.ManifoldParameter(torch.empty(6, 3, device="meta"), ga.Stiefel(6, 3))


def test_torch_fully_shard_is_refused_at_the_first_step_geoarrays_steps(torch, gt):
    """A 1-rank gloo group in this process (FSDP2 needs one); torch's fully_shard drops the manifold."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from _distributed import free_port

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:

        class Frames(torch.nn.Module):
            def __init__(self):
                super().__init__()
                Y = ga.Stiefel(6, 3).random(0, xp=torch, batch_shape=(2,), dtype=torch.float32)
                self.F = gt.ManifoldParameter(Y.contiguous(), ga.Stiefel(6, 3))
                self.b = torch.nn.Parameter(torch.zeros(3, dtype=torch.float32))

            def forward(self, x):
                return ((x @ self.F).sum() + self.b.sum()).square()

        def module():
            return Frames()

        def step(m, opt):
            m(torch.linspace(-1, 1, 6, dtype=torch.float32)).backward()
            opt.step()

        m = module()
        fully_shard(m)
        opt = gt.Adam(m.parameters(), lr=1e-1)
        with pytest.raises(
            ValueError, match=r"\(F\) was a ManifoldParameter on Stiefel\(6, 3\).*geoarray.torch.fully_shard"
        ):
            step(m, opt)
        with pytest.warns(UserWarning, match=r"SGD is not a geoarray.*on Stiefel\(6, 3\)"):
            step(m, torch.optim.SGD(m.parameters(), lr=1e-1))  # a foreign optimizer's warning names it too
        m = module()
        gt.fully_shard(m)
        opt = gt.Adam(m.parameters(), lr=1e-1)
        step(m, opt)
        assert _err(m.F.full_tensor()) <= 1e-5
    finally:
        dist.destroy_process_group()
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
