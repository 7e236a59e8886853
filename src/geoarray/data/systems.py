"""Hamiltonian and Lie–Poisson test systems of the volume-preserving and symplectic transformer papers.

Every system has a vector field ``f(z)`` on (..., d), its Jacobian or potential gradient, its
invariants, and a ``*_trajectories`` function returning (n_ic, n_steps + 1, d) in the namespace
``xp`` (float64 by default), so data is generated on the backend that trains on it.
"""

from __future__ import annotations

import math
from typing import Any

from .integrators import implicit_midpoint, stormer_verlet

__all__ = [
    "RIGID_BODY_CONSTANTS",
    "coupled_oscillator_grad_V",
    "coupled_oscillator_hamiltonian",
    "coupled_oscillator_trajectories",
    "harmonic_oscillator_trajectories",
    "pendulum_trajectories",
    "rigid_body_field",
    "rigid_body_initial_conditions",
    "rigid_body_invariants",
    "rigid_body_jacobian",
    "rigid_body_trajectories",
]

from .._typing import Array

#: (a, b, c) of the Euler equations ż = (a z₂z₃, b z₁z₃, c z₁z₂).
RIGID_BODY_CONSTANTS = (1.0, -0.5, -0.5)


def rigid_body_field(z: Array, constants: tuple[float, float, float] = RIGID_BODY_CONSTANTS) -> Array:
    r"""Euler's equations of a free rigid body in body angular momentum z ∈ R³:

        ż₁ = a z₂ z₃,  ż₂ = b z₁ z₃,  ż₃ = c z₁ z₂,

    with a = (I₂ − I₃)/(I₂I₃) and cyclic (Hairer–Lubich–Wanner, "Geometric Numerical Integration",
    eq. IV.1.4). geoarray uses a = 1, b = c = −½ (:data:`RIGID_BODY_CONSTANTS`), the constants of the
    volume-preserving transformer experiment (Brantner, Hesthaven, Oyarzún, "Volume-preserving
    transformers for learning time series data with structure"). Published sources disagree on these
    constants (other papers and GeometricProblems.jl use moments of inertia such as I = (2, 1, 2/3),
    which give different a, b, c); pass ``constants`` to use another choice. a + b + c = 0 makes
    ‖z‖² a Casimir for any such choice.
    """
    a, b, c = constants
    z1, z2, z3 = z[..., 0], z[..., 1], z[..., 2]
    from .._backend import array_namespace

    xp = array_namespace(z)
    return xp.stack([a * z2 * z3, b * z1 * z3, c * z1 * z2], axis=-1)


def rigid_body_jacobian(z: Array, constants: tuple[float, float, float] = RIGID_BODY_CONSTANTS) -> Array:
    """Df(z) of :func:`rigid_body_field`, shape (..., 3, 3)."""
    from .._backend import array_namespace

    xp = array_namespace(z)
    a, b, c = constants
    z1, z2, z3 = z[..., 0], z[..., 1], z[..., 2]
    zero = xp.zeros_like(z1)
    rows = [
        xp.stack([zero, a * z3, a * z2], axis=-1),
        xp.stack([b * z3, zero, b * z1], axis=-1),
        xp.stack([c * z2, c * z1, zero], axis=-1),
    ]
    return xp.stack(rows, axis=-2)


def rigid_body_invariants(z: Array, constants: tuple[float, float, float] = RIGID_BODY_CONSTANTS) -> tuple:
    r"""(‖z‖, E): the norm and a second quadratic invariant E = ½ Σᵢ wᵢ zᵢ².

    A quadratic ½Σ wᵢzᵢ² is conserved iff w₁a + w₂b + w₃c = 0. For a = 1, b = c = −½ the conserved
    quadratics are spanned by ‖z‖² (w = (1, 1, 1)) and z₂² − z₃²; E uses w = (2, 1, 3), positive
    definite. For other constants w = (1, 1, 1) + (1, 1, 1) × (a, b, c), which is orthogonal to
    (a, b, c) when a + b + c = 0.
    """
    from .._backend import array_namespace

    xp = array_namespace(z)
    a, b, c = constants
    if constants == RIGID_BODY_CONSTANTS:
        w = (2.0, 1.0, 3.0)
    else:
        w = (1.0 + (c - b), 1.0 + (a - c), 1.0 + (b - a))  # (1,1,1) + (1,1,1)×(a,b,c)
    norm = xp.sqrt(xp.sum(z * z, axis=-1))
    energy = 0.5 * (w[0] * z[..., 0] ** 2 + w[1] * z[..., 1] ** 2 + w[2] * z[..., 2] ** 2)
    return norm, energy


def rigid_body_initial_conditions(
    *, xp: Any, v_start: float = 0.1, v_step: float = 0.01, dtype: Any = None, device: Any = None
) -> Array:
    """The 2 × 619 initial conditions (sin v, 0, cos v) and (0, sin v, cos v), v = 0.1:0.01:2π
    (both families on the unit sphere), as in the volume-preserving transformer experiment; shape (2m, 3)."""
    dtype = xp.float64 if dtype is None else dtype
    m = math.floor((2 * math.pi - v_start) / v_step + 1e-9) + 1
    v = v_start + v_step * xp.arange(m, dtype=dtype, device=device)
    s, c, zero = xp.sin(v), xp.cos(v), xp.zeros_like(v)
    return xp.concat([xp.stack([s, zero, c], axis=-1), xp.stack([zero, s, c], axis=-1)], axis=0)


