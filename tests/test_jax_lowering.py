"""The JAX sessions lower programs in shared MLIR contexts (``tests/_jax_lowering.py``): the session's
speed must not change what is compiled. A program lowered in a shared context is the same module, word
for word, as in JAX's own fresh context, and computes the same bits; a thread has a context of its own;
and a context is renewed after ``PROGRAMS_PER_CONTEXT`` programs, which bounds what it keeps."""

from __future__ import annotations

import threading

import _jax_lowering
import numpy as np
import pytest


@pytest.fixture
def mlir(backend):
    if backend.kind != "jax":
        pytest.skip("the shared MLIR contexts are how the JAX sessions lower programs")
    from jax._src.interpreters import mlir

    if not getattr(mlir.make_ir_context, "shared_by_geoarray_tests", False):
        pytest.skip(
            "this JAX has no make_ir_context of no arguments to share (tests/_jax_lowering.py): the session "
            "lowers in JAX's own fresh contexts, correct but slower"
        )
    return mlir


def _program(jnp, x):
    return jnp.tanh(x @ x.T).sum(axis=0) * 3.0 + jnp.linalg.norm(x, axis=1)


def test_a_program_lowers_to_the_same_module_and_bits_as_in_a_fresh_context(mlir, monkeypatch):
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 3)))
    shared_text = jax.jit(lambda a: _program(jnp, a)).lower(x).as_text()
    shared_out = np.asarray(jax.jit(lambda a: _program(jnp, a))(x))
    monkeypatch.setattr(mlir, "make_ir_context", mlir.make_ir_context.jax_own)
    fresh_text = jax.jit(lambda a: _program(jnp, a)).lower(x).as_text()
    fresh_out = np.asarray(jax.jit(lambda a: _program(jnp, a))(x))
    assert shared_text == fresh_text
    np.testing.assert_array_equal(shared_out, fresh_out)


def test_a_context_is_shared_per_thread_and_renewed_after_its_quota(mlir):
    first = mlir.make_ir_context()
    assert mlir.make_ir_context() is first
    other: list = []
    worker = threading.Thread(target=lambda: other.append(mlir.make_ir_context()))
    worker.start()
    worker.join()
    assert other[0] is not first
    # whatever the count so far, PROGRAMS_PER_CONTEXT + 1 calls in a row renew the context exactly once
    # after their first call: two contexts, the second from the quota's end (objects kept: ids are reused)
    contexts = [mlir.make_ir_context() for _ in range(_jax_lowering.PROGRAMS_PER_CONTEXT + 1)]
    distinct = [c for i, c in enumerate(contexts) if all(c is not d for d in contexts[:i])]
    assert len(distinct) == 2
