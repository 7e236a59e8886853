"""Run one real computation on every installed backend and compare the results.

The matrix exponential of a batch of skew-symmetric matrices is a batch of rotations; this script
computes it with ``geoarray.linalg.expm`` on NumPy, array-api-strict, PyTorch and JAX (whichever are
installed), and prints per backend the orthogonality error max‖EᵀE − I‖, the largest difference to
the NumPy result and the time per call.

    python examples/expm_backends.py [--batch 336] [--size 14]
"""

from __future__ import annotations

import argparse
import importlib
import time

import numpy as np

import geoarray
from geoarray import linalg


def _namespaces():
    yield "numpy", np
    for name, module in [("array-api-strict", "array_api_strict"), ("torch", "torch"), ("jax", "jax.numpy")]:
        try:
            if name == "jax":
                import jax

                jax.config.update("jax_enable_x64", True)
            yield name, importlib.import_module(module)
        except ImportError:
            print(f"{name:>16}: not installed, skipped")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=336, help="number of matrices (336: the paper's ViT)")
    parser.add_argument("--size", type=int, default=14, help="matrix size (14 = 2n for Stiefel(49, 7))")
    args = parser.parse_args(argv)

    shape = (args.batch, args.size, args.size)
    reference = linalg.expm(linalg.skew(geoarray.random.normal(0, shape, xp=np)))
    print(f"expm of {args.batch} skew-symmetric {args.size}×{args.size} matrices, float64")
    for name, module in _namespaces():
        xp = geoarray._backend.as_namespace(module)
        A = linalg.skew(geoarray.random.normal(0, shape, xp=xp))
        E = linalg.expm(A)  # first call (JAX compiles here)
        start = time.perf_counter()
        for _ in range(5):
            E = linalg.expm(A)
        float(xp.sum(E))  # wait for asynchronous backends
        seconds = (time.perf_counter() - start) / 5
        orth = float(xp.max(xp.abs(xp.matrix_transpose(E) @ E - linalg.eye(args.size, E))))
        diff = float(np.max(np.abs(_host(E) - reference)))
        print(f"{name:>16}: max|EᵀE − I| = {orth:.1e}   max|E − E_numpy| = {diff:.1e}   {seconds * 1e3:7.2f} ms/call")


def _host(x):
    """A NumPy copy, for printing the comparison (torch tensors need .cpu(), the rest speak DLPack)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.from_dlpack(x)


if __name__ == "__main__":
    main()
