"""Smoke test of benchmarks/square_step.py (one step on a square orthogonal weight: geoarray.torch.Adam,
PaperAdam, torch.optim.Adam and geoopt's RiemannianAdam where installed): it runs at a tiny size and
its ``--json`` holds every optimizer with a positive, finite median and the ratios to torch's Adam
(1 for torch itself) and to geoopt's, and with ``--kernels`` the pieces of the step, where the n×n
kernel of a square fast path, I + A·φ₁(A), equals the 2n×2n retraction kernel's exp(A) to float32
rounding; with ``--floor`` the two hand-written floor steps run the same update as geoarray's Adam (their
weights equal its weight to float32 rounding after the timed steps) and the one with the Björck step
stays orthonormal to float32 rounding; with ``--anatomy`` every optimizer's step dispatches torch operations and
Python calls, the floor fewer of each than geoarray's; with ``--replay`` every optimizer's recorded operations
replay on their own, as many as one step dispatches (``--anatomy``'s count, torch.optim's profiler markers
aside). No time is asserted. Torch sessions only: the script times
torch optimizers."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from _examples import load_benchmark


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # geoopt's import
def test_square_step_json(backend, tmp_path, capsys):
    if backend.name != "torch":
        pytest.skip("benchmarks/square_step.py times torch optimizers on the CPU: the torch session runs it")
    module = load_benchmark("square_step")
    path = tmp_path / "square.json"
    module.main(["--n", "8", "--steps", "2", "--kernels", "--floor", "--anatomy", "--replay", "--json", str(path)])
    assert "torch.optim.Adam" in capsys.readouterr().out
    result = json.loads(path.read_text())
    assert (
        result["command"]
        == f"python benchmarks/square_step.py --n 8 --steps 2 --kernels --floor --anatomy --replay --json {path}"
    )
    rows = {r["optimizer"]: r for r in result["rows"]}
    expected = {"geoarray", "geoarray-paper", "torch", "floor", "floor-bjorck"}
    expected |= {"geoopt"} if importlib.util.find_spec("geoopt") else set()
    assert set(rows) == expected
    for row in rows.values():
        assert row["median_ms"] > 0 and math.isfinite(row["median_ms"])
        assert math.isclose(row["vs_torch"], row["median_ms"] / rows["torch"]["median_ms"], rel_tol=1e-9)
    assert rows["torch"]["vs_torch"] == 1.0
    kernels = result["kernels"]
    assert {"section-householder", "section-square", "retraction-2n", "exp-n", "matmul-n", "torch-adam"} <= set(kernels)
    # the square fast path's kernel computes the same exp(A) as the 2n×2n one (float32 rounding)
    assert kernels["max_abs_difference_retraction_2n_vs_exp_n"] < 1e-5
    # the floors are the same update (float32, 5 steps at n = 8: differences of a few ulps of the O(1) entries)
    floor = result["floor"]
    assert set(floor) == {"geoarray", "floor", "floor-bjorck"}
    assert floor["geoarray"]["max_abs_difference_to_geoarray"] == 0.0
    for name in ("floor", "floor-bjorck"):
        assert floor[name]["max_abs_difference_to_geoarray"] < 1e-5
    assert floor["floor-bjorck"]["max_abs_orthogonality_error"] < 1e-5
    # one step's dispatches: every optimizer makes some; the hand-written floor calls no library function, so
    # it makes fewer Python calls than geoarray's step, and its update dispatches fewer torch operations
    anatomy = result["anatomy"]
    assert set(anatomy) == expected
    assert all(a["torch_ops"] > 0 and a["python_calls"] > 0 for a in anatomy.values()), anatomy
    assert anatomy["floor-bjorck"]["python_calls"] < anatomy["geoarray"]["python_calls"]
    assert anatomy["floor-bjorck"]["torch_ops"] < anatomy["geoarray"]["torch_ops"]
    # --replay: each optimizer's own operations, replayed without its Python; as many as one step dispatches
    # (the anatomy's count, less torch.optim's two profiler markers, which the replay leaves out)
    markers = {name: 2 if name in ("geoarray", "geoarray-paper", "torch", "geoopt") else 0 for name in rows}
    for name, row in rows.items():
        assert row["replay_ms"] > 0 and math.isfinite(row["replay_ms"])
        assert row["replay_ops"] == anatomy[name]["torch_ops"] - markers[name], (name, row, anatomy[name])
        assert math.isclose(row["step_over_replay"], row["median_ms"] / row["replay_ms"], rel_tol=1e-9)
    assert rows["floor-bjorck"]["replay_vs_floor_bjorck_replay"] == 1.0
