"""First contact: lazy submodules, clear errors for mixed inputs (nothing changed), visible skipped steps,
readable layer reprs, a clear line for a wrong backend name."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import optree
import pytest

import geoarray
from _helpers import to_numpy
from geoarray import nn, optim
from geoarray.manifolds import Grassmann, Stiefel, SymplecticStiefel

ROOT = Path(__file__).resolve().parents[1]


def test_public_submodules_are_lazy_attributes():
    code = (
        "import sys, geoarray as ga\n"
        "assert not {'torch', 'jax', 'geoarray.nn'} & set(sys.modules), sorted(sys.modules)\n"
        "assert ga.nn.Chain is not None and 'geoarray.nn' in sys.modules\n"
        "assert 'nn' in dir(ga)\n"
        "try:\n    ga.no_such_module\nexcept AttributeError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "has no attribute 'no_such_module'" in out.stdout


def _snapshot(*arrays):
    return [to_numpy(a).copy() for a in arrays]


@pytest.mark.parametrize("kind", [Stiefel, Grassmann])
def test_mixed_dtypes_shapes_and_missing_arrays_raise_naming_the_argument(xp, device, kind):
    M = kind(8, 3)
    Y = M.random(0, xp=xp, batch_shape=(4,), device=device)
    G = geoarray.random.normal(1, (4, 8, 3), xp=xp, device=device)
    before = _snapshot(Y, G)
    with pytest.raises(TypeError, match=r"dL has dtype float32 but Y has float64"):
        M.rgrad(Y, xp.astype(G, xp.float32))
    with pytest.raises(ValueError, match=r"dL has batch shape \(3,\), which does not broadcast with the batch shape"):
        M.rgrad(Y, G[:3, ...])
    with pytest.raises(TypeError, match="dL must be an array"):
        M.rgrad(Y, None)
    with pytest.raises(ValueError, match=r"dL must have trailing shape \(8, 3\)"):
        M.rgrad(Y, G[..., :2])
    lam = M.global_section(Y)
    with pytest.raises(TypeError, match="D has dtype float32"):
        M.global_rep(lam, xp.astype(G, xp.float32))
    for a, b in zip(_snapshot(Y, G), before, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", [Stiefel, Grassmann])
def test_torch_tensors_on_two_devices_raise_naming_the_argument(xp, device, kind):
    """A manifold method given torch tensors of one dtype on two devices refuses them with a ``ValueError``
    naming the argument and both devices (the one-pass acceptance of agreeing torch tensors, ``_namespace``,
    leaves a disagreement to the checks that name it); torch only: on a machine without a GPU, torch's
    ``meta`` device is its only second device."""
    if geoarray.backend_name(xp) != "torch":
        pytest.skip("a second device without a GPU exists only in torch (meta)")
    M = kind(8, 3)
    Y = M.random(0, xp=xp, device=device)
    G = geoarray.random.normal(1, (8, 3), xp=xp, device=device)
    with pytest.raises(ValueError, match=r"dL is on device meta but Y on (cpu|cuda)"):
        M.rgrad(Y, G.to("meta"))
    with pytest.raises(TypeError, match=r"dL has dtype float32 but Y has float64"):
        M.rgrad(Y, xp.astype(G, xp.float32))
    assert M.is_tangent(Y, M.rgrad(Y, G))


def test_symplectic_stiefel_checks_dtypes_too(xp, device):
    M = SymplecticStiefel(8, 4)
    Y = M.random(0, xp=xp, device=device)
    with pytest.raises(TypeError, match="dL has dtype float32 but Y has float64"):
        M.rgrad(Y, xp.astype(Y, xp.float32))


def test_optimizer_refuses_a_starting_point_off_the_manifold(xp, device):
    M = Stiefel(6, 2)
    bad = 1.01 * M.random(0, xp=xp, device=device)
    opt = optim.Adam()
    with pytest.raises(ValueError, match=r"params\['Y'\] is not a point of Stiefel\(6, 2\)"):
        opt.init({"Y": bad, "b": xp.zeros(2, device=device)}, {"Y": M, "b": None})
    assert not hasattr(opt, "layout")  # configuration only: nothing is recorded on the optimizer


@pytest.mark.parametrize("core", [optim.Adam, optim.ManifoldMuon])
def test_a_float32_frame_cast_to_float64_is_refused_with_its_error_the_tolerance_and_the_fix(xp, device, core):
    """A frame made in float32 and cast to float64 is orthonormal to ~1e-7, above float64's 1e-10: the
    message gives the measured max|YᵀY − I| (the manifold's point_error, to 3 digits), the tolerance of
    the dtype and the fix, and the fix it names (M.nearest_point) makes init accept the frame."""
    M = Stiefel(20, 5)
    Y = xp.astype(M.random(0, xp=xp, device=device, dtype="float32"), xp.float64)
    err = M.point_error(Y)
    assert 1e-10 < err < 1e-5
    with pytest.raises(ValueError) as info:
        core().init({"Y": Y}, {"Y": M})
    message = str(info.value)
    assert (
        f"params['Y'] is not a point of Stiefel(20, 5): its error {err:.3g} is above the tolerance 1e-10 of float64"
        in message
    )
    assert "M.nearest_point(params['Y'])" in message
    projected = M.nearest_point(Y)
    assert M.point_error(projected) <= 1e-10  # the float64 tolerance the message names
    core().init({"Y": projected}, {"Y": M})  # accepted: no ValueError


def test_skipped_steps_warn_once_and_are_counted(xp, device, host_reads_policy):
    host_reads_policy("always")  # the warning reads the flag (a GPU's default counts without warning)
    M = Stiefel(6, 2)
    params = {"Y": M.random(0, xp=xp, device=device), "b": xp.zeros(2, device=device)}
    mans = {"Y": M, "b": None}
    good = {"Y": xp.ones_like(params["Y"]), "b": xp.ones_like(params["b"])}
    bad = {"Y": good["Y"], "b": good["b"] * float("nan")}
    opt = optim.Adam(1e-2)
    state = opt.init(params, mans)
    with pytest.warns(optim.NonFiniteGradientWarning, match="1 of 1 optimizer updates were skipped") as record:
        p, state = opt.update(params, bad, state)
        for _ in range(5):
            p, state = opt.update(p, good, state)
        p, state = opt.update(p, bad, state)
        p, state = opt.update(p, good, state)
    assert len(record) == 1
    assert int(state.skipped) == 2 and int(state.step) == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean = optim.Adam(1e-2)
        s = clean.init(params, mans)
        for _ in range(4):
            params, s = clean.update(params, good, s)  # finite gradients: no warning


def test_update_refuses_gradients_on_another_device_or_dtype_and_changes_nothing(xp, device):
    M = Stiefel(6, 2)
    params = {"Y": M.random(0, xp=xp, device=device)}
    opt = optim.Adam()
    state = opt.init(params, {"Y": M})
    before = [to_numpy(x).copy() for x in optree.tree_leaves((params, state))]
    with pytest.raises(TypeError, match=r"grad of params\['Y'\] has dtype float32"):
        opt.update(params, {"Y": xp.astype(params["Y"], xp.float32)}, state)
    for a, b in zip(optree.tree_leaves((params, state)), before, strict=True):
        np.testing.assert_array_equal(to_numpy(a), b)


def test_layer_reprs_name_their_arguments():
    assert repr(nn.VolumePreservingAttention(6)) == "VolumePreservingAttention(dim=6, seq_len=None, skew_sym=True)"
    assert repr(nn.Dense(3, 4, "tanh")) == "Dense(in_dim=3, out_dim=4, activation='tanh', use_bias=True)"
    assert repr(nn.Chain(nn.BiasLayer(2))) == "Chain(BiasLayer(dim=2))"


def test_a_wrong_backend_name_is_one_line_not_an_internal_error():
    env = {**os.environ, "GEOARRAY_BACKEND": "numpi"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_random.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 4, text
    assert "INTERNALERROR" not in text and "Traceback" not in text
    assert "GEOARRAY_BACKEND='numpi' is not a backend; choose one of numpy, array-api-strict, torch, jax" in text
