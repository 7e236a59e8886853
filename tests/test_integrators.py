"""Integrators: order 2 by step halving, invariants to the solver tolerance, convergence errors."""

import math

import numpy as np
import pytest

from _helpers import to_numpy
from geoarray.data import ConvergenceError, implicit_midpoint, stormer_verlet, systems


def _final(traj):
    return to_numpy(traj[..., -1, :])


@pytest.mark.parametrize("method", ["newton", "fixed_point"])
def test_implicit_midpoint_order_two(xp, method):
    # error at t = 1 against a 4x finer run: ratio of errors for Δt and Δt/2 ≈ 2² = 4
    z0 = xp.asarray([[math.sin(1.0), 0.0, math.cos(1.0)]], dtype=xp.float64)
    kw = {"jacobian": systems.rigid_body_jacobian, "method": method}
    ref = _final(implicit_midpoint(systems.rigid_body_field, z0, 1 / 64, 64, **kw))
    e1 = np.abs(_final(implicit_midpoint(systems.rigid_body_field, z0, 1 / 8, 8, **kw)) - ref).max()
    e2 = np.abs(_final(implicit_midpoint(systems.rigid_body_field, z0, 1 / 16, 16, **kw)) - ref).max()
    assert 3.3 < e1 / e2 < 4.8


def test_stormer_verlet_order_two(xp):
    z0 = xp.asarray([[1.0, 0.0], [0.5, 0.3]], dtype=xp.float64)
    ref = _final(systems.pendulum_trajectories(z0, 128, dt=1 / 128))
    e1 = np.abs(_final(systems.pendulum_trajectories(z0, 16, dt=1 / 16)) - ref).max()
    e2 = np.abs(_final(systems.pendulum_trajectories(z0, 32, dt=1 / 32)) - ref).max()
    assert 3.5 < e1 / e2 < 4.5


def test_rigid_body_invariants_conserved(xp):
    z0 = systems.rigid_body_initial_conditions(xp=xp)[::100, ...]
    traj = systems.rigid_body_trajectories(z0, 50)
    norm, energy = systems.rigid_body_invariants(traj)
    assert np.abs(to_numpy(norm) - 1).max() < 1e-11
    e = to_numpy(energy)
    assert np.abs(e - e[:, :1]).max() < 1e-11


def test_oscillator_energy_bounded_by_verlet(xp):
    z0 = systems.coupled_oscillator_initial_conditions(3, xp=xp)
    H = to_numpy(systems.coupled_oscillator_hamiltonian(systems.coupled_oscillator_trajectories(z0, 400)))
    # symplectic: the energy error oscillates with amplitude O(Δt²) and does not grow
    assert np.abs(H - H[:, :1]).max() < 0.1
    first, last = np.abs(H[:, 1:200] - H[:, :1]).max(), np.abs(H[:, 200:] - H[:, :1]).max()
    assert last < 1.5 * first + 1e-12


def test_harmonic_oscillator_matches_exact_rotation(xp):
    z0 = xp.asarray([[1.0, 0.0]], dtype=xp.float64)
    traj = to_numpy(systems.harmonic_oscillator_trajectories(z0, 100, dt=0.01))
    assert np.abs(traj[0, -1] - [math.cos(1.0), -math.sin(1.0)]).max() < 1e-4


def test_shapes_and_batching(xp):
    z0 = xp.ones((2, 3, 2), dtype=xp.float64)
    assert stormer_verlet(lambda q: q, z0, 0.1, 5).shape == (2, 3, 6, 2)


def test_non_convergence_raises_or_flags(xp):
    z0 = xp.asarray([[3.0, 0.0, 3.0]], dtype=xp.float64)
    with pytest.raises(ConvergenceError, match="residual"):
        implicit_midpoint(systems.rigid_body_field, z0, 2.0, 1, method="fixed_point", max_iter=2)
    _, res = implicit_midpoint(
        systems.rigid_body_field, z0, 2.0, 1, method="fixed_point", max_iter=2, on_failure="return"
    )
    assert float(res) > 1e-12


def test_bad_input(xp):
    with pytest.raises(ValueError, match="z0"):
        stormer_verlet(lambda q: q, xp.asarray([[1.0, float("nan")]], dtype=xp.float64), 0.1, 2)
    with pytest.raises(ValueError, match="dt"):
        stormer_verlet(lambda q: q, xp.ones((2,), dtype=xp.float64), -0.1, 2)
    with pytest.raises(ValueError, match="jacobian"):
        implicit_midpoint(systems.rigid_body_field, xp.ones((3,), dtype=xp.float64), 0.1, 2)
