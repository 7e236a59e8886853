"""Native fast paths behind generic functions: a generic array-API function asks :func:`fast_path` for a
native implementation on the current backend and falls back to its own code when there is none; a
test checks every registered native path against the generic one on every backend that has it."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._typing import Array
from .control import compiled, is_compiling, is_traced
from .namespace import (
    array_namespace,
    backend_name,
    device,
    dtype_name,
    from_host,
    is_jax,
    is_numpy,
    is_torch,
    writable,
)

Namespace = Any

# --------------------------------------------------------------------------------------------
# Fast paths
# --------------------------------------------------------------------------------------------


class _FastPath(NamedTuple):
    fn: Callable[..., Any]
    auto: bool


_FAST_PATHS: dict[tuple[str, str], _FastPath] = {}
_IMPLS = ("auto", "generic", "native")


def register_fast_path(
    op: str, backend: str, *, auto: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the native implementation of ``op`` on ``backend``.

    The function receives the same arguments as the generic implementation and may return
    ``NotImplemented`` to decline (e.g. when an optional dependency such as SciPy is missing).
    ``auto=False`` keeps it opt-in (``impl="native"``): used when the generic path is measurably
    more accurate and the native one is not much faster.
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        _FAST_PATHS[(op, backend)] = _FastPath(fn, auto)
        return fn

    return decorator


def fast_path(op: str, xp: Namespace, impl: str = "auto") -> Callable[..., Any] | None:
    """The native implementation of ``op`` for ``xp`` that ``impl`` selects, or ``None``.

    ``impl="auto"``: the registered native path if it is marked for automatic use;
    ``"generic"``: none; ``"native"``: the registered one, or ``ValueError`` if the backend has none.
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "generic":
        return None
    entry = _FAST_PATHS.get((op, backend_name(xp)))
    if impl == "native":
        if entry is None:
            raise ValueError(
                f"impl='native': the {backend_name(xp)} backend has no native {op}; "
                f"backends with one: {', '.join(fast_path_backends(op)) or 'none'}"
            )
        return entry.fn
    return entry.fn if entry is not None and entry.auto else None


def fast_path_backends(op: str) -> list[str]:
    """Backends that have a native implementation of ``op`` (for tests and docs)."""
    return sorted(b for (o, b) in _FAST_PATHS if o == op)


# expm --------------------------------------------------------------------------------------
# Opt-in only: against exact references the generic degree-13 Padé path of geoarray.linalg.expm
# stays below 3e-14 relative error up to ‖A‖ = 1e3, while (float64, 16×16, measured 2026-11)
# scipy.linalg.expm reaches 3e-12, torch.linalg.matrix_exp 1.7e-13 and jax.scipy.linalg.expm
# 1.6e-13; the generic path costs 1.3-1.6× torch's native time and beats SciPy's.


@register_fast_path("expm", "torch", auto=False)
def _expm_torch(A: Array) -> Array:
    import torch

    return torch.linalg.matrix_exp(A)


@register_fast_path("expm", "jax", auto=False)
def _expm_jax(A: Array) -> Array:
    import jax.scipy.linalg as jsl

    return jsl.expm(A)


@register_fast_path("expm", "numpy", auto=False)
def _expm_numpy(A: Array) -> Array:
    try:
        import scipy.linalg as sla
    except ImportError:  # SciPy is optional; the generic Padé path takes over
        return NotImplemented
    return sla.expm(A)


# inverse of an upper-triangular matrix ---------------------------------------------------------
# The array API has no triangular solve. Without a native one, the compact-WY T factor comes from a
# terminating Neumann series (linalg._t_factor_series) and other callers use a general LU solve against I.
# The native ones use the triangular solver (torch, 4096×128's T factor: 0.14 ms instead of 0.44 ms for
# the LU solve); on torch the series is slower (336 × 7×7: 0.85 ms against 0.40 ms: small bmm are slow).


@register_fast_path("triu_inverse", "torch")
def _triu_inverse_torch(U: Array) -> Array:
    import torch

    eye = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device).expand(U.shape)
    return torch.linalg.solve_triangular(U, eye, upper=True)


@register_fast_path("triu_inverse", "jax")
def _triu_inverse_jax(U: Array) -> Array:
    import jax
    import jax.numpy as jnp

    eye = jnp.broadcast_to(jnp.eye(U.shape[-1], dtype=U.dtype), U.shape)
    return jax.lax.linalg.triangular_solve(U, eye, left_side=True, lower=False)


# the compact-WY T factor ------------------------------------------------------------------------------
# T = (I + M)⁻¹·diag(τ) with M = diag(τ)·striu(G), G = VᵀV (linalg.householder._compact_wy): one unit
# triangular solve that reads only the strict upper triangle of diag(τ)·G, so neither the triu nor the
# identity of I + M is formed (torch: 3 operations where T⁻¹ = diag(1/τ) + striu(G) and its masks took 14).


@register_fast_path("t_factor", "torch")
def _t_factor_torch(G: Array, tau: Array) -> Array:
    import torch

    return torch.linalg.solve_triangular(tau[..., :, None] * G, torch.diag_embed(tau), upper=True, unitriangular=True)


@register_fast_path("t_factor", "jax")
def _t_factor_jax(G: Array, tau: Array) -> Array:
    import jax
    import jax.numpy as jnp

    diag = tau[..., None, :] * jnp.eye(G.shape[-1], dtype=G.dtype)
    return jax.lax.linalg.triangular_solve(tau[..., :, None] * G, diag, left_side=True, lower=False, unit_diagonal=True)


def t_factor(G: Array, tau: Array, xp: Namespace) -> Array | None:
    """T = (I + diag(τ)·striu(G))⁻¹·diag(τ) by the backend's unit triangular solve, or None without one."""
    native = fast_path("t_factor", xp)
    return None if native is None else native(G, tau)


