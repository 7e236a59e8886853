"""Every geoarray.torch optimizer with every torch.optim.lr_scheduler.

Properties: with torch's schedulers (OneCycleLR's and CyclicLR's momentum cycling included),
geoarray.torch.Adam/SGD equal torch.optim.Adam/SGD on plain float64 tensors to 1e-12 relative and keep
the core they built (hyperparameters are read at every step); every optimizer's param groups carry
``lr``, every scheduler runs on every optimizer and its ManifoldParameters stay on their manifolds;
a change of ``group["lr"]`` by a factor scales the next Euclidean step by that factor (1e-10) on every
optimizer, the generic ``Optimizer(params, core)`` included; a core that cannot take a new rate
refuses the change.
"""

from __future__ import annotations

import pytest

import geoarray
from _helpers import assert_agree
from geoarray import Stiefel
from geoarray.optim import chain, scale_by_adam, scale_by_learning_rate

pytestmark = pytest.mark.usefixtures("torch_only")

N_STEPS = 6


def _grads(torch, params, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(tuple(p.shape), generator=g, dtype=p.dtype).to(p.device)


def _plain(torch, device):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(device).requires_grad_() for s in ((5, 3), (4, 2))]


SCHEDULED = {
    "Adam+OneCycleLR": ("Adam", {"lr": 1e-2}, lambda s, o: s.OneCycleLR(o, max_lr=0.05, total_steps=N_STEPS)),
    "SGD+OneCycleLR": (
        "SGD",
        {"lr": 1e-2, "momentum": 0.9, "nesterov": True},
        lambda s, o: s.OneCycleLR(o, max_lr=0.05, total_steps=N_STEPS),
    ),
    "Adam+CyclicLR": ("Adam", {"lr": 1e-2}, lambda s, o: s.CyclicLR(o, 1e-3, 1e-2, step_size_up=2)),
    "SGD+CyclicLR": ("SGD", {"lr": 1e-2, "momentum": 0.9}, lambda s, o: s.CyclicLR(o, 1e-3, 1e-2, step_size_up=2)),
    "AdamW+ReduceLROnPlateau": ("AdamW", {"lr": 1e-2}, lambda s, o: s.ReduceLROnPlateau(o, patience=0, factor=0.5)),
    "SGD+StepLR": ("SGD", {"lr": 0.1, "momentum": 0.5, "dampening": 0.2}, lambda s, o: s.StepLR(o, 2, gamma=0.3)),
}


@pytest.mark.parametrize("case", list(SCHEDULED))
def test_scheduled_runs_equal_torch_without_rebuilding_the_core(torch, gt, device, case):
    name, kwargs, make_scheduler = SCHEDULED[case]
    ours, theirs = _plain(torch, device), _plain(torch, device)
    opt_ours, opt_theirs = getattr(gt, name)(ours, **kwargs), getattr(torch.optim, name)(theirs, **kwargs)
    sched_ours = make_scheduler(torch.optim.lr_scheduler, opt_ours)
    sched_theirs = make_scheduler(torch.optim.lr_scheduler, opt_theirs)
    cores = set()
    for t in range(N_STEPS):
        _grads(torch, ours, t)
        _grads(torch, theirs, t)
        opt_ours.step()
        opt_theirs.step()
        cores.add(id(opt_ours._cohorts[0][0].core))
        if isinstance(sched_ours, torch.optim.lr_scheduler.ReduceLROnPlateau):
            sched_ours.step(1.0)  # a metric that never improves: the rate halves every step
            sched_theirs.step(1.0)
        else:
            sched_ours.step()
            sched_theirs.step()
    assert opt_ours.param_groups[0]["lr"] == opt_theirs.param_groups[0]["lr"]
    for a, b in zip(ours, theirs, strict=True):
        assert_agree(a.detach(), b.detach(), rtol=1e-12, what=case)
    assert len(cores) == 1, "a scheduler's change of lr or momentum built a new core"


def _optimizers(gt):
    """Every geoarray.torch optimizer, built on a list of parameters (ManifoldMuon and Muon: matrices)."""
    return {
        "Adam": lambda ps: gt.Adam(ps, lr=1e-2),
        "AdamW": lambda ps: gt.AdamW(ps, lr=1e-2),
        "SGD": lambda ps: gt.SGD(ps, lr=1e-2, momentum=0.9),
        "PaperAdam": lambda ps: gt.PaperAdam(ps, lr=1e-2),
        "Momentum": lambda ps: gt.Momentum(ps, lr=1e-2),
        "Gradient": lambda ps: gt.Gradient(ps, lr=1e-2),
        "AdamWithDecay": lambda ps: gt.AdamWithDecay(ps, n_steps=10, lr_start=1e-2, lr_end=1e-3),
        "ManifoldMuon": lambda ps: gt.ManifoldMuon(ps, lr=1e-2),
        "Muon": lambda ps: gt.Muon(ps, lr=1e-2),
        "Optimizer(core)": lambda ps: gt.Optimizer(ps, geoarray.optim.Adam(1e-2)),
        "Optimizer(transform)": lambda ps: gt.Optimizer(ps, chain(scale_by_adam(), scale_by_learning_rate(1e-2))),
        "Optimizer(factory)": lambda ps: gt.Optimizer(
            ps, lambda group: geoarray.optim.Momentum(group["lr"], group["alpha"]), {"lr": 1e-2, "alpha": 0.5}
        ),
    }


