"""Fuzzing ``geoarray.train.fit``'s arguments (issue #29, item 6).

Hypothesis (derandomized) calls ``fit`` on a small classification transformer (24 samples, Stiefel
attention weights) with one to three keyword arguments drawn from every keyword of ``fit`` and values of
every kind: valid ones, zero, negative, NaN, inf, strings, bools, None, lists, complex, numpy integers,
timedeltas, paths to a file, to a new directory and to a directory holding checkpoints, data pairs of the
wrong length, sample count or feature size, metrics that are not callables, callbacks that are not.

Every outcome must be: a result whose step count is epochs × ⌈samples / batch_size⌉, with finite
parameters, the Stiefel weights on their manifold and a checkpoint (when asked) that loads; or a
``ValueError``/``TypeError`` naming one of the drawn arguments — never another exception type, never an
input array changed, and nothing created under a checkpoint directory or ``out`` path of a refused call.
Cases: ``CASES`` (a tenth on JAX: ``_fuzz.cases``).
"""

from __future__ import annotations

import datetime
import math
import os
import re

import numpy as np
import optree
import pytest
from hypothesis import event
from hypothesis import strategies as st

from _fuzz import BAD_SCALARS, finite, fuzz, outcome
from _helpers import to_numpy
from geoarray import nn, optim
from geoarray.models import ClassificationTransformer
from geoarray.train import accuracy, fit, list_checkpoints, load_checkpoint

CASES = {"fit_arguments": 120}

N, T, D, C = 24, 2, 4, 3
_INTS = st.sampled_from([1, 2, 3, 5, 100, np.int64(2), 0, -1])
_NUMBERS = st.one_of(BAD_SCALARS, _INTS)
_BOOLS = st.sampled_from([True, False, 0, 1, "yes", "no", None, np.bool_(True)])
_PATHS = st.sampled_from(["new", "file", "used", "", 123, None, b"bytes-dir"])


def _model():
    return ClassificationTransformer(D, T, C, n_heads=2, n_layers=1)


def _problem(xp, device, n=N, t=T, d=D):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, t, d))
    y = np.eye(C)[rng.integers(C, size=n)]
    return xp.asarray(x, dtype=xp.float64, device=device), xp.asarray(y, dtype=xp.float64, device=device)


def _data_value(kind, xp, device):
    x, y = _problem(xp, device)
    return {
        "pair": (x, y),
        "list": [x, y],
        "triple": (x, y, y),
        "single": x,
        "fewer targets": (x, y[:5, ...]),
        "other features": _problem(xp, device, d=D + 1),
        "no samples": (x[:0, ...], y[:0, ...]),
        "numpy pair": (np.zeros((N, T, D)), np.zeros((N, C))),
        "None": None,
    }[kind]


# keyword → strategy of (a description, a maker of the value from (xp, device, tmp_path))
def _plain(strategy):
    return strategy.map(lambda v: (repr(v), lambda xp, device, tmp: v))


def _path(v):
    def make(xp, device, tmp):
        if v == "new":
            return tmp / "new"
        if v == "file":
            (tmp / "a-file").write_text("not a directory\n")
            return tmp / "a-file"
        if v == "used":
            return tmp / "used"  # holds a checkpoint (written by the test before the call)
        if v == b"bytes-dir":
            return os.fsencode(tmp / "bytes-dir")
        return v

    return (repr(v), make)


_DATA_KINDS = ["pair", "list", "triple", "single", "fewer targets", "other features", "no samples", "numpy pair"]
KEYWORDS = {
    "epochs": _plain(_NUMBERS),
    "batch_size": _plain(_NUMBERS),
    "seed": _plain(_NUMBERS),
    "checkpoint_every": _plain(_NUMBERS),
    "checkpoint_every_seconds": _plain(
        st.one_of(BAD_SCALARS, st.sampled_from([datetime.timedelta(seconds=1), datetime.timedelta(0)]))
    ),
    "keep": _plain(_NUMBERS),
    "resume": _plain(_BOOLS),
    "progress": _plain(_BOOLS),
    "jit": _plain(_BOOLS),
    "grad": _plain(st.sampled_from(["auto", "analytic", "autodiff", "finite", None, 1, ""])),
    "checkpoint_path": _PATHS.map(_path),
    "out": st.sampled_from(["new", "file", "", 123, None]).map(_path),
    "val_data": st.sampled_from([*_DATA_KINDS, "None"]).map(
        lambda k: (k, lambda xp, device, tmp: _data_value(k, xp, device))
    ),
    "data": st.sampled_from(_DATA_KINDS).map(lambda k: (k, lambda xp, device, tmp: _data_value(k, xp, device))),
    "metrics": _plain(st.sampled_from([None, {}, {"acc": accuracy}, {"acc": 1}, "acc", [accuracy], {1: accuracy}])),
    "callback": _plain(st.sampled_from([None, print, 1, "cb", lambda info: None])),
    "manifolds": st.sampled_from(["model", "None leaves", "other tree", "string"]).map(
        lambda k: (k, lambda xp, device, tmp: {"model": _model().manifolds(), "string": "stiefel"}.get(k, k))
    ),
}
# fit's own names for what a drawn keyword may be called in its error (an optimizer names its state)
ALIASES = {"data": ("data", "inputs"), "manifolds": ("manifolds",), "val_data": ("val_data", "metrics")}


