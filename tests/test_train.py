"""geoarray.train.fit on every backend, float64.

Properties and tolerances:

* ``jit=True`` (jax.jit of gradient and update on JAX) = eager to 1e-12;
* the same seed gives bit-identical histories and parameters; another seed draws other batches;
* the loss decreases on a small separable problem (last epoch ≤ 0.7 × first), and Stiefel weights
  stay on their manifold (YᵀY = I to 1e-12);
* analytic gradients (model.vjp + loss.vjp) = torch.func / jax.value_and_grad to 1e-10 relative
  (torch, jax), and so do two epochs of training with either;
* ``out=`` writes the history as JSON; a checkpoint reloads bit-exactly (params and optimizer state)
  and training resumed from it continues exactly as the uninterrupted run (1e-12);
* ``fit(resume=True)`` from a checkpoint taken inside an epoch ends bit-identical to the uninterrupted
  run (parameters, optimizer state, losses); a damaged newest checkpoint is refused by
  ``load_checkpoint`` and skipped (with a warning) on resume, files of two checkpoints mixed are refused,
  ``keep`` bounds the number kept, and a run that does not match the checkpoints is refused;
* Ctrl-C: a KeyboardInterrupt raised by a callback or by the loss, and a real SIGINT, stop the loop
  cleanly, return the last completed step's parameters with ``interrupted=True`` and keep the last
  checkpoint intact;
* host reads: without a progress bar or callback, ``fit`` reads the steps' losses once per epoch (one
  ``to_host`` call, and on torch no scalar read at all in the loop, with the optimizer's host reads
  policy ``"never"``); a callback reads each step, the bar at most every ``_BAR_LOSS_SECONDS``, and
  ``_PENDING`` bounds the losses held; the history is bit-identical however the reads fall (the host
  adds the same floats in the same order);
* bad arguments raise ValueError/TypeError naming the argument.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import optree
import pytest

import geoarray
from _helpers import to_numpy
from geoarray import nn, optim
from geoarray.models import ClassificationTransformer
from geoarray.train import accuracy, fit, list_checkpoints, load_checkpoint, value_and_grad

N, T, D, C = 24, 2, 4, 3


def _problem(xp, device, seed=0):
    """N sequences (T, D) whose class is the sign pattern of a fixed projection of the last token."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, T, D))
    labels = np.argmax(x[:, -1, :C] + 0.5 * x[:, 0, :C], axis=-1)
    y = np.eye(C)[labels]
    as_xp = lambda a: xp.asarray(a, dtype=geoarray.resolve_dtype(xp, None, device), device=device)  # noqa: E731
    return as_xp(x), as_xp(y)


def _model():
    return ClassificationTransformer(D, T, C, n_heads=2, n_layers=1)


def _fit(xp, device, **kw):
    model = _model()
    params = model.init(0, xp=xp, device=device)
    kw.setdefault("epochs", 2)
    kw.setdefault("batch_size", 8)
    kw.setdefault("progress", False)
    kw.setdefault("jit", False)  # eager: a jax.jit compile per fit call would dominate these tiny runs
    return model, fit(model, params, _problem(xp, device), optim.Adam(lr=0.05), nn.ClassificationL2Loss(), **kw)


def _leaves_np(tree):
    return [to_numpy(leaf) for leaf in optree.tree_leaves(tree)]


def test_fit_is_deterministic_per_seed(xp, device):
    _, a = _fit(xp, device, seed=3, epochs=1)
    _, b = _fit(xp, device, seed=3, epochs=1)
    _, c = _fit(xp, device, seed=4, epochs=1)
    assert [h["train_loss"] for h in a.history] == [h["train_loss"] for h in b.history]
    for u, v in zip(_leaves_np(a.params), _leaves_np(b.params), strict=True):
        np.testing.assert_array_equal(u, v)
    assert a.history[0]["train_loss"] != c.history[0]["train_loss"], "another seed must draw other batches"
    assert a.steps == 3 and not a.interrupted