# solve and inverse without a host check ------------------------------------------------------------
# torch's linalg.solve and linalg.inv read LAPACK's/cuSOLVER's ``info`` back to the host to raise on a
# singular matrix: on a GPU a synchronisation in every call. Their ``_ex`` forms leave ``info`` on the
# device; a singular matrix then gives non-finite entries, which a step's non-finite policy skips (NumPy
# raises, JAX and CuPy return non-finite values as well).


@register_fast_path("solve", "torch")
def _solve_torch(A: Array, B: Array) -> Array:
    import torch

    return torch.linalg.solve_ex(A, B)[0]


@register_fast_path("inv", "torch")
def _inv_torch(A: Array) -> Array:
    import torch

    return torch.linalg.inv_ex(A)[0]


def solve(A: Array, B: Array, xp: Namespace) -> Array:
    """X with A X = B (A (..., n, n), B (..., n, k)) without waiting for the device to check A."""
    native = fast_path("solve", xp)
    return xp.linalg.solve(A, B) if native is None else native(A, B)


def inv(A: Array, xp: Namespace) -> Array:
    """A⁻¹ (A (..., n, n)) without waiting for the device to check A; a float16/bfloat16 A is inverted in
    float32 and the inverse rounded back (no backend has a half-precision inverse)."""
    half = A.dtype if dtype_name(A.dtype) in ("float16", "bfloat16") else None
    if half is not None:
        A = xp.astype(A, xp.float32)
    native = fast_path("inv", xp)
    out = xp.linalg.inv(A) if native is None else native(A)
    return out if half is None else xp.astype(out, half)


# C + α·A@B ---------------------------------------------------------------------------------------
# torch's addmm/baddbmm add the product into C inside the GEMM (β = 1): one N×n pass and one
# temporary fewer than A@B followed by an addition (one thread, float32: 4096×128·128×128 with the
# subtraction 1.51 ms → 1.45 ms, 1024×64·64×64 101 µs → 94 µs).
# NumPy exposes no GEMM with β, and XLA fuses the addition by itself.


@register_fast_path("addmm", "torch")
def _addmm_torch(C: Array, A: Array, B: Array, alpha: float) -> Array:
    import torch

    if C.ndim == A.ndim == B.ndim == 2:
        return torch.addmm(C, A, B, alpha=alpha)
    if (
        C.ndim == A.ndim == B.ndim == 3
        and C.shape[0] == A.shape[0] == B.shape[0]
        and C.shape[1] == A.shape[1]
        and C.shape[2] == B.shape[2]
    ):
        # the common batched case as it is: the general route's views and shape checks below cost 30 µs
        # a call, six times the GEMM of a batch of small frames
        return torch.baddbmm(C, A, B, alpha=alpha)
    # torch.broadcast_shapes is Python (15–35 µs a call): the common equal-batch case first
    batch = A.shape[:-2] if A.shape[:-2] == B.shape[:-2] else torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    shape = (*batch, A.shape[-2], B.shape[-1])
    if tuple(C.shape) != shape or not batch:
        return NotImplemented
    size = math.prod(batch)  # not -1: a dimension of size 0 would leave it ambiguous
    A3 = A.expand(*batch, *A.shape[-2:]).reshape(size, *A.shape[-2:])
    B3 = B.expand(*batch, *B.shape[-2:]).reshape(size, *B.shape[-2:])
    return torch.baddbmm(C.reshape(size, *shape[-2:]), A3, B3, alpha=alpha).reshape(shape)


def addmm(C: Array, A: Array, B: Array, xp: Namespace, *, alpha: float = 1.0) -> Array:
    """C + α·(A @ B), with the addition inside the GEMM where the backend has one (torch).

    ``C`` has the shape of the (broadcast) product; ``alpha`` is a Python float.
    """
    native = fast_path("addmm", xp)
    if native is not None:
        out = native(C, A, B, alpha)
        if out is not NotImplemented:
            return out
    if alpha == 1.0:
        return C + A @ B
    if alpha == -1.0:
        return C - A @ B
    return C + alpha * (A @ B)


# P + c·I ------------------------------------------------------------------------------------------
# torch.add(P, I, alpha=c) is one operation instead of two (c·I, then the sum); c·I is exact (its entries
# are c and 0), so any rounding of the fused form is that of the sum alone: the same bits on every backend.


@register_fast_path("plus_identity", "torch")
def _plus_identity_torch(P: Array, c: float, eye: Array) -> Array:
    import torch

    return torch.add(P, eye, alpha=c)


def plus_identity(P: Array, c: float, eye: Array, xp: Namespace) -> Array:
    """P + c·I for a Python float c and ``eye`` the identity (unbatched: it broadcasts over P's batch)."""
    native = fast_path("plus_identity", xp)
    if native is not None:
        return native(P, c, eye)
    return P + c * eye


# A @ B for batches of small tall products -------------------------------------------------------
# torch's CPU bmm makes one GEMM call per matrix; for a tall (m ≫ n) small product whose A is
# column-major (the packed Householder section's lifts are: LAPACK's layout) the transposed product
# Bᵀ Aᵀ, on row-major views, is the faster call: (336, 42, 7) @ (336, 7, 7) float32, one thread, torch
# 2.13: 52–64 µs as A @ B, 42–43 µs as (Bᵀ Aᵀ)ᵀ. For a row-major A the same trick turns both operands
# into transposed views, which torch's CPU bmm multiplies 10–20× slower (1,014 µs against A @ B's 53 µs;
# (336, 14, 14) @ (336, 14, 7): 411 µs against 39 µs): so the layout decides, not the shape alone.
# Single 2-D products and wide or square ones gain nothing (4096×128·128×128: 1.40 ms and 1.54 ms),
# and cuBLAS takes transposed operands as flags, so only batched tall small ones on the CPU are
# considered.


