"""geoarray.torch.RMSprop, Adagrad, Adamax, NAdam and RAdam: torch.optim's signatures, defaults and results.

Properties (float64 unless said):

* on plain tensors, 8 steps (RAdam's rectification starts at step 6 with β₂ = 0.999) equal
  ``torch.optim``'s optimizer of the same name with the same arguments to 1e-12 relative, for every option
  torch offers (RMSprop: alpha, eps, weight_decay, momentum, centered, maximize; Adagrad: lr_decay,
  weight_decay, initial_accumulator_value, eps, maximize; Adamax: betas, eps, weight_decay, maximize;
  NAdam: betas, eps, weight_decay, momentum_decay, decoupled_weight_decay, maximize; RAdam: betas, eps,
  weight_decay, decoupled_weight_decay, maximize), ``foreach=False``, and param groups with their own
  hyperparameters; also on the device path (no host reads: the step count and NAdam's μ-product read on
  the device, RAdam's switch a 0/1 factor) and with ``capturable=True`` (state in fixed buffers);
* ``opt.state[p]`` holds torch's buffers under torch's names (``square_avg``, ``grad_avg``,
  ``momentum_buffer``, ``sum``, ``exp_avg``, ``exp_inf``, ``exp_avg_sq``), equal to torch's to 1e-12;
* the signatures carry torch's arguments, defaults and argument kinds;
* on a ManifoldParameter the step is torch.optim's update of the lifted gradient B ∈ g^hor (torch's own
  optimizer run on B's coordinates) followed by the retraction, to 1e-12 (Algorithm 1);
* a Stiefel weight stays on its manifold: max|YᵀY − I| ≤ 1e-12 in float64 and ≤ 1e-5 in float32 after 40
  steps, with weight decay and every structural option, beside plain tensors;
* with torch's LR schedulers (OneCycleLR's and CyclicLR's momentum cycling of ``momentum``/``betas``
  included) the runs equal torch's to 1e-12 and keep the core they built; a ×0.1 change of ``lr``
  scales the next plain step by 0.1 (1e-10);
* ``state_dict`` resumes bit-exactly through ``torch.save``/``torch.load(weights_only=True)``; another
  optimizer's state_dict is refused, nothing changed;
* a group cut into pieces (``chunk_bytes``) ends where the whole step ends (1e-12);
* ``torch.compile(opt.step, fullgraph=True)`` after one eager step is one graph, compiled once, equal to
  the eager steps (``backend="aot_eager"``);
* under ``geoarray.torch.fully_shard`` (FSDP2, 2 gloo ranks) the weights equal one process's to 1e-12;
* implementation switches are accepted or refused with a reason; bad values, unknown group keys and a
  change that needs another state (``centered``, momentum switched on) are refused, naming the key;
* torch's RMSprop, Adagrad, Adamax, NAdam and RAdam stepping a ManifoldParameter warn naming the
  geoarray.torch class of the same name.
"""

from __future__ import annotations

import copy
import inspect
import io
import warnings

import optree
import pytest

from _helpers import assert_agree
from geoarray import Stiefel

pytestmark = pytest.mark.usefixtures("torch_only")

NAMES = ("RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam")
SHAPES = [(5, 3), (4,), (2, 3, 2)]
N_STEPS = 8  # RAdam with β₂ = 0.999 takes SGD-like steps 1–5, rectified ones from step 6

CASES = {
    "RMSprop": [
        {},
        {"lr": 0.05, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1},
        {"lr": 0.05, "momentum": 0.9, "centered": True},
        {"lr": 0.02, "alpha": 0.8, "momentum": 0.5, "centered": True, "weight_decay": 0.2, "maximize": True},
        {"lr": 0.05, "centered": True, "maximize": True, "foreach": False},
    ],
    "Adagrad": [
        {},
        {"lr": 0.1, "lr_decay": 0.3, "eps": 1e-6},
        {"lr": 0.1, "weight_decay": 0.2, "initial_accumulator_value": 0.5, "maximize": True},
        {"lr": 0.1, "lr_decay": 0.05, "initial_accumulator_value": 0.1, "eps": 0.0, "foreach": False},
    ],
    "Adamax": [
        {},
        {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6},
        {"lr": 0.05, "weight_decay": 0.3, "maximize": True, "foreach": False},
    ],
    "NAdam": [
        {},
        {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6, "momentum_decay": 0.02},
        {"lr": 0.05, "weight_decay": 0.3},
        {"lr": 0.05, "weight_decay": 0.2, "decoupled_weight_decay": True, "maximize": True, "foreach": False},
    ],
    "RAdam": [
        {},
        {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-6},  # ρ∞ = 19: rectified from step 3
        {"lr": 0.05, "betas": (0.9, 0.6)},  # ρ∞ = 4: never rectified
        {"lr": 0.05, "weight_decay": 0.3, "maximize": True},
        {"lr": 0.05, "weight_decay": 0.2, "decoupled_weight_decay": True, "foreach": False},
    ],
}
PLAIN_CASES = [(name, kwargs) for name in NAMES for kwargs in CASES[name]]


