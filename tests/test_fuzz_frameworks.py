"""Fuzzing the host-framework optimizers (issue #29, item 6): ``geoarray.torch`` and ``geoarray.jax.optax_transform``.

* ``torch_hyperparameters`` (torch session): every ``geoarray.torch`` optimizer (torch's ``Adam``, ``AdamW``,
  ``SGD``; the paper's ``Gradient``, ``Momentum``, ``PaperAdam``; ``ManifoldMuon``) built with one
  hyperparameter drawn from valid and wrong values (negative, NaN, inf, strings, bools, None, tuples of
  the wrong length or content, complex) on a ManifoldParameter and a plain parameter, then two steps with
  finite or non-finite gradients. Outcome: a ``ValueError``/``TypeError`` naming the hyperparameter, or
  an accepted value of the right kind and finite parameters on the manifold after steps with finite
  gradients; a non-finite gradient is skipped (``NonFiniteGradientWarning``) leaving the parameters.
* ``optax`` (JAX session): ``optax_transform(manifolds, method, **options)`` with a drawn method, option
  and value, and ``update`` with mutated gradient trees (a missing leaf, another shape or dtype, a NumPy
  array, a list, None) and states (None, a tuple, another transformation's state for another tree).
  Outcome: an error naming the argument, or finite updates whose application stays on the manifold.

Cases per target: ``CASES`` (a tenth on JAX: ``_fuzz.cases``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import strategies as st

from _fuzz import BAD_SCALARS, finite, fuzz, is_valid_number, outcome, snapshot, unchanged
from geoarray import optim
from geoarray.manifolds import Stiefel

CASES = {"torch_hyperparameters": 150, "optax": 150}

_PAIRS = st.sampled_from([(0.9, 0.999), (0.0, 0.5), (0.9,), (0.9, 1.0), (0.9, math.nan), ("a", "b"), (True, 0.9), 0.9])


def _unit(v):
    return is_valid_number(v) and v < 1


def _pair(v):
    return isinstance(v, (tuple, list)) and len(v) == 2 and all(_unit(b) for b in v)


def _flag(v):
    return isinstance(v, bool)


def _torch_specs(gt):
    nonneg = is_valid_number
    return {
        "Adam": (gt.Adam, {"lr": nonneg, "betas": _pair, "eps": nonneg, "weight_decay": nonneg,
                           "amsgrad": _flag, "maximize": _flag}),
        "AdamW": (gt.AdamW, {"lr": nonneg, "betas": _pair, "eps": nonneg, "weight_decay": nonneg, "amsgrad": _flag}),
        "SGD": (gt.SGD, {"lr": nonneg, "momentum": nonneg, "dampening": nonneg, "weight_decay": nonneg,
                         "nesterov": _flag, "maximize": _flag}),
        "Gradient": (gt.Gradient, {"lr": nonneg}),
        "Momentum": (gt.Momentum, {"lr": nonneg, "alpha": lambda v: is_valid_number(v, high=1.0)}),
        "PaperAdam": (gt.PaperAdam, {"lr": nonneg, "betas": _pair, "delta": nonneg}),
        "ManifoldMuon": (gt.ManifoldMuon, {"lr": nonneg, "momentum": _unit, "weight_decay": nonneg}),
    }  # fmt: skip


def test_torch_hyperparameters(backend, host_reads_policy):
    if backend.kind != "torch":
        pytest.skip("geoarray.torch optimizers take torch tensors")
    import torch

    host_reads_policy("always")  # a skipped step's warning reads the flag (a GPU's default counts without warning)

    import geoarray.torch as gt

    specs = _torch_specs(gt)

    @fuzz(CASES["torch_hyperparameters"], backend)
    def run(data):
        name = data.draw(st.sampled_from(sorted(specs)), label="optimizer")
        cls, hypers = specs[name]
        key = data.draw(st.sampled_from(sorted(hypers)), label="hyperparameter")
        if hypers[key] in (_flag,):
            value = data.draw(st.sampled_from([True, False, None, "no", 0, 1, 1.0]), label="value")
        elif hypers[key] is _pair:
            value = data.draw(_PAIRS, label="value")
        else:
            value = data.draw(BAD_SCALARS, label="value")
        gen = torch.Generator().manual_seed(data.draw(st.integers(0, 99), label="seed"))
        w = gt.ManifoldParameter(torch.randn(5, 2, dtype=torch.float64, generator=gen), Stiefel(5, 2))
        e = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64, generator=gen))
        opt, err = outcome(lambda: cls([w, e], **{key: value}), (key, "beta"))
        if err is not None:
            return
        assert hypers[key](value) or (key == "alpha" and value == 1.0), f"{name}({key}={value!r}) was accepted"
        # (Muon has no on_nonfinite: a NaN gradient is the caller's, as in torch.optim.Muon)
        nonfinite = name != "ManifoldMuon" and data.draw(st.booleans(), label="non-finite gradient")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", optim.NonFiniteGradientWarning)
            for _ in range(2):
                before = snapshot([w.detach(), e.detach()])
                w.grad = torch.randn(w.shape, dtype=w.dtype, generator=gen)
                e.grad = torch.randn(e.shape, dtype=e.dtype, generator=gen) * (math.nan if nonfinite else 1.0)
                opt.step()
        if nonfinite:
            assert any(issubclass(c.category, optim.NonFiniteGradientWarning) for c in caught)
            assert unchanged(before, snapshot([w.detach(), e.detach()])), "a non-finite step moved a parameter"
        assert finite([w.detach(), e.detach()]), f"{name}({key}={value!r}): non-finite parameters"
        Yh = w.detach().numpy()
        assert np.abs(Yh.T @ Yh - np.eye(2)).max() < 1e-8 or (key == "lr" and value > 10)

    run()


def test_optax_transform(backend):
    if backend.kind != "jax":
        pytest.skip("geoarray.jax.optax_transform runs on JAX")
    import jax.numpy as jnp

    import geoarray.jax as gj

    M = Stiefel(5, 2)
    params = {"w": M.random(0, xp=jnp, dtype=jnp.float64), "e": jnp.ones((4, 3), dtype=jnp.float64)}
    manifolds = {"w": M, "e": None}
    methods = ["adam", "gradient", "momentum", "bfgs", "manifold_muon", "sgd", "nope", 3, None]
    options = {"lr": BAD_SCALARS, "beta1": BAD_SCALARS, "section": st.sampled_from(["rotated", "x", None, 1]),
               "bogus": st.just(1)}  # fmt: skip

    @fuzz(CASES["optax"], backend)
    def run(data):
        method = data.draw(st.sampled_from(methods), label="method")
        kw = {}
        if data.draw(st.booleans(), label="option"):
            key = data.draw(st.sampled_from(sorted(options)), label="key")
            kw[key] = data.draw(options[key], label="value")
        tx, err = outcome(lambda: gj.optax_transform(manifolds, method, **kw), ("method", *kw, "params"))
        if err is not None:
            return
        state, err = outcome(lambda: tx.init(params), ("params", "manifolds", *kw), params)
        if err is not None:
            assert kw, err  # a transformation built without options initialises
            return
        rng = np.random.default_rng(data.draw(st.integers(0, 99), label="seed"))
        grads = {k: jnp.asarray(rng.normal(size=v.shape)) for k, v in params.items()}
        mutation = data.draw(
            st.sampled_from(["none"] * 4 + ["missing", "shape", "float32", "int", "numpy", "list", "None", "state"]),
            label="mutation",
        )
        st_ = state
        if mutation == "missing":
            del grads["e"]
        elif mutation == "shape":
            grads["w"] = jnp.ones((5, 3))
        elif mutation == "float32":
            grads["w"] = grads["w"].astype(jnp.float32)
        elif mutation == "int":
            grads["w"] = grads["w"].astype(jnp.int32)
        elif mutation == "numpy":
            grads["w"] = np.asarray(grads["w"])
        elif mutation == "list":
            grads = [grads["w"], grads["e"]]
        elif mutation == "None":
            grads = None
        elif mutation == "state":
            st_ = data.draw(st.sampled_from([None, (), {"a": 1}]), label="state")
        res, err = outcome(lambda: tx.update(grads, st_, params), ("grads", "state", "params", "grad of"), params)
        if err is not None:
            assert mutation != "none", err
            return
        assert mutation == "none", f"update accepted {mutation}"
        updates, _ = res
        assert finite(updates)
        new = gj.apply_updates(params, updates, _)
        Yh = np.asarray(new["w"])
        assert np.abs(Yh.T @ Yh - np.eye(2)).max() < 1e-8 or (kw.get("lr", 0) or 0) > 10

    run()


# -- defects the targets above found (regressions) ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [("Adam", "amsgrad", "no"), ("Adam", "maximize", None), ("AdamW", "amsgrad", 1), ("SGD", "nesterov", None),
     ("SGD", "maximize", "yes"), ("PaperAdam", "betas", 0.9)],
)  # fmt: skip
def test_torch_flags_and_betas_of_the_wrong_kind_are_refused_naming_them(torch, name, key, value):
    # before: amsgrad="no" switched AMSGrad on (any truthy value), nesterov=None was taken as False, and
    # PaperAdam(betas=0.9) failed with "'float' object is not iterable"
    import geoarray.torch as gt

    w = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    with pytest.raises((TypeError, ValueError), match=rf"{key}"):
        getattr(gt, name)([w], **{key: value})
