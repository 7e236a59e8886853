"""The quick start against an installed geoarray: run by ``nox -s package`` with the built wheel in a
fresh venv, from a directory outside the source tree (not collected by pytest: no ``test_`` prefix).

Checks what a file missing from the wheel would break: the package and its lazily imported submodules
import, the distribution's metadata carries the package's version, ``py.typed`` ships, and the README's
optimizer example converges (top-3 eigenspace of a symmetric matrix by Stiefel Adam, to 1e-3).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import numpy as np

import geoarray as ga
from geoarray import optim

here = Path(ga.__file__).resolve().parent
assert "site-packages" in here.parts, f"geoarray imported from {here}, not from the installed wheel"
assert (here / "py.typed").is_file(), "py.typed is missing from the wheel"
assert importlib.metadata.version("geoarray-ml") == ga.__version__, "metadata and __version__ disagree"
for name in ("cli", "data", "gauge", "models", "nn", "train"):  # no torch/jax here: those need their extras
    importlib.import_module(f"geoarray.{name}")

xp = np
A = ga.random.normal(2, (20, 20), xp=xp)
S = A + A.T
params = {"Y": ga.Stiefel(20, 3).random(3, xp=xp), "b": xp.zeros(3, dtype=A.dtype)}
manifolds = {"Y": ga.Stiefel(20, 3), "b": None}
opt = optim.Adam(lr=1e-2)
state = opt.init(params, manifolds)
for _ in range(600):
    grads = {"Y": -2 * S @ params["Y"], "b": params["b"] - 1}
    params, state = opt.update(params, grads, state)
best = float(np.sort(np.linalg.eigvalsh(S))[-3:].sum())
value = float(np.trace(params["Y"].T @ S @ params["Y"]))
assert abs(value - best) < 1e-3 * abs(best), (value, best)
assert ga.Stiefel(20, 3).is_point(params["Y"], atol=1e-12)
print(f"geoarray {ga.__version__} from {here}: quick start OK (trace {value:.6f}, optimum {best:.6f})")
