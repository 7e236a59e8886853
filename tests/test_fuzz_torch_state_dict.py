"""Fuzzing ``geoarray.torch`` optimizers' ``load_state_dict`` with mutated state dicts (issue #29, item 6).

Hypothesis (derandomized) takes the ``state_dict`` of a ``geoarray.torch`` optimizer (``Adam``, ``SGD``,
``PaperAdam``, ``Momentum``, ``ManifoldMuon``) after two steps on a Stiefel ``ManifoldParameter`` and a
plain parameter, applies one to three mutations — a state tensor of another shape, dtype or kind (a list,
a NumPy array, None), a state tensor dropped or added, parameter indices out of range or of another type,
the structure string edited, the format or version changed, a hyperparameter of a wrong type or range,
a param group dropped or a key removed — and loads it into a fresh optimizer of the same class.

Every outcome must be: a ``ValueError``/``TypeError`` naming ``state_dict`` (or the hyperparameter), with
the target optimizer's state_dict and the parameters unchanged; or a load after which two steps leave
finite parameters with the Stiefel weight on its manifold. Cases: ``CASES``.

The three defects this target found, fixed and tested below: a NaN moment in a state tensor loaded
without a word and the next step wrote NaN into the parameters (non-finite state tensors are now
refused at load, naming them; a negative second moment, finite, is still not checked); a state_dict
without ``"param_groups"`` ended in torch's ``KeyError``; parameter indices that are None or strings
ended in ``int()``'s TypeError or ValueError, which named nothing.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import strategies as st

from _fuzz import fuzz
from geoarray.manifolds import Stiefel

CASES = {"state_dict": 150}

MUTATIONS = ["tensor shape", "tensor dtype", "tensor list", "tensor numpy", "tensor None", "drop tensor",
             "add tensor", "indices range", "indices type", "structure", "format", "version", "lr", "betas",
             "drop group", "drop geoarray", "group key"]  # fmt: skip
HYPERS = ("lr", "betas", "momentum", "delta", "weight_decay", "eps")  # the keys "lr", "betas", "group key" edit
BAD_VALUES = ["oops", -1.0, math.nan, math.inf, None, True, [0.1], (0.9, 2.0), (0.9,), 1e-3]


def _setup(torch, gt, name, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = gt.ManifoldParameter(torch.linalg.qr(torch.randn(6, 2, dtype=torch.float64, generator=gen))[0], Stiefel(6, 2))
    e = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64, generator=gen))
    params = [w, e]
    return params, (lambda ps: getattr(gt, name)(ps, lr=0.01)), gen


def _steps(torch, opt, params, gen, n=2):
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=gen)
        opt.step()


def _snapshot(torch, obj):
    """Host copies of every tensor in a (nested) state_dict or list of parameters, and its other values."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", obj.detach().cpu().clone())
    if isinstance(obj, dict):
        return {k: _snapshot(torch, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_snapshot(torch, v) for v in obj]
    return obj


def _same(torch, a, b):
    if isinstance(a, tuple) and a[:1] == ("tensor",):
        return isinstance(b, tuple) and b[:1] == ("tensor",) and a[1].dtype == b[1].dtype and torch.equal(a[1], b[1])
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(torch, a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(torch, x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _mutate(torch, sd, kind, data):
    geo = sd.get("geoarray", {})
    cohorts = [c for g in geo.get("groups", []) for c in g]
    if kind.startswith("tensor") or kind in ("drop tensor", "add tensor"):
        if not cohorts or not cohorts[0]["leaves"]:
            return
        c = cohorts[data.draw(st.integers(0, len(cohorts) - 1), label="cohort")]
        i = data.draw(st.integers(0, len(c["leaves"]) - 1), label="tensor")
        t = c["leaves"][i]
        if not isinstance(t, torch.Tensor):  # an earlier mutation replaced it
            return
        c["leaves"][i] = {
            "tensor shape": lambda: torch.zeros((*t.shape, 2), dtype=t.dtype),
            "tensor dtype": lambda: t.to(torch.float32 if t.dtype != torch.float32 else torch.float64),
            "tensor list": lambda: t.tolist(),
            "tensor numpy": lambda: t.numpy().copy(),
            "tensor None": lambda: None,
            "drop tensor": lambda: t,
            "add tensor": lambda: t,
        }[kind]()
        if kind == "drop tensor":
            del c["leaves"][i]
        elif kind == "add tensor":
            c["leaves"].append(t.clone())
    elif kind in ("indices range", "indices type") and cohorts:
        cohorts[0]["indices"] = (
            [99]
            if kind == "indices range"
            else data.draw(st.sampled_from([[0.5], [], [-1], [True], "0"]), label="indices")
        )
    elif kind == "structure" and cohorts:
        cohorts[0]["structure"] = data.draw(st.sampled_from(["", "PyTreeSpec(*)", cohorts[0]["structure"][:-3]]))
    elif kind == "format" and geo:
        geo["format"] = data.draw(st.sampled_from(["", "torch", None, 1]), label="format")
    elif kind == "version" and geo:
        geo["version"] = data.draw(st.sampled_from([0, 99, "1", None]), label="version")
    elif kind in ("lr", "betas", "group key") and sd.get("param_groups"):
        key = {"group key": data.draw(st.sampled_from(HYPERS[2:]))}.get(kind, kind)
        if key in sd["param_groups"][0]:
            sd["param_groups"][0][key] = data.draw(st.sampled_from(BAD_VALUES), label="value")
    elif kind == "drop group" and sd.get("param_groups"):
        sd["param_groups"].pop()
    elif kind == "drop geoarray":
        sd.pop("geoarray", None)


def test_load_state_dict_of_mutated_state_dicts(backend):
    if backend.kind != "torch":
        pytest.skip("geoarray.torch optimizers take torch tensors")
    import torch

    import geoarray.torch as gt

    @fuzz(CASES["state_dict"], backend)
    def run(data):
        name = data.draw(st.sampled_from(["Adam", "SGD", "PaperAdam", "Momentum", "ManifoldMuon"]), label="optimizer")
        params, make, gen = _setup(torch, gt, name)
        source = make(params)
        _steps(torch, source, params, gen)
        sd = copy.deepcopy(source.state_dict())
        kinds = data.draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3), label="mutations")
        for kind in kinds:
            _mutate(torch, sd, kind, data)
        target = make(params)
        _steps(torch, target, params, gen, n=1)
        before = _snapshot(torch, target.state_dict())
        before_params = [p.detach().clone() for p in params]
        try:
            target.load_state_dict(sd)
        except (ValueError, TypeError) as exc:
            msg = str(exc)
            # torch's own refusals say "state dict"
            assert any(k in msg for k in ("state_dict", "state dict", "param_groups", *HYPERS)), msg
            assert _same(torch, _snapshot(torch, target.state_dict()), before), f"{kinds}: the optimizer changed"
            assert all(torch.equal(p.detach(), q) for p, q in zip(params, before_params, strict=True))
            return
        _steps(torch, target, params, gen)
        assert all(bool(torch.isfinite(p).all()) for p in params), f"{kinds}: non-finite parameters after the load"
        Y = params[0].detach().numpy()
        assert np.abs(Y.T @ Y - np.eye(2)).max() < 1e-10, f"{kinds}: the Stiefel weight left its manifold"

    run()


@pytest.mark.parametrize("name", ["Adam", "PaperAdam"])
def test_a_state_dict_with_a_nan_moment_is_refused(torch, gt, name):
    params, make, gen = _setup(torch, gt, name)
    source = make(params)
    _steps(torch, source, params, gen)
    sd = copy.deepcopy(source.state_dict())
    leaves = sd["geoarray"]["groups"][0][0]["leaves"]
    floating = [t for t in leaves if t.is_floating_point() and t.numel()]
    floating[0].view(-1)[0] = math.nan
    target = make(params)
    with pytest.raises(ValueError, match="state_dict"):
        target.load_state_dict(sd)


def test_a_state_dict_without_param_groups_is_a_value_error(torch, gt):
    params, make, gen = _setup(torch, gt, "Adam")
    source = make(params)
    _steps(torch, source, params, gen)
    sd = copy.deepcopy(source.state_dict())
    del sd["param_groups"]
    with pytest.raises(ValueError, match="param_groups"):
        make(params).load_state_dict(sd)


def test_state_dict_indices_of_another_type_are_refused_naming_them(torch, gt):
    params, make, gen = _setup(torch, gt, "Adam")
    source = make(params)
    _steps(torch, source, params, gen)
    sd = copy.deepcopy(source.state_dict())
    sd["geoarray"]["groups"][0][0]["indices"] = [None]
    with pytest.raises((ValueError, TypeError), match="state_dict"):
        make(params).load_state_dict(sd)
