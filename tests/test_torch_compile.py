"""``torch.compile(opt.step, fullgraph=True)`` for geoarray.torch optimizers.

Properties (``backend="aot_eager"``: dynamo's graph capture and AOT autograd without inductor's code
generation, which is too slow for the test matrix): after one eager step (which builds the state and
checks the weights), the compiled step is one graph — ``fullgraph=True`` refuses any graph break —
and one compilation serves every later step (a recompilation is an error here); over 3 steps on a
model with a ManifoldParameter and a plain tensor it equals the eager step to ``AGREE_RTOL`` (two
code paths), for every geoarray.torch optimizer (torch's Adam, AdamW and SGD conventions, the paper's
Adam, Gradient, Momentum, AdamWithDecay, ManifoldMuon on the manifold weight alone: it refuses
vectors, and a partition of ManifoldMuon and Adam); the weight stays on its manifold. A compiled step
that would have to build state raises ``RuntimeError`` saying to run it eagerly, and ``validate()``
checks the values on request, naming the parameter. The same holds with the guards on the library's globals dropped
(``options={"guard_filter_fn": geoarray.torch.skip_guards_on_library_globals}``), which keeps those on
the arguments and on the caller's globals. The loops of a torch user's code: the steps of several
optimizers compiled in one process, torch's recipe for a compiled step with an LR scheduler, a first
compile in a fresh process, which warns nothing of geoarray's, and a compiled ``geoarray.torch.nn.Module``
(forward and backward in one graph) trained by a compiled step. (``capturable=True``:
``tests/test_torch_capturable.py``.)
"""

from __future__ import annotations

import pytest

import geoarray
from _helpers import assert_agree

pytestmark = [
    pytest.mark.usefixtures("torch_only"),
    pytest.mark.filterwarnings("error:Dynamo detected:UserWarning"),
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
    # a core of its own: manifold Muon on the weight, Adam on the bias (the traced step had called
    # PyTreeSpec.flatten_up_to, which dynamo refuses)
    "partition": lambda gt, ps: gt.Optimizer(
        ps,
        geoarray.optim.partition(
            {"muon": geoarray.optim.ManifoldMuon(lr=1e-2), "adam": geoarray.optim.Adam(1e-2)}, ["muon", "adam"]
        ),
    ),
}


@pytest.mark.parametrize(
    ("name", "guards"),
    [(name, "all") for name in sorted(OPTIMIZERS)] + [("Adam", "library skipped"), ("ManifoldMuon", "library skipped")],
)
def test_compiled_step_is_one_graph_and_equals_the_eager_step(torch, gt, device, name, guards):
    import torch._dynamo

    torch._dynamo.reset()
    eager, compiled = _model(torch, gt, device), _model(torch, gt, device)
    opt_eager, opt_compiled = OPTIMIZERS[name](gt, list(eager)), OPTIMIZERS[name](gt, list(compiled))
    options = {"guard_filter_fn": gt.skip_guards_on_library_globals} if guards != "all" else None
    step = torch.compile(opt_compiled.step, fullgraph=True, backend="aot_eager", options=options)
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


