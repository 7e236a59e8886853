"""geoarray.torch.nn: nn.Module wrappers of every geoarray.nn layer.

Properties: constrained weights are registered as ManifoldParameter on the layer's manifold (and are
points of it), the forward pass equals ``layer.apply`` on the same initialisation (to ``_helpers.AGREE_RTOL``), and the
analytic pullback (``analytic=True``, a torch.autograd.Function around ``layer.vjp``) gives the
gradients of torch's autograd to 1e-10 (float64, relative to the largest entry).
"""

from __future__ import annotations

import copy

import numpy as np
import optree
import pytest

import geoarray
import geoarray.nn as gnn
from _helpers import assert_agree

# torch_only, torch and gt: tests/conftest.py
pytestmark = pytest.mark.usefixtures("torch_only")


# name -> (constructor args, constructor kwargs, input shape)
CASES = {
    "ActivationLayerP": ((4,), {}, (5, 4)),
    "ActivationLayerQ": ((4,), {}, (5, 4)),
    "BiasLayer": ((4,), {}, (5, 4)),
    "Chain": ((gnn.StiefelLayer(6, 3), gnn.MultiHeadAttention(6, 2)), {}, (2, 4, 3)),
    "ClassificationLayer": ((6, 3), {}, (2, 4, 6)),
    "Dense": ((4, 3, "tanh"), {}, (5, 4)),
    "GradientLayerP": ((4, 6), {}, (5, 4)),
    "GradientLayerQ": ((4, 6), {}, (5, 4)),
    "GrassmannLayer": ((6, 2), {}, (5, 6)),
    "LinearLayerP": ((4,), {}, (5, 4)),
    "LinearLayerQ": ((4,), {}, (5, 4)),
    "LinearSymplecticAttentionP": ((4, 3), {}, (2, 3, 4)),
    "LinearSymplecticAttentionQ": ((4, 3), {}, (2, 3, 4)),
    "MultiHeadAttention": ((6, 2), {}, (2, 4, 6)),
    "PSDLayer": ((4, 8), {}, (5, 4)),
    "ResNetLayer": ((4,), {}, (5, 4)),
    "StiefelLayer": ((6, 2), {"transpose": True}, (5, 6)),
    "SymplecticAttentionP": ((4,), {}, (2, 3, 4)),
    "SymplecticAttentionQ": ((4,), {}, (2, 3, 4)),
    "VolumePreservingAttention": ((4,), {}, (2, 3, 4)),
    "VolumePreservingLowerLayer": ((4,), {}, (5, 4)),
    "VolumePreservingUpperLayer": ((4,), {}, (5, 4)),
}


def test_every_geoarray_nn_layer_has_a_wrapper_and_a_test_case(gt):
    layers = {n for n in gnn.__all__ if isinstance(getattr(gnn, n), type) and issubclass(getattr(gnn, n), gnn.Layer)}
    layers.discard("Layer")
    assert set(gt.nn.LAYERS) == layers
    assert set(CASES) == layers, "add a case for each new layer"


