"""geoopt's Stiefel optimizer tests, ported literally: only the migration page's substitutions.

The seven tests of geoopt (github.com/geoopt/geoopt, ``tests/test_adam.py::test_adam_stiefel`` ×2 and
``tests/test_rsgd.py::test_rsgd_stiefel`` ×4, ``tests/test_rsgd.py::test_init_manifold``) with
``geoopt.manifolds.Stiefel()`` → ``Stiefel(N, n)`` (geoarray needs the shape),
``geoopt.manifolds.Euclidean()`` → ``Euclidean()``, ``geoopt.ManifoldParameter`` →
``geoarray.torch.ManifoldParameter``, ``geoopt.optim.RiemannianAdam``/``RiemannianSGD`` →
``geoarray.torch.Adam``/``SGD`` (same arguments, ``stabilize`` included); everything else as geoopt
has it: float32, the 100·‖XᵀX − I‖² penalty, geoopt's rates, its 10,000-step budget, its tolerance
(``assert_allclose(atol=1e-5)``), the state-dict round trip and the step after it.

Measured (torch 2.13 CPU, float32; geoopt 0.5.1 on the same problem for comparison): 5 of 7 pass as
they are — Adam lr=1e-2 in 277 steps (geoopt: 4,500, where its ``stabilize=4500`` projection ends it),
SGD in 701 / 556 / 571 / 662 steps. Two fail literally and are marked ``xfail(strict=True)``, each with
the one documented change that makes it pass beside it:

* Adam ``lr=1, amsgrad=True``: geoarray's Adam keeps one second moment per coordinate of g^hor (as torch
  does per entry), geoopt's one per matrix, so a geoarray step is ≈ η·√d long, d = dim St(20, 10) = 145:
  at geoopt's η = 1 it never converges (after 10,000 steps ‖X − X*‖ = 3.94, the best 2.99; without the
  penalty the same: 3.75 after 2,000 steps, so the penalty is not the cause — on the manifold its
  gradient 400·X(XᵀX − I) is rounding). The page's rule η/√d = 0.083 passes in 241 steps.
* ``test_init_manifold``: geoopt checks that ``stabilize=1`` projected p0 by ``not allclose(p0, p0_old)``,
  which only SVD rounding can satisfy (p0 is already orthogonal; geoopt moves it by 4.8e-7). In geoarray
  ``opt.zero_grad()`` leaves the gradients None (torch ≥ 2.0), a parameter without a gradient is neither
  stepped nor projected (as torch's optimizers skip it), so p0 is kept bit for bit; with zero gradients
  (``zero_grad(set_to_none=False)``) the projection moves it by 1.8e-7, inside ``allclose``'s rtol 1e-5.
  The change: assert that p0 is kept bit for bit; geoopt's other assertions unchanged.

The literal Adam-amsgrad test runs 300 of geoopt's 10,000 steps by default (a step costs milliseconds;
the full budget is minutes on a loaded 2-core CI machine) — ``GEOARRAY_GEOOPT_PORT=full`` runs all
10,000. Torch sessions only (skipped elsewhere with that reason), on the CPU, as geoopt's tests run.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from geoarray import Euclidean, Stiefel

# geoopt's tests run under torch's own default dtype, float32 (the torch session sets float64)
pytestmark = pytest.mark.usefixtures("torch_only", "torch_default_float32")


# the literal amsgrad test: geoopt's 10,000-step budget on request, else enough to show it does not converge
AMSGRAD_BUDGET = 10000 if os.environ.get("GEOARRAY_GEOOPT_PORT") == "full" else 300
# the page's rule for geoopt's rates: η_geoarray = η_geoopt / √d, d = dim St(20, 10) = 20·10 − 10·11/2
D_STIEFEL_20_10 = 20 * 10 - 10 * 11 // 2

_AMSGRAD_REASON = (
    "geoarray's Adam at geoopt's lr=1 with amsgrad does not converge: ‖X − X*‖ = 3.94 after 10,000 steps "
    "(best 2.99; tolerance 1e-5): geoarray's second moment is per coordinate of g^hor (torch's convention), "
    "geoopt's per matrix, so a step is ≈ lr·√145 long; the penalty is not the cause (3.75 without it)"
)
_INIT_REASON = (
    "geoopt asserts that stabilize=1 moved an already orthogonal p0 (SVD rounding, 4.8e-7 in geoopt); "
    "geoarray neither steps nor projects a parameter whose grad is None (zero_grad() sets None), so p0 is "
    "kept bit for bit (with zero grads the projection moves it 1.8e-7, inside allclose)"
)


def _adam_stiefel(torch, gt, params, budget=10000):
    """geoopt's test_adam_stiefel, with the page's substitutions."""
    stiefel = Stiefel(20, 10)
    torch.manual_seed(42)
    with torch.no_grad():
        X = gt.ManifoldParameter(torch.randn(20, 10), manifold=stiefel).proj_()
    Xstar = torch.randn(20, 10)
    Xstar.set_(stiefel.projx(Xstar))

    def closure():
        optim.zero_grad()
        loss = (X - Xstar).pow(2).sum()
        # manifold constraint that makes optimization hard if violated
        loss += (X.t() @ X - torch.eye(X.shape[1])).pow(2).sum() * 100
        loss.backward()
        return loss.item()

    optim = gt.Adam([dict(params=[X], stabilize=4500)], **params)
    assert optim.param_groups[0]["stabilize"] == 4500
    assert (X - Xstar).norm() > 1e-5
    for _ in range(budget):
        if (X - Xstar).norm() < 1e-5:
            break
        optim.step(closure)
    assert X.is_contiguous()
    np.testing.assert_allclose(X.data, Xstar, atol=1e-5, rtol=1e-5)
    optim.load_state_dict(optim.state_dict())
    optim.step(closure)


def test_adam_stiefel_lr_1e_2(torch, gt):
    """geoopt's test_adam_stiefel[lr=1e-2], literal: passes (277 steps)."""
    _adam_stiefel(torch, gt, dict(lr=1e-2))