def test_a_compiled_step_after_a_structural_change_says_to_run_it_eagerly(torch, gt, device):
    """After compiled steps, a change of a hyperparameter that builds a new core (a flag, then a weight decay
    that becomes zero) makes dynamo trace the step again: the traced step compares the group's key with its
    cohort's and raises ``RuntimeError`` saying to run that step eagerly, leaving the weights as they were;
    after one eager step (which rebuilds the core) the compiled steps go on and equal an eager twin's to
    ``AGREE_RTOL``. A change of betas, which Adam reads at every step, compiles again and steps. One model
    through the three changes in turn (a compile each, not a model each), with ``backend="eager"``."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled, eager = _model(torch, gt, device), _model(torch, gt, device)
    opt, opt_eager = (gt.Adam(list(ps), lr=1e-2, weight_decay=1e-3) for ps in (compiled, eager))
    # dynamo's capture alone (backend="eager"): the comparison of keys is in the traced Python, and the
    # file's other tests run these steps through AOT autograd
    step = torch.compile(opt.step, fullgraph=True, backend="eager")
    for t in range(3):
        _step_both(torch, device, t, (compiled, opt, step), (eager, opt_eager), what=f"step {t}")
    t = 3
    for key, value in (("maximize", True), ("weight_decay", 0.0), ("betas", (0.8, 0.999))):
        for o in (opt, opt_eager):
            o.param_groups[0][key] = value
        if key != "betas":
            opt.zero_grad()
            _loss(torch, *compiled, t, device).backward()
            before = [p.detach().clone() for p in compiled]
            with pytest.raises(Exception, match=r"hyperparameters of param group 0 changed.*Run that step eagerly"):
                step()
            assert all(torch.equal(p.detach(), q) for p, q in zip(compiled, before, strict=True)), key
            _step_both(torch, device, t, (compiled, opt, opt.step), (eager, opt_eager), what=f"eager step {t}")
            t += 1
        for _ in range(2):
            _step_both(torch, device, t, (compiled, opt, step), (eager, opt_eager), what=f"step {t} after {key}")
            t += 1
    assert M.is_point(compiled[0].detach(), atol=1e-12)


def test_validate_checks_the_values_on_request(torch, gt, device):
    W, b = _model(torch, gt, device)
    opt = gt.Adam([("layer.W", W), ("layer.b", b)], lr=1e-2)
    opt.validate()  # on the manifold: nothing to say
    with torch.no_grad():
        W.mul_(1.01)
    with pytest.raises(ValueError, match=r"'layer.W' is not a point of Stiefel\(6, 3\).*max\|YᵀY − I\|"):
        opt.validate()


# skip_guards_on_library_globals ------------------------------------------------------------------

_USER_SCALE = 1.0  # a global of this module that the compiled function below reads: its guard stays


def _functional_problem(torch, device, dtype):
    Y0 = M.random(0, xp=torch, dtype=dtype, device=device).contiguous()  # the layout a step returns
    w0 = torch.linspace(-1.0, 1.0, 6, dtype=dtype, device=device).reshape(2, 3)
    params, mans = {"Y": Y0, "w": w0}, {"Y": M, "w": None}

    def grads(p):
        return {"Y": p["Y"] * 0.3 - 0.1, "w": p["w"] - 0.5}

    return params, mans, grads


def test_the_library_guard_filter_drops_library_globals_only(torch, gt, device):
    """With ``options={"guard_filter_fn": gt.skip_guards_on_library_globals}`` the compiled step of
    geoarray's functional Adam keeps every guard on its arguments and on this module's globals, drops
    the guards on geoarray's, array_api_compat's, optree's, NumPy's and torch's globals (more than half
    of all; on the ViT set it keeps 180 of 604), and equals the eager step to 1e-12 over 3 steps (float64); a new
    dtype still compiles a new graph, and so does a change of a global of the caller's module."""
    import torch._dynamo

    from geoarray import optim

    torch._dynamo.reset()
    decisions = []

    def recording_filter(entries):
        keep = gt.skip_guards_on_library_globals(entries)
        decisions.extend(zip(entries, keep, strict=True))
        return keep

    graphs = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def counting(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    opt = optim.Adam(5e-2)

    def user_step(params, grads, state):  # reads _USER_SCALE, a global of this test module
        return opt.update(params, {k: _USER_SCALE * g for k, g in grads.items()}, state)

    compiled = torch.compile(user_step, fullgraph=True, backend=counting, options={"guard_filter_fn": recording_filter})
    params, mans, grads = _functional_problem(torch, device, torch.float64)
    state = opt.init(params, mans)
    pe, se, pc, sc = params, state, params, state
    for _ in range(3):
        pe, se = opt.update(pe, grads(pe), se)
        pc, sc = compiled(pc, grads(pc), sc)
    for name in ("Y", "w"):
        assert_agree(pc[name], pe[name], rtol=1e-12, what=name)
    assert len(graphs) == 1

    dropped = [e for e, keep in decisions if not keep]
    assert all(e.is_global for e in dropped)  # no argument guard is dropped
    assert len(dropped) > len(decisions) / 2, (len(dropped), len(decisions))
    roots = {e.name.split("']")[0] for e, keep in decisions if e.is_global and keep}
    assert "G['_USER_SCALE" in roots, sorted(roots)
    assert not any(r.startswith(("G['__import_geoarray", "G['__import_torch", "G['__import_optree")) for r in roots)

    global _USER_SCALE
    try:  # the caller's global is guarded: changing it recompiles, and the step sees the new value
        _USER_SCALE = 0.0
        p0, _ = compiled(pc, grads(pc), sc)
        assert len(graphs) == 2
        pz, _ = opt.update(pc, {k: torch.zeros_like(g) for k, g in grads(pc).items()}, sc)
        assert_agree(p0["w"], pz["w"], rtol=1e-12, what="w with _USER_SCALE = 0")
    finally:
        _USER_SCALE = 1.0
    params32, _, _ = _functional_problem(torch, device, torch.float32)  # a new dtype: a new graph
    compiled(params32, grads(params32), opt.init(params32, mans))
    assert len(graphs) == 3


# several optimizers, schedulers, a fresh process ----------------------------------------------------


def _step_both(torch, device, t, compiled, eager, what):
    """Step t on a compiled run (params, optimizer, compiled step; eagerly at t = 0, which builds the state)
    and on its eager twin (params, optimizer), then compare their parameters to ``AGREE_RTOL``."""
    (params, opt, step), (twin, opt_eager) = compiled, eager
    for ps, o, run in ((params, opt, step), (twin, opt_eager, opt_eager.step)):
        o.zero_grad()
        _loss(torch, *ps, t, device).backward()
        (o.step if t == 0 else run)()
    for p, q in zip(params, twin, strict=True):
        assert_agree(p.detach(), q.detach(), what=what)


def _twins(torch, gt, device, make):
    """Two equal models, each with the optimizer ``make(gt, params)``: one to compile, one to run eagerly."""
    out = []
    for _ in range(2):
        params = _model(torch, gt, device)
        out.append((params, make(gt, list(params))))
    return out


@pytest.mark.parametrize(
    "pair",
    [("Adam", "Adam, other betas"), ("Adam", "ManifoldMuon"), ("ManifoldMuon", "SGD")],
    ids=lambda p: " then ".join(p),
)
def test_two_optimizers_compiled_in_one_process_step_like_eager(torch, gt, device, pair):
    """``torch.compile(opt.step, fullgraph=True)`` of two optimizers with different hyperparameters in one
    process: both steps share ``step``'s code, so dynamo, having seen the first one's floats, makes the
    second one's symbolic (SymFloat). Their checks and the cohort key must take symbolic numbers (no
    ``repr``, no ``math.isfinite``: both refused the whole graph before); each optimizer's compiled steps
    equal its eager twin's to ``AGREE_RTOL`` over 3 steps."""
    import torch._dynamo

    makers = {
        **OPTIMIZERS,
        "Adam, other betas": lambda gt, ps: gt.Adam(ps, lr=2e-2, betas=(0.8, 0.99), weight_decay=2e-3),
        "ManifoldMuon": lambda gt, ps: gt.ManifoldMuon([ps[0]], lr=2e-2),
    }
    torch._dynamo.reset()
    for name in pair:
        (compiled, opt), (eager, opt_eager) = _twins(torch, gt, device, makers[name])
        step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
        for t in range(4):
            _step_both(torch, device, t, (compiled, opt, step), (eager, opt_eager), what=f"{name}, step {t}")
        assert M.is_point(compiled[0].detach(), atol=1e-12)


@pytest.mark.parametrize("name", ["Adam", "PaperAdam", "ManifoldMuon"])
def test_torchs_scheduler_recipe_compiles_and_steps_like_eager(torch, gt, device, name):
    """torch's recipe for a compiled step with an LR scheduler: ``torch.compile`` (without fullgraph) of
    a function that calls ``opt.step()`` and ``scheduler.step()``, the first call included. Its steps equal
    the eager ones to ``AGREE_RTOL`` over 10 steps of a decaying rate, and after the third nothing is
    compiled again (PaperAdam: once, when its Taylor rule changes): the rate, read from the param group at
    every step, is an input of the graph once dynamo has seen it change. ManifoldMuon had its rate inside
    its core and recompiled at every new rate (dynamo's limit of 8 then left the step eager); its core now
    takes the group's rate as a schedule, and the Stiefel retraction picks its series degree on the device
    (the ``eigh`` route, under compile)."""
    import torch._dynamo

    torch._dynamo.reset()
    makers = {**OPTIMIZERS, "ManifoldMuon": lambda gt, ps: gt.ManifoldMuon([ps[0]], lr=2e-2)}
    (compiled, opt), (eager, opt_eager) = _twins(torch, gt, device, makers[name])
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.7) for o in (opt, opt_eager)]

    @torch.compile(backend="aot_eager")
    def compiled_step():
        opt.step()
        schedulers[0].step()

    from torch._dynamo.utils import counters

    for t in range(10):
        for params, o in ((compiled, opt), (eager, opt_eager)):
            o.zero_grad()
            _loss(torch, *params, t, device).backward()
        compiled_step()
        opt_eager.step()
        schedulers[1].step()
        for p, q in zip(compiled, eager, strict=True):
            assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")
        if t == 2:
            graphs = counters["stats"]["unique_graphs"]
    # PaperAdam's retraction picks φ₁'s Taylor rule on the host from a bound proportional to the rate: a graph
    # per rule the decaying rate crosses (one here), not per rate
    again = counters["stats"]["unique_graphs"] - graphs
    assert again <= (1 if name == "PaperAdam" else 0), f"{name}: 7 new rates compiled the step {again} more times"
    assert opt.param_groups[0]["lr"] == opt_eager.param_groups[0]["lr"]
    assert M.is_point(compiled[0].detach(), atol=1e-12)


