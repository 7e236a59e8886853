"""Quickstart: Adam on the Stiefel manifold, on every installed backend.

Maximise tr(YᵀSY) over Y ∈ St(200, 10) (i.e. minimise −tr(YᵀSY)) for a random symmetric S. The
optimum is the sum of the 10 largest eigenvalues of S (Ky Fan). The same geoarray code runs on NumPy,
array-api-strict, PyTorch and JAX (with ``jax.jit``), and prints per backend the objective against
the optimum, the orthonormality error max|YᵀY − I| and the wall time.

    python examples/quickstart.py [--steps 1500] [--N 200] [--n 10]
"""

from __future__ import annotations

import argparse
import importlib
import time

import numpy as np

import geoarray
from geoarray import as_namespace, optim


def _backends():
    yield "numpy", "numpy"
    yield "array-api-strict", "array_api_strict"
    yield "torch", "torch"
    yield "jax", "jax.numpy"


def run(xp, N: int, n: int, steps: int, jit: bool):
    M = geoarray.Stiefel(N, n)
    A = geoarray.random.normal(0, (N, N), xp=xp)
    S = (A + xp.matrix_transpose(A)) / (2 * N) ** 0.5  # spectrum in about [−2, 2]
    opt = optim.Adam(lr=1e-2)
    update = opt.update
    if jit:
        import jax

        update = jax.jit(opt.update)
    params = {"Y": M.random(1, xp=xp)}
    state = opt.init(params, {"Y": M})
    start = time.perf_counter()
    for _ in range(steps):
        params, state = update(params, {"Y": -2 * (S @ params["Y"])}, state)
    Y = params["Y"]
    value = float(xp.sum(Y * (S @ Y)))
    seconds = time.perf_counter() - start
    orth = float(xp.max(xp.abs(xp.matrix_transpose(Y) @ Y - geoarray.linalg.eye(n, Y))))
    optimum = float(np.sort(np.linalg.eigvalsh(geoarray.to_host(S)))[-n:].sum())
    return value, optimum, orth, seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--N", type=int, default=200)
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"maximise tr(YᵀSY) on Stiefel({args.N}, {args.n}) with Adam(lr=1e-2), {args.steps} steps, float64")
    for name, module in _backends():
        try:
            if name == "jax":
                import jax

                jax.config.update("jax_enable_x64", True)
            xp = as_namespace(importlib.import_module(module))
        except ImportError:
            print(f"{name:>16}: not installed, skipped")
            continue
        value, optimum, orth, seconds = run(xp, args.N, args.n, args.steps, jit=name == "jax")
        gap = (optimum - value) / abs(optimum)
        print(
            f"{name + (' (jit)' if name == 'jax' else ''):>16}: tr(YᵀSY) = {value:.6f}  optimum {optimum:.6f}  "
            f"gap {gap:.1e}  max|YᵀY − I| = {orth:.1e}  {seconds:6.2f} s"
        )


if __name__ == "__main__":
    main()
