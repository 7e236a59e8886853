"""Window layout and rollout stitching of the sequence integrators carry no window-boundary error.

The symplectic transformer's rollouts zig-zag with the window's period T = 3 (README, coupled
oscillator): consecutive states inside a predicted window are as smooth as the truth's, the jumps sit
at the joins between windows. These tests rule out our data layout and rollout code as the cause:
with the exact window map Φ(Z)_t = φ^T(z_t) (T Störmer–Verlet steps applied to every state of the
window, the map ``windows(traj, T, T)`` asks a model to learn), the targets are Φ of the inputs and
``iterate`` reproduces the true trajectory, joins included, to rounding (1e-12). What is left is the
learned map itself, measured in ``examples/oscillator_stability.py``'s notes (README).
"""

from __future__ import annotations

import numpy as np
import pytest

from _helpers import assert_agree, to_numpy
from geoarray import models
from geoarray.data import systems, windows


class ExactWindowMap:
    """Φ(Z)_t = φ^T(z_t): the true flow of the coupled oscillator (Störmer–Verlet, Δt = 0.3) over T steps
    applied to each of the window's states; a stand-in for a perfectly trained sequence model."""

    def __init__(self, T: int, xp):
        self.seq_len, self.xp = T, xp

    def apply(self, params, Z):
        flat = self.xp.reshape(Z, (-1, Z.shape[-1]))
        out = systems.coupled_oscillator_trajectories(flat, self.seq_len)[:, self.seq_len, :]
        return self.xp.reshape(out, Z.shape)


@pytest.mark.parametrize("T", [3])
def test_exact_window_map_rolls_out_the_truth(xp, device, T):
    z0 = systems.coupled_oscillator_initial_conditions(3, xp=xp, dtype=xp.float64, device=device)
    truth = systems.coupled_oscillator_trajectories(z0, 24)
    x, y = windows(truth, T, T)
    exact = ExactWindowMap(T, xp)
    assert_agree(to_numpy(exact.apply(None, x)), to_numpy(y), rtol=1e-12, what="targets = Φ(inputs)")
    n = 24 + 1 - T
    rollout = models.iterate(exact, None, truth[:, :T, :], n)
    assert tuple(rollout.shape) == tuple(truth.shape)
    assert_agree(to_numpy(rollout), to_numpy(truth), rtol=1e-12, what="rollout = truth")
    # no period-T pattern in the second differences: at the joins as inside the windows
    d2 = np.linalg.norm(np.diff(to_numpy(rollout), 2, axis=1) - np.diff(to_numpy(truth), 2, axis=1), axis=-1)
    assert d2.max() <= 1e-12


class _BlowsUp:
    """A window map that doubles its input and fails on a window with entries ≥ 4, as the volume-
    preserving attention's Cayley transform does on a non-finite window (NumPy's LinAlgError)."""

    seq_len = 2

    def apply(self, params, Z):
        if float(np.max(to_numpy(Z))) >= 4:
            raise np.linalg.LinAlgError("Singular matrix")
        return 2 * Z


def test_rollout_past_a_singular_layer_is_nan_and_diverged(xp, device):
    from geoarray.commands.dynamics import divergence_step, rollout

    start = xp.ones((1, 2, 3), dtype=xp.float64, device=device)
    out = to_numpy(rollout(_BlowsUp(), None, start, 9))  # 1 → 2 → 4, then the map fails
    assert out.shape == (1, 11, 3)
    np.testing.assert_array_equal(out[0, :6, 0], [1, 1, 2, 2, 4, 4])  # the two windows computed are kept
    assert np.isnan(out[0, 6:]).all()
    assert divergence_step(out, np.linalg.norm(out, axis=-1), 2) == 3  # ‖z‖ = 4 ‖z₀‖ > 2 ‖z₀‖ at state 4