@pytest.mark.xfail(strict=True, reason=_AMSGRAD_REASON)
def test_adam_stiefel_lr_1_amsgrad(torch, gt):
    """geoopt's test_adam_stiefel[lr=1, amsgrad=True], literal (budget: module docstring): fails."""
    _adam_stiefel(torch, gt, dict(lr=1, amsgrad=True), budget=AMSGRAD_BUDGET)


def test_adam_stiefel_lr_1_amsgrad_at_the_pages_rate(torch, gt):
    """The change: geoopt's lr=1 divided by √d (d = 145), the migration page's rule for geoopt's rates:
    lr = 0.083. Everything else literal (penalty, float32, tolerance, budget); passes in 241 steps."""
    _adam_stiefel(torch, gt, dict(lr=1 / math.sqrt(D_STIEFEL_20_10), amsgrad=True))


@pytest.mark.parametrize(
    "params",
    [
        dict(lr=1e-2),
        dict(lr=1e-3, momentum=0.9),
        dict(momentum=0.9, nesterov=True, lr=1e-3),
        dict(momentum=0.9, dampening=0.1, lr=1e-3),
    ],
    ids=["lr1e-2", "momentum", "nesterov", "dampening"],
)
def test_rsgd_stiefel(torch, gt, params):
    """geoopt's test_rsgd_stiefel, literal: passes (701 / 556 / 571 / 662 steps)."""
    stiefel = Stiefel(20, 10)
    torch.manual_seed(42)
    with torch.no_grad():
        X = gt.ManifoldParameter(torch.randn(20, 10), manifold=stiefel).proj_()
    Xstar = torch.randn(20, 10)
    Xstar.set_(stiefel.projx(Xstar))

    def closure():
        optim.zero_grad()
        loss = (X - Xstar).pow(2).sum()
        # manifold constraint that makes optimization hard if violated
        loss += (X.t() @ X - torch.eye(X.shape[1])).pow(2).sum() * 100
        loss.backward()
        return loss.item()

    optim = gt.SGD([X], **params)
    assert (X - Xstar).norm() > 1e-5
    for _ in range(10000):
        if (X - Xstar).norm() < 1e-5:
            break
        optim.step(closure)
    assert X.is_contiguous()
    np.testing.assert_allclose(X.data, Xstar, atol=1e-5)
    optim.load_state_dict(optim.state_dict())
    optim.step(closure)


def _init_manifold(torch, gt):
    torch.manual_seed(42)
    stiefel = Stiefel(10, 10)
    rn = Euclidean()
    x0 = torch.randn(10, 10)
    x1 = torch.randn(10, 10)
    with torch.no_grad():
        p0 = gt.ManifoldParameter(x0, manifold=stiefel).proj_()
    p1 = gt.ManifoldParameter(x1, manifold=rn)
    p0.grad = torch.zeros_like(p0)
    p1.grad = torch.zeros_like(p1)
    p0old = p0.clone()
    p1old = p1.clone()
    opt = gt.SGD([p0, p1], lr=1, stabilize=1)
    opt.zero_grad()
    opt.step()
    return stiefel, p0, p1, p0old, p1old


@pytest.mark.xfail(strict=True, reason=_INIT_REASON)
def test_init_manifold(torch, gt):
    """geoopt's test_init_manifold, literal: fails at ``not allclose(p0, p0old)``."""
    stiefel, p0, p1, p0old, p1old = _init_manifold(torch, gt)
    assert not np.allclose(p0.data, p0old.data)
    assert p0.is_contiguous()
    np.testing.assert_allclose(p1.data, p1old.data)
    np.testing.assert_allclose(p0.data, stiefel.projx(p0old.data), atol=1e-4)


def test_init_manifold_keeps_an_unstepped_point(torch, gt):
    """The change: geoopt's ``assert not allclose(p0, p0old)`` (p0 moved by the projection's rounding)
    becomes ``p0 == p0old`` bit for bit — geoarray steps and projects only parameters with a gradient,
    and ``zero_grad()`` left them None. geoopt's other assertions unchanged."""
    stiefel, p0, p1, p0old, p1old = _init_manifold(torch, gt)
    assert p0.grad is None and torch.equal(p0.data, p0old.data)
    assert p0.is_contiguous()
    np.testing.assert_allclose(p1.data, p1old.data)
    np.testing.assert_allclose(p0.data, stiefel.projx(p0old.data), atol=1e-4)
