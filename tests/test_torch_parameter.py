"""ManifoldParameter: an nn.Parameter that keeps its manifold through deepcopy, pickling, torch.save,
state_dict/load_state_dict and Module.to (including torch's swap-on-conversion mode)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest

from geoarray import Grassmann, Stiefel

# torch_only, torch and gt: tests/conftest.py
pytestmark = pytest.mark.usefixtures("torch_only")


def _param(torch, gt, device, M=None, seed=0):
    M = M or Stiefel(7, 3)
    return gt.ManifoldParameter(M.random(seed, xp=torch, dtype=torch.float64, device=device), M)


def _same(torch, gt, p, q):
    assert isinstance(q, gt.ManifoldParameter) and isinstance(q, torch.nn.Parameter)
    assert q.manifold == p.manifold and q.requires_grad == p.requires_grad
    assert torch.equal(q.detach().to(p.device), p.detach())


def test_is_a_parameter_whose_operations_return_plain_tensors(torch, gt, device):
    p = _param(torch, gt, device)
    assert isinstance(p, torch.nn.Parameter) and p.is_leaf and p.requires_grad
    assert type(p * 2) is torch.Tensor and type(p.detach()) is torch.Tensor
    assert "Stiefel(7, 3)" in repr(p)
    m = torch.nn.Module()
    m.w = p
    assert dict(m.named_parameters())["w"] is p


def test_survives_deepcopy_and_pickle(torch, gt, device):
    p = _param(torch, gt, device, Grassmann(6, 2))
    p.tag = "kept"  # attributes set by users survive pickling, as for nn.Parameter
    for q in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        _same(torch, gt, p, q)
        assert q.data_ptr() != p.data_ptr()
    assert pickle.loads(pickle.dumps(p)).tag == "kept"
    frozen = gt.ManifoldParameter(p.detach(), p.manifold, requires_grad=False)
    _same(torch, gt, frozen, copy.deepcopy(frozen))


def test_survives_torch_save_and_state_dict_round_trip(torch, gt, device):
    model = torch.nn.Module()
    model.w = _param(torch, gt, device)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    _same(torch, gt, model.w, torch.load(buf, weights_only=False).w)

    other = torch.nn.Module()
    other.w = _param(torch, gt, device, seed=1)
    target = other.w
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)  # plain tensors: loads with weights_only=True
    buf.seek(0)
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert other.w is target  # copied into the same ManifoldParameter
    _same(torch, gt, model.w, other.w)


def test_survives_module_to_dtype_in_both_conversion_modes(torch, gt, device):
    model = torch.nn.Module()
    model.w = _param(torch, gt, device)
    before = model.w.detach().clone()
    model.to(torch.float32)
    assert isinstance(model.w, gt.ManifoldParameter) and model.w.dtype == torch.float32
    assert model.w.manifold == Stiefel(7, 3)
    assert torch.allclose(model.w.detach().double(), before, atol=1e-7)

    wrapped = gt.nn.StiefelLayer(7, 3, device=device)
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        wrapped.to(torch.float32)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    Y = wrapped.params.Y
    assert isinstance(Y, gt.ManifoldParameter) and Y.dtype == torch.float32 and Y.manifold == Stiefel(7, 3)


def test_refuses_a_tensor_that_does_not_fit_its_manifold(torch, gt, device):
    M = Stiefel(7, 3)
    with pytest.raises(ValueError, match=r"data has shape \(7, 2\), which does not end in \(7, 3\)"):
        gt.ManifoldParameter(torch.zeros(7, 2, dtype=torch.float64, device=device), M)
    with pytest.raises(ValueError, match="data is not a point of Stiefel"):
        gt.ManifoldParameter(torch.ones(7, 3, dtype=torch.float64, device=device), M)
    with pytest.raises(TypeError, match="manifold must be a geoarray Manifold"):
        gt.ManifoldParameter(torch.zeros(7, 3, dtype=torch.float64, device=device), "stiefel")
    batch = M.random(0, xp=torch, batch_shape=(4,), dtype=torch.float64, device=device)
    assert gt.ManifoldParameter(batch, M).shape == (4, 7, 3)  # leading axes: a batch of points