def _ids(case):
    name, kwargs = case
    return name + ("-" + "-".join(f"{k}={v}" for k, v in kwargs.items()) if kwargs else "")


def _plain(torch, device, seed=0, dtype=None):
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float64
    return [torch.randn(s, generator=g, dtype=dtype).to(device).requires_grad_() for s in SHAPES]


def _set_grads(torch, params, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(tuple(p.shape), generator=g, dtype=p.dtype).to(p.device)


def _compare(torch, gt, device, name, kwargs, n_steps=N_STEPS, groups=None):
    ours, theirs = _plain(torch, device), _plain(torch, device)
    split = (lambda ps: ps) if groups is None else groups
    opt_ours = getattr(gt, name)(split(ours), **kwargs)
    opt_theirs = getattr(torch.optim, name)(split(theirs), **kwargs)
    for t in range(n_steps):
        _set_grads(torch, ours, t)
        _set_grads(torch, theirs, t)
        opt_ours.step()
        opt_theirs.step()
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_agree(a.detach(), b.detach(), rtol=1e-12, what=f"{name} {kwargs}: parameter {k}")
    return opt_ours, opt_theirs, ours, theirs


@pytest.mark.parametrize("case", PLAIN_CASES, ids=_ids)
def test_equals_torch_on_plain_tensors(torch, gt, device, case):
    name, kwargs = case
    _compare(torch, gt, device, name, kwargs)


@pytest.mark.parametrize("case", [(name, CASES[name][-1]) for name in NAMES], ids=_ids)
def test_device_path_equals_torch(torch, gt, device, host_reads_policy, case):
    """No host reads (a GPU's default): the step count, NAdam's μ-product and RAdam's switch stay on the
    device; the results are torch's to 1e-12."""
    host_reads_policy("never")
    name, kwargs = case
    _compare(torch, gt, device, name, kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_param_groups_with_their_own_hyperparameters_equal_torch(torch, gt, device, name):
    own = {"RMSprop": {"alpha": 0.9, "momentum": 0.5}, "Adagrad": {"lr_decay": 0.1}, "NAdam": {"momentum_decay": 0.01}}
    second = {"lr": 0.02, "weight_decay": 0.1, **own.get(name, {"betas": (0.5, 0.9)})}

    def groups(ps):
        return [{"params": ps[:1]}, {"params": ps[1:], **second}]

    _compare(torch, gt, device, name, {"lr": 0.05}, groups=groups)


KEYS = {
    "RMSprop": ({"lr": 0.05, "momentum": 0.9, "centered": True}, ("square_avg", "grad_avg", "momentum_buffer")),
    "Adagrad": ({"lr": 0.1, "initial_accumulator_value": 0.2}, ("sum",)),
    "Adamax": ({"lr": 0.05}, ("exp_avg", "exp_inf")),
    "NAdam": ({"lr": 0.05}, ("exp_avg", "exp_avg_sq")),
    "RAdam": ({"lr": 0.05}, ("exp_avg", "exp_avg_sq")),
}


@pytest.mark.parametrize("name", NAMES)
def test_state_holds_torchs_buffers_under_torchs_names(torch, gt, device, name):
    kwargs, keys = KEYS[name]
    opt, ref, ours, theirs = _compare(torch, gt, device, name, kwargs, n_steps=4)
    for p, q in zip(ours, theirs, strict=True):
        mine = opt.state[p]
        assert int(mine["step"]) == 4
        assert set(keys) <= set(mine), f"{name}: {sorted(mine)} lacks {keys}"
        for k in keys:
            assert_agree(mine[k], ref.state[q][k], rtol=1e-12, what=f"{name} {k}")


def test_signatures_carry_torchs_defaults(torch, gt):
    for name in NAMES:
        ours, theirs = getattr(gt, name), getattr(torch.optim, name)
        mine = inspect.signature(ours.__init__).parameters
        for arg, par in inspect.signature(theirs.__init__).parameters.items():
            if arg == "self":
                continue
            assert arg in mine, f"{name} lacks torch's argument {arg}"
            assert mine[arg].default == par.default, f"{name}({arg}=…) default differs from torch's"
            assert mine[arg].kind == par.kind, f"{name}({arg}) is {mine[arg].kind}, torch's {par.kind}"
        positional = [a for a, p in mine.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
        torch_positional = [a for a, p in inspect.signature(theirs.__init__).parameters.items()
                            if p.kind == p.POSITIONAL_OR_KEYWORD]  # fmt: skip
        assert positional == torch_positional, f"{name}: positional arguments {positional}"


# -- ManifoldParameters: torch's update of the lifted gradient, then the retraction ----------------------


def _flat(torch, element):
    return torch.cat([f.reshape(-1) for f in element])


def _unflat(element, flat):
    out, offset = [], 0
    for f in element:
        out.append(flat[offset : offset + f.numel()].reshape(f.shape))
        offset += f.numel()
    return type(element)(*out)


MANIFOLD_CASES = [
    ("RMSprop", {"lr": 0.02, "alpha": 0.9, "momentum": 0.5, "centered": True}),
    ("RMSprop", {"lr": 0.02, "maximize": True}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.2, "initial_accumulator_value": 0.1}),
    ("Adamax", {"lr": 0.05, "betas": (0.8, 0.95), "maximize": True}),
    ("NAdam", {"lr": 0.05, "momentum_decay": 0.01}),
    ("RAdam", {"lr": 0.05}),
    ("RAdam", {"lr": 0.05, "betas": (0.8, 0.9), "maximize": True}),
]


@pytest.mark.parametrize("case", MANIFOLD_CASES, ids=_ids)
def test_manifold_parameter_takes_torchs_update_of_the_lifted_gradient(torch, gt, device, case):
    """Y ← λ(Y)·retraction(W)·E with W the step torch.optim takes on the coordinates of B = lift(∇L) (a
    dummy tensor Z reset to 0 before each step, so torch's step is Z's new value), to 1e-12."""
    name, kwargs = case
    M = Stiefel(7, 3)
    Y0 = M.random(5, xp=torch, dtype=torch.float64, device=device)
    W = gt.ManifoldParameter(Y0.clone(), M)
    opt = getattr(gt, name)([W], **kwargs)
    Y = Y0.clone()
    lam = M.global_section(Y, strategy="householder")
    Z = torch.zeros_like(_flat(torch, M.lift(Y, lam, torch.zeros_like(Y))), requires_grad=True)
    ref = getattr(torch.optim, name)([Z], **kwargs)
    for t in range(N_STEPS):
        G = torch.randn(7, 3, generator=torch.Generator().manual_seed(t), dtype=torch.float64).to(device)
        W.grad = G.clone()
        opt.step()
        lam = M.global_section(Y, strategy="householder")
        B = M.lift(Y, lam, G)
        with torch.no_grad():
            Z.zero_()
        Z.grad = _flat(torch, B)
        ref.step()
        Y = M.apply_retraction(lam, _unflat(B, Z.detach().clone()))
        assert_agree(W.detach(), Y, rtol=1e-12, what=f"{name} step {t}")
    assert M.is_point(W.detach(), atol=1e-12)


STIEFEL_OPTIONS = {
    "RMSprop": {"lr": 1e-2, "momentum": 0.9, "centered": True, "weight_decay": 1e-2},
    "Adagrad": {"lr": 5e-2, "lr_decay": 1e-2, "weight_decay": 1e-2, "initial_accumulator_value": 0.1},
    "Adamax": {"lr": 1e-2, "weight_decay": 1e-2},
    "NAdam": {"lr": 1e-2, "weight_decay": 1e-2, "decoupled_weight_decay": True},
    "RAdam": {"lr": 1e-2, "weight_decay": 1e-2},
}


def _orthonormality_error(torch, Y):
    Y = Y.detach().double()
    eye = torch.eye(Y.shape[-1], dtype=Y.dtype, device=Y.device)
    return (Y.transpose(-1, -2) @ Y - eye).abs().max().item()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", NAMES)
def test_a_stiefel_weight_stays_on_its_manifold(torch, gt, device, name, dtype):
    """40 steps of a regression on a stack of Stiefel(10, 3) frames, a square orthogonal weight and a plain
    bias: max|YᵀY − I| ≤ 1e-12 (float64) / 1e-5 (float32), and the loss falls."""
    dt = getattr(torch, dtype)
    S, O = Stiefel(10, 3), Stiefel(4, 4)
    Y = gt.ManifoldParameter(S.random(0, xp=torch, batch_shape=(2,), dtype=dt, device=device), S)
    Q = gt.ManifoldParameter(O.random(1, xp=torch, dtype=dt, device=device), O)
    b = torch.nn.Parameter(torch.zeros(3, dtype=dt, device=device))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 10, generator=g, dtype=dt).to(device)
    target = torch.randn(2, 16, 3, generator=g, dtype=dt).to(device)
    opt = getattr(gt, name)([Y, Q, b], **STIEFEL_OPTIONS[name])
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((x @ Y + b - target) ** 2).mean() + (Q - torch.eye(4, dtype=dt, device=device)).square().sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tol = 1e-12 if dtype == "float64" else 1e-5
    for W in (Y, Q):
        err = _orthonormality_error(torch, W)
        assert err <= tol, f"{name} {dtype}: max|YᵀY − I| = {err:.1e}"
    assert losses[-1] < losses[0], f"{name} {dtype}: {losses[0]:.3f} → {losses[-1]:.3f}"


# -- LR schedulers ---------------------------------------------------------------------------------------

SCHEDULED = {
    "RMSprop+OneCycleLR": ("RMSprop", {"lr": 1e-2, "momentum": 0.9}, lambda s, o: s.OneCycleLR(o, 0.05, total_steps=8)),
    "RMSprop+CyclicLR": ("RMSprop", {"lr": 1e-2, "momentum": 0.5, "centered": True},
                         lambda s, o: s.CyclicLR(o, 1e-3, 1e-2, step_size_up=2)),
    "Adagrad+StepLR": ("Adagrad", {"lr": 0.1, "lr_decay": 0.1}, lambda s, o: s.StepLR(o, 2, gamma=0.3)),
    "Adamax+OneCycleLR": ("Adamax", {"lr": 1e-2}, lambda s, o: s.OneCycleLR(o, 0.05, total_steps=8)),
    "NAdam+OneCycleLR": ("NAdam", {"lr": 1e-2}, lambda s, o: s.OneCycleLR(o, 0.05, total_steps=8)),
    "NAdam+CyclicLR": ("NAdam", {"lr": 1e-2, "weight_decay": 0.1},
                       lambda s, o: s.CyclicLR(o, 1e-3, 1e-2, step_size_up=2)),
    "RAdam+OneCycleLR": ("RAdam", {"lr": 1e-2, "decoupled_weight_decay": True, "weight_decay": 0.1},
                         lambda s, o: s.OneCycleLR(o, 0.05, total_steps=8)),
    "RAdam+ReduceLROnPlateau": ("RAdam", {"lr": 1e-2}, lambda s, o: s.ReduceLROnPlateau(o, patience=0, factor=0.5)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SCHEDULED))
def test_scheduled_runs_equal_torch_without_rebuilding_the_core(torch, gt, device, case):
    """OneCycleLR and CyclicLR cycle ``momentum`` (RMSprop) or ``betas[0]`` (Adamax, NAdam, RAdam) as well as
    ``lr``: read at every step, as torch reads them; NAdam's μ-product takes each step's β₁."""
    name, kwargs, make_scheduler = SCHEDULED[case]
    ours, theirs = _plain(torch, device), _plain(torch, device)
    opt_ours, opt_theirs = getattr(gt, name)(ours, **kwargs), getattr(torch.optim, name)(theirs, **kwargs)
    sched_ours = make_scheduler(torch.optim.lr_scheduler, opt_ours)
    sched_theirs = make_scheduler(torch.optim.lr_scheduler, opt_theirs)
    cores = set()
    for t in range(N_STEPS):
        _set_grads(torch, ours, t)
        _set_grads(torch, theirs, t)
        opt_ours.step()
        opt_theirs.step()
        cores.add(id(opt_ours._cohorts[0][0].core))
        if isinstance(sched_ours, torch.optim.lr_scheduler.ReduceLROnPlateau):
            sched_ours.step(1.0)  # never improves: the rate halves every step
            sched_theirs.step(1.0)
        else:
            sched_ours.step()
            sched_theirs.step()
    assert opt_ours.param_groups[0]["lr"] == opt_theirs.param_groups[0]["lr"]
    for a, b in zip(ours, theirs, strict=True):
        assert_agree(a.detach(), b.detach(), rtol=1e-12, what=case)
    assert len(cores) == 1, "a scheduler's change of lr or momentum built a new core"


def _mixed(torch, gt, device):
    M = Stiefel(5, 2)
    Y = gt.ManifoldParameter(M.random(0, xp=torch, dtype=torch.float64, device=device), M)
    return [Y, *_plain(torch, device)], M


@pytest.mark.parametrize("name", NAMES)
def test_a_change_of_lr_scales_the_next_step_and_schedulers_keep_the_manifold(torch, gt, device, name):
    """Two twins take a step; one's lr is multiplied by 0.1; its next plain step is 0.1 times the other's
    (1e-10). Then a CosineAnnealingLR and a cycling OneCycleLR drive it 4 steps: the Stiefel weight stays on
    its manifold (1e-12)."""
    make = lambda ps: getattr(gt, name)(ps, lr=1e-2)  # noqa: E731
    twins = [_mixed(torch, gt, device)[0] for _ in range(2)]
    opts = [make(ps) for ps in twins]
    for ps, opt in zip(twins, opts, strict=True):
        _set_grads(torch, ps, 0)
        opt.step()
    before = [[p.detach().clone() for p in ps] for ps in twins]
    for g in opts[0].param_groups:
        g["lr"] *= 0.1
    for ps, opt in zip(twins, opts, strict=True):
        _set_grads(torch, ps, 1)
        opt.step()
    for p, q, p0, q0 in zip(twins[0], twins[1], before[0], before[1], strict=True):
        if isinstance(p, gt.ManifoldParameter):
            assert not torch.allclose(p, q), f"{name}: the manifold step ignored the new lr"
            continue
        assert_agree(p.detach() - p0, 0.1 * (q.detach() - q0), rtol=1e-10, what=name)
    for make_scheduler in (
        lambda s, o: s.CosineAnnealingLR(o, 3),
        # Adagrad has neither momentum nor betas to cycle
        lambda s, o: s.OneCycleLR(o, max_lr=0.02, total_steps=4, cycle_momentum=name != "Adagrad"),
    ):
        params, M = _mixed(torch, gt, device)
        opt = make(params)
        sched = make_scheduler(torch.optim.lr_scheduler, opt)
        lrs = []
        for t in range(4):
            _set_grads(torch, params, t)
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        assert len(set(lrs)) > 1
        assert M.is_point(params[0].detach(), atol=1e-12), name
        assert all(torch.isfinite(p).all() for p in params)


# -- state_dict, pieces, capturable -----------------------------------------------------------------------

RESUME = {
    "RMSprop": {"lr": 1e-2, "momentum": 0.9, "centered": True},
    "Adagrad": {"lr": 5e-2, "lr_decay": 0.1},
    "Adamax": {"lr": 1e-2},
    "NAdam": {"lr": 1e-2},
    "RAdam": {"lr": 1e-2},
}


def _run(torch, opt, params, start, n):
    for t in range(start, start + n):
        _set_grads(torch, params, t)
        opt.step()


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_resumes_bit_exactly_through_torch_save(torch, gt, device, name):
    """3 steps, torch.save of the optimizer's state_dict and the weights, 5 more steps; a new optimizer
    loading it (torch.load with weights_only=True) takes the same 5 steps bit for bit (RAdam crosses into
    its rectified steps, NAdam's μ-product resumes)."""
    kwargs = RESUME[name]
    params, _ = _mixed(torch, gt, device)
    opt = getattr(gt, name)([{"params": params[:2]}, {"params": params[2:], "lr": 0.02}], **kwargs)
    _run(torch, opt, params, 0, 3)
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "w": [p.detach() for p in params]}, buf)
    _run(torch, opt, params, 3, 5)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    fresh, _ = _mixed(torch, gt, device)
    with torch.no_grad():
        for p, w in zip(fresh, ckpt["w"], strict=True):
            p.copy_(w)
    opt2 = getattr(gt, name)([{"params": fresh[:2]}, {"params": fresh[2:]}], **kwargs)
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[1]["lr"] == 0.02
    _run(torch, opt2, fresh, 3, 5)
    for p, q in zip(params, fresh, strict=True):
        assert torch.equal(p.detach(), q.detach()), name
    # a deepcopy continues identically too
    twin = copy.deepcopy(opt2)
    twin_params = [p for g in twin.param_groups for p in g["params"]]
    _run(torch, opt2, fresh, 8, 2)
    _run(torch, twin, twin_params, 8, 2)
    assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(fresh, twin_params, strict=True))