def test_loss_decreases_and_stiefel_weights_stay_on_the_manifold(xp, device):
    model, r = _fit(xp, device, epochs=8, val_data=_problem(xp, device, seed=1), metrics={"acc": accuracy})
    losses = [h["train_loss"] for h in r.history]
    assert losses[-1] <= 0.7 * losses[0], losses
    assert set(r.history[0]) >= {"epoch", "train_loss", "val_loss", "seconds", "acc"}
    assert 0.0 <= r.history[-1]["acc"] <= 1.0
    for Y in model.stiefel_params(r.params):
        Y = to_numpy(Y)
        np.testing.assert_allclose(
            np.swapaxes(Y, -1, -2) @ Y, np.broadcast_to(np.eye(Y.shape[-1]), (2, 2, 2)), atol=1e-12
        )


def test_analytic_gradient_equals_autodiff(xp, device, backend):
    if backend.kind not in ("torch", "jax"):
        pytest.skip(f"grad='autodiff' needs torch or jax; {backend.name} has only the analytic path")
    model = _model()
    params = model.init(1, xp=xp, device=device)
    x, y = _problem(xp, device)
    loss = nn.ClassificationL2Loss()
    va, ga = value_and_grad(model, loss, params, x, y, grad="analytic")
    vb, gb = value_and_grad(model, loss, params, x, y, grad="autodiff")
    assert abs(float(to_numpy(va)) - float(to_numpy(vb))) <= 1e-12
    for u, v in zip(_leaves_np(ga), _leaves_np(gb), strict=True):
        np.testing.assert_allclose(u, v, rtol=0, atol=1e-10 * max(np.max(np.abs(v)), 1e-300))
    _, ra = _fit(xp, device, grad="analytic")
    _, rb = _fit(xp, device, grad="autodiff")
    for u, v in zip(_leaves_np(ra.params), _leaves_np(rb.params), strict=True):
        np.testing.assert_allclose(u, v, rtol=0, atol=1e-10)


def test_jit_matches_eager(xp, device):
    """On JAX ``jit=True`` compiles gradient and update; elsewhere it is a no-op. Same result to 1e-12."""
    _, a = _fit(xp, device, epochs=1, jit=True)
    _, b = _fit(xp, device, epochs=1, jit=False)
    assert abs(a.history[0]["train_loss"] - b.history[0]["train_loss"]) <= 1e-12
    for u, v in zip(_leaves_np(a.params), _leaves_np(b.params), strict=True):
        np.testing.assert_allclose(u, v, rtol=0, atol=1e-12)


def _count_loss_reads(monkeypatch, backend):
    """A list that ``fit``'s host reads append to: every ``_backend.to_host`` call, and on torch every
    scalar read (``aten._local_scalar_dense``, ``item``, ``is_nonzero``) as ``"scalar"``; and a context
    manager to run ``fit`` in."""
    import contextlib

    from geoarray import _backend

    reads: list[str] = []
    real = _backend.to_host
    monkeypatch.setattr(_backend, "to_host", lambda x: (reads.append("to_host"), real(x))[1])
    if backend.kind != "torch":
        return reads, contextlib.nullcontext()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("_local_scalar_dense", "item", "is_nonzero"):
                reads.append("scalar")
            return func(*args, **(kwargs or {}))

    return reads, Count()


def test_fit_reads_the_losses_once_per_epoch(xp, device, backend, monkeypatch, host_reads_policy):
    """No read to the host per step (#30: on a GPU each would stall the queue): with neither bar nor
    callback, 2 more epochs of 3 steps add 2 reads, one ``to_host`` each (``init``'s check that the
    weights lie on their manifolds reads once per call, before the loop, the same in both runs). On torch
    the optimizer's policy is "never" (a GPU's default), so that its own reads are not counted."""
    if backend.kind == "torch":
        host_reads_policy("never")
    counts = []
    for epochs in (2, 4):
        reads, mode = _count_loss_reads(monkeypatch, backend)
        with mode:
            _, r = _fit(xp, device, epochs=epochs)
        assert r.steps == 3 * epochs
        counts.append((reads.count("to_host"), reads.count("scalar")))
    (host2, scalar2), (host4, scalar4) = counts
    assert (host4 - host2, scalar4 - scalar2) == (2, 0), counts


