"""``torch.compile(opt.step, fullgraph=True)`` for geoarray.torch optimizers.

Properties (``backend="aot_eager"``: dynamo's graph capture and AOT autograd without inductor's code
generation, which is too slow for the test matrix): after one eager step (which builds the state and
checks the weights), the compiled step is one graph — ``fullgraph=True`` refuses any graph break —
and one compilation serves every later step (a recompilation is an error here); over 3 steps on a
model with a ManifoldParameter and a plain tensor it equals the eager step to ``AGREE_RTOL`` (two
code paths), for every geoarray.torch optimizer (torch's Adam, AdamW and SGD conventions, the paper's
Adam, Gradient, Momentum, AdamWithDecay, and ManifoldMuon on the manifold weight alone: it refuses
vectors); the weight stays on its manifold. A compiled step that would have to build state raises
``RuntimeError`` saying to run it eagerly, and ``validate()`` checks the values on request, naming the
parameter. (``capturable=True``: ``tests/test_torch_capturable.py``.)
"""

from __future__ import annotations

import pytest

import geoarray
from _helpers import assert_agree

pytestmark = [
    pytest.mark.usefixtures("torch_only"),
    pytest.mark.filterwarnings("ignore:Dynamo detected:UserWarning"),
]

M = geoarray.Stiefel(6, 3)


def _model(torch, gt, device):
    W = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    g = torch.Generator().manual_seed(1)
    b = torch.nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64).to(device))
    return W, b


def _loss(torch, W, b, step, device):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64).to(device)
    return (torch.tanh(x @ W + b) - 0.5).square().sum()


OPTIMIZERS = {
    "Adam": lambda gt, ps: gt.Adam(ps, lr=1e-2, weight_decay=1e-3),
    "PaperAdam": lambda gt, ps: gt.PaperAdam(ps, lr=1e-2),
    "SGD": lambda gt, ps: gt.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
    "AdamW": lambda gt, ps: gt.AdamW(ps, lr=1e-2),
    "Gradient": lambda gt, ps: gt.Gradient(ps, lr=1e-2),
    "Momentum": lambda gt, ps: gt.Momentum(ps, lr=1e-2),
    "AdamWithDecay": lambda gt, ps: gt.AdamWithDecay(ps, n_steps=10),
    "ManifoldMuon": lambda gt, ps: gt.ManifoldMuon([ps[0]], lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_is_one_graph_and_equals_the_eager_step(torch, gt, device, name):
    import torch._dynamo

    torch._dynamo.reset()
    eager, compiled = _model(torch, gt, device), _model(torch, gt, device)
    opt_eager, opt_compiled = OPTIMIZERS[name](gt, list(eager)), OPTIMIZERS[name](gt, list(compiled))
    step = torch.compile(opt_compiled.step, fullgraph=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for t in range(4):
            for params, opt, run in ((eager, opt_eager, opt_eager.step), (compiled, opt_compiled, step)):
                opt.zero_grad()
                _loss(torch, *params, t, device).backward()
                (opt.step if t == 0 else run)()  # the first step eagerly: it builds the state
            for p, q in zip(compiled, eager, strict=True):
                assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")
    assert M.is_point(compiled[0].detach(), atol=1e-12)
    assert sorted(opt_compiled.state[compiled[1]]) == sorted(opt_eager.state[eager[1]])


def test_compiled_first_step_says_to_run_it_eagerly(torch, gt, device):
    import torch._dynamo

    torch._dynamo.reset()
    W, b = _model(torch, gt, device)
    opt = gt.Adam([W, b], lr=1e-2)
    before = W.detach().clone()
    _loss(torch, W, b, 0, device).backward()
    step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"cannot build optimizer state.*Run that step eagerly") as info:
        step()
    assert isinstance(info.value, RuntimeError) or "RuntimeError" in type(info.value).__name__
    assert torch.equal(W.detach(), before)
    opt.step()  # eagerly: it builds the state, and the compiled steps can follow
    assert M.is_point(W.detach(), atol=1e-12)


def test_validate_checks_the_values_on_request(torch, gt, device):
    W, b = _model(torch, gt, device)
    opt = gt.Adam([("layer.W", W), ("layer.b", b)], lr=1e-2)
    opt.validate()  # on the manifold: nothing to say
    with torch.no_grad():
        W.mul_(1.01)
    with pytest.raises(ValueError, match=r"'layer.W' is not a point of Stiefel\(6, 3\).*max\|YᵀY − I\|"):
        opt.validate()