_FRESH_PROCESS = """
import warnings

import torch

import geoarray as ga
import geoarray.torch as gt

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.manual_seed(0)
    model = torch.nn.Sequential(gt.nn.StiefelLayer(8, 3), gt.nn.Dense(8, 2, "tanh"))
    x = torch.randn(16, 3)
    forward = torch.compile(model, backend="aot_eager")
    for opt in (gt.Adam(model.parameters(), lr=1e-2), gt.ManifoldMuon(list(model[0].parameters()), lr=1e-2)):
        step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
        for t in range(3):
            opt.zero_grad()
            forward(x).square().sum().backward()
            (opt.step if t == 0 else step)()
    M = ga.Stiefel(6, 3)
    params = {"Y": M.random(0, xp=torch, dtype=torch.float32).contiguous()}
    adam = ga.optim.Adam(lr=1e-3)
    state = adam.init(params, {"Y": M})
    update = torch.compile(adam.update, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        params, state = update(params, {"Y": params["Y"] * 0.1}, state)
for w in caught:
    print(f"{w.category.__name__}: {str(w.message).splitlines()[0]}")
"""


def test_a_first_compile_in_a_fresh_process_traces_no_lru_cache(torch, gt):
    """A user's first compiled forward and steps, in a fresh process (dynamo warns once per process): dynamo
    warns of "potential silent incorrectness" at every ``functools.lru_cache`` wrapper it traces, and it
    traced array_api_compat's namespace predicates and resolution (geoarray's own predicates and the
    namespaces of torch.Tensor and its subclasses, Parameter and ManifoldParameter, now answer without them)
    and φ₁'s coefficient table (now built at import). None of those warnings may appear."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Dynamo detected a call to a `functools.lru_cache`" not in done.stdout, done.stdout


_IMPORT_ORDER = """
import geoarray  # before torch: no framework is imported by geoarray itself
import geoarray.torch as gt
import torch.utils._pytree as pytree
from geoarray._backend import control

