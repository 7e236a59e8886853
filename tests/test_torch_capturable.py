"""``capturable=True`` for geoarray.torch's optimizers (#30, item 2): a step that a CUDA graph can
capture together with the forward and backward, as ``torch.optim.Adam(capturable=True)`` is.

A captured graph replays the kernels of the step it recorded on the same memory, and none of the
step's Python runs again. So the step must keep its state in fixed buffers, written in place (the
parameters already are), change nothing on the Python side after the step that made them, and read
nothing to the host (the device's default policy, :func:`geoarray.set_host_reads`). Properties:

* on the CPU, over 4 steps of a model with a ManifoldParameter and a plain tensor (float64), for every
  geoarray.torch optimizer (torch's Adam, AdamW — also amsgrad, maximize — and SGD conventions, the
  paper's Adam, Gradient, Momentum, AdamWithDecay, ManifoldMuon, ``Optimizer(params, core)``): from the
  second step on, every state tensor of every cohort is the same tensor object at the same address, the
  optimizer's Python-side state (cohorts, their keys, ``param_groups``) is unchanged by a step, and the
  parameters and state agree with ``capturable=False`` to ``AGREE_RTOL``;
* a capturable optimizer's ``state_dict`` loads into a new optimizer, capturable or not, and the resumed
  steps equal the uninterrupted ones bit for bit;
* a tensor lr on the parameters' device, written in place by a scheduler, is read there at every step
  (the same weights as a float lr under the same scheduler, the same buffers);
* refusals, each naming the fix, nothing changed: a tensor lr on another device or for a manifold Muon
  core given as an instance (which takes its rate at construction), ``stabilize`` (a Python count), and a
  captured step that would build state or make the buffers (the capture is simulated on the CPU by making
  ``torch.cuda.is_current_stream_capturing`` answer True);
* on a CUDA device (``torch-cuda`` session): forward, backward and step captured in one
  ``torch.cuda.CUDAGraph`` and replayed on new batches agree with eager ``capturable=False`` steps to
  ``AGREE_RTOL`` (float64) and keep the weight on its manifold to 1e-12, also with a tensor lr whose
  value changes between replays. Skipped on the CPU: CUDA graphs exist only on CUDA devices.
"""

from __future__ import annotations

import optree
import pytest

import geoarray
from _helpers import assert_agree

pytestmark = [
    pytest.mark.usefixtures("torch_only"),
    pytest.mark.filterwarnings("error:Dynamo detected:UserWarning"),
]

M = geoarray.Stiefel(6, 3)

# factory(gt, params, capturable): every geoarray.torch optimizer (SGD through its param group, since
# torch.optim.SGD's signature has no capturable; ManifoldMuon on the manifold weight alone)
OPTIONS = {
    "Adam": lambda gt, ps, c: gt.Adam(ps, lr=1e-2, weight_decay=1e-3, capturable=c),
    "AdamW": lambda gt, ps, c: gt.AdamW(ps, lr=1e-2, weight_decay=1e-2, capturable=c),
    "Adam-amsgrad": lambda gt, ps, c: gt.Adam(ps, lr=1e-2, amsgrad=True, capturable=c),
    "Adam-maximize": lambda gt, ps, c: gt.Adam(ps, lr=1e-2, maximize=True, capturable=c),
    "SGD": lambda gt, ps, c: gt.SGD([{"params": ps, "capturable": c}], lr=1e-2, momentum=0.9, nesterov=True),
    "PaperAdam": lambda gt, ps, c: gt.PaperAdam(ps, lr=1e-2, capturable=c),
    "Gradient": lambda gt, ps, c: gt.Gradient(ps, lr=1e-2, capturable=c),
    "Momentum": lambda gt, ps, c: gt.Momentum(ps, lr=1e-2, capturable=c),
    "AdamWithDecay": lambda gt, ps, c: gt.AdamWithDecay(ps, n_steps=10, capturable=c),
    "ManifoldMuon": lambda gt, ps, c: gt.ManifoldMuon(ps[:1], lr=1e-2, capturable=c),
    "Optimizer(core)": lambda gt, ps, c: gt.Optimizer(ps, geoarray.optim.Adam(lr=1e-2), capturable=c),
}


def _model(torch, gt, device):
    W = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    g = torch.Generator().manual_seed(1)
    b = torch.nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64).to(device))
    return W, b


def _batch(torch, step, device):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 6, generator=g, dtype=torch.float64).to(device)


def _loss(torch, W, b, x):
    return (torch.tanh(x @ W + b) - 0.5).square().sum()


