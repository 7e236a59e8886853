"""geoarray.torch.Adam, AdamW and SGD: torch.optim's signatures, defaults and results.

Properties: on plain float64 tensors, six steps equal ``torch.optim.Adam``/``AdamW``/``SGD`` with the same
arguments to 1e-12 relative (every option: coupled/decoupled weight decay, amsgrad, maximize, momentum,
dampening, Nesterov, param groups with their own hyperparameters); on a ManifoldParameter the step is
torch.optim's update of the lifted gradient B ∈ g^hor (torch.optim.Adam itself run on B's coordinates)
followed by the retraction, to 1e-12; decoupled weight decay vanishes on Stiefel (‖Y‖ is constant);
the signatures carry torch's defaults; implementation switches are accepted or refused with a reason;
unknown param-group keys are refused.
"""

from __future__ import annotations

import inspect

import pytest

from _helpers import assert_agree
from geoarray import Stiefel

pytestmark = pytest.mark.usefixtures("torch_only")

SHAPES = [(5, 3), (4,), (2, 3, 2)]
N_STEPS = 6


def _plain(torch, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(device).requires_grad_() for s in SHAPES]


def _set_grads(torch, params, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(tuple(p.shape), generator=g, dtype=p.dtype).to(p.device)


def _compare(torch, device, make_ours, make_theirs, n_steps=N_STEPS, groups=None):
    ours, theirs = _plain(torch, device), _plain(torch, device)
    split = (lambda ps: ps) if groups is None else groups
    opt_ours, opt_theirs = make_ours(split(ours)), make_theirs(split(theirs))
    for t in range(n_steps):
        _set_grads(torch, ours, t)
        _set_grads(torch, theirs, t)
        opt_ours.step()
        opt_theirs.step()
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_agree(a.detach(), b.detach(), rtol=1e-12, what=f"parameter {k}")
    return opt_ours, ours


ADAM = [
    {"lr": 0.05},
    {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.3},
    {"lr": 0.05, "weight_decay": 0.2, "decoupled_weight_decay": True, "amsgrad": True},
    {"lr": 0.05, "amsgrad": True, "maximize": True, "foreach": False},
]
SGD = [
    {"lr": 0.1},
    {"lr": 0.1, "momentum": 0.9},
    {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.05},
    {"lr": 0.1, "momentum": 0.8, "nesterov": True, "weight_decay": 0.05, "maximize": True},
]


@pytest.mark.parametrize("kwargs", ADAM, ids=str)
def test_adam_equals_torch_adam_on_plain_tensors(torch, gt, device, kwargs):
    _compare(torch, device, lambda ps: gt.Adam(ps, **kwargs), lambda ps: torch.optim.Adam(ps, **kwargs))


@pytest.mark.parametrize("kwargs", [{"lr": 0.05}, {"lr": 0.05, "weight_decay": 0.3, "amsgrad": True}], ids=str)
def test_adamw_equals_torch_adamw_on_plain_tensors(torch, gt, device, kwargs):
    _compare(torch, device, lambda ps: gt.AdamW(ps, **kwargs), lambda ps: torch.optim.AdamW(ps, **kwargs))


@pytest.mark.parametrize("kwargs", SGD, ids=str)
def test_sgd_equals_torch_sgd_on_plain_tensors(torch, gt, device, kwargs):
    _compare(torch, device, lambda ps: gt.SGD(ps, **kwargs), lambda ps: torch.optim.SGD(ps, **kwargs))


def test_param_groups_with_their_own_hyperparameters_equal_torch(torch, gt, device):
    def groups(ps):
        return [{"params": ps[:1]}, {"params": ps[1:], "lr": 0.2, "betas": (0.5, 0.9), "weight_decay": 0.1}]

    _compare(torch, device, lambda g: gt.Adam(g, lr=0.05), lambda g: torch.optim.Adam(g, lr=0.05), groups=groups)


def test_signatures_carry_torchs_defaults(torch, gt):
    for ours, theirs in ((gt.Adam, torch.optim.Adam), (gt.AdamW, torch.optim.AdamW), (gt.SGD, torch.optim.SGD)):
        mine = inspect.signature(ours.__init__).parameters
        for name, par in inspect.signature(theirs.__init__).parameters.items():
            if name == "self":
                continue
            assert name in mine, f"{ours.__name__} lacks torch's argument {name}"
            assert mine[name].default == par.default, f"{ours.__name__}({name}=…) default differs from torch's"
            assert mine[name].kind == par.kind, f"{ours.__name__}({name}) is {mine[name].kind}, torch's {par.kind}"


def _flat(torch, element):
    return torch.cat([f.reshape(-1) for f in element])


def _unflat(element, flat):
    out, offset = [], 0
    for f in element:
        out.append(flat[offset : offset + f.numel()].reshape(f.shape))
        offset += f.numel()
    return type(element)(*out)


@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"),
    [
        ("Adam", "Adam", {"lr": 0.05, "betas": (0.8, 0.95)}),
        ("Adam", "Adam", {"lr": 0.05, "amsgrad": True, "maximize": True}),
        ("SGD", "SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        ("SGD", "SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}),
    ],
)
def test_manifold_parameter_takes_torchs_update_of_the_lifted_gradient(torch, gt, device, ours, theirs, kwargs):
    """Y ← λ(Y)·retraction(W)·E with W the step torch.optim takes on the coordinates of B = lift(∇L) (a
    dummy tensor Z reset to 0 before each step, so torch's step is Z's new value)."""
    M = Stiefel(7, 3)
    Y0 = M.random(5, xp=torch, dtype=torch.float64, device=device)
    W = gt.ManifoldParameter(Y0.clone(), M)
    opt = getattr(gt, ours)([W], **kwargs)
    Y = Y0.clone()
    lam = M.global_section(Y, strategy="householder")
    Z = torch.zeros_like(_flat(torch, M.lift(Y, lam, torch.zeros_like(Y))), requires_grad=True)
    ref = getattr(torch.optim, theirs)([Z], **kwargs)
    for t in range(N_STEPS):
        g = torch.Generator().manual_seed(t)
        G = torch.randn(7, 3, generator=g, dtype=torch.float64).to(device)
        W.grad = G.clone()
        opt.step()
        lam = M.global_section(Y, strategy="householder")
        B = M.lift(Y, lam, G)
        with torch.no_grad():
            Z.zero_()
        Z.grad = _flat(torch, B)
        ref.step()
        Y = M.apply_retraction(lam, _unflat(B, Z.detach().clone()))
        assert_agree(W.detach(), Y, rtol=1e-12, what=f"step {t}")
    assert M.is_point(W.detach(), atol=1e-12)