@register_fast_path("matmul", "torch")
def _matmul_torch(A: Array, B: Array) -> Array:
    if A.ndim < 3 or B.ndim < 2 or B.shape[-1] > 32 or A.shape[-2] < 2 * B.shape[-1] or A.device.type != "cpu":
        return A @ B
    if A.stride(-2) != 1:  # not column-major: the plain product is the fast one
        return A @ B
    return (B.mT @ A.mT).mT


def matmul(A: Array, B: Array, xp: Namespace) -> Array:
    """A @ B, for a batch of small tall products computed as (Bᵀ Aᵀ)ᵀ where that is faster (torch on the CPU,
    a column-major A: the result is then a transposed view)."""
    native = fast_path("matmul", xp)
    return A @ B if native is None else native(A, B)


# a² − BᵀB for a skew a: the retraction kernel's lower block --------------------------------------------
# torch's CPU bmm runs a batched product with k·k·k < 400 (a k×k square, k ≤ 7) unblocked, one matrix at
# a time: the ViT step's (336, 7, 7)² took 137 µs, as long as the (336, 7, 42)·(336, 42, 7) Gram product
# beside it. For a skew a, a² − BᵀB = −[a; B]ᵀ[a; B] is one product over all N rows; assembled transposed
# (B arrives column-major from the lift) it took 0.16 ms against 0.25 ms (timeit, one thread). Not
# elsewhere: NumPy took 213 µs against 174 µs; a single tall frame (St(1024, 64)) took 3% more per step
# (benchmarks/ab_step.py, three runs), 8 frames of St(16, 4) gained nothing.


@register_fast_path("skew_square_minus_gram", "torch")
def _skew_square_minus_gram_torch(a: Array, B: Array) -> Array | None:
    k = a.shape[-1]
    if k > 7 or a.ndim < 3 or math.prod(a.shape[:-2]) < 16 or a.device.type != "cpu":
        return None
    import torch

    stacked_t = torch.cat([a.mT, B.mT], dim=-1)
    return -(stacked_t @ stacked_t.mT)


def skew_square_minus_gram(a: Array, B: Array, xp: Namespace) -> Array:
    """a² − BᵀB for a skew a (..., k, k) and B (..., m, k): the lower block c of the retraction kernel's X
    (:func:`geoarray.manifolds.retraction.retract_e`), by the cheaper route for the backend and shape."""
    native = fast_path("skew_square_minus_gram", xp)
    if native is not None:
        out = native(a, B)
        if out is not None:
            return out
    return a @ a - xp.matrix_transpose(B) @ B


# Consecutive pieces of a vector ---------------------------------------------------------------------
# torch.split returns all the views in one call (the optimizers unpack a raveled group of many
# Euclidean leaves at every step: 17 slices cost about twice as much).


@register_fast_path("split", "torch")
def _split_torch(x: Array, sizes: list[int]) -> list:
    import torch

    return list(torch.split(x, sizes))


def split(x: Array, sizes: list[int], xp: Namespace) -> list:
    """The consecutive pieces of the 1-d array ``x`` of lengths ``sizes`` (which sum to its length)."""
    native = fast_path("split", xp)
    if native is not None:
        return native(x, sizes)
    out, offset = [], 0
    for size in sizes:
        out.append(x[offset : offset + size])
        offset += size
    return out


# A compiled step's points in the layout they came in -------------------------------------------------------
# dynamo guards on its inputs' strides, and a step does not keep them: torch.linalg.qr returns Q column-major
# (Stiefel.random's points), the compact-WY section's products return row-major points, the packed section's
# ormqr column-major ones. A compiled opt.update whose first point came in one layout and left in the other
# compiled the whole step again at its second call (an Adam step on 4 × Stiefel(49, 7) with inductor: 11.9 s,
# then 3.5 s more). Eager steps return what they compute: a layout costs them nothing, and a copy would.


def in_layouts_of(new: list, old: list) -> list:
    """The arrays ``new`` (a step's points), each in the memory layout of the same-shaped ``old[i]`` (its
    input) while ``torch.compile`` traces the step, so that the compiled step's outputs fit the strides it
    was traced for and the next call reuses it; ``new`` as it is elsewhere (eager, and every other backend)."""
    if not is_compiling():
        return new
    import torch

    return [
        n if n.shape != o.shape or n.stride() == o.stride() else torch.empty_like(o).copy_(n)
        for n, o in zip(new, old, strict=True)
    ]


# The identity ---------------------------------------------------------------------------------------
# torch.eye is one operation; array_api_compat's eye for torch is three (zeros, diagonal, fill_), and a
# step builds a few identities.


# Under torch.compile an identity of a few rows is a stored constant, not torch.eye: inductor spells eye as
# a comparison of loop indices, which keeps every loop that adds it to a batch of small matrices
# (φ₁'s Taylor chunks, the retraction kernel's X) three-dimensional, with masked loads of 7 or 14
# entries; loaded from memory by its flat index, the batch runs as one contiguous vectorized loop
# (336 × 14×14, one thread: two such chunks 89 → 36 µs per call).
_EYE_AS_CONSTANT_BELOW = 33


@register_fast_path("eye", "torch")
def _eye_torch(n: int, m: int | None, like: Array) -> Array:
    import torch

    m = n if m is None else m
    if is_compiling() and n < _EYE_AS_CONSTANT_BELOW and m < _EYE_AS_CONSTANT_BELOW:
        # row-major, the ones lie m + 1 entries apart: a 1 and m zeros, min(n, m) times, cut or padded
        # to n·m (list arithmetic: dynamo traces a few instructions, where a comprehension traced n·m
        # iterations)
        k = min(n, m)
        flat = (([1.0] + [0.0] * m) * k)[: n * m]
        flat = flat + [0.0] * (n * m - len(flat))
        return torch.tensor(flat, dtype=like.dtype, device=like.device).reshape(n, m)
    return torch.eye(n, m, dtype=like.dtype, device=like.device)