print(sorted(c.__qualname__ for c in control._STATIC_NODES if c not in pytree.SUPPORTED_NODES))
"""


def test_importing_geoarray_torch_registers_the_state_nodes_with_torchs_pytree(torch, gt):
    """The optimizer states' static nodes (the layouts) are registered with ``torch.utils._pytree`` when
    geoarray.torch is imported, also where geoarray was imported before torch. They were registered at the
    first optimizer step: a model compiled before it then saw the registry grow, which dynamo guards
    (``len(optree.registry._NODETYPE_REGISTRY)``), and recompiled at the second step (the compiled model and
    step test, run first in a process, failed so). A fresh process: this one has registered them long ago."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", _IMPORT_ORDER], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", f"not registered with torch's pytree after import: {done.stdout}"


@pytest.mark.parametrize("name", ["Adam", "PaperAdam", "SGD"])
def test_a_tensor_lr_is_an_input_of_the_compiled_step(torch, gt, device, name):
    """With a tensor lr (torch's recipe for compiled and captured steps under a scheduler) the compiled step
    reads the rate on the device: new rates written in place (``fill_``, as torch's schedulers write a tensor
    lr) recompile nothing (a recompilation is an error here), and the steps equal eager ones with the same
    rates as floats to ``AGREE_RTOL``."""
    import torch._dynamo

    torch._dynamo.reset()
    makers = {
        "Adam": lambda ps, lr: gt.Adam(ps, lr=lr, weight_decay=1e-3),
        "PaperAdam": lambda ps, lr: gt.PaperAdam(ps, lr=lr),
        "SGD": lambda ps, lr: gt.SGD(ps, lr=lr, momentum=0.9, nesterov=True),
    }
    compiled, eager = _model(torch, gt, device), _model(torch, gt, device)
    lr = torch.tensor(1e-2, dtype=torch.float64, device=device)
    opt, opt_eager = makers[name](list(compiled), lr), makers[name](list(eager), 1e-2)
    step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for t, rate in enumerate((1e-2, 1e-2, 5e-3, 2e-3, 7e-3)):
            lr.fill_(rate)
            opt_eager.param_groups[0]["lr"] = rate
            _step_both(torch, device, t, (compiled, opt, step), (eager, opt_eager), what=f"{name}, step {t}")
    assert M.is_point(compiled[0].detach(), atol=1e-12)


