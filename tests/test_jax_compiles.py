"""The JAX sessions' log line of compiled programs (``tests/_jax_compiles.py``): the counter counts each XLA
compilation and lowering once, a program already compiled is not counted again, and an unregistered
counter counts nothing more; the totals of two processes add, and the line says what it counts. And the
library's small helpers compile one program each for a new shape on eager JAX."""

from __future__ import annotations

import random

import _jax_compiles
import numpy as np
import pytest


def test_a_counter_counts_each_new_program_once(backend):
    if backend.kind != "jax":
        pytest.skip("it counts what JAX reports through jax.monitoring")
    import jax
    import jax.numpy as jnp

    c = random.random()  # a constant no other program holds: not in the persistent compilation cache
    f = jax.jit(lambda a: jnp.tanh(a) * c + 1.0)
    x = jnp.asarray(np.arange(6.0).reshape(2, 3))
    y = (x + 1.0).block_until_ready()  # other values of the same shape, made before counting
    counter = _jax_compiles.start()
    try:
        f(x).block_until_ready()
        first = counter.totals()
        f(y).block_until_ready()  # the same program again
        again = counter.totals()
    finally:
        counter.stop()
    jax.jit(lambda a: a * c - 2.0)(x).block_until_ready()  # after stop(): not counted
    assert first["compile"] >= 1 and first["lower"] >= 1, first
    assert first["compile_s"] > 0 and first["lower_s"] > 0, first
    assert again == first, f"the second call of the same program compiled again: {first} then {again}"
    assert counter.totals() == again, "a stopped counter must not count"


def test_the_totals_of_two_processes_add_and_the_line_says_what_they_count():
    a = {"compile": 3, "compile_s": 0.5, "lower": 3, "lower_s": 0.25}
    b = {"compile": 4, "compile_s": 1.0, "lower": 5, "lower_s": 0.5}
    total = _jax_compiles.add(a, b)
    assert total == {"compile": 7, "compile_s": 1.5, "lower": 8, "lower_s": 0.75}
    assert _jax_compiles.add({}, a) == a
    line = _jax_compiles.summary(total, 2)
    assert line == "JAX: 7 programs compiled by XLA in 1.5 s (lowered in 0.8 s), 2 processes", line
    assert _jax_compiles.summary(a, 1).endswith(", 1 process")


def test_the_librarys_small_helpers_are_one_program_each_on_eager_jax(backend):
    """On eager JAX a random Stiefel point, ``is_point``, ``point_error`` and the finiteness flag each compile one
    program for a new shape, and a native Householder QR two (the factorisation and the compact-WY T), through
    ``_backend.compiled``, not one per operation (the code before, on this test: 8 for a random point, 11 for
    ``is_point``, 9 for the QR, 2 for the flag). Each is called first on another shape, which compiles the few
    shape-free scalar programs once per process; then counted on a shape no other test uses (N drawn from
    40–199). A program that another process of the session has compiled is read from the persistent cache
    and counts 0, hence "at most"."""
    if backend.kind != "jax":
        pytest.skip("it counts what eager JAX compiles (jax.monitoring)")
    import jax.numpy as jnp

    import geoarray
    from geoarray import _backend, linalg

    def calls(M):
        Y = []  # the random point, made by the first call: the shape is new to it as well
        return {
            "Stiefel.random": (1, lambda: Y.append(M.random(1, xp=jnp, batch_shape=(2,))) or Y[0]),
            "Stiefel.is_point": (1, lambda: M.is_point(Y[0])),
            "Stiefel.point_error": (1, lambda: M.point_error(Y[0])),
            "householder_qr": (2, lambda: linalg.householder_qr(Y[0]).V),
            "all_finite": (1, lambda: _backend.all_finite(Y[0], jnp)),
        }

    for _, call in calls(geoarray.Stiefel(7, 2)).values():
        call()
    counts, bounds = {}, {}
    for name, (bound, call) in calls(geoarray.Stiefel(random.randrange(40, 200), 3)).items():
        counter = _jax_compiles.start()
        try:
            out = call()
            if hasattr(out, "block_until_ready"):
                out.block_until_ready()
        finally:
            counter.stop()
        counts[name], bounds[name] = counter.totals()["compile"], bound
    assert all(counts[k] <= bounds[k] for k in counts), f"programs compiled for a new shape: {counts}, at most {bounds}"