@pytest.mark.parametrize("reading", ["callback", "bar every step", "pending 2", "bar and callback"])
def test_the_history_does_not_depend_on_when_the_losses_are_read(xp, device, backend, monkeypatch, reading):
    """Reading each step (a callback, a bar refreshed every step, or both) or every 2 steps gives bit-identical
    histories to reading once per epoch: the same floats added in the same order (the same computation)."""
    from geoarray import train

    _, once = _fit(xp, device, epochs=2)
    seen: list[float] = []
    kw: dict = {}
    if "callback" in reading:
        kw["callback"] = lambda info: seen.append(info["loss"])
    if "bar" in reading:
        pytest.importorskip("tqdm")
        monkeypatch.setattr(train, "_BAR_LOSS_SECONDS", 0.0)
        kw["progress"] = True
    if reading == "pending 2":
        monkeypatch.setattr(train, "_PENDING", 2)
    reads, mode = _count_loss_reads(monkeypatch, backend)
    with mode:
        _, r = _fit(xp, device, epochs=2, **kw)
    assert [h["train_loss"] for h in r.history] == [h["train_loss"] for h in once.history]
    # pending 2: after steps 2, 3 | 5, 6; with bar and callback each step is read once (by the bar)
    expected = {"callback": 6, "bar every step": 6, "pending 2": 4, "bar and callback": 6}[reading]
    assert reads.count("to_host") == expected, reads
    if "callback" in reading:  # the epoch's mean of the losses the callback saw (batches of 8)
        assert all(isinstance(v, float) for v in seen) and len(seen) == 6
        assert abs(sum(seen[:3]) / 3 - r.history[0]["train_loss"]) <= 1e-12


def test_the_bar_reads_the_loss_at_most_once_a_second(xp, device, backend, monkeypatch):
    """With a bar the first step's loss is shown, then one at most every _BAR_LOSS_SECONDS (here never
    again): 1 + one read per epoch."""
    pytest.importorskip("tqdm")
    from geoarray import train

    monkeypatch.setattr(train, "_BAR_LOSS_SECONDS", float("inf"))
    reads, mode = _count_loss_reads(monkeypatch, backend)
    with mode:
        _fit(xp, device, epochs=2, progress=True)
    assert reads.count("to_host") == 3, reads


def test_the_bar_shows_the_epochs_mean_loss_that_the_history_records(xp, device, monkeypatch):
    """The bar's loss is the epoch's mean train loss so far (not one batch's), and at the end of each epoch
    exactly the history's ``train_loss``, so the last value a user sees is the table's."""
    from geoarray import train

    shown: list[dict] = []

    class Bar:
        def update(self, n: int) -> None:
            pass

        def set_postfix(self, refresh: bool = True, **values: object) -> None:
            shown.append(values)

        def close(self) -> None:
            pass

    monkeypatch.setattr(train, "_progress_bar", lambda total, enabled: Bar() if enabled else None)
    monkeypatch.setattr(train, "_BAR_LOSS_SECONDS", 0.0)
    _, r = _fit(xp, device, epochs=2, progress=True)
    ends = [v for k, v in enumerate(shown) if k == len(shown) - 1 or shown[k + 1]["epoch"] != v["epoch"]]
    assert [v["epoch"] for v in ends] == [1, 2]
    assert [v["loss"] for v in ends] == [f"{h['train_loss']:.4f}" for h in r.history]


def test_json_and_checkpoint_round_trip_and_resume(xp, device, tmp_path):
    out = tmp_path / "run" / "history.json"
    ck = tmp_path / "ck"
    model, r = _fit(xp, device, epochs=2, out=out, checkpoint_every=1, checkpoint_path=ck)
    written = json.loads(out.read_text())
    assert [h["epoch"] for h in written["history"]] == [1, 2] and written["interrupted"] is False
    assert r.checkpoint == os.path.join(ck, "ckpt-000000006")
    assert [step for step, _ in list_checkpoints(ck)] == [4, 5, 6]  # keep=3 by default
    like_params = model.init(5, xp=xp, device=device)
    like_state = optim.Adam(lr=0.05).init(like_params, model.manifolds())
    params, state, meta = load_checkpoint(ck, like_params=like_params, like_state=like_state)
    assert meta["epoch"] == 2 and meta["steps"] == 6
    for u, v in zip(_leaves_np(params), _leaves_np(r.params), strict=True):
        np.testing.assert_array_equal(u, v)
    assert geoarray.array_namespace(optree.tree_leaves(params)[0]) is geoarray.array_namespace(like_params[0]["PQ"])
    # training on from the checkpoint continues exactly as training on from the in-memory result
    data = _problem(xp, device)
    loss = nn.ClassificationL2Loss()
    kw = {"epochs": 1, "batch_size": 8, "progress": False, "jit": False}
    cont = fit(model, params, data, optim.Adam(lr=0.05), loss, opt_state=state, **kw)
    ref = fit(model, r.params, data, optim.Adam(lr=0.05), loss, opt_state=r.opt_state, **kw)
    for u, v in zip(_leaves_np(cont.params), _leaves_np(ref.params), strict=True):
        np.testing.assert_allclose(u, v, rtol=0, atol=1e-12)


