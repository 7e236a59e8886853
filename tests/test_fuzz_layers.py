"""Fuzzing the layers' ``apply``/``vjp`` (issue #29, item 6).

Hypothesis (derandomized) draws a layer of :mod:`geoarray.nn` (pointwise, sequence, symplectic,
volume-preserving, attention, manifold layers, a Chain), its parameters (as ``init`` gives them, or with
a key missing or extra, a parameter of another shape or dtype, a list instead of a dict), an input
(the right shape, a wrong feature size or sequence length, no batch axis, a 0-d array; dtypes float64,
float32, float16, int64, complex128, bool; NaN/inf entries) and, for ``vjp``, a cotangent of its own
shape and dtype. Every outcome is a ``ValueError``/``TypeError`` naming ``x``, ``params`` or ``dy``, or a
result of the documented shape that is finite whenever the input is; and neither the parameters nor the
input nor the cotangent is modified (bit for bit). Cases: ``CASES`` (a tenth on JAX: ``_fuzz.cases``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from _fuzz import DTYPES, finite, fuzz, host_array, outcome, to_backend
from _helpers import to_numpy
from geoarray import nn

CASES = {"layers": 250}

T = 3  # sequence length of the sequence layers
#: (factory, feature size, is a sequence layer)
LAYERS = {
    "Dense": (lambda: nn.Dense(4, 3, "tanh"), 4, False),
    "ResNetLayer": (lambda: nn.ResNetLayer(4), 4, False),
    "StiefelLayer": (lambda: nn.StiefelLayer(5, 2), 2, False),
    "GrassmannLayer": (lambda: nn.GrassmannLayer(5, 2), 5, False),
    "GradientLayerQ": (lambda: nn.GradientLayerQ(4, 3), 4, False),
    "LinearLayerP": (lambda: nn.LinearLayerP(4), 4, False),
    "ActivationLayerQ": (lambda: nn.ActivationLayerQ(4), 4, False),
    "BiasLayer": (lambda: nn.BiasLayer(4), 4, False),
    "PSDLayer": (lambda: nn.PSDLayer(4, 6), 4, False),
    "VolumePreservingLowerLayer": (lambda: nn.VolumePreservingLowerLayer(4), 4, False),
    "VolumePreservingAttention": (lambda: nn.VolumePreservingAttention(4, T), 4, True),
    "MultiHeadAttention": (lambda: nn.MultiHeadAttention(4, 2), 4, True),
    "LinearSymplecticAttentionQ": (lambda: nn.LinearSymplecticAttentionQ(4, T), 4, True),
    "SymplecticAttentionP": (lambda: nn.SymplecticAttentionP(4), 4, True),
    "ClassificationLayer": (lambda: nn.ClassificationLayer(4, 3), 4, True),
    "Chain": (lambda: nn.Chain(nn.GradientLayerQ(4, 3), nn.LinearLayerP(4), nn.BiasLayer(4)), 4, False),
}
_X = ["ok"] * 5 + ["features", "seq_len", "no batch", "scalar"]
_P = ["ok"] * 6 + ["missing", "extra", "shape", "dtype", "list"]


def _shape_of(how: str, d: int, sequence: bool) -> tuple[int, ...]:
    core = (T, d) if sequence else (d,)
    return {
        "ok": (2, *core),
        "features": (2, *core[:-1], d + 1),
        "seq_len": (2, T + 2, d) if sequence else (2, d),
        "no batch": core,
        "scalar": (),
    }[how]


def test_layers_apply_and_vjp(xp, device, backend):
    dtypes = [d for d in DTYPES if getattr(xp, d, None) is not None]

    @fuzz(CASES["layers"], backend)
    def run(data):
        name = data.draw(st.sampled_from(sorted(LAYERS)), label="layer")
        factory, d, sequence = LAYERS[name]
        layer = factory()
        params = layer.init(0, xp=xp, dtype="float64", device=device)
        pm = data.draw(st.sampled_from(_P), label="params")
        key = sorted(params)[0] if isinstance(params, dict) and params else None
        if pm != "ok" and (not isinstance(params, dict) or key is None or name == "Chain"):
            pm = "ok"  # a Chain's params are a list of dicts; a parameterless layer has nothing to damage
        if pm == "missing":
            params = {k: v for k, v in params.items() if k != key}
        elif pm == "extra":
            params = {**params, "zz": params[key]}
        elif pm == "shape":
            params = {**params, key: xp.concat([params[key], params[key]], axis=0)}
        elif pm == "dtype":
            params = {**params, key: xp.astype(params[key], xp.float32)}
        elif pm == "list":
            params = list(params.values())
        xs = data.draw(st.sampled_from(_X), label="x")
        x_dtype = data.draw(st.sampled_from(["float64"] * 5 + dtypes), label="x dtype")
        special = data.draw(st.sampled_from(["finite"] * 5 + ["nan", "inf"]), label="x entries")
        rng = np.random.default_rng(data.draw(st.integers(0, 99), label="seed"))
        x = to_backend(host_array(rng, _shape_of(xs, d, sequence), special), xp, device, x_dtype)
        valid = pm == "ok" and (xs in ("ok", "no batch") or (xs == "seq_len" and not sequence)) and x_dtype == "float64"
        if (
            xs == "seq_len"
            and sequence
            and name in ("MultiHeadAttention", "SymplecticAttentionP", "ClassificationLayer")
        ):
            valid = pm == "ok" and x_dtype == "float64"  # these take any sequence length
        names = ("x", "params", "dtype")
        if data.draw(st.booleans(), label="vjp"):
            res, err = outcome(lambda: layer.vjp(params, x), names, (params, x))
            if err is not None:
                assert not valid, err
                return
            assert valid or x_dtype == "float32", f"{name}.vjp accepted params={pm} x={xs} {x_dtype}"
            y, pullback = res
            dys = data.draw(st.sampled_from(["ok"] * 4 + ["shape", "dtype", "nan"]), label="dy")
            dy_h = host_array(rng, tuple(y.shape), "nan" if dys == "nan" else "finite")
            if dys == "shape":
                dy_h = dy_h[..., :-1] if dy_h.ndim else np.ones((2,))
            dy = to_backend(dy_h, xp, device, "float32" if dys == "dtype" else to_numpy(x).dtype.name)
            back, err = outcome(lambda: pullback(dy), ("dy", "cotangent"), (params, x, dy))
            if err is not None:
                assert dys in ("shape", "dtype"), err
                return
            assert dys in ("ok", "nan") or (dys == "dtype" and x_dtype == "float32"), f"pullback accepted dy={dys}"
            assert tuple(back[1].shape) == tuple(x.shape), "dx must have the shape of x"
            if special == "finite" and dys == "ok":
                assert finite(back), f"{name}: non-finite pullback from finite input"
            return
        y, err = outcome(lambda: layer.apply(params, x), names, (params, x))
        if err is not None:
            assert not valid, err
            return
        assert valid or x_dtype == "float32", f"{name}.apply accepted params={pm} x={xs} {x_dtype}"
        if special == "finite":
            assert finite(y), f"{name}: non-finite output from finite input"
        assert tuple(y.shape[: x.ndim - (2 if sequence else 1)]) == tuple(x.shape[: x.ndim - (2 if sequence else 1)])

    run()


# -- defects the target above found (regressions) ----------------------------------------------------


def test_a_pullback_names_a_cotangent_of_another_dtype_or_none(xp, device):
    # before: a float32 dy for a float64 output was promoted silently (NumPy, torch) and None failed with
    # "unsupported operand type(s) for *: 'NoneType' and ..." (no argument named)
    for layer in (nn.Dense(4, 3, "tanh"), nn.VolumePreservingAttention(4, T), nn.GradientLayerQ(4, 3)):
        params = layer.init(0, xp=xp, dtype="float64", device=device)
        x = to_backend(np.ones((2, T, 4)), xp, device, "float64")
        y, pullback = layer.vjp(params, x)
        with pytest.raises(TypeError, match=r"dy must have the output's dtype"):
            pullback(xp.astype(y, xp.float32))
        with pytest.raises(TypeError, match=r"dy must be an array"):
            pullback(None)
        _, dx = pullback(xp.ones_like(y))
        assert tuple(dx.shape) == tuple(x.shape)


def test_layers_make_every_array_on_the_inputs_device(backend, xp, device):
    """Every layer's apply and vjp with torch's default device set to ``meta``: an array made without
    ``device=`` inside (on a GPU it would land on the CPU) would be a meta tensor and fail to combine with
    the CPU inputs. Results equal the same calls without the default device set, bit for bit."""
    if backend.name != "torch":
        pytest.skip("torch's default-device context; array-api-strict's session runs on a second device instead")
    import contextlib

    import optree
    import torch

    rng = np.random.default_rng(0)
    for name, (factory, d, sequence) in sorted(LAYERS.items()):
        layer = factory()
        params = layer.init(0, xp=xp, dtype="float64", device=device)
        x = to_backend(host_array(rng, _shape_of("ok", d, sequence), "finite"), xp, device, "float64")
        runs = []
        for default in (None, "meta"):
            with torch.device(default) if default else contextlib.nullcontext():
                y, pullback = layer.vjp(params, x)
                runs.append((layer.apply(params, x), y, pullback(xp.ones_like(y))))
        for a, b in zip(optree.tree_leaves(runs[1]), optree.tree_leaves(runs[0]), strict=True):
            assert a.device == x.device, name
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=name)