def _state_tensors(opt):
    return [leaf for cohorts in opt._cohorts for c in cohorts for leaf in optree.tree_leaves(c.state)]


def _python_side(opt):
    """What a replayed graph cannot change: the cohorts (their parameters, keys, core objects and
    the identity of every state tensor) and the param groups' values."""
    cohorts = [
        (c.indices, c.key, id(c.core), c.buffers, [id(t) for t in optree.tree_leaves(c.state)])
        for cohorts in opt._cohorts
        for c in cohorts
    ]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return cohorts, groups


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_capturable_keeps_its_state_in_fixed_buffers_and_equals_the_default(torch, gt, device, name):
    fixed, free = _model(torch, gt, device), _model(torch, gt, device)
    opt_fixed, opt_free = OPTIONS[name](gt, list(fixed), True), OPTIONS[name](gt, list(free), False)
    addresses = [p.data_ptr() for p in fixed]
    before = buffers = None  # the Python side and the state tensors after the previous step
    for t in range(4):
        x = _batch(torch, t, device)
        for params, opt in ((fixed, opt_fixed), (free, opt_free)):
            opt.zero_grad()
            _loss(torch, *params, x).backward()
            opt.step()
        if t:
            assert _python_side(opt_fixed) == before, f"{name}: step {t} changed the optimizer's Python side"
            tensors = _state_tensors(opt_fixed)
            assert [(id(s), s.data_ptr()) for s in tensors] == buffers, f"{name}: step {t} moved a state tensor"
        before = _python_side(opt_fixed)
        buffers = [(id(s), s.data_ptr()) for s in _state_tensors(opt_fixed)]
        assert [p.data_ptr() for p in fixed] == addresses
        for p, q in zip(fixed, free, strict=True):
            assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")
        for s, r in zip(_state_tensors(opt_fixed), _state_tensors(opt_free), strict=True):
            if s.is_floating_point():
                assert_agree(s, r, what=f"{name} state, step {t}")
            else:  # step and skip counters
                assert torch.equal(s, r), f"{name} state, step {t}: {s} != {r}"
    assert len({s.data_ptr() for s in _state_tensors(opt_fixed)}) == len(_state_tensors(opt_fixed))
    assert M.is_point(fixed[0].detach(), atol=1e-12)


def test_capturable_refusals_name_the_fix(torch, gt, device):
    from geoarray.torch.param_groups import check_capturable

    W, b = _model(torch, gt, device)
    # a tensor lr elsewhere than the parameters: a captured step would read it once, at capture (a "meta"
    # tensor stands for the other device: this machine may have one device only)
    group = {"params": [W, b], "lr": torch.tensor(1e-2, device="meta"), "capturable": True}
    with pytest.raises(ValueError, match=r"Adam\(capturable=True\) takes a tensor lr on the parameters' device"):
        check_capturable(group, 0, "Adam")
    with pytest.raises(ValueError, match=r"AdamW\(capturable=True\) cannot take stabilize=5"):
        gt.AdamW([W, b], capturable=True, stabilize=5)
    # a manifold Muon core given as an instance took its rate at construction: a tensor lr would be read
    # with .item() at every step (geoarray.torch.ManifoldMuon reads it on the device)
    muon = gt.Optimizer([W], geoarray.optim.ManifoldMuon(1e-2))
    _loss(torch, W, b, _batch(torch, 0, device)).backward()
    muon.step()
    muon.param_groups[0].update(lr=torch.tensor(1e-2, device=device), capturable=True)
    before = W.detach().clone()
    with pytest.raises(ValueError, match=r"Optimizer\(capturable=True\) takes a float lr, got a tensor: its rate"):
        muon.step()
    assert torch.equal(W.detach(), before)
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['capturable'\] must be True or False, got 'yes'"):
        gt.Momentum([W, b], capturable="yes")
    opt = gt.Adam([W, b], lr=1e-2)
    _loss(torch, W, b, _batch(torch, 0, device)).backward()
    opt.step()
    opt.param_groups[0]["stabilize"] = 5  # set later: refused by the step, nothing changed
    opt.param_groups[0]["capturable"] = True
    before = W.detach().clone()
    with pytest.raises(ValueError, match=r"cannot take stabilize=5"):
        opt.step()
    assert torch.equal(W.detach(), before)