def eye(n: int, m: int | None, like: Array, xp: Namespace) -> Array:
    """The n×m identity with the dtype and device of ``like``."""
    native = fast_path("eye", xp)
    if native is not None:
        return native(n, m, like)
    return xp.eye(n, m, dtype=like.dtype, device=device(like))


# a + w·(b − a) -----------------------------------------------------------------------------------
# torch.lerp is one pass and one temporary instead of three (sub, mul, add); on a 4096×128 momentum
# buffer the EMA and Nesterov updates of Muon take two passes instead of five. It is also the form
# torch.optim.Muon uses (buf.lerp_(g, 1 − μ), g.lerp(buf, μ)).


@register_fast_path("lerp", "torch")
def _lerp_torch(a: Array, b: Array, weight: Any) -> Array:
    import torch

    # compiled, inductor spells a lerp by an array weight as two formulas and a select per entry
    # (exact at both ends); a + w·(b − a) fuses into the loop around it as one multiply-add
    if a.shape != b.shape or (is_compiling() and isinstance(weight, torch.Tensor)):
        return NotImplemented
    return torch.lerp(a, b, weight)


def lerp(a: Array, b: Array, weight: Any, xp: Namespace) -> Array:
    """a + weight·(b − a) for a Python float or 0-d array ``weight`` of a's dtype (one fused pass where
    the backend has it: torch)."""
    native = fast_path("lerp", xp)
    if native is not None:
        out = native(a, b, weight)
        if out is not NotImplemented:
            return out
    return a + weight * (b - a)


# where(c, a, b) of two arrays of one dtype ---------------------------------------------------------------
# array_api_compat's torch.where first aligns the dtypes of its operands by the array API's promotion rules
# (several Python calls); with one dtype on both sides there is nothing to align, and under torch.compile those
# calls were ~100 traced instructions per where (the non-finite policy selects every state array by one).


def where(condition: Array, a: Array, b: Array, xp: Namespace) -> Array:
    """``xp.where(condition, a, b)`` for arrays a and b (a where true, else b): one operation on torch when a
    and b share a dtype."""
    if is_torch(xp) and a.dtype == b.dtype:
        import torch

        return torch.where(condition, a, b)
    return xp.where(condition, a, b)


# In-place updates of arrays the caller owns ---------------------------------------------------------
# A transform handed its state (``update(..., donate=True)``) writes its moments where they are, as
# torch.optim does, instead of allocating new ones that the wrapper then copies back: at GPT-2 small's
# Q/K/V (a piece of 36 × St(768, 64), float32, one thread) each fresh 6.5 MB temporary of the elementwise
# phase cost 1–6 ms (the pages faulted in anew whenever glibc had returned them to the system) against
# 0.3 ms for the same pass over memory in use. The generic versions use the array API's in-place
# operators (NumPy, CuPy, array-api-strict); JAX never donates (its arrays are immutable). Each returns
# the array it wrote.


def lerp_(a: Array, b: Array, weight: Any, xp: Namespace) -> Array:
    """a ← a + weight·(b − a) in place (torch: ``lerp_``, one pass); returns a (on JAX a new array)."""
    if is_torch(xp) and not is_compiling():
        return a.lerp_(b, weight)
    a += weight * (b - a)
    return a


def scale_add_square(v: Array, scale: Any, weight: Any, g: Array, xp: Namespace) -> Array:
    """scale·v + weight·g⊙g as a new array, rounded as :func:`scale_add_square_` rounds it (torch: the
    multiply-add of ``addcmul``, torch.optim.Adam's second moment)."""
    if is_torch(xp) and not is_compiling() and isinstance(weight, (int, float)):
        import torch

        return torch.addcmul(v * scale, g, g, value=weight)
    return scale * v + weight * (g * g)


def scale_add_square_(v: Array, scale: Any, weight: Any, g: Array, xp: Namespace) -> Array:
    """v ← scale·v + weight·g⊙g in place (torch: ``mul_`` then ``addcmul_``, torch.optim.Adam's two
    passes); returns v."""
    if is_torch(xp) and not is_compiling() and isinstance(weight, (int, float)):
        return v.mul_(scale).addcmul_(g, g, value=weight)
    v *= scale
    v += weight * (g * g)
    return v


def sqrt_(x: Array, xp: Namespace) -> Array:
    """√x in place (torch ``sqrt_``, NumPy and CuPy ``out=``, array-api-strict through a temporary); a new
    array on JAX: use the returned array."""
    if is_torch(xp) and not is_compiling():
        return x.sqrt_()
    name = backend_name(xp)
    if name in ("numpy", "cupy"):
        return xp.sqrt(x, out=x)
    if not writable(xp):
        return xp.sqrt(x)
    x[...] = xp.sqrt(x)
    return x


def divide_into(out: Array, a: Array, b: Any, xp: Namespace) -> Array:
    """out ← a / b elementwise, written into ``out`` (which may be ``a`` or ``b`` itself; torch, NumPy and
    CuPy: ``out=``, no temporary); returns out."""
    return _into("divide", out, a, b, xp)


def add_into(out: Array, a: Array, b: Any, xp: Namespace) -> Array:
    """out ← a + b elementwise, written into ``out`` (as :func:`divide_into`); returns out."""
    return _into("add", out, a, b, xp)


def _into(name: str, out: Array, a: Array, b: Any, xp: Namespace) -> Array:
    if is_torch(xp) and not is_compiling():
        import torch

        return getattr(torch, name)(a, b, out=out)
    if backend_name(xp) in ("numpy", "cupy"):
        return getattr(xp, name)(a, b, out=out)
    value = a / b if name == "divide" else a + b
    if not writable(xp):  # JAX: nothing to write into, the value is the result
        return value
    out[...] = value
    return out