def test_keyboard_interrupt_from_callback_keeps_last_checkpoint(xp, device, tmp_path):
    def stop_at_5(info):
        if info["step"] == 5:
            raise KeyboardInterrupt

    ck, out = tmp_path / "ck", tmp_path / "h.json"
    _, r = _fit(xp, device, epochs=3, callback=stop_at_5, checkpoint_path=ck, out=out)
    assert r.interrupted and r.steps == 5 and len(r.history) == 1
    assert [step for step, _ in list_checkpoints(ck)] == [3]  # one per epoch: the first epoch's
    assert json.loads((ck / "ckpt-000000003" / "meta.json").read_text())["epoch"] == 1
    assert json.loads(out.read_text())["interrupted"] is True
    assert sorted(os.listdir(ck)) == ["ckpt-000000003"]

    # the returned parameters are those after step 5: the same as a run told to stop there by SIGINT
    def sigint_at_5(info):
        if info["step"] == 5:
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    _, s = _fit(xp, device, epochs=3, callback=sigint_at_5)
    assert s.interrupted and s.steps == 5
    for u, v in zip(_leaves_np(r.params), _leaves_np(s.params), strict=True):
        np.testing.assert_array_equal(u, v)
    assert signal.getsignal(signal.SIGINT) is before


def _stop_at(step):
    def callback(info):
        if info["step"] == step:
            raise KeyboardInterrupt

    return callback


def _assert_same_run(a, b):
    """Bit-identical parameters, optimizer state, step count and losses (wall-clock seconds excepted)."""
    assert a.steps == b.steps and not a.interrupted and not b.interrupted
    strip = lambda h: [{k: v for k, v in rec.items() if k != "seconds"} for rec in h]  # noqa: E731
    assert strip(a.history) == strip(b.history)
    for u, v in zip(_leaves_np((a.params, a.opt_state)), _leaves_np((b.params, b.opt_state)), strict=True):
        np.testing.assert_array_equal(u, v)


def test_resume_inside_an_epoch_is_bit_identical(xp, device, tmp_path):
    """Interrupted after step 4 of 9 (checkpoints every 2 steps: the newest is step 4, inside epoch 2),
    resumed: parameters, optimizer state and every epoch's losses equal the uninterrupted run's bit for bit."""
    val = {"val_data": _problem(xp, device, seed=1)}
    _, ref = _fit(xp, device, epochs=3, **val)
    ck = tmp_path / "ck"
    _, cut = _fit(xp, device, epochs=3, checkpoint_path=ck, checkpoint_every=2, callback=_stop_at(5), **val)
    assert cut.interrupted and [s for s, _ in list_checkpoints(ck)] == [2, 4]
    meta = json.loads((ck / "ckpt-000000004" / "meta.json").read_text())
    assert (meta["epoch"], meta["batch"], meta["steps"]) == (1, 1, 4)
    _, resumed = _fit(xp, device, epochs=3, checkpoint_path=ck, checkpoint_every=2, resume=True, **val)
    _assert_same_run(resumed, ref)
    assert resumed.checkpoint == os.path.join(ck, "ckpt-000000009")
    # resuming a finished run trains nothing and returns the same result
    _, again = _fit(xp, device, epochs=3, checkpoint_path=ck, resume=True, **val)
    _assert_same_run(again, ref)