def rigid_body_trajectories(
    z0: Array,
    n_steps: int,
    *,
    dt: float = 0.2,
    constants: tuple[float, float, float] = RIGID_BODY_CONSTANTS,
    tol: float = 1e-12,
) -> Array:
    """Implicit-midpoint (Newton, ``tol``) trajectories from z0 (..., 3): (..., n_steps + 1, 3), Δt = 0.2."""
    return implicit_midpoint(
        lambda z: rigid_body_field(z, constants),
        z0,
        dt,
        n_steps,
        jacobian=lambda z: rigid_body_jacobian(z, constants),
        tol=tol,
    )


# --- coupled harmonic oscillator ------------------------------------------------------------------

COUPLED_OSCILLATOR = {"m1": 2.0, "m2": 1.0, "k1": 1.5, "k2": 0.3, "k": 1.0}


def _sigmoid(x: Array, xp: Any) -> Array:
    return (1 + xp.tanh(x / 2)) / 2  # = 1/(1 + e⁻ˣ), without overflow for large |x|


def coupled_oscillator_grad_V(q: Array, **params: float) -> Array:
    r"""∇V for V(q) = ½k₁q₁² + ½k₂q₂² + ½k σ(q₁)(q₂ − q₁)², σ the logistic sigmoid.

    Two masses m₁ = 2, m₂ = 1 on springs k₁ = 1.5, k₂ = 0.3, coupled by a spring of stiffness
    k = 1 switched on by σ(q₁) (the coupled harmonic oscillator of Brantner, Hesthaven, "Linear
    symplectic attention", following GeometricProblems.jl). H = p₁²/(2m₁) + p₂²/(2m₂) + V(q).
    """
    from .._backend import array_namespace

    xp = array_namespace(q)
    p = {**COUPLED_OSCILLATOR, **params}
    q1, q2 = q[..., 0], q[..., 1]
    s = _sigmoid(q1, xp)
    diff = q2 - q1
    dV1 = p["k1"] * q1 + p["k"] * (0.5 * s * (1 - s) * diff**2 - s * diff)
    dV2 = p["k2"] * q2 + p["k"] * s * diff
    return xp.stack([dV1, dV2], axis=-1)


def coupled_oscillator_hamiltonian(z: Array, **params: float) -> Array:
    """H(q₁, q₂, p₁, p₂) of :func:`coupled_oscillator_grad_V`."""
    from .._backend import array_namespace

    xp = array_namespace(z)
    p = {**COUPLED_OSCILLATOR, **params}
    q1, q2, p1, p2 = z[..., 0], z[..., 1], z[..., 2], z[..., 3]
    return (
        p1**2 / (2 * p["m1"])
        + p2**2 / (2 * p["m2"])
        + 0.5 * p["k1"] * q1**2
        + 0.5 * p["k2"] * q2**2
        + 0.5 * p["k"] * _sigmoid(q1, xp) * (q2 - q1) ** 2
    )


def coupled_oscillator_trajectories(z0: Array, n_steps: int, *, dt: float = 0.3, **params: float) -> Array:
    """Störmer–Verlet trajectories (Δt = 0.3) of the coupled oscillator from z0 (..., 4) = (q₁, q₂, p₁, p₂)."""
    from .._backend import array_namespace

    xp = array_namespace(z0)
    p = {**COUPLED_OSCILLATOR, **params}
    mass = xp.asarray([p["m1"], p["m2"]], dtype=z0.dtype, device=getattr(z0, "device", None))
    return stormer_verlet(lambda q: coupled_oscillator_grad_V(q, **params), z0, dt, n_steps, mass=mass)


def coupled_oscillator_initial_conditions(n: int, *, xp: Any, dtype: Any = None, device: Any = None) -> Array:
    """n initial conditions q₁ ∈ [−1, 1] (evenly spaced), q₂ = 0, p = 0; shape (n, 4)."""
    dtype = xp.float64 if dtype is None else dtype
    q1 = xp.linspace(-1.0, 1.0, n, dtype=dtype, device=device)
    zero = xp.zeros_like(q1)
    return xp.stack([q1, zero, zero, zero], axis=-1)


# --- pendulum and harmonic oscillator ---------------------------------------------------------------


def pendulum_trajectories(z0: Array, n_steps: int, *, dt: float = 0.1) -> Array:
    """Mathematical pendulum H = p²/2 − cos q, Störmer–Verlet; z0 (..., 2) = (q, p)."""
    from .._backend import array_namespace

    xp = array_namespace(z0)
    return stormer_verlet(lambda q: xp.sin(q), z0, dt, n_steps)


def harmonic_oscillator_trajectories(z0: Array, n_steps: int, *, dt: float = 0.1, omega: float = 1.0) -> Array:
    """Harmonic oscillator H = p²/2 + ω²q²/2, Störmer–Verlet; z0 (..., 2) = (q, p)."""
    return stormer_verlet(lambda q: omega**2 * q, z0, dt, n_steps)