def test_manifold_muon_compiled_at_a_fixed_rate_keeps_the_series_retraction(torch, gt, device):
    """``geoarray.torch.ManifoldMuon`` reads ``lr`` at every step; while it is the rate the core was built with,
    a compiled step takes it as a constant and its Stiefel retraction the truncated series (the graph holds
    the dual ascent's ``dual_iterations + 1`` eigh and no third); once a scheduler changed it, the rate is an
    input and the degree is picked on the device: the ``eigh`` route under compile (one more eigh)."""
    import torch._dynamo

    eighs = []

    def counting(gm, example_inputs):
        eighs.append(sum(1 for node in gm.graph.nodes if node.target is torch.linalg.eigh))
        return gm.forward

    torch._dynamo.reset()
    W, b = _model(torch, gt, device)
    opt = gt.ManifoldMuon([W], lr=1e-2, dual_iterations=1)
    step = torch.compile(opt.step, fullgraph=True, backend=counting)
    for t in range(3):
        opt.zero_grad()
        _loss(torch, W, b, t, device).backward()
        (opt.step if t == 0 else step)()
    assert eighs == [2], eighs
    opt.param_groups[0]["lr"] = 5e-3
    for t in range(3, 6):
        opt.zero_grad()
        _loss(torch, W, b, t, device).backward()
        step()
    assert eighs[-1] == 3 and len(eighs) <= 3, eighs
    assert M.is_point(W.detach(), atol=1e-12)


@pytest.mark.parametrize("analytic", [False, True], ids=["autograd", "analytic"])
def test_a_compiled_model_and_step_train_like_eager(torch, gt, device, analytic):
    """A torch user's compiled training loop: ``torch.compile(module, fullgraph=True)`` of a
    ``geoarray.torch.nn.Module`` (a two-block vision transformer with Stiefel attention weights) traces its
    forward and, through AOT autograd, its backward — torch's autograd or the analytic pullbacks, each a
    ``torch.autograd.Function`` — in one graph, and ``torch.compile(opt.step, fullgraph=True)`` the
    ``PaperAdam`` step; over 4 steps (the first eagerly: it builds the state) loss and weights equal an eager
    twin's to ``AGREE_RTOL``, one compilation serves every step, and the Stiefel weights stay orthonormal to
    1e-12. A last batch of another size (a data loader without ``drop_last``) is a recompilation, not an error."""
    import torch._dynamo

    from geoarray import nn
    from geoarray.models import ClassificationTransformer

    model = ClassificationTransformer(16, 16, 10, n_heads=4, n_layers=2, stiefel=True, add_connection=True)
    loss = nn.ClassificationL2Loss()
    runs = []
    for _ in range(2):
        params = model.init(0, xp=geoarray.as_namespace(torch), dtype=torch.float64, device=device)
        m = gt.nn.Module(model, params=params, analytic=analytic)
        runs.append((m, gt.PaperAdam(m.parameters(), lr=1e-2)))
    (m, opt), (m_eager, opt_eager) = runs
    torch._dynamo.reset()
    forward = torch.compile(m, fullgraph=True, backend="aot_eager")
    step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")

    def batch(t, size=8):
        g = torch.Generator().manual_seed(200 + t)
        x = torch.randn(size, 16, 16, generator=g, dtype=torch.float64).to(device)
        y = torch.nn.functional.one_hot(torch.arange(size) % 10, 10).to(device=device, dtype=torch.float64)
        return x, y

    def train(t, size=8):
        x, y = batch(t, size)
        values = []
        for f, o, run in ((forward, opt, step), (m_eager, opt_eager, opt_eager.step)):
            o.zero_grad()
            value = loss.value(f(x), y)
            value.backward()
            (o.step if t == 0 else run)()
            values.append(value.detach())
        assert_agree(values[0], values[1], what=f"loss, step {t}")
        for (name, p), q in zip(m.named_parameters(), m_eager.parameters(), strict=True):
            assert_agree(p.detach(), q.detach(), what=f"{name}, step {t}")

    train(0)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for t in range(1, 4):
            train(t)
    train(4, size=5)
    frames = [(n, p) for n, p in m.named_parameters() if isinstance(getattr(p, "manifold", None), geoarray.Stiefel)]
    assert frames, "the model has Stiefel weights"
    for name, p in frames:
        assert p.manifold.is_point(p.detach(), atol=1e-12), name