def test_another_optimizers_state_dict_is_refused_and_nothing_changes(torch, gt, device):
    params, _ = _mixed(torch, gt, device)
    rms = gt.RMSprop(params, lr=1e-2)
    _run(torch, rms, params, 0, 1)
    nadam = gt.NAdam(params, lr=1e-2)
    _run(torch, nadam, params, 0, 1)
    before = copy.deepcopy(nadam.state_dict())
    with pytest.raises(ValueError, match="another optimizer"):
        nadam.load_state_dict(rms.state_dict())
    after = nadam.state_dict()
    assert optree.tree_structure(after) == optree.tree_structure(before)
    for x, y in zip(optree.tree_leaves(after), optree.tree_leaves(before), strict=True):
        assert not isinstance(x, torch.Tensor) or torch.equal(x, y)


@pytest.mark.parametrize("name", NAMES)
def test_pieces_equal_the_whole_step(torch, gt, host_reads_policy, monkeypatch, name):
    """chunk_bytes small enough to cut the stack of 4 Stiefel(12, 3) leaves (576 bytes each) into pieces:
    every step takes the pieces' route, and the weights after 3 steps equal the whole step's (1e-12); the
    transforms are elementwise."""
    import importlib

    host_reads_policy("always")  # the pieces need the non-finite flag on the host
    riemannian = importlib.import_module("geoarray.optim.riemannian")
    pieces: list = []
    original = riemannian.RiemannianOptimizer._step_in_pieces

    def spy(self, *args, **kwargs):
        pieces.append(True)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(riemannian.RiemannianOptimizer, "_step_in_pieces", spy)
    S = Stiefel(12, 3)

    def run(chunk_bytes):
        params = [
            gt.ManifoldParameter(S.random(k, xp=torch, batch_shape=(2,), dtype=torch.float64), S) for k in range(4)
        ]
        opt = getattr(gt, name)(params, chunk_bytes=chunk_bytes, **STIEFEL_OPTIONS[name])
        for k in range(3):
            for i, p in enumerate(params):
                g = torch.Generator().manual_seed(10 * k + i)
                p.grad = 0.1 * torch.randn(p.shape, dtype=p.dtype, generator=g)
            opt.step()
        return params

    whole = run(None)
    assert pieces == []
    cut = run(600)
    assert pieces == [True, True, True]
    for a, b in zip(whole, cut, strict=True):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_capturable_keeps_the_state_in_fixed_buffers_and_equals_the_default(torch, gt, device, name):
    """From the second step on every state tensor is the same object at the same address, and the results
    equal capturable=False's (Adagrad takes capturable in its param group, as torch's has no argument)."""

    def make(params, capturable):
        if name == "Adagrad":
            return gt.Adagrad([{"params": params, "capturable": capturable}], lr=5e-2)
        return getattr(gt, name)(params, lr=1e-2, capturable=capturable)

    fixed, _ = _mixed(torch, gt, device)
    free, M = _mixed(torch, gt, device)
    opt_fixed, opt_free = make(fixed, True), make(free, False)

    def tensors(opt):
        return [leaf for cohorts in opt._cohorts for c in cohorts for leaf in optree.tree_leaves(c.state)]

    addresses = None
    for t in range(4):
        _set_grads(torch, fixed, t)
        _set_grads(torch, free, t)
        opt_fixed.step()
        opt_free.step()
        now = [(id(s), s.data_ptr()) for s in tensors(opt_fixed)]
        if t:
            assert now == addresses, f"{name}: step {t} moved a state tensor"
        addresses = now
        for p, q in zip(fixed, free, strict=True):
            assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")
    assert M.is_point(fixed[0].detach(), atol=1e-12)


