"""Geometric integrators written against the array API, batched over initial conditions.

Both integrators take ``z0`` of shape ``(..., d)`` (any leading batch of initial conditions) and
return the trajectory ``(..., n_steps + 1, d)`` (time, then features), including ``z0``. No Python
control flow depends on array values inside a step: the nonlinear solve of the implicit midpoint
rule runs a fixed number of iterations, and convergence is checked once, after the whole
trajectory (one host synchronisation per call).

References: E. Hairer, C. Lubich, G. Wanner, "Geometric Numerical Integration" (2006), sections
I.1 (Störmer–Verlet), II.1 and IV.2 (implicit midpoint rule; it preserves all quadratic invariants).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .._backend import array_namespace

__all__ = ["ConvergenceError", "implicit_midpoint", "stormer_verlet"]

from .._typing import Array


class ConvergenceError(RuntimeError):
    """The nonlinear solve of an implicit step did not reach its tolerance within ``max_iter`` iterations."""


def _check_z0(z0: Array, dt: float, n_steps: int) -> Any:
    xp = array_namespace(z0)
    if z0.ndim < 1:
        raise ValueError(f"z0: expected an array of shape (..., d), got shape {tuple(z0.shape)}")
    if not xp.isdtype(z0.dtype, "real floating"):
        raise TypeError(f"z0: expected a real floating dtype, got {z0.dtype}")
    if not bool(xp.all(xp.isfinite(z0))):
        raise ValueError("z0: contains NaN or infinite values")
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not dt > 0:
        raise ValueError(f"dt: expected a positive number, got {dt!r}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"n_steps: expected a non-negative int, got {n_steps!r}")
    return xp


def implicit_midpoint(
    f: Callable[[Array], Array],
    z0: Array,
    dt: float,
    n_steps: int,
    *,
    jacobian: Callable[[Array], Array] | None = None,
    method: str = "newton",
    tol: float = 1e-12,
    max_iter: int | None = None,
    on_failure: str = "raise",
) -> Array | tuple[Array, Array]:
    r"""Implicit midpoint rule :math:`z_{n+1} = z_n + \Delta t\, f\big((z_n + z_{n+1})/2\big)` for
    :math:`\dot z = f(z)`.

    Each step solves G(w) = w − z_n − Δt f((z_n + w)/2) = 0 for w = z_{n+1}, starting from the
    explicit Euler guess w = z_n + Δt f(z_n):

    - ``method="fixed_point"``: w ← z_n + Δt f((z_n + w)/2); contracts when Δt·Lip(f)/2 < 1
      (default ``max_iter`` 100);
    - ``method="newton"``: w ← w − (I − Δt/2·Df)⁻¹ G(w) with ``jacobian(z)`` = Df(z) of shape
      (..., d, d) (default ``max_iter`` 20), quadratically convergent.

    Exactly ``max_iter`` iterations run per step (no value-dependent branching, so the step traces
    under ``jax.jit``). Convergence: after the trajectory, the residual max‖G(z_{n+1})‖_∞ over
    all steps and initial conditions must be ≤ ``tol`` (absolute; the default 1e-12 suits float64
    and O(1) states). With ``on_failure="raise"`` (default) a larger residual raises
    :class:`ConvergenceError`; with ``on_failure="return"`` the trajectory is returned together
    with that residual (a 0-d array) and the caller decides.

    ``f`` maps (..., d) to (..., d); returns the trajectory (..., n_steps + 1, d).
    """
    xp = _check_z0(z0, dt, n_steps)
    if method not in ("newton", "fixed_point"):
        raise ValueError(f"method: expected 'newton' or 'fixed_point', got {method!r}")
    if method == "newton" and jacobian is None:
        raise ValueError("jacobian: required for method='newton' (or use method='fixed_point')")
    if on_failure not in ("raise", "return"):
        raise ValueError(f"on_failure: expected 'raise' or 'return', got {on_failure!r}")
    if max_iter is None:
        max_iter = 20 if method == "newton" else 100
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter: expected a positive int, got {max_iter!r}")
    if not tol > 0:
        raise ValueError(f"tol: expected a positive number, got {tol!r}")
    d = z0.shape[-1]
    eye = xp.eye(d, dtype=z0.dtype, device=getattr(z0, "device", None))

    # not None where it is called: method="newton" requires it (checked above)
    newton_jacobian = cast("Callable[[Array], Array]", jacobian)

    def step(z: Array) -> tuple[Array, Array]:
        w = z + dt * f(z)
        for _ in range(max_iter):
            mid = (z + w) / 2
            if method == "fixed_point":
                w = z + dt * f(mid)
            else:
                g = w - z - dt * f(mid)
                jac = eye - (dt / 2) * newton_jacobian(mid)
                w = w - xp.linalg.solve(jac, g[..., None])[..., 0]
        res = xp.max(xp.abs(w - z - dt * f((z + w) / 2)))
        return w, res

    states = [z0]
    residual = xp.zeros((), dtype=z0.dtype)
    z = z0
    for _ in range(n_steps):
        z, res = step(z)
        states.append(z)
        residual = xp.maximum(residual, res)
    traj = xp.stack(states, axis=-2)
    if on_failure == "return":
        return traj, residual
    r = float(residual)
    if not r <= tol:  # also catches NaN
        raise ConvergenceError(
            f"implicit_midpoint ({method}): residual {r:.3e} > tol={tol:g} after max_iter={max_iter} iterations "
            f"(dt={dt:g}); reduce dt, raise max_iter or use method='newton'"
        )
    return traj


def stormer_verlet(
    grad_V: Callable[[Array], Array],
    z0: Array,
    dt: float,
    n_steps: int,
    *,
    mass: Array | float = 1.0,
) -> Array:
    r"""Störmer–Verlet for H(q, p) = ½ pᵀM⁻¹p + V(q) (Hairer–Lubich–Wanner, eq. I.1.17):

        p_{n+½} = p_n − Δt/2 ∇V(q_n),  q_{n+1} = q_n + Δt M⁻¹ p_{n+½},  p_{n+1} = p_{n+½} − Δt/2 ∇V(q_{n+1}).

    ``z0`` is (..., 2n) = [q, p]; ``mass`` a scalar or an (n,) array of diagonal masses.
    Explicit, symplectic, second order. Returns (..., n_steps + 1, 2n).
    """
    xp = _check_z0(z0, dt, n_steps)
    if z0.shape[-1] % 2:
        raise ValueError(f"z0: expected an even last dimension [q, p], got shape {tuple(z0.shape)}")
    n = z0.shape[-1] // 2
    q, p = z0[..., :n], z0[..., n:]
    states = [z0]
    for _ in range(n_steps):
        p = p - (dt / 2) * grad_V(q)
        q = q + dt * (p / mass)
        p = p - (dt / 2) * grad_V(q)
        states.append(xp.concat([q, p], axis=-1))
    return xp.stack(states, axis=-2)
