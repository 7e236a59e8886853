"""float32 retracted points end with one Björck step (``manifolds.retraction.bjorck_step``; not after a
packed section); float64 ones do not (their results are unchanged bit for bit).

Applying the Householder section Q = I − VTVᵀ to g(W)E in float32 cancels O(1) terms into entries of
size N^-½: on 32 × Stiefel(49, 7) that left max|YᵀY − I| ≈ 1.5–2e-6 after every step, the floor that
``benchmarks/soak.py`` measured (it does not accumulate over steps: the section is rebuilt from each
point). One Björck step Y − ½Y(YᵀY − I) maps an orthogonality error ε to O(ε²) plus its own rounding.
Checked on every backend:

* the Björck step squares the orthogonality error of a float64 frame (ε ≈ 6e-5 → ≤ n·ε², n = 7);
* a float32 retraction of an Adam-sized step lands within 8e-7 of orthonormal (≈ 13 float32 unit
  roundoffs), also from a point that has drifted to 1e-4 (the section does not carry the drift over,
  and neither does the Björck step). Without the Björck step this fails on NumPy, array-api-strict and
  JAX (compact-WY section: 1.4–1.7e-6); eager torch on the CPU with 16 or more frames uses the packed section
  (LAPACK's ormqr), which leaves ≈ 6e-7 and takes no Björck step;
* float64 retractions never call it (patched to raise), so float64 trajectories are what they were.
"""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import max_abs
from geoarray import linalg
from geoarray.manifolds import Grassmann, Stiefel
from geoarray.manifolds import stiefel as stiefel_module
from geoarray.manifolds.retraction import bjorck_step

FLOOR = 8e-7  # float32: 13 unit roundoffs (2⁻²⁴ ≈ 6e-8); without the Björck step ≥ 1.4e-6 here


def _orth(Y, xp):
    return max_abs(xp.matrix_transpose(Y) @ Y - linalg.eye(Y.shape[-1], Y))


def _drifted(M, xp, device, dtype, eps, batch=32):
    """A batch of points of M with max|YᵀY − I| ≈ eps (a random perturbation of size eps/2)."""
    Y = M.random(0, xp=xp, batch_shape=(batch,), dtype=xp.float64, device=device)
    if eps:
        noise = np.random.default_rng(1).normal(size=tuple(Y.shape))
        noise = noise / np.max(np.abs(noise)) * eps / 2
        Y = Y + xp.asarray(noise, dtype=xp.float64, device=device)
    return xp.astype(Y, dtype)


def _step(M, Y, xp, device, scale=1e-3):
    """λ(Y)·g(W)E for W the lift of a random gradient scaled to an Adam-sized step (‖W‖ ≈ 1e-3)."""
    G = np.random.default_rng(2).normal(size=tuple(Y.shape))
    G = xp.asarray(G / np.max(np.abs(G)) * scale, dtype=Y.dtype, device=device)
    lam = M.global_section(Y)
    return M.apply_retraction(lam, M.lift(Y, lam, G))


def test_bjorck_step_squares_the_orthogonality_error(xp, device):
    Y = _drifted(Stiefel(49, 7), xp, device, xp.float64, 1e-4)
    eps = _orth(Y, xp)
    assert 2e-5 < eps < 2e-4
    # YᵀY = I + E → I − ¾E² + ¼E³, whose entries are at most ¾·n·ε² + ¼·n²·ε³ < n·ε² for n = 7
    assert _orth(bjorck_step(Y, xp), xp) <= 7 * eps**2


@pytest.mark.parametrize("manifold", [Stiefel(49, 7), Grassmann(49, 7), Stiefel(49, 7, retraction_method="cayley")])
@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_float32_retraction_lands_within_a_few_roundoffs(xp, device, manifold, eps):
    Y = _drifted(manifold, xp, device, xp.float32, eps)
    Y1 = _step(manifold, Y, xp, device)
    assert Y1.dtype == xp.float32
    err = _orth(Y1, xp)
    assert err <= FLOOR, f"max|YᵀY − I| = {err:.2e} after one float32 retraction of {manifold!r} from drift {eps}"


def test_float64_retraction_does_not_take_the_bjorck_step(xp, device, monkeypatch):
    def refuse(Y, xp, out=None):
        raise AssertionError("bjorck_step called on a float64 retraction")

    monkeypatch.setattr(stiefel_module, "bjorck_step", refuse)
    M = Stiefel(49, 7)
    Y1 = _step(M, _drifted(M, xp, device, xp.float64, 0.0, batch=4), xp, device)
    assert Y1.dtype == xp.float64 and _orth(Y1, xp) < 1e-14
