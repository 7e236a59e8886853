"""Shared pieces of the geoarray.jax tests: the skip rule and a tiny Stiefel regression problem."""

from __future__ import annotations

import pytest

JAX_ONLY = "geoarray.jax needs JAX arrays"


def require_jax(backend) -> None:
    if backend.kind != "jax":
        pytest.skip(JAX_ONLY)


def problem(seed: int = 0, N: int = 6, n: int = 2, batch: int = 8):
    """params {"Y": St(N, n), "w": (n,)}, manifolds, a batch (x, t) and loss(params, batch) (float64)."""
    import jax.numpy as jnp

    import geoarray as ga

    M = ga.Stiefel(N, n)
    params = {"Y": M.random(seed, xp=jnp, dtype="float64"), "w": jnp.ones((n,), dtype=jnp.float64)}
    x = ga.random.normal(seed + 1, (batch, N), xp=jnp, dtype="float64")
    t = jnp.sin(jnp.arange(batch, dtype=jnp.float64))

    def loss(p, b):
        xb, tb = b
        return jnp.mean((jnp.tanh(xb @ p["Y"]) @ p["w"] - tb) ** 2)

    return params, {"Y": M, "w": None}, (x, t), loss
