"""Smoke tests of the benchmark scripts in benchmarks/: they run and their ``--json`` output is complete.

Each script's ``main([...])`` runs in-process with tiny options (2 timed steps, 1 transformer block,
batch 8, the ``tiny`` weight set, 5 drift steps) on the backend of the session only, and the JSON it
writes must hold the expected keys with positive, finite medians and ratios. No time is asserted: speed
is what the scripts print, not what the tests check. The benchmarks run on the CPU, so the CUDA
sessions and the backends without a table in the scripts (array-api-strict, cupy) are skipped with
the reason.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from _examples import BENCHMARKS as BENCH_DIR
from _examples import load_benchmark

TABLES = ("numpy", "torch", "jax")  # the backends the two scripts print a table for


@pytest.fixture
def bench_backend(backend) -> str:
    """The benchmark's backend name for this session, or a skip saying why there is none."""
    if backend.name not in TABLES:
        if backend.name.endswith("-cuda") or backend.name == "cupy":
            pytest.skip(f"benchmarks/ time the CPU backends only (numpy, torch, jax); {backend.name} is a GPU session")
        pytest.skip(f"benchmarks/ print no table for {backend.name}: their backends are numpy, torch and jax")
    if backend.name == "jax":
        pytest.importorskip("optax", reason="the JAX baseline is optax.adam")
    return backend.name


def _positive_finite(value, what: str) -> None:
    assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, f"{what} = {value!r}"


def test_training_step_json(bench_backend, tmp_path, capsys):
    pytest.importorskip("sklearn", reason="training_step.py's default ViT trains on scikit-learn's digits (demo extra)")
    path = tmp_path / "training_step.json"
    argv = ["--backends", bench_backend, "--n-layers", "1", "--batch-size", "8", "--steps", "2", "--warmup", "1"]
    if bench_backend == "jax":
        argv.append("--no-peers")  # one jax.jit compile less; the compiles dominate this session's time
    load_benchmark("training_step").main([*argv, "--threads", "1", "--json", str(path)])
    out = json.loads(path.read_text())
    assert out["benchmark"] == "training_step"
    assert {"cpu", "logical_cores", "threads", "numpy", "torch", "jax"} <= set(out["machine"])
    assert out["config"]["n_layers"] == 1 and out["config"]["model"] == "digits"
    (row,) = out["rows"]
    assert row["backend"] == bench_backend
    expected = {"fwd_bwd", "euclidean", "stiefel"} | ({"geoarray_euclidean"} if bench_backend == "torch" else set())
    assert expected <= set(row["medians_ms"])
    for key, ms in row["medians_ms"].items():
        _positive_finite(ms, f"medians_ms[{key!r}]")
    _positive_finite(row["ratios"]["stiefel_over_euclidean"], "stiefel_over_euclidean")
    assert 0 <= row["stiefel_max_YtY_minus_I"] < 1e-4, "the Stiefel weights left the manifold"
    if bench_backend == "jax":
        assert {"fwd_bwd", "euclidean", "stiefel"} <= set(row["compile_s"])
    printed = capsys.readouterr().out
    assert f"{bench_backend}: full ViT training step" in printed and "Stiefel/Euclid" in printed


def test_training_step_capture_needs_a_cuda_device(backend):
    """``--capture`` (the step in a CUDA graph) on the CPU is a one-line exit, before any timing."""
    if backend.name != "torch":
        pytest.skip(f"--capture is a torch option; this is the {backend.name} session")
    pytest.importorskip("sklearn", reason="training_step.py's default ViT trains on scikit-learn's digits (demo extra)")
    with pytest.raises(SystemExit, match=r"^training_step.py: --capture needs --device cuda \(CUDA graphs\), got"):
        load_benchmark("training_step").main(["--backends", "torch", "--n-layers", "1", "--capture"])