@pytest.mark.parametrize("name", ["Adam", "PaperAdam", "Gradient", "AdamWithDecay", "ManifoldMuon"])
def test_a_tensor_lr_is_read_on_the_device_and_follows_a_scheduler(torch, gt, device, name):
    """torch's recipe for a scheduled step in a CUDA graph: a tensor lr on the parameters' device, which
    the scheduler writes in place (``fill_``). With ``capturable=True`` the step multiplies by that tensor
    (no ``.item()``: a captured step would keep the value it was captured with), so over 4 steps of
    StepLR(γ = 0.7) the weights equal those of a float lr under the same scheduler to ``AGREE_RTOL``, and
    the state tensors stay the same objects at the same addresses."""
    makers = {
        "Adam": lambda ps, lr: gt.Adam(ps, lr=lr, weight_decay=1e-3, capturable=isinstance(lr, torch.Tensor)),
        "PaperAdam": lambda ps, lr: gt.PaperAdam(ps, lr=lr, capturable=isinstance(lr, torch.Tensor)),
        "Gradient": lambda ps, lr: gt.Gradient(ps, lr=lr, capturable=isinstance(lr, torch.Tensor)),
        # its decay from lr_start times lr/lr_start: a tensor lr scales the decayed rate
        "AdamWithDecay": lambda ps, lr: gt.AdamWithDecay(ps, n_steps=10, capturable=isinstance(lr, torch.Tensor)),
        # its core takes the group's rate as a schedule: a 0-d array, whose series degree is picked where it lives
        "ManifoldMuon": lambda ps, lr: gt.ManifoldMuon(ps[:1], lr=lr, capturable=isinstance(lr, torch.Tensor)),
    }
    tensor_run, float_run = _model(torch, gt, device), _model(torch, gt, device)
    opt = makers[name](list(tensor_run), torch.tensor(1e-2, dtype=torch.float64, device=device))
    if name == "AdamWithDecay":
        opt.param_groups[0]["lr"] = torch.tensor(opt.param_groups[0]["lr"], dtype=torch.float64, device=device)
    opt_float = makers[name](list(float_run), 1e-2)
    lr_tensor = opt.param_groups[0]["lr"]
    schedulers = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.7) for o in (opt, opt_float)]
    for t in range(4):
        for params, o, sched in ((tensor_run, opt, schedulers[0]), (float_run, opt_float, schedulers[1])):
            o.zero_grad()
            _loss(torch, *params, _batch(torch, t, device)).backward()
            o.step()
            sched.step()
        if t == 0:
            buffers = [(id(s), s.data_ptr()) for s in _state_tensors(opt)]
        assert [(id(s), s.data_ptr()) for s in _state_tensors(opt)] == buffers, f"step {t} moved a state tensor"
        assert opt.param_groups[0]["lr"] is lr_tensor  # written in place, as a captured graph needs
        for p, q in zip(tensor_run, float_run, strict=True):
            assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")
    assert abs(float(lr_tensor) - opt_float.param_groups[0]["lr"]) <= 1e-15
    assert M.is_point(tensor_run[0].detach(), atol=1e-12)


@pytest.mark.parametrize("case", ["first step", "buffers not made"])
def test_a_captured_step_cannot_build_state(torch, gt, device, monkeypatch, case):
    """Inside a capture (simulated: the CPU has no CUDA graphs) a step that would build the state, or
    make the fixed buffers, raises and changes nothing; run eagerly first, it then captures."""
    W, b = _model(torch, gt, device)
    opt = gt.Adam([W, b], lr=1e-2, capturable=case == "first step")
    _loss(torch, W, b, _batch(torch, 0, device)).backward()
    if case == "buffers not made":
        opt.step()  # built with capturable=False: the state is not in fixed buffers
        opt.param_groups[0]["capturable"] = True
    before = W.detach().clone()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    message = r"cannot build optimizer state" if case == "first step" else r"cannot make the state buffers"
    with pytest.raises(RuntimeError, match=message):
        opt.step()
    assert torch.equal(W.detach(), before)
    monkeypatch.undo()
    opt.step()  # eagerly: builds the state (or the buffers)
    assert all(c.buffers for cohorts in opt._cohorts for c in cohorts)


@pytest.fixture(params=["auto", "block-reflector"])
def section_form(request):
    """The Householder section's form for one test (``geoarray.set_section_form``): the backend's default, and
    the GEMM-only block reflector (issue #52), whose signed LU chooses its signs on the device."""
    import geoarray

    previous = geoarray.set_section_form(request.param)
    yield request.param
    geoarray.set_section_form(previous)


