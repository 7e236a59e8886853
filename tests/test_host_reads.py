"""Steps without host reads (#30): ``geoarray.set_host_reads("never")`` makes an eager step do on the CPU
what it does on a GPU — no value read to the host, the non-finite policy a ``where``, the retraction a
fixed amount of work — and its results equal the reading step's to rounding.

Host reads are counted on torch with a dispatch mode that sees ``aten._local_scalar_dense``,
``aten.item`` and ``aten.is_nonzero`` (every ``float(t)``, ``int(t)``, ``bool(t)`` and ``t.item()``
goes through one of them), and so are the operations that make the host wait for a GPU without reading
anything on a CPU: ``aten.lift_fresh`` (an array made from Python numbers, which torch copies to a CUDA
device synchronously), ``nonzero`` and boolean-mask indexing (a data-dependent shape). JAX is checked
under ``jax.jit`` (no callback in the program, no transfer to the host while it runs). NumPy and
array-api-strict have no device, so there the tests check the results of the fixed-work route, which is
the one CuPy runs on a GPU. Arrays made on the wrong device (on a GPU: on the CPU) are found on torch with
its default device set to ``meta`` during a step, and in the array-api-strict session, which runs on its
second device. Beyond the optimizer's step, a whole torch training step (a ``geoarray.torch.nn.Module``'s forward,
backward and the step) and each layer's forward and backward read nothing either: what capturing forward,
backward and step in one CUDA graph needs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings

import numpy as np
import optree
import pytest

import geoarray
from _helpers import assert_agree, host_waits, to_numpy
from geoarray import Grassmann, Stiefel, SymplecticStiefel, optim
from geoarray.manifolds import retraction

# manifold Muon's dual ascent takes dual_iterations + 1 n×n eigh per matrix and step; torch has no eigh
# that leaves ``info`` on the device (no linalg.eigh_ex), so on a CUDA device each one waits
EIGH_WAITS = "torch's eigh checks cuSOLVER's info on the host (there is no linalg.eigh_ex)"


@pytest.fixture
def policy(host_reads_policy):
    """Set a host reads policy for one test and restore the previous one afterwards (conftest.py)."""
    return host_reads_policy


def count_host_reads(fn):
    """(count, result) of ``fn()``: :func:`host_waits`, counted."""
    seen, out = host_waits(fn)
    return len(seen), out


# leaves an optimizer refuses: sections other than Householder's need Stiefel or Grassmann (BFGS's
# default is "transported"), and manifold Muon takes matrices only
DROP = {
    "Adam-transported": ("symplectic",),
    "Adam-rotated": ("symplectic",),
    "BFGS": ("symplectic",),
    "ManifoldMuon": ("b", "symplectic"),
}


def _problem(xp, device, dtype=None, drop=()):
    """A tree with every manifold and a batched group: params, manifolds and a gradient function."""
    St, Gr, Sp = Stiefel(12, 3), Grassmann(8, 2), SymplecticStiefel(6, 2)
    kw = {"xp": xp, "device": device, "dtype": dtype}
    params = {
        "stiefel": St.random(0, **kw),
        "heads": Stiefel(8, 2).random(1, batch_shape=(4,), **kw),
        "orthogonal": Stiefel(5, 5).random(6, **kw),  # square: the n×n fast path
        "grassmann": Gr.random(2, **kw),
        "symplectic": Sp.random(3, **kw),
        "w": geoarray.random.normal(4, (5, 3), **kw),
        "b": geoarray.random.normal(5, (3,), **kw),
    }
    mans = {
        "stiefel": St,
        "heads": Stiefel(8, 2),
        "orthogonal": Stiefel(5, 5),
        "grassmann": Gr,
        "symplectic": Sp,
        "w": None,
        "b": None,
    }
    params = {k: v for k, v in params.items() if k not in drop}
    mans = {k: v for k, v in mans.items() if k not in drop}
    targets = optree.tree_map(lambda p: geoarray.random.normal(9, tuple(p.shape), **kw), params)

    def grads(p):
        return optree.tree_map(lambda a, t: a - t, p, targets)

    return params, mans, grads


def _optimizers():
    return {
        "Adam": lambda: optim.Adam(2e-2),
        "Adam-transported": lambda: optim.Adam(2e-2, section="transported"),
        "Adam-rotated": lambda: optim.Adam(2e-2, section="rotated"),
        "Adam-cayley": lambda: optim.Adam(2e-2, retraction="cayley"),
        "Momentum": lambda: optim.Momentum(2e-2),
        "Gradient": lambda: optim.Gradient(2e-2),
        "AdamWithDecay": lambda: optim.AdamWithDecay(50, lr_start=2e-2),
        # BFGS at 2e-2 takes a step of ‖X‖₁ ≈ 164 on one head at its 3rd update (its inverse-Hessian
        # estimate is poor that early), beyond the fixed route's reach of 16, so that step would be
        # skipped without host reads (test_a_step_beyond_the_doubling_budget_is_skipped_and_counted)
        "BFGS": lambda: optim.BFGS(2e-3),
        "ManifoldMuon": lambda: optim.ManifoldMuon(2e-2),
        "partition": lambda: optim.partition(
            {"muon": optim.Muon(2e-2), "adam": optim.Adam(2e-2)},
            {
                "stiefel": "adam",
                "heads": "adam",
                "orthogonal": "adam",
                "grassmann": "adam",
                "symplectic": "adam",
                "w": "muon",
                "b": "adam",
            },
        ),
    }


OPTIMIZERS = _optimizers()


def _steps(opt, params, mans, grads, n):
    state = opt.init(params, mans)
    for _ in range(n):
        params, state = opt.update(params, grads(params), state)
    return params, state


def test_the_policy_is_validated_and_restored(pytestconfig, policy):
    """The library's default is "cpu" (reads only where they are free; checked in a fresh interpreter,
    since this run may have chosen another with ``--host-reads``); a bad policy changes nothing."""
    fresh = subprocess.run(
        [sys.executable, "-c", "import geoarray; print(geoarray.get_host_reads())"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert fresh.stdout.strip() == "cpu", fresh.stderr
    assert geoarray.get_host_reads() == pytestconfig.getoption("--host-reads")
    before = geoarray.get_host_reads()
    with pytest.raises(ValueError, match=r"'never', 'cpu', 'always'.*got 'sometimes'"):
        geoarray.set_host_reads("sometimes")
    assert geoarray.get_host_reads() == before  # nothing changed by the refused call
    assert policy("never") == before
    assert geoarray.get_host_reads() == "never"
    assert policy("always") == "never"


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_eager_torch_step_reads_nothing_to_the_host(backend, xp, device, policy, name, dtype_name):
    """Zero host reads in an eager step (the first after init and a later one) for every optimizer,
    section strategy and retraction, on every manifold, in float64 and float32, and nothing else a GPU
    would make the host wait for: no array made from Python numbers (a copy to the device, synchronous
    on CUDA), no boolean-mask indexing (array-api-compat's torch ``sign`` assigned NaN through one) and
    no data-dependent shape. The default policy reads on the CPU (so the count is known to see reads)."""
    if backend.kind != "torch":
        pytest.skip("host reads are counted with a torch dispatch mode; JAX is checked under jax.jit below")
    dtype = getattr(xp, dtype_name)
    params, mans, grads = _problem(xp, device, dtype, DROP.get(name, ()))
    opt = OPTIMIZERS[name]()
    state = opt.init(params, mans)
    policy("always")
    reads, _ = count_host_reads(lambda: opt.update(params, grads(params), state))
    if name != "ManifoldMuon":  # Newton–Schulz and the Householder retraction decide nothing
        assert reads > 0
    policy("never")
    for _ in range(2):
        waits, (params, state) = host_waits(lambda: opt.update(params, grads(params), state))  # noqa: B023
        if name == "ManifoldMuon":  # EIGH_WAITS: every wait is an eigh, nothing else
            waits = [w for w in waits if not w.startswith("_linalg_eigh")]
        assert not waits, f"{name}: {len(waits)} host reads or waits in one eager step: {waits}"


@pytest.mark.parametrize("reads", ["always", "never"])
def test_a_step_makes_every_array_on_its_inputs_device(backend, xp, device, policy, reads):
    """init and two updates of every optimizer with torch's default device set to ``meta``: an array made
    without ``device=`` (which on a GPU lands on the CPU: BFGS's state did, found on the first GPU run) would
    be a meta tensor and fail to combine with the CPU inputs. Every result is on the inputs' device and equal
    bit for bit to the same steps without the default device set (the same computation)."""
    if backend.name != "torch":
        pytest.skip("torch's default-device context; array-api-strict's session runs on a second device instead")
    import torch

    policy(reads)
    for name, make in OPTIMIZERS.items():
        params, mans, grads = _problem(xp, device, drop=DROP.get(name, ()))
        results = []
        for default in (None, "meta"):
            opt = make()
            with torch.device(default) if default else contextlib.nullcontext():
                out = _steps(opt, params, mans, grads, 2)
            results.append(out)
        leaves = optree.tree_leaves(results[1])
        assert all(x.device == params["stiefel"].device for x in leaves if isinstance(x, torch.Tensor)), name
        for a, b in zip(leaves, optree.tree_leaves(results[0]), strict=True):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=name)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_without_host_reads_a_step_equals_the_step_with_them(backend, xp, device, policy, caplog, name):
    """6 steps with fixed work equal 6 steps that read to the host, to AGREE_RTOL (float64: 1e-12): every
    route of the retraction is accurate to unit roundoff; and the parameters moved.

    On JAX, eager steps without host reads (what a GPU runs by default) compile nothing once warm: two
    more steps log no XLA compilation. The rotated frame's retraction kernel, called outside a compiled
    kernel, used to trace its device-side ``lax.switch`` anew and compile it at every call (~0.25 s each,
    30 s for these 6 steps)."""
    params, mans, grads = _problem(xp, device, drop=DROP.get(name, ()))
    policy("always")
    read, read_state = _steps(OPTIMIZERS[name](), params, mans, grads, 6)
    policy("never")
    opt = OPTIMIZERS[name]()
    fixed, fixed_state = _steps(opt, params, mans, grads, 6)
    if backend.kind == "jax":
        import logging

        import jax

        with caplog.at_level(logging.WARNING), jax.log_compiles(True):
            p, s = fixed, fixed_state
            for _ in range(2):
                p, s = opt.update(p, grads(p), s)
        compiled = [r.getMessage()[:90] for r in caplog.records if "XLA compilation" in r.getMessage()]
        assert not compiled, f"{name}: warm eager steps compiled {len(compiled)} times: {compiled[:3]}"
    for a, b, p in zip(optree.tree_leaves(fixed), optree.tree_leaves(read), optree.tree_leaves(params), strict=True):
        assert_agree(a, b)
        assert float(np.max(np.abs(to_numpy(b) - to_numpy(p)))) > 1e-3
    for a, b in zip(optree.tree_leaves(fixed_state), optree.tree_leaves(read_state), strict=True):
        if np.issubdtype(to_numpy(b).dtype, np.integer):  # step counters
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
        else:
            assert_agree(a, b)


def test_the_torch_adapter_steps_read_nothing_to_the_host(backend, xp, device, policy):
    """geoarray.torch's optimizers (torch's Adam, AdamW, SGD with momentum, the paper's Adam, manifold
    Muon and Muon; Adam, the paper's Adam and SGD also with a tensor lr) make no host read in ``step``
    after the first (which builds the state) and equal the reading steps to AGREE_RTOL after 3 steps (manifold
    Muon with a tensor lr: the series degree picked on the device, the ``eigh`` route, against the read)."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch runs on the torch backend")
    import torch

    import geoarray.torch as gt

    makers = {
        "Adam": lambda ps: gt.Adam(ps, lr=1e-2),
        "AdamW": lambda ps: gt.AdamW(ps, lr=1e-2),
        "SGD": lambda ps: gt.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
        "PaperAdam": lambda ps: gt.PaperAdam(ps, lr=1e-2),
        "ManifoldMuon": lambda ps: gt.ManifoldMuon(ps, lr=1e-2),
        "Muon": lambda ps: gt.Muon(ps[1:], lr=1e-2),
        # a tensor lr (torch's recipe for captured and compiled steps under a scheduler) is read on the device
        "Adam, tensor lr": lambda ps: gt.Adam(ps, lr=torch.tensor(1e-2, device=device)),
        "PaperAdam, tensor lr": lambda ps: gt.PaperAdam(ps, lr=torch.tensor(1e-2, device=device)),
        "SGD, tensor lr": lambda ps: gt.SGD(ps, lr=torch.tensor(1e-2, device=device), momentum=0.9),
        "ManifoldMuon, tensor lr": lambda ps: gt.ManifoldMuon(ps, lr=torch.tensor(1e-2, device=device)),
    }
    M = Stiefel(20, 4)
    for name, make in makers.items():
        results = {}
        for mode in ("always", "never"):
            policy(mode)
            W = gt.ManifoldParameter(M.random(0, xp=torch, device=device), M)
            B = torch.nn.Parameter(geoarray.random.normal(1, (4, 3), xp=torch, device=device))
            opt = make([W, B])
            counts = []
            for _ in range(3):
                opt.zero_grad()
                torch.sin(W @ B).sum().backward()
                seen, _ = host_waits(opt.step)
                if name.startswith("ManifoldMuon"):  # EIGH_WAITS
                    seen = [w for w in seen if not w.startswith("_linalg_eigh")]
                counts.append(len(seen))
            if mode == "never":
                # the first step builds the state, checking that each point is on its manifold
                assert counts[1:] == [0, 0], f"{name}: host reads per step {counts}"
            results[mode] = (W.detach().clone(), B.detach().clone())
        for a, b in zip(results["never"], results["always"], strict=True):
            assert_agree(a, b)


def test_the_torch_adapter_makes_every_array_on_its_parameters_device(backend, xp, device, policy):
    """geoarray.torch's optimizers (state built in the first step, capturable buffers included) stepped with
    torch's default device set to ``meta``: an array made without ``device=`` would be a meta tensor and fail
    to combine with the parameters. Three steps equal the same steps without it, bit for bit."""
    if backend.name != "torch":
        pytest.skip("torch's default-device context")
    import torch

    import geoarray.torch as gt

    makers = {
        "Adam": lambda ps: gt.Adam(ps, lr=1e-2),
        "SGD": lambda ps: gt.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
        "PaperAdam": lambda ps: gt.PaperAdam(ps, lr=1e-2),
        "PaperAdam(capturable)": lambda ps: gt.PaperAdam(ps, lr=1e-2, capturable=True),
        "ManifoldMuon": lambda ps: gt.ManifoldMuon(ps, lr=1e-2),
        "Muon": lambda ps: gt.Muon(ps[1:], lr=1e-2),
    }
    M = Stiefel(20, 4)
    for reads in ("always", "never"):
        policy(reads)
        for name, make in makers.items():
            results = []
            for default in (None, "meta"):
                W = gt.ManifoldParameter(M.random(0, xp=torch, device=device), M)
                B = torch.nn.Parameter(geoarray.random.normal(1, (4, 3), xp=torch, device=device))
                opt = make([W, B])
                for _ in range(3):
                    opt.zero_grad()
                    torch.sin(W @ B).sum().backward()
                    with torch.device(default) if default else contextlib.nullcontext():
                        opt.step()
                results.append((W.detach().clone(), B.detach().clone()))
            for a, b in zip(*results, strict=True):
                assert torch.equal(a, b), f"{name} ({reads})"


def test_a_step_beyond_the_doubling_budget_is_skipped_and_counted(backend, xp, device, policy):
    """Without host reads the retraction runs SYNC_FREE_DOUBLINGS doublings: a step that needs more comes
    out non-finite, so the optimizer leaves parameters and state as they were (bit for bit) and counts
    it in state.skipped; with reads the same step is taken and stays on the manifold (1e-10). JAX
    chooses its work on the device (lax.switch, lax.fori_loop), so it takes the step either way."""
    M = Stiefel(10, 3)
    params = {"Y": M.random(0, xp=xp, device=device)}
    huge = {"Y": geoarray.random.normal(1, (10, 3), xp=xp, device=device)}
    opt = optim.Gradient(400.0)  # ‖X‖₁ ≈ 10³ ≫ 16, the budget's reach
    for mode in ("always", "never"):
        policy(mode)
        state = opt.init(params, {"Y": M})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the masked step cannot warn: state.skipped says it
            new, state = opt.update(params, huge, state)
        skipped = mode == "never" and backend.kind != "jax"
        assert int(state.skipped) == int(skipped) and int(state.step) == int(not skipped)
        if skipped:
            np.testing.assert_array_equal(to_numpy(new["Y"]), to_numpy(params["Y"]))
        else:
            assert M.is_point(new["Y"], atol=1e-10)
            assert float(np.max(np.abs(to_numpy(new["Y"]) - to_numpy(params["Y"])))) > 0.1


def test_a_non_finite_gradient_without_host_reads_is_skipped_and_counted(backend, xp, device, policy):
    """A NaN gradient under "never": parameters and state unchanged bit for bit, state.skipped = 1, and no
    warning (it would need a read); the next finite step goes on as if the bad one never came."""
    params, mans, grads = _problem(xp, device)
    policy("never")
    opt = optim.Adam(2e-2)
    state = opt.init(params, mans)
    params, state = opt.update(params, grads(params), state)
    bad = optree.tree_map(lambda g: g * float("nan"), grads(params))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same, skipped = opt.update(params, bad, state)
    assert int(skipped.skipped) == 1 and int(skipped.step) == 1
    for a, b in zip(optree.tree_leaves((same, skipped.inner)), optree.tree_leaves((params, state.inner)), strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    after, _ = opt.update(params, grads(params), skipped)
    direct, _ = opt.update(params, grads(params), state)
    for a, b in zip(optree.tree_leaves(after), optree.tree_leaves(direct), strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


@pytest.mark.parametrize("norm", [1e-3, 0.05, 0.5, 3.0, 12.0])
def test_phi1_without_host_reads_equals_phi1_with_them(backend, xp, device, policy, norm):
    """φ₁(X) by the fixed route (top Taylor rule, masked doublings) equals the chosen route to 1e-13
    relative for ‖X‖₁ from 10⁻³ to 12 (up to 4 doublings), batched with mixed norms."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 6, 6))
    X = X / np.abs(X).sum(axis=-2).max(axis=-1)[:, None, None] * np.array([norm, norm / 10, norm / 100])[:, None, None]
    X = xp.asarray(X, device=device)
    policy("always")
    chosen = retraction.phi1(X, xp, 64)
    policy("never")
    fixed = retraction.phi1(X, xp, 64)
    assert_agree(fixed, chosen, rtol=1e-13)


def test_the_doubling_budget_is_the_documented_reach(backend, xp, device, policy):
    """Without host reads φ₁ of ‖X‖₁ beyond 16·θ comes out NaN (torch, NumPy, array-api-strict; JAX and
    the reading route give it finite)."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 6))
    X = xp.asarray(X / np.abs(X).sum(axis=0).max() * 100.0, device=device)
    policy("never")
    out = to_numpy(retraction.phi1(X, xp, 64))
    assert np.isfinite(out).all() == (backend.kind == "jax")
    policy("always")
    assert np.isfinite(to_numpy(retraction.phi1(X, xp, 64))).all()
    assert retraction.SYNC_FREE_DOUBLINGS == 4


def test_a_jitted_jax_step_has_no_host_callback_and_no_transfer(backend, xp, device):
    """jax.jit(opt.update) for Adam, BFGS, ManifoldMuon and partition: the traced program holds no
    callback primitive, and a step runs under jax.transfer_guard("disallow") after compilation."""
    if backend.kind != "jax":
        pytest.skip("jax.jit exists only on the jax backend")
    import jax

    for name in ("Adam", "BFGS", "ManifoldMuon", "partition"):
        params, mans, grads = _problem(xp, device, drop=DROP.get(name, ()))
        opt = OPTIMIZERS[name]()
        state = opt.init(params, mans)
        g = grads(params)
        jaxpr = str(jax.make_jaxpr(opt.update)(params, g, state))
        for primitive in ("callback", "io_callback", "pure_callback", "debug_callback"):
            assert primitive not in jaxpr, f"{name}: {primitive} in the jitted step"
        step = jax.jit(opt.update)
        jax.block_until_ready(step(params, g, state))  # compile outside the guard
        with jax.transfer_guard("disallow"):
            out = jax.block_until_ready(step(params, g, state))
        moved = [float(np.max(np.abs(to_numpy(a) - to_numpy(b)))) for a, b in zip(
            optree.tree_leaves(out[0]), optree.tree_leaves(params), strict=True)]  # fmt: skip
        assert min(moved) > 1e-4, f"{name}: a jitted step left a leaf in place ({moved})"


@pytest.mark.parametrize("name", ["Adam", "Momentum", "BFGS", "ManifoldMuon", "partition"])
def test_a_gpu_step_does_not_synchronise(backend, xp, device, name):
    """On a GPU with the default policy: torch steps under ``torch.cuda.set_sync_debug_mode("error")`` and
    CuPy steps under ``cupyx.allow_synchronize(False)`` raise nothing (the second step: the first builds
    nothing more than the state, which init does on the host)."""
    if backend.name not in ("torch-cuda", "cupy"):
        pytest.skip(f"{backend.name} runs on the host: there is no device stream to synchronise with")
    if name == "ManifoldMuon" and backend.kind == "torch":
        pytest.xfail(f"manifold Muon waits for each eigh on a CUDA device: {EIGH_WAITS}")
    params, mans, grads = _problem(xp, device, drop=DROP.get(name, ()))
    opt = OPTIMIZERS[name]()
    state = opt.init(params, mans)
    g = grads(params)
    params, state = opt.update(params, g, state)
    if backend.kind == "torch":
        import torch

        torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            opt.update(params, g, state)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    else:
        import cupyx

        with cupyx.allow_synchronize(False):
            opt.update(params, g, state)


def _torch_training_steps(torch, device, *, stiefel: bool, analytic: bool):
    """(step, model): a training step (forward, backward, ``PaperAdam`` step) of a two-block vision transformer
    (the paper's architecture at a small size) wrapped as a ``geoarray.torch.nn.Module``."""
    import geoarray.torch as gt
    from geoarray import nn
    from geoarray.models import ClassificationTransformer

    model = ClassificationTransformer(16, 16, 10, n_heads=4, n_layers=2, stiefel=stiefel, add_connection=True)
    params = model.init(0, xp=geoarray.as_namespace(torch), dtype=torch.float32, device=device)
    m = gt.nn.Module(model, params=params, analytic=analytic)
    opt = gt.PaperAdam(m.parameters(), lr=1e-3)
    loss = nn.ClassificationL2Loss()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 16, generator=g, dtype=torch.float32).to(device)
    y = torch.nn.functional.one_hot(torch.arange(8) % 10, 10).to(device=device, dtype=torch.float32)

    def step():
        opt.zero_grad()
        loss.value(m(x), y).backward()
        opt.step()

    return step


@pytest.mark.parametrize("stiefel", [True, False], ids=["stiefel", "euclidean"])
@pytest.mark.parametrize("analytic", [False, True], ids=["autograd", "analytic"])
def test_a_torch_training_step_reads_nothing_to_the_host(backend, xp, device, policy, stiefel, analytic):
    """A whole training step through geoarray.torch — a ``Module``'s forward, backward (torch's autograd or the
    analytic pullbacks) and the optimizer's step — makes no host read or wait after the first step (which
    builds the optimizer's state): what a CUDA graph that captures forward, backward and step together needs.
    On a CUDA device it also runs under ``torch.cuda.set_sync_debug_mode("error")``."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch runs on the torch backend")
    import torch

    policy("never")
    step = _torch_training_steps(torch, device, stiefel=stiefel, analytic=analytic)
    step()
    seen, _ = host_waits(step)
    assert seen == [], f"host reads or waits in a training step: {seen}"
    if device.type == "cuda":
        torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def test_every_torch_layer_reads_nothing_to_the_host_forward_and_backward(backend, xp, device):
    """Each geoarray.torch.nn layer (tests/test_torch_nn.py's cases), with torch's autograd and, where it has
    them, the analytic pullbacks: a forward and a backward make no host read or wait."""
    if backend.kind != "torch":
        pytest.skip("geoarray.torch runs on the torch backend")
    import torch
    from test_torch_nn import CASES

    import geoarray.torch as gt

    for name, (args, kwargs, shape) in sorted(CASES.items()):
        for analytic in (False, True):
            module = getattr(gt.nn, name)(
                *args, seed=3, device=device, dtype=torch.float64, analytic=analytic, **kwargs
            )
            x = geoarray.random.normal(0, shape, xp=torch, dtype=torch.float64, device=device)
            seen, _ = host_waits(lambda: module(x).sum().backward())  # noqa: B023
            assert seen == [], f"{name} (analytic={analytic}): {seen}"
