"""Figures of learned integrators' rollouts against the truth, shared by ``geoarray train vpt|lst|sympnet``
and the stability experiments in ``examples/``.

What a person needs to see: the rollout in the system's own geometry — on the unit sphere ‖z‖ = 1 for
the rigid body (3-D), phase portraits (q_i, p_i) for a Hamiltonian system — and the invariant's drift
over time for every compared model in one panel. A rollout that diverged (see
:func:`geoarray.commands.dynamics.divergence_step`) is drawn only up to the state where it left, that
state marked with an ×, and the axes keep the truth's range: the blow-up must not flatten the truth
into a line. Every function draws on a matplotlib Axes it is given (the caller chooses the backend,
Agg in the commands) and returns what it drew, so tests check the data, not pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Rollout", "draw_invariant_drift", "draw_phase_portrait", "draw_sphere"]

#: a drift below this is drawn at this value (the log axis has no 0; exact invariants sit there)
DRIFT_FLOOR = 1e-16


@dataclass
class Rollout:
    """One model's rollout ``states`` (..., N, d) on the truth's time grid (state i is the truth's state
    i; the first ``offset + 1`` states are the given start, ``offset`` = T − 1 for a window of T), its
    invariant (..., N) and, if it left, the rollout step n (state ``offset + n``) where it did."""

    label: str
    states: np.ndarray
    invariant: np.ndarray | None = None
    diverged_at_step: int | None = None
    offset: int = 0

    @property
    def end(self) -> int:
        """How many states are drawn: all, or up to and including the one where the rollout left."""
        n = self.states.shape[-2]
        return n if self.diverged_at_step is None else min(n, self.offset + self.diverged_at_step + 1)

    @property
    def legend(self) -> str:
        if self.diverged_at_step is None:
            return self.label
        return f"{self.label} (diverged at step {self.diverged_at_step})"


def _sample(a: np.ndarray, sample: int) -> np.ndarray:
    return a.reshape(-1, *a.shape[-2:])[sample] if a.ndim > 2 else a


def draw_sphere(ax, truth: np.ndarray, rollouts: list[Rollout], *, sample: int = 0) -> dict[str, np.ndarray]:
    """Rigid body on the unit sphere (``ax`` a 3-D Axes): a wireframe of ‖z‖ = 1, the true trajectory of
    start ``sample`` and each model's rollout (up to where it left, × there); the box is [−1.25, 1.25]³
    whatever the rollouts do. Returns {legend: drawn states (n, 3)}."""
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 25), np.linspace(0, np.pi, 13))
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", linewidth=0.4)
    R = _sample(np.asarray(truth, dtype=np.float64), sample)
    ax.plot(R[:, 0], R[:, 1], R[:, 2], color="k", linewidth=2.5, label="truth")
    drawn = {"truth": R}
    for i, r in enumerate(rollouts):
        P = _sample(np.asarray(r.states, dtype=np.float64), sample)[: r.end]
        with np.errstate(invalid="ignore"):
            P = np.clip(P, -1.25, 1.25)  # the state where it left may lie far outside: keep the box
        ax.plot(P[:, 0], P[:, 1], P[:, 2], color=f"C{i}", linewidth=1, label=r.legend)
        if r.diverged_at_step is not None:
            ax.plot(*P[-1:].T, "x", color=f"C{i}", markersize=9)
        drawn[r.legend] = P
    for lim in (ax.set_xlim, ax.set_ylim, ax.set_zlim):
        lim(-1.25, 1.25)
    ax.set(xlabel="z1", ylabel="z2", zlabel="z3")
    return drawn


def draw_phase_portrait(
    ax, truth: np.ndarray, rollouts: list[Rollout], iq: int, ip: int, *, n_states: int | None = None, sample: int = 0
) -> dict[str, np.ndarray]:
    """Phase portrait (q, p) = (z[iq], z[ip]) of start ``sample`` over the first ``n_states`` states (all
    by default): the truth and each rollout (up to where it left, × there), the axes at the truth's range
    with a margin of half of it. Returns {legend: drawn (n, 2)}."""
    R = _sample(np.asarray(truth, dtype=np.float64), sample)
    n = R.shape[0] if n_states is None else min(n_states, R.shape[0])
    ax.plot(R[:n, iq], R[:n, ip], color="0.6", linewidth=4, label="truth")
    drawn = {"truth": R[:n][:, [iq, ip]]}
    for i, r in enumerate(rollouts):
        P = _sample(np.asarray(r.states, dtype=np.float64), sample)[: min(r.end, n)][:, [iq, ip]]
        ax.plot(P[:, 0], P[:, 1], color=f"C{i}", linewidth=1, label=r.legend)
        if r.diverged_at_step is not None and r.end <= n:
            ax.plot(P[-1:, 0], P[-1:, 1], "x", color=f"C{i}", markersize=9)
        drawn[r.legend] = P
    for k, lim in ((iq, ax.set_xlim), (ip, ax.set_ylim)):
        lo, hi = float(R[:, k].min()), float(R[:, k].max())
        pad = 0.5 * max(hi - lo, 1e-3)
        lim(lo - pad, hi + pad)
    return drawn


def draw_invariant_drift(
    ax,
    truth_invariant: np.ndarray,
    rollouts: list[Rollout],
    *,
    offset: int,
    ceiling: float,
    floor: float = DRIFT_FLOOR,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """max over starts of |I − I(z₀)| against the rollout step (state i is step i − ``offset``), log
    scale, for the truth and every rollout; a rollout that left is drawn up to that step, marked with an
    × and a dotted vertical line. The axis stops at ``ceiling`` (the divergence threshold times a
    margin), so what is drawn is the approach, not the blow-up; it starts at ``floor`` (a drift below it,
    e.g. an invariant the truth keeps to rounding, is drawn there). Returns {legend: (steps, drift)}."""

    def drift(inv: Any, end: int) -> np.ndarray:
        inv = np.asarray(inv, dtype=np.float64)
        inv = inv.reshape(-1, inv.shape[-1])[:, :end]
        with np.errstate(invalid="ignore", over="ignore"):
            return np.maximum(np.abs(inv - inv[:, :1]).max(axis=0), floor)

    d = drift(truth_invariant, np.asarray(truth_invariant).shape[-1])
    steps = np.arange(d.shape[0]) - offset
    ax.semilogy(steps, d, color="k", linewidth=2, label="truth")
    drawn = {"truth": (steps, d)}
    for i, r in enumerate(rollouts):
        d = np.minimum(drift(r.invariant, r.end), ceiling)
        s = steps[: d.shape[0]]
        ax.semilogy(s, d, color=f"C{i}", linewidth=1, label=r.legend)
        if r.diverged_at_step is not None:
            ax.plot(s[-1:], d[-1:], "x", color=f"C{i}", markersize=9)
            ax.axvline(s[-1], color=f"C{i}", linestyle=":", linewidth=0.8)
        drawn[r.legend] = (s, d)
    ax.set_ylim(floor, ceiling)
    ax.set_xlabel("rollout step")
    return drawn
