"""Rigid-body initial conditions and windowing: shapes, contents, shuffling, errors."""

import numpy as np
import pytest

from _helpers import to_numpy
from geoarray.data import batches, shuffle, systems, windows


def test_rigid_body_initial_conditions(xp):
    z0 = to_numpy(systems.rigid_body_initial_conditions(xp=xp))
    assert z0.shape == (2 * 619, 3)
    assert np.abs(np.linalg.norm(z0, axis=1) - 1).max() < 1e-14
    assert np.all(z0[:619, 1] == 0) and np.all(z0[619:, 0] == 0)
    np.testing.assert_allclose(z0[0], [np.sin(0.1), 0, np.cos(0.1)], atol=1e-15)


def test_windows_shapes_and_contents(xp):
    traj = xp.reshape(xp.arange(2 * 10 * 3, dtype=xp.float64), (2, 10, 3))
    x, y = windows(traj, 3, 2, stride=2)
    # starts 0, 2, 4 (4 + 5 ≤ 10): 3 windows per trajectory
    assert x.shape == (6, 3, 3) and y.shape == (6, 2, 3)
    t = to_numpy(traj)
    np.testing.assert_array_equal(to_numpy(x)[4], t[1, 2:5])
    np.testing.assert_array_equal(to_numpy(y)[4], t[1, 5:7])


def test_shuffle_is_a_seeded_joint_permutation(xp):
    x = xp.reshape(xp.arange(20, dtype=xp.float64), (10, 2))
    y = 2 * x
    xs, ys = shuffle(x, y, seed=3)
    xs2, _ = shuffle(x, y, seed=3)
    np.testing.assert_array_equal(to_numpy(ys), 2 * to_numpy(xs))
    np.testing.assert_array_equal(to_numpy(xs), to_numpy(xs2))
    assert sorted(to_numpy(xs)[:, 0].tolist()) == to_numpy(x)[:, 0].tolist()
    sizes = [b[0].shape[0] for b in batches(x, y, 4, seed=0)]
    assert sizes == [4, 4, 2]


def test_bad_data(xp):
    with pytest.raises(ValueError, match="trajectories"):
        windows(xp.ones((2, 3, 4, 5), dtype=xp.float64), 1, 1)
    with pytest.raises(ValueError, match="trajectories"):
        windows(xp.ones((2, 3, 2), dtype=xp.float64), 2, 2)
    bad = xp.asarray([[0.0, 1.0], [float("nan"), 1.0], [1.0, 1.0]], dtype=xp.float64)
    with pytest.raises(ValueError, match="NaN"):
        windows(bad, 1, 1)
    with pytest.raises(ValueError, match="targets"):
        shuffle(xp.ones((3, 2), dtype=xp.float64), xp.ones((4, 2), dtype=xp.float64), 0)