# -- FSDP2 ------------------------------------------------------------------------------------------------

FSDP = {
    "RMSprop": {"lr": 0.01, "momentum": 0.5, "centered": True},
    "Adagrad": {"lr": 0.05},
    "Adamax": {"lr": 0.02},
    "NAdam": {"lr": 0.02},
    "RAdam": {"lr": 0.02, "betas": (0.9, 0.9)},  # rectified from step 3
}
FSDP_STEPS = 6


def _fsdp_worker(rank: int, port: int, out_dir: str) -> None:
    import torch
    from test_torch_fsdp import WORLD, _batch, _model, _train
    from torch.distributed.device_mesh import init_device_mesh

    import geoarray.torch as gt
    from _distributed import process_group

    with process_group(rank, port, WORLD):
        mesh = init_device_mesh("cpu", (WORLD,))
        x, y = _batch()
        x, y = x[rank * 4 : (rank + 1) * 4], y[rank * 4 : (rank + 1) * 4]
        out = {}
        for name, kwargs in FSDP.items():
            model = gt.fully_shard(_model(), mesh=mesh)
            _train(getattr(gt, name)(model.parameters(), **kwargs), model, x, y, FSDP_STEPS)
            out[name] = {k: v.full_tensor() for k, v in model.state_dict().items()}
        torch.save(out, f"{out_dir}/rank{rank}.pt")


