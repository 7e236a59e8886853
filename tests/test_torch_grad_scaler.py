"""``torch.amp.GradScaler`` with geoarray.torch optimizers, which declare ``_step_supports_amp_scaling`` as
torch's fused Adam does where a host read of the scaler's flag is not free (``geoarray/torch/_grad_scaler.py``).

Properties, on both routes (``"always"``/``"cpu"`` on the CPU: the scaler reads its flag; ``"never"``, a GPU's
default: it hands the flag to the step): a scaled step equals the unscaled step to AGREE_RTOL and leaves the
unscaled gradients in ``p.grad``; a step whose scaled gradients hold an inf changes neither parameters nor
optimizer state (bit for bit), is not counted in the state's ``skipped`` and backs the scale off;
``scaler.unscale_(opt)`` before the step (to clip the gradients) is not undone twice. On the device route:
``scaler.step(opt)`` and ``scaler.update()`` read nothing to the host; the skip costs a fixed number of
``where``s for a core that skips by itself, one per tensor otherwise; a step that raises leaves no scale
behind for the next step; a compiled step under the scaler is one graph for finite and skipped steps; every
array the route makes is on the parameters' device (torch's default device set to ``meta`` meanwhile); with
``capturable=True`` the state stays in the buffers the first step made. torch's whole AMP recipe (autocast
and the scaler) trains a geoarray layer between torch layers.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
from _examples import load_benchmark

import geoarray
from _helpers import assert_agree, host_waits

pytestmark = pytest.mark.usefixtures("torch_only")

M = geoarray.Stiefel(6, 3)
SCALE = 2.0**10

OPTIMIZERS = {
    "PaperAdam": lambda gt, ps: gt.PaperAdam(ps, lr=0.05),
    "Adam": lambda gt, ps: gt.Adam(ps, lr=0.05, weight_decay=1e-3),
    "SGD": lambda gt, ps: gt.SGD(ps, lr=0.05, momentum=0.9),
    "ManifoldMuon": lambda gt, ps: gt.ManifoldMuon(ps[:1], lr=0.05),
    "BFGS": lambda gt, ps: gt.Optimizer(ps, geoarray.optim.BFGS(0.05)),
    # the other route without host reads: the core does not skip by itself, the old values are selected back
    "PaperAdam, ignore": lambda gt, ps: gt.PaperAdam(ps, lr=0.05, on_nonfinite="ignore"),
    "partition": lambda gt, ps: gt.Optimizer(
        ps,
        geoarray.optim.partition(
            {"muon": geoarray.optim.ManifoldMuon(lr=0.05), "adam": geoarray.optim.Adam(0.05)}, ["muon", "adam"]
        ),
    ),
}


def _model(torch, gt, device):
    W = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    g = torch.Generator().manual_seed(1)
    b = torch.nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64).to(device))
    return [W, b]


def _loss(torch, params, t, device):
    W, b = params
    g = torch.Generator().manual_seed(100 + t)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64).to(device)
    return (torch.tanh(x @ W + b) - 0.5).square().sum()


def _backward(torch, params, t, device, scaler=None, poison=False):
    for p in params:
        p.grad = None
    loss = _loss(torch, params, t, device)
    (loss if scaler is None else scaler.scale(loss)).backward()
    if poison:
        params[0].grad[0, 0] = float("inf")


def _state(opt):
    return [x.clone() for x in _leaves(opt)]


def _leaves(opt):
    import optree

    return [x for cohorts in opt._cohorts for c in cohorts for x in optree.tree_leaves(c.state)]


def _skipped(opt):
    # a partition's state holds its members' states, each with its own count
    return [int(x) for cohorts in opt._cohorts for c in cohorts for x in _counts(c.state)]


def _counts(state):
    if hasattr(state, "skipped"):
        return [state.skipped]
    return [x for member in state.states.values() for x in _counts(member)]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("reads", ["always", "never"])
def test_a_scaled_step_equals_the_unscaled_step_and_an_inf_skips_it(torch, gt, device, host_reads_policy, name, reads):
    """Four steps, the third with an inf in a scaled gradient: the scaled run equals an unscaled twin (to
    AGREE_RTOL) at every finite step, keeps the unscaled gradient in ``p.grad``, and skips the third
    step without changing parameters, state or the ``skipped`` count, while the scale backs off. With
    ``reads="never"`` the skip is a select on the device and the scaler's step and update read nothing."""
    host_reads_policy(reads)
    params, twin = _model(torch, gt, device), _model(torch, gt, device)
    opt, ref = OPTIMIZERS[name](gt, params), OPTIMIZERS[name](gt, twin)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    for t in range(4):
        poison = t == 2
        _backward(torch, params, t, device, scaler, poison=poison)
        before, state = [p.detach().clone() for p in params], _state(opt)
        skipped = _skipped(opt)
        with warnings.catch_warnings():
            warnings.simplefilter("error", geoarray.optim.NonFiniteGradientWarning)
            seen, _ = host_waits(lambda: (scaler.step(opt), scaler.update()))
        if reads == "never" and t > 0:  # the first step builds the state, checking the weights
            if name in ("ManifoldMuon", "partition"):  # EIGH_WAITS of test_host_reads.py
                seen = [s for s in seen if not s.startswith("_linalg_eigh")]
            assert seen == [], f"{name}: host reads in scaler.step and scaler.update: {seen}"
        if poison:
            assert scaler.get_scale() == SCALE / 2
            assert all(torch.equal(p.detach(), q) for p, q in zip(params, before, strict=True))
            assert all(torch.equal(x, y) for x, y in zip(_leaves(opt), state, strict=True))
            assert _skipped(opt) == skipped
            continue
        _backward(torch, twin, t, device)
        ref.step()
        for p, q in zip(params, twin, strict=True):
            if any(p is o for o in opt.param_groups[0]["params"]):
                assert_agree(p.grad, q.grad, what=f"{name}, step {t}: p.grad after scaler.step")
            assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")
    assert M.is_point(params[0].detach(), atol=1e-12)