def test_decoupled_weight_decay_vanishes_on_stiefel(torch, gt, device):
    """The decay is the lift of grad ½‖Y‖², zero on Stiefel (‖Y‖_F² = n): AdamW equals Adam there, while
    on a plain tensor the same decay shrinks the weight."""
    M = Stiefel(6, 2)
    Y0 = M.random(1, xp=torch, dtype=torch.float64, device=device)
    a, b = gt.ManifoldParameter(Y0.clone(), M), gt.ManifoldParameter(Y0.clone(), M)
    opt_a, opt_b = gt.AdamW([a], lr=0.05, weight_decay=0.5), gt.Adam([b], lr=0.05)
    for t in range(4):
        G = torch.randn(6, 2, generator=torch.Generator().manual_seed(t), dtype=torch.float64).to(device)
        a.grad, b.grad = G.clone(), G.clone()
        opt_a.step()
        opt_b.step()
    assert_agree(a.detach(), b.detach(), rtol=1e-12)


def test_implementation_switches_are_accepted_or_refused_with_a_reason(torch, gt, device):
    p = _plain(torch, device)
    for cls in (gt.Adam, gt.AdamW, gt.SGD):
        cls(p, foreach=True)
        cls(p, foreach=False, fused=False, differentiable=False)
        with pytest.raises(ValueError, match=r"fused=True.*not supported"):
            cls(p, fused=True)
        with pytest.raises(ValueError, match=r"differentiable=True.*not supported"):
            cls(p, differentiable=True)
    for cls in (gt.Adam, gt.AdamW):  # capturable: tests/test_torch_capturable.py
        cls(p, capturable=True)
        cls(p, lr=torch.tensor(1e-3, device=p[0].device), capturable=True)  # read on the device at every step


def test_bad_values_and_unknown_group_keys_are_refused(torch, gt, device):
    p = _plain(torch, device)
    with pytest.raises(ValueError, match="betas"):
        gt.Adam(p, betas=(0.9, 1.5))
    with pytest.raises(ValueError, match="nesterov"):
        gt.SGD(p, nesterov=True)
    with pytest.raises(ValueError, match=r"keys \['betas1'\].*does not know"):
        gt.Adam([{"params": p, "betas1": 0.9}])
    with pytest.raises(ValueError, match=r"keys \['alpha'\]"):
        gt.SGD([{"params": p, "alpha": 0.9}])
    opt = gt.Adam(p, lr=0.1)
    _set_grads(torch, p, 0)
    opt.step()
    before = [q.detach().clone() for q in p]
    opt.param_groups[0]["betas"] = (0.9, 2.0)  # set by hand to a bad value: refused, nothing changes
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['betas'\]\[1\]"):
        opt.step()
    for q, r in zip(p, before, strict=True):
        assert torch.equal(q.detach(), r)


def test_paper_variant_is_one_name_away(torch, gt, device):
    """PaperAdam is the paper's Adam (β = (0.9, 0.99), δ = 3e-7 inside the root, ε = 0); Adam with the
    same three values computes the same update."""
    M = Stiefel(6, 2)
    Y0 = M.random(2, xp=torch, dtype=torch.float64, device=device)
    a, b = gt.ManifoldParameter(Y0.clone(), M), gt.ManifoldParameter(Y0.clone(), M)
    opt_a = gt.PaperAdam([a], lr=0.05)
    opt_b = gt.Adam([b], lr=0.05, betas=(0.9, 0.99), eps=0.0, delta=3e-7)
    for t in range(4):
        G = torch.randn(6, 2, generator=torch.Generator().manual_seed(t), dtype=torch.float64).to(device)
        a.grad, b.grad = G.clone(), G.clone()
        opt_a.step()
        opt_b.step()
    assert_agree(a.detach(), b.detach(), rtol=1e-12)
    assert gt.BrantnerAdam is gt.PaperAdam