def _input(torch, shape, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(shape, generator=g, dtype=torch.float64)).to(device)


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrapper_registers_manifold_parameters_and_matches_apply(torch, gt, device, name):
    args, kwargs, shape = CASES[name]
    module = getattr(gt.nn, name)(*args, seed=3, device=device, **kwargs)
    layer = getattr(gnn, name)(*args, **kwargs)
    params = layer.init(3, xp=torch, dtype=torch.float64, device=device)
    manifolds = optree.tree_structure(params, none_is_leaf=True).flatten_up_to(layer.manifolds())
    registered = dict(module.named_parameters())
    paths, leaves, _ = optree.tree_flatten_with_path(params)
    assert len(registered) == len(leaves)
    assert all(p.is_contiguous() for p in registered.values()), "FSDP2 shards contiguous parameters only"
    for path, leaf, m in zip(paths, leaves, manifolds, strict=True):
        p = registered["params." + ".".join(map(str, path))]
        assert torch.equal(p.detach(), leaf)
        if m is None:
            assert not isinstance(p, gt.ManifoldParameter)
        else:
            assert isinstance(p, gt.ManifoldParameter) and p.manifold == m and m.is_point(p.detach())
    x = _input(torch, shape, device)
    # the wrapper runs apply through autograd (a different code path): equal to AGREE_RTOL, not bit for bit
    assert_agree(module(x), layer.apply(params, x), what=name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_analytic_pullback_equals_autograd(torch, gt, device, name):
    args, kwargs, shape = CASES[name]
    auto = getattr(gt.nn, name)(*args, seed=5, device=device, **kwargs)
    analytic = getattr(gt.nn, name)(*args, seed=5, device=device, analytic=True, **kwargs)
    x = _input(torch, shape, device, seed=1)
    grads = []
    for module in (auto, analytic):
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        assert ("_AnalyticLayer" in type(y.grad_fn).__name__) == module.analytic
        dy = _input(torch, tuple(y.shape), device, seed=2)
        (y * dy).sum().backward()
        grads.append([xi.grad] + [p.grad for p in module.parameters()])
    for k, (a, b) in enumerate(zip(*grads, strict=True)):
        scale = max(float(a.abs().max()), 1e-300)
        err = float((a - b).abs().max()) / scale
        assert err <= 1e-10, f"{name}: gradient {k} differs by {err:.2e} (relative)"


def test_generic_module_wraps_any_layer_contract_object(torch, gt, device):
    class Scale:  # duck-typed: not a geoarray.nn.Layer subclass
        def init(self, seed, *, xp, dtype=None, device=None):
            Y = geoarray.Stiefel(4, 2).random(seed, xp=xp, dtype=dtype, device=device)
            return {"Y": Y, "s": xp.ones(2, dtype=Y.dtype, device=device)}

        def manifolds(self):
            return {"Y": geoarray.Stiefel(4, 2), "s": None}

        def apply(self, params, x):
            return (x @ params["Y"]) * params["s"]

    m = gt.nn.Module(Scale(), dtype=torch.float64, device=device)
    assert isinstance(m.params.Y, gt.ManifoldParameter) and type(m.params.s) is torch.nn.Parameter
    x = _input(torch, (3, 4), device)
    assert_agree(m(x), x @ m.params.Y.detach())
    with pytest.raises(TypeError, match="has no vjp"):
        gt.nn.Module(Scale(), analytic=True)
    with pytest.raises(TypeError, match="has no init"):
        gt.nn.Module(object())
    with pytest.raises(AttributeError, match="NoSuchModel"):
        gt.nn.NoSuchModel  # noqa: B018


def test_chain_trains_with_the_optimizer_and_stays_on_the_manifold(torch, gt, device):
    model = gt.nn.Chain(
        gnn.StiefelLayer(6, 3), gnn.MultiHeadAttention(6, 2), gnn.ClassificationLayer(6, 3), device=device
    )
    opt = gt.Adam(model.named_parameters(), lr=0.02)
    x = _input(torch, (8, 4, 3), device)
    labels = torch.arange(8, device=device) % 3
    loss_fn = gnn.ClassificationL2Loss()
    losses = []
    for _ in range(10):
        loss = loss_fn(model(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for p in model.parameters():
        if isinstance(p, gt.ManifoldParameter):
            assert p.manifold.is_point(p.detach())


def test_module_deepcopy_pickle_and_to_keep_manifolds(torch, gt, device):
    import io

    model = gt.nn.MultiHeadAttention(6, 2, device=device)
    clone = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (clone, loaded, copy.deepcopy(model).to(torch.float32)):
        for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
            assert isinstance(q, gt.ManifoldParameter) and q.manifold == p.manifold, n
            np.testing.assert_allclose(q.detach().double().cpu().numpy(), p.detach().cpu().numpy(), atol=1e-7)
    x = _input(torch, (2, 4, 6), device)
    assert torch.equal(loaded(x), model(x))


@pytest.mark.parametrize("name", sorted(CASES))
def test_under_autocast_a_layer_runs_in_its_parameters_dtype(torch, gt, device, name):
    """Under ``torch.autocast`` (bfloat16) each layer runs in its parameters' dtype, as torch runs its linear
    algebra and softmax in float32 there (a half-precision product would break the structure a layer
    preserves at the 1e-2 level; the analytic pullbacks had met bfloat16 cotangents beside float32 weights,
    and a chain had refused the bfloat16 output of its first layer): the output (float32) and the gradients of
    input and parameters, with autograd and with the analytic pullback, equal those without autocast to
    ``AGREE_RTOL``; a bfloat16 input (what a torch layer before it gives under autocast) is cast
    differentiably, its gradient bfloat16."""
    args, kwargs, shape = CASES[name]
    x = _input(torch, shape, device).float()
    for analytic in (False, True):
        module = getattr(gt.nn, name)(*args, seed=3, device=device, dtype=torch.float32, analytic=analytic, **kwargs)
        runs = []
        for enabled in (False, True):
            xi = x.clone().requires_grad_(True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled):
                y = module(xi)
            dy = _input(torch, tuple(y.shape), device, seed=2).float()
            (y * dy).sum().backward()
            runs.append([y.detach(), xi.grad] + [p.grad for p in module.parameters()])
            module.zero_grad(set_to_none=True)
        what = f"{name} (analytic={analytic})"
        assert runs[1][0].dtype == torch.float32, what
        for k, (a, b) in enumerate(zip(*runs, strict=True)):
            assert_agree(a, b, what=f"{what}, output/gradient {k}")
        xb = x.to(torch.bfloat16).requires_grad_(True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = module(xb)
        assert y.dtype == torch.float32, what
        y.sum().backward()
        assert xb.grad is not None and xb.grad.dtype == torch.bfloat16, what


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_layer_moved_to_bfloat16_runs_in_bfloat16(torch, gt, device, name):
    """``module.to(torch.bfloat16)`` (the layers are built in float32 or float64): forward and backward run
    in bfloat16, with autograd and with the analytic pullback; the output agrees with the float32 layer's on
    the same input to ``AGREE_RTOL`` of bfloat16 (3e-2 of max(1, max|y|)), and every gradient is bfloat16.
    VolumePreservingAttention's T×T inverse is taken in float32 (no backend has a half-precision inverse:
    torch raised "Low precision dtypes not supported")."""
    args, kwargs, shape = CASES[name]
    x = _input(torch, shape, device).to(torch.bfloat16)
    for analytic in (False, True):
        ref = getattr(gt.nn, name)(*args, seed=3, device=device, dtype=torch.float32, analytic=analytic, **kwargs)
        module = copy.deepcopy(ref).to(torch.bfloat16)
        y = module(x)
        assert_agree(y, ref(x.float()).to(torch.bfloat16), what=f"{name} (analytic={analytic})")
        y.float().square().sum().backward()
        assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in module.parameters()), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_analytic_pullbacks_compose_with_torch_func(torch, gt, device, name, monkeypatch):
    """``torch.func`` with ``analytic=True`` (torch had refused the pullback's Function: "it must override
    the setup_context staticmethod"): an ensemble of 3 layers, stacked with ``stack_module_state`` and run by
    ``vmap`` of ``functional_call``, equals the layers run one by one, and ``vmap(grad(·))`` their gradients,
    through the analytic pullback (its backward runs); ``jacrev(jacrev(·))`` of x ↦ ‖layer(x)‖² (a second
    derivative through the pullback's operations) equals that of the autograd layer. All to ``AGREE_RTOL``."""
    from torch.func import functional_call, grad, jacrev, stack_module_state, vmap

    from geoarray.torch import _autograd

    backward = _autograd._AnalyticLayerFunctorch.backward
    calls = []
    monkeypatch.setattr(
        _autograd._AnalyticLayerFunctorch,
        "backward",
        staticmethod(lambda ctx, dy: calls.append(1) or backward(ctx, dy)),
    )
    args, kwargs, shape = CASES[name]
    x = _input(torch, shape, device)
    layers = [getattr(gt.nn, name)(*args, seed=s, device=device, analytic=True, **kwargs) for s in range(3)]
    params, buffers = stack_module_state(layers)
    base = copy.deepcopy(layers[0]).to("meta")

    def loss(p, b, x):
        return functional_call(base, (p, b), (x,)).square().sum()

    out = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)), in_dims=(0, 0, None))(params, buffers, x)
    grads = vmap(grad(loss), in_dims=(0, 0, None))(params, buffers, x)
    assert calls, "the analytic pullback ran"
    for i, layer in enumerate(layers):
        y = layer(x)
        assert_agree(out[i], y.detach(), what=f"{name}, layer {i}")
        y.square().sum().backward()
        for key, p in layer.named_parameters():
            assert_agree(grads[key][i], p.grad, what=f"{name}, layer {i}, {key}")
    autograd = getattr(gt.nn, name)(*args, seed=0, device=device, **kwargs)
    second = [jacrev(jacrev(lambda x, m=m: m(x).square().sum()))(x) for m in (layers[0], autograd)]
    assert_agree(second[0], second[1], what=f"{name}, second derivative")


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_compiled_forward_is_one_graph(torch, gt, device, name):
    """``torch.compile(module, fullgraph=True)`` traces every wrapper's forward without a graph break (the
    parameter tree is rebuilt by ``optree.tree_map``; ``PyTreeSpec.unflatten`` of the treedef made eagerly,
    which dynamo cannot trace, had cut a compiled forward into pieces) and equals the eager forward to
    ``AGREE_RTOL`` (dynamo only, ``backend="eager"``: the property is the trace, not the kernels)."""
    import torch._dynamo

    args, kwargs, shape = CASES[name]
    module = getattr(gt.nn, name)(*args, seed=3, device=device, dtype=torch.float64, **kwargs)
    x = _input(torch, shape, device)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert_agree(compiled(x), module(x), what=name)