@pytest.mark.parametrize("reads", ["always", "never"])
def test_unscale_before_the_step_is_not_undone_twice(torch, gt, device, host_reads_policy, reads):
    """torch's recipe for clipping under a scaler: ``scaler.unscale_(opt)``, clip, ``scaler.step(opt)``. The
    step then gets no scale (``grad_scale`` None) and takes the clipped gradient as it is."""
    host_reads_policy(reads)
    params, twin = _model(torch, gt, device), _model(torch, gt, device)
    opt, ref = gt.PaperAdam(params, lr=0.05), gt.PaperAdam(twin, lr=0.05)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    for t in range(3):
        _backward(torch, params, t, device, scaler)
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        scaler.step(opt)
        scaler.update()
        _backward(torch, twin, t, device)
        torch.nn.utils.clip_grad_norm_(twin, 0.5)
        ref.step()
        for p, q in zip(params, twin, strict=True):
            assert_agree(p.detach(), q.detach(), what=f"step {t}")


def test_a_step_that_raises_leaves_no_scale_behind(torch, gt, device, host_reads_policy):
    """GradScaler deletes ``grad_scale`` and ``found_inf`` only after a step that returned: the optimizer
    drops them when its step raises, so the next step taken without the scaler is not unscaled."""
    host_reads_policy("never")  # the route on which the scaler hands the step its flags
    params, twin = _model(torch, gt, device), _model(torch, gt, device)
    opt, ref = gt.PaperAdam(params, lr=0.05), gt.PaperAdam(twin, lr=0.05)
    for o, ps in ((opt, params), (ref, twin)):
        _backward(torch, ps, 0, device)
        o.step()
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    _backward(torch, params, 1, device, scaler)
    params[1].grad = None  # part of a cohort without a gradient: refused before any change
    before = [p.detach().clone() for p in params]
    with pytest.raises(ValueError, match="had a gradient"):
        scaler.step(opt)
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
    assert all(torch.equal(p.detach(), q) for p, q in zip(params, before, strict=True))
    for o, ps in ((opt, params), (ref, twin)):
        _backward(torch, ps, 1, device)
        o.step()  # without the scaler: the gradients are taken as they are
    for p, q in zip(params, twin, strict=True):
        assert_agree(p.detach(), q.detach())