def test_training_step_on_cupy_without_a_gpu_is_a_one_line_exit(backend):
    """``--backends cupy`` (the NumPy step on the GPU) on a machine without CuPy or without a CUDA device exits
    with one line saying which, before any timing."""
    if backend.name != "numpy":
        pytest.skip(f"one session checks this (numpy); this is {backend.name}")
    pytest.importorskip("sklearn", reason="training_step.py's default ViT trains on scikit-learn's digits (demo extra)")
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("this machine has a CUDA device for CuPy: the cupy row runs there")
    except Exception:  # no CuPy, or CuPy without a driver: the script says which
        pass
    with pytest.raises(SystemExit, match=r"^training_step.py: --backends cupy (needs CuPy|found no CUDA device)"):
        load_benchmark("training_step").main(["--backends", "cupy", "--n-layers", "1", "--steps", "2"])


def test_optimizer_step_json(bench_backend, tmp_path, capsys):
    path = tmp_path / "optimizer_step.json"
    argv = ["--backends", bench_backend, "--sets", "tiny", "--steps", "2", "--drift-steps", "5", "--threads", "1"]
    load_benchmark("optimizer_step").main([*argv, "--json", str(path)])
    out = json.loads(path.read_text())
    assert out["benchmark"] == "optimizer_step" and "cpu" in out["machine"]
    rows = [r for r in out["rows"] if "set" in r]
    (row,) = rows
    assert row["set"] == "tiny" and row["backend"] == bench_backend
    for key in ("geoarray_ms", "adam_ms", "ratio"):
        _positive_finite(row[key], key)
    if bench_backend == "jax":
        _positive_finite(row["compile_s"], "compile_s")
    if bench_backend == "torch":
        if "geoopt_ms" in row:
            for key in ("geoopt_ms", "geoopt_over_adam", "geoopt_over_geoarray"):
                _positive_finite(row[key], key)
        else:
            assert row["geoopt"].startswith("geoopt not installed")
        (drift,) = [r for r in out["rows"] if "drift_steps" in r]
        assert drift["drift_steps"] == 5 and 0 <= drift["max_abs_YtY_minus_I"] < 1e-4
    else:
        assert not any("drift_steps" in r for r in out["rows"]), "the drift is measured in the torch table only"
    assert f"{bench_backend}: geoarray Stiefel-Adam step" in capsys.readouterr().out


def test_optimizer_step_without_geoopt(bench_backend, tmp_path, capsys, monkeypatch):
    """Without geoopt the torch table says so in one line and the JSON row carries the same message."""
    if bench_backend != "torch":
        pytest.skip("geoopt is a torch peer: only the torch table compares with it")
    module = load_benchmark("optimizer_step")
    monkeypatch.setattr(module, "_geoopt", lambda: None)
    path = tmp_path / "optimizer_step.json"
    module.main(["--backends", "torch", "--sets", "tiny", "--steps", "2", "--drift-steps", "2", "--threads", "1",
                 "--json", str(path)])  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("geoopt not installed: pip install geoopt to compare") >= 1
    rows = json.loads(path.read_text())["rows"]
    assert rows[0]["geoopt"] == module.GEOOPT_MISSING and "geoopt_ms" not in rows[0]
    assert rows[-1]["geoopt"] == module.GEOOPT_MISSING


def test_muon_direction_accuracy_is_a_true_suboptimality(backend):
    """``muon_direction_accuracy.py``'s Brockett measure: the warm-started direction's relative
    suboptimality against the dual value of the converged problem is ≥ 0 (weak duality: no feasible
    direction beats the dual) and small (< 1e-4 on St(16, 4) with one dual iteration per step)."""
    if backend.name != "numpy":
        pytest.skip(f"muon_direction_accuracy.py runs on NumPy only; this is the {backend.name} session")
    subopt = load_benchmark("muon_direction_accuracy").brockett(16, 4, 1, seeds=1)
    assert 0.0 <= subopt < 1e-4


def test_host_reads_json(bench_backend, tmp_path, capsys, pytestconfig):
    """host_reads.py: both policies timed, torch counts 3 reads with and none without, the two steps agree
    to float32 rounding, and the policy is restored afterwards."""
    if bench_backend == "jax":
        pytest.skip("host_reads.py compares eager steps on torch and NumPy; JAX decides on the device either way")
    import geoarray

    path = tmp_path / "host_reads.json"
    load_benchmark("host_reads").main(
        ["--backends", bench_backend, "--sets", "tiny", "--steps", "2", "--json", str(path)]
    )
    assert geoarray.get_host_reads() == pytestconfig.getoption("--host-reads")
    (row,) = json.loads(path.read_text())["rows"]
    for policy in ("cpu", "never"):
        _positive_finite(row["ms"][policy], f"ms[{policy!r}]")
    _positive_finite(row["ratio_never_over_cpu"], "ratio_never_over_cpu")
    if bench_backend == "torch":
        assert row["host_reads_per_step"] == {"cpu": 3, "never": 0}
        assert row["operations_per_step"]["never"] > row["operations_per_step"]["cpu"] > 0
    assert row["max_abs_difference"] < 1e-5
    assert "never/cpu" in capsys.readouterr().out


