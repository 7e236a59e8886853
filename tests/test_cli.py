"""The ``geoarray`` command line: help, one-line errors with exit code 2, smoke runs of ``train vit`` and ``demo``.

Behaviours checked:

* ``--help`` of every command exits 0 and prints its usage; ``python -m geoarray --help`` works;
* building the parser imports no torch, jax, matplotlib or scikit-learn;
* a wrong option, an unknown backend, a bad number, ``--data mnist`` without ``--data-dir`` or with
  a directory lacking the files print exactly one line on stderr (no traceback) and exit 2;
* ``train vit`` for 2 epochs on a 64-image subset of digits, on the backend of the session, writes
  metrics.json (2 epochs, finite losses, accuracy in [0, 1]) and loss.png; on MNIST IDX files the
  test writes it trains as well; ``demo`` (NumPy) prints the table and writes its plot.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from geoarray.cli import build_parser, main

_CLI_BACKENDS = {"numpy": "numpy", "array-api-strict": "array-api-strict", "torch": "torch", "jax": "jax"}
_SMALL = ["--epochs", "2", "--limit", "64", "--n-layers", "1", "--batch-size", "32", "--no-progress"]


def _sub_commands() -> list[list[str]]:
    cmds = [[], ["demo"], ["train"]]
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    cmds += [["train", name] for name in train._subparsers._group_actions[0].choices]
    return cmds


@pytest.mark.parametrize("cmd", _sub_commands(), ids=lambda c: " ".join(c) or "geoarray")
def test_help_exits_zero(cmd, capsys):
    assert main([*cmd, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: geoarray")


def test_python_dash_m_and_light_parser():
    code = (
        "import sys; from geoarray.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'jax', 'matplotlib', 'sklearn') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]"
    done = subprocess.run([sys.executable, "-m", "geoarray", "--help"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "demo" in done.stdout and "train" in done.stdout


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--bogus"], "unrecognized arguments"),
        (["train", "vit", "--backend", "fortran"], "invalid choice"),
        (["train", "vit", "--epochs", "zero"], "positive integer"),
        (["train", "vit", "--epochs", "0"], "positive integer"),
        (["demo", "--lr", "-1"], "positive number"),
        (["train", "nonsense"], "invalid choice"),
        (["train"], "choose one of"),
        (["train", "vit", "--data", "mnist"], "--data-dir"),
        (["train", "vit", "--n-heads", "3"], "must divide"),
        (["train", "vit", "--attention-add", "maybe"], "invalid choice"),
        (["demo", "--attention-add", "false"], "invalid choice"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err, err


def test_missing_mnist_files_are_one_line(tmp_path, capsys):
    assert main(["train", "vit", "--data", "mnist", "--data-dir", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train-images-idx3-ubyte" in err and str(tmp_path) in err


def _check_run(out_dir, epochs=2):
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, epochs + 1))
    assert all(math.isfinite(h["train_loss"]) and 0.0 <= h["test_accuracy"] <= 1.0 for h in metrics["history"])
    assert (out_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("command", [["train", "vit"], ["demo"]])
def test_attention_add_option_reaches_the_model(command):
    """--attention-add on|off sets ClassificationTransformer(add_connection=...); the default is the model's."""
    import inspect

    from geoarray.commands import vit
    from geoarray.models import ClassificationTransformer

    default = inspect.signature(ClassificationTransformer).parameters["add_connection"].default
    parser = build_parser()
    for argv, expected in (([], default), (["--attention-add", "on"], True), (["--attention-add", "off"], False)):
        args = parser.parse_args([*command, *argv])
        assert vit._model(args, 4, 4, stiefel=True).add_connection is expected, argv


@pytest.mark.parametrize("attention_add", ["on", "off"])
def test_train_vit_smoke(backend, tmp_path, capsys, attention_add):
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    if backend.name not in _CLI_BACKENDS:
        pytest.skip(f"the CLI runs on CPU backends {sorted(_CLI_BACKENDS)}; {backend.name} has no --backend value")
    argv = ["train", "vit", "--backend", _CLI_BACKENDS[backend.name], "--out", str(tmp_path), *_SMALL]
    assert main([*argv, "--attention-add", attention_add]) == 0
    out = capsys.readouterr().out
    assert "Stiefel + adam" in out and str(tmp_path / "loss.png") in out
    _check_run(tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text())["config"]["attention_add"] == attention_add


def _idx(a: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes()


def test_train_vit_on_mnist_files(backend, tmp_path, capsys):
    if backend.name != "numpy":
        pytest.skip("reading MNIST is host code shared by all backends; train vit itself is smoke-run per backend")
    rng = np.random.default_rng(0)
    data = tmp_path / "mnist"
    data.mkdir()
    for prefix, n in (("train", 40), ("t10k", 20)):
        (data / f"{prefix}-images-idx3-ubyte").write_bytes(_idx(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)))
        (data / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(rng.integers(0, 10, n).astype(np.uint8)))
    out = tmp_path / "out"
    argv = ["train", "vit", "--data", "mnist", "--data-dir", str(data), "--out", str(out), *_SMALL]
    assert main(argv) == 0
    _check_run(out)
    assert json.loads((out / "metrics.json").read_text())["config"]["data"] == "mnist"


def test_demo_smoke(backend, tmp_path, capsys):
    pytest.importorskip("sklearn", reason="digits come from scikit-learn (the demo extra)")
    if backend.name != "numpy":
        pytest.skip("demo runs on its default NumPy backend here; train vit is smoke-run on every backend")
    argv = ["demo", "--epochs", "1", "--limit", "64", "--n-layers", "1", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Stiefel Q/K/V + manifold Adam" in out and "unconstrained Q/K/V + Adam" in out
    assert str(tmp_path / "demo_loss.png") in out
    runs = json.loads((tmp_path / "demo.json").read_text())["runs"]
    assert runs[0]["max_orthonormality_error"] < 1e-12 < runs[1]["max_orthonormality_error"]
