"""``geoarray gauge {table,check,fix}`` (src/geoarray/commands/gauge.py).

The commands run on the backend of the session (``--backend``); the parser is registered on a fresh
argparse tree exactly as ``geoarray.cli`` does (``add_parser(subparsers)``). Properties:

* building the parser imports no torch/jax/matplotlib/sklearn (checked in a fresh interpreter);
* ``table`` prints the paper's Table 1 next to eq. 17 and the exact counts of ``redundancy``;
* ``check --config`` reports output differences ≤ 1e-10 relative and redundancy_numerical =
  redundancy; ``check --checkpoint`` works on a file the test writes;
* ``fix`` writes a gauge-fixed file whose model reproduces the checkpoint's outputs (float64 file:
  1e-12) and stores exactly ``redundancy`` fewer parameters;
* errors (unknown config, missing file, missing subcommand) are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from _helpers import to_numpy
from geoarray.commands import gauge as gauge_cmd
from geoarray.gauge import load_fixed, paper_redundancy, redundancy
from geoarray.models import TransformerLM, save_checkpoint

CLI_BACKENDS = {"numpy": "numpy", "array-api-strict": "array-api-strict", "torch": "torch", "jax": "jax"}


@pytest.fixture
def cli_backend(backend):
    if backend.name not in CLI_BACKENDS:
        pytest.skip(f"the CLI runs on CPU backends only ({', '.join(CLI_BACKENDS)}), not {backend.name}")
    return CLI_BACKENDS[backend.name]


def run(argv):
    parser = argparse.ArgumentParser(prog="geoarray")
    gauge_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_parser_imports_nothing_heavy():
    code = (
        "import argparse, sys\n"
        "from geoarray.commands import gauge\n"
        "p = argparse.ArgumentParser(); gauge.add_parser(p.add_subparsers())\n"
        "print(sorted(m for m in ('torch', 'jax', 'matplotlib', 'sklearn', 'safetensors') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_table(capsys):
    assert run(["gauge", "table"]) == 0
    text = capsys.readouterr().out
    assert "1473409" in text  # Table 1 as printed
    for name in ("gpt2", "gpt2-xl", "llama-65b"):
        assert f"{redundancy(name).total:,}" in text
    assert f"{paper_redundancy(80, 64, 128, 8192):,}" in text
    assert run(["gauge", "table", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["config"] for r in rows][:3] == ["gpt2", "gpt2-xl", "llama-65b"]
    assert all(r["exact"] == redundancy(r["config"]).total for r in rows)


def test_check_config(cli_backend, capsys, tmp_path):
    out_file = tmp_path / "report.json"
    argv = ["gauge", "check", "--config", "llama-tiny", "--backend", cli_backend, "--out", str(out_file)]
    # the Jacobian referee inside check is covered by test_gauge.py::test_check_report
    assert run([*argv, "--numerical", "no"]) == 0
    report = json.loads(out_file.read_text())
    assert report["max_rel_output_diff"] <= 1e-10
    assert report["redundancy"] == redundancy(gauge_cmd.TINY["llama-tiny"]).total
    assert report["redundancy_numerical"] is None
    assert "max_abs_output_diff" in capsys.readouterr().out


def test_check_and_fix_checkpoint(cli_backend, xp, device, capsys, tmp_path):
    cfg = dict(arch="bert", n_layers=2, n_heads=2, d_head=2, d_model=5, d_ff=4, vocab=8, n_ctx=4, norm_eps=1e-5)
    model = TransformerLM(cfg)
    params = model.init(0, xp=xp, device=device)
    path = tmp_path / "bert.safetensors"
    save_checkpoint(path, model, params, dtype="float64")
    argv = ["gauge", "check", "--checkpoint", str(path), "--backend", cli_backend, "--json", "--numerical", "no"]
    assert run(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_rel_output_diff"] <= 1e-10 and report["source"] == str(path)
    out = tmp_path / "fixed.safetensors"
    argv = ["gauge", "fix", "--checkpoint", str(path), "--out", str(out), "--dtype", "float64", "--json"]
    assert run([*argv, "--backend", cli_backend]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["saving"] == redundancy(cfg).total == summary["n_params"] - summary["n_params_fixed"]
    fixed, reduced = load_fixed(out, xp=xp, device=device)
    tok = xp.asarray(np.arange(12).reshape(3, 4) % 8, dtype=xp.int64, device=device)
    a, b = to_numpy(fixed.apply(reduced, tok)), to_numpy(model.apply(params, tok))
    assert np.abs(a - b).max() <= 1e-12 * np.abs(b).max()
    # both files get a new file's permissions (safetensors' own writer makes them 0600 whatever the umask)
    umask = os.umask(0)
    os.umask(umask)
    assert {stat.S_IMODE(p.stat().st_mode) for p in (path, out)} == {0o666 & ~umask}
    # a gauge-fixed file given to `check` is named as what it is, in one line (before: "missing 'wte.weight'")
    capsys.readouterr()
    assert run(["gauge", "check", "--checkpoint", str(out), "--backend", cli_backend]) == 2
    err = capsys.readouterr().err
    assert "is a gauge-fixed model" in err and "geoarray.gauge.load_fixed" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["gauge", "check", "--config", "gpt5"], "--config must be a name"),
        (["gauge", "check", "--config", "{not json"], "not valid JSON"),
        (["gauge", "check", "--config", '{"arch": "gpt2"}'], "missing the keys"),
        (["gauge", "check", "--config", "gpt2-xl"], "too many"),
        (["gauge", "check", "--checkpoint", "/nonexistent/model.safetensors"], "does not exist"),
        (["gauge", "fix", "--checkpoint", "/nonexistent/model.safetensors", "--out", "x"], "does not exist"),
        (["gauge"], "choose one of"),
    ],
)
def test_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