SCHEDULERS = {
    "StepLR": lambda s, o, m: s.StepLR(o, 1, gamma=0.5),
    "MultiStepLR": lambda s, o, m: s.MultiStepLR(o, [1, 2]),
    "ExponentialLR": lambda s, o, m: s.ExponentialLR(o, 0.9),
    "CosineAnnealingLR": lambda s, o, m: s.CosineAnnealingLR(o, 3),
    "CosineAnnealingWarmRestarts": lambda s, o, m: s.CosineAnnealingWarmRestarts(o, 2),
    "LambdaLR": lambda s, o, m: s.LambdaLR(o, lambda k: 1 / (k + 1)),
    "MultiplicativeLR": lambda s, o, m: s.MultiplicativeLR(o, lambda k: 0.9),
    "LinearLR": lambda s, o, m: s.LinearLR(o, total_iters=3),
    "ConstantLR": lambda s, o, m: s.ConstantLR(o, total_iters=2),
    "PolynomialLR": lambda s, o, m: s.PolynomialLR(o, total_iters=3),
    "OneCycleLR": lambda s, o, m: s.OneCycleLR(o, max_lr=0.02, total_steps=4, cycle_momentum=m),
    "CyclicLR": lambda s, o, m: s.CyclicLR(o, 1e-3, 1e-2, step_size_up=2, cycle_momentum=m),
    "ReduceLROnPlateau": lambda s, o, m: s.ReduceLROnPlateau(o, patience=0),
    "SequentialLR": lambda s, o, m: s.SequentialLR(
        o, [s.ConstantLR(o, total_iters=1), s.ExponentialLR(o, 0.9)], milestones=[1]
    ),
}


def _mixed(torch, gt, device, name):
    M = Stiefel(5, 2)
    Y = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    params = [Y, *_plain(torch, device)]
    return (params[1:] if name == "Muon" else params), M


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_every_scheduler_runs_on_every_optimizer(torch, gt, device, scheduler):
    for name, make in _optimizers(gt).items():
        params, M = _mixed(torch, gt, device, name)
        opt = make(params)
        assert all("lr" in g for g in opt.param_groups), name
        momentum = "momentum" in opt.defaults or "betas" in opt.defaults
        sched = SCHEDULERS[scheduler](torch.optim.lr_scheduler, opt, momentum)
        lrs = []
        for t in range(4):
            _grads(torch, params, t)
            opt.step()
            sched.step(1.0) if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau) else sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        assert len(set(lrs)) > 1 or scheduler == "ConstantLR", f"{name}: {scheduler} did not change lr ({lrs})"
        for p in params:
            assert torch.isfinite(p).all(), f"{name} with {scheduler}"
            if isinstance(p, gt.ManifoldParameter):
                assert M.is_point(p.detach(), atol=1e-10), f"{name} with {scheduler}"


NAMES = ["Adam", "AdamW", "SGD", "PaperAdam", "Momentum", "Gradient", "AdamWithDecay", "ManifoldMuon", "Muon",
         "Optimizer(core)", "Optimizer(transform)", "Optimizer(factory)"]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_a_change_of_lr_scales_the_next_step(torch, gt, device, name):
    """Two twins take a step; one's lr is multiplied by 0.1; the next Euclidean step is 0.1 times the other's
    (each optimizer's velocity is −lr × a direction that does not depend on lr), on every optimizer."""
    assert sorted(NAMES) == sorted(_optimizers(gt))
    key, make = name, _optimizers(gt)[name]
    twins = [_mixed(torch, gt, device, key)[0] for _ in range(2)]
    opts = [make(ps) for ps in twins]
    for ps, opt in zip(twins, opts, strict=True):
        _grads(torch, ps, 0)
        opt.step()
    before = [[p.detach().clone() for p in ps] for ps in twins]
    for g in opts[0].param_groups:
        g["lr"] *= 0.1
    for ps, opt in zip(twins, opts, strict=True):
        _grads(torch, ps, 1)
        opt.step()
    for p, q, p0, q0 in zip(twins[0], twins[1], before[0], before[1], strict=True):
        if isinstance(p, gt.ManifoldParameter):
            assert not torch.allclose(p, q), f"{key}: the manifold step ignored the new lr"
            continue
        assert_agree(p.detach() - p0, 0.1 * (q.detach() - q0), rtol=1e-10, what=key)