def test_step_kernels_json(bench_backend, tmp_path, capsys):
    """step_kernels.py records the step's GEMM/LAPACK calls (the QR among them) and prints step ÷ Σ kernels."""
    if bench_backend != "torch":
        pytest.skip("step_kernels.py records kernels with a torch dispatch mode")
    path = tmp_path / "step_kernels.json"
    load_benchmark("step_kernels").main(["--sets", "tiny", "--steps", "2", "--floor", "--json", str(path)])
    (row,) = json.loads(path.read_text())["rows"]
    assert row["n_kernels"] >= 3 and "geqrf" in {k["name"] for k in row["kernels"]}
    for key in ("step_ms", "kernels_ms", "ratio_step_over_kernels", "floor_ms", "ratio_floor_over_kernels"):
        _positive_finite(row[key], key)
    assert math.isclose(row["ratio_floor_over_kernels"], row["floor_ms"] / row["kernels_ms"], rel_tol=1e-9)
    # the floor took as many steps as geoarray's Adam from the same start: the same weight to float32 rounding
    assert row["floor_max_abs_difference_to_geoarray"] < 1e-5
    assert "floor/kernels" in capsys.readouterr().out


def test_compile_trace_counts_what_dynamo_traces(bench_backend, tmp_path, capsys):
    """compile_trace.py counts the bytecode instructions dynamo traces for a compiled ``geoarray.torch.Adam``
    step and times the compile against ``torch.optim.Adam``'s: a positive count, the same in both rounds
    (the count does not depend on the machine), ratios that are the quotients of the printed numbers, and
    the trace diet of 2026-11-30 kept: at most 26,000 instructions for Adam's step (24,617 then; 33,686
    before; an internal of torch 2.13's dynamo, so a new torch may move it). An unknown optimizer and a
    ``--repeat`` below 1 are one-line errors with exit code 2."""
    if bench_backend != "torch":
        pytest.skip("compile_trace.py counts what torch.compile's dynamo traces")
    module = load_benchmark("compile_trace")
    path = tmp_path / "compile_trace.json"
    module.main(["--optimizers", "Adam", "--repeat", "2", "--json", str(path)])
    base, adam = json.loads(path.read_text())["rows"]
    assert (base["optimizer"], adam["optimizer"]) == ("torch.optim.Adam", "Adam")
    for row in (base, adam):
        assert isinstance(row["instructions"], int) and row["instructions"] > 0, row
        assert row["instructions_vary"] is False, row
        _positive_finite(row["compile_s"], "compile_s")
    assert adam["ratio_instructions"] == adam["instructions"] / base["instructions"]
    assert math.isclose(adam["ratio_compile_s"], adam["compile_s"] / base["compile_s"], rel_tol=1e-12)
    assert adam["instructions"] <= 26_000, adam["instructions"]
    assert "instructions" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        module.main(["--optimizers", "Adamm"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown optimizers ['Adamm']" in err, err
    with pytest.raises(SystemExit) as info:
        module.main(["--repeat", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--repeat must be ≥ 1, got 0" in err, err


def test_step_kernels_compiled_step(bench_backend, tmp_path, capsys):
    """step_kernels.py --compile times torch.compile(opt.update, fullgraph=True) with inductor against the
    same kernels, with all guards and with the library's globals unguarded
    (``geoarray.torch.skip_guards_on_library_globals``): each compiled step took as many steps from the
    same start as the eager one, and lands on the same weight to float32 rounding (2e-6; two code paths)."""
    if bench_backend != "torch":
        pytest.skip("step_kernels.py times torch.compile")
    path = tmp_path / "step_kernels.json"
    load_benchmark("step_kernels").main(["--sets", "tiny", "--steps", "2", "--compile", "--json", str(path)])
    (row,) = json.loads(path.read_text())["rows"]
    for key in ("compiled_ms", "ratio_compiled_over_kernels", "compile_s"):
        _positive_finite(row[key], key)
    assert math.isclose(row["ratio_compiled_over_kernels"], row["compiled_ms"] / row["kernels_ms"], rel_tol=1e-9)
    assert row["compiled_max_abs_difference_to_geoarray"] < 2e-6
    _positive_finite(row["compiled_skip_library_guards_ms"], "compiled_skip_library_guards_ms")
    assert row["compiled_skip_library_guards_max_abs_difference_to_geoarray"] < 2e-6
    out = capsys.readouterr().out
    assert "compiled/kernels" in out and "lib-guards-skipped/kernels" in out


@pytest.mark.parametrize("shape", [(16, 12, 3), (8, 16, 4), (40, 5)], ids=["packed", "batched-wy", "single-wy"])
def test_step_kernels_floor_is_geoarrays_update(bench_backend, shape):
    """The hand-written floor of step_kernels.py --floor is the update of ``geoarray.optim.Adam(lr=1e-3)``
    in each section form geoarray picks (packed reflectors for a batch of ≥ 16 small frames, compact WY
    otherwise): after 6 steps from the same point and gradient both weights agree to 2e-6 (float32; the
    entries are O(1)), and the floor's weight is orthonormal to 2e-6."""
    if bench_backend != "torch":
        pytest.skip("the floor step is written in torch")
    import torch

    import geoarray
    from geoarray import optim

    module = load_benchmark("step_kernels")
    *batch, N, n = shape
    M = geoarray.Stiefel(N, n)
    Y = M.random(3, xp=torch, batch_shape=tuple(batch), dtype=torch.float32)
    G = geoarray.random.normal(4, tuple(Y.shape), xp=torch, dtype=torch.float32, scale=1e-2)
    form = geoarray._backend.householder_section_form(tuple(Y.shape), geoarray.as_namespace(torch))
    assert form == ("packed" if len(batch) and batch[0] >= 16 else "compact-wy")
    floor, state = module.floor_step(Y, G)
    opt = optim.Adam(lr=module.LR)
    params, opt_state = {"W": Y}, opt.init({"W": Y}, {"W": M})
    for _ in range(6):
        floor()
        params, opt_state = opt.update(params, {"W": G}, opt_state)
    assert float((state["Y"] - params["W"]).abs().max()) < 2e-6
    gram = state["Y"].mT @ state["Y"]
    assert float((gram - torch.eye(n)).abs().max()) < 2e-6


def test_gpu_benchmark_runs_on_the_cpu(bench_backend, tmp_path, capsys):
    """gpu.py's CPU smoke run (tiny set, no compile): the eager geoarray step and the baselines are timed,
    and the CUDA-only variants (sync check, graph capture) are absent rather than failed."""
    if bench_backend == "numpy":
        pytest.skip("gpu.py times torch and JAX; NumPy has no GPU")
    path = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--backends", bench_backend, "--sets", "tiny", "--rounds", "2", "--inner", "2"]
    load_benchmark("gpu").main([*argv, "--no-compile", "--json", str(path)])
    (row,) = json.loads(path.read_text())["rows"]
    if bench_backend == "torch":
        for key in ("eager_ms", "adam_foreach_ms", "eager_over_adam"):
            _positive_finite(row[key], key)
        assert "syncs" not in row and "graph" not in row and "graph_ms" not in row
    else:
        for key in ("jit_ms", "compile_s"):
            _positive_finite(row[key], key)
    assert "tiny" in capsys.readouterr().out


def test_gpu_benchmark_takes_a_section_form(bench_backend, tmp_path):
    """gpu.py --section-form block-reflector (the GEMM-only route, run by .ci/gpu's lease) times the step with
    that form, records it, and restores the previous setting afterwards."""
    if bench_backend == "numpy":
        pytest.skip("gpu.py times torch and JAX; NumPy has no GPU")
    import geoarray

    path = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--backends", bench_backend, "--sets", "tiny", "--rounds", "1", "--inner", "1"]
    load_benchmark("gpu").main([*argv, "--no-compile", "--section-form", "block-reflector", "--json", str(path)])
    out = json.loads(path.read_text())
    assert out["section_form"] == "block-reflector" and len(out["rows"]) == 1
    assert geoarray.get_section_form() == "auto"


@pytest.mark.parametrize("whole_step", [False, True], ids=["use", "whole-step"])
def test_section_forms_on_the_cpu(bench_backend, tmp_path, capsys, whole_step):
    """section_forms.py times each Householder section form's use (build, λᵀG, λ applied), or a whole Adam
    step with the form forced, on the session's backend: compact WY, the reconstruction and the GEMM-only block
    reflector on torch, JAX and NumPy, the packed form on torch only; the forms give the same result to float32
    rounding (1e-5 after the six steps of this run; entries O(1e-2) and O(1)), and exactly one is marked as the form
    householder_section_form picks there."""
    path = tmp_path / "section_forms.json"
    argv = ["--device", "cpu", "--backends", bench_backend, "--sets", "tiny", "--rounds", "2", "--inner", "1"]
    load_benchmark("section_forms").main([*argv, *(["--whole-step"] if whole_step else []), "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    forms = ["compact-wy", "reconstructed"] + (["packed"] if bench_backend == "torch" else []) + ["block-reflector"]
    assert [row["form"] for row in rows] == forms
    assert sum(row["picked"] for row in rows) == 1
    for row in rows:
        _positive_finite(row["ms"], f"{row['form']} ms")
        assert row["max_abs_difference_to_compact_wy"] < 1e-5
    assert rows[0]["over_compact_wy"] == 1.0
    assert "picked" in capsys.readouterr().out


def test_soak_json(bench_backend, tmp_path, capsys):
    path = tmp_path / "soak.json"
    argv = ["--backend", bench_backend, "--set", "tiny", "--steps", "20", "--every", "10", "--warmup", "10"]
    load_benchmark("soak").main([*argv, "--compare", "--json", str(path)])
    out = json.loads(path.read_text())
    assert out["bjorck"] and not out["without_bjorck"]["bjorck"] and out["without_bjorck"]["steps"] == 20
    _positive_finite(out["max_drift_ratio"], "max_drift_ratio")
    _positive_finite(out["step_cost"]["ratio"], "step_cost ratio")
    assert out["growth_exponent"] is None or math.isfinite(out["growth_exponent"])
    assert out["backend"] == bench_backend and out["steps"] == 20 and out["shape"] == [4, 6, 2]
    assert [r["step"] for r in out["rows"]] == [0, 10, 20]
    assert 0 <= out["max_drift"] < 1e-5, "the float32 Stiefel weights left the manifold"
    _positive_finite(out["rss_last_mb"], "rss_last_mb")
    _positive_finite(out["ms_per_step"], "ms_per_step")
    assert math.isfinite(out["rss_growth_mb"]) and out["rss_growth_from_step"] == 10
    assert f"{bench_backend}: 20 steps of Adam on 4 × Stiefel(6, 2) float32" in capsys.readouterr().out


def test_ab_step_against_head(bench_backend, tmp_path):
    """ab_step.py imports src/geoarray at a git revision beside this checkout and times both steps
    interleaved: against HEAD of a clean checkout the two are the same computation (max|ΔW| = 0; a working
    tree with uncommitted changes may differ by rounding), with positive, finite medians, for the core's
    ``update``, (``--torch``) geoarray.torch's ``opt.step()`` on the square set and (``--backend
    array-api-strict --host-reads never``) the core's step on the generic paths; ``--torch`` with another
    backend is an argparse error (exit code 2); ``--torch`` against a revision
    from before geoarray.torch (where the clone holds one) and a revision git
    does not know is a one-line error with exit code 2. Run as a subprocess: the script imports a second
    copy of the library, which must not share this test process."""
    if bench_backend != "torch":
        pytest.skip("ab_step.py times torch steps")
    if not os.path.isdir(os.path.join(os.path.dirname(BENCH_DIR), ".git")):
        pytest.skip("ab_step.py exports the base revision with git: this is not a git checkout")
    script = os.path.join(BENCH_DIR, "ab_step.py")
    path = tmp_path / "ab.json"
    src = os.path.join(os.path.dirname(BENCH_DIR), "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run(
        [sys.executable, script, "--base", "HEAD", "--sets", "tiny", "--steps", "2", "--json", str(path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "new/base" in run.stdout
    (row,) = json.loads(path.read_text())["rows"]
    for key in ("new_ms", "base_ms", "ratio_new_over_base"):
        _positive_finite(row[key], key)
    assert row["max_abs_difference"] < 1e-5
    # --torch: geoarray.torch's opt.step() on a ManifoldParameter, the square set (its own exp(A) path)
    adapter = subprocess.run(
        [sys.executable, script, "--base", "HEAD", "--sets", "128x128", "--steps", "2", "--torch", "--json", str(path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert adapter.returncode == 0, adapter.stderr
    (row,) = json.loads(path.read_text())["rows"]
    assert row["optimizer"] == "geoarray.torch.Adam" and row["set"] == "128x128"
    for key in ("new_ms", "base_ms", "ratio_new_over_base"):
        _positive_finite(row[key], key)
    assert row["max_abs_difference"] < 1e-5
    # --backend array-api-strict --host-reads never: the core's step on the generic paths, the fixed-work route
    strict = subprocess.run(
        [sys.executable, script, "--base", "HEAD", "--sets", "tiny", "--steps", "2", "--backend", "array-api-strict",
         "--host-reads", "never", "--json", str(path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert strict.returncode == 0, strict.stderr
    assert "Adam on array-api-strict, float32, host reads never" in strict.stdout
    (row,) = json.loads(path.read_text())["rows"]
    assert row["backend"] == "array-api-strict" and row["optimizer"] == "Adam"
    for key in ("new_ms", "base_ms", "ratio_new_over_base"):
        _positive_finite(row[key], key)
    assert row["max_abs_difference"] < 1e-5
    both = subprocess.run(
        [sys.executable, script, "--base", "HEAD", "--torch", "--backend", "numpy"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert both.returncode == 2
    assert both.stderr.strip().splitlines()[-1] == (
        "ab_step.py: error: --torch times geoarray.torch's optimizer, which runs on torch: leave out --backend numpy"
    )
    bad = subprocess.run(
        [sys.executable, script, "--base", "no-such-revision-xyz", "--sets", "tiny"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "ab_step.py: error: cannot export src/geoarray at --base 'no-such-revision-xyz' with git: "
        "fatal: not a valid object name: no-such-revision-xyz"
    ]
    # --torch against a revision from before geoarray.torch existed: one line, exit code 2
    repo = os.path.dirname(BENCH_DIR)
    # --host-reads never against a revision from before set_host_reads: one line, exit code 2
    added = subprocess.run(
        ["git", "-C", repo, "log", "--format=%H", "-S", "def set_host_reads", "--", "src/geoarray"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
    older = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--verify", "-q", f"{added[-1]}~1"], capture_output=True, text=True, timeout=60
    ) if added else None  # fmt: skip
    if older is not None and older.returncode == 0:  # a shallow clone may hold no such revision
        rev = older.stdout.strip()
        reads = subprocess.run(
            [sys.executable, script, "--base", rev, "--backend", "numpy", "--host-reads", "never", "--sets", "tiny"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert reads.returncode == 2
        assert reads.stderr.strip().splitlines() == [
            f"ab_step.py: error: revision {rev!r} has no set_host_reads; leave out --host-reads"
        ]
    first = subprocess.run(
        ["git", "-C", repo, "rev-list", "HEAD", "--", "src/geoarray/torch/__init__.py"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
    parent = f"{first[-1]}~1" if first else "no-such-revision-xyz"
    before = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--verify", "-q", parent], capture_output=True, text=True, timeout=60
    )
    if before.returncode != 0:
        return  # a shallow clone holds no revision from before geoarray.torch: nothing more to compare with
    old = before.stdout.strip()
    missing = subprocess.run(
        [sys.executable, script, "--base", old, "--sets", "tiny", "--torch"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"ab_step.py: error: --torch: revision {old!r} has no geoarray.torch.Adam; leave out --torch (the core's "
        "optimizer) or pick a later revision"
    ]


def test_cuda_sync_sites_lists_the_steps_waits_and_not_the_mode_switch():
    """_timing.cuda_sync_sites with a stand-in for torch.cuda whose mode switch warns once, as the first
    switch in a process did on an H200: the step's two warnings per call are counted at their site over
    ``repeats`` calls, the warm-up call is not watched, and the switch's own warning is left out."""
    import types
    import warnings

    timing = load_benchmark("_timing")
    mode = ["default"]

    def set_sync_debug_mode(value):
        if value == "warn":
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        mode[0] = value

    cuda = types.SimpleNamespace(
        synchronize=lambda: None, get_sync_debug_mode=lambda: mode[0], set_sync_debug_mode=set_sync_debug_mode
    )
    calls = [0]

    def step():
        calls[0] += 1
        for _ in range(2):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("an unrelated warning", UserWarning, stacklevel=1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unwatched warm-up call's warnings
        sites = timing.cuda_sync_sites(types.SimpleNamespace(cuda=cuda), step, repeats=3, warmup=1)
    assert calls[0] == 4 and mode[0] == "default"
    assert len(sites) == 1, sites
    ((site, count),) = sites.items()
    assert site.startswith("test_benchmarks.py:") and site.endswith("(step)") and count == 6, sites


def test_transformer_step_json(bench_backend, tmp_path):
    """The GPT-2-sized benchmark at its tiny size: one row with positive, finite times, ratios and time per
    million parameters; the memory columns, which come from two fresh processes, in the NumPy session only
    (a fresh torch or JAX process imports and compiles for 20–40 s on this machine: the same code path)."""
    path = tmp_path / "transformer_step.json"
    argv = ["--sets", "tiny", "--backends", bench_backend, "--steps", "1", "--threads", "1", "--memory-steps", "1"]
    if bench_backend != "numpy":
        argv.append("--no-memory")
    if bench_backend == "torch":  # the float32 drift runs geoarray.torch.Adam
        argv += ["--drift-steps", "3", "--drift-frames", "1"]
    load_benchmark("transformer_step").main([*argv, "--json", str(path)])
    out = json.loads(path.read_text())
    assert out["benchmark"] == "transformer_step" and "cpu" in out["machine"]
    drifts = [r for r in out["rows"] if "drift_steps" in r]
    if bench_backend == "torch":
        (d,) = drifts
        assert d["drift_steps"] == 3 and d["drift_frames"] == 1 and 0 <= d["max_abs_YtY_minus_I"] < 1e-5
    (row,) = [r for r in out["rows"] if "set" in r]
    assert (row["set"], row["backend"], row["layout"], row["frames"]) == ("tiny", bench_backend, "stacks", 12)
    for key in ("geoarray_ms", "adam_ms", "ratio", "geoarray_ms_per_m", "params_m"):
        _positive_finite(row[key], key)
    if bench_backend == "numpy":
        for key in ("geoarray_mib", "adam_mib"):
            assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] >= 0, (key, row[key])


def test_transformer_step_manifold_muon_against_torchs_muon(bench_backend, tmp_path):
    """``--optimizer ManifoldMuon``: geoarray.torch.ManifoldMuon against torch.optim.Muon (one 2-D parameter per
    frame) at the tiny size, both steps positive and finite, the row naming the optimizer, with the memory
    columns (two fresh processes: once, in the torch session); elsewhere the option is refused with the fix."""
    module = load_benchmark("transformer_step")
    argv = ["--sets", "tiny", "--optimizer", "ManifoldMuon", "--steps", "1", "--threads", "1", "--memory-steps", "1"]
    if bench_backend != "torch":
        with pytest.raises(SystemExit) as exc:
            module.main([*argv, "--backends", bench_backend])
        assert exc.value.code == 2
        return
    path = tmp_path / "muon.json"
    module.main([*argv, "--backends", "torch", "--json", str(path)])
    (row,) = json.loads(path.read_text())["rows"]
    assert (row["set"], row["optimizer"], row["frames"]) == ("tiny", "ManifoldMuon", 12)
    for key in ("geoarray_ms", "adam_ms", "ratio", "geoarray_mib", "adam_mib"):
        _positive_finite(row[key], key)
    assert "floor_ms" not in row  # the QR-and-products floor is Adam's