def addmm_(C: Array, A: Array, B: Array, xp: Namespace, *, alpha: float = 1.0) -> Array:
    """C ← C + α·(A @ B) in place, for a C that the caller owns and that no operand aliases (torch: the
    GEMM accumulates into C, ``baddbmm_``/``addmm_``; elsewhere C += α·(A @ B)); returns C."""
    if is_torch(xp) and not is_compiling() and C.ndim == A.ndim == B.ndim and C.ndim in (2, 3):
        if C.ndim == 2:
            return C.addmm_(A, B, alpha=alpha)
        if C.shape[0] == A.shape[0] == B.shape[0]:
            return C.baddbmm_(A, B, alpha=alpha)
    if alpha == -1.0:
        C -= A @ B
    else:
        C += alpha * (A @ B) if alpha != 1.0 else A @ B
    return C


def addmm_into(out: Array, C: Array, A: Array, B: Array, xp: Namespace, *, alpha: float = 1.0) -> Array:
    """out ← C + α·(A @ B), written into ``out`` (an array the caller owns, of the product's shape and
    dtype, which no operand overlaps unless it is read before ``out`` is written: torch's GEMM writes
    ``out`` directly, ``baddbmm(out=)``, with no temporary of the product's size); returns out."""
    if is_torch(xp) and not is_compiling() and C.shape == out.shape and C.ndim == A.ndim == B.ndim == 3:
        if C.shape[0] == A.shape[0] == B.shape[0]:
            import torch

            return torch.baddbmm(C, A, B, alpha=alpha, out=out)
    if not writable(xp):
        return addmm(C, A, B, xp, alpha=alpha)
    out[...] = addmm(C, A, B, xp, alpha=alpha)
    return out


def matmul_into(out: Array, A: Array, B: Array, xp: Namespace) -> Array:
    """out ← A @ B, written into ``out`` (the caller's array of the product's shape and dtype, overlapping
    neither operand; torch: ``matmul(out=)``, no temporary of the product's size); returns out."""
    if is_torch(xp) and not is_compiling() and A.ndim == B.ndim == out.ndim:
        import torch

        return torch.matmul(A, B, out=out)
    if not writable(xp):
        return A @ B
    out[...] = A @ B
    return out


# sign(x) with NaN propagated -----------------------------------------------------------------------
# torch.sign(NaN) is 0; array-api-compat's torch sign mends that by assigning NaN through a boolean
# mask, which on a GPU is a nonzero() whose count the host waits for (a synchronisation in every step
# that builds a Householder section). A where does the same on the device.


@register_fast_path("sign", "torch")
def _sign_torch(x: Array) -> Array:
    import torch

    out = torch.sign(x)
    return torch.where(torch.isnan(x), x, out) if x.dtype.is_floating_point else out


@register_fast_path("sign", "cupy")
def _sign_cupy(x: Array) -> Array:
    import cupy

    out = cupy.sign(x)  # CuPy's sign maps NaN to 0; array-api-compat restores it through a boolean mask
    return cupy.where(cupy.isnan(x), x, out) if x.dtype.kind == "f" else out


def sign(x: Array, xp: Namespace) -> Array:
    """The array API's sign(x) (−1, 0, +1; NaN for NaN), without a host synchronisation on any device."""
    native = fast_path("sign", xp)
    if native is not None:
        return native(x)
    return xp.sign(x)


# clip ----------------------------------------------------------------------------------------------
# array-api-compat's clip for CuPy copies the clipped entries through boolean masks: a data-dependent
# shape, for which the host waits on the GPU. CuPy's own maximum/minimum do it in one pass on the device.


@register_fast_path("clip", "cupy")
def _clip_cupy(x: Array, min: float | None, max: float | None) -> Array:
    import cupy

    out = x if min is None else cupy.maximum(x, min)
    return out if max is None else cupy.minimum(out, max)


def clip(x: Array, xp: Namespace, *, min: float | None = None, max: float | None = None) -> Array:
    """The array API's ``clip(x, min, max)`` for Python-number bounds, without a host synchronisation."""
    native = fast_path("clip", xp)
    return xp.clip(x, min=min, max=max) if native is None else native(x, min, max)


# constants made from host data, once per device ---------------------------------------------------
# An array made from Python numbers (asarray) is a copy from the host; for a CUDA device torch makes that
# copy synchronously (pytorch/pytorch#120996): a synchronisation in every step that builds one. Scalars
# are made with full(), which fills on the device; small constant tables (a polynomial's coefficients)
# are filled entry by entry once per dtype and device, and kept.
_CONSTANTS: dict[tuple, Array] = {}


def _filled(values: Any, like: Array, xp: Namespace) -> Array:
    if isinstance(values, tuple):
        return xp.stack([_filled(v, like, xp) for v in values])
    return xp.full((), float(values), dtype=like.dtype, device=device(like))


def host_constant(values: Any, like: Array, xp: Namespace) -> Array:
    """``xp.asarray(values)`` with ``like``'s dtype and device (``values``: a float or nested tuples of
    floats), filled on the device without a copy from the host, once per (values, dtype, device), and
    kept. Under a trace (``jax.jit``, ``torch.compile``) it is the trace's constant, made in the trace and
    never kept (a traced array must not outlive its trace); JAX embeds it in the compiled program."""
    if is_traced(like):
        return xp.asarray(values, dtype=like.dtype, device=device(like))
    if is_jax(xp):
        return from_host(values, xp, like.dtype, device(like))
    key = (backend_name(xp), values, str(like.dtype), str(device(like)))
    out = _CONSTANTS.get(key)
    if out is None:
        out = _filled(values, like, xp)
        # made while a CUDA graph is captured, it lives in the graph's private memory pool: not kept
        if not (is_torch(xp) and like.is_cuda and _torch_capturing()):
            _CONSTANTS[key] = out
    return out


def _torch_capturing() -> bool:
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