def test_a_core_that_cannot_take_a_new_rate_refuses_the_change(torch, gt, device):
    params = _plain(torch, device)
    opt = gt.Optimizer(params, geoarray.optim.Muon(1e-2))
    assert opt.param_groups[0]["lr"] == 1e-2
    _grads(torch, params, 0)
    opt.step()
    opt.param_groups[0]["lr"] = 1e-3
    with pytest.raises(ValueError, match=r"geoarray.torch.Muon"):
        opt.step()


def test_the_scheduler_benchmark_runs(torch, gt):
    """benchmarks/torch_scheduler_step.py at smoke size: it runs and reports positive medians (no time
    is asserted)."""
    import math

    from _examples import load_benchmark

    module = load_benchmark("torch_scheduler_step")
    threads = torch.get_num_threads()
    try:
        out = module.main(["--steps", "2"])
    finally:
        torch.set_num_threads(threads)
    for name in ("Adam", "PaperAdam", "ManifoldMuon"):
        assert all(math.isfinite(out[name][k]) and out[name][k] > 0 for k in ("plain_ms", "onecycle_ms", "ratio"))


def test_a_checkpoint_whose_groups_lack_lr_loads_and_schedules(torch, gt, device):
    """AdamWithDecay's groups carried no lr before: such a state_dict loads, the group gets the default,
    and a scheduler works on the loaded optimizer."""
    params = _plain(torch, device)
    opt = gt.AdamWithDecay(params, n_steps=10, lr_start=1e-2, lr_end=1e-3)
    _grads(torch, params, 0)
    opt.step()
    saved = opt.state_dict()
    for g in saved["param_groups"]:
        del g["lr"]
    fresh = gt.AdamWithDecay(params, n_steps=10, lr_start=1e-2, lr_end=1e-3)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 1e-2
    sched = torch.optim.lr_scheduler.StepLR(fresh, 1, gamma=0.5)
    _grads(torch, params, 1)
    fresh.step()
    sched.step()
    assert fresh.param_groups[0]["lr"] == 5e-3


@pytest.mark.parametrize("name", ["ManifoldMuon", "Muon"])
def test_a_new_rate_builds_no_core_and_steps_at_that_rate(torch, gt, device, name, monkeypatch):
    """ManifoldMuon and Muon read ``lr`` from the param group at every step (their core takes it as a
    schedule): a scheduler's new rate builds neither a core nor a state, and three steps under ExponentialLR
    equal three updates of the array-API core built at each step's rate, with the state carried (to
    AGREE_RTOL: two code paths). A change of another hyperparameter still builds a new core."""
    params, M = _mixed(torch, gt, device, name)
    cores = []
    monkeypatch.setattr(gt.Optimizer, "_make_core", _counting(gt.Optimizer._make_core, cores))
    opt = _optimizers(gt)[name](params)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, 0.5)
    manifolds = [M if isinstance(p, gt.ManifoldParameter) else None for p in params]
    core_type = getattr(geoarray.optim, name)
    leaves = [p.detach().clone() for p in params]
    state = core_type(lr=1e-2).init(leaves, manifolds)
    for t in range(3):
        rate = opt.param_groups[0]["lr"]
        _grads(torch, params, t)
        leaves, state = core_type(lr=rate).update(leaves, [p.grad for p in params], state)
        opt.step()
        scheduler.step()
        if t == 0:
            built = len(cores)  # the group's probe core, and its cohort's core made at the first step
    assert len(cores) == built, f"{name}: a new rate built {len(cores) - built} cores"
    for p, q in zip(params, leaves, strict=True):
        assert_agree(p.detach(), q, what=name)
    opt.param_groups[0]["momentum"] = 0.9
    _grads(torch, params, 3)
    opt.step()
    assert len(cores) == built + 1, f"{name}: a new momentum built {len(cores) - built} cores"


def _counting(method, calls):
    def counted(self, *args, **kwargs):
        calls.append(args)
        return method(self, *args, **kwargs)

    return counted


