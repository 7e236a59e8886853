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