@pytest.mark.parametrize("lr_kind", ["float", "tensor"])
def test_forward_backward_and_step_replay_in_a_cuda_graph(torch, gt, device, lr_kind, section_form):
    """Forward, backward and step captured once and replayed on new batches equal eager steps; with a tensor
    lr on the device, rates written into it between replays (``fill_``, as a scheduler does) are the rates
    the replays take. Both with the default section and with the GEMM-only block reflector."""
    if not str(device).startswith("cuda"):
        pytest.skip("CUDA graphs exist only on CUDA devices; the CPU tests above check the fixed buffers")
    captured, eager = _model(torch, gt, device), _model(torch, gt, device)
    lr = torch.tensor(1e-2, dtype=torch.float64, device=device) if lr_kind == "tensor" else 1e-2
    opt = gt.Adam(list(captured), lr=lr, weight_decay=1e-3, capturable=True)
    opt_eager = gt.Adam(list(eager), lr=1e-2, weight_decay=1e-3)
    static_x = _batch(torch, 0, device).clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as torch's recipe: the first step builds the state
        for t in range(3):
            static_x.copy_(_batch(torch, t, device))
            opt.zero_grad(set_to_none=True)
            _loss(torch, *captured, static_x).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = _loss(torch, *captured, static_x)
        static_loss.backward()
        opt.step()
    for t in range(3):  # the reference takes the warm-up's steps eagerly
        opt_eager.zero_grad()
        _loss(torch, *eager, _batch(torch, t, device)).backward()
        opt_eager.step()
    for t in range(3, 8):
        if lr_kind == "tensor":  # a new rate for this replay and for the eager reference's step
            lr.fill_(1e-2 * 0.7 ** (t - 2))
            opt_eager.param_groups[0]["lr"] = 1e-2 * 0.7 ** (t - 2)
        static_x.copy_(_batch(torch, t, device))
        graph.replay()
        opt_eager.zero_grad()
        _loss(torch, *eager, _batch(torch, t, device)).backward()
        opt_eager.step()
        for p, q in zip(captured, eager, strict=True):
            assert_agree(p.detach(), q.detach(), what=f"replay {t}")
    torch.cuda.synchronize()
    assert M.is_point(captured[0].detach(), atol=1e-12)


def test_a_compiled_capturable_step_writes_the_same_buffers(torch, gt, device, section_form):
    """torch.compile(opt.step, fullgraph=True) after the eager first step keeps writing the state
    buffers in place (what a CUDA-graph mode such as ``mode="reduce-overhead"`` replays), one graph for
    every later step, equal to eager ``capturable=False`` steps to AGREE_RTOL; with either section form."""
    import torch._dynamo

    torch._dynamo.reset()
    fixed, free = _model(torch, gt, device), _model(torch, gt, device)
    opt = gt.Adam(list(fixed), lr=1e-2, capturable=True)
    opt_free = gt.Adam(list(free), lr=1e-2)
    step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for t in range(4):
            x = _batch(torch, t, device)
            for params, o, run in ((fixed, opt, step), (free, opt_free, opt_free.step)):
                o.zero_grad()
                _loss(torch, *params, x).backward()
                (o.step if t == 0 else run)()
            if t == 0:  # the eager first step made the buffers
                buffers = [(id(s), s.data_ptr()) for s in _state_tensors(opt)]
            assert [(id(s), s.data_ptr()) for s in _state_tensors(opt)] == buffers, f"step {t} moved a state tensor"
            for p, q in zip(fixed, free, strict=True):
                assert_agree(p.detach(), q.detach(), what=f"compiled capturable, step {t}")


@pytest.mark.parametrize("into", [True, False])
def test_a_capturable_state_dict_resumes_bit_exactly(torch, gt, device, into):
    """The state_dict of a capturable optimizer loads into a new one, capturable or not (the state is the
    same; only where it lives differs), and the resumed steps equal the uninterrupted ones bit for bit
    (the same computation repeated)."""
    first, resumed = _model(torch, gt, device), _model(torch, gt, device)
    opt = gt.Adam(list(first), lr=1e-2, capturable=True)
    for t in range(2):
        opt.zero_grad()
        _loss(torch, *first, _batch(torch, t, device)).backward()
        opt.step()
    with torch.no_grad():
        for p, q in zip(resumed, first, strict=True):
            p.copy_(q)
    other = gt.Adam(list(resumed), lr=1e-2, capturable=into)
    other.load_state_dict(opt.state_dict())
    for t in range(2, 4):
        for params, o in ((first, opt), (resumed, other)):
            o.zero_grad()
            _loss(torch, *params, _batch(torch, t, device)).backward()
            o.step()
        for p, q in zip(resumed, first, strict=True):
            assert torch.equal(p.detach(), q.detach()), f"step {t}"
