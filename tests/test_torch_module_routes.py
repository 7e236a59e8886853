"""What torch does inside a module's own methods to a ManifoldParameter (issue #53: no route leaves one off
its manifold without a warning or an error). One test per route, each stating its property:

* ``layer.weight = W0`` with a bare tensor (geotorch's idiom) on a tall or square ``orthogonal_`` weight
  writes the polar factor of W0 into the same ManifoldParameter: max|WᵀW − I| ≤ 1e-6 in float32, within
  1e-5 of the float64 polar factor, an orthonormal W0 kept bit for bit — as a wide weight's assignment
  (``tests/test_torch_foreign.py``) and an ``nn.Parameter``'s; a tensor of another shape, or a
  rank-deficient one, is a ``ValueError`` naming the attribute, the manifold, the shapes and the fix, the
  weight unchanged;
* ``module.to_empty(device=...)`` after building on the meta device (``orthogonal_`` there, or a
  ``ManifoldParameter(..., check=False)``), and a round trip through ``meta``: the weight stays a
  ManifoldParameter on its manifold; a geoarray optimizer's first step refuses the uninitialised values,
  naming the parameter and ``uniform_init_``; initialised, it steps (max|WᵀW − I| ≤ 1e-5 in float32);
* torch's ``torch.__future__`` swap and overwrite flags (``.to``, ``to_empty``, ``load_state_dict``
  rebuild the parameter objects): the ManifoldParameter and its manifold are kept, in swap mode as the
  same object;
* ``load_state_dict(..., strict=False)`` that leaves a weight out, with the optimizer restored by its own
  ``load_state_dict`` (or ``checkpoint.set_optimizer_state_dict``), which skip the check of a first
  step: the first step refuses the weight left as ``to_empty`` left it, naming it, ``strict=False`` and
  the fix; weights that were loaded (or drifted by 1e-3 in float32) resume, bit for bit equal to the
  uninterrupted run;
* the module keeps its class's name, ``isinstance`` and pickling (``copy.deepcopy``, ``pickle``,
  ``torch.save``) through all of this.
"""

from __future__ import annotations

import copy
import io
import pickle
import re

import pytest

import geoarray as ga

pytestmark = pytest.mark.usefixtures("torch_only")


def _err(W):
    import torch

    W = W.detach().double()
    return float((W.mT @ W - torch.eye(W.shape[-1], dtype=W.dtype)).abs().max())


def _step(torch, module, opt, x):
    opt.zero_grad()
    module(x).square().sum().backward()
    opt.step()


@pytest.mark.parametrize("shape", [(64, 256), (16, 16)], ids=["tall", "square"])
def test_assigning_a_bare_tensor_to_an_orthogonal_weight_projects_in_place(torch, gt, shape):
    """max|WᵀW − I| ≤ 1e-6 (float32) after ``layer.weight = W0``; the polar factor of W0 to 1e-5; the same
    object (an optimizer built before keeps stepping it); W0 itself unchanged; orthonormal W0 kept bit for bit."""
    fan_in, fan_out = shape
    torch.manual_seed(0)
    layer = gt.orthogonal_(torch.nn.Linear(fan_in, fan_out, bias=False, dtype=torch.float32))
    p, M = layer.weight, layer.weight.manifold
    opt = gt.Adam(layer.parameters(), lr=1e-3)
    W0 = torch.randn(fan_out, fan_in, dtype=torch.float32)
    before = W0.clone()
    layer.weight = W0  # geotorch's idiom; torch itself refuses a bare tensor for a parameter
    assert layer.weight is p and isinstance(p, gt.ManifoldParameter) and p.manifold == M
    assert _err(p) <= 1e-6
    assert float((p.detach().double() - M.nearest_point(W0.double())).abs().max()) <= 1e-5
    assert torch.equal(W0, before)
    Q = M.random(1, xp=torch, dtype=torch.float32)
    layer.weight = Q
    assert torch.equal(p.detach(), Q)  # on the manifold: written as it is
    _step(torch, layer, opt, torch.randn(3, fan_in, dtype=torch.float32))  # the optimizer still steps it
    assert _err(layer.weight) <= 1e-5 and not torch.equal(p.detach(), Q)


