"""Sharded parameters and optimizer state: ``make_train_step(..., mesh=mesh, param_sharding=specs)``.

4 host CPU devices (``--xla_force_host_platform_device_count=4``, set before JAX initialises: a fresh
interpreter, bounded time), a ``(8, 16, 4)`` stack of Stiefel frames sharded along the stack
(``PartitionSpec("data")``: 2 frames per device), a ``64×8`` Stiefel weight sharded by rows and a plain
``8×6`` matrix sharded by rows; the batch of 16 split over the same axis; Adam (ManifoldMuon gives
the same picture — measured, 9e-16 — and is left out to keep the compile time of this test down):

* 5 steps equal the single-device step (parameters, state, loss) to 1e-12 in float64, the weights stay
  on their manifolds and stay sharded (2 frames, 16 rows, 2 rows per device);
* the optimizer state of the frames is sharded like the frames (``PartitionSpec("data")`` on its stack
  axis: each device holds the state of its own frames);
* the compiled step (its HLO) has no collective whose result is the frames' stack or its state — they
  are never gathered — while the row-sharded 64×8 weight is all-gathered whole (``f64[64,8]``) where the
  update needs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import geoarray as ga
from _jax_common import require_jax

SCRIPT = r"""
import json, os, re
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import geoarray as ga

F, S = ga.Stiefel(16, 4), ga.Stiefel(64, 8)
params = {"F": F.random(0, xp=jnp, batch_shape=(8,), dtype="float64"), "W": S.random(1, xp=jnp, dtype="float64"),
          "A": ga.random.normal(2, (8, 6), xp=jnp, dtype="float64")}
mans = {"F": F, "W": S, "A": None}
specs = {"F": P("data"), "W": P("data", None), "A": P("data")}
x = ga.random.normal(3, (5, 16, 16), xp=jnp, dtype="float64")
t = ga.random.normal(4, (5, 16, 6), xp=jnp, dtype="float64")

def loss(p, b):
    h = jnp.einsum("bi,kin->bkn", b[0], p["F"]).reshape(b[0].shape[0], 32)
    return jnp.mean((jnp.tanh(jnp.concatenate([h, h], 1) @ p["W"]) @ p["A"] - b[1]) ** 2)

mesh = Mesh(np.array(jax.devices()), ("data",))
split = NamedSharding(mesh, P("data"))
out = {}
for name, opt in [("Adam", ga.optim.Adam(lr=1e-2))]:
    one, s1 = ga.jax.make_train_step(loss, opt, params, mans)
    par, sN = ga.jax.make_train_step(loss, opt, params, mans, mesh=mesh, param_sharding=specs)
    p1, pN = params, jax.device_put(params, {k: NamedSharding(mesh, v) for k, v in specs.items()})
    # the compiled executable runs the steps too: compiling it once is most of this test's time
    par = par.lower(pN, sN, jax.device_put((x[0], t[0]), split)).compile()
    hlo = par.as_text()
    collectives = re.findall(r"= (\w+\[[\d,]*\])\S* (all-gather|all-reduce|collective-permute|all-to-all|"
                             r"reduce-scatter)(?:-start)?\(", hlo)
    for k in range(5):
        p1, s1, l1 = one(p1, s1, (x[k], t[k]))
        pN, sN, lN = par(pN, sN, jax.device_put((x[k], t[k]), split))
    pairs = zip(jax.tree_util.tree_leaves((p1, s1, l1)), jax.tree_util.tree_leaves((pN, sN, lN)))
    out[name] = {
        "diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs),
        "collectives": collectives,
        "shards": {k: sorted({tuple(s.data.shape) for s in v.addressable_shards}) for k, v in pN.items()},
        "state": [[list(leaf.shape), [str(a) for a in leaf.sharding.spec], len(leaf.sharding.device_set)]
                  for leaf in jax.tree_util.tree_leaves(sN)],
        "on_manifold": bool(F.is_point(pN["F"], atol=1e-12)) and bool(S.is_point(pN["W"], atol=1e-12)),
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sharded(backend):
    """The JSON the script prints, run once in a fresh interpreter with 4 host devices (bounded time)."""
    require_jax(backend)
    src = str(Path(ga.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("XLA_FLAGS", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the 4-device subprocess did not finish within 240 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["Adam"])
def test_sharded_parameters_and_state_step_like_one_device(sharded, name):
    result = sharded[name]
    assert result["diff"] <= 1e-12, result["diff"]
    assert result["on_manifold"]
    assert result["shards"] == {"F": [[2, 16, 4]], "W": [[16, 8]], "A": [[2, 6]]}, result["shards"]
    # the state of the frames: every state leaf with the stack's 8 frames in front (Adam's horizontal
    # moments A: (8, 4, 4), B: (8, 12, 4)) is sharded along it
    frames = [leaf for leaf in result["state"] if leaf[0][:1] == [8] and len(leaf[0]) == 3]
    assert frames, result["state"]
    for shape, spec, devices in frames:
        assert spec[:1] == ["data"] and devices == 4, f"a state leaf of the frames {shape} is not sharded: {spec}"


@pytest.mark.parametrize("name", ["Adam"])
def test_the_compiled_step_never_gathers_the_frames(sharded, name):
    """The collectives of the compiled step, read from its HLO: none returns the frames' stack or its
    state (a dimension of 8 frames followed by a frame's or a state's trailing shape); the row-sharded
    64×8 weight is all-gathered whole."""
    collectives = sharded[name]["collectives"]
    gathered = [shape for shape, kind in collectives if kind in ("all-gather", "collective-permute", "all-to-all")]
    for shape in gathered:
        assert shape.split("[")[1].rstrip("]") not in ("8,16,4", "8,4,4", "8,12,4"), (shape, collectives)
    assert "f64[64,8]" in [shape for shape, kind in collectives if kind == "all-gather"], collectives