def test_fit_arguments(xp, device, backend, tmp_path_factory):
    fuzz(CASES["fit_arguments"], backend)(lambda data: _case(xp, device, tmp_path_factory, data))()


def _case(xp, device, tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fit")
    model = _model()
    params = model.init(0, xp=xp, dtype="float64", device=device)
    used = tmp / "used"
    drawn = data.draw(st.lists(st.sampled_from(sorted(KEYWORDS)), min_size=1, max_size=3, unique=True), label="keys")
    kw = {"epochs": 1, "batch_size": 8, "progress": False, "jit": False}
    train_data = _data_value("pair", xp, device)
    for key in drawn:
        _, make = data.draw(KEYWORDS[key], label=key)
        value = make(xp, device, tmp)
        if key == "data":
            train_data = value
        elif key == "manifolds" and value in ("None leaves", "other tree"):
            leaves = optree.tree_structure(params).num_leaves
            kw[key] = (
                {"w": None}
                if value == "other tree"
                else optree.tree_unflatten(optree.tree_structure(params), [None] * leaves)
            )
        else:
            kw[key] = value
    if kw.get("checkpoint_path") == used or kw.get("out") == used:
        fit(model, params, _problem(xp, device), optim.Adam(lr=0.01), nn.ClassificationL2Loss(), epochs=1,
            batch_size=8, progress=False, jit=False, checkpoint_path=used)  # fmt: skip
    before = sorted(os.listdir(tmp))
    names = tuple(n for key in drawn for n in ALIASES.get(key, (key,)))
    result, err = outcome(
        lambda: fit(model, params, train_data, optim.Adam(lr=0.01), nn.ClassificationL2Loss(), **kw),
        names,
        inputs=(params, train_data if isinstance(train_data, (tuple, list)) else ()),
    )
    event("refused" if err is not None else "trained")
    if err is not None:
        assert sorted(os.listdir(tmp)) == before, f"a refused fit({kw}) left {sorted(os.listdir(tmp))} in {tmp}"
        return
    epochs, batch_size = int(kw["epochs"]), int(kw["batch_size"])
    n = int(train_data[0].shape[0])
    assert result.steps == epochs * math.ceil(n / batch_size) and not result.interrupted, (kw, result.steps)
    assert finite(result.params), f"fit({kw}) gave non-finite parameters"
    if kw.get("checkpoint_path") is not None:
        assert list_checkpoints(kw["checkpoint_path"])[-1][0] == result.steps
        like = {"like_params": params, "like_state": optim.Adam(lr=0.01).init(params, model.manifolds())}
        loaded, _, _ = load_checkpoint(kw["checkpoint_path"], **like)
        for a, b in zip(optree.tree_leaves(loaded), optree.tree_leaves(result.params), strict=True):
            assert np.array_equal(to_numpy(a), to_numpy(b))


# the defects the fuzzing found (each was taken silently, or failed after training had begun with an
# error that named no argument: a TypeError from os.fspath, dict() or the first call of the callback, a
# FileNotFoundError for an empty path); now refused before the first step, naming the argument
FOUND = [
    ({"progress": "no"}, TypeError, "fit: progress must be True or False, got 'no'"),
    ({"jit": None}, TypeError, "fit: jit must be True or False, got None"),
    ({"out": 123}, TypeError, "fit: out must be a path"),
    ({"out": ""}, ValueError, "fit: out must be a path (the JSON file of the history), got an empty one"),
    ({"out": "{tmp}"}, ValueError, "is a directory; give the path of the JSON file to write"),
    ({"checkpoint_path": 123}, TypeError, "fit: checkpoint_path must be a path"),
    ({"checkpoint_path": ""}, ValueError, "fit: checkpoint_path must be a path (a directory), got an empty one"),
    ({"metrics": "acc"}, TypeError, "fit: metrics must be a dict from name to metric function, got 'acc'"),
    ({"metrics": {1: accuracy}}, TypeError, "fit: metrics' names must be strings"),
    ({"callback": 1}, TypeError, "fit: callback must be callable"),
]


def _case_id(kw: dict) -> str:
    """``key=value`` with functions by name: an id holding a memory address differs between the
    processes of pytest-xdist, which then refuses the run."""
    key, value = next(iter(kw.items()))
    text = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", repr(value))
    return f"{key}={text}"


@pytest.mark.parametrize("kw, error, message", FOUND, ids=[_case_id(k) for k, _, _ in FOUND])
def test_defects_found_by_the_fuzzing_are_refused_before_the_first_step(xp, device, tmp_path, kw, error, message):
    model = _model()
    params = model.init(0, xp=xp, dtype="float64", device=device)
    kw = {k: str(tmp_path) if v == "{tmp}" else v for k, v in kw.items()}
    steps = []
    kw.setdefault("callback", steps.append)
    val = _problem(xp, device) if "metrics" in kw else None
    with pytest.raises(error) as info:
        fit(model, params, _problem(xp, device), optim.Adam(), nn.ClassificationL2Loss(), epochs=1, batch_size=8,
            progress=kw.pop("progress", False), jit=kw.pop("jit", False), val_data=val, **kw)  # fmt: skip
    assert message in str(info.value) and steps == [] and os.listdir(tmp_path) == []
