"""Initialisers for orthogonal weights, with geotorch's names: ``geoarray.torch.init.torus_init_(p)``.

Like ``torch.nn.init``, each fills a tensor in place (without recording gradients) and returns it. A
tensor of two or more dimensions is a matrix or a batch of them (leading axes). What each draws, for an
``N×n`` matrix:

* :func:`uniform_init_`: Haar (uniformly) distributed orthonormal columns (QR of a Gaussian matrix, the
  columns' signs fixed by diag(R), Mezzadri, *How to generate random matrices from the classical compact
  groups*, Notices AMS 54, 2007); square matrices are then made rotations (det = +1), the first column's
  sign flipped where det = −1, which keeps the law Haar on SO(n) — geotorch's ``uniform_init_``.
* :func:`torus_init_`: the block-diagonal rotation exp(S) of a skew S with 2×2 blocks [[0, −b], [b, 0]],
  i.e. blocks [[cos b, −sin b], [sin b, cos b]] (and a 1 last for odd sizes): eigenvalues e^{±ib}, the
  angles b drawn from ``init_`` (default U(−π, π)) — geotorch's ``torus_init_``, written here in closed
  form (no matrix exponential); tall matrices take the first n columns of the N×N one, as geotorch's
  ``Stiefel.sample("torus")``. The initialisation of orthogonal recurrent kernels (Henaff, Szlam & LeCun,
  *Recurrent orthogonal networks and long-memory tasks*, ICML 2016; geotorch's copying-problem example).
* :func:`eye_init_`: the distinguished point E = first n columns of I_N (``torch.nn.init.eye_``'s matrix,
  batched), where every geoarray retraction starts; geoopt's ``Stiefel.origin``.

Wide matrices (N < n, e.g. a plain ``nn.Linear(20, 10).weight``) get orthonormal rows: the transpose of
the above, as geotorch does. A :class:`~geoarray.torch.ManifoldParameter` must live on orthonormal frames
(``Stiefel``, ``Grassmann``; a wide weight constrained by :func:`~geoarray.torch.orthogonal_` is stored as
its tall transpose, so pass ``layer.parametrizations.weight.original``, or simply the parameters of the
module: every result is a point of the manifold, to rounding: max|YᵀY − I| ≤ 1e-6 in float32, 1e-12 in
float64). Half-precision tensors are drawn in float32 and rounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..manifolds.stiefel import OrthonormalFrames
from .parameter import manifold_of

__all__ = ["eye_init_", "torus_init_", "uniform_init_"]


def _check(tensor: torch.Tensor, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.ndim < 2:
        raise ValueError(f"{name} needs a matrix or a batch of them, got shape {tuple(tensor.shape)}")
    if not tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise TypeError(f"{name} needs a real floating tensor, got {tensor.dtype}")
    m = manifold_of(tensor)
    if m is not None and not isinstance(m, OrthonormalFrames):
        raise TypeError(
            f"{name} draws orthonormal frames, but this ManifoldParameter lives on {m!r}; "
            f"use M.random(seed, xp=torch, ...) for it"
        )


def _work_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.dtype


@torch.no_grad()
def _fill(tensor: torch.Tensor, tall: Callable[[int, int, tuple[int, ...]], torch.Tensor]) -> torch.Tensor:
    """Fill ``tensor`` with ``tall(N, n, batch)`` (N ≥ n), transposed for wide tensors."""
    rows, cols = tensor.shape[-2:]
    batch = tuple(tensor.shape[:-2])
    Y = tall(rows, cols, batch) if rows >= cols else tall(cols, rows, batch).mT
    tensor.copy_(Y)
    return tensor


def uniform_init_(tensor: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill ``tensor`` with Haar-distributed orthonormal columns (rows if wide); square: a Haar rotation
    (det = +1), as geotorch's ``uniform_init_`` (module docstring). ``generator`` as in ``torch.nn.init``."""
    _check(tensor, "uniform_init_")

    def tall(N: int, n: int, batch: tuple[int, ...]) -> torch.Tensor:
        G = torch.randn((*batch, N, n), generator=generator, dtype=_work_dtype(tensor), device=tensor.device)
        Q, R = torch.linalg.qr(G)
        # signs of diag(R): Q·diag(sign) is Haar (Mezzadri 2007); sign(0) (probability 0) counts as +1
        d = torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(Q.dtype)
        Q = Q * d.unsqueeze(-2)
        if N == n:  # a rotation: flip the first column where det = −1 (an isometry of the Haar measure)
            flip = torch.where(torch.linalg.det(Q) < 0, -1.0, 1.0).to(Q.dtype)
            Q = torch.cat([Q[..., :1] * flip[..., None, None], Q[..., 1:]], dim=-1)
        return Q

    return _fill(tensor, tall)


def torus_init_(
    tensor: torch.Tensor,
    init_: Callable[[torch.Tensor], torch.Tensor] | None = None,
    triv: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Fill ``tensor`` with geotorch's torus initialisation (module docstring): the block-diagonal rotation
    with 2×2 blocks [[cos b, −sin b], [sin b, cos b]], angles b from ``init_`` (a function filling a tensor
    in place, as ``torch.nn.init.uniform_``; default U(−π, π) drawn with ``generator``), of ⌊N/2⌋ angles
    for an N×n tall matrix, whose first n columns are taken. ``triv`` (geotorch's argument: a map from
    skew to orthogonal matrices) replaces the closed-form exponential, applied to the skew block matrix."""
    _check(tensor, "torus_init_")

    def tall(N: int, n: int, batch: tuple[int, ...]) -> torch.Tensor:
        dtype = _work_dtype(tensor)
        k = N // 2
        b = torch.empty((*batch, k), dtype=dtype, device=tensor.device)
        if init_ is None:
            b.uniform_(-math.pi, math.pi, generator=generator)
        else:
            init_(b)
        idx = torch.arange(k, device=tensor.device) * 2
        if triv is not None:  # geotorch's route: the skew matrix, then the user's map
            S = torch.zeros((*batch, N, N), dtype=dtype, device=tensor.device)
            S[..., idx + 1, idx] = b
            S[..., idx, idx + 1] = -b
            R = triv(S)
        else:
            c, s = torch.cos(b), torch.sin(b)
            R = torch.zeros((*batch, N, N), dtype=dtype, device=tensor.device)
            R[..., idx, idx] = c
            R[..., idx + 1, idx + 1] = c
            R[..., idx + 1, idx] = s
            R[..., idx, idx + 1] = -s
            if N % 2:
                R[..., N - 1, N - 1] = 1
        return R[..., :n]

    return _fill(tensor, tall)


def eye_init_(tensor: torch.Tensor) -> torch.Tensor:
    """Fill ``tensor`` with E, the first n columns of the N×N identity (rows if wide; every matrix of a
    batch): ``torch.nn.init.eye_``'s matrix, the point where geoarray's retractions start."""
    _check(tensor, "eye_init_")

    def tall(N: int, n: int, batch: tuple[int, ...]) -> torch.Tensor:
        E = torch.eye(N, n, dtype=_work_dtype(tensor), device=tensor.device)
        return E.expand(*batch, N, n)

    return _fill(tensor, tall)