def test_fsdp2_steps_like_one_process(tmp_path):
    """tests/test_torch_fsdp.py's model (a stack of 8 Stiefel(16, 4) frames sharded by frame, a Stiefel(64, 8)
    weight cut by rows and gathered to its owner, a plain matrix) under ``geoarray.torch.fully_shard`` on 2
    gloo ranks: after 6 steps every rank's weights equal one process's to 1e-12 and lie on their manifolds."""
    import torch
    from test_torch_fsdp import TIMEOUT, WORLD, _batch, _model, _train

    import geoarray.torch as gt
    from _distributed import run_ranks

    ranks = run_ranks(_fsdp_worker, tmp_path, WORLD, TIMEOUT, "FSDP2")
    x, y = _batch()
    for name, kwargs in FSDP.items():
        model = _model()
        _train(getattr(gt, name)(model.parameters(), **kwargs), model, x, y, FSDP_STEPS)
        single = {k: v.detach() for k, v in model.state_dict().items()}
        for out in ranks:
            for k in single:
                torch.testing.assert_close(out[name][k], single[k], rtol=0, atol=1e-12, msg=f"{name}: {k}")
            assert Stiefel(64, 8).is_point(out[name]["W"]) and Stiefel(16, 4).is_point(out[name]["F"]), name


