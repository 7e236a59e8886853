"""Data parallelism: make_train_step over a 4-device jax.sharding.Mesh equals the single-device step.

The host platform is split into 4 CPU devices by ``XLA_FLAGS=--xla_force_host_platform_device_count=4``,
which must be set before JAX initialises, so the check runs in a fresh interpreter (bounded time).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import geoarray as ga
from _jax_common import require_jax


@pytest.fixture(autouse=True)
def _jax_only(backend):
    require_jax(backend)


SCRIPT = r"""
import json, os
# the session's other XLA flags kept (its compiler settings: noxfile.py)
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import geoarray as ga

M = ga.Stiefel(6, 2)
params = {"Y": M.random(0, xp=jnp, dtype="float64"), "w": jnp.ones(2)}
mans = {"Y": M, "w": None}
x = ga.random.normal(1, (5, 16, 6), xp=jnp, dtype="float64")  # 5 steps of 16 samples
t = jnp.sin(jnp.arange(80.0)).reshape(5, 16)

def loss(p, b):
    return jnp.mean((jnp.tanh(b[0] @ p["Y"]) @ p["w"] - b[1]) ** 2)

mesh = Mesh(np.array(jax.devices()), ("data",))
one, s1 = ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), params, mans)
par, sN = ga.jax.make_train_step(loss, ga.optim.Adam(lr=1e-2), params, mans, mesh=mesh)
p1, pN = params, jax.device_put(params, NamedSharding(mesh, P()))
split = NamedSharding(mesh, P("data"))
for k in range(5):
    p1, s1, l1 = one(p1, s1, (x[k], t[k]))
    batch = jax.device_put((x[k], t[k]), split)  # what the step's in_shardings ask for
    pN, sN, lN = par(pN, sN, batch)
leaves1 = jax.tree_util.tree_leaves((p1, s1, l1))
leavesN = jax.tree_util.tree_leaves((pN, sN, lN))
diff = max(float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))
           for a, b in zip(leaves1, leavesN))
shards = [np.asarray(s.data) for s in pN["Y"].addressable_shards]

# bad input: a gradient on another device than its parameter (params on device 0, grads on device 1)
tx = ga.jax.optax_transform(mans, "gradient", lr=0.1)
tx_state = tx.init(params)
far = jax.device_put(jax.tree_util.tree_map(jnp.ones_like, params), jax.devices()[1])
try:
    tx.update(far, tx_state, params)
    device_error = None
except ValueError as exc:
    device_error = str(exc)
# tensor parallelism / FSDP-style: a Stiefel weight sharded by rows under the user's own jax.jit
M8 = ga.Stiefel(8, 2)
tp = {"Y": M8.random(2, xp=jnp, dtype="float64"), "V": jnp.ones((8, 2))}
tp_mans = {"Y": M8, "V": None}
xs = ga.random.normal(3, (16, 8), xp=jnp, dtype="float64")
tp_opt = ga.optim.Adam(lr=1e-2)
tp_state = tp_opt.init(tp, tp_mans)
tp_loss = lambda q: jnp.mean(jnp.tanh(xs @ q["Y"]) * (xs @ q["V"]))
tp_step = jax.jit(lambda p, s: tp_opt.update(p, jax.grad(tp_loss)(p), s))
rows = NamedSharding(mesh, P("data", None))
q1, r1 = tp, tp_state
qN, rN = jax.device_put(tp, {"Y": rows, "V": rows}), jax.device_put(tp_state, NamedSharding(mesh, P()))
for _ in range(5):
    q1, r1 = tp_step(q1, r1)
    qN, rN = tp_step(qN, rN)
tp_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(jax.tree_util.tree_leaves((q1, r1)), jax.tree_util.tree_leaves((qN, rN))))
print(json.dumps({
    "row_sharded_diff": tp_diff,
    "row_sharded_stays_sharded": [tuple(s.data.shape) for s in qN["Y"].addressable_shards] == [(2, 2)] * 4,
    "device_error": device_error,
    "devices": jax.device_count(),
    "diff": diff,
    "replicated": bool(pN["Y"].sharding.is_fully_replicated) and len(pN["Y"].sharding.device_set) == 4,
    "replicas_identical": all(np.array_equal(shards[0], s) for s in shards[1:]) and len(shards) == 4,
    "batch_split": [tuple(s.data.shape) for s in batch[0].addressable_shards] == [(4, 6)] * 4,
    "on_manifold": bool(M.is_point(pN["Y"], atol=1e-12)),
    "steps": int(sN.step),
}))
"""


@pytest.fixture(scope="module")
def four_devices(backend):
    """The JSON the script prints, run once in a fresh interpreter with 4 host devices (bounded time)."""
    require_jax(backend)  # a module fixture is set up before the function-scoped skip
    src = str(Path(ga.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the 4-device subprocess did not finish within 180 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_data_parallel_step_over_a_mesh_equals_the_single_device_step(four_devices):
    """5 Adam steps, St(6, 2) weight, batch of 16 split over 4 devices: parameters, optimizer state and loss equal
    the single-device run to 1e-12 (float64); each device holds 4 samples of each batch; the parameters stay
    replicated with bit-identical replicas."""
    result = four_devices
    assert result["devices"] == 4
    assert result["diff"] <= 1e-12, result
    assert result["replicated"] and result["replicas_identical"], result
    assert result["batch_split"], result
    assert result["on_manifold"] and result["steps"] == 5, result


def test_a_gradient_on_another_device_is_refused_naming_the_parameter(four_devices):
    """``tx.update`` with the gradients on device 1 and the parameters on device 0: ``ValueError`` naming
    ``params['Y']`` and both devices (raised by the core's checks before any computation)."""
    message = four_devices["device_error"]
    assert message is not None, "no error for a gradient on another device"
    assert re.search(r"grad of params\['Y'\] is on device .*1.*, the parameter on .*0", message), message


def test_a_row_sharded_stiefel_weight_under_jit_equals_the_unsharded_update(four_devices):
    """Tensor parallelism / FSDP-style sharding in JAX: St(8, 2) and a Euclidean (8, 2) weight sharded by rows over
    4 devices (``PartitionSpec("data", None)``), 5 Adam steps of ``jax.jit(opt.update)``: equal to the unsharded
    run to 1e-12 (GSPMD partitions the same global computation), and the weights stay sharded (2 rows per device)."""
    assert four_devices["row_sharded_diff"] <= 1e-12, four_devices
    assert four_devices["row_sharded_stays_sharded"], four_devices
