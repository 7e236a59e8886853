"""Fuzzing the command line's arguments (issue #29, item 6).

Hypothesis (derandomized) builds argv for ``geoarray.cli.main``: a command (``demo``, ``train vit|vpt|lst|
sympnet``, ``gauge table|check|fix``, a missing or unknown one), then up to five options drawn from every
option of every command (valid or not for that command) with values drawn from numbers (0, −1, NaN,
inf, 10²⁰), words, empty strings, JSON, backend names, existing and impossible paths, and random
printable tokens inserted anywhere. The training and the gauge check themselves are replaced by a
sentinel (``train.fit`` and ``gauge.check.check`` raise it), so a case costs milliseconds; everything
before them — parsing, option checks, data loading, model building — runs for real.

Every outcome must be: the sentinel reached (the options were accepted), exit code 0 with output (help,
version, ``gauge table``), or exit code 2 (1 for a file-system error, as documented in ``geoarray.cli``)
with exactly one line on stderr naming the error — never a traceback, never another exit code.
The CLI does not depend on the session's backend (it takes ``--backend``): it runs in the NumPy session
only. Cases: ``CASES``.
"""

from __future__ import annotations

import importlib

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from _fuzz import SETTINGS
from geoarray import cli

CASES = {"argv": 300}

COMMANDS = [["demo"], ["train", "vit"], ["train", "vpt"], ["train", "lst"], ["train", "sympnet"], ["gauge", "table"],
            ["gauge", "check"], ["gauge", "fix"], ["train"], ["gauge"], [], ["bogus"]]  # fmt: skip
FLAGS = ["--no-progress", "--resume", "--unconstrained", "--json", "--help", "--version"]
OPTIONS = ["--epochs", "--seed", "--lr", "--batch-size", "--n-traj", "--n-steps", "--rollout", "--seq-len",
           "--n-heads", "--n-layers", "--patch-size", "--limit", "--backend", "--out", "--checkpoint-every",
           "--checkpoint-every-seconds", "--data", "--data-dir", "--optimizer", "--config", "--checkpoint",
           "--numerical", "--dtype", "--system", "--attention-add", "--bogus"]  # fmt: skip
VALUES = ["1", "2", "0", "-1", "abc", "", "nan", "inf", "1e-3", "99999999999999999999", "numpy", "torch",
          "array-api-strict", "cupy", "{}", '{"arch": "gpt2"}', '{"model_type": "gpt2", "n_embd": 4, "n_head": 0}',
          "gpt2-tiny", "digits", "mnist", "adam", "muon", "on", "pendulum", "float32", "yes", "--epochs",
          "/nonexistent/dir", "{tmp}", "{tmp}/file.txt", "{tmp}/out"]  # fmt: skip


class Reached(Exception):
    """The command got past its argument checks to the training or the gauge check."""


def _stop(*args, **kwargs):
    raise Reached


@pytest.fixture
def stopped(monkeypatch, backend, tmp_path_factory):
    if backend.name != "numpy":
        pytest.skip("the CLI takes its own --backend; its arguments are fuzzed once, in the numpy session")
    # the --out checks create their folder before the sentinel stops the run: relative paths ("gpt2-tiny",
    # demo's default "geoarray-demo") land in a folder of the test's own, not in the clone
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    # geoarray.gauge.check is also the name of the function the package exports: take the module
    monkeypatch.setattr(importlib.import_module("geoarray.gauge.check"), "check", _stop)
    monkeypatch.setattr(importlib.import_module("geoarray.train"), "fit", _stop)


@settings(max_examples=CASES["argv"], **SETTINGS)
@given(data=st.data())
def test_cli_arguments(stopped, tmp_path, capsys, data):
    (tmp_path / "file.txt").write_text("not a checkpoint\n")
    argv = list(data.draw(st.sampled_from(COMMANDS), label="command"))
    for _ in range(data.draw(st.integers(0, 5), label="n options")):
        if data.draw(st.integers(0, 3), label="kind") == 0:
            argv.append(data.draw(st.sampled_from(FLAGS), label="flag"))
        else:
            value = data.draw(st.sampled_from(VALUES), label="value").replace("{tmp}", str(tmp_path))
            argv += [data.draw(st.sampled_from(OPTIONS), label="option"), value]
    if data.draw(st.integers(0, 4), label="insert") == 0:
        token = data.draw(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8), label="token")
        argv.insert(data.draw(st.integers(0, len(argv)), label="at"), token)
    capsys.readouterr()
    try:
        code = cli.main(argv)
    except Reached:
        event("accepted (reached the training or the check)")
        return
    out, err = capsys.readouterr()
    event(f"exit {code}")
    assert "Traceback" not in out + err, (argv, err)
    if code == 0:
        assert out.strip(), (argv, "exit 0 printed nothing")
        return
    assert code in (1, 2), (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], (argv, err)


# -- defects the target above found (regressions) ----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # before: integrated 4·10²¹ states (hung until killed)
        (["train", "vpt", "--n-traj", "99999999999999999999"], "states exceed the 10,000,000"),
        (["train", "sympnet", "--rollout", "99999999999"], "--rollout 99999999999 exceeds"),
        # before: checked only after the training trajectories had been integrated
        (["train", "lst", "--seq-len", "30", "--n-steps", "5"], "--n-steps must be at least 59"),
        # before: built 10⁸ transformer blocks (gigabytes) before the first step
        (["train", "vit", "--n-layers", "100000000"], "--n-layers 100000000 is more than the 1024"),
        # before: "KeyError: 'n_embd'" and a ZeroDivisionError traceback for n_head 0
        (["gauge", "check", "--config", '{"model_type": "gpt2"}'], "Hugging Face config needs 'n_embd'"),
        (
            [
                "gauge",
                "check",
                "--config",
                '{"model_type": "gpt2", "n_embd": 4, "n_head": 0, "n_layer": 1, "vocab_size": 8}',
            ],
            "n_head must be a positive int",
        ),
    ],
)
def test_absurd_sizes_and_configs_are_one_line_errors(stopped, capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_line_break_inside_an_argument_stays_escaped_in_the_one_line_error(stopped, capsys):
    # before: argparse echoed the '\r' of an unrecognized argument, splitting the error over two lines
    for argv in (["train", "vit", "\r"], ["gauge", "check", "--config", "a\nb"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and ("\\r" in err or "\\n" in err), err