# -- switches, bad values, foreign optimizers -------------------------------------------------------------


def test_implementation_switches_are_accepted_or_refused_with_a_reason(torch, gt, device):
    p = _plain(torch, device)
    for name in NAMES:
        cls = getattr(gt, name)
        cls(p, foreach=True)
        cls(p, foreach=False, differentiable=False)
        with pytest.raises(ValueError, match=r"differentiable=True.*not supported"):
            cls(p, differentiable=True)
        if name == "Adagrad":
            cls(p, fused=False)
            with pytest.raises(ValueError, match=r"Adagrad\(fused=True\).*not supported"):
                cls(p, fused=True)
            cls([{"params": p, "capturable": True}])
        else:
            cls(p, capturable=True)
            cls(p, lr=torch.tensor(1e-3, device=p[0].device), capturable=True)


def test_bad_values_and_unknown_group_keys_are_refused(torch, gt, device):
    p = _plain(torch, device)
    with pytest.raises(ValueError, match=r"\['alpha'\] must be a number in \[0, 1\)"):
        gt.RMSprop(p, alpha=1.5)
    for name in ("RMSprop", "Adamax", "NAdam", "RAdam"):
        with pytest.raises(ValueError, match=r"\['eps'\] must be > 0"):
            getattr(gt, name)(p, eps=0.0)
    with pytest.raises(ValueError, match="eps and initial_accumulator_value are both 0"):
        gt.Adagrad(p, eps=0.0)
    with pytest.raises(ValueError, match=r"\['lr_decay'\]"):
        gt.Adagrad(p, lr_decay=-0.1)
    with pytest.raises(ValueError, match=r"\['momentum_decay'\]"):
        gt.NAdam(p, momentum_decay=-1.0)
    with pytest.raises(ValueError, match=r"\['betas'\]\[1\]"):
        gt.RAdam(p, betas=(0.9, 1.0))
    with pytest.raises(TypeError, match=r"\['centered'\] must be a bool"):
        gt.RMSprop(p, centered="yes")
    with pytest.raises(ValueError, match=r"keys \['amsgrad'\].*does not know"):
        gt.NAdam([{"params": p, "amsgrad": True}])
    opt = gt.Adamax(p, lr=0.1)
    _set_grads(torch, p, 0)
    opt.step()
    before = [q.detach().clone() for q in p]
    opt.param_groups[0]["betas"] = (0.9, 2.0)  # set by hand to a bad value: refused, nothing changes
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['betas'\]\[1\]"):
        opt.step()
    assert all(torch.equal(q.detach(), r) for q, r in zip(p, before, strict=True))