@pytest.mark.filterwarnings("error:Dynamo detected:UserWarning")
@pytest.mark.filterwarnings("ignore:Profiler function .* will be ignored:UserWarning")
@pytest.mark.parametrize("reads", ["cpu", "never"])
def test_a_compiled_step_under_the_scaler_is_one_graph(torch, gt, device, host_reads_policy, reads):
    """``opt.step = torch.compile(opt.step, fullgraph=True)`` (what ``scaler.step(opt)`` calls): after one
    eager step, one compilation serves finite and skipped steps, each equal to the eager twin's under its
    own scaler (AGREE_RTOL) — without host reads the step takes the scaler's flags (``found_inf`` is an
    input of the graph, not a constant), with them the scaler skips the call."""
    import torch._dynamo

    host_reads_policy(reads)
    torch._dynamo.reset()
    params, twin = _model(torch, gt, device), _model(torch, gt, device)
    opt, ref = gt.PaperAdam(params, lr=0.05), gt.PaperAdam(twin, lr=0.05)
    scalers = [torch.amp.GradScaler(device.type, init_scale=SCALE) for _ in range(2)]
    for t in range(5):
        if t == 1:
            opt.step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
        with torch._dynamo.config.patch(error_on_recompile=True):
            for o, ps, scaler in ((opt, params, scalers[0]), (ref, twin, scalers[1])):
                _backward(torch, ps, t, device, scaler, poison=t == 3)
                scaler.step(o)
                scaler.update()
        assert scalers[0].get_scale() == scalers[1].get_scale()
        for p, q in zip(params, twin, strict=True):
            assert_agree(p.detach(), q.detach(), what=f"step {t}")
    assert scalers[0].get_scale() == SCALE / 2


def test_the_grad_scaler_benchmark_runs(torch, gt, device):
    """benchmarks/grad_scaler_step.py at smoke size, every route: it runs and reports positive medians and
    ratios (no time is asserted)."""
    import math

    if device.type != "cpu":
        pytest.skip("benchmarks/grad_scaler_step.py times the CPU scaler")
    module = load_benchmark("grad_scaler_step")
    threads = torch.get_num_threads()
    try:
        out = module.main(["--sets", "tiny", "--steps", "2"])
    finally:
        torch.set_num_threads(threads)
    assert [(r["set"], r["route"]) for r in out["rows"]] == [(r"tiny", r) for r in module.ROUTES]
    for row in out["rows"]:
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("plain", "scaled", "ratio")), row


@pytest.mark.parametrize("reads", ["always", "cpu", "never"])
def test_the_scaler_hands_its_flags_to_the_step_where_a_read_is_not_free(torch, gt, device, host_reads_policy, reads):
    """``_step_supports_amp_scaling`` follows the host reads policy on the parameters' device: True where no read
    is allowed there (``"never"``; ``"cpu"`` on a GPU), False where the scaler's own read is free."""
    host_reads_policy(reads)
    opt = gt.PaperAdam(_model(torch, gt, device), lr=0.05)
    free = reads == "always" or (reads == "cpu" and device.type == "cpu")
    assert opt._step_supports_amp_scaling is (not free)


def _where_count(torch, gt, device, n_params, on_nonfinite, scaled):
    """aten.where operations in the second step of ``n_params`` Stiefel(6, 3) weights (one cohort), without
    host reads, through the scaler or not."""
    from torch.utils._python_dispatch import TorchDispatchMode

    params = [
        gt.ManifoldParameter(M.random(k, xp=torch, dtype=torch.float64, device=device), M) for k in range(n_params)
    ]
    opt = gt.PaperAdam(params, lr=0.05, on_nonfinite=on_nonfinite)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    count = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count[0] += func.__name__.split(".")[0] == "where"
            return func(*args, **(kwargs or {}))

    for t in range(2):
        loss = sum((p * (k + t + 1)).sum() for k, p in enumerate(params))
        for p in params:
            p.grad = None
        (scaler.scale(loss) if scaled else loss).backward()
        count[0] = 0
        with Count():
            if scaled:
                scaler.step(opt)
            else:
                opt.step()
        if scaled:
            scaler.update()
    return count[0]


