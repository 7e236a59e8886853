"""Fuzzing the core optimizers (issue #29, item 6): hyperparameters, and ``init``/``update`` on mismatched trees.

Targets (hypothesis, derandomized; cases per target in ``CASES``, a tenth on JAX — see ``_fuzz.cases``):

* ``hyperparameters``: ``Gradient``, ``Momentum``, ``Adam``, ``BFGS``, ``ManifoldMuon`` and ``partition``
  built with one hyperparameter drawn from valid and wrong values (negative, zero, NaN, ±inf, 1e308,
  strings, bools, None, lists, complex). Outcome: a ``ValueError``/``TypeError`` naming the
  hyperparameter, or — when accepted — a finite value of the right kind, and two update steps that leave
  every parameter finite and the Stiefel weight on its manifold.
* ``trees``: ``init``/``update`` of those optimizers on a tree {Stiefel weight (batched or not), Euclidean
  matrix, vector} with a mutated manifolds tree (a missing / extra key, a manifold of another shape, a
  string), mutated gradients (a missing or extra leaf, another shape, dtype — float32, int64, complex128,
  bool —, a list instead of a dict, None, NaN/inf entries) and mutated parameters (int dtype, NaN, a
  point off the manifold). Outcome: an error naming the argument or the leaf, or a correct step — finite
  parameters from finite gradients, the weight on Stiefel; with a non-finite gradient, the default
  ``on_nonfinite="skip"`` leaves the parameters unchanged and warns, and ``"raise"`` raises
  ``FloatingPointError`` (the documented exception) with the parameters and state unchanged. Neither
  parameters, gradients nor state are ever modified in place (bit for bit).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import strategies as st

from _fuzz import BAD_SCALARS, finite, fuzz, is_valid_number, outcome, snapshot, to_backend, unchanged
from _helpers import to_numpy
from geoarray import optim
from geoarray.manifolds import Grassmann, Stiefel

CASES = {"hyperparameters": 200, "trees": 200}

#: optimizer factories and the hyperparameters fuzzed, with the values each accepts (a predicate)
_NONNEG = is_valid_number


def _unit(v):
    return is_valid_number(v, high=1.0) and v < 1


def _positive_int(v):
    return not isinstance(v, bool) and isinstance(v, int) and v >= 1


def _partition(**kw):
    return optim.partition({"m": optim.Adam(**kw), "e": optim.Gradient(lr=0.01)}, {"w": "m", "e": "e", "b": "e"})


FACTORIES = {
    "Gradient": (optim.Gradient, {"lr": _NONNEG}),
    "Momentum": (optim.Momentum, {"lr": _NONNEG, "alpha": lambda v: is_valid_number(v, high=1.0)}),  # α = 1: no decay
    "Adam": (optim.Adam, {"lr": _NONNEG, "beta1": _unit, "beta2": _unit, "delta": _NONNEG, "eps": _NONNEG}),
    "BFGS": (optim.BFGS, {"lr": _NONNEG, "curvature_eps": _NONNEG}),
    "ManifoldMuon": (
        optim.ManifoldMuon,
        {"lr": _NONNEG, "momentum": _unit, "weight_decay": _NONNEG, "eps": _NONNEG, "ns_steps": _positive_int},
    ),
    "partition": (_partition, {"lr": _NONNEG, "beta1": _unit}),
}
#: keywords every RiemannianOptimizer takes
COMMON = {
    "section": lambda v: v in ("householder", "rotated", "transported", "random", None),
    "retraction": lambda v: v in ("geodesic", "cayley", None),
    "on_nonfinite": lambda v: v in ("skip", "raise", "ignore"),
    "group_same_shape": lambda v: isinstance(v, bool),
    "seed": lambda v: _positive_int(v) or (v == 0 and not isinstance(v, bool)),
}
_CHOICE_VALUES = st.sampled_from(
    ["householder", "rotated", "transported", "random", "geodesic", "cayley", "skip", "raise", "ignore",
     None, True, False, 0, 1, -1, "oops", 1.5, float("nan")]
)  # fmt: skip


def _tree(xp, device, *, batch=(3,), dtype="float64", seed=0, vector=True):
    """{Stiefel weight, Euclidean matrix, vector ``b``} (no vector for Muon, which takes matrices only)."""
    M = Stiefel(5, 2)
    rng = np.random.default_rng(seed)
    params = {
        "w": M.random(seed, xp=xp, batch_shape=batch, dtype=getattr(xp, dtype), device=device),
        "e": to_backend(rng.normal(size=(4, 3)), xp, device, dtype),
        "b": to_backend(rng.normal(size=(3,) if vector else (3, 2)), xp, device, dtype),
    }
    grads = {k: to_backend(rng.normal(size=tuple(v.shape)), xp, device, dtype) for k, v in params.items()}
    return params, grads, {"w": M, "e": None, "b": None}


def _on_stiefel(Y) -> bool:
    Yh = to_numpy(Y).astype(np.float64)
    return float(np.max(np.abs(np.swapaxes(Yh, -1, -2) @ Yh - np.eye(Yh.shape[-1])))) < 1e-8


def test_hyperparameters(xp, device, backend):
    fuzz(CASES["hyperparameters"], backend)(lambda data: _hyperparameter_case(xp, device, data))()


def _hyperparameter_case(xp, device, data):
    name = data.draw(st.sampled_from(sorted(FACTORIES)), label="optimizer")
    factory, hypers = FACTORIES[name]
    choices = dict(hypers)
    if name not in ("ManifoldMuon", "partition"):
        choices.update(COMMON)
    key = data.draw(st.sampled_from(sorted(choices)), label="hyperparameter")
    value = data.draw(_CHOICE_VALUES if key in COMMON else BAD_SCALARS, label="value")
    if name == "BFGS" and key == "section" and value == "random":
        value = "transported"  # BFGS refuses the random section by design (tested in test_optim.py)
    opt, err = outcome(lambda: factory(**{key: value}), (key,))
    if err is not None:
        return
    assert choices[key](value), f"{name}({key}={value!r}) was accepted"
    params, grads, manifolds = _tree(xp, device, vector=name != "ManifoldMuon")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = opt.init(params, manifolds)
        p, state = opt.update(params, grads, state)
        p, state = opt.update(p, grads, state)
    assert finite(p), f"{name}({key}={value!r}) gave non-finite parameters from finite gradients"
    # orthonormal to rounding for ‖W‖ up to ~1e3 (Stiefel.retraction's docstring): not for lr = 1e6
    assert _on_stiefel(p["w"]) or (key == "lr" and value > 10)


_GRAD_MUTATIONS = ["none"] * 4 + ["missing", "extra", "shape", "dtype", "list", "None leaf", "nan", "inf", "batch"]
_PARAM_MUTATIONS = ["none"] * 5 + ["int", "nan", "off manifold", "float32 weight"]
_MANIFOLD_MUTATIONS = ["none"] * 5 + ["missing", "extra", "other shape", "string", "grassmann"]


def test_init_and_update_on_mismatched_trees(xp, device, backend):
    fuzz(CASES["trees"], backend)(lambda data: _tree_case(xp, device, data))()


def _tree_case(xp, device, data):
    name = data.draw(st.sampled_from(["Gradient", "Momentum", "Adam", "BFGS", "ManifoldMuon", "partition"]), "opt")
    on_nonfinite = data.draw(st.sampled_from(["skip", "raise"]), label="on_nonfinite")
    kw = {} if name in ("ManifoldMuon", "partition") else {"on_nonfinite": on_nonfinite}
    opt = FACTORIES[name][0](**kw)
    batch = data.draw(st.sampled_from([(), (3,)]), label="batch")
    seed = data.draw(st.integers(0, 99), label="seed")
    params, grads, manifolds = _tree(xp, device, batch=batch, seed=seed, vector=name != "ManifoldMuon")
    pm = data.draw(st.sampled_from(_PARAM_MUTATIONS), label="params")
    mm = data.draw(st.sampled_from(_MANIFOLD_MUTATIONS), label="manifolds")
    gm = data.draw(st.sampled_from(_GRAD_MUTATIONS), label="grads")
    leaf = data.draw(st.sampled_from(["w", "e", "b"]), label="leaf")
    if pm == "int":
        params[leaf] = to_backend(to_numpy(params[leaf]), xp, device, "int64")
    elif pm == "nan":
        params[leaf] = to_backend(np.full(tuple(params[leaf].shape), np.nan), xp, device, "float64")
    elif pm == "off manifold":
        params["w"] = params["w"] * 2
    elif pm == "float32 weight":
        params["w"] = to_backend(to_numpy(params["w"]), xp, device, "float32")
    if mm == "missing":
        del manifolds["w"]
    elif mm == "extra":
        manifolds["z"] = Stiefel(3, 1)
    elif mm == "other shape":
        manifolds["w"] = Stiefel(6, 2)
    elif mm == "string":
        manifolds["w"] = "stiefel"
    elif mm == "grassmann":
        manifolds["w"] = Grassmann(5, 2)  # a valid choice: the same points, another manifold
    # a NaN Euclidean parameter is the caller's value (not checked at init; NaN in, NaN out); a NaN point
    # is off its manifold and refused
    valid_init = (pm in ("none", "float32 weight") or (pm == "nan" and leaf != "w")) and mm in ("none", "grassmann")
    state, err = outcome(lambda: opt.init(params, manifolds), ("params", "manifolds", "w", "e", "b", "z"), params)
    if err is not None:
        assert not valid_init, err
        return
    assert valid_init, f"init accepted params={pm} manifolds={mm}"
    g = dict(grads)
    if gm == "missing":
        del g[leaf]
    elif gm == "extra":
        g["z"] = g["b"]
    elif gm == "shape":
        g[leaf] = to_backend(np.zeros((*tuple(g[leaf].shape), 2)), xp, device, "float64")
    elif gm == "dtype":
        dtypes = [d for d in ("float32", "int64", "complex128", "bool") if getattr(xp, d, None) is not None]
        g[leaf] = to_backend(to_numpy(g[leaf]), xp, device, data.draw(st.sampled_from(dtypes), label="dtype"))
    elif gm == "list":
        g = [g["w"], g["e"], g["b"]]
    elif gm == "None leaf":
        g[leaf] = None
    elif gm in ("nan", "inf"):
        h = to_numpy(g[leaf]).copy()
        h.reshape(-1)[0] = math.nan if gm == "nan" else math.inf
        g[leaf] = to_backend(h, xp, device, "float64")
    elif gm == "batch" and batch:
        g["w"] = g["w"][:2, ...]
    if pm == "float32 weight" and gm not in ("missing", "list", "None leaf"):
        g["w"] = to_backend(to_numpy(g["w"]), xp, device, "float32")  # the weight's gradient in its dtype
    before_state = snapshot(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", optim.NonFiniteGradientWarning)
        try:
            res, err = outcome(
                lambda: opt.update(params, g, state), ("grads", "params", "w", "e", "b", "z"), (params, g)
            )
        except FloatingPointError as exc:  # the documented outcome of on_nonfinite="raise"
            assert gm in ("nan", "inf") and kw.get("on_nonfinite") == "raise", exc
            assert unchanged(before_state, snapshot(state))
            return
    assert unchanged(before_state, snapshot(state)), "update changed the state it was given"
    valid_update = gm in ("none", "nan", "inf") or (gm == "batch" and not batch)
    if err is not None:
        assert not valid_update, err
        return
    assert valid_update, f"update accepted grads={gm} ({leaf})"
    new, _ = res
    if (gm == "none" or (gm == "batch" and not batch)) and pm != "nan":
        assert finite(new), f"{name}: non-finite parameters from finite gradients"
        assert _on_stiefel(new["w"]) or pm == "float32 weight"
    elif name in ("ManifoldMuon", "partition") or on_nonfinite == "skip":
        # skipped: the parameters unchanged (bit for bit) and a warning (Muon: NaN goes through; tested apart)
        if any(issubclass(w.category, optim.NonFiniteGradientWarning) for w in caught):
            # a partition's members skip on their own: the other members' leaves move
            assert unchanged(snapshot(params if name != "partition" else params[leaf]),
                             snapshot(new if name != "partition" else new[leaf]))  # fmt: skip


@pytest.mark.parametrize("name", ["Gradient", "Adam", "BFGS"])
def test_a_skipped_nonfinite_step_keeps_everything_and_warns(xp, device, host_reads_policy, name):
    host_reads_policy("always")  # the warning reads the flag (a GPU's default counts without warning)
    opt = FACTORIES[name][0]()
    params, grads, manifolds = _tree(xp, device)
    state = opt.init(params, manifolds)
    grads["e"] = grads["e"] * math.nan
    with pytest.warns(optim.NonFiniteGradientWarning):
        new, _ = opt.update(params, grads, state)
    assert unchanged(snapshot(params), snapshot(new))


# -- defects the targets above found (regressions) ---------------------------------------------------


@pytest.mark.parametrize(
    ("make", "name", "value"),
    [
        (lambda v: optim.ManifoldMuon(lr=v), "lr", math.inf),  # was accepted: every weight NaN after a step
        (lambda v: optim.ManifoldMuon(weight_decay=v), "weight_decay", math.inf),  # idem
        (lambda v: optim.ManifoldMuon(weight_decay=v), "weight_decay", True),  # was taken as 1.0
        (lambda v: optim.ManifoldMuon(weight_decay=v), "weight_decay", "oops"),  # float()'s message, no name
        (lambda v: optim.ManifoldMuon(eps=v), "eps", "oops"),  # "'>' not supported between 'str' and 'int'"
        (lambda v: optim.ManifoldMuon(momentum=v), "momentum", "0.9"),
        (lambda v: optim.ManifoldMuon(ns_steps=v), "ns_steps", True),
        (lambda v: optim.ManifoldMuon(ns_coefficients=v), "ns_coefficients", (1.0, math.nan, 2.0)),
        (lambda v: optim.Muon(lr=v), "lr", math.inf),
        (lambda v: optim.BFGS(curvature_eps=v), "curvature_eps", "oops"),  # float()'s message, no name
        (lambda v: optim.Adam(group_same_shape=v), "group_same_shape", "no"),  # was True (bool("no"))
        (lambda v: optim.ManifoldMuon(group_same_shape=v), "group_same_shape", "no"),
    ],
)
def test_bad_hyperparameters_found_by_fuzzing_raise_naming_them(make, name, value):
    with pytest.raises((ValueError, TypeError), match=rf"{name} must be"):
        make(value)