def test_damaged_or_mixed_checkpoints_are_refused_and_skipped_on_resume(xp, device, tmp_path):
    ck = tmp_path / "ck"
    model, ref = _fit(xp, device, epochs=2)
    _fit(xp, device, epochs=2, checkpoint_path=ck, checkpoint_every=1, keep=4, callback=_stop_at(5))
    assert [s for s, _ in list_checkpoints(ck)] == [1, 2, 3, 4]
    like_params = model.init(0, xp=xp, device=device)
    like = {"like_params": like_params, "like_state": optim.Adam(lr=0.05).init(like_params, model.manifolds())}
    # a bit flipped in the newest checkpoint's parameters
    f = ck / "ckpt-000000004" / "params.npz"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"ckpt-000000004.*damaged.*fallback=True"):
        load_checkpoint(ck, **like)
    with pytest.warns(RuntimeWarning, match="ckpt-000000004"):
        _, _, meta = load_checkpoint(ck, fallback=True, **like)
    assert meta["steps"] == 3
    # the files of two checkpoints mixed (a torn save of the old three-file layout): refused
    (ck / "ckpt-000000002" / "opt_state.npz").write_bytes((ck / "ckpt-000000001" / "opt_state.npz").read_bytes())
    with pytest.raises(ValueError, match="do not belong together"):
        load_checkpoint(ck / "ckpt-000000002", **like)
    with pytest.raises(ValueError, match="not a committed geoarray checkpoint"):
        load_checkpoint(_mkdir(tmp_path / "ckpt-000000009"), **like)
    # resume skips the damaged step 4, continues from step 3, sets the damaged one aside, ends bit-identical
    with pytest.warns(RuntimeWarning, match="skipping a damaged checkpoint"):
        _, resumed = _fit(xp, device, epochs=2, checkpoint_path=ck, checkpoint_every=1, keep=2, resume=True)
    _assert_same_run(resumed, ref)
    assert sorted(os.listdir(ck)) == ["ckpt-000000005", "ckpt-000000006", "damaged-ckpt-000000004"]


def _mkdir(path):
    path.mkdir()
    return path


def test_checkpoint_directory_checks(xp, device, tmp_path):
    ck = tmp_path / "ck"
    _fit(xp, device, epochs=1, checkpoint_path=ck)
    with pytest.raises(ValueError, match=r"already holds checkpoints.*resume=True"):
        _fit(xp, device, epochs=1, checkpoint_path=ck)
    with pytest.raises(ValueError, match=r"seed=0.*seed=1"):
        _fit(xp, device, epochs=1, checkpoint_path=ck, resume=True, seed=1)
    with pytest.raises(ValueError, match=r"batch_size=8.*batch_size=4"):
        _fit(xp, device, epochs=1, checkpoint_path=ck, resume=True, batch_size=4)
    with pytest.raises(ValueError, match="resume=True needs checkpoint_path"):
        _fit(xp, device, epochs=1, resume=True)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"checkpoint_path .*afile.* is a file"):
        _fit(xp, device, epochs=1, checkpoint_path=afile)
    with pytest.raises(ValueError, match="keep"):
        _fit(xp, device, epochs=1, checkpoint_path=tmp_path / "k", keep=0)
    # a fresh directory with resume=True starts afresh
    _, r = _fit(xp, device, epochs=1, checkpoint_path=tmp_path / "fresh", resume=True)
    assert r.steps == 3 and r.checkpoint.endswith("ckpt-000000003")


def test_keyboard_interrupt_inside_a_step_abandons_that_step(xp, device):
    class Flaky(nn.ClassificationL2Loss):
        calls = 0

        def vjp(self, pred, target):
            Flaky.calls += 1
            if Flaky.calls == 4:
                raise KeyboardInterrupt
            return super().vjp(pred, target)

    model = _model()
    params = model.init(0, xp=xp, device=device)
    data = _problem(xp, device)
    r = fit(model, params, data, optim.Adam(lr=0.05), Flaky(), epochs=2, batch_size=8, progress=False, jit=False)
    assert r.interrupted and r.steps == 3 and len(r.history) == 1


