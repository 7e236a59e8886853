"""geoarray.torch.init: geotorch's initialisers for orthogonal weights.

Each lands on the manifold (max|YᵀY − I| ≤ 1e-6 in float32, 1e-12 in float64), batched and for wide
(orthonormal rows) tensors too; ``torus_init_`` gives its block rotations (angles from ``init_``, spectrum
e^{±ib}); ``uniform_init_`` is Haar: for 4000 draws of SO(4) (seed 0), the mean of tr Q is 0 and of (tr Q)²
is 1 (Diaconis–Shahshahani: the moments of a standard normal, exact for n ≥ 3), the mean of every entry²
is 1/4, each within 5 standard errors; det = +1.
"""

from __future__ import annotations

import math

import pytest

import geoarray as ga

pytestmark = pytest.mark.usefixtures("torch_only")

TOL = {"float32": 1e-6, "float64": 1e-12}


def _err(torch, Y):
    Y = Y.detach().double()
    return float((Y.mT @ Y - torch.eye(Y.shape[-1], dtype=Y.dtype)).abs().max())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(5, 5), (7, 3), (2, 6, 4)])
@pytest.mark.parametrize("name", ["uniform_init_", "torus_init_", "eye_init_"])
def test_initialisers_land_on_the_manifold(torch, gt, name, shape, dtype):
    M = ga.Stiefel(*shape[-2:])
    p = gt.ManifoldParameter(M.random(0, xp=torch, batch_shape=shape[:-2], dtype=getattr(torch, dtype)), M)
    init = getattr(gt.init, name)
    kwargs = {} if name == "eye_init_" else {"generator": torch.Generator().manual_seed(1)}
    out = init(p, **kwargs)
    assert out is p and isinstance(p, gt.ManifoldParameter) and p.manifold == M
    assert _err(torch, p) <= TOL[dtype]
    wide = torch.empty(shape[:-2] + shape[-2:][::-1], dtype=getattr(torch, dtype))  # rows orthonormal
    init(wide, **kwargs)
    assert _err(torch, wide.mT) <= TOL[dtype]


def test_eye_init_is_the_distinguished_point(torch, gt):
    p = torch.empty(3, 6, 2, dtype=torch.float64)
    gt.init.eye_init_(p)
    assert torch.equal(p, torch.eye(6, 2, dtype=torch.float64).expand(3, 6, 2))


def test_torus_init_gives_block_rotations_with_the_drawn_angles(torch, gt):
    angles = torch.tensor([0.3, -1.2, 2.5], dtype=torch.float64)

    def init_(b):
        return b.copy_(angles)

    R = gt.init.torus_init_(torch.empty(7, 7, dtype=torch.float64), init_)
    for i, b in enumerate(angles.tolist()):
        block = R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2]
        expected = torch.tensor([[math.cos(b), -math.sin(b)], [math.sin(b), math.cos(b)]], dtype=torch.float64)
        assert torch.allclose(block, expected, atol=1e-15, rtol=0)
    assert R[6, 6] == 1
    mask = torch.block_diag(*[torch.ones(2, 2)] * 3, torch.ones(1, 1)).bool()
    assert torch.count_nonzero(R[~mask]) == 0  # block-diagonal: exact zeros elsewhere
    # spectrum: e^{±ib} and 1
    eig = torch.linalg.eigvals(R)
    assert torch.allclose(eig.abs(), torch.ones(7, dtype=torch.float64), atol=1e-12)
    got = sorted(abs(float(a)) for a in eig.angle())
    want = sorted([0.0] + [abs(b) for b in angles.tolist()] * 2)
    assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 1e-12
    # geotorch's route (a triv map of the skew matrix) gives the same matrix through matrix_exp
    assert torch.allclose(gt.init.torus_init_(torch.empty(7, 7, dtype=torch.float64), init_, torch.matrix_exp), R,
                          atol=1e-14)  # fmt: skip
    # default angles: U(−π, π); a tall tensor takes the first columns of the square one
    tall = gt.init.torus_init_(torch.empty(6, 3, dtype=torch.float64), generator=torch.Generator().manual_seed(0))
    sq = gt.init.torus_init_(torch.empty(6, 6, dtype=torch.float64), generator=torch.Generator().manual_seed(0))
    assert torch.equal(tall, sq[:, :3])


def test_uniform_init_is_haar_on_so_n(torch, gt):
    Q = gt.init.uniform_init_(torch.empty(4000, 4, 4, dtype=torch.float64), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(torch.linalg.det(Q), torch.ones(4000, dtype=torch.float64), atol=1e-12)
    tr = torch.diagonal(Q, dim1=-2, dim2=-1).sum(-1)
    se = 1 / math.sqrt(4000)
    # Var(tr Q) = 1 and Var((tr Q)²) = E tr⁴ − 1 ≈ 3 − 1 (the normal moments tr Q approaches) set the errors
    assert abs(float(tr.mean())) <= 5 * se
    assert abs(float(tr.square().mean()) - 1) <= 5 * math.sqrt(2) * se
    # each entry has E q² = 1/n; Var(q²) = E q⁴ − 1/n² = 3/(n(n+2)) − 1/n² = 1/48 for n = 4
    second = Q.square().mean(0)
    assert float((second - 0.25).abs().max()) <= 5 * math.sqrt(1 / 48) * se


def test_initialisers_refuse_what_they_cannot_fill(torch, gt):
    M = ga.SymplecticStiefel(4, 2)
    p = gt.ManifoldParameter(M.random(0, xp=torch), M)
    with pytest.raises(TypeError, match=r"uniform_init_ draws orthonormal frames.*SymplecticStiefel"):
        gt.init.uniform_init_(p)
    with pytest.raises(ValueError, match=r"torus_init_ needs a matrix.*\(3,\)"):
        gt.init.torus_init_(torch.empty(3))