@pytest.mark.parametrize(("key", "value"), [("centered", True), ("momentum", 0.9)])
def test_a_change_that_needs_another_state_is_refused(torch, gt, device, key, value):
    """RMSprop's ``grad_avg`` and ``momentum_buffer`` exist from the first step or never (torch's RMSprop
    fails too): switching them on later is refused, the weights unchanged; other changes (alpha, eps, a
    weight decay switched on, maximize) take effect at the next step and keep the state."""
    p = _plain(torch, device)
    opt = gt.RMSprop(p, lr=0.01)
    _run(torch, opt, p, 0, 1)
    opt.param_groups[0].update({"alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1, "maximize": True})
    _run(torch, opt, p, 1, 1)
    assert int(opt.state[p[0]]["step"]) == 2
    before = [q.detach().clone() for q in p]
    opt.param_groups[0][key] = value
    with pytest.raises(ValueError, match="changed the structure of its optimizer state"):
        _run(torch, opt, p, 2, 1)
    assert all(torch.equal(q.detach(), r) for q, r in zip(p, before, strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_torchs_optimizer_of_the_same_name_warns_naming_geoarrays(torch, gt, name):
    lin = gt.orthogonal_(torch.nn.Linear(4, 8, bias=False, dtype=torch.float64))
    opt = getattr(torch.optim, name)(lin.parameters(), lr=1e-2)
    lin(torch.ones(2, 4, dtype=torch.float64)).square().sum().backward()
    with pytest.warns(UserWarning, match=rf"{name} is not a geoarray optimizer.*use geoarray\.torch\.{name} \("):
        opt.step()
    lin = gt.orthogonal_(torch.nn.Linear(4, 8, bias=False, dtype=torch.float64))
    ours = getattr(gt, name)(lin.parameters(), lr=1e-2)
    lin(torch.ones(2, 4, dtype=torch.float64)).square().sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours.step()


COMPILED = {
    "RMSprop": {"lr": 1e-2, "momentum": 0.9, "centered": True, "weight_decay": 1e-3},
    "Adagrad": {"lr": 5e-2, "lr_decay": 0.1},
    "Adamax": {"lr": 1e-2},
    "NAdam": {"lr": 1e-2, "weight_decay": 1e-2, "decoupled_weight_decay": True},
    "RAdam": {"lr": 1e-2, "betas": (0.9, 0.9)},  # ρ∞ = 19: the compiled steps cross into the rectified ones
}


@pytest.mark.filterwarnings("error:Dynamo detected:UserWarning")
@pytest.mark.parametrize("name", NAMES)
def test_compiled_step_is_one_graph_and_equals_the_eager_step(torch, gt, device, name):
    """``torch.compile(opt.step, fullgraph=True, backend="aot_eager")`` after one eager step: one graph, no
    recompilation over 5 steps (the step count, NAdam's μ-product and RAdam's switch are inputs on the
    device), equal to the eager steps to AGREE_RTOL; the Stiefel weight stays on its manifold (1e-12)."""
    import torch._dynamo

    torch._dynamo.reset()
    eager, M = _mixed(torch, gt, device)
    compiled, _ = _mixed(torch, gt, device)
    opt_eager = getattr(gt, name)(eager, **COMPILED[name])
    opt_compiled = getattr(gt, name)(compiled, **COMPILED[name])
    step = torch.compile(opt_compiled.step, fullgraph=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for t in range(6):
            for params, opt, run in ((eager, opt_eager, opt_eager.step), (compiled, opt_compiled, step)):
                _set_grads(torch, params, t)
                (opt.step if t == 0 else run)()  # the first step eagerly: it builds the state
            for p, q in zip(compiled, eager, strict=True):
                assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")
    assert M.is_point(compiled[0].detach(), atol=1e-12)