def test_bad_arguments(xp, device):
    model = _model()
    params = model.init(0, xp=xp, device=device)
    x, y = _problem(xp, device)
    loss, opt = nn.ClassificationL2Loss(), optim.Adam(lr=0.01)
    with pytest.raises(ValueError, match="epochs"):
        fit(model, params, (x, y), opt, loss, epochs=0, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        fit(model, params, (x, y), opt, loss, epochs=1, batch_size=-1)
    with pytest.raises(ValueError, match="same number of samples"):
        fit(model, params, (x, y[:5, ...]), opt, loss, epochs=1, batch_size=4)
    with pytest.raises(ValueError, match="grad"):
        fit(model, params, (x, y), opt, loss, epochs=1, batch_size=4, grad="finite")
    with pytest.raises(ValueError, match="checkpoint_path"):
        fit(model, params, (x, y), opt, loss, epochs=1, batch_size=4, checkpoint_every=1)
    with pytest.raises(ValueError, match="val_data"):
        fit(model, params, (x, y), opt, loss, epochs=1, batch_size=4, metrics={"acc": accuracy})
    with pytest.raises(TypeError, match="pair"):
        fit(model, params, x, opt, loss, epochs=1, batch_size=4)
    if geoarray._backend.backend_name(xp) not in ("torch", "jax"):
        with pytest.raises(ValueError, match="autodiff"):
            fit(model, params, (x, y), opt, loss, epochs=1, batch_size=4, grad="autodiff")


def test_cli_train_resume(backend, tmp_path, capsys):
    """``geoarray train vit --out DIR --resume``: 1 epoch, then resumed to 2, has the uninterrupted 2-epoch
    history bit for bit; --resume without --out, or with another --seed, is one line and exit code 2."""
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    if backend.name != "numpy":
        pytest.skip("the CLI's flag handling is host code; fit's resume is checked on every backend above")
    from geoarray.cli import main

    small = ["train", "vit", "--limit", "64", "--n-layers", "1", "--batch-size", "32", "--no-progress"]
    strip = lambda d: [{k: v for k, v in h.items() if k != "seconds"} for h in d["history"]]  # noqa: E731
    assert main([*small, "--epochs", "2", "--out", str(tmp_path / "a")]) == 0
    assert main([*small, "--epochs", "1", "--out", str(tmp_path / "b"), "--checkpoint-every", "1"]) == 0
    assert [s for s, _ in list_checkpoints(tmp_path / "b" / "checkpoints")] == [1, 2]
    assert main([*small, "--epochs", "2", "--out", str(tmp_path / "b"), "--resume"]) == 0
    capsys.readouterr()
    # fit's own refusal (another sample count than the checkpoints') is one line and exit code 2 too
    other = [a if a != "64" else "96" for a in small]
    assert main([*other, "--epochs", "3", "--out", str(tmp_path / "b"), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("geoarray train vit: error:") and "Traceback" not in err[0], err
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in "ab")
    assert strip(a) == strip(b) and len(a["history"]) == 2
    capsys.readouterr()
    assert main([*small, "--epochs", "2", "--resume"]) == 2
    assert main([*small, "--epochs", "3", "--out", str(tmp_path / "b"), "--resume", "--seed", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "--resume needs --out" in err[0] and "--seed 0" in err[1]
    # without --resume the run starts over: the old checkpoints are replaced
    assert main([*small, "--epochs", "1", "--out", str(tmp_path / "b")]) == 0
    assert [s for s, _ in list_checkpoints(tmp_path / "b" / "checkpoints")] == [2]


def test_checkpoints_of_a_partition_optimizer_resume_bit_identically(xp, device, tmp_path):
    """A ``partition`` (manifold Muon + Adam) run with checkpoints resumes bit-identically (its state, like
    every optimizer state, saves and loads)."""
    model = _model()
    params = model.init(0, xp=xp, device=device)
    labels = optree.tree_map(lambda a: "muon" if a.ndim >= 2 else "adam", params)

    def run(**kw):
        opt = optim.partition({"muon": optim.ManifoldMuon(lr=1e-2), "adam": optim.Adam(lr=1e-2)}, labels)
        kw = {"epochs": 2, "batch_size": 8, "progress": False, "jit": False, **kw}
        return fit(model, params, _problem(xp, device), opt, nn.ClassificationL2Loss(), **kw)

    cut = run(checkpoint_path=tmp_path / "ck", checkpoint_every=2)
    assert cut.steps == 6
    ref = run()
    half = run(checkpoint_path=tmp_path / "h", checkpoint_every=2, callback=_stop_at(3))
    assert half.interrupted
    resumed = run(checkpoint_path=tmp_path / "h", checkpoint_every=2, resume=True)
    _assert_same_run(resumed, ref)