# ‖X‖₁ = max_j Σᵢ |xᵢⱼ| per matrix -----------------------------------------------------------------
# NumPy reduces a short axis slowly (one inner loop per output: 96 × 8×8 takes 18 µs); as a product
# with a row of ones the column sums are one batched matmul (7 µs).


@register_fast_path("norm1", "numpy")
def _norm1_numpy(X: Array) -> Array:
    ones = np.ones((1, X.shape[-2]), dtype=X.dtype)
    return np.max(ones @ np.abs(X), axis=(-2, -1))


@register_fast_path("norm1", "torch")
def _norm1_torch(X: Array) -> Array:
    # the same three reductions without the compat layer's wrappers (two per step, ~10 µs each);
    # torch.linalg.matrix_norm(X, ord=1) is one call but 5–9× slower on batches of small matrices
    return X.abs().sum(dim=-2).amax(dim=-1)


def norm1(X: Array, xp: Namespace) -> Array:
    """The matrix 1-norm (largest absolute column sum) of each matrix of X (..., m, k); NaN propagates."""
    native = fast_path("norm1", xp)
    if native is not None and X.shape[-2] > 0 and X.shape[-1] > 0:
        return native(X)
    return xp.max(xp.sum(xp.abs(X), axis=-2), axis=-1)


# Householder QR (LAPACK geqrf convention: H_k = I - tau_k v_k v_kᵀ, v_k[k] = 1) ----------------
# Each returns (V, tau, R) with V unit lower trapezoidal (..., N, n), tau (..., n), R (..., n, n).


def _split_geqrf(a: Array, tau: Array, xp: Namespace, *, column_major: bool = True) -> tuple[Array, Array, Array]:
    # only the top n×n block of the packed factor holds R and the reflectors' unit diagonal; the rows
    # below are the reflectors as they are (a tril/add over all N rows cost torch 1.7 ms on 4096×128)
    # LAPACK returns the factor column-major (torch's geqrf, NumPy's raw QR seen transposed): V is
    # assembled transposed, so the copy reads and writes contiguous rows, and comes out as a
    # column-major view, which the products take as it is (torch, 4096×128: 0.1 ms instead of the
    # 1.5 ms of a row-major concatenation)
    n = a.shape[-1]
    top = a[..., :n, :]
    V_top = xp.tril(top, k=-1) + eye(n, None, a, xp)
    if a.shape[-2] <= n:
        V = V_top
    elif column_major and not is_compiling() and not is_traced(a):
        # eager, the factor is ours: R copied out, the unit top block written over it, and the factor is V
        # (no N×n copy: GPT-2 small's Q/K/V, one thread, 36 × 768×64 per piece, a 7 MB pass fewer)
        R = xp.triu(top)
        a[..., :n, :] = V_top
        return a, tau, R
    elif column_major:
        mT = xp.matrix_transpose
        V = mT(xp.concat([mT(V_top), mT(a[..., n:, :])], axis=-1))
    else:  # XLA chooses layouts itself (the transposed assembly measured slower in a jitted step)
        V = xp.concat([V_top, a[..., n:, :]], axis=-2)
    return V, tau, xp.triu(top)


_TORCH_LIBRARY: Any = None  # torch's operator namespace of this package; its operators live as long as it
# named after the package: a second copy imported under another name (benchmarks/ab_step.py imports a git
# revision as geoarray_base) defines its operators in a namespace of its own instead of clashing; "_lapack"
# keeps it apart from "geoarray", where revisions before this one defined theirs with custom_op
_TORCH_OPS_NAMESPACE = __name__.partition(".")[0] + "_lapack"


def _define_torch_op(name: str, schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """``torch.ops.geoarray_lapack.<name>``: ``impl`` on every device, ``fake`` (shapes, dtypes and strides only)
    for tracing. Defined through ``torch.library.Library`` rather than ``torch.library.custom_op``: the same
    operator to ``torch.compile``, dispatched without custom_op's Python autograd layers (a call on a
    small batch costs 7.7 instead of 16.3 µs, one thread; a packed ViT step makes three)."""
    global _TORCH_LIBRARY
    import torch

    namespace = getattr(torch.ops, _TORCH_OPS_NAMESPACE)
    if hasattr(namespace, name):  # defined already (this module imported again, as by importlib.reload)
        return getattr(namespace, name).default
    if _TORCH_LIBRARY is None:
        _TORCH_LIBRARY = torch.library.Library(_TORCH_OPS_NAMESPACE, "FRAGMENT")
    _TORCH_LIBRARY.define(name + schema)
    _TORCH_LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_TORCH_OPS_NAMESPACE}::{name}", fake, lib=_TORCH_LIBRARY)
    return getattr(namespace, name).default


_TORCH_GEQRF_OP: Any = None