def test_assigning_a_tensor_that_cannot_be_projected_is_refused_with_the_fix(torch, gt):
    """A wrong shape or a rank-deficient matrix: ``ValueError`` naming the attribute, the manifold, the
    shapes (or the rank) and the fix; the weight is left bit for bit as it was."""
    layer = gt.orthogonal_(torch.nn.Linear(64, 256, bias=False, dtype=torch.float32))
    kept = layer.weight.detach().clone()
    with pytest.raises(
        ValueError,
        match=r"Linear\.weight \(a ManifoldParameter of shape \(256, 64\) on Stiefel\(256, 64\)\) cannot take a "
        r"tensor of shape \(64, 256\): assign one of shape \(256, 64\).*del module\.weight",
    ):
        layer.weight = torch.randn(64, 256)
    with pytest.raises(ValueError, match=r"Linear\.weight .*Stiefel\(256, 64\).*rank-deficient"):
        layer.weight = torch.zeros(256, 64)
    assert torch.equal(layer.weight.detach(), kept)
    del layer.weight  # dropping the constraint stays explicit
    layer.weight = torch.nn.Parameter(torch.randn(64, 256))
    assert type(layer.weight) is torch.nn.Parameter


def test_to_empty_after_building_on_the_meta_device_keeps_the_manifold(torch, gt):
    """``orthogonal_`` on meta (tall, wide) and ``ManifoldParameter(check=False)`` on meta, then
    ``to_empty(device="cpu")``, and a real module through ``to_empty(device="meta")`` and back: each
    weight is a ManifoldParameter on its manifold; the first geoarray step refuses the uninitialised values
    naming the parameter and ``uniform_init_``; once initialised, max|WᵀW − I| ≤ 1e-5 (float32) after a step."""

    class Frames(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.Y = gt.ManifoldParameter(torch.empty(6, 3), ga.Stiefel(6, 3), check=False)

        def forward(self, x):
            return x @ self.Y

    with torch.device("meta"):
        modules = {
            "tall": gt.orthogonal_(torch.nn.Linear(8, 32, bias=False, dtype=torch.float32)),
            "wide": gt.orthogonal_(torch.nn.Linear(32, 8, bias=False, dtype=torch.float32)),
            "frames": Frames().float(),
        }
    modules["round trip"] = gt.orthogonal_(torch.nn.Linear(8, 32, bias=False, dtype=torch.float32))
    modules["round trip"].to_empty(device="meta")
    inputs = {"tall": (3, 8), "wide": (3, 32), "frames": (3, 6), "round trip": (3, 8)}
    for what, module in modules.items():
        module.to_empty(device="cpu")
        name, p = next(iter(module.named_parameters()))
        M = ga.Stiefel(6, 3) if what == "frames" else ga.Stiefel(32, 8)  # wide: its tall transpose
        assert isinstance(p, gt.ManifoldParameter) and p.manifold == M and p.device.type == "cpu", what
        with torch.no_grad():
            p.zero_()  # what uninitialised memory may hold: off the manifold (max|YᵀY − I| = 1)
        opt = gt.Adam(module.named_parameters(), lr=1e-2)
        x = torch.randn(*inputs[what], dtype=torch.float32)
        refusal = rf"'{re.escape(name)}' is not a point of {re.escape(repr(M))}.*uniform_init_"
        with pytest.raises(ValueError, match=refusal):
            _step(torch, module, opt, x)
        gt.init.uniform_init_(p)  # the fix the error names
        _step(torch, module, opt, x)
        assert _err(p) <= 1e-5, what


@pytest.mark.parametrize("flag", ["swap", "overwrite"])
def test_torch_future_conversion_flags_keep_the_manifold(torch, gt, flag):
    """Under ``torch.__future__.set_{flag}_module_params_on_conversion(True)`` — ``.to(float64)``,
    ``to_empty`` and ``load_state_dict`` rebuild parameters — the weight stays a ManifoldParameter on
    Stiefel(8, 4), the same object in swap mode, its values exact (``.to``: max|WᵀW − I| ≤ 1e-6)."""
    setter = getattr(torch.__future__, f"set_{flag}_module_params_on_conversion")
    setter(True)
    try:
        layer = gt.orthogonal_(torch.nn.Linear(4, 8, bias=False, dtype=torch.float32))
        p = layer.weight
        layer.to(torch.float64)
        assert isinstance(layer.weight, gt.ManifoldParameter) and layer.weight.manifold == ga.Stiefel(8, 4)
        assert layer.weight.dtype == torch.float64 and _err(layer.weight) <= 1e-6
        assert (layer.weight is p) == (flag == "swap")
        Q = ga.Stiefel(8, 4).random(2, xp=torch, dtype=torch.float64)
        layer.load_state_dict({"weight": Q})
        assert isinstance(layer.weight, gt.ManifoldParameter) and torch.equal(layer.weight.detach(), Q)
        layer.to_empty(device="cpu")
        assert isinstance(layer.weight, gt.ManifoldParameter) and layer.weight.manifold == ga.Stiefel(8, 4)
    finally:
        setter(False)


def test_restored_optimizer_refuses_a_weight_that_load_state_dict_left_out(torch, gt):
    """``to_empty`` + ``load_state_dict(strict=False)`` without the weight + the optimizer's
    ``load_state_dict``: the first step raises a ``ValueError`` naming 'weight', ``strict=False`` and
    ``uniform_init_``, for ``set_optimizer_state_dict`` too; with the weight loaded, or 1e-3 off (drift, far
    below the 0.1 allowed in float32), the step runs, equal bit for bit to the uninterrupted one."""
    from geoarray.torch.checkpoint import get_optimizer_state_dict, set_optimizer_state_dict

    x = torch.linspace(-1, 1, 24, dtype=torch.float32).reshape(3, 8)
    torch.manual_seed(0)
    ran = gt.orthogonal_(torch.nn.Linear(8, 32, dtype=torch.float32))
    opt = gt.Adam(ran.named_parameters(), lr=1e-2)
    _step(torch, ran, opt, x)
    model_sd = copy.deepcopy(ran.state_dict())
    opt_sd, dcp_sd = copy.deepcopy(opt.state_dict()), copy.deepcopy(get_optimizer_state_dict(ran, opt))
    _step(torch, ran, opt, x)  # the uninterrupted run's second step

    def resumed(weight):
        with torch.device("meta"):
            model = gt.orthogonal_(torch.nn.Linear(8, 32, dtype=torch.float32))
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.weight.zero_()  # what to_empty may leave
        sd = {k: v for k, v in model_sd.items() if k != "weight" or weight is not None}
        if weight is not None:
            sd["weight"] = weight
        model.load_state_dict(sd, strict=False)
        return model, gt.Adam(model.named_parameters(), lr=1e-2)

    model, opt2 = resumed(None)
    opt2.load_state_dict(opt_sd)
    with pytest.raises(ValueError, match=r"'weight' is off Stiefel\(32, 8\).*strict=False.*uniform_init_"):
        _step(torch, model, opt2, x)
    model, opt2 = resumed(None)
    set_optimizer_state_dict(model, opt2, copy.deepcopy(dcp_sd))
    with pytest.raises(ValueError, match=r"'weight' is off Stiefel\(32, 8\).*strict=False"):
        _step(torch, model, opt2, x)

    model, opt2 = resumed(model_sd["weight"])
    opt2.load_state_dict(opt_sd)
    _step(torch, model, opt2, x)
    assert torch.equal(model.weight.detach(), ran.weight.detach())  # the check changes nothing
    drifted = model_sd["weight"] + 1e-3 * torch.linspace(-1, 1, 256, dtype=torch.float32).reshape(32, 8)
    model, opt2 = resumed(drifted)
    opt2.load_state_dict(opt_sd)
    _step(torch, model, opt2, x)
    assert _err(model.weight) <= 1e-2


def test_a_module_holding_a_manifold_parameter_keeps_its_name_and_pickles(torch, gt):
    """The class a module holding a ManifoldParameter gets keeps its name, module and ``isinstance``, is
    one per class, and survives ``copy.deepcopy``, ``pickle`` and ``torch.save``/``load`` (which then
    still keep the manifold through ``to_empty``)."""
    layer = gt.orthogonal_(torch.nn.Linear(4, 8, dtype=torch.float32))
    assert type(layer).__name__ == "Linear" and type(layer).__module__ == "torch.nn.modules.linear"
    assert isinstance(layer, torch.nn.Linear) and repr(layer).startswith("Linear(")
    assert type(gt.orthogonal_(torch.nn.Linear(4, 8))) is type(layer)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer)), torch.load(buf, weights_only=False)):
        assert type(clone) is type(layer) and torch.equal(clone.weight, layer.weight)
        clone.to_empty(device="meta")
        assert isinstance(clone.weight, gt.ManifoldParameter) and clone.weight.manifold == ga.Stiefel(8, 4)
