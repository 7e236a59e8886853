"""A ``state_dict`` that geoarray.torch wrote before its optimizers became one class with recipes resumes now.

tests/data/torch_state_v1.pt holds, for every named optimizer (``_torch_state_reference.NAMES``), its
``state_dict`` after two steps on a Stiefel(8, 3) weight and a plain matrix (float64), the weights then, and
the weights after two more steps, all written by geoarray commit 075a7f9 (``tests/_torch_state_reference.py``).
Loaded into today's optimizer of the same name (``weights_only=True``), the next two steps give those weights
to 1e-12 (another process and possibly another CPU: two computations, not one repeated), and the weight stays
on its manifold.
"""

from __future__ import annotations

import pytest
from _torch_state_reference import NAMES, PATH, problem, step

import geoarray

# torch_only, torch and gt: tests/conftest.py
pytestmark = pytest.mark.usefixtures("torch_only")


@pytest.mark.parametrize("name", NAMES)
def test_a_state_dict_written_before_resumes(torch, gt, name):
    entry = torch.load(PATH, weights_only=True)[name]
    W, b, opt, grads = problem(gt, geoarray, name)
    with torch.no_grad():
        W.copy_(entry["W"])
        b.copy_(entry["b"])
    opt.load_state_dict(entry["state_dict"])
    for t in range(2, 4):
        step(W, b, opt, grads, t)
    for now, then in ((W, entry["W_after"]), (b, entry["b_after"])):
        scale = float(then.abs().max())
        assert float((now.detach() - then).abs().max()) <= 1e-12 * scale, name
    assert W.manifold.is_point(W.detach(), atol=1e-12), name