def test_the_default_skip_on_the_device_costs_no_select_per_parameter(torch, gt, device, host_reads_policy):
    """Without host reads, the scaler's skip adds a fixed number of ``where``s to a step, the same for 4 and 8
    parameters: the core takes the flag (``update(..., skip=)``) and folds it into the mask it applies anyway
    under ``on_nonfinite="skip"`` (no ``where`` at all, where the adapter used to hand it NaN gradients and
    put its count back), and applies one mask per group under ``"ignore"`` (where the adapter selected every
    parameter and state tensor back: 8 more ``where``s for 4 more parameters)."""
    host_reads_policy("never")
    extra = {
        (policy, n): _where_count(torch, gt, device, n, policy, True)
        - _where_count(torch, gt, device, n, policy, False)
        for policy in ("skip", "ignore")
        for n in (4, 8)
    }
    assert extra["skip", 4] == extra["skip", 8] == 0, extra
    assert extra["ignore", 4] == extra["ignore", 8], extra


@pytest.mark.parametrize("on_nonfinite", ["skip", "ignore"])
def test_the_device_route_makes_its_arrays_on_the_parameters_device(torch, gt, device, host_reads_policy, on_nonfinite):
    """Three scaled steps, the second with an inf, taken with torch's default device set to ``meta``: an array
    the device route made without ``device=`` would be a meta tensor and fail to combine with the gradients.
    They equal the same steps without it, bit for bit (the same computation)."""
    host_reads_policy("never")
    results = []
    for default in (None, "meta"):
        params = _model(torch, gt, device)
        opt = gt.PaperAdam(params, lr=0.05, on_nonfinite=on_nonfinite)
        scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
        for t in range(3):
            _backward(torch, params, t, device, scaler, poison=t == 1)
            with torch.device(default) if default else contextlib.nullcontext():
                scaler.step(opt)
            scaler.update()
        results.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_capturable_state_stays_in_its_buffers_under_the_scaler(torch, gt, device, host_reads_policy):
    """``capturable=True`` on the device route: the steps (the third skipped for an inf) write the state into
    the buffers the first step made (the same addresses, as a CUDA graph replays them) and equal the steps
    without ``capturable`` bit for bit (the same computation)."""
    import optree

    host_reads_policy("never")
    results = []
    for capturable in (False, True):
        params = _model(torch, gt, device)
        opt = gt.PaperAdam(params, lr=0.05, capturable=capturable)
        scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
        addresses = []
        for t in range(4):
            _backward(torch, params, t, device, scaler, poison=t == 2)
            scaler.step(opt)
            scaler.update()
            addresses.append([x.data_ptr() for c in opt._cohorts[0] for x in optree.tree_leaves(c.state)])
        if capturable:
            assert all(a == addresses[0] for a in addresses), "a step under the scaler replaced a state buffer"
        results.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_torchs_amp_recipe_trains_a_geoarray_layer_between_torch_layers(torch, gt, device):
    """torch's AMP recipe — ``torch.autocast(float16)`` around forward and loss, ``GradScaler`` around
    backward and step — on ``Linear → geoarray.torch.nn.MultiHeadAttention → Linear``: the attention takes
    the float16 output of the first Linear (it runs in float32, its parameters' dtype; it had refused the
    input before), 20 steps lower the loss by 10 % or more, and its Stiefel weights stay orthonormal to
    1e-6 (float32)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), gt.nn.MultiHeadAttention(6, 2), torch.nn.Linear(6, 3)).to(
        device=device, dtype=torch.float32
    )
    opt = gt.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(16, 5, n, generator=g, dtype=torch.float32).to(device) for n in (8, 3))
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    assert out.dtype == torch.float16  # the last Linear ran under autocast
    assert losses[-1] <= 0.9 * losses[0], losses
    frames = [p for p in model.parameters() if isinstance(p, gt.ManifoldParameter)]
    assert frames
    for p in frames:
        assert p.manifold.is_point(p.detach(), atol=1e-6)