@pytest.mark.parametrize("name", NAMES)
def test_the_hyperparameters_said_to_be_in_no_state_are_in_none(torch, gt, device, name):
    """The keys of a recipe's ``state_free`` (a change builds a new core and keeps the state with no fresh
    state to compare it with): changing each to another valid value gives a fresh state of the same
    structure as the optimizer's, the check that their shortcut skips."""
    import optree

    params, _ = _mixed(torch, gt, device, name)
    opt = _optimizers(gt)[name](params)
    _grads(torch, params, 0)
    opt.step()
    group, cohort = opt.param_groups[0], opt._cohorts[0][0]
    if opt._recipe is None:
        pytest.skip(f"{name}: the shortcut is for geoarray.torch's own cores; a core given by the user is checked")
    for key in opt._recipe.state_free:
        if key not in group:
            continue
        old = group[key]
        if key == "chunk_bytes":  # bytes per piece of a step: another budget, the same state
            group[key] = 4096 if old != 4096 else None
        else:
            group[key] = tuple(0.9 * v for v in old) if isinstance(old, tuple) else 0.5 * old + 1e-8
        fresh = opt._new_cohort(group, 0, cohort.indices, restoring=True)
        assert optree.tree_structure(fresh.state) == optree.tree_structure(cohort.state), (name, key)
        group[key] = old


def test_a_one_element_tensor_lr_keeps_every_parameter_shape(torch, gt, device):
    """A tensor lr of shape (1,) (one element, which ``check_lr`` accepts) is read as a scalar: a 0-d
    parameter stays 0-d under a state that keeps the step (BFGS's previous step), and the steps equal those
    with the same rate as a float to ``AGREE_RTOL``."""
    runs = []
    for lr in (torch.tensor([1e-2], dtype=torch.float64, device=device), 1e-2):
        s = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64, device=device))
        v = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64, device=device))
        opt = gt.Optimizer([s, v], geoarray.optim.BFGS(lr=1.0))
        opt.param_groups[0]["lr"] = lr
        for _ in range(3):
            opt.zero_grad()
            ((s * v).sum() ** 2).backward()
            opt.step()
        assert s.shape == () and v.shape == (3,)
        runs.append((s.detach().clone(), v.detach().clone()))
    for a, b in zip(*runs, strict=True):
        assert_agree(a, b)


def test_a_changed_rate_in_a_compiled_manifold_muon_step_lives_with_the_parameters(torch, gt, device, monkeypatch):
    """In a compiled step (simulated: ``torch.compiler.is_compiling`` answers True), geoarray.torch's ManifoldMuon
    passes the rate its core was built with as that Python number, and a rate a scheduler changed as a 0-d
    tensor on the parameters' device (a CPU input would keep a CUDA step out of CUDA graphs) in the widest of
    their dtypes (float64 for a float32 and a float64 weight: the rate is not rounded to float32)."""
    M = Stiefel(5, 2)
    Y = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float32, device=device), M)
    A = torch.nn.Parameter(torch.ones(4, 3, dtype=torch.float64, device=device))
    opt = gt.ManifoldMuon([Y, A], lr=1e-2)
    _grads(torch, [Y, A], 0)
    opt.step()
    rate = opt._cohorts[0][0].core.lr
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert rate() == 1e-2 and isinstance(rate(), float)
    opt.param_groups[0]["lr"] = 1 / 3
    rate.read(opt.param_groups[0])  # what the optimizer does before its next update of the core
    value = rate()
    assert isinstance(value, torch.Tensor) and value.device == device and value.dtype == torch.float64
    assert value.item() == 1 / 3


def test_live_hyperparameters_flow_from_the_optimizer_to_the_core(torch, gt):
    """The core never reads the param groups: the optimizer sets the core's live hyperparameters from the group
    before each update. A value changed in the group reaches the core at the next ``step`` (not before), the
    cells hold no reference to the optimizer (a deleted optimizer leaves its cores working with the last
    values), and a live hyperparameter made outside a core's build is refused, naming where to make it."""
    from geoarray.torch.param_groups import LiveHyperparameter, live

    M = Stiefel(5, 2)
    Y = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64), M)
    opt = gt.Adam([Y], lr=1e-2, betas=(0.9, 0.99))
    _grads(torch, [Y], 0)
    opt.step()
    cohort = opt._cohorts[0][0]
    cells = {(c.key, c.index): c for c in cohort.cells}
    assert {("lr", None), ("betas", 0), ("betas", 1), ("eps", None)} <= set(cells), sorted(cells, key=str)
    assert all(isinstance(c, LiveHyperparameter) for c in cells.values())
    opt.param_groups[0]["lr"] = 5e-2
    opt.param_groups[0]["betas"] = (0.8, 0.99)
    assert cells["lr", None]() == 1e-2 and cells["betas", 0]() == 0.9  # not read by the core between steps
    _grads(torch, [Y], 1)
    opt.step()
    assert opt._cohorts[0][0].core is cohort.core  # the same core: live keys build none
    assert cells["lr", None]() == 5e-2 and cells["betas", 0]() == 0.8
    assert not any(torch.optim.Optimizer in type(r).__mro__ for c in cells.values() for r in vars(c).values())
    with pytest.raises(RuntimeError, match="inside a Recipe's build"):
        live(opt, opt.param_groups[0], "lr")