def torch_geqrf_op() -> Callable[..., Any]:
    """``torch.geqrf`` as an operator with a fake (shape-only) kernel: torch 2.13's geqrf has none, so
    without this wrapper torch.compile cannot trace an optimizer step and falls back to eager.
    Registered on the first eager call (an optimizer's ``init`` makes one), never while tracing."""
    global _TORCH_GEQRF_OP
    if _TORCH_GEQRF_OP is None:
        import torch

        def geqrf(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a, tau = torch.geqrf(A)
            return a.contiguous(), tau  # row-major, as the fake kernel promises

        def fake(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            k = min(A.shape[-2], A.shape[-1])
            return torch.empty_like(A, memory_format=torch.contiguous_format), A.new_empty((*A.shape[:-2], k))

        _TORCH_GEQRF_OP = _define_torch_op("geqrf", "(Tensor A) -> (Tensor, Tensor)", geqrf, fake)
    return _TORCH_GEQRF_OP


_TORCH_PACKED_OPS: Any = None


def _column_major(X: Any) -> Any:
    """X in LAPACK's batched layout (each matrix column-major, the batch outermost), copied only if not."""
    return X if X.mT.is_contiguous() else X.mT.contiguous().mT


def torch_packed_ops() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(geqrf, ormqr) of the packed Householder section as operators with fake (shape-only) kernels, so
    that ``torch.compile`` traces the packed form instead of falling back to compact WY (torch 2.13's
    geqrf has no fake kernel; its ormqr has none that inductor keeps as a library call). Both return
    LAPACK's layout, each matrix column-major as the real kernels make it, so that a factor goes from
    geqrf to ormqr without a copy. Registered on the first eager call, never while tracing."""
    global _TORCH_PACKED_OPS
    if _TORCH_PACKED_OPS is None:
        import torch

        def geqrf(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a, tau = torch.geqrf(A)
            return _column_major(a), tau

        def geqrf_fake(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            k = min(A.shape[-2], A.shape[-1])
            return A.new_empty((*A.shape[:-2], A.shape[-1], A.shape[-2])).mT, A.new_empty((*A.shape[:-2], k))

        def ormqr(a: torch.Tensor, tau: torch.Tensor, X: torch.Tensor, transpose: bool) -> torch.Tensor:
            return _column_major(torch.ormqr(a, tau, X, left=True, transpose=transpose))

        def ormqr_fake(a: torch.Tensor, tau: torch.Tensor, X: torch.Tensor, transpose: bool) -> torch.Tensor:
            return X.new_empty((*X.shape[:-2], X.shape[-1], X.shape[-2])).mT

        _TORCH_PACKED_OPS = (
            _define_torch_op("geqrf_packed", "(Tensor A) -> (Tensor, Tensor)", geqrf, geqrf_fake),
            _define_torch_op("ormqr", "(Tensor a, Tensor tau, Tensor X, bool transpose) -> Tensor", ormqr, ormqr_fake),
        )
    return _TORCH_PACKED_OPS


#: The forms of the Householder section (:func:`set_section_form`); ``"auto"`` lets
#: ``householder_section_form`` choose by backend, device and shape.
SECTION_FORMS = ("auto", "compact-wy", "reconstructed", "packed", "block-reflector")
_section_form = ["auto"]


def set_section_form(form: str) -> str:
    """Set the form in which optimizers build and apply the Householder section of Stiefel and Grassmann
    points (the same section to rounding in every form); returns the previous setting.

    * ``"auto"`` (the default): the form measured cheapest for the backend, device and shape
      (``geoarray._backend.householder_section_form``);
    * ``"compact-wy"``: a Householder QR of Y (geqrf), Q = I − V T Vᵀ;
    * ``"reconstructed"``: the same V and T rebuilt from Y's orthonormality by an n×n LU;
    * ``"packed"``: LAPACK's packed reflectors applied by ormqr (torch on the CPU only);
    * ``"block-reflector"``: Q = I − W M Wᵀ with W = Y − E·S, built and applied with matrix products and
      elementwise operations only (:func:`geoarray.linalg.householder_block_reflector`): no QR, LU or
      triangular solve, for accelerators whose batched QR of many small frames is slow.

    A jitted or compiled step keeps the form it was traced with."""
    if form not in SECTION_FORMS:
        raise ValueError(f"section form must be one of {', '.join(map(repr, SECTION_FORMS))}, got {form!r}")
    previous = _section_form[0]
    _section_form[0] = form
    return previous


def get_section_form() -> str:
    """The current section form setting (:func:`set_section_form`)."""
    return _section_form[0]


def householder_section_form(shape: tuple[int, ...], xp: Any, device: Any = None) -> str:
    """Which form of the Householder section of a point of ``shape`` (..., N, n) on ``device`` (default:
    the CPU) a step uses: the one :func:`set_section_form` sets, or by default (``"auto"``) the one
    measured cheaper here:

    * ``"packed"`` — torch on the CPU, a batch of ≥ 16 frames with n ≤ 32: the reflectors as
      LAPACK packs them, applied by ormqr (one call per application), eager or under ``torch.compile``
      (through :func:`torch_packed_ops`, registered by an earlier eager call). Not on a GPU, where its
      cost grows with the number of frames as if they were applied one by one (measured on an H200 with
      this form: 336 × Stiefel(49, 7) batched took 20.2 ms per step captured in a CUDA graph, the ViT
      set as 369 separate leaves 20.6 ms, torch's Adam 0.18 ms);
    * ``"block-reflector"`` — Q = I − W M Wᵀ from matrix products only, an n×n LU in elementwise steps
      instead of the N×n QR, where that is cheaper:

      - NumPy, tall frames (N ≥ 8n) with batch·N·n ≥ 2¹⁷ entries. NumPy's QR runs in float64 whatever the
        input and its LAPACK is slower than torch's (``benchmarks/section_forms.py --backends numpy``, one
        thread; the section's use, block reflector ÷ compact WY, float32 / float64): GPT-2 small's
        36 × St(768, 64) 0.59–0.63 / 0.94, St(4096, 128) 0.27–0.30, St(4096, 32) 0.58 / 0.70, St(2048, 64)
        0.64 / 0.81, 64 × St(256, 16) 0.79 / 0.92; below the rule St(1024, 32) 1.11 / 1.12, St(512, 64)
        1.42 / 1.46, 16 × St(128, 32) 1.51 / 1.70, the ViT's 336 × St(49, 7) 1.19–1.26 / 1.23, St(512, 128)
        1.38 / 1.70;
      - JAX, tall frames with 32 ≤ n ≤ 128 and N ≥ 12n, of batch·N·n ≥ 2¹⁸ entries. A whole jitted Adam
        step (``--whole-step``, one thread, two runs; Intel Xeon): 0.66–0.73× compact WY's at 4096×128 and
        0.80–0.82× at 2048×128, where the reconstruction (``"reconstructed"``, the rule's choice for few
        frames before) took 0.72–0.77× and 0.88–0.91×; GPT-2 small's twelve stacks of 36 × St(768, 64)
        (``transformer_step.py --backends jax --section-form``, three runs each, alternating) 695–718 ms
        against 759–791 ms (0.88–0.95×; one group of all 432 frames 1.01×). Outside the rule: 1.01–1.13×
        at 512×32 and 0.96–1.03× at 1024×64 (below 2¹⁸ entries), 1.35× at 2048×256 and 1.40× at 1536×192
        (n large: n elimination steps and n³ work per frame), 1.73× for the ViT's use (n = 7);
    * ``"compact-wy"`` — everywhere else: its products are faster for single large frames (one
      1024×64 frame: ormqr 0.57 ms against 0.22 ms for the WY products), and it traces under
      ``torch.compile`` and ``jax.jit``.

    torch never picks the block reflector (made for accelerators) by itself: on the CPU its n sequential
    elimination steps cost more than LAPACK's QR (the section's use 1.10× compact WY's at GPT-2 small's 432 ×
    St(768, 64) on torch eager, 1.9× on the ViT set, 4.5× on one St(1024, 64), 1.4× on one St(4096, 128)),
    and it has not yet been timed on a GPU (``.ci/gpu`` times it). ``"reconstructed"`` (compact WY with the
    reflectors rebuilt from Y's orthonormality by an n×n LU) stays available through :func:`set_section_form`.

    On eager torch this also registers the traceable operators (:func:`torch_geqrf_op`,
    :func:`torch_packed_ops`), so that a later ``torch.compile`` of the same step finds them.
    """
    chosen = _section_form[0]
    if chosen == "packed":
        if not is_torch(xp):
            raise ValueError(
                f"section form 'packed' is torch's (LAPACK's ormqr), not available on {backend_name(xp)}; "
                "choose another with geoarray.set_section_form, or 'auto'"
            )
        if not is_compiling():
            torch_packed_ops()
        return chosen
    if chosen != "auto":
        return chosen
    batch = math.prod(shape[:-2])
    N, n = shape[-2], shape[-1]
    if is_torch(xp):
        compiling = is_compiling()
        if not compiling:
            torch_geqrf_op()
            torch_packed_ops()
        on_cpu = device is None or getattr(device, "type", device) == "cpu"
        traceable = not compiling or _TORCH_PACKED_OPS is not None
        if on_cpu and traceable and len(shape) >= 3 and batch >= 16 and n <= 32:
            return "packed"
    if is_jax(xp) and 32 <= n <= 128 and N >= 12 * n and batch * N * n >= 2**18:
        return "block-reflector"
    if is_numpy(xp) and N >= 8 * n and batch * N * n >= 2**17:
        return "block-reflector"
    return "compact-wy"


def torch_packed_qr(A: Array) -> tuple[Array, Array]:
    """LAPACK's geqrf factor (R on and above the diagonal, reflectors below) and τ, unsplit (torch)."""
    import torch

    if is_compiling():
        return torch_packed_ops()[0](A)
    return torch.geqrf(A)


def torch_apply_packed_q(a: Array, tau: Array, X: Array, transpose: bool) -> Array:
    """Q X (or Qᵀ X) for the packed reflectors of :func:`torch_packed_qr`, by LAPACK's ormqr (torch);
    ``a`` and ``tau`` are broadcast to X's batch shape (ormqr does not broadcast)."""
    import torch

    batch = X.shape[:-2]
    if a.shape[:-2] != batch:
        a = a.expand(*batch, *a.shape[-2:])
        tau = tau.expand(*batch, tau.shape[-1])
    if is_compiling():
        return torch_packed_ops()[1](a, tau, X, transpose)
    return torch.ormqr(a, tau, X, left=True, transpose=transpose)


@register_fast_path("geqrf", "torch")
def _geqrf_torch(A: Array) -> tuple[Array, Array, Array]:
    import torch

    if is_compiling():
        if _TORCH_GEQRF_OP is None:
            raise RuntimeError("call the optimizer's init (or any eager step) before compiling its update")
        a, tau = _TORCH_GEQRF_OP(A)
    else:
        torch_geqrf_op()  # register the traceable operator while eager
        a, tau = torch.geqrf(A)
    return _split_geqrf(a, tau, array_namespace(a))


@functools.cache
def _numpy_has_stacked_raw_qr() -> bool:
    return np.lib.NumpyVersion(np.__version__) >= "2.0.0"  # parsed once: a regex, 10 µs per step


@register_fast_path("geqrf", "numpy")
def _geqrf_numpy(A: Array) -> tuple[Array, Array, Array]:
    import numpy as np

    if A.ndim > 2 and not _numpy_has_stacked_raw_qr():
        return NotImplemented
    h, tau = np.linalg.qr(A, mode="raw")
    # raw mode returns the LAPACK (Fortran-order) factor transposed: swapped back it is column-major,
    # which _split_geqrf copies row by row
    a = np.swapaxes(h, -1, -2)
    return _split_geqrf(a, tau, array_namespace(a))


@register_fast_path("geqrf", "jax")
def _geqrf_jax(A: Array) -> tuple[Array, Array, Array]:
    # XLA's geqrf (LAPACK on CPU, cuSOLVER on GPU) through the public raw mode: the generic path unrolls
    # one Householder step per column into the traced program, which made jit compiles of an optimizer
    # step take tens of seconds
    # one compiled program: eager, its eight operations would each compile for every new shape
    return compiled(_geqrf_jax_program, array_namespace(A), "xp")(A, xp=array_namespace(A))


def _geqrf_jax_program(A: Array, xp: Namespace) -> tuple[Array, Array, Array]:
    h, tau = xp.linalg.qr(A, mode="raw")  # like NumPy: the LAPACK factor, transposed
    return _split_geqrf(xp.matrix_transpose(h), tau, xp, column_major=False)
