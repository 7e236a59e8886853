"""The command line's ``--resume`` and ``--out`` as a user meets them (issue #55, item 5).

Each case is one line on stderr naming the flag or the mismatch, exit code 2, no traceback and no warning
with a source line, and it comes before any training: a ``--resume`` whose checkpoints are all damaged;
``--resume`` with another model flag (``--n-layers``, ``--unconstrained``, ``--limit``, ...: the flag and
both values, not "damaged" and two tree dumps), or with another command (a ViT run resumed by
``train vpt``); ``--resume`` with an ``--out`` that does not exist (not a fresh run); an ``--out`` that is
a file (``demo`` and ``train``). A newer damaged checkpoint that ``--resume`` skips is one warning line;
``--resume`` of a run that has trained ``--epochs`` already is one note line, and so is ``--resume`` with
another ``--backend`` (the run continues there). ``gauge fix`` writes its
output with the umask's permissions; the gauge commands' messages do not start with the exception's
class, check ``--out`` before any work, and ask a checkpoint without configuration for its config.json
(not for the library's ``config=``). Library side: ``fit(resume=True)`` with another model says so in one line
(not "damaged", no warning), and ``fit(checkpoint_meta=...)`` is stored in every checkpoint.

The CLI is host code and takes its own ``--backend``: these run in the NumPy session (the library tests
on every backend). A run that must not train has ``geoarray.train.fit`` replaced by a sentinel.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import stat
import warnings

import _small_fit
import numpy as np
import pytest

from geoarray.cli import main
from geoarray.train import fit, list_checkpoints, load_checkpoint

SMALL = ["--limit", "64", "--n-layers", "1", "--batch-size", "32", "--no-progress", "--epochs", "1"]
VIT = ["train", "vit", *SMALL]


class Trained(Exception):
    """fit was called: the command got past its checks into the training."""


def _no_fit(*args, **kwargs):
    raise Trained


def _numpy_session(backend) -> None:
    if backend.name != "numpy":
        pytest.skip("the CLI takes its own --backend; its --out/--resume handling runs in the numpy session")
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")


@pytest.fixture
def cli(backend, monkeypatch):
    _numpy_session(backend)
    return monkeypatch


@pytest.fixture(scope="module")
def vit_run(backend, tmp_path_factory):
    """OUT of a one-epoch ``train vit`` with a checkpoint after each of its 2 steps (made once; each test
    works on a copy)."""
    _numpy_session(backend)  # a module fixture is made before the test's function fixtures
    out = tmp_path_factory.mktemp("vit") / "run"
    assert main([*VIT, "--out", str(out), "--checkpoint-every", "1"]) == 0
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [1, 2]
    return out


@pytest.fixture
def run_dir(cli, vit_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(vit_run, out)
    return out


def _one_line(capsys, code, expected_code=2) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == expected_code and len(lines) == 1, (code, err)
    assert "Traceback" not in err and "Warning" not in err and ".py:" not in err, err
    return lines[0]


def _damage(ckpt) -> None:
    path = os.path.join(ckpt, "params.npz")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as fh:
        fh.write(data)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--n-layers", "2"], "used --n-layers 1, not --n-layers 2; give --n-layers 1 to continue it"),
        (["--unconstrained"], "used no --unconstrained, not --unconstrained; drop --unconstrained to continue it"),
        (["--limit", "96"], "used --limit 64, not --limit 96; give --limit 64 to continue it"),
        (["--optimizer", "momentum"], "used --optimizer adam, not --optimizer momentum; give --optimizer adam"),
        (["--batch-size", "16"], "used --batch-size 32, not 16; give --batch-size 32 to continue it"),
    ],
    ids=["n-layers", "unconstrained", "limit", "optimizer", "batch-size"],
)
def test_resume_with_another_flag_names_it(run_dir, cli, capsys, change, message):
    cli.setattr("geoarray.train.fit", _no_fit)
    argv = [*VIT, *change, "--out", str(run_dir), "--resume", "--epochs", "2"]
    line = _one_line(capsys, main(argv))
    assert line.startswith("geoarray train vit: error: --resume: the run in ") and message in line, line
    assert "damaged" not in line and "PyTreeSpec" not in line


def test_resume_of_a_vit_run_by_train_vpt_names_the_model_kind(run_dir, cli, capsys):
    cli.setattr("geoarray.train.fit", _no_fit)
    line = _one_line(capsys, main(["train", "vpt", "--out", str(run_dir), "--resume", "--no-progress"]))
    assert line.startswith("geoarray train vpt: error: --resume:"), line
    assert "checkpoints of a `geoarray train vit` run, not of `geoarray train vpt`" in line
    assert "--batch-size" not in line


def test_resume_into_a_missing_out_is_an_error_not_a_fresh_run(cli, tmp_path, capsys):
    cli.setattr("geoarray.train.fit", _no_fit)
    missing = tmp_path / "typo"
    for argv in ([*VIT], ["train", "lst", "--no-progress"]):
        line = _one_line(capsys, main([*argv, "--out", str(missing), "--resume"]))
        assert f"--resume: --out {str(missing)!r} does not exist" in line and "drop --resume" in line, line
        assert not missing.exists()


def test_resume_into_an_out_without_checkpoints_says_it_starts_afresh(cli, tmp_path, capsys):
    cli.setattr("geoarray.train.fit", _no_fit)
    with pytest.raises(Trained):
        main([*VIT, "--out", str(tmp_path), "--resume"])
    err = capsys.readouterr().err
    assert err.strip() == (
        f"geoarray train vit: note: --resume: no checkpoint in {str(tmp_path / 'checkpoints')!r} yet; "
        "the run starts at epoch 1"
    )


def test_resume_with_every_checkpoint_damaged_is_one_error_before_training(run_dir, cli, capsys):
    cli.setattr("geoarray.train.fit", _no_fit)
    for _, ckpt in list_checkpoints(run_dir / "checkpoints"):
        _damage(ckpt)
    line = _one_line(capsys, main([*VIT, "--out", str(run_dir), "--resume", "--epochs", "2"]))
    assert f"--resume: no checkpoint in {str(run_dir / 'checkpoints')!r} is intact (2 damaged" in line, line
    assert "ckpt-000000002' is damaged: params.npz does not match its manifest" in line
    assert line.endswith("drop --resume to start the run over")


def test_resume_past_a_damaged_checkpoint_warns_in_one_line(run_dir, cli, capsys):
    _damage(list_checkpoints(run_dir / "checkpoints")[-1][1])
    with warnings.catch_warnings():
        # as outside pytest, whose configuration turns geoarray's RuntimeWarnings into errors
        warnings.simplefilter("default")
        code = main([*VIT, "--out", str(run_dir), "--resume", "--epochs", "2"])
    line = _one_line(capsys, code, expected_code=0)
    assert line.startswith("geoarray train vit: warning: skipping a damaged checkpoint: checkpoint "), line
    assert "ckpt-000000002' is damaged" in line and "RuntimeWarning" not in line
    assert [h["epoch"] for h in json.loads((run_dir / "metrics.json").read_text())["history"]] == [1, 2]


def test_resume_of_a_run_with_no_epochs_left_says_so(run_dir, cli, capsys):
    cli.setattr("geoarray.train.fit", _no_fit)
    with pytest.raises(Trained):  # the command goes on (it reports the run), with one note
        main([*VIT, "--out", str(run_dir), "--resume"])  # --epochs 1: the run has trained 1
    assert capsys.readouterr().err.strip() == (
        f"geoarray train vit: note: --resume: the run in {str(run_dir / 'checkpoints')!r} has trained 1 epoch, "
        "so --epochs 1 trains none (give --epochs above 1 to continue it)"
    )
    with pytest.raises(Trained):
        main([*VIT, "--out", str(run_dir), "--resume", "--epochs", "2"])
    assert capsys.readouterr().err == ""


def test_resume_on_another_backend_continues_with_a_note(run_dir, cli, capsys):
    cli.setattr("geoarray.train.fit", _no_fit)
    with pytest.raises(Trained):  # not refused: the run's state converts to the other backend
        main([*VIT, "--out", str(run_dir), "--resume", "--epochs", "2", "--backend", "array-api-strict"])
    assert capsys.readouterr().err.strip() == (
        f"geoarray train vit: note: --resume: the run in {str(run_dir / 'checkpoints')!r} was trained with "
        "--backend numpy; it continues with --backend array-api-strict (its numbers agree with numpy's to "
        "rounding, not bit for bit)"
    )
    with pytest.raises(Trained):  # the same backend: no note
        main([*VIT, "--out", str(run_dir), "--resume", "--epochs", "2", "--backend", "numpy"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--epochs", "1", "--limit", "64", "--n-layers", "1", "--no-progress"],
        [*VIT],
        ["train", "sympnet", "--no-progress"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_out_that_is_a_file_is_refused_before_training(cli, tmp_path, capsys, argv):
    cli.setattr("geoarray.train.fit", _no_fit)
    path = tmp_path / "a-file"
    path.write_text("mine\n")
    line = _one_line(capsys, main([*argv, "--out", str(path)]))
    assert f"error: --out {str(path)!r} is a file; give a directory" in line, line
    assert path.read_text() == "mine\n"


def test_train_checkpoints_record_the_command_and_its_flags(vit_run, cli):
    meta = json.loads((vit_run / "checkpoints" / "ckpt-000000002" / "meta.json").read_text())
    record = meta["checkpoint_meta"]
    assert record["command"] == "train vit"
    assert record["flags"]["--n-layers"] == 1 and record["flags"]["--limit"] == 64
    assert record["flags"]["--patch-size"] == 4 and record["flags"]["--unconstrained"] is False
    assert record["backend"] == "numpy"


# -- gauge -------------------------------------------------------------------------------------------


@pytest.fixture
def bert_checkpoint(cli, tmp_path):
    pytest.importorskip("safetensors", reason="the gauge extra")
    from geoarray.models import TransformerLM, save_checkpoint

    cfg = dict(arch="bert", n_layers=1, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4, norm_eps=1e-5)
    model = TransformerLM(cfg)
    path = tmp_path / "bert.safetensors"
    save_checkpoint(path, model, model.init(0, xp=np), dtype="float64")
    return path


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_gauge_fix_writes_with_the_umask_permissions(bert_checkpoint, tmp_path, capsys, umask):
    out = tmp_path / "fixed.safetensors"
    previous = os.umask(umask)
    try:
        assert main(["gauge", "fix", "--checkpoint", str(bert_checkpoint), "--out", str(out), "--json"]) == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize("command", ["check", "fix"])
def test_gauge_messages_do_not_start_with_the_exception_class(cli, tmp_path, capsys, command):
    bad = tmp_path / "bad.safetensors"
    bad.write_text("not a safetensors file\n")
    argv = ["gauge", command, "--checkpoint", str(bad)] + (["--out", str(tmp_path / "o")] if command == "fix" else [])
    line = _one_line(capsys, main(argv))
    assert line.startswith(f"geoarray gauge {command}: error: checkpoint {str(bad)!r} is damaged"), line
    assert "Error:" not in line.split("(")[0]


@pytest.mark.parametrize(
    ("command", "out", "message"),
    [
        ("fix", "dir", "is a directory; give the path of the gauge-fixed safetensors file to write"),
        ("fix", "file/x.safetensors", "is a file, not a directory"),
        ("check", "dir", "is a directory; give the path of the JSON report to write"),
        ("check", "file/report.json", "is a file, not a directory"),
        ("check", "missing/report.json", "does not exist"),
    ],
)
def test_gauge_out_is_checked_before_any_work(bert_checkpoint, cli, tmp_path, capsys, command, out, message):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("mine\n")
    cli.setattr(importlib.import_module("geoarray.gauge.check"), "check", _no_fit)
    cli.setattr(importlib.import_module("geoarray.models.language"), "load_checkpoint", _no_fit)
    argv = ["gauge", command, "--checkpoint", str(bert_checkpoint), "--out", str(tmp_path / out)]
    line = _one_line(capsys, main(argv))
    assert line.startswith(f"geoarray gauge {command}: error: --out ") and line.endswith(message), line
    assert (tmp_path / "file").read_text() == "mine\n" and list((tmp_path / "dir").iterdir()) == []


@pytest.mark.parametrize("command", ["check", "fix"])
def test_gauge_checkpoint_without_configuration_asks_for_its_config_json(
    bert_checkpoint, cli, tmp_path, capsys, command
):
    from safetensors.numpy import load_file, save_file

    bare = tmp_path / "bare.safetensors"  # the tensors of a Hugging Face layout, no geoarray metadata
    save_file(load_file(str(bert_checkpoint)), str(bare))
    argv = ["gauge", command, "--checkpoint", str(bare)] + (["--out", str(tmp_path / "o")] if command == "fix" else [])
    line = _one_line(capsys, main(argv))
    assert f"checkpoint {str(bare)!r} carries no configuration" in line, line
    assert "put the model's Hugging Face config.json beside it (layout looks like bert)" in line, line
    assert "config=" not in line


# -- the library under the command line (every backend) -----------------------------------------------


def test_fit_resume_with_another_model_is_one_line_not_damage(xp, device, tmp_path):
    from geoarray import nn, optim
    from geoarray.models import ClassificationTransformer

    _small_fit.run(xp, device, epochs=1, checkpoint_path=tmp_path)
    D, T, C = _small_fit.D, _small_fit.T, _small_fit.C
    deeper = ClassificationTransformer(D, T, C, n_heads=2, n_layers=2)
    params = deeper.init(0, xp=xp, dtype="float64", device=device)
    data, loss = _small_fit.problem(xp, device), nn.ClassificationL2Loss()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError) as info:
            fit(deeper, params, data, optim.Adam(0.05), loss, epochs=2, batch_size=8, checkpoint_path=tmp_path,
                resume=True, progress=False, jit=False)  # fmt: skip
    message = str(info.value)
    assert "is intact but holds the parameters of another model than like_params" in message, message
    assert "\n" not in message and "damaged" not in message and "PyTreeSpec" not in message
    assert [str(w.message) for w in caught] == []
    # the same from load_checkpoint, with or without fallback (an older checkpoint has the same layout)
    like = {"like_params": params, "like_state": optim.Adam(0.05).init(params, deeper.manifolds())}
    for fallback in (False, True):
        with pytest.raises(ValueError, match="another model than like_params"):
            load_checkpoint(tmp_path, fallback=fallback, **like)


def test_fit_stores_checkpoint_meta_and_checks_its_type_first(xp, device, tmp_path):
    record = {"command": "mine", "flags": {"--depth": 2, "--wide": False, "--note": None}}
    _small_fit.run(xp, device, epochs=1, checkpoint_path=tmp_path / "a", checkpoint_meta=record)
    _, _, meta = load_checkpoint(tmp_path / "a", **_small_fit.like(xp, device))
    assert meta["checkpoint_meta"] == record
    with pytest.raises(TypeError, match="checkpoint_meta must hold JSON values"):
        _small_fit.run(xp, device, epochs=1, checkpoint_path=tmp_path / "b", checkpoint_meta={"x": object()})
    with pytest.raises(TypeError, match="checkpoint_meta must be a dict with str keys"):
        _small_fit.run(xp, device, epochs=1, checkpoint_path=tmp_path / "c", checkpoint_meta={1: 2})
    with pytest.raises(ValueError, match=r"checkpoint_meta=.* needs checkpoint_path"):
        _small_fit.run(xp, device, epochs=1, checkpoint_meta=record)
    assert not (tmp_path / "b").exists()  # refused before the checkpoint directory was made
