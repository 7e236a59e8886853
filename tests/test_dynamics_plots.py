"""The rollout figures of ``geoarray train vpt|lst|sympnet`` and the stability examples
(``geoarray.commands._dynamics_plots``): checked on what they draw, not on pixels. A rollout that left
at step n (state T − 1 + n) is drawn up to and including that state, marked there (× and, in the drift
panel, a vertical line at step n), and never past the axis ceiling; a rollout that stayed is drawn
whole; the axes keep the truth's range. The PNG files are written with matplotlib's Agg backend.

The figures are drawn from host NumPy arrays (the commands convert with ``to_host``): the tests run in
the numpy session."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib", reason="the figures are matplotlib's")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from geoarray.commands._dynamics_plots import (  # noqa: E402
    Rollout,
    draw_invariant_drift,
    draw_phase_portrait,
    draw_sphere,
)
from geoarray.commands.dynamics import _plot_rollout, divergence_step  # noqa: E402

T, N, LEFT = 3, 60, 10  # window, states, step where the bad rollout leaves


@pytest.fixture(autouse=True)
def _numpy_session(backend):
    if backend.name != "numpy":
        pytest.skip("the figures are drawn from host NumPy arrays (the commands call to_host): numpy session")


def _sphere_rollouts():
    t = np.linspace(0, 6, N)
    truth = np.stack([np.cos(t), np.sin(t), 0 * t], -1)[None] * np.ones((2, 1, 1))
    good = truth * (1 + 0.01 * np.sin(3 * t))[:, None]
    bad = truth * np.exp(0.1 * np.maximum(np.arange(N) - (T - 1), 0))[:, None]  # ‖z‖ doubles past step 6.9
    left = divergence_step(bad, np.linalg.norm(bad, axis=-1), T)
    return truth, good, bad, left


def test_a_diverged_rollout_is_drawn_up_to_the_step_where_it_left():
    truth, good, bad, left = _sphere_rollouts()
    assert left == 7  # e^{0.1 n} − 1 > 1 first at n = 7
    runs = [
        Rollout("good", good, np.linalg.norm(good, axis=-1), None, offset=T - 1),
        Rollout("bad", bad, np.linalg.norm(bad, axis=-1), left, offset=T - 1),
    ]
    assert runs[0].end == N and runs[1].end == T + left
    fig = plt.figure()
    ax3 = fig.add_subplot(1, 2, 1, projection="3d")
    drawn = draw_sphere(ax3, truth, runs)
    assert drawn["good"].shape == (N, 3) and drawn["bad (diverged at step 7)"].shape == (T + left, 3)
    assert np.abs(drawn["bad (diverged at step 7)"]).max() <= 1.25  # the box stays [−1.25, 1.25]³
    assert ax3.get_xlim() == ax3.get_zlim() == (-1.25, 1.25)
    ax = fig.add_subplot(1, 2, 2)
    drift = draw_invariant_drift(ax, np.linalg.norm(truth, axis=-1), runs, offset=T - 1, ceiling=2.0, floor=1e-8)
    steps, d = drift["bad (diverged at step 7)"]
    assert steps[0] == -(T - 1) and steps[-1] == left and d.max() <= 2.0
    np.testing.assert_allclose(d[-1], np.exp(0.1 * left) - 1, rtol=1e-12)
    assert drift["good"][0][-1] == N - T and ax.get_ylim() == (1e-8, 2.0)
    vlines = [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == ":"]
    assert vlines == [left]  # the step where it left, for the diverged rollout only
    markers = [line for line in ax.lines if line.get_marker() == "x"]
    assert len(markers) == 1 and markers[0].get_xdata()[0] == left
    plt.close(fig)


def test_phase_portrait_keeps_the_truths_range():
    t = np.linspace(0, 6, N)
    truth = np.stack([np.cos(t), 0.5 * np.cos(t), -np.sin(t), -0.5 * np.sin(t)], -1)[None]
    bad = truth.copy()
    bad[:, T + 4 :] *= 1e6  # leaves at step 5
    fig, ax = plt.subplots()
    drawn = draw_phase_portrait(ax, truth, [Rollout("bad", bad, None, 5, offset=T - 1)], 0, 2, n_states=40)
    assert drawn["truth"].shape == (40, 2) and drawn["bad (diverged at step 5)"].shape == (T + 5, 2)
    assert ax.get_xlim() == pytest.approx((-2.0, 2.0), abs=1e-3)  # the truth's [−1, 1] and half of it
    plt.close(fig)


@pytest.mark.parametrize("dim", [3, 4, 2])
def test_the_command_writes_its_rollout_figure(tmp_path, dim):
    # the rigid body on the sphere, the coupled oscillator's two and the pendulum's one phase portrait
    truth, _, bad, _ = _sphere_rollouts()
    if dim != 3:
        truth, bad = (np.concatenate([a, a], -1)[..., :dim] for a in (truth, bad))
    inv = lambda z: np.linalg.norm(z, axis=-1)  # noqa: E731
    path = tmp_path / "rollout.png"
    _plot_rollout(bad, truth, inv(bad), inv(truth), "norm", T, divergence_step(bad, inv(bad), T), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
