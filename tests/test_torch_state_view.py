"""opt.state[p]: each parameter's state under torch's names, read-only views of the grouped state.

Properties: on plain float64 tensors, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` (Adam, AdamW) and
``momentum_buffer`` (SGD) equal torch.optim's own ``state[p]`` entries to 1e-12 after several steps,
for parameters that the core stacks or ravels together, and ``step`` counts the steps; a
ManifoldParameter's moments are horizontal elements of g^hor (a skew n×n A, an (N−n)×n B); a parameter
without state reads ``{}``; writing into the returned dict changes nothing; ``state_dict()["state"]``
stays empty (the grouped state is saved under "geoarray") and a deepcopy keeps the view working.
"""

from __future__ import annotations

import copy

import pytest

from _helpers import assert_agree
from geoarray import Stiefel

pytestmark = pytest.mark.usefixtures("torch_only")


def _plain(torch, device):
    g = torch.Generator().manual_seed(0)
    # two (3, 4) tensors (one flat Euclidean group with the vector) and a vector
    return [
        torch.randn(s, generator=g, dtype=torch.float64).to(device).requires_grad_() for s in ((3, 4), (5,), (3, 4))
    ]


def _step(torch, params, t):
    g = torch.Generator().manual_seed(t)
    for p in params:
        p.grad = torch.randn(tuple(p.shape), generator=g, dtype=p.dtype).to(p.device)


@pytest.mark.parametrize(
    ("name", "kwargs", "keys"),
    [
        ("Adam", {"lr": 0.05, "amsgrad": True}, ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
        ("AdamW", {"lr": 0.05}, ("exp_avg", "exp_avg_sq")),
        ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.2}, ("momentum_buffer",)),
    ],
)
def test_state_entries_equal_torchs(torch, gt, device, name, kwargs, keys):
    ours, theirs = _plain(torch, device), _plain(torch, device)
    opt, ref = getattr(gt, name)(ours, **kwargs), getattr(torch.optim, name)(theirs, **kwargs)
    assert opt.state[ours[0]] == {}
    for t in range(4):
        _step(torch, ours, t)
        _step(torch, theirs, t)
        opt.step()
        ref.step()
    assert len(opt.state) == 3 and all(p in opt.state for p in ours)
    for p, q in zip(ours, theirs, strict=True):
        mine = opt.state[p]
        assert int(mine["step"]) == 4
        assert set(keys) <= set(mine), f"{sorted(mine)} lacks {keys}"
        for k in keys:
            assert_agree(mine[k], ref.state[q][k], rtol=1e-12, what=k)
    assert opt.state_dict()["state"] == {}


def test_manifold_moments_are_horizontal_elements(torch, gt, device):
    M = Stiefel(6, 2)
    Y = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    opt = gt.Adam([Y], lr=0.05)
    _step(torch, [Y], 0)
    opt.step()
    m = opt.state[Y]["exp_avg"]
    assert m.A.shape == (2, 2) and m.B.shape == (4, 2)
    assert_agree(m.A, -m.A.mT, rtol=1e-14, what="A is skew")
    assert float(m.B.abs().max()) > 0


def test_the_mapping_is_read_only(torch, gt, device):
    a, b = _plain(torch, device), _plain(torch, device)
    opt_a, opt_b = gt.Adam(a, lr=0.05), gt.Adam(b, lr=0.05)
    for t in range(2):
        _step(torch, a, t)
        _step(torch, b, t)
        opt_a.step()
        opt_b.step()
    entry = opt_a.state[a[0]]
    entry["exp_avg"] = None
    entry["new"] = 1
    assert opt_a.state[a[0]]["exp_avg"] is not None and "new" not in opt_a.state[a[0]]
    _step(torch, a, 2)
    _step(torch, b, 2)
    opt_a.step()
    opt_b.step()
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p, q)
    clone = copy.deepcopy(opt_a)
    assert set(clone.state[clone.param_groups[0]["params"][1]]) >= {"step"}


def test_a_partitioned_core_reads_empty(torch, gt, device):
    import geoarray.optim as go

    params = _plain(torch, device)
    core = go.partition({"x": go.Adam(1e-2), "y": go.Momentum(1e-2)}, ["x", "y", "x"])
    opt = gt.Optimizer(params, core)
    _step(torch, params, 0)
    opt.step()
    assert opt.state[params[0]] == {} and params[0] in opt.state
